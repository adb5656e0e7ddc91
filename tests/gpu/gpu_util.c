/*
 * tests/gpu/gpu_util.c — see gpu_util.h.
 */
#include "gpu_util.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const loom_component *gpu_plugin_find(void **lib, const char *path, loom_kind kind,
                                      const char *name) {
    *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*lib) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return NULL;
    }
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(*lib, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = entry ? entry() : NULL;
    const loom_component *comp = NULL;
    for (uint32_t i = 0; d && i < d->num_components; i++)
        if (d->components[i].kind == kind && !strcmp(d->components[i].name, name))
            comp = &d->components[i];
    if (!comp) fprintf(stderr, "%s: no component '%s' of kind %d\n", path, name, (int)kind);
    return comp;
}

const loom_component *gpu_quantizer_find(void **lib, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/loom-quantizer-%s.so", dir, name, name);
    if (access(path, R_OK) != 0) snprintf(path, sizeof path, "%s/loom-quantizer-%s.so", dir, name);
    return gpu_plugin_find(lib, path, LOOM_KIND_QUANTIZER, name);
}

/* An override naming no parameter would silently test the default: stop. */
static void config_check_overrides(const loom_component *c, const char *const *overrides) {
    for (const char *const *o = overrides; o && *o; o++) {
        const loom_param *p = c->params;
        size_t kl = strcspn(*o, "=");
        while (p && p->key && !(strlen(p->key) == kl && !strncmp(*o, p->key, kl))) p++;
        if (!p || !p->key || (*o)[kl] != '=') {
            fprintf(stderr, "gpu_config_make: override '%s' names no parameter of %s (key=value)\n", *o, c->name);
            exit(2);
        }
    }
}

void *gpu_config_make(const loom_component *c, const char *const *overrides) {
    config_check_overrides(c, overrides);
    uint8_t *cfg = calloc(1, c->config_size + 16);
    for (const loom_param *p = c->params; p && p->key; p++) {
        const char *v = p->default_value;
        for (const char *const *o = overrides; o && *o; o++) {
            size_t kl = strlen(p->key);
            if (!strncmp(*o, p->key, kl) && (*o)[kl] == '=') v = *o + kl + 1;
        }
        if (!v) continue;
        uint8_t *f = cfg + p->offset;
        switch (p->type) {
        case LOOM_PARAM_BOOL: *(bool *)f = !strcmp(v, "true") || !strcmp(v, "1"); break;
        case LOOM_PARAM_INT: *(int64_t *)f = strtoll(v, NULL, 0); break;
        case LOOM_PARAM_FLOAT: *(double *)f = strtod(v, NULL); break;
        case LOOM_PARAM_STRING: snprintf((char *)f, LOOM_PARAM_STRING_MAX, "%s", v); break;
        case LOOM_PARAM_ENUM:
            for (int64_t i = 0; p->choices && p->choices[i]; i++)
                if (!strcmp(p->choices[i], v)) *(int64_t *)f = i;
            break;
        }
    }
    return cfg;
}

static uint64_t g_gpu_rng;

void gpu_rng_seed(uint64_t seed) { g_gpu_rng = seed; }

uint64_t gpu_rng_next(void) {
    uint64_t z = (g_gpu_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float gpu_rng_unif(float lo, float hi) {
    return lo + (hi - lo) * (float)((gpu_rng_next() >> 40) * (1.0 / 16777216.0));
}
