/*
 * conformance/cf_util.c — the pieces of cf_kit.h every check file uses:
 * failure and note recording, configs bound by the host's own binder (so a
 * config the kit builds is one a pipeline file could have produced),
 * create/destroy with leak accounting, the kit's random numbers.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "config/config.h"
#include "plugin/registry.h"

/* ------------------------------------------------------------- recording */

bool cf_fail(cf_run *r, const char *fmt, ...) {
    if (r->failed) return false;
    r->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    return false;
}

bool cf_skip(cf_run *r, const char *fmt, ...) {
    if (r->failed) return false;
    r->skipped = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    return true;
}

void cf_note(cf_run *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
}

void cf_where(cf_run *r, const char *fmt, ...) {
    if (!r->where) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->where, CF_WHERE_MAX, fmt, ap);
    va_end(ap);
}

int64_t cf_iters(const cf_run *r, int64_t full, int64_t min) {
    int64_t n = r->quick ? full / 5 : full;
    return n < min ? min : n;
}

int cf_add(cf_check *out, int n, int cap, cf_check_fn fn, const void *arg, const char *fmt, ...) {
    if (n >= cap) return n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out[n].name, sizeof out[n].name, fmt, ap);
    va_end(ap);
    out[n].fn = fn;
    out[n].arg = arg;
    return n + 1;
}

/* ------------------------------------------------------------ randomness */

cf_rng cf_rng_make(uint64_t seed) { return (cf_rng){seed ? seed : 0x9E3779B97F4A7C15ull}; }

uint64_t cf_rng_next(cf_rng *g) { /* splitmix64 */
    uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int32_t cf_rng_below(cf_rng *g, int32_t n) { return n <= 1 ? 0 : (int32_t)(cf_rng_next(g) % (uint64_t)n); }

double cf_rng_unif(cf_rng *g) { return (double)(cf_rng_next(g) >> 11) * 0x1.0p-53; }

double cf_rng_normal(cf_rng *g) {
    double u1 = cf_rng_unif(g), u2 = cf_rng_unif(g);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

uint64_t cf_seed_mix(uint64_t base, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; p && *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    cf_rng g = cf_rng_make(base ^ h);
    return cf_rng_next(&g);
}

/* --------------------------------------------------------------- configs */

bool cf_declares(const loom_component *c, const char *key) {
    for (const loom_param *p = c->params; p && p->key; p++)
        if (!strcmp(p->key, key)) return true;
    return false;
}

/* Apply the declared entries of csv to root. */
static bool apply_csv(const loom_component *c, const char *csv, loom_cfg_node *root, loom_diag *d) {
    const char *s = csv ? csv : "";
    int idx = 0;
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char item[LOOM_PARAM_STRING_MAX + 64];
        snprintf(item, sizeof item, "%.*s", (int)len, s);
        char *eq = strchr(item, '=');
        if (eq) {
            *eq = '\0';
            bool known = cf_declares(c, item);
            *eq = '=';
            if (known && loom_cfg_set_override(root, item, ++idx, d) != LOOM_OK) return false;
        }
        s += len + (comma ? 1 : 0);
    }
    return true;
}

void *cf_config(cf_run *r, const char *csv, char *why, size_t cap) {
    const loom_component *c = r->comp;
    loom_diag d;
    loom_diag_init(&d);
    void *cfg = calloc(1, c->config_size ? c->config_size : 1);
    loom_cfg_node *root = loom_cfg_new_map("plugin-test");
    bool ok = cfg && root && apply_csv(c, csv, root, &d);
    for (int i = 0; ok && i < r->opts->num_sets; i++)
        ok = loom_cfg_set_override(root, r->opts->sets[i], i + 1, &d) == LOOM_OK;
    if (ok) ok = loom_cfg_bind(root, c->name, c->params, NULL, cfg, c->config_size, &d);
    if (!ok) {
        loom_error e = {0};
        loom_diag_to_error(&d, LOOM_ERR_INVALID, &e);
        snprintf(why, cap, "%s", e.message[0] ? e.message : "out of memory building the config");
        free(cfg);
        cfg = NULL;
    }
    loom_cfg_free(root);
    loom_diag_free(&d);
    return cfg;
}

bool cf_config_int(const loom_component *c, const void *cfg, const char *key, int64_t *out) {
    for (const loom_param *p = c->params; p && p->key; p++) {
        if (strcmp(p->key, key)) continue;
        const char *at = (const char *)cfg + p->offset;
        if (p->type == LOOM_PARAM_BOOL) {
            bool b;
            memcpy(&b, at, sizeof b);
            *out = b;
            return true;
        }
        if (p->type != LOOM_PARAM_INT && p->type != LOOM_PARAM_ENUM) return false;
        memcpy(out, at, sizeof *out);
        return true;
    }
    return false;
}

void cf_config_label(const loom_component *c, const char *csv, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    const char *s = csv ? csv : "";
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', n);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq ? (size_t)(eq - s) : n), s);
        if (eq && cf_declares(c, key) && len + n + 2 < cap) {
            len += (size_t)snprintf(buf + len, cap - len, "%s%.*s", len ? "," : "", (int)n, s);
        }
        s += n + (comma ? 1 : 0);
    }
}

/* ---------------------------------------------------------- create/destroy */

bool cf_create(cf_run *r, const char *csv, void **self) {
    char why[LOOM_ERROR_MSG_MAX];
    *self = NULL;
    void *cfg = cf_config(r, csv, why, sizeof why);
    if (!cfg) return cf_fail(r, "cannot build a config for %s: %s", r->comp->name, why);
    const loom_ops_head *ops = r->comp->ops;
    long before = cf_host_live();
    loom_error err = {0};
    void *inst = NULL;
    cf_where(r, "create()");
    loom_status st = ops->create(cf_host(), cfg, &inst, &err);
    free(cfg);
    if (st != LOOM_OK) {
        long left = cf_host_live() - before;
        if (left) return cf_fail(r, "create() failed (%s) and left %ld host allocations behind", err.message, left);
        if (st == LOOM_ERR_DEVICE) { /* e.g. a GPU backend on a machine without one */
            cf_skip(r, "create() found no usable device: %s", err.message);
            return false;
        }
        return cf_fail(r, "create() failed with the declared defaults%s%s: %s", csv && *csv ? " and " : "",
                       csv ? csv : "", err.message[0] ? err.message : "(no message)");
    }
    if (!inst) return cf_fail(r, "create() returned LOOM_OK but left *self NULL");
    *self = inst;
    return true;
}

bool cf_destroy(cf_run *r, void *self) {
    const loom_ops_head *ops = r->comp->ops;
    cf_where(r, "destroy()");
    ops->destroy(self);
    const char *bad = cf_host_violation();
    CF_ENSURE(r, !bad, "%s", bad);
    long live = cf_host_live();
    CF_ENSURE(r, live == 0, "destroy() left %ld host allocation%s unfreed (a leak through host->alloc)",
              live, live == 1 ? "" : "s");
    return true;
}
