/*
 * tests/scheduler/sim.c — see sim.h: plugin loading and configs here, the
 * simulation itself in the conformance kit (conformance/sched_sim.c).
 */
#include "sim.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "plugin/registry.h"

/* ---------------------------------------------------------------- plugins */

const char *sched_plugin_path(const char *name) {
    const char *var = !strcmp(name, "continuous") ? "LOOM_SCHED_CONTINUOUS_SO"
                      : !strcmp(name, "static")   ? "LOOM_SCHED_STATIC_SO"
                                                  : NULL;
    cr_assert(var, "no such scheduler plugin in this tree: %s", name);
    const char *path = getenv(var);
    cr_assert(path && *path, "%s is not set (meson test sets it to the built .so)", var);
    return path;
}

void plugin_open(const char *path, loom_kind kind, sched_plugin *p) {
    memset(p, 0, sizeof *p);
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(p->dl, "dlopen %s: %s", path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(p->dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(entry, "%s exports no %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = entry();
    cr_assert(d && d->abi_major == LOOM_ABI_MAJOR && d->build_signature == LOOM_BUILD_SIGNATURE,
              "%s: bad descriptor", path);
    for (uint32_t i = 0; i < d->num_components; i++)
        if (d->components[i].kind == kind) p->comp = &d->components[i];
    cr_assert(p->comp, "%s has no component of kind %s", path, loom_kind_name(kind));
    p->ops = p->comp->ops;
}

void plugin_close(sched_plugin *p) {
    if (p->dl) dlclose(p->dl);
    memset(p, 0, sizeof *p);
}

static const loom_param *param_find(const loom_component *c, const char *key, size_t len) {
    for (const loom_param *p = c->params; p && p->key; p++)
        if (strlen(p->key) == len && !strncmp(p->key, key, len)) return p;
    return NULL;
}

static void param_set(const loom_param *p, void *cfg, const char *val) {
    char *at = (char *)cfg + p->offset;
    switch (p->type) {
    case LOOM_PARAM_BOOL: {
        bool b = !strcmp(val, "true") || !strcmp(val, "1");
        cr_assert(b || !strcmp(val, "false") || !strcmp(val, "0"), "%s: bad bool %s", p->key, val);
        memcpy(at, &b, sizeof b);
        break;
    }
    case LOOM_PARAM_INT: {
        char *end;
        int64_t v = strtoll(val, &end, 10);
        cr_assert(*val && !*end, "%s: bad int %s", p->key, val);
        memcpy(at, &v, sizeof v);
        break;
    }
    case LOOM_PARAM_FLOAT: {
        double v = strtod(val, NULL);
        memcpy(at, &v, sizeof v);
        break;
    }
    case LOOM_PARAM_STRING:
        snprintf(at, LOOM_PARAM_STRING_MAX, "%s", val);
        break;
    case LOOM_PARAM_ENUM: {
        int64_t idx = -1;
        for (int64_t i = 0; p->choices && p->choices[i]; i++)
            if (!strcmp(p->choices[i], val)) idx = i;
        cr_assert(idx >= 0, "%s: %s is not one of its choices", p->key, val);
        memcpy(at, &idx, sizeof idx);
        break;
    }
    }
}

void *config_build(const loom_component *comp, const char *overrides) {
    void *cfg = calloc(1, comp->config_size ? comp->config_size : 1);
    cr_assert(cfg);
    for (const loom_param *p = comp->params; p && p->key; p++) {
        cr_assert(p->default_value, "%s.%s has no default", comp->name, p->key);
        param_set(p, cfg, p->default_value);
    }
    const char *s = overrides ? overrides : "";
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        cr_assert(eq, "override '%.*s' has no '='", (int)len, s);
        const loom_param *p = param_find(comp, s, (size_t)(eq - s));
        cr_assert(p, "%s has no parameter '%.*s'", comp->name, (int)(eq - s), s);
        char val[128];
        snprintf(val, sizeof val, "%.*s", (int)(len - (size_t)(eq - s) - 1), eq + 1);
        param_set(p, cfg, val);
        s += len + (comma ? 1 : 0);
    }
    return cfg;
}

int64_t config_get_int(const loom_component *comp, const void *cfg, const char *key) {
    const loom_param *p = param_find(comp, key, strlen(key));
    cr_assert(p, "%s has no parameter %s", comp->name, key);
    const char *at = (const char *)cfg + p->offset;
    if (p->type == LOOM_PARAM_BOOL) {
        bool b;
        memcpy(&b, at, sizeof b);
        return b;
    }
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* ------------------------------------------------------------- simulation */

/* What the test owns next to the kit's simulation. */
typedef struct sim_owner {
    sched_plugin plug;
    void *cfg;
    bool own_host;           /* sim_free checks the host for leaks           */
} sim_owner;

uint64_t sim_rand(uint64_t *x) { return loom_sched_sim_rand(x); }

sim *sim_new(const sim_opts *o, const sim_req *reqs, int32_t n) {
    sim_owner *own = calloc(1, sizeof *own);
    cr_assert(own);
    const loom_host *host = o->host ? o->host : fake_host();
    own->own_host = !o->host;
    plugin_open(sched_plugin_path(o->plugin), LOOM_KIND_SCHEDULER, &own->plug);
    own->cfg = config_build(own->plug.comp, o->params);
    loom_sched_sim_opts ko = {
        .ops = own->plug.ops,
        .max_num_seqs = (int32_t)config_get_int(own->plug.comp, own->cfg, "max_num_seqs"),
        .max_batched_tokens = (int32_t)config_get_int(own->plug.comp, own->cfg, "max_batched_tokens"),
        .block_size = o->block_size,
        .num_blocks = o->num_blocks,
        .num_cpu_blocks = o->num_cpu_blocks,
        .prefix_tokens = o->prefix_tokens,
        .no_swap = o->no_swap,
        .cache_ops = o->cache_ops,
        .cache_self = o->cache_self,
        .seed = o->seed,
    };
    loom_error err = {0};
    cr_assert_eq(own->plug.ops->create(host, own->cfg, &ko.sched, &err), LOOM_OK, "create: %s", err.message);
    char why[512];
    sim *s = loom_sched_sim_new(&ko, reqs, n, why, sizeof why);
    cr_assert(s, "%s", why);
    s->user = own;
    return s;
}

void sim_free(sim *s) {
    if (!s) return;
    sim_owner *own = s->user;
    s->ops->destroy(s->sched);
    if (own->own_host)
        cr_expect_eq(fake_host_live_allocs(), 0, "scheduler leaked %ld host allocations", fake_host_live_allocs());
    plugin_close(&own->plug);
    free(own->cfg);
    free(own);
    loom_sched_sim_free(s);
}

const loom_sched_entry *sim_entry(const sim *s, loom_seq_id id) { return loom_sched_sim_entry(s, id); }

int32_t sim_step(sim *s) {
    int32_t n = 0;
    cr_assert(loom_sched_sim_step(s, &n), "%s", s->why);
    return n;
}

int64_t sim_run(sim *s, int64_t max_steps) {
    cr_assert(loom_sched_sim_run(s, max_steps), "%s", s->why);
    return s->step;
}
