"""NGram's file format (``specdec.drafters._ngram_file``): malformed files are ValueErrors.

Whatever a file declares, loading it takes memory bounded by its size on disk and fails
with a ``ValueError`` naming it (issue 16; each test failed before its fix).
"""

from __future__ import annotations

import io
import re
import tracemalloc
import zipfile

import numpy as np
import pytest

from specdec.drafters import NGram

# -- NGram files: malformed archives are ValueErrors, in bounded memory (item 2) -----------


def _saved(tmp_path):
    path = tmp_path / "ok.npz"
    NGram(order=3, vocab_size=50).fit([[1, 2, 3, 4, 1, 2, 5]]).save(path)
    return path


def _rezip(source, target, replace=None, compression=zipfile.ZIP_STORED, extra=()):
    """Copy the members of *source* into *target*, replacing some, adding *extra*."""
    replace = replace or {}
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", compression) as new:
        for info in old.infolist():
            new.writestr(info.filename, replace.get(info.filename, old.read(info)))
        for name, data in extra:
            new.writestr(name, data)
    return target


def _npy_header(shape, dtype="<i8"):
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def _refused(path, match):
    """Load *path*, expect a ValueError naming it; return the peak memory of the attempt."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + match):
            NGram.load(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _with_member(source, target, name, header, data_size, compression=zipfile.ZIP_STORED):
    """*source*'s members with *name* replaced by *header* and *data_size* zero bytes."""
    chunk = bytes(min(data_size, 2**20) or 1)
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            if info.filename != name:
                new.writestr(info.filename, old.read(info))
        member_info = zipfile.ZipInfo(name)
        member_info.compress_type = compression
        with new.open(member_info, "w", force_zip64=True) as member:
            member.write(header)
            for start in range(0, data_size, len(chunk)):
                member.write(chunk[: data_size - start])
    return target


def test_ngram_load_refuses_a_zip_bomb_in_bounded_memory(tmp_path):
    # 64 MiB of zeros deflate to about 64 kB; a valid file of that size holds far less.
    rows = 2**22
    bomb = _with_member(
        _saved(tmp_path),
        tmp_path / "bomb.npz",
        "grams_2.npy",
        _npy_header((rows, 2)),
        rows * 16,
        zipfile.ZIP_DEFLATED,
    )
    assert bomb.stat().st_size < 2**20
    assert _refused(bomb, "is compressed") < 8 * 2**20


@pytest.mark.parametrize(
    ("shape", "data_size", "match"),
    [
        ((10**12, 2), 32, r"declares shape \(1000000000000, 2\).*but holds 32 bytes"),
        ((2, 2), 31, r"declares shape \(2, 2\) of int64 \(32 bytes\) but holds 31"),
        ((-2, -2), 32, r"declares shape \(-2, -2\)"),
    ],
)
def test_ngram_load_refuses_a_header_that_lies_about_the_size(tmp_path, shape, data_size, match):
    path = _with_member(
        _saved(tmp_path), tmp_path / "lies.npz", "grams_2.npy", _npy_header(shape), data_size
    )
    assert _refused(path, match) < 2**20


def test_ngram_load_refuses_members_it_does_not_know(tmp_path):
    path = _rezip(_saved(tmp_path), tmp_path / "extra.npz", extra=[("notes.txt", b"hello")])
    _refused(path, r"unexpected member 'notes.txt' \(not an .npy array\)")
    object_member = io.BytesIO()
    np.save(object_member, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path = _rezip(
        _saved(tmp_path), tmp_path / "pickle.npz", {"counts_2.npy": object_member.getvalue()}
    )
    _refused(path, "member 'counts_2' holds dtype object, not plain numbers")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("order", np.float64(3.7)),
        ("order", np.array("3")),
        ("version", np.float64(1.5)),
        ("num_tokens", np.float64(10.9)),
        ("vocab_size", np.float64(50.5)),
        ("online", np.int64(5)),
        ("min_probability", np.int64(0)),
    ],
)
def test_ngram_load_refuses_an_option_of_another_dtype(tmp_path, name, value):
    # Read as int(3.7) == 3, a float would load silently as another drafter.
    member = io.BytesIO()
    np.save(member, value)
    path = _rezip(_saved(tmp_path), tmp_path / "typed.npz", {f"{name}.npy": member.getvalue()})
    _refused(path, f"malformed option \\({name} is of dtype")


def test_ngram_load_refuses_a_flipped_compression_method(tmp_path):
    data = bytearray(_saved(tmp_path).read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = data.index(signature) + offset  # the first member's method, both headers
        data[at : at + 2] = (99).to_bytes(2, "little")
    path = tmp_path / "flipped.npz"
    path.write_bytes(bytes(data))
    _refused(path, r"compressed \(method 99\)")


def test_ngram_load_of_a_corrupted_file_is_a_value_error_naming_it(tmp_path):
    # Random corruptions of a valid file (bytes flipped, cut, inserted, in the data
    # or the zip directory): each one loads (the bytes did not matter) or is a
    # ValueError naming the file; never another exception.
    good = _saved(tmp_path).read_bytes()
    directory = good.find(b"PK\x01\x02")
    rng = np.random.default_rng(0)
    path = tmp_path / "corrupted.npz"
    for case in range(400):
        data = bytearray(good)
        at = int(rng.integers(directory if case % 2 else 0, len(data)))
        kind = case % 3
        if kind == 0:
            data[at] = int(rng.integers(256))
        elif kind == 1:
            del data[at:]
        else:
            data[at:at] = rng.bytes(int(rng.integers(1, 20)))
        path.write_bytes(bytes(data))
        try:
            NGram.load(path)
        except ValueError as error:
            assert str(path) in str(error)


def test_ngram_load_refuses_a_garbage_npy_header(tmp_path):
    header = bytearray(_npy_header((2, 2)))
    header[10:20] = b"{'descr': "[:10]  # an unterminated literal: tokenize's TokenError
    header[20:30] = b"(((((((((("
    path = _with_member(_saved(tmp_path), tmp_path / "garbage.npz", "grams_2.npy", header, 32)
    _refused(path, "malformed .npy header")


def test_ngram_load_reads_files_written_before_max_grams(tmp_path):
    with zipfile.ZipFile(_saved(tmp_path)) as archive:
        arrays = {name[: -len(".npy")]: np.load(archive.open(name)) for name in archive.namelist()}
    del arrays["max_grams"]
    path = tmp_path / "old.npz"
    np.savez(path, **arrays)
    assert NGram.load(path).max_grams == NGram().max_grams
    arrays["grams_4"] = arrays["counts_4"] = np.zeros(0, np.int64)
    np.savez(path, **arrays)
    _refused(path, "unexpected member 'counts_4' for order 3")
