"""The prefix cache shared by the adapters: what is evaluated, what is reused.

The decoder talks to a model through one method, ``forward(ids)``, which gets
the *whole* sequence so far as a ``(1, L)`` integer array and returns logits of
shape ``(1, L, V)``, or the last ``n`` rows when called with
``logits_to_keep=n``.  Re-running a transformer over the whole sequence on
every call would make generation quadratic in its length, so an adapter keeps
the model's key/value cache between calls: each call finds the longest common
prefix between the new sequence and the tokens already in the cache, rolls the
cache back to that prefix (this is how rejected draft tokens are discarded)
and runs the model on the remaining tokens only.

:class:`PrefixCachedModel` does that bookkeeping once; a backend says how to
read, roll back and extend its cache.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import numpy as np

from specdec._validation import is_int
from specdec.drafters._checks import check_ids
from specdec.drafters.cost import CurveCheck
from specdec.models import _calibration

__all__ = ["PrefixCachedModel"]


def _as_sequence(ids: Any) -> np.ndarray:
    """Validate a ``(1, L)`` id array and return its single row as int64.

    The decoder passes a read-only int64 array; other callers (such as a
    reference implementation) may pass int32 arrays or nested lists, so any
    integer array-like is accepted. The result is never written to.
    """
    arr = np.asarray(ids)
    if arr.ndim != 2 or arr.shape[0] != 1:
        raise ValueError(f"ids must have shape (1, L), got {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError("ids must contain at least one token")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"ids must be an integer array, got dtype {arr.dtype}")
    return arr[0].astype(np.int64, copy=False)


def _check_new_ids(seq: np.ndarray, start: int, vocab_size: int) -> None:
    """Refuse an id of ``seq[start:]`` outside ``[0, vocab_size)`` (the drafters' check)."""
    if start == seq.shape[0] - 1 and 0 <= int(seq[start]) < vocab_size:
        return  # a plain step's one new token, in range: no NumPy reduction
    check_ids(seq[start:], "ids", vocab_size)


def _rows_wanted(logits_to_keep: int | None, length: int) -> int:
    """Number of logit rows to return: all ``length`` rows when ``None``."""
    if logits_to_keep is None:
        return length
    if not is_int(logits_to_keep):
        raise TypeError(
            f"logits_to_keep must be an int, got {type(logits_to_keep).__name__} {logits_to_keep!r}"
        )
    n = int(logits_to_keep)
    if not 1 <= n <= length:
        raise ValueError(
            f"logits_to_keep must be between 1 and the sequence length {length}, "
            f"got {logits_to_keep}"
        )
    return n


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays.

    Done with one vectorised comparison rather than a Python loop because it
    runs on every forward call over the whole sequence.
    """
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    a, b = a[:m], b[:m].astype(a.dtype, copy=False)  # llama.cpp records int32 ids
    if a.tobytes() == b.tobytes():
        # The usual case (the cache holds a prefix of the sequence): a C comparison,
        # where the search below goes through four NumPy Python layers.
        return m
    mismatch = np.flatnonzero(a != b)
    return int(mismatch[0]) if mismatch.size else m


class PrefixCachedModel(abc.ABC):
    """A ``specdec`` model over a key/value cache that is reused between calls.

    Subclasses set ``vocab_size`` and implement the four cache operations
    (:meth:`_cached_ids`, :meth:`_first_to_evaluate`, :meth:`_roll_back`,
    :meth:`_evaluate`); :meth:`forward`, :meth:`reset`, the work counters and
    :attr:`cached_tokens` are defined here, once.

    Attributes
    ----------
    vocab_size : int
        Number of logits per position, ``V``.
    n_evaluated_tokens : int
        Total number of tokens pushed through the model since creation or the
        last :meth:`reset` (a measure of model work; cached tokens are free).
    n_forward_calls : int
        Number of :meth:`forward` calls since creation or the last :meth:`reset`.
    cost_check : specdec.drafters.cost.CurveCheck or None
        The check of a measured :attr:`cost_curve` against the passes :meth:`forward`
        times (all of them, in order), which every draft-length policy decoding with
        this model reads, so that what one request's passes showed corrects the curve
        for the next ones; None when the curve was given (it is taken as is).
    """

    vocab_size: int

    def __init__(self, cost_curve: Any = None, tree_cost_curve: Any = None) -> None:
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0
        self._cost_curve = None if cost_curve is None else _calibration.check_cost_curve(cost_curve)
        self._cost_curve_given = cost_curve is not None
        self.cost_check = None if self._cost_curve_given else CurveCheck()
        self._tree_cost_curve = (
            None
            if tree_cost_curve is None
            else _calibration.check_cost_curve(tree_cost_curve, "tree_cost_curve")
        )
        self._first_use_done = False

    # -- the cost of a pass ----------------------------------------------------

    @property
    def cost_curve(self) -> np.ndarray:
        """Time of a pass over ``i + 1`` new tokens relative to one token, ``i`` = 0..15.

        A read-only 1-D float64 array; element 0 is 1.0.  Given at creation
        (``cost_curve=...``), or measured on first access by a short calibration
        (a warm-up, then five interleaved rounds of passes over 1, 2, 3, 4, 5, 6,
        8, 10, 12 and 16 tokens, each timed with the one-token pass that follows it,
        as in decoding, where that pass pays for the batch before it; medians, the
        other sizes interpolated; one to a few seconds, said once through the
        ``logging`` logger ``specdec.models`` at INFO level).  The calibration
        evaluates on top of the cache's current content and rolls the cache back
        afterwards, and its result is kept for the process per model and thread
        setting, so other adapters of the same model and setting reuse it.
        Draft-length policies read it to decide how many drafted tokens pay.

        Returns
        -------
        numpy.ndarray
        """
        if self._cost_curve is None:
            self._cost_curve = _calibration.measure_cost_curve(self, self._max_length())
        return self._cost_curve

    def recalibrate(self) -> np.ndarray:
        """Measure :attr:`cost_curve` again now, and keep the new curve for the process.

        The curve kept for this model and thread setting (by any adapter of the
        process) is forgotten, with its tree curve, and measured again through this
        adapter; other adapters of the same model and setting measure anew at their
        next first access.  For benchmarks, and after the machine's load changed.

        Returns
        -------
        numpy.ndarray
            The new curve.

        Raises
        ------
        ValueError
            If the curve was given at creation (``cost_curve=...``).
        """
        if self._cost_curve_given:
            raise ValueError("this model's cost_curve was given at creation: nothing to measure")
        _calibration.forget(self)
        self._cost_curve = self._tree_cost_curve = None
        return self.cost_curve

    @property
    def tree_cost_curve(self) -> np.ndarray | None:
        """Time of a tree pass over ``i + 1`` tokens relative to one token; None without trees.

        For adapters that score a tree of drafts in one pass (``forward_tree``): element
        ``i`` is a pass over the last token and ``i`` tree nodes.  A tree pass may cost
        more than a chain over as many tokens (the branches' sequence ids in llama.cpp,
        the 4-D attention mask in PyTorch: for SmolLM2-135M here from nothing to a
        third of a one-token pass), and the draft-length policy verifies a tree only
        when its expected tokens pay for that.

        Given at creation (``tree_cost_curve=...``), or measured on first access (the
        policy's first tree) by a calibration like that of :attr:`cost_curve`:
        two-branch trees of 2, 4, 8 and 15 nodes and chains of as many tokens are timed
        side by side (each with the one-token pass after it), and the median of the
        paired differences is the trees' premium over :attr:`cost_curve` (about as long
        as the chain's calibration).  A read-only 1-D float64 array (element 0 is 1.0,
        element 1, one node, is the chain's), kept for the process per model and thread
        setting like :attr:`cost_curve`.  None for an adapter without ``forward_tree``,
        and when ``cost_curve`` was given but this curve was not (no calibration runs
        then; trees are priced as chains).

        Returns
        -------
        numpy.ndarray or None
        """
        if not hasattr(self, "forward_tree"):
            return None
        if self._tree_cost_curve is None and not self._cost_curve_given:
            self._tree_cost_curve = _calibration.measure_tree_cost_curve(
                self, self._max_length(), self.cost_curve
            )
        return self._tree_cost_curve

    @property
    def cost_curve_measured(self) -> bool:
        """Whether :attr:`cost_curve` is measured here (not given at creation).

        A measured curve is checked against the passes decoding times, and corrected
        when they disagree (:class:`specdec.drafters.cost.CurveCheck`); a given one is
        taken as is.
        """
        return not self._cost_curve_given

    def _cost_curve_pending(self) -> bool:
        """Whether reading :attr:`cost_curve` would run the calibration now."""
        if self._cost_curve is not None:
            return False
        key = self._calibration_key()
        return key is None or key not in _calibration._MEASURED

    def _calibration_key(self) -> Any:
        """What identifies this model's cost in the process (None: not shared)."""
        return None

    def _max_length(self) -> int | None:
        """Longest sequence the model takes, if limited."""
        return None

    def _first_use(self) -> None:
        """Checks a backend runs once, at the first :meth:`forward` with valid input."""
        return

    # -- what a backend provides -------------------------------------------

    @abc.abstractmethod
    def _cached_ids(self) -> np.ndarray:
        """The tokens whose keys and values the cache holds, in order (1-D)."""

    @abc.abstractmethod
    def _first_to_evaluate(self, n_common: int, length: int, n_rows: int) -> int:
        """Where evaluation starts, given the common prefix with the cache.

        At most *n_common*; a backend that keeps no logits of cached positions
        must start at ``length - n_rows`` at the latest.
        """

    @abc.abstractmethod
    def _roll_back(self, n_keep: int) -> None:
        """Make the cache hold at most its first ``n_keep`` tokens.

        A cache that cannot be cut there may be emptied instead;
        :meth:`forward` reads how much is left from :meth:`_cached_ids`.
        """

    @abc.abstractmethod
    def _evaluate(self, seq: np.ndarray, start: int, n_rows: int) -> np.ndarray:
        """Run the model on ``seq[start:]`` (maybe nothing), the cache holding the rest.

        The cache holds ``seq[:start]``; returns the last ``n_rows`` rows as float32
        ``(1, n_rows, V)``.
        """

    def _check_fits(self, length: int) -> None:
        """Raise ValueError if a sequence of *length* tokens cannot be evaluated."""
        return  # no limit unless the backend has one

    # -- the model protocol --------------------------------------------------

    def forward(self, ids: Any, logits_to_keep: int | None = None) -> np.ndarray:
        """Logits for the last positions of ``ids``, reusing the cache.

        Parameters
        ----------
        ids : array_like of int, shape (1, L)
            The whole token sequence so far. It is not modified.
        logits_to_keep : int, optional
            Number ``n`` of trailing positions to return logits for; all ``L``
            when omitted.

        Returns
        -------
        numpy.ndarray
            A new float32 array of shape ``(1, n, V)``; row ``i`` holds the
            logits for the token after position ``L - n + i``.

        Raises
        ------
        ValueError
            If ``ids`` has the wrong shape, ``logits_to_keep`` is out of range,
            or the sequence does not fit in the model's context.
        TypeError
            If ``ids`` is not an integer array.
        """
        seq = _as_sequence(ids)
        length = seq.shape[0]
        n_rows = _rows_wanted(logits_to_keep, length)
        self._check_fits(length)  # before any work: nothing is evaluated or rolled back
        if not self._first_use_done:
            self._first_use_done = True
            self._first_use()
        began = time.perf_counter()
        n_common = common_prefix_length(seq, self._cached_ids())
        # The ids to evaluate, in range (the cached ones were when they were evaluated):
        # an adapter's own cast would wrap one past int32, a model index past its table.
        if n_common < length:
            _check_new_ids(seq, n_common, self.vocab_size)
        self.n_forward_calls += 1
        self._roll_back(self._first_to_evaluate(n_common, length, n_rows))
        start = int(self._cached_ids().shape[0])  # 0 if the cache had to start over
        result = self._evaluate(seq, start, n_rows)
        self.n_evaluated_tokens += length - start
        if self.cost_check is not None and length > start:
            # every pass, in order, whoever asked for it: what the measured curve is
            # checked against (a pass over n + 1 tokens is a step verifying n drafts)
            self.cost_check.record(length - start - 1, time.perf_counter() - began)
        return result

    def reset(self) -> None:
        """Empty the cache and zero the work counters.

        The next :meth:`forward` call evaluates its whole sequence.
        """
        self._roll_back(0)
        self.n_evaluated_tokens = 0
        self.n_forward_calls = 0

    @property
    def cached_tokens(self) -> np.ndarray:
        """Tokens currently in the key/value cache, as a new int64 array.

        Returns
        -------
        numpy.ndarray
        """
        return np.array(self._cached_ids(), dtype=np.int64)
