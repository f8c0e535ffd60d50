"""Logits at the limits of their type and extreme temperatures: no warnings, same decisions.

The compiled core computes IEEE infinities and underflows silently; its NumPy twin must
too (not a RuntimeWarning, which ``python -W error`` turns into an exception on one backend
only), and both must make the same decisions.
"""

import warnings

import numpy as np
import pytest
from conftest import PURE_PYTHON

from specdec._backend import kernels_for
from specdec._common import LAW_DTYPE
from specdec._validation import SamplingControls

EXTREMES = {
    np.float32: [3.4e38, -3.4e38, 1e38, -1e38, 0.0, 1.0, -np.inf, 1e-45],
    np.float64: [1.7e308, -1.7e308, 1e300, -1e300, 0.0, 1.0, -np.inf, 5e-324],
}
CONTROLS = [{}, {"top_k": 2}, {"top_p": 0.5}, {"min_p": 0.1}]
V = 6


def decisions(kernels, rows, draft_rows, drafts, controls, seed, block):
    """(sample_token of row 0, verify with one-hot drafts, verify with model drafts)."""
    dtype = rows.dtype
    law, weights = np.zeros(1, LAW_DTYPE), np.empty(V, dtype)
    first = kernels.sample_token(
        rows[0], controls, np.random.default_rng(seed), law, weights, kernels.Workspace(V)
    )
    one_hot = kernels.verify(
        rows,
        drafts,
        None,
        None,
        True,
        controls,
        np.random.default_rng(seed),
        kernels.Workspace(V),
        block,
    )
    draft_weights, draft_laws = np.empty((len(drafts), V), dtype), np.zeros(len(drafts), LAW_DTYPE)
    kernels.row_laws(draft_rows, controls, draft_laws, draft_weights, kernels.Workspace(V))
    sampled = kernels.verify(
        rows,
        drafts,
        draft_weights,
        draft_laws,
        True,
        controls,
        np.random.default_rng(seed),
        kernels.Workspace(V),
        block,
    )
    return first, one_hot, sampled


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_extreme_logits_warn_nowhere_and_decide_alike(dtype):
    rng = np.random.default_rng(7)
    backends = ["python"] if PURE_PYTHON else ["python", "cython"]
    values = EXTREMES[dtype]
    finite = [v for v in values if np.isfinite(v)]
    compared = 0
    for trial in range(160):
        rows = rng.choice(values, size=(4, V)).astype(dtype)
        rows[:, 0] = rng.choice(finite, size=4)  # every row defines a law
        draft_rows = rows[::-1][:3].copy()
        drafts = rng.integers(0, V, 3)
        controls = SamplingControls.from_user(
            float(rng.choice([1e308, 1e30, 1.0, 0.5, 1e-30])), **CONTROLS[trial % 4]
        )
        outcomes = []
        for backend in backends:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a RuntimeWarning fails the test
                try:
                    outcomes.append(
                        decisions(
                            kernels_for(backend),
                            rows,
                            draft_rows,
                            drafts,
                            controls,
                            trial,
                            bool(trial % 2),
                        )
                    )
                except ValueError as error:  # a row of no law (EMPTY_LAW): the same on both
                    outcomes.append(type(error).__name__)
        assert all(o == outcomes[0] for o in outcomes), (rows, controls, outcomes)
        compared += isinstance(outcomes[0], tuple)
    assert compared > 100  # most cases decide, not raise
