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
 * The per-type code lives in two templates: _row_template.h is included once per
 * logits type and _residual_template.h once per pair of (target, draft) types.
 * Speed: the hot loops are written branch-free with a polynomial exp so that GCC
 * emits AVX-512 / AVX2 code; on
 * x86-64 glibc Linux each function marked SD_CLONES is compiled three times
 * (target_clones) and the best clone is picked at load time.  Elsewhere they are
 * compiled once for the build's baseline (no FMA on baseline x86-64: slower).  No -ffast-math: NaN checks must survive, and the sums are
 * split explicitly (omp simd reductions) instead.
 */
#ifndef SPECDEC_KERNELS_H
#define SPECDEC_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* target_clones needs ifunc: GCC on x86-64 glibc (not musl, not macOS or Windows). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) \
    && !defined(SPECDEC_NO_CLONES)
#define SD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SD_CLONES
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

#if defined(__GNUC__) || defined(__clang__)
#define SD_PREFETCH(address) __builtin_prefetch((address), 0, 1)
#else
#define SD_PREFETCH(address) ((void)(address))
#endif

/* Elements per block of the sampling pass: a draw finds its block from the block
 * sums and rescans only that block, so no V-sized CDF is ever stored. */
#define SD_BLOCK 512

/* How many blocks ahead a first pass over a row requests memory. */
#ifndef SD_PREFETCH_BLOCKS
#define SD_PREFETCH_BLOCKS 4
#endif

/* exp(z) for SD_EXP_LOWEST_* <= z <= 0, in the precision of the logits, branch-free
 * so that loops vectorise.  Cody-Waite reduction z = n ln2 + r, |r| <= ln2/2, then a
 * polynomial (Cephes' expf for float, the degree-12 Taylor series for double), then
 * 2^n from the bits of the rounding constant.  Accuracy: about 1 ulp of the type.
 * For z below the lowest bound (and for z = -inf) the result is garbage: sd_weight
 * masks it to 0 together with the sampling controls, which saves a clamp per element.
 * Such a weight is below 1e-38 (1e-308) of the row's largest.
 *
 * Every step is one IEEE operation written out in order, and the build turns off
 * floating-point contraction (-ffp-contract=off), so these are the operations
 * _fallback.py performs with NumPy.  The float version uses fused multiply-adds,
 * written as fmaf(); NumPy emulates each as a float64 multiply-add rounded to float,
 * which is exact except when the double rounding hits a tie (probability about
 * 2^-29 per operation), so the weights of both backends are bit-identical in
 * practice.  The double version uses no FMA: its twin is exact. */
/* One source: EXP_LOWEST_F32/_F64 in _common.py; _core.pyx checks these at import. */
#define SD_EXP_LOWEST_F32 (-87.0f)
#define SD_EXP_LOWEST_F64 (-708.0)

SD_INLINE float sd_exp_f32(float z)
{
    const float round_magic = 12582912.0f; /* 1.5 * 2^23 */
    float t = fmaf(z, 1.44269504088896341f, round_magic);
    float n = t - round_magic;
    float r = fmaf(n, -0.693359375f, z);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r);
    p = p + 1.0f;
    uint32_t bits; /* unsigned: masked lanes (z below the bound) may wrap, defined */
    memcpy(&bits, &t, sizeof bits);
    uint32_t scale_bits = (bits - (0x4B400000u - 127u)) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

SD_INLINE double sd_exp_f64(double z)
{
    const double round_magic = 6755399441055744.0; /* 1.5 * 2^52 */
    double t = z * 1.4426950408889634 + round_magic;
    double n = t - round_magic;
    double r = z - n * 6.93145751953125e-1;
    r = r - n * 1.42860682030941723212e-6;
    double p = 2.08767569878680989792e-9;   /* 1/12! */
    p = p * r + 2.50521083854417187751e-8;   /* 1/11! */
    p = p * r + 2.75573192239858906526e-7;   /* 1/10! */
    p = p * r + 2.75573192239858906526e-6;   /* 1/9! */
    p = p * r + 2.48015873015873015873e-5;   /* 1/8! */
    p = p * r + 1.98412698412698412698e-4;   /* 1/7! */
    p = p * r + 1.38888888888888888889e-3;   /* 1/6! */
    p = p * r + 8.33333333333333333333e-3;   /* 1/5! */
    p = p * r + 4.16666666666666666667e-2;   /* 1/4! */
    p = p * r + 1.66666666666666666667e-1;   /* 1/3! */
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    uint64_t scale_bits = (bits - (0x4338000000000000ull - 1023u)) << 52;
    double scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

/* Weight of one element under a row law (see the top of this file), computed in the
 * logits' own type: z = (x - m) * inv_t, then exp(z) unless x < tau or z < zlow,
 * where zlow = max(zmin, SD_EXP_LOWEST_*) (sd_zlow_*). */
SD_INLINE float sd_weight_f32(float x, float m, float inv_t, float tau, float zlow)
{
    float z = (x - m) * inv_t;
    float w = sd_exp_f32(z);
    return (x >= tau && z >= zlow) ? w : 0.0f;
}

SD_INLINE double sd_weight_f64(double x, double m, double inv_t, double tau, double zlow)
{
    double z = (x - m) * inv_t;
    double w = sd_exp_f64(z);
    return (x >= tau && z >= zlow) ? w : 0.0;
}

SD_INLINE float sd_zlow_f32(double zmin)
{
    return (float)zmin > SD_EXP_LOWEST_F32 ? (float)zmin : SD_EXP_LOWEST_F32;
}

SD_INLINE double sd_zlow_f64(double zmin)
{
    return zmin > SD_EXP_LOWEST_F64 ? zmin : SD_EXP_LOWEST_F64;
}

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

#define SD_T float
#define SD_SUFFIX(name) name##_f32
#include "_row_template.h"
#undef SD_T
#undef SD_SUFFIX

#define SD_T double
#define SD_SUFFIX(name) name##_f64
#include "_row_template.h"
#undef SD_T
#undef SD_SUFFIX

#define SD_TP float
#define SD_TQ float
#define SD_SUFFIX(name) name##_f32_f32
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP float
#define SD_TQ double
#define SD_SUFFIX(name) name##_f32_f64
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP double
#define SD_TQ float
#define SD_SUFFIX(name) name##_f64_f32
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP double
#define SD_TQ double
#define SD_SUFFIX(name) name##_f64_f64
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#endif /* SPECDEC_KERNELS_H */
