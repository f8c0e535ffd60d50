"""Zero-cost models, shared by ``specdec bench`` and the suites in bench/.

To measure what the *decoder* costs per token, the models must cost nothing:
:class:`TableModel` answers every forward pass with a view of a precomputed
logits table, so a run's wall time is the decoder's own (sampling, softmax,
acceptance tests, bookkeeping).  :func:`make_pair` builds a draft and a target
table whose per-token acceptance probability is calibrated to a requested
value, because how many tokens a step keeps changes how much work the decoder
does per generated token.

Its interface may change with the benchmarks.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "TableModel",
    "acceptance_probability",
    "make_pair",
    "pair_bytes",
]

# Spread of the draft's logits.  Normal logits with this scale give a
# distribution neither flat nor one-hot, like a language model's mid-sentence.
_DRAFT_SCALE = 2.0


class TableModel:
    """A model whose forward pass returns a view of a fixed ``(T, V)`` table.

    Row ``i`` of the table is the logits after position ``i`` whatever the
    tokens are, so a call costs a slice, and runs are deterministic.

    Parameters
    ----------
    table : numpy.ndarray, shape (T, V)
        Logits; sequences may be at most ``T`` tokens long.
    """

    def __init__(self, table: np.ndarray):
        self.table = table
        self.table.flags.writeable = False  # a decoder writing into it would corrupt later runs

    @property
    def vocab_size(self) -> int:
        """Number of token ids, ``V``."""
        return self.table.shape[1]

    def forward(self, ids, logits_to_keep: int | None = None) -> np.ndarray:
        """Return logits rows for a ``(1, L)`` sequence.

        Parameters
        ----------
        ids : array_like, shape (1, L)
            Only its length is used.
        logits_to_keep : int, optional
            Return only the last this many rows.

        Returns
        -------
        numpy.ndarray, shape (1, n, V)
            A read-only view of the table, rows ``L - n`` to ``L - 1``.
        """
        L = np.shape(ids)[-1]
        if L > self.table.shape[0]:
            raise ValueError(
                f"sequence of {L} tokens is longer than the table ({self.table.shape[0]} rows)"
            )
        n = L if logits_to_keep is None else logits_to_keep
        return self.table[None, L - n : L]


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def acceptance_probability(draft_logits: np.ndarray, target_logits: np.ndarray) -> np.ndarray:
    """Per-row probability that one draft token is accepted, at temperature 1.

    Parameters
    ----------
    draft_logits, target_logits : numpy.ndarray, shape (..., V)
        Logits of the two models for the same positions.

    Returns
    -------
    numpy.ndarray, shape (...)
        ``sum_x min(p(x), q(x))``, i.e. one minus the total-variation
        distance (Leviathan et al., 2023, the ``alpha`` of section 3.8).
    """
    return np.minimum(_softmax(draft_logits), _softmax(target_logits)).sum(axis=-1)


def make_pair(
    vocab_size: int,
    acceptance: float,
    length: int,
    *,
    seed: int = 0,
    calibration_rows: int = 4,
) -> tuple[TableModel, TableModel, dict]:
    """Build a zero-cost draft and target with a given acceptance probability.

    The draft's logits are i.i.d. normal; the target's are the draft's plus
    independent normal noise of scale ``sigma``, found by bisection on a few
    sample rows so that the mean per-token acceptance probability is
    *acceptance*.  (Over thousands of ids the probability barely varies from
    row to row, so a few rows suffice.)

    Parameters
    ----------
    vocab_size : int
        ``V``.
    acceptance : float
        Target per-token acceptance probability, in (0, 1).  The fraction of
        proposed drafts a decoder *keeps* is lower, since everything after a
        rejection is discarded: ``alpha (1 - alpha^gamma) / ((1 - alpha) gamma)``.
    length : int
        Rows in each table: the longest sequence the models will see.
    seed : int, optional
        Seed for the tables.
    calibration_rows : int, optional
        Rows used to calibrate ``sigma``.

    Returns
    -------
    draft, target : TableModel
    info : dict
        ``sigma`` and the achieved mean ``acceptance`` over the full tables.
    """
    if not 0.0 < acceptance < 1.0:
        raise ValueError("acceptance must lie strictly between 0 and 1")
    rng = np.random.default_rng(seed)
    draft = rng.standard_normal((length, vocab_size), dtype=np.float32) * _DRAFT_SCALE

    sample = draft[:calibration_rows]
    q = _softmax(sample)
    noise = rng.standard_normal(sample.shape, dtype=np.float32)

    def mean_acceptance(sigma: float) -> float:
        return float(
            np.minimum(q, _softmax(sample + np.float32(sigma) * noise)).sum(axis=-1).mean()
        )

    # Acceptance falls monotonically as sigma grows: widen the bracket until
    # the noise is strong enough, then bisect (25 halvings: far below the
    # row-to-row spread).
    lo, hi = 0.0, 1.0
    while mean_acceptance(hi) > acceptance:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"cannot reach acceptance {acceptance} with V = {vocab_size}")
    for _ in range(25):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_acceptance(mid) > acceptance else (lo, mid)
    sigma = 0.5 * (lo + hi)

    target = draft + np.float32(sigma) * rng.standard_normal(draft.shape, dtype=np.float32)
    achieved = float(acceptance_probability(draft[:16], target[:16]).mean())
    return TableModel(draft), TableModel(target), {"sigma": sigma, "acceptance": achieved}


def pair_bytes(vocab_size: int, length: int) -> int:
    """Peak memory :func:`make_pair` needs, in bytes: four float32 tables.

    The draft, its noise, the target's noise and the target exist at once
    while the target is built.

    Parameters
    ----------
    vocab_size, length : int
        As for :func:`make_pair`.

    Returns
    -------
    int
    """
    return 4 * length * vocab_size * np.dtype(np.float32).itemsize
