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
 * The contract, in full:
 *
 * References. Each sequence holds one reference on every block of its
 * table. acquire_prefix takes references on cached blocks; allocate takes
 * new ones; truncate drops the tail's; free drops them all (full blocks
 * stay in the prefix cache, unreferenced, until evicted); swap_out moves
 * them to the host pool (and swap_in back). A block is free again exactly
 * when its count reaches zero: no call leaks or double-frees a reference,
 * whatever order the engine and the scheduler make them in (the
 * conformance kit, `loom plugin-test`, checks this on random traffic).
 *
 * Failure. allocate, fork, swap_out and swap_in change nothing when they
 * fail: after NO_SPACE the sequence holds exactly what it held before —
 * including references taken by an earlier acquire_prefix, which stay until
 * the sequence is freed (the scheduler decides; loom/scheduler.h).
 *
 * Who calls what: the scheduler calls acquire_prefix, allocate, free (to
 * preempt by recompute), swap_out and swap_in, through its environment;
 * the core calls fork (n > 1 samples), truncate (rejected drafts), free
 * (finished sequences), block_table and group_table, take_block_ops,
 * num_free_blocks (to budget drafts) and stats.
 *
 * Stats: the core sets out->struct_size and zeroes the rest; the manager
 * fills the fields that struct_size covers.
 *
 * Groups and windows (since ABI 2.4; loom/backend.h, "Block-table groups").
 * init() may get the backend's proposal of block-table groups; a manager
 * that takes it (layout->num_groups = G) keeps G tables per sequence, all
 * as long as the sequence (entry j covers tokens [j*bs, (j+1)*bs)), each
 * new table position taking one block in every group. In a group with a
 * window W, allocate() releases the blocks no query of the sequence reads
 * again — block j once (j+1)*bs <= seq->num_computed - W + 1 — and leaves
 * -1 in their entries; blocks it would release count as free towards that
 * same allocate(). So the engine never truncates below the num_computed
 * its last allocate() saw (it only rolls back drafts). acquire_prefix hits
 * only prefixes whose every needed block is cached: all blocks in a
 * global group, the blocks inside the window of the first token to compute
 * in a windowed one. fork shares and swap moves the blocks still held.
 * Block ops stay per block id: with G > 1 an id is one block of one group.
 * A manager that ignores the proposal leaves layout->num_groups at 0 and
 * keeps one table for every layer, as before.
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

/* What the core tells a cache manager so it can size its pools. Grows only
 * at its end. */
typedef struct loom_cache_init {
    uint32_t struct_size;
    /* Bytes one block of `block_size` tokens takes in the backend, all
     * layers; 0 when the backend cannot use that block size. */
    size_t (*block_bytes)(void *ctx, int32_t block_size);
    void *ctx;
    size_t device_free_bytes;  /* backend memory free after weights         */
    size_t device_total_bytes; /* backend memory capacity                   */
    int32_t max_model_len;     /* longest sequence, tokens                  */
    bool backend_can_swap;     /* backend implements swap_blocks            */
    /* since ABI 2.4 — add new members below this line only */
    const loom_kv_groups *groups; /* the backend's block-table groups, borrowed
                                  for init(); NULL = one table, no window   */
} loom_cache_init;

typedef enum loom_block_op_kind {
    LOOM_BLOCK_COPY = 0,       /* device block -> device block (CoW)        */
    LOOM_BLOCK_SWAP_OUT = 1,   /* device block -> host block                */
    LOOM_BLOCK_SWAP_IN = 2,    /* host block -> device block                */
} loom_block_op_kind;

/* An array element: frozen for the major version. */
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
    /* since ABI 2.4 — add new members below this line only */
    int32_t num_groups;        /* block tables per sequence (>= 1)          */
    int32_t peak_seq_blocks;   /* most blocks one sequence held at once,
                                  all its groups together                   */
    int64_t block_bytes;       /* backend bytes one block id takes (0 when
                                  unknown): peak KV use is peak_used_blocks
                                  times this                                */
} loom_cache_stats;

typedef struct loom_cache_ops {
    uint32_t struct_size;
    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    loom_destroy_fn *destroy;     /* REQUIRED                                 */

    /* REQUIRED. Size the pools and fill `layout` (block_size, num_blocks,
     * num_cpu_blocks; dtype stays as the core set it). Called once, before
     * any other call but stats. */
    loom_status (*init)(void *self, const loom_cache_init *init, loom_kv_layout *layout,
                        loom_error *err);

    /* REQUIRED. For a sequence that holds no blocks (before its first
     * allocation, and again after a recompute preemption): take references
     * on cached blocks holding a prefix of seq->tokens and return how many
     * tokens that covers — a multiple of block_size, at most
     * num_tokens - 1 so one token is always computed, never covering
     * drafts. 0 when prefix caching is off, nothing matches, or the
     * sequence already holds blocks. */
    int32_t (*acquire_prefix)(void *self, const loom_seq_info *seq);

    /* REQUIRED. Make sure tokens [0, num_tokens) of seq have slots (a
     * sequence it has not seen starts empty). On NO_SPACE nothing changed.
     * A block that becomes full of non-draft tokens is registered in the
     * prefix cache; writing into a block shared with another sequence
     * queues a copy (copy-on-write). LOOM_ERR_INVALID for a swapped-out
     * sequence or a length the pool could never hold. */
    loom_status (*allocate)(void *self, const loom_seq_info *seq, int32_t num_tokens,
                            loom_error *err);
    /* REQUIRED. Keep only slots for tokens [0, num_tokens) (rolls back
     * rejected drafts); a longer num_tokens or an unknown seq is a no-op. */
    void (*truncate)(void *self, const loom_seq_info *seq, int32_t num_tokens);
    /* REQUIRED. Drop all of seq's references, device or host; the id is
     * forgotten. Unknown ids are ignored. */
    void (*free)(void *self, loom_seq_id seq);
    /* REQUIRED. `child` (holding no blocks) shares every block of `parent`
     * (refcounts up); a later write into a shared block copies it.
     * LOOM_ERR_INVALID for an unknown or swapped-out parent. */
    loom_status (*fork)(void *self, loom_seq_id parent, loom_seq_id child, loom_error *err);
    /* OPTIONAL, both or neither (NULL = this manager never swaps;
     * schedulers recompute; the loader refuses a table with only one).
     * Move seq's whole table to the host pool (OUT) or back (IN), queueing
     * one op per block. NO_SPACE when the target pool is full,
     * UNSUPPORTED when there is no host pool; nothing changes then. A
     * swapped-out sequence has no device blocks (block_table returns 0). */
    loom_status (*swap_out)(void *self, loom_seq_id seq, loom_error *err);
    loom_status (*swap_in)(void *self, loom_seq_id seq, loom_error *err);

    /* REQUIRED. seq's device block table: writes up to `cap` ids to out
     * (NULL allowed with cap 0) and returns how many it has (with groups:
     * group 0's). */
    int32_t (*block_table)(void *self, loom_seq_id seq, int32_t *out, int32_t cap);
    /* REQUIRED. Pending copies and swaps in the order they were queued:
     * moves up to `cap` into out and returns how many (the core calls it
     * again until 0, and runs them before the next forward). */
    int32_t (*take_block_ops)(void *self, loom_block_op *out, int32_t cap);
    /* REQUIRED. Blocks allocate() could hand out now (free + evictable):
     * what the core budgets drafts against. It may be less than
     * stats.free_blocks when the manager cannot hand out every free block
     * (e.g. `contiguous`, which gives each sequence one whole region).
     * With G groups: table positions, free blocks / G. */
    int32_t (*num_free_blocks)(void *self);
    /* OPTIONAL (NULL = the engine reports zeros). */
    void (*stats)(void *self, loom_cache_stats *out);
    /* since ABI 2.0 — add new members below this line only */

    /* OPTIONAL, since ABI 2.4 (NULL = this manager never takes the
     * backend's groups). Group `group` (0..layout->num_groups-1) of seq's
     * device table, as block_table(): up to `cap` ids (-1 for blocks a
     * windowed group released), returns how many entries it has (0 for
     * an unknown, swapped or out-of-range one). */
    int32_t (*group_table)(void *self, loom_seq_id seq, int32_t group, int32_t *out, int32_t cap);
    /* since ABI 2.4 — add new members below this line only */
} loom_cache_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CACHE_H */
