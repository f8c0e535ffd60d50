"""The state of one generation, and the two ways of consuming its passes.

The decoding loops (:mod:`specdec._loop`) are generators: after each target pass
they yield the tokens that pass made final.  :func:`consume` drives one to the end,
feeding a Hugging Face-style streamer if one is given (``generate``, ``sample``);
:class:`TokenStream` hands the passes to the caller (``SpeculativeDecoder.stream``).
Either way the loop exists once.

Stopping early is safe: the model adapters' prefix caches keep only the longest common
prefix with the next call's sequence, so after a ``break``, an exception in a streamer
or Ctrl-C a *new* decoder on the same models decodes exactly as on fresh ones.  The
interrupted decoder goes on working, but it is not a clean one: it keeps its draft-length
policy's estimates and (created with ``seed=``) its random generator, which has moved on.
"""

from __future__ import annotations

import time

import numpy as np

from specdec._detokenize import IncrementalDetokenizer, check_detokenize, check_stop_ids
from specdec._stats import SpeculativeDecodingStats

__all__ = ["TextStream", "TokenStream", "chat", "check_streamer", "consume"]


class Run:
    """The state one call needs: the token buffer, its read-only view, stats and clock.

    The buffer grows geometrically up to ``len(prompt) + max_new_tokens``, so that a
    huge budget that EOS cuts short costs nothing; models see read-only views of it,
    valid for the duration of their call.  Positions below :attr:`length` are final:
    they are never written again, so a view of them (what the loop yields) stays valid.

    Parameters
    ----------
    prompt : numpy.ndarray
        The checked prompt (1-D int64).
    max_new_tokens : int
        The budget.
    stats : SpeculativeDecodingStats
        The statistics the loop records into.
    """

    def __init__(self, prompt: np.ndarray, max_new_tokens: int, stats: SpeculativeDecodingStats):
        self.prompt = prompt
        self.stats = stats
        self.callers = ()  # (draft or None, target): where the model time is read
        self.started = time.perf_counter()
        self.ended = None
        self.paused = 0.0  # seconds spent in the consumer (a streamer, a loop body)
        self.pause_started = None  # set while the loop waits at a yield
        self.limit = len(prompt) + max_new_tokens
        self.length = 0
        self.tokens = np.empty(0, dtype=np.int64)
        self.ids = None
        self.reserve(min(self.limit, 2 * len(prompt) + 256))
        self.tokens[: len(prompt)] = prompt
        self.length = len(prompt)

    def start_clock(self) -> None:
        """Start the run's clock (at the first pass: the checks are not its time)."""
        self.started = time.perf_counter()

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens (at most the limit)."""
        if capacity <= len(self.tokens):
            return
        capacity = min(self.limit, max(capacity, 2 * len(self.tokens)))
        tokens = np.empty(capacity, dtype=np.int64)
        tokens[: self.length] = self.tokens[: self.length]
        self.tokens = tokens
        # Models see the sequence but cannot change it: the view's base is a read-only
        # buffer, so not even ``ids.flags.writeable = True`` makes it writable (no copy).
        readonly = np.frombuffer(memoryview(tokens).toreadonly(), dtype=np.int64)
        self.ids = readonly[np.newaxis, :]

    def pause(self, start: int) -> np.ndarray:
        """The tokens made final since ``start``, for a loop to yield; stops the clock.

        The consumer's time, until :meth:`resume`, is not the decoder's.
        """
        self.pause_started = time.perf_counter()
        return self.ids[0, start : self.length]

    def resume(self) -> None:
        """Restart the clock after the consumer took a pass's tokens."""
        self.paused += time.perf_counter() - self.pause_started
        self.pause_started = None

    def sequence(self) -> np.ndarray:
        """The kept sequence, as a read-only 1-D view (for drafters)."""
        return self.ids[0, : self.length]

    def settle(self) -> SpeculativeDecodingStats:
        """Bring the stats' model counts and timings up to date; return them.

        The consumer's time (a streamer's ``put``, the body of a ``for`` loop over a
        stream) is no one's: it is left out of ``decoder_time``.
        """
        stats = self.stats
        draft, target = self.callers or (None, None)
        if draft is not None:
            stats.num_draft_forward_passes = draft.calls
            stats.draft_time = draft.elapsed
        if target is not None:
            stats.target_time = target.elapsed
        end = self.ended
        if end is None:
            end = time.perf_counter() if self.pause_started is None else self.pause_started
        models = stats.draft_time + stats.target_time
        stats.decoder_time = max(end - self.started - self.paused - models, 0.0)
        return stats

    def finish(self) -> None:
        """Stop the clock (the loop ended, was stopped, or raised)."""
        if self.ended is None:
            # Stopped while waiting at a yield: the run ended with its last pass.
            paused = self.pause_started
            self.ended = time.perf_counter() if paused is None else paused
            self.settle()

    def result(self):
        """``(ids, stats)``: the prompt and the new tokens as a list of int, and the stats."""
        self.finish()
        return self.tokens[: self.length].tolist(), self.stats


def check_streamer(streamer) -> None:
    """A streamer must have ``put`` and ``end`` methods (Hugging Face's protocol).

    Raises
    ------
    TypeError
        Before any work, naming what is missing.
    """
    if streamer is None:
        return
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise TypeError(
            f"streamer must have put(ids) and end() methods, like transformers.TextStreamer; "
            f"{type(streamer).__name__} lacks {' and '.join(missing)}"
        )


def consume(run: Run, passes, streamer=None):
    """Run a decoding loop to its end; return ``(ids, stats)``.

    With a streamer: ``streamer.put(prompt)`` once (1-D int64), ``streamer.put(new)``
    after every target pass with the tokens it made final (1-D int64, never empty),
    and ``streamer.end()`` once the loop has finished.  An exception raised by
    ``put`` stops the loop and propagates (``end`` is not called, as in Hugging
    Face's ``generate``); the models stay consistent for the next call.
    """
    try:
        if streamer is None:
            for _ in passes:
                pass
        else:
            streamer.put(run.prompt.copy())
            for new in passes:
                streamer.put(new)
    finally:
        run.finish()  # also when the loop or the streamer raised: the stats are final
        passes.close()
    result = run.result()
    if streamer is not None:
        streamer.end()
    return result


class TokenStream:
    """The tokens of a generation as they are made: one 1-D int64 array per target pass.

    Returned by :meth:`specdec.SpeculativeDecoder.stream`.  Each array holds the
    tokens one target pass made final, in order (never empty; the prompt is not
    included); concatenated, they are exactly the new tokens ``generate`` returns for
    the same seed.  Stopping early (``break``, :meth:`close`, an exception) leaves the
    decoder and the models ready for the next call.

    Attributes
    ----------
    stats : SpeculativeDecodingStats
        The run's statistics: final once the stream is exhausted or closed, the
        counts so far before.
    tokens : list of int
        The new tokens so far.
    """

    def __init__(self, run: Run, passes):
        self._run = run
        self._passes = passes

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        try:
            return next(self._passes)
        except BaseException:  # exhausted, or the loop raised: the stats are final
            self._run.finish()
            raise

    def close(self) -> None:
        """Stop the generation now (a ``for`` loop's ``break`` needs no close)."""
        self._passes.close()
        self._run.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    @property
    def stats(self) -> SpeculativeDecodingStats:
        """The run's statistics: the counts so far, final once the stream has ended."""
        return self._run.settle()

    @property
    def tokens(self) -> list:
        """The new tokens so far, as a list of int."""
        run = self._run
        return run.tokens[len(run.prompt) : run.length].tolist()


class TextStream:
    """The text of a generation as it is made: an iterator of ``str`` pieces.

    Wraps a :class:`TokenStream`: each pass's tokens become text as soon as it is
    final (never half a UTF-8 character), and the generation stops at the first stop
    token (the chat template's end of turn, the end of sequence), whose text is not
    included.  Returned by :meth:`specdec.SpeculativeDecoder.chat` with
    ``stream=True``.

    Parameters
    ----------
    tokens : TokenStream
        The generation.
    detokenize : callable
        ``detokenize(list of int) -> str``, such as an adapter's ``detokenize``, or
        ``-> bytes`` (UTF-8, as ``llama_cpp.Llama.detokenize``), decoded incrementally
        exactly as text is.
    stop_ids : collection of int, optional
        Tokens that end the text: ints in ``[0, 2**63)``.

    Attributes
    ----------
    text : str
        The text so far.
    ids : list of int
        The new tokens so far, without the stop token.
    stopped : bool
        Whether the text ended at a stop token (rather than at the length limit).
    stats : SpeculativeDecodingStats
        The run's statistics: they count every token the loop made final, the stop
        token included (it took a pass), and the rest of its pass if it was not the
        loop's own end-of-sequence id.
    """

    def __init__(self, tokens: TokenStream, detokenize, stop_ids=()):
        if not isinstance(tokens, TokenStream):
            raise TypeError(
                "tokens must be a specdec.TokenStream (SpeculativeDecoder.stream, "
                f"specdec.sample_stream), got {type(tokens).__name__}"
            )
        stops = check_stop_ids(stop_ids)
        self._tokens = tokens
        self._text = IncrementalDetokenizer(check_detokenize(detokenize))
        self._stop_ids = np.asarray(sorted(stops), dtype=np.int64)
        self._pieces = self._generate()
        self.ids = []
        self.stopped = False

    def _generate(self):
        text = self._text
        for new in self._tokens:
            stop = np.flatnonzero(np.isin(new, self._stop_ids)) if len(self._stop_ids) else ()
            if len(stop):
                new = new[: stop[0]]
                self.stopped = True
            self.ids += new.tolist()
            piece = text.push(new)
            if piece:
                yield piece
            if self.stopped:
                self._tokens.close()
                break
        piece = text.flush()
        if piece:
            yield piece

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def read(self) -> str:
        """Run to the end; return the whole text."""
        for _ in self:
            pass
        return self.text

    def close(self) -> None:
        """Stop the generation now."""
        self._pieces.close()
        self._tokens.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    @property
    def text(self) -> str:
        """The text so far."""
        return self._text.text

    @property
    def stats(self) -> SpeculativeDecodingStats:
        """The run's statistics (see :attr:`TokenStream.stats`)."""
        return self._tokens.stats


def chat(decoder, target_model, messages, draft, max_new_tokens, rng, stream):
    """``SpeculativeDecoder.chat``: the reply to a chat, with the model's own template."""
    missing = [
        name
        for name in ("encode_chat", "stop_token_ids", "detokenize")
        if not hasattr(target_model, name)
    ]
    if missing:
        raise TypeError(
            "chat needs a model with a tokenizer and a chat template (specdec.models."
            f"LlamaCppModel or TransformersModel); {type(target_model).__name__} lacks "
            f"{', '.join(missing)}"
        )
    if not isinstance(stream, bool):
        raise TypeError(f"stream must be True or False, got {stream!r}")
    if draft is None:
        from specdec.drafters import PromptLookup

        draft = PromptLookup()
    prompt = target_model.encode_chat(messages)
    stops = target_model.stop_token_ids
    tokens = decoder.stream(
        draft, target_model, prompt, max_new_tokens, stops[0] if stops else None, rng=rng
    )
    text = TextStream(tokens, target_model.detokenize, stops)
    return text if stream else text.read()
