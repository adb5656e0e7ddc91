/*
 * plugins/speculator/ngram/ngram_entry.c — the descriptor of
 * loom-speculator-ngram: one component, kind speculator, name "ngram". Pure
 * data; the drafter is in ngram.c (kept apart so tests can link it without
 * this entry symbol).
 */
#include "ngram.h"

static const loom_component ngram_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SPECULATOR,
    .name = "ngram",
    .summary = "prompt-lookup drafts: match the last n tokens earlier in the context, propose what "
               "followed (no extra model; adaptive k)",
    .ops = &loom_ngram_ops,
    .params = loom_ngram_params,
    .config_size = sizeof(loom_ngram_config),
}};

static const loom_plugin_desc ngram_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-speculator-ngram",
    .version = "0.1.0",
    .num_components = 1,
    .components = ngram_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &ngram_desc; }
