"""Running a validated engine step: one sequence's verification, and the thread pool.

:func:`verify_one` verifies one sequence of a :class:`~specdec._engine_inputs.VerifyInputs` on the
calling thread, through the step's :class:`~specdec._verifier.Verifier` and that
thread's workspace; :func:`run` spreads a batch over the module's pool, through the
compiled ``_BatchStep`` where it can (each thread's share in one stretch without the
GIL), else a sequence at a time.  Kernel errors become ``ValueError``s naming the
sequence and row (:func:`row_namer`).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext

import numpy as np

from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._engine_inputs import VerifyInputs
from specdec._verifier import Draft, RowNamer


def row_name(step: VerifyInputs, name: str, b: int, i: int) -> str:
    """How an error names row i of sequence b of argument ``name``."""
    return f"{name}[{i}]" if step.single else f"{name}[{b}, {i}] (sequence {b}, row {i})"


def row_namer(step: VerifyInputs, name: str, b: int) -> RowNamer:
    """The verifier's row namer for argument ``name`` of sequence b."""
    return lambda i, reason: f"{row_name(step, name, b, i)} holds {reason}"


def zero_draft_probability(step: VerifyInputs, b: int, i: int) -> str:
    """The error for draft token i of sequence b, of probability 0 under its draft logits."""
    return (
        f"{row_name(step, 'draft_token_ids', b, i)}: token {int(step.ids[b, i])} has "
        "probability 0 under the draft's law (its logits under these sampling "
        "controls), so it cannot have been drawn from it"
    )


def draft_law(step: VerifyInputs, b: int, n: int, ids: np.ndarray, parents=None) -> Draft:
    """Sequence b's draft record of its n drafts ``ids``, their law read from ``step.draft``.

    One-hot (no law) when the step has no draft rows; the logits' law is computed by
    the kernels (``row_laws``); probabilities are checked and taken as given.
    """
    if step.kind is None or n == 0:
        return Draft(ids, parents=parents)
    rows = step.draft[b, :n]
    greedy = step.controls.temperature == 0.0
    if step.kind == "logits":
        verifier = step.verifier
        draft = verifier.draft_of_rows(
            ids,
            rows,
            controls=step.controls,
            workspace=verifier.thread_workspace(rows.shape[1]),
            name_row=row_namer(step, "draft", b),
            parents=parents,
        )
        if not greedy:
            weights = draft.weights  # a token at a time: cheaper than a gather for a few
            i = next((i for i, t in enumerate(ids.tolist()) if weights[i, t] <= 0.0), None)
            if i is not None:
                raise ValueError(zero_draft_probability(step, b, i))
        return draft
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
    return Draft(ids, rows, laws, parents)


def verify_one(step: VerifyInputs, b: int) -> tuple[int, int]:
    """Verify sequence b on this thread; ValueError naming the row if one is invalid."""
    n = int(step.lengths[b])
    verifier = step.verifier
    return verifier.verify(
        step.target[b, : n + 1],
        draft_law(step, b, n, step.ids[b, :n]),
        bonus=True,
        block=step.block,
        controls=step.controls,
        rng=step.generators[b],
        workspace=verifier.thread_workspace(step.target.shape[2]),
        name_row=row_namer(step, "target_logits", b),
    )


#: Logits a sequence's kernels read, on average, below which the default runs a batch
#: verified a sequence at a time (probabilities as drafts, or the pure-Python backend)
#: on one thread.  Each sequence runs about 10 us of Python, which the GIL serialises,
#: and every hand-off between threads costs: on a 2-core VM two threads were 0.4-0.7x
#: one below 36,000 logits per sequence, 1.0-1.1x at 72,000-144,000, and 1.3-1.6x from
#: 288,000 (bench_engine's cells, 2026-12-06).
MIN_THREADED_LOGITS = 65_536

#: Logits a whole batch reads below which the default runs the compiled ``_BatchStep``
#: on one thread: it has no per-sequence Python, so only the one hand-off per thread
#: must pay.  On a 2-core VM (2026-12-06, k = 4) two threads ran at 0.92x one for
#: 295,000 logits (B = 8, V = 4,096), 1.10x for 590,000 (B = 8, V = 8,192) and 1.22x
#: for 590,000 (B = 64, V = 1,024); 1.5-1.8x from 2.4 million.
MIN_THREADED_BATCH_LOGITS = 524_288


def default_threads(step: VerifyInputs) -> int:
    """Threads for a batch when the caller did not say how many.

    Every core, unless the batch reads too few logits for a thread to pay
    (:data:`MIN_THREADED_BATCH_LOGITS` in all through the compiled batch kernel,
    :data:`MIN_THREADED_LOGITS` a sequence otherwise).
    """
    batch = len(step.ids)
    if batch < 2:
        return 1
    drafts = int(step.lengths.sum())
    rows = batch + drafts + (drafts if step.kind == "logits" else 0)  # target + draft rows
    logits = rows * step.target.shape[2]
    if _compiled_batch(step):
        threaded = logits >= MIN_THREADED_BATCH_LOGITS
    else:
        threaded = logits >= MIN_THREADED_LOGITS * batch
    return (os.cpu_count() or 1) if threaded else 1


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


def _on_threads(work, threads: int) -> None:
    """Run ``work`` on ``threads`` threads (this one and the pool's) and wait for them.

    A helper's exception is raised here, once every thread has finished.
    """
    futures = _submit(work, threads - 1) if threads > 1 else []
    try:
        work()
    finally:
        for future in futures:
            future.result()


def run(step: VerifyInputs, n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Verify every sequence (on up to ``n_threads`` threads, this one included).

    Sequences are claimed in increasing order from one counter, and every sequence is
    verified even after another failed: so each generator advances as its own call
    would, and the error raised (the lowest failing sequence's) does not depend on the
    scheduling.  The compiled backend verifies a thread's whole share without the GIL
    (``_BatchStep``), but for probabilities as drafts, whose checks are NumPy's.

    Returns ``(n_accepted, next_tokens, tokens)``, as :class:`specdec.engine.BatchResult`.
    """
    if _compiled_batch(step):
        return _run_compiled(step, n_threads)
    batch, width = step.ids.shape
    out_accepted = np.zeros(batch, dtype=np.int64)
    out_next = np.full(batch, -1, dtype=np.int64)
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

    _on_threads(work, min(n_threads, batch))
    if errors:
        raise errors[min(errors)]
    tokens = np.full((batch, width + 1), -1, dtype=np.int64)
    tokens[:, :width] = np.where(np.arange(width) < out_accepted[:, np.newaxis], step.ids, -1)
    tokens[np.arange(batch), out_accepted] = out_next
    return out_accepted, out_next, tokens


#: Where a sequence of a compiled batch failed (``_BatchStep.failures`` column 0):
#: the argument its row belongs to.
_FAILED_ROWS = {1: "draft", 3: "target_logits"}
_FAILED_DRAFT_TOKEN = 2


def _compiled_batch(step: VerifyInputs) -> bool:
    """Whether ``_BatchStep`` verifies this step.

    It does for the compiled kernels, logits or one-hot drafts and aligned rows; anything
    else goes a sequence at a time (through typed views, which read any layout).
    """
    return (
        len(step.ids) > 0
        and step.kind != "probs"
        and hasattr(step.verifier.kernels, "_BatchStep")
        and step.target.flags.aligned
        and (step.draft is None or step.draft.flags.aligned)
    )


def _run_compiled(step: VerifyInputs, n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`run` through the compiled ``_BatchStep``: one GIL-free stretch per thread."""
    batch, width = step.ids.shape
    vocab = step.target.shape[2]
    kernels = step.verifier.kernels
    job = kernels._BatchStep(
        step.target,
        step.draft,
        np.ascontiguousarray(step.ids),
        np.ascontiguousarray(step.lengths),
        step.controls,
        step.generators,
        step.block,
    )
    dtype = np.float32 if step.draft is None else step.draft.dtype

    def work() -> None:
        buffers = step.verifier.thread_workspace(vocab)
        laws, weights = buffers.draft_rows(max(width, 1), dtype)
        job.run(buffers.kernel_work, laws, weights)

    # Each generator's lock, as a single call takes it; in one order, so that two
    # batches sharing generators cannot each wait on the other.
    # (An ExitStack costs a one-sequence call 3 us: only where there is an order.)
    locks = [g.bit_generator.lock for g in step.generators if g is not None]
    threads = min(n_threads, batch)
    if len(locks) > 1:
        with ExitStack() as held:
            for lock in sorted(locks, key=id):
                held.enter_context(lock)
            _on_threads(work, threads)
    else:
        with locks[0] if locks else nullcontext():  # greedy: no generator, nothing drawn
            _on_threads(work, threads)
    b = job.first_failure()
    if b >= 0:
        where, row, code = (int(v) for v in job.failures[b])
        if where == _FAILED_DRAFT_TOKEN:
            raise ValueError(zero_draft_probability(step, b, row))
        reason = InvalidLogitsError(row, code).reason
        raise ValueError(row_namer(step, _FAILED_ROWS[where], b)(row, reason))
    return job.n_accepted, job.next_tokens, job.tokens
