/* The Nystrom core for one dtype (static helpers; see nystrom.c): kernel matrices, Newton-Schulz from the
 * landmark kernel, the injective map, SOFT-Norm and one (batch, head) slice of the whole product, on the
 * distances of distance_typed.h, the GEMMs of gemm_typed.h and the loop of newton_typed.h. Also the base of
 * the landmark layers' library (vitmix/mixers/fused/csrc). */
/* out (n, m) = exp(-scale * dist(x_i, y_j)) with y given as yt (d, mp); kind 0: squared L2 (scale 1/2,
 * SOFT), 1: L1 (scale 1/lam) */
static void SFX(kernel_matrix)(const TYPE *x, const TYPE *yt, TYPE *out, int64_t n, int64_t m, int64_t mp,
                              int64_t d, int kind, TYPE scale) {
    SFX(distances)(x, d, n, yt, out, m, mp, d, kind);
    for (int64_t e = 0; e < n * m; ++e) out[e] = EXPFN(-scale * out[e]);
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

/* M (m, m) = NS(W + eps I) from the landmark kernel W, with the start rule of vitmix_ns_solve; nonzero when out
 * of memory */
static int SFX(newton)(const TYPE *w, TYPE *M, int64_t m, TYPE eps, int64_t iters, int rule) {
    const int64_t mp = (m + JB - 1) / JB * JB;
    TYPE *buf = (TYPE *)calloc((size_t)(5 * mp * mp), sizeof(TYPE));
    if (!buf) return 1;
    SFX(ns_solve_padded)(w, M, m, mp, eps, iters, rule, buf);
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
    const int64_t mk = (m + JB - 1) / JB * JB;
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
