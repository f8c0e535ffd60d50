"""Argument checks shared by the drafters: one clear error, before any work."""

from __future__ import annotations

import numpy as np

from specdec._validation import is_int, is_real

_EMPTY = np.zeros(0, dtype=np.int64)
# Compared by identity first: ``dtype == np.int64`` converts the type on every call,
# which costs about 10 us when a model's pass has just evicted the caches.
_INT64 = _EMPTY.dtype


def empty_proposal() -> np.ndarray:
    """A fresh empty int64 array: "no proposal" (fresh, so a caller may keep it)."""
    return _EMPTY.copy()


def check_proposal(proposal, max_tokens: int, name: str) -> np.ndarray:
    """A drafter's proposal as int64 ids, refused clearly (naming *name*) if it is not one.

    A proposal is a 1-D array (or list or tuple) of int ids in ``[0, 2**63)``, at most
    *max_tokens* of them; an empty one of any dtype means "no proposal".
    """
    if (
        type(proposal) is np.ndarray
        and (proposal.dtype is _INT64 or proposal.dtype == np.int64)
        and proposal.ndim == 1
    ):
        array = proposal  # the common case, on every step
    elif isinstance(proposal, (np.ndarray, list, tuple)):
        try:
            array = np.asarray(proposal)
        except (TypeError, ValueError) as exc:  # ragged lists, objects NumPy cannot read
            raise TypeError(
                f"drafter {name} proposed {type(proposal).__name__} that is not an array "
                f"of ids ({exc}); expected a 1-D array of int token ids"
            ) from None
        if array.ndim == 1 and array.size == 0:
            return empty_proposal()
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise TypeError(
                f"drafter {name} proposed {array.dtype} ids of shape {array.shape}; "
                "expected a 1-D array of int token ids"
            )
        if array.dtype == np.uint64 and array.max() > np.iinfo(np.int64).max:
            raise ValueError(
                f"drafter {name} proposed token id {int(array.max())}, beyond any vocabulary"
            )
        array = array.astype(np.int64, copy=False)
    else:
        raise TypeError(
            f"drafter {name}: propose() returned a {type(proposal).__name__}; expected a "
            "1-D array of int token ids (empty for no proposal)"
        )
    if len(array) > max_tokens:
        raise ValueError(
            f"drafter {name} proposed {len(array)} tokens, more than max_tokens={max_tokens}"
        )
    # min() of the list: a proposal is short, and NumPy's reduction costs more to call
    if len(array) and min(array.tolist()) < 0:
        raise ValueError(f"drafter {name} proposed a negative token id ({array.min()})")
    return array


def check_candidates(candidates, max_tokens: int, max_candidates: int, name: str) -> list:
    """A drafter's candidates as a list of non-empty int64 proposals (see check_proposal)."""
    if not isinstance(candidates, (list, tuple)):
        raise TypeError(
            f"drafter {name}: propose_candidates() returned a {type(candidates).__name__}; "
            "expected a list of 1-D arrays of int token ids"
        )
    if len(candidates) > max_candidates:
        raise ValueError(
            f"drafter {name} proposed {len(candidates)} candidates, more than "
            f"max_candidates={max_candidates}"
        )
    checked = [check_proposal(c, max_tokens, name) for c in candidates]
    return [c for c in checked if len(c)]


def check_int_option(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """An option that must be an int >= *minimum* (and <= *maximum*); a bool is not an int."""
    if type(value) is int and value >= minimum and (maximum is None or value <= maximum):
        return value  # the common case, on every step
    if not is_int(value):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be an int <= {maximum} (the supported maximum), got {value}")
    return int(value)


def check_probability_option(name: str, value, closed: bool = True) -> float:
    """An option that must be a real number in [0, 1] (in [0, 1) unless *closed*)."""
    interval = "[0, 1]" if closed else "[0, 1)"
    if not is_real(value):
        raise TypeError(
            f"{name} must be a number in {interval}, got {type(value).__name__} {value!r}"
        )
    if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):  # also refuses NaN
        raise ValueError(f"{name} must be a number in {interval}, got {value}")
    return float(value)


def check_bool_option(name: str, value) -> bool:
    """An option that must be True or False (not merely truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def check_max_tokens(max_tokens) -> int:
    """``propose``'s budget: an int >= 0."""
    return check_int_option("max_tokens", max_tokens, 0)


def as_sequence(tokens, name: str = "tokens") -> np.ndarray:
    """*tokens* as a 1-D int64 array, without a copy when it already is one.

    Only the shape and the dtype are checked (O(1) for an array): this runs on every
    decoding step, and the decoder hands over ids it has already range-checked.
    """
    if type(tokens) is np.ndarray:
        array = tokens
    else:
        try:
            array = np.asarray(tokens)
        except (TypeError, ValueError) as exc:  # ragged or nested: NumPy's message alone
            raise TypeError(f"{name} must be a sequence of int token ids ({exc})") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.dtype is not _INT64 and array.dtype != np.int64:
        if array.size == 0:
            return _EMPTY
        if array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold int token ids, got dtype {array.dtype}")
        check_fits_int64(array, name)
        array = array.astype(np.int64)
    return array


def check_fits_int64(ids: np.ndarray, name: str) -> None:
    """Unsigned ids must fit in int64 (a cast would wrap them to negative ids)."""
    if ids.dtype.kind == "u" and ids.size and ids.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds token id {int(ids.max())}, beyond any vocabulary")


def check_n_new(n_new, length: int) -> int:
    """``extend``'s count of appended tokens: an int in [0, len(tokens)]."""
    if type(n_new) is int and 0 <= n_new <= length:  # the common case, on every step
        return n_new
    if not is_int(n_new):
        raise TypeError(f"n_new must be an int >= 0, got {type(n_new).__name__} {n_new!r}")
    if not 0 <= n_new <= length:
        raise ValueError(f"n_new must lie in [0, len(tokens)] = [0, {length}], got {n_new}")
    return int(n_new)


def check_ids(ids: np.ndarray, name: str, vocab_size: int | None) -> None:
    """Ids must be >= 0, and < *vocab_size* when it is known (O(len(ids)))."""
    if ids.size == 0:
        return
    low = int(ids.min())
    if low < 0:
        raise ValueError(f"{name} holds a negative token id ({low})")
    if vocab_size is not None:
        high = int(ids.max())
        if high >= vocab_size:
            raise ValueError(
                f"{name} holds token id {high}, outside [0, vocab_size) = [0, {vocab_size})"
            )
