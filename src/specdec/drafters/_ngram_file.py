"""The file format of :meth:`NGram.save` / :meth:`NGram.load`, read defensively.

A file is an uncompressed ``.npz`` archive (a zip of ``.npy`` members, as
``numpy.savez`` writes it) holding plain arrays only: ``format`` (the string
``"specdec.drafters.NGram"``), ``version``, ``order``, the constructor's options
(``vocab_size`` and ``max_grams`` -1 for None; ``max_grams`` may be absent, as in
files written before it existed) and, for every n in 2 .. order, ``grams_<n>`` (an
(m, n) int64 array of n-grams, sorted) and ``counts_<n>`` (their counts).

Reading trusts nothing the file declares: every member must be one of these names,
stored (not compressed), and its ``.npy`` header must declare a plain dtype and a
shape whose size is exactly the bytes the member holds; no header is larger than
NumPy's limit, and no pickle is ever read.  So the memory a file can take is bounded
by its size on disk (no "zip bomb", no header claiming a huge shape), and any
malformed file is a ``ValueError`` naming it.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from specdec.drafters._checks import check_fits_int64, check_ids

FORMAT = "specdec.drafters.NGram"
VERSION = 1

# Members holding one option each (0-d arrays), and their types; max_grams is optional
# (version 1 files written before it existed lack it).
_OPTION_TYPES = {
    "num_tokens": np.int64,
    "min_count": np.int64,
    "min_probability": np.float64,
    "online": np.bool_,
    "vocab_size": np.int64,
    "max_grams": np.int64,
}
_AS_PYTHON = {np.int64: int, np.float64: float, np.bool_: bool}
OPTIONS = tuple(_OPTION_TYPES)
_NONE_AS_MINUS_ONE = ("vocab_size", "max_grams")
#: The value of ``max_grams`` in :func:`read`'s options when the file has none.
ABSENT = object()
_SCALARS = ("format", "version", "order", *OPTIONS)
_TABLE = re.compile(r"(grams|counts)_([1-9][0-9]?)")
# dtype kinds a valid file holds: ints, bools, floats, and the format string.
_KINDS = "iubfU"


def write(path, order: int, options: dict, items: list) -> None:
    """Write an NGram's *order*, *options* and n-gram counts (*items*) to *path*.

    *options* maps the names in :data:`OPTIONS` to values (None for "no bound" /
    "no vocabulary"); *items* is a list of ``(gram, count)``.  The name is used as
    given (no ``.npz`` is appended), and the file is written beside it and renamed
    into place, so a reader never sees a partial file.
    """
    by_size: dict[int, list] = {n: [] for n in range(2, order + 1)}
    for gram, count in items:
        by_size[len(gram)].append((gram, count))
    arrays = {"format": np.array(FORMAT), "version": np.int64(VERSION), "order": np.int64(order)}
    for name, value in options.items():
        arrays[name] = _OPTION_TYPES[name](-1 if value is None else value)
    for n, grams_counts in by_size.items():
        grams = np.array([g for g, _ in grams_counts], dtype=np.int64).reshape(-1, n)
        counts = np.array([c for _, c in grams_counts], dtype=np.int64)
        # Sorted rows: the same counts always give the same file.
        rows = np.lexsort(grams.T[::-1]) if len(grams) else np.zeros(0, np.intp)
        arrays[f"grams_{n}"] = grams[rows]
        arrays[f"counts_{n}"] = counts[rows]
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **arrays)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class FileError(ValueError):
    """A malformed NGram file (its message says what is wrong, the caller names the file)."""


def read(path: Path) -> tuple[int, dict, dict]:
    """The order, the options and the arrays of the file at *path*.

    The options are converted (None for -1 where :func:`write` wrote None;
    ``max_grams`` is :data:`ABSENT` in files written before it existed) but not
    range-checked: the NGram constructor does that.  The arrays are every member, by
    name; :func:`tables` checks the count tables once the order is known valid.

    Raises
    ------
    FileError
        If the archive, a member's name, storage or ``.npy`` header is not what
        :func:`write` produces, or the format marker, version or options are missing
        or malformed.
    """
    arrays = _read_members(path)
    marker = arrays.get("format")
    if marker is None or marker.shape != () or str(marker) != FORMAT:
        raise FileError("missing or wrong 'format' marker")
    options = {}
    try:
        for name in ("version", "order", *OPTIONS):
            if name not in arrays:
                continue
            if arrays[name].shape != ():
                raise ValueError(f"{name} has shape {arrays[name].shape}")
            # What write() stores: int64 ints, a bool, a float (not 3.7 read as 3).
            kind = np.dtype(_OPTION_TYPES.get(name, np.int64)).kind
            if arrays[name].dtype.kind != kind:
                raise ValueError(f"{name} is of dtype {arrays[name].dtype}")
        version = int(arrays["version"])
        order = int(arrays["order"])
        for name in OPTIONS:
            if name == "max_grams" and name not in arrays:
                options[name] = ABSENT
                continue
            value = _AS_PYTHON[_OPTION_TYPES[name]](arrays[name])
            options[name] = None if name in _NONE_AS_MINUS_ONE and value == -1 else value
    except (KeyError, TypeError, ValueError) as exc:
        raise FileError(f"missing or malformed option ({exc})") from None
    if version != VERSION:
        raise FileError(f"version {version}, this specdec reads version {VERSION}")
    return order, options, arrays


def tables(arrays: dict, order: int) -> dict:
    """The count tables of an *order* file, n -> (grams, counts), shapes checked.

    Raises
    ------
    FileError
        If a table is missing, malformed or holds a count below 1, or a table of
        another order is present.
    """
    known = {"format", "version", "order", *OPTIONS}
    known |= {f"{table}_{n}" for table in ("grams", "counts") for n in range(2, order + 1)}
    extra = sorted(set(arrays) - known)
    if extra:
        raise FileError(f"unexpected member {extra[0]!r} for order {order}")
    result = {}
    for n in range(2, order + 1):
        grams, counts = arrays.get(f"grams_{n}"), arrays.get(f"counts_{n}")
        if grams is None or counts is None:
            raise FileError(f"missing grams_{n} / counts_{n}")
        if (
            grams.dtype.kind not in "iu"
            or counts.dtype.kind not in "iu"
            or grams.ndim != 2
            or grams.shape[1] != n
            or counts.shape != grams.shape[:1]
        ):
            raise FileError(
                f"grams_{n} / counts_{n} have shapes {grams.shape} / {counts.shape} "
                f"and dtypes {grams.dtype} / {counts.dtype}"
            )
        if counts.size and counts.min() < 1:
            raise FileError(f"counts_{n} holds a count below 1")
        result[n] = grams, counts
    return result


def counted_grams(arrays: dict, order: int, vocab_size: int | None) -> list:
    """Every ``(gram, count)`` of the file's tables, as Python tuples and ints, checked.

    Raises
    ------
    FileError
        As :func:`tables`, or if a gram holds an id outside the vocabulary, a value
        does not fit in int64, or a gram appears twice.
    """
    result, seen = [], set()
    for n, (grams, counts) in tables(arrays, order).items():
        try:
            check_fits_int64(grams, f"grams_{n}")
            check_fits_int64(counts, f"counts_{n}")
            check_ids(grams, f"grams_{n}", vocab_size)
        except ValueError as exc:
            raise FileError(str(exc)) from None
        for gram, count in zip(map(tuple, grams.tolist()), counts.tolist(), strict=True):
            if gram in seen:
                raise FileError(f"grams_{n} holds {gram} twice")
            seen.add(gram)
            result.append((gram, count))
    return result


def _read_members(path: Path) -> dict:
    """Every member of the file at *path*, checked, as name -> array."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            members = _checked_members(infos, size)
            return {
                name: _read_npy(archive, info, name)
                for name, info in zip(members, infos, strict=True)
            }
    except FileError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
        # zipfile and numpy's header parser raise these for truncated or corrupted data
        raise FileError(f"{type(exc).__name__}: {exc}") from None
    except NotImplementedError as exc:  # e.g. an unknown compression or encryption
        raise FileError(f"unsupported zip member ({exc})") from None


def _checked_members(infos, archive_size: int) -> list:
    """The member names without ``.npy``, after the checks that need no reading."""
    names = []
    total = 0
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise FileError(f"unexpected member {info.filename!r} (not an .npy array)")
        name = info.filename[: -len(".npy")]
        if name not in _SCALARS and not _TABLE.fullmatch(name):
            raise FileError(f"unexpected member {info.filename!r}")
        if name in names:
            raise FileError(f"member {info.filename!r} appears twice")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise FileError(
                f"member {info.filename!r} is compressed (method {info.compress_type}); "
                "NGram.save stores members uncompressed"
            )
        if info.flag_bits & 0x1:
            raise FileError(f"member {info.filename!r} is encrypted")
        total += info.file_size
        names.append(name)
    if total > archive_size:
        raise FileError(
            f"its members declare {total} bytes, more than the file's {archive_size} bytes"
        )
    return names


def _read_npy(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> np.ndarray:
    """One ``.npy`` member, its header checked against its size before the data is read."""
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise FileError(f"member {name!r} has .npy format version {version}")
        try:
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
            else:
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
        except Exception as exc:
            # NumPy parses the header (a Python literal of at most 10,000 bytes) with
            # tokenize and ast, which raise their own errors on garbage.
            raise FileError(
                f"member {name!r} has a malformed .npy header ({type(exc).__name__}: {exc})"
            ) from None
        if dtype.hasobject or dtype.fields is not None or dtype.kind not in _KINDS:
            raise FileError(f"member {name!r} holds dtype {dtype}, not plain numbers")
        if any(dim < 0 for dim in shape):
            raise FileError(f"member {name!r} declares shape {shape}")
        data_bytes = info.file_size - member.tell()
        declared = math.prod(shape) * dtype.itemsize
        if declared != data_bytes:
            raise FileError(
                f"member {name!r} declares shape {shape} of {dtype} ({declared} bytes) "
                f"but holds {data_bytes} bytes"
            )
        data = member.read(data_bytes)  # reading to the end checks the CRC
    if len(data) != data_bytes:
        raise FileError(f"member {name!r} is truncated")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")
