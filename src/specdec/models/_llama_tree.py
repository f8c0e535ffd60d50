"""A llama.cpp adapter that scores a tree of candidates in one pass (one ``llama_batch``).

Each node of the tree goes into the batch once, at the position of its depth after
the prefix, carrying the sequence id of every branch (root-to-leaf path) it lies on;
the prefix's tokens not yet in the cache carry every branch's id.  llama.cpp then
lets each node attend to its own ancestors only, and every row is exactly the row of
evaluating its branch as a plain sequence.  After the pass the cache keeps one
branch (sequence 0, the one reached by first children), so the next ``forward``
over the kept sequence reuses what it shares with that branch.

The cost: a llama.cpp context takes several sequences only when created with
``n_seq_max > 1``, which ``llama_cpp.Llama`` (0.3.x) sets only for embedding models;
so this adapter creates a context of its own from the Llama object's model and
context parameters (``n_seq_max=tree_width``, ``kv_unified=True`` so that the
branches share the ``n_ctx`` cells) and evaluates everything there.  The Llama
object's own context stays allocated but unused: one more KV cache in memory
(SmolLM2-135M: about 23 KB per cell of ``n_ctx``).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from specdec.models._cached import common_prefix_length
from specdec.models._calibration import check_cost_curve
from specdec.models._tree_scoring import score_tree_by_branches, tree_arguments
from specdec.models.llama_cpp import LlamaCppModel

__all__ = ["LlamaCppTreeModel"]


class LlamaCppTreeModel(LlamaCppModel):
    """:class:`LlamaCppModel` with ``forward_tree``: a tree of candidates in one pass.

    Parameters
    ----------
    llama_or_model_path : str or llama_cpp.Llama
        As for :class:`LlamaCppModel`.
    tree_width : int, default 8
        Most branches (leaves) a tree may have to be scored in one pass; wider trees
        are scored branch by branch.
    tree_cost_curve : array_like of float, optional
        Time of a tree pass over ``i + 1`` tokens (the last token and ``i`` nodes)
        relative to one token; given, it replaces the calibration of
        :attr:`tree_cost_curve`.
    **kwargs
        As for :class:`LlamaCppModel`.
    """

    def __init__(
        self,
        llama_or_model_path: Any,
        *,
        tree_width: int = 8,
        tree_cost_curve: Any = None,
        **kwargs: Any,
    ) -> None:
        if int(tree_width) < 1:
            raise ValueError(f"tree_width must be at least 1, got {tree_width}")
        if tree_cost_curve is not None:
            tree_cost_curve = check_cost_curve(tree_cost_curve, "tree_cost_curve")
        super().__init__(llama_or_model_path, **kwargs)
        self._tree_cost_curve = tree_cost_curve
        lib = self._llama_cpp
        llama = self.llama
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        params.n_seq_max = int(tree_width)
        params.kv_unified = True
        ctx = lib.llama_init_from_model(llama.model, params)
        if ctx is None:
            raise RuntimeError("llama.cpp could not create a context for tree scoring")
        self._own_ctx = ctx
        self._ctx_finalizer = weakref.finalize(self, lib.llama_free, ctx)
        self.tree_width = int(lib.llama_n_seq_max(ctx))
        capacity = int(llama.n_batch)
        self._tree_batch = lib.llama_batch_init(capacity, 0, self.tree_width)
        self._tree_batch_finalizer = weakref.finalize(self, lib.llama_batch_free, self._tree_batch)
        # The record of what this context's cache holds: its own, since the Llama
        # object's (input_ids, n_tokens) records llama.ctx, which another adapter on
        # the same Llama may be using.
        self._record = _CacheRecord(len(llama.input_ids))

    @property
    def _context(self) -> Any:
        return self._own_ctx

    def forward_tree(self, prefix_ids: Any, token_ids: Any, parents: Any) -> np.ndarray:
        """Target rows of a tree after ``prefix_ids`` in one pass.

        Parameters
        ----------
        prefix_ids : array_like of int, shape (L,) or (1, L)
            The sequence before the tree, at least one token.
        token_ids, parents : array_like of int, shape (N,)
            The tree, as in :func:`specdec.verify_tree`.

        Returns
        -------
        numpy.ndarray
            float32 ``(N + 1, V)``: row 0 after the prefix, row ``i + 1`` after node ``i``.
        """
        prefix, tokens, par, paths = tree_arguments(prefix_ids, token_ids, parents, self.vocab_size)
        n = tokens.shape[0]
        if n == 0:
            return self.forward(prefix[None, :], logits_to_keep=1)[0]
        depth = np.array([len(p) for p in paths])
        length = prefix.shape[0]
        self._check_fits(length + int(depth.max()))
        is_parent = np.zeros(n, dtype=bool)
        is_parent[par[par >= 0]] = True
        leaves = np.flatnonzero(~is_parent).tolist()
        # Sequence 0 is the branch of first children: the one the cache keeps.
        first = 0
        while is_parent[first]:
            first = int(np.flatnonzero(par == first)[0])
        leaves.remove(first)
        leaves.insert(0, first)
        n_common = common_prefix_length(prefix, self._cached_ids())
        self._roll_back(min(n_common, length - 1))
        start = int(self._cached_ids().shape[0])
        total = length - start + n
        if (
            len(leaves) > self.tree_width
            or total > self._tree_batch_capacity()
            or length + n > self._n_ctx  # the branches share the n_ctx cells (kv_unified)
        ):
            return score_tree_by_branches(self, prefix, tokens, par)
        if not self._first_use_done:
            self._first_use_done = True
            self._first_use()
        lib = self._llama_cpp
        ctx = self._own_ctx
        mem = lib.llama_get_memory(ctx)
        for seq in range(1, len(leaves)):  # the cached prefix belongs to every branch
            lib.llama_memory_seq_cp(mem, 0, seq, -1, -1)
        members: list[list[int]] = [[] for _ in range(n)]
        for seq, leaf in enumerate(leaves):
            for node in paths[leaf]:
                members[node].append(seq)
        batch = self._tree_batch
        every = list(range(len(leaves)))
        entries = [
            (int(t), start + i, every, i == length - 1 - start)
            for i, t in enumerate(prefix[start:].tolist())
        ]
        entries += [
            (int(tokens[i]), length + int(depth[i]) - 1, members[i], True) for i in range(n)
        ]
        for i, (token, pos, seqs, wanted) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = 1 if wanted else 0
        batch.n_tokens = total
        try:
            code = lib.llama_decode(ctx, batch)
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code} for a tree of {n} nodes")
            # The n + 1 outputs (the prefix's last token, then the nodes) in batch
            # order: one view of llama.cpp's buffer (a view per row cost about 30 us
            # each right after the decode).
            rows = self._batch.logits(ctx, n + 1, self.vocab_size).copy()
            lib.llama_memory_seq_keep(mem, 0)
            # The record: the prefix, then the kept branch (see LlamaCppModel).
            record = self._record
            kept = paths[first]
            record.input_ids[start:length] = prefix[start:]
            record.input_ids[length : length + len(kept)] = tokens[kept]
            record.n_tokens = length + len(kept)
        except BaseException:
            # Ctrl-C lands as llama_decode returns, before the record: drop the entries
            # the record does not hold (see LlamaCppModel._evaluate).
            self._drop_unrecorded()
            raise
        self.n_forward_calls += 1
        self.n_evaluated_tokens += total
        return rows

    def _tree_batch_capacity(self) -> int:
        return int(self.llama.n_batch)


class _CacheRecord:
    """The tokens a context's cache holds, as ``llama_cpp.Llama`` records its own."""

    __slots__ = ("input_ids", "n_tokens")

    def __init__(self, n_ctx: int) -> None:
        self.input_ids = np.zeros(n_ctx, dtype=np.intc)
        self.n_tokens = 0

    def reset(self) -> None:
        """Record an empty cache."""
        self.n_tokens = 0
