# cython: language_level=3
"""Declarations of the C kernels (``_kernels.h`` and its two templates), once.

Each template function exists per logits type (``_f32``, ``_f64``) or per pair of
(target, draft) types (``_f32_f64``...); ``_core.pyx`` dispatches its fused types to
them in one place.
"""

cdef extern from "_kernels.h" nogil:
    int SD_BLOCK
    float SD_EXP_LOWEST_F32
    double SD_EXP_LOWEST_F64

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
    double sd_block_sum_f32(const float *w, Py_ssize_t start, Py_ssize_t end)
    double sd_block_sum_f64(const double *w, Py_ssize_t start, Py_ssize_t end)
    Py_ssize_t sd_stored_pick_f32(const float *w, Py_ssize_t n, const double *blocks,
                                  double target)
    Py_ssize_t sd_stored_pick_f64(const double *w, Py_ssize_t n, const double *blocks,
                                  double target)
    double sd_kth_largest_f32(const float *x, Py_ssize_t n, Py_ssize_t k, double *work)
    double sd_kth_largest_f64(const double *x, Py_ssize_t n, Py_ssize_t k, double *work)
    double sd_top_p_threshold_f32(const float *x, Py_ssize_t n, double m, double inv_t,
                                  double tau, double z_kept, double top_p,
                                  double *vals, double *ws)
    double sd_top_p_threshold_f64(const double *x, Py_ssize_t n, double m, double inv_t,
                                  double tau, double z_kept, double top_p,
                                  double *vals, double *ws)

    double sd_residual_sum_f32_f32(const float *wp, const float *wq, Py_ssize_t n,
                                   double scale, double zp, double zq, double *blocks,
                                   double *store)
    Py_ssize_t sd_residual_pick_f32_f32(const float *wp, const float *wq, Py_ssize_t n,
                                        double scale, double zp, double zq,
                                        const double *blocks, double target)
    double sd_residual_sum_f32_f64(const float *wp, const double *wq, Py_ssize_t n,
                                   double scale, double zp, double zq, double *blocks,
                                   double *store)
    Py_ssize_t sd_residual_pick_f32_f64(const float *wp, const double *wq, Py_ssize_t n,
                                        double scale, double zp, double zq,
                                        const double *blocks, double target)
    double sd_residual_sum_f64_f32(const double *wp, const float *wq, Py_ssize_t n,
                                   double scale, double zp, double zq, double *blocks,
                                   double *store)
    Py_ssize_t sd_residual_pick_f64_f32(const double *wp, const float *wq, Py_ssize_t n,
                                        double scale, double zp, double zq,
                                        const double *blocks, double target)
    double sd_residual_sum_f64_f64(const double *wp, const double *wq, Py_ssize_t n,
                                   double scale, double zp, double zq, double *blocks,
                                   double *store)
    Py_ssize_t sd_residual_pick_f64_f64(const double *wp, const double *wq, Py_ssize_t n,
                                        double scale, double zp, double zq,
                                        const double *blocks, double target)


# A row's law under the sampling controls (see _kernels.h): the weights are
# w(i) = exp((x[i] - shift) / temperature) where x[i] >= tau and the scaled logit
# >= zmin, else 0; the probabilities are w / total.  Matches
# specdec._common.LAW_DTYPE field for field, so NumPy arrays of laws are
# memoryviews of this struct.
ctypedef struct RowLaw:
    double shift
    double tau
    double zmin
    double total


# The SIMD levels compiled into this core (see _kernels.h), numbered best first.
cdef extern from "_kernels.h" nogil:
    int SD_LEVEL_COUNT
    int sd_active_level
    int sd_level_supported(int level)
    int sd_use_level(int level)
    int sd_level_fuses(int level)
    Py_ssize_t sd_claim(Py_ssize_t *counter)
