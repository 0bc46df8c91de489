"""C source of the CPU L1-distance kernels behind the Laplacian kernel (private).

Compiled on first use by :mod:`vitmix.ops._cbuild` (about a second, then cached) and called by
:mod:`vitmix.ops._l1`. ``BODY`` is written once with ``TYPE``/``ITYPE``/``SFX``/``EXP``/``ABS`` placeholders and
instantiated for float32 and float64.
"""

HEADER = r"""/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D) read through strides (XROW), y (B, M, D) and g (B, N, M) contiguous. Work items are
 * (b, block of ROWS rows of x).
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

#define JB 16
/* x is read in place through strides xs = {heads H, batch stride, head stride, token stride} (unit
 * channel stride): row i of slice b = (batch b / H, head b % H), e.g. q and k as views of the qkv
 * projection, or broadcast (stride 0) landmarks, without a contiguous copy */
#define XROW(x, xs, b, i) ((x) + ((b) / (xs)[0]) * (xs)[1] + ((b) % (xs)[0]) * (xs)[2] + (i) * (xs)[3])
"""

BODY = r"""
typedef TYPE VEC_SFX __attribute__((vector_size(JB * sizeof(TYPE))));
typedef ITYPE IVEC_SFX __attribute__((vector_size(JB * sizeof(TYPE))));
#define ABSMASK_SFX ((IVEC_SFX){0} + (ITYPE)(~((UTYPE)1 << (8 * sizeof(TYPE) - 1))))
static void transpose_SFX(const TYPE *y, TYPE *yt, int64_t M, int64_t D) {
    for (int64_t j = 0; j < M; ++j)
        for (int64_t c = 0; c < D; ++c) yt[c * M + j] = y[j * D + c];
}

void vitmix_l1_fwd_SFX(const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, double neg_inv_lam, int apply_exp, int nthreads) {
    /* Landmarks in blocks of JB: the JB partial sums of one token stay in registers over all D
     * channels (one load of yt per channel and block, no load/store of the output in the loop). */
    const int64_t nblk = (N + rows - 1) / rows;
    const int64_t Mp = (M + JB - 1) / JB * JB;
    const TYPE scale = (TYPE)neg_inv_lam;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t item = 0; item < B * nblk; ++item) {
        const int64_t b = item / nblk, i0 = (item % nblk) * rows;
        const int64_t i1 = i0 + rows < N ? i0 + rows : N;
        TYPE *yb = (TYPE *)calloc((size_t)(D * Mp), sizeof(TYPE));     /* (D, Mp), zero padding */
        const TYPE *ysrc = y + b * M * D;
        for (int64_t j = 0; j < M; ++j)
            for (int64_t c = 0; c < D; ++c) yb[c * Mp + j] = ysrc[j * D + c];
        for (int64_t i = i0; i < i1; ++i) {
            const TYPE *xi = XROW(x, xs, b, i);
            TYPE *o = out + (b * N + i) * M;
            for (int64_t j0 = 0; j0 < Mp; j0 += JB) {
                VEC_SFX acc = {0};
                for (int64_t c = 0; c < D; ++c) {
                    VEC_SFX yv;
                    memcpy(&yv, yb + c * Mp + j0, sizeof yv);
                    acc += (VEC_SFX)((IVEC_SFX)(xi[c] - yv) & ABSMASK_SFX);    /* |x - y|: clear the sign bit */
                }
                TYPE sums[JB];
                memcpy(sums, &acc, sizeof sums);
                const int64_t nj = M - j0 < JB ? M - j0 : JB;
                for (int64_t jj = 0; jj < nj; ++jj) o[j0 + jj] = apply_exp ? EXP(sums[jj] * scale) : sums[jj];
            }
        }
        free(yb);
    }
}

void vitmix_l1_bwd_SFX(const TYPE *g, const TYPE *x, const int64_t *xs, const TYPE *y, TYPE *gx, TYPE *part,
                       int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads) {
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
            const TYPE *xi = XROW(x, xs, b, i);
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
    for typ, ityp, sfx, exp, absf in (("float", "int32_t", "f32", "expf", "fabsf"),
                                      ("double", "int64_t", "f64", "exp", "fabs")):
        body = BODY.replace("UTYPE", "u" + ityp).replace("ITYPE", ityp).replace("TYPE", typ)
        parts.append(body.replace("SFX", sfx).replace("EXP", exp).replace("ABS(", absf + "("))
    return "".join(parts)


SOURCE = _instantiate()
