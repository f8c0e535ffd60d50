/*
 * Every kernel of one SIMD level: _kernels.h includes this file once per level, with
 * SD_LEVEL (the level's name suffix, e.g. _avx2) and SD_FMAF (how a float fused
 * multiply-add is computed at that level) defined, and the level's target options in
 * force (#pragma GCC target / clang attribute), so that the compiler vectorises the
 * same source for AVX-512, AVX2 + FMA and the build's baseline.  It instantiates the
 * exp and weight helpers, then the row template per logits type and the residual
 * template per pair of types, every name suffixed with the level.
 */

#ifndef SD_LEVEL
#error "SD_LEVEL must be defined before including this template (see _kernels.h)"
#endif
#ifndef SD_FMAF
#error "SD_FMAF must be defined before including this template (see _kernels.h)"
#endif

#define SD_LV(name) SD_XPASTE(name, SD_LEVEL)

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
 * _fallback.py performs with NumPy.  The float version uses fused multiply-adds
 * (SD_FMAF), which NumPy emulates as float64 multiply-adds rounded to float: the same
 * result except when the double rounding hits a tie (probability about 2^-29 per
 * operation), so the weights of the FMA levels and of the twin are bit-identical in
 * practice.  A baseline without FMA (x86-64's SSE2) rounds the product and the sum
 * separately instead (see SD_FMAF in _kernels.h), and so does the twin while that
 * level is active.
 * The double version uses no FMA: its twin is exact. */
SD_INLINE float SD_LV(sd_exp_f32)(float z)
{
    const float round_magic = 12582912.0f; /* 1.5 * 2^23 */
    float t = SD_FMAF(z, 1.44269504088896341f, round_magic);
    float n = t - round_magic;
    float r = SD_FMAF(n, -0.693359375f, z);
    r = SD_FMAF(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = SD_FMAF(p, r, 1.3981999507e-3f);
    p = SD_FMAF(p, r, 8.3334519073e-3f);
    p = SD_FMAF(p, r, 4.1665795894e-2f);
    p = SD_FMAF(p, r, 1.6666665459e-1f);
    p = SD_FMAF(p, r, 5.0000001201e-1f);
    p = SD_FMAF(p, r * r, r);
    p = p + 1.0f;
    uint32_t bits; /* unsigned: masked lanes (z below the bound) may wrap, defined */
    memcpy(&bits, &t, sizeof bits);
    uint32_t scale_bits = (bits - (0x4B400000u - 127u)) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

SD_INLINE double SD_LV(sd_exp_f64)(double z)
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

/* Weight of one element under a row law (see the top of _kernels.h), computed in the
 * logits' own type: z = (x - m) * inv_t, then exp(z) unless x < tau or z < zlow,
 * where zlow = max(zmin, SD_EXP_LOWEST_*) (sd_zlow_*). */
SD_INLINE float SD_LV(sd_weight_f32)(float x, float m, float inv_t, float tau, float zlow)
{
    float z = (x - m) * inv_t;
    float w = SD_LV(sd_exp_f32)(z);
    return ((x >= tau) & (z >= zlow)) ? w : 0.0f;
}

SD_INLINE double SD_LV(sd_weight_f64)(double x, double m, double inv_t, double tau, double zlow)
{
    double z = (x - m) * inv_t;
    double w = SD_LV(sd_exp_f64)(z);
    return ((x >= tau) & (z >= zlow)) ? w : 0.0;
}

SD_INLINE float SD_LV(sd_zlow_f32)(double zmin)
{
    return (float)zmin > SD_EXP_LOWEST_F32 ? (float)zmin : SD_EXP_LOWEST_F32;
}

SD_INLINE double SD_LV(sd_zlow_f64)(double zmin)
{
    return zmin > SD_EXP_LOWEST_F64 ? zmin : SD_EXP_LOWEST_F64;
}

#define SD_T float
#define SD_SUFFIX(name) SD_LV(name##_f32)
#include "_row_template.h"
#undef SD_T
#undef SD_SUFFIX

#define SD_T double
#define SD_SUFFIX(name) SD_LV(name##_f64)
#include "_row_template.h"
#undef SD_T
#undef SD_SUFFIX

#define SD_TP float
#define SD_TQ float
#define SD_SUFFIX(name) SD_LV(name##_f32_f32)
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP float
#define SD_TQ double
#define SD_SUFFIX(name) SD_LV(name##_f32_f64)
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP double
#define SD_TQ float
#define SD_SUFFIX(name) SD_LV(name##_f64_f32)
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

#define SD_TP double
#define SD_TQ double
#define SD_SUFFIX(name) SD_LV(name##_f64_f64)
#include "_residual_template.h"
#undef SD_TP
#undef SD_TQ
#undef SD_SUFFIX

/* This level's table of kernels, in the order of SD_KERNELS (_kernels.h). */
#define SD_TABLE_ENTRY(ret, name, params, args) SD_LV(name),
static const SdKernels SD_LV(sd_kernels) = {SD_KERNELS(SD_TABLE_ENTRY)};
#undef SD_TABLE_ENTRY

#undef SD_LV
