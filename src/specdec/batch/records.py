"""The output records: OpenAI Batch results and errors, and the seeds requests are run with.

Ids are digests of the ``custom_id`` (``batch_req_...``, ``chatcmpl-...``), not random, so
that a record is the same whichever worker wrote it and whenever; only ``created``
(a timestamp, as OpenAI's) differs between runs.
"""

from __future__ import annotations

import hashlib
import time

from specdec.batch.requests import BatchRequest

__all__ = ["derived_seed", "error_record", "result_record"]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def derived_seed(seed: int, custom_id: str) -> int:
    """The seed of a request without ``body.seed``: a stable hash of the run's seed and its id.

    SHA-256, not Python's ``hash`` (salted per process): every worker, machine and
    resume derives the same seed.

    Parameters
    ----------
    seed : int
        The run's ``--seed``.
    custom_id : str
        The request's id.

    Returns
    -------
    int
        In ``[0, 2**63)``.
    """
    digest = hashlib.sha256(f"{seed}\x00{custom_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _envelope(custom_id, key: str, status: int, body: dict, error=None) -> dict:
    return {
        "id": f"batch_req_{_digest(key)}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": key, "body": body},
        "error": error,
    }


def error_record(custom_id, key: str, message: str, status: int = 400) -> dict:
    """The output record of a request that failed.

    Parameters
    ----------
    custom_id : str or None
        The request's id (None for a line without one).
    key : str
        What the output remembers it by (the id, else ``line-N``): the ``request_id``.
    message : str
        One line.
    status : int, default 400
        400 for a request that cannot be served, 500 for a failure while serving it.

    Returns
    -------
    dict
    """
    kind = "invalid_request_error" if status == 400 else "server_error"
    message = " ".join(str(message).split())
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return _envelope(custom_id, key, status, body)


def result_record(request: BatchRequest, *, model: str, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int, specdec: dict) -> dict:  # fmt: skip
    """The output record of a request served: a chat.completion or text_completion body.

    Parameters
    ----------
    request : BatchRequest
    model : str
        The model's name, for ``body.model``.
    text : str
        The completion.
    finish_reason : {"stop", "length"}
    prompt_tokens, completion_tokens : int
        For ``usage``.
    specdec : dict
        specdec's own statistics, in ``body.specdec``.

    Returns
    -------
    dict
    """
    if request.is_chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind, prefix = "text_completion", "cmpl"
    body = {
        "id": f"{prefix}-{_digest(request.custom_id)}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "specdec": specdec,
    }
    return _envelope(request.custom_id, request.custom_id, 200, body)
