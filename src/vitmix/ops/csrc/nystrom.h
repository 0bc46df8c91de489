/* Exported functions of the Nystrom attention library (nystrom.c; bound by vitmix.ops.nystrom.c, whose
 * prototype table a test checks against these prototypes). The library also holds the Newton-Schulz
 * functions of newton.h. */
#ifndef VITMIX_NYSTROM_H
#define VITMIX_NYSTROM_H

#include <stdint.h>

int64_t vitmix_nystrom_forward_f32(const float *q, const float *k, const float *v, const float *lq, const float *lk,
                                   float *out, int64_t S, int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv,
                                   int kind, float scale, int tied, float eps, int64_t iters, int rule, int norm,
                                   float norm_eps, int nthreads);
int64_t vitmix_nystrom_forward_f64(const double *q, const double *k, const double *v, const double *lq,
                                   const double *lk, double *out, int64_t S, int64_t n, int64_t nk, int64_t m,
                                   int64_t d, int64_t dv, int kind, double scale, int tied, double eps,
                                   int64_t iters, int rule, int norm, double norm_eps, int nthreads);

#endif /* VITMIX_NYSTROM_H */
