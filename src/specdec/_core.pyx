# cython: language_level=3, embedsignature=True
"""Compiled kernels of specdec: draft-token sampling, block and tree verification.

Each ``def`` here has a twin of the same name and signature in ``_fallback.py``; the
decoder calls one or the other.  One class has none: ``_BatchStep``, the engine's batch
verified a thread's share at a time without the GIL (the pure-Python path verifies a
sequence at a time through the twins).  Both draw every uniform with one ``next_double`` of
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

The row law, the speed-critical loops and their rationale are in ``_kernels.h``, which
compiles them once per SIMD level; the functions here call the active level's (chosen at
import, see ``_use_simd_level``).  At the x86-64 baseline level (no FMA) the float exp
rounds each multiply and add, and the twin then does the same (``_backend`` sets
``_fallback.FUSED_F32``), so the weights stay bit-identical at every level.

Why one module of about 1,400 lines: every entry point here (``sample_token``,
``row_laws``, ``verify``, ``verify_tree``, ``_BatchStep``) is a thin typed layer over the
same inline nogil helpers (row laws, residuals, picks, one-hot removal), and Cython
shares inline helpers only within a module (a split would need ``include`` files or
cross-module calls through function pointers); the arithmetic itself lives in
``_kernels.h`` and its templates.
"""

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.math cimport INFINITY, log
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from numpy.random cimport bitgen_t

from specdec._kernels cimport *

import numpy as np

cnp.import_array()

from specdec import _common
from specdec._common import (BLOCK_SIZE, InvalidLogitsError, check_row_laws_args, check_tree_args,
                             check_verify_args, overlap_error, token_range_error)
from specdec._common import SHIFT_LIMIT as _SHIFT_LIMIT
from specdec._common import SIMD_LEVELS as _SIMD_LEVELS
from specdec._validation import SamplingControls

assert SD_BLOCK == BLOCK_SIZE, "_kernels.h and _common.py disagree on the block size"
assert (SD_EXP_LOWEST_F32, SD_EXP_LOWEST_F64) == (_common.EXP_LOWEST_F32, _common.EXP_LOWEST_F64), (
    "_kernels.h and _common.py disagree on the exp bounds")

# The error codes are C constants here (returned without the GIL); their one source is
# _common.py, and the import fails if the two disagree.
cdef enum:
    NONFINITE_LOGITS = 1
    ALL_MASKED_LOGITS = 2
    EMPTY_LAW = 3

assert (NONFINITE_LOGITS, ALL_MASKED_LOGITS, EMPTY_LAW) == (
    _common.NONFINITE_LOGITS, _common.ALL_MASKED_LOGITS, _common.EMPTY_LAW), (
    "_core.pyx and _common.py disagree on the error codes")

# The SIMD levels of _kernels.h, numbered in _common.SIMD_LEVELS's order (best first).
# The best one this CPU supports is active from import on; _backend.py applies
# SPECDEC_SIMD through _use_simd_level.
assert len(_SIMD_LEVELS) == SD_LEVEL_COUNT, "_common.py and _kernels.h disagree on the levels"


def _supported_simd_levels():
    """The SIMD levels this core holds and this CPU runs, best first."""
    return tuple(name for i, name in enumerate(_SIMD_LEVELS) if sd_level_supported(i))


def _simd_level():
    """The name of the active SIMD level."""
    return _SIMD_LEVELS[sd_active_level]


def _simd_level_fuses():
    """Whether the active level computes the float exp's multiply-adds fused (FMA)."""
    return bool(sd_level_fuses(sd_active_level))


def _use_simd_level(str name):
    """Make `name` the active SIMD level; return the previous one's name.

    Not thread-safe: for import (SPECDEC_SIMD), tests and benchmarks only.
    """
    if name not in _SIMD_LEVELS:
        raise ValueError(f"SIMD level must be one of {_SIMD_LEVELS}, got {name!r}")
    previous = _simd_level()
    if sd_use_level(_SIMD_LEVELS.index(name)) != 0:
        raise RuntimeError(
            f"SIMD level {name!r} is not available on this CPU or in this build "
            f"(available: {', '.join(_supported_simd_levels())})")
    return previous


_use_simd_level(_supported_simd_levels()[0])

# The law records' dtype, by identity (sample_token's fast path).
_LAW_DESCR = _common.LAW_DTYPE

# Above this many scaled units between a row's maximum and the provisional shift, the
# weights are recomputed from the maximum (e^64 < float's largest / V).
cdef double SHIFT_LIMIT = _SHIFT_LIMIT

# The fused types, named for what they hold.  One row's logits and the weights
# computed from them share a type (sample_token, row_laws):
ctypedef fused logit_t:
    float
    double

# verify reads two kinds of rows whose types vary independently: the target's logits
# (and the weights computed from them, kept in the workspace) ...
ctypedef fused target_logit_t:
    float
    double

# ... and the draft's weights, as sample_token / row_laws returned them.
ctypedef fused draft_weight_t:
    float
    double


cdef struct Controls:
    bint greedy        # temperature 0
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
    cdef Py_ssize_t n_blocks
    cdef double *blocks
    cdef double *values
    cdef double *weights
    cdef void *row_weights  # a target row's weights, in the row's type
    # Block verification keeps per target row of a call: its weights (in the row's
    # type), block sums, law, prefix ratio p_i and residual mass, and one uniform per
    # draft; grown by reserve_rows when a call has more rows than any before.
    cdef Py_ssize_t row_capacity
    cdef void *store_weights
    cdef double *store_blocks
    cdef RowLaw *store_laws
    cdef double *store_ratios
    cdef double *store_masses
    cdef double *etas

    def __cinit__(self, Py_ssize_t vocab_size):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.n_blocks = (vocab_size + SD_BLOCK - 1) // SD_BLOCK
        self.blocks = <double *> malloc(self.n_blocks * sizeof(double))
        self.values = <double *> malloc(vocab_size * sizeof(double))
        self.weights = <double *> malloc(vocab_size * sizeof(double))
        self.row_weights = malloc(vocab_size * sizeof(double))
        if (self.blocks == NULL or self.values == NULL or self.weights == NULL
                or self.row_weights == NULL):
            raise MemoryError()

    cdef int reserve_rows(self, Py_ssize_t rows) except -1:
        """Room for ``rows`` rows of per-row storage (block verification)."""
        if rows <= self.row_capacity:
            return 0
        rows = max(rows, 2 * self.row_capacity)
        self.free_rows()
        self.store_weights = malloc(rows * self.vocab_size * sizeof(double))
        self.store_blocks = <double *> malloc(rows * self.n_blocks * sizeof(double))
        self.store_laws = <RowLaw *> malloc(rows * sizeof(RowLaw))
        self.store_ratios = <double *> malloc(rows * sizeof(double))
        self.store_masses = <double *> malloc(rows * sizeof(double))
        self.etas = <double *> malloc(rows * sizeof(double))
        if (self.store_weights == NULL or self.store_blocks == NULL or self.store_laws == NULL
                or self.store_ratios == NULL or self.store_masses == NULL or self.etas == NULL):
            self.free_rows()
            raise MemoryError()
        self.row_capacity = rows
        return 0

    cdef void free_rows(self) noexcept:
        free(self.store_weights)
        free(self.store_blocks)
        free(self.store_laws)
        free(self.store_ratios)
        free(self.store_masses)
        free(self.etas)
        self.store_weights = NULL
        self.store_blocks = NULL
        self.store_laws = NULL
        self.store_ratios = NULL
        self.store_masses = NULL
        self.etas = NULL
        self.row_capacity = 0

    def __dealloc__(self):
        free(self.blocks)
        free(self.values)
        free(self.weights)
        free(self.row_weights)
        self.free_rows()


# --- dispatch from fused types to the C template instances --------------------------

cdef inline double row_max(const logit_t *x, Py_ssize_t n, int *bad) noexcept nogil:
    if logit_t is float:
        return sd_max_f32(x, n, bad)
    else:
        return sd_max_f64(x, n, bad)

cdef inline Py_ssize_t first_index(const logit_t *x, Py_ssize_t n, double value) noexcept nogil:
    if logit_t is float:
        return sd_first_index_f32(x, n, value)
    else:
        return sd_first_index_f64(x, n, value)

cdef inline double expsum(const logit_t *x, Py_ssize_t n, const RowLaw *law, double inv_t,
                          double *blocks, logit_t *weights, const logit_t *prefetch=NULL,
                          double *max_out=NULL, int *bad_out=NULL) noexcept nogil:
    if logit_t is float:
        return sd_expsum_f32(x, n, law.shift, inv_t, law.tau, law.zmin, blocks, weights,
                             prefetch, max_out, bad_out)
    else:
        return sd_expsum_f64(x, n, law.shift, inv_t, law.tau, law.zmin, blocks, weights,
                             prefetch, max_out, bad_out)

cdef inline Py_ssize_t pick(const logit_t *x, Py_ssize_t n, const RowLaw *law, double inv_t,
                            const double *blocks, double target) noexcept nogil:
    if logit_t is float:
        return sd_pick_f32(x, n, law.shift, inv_t, law.tau, law.zmin, blocks, target)
    else:
        return sd_pick_f64(x, n, law.shift, inv_t, law.tau, law.zmin, blocks, target)

cdef inline double block_sum(const logit_t *w, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    if logit_t is float:
        return sd_block_sum_f32(w, start, end)
    else:
        return sd_block_sum_f64(w, start, end)

cdef inline Py_ssize_t stored_pick(const logit_t *w, Py_ssize_t n, const double *blocks,
                                   double target) noexcept nogil:
    if logit_t is float:
        return sd_stored_pick_f32(w, n, blocks, target)
    else:
        return sd_stored_pick_f64(w, n, blocks, target)

cdef inline double residual_sum(const target_logit_t *wp, const draft_weight_t *wq,
                                Py_ssize_t n, double scale, double zp, double zq,
                                double *blocks, double *store=NULL) noexcept nogil:
    if target_logit_t is float:
        if draft_weight_t is float:
            return sd_residual_sum_f32_f32(wp, wq, n, scale, zp, zq, blocks, store)
        else:
            return sd_residual_sum_f32_f64(wp, wq, n, scale, zp, zq, blocks, store)
    else:
        if draft_weight_t is float:
            return sd_residual_sum_f64_f32(wp, wq, n, scale, zp, zq, blocks, store)
        else:
            return sd_residual_sum_f64_f64(wp, wq, n, scale, zp, zq, blocks, store)

cdef inline double stored_residual_sum(double *r, const draft_weight_t *wq, Py_ssize_t n,
                                       double zr, double zq, double *blocks) noexcept nogil:
    """The residual of a stored residual ``r`` (mass ``zr``), written over ``r``."""
    if draft_weight_t is float:
        return sd_residual_sum_f64_f32(r, wq, n, 1.0, zr, zq, blocks, r)
    else:
        return sd_residual_sum_f64_f64(r, wq, n, 1.0, zr, zq, blocks, r)

cdef inline Py_ssize_t residual_pick(const target_logit_t *wp, const draft_weight_t *wq,
                                     Py_ssize_t n, double scale, double zp, double zq,
                                     const double *blocks, double target) noexcept nogil:
    if target_logit_t is float:
        if draft_weight_t is float:
            return sd_residual_pick_f32_f32(wp, wq, n, scale, zp, zq, blocks, target)
        else:
            return sd_residual_pick_f32_f64(wp, wq, n, scale, zp, zq, blocks, target)
    else:
        if draft_weight_t is float:
            return sd_residual_pick_f64_f32(wp, wq, n, scale, zp, zq, blocks, target)
        else:
            return sd_residual_pick_f64_f64(wp, wq, n, scale, zp, zq, blocks, target)


# --- the row law under the sampling controls -----------------------------------------

cdef int row_law(const logit_t *x, Py_ssize_t n, const Controls *c, Workspace work,
                 RowLaw *law, logit_t *weights, double *blocks,
                 const logit_t *next_row=NULL) noexcept nogil:
    """Fill ``law`` for one row, the block sums of its weights in ``blocks`` and its
    weights in ``weights``; return 0 or an error code.  ``next_row``, if given, is
    prefetched (see sd_expsum).

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
                law.shift = shift
                law.tau = -INFINITY
                law.zmin = -INFINITY
                law.total = expsum(x, n, law, c.inv_t, blocks, weights, next_row, &m, &bad)
                if bad:
                    return NONFINITE_LOGITS
                if (m - shift) * c.inv_t > SHIFT_LIMIT:
                    law.shift = m
                    law.total = expsum(x, n, law, c.inv_t, blocks, weights, next_row)
                return 0 if law.total > 0.0 else EMPTY_LAW
            bad = 0
    m = row_max(x, n, &bad)
    if bad:
        return NONFINITE_LOGITS
    if m == -INFINITY:
        return ALL_MASKED_LOGITS
    law.shift = m
    law.tau = -INFINITY
    law.zmin = -INFINITY
    cdef double z_kept, tau_p
    if 0 < c.top_k < n:
        if logit_t is float:
            law.tau = sd_kth_largest_f32(x, n, c.top_k, work.values)
        else:
            law.tau = sd_kth_largest_f64(x, n, c.top_k, work.values)
    if c.top_p < 1.0:
        z_kept = expsum(x, n, law, c.inv_t, NULL, <logit_t *> NULL)
        if logit_t is float:
            tau_p = sd_top_p_threshold_f32(x, n, m, c.inv_t, law.tau, z_kept, c.top_p,
                                           work.values, work.weights)
        else:
            tau_p = sd_top_p_threshold_f64(x, n, m, c.inv_t, law.tau, z_kept, c.top_p,
                                           work.values, work.weights)
        if tau_p > law.tau:
            law.tau = tau_p
    law.zmin = c.zmin
    law.total = expsum(x, n, law, c.inv_t, blocks, weights, next_row)
    if not law.total > 0.0:
        # The largest logit has weight exactly 1 under validated controls; a direct
        # caller's temperature whose inverse overflows the logits' type breaks that:
        # refuse rather than return a token of zero probability.
        return EMPTY_LAW
    return 0


cdef Controls unpack_controls(object controls) except *:
    """The C view of a ``SamplingControls``, read once per call."""
    if not isinstance(controls, SamplingControls):
        raise TypeError("controls must be a specdec._validation.SamplingControls, got "
                        f"{type(controls).__name__}")
    cdef Controls c
    cdef double temperature = controls.temperature
    cdef double min_p = controls.min_p
    c.greedy = temperature == 0.0
    c.inv_t = INFINITY if c.greedy else 1.0 / temperature
    c.top_k = controls.top_k
    c.top_p = controls.top_p
    c.zmin = log(min_p) if min_p > 0.0 else -INFINITY
    return c


cdef bitgen_t *bitgen_of(object bit_generator) except NULL:
    return <bitgen_t *> PyCapsule_GetPointer(bit_generator.capsule, "BitGenerator")


cdef int greedy_token(const logit_t *x, Py_ssize_t n, Py_ssize_t *token) noexcept nogil:
    """The lowest id among the row's maxima into *token; 0 or an error code."""
    cdef int bad = 0
    cdef double m = row_max(x, n, &bad)
    if bad:
        return NONFINITE_LOGITS
    if m == -INFINITY:
        return ALL_MASKED_LOGITS
    token[0] = first_index(x, n, m)
    return 0


# --- entry points ----------------------------------------------------------------------

def sample_token(logits, object controls, object rng, law_out, weights_out,
                 Workspace work not None):
    """Compiled twin of ``specdec._fallback.sample_token``, whose docstring _backend copies."""
    # A draft model calls this once per token: the usual arguments (aligned, native,
    # C-contiguous arrays of the right types) go straight to their data; anything else
    # through typed memoryviews, which check it and raise the errors.  The memoryviews'
    # acquisition and fused-type dispatch cost about 1.4 us a call, the kernel at
    # V = 64 a fraction of that.
    cdef int kind = plain_row_kind(logits, weights_out, law_out)
    if kind == cnp.NPY_FLOAT:
        return sample_from[float](<const float *> cnp.PyArray_DATA(logits),
                                  cnp.PyArray_DIM(logits, 0), controls, rng,
                                  <RowLaw *> cnp.PyArray_DATA(law_out),
                                  cnp.PyArray_DIM(law_out, 0),
                                  <float *> cnp.PyArray_DATA(weights_out),
                                  cnp.PyArray_DIM(weights_out, 0), work)
    if kind == cnp.NPY_DOUBLE:
        return sample_from[double](<const double *> cnp.PyArray_DATA(logits),
                                   cnp.PyArray_DIM(logits, 0), controls, rng,
                                   <RowLaw *> cnp.PyArray_DATA(law_out),
                                   cnp.PyArray_DIM(law_out, 0),
                                   <double *> cnp.PyArray_DATA(weights_out),
                                   cnp.PyArray_DIM(weights_out, 0), work)
    return _sample_token_views(logits, controls, rng, law_out, weights_out, work)


cdef inline bint overlap(const void *a, size_t a_bytes, const void *b,
                         size_t b_bytes) noexcept:
    """Whether two byte ranges share memory (the kernels write one while reading the
    other: see _common.check_apart)."""
    cdef const char *p = <const char *> a
    cdef const char *q = <const char *> b
    return a_bytes > 0 and b_bytes > 0 and p < q + b_bytes and q < p + a_bytes


cdef inline bint any_overlap(const void *rows, size_t row_bytes, const void *weights,
                             size_t weight_bytes, const void *laws, size_t law_bytes) noexcept:
    """Whether any two of a kernel's rows, weights and laws share memory."""
    return (overlap(rows, row_bytes, weights, weight_bytes)
            or overlap(rows, row_bytes, laws, law_bytes)
            or overlap(weights, weight_bytes, laws, law_bytes))


cdef inline bint plain_array(object a, int typenum, bint writeable, int ndim=1):
    """An `ndim`-D, aligned, native, C-contiguous ndarray of type `typenum` (writeable if
    asked)."""
    if not cnp.PyArray_Check(a):
        return False
    cdef cnp.ndarray array = <cnp.ndarray> a
    return (cnp.PyArray_NDIM(array) == ndim and cnp.PyArray_TYPE(array) == typenum
            and cnp.PyArray_ISCARRAY_RO(array) and cnp.PyArray_ISNOTSWAPPED(array)
            and (not writeable or cnp.PyArray_ISWRITEABLE(array)))


cdef inline int plain_logits_type(object a, Py_ssize_t vocab_size):
    """NPY_FLOAT or NPY_DOUBLE for plain 2-D rows of `vocab_size` columns, else -1."""
    cdef int typenum
    if plain_array(a, cnp.NPY_FLOAT, False, 2):
        typenum = cnp.NPY_FLOAT
    elif plain_array(a, cnp.NPY_DOUBLE, False, 2):
        typenum = cnp.NPY_DOUBLE
    else:
        return -1
    return typenum if cnp.PyArray_DIM(<cnp.ndarray> a, 1) == vocab_size else -1


cdef bint plain_verify_args(object target_rows, object draft_tokens, object draft_weights,
                            object draft_laws, object block, Py_ssize_t vocab_size):
    """True when verify's arguments are the usual ones and pass check_verify_args (but
    for the tokens' range, which verify checks in its loop): plain arrays of agreeing
    shapes, a bool ``block``.  The decoder calls verify once per step, and the Python
    checks cost more than the kernels at a small vocabulary."""
    if type(block) is not bool or plain_logits_type(target_rows, vocab_size) < 0:
        return False
    if not plain_array(draft_tokens, cnp.NPY_INT64, False):
        return False
    cdef Py_ssize_t n = cnp.PyArray_DIM(<cnp.ndarray> draft_tokens, 0)
    if cnp.PyArray_DIM(<cnp.ndarray> target_rows, 0) != n + 1:
        return False
    if draft_weights is None and draft_laws is None:
        return True
    if plain_logits_type(draft_weights, vocab_size) < 0:
        return False
    if cnp.PyArray_DIM(<cnp.ndarray> draft_weights, 0) < n or not cnp.PyArray_Check(draft_laws):
        return False
    cdef cnp.ndarray laws = <cnp.ndarray> draft_laws
    return ((<object> cnp.PyArray_DESCR(laws)) is _LAW_DESCR and cnp.PyArray_NDIM(laws) == 1
            and cnp.PyArray_ISCARRAY_RO(laws) and cnp.PyArray_ISNOTSWAPPED(laws)
            and cnp.PyArray_DIM(laws, 0) >= n)


cdef int plain_row_kind(object logits, object weights_out, object law_out):
    """NPY_FLOAT or NPY_DOUBLE when sample_token's arrays are all plain (see there), else -1."""
    cdef int typenum
    if plain_array(logits, cnp.NPY_FLOAT, False):
        typenum = cnp.NPY_FLOAT
    elif plain_array(logits, cnp.NPY_DOUBLE, False):
        typenum = cnp.NPY_DOUBLE
    else:
        return -1
    if not plain_array(weights_out, typenum, True) or not cnp.PyArray_Check(law_out):
        return -1
    cdef cnp.ndarray laws = <cnp.ndarray> law_out
    if (<object> cnp.PyArray_DESCR(laws)) is not _LAW_DESCR or cnp.PyArray_NDIM(laws) != 1:
        return -1
    if not (cnp.PyArray_ISCARRAY(laws) and cnp.PyArray_ISNOTSWAPPED(laws)):
        return -1
    return typenum


def _sample_token_views(const logit_t[::1] logits, object controls, object rng,
                        RowLaw[::1] law_out, logit_t[::1] weights_out, Workspace work):
    """sample_token's arguments as typed memoryviews, which check them."""
    return sample_from(&logits[0] if logits.shape[0] else NULL, logits.shape[0], controls, rng,
                       &law_out[0] if law_out.shape[0] else NULL, law_out.shape[0],
                       &weights_out[0] if weights_out.shape[0] else NULL, weights_out.shape[0],
                       work)


cdef object sample_from(const logit_t *x, Py_ssize_t n, object controls, object rng,
                        RowLaw *law, Py_ssize_t n_laws, logit_t *weights, Py_ssize_t n_weights,
                        Workspace work):
    """sample_token on checked arrays: the row, its law's and weights' storage."""
    if n != work.vocab_size or n_weights != n or n_laws < 1:
        raise ValueError("logits, law_out, weights_out and work do not match in size")
    cdef size_t row_bytes = n * sizeof(logit_t), law_bytes = n_laws * sizeof(RowLaw)
    if any_overlap(x, row_bytes, weights, row_bytes, law, law_bytes):
        raise overlap_error("sample_token")
    cdef Controls c = unpack_controls(controls)
    cdef int err = 0
    cdef Py_ssize_t token = -1
    if c.greedy:
        with nogil:
            err = greedy_token(x, n, &token)
        if err:
            raise InvalidLogitsError(0, err)
        return token

    bit_generator = rng.bit_generator
    cdef bitgen_t *bitgen = bitgen_of(bit_generator)
    with bit_generator.lock, nogil:
        err = row_law(x, n, &c, work, law, weights, work.blocks)
        if err == 0:
            token = pick(x, n, law, c.inv_t, work.blocks,
                         bitgen.next_double(bitgen.state) * law.total)
    if err:
        raise InvalidLogitsError(0, err)
    return token


cdef int fill_row_laws(const logit_t *rows, Py_ssize_t n_rows, Py_ssize_t n, const Controls *c,
                       RowLaw *laws, logit_t *weights, Workspace work,
                       Py_ssize_t *failed) noexcept nogil:
    cdef Py_ssize_t i, token
    cdef int err = 0
    for i in range(n_rows):
        failed[0] = i
        if c.greedy:
            err = greedy_token(rows + i * n, n, &token)
        else:
            err = row_law(rows + i * n, n, c, work, &laws[i], weights + i * n, work.blocks,
                          rows + (i + 1) * n if i + 1 < n_rows else NULL)
        if err:
            return err
    return 0


cdef bint plain_row_laws_args(object rows, object laws_out, object weights_out,
                              Py_ssize_t vocab_size):
    """True when row_laws' arguments are the usual ones and pass check_row_laws_args:
    plain arrays of agreeing shapes and types (the engine calls it once per sequence,
    where the Python checks cost more than the kernels at a small vocabulary)."""
    cdef int typenum = plain_logits_type(rows, vocab_size)
    if typenum < 0 or not plain_array(weights_out, typenum, True, 2):
        return False
    cdef Py_ssize_t n_rows = cnp.PyArray_DIM(<cnp.ndarray> rows, 0)
    if (cnp.PyArray_DIM(<cnp.ndarray> weights_out, 1) != vocab_size
            or cnp.PyArray_DIM(<cnp.ndarray> weights_out, 0) < n_rows
            or not cnp.PyArray_Check(laws_out)):
        return False
    cdef cnp.ndarray laws = <cnp.ndarray> laws_out
    return ((<object> cnp.PyArray_DESCR(laws)) is _LAW_DESCR and cnp.PyArray_NDIM(laws) == 1
            and cnp.PyArray_ISCARRAY(laws) and cnp.PyArray_ISNOTSWAPPED(laws)
            and cnp.PyArray_DIM(laws, 0) >= n_rows)


cdef int check_row_laws_views(object rows, object laws_out, object weights_out) except -1:
    """Raise, as typed views do, where row_laws' arrays (already past check_row_laws_args)
    are not C-contiguous and native, or an output is read-only: then their data can be
    read through pointers, as plain arrays' are."""
    cdef RowLaw[::1] _laws = laws_out
    cdef const float[:, ::1] _rows32
    cdef const double[:, ::1] _rows64
    cdef float[:, ::1] _weights32
    cdef double[:, ::1] _weights64
    if rows.dtype == np.float32:
        _rows32, _weights32 = rows, weights_out
    else:
        _rows64, _weights64 = rows, weights_out
    return 0


def row_laws(rows, controls, laws_out, weights_out, Workspace work not None):
    """Compiled twin of ``specdec._fallback.row_laws``, whose docstring _backend copies."""
    cdef bint plain = plain_row_laws_args(rows, laws_out, weights_out, work.vocab_size)
    if not plain:
        check_row_laws_args(rows, laws_out, weights_out, work.vocab_size)
    cdef Controls c = unpack_controls(controls)
    cdef Py_ssize_t failed = 0, n_rows = len(rows), n = work.vocab_size
    cdef int err = 0
    if n_rows == 0:
        return
    if not plain:
        check_row_laws_views(rows, laws_out, weights_out)
    # Pointers first (the checks above make them safe), then the passes without the GIL,
    # so that threads (the engine's batches) compute row laws in parallel.
    cdef RowLaw *laws = <RowLaw *> cnp.PyArray_DATA(<cnp.ndarray> laws_out)
    cdef const void *row_data = cnp.PyArray_DATA(<cnp.ndarray> rows)
    cdef void *weight_data = cnp.PyArray_DATA(<cnp.ndarray> weights_out)
    cdef size_t row_bytes = cnp.PyArray_NBYTES(<cnp.ndarray> rows)
    cdef size_t weight_bytes = cnp.PyArray_NBYTES(<cnp.ndarray> weights_out)
    cdef size_t law_bytes = cnp.PyArray_NBYTES(<cnp.ndarray> laws_out)
    if plain and any_overlap(row_data, row_bytes, weight_data, weight_bytes, laws, law_bytes):
        raise overlap_error("row_laws")  # (the checked path's check_row_laws_args says it)
    if rows.dtype == np.float32:
        with nogil:
            err = fill_row_laws[float](<const float *> row_data, n_rows, n, &c, laws,
                                       <float *> weight_data, work, &failed)
    else:
        with nogil:
            err = fill_row_laws[double](<const double *> row_data, n_rows, n, &c, laws,
                                        <double *> weight_data, work, &failed)
    if err:
        raise InvalidLogitsError(failed, err)


cdef inline double draft_probability(const draft_weight_t *q_row, const RowLaw *q_law,
                                     Py_ssize_t x) noexcept nogil:
    """q(x) of a draft row; 1 for one-hot drafts (q_row NULL)."""
    if q_row == NULL:
        return 1.0
    return <double> q_row[x] / q_law.total


cdef double one_hot_remove(target_logit_t *w, Py_ssize_t n, Py_ssize_t x,
                           double *blocks) noexcept nogil:
    """Set w[x] to 0 and redo its block's sum (no exp recomputed); return the new total
    of the stored weights ``w`` (the sum of ``blocks``)."""
    cdef Py_ssize_t b = x // SD_BLOCK, k
    cdef double total = 0.0
    w[x] = 0
    blocks[b] = block_sum(w, b * SD_BLOCK, min(n, (b + 1) * SD_BLOCK))
    for k in range((n + SD_BLOCK - 1) // SD_BLOCK):
        total += blocks[k]
    return total


cdef Py_ssize_t fresh_pick(const target_logit_t *row, Py_ssize_t n, RowLaw *law,
                           const Controls *c, double *blocks, double u) noexcept nogil:
    """A draw from the row's own law, its block sums recomputed into ``blocks``: the
    fallback when a residual that must have mass is empty in floating point."""
    law.total = expsum(row, n, law, c.inv_t, blocks, <target_logit_t *> NULL)
    return pick(row, n, law, c.inv_t, blocks, u * law.total)


cdef Py_ssize_t one_hot_residual_pick(target_logit_t *w, const target_logit_t *row, Py_ssize_t n,
                                      RowLaw *law, Py_ssize_t x, double *blocks,
                                      const Controls *c, double u) noexcept nogil:
    """A draw from the row's law with token x removed, renormalised (one-hot drafts'
    residual, whatever the prefix ratio: it scales every weight alike).  ``w`` and
    ``blocks`` are the row's stored weights and block sums; w[x] is set to 0."""
    cdef double total = one_hot_remove(w, n, x, blocks)
    if total > 0.0:
        return stored_pick(w, n, blocks, u * total)
    # Every weight but x's is 0 although x was rejected (only rounding can do this):
    # fall back on the row's law itself.
    return fresh_pick(row, n, law, c, blocks, u)


cdef int verify_token_nogil(const target_logit_t *rows, const int64_t *tokens,
                            Py_ssize_t n_draft, Py_ssize_t n, const draft_weight_t *q,
                            Py_ssize_t q_stride, const RowLaw *q_laws, bint bonus,
                            const Controls *c, Workspace work, bitgen_t *bitgen,
                            Py_ssize_t *n_accepted, Py_ssize_t *token,
                            Py_ssize_t *row_index) noexcept nogil:
    """Token-by-token verification (Leviathan et al. 2023); q NULL: one-hot drafts."""
    cdef RowLaw law_p
    cdef double p, u, mass
    cdef Py_ssize_t i, x
    cdef int err = 0
    # the current target row's weights, kept for the residual if its draft is rejected
    cdef target_logit_t *weights_p = <target_logit_t *> work.row_weights
    cdef const target_logit_t *row
    cdef const draft_weight_t *q_row = NULL
    n_accepted[0] = n_draft
    token[0] = -1
    for i in range(n_draft):
        row_index[0] = i
        row = rows + i * n
        err = row_law(row, n, c, work, &law_p, weights_p, work.blocks, row + n)
        if err:
            return err
        x = tokens[i]
        p = <double> weights_p[x] / law_p.total
        u = bitgen.next_double(bitgen.state)
        if q == NULL:
            # one-hot q: keep x with probability p(x); u < p(x) never keeps p(x) = 0
            if u < p:
                continue
            n_accepted[0] = i
            token[0] = one_hot_residual_pick(weights_p, row, n, &law_p, x, work.blocks, c,
                                             bitgen.next_double(bitgen.state))
            return 0
        q_row = q + i * q_stride
        if u * draft_probability(q_row, &q_laws[i], x) < p:
            continue
        n_accepted[0] = i
        mass = residual_sum(weights_p, q_row, n, 1.0, law_p.total, q_laws[i].total,
                            work.blocks)
        u = bitgen.next_double(bitgen.state)
        if mass > 0.0:
            token[0] = residual_pick(weights_p, q_row, n, 1.0, law_p.total, q_laws[i].total,
                                     work.blocks, u * mass)
        else:
            # p and q agree to rounding although the draft was rejected: the
            # residual is empty in floating point, so fall back on p itself.
            token[0] = fresh_pick(row, n, &law_p, c, work.blocks, u)
        return 0
    if bonus:
        row_index[0] = n_draft
        row = rows + n_draft * n
        err = row_law(row, n, c, work, &law_p, weights_p, work.blocks)
        if err:
            return err
        token[0] = pick(row, n, &law_p, c.inv_t, work.blocks,
                        bitgen.next_double(bitgen.state) * law_p.total)
    return 0


cdef int verify_block_nogil(const target_logit_t *rows, const int64_t *tokens,
                            Py_ssize_t n_draft, Py_ssize_t n, const draft_weight_t *q,
                            Py_ssize_t q_stride, const RowLaw *q_laws, bint bonus,
                            const Controls *c, Workspace work, bitgen_t *bitgen,
                            Py_ssize_t *n_accepted, Py_ssize_t *token,
                            Py_ssize_t *row_index) noexcept nogil:
    """Block verification (Sun et al., ICLR 2025, Algorithm 2); q NULL: one-hot drafts.

    With P_i, Q_i the target's and the draft's laws of row i (which predicts draft
    token X_{i+1}; rows and tokens 0-based here, positions 1-based as in the paper):
    p_0 = 1, p_{i+1} = min(1, p_i P_i(X_{i+1}) / Q_i(X_{i+1})); the residual of row i
    is max(0, p_i P_i - Q_i) with mass r_i; h_i = r_i / (r_i + 1 - p_i) for
    1 <= i < gamma (1 when that is 0 / 0), h_gamma = p_gamma.  One uniform eta_i per
    position, all drawn first; tau = the largest i with eta_i < h_i (0 if none).  Keep
    X_1..X_tau, then draw from norm(residual of row tau) if tau < gamma, else the bonus
    from P_gamma.  ``eta < h`` with eta in [0, 1) has probability h exactly and never
    selects h = 0 (an empty residual, p_i = 0).

    Storage: each row's weights, block sums and law stay in the workspace (rows x V,
    grown only when a call has more rows than any before), because tau is known only
    after the last row and its residual draw needs them: keeping them costs no pass
    over the vocabulary, where recomputing the chosen row would cost an exp pass and,
    for model drafts, a residual pass.  The residual block sums computed for h_i are
    the ones the final draw uses; the h_i are tried from the last row down, so only the
    rows from tau up get a residual pass (none when every draft is kept).  For one-hot
    drafts r_i = p_i (Z_i - w_i(x)) / Z_i
    in closed form (no residual pass), and the residual is P_i without x.
    Once p_i = 0, every later h is 0: the rows after it are not read.
    """
    cdef Py_ssize_t nb = work.n_blocks, i, x, tau = 0
    cdef target_logit_t *store = <target_logit_t *> work.store_weights
    cdef target_logit_t *w_i
    cdef double *blocks_i
    cdef RowLaw *law_i
    cdef const draft_weight_t *q_row = NULL
    cdef const target_logit_t *row
    cdef double ratio = 1.0, mass, denom, h, t, qx, u
    cdef Py_ssize_t rows_read = 0
    cdef int err = 0
    for i in range(n_draft):
        work.etas[i] = bitgen.next_double(bitgen.state)
    # Forward: every row's law and the prefix ratios p_i.
    for i in range(n_draft):
        if ratio == 0.0:
            break
        row_index[0] = i
        row = rows + i * n
        w_i = store + i * n
        law_i = &work.store_laws[i]
        err = row_law(row, n, c, work, law_i, w_i, work.store_blocks + i * nb, row + n)
        if err:
            return err
        rows_read = i + 1
        x = tokens[i]
        if q != NULL:
            q_row = q + i * q_stride
        work.store_ratios[i] = ratio
        qx = draft_probability(q_row, &q_laws[i] if q != NULL else NULL, x)
        t = ratio * (<double> w_i[x] / law_i.total)
        ratio = 0.0 if t == 0.0 else (1.0 if t >= qx else t / qx)
    # Backward: tau is the *largest* i with eta_i < h_i, so the h_i are tried from the
    # last one down and the search stops at the first success: the residual passes of
    # the rows below tau are never needed (when every draft is kept, none is).  Same
    # uniforms, same tau as computing every h_i first.
    if rows_read == n_draft and n_draft > 0 and work.etas[n_draft - 1] < ratio:
        tau = n_draft
    else:
        for i in range(rows_read - 1, 0, -1):
            w_i = store + i * n
            law_i = &work.store_laws[i]
            x = tokens[i]
            if q == NULL:
                mass = work.store_ratios[i] * ((law_i.total - <double> w_i[x]) / law_i.total)
            else:
                mass = residual_sum(w_i, q + i * q_stride, n, work.store_ratios[i], law_i.total,
                                    q_laws[i].total, work.store_blocks + i * nb)
            work.store_masses[i] = mass
            denom = mass + (1.0 - work.store_ratios[i])
            h = mass / denom if denom > 0.0 else 1.0
            if work.etas[i - 1] < h:
                tau = i
                break
    n_accepted[0] = tau
    token[0] = -1
    if tau == n_draft:
        if bonus:
            row_index[0] = n_draft
            row = rows + n_draft * n
            law_i = &work.store_laws[n_draft]
            err = row_law(row, n, c, work, law_i, <target_logit_t *> work.row_weights,
                          work.blocks)
            if err:
                return err
            token[0] = pick(row, n, law_i, c.inv_t, work.blocks,
                            bitgen.next_double(bitgen.state) * law_i.total)
        return 0
    row = rows + tau * n
    w_i = store + tau * n
    blocks_i = work.store_blocks + tau * nb
    law_i = &work.store_laws[tau]
    u = bitgen.next_double(bitgen.state)
    if q == NULL:
        token[0] = one_hot_residual_pick(w_i, row, n, law_i, tokens[tau], blocks_i, c, u)
        return 0
    q_row = q + tau * q_stride
    if tau == 0:  # row 0's residual (p_0 = 1) is needed only now
        work.store_masses[0] = residual_sum(w_i, q_row, n, 1.0, law_i.total, q_laws[0].total,
                                            blocks_i)
    mass = work.store_masses[tau]
    if mass > 0.0:
        token[0] = residual_pick(w_i, q_row, n, work.store_ratios[tau], law_i.total,
                                 q_laws[tau].total, blocks_i, u * mass)
    else:
        # Empty residual in floating point (p_tau P and Q agree to rounding): fall back
        # on the row's law itself, as the token scheme does.
        token[0] = fresh_pick(row, n, law_i, c, blocks_i, u)
    return 0


cdef int greedy_chain(const target_logit_t *rows, const int64_t *tokens, Py_ssize_t n_draft,
                      Py_ssize_t n, bint bonus, Py_ssize_t *n_accepted, Py_ssize_t *token,
                      Py_ssize_t *row_index) noexcept nogil:
    """Greedy verification: the drafts are kept while each is its row's argmax; 0 or an
    error code (for row *row_index)."""
    cdef Py_ssize_t i = 0, best = -1
    cdef int err = 0
    for i in range(n_draft + 1):
        row_index[0] = i
        if i == n_draft and not bonus:
            best = -1
            break
        err = greedy_token(rows + i * n, n, &best)
        if err or i == n_draft or tokens[i] != best:
            break
    n_accepted[0] = i
    token[0] = best
    return err


cdef int verify_chain_nogil(const target_logit_t *rows, const int64_t *tokens,
                            Py_ssize_t n_draft, Py_ssize_t n, const draft_weight_t *q,
                            Py_ssize_t q_stride, const RowLaw *q_laws, bint bonus,
                            const Controls *c, Workspace work, bitgen_t *bitgen, bint block,
                            Py_ssize_t *n_accepted, Py_ssize_t *token,
                            Py_ssize_t *row_index) noexcept nogil:
    """A chain's verification by the scheme the controls ask for: greedy (``bitgen`` may
    then be NULL), block or token by token; 0 or an error code (for row *row_index)."""
    if c.greedy:
        return greedy_chain(rows, tokens, n_draft, n, bonus, n_accepted, token, row_index)
    if block:
        return verify_block_nogil(rows, tokens, n_draft, n, q, q_stride, q_laws, bonus, c,
                                  work, bitgen, n_accepted, token, row_index)
    return verify_token_nogil(rows, tokens, n_draft, n, q, q_stride, q_laws, bonus, c, work,
                              bitgen, n_accepted, token, row_index)


cdef object verify_rows(const target_logit_t *rows, const int64_t *tokens, Py_ssize_t n_draft,
                        Py_ssize_t n, const draft_weight_t *q, Py_ssize_t q_stride,
                        const RowLaw *q_laws, bint bonus, const Controls *c, object rng,
                        Workspace work, bint block):
    """verify on raw rows: ``rows`` (n_draft + 1, n) C-contiguous; ``q`` NULL for
    one-hot drafts, else (>= n_draft, n) with rows ``q_stride`` apart."""
    cdef Py_ssize_t i = 0, n_accepted = 0, token = -1
    cdef int err = 0
    if c.greedy:  # draws nothing: no generator, no lock
        with nogil:
            err = verify_chain_nogil(rows, tokens, n_draft, n, q, q_stride, q_laws, bonus, c,
                                     work, NULL, block, &n_accepted, &token, &i)
        if err:
            raise InvalidLogitsError(i, err)
        return n_accepted, token

    if block:
        work.reserve_rows(n_draft + 1)
    bit_generator = rng.bit_generator
    cdef bitgen_t *bitgen = bitgen_of(bit_generator)
    with bit_generator.lock, nogil:
        err = verify_chain_nogil(rows, tokens, n_draft, n, q, q_stride, q_laws, bonus, c,
                                 work, bitgen, block, &n_accepted, &token, &i)
    if err:
        raise InvalidLogitsError(i, err)
    return n_accepted, token


cdef object verify_with_target(const target_logit_t[:, ::1] target_rows, const int64_t *tokens,
                               Py_ssize_t n_draft, object draft_weights,
                               const RowLaw *q_laws, bint bonus, const Controls *c,
                               object rng, Workspace work, bint block):
    """Dispatch on the draft weights' type (or their absence: one-hot drafts)."""
    cdef const float[:, ::1] q32
    cdef const double[:, ::1] q64
    cdef Py_ssize_t n = target_rows.shape[1]
    cdef const target_logit_t *rows = &target_rows[0, 0]
    if draft_weights is None or n_draft == 0:
        return verify_rows(rows, tokens, n_draft, n, <const float *> NULL, 0, q_laws, bonus, c,
                           rng, work, block)
    if draft_weights.dtype == np.float32:
        q32 = draft_weights
        return verify_rows(rows, tokens, n_draft, n, &q32[0, 0], n, q_laws, bonus, c, rng,
                           work, block)
    q64 = draft_weights
    return verify_rows(rows, tokens, n_draft, n, &q64[0, 0], n, q_laws, bonus, c, rng, work,
                       block)


cdef int check_token_range(const int64_t *tokens, Py_ssize_t n,
                           Py_ssize_t vocab_size) except -1:
    """int64 draft tokens must lie in [0, vocab_size) (check_verify_args did the rest)."""
    cdef Py_ssize_t i
    for i in range(n):
        if tokens[i] < 0 or tokens[i] >= vocab_size:
            raise token_range_error("verify", tokens[i], vocab_size)
    return 0


cdef object verify_plain(cnp.ndarray target_rows, cnp.ndarray draft_tokens, object draft_weights,
                         object draft_laws, bint bonus, object controls, object rng,
                         Workspace work, bint block):
    """verify on arguments plain_verify_args accepted: straight to their data."""
    cdef Controls c = unpack_controls(controls)
    cdef Py_ssize_t n_draft = cnp.PyArray_DIM(draft_tokens, 0), n = work.vocab_size
    cdef const int64_t *tokens = <const int64_t *> cnp.PyArray_DATA(draft_tokens)
    check_token_range(tokens, n_draft, n)
    cdef const void *rows = cnp.PyArray_DATA(target_rows)
    cdef bint rows32 = cnp.PyArray_TYPE(target_rows) == cnp.NPY_FLOAT
    cdef const RowLaw *q_laws = NULL
    cdef const void *q = NULL
    cdef bint q32 = True
    if draft_weights is not None and n_draft > 0:
        q = cnp.PyArray_DATA(<cnp.ndarray> draft_weights)
        q32 = cnp.PyArray_TYPE(<cnp.ndarray> draft_weights) == cnp.NPY_FLOAT
        q_laws = <const RowLaw *> cnp.PyArray_DATA(<cnp.ndarray> draft_laws)
    cdef Py_ssize_t q_stride = n if q != NULL else 0
    if rows32 and q32:
        return verify_rows(<const float *> rows, tokens, n_draft, n, <const float *> q,
                           q_stride, q_laws, bonus, &c, rng, work, block)
    if rows32:
        return verify_rows(<const float *> rows, tokens, n_draft, n, <const double *> q,
                           q_stride, q_laws, bonus, &c, rng, work, block)
    if q32:
        return verify_rows(<const double *> rows, tokens, n_draft, n, <const float *> q,
                           q_stride, q_laws, bonus, &c, rng, work, block)
    return verify_rows(<const double *> rows, tokens, n_draft, n, <const double *> q,
                       q_stride, q_laws, bonus, &c, rng, work, block)


def verify(target_rows, draft_tokens, draft_weights, draft_laws, bint bonus, object controls,
           object rng, Workspace work not None, block=False):
    """Compiled twin of ``specdec._fallback.verify``, whose docstring _backend copies."""
    if plain_verify_args(target_rows, draft_tokens, draft_weights, draft_laws, block,
                         work.vocab_size):
        return verify_plain(target_rows, draft_tokens, draft_weights, draft_laws, bonus,
                            controls, rng, work, block)
    check_verify_args(target_rows, draft_tokens, draft_weights, draft_laws, block,
                      work.vocab_size, token_range=False)
    cdef Controls c = unpack_controls(controls)
    cdef const int64_t[::1] tokens = np.ascontiguousarray(draft_tokens, dtype=np.int64)
    cdef Py_ssize_t n_draft = tokens.shape[0]
    check_token_range(&tokens[0] if n_draft else NULL, n_draft, work.vocab_size)
    cdef const RowLaw[::1] q_laws
    cdef const RowLaw *q_law_ptr = NULL
    if draft_laws is not None and n_draft > 0:
        q_laws = draft_laws
        q_law_ptr = &q_laws[0]
    cdef const int64_t *token_ptr = &tokens[0] if n_draft > 0 else NULL
    cdef const float[:, ::1] t32
    cdef const double[:, ::1] t64
    if target_rows.dtype == np.float32:
        t32 = target_rows
        return verify_with_target[float](t32, token_ptr, n_draft, draft_weights, q_law_ptr,
                                         bonus, &c, rng, work, block)
    t64 = target_rows
    return verify_with_target[double](t64, token_ptr, n_draft, draft_weights, q_law_ptr, bonus,
                                      &c, rng, work, block)


# --- batches: the engine's verify_batch ----------------------------------------------

cdef enum:
    # Where a sequence of a batch failed (column 0 of _BatchStep.failures); 0: it did not.
    FAILED_DRAFT_ROW = 1    # a draft row has no law (the error code in column 2)
    FAILED_DRAFT_TOKEN = 2  # a draft token has probability 0 under its row's law
    FAILED_TARGET_ROW = 3   # a target row has no law


cdef inline void failure(int64_t *failed, int where, Py_ssize_t row, int code) noexcept nogil:
    failed[0] = where
    failed[1] = row
    failed[2] = code


cdef void verify_sequence(const target_logit_t *rows, const draft_weight_t *draft_rows,
                          draft_weight_t *q, RowLaw *q_laws, const int64_t *tokens,
                          Py_ssize_t n_draft, Py_ssize_t n, const Controls *c, bint block,
                          Workspace work, bitgen_t *bitgen, int64_t *out,
                          int64_t *failed) noexcept nogil:
    """One sequence of a batch, as ``row_laws`` then ``verify`` would run it: the laws of
    its draft rows (``draft_rows`` NULL: one-hot drafts) into ``q`` and ``q_laws``, then
    the verification of its ``n_draft + 1`` target rows, with a bonus token.

    ``out``: [drafts kept, next token]; ``failed``: [where, row, error code] on failure."""
    cdef Py_ssize_t i, row = 0, kept = 0, token = -1
    cdef int err = 0
    cdef const draft_weight_t *q_read = NULL
    cdef const RowLaw *q_laws_read = NULL
    if draft_rows != NULL and n_draft > 0:
        err = fill_row_laws(draft_rows, n_draft, n, c, q_laws, q, work, &row)
        if err:
            failure(failed, FAILED_DRAFT_ROW, row, err)
            return
        if not c.greedy:
            for i in range(n_draft):
                if q[i * n + tokens[i]] <= 0:
                    failure(failed, FAILED_DRAFT_TOKEN, i, 0)
                    return
        q_read, q_laws_read = q, q_laws
    err = verify_chain_nogil(rows, tokens, n_draft, n, q_read, n, q_laws_read, True, c, work,
                             bitgen, block, &kept, &token, &row)
    if err:
        failure(failed, FAILED_TARGET_ROW, row, err)
        return
    out[0] = kept
    out[1] = token


cdef class _BatchStep:
    """The sequences of one batched verification, for every thread that calls :meth:`run`.

    Compiled only (the engine's pure-Python path verifies a sequence at a time).  Each
    thread's share runs in one stretch without the GIL: handing the GIL over at every
    sequence (a Python call per sequence) kept two threads at 1.3-1.6x one at B = 8,
    V = 32,000 on a 2-core VM.  Sequences are claimed from a shared counter, and each
    draws only from its own bit generator, so results do not depend on the threads.

    Parameters
    ----------
    target : float32 or float64 array, shape (B, K + 1, V)
        Each sequence's rows C-contiguous (any stride between sequences).
    draft : float32 or float64 array, shape (B, K, V), or None
        Draft logits laid out like ``target``; None for one-hot drafts.
    ids, lengths : C-contiguous int64 arrays, shapes (B, K) and (B,)
        Checked by the caller: ids in [0, V), lengths in [0, K].
    controls : SamplingControls
    generators : list of numpy.random.Generator (or None when greedy), length B
        The caller holds their locks while threads run.
    block : bool
        Block verification, else token by token.
    """
    cdef readonly object n_accepted, next_tokens, tokens, failures
    cdef object arrays, generators
    cdef const char *target
    cdef const char *draft
    cdef Py_ssize_t target_stride, draft_stride  # bytes between sequences
    cdef bint target32, draft32
    cdef const int64_t *ids
    cdef const int64_t *lengths
    cdef int64_t *outcome  # (B, 2): drafts kept, next token
    cdef int64_t *failed  # (B, 3): where, row, error code
    cdef int64_t *token_data  # (B, K + 1)
    cdef Py_ssize_t batch, width, n
    cdef Controls c
    cdef bint block
    cdef bitgen_t **bitgens
    cdef Py_ssize_t next_sequence

    def __cinit__(self, target, draft, ids, lengths, controls, list generators, bint block):
        self.target = sequence_rows(target, "target", &self.target_stride, &self.target32)
        self.batch, self.width, self.n = target.shape[0], target.shape[1] - 1, target.shape[2]
        if draft is not None:
            self.draft = sequence_rows(draft, "draft", &self.draft_stride, &self.draft32)
            if draft.shape != (self.batch, self.width, self.n):
                raise ValueError("draft and target disagree in shape")
        cdef const int64_t[:, ::1] id_view = ids
        cdef const int64_t[::1] length_view = lengths
        if (id_view.shape[0], id_view.shape[1]) != (self.batch, self.width):
            raise ValueError("ids must have shape (B, K)")
        if length_view.shape[0] != self.batch or len(generators) != self.batch:
            raise ValueError("lengths and generators must have one entry per sequence")
        cdef Py_ssize_t b, i
        for b in range(self.batch):  # the engine checked them; a wrong caller must not crash
            if not 0 <= length_view[b] <= self.width:
                raise ValueError(f"lengths[{b}] is outside [0, K]")
            for i in range(length_view[b]):
                if not 0 <= id_view[b, i] < self.n:
                    raise ValueError(f"ids[{b}, {i}] is outside the vocabulary")
        if self.batch:
            self.ids = &id_view[0, 0] if self.width else NULL
            self.lengths = &length_view[0]
        self.arrays = (target, draft, ids, lengths)
        self.c = unpack_controls(controls)
        self.block = block
        self.generators = generators
        self.bitgens = <bitgen_t **> malloc(max(self.batch, 1) * sizeof(bitgen_t *))
        if self.bitgens == NULL:
            raise MemoryError()
        for b in range(self.batch):
            self.bitgens[b] = NULL if self.c.greedy else bitgen_of(generators[b].bit_generator)
        outcome = np.empty((2, self.batch), dtype=np.int64)
        self.n_accepted, self.next_tokens = outcome
        self.outcome = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> outcome)
        self.failures = np.zeros((self.batch, 3), dtype=np.int64)
        self.failed = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> self.failures)
        self.tokens = np.empty((self.batch, self.width + 1), dtype=np.int64)
        self.token_data = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> self.tokens)

    def __dealloc__(self):
        free(self.bitgens)

    def run(self, Workspace work not None, laws_out, weights_out):
        """Verify sequences until none is left, with this thread's buffers.

        ``work`` for V logits; ``laws_out`` (>= K,) of LAW_DTYPE and ``weights_out``
        (>= K, V) of the draft's type: the draft rows' laws (ignored for one-hot drafts).
        Results go to :attr:`n_accepted`, :attr:`next_tokens` and :attr:`tokens` (the
        kept drafts, the next token, then -1s), failures to :attr:`failures`: per
        sequence where it failed (FAILED_DRAFT_ROW, FAILED_DRAFT_TOKEN, FAILED_TARGET_ROW
        or 0), the row and the error code.
        """
        if work.vocab_size != self.n:
            raise ValueError("work and the rows disagree on the vocabulary")
        cdef RowLaw[::1] laws = laws_out
        cdef float[:, ::1] weights32
        cdef double[:, ::1] weights64
        cdef void *weights = NULL
        if self.draft != NULL and self.width:
            if laws.shape[0] < self.width:
                raise ValueError("laws_out holds fewer than K laws")
            if self.draft32:
                weights32 = weights_out
                if weights32.shape[0] < self.width or weights32.shape[1] != self.n:
                    raise ValueError("weights_out must have shape (>= K, V)")
                weights = &weights32[0, 0]
            else:
                weights64 = weights_out
                if weights64.shape[0] < self.width or weights64.shape[1] != self.n:
                    raise ValueError("weights_out must have shape (>= K, V)")
                weights = &weights64[0, 0]
        if self.block and not self.c.greedy:
            work.reserve_rows(self.width + 1)
        cdef RowLaw *law_data = &laws[0] if laws.shape[0] else NULL
        cdef Py_ssize_t b
        with nogil:
            while True:
                b = sd_claim(&self.next_sequence)
                if b >= self.batch:
                    break
                self.verify_claimed(b, law_data, weights, work)

    def first_failure(self):
        """The lowest sequence that failed (see :attr:`failures`), or -1 if none did.

        A scan in C: NumPy's ``failures[:, 0].any()`` costs a small batch's call 3 us.
        """
        cdef Py_ssize_t b
        for b in range(self.batch):
            if self.failed[3 * b]:
                return b
        return -1

    cdef void verify_claimed(self, Py_ssize_t b, RowLaw *laws, void *weights,
                             Workspace work) noexcept nogil:
        """Sequence b, dispatched on the rows' types."""
        cdef const char *rows = self.target + b * self.target_stride
        cdef const char *draft = NULL
        if self.draft != NULL:
            draft = self.draft + b * self.draft_stride
        cdef const int64_t *tokens = self.ids + b * self.width if self.width else NULL
        cdef Py_ssize_t n_draft = self.lengths[b], i
        cdef int64_t outcome[2]
        outcome[0], outcome[1] = 0, -1
        if self.target32 and (draft == NULL or self.draft32):
            verify_sequence(<const float *> rows, <const float *> draft, <float *> weights,
                            laws, tokens, n_draft, self.n, &self.c, self.block, work,
                            self.bitgens[b], outcome, self.failed + 3 * b)
        elif self.target32:
            verify_sequence(<const float *> rows, <const double *> draft, <double *> weights,
                            laws, tokens, n_draft, self.n, &self.c, self.block, work,
                            self.bitgens[b], outcome, self.failed + 3 * b)
        elif draft == NULL or self.draft32:
            verify_sequence(<const double *> rows, <const float *> draft, <float *> weights,
                            laws, tokens, n_draft, self.n, &self.c, self.block, work,
                            self.bitgens[b], outcome, self.failed + 3 * b)
        else:
            verify_sequence(<const double *> rows, <const double *> draft, <double *> weights,
                            laws, tokens, n_draft, self.n, &self.c, self.block, work,
                            self.bitgens[b], outcome, self.failed + 3 * b)
        if self.failed[3 * b]:
            return
        self.outcome[b] = outcome[0]
        self.outcome[self.batch + b] = outcome[1]
        cdef int64_t *row = self.token_data + b * (self.width + 1)
        for i in range(self.width + 1):
            row[i] = tokens[i] if i < outcome[0] else -1
        row[outcome[0]] = outcome[1]


cdef const char *sequence_rows(object rows, str name, Py_ssize_t *stride,
                               bint *is32) except? NULL:
    """The data of (B, R, V) float rows whose sequences' rows are each C-contiguous (what
    the kernels read); the bytes between sequences into *stride."""
    if not cnp.PyArray_Check(rows):
        raise TypeError(f"{name} must be a NumPy array")
    cdef cnp.ndarray array = <cnp.ndarray> rows
    cdef int typenum = cnp.PyArray_TYPE(array)
    if typenum != cnp.NPY_FLOAT and typenum != cnp.NPY_DOUBLE or cnp.PyArray_NDIM(array) != 3:
        raise TypeError(f"{name} must be a 3-D float32 or float64 array")
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(array)
    # An empty array (no drafts: R = 0) has strides of 0 that say nothing; none is read.
    cdef bint laid_out = cnp.PyArray_SIZE(array) == 0 or (
        (cnp.PyArray_DIM(array, 2) <= 1 or cnp.PyArray_STRIDE(array, 2) == itemsize)
        and (cnp.PyArray_DIM(array, 1) <= 1
             or cnp.PyArray_STRIDE(array, 1) == cnp.PyArray_DIM(array, 2) * itemsize))
    if not cnp.PyArray_ISNOTSWAPPED(array) or not cnp.PyArray_ISALIGNED(array) or not laid_out:
        raise ValueError(f"{name}: each sequence's rows must be C-contiguous, aligned, native")
    is32[0] = typenum == cnp.NPY_FLOAT
    stride[0] = cnp.PyArray_STRIDE(array, 0)
    return <const char *> cnp.PyArray_DATA(array)


# --- tree verification ---------------------------------------------------------------

cdef inline Py_ssize_t next_child(const int64_t *parents, Py_ssize_t n_nodes, Py_ssize_t node,
                                  Py_ssize_t after) noexcept nogil:
    """The first child of ``node`` (-1: the root) with an index above ``after``, or
    n_nodes.  Children come after their parent, so the scan starts there."""
    cdef Py_ssize_t j = max(after + 1, node + 1)
    while j < n_nodes and parents[j] != node:
        j += 1
    return j


cdef int verify_tree_nogil(const target_logit_t *rows, const int64_t *tokens,
                           const int64_t *parents, Py_ssize_t n_nodes, Py_ssize_t n,
                           const draft_weight_t *q, Py_ssize_t q_stride, const RowLaw *q_laws,
                           const Controls *c, Workspace work, bitgen_t *bitgen, int64_t *path,
                           Py_ssize_t *depth, Py_ssize_t *token,
                           Py_ssize_t *row_index) noexcept nogil:
    """Multi-step speculative sampling over a tree (SpecInfer, Miao et al. 2024); q NULL:
    one-hot drafts.

    At node ``node`` (row node + 1), the current law starts as the target's P; its
    children are tried in index order, one uniform each: child x is kept when
    u q(x) < p(x) (u < p(x) for one-hot drafts), and the walk descends to it; after a
    rejection p becomes norm(max(0, p - q)) (one-hot: p without x).  When no child is
    kept, one more uniform draws the next token from the current p.  A chain is
    therefore ``verify_token_nogil`` draw for draw: the same uniforms, the same
    weights, the same residual sums, the same inverse-CDF scans.

    Storage: P's weights in ``work.row_weights`` and its block sums in
    ``work.blocks``.  One-hot rejections zero the rejected weight there.  A sampled
    rejection writes its residual into ``work.weights`` (free between two row laws),
    and the next sibling's rejection rewrites it in place.  If floating point leaves a
    residual empty although a child was rejected (only rounding can), the remaining
    children are not tried and the next token comes from P, as the chain does.
    """
    cdef RowLaw law
    cdef target_logit_t *w = <target_logit_t *> work.row_weights
    cdef double *residual = work.weights
    cdef const target_logit_t *row
    cdef const draft_weight_t *q_row
    cdef Py_ssize_t node = -1, child, x
    cdef double total, p, u
    cdef bint rejected, kept
    cdef int err = 0
    depth[0] = 0
    token[0] = -1
    while True:
        row_index[0] = node + 1
        row = rows + (node + 1) * n
        err = row_law(row, n, c, work, &law, w, work.blocks)
        if err:
            return err
        total = law.total
        rejected = False
        kept = False
        child = next_child(parents, n_nodes, node, node)
        while child < n_nodes:
            x = tokens[child]
            u = bitgen.next_double(bitgen.state)
            if q == NULL:
                p = <double> w[x] / total
                kept = u < p  # never keeps p(x) = 0, even with u = 0
                if not kept:
                    total = one_hot_remove(w, n, x, work.blocks)
            else:
                q_row = q + child * q_stride
                p = (residual[x] if rejected else <double> w[x]) / total
                kept = u * draft_probability(q_row, &q_laws[child], x) < p
                if not kept and rejected:
                    total = stored_residual_sum(residual, q_row, n, total, q_laws[child].total,
                                                work.blocks)
                elif not kept:
                    total = residual_sum(w, q_row, n, 1.0, total, q_laws[child].total,
                                         work.blocks, residual)
            if kept:
                break
            rejected = True
            if not total > 0.0:
                break
            child = next_child(parents, n_nodes, node, child)
        if kept:
            path[depth[0]] = child
            depth[0] += 1
            node = child
            continue
        u = bitgen.next_double(bitgen.state)
        if not rejected:  # a leaf: the bonus draw from P
            token[0] = pick(row, n, &law, c.inv_t, work.blocks, u * law.total)
        elif not total > 0.0:
            token[0] = fresh_pick(row, n, &law, c, work.blocks, u)
        elif q == NULL:
            token[0] = stored_pick(w, n, work.blocks, u * total)
        else:
            token[0] = sd_stored_pick_f64(residual, n, work.blocks, u * total)
        return 0


cdef object verify_tree_rows(const target_logit_t *rows, const int64_t *tokens,
                             const int64_t *parents, Py_ssize_t n_nodes, Py_ssize_t n,
                             const draft_weight_t *q, Py_ssize_t q_stride,
                             const RowLaw *q_laws, const Controls *c, object rng,
                             Workspace work, int64_t *path):
    """verify_tree on raw rows: ``rows`` (n_nodes + 1, n) C-contiguous; ``q`` NULL for
    one-hot drafts, else (n_nodes, n) with rows ``q_stride`` apart."""
    cdef Py_ssize_t node = -1, child = 0, best = -1, depth = 0, token = -1, row_index = 0
    cdef int err = 0
    if c.greedy:
        # Descend to the child equal to the target's argmax (the lowest id among its
        # maxima); no uniform is drawn.
        with nogil:
            while True:
                row_index = node + 1
                err = greedy_token(rows + row_index * n, n, &best)
                if err:
                    break
                child = next_child(parents, n_nodes, node, node)
                while child < n_nodes and tokens[child] != best:
                    child = next_child(parents, n_nodes, node, child)
                if child == n_nodes:
                    break
                path[depth] = child
                depth += 1
                node = child
        if err:
            raise InvalidLogitsError(row_index, err)
        return depth, best

    bit_generator = rng.bit_generator
    cdef bitgen_t *bitgen = bitgen_of(bit_generator)
    with bit_generator.lock, nogil:
        err = verify_tree_nogil(rows, tokens, parents, n_nodes, n, q, q_stride, q_laws, c, work,
                                bitgen, path, &depth, &token, &row_index)
    if err:
        raise InvalidLogitsError(row_index, err)
    return depth, token


cdef object verify_tree_with_target(const target_logit_t[:, ::1] target_rows,
                                    const int64_t *tokens, const int64_t *parents,
                                    Py_ssize_t n_nodes, object draft_weights,
                                    const RowLaw *q_laws, const Controls *c, object rng,
                                    Workspace work, int64_t *path):
    """Dispatch on the draft weights' type (or their absence: one-hot drafts)."""
    cdef const float[:, ::1] q32
    cdef const double[:, ::1] q64
    cdef Py_ssize_t n = target_rows.shape[1]
    cdef const target_logit_t *rows = &target_rows[0, 0]
    if draft_weights is None or n_nodes == 0:
        return verify_tree_rows(rows, tokens, parents, n_nodes, n, <const float *> NULL, 0,
                                q_laws, c, rng, work, path)
    if draft_weights.dtype == np.float32:
        q32 = draft_weights
        return verify_tree_rows(rows, tokens, parents, n_nodes, n, &q32[0, 0], n, q_laws, c,
                                rng, work, path)
    q64 = draft_weights
    return verify_tree_rows(rows, tokens, parents, n_nodes, n, &q64[0, 0], n, q_laws, c, rng,
                            work, path)


def verify_tree(target_rows, draft_tokens, parents, draft_weights, draft_laws,
                object controls, object rng, Workspace work not None, path_out):
    """Compiled twin of ``specdec._fallback.verify_tree``, whose docstring _backend copies."""
    check_tree_args(target_rows, draft_tokens, parents, draft_weights, draft_laws, path_out,
                    work.vocab_size)
    cdef Controls c = unpack_controls(controls)
    cdef const int64_t[::1] tokens = np.ascontiguousarray(draft_tokens, dtype=np.int64)
    cdef const int64_t[::1] parent_ids = np.ascontiguousarray(parents, dtype=np.int64)
    cdef int64_t[::1] path = path_out
    cdef Py_ssize_t n_nodes = tokens.shape[0]
    cdef const RowLaw[::1] q_laws
    cdef const RowLaw *q_law_ptr = NULL
    if draft_laws is not None and n_nodes > 0:
        q_laws = draft_laws
        q_law_ptr = &q_laws[0]
    cdef const int64_t *token_ptr = &tokens[0] if n_nodes > 0 else NULL
    cdef const int64_t *parent_ptr = &parent_ids[0] if n_nodes > 0 else NULL
    cdef int64_t *path_ptr = &path[0] if n_nodes > 0 else NULL
    cdef const float[:, ::1] t32
    cdef const double[:, ::1] t64
    if target_rows.dtype == np.float32:
        t32 = target_rows
        return verify_tree_with_target[float](t32, token_ptr, parent_ptr, n_nodes, draft_weights,
                                              q_law_ptr, &c, rng, work, path_ptr)
    t64 = target_rows
    return verify_tree_with_target[double](t64, token_ptr, parent_ptr, n_nodes, draft_weights,
                                           q_law_ptr, &c, rng, work, path_ptr)
