"""Micro-benchmarks of the two kernels, both backends, with ``np.exp`` as the yardstick.

For V in {32,000, 128,256} and float32 / float64 logits (normal, scale 2), on the
compiled core (``specdec._core``) and its pure-Python twin (``specdec._fallback``):

* ``sample_token``: one draw from one row at temperature 1, no top-k/top-p/min-p;
* ``verify`` with gamma = 4 and ``bonus=True``, in its two extreme cases:

  - ``all-accepted``: the target rows equal the draft rows, so p(x) = q(x) and every
    draft is kept (u * q < p for every u in [0, 1)); verify computes the law of all
    five target rows and draws the bonus token from the last;
  - ``reject-first``: the first drafted token is the draft's most likely one, and the
    target's first row is the draft's with that logit lowered by 40 (p/q ~ e^-40):
    verify computes one row law, rejects, and draws from the residual
    max(0, p - q) of that row;

The compiled backend runs at every SIMD level this CPU supports: ``cython`` is the
best (default) level, ``cython@avx2`` and ``cython@baseline`` the lower ones.

* ``np.exp(row, out=buffer)`` over one row of the same dtype, the cost of touching
  V logits with one vectorised exponential.

The outcome of each verify case is checked once before timing (a wrong setup would
time a different path); no speed is asserted.  ``extra_info`` holds ``op``, ``case``,
``impl``, ``vocab_size``, ``dtype`` and ``rows``: the logits rows whose law the call
computes (1, gamma + 1 = 5, and 1 plus the residual pass).

Run::

    PYTHONPATH=src python3 -m pytest bench/bench_kernels.py --benchmark-only
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SEED, backend_of, compiled_impls, kernels_or_fail, simd_level_of

from specdec.kernels import LAW_DTYPE, SamplingControls

VOCAB_SIZES = (32_000, 128_256)
DTYPES = ("float32", "float64")
# the compiled backend at every SIMD level this CPU runs ("cython" is the best one)
BACKENDS = ("python", *compiled_impls())
GAMMA = 4
CONTROLS = SamplingControls(1.0)  # temperature 1, no top-k / top-p / min-p


def _info(benchmark, op, case, impl, vocab_size, dtype, rows):
    benchmark.group = f"kernels V={vocab_size} {dtype}"
    benchmark.extra_info.update(
        {
            "kind": "kernel",
            "op": op,
            "case": case,
            "impl": impl,
            "vocab_size": vocab_size,
            "dtype": dtype,
            "rows": rows,
            "gamma": GAMMA if op == "verify" else None,
        }
    )


def _logits(rng, rows, vocab_size, dtype):
    return (rng.standard_normal((rows, vocab_size)) * 2.0).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_sample_token(benchmark, vocab_size, dtype, backend):
    kernels = kernels_or_fail(backend_of(backend))
    rng = np.random.default_rng(SEED)
    row = _logits(rng, 1, vocab_size, dtype)[0]
    law, weights = np.zeros(1, LAW_DTYPE), np.empty(vocab_size, dtype=dtype)
    work = kernels.Workspace(vocab_size)
    _info(benchmark, "sample_token", "plain", backend, vocab_size, dtype, 1)
    with simd_level_of(backend):
        benchmark(kernels.sample_token, row, CONTROLS, rng, law, weights, work)


def _verify_inputs(kernels, vocab_size, dtype, case):
    """Draft rows sampled with the backend's own sample_token, and matching target rows."""
    rng = np.random.default_rng(SEED)
    draft_rows = _logits(rng, GAMMA, vocab_size, dtype)
    target_rows = _logits(rng, GAMMA + 1, vocab_size, dtype)
    work = kernels.Workspace(vocab_size)
    laws = np.zeros(GAMMA, LAW_DTYPE)
    weights = np.empty((GAMMA, vocab_size), dtype=dtype)
    tokens = np.empty(GAMMA, dtype=np.int64)
    for i in range(GAMMA):
        tokens[i] = kernels.sample_token(
            draft_rows[i], CONTROLS, rng, laws[i : i + 1], weights[i], work
        )
    if case == "all-accepted":
        target_rows[:GAMMA] = draft_rows
        expected = GAMMA
    else:
        # The first draft becomes the draft's most likely token (its law and weights
        # do not depend on which token was drawn), which the target nearly forbids.
        tokens[0] = int(np.argmax(draft_rows[0]))
        target_rows[0] = draft_rows[0]
        target_rows[0, tokens[0]] -= 40.0
        expected = 0
    n_accepted, token = kernels.verify(
        target_rows, tokens, weights, laws, True, CONTROLS, rng, work
    )
    if n_accepted != expected or token < 0:
        raise AssertionError(f"verify setup for {case!r} gave {(n_accepted, token)}")
    return target_rows, weights, tokens, laws, rng, work


@pytest.mark.parametrize("case", ("all-accepted", "reject-first"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_verify(benchmark, vocab_size, dtype, backend, case):
    kernels = kernels_or_fail(backend_of(backend))
    rows, weights, tokens, laws, rng, work = _verify_inputs(kernels, vocab_size, dtype, case)
    _info(
        benchmark,
        "verify",
        case,
        backend,
        vocab_size,
        dtype,
        GAMMA + 1 if case == "all-accepted" else 1,
    )
    with simd_level_of(backend):
        benchmark(kernels.verify, rows, tokens, weights, laws, True, CONTROLS, rng, work)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
def test_np_exp(benchmark, vocab_size, dtype):
    row = _logits(np.random.default_rng(SEED), 1, vocab_size, dtype)[0]
    out = np.empty_like(row)
    _info(benchmark, "np.exp", "one row", "numpy", vocab_size, dtype, 1)
    benchmark(np.exp, row, out=out)
