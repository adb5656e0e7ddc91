/*
 * tests/backend/test_cpu_hf_moe.c — the safetensors loader and the cpu
 * backend against Hugging Face transformers on tiny random checkpoints that
 * transformers wrote itself (tests/backend/data/moe/<name>/, made by
 * tests/e2e/gen_moe_reference.py on CPU in float32): Qwen3 (QK-norm, head_dim
 * 24 != hidden / heads, tied), Qwen3-MoE (16 experts, top-4, renormalised),
 * Qwen2-MoE (8 experts, top-2, not renormalised, shared expert with its
 * sigmoid gate, QKV bias) and Mixtral (8 experts, top-2), each stored under
 * the Hub's per-expert tensor names.
 *
 * For each model:
 *   - teacher forcing, from the safetensors directory and from the GGUF
 *     llama.cpp's converter would write of it (built here from the loaded
 *     tensors: llama.cpp names and keys, Mixtral's Q/K rows interleaved): the 32 reference tokens prefilled at once; at every
 *     position log p(next token) within LP_TOL of transformers' and the
 *     same argmax;
 *   - Q8_0 experts in that GGUF (Qwen3-MoE, Mixtral), run as stored and
 *     dequantized: near transformers, and not equal to each other;
 *   - greedy: the first 8 tokens as the prompt, then 16 greedy decode steps
 *     one token at a time (the batch-1 path that reads only the chosen
 *     experts) must give transformers' tokens.
 * The generator keeps each checkpoint's router away from ties (its
 * router_min_gap, >= 2e-3 in logits), so float32 summation order cannot
 * change an expert; measured differences are ~1e-6.
 *
 * The data directory is committed; a checkout without it skips with the
 * command that makes it.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/hf_gguf_image.h"
#include "fake_host.h"
#include "formats/dtype.h"
#include "formats/half.h"
#include "model/model.h"
#include "tb_util.h"
#include "tp_util.h"

#define LP_TOL 1e-4

typedef struct hm_ctx {
    cJSON *doc;
    loom_model *model;
    gw image;           /* the GGUF the model was loaded from, or empty */
    tb b;
    int V;
} hm_ctx;

/* The llama.cpp GGUF of model m, edited as `o` says (tests/model/hf_gguf_image.h). */
static gw hm_gguf_image_edit(const loom_model *m, hm_gguf_opts o) {
    gw img = {0};
    const char *why = hf_gguf_image(m, o, &img);
    cr_assert(!why, "GGUF image: %s", why);
    return img;
}

/* Load checkpoint `name` (as llama.cpp's GGUF of it when `gguf`), its
 * reference and a cpu backend over it. */
static void hm_setup_as(hm_ctx *c, const char *name, bool gguf, hm_gguf_opts go, int weight_dtype) {
    memset(c, 0, sizeof *c);
    const char *src = getenv("LOOM_SOURCE_DIR");
    char dir[4096], jpath[4200];
    snprintf(dir, sizeof dir, "%s/tests/backend/data/moe/%s", src ? src : ".", name);
    snprintf(jpath, sizeof jpath, "%s/reference.json", dir);
    struct stat st;
    if (stat(jpath, &st) != 0)
        cr_skip_test("%s is absent: run `python3 tests/e2e/gen_moe_reference.py OUT` (torch, transformers) "
                     "and copy OUT/%s there",
                     jpath, name);
    char *text = tp_read(jpath);
    c->doc = cJSON_Parse(text);
    free(text);
    cr_assert(c->doc, "%s is not JSON", jpath);

    loom_error err = {0};
    loom_model_load_opts o = {.path = dir, .format = "safetensors"};
    cr_assert_eq(loom_model_load(&o, &c->model, &err), LOOM_OK, "load %s: %s", dir, err.message);
    if (gguf) {
        c->image = hm_gguf_image_edit(c->model, go);
        loom_model_free(c->model);
        loom_model_load_opts og = {.path = name, .format = "gguf", .data = c->image.buf, .size = c->image.len};
        cr_assert_eq(loom_model_load(&og, &c->model, &err), LOOM_OK, "load GGUF of %s: %s", name, err.message);
    }
    const loom_model_view *view = loom_model_view_get(c->model);
    c->V = view->config->vocab_size;
    char msg[512];
    cr_assert(tb_load_plugin(&c->b, msg, sizeof msg), "%s", msg);
    tb_config cfg = {.threads = 2, .kv_dtype = 0, .weight_dtype = weight_dtype};
    cr_assert_eq(c->b.ops->create(fake_host(), &cfg, &c->b.self, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(c->b.ops->load(c->b.self, view, NULL, &err), LOOM_OK, "%s", err.message);
    loom_kv_layout lay = {.struct_size = sizeof lay, .block_size = 16, .num_blocks = 8,
                          .dtype = LOOM_DTYPE_F32};
    cr_assert_eq(c->b.ops->kv_alloc(c->b.self, &lay, &err), LOOM_OK, "%s", err.message);
    cr_assert(tb_blocks_init(&c->b, 16, 8, 0x5eed));
}

static void hm_setup(hm_ctx *c, const char *name, bool gguf) { hm_setup_as(c, name, gguf, (hm_gguf_opts){0}, 0); }

static void hm_teardown(hm_ctx *c) {
    tb_close(&c->b);
    loom_model_free(c->model);
    free(c->image.buf);
    cJSON_Delete(c->doc);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld host allocations", fake_host_live_allocs());
}

static int32_t *hm_ids(const cJSON *doc, const char *key, int *n, int extra) {
    const cJSON *arr = cJSON_GetObjectItem(doc, key);
    *n = cJSON_GetArraySize(arr);
    cr_assert(*n > 0, "reference has no %s", key);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n + extra));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valueint;
    return ids;
}

/* Run s's next n tokens; logits of all of them (all) or the last into out. */
static void hm_step(hm_ctx *c, tb_seq *s, int32_t n, bool all, float *out) {
    tb_batch tbb;
    tb_seq *ss[1] = {s};
    cr_assert(tb_build(&c->b, ss, &n, 1, all, &tbb), "out of KV blocks");
    loom_error err = {0};
    for (int64_t i = 0; i < (int64_t)(all ? n : 1) * c->V; i++) out[i] = NAN; /* every row must be written */
    cr_assert_eq(c->b.ops->forward(c->b.self, &tbb.batch, out, &err), LOOM_OK, "%s", err.message);
    s->done += n;
    tb_batch_free(&tbb);
}

/* log_softmax(row)[tok] in float64, and the row's argmax. */
static double hm_logprob(const float *row, int V, int tok, int *argmax) {
    double mx = -INFINITY, sum = 0;
    int am = 0;
    for (int i = 0; i < V; i++) {
        if (row[i] > row[am]) am = i;
        mx = fmax(mx, row[i]);
    }
    for (int i = 0; i < V; i++) sum += exp(row[i] - mx);
    *argmax = am;
    return row[tok] - mx - log(sum);
}

static void hm_teacher_forced_as(const char *name, bool gguf, hm_gguf_opts go) {
    hm_ctx c;
    hm_setup_as(&c, name, gguf, go, 0);
    int n;
    int32_t *ids = hm_ids(c.doc, "tokens", &n, 0);
    const cJSON *lps = cJSON_GetObjectItem(c.doc, "logprobs"), *am_ref = cJSON_GetObjectItem(c.doc, "argmax");
    cr_assert(cJSON_GetArraySize(lps) == n && cJSON_GetArraySize(am_ref) == n, "%s: reference arrays", name);
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)c.V);
    tb_seq s = {.tokens = ids, .len = n};
    hm_step(&c, &s, n, true, lg);
    double worst = 0;
    for (int t = 0; t + 1 < n; t++) {
        int am;
        double lp = hm_logprob(lg + (int64_t)t * c.V, c.V, ids[t + 1], &am);
        double d = fabs(lp - cJSON_GetArrayItem(lps, t + 1)->valuedouble);
        worst = d != d ? INFINITY : fmax(worst, d);
        cr_assert_lt(d, LP_TOL, "%s position %d: log p(%d) = %.6f, transformers %.6f", name, t, ids[t + 1], lp,
                     cJSON_GetArrayItem(lps, t + 1)->valuedouble);
        cr_assert_eq(am, cJSON_GetArrayItem(am_ref, t)->valueint, "%s position %d: argmax %d, transformers %d",
                     name, t, am, cJSON_GetArrayItem(am_ref, t)->valueint);
    }
    fprintf(stderr, "[hf_moe] %s%s: %d teacher-forced log-probs, max |diff| %.3g\n", name, gguf ? " (GGUF)" : "",
            n - 1, worst);
    tb_seq_release(&c.b, &s);
    free(lg);
    free(ids);
    hm_teardown(&c);
}

static void hm_greedy(const char *name) {
    hm_ctx c;
    hm_setup(&c, name, false);
    int np, ng;
    int32_t *want = hm_ids(c.doc, "greedy", &ng, 0);
    int32_t *ids = hm_ids(c.doc, "prompt", &np, ng);
    const cJSON *lps = cJSON_GetObjectItem(c.doc, "greedy_logprobs");
    float *lg = malloc(sizeof(float) * (size_t)c.V);
    tb_seq s = {.tokens = ids, .len = np};
    hm_step(&c, &s, np, false, lg);
    double worst = 0;
    for (int i = 0; i < ng; i++) {
        int am;
        double lp = hm_logprob(lg, c.V, want[i], &am);
        cr_assert_eq(am, want[i], "%s greedy step %d: token %d, transformers %d", name, i, am, want[i]);
        worst = fmax(worst, fabs(lp - cJSON_GetArrayItem(lps, i)->valuedouble));
        ids[s.len++] = am;
        if (i + 1 < ng) hm_step(&c, &s, 1, false, lg);
    }
    cr_assert_lt(worst, LP_TOL, "%s greedy log-probs differ by %g", name, worst);
    fprintf(stderr, "[hf_moe] %s: %d greedy tokens equal, max |log-prob diff| %.3g\n", name, ng, worst);
    tb_seq_release(&c.b, &s);
    free(lg);
    free(ids);
    free(want);
    hm_teardown(&c);
}

static void hm_teacher_forced(const char *name, bool gguf) { hm_teacher_forced_as(name, gguf, (hm_gguf_opts){0}); }

/* A qwen2moe GGUF without expert_shared_feed_forward_length: the shared
 * expert's width comes from its tensors, not 0 (which would drop it). */
Test(hf_moe, qwen2_moe_gguf_without_shared_width_key) {
    hm_teacher_forced_as("qwen2_moe", true, (hm_gguf_opts){.drop_key = "expert_shared_feed_forward_length"});
}

Test(hf_moe, qwen3_teacher_forced) { hm_teacher_forced("qwen3", false); }
Test(hf_moe, qwen3_moe_teacher_forced) { hm_teacher_forced("qwen3_moe", false); }
Test(hf_moe, qwen2_moe_teacher_forced) { hm_teacher_forced("qwen2_moe", false); }
Test(hf_moe, mixtral_teacher_forced) { hm_teacher_forced("mixtral", false); }
Test(hf_moe, qwen3_gguf_teacher_forced) { hm_teacher_forced("qwen3", true); }
Test(hf_moe, qwen3_moe_gguf_teacher_forced) { hm_teacher_forced("qwen3_moe", true); }
Test(hf_moe, qwen2_moe_gguf_teacher_forced) { hm_teacher_forced("qwen2_moe", true); }
Test(hf_moe, mixtral_gguf_teacher_forced) { hm_teacher_forced("mixtral", true); }
Test(hf_moe, qwen3_greedy) { hm_greedy("qwen3"); }
Test(hf_moe, qwen3_moe_greedy) { hm_greedy("qwen3_moe"); }
Test(hf_moe, qwen2_moe_greedy) { hm_greedy("qwen2_moe"); }
Test(hf_moe, mixtral_greedy) { hm_greedy("mixtral"); }

/* ------------------------------------------------------------ bad files */

/* A copy of checkpoint `name` in a fresh temporary directory, config.json's
 * text `from` replaced by `to` and, in model.safetensors' header, `hfrom`
 * by `hto` (same length, so every offset stays valid); NULL: unchanged.
 * Returns the directory (static storage). */
static char *hm_edited_copy(const char *name, const char *from, const char *to, const char *hfrom,
                            const char *hto) {
    char *dir = tp_mkdtemp();
    const char *src = getenv("LOOM_SOURCE_DIR");
    const char *files[2] = {"config.json", "model.safetensors"};
    for (int f = 0; f < 2; f++) {
        char in[4096];
        snprintf(in, sizeof in, "%s/tests/backend/data/moe/%s/%s", src ? src : ".", name, files[f]);
        FILE *fi = fopen(in, "rb");
        if (!fi) cr_skip_test("%s is absent (tests/e2e/gen_moe_reference.py makes it)", in);
        fseek(fi, 0, SEEK_END);
        long n = ftell(fi);
        fseek(fi, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 256);
        cr_assert_eq(fread(buf, 1, (size_t)n, fi), (size_t)n);
        fclose(fi);
        const char *a = f == 0 ? from : hfrom, *b = f == 0 ? to : hto;
        if (a) {
            char *at = memmem(buf, (size_t)n, a, strlen(a));
            cr_assert(at, "%s has no '%s'", in, a);
            size_t la = strlen(a), lb = strlen(b);
            cr_assert(f == 0 || la == lb, "a safetensors header edit must keep its length");
            memmove(at + lb, at + la, (size_t)n - (size_t)(at - buf) - la);
            memcpy(at, b, lb);
            n += (long)lb - (long)la;
        }
        char *out = tp_join(dir, files[f]);
        FILE *fo = fopen(out, "wb");
        cr_assert(fo && fwrite(buf, 1, (size_t)n, fo) == (size_t)n);
        fclose(fo);
        free(out);
        free(buf);
    }
    return dir;
}

/* Load the edited copy; it must fail with a message naming the directory
 * and holding want1 and want2. */
static void hm_expect_error(const char *name, const char *from, const char *to, const char *hfrom, const char *hto,
                            const char *want1, const char *want2) {
    char *dir = hm_edited_copy(name, from, to, hfrom, hto);
    loom_model *m = NULL;
    loom_error err = {0};
    loom_model_load_opts o = {.path = dir, .format = "safetensors"};
    loom_status st = loom_model_load(&o, &m, &err);
    fprintf(stderr, "[hf_moe] %s with %s -> %s: %s\n", name, from ? from : hfrom, from ? to : hto, err.message);
    cr_assert_neq(st, LOOM_OK, "%s: the edited checkpoint loaded", name);
    cr_assert(m == NULL);
    cr_assert(strstr(err.message, want1) && strstr(err.message, want2) && strstr(err.message, dir),
              "%s: message '%s' lacks '%s' / '%s' / the directory %s", name, err.message, want1, want2, dir);
    tp_rm_rf(dir);
    free(dir);
}

Test(hf_moe, bad_safetensors_are_named) {
    /* fewer experts in config.json than in the file: the stray expert named */
    hm_expect_error("qwen2_moe", "\"num_experts\": 8", "\"num_experts\": 7", NULL, NULL, "matrix for expert 7,",
                    "config.json says 7 experts");
    /* more: the first missing one named */
    hm_expect_error("qwen3_moe", "\"num_local_experts\": 16", "\"num_local_experts\": 17", NULL, NULL,
                    "layer 0 has no ffn_gate_exps matrix", "expert 16 of 17");
    /* an expert's matrix missing from the file */
    hm_expect_error("mixtral", NULL, NULL, "layers.1.block_sparse_moe.experts.5.w3", "layers.1.block_sparse_moe.experts.5.w9",
                    "layer 1 has no ffn_up_exps matrix", "expert 5 of 8");
    /* expert width that does not match the tensors */
    hm_expect_error("qwen3_moe", "\"moe_intermediate_size\": 16", "\"moe_intermediate_size\": 20", NULL, NULL,
                    "blk.0.ffn_gate_exps.weight: shape (16, 16, 64) expected (16, 20, 64)",
                    "moe_intermediate_size=20");
    /* top-k beyond the expert count */
    hm_expect_error("mixtral", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", NULL, NULL,
                    "num_experts_per_tok=9", "must be in 1..8");
    /* no shared width in config.json: transformers' default (5632), which
     * the tensors then contradict, rather than a shared expert ignored */
    hm_expect_error("qwen2_moe", "\"shared_expert_intermediate_size\"", "\"shared_expert_intermediate_sizX\"", NULL,
                    NULL, "blk.0.ffn_gate_shexp.weight: shape (32, 64) expected (5632, 64)",
                    "shared_expert_intermediate_size=5632");
    /* dense layers between MoE ones are refused, not run as MoE */
    hm_expect_error("qwen2_moe", "\"mlp_only_layers\": []", "\"mlp_only_layers\": [1]", NULL, NULL,
                    "mlp_only_layers", "every layer is a mixture of experts");
}

Test(hf_moe, bad_gguf_are_named) {
    hm_ctx c;
    hm_setup(&c, "mixtral", false);
    const struct {
        const char *from, *to;
        bool keys_k;
        const char *want1, *want2;
    } cases[] = {
        {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate.0.weight", true, "one tensor each", "convert the model again"},
        {NULL, NULL, false, "llama.expert_used_count is missing", "mixtral"},
        {"blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exps.bias", true, "blk.1.ffn_down_exps.weight is missing",
         "mixtral"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gw img = hm_gguf_image_edit(
            c.model, (hm_gguf_opts){.rename_from = cases[i].from, .rename_to = cases[i].to, .drop_key = cases[i].keys_k ? NULL : "expert_used_count"});
        loom_model *m = NULL;
        loom_error err = {0};
        loom_model_load_opts o = {.path = "mixtral.gguf", .format = "gguf", .data = img.buf, .size = img.len};
        loom_status st = loom_model_load(&o, &m, &err);
        fprintf(stderr, "[hf_moe] GGUF case %zu: %s\n", i, err.message);
        cr_assert_neq(st, LOOM_OK, "GGUF case %zu loaded", i);
        cr_assert(strstr(err.message, cases[i].want1) && strstr(err.message, cases[i].want2),
                  "GGUF case %zu: '%s' lacks '%s' / '%s'", i, err.message, cases[i].want1, cases[i].want2);
        free(img.buf);
    }
    hm_teardown(&c);
}

/* Teacher-forced log p(next) of checkpoint `name` loaded as a GGUF with
 * the block types `go` asks for, on weight_dtype wd (0 f32, 1 gguf); (n - 1)
 * values. */
static double *hm_quant_logprobs(const char *name, hm_gguf_opts go, int wd, int *n_out, const cJSON **ref,
                                 cJSON **doc) {
    hm_ctx c;
    hm_setup_as(&c, name, true, go, wd);
    if (go.q5_0_matrices) { /* kept as stored by the loader, the embedding too */
        const loom_model_view *v = loom_model_view_get(c.model);
        int q5 = 0;
        for (int32_t i = 0; i < v->count(v->ctx); i++) {
            const loom_tensor *t = v->at(v->ctx, i);
            if (t->ndim == 2) cr_assert_eq(t->dtype, LOOM_DTYPE_Q5_0, "%s is %s, not q5_0", t->name, loom_dtype_name(t->dtype));
            q5 += t->ndim == 2 && !strcmp(t->name, "token_embd.weight");
        }
        cr_assert_eq(q5, 1, "no 2-D token_embd.weight");
    }
    int n;
    int32_t *ids = hm_ids(c.doc, "tokens", &n, 0);
    float *lg = malloc(sizeof(float) * (size_t)n * (size_t)c.V);
    tb_seq s = {.tokens = ids, .len = n};
    hm_step(&c, &s, n, true, lg);
    double *lp = malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t + 1 < n; t++) {
        int am;
        lp[t] = hm_logprob(lg + (int64_t)t * c.V, c.V, ids[t + 1], &am);
    }
    tb_seq_release(&c.b, &s);
    free(lg);
    free(ids);
    *doc = c.doc;
    c.doc = NULL; /* the caller's */
    *ref = cJSON_GetObjectItem(*doc, "logprobs");
    hm_teardown(&c);
    *n_out = n;
    return lp;
}

/* The experts of the GGUF as Q8_0 blocks (gate and up: rows of 64; down
 * stays float, its rows of 16 / 24 are not whole blocks). weight_dtype
 * gguf runs them as stored, per expert, with 8-bit block activations,
 * beside float down matrices; weight_dtype f32 dequantizes them. The two
 * must differ (the activations' rounding: the blocks were used as stored)
 * and both stay near transformers' float weights (the blocks' rounding;
 * measured mean |diff| dequantized / as stored: Mixtral 0.020 / 0.031,
 * Qwen3-MoE 0.025 / 0.034). */
static void hm_q8(const char *name) {
    int n;
    const cJSON *ref;
    cJSON *doc_f, *doc_g;
    double *f = hm_quant_logprobs(name, (hm_gguf_opts){.q8_experts = true}, 0, &n, &ref, &doc_f);
    double *g = hm_quant_logprobs(name, (hm_gguf_opts){.q8_experts = true}, 1, &n, &ref, &doc_g);
    double mean_f = 0, mean_g = 0, fg = 0;
    for (int t = 0; t + 1 < n; t++) {
        const double r = cJSON_GetArrayItem(ref, t + 1)->valuedouble;
        mean_f += fabs(f[t] - r) / (n - 1);
        mean_g += fabs(g[t] - r) / (n - 1);
        fg = fmax(fg, fabs(f[t] - g[t]));
    }
    fprintf(stderr, "[hf_moe] %s, Q8_0 experts: mean |log-prob diff| %.3g dequantized, %.3g as stored (max "
            "%.3g between them)\n", name, mean_f, mean_g, fg);
    cr_assert(mean_f < 0.1 && mean_g < 0.1, "%s: mean |diff| %g / %g (bound 0.1)", name, mean_f, mean_g);
    cr_assert(fg > 1e-6, "%s: weight_dtype gguf gave the dequantized path's log-probs exactly: the blocks "
              "were not run as stored", name);
    free(f), free(g);
    cJSON_Delete(doc_f), cJSON_Delete(doc_g);
}

Test(hf_moe, qwen3_moe_q8_0_experts) { hm_q8("qwen3_moe"); }
Test(hf_moe, mixtral_q8_0_experts) { hm_q8("mixtral"); }

/* Every matrix of Qwen3's GGUF as Q5_0 blocks, the tied embedding too.
 * weight_dtype gguf keeps them as stored: the projections and the tied LM
 * head on the q5_0 integer kernels, each token's embedding decoded from its
 * row of blocks; weight_dtype f32 dequantizes them. The two run the same
 * weights, so they differ by the activations' 8-bit rounding alone
 * (measured mean |diff| 0.057, max 0.20; all matrices as Q8_0 instead:
 * max 0.19), and not at all would mean the blocks were not run as stored.
 * Against transformers' float weights both carry the 5-bit blocks'
 * rounding of this tiny random model (measured mean 0.59; a decoder or
 * quantizer that scrambled the codes would be several nats off). */
Test(hf_moe, qwen3_q5_0_matrices) {
    int n;
    const cJSON *ref;
    cJSON *doc_f, *doc_g;
    double *f = hm_quant_logprobs("qwen3", (hm_gguf_opts){.q5_0_matrices = true}, 0, &n, &ref, &doc_f);
    double *g = hm_quant_logprobs("qwen3", (hm_gguf_opts){.q5_0_matrices = true}, 1, &n, &ref, &doc_g);
    double mean_f = 0, mean_g = 0, mean_fg = 0, fg = 0;
    for (int t = 0; t + 1 < n; t++) {
        const double r = cJSON_GetArrayItem(ref, t + 1)->valuedouble;
        mean_f += fabs(f[t] - r) / (n - 1);
        mean_g += fabs(g[t] - r) / (n - 1);
        mean_fg += fabs(f[t] - g[t]) / (n - 1);
        fg = fmax(fg, fabs(f[t] - g[t]));
    }
    fprintf(stderr, "[hf_moe] qwen3, Q5_0 matrices: mean |log-prob diff| to transformers %.3g dequantized, %.3g as "
            "stored; between them mean %.3g, max %.3g\n", mean_f, mean_g, mean_fg, fg);
    cr_assert(mean_f < 1.0 && mean_g < 1.0, "qwen3 q5_0: mean |diff| to transformers %g / %g (bound 1)", mean_f,
              mean_g);
    cr_assert(mean_fg < 0.1 && fg < 0.4, "qwen3 q5_0: as stored vs dequantized: mean |diff| %g (bound 0.1), max %g "
              "(bound 0.4)", mean_fg, fg);
    cr_assert(fg > 1e-6, "qwen3 q5_0: weight_dtype gguf gave the dequantized path's log-probs exactly: the blocks "
              "were not run as stored");
    free(f), free(g);
    cJSON_Delete(doc_f), cJSON_Delete(doc_g);
}

/* A safetensors file whose 64 experts' entries all alias one 4 KiB region:
 * stacking them would allocate 64 times what the file holds, so the loader
 * refuses before allocating. */
Test(hf_moe, aliased_expert_entries_are_refused) {
    enum { E = 64, ROWS = 16, COLS = 64, BYTES = ROWS * COLS * 4 };
    static char hdr[64 << 10];
    int k = snprintf(hdr, sizeof hdr, "{");
    static const char *const kinds[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++)
            k += snprintf(hdr + k, sizeof hdr - (size_t)k,
                          "%s\"model.layers.0.mlp.experts.%d.%s.weight\":{\"dtype\":\"F32\",\"shape\":[%d,%d],"
                          "\"data_offsets\":[0,%d]}",
                          k > 1 ? "," : "", e, kinds[j], j < 2 ? ROWS : COLS, j < 2 ? COLS : ROWS, BYTES);
    k += snprintf(hdr + k, sizeof hdr - (size_t)k, "}");
    while (k % 8) hdr[k++] = ' ';
    size_t size = 8 + (size_t)k + BYTES;
    uint8_t *file = calloc(1, size);
    uint64_t hl = (uint64_t)k;
    memcpy(file, &hl, 8);
    memcpy(file + 8, hdr, (size_t)k);
    static const char cfg[] =
        "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"vocab_size\":32,\"hidden_size\":64,\"intermediate_size\":64,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
        "\"num_experts\":64,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,\"norm_topk_prob\":true}";
    loom_model_load_opts o = {.path = "aliased", .format = "safetensors", .data = file, .size = size,
                              .config_json = cfg, .config_json_len = sizeof cfg - 1};
    loom_model *m = NULL;
    loom_error err = {0};
    cr_assert_neq(loom_model_load(&o, &m, &err), LOOM_OK);
    fprintf(stderr, "[hf_moe] aliased experts: %s\n", err.message);
    cr_assert(strstr(err.message, "more than the weight files hold"), "%s", err.message);
    free(file);
}
