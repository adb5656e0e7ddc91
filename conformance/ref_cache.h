/*
 * conformance/ref_cache.h — a cache manager small enough to reason about,
 * for driving schedulers (the kit's scheduler checks and the schedulers'
 * own tests): a free list of device block ids with reference counts,
 * per-sequence block tables, forks that share blocks (a write into a shared
 * block takes a fresh one, copy-on-write), a counter of host blocks for
 * swap, and "prefix hits" that hand a fresh sequence up to prefix_tokens
 * worth of blocks. NO_SPACE when a request does not fit.
 *
 * It also checks how it is called — acquire_prefix on a sequence that
 * holds blocks (a second acquire, or a forked sample that arrived with
 * num_computed > 0), allocate on a swapped-out sequence or beyond the
 * sequence's tokens, swap_in of a resident sequence — and counts
 * violations instead of crashing, so a check can say which rule of
 * loom/scheduler.h a scheduler broke.
 *
 * Sequence ids must be in [0, max_ids). No data moves: take_block_ops
 * always answers 0.
 */
#ifndef LOOM_CONFORMANCE_REF_CACHE_H
#define LOOM_CONFORMANCE_REF_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/cache.h"

typedef struct loom_ref_cache_seq {
    int32_t *table;          /* (cap) device block ids                      */
    int32_t blocks;          /* device blocks held                          */
    int32_t cap;
    int32_t cpu_blocks;      /* host blocks held (swapped out)              */
    int32_t prefix;          /* tokens the last acquire_prefix returned     */
    bool swapped;
} loom_ref_cache_seq;

typedef struct loom_ref_cache {
    int32_t block_size;      /* tokens per block                            */
    int32_t num_blocks, free_blocks;
    int32_t num_cpu_blocks, free_cpu_blocks;
    bool swap_supported;     /* false: swap_out answers UNSUPPORTED         */
    int32_t prefix_tokens;   /* acquire_prefix reports up to this many hits */
    loom_status fail_allocate; /* != OK: allocate answers this (hard error) */
    int32_t max_ids;
    loom_ref_cache_seq *seqs;  /* (max_ids)                                 */
    int32_t *refs;           /* (num_blocks) references per block           */
    int32_t *free_list;      /* (num_blocks) free ids, popped from the end  */
    int64_t violations;      /* misuse seen; the first one described below  */
    char violation[256];
    int64_t nospace, swaps_out, swaps_in, acquires, forks, cows;
    int32_t peak_used;
} loom_ref_cache;

extern const loom_cache_ops loom_ref_cache_ops;

/* NULL on out of memory. */
loom_ref_cache *loom_ref_cache_new(int32_t block_size, int32_t num_blocks, int32_t num_cpu_blocks,
                                   int32_t max_ids);
void loom_ref_cache_free(loom_ref_cache *rc);

#endif
