"""Streaming: ``generate(streamer=)``, ``sample(streamer=)`` and ``SpeculativeDecoder.stream``.

The loop exists once (a generator of per-pass tokens), so these tests check the
contract around it:

* the stream, concatenated, is ``generate``'s new tokens for the same seed, for every
  kind of draft, both verification schemes, greedy and sampled, both backends;
* Hugging Face's streamer protocol: ``put(prompt)`` once, ``put(new)`` per target pass
  (1-D int64, never empty), ``end()`` once; ``TextStreamer`` and
  ``TextIteratorStreamer`` work on a ``TransformersModel`` as they are;
* stopping early (``break``, an exception in ``put``, Ctrl-C inside a model or a llama.cpp
  decode) leaves the models consistent: a new decoder on the interrupted models gives
  the ids of a clean run, the interrupted decoder carries on, and the stats count what
  was produced.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import byte_level_tokenizer, require_module, require_smollm2
from law_models import ContextModel

import specdec
from specdec import SpeculativeDecoder, TextStream
from specdec._detokenize import IncrementalDetokenizer
from specdec.drafters import Chain, NGram, PromptLookup
from specdec.drafters.cost import DEFAULT_COST_CURVE
from specdec.models._cached import PrefixCachedModel

V = 8
PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


class CachedToyModel(PrefixCachedModel):
    """A toy model behind the adapters' prefix cache, whose logits depend on the cache.

    Like a key/value cache, the cache holds a state per position, computed from all the
    tokens before it; a call continues from the cached states.  A cache that holds
    states of tokens other than the sequence's (not rolled back, torn by an
    interruption) gives other logits, so the consistency tests below can fail.
    """

    def __init__(self, seed=0):
        # A fixed cost curve: a measured one (timed on first use, per instance) would
        # make the draft lengths, and so the ids, differ between two fresh models.
        super().__init__(cost_curve=DEFAULT_COST_CURVE)
        self.inner = ContextModel(V, seed=seed, scale=2.0, period=5)
        self.vocab_size = V
        self._ids = np.zeros(0, dtype=np.int64)
        self._states = np.zeros(0, dtype=np.int64)

    def _cached_ids(self):
        return self._ids

    def _first_to_evaluate(self, n_common, length, n_rows):
        return min(n_common, length - n_rows)

    def _roll_back(self, n_keep):
        self._ids, self._states = self._ids[:n_keep], self._states[:n_keep]

    def _evaluate(self, seq, start, n_rows):
        states = self._states[:start].tolist()
        state = states[-1] if states else 0
        for token in seq[start:]:
            state = (state * 7 + int(token) + 1) % V
            states.append(state)
        self._ids, self._states = seq.copy(), np.array(states, dtype=np.int64)
        previous = np.array([V, *states[:-1]])[-n_rows:]
        positions = np.arange(len(seq))[-n_rows:] % self.inner.period
        return self.inner.table[previous, seq[-n_rows:], positions][None].astype(np.float32)


def _drafts(kind):
    if kind == "model":
        return ContextModel(V, seed=1, scale=2.0, period=5)
    if kind == "lookup":
        return PromptLookup(num_tokens=4)
    if kind == "ngram":
        return NGram.train(["x"], lambda _: PROMPT * 4, order=3)
    return Chain(PromptLookup(num_tokens=4), ContextModel(V, seed=1, scale=2.0, period=5))


CONFIGS = [
    (draft, verification, temperature)
    for draft in ("model", "lookup", "ngram", "chain")
    for verification in ("block", "token")
    for temperature in (0.0, 0.9)
]


class RecordingStreamer:
    """Hugging Face's streamer protocol, recorded."""

    def __init__(self):
        self.puts = []
        self.ended = 0

    def put(self, value):
        assert self.ended == 0, "put after end"
        self.puts.append(np.array(value))

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("draft, verification, temperature", CONFIGS)
def test_stream_equals_generate_for_many_seeds(backend, draft, verification, temperature):
    target = ContextModel(V, seed=0, scale=2.0, period=5)
    for seed in range(6):
        options = dict(temperature=temperature, verification=verification, backend=backend)
        decoder = SpeculativeDecoder(3, **options)
        ids, stats = decoder.generate(_drafts(draft), target, PROMPT, 30, 7, rng=seed)
        stream = SpeculativeDecoder(3, **options).stream(
            _drafts(draft), target, PROMPT, 30, 7, rng=seed
        )
        pieces = list(stream)
        assert all(p.ndim == 1 and p.dtype == np.int64 and len(p) > 0 for p in pieces)
        assert np.concatenate(pieces).tolist() == ids[len(PROMPT) :]
        assert stream.tokens == ids[len(PROMPT) :]
        assert (
            len(pieces) == stats.num_target_forward_passes == stream.stats.num_target_forward_passes
        )
        for name in ("total_tokens_generated", "total_draft_tokens_accepted", "drafts_by_source"):
            assert getattr(stream.stats, name) == getattr(stats, name)


@pytest.mark.parametrize("draft, verification, temperature", CONFIGS[::3])
def test_streamer_protocol(backend, draft, verification, temperature):
    target = ContextModel(V, seed=0, scale=2.0, period=5)

    def decoder():  # a new one per call: an adaptive draft length may learn across calls
        return SpeculativeDecoder(
            3, temperature=temperature, verification=verification, backend=backend
        )

    plain_ids, _ = decoder().generate(_drafts(draft), target, PROMPT, 25, rng=3)
    streamer = RecordingStreamer()
    ids, stats = decoder().generate(_drafts(draft), target, PROMPT, 25, rng=3, streamer=streamer)
    assert ids == plain_ids
    prompt, *passes = streamer.puts
    assert prompt.dtype == np.int64 and prompt.ndim == 1 and prompt.tolist() == PROMPT
    assert all(p.dtype == np.int64 and p.ndim == 1 and len(p) > 0 for p in passes)
    assert np.concatenate(passes).tolist() == ids[len(PROMPT) :]
    assert len(passes) == stats.num_target_forward_passes
    assert streamer.ended == 1


def test_sample_streamer(backend):
    target = ContextModel(V, seed=0, scale=2.0, period=5)
    plain, _ = specdec.sample(target, PROMPT, 20, 7, rng=5, backend=backend)
    streamer = RecordingStreamer()
    ids, stats = specdec.sample(target, PROMPT, 20, 7, rng=5, backend=backend, streamer=streamer)
    assert ids == plain
    assert streamer.puts[0].tolist() == PROMPT and streamer.ended == 1
    assert [p.tolist() for p in streamer.puts[1:]] == [[t] for t in ids[len(PROMPT) :]]
    assert stats.num_target_forward_passes == len(ids) - len(PROMPT)


@pytest.mark.parametrize("bad", [object(), "text", print])
def test_bad_streamer_is_refused_before_any_work(backend, bad):
    target = ContextModel(V, seed=0)
    with pytest.raises(TypeError, match="streamer must have put"):
        SpeculativeDecoder(backend=backend).generate(
            PromptLookup(), target, PROMPT, 5, streamer=bad
        )
    with pytest.raises(TypeError, match="streamer must have put"):
        specdec.sample(target, PROMPT, 5, backend=backend, streamer=bad)
    assert target.calls == 0


def test_stream_checks_its_arguments_at_once(backend):
    target = ContextModel(V, seed=0)
    decoder = SpeculativeDecoder(backend=backend)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.stream(PromptLookup(), target, PROMPT, -1)
    with pytest.raises(ValueError, match="prompt"):
        decoder.stream(PromptLookup(), target, [], 5)
    assert target.calls == 0


def test_stats_so_far_then_final(backend):
    target = ContextModel(V, seed=0, scale=2.0, period=5)
    stream = SpeculativeDecoder(3, backend=backend).stream(
        _drafts("model"), target, PROMPT, 40, rng=1
    )
    assert stream.stats.total_tokens_generated == 0
    first = next(stream)
    assert stream.stats.total_tokens_generated == len(first)
    assert stream.stats.num_target_forward_passes == 1
    rest = list(stream)
    final = stream.stats
    assert final.total_tokens_generated == len(first) + sum(map(len, rest)) == 40
    assert final.num_draft_forward_passes > 0 and final.target_time > 0


def ids_after(target, draft_kind, backend):
    """A new decoder's ids on a target that an interrupted run used (its cache dirty)."""
    decoder = SpeculativeDecoder(3, temperature=0.8, backend=backend)
    return decoder.generate(_drafts(draft_kind), target, PROMPT, 40, rng=12)[0]


def _clean_ids(draft_kind, seed, backend, max_new_tokens=40, temperature=0.8):
    decoder = SpeculativeDecoder(3, temperature=temperature, backend=backend)
    return decoder.generate(
        _drafts(draft_kind), CachedToyModel(), PROMPT, max_new_tokens, rng=seed
    )[0]


@pytest.mark.parametrize("draft_kind", ["model", "lookup", "chain"])
@pytest.mark.parametrize("stop_after", [1, 3])
def test_break_mid_stream_then_a_fresh_call_is_clean(backend, draft_kind, stop_after):
    target = CachedToyModel()
    decoder = SpeculativeDecoder(3, temperature=0.8, backend=backend)
    stream = decoder.stream(_drafts(draft_kind), target, PROMPT, 40, rng=11)
    seen = []
    for i, new in enumerate(stream):
        seen += new.tolist()
        if i + 1 == stop_after:
            break
    assert stream.stats.total_tokens_generated == len(seen)
    assert stream.stats.num_target_forward_passes == stop_after
    # The target's cache still holds this run's tokens (and maybe rejected drafts).
    assert len(target.cached_tokens) >= len(PROMPT)
    assert ids_after(target, draft_kind, backend) == _clean_ids(draft_kind, 12, backend)
    # A half-consumed stream left on the side does not disturb a new call either.
    next(decoder.stream(_drafts(draft_kind), target, PROMPT[:-1], 40, rng=13))
    assert ids_after(target, draft_kind, backend) == _clean_ids(draft_kind, 12, backend)
    # The interrupted decoder itself carries on (what an adaptive length learnt is kept).
    ids, stats = decoder.generate(_drafts(draft_kind), target, PROMPT, 40, rng=12)
    assert len(ids) == len(PROMPT) + 40 == len(PROMPT) + stats.total_tokens_generated


class Stop(Exception):
    pass


class FailingStreamer(RecordingStreamer):
    def __init__(self, fail_at, error=Stop):
        super().__init__()
        self.fail_at, self.error = fail_at, error

    def put(self, value):
        super().put(value)
        if len(self.puts) == self.fail_at:
            raise self.error("stop here")


@pytest.mark.parametrize("error", [Stop, KeyboardInterrupt])
def test_exception_in_put_propagates_and_the_next_call_is_clean(backend, error):
    target = CachedToyModel()
    decoder = SpeculativeDecoder(3, temperature=0.8, backend=backend)
    streamer = FailingStreamer(3, error)
    with pytest.raises(error):
        decoder.generate(_drafts("model"), target, PROMPT, 40, rng=11, streamer=streamer)
    assert streamer.ended == 0  # as in Hugging Face's generate: no end() after an error
    assert ids_after(target, "model", backend) == _clean_ids("model", 12, backend)


class InterruptingModel(CachedToyModel):
    """Raises KeyboardInterrupt in the middle of its ``n``-th evaluation.

    The cache's states are clobbered when it stops.  A correct adapter then drops the
    cache it cannot trust (``TransformersModel`` does); ``keep_torn_cache`` keeps it,
    the negative control that shows the test can fail.
    """

    def __init__(self, n, keep_torn_cache=False):
        super().__init__()
        self.n, self.keep_torn_cache = n, keep_torn_cache
        self.evaluations = 0

    def _evaluate(self, seq, start, n_rows):
        self.evaluations += 1
        if self.evaluations == self.n:
            # Stopped while writing: the whole sequence claimed, the states clobbered.
            self._ids, self._states = seq.copy(), np.zeros(len(seq), dtype=np.int64)
            if not self.keep_torn_cache:
                self._roll_back(0)
            raise KeyboardInterrupt
        return super()._evaluate(seq, start, n_rows)


@pytest.mark.parametrize("keep_torn_cache", [False, True])
def test_ctrl_c_inside_the_target_then_a_fresh_call_is_clean(backend, keep_torn_cache):
    target = InterruptingModel(4, keep_torn_cache)
    decoder = SpeculativeDecoder(3, temperature=0.8, backend=backend)
    stream = decoder.stream(_drafts("model"), target, PROMPT, 40, rng=11)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for new in stream:
            got += new.tolist()
    assert stream.stats.total_tokens_generated == len(got) > 0
    assert stream.stats.num_target_forward_passes == 3
    # The same seed again walks into the positions the interrupted pass was evaluating.
    ids, _ = SpeculativeDecoder(3, temperature=0.8, backend=backend).generate(
        _drafts("model"), target, PROMPT, 40, rng=11
    )
    assert (ids == _clean_ids("model", 11, backend)) != keep_torn_cache


def test_stream_close_and_context_manager(backend):
    target = ContextModel(V, seed=0, scale=2.0, period=5)
    decoder = SpeculativeDecoder(3, backend=backend)
    with decoder.stream(_drafts("lookup"), target, PROMPT, 40, rng=2) as stream:
        first = next(stream)
    assert stream.stats.total_tokens_generated == len(first)
    with pytest.raises(StopIteration):
        next(stream)


def test_consumer_time_is_not_decoder_time(backend):
    import time

    target = ContextModel(V, seed=0, scale=2.0, period=5)
    stream = SpeculativeDecoder(3, backend=backend).stream(
        _drafts("lookup"), target, PROMPT, 6, rng=2
    )
    for _ in stream:
        time.sleep(0.05)
    assert stream.stats.decoder_time < 0.05


# -- real models ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_hf():
    """A tiny Llama with seeded weights and a byte-level tokenizer built in memory."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    tokenizer = byte_level_tokenizer()
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=512,
            initializer_range=0.2,
        )
    )
    return model, tokenizer


def test_hf_text_streamer_prints_the_generated_text(tiny_hf, backend, capsys):
    transformers = require_module("transformers")
    model, tokenizer = tiny_hf
    target = specdec.models.TransformersModel(model, tokenizer=tokenizer)
    prompt = target.tokenize("Hello, world. Hello, ")
    streamer = transformers.TextStreamer(tokenizer, skip_prompt=True)
    decoder = SpeculativeDecoder(4, temperature=0.0, backend=backend)
    ids, _ = decoder.generate(PromptLookup(), target, prompt, 24, streamer=streamer)
    printed = capsys.readouterr().out
    assert printed == tokenizer.decode(ids[len(prompt) :]) + "\n"


def test_hf_text_iterator_streamer_in_a_thread(tiny_hf, backend):
    transformers = require_module("transformers")
    model, tokenizer = tiny_hf
    target = specdec.models.TransformersModel(model, tokenizer=tokenizer)
    prompt = target.tokenize("abc abc abc ")
    streamer = transformers.TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    decoder = SpeculativeDecoder(4, temperature=0.7, seed=5, backend=backend)
    result = {}

    def work():
        result["ids"], result["stats"] = decoder.generate(
            PromptLookup(), target, prompt, 30, streamer=streamer
        )

    thread = threading.Thread(target=work)
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == tokenizer.decode(result["ids"][len(prompt) :])


def test_transformers_interrupted_mid_forward_then_clean(tiny_hf, backend):
    """Ctrl-C inside the model's forward (a layer hook): the adapter drops its cache."""
    model, tokenizer = tiny_hf
    # Fixed cost curves: a model built in memory is calibrated per adapter, and two
    # timed curves would make the adapters draft differently (other ids, same law).
    target = specdec.models.TransformersModel(
        model, tokenizer=tokenizer, cost_curve=DEFAULT_COST_CURVE
    )
    clean = specdec.models.TransformersModel(
        model, tokenizer=tokenizer, cost_curve=DEFAULT_COST_CURVE
    )
    prompt = target.tokenize("one two one two one two ")
    calls = []

    def hook(*_):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    handle = model.model.layers[1].register_forward_hook(hook)
    decoder = SpeculativeDecoder(4, temperature=0.8, backend=backend)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in decoder.stream(PromptLookup(), target, prompt, 30, rng=1):
                pass
    finally:
        handle.remove()
    after = SpeculativeDecoder(4, temperature=0.8, backend=backend)
    ids, _ = after.generate(PromptLookup(), target, prompt, 30, rng=2)
    expected, _ = SpeculativeDecoder(4, temperature=0.8, backend=backend).generate(
        PromptLookup(), clean, prompt, 30, rng=2
    )
    assert ids == expected


@pytest.fixture(scope="module")
def smollm2_path():
    """The SmolLM2 GGUF (skipped where absent, failed under SPECDEC_REQUIRE_MODELS=1)."""
    return require_smollm2()


def _interrupt_decode(adapter, n):
    """Make Ctrl-C land as ``llama_decode`` returns in the adapter's ``n``-th decode.

    That is where Python runs a pending SIGINT handler: the KV cache already holds the
    batch's positions, but the adapter has not recorded them yet.
    """
    real = adapter._batch.decode
    calls = []

    def decode(*args):
        real(*args)
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt

    adapter._batch.decode = decode
    return lambda: vars(adapter._batch).pop("decode")


# The prompt spans three batches of 16 tokens: decodes 1 and 2 are its first two batches
# (nothing recorded yet, then one batch), decode 5 a verifying pass.
@pytest.mark.parametrize("n", [1, 2, 5])
def test_llama_ctrl_c_inside_a_decode_then_continuing_the_text(backend, smollm2_path, n):
    kw = dict(n_ctx=512, n_batch=16, n_threads=1, seed=0, cost_curve=DEFAULT_COST_CURVE)
    target = specdec.models.LlamaCppModel(smollm2_path, **kw)
    fresh = specdec.models.LlamaCppModel(smollm2_path, **kw)
    prompt = target.tokenize("one two three four five, " * 6 + "one two three")
    assert 32 < len(prompt) <= 48
    target.batch_invariant  # noqa: B018 (its probe decodes first, before the count starts)
    restore = _interrupt_decode(target, n)
    got = []
    decoder = SpeculativeDecoder(4, temperature=0.0, backend=backend)
    try:
        with pytest.raises(KeyboardInterrupt):
            for new in decoder.stream(PromptLookup(), target, prompt, 30):
                got += new.tolist()
    finally:
        restore()
    # The next call continues the text so far (a chat's next turn starts where the cache
    # ends): it used to fail with "llama_decode returned -1", stale cells in its way.
    follow = np.array([prompt + got + target.tokenize(" four five", add_bos=False)])
    np.testing.assert_allclose(
        target.forward(follow, logits_to_keep=4), fresh.forward(follow, logits_to_keep=4), atol=1e-3
    )
    ids, _ = SpeculativeDecoder(4, temperature=0.0, backend=backend).generate(
        PromptLookup(), target, follow[0], 20
    )
    fresh.reset()
    expected, _ = SpeculativeDecoder(4, temperature=0.0, backend=backend).generate(
        PromptLookup(), fresh, follow[0], 20
    )
    assert ids == expected


# -- TextStream and detokenize ---------------------------------------------------------------

TEXT = "héllo wörld, 日本語 ✓ done"


def _bytes_of(ids) -> bytes:
    return bytes(int(t) for t in ids)


def _text_of(ids) -> str:
    return _bytes_of(ids).decode("utf-8", errors="replace")


class ByteEcho:
    """A target that greedily writes TEXT's UTF-8 bytes after a 1-token prompt, then 0s."""

    vocab_size = 256

    def __init__(self):
        self.script = list(TEXT.encode("utf-8")) + [0] * 64

    def forward(self, ids):
        ids = np.asarray(ids)[0]
        logits = np.zeros((len(ids), 256))
        for i in range(len(ids)):
            logits[i, self.script[min(i, len(self.script) - 1)]] = 9.0
        return logits[None]


def _stream(backend, detokenize, stop_ids=(0,)):
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    tokens = decoder.stream(PromptLookup(), ByteEcho(), [1], 60)
    return TextStream(tokens, detokenize, stop_ids)


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_detokenize_may_return_bytes_like_llama_cpp(backend, kind):
    as_bytes = _stream(backend, lambda ids: kind(_bytes_of(ids)))
    pieces = list(as_bytes)
    as_text = _stream(backend, _text_of)
    assert pieces == list(as_text)  # decoded incrementally exactly as text is
    assert as_bytes.text == TEXT and all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("bad", [None, 5, [1, 2], 2.5, {"a": 1}])
def test_detokenize_returning_something_else_names_detokenize(backend, bad):
    stream = _stream(backend, lambda ids: bad)
    with pytest.raises(TypeError, match="detokenize must return str or bytes"):
        stream.read()


@pytest.mark.parametrize("bad", [None, 5, "decode"])
def test_textstream_refuses_a_detokenize_that_is_not_callable_before_any_pass(backend, bad):
    target = ByteEcho()
    calls = []
    target.forward = lambda ids, forward=target.forward: calls.append(1) or forward(ids)
    tokens = SpeculativeDecoder(temperature=0.0, backend=backend).stream(
        PromptLookup(), target, [1], 10
    )
    with pytest.raises(TypeError, match="detokenize must be a callable"):
        TextStream(tokens, bad)
    assert calls == []
    with pytest.raises(TypeError, match="detokenize must be a callable"):
        IncrementalDetokenizer(bad)


def test_textstream_refuses_what_is_not_a_token_stream():
    with pytest.raises(TypeError, match="tokens must be a specdec.TokenStream"):
        TextStream([np.array([1, 2])], _text_of)


@pytest.mark.parametrize(
    "stop_ids, error",
    [
        ([29.5], TypeError),  # it used to become 29: the text ended early
        ([10**30], ValueError),
        ([-1], ValueError),
        (None, TypeError),
        (5, TypeError),
        ("ab", TypeError),
        (b"ab", TypeError),
        ([None], TypeError),
        ([True], TypeError),
        ([np.float64(3.0)], TypeError),
    ],
)
def test_bad_stop_ids_name_stop_ids(backend, stop_ids, error):
    with pytest.raises(error, match="stop_ids"):
        _stream(backend, _text_of, stop_ids)
    with pytest.raises(error, match="stop_ids"):
        IncrementalDetokenizer(_text_of, stop_ids=stop_ids)


def test_good_stop_ids_of_any_int_type_stop_the_text(backend):
    stop = TEXT.encode("utf-8")[6]
    for stop_ids in ([np.int64(stop)], (stop, 2**63 - 1), {stop}, np.array([stop])):
        stream = _stream(backend, _text_of, stop_ids)
        assert stream.read() == "héllo" and stream.stopped


@pytest.mark.parametrize("new", [[V], [3, -1], [2**32 + 3], [1, 2, V + 7]])
def test_the_prefix_cache_refuses_ids_out_of_range_before_evaluating(new):
    model = CachedToyModel()
    model.forward(np.array([PROMPT]), logits_to_keep=1)
    calls, cached = model.n_forward_calls, model.cached_tokens
    with pytest.raises(
        ValueError, match=r"ids holds (token id \d+, outside \[0, vocab_size\)|a negative token id)"
    ):
        model.forward(np.array([PROMPT + new]), logits_to_keep=1)
    assert model.n_forward_calls == calls and model.cached_tokens.tolist() == cached.tolist()


@pytest.mark.parametrize("rows", [1.0, "1", True])
def test_the_prefix_cache_takes_an_int_logits_to_keep(rows):
    with pytest.raises(TypeError, match="logits_to_keep must be an int"):
        CachedToyModel().forward(np.array([PROMPT]), logits_to_keep=rows)
