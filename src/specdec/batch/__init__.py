"""Many requests: OpenAI Batch files served by specdec, resumable, on all cores or on Ray.

``specdec batch INPUT.jsonl -o OUTPUT.jsonl`` as functions:

* :func:`run_batch` — a file in, a file out; rerun to resume.
* :func:`run_requests` — requests held in memory, their records returned.
* :class:`BatchOptions` — what applies to every request (defaults for the bodies,
  the run's seed, stateful drafting).
* Model factories (called once per worker): :class:`ModelSpec` (what the CLI's
  ``--model``/``--draft`` name), :class:`ToyModels`, or any picklable callable
  returning :class:`BatchModels`.
* :class:`SpecdecStage` (``specdec.batch.ray_stage``) — the Ray Data stage.

Examples
--------
>>> from specdec.batch import ModelSpec, run_requests
>>> request = {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "def f("}}
>>> records = run_requests([request], ModelSpec("toy"))  # doctest: +SKIP
>>> records[0]["response"]["body"]["choices"][0]["text"]  # doctest: +SKIP
"""

from specdec.batch.job import BatchSummary, run_batch, run_requests
from specdec.batch.models import BatchModels, ModelSpec, ToyModels
from specdec.batch.records import derived_seed
from specdec.batch.requests import BatchRequest, parse_lines
from specdec.batch.runner import BatchOptions, RequestRunner

__all__ = [
    "BatchModels",
    "BatchOptions",
    "BatchRequest",
    "BatchSummary",
    "ModelSpec",
    "RequestRunner",
    "ToyModels",
    "derived_seed",
    "parse_lines",
    "run_batch",
    "run_requests",
]
