/*
 * conformance/cf_host.c — the counting host the kit creates every plugin
 * instance with (see cf_kit.h). The rules (checks, formats, shard plans,
 * the top-k reference, the rng itself) are the real host's; allocation,
 * logging, errors, metrics and the rng entry points are wrapped so the kit
 * can see what a plugin did: every live pointer is kept in a hash set, so
 * a leak, a double free or a free of a foreign pointer is caught, and the
 * Nth allocation can be made to fail to test that create() "succeeds fully
 * or leaves nothing behind".
 *
 * Every function is [any] (backends call alloc from worker threads): one
 * mutex guards the state.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "plugin/host.h"

#define CF_RNG_SLOTS 64

typedef struct cf_rng_slot {
    const uint64_t *state;
    long calls;
} cf_rng_slot;

static struct {
    pthread_mutex_t lock;
    void **set;          /* open addressing; NULL = empty, (void*)1 = tombstone */
    size_t cap, used;    /* slots, occupied + tombstones                        */
    long live, calls;
    long fail_at;        /* allocation index (in calls) that fails; -1 = none   */
    bool verbose;
    char violation[256];
    char last_log[512];
    cf_rng_slot rng[CF_RNG_SLOTS];
    int nrng;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .fail_at = -1};

static loom_host g_table;

#define CF_TOMB ((void *)1)

static size_t ptr_hash(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

/* Lock held. Grow (and drop tombstones) when 3/4 full. */
static bool set_reserve(void) {
    if (g.cap && (g.used + 1) * 4 < g.cap * 3) return true;
    size_t cap = g.cap ? g.cap * 2 : 1024;
    while ((size_t)g.live * 2 >= cap) cap *= 2;
    void **n = calloc(cap, sizeof *n);
    if (!n) return false;
    for (size_t i = 0; i < g.cap; i++) {
        void *p = g.set[i];
        if (!p || p == CF_TOMB) continue;
        size_t j = ptr_hash(p, cap);
        while (n[j]) j = (j + 1) & (cap - 1);
        n[j] = p;
    }
    free(g.set);
    g.set = n;
    g.cap = cap;
    g.used = (size_t)g.live;
    return true;
}

/* Lock held. */
static void set_add(void *p) {
    if (!set_reserve()) return; /* out of memory: the pointer is just not tracked */
    size_t j = ptr_hash(p, g.cap);
    while (g.set[j] && g.set[j] != CF_TOMB) j = (j + 1) & (g.cap - 1);
    if (!g.set[j]) g.used++;
    g.set[j] = p;
}

/* Lock held. */
static bool set_remove(void *p) {
    if (!g.cap) return false;
    size_t j = ptr_hash(p, g.cap);
    while (g.set[j]) {
        if (g.set[j] == p) {
            g.set[j] = CF_TOMB;
            return true;
        }
        j = (j + 1) & (g.cap - 1);
    }
    return false;
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
    if (g.violation[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.violation, sizeof g.violation, fmt, ap);
    va_end(ap);
}

/* Lock held. Count an allocation attempt; whether it is the injected failure. */
static bool next_fails(void) {
    bool fail = g.fail_at >= 0 && g.calls == g.fail_at;
    g.calls++;
    return fail;
}

static void *h_alloc(void *ctx, size_t n) {
    (void)ctx;
    pthread_mutex_lock(&g.lock);
    bool fail = next_fails();
    void *p = fail ? NULL : malloc(n ? n : 1);
    if (p) {
        g.live++;
        set_add(p);
    }
    pthread_mutex_unlock(&g.lock);
    return p;
}

static void *h_calloc(void *ctx, size_t n, size_t s) {
    (void)ctx;
    pthread_mutex_lock(&g.lock);
    bool fail = next_fails();
    void *p = fail ? NULL : calloc(n ? n : 1, s ? s : 1);
    if (p) {
        g.live++;
        set_add(p);
    }
    pthread_mutex_unlock(&g.lock);
    return p;
}

static void h_free(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    pthread_mutex_lock(&g.lock);
    bool known = set_remove(p);
    if (known) g.live--;
    else violation("host->free(%p): not a live pointer from host->alloc/calloc (freed twice, or "
                   "not the host's)", p);
    pthread_mutex_unlock(&g.lock);
    if (known) free(p); /* an unknown pointer is never handed to free() */
}

static void h_log(void *ctx, loom_log_level level, const char *who, const char *fmt, ...) {
    (void)ctx;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt ? fmt : "(null)", ap);
    va_end(ap);
    pthread_mutex_lock(&g.lock);
    if (level >= LOOM_LOG_WARN) snprintf(g.last_log, sizeof g.last_log, "%s", line);
    bool show = g.verbose && level >= LOOM_LOG_INFO;
    pthread_mutex_unlock(&g.lock);
    if (show) fprintf(stderr, "  [%s] %s\n", who ? who : "?", line);
}

static loom_status h_error(void *ctx, loom_error *err, loom_status code, const char *fmt, ...) {
    (void)ctx;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt ? fmt : "(null)", ap);
        va_end(ap);
    }
    return code;
}

static void h_metric_add(void *ctx, const char *name, double d) {
    (void)ctx;
    (void)d;
    if (!name || !*name) {
        pthread_mutex_lock(&g.lock);
        violation("host->metric_add with an empty or NULL name");
        pthread_mutex_unlock(&g.lock);
    }
}

static void h_metric_set(void *ctx, const char *name, double x) {
    (void)ctx;
    (void)x;
    if (!name || !*name) {
        pthread_mutex_lock(&g.lock);
        violation("host->metric_set with an empty or NULL name");
        pthread_mutex_unlock(&g.lock);
    }
}

static int32_t h_threads(void *ctx) {
    (void)ctx;
    return 2; /* small and fixed: results do not depend on the machine */
}

static void rng_count(const uint64_t *state) {
    pthread_mutex_lock(&g.lock);
    int i = 0;
    while (i < g.nrng && g.rng[i].state != state) i++;
    if (i == g.nrng && g.nrng < CF_RNG_SLOTS) g.rng[g.nrng++] = (cf_rng_slot){state, 0};
    if (i < g.nrng) g.rng[i].calls++;
    pthread_mutex_unlock(&g.lock);
}

static uint64_t h_rng_next(uint64_t state[4]) {
    rng_count(state);
    return loom_host_default()->rng_next(state);
}

static double h_rng_uniform(uint64_t state[4]) {
    rng_count(state);
    return loom_host_default()->rng_uniform(state);
}

const loom_host *cf_host(void) {
    pthread_mutex_lock(&g.lock);
    if (!g_table.struct_size) {
        g_table = *loom_host_default();
        g_table.ctx = NULL;
        g_table.log = h_log;
        g_table.alloc = h_alloc;
        g_table.calloc = h_calloc;
        g_table.free = h_free;
        g_table.error = h_error;
        g_table.metric_add = h_metric_add;
        g_table.metric_set = h_metric_set;
        g_table.num_threads = h_threads;
        g_table.rng_next = h_rng_next;
        g_table.rng_uniform = h_rng_uniform;
    }
    pthread_mutex_unlock(&g.lock);
    return &g_table;
}

void cf_host_reset(bool verbose) {
    pthread_mutex_lock(&g.lock);
    /* Pointers still live belong to an earlier check that failed; forget
     * them (they are leaked on purpose rather than freed under a plugin). */
    free(g.set);
    g.set = NULL;
    g.cap = g.used = 0;
    g.live = g.calls = 0;
    g.fail_at = -1;
    g.verbose = verbose;
    g.violation[0] = g.last_log[0] = '\0';
    g.nrng = 0;
    pthread_mutex_unlock(&g.lock);
}

long cf_host_live(void) {
    pthread_mutex_lock(&g.lock);
    long n = g.live;
    pthread_mutex_unlock(&g.lock);
    return n;
}

const char *cf_host_violation(void) { return g.violation[0] ? g.violation : NULL; }

const char *cf_host_last_log(void) { return g.last_log; }

void cf_host_fail_alloc(long n) {
    pthread_mutex_lock(&g.lock);
    g.calls = 0;
    g.fail_at = n;
    pthread_mutex_unlock(&g.lock);
}

long cf_host_alloc_calls(void) {
    pthread_mutex_lock(&g.lock);
    long n = g.calls;
    pthread_mutex_unlock(&g.lock);
    return n;
}

void cf_host_rng_clear(void) {
    pthread_mutex_lock(&g.lock);
    g.nrng = 0;
    pthread_mutex_unlock(&g.lock);
}

long cf_host_rng_calls(const uint64_t *state) {
    pthread_mutex_lock(&g.lock);
    long n = 0;
    for (int i = 0; i < g.nrng; i++)
        if (g.rng[i].state == state) n = g.rng[i].calls;
    pthread_mutex_unlock(&g.lock);
    return n;
}
