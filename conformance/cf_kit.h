/*
 * conformance/cf_kit.h — what the kit's check files share: the context of
 * one running check (failure text, notes, the breadcrumb a crash report
 * quotes), the counting host every plugin instance is created with, config
 * structs built by the real binder, and the kit's own random numbers.
 *
 * A check is a function `bool fn(cf_run *r, const void *arg)`: it returns
 * true when the plugin kept the contract, and false after cf_fail() wrote
 * what rule broke and how. Checks never assert; a plugin that returns
 * garbage produces a failure, never a crash of the kit (bounds are checked
 * before anything a plugin wrote is used as an index).
 */
#ifndef LOOM_CONFORMANCE_CF_KIT_H
#define LOOM_CONFORMANCE_CF_KIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conformance.h"
#include "loom/plugin.h"

#define CF_WHY_MAX 1024
#define CF_NOTE_MAX 256
#define CF_WHERE_MAX 256

/* ------------------------------------------------------------- one check */

typedef struct cf_run {
    const loom_conformance_opts *opts;
    const loom_component *comp;   /* the component under test               */
    const char *path;             /* its file, for messages (may be NULL)   */
    const char *check;            /* this check's name                      */
    uint64_t seed;                /* this check's seed                      */
    bool quick;
    bool failed;
    bool skipped;
    char why[CF_WHY_MAX];         /* first failure (or the skip reason)     */
    char note[CF_NOTE_MAX];       /* detail for the PASS line               */
    char *where;                  /* breadcrumb, CF_WHERE_MAX bytes         */
} cf_run;

typedef bool (*cf_check_fn)(cf_run *r, const void *arg);

typedef struct cf_check {
    char name[192];
    cf_check_fn fn;
    const void *arg;
} cf_check;

/* Record the first failure (later ones are ignored); returns false so a
 * check can `return cf_fail(r, ...)`. */
bool cf_fail(cf_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The check cannot run here (an optional capability is absent, no device):
 * reported as SKIP; returns true. A check may also return false after a
 * skip: still a SKIP (unless a failure was recorded too). */
bool cf_skip(cf_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Detail shown on the PASS line (replaces any earlier note). */
void cf_note(cf_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Where the check is now; quoted when the plugin crashes or hangs. */
void cf_where(cf_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Iterations scaled down for --quick (never below `min`). */
int64_t cf_iters(const cf_run *r, int64_t full, int64_t min);

#define CF_ENSURE(r, cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) return cf_fail((r), __VA_ARGS__);                                             \
    } while (0)

/* ------------------------------------------------------- counting host */

/* The host table plugins get: the real host's rules, the kit's services.
 * Allocations are tracked (live count; a free of a pointer the host never
 * handed out, or freed twice, is recorded as a violation), the Nth
 * allocation can be made to fail, and calls of rng_next / rng_uniform are
 * counted per state so a check can prove a state moved only through them.
 * One per process: cf_host_reset() before each check. [any] */
const loom_host *cf_host(void);
void cf_host_reset(bool verbose);
/* Allocations made through the table and not freed. */
long cf_host_live(void);
/* First misuse seen (bad free), or NULL. */
const char *cf_host_violation(void);
/* Make the allocation `n` calls from now fail (0 = the next); -1 = never. */
void cf_host_fail_alloc(long n);
/* Allocations attempted since the last reset. */
long cf_host_alloc_calls(void);
/* rng accounting: forget every count; then the number of rng_next /
 * rng_uniform calls made on `state` since. */
void cf_host_rng_clear(void);
long cf_host_rng_calls(const uint64_t *state);
/* The last message a plugin logged at warn or above ("" if none). */
const char *cf_host_last_log(void);

/* The registry of the current run (search path: LOOM_PLUGIN_PATH and the
 * default places), for checks that need another plugin (an executor's
 * inner backend); created on first use. The plugin under test when the run
 * opened it by path, else NULL. */
struct loom_registry;
struct loom_plugin;
struct loom_registry *cf_registry(void);
struct loom_plugin *cf_plugin(void);

/* ------------------------------------------------------------- configs */

/* Whether `c` declares parameter `key`. */
bool cf_declares(const loom_component *c, const char *key);
/* A config struct of c->config_size bytes (calloc'd, at least 1) from the
 * declared defaults, then `csv` ("k=v,k=v"; keys c does not declare are
 * dropped), then the run's user overrides — bound by the host's binder, so
 * bounds and types are checked as a pipeline file's would be. NULL and why
 * when binding fails. */
void *cf_config(cf_run *r, const char *csv, char *why, size_t cap);
/* An INT, ENUM or BOOL parameter read back from a bound config. */
bool cf_config_int(const loom_component *c, const void *cfg, const char *key, int64_t *out);
/* `csv` without the keys c does not declare, into buf (for labels). */
void cf_config_label(const loom_component *c, const char *csv, char *buf, size_t cap);

/* Create an instance of r->comp with config `csv` on the counting host;
 * false (a failure recorded) when create fails or misbehaves — or (a skip
 * recorded) when it reports LOOM_ERR_DEVICE: no device to test on here. */
bool cf_create(cf_run *r, const char *csv, void **self);
/* Destroy it and fail unless every host allocation came back. */
bool cf_destroy(cf_run *r, void *self);

/* ---------------------------------------------------------- randomness */

typedef struct cf_rng {
    uint64_t s;
} cf_rng;

cf_rng   cf_rng_make(uint64_t seed);
uint64_t cf_rng_next(cf_rng *g);
/* Uniform in [0, n) (0 when n <= 1). */
int32_t  cf_rng_below(cf_rng *g, int32_t n);
/* Uniform in [0, 1). */
double   cf_rng_unif(cf_rng *g);
/* Standard normal. */
double   cf_rng_normal(cf_rng *g);
/* A seed derived from `base` and a name (stable across runs). */
uint64_t cf_seed_mix(uint64_t base, const char *name);

/* ------------------------------------------------ the kinds' check lists */

/* Append the checks of a component (common ones first) to out (cap
 * entries); returns how many, or -1 when the kit has none for its kind. */
int cf_checks_common(const loom_component *c, cf_check *out, int cap);
int cf_checks_cache(const loom_component *c, cf_check *out, int cap);
int cf_checks_scheduler(const loom_component *c, cf_check *out, int cap);
int cf_checks_sampler(const loom_component *c, cf_check *out, int cap);
int cf_checks_quantizer(const loom_component *c, cf_check *out, int cap);
int cf_checks_speculator(const loom_component *c, cf_check *out, int cap);
int cf_checks_backend(const loom_component *c, cf_check *out, int cap);
int cf_checks_executor(const loom_component *c, cf_check *out, int cap);
int cf_checks_constraint(const loom_component *c, cf_check *out, int cap);
int cf_checks_kv_connector(const loom_component *c, cf_check *out, int cap);

/* Add one check (name printf-style) when there is room; returns the new
 * count. */
int cf_add(cf_check *out, int n, int cap, cf_check_fn fn, const void *arg, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
