/*
 * Template of the residual law norm(max(0, s p - q)) of a rejected draft, for one
 * pair of types: _level_template.h includes it once per pair and SIMD level, with SD_TP
 * (target weights), SD_TQ (draft weights) and SD_SUFFIX defined.  p = wp / Zp and
 * q = wq / Zq, from the weights the row passes stored; s = 1 for token-by-token
 * verification, and the prefix ratio p_i of block verification (Sun et al. 2025) for a
 * block's residual.
 * The scale enters as one multiplication, s / Zp, so that s = 1 is bit for bit the
 * unscaled residual.
 */

/* Include only through _kernels.h (via _level_template.h), which defines the
 * parameters and the helpers first. */
#ifndef SD_LEVEL
#error "include _kernels.h, not this template: it instantiates the template per level and type"
#endif
#ifndef SD_TP
#error "SD_TP must be defined before including this template (see _kernels.h)"
#endif
#ifndef SD_TQ
#error "SD_TQ must be defined before including this template (see _kernels.h)"
#endif
#ifndef SD_SUFFIX
#error "SD_SUFFIX must be defined before including this template (see _kernels.h)"
#endif
#ifndef SD_INLINE
#error "SD_INLINE must be defined before including this template (see _kernels.h)"
#endif
#ifndef SD_BLOCK
#error "SD_BLOCK must be defined before including this template (see _kernels.h)"
#endif

/* Residual weights of the block [start, end) into out[0 .. end - start).  The
 * comparison, not a clamp of the difference, keeps the support exact: r > 0 iff
 * p > q. */
SD_INLINE void SD_SUFFIX(sd_residual_block)(const SD_TP *wp, const SD_TQ *wq, ptrdiff_t start,
                                            ptrdiff_t end, double inv_zp, double inv_zq,
                                            double *out)
{
    for (ptrdiff_t i = start; i < end; i++) {
        double p = (double)wp[i] * inv_zp;
        double q = (double)wq[i] * inv_zq;
        out[i - start] = p > q ? p - q : 0.0;
    }
}

/* Total residual mass, with per-block sums stored in `blocks`.  When `store` is not
 * NULL, the residual weights are kept there too (n doubles; tree verification tests
 * the next sibling against them and draws from them with sd_stored_pick_f64, which
 * gives sd_residual_pick's token).  `store` may be `wp` itself (SD_TP double): each
 * weight is read before it is overwritten. */
static double SD_SUFFIX(sd_residual_sum)(const SD_TP *wp, const SD_TQ *wq, ptrdiff_t n,
                                                   double scale, double zp, double zq,
                                                   double *blocks, double *store)
{
    const double inv_zp = scale / zp, inv_zq = 1.0 / zq;
    double total = 0.0;
    ptrdiff_t b = 0;
    for (ptrdiff_t start = 0; start < n; start += SD_BLOCK, b++) {
        ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
        double scratch[SD_BLOCK];
        double *residual = store ? store + start : scratch;
        SD_SUFFIX(sd_residual_block)(wp, wq, start, end, inv_zp, inv_zq, residual);
        double s = 0.0;
        SD_SIMD_SUM(s)
        for (ptrdiff_t j = 0; j < end - start; j++) s += residual[j];
        blocks[b] = s;
        total += s;
    }
    return total;
}

/* Inverse-CDF draw from the residual; same contract as sd_pick. */
static ptrdiff_t SD_SUFFIX(sd_residual_pick)(const SD_TP *wp, const SD_TQ *wq, ptrdiff_t n,
                                             double scale, double zp, double zq,
                                             const double *blocks, double target)
{
    const double inv_zp = scale / zp, inv_zq = 1.0 / zq;
    double acc = 0.0;
    ptrdiff_t chosen = sd_choose_block(blocks, (n + SD_BLOCK - 1) / SD_BLOCK, &target, &acc);
    if (chosen < 0) return -1;
    ptrdiff_t start = chosen * SD_BLOCK;
    ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
    double residual[SD_BLOCK];
    SD_SUFFIX(sd_residual_block)(wp, wq, start, end, inv_zp, inv_zq, residual);
    ptrdiff_t last_positive = -1;
    for (ptrdiff_t i = start; i < end; i++) {
        double r = residual[i - start];
        if (r > 0.0) {
            acc += r;
            last_positive = i;
            if (acc > target) return i;
        }
    }
    return last_positive;
}
