/*
 * conformance/sched_sim.h — a simulation of the engine core that drives a
 * scheduler the way the step loop does (loom/scheduler.h): it owns the
 * sequences (loom_seq_info + tokens), adds them when they arrive, calls
 * schedule(), checks every entry against the contract, applies
 * num_computed, "samples" a token (and verifies speculative drafts) when a
 * sequence catches up, forks the samples of an n > 1 request in the cache
 * once its prompt is computed (they arrive holding the parent's blocks),
 * and finishes sequences at their length with remove() and cache->free —
 * or aborts them.
 *
 * Checked on every step (a failure stops the run with s->why naming the
 * step, the sequence and the rule): schedule() succeeds; outputs stay
 * within `capacity` (guard entries past it stay untouched); entries name
 * live sequences, at most once; tokens > 0 and within the sequence; a
 * non-fresh entry starts at the core's num_computed, a fresh one (first
 * admission, or after a recompute) at a block-aligned prefix the cache
 * reported; the cache holds slots for every entry; at most max_num_seqs
 * entries and max_batched_tokens tokens (when given); preempted sequences
 * are live, not also scheduled, hold no device blocks, and SWAP victims
 * are really swapped out; the reference cache saw no misuse; stats() (when
 * present) counts the live sequences; a step that schedules and preempts
 * nothing while sequences wait is a stall. At the end: every request
 * finished exactly once with exactly its length (or was aborted), the
 * queues are empty and every cache block is free.
 *
 * The scheduler instance is the caller's (created and destroyed outside);
 * the cache is the reference cache (ref_cache.h) unless one is given.
 */
#ifndef LOOM_CONFORMANCE_SCHED_SIM_H
#define LOOM_CONFORMANCE_SCHED_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/scheduler.h"
#include "ref_cache.h"

typedef struct loom_sim_req {
    int32_t prompt;          /* prompt tokens, >= 1                          */
    int32_t total;           /* finished when it has this many tokens        */
    int32_t priority;        /* lower first                                  */
    int64_t arrive;          /* step at which the core adds it (>= 1)        */
    double arrival_offset;   /* arrival_time = arrive + this                 */
    int64_t abort_at;        /* step at which it is aborted; 0 = never       */
    int32_t drafts;          /* drafts proposed per decode; 0 = none         */
    int32_t shared_prefix;   /* leading prompt tokens equal across requests  */
    int32_t n;               /* samples (forked after the prompt); 0 = 1     */
} loom_sim_req;

enum { LOOM_SIM_PENDING = 0, LOOM_SIM_LIVE = 1, LOOM_SIM_DONE = 2, LOOM_SIM_ABORTED = 3 };

typedef struct loom_sim_seq {
    loom_seq_info info;      /* the view get_seq returns                     */
    int32_t *tokens;         /* (cap)                                        */
    int32_t cap;
    loom_sim_req req;
    int32_t parent;          /* index of sample 0 for forked samples; else -1 */
    int32_t children;        /* sample 0: samples 1..n-1 follow it at this index; 0 none */
    bool forked;             /* sample 0: its samples were forked           */
    int state;               /* LOOM_SIM_*                                   */
    bool fresh;              /* next entry may start at a cached prefix      */
    int32_t final_len;       /* tokens when finished                         */
    int32_t finishes;        /* times finished (must end at 1)               */
    int64_t first_step;      /* step of its first entry; 0 none              */
    int32_t first_rank;      /* 1 = first sequence ever scheduled            */
    int64_t done_step;
    int32_t preempts;
    int64_t seen_step;       /* duplicate detection                          */
} loom_sim_seq;

typedef struct loom_sched_sim_opts {
    const loom_scheduler_ops *ops;  /* the scheduler under test ...          */
    void *sched;                    /* ... and its instance (caller-owned)   */
    int32_t max_num_seqs;           /* entries per step; 0 = not checked     */
    int32_t max_batched_tokens;     /* tokens per step; 0 = not checked      */
    /* The reference cache's shape (when cache_ops is NULL). */
    int32_t block_size, num_blocks, num_cpu_blocks;
    int32_t prefix_tokens;          /* reference cache prefix hits (0 none)  */
    bool no_swap;                   /* reference swap_out answers UNSUPPORTED */
    /* Another cache instead (created by the caller, destroyed after). */
    const loom_cache_ops *cache_ops;
    void *cache_self;
    uint64_t seed;                  /* draft acceptance                      */
} loom_sched_sim_opts;

typedef struct loom_sched_sim {
    const loom_scheduler_ops *ops;
    void *sched;
    loom_ref_cache *fc;      /* NULL when another cache is plugged in        */
    const loom_cache_ops *cops;
    void *cself;
    int32_t block_size, num_blocks;
    int32_t max_num_seqs, max_batched_tokens;
    loom_sim_seq *seqs;      /* (n): id == index; requests' first samples first */
    int32_t n;               /* sequences (requests plus forked samples)     */
    int32_t nreq;            /* requests: seqs[0..nreq) are their first samples */
    int64_t step;
    int32_t live;
    int32_t ranks;
    uint64_t rng;
    loom_sched_output out;   /* the last step's output                       */
    int64_t preempt_recompute, preempt_swap;
    int64_t empty_steps;     /* steps with live sequences and no entry       */
    int64_t max_step_tokens, max_step_seqs;
    int32_t max_swapped_seen;
    int64_t block_ops;       /* copies/swaps drained from the cache          */
    int64_t forks;           /* samples forked                               */
    bool failed;
    char why[1024];          /* the first broken rule                        */
    void *user;              /* the caller's (tests keep their plugin here)  */
    char *where;             /* when set (256 bytes): "step N", updated each step */
} loom_sched_sim;

/* NULL and why on a bad request or out of memory. */
loom_sched_sim *loom_sched_sim_new(const loom_sched_sim_opts *o, const loom_sim_req *reqs, int32_t n, char *why,
                                   size_t cap);
void loom_sched_sim_free(loom_sched_sim *s);
/* One step; false (s->why) when a rule broke. *entries (may be NULL) gets
 * the number of entries. */
bool loom_sched_sim_step(loom_sched_sim *s, int32_t *entries);
/* Step until every request is done or aborted (within max_steps), then
 * check the end state. false with s->why on any broken rule. */
bool loom_sched_sim_run(loom_sched_sim *s, int64_t max_steps);
/* Entry of seq `id` in the last step's output, or NULL. */
const loom_sched_entry *loom_sched_sim_entry(const loom_sched_sim *s, loom_seq_id id);
/* splitmix64, the same everywhere. */
uint64_t loom_sched_sim_rand(uint64_t *state);

#endif
