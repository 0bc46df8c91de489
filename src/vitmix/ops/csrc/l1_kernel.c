/* L1 distance between token rows and landmark rows, forward and backward (Laplacian kernel).
 *
 * x (B, N, D) read through strides (XROW), y (B, M, D) and g (B, N, M) contiguous. Work items are
 * (b, block of ROWS rows of x).
 * Forward: each item first copies its landmarks transposed, yt (D, M) in its thread's scratch (like the
 * official CUDA operator's key layout): for a fixed token i and channel c the M landmarks are then one
 * contiguous row, so the innermost loop runs over landmarks and vectorises without horizontal sums.
 * Backward: x, y and the grad-y partials in their (., D) layout, vectorised over channels.
 *   forward:  out[b,i,j] = sum_c |x[b,i,c] - y[b,j,c]|   (the caller applies exp(-out/lam): torch's
 *                                                                  vectorised exp is ~3x faster than expf here)
 *   backward: gx[b,i,c] =  sum_j g[b,i,j] sign(x[b,i,c] - y[b,j,c])    (sign(0) = 0, as the official CUDA)
 *             part[item, j, c] = -sum_{i in item} g[b,i,j] sign(...)  (grad of y, per item, vectorised
 *                                                                    over channels in (M, D) order;
 *                                                                    summed over the items by the caller:
 *                                                                    no two threads write the same memory)
 * Plain C99 + OpenMP (pthreads without it: vitmix_parallel.h); no torch headers.
 */
#include "vitmix_simd.h"
#include "vitmix_parallel.h"
#include "l1_kernel.h"

/* x is read in place through strides xs = {heads H, batch stride, head stride, token stride} (unit
 * channel stride): row i of slice b = (batch b / H, head b % H), e.g. q and k as views of the qkv
 * projection, or broadcast (stride 0) landmarks, without a contiguous copy */
#define XROW(x, xs, b, i) ((x) + ((b) / (xs)[0]) * (xs)[1] + ((b) % (xs)[0]) * (xs)[2] + (i) * (xs)[3])

#include "dtype_f32.h"
#include "distance_typed.h"
#include "l1_kernel_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "distance_typed.h"
#include "l1_kernel_typed.h"
#include "dtype_end.h"
