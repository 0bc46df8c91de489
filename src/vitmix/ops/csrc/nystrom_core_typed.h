/* The Nystrom core for one dtype (static helpers; see nystrom.c): kernel matrices, small GEMMs, Newton-Schulz
 * from the landmark kernel, the injective map, SOFT-Norm and one (batch, head) slice of the whole product. Also
 * the base of the landmark layers' library (vitmix/mixers/fused/csrc). */
/* Sums over tokens (column means, and gemm's inner dimension, N for the normaliser's products) run in blocks
 * of SUM_BLOCK terms added to a total: float32 rounding then grows with SUM_BLOCK + N / SUM_BLOCK instead of
 * N. With one running sum, a LaplacianFormer stage at N = 1024 gave 7x the composed path's output error,
 * which the untrained pyramid's later stages amplified to a 3 % gradient error. */
#undef SUM_BLOCK
#define SUM_BLOCK 32
#undef FJB
#define FJB ((int64_t)(VEC_BYTES / sizeof(TYPE)))

typedef TYPE SFX(FVEC) __attribute__((vector_size(VEC_BYTES)));
typedef ITYPE SFX(FIVEC) __attribute__((vector_size(VEC_BYTES)));

/* one channel's term of the distance, lane-wise: |t| (L1: clear the sign bit) or t^2 (squared L2) */
static inline SFX(FVEC) SFX(dist_term)(SFX(FVEC) t, int kind) {
    const SFX(FIVEC) mask = (SFX(FIVEC)){0} + (ITYPE)(~((UTYPE)1 << (8 * sizeof(TYPE) - 1)));
    return kind ? (SFX(FVEC))((SFX(FIVEC))t & mask) : t * t;
}

/* distances of up to four rows of x (n rows, row stride d) to all landmarks, given transposed and
 * zero-padded as yt (d, mp): the four rows share each landmark load and keep FJB-wide partial sums in
 * registers over all d channels (no horizontal sums) */
static void SFX(distance_rows)(const TYPE *x, int64_t rows, const TYPE *yt, TYPE *out, int64_t m, int64_t mp,
                              int64_t d, int kind) {
    const TYPE *x0 = x, *x1 = x + (rows > 1) * d, *x2 = x + (rows > 2) * 2 * d, *x3 = x + (rows > 3) * 3 * d;
    for (int64_t j0 = 0; j0 < mp; j0 += FJB) {
        SFX(FVEC) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv;
        for (int64_t c = 0; c < d; ++c) {
            memcpy(&yv, yt + c * mp + j0, sizeof yv);
            a0 += SFX(dist_term)(x0[c] - yv, kind);
            a1 += SFX(dist_term)(x1[c] - yv, kind);
            a2 += SFX(dist_term)(x2[c] - yv, kind);
            a3 += SFX(dist_term)(x3[c] - yv, kind);
        }
        TYPE sums[4][FJB];
        memcpy(sums[0], &a0, sizeof a0);
        memcpy(sums[1], &a1, sizeof a1);
        memcpy(sums[2], &a2, sizeof a2);
        memcpy(sums[3], &a3, sizeof a3);
        const int64_t nj = m - j0 < FJB ? m - j0 : FJB;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t jj = 0; jj < nj; ++jj) out[r * m + j0 + jj] = sums[r][jj];
    }
}

/* out (n, m) = exp(-scale * dist(x_i, y_j)) with y given as yt (d, mp); kind 0: squared L2 (scale 1/2,
 * SOFT), 1: L1 (scale 1/lam) */
static void SFX(kernel_matrix)(const TYPE *x, const TYPE *yt, TYPE *out, int64_t n, int64_t m, int64_t mp,
                              int64_t d, int kind, TYPE scale) {
    for (int64_t i = 0; i < n; i += 4)
        SFX(distance_rows)(x + i * d, n - i < 4 ? n - i : 4, yt, out + i * m, m, mp, d, kind);
    for (int64_t e = 0; e < n * m; ++e) out[e] = EXPFN(-scale * out[e]);
}

/* yt (d, mp) = y (m, d) transposed, zero beyond column m */
static void SFX(transpose_pad)(const TYPE *y, TYPE *yt, int64_t m, int64_t mp, int64_t d) {
    memset(yt, 0, sizeof(TYPE) * (size_t)(d * mp));
    for (int64_t j = 0; j < m; ++j)
        for (int64_t c = 0; c < d; ++c) yt[c * mp + j] = y[j * d + c];
}

/* c[:, j0:j0+w] (row stride p, w <= FJB lanes stored) = A b[:, j0:j0+w] (b's block at row stride p) for rows
 * i..i+rows of A (A[i, l] = a[i * si + l * sl]), rows <= 4: four broadcast-FMA chains share each load of b,
 * and the sums over l run in blocks of SUM_BLOCK (see there). A partial block (w < FJB) loads a full vector
 * of each row of b, whose extra lanes belong to the next row and are never stored; only the rows whose load
 * would read past the end of b (the last one, more when p < FJB) are copied into a zero-padded vector. */
static void SFX(gemm_block)(const TYPE *a, int64_t si, int64_t sl, const TYPE *b, TYPE *c, int64_t p, int64_t i,
                           int64_t rows, int64_t k, int64_t w) {
    const TYPE *a0 = a + i * si, *a1 = a0 + (rows > 1) * si, *a2 = a0 + (rows > 2) * 2 * si;
    const TYPE *a3 = a0 + (rows > 3) * 3 * si;
    /* rows of b loaded as full vectors: those whose FJB lanes end inside b, which ends w lanes into row k - 1 */
    const int64_t room = (k - 1) * p + w - FJB;     /* the last offset a full load may start at */
    const int64_t last = room < 0 ? 0 : (room / p + 1 < k ? room / p + 1 : k);
    SFX(FVEC) acc[4] = {{0}}, bl;
    for (int64_t l0 = 0; l0 < k; l0 += SUM_BLOCK) {
        const int64_t l1 = k - l0 < SUM_BLOCK ? k : l0 + SUM_BLOCK;
        SFX(FVEC) s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int64_t l = l0; l < l1; ++l) {
            if (l < last) {
                memcpy(&bl, b + l * p, sizeof bl);
            } else {
                bl = (SFX(FVEC)){0};
                memcpy(&bl, b + l * p, sizeof(TYPE) * (size_t)w);
            }
            s0 += a0[l * sl] * bl;
            s1 += a1[l * sl] * bl;
            s2 += a2[l * sl] * bl;
            s3 += a3[l * sl] * bl;
        }
        acc[0] += s0;
        acc[1] += s1;
        acc[2] += s2;
        acc[3] += s3;
    }
    for (int64_t r = 0; r < rows; ++r) memcpy(c + (i + r) * p, &acc[r], sizeof(TYPE) * (size_t)w);
}

/* c (n, p) = A b with A (n, k) read as A[i, l] = a[i * si + l * sl] (a or a transposed) and b (k, p)
 * row-major: rows of c go four at a time and each FJB-wide block of them is accumulated in vector registers
 * over l, then stored once (the last block may be partial: m = 25 landmarks are 16 + 9 lanes). At the sizes
 * of one slice (N = 65, m = 16, d = 32) the plain triple loop spent more time in loop overhead and
 * loads/stores of c than in arithmetic. */
static void SFX(gemm)(const TYPE *a, int64_t si, int64_t sl, const TYPE *restrict b, TYPE *restrict c, int64_t n,
                     int64_t k, int64_t p) {
    for (int64_t i = 0; i < n; i += 4) {
        const int64_t rows = n - i < 4 ? n - i : 4;
        for (int64_t j0 = 0; j0 < p; j0 += FJB)
            SFX(gemm_block)(a, si, sl, b + j0, c + j0, p, i, rows, k, p - j0 < FJB ? p - j0 : FJB);
    }
}

/* c (n, p) = a (n, k) b (k, p), row-major */
static void SFX(mm)(const TYPE *restrict a, const TYPE *restrict b, TYPE *restrict c, int64_t n, int64_t k, int64_t p) {
    SFX(gemm)(a, k, 1, b, c, n, k, p);
}

/* c (k, p) = a(n, k)^T b (n, p) */
static void SFX(mtm)(const TYPE *restrict a, const TYPE *restrict b, TYPE *restrict c, int64_t n, int64_t k, int64_t p) {
    SFX(gemm)(a, 1, k, b, c, k, n, p);
}

/* sum (p) = column sums of a (n, p), in blocks of SUM_BLOCK rows (64 columns at a time) */
static void SFX(column_sum)(const TYPE *a, TYPE *sum, int64_t n, int64_t p) {
    for (int64_t j0 = 0; j0 < p; j0 += 64) {
        const int64_t w = p - j0 < 64 ? p - j0 : 64;
        TYPE total[64] = {0}, part[64];
        for (int64_t r0 = 0; r0 < n; r0 += SUM_BLOCK) {
            const int64_t r1 = n - r0 < SUM_BLOCK ? n : r0 + SUM_BLOCK;
            for (int64_t j = 0; j < w; ++j) part[j] = 0;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t j = 0; j < w; ++j) part[j] += a[r * p + j0 + j];
            for (int64_t j = 0; j < w; ++j) total[j] += part[j];
        }
        for (int64_t j = 0; j < w; ++j) sum[j0 + j] = total[j];
    }
}

static void SFX(column_mean)(const TYPE *a, TYPE *mean, int64_t n, int64_t p) {
    SFX(column_sum)(a, mean, n, p);
    for (int64_t j = 0; j < p; ++j) mean[j] /= (TYPE)n;
}

/* M (m, m) = NS(W + eps I) from the landmark kernel W, with the start rule of vitmix_ns_solve */
static int SFX(newton)(const TYPE *w, TYPE *M, int64_t m, TYPE eps, int64_t iters, int rule) {
    const int64_t mp = (m + FJB - 1) / FJB * FJB;
    TYPE *buf = (TYPE *)calloc((size_t)(5 * mp * mp), sizeof(TYPE));
    if (!buf) return 1;
    TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp, *a = buf + 4 * mp * mp;
    for (int64_t i = 0; i < m; ++i) {
        memcpy(a + i * mp, w + i * m, sizeof(TYPE) * (size_t)m);
        memcpy(p + i * mp, w + i * m, sizeof(TYPE) * (size_t)m);
        p[i * mp + i] += eps;
    }
    SFX(ns_start)(a, p, v, m, mp, rule);
    SFX(ns_iterate)(p, v, t, u, M, m, mp, iters);
    free(buf);
    return 0;
}

/* The injective map's statistics (forward and backward share them): cc = C_q centred over queries (mu: its
 * column means), cov = cc^T cc / n, T = M^T cov M (cm = cov M; T made exactly symmetric, as the PyTorch path),
 * D = C_k centred over keys (muk), mv = mean(V) */
static void SFX(injective_stats)(const TYPE *cq, const TYPE *ck, const TYPE *M, const TYPE *v, TYPE *mu, TYPE *cc,
                                TYPE *cov, TYPE *cm, TYPE *T, TYPE *muk, TYPE *D, TYPE *mv, int64_t n, int64_t nk,
                                int64_t m, int64_t dv) {
    SFX(column_mean)(cq, mu, n, m);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t a = 0; a < m; ++a) cc[i * m + a] = cq[i * m + a] - mu[a];
    SFX(mtm)(cc, cc, cov, n, m, m);                 /* population covariance over queries */
    for (int64_t e = 0; e < m * m; ++e) cov[e] /= (TYPE)n;
    SFX(mm)(cov, M, cm, m, m, m);
    SFX(mtm)(M, cm, T, m, m, m);
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = a + 1; b < m; ++b) {
            const TYPE h = (TYPE)0.5 * (T[a * m + b] + T[b * m + a]);
            T[a * m + b] = h;
            T[b * m + a] = h;
        }
    SFX(column_mean)(ck, muk, nk, m);
    SFX(column_mean)(v, mv, nk, dv);
    for (int64_t j = 0; j < nk; ++j)
        for (int64_t a = 0; a < m; ++a) D[j * m + a] = ck[j * m + a] - muk[a];
}

/* out (n, dv) = contrast C_q M D^T (s * V) + mean_w mean(V), the injective map (D: centred C_k; s from
 * T = M^T cov(C_q) M; contrast and mean_w: laplacian's norm_scale and its learnt mean(V) weight, else 1) */
static int SFX(injective)(const TYPE *cq, const TYPE *ck, const TYPE *M, const TYPE *v, TYPE *out, int64_t n,
                         int64_t nk, int64_t m, int64_t dv, TYPE norm_eps, TYPE contrast, TYPE mean_w) {
    const int64_t size = 3 * m * m + 2 * m + n * m + 2 * nk * m + nk * dv + 2 * m * dv + dv;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)size);
    if (!buf) return 1;
    TYPE *cov = buf, *cm = cov + m * m, *T = cm + m * m, *mu = T + m * m, *muk = mu + m, *cc = muk + m;
    TYPE *D = cc + n * m, *DT = D + nk * m, *sv = DT + nk * m, *E = sv + nk * dv, *core = E + m * dv;
    TYPE *mv = core + m * dv;
    SFX(injective_stats)(cq, ck, M, v, mu, cc, cov, cm, T, muk, D, mv, n, nk, m, dv);
    SFX(mm)(D, T, DT, nk, m, m);                    /* rows d_j T */
    for (int64_t j = 0; j < nk; ++j) {
        TYPE var = 0;
        for (int64_t a = 0; a < m; ++a) var += DT[j * m + a] * D[j * m + a];
        const TYPE s = (TYPE)1 / SQRTFN((var > 0 ? var : 0) + norm_eps);
        for (int64_t c = 0; c < dv; ++c) sv[j * dv + c] = s * v[j * dv + c];
    }
    SFX(mtm)(D, sv, E, nk, m, dv);                  /* D^T (s * V) */
    SFX(mm)(M, E, core, m, m, dv);
    for (int64_t e = 0; e < m * dv; ++e) core[e] *= contrast;   /* the whitened part's scale (laplacian's norm_scale) */
    SFX(mm)(cq, core, out, n, m, dv);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < dv; ++c) out[i * dv + c] += mean_w * mv[c];
    free(buf);
    return 0;
}

/* SOFT-Norm: M <- D^(-1/2) M D^(-1/2) with D the row sums of the landmark kernel w; r (m) keeps D^(-1/2) */
static void SFX(soft_norm)(const TYPE *w, TYPE *M, TYPE *r, int64_t m) {
    for (int64_t a = 0; a < m; ++a) {
        TYPE rs = 0;
        for (int64_t b = 0; b < m; ++b) rs += w[a * m + b];
        r[a] = (TYPE)1 / SQRTFN(rs);
    }
    for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < m; ++b) M[a * m + b] *= r[a] * r[b];
}

/* One (batch, head) slice: kernels, inverse, normalisation. With `save` C_q, C_k (untied only) and M (before
 * SOFT-Norm's scaling) are copied there, (n + nk) x m (tied: n x m) then m x m, for the training backwards.
 * Returns nonzero when out of memory. */
static int SFX(slice)(const TYPE *q, const TYPE *k, const TYPE *v, const TYPE *lq, const TYPE *lk, TYPE *out,
                     int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv, int kind, TYPE scale, int tied,
                     TYPE eps, int64_t iters, int rule, int norm, TYPE norm_eps, TYPE contrast, TYPE mean_w,
                     TYPE *save) {
    const int64_t mk = (m + FJB - 1) / FJB * FJB;
    const int64_t size = n * m + (tied ? 0 : nk * m) + 2 * m * m + 2 * m * dv + 2 * d * mk;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)size);
    if (!buf) return 1;
    TYPE *cq = buf, *ck = tied ? cq : cq + n * m, *w = ck + (tied ? n * m : nk * m), *M = w + m * m;
    TYPE *kv = M + m * m, *core = kv + m * dv, *lkt = core + m * dv, *lqt = lkt + d * mk;
    int err = 0;
    SFX(transpose_pad)(lk, lkt, m, mk, d);
    SFX(kernel_matrix)(q, lkt, cq, n, m, mk, d, kind, scale);
    if (!tied) {
        SFX(transpose_pad)(lq, lqt, m, mk, d);
        SFX(kernel_matrix)(k, lqt, ck, nk, m, mk, d, kind, scale);
    }
    SFX(kernel_matrix)(lq, lkt, w, m, m, mk, d, kind, scale);
    err = SFX(newton)(w, M, m, eps, iters, rule);
    if (!err && save) {
        const int64_t rows = tied ? n : n + nk;       /* cq and ck are adjacent in buf */
        memcpy(save, cq, sizeof(TYPE) * (size_t)(rows * m));
        memcpy(save + rows * m, M, sizeof(TYPE) * (size_t)(m * m));
    }
    if (!err && norm == 2) {
        err = SFX(injective)(cq, ck, M, v, out, n, nk, m, dv, norm_eps, contrast, mean_w);
    } else if (!err) {
        if (norm == 1) SFX(soft_norm)(w, M, kv, m);
        SFX(mtm)(ck, v, kv, nk, m, dv);             /* C_k^T V */
        SFX(mm)(M, kv, core, m, m, dv);
        SFX(mm)(cq, core, out, n, m, dv);
    }
    free(buf);
    return err;
}
