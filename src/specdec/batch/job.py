"""A batch run: requests read and checked, served in-process, in processes or on Ray, written.

:func:`run_batch` is ``specdec batch`` as a function (a file in, a file out,
resumable); :func:`run_requests` serves requests held in memory and returns their
records.  Both take a model *factory* (a picklable callable returning
:class:`~specdec.batch.models.BatchModels`), called once per worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from specdec._cores import usable_cores
from specdec.batch.models import ModelSpec
from specdec.batch.output import ResultFile, record_key, request_key
from specdec.batch.records import error_record
from specdec.batch.requests import BadLine, BatchRequest, parse_lines
from specdec.batch.runner import BatchOptions, RequestRunner

__all__ = ["BatchSummary", "run_batch", "run_requests", "serve", "share_cores"]


@dataclass
class BatchSummary:
    """What a :func:`run_batch` call did.

    Attributes
    ----------
    requests : int
        Lines in the input (requests and bad lines).
    skipped : int
        Already in the output when the run started (resumed past).
    written : int
        Records this run wrote.
    failed : int
        Records in the output that failed (this run's and earlier ones).
    """

    requests: int = 0
    skipped: int = 0
    written: int = 0
    failed: int = 0

    @property
    def complete(self) -> bool:
        """Every request has a record, and none failed."""
        return self.failed == 0 and self.skipped + self.written == self.requests


def _check_run(workers, ray) -> None:
    if type(workers) is not int or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if ray is not False and ray is not True and not isinstance(ray, str):
        raise TypeError(f"ray must be a bool or a cluster address, got {ray!r}")


def share_cores(factory: Callable, workers: int, ray) -> Callable:
    """``factory`` with its models' threads set so that the workers share the cores.

    A :class:`~specdec.batch.models.ModelSpec` without ``threads`` gets ``cores //
    workers`` (at least 1) for local worker processes, and 1 on Ray (an actor
    reserves one CPU of its node); one process keeps every usable core.  A given
    ``threads``, and any other factory, is returned unchanged.
    """
    if not isinstance(factory, ModelSpec) or factory.threads is not None:
        return factory
    if ray is not False:
        return replace(factory, threads=1)
    if workers > 1:
        return replace(factory, threads=max(1, usable_cores() // workers))
    return factory


def serve(
    requests: list[BatchRequest],
    factory: Callable,
    options: BatchOptions = BatchOptions(),  # noqa: B008 - frozen, so shared safely
    *,
    workers: int = 1,
    ray=False,
) -> Iterator[dict]:
    """Serve checked requests; yield their records as they finish.

    Parameters
    ----------
    requests : list of BatchRequest
    factory : callable
        Returns :class:`~specdec.batch.models.BatchModels`; picklable for processes
        and Ray.  A :class:`~specdec.batch.models.ModelSpec` without ``threads``
        gets a share of the cores per worker (:func:`share_cores`).
    options : BatchOptions
    workers : int, default 1
        Processes (1: this one), or Ray actors.
    ray : bool or str, default False
        Serve on a Ray cluster (True: ``RAY_ADDRESS`` or a local one; a str: its address).

    Yields
    ------
    dict
    """
    _check_run(workers, ray)
    factory = share_cores(factory, workers, ray)
    if ray is not False:
        from specdec.batch.ray_stage import serve_on_ray

        address = ray if isinstance(ray, str) else None
        yield from serve_on_ray(requests, factory, options, workers, address)
    elif workers > 1 and len(requests) > 1:
        from specdec.batch.workers import serve_in_processes

        yield from serve_in_processes(requests, factory, options, workers)
    elif requests:
        runner = RequestRunner(factory(), options)
        for request in requests:
            yield runner.run(request)


def _bad_record(bad: BadLine) -> dict:
    return error_record(bad.custom_id, bad.key, bad.message)


def run_requests(
    requests: Iterable[dict],
    factory: Callable,
    options: BatchOptions = BatchOptions(),  # noqa: B008
    *,
    workers: int = 1,
    ray=False,
) -> list[dict]:
    """Serve OpenAI Batch requests held in memory; their records, in the requests' order.

    Parameters
    ----------
    requests : iterable of dict
        Input lines as decoded JSON (``{"custom_id", "method", "url", "body"}``).
    factory : callable
        Returns :class:`~specdec.batch.models.BatchModels`, called once per worker
        (picklable for ``workers > 1`` and Ray).
    options : BatchOptions
    workers : int, default 1
    ray : bool or str, default False

    Returns
    -------
    list of dict
        One record per request; bad requests get status-400 records, requests whose
        model failed while serving them status-500 records.

    Raises
    ------
    ValueError
        Two requests share a ``custom_id`` (before any work).
    """
    import json

    _check_run(workers, ray)
    lines = [json.dumps(r) if not isinstance(r, (str, bytes)) else r for r in requests]
    checked, bad = parse_lines(lines)
    records = {request_key(b.custom_id, b.key): _bad_record(b) for b in bad}
    for record in serve(checked, factory, options, workers=workers, ray=ray):
        records[record_key(record)] = record
    order = sorted(
        [(b.line, request_key(b.custom_id, b.key)) for b in bad]
        + [(r.line, request_key(r.custom_id, None)) for r in checked]
    )
    return [records[key] for _, key in order]


def run_batch(
    input_path,
    output_path,
    factory: Callable,
    options: BatchOptions = BatchOptions(),  # noqa: B008
    *,
    workers: int = 1,
    ray=False,
    retry_failed: bool = False,
    on_start: Callable | None = None,
    on_record: Callable | None = None,
) -> BatchSummary:
    """Run an OpenAI Batch file into an output file; rerun to resume.

    Every line is read and checked first: a duplicate ``custom_id`` refuses the file
    before any work.  Requests whose records are already in the output are skipped
    (``retry_failed``: except the failed ones, whose records are removed), the others
    are served and their records appended, each flushed as it finishes.

    Parameters
    ----------
    input_path, output_path : path-like
    factory : callable
        Returns :class:`~specdec.batch.models.BatchModels`, called once per worker.
    options : BatchOptions
    workers : int, default 1
        Worker processes, or Ray actors with ``ray``.
    ray : bool or str, default False
        Serve on Ray (True: ``RAY_ADDRESS`` or a local cluster; a str: its address).
    retry_failed : bool, default False
        Run the requests whose records in the output failed again.
    on_start : callable, optional
        ``on_start(summary)`` once the output is read, before any work (``requests``
        and ``skipped`` are known).
    on_record : callable, optional
        ``on_record(record)`` after each record is written (a progress bar).

    Returns
    -------
    BatchSummary

    Raises
    ------
    ValueError
        A duplicate ``custom_id``; an output that is not a batch output; the input
        given as the output.
    OSError
        The input cannot be read.
    """
    _check_run(workers, ray)
    input_path, output_path = Path(input_path), Path(output_path)
    if output_path.exists() and output_path.resolve() == input_path.resolve():
        raise ValueError(f"the output {output_path} is the input: give another file")
    with open(input_path, "rb") as file:
        requests, bad = parse_lines(file)
    summary = BatchSummary(requests=len(requests) + len(bad))
    with ResultFile(output_path, retry_failed=retry_failed) as output:
        summary.failed = output.failed
        todo = [r for r in requests if request_key(r.custom_id, None) not in output.done]
        todo_bad = [b for b in bad if request_key(b.custom_id, b.key) not in output.done]
        summary.skipped = summary.requests - len(todo) - len(todo_bad)
        if on_start is not None:
            on_start(summary)
        records = (_bad_record(b) for b in todo_bad)
        served = serve(todo, factory, options, workers=workers, ray=ray)
        for record in _chain(records, served):
            if record_key(record) in output.done:
                continue  # delivered twice (a retried task): the first one stands
            output.write(record)
            summary.written += 1
            summary.failed += record["response"]["status_code"] != 200
            if on_record is not None:
                on_record(record)
    return summary


def _chain(*iterables):
    for iterable in iterables:
        yield from iterable
