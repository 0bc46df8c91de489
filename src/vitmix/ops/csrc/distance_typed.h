/* Distances between token rows and landmark rows for one dtype, the inner loop of the Laplacian kernel's L1
 * forward (l1_kernel_typed.h) and of the Nystrom kernel matrices (nystrom_core_typed.h). The landmarks are
 * transposed first, yt (d, mp) zero-padded to mp columns (a multiple of JB): for a fixed row and channel the
 * landmarks are then one contiguous row, so the innermost loop runs over landmarks in JB-wide blocks whose
 * partial sums stay in registers over all d channels (no horizontal sums). */

/* yt (d, mp) = y (m, d) transposed, zero beyond column m */
static void SFX(transpose_pad)(const TYPE *y, TYPE *yt, int64_t m, int64_t mp, int64_t d) {
    memset(yt, 0, sizeof(TYPE) * (size_t)(d * mp));
    for (int64_t j = 0; j < m; ++j)
        for (int64_t c = 0; c < d; ++c) yt[c * mp + j] = y[j * d + c];
}

/* one channel's term of the distance, lane-wise: |t| (L1: clear the sign bit) or t^2 (squared L2) */
static inline SFX(vec) SFX(dist_term)(SFX(vec) t, int kind) {
    return kind ? (SFX(vec))((SFX(ivec))t & ABSMASK) : t * t;
}

/* out (rows, m) = the distances of up to four rows of x (row stride xs) to the landmarks yt; kind 1: L1, 0:
 * squared L2. The four rows are four independent accumulator chains (hiding the add latency) that share each
 * landmark load; missing rows repeat the first and are not stored. */
static void SFX(distance_rows)(const TYPE *x, int64_t xs, int64_t rows, const TYPE *yt, TYPE *out, int64_t m,
                              int64_t mp, int64_t d, int kind) {
    const TYPE *x0 = x, *x1 = x + (rows > 1) * xs, *x2 = x + (rows > 2) * 2 * xs, *x3 = x + (rows > 3) * 3 * xs;
    for (int64_t j0 = 0; j0 < mp; j0 += JB) {
        SFX(vec) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv;
        for (int64_t c = 0; c < d; ++c) {
            memcpy(&yv, yt + c * mp + j0, sizeof yv);
            a0 += SFX(dist_term)(x0[c] - yv, kind);
            a1 += SFX(dist_term)(x1[c] - yv, kind);
            a2 += SFX(dist_term)(x2[c] - yv, kind);
            a3 += SFX(dist_term)(x3[c] - yv, kind);
        }
        TYPE sums[4][JB];
        memcpy(sums[0], &a0, sizeof a0);
        memcpy(sums[1], &a1, sizeof a1);
        memcpy(sums[2], &a2, sizeof a2);
        memcpy(sums[3], &a3, sizeof a3);
        const int64_t nj = m - j0 < JB ? m - j0 : JB;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t jj = 0; jj < nj; ++jj) out[r * m + j0 + jj] = sums[r][jj];
    }
}

/* out (n, m) = the distances of the n rows of x (row stride xs) to the landmarks yt, four rows at a time */
static void SFX(distances)(const TYPE *x, int64_t xs, int64_t n, const TYPE *yt, TYPE *out, int64_t m, int64_t mp,
                          int64_t d, int kind) {
    for (int64_t i = 0; i < n; i += 4)
        SFX(distance_rows)(x + i * xs, xs, n - i < 4 ? n - i : 4, yt, out + i * m, m, mp, d, kind);
}
