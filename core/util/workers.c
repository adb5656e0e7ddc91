/*
 * core/util/workers.c — the fork-join pool of workers.h. A job is (fn,
 * ctx, n) under a generation number; items are claimed under the mutex
 * (the items here are masks of tens of microseconds and more, so a lock
 * per item costs nothing that shows), and the caller returns when the
 * last claimed item is finished.
 */
#include "util/workers.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct loom_workers {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_t *threads;
    int32_t num_threads;
    bool stop;
    uint64_t gen;              /* the current job's number                    */
    void (*fn)(void *ctx, int32_t i);
    void *ctx;
    int32_t n, next, finished;
};

/* Claim and run items of the current job until none is left. Called with
 * w->mu held; returns with it held. */
static void work(loom_workers *w) {
    while (w->next < w->n) {
        const int32_t i = w->next++;
        void (*fn)(void *, int32_t) = w->fn;
        void *ctx = w->ctx;
        pthread_mutex_unlock(&w->mu);
        fn(ctx, i);
        pthread_mutex_lock(&w->mu);
        if (++w->finished == w->n) pthread_cond_signal(&w->done);
    }
}

static void *worker_main(void *arg) {
    loom_workers *w = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && (w->gen == seen || w->next >= w->n)) {
            seen = w->gen;
            pthread_cond_wait(&w->wake, &w->mu);
        }
        if (w->stop) break;
        seen = w->gen;
        work(w);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

loom_workers *loom_workers_new(int32_t threads) {
    loom_workers *w = calloc(1, sizeof *w);
    if (!w || (threads > 0 && !(w->threads = calloc((size_t)threads, sizeof *w->threads)))) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->done, NULL);
    for (; w->num_threads < threads; w->num_threads++)
        if (pthread_create(&w->threads[w->num_threads], NULL, worker_main, w) != 0) {
            loom_workers_free(w);
            return NULL;
        }
    return w;
}

void loom_workers_run(loom_workers *w, int32_t n, void (*fn)(void *ctx, int32_t i), void *ctx) {
    if (n <= 0) return;
    pthread_mutex_lock(&w->mu);
    w->fn = fn, w->ctx = ctx, w->n = n, w->next = 0, w->finished = 0;
    w->gen++;
    if (n > 1) pthread_cond_broadcast(&w->wake);
    work(w);
    while (w->finished < w->n) pthread_cond_wait(&w->done, &w->mu);
    w->n = 0; /* a worker waking late finds nothing to claim */
    pthread_mutex_unlock(&w->mu);
}

void loom_workers_free(loom_workers *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->wake);
    pthread_mutex_unlock(&w->mu);
    for (int32_t i = 0; i < w->num_threads; i++) pthread_join(w->threads[i], NULL);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->mu);
    free(w->threads);
    free(w);
}
