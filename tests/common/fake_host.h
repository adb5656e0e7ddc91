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
/* [test thread] The fake host with alloc, calloc, free and metric_set
 * behind one mutex, for plugins that call the host from their own threads
 * (the executors' ranks). Made on the first call (which resets the
 * counters, as fake_host() does) and the same table after that; calling
 * fake_host() later resets the counters it shares. */
const loom_host *fake_host_locked(void);
/* Live allocations made through the host table (alloc/calloc - free). */
long fake_host_live_allocs(void);
/* Value of a metric recorded through metric_add/metric_set (0 if never). */
double fake_host_metric(const char *name);

#endif
