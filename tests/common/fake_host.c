/*
 * tests/common/fake_host.c — see fake_host.h.
 */
#include "fake_host.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin/host.h"

#define FAKE_MAX_METRICS 128

static struct {
    long live;
    int nmetrics;
    char names[FAKE_MAX_METRICS][64];
    double values[FAKE_MAX_METRICS];
} g;

static void fh_log(void *ctx, loom_log_level level, const char *who, const char *fmt, ...) {
    (void)ctx;
    if (level < LOOM_LOG_WARN) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", who ? who : "?");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *fh_alloc(void *ctx, size_t n) {
    (void)ctx;
    void *p = malloc(n ? n : 1);
    if (p) g.live++;
    return p;
}

static void *fh_calloc(void *ctx, size_t n, size_t s) {
    (void)ctx;
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (p) g.live++;
    return p;
}

static void fh_free(void *ctx, void *p) {
    (void)ctx;
    if (!p) return;
    g.live--;
    free(p);
}

static loom_status fh_error(void *ctx, loom_error *err, loom_status code, const char *fmt, ...) {
    (void)ctx;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

static double *metric_slot(const char *name) {
    for (int i = 0; i < g.nmetrics; i++)
        if (!strcmp(g.names[i], name)) return &g.values[i];
    if (g.nmetrics == FAKE_MAX_METRICS) return NULL;
    snprintf(g.names[g.nmetrics], sizeof g.names[0], "%s", name);
    g.values[g.nmetrics] = 0;
    return &g.values[g.nmetrics++];
}

static void fh_metric_add(void *ctx, const char *name, double d) {
    (void)ctx;
    double *v = metric_slot(name);
    if (v) *v += d;
}

static void fh_metric_set(void *ctx, const char *name, double x) {
    (void)ctx;
    double *v = metric_slot(name);
    if (v) *v = x;
}

static int32_t fh_threads(void *ctx) {
    (void)ctx;
    const char *s = getenv("LOOM_TEST_THREADS");
    if (s) return atoi(s);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t)n : 1;
}

static loom_host g_host;

const loom_host *fake_host(void) {
    memset(&g, 0, sizeof g);
    /* The real host's rules (checks, formats, rng); the services are ours. */
    g_host = *loom_host_default();
    g_host.ctx = NULL;
    g_host.log = fh_log;
    g_host.alloc = fh_alloc;
    g_host.calloc = fh_calloc;
    g_host.free = fh_free;
    g_host.error = fh_error;
    g_host.metric_add = fh_metric_add;
    g_host.metric_set = fh_metric_set;
    g_host.num_threads = fh_threads;
    return &g_host;
}

/* ------------------------------------------------------ a locked host */

static pthread_mutex_t g_lk_mu = PTHREAD_MUTEX_INITIALIZER;
static loom_host g_lk_host;
static bool g_lk_ready;

static void *lk_alloc(void *ctx, size_t n) {
    pthread_mutex_lock(&g_lk_mu);
    void *p = fh_alloc(ctx, n);
    pthread_mutex_unlock(&g_lk_mu);
    return p;
}
static void *lk_calloc(void *ctx, size_t n, size_t s) {
    pthread_mutex_lock(&g_lk_mu);
    void *p = fh_calloc(ctx, n, s);
    pthread_mutex_unlock(&g_lk_mu);
    return p;
}
static void lk_free(void *ctx, void *p) {
    pthread_mutex_lock(&g_lk_mu);
    fh_free(ctx, p);
    pthread_mutex_unlock(&g_lk_mu);
}
static void lk_metric_set(void *ctx, const char *name, double v) {
    pthread_mutex_lock(&g_lk_mu);
    fh_metric_set(ctx, name, v);
    pthread_mutex_unlock(&g_lk_mu);
}

const loom_host *fake_host_locked(void) {
    if (g_lk_ready) return &g_lk_host;
    g_lk_host = *fake_host();
    g_lk_host.alloc = lk_alloc;
    g_lk_host.calloc = lk_calloc;
    g_lk_host.free = lk_free;
    g_lk_host.metric_set = lk_metric_set;
    g_lk_ready = true;
    return &g_lk_host;
}

long fake_host_live_allocs(void) { return g.live; }

double fake_host_metric(const char *name) {
    for (int i = 0; i < g.nmetrics; i++)
        if (!strcmp(g.names[i], name)) return g.values[i];
    return 0;
}
