/* The Newton-Schulz loop for one dtype (see newton.c; instantiated by dtype_f32.h / dtype_f64.h; the products
 * are gemm_typed.h's, each sum over k one running sum). */
/* iters steps V <- 2V - V (P V) on p, v (m x m, zero-padded to row stride mp, a multiple of JB; scratch t, u),
 * then the m x m result into out */
static void SFX(ns_iterate)(const TYPE *p, TYPE *v, TYPE *t, TYPE *u, TYPE *out, int64_t m, int64_t mp, int64_t iters) {
    for (int64_t it = 0; it < iters; ++it) {
        SFX(gemm)(p, mp, 1, v, t, m, m, mp, m);         /* T = P V */
        SFX(gemm)(v, mp, 1, t, u, m, m, mp, m);         /* U = V T */
        for (int64_t e = 0; e < m * mp; ++e) v[e] = 2 * v[e] - u[e];
    }
    for (int64_t i = 0; i < m; ++i) memcpy(out + i * m, v + i * mp, sizeof(TYPE) * (size_t)m);
}

/* The start V0 of one padded matrix from its unperturbed copy a (m x m, row stride mp) and P = a + eps I
 * in p, as vitmix.ops.newton.start does it: START_OFFICIAL: alpha = 1.8 / (max row sum of a)^2, V0 = alpha P;
 * otherwise symmetric (forced, or detected: max|a - a^T| <= 1e-5 max|a|) V0 = 1.8 P / ||P||_inf^2, else
 * V0 = P^T / (||P||_1 ||P||_inf). */

static void SFX(ns_start)(const TYPE *a, const TYPE *p, TYPE *v, int64_t m, int64_t mp, int rule) {
    if (rule == START_OFFICIAL) {
        TYPE top = 0;
        for (int64_t i = 0; i < m; ++i) {
            TYPE r = 0;
            for (int64_t j = 0; j < m; ++j) r += a[i * mp + j];
            if (i == 0 || r > top || r != r) top = r;          /* NaN sticks: nothing compares > NaN */
        }
        const TYPE alpha = (TYPE)1.8 / (top * top);
        for (int64_t e = 0; e < m * mp; ++e) v[e] = alpha * p[e];
        return;
    }
    TYPE row = 0, col = 0;
    for (int64_t i = 0; i < m; ++i) {
        TYPE r = 0, c = 0;
        for (int64_t j = 0; j < m; ++j) {
            r += p[i * mp + j] < 0 ? -p[i * mp + j] : p[i * mp + j];
            c += p[j * mp + i] < 0 ? -p[j * mp + i] : p[j * mp + i];
        }
        row = (r > row || r != r) ? r : row;
        col = (c > col || c != c) ? c : col;
    }
    int sym = rule == START_SYMMETRIC;
    if (rule == START_DETECT) {
        TYPE asym = 0, scale = 0;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j) {
                const TYPE d = a[i * mp + j] - a[j * mp + i], x = a[i * mp + j];
                asym = (d > asym || -d > asym) ? (d < 0 ? -d : d) : asym;
                scale = (x > scale || -x > scale) ? (x < 0 ? -x : x) : scale;
            }
        sym = asym <= (TYPE)1e-5 * scale;
    }
    if (sym) {
        const TYPE alpha = (TYPE)1.8 / (row * row);
        for (int64_t e = 0; e < m * mp; ++e) v[e] = alpha * p[e];
    } else {
        const TYPE alpha = (TYPE)1 / (row * col);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j) v[i * mp + j] = alpha * p[j * mp + i];
    }
}

/* Newton-Schulz from one m x m matrix w into out (m x m): P = w + eps I, the start by rule (above), iters
 * steps, in buf (5 mp^2 zeros). NaN in w propagates like the PyTorch path. */
static void SFX(ns_solve_padded)(const TYPE *w, TYPE *out, int64_t m, int64_t mp, TYPE eps, int64_t iters, int rule,
                                 TYPE *buf) {
    TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp, *a = buf + 4 * mp * mp;
    for (int64_t i = 0; i < m; ++i) {
        memcpy(a + i * mp, w + i * m, sizeof(TYPE) * (size_t)m);
        memcpy(p + i * mp, w + i * m, sizeof(TYPE) * (size_t)m);
        p[i * mp + i] += eps;
    }
    SFX(ns_start)(a, p, v, m, mp, rule);
    SFX(ns_iterate)(p, v, t, u, out, m, mp, iters);
}

/* one call's arguments, read by its work items (one matrix each) */
typedef struct {
    const TYPE *A;                      /* vitmix_ns: P */
    TYPE *V;
    int64_t m, mp, iters;
    TYPE eps;
    int rule;
} SFX(ns_args);

static void SFX(ns_solve_item)(void *ctx, int64_t b, void *scratch) {
    const SFX(ns_args) *args = (const SFX(ns_args) *)ctx;
    const int64_t m = args->m, mp = args->mp;
    memset(scratch, 0, sizeof(TYPE) * (size_t)(5 * mp * mp));
    SFX(ns_solve_padded)(args->A + b * m * m, args->V + b * m * m, m, mp, args->eps, args->iters, args->rule,
                         (TYPE *)scratch);
}

/* Newton-Schulz from each matrix of A (B, m, m) into V (ns_solve_padded) */
void SFX(vitmix_ns_solve)(const TYPE *A, TYPE *V, int64_t B, int64_t m, TYPE eps, int64_t iters, int rule,
                         int nthreads) {
    const SFX(ns_args) args = {A, V, m, (m + JB - 1) / JB * JB, iters, eps, rule};
    parallel_for(SFX(ns_solve_item), (void *)&args, B, nthreads, sizeof(TYPE) * (size_t)(5 * args.mp * args.mp));
}

/* iters steps from each V0 of V (B, m, m) with the matrices P (B, m, m) on zero-padded copies (zeros beyond m
 * stay zero through the iteration) */
static void SFX(ns_item)(void *ctx, int64_t b, void *scratch) {
    const SFX(ns_args) *args = (const SFX(ns_args) *)ctx;
    const int64_t m = args->m, mp = args->mp;
    TYPE *p = (TYPE *)scratch, *v = p + mp * mp, *t = p + 2 * mp * mp, *u = p + 3 * mp * mp;
    memset(p, 0, sizeof(TYPE) * (size_t)(4 * mp * mp));
    for (int64_t i = 0; i < m; ++i) {
        memcpy(p + i * mp, args->A + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
        memcpy(v + i * mp, args->V + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
    }
    SFX(ns_iterate)(p, v, t, u, args->V + b * m * m, m, mp, args->iters);
}

void SFX(vitmix_ns)(const TYPE *P, TYPE *V, int64_t B, int64_t m, int64_t iters, int nthreads) {
    const SFX(ns_args) args = {P, V, m, (m + JB - 1) / JB * JB, iters, 0, 0};
    parallel_for(SFX(ns_item), (void *)&args, B, nthreads, sizeof(TYPE) * (size_t)(4 * args.mp * args.mp));
}
