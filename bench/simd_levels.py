"""The compiled decoder at every SIMD level against the reference loop, interleaved.

The pytest-benchmark suites (``bench_decoder.py``, ``bench_kernels.py``,
``bench_verification.py``) time every level too, but cell after cell; on a shared
machine the load moves between cells.  This script interleaves: each repeat runs the
reference loop once, then the compiled decoder at each level this CPU supports, token
and block verification, and ``np.exp`` over as many of the target's rows as a step
reads; the medians over the repeats give one table per level.

Cells: zero-cost table models (``specdec.toymodels.tables.make_pair``, acceptance
calibrated to about 0.8), gamma 4, temperature 1, 192 new tokens after a 16-token
prompt, V = 32,000 and 128,256, float32 logits.  Decoder time as in ``conftest.py``
(specdec's ``stats.decoder_time``; the reference's wall time minus its models' time).

Run::

    python3 setup.py build_ext --inplace -q
    PYTHONPATH=src python3 bench/simd_levels.py --repeats 7 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from specdec._backend import _use_simd_level  # private: levels switched at run time
from specdec.kernels import available_simd_levels
from specdec.measure import load_reference, reference_run, specdec_run
from specdec.toymodels.tables import make_pair

REFERENCE = (
    Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "speculative_decoding.py"
)
PROMPT = list(range(16))
GAMMA = 4
MAX_NEW_TOKENS = 192
SCHEMES = ("block", "token")


def cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def exp_per_step(table: np.ndarray, rows_per_step: float, probes: int = 5) -> float:
    """Median seconds of ``np.exp`` over ``rows_per_step`` table rows (moving position)."""
    rows = max(1, round(rows_per_step))
    out = np.empty((rows, table.shape[1]), dtype=table.dtype)
    times = []
    for k in range(probes):
        first = len(PROMPT) + (k * rows) % (table.shape[0] - len(PROMPT) - rows)
        start = time.perf_counter()
        np.exp(table[first : first + rows], out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / rows * rows_per_step


def measure(vocab_size: int, repeats: int, reference) -> dict:
    """Per (implementation, level, scheme): decoder seconds per token and per step."""
    draft, target, _ = make_pair(vocab_size, 0.8, len(PROMPT) + MAX_NEW_TOKENS, seed=0)
    levels = available_simd_levels()
    runs = {
        ("reference", "-", "token"): reference_run(
            reference, draft, target, PROMPT, MAX_NEW_TOKENS, GAMMA, seed=0
        )
    }
    for scheme in SCHEMES:
        run = specdec_run(
            draft,
            target,
            PROMPT,
            MAX_NEW_TOKENS,
            GAMMA,
            seed=0,
            backend="cython",
            verification=scheme,
        )
        for level in levels:
            runs[("cython", level, scheme)] = run
    samples: dict = {key: [] for key in runs}
    steps: dict = {}
    exp_samples = []
    loads = []
    for _ in range(repeats):
        loads.append(os.getloadavg()[0])
        for key, run in runs.items():
            if key[1] != "-":
                _use_simd_level(key[1])
            outcome = run()
            stats = outcome.stats
            samples[key].append(outcome.decoder / outcome.tokens)
            if key not in steps and key[0] == "cython":
                passes = stats.num_target_forward_passes
                rows = (stats.total_draft_tokens_proposed + outcome.tokens) / passes
                steps[key] = (outcome.tokens / passes, rows)
        exp_samples.append(exp_per_step(target.table, steps[("cython", levels[0], "token")][1]))
    _use_simd_level(levels[0])
    return {
        "vocab_size": vocab_size,
        "load": loads,
        "np_exp_s_per_step": statistics.median(exp_samples),
        "cells": {
            "/".join(key): {
                "s_per_token": statistics.median(values),
                "tokens_per_step": steps.get(key, (None, None))[0],
                "rows_per_step": steps.get(key, (None, None))[1],
            }
            for key, values in samples.items()
        },
    }


def tables(results: list) -> str:
    """One Markdown table per level: reference / compiled and step / np.exp."""
    lines = []
    levels = sorted(
        {key.split("/")[1] for r in results for key in r["cells"] if not key.startswith("ref")},
        key=["avx512", "avx2", "baseline"].index,
    )
    for level in levels:
        lines += [
            f"\n**{level}** (`SPECDEC_SIMD={level}`)\n",
            "| V | verification | reference / compiled | compiled us per token | "
            "step / np.exp over its rows |",
            "|---:|---|---:|---:|---:|",
        ]
        for r in results:
            ref = r["cells"]["reference/-/token"]["s_per_token"]
            for scheme in SCHEMES:
                cell = r["cells"][f"cython/{level}/{scheme}"]
                per_step = cell["s_per_token"] * cell["tokens_per_step"]
                exp_step = (
                    r["np_exp_s_per_step"]
                    / (r["cells"][f"cython/{level}/token"]["rows_per_step"])
                    * cell["rows_per_step"]
                )
                lines.append(
                    f"| {r['vocab_size']:,} | {scheme} | {ref / cell['s_per_token']:.1f}x | "
                    f"{cell['s_per_token'] * 1e6:.0f} | {per_step / exp_step:.2f} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 128_256])
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--json", type=Path, help="also write the raw medians here")
    args = parser.parse_args()
    reference = load_reference(args.reference)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = [measure(v, args.repeats, reference) for v in args.vocab]
    loads = [load for r in results for load in r["load"]]
    print(
        f"{cpu_name()}; levels {', '.join(available_simd_levels())}; {started}; "
        f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}; {args.repeats} "
        "interleaved repeats, medians; gamma 4, T = 1, acceptance ~0.8, float32"
    )
    print(tables(results))
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu_name(), "started": started, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
