/* LaplacianFormer's and SOFT's whole token mixing for one dtype (see landmark_layers.c): qkv gather, landmark
 * pooling or conv + LayerNorm + GELU, the Nystrom slice of nystrom_core_typed.h, the local conv, head merge. */
/* the cells [lo, hi) of window i of o over n cells: the stride x stride tile i when stride > 0 (as avg_pool2d),
 * else [floor(i n / o), ceil((i + 1) n / o)) (F.adaptive_avg_pool2d's) */
static void SFX(window)(int64_t i, int64_t n, int64_t o, int64_t stride, int64_t *lo, int64_t *hi) {
    *lo = stride ? i * stride : (i * n) / o;
    *hi = stride ? *lo + stride : ((i + 1) * n + o - 1) / o;
}

/* pooled (oh * ow, d) = window means of the H x W grid rows of x (row stride d): adaptive windows, or with
 * stride > 0 the stride x stride tiles from the top left (remainders dropped, as avg_pool2d) */
static void SFX(pool_grid)(const TYPE *x, TYPE *pooled, int64_t H, int64_t W, int64_t oh, int64_t ow, int64_t d,
                          int64_t stride) {
    for (int64_t a = 0; a < oh; ++a) {
        int64_t r0, r1, c0, c1;
        SFX(window)(a, H, oh, stride, &r0, &r1);
        for (int64_t b = 0; b < ow; ++b) {
            SFX(window)(b, W, ow, stride, &c0, &c1);
            TYPE *pj = pooled + (a * ow + b) * d;
            for (int64_t c = 0; c < d; ++c) pj[c] = 0;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t cc = c0; cc < c1; ++cc)
                    for (int64_t c = 0; c < d; ++c) pj[c] += x[(r * W + cc) * d + c];
            const TYPE inv = (TYPE)1 / (TYPE)((r1 - r0) * (c1 - c0));
            for (int64_t c = 0; c < d; ++c) pj[c] *= inv;
        }
    }
}

/* wt (ksize^2, d) = the taps of the depthwise filters: channel c's filter at w + c * wstride (wstride = ksize^2:
 * one per channel; 0: one shared by all d, SOFT's per-head filter), laid out so that the conv's inner loops run
 * over contiguous channels */
static void SFX(conv_taps)(const TYPE *w, int64_t wstride, TYPE *wt, int64_t taps, int64_t d) {
    for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < d; ++c) wt[t * d + c] = w[c * wstride + t];
}

/* The depthwise ksize x ksize conv (zero padding) of the H x W grid rows (d channels) with taps wt (ksize^2, d),
 * one loop for both directions: every cell, then every tap whose neighbour lies inside the grid. Forward
 * (g NULL): o[cell] += wt[tap] v[neighbour]. Backward (g: the gradient of the forward's o): o[neighbour] +=
 * wt[tap] g[cell] (v's gradient) and gwt[tap] += g[cell] v[neighbour] (the taps'). */
static void SFX(conv_pass)(const TYPE *v, const TYPE *wt, const TYPE *g, TYPE *o, TYPE *gwt, int64_t H, int64_t W,
                          int64_t d, int64_t ksize) {
    const int64_t pad = ksize / 2;
    for (int64_t r = 0; r < H; ++r)
        for (int64_t cc = 0; cc < W; ++cc) {
            const int64_t cell = (r * W + cc) * d;
            for (int64_t dy = 0; dy < ksize; ++dy) {
                const int64_t rr = r + dy - pad;
                if (rr < 0 || rr >= H) continue;
                for (int64_t dx = 0; dx < ksize; ++dx) {
                    const int64_t xx = cc + dx - pad;
                    if (xx < 0 || xx >= W) continue;
                    const int64_t t = dy * ksize + dx, nb = (rr * W + xx) * d;
                    const TYPE *restrict vi = v + nb, *restrict wk = wt + t * d;
                    if (!g) {
                        TYPE *restrict oi = o + cell;
                        for (int64_t c = 0; c < d; ++c) oi[c] += wk[c] * vi[c];
                    } else {
                        const TYPE *restrict gi = g + cell;
                        TYPE *restrict gvi = o + nb, *restrict gk = gwt + t * d;
                        for (int64_t c = 0; c < d; ++c) {
                            gvi[c] += wk[c] * gi[c];
                            gk[c] += gi[c] * vi[c];
                        }
                    }
                }
            }
        }
}

/* o (grid rows, d) += bias (d) if bias, then the depthwise ksize x ksize conv (zero padding) of the H x W grid
 * rows of v with the filters w (see conv_taps). Nonzero when out of memory. */
static int SFX(local_conv)(const TYPE *v, TYPE *o, const TYPE *w, int64_t wstride, const TYPE *bias, int64_t H,
                          int64_t W, int64_t d, int64_t ksize) {
    TYPE *wt = (TYPE *)malloc(sizeof(TYPE) * (size_t)(ksize * ksize * d));
    if (!wt) return 1;
    SFX(conv_taps)(w, wstride, wt, ksize * ksize, d);
    if (bias)
        for (int64_t e = 0; e < H * W; ++e)
            for (int64_t c = 0; c < d; ++c) o[e * d + c] += bias[c];
    SFX(conv_pass)(v, wt, NULL, o, NULL, H, W, d, ksize);
    free(wt);
    return 0;
}

/* rows [0, n) of column block h of x (B, n, stride) for batch b, times scale, into dst (n, d) */
static void SFX(gather_head)(const TYPE *x, TYPE *dst, int64_t b, int64_t n, int64_t stride, int64_t col, int64_t d,
                            TYPE scale) {
    const TYPE *xb = x + b * n * stride + col;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; ++c) dst[i * d + c] = scale * xb[i * stride + c];
}

/* src (n, d) into rows [0, n) of column block col of x (B, n, stride) for batch b: gather_head's inverse */
static void SFX(scatter_head)(const TYPE *src, TYPE *x, int64_t b, int64_t n, int64_t stride, int64_t col, int64_t d) {
    TYPE *xb = x + b * n * stride + col;
    for (int64_t i = 0; i < n; ++i) memcpy(xb + i * stride, src + i * d, sizeof(TYPE) * (size_t)d);
}

/* one call's arguments (forward or backward), read by its work items: one (batch, head) slice each */
typedef struct {
    const TYPE *y, *gout, *conv_w, *conv_b, *mean_w, *saved;
    TYPE *out, *save, *dy, *dconv_w, *dconv_b, *dmean;
    int64_t n, prefix, H, W, heads, d, mh, mw, iters, ksize, failed;
    TYPE scale, eps, norm_eps, contrast;
    int rule;
} SFX(laplacian_args);

static void SFX(laplacian_mix_item)(void *ctx, int64_t sl, void *scratch) {
    SFX(laplacian_args) *args = (SFX(laplacian_args) *)ctx;
    const TYPE *y = args->y, *conv_w = args->conv_w, *conv_b = args->conv_b, *mean_w = args->mean_w;
    TYPE *out = args->out, *save = args->save;
    const int64_t n = args->n, prefix = args->prefix, H = args->H, W = args->W, heads = args->heads, d = args->d;
    const int64_t mh = args->mh, mw = args->mw, iters = args->iters, ksize = args->ksize, C = heads * d, m = mh * mw;
    const TYPE scale = args->scale, eps = args->eps, norm_eps = args->norm_eps, contrast = args->contrast;
    const int rule = args->rule;
    (void)scratch;
    const int64_t b = sl / heads, h = sl % heads;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)(4 * n * d + 2 * m * d));
    if (!buf) { count_failure(&args->failed); return; }
    TYPE *q = buf, *k = q + n * d, *v = k + n * d, *o = v + n * d, *lq = o + n * d, *lk = lq + m * d;
    SFX(gather_head)(y, q, b, n, 3 * C, h * d, d, 1);
    SFX(gather_head)(y, k, b, n, 3 * C, C + h * d, d, 1);
    SFX(gather_head)(y, v, b, n, 3 * C, 2 * C + h * d, d, 1);
    SFX(pool_grid)(q + prefix * d, lq, H, W, mh, mw, d, 0);
    SFX(pool_grid)(k + prefix * d, lk, H, W, mh, mw, d, 0);
    int err = SFX(slice)(q, k, v, lq, lk, o, n, n, m, d, d, 1, scale, 0, eps, iters, rule, 2, norm_eps, contrast,
                        mean_w ? mean_w[h] : (TYPE)1, save ? save + sl * (2 * n * m + m * m) : NULL);
    if (!err && ksize > 0)
        err = SFX(local_conv)(v + prefix * d, o + prefix * d, conv_w + h * d * ksize * ksize, ksize * ksize,
                             conv_b ? conv_b + h * d : NULL, H, W, d, ksize);
    if (err) count_failure(&args->failed);
    else SFX(scatter_head)(o, out, b, n, C, h * d, d);
    free(buf);
}

/* LaplacianFormer's whole token mixing, per (batch, head) slice, from the fused qkv
 * projection y (B, n, 3C) (q, k, v of head h at columns h d, C + h d, 2C + h d): landmarks by adaptive
 * average pooling of the grid queries and keys (mh x mw windows of the H x W grid after `prefix` tokens, as
 * F.adaptive_avg_pool2d), the untied Laplacian kernels, Newton-Schulz, the injective map with its contrast
 * scale and the per-head weight of its mean(V) term (mean_w (heads) or NULL: 1), plus the depthwise
 * ksize x ksize convolution of the grid values (conv_w (C, ksize^2), conv_b (C) or NULL; ksize 0: none) on
 * the grid tokens. out (B, n, C): heads merged, ready for the output projection. With `save` (training) each
 * slice also keeps its C_q, C_k (n x m each) and M (m x m) there, (B heads, 2 n m + m^2), for
 * vitmix_laplacian_mix_backward. Returns the number of slices that ran out of memory. */
int64_t SFX(vitmix_laplacian_mix)(const TYPE *y, const TYPE *conv_w, const TYPE *conv_b, TYPE *out, int64_t B,
                                 int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d,
                                 int64_t mh, int64_t mw, TYPE scale, TYPE eps, int64_t iters, int rule, TYPE norm_eps,
                                 TYPE contrast, const TYPE *mean_w, int64_t ksize, TYPE *save, int nthreads) {
    SFX(laplacian_args) args = {.y = y, .conv_w = conv_w, .conv_b = conv_b, .mean_w = mean_w, .out = out, .save = save,
                                .n = n, .prefix = prefix, .H = H, .W = W, .heads = heads, .d = d, .mh = mh, .mw = mw,
                                .iters = iters, .ksize = ksize, .scale = scale, .eps = eps, .norm_eps = norm_eps,
                                .contrast = contrast, .rule = rule};
    parallel_for(SFX(laplacian_mix_item), &args, B * heads, nthreads, 0);
    return args.failed;
}

/* the grid SOFT's landmark conv reads, g (gh x gw, d), from the H x W grid rows of q: adaptively pooled to
 * gh x gw when `pool_first`, else its top-left gh x gw cells (the strided conv drops the remainder) */
static void SFX(soft_conv_grid)(const TYPE *q, TYPE *g, int64_t H, int64_t W, int64_t gh, int64_t gw, int64_t d,
                               int pool_first) {
    if (pool_first) {
        SFX(pool_grid)(q, g, H, W, gh, gw, d, 0);
    } else {
        for (int64_t r = 0; r < gh; ++r) memcpy(g + r * gw * d, q + r * W * d, sizeof(TYPE) * (size_t)(gw * d));
    }
}

/* the landmark conv's weight lm_w (d_out, d_in, s, s) as taps (s, s, d_in, d_out), so that the inner loops
 * run over contiguous output channels (malloc'd; NULL when out of memory) */
static TYPE *SFX(soft_conv_taps)(const TYPE *lm_w, int64_t s, int64_t d) {
    TYPE *lmt = (TYPE *)malloc(sizeof(TYPE) * (size_t)(s * s * d * d));
    if (lmt)
        for (int64_t co = 0; co < d; ++co)
            for (int64_t ci = 0; ci < d; ++ci)
                for (int64_t t = 0; t < s * s; ++t) lmt[(t * d + ci) * d + co] = lm_w[(co * d + ci) * s * s + t];
    return lmt;
}

/* z (mh mw, d) = the stride-s s x s conv of g (mh s x mw s, d) with taps lmt (s, s, d_in, d_out) */
static void SFX(soft_landmark_conv)(const TYPE *g, const TYPE *lmt, TYPE *z, int64_t mh, int64_t mw, int64_t s,
                                   int64_t d) {
    const int64_t gw = mw * s;
    for (int64_t a = 0; a < mh; ++a)
        for (int64_t bb = 0; bb < mw; ++bb) {
            TYPE *restrict zj = z + (a * mw + bb) * d;
            for (int64_t co = 0; co < d; ++co) zj[co] = 0;
            for (int64_t dy = 0; dy < s; ++dy)        /* inner loop over output channels: contiguous */
                for (int64_t dx = 0; dx < s; ++dx)
                    for (int64_t ci = 0; ci < d; ++ci) {
                        const TYPE gv = g[((a * s + dy) * gw + bb * s + dx) * d + ci];
                        const TYPE *restrict wk = lmt + ((dy * s + dx) * d + ci) * d;
                        for (int64_t co = 0; co < d; ++co) zj[co] += wk[co] * gv;
                    }
        }
}

/* row j of z (m, d): its LayerNorm's normalised values xhat (d) and returns 1 / sqrt(var + eps) */
static TYPE SFX(layer_norm_row)(const TYPE *zj, TYPE *xhat, int64_t d, TYPE ln_eps) {
    TYPE mean = 0, var = 0;
    for (int64_t c = 0; c < d; ++c) mean += zj[c];
    mean /= (TYPE)d;
    for (int64_t c = 0; c < d; ++c) var += (zj[c] - mean) * (zj[c] - mean);
    const TYPE inv = (TYPE)1 / SQRTFN(var / (TYPE)d + ln_eps);
    for (int64_t c = 0; c < d; ++c) xhat[c] = (zj[c] - mean) * inv;
    return inv;
}

/* lm (m, d) = GELU(LayerNorm(z)) with the norm's affine ln_w, ln_b (GELU's erf form) */
static void SFX(ln_gelu)(const TYPE *z, TYPE *lm, const TYPE *ln_w, const TYPE *ln_b, TYPE ln_eps, int64_t m,
                        int64_t d) {
    for (int64_t j = 0; j < m; ++j) {
        TYPE *lj = lm + j * d;
        SFX(layer_norm_row)(z + j * d, lj, d, ln_eps);
        for (int64_t c = 0; c < d; ++c) {
            const TYPE t = lj[c] * ln_w[c] + ln_b[c];
            lj[c] = (TYPE)0.5 * t * ((TYPE)1 + ERFFN(t * (TYPE)0.70710678118654752440));
        }
    }
}

/* one call's arguments (forward or backward), read by its work items: one (batch, head) slice each */
typedef struct {
    const TYPE *qp, *vp, *lmt, *ln_w, *ln_b, *conv_w, *gout, *saved;
    TYPE *out, *save, *dqp, *dvp, *dlmt, *dln_w, *dln_b, *dconv_w;
    int64_t n, prefix, H, W, heads, d, mh, mw, s, iters, ksize, failed;
    TYPE ln_eps, scale, eps;
    int pool_first, rule, norm;
} SFX(soft_args);

static void SFX(soft_mix_item)(void *ctx, int64_t sl, void *scratch) {
    SFX(soft_args) *args = (SFX(soft_args) *)ctx;
    const TYPE *qp = args->qp, *vp = args->vp, *lmt = args->lmt, *ln_w = args->ln_w, *ln_b = args->ln_b;
    const TYPE *conv_w = args->conv_w;
    TYPE *out = args->out, *save = args->save;
    const int64_t n = args->n, prefix = args->prefix, H = args->H, W = args->W, heads = args->heads, d = args->d;
    const int64_t mh = args->mh, mw = args->mw, s = args->s, iters = args->iters, ksize = args->ksize;
    const int64_t C = heads * d, m = mh * mw, gh = mh * s, gw = mw * s, per_slice = n * m + m * m + m * d;
    const TYPE ln_eps = args->ln_eps, scale = args->scale, eps = args->eps;
    const int pool_first = args->pool_first, rule = args->rule, norm = args->norm;
    (void)scratch;
    const int64_t b = sl / heads, h = sl % heads;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)(3 * n * d + 2 * m * d + gh * gw * d));
    if (!buf) { count_failure(&args->failed); return; }
    TYPE *q = buf, *v = q + n * d, *o = v + n * d, *lm = o + n * d, *z = lm + m * d, *g = z + m * d;
    TYPE *keep = save ? save + sl * per_slice : NULL;
    SFX(gather_head)(qp, q, b, n, C, h * d, d, scale);
    SFX(gather_head)(vp, v, b, n, C, h * d, d, 1);
    if (lmt) {
        SFX(soft_conv_grid)(q + prefix * d, g, H, W, gh, gw, d, pool_first);
        SFX(soft_landmark_conv)(g, lmt, z, mh, mw, s, d);
        SFX(ln_gelu)(z, lm, ln_w, ln_b, ln_eps, m, d);
    } else {
        SFX(pool_grid)(q + prefix * d, lm, H, W, mh, mw, d, pool_first ? 0 : s);
    }
    if (keep) memcpy(keep + n * m + m * m, lmt ? z : lm, sizeof(TYPE) * (size_t)(m * d));
    int err = SFX(slice)(q, q, v, lm, lm, o, n, n, m, d, d, 0, (TYPE)0.5, 1, eps, iters, rule, norm, 0, 1, 1, keep);
    if (!err && ksize > 0)
        err = SFX(local_conv)(v + prefix * d, o + prefix * d, conv_w + h * ksize * ksize, 0, NULL, H, W, d, ksize);
    if (err) count_failure(&args->failed);
    else SFX(scatter_head)(o, out, b, n, C, h * d, d);
    free(buf);
}

/* SOFT's whole token mixing, per (batch, head) slice, from its projections qp = W_q x and vp = W_v x
 * (B, n, C): queries q = scale * qp; landmarks from the grid queries, either (lm_w != NULL, "conv") a
 * stride x stride stride-s convolution lm_w (d, d, s, s) of the grid (first adaptively pooled to
 * mh s x mw s when `pool_first`), then LayerNorm(d) (ln_w, ln_b, ln_eps) and GELU (erf form), or
 * ("avgpool") window means (adaptive when `pool_first`, else s x s tiles); the tied Gaussian kernels,
 * Newton-Schulz (rule), SOFT-Norm when norm == 1, plus the per-head ksize x ksize filter conv_w (heads,
 * ksize^2) shared by the head's d channels on the grid values. out (B, n, C) with heads merged. With `save`
 * (training) each slice keeps C_q (n x m), M (m x m) and the landmarks before LayerNorm (conv; avgpool: the
 * landmarks), m x d, there for vitmix_soft_mix_backward. Returns the number of slices out of memory. */
int64_t SFX(vitmix_soft_mix)(const TYPE *qp, const TYPE *vp, const TYPE *lm_w, const TYPE *ln_w, const TYPE *ln_b,
                            TYPE ln_eps, const TYPE *conv_w, TYPE *out, int64_t B, int64_t n, int64_t prefix, int64_t H,
                            int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw, int64_t s, int pool_first,
                            TYPE scale, TYPE eps, int64_t iters, int rule, int norm, int64_t ksize, TYPE *save,
                            int nthreads) {
    TYPE *lmt = lm_w ? SFX(soft_conv_taps)(lm_w, s, d) : NULL;
    if (lm_w && !lmt) return B * heads;
    SFX(soft_args) args = {.qp = qp, .vp = vp, .lmt = lmt, .ln_w = ln_w, .ln_b = ln_b, .conv_w = conv_w, .out = out,
                           .save = save, .n = n, .prefix = prefix, .H = H, .W = W, .heads = heads, .d = d, .mh = mh,
                           .mw = mw, .s = s, .iters = iters, .ksize = ksize, .ln_eps = ln_eps, .scale = scale,
                           .eps = eps, .pool_first = pool_first, .rule = rule, .norm = norm};
    parallel_for(SFX(soft_mix_item), &args, B * heads, nthreads, 0);
    free(lmt);
    return args.failed;
}
