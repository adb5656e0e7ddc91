/*
 * loom/scheduler.h — schedulers: which sequences run in the next step and
 * how many tokens each (Orca's iteration-level scheduling).
 *
 * The scheduler owns its queues and nothing else. Each step the core calls
 * schedule() with an environment through which the scheduler reads
 * sequences and asks the cache manager for slots; when the cache answers
 * NO_SPACE the scheduler preempts (frees or swaps out a victim through the
 * same environment) and reports it. The core owns sequence state: after the
 * forward pass it sets num_computed = entry.num_computed + entry.num_tokens,
 * and resets it to 0 for sequences preempted with RECOMPUTE.
 *
 * All functions are [engine].
 */
#ifndef LOOM_SCHEDULER_H
#define LOOM_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/cache.h"
#include "loom/plugin.h"
#include "loom/seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What schedule() may use. Valid for the call only. */
typedef struct loom_sched_env {
    uint32_t struct_size;
    void *ctx;
    /* Current view of a live sequence; NULL when unknown. */
    const loom_seq_info *(*get_seq)(void *ctx, loom_seq_id id);
    /* The cache manager instance (see loom/cache.h for each call). */
    const loom_cache_ops *cache;
    void *cache_self;
    double now;                /* core's monotonic clock, seconds           */
} loom_sched_env;

/* Run tokens [num_computed, num_computed + num_tokens) of seq this step. */
typedef struct loom_sched_entry {
    loom_seq_id seq;
    int32_t num_computed;      /* tokens already in cache (prefix hits included) */
    int32_t num_tokens;        /* > 0                                       */
} loom_sched_entry;

typedef enum loom_preempt_mode {
    LOOM_PREEMPT_RECOMPUTE = 0, /* blocks freed; prompt+output recomputed later */
    LOOM_PREEMPT_SWAP = 1,      /* blocks moved to host; swapped back later  */
} loom_preempt_mode;

/* Filled by schedule(); arrays are core-owned with `capacity` entries
 * (capacity >= number of live sequences). Grows only at its end. */
typedef struct loom_sched_output {
    uint32_t struct_size;
    int32_t capacity;
    int32_t num_scheduled;
    loom_sched_entry *scheduled;
    int32_t num_preempted;
    loom_seq_id *preempted;
    loom_preempt_mode *preempt_mode;
} loom_sched_output;

/* Grows only at its end. */
typedef struct loom_sched_stats {
    uint32_t struct_size;
    int32_t num_waiting;
    int32_t num_running;
    int32_t num_swapped;
    int64_t num_preemptions;
} loom_sched_stats;

typedef struct loom_scheduler_ops {
    uint32_t struct_size;
    loom_status (*create)(const loom_host *host, const void *config, void **self, loom_error *err);
    void (*destroy)(void *self);
    /* A new sequence joins the waiting queue. */
    loom_status (*add)(void *self, const loom_seq_info *seq, loom_error *err);
    /* The sequence finished or was aborted: drop it from every queue. The
     * core frees its cache blocks itself. Unknown ids are ignored. */
    void (*remove)(void *self, loom_seq_id seq);
    /* Decide the next step. A step that schedules nothing but preempts
     * (to free blocks) is allowed: the core simply steps again. Scheduling
     * and preempting nothing while work waits means no sequence can make
     * progress; the core then fails one with a message. */
    loom_status (*schedule)(void *self, const loom_sched_env *env, loom_sched_output *out,
                            loom_error *err);
    void (*stats)(void *self, loom_sched_stats *out);
    /* since ABI 1.1 — add new members below this line only */
} loom_scheduler_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SCHEDULER_H */
