"""The adapters' cost curve and llama.cpp batch-invariance check (no test depends on a timing).

* ``cost_curve``: given curves are validated and used as they are; a measured one
  has the documented shape, is kept per process and setting, and leaves the cache
  consistent; ``speculation_cost`` follows it without ever starting a calibration.
* ``LlamaCppModel.batch_invariant``: checked once at the first use, the cache left
  as it was, a ``BatchVarianceWarning`` when the build is not batch-invariant
  (simulated by perturbing batched rows), none with ``min_eval_tokens=2``.
* Only the wanted logit rows are computed by llama.cpp, and a later call that wants
  more rows gets them right.

Skipped without the optional dependencies, unless ``SPECDEC_REQUIRE_MODELS=1``.
"""

from __future__ import annotations

import importlib
import os
import warnings

import numpy as np
import pytest

from specdec import models
from specdec.models import _calibration

REQUIRE_MODELS = os.environ.get("SPECDEC_REQUIRE_MODELS") == "1"
VOCAB = 97
LLAMA_KW = dict(n_ctx=256, n_threads=1, seed=0, verbose=False)
CURVE = [1.0, 1.5, 1.9, 2.2, 2.6, 3.0]


def _require(module_name: str):
    if REQUIRE_MODELS:
        try:
            return importlib.import_module(module_name)
        except ImportError as exc:
            pytest.fail(f"SPECDEC_REQUIRE_MODELS=1 but {module_name!r} cannot be imported: {exc}")
    return pytest.importorskip(module_name)


@pytest.fixture(scope="module")
def tiny_lm():
    torch = _require("torch")
    transformers = _require("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=1,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=VOCAB,
            max_position_embeddings=256,
        )
    )


@pytest.fixture(scope="module")
def smollm2():
    _require("llama_cpp")
    try:
        return models.smollm2_path()
    except FileNotFoundError as exc:
        if REQUIRE_MODELS:
            pytest.fail(f"SPECDEC_REQUIRE_MODELS=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def smol(smollm2):
    return models.LlamaCppModel(smollm2, **LLAMA_KW)


@pytest.fixture
def no_calibration(monkeypatch):
    """Make any calibration fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a calibration was started")

    monkeypatch.setattr(_calibration, "measure_cost_curve", refuse)


PROMPT = [5, 17, 33, 2, 71, 9, 40, 12, 3, 88]


# --- cost curve: given -----------------------------------------------------------------


def test_given_cost_curve_is_used_without_calibration(tiny_lm, no_calibration):
    adapter = models.TransformersModel(tiny_lm, cost_curve=CURVE)
    curve = adapter.cost_curve
    assert curve.dtype == np.float64 and curve.ndim == 1
    np.testing.assert_array_equal(curve, CURVE)
    with pytest.raises(ValueError):
        curve[1] = 5.0  # read-only
    overhead, per_token = adapter.speculation_cost
    # The line through (1, 0.5), ..., (5, 2.0): slope 0.37, intercept about 0.13.
    assert per_token == pytest.approx(0.37, abs=0.01)
    assert overhead == pytest.approx(0.13, abs=0.02)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "non-empty"),
        ([[1.0, 2.0]], "1-D"),
        ([2.0, 3.0], r"cost_curve\[0\] must be 1.0"),
        ([1.0, float("nan")], "finite"),
        ([1.0, -1.0], "> 0"),
        ("fast", "numbers"),
    ],
)
def test_bad_cost_curve_is_a_clear_error(tiny_lm, bad, message):
    with pytest.raises(ValueError, match=message):
        models.TransformersModel(tiny_lm, cost_curve=bad)


def test_speculation_cost_never_calibrates(tiny_lm, no_calibration):
    adapter = models.TransformersModel(tiny_lm)
    assert adapter.speculation_cost == models.TransformersModel.default_speculation_cost
    adapter.speculation_cost = (0.2, 0.1)
    assert adapter.speculation_cost == (0.2, 0.1)
    adapter.speculation_cost = None  # back to the default
    assert adapter.speculation_cost == models.TransformersModel.default_speculation_cost


# --- cost curve: measured ----------------------------------------------------------------


def _check_curve(curve):
    assert curve.shape == (_calibration.MAX_TOKENS,) and curve.dtype == np.float64
    assert curve[0] == 1.0
    assert np.all(np.diff(curve) >= 0) and np.all(np.isfinite(curve))
    assert not curve.flags.writeable


def test_measured_curve_leaves_the_cache_consistent(tiny_lm):
    adapter = models.TransformersModel(tiny_lm)
    fresh = models.TransformersModel(tiny_lm)
    before = adapter.forward(np.array([PROMPT]), logits_to_keep=1)
    evaluated = adapter.n_evaluated_tokens, adapter.n_forward_calls
    _check_curve(adapter.cost_curve)
    assert adapter.cost_curve is adapter.cost_curve  # measured once
    np.testing.assert_array_equal(adapter.cached_tokens, PROMPT)
    assert (adapter.n_evaluated_tokens, adapter.n_forward_calls) == evaluated
    seq = np.array([PROMPT + [4, 6]])
    np.testing.assert_allclose(
        adapter.forward(seq, logits_to_keep=3), fresh.forward(seq, logits_to_keep=3), atol=1e-5
    )
    np.testing.assert_allclose(
        adapter.forward(np.array([PROMPT]), logits_to_keep=1), before, atol=1e-5
    )
    # With a curve, speculation_cost is fitted to it.
    assert adapter.speculation_cost == _calibration.fit_speculation_cost(adapter.cost_curve)


def test_measured_curve_from_an_empty_cache_leaves_it_empty(tiny_lm):
    adapter = models.TransformersModel(tiny_lm)
    _check_curve(adapter.cost_curve)
    assert adapter.cached_tokens.size == 0


def test_measured_curve_is_shared_per_model_and_setting(tiny_lm, monkeypatch):
    monkeypatch.setattr(_calibration, "_MEASURED", {})
    monkeypatch.setattr(tiny_lm.config, "name_or_path", "tiny-test-model")
    first = models.TransformersModel(tiny_lm).cost_curve
    calls = []
    original = _calibration.measure_cost_curve
    monkeypatch.setattr(
        _calibration, "measure_cost_curve", lambda *a: calls.append(a) or original(*a)
    )
    second = models.TransformersModel(tiny_lm)
    # The process's curve is known before any access: speculation_cost is fitted to it.
    assert second.speculation_cost == _calibration.fit_speculation_cost(first)
    assert second.cost_curve is first
    assert len(calls) == 1  # the lookup found the stored curve, no timing ran
    # A model without a name is never confused with another one.
    monkeypatch.setattr(tiny_lm.config, "name_or_path", "")
    assert models.TransformersModel(tiny_lm)._calibration_key() is None


# --- llama.cpp -----------------------------------------------------------------------------------


def test_llama_given_curve_and_key(smol, smollm2, no_calibration):
    adapter = models.LlamaCppModel(smol.llama, cost_curve=CURVE)
    np.testing.assert_array_equal(adapter.cost_curve, CURVE)
    key = adapter._calibration_key()
    assert str(smollm2) in key[1] and key[2:] == (smol.llama.n_threads, smol.llama.n_threads_batch)


def test_llama_measured_curve_leaves_the_cache_consistent(smol):
    smol.reset()
    prompt = smol.tokenize("Once upon a time, in a small village by the sea")
    before = smol.forward(np.array([prompt]), logits_to_keep=1)
    _check_curve(smol.cost_curve)
    np.testing.assert_array_equal(smol.cached_tokens, prompt)
    np.testing.assert_array_equal(smol.forward(np.array([prompt]), logits_to_keep=1), before)
    # The same Llama, thread setting and file: the stored curve, no new calibration.
    assert models.LlamaCppModel(smol.llama).cost_curve is smol.cost_curve


def test_llama_batch_invariance_checked_once_cache_consistent(smollm2):
    adapter = models.LlamaCppModel(smollm2, **LLAMA_KW)
    prompt = adapter.tokenize("The capital of France is")
    with warnings.catch_warnings():
        warnings.simplefilter("error", models.BatchVarianceWarning)
        if REQUIRE_MODELS:
            # CI and the README build llama-cpp-python with GGML_LLAMAFILE=OFF.
            first = adapter.forward(np.array([prompt]), logits_to_keep=2)
        else:
            warnings.simplefilter("ignore", models.BatchVarianceWarning)
            first = adapter.forward(np.array([prompt]), logits_to_keep=2)
    assert isinstance(adapter.batch_invariant, bool)
    if REQUIRE_MODELS:
        assert adapter.batch_invariant is True
    # Checked at the first call, before its evaluation: the counters and the cache
    # show only the user's call.
    assert adapter.n_evaluated_tokens == len(prompt) and adapter.n_forward_calls == 1
    np.testing.assert_array_equal(adapter.cached_tokens, prompt)
    fresh = models.LlamaCppModel(adapter.llama, min_eval_tokens=2)
    fresh._batch_invariant = True  # no second check
    fresh.reset()
    np.testing.assert_array_equal(fresh.forward(np.array([prompt]), logits_to_keep=2), first)


def _perturb_batches(adapter, monkeypatch):
    """Make the adapter's batched rows differ in the last bit, as a variant build does."""
    evaluate = adapter._evaluate

    def variant(seq, start, n_rows):
        rows = evaluate(seq, start, n_rows)
        if seq.shape[0] - start > 1:
            rows = np.nextafter(rows, np.float32(np.inf))
        return rows

    monkeypatch.setattr(adapter, "_evaluate", variant)


def test_llama_batch_variance_is_detected_and_warned_once(smol, monkeypatch):
    adapter = models.LlamaCppModel(smol.llama)
    _perturb_batches(adapter, monkeypatch)
    with pytest.warns(models.BatchVarianceWarning, match="GGML_LLAMAFILE=OFF") as record:
        adapter.forward(np.array([[5, 6, 7]]), logits_to_keep=1)
        adapter.forward(np.array([[5, 6, 7, 8]]), logits_to_keep=1)
    assert len(record) == 1 and "min_eval_tokens=2" in str(record[0].message)
    assert adapter.batch_invariant is False


def test_llama_batch_variance_without_warning_at_min_eval_tokens_2(smol, monkeypatch):
    adapter = models.LlamaCppModel(smol.llama, min_eval_tokens=2)
    _perturb_batches(adapter, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", models.BatchVarianceWarning)
        assert adapter.batch_invariant is False


def test_llama_computes_only_the_rows_asked_for(smol):
    smol.reset()
    prompt = smol.tokenize("Once upon a time, in a small village by the sea, there lived")
    last = smol.forward(np.array([prompt]), logits_to_keep=1)
    scores = smol.llama.scores
    assert np.all(np.isnan(scores[: len(prompt) - 1, 0]))  # never computed
    assert not np.isnan(scores[len(prompt) - 1, 0])
    evaluated = smol.n_evaluated_tokens
    three = smol.forward(np.array([prompt]), logits_to_keep=3)  # evaluates from L - 3
    assert smol.n_evaluated_tokens == evaluated + 3
    assert not np.isnan(three).any()
    judge = models.LlamaCppModel(smol.llama, min_eval_tokens=2)
    judge.reset()
    np.testing.assert_array_equal(three, judge.forward(np.array([prompt]), logits_to_keep=3))
    np.testing.assert_array_equal(three[:, -1], last[:, -1])
