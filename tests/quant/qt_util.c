/*
 * tests/quant/qt_util.c — see qt_util.h.
 */
#include "qt_util.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "rng.h"

const loom_component *qt_component(const char *env) {
    const char *path = getenv(env);
    cr_assert(path && path[0], "%s is not set (run through meson test)", env);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(dl, "dlopen(%s): %s", path, dlerror());
    loom_plugin_entry_fn fn = (loom_plugin_entry_fn)dlsym(dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(fn, "%s has no %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = fn();
    cr_assert(d && d->num_components == 1);
    cr_assert_eq(d->components[0].kind, LOOM_KIND_QUANTIZER);
    return &d->components[0];
}

static void qt_param_set(const loom_param *p, void *cfg, const char *v) {
    char *dst = (char *)cfg + p->offset;
    switch (p->type) {
    case LOOM_PARAM_BOOL: *(bool *)dst = !strcmp(v, "true"); break;
    case LOOM_PARAM_INT: *(int64_t *)dst = strtoll(v, NULL, 10); break;
    case LOOM_PARAM_FLOAT: *(double *)dst = strtod(v, NULL); break;
    case LOOM_PARAM_STRING: snprintf(dst, LOOM_PARAM_STRING_MAX, "%s", v); break;
    case LOOM_PARAM_ENUM: {
        int64_t i = 0;
        for (; p->choices[i]; i++)
            if (!strcmp(p->choices[i], v)) break;
        cr_assert(p->choices[i], "%s: '%s' is not a choice", p->key, v);
        *(int64_t *)dst = i;
        break;
    }
    }
}

void *qt_config(const loom_component *comp, const char *const *sets) {
    void *cfg = calloc(1, comp->config_size ? comp->config_size : 1);
    cr_assert(cfg);
    for (const loom_param *p = comp->params; p && p->key; p++) {
        cr_assert(p->default_value, "%s has no default", p->key);
        qt_param_set(p, cfg, p->default_value);
    }
    for (int i = 0; sets && sets[i]; i++) {
        const char *eq = strchr(sets[i], '=');
        cr_assert(eq, "bad set '%s'", sets[i]);
        const loom_param *p = comp->params;
        for (; p->key; p++)
            if (strlen(p->key) == (size_t)(eq - sets[i]) && !strncmp(p->key, sets[i], (size_t)(eq - sets[i])))
                break;
        cr_assert(p->key, "no parameter in '%s'", sets[i]);
        qt_param_set(p, cfg, eq + 1);
    }
    return cfg;
}

loom_status qt_create(const loom_component *comp, const char *const *sets, void **self,
                      loom_error *err) {
    void *cfg = qt_config(comp, sets);
    const loom_quant_ops *ops = comp->ops;
    loom_status st = ops->create(fake_host(), cfg, self, err);
    free(cfg);
    return st;
}

/* ---- fake model ---------------------------------------------------------- */

static const loom_tensor *qt_get(void *ctx, const char *name) {
    qt_model *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return &m->t[i];
    return NULL;
}
static int32_t qt_count(void *ctx) { return ((qt_model *)ctx)->n; }
static const loom_tensor *qt_at(void *ctx, int32_t i) {
    qt_model *m = ctx;
    return i >= 0 && i < m->n ? &m->t[i] : NULL;
}

void qt_model_init(qt_model *m) {
    memset(m, 0, sizeof *m);
    m->cfg.struct_size = sizeof m->cfg;
    snprintf(m->cfg.name, sizeof m->cfg.name, "qt-test");
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->cfg, .ctx = m,
                                .get = qt_get, .count = qt_count, .at = qt_at};
}

void qt_model_free(qt_model *m) {
    for (int i = 0; i < m->n; i++) free(m->owned[i]);
    m->n = 0;
}

loom_tensor *qt_model_add(qt_model *m, const char *name, loom_dtype dt, int ndim, int64_t d0,
                          int64_t d1, void *data, size_t nbytes, bool own) {
    cr_assert_lt(m->n, QT_MAX_TENSORS);
    int i = m->n++;
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    m->t[i] = (loom_tensor){.struct_size = sizeof(loom_tensor), .dtype = dt, .ndim = ndim,
                            .data = data, .nbytes = nbytes, .device = LOOM_DEVICE_HOST,
                            .name = m->names[i]};
    m->t[i].shape[0] = d0;
    if (ndim > 1) m->t[i].shape[1] = d1;
    m->owned[i] = own ? data : NULL;
    return &m->t[i];
}

loom_tensor *qt_model_add_f32(qt_model *m, const char *name, int64_t rows, int64_t cols,
                              double scale, bool outliers, void *rng) {
    test_rng *r = rng;
    float *w = malloc((size_t)(rows * cols) * sizeof(float));
    cr_assert(w);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = (float)(rng_normal(r) * scale);
    if (outliers)
        for (int64_t i = 0; i < rows * cols / 200 + 1; i++)
            w[rng_int(r, rows * cols)] = (float)(rng_normal(r) * scale * 8);
    return qt_model_add(m, name, LOOM_DTYPE_F32, 2, rows, cols, w,
                        (size_t)(rows * cols) * sizeof(float), true);
}

double qt_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
