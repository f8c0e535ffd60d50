"""OpenAI Batch lines read into requests (their records are written by :mod:`.records`).

An input line is ``{"custom_id", "method": "POST", "url", "body"}``; ``url`` is
``/v1/chat/completions`` (``body.messages``) or ``/v1/completions`` (``body.prompt``).
:func:`parse_lines` reads a whole file's lines before any work: a line that cannot be
served becomes a :class:`BadLine` (its 400 record is written, the others go on), a
``custom_id`` seen twice is a :class:`DuplicateCustomId` (the whole file is refused).
Everything here needs no model: what needs one (the prompt's length against the
context) is checked by the runner.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from specdec._validation import SamplingControls, is_int, is_real

__all__ = [
    "CHAT_URL",
    "COMPLETIONS_URL",
    "MAX_TOKENS",
    "BadLine",
    "BatchRequest",
    "DuplicateCustomId",
    "RequestError",
    "parse_lines",
    "parse_request",
]

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
#: The most tokens one request may ask for (the CLI's bound too).
MAX_TOKENS = 100_000
#: Seeds are drawn into NumPy generators: any non-negative int below 2**63.
MAX_SEED = 2**63 - 1
#: OpenAI's own bound on ``stop``.
MAX_STOPS = 4

# Body fields OpenAI defines that specdec does not implement: refused unless they hold
# their neutral value, rather than ignored (that would be a silent wrong answer).
_NEUTRAL = {
    "n": 1,
    "best_of": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logprobs": None,
    "top_logprobs": None,
    "echo": False,
    "stream": False,
    "logit_bias": None,
    "tools": None,
    "response_format": None,
    "suffix": None,
}


class RequestError(ValueError):
    """A request specdec cannot serve: its record gets status 400 and this message."""


class DuplicateCustomId(ValueError):
    """Two lines share a ``custom_id``: the file is refused before any work."""


@dataclass(frozen=True)
class BatchRequest:
    """One request, checked: everything a worker needs, and nothing about the file.

    ``messages`` is set for chat requests, ``prompt`` (text or token ids) for
    completions; the controls are None where the body leaves them to the options.
    """

    custom_id: str
    line: int
    url: str
    messages: list | None = None
    prompt: str | list | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple = ()
    model: str | None = None

    @property
    def is_chat(self) -> bool:
        """Whether the request is a chat completion."""
        return self.url == CHAT_URL

    def to_json(self) -> str:
        """The request as one JSON text (what travels to a Ray actor)."""
        return json.dumps({**self.__dict__, "stop": list(self.stop)})

    @classmethod
    def from_json(cls, text: str) -> BatchRequest:
        """The request :meth:`to_json` wrote."""
        values = json.loads(text)
        values["stop"] = tuple(values["stop"])
        return cls(**values)


@dataclass(frozen=True)
class BadLine:
    """A line that cannot be served: its 400 record is written instead of running it."""

    line: int
    custom_id: str | None
    message: str
    #: The key under which the output remembers it (lines without an id: their number).
    key: str = field(default="")


def _check_int(body, name, lo, hi):
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value) or not lo <= value <= hi:
        raise RequestError(f"body.{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _check_float(body, name):
    value = body.get(name)
    if value is None:
        return None
    if not is_real(value) or not math.isfinite(value):
        raise RequestError(f"body.{name} must be a finite number, got {value!r}")
    return float(value)


def _check_stop(body) -> tuple:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise RequestError(
            f"body.stop must be a non-empty string or a list of 1 to {MAX_STOPS} of them, "
            f"got {stop!r}"
        )
    return tuple(stops)


def _check_unsupported(body) -> None:
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if value is not None and not _is_neutral(value, neutral):
            raise RequestError(f"body.{name} is not supported by specdec (got {value!r})")


def _is_neutral(value, neutral) -> bool:
    # Compared by kind as well as value: JSON's true equals 1 in Python, yet "n": true
    # asks for something specdec cannot know it gives.
    if neutral is None:
        return value in ({}, [], False, 0)
    if isinstance(neutral, bool):
        return value is neutral
    if isinstance(neutral, int):
        return is_int(value) and value == neutral
    return is_real(value) and value == neutral


def _check_messages(messages) -> list:
    if not isinstance(messages, list) or not messages:
        raise RequestError("body.messages must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"body.messages[{i}] must be an object, got {message!r}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise RequestError(
                    f"body.messages[{i}].{key} must be a string, got {message.get(key)!r}"
                )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _check_prompt(prompt):
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # OpenAI's list of prompts, with the one prompt a request may hold
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        return [int(t) for t in prompt]
    raise RequestError(
        "body.prompt must be a non-empty string or a non-empty list of token ids, "
        f"got {json.dumps(prompt)[:80]}"
    )


def parse_request(request, line: int) -> BatchRequest:
    """Check one decoded input line and return its request.

    Parameters
    ----------
    request : object
        The line's JSON value.
    line : int
        Its line number (1-based), for messages.

    Returns
    -------
    BatchRequest

    Raises
    ------
    RequestError
        One line saying what is wrong.
    """
    if not isinstance(request, dict):
        raise RequestError(f"a request must be a JSON object, got {type(request).__name__}")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestError(f"custom_id must be a non-empty string, got {custom_id!r}")
    method = request.get("method", "POST")
    if method != "POST":
        raise RequestError(f"method must be 'POST', got {method!r}")
    url = request.get("url")
    if url not in (CHAT_URL, COMPLETIONS_URL):
        raise RequestError(f"url must be {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {url!r}")
    body = request.get("body")
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object, got {body!r}")
    _check_unsupported(body)
    if url == CHAT_URL:
        text = {"messages": _check_messages(body.get("messages"))}
    else:
        text = {"prompt": _check_prompt(body.get("prompt"))}
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:  # absent, or null: OpenAI's older name then
        max_tokens = body.get("max_tokens")
    values = dict(
        max_tokens=_check_int({"max_tokens": max_tokens}, "max_tokens", 1, MAX_TOKENS),
        temperature=_check_float(body, "temperature"),
        top_k=_check_int(body, "top_k", 1, 2**31 - 1),
        top_p=_check_float(body, "top_p"),
        min_p=_check_float(body, "min_p"),
        seed=_check_int(body, "seed", 0, MAX_SEED),
        stop=_check_stop(body),
    )
    try:  # the decoder's own checks and messages, with the body's names
        SamplingControls.from_user(
            1.0 if values["temperature"] is None else values["temperature"],
            values["top_k"],
            values["top_p"],
            values["min_p"],
        )
    except (TypeError, ValueError) as error:
        raise RequestError(f"body.{error}") from None
    model = body.get("model") if isinstance(body.get("model"), str) else None
    return BatchRequest(custom_id, line, url, model=model, **text, **values)


def parse_lines(lines) -> tuple[list[BatchRequest], list[BadLine]]:
    """Read a batch file's lines: the requests to run and the lines that cannot run.

    Parameters
    ----------
    lines : iterable of str or bytes
        The file's lines (blank lines are skipped).

    Returns
    -------
    requests : list of BatchRequest
    bad : list of BadLine

    Raises
    ------
    DuplicateCustomId
        A ``custom_id`` on two lines (both numbers in the message).
    """
    requests, bad, seen = [], [], {}
    for number, text in enumerate(lines, 1):
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if number == 1 and text.startswith("\ufeff"):
            text = text[1:]  # a byte-order mark, as some editors on Windows write
        if not text.strip():
            continue
        custom_id = None
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as error:
            # JSONDecodeError, and what json.loads raises past its limits: nesting
            # deeper than the interpreter's stack, an int of more than 4300 digits
            reason = "nested too deeply" if isinstance(error, RecursionError) else error
            bad.append(BadLine(number, None, f"line {number}: not JSON ({reason})", _key(number)))
            continue
        try:
            if isinstance(value, dict) and isinstance(value.get("custom_id"), str):
                custom_id = value["custom_id"] or None
            if custom_id is not None:
                if custom_id in seen:
                    raise DuplicateCustomId(
                        f"custom_id {custom_id!r} is on line {seen[custom_id]} and on line "
                        f"{number}: each request needs its own"
                    )
                seen[custom_id] = number
            requests.append(parse_request(value, number))
        except RequestError as error:
            key = custom_id if custom_id is not None else _key(number)
            bad.append(BadLine(number, custom_id, f"line {number}: {error}", key))
    return requests, bad


def _key(line: int) -> str:
    # A line without a custom_id is remembered by its number (its record's request_id).
    return f"line-{line}"
