"""Bad input that used to escape as a deep traceback, unbounded memory or threads.

Each test is a regression test of one case of issue 16 ("Bad input that still
escapes"): it failed before the fix.  Behavioural cases run on both backends.
"""

from __future__ import annotations

import os
import threading
import tracemalloc

import numpy as np
import pytest
from toymodels import ContextModel

from specdec import SpeculativeDecoder
from specdec.drafters import Chain, Drafter, DraftLengthPolicy, NGram, PromptLookup
from specdec.engine import verify_batch

# -- verify_batch: threads and lengths (items 3 and 9) ---------------------------------------


def _one_hot_batch(batch, width=2, vocab=5):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(batch, width))
    target = rng.standard_normal((batch, width + 1, vocab))
    return ids, target


def test_verify_batch_caps_threads_at_the_cores(backend):
    ids, target = _one_hot_batch(64)
    result = verify_batch(
        ids, None, target, np.full(64, 2), temperature=0, n_threads=10**9, backend=backend
    )
    assert result.n_accepted.shape == (64,)
    pool = [t for t in threading.enumerate() if t.name.startswith("specdec-engine")]
    assert len(pool) <= max((os.cpu_count() or 1) - 1, 1)


def test_verify_batch_float_lengths_say_integers(backend):
    ids, target = _one_hot_batch(3)
    with pytest.raises(TypeError, match=r"lengths must hold integers \(draft lengths\), got dtype"):
        verify_batch(ids, None, target, [1.0, 2.0, 0.0], temperature=0, backend=backend)
    with pytest.raises(ValueError, match="lengths holds 18446744073709551615, beyond"):
        verify_batch(
            ids,
            None,
            target,
            np.array([1, 2, 2**64 - 1], np.uint64),
            temperature=0,
            backend=backend,
        )


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


def test_a_chain_names_its_drafter_returning_none():
    with pytest.raises(TypeError, match=r"drafter _Fixed \(Chain source 1\): propose\(\) returned"):
        Chain(_Fixed(np.zeros(0, np.int64)), _Fixed(None)).propose(np.arange(4), 3)


# -- drafters: bounded options and ids (items 1 and 4) ----------------------------------------


@pytest.mark.parametrize("size", [65, 10**6])
def test_lookup_ngram_size_is_bounded(size):
    with pytest.raises(
        ValueError, match=r"max_ngram_size must be an int <= 64 \(the supported maximum\), got"
    ):
        PromptLookup(max_ngram_size=size)
    assert PromptLookup(max_ngram_size=64, min_ngram_size=64).max_ngram_size == 64


@pytest.mark.parametrize("order", [33, 10**6])
def test_ngram_order_is_bounded(order):
    with pytest.raises(
        ValueError, match=r"order must be an int <= 32 \(the supported maximum\), got"
    ):
        NGram(order=order)
    assert NGram(order=32).order == 32


def _peak_bytes(function):
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "index",
    [
        lambda ids: PromptLookup(max_ngram_size=64).start(ids),
        lambda ids: NGram(order=32).fit([ids]),
    ],
)
def test_the_largest_options_cost_linear_memory(index):
    # Random text (no n-gram repeats) is the worst case.  Doubling it about doubles
    # memory (a quadratic cost would quadruple it; dictionaries grow by steps).
    ids = np.random.default_rng(0).integers(0, 50_000, 1200)
    small = _peak_bytes(lambda: index(ids[:600]))
    large = _peak_bytes(lambda: index(ids))
    assert large < 3 * small


def test_uint64_ids_beyond_int64_are_refused_by_name():
    ids = np.array([1, 2**63], np.uint64)
    with pytest.raises(
        ValueError, match=r"token_sequences\[0\] holds token id 9223372036854775808"
    ):
        NGram().fit([ids])
    with pytest.raises(ValueError, match="tokens holds token id 9223372036854775808, beyond"):
        NGram().fit([[1, 2, 3]]).propose(ids, 3)
    with pytest.raises(ValueError, match="prompt holds token id 9223372036854775808, beyond"):
        PromptLookup().start(ids)
