"""The verifier's buffers: the draft rows and the per-row views a draft model writes through."""

from __future__ import annotations

import numpy as np
import pytest

from specdec._validation import SamplingControls
from specdec._verifier import Verifier

VOCAB = 8


def _written_through_slots(buffers, rows: int, dtype) -> None:
    """Write rows 0..rows-1 through the slot views; they must land in ``draft_rows``."""
    law_slots, weight_rows = buffers.draft_slots(rows, dtype)
    for i in range(rows):
        weight_rows[i][:] = i + 1
        law_slots[i]["total"] = 10.0 * (i + 1)
    laws, weights = buffers.draft_rows(rows, dtype)
    for i in range(rows):
        assert (weights[i] == i + 1).all()
        assert laws[i]["total"] == 10.0 * (i + 1)


# the buffers are kept by the rows' dtype (``row.dtype``), a numpy.dtype
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def test_draft_slots_follow_the_buffers_as_they_grow(backend):
    buffers = Verifier(backend).workspace(VOCAB)
    _written_through_slots(buffers, 2, F32)
    # the weights of this dtype grow: the views must be remade
    _written_through_slots(buffers, 9, F32)
    # the laws, shared by every dtype, grow through another dtype: the float32 views of
    # the old laws must go too (without it the laws would be written to a dropped array)
    buffers.draft_rows(40, F64)
    _written_through_slots(buffers, 3, F32)
    _written_through_slots(buffers, 3, F64)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_sample_writes_its_law_to_the_slot_it_is_given(backend, dtype):
    verifier = Verifier(backend)
    buffers = verifier.workspace(VOCAB)
    buffers.draft_slots(1, dtype)  # views of small buffers, which the next call outgrows
    row = np.log(np.arange(1, VOCAB + 1, dtype=dtype))
    controls = SamplingControls()
    token = verifier.sample(
        row,
        slot=6,
        controls=controls,
        rng=np.random.default_rng(0),
        workspace=buffers,
        name_row=lambda row, reason: reason,
    )
    laws, weights = buffers.draft_rows(7, dtype)
    assert 0 <= token < VOCAB
    q = weights[6] / laws[6]["total"]
    np.testing.assert_allclose(q, np.arange(1, VOCAB + 1) / (VOCAB * (VOCAB + 1) / 2), rtol=1e-6)
