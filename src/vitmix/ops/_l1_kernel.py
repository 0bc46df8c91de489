"""C source of the CPU L1-distance kernels behind the Laplacian kernel (private).

Compiled on first use by :mod:`vitmix.ops._cbuild` (about a second, then cached) and called by
:mod:`vitmix.ops._l1`. ``BODY`` is written once with ``TYPE``/``SFX``/``EXP``/``ABS`` placeholders and
instantiated for float32 and float64.
"""

HEADER = r"""/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D), y (B, M, D), g (B, N, M), all contiguous. Work items are (b, block of ROWS rows of x).
 * Each item first copies its landmarks transposed, yt (D, M) in a private buffer (like the official
 * CUDA operator's key layout): for a fixed token i and channel c the M landmarks are then one
 * contiguous row, so the innermost loop runs over landmarks and vectorises without horizontal sums.
 *   forward:  out[b,i,j] = sum_c |x[b,i,c] - y[b,j,c]|           (times neg_inv_lam and exp'd if asked)
 *   backward: gx[b,i,c] =  sum_j g[b,i,j] sign(x[b,i,c] - y[b,j,c])    (sign(0) = 0, as the official CUDA)
 *             part[item, j, c] = -sum_{i in item} g[b,i,j] sign(...)  (grad of y, accumulated in (D, M)
 *                                                                    order and written back transposed;
 *                                                                    summed over the items by the caller:
 *                                                                    no two threads write the same memory)
 * Plain C99 + OpenMP (sequential without it); no torch headers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
"""

BODY = r"""
static void transpose_SFX(const TYPE *y, TYPE *yt, int64_t M, int64_t D) {
    for (int64_t j = 0; j < M; ++j)
        for (int64_t c = 0; c < D; ++c) yt[c * M + j] = y[j * D + c];
}

void vitmix_l1_fwd_SFX(const TYPE *x, const TYPE *y, TYPE *out, int64_t B, int64_t N, int64_t M, int64_t D,
                       int64_t rows, double neg_inv_lam, int apply_exp, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
    const TYPE scale = (TYPE)neg_inv_lam;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        TYPE *yb = (TYPE *)malloc(sizeof(TYPE) * (size_t)(D * M));
        transpose_SFX(y + b * M * D, yb, M, D);
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = x + (b * N + i) * D;
            TYPE *restrict o = out + (b * N + i) * M;
            for (int64_t j = 0; j < M; ++j) o[j] = 0;
            for (int64_t c = 0; c < D; ++c) {
                const TYPE xv = xi[c];
                const TYPE *restrict yc = yb + c * M;
                for (int64_t j = 0; j < M; ++j) o[j] += ABS(xv - yc[j]);
            }
            if (apply_exp)
                for (int64_t j = 0; j < M; ++j) o[j] = EXP(o[j] * scale);
        }
        free(yb);
    }
}

void vitmix_l1_bwd_SFX(const TYPE *g, const TYPE *x, const TYPE *y, TYPE *gx, TYPE *part, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        TYPE *yb = (TYPE *)malloc(sizeof(TYPE) * (size_t)(2 * D * M));
        TYPE *py = yb + D * M;
        transpose_SFX(y + b * M * D, yb, M, D);
        memset(py, 0, sizeof(TYPE) * (size_t)(D * M));
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = x + (b * N + i) * D;
            const TYPE *restrict gi = g + (b * N + i) * M;
            TYPE *gxi = gx + (b * N + i) * D;
            for (int64_t c = 0; c < D; ++c) {
                const TYPE xv = xi[c];
                const TYPE *restrict yc = yb + c * M;
                TYPE *restrict pc = py + c * M;
                TYPE acc = 0;
                for (int64_t j = 0; j < M; ++j) {
                    const TYPE w = gi[j] * (TYPE)((xv > yc[j]) - (xv < yc[j]));
                    acc += w;
                    pc[j] -= w;
                }
                gxi[c] = acc;
            }
        }
        TYPE *out_part = part + item * M * D;       /* back to (M, D) */
        for (int64_t j = 0; j < M; ++j)
            for (int64_t c = 0; c < D; ++c) out_part[j * D + c] = py[c * M + j];
        free(yb);
    }
}
"""
def _instantiate() -> str:
    parts = [HEADER]
    for typ, sfx, exp, absf in (("float", "f32", "expf", "fabsf"), ("double", "f64", "exp", "fabs")):
        parts.append(BODY.replace("TYPE", typ).replace("SFX", sfx).replace("EXP", exp).replace("ABS", absf))
    return "".join(parts)


SOURCE = _instantiate()
