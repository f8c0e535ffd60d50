"""temperature=0 is exact greedy decoding: the target's own argmax, token for token.

The reference is ``argmax_decode`` below: a plain loop over the target's
``forward`` that appends the lowest id among the maxima of the last row.  The toy
models have integer logits, so about half of their rows hold a tied maximum, and
-inf masks.  Three drafts are used:

* an independent integer model with a different mask (many rejections);
* the *tie adversary*: the target's logits plus ``0.25 * id / V``, which picks the
  target's argmax except at a tie, where it proposes the highest tied id -- which
  must be rejected and replaced by the lowest;
* the target itself (every draft kept).

Greedy decoding must draw no random number: the Generator passed as ``rng=`` (or
as the decoder's ``seed``) and NumPy's global state are unchanged afterwards.

Both verification schemes are run: under greedy decoding they make the same
decisions.

The comparison can fail: ``test_comparison_detects_a_wrong_greedy_sampler``
shows that a decoder whose verify keeps every draft disagrees with the argmax loop.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec._backend import kernels_for

VOCAB = 6
TARGET_MASKED = (4,)
DRAFT_MASKED = (1,)
PROMPTS = [[0], [3], [5, 2], [1, 1], [2, 0, 3], [0, 5, 5, 1], [3, 2], [5]]
MAX_NEW = (1, 2, 3, 5, 7, 15)
EOS = 2


def argmax_decode(model, prompt, max_new_tokens, eos_token_id=None):
    """The target's greedy decoding: the lowest id among the maxima, one token at a time."""
    sequence = list(prompt)
    for _ in range(max_new_tokens):
        row = np.asarray(model.forward(np.asarray([sequence], dtype=np.int64)))[0, -1]
        best = max(row)
        token = min(i for i in range(len(row)) if row[i] == best)
        sequence.append(token)
        if token == eos_token_id:
            break
    return sequence


class TieAdversary:
    """The target's logits plus 0.25 * id / V: same argmax, except that ties go to
    the highest id (integer logits differ by >= 1, so no other order changes)."""

    def __init__(self, target, dtype):
        self.target = target
        self.vocab_size = target.vocab_size
        self.bias = (0.25 * np.arange(self.vocab_size) / self.vocab_size).astype(dtype)
        self.dtype = dtype

    def forward(self, ids):
        return (self.target.forward(ids).astype(self.dtype) + self.bias).astype(self.dtype)


def make_models(target_dtype, draft_dtype):
    target = ContextModel(
        VOCAB, seed=7, scale=1.0, integer=True, masked=TARGET_MASKED, dtype=target_dtype
    )
    drafts = {
        "independent": ContextModel(
            VOCAB, seed=8, scale=1.0, integer=True, masked=DRAFT_MASKED, dtype=draft_dtype
        ),
        "tie_adversary": TieAdversary(target, draft_dtype),
        "target_itself": target,
    }
    return target, drafts


DTYPES = [(np.float64, np.float32), (np.float32, np.float64)]


def _tied_rows_on_path(model, sequence, prompt_len):
    """Rows of the decoded path (predicting each new token) whose maximum is tied."""
    logits = np.asarray(model.forward(np.asarray([sequence], dtype=np.int64)))[0]
    rows = logits[prompt_len - 1 : len(sequence) - 1]
    return int(sum((row == row.max()).sum() > 1 for row in rows))


@pytest.mark.install  # greedy identity, fast: also run by .ci/run's install stages
@pytest.mark.parametrize("verification", ["block", "token"])
@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5, 6])
def test_greedy_equals_argmax_decoding(backend, gamma, verification):
    rng = np.random.default_rng(2024)
    rng_state = copy.deepcopy(rng.bit_generator.state)
    global_state = np.random.get_state()
    tied = early_eos = draft_masked_kept = 0
    adversary_discarded = 0
    for target_dtype, draft_dtype in DTYPES:
        target, drafts = make_models(target_dtype, draft_dtype)
        decoder = specdec.SpeculativeDecoder(
            gamma=gamma, temperature=0.0, verification=verification, backend=backend
        )
        for name, draft in drafts.items():
            for prompt in PROMPTS:
                for max_new in MAX_NEW:
                    for eos in (None, EOS):
                        expected = argmax_decode(target, prompt, max_new, eos)
                        ids, stats = decoder.generate(draft, target, prompt, max_new, eos, rng=rng)
                        assert ids == expected, (name, prompt, max_new, eos, gamma)
                        assert stats.total_tokens_generated == len(ids) - len(prompt)
                        if name == "target_itself":
                            assert (
                                stats.total_draft_tokens_accepted
                                == stats.total_draft_tokens_proposed
                            )
                        if name == "tie_adversary":
                            adversary_discarded += (
                                stats.total_draft_tokens_proposed
                                - stats.total_draft_tokens_accepted
                            )
                        if name == "independent":  # argmax tokens this draft cannot propose
                            draft_masked_kept += sum(t in DRAFT_MASKED for t in ids[len(prompt) :])
                        if eos is not None and len(ids) - len(prompt) < max_new:
                            early_eos += 1
                        assert all(t not in TARGET_MASKED for t in ids[len(prompt) :])
                        tied += _tied_rows_on_path(target, ids, len(prompt))
    # The scenario exercised what it claims: ties at the maximum on the decoded paths,
    # drafts rejected because of a tie, EOS ending runs early, and argmax tokens
    # that the draft masks (-inf).
    print(
        f"gamma={gamma}: tied rows {tied}, adversary drafts discarded {adversary_discarded}, "
        f"early EOS {early_eos}, draft-masked tokens output {draft_masked_kept}"
    )
    assert tied > 50 and adversary_discarded > 10 and early_eos > 10 and draft_masked_kept > 10
    # No random number was drawn.
    assert rng.bit_generator.state == rng_state
    after = np.random.get_state()
    assert after[0] == global_state[0] and np.array_equal(after[1], global_state[1])
    assert after[2:] == global_state[2:]


def test_greedy_with_decoder_seed_draws_nothing(backend):
    """The generator given as the decoder's ``seed`` is not advanced either."""
    generator = np.random.default_rng(5)
    state = copy.deepcopy(generator.bit_generator.state)
    target, drafts = make_models(np.float32, np.float32)
    decoder = specdec.SpeculativeDecoder(gamma=3, temperature=0, seed=generator, backend=backend)
    for prompt in PROMPTS:
        ids, _ = decoder.generate(drafts["tie_adversary"], target, prompt, 12, EOS)
        assert ids == argmax_decode(target, prompt, 12, EOS)
    assert generator.bit_generator.state == state


def test_greedy_ignores_the_other_controls(backend):
    """The argmax survives any top-k / top-p / min-p, so greedy output is unchanged."""
    target, drafts = make_models(np.float64, np.float64)
    decoder = specdec.SpeculativeDecoder(
        gamma=4, temperature=0.0, top_k=2, top_p=0.3, min_p=0.5, backend=backend
    )
    for prompt in PROMPTS:
        ids, _ = decoder.generate(
            drafts["independent"], target, prompt, 10, rng=np.random.default_rng(0)
        )
        assert ids == argmax_decode(target, prompt, 10)


@pytest.mark.install  # greedy identity, fast: also run by .ci/run's install stages
@pytest.mark.parametrize("target_dtype", [np.float32, np.float64])
def test_sample_greedy_equals_argmax_decoding(backend, target_dtype):
    target, _ = make_models(target_dtype, target_dtype)
    rng = np.random.default_rng(11)
    state = copy.deepcopy(rng.bit_generator.state)
    for prompt in PROMPTS:
        for max_new in MAX_NEW:
            for eos in (None, EOS):
                ids, stats = specdec.sample(
                    target, prompt, max_new, eos, temperature=0.0, rng=rng, backend=backend
                )
                assert ids == argmax_decode(target, prompt, max_new, eos)
                assert stats.num_target_forward_passes == len(ids) - len(prompt)
    assert rng.bit_generator.state == state


def test_tie_adversary_differs_from_target_only_at_ties():
    """Sanity of the fixture: the adversary's argmax is the target's except at a tie,
    where it is the highest tied id."""
    target, drafts = make_models(np.float64, np.float64)
    adversary = drafts["tie_adversary"]
    ids = np.asarray([[0, 3, 5, 2, 2, 1, 0, 4, 5, 3, 3, 1]])
    t_rows, a_rows = target.forward(ids)[0], adversary.forward(ids)[0]
    for t_row, a_row in zip(t_rows, a_rows, strict=False):
        maxima = np.flatnonzero(t_row == t_row.max())
        assert int(np.argmax(a_row)) == maxima[-1]


def test_comparison_detects_a_wrong_greedy_sampler(backend, monkeypatch):
    """A test must be able to fail: a verify that keeps every draft (here the tie
    adversary's highest tied ids) is caught by the same comparison."""
    kernels = kernels_for(backend)
    real_verify = kernels.verify

    def keep_every_draft(
        target_rows, draft_tokens, draft_weights, draft_laws, bonus, *rest, **options
    ):
        n = len(draft_tokens)
        if not bonus:
            return n, -1
        _, token = real_verify(
            target_rows[n:], draft_tokens[:0], None, None, True, *rest, **options
        )
        return n, token

    monkeypatch.setattr(kernels, "verify", keep_every_draft)
    target, drafts = make_models(np.float64, np.float32)
    decoder = specdec.SpeculativeDecoder(gamma=3, temperature=0.0, backend=backend)
    mismatches = sum(
        decoder.generate(drafts["tie_adversary"], target, prompt, 10, rng=0)[0]
        != argmax_decode(target, prompt, 10)
        for prompt in PROMPTS
    )
    assert mismatches >= len(PROMPTS) // 2
