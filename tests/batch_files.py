"""Shared by the batch tests: a mixed request file, model factories, and the format's checks.

The factories are module-level classes, so that worker processes (spawned) and Ray
actors can unpickle them: they import this module from the tests directory.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from specdec.batch import ToyModels
from specdec.batch.models import BatchModels

#: A small training corpus: the models train in a fraction of a second, in every worker.
TOY = ToyModels(max_bytes=300_000, context=512)


def mixed_requests(n: int = 12) -> list[dict]:
    """Greedy and sampled, chat and completion requests, some with their own seed or stop."""
    prompts = ["def main(", "import os\n", "class Foo", "for i in range(", "return self."]
    requests = []
    for i in range(n):
        body = {"max_tokens": 24 + 4 * (i % 3)}
        if i % 4 == 1:
            body["messages"] = [
                {"role": "system", "content": "Python."},
                {"role": "user", "content": prompts[i % 5]},
            ]
            url = "/v1/chat/completions"
        else:
            body["prompt"] = prompts[i % 5] * (1 + i % 2)
            url = "/v1/completions"
        if i % 2:  # sampled; even requests are greedy
            body["temperature"] = 0.9
            body["top_p"] = 0.95 if i % 3 == 0 else None
        if i % 5 == 3:
            body["seed"] = 1234 + i
        if i % 6 == 4:
            body["stop"] = ["\n"]
        requests.append({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})
    return requests


def write_jsonl(path, rows) -> None:
    with open(path, "w") as file:
        for row in rows:
            file.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


def read_records(path) -> list[dict]:
    """Every line of an output file, parsed (a torn or invalid line fails the test)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    assert text == "" or text.endswith("\n"), "the output ends with a half line"
    return [json.loads(line) for line in text.splitlines()]


def comparable(record: dict) -> dict:
    """A record without its creation time (the one field that depends on when it ran)."""
    body = {k: v for k, v in record["response"]["body"].items() if k != "created"}
    return {**record, "response": {**record["response"], "body": body}}


def by_id(records) -> dict:
    keyed = {r["custom_id"] or r["response"]["request_id"]: comparable(r) for r in records}
    assert len(keyed) == len(records), "a request written twice"
    return keyed


def check_openai_record(record: dict) -> None:
    """The OpenAI Batch output format, read back field by field."""
    assert set(record) == {"id", "custom_id", "response", "error"}
    assert record["id"].startswith("batch_req_") and record["error"] is None
    response = record["response"]
    assert set(response) == {"status_code", "request_id", "body"}
    body = response["body"]
    if response["status_code"] != 200:
        assert response["status_code"] in (400, 500)
        error = body["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"] and "\n" not in error["message"]
        return
    assert body["object"] in ("chat.completion", "text_completion")
    assert isinstance(body["created"], int) and isinstance(body["model"], str)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    if body["object"] == "chat.completion":
        assert body["id"].startswith("chatcmpl-")
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
    else:
        assert body["id"].startswith("cmpl-") and isinstance(choice["text"], str)
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    stats = body["specdec"]
    assert 0 <= stats["drafts_kept"] <= stats["drafted"]
    assert stats["target_passes"] >= 1


class _Watched:
    """The toy target, with ``before(ids, n)`` called before its n-th pass (from 1)."""

    def __init__(self, model, before):
        self.model, self.before, self.passes = model, before, 0
        self.vocab_size = model.vocab_size

    def forward(self, ids, logits_to_keep=None):
        self.passes += 1
        self.before(ids, self.passes)
        return self.model.forward(ids, logits_to_keep=logits_to_keep)


class _WatchedToy:
    """A factory of :data:`TOY` whose target calls :meth:`before_pass` before each pass."""

    def __call__(self) -> BatchModels:
        models = TOY()
        models.target = _Watched(models.target, self.before_pass)
        return models

    def before_pass(self, ids, n: int) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class KillingToy(_WatchedToy):
    """:data:`TOY`, whose target kills its process at the first request holding ``KILL``.

    Once: a marker file remembers.
    """

    marker: str

    def before_pass(self, ids, n: int) -> None:
        if b"KILL" in bytes(int(t) for t in ids[0]) and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                file.write(str(os.getpid()))
            os._exit(1)  # as a crash or the OOM killer would: no cleanup


@dataclass(frozen=True)
class FailingToy(_WatchedToy):
    """:data:`TOY`, whose target raises ``error_type`` at its third pass (mid-request)."""

    error_type: type

    def before_pass(self, ids, n: int) -> None:
        if n == 3:
            raise self.error_type("the model broke")


@dataclass(frozen=True)
class SlowToy(_WatchedToy):
    """:data:`TOY` with a target pass that takes *seconds*: a run long enough to kill."""

    seconds: float = 0.002

    def before_pass(self, ids, n: int) -> None:
        time.sleep(self.seconds)
