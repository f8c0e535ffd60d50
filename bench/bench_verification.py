"""Token-by-token vs block verification on the zero-cost calibrated tables.

Cells: V = 32,000, per-token acceptance calibrated to about 0.5 and 0.8
(``_benchmodels.make_pair``), gamma in {4, 8}, temperature 1, the compiled backend at
every SIMD level this CPU runs,
``verification`` in {"token", "block"}: both schemes in one run, on the same tables.

Recorded per cell (``extra_info``, and a table printed at the end of the run):

* ``tokens_per_pass``: new tokens per target pass, and ``kept_per_pass``: kept
  drafts per pass, both pooled over ``N_SEEDS`` seeded ``generate`` calls of
  ``MAX_NEW_TOKENS`` tokens (one seed is a few hundred passes: too noisy alone);
* ``us_per_token``: the timed rounds' median wall time per generated token (the
  table models cost next to nothing, so this is the decoder's own time).

Block verification can only keep more (Sun et al., Theorem 2); it computes one
residual pass per draft row, so its time per step is higher, and per token it wins
only when the extra kept tokens pay for that.  With real models the pass saved
dominates: the gain that matters is ``tokens_per_pass``.

Run (well under two minutes)::

    PYTHONPATH=src python3 -m pytest bench/bench_verification.py --benchmark-only -s
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from conftest import (
    PROMPT,
    SEED,
    SUMMARY_LINES,
    compiled_impls,
    kernels_or_fail,
    model_pair,
    simd_level_of,
)

from specdec import SpeculativeDecoder

VOCAB_SIZE = 32_000
ACCEPTANCES = (0.5, 0.8)
GAMMAS = (4, 8)
SCHEMES = ("token", "block")
MAX_NEW_TOKENS = 256
N_SEEDS = 8
ROUNDS = 5

# the compiled backend at every SIMD level this CPU runs ("cython" is the best one)
IMPLS = compiled_impls()
CELLS = [
    pytest.param(a, g, s, impl, id=f"a{a}-g{g}-{s}-{impl}")
    for a in ACCEPTANCES
    for g in GAMMAS
    for impl in IMPLS
    for s in SCHEMES
]


@pytest.mark.parametrize(("acceptance", "gamma", "verification", "impl"), CELLS)
def test_verification(benchmark, acceptance, gamma, verification, impl):
    kernels_or_fail("cython")
    draft, target, info = model_pair(VOCAB_SIZE, acceptance, len(PROMPT) + MAX_NEW_TOKENS)
    decoder = SpeculativeDecoder(gamma, 1.0, verification=verification, backend="cython")
    benchmark.group = f"verification V={VOCAB_SIZE} gamma={gamma} acceptance={acceptance}"

    tokens = passes = kept = 0
    for seed in range(N_SEEDS):
        _, stats = decoder.generate(draft, target, PROMPT, MAX_NEW_TOKENS, rng=SEED + seed)
        tokens += stats.total_tokens_generated
        passes += stats.num_target_forward_passes
        kept += stats.total_draft_tokens_accepted

    walls = []

    def once(rng):
        start = time.perf_counter()
        _, stats = decoder.generate(draft, target, PROMPT, MAX_NEW_TOKENS, rng=rng)
        walls.append((time.perf_counter() - start) / stats.total_tokens_generated)

    with simd_level_of(impl) as level:
        benchmark.pedantic(
            once,
            setup=lambda: ((), {"rng": np.random.default_rng(SEED)}),
            rounds=ROUNDS,
            warmup_rounds=1,
        )
    extra = {
        "kind": "verification",
        "verification": verification,
        "impl": impl,
        "simd_level": level,
        "vocab_size": VOCAB_SIZE,
        "gamma": gamma,
        "acceptance": acceptance,
        "acceptance_calibrated": round(info["acceptance"], 4),
        "tokens_per_pass": tokens / passes,
        "kept_per_pass": kept / passes,
        "us_per_token": statistics.median(walls[1:] or walls) * 1e6,
    }
    benchmark.extra_info.update(extra)
    if not SUMMARY_LINES:
        SUMMARY_LINES.append(
            f"token vs block verification, V={VOCAB_SIZE}, T=1, "
            f"{N_SEEDS} x {MAX_NEW_TOKENS} tokens per cell, compiled backend"
        )
        SUMMARY_LINES.append(
            f"{'acceptance':>10} {'gamma':>5} {'level':>8} {'scheme':>6} "
            f"{'tokens/pass':>11} {'kept/pass':>9} {'us/token':>9}"
        )
    SUMMARY_LINES.append(
        f"{acceptance:>10} {gamma:>5} {level:>8} {verification:>6} "
        f"{extra['tokens_per_pass']:>11.3f} {extra['kept_per_pass']:>9.3f} "
        f"{extra['us_per_token']:>9.1f}"
    )
