/* Exported functions of the Laplacian kernel's L1 distance library (l1_kernel.c; bound by
 * vitmix.ops.kernel.c, whose signature table a test checks against these prototypes). */
#ifndef VITMIX_L1_KERNEL_H
#define VITMIX_L1_KERNEL_H

#include <stdint.h>

void vitmix_l1_fwd_f32(const float *x, const int64_t *xs, const float *y, float *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads);
void vitmix_l1_fwd_f64(const double *x, const int64_t *xs, const double *y, double *out, int64_t B, int64_t N,
                       int64_t M, int64_t D, int64_t rows, int nthreads);
void vitmix_l1_bwd_f32(const float *g, const float *x, const int64_t *xs, const float *y, float *gx, float *part,
                       int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads);
void vitmix_l1_bwd_f64(const double *g, const double *x, const int64_t *xs, const double *y, double *gx,
                       double *part, int64_t B, int64_t N, int64_t M, int64_t D, int64_t rows, int nthreads);

#endif /* VITMIX_L1_KERNEL_H */
