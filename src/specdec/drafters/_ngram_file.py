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

FORMAT = "specdec.drafters.NGram"
VERSION = 1

# Members holding one option each (0-d arrays); max_grams is optional (version 1 files
# written before it existed lack it).
OPTIONS = ("num_tokens", "min_count", "min_probability", "online", "vocab_size", "max_grams")
_SCALARS = ("format", "version", "order", *OPTIONS)
_TABLE = re.compile(r"(grams|counts)_([1-9][0-9]?)")
# dtype kinds a valid file holds: ints, bools, floats, and the format string.
_KINDS = "iubfU"


def write(path, scalars: dict, tables: dict) -> None:
    """Write *scalars* (name -> 0-d value) and *tables* (n -> (grams, counts)) to *path*.

    The name is used as given (no ``.npz`` is appended), and the file is written beside
    it and renamed into place, so a reader never sees a partial file.
    """
    arrays = {"format": np.array(FORMAT), "version": np.int64(VERSION), **scalars}
    for n, (grams, counts) in tables.items():
        arrays[f"grams_{n}"] = grams
        arrays[f"counts_{n}"] = counts
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


def read(path: Path) -> dict:
    """Every member of the file at *path*, checked, as name -> array.

    Raises
    ------
    FileError
        If the archive, a member's name, storage or ``.npy`` header is not what
        :func:`write` produces.
    """
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
