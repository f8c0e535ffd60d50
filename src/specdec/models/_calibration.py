"""The target's cost curve: how long a pass over n new tokens takes, relative to one.

Speculation pays when a pass over the drafts plus one costs little more than a
pass over one token.  How much more depends on the model, the library, the
hardware and the thread settings (llama.cpp with one batch thread: 8 tokens cost
about 3.8 one-token passes; with two, about 2.5; PyTorch on a CPU: barely more than
one), so an adapter measures it once per process and setting, on first use.

:func:`measure_cost_curve` times the passes through the adapter's own cache
primitives (the same code path as decoding) on top of whatever the cache holds
and leaves the cache as it found it (or empty, which is also consistent);
:func:`check_cost_curve` validates a curve given by the user.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import numpy as np

from specdec.drafters import cost

__all__ = [
    "CalibrationWarning",
    "MAX_TOKENS",
    "implausibility",
    "check_cost_curve",
    "measure_cost_curve",
    "measure_tree_cost_curve",
]

#: The curve covers passes over 1 to MAX_TOKENS new tokens.
MAX_TOKENS = 16

#: Pass sizes that are timed; the others are interpolated linearly (the curve is
#: smooth, and timing 10 sizes instead of 16 keeps the calibration short).
MEASURED_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)

#: Rounds of every size (interleaved); fewer when a round takes long (slow models).
#: Three rounds left the curve's shape to chance on a 2-core machine (the length a
#: perfect copy drafts flipped between 5 and 10 with it); five steady it.
ROUNDS = 5
#: After this many seconds no new round starts (at least one round always runs).
TIME_BUDGET = 4.0
#: Seconds of warm-up passes (one token and MAX_TOKENS, in turn; at least one each).
WARM_UP = 0.5
#: Tokens of the made-up context evaluated first when the cache is empty.
CONTEXT_TOKENS = 32

logger = logging.getLogger("specdec.models")

#: A pass over k tokens may cost at most ``(1 + MARGIN) * k`` one-token passes: a
#: batch does the work of k passes in one (on every machine measured here it costs
#: well under k: SmolLM2 in llama.cpp, 2 tokens 1.9x, 8 tokens 2.5-3.9x).  A curve
#: above it was measured while something else held the CPU (once: 2 tokens at 158x).
MARGIN = 0.5
#: The rounds of one size may differ by this factor (slowest over fastest) at most, at
#: the median over the sizes; quiet machines here stay within 1.3.
MAX_SPREAD = 2.0
#: Measurements before an implausible curve is given up for the default.
ATTEMPTS = 2


class CalibrationWarning(UserWarning):
    """A measured cost curve was implausible twice; the default curve replaced it."""


#: Tree sizes (tokens in the pass: the last token and the nodes) that are timed.
TREE_SIZES = (3, 5, 9, 16)

#: Curves measured in this process, by the adapter's calibration key.
_MEASURED: dict = {}
#: ... and the tree curves of adapters that score trees in one pass.
_MEASURED_TREES: dict = {}


def check_cost_curve(value: Any, name: str = "cost_curve") -> np.ndarray:
    """A user's cost curve as a read-only float64 array, or a clear error.

    Validated by :func:`specdec.drafters.cost.check_cost_curve` (the one validator of
    a curve); the adapters keep it as an array.

    Parameters
    ----------
    value : array_like of float
        Element ``i`` is the time of a pass over ``i + 1`` new tokens relative to
        one token: element 0 must be 1.0, every element finite and positive.
    name : str, default "cost_curve"
        How errors name the argument.

    Returns
    -------
    numpy.ndarray
    """
    curve = np.array(cost.check_cost_curve(value, name), dtype=np.float64)
    curve.flags.writeable = False
    return curve


def measure_cost_curve(model: Any, max_length: int | None) -> np.ndarray:
    """Time passes over 1..MAX_TOKENS new tokens through ``model``'s cache primitives.

    Parameters
    ----------
    model : PrefixCachedModel
        The adapter (its ``_cached_ids``, ``_roll_back`` and ``_evaluate`` are used).
    max_length : int or None
        Longest sequence the model takes (its context), if limited.

    Returns
    -------
    numpy.ndarray
        The read-only curve, float64, ``MAX_TOKENS`` elements, element 0 is 1.0.
        Medians of the rounds, made non-decreasing (a pass over more tokens never
        costs less; a dip is noise).
    """
    return _kept(
        _MEASURED,
        model,
        lambda: _chain_curve(model, max_length),
    )


def measure_tree_cost_curve(model: Any, max_length: int | None, chain: np.ndarray) -> np.ndarray:
    """Time one-pass trees of drafts over 3..MAX_TOKENS tokens (``model.forward_tree``).

    Each timed tree has two branches of equal depth (a node more in the first when the
    count is odd) after the last token, and is timed, as a chain pass is, after a
    one-token pass and together with the one-token pass that follows it (along the
    first branch, the one the adapters' caches keep).  Chains of the same sizes are
    timed in the same rounds, and the tree's premium over them (a median of paired
    differences) is added to ``chain``: two calibrations run at different moments
    would differ by the change of load between them, more than by the premium.

    Parameters
    ----------
    model : PrefixCachedModel
        An adapter with ``forward_tree``.
    max_length : int or None
        Longest sequence the model takes, if limited.
    chain : numpy.ndarray
        The model's (chain) cost curve: a tree never costs less than a chain over as
        many tokens, and a tree of one node is a chain.

    Returns
    -------
    numpy.ndarray
        The read-only curve: element ``i`` is a tree pass over ``i + 1`` tokens (``i``
        nodes), relative to a one-token pass; float64, ``MAX_TOKENS`` elements.
    """
    return _kept(
        _MEASURED_TREES,
        model,
        lambda: _tree_curve(model, max_length, chain),
    )


def forget(model: Any) -> None:
    """Drop the curves kept for ``model``'s calibration key (chain and tree), if any."""
    key = model._calibration_key()
    if key is not None:
        _MEASURED.pop(key, None)
        _MEASURED_TREES.pop(key, None)


def _kept(store: dict, model: Any, measure) -> np.ndarray:
    """``store``'s curve for ``model``'s calibration key, measured (and kept) if absent."""
    key = model._calibration_key()
    if key is not None and key in store:
        return store[key]
    curve = measure()
    if key is not None:
        store[key] = curve
    return curve


def _chain_pass(model: Any, seq: np.ndarray, n_base: int, k: int) -> list:
    """A pass over ``k`` tokens after ``seq[:n_base + 1]``, then the one-token passes after it.

    As many as ``cost.AFTERMATH_PASSES``: they carry the batch's slowdown.  Returns the
    clock's reading after each pass.
    """
    model._evaluate(seq[: n_base + 1 + k], n_base + 1, k)
    readings = [time.perf_counter()]
    for j in range(cost.AFTERMATH_PASSES):
        model._evaluate(seq[: n_base + 2 + k + j], n_base + 1 + k + j, 1)
        readings.append(time.perf_counter())
    return readings


def _tree_pass(model: Any, seq: np.ndarray, n_base: int, k: int) -> list:
    """A two-branch tree over ``k`` tokens, then ``cost.AFTERMATH_PASSES`` one-token passes.

    The tree has ``k - 1`` nodes after ``seq[:n_base + 1]``; the next pass follows its
    first branch (the one the adapters' caches keep).  Returns the clock's reading
    after each pass.
    """
    nodes = k - 1
    first = (nodes + 1) // 2
    parents = np.arange(-1, nodes - 1, dtype=np.int64)
    parents[first] = -1  # the second branch starts at the root
    prefix = seq[: n_base + 1]
    tree = seq[n_base + 1 : n_base + 1 + nodes]
    model.forward_tree(prefix, tree, parents)
    readings = [time.perf_counter()]
    after = seq[: n_base + 1 + first]
    for j in range(cost.AFTERMATH_PASSES):
        next_token = seq[n_base + 1 + nodes + j : n_base + 2 + nodes + j]
        after = np.concatenate([after, next_token])
        model.forward(after[None, :], logits_to_keep=1)
        readings.append(time.perf_counter())
    return readings


def _timed_rounds(model, max_length, what: str, plan) -> dict:
    """Time ``plan``'s passes in interleaved rounds; ``{(kind, k): array (rounds, A + 1)}``.

    ``plan`` is a list of ``(kind, k)``, kind ``"chain"`` or ``"tree"`` (a two-branch tree
    over ``k`` tokens).  A row holds one round's timings of the pass and of the A =
    ``cost.AFTERMATH_PASSES`` one-token passes after it, one by one, all after a
    one-token pass, as in decoding (:func:`_totals` sums them).  A round times every
    entry once (in reverse order every other round), so that a change of load hits all
    entries of a round alike.
    """
    logger.info(
        "specdec: measuring %s's cost of a %s pass over 1..%d tokens (once per process "
        "and setting; pass %s=... to skip)",
        type(model).__name__,
        what,
        MAX_TOKENS,
        "cost_curve" if what == "chain" else "tree_cost_curve",
    )
    started = time.perf_counter()
    cached = np.array(model._cached_ids(), dtype=np.int64)
    # a one-token pass before the timed pass and cost.AFTERMATH_PASSES after it
    extra = MAX_TOKENS + 1 + cost.AFTERMATH_PASSES
    probe = np.random.default_rng(0).integers(0, model.vocab_size, CONTEXT_TOKENS + extra)
    if cached.size and (max_length is None or cached.size + extra <= max_length):
        base, restore = cached, cached.size  # time on top of the user's context
    else:
        base, restore = probe[:CONTEXT_TOKENS], 0  # a made-up context, dropped afterwards
    seq = np.concatenate([base, probe[CONTEXT_TOKENS:]])
    n_base = base.size
    passes = {"chain": _chain_pass, "tree": _tree_pass}
    # a tree's timing goes through forward_tree and forward, which count their work:
    # the user's counters must not show the calibration's
    counters = model.n_evaluated_tokens, model.n_forward_calls
    # nor may the check of the curve take the calibration's passes for decoding's
    check, model.cost_check = model.cost_check, None

    def one_pass(kind: str, k: int) -> np.ndarray:
        # As in decoding: the pass over k tokens comes after a one-token pass, and the
        # next steps' one-token passes are timed with it.  They pay for the batch
        # before them (llama.cpp: a token after a batch of 16 took 15% longer than after
        # a token, and the next ones longer too, see cost.AFTERMATH_PASSES), and a curve without
        # that price understated every batch against decoding.
        model._roll_back(n_base)
        n_cached = model._cached_ids().shape[0]
        if n_cached < n_base:  # a cache that cannot be cut was emptied: rebuild it
            model._evaluate(seq[:n_base], n_cached, 1)
        model._evaluate(seq[: n_base + 1], n_base, 1)
        begin = time.perf_counter()
        return np.diff([begin, *passes[kind](model, seq, n_base, k)])

    try:
        # Warm-up: the first passes fault weights and buffers in.  With one pass of
        # each, a process's first calibration once came out a quarter flatter than the
        # next ones (LlamaCppTreeModel: 2 tokens 1.36x against 1.90x); with half a
        # second of them the first two calibrations of a process agree within 7%.
        warm = time.perf_counter()
        while time.perf_counter() - warm < WARM_UP:
            one_pass("chain", 1)
            one_pass(plan[-1][0], MAX_TOKENS)
        rounds_started = time.perf_counter()
        parts: dict = {entry: [] for entry in plan}
        for round_ in range(ROUNDS):
            if round_ and time.perf_counter() - rounds_started > TIME_BUDGET:
                break
            for kind, k in plan if round_ % 2 == 0 else plan[::-1]:
                parts[kind, k].append(one_pass(kind, k))
    finally:
        model._roll_back(restore)
        model.n_evaluated_tokens, model.n_forward_calls = counters
        model.cost_check = check
    logger.info(
        "specdec: %s %s cost curve measured in %.1f s",
        type(model).__name__,
        what,
        time.perf_counter() - started,
    )
    return {entry: np.array(rounds) for entry, rounds in parts.items()}


def _totals(parts: dict) -> dict:
    """Each round's timing of the pass and the passes after it, summed: ``{entry: [s]}``."""
    return {entry: rounds.sum(axis=1).tolist() for entry, rounds in parts.items()}


def implausibility(curve: np.ndarray, times: dict) -> str | None:
    """Why a measured curve cannot be right (see MARGIN, MAX_SPREAD), or None.

    Parameters
    ----------
    curve : numpy.ndarray
        Element ``i``: a pass over ``i + 1`` tokens, relative to one.
    times : dict
        The timings of each timed size, by round.

    Returns
    -------
    str or None
    """
    sizes = np.arange(1, curve.size + 1)
    over = np.flatnonzero(curve > (1.0 + MARGIN) * sizes)
    if over.size:
        k = int(over[0]) + 1
        return (
            f"a pass over {k} tokens measured at {float(curve[k - 1]):.1f} one-token passes, "
            f"more than {1.0 + MARGIN:g} x {k}"
        )
    spreads = [max(t) / min(t) for t in times.values() if len(t) > 1 and min(t) > 0]
    if spreads and float(np.median(spreads)) > MAX_SPREAD:
        return (
            f"its repeated timings differ by {float(np.median(spreads)):.1f}x (median over "
            f"the sizes), more than {MAX_SPREAD:g}x"
        )
    return None


def _plausible(model, what: str, measure, fallback) -> np.ndarray:
    """``measure()``'s curve, measured again if implausible, then ``fallback()``, warned."""
    for _ in range(ATTEMPTS):
        curve, times = measure()
        problem = implausibility(curve, times)
        if problem is None:
            return curve
        logger.info(
            "specdec: %s %s cost curve implausible: %s", type(model).__name__, what, problem
        )
    warnings.warn(
        f"specdec: the {what} cost curve measured for {type(model).__name__} is implausible "
        f"({problem}; measured {ATTEMPTS} times, the machine is probably busy): using "
        f"{'the default curve' if what == 'chain' else 'the chain curve'} instead, which "
        "the timings of decoding then correct. Pass cost_curve=... to the model to skip "
        "the measurement",
        CalibrationWarning,
        stacklevel=5,
    )
    return fallback()


def _chain_curve(model, max_length) -> np.ndarray:
    """Chain passes over ``MEASURED_SIZES`` tokens, the others interpolated; plausible."""

    def measure():
        plan = [("chain", k) for k in MEASURED_SIZES]
        parts = _timed_rounds(model, max_length, "chain", plan)
        # A timing holds the pass and the A = cost.AFTERMATH_PASSES one-token passes
        # after it.  A pass over k tokens costs its own time plus the slowdown of the A
        # passes after it.  Taken from the sum of the two (as until 2026-12-06), one
        # interrupted pass among the seven moved a size's price by a whole pass.  So
        # every pass is timed alone, each position's median taken over the rounds (an
        # interruption hits one pass of one round), and the slowdown, small and noisy
        # at each size, is fitted once over the batch sizes as a line in the tokens
        # after the first (llama.cpp here, 2026-12-06: about 0.15 + 0.06 per token; a
        # constant on another machine).  What this does not remove: the machine's
        # speed changing from one calibration to the next (on a 2-core VM, 2 tokens
        # at 1.5-2.1 one-token passes either way, six calibrations a minute apart).
        sizes = np.array(MEASURED_SIZES, dtype=np.float64)
        medians = np.array([np.median(parts["chain", k], axis=0) for k in MEASURED_SIZES])
        one = np.median(parts["chain", 1])  # a token after a token: every such pass timed
        alone = medians[:, 0] / one
        after = medians[:, 1:].sum(axis=1)
        slowdown = (after[1:] - after[0]) / one  # the passes after a batch, above after a token
        slope, intercept = np.polyfit(sizes[1:] - 1, slowdown, 1)
        passes = alone.copy()
        passes[1:] += np.maximum(intercept + slope * (sizes[1:] - 1), 0.0)
        curve = np.interp(np.arange(1, MAX_TOKENS + 1), sizes, passes)
        return _finished(curve), _totals(parts)

    def default():
        from specdec.drafters.cost import DEFAULT_COST_CURVE

        return _finished(np.array(DEFAULT_COST_CURVE[:MAX_TOKENS], dtype=np.float64))

    return _plausible(model, "chain", measure, default)


def _tree_curve(model, max_length, chain: np.ndarray) -> np.ndarray:
    """``chain`` plus a tree's premium, from trees and chains timed side by side.

    The premium at each size is the median over the rounds of the tree's timing minus
    the chain's of the same round (each with the one-token passes after it: a paired
    difference, so a change of load between rounds cancels), never below 0, in the
    chain curve's unit (the median of every one-token pass of the ``("chain", 1)``
    timings); a tree of one node (2 tokens) is a chain.
    """
    chain = np.asarray(chain[:MAX_TOKENS], dtype=np.float64)

    def measure():
        plan = [("chain", 1)] + [(kind, k) for k in TREE_SIZES for kind in ("chain", "tree")]
        parts = _timed_rounds(model, max_length, "tree", plan)
        times = _totals(parts)
        one = np.median(parts["chain", 1])
        premium = [
            max(float(np.median(np.subtract(times["tree", k], times["chain", k]))), 0.0) / one
            for k in TREE_SIZES
        ]
        extra = np.interp(np.arange(1, MAX_TOKENS + 1), (2, *TREE_SIZES), [0.0, *premium])
        return _finished(chain + extra), times

    return _plausible(model, "tree", measure, lambda: _finished(chain.copy()))


def _finished(curve: np.ndarray) -> np.ndarray:
    """Non-decreasing (a dip is noise), 1.0 for one token and at least 1.0 after, read-only."""
    curve = np.maximum.accumulate(np.maximum(curve, 1.0))
    curve[0] = 1.0
    curve.flags.writeable = False
    return curve
