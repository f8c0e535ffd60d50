"""Inputs an adversarial user tries (issue 29): each a clear error before any work, or
correct behaviour.

``SuffixDrafter``'s parameter ranges and its bound on the tokens indexed per request,
``TextStream``'s ``detokenize`` (str or bytes) and ``stop_ids``, chat messages with
text no tokenizer can encode, and cost curves of fewer than 2 points.  Every test runs
on both backends (the ``backend`` fixture), through a decoder where a decoder is
involved.
"""

from __future__ import annotations

import numpy as np
import pytest
from law_models import ContextModel

import specdec
from specdec import SpeculativeDecoder, TextStream
from specdec._detokenize import IncrementalDetokenizer
from specdec.drafters import (
    CostCurve,
    PositionalDraftLength,
    PromptLookup,
    SuffixDrafter,
)
from specdec.models._text import check_messages

# -- SuffixDrafter: every parameter has a range that works ------------------------------


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"max_spec_factor": 1e308}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": 1025}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": -1}, ValueError, "max_spec_factor"),
        ({"max_spec_factor": float("inf")}, TypeError, "max_spec_factor"),
        ({"max_spec_factor": "2"}, TypeError, "max_spec_factor"),
        ({"max_spec_offset": 1e308}, ValueError, "max_spec_offset"),
        ({"max_spec_offset": -1e308}, ValueError, "max_spec_offset"),
        ({"max_spec_offset": float("nan")}, TypeError, "max_spec_offset"),
        ({"num_tokens": 10**30}, ValueError, "num_tokens"),
        ({"num_tokens": 1025}, ValueError, "num_tokens"),
        ({"num_tokens": 2.0}, TypeError, "num_tokens"),
        ({"max_depth": 10**30}, ValueError, "max_depth"),
        ({"max_cached_requests": 10**30}, ValueError, "max_cached_requests"),
        ({"max_cached_tokens": 10**30}, ValueError, "max_cached_tokens"),
        ({"max_cached_tokens": -1}, ValueError, "max_cached_tokens"),
        ({"max_indexed_tokens": 10**30}, ValueError, "max_indexed_tokens"),
        ({"max_indexed_tokens": 47}, ValueError, "max_indexed_tokens"),  # < 2 * max_depth
        ({"max_indexed_tokens": None}, TypeError, "max_indexed_tokens"),
        ({"min_probability": 1.5}, ValueError, "min_probability"),
    ],
)
def test_suffix_parameters_out_of_range_are_refused(kwargs, error, name):
    with pytest.raises(error, match=name):
        SuffixDrafter(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_spec_factor": 1024.0, "max_spec_offset": 1024.0},  # the largest accepted
        {"max_spec_factor": 0.0, "max_spec_offset": 3.0},
        {"max_spec_factor": 1.0, "max_spec_offset": -1024.0},  # never drafts: fine
        {"num_tokens": 1024, "max_depth": 256, "min_probability": 0.0},
        {"max_cached_requests": 0, "max_cached_tokens": 0, "max_indexed_tokens": 48},
    ],
)
def test_suffix_parameters_at_their_bounds_work_in_the_decoder(backend, kwargs):
    target = ContextModel(6, seed=31, dtype=np.float32)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    expected, _ = specdec.sample(target, prompt, 30, temperature=0.0, backend=backend)
    drafter = SuffixDrafter(**kwargs)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    for _ in range(2):
        assert decoder.generate(drafter, target, prompt, 30)[0] == expected
    drafter.propose_candidates(np.array(prompt), 16, 4)  # the tree's walk too


# -- SuffixDrafter: bounded memory per request ----------------------------------------------


def test_a_long_prompt_is_indexed_from_its_last_tokens():
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 50_000, size=20_000)
    drafter = SuffixDrafter(max_depth=8, max_indexed_tokens=1_000)
    drafter.start(prompt)
    assert drafter.indexed_tokens == 500  # the last max_indexed_tokens // 2
    request = drafter._request()
    assert request.local.n_nodes <= 1 + 500 * 8
    # a repeat of the recent text is drafted from; one of the forgotten start is not
    recent = np.concatenate([prompt, prompt[-300:-290]])
    proposal = drafter.propose(recent, 8).tolist()
    assert proposal and proposal == prompt[-290 : -290 + len(proposal)].tolist()
    early = np.concatenate([prompt, prompt[100:110]])
    assert drafter.propose(early, 8).tolist() == []  # forgotten: ids of 50,000 never recur


def test_decoding_past_the_bound_stays_exact_and_bounded(backend):
    target = ContextModel(6, seed=31, dtype=np.float32)
    prompt = np.tile([1, 2, 3, 4, 5], 30).tolist()
    expected, _ = specdec.sample(target, prompt, 200, temperature=0.0, backend=backend)
    drafter = SuffixDrafter(max_depth=8, max_indexed_tokens=64)
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    ids, stats = decoder.generate(drafter, target, prompt, 200)
    assert ids == expected
    assert drafter.indexed_tokens <= 64
    assert drafter._request().local.n_nodes <= 1 + 64 * 8
    assert stats.total_draft_tokens_accepted > 0


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
        return _text_of(ids)

    def forward(self, ids):
        raise AssertionError("no pass before the check")


def test_chat_with_a_lone_surrogate_is_a_clear_error(backend):
    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    chat = [{"role": "system", "content": "x"}, {"role": "user", "content": "\udcff"}]
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\]"):
        decoder.chat(SurrogateCheckingAdapter(), chat)


# -- cost curves of fewer than 2 points --------------------------------------------------------


@pytest.mark.parametrize("curve", [[1.0], (1,), np.array([1.0]), []])
def test_curves_of_fewer_than_2_points_are_refused_everywhere(backend, curve):
    with pytest.raises((ValueError, TypeError), match="at least 2"):
        CostCurve(curve)
    with pytest.raises((ValueError, TypeError), match="target_cost"):
        PositionalDraftLength(target_cost=curve)
    with pytest.raises(ValueError, match="at least 2"):
        CostCurve([1.0, 2.0], tree=curve)

    class Target(ContextModel):
        cost_curve = curve

    decoder = SpeculativeDecoder(temperature=0.0, backend=backend)
    with pytest.raises(ValueError, match="target_model.cost_curve"):
        decoder.generate(SuffixDrafter(), Target(6), [1, 2, 1, 2], 5)


def test_adapters_refuse_a_one_point_curve():
    from specdec.models import _calibration

    with pytest.raises(ValueError, match="at least 2"):
        _calibration.check_cost_curve([1.0])
    assert _calibration.check_cost_curve([1.0, 1.5]).tolist() == [1.0, 1.5]


# -- long prompts through the CLI ---------------------------------------------------------------


@pytest.mark.parametrize("draft", ["suffix", "lookup"])
def test_cli_bounds_a_long_prompt_of_the_demo_models_with_one_line(capsys, monkeypatch, draft):
    import io

    from specdec import cli

    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 1_000_000))  # 1 MB on stdin
    code = cli.main(["generate", "--model", "toy", "--draft", draft])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "at most 32768" in err
    code = cli.main(["generate", "--model", "toy", "--prompt", "y" * 40_000])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "at most 32768" in err
