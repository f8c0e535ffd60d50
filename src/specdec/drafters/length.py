"""How many tokens to draft per step: fixed, adaptive, or Hugging Face's heuristic.

A draft pays only when its expected kept tokens outweigh what it adds to the target
pass.  On a CPU the target's cost grows with the tokens it evaluates (SmolLM2 in
llama.cpp: 2 tokens cost 1.9x one token, 9 tokens about 4x), so a mostly rejected draft
makes every step cost several tokens for one.  :class:`AdaptiveDraftLength` weighs the
two with what it has measured: the acceptance of each draft source and the target's
cost per evaluated token, and drafts nothing when nothing pays.

A policy sees only what is known before the target pass (the proposal's length, the
outcomes and timings of earlier steps), so it never changes the output law: any draft
length is verified exactly.

The decoder calls a policy in this order::

    policy.start(max_tokens, target_cost)          # once per generate call
    n = policy.length(key, offered)                # per step, before the target pass
    policy.observe(key, n, kept, target_seconds, shadow)   # after it

``key`` names the draft source: ``(index in the Chain, strength of evidence)``, the
latter being a drafter's ``last_match_size`` when it has one (else None).
"""

from __future__ import annotations

import math

from specdec._validation import _is_int, _is_real

__all__ = ["DEFAULT_TARGET_COST", "AdaptiveDraftLength", "DraftLengthPolicy",
           "FixedDraftLength", "HeuristicDraftLength"]


class DraftLengthPolicy:
    """Interface of a draft-length policy (the methods the decoder calls).

    ``source`` is a hashable key of the draft source that made the proposal: its place
    in a :class:`~specdec.drafters.Chain` (0 for a lone drafter or model) and the
    strength of its evidence, so that a policy can learn each one's acceptance.
    """

    #: Draft-model drafting stops at a token whose top probability is below this.
    p_min: float = 0.0

    def start(self, max_tokens: int, target_cost=None) -> None:
        """Begin a generate call whose drafts hold at most ``max_tokens`` tokens.

        Parameters
        ----------
        max_tokens : int
            The decoder's ``gamma``.
        target_cost : (overhead, per_token), optional
            The target model's ``speculation_cost`` hint, if it has one.
        """

    def length(self, source: int, offered: int) -> int:
        """Tokens to verify out of a proposal of ``offered`` tokens.

        Parameters
        ----------
        source : int
            Index of the proposing source.
        offered : int
            Length of the proposal (for a draft model: the most it may draft).

        Returns
        -------
        int
            A length in ``[0, offered]``.
        """
        raise NotImplementedError

    def observe(self, source: int, drafted: int, kept: int, target_seconds: float,
                shadow: bool | None) -> None:
        """Learn from one step.

        Parameters
        ----------
        source : int
            Index of the source whose draft was verified.
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


class FixedDraftLength(DraftLengthPolicy):
    """Always the most tokens allowed: the reference loop's ``gamma`` per step."""

    def __init__(self) -> None:
        self._max = 1

    def start(self, max_tokens: int, target_cost=None) -> None:  # noqa: D102
        self._max = max_tokens

    def length(self, source: int, offered: int) -> int:  # noqa: D102
        return min(offered, self._max)

    def __repr__(self) -> str:
        return "FixedDraftLength()"


class HeuristicDraftLength(DraftLengthPolicy):
    """Hugging Face's ``num_assistant_tokens_schedule="heuristic"``: +2 after a fully
    kept draft, -1 otherwise (never below 1).  A baseline to compare with.

    Parameters
    ----------
    initial : int, default 5
        The first draft length (Hugging Face's ``num_assistant_tokens``).
    """

    def __init__(self, initial: int = 5) -> None:
        if not _is_int(initial) or initial < 1:
            raise ValueError(f"initial must be an int >= 1, got {initial!r}")
        self.initial = int(initial)
        self._current = self.initial
        self._max = self.initial

    def start(self, max_tokens: int, target_cost=None) -> None:  # noqa: D102
        self._max = max_tokens
        self._current = min(self.initial, max_tokens)

    def length(self, source: int, offered: int) -> int:  # noqa: D102
        return min(offered, self._current)

    def observe(self, source, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        if drafted == 0:
            return
        step = 2 if kept == drafted else -1
        self._current = min(self._max, max(1, self._current + step))

    def __repr__(self) -> str:
        return f"HeuristicDraftLength(initial={self.initial})"


#: The default cost of a target pass over n drafts plus one token, relative to one token:
#: ``1 + overhead + per_token * n`` for n >= 1.  Measured here for a 135M-parameter model
#: in llama.cpp on a CPU (2 tokens cost 1.9x one token, 9 tokens about 4.2x).
DEFAULT_TARGET_COST = (0.57, 0.33)


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

    The cost of a target pass over n drafts is ``1 + overhead + per_token * n`` times
    one token (n >= 1).  By default it is the target model's own
    ``speculation_cost`` attribute when it has one (specdec's adapters do), else
    :data:`DEFAULT_TARGET_COST`: decisions then depend on tokens only, so a seeded
    run is reproducible.  ``target_cost="measured"`` fits it to the timed passes
    instead (adapts to any hardware, but runs with one seed may then differ).

    Parameters
    ----------
    min_tokens : int, default 0
        Draft at least this many tokens when a proposal offers them.
    p_min : float in [0, 1), default 0.0
        A draft model stops drafting at a token whose top probability is below this
        (llama.cpp's ``--draft-p-min``, Hugging Face's
        ``assistant_confidence_threshold``); 0 never stops.
    target_cost : None, "measured" or (overhead, per_token)
        The cost model of a target pass, see above.
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

    def __init__(self, min_tokens: int = 0, p_min: float = 0.0, *, target_cost=None,
                 draft_cost: float = 0.0, prior_acceptance: float = 0.5,
                 memory: float = 0.98) -> None:
        if not _is_int(min_tokens) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
        for name, value in (("p_min", p_min), ("prior_acceptance", prior_acceptance),
                            ("memory", memory)):
            open_low = name != "p_min"
            if not _is_real(value) or not (0.0 < value < 1.0 if open_low else 0.0 <= value < 1.0):
                bounds = "(0, 1)" if open_low else "[0, 1)"
                raise ValueError(f"{name} must be a number in {bounds}, got {value!r}")
        if not _is_real(draft_cost) or not 0.0 <= draft_cost < math.inf:
            raise ValueError(f"draft_cost must be a finite number >= 0, got {draft_cost!r}")
        self.min_tokens = int(min_tokens)
        self.p_min = float(p_min)
        self.target_cost = _check_cost(target_cost, "target_cost")
        self.draft_cost = float(draft_cost)
        self.prior_acceptance = float(prior_acceptance)
        self.memory = float(memory)
        self._max = 1
        self._cost = DEFAULT_TARGET_COST
        self._accept: dict = {}  # key -> [kept, tested]
        self._times: dict = {}  # drafts n -> [weight, mean seconds], for "measured"
        self._idle: dict = {}  # key -> proposals since the last observation

    def __repr__(self) -> str:
        return (f"AdaptiveDraftLength(min_tokens={self.min_tokens}, p_min={self.p_min}, "
                f"target_cost={self.target_cost!r}, draft_cost={self.draft_cost}, "
                f"prior_acceptance={self.prior_acceptance}, memory={self.memory})")

    def start(self, max_tokens: int, target_cost=None) -> None:
        """Begin a generate call (see :class:`DraftLengthPolicy`).

        Parameters
        ----------
        max_tokens : int
            The decoder's ``gamma``.
        target_cost : (overhead, per_token), optional
            The target model's ``speculation_cost``, used unless ``target_cost`` was
            given to the constructor.
        """
        self._max = max_tokens
        if isinstance(self.target_cost, tuple):
            self._cost = self.target_cost
        elif target_cost is not None:
            self._cost = _check_cost(target_cost, "the target model's speculation_cost")
        else:
            self._cost = DEFAULT_TARGET_COST

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
        kept, tested = self._accept.get(key, (0.0, 0.0))
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
        overhead, per_token = self._cost
        if self.target_cost == "measured" and 0 in self._times and n in self._times:
            return self._times[n][1] / self._times[0][1]
        return 1.0 if n == 0 else 1.0 + overhead + per_token * n

    def length(self, source, offered: int) -> int:  # noqa: D102
        offered = min(offered, self._max)
        if offered <= 0:
            return 0
        a = self.acceptance(source)
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
            idle = self._idle.get(source, 0) + 1
            self._idle[source] = idle
            if idle >= self.PROBE_EVERY:
                best_n = 1
        return best_n

    def observe(self, source, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        tested = kept + (1 if kept < drafted else 0)
        successes = kept
        if shadow is not None:
            tested += 1
            successes += int(shadow)
        if tested:
            self._idle[source] = 0
            kept_sum, tested_sum = self._accept.get(source, (0.0, 0.0))
            m = self.memory ** tested
            self._accept[source] = [kept_sum * m + successes, tested_sum * m + tested]
        if self.target_cost == "measured" and target_seconds > 0.0:
            weight, mean = self._times.get(drafted, (0.0, 0.0))
            weight = weight * self.memory + 1.0
            self._times[drafted] = [weight, mean + (target_seconds - mean) / weight]


def _check_cost(value, name: str):
    if value is None or value == "measured":
        return value
    try:
        overhead, per_token = value
        valid = all(_is_real(v) and 0.0 <= v < math.inf for v in (overhead, per_token))
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError(f"{name} must be None, 'measured' or a pair (overhead, per_token) "
                         f"of finite numbers >= 0, got {value!r}")
    return (float(overhead), float(per_token))
