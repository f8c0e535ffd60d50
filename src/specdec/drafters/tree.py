"""A step's candidate continuations merged into a token tree.

A drafter may know several continuations of the sequence (prompt lookup: what followed
each earlier occurrence of the last n-gram; a suffix tree: its branches).  Scored in one
target pass as a tree, they keep more tokens per pass than the best single one when it
is often wrong early.  :class:`DraftTree` merges the candidates, best first, into a
trie: shared prefixes become one path, and a node's children are distinct tokens in the
order of the candidates they come from, which is the order verification tries them in
(:func:`specdec.verify_tree`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DraftTree"]


class DraftTree:
    """Candidate continuations as a token tree, nodes numbered parents first.

    Parameters
    ----------
    tokens, parents : numpy.ndarray of int64, shape (N,)
        Each node's token and its parent (-1 for a child of the root, else an earlier
        node), as :func:`specdec.verify_tree` takes them.

    Attributes
    ----------
    tokens, parents : numpy.ndarray of int64, shape (N,)
    depth : numpy.ndarray of int64, shape (N,)
        A node's position in its branch, from 1 (a child of the root).
    rank : numpy.ndarray of int64, shape (N,)
        A node's index among its parent's children, from 0 (the order they are tried
        in: rank 0 continues the best candidate through that node).

    Examples
    --------
    >>> tree = DraftTree.from_candidates([[5, 6, 7], [5, 8], [9]])
    >>> tree.tokens.tolist(), tree.parents.tolist(), tree.rank.tolist()
    ([5, 6, 7, 8, 9], [-1, 0, 1, 0, -1], [0, 0, 0, 1, 1])
    """

    __slots__ = ("tokens", "parents", "depth", "rank")

    def __init__(self, tokens: np.ndarray, parents: np.ndarray) -> None:
        self.tokens = tokens
        self.parents = parents
        n = len(tokens)
        depth = np.zeros(n, dtype=np.int64)
        rank = np.zeros(n, dtype=np.int64)
        children = np.zeros(n + 1, dtype=np.int64)  # children so far, of node i - 1
        for i, parent in enumerate(parents.tolist()):
            depth[i] = 1 if parent < 0 else depth[parent] + 1
            rank[i] = children[parent + 1]
            children[parent + 1] += 1
        self.depth, self.rank = depth, rank

    @classmethod
    def from_candidates(cls, candidates) -> DraftTree:
        """Merge candidate continuations (best first) into a tree.

        Parameters
        ----------
        candidates : sequence of sequences of int
            Continuations of the sequence, best first; shared prefixes are merged, and
            a candidate that adds nothing (a prefix of an earlier one) adds no node.

        Returns
        -------
        DraftTree
        """
        tokens: list = []
        parents: list = []
        child_of: dict = {}  # (parent, token) -> node
        for candidate in candidates:
            node = -1
            for token in np.asarray(candidate, dtype=np.int64).tolist():
                child = child_of.get((node, token))
                if child is None:
                    child = child_of[(node, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = child
        return cls(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64))

    @classmethod
    def sampled_shape(cls, depth: int, width: int) -> DraftTree:
        """The shape of a draft model's tree before its tokens are drawn (tokens -1).

        A chain of ``depth`` nodes (nodes ``0 .. depth - 1``), then at each depth
        ``width - 1`` siblings of that depth's chain node, drawn from the same draft law
        (leaves).  The decoder asks the policy which nodes to verify before it samples
        any: a choice that saw the drawn tokens would change the output law.

        Parameters
        ----------
        depth : int >= 0
        width : int >= 1
            Nodes per depth.

        Returns
        -------
        DraftTree

        Examples
        --------
        >>> DraftTree.sampled_shape(2, 2).parents.tolist()
        [-1, 0, -1, 0]
        """
        chain = np.arange(-1, depth - 1, dtype=np.int64)
        siblings = np.repeat(chain, width - 1)
        parents = np.concatenate([chain, siblings])
        return cls(np.full(len(parents), -1, dtype=np.int64), parents)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """True when no node has two children (one candidate path)."""
        return bool(np.all(self.rank == 0))

    def subtree(self, keep: np.ndarray) -> DraftTree:
        """The tree of the nodes where ``keep`` is true, renumbered in the same order.

        ``keep`` must be closed under parents (checked): a kept node's parent is kept.
        """
        keep = np.asarray(keep, dtype=bool)
        index = np.cumsum(keep) - 1  # new index of each kept node
        parents = self.parents[keep]
        has_parent = parents >= 0
        if not np.all(keep[parents[has_parent]]):
            raise ValueError("a tree's selection must keep every selected node's parent")
        new_parents = np.where(has_parent, index[np.maximum(parents, 0)], -1)
        return DraftTree(self.tokens[keep].copy(), new_parents.astype(np.int64))

    def __repr__(self) -> str:
        return f"DraftTree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()})"
