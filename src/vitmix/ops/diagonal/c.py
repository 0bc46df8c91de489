"""Sparse multi-diagonal attention in C: the OpenMP source and its ctypes binding (private).

CPU, float32/float64. Kept as Python strings (compiled on first use with the system C compiler by
:mod:`vitmix.ops._cbuild` and loaded with ctypes) so that it ships inside the package without a build
step. ``BODY`` is written once with ``TYPE``, ``SFX``, ``EXP`` and ``LOG`` placeholders and instantiated
for float32 and float64."""
from __future__ import annotations

import ctypes
import functools

import torch

from .._cbuild import CKernel
from .plan import _token_major


COMMON = r"""/* Sparse multi-diagonal attention (Fibottention) on CPU: forward and backward.
 *
 * Plain C99 with OpenMP (pthreads where OpenMP is unavailable), no torch headers, so it compiles in
 * about a second; loaded with ctypes by vitmix.ops.diagonal.c. Every buffer is allocated by
 * PyTorch and passed as a raw pointer.
 *
 * Layout: q, k, v, out, dout, dq, dk, dv are (B, H, T, D) views with any batch/head/token strides
 * and unit stride along D (so the qkv projection's output and a token-major output buffer are used
 * in place); T = P + N tokens, the first P are prefix (CLS/register) tokens. The kernel handles the
 * N patch-query rows and, as extra work items, the P prefix-query rows, which attend to all T keys
 * (their weights and score gradients wpre/dspre (BH, P, T) are kept for the key passes).
 *   shifts (H, M)      signed key offsets   slot m of head h scores patch key j + shifts[h*M + m]
 *   counts (H)         real slots of head h (<= M)
 *   lse    (BH, N)     forward log-sum-exp (-inf: a query without any key, output 0)
 *   a, ds  (BH, N, P + M)  backward: weights and score gradients per slot
 * Slots of a query row: [0, P) prefix keys, then [P, P + M) the head's offset keys.
 *
 * Work items are (bh, block of ROW_BLOCK rows), processed slot by slot: for a fixed slot the keys of
 * consecutive queries are consecutive rows, so K and V are streamed and the block's q/out rows
 * stay in L1. Backward has two passes so that no two threads write the same row:
 *   pass 1 (query blocks): recompute scores, a = exp(s - lse), dA = dout_j . v_key,
 *          dS = a (dA - dout_j . out_j), dq_j = scale * sum dS k_key; store a and dS per slot;
 *   pass 2 (key blocks): dk_i = scale * sum dS[i - shift] q_(i - shift), dv_i = sum a[..] dout_(..)
 *          over the queries that reach key i, plus the prefix queries' share;
 *   pass 3 (prefix keys): dk, dv of the P prefix keys, which every query reaches.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROW_BLOCK 64
#define INLINE static inline __attribute__((always_inline))

typedef void (*work_fn)(void *ctx, int64_t item, void *scratch);

#ifdef _OPENMP
#include <omp.h>
/* OpenMP build: runs on PyTorch's own OpenMP thread pool (same libgomp, shared by soname), so the
 * kernel neither starts threads nor competes with PyTorch's waiting workers for the cores. */
static void parallel_for(work_fn fn, void *ctx, int64_t n_items, int nthreads, size_t scratch_bytes) {
    if (nthreads > n_items) nthreads = (int)n_items;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_items; ++i) fn(ctx, i, scratch);
        free(scratch);
    }
}
#else /* plain pthreads */
typedef struct {
    work_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t next;
    size_t scratch_bytes;
} pool_t;

static void *worker(void *arg) {
    pool_t *pool = (pool_t *)arg;
    void *scratch = pool->scratch_bytes ? malloc(pool->scratch_bytes) : NULL;
    for (;;) {
        int64_t item = __atomic_fetch_add(&pool->next, 1, __ATOMIC_RELAXED);
        if (item >= pool->n_items) break;
        pool->fn(pool->ctx, item, scratch);
    }
    free(scratch);
    return NULL;
}

static void parallel_for(work_fn fn, void *ctx, int64_t n_items, int nthreads, size_t scratch_bytes) {
    pool_t pool = {fn, ctx, n_items, 0, scratch_bytes};
    if (nthreads > n_items) nthreads = (int)n_items;
    if (nthreads <= 1) {
        worker(&pool);
        return;
    }
    pthread_t *threads = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)(nthreads - 1));
    int started = 0;
    for (int t = 0; t < nthreads - 1; ++t) {
        if (pthread_create(&threads[t], NULL, worker, &pool) != 0) break;
        ++started;
    }
    worker(&pool);
    for (int t = 0; t < started; ++t) pthread_join(threads[t], NULL);
    free(threads);
}
#endif

/* a (B, H, T, D) tensor with unit stride along D: element strides of batch, head and token */
typedef struct {
    void *p;
    int64_t sb, sh, st;
} view_t;

enum { V_Q, V_K, V_V, V_OUT, V_DOUT, V_DQ, V_DK, V_DV, N_VIEWS };

typedef struct {
    view_t t[N_VIEWS];
    void *lse, *a_buf, *ds_buf, *wpre, *dspre, *lse_pre;
    const int64_t *shifts, *counts;
    int64_t B, H, N, P, M, D;
    double scale;
} args_t;

static void make_args(args_t *a, void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                      int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale) {
    for (int i = 0; i < N_VIEWS; ++i) {
        a->t[i].p = ptrs[i];
        a->t[i].sb = strides[3 * i];
        a->t[i].sh = strides[3 * i + 1];
        a->t[i].st = strides[3 * i + 2];
    }
    a->lse = ptrs[N_VIEWS];
    a->a_buf = ptrs[N_VIEWS + 1];
    a->ds_buf = ptrs[N_VIEWS + 2];
    a->wpre = ptrs[N_VIEWS + 3];
    a->dspre = ptrs[N_VIEWS + 4];
    a->lse_pre = ptrs[N_VIEWS + 5];
    a->shifts = shifts;
    a->counts = counts;
    a->B = B; a->H = H; a->N = N; a->P = P; a->M = M; a->D = D;
    a->scale = scale;
}

/* rows [lo, hi) of the block [j0, j1) whose key j + s lies in [0, n) */
INLINE void valid_rows(int64_t j0, int64_t j1, int64_t s, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t a = j0 > -s ? j0 : -s, b = j1 < n - s ? j1 : n - s;
    if (a > j1) a = j1;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* exp for x <= 0 (softmax weights), vectorisable: Cephes-style range reduction + degree-6
 * polynomial, max relative error ~2e-7 on [-87, 0]; below -87 it returns ~1e-38, negligible next
 * to the row maximum's weight of 1. */
INLINE float vitmix_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    union { int32_t i; float f; } u;
    u.i = ((int32_t)n + 127) << 23;
    return y * u.f;
}
"""

BODY = r"""
#undef ROW
#define ROW(view, b, h, t) ((TYPE *)(view).p + (b) * (view).sb + (h) * (view).sh + (t) * (view).st)
INLINE TYPE dot_SFX(const TYPE *restrict x, const TYPE *restrict y, int64_t d) {
    TYPE acc = 0;
    for (int64_t c = 0; c < d; ++c) acc += x[c] * y[c];
    return acc;
}

INLINE void axpy_SFX(TYPE *restrict y, TYPE alpha, const TYPE *restrict x, int64_t d) {
    for (int64_t c = 0; c < d; ++c) y[c] += alpha * x[c];
}

/* scores of the block's patch rows into sc (row stride sw): prefix slots, then offset slots
 * (fill outside the sequence); row j uses qv's token P + j against kv's keys */
INLINE void block_scores_SFX(const args_t *a, int64_t b, int64_t h, int64_t j0, int64_t j1, TYPE *sc, int64_t sw,
                             view_t qv, view_t kv, TYPE mul, TYPE fill, int64_t D) {
    const int64_t P = a->P, N = a->N, cnt = a->counts[h];
    const int64_t *sh = a->shifts + h * a->M;
    for (int64_t p = 0; p < P; ++p)
        for (int64_t j = j0; j < j1; ++j)
            sc[(j - j0) * sw + p] = mul * dot_SFX(ROW(qv, b, h, P + j), ROW(kv, b, h, p), D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = sh[m];
        int64_t lo, hi;
        valid_rows(j0, j1, s, N, &lo, &hi);
        TYPE *col = sc + P + m;
        for (int64_t j = j0; j < lo; ++j) col[(j - j0) * sw] = fill;
        for (int64_t j = lo; j < hi; ++j)
            col[(j - j0) * sw] = mul * dot_SFX(ROW(qv, b, h, P + j), ROW(kv, b, h, P + j + s), D);
        for (int64_t j = hi; j < j1; ++j) col[(j - j0) * sw] = fill;
    }
}

/* y_j += mul * sum over slots w[j, slot] x_key for the block's patch rows */
INLINE void block_gather_SFX(const args_t *a, int64_t b, int64_t h, int64_t j0, int64_t j1, const TYPE *w, int64_t sw,
                             view_t xv, view_t yv, TYPE mul, int64_t D) {
    const int64_t P = a->P, N = a->N, cnt = a->counts[h];
    const int64_t *sh = a->shifts + h * a->M;
    for (int64_t p = 0; p < P; ++p)
        for (int64_t j = j0; j < j1; ++j)
            axpy_SFX(ROW(yv, b, h, P + j), mul * w[(j - j0) * sw + p], ROW(xv, b, h, p), D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = sh[m];
        int64_t lo, hi;
        valid_rows(j0, j1, s, N, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j)
            axpy_SFX(ROW(yv, b, h, P + j), mul * w[(j - j0) * sw + P + m], ROW(xv, b, h, P + j + s), D);
    }
}

INLINE void zero_rows_SFX(view_t yv, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t D) {
    for (int64_t t = t0; t < t1; ++t) memset(ROW(yv, b, h, t), 0, sizeof(TYPE) * (size_t)D);
}

INLINE void prefix_fwd_SFX(const args_t *a, int64_t bh, int64_t p, TYPE *sc, int64_t D);
INLINE void prefix_bwd_SFX(const args_t *a, int64_t bh, int64_t p, int64_t D);

INLINE void fwd_body_SFX(void *vctx, int64_t item, void *scratch, const int64_t D) {
    const args_t *a = (const args_t *)vctx;
    const int64_t N = a->N, P = a->P, nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK, BH = a->B * a->H;
    if (item >= BH * nblk) { /* a prefix query row */
        prefix_fwd_SFX(a, (item - BH * nblk) / P, (item - BH * nblk) % P, (TYPE *)scratch, D);
        return;
    }
    const int64_t bh = item / nblk, b = bh / a->H, h = bh % a->H;
    const int64_t j0 = (item % nblk) * ROW_BLOCK, j1 = j0 + ROW_BLOCK < N ? j0 + ROW_BLOCK : N;
    const int64_t sw = P + a->M, used = P + a->counts[h];
    TYPE *sc = (TYPE *)scratch, *lse = (TYPE *)a->lse + bh * N;
    block_scores_SFX(a, b, h, j0, j1, sc, sw, a->t[V_Q], a->t[V_K], (TYPE)a->scale, (TYPE)-INFINITY, D);
    for (int64_t j = j0; j < j1; ++j) {
        TYPE *row = sc + (j - j0) * sw, mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < used; ++i) mx = row[i] > mx ? row[i] : mx;
        if (mx == -INFINITY) {
            for (int64_t i = 0; i < used; ++i) row[i] = 0;
            lse[j] = -INFINITY;
            continue;
        }
        for (int64_t i = 0; i < used; ++i) {
            row[i] = row[i] == -INFINITY ? (TYPE)0 : EXP(row[i] - mx);
            sum += row[i];
        }
        const TYPE inv = (TYPE)1 / sum;
        for (int64_t i = 0; i < used; ++i) row[i] *= inv;
        lse[j] = mx + LOG(sum);
    }
    zero_rows_SFX(a->t[V_OUT], b, h, P + j0, P + j1, D);
    block_gather_SFX(a, b, h, j0, j1, sc, sw, a->t[V_V], a->t[V_OUT], (TYPE)1, D);
}

INLINE void bwd1_body_SFX(void *vctx, int64_t item, void *scratch, const int64_t D) {
    (void)scratch;
    const args_t *a = (const args_t *)vctx;
    const int64_t N = a->N, P = a->P, nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK, BH = a->B * a->H;
    if (item >= BH * nblk) {
        prefix_bwd_SFX(a, (item - BH * nblk) / P, (item - BH * nblk) % P, D);
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
    block_scores_SFX(a, b, h, j0, j1, ab, sw, a->t[V_Q], a->t[V_K], (TYPE)a->scale, (TYPE)-INFINITY, D);
    block_scores_SFX(a, b, h, j0, j1, ds, sw, a->t[V_DOUT], a->t[V_V], (TYPE)1, (TYPE)0, D);
    for (int64_t j = j0; j < j1; ++j) {
        TYPE *arow = ab + (j - j0) * sw, *drow = ds + (j - j0) * sw;
        const TYPE l = lse[j];
        if (l == -INFINITY) {
            for (int64_t i = 0; i < used; ++i) arow[i] = drow[i] = 0;
            continue;
        }
        const TYPE delta = dot_SFX(ROW(a->t[V_DOUT], b, h, P + j), ROW(a->t[V_OUT], b, h, P + j), D);
        for (int64_t i = 0; i < used; ++i) {
            const TYPE w = arow[i] == -INFINITY ? (TYPE)0 : EXP(arow[i] - l);
            drow[i] = w * (drow[i] - delta);
            arow[i] = w;
        }
    }
    zero_rows_SFX(a->t[V_DQ], b, h, P + j0, P + j1, D);
    block_gather_SFX(a, b, h, j0, j1, ds, sw, a->t[V_K], a->t[V_DQ], (TYPE)a->scale, D);
}

INLINE void bwd2_body_SFX(void *vctx, int64_t item, void *scratch, const int64_t D) {
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
    zero_rows_SFX(dkv, b, h, P + i0, P + i1, D);
    zero_rows_SFX(dvv, b, h, P + i0, P + i1, D);
    for (int64_t m = 0; m < cnt; ++m) {
        const int64_t s = -sh[m]; /* key i is reached by query i - shift */
        int64_t lo, hi;
        valid_rows(i0, i1, s, N, &lo, &hi);
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t j = i + s;
            axpy_SFX(ROW(dkv, b, h, P + i), scale * ds[j * sw + P + m], ROW(qv, b, h, P + j), D);
            axpy_SFX(ROW(dvv, b, h, P + i), ab[j * sw + P + m], ROW(gv, b, h, P + j), D);
        }
    }
    if (P) { /* the dense prefix queries' share */
        const TYPE *wp = (const TYPE *)a->wpre + bh * P * T, *dp = (const TYPE *)a->dspre + bh * P * T;
        for (int64_t p = 0; p < P; ++p)
            for (int64_t i = i0; i < i1; ++i) {
                axpy_SFX(ROW(dkv, b, h, P + i), scale * dp[p * T + P + i], ROW(qv, b, h, p), D);
                axpy_SFX(ROW(dvv, b, h, P + i), wp[p * T + P + i], ROW(gv, b, h, p), D);
            }
    }
}


/* dense row of prefix query p (token p): scores over all T keys */
INLINE void prefix_fwd_SFX(const args_t *a, int64_t bh, int64_t p, TYPE *sc, int64_t D) {
    const int64_t b = bh / a->H, h = bh % a->H, T = a->P + a->N;
    const TYPE *qp = ROW(a->t[V_Q], b, h, p);
    TYPE mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < T; ++t) {
        sc[t] = (TYPE)a->scale * dot_SFX(qp, ROW(a->t[V_K], b, h, t), D);
        mx = sc[t] > mx ? sc[t] : mx;
    }
    for (int64_t t = 0; t < T; ++t) {
        sc[t] = EXP(sc[t] - mx);
        sum += sc[t];
    }
    const TYPE inv = (TYPE)1 / sum;
    TYPE *o = ROW(a->t[V_OUT], b, h, p);
    memset(o, 0, sizeof(TYPE) * (size_t)D);
    for (int64_t t = 0; t < T; ++t) axpy_SFX(o, sc[t] * inv, ROW(a->t[V_V], b, h, t), D);
    ((TYPE *)a->lse_pre)[bh * a->P + p] = mx + LOG(sum);
}

/* backward of prefix query p: weights and score gradients over all keys, and dq_p */
INLINE void prefix_bwd_SFX(const args_t *a, int64_t bh, int64_t p, int64_t D) {
    const int64_t b = bh / a->H, h = bh % a->H, T = a->P + a->N;
    const TYPE scale = (TYPE)a->scale, l = ((const TYPE *)a->lse_pre)[bh * a->P + p];
    const TYPE *qp = ROW(a->t[V_Q], b, h, p), *gp = ROW(a->t[V_DOUT], b, h, p);
    TYPE *w = (TYPE *)a->wpre + (bh * a->P + p) * T, *ds = (TYPE *)a->dspre + (bh * a->P + p) * T;
    const TYPE delta = dot_SFX(gp, ROW(a->t[V_OUT], b, h, p), D);
    for (int64_t t = 0; t < T; ++t) {
        w[t] = scale * dot_SFX(qp, ROW(a->t[V_K], b, h, t), D);
        ds[t] = dot_SFX(gp, ROW(a->t[V_V], b, h, t), D);
    }
    for (int64_t t = 0; t < T; ++t) {
        w[t] = EXP(w[t] - l);
        ds[t] = w[t] * (ds[t] - delta);
    }
    TYPE *dq = ROW(a->t[V_DQ], b, h, p);
    memset(dq, 0, sizeof(TYPE) * (size_t)D);
    for (int64_t t = 0; t < T; ++t) axpy_SFX(dq, scale * ds[t], ROW(a->t[V_K], b, h, t), D);
}

/* pass 3: gradients of prefix key p from every query */
INLINE void bwd3_body_SFX(void *vctx, int64_t item, void *scratch, const int64_t D) {
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
        axpy_SFX(dk, scale * ds[j * sw + p], ROW(a->t[V_Q], b, h, P + j), D);
        axpy_SFX(dv, ab[j * sw + p], ROW(a->t[V_DOUT], b, h, P + j), D);
    }
    for (int64_t r = 0; r < P; ++r) {
        axpy_SFX(dk, scale * dp[r * T + p], ROW(a->t[V_Q], b, h, r), D);
        axpy_SFX(dv, wp[r * T + p], ROW(a->t[V_DOUT], b, h, r), D);
    }
}

#define DISPATCH_SFX(name)                                                                             \
    static void name##_item_SFX(void *vctx, int64_t item, void *scratch) {                            \
        const int64_t D = ((const args_t *)vctx)->D;                                                   \
        if (D == 64) name##_body_SFX(vctx, item, scratch, 64);                                         \
        else if (D == 32) name##_body_SFX(vctx, item, scratch, 32);                                    \
        else name##_body_SFX(vctx, item, scratch, D);                                                  \
    }
DISPATCH_SFX(fwd)
DISPATCH_SFX(bwd1)
DISPATCH_SFX(bwd2)
DISPATCH_SFX(bwd3)

/* ptrs: q, k, v, out, dout, dq, dk, dv, lse, a_buf, ds_buf, wpre, dspre, lse_pre; strides: 3 per view */
void vitmix_diag_fwd_SFX(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr) {
    args_t a;
    make_args(&a, ptrs, strides, shifts, counts, B, H, N, P, M, D, scale);
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t scratch = ROW_BLOCK * (P + M) > P + N ? ROW_BLOCK * (P + M) : P + N;
    parallel_for(fwd_item_SFX, &a, B * H * (nblk + P), nthr, sizeof(TYPE) * (size_t)scratch);
}

void vitmix_diag_bwd_SFX(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr) {
    args_t a;
    make_args(&a, ptrs, strides, shifts, counts, B, H, N, P, M, D, scale);
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    parallel_for(bwd1_item_SFX, &a, B * H * (nblk + P), nthr, 0); /* patch and prefix query rows */
    parallel_for(bwd2_item_SFX, &a, B * H * nblk, nthr, 0);
    if (P) parallel_for(bwd3_item_SFX, &a, B * H * P, nthr, 0);
}
"""

@functools.lru_cache(maxsize=None)
def diagonal_c_source() -> str:
    """The C source, instantiated for float32 and float64 (built on first use, then cached)."""
    f32 = BODY.replace("TYPE", "float").replace("SFX", "f32").replace("EXP(", "vitmix_expf(").replace("LOG(", "logf(")
    f64 = BODY.replace("TYPE", "double").replace("SFX", "f64").replace("EXP(", "exp(").replace("LOG(", "log(")
    return COMMON + f32 + f64 + "\nint vitmix_diag_abi_version(void) { return 4; }\n"


# ------------------------------------------------------------------------------------- C kernel
def _declare(lib) -> None:
    p, i64, dbl, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    for sfx in ("f32", "f64"):
        for step in ("fwd", "bwd"):
            fn = getattr(lib, f"vitmix_diag_{step}_{sfx}")
            fn.argtypes = [p] * 4 + [i64] * 6 + [dbl, cint]
            fn.restype = None


#: the compiled C kernel, built on first use (see :mod:`vitmix.ops._cbuild`)
_DIAGONAL = CKernel("diagonal_kernel", diagonal_c_source, _declare)


def _load_kernel():
    return _DIAGONAL.load()


def kernel_available() -> bool:
    """True when the C backend can be used (a C compiler worked, or the library was cached)."""
    return _load_kernel() is not None


_N_VIEWS = 8  # q, k, v, out, dout, dq, dk, dv (then lse, a_buf, ds_buf, wpre, dspre, lse_pre)


def _c_call(fn, views, extras, plan, b, h, n, p, d, scale):
    ptrs = (ctypes.c_void_p * (_N_VIEWS + 6))()
    strides = (ctypes.c_int64 * (3 * _N_VIEWS))()
    for i, t in enumerate(views):
        if t is not None:
            ptrs[i] = t.data_ptr()
            strides[3 * i: 3 * i + 3] = list(t.stride()[:3])
    for i, t in enumerate(extras):
        if t is not None:
            ptrs[_N_VIEWS + i] = t.data_ptr()
    fn(ptrs, strides, plan.shifts.data_ptr(), plan.counts.data_ptr(), b, h, n, p, plan.max_slots, d, float(scale),
       torch.get_num_threads())


def _c_forward(lib, q, k, v, plan, p, scale):
    """Output (a token-major ``(B, H, T, D)`` view) and the log-sum-exp of the patch and prefix rows."""
    b, h, t, d = q.shape
    n = t - p
    out = _token_major(b, h, t, d, q)
    lse = q.new_empty(b, h, n)
    lse_pre = q.new_empty(b, h, p)
    fn = lib.vitmix_diag_fwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_fwd_f64
    _c_call(fn, (q, k, v, out, None, None, None, None), (lse, None, None, None, None, lse_pre), plan, b, h, n, p, d,
            scale)
    return out, lse, lse_pre


def _c_backward(lib, q, k, v, out, lse, lse_pre, dout, plan, p, scale, like_inputs=True):
    """``dq, dk, dv``, all computed by the kernel. ``like_inputs``: each gradient in the layout of its
    input when that is contiguous (cheap accumulation into ``.grad``), else token-major (inputs that
    are views of a qkv projection); ``False``: all token-major (the custom op's fixed layout)."""
    b, h, t, d = q.shape
    n = t - p
    dq, dk, dv = (torch.empty_like(x) if like_inputs and x.is_contiguous() else _token_major(b, h, t, d, q)
                  for x in (q, k, v))
    a_buf = q.new_empty(b, h, n, p + plan.max_slots)
    ds_buf = q.new_empty(b, h, n, p + plan.max_slots)
    wpre = q.new_empty(b, h, p, t)
    dspre = q.new_empty(b, h, p, t)
    fn = lib.vitmix_diag_bwd_f32 if q.dtype == torch.float32 else lib.vitmix_diag_bwd_f64
    _c_call(fn, (q, k, v, out, dout, dq, dk, dv), (lse, a_buf, ds_buf, wpre, dspre, lse_pre), plan, b, h, n, p, d,
            scale)
    return dq, dk, dv
