"""The tree half of the default policy: which nodes of a tree of candidates to verify.

:class:`TreeSelector` is a collaborator of
:class:`~specdec.drafters.PositionalDraftLength`: it extends the policy's per-position
acceptance model to trees of candidates, with one learnt acceptance per rank of
alternative (kept here), and learns from each verified tree.  It reaches the policy
only through :class:`ChainModel`, the policy's public methods and settings, passed to
each call (the selector holds no reference to it, so copies and pickles of the policy
stay independent).
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np

from specdec.drafters.length import NO_TALLY, shortest_near_best
from specdec.drafters.tree import DraftTree

__all__ = ["ChainModel", "TreeSelector"]


class ChainModel(Protocol):
    """What :class:`TreeSelector` needs of a policy's model of chains of drafts."""

    min_tokens: int
    prior_strength: float
    memory: float

    def acceptances(self, key, n: int) -> list:
        """Chance that draft token i is kept given the ones before, i = 1..n."""

    def best_length(self, key, offered: int) -> tuple:
        """``(n, rate)``: the chain length in [0, offered] the policy drafts, and its rate."""

    def tie_tolerance_at(self, key) -> float:
        """Fraction of the best rate within which the shortest choice is taken."""

    def probed(self, key, n_chosen: int) -> int:
        """``n_chosen``, or more when the policy wants a probe (see its ``length``)."""

    def pass_costs(self, n_max: int) -> tuple:
        """``(chain, tree)``: lists of the cost of a pass over 0..n_max drafts."""

    def cell_group(self, key) -> tuple:
        """The cells ``key`` learns in: ``(source, evidence bucket)``."""

    def learn(self, key, outcomes, offset_outcomes) -> None:
        """Record ``(position, success)`` outcomes (and teach the offset the others)."""


class TreeSelector:
    """Selects the nodes of trees of candidates to verify, and learns from each tree.

    What it learns (the alternatives' acceptance per rank) is kept on the selector;
    the chain's model (acceptance per position, cost curve, probes) is the policy's,
    given to each call as ``policy``.
    """

    #: Prior chance that an alternative of rank 1, 2, 3 (a node's second, third, fourth
    #: child in a tree of candidates) is kept, given that the children tried before it
    #: were rejected.  Measured on SmolLM2's recorded outputs with both drafters
    #: (``bench/replay_drafting.py``; every alternative verified): 0.15-0.19, 0.10-0.14
    #: and 0.07-0.16, greedy and at 0.7.  (An earlier 0.3 made a weak first candidate's
    #: alternatives look worth a 16-node tree that kept nothing.)
    PRIOR_ALTERNATIVES = (0.15, 0.1, 0.08)
    #: Alternatives of rank beyond this share the last cell.
    MAX_RANK = 3

    def __init__(self) -> None:
        self._cells: dict = {}  # (source, evidence bucket, rank) -> Tally

    def alternative(self, policy: ChainModel, key, rank: int) -> float:
        """Estimated chance that a rank-``rank`` child is kept, the earlier ones rejected.

        Parameters
        ----------
        policy : ChainModel
            The policy the selector serves.
        key : tuple (source, evidence)
            As for the policy's ``length``.
        rank : int >= 1
            The child's rank among its siblings.

        Returns
        -------
        float
        """
        cell = self._cells.get(self._cell(policy, key, rank))
        prior = self.PRIOR_ALTERNATIVES[min(rank, self.MAX_RANK) - 1]
        if cell is None:
            return prior
        strength = policy.prior_strength
        return (cell.kept + strength * prior) / (cell.tested + strength)

    def _cell(self, policy: ChainModel, key, rank: int) -> tuple:
        return policy.cell_group(key) + (min(rank, self.MAX_RANK),)

    def _conditionals(self, policy: ChainModel, key, tree: DraftTree) -> np.ndarray:
        """Each node's chance of being kept given its parent was and earlier siblings not."""
        chain = policy.acceptances(key, int(tree.depth.max()))
        return np.array(
            [
                chain[d - 1] if r == 0 else self.alternative(policy, key, r)
                for d, r in zip(tree.depth.tolist(), tree.rank.tolist(), strict=True)
            ]
        )

    def select(self, policy: ChainModel, key, tree: DraftTree, max_tokens: int) -> np.ndarray:
        """Which nodes of a tree of candidates to verify: the most expected tokens per cost.

        A node is kept with chance ``m(v)``: its parent's, times the chance that its
        earlier siblings are rejected, times its own conditional acceptance (a rank-0
        node's is the chain's ``a(depth)``; an alternative's, learnt per rank, starts at
        :attr:`PRIOR_ALTERNATIVES`).  A step verifying a set S emits ``1 + sum of m(v)``
        tokens in expectation for a pass over ``|S| + 1`` tokens; the nodes are added
        best first (a node only after its parent and its earlier siblings, the order
        verification tries them in), and the prefix of that order with the most
        expected tokens per unit of cost wins (the shortest within the policy's
        :meth:`~ChainModel.tie_tolerance_at` of it): for a chain, the policy's
        ``length``.
        A selection of the first candidate's first nodes is verified as a chain and
        costs a chain pass; any other costs a tree pass (the target's
        ``tree_cost_curve``, through the cost curve given to :meth:`start`), so
        alternatives are selected only where they pay for the dearer pass.

        Parameters
        ----------
        policy : ChainModel
            The policy the selector serves.
        key : tuple (source, evidence)
            As for the policy's ``length``.
        tree : DraftTree
            The candidates.
        max_tokens : int
            The most nodes to verify (the run's draft cap).

        Returns
        -------
        numpy.ndarray of bool, shape (N,)
            The selected nodes (closed under parents and earlier siblings); none
            selected is a plain step.
        """
        n_nodes = len(tree)
        selected = np.zeros(n_nodes, dtype=bool)
        budget = min(n_nodes, max_tokens)
        if budget <= 0:
            return selected
        c = self._conditionals(policy, key, tree)
        first_child = np.full(n_nodes + 1, -1, dtype=np.int64)  # of node i - 1
        next_sibling = np.full(n_nodes, -1, dtype=np.int64)
        last_child = np.full(n_nodes + 1, -1, dtype=np.int64)
        for i, parent in enumerate(tree.parents.tolist()):
            if first_child[parent + 1] < 0:
                first_child[parent + 1] = i
            else:
                next_sibling[last_child[parent + 1]] = i
            last_child[parent + 1] = i
        chain_costs, tree_costs = policy.pass_costs(budget)
        min_tokens = policy.min_tokens
        # frontier: (-m, node, chance that the parent is kept and the earlier siblings not)
        root = int(first_child[0])
        frontier = [(-c[root], root, 1.0)]
        order, best_n, best_rate, expected = [], 0, 1.0 / chain_costs[0], 1.0
        tolerance = policy.tie_tolerance_at(key)
        # (prefix length, rate) of the prefixes looked at: only for a tolerance
        rates = ([(0, best_rate)] if min_tokens == 0 else []) if tolerance else None
        depth, is_chain = tree.depth, True  # the order so far is nodes 0, 1, ...
        while frontier and len(order) < budget:
            negative_m, node, reach = heapq.heappop(frontier)
            order.append(node)
            expected -= negative_m
            n = len(order)
            # The first candidate's first nodes are verified as a chain (a cheaper pass).
            is_chain = is_chain and node == n - 1 and depth[node] == n
            rate = expected / (chain_costs[n] if is_chain else tree_costs[n])
            if n >= min_tokens:
                if rates is not None:
                    rates.append((n, rate))
                if rate > best_rate * (1.0 + 1e-9):
                    best_n, best_rate = n, rate
            child, sibling = int(first_child[node + 1]), int(next_sibling[node])
            if child >= 0:
                heapq.heappush(frontier, (negative_m * c[child], child, -negative_m))
            if sibling >= 0:
                rest = reach * (1.0 - c[node])
                heapq.heappush(frontier, (-rest * c[sibling], sibling, rest))
        if tolerance:  # near a tie, the shortest prefix (as the policy's chains)
            best_n, best_rate = shortest_near_best(rates, (best_n, best_rate), tolerance)
        if min_tokens and best_n < min(min_tokens, len(order)):
            best_n = min(min_tokens, len(order))
        chosen = order[:best_n]
        n_first = 0  # the first candidate's nodes: 0, 1, ... at depths 1, 2, ...
        while n_first < budget and depth[n_first] == n_first + 1:
            n_first += 1
        n_chain, chain_rate = policy.best_length(key, n_first)
        if n_chain and chain_rate > best_rate * (1.0 + 1e-9):
            # The order reached an alternative before the chain's best length, and a
            # tree pass costs more: the chain alone pays better.
            chosen = list(range(n_chain))
        n_chosen = policy.probed(key, len(chosen))
        if n_chosen > len(chosen):  # a probe: the first node
            chosen = order[:n_chosen]
        selected[chosen] = True
        return selected

    def observe(self, policy: ChainModel, key, tree: DraftTree, selected, path, next_token: int):
        """Learn from one verified tree.

        Parameters
        ----------
        policy : ChainModel
            The policy the selector serves (it learns the chain positions).
        key : tuple (source, evidence)
            As given to :meth:`select`.
        tree : DraftTree
            The candidates.
        selected : numpy.ndarray of bool
            :meth:`select`'s answer.
        path : sequence of int
            The kept nodes (indices in ``tree``), root to leaf.
        next_token : int
            The token drawn after the last kept node, -1 if it was not drawn (the
            output's end).

        Notes
        -----
        Every kept node is a success of its cell; the selected children of the last
        kept node (or of the root) were all tried and rejected; and the next token,
        drawn from the target's law without those, matches the first unselected child
        with exactly the chance that child would have been kept: a free observation
        (the chain's shadow).
        """
        outcomes = [(int(v), 1.0) for v in path]
        last = int(path[-1]) if len(path) else -1
        children = np.flatnonzero(tree.parents == last)  # in rank order
        for child in children.tolist():
            if selected[child]:
                outcomes.append((child, 0.0))
            else:
                if next_token >= 0:
                    outcomes.append((child, float(tree.tokens[child] == next_token)))
                break
        # the best candidate's chain (nodes 0, 1, ... at depths 1, 2, ...) teaches the
        # offset; every rank-0 node its position's cell; the others their rank's cell
        depth, rank = tree.depth, tree.rank
        chain, memory = [], policy.memory
        for node, success in outcomes:
            if rank[node] == 0:
                chain.append((int(depth[node]), success))
            else:
                cell = self._cell(policy, key, int(rank[node]))
                self._cells[cell] = self._cells.get(cell, NO_TALLY).add(success, 1.0, memory)
        offset = [(node + 1, success) for node, success in outcomes if depth[node] == node + 1]
        policy.learn(key, chain, offset)
