"""How many tokens to draft per step: the policies' contract, and the fixed length.

A draft pays only when its expected kept tokens outweigh what it adds to the target
pass.  On a CPU the target's cost grows with the tokens it evaluates (SmolLM2 in
llama.cpp with one batch thread: 2 tokens cost 1.9x one token, 9 tokens about 4x), so a
mostly rejected draft makes every step cost several tokens for one, while a copied
passage pays for drafts of ten tokens and more.
:class:`~specdec.drafters.PositionalDraftLength` (``drafters/positional.py``, the
default for drafters) weighs the two with the target's cost curve
(:mod:`specdec.drafters.cost`) and an acceptance model per draft source, strength of
evidence and position within the draft; it drafts nothing when nothing pays.
:class:`FixedDraftLength` drafts the most allowed, as the reference loop does.

A policy sees only what is known before the target pass (the proposal's length and
evidence, the outcomes and timings of earlier steps), so it never changes the output
law: any draft length is verified exactly.

The contract: the decoder calls a policy in this order::

    policy.start(max_tokens, target_cost)                  # once per generate call
    n = policy.length(key, offered)                        # per step, before the pass
    policy.observe(key, n, kept, target_seconds, shadow)   # after it

``key`` is a pair ``(source, evidence)``: ``source`` the index of the proposing
source in the :class:`~specdec.drafters.Chain` (0 for a lone drafter or model) and
``evidence`` that drafter's ``last_match_size`` after its proposal (the length of
the context match it rests on), or None when it has none (a draft model, a drafter
without the attribute).  ``target_cost`` is the target's :class:`CostCurve` (read
lazily: a policy that never asks never triggers an adapter's calibration).

What a policy learns lives on the policy object.  With ``draft_length="auto"`` or
``"adaptive"`` a :class:`~specdec.SpeculativeDecoder` keeps one policy per decoder,
so what it learnt carries over from one ``generate`` call to the next (the calls of
one decoder are usually requests of one workload); ``decoder.reset()`` or
``policy.reset()`` forgets it.  Given the same seed, cost curve and history of calls,
a run is reproducible (a curve an adapter measured is corrected from the run's timed
passes when they disagree with it, see :class:`~specdec.drafters.cost.CurveCheck`).
"""

from __future__ import annotations

from typing import NamedTuple

from specdec.drafters._threads import PerThread, SharedState
from specdec.drafters.cost import DEFAULT_COST_CURVE, CostCurve

__all__ = ["DraftLengthPolicy", "FixedDraftLength", "Tally"]


class Tally(NamedTuple):
    """Observations of one acceptance estimate, the older ones faded by a memory factor.

    Attributes
    ----------
    kept : float
        Weight of the tokens kept.
    tested : float
        Weight of the tokens tested (kept or rejected).
    """

    kept: float = 0.0
    tested: float = 0.0

    def add(self, kept: float, tested: float, fade: float) -> Tally:
        """The tally faded by ``fade``, plus ``kept`` of ``tested`` new observations."""
        return Tally(self.kept * fade + kept, self.tested * fade + tested)


#: No observation yet.
NO_TALLY = Tally()


def shortest_near_best(rates, best: tuple, tolerance: float) -> tuple:
    """The first ``(n, rate)`` of *rates* (shortest first) within *tolerance* of *best*'s rate.

    The rule of a policy's ``tie_tolerance``, for chains and trees alike; *best*
    itself when no earlier pair comes that close.
    """
    tied = best[1] * (1.0 - tolerance)
    return next((pair for pair in rates if pair[1] >= tied), best)


class DraftLengthPolicy(SharedState):
    """Interface of a draft-length policy (the methods the decoder calls).

    See the module docstring for the order of the calls and the meaning of ``key``.
    A policy decides a draft's length, ``n_draft``, out of what is on offer: a
    drafter's proposal is known whole before the target pass, so :meth:`length` cuts
    it; a draft model's tokens are sampled one at a time, so :meth:`length` gives the
    most to sample and :attr:`p_min` may stop earlier, at a token the draft model is
    unsure of (the one part of the decision that needs the draft's own rows).

    Attributes
    ----------
    p_min : float
        A draft model's drafting stops before a token whose row's top probability is
        below this (0: never; ignored at temperature 0 and for drafters).
    """

    p_min: float = 0.0

    # A run's settings, so the calling thread's: one policy may serve several threads'
    # runs at once (see drafters/_threads.py); what it learns is shared.
    _max = PerThread(lambda: 1)
    _cost = PerThread(lambda: CostCurve(DEFAULT_COST_CURVE))

    def start(self, max_tokens: int, target_cost=None) -> None:
        """Begin a generate call whose drafts hold at most ``max_tokens`` tokens.

        Parameters
        ----------
        max_tokens : int
            The most draft tokens per step in this call (the decoder's ``gamma``, or a
            drafter's own ``num_tokens`` when ``gamma`` was not set).
        target_cost : CostCurve, optional
            The target model's cost curve (read lazily when first used).
        """

    def length(self, key, offered: int) -> int:
        """Tokens to verify out of a proposal of ``offered`` tokens.

        Parameters
        ----------
        key : tuple (source, evidence)
            ``source``: index of the proposing source (int); ``evidence``: its match
            length (int) or None.
        offered : int
            Length of the proposal (for a draft model: the most it may draft).

        Returns
        -------
        int
            A length in ``[0, offered]``.
        """
        raise NotImplementedError

    def observe(self, key, drafted: int, kept: int, target_seconds: float, shadow) -> None:
        """Learn from one step.

        Parameters
        ----------
        key : tuple (source, evidence)
            The key given to :meth:`length` for this step.
        drafted, kept : int
            Draft tokens verified and kept.
        target_seconds : float
            Wall time of the target pass, which evaluated ``drafted + 1`` tokens.
        shadow : bool or None
            For a deterministic proposal longer than the draft, whether its next token
            equals the token the target emitted after a fully kept draft: a free
            observation of one more acceptance (that token was drawn from the target's
            law, so it matches with the probability the draft would have been kept).
            None when there is none.
        """

    def reset(self) -> None:
        """Forget what was learnt (the default has nothing to forget)."""


class FixedDraftLength(DraftLengthPolicy):
    """Always the most tokens allowed: the reference loop's ``gamma`` per step."""

    def start(self, max_tokens: int, target_cost=None) -> None:  # noqa: D102
        self._max = max_tokens

    def length(self, key, offered: int) -> int:  # noqa: D102
        return min(offered, self._max)

    def __repr__(self) -> str:
        return "FixedDraftLength()"
