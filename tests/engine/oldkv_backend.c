/*
 * tests/engine/oldkv_backend.c — backend "oldkv", a test plugin: the cpu
 * backend (dlopened from LOOM_TEST_CPU_BACKEND, its path at build time)
 * presented as a plugin built against ABI 2.7 — its descriptor says 2.7
 * and its ops table is a copy exactly as long as 2.7's, ending before
 * kv_default_dtype (a global of that size: ASan flags a read past it) — so
 * the engine tests can check that such a backend still loads and runs, and
 * that nothing hands its KV on while no one names the pools' type.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/plugin.h"

#define OLDKV_OPS_BYTES offsetof(loom_backend_ops, kv_default_dtype)

static _Alignas(loom_backend_ops) unsigned char oldkv_ops[OLDKV_OPS_BYTES];
static loom_component oldkv_component;
static loom_plugin_desc oldkv_desc;

/* The loader calls this once per registry, from the thread that scans. */
LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) {
    if (oldkv_desc.struct_size) return &oldkv_desc;
    void *so = dlopen(LOOM_TEST_CPU_BACKEND, RTLD_NOW | RTLD_LOCAL); /* kept open: its ops are ours */
    const loom_plugin_desc *(*entry)(void) =
        so ? (const loom_plugin_desc *(*)(void))dlsym(so, "loom_plugin_entry") : NULL;
    const loom_plugin_desc *cpu = entry ? entry() : NULL;
    const loom_component *c = NULL;
    for (uint32_t i = 0; cpu && i < cpu->num_components; i++)
        if (cpu->components[i].kind == LOOM_KIND_BACKEND) c = &cpu->components[i];
    if (!c) return NULL; /* the loader names a plugin whose entry gives nothing */
    memcpy(oldkv_ops, c->ops, OLDKV_OPS_BYTES);
    const uint32_t size = (uint32_t)OLDKV_OPS_BYTES;
    memcpy(oldkv_ops + offsetof(loom_backend_ops, struct_size), &size, sizeof size);
    oldkv_component = *c;
    oldkv_component.name = "oldkv";
    oldkv_component.summary = "the cpu backend as built against ABI 2.7 (tests)";
    oldkv_component.ops = oldkv_ops;
    oldkv_desc = (loom_plugin_desc){LOOM_PLUGIN_DESC_HEADER, .name = "oldkv-backend", .version = "0.0.0",
                                    .num_components = 1, .components = &oldkv_component};
    oldkv_desc.abi_minor = 7;
    return &oldkv_desc;
}
