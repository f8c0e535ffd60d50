"""The speculative decoding loop and plain sampling, shared by both backends.

The loop is thin Python: it keeps the sequence in one preallocated int64 buffer,
hands the models read-only views of it, and calls two kernels per step
(``sample_token`` per draft token, ``verify`` per target pass) from
``specdec._core`` or its twin ``specdec._fallback``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from specdec._backend import kernels_for
from specdec._calling import ModelCaller
from specdec._common import LAW_DTYPE, InvalidLogitsError
from specdec._validation import (
    SamplingControls,
    as_generator,
    check_eos,
    check_gamma,
    check_max_new_tokens,
    check_prompt,
    check_token_range,
    check_verification,
    make_rng,
)


@dataclass
class SpeculativeDecodingStats:
    """Statistics of one generation.

    The first four fields and the two properties mean what they meant in the
    reference loop; ``total_draft_tokens_accepted`` counts the kept *prefix* of each
    draft, never a position whose test passed after a rejection.

    Attributes
    ----------
    total_tokens_generated : int
        New tokens appended (accepted drafts, residual and bonus tokens).
    total_draft_tokens_proposed : int
        Draft tokens proposed.
    total_draft_tokens_accepted : int
        Draft tokens kept.
    num_target_forward_passes : int
        Calls of the target model.
    num_draft_forward_passes : int
        Calls of the draft model.
    accepted_length_histogram : list of int
        Entry k counts the steps that kept exactly k drafts (length gamma + 1).
    draft_time, target_time, decoder_time : float
        Seconds spent in the draft model, in the target model and in specdec itself.
    """

    total_tokens_generated: int = 0
    total_draft_tokens_proposed: int = 0
    total_draft_tokens_accepted: int = 0
    num_target_forward_passes: int = 0
    num_draft_forward_passes: int = 0
    accepted_length_histogram: list = field(default_factory=list)
    draft_time: float = 0.0
    target_time: float = 0.0
    decoder_time: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed ones (0 when none was proposed)."""
        if self.total_draft_tokens_proposed == 0:
            return 0.0
        return self.total_draft_tokens_accepted / self.total_draft_tokens_proposed

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target pass (0 before the first pass)."""
        if self.num_target_forward_passes == 0:
            return 0.0
        return self.total_tokens_generated / self.num_target_forward_passes

    @property
    def wall_time(self) -> float:
        """Seconds of the whole call: models plus decoder."""
        return self.draft_time + self.target_time + self.decoder_time


class _Run:
    """The state one call needs: the token buffer, its read-only view and the clock.

    The buffer grows geometrically up to ``len(prompt) + max_new_tokens``, so that a
    huge budget that EOS cuts short costs nothing; models see read-only views of it,
    valid for the duration of their call.
    """

    def __init__(self, prompt: np.ndarray, max_new_tokens: int):
        self.started = time.perf_counter()
        self.limit = len(prompt) + max_new_tokens
        self.length = 0
        self.tokens = np.empty(0, dtype=np.int64)
        self.ids = None
        self.reserve(min(self.limit, 2 * len(prompt) + 256))
        self.tokens[: len(prompt)] = prompt
        self.length = len(prompt)

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens (at most the limit)."""
        if capacity <= len(self.tokens):
            return
        capacity = min(self.limit, max(capacity, 2 * len(self.tokens)))
        tokens = np.empty(capacity, dtype=np.int64)
        tokens[: self.length] = self.tokens[: self.length]
        self.tokens = tokens
        view = tokens.view()
        view.flags.writeable = False  # models see the sequence but cannot change it
        self.ids = view[np.newaxis, :]

    def result(self, stats: SpeculativeDecodingStats, *callers: ModelCaller):
        elapsed = time.perf_counter() - self.started
        models = sum(caller.elapsed for caller in callers)
        stats.decoder_time = max(elapsed - models, 0.0)
        return self.tokens[: self.length].tolist(), stats


def _check_declared_vocab(prompt, eos, *callers: ModelCaller) -> None:
    """Check ids against the vocabulary the models declare, before any call."""
    declared = [caller.vocab_size for caller in callers if caller.vocab_size is not None]
    if len(declared) == 2:
        _check_same_vocab(*declared)
    if declared:
        check_token_range(prompt, eos, declared[0])


class SpeculativeDecoder:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), exact and compiled.

    A drop-in replacement for the reference loop's ``SpeculativeDecoder``: same
    constructor arguments and ``generate`` signature, same return value.  The output
    law is exactly the target model's at the given temperature (after top-k, top-p
    and min-p, which are applied identically to both models).

    Parameters
    ----------
    gamma : int, default 4
        Draft tokens proposed per target pass.
    temperature : float, default 1.0
        Sampling temperature of both models.  0 is exact greedy decoding: a draft is
        kept iff it is the target's argmax (ties to the lowest id) and no random
        number is drawn.
    seed : int or numpy.random.Generator, optional
        Seeds a generator that this decoder's ``generate`` calls share (so a new
        decoder with the same seed repeats the same sequence of runs).
    top_k : int, optional
        Keep the ``top_k`` most likely tokens (ties at the boundary are kept).
    top_p : float in (0, 1], optional
        Keep the smallest set of most likely tokens holding ``top_p`` of the mass.
    min_p : float in [0, 1), optional
        Keep tokens at least ``min_p`` times as likely as the most likely one.
    verification : {"block", "token"}, default "block"
        How a draft is verified.  ``"block"``: block verification (Sun et al.,
        "Block Verification Accelerates Speculative Decoding", ICLR 2025), which
        judges the draft jointly and keeps at least as many tokens in expectation.
        ``"token"``: token by token (Leviathan et al. 2023), the reference loop's
        decisions.  Both are exact (the output law is the target's) and identical
        under greedy decoding.
    backend : {"cython", "python"}, optional
        Kernel backend; default :data:`specdec.BACKEND`.

    Examples
    --------
    >>> decoder = SpeculativeDecoder(gamma=4, temperature=0.8, seed=0)
    >>> ids, stats = decoder.generate(draft, target, [1, 2, 3], max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(self, gamma: int = 4, temperature: float = 1.0, *, seed=None, top_k=None,
                 top_p=None, min_p=None, verification="block", backend=None):
        self.gamma = check_gamma(gamma)
        self.verification = check_verification(verification)
        self._controls = SamplingControls.from_user(temperature, top_k, top_p, min_p)
        self.temperature = temperature
        self.top_k, self.top_p, self.min_p = top_k, top_p, min_p
        self._kernels = kernels_for(backend)
        self.backend = "python" if self._kernels.__name__.endswith("_fallback") else "cython"
        self._rng = None if seed is None else as_generator(seed, "seed")

    def __repr__(self) -> str:
        controls = "".join(
            f", {name}={value!r}"
            for name, value in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p))
            if value is not None
        )
        return (f"SpeculativeDecoder(gamma={self.gamma}, temperature={self.temperature!r}"
                f"{controls}, verification={self.verification!r}, backend={self.backend!r})")

    def generate(self, draft_model, target_model, prompt_ids, max_new_tokens: int = 50,
                 eos_token_id=None, *, rng=None):
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Parameters
        ----------
        draft_model, target_model : model
            Objects with ``forward(ids[1, L]) -> logits[1, L, V]`` (or such callables);
            both must share the vocabulary.  A ``forward`` that accepts
            ``logits_to_keep`` is asked for the trailing rows only.
        prompt_ids : sequence of int
            Non-empty prompt.
        max_new_tokens : int, default 50
            Upper bound on new tokens; 0 returns the prompt.
        eos_token_id : int, optional
            Stop after this token is generated.
        rng : numpy.random.Generator or int, optional
            Randomness of this call; default: the decoder's ``seed`` generator, else a
            seed drawn from NumPy's global state (``np.random.seed`` reproduces runs).

        Returns
        -------
        ids : list of int
            The prompt followed by the new tokens.
        stats : SpeculativeDecodingStats
            Counts and timings of the call.
        """
        draft = ModelCaller(draft_model, "draft_model")
        target = ModelCaller(target_model, "target_model")
        prompt = check_prompt(prompt_ids)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        eos = check_eos(eos_token_id)
        generator = make_rng(rng) if rng is not None or self._rng is None else self._rng
        _check_declared_vocab(prompt, eos, draft, target)

        run = _Run(prompt, max_new_tokens)
        stats = SpeculativeDecodingStats(accepted_length_histogram=[0] * (self.gamma + 1))
        kernels, controls = self._kernels, self._controls
        block = self.verification == "block"
        # Per draft token: its law and its weights (q = weights / law["total"]), kept for
        # verify, so the draft's output array itself is never held on to.
        draft_weights = laws = work = None
        gamma = min(self.gamma, max_new_tokens)
        while run.length < run.limit:
            start = run.length
            run.reserve(start + gamma + 1)
            n_draft = 0
            while n_draft < gamma and start + n_draft < run.limit:
                position = start + n_draft
                row = draft.last_rows(run.ids[:, :position], 1)[0]
                if work is None:  # first call: the vocabulary and the dtype are known
                    check_token_range(prompt, eos, draft.vocab_size)
                    work = kernels.Workspace(draft.vocab_size)
                    laws = np.zeros(gamma, LAW_DTYPE)
                    draft_weights = np.empty((gamma, draft.vocab_size), dtype=row.dtype)
                try:
                    token = kernels.sample_token(row, controls, generator,
                                                 laws[n_draft:n_draft + 1],
                                                 draft_weights[n_draft], work)
                except InvalidLogitsError as error:
                    raise draft.invalid_logits(error, position - 1) from None
                run.tokens[position] = token
                n_draft += 1
                if token == eos:
                    break

            rows = target.last_rows(run.ids[:, :start + n_draft], n_draft + 1)
            if target.calls == 1:
                _check_same_vocab(draft.vocab_size, target.vocab_size)
            drafted = run.tokens[start:start + n_draft]
            bonus = drafted[-1] != eos and start + n_draft < run.limit
            try:
                n_accepted, token = kernels.verify(rows, drafted, draft_weights, laws, bonus,
                                                   controls, generator, work, block)
            except InvalidLogitsError as error:
                raise target.invalid_logits(error, start - 1) from None
            new = n_accepted
            if token >= 0:
                run.tokens[start + n_accepted] = token
                new += 1
            run.length = start + new

            stats.total_draft_tokens_proposed += n_draft
            stats.total_draft_tokens_accepted += n_accepted
            stats.total_tokens_generated += new
            stats.num_target_forward_passes += 1
            stats.accepted_length_histogram[n_accepted] += 1
            if eos is not None and run.tokens[run.length - 1] == eos:
                break

        stats.num_draft_forward_passes = draft.calls
        stats.draft_time, stats.target_time = draft.elapsed, target.elapsed
        return run.result(stats, draft, target)


def _check_same_vocab(draft_size: int, target_size: int) -> None:
    if draft_size != target_size:
        raise ValueError(
            f"draft_model and target_model disagree on the vocabulary: the draft has "
            f"{draft_size} tokens, the target {target_size}"
        )


def sample(target_model, prompt_ids, max_new_tokens: int = 50, eos_token_id=None, *,
           temperature: float = 1.0, top_k=None, top_p=None, min_p=None, seed=None,
           rng=None, backend=None):
    """Plain autoregressive sampling from the target model, through the same kernels.

    The baseline that speculative decoding is compared with: same law, same
    controls, one target pass per token.

    Parameters
    ----------
    target_model : model
        As for :meth:`SpeculativeDecoder.generate`.
    prompt_ids : sequence of int
        Non-empty prompt.
    max_new_tokens : int, default 50
        Upper bound on new tokens.
    eos_token_id : int, optional
        Stop after this token.
    temperature, top_k, top_p, min_p
        Sampling controls, as for :class:`SpeculativeDecoder`.
    seed : int, optional
        Seed of this call's generator (ignored when ``rng`` is given).
    rng : numpy.random.Generator or int, optional
        Randomness of this call; default: ``seed``, else a seed from NumPy's global state.
    backend : {"cython", "python"}, optional
        Kernel backend.

    Returns
    -------
    ids : list of int
        The prompt followed by the new tokens.
    stats : SpeculativeDecodingStats
        ``num_target_forward_passes`` equals the tokens generated.
    """
    target = ModelCaller(target_model, "target_model")
    prompt = check_prompt(prompt_ids)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    eos = check_eos(eos_token_id)
    controls = SamplingControls.from_user(temperature, top_k, top_p, min_p)
    kernels = kernels_for(backend)
    generator = make_rng(rng, seed)
    _check_declared_vocab(prompt, eos, target)

    run = _Run(prompt, max_new_tokens)
    stats = SpeculativeDecodingStats(accepted_length_histogram=[0])
    law = np.zeros(1, LAW_DTYPE)
    weights = work = None
    while run.length < run.limit:
        run.reserve(run.length + 1)
        row = target.last_rows(run.ids[:, :run.length], 1)[0]
        if work is None:
            check_token_range(prompt, eos, target.vocab_size)
            work = kernels.Workspace(target.vocab_size)
            weights = np.empty(target.vocab_size, dtype=row.dtype)
        try:
            token = kernels.sample_token(row, controls, generator, law, weights, work)
        except InvalidLogitsError as error:
            raise target.invalid_logits(error, run.length - 1) from None
        run.tokens[run.length] = token
        run.length += 1
        stats.total_tokens_generated += 1
        stats.num_target_forward_passes += 1
        stats.accepted_length_histogram[0] += 1
        if token == eos:
            break
    stats.target_time = target.elapsed
    return run.result(stats, target)
