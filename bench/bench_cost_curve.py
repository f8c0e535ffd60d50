r"""The llama.cpp target's cost curve: a pass over k new tokens relative to one token.

Measures :attr:`specdec.models.LlamaCppModel.cost_curve` (the adapter's own
calibration: warm-up, interleaved rounds, medians) for SmolLM2-135M with
``--threads`` token threads (default: the usable cores, as the adapters) and each
batch-thread setting, the settings interleaved, and prints a Markdown table with the
load average before and after::

    PYTHONPATH=src python bench/bench_cost_curve.py --repeats 6

Each repeat is a fresh calibration (the per-process cache is cleared); a cell is
the median over the repeats, and the row under it the range (min-max): how far one
calibration, the one a process gets, may land from the median.  Also checks
``batch_invariant`` once per setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from specdec import models


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="n_threads (0: the usable cores)")
    parser.add_argument(
        "--batch-threads", default="0,1", help="n_threads_batch settings (0: as n_threads)"
    )
    args = parser.parse_args(argv)
    path = models.smollm2_path()
    settings = [int(t) for t in args.batch_threads.split(",")]
    threads = args.threads or models.usable_cores()
    adapters = {
        t: models.LlamaCppModel(
            path, n_ctx=512, n_threads=threads, n_threads_batch=t or threads, seed=0
        )
        for t in settings
    }
    invariant = {t: a.batch_invariant for t, a in adapters.items()}
    prompt = adapters[settings[0]].tokenize("Once upon a time, in a small village by the sea")
    load_before = _load()
    curves: dict = {t: [] for t in settings}
    one_ms: dict = {t: [] for t in settings}
    seconds: dict = {t: [] for t in settings}
    for _ in range(args.repeats):
        for t, adapter in adapters.items():
            adapter.forward(np.array([prompt]), logits_to_keep=1)  # a real context
            started = time.perf_counter()
            curves[t].append(adapter.recalibrate())
            seconds[t].append(time.perf_counter() - started)
            begin = time.perf_counter()
            for token in (11, 12, 13, 14, 15):
                adapter.forward(np.array([prompt + [token]]), logits_to_keep=1)
            one_ms[t].append((time.perf_counter() - begin) / 5 * 1e3)
    sizes = range(1, len(curves[settings[0]][0]) + 1)
    print(f"Load average before / after: {load_before} / {_load()}; {os.cpu_count()} cores; ")
    print(
        f"SmolLM2-135M Q4_1, llama-cpp-python, n_threads={threads}; median of "
        f"{args.repeats} calibrations per setting, interleaved, and their range.\n"
    )
    print(
        "| n_threads_batch | batch_invariant | one token (ms) | calibration (s) | "
        + " | ".join(f"k={k}" for k in sizes)
        + " |"
    )
    print("|---|---|---:|---:|" + "---:|" * len(sizes))
    for t, adapter in adapters.items():
        median = np.median(np.array(curves[t]), axis=0)
        low, high = np.min(curves[t], axis=0), np.max(curves[t], axis=0)
        label = f"{adapter.llama.n_threads_batch}" + (" (as n_threads)" if t == 0 else "")
        print(
            f"| {label} | {invariant[t]} | {statistics.median(one_ms[t]):.1f} | "
            f"{statistics.median(seconds[t]):.1f} | "
            + " | ".join(f"{v:.2f}" for v in median)
            + " |"
        )
        ranges = (f"{a:.2f}-{b:.2f}" for a, b in zip(low, high, strict=True))
        print("| range | | | | " + " | ".join(ranges) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
