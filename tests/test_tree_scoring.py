"""Scoring a tree with a target (``specdec.models._tree_scoring``) and adapters' tree passes.

For every model: the tree's rows equal the rows of evaluating each node's branch as a
plain sequence, and after the step the model's next ``forward`` over the kept sequence
gives the logits of a fresh model on it.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_module, require_smollm2
from law_models import ContextModel

from specdec.models._tree_scoring import node_paths, score_tree, score_tree_by_branches

TREES = {
    "empty": ([], []),
    "chain": ([1, 2, 3], [-1, 0, 1]),
    "star": ([0, 1, 2], [-1, -1, -1]),
    "two-level": ([4, 1, 2, 0, 3, 3], [-1, -1, 0, 0, 1, 4]),
}


def reference_rows(model, prefix, tokens, parents):
    """Row 0 after the prefix, row i + 1 after the prefix and node i's path, one call each."""
    rows = [model.next_logits(list(prefix))]
    for path in node_paths(parents):
        rows.append(model.next_logits(list(prefix) + [tokens[j] for j in path]))
    return np.array(rows)


@pytest.mark.parametrize("name", sorted(TREES))
def test_branch_scoring_equals_each_branch_as_a_sequence(name):
    tokens, parents = TREES[name]
    model = ContextModel(vocab_size=5, seed=3)
    prefix = [2, 0, 4]
    rows = score_tree(model, prefix, np.array(tokens, dtype=np.int64), np.array(parents))
    expected = reference_rows(model, prefix, tokens, parents)
    assert rows.shape == (len(tokens) + 1, 5)
    np.testing.assert_array_equal(rows, expected.astype(np.float32))


def test_node_paths():
    assert node_paths([-1, -1, 0, 0, 1, 4]) == [[0], [1], [0, 2], [0, 3], [1, 4], [1, 4, 5]]


def test_one_call_per_leaf():
    model = ContextModel(vocab_size=5, seed=1)
    tokens, parents = TREES["two-level"]
    score_tree_by_branches(model, [1, 2], tokens, parents)
    assert model.calls == 3  # leaves 2, 3 and 5


@pytest.mark.parametrize(
    ("tokens", "parents", "match"),
    [
        ([1, 2], [-1, 1], r"parents\[1\]"),
        ([1, 2], [-1, -2], r"parents\[1\]"),
        ([1, 2], [-1], "same length"),
        ([1.0], [-1], "token_ids must be integers"),
    ],
)
def test_malformed_trees_are_refused(tokens, parents, match):
    with pytest.raises((ValueError, TypeError), match=match):
        score_tree_by_branches(ContextModel(), [1], np.array(tokens), np.array(parents))


@pytest.mark.parametrize(
    ("prefix", "error", "match"),
    [
        (np.array([[1, 2, 3], [4, 5, 6]]), ValueError, r"shape \(L,\) or \(1, L\)"),
        ([1.9, 2.5, 3.2], TypeError, "prefix_ids must be integers"),
        ([True, False], TypeError, "prefix_ids must be integers"),
        ([], ValueError, "at least one token"),
    ],
)
def test_a_malformed_prefix_is_refused(prefix, error, match):
    # the first three were scored as a 6-token prefix, [1, 2, 3] and [1, 0]
    with pytest.raises(error, match=match):
        score_tree(ContextModel(), prefix, np.array([1]), np.array([-1]))


def test_an_adapters_tree_ids_must_lie_in_its_vocabulary():
    from specdec.models._tree_scoring import tree_arguments

    tree_arguments([1, 2], [3], [-1], vocab_size=5)
    with pytest.raises(ValueError, match=r"prefix_ids holds token id 5, outside \[0, vocab"):
        tree_arguments([1, 5], [3], [-1], vocab_size=5)
    with pytest.raises(ValueError, match=r"token_ids holds a negative token id \(-2\)"):
        tree_arguments([1, 2], [3, -2], [-1, 0], vocab_size=5)


# -- a real adapter: SmolLM2 through llama.cpp (skipped where absent) ---------------------

LLAMA_KW = dict(n_ctx=256, n_threads=2, seed=0, verbose=False)
# Adapters that never evaluate a token alone (min_eval_tokens=2) agree with a fresh
# one-batch evaluation to this tolerance (tests/test_models.py, LLAMA_BATCHED_TOL).
LLAMA_TOL = 1e-3


@pytest.fixture(scope="module", params=["branches", "one pass"])
def smol_pair(request):
    """A cached target scoring trees, and a judge that evaluates each sequence from empty."""
    from specdec import models

    path = require_smollm2()
    if request.param == "one pass":
        from specdec.models._llama_tree import LlamaCppTreeModel

        target = LlamaCppTreeModel(path, tree_width=4, min_eval_tokens=2, **LLAMA_KW)
    else:
        target = models.LlamaCppModel(path, min_eval_tokens=2, **LLAMA_KW)
    judge = models.LlamaCppModel(path, min_eval_tokens=2, **LLAMA_KW)
    return target, judge


def test_llama_tree_rows_equal_each_branch_and_next_forward_equals_fresh(smol_pair):
    target, judge = smol_pair
    prefix = target.tokenize("Once upon a time, in a small village by the sea")
    ids = [target.tokenize(w, add_bos=False)[0] for w in (" there", " lived", " a", " was")]
    tokens = np.array([ids[0], ids[3], ids[1], ids[2], ids[0]], dtype=np.int64)
    parents = np.array([-1, -1, 0, 0, 1])
    target.reset()
    target.forward(np.array([prefix]))  # a warm cache, as in decoding
    calls = target.n_forward_calls
    rows = score_tree(target, prefix, tokens, parents)
    one_pass = hasattr(target, "forward_tree")
    assert target.n_forward_calls - calls == (1 if one_pass else 3)

    def fresh_last(seq):
        judge.reset()
        return judge.forward(np.array([seq]), logits_to_keep=1)[0, -1]

    expected = [fresh_last(prefix)]
    for path in node_paths(parents):
        expected.append(fresh_last(prefix + tokens[path].tolist()))
    np.testing.assert_allclose(rows, np.array(expected), atol=LLAMA_TOL, rtol=0)
    # The decoder keeps node 1 then node 4 and draws one more token after them.
    kept = prefix + tokens[[1, 4]].tolist() + [ids[2]]
    after = target.forward(np.array([kept]), logits_to_keep=3)[0]
    judge.reset()
    fresh = judge.forward(np.array([kept]), logits_to_keep=3)[0]
    np.testing.assert_allclose(after, fresh, atol=LLAMA_TOL, rtol=0)


def test_llama_one_pass_keeps_the_first_branch_in_the_cache(smol_pair):
    target, judge = smol_pair
    if not hasattr(target, "forward_tree"):
        pytest.skip("branch scoring leaves whichever branch was evaluated last")
    prefix = target.tokenize("The capital of France is")
    tokens = np.array([12, 40, 7, 9], dtype=np.int64)
    parents = np.array([-1, -1, 0, 2])
    score_tree(target, prefix, tokens, parents)
    kept = prefix + tokens[[0, 2, 3]].tolist() + [5]
    evaluated = target.n_evaluated_tokens
    after = target.forward(np.array([kept]), logits_to_keep=4)[0]
    # the branch stays cached; rows llama.cpp did not compute are evaluated again (<= 4)
    assert target.n_evaluated_tokens - evaluated <= 4
    judge.reset()
    fresh = judge.forward(np.array([kept]), logits_to_keep=4)[0]
    np.testing.assert_allclose(after, fresh, atol=LLAMA_TOL, rtol=0)


def test_llama_tree_wider_than_tree_width_is_scored_by_branches(smol_pair):
    target, judge = smol_pair
    if not hasattr(target, "forward_tree"):
        pytest.skip("only the one-pass adapter has a width")
    prefix = target.tokenize("Hello")
    tokens = np.array([20, 21, 22, 23, 24], dtype=np.int64)  # 5 leaves > tree_width 4
    parents = np.full(5, -1)
    calls = target.n_forward_calls
    rows = score_tree(target, prefix, tokens, parents)
    assert target.n_forward_calls - calls == 5
    for i in range(5):
        judge.reset()
        fresh = judge.forward(np.array([prefix + [20 + i]]), logits_to_keep=1)[0, -1]
        np.testing.assert_allclose(rows[i + 1], fresh, atol=LLAMA_TOL, rtol=0)


def test_llama_a_tree_near_the_end_of_the_context_is_scored_by_branches(smol_pair):
    target, judge = smol_pair
    if not hasattr(target, "forward_tree"):
        pytest.skip("the one-pass adapter only")
    prefix = np.random.default_rng(2).integers(100, 1000, 253).tolist()
    tokens, parents = np.array([20, 21, 22, 23]), np.full(4, -1)  # each branch fits n_ctx 256
    target.forward(np.array([prefix]), logits_to_keep=1)  # the prefix cached, as in decoding
    rows = score_tree(target, prefix, tokens, parents)  # all at once does not: it raised
    for i in range(4):
        judge.reset()
        fresh = judge.forward(np.array([prefix + [20 + i]]), logits_to_keep=1)[0, -1]
        np.testing.assert_allclose(rows[i + 1], fresh, atol=LLAMA_TOL, rtol=0)


def test_a_tree_model_and_a_plain_model_share_one_llama(smol_pair):
    # The tree adapter evaluates in a context of its own; the Llama object's record of
    # llama.ctx belongs to the plain adapter on the same Llama (it used to be
    # overwritten by the tree adapter's, and the plain one read logits of a cache that
    # was never filled).
    llama_cpp = require_module("llama_cpp")
    from specdec.models import LlamaCppModel
    from specdec.models._llama_tree import LlamaCppTreeModel

    target, judge = smol_pair
    if not hasattr(target, "forward_tree"):
        pytest.skip("the one-pass adapter only")
    llama = llama_cpp.Llama(str(require_smollm2()), logits_all=True, **LLAMA_KW)
    tree = LlamaCppTreeModel(llama, tree_width=4, min_eval_tokens=2, cost_curve=[1.0, 2.0])
    plain = LlamaCppModel(llama, min_eval_tokens=2, cost_curve=[1.0, 2.0])
    prefix = tree.tokenize("The capital of France is Paris. The capital of Germany")
    longer = prefix + [314, 11452, 284]

    def fresh(seq, rows):
        judge.reset()
        return judge.forward(np.array([seq]), logits_to_keep=rows)[0]

    tree.forward(np.array([prefix]))
    after_tree = plain.forward(np.array([longer]), logits_to_keep=3)[0]
    np.testing.assert_allclose(after_tree, fresh(longer, 3), atol=LLAMA_TOL, rtol=0)
    plain.forward(np.array([prefix]))
    rows = tree.forward_tree(longer, np.array([11, 12]), np.array([-1, 0]))
    np.testing.assert_allclose(rows[0], fresh(longer, 1)[0], atol=LLAMA_TOL, rtol=0)
    np.testing.assert_allclose(rows[2], fresh(longer + [11, 12], 1)[0], atol=LLAMA_TOL, rtol=0)


class _DecodeInterrupted:
    """``llama_cpp`` with Ctrl-C landing as ``llama_decode`` returns (cached, not recorded)."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def llama_decode(self, ctx, batch):
        self._lib.llama_decode(ctx, batch)
        raise KeyboardInterrupt


def test_llama_ctrl_c_inside_a_tree_pass_then_continuing_the_text(smol_pair):
    target, judge = smol_pair
    if not hasattr(target, "forward_tree"):
        pytest.skip("branch scoring goes through forward (tests/test_streaming.py)")
    prefix = target.tokenize("Once upon a time, in a small village")
    target.reset()
    target.forward(np.array([prefix[:-2]]))  # a warm cache: the pass evaluates two of them
    lib = target._llama_cpp
    target._llama_cpp = _DecodeInterrupted(lib)
    try:
        with pytest.raises(KeyboardInterrupt):
            score_tree(target, prefix, np.array([12, 40, 7]), np.array([-1, -1, 0]))
    finally:
        target._llama_cpp = lib
    # Continuing from what the adapter records used to fail: "llama_decode returned -1".
    kept = prefix + [12, 7, 5]
    after = target.forward(np.array([kept]), logits_to_keep=4)[0]
    judge.reset()
    fresh = judge.forward(np.array([kept]), logits_to_keep=4)[0]
    np.testing.assert_allclose(after, fresh, atol=LLAMA_TOL, rtol=0)


# -- a real adapter: a tiny Llama through transformers (skipped where absent) ------------

TF_TOL = 1e-4  # float32: a batch under a mask and a plain sequence sum in other orders


@pytest.fixture(scope="module")
def tiny_llama():
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=97,
            max_position_embeddings=256,
            initializer_range=0.2,
        )
    )


@pytest.mark.parametrize("name", sorted(TREES))
@pytest.mark.parametrize("warm", [False, True], ids=["empty-cache", "warm-cache"])
def test_transformers_tree_rows_equal_each_branch_in_one_pass(tiny_llama, name, warm):
    from specdec.models import TransformersModel

    target = TransformersModel(tiny_llama, cost_curve=[1.0, 2.0])
    judge = TransformersModel(tiny_llama, cost_curve=[1.0, 2.0])
    tokens, parents = (np.array(a, dtype=np.int64) for a in TREES[name])
    prefix = [5, 17, 3, 60, 8]
    if warm:
        target.forward(np.array([prefix[:3] + [9]]))  # a cache that shares 3 tokens
    calls = target.n_forward_calls
    rows = target.forward_tree(prefix, tokens, parents)
    assert target.n_forward_calls - calls == 1

    def fresh_last(seq):
        judge.reset()
        return judge.forward(np.array([seq]), logits_to_keep=1)[0, -1]

    expected = [fresh_last(prefix)] + [
        fresh_last(prefix + tokens[path].tolist()) for path in node_paths(parents)
    ]
    np.testing.assert_allclose(rows, np.array(expected), atol=TF_TOL, rtol=0)
    # The cache keeps the prefix and the leading chain of nodes: the next forward over
    # a kept path equals a fresh model's, and evaluates only what was not kept.
    kept = prefix + tokens[: 1 if len(tokens) else 0].tolist() + [11]
    evaluated = target.n_evaluated_tokens
    after = target.forward(np.array([kept]), logits_to_keep=2)[0]
    judge.reset()
    np.testing.assert_allclose(
        after, judge.forward(np.array([kept]), logits_to_keep=2)[0], atol=TF_TOL, rtol=0
    )
    assert target.n_evaluated_tokens - evaluated <= 2


def test_transformers_tree_pass_holds_only_the_last_prefix_token_and_the_nodes(tiny_llama):
    # An uncached prefix goes through the ordinary causal pass first: under the tree's
    # 4-D mask a long prompt costs a quarter more (SmolLM2, 250 tokens).
    from specdec.models import TransformersModel

    target = TransformersModel(tiny_llama, cost_curve=[1.0, 2.0])
    batches = []
    evaluate_tree = target._evaluate_tree
    target._evaluate_tree = lambda ids, *a: batches.append(len(ids)) or evaluate_tree(ids, *a)
    prefix = [5, 17, 3, 60, 8, 9, 40]
    tokens, parents = np.array([4, 6, 7]), np.array([-1, 0, -1])
    rows = target.forward_tree(prefix, tokens, parents)
    assert batches == [1 + len(tokens)]
    assert target.n_evaluated_tokens == len(prefix) + len(tokens)
    judge = TransformersModel(tiny_llama, cost_curve=[1.0, 2.0])
    expected = judge.forward(np.array([prefix + [4]]), logits_to_keep=2)[0]
    np.testing.assert_allclose(rows[:2], expected, atol=TF_TOL, rtol=0)


def test_transformers_tree_decoding_greedy_equals_plain(tiny_llama, backend):
    import specdec
    from specdec.drafters import PositionalDraftLength, PromptLookup
    from specdec.models import TransformersModel

    target = TransformersModel(tiny_llama, cost_curve=[1.0, 1.01, 1.02, 1.03, 1.04])
    prompt = [5, 17, 3, 60, 5, 17, 4, 61, 5, 17, 3, 62, 5, 17]
    plain, _ = specdec.sample(target, prompt, 24, temperature=0.0, backend=backend)
    calls = []
    forward_tree = target.forward_tree
    target.forward_tree = lambda *a: calls.append(1) or forward_tree(*a)
    decoder = specdec.SpeculativeDecoder(
        temperature=0.0,
        # nearly free passes and the best rate itself (near ties keep to chains)
        draft_length=PositionalDraftLength(target_cost=[1.0, 1.01, 1.02, 1.03], tie_tolerance=0),
        backend=backend,
    )
    ids, _ = decoder.generate(PromptLookup(), target, prompt, 24)
    assert ids == plain
    assert calls  # trees were scored


def test_transformers_sampled_trees_of_a_draft_model_score_as_fresh_models(tiny_llama, backend):
    # A draft model's sampled trees through TransformersModel.forward_tree (one pass,
    # the cache cut to the leading chain, reused when a sibling was kept) give the same
    # run, seed for seed, as a target that scores every call on an empty cache.
    import specdec
    from specdec.drafters import PositionalDraftLength
    from specdec.models import TransformersModel

    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(1)
    draft_net = transformers.LlamaForCausalLM(tiny_llama.config)

    class Fresh:
        """The target's logits, every call on an empty cache, trees branch by branch."""

        def __init__(self):
            self.model = TransformersModel(tiny_llama, cost_curve=[1.0, 2.0])

        def forward(self, ids, logits_to_keep=None):
            self.model.reset()
            return self.model.forward(ids, logits_to_keep=logits_to_keep)

        def forward_tree(self, prefix_ids, token_ids, parents):
            return score_tree_by_branches(self, prefix_ids, token_ids, parents)

    def run(target):
        calls = []
        forward_tree = target.forward_tree
        target.forward_tree = lambda *a: calls.append(1) or forward_tree(*a)
        policy = PositionalDraftLength(target_cost=[1.0, 1.01, 1.02, 1.03, 1.04])
        decoder = specdec.SpeculativeDecoder(4, draft_length=policy, backend=backend)
        draft = TransformersModel(draft_net, cost_curve=[1.0, 2.0])
        ids, stats = decoder.generate(draft, target, [5, 17, 3, 60], 24, rng=11)
        return ids, len(calls)

    one_pass, trees = run(TransformersModel(tiny_llama, cost_curve=[1.0, 1.01, 1.02]))
    fresh, fresh_trees = run(Fresh())
    assert trees > 0 and trees == fresh_trees
    assert one_pass == fresh


@pytest.fixture(scope="module")
def tiny_sliding_window_model():
    """A tiny Mistral whose layers attend within a window of 8 tokens."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=8,
    )
    return transformers.MistralForCausalLM(config).float()


@pytest.mark.parametrize("prefix_length", [5, 20])
def test_a_sliding_window_models_tree_rows_equal_each_branch(
    tiny_sliding_window_model, prefix_length
):
    from specdec.models import TransformersModel

    target = TransformersModel(tiny_sliding_window_model, cost_curve=[1.0, 2.0])
    judge = TransformersModel(tiny_sliding_window_model, cost_curve=[1.0, 2.0])
    prefix = np.random.default_rng(0).integers(0, 97, prefix_length).tolist()
    tokens, parents = np.arange(1, 7), np.arange(-1, 5)  # a chain of 6 past the window
    rows = target.forward_tree(prefix, tokens, parents)  # wrong rows, or a crash, before
    np.testing.assert_allclose(
        rows, score_tree_by_branches(judge, prefix, tokens, parents), atol=TF_TOL, rtol=0
    )


def test_a_sliding_window_cache_that_refuses_a_rollback_starts_over(tiny_sliding_window_model):
    from specdec.models import TransformersModel

    target = TransformersModel(tiny_sliding_window_model, cost_curve=[1.0, 2.0])
    judge = TransformersModel(tiny_sliding_window_model, cost_curve=[1.0, 2.0])
    sequence = np.random.default_rng(1).integers(0, 97, (1, 21))
    target.forward(sequence[:, :20], logits_to_keep=1)
    target.forward(sequence, logits_to_keep=1)  # the window's cache is full
    edited = sequence.copy()
    edited[0, -2:] = [7, 9]  # a rollback of two tokens: the cache cannot be cut there
    for _ in range(2):  # and the next call works too (it raised again and again)
        rows = target.forward(edited, logits_to_keep=2)
        judge.reset()
        np.testing.assert_allclose(rows, judge.forward(edited, 2), atol=TF_TOL, rtol=0)
