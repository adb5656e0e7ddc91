/*
 * tests/scheduler/sim.h — the scheduler tests' handle on the conformance
 * kit's simulated core (conformance/sched_sim.h, over its reference cache
 * conformance/ref_cache.h): dlopen a scheduler plugin built in this tree,
 * fill its config from its declared table plus "key=value" overrides,
 * create it, and step the simulation with every contract check of the kit
 * turned into a Criterion assertion (a failing one names the step, the
 * sequence and the rule). Tests read the simulation's state directly.
 */
#ifndef LOOM_TEST_SCHED_SIM_H
#define LOOM_TEST_SCHED_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/scheduler.h"
#include "ref_cache.h"
#include "sched_sim.h"

/* ---------------------------------------------------------------- plugins */

typedef struct sched_plugin {
    void *dl;                         /* dlopen handle                        */
    const loom_component *comp;       /* the scheduler component              */
    const loom_scheduler_ops *ops;
} sched_plugin;

/* Path of a scheduler plugin .so built in this tree ("continuous", "static"). */
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

typedef loom_sim_req sim_req;
typedef loom_sim_seq sim_seq;
typedef loom_sched_sim sim;

enum { SIM_PENDING = LOOM_SIM_PENDING, SIM_LIVE = LOOM_SIM_LIVE, SIM_DONE = LOOM_SIM_DONE,
       SIM_ABORTED = LOOM_SIM_ABORTED };

typedef struct sim_opts {
    const char *plugin;      /* "continuous" or "static"                     */
    const char *params;      /* overrides for config_build                   */
    int32_t block_size, num_blocks, num_cpu_blocks;
    int32_t prefix_tokens;   /* reference cache prefix hits (0 = none)       */
    bool no_swap;            /* reference swap_out answers UNSUPPORTED       */
    uint64_t seed;           /* draft acceptance                             */
    /* Use this cache instead of the reference one (integration tests): it
     * must have been created with `host`, and the caller destroys it after
     * sim_free. */
    const loom_cache_ops *cache_ops;
    void *cache_self;
    const loom_host *host;   /* NULL: a fresh fake_host()                    */
} sim_opts;

sim *sim_new(const sim_opts *o, const sim_req *reqs, int32_t n);
void sim_free(sim *s);
/* One step (asserts every rule); returns the number of entries. */
int32_t sim_step(sim *s);
/* Step until every request is done or aborted; asserts it happens within
 * max_steps and then checks the end state. Returns the steps taken. */
int64_t sim_run(sim *s, int64_t max_steps);
/* Entry of seq `id` in the last step's output, or NULL. */
const loom_sched_entry *sim_entry(const sim *s, loom_seq_id id);

uint64_t sim_rand(uint64_t *state);

#endif
