/*
 * The residual law norm(max(0, p - q)) of a rejected draft, for one pair of types:
 * included by _kernels.h with SD_TP (target logits), SD_TQ (draft logits) and
 * SD_SUFFIX.  A law is given as {m, tau, zmin, Z} (see _kernels.h).
 */

/* The residual weight of one token.  The comparison (not a subtraction then a
 * clamp) keeps the support exact: r > 0 iff p > q, even if the compiler fuses
 * the multiply and the subtraction. */
SD_INLINE double SD_SUFFIX(sd_residual_weight)(double xp, double xq, const double *law_p,
                                               const double *law_q, double inv_t,
                                               double inv_zp, double inv_zq)
{
    double p = sd_weight(xp, law_p[0], inv_t, law_p[1], law_p[2]) * inv_zp;
    double q = sd_weight(xq, law_q[0], inv_t, law_q[1], law_q[2]) * inv_zq;
    return p > q ? p - q : 0.0;
}

/* Total residual mass, with per-block sums stored in `blocks`. */
SD_CLONES static double SD_SUFFIX(sd_residual_sum)(const SD_TP *xp, const SD_TQ *xq, ptrdiff_t n,
                                                   const double *law_p, const double *law_q,
                                                   double inv_t, double *blocks)
{
    double inv_zp = 1.0 / law_p[3], inv_zq = 1.0 / law_q[3];
    double total = 0.0;
    ptrdiff_t b = 0;
    for (ptrdiff_t start = 0; start < n; start += SD_BLOCK, b++) {
        ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
        double s = 0.0;
        SD_SIMD_SUM(s)
        for (ptrdiff_t i = start; i < end; i++) {
            s += SD_SUFFIX(sd_residual_weight)((double)xp[i], (double)xq[i], law_p, law_q,
                                               inv_t, inv_zp, inv_zq);
        }
        blocks[b] = s;
        total += s;
    }
    return total;
}

/* Inverse-CDF draw from the residual; same contract as sd_pick. */
static ptrdiff_t SD_SUFFIX(sd_residual_pick)(const SD_TP *xp, const SD_TQ *xq, ptrdiff_t n,
                                             const double *law_p, const double *law_q,
                                             double inv_t, const double *blocks, double target)
{
    double inv_zp = 1.0 / law_p[3], inv_zq = 1.0 / law_q[3];
    ptrdiff_t nblocks = (n + SD_BLOCK - 1) / SD_BLOCK;
    ptrdiff_t chosen = -1, last_block = -1;
    double acc = 0.0;
    for (ptrdiff_t b = 0; b < nblocks; b++) {
        if (!(blocks[b] > 0.0)) continue;
        last_block = b;
        if (acc + blocks[b] > target) {
            chosen = b;
            break;
        }
        acc += blocks[b];
    }
    if (chosen < 0) {
        /* target >= total by rounding: take the last token of positive weight */
        if (last_block < 0) return -1;
        chosen = last_block;
        acc -= blocks[last_block];
        target = INFINITY;
    }
    ptrdiff_t start = chosen * SD_BLOCK;
    ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
    ptrdiff_t last_positive = -1;
    for (ptrdiff_t i = start; i < end; i++) {
        double r = SD_SUFFIX(sd_residual_weight)((double)xp[i], (double)xq[i], law_p, law_q,
                                                 inv_t, inv_zp, inv_zq);
        if (r > 0.0) {
            acc += r;
            last_positive = i;
            if (acc > target) return i;
        }
    }
    return last_positive;
}
