"""The decoder loop's checks (``specdec._loop``): misbehaving drafters, policies, draft models.

Each names the culprit instead of escaping as a deep traceback (issue 16; each failed
before its fix).  Behavioural cases run on both backends.
"""

from __future__ import annotations

import numpy as np
import pytest
from law_models import ContextModel

from specdec import SpeculativeDecoder
from specdec.drafters import Chain, Drafter, DraftLengthPolicy

# -- the decoder: misbehaving drafters, policies and draft models (items 4-7) ----------------


class _Fixed(Drafter):
    """Proposes what it is told to on its first ``times`` steps, then nothing."""

    def __init__(self, proposal, times=10**9):
        self.proposal = proposal
        self.times = times

    def propose(self, tokens, max_tokens):
        if self.times <= 0:
            return np.zeros(0, dtype=np.int64)
        self.times -= 1
        proposal = self.proposal
        return proposal() if callable(proposal) else proposal


def _generate(backend, draft, target=None, policy="fixed", **options):
    target = ContextModel(vocab_size=5, seed=1) if target is None else target
    decoder = SpeculativeDecoder(gamma=4, temperature=0, draft_length=policy, backend=backend)
    return decoder.generate(draft, target, [1, 2, 3, 1, 2], max_new_tokens=8, **options)


@pytest.mark.parametrize(
    ("proposal", "what"),
    [
        (None, "NoneType"),
        (np.int64(3), "int64"),
        (lambda: (i for i in (1, 2)), "generator"),
        (3, "int"),
    ],
)
def test_a_drafter_returning_a_non_sequence_is_named(backend, proposal, what):
    with pytest.raises(TypeError, match=rf"drafter _Fixed: propose\(\) returned a {what}"):
        _generate(backend, _Fixed(proposal))


def test_a_drafter_proposing_a_uint64_beyond_int64_is_named(backend):
    drafter = _Fixed(np.array([2**64 - 1], np.uint64))
    with pytest.raises(ValueError, match="drafter _Fixed proposed token id 18446744073709551615"):
        _generate(backend, drafter)


class _Says(DraftLengthPolicy):
    """A user policy that answers ``length()`` with whatever it is told to."""

    def __init__(self, answer):
        self.answer = answer

    def length(self, source, offered):
        return self.answer(offered) if callable(self.answer) else self.answer


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (lambda offered: offered + 1, "5"),
        (-1, "-1"),
        (1.5, "1.5"),
        (None, "None"),
        (np.float64(2.0), r"np\.float64\(2\.0\)"),
        (True, "True"),
    ],
)
@pytest.mark.parametrize("source", ["drafter", "model"])
def test_a_policy_answer_outside_the_offer_is_named(backend, answer, shown, source):
    draft = _Fixed(np.array([1, 2, 3, 4])) if source == "drafter" else ContextModel(5, seed=2)
    with pytest.raises(
        ValueError if shown in ("5", "-1") else TypeError,
        match=rf"draft-length policy _Says\.length\(\) returned {shown}.*an int in \[0, 4\]",
    ):
        _generate(backend, draft, policy=_Says(answer))


def test_a_chained_draft_model_with_another_vocabulary_is_named(backend):
    # The drafter proposes first, so the target's vocabulary is known (and its kernel
    # workspace made) before the draft model is ever called; the draft model declares
    # no vocabulary (a plain callable).
    wide = ContextModel(vocab_size=7, seed=3)
    chain = Chain(_Fixed(np.array([1, 2]), times=1), lambda ids: wide.forward(ids))
    with pytest.raises(
        ValueError, match="disagree on the vocabulary: the draft has 7 tokens, the target 5"
    ):
        _generate(backend, chain)


@pytest.mark.parametrize("draft_vocab", [3, 7])
def test_a_draft_model_sampled_first_with_another_vocabulary_is_named(backend, draft_vocab):
    # No drafter proposes on the first step, so the draft model runs before the target;
    # the target declares its vocabulary, the draft model (a plain callable) does not.
    # Its first row is checked against the target's before a token is drawn from it.
    other = ContextModel(vocab_size=draft_vocab, seed=3)
    chain = Chain(_Fixed(np.zeros(0, np.int64)), lambda ids: other.forward(ids))
    target = ContextModel(5, seed=0)
    with pytest.raises(
        ValueError,
        match=f"disagree on the vocabulary: the draft has {draft_vocab} tokens, the target 5",
    ):
        decoder = SpeculativeDecoder(3, draft_length="fixed", backend=backend)
        decoder.generate(chain, target, [0, 1, 2], 5, rng=0)
    assert target.calls == 0


def test_a_chain_names_its_drafter_returning_none():
    with pytest.raises(TypeError, match=r"drafter _Fixed \(Chain source 1\): propose\(\) returned"):
        Chain(_Fixed(np.zeros(0, np.int64)), _Fixed(None)).propose(np.arange(4), 3)


def test_a_drafter_proposing_a_ragged_list_is_named(backend):
    with pytest.raises(TypeError, match=r"drafter _Fixed proposed list that is not an array"):
        _generate(backend, _Fixed([[1], [2, 3]]))
