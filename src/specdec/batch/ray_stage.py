"""Ray: a Ray Data stage serving requests in an actor pool, and a run over it.

:class:`SpecdecStage` is a callable class for ``Dataset.map_batches``: each actor
builds its models once (from a picklable factory such as
:class:`~specdec.batch.models.ModelSpec`) and turns a batch of requests (a column of
:meth:`BatchRequest.to_json` texts) into a column of JSON records.  Ray is the
scheduler: Ray Data restarts a dead actor and retries its tasks (its actor pools
default to ``max_restarts=-1`` and ``max_task_retries=-1``, which this stage keeps),
and a retried batch's output replaces the lost one, so each request is in the output
once (the writer also drops a record delivered twice).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from specdec.batch.requests import BatchRequest
from specdec.batch.runner import BatchOptions, RequestRunner

__all__ = ["RAY_HINT", "SpecdecStage", "serve_on_ray", "import_ray"]

RAY_HINT = 'pip install "cyspecdec[ray]"'


def import_ray():
    """Import Ray, or raise ImportError with the install command."""
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise ImportError(f"--ray needs Ray Data ({error}); install it with: {RAY_HINT}") from None
    return ray


class SpecdecStage:
    """A Ray Data stage: ``dataset.map_batches(SpecdecStage, fn_constructor_args=...)``.

    Parameters
    ----------
    factory : callable
        Picklable; returns :class:`~specdec.batch.models.BatchModels`.  Called once per
        actor (and again if the actor is restarted).
    options : BatchOptions

    Examples
    --------
    >>> rows = [{"request": r.to_json()} for r in requests]  # doctest: +SKIP
    >>> dataset = ray.data.from_items(rows)  # doctest: +SKIP
    >>> out = dataset.map_batches(SpecdecStage, fn_constructor_args=(ModelSpec("smollm2"),
    ...     BatchOptions()), batch_size=1, concurrency=2)  # doctest: +SKIP
    """

    def __init__(self, factory: Callable, options: BatchOptions):
        self._runner = RequestRunner(factory(), options)

    def __call__(self, batch: dict) -> dict:
        """Serve a batch: ``{"request": texts}`` to ``{"record": JSON texts}``."""
        records = [
            json.dumps(self._runner.run(BatchRequest.from_json(str(text))), ensure_ascii=False)
            for text in batch["request"]
        ]
        return {"record": np.array(records, dtype=object)}


def serve_on_ray(
    requests: Sequence[BatchRequest],
    factory: Callable,
    options: BatchOptions,
    actors: int,
    address: str | None = None,
) -> Iterator[dict]:
    """Serve *requests* on a Ray cluster with *actors* actors; yield records as they come.

    Connects with ``ray.init(address)`` unless Ray is already initialised: None uses
    ``RAY_ADDRESS``, else a cluster started on this machine by ``ray start``, else a
    new local one.

    Parameters
    ----------
    requests : sequence of BatchRequest
    factory : callable
        Picklable model factory.
    options : BatchOptions
    actors : int
        Size of the actor pool (one CPU each).
    address : str, optional
        The cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``).

    Yields
    ------
    dict
        Records, in the order Ray delivers them.
    """
    ray = import_ray()
    if not requests:
        return
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING, include_dashboard=False)
    context = ray.data.DataContext.get_current()
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # no plans, timings, notices
    context.enable_progress_bars = False  # ours is on stderr already
    dataset = ray.data.from_items([{"request": r.to_json()} for r in requests])
    served = dataset.map_batches(
        SpecdecStage,
        fn_constructor_args=(factory, options),
        batch_size=1,  # a request is the unit of retry and of progress
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
    )
    for row in served.iter_rows():
        yield json.loads(row["record"])
