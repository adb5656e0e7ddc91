/*
 * plugins/executor/common/rank_pool.c — the executors' per-rank worker
 * threads and job hand-off (contract in rank_pool.h): a generation counter
 * and two condition variables; the last worker to finish a job wakes the
 * engine thread.
 */
#include "rank_pool.h"


static void *rank_pool_worker(void *arg) {
    rank_pool_slot *sl = arg;
    rank_pool *p = sl->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen) pthread_cond_wait(&p->cv_job, &p->mu);
        seen = p->gen;
        const void *job = p->job;
        const int32_t only = p->only;
        const bool quit = p->quit;
        pthread_mutex_unlock(&p->mu);

        sl->st = LOOM_OK;
        if (!quit && (only < 0 || only == sl->rank)) sl->st = p->run(p->ctx, sl->rank, job, &sl->err);
        pthread_mutex_lock(&p->mu);
        if (sl->st != LOOM_OK && p->failed < 0) {
            /* the first failure is the cause; peers then fail in their
             * collectives and links because of this abort */
            p->failed = sl->rank;
            if (p->abort) p->abort(p->ctx);
        }
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
        if (quit) break;
    }
    return NULL;
}

loom_status rank_pool_init(rank_pool *p, const loom_host *host, const char *who,
                           rank_pool_run_fn run, rank_pool_abort_fn abort, void *ctx,
                           loom_error *err) {
    *p = (rank_pool){.host = host, .who = who, .run = run, .abort = abort, .ctx = ctx,
                     .failed = -1, .only = -1};
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_mutex;
    if (pthread_cond_init(&p->cv_job, NULL) != 0) goto fail_cv_job;
    if (pthread_cond_init(&p->cv_done, NULL) != 0) goto fail_cv_done;
    p->sync_ready = true;
    return LOOM_OK;
fail_cv_done:
    pthread_cond_destroy(&p->cv_job);
fail_cv_job:
    pthread_mutex_destroy(&p->mu);
fail_mutex:
    return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                       "%s: could not initialise a mutex / condition variable", who);
}

/* Tell the first `n` workers to leave their loop and join them. */
static void rank_pool_quit(rank_pool *p, int32_t n) {
    pthread_mutex_lock(&p->mu);
    p->job = NULL;
    p->only = -1;
    p->quit = true;
    p->pending = n;
    p->failed = -1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_job);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    for (int32_t k = 0; k < n; k++) pthread_join(p->slots[k].thread, NULL);
}

loom_status rank_pool_start(rank_pool *p, int32_t size, loom_error *err) {
    const loom_host *h = p->host;
    rank_pool_slot *slots = h->calloc(h->ctx, (size_t)size, sizeof *slots);
    if (!slots) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", p->who);
    p->slots = slots;
    for (int32_t i = 0; i < size; i++) {
        slots[i] = (rank_pool_slot){.pool = p, .rank = i};
        if (pthread_create(&slots[i].thread, NULL, rank_pool_worker, &slots[i]) == 0) continue;
        /* stop the ones already running: they wait for a job */
        rank_pool_quit(p, i);
        p->slots = NULL;
        h->free(h->ctx, slots);
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: could not start the thread of rank %d",
                        p->who, i);
    }
    p->size = size;
    return LOOM_OK;
}

void rank_pool_fini(rank_pool *p) {
    if (!p->sync_ready) return;
    if (p->size > 0) rank_pool_quit(p, p->size);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_job);
    pthread_mutex_destroy(&p->mu);
    if (p->slots) p->host->free(p->host->ctx, p->slots);
    p->slots = NULL;
    p->size = 0;
    p->sync_ready = false;
}

int32_t rank_pool_run(rank_pool *p, const void *job, int32_t only) {
    pthread_mutex_lock(&p->mu);
    p->job = job;
    p->only = only;
    p->quit = false;
    p->pending = p->size;
    p->failed = -1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_job);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    const int32_t failed = p->failed;
    pthread_mutex_unlock(&p->mu);
    return failed;
}

loom_status rank_pool_status(const rank_pool *p, int32_t rank) { return p->slots[rank].st; }

const loom_error *rank_pool_error(const rank_pool *p, int32_t rank) { return &p->slots[rank].err; }
