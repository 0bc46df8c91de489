"""C source of the CPU L1-distance kernels behind the Laplacian kernel (private).

Compiled on first use by :mod:`vitmix.ops._cbuild` (about a second, then cached) and called by
:mod:`vitmix.ops._l1`. ``BODY`` is written once with ``TYPE``/``SFX``/``EXP``/``ABS`` placeholders and
instantiated for float32 and float64.
"""

HEADER = r"""/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D), y (B, M, D), all contiguous. Work items are (b, block of ROWS rows of x); each keeps its
 * x rows in L1 and streams the M landmark rows (M <= a few hundred, so y stays in L2).
 *   forward:  out[b,i,j] = sum_c |x[b,i,c] - y[b,j,c]|            (times neg_inv_lam and exp'd if asked)
 *   backward: gx[b,i,c] =  sum_j g[b,i,j] sign(x[b,i,c] - y[b,j,c])     (sign(0) = 0, as the official CUDA)
 *             part[item, j, c] = -sum_{i in item} g[b,i,j] sign(...)   (grad of y, summed over items by
 *                                                                      the caller: no two threads write
 *                                                                      the same memory)
 * Plain C99 + OpenMP (sequential without it); no torch headers.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
"""

BODY = r"""
void vitmix_l1_fwd_SFX(const TYPE *x, const TYPE *y, TYPE *out, int64_t B, int64_t N, int64_t M, int64_t D,
                       int64_t rows, double neg_inv_lam, int apply_exp, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
    const TYPE scale = (TYPE)neg_inv_lam;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = y + b * M * D;
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = x + (b * N + i) * D;
            TYPE *o = out + (b * N + i) * M;
            for (int64_t j = 0; j < M; ++j) {
                const TYPE *yj = yb + j * D;
                TYPE acc = 0;
                for (int64_t c = 0; c < D; ++c) acc += ABS(xi[c] - yj[c]);
                o[j] = apply_exp ? EXP(acc * scale) : acc;
            }
        }
    }
}

void vitmix_l1_bwd_SFX(const TYPE *g, const TYPE *x, const TYPE *y, TYPE *gx, TYPE *part, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads) {
    const int64_t nblk = (N + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        const TYPE *yb = y + b * M * D;
        TYPE *py = part + item * M * D;
        memset(py, 0, sizeof(TYPE) * (size_t)(M * D));
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = x + (b * N + i) * D;
            const TYPE *gi = g + (b * N + i) * M;
            TYPE *gxi = gx + (b * N + i) * D;
            memset(gxi, 0, sizeof(TYPE) * (size_t)D);
            for (int64_t j = 0; j < M; ++j) {
                const TYPE w = gi[j];
                if (w == 0) continue;
                const TYPE *yj = yb + j * D;
                TYPE *pj = py + j * D;
                for (int64_t c = 0; c < D; ++c) {
                    const TYPE s = w * (TYPE)((xi[c] > yj[c]) - (xi[c] < yj[c]));
                    gxi[c] += s;
                    pj[c] -= s;
                }
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
