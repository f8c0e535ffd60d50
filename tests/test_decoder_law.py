"""The output law of speculative sampling equals the target's, tested against enumeration.

With a tiny vocabulary and context-dependent toy models (``law_models.ContextModel``),
``enumerate_joint_law`` gives the target's exact joint law of the first few new
tokens (an outcome that ends at EOS early is its own cell).  Each test runs
``N_RUNS`` seeded generations and compares the outcomes with that law by Pearson's
chi-square, cells of expectation < 5 pooled (``law_models.pooled_chisquare``), and
asserts ``p > ALPHA``.  It also asserts that no outcome of probability 0 occurs.

False alarms.  For a correct sampler the p-value is uniform, so a test fails by
chance with probability ALPHA = 1e-3.  Every run is seeded (one
``numpy.random.Generator`` per test, passed as ``rng=`` to all its runs), so each
test is deterministic: it passes or fails identically on every run of the same
code.  Only a change to the stream of uniforms (their number or order) re-draws the
outcomes; then each of the 18 chi-square tests of this file fails by chance with
probability 1e-3, about 1.8% for the whole file.  A failure after such a change must
be confirmed with other seeds, never answered by loosening ALPHA.

The tests can fail: ``test_power_*`` run the identical statistic, with the same
number of runs, on two deliberately wrong samplers (one that keeps every draft
token, one that draws the token after a rejection from p instead of
norm(max(0, p - q))) and require p < POWER_ALPHA (on the default backend: they
check the statistic, not a backend).

Coverage (each configuration runs on both backends, via the ``backend`` fixture, with
block verification -- the decoder's default -- and g3eos, g5 and g3blk also token by
token):

=====  ======  =====  =======  ====  ===========  ================  =================
id     gamma   T      max_new  V     EOS          dtypes (d / t)    other
=====  ======  =====  =======  ====  ===========  ================  =================
g1     1       1.0    4        4     --           f64 / f64         4 target passes
g3eos  3       0.7    4        5     2            f64 / f32         2nd target pass
g5     5       1.3    3 < g    6     --           f32 / f64         budget < gamma
g5eos  5       1.0    3 < g    5     0            f32 / f32         budget < gamma
g3msk  3       1.3    6 > n=4  4     3            f64 / f32         -inf in both
g1eos  1       0.7    3        6     5            f32 / f32         logits_to_keep
g3blk  3       1.0    3        1300  1024         f32 / f64         3 blocks, -inf
=====  ======  =====  =======  ====  ===========  ================  =================
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import pytest
from law_models import (
    ContextModel,
    SparseVocabModel,
    enumerate_joint_law,
    new_tokens,
    pooled_chisquare,
    warped_probs,
)

import specdec
from specdec._backend import kernels_for

N_RUNS = 6000
ALPHA = 1e-3  # a correct sampler fails with this probability (per seed set)
POWER_ALPHA = 1e-6  # a wrong sampler must be rejected at least this strongly


class KeepRows:
    """A model that accepts ``logits_to_keep`` and returns only the trailing rows (the
    decoder then asks for exactly the rows it needs)."""

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.vocab_size

    def forward(self, ids, logits_to_keep=None):
        logits = self.model.forward(ids)
        return logits if logits_to_keep is None else logits[:, -logits_to_keep:]

    def next_logits(self, sequence):
        return self.model.next_logits(sequence)


@dataclass(frozen=True)
class Config:
    """One exact-law scenario: two models, a prompt and the decoder's settings."""

    id: str
    vocab: int
    gamma: int
    temperature: float
    max_new_tokens: int
    n_tokens: int  # new tokens whose joint law is compared
    eos: int | None
    draft_dtype: type
    target_dtype: type
    draft_seed: int
    target_seed: int
    prompt: tuple
    rng_seed: int
    draft_scale: float = 1.5
    draft_masked: tuple | None = None
    target_masked: tuple | None = None
    live: tuple | None = None  # a SparseVocabModel over these ids of a large vocabulary
    keep_rows: bool = False  # both models take ``logits_to_keep``

    def models(self):
        if self.live is None:
            draft = ContextModel(
                self.vocab,
                seed=self.draft_seed,
                scale=self.draft_scale,
                dtype=self.draft_dtype,
                masked=self.draft_masked,
            )
            target = ContextModel(
                self.vocab,
                seed=self.target_seed,
                dtype=self.target_dtype,
                masked=self.target_masked,
            )
            if self.keep_rows:
                return KeepRows(draft), KeepRows(target)
            return draft, target

        def inner(ids):
            return None if ids is None else [self.live.index(i) for i in ids]

        draft = SparseVocabModel(
            self.vocab,
            self.live,
            seed=self.draft_seed,
            scale=self.draft_scale,
            dtype=self.draft_dtype,
            masked=inner(self.draft_masked),
        )
        target = SparseVocabModel(
            self.vocab,
            self.live,
            seed=self.target_seed,
            dtype=self.target_dtype,
            masked=inner(self.target_masked),
        )
        return draft, target

    def law(self, target):
        return enumerate_joint_law(
            target, list(self.prompt), self.n_tokens, self.eos, temperature=self.temperature
        )


CONFIGS = [
    Config(
        "g1",
        vocab=4,
        gamma=1,
        temperature=1.0,
        max_new_tokens=4,
        n_tokens=4,
        eos=None,
        draft_dtype=np.float64,
        target_dtype=np.float64,
        draft_seed=101,
        target_seed=102,
        prompt=(0, 1),
        rng_seed=1001,
    ),
    Config(
        "g3eos",
        vocab=5,
        gamma=3,
        temperature=0.7,
        max_new_tokens=4,
        n_tokens=4,
        eos=2,
        draft_dtype=np.float64,
        target_dtype=np.float32,
        draft_seed=201,
        target_seed=202,
        prompt=(3,),
        rng_seed=1002,
        draft_scale=1.0,
    ),
    Config(
        "g5",
        vocab=6,
        gamma=5,
        temperature=1.3,
        max_new_tokens=3,
        n_tokens=3,
        eos=None,
        draft_dtype=np.float32,
        target_dtype=np.float64,
        draft_seed=304,
        target_seed=302,
        prompt=(5, 0, 2),
        rng_seed=1003,
    ),
    Config(
        "g5eos",
        vocab=5,
        gamma=5,
        temperature=1.0,
        max_new_tokens=3,
        n_tokens=3,
        eos=0,
        draft_dtype=np.float32,
        target_dtype=np.float32,
        draft_seed=401,
        target_seed=402,
        prompt=(1, 4),
        rng_seed=1004,
        draft_scale=2.0,
    ),
    # The draft can never propose 1 (only the residual or the bonus draw can make
    # it); the target never allows 2, which the draft proposes often.  Six tokens
    # are generated and the first four compared: the law of a prefix must not
    # depend on what is generated after it.
    Config(
        "g3msk",
        vocab=4,
        gamma=3,
        temperature=1.3,
        max_new_tokens=6,
        n_tokens=4,
        eos=3,
        draft_dtype=np.float64,
        target_dtype=np.float32,
        draft_seed=501,
        target_seed=502,
        prompt=(0,),
        rng_seed=1005,
        draft_masked=(1,),
        target_masked=(2,),
    ),
    Config(
        "g1eos",
        vocab=6,
        gamma=1,
        temperature=0.7,
        max_new_tokens=3,
        n_tokens=3,
        eos=5,
        draft_dtype=np.float32,
        target_dtype=np.float32,
        draft_seed=601,
        target_seed=602,
        prompt=(2, 2),
        rng_seed=1006,
        keep_rows=True,
    ),
    # V = 1300: three blocks of the compiled core's sampling pass (BLOCK_SIZE = 512),
    # ten live ids spread over them and whole runs of -inf between.  The target
    # forbids 900 (block 1), the draft 7 and 1299 (blocks 0 and 2): the residual
    # must find its mass in another block than the rejected draft's.
    Config(
        "g3blk",
        vocab=1300,
        gamma=3,
        temperature=1.0,
        max_new_tokens=3,
        n_tokens=3,
        eos=1024,
        draft_dtype=np.float32,
        target_dtype=np.float64,
        draft_seed=701,
        target_seed=702,
        prompt=(0, 512),
        rng_seed=1008,
        draft_masked=(7, 1299),
        target_masked=(900,),
        live=(0, 7, 300, 511, 512, 513, 900, 1023, 1024, 1299),
    ),
]
CONFIG_BY_ID = {c.id: c for c in CONFIGS}


def run_decoder(decoder, draft, target, config, n_runs=N_RUNS):
    """Outcome counts of ``n_runs`` generations and the summed accepted-length histogram."""
    rng = np.random.default_rng(config.rng_seed)
    counts = collections.Counter()
    histogram = np.zeros(decoder.gamma + 1, dtype=np.int64)
    prompt = list(config.prompt)
    for _ in range(n_runs):
        ids, stats = decoder.generate(
            draft, target, prompt, config.max_new_tokens, config.eos, rng=rng
        )
        counts[new_tokens(ids, prompt, config.n_tokens)] += 1
        histogram += stats.accepted_length_histogram
    return counts, histogram


def check_exact(result):
    assert result.impossible == 0, f"{result.impossible} outcomes of probability 0"
    assert result.pvalue > ALPHA, f"joint law differs from the target's: {result}"


# --- the configurations are what they claim to be ------------------------------------


def test_configs_cover_the_brief():
    assert {c.gamma for c in CONFIGS} == {1, 3, 5}
    assert {c.temperature for c in CONFIGS} == {0.7, 1.0, 1.3}
    assert any(c.eos is None for c in CONFIGS) and any(c.eos is not None for c in CONFIGS)
    assert any(c.max_new_tokens < c.gamma for c in CONFIGS)
    dtypes = {(c.draft_dtype, c.target_dtype) for c in CONFIGS}
    assert len(dtypes) == 4  # every pairing of float32 and float64
    for c in CONFIGS:
        draft, target = c.models()
        law = c.law(target)
        assert abs(sum(law.values()) - 1.0) < 1e-12
        if c.eos is not None:  # EOS really ends some outcomes early
            assert any(len(cell) < c.n_tokens for cell, p in law.items() if p > 0.01), c.id
        # The draft differs from the target where it matters: the first draft law is
        # far from the target's (total variation), so acceptance is far from certain.
        p = warped_probs(target.next_logits(list(c.prompt)), c.temperature)
        q = warped_probs(draft.next_logits(list(c.prompt)), c.temperature)
        assert 0.5 * np.abs(p - q).sum() > 0.2, c.id
    # g3blk: the first target row has mass in all three blocks of 512
    c = CONFIG_BY_ID["g3blk"]
    _, target = c.models()
    p = warped_probs(target.next_logits(list(c.prompt)), c.temperature)
    assert {i // 512 for i in np.flatnonzero(p > 0.01)} == {0, 1, 2}


# --- exactness ---------------------------------------------------------------------


#: Configurations also run with token-by-token verification (every one runs with block
#: verification, the default): the longest drafts, both EOS cases, three blocks.
TOKEN_SCHEME_IDS = ("g3eos", "g5", "g3blk")


#: The configuration that .ci/run's install stages also run (-m install): the cheapest.
INSTALL_CONFIG_ID = "g1"


@pytest.mark.parametrize(
    "config, verification",
    [
        pytest.param(c, "block", marks=[pytest.mark.install] if c.id == INSTALL_CONFIG_ID else [])
        for c in CONFIGS
    ]
    + [(c, "token") for c in CONFIGS if c.id in TOKEN_SCHEME_IDS],
    ids=lambda v: v.id if isinstance(v, Config) else v,
)
def test_joint_law_is_the_targets(backend, config, verification):
    draft, target = config.models()
    decoder = specdec.SpeculativeDecoder(
        gamma=config.gamma,
        temperature=config.temperature,
        verification=verification,
        backend=backend,
    )
    counts, histogram = run_decoder(decoder, draft, target, config)
    result = pooled_chisquare(counts, config.law(target))
    print(
        f"exact law [{backend}, {config.id}, {verification}]: chi2={result.statistic:.1f} "
        f"dof={result.dof} "
        f"p={result.pvalue:.3g} (pooled {result.n_pooled} cells)"
    )
    check_exact(result)
    # Both decisions happen: some steps reject their first draft, some keep drafts.
    assert histogram[0] > 0 and histogram[1:].sum() > 0, histogram


def test_masked_token_is_never_produced_and_first_token_law_is_exact(backend):
    """First-token marginal with -inf tokens: 1 is masked in the target (the draft
    proposes it a third of the time: it must always be rejected), 3 is masked in the
    draft (it can only come from the residual)."""
    vocab, masked_target, masked_draft = 5, 1, 3
    draft = ContextModel(vocab, seed=701, masked=masked_draft)
    draft.table[..., masked_target] += 3.0  # the draft loves the token the target forbids
    target = ContextModel(vocab, seed=702, masked=masked_target, dtype=np.float32)
    target.table[..., masked_draft] += 2.0  # ... and the target likes the one the draft forbids
    prompt = [2, 0]
    first = enumerate_joint_law(target, prompt, 1)
    assert (masked_target,) not in first and first[(masked_draft,)] > 0.05
    q = warped_probs(draft.next_logits(prompt))
    assert q[masked_target] > 0.3

    decoder = specdec.SpeculativeDecoder(gamma=4, temperature=1.0, backend=backend)
    rng = np.random.default_rng(1007)
    counts = collections.Counter()
    produced = collections.Counter()
    for _ in range(N_RUNS):
        ids, _ = decoder.generate(draft, target, prompt, 3, rng=rng)
        counts[tuple(ids[len(prompt) : len(prompt) + 1])] += 1
        produced.update(ids[len(prompt) :])
    assert produced[masked_target] == 0
    assert produced[masked_draft] > 0
    result = pooled_chisquare(counts, first)
    print(
        f"first token with masks [{backend}]: chi2={result.statistic:.1f} dof={result.dof} "
        f"p={result.pvalue:.3g}"
    )
    check_exact(result)


class DtypeSwitchingModel:
    """A model whose logits alternate float32 / float64 from one call to the next
    (the protocol allows either dtype on every call)."""

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.vocab_size
        self.calls = 0

    def forward(self, ids):
        self.calls += 1
        return self.model.forward(ids).astype(np.float32 if self.calls % 2 else np.float64)


def test_draft_whose_dtype_changes_between_calls(backend):
    """A draft that switches its logits dtype inside a block is refused with a clear
    error (the drafts of a block share one weights buffer), never sampled wrongly."""
    config = CONFIG_BY_ID["g3eos"]
    draft, target = config.models()
    decoder = specdec.SpeculativeDecoder(
        gamma=config.gamma, temperature=config.temperature, backend=backend
    )
    with pytest.raises(TypeError, match="draft_model returned .* logits after"):
        decoder.generate(DtypeSwitchingModel(draft), target, list(config.prompt), 6, rng=0)


# --- power: the same statistic rejects wrong samplers ---------------------------------


# The wrong samplers wrap the backend's own ``verify`` kernel and rely only on its
# positional signature (target rows, draft tokens, draft weights, draft laws, bonus,
# then the controls, the generator, the workspace and the scheme): a plain draw from
# the target's warped law of one row is ``verify`` of that row with no draft at all.


def _draw_from_row(real_verify, target_rows, i, draft_tokens, rest, options):
    """A token from the target's (warped) law of row ``i``: verify with zero drafts."""
    _, token = real_verify(
        target_rows[i : i + 1], draft_tokens[:0], None, None, True, *rest, **options
    )
    return token


def _keep_every_draft(kernels):
    """A wrong verify: keeps every draft token, then draws the bonus from the target."""
    real_verify = kernels.verify

    def verify(target_rows, draft_tokens, draft_weights, draft_laws, bonus, *rest, **options):
        n = len(draft_tokens)
        if not bonus:
            return n, -1
        return n, _draw_from_row(real_verify, target_rows, n, draft_tokens, rest, options)

    return verify


def _residual_from_p(kernels):
    """A wrong verify: after a rejection, draws from p instead of norm(max(0, p - q))."""
    real_verify = kernels.verify

    def verify(target_rows, draft_tokens, draft_weights, draft_laws, bonus, *rest, **options):
        n_accepted, token = real_verify(
            target_rows, draft_tokens, draft_weights, draft_laws, bonus, *rest, **options
        )
        if n_accepted < len(draft_tokens):
            token = _draw_from_row(
                real_verify, target_rows, n_accepted, draft_tokens, rest, options
            )
        return n_accepted, token

    return verify


WRONG_SAMPLERS = {
    "keep_every_draft": (_keep_every_draft, "g3eos"),
    "residual_from_p": (_residual_from_p, "g5eos"),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_SAMPLERS))
def test_power_statistic_rejects_a_wrong_sampler(wrong, monkeypatch):
    """The chi-square of ``test_joint_law_is_the_targets``, same configuration, same
    seed, same number of runs, on a decoder whose verify kernel is wrong (on the
    default backend only: this checks the statistic, not a backend)."""
    make_wrong, config_id = WRONG_SAMPLERS[wrong]
    config = CONFIG_BY_ID[config_id]
    backend = specdec.BACKEND
    kernels = kernels_for(backend)
    monkeypatch.setattr(kernels, "verify", make_wrong(kernels))
    draft, target = config.models()
    decoder = specdec.SpeculativeDecoder(
        gamma=config.gamma, temperature=config.temperature, backend=backend
    )
    counts, _ = run_decoder(decoder, draft, target, config)
    result = pooled_chisquare(counts, config.law(target))
    print(
        f"power check {wrong} [{backend}, {config_id}]: chi2={result.statistic:.1f} "
        f"dof={result.dof} p={result.pvalue:.3g}; {result.impossible} impossible outcomes"
    )
    assert result.pvalue < POWER_ALPHA, result


def test_residual_from_p_matters_for_the_chosen_models():
    """The residual-from-p sampler's first-token law is far from the target's here, so
    its rejection is not luck: TV(min(p, q) + (1 - sum min(p, q)) p, p) > 0.05."""
    config = CONFIG_BY_ID[WRONG_SAMPLERS["residual_from_p"][1]]
    draft, target = config.models()
    p = warped_probs(target.next_logits(list(config.prompt)), config.temperature)
    q = warped_probs(draft.next_logits(list(config.prompt)), config.temperature)
    overlap = np.minimum(p, q)
    wrong = overlap + (1.0 - overlap.sum()) * p
    assert 0.5 * np.abs(wrong - p).sum() > 0.05
