"""Pure-Python twin of the compiled kernels in ``_core.pyx``.

Same functions, same signatures, same decisions: every uniform is one
``rng.random()`` (one ``next_double``), drawn in the same order as the compiled
core, and the row laws are the same double-precision formulas (see ``_kernels.h``).
Used when ``SPECDEC_PUREPYTHON=1`` or when the extension was not built.

Why one module past 500 lines: it mirrors ``_core.pyx`` function by function (and
carries the kernels' docstrings for both), so that the two are read side by side.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from specdec._common import (
    ALL_MASKED_LOGITS,
    BLOCK_SIZE,
    EMPTY_LAW,
    EXP_LOWEST_F32,
    EXP_LOWEST_F64,
    NONFINITE_LOGITS,
    SHIFT_LIMIT,
    InvalidLogitsError,
    check_apart,
    check_laws,
    check_row_laws_args,
    check_tree_args,
    check_verify_args,
)
from specdec._validation import SamplingControls


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


class _Law(NamedTuple):
    """A row law (the fields of LAW_DTYPE)."""

    shift: float
    tau: float
    zmin: float
    total: float


def _controls(controls):
    """(inv_t, top_k, top_p, min_p) of a SamplingControls, inv_t = inf for greedy."""
    if not isinstance(controls, SamplingControls):
        raise TypeError(
            "controls must be a specdec._validation.SamplingControls, got "
            f"{type(controls).__name__}"
        )
    t = controls.temperature
    return (math.inf if t == 0.0 else 1.0 / t), controls.top_k, controls.top_p, controls.min_p


def _row_max(row: np.ndarray, index: int) -> float:
    m = float(row.max())  # NaN propagates through max
    if not m < math.inf:
        raise InvalidLogitsError(index, NONFINITE_LOGITS)
    if m == -math.inf:
        raise InvalidLogitsError(index, ALL_MASKED_LOGITS)
    return m


_F32, _F64 = np.float32, np.float64
_LOWEST = {np.dtype(_F32): _F32(EXP_LOWEST_F32), np.dtype(_F64): _F64(EXP_LOWEST_F64)}
_CEPHES_EXPF = [
    _F32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
]
_CEPHES_EXPF_F64 = [_F64(c) for c in _CEPHES_EXPF]
_TAYLOR_12 = [_F64(1.0 / math.factorial(k)) for k in range(12, -1, -1)]


def _fmaf(a, b, c):
    """float32 fused multiply-add: exact product in float64, one add, round to float.

    Equals C's fmaf except when the float64 rounding of the sum lands on a float32
    tie (probability about 2^-29); see _kernels.h.
    """
    return (
        a.astype(_F64) * _F64(b) + _F64(c)
        if np.ndim(c) == 0
        else a.astype(_F64) * _F64(b) + c.astype(_F64)
    ).astype(_F32)


#: Whether the float exp's multiply-adds are fused, as at the compiled core's FMA
#: levels (and in a pure-Python install); _backend.py clears it while the core runs a
#: level without FMA (x86-64's baseline), so that the twin computes that level's weights.
FUSED_F32 = True


def _exp_f32(z):
    """``sd_exp_f32`` of _kernels.h, operation for operation."""
    return _exp_f32_fused(z) if FUSED_F32 else _exp_f32_unfused(z)


def _exp_f32_fused(z):
    magic = _F32(12582912.0)
    t = _fmaf(z, _F32(1.44269504088896341), magic)
    n = t - magic
    r = _fmaf(n, _F32(-0.693359375), z)
    r = _fmaf(n, _F32(2.12194440e-4), r)
    # Horner's steps as _fmaf(p, r, c), with r widened once instead of at every step.
    r64 = r.astype(_F64)
    p = np.full_like(r, _CEPHES_EXPF[0])
    for coefficient in _CEPHES_EXPF_F64[1:]:
        p = (p.astype(_F64) * r64 + coefficient).astype(_F32)
    p = (p.astype(_F64) * (r * r).astype(_F64) + r64).astype(_F32)
    return _scale_f32(p + _F32(1.0), t)


def _exp_f32_unfused(z):
    # each multiply-add as two float32 operations, each rounded (SD_FMAF without FMA)
    magic = _F32(12582912.0)
    t = z * _F32(1.44269504088896341) + magic
    n = t - magic
    r = n * _F32(-0.693359375) + z
    r = n * _F32(2.12194440e-4) + r
    p = np.full_like(r, _CEPHES_EXPF[0])
    for coefficient in _CEPHES_EXPF[1:]:
        p = p * r + coefficient
    p = p * (r * r) + r
    return _scale_f32(p + _F32(1.0), t)


def _scale_f32(p, t):
    """Scale p by 2^n, n read from the bits of t (the rounding constant plus n)."""
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


def _weights(x: np.ndarray, shift: float, tau: float, zmin: float, inv_t: float) -> np.ndarray:
    """Unnormalised weights of a row under a law (shift, tau, zmin), in its dtype.

    ``sd_weight_*`` of _kernels.h.
    """
    real = x.dtype.type
    # Logits near the type's limits overflow x - shift to -inf, and a huge temperature
    # underflows inv_t: IEEE results the C kernel computes silently too, masked below.
    with np.errstate(all="ignore"):
        z = (x - real(shift)) * real(inv_t)
        w = _exp_f32(z) if real is _F32 else _exp_f64(z)
    zlow = max(real(zmin), _LOWEST[x.dtype])
    w[~((x >= real(tau)) & (z >= zlow))] = 0.0
    return w


def _top_p_threshold(x: np.ndarray, w: np.ndarray, top_p: float) -> float:
    """The largest logit v such that tokens with logit >= v hold top_p of the mass.

    ``x`` and ``w`` in float64.
    """
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


def _row_law(row: np.ndarray, index: int, inv_t: float, top_k: int, top_p: float, min_p: float):
    """(law, w): the row's ``_Law`` and its weights (row's dtype) in float64.

    Without controls, m is the shift row_law in _core.pyx uses: the first block's
    maximum, unless the row's maximum lies more than SHIFT_LIMIT above it.
    """
    n = len(row)
    if not 0 < top_k < n and top_p >= 1.0 and min_p <= 0.0:
        shift = float(row[:BLOCK_SIZE].max())
        if -math.inf < shift < math.inf:
            m = _row_max(row, index)
            if (m - shift) * inv_t > SHIFT_LIMIT:
                shift = m
            w = _weights(row, shift, -math.inf, -math.inf, inv_t).astype(np.float64)
            total = float(w.sum())
            if not total > 0.0:
                raise InvalidLogitsError(index, EMPTY_LAW)
            return _Law(shift, -math.inf, -math.inf, total), w
    m = _row_max(row, index)
    tau = -math.inf
    if 0 < top_k < n:
        tau = float(np.partition(row, n - top_k)[n - top_k])
    if top_p < 1.0:
        w_kept = _weights(row, m, tau, -math.inf, inv_t).astype(np.float64)
        tau = max(tau, _top_p_threshold(row.astype(np.float64), w_kept, top_p))
    zmin = math.log(min_p) if min_p > 0.0 else -math.inf
    w = _weights(row, m, tau, zmin, inv_t).astype(np.float64)
    total = float(w.sum())
    if not total > 0.0:
        raise InvalidLogitsError(index, EMPTY_LAW)
    return _Law(m, tau, zmin, total), w


def _residual(w_p, total_p, scale, q_weights, q_total) -> np.ndarray:
    """max(0, scale p - q) with p = w_p / total_p and q = q_weights / q_total, in float64.

    ``sd_residual_block`` of _residual_template.h.
    """
    p_row = w_p * (scale / total_p)
    q_row = q_weights.astype(np.float64) * (1.0 / float(q_total))
    # A comparison, not a clamp of the difference: the support is exactly p > q.
    return np.where(p_row > q_row, p_row - q_row, 0.0)


def _pick(w: np.ndarray, u: float) -> int:
    """Inverse-CDF draw with one uniform; never an index of zero weight."""
    cdf = np.cumsum(w)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i >= len(w):  # rounding put u * total past the end
        i = int(np.flatnonzero(w)[-1])
    return i


def sample_token(logits, controls, rng, law_out, weights_out, work):
    """Draw one token from a row of logits under the sampling controls.

    Parameters
    ----------
    logits : ndarray of float32 or float64, shape (V,), C-contiguous
        One row of logits.
    controls : specdec._validation.SamplingControls
        Temperature (0: greedy, the lowest id among the maxima, no uniform drawn),
        top-k, top-p and min-p.
    rng : numpy.random.Generator
        Source of the one uniform drawn.
    law_out : ndarray of LAW_DTYPE, shape (1,)
        Receives the row law (unset for greedy).
    weights_out : ndarray of the logits' dtype, shape (V,)
        Receives the row's unnormalised weights: the draft law q is
        ``weights_out / law_out[0]["total"]``, which ``verify`` needs (unset for greedy).
    work : Workspace
        Scratch memory for ``V`` logits.

    Returns
    -------
    int
        The token id, always one of positive probability.

    Raises
    ------
    InvalidLogitsError
        The row holds NaN or +inf, or only -inf, or (for a temperature whose
        inverse overflows the logits' type) no token of positive weight.
    """
    inv_t, top_k, top_p, min_p = _controls(controls)
    if logits.dtype not in (np.float32, np.float64):  # the core's fused types: a TypeError
        raise TypeError(f"logits must be float32 or float64, got {logits.dtype}")
    check_laws(law_out, "law_out", 1)
    if len(logits) != work.vocab_size or len(weights_out) != len(logits):
        raise ValueError("logits, law_out, weights_out and work do not match in size")
    if weights_out.dtype != logits.dtype:
        raise ValueError("weights_out must have the dtype of logits")
    check_apart("sample_token", logits, weights_out, law_out)
    if inv_t == math.inf:
        _row_max(logits, 0)
        return int(np.argmax(logits))
    law, w = _row_law(logits, 0, inv_t, top_k, top_p, min_p)
    law_out[0] = law
    weights_out[:] = w
    return _pick(w, rng.random())


def row_laws(rows, controls, laws_out, weights_out, work):
    """The law and the weights of each of n rows under the sampling controls.

    Draws nothing: this is what ``verify`` needs of draft logits that were not
    sampled by ``sample_token``.

    Parameters
    ----------
    rows : ndarray of float32 or float64, shape (n, V), C-contiguous
        Logits rows.
    controls : specdec._validation.SamplingControls
        The sampling controls (temperature 0: the rows are only checked; laws and
        weights are left unset, as greedy verification reads neither).
    laws_out : ndarray of LAW_DTYPE, shape (>= n,)
        Receives the law of each row.
    weights_out : ndarray of the rows' dtype, shape (>= n, V), C-contiguous
        Receives each row's unnormalised weights (q = weights / law["total"]).
    work : Workspace
        Scratch memory for ``V`` logits.

    Raises
    ------
    TypeError, ValueError
        Arguments of the wrong type, dtype or shape.
    InvalidLogitsError
        A row defines no law; ``row`` says which.
    """
    check_row_laws_args(rows, laws_out, weights_out, work.vocab_size)
    inv_t, top_k, top_p, min_p = _controls(controls)
    for i, row in enumerate(rows):
        if inv_t == math.inf:
            _row_max(row, i)
            continue
        law, w = _row_law(row, i, inv_t, top_k, top_p, min_p)
        laws_out[i] = law
        weights_out[i] = w


def verify(
    target_rows, draft_tokens, draft_weights, draft_laws, bonus, controls, rng, work, block=False
):
    """Verify a block of drafted tokens against the target's rows.

    Token by token (``block=False``, Leviathan et al. 2023): keeps each draft token
    x with probability min(1, p(x) / q(x)) (the test is ``u * q(x) < p(x)``, so a
    token with p(x) = 0 is never kept, even with u = 0); at the first rejection
    draws from norm(max(0, p - q)) of that row; when every draft is kept and
    ``bonus`` is true, draws one more token from the last row.

    Parameters
    ----------
    target_rows : ndarray of float32 or float64, shape (n + 1, V), C-contiguous
        The target's logits at the positions predicting each draft token and the
        bonus token: row i predicts ``draft_tokens[i]``.
    draft_tokens : ndarray of int64, shape (n,)
        The drafted tokens.
    draft_weights : ndarray of float32 or float64, shape (>= n, V), or None
        The weights ``sample_token`` (or ``row_laws``) returned for each draft token;
        None (with ``draft_laws`` None) for one-hot drafts.  Unused for greedy.
    draft_laws : ndarray of LAW_DTYPE, shape (>= n,), or None
        The laws that came with ``draft_weights``: q_i = draft_weights[i] /
        draft_laws[i]["total"].
    bonus : bool
        Whether to draw a bonus token when every draft is kept.
    controls : specdec._validation.SamplingControls
        As for ``sample_token``; the same controls must have made the drafts.
    rng, work
        As for ``sample_token``.
    block : bool, default False
        Block verification instead of token by token.

    Returns
    -------
    n_accepted : int
        Length of the kept prefix of ``draft_tokens``.
    token : int
        The residual token (after a rejection), the bonus token, or -1.

    Raises
    ------
    TypeError, ValueError
        Arguments of the wrong type, dtype or shape, or a draft token outside [0, V).
    InvalidLogitsError
        A target row that the decision needed holds no law; ``row`` says which.
    """
    check_verify_args(target_rows, draft_tokens, draft_weights, draft_laws, block, work.vocab_size)
    inv_t, top_k, top_p, min_p = _controls(controls)
    n_draft = len(draft_tokens)
    if inv_t == math.inf:
        for i in range(n_draft + 1):
            if i == n_draft and not bonus:
                return n_draft, -1
            _row_max(target_rows[i], i)
            best = int(np.argmax(target_rows[i]))
            if i == n_draft or draft_tokens[i] != best:
                return i, best
    laws = [None] * (n_draft + 1)  # (law, weights) of each target row, when computed

    def row(i):
        if laws[i] is None:
            laws[i] = _row_law(target_rows[i], i, inv_t, top_k, top_p, min_p)
        return laws[i]

    one_hot = draft_weights is None
    q_totals = None if one_hot else draft_laws["total"]

    def q_of(i, x):
        """q(x) of draft row i (1 for one-hot drafts)."""
        return 1.0 if one_hot else float(draft_weights[i, x]) / float(q_totals[i])

    def residual(i, scale):
        """Residual weights of target row i at prefix ratio ``scale``.

        max(0, scale p - q); for one-hot drafts p without the draft token (scale cancels).
        """
        law_p, w_p = row(i)
        if one_hot:
            rest = w_p.copy()
            rest[int(draft_tokens[i])] = 0.0
            return rest
        return _residual(w_p, law_p.total, scale, draft_weights[i], q_totals[i])

    def residual_draw(i, scale, u):
        weights = residual(i, scale)
        if weights.sum() > 0.0:
            return _pick(weights, u)
        # p and q agree to rounding although the draft was rejected: the residual is
        # empty in floating point, so fall back on p itself.
        return _pick(row(i)[1], u)

    if block:
        n_accepted, ratios = _block_length(n_draft, draft_tokens, row, q_of, residual, one_hot, rng)
        if n_accepted < n_draft:
            return n_accepted, residual_draw(n_accepted, ratios[n_accepted], rng.random())
    else:
        for i in range(n_draft):
            law_p, w_p = row(i)
            x = int(draft_tokens[i])
            p = w_p[x] / law_p.total
            u = rng.random()
            # one-hot q: keep x with probability p(x) (u < p(x): never when p(x) = 0)
            if (u < p) if one_hot else (u * q_of(i, x) < p):
                continue
            return i, residual_draw(i, 1.0, rng.random())
    if not bonus:
        return n_draft, -1
    _, w = row(n_draft)
    return n_draft, _pick(w, rng.random())


def _block_length(n_draft, draft_tokens, row, q_of, residual, one_hot, rng):
    """(tau, ratios) of block verification (Sun et al., ICLR 2025, Algorithm 2).

    ratios[i] = p_i for the rows read; see ``verify_block_nogil`` in _core.pyx for the
    algorithm and the conventions.
    """
    etas = [rng.random() for _ in range(n_draft)]
    ratios = [1.0] * (n_draft + 1)
    ratio, tau = 1.0, 0
    for i in range(n_draft):
        if ratio == 0.0:  # p_i = 0: every later h is 0, the rows after it are not read
            return tau, ratios
        law, w = row(i)
        x = int(draft_tokens[i])
        ratios[i] = ratio
        if i >= 1:
            if one_hot:
                mass = ratio * ((law.total - w[x]) / law.total)
            else:
                mass = float(residual(i, ratio).sum())
            denom = mass + (1.0 - ratio)
            h = mass / denom if denom > 0.0 else 1.0
            if etas[i - 1] < h:
                tau = i
        t = ratio * (w[x] / law.total)
        qx = q_of(i, x)
        ratio = 0.0 if t == 0.0 else (1.0 if t >= qx else t / qx)
    if n_draft > 0 and etas[n_draft - 1] < ratio:
        tau = n_draft
    return tau, ratios


def verify_tree(
    target_rows, draft_tokens, parents, draft_weights, draft_laws, controls, rng, work, path_out
):
    """Verify a tree of drafted tokens: keep one path from the root, then draw a token.

    Multi-step speculative sampling (SpecInfer, Miao et al. 2024).  At each node
    (the root first), the current law p starts as the target's row law; the node's
    children are tried in index order, one uniform u each: child x is kept when
    ``u * q(x) < p(x)`` (``u < p(x)`` for one-hot drafts) and the walk descends to
    it; after a rejection p becomes norm(max(0, p - q)) (one-hot: p without x).
    When no child is kept, one more uniform draws the next token from the current p
    (from the target's law itself at a leaf).  A chain (every node has at most one
    child) makes exactly the decisions of token-by-token ``verify``.  Exact when
    siblings are independent draws from their draft laws.

    Parameters
    ----------
    target_rows : ndarray of float32 or float64, shape (n + 1, V), C-contiguous
        The target's logits: row 0 at the root, row i + 1 after node i.
    draft_tokens : ndarray of int64, shape (n,)
        Each node's token.
    parents : ndarray of int64, shape (n,)
        Each node's parent: -1 for a child of the root, else an earlier node
        (``parents[i] < i``).
    draft_weights : ndarray of float32 or float64, shape (>= n, V), or None
        Row i: the weights of the law node i was drawn from (siblings carry the same
        law), as ``sample_token`` or ``row_laws`` returned them; None (with
        ``draft_laws`` None) for one-hot drafts.  Unused for greedy.
    draft_laws : ndarray of LAW_DTYPE, shape (>= n,), or None
        The laws that came with ``draft_weights``.
    controls : specdec._validation.SamplingControls
        As for ``sample_token``; temperature 0 descends to the child equal to the
        target's argmax (the lowest id among its maxima), drawing nothing.
    rng, work
        As for ``sample_token``.
    path_out : ndarray of int64, shape (>= n,), writeable
        Receives the kept nodes' indices, root to leaf, in its first ``depth`` entries.

    Returns
    -------
    depth : int
        Number of kept nodes.
    token : int
        The token drawn after the last kept node.

    Raises
    ------
    TypeError, ValueError
        Arguments of the wrong type, dtype or shape, a token outside [0, V), or a
        parent outside [-1, i).
    InvalidLogitsError
        A target row that the walk read holds no law; ``row`` says which.
    """
    check_tree_args(
        target_rows, draft_tokens, parents, draft_weights, draft_laws, path_out, work.vocab_size
    )
    inv_t, top_k, top_p, min_p = _controls(controls)
    tokens = [int(t) for t in draft_tokens]
    children = [[] for _ in range(len(tokens) + 1)]  # children[node + 1], in index order
    for child, parent in enumerate(parents):
        children[int(parent) + 1].append(child)
    depth, node = 0, -1
    if inv_t == math.inf:
        while True:
            row = target_rows[node + 1]
            _row_max(row, node + 1)
            best = int(np.argmax(row))
            kept = next((j for j in children[node + 1] if tokens[j] == best), None)
            if kept is None:
                return depth, best
            path_out[depth], depth, node = kept, depth + 1, kept
    one_hot = draft_weights is None
    while True:
        law, w = _row_law(target_rows[node + 1], node + 1, inv_t, top_k, top_p, min_p)
        current, total, rejected, kept = w, law.total, False, None
        for j in children[node + 1]:
            x = tokens[j]
            p = current[x] / total
            u = rng.random()
            if one_hot:
                if u < p:  # never keeps p(x) = 0, even with u = 0
                    kept = j
                    break
                current = current.copy() if current is w else current  # w: the fallback
                current[x] = 0.0
            else:
                q_total = float(draft_laws["total"][j])
                if u * (float(draft_weights[j, x]) / q_total) < p:
                    kept = j
                    break
                current = _residual(current, total, 1.0, draft_weights[j], q_total)
            total = float(current.sum())
            rejected = True
            if not total > 0.0:  # empty in floating point: the next token comes from p
                break
        if kept is not None:
            path_out[depth], depth, node = kept, depth + 1, kept
            continue
        u = rng.random()
        return depth, _pick(current if rejected and total > 0.0 else w, u)
