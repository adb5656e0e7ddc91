/*
 * kernels/cpu/pool.c — a minimal fork-join pthread pool for the CPU kernels:
 * one parallel-for at a time, items handed out in chunks from an atomic
 * claim word so uneven items (attention rows of different lengths) balance.
 *
 * Nobody waits for a thread that has not started: the caller works through
 * the chunks itself and returns once every item is done, counting items,
 * not workers. A worker whose core is busy with other work and that wakes
 * late finds the job finished (or a newer one) and takes nothing, so a
 * loaded machine slows the pool to the threads that do run instead of
 * stalling each parallel-for on a descheduled thread (the collapse of a
 * pool that joins its workers). The claim word holds the job's generation
 * beside the next item, so a late worker can never claim items of a job
 * whose fields it did not read.
 *
 * Workers and the caller spin only briefly before sleeping on a condition
 * variable: the same cores also run OpenBLAS's threads between our parallel
 * regions, and a worker that spins through a GEMV would steal its core.
 */
#include "cpu_kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
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
/* Low half of the claim word between jobs: past any job's last item. */
#define POOL_CLOSED UINT32_MAX

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
    pthread_cond_t cv_done;        /* done reached n_items                    */
    /* the current job: written by the caller while the claim word is closed */
    loom_cpu_task_fn fn;
    void *ctx;
    atomic_llong n_items;          /* atomics: a late worker may read them as */
    atomic_llong chunk;            /* they change (and then claims nothing)   */
    uint32_t jobs;                 /* caller only: generation of the last job */
    atomic_uint_least64_t claim;   /* generation << 32 | next unclaimed item  */
    atomic_llong done;             /* items of the current job finished       */
    atomic_uint gen;               /* generation workers wait for             */
    atomic_int sleepers;           /* workers waiting on cv_work              */
    atomic_bool caller_asleep;     /* the caller waits on cv_done             */
    atomic_bool stop;
};

/* Claim and run chunks of job `g` until it has none left (or is not the
 * current job any more). */
static void pool_run_chunks(loom_cpu_pool *p, uint32_t g, int worker) {
    for (;;) {
        uint64_t c = atomic_load(&p->claim);
        const uint32_t next = (uint32_t)c;
        if ((uint32_t)(c >> 32) != g) return;
        /* job g is open while its claim word says so: its fields hold */
        const int64_t n = atomic_load_explicit(&p->n_items, memory_order_relaxed);
        const int64_t chunk = atomic_load_explicit(&p->chunk, memory_order_relaxed);
        if (next >= n) return;
        const int64_t e = next + chunk < n ? next + chunk : n;
        if (!atomic_compare_exchange_weak(&p->claim, &c, (uint64_t)g << 32 | (uint64_t)e)) continue;
        p->fn(p->ctx, next, e, worker);
        if (atomic_fetch_add(&p->done, e - next) + (e - next) == n && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *pool_main(void *arg) {
    pool_worker *w = arg;
    loom_cpu_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && atomic_load(&p->gen) == seen; i++) CPU_RELAX();
        if (atomic_load(&p->gen) == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load(&p->gen);
        if (atomic_load(&p->stop)) break;
        pool_run_chunks(p, seen, w->index);
    }
    return NULL;
}

/* Wake every worker for a new generation (stop, or a job). */
static void pool_publish(loom_cpu_pool *p, uint32_t g) {
    atomic_store(&p->gen, g);
    /* seq_cst: a worker that counted itself a sleeper before this load
     * waits under the mutex and gets the broadcast; one that did not yet
     * will see the new generation before it waits */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
}

loom_cpu_pool *loom_cpu_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    loom_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    atomic_init(&p->claim, POOL_CLOSED);
    atomic_init(&p->done, 0);
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_asleep, false);
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
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->gen, ++p->jobs);
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
        atomic_store(&p->stop, true);
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->gen, ++p->jobs);
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
    /* inline: no pool, no workers, one chunk, or more items than the claim
     * word counts */
    if (!p || p->n == 1 || n <= grain || n >= (int64_t)POOL_CLOSED) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* ~4 chunks per thread: enough to balance uneven items, few enough that
     * the shared counter is not contended. */
    int64_t chunk = (n + 4 * p->n - 1) / (4 * p->n);
    if (chunk < grain) chunk = grain;
    const uint32_t g = ++p->jobs;
    /* close the previous job before its fields change (a late worker may
     * still hold its claim word) */
    atomic_store(&p->claim, (uint64_t)(g - 1) << 32 | POOL_CLOSED);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_items, n, memory_order_relaxed);
    atomic_store_explicit(&p->chunk, chunk, memory_order_relaxed);
    atomic_store(&p->done, 0);
    atomic_store(&p->claim, (uint64_t)g << 32);
    pool_publish(p, g);

    pool_run_chunks(p, g, 0);

    for (int i = 0; i < POOL_SPIN && atomic_load(&p->done) != n; i++) CPU_RELAX();
    if (atomic_load(&p->done) != n) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, true);
        while (atomic_load(&p->done) != n) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->caller_asleep, false);
        pthread_mutex_unlock(&p->mu);
    }
}
