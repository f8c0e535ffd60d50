"""The engine's input checks (``specdec._engine_inputs``): threads and lengths of ``verify_batch``.

Regression tests of issue 16 ("Bad input that still escapes"): each failed before its fix.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from specdec.engine import verify_batch

# -- verify_batch: threads and lengths (items 3 and 9) ---------------------------------------


def _one_hot_batch(batch, width=2, vocab=5):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(batch, width))
    target = rng.standard_normal((batch, width + 1, vocab))
    return ids, target


def test_verify_batch_caps_threads_at_the_cores(backend):
    ids, target = _one_hot_batch(64)
    result = verify_batch(
        ids, None, target, np.full(64, 2), temperature=0, n_threads=10**9, backend=backend
    )
    assert result.n_accepted.shape == (64,)
    pool = [t for t in threading.enumerate() if t.name.startswith("specdec-engine")]
    assert len(pool) <= max((os.cpu_count() or 1) - 1, 1)


def test_verify_batch_float_lengths_say_integers(backend):
    ids, target = _one_hot_batch(3)
    with pytest.raises(TypeError, match=r"lengths must hold integers \(draft lengths\), got dtype"):
        verify_batch(ids, None, target, [1.0, 2.0, 0.0], temperature=0, backend=backend)
    with pytest.raises(ValueError, match="lengths holds 18446744073709551615, beyond"):
        verify_batch(
            ids,
            None,
            target,
            np.array([1, 2, 2**64 - 1], np.uint64),
            temperature=0,
            backend=backend,
        )
