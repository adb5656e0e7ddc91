/*
 * tests/scheduler/fake_cache.h — a cache manager small enough to reason
 * about, for scheduler tests: a counter of free device blocks and one of
 * free host blocks, per-sequence block counts, NO_SPACE when a request does
 * not fit. It also checks how it is called (double acquire_prefix, allocate
 * on a swapped-out sequence, allocate beyond the sequence's tokens) and
 * counts violations instead of crashing, so tests can assert there were none.
 *
 * Sequence ids must be in [0, max_ids). No block ids, no data movement.
 */
#ifndef LOOM_TEST_FAKE_CACHE_H
#define LOOM_TEST_FAKE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/cache.h"

typedef struct fake_cache_seq {
    int32_t blocks;          /* device blocks held                          */
    int32_t cpu_blocks;      /* host blocks held (swapped out)              */
    int32_t prefix;          /* tokens the last acquire_prefix returned     */
    bool swapped;
} fake_cache_seq;

typedef struct fake_cache {
    int32_t block_size;      /* tokens per block                            */
    int32_t num_blocks, free_blocks;
    int32_t num_cpu_blocks, free_cpu_blocks;
    bool swap_supported;     /* false: swap_out answers UNSUPPORTED         */
    int32_t prefix_tokens;   /* acquire_prefix reports up to this many hits */
    loom_status fail_allocate; /* != OK: allocate answers this (hard error) */
    int32_t max_ids;
    fake_cache_seq *seqs;    /* (max_ids)                                   */
    int64_t violations;      /* misuse seen; last one described below       */
    char violation[256];
    int64_t nospace, swaps_out, swaps_in, acquires;
    int32_t peak_used;
} fake_cache;

extern const loom_cache_ops fake_cache_ops;

fake_cache *fake_cache_new(int32_t block_size, int32_t num_blocks, int32_t num_cpu_blocks,
                           int32_t max_ids);
void fake_cache_free(fake_cache *fc);

#endif
