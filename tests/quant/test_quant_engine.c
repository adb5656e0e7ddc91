/*
 * tests/quant/test_quant_engine.c — quantizers end to end on the cpu
 * backend (suite 'quant'): every configs/quant/ pipeline on the real
 * model (LOOM_TEST_MODEL, SmolLM2-135M-Instruct Q4_1; skipped when unset)
 * and the tiny dummy model split over 2 tensor-parallel ranks with int8.
 *
 * Checks: the greedy chat answer to "What is the capital of France?"
 * still names Paris (int8 w8a16, int4 groups of 32); teacher-forced log-probs
 * (loom_engine_score) of a short text stay close to the unquantized ones:
 * mean |lp_q - lp_f32| over the text's tokens below a per-scheme bound
 * (k_schemes: about 1.5x the measured values, in comments;
 * per-token differences are noisy on a 135M model, the mean log-prob moves
 * far less); int4 gguf and the default run the file's own Q4_1 blocks with
 * 8-bit block activations (their rounding is the whole difference), and
 * int4 with groups of 32 re-derives those same blocks with float
 * activations, so it must agree to float rounding. Every engine runs on 2
 * threads with a 512-token context.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"

static const char *need_model(void) {
    const char *m = getenv("LOOM_TEST_MODEL");
    if (!m || !*m) cr_skip_test("LOOM_TEST_MODEL is unset (scripts/fetch-model.sh prints the path)");
    return m;
}

static char *src_path(const char *rel) {
    const char *root = getenv("LOOM_SOURCE_DIR");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", root ? root : ".", rel);
    return p;
}

/* Engine of pipeline `rel` (from the source root) with extra overrides. */
static loom_engine *open_pipe(const char *rel, const char *const *extra, int nextra) {
    const char *ov[16];
    int n = 0;
    static char model_ov[4200];
    const char *m = getenv("LOOM_TEST_MODEL");
    if (m && *m && strncmp(rel, "tests/tp", 8) != 0) {
        snprintf(model_ov, sizeof model_ov, "model.path=%s", m);
        ov[n++] = model_ov;
        ov[n++] = "engine.max_model_len=512";
        ov[n++] = "engine.threads=2";
        ov[n++] = "cache.memory_gib=0.1";
    }
    for (int i = 0; i < nextra; i++) ov[n++] = extra[i];
    char *path = src_path(rel);
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = loom_engine_create(path, ov, n, &e, &err);
    cr_assert_eq(st, LOOM_OK, "loom_engine_create(%s): %s", path, err.message);
    free(path);
    return e;
}

typedef struct gen_rec {
    char text[4096];
    size_t len;
    int32_t tokens[256];
    int32_t ntok;
    char error[512];
} gen_rec;

static void on_tok(void *user, const loom_token_event *ev) {
    gen_rec *r = user;
    if (ev->text) {
        size_t l = strlen(ev->text);
        if (r->len + l < sizeof r->text) {
            memcpy(r->text + r->len, ev->text, l + 1);
            r->len += l;
        }
    }
    if (ev->token >= 0 && r->ntok < 256) r->tokens[r->ntok++] = ev->token;
    if (ev->finish == LOOM_FINISH_ERROR && ev->error)
        snprintf(r->error, sizeof r->error, "%s", ev->error);
}

/* Greedy generation; fills r. */
static void generate(loom_engine *e, loom_request rq, gen_rec *r) {
    memset(r, 0, sizeof *r);
    rq.on_token = on_tok;
    rq.user = r;
    loom_error err = {0};
    cr_assert_geq(loom_engine_add_request(e, &rq, &err), 0, "%s", err.message);
    cr_assert_eq(loom_engine_run(e, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(r->error[0], 0, "%s", r->error);
}

static void paris(const char *rel, const char *const *extra, int nextra) {
    loom_engine *e = open_pipe(rel, extra, nextra);
    loom_request rq = loom_request_default();
    rq.prompt = "What is the capital of France?";
    rq.chat = true;
    rq.max_tokens = 24;
    gen_rec r;
    generate(e, rq, &r);
    fprintf(stderr, "%s: %s\n", rel, r.text);
    cr_assert(strstr(r.text, "Paris"), "%s answered: %s", rel, r.text);
    loom_engine_destroy(e);
}

Test(quant_engine, paris_int8_w8a16, .timeout = 300) {
    need_model();
    paris("configs/quant/int8-w8a16.yaml", NULL, 0);
}

/* int4 groups of 32 re-derive the file's Q4_1 blocks, with float
 * activations. (GGUF blocks on 8-bit block activations answer this prompt
 * "L'Étoile, la Marseillaise, ..." from a near-tie, as llama.cpp does.) */
Test(quant_engine, paris_int4_g32, .timeout = 300) {
    need_model();
    paris("configs/quant/int4.yaml", NULL, 0);
}

/* ------------------------------------------------------- log-prob drift */

static const char k_text[] =
    "When in the Course of human events, it becomes necessary for one people to dissolve the "
    "political bands which have connected them with another, and to assume among the powers of "
    "the earth, the separate and equal station to which the Laws of Nature entitle them.";

static float *score(const char *rel, const char *const *extra, int nextra, int32_t *n_out) {
    loom_engine *e = open_pipe(rel, extra, nextra);
    loom_error err = {0};
    int32_t *ids = NULL, n = 0;
    cr_assert_eq(loom_engine_tokenize(e, k_text, true, &ids, &n, &err), LOOM_OK, "%s",
                 err.message);
    float *lp = malloc((size_t)n * sizeof(float));
    cr_assert_eq(loom_engine_score(e, ids, n, lp, &err), LOOM_OK, "%s: %s", rel, err.message);
    free(ids);
    loom_engine_destroy(e);
    *n_out = n;
    return lp;
}

/* The reference: the default pipeline with every weight dequantized to
 * float32 (its default keeps the GGUF blocks). */
static const char *const k_f32[] = {"backend.weight_dtype=f32"};

/* Per scheme: mean |lp - lp_f32| (nats per token) must stay below bound.
 * Values measured on SmolLM2-135M Q4_1 are in the comments. */
static const struct {
    const char *cfg;
    double bound;
} k_schemes[] = {
    {"configs/default.yaml", 0.25},               /* 0.141: GGUF blocks, 8-bit block activations */
    {"configs/quant/int4-gguf.yaml", 0.25},       /* 0.142: the same, LM head f32 */
    {"configs/quant/int8-w8a16.yaml", 0.30},      /* 0.184 */
    {"configs/quant/int8-w8a8.yaml", 1.00},       /* 0.687 (dynamic int8 activations) */
    {"configs/quant/fp8.yaml", 0.70},             /* 0.469 */
    {"configs/quant/fp8-per-tensor.yaml", 0.70},  /* 0.466 */
    {"configs/quant/int4.yaml", 0.05},            /* 0.0000: groups of 32 = the Q4_1 blocks */
};

Test(quant_engine, score_close_to_f32, .timeout = 300) {
    need_model();
    int32_t n = 0, nq = 0;
    float *ref = score("configs/default.yaml", k_f32, 1, &n);
    cr_assert_gt(n, 20);
    for (size_t s = 0; s < sizeof k_schemes / sizeof k_schemes[0]; s++) {
        float *lp = score(k_schemes[s].cfg, NULL, 0, &nq);
        cr_assert_eq(nq, n);
        double sum = 0, sref = 0, sq = 0;
        for (int32_t i = 1; i < n; i++) {
            cr_assert(isfinite(lp[i]), "%s: token %d log-prob %f", k_schemes[s].cfg, i, lp[i]);
            sum += fabs((double)lp[i] - ref[i]);
            sref += ref[i];
            sq += lp[i];
        }
        double mad = sum / (n - 1);
        fprintf(stderr, "%s: mean |dlogprob| %.4f (bound %.2f), mean lp %.3f vs f32 %.3f\n",
                k_schemes[s].cfg, mad, k_schemes[s].bound, sq / (n - 1), sref / (n - 1));
        cr_assert_lt(mad, k_schemes[s].bound, "%s: mean |dlogprob| %.4f >= %.2f",
                     k_schemes[s].cfg, mad, k_schemes[s].bound);
        free(lp);
    }
    free(ref);
}

/* FP8 KV cache on the cpu backend: E4M3 storage, weights kept float. */
Test(quant_engine, fp8_kv_cache_scores, .timeout = 300) {
    need_model();
    int32_t n = 0, nq = 0;
    float *ref = score("configs/default.yaml", k_f32, 1, &n);
    const char *ov[] = {"quantizer.plugin=fp8", "quantizer.kv_cache=fp8",
                        "quantizer.skip=blk,token_embd,output"};
    float *lp = score("configs/default.yaml", ov, 3, &nq);
    cr_assert_eq(nq, n);
    double sum = 0;
    for (int32_t i = 1; i < n; i++) sum += fabs((double)lp[i] - ref[i]);
    fprintf(stderr, "fp8 KV cache: mean |dlogprob| %.4f\n", sum / (n - 1));
    /* measured 0.181 */
    cr_assert_lt(sum / (n - 1), 0.30, "fp8 KV: mean |dlogprob| %.4f", sum / (n - 1));
    free(lp);
    free(ref);
}

/* ------------------------------------------------ tensor parallel + int8 */

/* The tiny dummy model on 2 ranks with int8 weights runs and greedily
 * agrees with the same quantizer on one backend (W8A16 slices keep their
 * per-row scales, so only float summation order differs). */
Test(quant_engine, tp2_int8_dummy, .timeout = 300) {
    const char *ov_tp[] = {"quantizer.plugin=int8", "quantizer.mode=w8a16",
                           "quantizer.skip=token_embd"};
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 3 + (i * 37) % 250;
    gen_rec a, b;
    loom_request rq = loom_request_default();
    rq.tokens = prompt;
    rq.num_tokens = 12;
    rq.max_tokens = 16;
    rq.ignore_eos = true;
    loom_engine *e = open_pipe("tests/tp/data/tiny_tp.yaml", ov_tp, 3);
    generate(e, rq, &a);
    loom_engine_destroy(e);
    e = open_pipe("tests/tp/data/tiny.yaml", ov_tp, 3);
    generate(e, rq, &b);
    loom_engine_destroy(e);
    cr_assert_eq(a.ntok, 16);
    cr_assert_eq(b.ntok, 16);
    int same = 0;
    while (same < 16 && a.tokens[same] == b.tokens[same]) same++;
    cr_assert_geq(same, 8, "tp 2 + int8 and 1 rank + int8 agree on %d of 16 greedy tokens", same);
}

/* ------------------------------------------------ mixture-of-experts weights */

/* Log-probs of the Qwen2-MoE checkpoint transformers wrote
 * (tests/backend/data/moe/qwen2_moe: 8 experts top-2, a shared expert)
 * over its reference tokens, with overrides `extra`. */
static float *moe_score(const char *const *extra, int nextra, const cJSON *ref, int32_t *n_out) {
    const char *ov[13];
    int n = 0;
    char *dir = src_path("tests/backend/data/moe/qwen2_moe");
    static char path_ov[4200];
    snprintf(path_ov, sizeof path_ov, "model.path=%s", dir);
    ov[n++] = "model.format=safetensors";
    ov[n++] = path_ov;
    ov[n++] = "backend.kv_dtype=f32"; /* transformers' precision: the bounds below are float32's */
    for (int i = 0; i < nextra; i++) ov[n++] = extra[i];
    char *pipe = src_path("tests/engine/data/tiny.yaml");
    loom_engine *e = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_engine_create(pipe, ov, n, &e, &err), LOOM_OK, "%s", err.message);
    const cJSON *toks = cJSON_GetObjectItem(ref, "tokens");
    int32_t nt = cJSON_GetArraySize(toks), ids[64];
    cr_assert(nt > 8 && nt <= 64);
    for (int32_t i = 0; i < nt; i++) ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
    float *lp = malloc((size_t)nt * sizeof(float));
    cr_assert_eq(loom_engine_score(e, ids, nt, lp, &err), LOOM_OK, "%s", err.message);
    loom_engine_destroy(e);
    free(dir), free(pipe);
    *n_out = nt;
    return lp;
}

/* The quantizers reach the routed and shared experts (each expert's matrix
 * planned like any linear weight): with attention, embedding and LM head
 * skipped, only expert weights change, so the log-probs must move, and stay
 * close to transformers' float32 ones. The unquantized engine must equal
 * transformers (the whole engine path, not just the backend). */
Test(quant_engine, moe_experts_quantized, .timeout = 300) {
    char *jpath = src_path("tests/backend/data/moe/qwen2_moe/reference.json");
    FILE *f = fopen(jpath, "rb");
    if (!f) cr_skip_test("%s is absent (tests/e2e/gen_moe_reference.py makes it)", jpath);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    cJSON *ref = cJSON_Parse(text);
    cr_assert(ref, "%s is not JSON", jpath);
    const cJSON *want = cJSON_GetObjectItem(ref, "logprobs");
    static const struct {
        const char *name;
        const char *ov[4];
        double lo, hi; /* mean |lp - transformers| must fall in [lo, hi) */
    } runs[] = {
        {"float32", {NULL}, 0, 1e-4},
        /* these random tiny models are sensitive: the same int8 on the
         * dense FFN of the Qwen3 checkpoint moves log-probs by 0.043 */
        {"int8 w8a16", {"quantizer.plugin=int8", "quantizer.mode=w8a16", NULL}, 1e-4, 0.2}, /* 0.066 */
        {"fp8", {"quantizer.plugin=fp8", NULL}, 1e-3, 0.8},                             /* 0.186 */
        {"int4 g16", {"quantizer.plugin=int4", "quantizer.group_size=16", NULL}, 1e-3, 1.2}, /* 0.314 */
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        const char *ov[6];
        int n = 0;
        for (int i = 0; runs[r].ov[i]; i++) ov[n++] = runs[r].ov[i];
        if (n) ov[n++] = "quantizer.skip=token_embd,output,attn_q,attn_k,attn_v,attn_output";
        int32_t nt;
        float *lp = moe_score(ov, n, ref, &nt);
        double sum = 0;
        for (int32_t i = 1; i < nt; i++) sum += fabs(lp[i] - cJSON_GetArrayItem(want, i)->valuedouble);
        double mad = sum / (nt - 1);
        fprintf(stderr, "qwen2_moe %s (experts only): mean |lp - transformers| %.3g\n", runs[r].name, mad);
        cr_assert(mad >= runs[r].lo && mad < runs[r].hi, "%s: mean |dlogprob| %g outside [%g, %g)", runs[r].name,
                  mad, runs[r].lo, runs[r].hi);
        free(lp);
    }
    cJSON_Delete(ref);
    free(jpath);
}
