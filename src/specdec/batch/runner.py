"""One request served: :class:`RequestRunner` turns a :class:`BatchRequest` into its record.

Every way of running a batch (in the calling process, in worker processes, in Ray
actors) builds one runner per worker, from its factory, and calls :meth:`RequestRunner.run`
per request; so a request's record depends only on the request, the options and the
models, never on where or after what it ran (unless ``stateful``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import specdec
from specdec.batch.models import BatchModels
from specdec.batch.records import derived_seed, error_record, result_record
from specdec.batch.requests import BatchRequest, RequestError
from specdec.drafters import Drafter
from specdec.drafters.cost import DEFAULT_COST_CURVE, CostCurve
from specdec.drafters.positional import PositionalDraftLength

__all__ = ["BatchOptions", "RequestRunner"]


@dataclass(frozen=True)
class BatchOptions:
    """What applies to every request of a batch (a body's own values come first).

    Parameters
    ----------
    max_tokens : int, default 256
        Tokens per request when the body does not say.
    temperature : float, default 0.0
        When the body does not say (0: greedy).
    top_k, top_p, min_p : optional
        When the body does not say.
    seed : int, default 0
        The run's seed: a request without ``body.seed`` gets one derived from it and
        its ``custom_id`` (:func:`~specdec.batch.requests.derived_seed`).
    gamma : int, optional
        The most draft tokens per target pass; None, as for
        :class:`~specdec.SpeculativeDecoder`: the drafter's own ``num_tokens``, 4 with a
        draft model.
    stateful : bool, default False
        Carry drafting state between the requests a worker serves: the draft-length
        policy keeps learning, a ``SuffixDrafter`` remembers earlier outputs, and the
        target's measured cost curve steers the draft length.  Faster on repetitive
        work, but a sampled request's output then depends on what its worker served
        before it.  False (the default) gives every request fresh state and a fixed
        cost curve, so outputs are the same for any number of workers, order or resume.
    backend : {"cython", "python"}, optional
        Kernel backend.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int = 0
    gamma: int | None = None
    stateful: bool = False
    backend: str | None = None


class RequestRunner:
    """Serve requests with one set of models.

    Parameters
    ----------
    models : BatchModels
        Built once by the worker's factory.
    options : BatchOptions
    """

    def __init__(self, models: BatchModels, options: BatchOptions):
        if not isinstance(models, BatchModels):
            raise TypeError(
                f"a batch model factory must return BatchModels, got {type(models).__name__}"
            )
        self.models, self.options = models, options
        self._decoder = None  # kept between requests when stateful

    def _controls(self, request: BatchRequest) -> dict:
        options = self.options
        given = lambda name: getattr(request, name)  # noqa: E731
        return {
            name: getattr(options, name) if given(name) is None else given(name)
            for name in ("temperature", "top_k", "top_p", "min_p")
        }

    def _decoder_for(self, controls: dict):
        options, draft = self.options, self.models.draft
        if options.stateful:
            if self._decoder is None:
                self._decoder = specdec.SpeculativeDecoder(options.gamma, backend=options.backend)
            for name, value in controls.items():
                setattr(self._decoder, name, value)
            return self._decoder
        if hasattr(draft, "reset") and isinstance(draft, Drafter):
            draft.reset()  # forget earlier outputs (SuffixDrafter's global tree)
        # A fixed cost curve and a fresh policy: the draft lengths, hence the random
        # stream, depend on this request alone (a measured curve differs per worker).
        policy = (
            PositionalDraftLength(target_cost=CostCurve(DEFAULT_COST_CURVE))
            if isinstance(draft, Drafter)
            else "auto"
        )
        return specdec.SpeculativeDecoder(
            options.gamma, backend=options.backend, draft_length=policy, **controls
        )

    def _prompt(self, request: BatchRequest) -> list:
        models = self.models
        if request.is_chat:
            if models.encode_chat is None:
                raise RequestError(f"the model {models.name} has no chat template")
            try:
                return list(models.encode_chat(request.messages))
            except (ValueError, TypeError, ImportError) as error:
                raise RequestError(f"the chat template failed: {error}") from None
        if isinstance(request.prompt, list):
            return list(request.prompt)
        return list(models.encode(request.prompt))

    def run(self, request: BatchRequest) -> dict:
        """Serve one request; its record (status 400 or 500 with a message on failure).

        Parameters
        ----------
        request : BatchRequest

        Returns
        -------
        dict
            The OpenAI Batch output record.
        """
        try:
            return self._serve(request)
        except _ServingFailure as failure:  # the request was valid; serving it failed
            error = failure.__cause__
            message = f"line {request.line}: {type(error).__name__}: {error}"
            return error_record(request.custom_id, request.custom_id, message, 500)
        except (RequestError, ValueError, TypeError) as error:
            message = f"line {request.line}: {error}"
            return error_record(request.custom_id, request.custom_id, message)
        except MemoryError:
            message = f"line {request.line}: out of memory"
            return error_record(request.custom_id, request.custom_id, message, 500)
        except Exception as error:  # a model that fails: this request's 500, not the batch's
            message = f"line {request.line}: {type(error).__name__}: {error}"
            return error_record(request.custom_id, request.custom_id, message, 500)

    def _serve(self, request: BatchRequest) -> dict:
        models, options = self.models, self.options
        prompt = self._prompt(request)
        max_tokens = request.max_tokens or options.max_tokens
        if models.context is not None and len(prompt) + max_tokens > models.context:
            raise RequestError(
                f"the prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) exceed the "
                f"context of {models.context} tokens"
            )
        vocab = getattr(models.target, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"body.prompt holds token ids outside [0, {vocab})")
        controls = self._controls(request)
        seed = request.seed if request.seed is not None else derived_seed(
            options.seed, request.custom_id
        )  # fmt: skip
        stops = [int(t) for t in models.stop_ids if t is not None]
        eos = stops[0] if stops else None
        if not options.stateful and hasattr(models.target, "reset"):
            models.target.reset()  # the same numbers whatever ran before (no cached prefix)
        if models.draft is None:
            tokens = specdec.sample_stream(
                models.target, prompt, max_tokens, eos, **controls, seed=seed,
                backend=options.backend,
            )  # fmt: skip
        else:
            decoder = self._decoder_for(controls)
            rng = np.random.default_rng(seed)
            tokens = decoder.stream(models.draft, models.target, prompt, max_tokens, eos, rng=rng)
        # The arguments were checked when the stream was made: what fails from here on
        # is the model or its tokenizer, not the request (a 500, even for a ValueError).
        try:
            new, finish = _until_stop(tokens, stops, request.stop, models.detokenize)
            text = models.detokenize([t for t in new if t not in stops])
        except MemoryError:
            raise
        except Exception as error:
            raise _ServingFailure() from error
        if request.stop:
            text = _cut_at_stop(text, request.stop)
        stats = tokens.stats
        statistics = {
            "seed": seed,
            "target_passes": stats.num_target_forward_passes,
            "tokens_per_target_pass": round(stats.tokens_per_step, 4),
            "drafted": stats.total_draft_tokens_proposed,
            "drafts_kept": stats.total_draft_tokens_accepted,
        }
        return result_record(
            request,
            model=models.name,
            text=text,
            finish_reason=finish,
            prompt_tokens=len(prompt),
            completion_tokens=len(new),
            specdec=statistics,
        )


class _ServingFailure(Exception):
    """A valid request whose model failed while serving it (the cause is the error)."""


def _cut_at_stop(text: str, stop_strings) -> str:
    cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
    return text if cut < 0 else text[:cut]


def _until_stop(tokens, stop_ids, stop_strings, detokenize) -> tuple[list, str]:
    """Run a token stream to a stop id, a stop string or its end; ``(ids, finish_reason)``.

    The ids end with the stop id, or with the token that completed a stop string.
    """
    new: list = []
    for piece in tokens:
        start = len(new)
        new.extend(int(t) for t in piece)
        for i in range(start, len(new)):
            if new[i] in stop_ids:
                del new[i + 1 :]
                tokens.close()
                return new, "stop"
        if stop_strings and any(s in detokenize(new) for s in stop_strings):
            # the first token of this pass after which the text holds a stop string
            end = next(
                k for k in range(start + 1, len(new) + 1)
                if any(s in detokenize(new[:k]) for s in stop_strings)
            )  # fmt: skip
            del new[end:]
            tokens.close()
            return new, "stop"
    return new, "length"
