/* Exported functions of the Newton-Schulz library (newton.c; bound by vitmix.ops.newton.c, whose
 * signature table a test checks against these prototypes). Also part of the Nystrom library (nystrom.c). */
#ifndef VITMIX_NEWTON_H
#define VITMIX_NEWTON_H

#include <stdint.h>

/* start rules of vitmix_ns_solve (vitmix.ops.newton.c._RULES) */
enum { START_DETECT = 0, START_SYMMETRIC = 1, START_TRANSPOSE = 2, START_OFFICIAL = 3 };

void vitmix_ns_f32(const float *P, float *V, int64_t B, int64_t m, int64_t iters, int nthreads);
void vitmix_ns_f64(const double *P, double *V, int64_t B, int64_t m, int64_t iters, int nthreads);
void vitmix_ns_solve_f32(const float *A, float *V, int64_t B, int64_t m, float eps, int64_t iters, int rule,
                         int nthreads);
void vitmix_ns_solve_f64(const double *A, double *V, int64_t B, int64_t m, double eps, int64_t iters, int rule,
                         int nthreads);

#endif /* VITMIX_NEWTON_H */
