/*
 * tests/plugin/good/multi_plugin.c — one shared object (libmulti.so, not the
 * conventional loom-<kind>-<name>.so name) providing two components of
 * different kinds, so lookup must fall back to reading descriptors, and a
 * path given as `plugin: .../libmulti.so` must pick the right component.
 */
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "stub_ops.h"

typedef struct multi_config {
    int64_t k; /* any integer */
} multi_config;

static const loom_param multi_params[] = {
    {"k", LOOM_PARAM_INT, offsetof(multi_config, k), "1", 1, 0, NULL, "an integer"},
    {0},
};

/* destroy() gets only self, so remember the host to free through it. */
static const loom_host *g_multi_host;

static loom_status multi_create(const loom_host *host, const void *config, void **self,
                                loom_error *err) {
    multi_config *c = host->alloc(host->ctx, sizeof *c);
    if (!c) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "multi: out of memory");
    c->k = ((const multi_config *)config)->k;
    g_multi_host = host;
    *self = c;
    return LOOM_OK;
}

/* The scheduler declares no parameters (config_size 0): never read config. */
static loom_status multi_sched_create(const loom_host *host, const void *config, void **self,
                                      loom_error *err) {
    static const multi_config none = {0};
    (void)config;
    return multi_create(host, &none, self, err);
}

static void multi_destroy(void *self) {
    if (self && g_multi_host) g_multi_host->free(g_multi_host->ctx, self);
}

/* an ABI 2.0 sampler table: it ends before check (since 2.1) */
static const loom_sampler_ops multi_sampler_ops = {
    .struct_size = offsetof(loom_sampler_ops, check), .create = multi_create, .destroy = multi_destroy, STUB_SAMPLER_OPS};
static const loom_scheduler_ops multi_sched_ops = {
    .struct_size = sizeof(loom_scheduler_ops), .create = multi_sched_create, .destroy = multi_destroy,
    STUB_SCHEDULER_OPS};

static const loom_component multi_components[] = {
    {.struct_size = sizeof(loom_component), .kind = LOOM_KIND_SAMPLER, .name = "msamp",
     .summary = "multi: sampler", .ops = &multi_sampler_ops, .params = multi_params,
     .config_size = sizeof(multi_config)},
    {.struct_size = sizeof(loom_component), .kind = LOOM_KIND_SCHEDULER, .name = "msched",
     .summary = "multi: scheduler", .ops = &multi_sched_ops, .params = NULL, .config_size = 0},
};

static const loom_plugin_desc multi_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "multi",
    .version = "1.2.3",
    .num_components = 2,
    .components = multi_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &multi_desc; }
