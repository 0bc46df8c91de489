/* parallel_for(fn, ctx, n_items, nthreads, scratch_bytes): fn(ctx, item, scratch) for every item in
 * [0, n_items) on up to nthreads threads, each thread with its own malloc'd scratch of scratch_bytes (NULL
 * for 0): OpenMP where the build has it, else plain pthreads. Items are taken one at a time (dynamic
 * schedule), as their costs differ; ctx holds the call's arguments. Every library runs its work items so. */
#ifndef VITMIX_PARALLEL_H
#define VITMIX_PARALLEL_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*work_fn)(void *ctx, int64_t item, void *scratch);

/* adds one to a call's count of failed items (out of memory), which items on several threads may share */
static inline void count_failure(int64_t *failed) {
    __atomic_fetch_add(failed, 1, __ATOMIC_RELAXED);
}

#ifdef _OPENMP
#include <omp.h>
/* OpenMP build: runs on PyTorch's own OpenMP thread pool (same libgomp, shared by soname), so the
 * kernel neither starts threads nor competes with PyTorch's waiting workers for the cores. */
static void parallel_for(work_fn fn, void *ctx, int64_t n_items, int nthreads, size_t scratch_bytes) {
    if (nthreads > n_items) nthreads = (int)n_items;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads)
    {
        void *scratch = scratch_bytes ? malloc(scratch_bytes) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n_items; ++i) fn(ctx, i, scratch);
        free(scratch);
    }
}
#else /* plain pthreads */
typedef struct {
    work_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t next;
    size_t scratch_bytes;
} pool_t;

static void *worker(void *arg) {
    pool_t *pool = (pool_t *)arg;
    void *scratch = pool->scratch_bytes ? malloc(pool->scratch_bytes) : NULL;
    for (;;) {
        int64_t item = __atomic_fetch_add(&pool->next, 1, __ATOMIC_RELAXED);
        if (item >= pool->n_items) break;
        pool->fn(pool->ctx, item, scratch);
    }
    free(scratch);
    return NULL;
}

static void parallel_for(work_fn fn, void *ctx, int64_t n_items, int nthreads, size_t scratch_bytes) {
    pool_t pool = {fn, ctx, n_items, 0, scratch_bytes};
    if (nthreads > n_items) nthreads = (int)n_items;
    if (nthreads <= 1) {
        worker(&pool);
        return;
    }
    pthread_t *threads = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)(nthreads - 1));
    int started = 0;
    for (int t = 0; t < nthreads - 1; ++t) {
        if (pthread_create(&threads[t], NULL, worker, &pool) != 0) break;
        ++started;
    }
    worker(&pool);
    for (int t = 0; t < started; ++t) pthread_join(threads[t], NULL);
    free(threads);
}
#endif

#endif /* VITMIX_PARALLEL_H */
