"""How many tokens to draft per step: per-position, adaptive, fixed or Hugging Face's.

A draft pays only when its expected kept tokens outweigh what it adds to the target
pass.  On a CPU the target's cost grows with the tokens it evaluates (SmolLM2 in
llama.cpp with one batch thread: 2 tokens cost 1.9x one token, 9 tokens about 4x), so a
mostly rejected draft makes every step cost several tokens for one, while a copied
passage pays for drafts of ten tokens and more.
:class:`~specdec.drafters.PositionalDraftLength` (``drafters/positional.py``, the
default for drafters) weighs the two with the target's cost curve
(:mod:`specdec.drafters.cost`) and an acceptance model per draft source, strength of
evidence and position within the draft; it drafts nothing when nothing pays.

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
a run is reproducible (not with ``target_cost="measured"``, which times the passes).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from specdec._validation import is_int, is_real
from specdec.drafters._threads import PerThread, SharedState
from specdec.drafters.cost import (
    DEFAULT_COST_CURVE,
    DEFAULT_TARGET_COST,
    CostCurve,
    CurveCheck,
    PassTimer,
    check_target_cost,
    chosen_cost,
)

__all__ = [
    "DEFAULT_COST_CURVE",
    "DEFAULT_TARGET_COST",
    "AdaptiveDraftLength",
    "CostCurve",
    "DraftLengthPolicy",
    "FixedDraftLength",
    "HeuristicDraftLength",
    "Tally",
]


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


class HeuristicDraftLength(DraftLengthPolicy):
    """Hugging Face's ``num_assistant_tokens_schedule="heuristic"``.

    +2 after a fully kept draft, -1 otherwise (never below 1).  A baseline to compare
    with.

    Parameters
    ----------
    initial : int, default 5
        The first draft length (Hugging Face's ``num_assistant_tokens``).
    """

    def __init__(self, initial: int = 5) -> None:
        if not is_int(initial) or initial < 1:
            raise ValueError(f"initial must be an int >= 1, got {initial!r}")
        self.initial = int(initial)

    _current = PerThread(lambda: 5)  # this thread's run's draft length

    def start(self, max_tokens: int, target_cost=None) -> None:  # noqa: D102
        self._max = max_tokens
        self._current = min(self.initial, max_tokens)

    def length(self, key, offered: int) -> int:  # noqa: D102
        return min(offered, self._current)

    def observe(self, key, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        if drafted == 0:
            return
        step = 2 if kept == drafted else -1
        self._current = min(self._max, max(1, self._current + step))

    def __repr__(self) -> str:
        return f"HeuristicDraftLength(initial={self.initial})"


class AdaptiveDraftLength(DraftLengthPolicy):
    """The draft length that maximises expected tokens per unit of time.

    For a draft of n tokens whose tokens are each kept with probability ``a`` (given
    the ones before were), a step emits ``1 + a + ... + a**n`` tokens in expectation
    and costs a target pass over ``n + 1`` tokens plus the drafting.  The policy
    estimates ``a`` per draft source and per strength of evidence (a prompt lookup's
    3-gram match predicts better than a 1-gram one): kept over tested tokens, with a
    prior and a slow forgetting, so that it follows a text that changes character.
    It then picks the n in ``[min_tokens, offered]`` with the most tokens per unit of
    cost; ``n = 0`` (a plain step, one token for one pass) wins whenever no draft pays.

    The cost of a target pass comes from the target's cost curve
    (:mod:`specdec.drafters.cost`: its ``cost_curve``, else its ``speculation_cost``,
    else :data:`DEFAULT_COST_CURVE`): decisions then depend on tokens only, so a
    seeded run is reproducible.  ``target_cost="measured"`` fits it to the timed
    passes instead (adapts to any hardware, but runs with one seed may then differ).
    :class:`PositionalDraftLength`, the default, models acceptance per position.

    Parameters
    ----------
    min_tokens : int, default 0
        Draft at least this many tokens when a proposal offers them.
    p_min : float in [0, 1), default 0.0
        A draft model stops drafting at a token whose top probability is below this
        (llama.cpp's ``--draft-p-min``, Hugging Face's
        ``assistant_confidence_threshold``); 0 never stops.
    target_cost : None, "measured", (overhead, per_token) or cost curve
        The cost model of a target pass, see above: a tuple of two numbers is a pair,
        any other 1-D sequence a curve (element i: a pass over i + 1 tokens, relative
        to one token; element 0 is 1.0).
    draft_cost : float >= 0, default 0.0
        Cost of one draft-model token relative to one target token (deterministic
        drafters cost next to nothing).
    prior_acceptance : float in (0, 1), default 0.5
        Acceptance assumed before a source has been observed.
    memory : float in (0, 1), default 0.98
        Weight kept by past observations at each new one.
    """

    #: A source not observed for this many proposals is tried with one token.
    PROBE_EVERY = 16

    def __init__(
        self,
        min_tokens: int = 0,
        p_min: float = 0.0,
        *,
        target_cost=None,
        draft_cost: float = 0.0,
        prior_acceptance: float = 0.5,
        memory: float = 0.98,
    ) -> None:
        if not is_int(min_tokens) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
        for name, value in (
            ("p_min", p_min),
            ("prior_acceptance", prior_acceptance),
            ("memory", memory),
        ):
            open_low = name != "p_min"
            if not is_real(value) or not (0.0 < value < 1.0 if open_low else 0.0 <= value < 1.0):
                bounds = "(0, 1)" if open_low else "[0, 1)"
                raise ValueError(f"{name} must be a number in {bounds}, got {value!r}")
        if not is_real(draft_cost) or not 0.0 <= draft_cost < math.inf:
            raise ValueError(f"draft_cost must be a finite number >= 0, got {draft_cost!r}")
        self.min_tokens = int(min_tokens)
        self.p_min = float(p_min)
        self.target_cost = check_target_cost(target_cost, "target_cost")
        self.draft_cost = float(draft_cost)
        self.prior_acceptance = float(prior_acceptance)
        self.memory = float(memory)
        self._accept: dict = {}  # key -> Tally
        self._timer = PassTimer(self.memory)  # for "measured"
        self._check = CurveCheck()  # the model's curve against the timed passes
        self._idle: dict = {}  # key -> proposals since the last observation

    def __repr__(self) -> str:
        return (
            f"AdaptiveDraftLength(min_tokens={self.min_tokens}, p_min={self.p_min}, "
            f"target_cost={self.target_cost!r}, draft_cost={self.draft_cost}, "
            f"prior_acceptance={self.prior_acceptance}, memory={self.memory})"
        )

    def start(self, max_tokens: int, target_cost=None) -> None:
        """Begin a generate call (see :class:`DraftLengthPolicy`).

        Parameters
        ----------
        max_tokens : int
            The most draft tokens per step.
        target_cost : CostCurve, optional
            The target model's cost curve, used unless ``target_cost`` was given to the
            constructor.
        """
        self._max = max_tokens
        self._cost = chosen_cost(self.target_cost, target_cost)

    def reset(self) -> None:
        """Forget the acceptance and the timings learnt so far."""
        self._accept.clear()
        self._idle.clear()
        self._timer = PassTimer(self.memory)
        self._check = CurveCheck()

    def acceptance(self, key) -> float:
        """The estimated probability that a draft token from ``key`` is kept.

        Parameters
        ----------
        key : hashable
            The draft source (and the strength of its evidence) given to :meth:`length`.

        Returns
        -------
        float
            In (0, 1).
        """
        kept, tested = self._accept.get(key, NO_TALLY)
        prior = 2.0  # pseudo-observations of the prior acceptance
        return (kept + prior * self.prior_acceptance) / (tested + prior)

    def cost(self, n: int) -> float:
        """Cost of a target pass over ``n`` drafts (and one more token), in one-token passes.

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
        return self._check.curve(self._cost).drafts(n)

    def length(self, key, offered: int) -> int:  # noqa: D102
        offered = min(offered, self._max)
        if offered <= 0:
            return 0
        a = self.acceptance(key)
        best_n, best_rate = 0, -1.0
        expected, power = 1.0, 1.0
        for n in range(0, offered + 1):
            if n > 0:
                power *= a
                expected += power
            if n < self.min_tokens:
                continue
            rate = expected / (self.cost(n) + self.draft_cost * n)
            if rate > best_rate * (1.0 + 1e-9):
                best_n, best_rate = n, rate
        if best_n == 0:
            # A source that is never tried is never observed (a draft model gives no
            # free observation): try one token after PROBE_EVERY idle proposals.
            idle = self._idle.get(key, 0) + 1
            self._idle[key] = idle
            if idle >= self.PROBE_EVERY or (self.target_cost is None and self._check.probe()):
                best_n = 1
        return best_n

    def observe(self, key, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        tested = kept + (1 if kept < drafted else 0)
        successes = kept
        if shadow is not None:
            tested += 1
            successes += int(shadow)
        if tested:
            self._idle[key] = 0
            tally = self._accept.get(key, NO_TALLY)
            self._accept[key] = tally.add(successes, tested, self.memory**tested)
        if self.target_cost == "measured":
            self._timer.record(drafted, target_seconds)
        elif self.target_cost is None:
            self._check.record(drafted, target_seconds)
