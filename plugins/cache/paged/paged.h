/*
 * plugins/cache/paged/paged.h — private to the `paged` cache plugin and its
 * tests: the config struct the host fills from the parameter table, the ops
 * table, and read-only debug hooks the randomized tests use to check the
 * pool's invariants. Not part of the SDK; never installed.
 *
 * The plugin is split in two files so tests can compile the manager into
 * their own executable next to `contiguous` without two loom_plugin_entry
 * symbols: paged.c (the manager) and paged_entry.c (the descriptor).
 */
#ifndef LOOM_PLUGIN_CACHE_PAGED_H
#define LOOM_PLUGIN_CACHE_PAGED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/cache.h"

/* Filled by the host from loom_paged_params (offsets into this struct). */
typedef struct loom_paged_config {
    int64_t block_size;      /* tokens per block, >= 1                        */
    double memory_fraction;  /* (0, 1]: share of device_free_bytes for the pool */
    int64_t num_blocks;      /* > 0: exact device pool size (overrides memory) */
    double memory_gib;       /* > 0: absolute device budget, GiB               */
    bool prefix_caching;     /* share full blocks by content hash              */
    double watermark;        /* [0, 1): share of blocks kept free at admission */
    double cpu_swap_gib;     /* host swap pool, GiB; 0 = no swap               */
    int64_t num_cpu_blocks;  /* > 0: exact host pool size (overrides GiB)      */
    int64_t sliding_window;  /* PAGED_WINDOW_AUTO: take the backend's block-table
                                groups (free what a window left behind);
                                PAGED_WINDOW_OFF: one table, every block kept */
} loom_paged_config;

enum { PAGED_WINDOW_AUTO = 0, PAGED_WINDOW_OFF = 1 };

extern const loom_cache_ops loom_paged_ops;
extern const loom_param loom_paged_params[];

/* ---------------------------------------------------------- debug hooks
 * Read-only views for tests; `self` is a live instance after init. */

/* Reference count of device (host == false) or host block `block`; -1 when
 * out of range. */
int32_t loom_paged_debug_refcount(void *self, int32_t block, bool host);
/* Use only the bits of `mask` of h1 as the prefix-table key, so distinct
 * blocks collide on purpose and the full-hash + token check is exercised.
 * Only while the table is empty (right after init). */
void    loom_paged_debug_set_key_mask(void *self, uint64_t mask);
/* Whether device block `block` is registered in the prefix cache. */
bool    loom_paged_debug_hashed(void *self, int32_t block);
/* seq's table including host ids while swapped: writes up to `cap` ids,
 * returns how many it has (-1 for an unknown seq); *swapped set if non-NULL.
 * Group 0's; loom_paged_debug_group_table for any group (-1 entries are
 * blocks a windowed group released). */
int32_t loom_paged_debug_table(void *self, loom_seq_id seq, int32_t *out, int32_t cap,
                               bool *swapped);
int32_t loom_paged_debug_group_table(void *self, loom_seq_id seq, int32_t group, int32_t *out,
                                     int32_t cap, bool *swapped);
/* Walk every internal structure and check the invariants (refcounts equal
 * table references, free lists disjoint and complete, hash table and block
 * hashes agree, stored tokens re-hash to the stored hash). Returns true when
 * all hold; otherwise writes the first violation into msg. */
bool    loom_paged_debug_check(void *self, char *msg, size_t msg_size);

#endif
