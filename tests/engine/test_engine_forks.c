/*
 * tests/engine/test_engine_forks.c — n > 1 samples under a KV cache small
 * enough to force preemption, on random "tiny" dummy weights.
 *
 * Forked samples enter the scheduler already holding their parent's prompt
 * blocks. They must never keep an older sequence (a preempted parent, an
 * earlier request) from running: every request that fits the cache on its
 * own must finish with LENGTH — never "no progress possible" — and no block
 * may stay referenced afterwards. Covered for the continuous scheduler (with
 * and without prefix caching, recompute and swap) and the static one.
 * A fork the cache has no room for ends only the samples it concerns.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_util.h"

#define VOCAB 256
#define MAXREQ 8

/* nreq requests of n = 3 sampled (temperature 1, seeded) samples, prompts
 * of plen + 3 i tokens, max_tokens new each; every one must finish with
 * LENGTH. Returns the engine's preemption count. */
static int64_t run_forks(const char *pipeline, const char *const *ov, int32_t nreq, int32_t plen,
                         int32_t max_tokens, uint32_t seed, const char *what) {
    cr_assert_leq(nreq, MAXREQ);
    loom_engine *e = eng_open(pipeline, ov);
    int32_t p[MAXREQ][64];
    eng_rec r[MAXREQ];
    for (int32_t i = 0; i < nreq; i++) {
        eng_prompt(p[i], plen + 3 * i, seed * 31u + (uint32_t)i, VOCAB);
        eng_rec_init(&r[i], 3);
        loom_request rq = eng_req_tokens(p[i], plen + 3 * i, max_tokens);
        rq.n = 3;
        rq.params.temperature = 1.0f;
        rq.params.has_seed = true;
        rq.params.seed = seed * 1000u + (uint64_t)i;
        eng_add(e, rq, &r[i]);
    }
    eng_run(e, 20000);
    for (int32_t i = 0; i < nreq; i++) {
        eng_rec_check_done(&r[i]);
        for (int32_t k = 0; k < 3; k++) {
            const eng_sample *s = &r[i].s[k];
            cr_assert_neq(s->finish, LOOM_FINISH_ERROR, "%s, seed %u: request %d sample %d failed: %s", what,
                          seed, i, k, s->error);
            cr_assert_eq(s->finish, LOOM_FINISH_LENGTH, "%s, seed %u: request %d sample %d: finish %d", what,
                         seed, i, k, s->finish);
            cr_assert_eq(s->ntok, max_tokens, "%s, seed %u: request %d sample %d: %d tokens, asked %d", what,
                         seed, i, k, s->ntok, max_tokens);
        }
    }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0, "%s, seed %u: %d of %d KV blocks still referenced", what, seed,
                 st.kv_blocks_used, st.kv_blocks_total);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    for (int32_t i = 0; i < nreq; i++) eng_rec_free(&r[i]);
    loom_engine_destroy(e);
    return st.preemptions;
}

/* Four requests of n = 3, prompts of 10..19 tokens, 20 new tokens each, in
 * blocks of 8 tokens (max_model_len 40 = 5 blocks: every sequence fits the
 * pool on its own). Before the fix each of these pools stalled: forked
 * samples waited holding the prompt blocks, the running parents preempted
 * each other without freeing anything, and the engine failed requests with
 * "no progress possible". */
static void sweep(const char *pipeline, const char *extra, const int *pools, int npools) {
    const char *pc[] = {"cache.prefix_caching=true", "cache.prefix_caching=false"};
    int64_t preempt = 0;
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < npools; b++)
            for (uint32_t seed = 1; seed <= 2; seed++) {
                char nb[64], what[192];
                snprintf(nb, sizeof nb, "cache.num_blocks=%d", pools[b]);
                snprintf(what, sizeof what, "%s %s %s %s", pipeline, nb, pc[c], extra ? extra : "");
                const char *ov[] = {"engine.max_model_len=40", "cache.block_size=8", nb, pc[c], extra, NULL};
                preempt += run_forks(pipeline, ov, 4, 10, 20, seed, what);
            }
    cr_assert_gt(preempt, 0, "%s: the pools should force preemptions", pipeline);
}

static const int pools[] = {5, 6, 7, 8, 10};

Test(forks, continuous_recompute) { sweep("tiny.yaml", "scheduler.preemption=recompute", pools, 5); }

Test(forks, continuous_priority) { sweep("tiny.yaml", "scheduler.policy=priority", pools, 5); }

Test(forks, continuous_swap) {
    const int p[] = {5, 7, 10};
    sweep("tiny.yaml", "scheduler.preemption=swap", p, 3);
    /* The same with a host pool to swap into. */
    for (uint32_t seed = 1; seed <= 2; seed++) {
        const char *ov[] = {"engine.max_model_len=40", "cache.block_size=8",   "cache.num_blocks=7",
                            "cache.num_cpu_blocks=64", "scheduler.preemption=swap", NULL};
        run_forks("tiny.yaml", ov, 4, 10, 20, seed, "swap with a host pool");
    }
}

Test(forks, static_scheduler) {
    sweep("tiny_static.yaml", NULL, pools, 5);
    sweep("tiny_static.yaml", "scheduler.max_batched_tokens=8", pools, 5);
}

/* Small token budget: prompts are chunked, forks happen in later steps. */
Test(forks, continuous_chunked) { sweep("tiny.yaml", "scheduler.max_batched_tokens=8", pools, 5); }

/* A fork the cache cannot make (NO_SPACE, an ordinary result) ends only the
 * samples it concerns: the one being forked and those not yet created end
 * with an error event, the parent and earlier forks go on, other requests
 * run, the step succeeds and no block stays referenced. The contiguous
 * cache gives each sequence one whole region: `regions` regions of
 * max_model_len 40 in blocks of 8. */
static void fork_no_space(int32_t regions, int32_t want_ok) {
    char nb[64];
    snprintf(nb, sizeof nb, "cache.num_blocks=%d", 5 * regions);
    const char *ov[] = {"engine.max_model_len=40", "cache.block_size=8", nb, NULL};
    loom_engine *e = eng_open("tiny_contiguous.yaml", ov);
    int32_t pa[12], pb[9];
    eng_prompt(pa, 12, 1, VOCAB);
    eng_prompt(pb, 9, 2, VOCAB);
    eng_rec ra, rb;
    eng_rec_init(&ra, 3);
    eng_rec_init(&rb, 1);
    loom_request qa = eng_req_tokens(pa, 12, 6);
    qa.n = 3;
    qa.params.temperature = 1.0f;
    eng_add(e, qa, &ra);
    loom_error err = {0};
    int32_t active = 0;
    /* A alone: its prompt fits one step, so its forks happen before B arrives. */
    cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "%d regions: loom_engine_step: %s", regions,
                 err.message);
    eng_add(e, eng_req_tokens(pb, 9, 6), &rb);
    eng_run(e, 1000);
    eng_rec_check_done(&ra);
    eng_rec_check_done(&rb);
    for (int32_t k = 0; k < 3; k++) {
        const eng_sample *s = &ra.s[k];
        if (k < want_ok) {
            cr_assert_eq(s->finish, LOOM_FINISH_LENGTH, "%d regions: sample %d: finish %d (%s)", regions, k,
                         s->finish, s->error);
            cr_assert_eq(s->ntok, 6);
        } else {
            cr_assert_eq(s->finish, LOOM_FINISH_ERROR, "%d regions: sample %d: finish %d, want ERROR", regions,
                         k, s->finish);
            cr_assert(strstr(s->error, "fork") && strstr(s->error, "cache.contiguous"),
                      "%d regions: sample %d: error '%s' should say the fork failed and why", regions, k,
                      s->error);
        }
    }
    cr_assert_eq(rb.s[0].finish, LOOM_FINISH_LENGTH, "the other request: finish %d (%s)", rb.s[0].finish,
                 rb.s[0].error);
    cr_assert_eq(rb.s[0].ntok, 6);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0, "%d of %d KV blocks still referenced", st.kv_blocks_used,
                 st.kv_blocks_total);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    eng_rec_free(&ra);
    eng_rec_free(&rb);
    loom_engine_destroy(e);
}

/* One region: neither fork fits; two regions: the first fits, the second not. */
Test(forks, fork_no_space_ends_those_samples_only) {
    fork_no_space(1, 1);
    fork_no_space(2, 2);
}
