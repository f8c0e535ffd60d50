/*
 * Row kernels of specdec's compiled core, in C so that GCC can vectorise them.
 *
 * Every function here reads one row of logits (float or double, contiguous) and
 * works in double.  The row's *law* under the sampling controls is
 *
 *     w(i) = exp((x[i] - m) * inv_t)   if x[i] >= tau and (x[i] - m) * inv_t >= zmin
 *     w(i) = 0                         otherwise
 *     P(i) = w(i) / Z,   Z = sum_i w(i)
 *
 * with m the row's maximum, inv_t = 1 / temperature, tau a logit threshold (top-k,
 * top-p) and zmin a threshold on the scaled logit (min-p, log(min_p)).  The Python
 * twin in _fallback.py computes the same quantities with NumPy; the two differ only
 * by the rounding of exp and of the order of summation (see _core.pyx).
 *
 * For float32 logits all of this is done in float (the weights), and the sums in
 * double; m, inv_t, tau and zmin are rounded to float once per row.
 *
 * The per-type code lives in two templates: _row_template.h is instantiated once per
 * logits type and _residual_template.h once per pair of (target, draft) types, both
 * through _level_template.h, which this file includes once per SIMD level.
 *
 * SIMD levels.  The hot loops are written branch-free with a polynomial exp so that
 * the compiler vectorises them; the same source is compiled for each level the
 * compiler can target (every function of a level under that level's target options):
 *
 *     avx512    AVX-512 F/BW/DQ/VL with AVX2 and FMA (x86-64-v4), GCC and clang
 *     avx2      AVX2 with FMA (x86-64-v3), GCC and clang
 *     baseline  the build's own flags: SSE2 on x86-64, NEON on aarch64
 *
 * and one level is chosen at run time (sd_use_level, from _core.pyx at import): the
 * best the CPU supports (__builtin_cpu_supports), or the one SPECDEC_SIMD forces.  The
 * callers see one name per kernel (sd_expsum_f32...), a call through the active
 * level's table.  MSVC and non-x86 targets get the baseline level only.
 *
 * No -ffast-math: NaN checks must survive, and the sums are split explicitly (omp simd
 * reductions) instead.
 */
#ifndef SPECDEC_KERNELS_H
#define SPECDEC_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The x86 levels need per-function target options and __builtin_cpu_supports. */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) \
    && !defined(SPECDEC_BASELINE_ONLY)
#define SD_X86_LEVELS 1
#else
#define SD_X86_LEVELS 0
#endif

#if defined(_MSC_VER)
#define SD_SIMD_SUM(var)
#define SD_INLINE static __inline
#define SD_RESTRICT __restrict
#else
#define SD_RESTRICT restrict
#define SD_PRAGMA(x) _Pragma(#x)
#define SD_SIMD_SUM(var) SD_PRAGMA(omp simd reduction(+ : var))
#define SD_INLINE static inline
#endif

#define SD_PASTE(a, b) a##b
#define SD_XPASTE(a, b) SD_PASTE(a, b)

#if defined(__GNUC__) || defined(__clang__)
#define SD_PREFETCH(address) __builtin_prefetch((address), 0, 1)
#else
#define SD_PREFETCH(address) ((void)(address))
#endif

/* One source: EXP_LOWEST_F32/_F64 in _common.py; _core.pyx checks these at import.
 * The exp of _level_template.h is valid from these bounds up to 0. */
#define SD_EXP_LOWEST_F32 (-87.0f)
#define SD_EXP_LOWEST_F64 (-708.0)

/* Elements per block of the sampling pass: a draw finds its block from the block
 * sums and rescans only that block, so no V-sized CDF is ever stored. */
#define SD_BLOCK 512

/* Partial maxima a row's maximum is found in, under compilers other than GCC (see
 * sd_max_nan): a few vector registers' worth at every level, so that the updates do
 * not wait on each other. */
#define SD_MAX_LANES 32

/* How many blocks ahead a first pass over a row requests memory. */
#ifndef SD_PREFETCH_BLOCKS
#define SD_PREFETCH_BLOCKS 4
#endif

/* The block of an inverse-CDF draw from block sums: the first block whose cumulative
 * sum exceeds *target, with the mass of the blocks before it in *below.  When
 * rounding puts the target at or past the total, the last block of positive mass,
 * with *target set to +inf so that its scan ends on its last positive weight.
 * -1 when no block has mass. */
static ptrdiff_t sd_choose_block(const double *blocks, ptrdiff_t nblocks, double *target,
                                 double *below)
{
    ptrdiff_t last_block = -1;
    double acc = 0.0;
    for (ptrdiff_t b = 0; b < nblocks; b++) {
        if (!(blocks[b] > 0.0)) continue;
        if (acc + blocks[b] > *target) {
            *below = acc;
            return b;
        }
        last_block = b;
        acc += blocks[b];
    }
    if (last_block >= 0) {
        *below = acc - blocks[last_block];
        *target = INFINITY;
    }
    return last_block;
}

/* In-place quickselect: the value of rank k (0-based, ascending) of a[0..n). */
static double sd_select_rank(double *a, ptrdiff_t n, ptrdiff_t k)
{
    ptrdiff_t lo = 0, hi = n - 1;
    while (hi > lo) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        /* median of three as the pivot keeps sorted and reversed rows linear */
        double a0 = a[lo], a1 = a[mid], a2 = a[hi];
        double pivot = a0 < a1 ? (a1 < a2 ? a1 : (a0 < a2 ? a2 : a0))
                               : (a0 < a2 ? a0 : (a1 < a2 ? a2 : a1));
        ptrdiff_t i = lo, j = hi;
        /* Hoare partition: stops on equal keys, so rows full of ties stay linear. */
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double tmp = a[i]; a[i] = a[j]; a[j] = tmp;
                i++; j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k];
    }
    return a[k];
}

/* Top-p threshold from candidate (value, weight) pairs: the largest value v such
 * that `above` plus the weight of all candidates with value >= v reaches `target`.
 * A quickselect on mass: expected O(n), no sort.  Ties stay together.  When rounding
 * leaves the target out of reach, -inf (keep every token). */
static double sd_mass_threshold(double *vals, double *ws, ptrdiff_t n, double above,
                                double target)
{
    ptrdiff_t lo = 0, hi = n;
    /* `above`: weight of the tokens known to lie above [lo, hi), at first those above
     * every candidate given */
    double pivot;
    while (hi > lo) {
        pivot = vals[lo + (hi - lo) / 2];
        /* three-way partition of [lo, hi): > pivot | == pivot | < pivot */
        ptrdiff_t gt = lo, i = lo, lt = hi;
        double mass_gt = 0.0, mass_eq = 0.0;
        while (i < lt) {
            double v = vals[i], w = ws[i];
            if (v > pivot) {
                vals[i] = vals[gt]; ws[i] = ws[gt];
                vals[gt] = v; ws[gt] = w;
                mass_gt += w;
                gt++; i++;
            } else if (v < pivot) {
                lt--;
                vals[i] = vals[lt]; ws[i] = ws[lt];
                vals[lt] = v; ws[lt] = w;
            } else {
                mass_eq += w;
                i++;
            }
        }
        if (gt > lo && above + mass_gt >= target) {
            hi = gt;
        } else if (above + mass_gt + mass_eq >= target) {
            return pivot;
        } else {
            above += mass_gt + mass_eq;
            lo = lt;
        }
    }
    /* Rounding left the target just out of reach (top_p within rounding of 1): keep
     * every token, as the Python twin does. */
    return -INFINITY;
}

/* The kernels the callers use, one X(return type, name, parameters, arguments) each:
 * every level defines name##level, its table holds them in this order, and `name`
 * itself calls the active level's. */
#define SD_KERNELS(X)                                                                        \
    X(double, sd_max_f32, (const float *x, ptrdiff_t n, int *bad), (x, n, bad))              \
    X(double, sd_max_f64, (const double *x, ptrdiff_t n, int *bad), (x, n, bad))             \
    X(ptrdiff_t, sd_first_index_f32, (const float *x, ptrdiff_t n, double value),            \
      (x, n, value))                                                                         \
    X(ptrdiff_t, sd_first_index_f64, (const double *x, ptrdiff_t n, double value),           \
      (x, n, value))                                                                         \
    X(double, sd_expsum_f32,                                                                 \
      (const float *x, ptrdiff_t n, double m, double inv_t, double tau, double zmin,         \
       double *blocks, float *weights, const float *prefetch, double *max_out, int *bad_out), \
      (x, n, m, inv_t, tau, zmin, blocks, weights, prefetch, max_out, bad_out))              \
    X(double, sd_expsum_f64,                                                                 \
      (const double *x, ptrdiff_t n, double m, double inv_t, double tau, double zmin,        \
       double *blocks, double *weights, const double *prefetch, double *max_out,             \
       int *bad_out),                                                                        \
      (x, n, m, inv_t, tau, zmin, blocks, weights, prefetch, max_out, bad_out))              \
    X(ptrdiff_t, sd_pick_f32,                                                                \
      (const float *x, ptrdiff_t n, double m, double inv_t, double tau, double zmin,         \
       const double *blocks, double target),                                                 \
      (x, n, m, inv_t, tau, zmin, blocks, target))                                           \
    X(ptrdiff_t, sd_pick_f64,                                                                \
      (const double *x, ptrdiff_t n, double m, double inv_t, double tau, double zmin,        \
       const double *blocks, double target),                                                 \
      (x, n, m, inv_t, tau, zmin, blocks, target))                                           \
    X(double, sd_block_sum_f32, (const float *w, ptrdiff_t start, ptrdiff_t end),            \
      (w, start, end))                                                                       \
    X(double, sd_block_sum_f64, (const double *w, ptrdiff_t start, ptrdiff_t end),           \
      (w, start, end))                                                                       \
    X(ptrdiff_t, sd_stored_pick_f32,                                                         \
      (const float *w, ptrdiff_t n, const double *blocks, double target),                    \
      (w, n, blocks, target))                                                                \
    X(ptrdiff_t, sd_stored_pick_f64,                                                         \
      (const double *w, ptrdiff_t n, const double *blocks, double target),                   \
      (w, n, blocks, target))                                                                \
    X(double, sd_kth_largest_f32, (const float *x, ptrdiff_t n, ptrdiff_t k, double *work),  \
      (x, n, k, work))                                                                       \
    X(double, sd_kth_largest_f64, (const double *x, ptrdiff_t n, ptrdiff_t k, double *work), \
      (x, n, k, work))                                                                       \
    X(double, sd_top_p_threshold_f32,                                                        \
      (const float *x, ptrdiff_t n, double m, double inv_t, double tau, double z_kept,       \
       double top_p, double *vals, double *ws),                                              \
      (x, n, m, inv_t, tau, z_kept, top_p, vals, ws))                                        \
    X(double, sd_top_p_threshold_f64,                                                        \
      (const double *x, ptrdiff_t n, double m, double inv_t, double tau, double z_kept,      \
       double top_p, double *vals, double *ws),                                              \
      (x, n, m, inv_t, tau, z_kept, top_p, vals, ws))                                        \
    SD_RESIDUAL_KERNELS(X, f32_f32, float, float)                                            \
    SD_RESIDUAL_KERNELS(X, f32_f64, float, double)                                           \
    SD_RESIDUAL_KERNELS(X, f64_f32, double, float)                                           \
    SD_RESIDUAL_KERNELS(X, f64_f64, double, double)

#define SD_RESIDUAL_KERNELS(X, pair, TP, TQ)                                                 \
    X(double, sd_residual_sum_##pair,                                                        \
      (const TP *wp, const TQ *wq, ptrdiff_t n, double scale, double zp, double zq,          \
       double *blocks, double *store),                                                       \
      (wp, wq, n, scale, zp, zq, blocks, store))                                             \
    X(ptrdiff_t, sd_residual_pick_##pair,                                                    \
      (const TP *wp, const TQ *wq, ptrdiff_t n, double scale, double zp, double zq,          \
       const double *blocks, double target),                                                 \
      (wp, wq, n, scale, zp, zq, blocks, target))

#define SD_TABLE_FIELD(ret, name, params, args) ret(*name) params;
typedef struct {
    SD_KERNELS(SD_TABLE_FIELD)
} SdKernels;
#undef SD_TABLE_FIELD

/* The levels, best first.  Each is compiled under its own target options: the
 * compiler vectorises the same source for each (GCC's pragma, clang's attribute). */
#if SD_X86_LEVELS
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2")
#endif
#define SD_LEVEL _avx512
#define SD_FMAF(a, b, c) fmaf((a), (b), (c))
#include "_level_template.h"
#undef SD_LEVEL
#undef SD_FMAF
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")
#endif
#define SD_LEVEL _avx2
#define SD_FMAF(a, b, c) fmaf((a), (b), (c))
#include "_level_template.h"
#undef SD_LEVEL
#undef SD_FMAF
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* SD_X86_LEVELS */

/* The baseline: the build's own flags.  Where they include FMA (aarch64, or x86 built
 * with -mfma) fmaf is one instruction.  Elsewhere (x86-64's SSE2) a multiply and an
 * add, each rounded: libm's software fmaf, or an emulation in double as the Python
 * twin's fused mode does it, would make this level slower than the NumPy loop it
 * replaces (0.4-0.8x the reference at V = 32,000, against 3.3x).  Its float32 weights
 * are then within one ulp of the fused levels', and the twin follows: _backend.py
 * switches it to the same unfused operations while such a level is active
 * (sd_level_fuses), so that both backends still compute bit-identical weights. */
#if defined(FP_FAST_FMAF) || defined(__FMA__) || defined(__aarch64__)
#define SD_FMAF(a, b, c) fmaf((a), (b), (c))
#define SD_BASELINE_FUSED 1
#else
#define SD_FMAF(a, b, c) ((a) * (b) + (c))
#define SD_BASELINE_FUSED 0
#endif
#define SD_LEVEL _baseline
#include "_level_template.h"
#undef SD_LEVEL
#undef SD_FMAF

/* Level numbers, best first; the names are _core.pyx's SIMD_LEVELS. */
enum { SD_LEVEL_AVX512 = 0, SD_LEVEL_AVX2 = 1, SD_LEVEL_BASELINE = 2, SD_LEVEL_COUNT = 3 };

static const SdKernels *const sd_level_tables[SD_LEVEL_COUNT] = {
#if SD_X86_LEVELS
    &sd_kernels_avx512, &sd_kernels_avx2,
#else
    NULL, NULL,
#endif
    &sd_kernels_baseline,
};

/* The active level's kernels: the baseline until sd_use_level picks another. */
static const SdKernels *sd_active = &sd_kernels_baseline;
static int sd_active_level = SD_LEVEL_BASELINE;

/* Whether this build holds level `level` and this CPU (and OS) can run it. */
SD_INLINE int sd_level_supported(int level)
{
    if (level < 0 || level >= SD_LEVEL_COUNT || sd_level_tables[level] == NULL) return 0;
#if SD_X86_LEVELS
    __builtin_cpu_init();
    if (level == SD_LEVEL_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
               && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    if (level == SD_LEVEL_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
#endif
    return level == SD_LEVEL_BASELINE;
}

/* Whether level `level` computes the float exp's multiply-adds fused (SD_FMAF). */
SD_INLINE int sd_level_fuses(int level)
{
    return level == SD_LEVEL_BASELINE ? SD_BASELINE_FUSED : 1;
}

/* Make `level` the active one; -1 (and no change) when it is not supported. */
SD_INLINE int sd_use_level(int level)
{
    if (!sd_level_supported(level)) return -1;
    sd_active = sd_level_tables[level];
    sd_active_level = level;
    return 0;
}

/* The next index of a counter that threads share (an engine batch's next sequence):
 * each value is returned once, whatever the threads. */
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
SD_INLINE Py_ssize_t sd_claim(Py_ssize_t *counter)
{
#if defined(_WIN64)
    return (Py_ssize_t)_InterlockedExchangeAdd64((volatile __int64 *)counter, 1);
#else
    return (Py_ssize_t)_InterlockedExchangeAdd((volatile long *)counter, 1);
#endif
}
#else
SD_INLINE Py_ssize_t sd_claim(Py_ssize_t *counter)
{
    return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}
#endif

/* Each kernel's public name calls the active level's. */
#define SD_DISPATCH(ret, name, params, args) \
    SD_INLINE ret name params { return sd_active->name args; }
SD_KERNELS(SD_DISPATCH)
#undef SD_DISPATCH

#endif /* SPECDEC_KERNELS_H */
