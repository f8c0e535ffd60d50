"""Pure-Python twin of the compiled kernels in ``_core.pyx``.

Same functions, same signatures, same decisions: every uniform is one
``rng.random()`` (one ``next_double``), drawn in the same order as the compiled
core, and the row laws are the same double-precision formulas (see ``_kernels.h``).
Used when ``SPECDEC_PUREPYTHON=1`` or when the extension was not built.
"""

from __future__ import annotations

import math

import numpy as np

from specdec._common import ALL_MASKED_LOGITS, NONFINITE_LOGITS, InvalidLogitsError


class Workspace:
    """Scratch state for the kernels (the NumPy twin allocates per call instead).

    Parameters
    ----------
    vocab_size : int
        Number of logits per row.
    """

    __slots__ = ("vocab_size",)

    def __init__(self, vocab_size: int):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size


def _row_max(row: np.ndarray, index: int) -> float:
    m = float(row.max())  # NaN propagates through max
    if not m < math.inf:
        raise InvalidLogitsError(index, NONFINITE_LOGITS)
    if m == -math.inf:
        raise InvalidLogitsError(index, ALL_MASKED_LOGITS)
    return m


def _weights(x: np.ndarray, law, inv_t: float) -> np.ndarray:
    """Unnormalised weights of a row (``x`` in float64) under ``law = (m, tau, zmin, ...)``."""
    z = (x - law[0]) * inv_t
    w = np.exp(z)
    w[(x < law[1]) | (z < law[2])] = 0.0
    return w


def _weight_at(value: float, law, inv_t: float) -> float:
    z = (value - law[0]) * inv_t
    if value < law[1] or z < law[2]:
        return 0.0
    return math.exp(z)


def _top_p_threshold(x: np.ndarray, w: np.ndarray, top_p: float) -> float:
    """The largest logit v such that tokens with logit >= v hold top_p of the mass."""
    z_kept = float(w.sum())
    # Same candidate cut as the compiled core: lighter tokens cannot hold the threshold.
    eps = 0.5 * (1.0 - top_p) * z_kept / len(x)
    candidates = (w > 0.0) & (w >= eps)
    values, weights = x[candidates], w[candidates]
    order = np.argsort(-values, kind="stable")
    cumulative = np.cumsum(weights[order])
    i = min(int(np.searchsorted(cumulative, top_p * z_kept, side="left")), len(values) - 1)
    return float(values[order[i]])


def _row_law(row: np.ndarray, index: int, inv_t: float, top_k: int, top_p: float,
             min_p: float):
    """(x, law, w): the row in float64, its law [m, tau, zmin, Z] and its weights."""
    m = _row_max(row, index)
    x = row.astype(np.float64)
    n = len(x)
    tau = -math.inf
    if 0 < top_k < n:
        tau = float(np.partition(x, n - top_k)[n - top_k])
    if top_p < 1.0:
        w_kept = _weights(x, (m, tau, -math.inf), inv_t)
        tau = max(tau, _top_p_threshold(x, w_kept, top_p))
    zmin = math.log(min_p) if min_p > 0.0 else -math.inf
    law = [m, tau, zmin, 0.0]
    w = _weights(x, law, inv_t)
    law[3] = float(w.sum())
    return x, law, w


def _pick(w: np.ndarray, u: float) -> int:
    """Inverse-CDF draw with one uniform; never an index of zero weight."""
    cdf = np.cumsum(w)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i >= len(w):  # rounding put u * total past the end
        i = int(np.flatnonzero(w)[-1])
    return i


def sample_token(logits, temperature, top_k, top_p, min_p, rng, law_out, work):
    """Draw one token from a row of logits under the sampling controls.

    Twin of ``specdec._core.sample_token``; see its docstring.
    """
    if len(logits) != work.vocab_size or len(law_out) < 4:
        raise ValueError("logits, law_out and work do not match in size")
    if temperature == 0.0:
        _row_max(logits, 0)
        return int(np.argmax(logits))
    _, law, w = _row_law(logits, 0, 1.0 / temperature, top_k, top_p, min_p)
    law_out[:4] = law
    return _pick(w, rng.random())


def verify(target_rows, draft_rows, draft_tokens, draft_laws, bonus, temperature, top_k,
           top_p, min_p, rng, work):
    """Verify a block of drafted tokens against the target's rows.

    Twin of ``specdec._core.verify``; see its docstring.
    """
    n_draft = len(draft_tokens)
    n = target_rows.shape[1]
    if (target_rows.shape[0] != n_draft + 1 or draft_rows.shape[0] < n_draft
            or draft_rows.shape[1] != n or len(draft_laws) < n_draft or n != work.vocab_size):
        raise ValueError("verify: the shapes of the rows, tokens, laws and work disagree")
    for token in draft_tokens:
        if not 0 <= token < n:
            raise ValueError(f"verify: draft token {token} is outside [0, {n})")

    if temperature == 0.0:
        for i in range(n_draft + 1):
            if i == n_draft and not bonus:
                return n_draft, -1
            _row_max(target_rows[i], i)
            best = int(np.argmax(target_rows[i]))
            if i == n_draft or draft_tokens[i] != best:
                return i, best

    inv_t = 1.0 / temperature
    for i in range(n_draft):
        x, law_p, w_p = _row_law(target_rows[i], i, inv_t, top_k, top_p, min_p)
        token = int(draft_tokens[i])
        law_q = draft_laws[i]
        p = w_p[token] / law_p[3]
        q = _weight_at(float(draft_rows[i, token]), law_q, inv_t) / law_q[3]
        if rng.random() * q < p:
            continue
        p_row = w_p * (1.0 / law_p[3])
        q_row = _weights(draft_rows[i].astype(np.float64), law_q, inv_t) * (1.0 / law_q[3])
        # A comparison, not a clamp of the difference: the support is exactly p > q.
        residual = np.where(p_row > q_row, p_row - q_row, 0.0)
        u = rng.random()
        if residual.sum() > 0.0:
            return i, _pick(residual, u)
        # p and q agree to rounding although the draft was rejected: the residual is
        # empty in floating point, so fall back on p itself.
        return i, _pick(w_p, u)
    if not bonus:
        return n_draft, -1
    _, _, w = _row_law(target_rows[n_draft], n_draft, inv_t, top_k, top_p, min_p)
    return n_draft, _pick(w, rng.random())
