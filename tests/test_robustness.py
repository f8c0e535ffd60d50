"""Bad input that used to escape as a deep traceback, unbounded memory or threads.

Each test is a regression test of one case of issue 16 ("Bad input that still
escapes"): it failed before the fix.  Behavioural cases run on both backends.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import re
import sys
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest
from law_models import ContextModel

from specdec import SpeculativeDecoder
from specdec.drafters import Chain, Drafter, DraftLengthPolicy, NGram, PromptLookup
from specdec.engine import verify_batch

# -- verify_batch: threads and lengths (items 3 and 9) ---------------------------------------


def _one_hot_batch(batch, width=2, vocab=5):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(batch, width))
    target = rng.standard_normal((batch, width + 1, vocab))
    return ids, target


def test_verify_batch_caps_threads_at_the_cores(backend):
    ids, target = _one_hot_batch(64)
    result = verify_batch(
        ids, None, target, np.full(64, 2), temperature=0, n_threads=10**9, backend=backend
    )
    assert result.n_accepted.shape == (64,)
    pool = [t for t in threading.enumerate() if t.name.startswith("specdec-engine")]
    assert len(pool) <= max((os.cpu_count() or 1) - 1, 1)


def test_verify_batch_float_lengths_say_integers(backend):
    ids, target = _one_hot_batch(3)
    with pytest.raises(TypeError, match=r"lengths must hold integers \(draft lengths\), got dtype"):
        verify_batch(ids, None, target, [1.0, 2.0, 0.0], temperature=0, backend=backend)
    with pytest.raises(ValueError, match="lengths holds 18446744073709551615, beyond"):
        verify_batch(
            ids,
            None,
            target,
            np.array([1, 2, 2**64 - 1], np.uint64),
            temperature=0,
            backend=backend,
        )


# -- the decoder: misbehaving drafters, policies and draft models (items 4-7) ----------------


class _Fixed(Drafter):
    """Proposes what it is told to on its first ``times`` steps, then nothing."""

    def __init__(self, proposal, times=10**9):
        self.proposal = proposal
        self.times = times

    def propose(self, tokens, max_tokens):
        if self.times <= 0:
            return np.zeros(0, dtype=np.int64)
        self.times -= 1
        proposal = self.proposal
        return proposal() if callable(proposal) else proposal


def _generate(backend, draft, target=None, policy="fixed", **options):
    target = ContextModel(vocab_size=5, seed=1) if target is None else target
    decoder = SpeculativeDecoder(gamma=4, temperature=0, draft_length=policy, backend=backend)
    return decoder.generate(draft, target, [1, 2, 3, 1, 2], max_new_tokens=8, **options)


@pytest.mark.parametrize(
    ("proposal", "what"),
    [
        (None, "NoneType"),
        (np.int64(3), "int64"),
        (lambda: (i for i in (1, 2)), "generator"),
        (3, "int"),
    ],
)
def test_a_drafter_returning_a_non_sequence_is_named(backend, proposal, what):
    with pytest.raises(TypeError, match=rf"drafter _Fixed: propose\(\) returned a {what}"):
        _generate(backend, _Fixed(proposal))


def test_a_drafter_proposing_a_uint64_beyond_int64_is_named(backend):
    drafter = _Fixed(np.array([2**64 - 1], np.uint64))
    with pytest.raises(ValueError, match="drafter _Fixed proposed token id 18446744073709551615"):
        _generate(backend, drafter)


class _Says(DraftLengthPolicy):
    """A user policy that answers ``length()`` with whatever it is told to."""

    def __init__(self, answer):
        self.answer = answer

    def length(self, source, offered):
        return self.answer(offered) if callable(self.answer) else self.answer


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (lambda offered: offered + 1, "5"),
        (-1, "-1"),
        (1.5, "1.5"),
        (None, "None"),
        (np.float64(2.0), r"np\.float64\(2\.0\)"),
        (True, "True"),
    ],
)
@pytest.mark.parametrize("source", ["drafter", "model"])
def test_a_policy_answer_outside_the_offer_is_named(backend, answer, shown, source):
    draft = _Fixed(np.array([1, 2, 3, 4])) if source == "drafter" else ContextModel(5, seed=2)
    with pytest.raises(
        ValueError if shown in ("5", "-1") else TypeError,
        match=rf"draft-length policy _Says\.length\(\) returned {shown}.*an int in \[0, 4\]",
    ):
        _generate(backend, draft, policy=_Says(answer))


def test_a_chained_draft_model_with_another_vocabulary_is_named(backend):
    # The drafter proposes first, so the target's vocabulary is known (and its kernel
    # workspace made) before the draft model is ever called; the draft model declares
    # no vocabulary (a plain callable).
    wide = ContextModel(vocab_size=7, seed=3)
    chain = Chain(_Fixed(np.array([1, 2]), times=1), lambda ids: wide.forward(ids))
    with pytest.raises(
        ValueError, match="disagree on the vocabulary: the draft has 7 tokens, the target 5"
    ):
        _generate(backend, chain)


@pytest.mark.parametrize("draft_vocab", [3, 7])
def test_a_draft_model_sampled_first_with_another_vocabulary_is_named(backend, draft_vocab):
    # No drafter proposes on the first step, so the draft model runs before the target;
    # the target declares its vocabulary, the draft model (a plain callable) does not.
    # Its first row is checked against the target's before a token is drawn from it.
    other = ContextModel(vocab_size=draft_vocab, seed=3)
    chain = Chain(_Fixed(np.zeros(0, np.int64)), lambda ids: other.forward(ids))
    target = ContextModel(5, seed=0)
    with pytest.raises(
        ValueError,
        match=f"disagree on the vocabulary: the draft has {draft_vocab} tokens, the target 5",
    ):
        decoder = SpeculativeDecoder(3, draft_length="fixed", backend=backend)
        decoder.generate(chain, target, [0, 1, 2], 5, rng=0)
    assert target.calls == 0


def test_a_chain_names_its_drafter_returning_none():
    with pytest.raises(TypeError, match=r"drafter _Fixed \(Chain source 1\): propose\(\) returned"):
        Chain(_Fixed(np.zeros(0, np.int64)), _Fixed(None)).propose(np.arange(4), 3)


# -- drafters: bounded options and ids (items 1 and 4) ----------------------------------------


@pytest.mark.parametrize("size", [65, 10**6])
def test_lookup_ngram_size_is_bounded(size):
    with pytest.raises(
        ValueError, match=r"max_ngram_size must be an int <= 64 \(the supported maximum\), got"
    ):
        PromptLookup(max_ngram_size=size)
    assert PromptLookup(max_ngram_size=64, min_ngram_size=64).max_ngram_size == 64


@pytest.mark.parametrize("order", [33, 10**6])
def test_ngram_order_is_bounded(order):
    with pytest.raises(
        ValueError, match=r"order must be an int <= 32 \(the supported maximum\), got"
    ):
        NGram(order=order)
    assert NGram(order=32).order == 32


def _peak_bytes(function):
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "index",
    [
        lambda ids: PromptLookup(max_ngram_size=64).start(ids),
        lambda ids: NGram(order=32).fit([ids]),
    ],
)
def test_the_largest_options_cost_linear_memory(index):
    # Random text (no n-gram repeats) is the worst case.  Doubling it about doubles
    # memory (a quadratic cost would quadruple it; dictionaries grow by steps).
    ids = np.random.default_rng(0).integers(0, 50_000, 1200)
    small = _peak_bytes(lambda: index(ids[:600]))
    large = _peak_bytes(lambda: index(ids))
    assert large < 3 * small


def test_uint64_ids_beyond_int64_are_refused_by_name():
    ids = np.array([1, 2**63], np.uint64)
    with pytest.raises(
        ValueError, match=r"token_sequences\[0\] holds token id 9223372036854775808"
    ):
        NGram().fit([ids])
    with pytest.raises(ValueError, match="tokens holds token id 9223372036854775808, beyond"):
        NGram().fit([[1, 2, 3]]).propose(ids, 3)
    with pytest.raises(ValueError, match="prompt holds token id 9223372036854775808, beyond"):
        PromptLookup().start(ids)


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


def test_a_drafter_proposing_a_ragged_list_is_named(backend):
    with pytest.raises(TypeError, match=r"drafter _Fixed proposed list that is not an array"):
        _generate(backend, _Fixed([[1], [2, 3]]))


def test_ngram_load_refuses_a_flipped_compression_method(tmp_path):
    data = bytearray(_saved(tmp_path).read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = data.index(signature) + offset  # the first member's method, both headers
        data[at : at + 2] = (99).to_bytes(2, "little")
    path = tmp_path / "flipped.npz"
    path.write_bytes(bytes(data))
    _refused(path, r"compressed \(method 99\)")


# -- NGram: saving while another thread learns (item 10) -----------------------------------


@pytest.mark.parametrize("operation", ["save", "deepcopy", "pickle"])
def test_ngram_save_while_another_thread_learns(tmp_path, operation):
    # Deterministic interleaving: at each C call save makes, the main thread lets the
    # learner thread run one update (new n-grams) and waits for it.  Before the fix,
    # an update in the middle of save's loop over the counts broke it ("dictionary
    # changed size during iteration").  With the lock, the learner waits for save's
    # copy, the wait below times out once, and both finish.
    drafter = NGram(order=3).fit([list(range(50))])
    before = drafter.num_grams
    go, done, errors = threading.Event(), threading.Event(), []
    stopping = False

    def learner():
        token = 1000
        while True:
            go.wait()
            go.clear()
            if stopping:
                return
            try:
                drafter.extend(np.array([token, token + 1, token + 2]), 3)
            except Exception as error:  # pragma: no cover - reported below
                errors.append(error)
            token += 3
            done.set()

    blocked = False

    def hook(frame, event, arg):
        nonlocal blocked
        if event == "c_call" and not blocked:
            done.clear()
            go.set()
            blocked = not done.wait(2.0)  # the learner waits for the lock that save holds

    thread = threading.Thread(target=learner)
    thread.start()
    sys.setprofile(hook)
    try:
        if operation == "save":
            drafter.save(tmp_path / "saved.npz")
        elif operation == "deepcopy":
            copied = copy.deepcopy(drafter)
        else:
            pickled = pickle.dumps(drafter)
    finally:
        sys.setprofile(None)
        done.wait(10.0)
        stopping = True
        go.set()
        thread.join(10.0)
    assert blocked and not errors and not thread.is_alive()
    if operation == "save":
        copied = NGram.load(tmp_path / "saved.npz")
    elif operation == "pickle":
        copied = pickle.loads(pickled)
    assert before <= copied.num_grams < drafter.num_grams


# -- NGram: bounded memory, with a documented eviction rule (item 11) -----------------------


def test_ngram_forgets_the_least_seen_contexts_first():
    drafter = NGram(order=2, max_grams=4, min_probability=0)
    drafter.fit([[1, 2, 1, 2, 1, 2]])  # contexts (1,) seen 3 times, (2,) twice
    drafter.fit([[5, 6]])
    drafter.fit([[7, 8]])
    assert drafter.num_grams == 4
    # A fifth n-gram: contexts go, least seen first and, among equals, the first seen
    # first, down to 3/4 of max_grams: (5,) and (7,) go.
    drafter.fit([[9, 10]])
    assert drafter.num_grams == 3
    assert [len(drafter.propose(np.array([token]), 1)) for token in (5, 7, 9, 1, 2)] == [
        0,
        0,
        1,
        1,
        1,
    ]


def test_ngram_memory_is_bounded_online():
    drafter = NGram(order=4, max_grams=500)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1000, 8)
    drafter.start(tokens)
    for _ in range(300):  # random text: about 3 new n-grams per token
        tokens = np.concatenate([tokens, rng.integers(0, 1000, 4)])
        drafter.extend(tokens, 4)
        assert drafter.num_grams <= 500
    assert drafter.max_grams == 500
    # New n-grams of one context count too.
    one_context = NGram(order=2, max_grams=10).fit([[1, token] for token in range(2, 100)])
    assert one_context.num_grams <= 10
    assert NGram(max_grams=None).max_grams is None
    with pytest.raises(ValueError, match="max_grams must be an int >= 1, got 0"):
        NGram(max_grams=0)


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
