/* Nystrom attention's forward for one dtype (see nystrom.c). */
/* one call's arguments, read by its work items (one slice each) */
typedef struct {
    const TYPE *q, *k, *v, *lq, *lk;
    TYPE *out;
    int64_t n, nk, m, d, dv, iters, failed;
    TYPE scale, eps, norm_eps;
    int kind, tied, rule, norm;
} SFX(nystrom_args);

static void SFX(nystrom_item)(void *ctx, int64_t s, void *scratch) {
    SFX(nystrom_args) *args = (SFX(nystrom_args) *)ctx;
    const int64_t n = args->n, nk = args->nk, m = args->m, d = args->d, dv = args->dv;
    (void)scratch;
    if (SFX(slice)(args->q + s * n * d, args->k + s * nk * d, args->v + s * nk * dv, args->lq + s * m * d,
                   args->lk + s * m * d, args->out + s * n * dv, n, nk, m, d, dv, args->kind, args->scale, args->tied,
                   args->eps, args->iters, args->rule, args->norm, args->norm_eps, 1, 1, NULL))
        count_failure(&args->failed);
}

/* S slices of contiguous q (S, n, d), k (S, nk, d) (ignored when tied), v (S, nk, dv), lq, lk (S, m, d);
 * out (S, n, dv). Returns the number of slices that ran out of memory (0 on success). */
int64_t SFX(vitmix_nystrom_forward)(const TYPE *q, const TYPE *k, const TYPE *v, const TYPE *lq, const TYPE *lk,
                                   TYPE *out, int64_t S, int64_t n, int64_t nk, int64_t m, int64_t d, int64_t dv,
                                   int kind, TYPE scale, int tied, TYPE eps, int64_t iters, int rule, int norm,
                                   TYPE norm_eps, int nthreads) {
    SFX(nystrom_args) args = {q, k, v, lq, lk, out, n, nk, m, d, dv, iters, 0, scale, eps, norm_eps, kind, tied,
                              rule, norm};
    parallel_for(SFX(nystrom_item), &args, S, nthreads, 0);
    return args.failed;
}
