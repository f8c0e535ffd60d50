"""Requests served by N local worker processes, each building its models once.

A :class:`concurrent.futures.ProcessPoolExecutor` over ``spawn``ed processes (no
fork: a parent holding llama.cpp or PyTorch threads is not safe to fork), each
initialised by calling the factory once.  At most two requests per worker are in
flight, so a file of any length needs no more memory than its parsed requests, and
a worker that dies stops the run (its finished requests are already written; a rerun
resumes).
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from specdec.batch.requests import BatchRequest
from specdec.batch.runner import BatchOptions, RequestRunner

__all__ = ["WorkerError", "serve_in_processes", "start_workers"]

#: Requests in flight per worker: one running, one waiting, so no worker idles.
IN_FLIGHT_PER_WORKER = 2

_runner: RequestRunner | None = None
_start_error: str | None = None


class WorkerError(RuntimeError):
    """A worker could not build its models, or died: the run stops (a rerun resumes)."""


def _start(factory: Callable, options: BatchOptions) -> None:
    global _runner, _start_error
    try:
        _runner = RequestRunner(factory(), options)
    except Exception as error:  # reported with the first request, as one line
        _start_error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    # The models go before the interpreter's teardown: llama-cpp-python's Llama.__del__
    # then still finds its library (afterwards it printed a traceback per worker).
    atexit.register(_release)


def _release() -> None:
    global _runner
    _runner = None
    gc.collect()


def _serve(request: BatchRequest) -> dict:
    if _runner is None:
        raise WorkerError(f"a worker could not build its models: {_start_error}")
    return _runner.run(request)


def start_workers(factory: Callable, options: BatchOptions, workers: int) -> ProcessPoolExecutor:
    """A pool of *workers* spawned processes, each building its models with *factory* once.

    Parameters
    ----------
    factory : callable
        Picklable; returns :class:`~specdec.batch.models.BatchModels`.
    options : BatchOptions
    workers : int

    Returns
    -------
    concurrent.futures.ProcessPoolExecutor
        For :func:`serve_in_processes` (``pool=``); the caller shuts it down.
    """
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start, initargs=(factory, options)
    )


def serve_in_processes(
    requests: Iterable[BatchRequest],
    factory: Callable,
    options: BatchOptions,
    workers: int,
    pool: ProcessPoolExecutor | None = None,
) -> Iterator[dict]:
    """Serve *requests* in *workers* processes; yield the records as they finish.

    Parameters
    ----------
    requests : iterable of BatchRequest
    factory : callable
        Picklable; returns :class:`~specdec.batch.models.BatchModels` (called once per
        worker).
    options : BatchOptions
    workers : int
        Processes.
    pool : ProcessPoolExecutor, optional
        Workers already started by :func:`start_workers` with the same factory and
        options (kept running afterwards); default: a pool of its own, shut down at
        the end.

    Yields
    ------
    dict
        Records, in the order they finish.

    Raises
    ------
    WorkerError
        A worker could not build its models, or died.
    """
    own = pool is None
    if own:
        pool = start_workers(factory, options, workers)
    waiting = iter(requests)
    pending = set()
    try:
        for request in waiting:
            pending.add(pool.submit(_serve, request))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                break
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                try:
                    record = future.result()
                except BrokenProcessPool:
                    raise WorkerError(
                        "a worker process died (killed, or out of memory); the requests "
                        "it finished are written, run the command again to resume"
                    ) from None
                yield record
                request = next(waiting, None)
                if request is not None:
                    pending.add(pool.submit(_serve, request))
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)
        else:
            for future in pending:
                future.cancel()
