"""The engine's inputs, read and checked: every check that needs no row values.

:func:`validate` turns the arguments of :func:`specdec.verify` / :func:`specdec.verify_batch`
into a :class:`VerifyInputs` (int64 ids, C-contiguous float rows viewed without a copy where
NumPy can, one generator per sequence) or raises a ``ValueError``/``TypeError`` naming
the argument, before any draw.  :mod:`specdec._tree` reads its inputs with the same
helpers; :mod:`specdec._engine_run` runs a validated step.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from specdec._validation import (
    SamplingControls,
    as_generator,
    check_verification,
    is_int,
    make_rng,
)
from specdec._verifier import Verifier, verifier_for

DRAFT_KINDS = ("logits", "probs")


def as_array(value, name: str) -> np.ndarray:
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


def float_rows(value, name: str, ndim: int, what: str) -> np.ndarray:
    """Float32/float64 rows of ``ndim`` dimensions whose last two axes are C-contiguous.

    Any other layout (and a non-native byte order) is copied once, here.
    """
    array = as_array(value, name)
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


def token_ids(
    value, name: str, ndim: int, what: str, kind: str = "token ids", bound: str = "any vocabulary"
) -> np.ndarray:
    """An int64 array of ``ndim`` dimensions; ``kind`` and ``bound`` word the errors."""
    array = as_array(value, name)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, {what}, got shape {array.shape}")
    if array.dtype.kind not in "iu" and array.size:  # [] is float64 to NumPy
        raise TypeError(f"{name} must hold integers ({kind}), got dtype {array.dtype}")
    if array.dtype != np.int64:
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} holds {int(array.max())}, beyond {bound}")
        array = array.astype(np.int64)
    return array


def check_kind(draft_kind) -> str:
    """``draft_kind`` if it is "logits" or "probs", else a ValueError."""
    if not isinstance(draft_kind, str) or draft_kind not in DRAFT_KINDS:
        raise ValueError(f"draft_kind must be 'logits' or 'probs', got {draft_kind!r}")
    return draft_kind


def check_n_threads(n_threads) -> int | None:
    """Threads for one call: at most the cores (more only wait on one another); None stays.

    The cap also bounds the module's pool, whose threads outlive the call.  The cores
    are counted only when more than one thread is asked for (``os.cpu_count`` reads
    ``/sys`` on Linux: 7 us, a seventh of a small batch's call).
    """
    if n_threads is None:
        return None
    if not is_int(n_threads):
        raise TypeError(
            f"n_threads must be a positive int or None (all cores), got {type(n_threads).__name__}"
        )
    if n_threads < 1:
        raise ValueError(f"n_threads must be a positive int or None (all cores), got {n_threads}")
    return 1 if n_threads == 1 else min(int(n_threads), os.cpu_count() or 1)


def sequence_generators(rngs, batch: int, greedy: bool) -> list:
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


class VerifyInputs(NamedTuple):
    """A validated call: what every sequence's task reads."""

    verifier: Verifier
    controls: SamplingControls
    block: bool
    kind: str | None  # "logits", "probs" or None (one-hot drafts)
    ids: np.ndarray  # (B, K) int64
    draft: np.ndarray | None  # (B, K, V)
    target: np.ndarray  # (B, K + 1, V)
    lengths: np.ndarray  # (B,) int64
    generators: list
    single: bool  # verify (no batch axis in the messages)


def validate(
    draft_token_ids,
    draft,
    target_logits,
    *,
    lengths,
    draft_kind,
    controls: tuple,
    verification,
    rngs,
    backend,
    single: bool,
) -> VerifyInputs:
    """Every check that needs no row values, in argument order; nothing is drawn.

    ``controls`` is the user's ``(temperature, top_k, top_p, min_p)``; ``single`` says
    the arguments have no batch axis (:func:`specdec.verify`), and then ``rngs`` is the
    one ``rng`` and ``lengths`` is None.
    """
    kind = check_kind(draft_kind)
    controls = SamplingControls.from_user(*controls)
    block = check_verification(verification) == "block"
    verifier = verifier_for(backend)
    extra = 0 if single else 1  # the batch axis
    ids = token_ids(
        draft_token_ids,
        "draft_token_ids",
        1 + extra,
        "(k,) drafted ids" if single else "(B, K) drafted ids, padded",
    )
    target = float_rows(
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
        draft = float_rows(draft, "draft", 2 + extra, f"{shape} {draft_kind}")
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
        sizes = token_ids(
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
        generators = sequence_generators(rngs, batch, greedy)
    return VerifyInputs(
        verifier=verifier,
        controls=controls,
        block=block,
        kind=None if draft is None else kind,
        ids=ids,
        draft=draft,
        target=target,
        lengths=sizes,
        generators=generators,
        single=single,
    )
