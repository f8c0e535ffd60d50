"""Definitions shared by both kernel backends and the decoder."""

from __future__ import annotations

import numpy as np

#: Elements per block of a sampling pass (SD_BLOCK in _kernels.h; _core.pyx checks it).
BLOCK_SIZE = 512

#: Without sampling controls, a row's weights are shifted by the maximum of its first
#: block; only when the row's maximum lies more than this (in units of logit /
#: temperature) above that shift are they recomputed from the maximum itself.
SHIFT_LIMIT = 64.0

#: A row's law under the sampling controls, with named fields (see _kernels.h): the
#: weights are exp((logit - shift) / temperature) where logit >= tau and the scaled
#: logit >= zmin, else 0, and the probabilities are weights / total.  Arrays of laws
#: are ``np.zeros(n, LAW_DTYPE)``; the compiled core reads them as a memoryview of
#: its C struct ``RowLaw`` (same fields, same order).
LAW_DTYPE = np.dtype([("shift", "f8"), ("tau", "f8"), ("zmin", "f8"), ("total", "f8")])

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: exp(z) is taken as 0 below these (the smallest z whose exp is still a normal float
#: or double); _kernels.h repeats them as SD_EXP_LOWEST_F32/_F64 and _core.pyx checks
#: at import that they agree.
EXP_LOWEST_F32 = -87.0
EXP_LOWEST_F64 = -708.0

#: The compiled core's SIMD levels, best first (the level numbers of _kernels.h; each
#: holds every kernel, see there).  SPECDEC_SIMD names one (_backend.py).
SIMD_LEVELS = ("avx512", "avx2", "baseline")

#: Kernel error codes, shared by both backends (_core.pyx repeats them as a C enum and
#: checks at import that they agree).
NONFINITE_LOGITS = 1
ALL_MASKED_LOGITS = 2
EMPTY_LAW = 3

_REASONS = {
    NONFINITE_LOGITS: "NaN or +inf logits",
    ALL_MASKED_LOGITS: "logits that are all -inf (no token has probability)",
    EMPTY_LAW: "logits that leave no token of positive weight under the sampling controls",
}


class InvalidLogitsError(ValueError):
    """A row of logits that defines no probability law.

    Raised by the kernels with the index of the offending row within the block they
    were given; the decoder re-raises it naming the model and the sequence position.

    Parameters
    ----------
    row : int
        Index of the row within the rows passed to the kernel.
    code : int
        ``NONFINITE_LOGITS``, ``ALL_MASKED_LOGITS`` or ``EMPTY_LAW``.
    """

    def __init__(self, row: int, code: int):
        self.row = row
        self.code = code
        super().__init__(f"row {row} holds {_REASONS[code]}")

    @property
    def reason(self) -> str:
        """What is wrong with the row, in words."""
        return _REASONS[self.code]


# --- argument checks shared by both kernel backends -----------------------------------------


def _check_array(value, name: str, ndim: int, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array of {what}, got {type(value).__name__}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D ({what}), got shape {value.shape}")
    return value


def check_laws(laws, name: str, min_rows: int) -> None:
    """``laws`` must be a 1-D ``LAW_DTYPE`` array of at least ``min_rows`` laws."""
    if not isinstance(laws, np.ndarray) or laws.dtype != LAW_DTYPE:
        what = laws.dtype if isinstance(laws, np.ndarray) else type(laws).__name__
        raise TypeError(f"{name} must be an array of dtype specdec._common.LAW_DTYPE, got {what}")
    _check_array(laws, name, 1, "LAW_DTYPE laws")
    if len(laws) < min_rows:
        raise ValueError(f"{name} holds {len(laws)} laws, at least {min_rows} needed")


def check_rows(rows, name: str, vocab_size: int, ndim: int = 2) -> None:
    """``rows`` must be float32/float64 logits (or weights) of ``vocab_size`` columns."""
    _check_array(rows, name, ndim, "float32 or float64 logits")
    if rows.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {rows.dtype}")
    if rows.shape[-1] != vocab_size:
        raise ValueError(f"{name} has {rows.shape[-1]} columns, the workspace {vocab_size}")


def overlap_error(caller: str) -> ValueError:
    """The error for outputs that share memory with the logits or with each other."""
    return ValueError(
        f"{caller}: weights_out and the law output must not share memory with the logits "
        "or with each other"
    )


def check_apart(caller: str, *arrays) -> None:
    """``arrays`` (the logits, then the outputs) must not overlap in memory.

    The compiled kernels write an output while they still read the logits (and read a
    law they wrote), so aliased arrays would give other answers than the twin's.
    """
    for i, a in enumerate(arrays):
        for b in arrays[i + 1 :]:
            if np.may_share_memory(a, b):
                raise overlap_error(caller)


def check_row_laws_args(rows, laws_out, weights_out, vocab_size: int) -> None:
    """Arguments of ``row_laws``: (n, V) rows, n laws, (n, V) weights of the rows' dtype."""
    check_rows(rows, "rows", vocab_size)
    check_laws(laws_out, "laws_out", len(rows))
    check_rows(weights_out, "weights_out", vocab_size)
    if weights_out.dtype != rows.dtype:
        raise TypeError(
            f"weights_out must have the dtype of rows ({rows.dtype}), got {weights_out.dtype}"
        )
    if len(weights_out) < len(rows):
        raise ValueError(f"weights_out holds {len(weights_out)} rows, {len(rows)} needed")
    check_apart("row_laws", rows, weights_out, laws_out)


def token_range_error(caller: str, token: int, vocab_size: int) -> ValueError:
    """The error for a draft token outside [0, vocab_size), one wording for both backends."""
    return ValueError(f"{caller}: draft token {token} is outside [0, {vocab_size})")


def check_verify_args(
    target_rows,
    draft_tokens,
    draft_weights,
    draft_laws,
    block,
    vocab_size: int,
    caller="verify",
    token_range=True,
) -> None:
    """Arguments of ``verify``, checked before any work; the messages name the argument.

    ``caller`` prefixes the messages: the kernel whose arguments these are.
    ``token_range=False`` leaves the range of int64 tokens to the caller (the compiled
    core checks it in its own loop over them, cheaper than two NumPy reductions at
    every step; it raises :func:`token_range_error`).

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype.
    ValueError
        Shapes that disagree, a draft token outside [0, V), or only one of
        ``draft_weights`` and ``draft_laws``.
    """
    check_rows(target_rows, f"{caller}: target_rows", vocab_size)
    _check_array(draft_tokens, f"{caller}: draft_tokens", 1, "int64 token ids")
    if draft_tokens.dtype.kind not in "iu":
        raise TypeError(f"{caller}: draft_tokens must hold integer ids, got {draft_tokens.dtype}")
    n = len(draft_tokens)
    if len(target_rows) != n + 1:
        raise ValueError(
            f"{caller}: target_rows must hold n + 1 = {n + 1} rows (one per "
            f"draft token and one for the bonus), got {len(target_rows)}"
        )
    if (draft_weights is None) != (draft_laws is None):
        raise ValueError(
            f"{caller}: draft_weights and draft_laws must both be given (drafts "
            "sampled from a model) or both be None (one-hot drafts)"
        )
    if draft_weights is not None:
        check_rows(draft_weights, f"{caller}: draft_weights", vocab_size)
        if len(draft_weights) < n:
            raise ValueError(
                f"{caller}: draft_weights holds {len(draft_weights)} rows, "
                f"{n} draft tokens need as many"
            )
        check_laws(draft_laws, f"{caller}: draft_laws", n)
    if n and (token_range or draft_tokens.dtype != np.int64):
        low, high = int(draft_tokens.min()), int(draft_tokens.max())
        if low < 0 or high >= vocab_size:
            raise token_range_error(caller, low if low < 0 else high, vocab_size)
    if not isinstance(block, (bool, np.bool_)):
        raise TypeError(
            f"verify: block must be a bool (True: block verification, False: "
            f"token by token), got {type(block).__name__}"
        )


def check_tree(parents, n_nodes: int, name: str = "parents") -> None:
    """``parents`` must give each of ``n_nodes`` nodes -1 (the root) or an earlier node.

    Raises
    ------
    TypeError
        ``parents`` is not a 1-D integer array.
    ValueError
        Its length is not ``n_nodes``, or ``parents[i]`` lies outside [-1, i).
    """
    _check_array(parents, name, 1, "int64 parent indices")
    if parents.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer node indices, got {parents.dtype}")
    if len(parents) != n_nodes:
        raise ValueError(f"{name} must hold one parent per node ({n_nodes}), got {len(parents)}")
    if n_nodes:
        # uint64 beyond int64 compares as itself against the int64 bounds
        bad = (parents < -1) | (parents >= np.arange(n_nodes))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{name}[{i}] is {int(parents[i])}: a node's parent must be -1 (the root) "
                f"or an earlier node, in [-1, {i})"
            )


def check_tree_args(
    target_rows, draft_tokens, parents, draft_weights, draft_laws, path_out, vocab_size: int
) -> None:
    """Arguments of ``verify_tree``, checked before any work.

    The rows, tokens and draft follow ``check_verify_args``' rules (n nodes, n + 1
    target rows); ``path_out`` receives up to n node indices.
    """
    check_verify_args(
        target_rows, draft_tokens, draft_weights, draft_laws, False, vocab_size, "verify_tree"
    )
    check_tree(parents, len(draft_tokens), "verify_tree: parents")
    _check_array(path_out, "verify_tree: path_out", 1, "int64 node indices")
    if path_out.dtype != np.int64 or not path_out.flags.writeable:
        raise TypeError(
            f"verify_tree: path_out must be a writeable int64 array, got {path_out.dtype}"
        )
    if len(path_out) < len(draft_tokens):
        raise ValueError(
            f"verify_tree: path_out holds {len(path_out)} entries, {len(draft_tokens)} needed"
        )
