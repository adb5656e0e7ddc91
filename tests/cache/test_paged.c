/*
 * tests/cache/test_paged.c — unit cases for the `paged` cache manager, each
 * pinning one documented behaviour: prefix hits after free, chained hashes,
 * LRU eviction order, the admission watermark, copy-on-write after fork,
 * truncate and re-extend, swap round trips, atomic NO_SPACE, draft tokens
 * kept out of the prefix cache, sizing and its error messages, stats.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "cache_util.h"
#include "fake_host.h"
#include "paged.h"

static loom_paged_config paged_cfg(int64_t block_size, int64_t num_blocks) {
    loom_paged_config c;
    cr_assert(tc_apply_defaults(loom_paged_params, &c, sizeof c));
    c.block_size = block_size;
    c.num_blocks = num_blocks;
    c.watermark = 0.0;
    return c;
}

static void open_paged(tc_cache *c, const loom_paged_config *cfg, int32_t max_model_len,
                       bool can_swap) {
    loom_cache_init in = tc_init_desc((size_t)1 << 30, max_model_len, can_swap);
    loom_error err = {0};
    loom_status st = tc_open(c, &loom_paged_ops, cfg, &in, &err);
    cr_assert_eq(st, LOOM_OK, "open: %s", err.message);
}

static void check(tc_cache *c) {
    char msg[256] = "";
    cr_assert(loom_paged_debug_check(c->self, msg, sizeof msg), "invariant: %s", msg);
}

static void close_and_check_leaks(tc_cache *c) {
    check(c);
    tc_close(c);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld host allocations",
                 fake_host_live_allocs());
}

static loom_status alloc_seq(tc_cache *c, loom_seq_id id, const int32_t *toks, int32_t n,
                             int32_t num_tokens) {
    loom_seq_info s = tc_seq(id, toks, n, 0);
    loom_error err = {0};
    return c->ops->allocate(c->self, &s, num_tokens, &err);
}

static int32_t acquire(tc_cache *c, loom_seq_id id, const int32_t *toks, int32_t n) {
    loom_seq_info s = tc_seq(id, toks, n, 0);
    return c->ops->acquire_prefix(c->self, &s);
}

Test(cache, paged_prefix_hit_after_free) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    open_paged(&c, &cfg, 64, false);
    int32_t a[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    cr_assert_eq(acquire(&c, 1, a, 11), 0, "empty cache cannot hit");
    cr_assert_eq(alloc_seq(&c, 1, a, 11, 11), LOOM_OK);
    int32_t t1[8], t2[8];
    cr_assert_eq(tc_table(&c, 1, t1), 3);
    c.ops->free(c.self, 1);
    check(&c);

    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.cached_blocks, 2, "the two full blocks stay cached");
    cr_assert_eq(st.free_blocks, 16);
    cr_assert_eq(c.ops->num_free_blocks(c.self), 16, "cached blocks count as free");

    int32_t b[10] = {1, 2, 3, 4, 5, 6, 7, 8, 42, 43};
    cr_assert_eq(acquire(&c, 2, b, 10), 8);
    cr_assert_eq(tc_table(&c, 2, t2), 2);
    cr_assert_eq(t2[0], t1[0]);
    cr_assert_eq(t2[1], t1[1]);
    cr_assert_eq(alloc_seq(&c, 2, b, 10, 10), LOOM_OK);
    cr_assert_eq(tc_table(&c, 2, t2), 3);
    cr_assert_eq(t2[0], t1[0], "allocate keeps the prefix blocks");
    loom_block_op ops[4096];
    cr_assert_eq(tc_take_ops(&c, ops), 0); /* the per-step drain publishes gauges */
    cr_assert_float_eq(fake_host_metric("cache.usage"), 3.0 / 16.0, 1e-9);

    /* At least one token is always left to compute: 8 identical tokens hit
     * only one block (num_tokens - 1 = 7, rounded down to 4). */
    cr_assert_eq(acquire(&c, 3, a, 8), 4);
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.prefix_queries, 11 + 10 + 8, "queries count tokens");
    cr_assert_eq(st.prefix_hits, 8 + 4, "hits count tokens");
    cr_assert_float_eq(fake_host_metric("cache.prefix_hit_rate"), 12.0 / 29.0, 1e-9);
    cr_assert_eq(loom_paged_debug_refcount(c.self, t1[0], false), 2);
    c.ops->free(c.self, 2);
    c.ops->free(c.self, 3);
    close_and_check_leaks(&c);
}

Test(cache, paged_chained_hash_needs_same_parent) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 32);
    open_paged(&c, &cfg, 64, false);
    int32_t X[4] = {1, 1, 1, 1}, Y[4] = {2, 2, 2, 2}, Z[4] = {3, 3, 3, 3};
    int32_t xy[9], zy[9], y[9];
    memcpy(xy, X, sizeof X), memcpy(xy + 4, Y, sizeof Y), xy[8] = 9;
    memcpy(zy, Z, sizeof Z), memcpy(zy + 4, Y, sizeof Y), zy[8] = 9;
    memcpy(y, Y, sizeof Y), memcpy(y + 4, X, sizeof X), y[8] = 9;
    cr_assert_eq(alloc_seq(&c, 1, xy, 9, 9), LOOM_OK);
    cr_assert_eq(alloc_seq(&c, 2, zy, 9, 9), LOOM_OK);
    int32_t txy[4], tzy[4], t[4];
    tc_table(&c, 1, txy);
    tc_table(&c, 2, tzy);
    cr_assert(loom_paged_debug_hashed(c.self, txy[1]) && loom_paged_debug_hashed(c.self, tzy[1]),
              "both second blocks (same tokens Y, different parents) are registered");

    /* Y at depth 0 (parent = root) must not find either Y block. */
    cr_assert_eq(acquire(&c, 3, y, 9), 0);
    /* X,Y finds X's chain; Z,Y finds Z's chain. */
    cr_assert_eq(acquire(&c, 4, xy, 9), 8);
    tc_table(&c, 4, t);
    cr_assert(t[0] == txy[0] && t[1] == txy[1]);
    cr_assert_eq(acquire(&c, 5, zy, 9), 8);
    tc_table(&c, 5, t);
    cr_assert(t[0] == tzy[0] && t[1] == tzy[1] && t[1] != txy[1]);
    for (loom_seq_id s = 1; s <= 5; s++) c.ops->free(c.self, s);
    close_and_check_leaks(&c);
}

Test(cache, paged_lru_evicts_oldest_deepest_first) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 8);
    open_paged(&c, &cfg, 32, false);
    int32_t A[9] = {1, 2, 3, 4, 5, 6, 7, 8, 0}, B[9] = {11, 12, 13, 14, 15, 16, 17, 18, 0};
    int32_t ta[2], tb[2];
    cr_assert_eq(alloc_seq(&c, 1, A, 8, 8), LOOM_OK);
    tc_table(&c, 1, ta);
    c.ops->free(c.self, 1); /* LRU: a1, a0 */
    cr_assert_eq(alloc_seq(&c, 2, B, 8, 8), LOOM_OK);
    tc_table(&c, 2, tb);
    c.ops->free(c.self, 2); /* LRU: a1, a0, b1, b0 */
    check(&c);

    /* 20 fresh tokens: 5 blocks = 4 plain + 1 eviction, which must be a1. */
    int32_t C[20];
    for (int i = 0; i < 20; i++) C[i] = 100 + i;
    cr_assert_eq(alloc_seq(&c, 3, C, 20, 20), LOOM_OK);
    int32_t tcc[5];
    tc_table(&c, 3, tcc);
    cr_assert_eq(tcc[4], ta[1], "the 5th block is the evicted a1 (got %d)", tcc[4]);
    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(st.cached_blocks, 3);

    cr_assert_eq(acquire(&c, 4, A, 9), 4, "A's first block survives, its second was evicted");
    cr_assert_eq(acquire(&c, 5, B, 9), 8, "B is intact");
    /* The next eviction takes the next oldest: a0 is in use now, so b1/b0
     * are the only cached blocks left and both are in use too. */
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.cached_blocks, 0);
    for (loom_seq_id s = 3; s <= 5; s++) c.ops->free(c.self, s);
    close_and_check_leaks(&c);
}

Test(cache, paged_watermark_only_at_admission) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(1, 100);
    cfg.watermark = 0.1; /* 10 blocks */
    cfg.prefix_caching = false;
    open_paged(&c, &cfg, 100, false);
    int32_t toks[100] = {0};
    /* Alone in an empty pool a sequence may take every block. */
    cr_assert_eq(alloc_seq(&c, 9, toks, 100, 100), LOOM_OK);
    c.ops->free(c.self, 9);

    cr_assert_eq(alloc_seq(&c, 1, toks, 50, 50), LOOM_OK);
    cr_assert_eq(alloc_seq(&c, 2, toks, 45, 45), LOOM_ERR_NO_SPACE, "5 left < watermark 10");
    cr_assert_eq(tc_table(&c, 2, NULL), 0, "failed admission leaves nothing");
    cr_assert_eq(alloc_seq(&c, 2, toks, 40, 40), LOOM_OK, "exactly the watermark left");
    cr_assert_eq(alloc_seq(&c, 1, toks, 60, 60), LOOM_OK, "a running seq may dip below");
    cr_assert_eq(c.ops->num_free_blocks(c.self), 0);
    cr_assert_eq(alloc_seq(&c, 2, toks, 41, 41), LOOM_ERR_NO_SPACE);
    c.ops->free(c.self, 1);
    c.ops->free(c.self, 2);
    close_and_check_leaks(&c);
}

Test(cache, paged_cow_after_fork) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    open_paged(&c, &cfg, 64, false);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    cr_assert_eq(alloc_seq(&c, 1, toks, 6, 6), LOOM_OK);
    loom_error err = {0};
    cr_assert_eq(c.ops->fork(c.self, 1, 2, &err), LOOM_OK, "%s", err.message);
    int32_t tp[4], tch[4];
    cr_assert_eq(tc_table(&c, 1, tp), 2);
    cr_assert_eq(tc_table(&c, 2, tch), 2);
    cr_assert(tp[0] == tch[0] && tp[1] == tch[1]);
    cr_assert_eq(loom_paged_debug_refcount(c.self, tp[0], false), 2);
    cr_assert_eq(loom_paged_debug_refcount(c.self, tp[1], false), 2);
    loom_block_op ops[4096];
    cr_assert_eq(tc_take_ops(&c, ops), 0, "fork itself copies nothing");

    /* The child writes token 6 into the shared partial block: one copy. */
    int32_t ctoks[7] = {1, 2, 3, 4, 5, 6, 70};
    cr_assert_eq(alloc_seq(&c, 2, ctoks, 7, 7), LOOM_OK);
    cr_assert_eq(tc_take_ops(&c, ops), 1);
    tc_table(&c, 2, tch);
    cr_assert_eq(ops[0].kind, LOOM_BLOCK_COPY);
    cr_assert_eq(ops[0].src, tp[1]);
    cr_assert_eq(ops[0].dst, tch[1]);
    cr_assert_eq(tch[0], tp[0], "full block still shared");
    cr_assert_neq(tch[1], tp[1], "tables diverge at the written block");
    cr_assert_eq(loom_paged_debug_refcount(c.self, tp[1], false), 1);

    /* Now the parent holds its block alone: writing needs no copy. */
    int32_t ptoks[7] = {1, 2, 3, 4, 5, 6, 60};
    cr_assert_eq(alloc_seq(&c, 1, ptoks, 7, 7), LOOM_OK);
    cr_assert_eq(tc_take_ops(&c, ops), 0);
    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.cow_copies, 1);

    /* A fork at a block boundary shares only full blocks: no copy later. */
    cr_assert_eq(alloc_seq(&c, 1, toks, 8, 8), LOOM_OK);
    cr_assert_eq(c.ops->fork(c.self, 1, 3, &err), LOOM_OK);
    int32_t t9[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    cr_assert_eq(alloc_seq(&c, 3, t9, 9, 9), LOOM_OK);
    cr_assert_eq(tc_take_ops(&c, ops), 0);
    cr_assert_eq(c.ops->fork(c.self, 1, 1, &err), LOOM_ERR_INVALID);
    cr_assert_eq(c.ops->fork(c.self, 77, 4, &err), LOOM_ERR_INVALID);
    cr_assert_eq(c.ops->fork(c.self, 1, 3, &err), LOOM_ERR_INVALID, "child holds blocks");
    for (loom_seq_id s = 1; s <= 3; s++) c.ops->free(c.self, s);
    close_and_check_leaks(&c);
}

Test(cache, paged_truncate_then_reextend) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    open_paged(&c, &cfg, 64, false);
    int32_t old[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t neu[13] = {1, 2, 3, 4, 5, 60, 70, 80, 90, 100, 110, 120, 130};
    cr_assert_eq(alloc_seq(&c, 1, old, 10, 10), LOOM_OK);
    int32_t t[4], t2[4];
    tc_table(&c, 1, t);
    cr_assert(loom_paged_debug_hashed(c.self, t[1]));
    loom_seq_info s = tc_seq(1, old, 5, 0);
    c.ops->truncate(c.self, &s, 5);
    cr_assert_eq(tc_table(&c, 1, t2), 2);
    cr_assert_eq(c.ops->num_free_blocks(c.self), 14);
    /* The kept partial block is still whole: it stays registered until written. */
    cr_assert(loom_paged_debug_hashed(c.self, t[1]));
    check(&c);

    cr_assert_eq(alloc_seq(&c, 1, neu, 12, 12), LOOM_OK);
    cr_assert_eq(tc_table(&c, 1, t2), 3);
    cr_assert_eq(t2[1], t[1], "exclusively held: rewritten in place");
    check(&c);
    /* The old contents of block 1 are gone from the cache, the new are in. */
    cr_assert_eq(acquire(&c, 2, old, 10), 4);
    cr_assert_eq(acquire(&c, 3, neu, 13), 12);
    c.ops->free(c.self, 2);
    c.ops->free(c.self, 3);

    /* Truncate then free without rewriting: the full block stays a hit. */
    int32_t u[9] = {21, 22, 23, 24, 25, 26, 27, 28, 29};
    cr_assert_eq(alloc_seq(&c, 4, u, 8, 8), LOOM_OK);
    s = tc_seq(4, u, 6, 0);
    c.ops->truncate(c.self, &s, 6);
    c.ops->free(c.self, 4);
    cr_assert_eq(acquire(&c, 5, u, 9), 8);
    loom_seq_info s5 = tc_seq(5, u, 9, 0);
    c.ops->truncate(c.self, &s5, 100); /* growing via truncate is a no-op */
    cr_assert_eq(tc_table(&c, 5, NULL), 2);
    c.ops->free(c.self, 5);
    c.ops->free(c.self, 1);
    close_and_check_leaks(&c);
}

Test(cache, paged_swap_round_trip) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    cfg.num_cpu_blocks = 8;
    open_paged(&c, &cfg, 64, true);
    cr_assert_eq(c.layout.num_cpu_blocks, 8);
    int32_t toks[40] = {0};
    for (int i = 0; i < 40; i++) toks[i] = i + 1;
    cr_assert_eq(alloc_seq(&c, 1, toks, 10, 10), LOOM_OK);
    int32_t dev[4], dev2[4], host[4];
    cr_assert_eq(tc_table(&c, 1, dev), 3);
    loom_error err = {0};
    cr_assert_eq(c.ops->swap_out(c.self, 1, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(tc_table(&c, 1, NULL), 0, "no device blocks while swapped");
    bool swapped = false;
    cr_assert_eq(loom_paged_debug_table(c.self, 1, host, 4, &swapped), 3);
    cr_assert(swapped);
    loom_block_op ops[4096];
    cr_assert_eq(tc_take_ops(&c, ops), 3);
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(ops[j].kind, LOOM_BLOCK_SWAP_OUT);
        cr_assert_eq(ops[j].src, dev[j]);
        cr_assert_eq(ops[j].dst, host[j]);
    }
    cr_assert_eq(c.ops->num_free_blocks(c.self), 16);
    check(&c);
    loom_seq_info si = tc_seq(1, toks, 11, 0);
    cr_assert_eq(c.ops->allocate(c.self, &si, 11, &err), LOOM_ERR_INVALID,
                 "allocate on a swapped seq is refused");
    cr_assert_eq(c.ops->swap_out(c.self, 1, &err), LOOM_ERR_INVALID);

    /* Another sequence too large for the host pool's remaining 5 blocks. */
    int32_t other[24];
    for (int i = 0; i < 24; i++) other[i] = 100 + i;
    cr_assert_eq(alloc_seq(&c, 2, other, 24, 24), LOOM_OK);
    cr_assert_eq(c.ops->swap_out(c.self, 2, &err), LOOM_ERR_NO_SPACE);
    cr_assert_eq(tc_take_ops(&c, ops), 0, "failed swap queues nothing");
    cr_assert_eq(tc_table(&c, 2, NULL), 6);

    cr_assert_eq(c.ops->swap_in(c.self, 1, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(tc_table(&c, 1, dev2), 3);
    cr_assert_eq(tc_take_ops(&c, ops), 3);
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(ops[j].kind, LOOM_BLOCK_SWAP_IN);
        cr_assert_eq(ops[j].src, host[j]);
        cr_assert_eq(ops[j].dst, dev2[j]);
    }
    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.swaps_out, 3);
    cr_assert_eq(st.swaps_in, 3);
    cr_assert_eq(st.free_cpu_blocks, 8);
    cr_assert_eq(c.ops->swap_in(c.self, 1, &err), LOOM_ERR_INVALID);
    /* Resident again: it can grow, and newly full blocks register. (Its
     * first two blocks' old device copies are still cached under the same
     * hashes, so the swapped-in copies stay unregistered duplicates.) */
    cr_assert_eq(alloc_seq(&c, 1, toks, 12, 12), LOOM_OK);
    cr_assert(loom_paged_debug_hashed(c.self, dev2[2]));
    cr_assert(loom_paged_debug_hashed(c.self, dev[0]) && !loom_paged_debug_hashed(c.self, dev2[0]));
    check(&c);

    /* Device too full to swap back in: NO_SPACE, nothing moves. */
    cr_assert_eq(c.ops->swap_out(c.self, 1, &err), LOOM_OK);
    tc_take_ops(&c, ops);
    cr_assert_eq(alloc_seq(&c, 3, toks, 40, 40), LOOM_OK); /* 10 blocks: 16 - 6 */
    cr_assert_eq(c.ops->swap_in(c.self, 1, &err), LOOM_ERR_NO_SPACE);
    cr_assert_eq(tc_take_ops(&c, ops), 0);
    check(&c);
    c.ops->free(c.self, 1); /* freeing a swapped seq returns host blocks */
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.free_cpu_blocks, 8);
    c.ops->free(c.self, 2);
    c.ops->free(c.self, 3);
    close_and_check_leaks(&c);
}

Test(cache, paged_swap_unsupported_without_host_pool) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    cfg.num_cpu_blocks = 8;
    open_paged(&c, &cfg, 64, false); /* backend cannot swap: pool dropped */
    cr_assert_eq(c.layout.num_cpu_blocks, 0);
    int32_t toks[4] = {1, 2, 3, 4};
    cr_assert_eq(alloc_seq(&c, 1, toks, 4, 4), LOOM_OK);
    loom_error err = {0};
    cr_assert_eq(c.ops->swap_out(c.self, 1, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "cpu_swap_gib"), "message says what to set: %s", err.message);
    cr_assert_eq(c.ops->swap_in(c.self, 1, &err), LOOM_ERR_UNSUPPORTED);
    c.ops->free(c.self, 1);
    close_and_check_leaks(&c);
}

Test(cache, paged_no_space_changes_nothing) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 8);
    open_paged(&c, &cfg, 32, false);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = i;
    cr_assert_eq(alloc_seq(&c, 1, toks, 18, 18), LOOM_OK); /* 5 blocks, last partial */
    loom_error err = {0};
    cr_assert_eq(c.ops->fork(c.self, 1, 2, &err), LOOM_OK);
    cr_assert_eq(alloc_seq(&c, 3, toks + 1, 12, 12), LOOM_OK); /* 3 blocks: pool full */
    int32_t before[8], after[8];
    cr_assert_eq(tc_table(&c, 2, before), 5);
    loom_cache_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    c.ops->stats(c.self, &s0);
    /* Child writes into the shared partial block: needs a copy, none free. */
    cr_assert_eq(alloc_seq(&c, 2, toks, 19, 19), LOOM_ERR_NO_SPACE);
    cr_assert_eq(tc_table(&c, 2, after), 5);
    cr_assert_eq(memcmp(before, after, sizeof(int32_t) * 5), 0);
    c.ops->stats(c.self, &s1);
    cr_assert_eq(memcmp(&s0, &s1, sizeof s0), 0, "stats unchanged");
    loom_block_op ops[16];
    cr_assert_eq(tc_take_ops(&c, ops), 0);
    /* Beyond the whole pool is not "no space" but a bad request. */
    cr_assert_eq(alloc_seq(&c, 4, toks, 32, 33), LOOM_ERR_INVALID);
    cr_assert_eq(c.ops->block_table(c.self, 4, NULL, 0), 0);
    check(&c);
    for (loom_seq_id s = 1; s <= 3; s++) c.ops->free(c.self, s);
    c.ops->stats(c.self, &s1);
    cr_assert_eq(s1.peak_used_blocks, 8);
    close_and_check_leaks(&c);
}

Test(cache, paged_drafts_never_registered) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    open_paged(&c, &cfg, 64, false);
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 91, 92, 93, 94};
    loom_seq_info s = tc_seq(1, toks, 12, 4); /* last 4 are drafts */
    loom_error err = {0};
    cr_assert_eq(c.ops->allocate(c.self, &s, 12, &err), LOOM_OK);
    int32_t t[3];
    tc_table(&c, 1, t);
    cr_assert(loom_paged_debug_hashed(c.self, t[0]) && loom_paged_debug_hashed(c.self, t[1]));
    cr_assert(!loom_paged_debug_hashed(c.self, t[2]), "block of drafts must not be registered");
    /* Two drafts rejected: roll back; the partial block stays unregistered. */
    c.ops->truncate(c.self, &s, 10);
    s = tc_seq(1, toks, 10, 0);
    cr_assert_eq(c.ops->allocate(c.self, &s, 10, &err), LOOM_OK);
    cr_assert(!loom_paged_debug_hashed(c.self, t[2]));
    /* Accepted and completed later: registered once its tokens are real. */
    int32_t more[12] = {1, 2, 3, 4, 5, 6, 7, 8, 91, 92, 95, 96};
    s = tc_seq(1, more, 12, 0);
    cr_assert_eq(c.ops->allocate(c.self, &s, 12, &err), LOOM_OK);
    cr_assert(loom_paged_debug_hashed(c.self, t[2]));
    /* Slots allocated ahead of known tokens register when tokens arrive. */
    int32_t ahead[16] = {5, 5, 5, 5, 6, 6, 6, 6};
    s = tc_seq(2, ahead, 5, 0);
    cr_assert_eq(c.ops->allocate(c.self, &s, 8, &err), LOOM_OK);
    tc_table(&c, 2, t);
    cr_assert(loom_paged_debug_hashed(c.self, t[0]));
    cr_assert(!loom_paged_debug_hashed(c.self, t[1]), "tokens 5..7 were not known yet");
    s = tc_seq(2, ahead, 8, 0);
    cr_assert_eq(c.ops->allocate(c.self, &s, 8, &err), LOOM_OK);
    cr_assert(loom_paged_debug_hashed(c.self, t[1]));
    c.ops->free(c.self, 1);
    c.ops->free(c.self, 2);
    close_and_check_leaks(&c);
}

Test(cache, paged_prefix_caching_off) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    cfg.prefix_caching = false;
    open_paged(&c, &cfg, 64, false);
    int32_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    cr_assert_eq(alloc_seq(&c, 1, toks, 9, 9), LOOM_OK);
    c.ops->free(c.self, 1);
    cr_assert_eq(acquire(&c, 2, toks, 9), 0);
    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.cached_blocks, 0);
    cr_assert_eq(st.prefix_queries, 0);
    close_and_check_leaks(&c);
}

Test(cache, paged_sizing_and_errors) {
    loom_paged_config cfg = paged_cfg(16, 0);
    loom_error err = {0};
    tc_cache c;
    /* 100 blocks of 16 KiB free, 90% -> 90 blocks. */
    loom_cache_init in = tc_init_desc(100 * 16 * TC_BYTES_PER_TOKEN, 256, false);
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(c.layout.num_blocks, 90);
    cr_assert_eq(c.layout.block_size, 16);
    cr_assert_eq(c.layout.num_cpu_blocks, 0);
    cr_assert_eq(c.layout.dtype, LOOM_DTYPE_F16, "dtype left as the core set it");
    cr_assert_eq(c.ops->init(c.self, &in, &c.layout, &err), LOOM_ERR_INVALID, "init twice");
    cr_assert_float_eq(fake_host_metric("cache.usage"), 0.0, 1e-12);
    tc_close(&c);

    cfg.memory_gib = 1.0 / 1024; /* 1 MiB = 64 blocks of 16 KiB */
    cfg.cpu_swap_gib = 0.5 / 1024;
    in.backend_can_swap = true;
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(c.layout.num_blocks, 64);
    cr_assert_eq(c.layout.num_cpu_blocks, 32);
    tc_close(&c);

    /* A budget below one block. */
    cfg.memory_gib = 0;
    cfg.cpu_swap_gib = 0;
    in = tc_init_desc(1000, 256, false);
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_ERR_NOMEM);
    cr_assert(strstr(err.message, "memory_fraction"), "%s", err.message);

    /* A pool that cannot hold one max_model_len sequence: says how much. */
    in = tc_init_desc(100 * 16 * TC_BYTES_PER_TOKEN, 4096, false);
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_ERR_NOMEM);
    cr_assert(strstr(err.message, "max_model_len=4096") && strstr(err.message, "256 blocks") &&
                  strstr(err.message, "4.0 MiB"),
              "%s", err.message);
    cfg.num_blocks = 10;
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_ERR_NOMEM);
    cr_assert(strstr(err.message, "num_blocks"), "%s", err.message);

    /* Bad config values are refused at create with the key named. */
    loom_paged_config bad = paged_cfg(0, 0);
    void *self = NULL;
    cr_assert_eq(loom_paged_ops.create(fake_host(), &bad, &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "block_size"), "%s", err.message);
    bad = paged_cfg(16, 0);
    bad.watermark = 1.0;
    cr_assert_eq(loom_paged_ops.create(fake_host(), &bad, &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "watermark"), "%s", err.message);
    cr_assert_null(self);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(cache, paged_stats_respect_struct_size) {
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 16);
    open_paged(&c, &cfg, 64, false);
    loom_cache_stats st;
    memset(&st, 0x5a, sizeof st);
    st.struct_size = (uint32_t)offsetof(loom_cache_stats, free_blocks);
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.num_blocks, 16);
    int32_t untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    cr_assert_eq(st.free_blocks, untouched, "fields past struct_size are left alone");
    close_and_check_leaks(&c);
}

/* Block-table groups: a global group 0 and a group 1 of window 8 over
 * 4-token blocks. Group 1 releases a block once the first token to compute
 * is 8 past its end, group 0 never; a prefix hit then needs group 0's
 * blocks from the start but group 1's only inside the window. */
Test(cache, paged_window_releases_and_prefix_hit_past_the_window) {
    static const loom_kv_groups g = {.struct_size = sizeof g, .num_groups = 2, .layers_per_block = 1,
                                     .num_layers = 2, .window = {0, 8}};
    tc_cache c;
    loom_paged_config cfg = paged_cfg(4, 64);
    loom_cache_init in = tc_init_desc((size_t)1 << 30, 64, false);
    in.groups = &g;
    loom_error err = {0};
    cr_assert_eq(tc_open(&c, &loom_paged_ops, &cfg, &in, &err), LOOM_OK, "open: %s", err.message);
    cr_assert_eq(c.layout.num_groups, 2);
    cr_assert_eq(c.ops->num_free_blocks(c.self), 32, "64 blocks are 32 table positions of 2 groups");
    int32_t t[32], t0[16], t1[16], u0[16], u1[16];
    for (int i = 0; i < 32; i++) t[i] = 100 + i;
    loom_seq_info s = tc_seq(1, t, 24, 0);
    cr_assert_eq(c.ops->allocate(c.self, &s, 16, &err), LOOM_OK, "%s", err.message);
    s.num_computed = 16; /* sees positions 9..: blocks 0 and 1 (positions 0..7) are behind */
    cr_assert_eq(c.ops->allocate(c.self, &s, 24, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(c.ops->block_table(c.self, 1, t0, 16), 6);
    cr_assert_eq(c.ops->group_table(c.self, 1, 1, t1, 16), 6);
    for (int j = 0; j < 6; j++) {
        cr_assert_geq(t0[j], 0, "group 0 entry %d released", j);
        cr_assert((j < 2) == (t1[j] == -1), "group 1 entry %d is %d", j, t1[j]);
    }
    check(&c);
    /* 30 tokens sharing the first 24: all 6 blocks of group 0, blocks 4..5
     * of group 1 (the window of position 24 is 17..24) */
    loom_seq_info s2 = tc_seq(2, t, 30, 0);
    cr_assert_eq(c.ops->acquire_prefix(c.self, &s2), 24);
    cr_assert_eq(c.ops->block_table(c.self, 2, u0, 16), 6);
    cr_assert_eq(c.ops->group_table(c.self, 2, 1, u1, 16), 6);
    for (int j = 0; j < 6; j++) {
        cr_assert_eq(u0[j], t0[j], "group 0 entry %d", j);
        cr_assert_eq(u1[j], j < 4 ? -1 : t1[j], "group 1 entry %d", j);
    }
    cr_assert_eq(loom_paged_debug_refcount(c.self, t1[4], false), 2);
    check(&c);
    close_and_check_leaks(&c);
}
