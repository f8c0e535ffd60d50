"""The target's cost curve: relative time of a forward pass by the tokens it evaluates.

A draft of n tokens makes the target evaluate n + 1 tokens in one pass.  On a CPU that
pass costs more than a pass over one token (SmolLM2-135M in llama.cpp with one batch
thread: 2 tokens 1.9x, 9 tokens about 4x; with two batch threads, 8 tokens about 2.5x),
so a draft-length policy weighs expected kept tokens against this curve.

Where the curve comes from, first found wins:

1. the policy's ``target_cost=`` argument (a curve, an ``(overhead, per_token)`` pair, or
   ``"measured"``: timed online);
2. the target model's ``cost_curve`` attribute: a 1-D float sequence whose element i is
   the cost of a pass evaluating i + 1 tokens relative to a pass over one token (so
   element 0 is 1.0); the adapters may compute it lazily, on first access, by a short
   calibration;
3. the target model's ``speculation_cost`` pair ``(overhead, per_token)``: a pass over
   ``n + 1`` tokens costs ``1 + overhead + per_token * n`` for n >= 1;
4. :data:`DEFAULT_COST_CURVE`.

A pass over a tree of drafts (several candidates in one pass) costs more than a chain
of as many tokens; the target model's ``tree_cost_curve`` says how much (the adapters
measure it like ``cost_curve``), else, or with a policy's own ``target_cost``, trees
cost as chains.

A curve is extended beyond its end linearly, with the slope of its last segment (flat if
that segment falls).
"""

from __future__ import annotations

import math

import numpy as np

from specdec._validation import is_real

__all__ = [
    "DEFAULT_COST_CURVE",
    "DEFAULT_TARGET_COST",
    "CostCurve",
    "check_target_cost",
    "chosen_cost",
    "suffix_minima",
]

#: The legacy default ``(overhead, per_token)``: a pass over n drafts and one token costs
#: ``1 + overhead + per_token * n`` one-token passes (n >= 1).
DEFAULT_TARGET_COST = (0.57, 0.33)

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
        ``values[i]`` is the cost of a pass over ``i + 1`` tokens; ``values[0]`` must be
        1.0, every value finite and > 0.  Beyond its end the curve grows linearly with
        the slope of its last segment, or stays flat if that segment falls (with one
        value only: one unit per token, the cautious guess).
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

    __slots__ = ("_values", "_slope", "_pair", "_resolve", "_table", "_floor", "_tree")

    def __init__(self, values, name: str = "cost curve", tree=None) -> None:
        self._pair = None
        self._resolve = None
        self._set(_check_curve(values, name))
        self._tree = None if tree is None else CostCurve(tree, f"{name} of trees")

    def _set(self, values: tuple) -> None:
        self._table = None
        self._values = values
        # never downwards: a curve whose last segment falls would reach zero cost
        self._slope = max(values[-1] - values[-2], 0.0) if len(values) > 1 else 1.0

    @classmethod
    def from_pair(cls, overhead: float, per_token: float, name: str = "cost pair") -> CostCurve:
        """The curve of a ``(overhead, per_token)`` pair: ``1 + overhead + per_token * n``.

        Parameters
        ----------
        overhead, per_token : float >= 0
            Extra cost of any pass over more than one token, and of each draft token.
        name : str
            How errors name the argument.

        Returns
        -------
        CostCurve
        """
        overhead, per_token = _check_pair((overhead, per_token), name)
        curve = cls.__new__(cls)
        curve._pair = (overhead, per_token)
        curve._resolve = curve._tree = None
        curve._set(tuple(1.0 if n == 0 else 1.0 + overhead + per_token * n for n in range(16)))
        return curve

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
        curve._pair = curve._values = curve._table = None
        curve._resolve = lambda: _model_curve(model)
        curve._tree = lambda: _model_tree_curve(model)  # read at the first tree's cost
        return curve

    def _resolved(self) -> CostCurve:
        if self._values is None:
            resolved = self._resolve()
            self._pair = resolved._pair
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
        self._resolved()
        if self._pair is not None:  # the pair's own formula, exactly (no extrapolation)
            overhead, per_token = self._pair
            return 1.0 if n_tokens <= 1 else 1.0 + overhead + per_token * (n_tokens - 1)
        values = self._values
        if n_tokens <= len(values):
            return values[max(n_tokens, 1) - 1]
        return values[-1] + self._slope * (n_tokens - len(values))

    def drafts(self, n_drafts: int) -> float:
        """Cost of the pass that verifies ``n_drafts`` draft tokens (and one more token)."""
        return self.tokens(n_drafts + 1)

    def drafts_table(self, n_max: int) -> list:
        """``[drafts(0), ..., drafts(n_max)]`` (kept: policies ask on every step)."""
        table = self._table
        if table is None or len(table) <= n_max:
            table = [self.drafts(n) for n in range(max(n_max, 16) + 1)]
            self._table, self._floor = table, suffix_minima(table)
        return table

    def drafts_floor(self, n_max: int) -> list:
        """``floor[n]``: the least of ``drafts(m)`` for ``m >= n`` in the kept table.

        At least ``n_max + 1`` entries; a lower bound of every pass over ``n`` drafts
        or more up to ``n_max``, for policies that stop looking early.
        """
        self.drafts_table(n_max)
        return self._floor

    def __repr__(self) -> str:
        if self._values is None:
            return "CostCurve(<the target model's, not read yet>)"
        if self._pair is not None:
            return f"CostCurve.from_pair{self._pair!r}"
        return f"CostCurve({list(self._values)!r})"


def check_target_cost(value, name: str = "target_cost"):
    """A policy's ``target_cost`` argument: None, ``"measured"`` or a :class:`CostCurve`.

    Parameters
    ----------
    value : None, "measured", CostCurve, tuple (overhead, per_token) or 1-D sequence
        A tuple of two numbers is an ``(overhead, per_token)`` pair; any other sequence
        (a list, a NumPy array) is a curve starting at 1.0.
    name : str
        How errors name the argument.

    Returns
    -------
    None, "measured" or CostCurve
    """
    if value is None or isinstance(value, CostCurve):
        return value
    if isinstance(value, str):
        if value == "measured":
            return value
        raise ValueError(f"{name} must be None, 'measured', a pair or a cost curve, got {value!r}")
    if isinstance(value, tuple) and len(value) == 2:
        return CostCurve.from_pair(*value, name=name)
    return CostCurve(value, name)


def _check_pair(value, name: str) -> tuple:
    overhead, per_token = value
    if not all(is_real(v) and 0.0 <= v < math.inf for v in (overhead, per_token)):
        raise ValueError(
            f"{name} must be a pair (overhead, per_token) of finite numbers >= 0, got {value!r}"
        )
    return float(overhead), float(per_token)


def _check_curve(values, name: str) -> tuple:
    expected = (
        f"{name} must be a cost curve: a 1-D sequence of finite numbers > 0 whose element 0 "
        "is 1.0 (the cost of a pass over i + 1 tokens relative to one token), or a tuple "
        "(overhead, per_token)"
    )
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise TypeError(f"{expected}; got {type(values).__name__} {values!r}")
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{expected}; got {values!r}") from None
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{expected}; got shape {array.shape}")
    if not (np.all(np.isfinite(array)) and np.all(array > 0.0)):
        raise ValueError(f"{expected}; got {array.tolist()!r}")
    if abs(array[0] - 1.0) > 1e-6:
        raise ValueError(f"{expected}; element 0 is {float(array[0])!r}")
    return tuple(float(v) for v in array)


def _model_tree_curve(model) -> CostCurve | None:
    """The target model's ``tree_cost_curve``, or None (trees cost as chains)."""
    curve = getattr(model, "tree_cost_curve", None)
    return None if curve is None else CostCurve(curve, "target_model.tree_cost_curve")


def _model_curve(model) -> CostCurve:
    """The target model's ``cost_curve``, else its ``speculation_cost``, else the default."""
    curve = getattr(model, "cost_curve", None)
    if curve is not None:
        return CostCurve(curve, "target_model.cost_curve")
    pair = getattr(model, "speculation_cost", None)
    if pair is not None:
        try:
            overhead, per_token = pair
        except (TypeError, ValueError):
            raise ValueError(
                f"target_model.speculation_cost must be a pair (overhead, per_token), got {pair!r}"
            ) from None
        return CostCurve.from_pair(overhead, per_token, "target_model.speculation_cost")
    return CostCurve(DEFAULT_COST_CURVE)


class PassTimer:
    """Mean wall time of target passes by their number of drafts, for ``"measured"``.

    Parameters
    ----------
    memory : float in (0, 1)
        Weight kept by earlier passes at each new one of the same length.
    """

    __slots__ = ("memory", "_times")

    def __init__(self, memory: float) -> None:
        self.memory = memory
        self._times: dict = {}  # drafts n -> [weight, mean seconds]

    def record(self, n_drafts: int, seconds: float) -> None:
        """Add one timed pass that verified ``n_drafts`` drafts."""
        if seconds > 0.0:
            weight, mean = self._times.get(n_drafts, (0.0, 0.0))
            weight = weight * self.memory + 1.0
            self._times[n_drafts] = [weight, mean + (seconds - mean) / weight]

    def drafts(self, n_drafts: int, fallback: CostCurve) -> float:
        """Measured relative cost of verifying ``n_drafts``; ``fallback`` until timed."""
        times = self._times
        if 0 in times and n_drafts in times:
            return times[n_drafts][1] / times[0][1]
        return fallback.drafts(n_drafts)


def chosen_cost(own, model_cost) -> CostCurve:
    """The policy's own curve if it was given one, else the target model's, else the default.

    Parameters
    ----------
    own : None, "measured" or CostCurve
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
        return check_target_cost(model_cost, "the target model's cost")
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
