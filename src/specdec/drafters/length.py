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

    policy.start(max_tokens)                       # once per generate call
    n = policy.length(source, offered)             # per step, before the target pass
    policy.observe(source, n, kept, target_seconds, shadow)   # after it
"""

from __future__ import annotations

import math

from specdec._validation import _is_int, _is_real

__all__ = ["AdaptiveDraftLength", "DraftLengthPolicy", "FixedDraftLength",
           "HeuristicDraftLength"]


class DraftLengthPolicy:
    """Interface of a draft-length policy (the methods the decoder calls).

    ``source`` is the index of the draft source that made the proposal (its place in a
    :class:`~specdec.drafters.Chain`; 0 for a lone drafter or model), so that a policy
    can learn each source's acceptance on its own.
    """

    #: Draft-model drafting stops at a token whose top probability is below this.
    p_min: float = 0.0

    def start(self, max_tokens: int) -> None:
        """Begin a generate call whose drafts hold at most ``max_tokens`` tokens.

        Parameters
        ----------
        max_tokens : int
            The decoder's ``gamma``.
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

    def start(self, max_tokens: int) -> None:  # noqa: D102 - see DraftLengthPolicy
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

    def start(self, max_tokens: int) -> None:  # noqa: D102
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


class AdaptiveDraftLength(DraftLengthPolicy):
    """The draft length that maximises expected tokens per unit of time.

    For a draft of n tokens whose tokens are each kept with probability ``a`` (given
    the ones before were), the step emits ``1 + a + ... + a**n`` tokens in expectation
    and costs a target pass over ``n + 1`` tokens plus the drafting.  The policy
    estimates ``a`` per source (kept over tested tokens, with a prior and a slow
    forgetting, so that it follows a text that changes character) and the target's
    time as ``t(n) = t0 + t1 * n`` (a least-squares fit of its measured passes, with
    a prior shaped like a small model on a CPU), then picks the n in
    ``[min_tokens, offered]`` with the most tokens per second; ``n = 0`` (a plain
    step, one token for one pass) wins whenever no draft pays.

    Parameters
    ----------
    min_tokens : int, default 0
        Draft at least this many tokens when a proposal offers them.
    p_min : float in [0, 1), default 0.0
        A draft model stops drafting at a token whose top probability is below this
        (llama.cpp's ``--draft-p-min``, Hugging Face's
        ``assistant_confidence_threshold``); 0 never stops.
    prior_acceptance : float in (0, 1), default 0.5
        Acceptance assumed before a source has been observed.
    prior_cost_per_token : float >= 0, default 0.4
        Extra cost of one more evaluated token relative to one token, assumed before
        the target's passes have been timed (llama.cpp on a CPU: about 0.3-0.5).
    memory : float in (0, 1), default 0.98
        Weight kept by past observations at each new one (1 - memory is the forgetting).
    """

    def __init__(self, min_tokens: int = 0, p_min: float = 0.0, *,
                 prior_acceptance: float = 0.5, prior_cost_per_token: float = 0.4,
                 memory: float = 0.98) -> None:
        if not _is_int(min_tokens) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {min_tokens!r}")
        for name, value, low, high in (("p_min", p_min, 0.0, 1.0),
                                       ("prior_acceptance", prior_acceptance, 0.0, 1.0),
                                       ("memory", memory, 0.0, 1.0)):
            if not _is_real(value) or not low <= value < high or (
                    name != "p_min" and value == low):
                bounds = "[0, 1)" if name == "p_min" else "(0, 1)"
                raise ValueError(f"{name} must be a number in {bounds}, got {value!r}")
        if not _is_real(prior_cost_per_token) or not 0.0 <= prior_cost_per_token < math.inf:
            raise ValueError(
                f"prior_cost_per_token must be a finite number >= 0, got {prior_cost_per_token!r}")
        self.min_tokens = int(min_tokens)
        self.p_min = float(p_min)
        self.prior_acceptance = float(prior_acceptance)
        self.prior_cost_per_token = float(prior_cost_per_token)
        self.memory = float(memory)
        #: Seconds one draft token of a source costs; the decoder sets the draft
        #: model's measured time (deterministic drafters cost next to nothing).
        self.draft_seconds: dict[int, float] = {}
        self._max = 1
        self._accept: dict[int, list[float]] = {}  # source -> [kept, tested]
        # weighted sums for the least-squares fit of t(n) = t0 + t1 * n
        self._fit = [0.0, 0.0, 0.0, 0.0, 0.0]  # sum w, sum w n, sum w n^2, sum w t, sum w n t

    def __repr__(self) -> str:
        return (f"AdaptiveDraftLength(min_tokens={self.min_tokens}, p_min={self.p_min}, "
                f"prior_acceptance={self.prior_acceptance}, "
                f"prior_cost_per_token={self.prior_cost_per_token}, memory={self.memory})")

    def start(self, max_tokens: int) -> None:  # noqa: D102
        self._max = max_tokens

    def acceptance(self, source: int) -> float:
        """The estimated probability that a draft token of ``source`` is kept.

        Parameters
        ----------
        source : int
            Index of the draft source.

        Returns
        -------
        float
            In (0, 1).
        """
        kept, tested = self._accept.get(source, (0.0, 0.0))
        prior = 2.0  # pseudo-observations of the prior acceptance
        return (kept + prior * self.prior_acceptance) / (tested + prior)

    def target_cost(self) -> tuple[float, float]:
        """The fitted target time ``(t0, t1)``: one token, and each extra token.

        Returns
        -------
        tuple of float
            In seconds, or in units of one token before any pass was timed.
        """
        sw, sn, snn, st, snt = self._fit
        prior_t0 = st / sw if sw > 0 else 1.0
        # The prior: two pseudo-passes, of 0 and 4 drafts, shaped by prior_cost_per_token.
        w = 1.0
        points = ((0.0, prior_t0), (4.0, prior_t0 * (1.0 + 4.0 * self.prior_cost_per_token)))
        for n, t in points:
            sw, sn, snn, st, snt = sw + w, sn + w * n, snn + w * n * n, st + w * t, snt + w * n * t
        det = sw * snn - sn * sn
        t1 = (sw * snt - sn * st) / det if det > 0 else prior_t0 * self.prior_cost_per_token
        t0 = (st - t1 * sn) / sw
        t0 = max(t0, 1e-12)
        return t0, max(t1, 0.02 * t0)  # a longer pass never costs less

    def length(self, source: int, offered: int) -> int:  # noqa: D102
        offered = min(offered, self._max)
        if offered <= 0:
            return 0
        a = self.acceptance(source)
        t0, t1 = self.target_cost()
        draft_cost = self.draft_seconds.get(source, 0.0)
        best_n, best_rate = 0, -1.0
        expected, power = 1.0, 1.0
        for n in range(0, offered + 1):
            if n > 0:
                power *= a
                expected += power
            if n < self.min_tokens:
                continue
            rate = expected / (t0 + t1 * n + draft_cost * n)
            if rate > best_rate * (1.0 + 1e-9):
                best_n, best_rate = n, rate
        return best_n

    def observe(self, source, drafted, kept, target_seconds, shadow) -> None:  # noqa: D102
        kept_sum, tested_sum = self._accept.get(source, (0.0, 0.0))
        tested = kept + (1 if kept < drafted else 0)
        successes = kept
        if shadow is not None:
            tested += 1
            successes += int(shadow)
        if tested:
            m = self.memory ** tested
            self._accept[source] = [kept_sum * m + successes, tested_sum * m + tested]
        if target_seconds > 0.0:
            m = self.memory
            n = float(drafted)
            sw, sn, snn, st, snt = (value * m for value in self._fit)
            self._fit = [sw + 1.0, sn + n, snn + n * n, st + target_seconds,
                         snt + n * target_seconds]
