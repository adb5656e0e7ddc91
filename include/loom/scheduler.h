/*
 * loom/scheduler.h — schedulers: which sequences run in the next step and
 * how many tokens each (Orca's iteration-level scheduling).
 *
 * The scheduler owns its queues of sequence ids and nothing else. Each step
 * the core calls schedule() with an environment through which the scheduler
 * reads sequences and asks the cache manager for slots (loom/cache.h); when
 * the cache answers NO_SPACE the scheduler may preempt a victim and retry.
 *
 * The contract, in full:
 *
 * Sequences. The core owns them: tokens, num_computed, num_draft. A
 * scheduler reads them only through env->get_seq, valid for the call.
 * After the forward pass the core sets num_computed = entry.num_computed +
 * entry.num_tokens for every scheduled entry. A sequence arrives by add()
 * and leaves by remove() (finished or aborted; the core frees its cache
 * blocks itself, after remove()).
 *
 * Forks. A request with n > 1 samples runs its prompt as one sequence; when
 * the prompt's last token has logits, the core forks samples 1..n-1 in the
 * cache (cache->fork: they share the parent's blocks) and add()s each with
 * num_computed equal to the parent's, so they arrive already holding device
 * blocks. A scheduler must not acquire_prefix for a sequence that arrives
 * with num_computed > 0, and must be able to free such a waiting sequence's
 * blocks (cache->free, reported as a RECOMPUTE preemption) if they are what
 * another sequence needs.
 *
 * Allocation. Before an entry {seq, num_computed, num_tokens} is emitted
 * the scheduler must have had cache->allocate(seq, num_computed +
 * num_tokens) succeed; the core checks that the block table covers the
 * entry and fails the step (LOOM_ERR_INTERNAL) if not. A sequence's first
 * admission (and its first after a RECOMPUTE preemption) may start with
 * cache->acquire_prefix, whose return value is the num_computed to use.
 * When the allocate() that follows answers NO_SPACE, the prefix references
 * are still held by that sequence: the scheduler either keeps them (retries
 * later holding them) or gives them back with cache->free.
 *
 * Preemption. The scheduler preempts; it also releases the victim's blocks
 * itself, through env->cache, before reporting it:
 *   RECOMPUTE  cache->free(victim): every block reference goes (full
 *              blocks stay in the prefix cache); after schedule() returns
 *              the core sets the victim's num_computed to 0 and drops its
 *              drafts. Re-admitting it starts over (acquire_prefix again).
 *   SWAP       cache->swap_out(victim) returned LOOM_OK: its blocks now
 *              live in the host pool; num_computed is kept. Re-admission is
 *              cache->swap_in, then allocate. swap_out and swap_in are
 *              OPTIONAL in loom/cache.h (NULL: the manager never swaps):
 *              check env->cache->swap_out before calling it; when it is
 *              NULL, or answers NO_SPACE or UNSUPPORTED, preempt by
 *              RECOMPUTE instead.
 * A victim must not also appear in this step's scheduled entries: a
 * scheduler that preempts a sequence it already scheduled this step first
 * takes that entry back (the core refuses an output that lists a sequence
 * in both, LOOM_ERR_INTERNAL). A sequence preempted in a step is not
 * re-admitted in the same step (its num_computed is reset only after the
 * call returns).
 *
 * Progress. A step that schedules nothing but preempts is allowed: the core
 * steps again. Scheduling and preempting nothing while sequences wait means
 * none can ever run (the cache cannot hold even one): the core then ends
 * the oldest waiting request with an error naming the cache's size.
 *
 * Outputs. The core zeroes num_scheduled and num_preempted and provides the
 * arrays; the scheduler appends, never beyond `capacity` (capacity >= the
 * number of live sequences). stats(): the core sets out->struct_size and
 * zeroes the rest; the scheduler fills the fields that struct_size covers.
 *
 * Every function is [engine].
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

/* What schedule() may use. Valid for the call only. Grows only at its end. */
typedef struct loom_sched_env {
    uint32_t struct_size;
    void *ctx;
    /* Current view of a live sequence; NULL for an unknown or finished id. */
    const loom_seq_info *(*get_seq)(void *ctx, loom_seq_id id);
    /* The cache manager instance (see loom/cache.h for each call). */
    const loom_cache_ops *cache;
    void *cache_self;
    double now;                /* core's monotonic clock, seconds           */
} loom_sched_env;

/* Run tokens [num_computed, num_computed + num_tokens) of seq this step.
 * An array element: frozen for the major version. */
typedef struct loom_sched_entry {
    loom_seq_id seq;
    int32_t num_computed;      /* tokens already in cache (prefix hits included) */
    int32_t num_tokens;        /* > 0                                       */
} loom_sched_entry;

typedef enum loom_preempt_mode {
    LOOM_PREEMPT_RECOMPUTE = 0, /* blocks freed; prompt+output recomputed later */
    LOOM_PREEMPT_SWAP = 1,      /* blocks moved to host; swapped back later  */
} loom_preempt_mode;

/* Filled by schedule(); arrays are core-owned with `capacity` entries.
 * Grows only at its end. */
typedef struct loom_sched_output {
    uint32_t struct_size;
    int32_t capacity;
    int32_t num_scheduled;
    loom_sched_entry *scheduled;       /* (capacity)                         */
    int32_t num_preempted;
    loom_seq_id *preempted;            /* (capacity)                         */
    loom_preempt_mode *preempt_mode;   /* (capacity), one per preempted      */
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
    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    loom_destroy_fn *destroy;     /* REQUIRED                                 */
    /* REQUIRED. A new sequence joins the waiting queue (`seq` borrowed for
     * the call; keep its id). A refusal (e.g. a queue limit) ends that
     * request alone with the error. */
    loom_status (*add)(void *self, const loom_seq_info *seq, loom_error *err);
    /* REQUIRED. The sequence finished or was aborted: drop it from every
     * queue. Unknown ids are ignored. */
    void (*remove)(void *self, loom_seq_id seq);
    /* REQUIRED. Decide the next step (see the contract above). A failure
     * fails the engine's step. */
    loom_status (*schedule)(void *self, const loom_sched_env *env, loom_sched_output *out,
                            loom_error *err);
    /* OPTIONAL (NULL = the engine reports zeros). */
    void (*stats)(void *self, loom_sched_stats *out);
    /* since ABI 2.0 — add new members below this line only */
} loom_scheduler_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SCHEDULER_H */
