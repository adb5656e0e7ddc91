/*
 * plugins/cache/contiguous/contiguous_entry.c — the descriptor of
 * loom-cache-contiguous: one component, kind cache, name "contiguous".
 * Pure data; the manager is in contiguous.c.
 */
#include "contiguous.h"

static const loom_component contiguous_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_CACHE,
    .name = "contiguous",
    .summary = "baseline: one contiguous max_model_len region per sequence, no sharing",
    .ops = &loom_contiguous_ops,
    .params = loom_contiguous_params,
    .config_size = sizeof(loom_contiguous_config),
}};

static const loom_plugin_desc contiguous_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-cache-contiguous",
    .version = "0.1.0",
    .num_components = 1,
    .components = contiguous_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &contiguous_desc; }
