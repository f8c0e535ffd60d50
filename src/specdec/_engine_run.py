"""Running a validated engine step: one sequence's verification, and the thread pool.

:func:`verify_one` verifies one sequence of a :class:`~specdec._engine_inputs.Step` on the
calling thread, with that thread's :class:`Scratch` (kernel workspace and draft buffers,
kept per backend and vocabulary); :func:`run` spreads a batch over the module's pool.
Kernel errors (:class:`~specdec._common.InvalidLogitsError`) become ``ValueError``s
naming the sequence and row.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._engine_inputs import Step


class Scratch:
    """One thread's kernel workspace and draft buffers, for one backend and vocabulary."""

    def __init__(self, kernels, vocab: int):
        self.work = kernels.Workspace(vocab)
        self.vocab = vocab
        self.laws = np.zeros(0, LAW_DTYPE)
        self.weights = {}

    def buffers(self, rows: int, dtype):
        """(laws, weights) with room for ``rows`` draft rows of ``dtype``."""
        if len(self.laws) < rows:
            self.laws = np.zeros(rows, LAW_DTYPE)
        weights = self.weights.get(dtype)
        if weights is None or len(weights) < rows:
            weights = self.weights[dtype] = np.empty((rows, self.vocab), dtype)
        return self.laws[:rows], weights[:rows]


_local = threading.local()


def thread_scratch(kernels, vocab: int) -> Scratch:
    """Get this thread's scratch for ``kernels`` at ``vocab`` (one per backend is kept)."""
    kept = getattr(_local, "scratch", None)
    if kept is None:
        kept = _local.scratch = {}
    scratch = kept.get(kernels.__name__)
    if scratch is None or scratch.vocab != vocab:
        scratch = kept[kernels.__name__] = Scratch(kernels, vocab)
    return scratch


def row_name(step: Step, name: str, b: int, i: int) -> str:
    """How an error names row i of sequence b of argument ``name``."""
    return f"{name}[{i}]" if step.single else f"{name}[{b}, {i}] (sequence {b}, row {i})"


def draft_law(step: Step, b: int, n: int, scratch: Scratch):
    """(weights, laws) of sequence b's n draft rows for the kernel; None, None if one-hot."""
    if step.kind is None or n == 0:
        return None, None
    rows = step.draft[b, :n]
    ids = step.ids[b, :n]
    greedy = step.controls.temperature == 0.0
    if step.kind == "logits":
        laws, weights = scratch.buffers(n, rows.dtype)
        try:
            step.kernels.row_laws(rows, step.controls, laws, weights, scratch.work)
        except InvalidLogitsError as error:
            raise ValueError(
                f"{row_name(step, 'draft', b, error.row)} holds {error.reason}"
            ) from error
        if not greedy:
            zero = weights[np.arange(n), ids] <= 0.0
            if zero.any():
                i = int(np.flatnonzero(zero)[0])
                raise ValueError(
                    f"{row_name(step, 'draft_token_ids', b, i)}: token {int(ids[i])} has "
                    "probability 0 under the draft's law (its logits under these sampling "
                    "controls), so it cannot have been drawn from it"
                )
        return weights, laws
    # probabilities, taken as given: finite, >= 0, positive mass, positive q(x)
    low = rows.min(axis=1)
    totals = rows.sum(axis=1, dtype=np.float64)
    bad = ~(low >= 0.0) | ~(totals < np.inf)  # NaN fails both comparisons
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{row_name(step, 'draft', b, i)} (draft_kind='probs') holds NaN, "
            "inf or a negative probability"
        )
    bad = ~(totals > 0.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{row_name(step, 'draft', b, i)} (draft_kind='probs') has no positive mass"
        )
    if not greedy:
        zero = rows[np.arange(n), ids] <= 0.0
        if zero.any():
            i = int(np.flatnonzero(zero)[0])
            raise ValueError(
                f"{row_name(step, 'draft_token_ids', b, i)}: token {int(ids[i])} has probability "
                "0 in draft (draft_kind='probs'), so it cannot have been drawn from it"
            )
    laws = np.zeros(n, LAW_DTYPE)
    laws["total"] = totals
    return rows, laws


def verify_one(step: Step, b: int) -> tuple[int, int]:
    """Verify sequence b on this thread; ValueError naming the row if one is invalid."""
    scratch = thread_scratch(step.kernels, step.target.shape[2])
    n = int(step.lengths[b])
    weights, laws = draft_law(step, b, n, scratch)
    try:
        return step.kernels.verify(
            step.target[b, : n + 1],
            step.ids[b, :n],
            weights,
            laws,
            True,
            step.controls,
            step.generators[b],
            scratch.work,
            step.block,
        )
    except InvalidLogitsError as error:
        raise ValueError(
            f"{row_name(step, 'target_logits', b, error.row)} holds {error.reason}"
        ) from error


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _submit(function, copies: int) -> list:
    """Run ``copies`` calls of ``function`` on the module's pool.

    The pool is created, or grown when a call asks for more threads than it has, under
    the lock: a pool being replaced still finishes what it was given.
    """
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < copies:
            old = _pool
            _pool_size = max(copies, (os.cpu_count() or 1) - 1, 1)
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="specdec-engine")
            if old is not None:
                old.shutdown(wait=False)
        return [_pool.submit(function) for _ in range(copies)]


def run(step: Step, n_threads: int, out_accepted, out_next) -> None:
    """Verify every sequence (on up to ``n_threads`` threads, this one included).

    Sequences are claimed in increasing order from one counter, and every sequence is
    verified even after another failed: so each generator advances as its own call
    would, and the error raised (the lowest failing sequence's) does not depend on the
    scheduling.
    """
    batch = len(step.ids)
    errors: dict[int, BaseException] = {}
    claim = itertools.count()  # next() is atomic under the GIL

    def work() -> None:
        for b in iter(claim.__next__, None):
            if b >= batch:
                return
            try:
                out_accepted[b], out_next[b] = verify_one(step, b)
            except Exception as error:
                errors[b] = error

    helpers = min(n_threads, batch) - 1
    futures = _submit(work, helpers) if helpers > 0 else []
    try:
        work()
    finally:
        for future in futures:
            future.result()
    if errors:
        raise errors[min(errors)]
