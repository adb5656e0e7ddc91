/*
 * plugins/cache/paged/paged_entry.c — the descriptor of loom-cache-paged:
 * one component, kind cache, name "paged". Pure data; the manager itself is
 * in paged.c (kept apart so tests can link it without this entry symbol).
 */
#include "paged.h"

static const loom_component paged_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_CACHE,
    .name = "paged",
    .summary = "paged KV blocks: refcounts, copy-on-write, prefix caching (LRU), host swap",
    .ops = &loom_paged_ops,
    .params = loom_paged_params,
    .config_size = sizeof(loom_paged_config),
}};

static const loom_plugin_desc paged_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-cache-paged",
    .version = "0.1.0",
    .num_components = 1,
    .components = paged_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &paged_desc; }
