/* Nystrom attention's forward for one dtype (see nystrom.c). */
/* S slices of contiguous q (S, n, d), k (S, nk, d) (ignored when tied), v (S, nk, dv), lq, lk (S, m, d);
 * out (S, n, dv). Returns the number of slices that ran out of memory (0 on success). */
int64_t SFX(vitmix_nystrom_forward)(const TYPE *q, const TYPE *k, const TYPE *v, const TYPE *lq, const TYPE *lk,
                                   TYPE *out, int64_t S, int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv,
                                   int kind, TYPE scale, int tied, TYPE eps, int64_t iters, int rule, int norm,
                                   TYPE norm_eps, int nthreads) {
    int64_t failed = 0;
    (void)nthreads;                        /* only the OpenMP pragma reads it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) reduction(+:failed)
    for (int64_t s = 0; s < S; ++s)
        failed += SFX(slice)(q + s * n * d, k + s * nk * d, v + s * nk * dv, lq + s * m * d, lk + s * m * d,
                            out + s * n * dv, n, nk, m, d, dv, kind, scale, tied, eps, iters, rule, norm, norm_eps,
                            1, 1, NULL);
    return failed;
}
