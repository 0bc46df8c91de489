/* The training backwards of LaplacianFormer's and SOFT's token mixing for one dtype (see landmark_layers.c;
 * uses the static helpers of gemm_typed.h, nystrom_core_typed.h and landmark_layers_typed.h). */
/* gx (n, d), gy (m, d) += the gradient of K = exp(-scale |x_i - y_j|_1) (n x m) from dK: with P = scale dK K
 * (written to p, n x m), gx_i -= sum_j P_ij sign(x_i - y_j) and gy_j += sum_i P_ij sign(x_i - y_j), sign(0) = 0.
 * Rows of x go four at a time over JB-wide channel blocks: their gradients stay in registers over all j and
 * each y_j block is loaded once for four rows (the L1 backward is the layer's largest elementwise pass). */
static void SFX(l1_kernel_grad)(const TYPE *x, const TYPE *y, const TYPE *K, const TYPE *dK, TYPE *gx, TYPE *gy,
                               TYPE *p, int64_t n, int64_t m, int64_t d, TYPE scale) {
    for (int64_t e = 0; e < n * m; ++e) p[e] = scale * dK[e] * K[e];
    const int64_t dvec = d / JB * JB;
    const SFX(vec) zero = {0};
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t rows = n - i0 < 4 ? n - i0 : 4;
        const TYPE *pr[4];
        for (int64_t r = 0; r < 4; ++r) pr[r] = p + (i0 + (r < rows ? r : 0)) * m;   /* missing rows: weight 0 */
        for (int64_t c0 = 0; c0 < dvec; c0 += JB) {
            SFX(vec) xr[4], ax[4] = {{0}}, yv, t, pv, sg;
            for (int64_t r = 0; r < 4; ++r) memcpy(&xr[r], x + (i0 + (r < rows ? r : 0)) * d + c0, sizeof yv);
            for (int64_t j = 0; j < m; ++j) {
                SFX(vec) ay = {0};
                memcpy(&yv, y + j * d + c0, sizeof yv);
                for (int64_t r = 0; r < 4; ++r) {
                    pv = zero + (r < rows ? pr[r][j] : (TYPE)0);
                    t = xr[r] - yv;
                    sg = (SFX(vec))(((SFX(ivec))(t > zero) & (SFX(ivec))pv)) -
                         (SFX(vec))(((SFX(ivec))(t < zero) & (SFX(ivec))pv));        /* sign(t) P, sign(0) = 0 */
                    ax[r] -= sg;
                    ay += sg;
                }
                SFX(vec) gv;
                memcpy(&gv, gy + j * d + c0, sizeof gv);
                gv += ay;
                memcpy(gy + j * d + c0, &gv, sizeof gv);
            }
            for (int64_t r = 0; r < rows; ++r) {
                SFX(vec) gv;
                memcpy(&gv, gx + (i0 + r) * d + c0, sizeof gv);
                gv += ax[r];
                memcpy(gx + (i0 + r) * d + c0, &gv, sizeof gv);
            }
        }
        for (int64_t r = 0; r < rows; ++r)                    /* channels beyond the last full block */
            for (int64_t j = 0; j < m; ++j)
                for (int64_t c = dvec; c < d; ++c) {
                    const TYPE t = x[(i0 + r) * d + c] - y[j * d + c], w = p[(i0 + r) * m + j];
                    const TYPE sg = (t > 0 ? w : (TYPE)0) - (t < 0 ? w : (TYPE)0);
                    gx[(i0 + r) * d + c] -= sg;
                    gy[j * d + c] += sg;
                }
    }
}

/* gx (grid rows, d) += the adjoint of pool_grid (adaptive windows, or stride x stride tiles when stride > 0):
 * each cell receives gp of every window that holds it, divided by the window's area */
static void SFX(pool_grid_grad)(const TYPE *gp, TYPE *gx, int64_t H, int64_t W, int64_t oh, int64_t ow, int64_t d,
                               int64_t stride) {
    for (int64_t a = 0; a < oh; ++a) {
        int64_t r0, r1, c0, c1;
        SFX(window)(a, H, oh, stride, &r0, &r1);
        for (int64_t b = 0; b < ow; ++b) {
            SFX(window)(b, W, ow, stride, &c0, &c1);
            const TYPE inv = (TYPE)1 / (TYPE)((r1 - r0) * (c1 - c0));
            const TYPE *gj = gp + (a * ow + b) * d;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t cc = c0; cc < c1; ++cc)
                    for (int64_t c = 0; c < d; ++c) gx[(r * W + cc) * d + c] += inv * gj[c];
        }
    }
}

/* The backward of SFX(local_conv) (taps of channel c at w + c * wstride: wstride = ksize^2 per channel, 0 one
 * filter shared by the d channels): gv (grid rows, d) += the transposed conv of g; gw (d, ksize^2), or (ksize^2)
 * for a shared filter, and gb (d) unless NULL are written (sums over the grid positions and shared channels). */
static int SFX(local_conv_grad)(const TYPE *v, const TYPE *g, const TYPE *w, int64_t wstride, TYPE *gv, TYPE *gw,
                               TYPE *gb, int64_t H, int64_t W, int64_t d, int64_t ksize) {
    const int64_t taps = ksize * ksize;
    TYPE *wt = (TYPE *)malloc(sizeof(TYPE) * (size_t)(2 * taps * d));
    if (!wt) return 1;
    TYPE *gwt = wt + taps * d;
    SFX(conv_taps)(w, wstride, wt, taps, d);
    memset(gwt, 0, sizeof(TYPE) * (size_t)(taps * d));
    if (gb) {
        for (int64_t c = 0; c < d; ++c) gb[c] = 0;
        for (int64_t e = 0; e < H * W; ++e)
            for (int64_t c = 0; c < d; ++c) gb[c] += g[e * d + c];
    }
    SFX(conv_pass)(v, wt, g, gv, gwt, H, W, d, ksize);
    for (int64_t t = 0; t < taps; ++t) {
        if (!wstride) gw[t] = 0;
        for (int64_t c = 0; c < d; ++c) {
            if (wstride) gw[c * taps + t] = gwt[t * d + c];
            else gw[t] += gwt[t * d + c];
        }
    }
    free(wt);
    return 0;
}

/* The injective map's backward (the formulas of the PyTorch path's _injective_bwd): from C_q, C_k (n x m),
 * M (m x m), V (n x dc) and g = dL/dout (n x dc) it recomputes the forward's intermediates (centred keys D,
 * T = M^T cov(C_q) M, s = (diag(D T D^T) + eps)^(-1/2), E = D^T (contrast s * V), core = M E) and writes
 * dcq, dck (n x m), dM (m x m), dv (n x dc) and *dmean, the gradient of the mean(V) term's weight. */
static int SFX(injective_grad)(const TYPE *cq, const TYPE *ck, const TYPE *M, const TYPE *v, const TYPE *g,
                              TYPE *dcq, TYPE *dck, TYPE *dM, TYPE *dv, TYPE *dmean, int64_t n, int64_t m,
                              int64_t dc, TYPE norm_eps, TYPE contrast, TYPE mean_w) {
    const int64_t size = 7 * m * m + 2 * m + 4 * n * m + 2 * n * dc + 5 * m * dc + m * m + 3 * n + 2 * dc;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)size);
    if (!buf) return 1;
    TYPE *cov = buf, *cm = cov + m * m, *T = cm + m * m, *dT = T + m * m, *dcov = dT + m * m, *t1 = dcov + m * m;
    TYPE *t2 = t1 + m * m, *mu = t2 + m * m, *muk = mu + m, *cc = muk + m, *D = cc + n * m, *DT = D + n * m;
    TYPE *dD = DT + n * m, *sv = dD + n * m, *dyv = sv + n * dc, *E = dyv + n * dc, *core = E + m * dc;
    TYPE *dcore = core + m * dc, *dE = dcore + m * dc, *s = dE + m * dc, *var = s + n, *dvar = var + n;
    TYPE *gsum = dvar + n, *mv = gsum + dc, *bt = mv + dc;      /* bt: scratch of mmt, m (m + dc) */
    /* forward intermediates */
    SFX(injective_stats)(cq, ck, M, v, mu, cc, cov, cm, T, muk, D, mv, n, n, m, dc);
    SFX(mm)(D, T, DT, n, m, m);
    for (int64_t j = 0; j < n; ++j) {
        TYPE acc = 0;
        for (int64_t a = 0; a < m; ++a) acc += DT[j * m + a] * D[j * m + a];
        var[j] = acc;
        s[j] = (TYPE)1 / SQRTFN((acc > 0 ? acc : 0) + norm_eps);
        for (int64_t c = 0; c < dc; ++c) sv[j * dc + c] = contrast * s[j] * v[j * dc + c];
    }
    SFX(mtm)(D, sv, E, n, m, dc);
    SFX(mm)(M, E, core, m, m, dc);
    /* backward */
    SFX(mtm)(cq, g, dcore, n, m, dc);               /* dcore = C_q^T g */
    SFX(mmt)(g, core, dcq, n, dc, m, bt);               /* dC_q = g core^T (+ the covariance part below) */
    SFX(mmt)(dcore, E, dM, m, dc, m, bt);              /* dM = dcore E^T (+ the T part below) */
    SFX(mtm)(M, dcore, dE, m, m, dc);               /* dE = M^T dcore */
    SFX(mm)(D, dE, dyv, n, m, dc);                  /* d(s V) = D dE */
    SFX(column_sum)(g, gsum, n, dc);
    TYPE dw = 0;
    for (int64_t c = 0; c < dc; ++c) dw += gsum[c] * mv[c];
    *dmean = dw;
    for (int64_t j = 0; j < n; ++j) {
        TYPE ds = 0;
        for (int64_t c = 0; c < dc; ++c) {
            dv[j * dc + c] = contrast * s[j] * dyv[j * dc + c] + mean_w * gsum[c] / (TYPE)n;
            ds += dyv[j * dc + c] * v[j * dc + c];
        }
        dvar[j] = var[j] >= 0 ? contrast * ds * (TYPE)-0.5 * s[j] * s[j] * s[j] : 0;   /* clamp_min(0) */
    }
    SFX(mmt)(sv, dE, dD, n, dc, m, bt);               /* dD = (s V) dE^T + 2 dvar * D T */
    for (int64_t j = 0; j < n; ++j)
        for (int64_t a = 0; a < m; ++a) {
            dD[j * m + a] += (TYPE)2 * dvar[j] * DT[j * m + a];
            DT[j * m + a] = dvar[j] * D[j * m + a];      /* DT is free now: dvar * D */
        }
    SFX(mtm)(D, DT, dT, n, m, m);                   /* dT = D^T (dvar * D) */
    SFX(mm)(M, dT, t1, m, m, m);                    /* M dT */
    SFX(mm)(cov, t1, t2, m, m, m);
    for (int64_t e = 0; e < m * m; ++e) dM[e] += (TYPE)2 * t2[e];
    SFX(mmt)(t1, M, dcov, m, m, m, bt);               /* dcov = M dT M^T */
    SFX(mm)(cc, dcov, D, n, m, m);                  /* D is free now: dcc = 2/n cc dcov, then centred */
    for (int64_t e = 0; e < n * m; ++e) D[e] *= (TYPE)2 / (TYPE)n;
    SFX(column_mean)(D, mu, n, m);
    SFX(column_mean)(dD, muk, n, m);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t a = 0; a < m; ++a) {
            dcq[i * m + a] += D[i * m + a] - mu[a];
            dck[i * m + a] = dD[i * m + a] - muk[a];
        }
    free(buf);
    return 0;
}

static void SFX(laplacian_mix_backward_item)(void *ctx, int64_t sl, void *scratch) {
    SFX(laplacian_args) *args = (SFX(laplacian_args) *)ctx;
    const TYPE *y = args->y, *gout = args->gout, *conv_w = args->conv_w, *mean_w = args->mean_w;
    const TYPE *saved = args->saved;
    TYPE *dy = args->dy, *dconv_w = args->dconv_w, *dconv_b = args->dconv_b, *dmean = args->dmean;
    const int64_t n = args->n, prefix = args->prefix, H = args->H, W = args->W, heads = args->heads, d = args->d;
    const int64_t mh = args->mh, mw = args->mw, ksize = args->ksize;
    const int64_t C = heads * d, m = mh * mw, mk = (m + JB - 1) / JB * JB, taps = ksize * ksize;
    const TYPE scale = args->scale, norm_eps = args->norm_eps, contrast = args->contrast;
    (void)scratch;
    const int64_t b = sl / heads, h = sl % heads;
    const int64_t size = 7 * n * d + 4 * m * d + 4 * m * m + 2 * n * m + d * mk;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)size);
    if (!buf) { count_failure(&args->failed); return; }
    TYPE *q = buf, *k = q + n * d, *v = k + n * d, *g = v + n * d, *dq = g + n * d, *dk = dq + n * d;
    TYPE *dv = dk + n * d, *lq = dv + n * d, *lk = lq + m * d, *dlq = lk + m * d, *dlk = dlq + m * d;
    TYPE *w = dlk + m * d, *dW = w + m * m, *dM = dW + m * m, *dcq = dM + m * m, *dck = dcq + n * m;
    TYPE *lkt = dck + n * m, *bt = lkt + d * mk;
    const TYPE *cq = saved + sl * (2 * n * m + m * m), *ck = cq + n * m, *M = ck + n * m;
    SFX(gather_head)(y, q, b, n, 3 * C, h * d, d, 1);
    SFX(gather_head)(y, k, b, n, 3 * C, C + h * d, d, 1);
    SFX(gather_head)(y, v, b, n, 3 * C, 2 * C + h * d, d, 1);
    SFX(gather_head)(gout, g, b, n, C, h * d, d, 1);
    SFX(pool_grid)(q + prefix * d, lq, H, W, mh, mw, d, 0);
    SFX(pool_grid)(k + prefix * d, lk, H, W, mh, mw, d, 0);
    int err = SFX(injective_grad)(cq, ck, M, v, g, dcq, dck, dM, dv, dmean + sl, n, m, d, norm_eps, contrast,
                                 mean_w ? mean_w[h] : (TYPE)1);
    if (!err) {
        SFX(mtm)(M, dM, w, m, m, m);                /* dW = -M^T dM M^T (w holds M^T dM for now) */
        SFX(mmt)(w, M, dW, m, m, m, bt);
        for (int64_t e = 0; e < m * m; ++e) dW[e] = -dW[e];
        SFX(transpose_pad)(lk, lkt, m, mk, d);      /* W = k(L_q, L_k) again, as the forward computed it */
        SFX(kernel_matrix)(lq, lkt, w, m, m, mk, d, 1, scale);
        memset(dq, 0, sizeof(TYPE) * (size_t)(2 * n * d));
        memset(dlq, 0, sizeof(TYPE) * (size_t)(2 * m * d));
        SFX(l1_kernel_grad)(q, lk, cq, dcq, dq, dlk, dcq, n, m, d, scale);     /* P overwrites dK */
        SFX(l1_kernel_grad)(k, lq, ck, dck, dk, dlq, dck, n, m, d, scale);
        SFX(l1_kernel_grad)(lq, lk, w, dW, dlq, dlk, dW, m, m, d, scale);
        SFX(pool_grid_grad)(dlq, dq + prefix * d, H, W, mh, mw, d, 0);
        SFX(pool_grid_grad)(dlk, dk + prefix * d, H, W, mh, mw, d, 0);
        if (ksize > 0)
            err = SFX(local_conv_grad)(v + prefix * d, g + prefix * d, conv_w + h * d * taps, taps, dv + prefix * d,
                                      dconv_w + sl * d * taps, dconv_b + sl * d, H, W, d, ksize);
    }
    if (err) {
        count_failure(&args->failed);
    } else {
        SFX(scatter_head)(dq, dy, b, n, 3 * C, h * d, d);
        SFX(scatter_head)(dk, dy, b, n, 3 * C, C + h * d, d);
        SFX(scatter_head)(dv, dy, b, n, 3 * C, 2 * C + h * d, d);
    }
    free(buf);
}

/* The backward of vitmix_laplacian_mix with `save`: from the qkv output y (B, n, 3C), gout = dL/dout (B, n, C),
 * the conv taps conv_w (C, ksize^2), the mean weights mean_w (heads) or NULL (1) and saved (B heads,
 * 2 n m + m^2), writes dy (B, n, 3C) (every element) and per slice dconv_w (B heads, d, ksize^2), dconv_b
 * (B heads, d) and dmean (B heads): the caller sums those over the batch. Returns the number of slices that
 * ran out of memory. */
int64_t SFX(vitmix_laplacian_mix_backward)(const TYPE *y, const TYPE *gout, const TYPE *conv_w, const TYPE *mean_w,
                                          const TYPE *saved, TYPE *dy, TYPE *dconv_w, TYPE *dconv_b, TYPE *dmean,
                                          int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads,
                                          int64_t d, int64_t mh, int64_t mw, TYPE scale, TYPE norm_eps, TYPE contrast,
                                          int64_t ksize, int nthreads) {
    SFX(laplacian_args) args = {.y = y, .gout = gout, .conv_w = conv_w, .mean_w = mean_w, .saved = saved, .dy = dy,
                                .dconv_w = dconv_w, .dconv_b = dconv_b, .dmean = dmean, .n = n, .prefix = prefix,
                                .H = H, .W = W, .heads = heads, .d = d, .mh = mh, .mw = mw, .ksize = ksize,
                                .scale = scale, .norm_eps = norm_eps, .contrast = contrast};
    parallel_for(SFX(laplacian_mix_backward_item), &args, B * heads, nthreads, 0);
    return args.failed;
}

/* gx (n, d), gy (m, d) += the gradient of the Gaussian kernel K = exp(-|x_i - y_j|^2 / 2) (n x m) from dK:
 * with P = dK * K (written over dK), gx_i += (P y)_i - (sum_j P_ij) x_i and gy_j += (P^T x)_j - (sum_i P_ij) y_j,
 * two gemms (gx and gy may be the same buffer: x = y = the landmarks). tmp: max(n, m) d + m scratch. */
static void SFX(gauss_kernel_grad)(const TYPE *x, const TYPE *y, const TYPE *K, TYPE *P, TYPE *gx, TYPE *gy,
                                  TYPE *tmp, int64_t n, int64_t m, int64_t d) {
    for (int64_t e = 0; e < n * m; ++e) P[e] *= K[e];
    TYPE *colsum = tmp + (n > m ? n : m) * d;
    SFX(mm)(P, y, tmp, n, m, d);
    for (int64_t i = 0; i < n; ++i) {
        TYPE r = 0;
        for (int64_t j = 0; j < m; ++j) r += P[i * m + j];
        for (int64_t c = 0; c < d; ++c) gx[i * d + c] += tmp[i * d + c] - r * x[i * d + c];
    }
    SFX(mtm)(P, x, tmp, n, m, d);
    SFX(column_sum)(P, colsum, n, m);
    for (int64_t j = 0; j < m; ++j)
        for (int64_t c = 0; c < d; ++c) gy[j * d + c] += tmp[j * d + c] - colsum[j] * y[j * d + c];
}

/* dz (m, d) = the backward of lm = GELU(LayerNorm(z)) from dlm; the norm's affine gradients are added to
 * dln_w, dln_b (d). xhat: d scratch. */
static void SFX(ln_gelu_grad)(const TYPE *z, const TYPE *dlm, TYPE *dz, const TYPE *ln_w, const TYPE *ln_b,
                             TYPE ln_eps, TYPE *dln_w, TYPE *dln_b, TYPE *xhat, int64_t m, int64_t d) {
    for (int64_t j = 0; j < m; ++j) {
        const TYPE inv = SFX(layer_norm_row)(z + j * d, xhat, d, ln_eps);
        TYPE *dzj = dz + j * d, mean_dx = 0, mean_dxx = 0;
        for (int64_t c = 0; c < d; ++c) {
            const TYPE t = xhat[c] * ln_w[c] + ln_b[c];
            const TYPE cdf = (TYPE)0.5 * ((TYPE)1 + ERFFN(t * (TYPE)0.70710678118654752440));
            const TYPE pdf = (TYPE)0.39894228040143267794 * EXPFN((TYPE)-0.5 * t * t);
            const TYPE dt = dlm[j * d + c] * (cdf + t * pdf);
            dln_w[c] += dt * xhat[c];
            dln_b[c] += dt;
            dzj[c] = dt * ln_w[c];                    /* d xhat for now */
            mean_dx += dzj[c];
            mean_dxx += dzj[c] * xhat[c];
        }
        mean_dx /= (TYPE)d;
        mean_dxx /= (TYPE)d;
        for (int64_t c = 0; c < d; ++c) dzj[c] = inv * (dzj[c] - mean_dx - xhat[c] * mean_dxx);
    }
}

/* The backward of soft_landmark_conv: dlmt (s, s, d_in, d_out) += the weight gradient, dg (gh x gw, d) = the
 * gradient of the conv's input grid g, from dz (mh mw, d) */
static void SFX(soft_landmark_conv_grad)(const TYPE *g, const TYPE *lmt, const TYPE *dz, TYPE *dlmt, TYPE *dg,
                                        int64_t mh, int64_t mw, int64_t s, int64_t d) {
    const int64_t gw = mw * s;
    for (int64_t a = 0; a < mh; ++a)
        for (int64_t bb = 0; bb < mw; ++bb) {
            const TYPE *restrict dzj = dz + (a * mw + bb) * d;
            for (int64_t dy = 0; dy < s; ++dy)
                for (int64_t dx = 0; dx < s; ++dx)
                    for (int64_t ci = 0; ci < d; ++ci) {
                        const int64_t cell = ((a * s + dy) * gw + bb * s + dx) * d + ci;
                        const int64_t tap = ((dy * s + dx) * d + ci) * d;
                        const TYPE gv = g[cell];
                        const TYPE *restrict wk = lmt + tap;
                        TYPE *restrict dwk = dlmt + tap, acc = 0;
                        for (int64_t co = 0; co < d; ++co) {
                            dwk[co] += dzj[co] * gv;
                            acc += wk[co] * dzj[co];
                        }
                        dg[cell] = acc;
                    }
        }
}

static void SFX(soft_mix_backward_item)(void *ctx, int64_t sl, void *scratch) {
    SFX(soft_args) *args = (SFX(soft_args) *)ctx;
    const TYPE *qp = args->qp, *vp = args->vp, *lmt = args->lmt, *ln_w = args->ln_w, *ln_b = args->ln_b;
    const TYPE *conv_w = args->conv_w, *gout = args->gout, *saved = args->saved;
    TYPE *dqp = args->dqp, *dvp = args->dvp, *dlmt = args->dlmt, *dln_w = args->dln_w, *dln_b = args->dln_b;
    TYPE *dconv_w = args->dconv_w;
    const int64_t n = args->n, prefix = args->prefix, H = args->H, W = args->W, heads = args->heads, d = args->d;
    const int64_t mh = args->mh, mw = args->mw, s = args->s, ksize = args->ksize;
    const int64_t C = heads * d, m = mh * mw, mk = (m + JB - 1) / JB * JB, gh = mh * s, gw = mw * s;
    const int64_t taps = ksize * ksize, wide = n > m ? n : m;
    const TYPE ln_eps = args->ln_eps, scale = args->scale;
    const int pool_first = args->pool_first, norm = args->norm;
    (void)scratch;
    const int64_t b = sl / heads, h = sl % heads;
    const int64_t size = 5 * n * d + 8 * m * d + 6 * m * m + 2 * n * m + 2 * gh * gw * d + d * mk
                         + wide * d + 3 * m + m * (m > d ? m : d) + d;
    TYPE *buf = (TYPE *)malloc(sizeof(TYPE) * (size_t)size);
    if (!buf) { count_failure(&args->failed); return; }
    TYPE *q = buf, *v = q + n * d, *g = v + n * d, *dq = g + n * d, *dv = dq + n * d, *lm = dv + n * d;
    TYPE *dlm = lm + m * d, *dz = dlm + m * d, *kv = dz + m * d, *core = kv + m * d, *dcore = core + m * d;
    TYPE *dkv = dcore + m * d, *lmtp = dkv + m * d, *w = lmtp + d * mk, *Mn = w + m * m, *dMn = Mn + m * m;
    TYPE *dM = dMn + m * m, *dW = dM + m * m, *t1 = dW + m * m, *dC = t1 + m * m, *dC2 = dC + n * m;
    TYPE *grid = dC2 + n * m, *dgrid = grid + gh * gw * d, *tmp = dgrid + gh * gw * d, *r = tmp + wide * d + m;
    TYPE *dr = r + m, *bt = dr + m, *xhat = bt + m * (m > d ? m : d);
    const TYPE *cq = saved + sl * (n * m + m * m + m * d), *M = cq + n * m, *z = M + m * m;
    int err = 0;
    SFX(gather_head)(qp, q, b, n, C, h * d, d, scale);
    SFX(gather_head)(vp, v, b, n, C, h * d, d, 1);
    SFX(gather_head)(gout, g, b, n, C, h * d, d, 1);
    if (lmt) {                                /* the landmarks again, from the kept pre-norm values */
        SFX(soft_conv_grid)(q + prefix * d, grid, H, W, gh, gw, d, pool_first);
        SFX(ln_gelu)(z, lm, ln_w, ln_b, ln_eps, m, d);
    } else {
        memcpy(lm, z, sizeof(TYPE) * (size_t)(m * d));
    }
    SFX(transpose_pad)(lm, lmtp, m, mk, d);         /* W = k(L, L), as the forward computed it */
    SFX(kernel_matrix)(lm, lmtp, w, m, m, mk, d, 0, (TYPE)0.5);
    memcpy(Mn, M, sizeof(TYPE) * (size_t)(m * m));
    if (norm == 1) SFX(soft_norm)(w, Mn, r, m);     /* SOFT-Norm: Mn = D^(-1/2) M D^(-1/2) */
    SFX(mtm)(cq, v, kv, n, m, d);                   /* forward: kv = C_q^T V, core = Mn kv, out = C_q core */
    SFX(mm)(Mn, kv, core, m, m, d);
    SFX(mtm)(cq, g, dcore, n, m, d);                /* dcore = C_q^T g */
    SFX(mmt)(g, core, dC, n, d, m, bt);             /* dC_q = g core^T + V dkv^T */
    SFX(mmt)(dcore, kv, dMn, m, d, m, bt);          /* dMn = dcore kv^T */
    SFX(mtm)(Mn, dcore, dkv, m, m, d);              /* dkv = Mn^T dcore */
    SFX(mmt)(v, dkv, dC2, n, d, m, bt);
    for (int64_t e = 0; e < n * m; ++e) dC[e] += dC2[e];
    SFX(mm)(cq, dkv, dv, n, m, d);                  /* dV = C_q dkv (+ the local filter's, below) */
    for (int64_t e = 0; e < m * m; ++e) dM[e] = dMn[e];
    if (norm == 1) {                               /* Mn_ac = r_a M_ac r_c, r = (W 1)^(-1/2) */
        for (int64_t a = 0; a < m; ++a) dr[a] = 0;
        for (int64_t a = 0; a < m; ++a)
            for (int64_t c = 0; c < m; ++c) {
                const TYPE gm = dMn[a * m + c] * M[a * m + c];
                dM[a * m + c] = dMn[a * m + c] * r[a] * r[c];
                dr[a] += gm * r[c];
                dr[c] += gm * r[a];
            }
    }
    SFX(mtm)(M, dM, t1, m, m, m);                   /* dW = -M^T dM M^T (+ the row sums' gradient) */
    SFX(mmt)(t1, M, dW, m, m, m, bt);
    for (int64_t a = 0; a < m; ++a) {
        const TYPE drow = norm == 1 ? (TYPE)-0.5 * r[a] * r[a] * r[a] * dr[a] : (TYPE)0;
        for (int64_t c = 0; c < m; ++c) dW[a * m + c] = drow - dW[a * m + c];
    }
    memset(dq, 0, sizeof(TYPE) * (size_t)(n * d));
    memset(dlm, 0, sizeof(TYPE) * (size_t)(m * d));
    SFX(gauss_kernel_grad)(q, lm, cq, dC, dq, dlm, tmp, n, m, d);
    SFX(gauss_kernel_grad)(lm, lm, w, dW, dlm, dlm, tmp, m, m, d);
    if (lmt) {                                    /* GELU, LayerNorm, the strided conv, its input grid */
        SFX(ln_gelu_grad)(z, dlm, dz, ln_w, ln_b, ln_eps, dln_w + sl * d, dln_b + sl * d, xhat, m, d);
        SFX(soft_landmark_conv_grad)(grid, lmt, dz, dlmt + sl * s * s * d * d, dgrid, mh, mw, s, d);
        if (pool_first) {
            SFX(pool_grid_grad)(dgrid, dq + prefix * d, H, W, gh, gw, d, 0);
        } else {
            for (int64_t rr = 0; rr < gh; ++rr)
                for (int64_t e = 0; e < gw * d; ++e) dq[(prefix + rr * W) * d + e] += dgrid[rr * gw * d + e];
        }
    } else {
        SFX(pool_grid_grad)(dlm, dq + prefix * d, H, W, mh, mw, d, pool_first ? 0 : s);
    }
    if (ksize > 0)
        err = SFX(local_conv_grad)(v + prefix * d, g + prefix * d, conv_w + h * taps, 0, dv + prefix * d,
                                  dconv_w + sl * taps, NULL, H, W, d, ksize);
    if (err)
        count_failure(&args->failed);
    else
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < d; ++c) {
                dqp[(b * n + i) * C + h * d + c] = scale * dq[i * d + c];
                dvp[(b * n + i) * C + h * d + c] = dv[i * d + c];
            }
    free(buf);
}

/* The backward of vitmix_soft_mix with `save`: from qp, vp (B, n, C), the landmark module's weights (as the
 * forward), the per-head filter conv_w (heads, ksize^2), gout = dL/dout (B, n, C) and saved (B heads,
 * n m + m^2 + m d), writes dqp, dvp (B, n, C) (every element) and per slice dlmt (B heads, s, s, d_in, d_out),
 * dln_w, dln_b (B heads, d) (conv landmarks only) and dconv_w (B heads, ksize^2): the caller sums those over the
 * slices. Per slice, in order: the products C_q (M (C_q^T V)) backwards (SOFT-Norm's D^(-1/2) scaling with its
 * row-sum gradient), the implicit Newton-Schulz backward dW = -M^T dM M^T, the Gaussian kernels' gradients
 * (C_q = k(Q, L), W = k(L, L)), the landmarks' (GELU, LayerNorm, strided conv, pooling) and the local filter's.
 * Returns the number of slices that ran out of memory. */
int64_t SFX(vitmix_soft_mix_backward)(const TYPE *qp, const TYPE *vp, const TYPE *lm_w, const TYPE *ln_w,
                                     const TYPE *ln_b, TYPE ln_eps, const TYPE *conv_w, const TYPE *gout,
                                     const TYPE *saved, TYPE *dqp, TYPE *dvp, TYPE *dlmt, TYPE *dln_w, TYPE *dln_b,
                                     TYPE *dconv_w, int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W,
                                     int64_t heads, int64_t d, int64_t mh, int64_t mw, int64_t s, int pool_first,
                                     TYPE scale, int norm, int64_t ksize, int nthreads) {
    TYPE *lmt = lm_w ? SFX(soft_conv_taps)(lm_w, s, d) : NULL;
    if (lm_w && !lmt) return B * heads;
    SFX(soft_args) args = {.qp = qp, .vp = vp, .lmt = lmt, .ln_w = ln_w, .ln_b = ln_b, .conv_w = conv_w, .gout = gout,
                           .saved = saved, .dqp = dqp, .dvp = dvp, .dlmt = dlmt, .dln_w = dln_w, .dln_b = dln_b,
                           .dconv_w = dconv_w, .n = n, .prefix = prefix, .H = H, .W = W, .heads = heads, .d = d,
                           .mh = mh, .mw = mw, .s = s, .ksize = ksize, .ln_eps = ln_eps, .scale = scale,
                           .pool_first = pool_first, .norm = norm};
    parallel_for(SFX(soft_mix_backward_item), &args, B * heads, nthreads, 0);
    free(lmt);
    return args.failed;
}
