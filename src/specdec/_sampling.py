"""Plain sampling through the decoder's kernels: the baseline of every speedup.

:func:`sample` and :func:`sample_stream` check their arguments as
:class:`~specdec.SpeculativeDecoder` does and run :func:`specdec._loop.sample_plainly`,
one target pass per token, through the same verifier.
"""

from __future__ import annotations

from specdec._calling import ModelCaller
from specdec._loop import check_declared_vocab, sample_plainly
from specdec._stats import SpeculativeDecodingStats
from specdec._streaming import Run, TokenStream, check_streamer, consume
from specdec._validation import (
    SamplingControls,
    check_eos,
    check_max_new_tokens,
    check_prompt,
    make_rng,
)
from specdec._verifier import verifier_for

__all__ = ["sample", "sample_stream"]


def sample(
    target_model,
    prompt_ids,
    max_new_tokens: int = 50,
    eos_token_id=None,
    *,
    temperature: float = 1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    seed=None,
    rng=None,
    backend=None,
    streamer=None,
):
    """Plain autoregressive sampling from the target model, through the same kernels.

    The baseline that speculative decoding is compared with: same law, same
    controls, one target pass per token.

    Parameters
    ----------
    target_model : model
        As for :meth:`SpeculativeDecoder.generate`.
    prompt_ids : sequence of int, shape (L,) or (1, L)
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
    streamer : object with ``put(ids)`` and ``end()``, optional
        As for :meth:`SpeculativeDecoder.generate`: here every pass makes one token.

    Returns
    -------
    ids : list of int
        The prompt followed by the new tokens.
    stats : SpeculativeDecodingStats
        ``num_target_forward_passes`` equals the tokens generated.
    """
    check_streamer(streamer)
    passes = _sampling_passes(
        target_model,
        prompt_ids,
        max_new_tokens,
        eos_token_id,
        (temperature, top_k, top_p, min_p),
        seed,
        rng,
        backend,
    )
    return consume(next(passes), passes, streamer)


def sample_stream(
    target_model,
    prompt_ids,
    max_new_tokens: int = 50,
    eos_token_id=None,
    *,
    temperature: float = 1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    seed=None,
    rng=None,
    backend=None,
) -> TokenStream:
    """Plain sampling's tokens as they are made: one 1-D array per target pass.

    Takes the arguments of :func:`sample`, checked at once; the stream, concatenated,
    is ``sample``'s new tokens for the same seed (:meth:`SpeculativeDecoder.stream`'s
    counterpart, for the baseline).

    Returns
    -------
    specdec.TokenStream
        Iterates over 1-D int64 arrays of one token each; ``stats`` as for
        :meth:`SpeculativeDecoder.stream`.
    """
    passes = _sampling_passes(
        target_model,
        prompt_ids,
        max_new_tokens,
        eos_token_id,
        (temperature, top_k, top_p, min_p),
        seed,
        rng,
        backend,
    )
    return TokenStream(next(passes), passes)


def _sampling_passes(
    target_model, prompt_ids, max_new_tokens, eos_token_id, controls, seed, rng, backend
):
    """Plain sampling's loop: yields the run once checked, then each new token.

    As :meth:`SpeculativeDecoder._passes`, with one target pass per token.
    """
    target = ModelCaller(target_model, "target_model")
    prompt = check_prompt(prompt_ids)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    eos = check_eos(eos_token_id)
    controls = SamplingControls.from_user(*controls)
    verifier = verifier_for(backend)
    generator = make_rng(rng, seed)
    check_declared_vocab(prompt, eos, target)

    stats = SpeculativeDecodingStats(accepted_length_histogram=[0], draft_length_histogram=[0])
    run = Run(prompt, max_new_tokens, stats)
    run.callers = (None, target)
    yield run
    run.start_clock()
    yield from sample_plainly(
        run, target=target, verifier=verifier, controls=controls, rng=generator, eos=eos
    )
