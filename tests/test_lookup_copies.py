"""PromptLookup's copy following: a copy goes on from its source, a broken one resumes.

The drafter learns in ``extend`` which of its proposed tokens the sequence took.  The
tests below drive it as the decoder does (propose, then extend by the tokens kept and
one more) over texts that copy a passage with edits, and compare every proposal and
its evidence with :func:`copy_oracle`, a restatement of the docstring's rules over the
whole history; ``copy_window=0`` must give the plain oracle of ``test_drafters.py``.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from test_drafters import lookup_oracle, target_step

from specdec.drafters import PromptLookup

LIMIT = PromptLookup.EVIDENCE_LIMIT
RESUMABLE = PromptLookup.RESUMABLE_EVIDENCE


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _latest_match(tokens: list, max_ngram_size: int, min_ngram_size: int):
    """``(begin, n, match size)`` of the plain rule (latest occurrence), or None."""
    length = len(tokens)
    for n in range(min(max_ngram_size, length - 1), min_ngram_size - 1, -1):
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[length - n :]:
                match = n
                while (
                    match < LIMIT
                    and start - (match - n) > 0
                    and tokens[start - (match - n) - 1] == tokens[length - match - 1]
                ):
                    match += 1
                return start + n, n, match
    return None


class CopyOracle:
    """The copy-following rules of PromptLookup's docstring, restated by brute force.

    ``copy`` is (source end, sequence end, evidence, run) of the last run of proposed
    tokens the sequence took (run: how many tokens before the ends agree since the
    last edit); ``proposed`` the last proposal (begin, length, evidence, run,
    resumed).
    """

    def __init__(self, num_tokens, max_ngram_size, min_ngram_size, copy_window):
        self.num_tokens, self.window = num_tokens, copy_window
        self.sizes = (max_ngram_size, min_ngram_size)
        self.copy = self.proposed = None
        self.rule = None  # the last proposal's: "followed", "resumed" or "plain"

    def propose(self, tokens: list, max_tokens: int) -> tuple:
        self.proposed = self.rule = None
        length = len(tokens)
        top = min(self.sizes[0], length - 1)
        if max_tokens == 0 or top < self.sizes[1]:
            return [], 0
        begin = None
        if self.copy is not None and self.copy[1] == length and self.copy[2] >= RESUMABLE:
            source_end, _, evidence, run = self.copy
            n = min(top, run)
            if (
                source_end < length
                and n >= self.sizes[1]
                and tokens[source_end - n : source_end] == tokens[length - n :]
            ):
                begin, match, resumed = source_end, evidence, False
                self.rule = "followed"
        if begin is None:
            found = _latest_match(tokens, *self.sizes)
            if found is None:
                return [], 0
            begin, _, match = found
            run, resumed, self.rule = match, False, "plain"
            if self.copy is not None:
                source_end, sequence_end, evidence, _ = self.copy
                since = length - sequence_end
                if (
                    evidence >= RESUMABLE
                    and run < since <= self.window
                    and abs((begin - source_end) - since) <= self.window
                ):
                    match, resumed = min(match + evidence, LIMIT), True
                    self.rule = "resumed"
        self.proposed = (begin, length, match, run, resumed)
        return tokens[begin : min(begin + self.num_tokens, begin + max_tokens, length)], match

    def extend(self, tokens: list, n_new: int) -> None:
        if n_new == 0:
            return
        proposed, self.proposed = self.proposed, None
        old = len(tokens) - n_new
        if proposed is None or proposed[1] != old or not self.window:
            return
        begin, _, evidence, run, resumed = proposed
        taken = 0
        while (
            taken < n_new and begin + taken < old and tokens[begin + taken] == tokens[old + taken]
        ):
            taken += 1
        if taken:
            if resumed and taken < n_new:
                evidence = run
            evidence = min(evidence + taken, LIMIT)
            still = (
                self.copy is not None
                and self.copy[2] >= RESUMABLE
                and old + taken - self.copy[1] <= self.window
            )
            if resumed or evidence >= RESUMABLE or not still:
                self.copy = (begin + taken, old + taken, evidence, run + taken)
        elif resumed:
            self.copy = None


def _edited_copy(rng: random.Random, alphabet: int, passage_length: int, total: int):
    """``(sequence, prompt length)``: a passage, then a text copying it with edits."""
    passage = [rng.randrange(alphabet) for _ in range(passage_length)]
    text = list(passage)
    position = 0
    while len(text) < total:
        action = rng.random()
        if action < 0.7:  # copy a stretch of the passage
            stretch = passage[position : position + rng.randrange(3, 20)]
            text += stretch
            position += len(stretch)
        elif action < 0.8:  # replace a few tokens
            text += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 3))]
            position += rng.randrange(1, 3)
        elif action < 0.9:  # insert a few
            text += [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
        else:  # skip a few
            position += rng.randrange(1, 5)
        if position >= passage_length:
            position = rng.randrange(passage_length // 2)
    return text[:total], passage_length


def _check_grounded(drafter, tokens, proposal, max_tokens, sizes) -> None:
    """What any proposal must be, whatever the rules: what follows an n-gram match."""
    plain = lookup_oracle(tokens, 16, *sizes, max_tokens)[0]
    assert bool(proposal) == bool(plain)  # copies change what, never whether
    if proposal:
        n, start = drafter._request.matched_n, drafter.last_match_position
        assert sizes[1] <= n <= sizes[0] and drafter.last_match_size >= n
        assert tokens[start : start + n] == tokens[len(tokens) - n :]
        assert proposal == tokens[start + n : start + n + len(proposal)]


def _decode(drafter, oracle, sequence: list, prompt_length: int, rng: random.Random) -> dict:
    """Drive drafter and oracle as the decoder does; every proposal must agree."""
    drafter.start(_ids(sequence[:prompt_length]))
    length = prompt_length
    seen = {"followed": 0, "resumed": 0, "plain": 0, None: 0}
    while length < len(sequence):
        tokens = sequence[:length]
        max_tokens = rng.randrange(0, 12)
        proposal = drafter.propose(_ids(tokens), max_tokens).tolist()
        expected = oracle.propose(tokens, max_tokens)
        assert (proposal, drafter.last_match_size) == expected, length
        _check_grounded(drafter, tokens, proposal, max_tokens, oracle.sizes)
        seen[oracle.rule] += 1
        # the target keeps the agreeing prefix of what the decoder drafted, then one token
        drafted = proposal[: rng.randrange(0, len(proposal) + 1)]
        n_new = target_step(drafted, sequence, length)
        length += n_new
        drafter.extend(_ids(sequence[:length]), n_new)
        oracle.extend(sequence[:length], n_new)
    return seen


def _decode_seed(seed: int) -> dict:
    rng = random.Random(seed)
    alphabet = rng.choice([6, 20, 200])
    sequence, prompt_length = _edited_copy(rng, alphabet, rng.randrange(30, 80), 260)
    max_ngram_size = rng.randrange(1, 5)
    options = {
        "num_tokens": rng.randrange(1, 17),
        "max_ngram_size": max_ngram_size,
        "min_ngram_size": rng.randrange(1, max_ngram_size + 1),
        "copy_window": rng.choice([2, 4, 8, 12]),
    }
    return _decode(PromptLookup(**options), CopyOracle(**options), sequence, prompt_length, rng)


@pytest.mark.parametrize("seed", range(16))
def test_copy_following_matches_the_oracle(seed):
    _decode_seed(seed)


def test_the_texts_exercise_every_rule():
    # else the oracle tests could not fail on a rule
    seen = Counter()
    for seed in range(16):
        seen.update(_decode_seed(seed))
    assert min(seen["followed"], seen["resumed"], seen["plain"]) >= 10, seen


@pytest.mark.parametrize("seed", range(4))
def test_copy_window_zero_is_the_plain_rule(seed):
    rng = random.Random(100 + seed)
    sequence, prompt_length = _edited_copy(rng, 200, 50, 200)
    options = {"num_tokens": 8, "max_ngram_size": 3, "min_ngram_size": 1, "copy_window": 0}
    drafter = PromptLookup(**options)
    drafter.start(_ids(sequence[:prompt_length]))
    plain = {k: v for k, v in options.items() if k != "copy_window"}
    for length in range(prompt_length, len(sequence)):
        proposal = drafter.propose(_ids(sequence[:length]), 8).tolist()
        assert (proposal, drafter.last_match_size) == lookup_oracle(
            sequence[:length], max_tokens=8, **plain
        )
        drafter.extend(_ids(sequence[: length + 1]), 1)


PASSAGE = list(range(100, 130))  # 30 distinct tokens


def _copying(drafter, prompt, copied) -> None:
    """The decoder's calls while the sequence takes *copied* one token a step."""
    drafter.start(_ids(prompt))
    tokens = list(prompt)
    for token in copied:
        drafter.propose(_ids(tokens), 16)
        tokens.append(token)
        drafter.extend(_ids(tokens), 1)
    return tokens


def test_a_copy_goes_on_from_its_source_not_from_a_repeated_phrase():
    # The passage says "7 8 9" twice, followed by 1 then by 2.  Its copy reaches the
    # second "7 8 9": the latest occurrence is the copy's own first one (followed by
    # 1), the copy's source is followed by 2.
    passage = [50, 51, 52, 53, 54, 55, 56, 57, 7, 8, 9, 1, 58, 59, 7, 8, 9, 2, 60, 61]
    prompt = [*passage, 0]
    copied = passage[:17]  # up to and including the second "7 8 9"
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, copied)
    assert drafter.propose(_ids(tokens), 3).tolist() == [2, 60, 61]
    assert drafter.last_match_size >= RESUMABLE
    plain = PromptLookup(copy_window=0)
    _copying(plain, prompt, copied)
    assert plain.propose(_ids(tokens), 3).tolist() == [1, 58, 59]


def test_a_broken_copy_resumes_with_its_evidence():
    prompt = [*PASSAGE, 0]
    # copy 12 tokens, write 99 for the passage's 112, go on copying from 113
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 113])
    assert drafter.propose(_ids(tokens), 4).tolist() == [114, 115, 116, 117]
    # the one-token match "113" plus the copy's 12 tokens (and its first match)
    assert drafter.last_match_size > 12
    plain = PromptLookup(copy_window=0)
    _copying(plain, prompt, [*PASSAGE[:12], 99, 113])
    assert plain.propose(_ids(tokens), 4).tolist() == [114, 115, 116, 117]
    assert plain.last_match_size == 1


@pytest.mark.parametrize(
    ("edit", "window", "resumed"),
    [
        ([99], 8, True),  # one token replaced: the match comes 2 tokens after the break
        ([99, 98, 97], 8, True),  # two more inserted: 4 tokens after it, 2 off alignment
        ([99], 2, True),
        ([99, 98], 2, False),  # 3 tokens after the break: beyond a window of 2
        ([], 0, False),  # a window of 0 follows no copy
    ],
)
def test_resumption_respects_the_window(edit, window, resumed):
    prompt = [*PASSAGE, 0]
    copied = [*PASSAGE[:12], *edit, 113] if edit else [*PASSAGE[:12], 99, 113]
    drafter = PromptLookup(copy_window=window)
    tokens = _copying(drafter, prompt, copied)
    drafter.propose(_ids(tokens), 4)
    assert (drafter.last_match_size > 12) is resumed


def test_a_short_copy_is_not_resumed():
    prompt = [*PASSAGE, 0]
    copied = [*PASSAGE[: RESUMABLE - 3], 99, PASSAGE[RESUMABLE - 2]]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, copied)
    drafter.propose(_ids(tokens), 4)
    assert drafter.last_match_size == 1


def test_one_resumption_per_break():
    prompt = [*PASSAGE, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 113])
    assert drafter.propose(_ids(tokens), 4).tolist() == [114, 115, 116, 117]
    assert drafter.last_match_size > 12
    # the sequence does not take it (writes 98), then matches the passage again nearby
    tokens += [98]
    drafter.extend(_ids(tokens), 1)
    tokens += [115]
    drafter.propose(_ids(tokens[:-1]), 4)
    drafter.extend(_ids(tokens), 1)
    drafter.propose(_ids(tokens), 4)
    assert drafter.last_match_size == 1  # the copy was forgotten


def test_copy_window_is_checked_and_shown():
    assert "copy_window=8" in repr(PromptLookup())
    with pytest.raises(ValueError, match="copy_window must be an int >= 0"):
        PromptLookup(copy_window=-1)
    with pytest.raises(TypeError, match="copy_window must be an int >= 0, got float"):
        PromptLookup(copy_window=2.0)


def test_a_resumption_broken_again_at_once_keeps_its_own_evidence():
    prompt = [*PASSAGE, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 113])
    assert drafter.propose(_ids(tokens), 4).tolist() == [114, 115, 116, 117]
    assert drafter.last_match_size > 12
    # the step keeps 114 and writes 98 for 115: the copy now rests on "113 114" alone
    tokens += [114, 98]
    drafter.extend(_ids(tokens), 2)
    drafter.propose(_ids(tokens), 4)
    tokens += [116]
    drafter.extend(_ids(tokens), 1)
    drafter.propose(_ids(tokens), 4)
    assert drafter.last_match_size == 1  # not resumed: a copy of 2 is too short


def test_a_resumed_copy_is_followed_on_the_next_steps():
    # after the resumption, the copy runs unbroken over "113 114" only: it is followed
    # on that, with its evidence, even with longer n-grams than that run
    prompt = [*PASSAGE, 0]
    for max_ngram_size in (3, 4, 6):
        drafter = PromptLookup(max_ngram_size=max_ngram_size)
        tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 113, 114])
        assert drafter.propose(_ids(tokens), 3).tolist() == [115, 116, 117]
        assert drafter.last_match_size > 12, max_ngram_size


def test_a_match_over_the_supposed_break_is_not_resumed():
    # a step the drafter was not asked about (another drafter of a chain proposed):
    # the copy looks broken, but the next match reaches back over it and counts it
    prompt = [*PASSAGE, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, PASSAGE[:12])
    tokens.append(PASSAGE[12])
    drafter.extend(_ids(tokens), 1)  # no propose before this step
    drafter.propose(_ids(tokens), 4)
    assert drafter.last_match_size == 13  # the 13 copied tokens, not 13 + 12


def test_extend_by_nothing_keeps_the_copy():
    prompt = [*PASSAGE, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 113])
    drafter.propose(_ids(tokens), 4)
    drafter.extend(_ids(tokens), 0)
    assert drafter.propose(_ids(tokens), 4).tolist() == [114, 115, 116, 117]
    assert drafter.last_match_size > 12


def test_a_chance_agreement_does_not_replace_a_resumable_copy():
    # after the break the text writes 99 200, and "200" once followed 99 in the
    # prompt: a one-token agreement, taken; the copy of 12 is still resumed after it
    prompt = [*PASSAGE, 0, 99, 200, 7, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, [*PASSAGE[:12], 99, 200, 114])
    assert drafter.propose(_ids(tokens), 2).tolist() == [115, 116]
    assert drafter.last_match_size > 12


def test_candidates_after_a_followed_copy_include_the_latest_occurrence():
    # as in the repeated-phrase test, with the phrase once more after the passage
    passage = [50, 51, 52, 53, 54, 55, 56, 57, 7, 8, 9, 1, 58, 59, 7, 8, 9, 2, 60, 61]
    prompt = [*passage, 0, 70, 7, 8, 9, 3, 71, 72, 0]
    drafter = PromptLookup()
    tokens = _copying(drafter, prompt, passage[:17])
    candidates = [c.tolist() for c in drafter.propose_candidates(_ids(tokens), 3, 4)]
    assert candidates[0] == [2, 60, 61]  # the copy's source
    assert [1, 58, 59] in candidates and [3, 71, 72] in candidates
