"""The engine API: one functional verification step, for one sequence or a batch.

Serving engines do not run a decoder loop: they score the drafts of many sequences
with one target pass and then call one verification kernel over the batch (FlashInfer's
``chain_speculative_sampling``, vLLM's rejection sampler).  :func:`verify` is that
step for one sequence and :func:`verify_batch` for a batch with ragged draft lengths,
run across cores.  Both keep the output law exactly the target's, under the same
temperature, top-k, top-p and min-p as :class:`specdec.SpeculativeDecoder`, and make
the decoder's decisions for the same uniforms.

The draft law q
---------------
``draft_kind="logits"`` (default): ``draft`` holds the draft model's logits, and q
is computed from them under the same controls, by the kernel that computes it when
the decoder samples a draft token (``row_laws``: bit-identical to ``sample_token``'s
law).  ``draft_kind="probs"``: ``draft`` holds probabilities, taken as given and
normalised by their row sums.  ``draft=None``: one-hot drafts (a deterministic
drafter such as prompt lookup): a draft x is kept with probability p(x), and after a
rejection the next token is drawn from p without x, renormalised.

Determinism
-----------
Each sequence draws only from its own generator, in the order of the kernels (see
``specdec._core.verify``): a sequence's result depends on its own rows, drafts and
generator only, never on the rest of the batch, its position in it or the number
of threads (vLLM #13196).  A generator must therefore not be shared by two sequences
of one call (refused).

Threads
-------
The compiled kernels release the GIL while they read the rows, so the sequences of a
batch run in parallel on a thread pool kept by this module (created on first use,
grown if a call asks for more threads, up to the number of cores; never per call).
The calling thread works too; each thread keeps its own kernel ``Workspace`` and
draft buffers, sized for the vocabulary and reused across calls.  The pure-Python
backend runs on the same threads (without speed-up: NumPy's passes are short and the
GIL is held between them).

Inputs
------
float32 and float64 arrays are read in place; so is anything NumPy can view without
a copy (``np.from_dlpack``: CPU torch tensors and other DLPack producers, or the
buffer/array protocols).  The kernels read C-contiguous rows: an array whose rows
are not (a transposed or strided view) is copied once per call.  Padding (draft ids
and rows beyond a sequence's length) is never read and may hold anything.  Nothing
is ever written to the caller's arrays; read-only arrays are accepted.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from specdec._backend import kernels_for
from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._validation import (
    SamplingControls,
    as_generator,
    check_verification,
    is_int,
    make_rng,
)

__all__ = ["BatchResult", "verify", "verify_batch"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
DRAFT_KINDS = ("logits", "probs")


class BatchResult(NamedTuple):
    """What :func:`verify_batch` returns (a tuple: ``n, nxt, tokens = verify_batch(...)``).

    Attributes
    ----------
    n_accepted : ndarray of int64, shape (B,)
        Drafts kept by each sequence (a prefix of its drafts).
    next_tokens : ndarray of int64, shape (B,)
        Each sequence's next token: the residual draw after a rejection, else the bonus.
    tokens : ndarray of int64, shape (B, K + 1)
        The tokens each sequence emits, ``n_accepted[b] + 1`` of them (the kept drafts,
        then the next token), padded with -1.
    """

    n_accepted: np.ndarray
    next_tokens: np.ndarray
    tokens: np.ndarray


# --- inputs ------------------------------------------------------------------------------


def _as_array(value, name: str) -> np.ndarray:
    """A NumPy view of ``value`` (no copy when NumPy can view it)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TypeError(
                f"{name} must be an array NumPy can read on the CPU (np.from_dlpack failed: {exc})"
            ) from None
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array ({exc})") from None


def _float_rows(value, name: str, ndim: int, what: str) -> np.ndarray:
    """Float32/float64 rows of ``ndim`` dimensions whose last two axes are C-contiguous.

    Any other layout (and a non-native byte order) is copied once, here.
    """
    array = _as_array(value, name)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, {what}, got shape {array.shape}")
    dtype = array.dtype
    if dtype.kind != "f" or dtype.itemsize not in (4, 8):
        raise TypeError(f"{name} must hold float32 or float64 values, got dtype {dtype}")
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    rows, vocab = array.shape[-2:]
    step = array.itemsize
    if (vocab > 1 and array.strides[-1] != step) or (
        rows > 1 and array.strides[-2] != vocab * step
    ):
        # The kernels read each sequence's rows as one C-contiguous block; the stride
        # between sequences may be anything (a batch can be a slice of a larger one).
        array = np.ascontiguousarray(array)
    return array


def _token_ids(
    value, name: str, ndim: int, what: str, kind: str = "token ids", bound: str = "any vocabulary"
) -> np.ndarray:
    """An int64 array of ``ndim`` dimensions; ``kind`` and ``bound`` word the errors."""
    array = _as_array(value, name)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, {what}, got shape {array.shape}")
    if array.dtype.kind not in "iu" and array.size:  # [] is float64 to NumPy
        raise TypeError(f"{name} must hold integers ({kind}), got dtype {array.dtype}")
    if array.dtype != np.int64:
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} holds {int(array.max())}, beyond {bound}")
        array = array.astype(np.int64)
    return array


def _check_kind(draft_kind) -> str:
    if not isinstance(draft_kind, str) or draft_kind not in DRAFT_KINDS:
        raise ValueError(f"draft_kind must be 'logits' or 'probs', got {draft_kind!r}")
    return draft_kind


def _check_n_threads(n_threads) -> int:
    """Threads for one call: at most the cores (more only wait on one another).

    The cap also bounds the module's pool, whose threads outlive the call.
    """
    cores = os.cpu_count() or 1
    if n_threads is None:
        return cores
    if not is_int(n_threads):
        raise TypeError(
            f"n_threads must be a positive int or None (all cores), got {type(n_threads).__name__}"
        )
    if n_threads < 1:
        raise ValueError(f"n_threads must be a positive int or None (all cores), got {n_threads}")
    return min(int(n_threads), cores)


def _generators(rngs, batch: int, greedy: bool) -> list:
    """One generator per sequence, each with its own bit generator."""
    if rngs is None:
        if greedy:
            return [None] * batch
        raise TypeError(
            "rngs is required when temperature > 0: a sequence of one "
            "numpy.random.Generator or int seed per sequence"
        )
    if isinstance(rngs, (np.random.Generator, np.random.BitGenerator, str, bytes)) or is_int(rngs):
        raise TypeError(
            f"rngs must be a sequence of {batch} Generators or int seeds, one per sequence, "
            f"got a single {type(rngs).__name__} (a generator shared by the batch would make "
            "each sequence's result depend on its neighbours)"
        )
    try:
        rngs = list(rngs)
    except TypeError:
        raise TypeError(
            f"rngs must be a sequence of {batch} Generators or int seeds, got {type(rngs).__name__}"
        ) from None
    if len(rngs) != batch:
        raise ValueError(
            f"rngs must hold one generator or seed per sequence ({batch}), got {len(rngs)}"
        )
    generators = []
    for b, rng in enumerate(rngs):
        try:
            generators.append(as_generator(rng, f"rngs[{b}]"))
        except TypeError:
            raise TypeError(
                f"rngs[{b}] must be a numpy.random.Generator or an int seed, "
                f"got {type(rng).__name__}"
            ) from None
    seen = {}
    for b, generator in enumerate(generators):
        other = seen.setdefault(id(generator.bit_generator), b)
        if other != b:
            raise ValueError(
                f"rngs[{other}] and rngs[{b}] share one bit generator: each sequence needs "
                "its own, or its result would depend on the other's"
            )
    return generators


class _Step(NamedTuple):
    """A validated call: what every sequence's task reads."""

    kernels: object
    controls: SamplingControls
    block: bool
    kind: str | None  # "logits", "probs" or None (one-hot drafts)
    ids: np.ndarray  # (B, K) int64
    draft: np.ndarray | None  # (B, K, V)
    target: np.ndarray  # (B, K + 1, V)
    lengths: np.ndarray  # (B,) int64
    generators: list
    single: bool  # verify (no batch axis in the messages)


def _validate(
    draft_token_ids,
    draft,
    target_logits,
    lengths,
    draft_kind,
    temperature,
    top_k,
    top_p,
    min_p,
    verification,
    rngs,
    backend,
    single: bool,
) -> _Step:
    """Every check that needs no row values, in argument order; nothing is drawn."""
    kind = _check_kind(draft_kind)
    controls = SamplingControls.from_user(temperature, top_k, top_p, min_p)
    block = check_verification(verification) == "block"
    kernels = kernels_for(backend)
    extra = 0 if single else 1  # the batch axis
    ids = _token_ids(
        draft_token_ids,
        "draft_token_ids",
        1 + extra,
        "(k,) drafted ids" if single else "(B, K) drafted ids, padded",
    )
    target = _float_rows(
        target_logits, "target_logits", 2 + extra, "(k + 1, V)" if single else "(B, K + 1, V)"
    )
    if single:
        ids, target = ids[np.newaxis], target[np.newaxis]
    batch, width = ids.shape
    vocab = target.shape[2]
    if target.shape[0] != batch or target.shape[1] != width + 1:
        expected = f"({width + 1}, V)" if single else f"({batch}, {width + 1}, V)"
        raise ValueError(
            f"target_logits must have shape {expected} (one row per draft and "
            f"one for the next token), got {target.shape[1 - extra :]}"
        )
    if vocab < 1:
        raise ValueError("target_logits has no vocabulary (its last axis is empty)")
    if draft is not None:
        shape = "(k, V)" if single else "(B, K, V)"
        draft = _float_rows(draft, "draft", 2 + extra, f"{shape} {draft_kind}")
        if single:
            draft = draft[np.newaxis]
        if draft.shape[:2] != (batch, width):
            expected = f"({width}, V)" if single else f"({batch}, {width}, V)"
            raise ValueError(
                f"draft must have shape {expected} (one row per draft), got "
                f"{draft.shape[1 - extra :]}"
            )
        if draft.shape[2] != vocab:
            raise ValueError(
                f"draft and target_logits disagree on the vocabulary: draft has "
                f"{draft.shape[2]} columns, target_logits {vocab}"
            )
    if single:
        sizes = np.array([width], dtype=np.int64)
    else:
        sizes = _token_ids(
            lengths, "lengths", 1, "(B,) draft lengths", "draft lengths", "any draft length"
        )
        if len(sizes) != batch:
            raise ValueError(
                f"lengths must hold one length per sequence ({batch}), got {len(sizes)}"
            )
        if batch and (sizes.min() < 0 or sizes.max() > width):
            b = int(np.flatnonzero((sizes < 0) | (sizes > width))[0])
            raise ValueError(f"lengths[{b}] is {int(sizes[b])}, outside [0, K = {width}]")
    if width and batch:
        used = np.arange(width) < sizes[:, np.newaxis]
        bad = used & ((ids < 0) | (ids >= vocab))
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            where = f"draft_token_ids[{i}]" if single else f"draft_token_ids[{b}, {i}]"
            raise ValueError(f"{where} is {int(ids[b, i])}, outside the vocabulary [0, {vocab})")
    greedy = controls.temperature == 0.0
    if single:
        generators = [None if greedy and rngs is None else make_rng(rngs)]
    else:
        generators = _generators(rngs, batch, greedy)
    return _Step(
        kernels,
        controls,
        block,
        None if draft is None else kind,
        ids,
        draft,
        target,
        sizes,
        generators,
        single,
    )


# --- one sequence ----------------------------------------------------------------------


class _Scratch:
    """One thread's kernel workspace and draft buffers, for one backend and vocabulary."""

    def __init__(self, kernels, vocab: int):
        self.work = kernels.Workspace(vocab)
        self.vocab = vocab
        self.laws = np.zeros(0, LAW_DTYPE)
        self.weights = {}

    def buffers(self, rows: int, dtype):
        """(laws, weights) with room for ``rows`` draft rows of ``dtype``."""
        if len(self.laws) < rows:
            self.laws = np.zeros(rows, LAW_DTYPE)
        weights = self.weights.get(dtype)
        if weights is None or len(weights) < rows:
            weights = self.weights[dtype] = np.empty((rows, self.vocab), dtype)
        return self.laws[:rows], weights[:rows]


_local = threading.local()


def _scratch(kernels, vocab: int) -> _Scratch:
    """Get this thread's scratch for ``kernels`` at ``vocab`` (one per backend is kept)."""
    kept = getattr(_local, "scratch", None)
    if kept is None:
        kept = _local.scratch = {}
    scratch = kept.get(kernels.__name__)
    if scratch is None or scratch.vocab != vocab:
        scratch = kept[kernels.__name__] = _Scratch(kernels, vocab)
    return scratch


def _where(step: _Step, name: str, b: int, i: int) -> str:
    return f"{name}[{i}]" if step.single else f"{name}[{b}, {i}] (sequence {b}, row {i})"


def _draft_law(step: _Step, b: int, n: int, scratch: _Scratch):
    """(weights, laws) of sequence b's n draft rows for the kernel; None, None if one-hot."""
    if step.kind is None or n == 0:
        return None, None
    rows = step.draft[b, :n]
    ids = step.ids[b, :n]
    greedy = step.controls.temperature == 0.0
    if step.kind == "logits":
        laws, weights = scratch.buffers(n, rows.dtype)
        try:
            step.kernels.row_laws(rows, step.controls, laws, weights, scratch.work)
        except InvalidLogitsError as error:
            raise ValueError(
                f"{_where(step, 'draft', b, error.row)} holds {error.reason}"
            ) from error
        if not greedy:
            zero = weights[np.arange(n), ids] <= 0.0
            if zero.any():
                i = int(np.flatnonzero(zero)[0])
                raise ValueError(
                    f"{_where(step, 'draft_token_ids', b, i)}: token {int(ids[i])} has "
                    "probability 0 under the draft's law (its logits under these sampling "
                    "controls), so it cannot have been drawn from it"
                )
        return weights, laws
    # probabilities, taken as given: finite, >= 0, positive mass, positive q(x)
    low = rows.min(axis=1)
    totals = rows.sum(axis=1, dtype=np.float64)
    bad = ~(low >= 0.0) | ~(totals < np.inf)  # NaN fails both comparisons
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{_where(step, 'draft', b, i)} (draft_kind='probs') holds NaN, "
            "inf or a negative probability"
        )
    bad = ~(totals > 0.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{_where(step, 'draft', b, i)} (draft_kind='probs') has no positive mass")
    if not greedy:
        zero = rows[np.arange(n), ids] <= 0.0
        if zero.any():
            i = int(np.flatnonzero(zero)[0])
            raise ValueError(
                f"{_where(step, 'draft_token_ids', b, i)}: token {int(ids[i])} has probability "
                "0 in draft (draft_kind='probs'), so it cannot have been drawn from it"
            )
    laws = np.zeros(n, LAW_DTYPE)
    laws["total"] = totals
    return rows, laws


def _verify_one(step: _Step, b: int) -> tuple[int, int]:
    """Verify sequence b on this thread; ValueError naming the row if one is invalid."""
    scratch = _scratch(step.kernels, step.target.shape[2])
    n = int(step.lengths[b])
    weights, laws = _draft_law(step, b, n, scratch)
    try:
        return step.kernels.verify(
            step.target[b, : n + 1],
            step.ids[b, :n],
            weights,
            laws,
            True,
            step.controls,
            step.generators[b],
            scratch.work,
            step.block,
        )
    except InvalidLogitsError as error:
        raise ValueError(
            f"{_where(step, 'target_logits', b, error.row)} holds {error.reason}"
        ) from error


# --- the pool ------------------------------------------------------------------------------

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _submit(function, copies: int) -> list:
    """Run ``copies`` calls of ``function`` on the module's pool.

    The pool is created, or grown when a call asks for more threads than it has, under
    the lock: a pool being replaced still finishes what it was given.
    """
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < copies:
            old = _pool
            _pool_size = max(copies, (os.cpu_count() or 1) - 1, 1)
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="specdec-engine")
            if old is not None:
                old.shutdown(wait=False)
        return [_pool.submit(function) for _ in range(copies)]


def _run(step: _Step, n_threads: int, out_accepted, out_next) -> None:
    """Verify every sequence (on up to ``n_threads`` threads, this one included).

    Sequences are claimed in increasing order from one counter, and every sequence is
    verified even after another failed: so each generator advances as its own call
    would, and the error raised (the lowest failing sequence's) does not depend on the
    scheduling.
    """
    batch = len(step.ids)
    errors: dict[int, BaseException] = {}
    claim = itertools.count()  # next() is atomic under the GIL

    def work() -> None:
        for b in iter(claim.__next__, None):
            if b >= batch:
                return
            try:
                out_accepted[b], out_next[b] = _verify_one(step, b)
            except Exception as error:
                errors[b] = error

    helpers = min(n_threads, batch) - 1
    futures = _submit(work, helpers) if helpers > 0 else []
    try:
        work()
    finally:
        for future in futures:
            future.result()
    if errors:
        raise errors[min(errors)]


# --- the API -------------------------------------------------------------------------------


def verify(
    draft_token_ids,
    draft,
    target_logits,
    *,
    draft_kind="logits",
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    verification="block",
    rng=None,
    backend=None,
):
    """Verify one sequence's k drafted tokens against the target's k + 1 rows.

    Parameters
    ----------
    draft_token_ids : array-like of int, shape (k,)
        The drafted tokens, k >= 0 (ids in [0, V)).
    draft : array of float32 or float64, shape (k, V), or None
        The draft's rows: logits (``draft_kind="logits"``; q is their law under the
        sampling controls, as the decoder computes it when it samples a draft), or
        probabilities (``draft_kind="probs"``; finite, >= 0, normalised by their row
        sums, with positive mass on each row and on the drafted token); None for
        one-hot drafts (a deterministic drafter).  Row i is the law ``draft_token_ids[i]``
        was drawn from: a drafted token of draft probability 0 is refused (except at
        temperature 0, where drafts are judged against the target's argmax alone; the
        draft rows are still checked).
    target_logits : array of float32 or float64, shape (k + 1, V)
        The target's logits: row i predicts draft i, row k the token after the drafts.
    draft_kind : {"logits", "probs"}, default "logits"
        What ``draft`` holds (ignored when it is None).
    temperature, top_k, top_p, min_p
        Sampling controls of both models, as for :class:`specdec.SpeculativeDecoder`;
        temperature 0 is greedy (a draft is kept iff it is the target's argmax; no
        uniform is drawn).
    verification : {"block", "token"}, default "block"
        Block verification (Sun et al., ICLR 2025) or token by token (Leviathan et al.
        2023); both exact.
    rng : numpy.random.Generator or int, optional
        The uniforms' source; an int seeds a new generator; default: a seed drawn from
        NumPy's global state (as :func:`specdec.sample` does).
    backend : {"cython", "python"}, optional
        Kernel backend; default :data:`specdec.BACKEND`.

    Returns
    -------
    n_accepted : int
        Drafts kept (a prefix of ``draft_token_ids``).
    next_token : int
        The token after them: a draw from the residual after a rejection, else the
        bonus token from row k.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named (checked before anything is drawn), or rows that define
        no law: target or draft logits with NaN or +inf, or all -inf, in a row the
        decision reads (every draft row, the target rows up to the decision), bad draft
        probabilities, or a drafted token of draft probability 0 (it cannot have been
        drawn from q).  Such row errors may come after uniforms were drawn.

    Examples
    --------
    >>> import numpy as np
    >>> from specdec.engine import verify
    >>> rng = np.random.default_rng(0)
    >>> target = rng.standard_normal((3, 10))
    >>> n_accepted, token = verify([4, 7], rng.standard_normal((2, 10)), target, rng=rng)
    """
    step = _validate(
        draft_token_ids,
        draft,
        target_logits,
        None,
        draft_kind,
        temperature,
        top_k,
        top_p,
        min_p,
        verification,
        rng,
        backend,
        single=True,
    )
    n_accepted, token = _verify_one(step, 0)
    return int(n_accepted), int(token)


def verify_batch(
    draft_token_ids,
    draft,
    target_logits,
    lengths,
    *,
    draft_kind="logits",
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    verification="block",
    rngs=None,
    n_threads=None,
    backend=None,
) -> BatchResult:
    """Verify a batch of sequences with ragged draft lengths, in parallel.

    Sequence b is verified exactly as ``verify(draft_token_ids[b, :n], draft[b, :n],
    target_logits[b, :n + 1], rng=rngs[b], ...)`` with ``n = lengths[b]`` would be,
    whatever the rest of the batch, its position in it or the number of threads.

    Parameters
    ----------
    draft_token_ids : array-like of int, shape (B, K)
        Drafted tokens, padded: only ``draft_token_ids[b, :lengths[b]]`` is read.
    draft : array of float32 or float64, shape (B, K, V), or None
        Draft rows (logits or probabilities, see ``draft_kind``), padded like the ids;
        None for one-hot drafts.
    target_logits : array of float32 or float64, shape (B, K + 1, V)
        Target rows: ``target_logits[b, :lengths[b] + 1]`` is read, as far as the
        decision needs.
    lengths : array-like of int, shape (B,)
        Each sequence's number of drafts, in [0, K] (0: only the next token is drawn).
    draft_kind, temperature, top_k, top_p, min_p, verification, backend
        As for :func:`verify`.
    rngs : sequence of numpy.random.Generator or int, length B
        One generator (or seed) per sequence, each with its own bit generator; may be
        None only for greedy decoding (temperature 0), which draws nothing.
    n_threads : int, optional
        Threads to run on, the calling one included; default ``os.cpu_count()``;
        1 runs inline.  A larger number is capped at ``os.cpu_count()``: the kernels
        are CPU-bound, so more threads than cores only wait on one another (and the
        module's pool, whose threads outlive the call, stays at most that large).

    Returns
    -------
    BatchResult
        ``(n_accepted, next_tokens, tokens)``: int64 arrays of shapes (B,), (B,) and
        (B, K + 1); ``tokens[b]`` holds the kept drafts, the next token, then -1s.

    Raises
    ------
    TypeError, ValueError
        As for :func:`verify`; argument errors come before any work.  A row error names
        the lowest failing sequence; every other sequence is still verified (so each
        generator advances as its own call would), and the results are discarded.
    """
    n_threads = _check_n_threads(n_threads)
    step = _validate(
        draft_token_ids,
        draft,
        target_logits,
        lengths,
        draft_kind,
        temperature,
        top_k,
        top_p,
        min_p,
        verification,
        rngs,
        backend,
        single=False,
    )
    batch, width = step.ids.shape
    n_accepted = np.zeros(batch, dtype=np.int64)
    next_tokens = np.full(batch, -1, dtype=np.int64)
    _run(step, n_threads, n_accepted, next_tokens)
    tokens = np.where(
        np.arange(width + 1) < n_accepted[:, np.newaxis], np.pad(step.ids, ((0, 0), (0, 1))), -1
    )
    tokens[np.arange(batch), n_accepted] = next_tokens
    return BatchResult(n_accepted, next_tokens, tokens)
