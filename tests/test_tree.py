"""Tree verification (``specdec.verify_tree``): exact law, greedy, chains, parity, errors.

Exact law.  Each scenario builds, per run, a tree of candidates after a prompt from
a context-dependent draft model (``law_models.ContextModel``): deterministic children
(the draft's most likely tokens: one-hot drafts) or children drawn independently from
the draft's warped law at their parent's context (sampled drafts, given to the
kernel as logits or probabilities).  The target scores every node's context;
``verify_tree`` keeps a path and draws the next token; the run then continues from
the target's exact law up to ``n_tokens`` new tokens (the deepest tree emits them
all).  The outcomes' law must be the target's joint law of ``n_tokens`` tokens
(``enumerate_joint_law``), compared by the pooled chi-square of test_decoder_law.py
(cells of expectation < 5 pooled, p > ALPHA = 1e-3, no outcome of probability 0),
with fixed seeds: each test is deterministic.  Only a change to the stream of
uniforms re-draws the outcomes; then each of the 17 chi-square tests here fails by
chance with probability 1e-3 (confirm with other seeds, never loosen ALPHA).  The
same statistic, same scenario, same seed and runs, rejects two deliberately wrong
verifiers (p < 1e-6).

The other properties: temperature 0 descends to the target's argmax (lowest id on
ties) and draws nothing; a tree that is one path makes exactly the decisions of
``verify(..., verification="token")`` for the same seed; both backends make the same
decisions; malformed trees are refused, named, before any work.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import PURE_PYTHON
from law_models import (
    ContextModel,
    SparseVocabModel,
    enumerate_joint_law,
    pooled_chisquare,
    same_state,
    warped_probs,
)

import specdec

N_RUNS = 6_000
ALPHA = 1e-3
POWER_ALPHA = 1e-6


# --- scenarios -------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One tree shape, draft kind and set of sampling controls, on two toy models."""

    id: str
    vocab: int
    branching: tuple  # children per node at each depth: (1, 1, 1) chain, (3,) star...
    draft: str  # "one-hot", "logits" or "probs"
    rng_seed: int
    prompt: tuple = (0,)
    controls: dict = field(default_factory=lambda: {"temperature": 1.0})
    order: str = "bfs"  # node numbering: breadth first or depth first (pre-order)
    target_dtype: type = np.float64
    draft_dtype: type = np.float64
    target_masked: tuple | None = None
    live: tuple | None = None  # a SparseVocabModel over these ids of a large vocabulary

    @property
    def n_tokens(self) -> int:
        return len(self.branching) + 1

    def models(self):
        if self.live is None:
            draft = ContextModel(self.vocab, seed=11, dtype=self.draft_dtype, scale=2.0)
            target = ContextModel(
                self.vocab, seed=12, dtype=self.target_dtype, masked=self.target_masked
            )
            return draft, target
        masked = None
        if self.target_masked is not None:
            masked = [self.live.index(i) for i in self.target_masked]
        draft = SparseVocabModel(self.vocab, self.live, seed=11, dtype=self.draft_dtype, scale=2.0)
        target = SparseVocabModel(
            self.vocab, self.live, seed=12, dtype=self.target_dtype, masked=masked
        )
        return draft, target


SCENARIOS = [
    Scenario("chain-logits", 5, (1, 1, 1), "logits", 2001),
    Scenario(
        "star-logits",
        5,
        (3,),
        "logits",
        2002,
        prompt=(1, 3),
        controls={"temperature": 0.8},
        target_dtype=np.float32,
    ),
    Scenario(
        "twolevel-logits-topk",
        5,
        (2, 2),
        "logits",
        2003,
        controls={"temperature": 1.2, "top_k": 3},
        order="dfs",
        draft_dtype=np.float32,
    ),
    Scenario(
        "twolevel-probs-topp", 5, (2, 2), "probs", 2004, controls={"temperature": 1.0, "top_p": 0.9}
    ),
    # The draft proposes token 3 at the root; the target forbids it: never kept, never drawn.
    Scenario("star-onehot", 5, (3,), "one-hot", 2005, prompt=(2,), target_masked=(3,)),
    Scenario(
        "twolevel-onehot-minp",
        5,
        (2, 2),
        "one-hot",
        2006,
        controls={"temperature": 0.9, "min_p": 0.05},
        order="dfs",
    ),
    Scenario("chain-onehot", 4, (1, 1, 1), "one-hot", 2007, prompt=(3, 0)),
    # V = 1300: three blocks of the compiled core's passes; residuals stored and
    # rewritten across blocks.
    Scenario(
        "star-logits-blocks",
        1300,
        (3,),
        "logits",
        2008,
        prompt=(0, 512),
        draft_dtype=np.float32,
        target_masked=(900,),
        live=(0, 7, 300, 511, 512, 513, 900, 1023, 1024, 1299),
    ),
]
SCENARIO_BY_ID = {s.id: s for s in SCENARIOS}


class Harness:
    """Runs a scenario with a verifier; caches every context's rows and laws."""

    def __init__(self, scenario: Scenario, models=None):
        self.scenario = scenario
        self.draft, self.target = scenario.models() if models is None else models
        self.controls = scenario.controls
        self._rows = {}

    def row(self, model, context):
        key = (id(model), tuple(context))
        if key not in self._rows:
            logits = model.next_logits(list(context))
            self._rows[key] = (logits, warped_probs(logits, **self.controls))
        return self._rows[key]

    def tree(self, rng):
        """(token_ids, parents, target_rows, draft_rows) of one tree after the prompt."""
        s = self.scenario
        tokens, parents, contexts, draft_rows = [], [], [], []
        frontier = [(-1, tuple(s.prompt))]
        for width in s.branching:
            grown = []
            for parent, context in frontier:
                logits, q = self.row(self.draft, context)
                if s.draft == "one-hot":  # deterministic: the draft's most likely tokens
                    kids = np.argsort(-q, kind="stable")[:width]
                else:  # independent draws from the draft's law at the parent's context
                    kids = rng.choice(len(q), size=width, p=q)
                for token in kids:
                    tokens.append(int(token))
                    parents.append(parent)
                    contexts.append(context + (int(token),))
                    draft_rows.append(logits if s.draft == "logits" else q)
                    grown.append((len(tokens) - 1, contexts[-1]))
            frontier = grown
        order = self._order(parents)
        renumber = {old: new for new, old in enumerate(order)}
        renumber[-1] = -1
        tokens = np.array([tokens[i] for i in order], dtype=np.int64)
        parents = np.array([renumber[parents[i]] for i in order], dtype=np.int64)
        contexts = [tuple(s.prompt)] + [contexts[i] for i in order]
        target_rows = np.array(
            [self.row(self.target, c)[0] for c in contexts], dtype=s.target_dtype
        )
        draft = None
        if s.draft != "one-hot":
            dtype = s.draft_dtype if s.draft == "logits" else np.float64
            draft = np.array([draft_rows[i] for i in order], dtype=dtype)
        return tokens, parents, target_rows, draft

    def _order(self, parents):
        """The nodes (built breadth first) in the scenario's numbering."""
        if self.scenario.order == "bfs":
            return list(range(len(parents)))
        children = collections.defaultdict(list)
        for i, parent in enumerate(parents):
            children[parent].append(i)
        order, stack = [], list(reversed(children[-1]))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(children[node]))
        return order

    def run(self, verifier, n_runs=N_RUNS):
        """Outcome counts (first n_tokens new tokens) and the kept-depth histogram."""
        s = self.scenario
        rng = np.random.default_rng(s.rng_seed)
        counts = collections.Counter()
        depths = collections.Counter()
        for _ in range(n_runs):
            tokens, parents, target_rows, draft = self.tree(rng)
            path, token = verifier(tokens, parents, target_rows, draft, rng)
            emitted = [int(tokens[j]) for j in path] + [int(token)]
            depths[len(path)] += 1
            sequence = list(s.prompt) + emitted
            while len(sequence) - len(s.prompt) < s.n_tokens:
                p = self.row(self.target, sequence)[1]
                sequence.append(int(rng.choice(len(p), p=p)))
            counts[tuple(sequence[len(s.prompt) : len(s.prompt) + s.n_tokens])] += 1
        return counts, depths

    def law(self):
        s = self.scenario
        return enumerate_joint_law(self.target, list(s.prompt), s.n_tokens, **self.controls)


def library_verifier(scenario, backend):
    kind = "probs" if scenario.draft == "probs" else "logits"

    def verify(tokens, parents, target_rows, draft, rng):
        return specdec.verify_tree(
            tokens,
            parents,
            target_rows,
            draft,
            draft_kind=kind,
            rng=rng,
            backend=backend,
            **scenario.controls,
        )

    return verify


# --- the scenarios are what they claim to be ------------------------------------------


def test_scenarios_cover_shapes_kinds_and_controls():
    assert {s.branching for s in SCENARIOS} >= {(1, 1, 1), (3,), (2, 2)}
    assert {s.draft for s in SCENARIOS} == {"one-hot", "logits", "probs"}
    for name in ("top_k", "top_p", "min_p"):
        assert any(name in s.controls for s in SCENARIOS), name
    for s in SCENARIOS:
        harness = Harness(s)
        assert abs(sum(harness.law().values()) - 1.0) < 1e-12
        # the draft is far from the target at the root: rejections are common
        p = harness.row(harness.target, s.prompt)[1]
        q = harness.row(harness.draft, s.prompt)[1]
        assert 0.5 * np.abs(p - q).sum() > 0.2, s.id
        tokens, parents, target_rows, draft = harness.tree(np.random.default_rng(0))
        assert len(tokens) == sum(np.prod(s.branching[: d + 1]) for d in range(len(s.branching)))
        assert np.all(parents < np.arange(len(parents)))
    # star-onehot: the target forbids a token the draft proposes at the root
    harness = Harness(SCENARIO_BY_ID["star-onehot"])
    tokens, *_ = harness.tree(np.random.default_rng(0))
    assert 3 in tokens[:3]


# --- exact law -------------------------------------------------------------------------


def check_exact(result):
    assert result.impossible == 0, f"{result.impossible} outcomes of probability 0"
    assert result.pvalue > ALPHA, f"joint law differs from the target's: {result}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_emitted_tokens_follow_the_targets_law(backend, scenario):
    harness = Harness(scenario)
    counts, depths = harness.run(library_verifier(scenario, backend))
    result = pooled_chisquare(counts, harness.law())
    print(
        f"tree law [{backend}, {scenario.id}]: chi2={result.statistic:.1f} dof={result.dof} "
        f"p={result.pvalue:.3g}; depths {dict(sorted(depths.items()))}"
    )
    check_exact(result)
    # both decisions happen: the root's children all rejected, and a path kept
    assert depths[0] > 0 and sum(depths.values()) > depths[0], depths
    if scenario.target_masked:
        masked = scenario.target_masked[0]
        assert not any(masked in cell for cell in counts)


# --- power: the same statistic rejects wrong verifiers -----------------------------------


def _q_row(harness, draft, j):
    if harness.scenario.draft == "logits":
        return warped_probs(draft[j], **harness.controls)
    return draft[j] / draft[j].sum()


def _draw(p, rng):
    return int(rng.choice(len(p), p=p / p.sum()))


def no_update_after_rejection(harness):
    """Wrong: every child is tested against the target's own p (not the residual left
    by its elder siblings); when none is kept, the draw comes from the last child's
    residual only."""

    def verify(tokens, parents, target_rows, draft, rng):
        path, node = [], -1
        while True:
            p = warped_probs(target_rows[node + 1], **harness.controls)
            kids = [j for j in range(len(tokens)) if parents[j] == node]
            for j in kids:
                q = _q_row(harness, draft, j)
                if rng.random() * q[tokens[j]] < p[tokens[j]]:
                    path.append(j)
                    node = j
                    break
            else:
                if kids:
                    p = np.maximum(p - _q_row(harness, draft, kids[-1]), 0.0)
                return np.array(path, dtype=np.int64), _draw(p, rng)

    return verify


def keep_every_child(harness):
    """Wrong: descends to the first child at every node, then draws from the target."""

    def verify(tokens, parents, target_rows, draft, rng):
        path, node = [], -1
        while True:
            kids = [j for j in range(len(tokens)) if parents[j] == node]
            if not kids:
                p = warped_probs(target_rows[node + 1], **harness.controls)
                return np.array(path, dtype=np.int64), _draw(p, rng)
            path.append(kids[0])
            node = kids[0]

    return verify


WRONG_VERIFIERS = {
    "no_update_after_rejection": (no_update_after_rejection, "star-logits"),
    "keep_every_child": (keep_every_child, "twolevel-onehot-minp"),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_VERIFIERS))
def test_power_statistic_rejects_a_wrong_verifier(wrong):
    make_wrong, scenario_id = WRONG_VERIFIERS[wrong]
    harness = Harness(SCENARIO_BY_ID[scenario_id])
    counts, _ = harness.run(make_wrong(harness))
    result = pooled_chisquare(counts, harness.law())
    print(f"power check {wrong} [{scenario_id}]: chi2={result.statistic:.1f} p={result.pvalue:.3g}")
    assert result.pvalue < POWER_ALPHA, result


def test_the_reference_walk_of_the_power_test_is_itself_exact():
    """The wrong verifiers share their walk with this correct one (multi-step sampling
    written with the oracle's laws): it passes the statistic, so their failures come
    from their one wrong rule, not from the harness."""
    harness = Harness(SCENARIO_BY_ID["star-logits"])

    def verify(tokens, parents, target_rows, draft, rng):
        path, node = [], -1
        while True:
            p = warped_probs(target_rows[node + 1], **harness.controls)
            kids = [j for j in range(len(tokens)) if parents[j] == node]
            for j in kids:
                q = _q_row(harness, draft, j)
                if rng.random() * q[tokens[j]] < p[tokens[j]]:
                    path.append(j)
                    node = j
                    break
                p = np.maximum(p - q, 0.0)
                p /= p.sum()
            else:
                return np.array(path, dtype=np.int64), _draw(p, rng)

    counts, _ = harness.run(verify)
    check_exact(pooled_chisquare(counts, harness.law()))


# --- greedy ----------------------------------------------------------------------------


def _random_tree(rng, n_nodes, vocab):
    parents = np.array([int(rng.integers(-1, i)) for i in range(n_nodes)], dtype=np.int64)
    tokens = rng.integers(0, vocab, n_nodes)
    return tokens, parents


def _argmax_walk(tokens, parents, target_rows):
    """Descend to the first child (in index order) equal to the row's argmax."""
    path, node = [], -1
    while True:
        best = int(np.argmax(target_rows[node + 1]))  # lowest id among the maxima
        kids = [j for j in range(len(tokens)) if parents[j] == node and tokens[j] == best]
        if not kids:
            return path, best
        path.append(kids[0])
        node = kids[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_greedy_descends_to_the_argmax_and_draws_nothing(backend, dtype):
    rng = np.random.default_rng(7)
    deep = 0
    for _ in range(300):
        vocab = int(rng.integers(2, 6))
        n_nodes = int(rng.integers(0, 9))
        tokens, parents = _random_tree(rng, n_nodes, vocab)
        # integer logits: ties at the maximum, broken to the lowest id
        target_rows = np.round(rng.standard_normal((n_nodes + 1, vocab))).astype(dtype)
        draft = rng.standard_normal((n_nodes, vocab)) if n_nodes % 2 else None
        generator = np.random.default_rng(1)
        before = generator.bit_generator.state
        path, token = specdec.verify_tree(
            tokens, parents, target_rows, draft, temperature=0, rng=generator, backend=backend
        )
        expected_path, expected_token = _argmax_walk(tokens, parents, target_rows)
        assert list(path) == expected_path and token == expected_token
        assert same_state(generator.bit_generator.state, before)
        deep += len(path) >= 2
    assert deep > 10


def test_greedy_emits_the_targets_greedy_decoding(backend):
    """Candidates from a context model's own top tokens: the emitted tokens are the
    target's argmax decoding from the prompt."""
    target = ContextModel(5, seed=3)
    draft = ContextModel(5, seed=4)
    kept = 0
    for prompt in [(0,), (1, 2), (4, 4, 3), (2, 0), (3,)]:
        scenario = Scenario("greedy", 5, (2, 2), "one-hot", 0, prompt, {"temperature": 0})
        harness = Harness(scenario, models=(draft, target))
        tokens, parents, target_rows, _ = harness.tree(None)
        path, token = specdec.verify_tree(
            tokens, parents, target_rows, temperature=0, backend=backend
        )
        sequence = list(prompt)
        for _ in range(len(path) + 1):
            sequence.append(int(np.argmax(target.next_logits(sequence))))
        assert [int(tokens[j]) for j in path] + [token] == sequence[len(prompt) :]
        kept += len(path)
    assert kept >= 3


# --- a chain is token-by-token verify -----------------------------------------------------


CONTROLS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.1},
]


@pytest.mark.parametrize("kind", ["one-hot", "logits", "probs"])
def test_a_chain_makes_verify_token_decisions(backend, kind):
    rng = np.random.default_rng({"one-hot": 1, "logits": 2, "probs": 3}[kind])
    rejected_later = 0
    for seed in range(400):
        vocab = int(rng.choice([3, 7, 700]))
        n = int(rng.integers(0, 6))
        controls = CONTROLS[seed % len(CONTROLS)]
        dtype = np.float32 if seed % 3 else np.float64
        target = rng.standard_normal((n + 1, vocab)).astype(dtype)
        draft_logits = (target[:n] + rng.standard_normal((n, vocab))).astype(dtype)
        draft, draft_kind = None, "logits"
        if kind == "logits":
            draft = draft_logits
        elif kind == "probs":
            draft, draft_kind = (
                np.array([warped_probs(r, **controls) for r in draft_logits]).reshape(
                    draft_logits.shape
                ),
                "probs",
            )
        # tokens of positive draft probability (drawn from q), or the target's own picks
        laws = [
            warped_probs(r, **controls) for r in (draft_logits if draft is not None else target)
        ]
        ids = np.array([rng.choice(vocab, p=laws[i]) for i in range(n)], dtype=np.int64)
        options = dict(draft_kind=draft_kind, backend=backend, **controls)
        n_kept, next_token = specdec.verify(
            ids, draft, target, verification="token", rng=seed, **options
        )
        path, token = specdec.verify_tree(ids, np.arange(n) - 1, target, draft, rng=seed, **options)
        assert (len(path), token) == (n_kept, next_token), seed
        assert list(path) == list(range(n_kept))
        rejected_later += 0 < n_kept < n
    assert rejected_later > 20


# --- parity between backends -----------------------------------------------------------


needs_core = pytest.mark.skipif(PURE_PYTHON, reason="no compiled core in a pure-Python install")


@needs_core
@pytest.mark.parametrize("kind", ["one-hot", "logits", "probs"])
def test_both_backends_make_the_same_decisions(kind):
    rng = np.random.default_rng({"one-hot": 11, "logits": 12, "probs": 13}[kind])
    several_tried = 0
    for seed in range(300):
        vocab = int(rng.choice([2, 5, 1300]))
        n_nodes = int(rng.integers(0, 10))
        controls = CONTROLS[seed % len(CONTROLS)]
        dtype = np.float32 if seed % 2 else np.float64
        _, parents = _random_tree(rng, n_nodes, vocab)
        target = rng.standard_normal((n_nodes + 1, vocab)).astype(dtype)
        draft_logits = rng.standard_normal((n_nodes, vocab)).astype(dtype)
        draft, draft_kind = None, "logits"
        if kind == "logits":
            draft = draft_logits
        elif kind == "probs":
            draft, draft_kind = (
                np.array([warped_probs(r, **controls) for r in draft_logits]).reshape(
                    draft_logits.shape
                ),
                "probs",
            )
        laws = [warped_probs(r, **controls) for r in draft_logits]
        if kind == "one-hot":  # distinct siblings, as a deterministic drafter proposes
            ids = np.array([np.argsort(-laws[i])[i % min(3, vocab)] for i in range(n_nodes)])
        else:
            ids = np.array([rng.choice(vocab, p=laws[i]) for i in range(n_nodes)], dtype=np.int64)
        generators = [np.random.default_rng(seed) for _ in range(2)]
        results = [
            specdec.verify_tree(
                ids, parents, target, draft, draft_kind=draft_kind, rng=g, backend=b, **controls
            )
            for g, b in zip(generators, ("cython", "python"), strict=True)
        ]
        (path_c, token_c), (path_p, token_p) = results
        assert list(path_c) == list(path_p) and token_c == token_p, seed
        assert same_state(generators[0].bit_generator.state, generators[1].bit_generator.state)
        several_tried += n_nodes > 0 and np.bincount(parents + 1).max() >= 2
    assert several_tried > 100


# --- the engine API's edges and errors ---------------------------------------------------


def test_no_nodes_draws_from_the_root_row_as_verify_does(backend):
    target = np.random.default_rng(0).standard_normal((1, 9))
    path, token = specdec.verify_tree([], [], target, rng=5, backend=backend)
    assert path.dtype == np.int64 and path.shape == (0,)
    assert token == specdec.verify([], None, target, rng=5, backend=backend)[1]


def test_inputs_are_read_only_or_strided_and_never_written(backend):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((4, 6)).astype(np.float32)
    draft = rng.standard_normal((3, 6))
    ids, parents = np.array([1, 2, 3]), np.array([-1, -1, 1])
    expected = specdec.verify_tree(ids, parents, target, draft, rng=0, backend=backend)
    copies = [a.copy() for a in (ids, parents, target, draft)]
    for array in (ids, parents, target, draft):
        array.flags.writeable = False
    strided = np.asfortranarray(target)  # rows not C-contiguous: copied once
    path, token = specdec.verify_tree(ids, parents, strided, draft, rng=0, backend=backend)
    assert list(path) == list(expected[0]) and token == expected[1]
    for array, copy in zip((ids, parents, target, draft), copies, strict=True):
        assert np.array_equal(array, copy)


def _valid():
    rng = np.random.default_rng(0)
    return {
        "draft_token_ids": np.array([1, 2, 0]),
        "parents": np.array([-1, -1, 0]),
        "target_logits": rng.standard_normal((4, 5)),
        "draft": rng.standard_normal((3, 5)),
    }


BAD_CALLS = {
    "parent not before its node": ({"parents": [-1, 1, 0]}, ValueError, r"parents\[1\] is 1"),
    "parent below -1": ({"parents": [-1, -2, 0]}, ValueError, r"parents\[1\] is -2"),
    "parent out of range": ({"parents": [-1, -1, 7]}, ValueError, r"parents\[2\] is 7"),
    "one parent too few": ({"parents": [-1, -1]}, ValueError, "one parent per node"),
    "float parents": ({"parents": [-1.0, -1.0, 0.0]}, TypeError, "parents must hold integer"),
    "2-D parents": ({"parents": [[-1, -1, 0]]}, ValueError, "parents must be 1-D"),
    "token outside V": (
        {"draft_token_ids": [1, 5, 0]},
        ValueError,
        r"draft_token_ids\[1\] is 5",
    ),
    "negative token": (
        {"draft_token_ids": [-1, 2, 0]},
        ValueError,
        r"draft_token_ids\[0\] is -1",
    ),
    "float tokens": (
        {"draft_token_ids": [1.0, 2.0, 0.0]},
        TypeError,
        "draft_token_ids must hold integer",
    ),
    "target rows for N": (
        {"target_logits": np.zeros((3, 5))},
        ValueError,
        r"target_logits must have shape \(4, V\)",
    ),
    "float16 target": (
        {"target_logits": np.zeros((4, 5), np.float16)},
        TypeError,
        "target_logits must hold float32 or float64",
    ),
    "draft rows for N": (
        {"draft": np.zeros((2, 5))},
        ValueError,
        r"draft must have shape \(3, V\)",
    ),
    "draft vocabulary": (
        {"draft": np.zeros((3, 6))},
        ValueError,
        "draft and target_logits disagree on the vocabulary",
    ),
    "draft kind": ({"draft_kind": "logprobs"}, ValueError, "draft_kind must be"),
    "temperature": ({"temperature": -1.0}, ValueError, "temperature"),
    "backend": ({"backend": "fortran"}, ValueError, "backend must be"),
    "NaN draft row": (
        {"draft": np.array([[0.0] * 5, [np.nan] * 5, [0.0] * 5])},
        ValueError,
        r"draft\[1\] holds NaN",
    ),
    "token of draft probability 0": (
        {"draft": np.array([[0.0, -np.inf, 0, 0, 0], [0.0] * 5, [0.0] * 5])},
        ValueError,
        r"^draft_token_ids\[0\]: token 1 has probability 0",
    ),
    "NaN target row": (
        {"target_logits": np.full((4, 5), np.nan)},
        ValueError,
        r"target_logits\[0\] holds NaN",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_malformed_calls_are_refused_by_name(backend, case):
    changes, error, message = BAD_CALLS[case]
    call, options = _valid(), {"backend": backend}
    for name, value in changes.items():
        (call if name in call else options)[name] = value
    generator = np.random.default_rng(0)
    before = generator.bit_generator.state
    with pytest.raises(error, match=message):
        specdec.verify_tree(**call, rng=generator, **options)
    if case != "NaN target row":  # argument errors come before any draw
        assert same_state(generator.bit_generator.state, before)


def test_huge_unsigned_parent_is_refused(backend):
    with pytest.raises(ValueError, match=r"parents\[0\] is 18446744073709551615"):
        specdec.verify_tree(
            [1], np.array([2**64 - 1], np.uint64), np.zeros((2, 3)), rng=0, backend=backend
        )
