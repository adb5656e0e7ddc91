/*
 * tests/common/fake_host.h — a loom_host for unit tests: plugins are created
 * and driven without the engine, YAML or dlopen (STYLE.md habit 11).
 * Logging goes to stderr at warn+, metrics are recorded in a small table
 * tests can read back, allocations are counted so leaks show up.
 */
#ifndef LOOM_TEST_FAKE_HOST_H
#define LOOM_TEST_FAKE_HOST_H

#include "loom/plugin.h"

/* A fresh host (static storage; reset on each call). */
const loom_host *fake_host(void);
/* Live allocations made through the host table (alloc/calloc - free). */
long fake_host_live_allocs(void);
/* Value of a metric recorded through metric_add/metric_set (0 if never). */
double fake_host_metric(const char *name);

#endif
