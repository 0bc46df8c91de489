/* Sparse multi-diagonal attention's forward and backward for one dtype (see diagonal.c). */
#undef ROW
#define ROW(view, b, h, t) ((TYPE *)(view).p + (b) * (view).sb + (h) * (view).sh + (t) * (view).st)
INLINE TYPE SFX(dot)(const TYPE *restrict x, const TYPE *restrict y, int64_t d) {
    TYPE acc = 0;
    for (int64_t c = 0; c < d; ++c) acc += x[c] * y[c];
    return acc;
}

INLINE void SFX(axpy)(TYPE *restrict y, TYPE alpha, const TYPE *restrict x, int64_t d) {
    for (int64_t c = 0; c < d; ++c) y[c] += alpha * x[c];
}

/* scores of the block's patch rows into sc (row stride sw): prefix slots, then offset slots
 * (fill outside the sequence); row j uses qv's token P + j against kv's keys */
INLINE void SFX(block_scores)(const args_t *a, int64_t b, int64_t h, int64_t j0, int64_t j1, TYPE *sc, int64_t sw,
                             view_t qv, view_t kv, TYPE mul, TYPE fill, int64_t D) {
    const int64_t P = a->P, N = a->N, cnt = a->counts[h];
    const int64_t *sh = a->shifts + h * a->M;
    for (int64_t p = 0; p < P; ++p)
        for (int64_t j = j0; j < j1; ++j)
            sc[(j - j0) * sw + p] = mul * SFX(dot)(ROW(qv, b, h, P + j), ROW(kv, b, h, p), D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = sh[m];
        int64_t lo, hi;
        valid_rows(j0, j1, s, N, &lo, &hi);
        TYPE *col = sc + P + m;
        for (int64_t j = j0; j < lo; ++j) col[(j - j0) * sw] = fill;
        for (int64_t j = lo; j < hi; ++j)
            col[(j - j0) * sw] = mul * SFX(dot)(ROW(qv, b, h, P + j), ROW(kv, b, h, P + j + s), D);
        for (int64_t j = hi; j < j1; ++j) col[(j - j0) * sw] = fill;
    }
}

/* y_j += mul * sum over slots w[j, slot] x_key for the block's patch rows */
INLINE void SFX(block_gather)(const args_t *a, int64_t b, int64_t h, int64_t j0, int64_t j1, const TYPE *w, int64_t sw,
                             view_t xv, view_t yv, TYPE mul, int64_t D) {
    const int64_t P = a->P, N = a->N, cnt = a->counts[h];
    const int64_t *sh = a->shifts + h * a->M;
    for (int64_t p = 0; p < P; ++p)
        for (int64_t j = j0; j < j1; ++j)
            SFX(axpy)(ROW(yv, b, h, P + j), mul * w[(j - j0) * sw + p], ROW(xv, b, h, p), D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = sh[m];
        int64_t lo, hi;
        valid_rows(j0, j1, s, N, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j)
            SFX(axpy)(ROW(yv, b, h, P + j), mul * w[(j - j0) * sw + P + m], ROW(xv, b, h, P + j + s), D);
    }
}

INLINE void SFX(zero_rows)(view_t yv, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t D) {
    for (int64_t t = t0; t < t1; ++t) memset(ROW(yv, b, h, t), 0, sizeof(TYPE) * (size_t)D);
}

INLINE void SFX(prefix_fwd)(const args_t *a, int64_t bh, int64_t p, TYPE *sc, int64_t D);
INLINE void SFX(prefix_bwd)(const args_t *a, int64_t bh, int64_t p, int64_t D);

INLINE void SFX(fwd_body)(void *vctx, int64_t item, void *scratch, const int64_t D) {
    const args_t *a = (const args_t *)vctx;
    const int64_t N = a->N, P = a->P, nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK, BH = a->B * a->H;
    if (item >= BH * nblk) { /* a prefix query row */
        SFX(prefix_fwd)(a, (item - BH * nblk) / P, (item - BH * nblk) % P, (TYPE *)scratch, D);
        return;
    }
    const int64_t bh = item / nblk, b = bh / a->H, h = bh % a->H;
    const int64_t j0 = (item % nblk) * ROW_BLOCK, j1 = j0 + ROW_BLOCK < N ? j0 + ROW_BLOCK : N;
    const int64_t sw = P + a->M, used = P + a->counts[h];
    TYPE *sc = (TYPE *)scratch, *lse = (TYPE *)a->lse + bh * N;
    SFX(block_scores)(a, b, h, j0, j1, sc, sw, a->t[V_Q], a->t[V_K], (TYPE)a->scale, (TYPE)-INFINITY, D);
    for (int64_t j = j0; j < j1; ++j) {
        TYPE *row = sc + (j - j0) * sw, mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < used; ++i) mx = row[i] > mx ? row[i] : mx;
        if (mx == -INFINITY) {
            for (int64_t i = 0; i < used; ++i) row[i] = 0;
            lse[j] = -INFINITY;
            continue;
        }
        for (int64_t i = 0; i < used; ++i) {
            row[i] = row[i] == -INFINITY ? (TYPE)0 : EXPFN(row[i] - mx);
            sum += row[i];
        }
        const TYPE inv = (TYPE)1 / sum;
        for (int64_t i = 0; i < used; ++i) row[i] *= inv;
        lse[j] = mx + LOGFN(sum);
    }
    SFX(zero_rows)(a->t[V_OUT], b, h, P + j0, P + j1, D);
    SFX(block_gather)(a, b, h, j0, j1, sc, sw, a->t[V_V], a->t[V_OUT], (TYPE)1, D);
}

INLINE void SFX(bwd1_body)(void *vctx, int64_t item, void *scratch, const int64_t D) {
    (void)scratch;
    const args_t *a = (const args_t *)vctx;
    const int64_t N = a->N, P = a->P, nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK, BH = a->B * a->H;
    if (item >= BH * nblk) {
        SFX(prefix_bwd)(a, (item - BH * nblk) / P, (item - BH * nblk) % P, D);
        return;
    }
    const int64_t bh = item / nblk, b = bh / a->H, h = bh % a->H;
    const int64_t j0 = (item % nblk) * ROW_BLOCK, j1 = j0 + ROW_BLOCK < N ? j0 + ROW_BLOCK : N;
    const int64_t sw = P + a->M, used = P + a->counts[h];
    const TYPE *lse = (const TYPE *)a->lse + bh * N;
    TYPE *ab = (TYPE *)a->a_buf + (bh * N + j0) * sw, *ds = (TYPE *)a->ds_buf + (bh * N + j0) * sw;
    if (used < sw) { /* padded slots stay zero */
        memset(ab, 0, sizeof(TYPE) * (size_t)((j1 - j0) * sw));
        memset(ds, 0, sizeof(TYPE) * (size_t)((j1 - j0) * sw));
    }
    SFX(block_scores)(a, b, h, j0, j1, ab, sw, a->t[V_Q], a->t[V_K], (TYPE)a->scale, (TYPE)-INFINITY, D);
    SFX(block_scores)(a, b, h, j0, j1, ds, sw, a->t[V_DOUT], a->t[V_V], (TYPE)1, (TYPE)0, D);
    for (int64_t j = j0; j < j1; ++j) {
        TYPE *arow = ab + (j - j0) * sw, *drow = ds + (j - j0) * sw;
        const TYPE l = lse[j];
        if (l == -INFINITY) {
            for (int64_t i = 0; i < used; ++i) arow[i] = drow[i] = 0;
            continue;
        }
        const TYPE delta = SFX(dot)(ROW(a->t[V_DOUT], b, h, P + j), ROW(a->t[V_OUT], b, h, P + j), D);
        for (int64_t i = 0; i < used; ++i) {
            const TYPE w = arow[i] == -INFINITY ? (TYPE)0 : EXPFN(arow[i] - l);
            drow[i] = w * (drow[i] - delta);
            arow[i] = w;
        }
    }
    SFX(zero_rows)(a->t[V_DQ], b, h, P + j0, P + j1, D);
    SFX(block_gather)(a, b, h, j0, j1, ds, sw, a->t[V_K], a->t[V_DQ], (TYPE)a->scale, D);
}

INLINE void SFX(bwd2_body)(void *vctx, int64_t item, void *scratch, const int64_t D) {
    (void)scratch;
    const args_t *a = (const args_t *)vctx;
    const int64_t N = a->N, P = a->P, T = P + N, nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t bh = item / nblk, b = bh / a->H, h = bh % a->H;
    const int64_t i0 = (item % nblk) * ROW_BLOCK, i1 = i0 + ROW_BLOCK < N ? i0 + ROW_BLOCK : N;
    const int64_t sw = P + a->M, cnt = a->counts[h];
    const int64_t *sh = a->shifts + h * a->M;
    const TYPE scale = (TYPE)a->scale;
    const view_t qv = a->t[V_Q], gv = a->t[V_DOUT], dkv = a->t[V_DK], dvv = a->t[V_DV];
    const TYPE *ab = (const TYPE *)a->a_buf + bh * N * sw, *ds = (const TYPE *)a->ds_buf + bh * N * sw;
    SFX(zero_rows)(dkv, b, h, P + i0, P + i1, D);
    SFX(zero_rows)(dvv, b, h, P + i0, P + i1, D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = -sh[m]; /* key i is reached by query i - shift */
        int64_t lo, hi;
        valid_rows(i0, i1, s, N, &lo, &hi);
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t j = i + s;
            SFX(axpy)(ROW(dkv, b, h, P + i), scale * ds[j * sw + P + m], ROW(qv, b, h, P + j), D);
            SFX(axpy)(ROW(dvv, b, h, P + i), ab[j * sw + P + m], ROW(gv, b, h, P + j), D);
        }
    }
    if (P) { /* the dense prefix queries' share */
        const TYPE *wp = (const TYPE *)a->wpre + bh * P * T, *dp = (const TYPE *)a->dspre + bh * P * T;
        for (int64_t p = 0; p < P; ++p)
            for (int64_t i = i0; i < i1; ++i) {
                SFX(axpy)(ROW(dkv, b, h, P + i), scale * dp[p * T + P + i], ROW(qv, b, h, p), D);
                SFX(axpy)(ROW(dvv, b, h, P + i), wp[p * T + P + i], ROW(gv, b, h, p), D);
            }
    }
}


/* dense row of prefix query p (token p): scores over all T keys */
INLINE void SFX(prefix_fwd)(const args_t *a, int64_t bh, int64_t p, TYPE *sc, int64_t D) {
    const int64_t b = bh / a->H, h = bh % a->H, T = a->P + a->N;
    const TYPE *qp = ROW(a->t[V_Q], b, h, p);
    TYPE mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < T; ++t) {
        sc[t] = (TYPE)a->scale * SFX(dot)(qp, ROW(a->t[V_K], b, h, t), D);
        mx = sc[t] > mx ? sc[t] : mx;
    }
    for (int64_t t = 0; t < T; ++t) {
        sc[t] = EXPFN(sc[t] - mx);
        sum += sc[t];
    }
    const TYPE inv = (TYPE)1 / sum;
    TYPE *o = ROW(a->t[V_OUT], b, h, p);
    memset(o, 0, sizeof(TYPE) * (size_t)D);
    for (int64_t t = 0; t < T; ++t) SFX(axpy)(o, sc[t] * inv, ROW(a->t[V_V], b, h, t), D);
    ((TYPE *)a->lse_pre)[bh * a->P + p] = mx + LOGFN(sum);
}

/* backward of prefix query p: weights and score gradients over all keys, and dq_p */
INLINE void SFX(prefix_bwd)(const args_t *a, int64_t bh, int64_t p, int64_t D) {
    const int64_t b = bh / a->H, h = bh % a->H, T = a->P + a->N;
    const TYPE scale = (TYPE)a->scale, l = ((const TYPE *)a->lse_pre)[bh * a->P + p];
    const TYPE *qp = ROW(a->t[V_Q], b, h, p), *gp = ROW(a->t[V_DOUT], b, h, p);
    TYPE *w = (TYPE *)a->wpre + (bh * a->P + p) * T, *ds = (TYPE *)a->dspre + (bh * a->P + p) * T;
    const TYPE delta = SFX(dot)(gp, ROW(a->t[V_OUT], b, h, p), D);
    for (int64_t t = 0; t < T; ++t) {
        w[t] = scale * SFX(dot)(qp, ROW(a->t[V_K], b, h, t), D);
        ds[t] = SFX(dot)(gp, ROW(a->t[V_V], b, h, t), D);
    }
    for (int64_t t = 0; t < T; ++t) {
        w[t] = EXPFN(w[t] - l);
        ds[t] = w[t] * (ds[t] - delta);
    }
    TYPE *dq = ROW(a->t[V_DQ], b, h, p);
    memset(dq, 0, sizeof(TYPE) * (size_t)D);
    for (int64_t t = 0; t < T; ++t) SFX(axpy)(dq, scale * ds[t], ROW(a->t[V_K], b, h, t), D);
}

/* pass 3: gradients of prefix key p from every query */
INLINE void SFX(bwd3_body)(void *vctx, int64_t item, void *scratch, const int64_t D) {
    (void)scratch;
    const args_t *a = (const args_t *)vctx;
    const int64_t P = a->P, N = a->N, T = P + N, sw = P + a->M;
    const int64_t bh = item / P, p = item % P, b = bh / a->H, h = bh % a->H;
    const TYPE scale = (TYPE)a->scale;
    const TYPE *ab = (const TYPE *)a->a_buf + bh * N * sw, *ds = (const TYPE *)a->ds_buf + bh * N * sw;
    const TYPE *wp = (const TYPE *)a->wpre + bh * P * T, *dp = (const TYPE *)a->dspre + bh * P * T;
    TYPE *dk = ROW(a->t[V_DK], b, h, p), *dv = ROW(a->t[V_DV], b, h, p);
    memset(dk, 0, sizeof(TYPE) * (size_t)D);
    memset(dv, 0, sizeof(TYPE) * (size_t)D);
    for (int64_t j = 0; j < N; ++j) {
        SFX(axpy)(dk, scale * ds[j * sw + p], ROW(a->t[V_Q], b, h, P + j), D);
        SFX(axpy)(dv, ab[j * sw + p], ROW(a->t[V_DOUT], b, h, P + j), D);
    }
    for (int64_t r = 0; r < P; ++r) {
        SFX(axpy)(dk, scale * dp[r * T + p], ROW(a->t[V_Q], b, h, r), D);
        SFX(axpy)(dv, wp[r * T + p], ROW(a->t[V_DOUT], b, h, r), D);
    }
}

#define DISPATCH(name)                                                                             \
    static void SFX(name##_item)(void *vctx, int64_t item, void *scratch) {                            \
        const int64_t D = ((const args_t *)vctx)->D;                                                   \
        if (D == 64) SFX(name##_body)(vctx, item, scratch, 64);                                         \
        else if (D == 32) SFX(name##_body)(vctx, item, scratch, 32);                                    \
        else SFX(name##_body)(vctx, item, scratch, D);                                                  \
    }
DISPATCH(fwd)
DISPATCH(bwd1)
DISPATCH(bwd2)
DISPATCH(bwd3)

/* ptrs: q, k, v, out, dout, dq, dk, dv, lse, a_buf, ds_buf, wpre, dspre, lse_pre; strides: 3 per view */
void SFX(vitmix_diag_fwd)(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr) {
    args_t a;
    make_args(&a, ptrs, strides, shifts, counts, B, H, N, P, M, D, scale);
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t scratch = ROW_BLOCK * (P + M) > P + N ? ROW_BLOCK * (P + M) : P + N;
    parallel_for(SFX(fwd_item), &a, B * H * (nblk + P), nthr, sizeof(TYPE) * (size_t)scratch);
}

void SFX(vitmix_diag_bwd)(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr) {
    args_t a;
    make_args(&a, ptrs, strides, shifts, counts, B, H, N, P, M, D, scale);
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    parallel_for(SFX(bwd1_item), &a, B * H * (nblk + P), nthr, 0); /* patch and prefix query rows */
    parallel_for(SFX(bwd2_item), &a, B * H * nblk, nthr, 0);
    if (P) parallel_for(SFX(bwd3_item), &a, B * H * P, nthr, 0);
}

#undef ROW
#undef DISPATCH
