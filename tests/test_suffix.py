"""SuffixDrafter: its tries count what they should, it drafts what it should, its memory
is bounded, and in the decoder greedy decoding stays the target's argmax decoding.

The law tests (exact joint law, both backends and verification schemes) run it in
tests/test_decoder_drafting.py.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec import SpeculativeDecoder
from specdec.drafters import SuffixDrafter
from specdec.drafters._trie import ROOT, SuffixTrie


def dump(trie: SuffixTrie) -> dict:
    """Every indexed substring -> (count, continuations, best child's token)."""
    out, stack = {}, [(ROOT, ())]
    while stack:
        node, path = stack.pop()
        for token, child in (trie.children[node] or {}).items():
            sub = (*path, token)
            best = trie.best[child]
            out[sub] = (trie.count[child], trie.cont[child], trie.token[best] if best >= 0 else -1)
            stack.append((child, sub))
    return out


def brute_counts(sequences, depth: int) -> collections.Counter:
    counts = collections.Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                counts[tuple(seq[i:j])] += 1
    return counts


# --- the trie ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_trie_counts_every_substring_and_its_continuations(seed):
    rng = np.random.default_rng(seed)
    sequences = [rng.integers(0, 4, rng.integers(1, 40)).tolist() for _ in range(4)]
    trie = SuffixTrie(5)
    for seq in sequences:
        trie.add(seq)
    counts = brute_counts(sequences, 5)
    table = dump(trie)
    assert {sub: c for sub, (c, _, _) in table.items()} == dict(counts)
    for sub, (_, cont, best) in table.items():
        children = {s[-1]: c for s, c in counts.items() if len(s) == len(sub) + 1 and s[:-1] == sub}
        assert cont == sum(children.values())
        if children:
            assert children[best] == max(children.values())


@pytest.mark.parametrize("seed", range(5))
def test_removing_a_sequence_leaves_the_trie_of_the_others(seed):
    """Eviction is exact: counts, continuations and most frequent children (ties: the one
    reinforced last) are those of a trie that never held the removed sequence."""
    rng = np.random.default_rng(100 + seed)
    a, b, c = (rng.integers(0, 3, rng.integers(5, 30)).tolist() for _ in range(3))
    trie = SuffixTrie(4)
    trie.add(a)
    trie.add(b)
    trie.add(c)
    trie.remove(a)
    fresh = SuffixTrie(4)
    fresh.add(b)
    fresh.add(c)
    dumped, expected = dump(trie), dump(fresh)
    assert {k: v[:2] for k, v in dumped.items()} == {k: v[:2] for k, v in expected.items()}
    assert trie.n_nodes == fresh.n_nodes
    # the most frequent child is most frequent (ties may differ in recency after removal)
    for sub, (_, cont, best) in dumped.items():
        if cont:
            assert dumped[(*sub, best)][0] == max(
                v[0] for k, v in dumped.items() if len(k) == len(sub) + 1 and k[:-1] == sub
            )
    trie.remove(b)
    trie.remove(c)
    assert trie.n_nodes == 1 and trie.children[ROOT] is None
    trie.add(a)  # freed nodes are reused
    assert dump(trie) == dump_of(a, 4)


def dump_of(seq, depth):
    trie = SuffixTrie(depth)
    trie.add(seq)
    return dump(trie)


# --- proposals ---------------------------------------------------------------------------


def test_most_frequent_continuation_wins_over_the_latest():
    # "1 2" is followed by 3 twice, then by 4 once (the latest): propose 3
    tokens = np.array([7, 1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 4, 6, 1, 2])
    drafter = SuffixDrafter(max_spec_factor=1.0)
    drafter.start(tokens)
    # then "2 3" went on with 8 and 9 once each: the tie goes to the latest, 9
    assert drafter.propose(tokens, 8).tolist() == [3, 9]
    assert drafter.last_match_size == 2 and drafter.last_tree == "local"
    assert drafter.last_probabilities == pytest.approx([2 / 3, 1 / 3])


def test_draft_grows_with_the_match_and_stops_at_min_probability():
    base = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    tokens = np.array(base + [0] + base[:3])
    drafter = SuffixDrafter(max_spec_factor=1.0)
    assert drafter.propose(tokens, 16).tolist() == [13, 14, 15]  # a 3-token match: 3 tokens
    assert drafter.last_match_size == 3
    assert SuffixDrafter(max_spec_factor=2.0).propose(tokens, 16).tolist() == base[3:9]
    assert SuffixDrafter(max_spec_factor=0.0, max_spec_offset=2.0).propose(tokens, 16).tolist() == [
        13,
        14,
    ]
    assert (
        SuffixDrafter(max_spec_factor=3.0, num_tokens=4).propose(tokens, 16).tolist() == base[3:7]
    )
    assert SuffixDrafter(max_spec_factor=3.0).propose(tokens, 2).tolist() == [13, 14]
    # after "7": 8 once, 9 once: each continuation has probability 1/2, then 1/2 * 1 ...
    split = np.array([3, 7, 8, 5, 4, 7, 9, 5, 6, 7])
    assert SuffixDrafter(1, min_probability=0.6).propose(split, 8).tolist() == []
    assert SuffixDrafter(1, min_probability=0.5).propose(split, 8).tolist() == [9]  # the latest


def test_earlier_outputs_are_drafted_from_in_later_requests():
    drafter = SuffixDrafter(max_spec_factor=1.0)
    output = [40, 41, 42, 43, 44, 45, 46, 47]
    drafter.start(np.array([1, 2, 3]))
    drafter.extend(np.array([1, 2, 3, *output]), len(output))
    assert drafter.cached_requests == 0  # an output joins the global tree at the next start
    drafter.start(np.array([5, 6, 40, 41, 42]))
    assert drafter.cached_requests == 1 and drafter.cached_tokens == len(output)
    assert drafter.propose(np.array([5, 6, 40, 41, 42]), 16).tolist() == [43, 44, 45]
    assert drafter.last_tree == "global"
    drafter.reset()
    assert drafter.cached_requests == 0
    assert drafter.propose(np.array([5, 6, 40, 41, 42]), 16).tolist() == []


@pytest.mark.parametrize("bound", ["requests", "tokens"])
def test_global_tree_evicts_the_oldest_outputs_first(bound):
    kwargs = {"max_cached_requests": 2} if bound == "requests" else {"max_cached_tokens": 12}
    drafter = SuffixDrafter(max_spec_factor=1.0, **kwargs)
    outputs = [[100 * r + i for i in range(6)] for r in range(4)]
    for output in outputs:
        drafter.start(np.array([1]))
        drafter.extend(np.array([1, *output]), len(output))
    drafter.start(np.array([1]))
    assert drafter.cached_requests == 2 and drafter.cached_tokens == 12
    for r, output in enumerate(outputs):
        proposal = drafter.propose(np.array([*output[:3]]), 16).tolist()
        assert proposal == (output[3:6] if r >= 2 else []), r
    assert drafter._global.n_nodes == 1 + 2 * sum(range(1, 7))  # the two outputs' substrings


def test_propose_without_start_and_after_a_different_sequence():
    drafter = SuffixDrafter(max_spec_factor=1.0)
    a = np.array([1, 2, 3, 9, 1, 2])
    assert drafter.propose(a, 4).tolist() == [3, 9]
    b = np.array([5, 6, 7, 5, 6])  # not an extension of a: re-indexed
    assert drafter.propose(b, 4).tolist() == [7, 5]
    assert drafter.propose(np.array([5, 6, 7, 5, 6, 7, 5]), 4).tolist() == [6, 7, 5]  # appended


def test_a_sequence_other_than_the_started_one_is_not_cached_as_output():
    drafter = SuffixDrafter(max_spec_factor=1.0)
    drafter.start(np.array([1, 2, 3]))
    drafter.propose(np.array([50, 60, 70, 80, 90, 100, 110]), 4)  # not the started request
    drafter.start(np.array([9]))
    assert drafter.cached_requests == 0 and drafter.cached_tokens == 0
    assert drafter.propose(np.array([9, 80]), 4).tolist() == []


@pytest.mark.parametrize("call", ["extend", "propose"])
def test_negative_ids_are_refused_by_name_and_leave_the_sequence_as_it_was(call):
    drafter = SuffixDrafter(max_spec_factor=1.0)
    drafter.start(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"tokens holds a negative token id \(-7\)"):
        if call == "extend":
            drafter.extend(np.array([1, 2, 3, -7]), 1)
        else:
            drafter.propose(np.array([1, 2, 3, -7, 1, 2]), 4)
    fresh = SuffixDrafter(max_spec_factor=1.0)
    fresh.start(np.array([1, 2, 3]))
    after = np.array([1, 2, 3, 1, 2])
    assert drafter.propose(after, 4).tolist() == fresh.propose(after, 4).tolist() == [3, 1]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_tokens": 0}, ValueError, "num_tokens"),
        ({"max_depth": 1}, ValueError, "max_depth"),
        ({"max_depth": 10**6}, ValueError, "max_depth"),
        ({"max_spec_factor": -1.0}, ValueError, "max_spec_factor"),
        ({"max_spec_offset": float("nan")}, TypeError, "max_spec_offset"),
        ({"min_probability": 1.5}, ValueError, "min_probability"),
        ({"max_cached_requests": -1}, ValueError, "max_cached_requests"),
        ({"max_cached_tokens": 2.0}, TypeError, "max_cached_tokens"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SuffixDrafter(**kwargs)


# --- in the decoder ------------------------------------------------------------------------


def test_greedy_with_the_suffix_drafter_is_the_targets_argmax_over_requests(backend):
    """Several requests through one decoder and one drafter (global tree, policy kept):
    every output is the target's greedy decoding, and later requests draft from the
    earlier outputs."""
    target = ContextModel(6, seed=31, dtype=np.float32)
    drafter = SuffixDrafter()
    decoder = specdec.SpeculativeDecoder(temperature=0.0, backend=backend)
    kept = []
    for prompt in ([1, 2], [3, 4], [1, 2], [5, 1, 2]):
        expected, _ = specdec.sample(target, prompt, 40, temperature=0.0, backend=backend)
        ids, stats = decoder.generate(drafter, target, prompt, 40)
        assert ids == expected
        kept.append(stats.total_draft_tokens_accepted)
    assert drafter.cached_requests == 3
    assert kept[2] > 0  # the third request repeats the first: drafted from its output


# -- SuffixDrafter: every parameter has a range that works ------------------------------


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"max_spec_factor": 1e308}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": 1025}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": -1}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": float("inf")}, TypeError, "max_spec_factor"),
        ({"max_spec_factor": "2"}, TypeError, "max_spec_factor"),
        ({"max_spec_offset": 1e308}, ValueError, "max_spec_offset"),
        ({"max_spec_offset": -1e308}, ValueError, "max_spec_offset"),
        ({"max_spec_offset": float("nan")}, TypeError, "max_spec_offset"),
        ({"num_tokens": 10**30}, ValueError, "num_tokens"),
        ({"num_tokens": 1025}, ValueError, "num_tokens"),
        ({"num_tokens": 2.0}, TypeError, "num_tokens"),
        ({"max_depth": 10**30}, ValueError, "max_depth"),
        ({"max_cached_requests": 10**30}, ValueError, "max_cached_requests"),
        ({"max_cached_tokens": 10**30}, ValueError, "max_cached_tokens"),
        ({"max_cached_tokens": -1}, ValueError, "max_cached_tokens"),
        ({"max_indexed_tokens": 10**30}, ValueError, "max_indexed_tokens"),
        ({"max_indexed_tokens": 47}, ValueError, "max_indexed_tokens"),  # < 2 * max_depth
        ({"max_indexed_tokens": None}, TypeError, "max_indexed_tokens"),
        ({"min_probability": 1.5}, ValueError, "min_probability"),
    ],
)
def test_suffix_parameters_out_of_range_are_refused(kwargs, error, name):
    with pytest.raises(error, match=name):
        SuffixDrafter(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_spec_factor": 1024.0, "max_spec_offset": 1024.0},  # the largest accepted
        {"max_spec_factor": 0.0, "max_spec_offset": 3.0},
        {"max_spec_factor": 1.0, "max_spec_offset": -1024.0},  # never drafts: fine
        {"num_tokens": 1024, "max_depth": 256, "min_probability": 0.0},
        {"max_cached_requests": 0, "max_cached_tokens": 0, "max_indexed_tokens": 48},
    ],
)
def test_suffix_parameters_at_their_bounds_work_in_the_decoder(backend, kwargs):
    target = ContextModel(6, seed=31, dtype=np.float32)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    expected, _ = specdec.sample(target, prompt, 30, temperature=0.0, backend=backend)
    drafter = SuffixDrafter(**kwargs)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    for _ in range(2):
        assert decoder.generate(drafter, target, prompt, 30)[0] == expected
    drafter.propose_candidates(np.array(prompt), 16, 4)  # the tree's walk too


# -- SuffixDrafter: bounded memory per request ----------------------------------------------


def test_a_long_prompt_is_indexed_from_its_last_tokens():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50_000, size=20_000)
    drafter = SuffixDrafter(max_depth=8, max_indexed_tokens=1_000)
    drafter.start(prompt)
    assert drafter.indexed_tokens == 500  # the last max_indexed_tokens // 2
    request = drafter._request()
    assert request.local.n_nodes <= 1 + 500 * 8
    # a repeat of the recent text is drafted from; one of the forgotten start is not
    recent = np.concatenate([prompt, prompt[-300:-290]])
    proposal = drafter.propose(recent, 8).tolist()
    assert proposal and proposal == prompt[-290 : -290 + len(proposal)].tolist()
    early = np.concatenate([prompt, prompt[100:110]])
    assert drafter.propose(early, 8).tolist() == []  # forgotten: ids of 50,000 never recur


def test_decoding_past_the_bound_stays_exact_and_bounded(backend):
    target = ContextModel(6, seed=31, dtype=np.float32)
    prompt = np.tile([1, 2, 3, 4, 5], 30).tolist()
    expected, _ = specdec.sample(target, prompt, 200, temperature=0.0, backend=backend)
    drafter = SuffixDrafter(max_depth=8, max_indexed_tokens=64)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    ids, stats = decoder.generate(drafter, target, prompt, 200)
    assert ids == expected
    assert drafter.indexed_tokens <= 64
    assert drafter._request().local.n_nodes <= 1 + 64 * 8
    assert stats.total_draft_tokens_accepted > 0
