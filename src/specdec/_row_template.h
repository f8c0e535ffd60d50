/*
 * Template of the row kernels for one logits type: _level_template.h includes it once
 * per type and SIMD level, with SD_T (float or double) and SD_SUFFIX (appends _f32 or
 * _f64 and the level, e.g. _f32_avx2, to a name) defined.  See _kernels.h for the row
 * law these functions compute.
 */

/* Include only through _kernels.h (via _level_template.h), which defines the
 * parameters and the helpers first. */
#ifndef SD_LEVEL
#error "include _kernels.h, not this template: it instantiates the template per level and type"
#endif
#ifndef SD_T
#error "SD_T must be defined before including this template (see _kernels.h)"
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

/* The maximum of x[0..n), with *nan_seen set when an element is NaN.
 *
 * GCC vectorises a plain max reduction (the second form).  Clang leaves a max
 * reduction whose comparison must respect NaN scalar (decoding 3.4x slower at
 * AVX-512), so every other compiler gets an elementwise update of SD_MAX_LANES partial
 * maxima and NaN flags, then a fold of the lanes: loops clang vectorises on x86 and
 * aarch64, and independent chains even where nothing is vectorised (MSVC, not
 * measured).  GCC runs that form 25% slower than its reduction at AVX-512, so each
 * keeps its own.  Which of two equal maxima (+0, -0) comes out may differ between the
 * two forms; the weights do not: x - (+0) and x - (-0) differ only at x = +-0, where
 * both weights are exp(0). */
SD_INLINE SD_T SD_SUFFIX(sd_max_nan)(const SD_T *x, ptrdiff_t n, int *nan_seen)
{
#if !(defined(__GNUC__) && !defined(__clang__))
    SD_T lanes[SD_MAX_LANES];
    int nans[SD_MAX_LANES];
    for (int j = 0; j < SD_MAX_LANES; j++) {
        lanes[j] = -INFINITY;
        nans[j] = 0;
    }
    ptrdiff_t i = 0;
    for (; i + SD_MAX_LANES <= n; i += SD_MAX_LANES) {
        for (int j = 0; j < SD_MAX_LANES; j++) {
            SD_T v = x[i + j];
            lanes[j] = v > lanes[j] ? v : lanes[j];
            nans[j] |= v != v;
        }
    }
    for (; i < n; i++) {
        SD_T v = x[i];
        lanes[0] = v > lanes[0] ? v : lanes[0];
        nans[0] |= v != v;
    }
    SD_T m = -INFINITY;
    int nan = 0;
    for (int j = 0; j < SD_MAX_LANES; j++) {
        nan |= nans[j];
        m = lanes[j] > m ? lanes[j] : m;
    }
#else
    SD_T m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (ptrdiff_t i = 0; i < n; i++) {
        SD_T v = x[i];
        m = v > m ? v : m;
        nan |= (v != v);
    }
#endif
    *nan_seen = nan;
    return m;
}

/* The row's maximum; *bad is set when the row holds a NaN or +inf. */
static double SD_SUFFIX(sd_max)(const SD_T *x, ptrdiff_t n, int *bad)
{
    int nan_seen;
    SD_T m = SD_SUFFIX(sd_max_nan)(x, n, &nan_seen);
    *bad = nan_seen | (m == (SD_T)INFINITY);
    return (double)m;
}

/* The first index holding `value` (greedy decoding breaks ties to the lowest id).
 * Blocks are tested for a match with a vectorised OR first, then one is scanned. */
static ptrdiff_t SD_SUFFIX(sd_first_index)(const SD_T *x, ptrdiff_t n, double value)
{
    const SD_T v = (SD_T)value;
    for (ptrdiff_t start = 0; start < n; start += SD_BLOCK) {
        ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
        int found = 0;
#if !defined(_MSC_VER)
#pragma omp simd reduction(| : found)
#endif
        for (ptrdiff_t i = start; i < end; i++) found |= (x[i] == v);
        if (found) {
            for (ptrdiff_t i = start; i < end; i++) {
                if (x[i] == v) return i;
            }
        }
    }
    return n - 1;
}

/* Z = sum of the row's weights.  When `blocks` is not NULL, also stores the sum of
 * each block of SD_BLOCK elements there, for sd_pick; when `weights` is not NULL,
 * stores every weight there (verify reuses them for the residual law).  When
 * `prefetch` is not NULL, it is the next row to be read: this pass is bound by
 * arithmetic, so it asks for that row meanwhile, and the next row's first pass
 * then reads from cache instead of waiting on memory.  When `max_out` is not NULL,
 * also returns the row's maximum there, and in *bad_out whether it holds NaN or +inf
 * (then `m` is a provisional shift, see row_law in _core.pyx). */
static double SD_SUFFIX(sd_expsum)(const SD_T *x, ptrdiff_t n, double m, double inv_t,
                                             double tau, double zmin, double *blocks,
                                             SD_T *weights, const SD_T *prefetch,
                                             double *max_out, int *bad_out)
{
    const SD_T mt = (SD_T)m, it = (SD_T)inv_t, taut = (SD_T)tau, zt = SD_SUFFIX(sd_zlow)(zmin);
    double total = 0.0;
    SD_T running_max = -INFINITY;
    int nan_seen = 0;
    ptrdiff_t b = 0;
    for (ptrdiff_t start = 0; start < n; start += SD_BLOCK, b++) {
        ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
        if (max_out) {
            /* The row's maximum and NaN check, a block at a time: when `m` is only a
             * provisional shift, this first touch of each block overlaps with the
             * arithmetic instead of streaming the whole row in a pass of its own;
             * blocks further on are requested ahead. */
            ptrdiff_t ahead = start + SD_PREFETCH_BLOCKS * SD_BLOCK;
            if (ahead < n) {
                ptrdiff_t ahead_end = ahead + SD_BLOCK < n ? ahead + SD_BLOCK : n;
                const char *line = (const char *)(x + ahead);
                const char *stop = (const char *)(x + ahead_end);
                for (; line < stop; line += 64) SD_PREFETCH(line);
            }
            int block_nan;
            SD_T block_max = SD_SUFFIX(sd_max_nan)(x + start, end - start, &block_nan);
            running_max = block_max > running_max ? block_max : running_max;
            nan_seen |= block_nan;
        }
        /* Two simple loops vectorise where one fused loop does not (GCC gives up on
         * a widening float-to-double reduction around the exp). */
        if (prefetch) {
            const char *line = (const char *)(prefetch + start);
            const char *stop = (const char *)(prefetch + end);
            for (; line < stop; line += 64) SD_PREFETCH(line);
        }
        SD_T scratch[SD_BLOCK];
        SD_T *w = weights ? weights + start : scratch;
        for (ptrdiff_t i = start; i < end; i++) {
            w[i - start] = SD_SUFFIX(sd_weight)(x[i], mt, it, taut, zt);
        }
        double s = 0.0;
        SD_SIMD_SUM(s)
        for (ptrdiff_t j = 0; j < end - start; j++) s += (double)w[j];
        if (blocks) blocks[b] = s;
        total += s;
    }
    if (max_out) {
        *max_out = (double)running_max;
        *bad_out = nan_seen | (running_max == (SD_T)INFINITY);
    }
    return total;
}

/* Inverse-CDF draw: the first index whose cumulative weight exceeds `target`
 * (target = u * Z, u in [0, 1)), found from the block sums and one rescanned block.
 * Never returns an index of zero weight, and never one >= n: when rounding puts
 * target past the last cumulative sum, the last index of positive weight wins. */
static ptrdiff_t SD_SUFFIX(sd_pick)(const SD_T *x, ptrdiff_t n, double m, double inv_t,
                                              double tau, double zmin, const double *blocks,
                                              double target)
{
    const SD_T mt = (SD_T)m, it = (SD_T)inv_t, taut = (SD_T)tau, zt = SD_SUFFIX(sd_zlow)(zmin);
    double acc = 0.0;
    ptrdiff_t chosen = sd_choose_block(blocks, (n + SD_BLOCK - 1) / SD_BLOCK, &target, &acc);
    if (chosen < 0) return -1;
    ptrdiff_t start = chosen * SD_BLOCK;
    ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
    ptrdiff_t last_positive = -1;
    for (ptrdiff_t i = start; i < end; i++) {
        double w = (double)SD_SUFFIX(sd_weight)(x[i], mt, it, taut, zt);
        if (w > 0.0) {
            acc += w;
            last_positive = i;
            if (acc > target) return i;
        }
    }
    return last_positive;
}

/* Sum of the stored weights w[start, end) in double, as sd_expsum sums a block. */
static double SD_SUFFIX(sd_block_sum)(const SD_T *w, ptrdiff_t start, ptrdiff_t end)
{
    double s = 0.0;
    SD_SIMD_SUM(s)
    for (ptrdiff_t i = start; i < end; i++) s += (double)w[i];
    return s;
}

/* Inverse-CDF draw from stored weights `w` and their block sums; same contract as
 * sd_pick.  One-hot drafts' residual uses it: the row's weights with the rejected
 * draft's set to 0 and that block's sum redone (sd_block_sum), no exp recomputed. */
static ptrdiff_t SD_SUFFIX(sd_stored_pick)(const SD_T *w, ptrdiff_t n, const double *blocks,
                                           double target)
{
    double acc = 0.0;
    ptrdiff_t chosen = sd_choose_block(blocks, (n + SD_BLOCK - 1) / SD_BLOCK, &target, &acc);
    if (chosen < 0) return -1;
    ptrdiff_t start = chosen * SD_BLOCK;
    ptrdiff_t end = start + SD_BLOCK < n ? start + SD_BLOCK : n;
    ptrdiff_t last_positive = -1;
    for (ptrdiff_t i = start; i < end; i++) {
        double wi = (double)w[i];
        if (wi > 0.0) {
            acc += wi;
            last_positive = i;
            if (acc > target) return i;
        }
    }
    return last_positive;
}

/* The k-th largest value of the row (1 <= k <= n), using `work` (n doubles).
 * Selecting among all n values costs several passes; instead a strided sample gives
 * a threshold that about 16 + 2k * 1024 / n of every 1024 values exceed, one pass
 * gathers the values above it, and the selection runs on those.  When fewer than k
 * pass (an unlucky row), it selects among all values: the answer is exact either way. */
static double SD_SUFFIX(sd_kth_largest)(const SD_T *x, ptrdiff_t n, ptrdiff_t k, double *work)
{
    const ptrdiff_t sample_size = 1024;
    if (n >= 4 * sample_size) {
        ptrdiff_t stride = n / sample_size;
        ptrdiff_t rank = 2 * (k * sample_size / n) + 16; /* from the top, in the sample */
        if (rank < sample_size) {
            for (ptrdiff_t i = 0; i < sample_size; i++) work[i] = (double)x[i * stride];
            const SD_T guess = (SD_T)sd_select_rank(work, sample_size, sample_size - rank);
            ptrdiff_t count = 0;
            for (ptrdiff_t i = 0; i < n; i++) { /* branch-free: store always, keep some */
                work[count] = (double)x[i];
                count += x[i] >= guess;
            }
            if (count >= k) return sd_select_rank(work, count, count - k);
        }
    }
    for (ptrdiff_t i = 0; i < n; i++) work[i] = (double)x[i];
    return sd_select_rank(work, n, n - k);
}

#define SD_TOP_P_BUCKETS 256

/* ws[j] = weight of the logit vals[j], in blocks of loops of one width each, which
 * GCC vectorises (as in sd_expsum). */
SD_INLINE void SD_SUFFIX(sd_weights_of)(const double *SD_RESTRICT vals, double *SD_RESTRICT ws,
                                        ptrdiff_t count, SD_T m, SD_T inv_t, SD_T tau, SD_T zlow)
{
    SD_T x[SD_BLOCK], w[SD_BLOCK];
    for (ptrdiff_t start = 0; start < count; start += SD_BLOCK) {
        ptrdiff_t len = count - start < SD_BLOCK ? count - start : SD_BLOCK;
        for (ptrdiff_t j = 0; j < len; j++) x[j] = (SD_T)vals[start + j];
        for (ptrdiff_t j = 0; j < len; j++) w[j] = SD_SUFFIX(sd_weight)(x[j], m, inv_t, tau, zlow);
        for (ptrdiff_t j = 0; j < len; j++) ws[start + j] = (double)w[j];
    }
}

/* bucket[j] = the top-p bucket of the logit vals[j]: floor((z - zcut) * scale), clamped. */
SD_INLINE void SD_SUFFIX(sd_buckets_of)(const double *SD_RESTRICT vals, ptrdiff_t len, double m,
                                        double inv_t, double zcut, double scale,
                                        int32_t *SD_RESTRICT bucket)
{
    for (ptrdiff_t j = 0; j < len; j++) {
        double position = ((vals[j] - m) * inv_t - zcut) * scale;
        position = position < 0.0 ? 0.0 : position;
        position = position > SD_TOP_P_BUCKETS - 1 ? SD_TOP_P_BUCKETS - 1 : position;
        bucket[j] = (int32_t)position;
    }
}

/* Top-p threshold over the tokens kept by the logit threshold tau: the largest
 * logit v such that the tokens with logit >= v hold at least top_p of the mass z_kept.
 *
 * Tokens lighter than eps = (1 - top_p) * z_kept / n hold less than 1 - top_p of the
 * mass together, so the threshold lies among the heavier ones, those with
 * z >= log(eps): they are gathered by comparing logits (no exp), with a margin of one
 * nat against rounding.  Their weights are bucketed by z; the buckets, walked from
 * the top, find the one bucket that holds the threshold, and the quickselect on mass
 * runs on that bucket only.  `vals` and `ws` are n doubles of scratch each. */
static double SD_SUFFIX(sd_top_p_threshold)(const SD_T *x, ptrdiff_t n, double m, double inv_t,
                                                      double tau, double z_kept, double top_p,
                                                      double *vals, double *ws)
{
    const SD_T mt = (SD_T)m, it = (SD_T)inv_t, taut = (SD_T)tau, zt = SD_SUFFIX(sd_zlow)(-INFINITY);
    const double eps = 0.5 * (1.0 - top_p) * z_kept / (double)n;
    const double zcut = log(eps) - 1.0;
    double xcut = m + zcut / inv_t;
    if (!(xcut > tau)) xcut = tau;
    ptrdiff_t count = 0;
    for (ptrdiff_t i = 0; i < n; i++) { /* branch-free: store always, keep some */
        vals[count] = (double)x[i];
        count += (double)x[i] >= xcut;
    }
    SD_SUFFIX(sd_weights_of)(vals, ws, count, mt, it, taut, zt);

    /* Buckets by z over [zcut, 0]: monotone in the logit, so bucket b holds larger
     * logits than bucket b - 1.  Indices are computed a block at a time (a loop that
     * vectorises) and the masses summed into four interleaved tables, so that runs of
     * tokens in one bucket do not wait on each other's additions. */
    double mass[4][SD_TOP_P_BUCKETS] = {{0.0}};
    const double scale = SD_TOP_P_BUCKETS / -zcut;
    int32_t bucket[SD_BLOCK];
    for (ptrdiff_t start = 0; start < count; start += SD_BLOCK) {
        ptrdiff_t len = count - start < SD_BLOCK ? count - start : SD_BLOCK;
        SD_SUFFIX(sd_buckets_of)(vals + start, len, m, inv_t, zcut, scale, bucket);
        for (ptrdiff_t j = 0; j < len; j++) mass[j & 3][bucket[j]] += ws[start + j];
    }
    const double target = top_p * z_kept;
    double above = 0.0;
    int32_t chosen;
    for (chosen = SD_TOP_P_BUCKETS - 1; chosen >= 0; chosen--) {
        double in_bucket = (mass[0][chosen] + mass[1][chosen]) + (mass[2][chosen] + mass[3][chosen]);
        if (above + in_bucket >= target) break;
        above += in_bucket;
    }
    if (chosen < 0) return -INFINITY; /* out of reach by rounding: keep every token */
    ptrdiff_t kept = 0;
    for (ptrdiff_t start = 0; start < count; start += SD_BLOCK) {
        ptrdiff_t len = count - start < SD_BLOCK ? count - start : SD_BLOCK;
        SD_SUFFIX(sd_buckets_of)(vals + start, len, m, inv_t, zcut, scale, bucket);
        for (ptrdiff_t j = 0; j < len; j++) { /* branch-free, as above */
            double v = vals[start + j], w = ws[start + j];
            vals[kept] = v;
            ws[kept] = w;
            kept += bucket[j] == chosen;
        }
    }
    return sd_mass_threshold(vals, ws, kept, above, target);
}
