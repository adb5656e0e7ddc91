/*
 * core/plugin/host_rules.h — the rules every plugin of a kind follows, kept
 * in the host so a fix reaches every plugin without a rebuild: what a valid
 * batch and a usable model are, how a model splits over tensor-parallel
 * ranks, what forward_topk() computes, and the per-sequence random stream.
 * Plugins call them through the host table (loom/plugin.h, whose comments
 * are the contract); the core and the tests call them directly.
 *
 * Check functions write a reason into `why` (cap bytes, no "plugin x:"
 * prefix) and return the status to pass on. All are [any].
 */
#ifndef LOOM_CORE_PLUGIN_HOST_RULES_H
#define LOOM_CORE_PLUGIN_HOST_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "loom/plugin.h"

loom_status loom_check_model_config(const loom_model_config *c, char *why, size_t cap);
loom_status loom_check_load(bool already_loaded, const loom_model_view *m, const loom_comm *comm, char *why,
                            size_t cap);
loom_status loom_check_batch(const loom_batch *b, const float *logits, bool logits_optional, int32_t block_size,
                             int32_t num_blocks, int32_t vocab, int32_t max_positions, char *why, size_t cap);
loom_status loom_model_tensor_check(const loom_model_view *m, const char *name, int64_t d0, int64_t d1,
                                    bool required, const loom_tensor **out, char *why, size_t cap);
const loom_tensor *loom_model_packed_qweight(const loom_model_view *m, const loom_tensor *t);
loom_status loom_shard_plan(const loom_model_config *c, int32_t rank, int32_t size, loom_shard *s, char *why,
                            size_t cap);
void        loom_logits_topk_row(const float *row, int32_t vocab, int32_t k, int32_t *ids, float *vals,
                                 float *lse);
void        loom_logits_topk_masked_row(const float *row, int32_t vocab, const uint32_t *allowed, int32_t k,
                                        int32_t *ids, float *vals, float *lse);

void        loom_rng_seed(uint64_t state[4], uint64_t seed);
uint64_t    loom_rng_next(uint64_t state[4]);
double      loom_rng_uniform(uint64_t state[4]);

#endif
