/*
 * plugins/executor/common/rank_pool.h — what the executor plugins share:
 * one persistent worker thread per rank and the hand-off of a job to all of
 * them. The engine thread posts a job and waits until every rank has run
 * it; the first rank to fail is recorded and the executor's abort hook is
 * called at once, so peers blocked in collectives or links return instead
 * of waiting forever. What a job is, how a rank runs it and how a failure is
 * worded stay the executor's.
 *
 * Not an ABI: a static library compiled into each executor .so (tp, pp);
 * public headers and pthreads only, never libloom. Not a general thread
 * pool: one job at a time, every rank sees every job.
 *
 * Threads: rank_pool_init, _start, _run and _fini are [engine] (one thread,
 * never concurrently on one pool). The run hook is called on rank r's own
 * thread; hooks of different ranks run concurrently. The abort hook is
 * called on a rank's thread with the pool's lock held: it must not call
 * back into the pool, and it must be [any] in the executor's sense.
 *
 * Ownership: the pool owns its threads and per-rank slots; `ctx` and the
 * job passed to rank_pool_run are borrowed (the job only until that call
 * returns, which is after every rank is done with it).
 */
#ifndef LOOM_EXECUTOR_RANK_POOL_H
#define LOOM_EXECUTOR_RANK_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"

/* [rank r's thread] Run `job` for rank r; fill `err` (the rank's own,
 * cleared by nobody: only read after a failure) and return its status. */
typedef loom_status (*rank_pool_run_fn)(void *ctx, int32_t rank, const void *job, loom_error *err);
/* [a rank's thread, pool lock held] The first failure of a job: wake every
 * peer that may be waiting on the failed rank. May be NULL. */
typedef void (*rank_pool_abort_fn)(void *ctx);

/* One rank's thread and the result of its last job. */
typedef struct rank_pool_slot {
    struct rank_pool *pool;
    int32_t rank;                      /* 0..size-1                           */
    pthread_t thread;
    loom_status st;                    /* the current job's result            */
    loom_error err;                    /* filled by the run hook on failure   */
} rank_pool_slot;

/* Embedded in the executor's state; fields are rank_pool.c's. */
typedef struct rank_pool {
    const loom_host *host;             /* allocation and error formatting     */
    const char *who;                   /* message prefix, e.g. "executor tp"  */
    rank_pool_run_fn run;
    rank_pool_abort_fn abort;
    void *ctx;                         /* handed to both hooks (borrowed)     */
    int32_t size;                      /* ranks started, 0 before _start      */
    rank_pool_slot *slots;             /* (size) after _start                 */

    /* job hand-off: the engine thread posts, workers run, the last wakes it */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    bool sync_ready;                   /* mu and both conditions initialised  */
    uint64_t gen;                      /* jobs posted                         */
    int32_t pending;                   /* workers not done with the job       */
    int32_t failed;                    /* first rank that failed, -1 = none   */
    int32_t only;                      /* the job's one rank, -1 = all ranks  */
    bool quit;                         /* the job is "leave the loop"         */
    const void *job;                   /* borrowed for one rank_pool_run      */
} rank_pool;

/* ---------------------------------------------------------------- lifetime */

/* [engine] Initialise `p` (its lock and conditions; no thread yet). On
 * failure nothing is left to undo and err says "<who>: could not
 * initialise a mutex / condition variable". `who` must outlive the pool. */
loom_status rank_pool_init(rank_pool *p, const loom_host *host, const char *who,
                           rank_pool_run_fn run, rank_pool_abort_fn abort, void *ctx,
                           loom_error *err);
/* [engine] Start `size` >= 1 workers, all or none: when one cannot start,
 * those already running are stopped and joined, and err names the rank.
 * At most once per pool. */
loom_status rank_pool_start(rank_pool *p, int32_t size, loom_error *err);
/* [engine] Stop and join the workers (if started), then release the lock,
 * conditions and slots. Safe on a zeroed pool and after a failed _init. */
void        rank_pool_fini(rank_pool *p);

/* -------------------------------------------------------------------- jobs */

/* [engine] Post `job` to every started rank (only rank `only` runs it when
 * only >= 0; the others report LOOM_OK), wait until all are done, and
 * return the first rank that failed, or -1 when none did. Only after
 * rank_pool_start succeeded. */
int32_t     rank_pool_run(rank_pool *p, const void *job, int32_t only);
/* [engine] The failed rank's status and error from the last rank_pool_run
 * (valid until the next one). */
loom_status rank_pool_status(const rank_pool *p, int32_t rank);
const loom_error *rank_pool_error(const rank_pool *p, int32_t rank);

#endif
