"""The drafters' option and id checks (``specdec.drafters._checks``): bounded, named.

Regression tests of issue 16: options bounded so that memory stays linear, ids beyond
int64 refused by name.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from specdec.drafters import Chain, NGram, PromptLookup, SuffixDrafter

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
    # Random text (no n-gram repeats) is the worst case.  Eight times the text costs
    # about nine times the memory (8.9x and 9.6x; dictionaries grow by steps), a
    # quadratic cost would be 64 times; the bound sits between, far from both, because
    # tracemalloc also counts what other threads allocate meanwhile (under xdist a
    # doubling once measured 3.0x where 2.1x is usual).
    ids = np.random.default_rng(0).integers(0, 50_000, 4800)
    small = _peak_bytes(lambda: index(ids[:600]))
    large = _peak_bytes(lambda: index(ids))
    assert large < 24 * small


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


# -- the calls' own arguments, named -----------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: PromptLookup().propose([1, [2]], 3), TypeError, "tokens must be a sequence"),
        (lambda: SuffixDrafter().propose([[1, 2], [3]], 3), TypeError, "tokens must be a seq"),
        (lambda: NGram(3).fit([[1, [2, 3]]]), TypeError, r"token_sequences\[0\] must be a"),
        (lambda: NGram(3).fit(5), TypeError, "token_sequences must be an iterable"),
        (lambda: NGram(3).fit([5]), TypeError, r"token_sequences\[0\] is not a sequence"),
        (lambda: Chain(PromptLookup()).propose(np.array([1, 2, 1]), -1), ValueError, "max_tok"),
        (lambda: Chain(PromptLookup()).propose(np.array([1, 2, 1]), "3"), TypeError, "max_tok"),
        (
            lambda: Chain(PromptLookup()).propose_candidates(np.array([1, 2, 1]), -2, 3),
            ValueError,
            "max_tokens",
        ),
        (
            lambda: Chain(PromptLookup()).propose_candidates(np.array([1, 2, 1]), 3, 0),
            ValueError,
            "max_candidates must be an int >= 1",
        ),
        (  # the default propose_candidates of Drafter
            lambda: NGram(3).fit([[1, 2, 3, 1, 2, 3]]).propose_candidates(np.array([1, 2]), 3, -5),
            ValueError,
            "max_candidates must be an int >= 1",
        ),
        (
            lambda: NGram(3).fit([[1, 2, 3]]).propose_candidates(np.array([1, 2]), 3, "two"),
            TypeError,
            "max_candidates",
        ),
    ],
)
def test_malformed_arguments_of_the_drafters_calls_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
