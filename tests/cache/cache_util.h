/*
 * tests/cache/cache_util.h — helpers shared by the cache-manager tests:
 * fill a config struct from a component's declared defaults (as the host
 * would), create + init a manager against the fake host with a fake
 * backend, and build loom_seq_info views.
 */
#ifndef LOOM_TEST_CACHE_UTIL_H
#define LOOM_TEST_CACHE_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/cache.h"

/* Bytes the fake backend reports per block: 1 KiB per token. */
#define TC_BYTES_PER_TOKEN 1024

typedef struct tc_cache {
    const loom_cache_ops *ops;
    void *self;
    loom_kv_layout layout;
} tc_cache;

/* Parse every default_value of `params` into `cfg` (returns false and
 * prints the key when one does not parse or is out of bounds). */
bool tc_apply_defaults(const loom_param *params, void *cfg, size_t cfg_size);

/* A loom_cache_init for a fake backend with `free_bytes` free. */
loom_cache_init tc_init_desc(size_t free_bytes, int32_t max_model_len, bool can_swap);

/* create + init; returns the status of the first failing step (err filled). */
loom_status tc_open(tc_cache *c, const loom_cache_ops *ops, const void *cfg,
                    const loom_cache_init *init, loom_error *err);
void tc_close(tc_cache *c);

/* A read-only view of a sequence (tokens borrowed). */
loom_seq_info tc_seq(loom_seq_id id, const int32_t *tokens, int32_t num_tokens, int32_t num_draft);

/* Convenience: table of seq into out (cap 1024), returns count. */
int32_t tc_table(const tc_cache *c, loom_seq_id id, int32_t *out);
/* Drain queued ops into out (cap 4096), returns count. */
int32_t tc_take_ops(const tc_cache *c, loom_block_op *out);

#endif
