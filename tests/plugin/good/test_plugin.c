/*
 * tests/plugin/good/test_plugin.c — a well-formed plugin of one kind, built
 * once per kind (-DTP_KIND_<KIND>) as loom-<kind>-t<...>.so, for registry,
 * pipeline and CLI tests. It demonstrates nothing but the ABI: a parameter
 * of every type, create/destroy through the host table, a metric per
 * create, and a `fail` switch so tests can drive the create-failure path.
 * Every other REQUIRED op is a stub (stub_ops.h) that refuses.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/cache.h"
#include "loom/plugin.h"
#include "loom/quant.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/spec.h"
#include "stub_ops.h"
#include "test_plugin.h"

#if defined(TP_KIND_BACKEND)
#define TP_KIND LOOM_KIND_BACKEND
#define TP_NAME "tback"
#define TP_OPS_TYPE loom_backend_ops
#define TP_STUBS STUB_BACKEND_OPS
#elif defined(TP_KIND_EXECUTOR)
#define TP_KIND LOOM_KIND_EXECUTOR
#define TP_NAME "texec"
#define TP_OPS_TYPE loom_executor_ops
#define TP_STUBS STUB_EXECUTOR_OPS
#elif defined(TP_KIND_SCHEDULER)
#define TP_KIND LOOM_KIND_SCHEDULER
#define TP_NAME "tsched"
#define TP_OPS_TYPE loom_scheduler_ops
#define TP_STUBS STUB_SCHEDULER_OPS
#elif defined(TP_KIND_CACHE)
#define TP_KIND LOOM_KIND_CACHE
#define TP_NAME "tcache"
#define TP_OPS_TYPE loom_cache_ops
#define TP_STUBS STUB_CACHE_OPS
#elif defined(TP_KIND_QUANTIZER)
#define TP_KIND LOOM_KIND_QUANTIZER
#define TP_NAME "tquant"
#define TP_OPS_TYPE loom_quant_ops
#define TP_STUBS STUB_QUANTIZER_OPS
#elif defined(TP_KIND_SAMPLER)
#define TP_KIND LOOM_KIND_SAMPLER
#define TP_NAME "tsamp"
#define TP_OPS_TYPE loom_sampler_ops
#define TP_STUBS STUB_SAMPLER_OPS
#elif defined(TP_KIND_SPECULATOR)
#define TP_KIND LOOM_KIND_SPECULATOR
#define TP_NAME "tspec"
#define TP_OPS_TYPE loom_spec_ops
#define TP_STUBS STUB_SPECULATOR_OPS
#else
#error "build with -DTP_KIND_<KIND>"
#endif

static const char *const tp_policies[] = {"fcfs", "priority", "random", NULL};

static const loom_param tp_params[] = {
    {"size", LOOM_PARAM_INT, offsetof(tp_config, size), "8", 1, 1024, NULL, "an integer in [1, 1024]"},
    {"ratio", LOOM_PARAM_FLOAT, offsetof(tp_config, ratio), "0.5", 0, 1, NULL, "a fraction"},
    {"verbose", LOOM_PARAM_BOOL, offsetof(tp_config, verbose), "false", 1, 0, NULL, "a switch"},
    {"label", LOOM_PARAM_STRING, offsetof(tp_config, label), "none", 1, 0, NULL, "a string"},
    {"policy", LOOM_PARAM_ENUM, offsetof(tp_config, policy), "fcfs", 1, 0, tp_policies, "a choice"},
    {"fail", LOOM_PARAM_BOOL, offsetof(tp_config, fail), "false", 1, 0, NULL,
     "make create() fail (tests)"},
    {0},
};

typedef struct tp_self {
    const loom_host *host;
    tp_config cfg;
} tp_self;

static loom_status tp_create(const loom_host *host, const void *config, void **self,
                             loom_error *err) {
    const tp_config *cfg = config;
    if (cfg->fail)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "%s: asked to fail (label %s)",
                           TP_NAME, cfg->label);
    tp_self *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", TP_NAME);
    s->host = host;
    s->cfg = *cfg; /* config is borrowed only for the call */
    host->metric_add(host->ctx, "test." TP_NAME ".created", 1);
    host->metric_set(host->ctx, "test." TP_NAME ".size", (double)cfg->size);
    *self = s;
    return LOOM_OK;
}

static void tp_destroy(void *self) {
    tp_self *s = self;
    if (!s) return;
    s->host->metric_add(s->host->ctx, "test." TP_NAME ".destroyed", 1);
    s->host->free(s->host->ctx, s);
}

static const TP_OPS_TYPE tp_ops = {
    .struct_size = sizeof(TP_OPS_TYPE),
    .create = tp_create,
    .destroy = tp_destroy,
    TP_STUBS,
};

static const loom_component tp_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = TP_KIND,
    .name = TP_NAME,
    .summary = "test " TP_NAME " (does nothing)",
    .ops = &tp_ops,
    .params = tp_params,
    .config_size = sizeof(tp_config),
}};

static const loom_plugin_desc tp_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "test-" TP_NAME,
    .version = "0.0.1",
    .num_components = 1,
    .components = tp_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &tp_desc; }
