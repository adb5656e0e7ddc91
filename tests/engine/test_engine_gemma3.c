/*
 * tests/engine/test_engine_gemma3.c — Gemma 3 270M (Q4_K_M GGUF,
 * LOOM_TEST_GEMMA_MODEL; skipped when unset) through the whole engine on the
 * cpu backend against transformers (tests/engine/data/gemma3_reference.json,
 * made by gen_gemma3_reference.py: Gemma3ForCausalLM in float32 on the same
 * GGUF's dequantized weights). Five prompts run as one batch, one of them
 * 600 tokens long, past the 512-token sliding window of the local layers;
 * each generates 12 greedy tokens with their log-probs and runner-ups.
 *
 * The greedy tokens must be the reference's, up to a near-tie (both rank
 * the same two tokens on top, each within the tolerance of the other: the
 * rest is then not compared, the texts diverge); every compared log-prob
 * must be within the tolerance, and at least half the 60 tokens compared:
 *   weight_dtype f32:  the reference's own float32 weights, so only the
 *                      summation order differs: 1e-3 (measured: all 60
 *                      tokens equal, max |diff| 1e-5).
 *   weight_dtype gguf: the blocks as stored, dotted with 8-bit block
 *                      activations (llama.cpp's scheme) where the reference
 *                      keeps float32 activations: 0.3 (measured: max 0.11,
 *                      mean 0.02 over 30 equal tokens; the reference's own
 *                      top-2 margins fall to 0.006, 0.014 and 0.14, where
 *                      the runs swap the two tokens and stop comparing).
 * Then the window-aware cache (block-table groups, local layers' blocks
 * freed behind the window) against one that keeps everything: bit-equal
 * greedy and sampled tokens and log-probs with prompts past the window, a
 * prefix hit past the window, forks, and preemption by recompute and swap.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "eng_util.h"

#define G3_CASES 5
#define G3_STEPS 12

typedef struct g3_case {
    int32_t prompt[1024];
    int32_t n_prompt;
    eng_sample ref; /* the reference's greedy run as a sample */
} g3_case;

static void need_gemma_model(void) {
    const char *m = getenv("LOOM_TEST_GEMMA_MODEL");
    if (!m || !m[0])
        cr_skip_test("LOOM_TEST_GEMMA_MODEL is unset: set it to the Gemma 3 270M Q4_K_M GGUF "
                     "(scripts/fetch-model.sh gemma3-270m prints the path)");
}

static void ints(const cJSON *a, int32_t *out, int32_t cap, int32_t *n) {
    *n = cJSON_GetArraySize(a);
    cr_assert(*n > 0 && *n <= cap, "reference array of %d", *n);
    for (int32_t i = 0; i < *n; i++) out[i] = cJSON_GetArrayItem(a, i)->valueint;
}

static void floats(const cJSON *a, float *out, int32_t n) {
    cr_assert_eq(cJSON_GetArraySize(a), n);
    for (int32_t i = 0; i < n; i++) out[i] = (float)cJSON_GetArrayItem(a, i)->valuedouble;
}

static void load_reference(g3_case *cs) {
    char *path = eng_data("gemma3_reference.json");
    char *text = test_slurp(path, NULL);
    cJSON *root = cJSON_Parse(text), *cases = cJSON_GetObjectItem(root, "cases");
    cr_assert(root && cJSON_GetArraySize(cases) == G3_CASES, "%s: expected %d cases", path, G3_CASES);
    for (int i = 0; i < G3_CASES; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        g3_case *g = &cs[i];
        int32_t n;
        ints(cJSON_GetObjectItem(c, "prompt_ids"), g->prompt, 1024, &g->n_prompt);
        eng_sample *r = &g->ref;
        *r = (eng_sample){.ntok = G3_STEPS, .finish = LOOM_FINISH_LENGTH};
        r->tokens = calloc(G3_STEPS, sizeof *r->tokens);
        r->alt = calloc(G3_STEPS, sizeof *r->alt);
        r->lps = calloc(G3_STEPS, sizeof *r->lps);
        r->alt_lp = calloc(G3_STEPS, sizeof *r->alt_lp);
        ints(cJSON_GetObjectItem(c, "greedy_ids"), r->tokens, G3_STEPS, &n);
        cr_assert_eq(n, G3_STEPS);
        ints(cJSON_GetObjectItem(c, "alt_ids"), r->alt, G3_STEPS, &n);
        floats(cJSON_GetObjectItem(c, "greedy_logprobs"), r->lps, G3_STEPS);
        floats(cJSON_GetObjectItem(c, "alt_logprobs"), r->alt_lp, G3_STEPS);
    }
    cJSON_Delete(root);
    free(text);
    free(path);
}

static void free_reference(g3_case *cs) {
    for (int i = 0; i < G3_CASES; i++) {
        free(cs[i].ref.tokens), free(cs[i].ref.alt), free(cs[i].ref.lps), free(cs[i].ref.alt_lp);
    }
}

/* All cases in one batch under weight_dtype `wd`; every case checked
 * against the reference with log-prob tolerance tol. */
static void check_against_reference(const char *wd, float tol) {
    need_gemma_model();
    static g3_case cs[G3_CASES];
    load_reference(cs);
    char set_wd[64];
    snprintf(set_wd, sizeof set_wd, "backend.weight_dtype=%s", wd);
    const char *const overrides[] = {set_wd, NULL};
    loom_engine *e = eng_open("gemma3.yaml", overrides);
    eng_rec rec[G3_CASES];
    for (int i = 0; i < G3_CASES; i++) {
        eng_rec_init(&rec[i], 1);
        loom_request r = eng_req_tokens(cs[i].prompt, cs[i].n_prompt, G3_STEPS);
        r.params.logprobs = 2;
        eng_add(e, r, &rec[i]);
    }
    eng_run(e, 10000);
    double worst = 0, sum = 0;
    int compared = 0;
    for (int i = 0; i < G3_CASES; i++) {
        eng_rec_check_done(&rec[i]);
        const eng_sample *got = &rec[i].s[0];
        char what[96];
        snprintf(what, sizeof what, "weight_dtype %s, case %d (%d prompt tokens)", wd, i, cs[i].n_prompt);
        int32_t same = eng_same_greedy(got, &cs[i].ref, tol, what);
        for (int32_t k = 0; k < same; k++, compared++) {
            double d = fabs((double)got->lps[k] - cs[i].ref.lps[k]);
            worst = d > worst ? d : worst;
            sum += d;
        }
        eng_rec_free(&rec[i]);
    }
    /* near-ties may end a case early, but most tokens must be compared */
    cr_expect_geq(compared, G3_CASES * G3_STEPS / 2, "weight_dtype %s: only %d of %d greedy tokens compared", wd,
                  compared, G3_CASES * G3_STEPS);
    fprintf(stderr, "[gemma3 %s] %d greedy tokens as transformers'; |logprob diff| max %.5f mean %.5f\n", wd,
            compared, worst, compared ? sum / compared : 0.0);
    loom_engine_destroy(e);
    free_reference(cs);
}

Test(gemma3, transformers_f32_weights, .timeout = 300) { check_against_reference("f32", 1e-3f); }

Test(gemma3, transformers_gguf_weights, .timeout = 300) { check_against_reference("gguf", 0.3f); }

/* ------------------------------------------- window-aware freeing: on = off
 *
 * The paged cache's block-table groups free a local layer's blocks once they
 * leave its 512-token window (cache.sliding_window: auto); with `off` every
 * layer keeps its whole history. The attention reads the same keys either
 * way, so every token and log-prob must be bit-identical. One engine runs
 * two phases: four requests together — the reference's 600-token prompt,
 * 700 and 560 random ids (prompts past the window, prefilled in 256-token
 * chunks so windows move during prefill) and a 40-token prompt sampled
 * twice at temperature 0.8 (forked sequences) — then, once they are done, a
 * request whose first 640 tokens are the 700-token prompt's: a prefix-cache
 * hit past the window, served from the local groups' released blocks. Under
 * a small KV budget the same runs preempt, by recompute or by swap. */

#define W_REQS 5
#define W_OUT 16

typedef struct w_prompts {
    int32_t p[W_REQS][768];
    int32_t n[W_REQS];
} w_prompts;

static void w_make_prompts(w_prompts *w, const g3_case *cs) {
    memcpy(w->p[0], cs[4].prompt, (size_t)cs[4].n_prompt * sizeof(int32_t));
    w->n[0] = cs[4].n_prompt;
    eng_prompt(w->p[1], 700, 11, 32000);
    w->n[1] = 700;
    eng_prompt(w->p[2], 40, 12, 32000);
    w->n[2] = 40;
    eng_prompt(w->p[3], 560, 13, 32000);
    w->n[3] = 560;
    memcpy(w->p[4], w->p[1], 640 * sizeof(int32_t)); /* 40 blocks of 16 shared with request 1 */
    eng_prompt(w->p[4] + 640, 30, 14, 32000);
    w->n[4] = 670;
}

static void w_add(loom_engine *e, const w_prompts *w, int i, eng_rec *rec) {
    loom_request r = eng_req_tokens(w->p[i], w->n[i], W_OUT);
    r.params.logprobs = 2;
    if (i == 2) {
        r.n = 2;
        r.params.temperature = 0.8f;
        r.params.seed = 7;
        r.params.has_seed = true;
    }
    eng_rec_init(rec, r.n > 1 ? r.n : 1);
    eng_add(e, r, rec);
}

/* Both phases under `overrides` (sliding_window first); the engine's stats
 * after the first phase and at the end. */
static void w_run(const w_prompts *w, const char *const *overrides, eng_rec *rec, loom_engine_stats *mid,
                  loom_engine_stats *end) {
    loom_engine *e = eng_open("gemma3.yaml", overrides);
    for (int i = 0; i < W_REQS - 1; i++) w_add(e, w, i, &rec[i]);
    eng_run(e, 20000);
    loom_engine_get_stats(e, mid, sizeof *mid);
    w_add(e, w, W_REQS - 1, &rec[W_REQS - 1]);
    eng_run(e, 20000);
    loom_engine_get_stats(e, end, sizeof *end);
    loom_engine_destroy(e);
    for (int i = 0; i < W_REQS; i++) eng_rec_check_done(&rec[i]);
}

/* Every sample of every request: the same ids and bit-identical log-probs. */
static void w_same(const eng_rec *a, const eng_rec *b, const char *what) {
    for (int i = 0; i < W_REQS; i++)
        for (int k = 0; k < a[i].n; k++) {
            const eng_sample *x = &a[i].s[k], *y = &b[i].s[k];
            cr_assert_eq(x->ntok, W_OUT, "%s: request %d sample %d made %d tokens", what, i, k, x->ntok);
            cr_assert_eq(y->ntok, x->ntok, "%s: request %d sample %d made %d tokens, off %d", what, i, k, y->ntok,
                         x->ntok);
            for (int32_t t = 0; t < x->ntok; t++) {
                cr_assert_eq(x->tokens[t], y->tokens[t], "%s: request %d sample %d token %d: %d with windows, %d off",
                             what, i, k, t, x->tokens[t], y->tokens[t]);
                cr_assert(!memcmp(&x->lps[t], &y->lps[t], sizeof(float)),
                          "%s: request %d sample %d token %d: log-prob %.9g with windows, %.9g off", what, i, k, t,
                          (double)x->lps[t], (double)y->lps[t]);
            }
        }
}

/* What one mode of an A/B recorded. */
typedef struct w_side {
    eng_rec rec[W_REQS];
    loom_engine_stats mid, end; /* after the first phase, at the end */
} w_side;

/* The same runs with sliding_window auto (on) and off under the extra
 * overrides (NULL-terminated, at most 5); outputs must be bit-identical. */
static void w_pair(const char *const *extra, w_side *on, w_side *off, const char *what) {
    need_gemma_model();
    static g3_case cs[G3_CASES];
    static w_prompts w;
    load_reference(cs);
    w_make_prompts(&w, cs);
    const char *o[2][8] = {{"cache.sliding_window=auto", "scheduler.max_batched_tokens=256"},
                           {"cache.sliding_window=off", "scheduler.max_batched_tokens=256"}};
    for (int m = 0; m < 2; m++) {
        int k = 2;
        for (const char *const *x = extra; *x && k < 7; x++) o[m][k++] = *x;
        o[m][k] = NULL;
    }
    w_run(&w, o[0], on->rec, &on->mid, &on->end);
    w_run(&w, o[1], off->rec, &off->mid, &off->end);
    w_same(on->rec, off->rec, what);
    cr_assert(on->end.kv_groups == 6 && off->end.kv_groups == 1, "%s: %d block-table groups with windows, %d off",
              what, on->end.kv_groups, off->end.kv_groups);
    fprintf(stderr,
            "[gemma3 windows %s] per sequence at most %d blocks x %lld B with windows, %d x %lld B off; "
            "preemptions %lld / %lld, swapped out %lld / %lld blocks; last prompt served %lld / %lld tokens "
            "from the prefix cache\n",
            what, on->end.kv_peak_seq_blocks, (long long)on->end.kv_block_bytes, off->end.kv_peak_seq_blocks,
            (long long)off->end.kv_block_bytes, (long long)on->end.preemptions, (long long)off->end.preemptions,
            (long long)on->end.swaps_out, (long long)off->end.swaps_out,
            (long long)(on->end.cached_prompt_tokens - on->mid.cached_prompt_tokens),
            (long long)(off->end.cached_prompt_tokens - off->mid.cached_prompt_tokens));
    free_reference(cs);
}

static void w_side_free(w_side *a) {
    for (int i = 0; i < W_REQS; i++) eng_rec_free(&a->rec[i]);
}

/* Room for everything: the last prompt's 640 shared tokens come from the
 * prefix cache in both modes (with windows, the local groups' blocks
 * 8..39 that request 1 released but the cache kept), and a sequence of
 * 716 tokens holds less KV with windows even in 256-token prefill chunks. */
Test(gemma3, windows_equal_prefix_hit_past_window, .timeout = 600) {
    static w_side on, off;
    w_pair((const char *const[]){NULL}, &on, &off, "room for all");
    int64_t hit_on = on.end.cached_prompt_tokens - on.mid.cached_prompt_tokens;
    int64_t hit_off = off.end.cached_prompt_tokens - off.mid.cached_prompt_tokens;
    cr_assert(hit_on == 640 && hit_off == 640,
              "the last prompt took %lld tokens from the prefix cache with windows, %lld off; want 640",
              (long long)hit_on, (long long)hit_off);
    cr_assert(on.end.preemptions == 0 && off.end.preemptions == 0);
    /* 45 global blocks and at most 16 + 32 + 2 of each of the 5 local groups
     * (a 256-token chunk, the 512-token window, a partial block each side) */
    cr_assert_leq(on.end.kv_peak_seq_blocks, 45 + 5 * 50, "one sequence held %d blocks with windows",
                  on.end.kv_peak_seq_blocks);
    cr_assert_lt(on.end.kv_peak_seq_blocks * on.end.kv_block_bytes, off.end.kv_peak_seq_blocks * off.end.kv_block_bytes);
    w_side_free(&on), w_side_free(&off);
}

/* 30 MiB of KV (53 blocks of 16 tokens without windows, 848 tokens) for
 * about 2600: sequences are preempted and prefilled again, or swapped out
 * and in, in both modes. */
static void w_preempt(const char *mode, const char *swap_gib) {
    static w_side on, off;
    char pre[64];
    snprintf(pre, sizeof pre, "scheduler.preemption=%s", mode);
    const char *const extra[] = {"cache.memory_gib=0.0293", "engine.max_model_len=768", pre, swap_gib, NULL};
    w_pair(extra, &on, &off, mode);
    cr_assert(on.end.preemptions > 0 && off.end.preemptions > 0, "%s: %lld preemptions with windows, %lld off",
              mode, (long long)on.end.preemptions, (long long)off.end.preemptions);
    bool swapped = strcmp(mode, "swap") == 0;
    cr_assert(!swapped || (on.end.swaps_out > 0 && off.end.swaps_out > 0), "swap: %lld / %lld blocks swapped out",
              (long long)on.end.swaps_out, (long long)off.end.swaps_out);
    w_side_free(&on), w_side_free(&off);
}

Test(gemma3, windows_equal_preempt_recompute, .timeout = 600) { w_preempt("recompute", "cache.cpu_swap_gib=0"); }

Test(gemma3, windows_equal_preempt_swap, .timeout = 600) { w_preempt("swap", "cache.cpu_swap_gib=0.1"); }

/* Speculative decoding (ngram drafts, verified and partly rolled back by
 * truncate) over sequences past the window: the same tokens either way. */
Test(gemma3, windows_equal_with_drafts, .timeout = 600) {
    static w_side on, off;
    w_pair((const char *const[]){"speculator.plugin=ngram", NULL}, &on, &off, "ngram drafts");
    cr_assert(on.end.spec_proposed > 0 && off.end.spec_proposed > 0, "drafts proposed: %lld with windows, %lld off",
              (long long)on.end.spec_proposed, (long long)off.end.spec_proposed);
    w_side_free(&on), w_side_free(&off);
}
