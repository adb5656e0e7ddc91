/*
 * plugins/backend/common/kv_groups.c — see kv_groups.h.
 */
#include "kv_groups.h"

#include <string.h>

int32_t loom_kv_layer_window(const loom_model_config *c, int32_t layer) {
    bool local = c->sliding_window > 0 && c->global_every > 0 && (layer + 1) % c->global_every != 0;
    return local ? c->sliding_window : 0;
}

void loom_kv_groups_plan(const loom_model_config *c, int32_t layer0, int32_t n, loom_kv_groups *out,
                         int32_t *layer_group, int32_t *layer_slot) {
    int32_t nglob = 0, nloc = 0;
    for (int32_t i = 0; i < n; i++) {
        if (loom_kv_layer_window(c, layer0 + i) > 0) nloc++;
        else nglob++;
    }
    uint32_t size = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = size;
    out->num_layers = n;
    if (nloc == 0 || nglob == 0) { /* every layer attends alike: one table */
        out->num_groups = 1;
        out->layers_per_block = n;
        out->window[0] = nloc ? c->sliding_window : 0;
        for (int32_t i = 0; i < n; i++) {
            if (layer_group) layer_group[i] = 0;
            if (layer_slot) layer_slot[i] = i;
        }
        return;
    }
    int32_t lpb = nglob;
    while (1 + (nloc + lpb - 1) / lpb > LOOM_KV_GROUPS_MAX) lpb++;
    out->layers_per_block = lpb;
    out->num_groups = 1 + (nloc + lpb - 1) / lpb;
    for (int32_t g = 1; g < out->num_groups; g++) out->window[g] = c->sliding_window;
    for (int32_t i = 0, kg = 0, kl = 0; i < n; i++) {
        bool local = loom_kv_layer_window(c, layer0 + i) > 0;
        int32_t k = local ? kl++ : kg++;
        if (layer_group) layer_group[i] = local ? 1 + k / lpb : 0;
        if (layer_slot) layer_slot[i] = local ? k % lpb : k;
    }
}
