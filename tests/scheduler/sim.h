/*
 * tests/scheduler/sim.h — a small simulation of the engine core, to drive a
 * scheduler plugin the way the step loop will: it owns the sequences
 * (loom_seq_info + tokens), adds them when they arrive, calls schedule(),
 * checks every entry against the contract in loom/scheduler.h, applies
 * num_computed, "samples" a token (and verifies speculative drafts) when a
 * sequence catches up, and finishes sequences at their length with remove()
 * and cache->free — or aborts them.
 *
 * Checks made on every step (Criterion asserts; a failing one names the
 * step and sequence): entries name live sequences, at most once; tokens > 0;
 * tokens fit [0, num_tokens); a non-fresh entry starts at the core's
 * num_computed, a fresh one (first schedule, or after recompute) at a
 * block-aligned prefix; the cache holds slots for every entry; at most
 * max_num_seqs entries and max_batched_tokens tokens; preempted sequences
 * are live, unscheduled, and hold no device blocks; the scheduler's queue
 * counts add up to the live sequences.
 */
#ifndef LOOM_TEST_SCHED_SIM_H
#define LOOM_TEST_SCHED_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "fake_cache.h"
#include "loom/scheduler.h"

/* ---------------------------------------------------------------- plugins */

typedef struct sched_plugin {
    void *dl;                         /* dlopen handle                        */
    const loom_component *comp;       /* the scheduler component              */
    const loom_scheduler_ops *ops;
} sched_plugin;

/* Path of a plugin .so built in this tree ("continuous", "static",
 * "cache/paged" style names are not accepted: scheduler names only). */
const char *sched_plugin_path(const char *name);
/* dlopen `path` and find its first component of `kind`; asserts on failure. */
void plugin_open(const char *path, loom_kind kind, sched_plugin *p);
void plugin_close(sched_plugin *p);

/* A config buffer of comp->config_size filled with the declared defaults,
 * then `overrides` ("key=value,key=value"); asserts on unknown keys.
 * Caller frees with free(). */
void *config_build(const loom_component *comp, const char *overrides);
/* Read an INT/ENUM/BOOL parameter back from a built config. */
int64_t config_get_int(const loom_component *comp, const void *cfg, const char *key);

/* ------------------------------------------------------------- simulation */

typedef struct sim_req {
    int32_t prompt;          /* prompt tokens, >= 1                          */
    int32_t total;           /* finished when it has this many tokens        */
    int32_t priority;        /* lower first                                  */
    int64_t arrive;          /* step at which the core adds it (>= 1)        */
    double arrival_offset;   /* arrival_time = arrive + this                 */
    int64_t abort_at;        /* step at which it is aborted; 0 = never       */
    int32_t drafts;          /* drafts proposed per decode; 0 = none         */
    int32_t shared_prefix;   /* leading prompt tokens equal across requests  */
} sim_req;

enum { SIM_PENDING = 0, SIM_LIVE = 1, SIM_DONE = 2, SIM_ABORTED = 3 };

typedef struct sim_seq {
    loom_seq_info info;      /* the view get_seq returns                     */
    int32_t *tokens;         /* (cap)                                        */
    int32_t cap;
    sim_req req;
    int state;               /* SIM_*                                        */
    bool fresh;              /* next entry may start at a cached prefix      */
    int32_t final_len;       /* tokens when finished                         */
    int32_t finishes;        /* times finished (must end at 1)               */
    int64_t first_step;      /* step of its first entry; 0 none              */
    int32_t first_rank;      /* 1 = first sequence ever scheduled            */
    int64_t done_step;
    int32_t preempts;
    int64_t seen_step;       /* duplicate detection                          */
} sim_seq;

typedef struct sim_opts {
    const char *plugin;      /* "continuous" or "static"                     */
    const char *params;      /* overrides for config_build                   */
    int32_t block_size, num_blocks, num_cpu_blocks;
    int32_t prefix_tokens;   /* fake cache prefix hits (0 = none)            */
    bool no_swap;            /* fake swap_out answers UNSUPPORTED            */
    uint64_t seed;           /* draft acceptance                             */
    /* Use this cache instead of the fake (integration tests): it must have
     * been created with `host`, and the caller destroys it after sim_free. */
    const loom_cache_ops *cache_ops;
    void *cache_self;
    const loom_host *host;   /* NULL: a fresh fake_host()                    */
} sim_opts;

typedef struct sim {
    sched_plugin plug;
    void *cfg;
    void *sched;
    fake_cache *fc;          /* NULL when a real cache is plugged in         */
    const loom_cache_ops *cops;
    void *cself;
    int32_t block_size, num_blocks;
    int32_t max_num_seqs, max_batched_tokens;
    sim_seq *seqs;           /* (n): id == index                             */
    int32_t n;
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
    bool own_host;           /* sim_free checks the host for leaks           */
} sim;

sim *sim_new(const sim_opts *o, const sim_req *reqs, int32_t n);
void sim_free(sim *s);
/* One step; returns the number of entries. */
int32_t sim_step(sim *s);
/* Step until every request is done or aborted; asserts it happens within
 * max_steps and then checks the end state (lengths, queues, cache). Returns
 * the number of steps taken in total. */
int64_t sim_run(sim *s, int64_t max_steps);
/* Entry of seq `id` in the last step's output, or NULL. */
const loom_sched_entry *sim_entry(const sim *s, loom_seq_id id);

uint64_t sim_rand(uint64_t *state);

#endif
