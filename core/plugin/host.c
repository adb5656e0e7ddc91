/*
 * core/plugin/host.c — the default loom_host: logging, allocation, error
 * formatting, metrics and the thread count, plus the shared rules of
 * formats/dtype.h and plugin/host_rules.h, as one static table shared by
 * every plugin instance in the process.
 *
 * Metrics are a sorted array of (name, value) under one mutex: plugins touch
 * a few dozen names, mostly once per step, so a binary search beats a hash
 * table on simplicity and is not a bottleneck. Nothing here allocates on
 * behalf of a plugin except alloc/calloc, whose memory the plugin frees
 * through the same table (ownership never crosses .so boundaries unpaired).
 */
#include "plugin/host.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/dtype.h"
#include "plugin/host_rules.h"
#include "util/util.h"

/* ---------------------------------------------------------------- metrics */

typedef struct metric {
    char *name;   /* owned                                      */
    double value; /* counter total or last gauge value          */
} metric;

static struct {
    pthread_mutex_t lock;
    metric *items; /* sorted by name                            */
    int count;
    int capacity;
} g_metrics = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Index of `name`, or -(insertion point) - 1 when absent. Lock held. */
static int metric_find(const char *name) {
    int lo = 0, hi = g_metrics.count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g_metrics.items[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -lo - 1;
}

/* Slot for `name`, created (value 0) on first use; NULL on OOM. Lock held. */
static metric *metric_slot(const char *name) {
    int i = metric_find(name);
    if (i >= 0) return &g_metrics.items[i];
    int at = -i - 1;
    if (g_metrics.count == g_metrics.capacity) {
        int cap = g_metrics.capacity ? g_metrics.capacity * 2 : 32;
        metric *m = realloc(g_metrics.items, (size_t)cap * sizeof *m);
        if (!m) return NULL;
        g_metrics.items = m;
        g_metrics.capacity = cap;
    }
    char *copy = loom_strdup(name);
    if (!copy) return NULL;
    memmove(&g_metrics.items[at + 1], &g_metrics.items[at],
            (size_t)(g_metrics.count - at) * sizeof(metric));
    g_metrics.items[at] = (metric){.name = copy, .value = 0.0};
    g_metrics.count++;
    return &g_metrics.items[at];
}

static void metric_update(const char *name, double v, bool add) {
    if (!name || !name[0]) return; /* a nameless metric cannot be read back */
    pthread_mutex_lock(&g_metrics.lock);
    metric *m = metric_slot(name);
    if (m) m->value = add ? m->value + v : v;
    pthread_mutex_unlock(&g_metrics.lock);
}

bool loom_metrics_lookup(const char *name, double *value) {
    if (!name) return false;
    pthread_mutex_lock(&g_metrics.lock);
    int i = metric_find(name);
    bool found = i >= 0;
    if (found && value) *value = g_metrics.items[i].value;
    pthread_mutex_unlock(&g_metrics.lock);
    return found;
}

double loom_metrics_get(const char *name) {
    double v = 0.0;
    return loom_metrics_lookup(name, &v) ? v : 0.0;
}

int loom_metrics_count(void) {
    pthread_mutex_lock(&g_metrics.lock);
    int n = g_metrics.count;
    pthread_mutex_unlock(&g_metrics.lock);
    return n;
}

void loom_metrics_foreach(loom_metrics_fn fn, void *user) {
    if (!fn) return;
    /* Snapshot under the lock, call back outside it, so a callback may read
     * or update metrics without deadlocking. */
    pthread_mutex_lock(&g_metrics.lock);
    int n = g_metrics.count;
    metric *snap = n ? malloc((size_t)n * sizeof *snap) : NULL;
    int taken = 0;
    for (int i = 0; snap && i < n; i++) {
        snap[i].name = loom_strdup(g_metrics.items[i].name);
        if (!snap[i].name) break;
        snap[i].value = g_metrics.items[i].value;
        taken++;
    }
    pthread_mutex_unlock(&g_metrics.lock);
    for (int i = 0; i < taken; i++) fn(user, snap[i].name, snap[i].value);
    for (int i = 0; i < taken; i++) free(snap[i].name);
    free(snap);
}

void loom_metrics_reset(void) {
    pthread_mutex_lock(&g_metrics.lock);
    for (int i = 0; i < g_metrics.count; i++) free(g_metrics.items[i].name);
    free(g_metrics.items);
    g_metrics.items = NULL;
    g_metrics.count = 0;
    g_metrics.capacity = 0;
    pthread_mutex_unlock(&g_metrics.lock);
}

/* ---------------------------------------------------------------- threads */

static atomic_int g_threads; /* 0 = all online cores */

void loom_host_set_threads(int32_t n) { atomic_store(&g_threads, n > 0 ? n : 0); }

int32_t loom_host_threads(void) {
    int n = atomic_load(&g_threads);
    if (n > 0) return n;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int32_t)cores : 1;
}

/* ------------------------------------------------------------- host table */

static void host_log(void *ctx, loom_log_level level, const char *who, const char *fmt, ...) {
    (void)ctx;
    if ((int)level < LOOM_LOG_DEBUG) level = LOOM_LOG_DEBUG;
    if ((int)level > LOOM_LOG_ERROR) level = LOOM_LOG_ERROR;
    if (!fmt) return;
    va_list ap;
    va_start(ap, fmt);
    loom_vlog(level, who, fmt, ap);
    va_end(ap);
}

/* size 0 is valid for plugins ("size 0 is ok"): hand out a real pointer so
 * NULL always means failure. */
static void *host_alloc(void *ctx, size_t size) {
    (void)ctx;
    return malloc(size ? size : 1);
}

static void *host_calloc(void *ctx, size_t n, size_t size) {
    (void)ctx;
    if (n == 0 || size == 0) return calloc(1, 1);
    return calloc(n, size);
}

static void host_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static loom_status host_error(void *ctx, loom_error *err, loom_status code, const char *fmt, ...) {
    (void)ctx;
    if (!fmt) return loom_error_set(err, code, "%s", loom_status_name(code));
    va_list ap;
    va_start(ap, fmt);
    loom_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

static void host_metric_add(void *ctx, const char *name, double delta) {
    (void)ctx;
    metric_update(name, delta, true);
}

static void host_metric_set(void *ctx, const char *name, double value) {
    (void)ctx;
    metric_update(name, value, false);
}

static int32_t host_num_threads(void *ctx) {
    (void)ctx;
    return loom_host_threads();
}

static const loom_host g_host = {
    .struct_size = sizeof(loom_host),
    .abi_major = LOOM_ABI_MAJOR,
    .abi_minor = LOOM_ABI_MINOR,
    .ctx = NULL,
    .log = host_log,
    .alloc = host_alloc,
    .calloc = host_calloc,
    .free = host_free,
    .error = host_error,
    .metric_add = host_metric_add,
    .metric_set = host_metric_set,
    .num_threads = host_num_threads,
    .dtype_name = loom_dtype_name,
    .dtype_block_elems = loom_dtype_block_elems,
    .dtype_block_bytes = loom_dtype_block_bytes,
    .dtype_row_bytes = loom_dtype_row_bytes,
    .convert = loom_convert,
    .check_model_config = loom_check_model_config,
    .check_load = loom_check_load,
    .check_batch = loom_check_batch,
    .model_tensor = loom_model_tensor_check,
    .packed_qweight = loom_model_packed_qweight,
    .shard_plan = loom_shard_plan,
    .logits_topk_row = loom_logits_topk_row,
    .rng_seed = loom_rng_seed,
    .rng_next = loom_rng_next,
    .rng_uniform = loom_rng_uniform,
    .logits_topk_masked_row = loom_logits_topk_masked_row,
};

const loom_host *loom_host_default(void) { return &g_host; }
