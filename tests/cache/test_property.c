/*
 * tests/cache/test_property.c — randomized property tests of the paged and
 * contiguous managers: the conformance kit's cache.traffic check
 * (conformance/cf_cache.c: random admission with shared prefixes, prefill
 * chunks, decodes, drafts, forks, truncation, recompute and swap
 * preemption, finishing, over a simulated backend whose every slot
 * remembers what was written there) in more configurations than `loom
 * plugin-test` runs, with each manager's debug hooks as the kit's probe:
 *   - paged: every block's refcount equals the live table references to
 *     it (device and host), the unreferenced count equals num_free_blocks,
 *     its own structural check passes after every operation, swapped
 *     sequences' host blocks keep their data, tables hold exactly what
 *     their tokens need, and blocks holding drafts are never in the prefix
 *     cache; one case forces prefix-key collisions (8 keys) so the
 *     full-hash + stored-token check must reject wrong hits;
 *   - contiguous: its structural check, no block in two tables, exact
 *     tables, and never a prefix hit.
 * Each case must also exercise what it claims (the pool ran full, prefix
 * hits, swaps, copy-on-write).
 *
 * The seed comes from LOOM_TEST_SEED if set, else the clock; it is printed
 * so a failure can be replayed exactly.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>

#include "conformance.h"
#include "contiguous.h"
#include "paged.h"

static bool paged_self_check(void *self, char *why, size_t cap) { return loom_paged_debug_check(self, why, cap); }
static bool contig_self_check(void *self, char *why, size_t cap) {
    return loom_contiguous_debug_check(self, why, cap);
}
static void paged_collide(void *self) { loom_paged_debug_set_key_mask(self, 0x7); }

static const loom_conformance_cache_probe k_paged_probe = {
    .refcount = loom_paged_debug_refcount,
    .hashed = loom_paged_debug_hashed,
    .self_check = paged_self_check,
    .host_table = loom_paged_debug_table,
    .exact_tables = true,
    .group_host_table = loom_paged_debug_group_table,
};

static const loom_component k_paged = {.struct_size = sizeof(loom_component), .kind = LOOM_KIND_CACHE,
                                       .name = "paged", .ops = &loom_paged_ops, .params = loom_paged_params,
                                       .config_size = sizeof(loom_paged_config)};
static const loom_component k_contig = {.struct_size = sizeof(loom_component), .kind = LOOM_KIND_CACHE,
                                        .name = "contiguous", .ops = &loom_contiguous_ops,
                                        .params = loom_contiguous_params,
                                        .config_size = sizeof(loom_contiguous_config)};

/* One kit run; the host allocations are the kit's counting host's (it
 * fails the run on a leak). */
static loom_conformance_cache_tally run(const loom_component *comp, const loom_conformance_cache_case *c,
                                        const loom_conformance_cache_probe *probe) {
    uint64_t seed = loom_conformance_default_seed();
    fprintf(stderr, "cache property %s: seed=0x%llx (replay with LOOM_TEST_SEED)\n", c->label,
            (unsigned long long)seed);
    cr_log_info("cache property %s: seed=0x%llx", c->label, (unsigned long long)seed);
    loom_conformance_cache_tally y = {0};
    char why[1024] = "";
    bool ok = loom_conformance_cache_traffic(comp, c, probe, seed, &y, why, sizeof why);
    fprintf(stderr,
            "cache property %s: %lld ops, %lld allocs (%lld NO_SPACE), %lld prefix-hit tokens, %lld copies, "
            "%lld swapped blocks, %lld forks, %lld drains, peak %d of %d blocks\n",
            c->label, (long long)y.ops, (long long)y.allocs, (long long)y.nospace, (long long)y.prefix_hit_tokens,
            (long long)y.copies, (long long)y.swapped_blocks, (long long)y.forks, (long long)y.drains, y.peak_used,
            y.num_blocks);
    cr_assert(ok, "%s", why);
    return y;
}

static void run_paged(const loom_conformance_cache_case *c) { run(&k_paged, c, &k_paged_probe); }

Test(cache, property_paged_bs4_prefix_swap, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=4 prefix+swap", "block_size=4,num_blocks=64,num_cpu_blocks=24,prefix_caching=true,watermark=0.05",
        128, 20000, true, true, true, true};
    run_paged(&c);
}

Test(cache, property_paged_bs1_prefix, .timeout = 120) {
    /* with 1-token blocks nothing is ever partial: no copy-on-write */
    loom_conformance_cache_case c = {"paged bs=1 prefix", "block_size=1,num_blocks=160,prefix_caching=true,watermark=0",
                                     128, 12000, true, true, false, false};
    run_paged(&c);
}

Test(cache, property_paged_bs5_noprefix_swap, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=5 no-prefix+swap", "block_size=5,num_blocks=40,num_cpu_blocks=16,prefix_caching=false,watermark=0.02",
        120, 12000, true, false, true, true};
    cr_assert_eq(run(&k_paged, &c, &k_paged_probe).prefix_hit_tokens, 0, "a prefix hit without prefix caching");
}

Test(cache, property_paged_bs16_prefix_swap, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=16 prefix+swap", "block_size=16,num_blocks=24,num_cpu_blocks=12,prefix_caching=true,watermark=0",
        192, 12000, true, true, true, true};
    run_paged(&c);
}

/* Only 8 table keys: most lookups land on a block with other contents,
 * which the full-hash + stored-token check must reject. */
Test(cache, property_paged_bs2_colliding_keys, .timeout = 120) {
    loom_conformance_cache_probe probe = k_paged_probe;
    probe.prepare = paged_collide;
    loom_conformance_cache_case c = {"paged bs=2 8 keys", "block_size=2,num_blocks=96,prefix_caching=true,watermark=0",
                                     96, 12000, true, true, false, true};
    run(&k_paged, &c, &probe);
}

/* Block-table groups (loom/cache.h): a global group beside windowed ones;
 * the kit checks every group's data, that windowed groups hold what the
 * next query reads and released everything before (exact_tables). */
static const loom_kv_groups k_gemma_like = {.struct_size = sizeof(loom_kv_groups), .num_groups = 4,
                                            .layers_per_block = 1, .num_layers = 4, .window = {0, 9, 9, 9}};
static const loom_kv_groups k_mixed_windows = {.struct_size = sizeof(loom_kv_groups), .num_groups = 3,
                                               .layers_per_block = 2, .num_layers = 5, .window = {1, 0, 14}};
static const loom_kv_groups k_all_local = {.struct_size = sizeof(loom_kv_groups), .num_groups = 1,
                                           .layers_per_block = 3, .num_layers = 3, .window = {7}};

Test(cache, property_paged_groups_bs4_prefix_swap, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=4 4 groups (0/9/9/9) prefix+swap",
        "block_size=4,num_blocks=120,num_cpu_blocks=40,prefix_caching=true,watermark=0.02", 128, 20000, true, true,
        true, true, &k_gemma_like, true};
    loom_conformance_cache_tally y = run(&k_paged, &c, &k_paged_probe);
    cr_assert_eq(y.num_groups, 4, "the paged manager did not take the proposed groups");
}

/* The same traffic from a seed that once reached a step where a global
 * group's copy-on-write needed the block a windowed group's drop frees
 * (the pool full): the copy was taken before the drop and got the free
 * list's sentinel, block 121 of 120. */
Test(cache, property_paged_groups_copy_after_drops, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=4 4 groups (0/9/9/9) prefix+swap, seed 0x4009b5cd4753",
        "block_size=4,num_blocks=120,num_cpu_blocks=40,prefix_caching=true,watermark=0.02", 128, 20000, true, true,
        true, true, &k_gemma_like, true};
    loom_conformance_cache_tally y = {0};
    char why[1024] = "";
    cr_assert(loom_conformance_cache_traffic(&k_paged, &c, &k_paged_probe, 0x4009b5cd4753ULL, &y, why, sizeof why),
              "%s", why);
    cr_assert_geq(y.copies, 1);
}

/* Windows of 1 (a query sees only itself) and 14 beside a global group in
 * the middle; 3-token blocks so windows end inside blocks. */
Test(cache, property_paged_groups_mixed_windows, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=3 3 groups (1/0/14) prefix+swap",
        "block_size=3,num_blocks=150,num_cpu_blocks=30,prefix_caching=true,watermark=0", 128, 20000, true, true,
        true, true, &k_mixed_windows, true};
    run_paged(&c);
}

/* One group, every layer windowed: the only table releases too, so prefix
 * hits need just the window's blocks (8 colliding keys for good measure). */
Test(cache, property_paged_one_windowed_group, .timeout = 120) {
    loom_conformance_cache_probe probe = k_paged_probe;
    probe.prepare = paged_collide;
    loom_conformance_cache_case c = {
        "paged bs=2 1 group (7) 8 keys", "block_size=2,num_blocks=48,num_cpu_blocks=16,prefix_caching=true,watermark=0",
        96, 20000, true, true, true, true, &k_all_local, true};
    run(&k_paged, &c, &probe);
}

/* sliding_window: off ignores the proposal: one table, nothing released. */
Test(cache, property_paged_groups_off, .timeout = 120) {
    loom_conformance_cache_case c = {
        "paged bs=4 groups proposed, off", "block_size=4,num_blocks=64,num_cpu_blocks=24,prefix_caching=true,"
                                           "watermark=0.02,sliding_window=off",
        128, 8000, true, true, true, true, &k_gemma_like, false};
    loom_conformance_cache_tally y = run(&k_paged, &c, &k_paged_probe);
    cr_assert(y.num_groups == 1 && y.released == 0, "off: %d groups, %lld released entries", y.num_groups,
              (long long)y.released);
}

Test(cache, property_contiguous, .timeout = 120) {
    loom_conformance_cache_probe probe = {.self_check = contig_self_check, .exact_tables = true,
                                          .never_shares = true};
    loom_conformance_cache_case c = {"contiguous bs=4", "block_size=4,num_blocks=70", 64, 12000, true, false, false,
                                     false};
    cr_assert_eq(run(&k_contig, &c, &probe).prefix_hit_tokens, 0, "contiguous has no prefix cache");
}
