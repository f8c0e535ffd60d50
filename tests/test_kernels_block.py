"""Block verification and one-hot drafts (issues 10 and 11), tested exactly.

* **One-hot drafts** (``verify(..., None, None, ...)``, a deterministic drafter): a
  small step loop here composes ``verify`` calls into generations (the drafter is a
  fixed function of the context, ``LookupDrafter``), under both schemes, with and
  without sampling controls, on both backends.  The joint law of the first new
  tokens is compared with the target's exact law (``enumerate_joint_law``) by the
  pooled chi-square of ``law_models``; no outcome of probability 0 may occur.
* **Block verification with model drafts** goes through the decoder
  (``verification="block"``, the default); its exact-law tests are the ones of
  test_decoder_law.py and test_decoder_controls_law.py, which run both schemes.
* **Power**: the same statistic, same runs, rejects a one-hot sampler that keeps
  every draft (p < POWER_ALPHA).
* **Expected kept tokens, exactly**: for small models, E[tokens kept per call] is
  computed by enumerating every draft block -- for token verification from
  prod min(p, q), for block verification by integrating over the uniforms eta
  (P(tau >= i) = 1 - prod_{j >= i} (1 - h_j) given the block) -- from an
  independent float64 implementation of the paper's formulas.  With model drafts
  block >= token in every case, strictly in most; the paper's own example (V = 2,
  gamma = 2) gives 10/9 and 11/9.  With one-hot drafts the two are equal (no scheme
  can keep X_1..X_i more often than the target produces them).  The kernels' mean
  kept length over many calls matches the exact block expectation within 5
  standard errors (so the kernel is the algorithm whose expectation was computed).
* **Greedy** under block verification is the target's argmax decoding
  (test_decoder_greedy.py runs both schemes), and **bad arguments** fail clearly.

False alarms: each chi-square test is seeded and deterministic; a change in the
stream of uniforms re-draws it, and then each fails by chance with probability
ALPHA = 1e-3 (see test_decoder_law.py).
"""

from __future__ import annotations

import collections
import itertools
import math
import zlib

import numpy as np
import pytest
from law_models import ContextModel, enumerate_joint_law, pooled_chisquare, warped_probs

import specdec
from specdec._backend import kernels_for
from specdec._common import LAW_DTYPE
from specdec._validation import SamplingControls

N_RUNS = 4_000
ALPHA = 1e-3
POWER_ALPHA = 1e-6


class LookupDrafter:
    """A deterministic drafter: a fixed function of the last token proposes the next
    one (a tiny "prompt lookup"), so its q is one-hot at every position."""

    def __init__(self, vocab_size, seed):
        self.next = np.random.default_rng(seed).integers(0, vocab_size, size=vocab_size)

    def propose(self, sequence, n):
        out, last = [], sequence[-1]
        for _ in range(n):
            last = int(self.next[last])
            out.append(last)
        return np.asarray(out, dtype=np.int64)


def generate_one_hot(
    kernels, target, drafter, prompt, n_tokens, gamma, controls, rng, block, verify=None
):
    """A step loop of one-hot verification: propose, score, ``verify``, append."""
    verify = verify or kernels.verify
    sequence = list(prompt)
    work = kernels.Workspace(target.vocab_size)
    while len(sequence) - len(prompt) < n_tokens:
        drafts = drafter.propose(sequence, min(gamma, n_tokens - (len(sequence) - len(prompt))))
        ids = np.asarray([sequence + drafts.tolist()], dtype=np.int64)
        rows = np.ascontiguousarray(target.forward(ids)[0, -(len(drafts) + 1) :])
        n_accepted, token = verify(rows, drafts, None, None, True, controls, rng, work, block)
        sequence += drafts[:n_accepted].tolist() + [token]
    return tuple(sequence[len(prompt) : len(prompt) + n_tokens])


ONE_HOT_CONFIGS = {
    # id: (vocab, gamma, controls, dtype, target seed, drafter seed, prompt, n_tokens)
    "plain": (4, 3, dict(temperature=1.0), np.float64, 11, 14, (0,), 4),
    "hot_f32": (5, 4, dict(temperature=0.6), np.float32, 21, 25, (3, 1), 3),
    "controls": (
        6,
        2,
        dict(temperature=1.2, top_k=4, top_p=0.9, min_p=0.05),
        np.float32,
        31,
        62,
        (2,),
        3,
    ),
}


def one_hot_setup(config_id):
    vocab, gamma, controls, dtype, target_seed, drafter_seed, prompt, n_tokens = ONE_HOT_CONFIGS[
        config_id
    ]
    target = ContextModel(vocab, seed=target_seed, dtype=dtype)
    law = enumerate_joint_law(target, list(prompt), n_tokens, **controls)
    return (
        target,
        LookupDrafter(vocab, drafter_seed),
        prompt,
        n_tokens,
        gamma,
        SamplingControls.from_user(**controls),
        law,
    )


def run_one_hot(kernels, config_id, block, verify=None, n_runs=N_RUNS):
    target, drafter, prompt, n_tokens, gamma, controls, law = one_hot_setup(config_id)
    # zlib.crc32, not hash(): str hashes differ from process to process (PYTHONHASHSEED),
    # and a law test's seed must be the same in every run
    rng = np.random.default_rng(zlib.crc32(config_id.encode()) + 7 * block)
    counts = collections.Counter(
        generate_one_hot(
            kernels, target, drafter, prompt, n_tokens, gamma, controls, rng, block, verify
        )
        for _ in range(n_runs)
    )
    return counts, law


def test_one_hot_configs_propose_tokens_the_target_rejects():
    """Over the first two positions, the drafter proposes tokens the target likes and
    tokens it rarely takes, so acceptance and residual draws both matter; under the
    controls it also proposes tokens the warped target forbids (the p(x) = 0 rule)."""
    for config_id in ONE_HOT_CONFIGS:
        target, drafter, prompt, _, _, controls, _ = one_hot_setup(config_id)
        c = dict(
            temperature=controls.temperature,
            top_k=controls.top_k or None,
            top_p=controls.top_p,
            min_p=controls.min_p,
        )
        probs = []
        for first in range(target.vocab_size):
            for sequence in (list(prompt), list(prompt) + [first]):
                x = int(drafter.propose(sequence, 1)[0])
                probs.append(warped_probs(target.next_logits(sequence), **c)[x])
        assert max(probs) > 0.5 and min(probs) < 0.2 and np.mean(probs) > 0.3, (config_id, probs)
        if config_id == "controls":
            assert min(probs) == 0.0


@pytest.mark.parametrize("block", [False, True], ids=["token", "block"])
@pytest.mark.parametrize("config_id", sorted(ONE_HOT_CONFIGS))
def test_one_hot_joint_law_is_the_targets(kernels, config_id, block):
    counts, law = run_one_hot(kernels, config_id, block)
    result = pooled_chisquare(counts, law)
    print(
        f"one-hot [{kernels.__name__}, {config_id}, block={block}]: "
        f"chi2={result.statistic:.1f} dof={result.dof} p={result.pvalue:.3g}"
    )
    assert result.impossible == 0
    assert result.pvalue > ALPHA, result


@pytest.mark.parametrize("block", [False, True], ids=["token", "block"])
def test_power_rejects_keeping_every_one_hot_draft(block):
    """The same statistic and runs reject a verify that keeps every one-hot draft."""
    kernels = kernels_for(specdec.BACKEND)

    def keep_every_draft(rows, drafts, weights, laws, bonus, controls, rng, work, block):
        n = len(drafts)
        _, token = kernels.verify(
            rows[n:], drafts[:0], None, None, True, controls, rng, work, block
        )
        return n, token

    counts, law = run_one_hot(kernels, "plain", block, verify=keep_every_draft)
    result = pooled_chisquare(counts, law)
    assert result.pvalue < POWER_ALPHA, result


# --- expected kept tokens, exactly -----------------------------------------------------------


def _laws(model, prefix, temperature):
    return warped_probs(model.next_logits(list(prefix)), temperature)


def exact_expected_kept(draft, target, prompt, gamma, temperature, one_hot=None):
    """(E token, E block) kept drafts per call, by enumeration of every draft block.

    ``one_hot``: a drafter whose q is one-hot (then the only block is its proposal).
    Written from the formulas of Leviathan et al. and Sun et al. (Algorithm 2),
    independently of the kernels.
    """
    vocab = target.vocab_size
    blocks = (
        [tuple(one_hot.propose(list(prompt), gamma))]
        if one_hot is not None
        else itertools.product(range(vocab), repeat=gamma)
    )
    token_mean = block_mean = 0.0
    for xs in blocks:
        prefix, q_block, ratio = list(prompt), 1.0, 1.0
        p_rows, q_rows, ratios = [], [], [1.0]
        for x in xs:
            p = _laws(target, prefix, temperature)
            q = np.eye(vocab)[x] if one_hot is not None else _laws(draft, prefix, temperature)
            p_rows.append(p)
            q_rows.append(q)
            q_block *= q[x]
            ratio = min(1.0, ratio * p[x] / q[x]) if p[x] > 0 else 0.0
            ratios.append(ratio)
            prefix.append(x)
        if q_block == 0.0:
            continue
        # token verification: P(first k kept | block) = prod_{j <= k} min(1, p / q)
        keep = np.cumprod([min(1.0, p_rows[j][x] / q_rows[j][x]) for j, x in enumerate(xs)])
        token_mean += q_block * keep.sum()
        # block verification: h_i from the residual of row i at ratio p_i
        h = []
        for i in range(1, gamma):
            mass = np.maximum(ratios[i] * p_rows[i] - q_rows[i], 0.0).sum()
            denom = mass + 1.0 - ratios[i]
            h.append(mass / denom if denom > 0 else 1.0)
        h.append(ratios[gamma])
        # P(tau >= i) = 1 - prod_{j >= i} (1 - h_j), i = 1..gamma
        tail = np.cumprod([1.0 - v for v in reversed(h)])[::-1]
        block_mean += q_block * (1.0 - tail).sum()
    return token_mean, block_mean


class IidModel:
    """The same law at every position (the paper's example in section 2)."""

    def __init__(self, probs):
        self.logits = np.log(np.asarray(probs, dtype=np.float64))
        self.vocab_size = len(probs)

    def next_logits(self, sequence):
        return self.logits.copy()

    def forward(self, ids):
        n = np.asarray(ids).shape[1]
        return np.tile(self.logits, (1, n, 1))


def test_papers_example_expectations():
    """Sun et al., section 2: p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2: token
    verification keeps 10/9 tokens per call in expectation, block verification 11/9."""
    target, draft = IidModel([1 / 3, 2 / 3]), IidModel([2 / 3, 1 / 3])
    token, block = exact_expected_kept(draft, target, [0], 2, 1.0)
    assert math.isclose(token, 10 / 9, rel_tol=1e-12)
    assert math.isclose(block, 11 / 9, rel_tol=1e-12)


@pytest.mark.parametrize("drafts", ["model", "one_hot"])
def test_block_keeps_at_least_as_many_tokens_in_expectation(drafts):
    """Model drafts: block >= token always, strictly in most cases.  One-hot drafts: the
    two are equal -- keeping X_1..X_i needs the target to produce them, probability
    p_i = prod P(X_j), which token verification already reaches; block verification's
    h_i give P(tau >= i) = p_i too (its decisions differ, its kept length's law not)."""
    strictly = 0
    for seed in range(12):
        vocab, gamma = 3 + seed % 2, 2 + seed % 3
        target = ContextModel(vocab, seed=100 + seed)
        draft = ContextModel(vocab, seed=200 + seed, scale=1.0 + 0.2 * (seed % 4))
        one_hot = LookupDrafter(vocab, 300 + seed) if drafts == "one_hot" else None
        for temperature in (0.7, 1.0, 1.5):
            token, block = exact_expected_kept(
                draft, target, [seed % vocab], gamma, temperature, one_hot
            )
            assert block >= token - 1e-12, (seed, temperature, token, block)
            strictly += block > token + 1e-6
            if drafts == "one_hot":
                assert math.isclose(block, token, rel_tol=1e-12, abs_tol=1e-15)
    assert strictly >= (10 if drafts == "model" else 0)


def _mean_kept(kernels, draft, target, prompt, gamma, controls, n_calls, seed, one_hot=None):
    """Mean and standard error of the kept prefix over ``n_calls`` block verifications."""
    rng = np.random.default_rng(seed)
    vocab = target.vocab_size
    work = kernels.Workspace(vocab)
    laws, weights = np.zeros(gamma, LAW_DTYPE), np.zeros((gamma, vocab))
    kept = np.empty(n_calls)
    for call in range(n_calls):
        sequence = list(prompt)
        if one_hot is not None:
            tokens = one_hot.propose(sequence, gamma)
        else:
            tokens = np.empty(gamma, dtype=np.int64)
            for i in range(gamma):
                row = draft.forward(np.asarray([sequence]))[0, -1].astype(np.float64)
                tokens[i] = kernels.sample_token(
                    row, controls, rng, laws[i : i + 1], weights[i], work
                )
                sequence.append(int(tokens[i]))
        ids = np.asarray([list(prompt) + tokens.tolist()])
        rows = np.ascontiguousarray(target.forward(ids)[0, -(gamma + 1) :])
        if one_hot is not None:
            kept[call] = kernels.verify(rows, tokens, None, None, False, controls, rng, work, True)[
                0
            ]
        else:
            kept[call] = kernels.verify(
                rows, tokens, weights, laws, False, controls, rng, work, True
            )[0]
    return kept.mean(), kept.std() / math.sqrt(n_calls)


@pytest.mark.parametrize("drafts", ["model", "one_hot"])
def test_kernel_kept_length_matches_the_exact_expectation(kernels, drafts):
    vocab, gamma, temperature = 4, 3, 0.8
    target = ContextModel(vocab, seed=41)
    draft = ContextModel(vocab, seed=42, scale=1.0)
    one_hot = LookupDrafter(vocab, 43) if drafts == "one_hot" else None
    token, block = exact_expected_kept(draft, target, [1], gamma, temperature, one_hot)
    mean, stderr = _mean_kept(
        kernels, draft, target, [1], gamma, SamplingControls(temperature), 4000, 5, one_hot
    )
    assert abs(mean - block) < 5 * stderr, (mean, stderr, block, token)
    if drafts == "model":  # the comparison can tell the schemes apart
        assert block > token + 0.02
        assert abs(mean - token) > 5 * stderr


# --- greedy and bad arguments ----------------------------------------------------------------


@pytest.mark.parametrize("one_hot", [False, True])
def test_greedy_block_is_greedy_token(kernels, one_hot):
    rng = np.random.default_rng(3)
    controls = SamplingControls(0.0)
    for trial in range(200):
        vocab, n = int(rng.integers(1, 8)), int(rng.integers(0, 5))
        rows = np.round(rng.standard_normal((n + 1, vocab)))
        tokens = np.where(
            rng.random(n) < 0.7, np.argmax(rows[:n], axis=1), rng.integers(0, vocab, n)
        ).astype(np.int64)
        weights = None if one_hot else np.zeros((n, vocab))
        laws = None if one_hot else np.zeros(n, LAW_DTYPE)
        out = [
            kernels.verify(
                rows,
                tokens,
                weights,
                laws,
                bool(trial % 2),
                controls,
                rng,
                kernels.Workspace(vocab),
                block,
            )
            for block in (False, True)
        ]
        assert out[0] == out[1]


def _args(**changes):
    args = dict(
        target_rows=np.zeros((3, 5)),
        draft_tokens=np.array([1, 2]),
        draft_weights=None,
        draft_laws=None,
        bonus=True,
        controls=SamplingControls(),
        rng=np.random.default_rng(0),
        work=None,
        block=True,
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(draft_weights=np.ones((2, 5))), ValueError, "both"),
        (dict(draft_laws=np.zeros(2, LAW_DTYPE)), ValueError, "both"),
        (dict(block="yes"), TypeError, "block"),
        (dict(block=1), TypeError, "block"),
        (dict(controls=(1.0, 0, 1.0, 0.0)), TypeError, "controls"),
        (dict(draft_tokens=np.array([1.0, 2.0])), TypeError, "draft_tokens"),
        (dict(draft_tokens=np.array([1, 5])), ValueError, "draft token 5"),
    ],
)
def test_verify_rejects_bad_new_arguments(kernels, change, error, match):
    args = _args(**change)
    args["work"] = kernels.Workspace(5)
    with pytest.raises(error, match=match):
        kernels.verify(**args)


@pytest.mark.parametrize("verification", ["tokens", "Block", None, 1, "tree"])
def test_decoder_rejects_an_unknown_verification(backend, verification):
    with pytest.raises((ValueError, TypeError), match="verification.*'block'.*'token'"):
        specdec.SpeculativeDecoder(verification=verification, backend=backend)


def test_decoder_default_is_block_and_repr_says_so(backend):
    decoder = specdec.SpeculativeDecoder(backend=backend)
    assert decoder.verification == "block"
    assert "verification='block'" in repr(decoder)
    token = specdec.SpeculativeDecoder(verification="token", backend=backend)
    assert "verification='token'" in repr(token)
