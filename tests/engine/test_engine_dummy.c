/*
 * tests/engine/test_engine_dummy.c — the engine end to end on random "tiny"
 * dummy weights (tests/engine/data/tiny*.yaml): always runs, no model file.
 * Token-id prompts, ignore_eos. Covers exact lengths, scheduler/cache A/B
 * equivalence, batch invariance with chunked prefill, preemption (recompute
 * and swap), n > 1 samples, seeds, abort from another thread, submission
 * from several threads and the request validation of loom_engine_add_request.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eng_util.h"
#include "plugin/host.h" /* loom_metrics_get */

#define VOCAB 256

static bool same_tokens(const eng_sample *a, const eng_sample *b) {
    return a->ntok == b->ntok && !memcmp(a->tokens, b->tokens, (size_t)a->ntok * sizeof(int32_t));
}

/* ------------------------------------------------------------ lengths */

Test(dummy, exact_length_and_events) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    cr_assert_eq(loom_engine_vocab_size(e), VOCAB);
    cr_assert_eq(loom_engine_max_context(e), 128);
    int32_t p[10];
    eng_prompt(p, 10, 1, VOCAB);
    eng_rec r;
    eng_rec_init(&r, 1);
    int64_t id = eng_add(e, eng_req_tokens(p, 10, 20), &r);
    eng_run(e, 1000);
    eng_rec_check_done(&r);
    cr_assert_eq(r.seen_id, id);
    cr_assert_eq(r.s[0].ntok, 20, "generated %d tokens, want exactly 20", r.s[0].ntok);
    cr_assert_eq(r.s[0].finish, LOOM_FINISH_LENGTH);
    for (int32_t i = 0; i < 20; i++) {
        cr_assert(r.s[0].tokens[i] >= 0 && r.s[0].tokens[i] < VOCAB);
        cr_assert(r.s[0].lps[i] <= 0.0f && isfinite(r.s[0].lps[i]));
    }
    cr_assert_eq(r.s[0].len, 0, "a model without tokenizer streams no text");
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.prompt_tokens, 10);
    cr_assert_eq(st.prefill_tokens, 10);
    cr_assert_eq(st.generated_tokens, 20);
    cr_assert_eq(st.preemptions, 0);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    cr_assert_eq(st.kv_blocks_used, 0, "%d KV blocks still referenced after the request finished", st.kv_blocks_used);
    cr_assert_gt(st.kv_blocks_peak, 0);
    /* the backend's share of the step time: measured, and part of it */
    cr_assert_gt(st.backend_seconds, 0.0);
    cr_assert_leq(st.backend_seconds, st.prefill_seconds + st.decode_seconds);
    /* by kind: the 10-token prompt in one prefill step, then 19 one-token
     * decode steps (the prefill step sampled the first token) */
    cr_assert_eq(st.kind_steps[LOOM_STEP_PREFILL], 1);
    cr_assert_eq(st.kind_tokens[LOOM_STEP_PREFILL], 10);
    cr_assert_eq(st.kind_steps[LOOM_STEP_MIXED], 0);
    cr_assert_eq(st.kind_steps[LOOM_STEP_DECODE], 19);
    cr_assert_eq(st.kind_tokens[LOOM_STEP_DECODE], 19);
    double sum = 0, sum_backend = 0;
    for (int k = 0; k < LOOM_STEP_KINDS; k++) {
        sum += st.kind_seconds[k];
        sum_backend += st.kind_backend_seconds[k];
        cr_assert_leq(st.kind_backend_seconds[k], st.kind_seconds[k]);
    }
    cr_assert_float_eq(sum, st.prefill_seconds + st.decode_seconds, 1e-9);
    cr_assert_float_eq(sum_backend, st.backend_seconds, 1e-9);
    eng_rec_free(&r);
    loom_engine_destroy(e);
}

/* Same ids twice in one engine (the second hits the prefix cache) and in a
 * fresh engine: identical tokens and log-probs. */
Test(dummy, greedy_deterministic) {
    int32_t p[40];
    eng_prompt(p, 40, 2, VOCAB);
    eng_rec a, b, c;
    eng_rec_init(&a, 1);
    eng_rec_init(&b, 1);
    eng_rec_init(&c, 1);
    loom_engine *e = eng_open("tiny.yaml", NULL);
    eng_add(e, eng_req_tokens(p, 40, 16), &a);
    eng_run(e, 1000);
    eng_add(e, eng_req_tokens(p, 40, 16), &b);
    eng_run(e, 1000);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_gt(st.cached_prompt_tokens, 0, "the second identical prompt should hit the prefix cache");
    cr_assert_eq(st.prompt_tokens, 80);
    cr_assert_eq(st.prefill_tokens + st.cached_prompt_tokens, 80,
                 "prefill %lld + cached %lld != prompt tokens 80", (long long)st.prefill_tokens,
                 (long long)st.cached_prompt_tokens);
    loom_engine_destroy(e);
    e = eng_open("tiny.yaml", NULL);
    eng_add(e, eng_req_tokens(p, 40, 16), &c);
    eng_run(e, 1000);
    loom_engine_destroy(e);
    cr_assert(same_tokens(&a.s[0], &b.s[0]), "same prompt twice, different greedy tokens");
    cr_assert(same_tokens(&a.s[0], &c.s[0]), "same prompt in a fresh engine, different greedy tokens");
    for (int32_t i = 0; i < 16; i++) cr_assert_float_eq(a.s[0].lps[i], c.s[0].lps[i], 1e-5);
    eng_rec_free(&a);
    eng_rec_free(&b);
    eng_rec_free(&c);
}

/* The batch's block-table rows are as wide as the step's longest context,
 * not max_model_len (loom/backend.h: >= the blocks any sequence uses), and
 * the tokens do not depend on max_model_len. tiny: 16-token blocks; at
 * max_model_len 128 a row could hold 8. */
Test(dummy, block_table_rows_follow_the_contexts) {
    const char *const wide[] = {"engine.max_model_len=256", NULL};
    eng_rec a[3], b[3];
    int32_t p[3][40];
    const int32_t len[3] = {9, 40, 23};
    loom_engine *e = eng_open("tiny.yaml", NULL);
    loom_engine *w = eng_open("tiny.yaml", wide);
    for (int k = 0; k < 3; k++) {
        eng_rec_init(&a[k], 1);
        eng_rec_init(&b[k], 1);
        eng_prompt(p[k], len[k], 30 + (uint32_t)k, VOCAB);
        eng_add(e, eng_req_tokens(p[k], len[k], 7), &a[k]);
        eng_add(w, eng_req_tokens(p[k], len[k], 7), &b[k]);
    }
    eng_run(e, 1000);
    /* the last step fed the 40-token prompt's 6th new token: 46 positions, 3 blocks */
    cr_assert_eq(loom_metrics_get("engine.block_table_width"), 3, "block-table rows of %g entries, want 3",
                 loom_metrics_get("engine.block_table_width"));
    eng_run(w, 1000);
    cr_assert_eq(loom_metrics_get("engine.block_table_width"), 3);
    for (int k = 0; k < 3; k++) {
        eng_rec_check_done(&a[k]);
        eng_rec_check_done(&b[k]);
        cr_assert_eq(a[k].s[0].ntok, 7);
        cr_assert(same_tokens(&a[k].s[0], &b[k].s[0]), "request %d: other tokens at max_model_len 256", k);
        for (int32_t i = 0; i < 7; i++) cr_assert_float_eq(a[k].s[0].lps[i], b[k].s[0].lps[i], 1e-6);
        eng_rec_free(&a[k]);
        eng_rec_free(&b[k]);
    }
    loom_engine_destroy(e);
    loom_engine_destroy(w);
}

/* A conversation needs a tokenizer: dummy weights refuse it by name. */
Test(dummy, messages_need_tokenizer) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    const loom_chat_message m[] = {{"user", "hi"}};
    loom_request rq = loom_request_default();
    rq.messages = m;
    rq.num_messages = 1;
    loom_error err = {0};
    cr_assert_eq(loom_engine_add_request(e, &rq, &err), -1);
    cr_assert(strstr(err.message, "no tokenizer") && strstr(err.message, "conversation"), "%s", err.message);
    loom_engine_destroy(e);
}

/* max_tokens beyond the context: LENGTH at max_model_len. A prompt of
 * max_model_len - 1 tokens gets exactly one new token. */
Test(dummy, context_caps_length) {
    const char *ov[] = {"engine.max_model_len=64", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[63];
    eng_prompt(p, 63, 3, VOCAB);
    eng_rec a, b, c;
    eng_rec_init(&a, 1);
    eng_rec_init(&b, 1);
    eng_rec_init(&c, 1);
    eng_add(e, eng_req_tokens(p, 50, 1000), &a);
    eng_add(e, eng_req_tokens(p, 63, 5), &b);
    eng_add(e, eng_req_tokens(p, 10, 0), &c); /* 0 = up to the context */
    eng_run(e, 1000);
    eng_rec_check_done(&a);
    eng_rec_check_done(&b);
    eng_rec_check_done(&c);
    cr_assert_eq(a.s[0].ntok, 14, "prompt 50 + %d new != context 64", a.s[0].ntok);
    cr_assert_eq(a.s[0].finish, LOOM_FINISH_LENGTH);
    cr_assert_eq(b.s[0].ntok, 1);
    cr_assert_eq(b.s[0].finish, LOOM_FINISH_LENGTH);
    cr_assert_eq(c.s[0].ntok, 54);
    eng_rec_free(&a);
    eng_rec_free(&b);
    eng_rec_free(&c);
    loom_engine_destroy(e);
}

/* ------------------------------------------------- A/B equivalence */

#define NP 6
static const int32_t k_lens[NP] = {5, 37, 12, 64, 23, 48};
static const int32_t k_outs[NP] = {20, 9, 16, 12, 25, 7};

/* Run the NP prompts (all at once, or one by one) through an engine. */
static void run_set(const char *pipe, const char *const *ov, bool together, int32_t logprobs, eng_rec *recs,
                    loom_engine_stats *st) {
    int32_t p[NP][64];
    loom_engine *e = eng_open(pipe, ov);
    for (int i = 0; i < NP; i++) {
        eng_prompt(p[i], k_lens[i], 100 + (uint32_t)i, VOCAB);
        eng_rec_init(&recs[i], 1);
        loom_request rq = eng_req_tokens(p[i], k_lens[i], k_outs[i]);
        rq.params.logprobs = logprobs;
        eng_add(e, rq, &recs[i]);
        if (!together) eng_run(e, 10000);
    }
    eng_run(e, 10000);
    for (int i = 0; i < NP; i++) {
        eng_rec_check_done(&recs[i]);
        cr_assert_eq(recs[i].s[0].ntok, k_outs[i], "%s: request %d made %d tokens, want %d", pipe, i,
                     recs[i].s[0].ntok, k_outs[i]);
    }
    if (st) loom_engine_get_stats(e, st, sizeof *st);
    loom_engine_destroy(e);
}

static void compare_sets(eng_rec *a, eng_rec *b, const char *what) {
    for (int i = 0; i < NP; i++) {
        char w[256];
        snprintf(w, sizeof w, "%s, request %d", what, i);
        eng_same_greedy(&a[i].s[0], &b[i].s[0], 1e-3f, w);
        eng_rec_free(&b[i]);
    }
}

/* Six prompts together, with max_batched_tokens 24 so prompts are chunked
 * and chunks run next to decodes, give what each gives alone. */
Test(dummy, batch_invariance_chunked_prefill) {
    eng_rec alone[NP], batch[NP];
    const char *ov[] = {"cache.prefix_caching=false", NULL};
    const char *ovb[] = {"cache.prefix_caching=false", "scheduler.max_batched_tokens=24", NULL};
    run_set("tiny.yaml", ov, false, 2, alone, NULL);
    loom_engine_stats st;
    run_set("tiny.yaml", ovb, true, 2, batch, &st);
    cr_assert_geq(st.max_running, 3, "the batch never ran more than %d sequences together", st.max_running);
    compare_sets(alone, batch, "alone vs chunked batch");
    for (int i = 0; i < NP; i++) eng_rec_free(&alone[i]);
}

Test(dummy, scheduler_cache_equivalence) {
    eng_rec ref[NP], other[NP];
    loom_engine_stats st;
    run_set("tiny.yaml", NULL, true, 2, ref, NULL);
    run_set("tiny_static.yaml", NULL, true, 2, other, NULL);
    compare_sets(ref, other, "continuous+paged vs static+paged");
    run_set("tiny_contiguous.yaml", NULL, true, 2, other, &st);
    cr_assert_eq(st.cached_prompt_tokens, 0);
    compare_sets(ref, other, "continuous+paged vs continuous+contiguous");
    const char *ov[] = {"cache.prefix_caching=false", NULL};
    run_set("tiny.yaml", ov, true, 2, other, NULL);
    compare_sets(ref, other, "prefix caching on vs off");
    const char *ov2[] = {"cache.block_size=8", "scheduler.max_batched_tokens=16", NULL};
    run_set("tiny.yaml", ov2, true, 2, other, NULL);
    compare_sets(ref, other, "block_size 16 vs 8 with chunked prefill");
    for (int i = 0; i < NP; i++) eng_rec_free(&ref[i]);
}

/* ------------------------------------------------------- preemption */

/* Context 64 = 4 blocks of 16 per sequence; the pool holds 6: the NP
 * requests cannot all run, sequences are preempted and resumed. */
Test(dummy, preemption_recompute) {
    eng_rec ref[NP], small[NP];
    run_set("tiny.yaml", (const char *const[]){"engine.max_model_len=96", NULL}, true, 2, ref, NULL);
    loom_engine_stats st;
    run_set("tiny.yaml",
            (const char *const[]){"engine.max_model_len=96", "cache.num_blocks=8", "scheduler.preemption=recompute",
                                  NULL},
            true, 2, small, &st);
    cr_assert_gt(st.preemptions, 0, "a pool of 8 blocks should force preemptions");
    cr_assert_eq(st.kv_blocks_total, 8);
    cr_assert_leq(st.kv_blocks_peak, 8);
    cr_assert_eq(st.kv_blocks_used, 0, "%d blocks still referenced after every request finished",
                 st.kv_blocks_used);
    /* "prompt tokens served by prefix cache" cannot exceed the prompt
     * tokens admitted, however often sequences were re-admitted. */
    cr_assert_leq(st.cached_prompt_tokens, st.prompt_tokens,
                  "cached_prompt_tokens %lld > prompt_tokens %lld (prefill %lld, preemptions %lld)",
                  (long long)st.cached_prompt_tokens, (long long)st.prompt_tokens, (long long)st.prefill_tokens,
                  (long long)st.preemptions);
    compare_sets(ref, small, "unconstrained vs recompute preemption");
    /* The static scheduler under the same memory pressure (it may simply
     * admit fewer sequences per batch instead of preempting). */
    run_set("tiny_static.yaml", (const char *const[]){"engine.max_model_len=96", "cache.num_blocks=8", NULL}, true, 2,
            small, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    compare_sets(ref, small, "unconstrained vs static scheduler preempting");
    for (int i = 0; i < NP; i++) eng_rec_free(&ref[i]);
}

Test(dummy, preemption_swap) {
    eng_rec ref[NP], small[NP];
    run_set("tiny.yaml", (const char *const[]){"engine.max_model_len=96", NULL}, true, 2, ref, NULL);
    loom_engine_stats st;
    run_set("tiny.yaml",
            (const char *const[]){"engine.max_model_len=96", "cache.num_blocks=8", "cache.num_cpu_blocks=64",
                                  "scheduler.preemption=swap", NULL},
            true, 2, small, &st);
    cr_assert_gt(st.preemptions, 0);
    cr_assert_gt(st.swaps_out, 0, "swap mode with a host pool should swap out (preemptions %lld)",
                 (long long)st.preemptions);
    cr_assert_eq(st.swaps_in, st.swaps_out, "swapped out %lld blocks, back in %lld", (long long)st.swaps_out,
                 (long long)st.swaps_in);
    cr_assert_eq(st.kv_blocks_used, 0);
    compare_sets(ref, small, "unconstrained vs swap preemption");
    for (int i = 0; i < NP; i++) eng_rec_free(&ref[i]);
}

/* Abort a request while it is swapped out to the host pool: it ends with
 * ABORT, its blocks come back, the others finish unchanged. */
Test(dummy, abort_while_swapped) {
    const char *ov[] = {"engine.max_model_len=96", "cache.num_blocks=8", "cache.num_cpu_blocks=64",
                        "scheduler.preemption=swap", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[NP][64];
    eng_rec r[NP];
    int64_t ids[NP];
    for (int i = 0; i < NP; i++) {
        eng_prompt(p[i], k_lens[i], 100 + (uint32_t)i, VOCAB);
        eng_rec_init(&r[i], 1);
        ids[i] = eng_add(e, eng_req_tokens(p[i], k_lens[i], k_outs[i]), &r[i]);
    }
    int32_t active = 0;
    loom_error err = {0};
    loom_engine_stats st;
    int steps = 0;
    do {
        cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "%s", err.message);
        loom_engine_get_stats(e, &st, sizeof st);
    } while (st.swapped == 0 && active > 0 && ++steps < 1000);
    cr_assert_gt(st.swapped, 0, "nothing was ever swapped out");
    /* The continuous scheduler swaps out the latest arrival first: abort
     * the latest unfinished request that already produced tokens. */
    int aborted = -1;
    for (int i = NP - 1; i >= 0 && aborted < 0; i--)
        if (r[i].s[0].finals == 0 && r[i].s[0].ntok > 0) aborted = i;
    cr_assert_geq(aborted, 0);
    loom_engine_abort(e, ids[aborted]);
    eng_run(e, 10000);
    loom_engine_get_stats(e, &st, sizeof st);
    for (int i = 0; i < NP; i++) {
        eng_rec_check_done(&r[i]);
        if (i == aborted) cr_assert_eq(r[i].s[0].finish, LOOM_FINISH_ABORT);
        else cr_assert_eq(r[i].s[0].ntok, k_outs[i]);
        eng_rec_free(&r[i]);
    }
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0, "running %d waiting %d swapped %d", st.running,
                 st.waiting, st.swapped);
    loom_engine_destroy(e);
}

/* A pool of exactly one sequence's worth of blocks serves it. */
Test(dummy, pool_holds_one_sequence) {
    const char *ov[] = {"engine.max_model_len=32", "cache.num_blocks=2", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[20];
    eng_prompt(p, 20, 9, VOCAB);
    eng_rec r;
    eng_rec_init(&r, 1);
    eng_add(e, eng_req_tokens(p, 20, 10), &r);
    eng_run(e, 1000);
    eng_rec_check_done(&r);
    cr_assert_eq(r.s[0].ntok, 10);
    eng_rec_free(&r);
    loom_engine_destroy(e);
}

/* ------------------------------------------------------ n > 1, seeds */

static void run_one(loom_engine *e, loom_request rq, eng_rec *r) {
    eng_rec_init(r, rq.n);
    eng_add(e, rq, r);
    eng_run(e, 10000);
    eng_rec_check_done(r);
}

Test(dummy, n3_greedy_identical) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    int32_t p[30];
    eng_prompt(p, 30, 5, VOCAB);
    loom_request rq = eng_req_tokens(p, 30, 12);
    eng_rec one, three;
    run_one(e, rq, &one);
    rq.n = 3;
    run_one(e, rq, &three);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(three.s[k].ntok, 12);
        cr_assert_eq(three.s[k].finish, LOOM_FINISH_LENGTH);
        cr_assert(same_tokens(&three.s[k], &one.s[0]), "greedy sample %d differs from the n=1 run", k);
    }
    eng_rec_free(&one);
    eng_rec_free(&three);
    loom_engine_destroy(e);
}

/* n = 3 with max_tokens 1: every sample ends right at its first token,
 * the forked children inside the fork itself. */
Test(dummy, n3_one_token_each) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    int32_t p[20];
    eng_prompt(p, 20, 15, VOCAB);
    loom_request rq = eng_req_tokens(p, 20, 1);
    rq.n = 3;
    rq.params.temperature = 1.0f;
    rq.params.seed = 3;
    rq.params.has_seed = true;
    eng_rec r;
    run_one(e, rq, &r);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(r.s[k].ntok, 1, "sample %d: %d tokens", k, r.s[k].ntok);
        cr_assert_eq(r.s[k].finish, LOOM_FINISH_LENGTH);
    }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.generated_tokens, 3);
    cr_assert_eq(st.prefill_tokens, 20, "the prompt of an n = 3 request must be computed once");
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    eng_rec_free(&r);
    loom_engine_destroy(e);
}

Test(dummy, n3_seeded_samples) {
    int32_t p[30];
    eng_prompt(p, 30, 6, VOCAB);
    loom_request rq = eng_req_tokens(p, 30, 12);
    rq.n = 3;
    rq.params.temperature = 1.0f;
    rq.params.seed = 1234;
    rq.params.has_seed = true;
    eng_rec a, b, c;
    loom_engine *e = eng_open("tiny.yaml", NULL);
    run_one(e, rq, &a);
    run_one(e, rq, &b); /* same engine: prefix-cached prompt */
    loom_engine_destroy(e);
    /* A fresh engine, the request batched with two others. */
    e = eng_open("tiny.yaml", NULL);
    int32_t q[20];
    eng_prompt(q, 20, 7, VOCAB);
    eng_rec o1, o2;
    eng_rec_init(&o1, 1);
    eng_rec_init(&o2, 1);
    eng_rec_init(&c, 3);
    loom_request x = eng_req_tokens(q, 20, 15);
    x.params.temperature = 1.0f;
    eng_add(e, x, &o1);
    eng_add(e, rq, &c);
    eng_add(e, eng_req_tokens(q, 11, 6), &o2);
    eng_run(e, 10000);
    eng_rec_check_done(&c);
    loom_engine_destroy(e);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(a.s[k].ntok, 12);
        cr_assert(same_tokens(&a.s[k], &b.s[k]), "seeded sample %d not reproducible in one engine", k);
        cr_assert(same_tokens(&a.s[k], &c.s[k]), "seeded sample %d changed when batched with others", k);
        for (int j = 0; j < k; j++)
            cr_assert(!same_tokens(&a.s[k], &a.s[j]), "samples %d and %d are identical at temperature 1", j, k);
    }
    eng_rec_free(&a);
    eng_rec_free(&b);
    eng_rec_free(&c);
    eng_rec_free(&o1);
    eng_rec_free(&o2);
}

Test(dummy, seeds) {
    int32_t p[16];
    eng_prompt(p, 16, 8, VOCAB);
    loom_engine *e = eng_open("tiny.yaml", NULL);
    eng_rec r[4];
    const uint64_t seeds[4] = {1, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        loom_request rq = eng_req_tokens(p, 16, 16);
        rq.params.temperature = 1.0f;
        rq.params.seed = seeds[i];
        rq.params.has_seed = true;
        run_one(e, rq, &r[i]);
    }
    cr_assert(same_tokens(&r[0].s[0], &r[1].s[0]), "same seed, different tokens");
    cr_assert(!same_tokens(&r[0].s[0], &r[2].s[0]), "seeds 1 and 2 gave the same 16 tokens");
    cr_assert(!same_tokens(&r[2].s[0], &r[3].s[0]), "seeds 2 and 3 gave the same 16 tokens");
    for (int i = 0; i < 4; i++) eng_rec_free(&r[i]);
    loom_engine_destroy(e);
}

/* ------------------------------------------------------------- abort */

typedef struct abort_ctx {
    loom_engine *e;
    atomic_llong target;      /* request to abort, -1 until known           */
    atomic_int tokens;        /* tokens of the target seen so far            */
    atomic_int posted;        /* abort posted                                */
    eng_rec rec;
} abort_ctx;

/* Records the target's events; on its 3rd token, waits (on the stepping
 * thread) until the other thread has posted the abort, so the abort lands
 * while the request is certainly still running. */
static void abort_cb(void *user, const loom_token_event *ev) {
    abort_ctx *c = user;
    eng_on_token(&c->rec, ev);
    if (ev->token >= 0 && ev->finish == LOOM_FINISH_NONE && atomic_fetch_add(&c->tokens, 1) + 1 == 3) {
        for (int i = 0; i < 5000 && !atomic_load(&c->posted); i++) usleep(1000);
    }
}

static void *abort_thread(void *arg) {
    abort_ctx *c = arg;
    while (atomic_load(&c->tokens) < 3) usleep(200);
    loom_engine_abort(c->e, atomic_load(&c->target));
    atomic_store(&c->posted, 1);
    return NULL;
}

Test(dummy, abort_from_thread) {
    abort_ctx c = {0};
    atomic_init(&c.target, -1);
    eng_rec_init(&c.rec, 1);
    c.e = eng_open("tiny.yaml", NULL);
    int32_t p[12];
    eng_prompt(p, 12, 10, VOCAB);
    loom_request rq = eng_req_tokens(p, 12, 100);
    rq.on_token = abort_cb;
    rq.user = &c;
    loom_error err = {0};
    int64_t id = loom_engine_add_request(c.e, &rq, &err);
    cr_assert_geq(id, 0);
    atomic_store(&c.target, id);
    eng_rec other;
    eng_rec_init(&other, 1);
    eng_add(c.e, eng_req_tokens(p, 8, 30), &other);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, abort_thread, &c), 0);
    eng_run(c.e, 10000);
    pthread_join(th, NULL);
    eng_rec_check_done(&c.rec);
    eng_rec_check_done(&other);
    cr_assert_eq(c.rec.s[0].finish, LOOM_FINISH_ABORT);
    cr_assert_lt(c.rec.s[0].ntok, 100);
    cr_assert_geq(c.rec.s[0].ntok, 3);
    cr_assert_eq(other.s[0].finish, LOOM_FINISH_LENGTH);
    cr_assert_eq(other.s[0].ntok, 30);
    /* Aborting an unknown or a finished id is harmless; the engine serves on. */
    cr_assert_eq(loom_engine_abort(c.e, 987654), LOOM_OK);
    cr_assert_eq(loom_engine_abort(c.e, id), LOOM_OK);
    cr_assert_eq(loom_engine_abort(c.e, -5), LOOM_OK);
    eng_rec after;
    run_one(c.e, eng_req_tokens(p, 12, 7), &after);
    cr_assert_eq(after.s[0].ntok, 7);
    cr_assert_eq(after.s[0].finish, LOOM_FINISH_LENGTH);
    cr_assert_eq(c.rec.s[0].finals, 1, "an abort of a finished request produced another event");
    loom_engine_stats st;
    loom_engine_get_stats(c.e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    eng_rec_free(&c.rec);
    eng_rec_free(&other);
    eng_rec_free(&after);
    loom_engine_destroy(c.e);
}

/* Aborted before its first step (still in the inbox), and aborted while its
 * prompt is half prefilled: every sample of an n = 3 request ends with one
 * ABORT event. */
Test(dummy, abort_before_running_n3) {
    const char *ov[] = {"scheduler.max_batched_tokens=16", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[60];
    eng_prompt(p, 60, 11, VOCAB);
    loom_request rq = eng_req_tokens(p, 60, 10);
    rq.n = 3;
    eng_rec a, b;
    eng_rec_init(&a, 3);
    eng_rec_init(&b, 3);
    int64_t ida = eng_add(e, rq, &a);
    cr_assert_eq(loom_engine_abort(e, ida), LOOM_OK);
    eng_run(e, 100);
    int64_t idb = eng_add(e, rq, &b);
    int32_t active = 0;
    loom_error err = {0};
    cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "%s", err.message); /* 16 of 60 prompt tokens */
    cr_assert_eq(active, 1);
    cr_assert_eq(b.s[0].ntok, 0);
    loom_engine_abort(e, idb);
    eng_run(e, 100);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(a.s[k].finals, 1, "sample %d of a request aborted in the inbox got %d final events", k,
                     a.s[k].finals);
        cr_assert_eq(a.s[k].finish, LOOM_FINISH_ABORT);
        cr_assert_eq(b.s[k].finals, 1, "sample %d of a request aborted during prefill got %d final events", k,
                     b.s[k].finals);
        cr_assert_eq(b.s[k].finish, LOOM_FINISH_ABORT);
    }
    eng_rec_free(&a);
    eng_rec_free(&b);
    loom_engine_destroy(e);
}

/* Aborted after the fork: all three running samples end with ABORT. */
Test(dummy, abort_after_fork_n3) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    int32_t p[20];
    eng_prompt(p, 20, 16, VOCAB);
    loom_request rq = eng_req_tokens(p, 20, 50);
    rq.n = 3;
    rq.params.temperature = 1.0f;
    eng_rec r;
    eng_rec_init(&r, 3);
    int64_t id = eng_add(e, rq, &r);
    int32_t active = 0;
    loom_error err = {0};
    for (int i = 0; i < 4; i++) cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK);
    for (int k = 0; k < 3; k++) cr_assert_eq(r.s[k].ntok, 4, "sample %d: %d tokens after 4 steps", k, r.s[k].ntok);
    loom_engine_abort(e, id);
    eng_run(e, 10);
    eng_rec_check_done(&r);
    for (int k = 0; k < 3; k++) cr_assert_eq(r.s[k].finish, LOOM_FINISH_ABORT);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    eng_rec_free(&r);
    loom_engine_destroy(e);
}

/* Destroying an engine with requests queued, running and swapped frees
 * everything (checked by the ASan build). */
Test(dummy, destroy_with_requests_in_flight) {
    const char *ov[] = {"engine.max_model_len=64", "cache.num_blocks=6", "cache.num_cpu_blocks=32",
                        "scheduler.preemption=swap", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[40];
    eng_prompt(p, 40, 17, VOCAB);
    eng_rec r[5];
    const char *stop[] = {"x", NULL};
    for (int i = 0; i < 4; i++) {
        eng_rec_init(&r[i], 2);
        loom_request rq = eng_req_tokens(p, 10 + i * 5, 40);
        rq.n = 2;
        rq.stop = stop;
        eng_add(e, rq, &r[i]);
    }
    int32_t active = 0;
    loom_error err = {0};
    for (int i = 0; i < 12; i++) cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "%s", err.message);
    cr_assert_gt(active, 0);
    eng_rec_init(&r[4], 1);
    eng_add(e, eng_req_tokens(p, 5, 5), &r[4]); /* still in the inbox */
    loom_engine_abort(e, 0);                    /* and an abort queued */
    loom_engine_destroy(e);
    for (int i = 0; i < 5; i++) eng_rec_free(&r[i]);
}

/* ------------------------------------------------- thread submission */

#define NTHREADS 4
#define PER_THREAD 10

typedef struct submit_ctx {
    loom_engine *e;
    int t;
    eng_rec recs[PER_THREAD];
    int64_t ids[PER_THREAD];
    atomic_int *added;
} submit_ctx;

static void *submit_thread(void *arg) {
    submit_ctx *c = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        int32_t p[24];
        int32_t len = 4 + (c->t * 7 + i * 3) % 20;
        eng_prompt(p, len, (uint32_t)(c->t * 100 + i), VOCAB);
        eng_rec_init(&c->recs[i], 1);
        loom_request rq = eng_req_tokens(p, len, 3 + i % 5);
        rq.on_token = eng_on_token;
        rq.user = &c->recs[i];
        loom_error err = {0};
        c->ids[i] = loom_engine_add_request(c->e, &rq, &err); /* copies the prompt */
        atomic_fetch_add(c->added, 1);
        if (i % 3 == 0) usleep(500);
    }
    return NULL;
}

Test(dummy, threaded_submission) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    atomic_int added;
    atomic_init(&added, 0);
    submit_ctx *c = calloc(NTHREADS, sizeof *c);
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        c[t].e = e;
        c[t].t = t;
        c[t].added = &added;
        cr_assert_eq(pthread_create(&th[t], NULL, submit_thread, &c[t]), 0);
    }
    loom_error err = {0};
    int32_t active = 0;
    for (int steps = 0;; steps++) {
        cr_assert_lt(steps, 100000, "added %d, active %d", atomic_load(&added), active);
        cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "%s", err.message);
        if (active == 0 && atomic_load(&added) == NTHREADS * PER_THREAD) break;
        if (active == 0) usleep(100);
    }
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    bool seen[NTHREADS * PER_THREAD] = {0};
    for (int t = 0; t < NTHREADS; t++) {
        for (int i = 0; i < PER_THREAD; i++) {
            int64_t id = c[t].ids[i];
            cr_assert(id >= 0 && id < NTHREADS * PER_THREAD, "request id %lld", (long long)id);
            cr_assert(!seen[id], "request id %lld given twice", (long long)id);
            seen[id] = true;
            eng_rec_check_done(&c[t].recs[i]);
            cr_assert_eq(c[t].recs[i].seen_id, id);
            cr_assert_eq(c[t].recs[i].s[0].ntok, 3 + i % 5);
            cr_assert_eq(c[t].recs[i].s[0].finish, LOOM_FINISH_LENGTH);
            eng_rec_free(&c[t].recs[i]);
        }
    }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.running + st.waiting + st.swapped, 0);
    free(c);
    loom_engine_destroy(e);
}

/* ------------------------------------------------------------ score */

/* Teacher-forced log-probs of prompt + greedy output equal the log-probs
 * the greedy run streamed (same model, same positions). Also across the
 * 256-token chunk boundary of loom_engine_score. */
static void score_vs_generation(const char *const *ov, int32_t plen, int32_t gen) {
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t *p = malloc((size_t)(plen + gen) * sizeof(int32_t));
    eng_prompt(p, plen, 19, VOCAB);
    eng_rec r;
    eng_rec_init(&r, 1);
    loom_request rq = eng_req_tokens(p, plen, gen);
    rq.params.logprobs = 1; /* events carry logprobs only when asked */
    eng_add(e, rq, &r);
    eng_run(e, 10000);
    eng_rec_check_done(&r);
    cr_assert_eq(r.s[0].ntok, gen);
    memcpy(p + plen, r.s[0].tokens, (size_t)gen * sizeof(int32_t));
    float *lp = malloc((size_t)(plen + gen) * sizeof(float));
    loom_error err = {0};
    cr_assert_eq(loom_engine_score(e, p, plen + gen, lp, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(lp[0], 0.0f);
    for (int32_t i = 0; i < gen; i++)
        cr_assert(fabsf(lp[plen + i] - r.s[0].lps[i]) <= 1e-3f, "token %d: score %.6f vs generation %.6f", i,
                  (double)lp[plen + i], (double)r.s[0].lps[i]);
    for (int32_t i = 1; i < plen + gen; i++) cr_assert(lp[i] <= 0.0f && isfinite(lp[i]), "lp[%d] = %g", i, lp[i]);
    /* Twice gives the same numbers; the cache is left empty. */
    float *lp2 = malloc((size_t)(plen + gen) * sizeof(float));
    cr_assert_eq(loom_engine_score(e, p, plen + gen, lp2, &err), LOOM_OK, "%s", err.message);
    cr_assert(!memcmp(lp, lp2, (size_t)(plen + gen) * sizeof(float)), "scoring twice differs");
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.kv_blocks_used, 0, "%d blocks held after loom_engine_score", st.kv_blocks_used);
    /* The engine still generates the same afterwards. */
    eng_rec again;
    eng_rec_init(&again, 1);
    eng_add(e, rq, &again);
    eng_run(e, 10000);
    cr_assert(same_tokens(&again.s[0], &r.s[0]), "generation changed after loom_engine_score");
    eng_rec_free(&r);
    eng_rec_free(&again);
    free(p);
    free(lp);
    free(lp2);
    loom_engine_destroy(e);
}

Test(dummy, score_matches_generation) {
    score_vs_generation(NULL, 30, 20);
}

/* 300 tokens: loom_engine_score runs two chunks (256 + 44); the generated
 * tokens sit on both sides of the boundary. */
Test(dummy, score_matches_generation_across_chunks) {
    const char *ov[] = {"engine.max_model_len=320", NULL};
    score_vs_generation(ov, 200, 100);
}

Test(dummy, score_bad_calls) {
    const char *ov[] = {"engine.max_model_len=256", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[256];
    eng_prompt(p, 256, 20, VOCAB);
    float lp[256];
    loom_error err = {0};
    cr_assert_eq(loom_engine_score(e, p, 256, lp, &err), LOOM_OK, "%s", err.message);
    cr_assert_neq(loom_engine_score(e, p, 257, lp, &err), LOOM_OK);
    cr_assert(strstr(err.message, "257"), "%s", err.message);
    cr_assert_neq(loom_engine_score(e, p, 0, lp, &err), LOOM_OK);
    int32_t bad[3] = {1, 300, 2};
    cr_assert_neq(loom_engine_score(e, bad, 3, lp, &err), LOOM_OK);
    cr_assert(strstr(err.message, "300"), "%s", err.message);
    /* Not while a request is active. */
    eng_rec r;
    eng_rec_init(&r, 1);
    eng_add(e, eng_req_tokens(p, 10, 5), &r);
    cr_assert_neq(loom_engine_score(e, p, 10, lp, &err), LOOM_OK);
    eng_run(e, 100);
    cr_assert_eq(loom_engine_score(e, p, 10, lp, &err), LOOM_OK, "%s", err.message);
    eng_rec_free(&r);
    loom_engine_destroy(e);
}

/* --------------------------------------------------------- bad input */

static void expect_reject(loom_engine *e, const loom_request *rq, const char *needle, const char *what) {
    loom_error err = {0};
    int64_t id = loom_engine_add_request(e, rq, &err);
    cr_assert_eq(id, -1, "%s: accepted (id %lld)", what, (long long)id);
    cr_assert(err.message[0], "%s: rejected without a message", what);
    if (needle) cr_assert(strstr(err.message, needle), "%s: message '%s' lacks '%s'", what, err.message, needle);
}

/* OpenAI logit_bias through the engine: +100 on a token makes greedy
 * decoding emit it at every step (n = 2 forks share the request's copy);
 * its reported logprob stays the model's (below 0); bad entries are refused
 * at add_request by name. */
Test(dummy, logit_bias_forces_and_bad_entries_are_refused) {
    int32_t p[24];
    eng_prompt(p, 24, 5, VOCAB);
    loom_engine *e = eng_open("tiny.yaml", NULL);
    eng_rec plain, biased;
    loom_request rq = eng_req_tokens(p, 24, 6);
    run_one(e, rq, &plain);
    const int32_t forced = plain.s[0].tokens[0] == 7 ? 8 : 7;
    loom_logit_bias b[2] = {{forced, 100.0f}, {plain.s[0].tokens[0], -100.0f}};
    rq.logit_bias = b, rq.num_logit_bias = 2, rq.n = 2;
    rq.params.logprobs = 1;
    run_one(e, rq, &biased);
    b[0].token = -3; /* the engine copied the array: the run above is unaffected */
    for (int32_t k = 0; k < 2; k++)
        for (int32_t i = 0; i < 6; i++) {
            cr_assert_eq(biased.s[k].tokens[i], forced, "sample %d step %d: %d, not the biased token %d", k, i,
                         biased.s[k].tokens[i], forced);
            cr_assert_lt(biased.s[k].lps[i], -1e-3f, "sample %d step %d: logprob %g is the biased one", k, i,
                         (double)biased.s[k].lps[i]);
        }
    loom_request bad = eng_req_tokens(p, 24, 4);
    loom_logit_bias out_of_vocab[1] = {{VOCAB, 1.0f}}, too_big[1] = {{1, 101.0f}}, twice[2] = {{3, 1.0f}, {3, 2.0f}};
    bad.logit_bias = out_of_vocab, bad.num_logit_bias = 1;
    expect_reject(e, &bad, "outside the vocabulary", "logit_bias token past the vocabulary");
    bad.logit_bias = too_big;
    expect_reject(e, &bad, "outside [-100, 100]", "logit_bias of 101");
    bad.logit_bias = twice, bad.num_logit_bias = 2;
    expect_reject(e, &bad, "appears twice", "logit_bias token twice");
    bad.logit_bias = NULL;
    expect_reject(e, &bad, "NULL array", "logit_bias count without an array");
    bad.num_logit_bias = LOOM_MAX_LOGIT_BIAS + 1;
    expect_reject(e, &bad, "at most", "too many logit_bias entries");
    loom_engine_destroy(e);
    eng_rec_free(&plain);
    eng_rec_free(&biased);
}

Test(dummy, bad_requests) {
    const char *ov[] = {"engine.max_model_len=64", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[70];
    eng_prompt(p, 70, 12, VOCAB);
    loom_request rq = eng_req_tokens(p, 70, 4);
    expect_reject(e, &rq, "prompt is 70 tokens", "prompt longer than the context");
    expect_reject(e, &rq, "holds 64", "prompt longer than the context");
    rq.num_tokens = 64;
    expect_reject(e, &rq, "64", "prompt as long as the context");

    rq = loom_request_default();
    expect_reject(e, &rq, NULL, "no prompt at all");
    rq = eng_req_tokens(p, 0, 4);
    expect_reject(e, &rq, NULL, "zero prompt tokens");
    rq.prompt = "hello";
    rq.tokens = NULL;
    expect_reject(e, &rq, "no tokenizer", "text prompt on a dummy model");

    int32_t bad[3] = {5, 256, 7};
    rq = eng_req_tokens(bad, 3, 4);
    expect_reject(e, &rq, "index 1", "token id = vocab");
    bad[1] = -1;
    expect_reject(e, &rq, "-1", "negative token id");

    rq = eng_req_tokens(p, 8, 4);
    rq.params.top_p = 0.0f;
    expect_reject(e, &rq, "top_p", "top_p = 0");
    rq = eng_req_tokens(p, 8, 4);
    rq.params.temperature = -1.0f;
    expect_reject(e, &rq, "temperature", "temperature = -1");
    rq = eng_req_tokens(p, 8, 4);
    rq.params.temperature = NAN;
    expect_reject(e, &rq, "temperature", "temperature = NaN");
    rq = eng_req_tokens(p, 8, 4);
    rq.params.top_k = -3;
    expect_reject(e, &rq, "top_k", "top_k = -3");
    rq = eng_req_tokens(p, 8, 4);
    rq.params.min_p = 1.5f;
    expect_reject(e, &rq, "min_p", "min_p = 1.5");
    rq = eng_req_tokens(p, 8, 4);
    rq.params.logprobs = LOOM_MAX_LOGPROBS + 1;
    expect_reject(e, &rq, "logprobs", "logprobs above the maximum");
    rq = eng_req_tokens(p, 8, 4);
    rq.struct_size = 0;
    expect_reject(e, &rq, "struct_size", "struct_size 0");
    rq.struct_size = sizeof rq + 64;
    expect_reject(e, &rq, "struct_size", "struct_size too large");
    loom_error err = {0};
    cr_assert_eq(loom_engine_add_request(e, NULL, &err), -1);
    cr_assert_eq(loom_engine_add_request(NULL, &rq, &err), -1);

    /* Nothing was queued; the engine still serves a good request, whose id
     * is the first one. */
    int32_t active = -1;
    cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK);
    cr_assert_eq(active, 0);
    eng_rec ok;
    eng_rec_init(&ok, 1);
    int64_t id = eng_add(e, eng_req_tokens(p, 63, 4), &ok);
    cr_assert_eq(id, 0, "rejected requests consumed ids (first good id %lld)", (long long)id);
    eng_run(e, 100);
    eng_rec_check_done(&ok);
    cr_assert_eq(ok.s[0].ntok, 1);
    eng_rec_free(&ok);
    loom_engine_destroy(e);
}

/* Parameters only the sampler rejects (a non-positive repetition penalty,
 * +inf temperature, NaN penalties, more logprobs than the sampler's
 * max_logprobs) must hurt only their own request: rejected at add, or
 * ended with an ERROR event, while a good request in the same batch
 * completes and loom_engine_step keeps returning LOOM_OK. */
static void sampler_only_bad(loom_request bad_rq, const char *what) {
    const char *ov[] = {"sampler.max_logprobs=2", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[16];
    eng_prompt(p, 16, 13, VOCAB);
    eng_rec good, bad;
    eng_rec_init(&good, 1);
    eng_rec_init(&bad, 1);
    eng_add(e, eng_req_tokens(p, 16, 8), &good);
    bad_rq.tokens = p;
    bad_rq.num_tokens = 10;
    bad_rq.on_token = eng_on_token;
    bad_rq.user = &bad;
    loom_error err = {0};
    int64_t id = loom_engine_add_request(e, &bad_rq, &err);
    int32_t active = 1, steps = 0;
    while (active > 0 && steps++ < 100) {
        loom_status st = loom_engine_step(e, &active, &err);
        cr_assert_eq(st, LOOM_OK, "%s: one request's parameters failed the whole step: %s", what, err.message);
    }
    eng_rec_check_done(&good);
    cr_assert_eq(good.s[0].ntok, 8);
    if (id >= 0) {
        eng_rec_check_done(&bad);
        cr_assert_eq(bad.s[0].finish, LOOM_FINISH_ERROR, "%s: accepted and not ended with an error", what);
    }
    eng_rec_free(&good);
    eng_rec_free(&bad);
    loom_engine_destroy(e);
}

Test(dummy, sampler_rejected_params_repetition_penalty) {
    loom_request rq = eng_req_tokens(NULL, 0, 4);
    rq.params.repetition_penalty = 0.0f;
    sampler_only_bad(rq, "repetition_penalty = 0");
}

Test(dummy, sampler_rejected_params_inf_temperature) {
    loom_request rq = eng_req_tokens(NULL, 0, 4);
    rq.params.temperature = INFINITY;
    sampler_only_bad(rq, "temperature = +inf");
}

Test(dummy, sampler_rejected_params_logprobs) {
    loom_request rq = eng_req_tokens(NULL, 0, 4);
    rq.params.logprobs = 5; /* sampler.max_logprobs=2 */
    sampler_only_bad(rq, "logprobs 5 > sampler.max_logprobs 2");
}

Test(dummy, sampler_rejected_params_struct_size) {
    loom_request rq = eng_req_tokens(NULL, 0, 4);
    rq.params.struct_size = 0; /* e.g. a request built from {0} */
    sampler_only_bad(rq, "params.struct_size = 0");
}

/* A caller built against an older, shorter loom_request (struct_size ends
 * before `n`): the engine must not read `n` and later fields from it. */
Test(dummy, request_struct_size_respected) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    int32_t p[8];
    eng_prompt(p, 8, 18, VOCAB);
    loom_request rq = eng_req_tokens(p, 8, 5);
    rq.struct_size = (uint32_t)offsetof(loom_request, n);
    rq.n = 3;              /* beyond the caller's struct: must be ignored */
    loom_error err = {0};
    int64_t id = loom_engine_add_request(e, &rq, &err);
    cr_assert_geq(id, 0, "%s", err.message);
    eng_run(e, 100);
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_assert_eq(st.generated_tokens, 5, "generated %lld tokens: fields past struct_size were read",
                 (long long)st.generated_tokens);
    loom_engine_destroy(e);
}

Test(dummy, no_tokenizer_calls) {
    loom_engine *e = eng_open("tiny.yaml", NULL);
    int32_t *ids = NULL, n = 0;
    char *text = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_engine_tokenize(e, "hi", true, &ids, &n, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "no tokenizer"), "%s", err.message);
    int32_t one = 5;
    cr_assert_eq(loom_engine_detokenize(e, &one, 1, &text, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert_null(text);
    size_t len = 7;
    cr_assert_null(loom_engine_token_piece(e, 5, &len));
    cr_assert_eq(len, 0);
    cr_assert(!strncmp(loom_engine_model_name(e), "dummy tiny", 10), "%s", loom_engine_model_name(e));
    loom_engine_destroy(e);
}

Test(dummy, bad_pipelines) {
    loom_engine *e = (loom_engine *)0x1;
    loom_error err = {0};
    cr_assert_neq(loom_engine_create(NULL, NULL, 0, &e, &err), LOOM_OK);
    char *path = eng_data("tiny.yaml");
    const char *ov1[] = {"engine.max_model_len=1"};
    cr_assert_neq(loom_engine_create(path, ov1, 1, &e, &err), LOOM_OK);
    cr_assert_null(e);
    cr_assert(strstr(err.message, "max_model_len"), "%s", err.message);
    const char *ov2[] = {"scheduler.no_such_key=3"};
    cr_assert_neq(loom_engine_create(path, ov2, 1, &e, &err), LOOM_OK);
    cr_assert(strstr(err.message, "no_such_key"), "%s", err.message);
    const char *ov3[] = {"model.shape=no-such-shape"};
    cr_assert_neq(loom_engine_create(path, ov3, 1, &e, &err), LOOM_OK);
    cr_assert(strstr(err.message, "no-such-shape"), "%s", err.message);
    /* The context needs 300/16 blocks but only 4 exist. */
    const char *ov4[] = {"engine.max_model_len=256", "cache.num_blocks=4"};
    cr_assert_neq(loom_engine_create(path, ov4, 2, &e, &err), LOOM_OK);
    cr_assert(err.message[0]);
    free(path);
    char *missing = eng_data("does-not-exist.yaml");
    cr_assert_neq(loom_engine_create(missing, NULL, 0, &e, &err), LOOM_OK);
    cr_assert(strstr(err.message, "does-not-exist.yaml"), "%s", err.message);
    free(missing);
}

/* A sampler may leave the logprob alternatives unwritten (sampler "lazy",
 * lazy_sampler.c): the events then carry the padding loom/sampler.h
 * defines (-1, -inf), never what the engine's scratch held — for rows
 * sampled together and for the first token of a forked sample. */
typedef struct alt_rec {
    int32_t events, bad;
    char what[256];
} alt_rec;

static void alt_cb(void *user, const loom_token_event *ev) {
    alt_rec *r = user;
    if (ev->finish != LOOM_FINISH_NONE || ev->token < 0) return;
    r->events++;
    if (ev->num_top != 3) {
        if (!r->bad++) snprintf(r->what, sizeof r->what, "sample %d: num_top %d, want 3", ev->sample_index, ev->num_top);
        return;
    }
    for (int32_t k = 0; k < ev->num_top; k++)
        if (ev->top_ids[k] != -1 || ev->top_logprobs[k] != -INFINITY) {
            if (!r->bad++)
                snprintf(r->what, sizeof r->what, "sample %d: alternative %d is (%d, %g), want (-1, -inf)",
                         ev->sample_index, k, ev->top_ids[k], (double)ev->top_logprobs[k]);
            return;
        }
}

Test(dummy, unwritten_logprob_alternatives_are_padding) {
    const char *ov[] = {"sampler.plugin=lazy", NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    int32_t p[3][16];
    alt_rec recs[3] = {0};
    for (int i = 0; i < 3; i++) {
        eng_prompt(p[i], 10 + i, 40u + (uint32_t)i, VOCAB);
        loom_request rq = eng_req_tokens(p[i], 10 + i, 5);
        rq.params.logprobs = 3;
        rq.n = i == 2 ? 2 : 1;
        rq.on_token = alt_cb;
        rq.user = &recs[i];
        loom_error err = {0};
        cr_assert_geq(loom_engine_add_request(e, &rq, &err), 0, "%s", err.message);
    }
    eng_run(e, 1000);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(recs[i].events, i == 2 ? 10 : 5, "request %d: %d token events", i, recs[i].events);
        cr_assert_eq(recs[i].bad, 0, "request %d: %d events with garbage alternatives; first: %s", i, recs[i].bad,
                     recs[i].what);
    }
    loom_engine_destroy(e);
}

/* The quantizer's kv_dtype() reaches the backend only when it is one that
 * loom/quant.h allows (F32, F16, BF16, FP8_E4M3, or LOOM_DTYPE_COUNT for the
 * backend's default); anything else fails engine creation naming the
 * quantizer (test quantizer "badkv", badkv_quant.c). */
Test(dummy, quantizer_kv_dtype_checked) {
    char *path = eng_data("tiny.yaml");
    const int bad[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_I8, 99, -1};
    for (int i = 0; i < 4; i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "quantizer.kv=%d", bad[i]);
        const char *ov[] = {"quantizer.plugin=badkv", kv};
        loom_engine *e = (loom_engine *)0x1;
        loom_error err = {0};
        cr_assert_neq(loom_engine_create(path, ov, 2, &e, &err), LOOM_OK, "kv_dtype %d was accepted", bad[i]);
        cr_assert_null(e);
        char want[64];
        snprintf(want, sizeof want, "kv_dtype() returned %d", bad[i]);
        cr_assert(strstr(err.message, "quantizer 'badkv'") && strstr(err.message, want),
                  "kv_dtype %d: '%s' should name the quantizer and the value", bad[i], err.message);
    }
    const int good[] = {LOOM_DTYPE_COUNT, LOOM_DTYPE_F32};
    for (int i = 0; i < 2; i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "quantizer.kv=%d", good[i]);
        const char *ov[] = {"quantizer.plugin=badkv", kv};
        loom_engine *e = NULL;
        loom_error err = {0};
        cr_assert_eq(loom_engine_create(path, ov, 2, &e, &err), LOOM_OK, "kv_dtype %d: %s", good[i], err.message);
        loom_engine_destroy(e);
    }
    free(path);
}
