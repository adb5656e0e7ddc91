/*
 * core/plugin/host.h — the host table loom hands to every plugin's create(),
 * and the process-wide state behind it: the metrics table and the worker
 * thread count.
 *
 * The default host logs through core/util (each line tagged with the
 * component name the plugin passes), allocates with malloc/calloc/free,
 * formats errors into caller-owned loom_error, records metrics in one
 * thread-safe name -> double table, reports the thread count the engine
 * set, and hands out the shared rules (formats/dtype.h,
 * plugin/host_rules.h). It is a single static table:
 * every instance in the process shares it, so its functions are [any].
 * Internal: never installed (plugins see only loom_host from loom/plugin.h).
 */
#ifndef LOOM_CORE_PLUGIN_HOST_H
#define LOOM_CORE_PLUGIN_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"

/* ------------------------------------------------------------------ host */

/* [any] The process's host table: static, never freed, valid forever. */
const loom_host *loom_host_default(void);

/* [any] Worker threads plugins are told to use (host->num_threads).
 * n <= 0 means "all online cores" (the default). */
void    loom_host_set_threads(int32_t n);
/* [any] The current value: what host->num_threads returns (always >= 1). */
int32_t loom_host_threads(void);

/* --------------------------------------------------------------- metrics */

/* [any] Value of metric `name` (counters start at 0 on first metric_add);
 * 0 when the metric was never recorded. */
double  loom_metrics_get(const char *name);
/* [any] Like loom_metrics_get but says whether the metric exists. */
bool    loom_metrics_lookup(const char *name, double *value);
/* [any] Number of metrics recorded so far. */
int     loom_metrics_count(void);

/* Called once per metric, in name order, with a snapshot taken under the
 * lock: `name` is valid for the call only; the callback may use the metrics
 * functions itself. */
typedef void (*loom_metrics_fn)(void *user, const char *name, double value);
/* [any] Visit every metric (e.g. to print them after a run). */
void    loom_metrics_foreach(loom_metrics_fn fn, void *user);
/* [any] Forget every metric (tests; the engine between benchmark runs). */
void    loom_metrics_reset(void);

#endif
