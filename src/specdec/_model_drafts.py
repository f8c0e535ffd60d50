"""Drafting from a draft model: a chain sampled token by token, or a tree with siblings.

A draft model is sampled through the verifier, so that each drawn token's law and
weights are in the workspace's draft rows when the target's pass is verified.

A tree of sampled drafts (when the target scores trees and the policy selects among
nodes) is a chain plus, at each depth, siblings drawn independently from the same row:
the chain costs the draft model one call per depth, the siblings nothing more, and the
target scores them all in one pass, verified by multi-step speculative sampling
(SpecInfer, Miao et al. 2024): the children of a node are independent draws from its
draft law, tried in turn against the target's law less what the rejected ones took.
The policy chooses the tree's shape (nodes per depth) before any token is drawn: a
choice that saw the drawn tokens would bias the output law.
"""

from __future__ import annotations

import numpy as np

from specdec._validation import check_token_range
from specdec._verifier import StreamBuffers
from specdec.drafters.tree import DraftTree


def check_same_vocab(draft_size: int, target_size: int) -> None:
    """The draft and the target must share one vocabulary."""
    if draft_size != target_size:
        raise ValueError(
            f"draft_model and target_model disagree on the vocabulary: the draft has "
            f"{draft_size} tokens, the target {target_size}"
        )


def _check_draft_row(row: np.ndarray, work: StreamBuffers) -> None:
    """A draft model's row must have the vocabulary of the workspace (the target's).

    The workspace is made for the first model evaluated; when a chained drafter's
    proposal made the target go first, the draft model's first row is checked here.
    """
    if row.shape[0] != work.vocab_size:
        raise ValueError(
            f"draft_model and target_model disagree on the vocabulary: the draft has "
            f"{row.shape[0]} tokens, the target {work.vocab_size}"
        )


def nodes_per_depth(tree: DraftTree, selected: np.ndarray) -> list[int]:
    """Selected nodes at each depth (from 1) of a :meth:`DraftTree.sampled_shape`.

    A selection closed under parents selects depths 1..d without a gap: a node below
    depth 1 hangs from the chain node one depth up.
    """
    counts = np.bincount(tree.depth[selected], minlength=1)[1:]
    return counts.tolist()


def check_first_call(run, eos, *, called, draft, target) -> None:
    """The checks that wait for a model's first answer, when its vocabulary is known.

    The prompt and ``eos`` against the vocabulary of the model just ``called`` (the
    draft or the target), and the two models' vocabularies against each other when
    both are known (declared, or the other model called first).  The one place for
    them: the draft model's first call (here) and the target's (``_loop``).
    """
    if draft is not None and draft.vocab_size is not None and target.vocab_size is not None:
        check_same_vocab(draft.vocab_size, target.vocab_size)
    check_token_range(run.prompt, eos, called.vocab_size)


def draft_from_model(
    draft,
    run,
    *,
    start: int,
    max_tokens: int,
    p_min: float,
    target,
    verifier,
    controls,
    rng,
    work,
    eos,
    levels=None,
) -> tuple[int, StreamBuffers, np.dtype | None, list]:
    """Sample up to ``max_tokens`` draft tokens from the draft model into the run's buffer.

    Each token's law and weights go to the workspace's draft rows of the draft's dtype
    (row i for chain token i).  Stops early at ``eos`` and, with ``p_min``, at a token
    whose row's top probability is below it (that token is dropped).

    ``levels`` (nodes to draw at each depth, ``max_tokens`` of them) makes a tree: the
    first token of a depth continues the chain, the others are its siblings, drawn from
    the same row into draft rows ``max_tokens`` onwards, in order.

    Returns the number of chain tokens drafted, the workspace (made at the first draft
    row, when the vocabulary is known), the draft rows' dtype (None if no row was read)
    and the siblings' tokens, a list per depth drafted ([] without ``levels``).
    """
    n_draft = 0
    dtype = None
    siblings: list = []
    n_rows = max_tokens + (sum(levels) - len(levels) if levels else 0)
    next_slot = max_tokens
    ids = run.ids
    while n_draft < max_tokens:
        position = start + n_draft
        row = draft.last_rows(ids[:, :position], 1)[0]
        if dtype is None:  # this step's first row
            if work is None:  # the first model call: the vocabulary is known
                check_first_call(run, eos, called=draft, draft=draft, target=target)
                work = verifier.workspace(draft.vocab_size)
            elif draft.calls == 1:  # the target went first and made the workspace
                _check_draft_row(row, work)
            # one dtype per model (ModelCaller checks it): one reservation per step
            dtype = row.dtype
            laws, weights = work.draft_slots(n_rows, dtype)
            name_row = draft.name_row
        token = verifier.sample_to(
            row, laws[n_draft], weights[n_draft], controls, rng, work, name_row, position - 1
        )
        if p_min > 0.0 and controls.temperature > 0.0:
            if float(weights[n_draft].max()) / laws[n_draft][0]["total"] < p_min:
                break
        run.tokens[position] = token
        if levels:
            drawn = []
            for _ in range(levels[n_draft] - 1):
                drawn.append(
                    verifier.sample_to(
                        row,
                        laws[next_slot],
                        weights[next_slot],
                        controls,
                        rng,
                        work,
                        name_row,
                        position - 1,
                    )
                )
                next_slot += 1
            siblings.append(drawn)
        n_draft += 1
        if token == eos:
            break
    return n_draft, work, dtype, siblings


def sampled_tree(chain_ids: np.ndarray, siblings: list, first_sibling_row: int):
    """The tree of a chain and its siblings, and each node's draft row.

    Nodes: the chain first (node i at depth i + 1, draft row i), then the siblings depth
    by depth (draft rows ``first_sibling_row`` onwards, in the order
    :func:`draft_from_model` wrote them: its ``max_tokens``).  Returns ``(tree, rows)``.
    """
    n = len(chain_ids)
    tokens = [int(t) for t in chain_ids]
    parents = list(range(-1, n - 1))
    rows = list(range(n))
    row = first_sibling_row
    for depth, drawn in enumerate(siblings):
        for token in drawn:
            tokens.append(token)
            parents.append(depth - 1)
            rows.append(row)
            row += 1
    tree = DraftTree(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))
    return tree, np.array(rows, dtype=np.int64)
