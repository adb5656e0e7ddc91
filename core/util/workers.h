/*
 * core/util/workers.h — a small fork-join pool for the core's host work
 * that runs beside a device step (the engine's constraint masks): one
 * parallel-for at a time, items claimed one by one from a shared counter,
 * the caller working too. Idle workers sleep on a condition variable (no
 * spinning: the same cores may run a CPU backend's threads), so a step
 * that needs nothing from the pool costs nothing. Internal: never
 * installed.
 *
 * Threads: loom_workers_run is [instance] (one caller at a time per
 * pool); fn(ctx, i) runs on the caller and the workers concurrently, once
 * for each i in [0, n).
 */
#ifndef LOOM_CORE_WORKERS_H
#define LOOM_CORE_WORKERS_H

#include <stdint.h>

typedef struct loom_workers loom_workers;

/* A pool of `threads` workers besides the caller (0: the caller alone);
 * NULL when out of memory or threads cannot start. */
loom_workers *loom_workers_new(int32_t threads);
/* fn(ctx, i) for every i in [0, n), returning once all are done. */
void loom_workers_run(loom_workers *w, int32_t n, void (*fn)(void *ctx, int32_t i), void *ctx);
/* Stop and join the workers. NULL-safe. */
void loom_workers_free(loom_workers *w);

#endif
