"""C source of the CPU L1-distance kernels behind the Laplacian kernel (private).

Compiled on first use by :mod:`vitmix.ops._cbuild` (about a second, then cached) and called by
:mod:`vitmix.ops._l1`. ``BODY`` is written once with ``TYPE``/``SFX``/``EXP``/``ABS`` placeholders and
instantiated for float32 and float64.
"""

HEADER = r"""/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D) and the landmarks TRANSPOSED, yt (B, D, M), both contiguous (like the official CUDA
 * operator's key layout): for a fixed token i and channel c the M landmarks are one contiguous row,
 * so the innermost loop runs over landmarks and vectorises without horizontal sums. Work items are
 * (b, block of ROWS rows of x); yt of one b (D·M values) stays in L1/L2.
 *   forward:  out[b,i,j] = sum_c |x[b,i,c] - yt[b,c,j]|          (times neg_inv_lam and exp'd if asked)
 *   backward: gx[b,i,c] =  sum_j g[b,i,j] sign(x[b,i,c] - yt[b,c,j])   (sign(0) = 0, as the official CUDA)
 *             part[item, c, j] = -sum_{i in item} g[b,i,j] sign(...)  (grad of yt, summed over the items
 *                                                                    by the caller: no two threads write
 *                                                                    the same memory)
 * Plain C99 + OpenMP (sequential without it); no torch headers.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
"""

BODY = r"""
void vitmix_l1_fwd_SFX(const TYPE *x, const TYPE *yt, TYPE *out, int64_t B, int64_t N, int64_t M, int64_t D,
                       int64_t rows, double neg_inv_lam, int apply_exp, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
    const TYPE scale = (TYPE)neg_inv_lam;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = yt + b * D * M;
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
    }
}

void vitmix_l1_bwd_SFX(const TYPE *g, const TYPE *x, const TYPE *yt, TYPE *gx, TYPE *part, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = yt + b * D * M;
        TYPE *py = part + item * D * M;
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
    }
}
"""
def _instantiate() -> str:
    parts = [HEADER]
    for typ, sfx, exp, absf in (("float", "f32", "expf", "fabsf"), ("double", "f64", "exp", "fabs")):
        parts.append(BODY.replace("TYPE", typ).replace("SFX", sfx).replace("EXP", exp).replace("ABS", absf))
    return "".join(parts)


SOURCE = _instantiate()
