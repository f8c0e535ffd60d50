# cython: language_level=3, embedsignature=True
"""Compiled kernels of specdec: draft-token sampling and block verification.

Each ``def`` here has a twin of the same name and signature in ``_fallback.py``; the
decoder calls one or the other.  Both draw every uniform with one ``next_double`` of
the caller's ``numpy.random.Generator`` (``Generator.random()`` is exactly that), in
the same order, so one seed gives the same decisions on both backends.

Why the decisions agree in practice: both backends compute bit-identical weights
(the exp of _kernels.h is mirrored operation by operation in NumPy; the float32
fused multiply-adds are emulated in float64, exact but for a double rounding with
probability about 2^-29 per operation) and differ by the order of the sums (the
compiled core sums in blocks and SIMD lanes, NumPy pairwise): relative differences
of about 1e-16 in Z.  A decision differs only if a uniform lands within that of a
threshold -- an acceptance ratio or a cumulative sum -- with probability about
1e-16 per decision.

The row law, the speed-critical loops and their rationale are in ``_kernels.h``.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.math cimport INFINITY, log
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from numpy.random cimport bitgen_t

from specdec._common import BLOCK_SIZE, InvalidLogitsError
from specdec._common import SHIFT_LIMIT as _SHIFT_LIMIT

cdef extern from "_kernels.h" nogil:
    int SD_BLOCK

    double sd_max_f32(const float *x, Py_ssize_t n, int *bad)
    double sd_max_f64(const double *x, Py_ssize_t n, int *bad)
    Py_ssize_t sd_first_index_f32(const float *x, Py_ssize_t n, double value)
    Py_ssize_t sd_first_index_f64(const double *x, Py_ssize_t n, double value)
    double sd_expsum_f32(const float *x, Py_ssize_t n, double m, double inv_t,
                         double tau, double zmin, double *blocks, float *weights,
                         const float *prefetch, double *max_out, int *bad_out)
    double sd_expsum_f64(const double *x, Py_ssize_t n, double m, double inv_t,
                         double tau, double zmin, double *blocks, double *weights,
                         const double *prefetch, double *max_out, int *bad_out)
    Py_ssize_t sd_pick_f32(const float *x, Py_ssize_t n, double m, double inv_t, double tau,
                           double zmin, const double *blocks, double target)
    Py_ssize_t sd_pick_f64(const double *x, Py_ssize_t n, double m, double inv_t, double tau,
                           double zmin, const double *blocks, double target)
    double sd_kth_largest_f32(const float *x, Py_ssize_t n, Py_ssize_t k, double *work)
    double sd_kth_largest_f64(const double *x, Py_ssize_t n, Py_ssize_t k, double *work)
    double sd_top_p_threshold_f32(const float *x, Py_ssize_t n, double m, double inv_t,
                                  double tau, double z_kept, double top_p,
                                  double *vals, double *ws)
    double sd_top_p_threshold_f64(const double *x, Py_ssize_t n, double m, double inv_t,
                                  double tau, double z_kept, double top_p,
                                  double *vals, double *ws)

    double sd_residual_sum_f32_f32(const float *wp, const float *wq, Py_ssize_t n,
                                   double zp, double zq, double *blocks)
    Py_ssize_t sd_residual_pick_f32_f32(const float *wp, const float *wq, Py_ssize_t n,
                                        double zp, double zq, const double *blocks,
                                        double target)
    double sd_residual_sum_f32_f64(const float *wp, const double *wq, Py_ssize_t n,
                                   double zp, double zq, double *blocks)
    Py_ssize_t sd_residual_pick_f32_f64(const float *wp, const double *wq, Py_ssize_t n,
                                        double zp, double zq, const double *blocks,
                                        double target)
    double sd_residual_sum_f64_f32(const double *wp, const float *wq, Py_ssize_t n,
                                   double zp, double zq, double *blocks)
    Py_ssize_t sd_residual_pick_f64_f32(const double *wp, const float *wq, Py_ssize_t n,
                                        double zp, double zq, const double *blocks,
                                        double target)
    double sd_residual_sum_f64_f64(const double *wp, const double *wq, Py_ssize_t n,
                                   double zp, double zq, double *blocks)
    Py_ssize_t sd_residual_pick_f64_f64(const double *wp, const double *wq, Py_ssize_t n,
                                        double zp, double zq, const double *blocks,
                                        double target)

assert SD_BLOCK == BLOCK_SIZE, "_kernels.h and _common.py disagree on the block size"

# A "law" is double[4]: {m, tau, zmin, Z} (see _kernels.h).
cdef enum:
    NONFINITE_LOGITS = 1
    ALL_MASKED_LOGITS = 2
    EMPTY_LAW = 3

# Above this many scaled units between a row's maximum and the provisional shift, the
# weights are recomputed from the maximum (e^64 < float's largest / V).
cdef double SHIFT_LIMIT = _SHIFT_LIMIT

ctypedef fused real:
    float
    double

ctypedef fused target_t:
    float
    double

ctypedef fused draft_t:
    float
    double


cdef struct Controls:
    double inv_t       # 1 / temperature
    Py_ssize_t top_k   # 0: off
    double top_p       # 1.0: off
    double zmin        # log(min_p), -inf: off


cdef class Workspace:
    """Scratch memory for the kernels, sized for one vocabulary and reused per call.

    Parameters
    ----------
    vocab_size : int
        Number of logits per row.
    """
    cdef readonly Py_ssize_t vocab_size
    cdef double *blocks
    cdef double *values
    cdef double *weights
    cdef void *row_weights  # a target row's weights, in the row's type

    def __cinit__(self, Py_ssize_t vocab_size):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.blocks = <double *> malloc(((vocab_size + SD_BLOCK - 1) // SD_BLOCK) * sizeof(double))
        self.values = <double *> malloc(vocab_size * sizeof(double))
        self.weights = <double *> malloc(vocab_size * sizeof(double))
        self.row_weights = malloc(vocab_size * sizeof(double))
        if (self.blocks == NULL or self.values == NULL or self.weights == NULL
                or self.row_weights == NULL):
            raise MemoryError()

    def __dealloc__(self):
        free(self.blocks)
        free(self.values)
        free(self.weights)
        free(self.row_weights)


# --- dispatch from fused types to the C template instances --------------------------

cdef inline double row_max(const real *x, Py_ssize_t n, int *bad) noexcept nogil:
    if real is float:
        return sd_max_f32(x, n, bad)
    else:
        return sd_max_f64(x, n, bad)

cdef inline Py_ssize_t first_index(const real *x, Py_ssize_t n, double value) noexcept nogil:
    if real is float:
        return sd_first_index_f32(x, n, value)
    else:
        return sd_first_index_f64(x, n, value)

cdef inline double expsum(const real *x, Py_ssize_t n, const double *law, double inv_t,
                          double *blocks, real *weights, const real *prefetch=NULL,
                          double *max_out=NULL, int *bad_out=NULL) noexcept nogil:
    if real is float:
        return sd_expsum_f32(x, n, law[0], inv_t, law[1], law[2], blocks, weights, prefetch,
                             max_out, bad_out)
    else:
        return sd_expsum_f64(x, n, law[0], inv_t, law[1], law[2], blocks, weights, prefetch,
                             max_out, bad_out)

cdef inline Py_ssize_t pick(const real *x, Py_ssize_t n, const double *law, double inv_t,
                            const double *blocks, double target) noexcept nogil:
    if real is float:
        return sd_pick_f32(x, n, law[0], inv_t, law[1], law[2], blocks, target)
    else:
        return sd_pick_f64(x, n, law[0], inv_t, law[1], law[2], blocks, target)

cdef inline double residual_sum(const target_t *wp, const draft_t *wq, Py_ssize_t n,
                                double zp, double zq, double *blocks) noexcept nogil:
    if target_t is float:
        if draft_t is float:
            return sd_residual_sum_f32_f32(wp, wq, n, zp, zq, blocks)
        else:
            return sd_residual_sum_f32_f64(wp, wq, n, zp, zq, blocks)
    else:
        if draft_t is float:
            return sd_residual_sum_f64_f32(wp, wq, n, zp, zq, blocks)
        else:
            return sd_residual_sum_f64_f64(wp, wq, n, zp, zq, blocks)

cdef inline Py_ssize_t residual_pick(const target_t *wp, const draft_t *wq, Py_ssize_t n,
                                     double zp, double zq, const double *blocks,
                                     double target) noexcept nogil:
    if target_t is float:
        if draft_t is float:
            return sd_residual_pick_f32_f32(wp, wq, n, zp, zq, blocks, target)
        else:
            return sd_residual_pick_f32_f64(wp, wq, n, zp, zq, blocks, target)
    else:
        if draft_t is float:
            return sd_residual_pick_f64_f32(wp, wq, n, zp, zq, blocks, target)
        else:
            return sd_residual_pick_f64_f64(wp, wq, n, zp, zq, blocks, target)


# --- the row law under the sampling controls -----------------------------------------

cdef int row_law(const real *x, Py_ssize_t n, const Controls *c, Workspace work,
                 double *law, real *weights, const real *next_row=NULL) noexcept nogil:
    """Fill law = {m, tau, zmin, Z} for one row, the block sums of its weights in
    work.blocks and its weights in ``weights``; return 0 or an error code.
    ``next_row``, if given, is prefetched (see sd_expsum).

    Order of the controls (as in Hugging Face's warpers): temperature, then top-k,
    then top-p over the top-k survivors, then min-p.  All three keep an upper set of
    logits, so together they are two thresholds: tau on the logit, zmin on the
    scaled logit.
    """
    cdef int bad = 0
    cdef double m, shift
    if c.top_k <= 0 or c.top_k >= n:
        if c.top_p >= 1.0 and c.zmin == -INFINITY:
            # No control needs the maximum before the weights: shift by the first
            # block's maximum instead, and find the row's own during the exp pass
            # (one pass over memory instead of two).  Any shift gives the same law;
            # only if the row's maximum lies more than SHIFT_LIMIT (scaled) above it,
            # where float weights could overflow, is the pass redone with the maximum.
            shift = row_max(x, n if n < SD_BLOCK else SD_BLOCK, &bad)
            if not bad and shift > -INFINITY:
                law[0] = shift
                law[1] = -INFINITY
                law[2] = -INFINITY
                law[3] = expsum(x, n, law, c.inv_t, work.blocks, weights, next_row, &m, &bad)
                if bad:
                    return NONFINITE_LOGITS
                if (m - shift) * c.inv_t > SHIFT_LIMIT:
                    law[0] = m
                    law[3] = expsum(x, n, law, c.inv_t, work.blocks, weights, next_row)
                return 0 if law[3] > 0.0 else EMPTY_LAW
            bad = 0
    m = row_max(x, n, &bad)
    if bad:
        return NONFINITE_LOGITS
    if m == -INFINITY:
        return ALL_MASKED_LOGITS
    law[0] = m
    law[1] = -INFINITY
    law[2] = -INFINITY
    cdef double z_kept, tau_p
    if 0 < c.top_k < n:
        if real is float:
            law[1] = sd_kth_largest_f32(x, n, c.top_k, work.values)
        else:
            law[1] = sd_kth_largest_f64(x, n, c.top_k, work.values)
    if c.top_p < 1.0:
        z_kept = expsum(x, n, law, c.inv_t, NULL, <real *> NULL)
        if real is float:
            tau_p = sd_top_p_threshold_f32(x, n, m, c.inv_t, law[1], z_kept, c.top_p,
                                           work.values, work.weights)
        else:
            tau_p = sd_top_p_threshold_f64(x, n, m, c.inv_t, law[1], z_kept, c.top_p,
                                           work.values, work.weights)
        if tau_p > law[1]:
            law[1] = tau_p
    law[2] = c.zmin
    law[3] = expsum(x, n, law, c.inv_t, work.blocks, weights, next_row)
    if not law[3] > 0.0:
        # The largest logit has weight exactly 1 under validated controls; a direct
        # caller's temperature whose inverse overflows the logits' type breaks that:
        # refuse rather than return a token of zero probability.
        return EMPTY_LAW
    return 0


cdef Controls make_controls(double temperature, Py_ssize_t top_k, double top_p, double min_p):
    cdef Controls c
    c.inv_t = 1.0 / temperature
    c.top_k = top_k
    c.top_p = top_p
    c.zmin = log(min_p) if min_p > 0.0 else -INFINITY
    return c


cdef bitgen_t *bitgen_of(object bit_generator) except NULL:
    return <bitgen_t *> PyCapsule_GetPointer(bit_generator.capsule, "BitGenerator")


# --- entry points ----------------------------------------------------------------------

def sample_token(const real[::1] logits, double temperature, Py_ssize_t top_k, double top_p,
                 double min_p, object rng, double[::1] law_out, real[::1] weights_out,
                 Workspace work):
    """Draw one token from a row of logits under the sampling controls.

    Parameters
    ----------
    logits : ndarray of float32 or float64, shape (V,), C-contiguous
        One row of logits.
    temperature : float
        0 for greedy (the lowest id among the maxima, no uniform drawn), else > 0.
    top_k : int
        Keep the ``top_k`` largest logits (ties at the boundary kept); 0 disables.
    top_p : float
        Keep the smallest upper set of logits holding ``top_p`` of the mass; 1 disables.
    min_p : float
        Keep tokens with probability >= ``min_p`` times the largest; 0 disables.
    rng : numpy.random.Generator
        Source of the one uniform drawn.
    law_out : ndarray of float64, shape (4,)
        Receives the row law ``{m, tau, zmin, Z}`` (unset for greedy).
    weights_out : ndarray of the logits' dtype, shape (V,)
        Receives the row's unnormalised weights: the draft law q is
        ``weights_out / law_out[3]``, which ``verify`` needs (unset for greedy).
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
    cdef Py_ssize_t n = logits.shape[0]
    if n != work.vocab_size or weights_out.shape[0] != n or law_out.shape[0] < 4:
        raise ValueError("logits, law_out, weights_out and work do not match in size")
    cdef const real *x = &logits[0]
    cdef int bad = 0, err = 0
    cdef double m
    if temperature == 0.0:
        with nogil:
            m = row_max(x, n, &bad)
        if bad:
            raise InvalidLogitsError(0, NONFINITE_LOGITS)
        if m == -INFINITY:
            raise InvalidLogitsError(0, ALL_MASKED_LOGITS)
        return first_index(x, n, m)

    cdef Controls c = make_controls(temperature, top_k, top_p, min_p)
    cdef double *law = &law_out[0]
    cdef Py_ssize_t token = -1
    bit_generator = rng.bit_generator
    cdef bitgen_t *bitgen = bitgen_of(bit_generator)
    with bit_generator.lock, nogil:
        err = row_law(x, n, &c, work, law, &weights_out[0])
        if err == 0:
            token = pick(x, n, law, c.inv_t, work.blocks,
                         bitgen.next_double(bitgen.state) * law[3])
    if err:
        raise InvalidLogitsError(0, err)
    return token


def verify(const target_t[:, ::1] target_rows, const draft_t[:, ::1] draft_weights,
           const int64_t[::1] draft_tokens, const double[:, ::1] draft_laws, bint bonus,
           double temperature, Py_ssize_t top_k, double top_p, double min_p, object rng,
           Workspace work):
    """Verify a block of drafted tokens against the target's rows.

    Keeps each draft token x with probability min(1, p(x) / q(x)) (the test is
    ``u * q(x) < p(x)``, so a token with p(x) = 0 is never kept, even with u = 0);
    at the first rejection draws from norm(max(0, p - q)) of that row; when every
    draft is kept and ``bonus`` is true, draws one more token from the last row.

    Parameters
    ----------
    target_rows : ndarray of float32 or float64, shape (n + 1, V)
        The target's logits at the positions predicting each draft token and the
        bonus token: row i predicts ``draft_tokens[i]``.
    draft_weights : ndarray of float32 or float64, shape (>= n, V)
        The weights ``sample_token`` returned for each draft token (unused for greedy).
    draft_tokens : ndarray of int64, shape (n,)
        The drafted tokens.
    draft_laws : ndarray of float64, shape (>= n, 4)
        The laws ``sample_token`` returned for each draft token (unused for greedy).
    bonus : bool
        Whether to draw a bonus token when every draft is kept.
    temperature, top_k, top_p, min_p, rng, work
        As for ``sample_token``; the same controls must have made the drafts.

    Returns
    -------
    n_accepted : int
        Length of the kept prefix of ``draft_tokens``.
    token : int
        The residual token (after a rejection), the bonus token, or -1.

    Raises
    ------
    InvalidLogitsError
        A target row that the decision needed holds no law; ``row`` says which.
    """
    cdef Py_ssize_t n_draft = draft_tokens.shape[0]
    cdef Py_ssize_t n = target_rows.shape[1]
    cdef Py_ssize_t i
    if (target_rows.shape[0] != n_draft + 1 or draft_weights.shape[0] < n_draft
            or draft_weights.shape[1] != n or draft_laws.shape[0] < n_draft
            or draft_laws.shape[1] < 4 or n != work.vocab_size):
        raise ValueError("verify: the shapes of the rows, tokens, laws and work disagree")
    for i in range(n_draft):
        if not 0 <= draft_tokens[i] < n:
            raise ValueError(f"verify: draft token {draft_tokens[i]} is outside [0, {n})")

    cdef int bad = 0, err = 0
    cdef double m
    cdef Py_ssize_t best
    if temperature == 0.0:
        for i in range(n_draft + 1):
            if i == n_draft and not bonus:
                return n_draft, -1
            m = row_max(&target_rows[i, 0], n, &bad)
            if bad:
                raise InvalidLogitsError(i, NONFINITE_LOGITS)
            if m == -INFINITY:
                raise InvalidLogitsError(i, ALL_MASKED_LOGITS)
            best = first_index(&target_rows[i, 0], n, m)
            if i == n_draft or draft_tokens[i] != best:
                return i, best

    cdef Controls c = make_controls(temperature, top_k, top_p, min_p)
    cdef double law_p[4]
    cdef double p, q, u, mass
    cdef Py_ssize_t n_accepted = n_draft, token = -1, x
    # the current target row's weights, kept for the residual if its draft is rejected
    cdef target_t *weights_p = <target_t *> work.row_weights
    bit_generator = rng.bit_generator
    cdef bitgen_t *bitgen = bitgen_of(bit_generator)
    with bit_generator.lock, nogil:
        for i in range(n_draft):
            err = row_law(&target_rows[i, 0], n, &c, work, law_p, weights_p,
                          &target_rows[i + 1, 0])
            if err:
                break
            x = draft_tokens[i]
            p = <double> weights_p[x] / law_p[3]
            q = <double> draft_weights[i, x] / draft_laws[i, 3]
            u = bitgen.next_double(bitgen.state)
            if u * q < p:
                continue
            n_accepted = i
            mass = residual_sum(weights_p, &draft_weights[i, 0], n, law_p[3], draft_laws[i, 3],
                                work.blocks)
            u = bitgen.next_double(bitgen.state)
            if mass > 0.0:
                token = residual_pick(weights_p, &draft_weights[i, 0], n, law_p[3],
                                      draft_laws[i, 3], work.blocks, u * mass)
            else:
                # p and q agree to rounding although the draft was rejected: the
                # residual is empty in floating point, so fall back on p itself.
                law_p[3] = expsum(&target_rows[i, 0], n, law_p, c.inv_t, work.blocks,
                                  <target_t *> NULL)
                token = pick(&target_rows[i, 0], n, law_p, c.inv_t, work.blocks, u * law_p[3])
            break
        if err == 0 and n_accepted == n_draft and bonus:
            i = n_draft
            err = row_law(&target_rows[i, 0], n, &c, work, law_p, weights_p)
            if err == 0:
                token = pick(&target_rows[i, 0], n, law_p, c.inv_t, work.blocks,
                             bitgen.next_double(bitgen.state) * law_p[3])
    if err:
        raise InvalidLogitsError(i, err)
    return n_accepted, token
