"""Exact law under top-k, top-p and min-p, tested against enumeration (issue 4).

The output law must be the *warped* target's: temperature, then top-k (ties at the
boundary kept), then top-p over the top-k survivors (ties kept together), then
min-p, renormalised -- ``law_models.warped_probs`` is the oracle and
``enumerate_joint_law(..., top_k=...)`` its joint law.  Each configuration runs
``N_RUNS`` seeded generations on both backends and compares the joint law of the
first new tokens with Pearson's chi-square, cells of expectation < 5 pooled, and
asserts p > ALPHA = 1e-3 (deterministic: one fixed-seed Generator per test; see
test_decoder_law.py for the false-alarm rate) and that no outcome of probability 0
occurs.  ``test_no_token_outside_the_warped_support`` checks every token of longer
generations against the warped support of its own context.

Every configuration is checked to exercise its rule (the ``test_config*`` tests):
integer logits put ties at the top-k boundary and inside top-p sets, min-p is
used at a temperature where its support differs from min-p at T = 1, and the
combination is one where top-p over the top-k survivors differs from top-p over
all tokens.  They are also checked to be unambiguous: no top-p or min-p boundary
lies within 1e-5 of the threshold, so that rounding (float32 weights) cannot
decide membership differently in the oracle and in the kernels.

Power: ``test_power_rejects_warping_only_the_draft`` runs the same statistic on a
decoder whose verify scores the target *without* top-k/top-p/min-p (vLLM #9834:
drafts filtered, target not): its output law is the unwarped target's, which
must be rejected (p < 1e-6), while the same counts fit the unwarped law.  It runs
on the default backend only (it checks the statistic, not a backend).

Configurations (each on both backends; V = 6 unless said):

======  =====================================  =====  ===========  ========================
id      controls                               gamma  d / t dtype  exercises
======  =====================================  =====  ===========  ========================
top_k   T=1.0, top_k=2                         3      f32 / f64    ties at the k boundary
top_p   T=1.0, top_p=0.75, EOS                 2      f64 / f32    cut inside a tie group
min_p   T=0.7, min_p=0.05                      4      f64 / f32    min-p after temperature
t_k_p   T=1.3, top_k=3, top_p=0.8              3      f32 / f32    top-p over top-k set
blocks  T=0.7, top_k=4, top_p=0.9, min_p=0.02  1      f32 / f64    V=1300: 3 blocks, -inf
======  =====================================  =====  ===========  ========================
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
    reachable_rows,
    warped_probs,
)

import specdec
from specdec._backend import kernels_for
from specdec._validation import SamplingControls

N_RUNS = 6000
ALPHA = 1e-3
POWER_ALPHA = 1e-6
MARGIN = 1e-5


@dataclass(frozen=True)
class Config:
    id: str
    controls: dict  # temperature, top_k, top_p, min_p
    gamma: int
    max_new_tokens: int
    n_tokens: int
    vocab: int
    draft_seed: int
    target_seed: int
    prompt: tuple
    rng_seed: int
    integer: bool
    eos: int | None = None
    scale: float = 1.5
    draft_dtype: type = np.float64
    target_dtype: type = np.float64
    live: tuple | None = None  # a SparseVocabModel over these ids of a large vocabulary

    def models(self):
        if self.live is None:

            def make(**kwargs):
                return ContextModel(self.vocab, **kwargs)
        else:

            def make(**kwargs):
                return SparseVocabModel(self.vocab, self.live, **kwargs)

        draft = make(
            seed=self.draft_seed, scale=self.scale, integer=self.integer, dtype=self.draft_dtype
        )
        target = make(
            seed=self.target_seed, scale=self.scale, integer=self.integer, dtype=self.target_dtype
        )
        return draft, target

    def law(self, target, **controls):
        return enumerate_joint_law(
            target, list(self.prompt), self.n_tokens, self.eos, **(controls or self.controls)
        )

    def rows(self, model):
        """The target contexts reachable under the warped law, with their logits."""
        return list(
            reachable_rows(model, list(self.prompt), self.n_tokens, self.eos, **self.controls)
        )


CONFIGS = [
    Config(
        "top_k",
        dict(temperature=1.0, top_k=2),
        gamma=3,
        max_new_tokens=4,
        n_tokens=4,
        vocab=6,
        draft_seed=23,
        target_seed=24,
        prompt=(0,),
        rng_seed=2001,
        integer=True,
        draft_dtype=np.float32,
    ),
    Config(
        "top_p",
        dict(temperature=1.0, top_p=0.75),
        gamma=2,
        max_new_tokens=3,
        n_tokens=3,
        vocab=6,
        draft_seed=33,
        target_seed=34,
        prompt=(1, 2),
        rng_seed=2002,
        integer=True,
        eos=5,
        target_dtype=np.float32,
    ),
    Config(
        "min_p",
        dict(temperature=0.7, min_p=0.05),
        gamma=4,
        max_new_tokens=3,
        n_tokens=3,
        vocab=6,
        draft_seed=43,
        target_seed=44,
        prompt=(3,),
        rng_seed=2003,
        integer=False,
        target_dtype=np.float32,
    ),
    Config(
        "t_k_p",
        dict(temperature=1.3, top_k=3, top_p=0.8),
        gamma=3,
        max_new_tokens=3,
        n_tokens=3,
        vocab=6,
        draft_seed=53,
        target_seed=57,
        prompt=(5, 1),
        rng_seed=2004,
        integer=True,
        draft_dtype=np.float32,
        target_dtype=np.float32,
    ),
    # V = 1300 (three blocks of the compiled core's passes), nine live ids spread over
    # them: top-k's selection and top-p's candidates run over rows that are mostly
    # -inf, and the kept tokens lie in different blocks.
    Config(
        "blocks",
        dict(temperature=0.7, top_k=4, top_p=0.9, min_p=0.02),
        gamma=1,
        max_new_tokens=2,
        n_tokens=2,
        vocab=1300,
        draft_seed=63,
        target_seed=64,
        prompt=(511,),
        rng_seed=2005,
        integer=True,
        scale=1.0,
        draft_dtype=np.float32,
        live=(2, 511, 512, 513, 800, 1023, 1024, 1100, 1299),
    ),
]
CONFIG_BY_ID = {c.id: c for c in CONFIGS}


def run_decoder(decoder, draft, target, config, n_runs=N_RUNS):
    rng = np.random.default_rng(config.rng_seed)
    counts = collections.Counter()
    prompt = list(config.prompt)
    for _ in range(n_runs):
        ids, _ = decoder.generate(draft, target, prompt, config.max_new_tokens, config.eos, rng=rng)
        counts[new_tokens(ids, prompt, config.n_tokens)] += 1
    return counts


def make_decoder(config, backend, verification="block"):
    return specdec.SpeculativeDecoder(
        gamma=config.gamma, verification=verification, backend=backend, **config.controls
    )


# --- the oracle on rows computed by hand ------------------------------------------------


def test_oracle_on_hand_computed_rows():
    def support(logits, **controls):
        return list(np.flatnonzero(warped_probs(np.asarray(logits, dtype=float), **controls)))

    # top-k keeps every logit >= the k-th largest: the tie at the boundary stays
    assert support([3, 2, 2, 1, -np.inf], top_k=2) == [0, 1, 2]
    assert support([3, 2, 2, 1, -np.inf], top_k=1) == [0]
    assert support([0, -np.inf, 1], top_k=3) == [0, 2]
    # top-p: probabilities 4/9, 2/9, 2/9, 1/9; the tied pair enters together
    row = np.log([4.0, 2.0, 2.0, 1.0])
    assert support(row, top_p=0.4) == [0]
    assert support(row, top_p=0.5) == [0, 1, 2]
    assert support(row, top_p=0.95) == [0, 1, 2, 3]
    # top-p over the renormalised top-k survivors: 0.5, 0.3, 0.2 -> top-2 gives
    # 0.625, 0.375, so top_p = 0.6 keeps one token (over all tokens it would keep two)
    row = np.log([0.5, 0.3, 0.2])
    assert support(row, top_k=2, top_p=0.6) == [0]
    assert support(row, top_p=0.6) == [0, 1]
    # min-p after temperature: weights exp((x - max) / T)
    assert support([0.0, -1.0, -2.0], temperature=0.5, min_p=0.1) == [0, 1]
    assert support([0.0, -1.0, -2.0], temperature=1.0, min_p=0.1) == [0, 1, 2]
    probs = warped_probs(np.array([0.0, -1.0, -2.0]), temperature=0.5, min_p=0.1)
    np.testing.assert_allclose(probs, np.array([1.0, np.exp(-2.0), 0.0]) / (1 + np.exp(-2.0)))


# --- the configurations exercise what they claim, and are unambiguous ----------------


def _sorted_desc(logits):
    return np.sort(logits[np.isfinite(logits)])[::-1]


def _top_p_boundaries(logits, temperature, top_k=None):
    """Cumulative renormalised mass (over the top-k survivors) at the end of each group
    of tied logits, largest first."""
    kept = warped_probs(logits, temperature, top_k=top_k)
    values = np.unique(logits[kept > 0])[::-1]
    return np.cumsum([kept[logits == v].sum() for v in values])


def _unambiguous(config, rows):
    c = config.controls
    t = c.get("temperature", 1.0)
    for _, logits in rows:
        if c.get("top_p") is not None:
            bounds = _top_p_boundaries(logits, t, c.get("top_k"))[:-1]  # the last is 1
            assert np.all(np.abs(bounds - c["top_p"]) > MARGIN)
        if c.get("min_p") is not None:
            w = np.exp((logits - logits.max()) / t)
            assert np.min(np.abs(w - c["min_p"])) > MARGIN


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_configs_are_unambiguous(config):
    _, target = config.models()
    _unambiguous(config, config.rows(target))


def test_config_blocks_keeps_tokens_in_several_blocks():
    config = CONFIG_BY_ID["blocks"]
    _, target = config.models()
    blocks = set()
    for _, logits in config.rows(target):
        blocks |= {i // 512 for i in np.flatnonzero(warped_probs(logits, **config.controls))}
    assert blocks == {0, 1, 2}


def test_config_top_k_has_ties_at_the_boundary():
    config = CONFIG_BY_ID["top_k"]
    _, target = config.models()
    rows = config.rows(target)
    k = config.controls["top_k"]
    tied = [logits for _, logits in rows if _sorted_desc(logits)[k - 1] == _sorted_desc(logits)[k]]
    assert len(tied) >= 5
    # ... and there the oracle keeps more than k tokens
    for logits in tied:
        assert np.count_nonzero(warped_probs(logits, **config.controls)) > k
    # the very first row is one of them, so the first token's law depends on the rule
    assert _sorted_desc(rows[0][1])[k - 1] == _sorted_desc(rows[0][1])[k]


def test_config_top_p_cuts_inside_tie_groups():
    config = CONFIG_BY_ID["top_p"]
    _, target = config.models()
    rows = config.rows(target)
    _unambiguous(config, rows)
    inside = 0
    for _, logits in rows:
        kept = np.count_nonzero(warped_probs(logits, **config.controls))
        full = warped_probs(logits, config.controls["temperature"])
        order = np.argsort(-logits, kind="stable")
        # the smallest prefix of the sorted tokens, ties split, that holds top_p ...
        prefix = int(np.searchsorted(np.cumsum(full[order]), config.controls["top_p"])) + 1
        # ... is smaller than the kept set when the cut falls inside a tie group
        inside += prefix < kept
    assert inside >= 3


def test_config_min_p_depends_on_the_temperature():
    config = CONFIG_BY_ID["min_p"]
    _, target = config.models()
    rows = config.rows(target)
    _unambiguous(config, rows)
    differs = sum(
        np.count_nonzero(warped_probs(logits, **config.controls))
        != np.count_nonzero(warped_probs(logits, 1.0, min_p=config.controls["min_p"]))
        for _, logits in rows
    )
    assert differs >= 3
    # and min-p really removes tokens
    assert (
        sum(
            np.count_nonzero(warped_probs(logits, **config.controls)) < config.vocab
            for _, logits in rows
        )
        >= len(rows) // 2
    )


def test_config_combined_top_p_is_over_the_top_k_survivors():
    config = CONFIG_BY_ID["t_k_p"]
    _, target = config.models()
    rows = config.rows(target)
    _unambiguous(config, rows)
    c = config.controls
    differs = []
    for _, logits in rows:
        right = warped_probs(logits, **c) > 0
        # the wrong order: top-p over all tokens, intersected with top-k
        wrong = (warped_probs(logits, c["temperature"], top_k=c["top_k"]) > 0) & (
            warped_probs(logits, c["temperature"], top_p=c["top_p"]) > 0
        )
        differs.append(not np.array_equal(right, wrong))
    assert differs[0] and sum(differs) >= 2  # the first token's law among them
    # ties at the top-k boundary occur here too
    k = c["top_k"]
    assert any(_sorted_desc(logits)[k - 1] == _sorted_desc(logits)[k] for _, logits in rows)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_configs_draft_proposes_outside_the_targets_support(config):
    """In some reachable context the warped draft can propose a token that the
    warped target forbids (it must always be rejected), and the warped law differs
    from the unwarped one (so the power check has something to find)."""
    draft, target = config.models()
    outside = 0
    for sequence, logits in config.rows(target):
        p = warped_probs(logits, **config.controls)
        q = warped_probs(draft.next_logits(sequence), **config.controls)
        outside += bool(np.any((q > 0) & (p == 0)))
    assert outside >= 1
    unwarped = config.law(target, temperature=config.controls["temperature"])
    warped = config.law(target)
    tv = 0.5 * sum(
        abs(unwarped.get(cell, 0.0) - warped.get(cell, 0.0)) for cell in set(unwarped) | set(warped)
    )
    assert tv > 0.05


# --- exactness ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, verification",
    [(c, "block") for c in CONFIGS]
    + [(c, "token") for c in CONFIGS if c.id in ("t_k_p", "blocks")],
    ids=lambda v: v.id if isinstance(v, Config) else v,
)
def test_joint_law_is_the_warped_targets(backend, config, verification):
    """Block verification (the default) on every configuration, token by token on two."""
    draft, target = config.models()
    counts = run_decoder(make_decoder(config, backend, verification), draft, target, config)
    result = pooled_chisquare(counts, config.law(target))
    print(
        f"controls law [{backend}, {config.id}, {verification}]: chi2={result.statistic:.1f} "
        f"dof={result.dof} p={result.pvalue:.3g}"
    )
    assert result.impossible == 0, f"{result.impossible} outcomes outside the warped support"
    assert result.pvalue > ALPHA, result


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_no_token_outside_the_warped_support(backend, config):
    """Longer generations: every token has positive warped probability in its context."""
    draft, target = config.models()
    decoder = make_decoder(config, backend)
    rng = np.random.default_rng(config.rng_seed + 1)
    prompt = list(config.prompt)
    checked = 0
    for _ in range(300):  # EOS ends some runs early: enough runs for > 500 checks
        ids, _ = decoder.generate(draft, target, prompt, 20, config.eos, rng=rng)
        for position in range(len(prompt), len(ids)):
            probs = warped_probs(target.next_logits(ids[:position]), **config.controls)
            assert probs[ids[position]] > 0, (ids, position)
            checked += 1
    assert checked > 500


# --- power: the same statistic rejects a sampler that warps only the draft -----------


def _target_unwarped(kernels):
    """A wrong verify: scores the target with the temperature only, no top-k/top-p/min-p
    (the drafts were still drawn with them).  Relies on verify's positional signature:
    (..., bonus, controls, rng, work, ...)."""
    real_verify = kernels.verify

    def verify(
        target_rows, draft_tokens, draft_weights, draft_laws, bonus, controls, *rest, **options
    ):
        unwarped = SamplingControls(temperature=controls.temperature)
        return real_verify(
            target_rows, draft_tokens, draft_weights, draft_laws, bonus, unwarped, *rest, **options
        )

    return verify


@pytest.mark.parametrize("config_id", ["top_k", "t_k_p"])
def test_power_rejects_warping_only_the_draft(config_id, monkeypatch):
    """On the default backend only: this checks the statistic, not a backend."""
    config = CONFIG_BY_ID[config_id]
    backend = specdec.BACKEND
    kernels = kernels_for(backend)
    monkeypatch.setattr(kernels, "verify", _target_unwarped(kernels))
    draft, target = config.models()
    counts = run_decoder(make_decoder(config, backend), draft, target, config)
    result = pooled_chisquare(counts, config.law(target))
    print(
        f"power check draft-only warping [{backend}, {config_id}]: "
        f"chi2={result.statistic:.1f} dof={result.dof} p={result.pvalue:.3g}; "
        f"{result.impossible} outcomes outside the support"
    )
    assert result.pvalue < POWER_ALPHA, result
    # The wrong sampler's outcomes follow the unwarped law instead (sanity of the check).
    unwarped_law = config.law(target, temperature=config.controls["temperature"])
    unwarped = pooled_chisquare(counts, unwarped_law)
    assert unwarped.pvalue > ALPHA, unwarped
