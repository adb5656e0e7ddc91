/*
 * tests/scheduler/test_random.c — randomized workloads over a small cache.
 *
 * Hundreds of requests with random prompt and output lengths, arrivals,
 * priorities, speculative drafts and aborts, in every scheduler mode. The
 * simulated core (sim.c) checks the contract on every step; at the end every
 * request must have finished exactly once with exactly its length (or been
 * aborted), no step may have scheduled nothing while work was live (no
 * deadlock, no stall), and the cache must be back to all blocks free.
 *
 * Seeds are fixed so failures reproduce; LOOM_TEST_SEED=<n> runs that seed
 * instead. Each run prints its seed.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "fake_host.h"
#include "sim.h"

typedef struct rand_case {
    const char *plugin;
    const char *params;
    int32_t num_cpu_blocks;
    int32_t prefix_tokens;
    bool drafts;
    bool long_prompts;       /* some prompts longer than max_batched_tokens */
} rand_case;

/* n requests; caller frees. Every one fits a 1024-token cache alone. */
static sim_req *random_requests(const rand_case *c, uint64_t seed, int32_t n) {
    uint64_t r = seed;
    sim_req *reqs = calloc((size_t)n, sizeof *reqs);
    cr_assert(reqs);
    for (int32_t i = 0; i < n; i++) {
        int32_t prompt = 1 + (int32_t)(sim_rand(&r) % 200);
        if (c->long_prompts && sim_rand(&r) % 10 == 0) prompt = 257 + (int32_t)(sim_rand(&r) % 340);
        int32_t out = 1 + (int32_t)(sim_rand(&r) % 120);
        int64_t arrive = 1 + (int64_t)(sim_rand(&r) % 400);
        reqs[i] = (sim_req){
            .prompt = prompt,
            .total = prompt + out,
            .priority = (int32_t)(sim_rand(&r) % 4),
            .arrive = arrive,
            .arrival_offset = (double)(sim_rand(&r) % 1000) * 1e-4,
            .abort_at = sim_rand(&r) % 20 == 0 ? arrive + (int64_t)(sim_rand(&r) % 200) : 0,
            .drafts = c->drafts && sim_rand(&r) % 3 == 0 ? 1 + (int32_t)(sim_rand(&r) % 3) : 0,
            .shared_prefix = sim_rand(&r) % 2 ? 48 : 0,
        };
    }
    return reqs;
}

static void run_random(const rand_case *c, uint64_t seed, int32_t n) {
    sim_req *reqs = random_requests(c, seed, n);
    /* 128 blocks x 8 = 1024 tokens: every request fits alone (<= 716), a
     * handful at once do not. */
    sim_opts o = {
        .plugin = c->plugin,
        .params = c->params,
        .block_size = 8,
        .num_blocks = 128,
        .num_cpu_blocks = c->num_cpu_blocks,
        .prefix_tokens = c->prefix_tokens,
        .seed = seed ^ 0x5eed,
    };
    sim *s = sim_new(&o, reqs, n);
    int64_t steps = sim_run(s, 200000);
    int32_t done = 0, aborted = 0;
    for (int32_t i = 0; i < n; i++) {
        done += s->seqs[i].state == SIM_DONE;
        aborted += s->seqs[i].state == SIM_ABORTED;
    }
    fprintf(stderr,
            "random %s [%s] seed=%llu: %d requests, %d done, %d aborted, %lld steps, "
            "preemptions recompute=%lld swap=%lld, peak blocks %d/%d\n",
            c->plugin, c->params, (unsigned long long)seed, n, done, aborted, (long long)steps,
            (long long)s->preempt_recompute, (long long)s->preempt_swap, s->fc->peak_used,
            s->num_blocks);
    cr_assert_eq(done + aborted, n);
    cr_assert_eq(s->empty_steps, 0, "seed %llu: %lld steps scheduled nothing with work live",
                 (unsigned long long)seed, (long long)s->empty_steps);
    cr_assert_gt(s->preempt_recompute + s->preempt_swap, 0,
                 "seed %llu: the cache was never short; the test is too easy",
                 (unsigned long long)seed);
    sim_free(s);
    free(reqs);
}

static void run_seeds(const rand_case *c) {
    const char *env = getenv("LOOM_TEST_SEED");
    if (env && *env) {
        run_random(c, strtoull(env, NULL, 10), 300);
        return;
    }
    const uint64_t seeds[] = {1, 2, 20240601};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) run_random(c, seeds[i], 300);
}

Test(scheduler, random_fcfs_recompute_chunked) {
    rand_case c = {"continuous", "max_num_seqs=16,max_batched_tokens=256", 0, 0, false, true};
    run_seeds(&c);
}

Test(scheduler, random_priority_swap_chunked) {
    rand_case c = {"continuous", "max_num_seqs=16,max_batched_tokens=256,policy=priority,"
                                 "preemption=swap", 48, 0, false, true};
    run_seeds(&c);
}

Test(scheduler, random_fcfs_swap_no_chunking) {
    rand_case c = {"continuous", "max_num_seqs=16,max_batched_tokens=256,chunked_prefill=false,"
                                 "preemption=swap", 48, 0, false, true};
    run_seeds(&c);
}

Test(scheduler, random_priority_recompute_no_chunking_prefix) {
    rand_case c = {"continuous", "max_num_seqs=16,max_batched_tokens=256,chunked_prefill=false,"
                                 "policy=priority,max_prefill_seqs=2", 0, 32, false, true};
    run_seeds(&c);
}

Test(scheduler, random_drafts) {
    rand_case c = {"continuous", "max_num_seqs=16,max_batched_tokens=128,preemption=swap", 64,
                   16, true, false};
    run_seeds(&c);
}

Test(scheduler, random_static) {
    rand_case c = {"static", "max_num_seqs=16,max_batched_tokens=256", 0, 16, true, true};
    run_seeds(&c);
}

/* ------------------------------------------------------- against `paged` */

static size_t paged_block_bytes(void *ctx, int32_t block_size) { return 4096; }

/* The same randomized workload against the real paged cache manager
 * (dlopen'ed from LOOM_CACHE_PAGED_SO, prefix caching and host swap on):
 * prefix hits make fresh entries start past 0, recompute victims find their
 * own freed blocks still cached, and at the end every block is free again. */
static void run_paged(const rand_case *c, uint64_t seed, int32_t n) {
    const char *path = getenv("LOOM_CACHE_PAGED_SO");
    const loom_host *host = fake_host();
    sched_plugin cp;
    plugin_open(path, LOOM_KIND_CACHE, &cp);
    const loom_cache_ops *cops = cp.comp->ops;
    void *ccfg = config_build(cp.comp, "block_size=8,num_blocks=128,num_cpu_blocks=48,"
                                       "prefix_caching=true");
    void *cself = NULL;
    loom_error err = {0};
    cr_assert_eq(cops->create(host, ccfg, &cself, &err), LOOM_OK, "paged create: %s",
                 err.message);
    loom_cache_init in = {
        .struct_size = sizeof in,
        .block_bytes = paged_block_bytes,
        .device_free_bytes = (size_t)1 << 30,
        .device_total_bytes = (size_t)1 << 31,
        .max_model_len = 1024,
        .backend_can_swap = true,
    };
    loom_kv_layout layout = {.struct_size = sizeof layout, .dtype = LOOM_DTYPE_F16};
    cr_assert_eq(cops->init(cself, &in, &layout, &err), LOOM_OK, "paged init: %s", err.message);
    cr_assert_eq(layout.num_blocks, 128);

    sim_req *reqs = random_requests(c, seed, n);
    sim_opts o = {.plugin = c->plugin, .params = c->params, .seed = seed,
                  .cache_ops = cops, .cache_self = cself, .host = host};
    sim *s = sim_new(&o, reqs, n);
    int64_t steps = sim_run(s, 200000);
    loom_cache_stats cs = {.struct_size = sizeof cs};
    cops->stats(cself, &cs);
    fprintf(stderr,
            "paged %s [%s] seed=%llu: %lld steps, preemptions recompute=%lld swap=%lld, "
            "prefix hits %lld/%lld tokens, swaps out %lld in %lld, %lld block ops\n",
            c->plugin, c->params, (unsigned long long)seed, (long long)steps,
            (long long)s->preempt_recompute, (long long)s->preempt_swap,
            (long long)cs.prefix_hits, (long long)cs.prefix_queries, (long long)cs.swaps_out,
            (long long)cs.swaps_in, (long long)s->block_ops);
    cr_assert_eq(s->empty_steps, 0);
    cr_assert_gt(cs.prefix_hits, 0, "shared prompt prefixes never hit the prefix cache");
    cr_assert_eq(cs.free_cpu_blocks, cs.num_cpu_blocks, "host blocks leaked");
    sim_free(s);
    free(reqs);
    cops->destroy(cself);
    free(ccfg);
    plugin_close(&cp);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked host allocations");
}

Test(scheduler, paged_integration) {
    if (!getenv("LOOM_CACHE_PAGED_SO") || !*getenv("LOOM_CACHE_PAGED_SO"))
        cr_skip_test("LOOM_CACHE_PAGED_SO unset: plugins/cache/paged is not built in this tree");
    rand_case cases[] = {
        {"continuous", "max_num_seqs=16,max_batched_tokens=256,preemption=swap", 0, 0, true,
         true},
        {"continuous", "max_num_seqs=16,max_batched_tokens=256,policy=priority", 0, 0, false,
         true},
        {"static", "max_num_seqs=16,max_batched_tokens=256", 0, 0, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_paged(&cases[i], 11 + i, 300);
}
