/* The L1 distance forward and backward for one dtype (see l1_kernel.c; the forward's loop is distance_typed.h's). */
/* one call's arguments, read by its work items (b, block of rows rows of x) */
typedef struct {
    const TYPE *g, *x, *y;
    const int64_t *xs;
    TYPE *out, *part;                   /* forward: the distances (out); backward: grad x (out), grad-y partials */
    int64_t N, M, D, rows, nblk;
} SFX(l1_args);

/* Landmarks in blocks of JB (transposed into the thread's scratch, zero-padded to Mp), rows four at a time
 * (distance_typed.h) */
static void SFX(l1_fwd_item)(void *ctx, int64_t item, void *scratch) {
    const SFX(l1_args) *args = (const SFX(l1_args) *)ctx;
    const int64_t N = args->N, M = args->M, D = args->D, Mp = (M + JB - 1) / JB * JB;
    const int64_t b = item / args->nblk, i0 = (item % args->nblk) * args->rows;
    const int64_t i1 = i0 + args->rows < N ? i0 + args->rows : N;
    TYPE *yt = (TYPE *)scratch;
    SFX(transpose_pad)(args->y + b * M * D, yt, M, Mp, D);
    SFX(distances)(XROW(args->x, args->xs, b, i0), args->xs[3], i1 - i0, yt, args->out + (b * N + i0) * M, M, Mp, D, 1);
}

void SFX(vitmix_l1_fwd)(const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    const SFX(l1_args) args = {NULL, x, y, xs, out, NULL, N, M, D, rows, (N + rows - 1) / rows};
    const int64_t Mp = (M + JB - 1) / JB * JB;
    parallel_for(SFX(l1_fwd_item), (void *)&args, B * args.nblk, nthreads, sizeof(TYPE) * (size_t)(D * Mp));
}

/* g·sign(x - y) lane-wise: g with its sign bit flipped where x < y, zero where x == y (or unordered) */
static inline SFX(vec) SFX(signed_g)(SFX(vec) xv, SFX(vec) yv, SFX(vec) gv) {
    const SFX(vec) t = xv - yv;
    const SFX(ivec) nonzero = (SFX(ivec))((t > (SFX(vec)){0}) | (t < (SFX(vec)){0}));
    return (SFX(vec))((((SFX(ivec))gv) ^ ((SFX(ivec))t & ~ABSMASK)) & nonzero);
}

/* Vectorised over channels in blocks of JB, in the natural (M, D) layout: for a token i and a landmark j,
 * w = g_ij·sign(x_i - y_j) is added to gx_i (kept in registers over all landmarks) and subtracted from this
 * item's grad-y partial row j (in L1). No horizontal sums, no transposes; the channel blocks of a row are
 * independent chains. Channels past the last full block: scalar. */
static void SFX(l1_bwd_item)(void *ctx, int64_t item, void *scratch) {
    const SFX(l1_args) *args = (const SFX(l1_args) *)ctx;
    const TYPE *g = args->g, *x = args->x;
    const int64_t *xs = args->xs;
    TYPE *gx = args->out;
    const int64_t N = args->N, M = args->M, D = args->D, Dv = D / JB * JB;
    const int64_t b = item / args->nblk, i0 = (item % args->nblk) * args->rows;
    const int64_t i1 = i0 + args->rows < N ? i0 + args->rows : N;
    const TYPE *yb = args->y + b * M * D;
    TYPE *py = args->part + item * M * D;
    (void)scratch;
    memset(py, 0, sizeof(TYPE) * (size_t)(M * D));
    for (int64_t i = i0; i < i1; ++i) {
        const TYPE *xi = XROW(x, xs, b, i), *gi = g + (b * N + i) * M;
        TYPE *gxi = gx + (b * N + i) * D;
        int64_t c0 = 0;
        for (; c0 + 4 * JB <= Dv; c0 += 4 * JB) {          /* four channel blocks: four chains */
            SFX(vec) x0, x1, x2, x3, a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, yv, pv, w;
            memcpy(&x0, xi + c0, sizeof x0);
            memcpy(&x1, xi + c0 + JB, sizeof x1);
            memcpy(&x2, xi + c0 + 2 * JB, sizeof x2);
            memcpy(&x3, xi + c0 + 3 * JB, sizeof x3);
            for (int64_t j = 0; j < M; ++j) {
                const SFX(vec) gv = (SFX(vec)){0} + gi[j];
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
            SFX(vec) xv, a = {0}, yv, pv, w;
            memcpy(&xv, xi + c0, sizeof xv);
            for (int64_t j = 0; j < M; ++j) {
                memcpy(&yv, yb + j * D + c0, sizeof yv);
                memcpy(&pv, py + j * D + c0, sizeof pv);
                w = SFX(signed_g)(xv, yv, (SFX(vec)){0} + gi[j]);
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

void SFX(vitmix_l1_bwd)(const TYPE *g, const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *gx, TYPE *part,
                       int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads) {
    const SFX(l1_args) args = {g, x, y, xs, gx, part, N, M, D, rows, (N + rows - 1) / rows};
    parallel_for(SFX(l1_bwd_item), (void *)&args, B * args.nblk, nthreads, 0);
}
