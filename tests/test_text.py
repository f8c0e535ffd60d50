"""Text in, text out: chat templates, incremental detokenization, ``decoder.chat``.

The pure-Python parts run everywhere with a byte-level toy tokenizer (one token per
UTF-8 byte, so an emoji spans four tokens and a CJK character three); the adapters'
own templates and tokenizers are tested where their extras are installed (skipped
otherwise, failed under ``SPECDEC_REQUIRE_MODELS=1``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CHATML, byte_level_tokenizer, require_module, require_smollm2

import specdec
from specdec import SpeculativeDecoder
from specdec._detokenize import IncrementalDetokenizer
from specdec.drafters import PromptLookup
from specdec.models._text import (
    check_messages,
    end_of_turn_id,
    render_chat_template,
)

TEXT = "Hi 😀, 日本語 and ünïcödé: ok 🎉🎉 — done."


def byte_ids(text: str) -> list:
    return list(text.encode("utf-8"))


def byte_text(ids) -> str:
    return bytes(int(t) for t in ids if t < 256).decode("utf-8", errors="replace")


def sentencepiece_like(ids) -> str:
    """A decoder that drops the text's leading space, as SentencePiece decoders do."""
    return byte_text(ids).removeprefix(" ")


def _pieces(detokenizer, ids, chunks):
    out = []
    for chunk in np.split(np.asarray(ids), chunks):
        piece = detokenizer.push(chunk)
        out.append(piece)
    out.append(detokenizer.flush())
    return [p for p in out if p]


@pytest.mark.parametrize("seed", range(20))
def test_emoji_and_cjk_split_across_tokens_print_whole(seed):
    ids = byte_ids(TEXT)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, len(ids)), size=rng.integers(1, 20), replace=False))
    pieces = _pieces(IncrementalDetokenizer(byte_text), ids, cuts)
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in piece for piece in pieces)


def test_one_token_at_a_time_holds_back_partial_characters():
    detokenizer = IncrementalDetokenizer(byte_text)
    emitted = [detokenizer.push([t]) for t in byte_ids("a😀b")]
    assert emitted == ["a", "", "", "", "😀", "b"]


def test_flush_emits_an_unfinished_character_at_the_very_end():
    detokenizer = IncrementalDetokenizer(byte_text)
    assert detokenizer.push(byte_ids("ok") + byte_ids("😀")[:2]) == "ok"
    assert detokenizer.flush() == "\ufffd"


def test_words_keep_their_spaces_when_decoded_in_context():
    # Decoded alone, " world" would lose its space (as a SentencePiece piece does).
    detokenizer = IncrementalDetokenizer(sentencepiece_like)
    words = [byte_ids(" Hello"), byte_ids(" world"), byte_ids(" again")]
    assert "".join(detokenizer.push(w) for w in words) == "Hello world again"


def test_a_naive_per_pass_decode_would_break_characters():
    """The property above is not free: decoding each pass alone prints U+FFFD."""
    ids = byte_ids(TEXT)
    naive = "".join(byte_text(chunk) for chunk in np.split(np.asarray(ids), [5, 9, 20]))
    assert "\ufffd" in naive


def test_stop_ids_are_never_printed():
    detokenizer = IncrementalDetokenizer(byte_text, stop_ids=[300])
    assert detokenizer.push(byte_ids("end") + [300]) == "end"


def test_detokenizer_is_a_streamer(backend):
    """As a streamer of specdec.sample: the prompt is skipped, the rest printed whole."""
    printed = []
    streamer = IncrementalDetokenizer(byte_text, on_text=printed.append)
    prompt = byte_ids("Say: ")
    model = ScriptModel(TEXT, len(prompt))
    ids, _ = specdec.sample(
        model, prompt, 200, model.eos, temperature=0.0, backend=backend, streamer=streamer
    )
    assert "".join(printed) == TEXT
    assert all("\ufffd" not in piece for piece in printed)


def test_streamer_takes_one_row_tensors_as_hugging_face_passes_them():
    printed = []
    streamer = IncrementalDetokenizer(byte_text, on_text=printed.append)
    streamer.put(np.array([byte_ids("prompt")]))  # (1, n): skipped
    streamer.put(np.array([byte_ids("one ")]))  # (1, n): assisted generation's passes
    streamer.put(np.array(byte_ids("two")))  # (n,)
    streamer.end()
    assert "".join(printed) == "one two"
    with pytest.raises(ValueError, match=r"one sequence, shape \(n,\) or \(1, n\), got \(2, 3\)"):
        streamer.put(np.zeros((2, 3), dtype=np.int64))


# -- chat templates -------------------------------------------------------------------


def test_render_chatml():
    jinja = pytest.importorskip("jinja2")
    assert jinja
    chat = [{"role": "user", "content": "Hi"}]
    assert render_chat_template(CHATML, chat) == "<|im_start|>user\nHi<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert render_chat_template(CHATML, chat, add_generation_prompt=False).endswith("<|im_end|>\n")
    assert _toy_template("<|im_end|>\n")(chat) == render_chat_template(CHATML, chat)


def test_render_template_features():
    pytest.importorskip("jinja2")
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}{{ m | tojson }}{% endfor %}"
    )
    out = render_chat_template(template, [{"role": "user", "content": "日本"}], bos_token="<s>")
    assert out == '<s>{"role": "user", "content": "日本"}'
    with pytest.raises(ValueError, match="no tools"):
        render_chat_template(template, [{"role": "tool", "content": ""}])


@pytest.mark.parametrize(
    "messages, error",
    [
        ("hello", TypeError),
        ([], ValueError),
        (["hello"], TypeError),
        ([{"role": "user"}], TypeError),
        ([{"role": "user", "content": 3}], TypeError),
    ],
)
def test_bad_messages_are_clear_errors(messages, error):
    with pytest.raises(error, match="messages"):
        check_messages(messages)


class ChatMLTokenizer:
    """Bytes are ids 0..255; ChatML's special tokens are 256 and 257."""

    special = {"<|im_start|>": 256, "<|im_end|>": 257}

    def tokenize(self, text):
        ids = []
        while text:
            for token, token_id in self.special.items():
                if text.startswith(token):
                    ids.append(token_id)
                    text = text[len(token) :]
                    break
            else:
                ids += byte_ids(text[0])
                text = text[1:]
        return ids


def test_end_of_turn_is_read_from_the_template():
    pytest.importorskip("jinja2")
    tokenizer = ChatMLTokenizer()

    def render(messages, add_generation_prompt=True):
        return render_chat_template(CHATML, messages, add_generation_prompt=add_generation_prompt)

    assert end_of_turn_id(render, tokenizer.tokenize) == 257
    assert end_of_turn_id(render, tokenizer.tokenize, special_ids={256}) is None
    # A template that writes nothing after a turn has no end-of-turn token.
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert end_of_turn_id(lambda m, **_: render_chat_template(plain, m), tokenizer.tokenize) is None


def _toy_template(ending):
    """A template (no Jinja2 needed) that writes ``ending`` after each turn's content."""

    def render(messages, add_generation_prompt=True):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}{ending}" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    return render


class EOTTokenizer(ChatMLTokenizer):
    special = {**ChatMLTokenizer.special, "<|EOT|>": 258}


def test_end_of_turn_skips_whitespace_and_prefers_special_tokens():
    tokenize = EOTTokenizer().tokenize
    render = _toy_template("\n<|EOT|>\n")  # the first token after the content is "\n"
    assert end_of_turn_id(render, tokenize) == 258
    assert end_of_turn_id(render, tokenize, special_ids={256, 257, 258}) == 258
    assert end_of_turn_id(render, tokenize, is_special=lambda t: t >= 256) == 258
    # Special tokens known, none written after the turn: no end of turn (a plain-text
    # token as the stop would cut the reply wherever that text appears).
    plain = _toy_template("\nEnd.\n")
    assert end_of_turn_id(plain, tokenize, special_ids={256, 257, 258}) is None
    assert end_of_turn_id(plain, tokenize, is_special=lambda t: t >= 256) is None
    assert end_of_turn_id(plain, tokenize) == ord("E")  # nothing known: the first token


# -- decoder.chat on a toy adapter ----------------------------------------------------------


class ScriptModel:
    """Greedy decoding writes ``script`` (as UTF-8 bytes) after the prompt, then 257.

    The vocabulary is the 256 bytes and two special tokens (256, 257 = end of turn).
    """

    vocab_size = 258
    eos = 257

    def __init__(self, script: str, prompt_length=None):
        self.script = [*byte_ids(script), self.eos]
        self.prompt_length = prompt_length

    def forward(self, ids):
        ids = np.asarray(ids)[0]
        start = self.prompt_length
        logits = np.zeros((len(ids), self.vocab_size))
        for i in range(len(ids)):
            k = i + 1 - start if start is not None else 0  # no prompt length: always the first
            logits[i, self.script[min(max(k, 0), len(self.script) - 1)]] = 5.0
        return logits[None]


class ToyChatAdapter(ScriptModel):
    """What ``decoder.chat`` needs of an adapter: a template, stops, detokenize."""

    def __init__(self, reply):
        super().__init__(reply)
        self.tokenizer = ChatMLTokenizer()

    def encode_chat(self, messages):
        # ChatML formatted here, not by Jinja2, so that these tests run in the base install.
        ids = self.tokenizer.tokenize(_toy_template("<|im_end|>\n")(check_messages(messages)))
        self.prompt_length = len(ids)
        return ids

    @property
    def stop_token_ids(self):
        return [257, 256]

    def detokenize(self, ids):
        return byte_text(ids)


def test_chat_returns_the_reply_text(backend):
    reply = "Sure: 日本語 😀 — fixed."
    model = ToyChatAdapter(reply)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    text = decoder.chat(model, [{"role": "user", "content": "fix it"}])
    assert text == reply


def test_chat_streams_whole_characters_and_stops_at_end_of_turn(backend):
    reply = "Copy: 日本語 😀 and 日本語 😀 again"
    model = ToyChatAdapter(reply)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    stream = decoder.chat(model, [{"role": "user", "content": reply}], stream=True)
    pieces = list(stream)
    assert "".join(pieces) == reply == stream.text
    assert all("\ufffd" not in p for p in pieces)
    assert stream.stopped and 257 not in stream.ids
    assert stream.stats.total_draft_tokens_accepted > 0  # the reply quotes the prompt
    # A budget shorter than the reply stops at the length limit instead.
    short = decoder.chat(model, [{"role": "user", "content": "x"}], max_new_tokens=5, stream=True)
    assert short.read() == reply.encode()[:5].decode() and not short.stopped


def test_chat_with_a_draft_model_and_a_second_stop_id(backend):
    model = ToyChatAdapter("ab")
    model.script[-1] = 256  # ends with the other stop id: the text layer stops there
    decoder = SpeculativeDecoder(3, temperature=0.0, backend=backend)
    text = decoder.chat(model, [{"role": "user", "content": "x"}], draft=ScriptModel("zz"))
    assert text == "ab"


def test_chat_bad_arguments(backend):
    decoder = SpeculativeDecoder(backend=backend)
    with pytest.raises(TypeError, match="chat template"):
        decoder.chat(ScriptModel("x"), [{"role": "user", "content": "x"}])
    with pytest.raises(TypeError, match="stream"):
        decoder.chat(ToyChatAdapter("x"), [{"role": "user", "content": "x"}], stream="yes")
    with pytest.raises(TypeError, match="messages"):
        decoder.chat(ToyChatAdapter("x"), "hello")


# -- real tokenizers and templates ----------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from specdec import models

    return models.LlamaCppModel(require_smollm2(), n_ctx=512, n_threads=1)


def test_smollm2_template_and_end_of_turn(smollm2):
    chat = [{"role": "user", "content": "Hi"}]
    text = smollm2.apply_chat_template(chat)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = smollm2.encode_chat(chat)
    assert ids == smollm2.tokenize(text, add_bos=False, special=True)
    assert smollm2.tokenize("<|im_end|>", add_bos=False, special=True) == [2]
    assert smollm2.stop_token_ids == [2]


@pytest.mark.parametrize(
    "ending, stops",
    [
        ("<|im_end|>\n", [2]),
        ("\n<|im_end|>\n", [2]),  # a newline first: it used to be taken for the end of turn
        ("\n<repo_name>\n", [3, 2]),  # a control token that is no end of generation
        ("\nEnd.\n", [2]),  # no special token after the turn: the end of sequence only
    ],
)
def test_smollm2_end_of_turn_is_a_special_token(smollm2, monkeypatch, ending, stops):
    template = "{% for m in messages %}{{ m['content'] + '" + ending.replace("\n", "\\n") + "' }}"
    monkeypatch.setitem(
        smollm2.llama.metadata, "tokenizer.chat_template", template + "{% endfor %}"
    )
    assert smollm2.stop_token_ids == stops


def test_smollm2_incremental_detokenization_prints_whole_characters(smollm2):
    ids = smollm2.tokenize(TEXT, add_bos=False)
    singles = [smollm2.detokenize([t]) for t in ids]
    assert any("\ufffd" in s for s in singles)  # tokens do end inside characters here
    detokenizer = IncrementalDetokenizer(smollm2.detokenize)
    pieces = [detokenizer.push([t]) for t in ids] + [detokenizer.flush()]
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces)


def test_smollm2_chat_stops_at_end_of_turn(smollm2, backend):
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    stream = decoder.chat(
        smollm2, [{"role": "user", "content": "Say hello."}], max_new_tokens=60, stream=True
    )
    text = stream.read()
    assert text and "<|im_end|>" not in text
    assert stream.stopped == (len(stream.ids) < 60)
    # The reply is plain greedy decoding's, up to its first stop token (excluded).
    prompt = smollm2.encode_chat([{"role": "user", "content": "Say hello."}])
    plain, _ = specdec.sample(smollm2, prompt, 60, 2, temperature=0.0, backend=backend)
    new = plain[len(prompt) :]
    assert stream.ids == (new[: new.index(2)] if 2 in new else new)
    assert 2 not in stream.ids and text == smollm2.detokenize(stream.ids)


def test_transformers_tokenizer_template(backend):
    # Seeded: an untrained model's weights otherwise depend on the tests run before.
    require_module("torch").manual_seed(0)
    transformers = require_module("transformers")
    tokenizer = byte_level_tokenizer(chat=True)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=258)
    )
    adapter = specdec.models.TransformersModel(model, tokenizer=tokenizer)
    chat = [{"role": "user", "content": "日本"}]
    assert adapter.apply_chat_template(chat) == render_chat_template(CHATML, chat)
    ids = adapter.encode_chat(chat)
    assert ids[0] == 256 and ids.count(257) == 1
    assert adapter.stop_token_ids == [257]
    # The end of turn is a special or added token, never the newline written before it.
    tokenizer.add_tokens(["<|EOT|>"])  # added, not flagged special
    eot = tokenizer.convert_tokens_to_ids("<|EOT|>")
    turn_end = "'<|im_end|>' + '\n'"
    tokenizer.chat_template = CHATML.replace(turn_end, "'\n<|EOT|>\n'")
    assert adapter.stop_token_ids == [eot, 257]
    tokenizer.chat_template = CHATML.replace(turn_end, "'\nEnd.\n'")
    assert adapter.stop_token_ids == [257]
    text = SpeculativeDecoder(temperature=0.0, backend=backend).chat(
        adapter, chat, draft=PromptLookup(), max_new_tokens=12
    )
    # The model is untrained, so its bytes need not be valid UTF-8: the text must be
    # what the tokenizer itself decodes from the same greedy ids, stopped at end of turn.
    plain, _ = specdec.sample(adapter, ids, 12, temperature=0.0, backend=backend)
    new = plain[len(ids) :]
    new = new[: new.index(257)] if 257 in new else new
    assert isinstance(text, str) and text == tokenizer.decode(new)


# -- chat messages with text no tokenizer can encode ------------------------------------------


@pytest.mark.parametrize("where", ["role", "content"])
def test_a_lone_surrogate_is_refused_naming_the_message(where):
    messages = [{"role": "user", "content": "fine"}, {"role": "user", "content": "ok"}]
    messages[1][where] = "bad \ud800 text"
    with pytest.raises(ValueError, match=rf"messages\[1\]\['{where}'\] is not valid Unicode"):
        check_messages(messages)


class SurrogateCheckingAdapter:
    """A chat adapter whose encode_chat goes through the shared check (as both do)."""

    vocab_size = 256

    def encode_chat(self, messages):
        check_messages(messages)
        raise AssertionError("unreachable: the check refuses first")

    stop_token_ids = [0]

    def detokenize(self, ids):
        return bytes(int(t) for t in ids).decode("utf-8", errors="replace")

    def forward(self, ids):
        raise AssertionError("no pass before the check")


def test_chat_with_a_lone_surrogate_is_a_clear_error(backend):
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    chat = [{"role": "system", "content": "x"}, {"role": "user", "content": "\udcff"}]
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\]"):
        decoder.chat(SurrogateCheckingAdapter(), chat)
