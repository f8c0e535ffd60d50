"""The engine API's batched verification step (issue 12), against its yardsticks.

One cell per (B, k, V): B sequences with k drafts each (every length k), float32 rows:
target logits 2 N(0, 1) with a few tokens lifted by 6-12 (a peaked law), draft logits
= target + sigma N(0, 1) with sigma calibrated so that sum_x min(p, q) is about 0.7
(the expected acceptance of one draft), drafts drawn from the draft's law.  Per cell:

* ``engine-1``: ``specdec.engine.verify_batch(..., n_threads=1)``, the compiled core,
  draft logits (q computed under the controls), block verification;
* ``engine-all``: the same on every core (``n_threads=None``): the thread scaling is
  ``engine-1 / engine-all``;
* ``engine-token``: all cores, token verification (the scheme the yardsticks use);
* ``numpy``: ``numpy_verify_batch`` below, the same batched step vectorised in NumPy
  (softmax of every row, acceptance by comparing uniforms, residual draw by
  cumsum + searchsorted; token verification, one generator for the batch);
* ``reference`` (B = 1 cells and the FlashInfer cell): the reference loop's own
  verification path on one sequence's rows (``reference_step``: its ``_get_probs`` for
  q and each p it reads, a uniform per draft, its residual and ``_sample_from_probs``),
  i.e. what its ``generate`` does per step besides drafting and the models.

The FlashInfer cell (B = 16, k = 5, V = 32,000) is compared per sequence with the
figure FlashInfer publishes for ``chain_speculative_sampling`` on a B200 GPU: 27 us for
the batch, 1.7 us per sequence.  That is a GPU kernel on a data-centre GPU against two
CPU cores here: the ratio says how far a CPU step is from it, nothing more.

Sizes are configurable (comma-separated lists): ``SPECDEC_BENCH_ENGINE_B`` (default
1,8,64), ``SPECDEC_BENCH_ENGINE_K`` (4,8), ``SPECDEC_BENCH_ENGINE_V`` (32000,128256),
``SPECDEC_BENCH_ENGINE_ROUNDS`` (3).  The summary of ratios is printed at the end of
the module (and written to ``SPECDEC_BENCH_ENGINE_SUMMARY`` if set).  Run::

    PYTHONPATH=src python3 -m pytest bench/bench_engine.py --benchmark-only -p no:cacheprovider
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from specdec.engine import verify_batch


def _sizes(name, default):
    return tuple(int(v) for v in os.environ.get(name, default).split(",") if v.strip())


BATCHES = _sizes("SPECDEC_BENCH_ENGINE_B", "1,8,64")
DRAFTS = _sizes("SPECDEC_BENCH_ENGINE_K", "4,8")
VOCABS = _sizes("SPECDEC_BENCH_ENGINE_V", "32000,128256")
ROUNDS = _sizes("SPECDEC_BENCH_ENGINE_ROUNDS", "3")[0]
ACCEPTANCE = 0.7
SEED = 0

#: FlashInfer's published chain_speculative_sampling time on a B200 (B = 16, k = 5, V = 32k).
FLASHINFER_CELL = (16, 5, 32_000)
FLASHINFER_US = 27.0

#: The reference loop, beside the repository (never copied into it).
REFERENCE_FILE = (
    Path(__file__).resolve().parents[2] / "shared" / "reference" / "speculative_decoding.py"
)

CELLS = sorted(
    {(b, k, v) for b in BATCHES for k in DRAFTS for v in VOCABS} | {FLASHINFER_CELL},
    key=lambda c: (c[2], c[0], c[1]),
)
IMPLS = ("engine-1", "engine-all", "engine-token", "numpy", "reference")


# --- rows ------------------------------------------------------------------------------------


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _acceptance(target, sigma, noise):
    p, q = (
        _softmax(target.astype(np.float64)),
        _softmax((target + sigma * noise).astype(np.float64)),
    )
    return float(np.minimum(p, q).sum(axis=-1).mean())


_DATA: dict = {}


def cell_data(batch, k, vocab):
    """(ids, draft logits, target logits, sigma, acceptance) of a cell, cached (one cell)."""
    key = (batch, k, vocab)
    if key not in _DATA:
        _DATA.clear()
        rng = np.random.default_rng(SEED)
        target = rng.standard_normal((batch, k + 1, vocab), dtype=np.float32)
        target *= 2.0
        lifted = rng.integers(0, vocab, (batch, k + 1, 8))
        np.put_along_axis(
            target, lifted, rng.uniform(6.0, 12.0, lifted.shape).astype(np.float32), axis=2
        )
        noise = rng.standard_normal((batch, k, vocab), dtype=np.float32)
        # sigma for an acceptance of about ACCEPTANCE, by bisection on a few rows
        rows = min(4, batch * k)
        probe_t = target[:, :k].reshape(-1, vocab)[:rows]
        probe_n = noise.reshape(-1, vocab)[:rows]
        low, high = 0.0, 8.0
        for _ in range(12):
            sigma = (low + high) / 2
            if _acceptance(probe_t, sigma, probe_n) > ACCEPTANCE:
                low = sigma
            else:
                high = sigma
        acceptance = _acceptance(probe_t, sigma, probe_n)
        draft = noise  # in place: the largest cells hold two arrays, not three
        draft *= sigma
        draft += target[:, :k]
        # drafts drawn from the draft's law (inverse CDF, float64)
        ids = np.empty((batch, k), dtype=np.int64)
        u = rng.random((batch, k))
        for b in range(batch):
            for i in range(k):
                cdf = np.cumsum(_softmax(draft[b, i].astype(np.float64)))
                ids[b, i] = min(
                    int(np.searchsorted(cdf, u[b, i] * cdf[-1], side="right")), vocab - 1
                )
        _DATA[key] = (ids, draft, target, sigma, acceptance)
    return _DATA[key]


# --- the NumPy yardstick ---------------------------------------------------------------------


def numpy_verify_batch(ids, draft_logits, target_logits, lengths, rng):
    """The batched step (token verification, temperature 1) vectorised in NumPy.

    Returns (n_accepted, next_tokens).  Uniforms come from one generator for the whole
    batch (so, unlike the engine, a sequence's result depends on the batch)."""
    batch, k = ids.shape
    p = _softmax(target_logits)  # (B, k + 1, V)
    q = _softmax(draft_logits)  # (B, k, V)
    px = np.take_along_axis(p[:, :k], ids[..., None], axis=2)[..., 0]
    qx = np.take_along_axis(q, ids[..., None], axis=2)[..., 0]
    keep = rng.random((batch, k)) * qx < px
    keep &= np.arange(k) < lengths[:, None]
    # the kept prefix: the first position that is not kept (k if all are)
    n_accepted = np.where(keep.all(axis=1), k, np.argmin(keep, axis=1))
    n_accepted = np.minimum(n_accepted, lengths)
    rows = np.arange(batch)
    rejected = n_accepted < lengths
    at = np.minimum(n_accepted, k - 1) if k else n_accepted
    residual = np.maximum(p[rows, at] - q[rows, at], 0.0) if k else p[rows, 0]
    weights = np.where(rejected[:, None], residual, p[rows, n_accepted])
    cdf = np.cumsum(weights, axis=1)
    targets = rng.random(batch) * cdf[:, -1]
    next_tokens = np.array(
        [np.searchsorted(cdf[b], targets[b], side="right") for b in range(batch)]
    )
    return n_accepted, np.minimum(next_tokens, cdf.shape[1] - 1)


# --- the reference loop's verification path --------------------------------------------------


def _load_reference():
    if not REFERENCE_FILE.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_specdec_reference_bench", REFERENCE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_step(decoder, ids, draft_logits, target_logits):
    """One sequence's verification as the reference's ``generate`` performs it, with the
    reference instance's own ``_get_probs`` and ``_sample_from_probs``: q of each draft
    row (which its drafting computes), then per draft p, a uniform from NumPy's global
    state and the ratio test, on rejection the residual and a draw, else the bonus."""
    qs = [decoder._get_probs(row) for row in draft_logits]
    for i, token in enumerate(ids):
        p = decoder._get_probs(target_logits[i])
        alpha = min(1.0, float(p[token] / (qs[i][token] + 1e-12)))
        if np.random.uniform(0.0, 1.0) >= alpha:
            residual = np.maximum(0.0, p - qs[i])
            mass = residual.sum()
            return i, decoder._sample_from_probs(residual / mass if mass > 0 else p)
    return len(ids), decoder._sample_from_probs(decoder._get_probs(target_logits[len(ids)]))


# --- the cells -----------------------------------------------------------------------------------

_RESULTS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    """Write the ratios once every cell ran."""
    yield
    text = "\n".join(_summarize())
    path = os.environ.get("SPECDEC_BENCH_ENGINE_SUMMARY")
    if path:
        Path(path).write_text(text + "\n")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():  # shown even without -s
        print(text)


def _us(impl, cell):
    return _RESULTS.get((impl, cell), {}).get("us")


def _summarize():
    lines = [
        "",
        ("engine verify_batch (float32, draft logits, temperature 1): median us per call, ratios"),
    ]
    lines.append(
        f"{'B':>3} {'k':>2} {'V':>7}  {'1 thread':>10} {'all':>10} {'scaling':>7} "
        f"{'numpy':>10} {'numpy/all':>9} {'per seq':>8} {'ref/seq':>8} {'ref/all':>8} "
        f"{'kept':>5} {'cpu/wall':>8}"
    )
    for cell in CELLS:
        one, every, numpy_us = _us("engine-1", cell), _us("engine-all", cell), _us("numpy", cell)
        if every is None:
            continue
        batch = cell[0]
        ref = _us("reference", cell)
        kept = _RESULTS[("engine-all", cell)].get("kept", float("nan"))

        def fmt(x, spec):
            return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))

        lines.append(
            f"{batch:>3} {cell[1]:>2} {cell[2]:>7}  {fmt(one, '10.0f')} {fmt(every, '10.0f')} "
            f"{fmt(one / every if one else None, '7.2f')} {fmt(numpy_us, '10.0f')} "
            f"{fmt(numpy_us / every if numpy_us else None, '9.2f')} {every / batch:8.1f} "
            f"{fmt(ref, '8.0f')} {fmt(ref * batch / every if ref else None, '8.2f')} "
            f"{kept:5.2f} {_RESULTS[('engine-all', cell)]['busy']:8.2f}"
        )
    cell = FLASHINFER_CELL
    if _us("engine-all", cell):
        per_seq = _us("engine-all", cell) / cell[0]
        lines.append(
            f"FlashInfer chain_speculative_sampling, B200 GPU, B={cell[0]} k={cell[1]} "
            f"V={cell[2]}: {FLASHINFER_US} us per batch = {FLASHINFER_US / cell[0]:.2f} us per "
            f"sequence; specdec here (2 CPU cores): {per_seq:.1f} us per sequence "
            f"({per_seq / (FLASHINFER_US / cell[0]):.0f}x the GPU's)"
        )
    lines.append(
        "scaling = 1 thread / all cores; numpy/all = vectorised NumPy / engine on all "
        "cores; ref/all = the reference loop's verification path (per sequence x B) / "
        "engine on all cores; kept = mean drafts kept / k (block verification); cpu/wall = "
        "process CPU time / wall time of the all-core runs (about the cores kept busy)"
    )
    return lines


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("cell", CELLS, ids=[f"B{b}-k{k}-V{v}" for b, k, v in CELLS])
def test_verify_batch(benchmark, cell, impl):
    batch, k, vocab = cell
    if impl == "reference" and batch != 1 and cell != FLASHINFER_CELL:
        pytest.skip("the reference's per-sequence cost is timed on the B = 1 cells")
    ids, draft, target, sigma, acceptance = cell_data(batch, k, vocab)
    lengths = np.full(batch, k)
    benchmark.group = f"engine B={batch} k={k} V={vocab}"
    info = {
        "impl": impl,
        "batch": batch,
        "k": k,
        "vocab_size": vocab,
        "dtype": "float32",
        "sigma": sigma,
        "acceptance_one_draft": acceptance,
    }
    kept = []

    if impl.startswith("engine"):
        threads = 1 if impl == "engine-1" else None
        scheme = "token" if impl == "engine-token" else "block"
        rngs = [np.random.default_rng(SEED + b) for b in range(batch)]

        def once():
            result = verify_batch(
                ids, draft, target, lengths, rngs=rngs, n_threads=threads, verification=scheme
            )
            kept.append(result.n_accepted.mean() / k)

        info["n_threads"] = threads or os.cpu_count()
    elif impl == "numpy":
        rng = np.random.default_rng(SEED)

        def once():
            n_accepted, _ = numpy_verify_batch(ids, draft, target, lengths, rng)
            kept.append(n_accepted.mean() / k)
    else:
        module = _load_reference()
        if module is None:
            pytest.skip(f"reference loop not found at {REFERENCE_FILE}")
        decoder = module.SpeculativeDecoder(gamma=k, temperature=1.0)
        np.random.seed(SEED)

        def once():
            n_accepted, _ = reference_step(decoder, ids[0], draft[0], target[0])
            kept.append(n_accepted / k)

        info["per"] = "one sequence"

    times, cpu = [], []

    def timed():
        start, start_cpu = time.perf_counter(), time.process_time()
        once()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)

    benchmark.pedantic(timed, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    us = statistics.median(times[1:] or times) * 1e6
    # process CPU time over wall time: about n_threads when the threads really run
    # at once (less on a machine whose cores are taken by other work)
    busy = sum(cpu[1:] or cpu) / sum(times[1:] or times)
    info.update({"median_us": us, "kept_fraction": float(np.mean(kept)), "cpu_over_wall": busy})
    benchmark.extra_info.update(info)
    _RESULTS[(impl, cell)] = {"us": us, "kept": float(np.mean(kept)), "busy": busy}
