/*
 * plugins/backend/common/kv_groups.h — how a backend groups a model's
 * layers into block-table groups (loom/backend.h, "Block-table groups"):
 * which layers attend to a sliding window, the proposal kv_groups()
 * returns, and each held layer's group and pool slot once the cache took
 * it. Shared by the backends so they group alike; pure arithmetic on the
 * model config, no allocation.
 */
#ifndef LOOM_BACKEND_COMMON_KV_GROUPS_H
#define LOOM_BACKEND_COMMON_KV_GROUPS_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/model.h"

/* Tokens layer l sees (its own position included): the model's window for
 * a local layer, 0 (the whole context) for a global one. */
int32_t loom_kv_layer_window(const loom_model_config *c, int32_t layer);

/* The grouping of the held layers [layer0, layer0 + n): global layers in
 * group 0, windowed ones in layer order in groups of layers_per_block =
 * the number of global layers (more when that would exceed
 * LOOM_KV_GROUPS_MAX groups), so a block of any group holds as many
 * layers; one group when the layers all attend alike. Fills `out` and,
 * when non-NULL, layer_group / layer_slot (n each) with each held layer's
 * group and pool slot (slot = its layer index with one group). */
void loom_kv_groups_plan(const loom_model_config *c, int32_t layer0, int32_t n, loom_kv_groups *out,
                         int32_t *layer_group, int32_t *layer_slot);

#endif
