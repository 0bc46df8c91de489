/* Exported functions of the sparse multi-diagonal attention library (diagonal.c; bound by
 * vitmix.ops.diagonal.c, whose prototype table a test checks against these prototypes).
 * ptrs: q, k, v, out, dout, dq, dk, dv, lse, a_buf, ds_buf, wpre, dspre, lse_pre; strides: 3 per view. */
#ifndef VITMIX_DIAGONAL_H
#define VITMIX_DIAGONAL_H

#include <stdint.h>

void vitmix_diag_fwd_f32(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr);
void vitmix_diag_fwd_f64(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr);
void vitmix_diag_bwd_f32(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr);
void vitmix_diag_bwd_f64(void **ptrs, const int64_t *strides, const int64_t *shifts, const int64_t *counts,
                         int64_t B, int64_t H, int64_t N, int64_t P, int64_t M, int64_t D, double scale, int nthr);

#endif /* VITMIX_DIAGONAL_H */
