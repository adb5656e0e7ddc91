/*
 * tests/spec/test_engine.c — speculative decoding through the whole engine
 * (suite 'spec'), with the public API of loom/engine.h only:
 *
 *   - greedy outputs are identical with and without speculation (ngram and
 *     draft-model self-speculation) on the real model (LOOM_TEST_MODEL;
 *     skipped when unset), and the drafts were really accepted;
 *   - sampling with ngram drafts on the dummy "tiny" model runs, and the
 *     sampled tokens follow the same distribution as without speculation
 *     (two-sample chi-square over many seeded requests, temperature + top-k
 *     + top-p so the sampler's knobs apply to both p and q) — for ngram
 *     (one-hot q), a close draft model (stochastic q, mostly accepted) and
 *     an unrelated one (always rejected: the residual draws);
 *   - a draft with another vocabulary, or a missing draft pipeline, is
 *     refused with a clear message;
 *   - rollback property: random mixes of requests (lengths, n, sampling,
 *     aborts) under a small paged cache that preempts; every request ends
 *     as it should and no KV block is left in use afterwards (draft-model
 *     rounds go through propose_batch);
 *   - batch 4: greedy outputs identical with draft-model speculation, whose
 *     drafts come in one batched draft round per step;
 *   - the entry points: a speculator without propose_batch is asked per
 *     sequence, one with propose_batch once per step with every decoding sequence; greedy
 *     outputs identical to no speculation either way;
 *   - KV room: drafts that take every slot allowed never make the
 *     scheduler preempt where the run without drafts does not, through
 *     either entry point.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"
#include "plugin/host.h" /* loom_metrics_get: what the plugins counted */
#include "plugin/host_rules.h"

#define MAX_REQ 64
#define MAX_OUT 256

/* -------------------------------------------------------------- harness */

typedef struct gen {
    int32_t toks[MAX_REQ][4][MAX_OUT]; /* (request, sample, token)         */
    int32_t n[MAX_REQ][4];
    float gap[MAX_REQ][4][MAX_OUT];    /* top-1 minus top-2 logprob, or -1  */
    loom_finish_reason fin[MAX_REQ][4];
    char error[256];                   /* the first error message           */
    int32_t errors;                    /* finishes with ERROR               */
    int64_t base;                      /* request id of index 0             */
} gen;

static void on_token(void *user, const loom_token_event *ev) {
    gen *g = user;
    int64_t r = ev->request_id - g->base;
    if (r < 0 || r >= MAX_REQ || ev->sample_index < 0 || ev->sample_index >= 4) return;
    int s = ev->sample_index;
    if (ev->token >= 0 && g->n[r][s] < MAX_OUT) {
        g->gap[r][s][g->n[r][s]] = ev->num_top >= 2 ? ev->top_logprobs[0] - ev->top_logprobs[1] : -1.0f;
        g->toks[r][s][g->n[r][s]++] = ev->token;
    }
    if (ev->finish != LOOM_FINISH_NONE) {
        g->fin[r][s] = ev->finish;
        if (ev->finish == LOOM_FINISH_ERROR && !g->error[0])
            snprintf(g->error, sizeof g->error, "%s", ev->error ? ev->error : "?");
        if (ev->finish == LOOM_FINISH_ERROR) g->errors++;
    }
}

static char *data_path(const char *name) {
    const char *src = getenv("LOOM_SOURCE_DIR");
    static char buf[8][1024];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, sizeof buf[0], "%s/tests/spec/data/%s", src ? src : ".", name);
    return b;
}

static loom_engine *engine_new(const char *yaml, const char *const *ov, int32_t nov) {
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = loom_engine_create(data_path(yaml), ov, nov, &e, &err);
    cr_assert_eq(st, LOOM_OK, "creating %s: %s", yaml, err.message);
    return e;
}

static int64_t submit(loom_engine *e, gen *g, loom_request *rq) {
    rq->on_token = on_token;
    rq->user = g;
    loom_error err = {0};
    int64_t id = loom_engine_add_request(e, rq, &err);
    cr_assert(id >= 0, "add_request: %s", err.message);
    return id;
}

static void run_all(loom_engine *e) {
    loom_error err = {0};
    cr_assert_eq(loom_engine_run(e, &err), LOOM_OK, "engine: %s", err.message);
}

/* ------------------------------------------------ greedy on the real model */

static const char *k_prompts[] = {
    "Repeat the following paragraph exactly, word for word:\n\n"
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to "
    "continental Europe and North America during the nineteenth century. It replaced hand production "
    "with machines, introduced new chemical and iron production processes, and made steam power the "
    "engine of a new economy.",
    "Rename the variable `total` to `acc` in this Python function and print the whole function:\n\n"
    "def sum_list(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
    "    return total\n",
    "Copy this shopping list, putting a dash before each item:\n\napples\nbread\nmilk\neggs\n"
    "cheese\ntomatoes\nrice\ncoffee\n",
    /* the batch test's fourth */
    "List the planets of the solar system in order from the Sun, one per line, with one fact about "
    "each.",
};
#define NUM_PROMPTS 3
#define NUM_BATCH_PROMPTS 4
#define GREEDY_TOKENS 64

static bool have_model(void) {
    const char *m = getenv("LOOM_TEST_MODEL");
    return m && m[0];
}

/* n prompts through one engine: one at a time (`together` false: batch 1,
 * the case speculation is for) or all submitted before the first step
 * (batch n). KV blocks all back and no error at the end. */
static void greedy_prompts(const char *yaml, const char *const *ov, int32_t nov, int n, bool together, gen *g,
                           loom_engine_stats *st, bool tops) {
    loom_engine *e = engine_new(yaml, ov, nov);
    memset(g, 0, sizeof *g);
    for (int i = 0; i < n; i++) {
        loom_request rq = loom_request_default();
        rq.prompt = k_prompts[i];
        rq.chat = true;
        rq.max_tokens = GREEDY_TOKENS;
        rq.params.logprobs = tops ? 2 : 0;
        int64_t id = submit(e, g, &rq);
        if (i == 0) g->base = id;
        if (!together) run_all(e);
    }
    if (together) run_all(e);
    loom_engine_get_stats(e, st, sizeof *st);
    cr_assert_eq(st->kv_blocks_used, 0, "%s: %d KV blocks still used after every request ended", yaml,
                 st->kv_blocks_used);
    loom_engine_destroy(e);
    cr_assert_str_empty(g->error, "%s: %s", yaml, g->error);
}

static void greedy_run(const char *yaml, gen *g, loom_engine_stats *st, bool tops) {
    greedy_prompts(yaml, NULL, 0, NUM_PROMPTS, false, g, st, tops);
}

/* Identical token ids; on a difference, say where and how close the
 * baseline's top two logits were there. */
static void expect_same(const gen *base, const gen *spec, int nreq, const char *what) {
    for (int r = 0; r < nreq; r++) {
        int32_t n = base->n[r][0] < spec->n[r][0] ? base->n[r][0] : spec->n[r][0];
        int32_t i = 0;
        while (i < n && base->toks[r][0][i] == spec->toks[r][0][i]) i++;
        if (i == n && base->n[r][0] == spec->n[r][0]) continue;
        cr_expect_fail("%s, prompt %d: outputs differ at token %d of %d/%d (baseline %d, speculative %d); the "
                       "baseline's top-2 logprob gap there is %.6g",
                       what, r, i, base->n[r][0], spec->n[r][0], i < base->n[r][0] ? base->toks[r][0][i] : -1,
                       i < spec->n[r][0] ? spec->toks[r][0][i] : -1, i < base->n[r][0] ? base->gap[r][0][i] : -1);
    }
}

Test(spec, greedy_identical_ngram, .timeout = 120) {
    if (!have_model()) cr_skip_test("LOOM_TEST_MODEL is not set: no real-model speculation test");
    static gen base, spec;
    loom_engine_stats sb, ss;
    greedy_run("smol.yaml", &base, &sb, true);
    greedy_run("smol_ngram.yaml", &spec, &ss, false);
    expect_same(&base, &spec, NUM_PROMPTS, "ngram");
    cr_expect(ss.spec_proposed > 0 && ss.spec_accepted > 0, "ngram: proposed %lld, accepted %lld",
              (long long)ss.spec_proposed, (long long)ss.spec_accepted);
    cr_expect(ss.steps < sb.steps, "ngram took %lld steps, baseline %lld: speculation saved none",
              (long long)ss.steps, (long long)sb.steps);
    cr_log_info("ngram: proposed %lld accepted %lld (%.1f%%), steps %lld vs %lld",
                (long long)ss.spec_proposed, (long long)ss.spec_accepted,
                100.0 * ss.spec_accepted / (ss.spec_proposed ? ss.spec_proposed : 1), (long long)ss.steps,
                (long long)sb.steps);
}

Test(spec, greedy_identical_draft_self, .timeout = 180) {
    if (!have_model()) cr_skip_test("LOOM_TEST_MODEL is not set: no real-model speculation test");
    static gen base, spec;
    loom_engine_stats sb, ss;
    greedy_run("smol.yaml", &base, &sb, true);
    greedy_run("smol_draft.yaml", &spec, &ss, false);
    expect_same(&base, &spec, NUM_PROMPTS, "draft-model (self)");
    double rate = ss.spec_proposed ? (double)ss.spec_accepted / ss.spec_proposed : 0;
    cr_expect(rate > 0.9, "self-drafting accepted %lld of %lld drafts (%.1f%%); expected ~100%%",
              (long long)ss.spec_accepted, (long long)ss.spec_proposed, 100 * rate);
    cr_log_info("draft-self: proposed %lld accepted %lld (%.1f%%), steps %lld vs %lld",
                (long long)ss.spec_proposed, (long long)ss.spec_accepted, 100 * rate, (long long)ss.steps,
                (long long)sb.steps);
}

/* The prompts all at once (batch 4). */
static void greedy_batch(const char *yaml, const char *const *ov, int32_t nov, gen *g, loom_engine_stats *st) {
    greedy_prompts(yaml, ov, nov, NUM_BATCH_PROMPTS, true, g, st, true);
}

/* Batch 4 with draft-model self-speculation: the same greedy tokens, and
 * the drafts of a step come from one batched draft round (k + 1 draft
 * steps for all four sequences, not 4 x (k + 1)). max_verify_tokens 16
 * keeps every verify step inside the CPU backend's batch-invariant GEMM
 * (<= 16 rows; above that sgemm sums in another order and a near-tie could
 * flip), so any difference is a bug, not rounding. */
Test(spec, greedy_identical_draft_batch, .timeout = 300) {
    if (!have_model()) cr_skip_test("LOOM_TEST_MODEL is not set: no real-model speculation test");
    static gen base, spec;
    loom_engine_stats sb, ss;
    greedy_batch("smol.yaml", NULL, 0, &base, &sb);
    const char *ov[] = {"speculator.max_verify_tokens=16", "speculator.overrides=cache.memory_gib=0.1"};
    greedy_batch("smol_draft.yaml", ov, 2, &spec, &ss);
    expect_same(&base, &spec, NUM_BATCH_PROMPTS, "draft-model (self), batch 4");
    cr_assert_geq(ss.max_running, NUM_BATCH_PROMPTS, "only %d sequences ran together", ss.max_running);
    double rate = ss.spec_proposed ? (double)ss.spec_accepted / ss.spec_proposed : 0;
    cr_expect(rate > 0.9, "self-drafting accepted %lld of %lld drafts (%.1f%%); expected ~100%%",
              (long long)ss.spec_accepted, (long long)ss.spec_proposed, 100 * rate);
    double rounds = loom_metrics_get("spec.draft-model.rounds");
    double reqs = loom_metrics_get("spec.draft-model.requests");
    double dsteps = loom_metrics_get("spec.draft-model.draft_steps");
    cr_assert(rounds > 0, "no draft rounds");
    /* k <= 3 here (16 rows / 4 sequences); per sequence it would be ~4 x 3 */
    cr_expect(reqs / rounds > 2.5, "%.0f draft requests in %.0f rounds: the sequences were not batched", reqs,
              rounds);
    cr_expect(dsteps / rounds < 5, "%.0f draft steps in %.0f rounds: not one batched round per step", dsteps, rounds);
    cr_log_info("draft-self batch 4: proposed %lld accepted %lld (%.1f%%), target steps %lld vs %lld; draft: "
                "%.0f rounds, %.0f requests, %.0f steps (%.2f steps per target step)",
                (long long)ss.spec_proposed, (long long)ss.spec_accepted, 100 * rate, (long long)ss.steps,
                (long long)sb.steps, rounds, reqs, dsteps, dsteps / (double)ss.steps);
}

/* A draft whose vocabulary differs from the target's is refused clearly
 * (the tiny dummy target, 256 tokens, drafting with the real model). */
Test(spec, draft_vocab_mismatch_is_an_error, .timeout = 60) {
    if (!have_model()) cr_skip_test("LOOM_TEST_MODEL is not set: no second vocabulary to mismatch");
    loom_engine *e = NULL;
    loom_error err = {0};
    const char *ov[] = {"speculator.plugin=draft-model", "speculator.pipeline=smol.yaml"};
    loom_status st = loom_engine_create(data_path("tiny.yaml"), ov, 2, &e, &err);
    cr_assert_neq(st, LOOM_OK, "a draft with another vocabulary must be refused");
    cr_assert_null(e);
    cr_assert(strstr(err.message, "vocabulary"), "the message should say why: %s", err.message);
    cr_log_info("%s", err.message);
}

/* --------------------------------------------------- sampling on tiny */

/* Prompt of `n` tokens with repeats, so the ngram drafter finds matches. */
static void make_prompt(int32_t *t, int32_t n, uint64_t seed) {
    uint64_t s[4];
    loom_rng_seed(s, seed);
    int32_t period = 5 + (int32_t)(loom_rng_next(s) % 12);
    for (int32_t i = 0; i < n; i++)
        t[i] = i < period || loom_rng_next(s) % 8 == 0 ? (int32_t)(loom_rng_next(s) % 256) : t[i - period];
}

Test(spec, sampling_ngram_tiny_runs) {
    loom_engine *e = engine_new("tiny_ngram.yaml", NULL, 0);
    static gen g;
    memset(&g, 0, sizeof g);
    int32_t prompt[40];
    for (int i = 0; i < 8; i++) {
        make_prompt(prompt, 40, 100 + (uint64_t)i);
        loom_request rq = loom_request_default();
        rq.tokens = prompt;
        rq.num_tokens = 40;
        rq.max_tokens = 48;
        rq.params.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.1f * (float)(i % 4);
        rq.params.top_k = i % 3 == 0 ? 0 : 20;
        rq.params.top_p = i % 2 ? 0.9f : 1.0f;
        rq.params.has_seed = true;
        rq.params.seed = (uint64_t)i;
        rq.n = i % 3 == 2 ? 2 : 1;
        int64_t id = submit(e, &g, &rq);
        if (i == 0) g.base = id;
    }
    run_all(e);
    cr_assert_str_empty(g.error, "%s", g.error);
    for (int i = 0; i < 8; i++)
        for (int s = 0; s < (i % 3 == 2 ? 2 : 1); s++) {
            cr_expect_eq(g.n[i][s], 48, "request %d sample %d produced %d tokens", i, s, g.n[i][s]);
            cr_expect_eq(g.fin[i][s], LOOM_FINISH_LENGTH);
            for (int t = 0; t < g.n[i][s]; t++) cr_assert(g.toks[i][s][t] >= 0 && g.toks[i][s][t] < 256);
        }
    loom_engine_stats st;
    loom_engine_get_stats(e, &st, sizeof st);
    cr_expect(st.spec_proposed > 0, "no drafts proposed");
    cr_expect(st.spec_accepted >= 0 && st.spec_accepted <= st.spec_proposed, "accepted %lld of %lld",
              (long long)st.spec_accepted, (long long)st.spec_proposed);
    cr_expect_eq(st.generated_tokens, 48 * 10); /* 6 requests of 1 sample, 2 of 2 */
    cr_expect_eq(st.kv_blocks_used, 0);
    loom_engine_destroy(e);
}

/* Chi-square critical value at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double a = 2.0 / (9.0 * df), c = 1.0 - a + 3.0902 * sqrt(a);
    return df * c * c * c;
}

/* Two-sample chi-square (homogeneity) over n cells; cells with a pooled
 * count under 10 are merged. Returns statistic / critical value. */
static double chi2_two_sample(const long *a, const long *b, int n, long na, long nb) {
    double stat = 0;
    long ra = 0, rb = 0;
    int cells = 0;
    for (int i = 0; i <= n; i++) {
        long x = i < n ? a[i] : ra, y = i < n ? b[i] : rb;
        if (i < n && x + y < 10) {
            ra += x;
            rb += y;
            continue;
        }
        if (x + y == 0) continue;
        double ea = (double)(x + y) * na / (na + nb), eb = (double)(x + y) * nb / (na + nb);
        stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        cells++;
    }
    return stat / chi2_crit(cells > 1 ? cells - 1 : 1);
}

/* The 2nd and 3rd generated tokens (the first verified ones) have the same
 * distribution with and without speculation (`spec_yaml`). The prompt is
 * the tiny model's own greedy continuation of a few tokens: random weights
 * fall into loops, so sampled continuations often repeat the prompt and
 * ngram drafts are both proposed and accepted. */
static void distribution_check(const char *spec_yaml, const char *spec_override, bool want_both, int n) {
    enum { SEED_LEN = 4, PL = 64 };
    static long cnt[2][2][256];
    memset(cnt, 0, sizeof cnt);
    int32_t prompt[PL];
    {
        loom_engine *e = engine_new("tiny.yaml", NULL, 0);
        static gen g;
        memset(&g, 0, sizeof g);
        for (int i = 0; i < SEED_LEN; i++) prompt[i] = i * 31 + 5;
        loom_request rq = loom_request_default();
        rq.tokens = prompt;
        rq.num_tokens = SEED_LEN;
        rq.max_tokens = PL - SEED_LEN;
        g.base = submit(e, &g, &rq);
        run_all(e);
        cr_assert_eq(g.n[0][0], PL - SEED_LEN);
        memcpy(prompt + SEED_LEN, g.toks[0][0], (PL - SEED_LEN) * sizeof(int32_t));
        loom_engine_destroy(e);
    }
    int64_t proposed = 0, accepted = 0;
    for (int mode = 0; mode < 2; mode++) {
        /* Requests in waves of MAX_REQ, on a cache that holds a wave. */
        const char *ov[] = {"cache.num_blocks=512", spec_override};
        loom_engine *e = engine_new(mode ? spec_yaml : "tiny.yaml", ov, mode && spec_override ? 2 : 1);
        static gen g;
        for (int w = 0; w * MAX_REQ < n; w++) {
            memset(&g, 0, sizeof g);
            int nr = n - w * MAX_REQ < MAX_REQ ? n - w * MAX_REQ : MAX_REQ;
            for (int i = 0; i < nr; i++) {
                loom_request rq = loom_request_default();
                rq.tokens = prompt;
                rq.num_tokens = PL;
                rq.max_tokens = 3;
                /* the tiny model's logits are flat: a low temperature
                 * makes the test sensitive (0.3 vs 0.4 is detected) */
                rq.params.temperature = 0.3f;
                rq.params.top_k = 12;
                rq.params.top_p = 0.95f;
                rq.params.has_seed = true;
                rq.params.seed = 1000003ULL * (uint64_t)(w * MAX_REQ + i) + (uint64_t)mode * 7;
                int64_t id = submit(e, &g, &rq);
                if (i == 0) g.base = id;
            }
            run_all(e);
            cr_assert_str_empty(g.error, "%s", g.error);
            for (int i = 0; i < nr; i++) {
                cr_assert_eq(g.n[i][0], 3);
                cnt[mode][0][g.toks[i][0][1]]++;
                cnt[mode][1][g.toks[i][0][2]]++;
            }
        }
        loom_engine_stats st;
        loom_engine_get_stats(e, &st, sizeof st);
        if (mode) {
            proposed = st.spec_proposed;
            accepted = st.spec_accepted;
        }
        cr_assert_eq(st.kv_blocks_used, 0);
        loom_engine_destroy(e);
    }
    cr_assert(proposed > n / 4, "%s: too few drafts to test anything: %lld proposed", spec_yaml,
              (long long)proposed);
    if (want_both)
        cr_expect(accepted > 0 && accepted < proposed, "%s: %lld of %lld drafts accepted: both outcomes should occur",
                  spec_yaml, (long long)accepted, (long long)proposed);
    cr_log_info("%s: %lld drafts proposed, %lld accepted", spec_yaml, (long long)proposed, (long long)accepted);
    for (int pos = 0; pos < 2; pos++) {
        double r = chi2_two_sample(cnt[0][pos], cnt[1][pos], 256, n, n);
        cr_log_info("%s, token %d: chi-square/critical %.3f", spec_yaml, pos + 2, r);
        cr_expect(r < 1, "%s, token %d: distributions with and without speculation differ (chi-square/critical %.3f)",
                  spec_yaml, pos + 2, r);
    }
}

/* ngram: deterministic drafts (q one-hot). */
Test(spec, sampling_distribution_ngram, .timeout = 120) { distribution_check("tiny_ngram.yaml", NULL, true, 6000); }

/* draft-model: stochastic drafts with q from the draft's sampler. A bf16
 * copy of the target: most drafts are accepted, some rejected. */
Test(spec, sampling_distribution_draft_model, .timeout = 120) { distribution_check("tiny_draft.yaml", NULL, true, 6000); }

/* An unrelated draft (other random weights; its top-k rarely meets the
 * target's): drafts are rejected and the residual max(0, p - q) draws. */
Test(spec, sampling_distribution_unrelated_draft, .timeout = 120) {
    distribution_check("tiny_draft.yaml", "speculator.overrides=model.seed=8;cache.num_blocks=256", false, 6000);
}

/* A draft pipeline that does not exist is refused with its path. */
Test(spec, draft_missing_pipeline_is_an_error) {
    loom_engine *e = NULL;
    loom_error err = {0};
    const char *ov[] = {"speculator.plugin=draft-model", "speculator.pipeline=no-such-draft.yaml"};
    loom_status st = loom_engine_create(data_path("tiny.yaml"), ov, 2, &e, &err);
    cr_assert_neq(st, LOOM_OK);
    cr_assert_null(e);
    cr_assert(strstr(err.message, "no-such-draft.yaml") && strstr(err.message, "draft-model"), "%s", err.message);
}

/* ------------------------------------------------- rollback property */

/* Random mixes: prompt lengths, repeats (drafts), n, greedy/sampled,
 * priorities, aborts; a cache of 48 blocks x 4 tokens forces preemption.
 * ngram drafts, and draft-model drafts in every third round. */
Test(spec, rollback_leaks_no_blocks, .timeout = 120) {
    uint64_t rng[4];
    loom_rng_seed(rng, 2024);
    int64_t total_proposed = 0, total_preempt = 0;
    double draft_rounds = 0, draft_reqs = 0;
    for (int round = 0; round < 30; round++) {
        /* Every third round drafts with the draft-model plugin instead. */
        loom_engine *e = engine_new(round % 3 == 2 ? "tiny_draft.yaml" : "tiny_ngram.yaml", NULL, 0);
        static gen g;
        memset(&g, 0, sizeof g);
        int nreq = 4 + (int)(loom_rng_next(rng) % 12);
        int32_t want[MAX_REQ], nsamp[MAX_REQ];
        int64_t ids[MAX_REQ];
        bool abort_me[MAX_REQ];
        for (int i = 0; i < nreq; i++) {
            int32_t pl = 4 + (int32_t)(loom_rng_next(rng) % 60);
            int32_t prompt[64];
            make_prompt(prompt, pl, loom_rng_next(rng));
            loom_request rq = loom_request_default();
            rq.tokens = prompt;
            rq.num_tokens = pl;
            want[i] = 1 + (int32_t)(loom_rng_next(rng) % 60);
            rq.max_tokens = want[i];
            rq.n = nsamp[i] = 1 + (int32_t)(loom_rng_next(rng) % 3);
            rq.params.temperature = loom_rng_next(rng) % 2 ? 0.0f : 0.9f;
            rq.params.has_seed = true;
            rq.params.seed = loom_rng_next(rng);
            rq.priority = (int32_t)(loom_rng_next(rng) % 3);
            ids[i] = submit(e, &g, &rq);
            if (i == 0) g.base = ids[i];
            abort_me[i] = loom_rng_next(rng) % 7 == 0;
        }
        int32_t active = 1, step = 0;
        loom_error err = {0};
        while (active > 0) {
            cr_assert_eq(loom_engine_step(e, &active, &err), LOOM_OK, "round %d: %s", round, err.message);
            step++;
            for (int i = 0; i < nreq; i++)
                if (abort_me[i] && step == 3 + i) loom_engine_abort(e, ids[i]);
            cr_assert(step < 5000, "round %d: no progress", round);
        }
        /* No error at all: every sequence fits this cache on its own, so
         * "no progress possible" (forked samples waiting with blocks while
         * a preempted parent cannot fit) must not happen either. */
        cr_assert_eq(g.errors, 0, "round %d: %d samples failed; first: %s", round, g.errors, g.error);
        for (int i = 0; i < nreq; i++)
            for (int s = 0; s < nsamp[i]; s++) {
                /* An abort before the prompt ran ends only sample 0 (the
                 * others never existed). */
                if (g.fin[i][s] == LOOM_FINISH_ABORT || g.fin[i][0] == LOOM_FINISH_ABORT) continue;
                cr_expect_eq(g.fin[i][s], LOOM_FINISH_LENGTH, "round %d req %d sample %d: finish %d", round, i, s,
                             g.fin[i][s]);
                cr_expect_eq(g.n[i][s], want[i], "round %d req %d sample %d: %d tokens, asked %d", round, i, s,
                             g.n[i][s], want[i]);
            }
        loom_engine_stats st;
        loom_engine_get_stats(e, &st, sizeof st);
        cr_assert_eq(st.kv_blocks_used, 0, "round %d: %d of %d KV blocks leaked", round, st.kv_blocks_used,
                     st.kv_blocks_total);
        cr_assert_eq(st.running + st.waiting + st.swapped, 0);
        total_proposed += st.spec_proposed;
        total_preempt += st.preemptions;
        if (round % 3 == 2) {
            /* this engine's draft-model instance (metrics are per process) */
            draft_rounds += loom_metrics_get("spec.draft-model.rounds");
            draft_reqs += loom_metrics_get("spec.draft-model.requests");
        }
        loom_engine_destroy(e);
    }
    cr_expect(total_proposed > 0, "no drafts: the property was not exercised");
    cr_expect(draft_reqs > draft_rounds, "draft-model: %.0f requests in %.0f rounds: propose_batch never had two",
              draft_reqs, draft_rounds);
    cr_expect(total_preempt > 0, "no preemptions: the cache is not small enough to exercise them");
    cr_log_info("rollback property: %lld drafts, %lld preemptions; draft-model: %.0f requests in %.0f batched rounds",
                (long long)total_proposed, (long long)total_preempt, draft_reqs, draft_rounds);
}

/* ------------------------------------------- propose vs propose_batch */

static const char *tspec_path(const char *which) {
    static char buf[1200];
    const char *b = getenv("LOOM_BUILD_DIR");
    snprintf(buf, sizeof buf, "speculator.plugin=%s/tests/spec/loom-speculator-tspec-%s.so", b ? b : ".", which);
    return buf;
}

/* Four looping prompts at once on tiny (a cache that never preempts, so
 * every verify step stays <= 16 rows: bit-identical logits), greedy. */
static void tiny_batch(const char *spec_ov, gen *g, loom_engine_stats *st) {
    const char *ov[] = {"cache.num_blocks=512", spec_ov};
    loom_engine *e = engine_new("tiny.yaml", ov, spec_ov ? 2 : 1);
    memset(g, 0, sizeof *g);
    int32_t prompt[40];
    for (int i = 0; i < 4; i++) {
        make_prompt(prompt, 40, 300 + (uint64_t)i);
        loom_request rq = loom_request_default();
        rq.tokens = prompt;
        rq.num_tokens = 40;
        rq.max_tokens = 48;
        int64_t id = submit(e, g, &rq);
        if (i == 0) g->base = id;
    }
    run_all(e);
    cr_assert_str_empty(g->error, "%s", g->error);
    loom_engine_get_stats(e, st, sizeof *st);
    cr_assert_eq(st->kv_blocks_used, 0);
    loom_engine_destroy(e);
}

/* A speculator without the OPTIONAL propose_batch: the core must ask it per
 * sequence, and the output must not change. */
Test(spec, speculator_without_batch_goes_per_sequence, .timeout = 60) {
    static gen base, spec;
    loom_engine_stats sb, ss;
    tiny_batch(NULL, &base, &sb);
    tiny_batch(tspec_path("single"), &spec, &ss);
    expect_same(&base, &spec, 4, "per-sequence speculator");
    cr_expect_eq(loom_metrics_get("tspec.batch_calls"), 0, "the core called a propose_batch the table does not have");
    cr_expect(loom_metrics_get("tspec.propose_calls") > 0, "propose() was never called");
    cr_expect(ss.spec_proposed > 0 && ss.spec_accepted > 0, "proposed %lld, accepted %lld",
              (long long)ss.spec_proposed, (long long)ss.spec_accepted);
    cr_log_info("per-sequence speculator: %.0f propose calls, %lld drafts, %lld accepted, steps %lld vs %lld",
                loom_metrics_get("tspec.propose_calls"), (long long)ss.spec_proposed, (long long)ss.spec_accepted,
                (long long)ss.steps, (long long)sb.steps);
}

/* A speculator with propose_batch: one call per step with every
 * decoding sequence, never propose(); the same greedy output. */
Test(spec, batch_speculator_gets_one_call_per_step, .timeout = 60) {
    static gen base, spec;
    loom_engine_stats sb, ss;
    tiny_batch(NULL, &base, &sb);
    tiny_batch(tspec_path("batch"), &spec, &ss);
    expect_same(&base, &spec, 4, "batch speculator");
    double calls = loom_metrics_get("tspec.batch_calls");
    cr_expect_eq(loom_metrics_get("tspec.propose_calls"), 0, "the core called propose() although propose_batch is there");
    cr_expect(calls > 0 && calls <= (double)ss.steps, "%.0f propose_batch calls in %lld steps", calls,
              (long long)ss.steps);
    cr_expect_eq(loom_metrics_get("tspec.batch_max"), 4, "the largest batch held %.0f sequences, 4 decode",
                 loom_metrics_get("tspec.batch_max"));
    cr_expect(ss.spec_proposed > 0 && ss.spec_accepted > 0, "proposed %lld, accepted %lld",
              (long long)ss.spec_proposed, (long long)ss.spec_accepted);
    cr_log_info("batch speculator: %.0f propose_batch calls for %.0f sequences, %lld drafts, %lld accepted, "
                "steps %lld vs %lld",
                calls, loom_metrics_get("tspec.batch_seqs"), (long long)ss.spec_proposed, (long long)ss.spec_accepted,
                (long long)ss.steps, (long long)sb.steps);
}

/* KV room: drafts take only blocks that no sequence running without them
 * needs. Two short prompts with long outputs and one long prompt with a
 * short one, on caches of 35..42 blocks of 4 tokens: without drafts nothing
 * is preempted (the long one ends and frees its blocks just in time). The
 * test speculators here (fill) draft every slot they are allowed, k 16, no
 * row cap, with tokens the target (nearly) never accepts — checked: none is,
 * so every sequence advances exactly as without drafts and any preemption
 * would be the drafts' doing. Both entry points: propose() one sequence
 * after another (charged what each really drafted) and propose_batch (caps
 * fixed before anyone drafts, each charged its whole max_k — charged
 * nothing, the two long-output sequences take the same spare blocks and the
 * scheduler preempts: checked, 1-3 preemptions at 35-42 blocks). */
static void tight_run(int32_t blocks, const char *which, loom_engine_stats *st) {
    char bov[64];
    snprintf(bov, sizeof bov, "cache.num_blocks=%d", blocks);
    const char *ov[] = {bov, which ? tspec_path(which) : NULL, "speculator.num_draft_tokens=16",
                        "speculator.max_rows=0", "speculator.fill=true"};
    loom_engine *e = engine_new("tiny.yaml", ov, which ? 5 : 1);
    static gen g;
    memset(&g, 0, sizeof g);
    const int32_t pl[3] = {8, 8, 100}, mt[3] = {60, 60, 8};
    int32_t prompt[100];
    for (int i = 0; i < 3; i++) {
        for (int32_t j = 0; j < pl[i]; j++) prompt[j] = (j * 37 + i * 11) % 256;
        loom_request rq = loom_request_default();
        rq.tokens = prompt;
        rq.num_tokens = pl[i];
        rq.max_tokens = mt[i];
        int64_t id = submit(e, &g, &rq);
        if (i == 0) g.base = id;
    }
    run_all(e);
    cr_assert_str_empty(g.error, "%d blocks: %s", blocks, g.error);
    for (int i = 0; i < 3; i++) cr_assert_eq(g.n[i][0], mt[i], "%d blocks, request %d: %d tokens", blocks, i, g.n[i][0]);
    loom_engine_get_stats(e, st, sizeof *st);
    cr_assert_eq(st->kv_blocks_used, 0);
    loom_engine_destroy(e);
}

Test(spec, drafts_never_cause_preemption, .timeout = 60) {
    static const char *const which[2] = {"single", "batch"};
    int64_t drafts[2] = {0, 0};
    for (int32_t blocks = 35; blocks <= 42; blocks++) {
        loom_engine_stats sb;
        tight_run(blocks, NULL, &sb);
        cr_assert_eq(sb.preemptions, 0, "%d blocks: the baseline preempted: the test needs a cache it fits", blocks);
        for (int w = 0; w < 2; w++) {
            loom_engine_stats ss;
            tight_run(blocks, which[w], &ss);
            cr_assert_eq(ss.spec_accepted, 0, "%d blocks, %s: %lld drafts accepted: the sequences no longer advance "
                         "as without drafts; pick another fill token", blocks, which[w], (long long)ss.spec_accepted);
            cr_expect_eq(ss.preemptions, 0, "%d blocks, %s: drafts made the scheduler preempt %lld times", blocks,
                         which[w], (long long)ss.preemptions);
            cr_expect(ss.spec_proposed > 0, "%d blocks, %s: no drafts", blocks, which[w]);
            drafts[w] += ss.spec_proposed;
        }
    }
    cr_expect(loom_metrics_get("tspec.batch_max") >= 2, "propose_batch never had two sequences");
    cr_expect(loom_metrics_get("tspec.propose_calls") > 0, "propose() was never called");
    cr_log_info("tight caches: %lld drafts one by one, %lld batched, no preemption", (long long)drafts[0],
                (long long)drafts[1]);
}

/* ------------------------------------- scheduler output that cannot run */

/* Scheduler "rogue" (rogue_sched.c) in `mode` with a speculator that always
 * drafts: the first bad entry fails the step with an error naming the
 * scheduler, the sequence and the values — before any logits row is laid
 * out from it. */
static void rogue_refused(const char *mode, const char *const *needles) {
    static char sched[1200], spec[1200], modeov[64];
    const char *b = getenv("LOOM_BUILD_DIR");
    snprintf(sched, sizeof sched, "scheduler.plugin=%s/tests/spec/loom-scheduler-rogue.so", b ? b : ".");
    snprintf(spec, sizeof spec, "%s", tspec_path("batch"));
    snprintf(modeov, sizeof modeov, "scheduler.mode=%s", mode);
    const char *ov[] = {"cache.num_blocks=512", sched, modeov, spec, "speculator.fill=true"};
    loom_engine *e = engine_new("tiny.yaml", ov, 5);
    gen g;
    memset(&g, 0, sizeof g);
    int32_t prompt[20];
    make_prompt(prompt, 20, 77);
    loom_request rq = loom_request_default();
    rq.tokens = prompt;
    rq.num_tokens = 20;
    rq.max_tokens = 16;
    submit(e, &g, &rq);
    loom_error err = {0};
    loom_status st = LOOM_OK;
    int32_t active = 1;
    for (int i = 0; i < 20 && st == LOOM_OK && active > 0; i++) st = loom_engine_step(e, &active, &err);
    cr_assert_eq(st, LOOM_ERR_INTERNAL, "mode %s: step status %d (%s), want INTERNAL", mode, (int)st, err.message);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(err.message, needles[i]), "mode %s: '%s' lacks '%s'", mode, err.message, needles[i]);
    loom_engine_destroy(e);
}

Test(spec, scheduler_entry_short_of_its_drafts_is_refused, .timeout = 60) {
    const char *n[] = {"scheduler 'rogue'", "seq 0", "verification rows", NULL};
    rogue_refused("short_verify", n);
}

Test(spec, scheduler_entry_overflowing_int32_is_refused, .timeout = 60) {
    const char *n[] = {"scheduler 'rogue'", "seq 0", "2147483646", NULL};
    rogue_refused("overflow", n);
}
