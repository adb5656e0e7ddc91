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
 *                      keeps float32 activations: 0.3 (measured: max 0.15,
 *                      mean 0.02 over 38 equal tokens; the reference's own
 *                      top-2 margins fall to 0.006, 0.014 and 0.14, where
 *                      the runs swap the two tokens and stop comparing).
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
