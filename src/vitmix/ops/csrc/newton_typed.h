/* The Newton-Schulz loop for one dtype (see newton.c; instantiated by dtype_f32.h / dtype_f64.h). */
#undef JB
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE SFX(NSVEC) __attribute__((vector_size(VEC_BYTES)));

/* c = a b for (m, mp) row-major matrices (row stride mp, a multiple of JB; columns beyond m zero): rows go
 * four at a time, each JB-wide block of their rows of c accumulated in vector registers over k (four
 * independent broadcast-FMA chains that share each load of b hide the FMA latency), then stored once. Blocks
 * of four rows rather than of 4·JB columns: at m = 16 a 4·JB-wide row block computed four times the useful
 * columns (float32, AVX-512). */
static void SFX(matmul)(const TYPE *a, const TYPE *b, TYPE *c, int64_t m, int64_t mp) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const TYPE *a0 = a + i * mp, *a1 = a0 + mp, *a2 = a1 + mp, *a3 = a2 + mp;
        for (int64_t j0 = 0; j0 < mp; j0 += JB) {
            SFX(NSVEC) acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0}, bk;
            for (int64_t k = 0; k < m; ++k) {
                memcpy(&bk, b + k * mp + j0, sizeof bk);
                acc0 += a0[k] * bk;
                acc1 += a1[k] * bk;
                acc2 += a2[k] * bk;
                acc3 += a3[k] * bk;
            }
            TYPE *ci = c + i * mp + j0;
            memcpy(ci, &acc0, sizeof acc0);
            memcpy(ci + mp, &acc1, sizeof acc1);
            memcpy(ci + 2 * mp, &acc2, sizeof acc2);
            memcpy(ci + 3 * mp, &acc3, sizeof acc3);
        }
    }
    for (; i < m; ++i)
        for (int64_t j0 = 0; j0 < mp; j0 += JB) {
            SFX(NSVEC) acc = {0}, bk;
            for (int64_t k = 0; k < m; ++k) {
                memcpy(&bk, b + k * mp + j0, sizeof bk);
                acc += a[i * mp + k] * bk;
            }
            memcpy(c + i * mp + j0, &acc, sizeof acc);
        }
}

/* iters steps V <- 2V - V (P V) on padded p, v (scratch t, u), then the m x m result into out */
static void SFX(ns_iterate)(const TYPE *p, TYPE *v, TYPE *t, TYPE *u, TYPE *out, int64_t m, int64_t mp, int64_t iters) {
    for (int64_t it = 0; it < iters; ++it) {
        SFX(matmul)(p, v, t, m, mp);             /* T = P V */
        SFX(matmul)(v, t, u, m, mp);             /* U = V T */
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

/* Newton-Schulz from A: P = A + eps I, the start by rule (above), iters steps; V (B, m, m) receives the
 * result. NaN in A propagates like the PyTorch path. */
void SFX(vitmix_ns_solve)(const TYPE *A, TYPE *V, int64_t B, int64_t m, TYPE eps, int64_t iters, int rule,
                         int nthreads) {
    const int64_t mp = (m + JB - 1) / JB * JB;
    (void)nthreads;                        /* only the OpenMP pragma reads it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t b = 0; b < B; ++b) {
        TYPE *buf = (TYPE *)calloc((size_t)(5 * mp * mp), sizeof(TYPE));
        TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp, *a = buf + 4 * mp * mp;
        for (int64_t i = 0; i < m; ++i) {
            memcpy(a + i * mp, A + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
            memcpy(p + i * mp, a + i * mp, sizeof(TYPE) * (size_t)m);
            p[i * mp + i] += eps;
        }
        SFX(ns_start)(a, p, v, m, mp, rule);
        SFX(ns_iterate)(p, v, t, u, V + b * m * m, m, mp, iters);
        free(buf);
    }
}

void SFX(vitmix_ns)(const TYPE *P, TYPE *V, int64_t B, int64_t m, int64_t iters, int nthreads) {
    const int64_t mp = (m + JB - 1) / JB * JB;
    (void)nthreads;                        /* only the OpenMP pragma reads it */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t b = 0; b < B; ++b) {
        /* padded copies (zeros beyond m stay zero through the iteration) */
        TYPE *buf = (TYPE *)calloc((size_t)(4 * mp * mp), sizeof(TYPE));
        TYPE *p = buf, *v = buf + mp * mp, *t = buf + 2 * mp * mp, *u = buf + 3 * mp * mp;
        for (int64_t i = 0; i < m; ++i) {
            memcpy(p + i * mp, P + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
            memcpy(v + i * mp, V + (b * m + i) * m, sizeof(TYPE) * (size_t)m);
        }
        SFX(ns_iterate)(p, v, t, u, V + b * m * m, m, mp, iters);
        free(buf);
    }
}
