/*
 * tests/cache/test_contiguous.c — unit cases for the `contiguous` baseline
 * (first-fit max-length regions, fork by copy, no prefix cache, no swap)
 * and the explicit paging benefit: in the same pool the paged manager
 * admits several times more short sequences.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <string.h>

#include "cache_util.h"
#include "contiguous.h"
#include "fake_host.h"
#include "paged.h"

static void open_contig(tc_cache *c, int64_t block_size, int64_t num_blocks,
                        int32_t max_model_len) {
    loom_contiguous_config cfg;
    cr_assert(tc_apply_defaults(loom_contiguous_params, &cfg, sizeof cfg));
    cfg.block_size = block_size;
    cfg.num_blocks = num_blocks;
    loom_cache_init in = tc_init_desc((size_t)1 << 30, max_model_len, true);
    loom_error err = {0};
    cr_assert_eq(tc_open(c, &loom_contiguous_ops, &cfg, &in, &err), LOOM_OK, "%s", err.message);
}

static void check(tc_cache *c) {
    char msg[256] = "";
    cr_assert(loom_contiguous_debug_check(c->self, msg, sizeof msg), "invariant: %s", msg);
}

static loom_status alloc_n(tc_cache *c, loom_seq_id id, int32_t n) {
    static const int32_t toks[4096];
    loom_seq_info s = tc_seq(id, toks, n, 0);
    loom_error err = {0};
    return c->ops->allocate(c->self, &s, n, &err);
}

Test(cache, contiguous_first_fit_and_fragmentation) {
    tc_cache c;
    open_contig(&c, 4, 11, 16); /* regions of 4 blocks: two fit, 3 blocks left over */
    cr_assert_eq(loom_contiguous_debug_region(c.self), 4);
    cr_assert_eq(c.ops->num_free_blocks(c.self), 8, "two whole regions can be handed out");
    cr_assert_eq(alloc_n(&c, 1, 1), LOOM_OK);
    cr_assert_eq(alloc_n(&c, 2, 16), LOOM_OK);
    cr_assert_eq(loom_contiguous_debug_start(c.self, 1), 0);
    cr_assert_eq(loom_contiguous_debug_start(c.self, 2), 4);
    int32_t t[8];
    cr_assert_eq(tc_table(&c, 1, t), 1, "table covers the used part of the region");
    cr_assert_eq(tc_table(&c, 2, t), 4);
    for (int j = 0; j < 4; j++) cr_assert_eq(t[j], 4 + j, "consecutive ids");

    /* Three blocks are free, yet no region fits: the baseline's waste. */
    loom_cache_stats st = {.struct_size = sizeof st};
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.free_blocks, 3);
    cr_assert_eq(c.ops->num_free_blocks(c.self), 0);
    cr_assert_eq(alloc_n(&c, 3, 1), LOOM_ERR_NO_SPACE);
    cr_assert_eq(tc_table(&c, 3, t), 0);
    /* A region already held grows without new blocks, up to max_model_len. */
    cr_assert_eq(alloc_n(&c, 1, 16), LOOM_OK);
    cr_assert_eq(alloc_n(&c, 1, 17), LOOM_ERR_INVALID);

    /* Freeing the first region lets the next sequence take it (first fit). */
    c.ops->free(c.self, 1);
    cr_assert_eq(alloc_n(&c, 3, 5), LOOM_OK);
    cr_assert_eq(loom_contiguous_debug_start(c.self, 3), 0);
    loom_seq_info s3 = tc_seq(3, NULL, 5, 0);
    c.ops->truncate(c.self, &s3, 2);
    cr_assert_eq(tc_table(&c, 3, t), 1);
    check(&c);
    c.ops->stats(c.self, &st);
    cr_assert_eq(st.peak_used_blocks, 8);
    c.ops->free(c.self, 2);
    c.ops->free(c.self, 3);
    check(&c);
    tc_close(&c);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(cache, contiguous_fork_copies_and_no_sharing) {
    tc_cache c;
    open_contig(&c, 4, 12, 16);
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    loom_seq_info s = tc_seq(1, toks, 10, 0);
    cr_assert_eq(c.ops->acquire_prefix(c.self, &s), 0, "no prefix cache");
    cr_assert_eq(alloc_n(&c, 1, 6), LOOM_OK);
    loom_error err = {0};
    cr_assert_eq(c.ops->fork(c.self, 1, 2, &err), LOOM_OK, "%s", err.message);
    loom_block_op ops[4096];
    cr_assert_eq(tc_take_ops(&c, ops), 2, "the two used blocks are copied");
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(ops[j].kind, LOOM_BLOCK_COPY);
        cr_assert_eq(ops[j].src, j);
        cr_assert_eq(ops[j].dst, 4 + j);
    }
    int32_t t[4];
    cr_assert_eq(tc_table(&c, 2, t), 2);
    cr_assert_eq(t[0], 4);
    cr_assert_eq(c.ops->fork(c.self, 1, 3, &err), LOOM_OK);
    tc_take_ops(&c, ops);
    cr_assert_eq(c.ops->fork(c.self, 1, 4, &err), LOOM_ERR_NO_SPACE, "pool holds 3 regions");
    cr_assert_eq(tc_take_ops(&c, ops), 0);
    cr_assert_eq(c.ops->fork(c.self, 1, 2, &err), LOOM_ERR_INVALID, "child holds a region");
    cr_assert_eq(c.ops->swap_out(c.self, 1, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert_eq(c.ops->swap_in(c.self, 1, &err), LOOM_ERR_UNSUPPORTED);
    check(&c);
    for (loom_seq_id i = 1; i <= 3; i++) c.ops->free(c.self, i);
    tc_close(&c);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(cache, contiguous_sizing_errors) {
    loom_contiguous_config cfg;
    cr_assert(tc_apply_defaults(loom_contiguous_params, &cfg, sizeof cfg));
    tc_cache c;
    loom_error err = {0};
    loom_cache_init in = tc_init_desc(100 * 16 * TC_BYTES_PER_TOKEN, 256, false);
    cr_assert_eq(tc_open(&c, &loom_contiguous_ops, &cfg, &in, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(c.layout.num_blocks, 90);
    cr_assert_eq(c.layout.num_cpu_blocks, 0);
    tc_close(&c);
    in.max_model_len = 2048; /* 128 blocks per region > 90 */
    cr_assert_eq(tc_open(&c, &loom_contiguous_ops, &cfg, &in, &err), LOOM_ERR_NOMEM);
    cr_assert(strstr(err.message, "max_model_len=2048") && strstr(err.message, "128 blocks"),
              "%s", err.message);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* The reason paging exists: short sequences in a contiguous cache each pin a
 * max_model_len region; in a paged cache they take only what they use. */
Test(cache, paged_fits_more_short_sequences_than_contiguous) {
    const int64_t nblocks = 64, bs = 16;
    const int32_t max_model_len = 256, seq_len = 20; /* 2 blocks of 16 */
    tc_cache pc, cc;
    loom_paged_config pcfg;
    cr_assert(tc_apply_defaults(loom_paged_params, &pcfg, sizeof pcfg));
    pcfg.block_size = bs;
    pcfg.num_blocks = nblocks;
    pcfg.watermark = 0;
    loom_cache_init in = tc_init_desc((size_t)1 << 30, max_model_len, false);
    loom_error err = {0};
    cr_assert_eq(tc_open(&pc, &loom_paged_ops, &pcfg, &in, &err), LOOM_OK, "%s", err.message);

    int32_t fit_paged = 0, fit_contig = 0;
    static int32_t toks[64][32];
    for (int i = 0; i < 64; i++) {
        for (int k = 0; k < seq_len; k++) toks[i][k] = i * 100 + k; /* no shared prefixes */
        loom_seq_info s = tc_seq(i, toks[i], seq_len, 0);
        if (pc.ops->allocate(pc.self, &s, seq_len, &err) != LOOM_OK) break;
        fit_paged++;
    }
    tc_close(&pc);

    open_contig(&cc, bs, nblocks, max_model_len);
    for (int i = 0; i < 64; i++) {
        if (alloc_n(&cc, i, seq_len) != LOOM_OK) break;
        fit_contig++;
    }
    tc_close(&cc);
    cr_log_info("%d-token sequences in %lld blocks of %lld: paged %d, contiguous %d", seq_len,
                (long long)nblocks, (long long)bs, fit_paged, fit_contig);
    cr_assert_eq(fit_paged, 32);
    cr_assert_eq(fit_contig, 4);
    cr_assert_gt(fit_paged, fit_contig);
}
