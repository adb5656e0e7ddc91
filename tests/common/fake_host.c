/*
 * tests/common/fake_host.c — see fake_host.h.
 */
#include "fake_host.h"

#include <stdarg.h>
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

long fake_host_live_allocs(void) { return g.live; }

double fake_host_metric(const char *name) {
    for (int i = 0; i < g.nmetrics; i++)
        if (!strcmp(g.names[i], name)) return g.values[i];
    return 0;
}
