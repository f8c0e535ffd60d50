"""The output file: whole lines appended and flushed as results come, read back to resume.

Each record is written with one ``write`` system call of a whole line to a file opened
for appending, unbuffered: a process killed at any moment leaves either the whole line
or none of it, except on a crash of the machine itself mid-write.  A torn last line
(no newline: such a crash, or a file cut by something else) is cut off when the file
is opened again, and its request runs again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["ResultFile", "record_key", "request_key"]


def request_key(custom_id: str | None, request_id: str | None) -> tuple:
    """What a request's record is remembered by (a pair: its kind, its id).

    ``("id", custom_id)``, else ``("line", request_id)`` for a line without an id (its
    ``request_id`` is ``line-N``).  Two kinds of key, so that a request whose
    ``custom_id`` is ``"line-3"`` is not taken for the record of a bad line 3 without one.
    """
    return ("id", custom_id) if custom_id is not None else ("line", request_id)


def record_key(record: dict) -> tuple:
    """:func:`request_key` of an output record."""
    return request_key(record.get("custom_id"), record["response"]["request_id"])


def _succeeded(record: dict) -> bool:
    return record.get("error") is None and record["response"]["status_code"] == 200


class ResultFile:
    """An output file opened for a run: what it holds already, and an appender.

    Parameters
    ----------
    path : path-like
        Created if missing.
    retry_failed : bool, default False
        Drop the failed records already there (the file is rewritten without them, by
        a rename), so that their requests run again.

    Attributes
    ----------
    done : set of tuple
        Keys (:func:`record_key`) of the records in the file.
    failed : int
        How many of them failed (before this run's records).

    Raises
    ------
    ValueError
        A line (other than a torn last one) that is not an output record: the path is
        probably not this batch's output, and nothing is changed.
    """

    def __init__(self, path, retry_failed: bool = False):
        self.path = Path(path)
        self.done: set = set()
        self.failed = 0
        records = self._read()
        if retry_failed and any(not _succeeded(r) for _, r in records):
            kept = [line for line, r in records if _succeeded(r)]
            temporary = self.path.with_name(self.path.name + ".specdec-tmp")
            try:
                temporary.write_bytes(b"".join(kept))
                os.replace(temporary, self.path)
            except BaseException:  # a full disk, an interrupt: leave no stray file
                temporary.unlink(missing_ok=True)
                raise
            records = [(line, r) for line, r in records if _succeeded(r)]
        for _, record in records:
            self.done.add(record_key(record))
            self.failed += not _succeeded(record)
        self._file = open(self.path, "ab", buffering=0)

    def _read(self) -> list:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        records = []
        for number, line in enumerate(data[:end].splitlines(keepends=True), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record_key(record)
                record["response"]["status_code"]
            except (ValueError, KeyError, TypeError, RecursionError):
                raise self._not_an_output(number) from None
            records.append((line, record))
        if end < len(data):
            # A torn last line (a run stopped while writing it): cut it off, its request
            # runs again.  Only once the whole lines proved this a batch output, and
            # only what starts like a record (json.dumps writes "id" first).
            if not data[end:].startswith(b'{"id": "batch_req_'):
                raise self._not_an_output(data.count(b"\n", 0, end) + 1)
            with open(self.path, "r+b") as file:
                file.truncate(end)
        return records

    def _not_an_output(self, number: int) -> ValueError:
        return ValueError(
            f"{self.path}: line {number} is not a batch output record; is this the output "
            "of this batch?"
        )

    def write(self, record: dict) -> None:
        """Append one record as one whole line (written through, not buffered)."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        written = self._file.write(data)
        while written < len(data):  # regular files take it whole; be safe anyway
            written += self._file.write(data[written:])
        self.done.add(record_key(record))

    def close(self) -> None:
        """Flush to disk and close."""
        if not self._file.closed:
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
