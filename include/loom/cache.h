/*
 * loom/cache.h — KV-cache managers: the block pool, per-sequence block
 * tables, reference counts, copy-on-write, prefix caching, swap.
 *
 * A cache manager deals in block ids and counts only; the backend owns the
 * tensors (see loom/backend.h for the layout). Running out of blocks is an
 * ordinary result (LOOM_ERR_NO_SPACE) that makes the scheduler preempt, not
 * an error. Data movement the manager decides (copy-on-write copies, swaps)
 * is queued and handed to the core by take_block_ops(), which runs it on the
 * backend before the next forward pass.
 *
 * All functions are [engine]: called only from the step-loop thread.
 */
#ifndef LOOM_CACHE_H
#define LOOM_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"
#include "loom/seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the core tells a cache manager so it can size its pools. */
typedef struct loom_cache_init {
    uint32_t struct_size;
    /* Bytes one block of `block_size` tokens takes in the backend, all layers. */
    size_t (*block_bytes)(void *ctx, int32_t block_size);
    void *ctx;
    size_t device_free_bytes;  /* backend memory free after weights         */
    size_t device_total_bytes; /* backend memory capacity                   */
    int32_t max_model_len;     /* longest sequence, tokens                  */
    int32_t max_num_seqs;      /* the scheduler's concurrency cap           */
    bool backend_can_swap;     /* backend implements swap_blocks            */
} loom_cache_init;

typedef enum loom_block_op_kind {
    LOOM_BLOCK_COPY = 0,       /* device block -> device block (CoW)        */
    LOOM_BLOCK_SWAP_OUT = 1,   /* device block -> host block                */
    LOOM_BLOCK_SWAP_IN = 2,    /* host block -> device block                */
} loom_block_op_kind;

typedef struct loom_block_op {
    loom_block_op_kind kind;
    int32_t src;
    int32_t dst;
} loom_block_op;

/* Grows only at its end. */
typedef struct loom_cache_stats {
    uint32_t struct_size;
    int32_t num_blocks;        /* device pool size                          */
    int32_t free_blocks;       /* unreferenced (incl. evictable cached)     */
    int32_t cached_blocks;     /* unreferenced blocks still in prefix cache */
    int32_t num_cpu_blocks;
    int32_t free_cpu_blocks;
    int32_t block_size;
    int64_t prefix_queries;    /* tokens looked up in the prefix cache      */
    int64_t prefix_hits;       /* of which found computed                   */
    int64_t evictions;         /* cached blocks reused for new data         */
    int64_t swaps_out;         /* blocks moved to host                      */
    int64_t swaps_in;
    int64_t cow_copies;
    int32_t peak_used_blocks;  /* high-water mark of referenced blocks      */
} loom_cache_stats;

typedef struct loom_cache_ops {
    uint32_t struct_size;
    loom_status (*create)(const loom_host *host, const void *config, void **self, loom_error *err);
    void (*destroy)(void *self);

    /* Size the pools and fill `layout` (block_size, num_blocks,
     * num_cpu_blocks, dtype left as the core set it). Called once. */
    loom_status (*init)(void *self, const loom_cache_init *init, loom_kv_layout *layout,
                        loom_error *err);

    /* Before a sequence's first allocation (and again after a recompute
     * preemption): take references on cached blocks holding a prefix of
     * seq->tokens and return how many tokens that covers (a multiple of
     * block_size, at most num_tokens - 1 so one token is always computed).
     * Returns 0 when prefix caching is off or nothing matches. */
    int32_t (*acquire_prefix)(void *self, const loom_seq_info *seq);

    /* Make sure tokens [0, num_tokens) of seq have slots. On NO_SPACE
     * nothing changed. A block that becomes full is registered in the
     * prefix cache under the hash of its tokens chained with its parent's.
     * Writing into a block shared with another sequence queues a copy. */
    loom_status (*allocate)(void *self, const loom_seq_info *seq, int32_t num_tokens,
                            loom_error *err);
    /* Keep only slots for tokens [0, num_tokens): rolls back rejected drafts. */
    void (*truncate)(void *self, const loom_seq_info *seq, int32_t num_tokens);
    /* Drop all of seq's references. Full blocks stay in the prefix cache. */
    void (*free)(void *self, loom_seq_id seq);
    /* child shares every block of parent (refcounts up). */
    loom_status (*fork)(void *self, loom_seq_id parent, loom_seq_id child, loom_error *err);
    /* Move seq's blocks to host (OUT) or back (IN). NO_SPACE when the
     * target pool is full; UNSUPPORTED when there is no host pool. */
    loom_status (*swap_out)(void *self, loom_seq_id seq, loom_error *err);
    loom_status (*swap_in)(void *self, loom_seq_id seq, loom_error *err);

    /* seq's block table: writes up to `cap` ids, returns how many it has. */
    int32_t (*block_table)(void *self, loom_seq_id seq, int32_t *out, int32_t cap);
    /* Pending copies/swaps in order: writes up to `cap`, returns how many
     * were written (call again until 0). */
    int32_t (*take_block_ops)(void *self, loom_block_op *out, int32_t cap);
    /* Blocks that allocate() could hand out now (free + evictable). */
    int32_t (*num_free_blocks)(void *self);
    void (*stats)(void *self, loom_cache_stats *out);
    /* since ABI 1.1 — add new members below this line only */
} loom_cache_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CACHE_H */
