"""The speculative decoder: the public calls, their checks and the live settings.

:class:`SpeculativeDecoder` holds the validated, live settings (as the reference's
attributes are) and the draft-length policy it keeps across calls; each call checks
its arguments, builds a :class:`~specdec._streaming.Run` and runs the loop of
:mod:`specdec._loop` on it, through the backend's :class:`~specdec._verifier.Verifier`.
Plain sampling, the baseline, is :mod:`specdec._sampling`.
"""

from __future__ import annotations

from specdec._calling import ModelCaller
from specdec._loop import Plan, check_declared_vocab, speculate
from specdec._stats import SpeculativeDecodingStats
from specdec._streaming import Run, TokenStream, chat, check_streamer, consume
from specdec._validation import (
    SamplingControls,
    as_generator,
    check_eos,
    check_gamma,
    check_max_new_tokens,
    check_prompt,
    check_verification,
    is_int,
    make_rng,
)
from specdec._verifier import verifier_for
from specdec.drafters.chain import Chain
from specdec.drafters.cost import CostCurve
from specdec.drafters.length import DraftLengthPolicy, FixedDraftLength
from specdec.drafters.positional import PositionalDraftLength

DRAFT_LENGTHS = ("auto", "fixed", "adaptive")


#: The most draft tokens per step of a draft model when ``gamma`` is not set (the
#: reference loop's default).
DEFAULT_GAMMA = 4


#: Candidates per tree of drafts when the target scores trees but does not say how wide.
DEFAULT_TREE_WIDTH = 4


#: The adaptive policy's ``tie_tolerance`` while the decoder samples (temperature > 0);
#: greedy decoding takes the best ratio (0).  Sampled drafts are kept less often than
#: the priors (set from greedy copies) expect, and a draft that fails costs a whole
#: pass: near a tie the shorter length loses less.  Replayed at 0.7 on recorded SmolLM2
#: outputs with three cost curves, every prompt set ran as fast or faster (grounded
#: +0.6-3.0%, open 0-1.2%); end to end with llama.cpp on 2 cores at 0.7 (2026-12-07,
#: three processes), grounded 0.966x -> 1.003x and open 1.004x -> 1.013x the fastest
#: plain loop.  Greedy, it cost the copies 5-13% (docs/performance.md).
SAMPLING_TIE_TOLERANCE = 0.06


def _target_tree_width(target: ModelCaller, target_model) -> int:
    """The most candidates per tree of drafts the target takes: 0 (chains) if it takes none.

    Trees need a target that scores a tree in one call (``forward_tree``) and a policy
    that chooses among nodes (``select_tree``); their candidates come from the drafters
    (several continuations) or the draft model (siblings drawn from its laws, when
    sampling); a target's ``tree_width`` bounds the width (the nodes per depth).
    Checked with the other arguments, before the decoder changes anything.
    """
    if not target.scores_trees:
        return 0
    width = getattr(target_model, "tree_width", DEFAULT_TREE_WIDTH)
    if not is_int(width) or width < 1:
        raise ValueError(f"target_model.tree_width must be an int >= 1, got {width!r}")
    return int(width) if width > 1 else 0


def _check_choice(value, name: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


class SpeculativeDecoder:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), exact and compiled.

    A drop-in replacement for the reference loop's ``SpeculativeDecoder``: same
    constructor arguments and ``generate`` signature, same return value.  The output
    law is exactly the target model's at the given temperature (after top-k, top-p
    and min-p, which are applied identically to both models).

    The public attributes (``gamma``, ``temperature``, ``top_k``, ``top_p``,
    ``min_p``, ``verification``, ``draft_length``) are live, as in the reference:
    each ``generate`` reads them, and setting one checks it like the constructor.

    Parameters
    ----------
    gamma : int or None, default None
        The most draft tokens per target pass (with a fixed draft length: every pass's).
        None: the drafters' own ``num_tokens`` (``PromptLookup(num_tokens=16)`` drafts
        up to 16), and 4, the reference loop's default, for a draft model (see
        :meth:`max_draft_tokens`).
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
        under greedy decoding.  Drafters' one-hot drafts are always verified token by
        token: there block verification keeps exactly as many tokens in expectation, at
        a higher cost.
    draft_length : {"auto", "fixed", "adaptive"} or DraftLengthPolicy, default "auto"
        ``"fixed"`` drafts ``gamma`` tokens per step (the reference's rule);
        ``"adaptive"`` uses :class:`specdec.drafters.PositionalDraftLength`, which drafts
        as many as pay off under the target's cost curve, possibly none (while sampling,
        with ``tie_tolerance=0.06``: near a tie, the shorter draft); ``"auto"`` is
        adaptive for drafters and fixed for a plain draft model.  The adaptive policy is
        kept by the decoder, so what it learnt carries over between ``generate`` calls
        (see :meth:`reset`).
    backend : {"cython", "python"}, optional
        Kernel backend; default :data:`specdec.BACKEND`.

    Examples
    --------
    >>> decoder = SpeculativeDecoder(gamma=4, temperature=0.8, seed=0)
    >>> ids, stats = decoder.generate(draft, target, [1, 2, 3], max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(
        self,
        gamma: int | None = None,
        temperature: float = 1.0,
        *,
        seed=None,
        top_k=None,
        top_p=None,
        min_p=None,
        verification: str = "block",
        draft_length="auto",
        backend=None,
    ):
        SamplingControls.from_user(temperature, top_k, top_p, min_p)
        self._controls_values = {
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
        }
        self.gamma = gamma
        self.verification = verification
        self.draft_length = draft_length
        self._verifier = verifier_for(backend)
        self.backend = self._verifier.backend
        self._rng = None if seed is None else as_generator(seed, "seed")
        self._adaptive = None  # the adaptive policy, kept across generate calls
        self._adaptive_for = None  # the draft sources' names it learnt from

    def reset(self) -> None:
        """Forget what the adaptive draft-length policy learnt in earlier calls.

        With ``draft_length="auto"`` or ``"adaptive"`` the decoder keeps one
        :class:`~specdec.drafters.PositionalDraftLength`: acceptance learnt in one
        ``generate`` call informs the next (it is also forgotten when the classes of the
        draft sources change, e.g. from ``PromptLookup`` to ``SuffixDrafter``).  A policy
        passed as ``draft_length`` is the caller's: call its own ``reset()``.
        """
        self._adaptive = self._adaptive_for = None

    # --- live, validated attributes -----------------------------------------------------

    @property
    def gamma(self) -> int | None:
        """The most draft tokens per target pass; None: the draft sources' own."""
        return self._gamma

    @gamma.setter
    def gamma(self, value) -> None:
        self._gamma = None if value is None else check_gamma(value)

    def max_draft_tokens(self, draft_model) -> int:
        """The most draft tokens per step that ``generate`` allows with ``draft_model``.

        ``gamma`` when set; else the largest ``num_tokens`` of the drafters among the
        draft sources (a custom drafter without one counts as 4), and 4 for a draft
        model.

        Parameters
        ----------
        draft_model : model, Drafter or Chain
            As for :meth:`generate`.

        Returns
        -------
        int
        """
        return self._max_tokens(Chain.of(draft_model))

    def _max_tokens(self, chain: Chain) -> int:
        if self._gamma is not None:
            return self._gamma
        own = [getattr(drafter, "num_tokens", None) for drafter in chain.drafters]
        # a custom drafter may not say; a draft model gets the reference's default
        own = [n if type(n) is int and n >= 1 else DEFAULT_GAMMA for n in own]
        if chain.model is not None or not own:
            own.append(DEFAULT_GAMMA)
        return check_gamma(max(own), "a drafter's num_tokens")

    @property
    def verification(self) -> str:
        """``"block"`` or ``"token"``."""
        return self._verification

    @verification.setter
    def verification(self, value) -> None:
        self._verification = check_verification(value)

    @property
    def draft_length(self):
        """``"auto"``, ``"fixed"``, ``"adaptive"`` or a draft-length policy."""
        return self._draft_length

    @draft_length.setter
    def draft_length(self, value) -> None:
        if not isinstance(value, DraftLengthPolicy):
            _check_choice(value, "draft_length", DRAFT_LENGTHS)
        self._draft_length = value

    def _control(name: str, doc: str):
        def get(self):
            return self._controls_values[name]

        def set_(self, value):
            values = dict(self._controls_values, **{name: value})
            SamplingControls.from_user(**values)  # the constructor's checks and messages
            self._controls_values = values

        return property(get, set_, doc=doc)

    temperature = _control("temperature", "Sampling temperature; 0 is greedy decoding.")
    top_k = _control("top_k", "Top-k control, or None.")
    top_p = _control("top_p", "Top-p (nucleus) control, or None.")
    min_p = _control("min_p", "Min-p control, or None.")
    del _control

    def __repr__(self) -> str:
        controls = "".join(
            f", {name}={value!r}"
            for name, value in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p))
            if value is not None
        )
        return (
            f"SpeculativeDecoder(gamma={self.gamma}, temperature={self.temperature!r}"
            f"{controls}, verification={self.verification!r}, "
            f"draft_length={self.draft_length!r}, backend={self.backend!r})"
        )

    def draft_length_policy(self, draft_model) -> DraftLengthPolicy:
        """The draft-length policy ``generate`` would size drafts from ``draft_model`` with.

        The ``draft_length`` policy given to the constructor; else a new
        :class:`~specdec.drafters.FixedDraftLength` (``"fixed"``, and ``"auto"`` for a
        draft model); else the decoder's own
        :class:`~specdec.drafters.PositionalDraftLength`, the same object from call to
        call while the draft sources keep their classes (what it learnt carries over),
        with the decoder's sampling setting: ``tie_tolerance`` 0 at temperature 0,
        :data:`SAMPLING_TIE_TOLERANCE` above.  For other draft sources than the last
        call's, a new policy that the decoder does not keep: asking changes nothing.

        Parameters
        ----------
        draft_model : model, Drafter or Chain
            As for :meth:`generate`.

        Returns
        -------
        DraftLengthPolicy
        """
        sampling = SamplingControls.from_user(**self._controls_values).temperature > 0.0
        return self._policy(Chain.of(draft_model), sampling, keep=False)

    def _policy(self, chain: Chain, sampling: bool, keep: bool = True) -> DraftLengthPolicy:
        choice = self.draft_length
        if isinstance(choice, DraftLengthPolicy):
            return choice
        if choice == "auto":
            choice = "fixed" if not chain.drafters else "adaptive"
        if choice == "fixed":
            return FixedDraftLength()
        policy = self._adaptive
        if policy is None or self._adaptive_for != chain.names:
            policy = PositionalDraftLength()
            if keep:
                self._adaptive, self._adaptive_for = policy, list(chain.names)
        # set at every call: the temperature is live
        policy.tie_tolerance = SAMPLING_TIE_TOLERANCE if sampling else 0.0
        return policy

    # --- the loop -----------------------------------------------------------------------

    def generate(
        self,
        draft_model,
        target_model,
        prompt_ids,
        max_new_tokens: int = 50,
        eos_token_id=None,
        *,
        rng=None,
        streamer=None,
    ):
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Parameters
        ----------
        draft_model : model, Drafter or Chain
            A model with ``forward(ids[1, L]) -> logits[1, L, V]`` (or such a
            callable) sharing the target's vocabulary; or a deterministic drafter
            (:class:`specdec.drafters.Drafter`, such as ``PromptLookup``); or a
            :class:`specdec.drafters.Chain` of drafters and at most one model.
        target_model : model
            A model as above.  A ``forward`` that accepts ``logits_to_keep`` is
            asked for the trailing rows only.
        prompt_ids : sequence of int, shape (L,) or (1, L)
            Non-empty prompt.
        max_new_tokens : int, default 50
            Upper bound on new tokens; 0 returns the prompt.
        eos_token_id : int, optional
            Stop after this token is generated.
        rng : numpy.random.Generator or int, optional
            Randomness of this call; default: the decoder's ``seed`` generator, else a
            seed drawn from NumPy's global state (``np.random.seed`` reproduces runs).
        streamer : object with ``put(ids)`` and ``end()``, optional
            Hugging Face's streamer protocol (``transformers.TextStreamer`` and
            ``TextIteratorStreamer`` work as they are): ``put(prompt)`` once, then
            ``put(new)`` after every target pass with the tokens it made final (1-D
            int64 arrays, never empty), then ``end()``.

        Returns
        -------
        ids : list of int
            The prompt followed by the new tokens.
        stats : SpeculativeDecodingStats
            Counts and timings of the call.

        See Also
        --------
        stream : the same tokens, pass by pass, as an iterator.
        """
        check_streamer(streamer)
        passes = self._passes(
            draft_model, target_model, prompt_ids, max_new_tokens, eos_token_id, rng
        )
        return consume(next(passes), passes, streamer)

    def stream(
        self,
        draft_model,
        target_model,
        prompt_ids,
        max_new_tokens: int = 50,
        eos_token_id=None,
        *,
        rng=None,
    ) -> TokenStream:
        """The new tokens as they are made: an iterator of one 1-D array per target pass.

        Takes the arguments of :meth:`generate`, checked at once (before the first
        token).  Concatenated, the arrays are exactly ``generate``'s new tokens for
        the same seed; a speculative pass makes several tokens final at once.

        Returns
        -------
        specdec.TokenStream
            Iterates over 1-D int64 arrays (the prompt is not included); its
            ``stats`` holds the run's :class:`SpeculativeDecodingStats` (the counts
            so far until the stream is exhausted).  Leaving the loop early leaves the
            decoder and the models ready for the next call.

        Examples
        --------
        Text as it comes: :class:`specdec.TextStream` decodes the passes incrementally
        (decoding each array alone would split a character whose bytes span two passes).

        >>> tokens = decoder.stream(draft, target, prompt, 64)  # doctest: +SKIP
        >>> for piece in specdec.TextStream(tokens, target.detokenize):  # doctest: +SKIP
        ...     print(piece, end="", flush=True)

        The tokens themselves, one array per target pass:

        >>> for new in decoder.stream(draft, target, prompt, 64):  # doctest: +SKIP
        ...     print(new.tolist())
        """
        passes = self._passes(
            draft_model, target_model, prompt_ids, max_new_tokens, eos_token_id, rng
        )
        return TokenStream(next(passes), passes)

    def chat(
        self,
        target_model,
        messages,
        *,
        draft=None,
        max_new_tokens: int = 256,
        rng=None,
        stream: bool = False,
    ):
        """The model's reply to a chat, as text: the model's own chat template applied.

        The messages are formatted with the target's chat template (a GGUF's
        ``tokenizer.chat_template``, a Hugging Face tokenizer's), the reply is
        generated speculatively and stops at the template's end-of-turn token.

        Parameters
        ----------
        target_model : LlamaCppModel or TransformersModel
            A model adapter with a tokenizer and a chat template.
        messages : list of dict
            ``{"role": "system" | "user" | "assistant", "content": str}`` messages.
        draft : model, Drafter or Chain, optional
            As ``generate``'s ``draft_model``; default ``PromptLookup()``, which costs
            nothing and pays where the reply quotes the chat (edits, summaries, code).
        max_new_tokens : int, default 256
            Upper bound on the reply's tokens.
        rng : numpy.random.Generator or int, optional
            As for :meth:`generate`.
        stream : bool, default False
            Return a :class:`specdec.TextStream` (pieces of text as they
            are made, with ``stats``) instead of the whole reply.

        Returns
        -------
        str or TextStream

        Examples
        --------
        >>> model = LlamaCppModel(smollm2_path(), n_ctx=2048)  # doctest: +SKIP
        >>> chat = [{"role": "user", "content": "Fix the typo: 'teh cat sat'"}]
        >>> for piece in decoder.chat(model, chat, stream=True):  # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        return chat(self, target_model, messages, draft, max_new_tokens, rng, stream)

    def _passes(self, draft_model, target_model, prompt_ids, max_new_tokens, eos_token_id, rng):
        """The decoding loop: yields the run once checked, then each pass's final tokens.

        Every check runs before the first ``yield`` (no model has been called yet);
        after it, each target pass yields a read-only 1-D view of the tokens it made
        final (positions that are never written again).
        """
        chain = Chain.of(draft_model)
        # a lone draft_model must be a model: ModelCaller refuses anything else (None too)
        draft = (
            ModelCaller(chain.model, "draft_model")
            if chain.model is not None or not chain.drafters
            else None
        )
        target = ModelCaller(target_model, "target_model")
        prompt = check_prompt(prompt_ids)
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        eos = check_eos(eos_token_id)
        generator = make_rng(rng) if rng is not None or self._rng is None else self._rng
        check_declared_vocab(prompt, eos, draft, target)
        max_tokens = self._max_tokens(chain)
        model_max_tokens = DEFAULT_GAMMA if self._gamma is None else self._gamma
        controls = SamplingControls.from_user(**self._controls_values)
        target_width = _target_tree_width(target, target_model)
        # the last check passed: the decoder's own policy may be replaced now
        policy = self._policy(chain, sampling=controls.temperature > 0.0)
        plan = Plan(
            verifier=self._verifier,
            controls=controls,
            block=self.verification == "block",
            max_tokens=max_tokens,
            model_max_tokens=model_max_tokens,
            policy=policy,
            tree_width=target_width if hasattr(policy, "select_tree") else 0,
        )
        plan.policy.start(max_tokens, CostCurve.of_model(target_model))

        stats = SpeculativeDecodingStats(
            accepted_length_histogram=[0] * (max_tokens + 1),
            draft_length_histogram=[0] * (max_tokens + 1),
        )
        run = Run(prompt, max_new_tokens, stats)
        run.callers = (draft, target)
        yield run  # checked; the clock starts with the first pass
        run.start_clock()
        yield from speculate(
            run, chain=chain, draft=draft, target=target, plan=plan, rng=generator, eos=eos
        )
