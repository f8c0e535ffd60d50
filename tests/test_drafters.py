"""Tests of the drafters in specdec.drafters (pure Python: no backend fixture needed).

Each matching test is built so that the answer a wrong preference (a shorter n-gram,
an older occurrence) or an off-by-one would give differs from the right one.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.drafters import Drafter, NGram, PromptLookup
from specdec.toymodels import byte_corpus as byte_ngram

# derandomize: CI runs the same examples every time (SPECDEC_HYPOTHESIS_RANDOM=1
# explores new ones), as in test_kernels.py.
SETTINGS = {"deadline": None, "derandomize": not os.environ.get("SPECDEC_HYPOTHESIS_RANDOM")}


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _propose(drafter, values, max_tokens=16) -> list[int]:
    out = drafter.propose(_ids(values), max_tokens)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.ndim == 1
    assert out.size <= max_tokens
    return out.tolist()


def lookup_oracle(tokens, num_tokens, max_ngram_size, min_ngram_size, max_tokens):
    """The specification of PromptLookup, by brute force: (proposal, match size).

    The match size is the matched n-gram's length plus how many tokens before its
    earlier occurrence equal those before the sequence's trailing n-gram (at most
    PromptLookup.EVIDENCE_LIMIT in all).
    """
    tokens = list(tokens)
    length = len(tokens)
    if max_tokens == 0:
        return [], 0
    for n in range(min(max_ngram_size, length - 1), min_ngram_size - 1, -1):
        gram = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):  # latest first, not the trailing one
            if tokens[start : start + n] == gram:
                begin = start + n
                match = n
                while (
                    match < PromptLookup.EVIDENCE_LIMIT
                    and start - (match - n) > 0
                    and tokens[start - (match - n) - 1] == tokens[length - match - 1]
                ):
                    match += 1
                return tokens[begin : begin + min(num_tokens, max_tokens)], match
    return [], 0


# -- the interface --------------------------------------------------------------------


def test_drafter_is_abstract_and_defaults_are_no_ops():
    with pytest.raises(TypeError):
        Drafter()  # propose is abstract

    class Last(Drafter):
        def propose(self, tokens, max_tokens):
            return np.asarray(tokens[-1:][:max_tokens], dtype=np.int64)

    drafter = Last()
    assert drafter.start(_ids([1, 2])) is None
    assert drafter.extend(_ids([1, 2, 3]), 1) is None
    assert _propose(drafter, [1, 2, 3]) == [3]
    assert isinstance(PromptLookup(), Drafter)
    assert isinstance(NGram(), Drafter)


# -- PromptLookup: matching -----------------------------------------------------------

# The trailing 3-gram (1, 2, 3) occurs at 0 (followed by 10 11 5 2); the trailing
# 2-gram (2, 3) last occurs at 6 (followed by 30 31 3 20); the trailing 1-gram (3,)
# last occurs at 10 (followed by 20 21 1 2).  Each preference gives another answer.
LAYERED = [1, 2, 3, 10, 11, 5, 2, 3, 30, 31, 3, 20, 21, 1, 2, 3]


@pytest.mark.parametrize(
    ("max_ngram_size", "expected", "size"),
    [
        (3, [10, 11, 5, 2], 3),
        (2, [30, 31, 3, 20], 2),
        (1, [20, 21, 1, 2], 1),
        (5, [10, 11, 5, 2], 3),  # longer n-grams do not recur: the 3-gram still wins
    ],
)
def test_lookup_prefers_the_longest_ngram(max_ngram_size, expected, size):
    drafter = PromptLookup(num_tokens=4, max_ngram_size=max_ngram_size)
    assert _propose(drafter, LAYERED) == expected
    assert drafter.last_match_size == size
    assert lookup_oracle(LAYERED, 4, max_ngram_size, 1, 16) == (expected, size)


def test_lookup_takes_the_most_recent_occurrence():
    # (4, 5) occurs at 0 (followed by 6) and at 4 (followed by 7); an off-by-one in
    # the copy would start at 5 or 9 instead of 7.
    tokens = [4, 5, 6, 9, 4, 5, 7, 9, 4, 5]
    drafter = PromptLookup(num_tokens=3, max_ngram_size=2)
    assert _propose(drafter, tokens) == [7, 9, 4]
    # the 2-gram's occurrences are both preceded by 9: the context match is 3 long
    assert drafter.last_match_size == 3
    assert drafter.last_match_position == 4


def test_lookup_min_ngram_size_refuses_short_matches():
    tokens = [8, 1, 2, 9, 3, 1]  # only the 1-gram (1,) recurs
    assert _propose(PromptLookup(max_ngram_size=3, min_ngram_size=1), tokens) == [2, 9, 3, 1]
    drafter = PromptLookup(max_ngram_size=3, min_ngram_size=2)
    assert _propose(drafter, tokens) == []
    assert drafter.last_match_size == 0
    assert drafter.last_match_position == -1


def test_lookup_never_runs_past_the_end():
    # The match's continuation reaches the end of the sequence: only 2 tokens back it.
    assert _propose(PromptLookup(num_tokens=10), [1, 2, 1, 2, 1]) == [2, 1]
    # Overlapping occurrences: (5, 5, 5) at 0 is followed by a single token.
    drafter = PromptLookup(num_tokens=10)
    assert _propose(drafter, [5, 5, 5, 5]) == [5]
    assert drafter.last_match_size == 3


@pytest.mark.parametrize(
    ("tokens", "min_ngram_size", "expected"),
    [
        ([], 1, []),
        ([3], 1, []),  # no earlier position at all
        ([3, 4], 1, []),  # nothing recurs
        ([3, 3], 1, [3]),
        ([3, 3], 2, []),  # a 2-gram needs an earlier start: length >= 3
        ([3, 3, 3], 2, [3]),
    ],
)
def test_lookup_empty_and_short_contexts(tokens, min_ngram_size, expected):
    drafter = PromptLookup(max_ngram_size=3, min_ngram_size=min_ngram_size)
    drafter.start(_ids(tokens))
    assert _propose(drafter, tokens) == expected
    assert (
        _propose(PromptLookup(max_ngram_size=3, min_ngram_size=min_ngram_size), tokens) == expected
    )


def test_lookup_limits():
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert _propose(PromptLookup(num_tokens=10), tokens, max_tokens=3) == [3, 4, 5]
    assert _propose(PromptLookup(num_tokens=2), tokens, max_tokens=8) == [3, 4]
    drafter = PromptLookup()
    assert _propose(drafter, tokens, max_tokens=0) == []
    assert drafter.last_match_size == 0
    assert _propose(drafter, tokens, max_tokens=1) == [3]


def test_lookup_returns_a_copy():
    drafter = PromptLookup()
    tokens = [1, 2, 3, 1, 2]
    drafter.start(_ids(tokens[:3]))
    drafter.extend(_ids(tokens), 2)
    first = drafter.propose(_ids(tokens), 4)
    first[:] = -1
    assert _propose(drafter, tokens) == [3, 1, 2]


# -- PromptLookup: the incremental index ----------------------------------------------


def target_step(drafted: list, sequence: list, length: int) -> int:
    """Tokens the "target" appends after *drafted* at *length*: the agreeing drafts, one more.

    *sequence* is the target's output; the rejected drafts are never appended.
    """
    kept = 0
    while (
        kept < len(drafted)
        and length + kept < len(sequence)
        and drafted[kept] == sequence[length + kept]
    ):
        kept += 1
    return min(kept + 1, len(sequence) - length)


def _decode(drafter, sequence, prompt_length, rng, options, check_fresh=False):
    """Drive *drafter* as the decoder does over *sequence* (the "target's" output).

    Each step keeps the prefix of the proposal that agrees with *sequence*, then the
    target's token: the rejected drafts are never shown to ``extend``.  Every
    proposal is compared with the oracle.
    """
    drafter.start(_ids(sequence[:prompt_length]))
    length = prompt_length
    while length < len(sequence):
        tokens = _ids(sequence[:length])
        max_tokens = rng.randrange(0, 6)
        proposal = drafter.propose(tokens, max_tokens).tolist()
        assert (proposal, drafter.last_match_size) == lookup_oracle(
            sequence[:length], max_tokens=max_tokens, **options
        )
        if check_fresh:
            assert _propose(PromptLookup(**options), sequence[:length], max_tokens) == proposal
        n_new = target_step(proposal, sequence, length)
        length += n_new
        drafter.extend(_ids(sequence[:length]), n_new)
    return drafter


@pytest.mark.parametrize("seed", range(12))
def test_lookup_incremental_index_equals_the_scan(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 12])
    # Text with repeats: random tokens and copies of earlier spans.
    sequence = [rng.randrange(alphabet) for _ in range(5)]
    while len(sequence) < 160:
        if rng.random() < 0.5:
            start = rng.randrange(len(sequence))
            sequence += sequence[start : start + rng.randrange(1, 9)]
        else:
            sequence.append(rng.randrange(alphabet))
    max_ngram_size = rng.randrange(1, 5)
    options = {
        "num_tokens": rng.randrange(1, 8),
        "max_ngram_size": max_ngram_size,
        "min_ngram_size": rng.randrange(1, max_ngram_size + 1),
    }
    # Copies are not followed here (the plain rule at every step; see test_lookup_copies.py).
    drafter = _decode(
        PromptLookup(**options, copy_window=0),
        sequence,
        rng.randrange(0, 20),
        rng,
        options,
        check_fresh=seed < 3,
    )
    # The index built step by step is the one built from scratch.
    fresh = PromptLookup(**options)
    fresh.start(_ids(sequence))
    assert drafter._request.index == fresh._request.index


@settings(max_examples=200, **SETTINGS)
@given(
    st.lists(st.integers(0, 3), max_size=30),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(0, 8),
)
def test_lookup_matches_the_oracle(tokens, num_tokens, max_ngram_size, min_offset, max_tokens):
    min_ngram_size = max(1, max_ngram_size - min_offset)
    drafter = PromptLookup(num_tokens, max_ngram_size, min_ngram_size)
    expected = lookup_oracle(tokens, num_tokens, max_ngram_size, min_ngram_size, max_tokens)
    assert (_propose(drafter, tokens, max_tokens), drafter.last_match_size) == expected


def test_lookup_extend_after_rejected_drafts():
    drafter = PromptLookup(num_tokens=4)
    tokens = [1, 2, 3, 4, 1, 2]
    drafter.start(_ids(tokens))
    assert _propose(drafter, tokens) == [3, 4, 1, 2]
    # The target keeps 3, rejects 4 and emits 7: the decoder shows [3, 7] only.
    tokens += [3, 7]
    drafter.extend(_ids(tokens), 2)
    assert _propose(drafter, tokens) == []  # (7,) is new: nothing to copy
    tokens += [1]
    drafter.extend(_ids(tokens), 1)
    # (2, 3, 7, 1) follows the latest "1", at 4: the rejected 4 is nowhere.
    assert _propose(drafter, tokens) == [2, 3, 7, 1]
    tokens += [2, 3]
    drafter.extend(_ids(tokens), 2)
    # (1, 2, 3) last occurred at 4, followed by 7 (and not at 0, followed by 4).
    assert _propose(drafter, tokens) == [7, 1, 2, 3]
    assert drafter.last_match_size == 3


def test_lookup_without_start_or_on_another_sequence():
    drafter = PromptLookup(num_tokens=3)
    # No start: indexed lazily.
    assert _propose(drafter, [1, 2, 3, 1, 2]) == [3, 1, 2]
    # Grown without extend: the indexed sequence is a prefix, appended to.
    assert _propose(drafter, [1, 2, 3, 1, 2, 9, 1, 2]) == [9, 1, 2]
    # Same length, another tail: re-indexed.
    assert _propose(drafter, [1, 2, 3, 1, 2, 9, 4, 1]) == [2, 9, 4]
    # Shorter (rolled back): re-indexed.
    assert _propose(drafter, [5, 6, 5]) == [6, 5]
    # A different prefix of a longer sequence: re-indexed, not appended to.
    assert _propose(drafter, [7, 6, 5, 8, 5]) == [8, 5]
    # extend() without start() and with an inconsistent count still ends up right.
    other = PromptLookup(num_tokens=3)
    other.extend(_ids([4, 4, 1, 4]), 1)
    assert _propose(other, [4, 4, 1, 4]) == [1, 4]
    other.extend(_ids([9, 9, 9, 9, 9]), 1)
    assert _propose(other, [9, 9, 9, 9, 9]) == [9]


# -- PromptLookup: validation ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"num_tokens": 0}, ValueError, "num_tokens must be an int >= 1"),
        ({"num_tokens": 2.0}, TypeError, "num_tokens must be an int >= 1, got float"),
        ({"num_tokens": True}, TypeError, "num_tokens must be an int >= 1, got bool"),
        ({"max_ngram_size": 0}, ValueError, "max_ngram_size must be an int >= 1"),
        ({"max_ngram_size": "3"}, TypeError, "max_ngram_size must be an int >= 1, got str"),
        ({"min_ngram_size": 0}, ValueError, "min_ngram_size must be an int >= 1"),
        ({"min_ngram_size": None}, TypeError, "min_ngram_size must be an int >= 1"),
        ({"min_ngram_size": 4}, ValueError, r"min_ngram_size must be <= max_ngram_size \(3\)"),
    ],
)
def test_lookup_refuses_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        PromptLookup(**options)


def test_lookup_accepts_numpy_ints():
    drafter = PromptLookup(np.int32(2), np.int64(2), np.uint8(1))
    assert (drafter.num_tokens, drafter.max_ngram_size, drafter.min_ngram_size) == (2, 2, 1)
    assert type(drafter.num_tokens) is int
    assert _propose(drafter, [1, 2, 3, 1, 2], max_tokens=np.int64(5)) == [3, 1]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda d: d.propose(_ids([1, 1]), -1), ValueError, "max_tokens must be an int >= 0"),
        (lambda d: d.propose(_ids([1, 1]), 2.0), TypeError, "max_tokens must be an int >= 0"),
        (lambda d: d.propose(_ids([1, 1]), True), TypeError, "max_tokens .* got bool"),
        (lambda d: d.propose(np.ones((2, 2), np.int64), 2), ValueError, "one-dimensional"),
        (lambda d: d.propose(np.ones(3), 2), TypeError, "int token ids"),
        (lambda d: d.start(np.ones((1, 2), np.int64)), ValueError, "prompt must be one-dim"),
        (lambda d: d.extend(_ids([1, 2]), 3), ValueError, r"n_new must lie in \[0, len"),
        (lambda d: d.extend(_ids([1, 2]), -1), ValueError, "n_new"),
        (lambda d: d.extend(_ids([1, 2]), 1.0), TypeError, "n_new must be an int"),
    ],
)
def test_lookup_refuses_bad_calls(call, error, match):
    with pytest.raises(error, match=match):
        call(PromptLookup())


# -- NGram: proposals ------------------------------------------------------------------


def test_ngram_proposes_the_most_frequent_continuation():
    drafter = NGram(order=3, min_probability=0.3).fit([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]])
    # (1, 2) -> 3 three times in three; (2, 3) -> 4 two times in three; (3, 4) is
    # never continued.  Estimates: c / (t + 1).
    assert _propose(drafter, [9, 1, 2]) == [3, 4]
    assert drafter.last_probabilities == pytest.approx((3 / 4, 3 / 4 * 2 / 4))
    assert drafter.last_match_size == 2
    # Frequency, not recency: 7 followed (5, 6) twice, 8 once and last.
    drafter = NGram(order=3, min_probability=0).fit([[5, 6, 7], [5, 6, 7], [5, 6, 8]])
    assert _propose(drafter, [5, 6]) == [7]
    # A tie goes to the smaller id, whatever the order of the evidence.
    for data in ([[5, 9], [5, 8]], [[5, 8], [5, 9]]):
        assert _propose(NGram(order=2, min_probability=0).fit(data), [5]) == [8]


def test_ngram_backs_off_from_the_longest_context():
    # (3,) is followed by 30 most often, (2, 3) by 20, (1, 2, 3) only by 10.
    data = [[1, 2, 3, 10]] + [[7, 2, 3, 20]] * 2 + [[8, 8, 3, 30]] * 3
    drafter = NGram(order=4, num_tokens=1, min_probability=0).fit(data)
    assert _propose(drafter, [1, 2, 3]) == [10]
    assert drafter.last_match_size == 3
    assert _propose(drafter, [4, 2, 3]) == [20]
    assert drafter.last_match_size == 2
    assert _propose(drafter, [4, 4, 3]) == [30]
    assert drafter.last_match_size == 1
    assert _propose(drafter, [3]) == [30]  # a context shorter than order - 1
    assert _propose(drafter, [4, 4, 4]) == []
    assert drafter.last_match_size == 0
    # min_count: (1, 2, 3) was seen once, too rarely; (2, 3) three times.
    drafter = NGram(order=4, num_tokens=1, min_count=2, min_probability=0).fit(data)
    assert _propose(drafter, [1, 2, 3]) == [20]
    assert drafter.last_match_size == 2


def test_ngram_stops_on_weak_evidence():
    # Each step is estimated 7 / 11 likely: the product is 49 / 121 after two tokens.
    data = [[1, 2, 3]] * 7 + [[1, 9]] * 3 + [[2, 9]] * 3
    assert _propose(NGram(order=2, min_probability=0.5).fit(data), [1]) == [2]
    drafter = NGram(order=2, min_probability=0.4).fit(data)
    assert _propose(drafter, [1]) == [2, 3]
    assert drafter.last_probabilities == pytest.approx((7 / 11, 49 / 121))
    assert _propose(NGram(order=2, min_probability=0.65).fit(data), [1]) == []
    # One observation is a coin flip (1 / 2): at the default threshold (0.5) it is
    # proposed, since drafting stops only *below* the threshold.
    drafter = NGram(order=2)
    assert drafter.min_probability == 0.5
    assert _propose(drafter.fit([[1, 2]]), [1]) == [2]
    assert drafter.last_probabilities == (0.5,)
    # Two observations are 2 / 3.
    drafter = NGram(order=2, min_probability=0.55)
    assert _propose(drafter.fit([[1, 2]]), [1]) == []
    assert _propose(drafter.fit([[1, 2]]), [1]) == [2]
    # min_count: one observation is not enough evidence for min_count=2.
    drafter = NGram(order=2, min_count=2, min_probability=0)
    assert _propose(drafter.fit([[1, 2]]), [1]) == []
    assert _propose(drafter.fit([[1, 2]]), [1]) == [2]


def test_ngram_limits():
    drafter = NGram(order=2, num_tokens=3, min_probability=0).fit([list(range(10))])
    assert _propose(drafter, [0], max_tokens=8) == [1, 2, 3]
    assert _propose(drafter, [0], max_tokens=2) == [1, 2]
    assert _propose(drafter, [0], max_tokens=0) == []
    assert drafter.last_match_size == 0 and drafter.last_probabilities == ()
    assert _propose(drafter, []) == []
    assert _propose(NGram(), [1, 2, 3]) == []  # nothing learnt yet


def test_ngram_online_updates_change_the_proposal():
    drafter = NGram(order=3, min_probability=0).fit([[1, 2, 3]])
    assert _propose(drafter, [1, 2]) == [3]
    drafter.start(_ids([1, 2, 4, 1, 2, 4]))  # (1, 2) -> 4 twice now
    assert _propose(drafter, [1, 2], max_tokens=3) == [4, 1, 2]
    tokens = [1, 2, 4, 1, 2, 4, 7]
    drafter.extend(_ids(tokens), 1)
    assert _propose(drafter, [5, 7]) == []  # (7,) has not been followed yet
    tokens += [8, 7, 8]
    drafter.extend(_ids(tokens), 3)
    assert _propose(drafter, [5, 7], max_tokens=3) == [8, 7, 8]
    # online=False learns nothing from the sequences it serves.
    frozen = NGram(order=3, min_probability=0, online=False).fit([[1, 2, 3]])
    frozen.start(_ids([1, 2, 4, 1, 2, 4]))
    frozen.extend(_ids([1, 2, 4, 1, 2, 4, 1, 2, 4]), 3)
    assert _propose(frozen, [1, 2]) == [3]


@pytest.mark.parametrize("seed", range(6))
def test_ngram_online_counts_equal_fit(seed):
    # start + extend over the kept tokens count exactly the n-grams of the sequence:
    # none spans two sequences, none is counted twice, rejected drafts never count.
    rng = random.Random(seed)
    order = rng.randrange(2, 6)
    sequences = [[rng.randrange(4) for _ in range(rng.randrange(0, 60))] for _ in range(3)]
    online = NGram(order=order, min_probability=0)
    for sequence in sequences:
        prompt = rng.randrange(0, len(sequence) + 1)
        online.start(_ids(sequence[:prompt]))
        length = prompt
        while length < len(sequence):
            online.propose(_ids(sequence[:length]), 4)
            n_new = min(rng.randrange(1, 5), len(sequence) - length)
            length += n_new
            online.extend(_ids(sequence[:length]), n_new)
    batch = NGram(order=order, min_probability=0).fit(sequences)
    assert online._counts == batch._counts
    assert online._contexts == batch._contexts


def ngram_oracle(corpus, order, tokens, num_tokens, min_count, min_probability, max_tokens):
    """The specification of NGram.propose, by counting in the corpus afresh each time."""
    context, proposal, probability = list(tokens), [], 1.0
    while len(proposal) < min(num_tokens, max_tokens):
        for size in range(min(order - 1, len(context)), 0, -1):
            gram = context[len(context) - size :]
            followers = Counter(
                sequence[i + size]
                for sequence in corpus
                for i in range(len(sequence) - size)
                if sequence[i : i + size] == gram
            )
            total = sum(followers.values())
            if total >= min_count:
                break
        else:
            break
        best = min(followers, key=lambda token: (-followers[token], token))
        probability *= followers[best] / (total + 1)
        if probability < min_probability:
            break
        proposal.append(best)
        context.append(best)
    return proposal


@settings(max_examples=150, **SETTINGS)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=25), max_size=4),
    st.lists(st.integers(0, 3), max_size=5),
    st.integers(2, 5),
    st.integers(1, 6),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.1, 0.3, 0.5]),
    st.integers(0, 8),
)
def test_ngram_matches_the_oracle(
    corpus, tokens, order, num_tokens, min_count, min_probability, max_tokens
):
    drafter = NGram(
        order=order, num_tokens=num_tokens, min_count=min_count, min_probability=min_probability
    ).fit(corpus)
    expected = ngram_oracle(
        corpus, order, tokens, num_tokens, min_count, min_probability, max_tokens
    )
    assert _propose(drafter, tokens, max_tokens) == expected


def test_ngram_train_through_a_tokenizer():
    texts = ["hello world"] * 4 + ["help"]
    drafter = NGram.train(texts, byte_ngram.encode, order=4, min_probability=0.1, vocab_size=256)
    proposal = _propose(drafter, byte_ngram.encode("say hel"))
    assert byte_ngram.decode(proposal) == "lo world"  # "d" ends every text: no more
    assert drafter.last_probabilities == pytest.approx([4 / 6 * (4 / 5) ** k for k in range(8)])
    assert drafter.order == 4 and drafter.vocab_size == 256 and drafter.num_grams > 0


# -- NGram: vocabulary and input checks -------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda d: d.fit([[1, 10]]),
            ValueError,
            r"token_sequences\[0\] holds token id 10, outside \[0, vocab_size\) = \[0, 10\)",
        ),
        (lambda d: d.fit([[1, 2], [3, -1]]), ValueError, r"token_sequences\[1\] holds a negative"),
        (lambda d: d.fit([[1.0, 2.0]]), TypeError, "must hold int token ids"),
        (lambda d: d.fit([1, 2, 3]), TypeError, "wrap a single sequence in a list"),
        (lambda d: d.fit("123"), TypeError, "not a string"),
        (lambda d: d.fit([[[1, 2]]]), ValueError, "one-dimensional"),
        (lambda d: d.start(_ids([3, 12])), ValueError, "prompt holds token id 12"),
        (lambda d: d.start(_ids([3, -2])), ValueError, "prompt holds a negative token id"),
        (lambda d: d.extend(_ids([3, 11]), 1), ValueError, "tokens holds token id 11"),
        (lambda d: d.propose(_ids([3]), -1), ValueError, "max_tokens must be an int >= 0"),
        (lambda d: d.propose(_ids([3]), 1.5), TypeError, "max_tokens must be an int >= 0"),
        (lambda d: d.extend(_ids([3]), 2), ValueError, "n_new must lie in"),
    ],
)
def test_ngram_checks_ids_and_calls(call, error, match):
    drafter = NGram(order=3, vocab_size=10)
    with pytest.raises(error, match=match):
        call(drafter)
    assert drafter.num_grams == 0  # a refused call learnt nothing


def test_ngram_train_checks_its_inputs():
    with pytest.raises(TypeError, match="texts must be an iterable of str, not a single"):
        NGram.train("hello", byte_ngram.encode)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        NGram.train(["a", 3], byte_ngram.encode)
    with pytest.raises(TypeError, match="tokenize must be a callable"):
        NGram.train(["a"], "encode")
    with pytest.raises(ValueError, match=r"tokenize\(texts\[0\]\) holds token id 195"):
        NGram.train(["é"], byte_ngram.encode, vocab_size=128)
    with pytest.raises(ValueError, match="order must be an int >= 2"):
        NGram.train(["a"], byte_ngram.encode, order=1)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"order": 1}, ValueError, "order must be an int >= 2, got 1"),
        ({"order": 3.0}, TypeError, "order must be an int >= 2, got float"),
        ({"order": True}, TypeError, "order must be an int >= 2, got bool"),
        ({"num_tokens": 0}, ValueError, "num_tokens must be an int >= 1"),
        ({"min_count": 0}, ValueError, "min_count must be an int >= 1"),
        ({"min_count": "2"}, TypeError, "min_count must be an int >= 1"),
        ({"min_probability": 1.5}, ValueError, r"min_probability must be a number in \[0, 1\)"),
        ({"min_probability": 1.0}, ValueError, r"min_probability must be a number in \[0, 1\)"),
        ({"min_probability": -0.1}, ValueError, r"min_probability must be a number in \[0, 1\)"),
        ({"min_probability": float("nan")}, ValueError, "min_probability must be a number"),
        ({"min_probability": True}, TypeError, "min_probability must be a number .* got bool"),
        ({"min_probability": "0.5"}, TypeError, "min_probability must be a number"),
        ({"vocab_size": 0}, ValueError, "vocab_size must be an int >= 1"),
        ({"vocab_size": 2.5}, TypeError, "vocab_size must be an int >= 1"),
        ({"online": 1}, TypeError, "online must be True or False"),
    ],
)
def test_ngram_refuses_bad_options(options, error, match):
    with pytest.raises(error, match=match):
        NGram(**options)


# -- NGram: save and load ---------------------------------------------------------------


def _random_corpus(seed, count=40, alphabet=6):
    rng = random.Random(seed)
    return [[rng.randrange(alphabet) for _ in range(rng.randrange(0, 50))] for _ in range(count)]


def test_ngram_save_load_round_trip(tmp_path):
    drafter = NGram(
        order=4, num_tokens=6, min_count=2, min_probability=0.1, vocab_size=6, online=False
    ).fit(_random_corpus(0))
    path = tmp_path / "drafter.bin"  # the name is kept as given
    drafter.save(path)
    assert path.is_file() and not list(tmp_path.glob("*.npz")) and not list(tmp_path.glob("*.tmp"))
    loaded = NGram.load(path)
    assert repr(loaded) == repr(drafter)
    assert loaded._counts == drafter._counts and loaded._contexts == drafter._contexts
    rng = random.Random(1)
    for _ in range(300):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(0, 5))]
        assert _propose(loaded, tokens) == _propose(drafter, tokens)
        assert loaded.last_probabilities == drafter.last_probabilities
    # The same counts give the same file, whatever order they were learnt in.
    again = tmp_path / "again.npz"
    NGram(order=4, num_tokens=6, min_count=2, min_probability=0.1, vocab_size=6, online=False).fit(
        _random_corpus(0)[::-1]
    ).save(again)
    assert again.read_bytes() == path.read_bytes()
    # Saved options can be overridden on load, the ones the counts depend on cannot.
    assert NGram.load(path, min_probability=0.9).min_probability == 0.9
    with pytest.raises(TypeError, match="order and vocab_size come from the file"):
        NGram.load(path, order=3)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        NGram.load(path, num_tokens=0)
    # An empty drafter round-trips too.
    NGram(order=2).save(tmp_path / "empty")
    assert NGram.load(tmp_path / "empty").num_grams == 0


def _npz(path, **arrays):
    with open(path, "wb") as file:
        np.savez(file, **arrays)
    return path


def _valid_arrays(tmp_path):
    NGram(order=2, vocab_size=5).fit([[1, 2, 3]]).save(tmp_path / "ok")
    with np.load(tmp_path / "ok") as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": np.array("something else")}, "missing or wrong 'format' marker"),
        ({"version": np.int64(99)}, "version 99"),
        ({"order": np.int64(1)}, r"invalid options \(order must be an int >= 2"),
        ({"min_count": np.float64(0.5)}, r"missing or malformed option \(min_count is of dtype"),
        ({"counts_2": np.array([1, 0])}, "counts_2 holds a count below 1"),
        ({"grams_2": np.array([[1, 2], [2, 7]])}, r"grams_2 holds token id 7, outside"),
        ({"grams_2": np.array([[1, 2], [1, 2]])}, r"grams_2 holds \(1, 2\) twice"),
        ({"grams_2": np.array([1.0, 2.0])}, "grams_2 / counts_2 have shapes"),
        ({"grams_2": np.array([[1, 2, 3], [2, 3, 4]])}, "grams_2 / counts_2 have shapes"),
        ({"counts_2": None}, "missing grams_2 / counts_2"),
        ({"online": None}, "missing or malformed option"),
    ],
)
def test_ngram_load_refuses_a_bad_npz(tmp_path, change, match):
    arrays = _valid_arrays(tmp_path)
    for key, value in change.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="is not a specdec NGram drafter file: " + match):
        NGram.load(path)


def test_ngram_load_refuses_files_that_are_not_drafters(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("hello\n")
    array = tmp_path / "array.npy"
    np.save(array, np.arange(3))
    objects = _npz(tmp_path / "objects.npz", format=np.array([{"a": 1}], dtype=object))
    good = tmp_path / "good.npz"
    NGram(order=3).fit([[1, 2, 3, 4]]).save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:100])
    for path in (text, array, objects, truncated, tmp_path):
        with pytest.raises((ValueError, FileNotFoundError), match="NGram drafter file"):
            NGram.load(path)
    with pytest.raises(ValueError, match="not a specdec NGram drafter file"):
        NGram.load(text)
    with pytest.raises(FileNotFoundError):
        NGram.load(tmp_path / "missing.npz")
