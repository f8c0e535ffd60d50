"""The default draft-length policy for drafters: acceptance per position in the draft.

See :mod:`specdec.drafters.length` for the contract every policy follows (the order of
the calls, the ``(source, evidence)`` key, what is kept across ``generate`` calls), and
:mod:`specdec.drafters.cost` for the target's cost curve.
"""

from __future__ import annotations

import math

from specdec._validation import is_int, is_real
from specdec.drafters.cost import (
    DEFAULT_COST_CURVE,
    CostCurve,
    PassTimer,
    check_target_cost,
    chosen_cost,
)
from specdec.drafters.length import DraftLengthPolicy

__all__ = ["PositionalDraftLength"]


class PositionalDraftLength(DraftLengthPolicy):
    """The draft length with the most expected tokens per unit of target time.

    The default policy for drafters.  It models the chance ``a(i)`` that draft token
    ``i`` is kept *given that tokens 1..i-1 were*, separately for each draft source,
    each strength of evidence ``e`` (a drafter's match length) and each position ``i``.
    A step drafting n tokens then emits ``E(n) = 1 + a(1) + a(1)a(2) + ...`` tokens in
    expectation, for a target pass over ``n + 1`` tokens costing ``C(n)`` one-token
    passes (the cost curve), and the policy picks the n in ``[min_tokens, offered]``
    that maximises ``E(n) / C(n)``: ``n = 0`` (one token for one pass) when no draft
    pays.  This is the optimal stopping rule of SpecDec++ (Huang et al. 2024): keep
    drafting while the chance that the next token is rejected, ``1 - a(i)``, stays
    below the threshold that the cost curve sets at that length; maximising the ratio
    over every n also handles curves that are not linear.

    Priors.  Before a cell is observed, ``a(i)`` for evidence ``e`` is the prior of a
    match of length ``L = e + i - 1`` (once i - 1 drafted tokens were kept, the match
    is that much longer): ``1 - 0.7 / L**0.8``, capped at 0.97.  A spurious 1-token
    match starts at 0.3; a copied passage (a 16-token match) at 0.92, rising along the
    draft.  A source without evidence (a draft model) starts at ``prior_acceptance``.
    Position i's prior is raised to the estimate at position i - 1 when that is
    higher, so that what was learnt at the first positions carries to the next ones
    before they are observed.  Each cell's estimate is ``(kept + s * prior) / (tested
    + s)`` with ``s = prior_strength`` pseudo-observations, and older observations fade
    by ``memory`` each time the cell is observed again, so that it follows a text that
    changes character.

    What it learns is kept on the object (across the ``generate`` calls of one decoder,
    see the module docstring); :meth:`reset` forgets it.

    Parameters
    ----------
    min_tokens : int, default 0
        Draft at least this many tokens when a proposal offers them.
    p_min : float in [0, 1), default 0.0
        A draft model stops drafting at a token whose top probability is below this
        (llama.cpp's ``--draft-p-min``); 0 never stops.
    target_cost : None, "measured", (overhead, per_token) or cost curve
        As for :class:`~specdec.drafters.AdaptiveDraftLength`; None uses the target model's curve.
    draft_cost : float >= 0, default 0.0
        Cost of one draft token relative to a one-token target pass.
    prior_acceptance : float in (0, 1), default 0.5
        Prior of a source without evidence, at every position.
    prior_strength : float > 0, default 4.0
        Pseudo-observations of the prior in each cell.
    memory : float in (0, 1), default 0.98
        Weight kept by a cell's past observations at each new one.

    Examples
    --------
    >>> policy = PositionalDraftLength()
    >>> policy.start(16, CostCurve([1.0, 1.1, 1.2, 1.3]))   # a flat curve: long drafts pay
    >>> policy.length((0, 12), 16), policy.length((0, 1), 16)   # a copy, a 1-token match
    (13, 3)
    """

    #: A source not drafted from for this many proposals is tried with one token.
    PROBE_EVERY = 16
    #: Evidence beyond this match length shares one set of cells.
    MAX_EVIDENCE = 16
    #: Positions beyond this share the last cell.
    MAX_POSITION = 32

    def __init__(
        self,
        min_tokens: int = 0,
        p_min: float = 0.0,
        *,
        target_cost=None,
        draft_cost: float = 0.0,
        prior_acceptance: float = 0.5,
        prior_strength: float = 4.0,
        memory: float = 0.98,
    ) -> None:
        if not is_int(min_tokens) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
        if not is_real(p_min) or not 0.0 <= p_min < 1.0:
            raise ValueError(f"p_min must be a number in [0, 1), got {p_min!r}")
        for name, value in (("prior_acceptance", prior_acceptance), ("memory", memory)):
            if not is_real(value) or not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
        if not is_real(prior_strength) or not 0.0 < prior_strength < math.inf:
            raise ValueError(f"prior_strength must be a finite number > 0, got {prior_strength!r}")
        if not is_real(draft_cost) or not 0.0 <= draft_cost < math.inf:
            raise ValueError(f"draft_cost must be a finite number >= 0, got {draft_cost!r}")
        self.min_tokens = int(min_tokens)
        self.p_min = float(p_min)
        self.target_cost = check_target_cost(target_cost, "target_cost")
        self.draft_cost = float(draft_cost)
        self.prior_acceptance = float(prior_acceptance)
        self.prior_strength = float(prior_strength)
        self.memory = float(memory)
        self._max = 1
        self._cost = CostCurve(DEFAULT_COST_CURVE)
        self._priors: dict = {}  # evidence -> prior acceptance by position (a cache)
        self.reset()

    def __repr__(self) -> str:
        return (
            f"PositionalDraftLength(min_tokens={self.min_tokens}, p_min={self.p_min}, "
            f"target_cost={self.target_cost!r}, draft_cost={self.draft_cost}, "
            f"prior_acceptance={self.prior_acceptance}, "
            f"prior_strength={self.prior_strength}, memory={self.memory})"
        )

    def reset(self) -> None:
        """Forget every observation (acceptance, idle counts and timings)."""
        self._cells: dict = {}  # (source, evidence, position) -> [kept, tested]
        self._idle: dict = {}  # (source, evidence) -> proposals since the last draft
        self._timer = PassTimer(self.memory)

    def start(self, max_tokens: int, target_cost=None) -> None:
        """Begin a generate call (see :class:`DraftLengthPolicy`); keeps what was learnt.

        Parameters
        ----------
        max_tokens : int
            The most draft tokens per step.
        target_cost : CostCurve, optional
            The target model's cost curve, used unless ``target_cost`` was given.
        """
        self._max = max_tokens
        self._cost = chosen_cost(self.target_cost, target_cost)

    def _cell_key(self, key, position: int) -> tuple:
        source, evidence = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if evidence is not None:
            evidence = min(int(evidence), self.MAX_EVIDENCE)
        return source, evidence, min(position, self.MAX_POSITION)

    def prior(self, evidence, position: int) -> float:
        """The acceptance assumed at ``position`` (1-based) before any observation.

        Parameters
        ----------
        evidence : int or None
            The proposal's match length.
        position : int
            Position within the draft, from 1.

        Returns
        -------
        float
        """
        if evidence is None or evidence <= 0:
            return self.prior_acceptance
        match = evidence + position - 1
        return min(0.97, 1.0 - 0.7 / match**0.8)

    def acceptances(self, key, n: int) -> list:
        """Estimated chance that draft token i is kept given the ones before, i = 1..n.

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.
        n : int
            Positions wanted.

        Returns
        -------
        list of float
            ``[a(1), ..., a(n)]``, each in (0, 1).
        """
        source, evidence = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if evidence is not None:
            evidence = min(int(evidence), self.MAX_EVIDENCE)
        cells, strength, last = self._cells, self.prior_strength, self.MAX_POSITION
        priors = self._priors.get(evidence)
        if priors is None or len(priors) < n:
            priors = self._priors[evidence] = [
                self.prior(evidence, i) for i in range(1, max(n, last) + 1)
            ]
        estimates, previous = [], 0.0
        for position in range(1, n + 1):
            # A position not observed yet borrows from the one before it: once tokens
            # 1..i-1 are kept, token i is at least as likely to be (max with the prior).
            prior = priors[position - 1]
            if previous > prior:
                prior = previous
            cell = cells.get((source, evidence, position if position < last else last))
            if cell is None:
                previous = prior
            else:
                previous = (cell[0] + strength * prior) / (cell[1] + strength)
            estimates.append(previous)
        return estimates

    def acceptance(self, key, position: int = 1) -> float:
        """Estimated chance that draft token ``position`` is kept, given the ones before.

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.
        position : int, default 1
            Position within the draft, from 1.

        Returns
        -------
        float
            In (0, 1).
        """
        return self.acceptances(key, position)[-1]

    def cost(self, n: int) -> float:
        """Cost of the target pass over ``n`` drafts and one token, in one-token passes.

        Parameters
        ----------
        n : int
            Draft tokens verified.

        Returns
        -------
        float
        """
        if self.target_cost == "measured":
            return self._timer.drafts(n, self._cost)
        return self._cost.drafts(n)

    def length(self, key, offered: int) -> int:  # noqa: D102
        offered = min(offered, self._max)
        if offered <= 0:
            return 0
        best_n, best_rate = 0, -1.0
        expected, survive = 1.0, 1.0
        acceptances = self.acceptances(key, offered)
        if self.target_cost == "measured":
            costs = [self._timer.drafts(n, self._cost) for n in range(offered + 1)]
        else:
            costs = self._cost.drafts_table(offered)
        draft_cost = self.draft_cost
        for n in range(0, offered + 1):
            if n > 0:
                survive *= acceptances[n - 1]
                expected += survive
            if n < self.min_tokens:
                continue
            rate = expected / (costs[n] + draft_cost * n)
            if rate > best_rate * (1.0 + 1e-9):
                best_n, best_rate = n, rate
        idle_key = self._cell_key(key, 0)[:2]
        if best_n == 0:
            # A source never drafted from learns nothing (a draft model gives no free
            # observation): try one token after PROBE_EVERY idle proposals.
            idle = self._idle.get(idle_key, 0) + 1
            self._idle[idle_key] = idle
            if idle >= self.PROBE_EVERY:
                best_n = 1
        if best_n:
            self._idle[idle_key] = 0
        return best_n

    def observe(self, key, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        # Tokens 1..kept were kept; token kept + 1 (if drafted) was rejected; the shadow
        # (after a fully kept draft) is one more observation at position drafted + 1.
        outcomes = [(i, 1.0) for i in range(1, kept + 1)]
        if kept < drafted:
            outcomes.append((kept + 1, 0.0))
        elif shadow is not None:
            outcomes.append((drafted + 1, float(shadow)))
        cells, memory = self._cells, self.memory
        for position, success in outcomes:
            cell = self._cell_key(key, position)
            kept_sum, tested_sum = cells.get(cell, (0.0, 0.0))
            cells[cell] = [kept_sum * memory + success, tested_sum * memory + 1.0]
        if self.target_cost == "measured":
            self._timer.record(drafted, target_seconds)
