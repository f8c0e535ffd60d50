"""Trees of drafts in the decoder: candidates, the policy's selection, the exact law.

A drafter with several candidates (``propose_candidates``) and a target that scores a
tree in one call (``forward_tree``) make the decoder verify a tree of one-hot drafts
with ``verify_tree``.  These tests check, on both backends:

* the output law is the target's exactly, by enumeration and the pooled chi-square of
  test_decoder_law.py, under several sampling controls, with trees of several shapes
  (the drafter's candidates depend on the context, some likely, some impossible);
* the same statistic rejects a decoder whose tree verifier is wrong (it draws the
  next token from p after rejections instead of from p without the rejected tokens):
  ``test_power_rejects_a_tree_verifier_that_forgets_rejections``;
* greedy decoding equals the target's argmax decoding;
* trees are really verified (the target's ``forward_tree`` is called and steps keep
  alternatives), and without ``forward_tree`` the decoder verifies chains only, with
  the same output for the same seed as before trees existed;
* the stream equals ``generate``; a user policy's bad selection is a clear error;
* the drafters' candidates and the policy's selection rule.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from law_models import ContextModel, enumerate_joint_law, new_tokens, pooled_chisquare

import specdec
from specdec._verifier import Verifier
from specdec.drafters import Drafter, PositionalDraftLength, PromptLookup, SuffixDrafter
from specdec.drafters.cost import CostCurve
from specdec.drafters.tree import DraftTree
from specdec.models._tree_scoring import node_paths

N_RUNS = 4_000
ALPHA = 1e-3
POWER_ALPHA = 1e-6
VOCAB = 5
PROMPT = [1, 3]
N_TOKENS = 4


class TreeModel(ContextModel):
    """A ``ContextModel`` that scores trees (exactly: each branch as a sequence)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tree_calls = 0

    def forward_tree(self, prefix_ids, token_ids, parents):
        """Row 0 after the prefix, row i + 1 after node i: each branch as a sequence."""
        self.tree_calls += 1
        prefix = np.asarray(prefix_ids).reshape(-1).tolist()
        paths = node_paths(parents)
        rows = [self.forward(np.array([prefix]))[0, -1]]
        for path in paths:
            branch = prefix + [int(token_ids[i]) for i in path]
            rows.append(self.forward(np.array([branch]))[0, -1])
        return np.array(rows)


class Branching(Drafter):
    """Context-dependent candidates: after token t, up to three continuations.

    ``[(2t) % V, (2t + 1) % V]``, ``[(t + 1) % V, t]``, ``[(3t) % V]``: likely and
    unlikely tokens, shared first tokens (merged) and distinct ones, and no proposal
    after token 0.
    """

    def propose(self, tokens, max_tokens):
        found = self.propose_candidates(tokens, max_tokens, 1)
        return found[0] if found else np.zeros(0, dtype=np.int64)

    def propose_candidates(self, tokens, max_tokens, max_candidates):
        t = int(tokens[-1])
        if t == 0 or max_tokens == 0:
            return []
        options = [[(2 * t) % VOCAB, (2 * t + 1) % VOCAB], [(t + 1) % VOCAB, t], [(3 * t) % VOCAB]]
        return [np.array(c[:max_tokens], dtype=np.int64) for c in options[:max_candidates]]


def cheap_policy():
    """Verifying is nearly free: the policy selects trees with alternatives (the best
    rate itself: near ties would keep to the shorter chain)."""
    return PositionalDraftLength(
        target_cost=[1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06], tie_tolerance=0.0
    )


def target_model(dtype=np.float64):
    return TreeModel(VOCAB, seed=11, dtype=dtype)


def outcomes(decoder, make_drafter, target, seed, n_runs=N_RUNS):
    rng = np.random.default_rng(seed)
    counts = collections.Counter()
    for _ in range(n_runs):
        ids, _ = decoder.generate(make_drafter(), target, PROMPT, N_TOKENS, rng=rng)
        counts[new_tokens(ids, PROMPT, N_TOKENS)] += 1
    return counts


CONTROLS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.2, "top_p": 0.8, "min_p": 0.05},
]


@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: "-".join(map(str, c.values())))
def test_trees_of_drafts_keep_the_targets_law(backend, controls):
    target = target_model(np.float32)
    decoder = specdec.SpeculativeDecoder(
        6, draft_length=cheap_policy(), backend=backend, **controls
    )
    counts = outcomes(decoder, Branching, target, seed=31)
    assert target.tree_calls > N_RUNS  # trees were verified, in most runs
    result = pooled_chisquare(counts, enumerate_joint_law(target, PROMPT, N_TOKENS, **controls))
    assert result.impossible == 0, f"{result.impossible} outcomes of probability 0"
    assert result.pvalue > ALPHA, f"joint law differs from the target's: {result}"


@pytest.mark.parametrize("make_drafter", [PromptLookup, SuffixDrafter], ids=["lookup", "suffix"])
def test_the_real_drafters_trees_keep_the_law(backend, make_drafter):
    # A prompt with several occurrences of each n-gram, so that the drafters have
    # several candidates; the suffix drafter also learns from the earlier runs.
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 0, 3, 1]
    target = target_model()
    decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
    rng = np.random.default_rng(7)
    counts = collections.Counter()
    drafter = make_drafter()
    for _ in range(N_RUNS):
        ids, _ = decoder.generate(drafter, target, prompt, 3, rng=rng)
        counts[new_tokens(ids, prompt, 3)] += 1
    # trees in more than an eighth of the runs (672-872 of 4,000 measured: a drafter
    # drafts one token short of the limit, so only the first passes of 3 tokens have
    # room for a tree)
    assert target.tree_calls > N_RUNS // 8
    result = pooled_chisquare(counts, enumerate_joint_law(target, prompt, 3))
    assert result.impossible == 0 and result.pvalue > ALPHA, result


class _ForgetfulVerifier(Verifier):
    """Wrong on purpose: after rejected children, draws from p, not p without them."""

    def verify_tree(self, target_rows, draft, *, controls, rng, workspace, name_row):
        path, token = super().verify_tree(
            target_rows, draft, controls=controls, rng=rng, workspace=workspace, name_row=name_row
        )
        node = int(path[-1]) if len(path) else -1
        if np.any(draft.parents == node):  # children were rejected: redraw from p itself
            row = np.asarray(target_rows[node + 1], dtype=np.float64) / controls.temperature
            p = np.exp(row - row.max())
            token = int(rng.choice(len(p), p=p / p.sum()))
        return path, token


def test_power_rejects_a_tree_verifier_that_forgets_rejections(backend):
    target = target_model(np.float32)
    decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
    decoder._verifier = _ForgetfulVerifier(backend)
    counts = outcomes(decoder, Branching, target, seed=31)
    result = pooled_chisquare(counts, enumerate_joint_law(target, PROMPT, N_TOKENS))
    assert result.pvalue < POWER_ALPHA, f"the statistic missed a wrong verifier: {result}"


def test_greedy_trees_equal_argmax_decoding(backend):
    target = target_model()
    for prompt in ([1, 3], [2, 2, 4], [4, 1]):
        plain, _ = specdec.sample(target, prompt, 24, temperature=0.0, backend=backend)
        decoder = specdec.SpeculativeDecoder(
            6, temperature=0.0, draft_length=cheap_policy(), backend=backend
        )
        for drafter in (Branching(), PromptLookup(), SuffixDrafter()):
            ids, stats = decoder.generate(drafter, target, prompt, 24)
            assert ids == plain, type(drafter).__name__
    assert target.tree_calls > 0


def test_trees_keep_alternatives_and_count_them(backend):
    target = target_model()
    decoder = specdec.SpeculativeDecoder(
        6, temperature=0.0, draft_length=cheap_policy(), backend=backend
    )
    ids, stats = decoder.generate(Branching(), target, [2], 40)
    assert target.tree_calls > 0
    # nodes verified are counted as drafts, kept nodes as kept drafts
    assert stats.total_draft_tokens_proposed >= stats.total_draft_tokens_accepted > 0
    assert sum(stats.accepted_length_histogram) == stats.num_target_forward_passes
    assert stats.total_tokens_generated == len(ids) - 1


def test_the_targets_tree_cost_curve_decides_whether_trees_pay(backend):
    # The default policy reads the target's curves: trees priced as chains are
    # verified; trees that cost a token more than a chain of as many are not.
    flat = [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06]
    runs = {}
    for premium in (0.0, 1.0):
        target = target_model()
        target.cost_curve = flat
        target.tree_cost_curve = [1.0] + [v + premium for v in flat[1:]]
        decoder = specdec.SpeculativeDecoder(6, temperature=0.0, backend=backend)
        ids, stats = decoder.generate(Branching(), target, [2], 40)
        runs[premium] = target.tree_calls, stats.total_draft_tokens_proposed
        assert ids == specdec.sample(target, [2], 40, temperature=0.0, backend=backend)[0]
    assert runs[0.0][0] > 0  # trees priced as chains: verified
    assert runs[1.0][0] == 0 and runs[1.0][1] > 0  # dear trees: chains only, still drafting


def test_without_forward_tree_the_decoder_verifies_chains(backend):
    class ChainOnly(ContextModel):
        pass

    tree, chain = target_model(), ChainOnly(VOCAB, seed=11)
    decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
    ids_chain, _ = decoder.generate(Branching(), chain, PROMPT, 30, rng=3)
    decoder = specdec.SpeculativeDecoder(6, draft_length="fixed", backend=backend)
    ids_fixed, _ = decoder.generate(Branching(), tree, PROMPT, 30, rng=3)
    assert tree.tree_calls == 0  # a fixed length never builds trees
    assert len(ids_chain) == len(ids_fixed) == len(PROMPT) + 30


def test_stream_equals_generate_with_trees(backend):
    target = target_model()
    for seed in range(5):
        decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
        ids, _ = decoder.generate(Branching(), target, PROMPT, 25, 4, rng=seed)
        decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
        pieces = list(decoder.stream(Branching(), target, PROMPT, 25, 4, rng=seed))
        assert np.concatenate(pieces).tolist() == ids[len(PROMPT) :]


def test_both_backends_make_the_same_tree_decisions():
    if "cython" not in specdec.available_backends():
        pytest.skip("no compiled core in a pure-Python install")
    target = target_model()
    results = []
    for backend in ("cython", "python"):
        decoder = specdec.SpeculativeDecoder(6, draft_length=cheap_policy(), backend=backend)
        results.append(decoder.generate(Branching(), target, PROMPT, 40, rng=5)[0])
    assert results[0] == results[1]


class _Selects(PositionalDraftLength):
    def __init__(self, answer):
        super().__init__(target_cost=[1.0, 1.01, 1.02])
        self.answer = answer

    def select_tree(self, key, tree):
        return self.answer(tree)


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (lambda tree: np.ones(len(tree), int), TypeError, "expected a boolean mask"),
        (lambda tree: np.ones(len(tree) + 1, bool), TypeError, "expected a boolean mask"),
        (lambda tree: tree.parents >= 0, ValueError, "a node without its parent"),
    ],
)
def test_a_bad_tree_selection_is_named(backend, answer, error, match):
    decoder = specdec.SpeculativeDecoder(6, draft_length=_Selects(answer), backend=backend)
    with pytest.raises(error, match=rf"policy _Selects\.select_tree\(\).*{match}"):
        decoder.generate(Branching(), target_model(), PROMPT, 8, rng=0)


def test_a_selection_of_more_nodes_than_allowed_is_named(backend):
    decoder = specdec.SpeculativeDecoder(
        1, draft_length=_Selects(lambda tree: np.ones(len(tree), bool)), backend=backend
    )
    with pytest.raises(ValueError, match=r"select_tree\(\) selected \d+ nodes, more than 1"):
        decoder.generate(Branching(), target_model(), PROMPT, 8, rng=0)


@pytest.mark.parametrize("width", [0, 2.5, "3"])
def test_a_bad_tree_width_is_refused_before_the_decoder_forgets_anything(backend, width):
    def histograms(decoder):
        _, stats = decoder.generate(PromptLookup(), target_model(), PROMPT * 4, 40, rng=5)
        return stats.draft_length_histogram, stats.accepted_length_histogram

    kept = specdec.SpeculativeDecoder(temperature=0.0, backend=backend)
    refused = specdec.SpeculativeDecoder(temperature=0.0, backend=backend)
    first = histograms(kept)
    assert histograms(refused) == first  # the same policy, learnt alike
    bad = target_model()
    bad.tree_width = width
    with pytest.raises(ValueError, match="target_model.tree_width must be an int >= 1, got"):
        refused.generate(SuffixDrafter(), bad, PROMPT * 4, 40, rng=5)  # another drafter
    # what the refused call's decoder learnt is still there: both go on alike
    assert histograms(refused) == histograms(kept)


def test_a_sampled_tree_of_more_nodes_than_gamma_is_named(backend):
    # A draft model's tree (gamma 2 deep, the target's width of siblings per depth)
    # holds more nodes than gamma: the policy may select at most gamma of them.
    decoder = specdec.SpeculativeDecoder(
        2, draft_length=_Selects(lambda tree: np.ones(len(tree), bool)), backend=backend
    )
    with pytest.raises(ValueError, match=r"select_tree\(\) selected \d+ nodes, more than 2"):
        decoder.generate(draft_model(), target_model(), PROMPT, 8, rng=0)


# --- trees of a draft model's samples ----------------------------------------------------
# With a draft model, a target that scores trees and random sampling, the decoder drafts
# a chain and, at each depth, siblings drawn independently from the same draft row; the
# target verifies them as a tree with their laws (multi-step speculative sampling).


def draft_model():
    return ContextModel(VOCAB, seed=12, dtype=np.float32)


def sampled_outcomes(decoder, target, seed, eos=None, n_runs=N_RUNS):
    rng = np.random.default_rng(seed)
    draft, counts = draft_model(), collections.Counter()
    for _ in range(n_runs):
        ids, _ = decoder.generate(draft, target, PROMPT, N_TOKENS, eos, rng=rng)
        counts[new_tokens(ids, PROMPT, N_TOKENS)] += 1
    return counts


SAMPLED = [
    pytest.param({"temperature": 1.0}, None, 0.0, id="plain"),
    # p_min stops the chain (and its depth's siblings) at a flat draft row; eos ends it
    pytest.param({"temperature": 1.2, "top_p": 0.8, "min_p": 0.05}, 2, 0.3, id="controls-eos"),
]


@pytest.mark.parametrize(("controls", "eos", "p_min"), SAMPLED)
def test_sampled_trees_keep_the_targets_law(backend, controls, eos, p_min):
    target = target_model(np.float32)
    policy = PositionalDraftLength(p_min=p_min, target_cost=[1.0, 1.01, 1.02, 1.03, 1.04, 1.05])
    decoder = specdec.SpeculativeDecoder(4, draft_length=policy, backend=backend, **controls)
    counts = sampled_outcomes(decoder, target, seed=41, eos=eos)
    assert target.tree_calls > N_RUNS // 2  # siblings were verified, in most runs
    law = enumerate_joint_law(target, PROMPT, N_TOKENS, eos, **controls)
    result = pooled_chisquare(counts, law)
    assert result.impossible == 0, f"{result.impossible} outcomes of probability 0"
    assert result.pvalue > ALPHA, f"joint law differs from the target's: {result}"


def test_power_rejects_a_forgetful_verifier_on_sampled_trees():
    # the statistic's power, on the default backend (it checks the test, not a backend)
    backend = specdec.BACKEND
    target = target_model(np.float32)
    decoder = specdec.SpeculativeDecoder(4, draft_length=cheap_policy(), backend=backend)
    decoder._verifier = _ForgetfulVerifier(backend)
    counts = sampled_outcomes(decoder, target, seed=41)
    result = pooled_chisquare(counts, enumerate_joint_law(target, PROMPT, N_TOKENS))
    assert result.pvalue < POWER_ALPHA, f"the statistic missed a wrong verifier: {result}"


class _Spy(PositionalDraftLength):
    """Records the trees the decoder asks about and the ones it verified."""

    def __init__(self):
        super().__init__(target_cost=[1.0, 1.01, 1.02, 1.03, 1.04])
        self.asked, self.verified = [], []

    def select_tree(self, key, tree):
        self.asked.append(tree.tokens.copy())
        return super().select_tree(key, tree)

    def observe_tree(self, key, tree, selected, path, next_token, target_seconds):
        self.verified.append(tree)
        super().observe_tree(key, tree, selected, path, next_token, target_seconds)


def test_a_sampled_trees_shape_is_chosen_before_its_tokens_are_drawn(backend):
    spy = _Spy()
    decoder = specdec.SpeculativeDecoder(4, draft_length=spy, backend=backend)
    ids, stats = decoder.generate(draft_model(), target_model(), PROMPT, 40, rng=3)
    assert spy.asked and all((tokens == -1).all() for tokens in spy.asked)
    assert spy.verified and any(not tree.is_chain for tree in spy.verified)
    for tree in spy.verified:  # real tokens; siblings hang from the chain
        assert (tree.tokens >= 0).all() and (tree.tokens < VOCAB).all()
        chain = np.flatnonzero(tree.rank == 0)
        assert chain.tolist() == list(range(len(chain)))
    assert stats.total_tokens_generated == len(ids) - len(PROMPT)


def test_greedy_with_a_draft_model_verifies_chains_and_equals_argmax(backend):
    target = target_model()
    plain, _ = specdec.sample(target, PROMPT, 30, temperature=0.0, backend=backend)
    decoder = specdec.SpeculativeDecoder(
        4, temperature=0.0, draft_length=cheap_policy(), backend=backend
    )
    ids, _ = decoder.generate(draft_model(), target, PROMPT, 30)
    assert ids == plain
    assert target.tree_calls == 0  # greedy draws from one row are all the same token


def test_sampled_trees_stream_as_generated_and_agree_across_backends():
    target = target_model()
    backends = [b for b in ("cython", "python") if b in specdec.available_backends()]
    results = []
    for backend in backends:
        decoder = specdec.SpeculativeDecoder(4, draft_length=cheap_policy(), backend=backend)
        ids, _ = decoder.generate(draft_model(), target, PROMPT, 30, 4, rng=9)
        decoder = specdec.SpeculativeDecoder(4, draft_length=cheap_policy(), backend=backend)
        pieces = list(decoder.stream(draft_model(), target, PROMPT, 30, 4, rng=9))
        assert np.concatenate(pieces).tolist() == ids[len(PROMPT) :]
        results.append(ids)
    assert target.tree_calls > 0
    assert all(r == results[0] for r in results)


def test_sampled_shape_is_a_chain_with_siblings_per_depth():
    tree = DraftTree.sampled_shape(3, 2)
    assert tree.parents.tolist() == [-1, 0, 1, -1, 0, 1]
    assert tree.depth.tolist() == [1, 2, 3, 1, 2, 3]
    assert tree.rank.tolist() == [0, 0, 0, 1, 1, 1]
    assert (tree.tokens == -1).all() and len(DraftTree.sampled_shape(0, 4)) == 0


# --- the pieces: candidates, trees, the selection rule --------------------------------------


def test_prompt_lookup_candidates_follow_each_occurrence_latest_first():
    tokens = np.array([1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2, 3, 7, 9, 1, 2])
    drafter = PromptLookup(num_tokens=3)
    candidates = drafter.propose_candidates(tokens, 8, 4)
    assert [c.tolist() for c in candidates] == [[3, 7, 9], [5, 6, 9]]
    assert candidates[0].tolist() == drafter.propose(tokens, 8).tolist()
    assert drafter.last_match_size == 3
    assert len(drafter.propose_candidates(tokens, 8, 1)) == 1
    # an occurrence whose continuation repeats an earlier candidate adds nothing
    repeated = np.array([5, 1, 2, 5, 1, 2, 5, 1, 2])
    assert [c.tolist() for c in PromptLookup(3).propose_candidates(repeated, 8, 4)] == [[5, 1, 2]]


def test_suffix_candidates_branch_off_the_best_path():
    # the longest match, "1 2 3", was followed by "4 7" twice and by "5 6" once
    tokens = np.array([1, 2, 3, 4, 7, 0, 1, 2, 3, 5, 6, 0, 1, 2, 3, 4, 7, 9, 1, 2, 3])
    drafter = SuffixDrafter()
    drafter.start(tokens)
    candidates = [c.tolist() for c in drafter.propose_candidates(tokens, 3, 3)]
    assert candidates[0] == drafter.propose(tokens, 3).tolist()
    assert candidates[0][:2] == [4, 7]
    assert [5, 6, 0] in candidates[1:]  # the branch at the match, then its continuation
    assert len(drafter.propose_candidates(tokens, 3, 1)) == 1


def test_draft_tree_merges_shared_prefixes_in_candidate_order():
    tree = DraftTree.from_candidates([[5, 6, 7], [5, 8], [9], [5, 6]])
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9]
    assert tree.parents.tolist() == [-1, 0, 1, 0, -1]
    assert tree.depth.tolist() == [1, 2, 3, 2, 1]
    assert tree.rank.tolist() == [0, 0, 0, 1, 1]
    assert not tree.is_chain and DraftTree.from_candidates([[1, 2], [1, 2, 3]]).is_chain
    sub = tree.subtree(np.array([True, False, False, True, True]))
    assert sub.tokens.tolist() == [5, 8, 9] and sub.parents.tolist() == [-1, 0, -1]
    with pytest.raises(ValueError, match="parent"):
        tree.subtree(np.array([False, True, False, False, False]))


@pytest.mark.parametrize("tie_tolerance", [0.0, 0.06])
def test_selection_of_a_chain_is_the_chain_length(tie_tolerance):
    policy = PositionalDraftLength(tie_tolerance=tie_tolerance)
    for curve in ([1.0, 1.9, 2.5, 2.8, 3.05, 3.3], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]):
        policy.start(8, CostCurve(curve))
        for evidence in (1, 2, 4, 12):
            tree = DraftTree.from_candidates([[1, 2, 3, 4, 5, 6]])
            selected = policy.select_tree((0, evidence), tree)
            assert selected.sum() == policy.length((0, evidence), 6)
            assert selected[: selected.sum()].all()


def test_selection_takes_alternatives_only_where_they_pay():
    tree = DraftTree.from_candidates([[1, 2], [3, 4], [5]])
    policy = PositionalDraftLength()
    policy.start(8, CostCurve([1.0, 1.01, 1.02, 1.03, 1.04, 1.05]))  # nearly free
    cheap = policy.select_tree((0, 1), tree)
    assert cheap[tree.rank > 0].any()  # a weak first candidate: alternatives pay
    policy.start(8, CostCurve([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))  # every token a pass
    assert not policy.select_tree((0, 1), tree).any()
    # closed under parents and earlier siblings: the order verification tries them in
    for selected in (cheap,):
        for node in np.flatnonzero(selected):
            parent = tree.parents[node]
            assert parent < 0 or selected[parent]
            siblings = np.flatnonzero((tree.parents == parent) & (tree.rank < tree.rank[node]))
            assert selected[siblings].all()


def test_selection_pays_a_tree_pass_its_own_cost():
    # A weak first candidate with alternatives: with trees priced as chains the
    # policy selects alternatives; when a tree pass costs a token more than a chain
    # of as many tokens, it keeps to the first candidate's chain (verified as one).
    tree = DraftTree.from_candidates([[1, 2, 3], [4, 5], [6]])
    chain = [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06]
    policy = PositionalDraftLength(tie_tolerance=0.0)  # the best rate itself
    policy.start(8, CostCurve(chain))
    assert CostCurve(chain).tree is None and CostCurve(chain).tree_drafts(3) == 1.03
    assert policy.select_tree((0, 1), tree)[tree.rank > 0].any()
    dear = CostCurve(chain, tree=[1.0] + [v + 1.0 for v in chain[1:]])
    assert dear.tree_drafts(3) == pytest.approx(2.03) and dear.tree_drafts(0) == 1.0
    policy.start(8, dear)
    selected = policy.select_tree((0, 1), tree)
    n = int(selected.sum())
    assert n > 0 and selected[:n].all() and not selected[n:].any()  # a chain prefix
    assert n == policy.length((0, 1), 3)
    # a tree only a little dearer still takes the alternatives where they pay
    policy.start(8, CostCurve(chain, tree=[1.0] + [v + 0.05 for v in chain[1:]]))
    assert policy.select_tree((0, 1), tree)[tree.rank > 0].any()


def test_selection_probe_is_the_first_node():
    # a source the policy never drafts from is tried with one token now and then
    tree = DraftTree.from_candidates([[1, 2], [3]])
    policy = PositionalDraftLength()
    policy.start(8, CostCurve([1.0, 2.0, 3.0, 4.0]))
    picks = [policy.select_tree((0, 1), tree) for _ in range(PositionalDraftLength.PROBE_EVERY)]
    assert not any(p.any() for p in picks[:-1])
    assert picks[-1].tolist() == [True, False, False]


def test_observe_tree_learns_alternatives_and_the_shadow():
    policy = PositionalDraftLength(target_cost=[1.0, 1.01, 1.02, 1.03])
    policy.start(8)
    tree = DraftTree.from_candidates([[1, 2], [3]])  # nodes 0:1, 1:2, 2:3 (rank 1)
    before = policy.trees.alternative(policy, (0, 1), 1)
    selected = np.array([True, False, True])
    # the root's first child rejected, the alternative kept: it is learnt up
    policy.observe_tree((0, 1), tree, selected, np.array([2]), 4, 0.0)
    assert policy.trees.alternative(policy, (0, 1), 1) > before
    # both root children rejected: the alternative is learnt down
    down = policy.trees.alternative(policy, (0, 1), 1)
    policy.observe_tree((0, 1), tree, selected, np.array([], dtype=np.int64), 4, 0.0)
    assert policy.trees.alternative(policy, (0, 1), 1) < down
    # the first child kept, its unselected child (token 2) matches the next token: a
    # free observation at depth 2
    a2 = policy.acceptance((0, 1), 2)
    policy.observe_tree((0, 1), tree, selected, np.array([0]), 2, 0.0)
    assert policy.acceptance((0, 1), 2) > a2
