/*
 * plugins/cache/contiguous/contiguous.h — private to the `contiguous` cache
 * plugin and its tests: config struct, ops table, debug hooks. Not part of
 * the SDK; never installed. contiguous.c holds the manager and
 * contiguous_entry.c the descriptor, so tests can link the manager without
 * a second loom_plugin_entry.
 */
#ifndef LOOM_PLUGIN_CACHE_CONTIGUOUS_H
#define LOOM_PLUGIN_CACHE_CONTIGUOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/cache.h"

/* Filled by the host from loom_contiguous_params. */
typedef struct loom_contiguous_config {
    int64_t block_size;      /* tokens per block, >= 1                        */
    double memory_fraction;  /* (0, 1]: share of device_free_bytes            */
    int64_t num_blocks;      /* > 0: exact device pool size (overrides memory) */
    double memory_gib;       /* > 0: absolute device budget, GiB               */
} loom_contiguous_config;

extern const loom_cache_ops loom_contiguous_ops;
extern const loom_param loom_contiguous_params[];

/* ---------------------------------------------------------- debug hooks */

/* Blocks per sequence region: ceil(max_model_len / block_size). */
int32_t loom_contiguous_debug_region(void *self);
/* First block of seq's region, -1 when it holds none (or is unknown). */
int32_t loom_contiguous_debug_start(void *self, loom_seq_id seq);
/* Check: regions disjoint, in range, and exactly the used blocks. */
bool    loom_contiguous_debug_check(void *self, char *msg, size_t msg_size);

#endif
