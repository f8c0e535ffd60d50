"""The adapters' cost curve and llama.cpp batch-invariance check (no test depends on a timing).

* ``cost_curve``: given curves are validated and used as they are; a measured one
  has the documented shape, is kept per process and setting, and leaves the cache
  consistent.
* ``LlamaCppModel.batch_invariant``: checked once at the first use, the cache left
  as it was, a ``BatchVarianceWarning`` when the build is not batch-invariant
  (simulated by perturbing batched rows), none with ``min_eval_tokens=2``.
* Only the wanted logit rows are computed by llama.cpp, the last evaluation's rows
  are reused while the cache holds their tokens (also when another adapter shares
  the ``Llama``), and a later call that wants more rows gets them right.

Skipped without the optional dependencies, unless ``SPECDEC_REQUIRE_MODELS=1``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import REQUIRE_MODELS, require_module, require_smollm2

from specdec import models
from specdec.drafters.cost import AFTERMATH_PASSES
from specdec.models import _calibration
from specdec.models._cached import PrefixCachedModel

VOCAB = 97
LLAMA_KW = dict(n_ctx=256, n_threads=1, seed=0, verbose=False)
CURVE = [1.0, 1.5, 1.9, 2.2, 2.6, 3.0]


@pytest.fixture(scope="module")
def tiny_lm():
    torch = require_module("torch")
    transformers = require_module("transformers")
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
    return require_smollm2()


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
    assert not adapter.cost_curve_measured


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ([], ValueError, "at least 2"),
        ([1.0], ValueError, "at least 2"),  # one point says nothing about a pass over two
        ([[1.0, 2.0]], ValueError, "1-D"),
        ([2.0, 3.0], ValueError, r"cost_curve\[0\] must be 1.0"),
        ([1.0, float("nan")], ValueError, "finite"),
        ([1.0, -1.0], ValueError, "> 0"),
        ("fast", TypeError, "cost_curve must be a cost curve: a 1-D sequence"),
    ],
)
def test_bad_cost_curve_is_a_clear_error(tiny_lm, bad, error, message):
    with pytest.raises(error, match=message):
        models.TransformersModel(tiny_lm, cost_curve=bad)


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
    # The process's curve is known before any access: reading it runs nothing.
    assert not second._cost_curve_pending()
    assert second.cost_curve is first
    assert len(calls) == 1  # the lookup found the stored curve, no timing ran
    # A model without a name is never confused with another one.
    monkeypatch.setattr(tiny_lm.config, "name_or_path", "")
    assert models.TransformersModel(tiny_lm)._calibration_key() is None


def test_recalibrate_measures_again_for_the_process(tiny_lm, monkeypatch):
    monkeypatch.setattr(_calibration, "_MEASURED", {})
    monkeypatch.setattr(tiny_lm.config, "name_or_path", "tiny-test-model")
    adapter = models.TransformersModel(tiny_lm)
    first = adapter.cost_curve
    again = adapter.recalibrate()
    assert again is not first and adapter.cost_curve is again
    assert models.TransformersModel(tiny_lm).cost_curve is again  # the process's curve now
    given = models.TransformersModel(tiny_lm, cost_curve=CURVE)
    with pytest.raises(ValueError, match="given at creation"):
        given.recalibrate()


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
    # Checked at the first call, before its evaluation: the counters and the cache
    # show only the user's call.
    assert adapter.n_evaluated_tokens == len(prompt) and adapter.n_forward_calls == 1
    np.testing.assert_array_equal(adapter.cached_tokens, prompt)
    fresh = models.LlamaCppModel(adapter.llama, min_eval_tokens=2)
    fresh._batch_invariant = True  # no second check
    fresh.reset()
    np.testing.assert_array_equal(fresh.forward(np.array([prompt]), logits_to_keep=2), first)
    # The check's answer is the build's: the same comparison made independently, through
    # forward on an adapter that skips the check (a batch of the last 4 positions
    # against the same positions evaluated one call each).
    assert len(prompt) > 4
    probe = models.LlamaCppModel(adapter.llama)
    probe._batch_invariant = True  # no check of its own
    probe.reset()
    batched = probe.forward(np.array([prompt]), logits_to_keep=4)[0]
    probe.reset()
    probe.forward(np.array([prompt[:-4]]), logits_to_keep=1)
    alone = [probe.forward(np.array([prompt[: k + 1]]), logits_to_keep=1)[0, 0] for k in
             range(len(prompt) - 4, len(prompt))]  # fmt: skip
    assert adapter.batch_invariant is bool(np.array_equal(batched, np.array(alone)))
    if REQUIRE_MODELS:
        assert adapter.batch_invariant is True


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
    evaluated = smol.n_evaluated_tokens
    np.testing.assert_array_equal(smol.forward(np.array([prompt]), logits_to_keep=1), last)
    assert smol.n_evaluated_tokens == evaluated  # the kept row, nothing evaluated
    three = smol.forward(np.array([prompt]), logits_to_keep=3)  # evaluates from L - 3
    assert smol.n_evaluated_tokens == evaluated + 3
    judge = models.LlamaCppModel(smol.llama, min_eval_tokens=2)
    judge.reset()
    np.testing.assert_array_equal(three, judge.forward(np.array([prompt]), logits_to_keep=3))
    np.testing.assert_array_equal(three[:, -1], last[:, -1])


def test_llama_rows_across_several_batches(smollm2, smol):
    # n_batch=64: a 150-token sequence is evaluated in three llama_decode calls, and
    # the 70 rows asked for start in the first of them.
    chunked = models.LlamaCppModel(smollm2, n_batch=64, **LLAMA_KW)
    chunked._batch_invariant = smol._batch_invariant = True  # not what is tested here
    seq = np.array([(np.arange(150) * 37 % 1000 + 10).tolist()])
    rows = chunked.forward(seq, logits_to_keep=70)
    assert chunked.n_evaluated_tokens == 150
    smol.reset()
    np.testing.assert_allclose(rows, smol.forward(seq, logits_to_keep=70), atol=1e-3)
    # Asking for all rows re-evaluates the ones never computed, across batches too.
    everything = chunked.forward(seq)
    assert chunked.n_evaluated_tokens == 300
    np.testing.assert_allclose(everything[:, -70:], rows, atol=1e-3)


def test_llama_kept_rows_are_not_reused_after_another_user_rewrote_the_cache(smol):
    # Two adapters share one Llama: B rewrites position L-1 with another token and
    # then the original one again through a batch; A's kept row for L-1 came from
    # the same tokens, so it may be reused, but a row of a different token may not.
    a = models.LlamaCppModel(smol.llama)
    b = models.LlamaCppModel(smol.llama)
    a._batch_invariant = b._batch_invariant = True
    a.reset()
    seq = [5, 17, 33, 2, 71, 9]
    a.forward(np.array([seq]), logits_to_keep=2)
    other = b.forward(np.array([seq[:-1] + [99]]), logits_to_keep=1)
    evaluated = a.n_evaluated_tokens
    again = a.forward(np.array([seq[:-1] + [99]]), logits_to_keep=1)  # all cached, by B
    assert a.n_evaluated_tokens == evaluated + 1  # A's kept row was for token 9: evaluated
    np.testing.assert_array_equal(again, other)


class _ClockedModel(PrefixCachedModel):
    """A cache model whose passes advance a virtual clock, as llama.cpp's did here:
    a pass over k new tokens takes 1 + 0.5 (k - 1) units, and a one-token pass right
    after a batch takes 0.5 more (the price of the batch, paid by the next pass)."""

    vocab_size = 8

    def __init__(self):
        super().__init__()
        self.clock = 0.0
        self._ids = np.zeros(0, dtype=np.int64)
        self._last = 1

    def _cached_ids(self):
        return self._ids

    def _first_to_evaluate(self, n_common, length, n_rows):
        return n_common

    def _roll_back(self, n_keep):
        self._ids = self._ids[:n_keep]

    def _evaluate(self, seq, start, n_rows):
        k = len(seq) - start
        if k:
            self.clock += 1.0 + 0.5 * (k - 1) + (0.5 if k == 1 and self._last > 1 else 0.0)
            self._last = k
        self._ids = np.array(seq, dtype=np.int64)
        return np.zeros((1, n_rows, self.vocab_size), dtype=np.float32)


def test_calibration_charges_a_batch_the_slower_pass_after_it(monkeypatch):
    """Each pass is timed between one-token passes, with the one after it: a batch's
    cost includes what it adds to the next pass, and the unit is a token after a token
    (timing each pass right after the previous size's batch made batches look cheap:
    2 tokens 1.0x here instead of 2.0x)."""
    model = _ClockedModel()
    monkeypatch.setattr(_calibration.time, "perf_counter", lambda: model.clock)
    curve = _calibration.measure_cost_curve(model, None)
    expected = [1.0] + [1.5 + 0.5 * (k - 1) for k in range(2, 17)]
    np.testing.assert_allclose(curve, expected)
    assert model.cached_tokens.size == 0  # the made-up context is dropped


class _ClockedTreeModel(_ClockedModel):
    """:class:`_ClockedModel` with one-pass trees that cost 0.3 units more than a chain
    of as many tokens (the cache keeps the prefix and the first branch)."""

    def forward_tree(self, prefix_ids, token_ids, parents):
        prefix = np.asarray(prefix_ids, dtype=np.int64)
        parents = np.asarray(parents)
        self._ids = self._ids[: min(len(self._ids), len(prefix) - 1)]
        k = len(prefix) - len(self._ids) + len(token_ids)
        self.clock += 1.0 + 0.5 * (k - 1) + 0.3
        self._last = k
        first = 1
        while first < len(parents) and parents[first] == first - 1:
            first += 1
        self._ids = np.concatenate([prefix, np.asarray(token_ids[:first], dtype=np.int64)])
        return np.zeros((len(token_ids) + 1, self.vocab_size), dtype=np.float32)


def test_tree_calibration_measures_the_tree_premium(monkeypatch):
    """Two-branch trees timed like chains: the curve holds the 0.3 a tree pass costs
    above a chain of as many tokens; a tree of one node is a chain."""
    monkeypatch.setattr(_calibration, "_MEASURED_TREES", {})
    model = _ClockedTreeModel()
    monkeypatch.setattr(_calibration.time, "perf_counter", lambda: model.clock)
    chain = _calibration.measure_cost_curve(model, None)
    tree = model.tree_cost_curve
    expected = [1.0, chain[1]] + [1.5 + 0.5 * (k - 1) + 0.3 for k in range(3, 17)]
    np.testing.assert_allclose(tree, expected)
    assert not tree.flags.writeable and model.tree_cost_curve is tree  # measured once
    assert model.cached_tokens.size == 0  # the made-up context is dropped


def test_tree_curve_given_or_priced_as_chains(tiny_lm, no_calibration, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a tree calibration was started")

    monkeypatch.setattr(_calibration, "measure_tree_cost_curve", refuse)
    given = models.TransformersModel(tiny_lm, cost_curve=CURVE, tree_cost_curve=[1.0, 1.5, 2.3])
    np.testing.assert_array_equal(given.tree_cost_curve, [1.0, 1.5, 2.3])
    # a given chain curve alone: no calibration, trees priced as chains
    assert models.TransformersModel(tiny_lm, cost_curve=CURVE).tree_cost_curve is None
    with pytest.raises(ValueError, match=r"tree_cost_curve\[0\] must be 1.0"):
        models.TransformersModel(tiny_lm, tree_cost_curve=[2.0, 3.0])
    assert _ClockedModel().tree_cost_curve is None  # no forward_tree: no tree curve


def test_measured_tree_curve_leaves_the_cache_consistent(tiny_lm, monkeypatch):
    monkeypatch.setattr(_calibration, "_MEASURED_TREES", {})
    adapter = models.TransformersModel(tiny_lm)
    fresh = models.TransformersModel(tiny_lm)
    adapter.forward(np.array([PROMPT]), logits_to_keep=1)
    evaluated = adapter.n_evaluated_tokens, adapter.n_forward_calls
    tree = adapter.tree_cost_curve
    assert (adapter.n_evaluated_tokens, adapter.n_forward_calls) == evaluated
    _check_curve(tree)
    assert np.all(tree >= adapter.cost_curve)  # never below a chain of as many tokens
    np.testing.assert_array_equal(adapter.cached_tokens, PROMPT)
    seq = np.array([PROMPT + [4, 6]])
    np.testing.assert_allclose(
        adapter.forward(seq, logits_to_keep=3), fresh.forward(seq, logits_to_keep=3), atol=1e-5
    )


class _InterruptedModel(_ClockedModel):
    """:class:`_ClockedModel` on a busy machine: one one-token pass in twelve, at random
    (fixed seed), takes 3 units more (another process held the core)."""

    def __init__(self):
        super().__init__()
        self.interruptions = np.random.default_rng(1)

    def _evaluate(self, seq, start, n_rows):
        if len(seq) - start == 1 and self.interruptions.random() < 1 / 12:
            self.clock += 3.0
        return super()._evaluate(seq, start, n_rows)


def test_a_pass_is_priced_without_the_noise_of_the_passes_after_it(monkeypatch):
    """The pass is timed alone and the slowdown after it fitted over the sizes: the
    interruptions of the six passes after each timed pass barely move the curve."""
    monkeypatch.setattr(_calibration, "TIME_BUDGET", 1e9)  # every round, on the virtual clock
    model = _InterruptedModel()
    monkeypatch.setattr(_calibration.time, "perf_counter", lambda: model.clock)
    curve = _calibration.measure_cost_curve(model, None)
    expected = np.array([1.0] + [1.5 + 0.5 * (k - 1) for k in range(2, 17)])
    assert np.abs(curve - expected).max() < 0.3
    # Power: the same timings priced as until 2026-12-06 (each size's pass and the six
    # after it, summed, less six one-token passes) miss by far more.
    sizes = _calibration.MEASURED_SIZES
    parts = _calibration._timed_rounds(model, None, "chain", [("chain", k) for k in sizes])
    totals = _calibration._totals(parts)
    sums = np.array([np.median(totals["chain", k]) for k in sizes])
    one = sums[0] / (AFTERMATH_PASSES + 1)
    summed = (sums - AFTERMATH_PASSES * one) / one
    assert np.abs(summed - expected[np.array(sizes) - 1]).max() > 0.6
