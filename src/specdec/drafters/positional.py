"""The default draft-length policy for drafters: acceptance per position in the draft.

See :mod:`specdec.drafters.length` for the contract every policy follows (the order of
the calls, the ``(source, evidence)`` key, what is kept across ``generate`` calls), and
:mod:`specdec.drafters.cost` for the target's cost curve.

Why one module past 500 lines: one class, the policy's acceptance model with the
documented methods its tree selector calls (``drafters/_tree_selection.py``).
"""

from __future__ import annotations

import bisect
import itertools
import math

from specdec._validation import is_int, is_real
from specdec.drafters._tree_selection import TreeSelector
from specdec.drafters.cost import (
    CostCurve,
    CurveCheck,
    check_target_cost,
    chosen_cost,
    suffix_minima,
)
from specdec.drafters.length import NO_TALLY, DraftLengthPolicy, Tally, shortest_near_best

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
    is that much longer): ``1 - 0.7 / L``, capped at 0.99.  A spurious 1-token match
    starts at 0.3, a 3-token one at 0.77, a copied passage (a 16-token match) at 0.96,
    rising along the draft (measured on SmolLM2 prompt lookup, greedy: 3-gram matches
    kept their first token 88% of the time, tokens past the fifth 99%, 1-gram matches
    20%; at temperature 0.7 far fewer, which the observations teach).  A source without
    evidence (a draft model) starts at ``prior_acceptance``.
    Evidence is learnt in buckets (1, 2, 3, 4-5, 6-8, 9-12, 13-20, 21-32 tokens), so
    that a copy whose match grows from step to step keeps learning in a few cells.
    Position i's prior is raised to the estimate at position i - 1 when that is
    higher, so that what was learnt at the first positions carries to the next ones
    before they are observed.  What the source's *other* evidence buckets saw at that
    position then moves the prior the same way, ``(kept' + s * prior) / (tested' + s)``
    over their pooled tallies: a text whose drafts fail at some position (a JSON key
    matches, its value does not) fails there whatever the match's length, and one
    bucket alone learns it slowly (replayed: open text +0.6%, held-out grounded prompts
    +0.5-1%, a verbatim quote at 0.7 -2%).  Each cell's estimate is ``(kept + s *
    prior) / (tested + s)`` with ``s = prior_strength`` pseudo-observations, and older
    observations fade by ``memory`` each time the cell is observed again, so that it
    follows a text that changes character.

    The priors of a drafter follow the text too: they are shifted by one log-odds
    offset per source, which every observation of that source moves by
    ``offset_rate * (outcome - shifted prior)`` (within [-3, 2]).  Cells learn one
    evidence and position each; the offset learns from all of them at once, so that a
    few failed drafts on open text, where even 2- and 3-token matches of common
    phrases are rarely kept, lower every prior of the source before each cell has
    been observed (replayed on recorded SmolLM2 outputs, ``bench/replay_drafting.py``:
    open text 0.96-0.98x plain without it, 0.98-1.00x with it, copies unchanged).

    Trees of candidates (several continuations in one target pass) are selected from
    the same model, with a learnt acceptance per rank of alternative, and priced with
    the target's tree cost curve: :meth:`select_tree` and :meth:`observe_tree`, by a
    :class:`~specdec.drafters._tree_selection.TreeSelector` (:attr:`trees`).

    What it learns is kept on the object (across the ``generate`` calls of one decoder,
    see the module docstring); :meth:`reset` forgets it.

    Parameters
    ----------
    min_tokens : int, default 0
        Draft at least this many tokens when a proposal offers them.
    p_min : float in [0, 1), default 0.0
        A draft model stops drafting at a token whose top probability is below this
        (llama.cpp's ``--draft-p-min``); 0 never stops.
    target_cost : None, CostCurve or 1-D sequence of float
        The cost curve of the target's passes (element i: a pass over i + 1 tokens,
        relative to one token; element 0 is 1.0), taken as given; None uses the target
        model's (:mod:`specdec.drafters.cost`).
    draft_cost : float >= 0, default 0.0
        Cost of one draft token relative to a one-token target pass.
    prior_acceptance : float in (0, 1), default 0.5
        Prior of a source without evidence, at every position.
    prior_strength : float > 0, default 4.0
        Pseudo-observations of the prior in each cell.
    memory : float in (0, 1), default 0.98
        Weight kept by a cell's past observations at each new one.
    offset_rate : float >= 0, default 0.6
        How fast a drafter's priors follow its observed acceptance (see above); 0
        keeps the priors fixed.
    tie_tolerance : float in [0, 1), default 0.0
        Of the lengths whose expected tokens per unit of cost come within this
        fraction of the best, draft the shortest (no draft, when it is among them),
        while the key's first cell is new: the tolerance is scaled by ``s / (s +
        t)``, ``t`` the (faded) tokens tested in that cell and ``s = prior_strength``.
        The ratios rest on estimates from few observations (a new decoder starts from
        the priors) and on a noisy measured cost curve, and a longer draft loses more
        when they are too hopeful.  0 (the default) takes the best ratio as
        estimated.  Measured with SmolLM2 in llama.cpp on 2 cores, a fresh decoder
        per request, greedy (docs/performance.md): 0.06 gained open text 0.5-1.4%
        and cost the verbatim quote 5-13% (its copy starts on the same weak matches),
        other grounded prompts even; while sampling it gained every prompt set, and
        a decoder's own policy (``draft_length="auto"``) uses 0.06 at a temperature
        above 0 and 0 when greedy.

    Examples
    --------
    >>> policy = PositionalDraftLength(tie_tolerance=0.0)   # the best ratio itself
    >>> policy.start(16, CostCurve([1.0, 1.1, 1.2, 1.3]))   # a flat curve: long drafts pay
    >>> policy.length((0, 12), 16), policy.length((0, 1), 16)   # a copy, a 1-token match
    (16, 3)
    >>> cautious = PositionalDraftLength(tie_tolerance=0.06)   # near ties: the shortest
    >>> cautious.start(16, CostCurve([1.0, 1.1, 1.2, 1.3]))
    >>> cautious.length((0, 12), 16), cautious.length((0, 1), 16)
    (11, 2)
    """

    #: A source not drafted from for this many proposals is tried with one token.
    PROBE_EVERY = 16
    #: Evidence beyond this match length shares one set of cells.
    MAX_EVIDENCE = 32
    #: Upper ends of the evidence buckets that share cells (the last is MAX_EVIDENCE).
    EVIDENCE_BUCKETS = (1, 2, 3, 5, 8, 12, 20, 32)
    #: Positions beyond this share the last cell.
    MAX_POSITION = 32
    #: Bounds of a source's log-odds offset (see ``offset_rate``): a prior is scaled by
    #: at most e^2 = 7.4 up and e^-3 = 1/20 down in odds.
    OFFSET_BOUNDS = (-3.0, 2.0)

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
        offset_rate: float = 0.6,
        tie_tolerance: float = 0.0,
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
        if not is_real(offset_rate) or not 0.0 <= offset_rate < math.inf:
            raise ValueError(f"offset_rate must be a finite number >= 0, got {offset_rate!r}")
        if not is_real(tie_tolerance) or not 0.0 <= tie_tolerance < 1.0:
            raise ValueError(f"tie_tolerance must be a number in [0, 1), got {tie_tolerance!r}")
        self.min_tokens = int(min_tokens)
        self.p_min = float(p_min)
        self.target_cost = check_target_cost(target_cost, "target_cost")
        self.draft_cost = float(draft_cost)
        self.prior_acceptance = float(prior_acceptance)
        self.prior_strength = float(prior_strength)
        self.memory = float(memory)
        self.offset_rate = float(offset_rate)
        self.tie_tolerance = float(tie_tolerance)
        self._priors: dict = {}  # evidence -> prior acceptance by position (a cache)
        self.reset()

    def __repr__(self) -> str:
        return (
            f"PositionalDraftLength(min_tokens={self.min_tokens}, p_min={self.p_min}, "
            f"target_cost={self.target_cost!r}, draft_cost={self.draft_cost}, "
            f"prior_acceptance={self.prior_acceptance}, "
            f"prior_strength={self.prior_strength}, memory={self.memory}, "
            f"offset_rate={self.offset_rate}, tie_tolerance={self.tie_tolerance})"
        )

    def reset(self) -> None:
        """Forget every observation (acceptance, offsets, idle counts, own timed passes).

        The timed passes of an adapter's ``cost_check`` are the model's, kept.
        """
        self._cells: dict = {}  # (source, evidence, position) -> Tally
        # (source, position) -> the Tally of the source's cells at that position, summed
        # over its evidence buckets (kept up to date by learn)
        self._pooled: dict = {}
        self._offsets: dict = {}  # source -> log-odds offset of its priors
        self._idle: dict = {}  # (source, evidence) -> proposals since the last draft
        # the curve against the timed passes, unless the target adapter keeps its own
        # check (the run's curve's ``check``: see _current_check)
        self._own_check = CurveCheck()
        self.trees = TreeSelector()  # trees of candidates, and their alternatives' cells

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

    def _current_check(self, cost: CostCurve) -> CurveCheck:
        """The check of the calling thread's run, whose curve is ``cost``.

        An adapter's check serves every policy decoding with it (what earlier requests'
        passes showed is known from this request's first step); it is read from the
        run's curve, as the curve itself is, so that threads decoding with different
        targets each use their own.
        """
        return cost.check or self._own_check

    def _bucket(self, evidence: int) -> int:
        """The evidence bucket (its upper end) that ``evidence`` learns in."""
        buckets = self.EVIDENCE_BUCKETS
        i = bisect.bisect_left(buckets, evidence)  # the first upper end >= evidence
        return buckets[i] if i < len(buckets) else self.MAX_EVIDENCE

    def cell_group(self, key) -> tuple:
        """``(source, evidence bucket)``: the group of cells that ``key`` learns in.

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.

        Returns
        -------
        tuple
        """
        source, evidence = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if evidence is not None:
            evidence = self._bucket(int(evidence))
        return source, evidence

    def _cell_key(self, key, position: int) -> tuple:
        return self.cell_group(key) + (min(position, self.MAX_POSITION),)

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
        return min(0.99, 1.0 - 0.7 / match)

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
        return list(itertools.islice(self._estimates(key), n))

    def _estimates(self, key):
        """:meth:`acceptances` one position at a time, for as long as the caller asks."""
        source, evidence = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        bucket = None
        if evidence is not None:
            evidence = min(int(evidence), self.MAX_EVIDENCE)
            bucket = self._bucket(evidence)
        cells, strength, last = self._cells, self.prior_strength, self.MAX_POSITION
        pooled = self._pooled if bucket is not None else {}
        priors = self._priors.get(evidence)
        if priors is None:
            priors = self._priors[evidence] = [self.prior(evidence, i) for i in range(1, last + 1)]
        odds = math.exp(self._offsets.get(source, 0.0)) if bucket is not None else 1.0
        previous = 0.0
        for position in itertools.count(1):
            # A position not observed yet borrows from the one before it: once tokens
            # 1..i-1 are kept, token i is at least as likely to be (max with the prior).
            if position <= last:
                prior = priors[position - 1]
            else:
                prior = self.prior(evidence, position)
            if odds != 1.0:
                prior = _shifted(prior, odds)
            if previous > prior:
                prior = previous
            at = position if position < last else last
            cell = cells.get((source, bucket, at))
            pool = pooled.get((source, at))
            if pool is not None:
                # the other buckets' pooled tally (the class docstring says why)
                own = NO_TALLY if cell is None else cell
                tested = pool.tested - own.tested
                if tested > 1e-9:
                    prior = (pool.kept - own.kept + strength * prior) / (tested + strength)
            if cell is None:
                previous = prior
            else:
                previous = (cell.kept + strength * prior) / (cell.tested + strength)
            yield previous

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
        return self._curve().drafts(n)

    def _curve(self) -> CostCurve:
        """The run's cost curve, as corrected by the timed passes (see CurveCheck)."""
        cost = self._cost
        return self._current_check(cost).curve(cost)

    def pass_costs(self, n_max: int) -> tuple:
        """``(chain, tree)``: the cost of a step verifying 0..n_max drafts, with drafting's.

        Parameters
        ----------
        n_max : int
            The most drafts.

        Returns
        -------
        tuple of two lists of float
            A chain's and a tree's pass (at least ``n_max + 1`` entries each), plus
            ``draft_cost`` per draft.
        """
        curve = self._curve()  # its kept tables: this runs on every step
        chain, tree = curve.drafts_table(n_max), curve.tree_drafts_table(n_max)
        return self._with_drafting(chain), self._with_drafting(tree)

    def _with_drafting(self, costs: list) -> list:
        """``costs`` (a pass over n drafts, by n) plus ``draft_cost`` per draft."""
        if not self.draft_cost:
            return costs
        return [v + self.draft_cost * n for n, v in enumerate(costs)]

    def length(self, key, offered: int) -> int:  # noqa: D102
        offered = min(offered, self._max)
        if offered <= 0:
            return 0
        return self.probed(key, self.best_length(key, offered)[0])

    def best_length(self, key, offered: int) -> tuple:
        """``(n, rate)``: the draft length in [0, offered] with the most tokens per cost.

        The shortest length whose rate is within ``tie_tolerance`` of the best one's;
        ``n = 0`` (rate ``1 / cost(0)``) when no draft pays or ``offered`` is 0.  Also
        the chain option of :meth:`select_tree`.

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.
        offered : int
            The proposal's length.

        Returns
        -------
        tuple (int, float)
        """
        if offered <= 0:
            return 0, 1.0 / self.cost(0)
        draft_cost, min_tokens = self.draft_cost, self.min_tokens
        curve = self._curve()
        costs = self._with_drafting(curve.drafts_table(offered))
        floor = suffix_minima(costs) if draft_cost else curve.drafts_floor(offered)
        best_n, best_rate = 0, -1.0
        tolerance = self.tie_tolerance_at(key) if self.tie_tolerance else 0.0
        # (n, rate) of the lengths looked at, shortest first: only for a tolerance
        rates = [] if tolerance else None
        if min_tokens == 0:
            best_rate = 1.0 / costs[0]
            if rates is not None:
                rates.append((0, best_rate))
        expected, survive = 1.0, 1.0
        for n, a in enumerate(self._estimates(key), 1):
            survive *= a
            expected += survive
            if n >= min_tokens:
                rate = expected / costs[n]
                if rates is not None:
                    rates.append((n, rate))
                if rate > best_rate * (1.0 + 1e-9):
                    best_n, best_rate = n, rate
            if n == offered:
                break
            # Every later token is kept with chance at most 1 and costs at least the
            # cheapest pass still ahead: when even that cannot beat the best, stop
            # (on open text most proposals end here after a position or two).  The
            # lengths not looked at are longer than the best: never the shortest tie.
            if (expected + survive * (offered - n)) / floor[n + 1] < best_rate:
                break
        if tolerance:
            return shortest_near_best(rates, (best_n, best_rate), tolerance)
        return best_n, best_rate

    def tie_tolerance_at(self, key) -> float:
        """``tie_tolerance`` scaled by how new the key's first cell is (see the class).

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.

        Returns
        -------
        float
            ``tie_tolerance * s / (s + t)``: ``t`` the (faded) tokens tested in the
            key's first cell, ``s`` the prior strength.
        """
        tested = self._cells.get(self._cell_key(key, 1), NO_TALLY).tested
        strength = self.prior_strength
        return self.tie_tolerance * strength / (strength + tested)

    def probed(self, key, best_n: int) -> int:
        """``best_n``, or 1 after PROBE_EVERY proposals of ``key`` drafted from not at all.

        A source never drafted from learns nothing unless the decoder reports what its
        proposal would have scored (a drafter's proposal, compared with the token the
        target chose: :meth:`observe` with ``drafted=0`` and a ``shadow``); a draft model
        gives no such free observation, so it is tried with one token now and then (and
        a curve that forbids drafting is probed, see
        :class:`~specdec.drafters.cost.CurveCheck`).

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.
        best_n : int
            The length chosen.

        Returns
        -------
        int
        """
        idle_key = self.cell_group(key)
        if best_n == 0 and self.target_cost is None and self._current_check(self._cost).probe():
            return 1  # a pass of two tokens timed, to check the curve
        if best_n == 0:
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
        if drafted == 0 and shadow is not None:
            # a free observation: a key that gets them never needs a paid probe
            self._idle[self.cell_group(key)] = 0
        self.learn(key, outcomes, outcomes)
        if self.target_cost is None and self._cost.check is None:
            self._own_check.record(drafted, target_seconds)  # an adapter's check times itself

    def learn(self, key, outcomes, offset_outcomes) -> None:
        """Record draft outcomes in ``key``'s cells, and teach its source's offset.

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`length`.
        outcomes : list of (int, float)
            ``(position, success)``: each recorded in the cell of that position.
        offset_outcomes : list of (int, float)
            ``(position, success)`` that move the source's offset (a tree's outcomes
            off its first candidate do not).
        """
        self._learn_offset(key, offset_outcomes)
        cells, pooled, memory = self._cells, self._pooled, self.memory
        for position, success in outcomes:
            cell = self._cell_key(key, position)
            before = cells.get(cell, NO_TALLY)
            after = cells[cell] = before.add(success, 1.0, memory)
            source, bucket, at = cell
            if bucket is not None:
                pool = pooled.get((source, at), NO_TALLY)
                pooled[source, at] = Tally(
                    pool.kept + after.kept - before.kept, pool.tested + after.tested - before.tested
                )

    def select_tree(self, key, tree):
        """Which nodes of a tree of candidates to verify (see :class:`TreeSelector`).

        Parameters
        ----------
        key : tuple (source, evidence)
            As for :meth:`length`.
        tree : DraftTree
            The candidates.

        Returns
        -------
        numpy.ndarray of bool, shape (N,)
            The selected nodes (closed under parents and earlier siblings); none
            selected is a plain step.
        """
        return self.trees.select(self, key, tree, self._max)

    def observe_tree(self, key, tree, selected, path, next_token: int, target_seconds: float):
        """Learn from one verified tree (see :meth:`TreeSelector.observe`).

        Parameters
        ----------
        key : tuple (source, evidence)
            As given to :meth:`select_tree`.
        tree : DraftTree
            The candidates.
        selected : numpy.ndarray of bool
            :meth:`select_tree`'s answer.
        path : sequence of int
            The kept nodes, root to leaf.
        next_token : int
            The token drawn after the last kept node, -1 if none was drawn.
        target_seconds : float
            Wall time of the target pass (trees are not timed against the curve).
        """
        self.trees.observe(self, key, tree, selected, path, next_token)

    def offset(self, source) -> float:
        """The log-odds offset of ``source``'s priors (0.0 until it is observed).

        Parameters
        ----------
        source : int
            A draft source, as in the keys.

        Returns
        -------
        float
            Within :attr:`OFFSET_BOUNDS`.
        """
        return self._offsets.get(source, 0.0)

    def _learn_offset(self, key, outcomes) -> None:
        """Move the source's offset towards the outcomes ``(position, kept)``."""
        source, evidence = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if evidence is None or evidence <= 0 or not outcomes or self.offset_rate == 0.0:
            return  # a source without evidence (a draft model) learns in its cells only
        low, high = self.OFFSET_BOUNDS
        evidence = min(int(evidence), self.MAX_EVIDENCE)
        theta = self._offsets.get(source, 0.0)
        for position, success in outcomes:
            shifted = _shifted(self.prior(evidence, position), math.exp(theta))
            theta = min(high, max(low, theta + self.offset_rate * (success - shifted)))
        self._offsets[source] = theta


def _shifted(prior: float, odds: float) -> float:
    """``prior`` with its odds multiplied by ``odds`` (a log-odds offset of log(odds))."""
    return prior * odds / (1.0 - prior + prior * odds)
