"""Argument checks shared by every entry point: one clear error, before any work.

The predicates (`is_int`, `is_real`) and `MAX_GAMMA` are shared by the engine, the
drafters and the CLI: this module is their one source.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass

import numpy as np


def is_int(value) -> bool:
    """True for an integer (Python or NumPy), never for a bool."""
    if type(value) is int:  # the common case, without the ABC's isinstance (0.3-0.5 us)
        return True
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def is_real(value) -> bool:
    """True for a real number (Python or NumPy), never for a bool."""
    if type(value) is float or type(value) is int:  # the common cases, without the ABCs
        return True
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(
        value, bool
    )


#: The largest draft length accepted.  Far beyond any useful draft (the cost of a
#: target pass grows with its length), and small enough that the per-step buffers,
#: (gamma, V) draft weights, stay allocatable.
MAX_GAMMA = 1024


def check_gamma(gamma, name: str = "gamma") -> int:
    """Number of draft tokens per step: an int in [1, MAX_GAMMA]."""
    if not is_int(gamma):
        raise TypeError(
            f"{name} must be an int in [1, {MAX_GAMMA}], got {type(gamma).__name__} {gamma!r}"
        )
    if not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(f"{name} must be an int in [1, {MAX_GAMMA}], got {gamma}")
    return int(gamma)


#: The draft verification schemes of ``SpeculativeDecoder``.
VERIFICATIONS = ("block", "token")


def check_verification(verification) -> str:
    """Verification scheme: "block" or "token"."""
    if not isinstance(verification, str) or verification not in VERIFICATIONS:
        raise ValueError(f"verification must be 'block' or 'token', got {verification!r}")
    return verification


def check_max_new_tokens(max_new_tokens) -> int:
    """Token budget: an int >= 0."""
    if not is_int(max_new_tokens):
        raise TypeError(f"max_new_tokens must be an int >= 0, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return int(max_new_tokens)


def check_prompt(prompt_ids) -> np.ndarray:
    """The prompt as a fresh int64 array: non-empty, ids in [0, 2**63).

    One-dimensional, or of shape (1, L) as tokenizers return a batch of one.
    """
    if isinstance(prompt_ids, (str, bytes)):
        raise TypeError("prompt_ids must be a sequence of int token ids, not a string")
    if _holds_bool(prompt_ids):  # np.asarray would turn [1, True] into [1, 1]
        raise TypeError("prompt_ids must hold int token ids, got a bool")
    try:
        array = np.asarray(prompt_ids)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"prompt_ids must be a sequence of int token ids ({exc})") from None
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]  # a batch of one, as tokenizers return it
    if array.ndim != 1:
        raise ValueError(f"prompt_ids must have shape (L,) or (1, L), got shape {array.shape}")
    if array.size == 0:
        raise ValueError(
            "prompt_ids is empty: the first new token needs the logits of a prompt token"
        )
    if array.dtype.kind not in "iu" and not (
        array.dtype == object and all(is_int(v) for v in array)
    ):
        raise TypeError(f"prompt_ids must hold int token ids, got dtype {array.dtype}")
    # Python ints, so that no id wraps around or overflows before it is checked
    low, high = int(min(array)), int(max(array))
    if low < 0:
        raise ValueError(f"prompt_ids holds a negative token id ({low})")
    if high > np.iinfo(np.int64).max:
        raise ValueError(f"prompt_ids holds token id {high}, beyond any vocabulary")
    return array.astype(np.int64)


def _holds_bool(value) -> bool:
    """Whether a (nested) list or tuple holds a bool anywhere."""
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(item) for item in value)
    return isinstance(value, (bool, np.bool_))


def check_eos(eos_token_id) -> int | None:
    """End-of-sequence id: None or an int >= 0."""
    if eos_token_id is None:
        return None
    if not is_int(eos_token_id):
        raise TypeError(f"eos_token_id must be an int or None, got {type(eos_token_id).__name__}")
    if eos_token_id < 0:
        raise ValueError(f"eos_token_id must be >= 0, got {eos_token_id}")
    return int(eos_token_id)


def check_token_range(prompt: np.ndarray, eos_token_id: int | None, vocab_size: int) -> None:
    """Ids must lie in [0, V) once V is known."""
    top = int(prompt.max())
    if top >= vocab_size:
        raise ValueError(f"prompt_ids holds token id {top}, outside [0, {vocab_size})")
    if eos_token_id is not None and eos_token_id >= vocab_size:
        raise ValueError(f"eos_token_id {eos_token_id} is outside [0, {vocab_size})")


def make_rng(rng, seed=None) -> np.random.Generator:
    """The generator a run draws from.

    ``rng`` (a Generator or a seed) wins; else ``seed``; else one seed drawn from
    NumPy's global state, so that ``np.random.seed(s)`` makes runs reproducible as it
    did with the reference loop.
    """
    if rng is not None:
        if seed is not None:
            as_generator(seed, "seed")  # unused, but a bad one is still an error
        return as_generator(rng, "rng")
    if seed is not None:
        return as_generator(seed, "seed")
    # NumPy's global state on purpose: np.random.seed(s) reproduces runs, as it did
    # with the reference loop.
    return np.random.default_rng(int(np.random.randint(0, 2**62, dtype=np.int64)))  # noqa: NPY002


def as_generator(value, name: str) -> np.random.Generator:
    """A ``numpy.random.Generator`` from a Generator or a non-negative int seed."""
    if isinstance(value, np.random.Generator):
        return value
    if is_int(value):
        if value < 0:
            raise ValueError(f"{name} must be a non-negative int seed, got {value}")
        return np.random.default_rng(int(value))
    if isinstance(value, np.random.SeedSequence):
        return np.random.default_rng(value)
    raise TypeError(
        f"{name} must be a numpy.random.Generator or an int seed, got {type(value).__name__}"
    )


#: The smallest positive temperature: 1 / temperature stays finite in float32.
MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class SamplingControls:
    """Validated temperature, top-k, top-p and min-p, in the kernels' encoding.

    The kernels take this object as their ``controls`` argument and read its four fields.

    ``top_k = 0``, ``top_p = 1.0`` and ``min_p = 0.0`` mean "off";
    ``temperature = 0.0`` means greedy.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def from_user(cls, temperature=1.0, top_k=None, top_p=None, min_p=None) -> SamplingControls:
        """Check the user's values and encode them; raises TypeError/ValueError."""
        if not is_real(temperature):
            raise TypeError(
                f"temperature must be a real number >= 0, got {type(temperature).__name__}"
            )
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if 0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {temperature} is below {MIN_TEMPERATURE} (1/temperature must be "
                "finite in float32); use 0 for greedy decoding"
            )
        k = 0
        if top_k is not None:
            if not is_int(top_k):
                raise TypeError(f"top_k must be a positive int or None, got {type(top_k).__name__}")
            if top_k < 1:
                raise ValueError(f"top_k must be a positive int or None, got {top_k}")
            k = min(int(top_k), sys.maxsize)  # beyond any vocabulary: keeps every token
        p = 1.0
        if top_p is not None:
            if not is_real(top_p):
                raise TypeError(
                    f"top_p must be a number in (0, 1] or None, got {type(top_p).__name__}"
                )
            if not 0.0 < top_p <= 1.0:
                raise ValueError(f"top_p must be in (0, 1], got {top_p}")
            p = float(top_p)
        mp = 0.0
        if min_p is not None:
            if not is_real(min_p):
                raise TypeError(
                    f"min_p must be a number in [0, 1) or None, got {type(min_p).__name__}"
                )
            if not 0.0 <= min_p < 1.0:
                raise ValueError(f"min_p must be in [0, 1), got {min_p}")
            mp = float(min_p)
        return cls(float(temperature), k, p, mp)
