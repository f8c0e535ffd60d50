"""The one verification step: a backend's kernels behind keyword-only calls.

The decoder (drafts from a draft model or from drafters) and the engine API
(:func:`specdec.verify`, :func:`specdec.verify_batch`, :func:`specdec.verify_tree`:
rows the caller computed) verify through a :class:`Verifier`, which owns what both
need and neither should repeat:

* the draft record, :class:`Draft`: the drafted ids and, for drafts sampled from a
  law, that law (each row's weights and its ``LAW_DTYPE`` record, as ``sample_token``
  and ``row_laws`` write them); none for deterministic proposals (one-hot drafts); the
  nodes' parents for a tree;
* the buffers, :class:`StreamBuffers`: the kernels' scratch for one vocabulary and the
  draft rows' weights and laws, grown as drafts get longer;
* the translation of a kernel's :class:`~specdec._common.InvalidLogitsError` (a row
  index within the block the kernel was given) into the caller's ``ValueError``, worded
  by a *row namer* that knows what the row is to the user (a model's position, an
  argument's index).

Tree verification extends the same record (``parents``) and the same calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from specdec._backend import backend_name, kernels_for
from specdec._common import LAW_DTYPE, InvalidLogitsError

__all__ = ["Draft", "RowNamer", "Verifier", "StreamBuffers", "verifier_for"]

#: ``namer(row, reason) -> message``: the user's error for row ``row``: the kernel's
#: row index within the block it was given, plus the call's ``first_row``.
RowNamer = Callable[[int, str], str]


class Draft(NamedTuple):
    """One step's draft, as the kernels verify it.

    Attributes
    ----------
    ids : numpy.ndarray of int64, shape (n,)
        The drafted tokens (a chain), or the nodes' tokens (a tree).
    weights : numpy.ndarray, shape (>= n, V), or None
        Row i: the unnormalised weights of the law draft token i was drawn from; None
        for deterministic proposals (one-hot drafts).
    laws : numpy.ndarray of LAW_DTYPE, shape (>= n,), or None
        The laws that came with ``weights`` (q_i = weights[i] / laws[i]["total"]).
    parents : numpy.ndarray of int64, shape (n,), or None
        For a tree, each node's parent (-1 for a child of the root, else an earlier
        node); None for a chain.
    """

    ids: np.ndarray
    weights: np.ndarray | None = None
    laws: np.ndarray | None = None
    parents: np.ndarray | None = None

    @property
    def one_hot(self) -> bool:
        """True for deterministic proposals (no draft law)."""
        return self.weights is None


class StreamBuffers:
    """The buffers of one verification stream: kernel scratch and draft rows.

    Parameters
    ----------
    kernels : module
        The backend's kernel module.
    vocab_size : int
        Logits per row.

    Notes
    -----
    The draft rows' buffers grow geometrically (so memory follows the longest draft
    used, not ``gamma`` times the vocabulary up front), one per dtype; a grown buffer
    does not keep the old rows.
    """

    __slots__ = ("vocab_size", "kernel_work", "_laws", "_weights", "_slots", "_path")

    def __init__(self, kernels, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.kernel_work = kernels.Workspace(vocab_size)
        self._laws = np.zeros(0, LAW_DTYPE)
        self._weights: dict = {}
        self._slots: dict = {}  # dtype -> per-row views of the current buffers
        self._path = np.zeros(0, dtype=np.int64)

    def draft_rows(self, rows: int, dtype) -> tuple[np.ndarray, np.ndarray]:
        """``(laws, weights)`` with room for at least ``rows`` draft rows of ``dtype``.

        The whole buffers are returned (longer than ``rows`` when they have grown
        before); their contents are undefined until a kernel writes them.
        """
        if len(self._laws) < rows:
            self._laws = np.zeros(max(rows, 2 * len(self._laws), 4), LAW_DTYPE)
            self._slots.clear()  # views of the old laws
        weights = self._weights.get(dtype)
        if weights is None or len(weights) < rows:
            capacity = max(rows, 0 if weights is None else 2 * len(weights), 4)
            weights = self._weights[dtype] = np.empty((capacity, self.vocab_size), dtype)
            self._slots.pop(dtype, None)
        return self._laws, weights

    def draft_slots(self, rows: int, dtype) -> tuple[list, list]:
        """Per-row views of :meth:`draft_rows`: ``laws[i:i+1]`` and ``weights[i]`` for each i.

        Kept until the buffers grow, so that drawing a draft token (once per token of a
        draft model) writes its law and weights without making two views.
        """
        slots = self._slots.get(dtype)
        if slots is None or len(slots[0]) < rows:
            laws, weights = self.draft_rows(rows, dtype)
            n = min(len(laws), len(weights))
            slots = self._slots[dtype] = ([laws[i : i + 1] for i in range(n)], list(weights[:n]))
        return slots

    def path(self, nodes: int) -> np.ndarray:
        """An int64 buffer for a tree walk over ``nodes`` nodes."""
        if len(self._path) < nodes:
            self._path = np.zeros(max(nodes, 2 * len(self._path), 16), dtype=np.int64)
        return self._path


class Verifier:
    """A backend's kernels, called by keyword, with one error translation.

    Parameters
    ----------
    backend : {"cython", "python"} or None
        The kernel backend; None is :data:`specdec.BACKEND`.

    Attributes
    ----------
    backend : str
        ``"cython"`` or ``"python"``.
    kernels : module
        The backend's kernel module (``specdec._core`` or ``specdec._fallback``).
    """

    __slots__ = ("backend", "kernels", "_local")

    def __init__(self, backend: str | None = None) -> None:
        self.kernels = kernels_for(backend)
        self.backend = backend_name(self.kernels)
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"Verifier(backend={self.backend!r})"

    # -- buffers -------------------------------------------------------------------------

    def workspace(self, vocab_size: int) -> StreamBuffers:
        """New buffers for ``vocab_size`` logits per row (one decoding run's own)."""
        return StreamBuffers(self.kernels, vocab_size)

    def thread_workspace(self, vocab_size: int) -> StreamBuffers:
        """The calling thread's buffers for ``vocab_size`` (kept between calls).

        For calls that run no user code between writing and reading them (the engine
        API).  The decoder gives each run its own :meth:`workspace` instead: a model's
        ``forward`` runs between drafting and verifying and may itself decode on this
        thread.
        """
        work = getattr(self._local, "workspace", None)
        if work is None or work.vocab_size != vocab_size:
            work = self._local.workspace = StreamBuffers(self.kernels, vocab_size)
        return work

    # -- the kernels ---------------------------------------------------------------------

    def sample(
        self,
        row,
        *,
        slot: int,
        controls,
        rng,
        workspace: StreamBuffers,
        name_row: RowNamer,
        first_row: int = 0,
    ) -> int:
        """Draw one token from ``row``; its law and weights go to draft row ``slot``.

        The rows are reserved here if they were not (``workspace.draft_rows``).
        """
        laws, weights = workspace.draft_slots(slot + 1, row.dtype)
        return self.sample_to(
            row, laws[slot], weights[slot], controls, rng, workspace, name_row, first_row
        )

    def sample_to(
        self, row, law_slot, weights_row, controls, rng, workspace, name_row, first_row
    ) -> int:
        """:meth:`sample` into views of reserved draft rows (``workspace.draft_slots``).

        Positional, for the draft model's loop, which calls it once per token.
        """
        try:
            return self.kernels.sample_token(
                row, controls, rng, law_slot, weights_row, workspace.kernel_work
            )
        except InvalidLogitsError as error:
            raise ValueError(name_row(first_row + error.row, error.reason)) from None

    def draft_of_rows(
        self,
        ids,
        rows,
        *,
        controls,
        workspace: StreamBuffers,
        name_row: RowNamer,
        first_row: int = 0,
        parents=None,
    ) -> Draft:
        """The draft record of ids drawn from the laws of logits ``rows`` (n, V).

        Draws nothing (``row_laws``): for drafts sampled elsewhere, whose logits the
        caller has.
        """
        n = len(rows)
        laws, weights = workspace.draft_rows(n, rows.dtype)
        try:
            self.kernels.row_laws(rows, controls, laws[:n], weights[:n], workspace.kernel_work)
        except InvalidLogitsError as error:
            raise ValueError(name_row(first_row + error.row, error.reason)) from None
        return Draft(ids, weights, laws, parents)

    def verify(
        self,
        target_rows,
        draft: Draft,
        *,
        bonus: bool,
        block: bool,
        controls,
        rng,
        workspace: StreamBuffers,
        name_row: RowNamer,
        first_row: int = 0,
    ) -> tuple[int, int]:
        """Verify a chain of drafts against the target's ``n + 1`` rows.

        Returns ``(n_kept, token)``: the kept prefix's length and the token drawn after
        it (-1 when every draft was kept and ``bonus`` is false).  ``block``: block
        verification (Sun et al. 2025) instead of token by token.
        """
        try:
            return self.kernels.verify(
                target_rows,
                draft.ids,
                draft.weights,
                draft.laws,
                bonus,
                controls,
                rng,
                workspace.kernel_work,
                block,
            )
        except InvalidLogitsError as error:
            raise ValueError(name_row(first_row + error.row, error.reason)) from None

    def verify_tree(
        self,
        target_rows,
        draft: Draft,
        *,
        controls,
        rng,
        workspace: StreamBuffers,
        name_row: RowNamer,
        first_row: int = 0,
    ) -> tuple[np.ndarray, int]:
        """Verify a tree of drafts (``draft.parents``) against the target's ``n + 1`` rows.

        Returns ``(path, token)``: the kept nodes' indices, root to leaf (a view of the
        workspace's buffer, valid until its next tree walk), and the token drawn after
        the last kept node.
        """
        n = len(draft.ids)
        path = workspace.path(n)
        try:
            depth, token = self.kernels.verify_tree(
                target_rows,
                draft.ids,
                draft.parents,
                draft.weights,
                draft.laws,
                controls,
                rng,
                workspace.kernel_work,
                path,
            )
        except InvalidLogitsError as error:
            raise ValueError(name_row(first_row + error.row, error.reason)) from None
        return path[:depth], int(token)


_verifiers: dict = {}


def verifier_for(backend: str | None) -> Verifier:
    """The process's :class:`Verifier` of ``backend`` (None: the default backend)."""
    if backend is not None and type(backend) is not str:
        kernels_for(backend)  # refused by name (an unhashable value must not reach the dict)
    verifier = _verifiers.get(backend)
    if verifier is None:
        verifier = Verifier(backend)
        _verifiers[backend] = _verifiers[verifier.backend] = verifier
    return verifier
