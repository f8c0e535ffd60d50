"""Pure-Python twin of the compiled kernels in ``_core.pyx``.

Same functions, same signatures, same decisions: every uniform is one
``rng.random()`` (one ``next_double``), drawn in the same order as the compiled
core, and the row laws are the same double-precision formulas (see ``_kernels.h``).
Used when ``SPECDEC_PUREPYTHON=1`` or when the extension was not built.
"""

from __future__ import annotations

import math

import numpy as np

from specdec._common import (ALL_MASKED_LOGITS, BLOCK_SIZE, EMPTY_LAW, NONFINITE_LOGITS,
                              SHIFT_LIMIT, InvalidLogitsError)


class Workspace:
    """Scratch state for the kernels (the NumPy twin allocates per call instead).

    Parameters
    ----------
    vocab_size : int
        Number of logits per row.
    """

    __slots__ = ("vocab_size",)

    def __init__(self, vocab_size: int):
        if not isinstance(vocab_size, (int, np.integer)):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
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


_F32, _F64 = np.float32, np.float64
_LOWEST = {np.dtype(_F32): _F32(-87.0), np.dtype(_F64): _F64(-708.0)}
_CEPHES_EXPF = [_F32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                  4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)]
_TAYLOR_12 = [_F64(1.0 / math.factorial(k)) for k in range(12, -1, -1)]


def _fmaf(a, b, c):
    """float32 fused multiply-add: exact product in float64, one add, round to float.

    Equals C's fmaf except when the float64 rounding of the sum lands on a float32
    tie (probability about 2^-29); see _kernels.h."""
    return (a.astype(_F64) * _F64(b) + _F64(c) if np.ndim(c) == 0 else
            a.astype(_F64) * _F64(b) + c.astype(_F64)).astype(_F32)


def _exp_f32(z):
    """``sd_exp_f32`` of _kernels.h, operation for operation."""
    magic = _F32(12582912.0)
    t = _fmaf(z, _F32(1.44269504088896341), magic)
    n = t - magic
    r = _fmaf(n, _F32(-0.693359375), z)
    r = _fmaf(n, _F32(2.12194440e-4), r)
    p = np.full_like(r, _CEPHES_EXPF[0])
    for coefficient in _CEPHES_EXPF[1:]:
        p = _fmaf(p, r, coefficient)
    p = (p.astype(_F64) * (r * r).astype(_F64) + r.astype(_F64)).astype(_F32)
    p = p + _F32(1.0)
    scale = ((t.view(np.uint32) - np.uint32(0x4B400000 - 127)) << np.uint32(23)).view(_F32)
    return p * scale


def _exp_f64(z):
    """``sd_exp_f64`` of _kernels.h, operation for operation (no FMA: exact twin)."""
    magic = _F64(6755399441055744.0)
    t = z * _F64(1.4426950408889634) + magic
    n = t - magic
    r = z - n * _F64(6.93145751953125e-1)
    r = r - n * _F64(1.42860682030941723212e-6)
    p = np.full_like(r, _TAYLOR_12[0])
    for coefficient in _TAYLOR_12[1:]:
        p = p * r + coefficient
    scale = ((t.view(np.uint64) - np.uint64(0x4338000000000000 - 1023)) << np.uint64(52)).view(_F64)
    return p * scale


def _weights(x: np.ndarray, law, inv_t: float) -> np.ndarray:
    """Unnormalised weights of a row under ``law = (m, tau, zmin, ...)``, in the row's
    dtype: ``sd_weight_*`` of _kernels.h."""
    real = x.dtype.type
    z = (x - real(law[0])) * real(inv_t)
    with np.errstate(all="ignore"):  # z = -inf or below the bound: masked below
        w = _exp_f32(z) if real is _F32 else _exp_f64(z)
    zlow = max(real(law[2]), _LOWEST[x.dtype])
    w[~((x >= real(law[1])) & (z >= zlow))] = 0.0
    return w


def _top_p_threshold(x: np.ndarray, w: np.ndarray, top_p: float) -> float:
    """The largest logit v such that tokens with logit >= v hold top_p of the mass.

    ``x`` and ``w`` in float64."""
    z_kept = float(w.sum())
    # Lighter tokens than eps cannot hold the threshold (see sd_top_p_threshold; the
    # compiled core gathers a superset of these candidates, with the same result).
    eps = 0.5 * (1.0 - top_p) * z_kept / len(x)
    candidates = (w > 0.0) & (w >= eps)
    values, weights = x[candidates], w[candidates]
    order = np.argsort(-values, kind="stable")
    cumulative = np.cumsum(weights[order])
    i = int(np.searchsorted(cumulative, top_p * z_kept, side="left"))
    if i == len(values):  # out of reach by rounding (top_p within rounding of 1)
        return -math.inf
    return float(values[order[i]])


def _row_law(row: np.ndarray, index: int, inv_t: float, top_k: int, top_p: float,
             min_p: float):
    """(law, w): the row's law [m, tau, zmin, Z] and its weights in float64.

    Without controls, m is the shift row_law in _core.pyx uses: the first block's
    maximum, unless the row's maximum lies more than SHIFT_LIMIT above it."""
    n = len(row)
    if not 0 < top_k < n and top_p >= 1.0 and min_p <= 0.0:
        shift = float(row[:BLOCK_SIZE].max())
        if -math.inf < shift < math.inf:
            m = _row_max(row, index)
            if (m - shift) * inv_t > SHIFT_LIMIT:
                shift = m
            law = [shift, -math.inf, -math.inf, 0.0]
            w = _weights(row, law, inv_t).astype(np.float64)
            law[3] = float(w.sum())
            if not law[3] > 0.0:
                raise InvalidLogitsError(index, EMPTY_LAW)
            return law, w
    m = _row_max(row, index)
    tau = -math.inf
    if 0 < top_k < n:
        tau = float(np.partition(row, n - top_k)[n - top_k])
    if top_p < 1.0:
        w_kept = _weights(row, (m, tau, -math.inf), inv_t).astype(np.float64)
        tau = max(tau, _top_p_threshold(row.astype(np.float64), w_kept, top_p))
    zmin = math.log(min_p) if min_p > 0.0 else -math.inf
    law = [m, tau, zmin, 0.0]
    w = _weights(row, law, inv_t).astype(np.float64)
    law[3] = float(w.sum())
    if not law[3] > 0.0:
        raise InvalidLogitsError(index, EMPTY_LAW)
    return law, w


def _pick(w: np.ndarray, u: float) -> int:
    """Inverse-CDF draw with one uniform; never an index of zero weight."""
    cdf = np.cumsum(w)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i >= len(w):  # rounding put u * total past the end
        i = int(np.flatnonzero(w)[-1])
    return i


def sample_token(logits, temperature, top_k, top_p, min_p, rng, law_out, weights_out, work):
    """Draw one token from a row of logits under the sampling controls.

    Twin of ``specdec._core.sample_token``; see its docstring.
    """
    if len(logits) != work.vocab_size or len(weights_out) != len(logits) or len(law_out) < 4:
        raise ValueError("logits, law_out, weights_out and work do not match in size")
    if weights_out.dtype != logits.dtype:
        raise ValueError("weights_out must have the dtype of logits")
    if temperature == 0.0:
        _row_max(logits, 0)
        return int(np.argmax(logits))
    law, w = _row_law(logits, 0, 1.0 / temperature, top_k, top_p, min_p)
    law_out[:4] = law
    weights_out[:] = w
    return _pick(w, rng.random())


def verify(target_rows, draft_weights, draft_tokens, draft_laws, bonus, temperature, top_k,
           top_p, min_p, rng, work):
    """Verify a block of drafted tokens against the target's rows.

    Twin of ``specdec._core.verify``; see its docstring.
    """
    n_draft = len(draft_tokens)
    if target_rows.ndim != 2 or draft_weights.ndim != 2 or np.ndim(draft_laws) != 2:
        raise ValueError("verify: target_rows, draft_weights and draft_laws must be 2-D")
    n = target_rows.shape[1]
    if (target_rows.shape[0] != n_draft + 1 or draft_weights.shape[0] < n_draft
            or draft_weights.shape[1] != n or len(draft_laws) < n_draft
            or np.shape(draft_laws)[1] < 4 or n != work.vocab_size):
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
        law_p, w_p = _row_law(target_rows[i], i, inv_t, top_k, top_p, min_p)
        token = int(draft_tokens[i])
        law_q = draft_laws[i]
        p = w_p[token] / law_p[3]
        q = float(draft_weights[i, token]) / law_q[3]
        if rng.random() * q < p:
            continue
        p_row = w_p * (1.0 / law_p[3])
        q_row = draft_weights[i].astype(np.float64) * (1.0 / law_q[3])
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
    _, w = _row_law(target_rows[n_draft], n_draft, inv_t, top_k, top_p, min_p)
    return n_draft, _pick(w, rng.random())
