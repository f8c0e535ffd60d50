"""The target's cost curve: relative time of a forward pass by the tokens it evaluates.

A draft of n tokens makes the target evaluate n + 1 tokens in one pass.  On a CPU that
pass costs more than a pass over one token (SmolLM2-135M in llama.cpp with one batch
thread: 2 tokens 1.9x, 9 tokens about 4x; with two batch threads, 8 tokens about 2.5x),
so a draft-length policy weighs expected kept tokens against this curve.

Where the curve comes from, first found wins:

1. the policy's ``target_cost=`` argument (a curve);
2. the target model's ``cost_curve`` attribute: a 1-D float sequence whose element i is
   the cost of a pass evaluating i + 1 tokens relative to a pass over one token (so
   element 0 is 1.0); the adapters may compute it lazily, on first access, by a short
   calibration, and a curve they measured is checked against the run's timed passes
   (:class:`CurveCheck`);
3. :data:`DEFAULT_COST_CURVE`.

:func:`check_cost_curve` is the one validator of a curve, wherever it is given.

A pass over a tree of drafts (several candidates in one pass) costs more than a chain
of as many tokens; the target model's ``tree_cost_curve`` says how much (the adapters
measure it like ``cost_curve``), else, or with a policy's own ``target_cost``, trees
cost as chains.

A curve is extended beyond its end linearly, with the slope of its last segment (flat if
that segment falls).

Why one module past 500 lines: the curve and its run-time check (:class:`CurveCheck`,
which reads and corrects it) are one concept, and half the lines are their docstrings.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading

import numpy as np

__all__ = [
    "AFTERMATH_PASSES",
    "DEFAULT_COST_CURVE",
    "CostCurve",
    "CurveCheck",
    "check_cost_curve",
    "check_target_cost",
    "chosen_cost",
    "suffix_minima",
]

#: One-token passes after a pass over several tokens that are charged to it.  A batch
#: slows the passes after it for a while (llama.cpp on two threads, 2026-12-05,
#: SmolLM2 on an Intel Xeon VM: the first one-token pass after a batch of 16 took
#: 1.9x a steady one, the 4th 1.3x, the 8th 1.03x; 1 to 2.5 passes' worth in all,
#: varying with the machine's state), so its cost is its own time plus that
#: slowdown.  The calibration (``specdec.models``) and :class:`CurveCheck` both
#: charge this many passes.
AFTERMATH_PASSES = 6

#: Relative cost of a pass over 1..16 tokens, measured here for SmolLM2-135M in llama.cpp
#: on a 2-core CPU with one batch thread (docs NOTES section 5): the pessimistic case, so
#: that an unknown target is not flooded with drafts that do not pay.
DEFAULT_COST_CURVE = (
    1.0, 1.9, 2.5, 2.8, 3.05, 3.3, 3.55, 3.8, 4.3, 4.8, 5.25, 5.75, 6.25, 6.75, 7.25, 7.75,
)  # fmt: skip


class CostCurve:
    """Cost of a target pass over ``t`` tokens, relative to a pass over one token.

    Parameters
    ----------
    values : 1-D sequence of float
        ``values[i]`` is the cost of a pass over ``i + 1`` tokens; at least 2 values,
        ``values[0]`` must be 1.0, every value finite and > 0.  Beyond its end the curve
        grows linearly with the slope of its last segment, or stays flat if that
        segment falls.
    name : str, default "cost curve"
        How errors name the argument.
    tree : 1-D sequence of float, optional
        The cost of a pass over a *tree* of drafts (one token and its nodes), when it
        differs from a chain over as many tokens (see :meth:`tree_drafts`).

    Examples
    --------
    >>> curve = CostCurve([1.0, 1.2, 1.5])
    >>> curve.tokens(2), curve.tokens(5)
    (1.2, 2.1)
    >>> curve.drafts(0)             # a plain step: one token
    1.0
    """

    __slots__ = ("_values", "_slope", "_resolve", "_tables", "_tree", "checkable", "check")

    def __init__(self, values, name: str = "cost curve", tree=None) -> None:
        self._resolve = None
        self.checkable = False  # a model's measured curve, which a policy checks
        self.check = None  # the model's CurveCheck, shared by its policies (None: none)
        self._set(check_cost_curve(values, name))
        self._tree = None if tree is None else CostCurve(tree, f"{name} of trees")

    def _set(self, values: tuple) -> None:
        self._tables = None
        self._values = values
        # never downwards: a curve whose last segment falls would reach zero cost
        self._slope = max(values[-1] - values[-2], 0.0) if len(values) > 1 else 1.0

    @classmethod
    def of_model(cls, model) -> CostCurve:
        """The target model's curve, read lazily on first use (see the module docstring).

        Reading ``model.cost_curve`` may run a calibration; it happens only when a policy
        asks for a cost, at most once per ``CostCurve``.

        Parameters
        ----------
        model : object
            The target model.

        Returns
        -------
        CostCurve
        """
        curve = cls.__new__(cls)
        curve._values = curve._tables = None
        curve.checkable = False
        check = getattr(model, "cost_check", None)
        curve.check = check if isinstance(check, CurveCheck) else None
        curve._resolve = lambda: _model_curve(model)
        curve._tree = lambda: _model_tree_curve(model)  # read at the first tree's cost
        return curve

    def _resolved(self) -> CostCurve:
        if self._values is None:
            resolved = self._resolve()
            self.checkable = resolved.checkable
            self._set(resolved._values)
        return self

    @property
    def tree(self) -> CostCurve | None:
        """The curve of passes over trees of drafts; None when they cost as chains.

        From a model, its ``tree_cost_curve`` (read, and perhaps measured, on the first
        access).
        """
        if callable(self._tree):
            self._tree = self._tree()
        return self._tree

    def tree_drafts(self, n_nodes: int) -> float:
        """Cost of a pass that verifies a tree of ``n_nodes`` drafts (and one more token).

        The tree curve's, if there is one; else a chain's of as many drafts.
        """
        tree = self.tree
        return self.drafts(n_nodes) if tree is None else tree.drafts(n_nodes)

    def tree_drafts_table(self, n_max: int) -> list:
        """``[tree_drafts(0), ..., tree_drafts(n_max)]`` (kept)."""
        tree = self.tree
        return self.drafts_table(n_max) if tree is None else tree.drafts_table(n_max)

    @property
    def values(self) -> tuple:
        """The curve's values for 1, 2, ... tokens (a tuple of float)."""
        return self._resolved()._values

    def tokens(self, n_tokens: int) -> float:
        """Cost of a pass over ``n_tokens >= 1`` tokens, in one-token passes."""
        values = self._resolved()._values
        if n_tokens <= len(values):
            return values[max(n_tokens, 1) - 1]
        return values[-1] + self._slope * (n_tokens - len(values))

    def drafts(self, n_drafts: int) -> float:
        """Cost of the pass that verifies ``n_drafts`` draft tokens (and one more token)."""
        return self.tokens(n_drafts + 1)

    def _kept_tables(self, n_max: int) -> tuple:
        # one attribute for both: a thread sharing the curve never sees one table
        # without its floor
        tables = self._tables
        if tables is None or len(tables[0]) <= n_max:
            table = [self.drafts(n) for n in range(max(n_max, 16) + 1)]
            tables = self._tables = (table, suffix_minima(table))
        return tables

    def drafts_table(self, n_max: int) -> list:
        """``[drafts(0), ..., drafts(n_max)]`` (kept: policies ask on every step)."""
        return self._kept_tables(n_max)[0]

    def drafts_floor(self, n_max: int) -> list:
        """``floor[n]``: the least of ``drafts(m)`` for ``m >= n`` in the kept table.

        At least ``n_max + 1`` entries; a lower bound of every pass over ``n`` drafts
        or more up to ``n_max``, for policies that stop looking early.
        """
        return self._kept_tables(n_max)[1]

    def __repr__(self) -> str:
        if self._values is None:
            return "CostCurve(<the target model's, not read yet>)"
        return f"CostCurve({list(self._values)!r})"


def check_target_cost(value, name: str = "target_cost") -> CostCurve | None:
    """A policy's ``target_cost`` argument: None (the target model's curve) or a curve.

    Parameters
    ----------
    value : None, CostCurve or 1-D sequence of float
        A sequence (a list, a tuple, a NumPy array) is a curve starting at 1.0.
    name : str
        How errors name the argument.

    Returns
    -------
    None or CostCurve
    """
    if value is None or isinstance(value, CostCurve):
        return value
    return CostCurve(value, name)


def check_cost_curve(values, name: str = "cost curve") -> tuple:
    """A cost curve's values as a tuple of float, or a clear error naming ``name``.

    The one validator of a curve: a policy's ``target_cost``, an adapter's
    ``cost_curve`` and ``tree_cost_curve``, a model's attribute.

    Parameters
    ----------
    values : 1-D sequence of float
        ``values[i]`` is the cost of a pass over ``i + 1`` tokens relative to one
        token: at least 2 values, finite and > 0, ``values[0] == 1.0``.
    name : str
        How errors name the argument.

    Returns
    -------
    tuple of float

    Raises
    ------
    TypeError
        If ``values`` is not a sequence of numbers.
    ValueError
        If it has fewer than 2 values, is not 1-D, not finite and positive, or does not
        start at 1.0.
    """
    expected = (
        f"{name} must be a cost curve: a 1-D sequence of at least 2 finite numbers > 0, "
        "element i the cost of a pass over i + 1 tokens relative to one token"
    )
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise TypeError(f"{expected}; got {type(values).__name__} {values!r}")
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{expected}; got {values!r}") from None
    if array.ndim != 1 or array.size < 2:
        # one point (a pass over one token, 1.0) says nothing about a pass over two
        raise ValueError(f"{expected}; got shape {array.shape}")
    if not (np.all(np.isfinite(array)) and np.all(array > 0.0)):
        raise ValueError(f"{expected}; got {array.tolist()!r}")
    if abs(array[0] - 1.0) > 1e-6:
        # two numbers were an (overhead, per_token) pair before 0.3
        hint = "; an (overhead, per_token) pair is no longer taken" if array.size == 2 else ""
        raise ValueError(
            f"{name}[0] must be 1.0 (costs are relative to a one-token pass), "
            f"got {float(array[0])!r}{hint}"
        )
    return tuple(float(v) for v in array)


def _model_tree_curve(model) -> CostCurve | None:
    """The target model's ``tree_cost_curve``, or None (trees cost as chains)."""
    curve = getattr(model, "tree_cost_curve", None)
    return None if curve is None else CostCurve(curve, "target_model.tree_cost_curve")


def _model_curve(model) -> CostCurve:
    """The target model's ``cost_curve``, else the default."""
    curve = getattr(model, "cost_curve", None)
    if curve is None:
        return CostCurve(DEFAULT_COST_CURVE)
    curve = CostCurve(curve, "target_model.cost_curve")
    # a curve the adapter measured is checked against decoding's timed passes; one the
    # user gave is theirs (and keeps runs reproducible)
    curve.checkable = getattr(model, "cost_curve_measured", False) is True
    return curve


class CurveCheck:
    """A model's cost curve checked against the passes decoding times, and corrected.

    A curve measured once (an adapter's calibration) can be wrong for the whole
    process: measured while another process held the CPU, a pass over two tokens once
    came out at 158 one-token passes, and a policy trusting it never drafted again;
    on another machine batches slowed the one-token passes after them by more than the
    calibration saw, and drafts that did not pay cost 10% at temperature 0.7.  So the
    policies record every timed pass (:meth:`record`): a drafted pass is charged its
    own time plus the slowdown of the :data:`AFTERMATH_PASSES` one-token passes after
    it (their time above the median of the steady ones, which are the one-token
    passes outside such a window), and once at least :attr:`SAMPLES` steady passes
    and :attr:`SAMPLES` of some draft length are recorded, the medians of the latest
    :attr:`WINDOW` of each are compared with the curve.
    When a measured cost is more than :attr:`TOLERANCE` times off the curve's (either
    way), the curve's extra cost over a one-token pass is scaled by the median ratio
    of the measured extras to the curve's (the curve's shape kept, its level taken
    from the run) until the timings agree again; otherwise the curve is used as is
    (and runs stay reproducible).  A curve that forbids drafting (on which no draft,
    even one always kept, gives :attr:`PROBED_BELOW` times the tokens per unit of time
    of no draft) would never be timed, so while no draft length has been timed
    :meth:`probe` asks for a one-token draft at one declined proposal in
    :attr:`PROBE_EVERY`.  A bad calibration then costs a few steps, not the whole
    process.  Any other curve is not probed: where drafts pay, the policy drafts and
    those passes are timed; on text where drafts are rarely kept, probes would only
    cost (a 2-token pass is 1.6x a 1-token one with llama.cpp on all cores: five
    probes per request lost 3% on open text).

    An adapter that measures its curve keeps one check for every policy decoding
    with it (``cost_check``), so that what one request's passes showed serves the
    next; one check may serve several threads (its state is guarded by a lock).
    """

    #: Timed passes of a length before it is compared.
    SAMPLES = 5
    #: The latest passes kept per length (their median is the measured time).
    WINDOW = 15
    #: Passes over more drafts than this are not drafts (a prompt): not recorded, and
    #: the passes they slow are not steady ones.
    LONGEST = 64
    #: A measured cost this many times above or below the curve's is a disagreement.
    TOLERANCE = 1.25
    #: While unchecked, one proposal in this many that the policy declined is drafted.
    PROBE_EVERY = 4
    #: A curve whose best rate (tokens per cost of a draft always kept) is below this
    #: forbids drafting, and is probed.
    PROBED_BELOW = 1.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: dict = {}  # drafts n -> deque of seconds
        self._base = None  # the values of the curve the timings are compared with
        self._corrected = None  # the corrected curve, None while the curve agrees
        self._forbids = False  # whether the curve forbids drafting (then probed)
        self._records = 0
        self._computed = 0  # self._records when _corrected was computed
        self._stale = False  # whether a record since then can change the correction
        self._declined = 0
        self._aftermath = None  # [drafts, seconds charged, passes still to charge]

    def __getstate__(self) -> dict:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]  # a copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def record(self, n_drafts: int, seconds: float) -> None:
        """Add one timed pass that verified ``n_drafts`` drafts (a chain), in order."""
        if not (isinstance(seconds, float) and 0.0 < seconds < math.inf):
            return
        with self._lock:
            aftermath = self._aftermath
            if aftermath is not None:
                if n_drafts == 0:  # one of the passes the drafted pass slowed
                    steady = self._times.get(0)
                    if steady:
                        aftermath[1] += seconds - statistics.median(steady)
                    aftermath[2] -= 1
                    if aftermath[2] == 0:
                        self._add(aftermath[0], aftermath[1])
                        self._aftermath = None
                    return
                self._add(aftermath[0], aftermath[1])  # cut short by the next draft
                self._aftermath = None
            if n_drafts == 0:
                self._add(0, seconds)
            else:
                drafts = n_drafts if n_drafts <= self.LONGEST else None
                if AFTERMATH_PASSES > 0:
                    self._aftermath = [drafts, seconds, AFTERMATH_PASSES]
                else:
                    self._add(drafts, seconds)

    def _add(self, n_drafts: int | None, seconds: float) -> None:
        if n_drafts is None:  # a prompt's pass
            return
        times = self._times.get(n_drafts)
        if times is None:
            times = self._times[n_drafts] = collections.deque(maxlen=self.WINDOW)
        times.append(seconds)
        self._records += 1
        # A new drafted pass can change the correction; steady passes (on open text,
        # nearly every pass) only move the median it divides by: the correction (20 us
        # of Python on a 5 ms token, and a new curve whose tables the policy rebuilds)
        # is recomputed after a window of them, not after each.
        if (
            n_drafts > 0
            or len(times) <= self.SAMPLES
            or (self._records - self._computed >= self.WINDOW)
        ):
            self._stale = True

    def _ready(self) -> bool:
        times = self._times
        return len(times.get(0, ())) >= self.SAMPLES and any(
            n > 0 and len(t) >= self.SAMPLES for n, t in times.items()
        )

    def probe(self) -> bool:
        """Whether to draft one token although the policy declined (see the class)."""
        with self._lock:
            if self._base is None or not self._forbids or self._ready():
                return False
            if self._aftermath is not None:  # the last probe's passes are still charged
                return False
            self._declined += 1
            return self._declined % self.PROBE_EVERY == 0

    def curve(self, base: CostCurve) -> CostCurve:
        """``base``, or its correction when the run's timings disagree with it.

        Only a curve an adapter measured (``base.checkable``) is checked; a curve the
        user gave (to the policy or the adapter) is taken as is.
        """
        values = base.values  # resolves a model's curve, and with it ``checkable``
        if not base.checkable:
            return base
        with self._lock:
            if values is not self._base and values != self._base:  # another model's curve
                # its timings start afresh
                self._base, self._corrected = values, None
                best = max((n + 1) / base.drafts(n) for n in range(1, len(values)))
                self._forbids = best < self.PROBED_BELOW
                self._times.clear()
                self._records = self._computed = self._declined = 0
                self._stale = False
                self._aftermath = None
            if self._stale and self._ready():
                self._stale = False
                self._computed = self._records
                self._corrected = self._correction(base)
            return base if self._corrected is None else self._corrected

    def _correction(self, base: CostCurve) -> CostCurve | None:
        one = statistics.median(self._times[0])
        measured, expected = [], []
        for n, times in self._times.items():
            if n > 0 and len(times) >= self.SAMPLES:
                measured.append(max(statistics.median(times) / one, 1.0))
                expected.append(base.drafts(n))
        tolerance = self.TOLERANCE
        pairs = list(zip(measured, expected, strict=True))
        if all(1.0 / tolerance <= m / e <= tolerance for m, e in pairs):
            return None
        scales = [(m - 1.0) / (e - 1.0) for m, e in pairs if e > 1.0]
        scale = statistics.median(scales) if scales else 1.0

        def scaled(curve_values) -> list:
            return [1.0] + [1.0 + scale * (v - 1.0) for v in curve_values[1:]]

        corrected = CostCurve(scaled(base.values), "corrected cost curve")
        corrected.checkable = True
        corrected.check = base.check
        corrected._tree = lambda: (
            None
            if base.tree is None
            else CostCurve(scaled(base.tree.values), "corrected tree cost curve")
        )
        return corrected


def chosen_cost(own, model_cost) -> CostCurve:
    """The policy's own curve if it was given one, else the target model's, else the default.

    Parameters
    ----------
    own : None or CostCurve
        The policy's ``target_cost``.
    model_cost : CostCurve or None
        What the decoder passed to ``start``.

    Returns
    -------
    CostCurve
    """
    if isinstance(own, CostCurve):
        return own
    if model_cost is None:
        return CostCurve(DEFAULT_COST_CURVE)
    if not isinstance(model_cost, CostCurve):
        return CostCurve(model_cost, "the target model's cost")
    return model_cost


def suffix_minima(costs) -> list:
    """``floor[n] = min(costs[n:])``: the cheapest of the passes from ``n`` on.

    Parameters
    ----------
    costs : sequence of float

    Returns
    -------
    list of float
        As long as ``costs``; ``costs`` itself (as a list) when it never decreases.
    """
    floor = list(costs)
    for n in range(len(floor) - 2, -1, -1):
        if floor[n + 1] < floor[n]:
            floor[n] = floor[n + 1]
    return floor
