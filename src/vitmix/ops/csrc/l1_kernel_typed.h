/* The L1 distance forward and backward for one dtype (see l1_kernel.c). */
#undef JB
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE SFX(VEC) __attribute__((vector_size(VEC_BYTES)));
typedef ITYPE SFX(IVEC) __attribute__((vector_size(VEC_BYTES)));
#define ABSMASK ((SFX(IVEC)){0} + (ITYPE)(~((UTYPE)1 << (8 * sizeof(TYPE) - 1))))
#define VABS(v) ((SFX(VEC))((SFX(IVEC))(v) & ABSMASK))             /* |v|: clear the sign bit */

/* out[i, j0 : j0 + JB] for one row (tail rows) */
static void SFX(l1_row)(const TYPE *xi, const TYPE *yb, TYPE *o, int64_t M, int64_t Mp, int64_t D) {
    for (int64_t j0 = 0; j0 < Mp; j0 += JB) {
        SFX(VEC) acc = {0}, yv;
        for (int64_t c = 0; c < D; ++c) {
            memcpy(&yv, yb + c * Mp + j0, sizeof yv);
            acc += VABS(xi[c] - yv);
        }
        TYPE sums[JB];
        memcpy(sums, &acc, sizeof sums);
        const int64_t nj = M - j0 < JB ? M - j0 : JB;
        for (int64_t jj = 0; jj < nj; ++jj) o[j0 + jj] = sums[jj];
    }
}

/* the same for four rows at once: four independent accumulator chains share each landmark load */
static void SFX(l1_rows4)(const TYPE *x0, const TYPE *x1, const TYPE *x2, const TYPE *x3, const TYPE *yb,
                         TYPE *o, int64_t M, int64_t Mp, int64_t D) {
    for (int64_t j0 = 0; j0 < Mp; j0 += JB) {
        SFX(VEC) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv;
        for (int64_t c = 0; c < D; ++c) {
            memcpy(&yv, yb + c * Mp + j0, sizeof yv);
            a0 += VABS(x0[c] - yv);
            a1 += VABS(x1[c] - yv);
            a2 += VABS(x2[c] - yv);
            a3 += VABS(x3[c] - yv);
        }
        TYPE sums[4][JB];
        memcpy(sums[0], &a0, sizeof a0);
        memcpy(sums[1], &a1, sizeof a1);
        memcpy(sums[2], &a2, sizeof a2);
        memcpy(sums[3], &a3, sizeof a3);
        const int64_t nj = M - j0 < JB ? M - j0 : JB;
        for (int64_t r = 0; r < 4; ++r)
            for (int64_t jj = 0; jj < nj; ++jj) o[r * M + j0 + jj] = sums[r][jj];
    }
}

void SFX(vitmix_l1_fwd)(const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    /* Landmarks in blocks of JB (transposed, zero-padded to Mp): the partial sums of a token stay in
     * registers over all D channels; rows go four at a time so that the additions of one channel are
     * independent (one chain per row hides the add latency). */
    const int64_t nblk = (N + rows - 1) / rows;
    const int64_t Mp = (M + JB - 1) / JB * JB;
    (void)nthreads;                        /* only the OpenMP pragma reads it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        TYPE *yb = (TYPE *)calloc((size_t)(D * Mp), sizeof(TYPE));     /* (D, Mp), zero padding */
        const TYPE *ysrc = y + b * M * D;
        for (int64_t j = 0; j < M; ++j)
            for (int64_t c = 0; c < D; ++c) yb[c * Mp + j] = ysrc[j * D + c];
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4)
            SFX(l1_rows4)(XROW(x, xs, b, i), XROW(x, xs, b, i + 1), XROW(x, xs, b, i + 2), XROW(x, xs, b, i + 3),
                         yb, out + (b * N + i) * M, M, Mp, D);
        for (; i < i1; ++i) SFX(l1_row)(XROW(x, xs, b, i), yb, out + (b * N + i) * M, M, Mp, D);
        free(yb);
    }
}

/* g·sign(x - y) lane-wise: g with its sign bit flipped where x < y, zero where x == y (or unordered) */
static inline SFX(VEC) SFX(signed_g)(SFX(VEC) xv, SFX(VEC) yv, SFX(VEC) gv) {
    const SFX(VEC) t = xv - yv;
    const SFX(IVEC) nonzero = (SFX(IVEC))((t > (SFX(VEC)){0}) | (t < (SFX(VEC)){0}));
    return (SFX(VEC))((((SFX(IVEC))gv) ^ ((SFX(IVEC))t & ~ABSMASK)) & nonzero);
}

void SFX(vitmix_l1_bwd)(const TYPE *g, const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *gx, TYPE *part,
                       int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads) {
    /* Vectorised over channels in blocks of JB, in the natural (M, D) layout: for a token i and a
     * landmark j, w = g_ij·sign(x_i - y_j) is added to gx_i (kept in registers over all landmarks) and
     * subtracted from this item's grad-y partial row j (in L1). No horizontal sums, no transposes; the
     * channel blocks of a row are independent chains. Channels past the last full block: scalar. */
    const int64_t nblk = (N + rows - 1) / rows;
    const int64_t Dv = D / JB * JB;
    (void)nthreads;                        /* only the OpenMP pragma reads it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = y + b * M * D;
        TYPE *py = part + item * M * D;
        memset(py, 0, sizeof(TYPE) * (size_t)(M * D));
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = XROW(x, xs, b, i), *gi = g + (b * N + i) * M;
            TYPE *gxi = gx + (b * N + i) * D;
            int64_t c0 = 0;
            for (; c0 + 4 * JB <= Dv; c0 += 4 * JB) {          /* four channel blocks: four chains */
                SFX(VEC) x0, x1, x2, x3, a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv, pv, w;
                memcpy(&x0, xi + c0, sizeof x0);
                memcpy(&x1, xi + c0 + JB, sizeof x1);
                memcpy(&x2, xi + c0 + 2 * JB, sizeof x2);
                memcpy(&x3, xi + c0 + 3 * JB, sizeof x3);
                for (int64_t j = 0; j < M; ++j) {
                    const SFX(VEC) gv = (SFX(VEC)){0} + gi[j];
                    const TYPE *yj = yb + j * D + c0;
                    TYPE *pj = py + j * D + c0;
#define VITMIX_L1_STEP(K, XV, ACC) \
                    memcpy(&yv, yj + (K) * JB, sizeof yv); memcpy(&pv, pj + (K) * JB, sizeof pv); \
                    w = SFX(signed_g)(XV, yv, gv); ACC += w; pv -= w; memcpy(pj + (K) * JB, &pv, sizeof pv);
                    VITMIX_L1_STEP(0, x0, a0)
                    VITMIX_L1_STEP(1, x1, a1)
                    VITMIX_L1_STEP(2, x2, a2)
                    VITMIX_L1_STEP(3, x3, a3)
#undef VITMIX_L1_STEP
                }
                memcpy(gxi + c0, &a0, sizeof a0);
                memcpy(gxi + c0 + JB, &a1, sizeof a1);
                memcpy(gxi + c0 + 2 * JB, &a2, sizeof a2);
                memcpy(gxi + c0 + 3 * JB, &a3, sizeof a3);
            }
            for (; c0 < Dv; c0 += JB) {                        /* remaining full blocks, one at a time */
                SFX(VEC) xv, a = {0}, yv, pv, w;
                memcpy(&xv, xi + c0, sizeof xv);
                for (int64_t j = 0; j < M; ++j) {
                    memcpy(&yv, yb + j * D + c0, sizeof yv);
                    memcpy(&pv, py + j * D + c0, sizeof pv);
                    w = SFX(signed_g)(xv, yv, (SFX(VEC)){0} + gi[j]);
                    a += w;
                    pv -= w;
                    memcpy(py + j * D + c0, &pv, sizeof pv);
                }
                memcpy(gxi + c0, &a, sizeof a);
            }
            for (int64_t c = Dv; c < D; ++c) {                 /* channel tail */
                TYPE a = 0;
                for (int64_t j = 0; j < M; ++j) {
                    const TYPE t = xi[c] - yb[j * D + c];
                    const TYPE w = t > 0 ? gi[j] : (t < 0 ? -gi[j] : (TYPE)0);
                    a += w;
                    py[j * D + c] -= w;
                }
                gxi[c] = a;
            }
        }
    }
}

#undef ABSMASK
#undef VABS
