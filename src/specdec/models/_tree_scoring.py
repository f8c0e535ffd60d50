"""Scoring a tree of candidate tokens with a target model: the rows ``verify_tree`` reads.

A tree of ``N`` nodes after a prefix (``token_ids``, ``parents`` as in
:func:`specdec.verify_tree`) needs ``N + 1`` rows of target logits: row 0 after the
prefix (the root), row ``i + 1`` after node ``i`` (the prefix followed by the path
from the root to node ``i``).  :func:`score_tree` returns them.  An adapter that can
score the whole tree in one pass defines ``forward_tree(prefix_ids, token_ids,
parents)``; any other model is scored *branch by branch*: one ``forward`` call per
leaf, over the prefix and that leaf's path, reading the rows of the path's nodes.
That is exact but slower than one pass (a tree with ``b`` leaves costs ``b`` target
passes; a prefix-cached adapter re-evaluates only each branch's tokens past the
longest prefix it shares with the branch before).

After scoring, the model's cache may hold any branch; the next ordinary
``forward`` call over the kept sequence rolls it back to the common prefix, as it
does after a rejected chain.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from specdec.drafters._checks import check_ids

__all__ = ["check_tree", "node_paths", "score_tree", "score_tree_by_branches", "tree_arguments"]


def check_tree(token_ids: Any, parents: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a tree's arrays (shapes, dtypes, parent order) and return them as int64."""
    tokens = np.asarray(token_ids)
    par = np.asarray(parents)
    if tokens.ndim != 1 or par.ndim != 1 or tokens.shape != par.shape:
        raise ValueError(
            f"token_ids and parents must be 1-D of the same length, got shapes "
            f"{tokens.shape} and {par.shape}"
        )
    if tokens.size and tokens.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {tokens.dtype}")
    if par.size and par.dtype.kind not in "iu":
        raise TypeError(f"parents must be integers, got dtype {par.dtype}")
    tokens = tokens.astype(np.int64, copy=False)
    par = par.astype(np.int64, copy=False)
    index = np.arange(par.shape[0])
    bad = np.flatnonzero((par < -1) | (par >= index))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"parents[{i}] = {int(par[i])} must be -1 or a node index smaller than {i}"
        )
    return tokens, par


def tree_arguments(prefix_ids: Any, token_ids: Any, parents: Any, vocab_size: int | None = None):
    """The checked arguments of a tree scoring: ``(prefix, tokens, parents, paths)``.

    ``prefix`` is the 1-D int64 sequence before the tree (at least one token), ``tokens``
    and ``parents`` as :func:`check_tree` returns them, ``paths`` each node's path
    (:func:`node_paths`).  With ``vocab_size``, every id must lie in ``[0, vocab_size)``
    (an adapter that writes them into its own batch checks them here).
    """
    tokens, par = check_tree(token_ids, parents)
    prefix = np.asarray(prefix_ids)
    if not (prefix.ndim == 1 or (prefix.ndim == 2 and prefix.shape[0] == 1)):
        raise ValueError(f"prefix_ids must have shape (L,) or (1, L), got {prefix.shape}")
    if prefix.size == 0:
        raise ValueError("prefix_ids must contain at least one token")
    if prefix.dtype.kind not in "iu":
        raise TypeError(f"prefix_ids must be integers, got dtype {prefix.dtype}")
    prefix = prefix.reshape(-1).astype(np.int64, copy=False)
    if vocab_size is not None:
        check_ids(prefix, "prefix_ids", vocab_size)
        check_ids(tokens, "token_ids", vocab_size)
    return prefix, tokens, par, node_paths(par)


def _last_rows(model: Any, seq: np.ndarray, n_rows: int) -> np.ndarray:
    """``model.forward(seq)``'s last ``n_rows`` rows, asking only for them when it can."""
    try:
        takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        takes_keep = False
    if takes_keep:
        out = model.forward(seq, logits_to_keep=n_rows)
    else:
        out = model.forward(seq)
    return np.asarray(out)[0, -n_rows:]


def node_paths(parents: Any) -> list[list[int]]:
    """Each node's path from the root: the node indices from a child of the root to it.

    Parameters
    ----------
    parents : array_like of int, shape (N,)
        Each node's parent index, -1 for a child of the root, smaller than the node's.

    Returns
    -------
    list of list of int
        ``paths[i]`` ends with ``i``.
    """
    paths: list[list[int]] = []
    for i, p in enumerate(np.asarray(parents, dtype=np.int64).tolist()):
        paths.append([i] if p < 0 else paths[p] + [i])
    return paths


def score_tree_by_branches(model: Any, prefix_ids: Any, token_ids: Any, parents: Any) -> np.ndarray:
    """Score a tree through ``model.forward``, one call per leaf (slower than one pass).

    Parameters
    ----------
    model : object
        Has ``forward(ids, logits_to_keep=None)`` returning ``(1, n, V)`` logits.
    prefix_ids : array_like of int, shape (L,) or (1, L)
        The sequence before the tree, at least one token.
    token_ids, parents : array_like of int, shape (N,)
        The tree, as in :func:`specdec.verify_tree`.

    Returns
    -------
    numpy.ndarray
        float32 ``(N + 1, V)``: row 0 after the prefix, row ``i + 1`` after node ``i``.
    """
    prefix, tokens, par, paths = tree_arguments(prefix_ids, token_ids, parents)
    n = tokens.shape[0]
    if n == 0:
        return _last_rows(model, prefix[None, :], 1).astype(np.float32)
    is_parent = np.zeros(n, dtype=bool)
    is_parent[par[par >= 0]] = True
    rows: np.ndarray | None = None
    for leaf in np.flatnonzero(~is_parent).tolist():
        path = paths[leaf]
        seq = np.concatenate([prefix, tokens[path]])[None, :]
        out = _last_rows(model, seq, len(path) + 1)
        if rows is None:
            rows = np.empty((n + 1, out.shape[-1]), dtype=np.float32)
        rows[0] = out[0]  # the same root row for every branch
        rows[np.asarray(path) + 1] = out[1:]
    assert rows is not None
    return rows


def score_tree(model: Any, prefix_ids: Any, token_ids: Any, parents: Any) -> np.ndarray:
    """The target rows of a tree: one pass when the model has ``forward_tree``, else by branches.

    Parameters
    ----------
    model : object
        A model with ``forward``; its ``forward_tree(prefix_ids, token_ids, parents)``
        is used when present.
    prefix_ids : array_like of int, shape (L,) or (1, L)
        The sequence before the tree.
    token_ids, parents : array_like of int, shape (N,)
        The tree, as in :func:`specdec.verify_tree`.

    Returns
    -------
    numpy.ndarray
        float32 ``(N + 1, V)``: row 0 after the prefix, row ``i + 1`` after node ``i``.
    """
    forward_tree = getattr(model, "forward_tree", None)
    if forward_tree is not None:
        return forward_tree(prefix_ids, token_ids, parents)
    return score_tree_by_branches(model, prefix_ids, token_ids, parents)
