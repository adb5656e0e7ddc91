/*
 * kernels/cpu/pool.c — a minimal fork-join pthread pool for the CPU kernels:
 * one parallel-for at a time, items handed out in chunks from an atomic
 * counter so uneven items (attention rows of different lengths) balance.
 *
 * Workers spin only briefly before sleeping on a condition variable: the
 * same cores also run OpenBLAS's threads between our parallel regions, and a
 * worker that spins through a GEMV would steal the core that GEMV needs.
 */
#include "cpu_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin iterations before a worker or the caller sleeps (~10 µs): about a
 * futex wake-up, short enough not to eat into the next GEMM. */
#define POOL_SPIN 1000

typedef struct pool_worker {
    struct loom_cpu_pool *pool;
    int index;                     /* 1..n-1                                   */
} pool_worker;

struct loom_cpu_pool {
    int n;                         /* threads counting the caller             */
    pthread_t *threads;            /* (n - 1)                                 */
    pool_worker *workers;          /* (n - 1)                                 */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;        /* gen changed                             */
    pthread_cond_t cv_done;        /* pending reached 0                       */
    /* the current job; written by the caller before gen is bumped */
    loom_cpu_task_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t chunk;
    atomic_llong next;             /* next unclaimed item                     */
    atomic_int pending;            /* workers that have not finished the job  */
    atomic_ulong gen;              /* job generation                          */
    atomic_bool stop;
};

static void pool_run_chunks(loom_cpu_pool *p, int worker) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n_items) break;
        int64_t e = b + p->chunk < p->n_items ? b + p->chunk : p->n_items;
        p->fn(p->ctx, b, e, worker);
    }
}

static void *pool_main(void *arg) {
    pool_worker *w = arg;
    loom_cpu_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && atomic_load(&p->gen) == seen; i++) CPU_RELAX();
        if (atomic_load(&p->gen) == seen) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load(&p->gen);
        if (atomic_load(&p->stop)) break;
        pool_run_chunks(p, w->index);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

loom_cpu_pool *loom_cpu_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    loom_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, false);
    if (pthread_mutex_init(&p->mu, NULL)) goto fail_free;
    if (pthread_cond_init(&p->cv_work, NULL)) goto fail_mu;
    if (pthread_cond_init(&p->cv_done, NULL)) goto fail_cv_work;
    if (n_threads == 1) return p;
    p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
    p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) goto fail_arrays;
    int started = 0;
    for (; started < n_threads - 1; started++) {
        p->workers[started] = (pool_worker){.pool = p, .index = started + 1};
        if (pthread_create(&p->threads[started], NULL, pool_main, &p->workers[started])) break;
    }
    if (started == n_threads - 1) return p;
    /* partial start: stop the ones that run */
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
fail_arrays:
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
fail_cv_work:
    pthread_cond_destroy(&p->cv_work);
fail_mu:
    pthread_mutex_destroy(&p->mu);
fail_free:
    free(p);
    return NULL;
}

void loom_cpu_pool_destroy(loom_cpu_pool *p) {
    if (!p) return;
    if (p->n > 1) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    }
    free(p->threads);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int loom_cpu_pool_size(const loom_cpu_pool *p) { return p ? p->n : 1; }

void loom_cpu_pool_for(loom_cpu_pool *p, int64_t n, int64_t grain, loom_cpu_task_fn fn,
                       void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* ~4 chunks per thread: enough to balance uneven items, few enough that
     * the shared counter is not contended. */
    int64_t chunk = (n + 4 * p->n - 1) / (4 * p->n);
    if (chunk < grain) chunk = grain;
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    pool_run_chunks(p, 0);

    for (int i = 0; i < POOL_SPIN && atomic_load(&p->pending) != 0; i++) CPU_RELAX();
    if (atomic_load(&p->pending) != 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) != 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
