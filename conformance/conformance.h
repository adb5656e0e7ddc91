/*
 * conformance/conformance.h — the conformance kit: the contract tests of
 * each plugin kind, run against any plugin through its ops table and a
 * counting host, so an out-of-tree plugin is held to the same rules as the
 * shipped ones (`loom plugin-test PATH.so`, docs/plugin-test.md).
 *
 * A run opens a shared object through the registry (so the loader's checks
 * apply first), then runs every check of each component's kind. Each check
 * runs in a forked child by default: a plugin that crashes or hangs is
 * reported as "crashed in <check>" / "timed out in <check>" with the last
 * step the check had reached, and the next check still runs. Checks are
 * randomized from one seed, printed, so any failure replays exactly
 * (`--seed S --check NAME`).
 *
 * What the kit is not: a benchmark, or a test of one plugin's own policy
 * (fcfs order, top-p details) — those stay with the plugin's tests. The
 * kit's parts (the scheduler simulator, the reference cache, the cache
 * traffic model, the chi-square helpers) are also what the shipped plugins'
 * own tests use (conformance/sched_sim.h, conformance/ref_cache.h,
 * conformance/cf_kit.h).
 *
 * Tree-internal: the CLI and the tests link it; it is never installed.
 * Everything here is [engine]: one thread, one run at a time.
 */
#ifndef LOOM_CONFORMANCE_H
#define LOOM_CONFORMANCE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/cache.h"
#include "loom/plugin.h"
#include "loom/quant.h"

/* What a run is asked to do. Zero-initialise, then set what you need. */
typedef struct loom_conformance_opts {
    FILE *out;                 /* PASS/FAIL lines and the summary; NULL = stdout   */
    uint64_t seed;             /* base seed; each check derives its own from it    */
    bool quick;                /* fewer iterations (sanitizer builds, smoke runs)  */
    bool no_fork;              /* run checks in this process (debugging; a crash
                                  then takes the run down)                         */
    bool verbose;              /* plugin log lines at info and above to stderr     */
    loom_kind kind;            /* 0 = every kind; else only components of it        */
    const char *component;     /* NULL = every component; else only this name      */
    const char *check;         /* NULL = every check; else checks whose name
                                  contains this text                               */
    const char *const *sets;   /* "key=value" parameter overrides for the component
                                  under test (its declared parameters)             */
    int num_sets;
    const char *inner_backend; /* executor checks: backend component to attach;
                                  NULL = "cpu"                                     */
    int32_t spec_vocab;        /* speculator checks: vocabulary; 0 = 256           */
    int32_t timeout_s;         /* per check (forked runs); 0 = 300                 */
} loom_conformance_opts;

typedef struct loom_conformance_summary {
    int passed;
    int failed;
    int skipped;               /* optional capability absent: reported, not failed */
    int untested;              /* components the kit has no checks for             */
} loom_conformance_summary;

/* Optional insight into a cache manager's internals, for the shipped
 * manager's own tests (its debug hooks): every member may be NULL. With it
 * the traffic check also compares refcounts and the manager's self-check
 * after every operation. */
typedef struct loom_conformance_cache_probe {
    /* Reference count of device (host false) or host block `block`. */
    int32_t (*refcount)(void *self, int32_t block, bool host);
    /* Whether device block `block` is in the prefix cache. */
    bool (*hashed)(void *self, int32_t block);
    /* The manager's own invariant walk; false + why when one is broken. */
    bool (*self_check)(void *self, char *why, size_t cap);
    /* seq's table including host ids while swapped (-1: unknown seq). */
    int32_t (*host_table)(void *self, loom_seq_id seq, int32_t *out, int32_t cap, bool *swapped);
    /* Called once after init (e.g. to force prefix-key collisions). */
    void (*prepare)(void *self);
    /* Properties of the manager's own policy the traffic check then
     * enforces too: tables hold exactly the blocks their tokens need (no
     * more), and no block is ever in two tables (no sharing at all). */
    bool exact_tables;
    bool never_shares;
    /* Group `group`'s table including host ids while swapped (-1: unknown
     * seq or group); with block-table groups it replaces host_table. */
    int32_t (*group_host_table)(void *self, loom_seq_id seq, int32_t group, int32_t *out, int32_t cap,
                                bool *swapped);
} loom_conformance_cache_probe;

/* One random-traffic run of a cache manager (the `cache.traffic` check). */
typedef struct loom_conformance_cache_case {
    const char *label;         /* for messages                                       */
    const char *sets;          /* "key=value,..." on top of the component's defaults;
                                  keys it does not declare are dropped              */
    int32_t max_model_len;     /* loom_cache_init.max_model_len                      */
    int32_t num_ops;           /* random operations                                  */
    bool expect_nospace;       /* fail unless the pool ran full at least once        */
    bool expect_prefix_hits;   /* ... unless acquire_prefix hit at least once        */
    bool expect_swaps;         /* ... unless blocks were swapped                     */
    bool expect_cow;           /* ... unless a copy-on-write was queued              */
    const loom_kv_groups *groups; /* loom_cache_init.groups: block-table groups the
                                  fake backend proposes; NULL = none. A manager that
                                  takes them is checked per group: each windowed
                                  group's table must hold what the next query's
                                  window reads, and (exact_tables) nothing before it */
    bool expect_released;      /* fail unless a windowed group released a block      */
} loom_conformance_cache_case;

/* What a traffic run saw (filled on success and failure alike). */
typedef struct loom_conformance_cache_tally {
    int64_t ops, allocs, nospace, prefix_hit_tokens, copies, swapped_blocks, forks, drains;
    int32_t num_blocks, peak_used;
    int32_t num_groups;        /* tables per sequence the manager keeps              */
    int64_t released;          /* released (-1) table entries seen, all checks       */
} loom_conformance_cache_tally;

/* -------------------------------------------------------------- running */

/* Open `path` through a registry (search path: LOOM_PLUGIN_PATH and the
 * default places, for inner backends and reference plugins), print one line
 * per check and the summary. Returns LOOM_OK when every check ran and passed
 * and every selected component was tested; LOOM_ERR_INVALID when a check
 * failed; LOOM_ERR_NOT_FOUND when nothing matched the filters; the loader's
 * status when the file was refused (err says why, and a FAIL line says so). */
loom_status loom_conformance_run_file(const char *path, const loom_conformance_opts *o,
                                      loom_conformance_summary *sum, loom_error *err);

/* The checks of one component given directly (e.g. a table compiled into a
 * test): no loader checks. `path` labels messages (may be NULL). Same
 * result codes as loom_conformance_run_file. */
loom_status loom_conformance_run_component(const loom_component *comp, const char *path,
                                           const loom_conformance_opts *o,
                                           loom_conformance_summary *sum, loom_error *err);

/* One cache traffic run, in this process (no fork), with an optional probe:
 * true when every invariant held; otherwise false and why (cap bytes,
 * naming the seed, the operation and the rule). `tally` may be NULL. */
bool loom_conformance_cache_traffic(const loom_component *comp, const loom_conformance_cache_case *c,
                                    const loom_conformance_cache_probe *probe, uint64_t seed,
                                    loom_conformance_cache_tally *tally, char *why, size_t cap);

/* A quantized tensor q, made from the f32 (rows, cols) weight w under plan
 * p, read back to floats through the layouts loom/quant.h documents (the
 * kit's own reader), checking its layout and the per-element bounds of
 * quant.roundtrip on the way (INT8 within half a step, FP8 within E4M3's
 * rounding, INT4 groups within min/max rounding's; not the relative error,
 * which depends on the weights). back has room for rows x cols floats.
 * false and why when a rule broke. */
bool loom_conformance_quant_readback(const loom_tensor *w, const loom_quant_plan *p, const loom_qtensor *q,
                                     float *back, char *why, size_t cap);

/* The seed tests and the CLI start from: LOOM_TEST_SEED when set (decimal
 * or 0x hex), else one drawn from the clock. */
uint64_t loom_conformance_default_seed(void);

#endif
