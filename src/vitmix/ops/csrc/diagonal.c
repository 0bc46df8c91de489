/* Sparse multi-diagonal attention (Fibottention) on CPU: forward and backward.
 *
 * Plain C99 with OpenMP (pthreads where OpenMP is unavailable), no torch headers, so it compiles in
 * about a second; loaded with ctypes by vitmix.ops.diagonal.c (its
 * prototype table matches diagonal.h). Every buffer is allocated by
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

#include "vitmix_simd.h"
#include "vitmix_exp.h"
#include "vitmix_parallel.h"
#include "diagonal.h"

#define ROW_BLOCK 64
#define INLINE static inline __attribute__((always_inline))


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

#include "dtype_f32.h"
#define EXPFN vitmix_expf
#include "diagonal_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "diagonal_typed.h"
#include "dtype_end.h"
