/*
 * tests/model/test_model.c — model loading: GGUF (config, dims reversal,
 * Q/K un-permutation, shape validation, unsupported types), safetensors
 * directories (names, shapes, shards, corrupt headers), dummy weights
 * (determinism, dtypes, shapes), format dispatch, and — when LOOM_TEST_MODEL
 * is set — the real SmolLM2 GGUF, including a numerical check that the
 * un-permuted Q/K with NeoX RoPE give the same attention scores as
 * llama.cpp's layout with its interleaved RoPE.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "formats/dequant.h"
#include "formats/half.h"
#include "model/model.h"

/* ------------------------------------------------------------ helpers */

static char g_dir[256];

static void make_tmpdir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/loom-model-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void rm_tmpdir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static const char *tmp_path(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static loom_model *load_ok(const char *path, const char *fmt) {
    loom_model_load_opts o = {.path = path, .format = fmt};
    loom_model *m = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_OK, "load %s: %s", path, err.message);
    return m;
}

static loom_status load_err(const char *path, loom_error *err) {
    loom_model_load_opts o = {.path = path};
    loom_model *m = NULL;
    memset(err, 0, sizeof *err);
    loom_status st = loom_model_load(&o, &m, err);
    cr_assert_null(m);
    cr_assert_neq(st, LOOM_OK);
    cr_assert_gt(strlen(err->message), 0);
    return st;
}

/* llama.cpp's permute, written the way numpy evaluates it:
 *   w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(rows, cols)
 * out[h, j, i, :] = in[h, i, j, :] with strides computed explicitly. */
static void np_permute(const float *in, float *out, int rows, int cols, int n_head) {
    int half = rows / n_head / 2;
    for (int h = 0; h < n_head; h++)
        for (int j = 0; j < half; j++)
            for (int i = 0; i < 2; i++) {
                size_t out_row = ((size_t)h * half + j) * 2 + i;   /* shape (n_head, half, 2) */
                size_t in_row = ((size_t)h * 2 + i) * half + j;    /* shape (n_head, 2, half) */
                memcpy(out + out_row * cols, in + in_row * cols, (size_t)cols * sizeof *out);
            }
}

/* ------------------------------------------------------------ tiny GGUF models */

enum { TL = 2, TH = 32, TNH = 4, TNKV = 2, THD = 8, TI = 64, TV = 40 };
enum {
    F_TIE = 1, F_BIAS = 2, F_BAD_FFN_UP = 4, F_MISSING = 8, F_IQ_REQUIRED = 16, F_IQ_EXTRA = 32,
    F_QWEN2 = 64, F_Q8 = 128, F_NO_KV_HEADS = 256,
    F_GEMMA3 = 512, F_NO_WINDOW = 1024, F_NO_POST_NORM = 2048, /* gemma3: no sliding_window key / post_ffw_norm */
};

typedef struct tiny {
    gb b;
    float *bufs[128];
    int nb;
    float *hf_q[TL], *hf_k[TL], *hf_qb[TL], *hf_kb[TL]; /* HF-order originals */
    uint8_t *q8_hf[TL];
} tiny;

static float *tiny_buf(tiny *t, size_t n, float base) {
    float *p = malloc(n * sizeof *p + 64);
    for (size_t i = 0; i < n; i++) p[i] = base + (float)i * 0.001f;
    t->bufs[t->nb++] = p;
    return p;
}

static void tiny_add(tiny *t, const char *name, int rows, int cols, float base) {
    uint64_t ne[2] = {(uint64_t)(cols ? cols : rows), (uint64_t)rows};
    size_t n = (size_t)rows * (cols ? cols : 1);
    float *d = tiny_buf(t, n, base);
    gb_tensor_add(&t->b, name, GG_F32, cols ? 2 : 1, ne, d, n * 4);
}

static void build_tiny(tiny *t, unsigned flags) {
    memset(t, 0, sizeof *t);
    gb *b = &t->b;
    gb_init(b);
    const char *arch = flags & F_QWEN2 ? "qwen2" : flags & F_GEMMA3 ? "gemma3" : "llama";
    char k[128];
#define AK(s) (snprintf(k, sizeof k, "%s." s, arch), k)
    gb_s(b, "general.architecture", arch);
    gb_s(b, "general.name", "tiny test model");
    gb_u32(b, AK("block_count"), TL);
    gb_u32(b, AK("embedding_length"), TH);
    gb_u32(b, AK("feed_forward_length"), TI);
    gb_u32(b, AK("attention.head_count"), TNH);
    if (!(flags & F_NO_KV_HEADS)) gb_u32(b, AK("attention.head_count_kv"), TNKV);
    gb_f32(b, AK("rope.freq_base"), 50000.0f);
    gb_f32(b, AK("attention.layer_norm_rms_epsilon"), 1e-6f);
    gb_u32(b, AK("context_length"), 128);
    gb_u32(b, AK("rope.dimension_count"), THD);
    gb_strarr(b, "tokenizer.ggml.tokens", TV, "t");
    gb_u32(b, "tokenizer.ggml.bos_token_id", 1);
    gb_u32(b, "tokenizer.ggml.eos_token_id", 2);
    if ((flags & F_GEMMA3) && !(flags & F_NO_WINDOW)) gb_u32(b, AK("attention.sliding_window"), 4);
#undef AK
    int nkv = flags & F_NO_KV_HEADS ? TNH : TNKV;
    bool permute = !(flags & (F_QWEN2 | F_GEMMA3));
    tiny_add(t, "token_embd.weight", TV, TH, 1.0f);
    tiny_add(t, "output_norm.weight", TH, 0, 2.0f);
    if (!(flags & F_TIE)) tiny_add(t, "output.weight", TV, TH, 3.0f);
    char name[64];
    for (int l = 0; l < TL; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        tiny_add(t, N("attn_norm.weight"), TH, 0, 10.0f + l);
        int rows_q = TNH * THD, rows_k = nkv * THD;
        if (flags & F_Q8) {
            /* Q8_0 rows of 32 elements = one 34-byte block; byte pattern names the row */
            for (int w = 0; w < 2; w++) {
                int rows = w ? rows_k : rows_q;
                uint8_t *hf = malloc((size_t)rows * 34), *gg = malloc((size_t)rows * 34);
                for (int r = 0; r < rows; r++) {
                    uint16_t d = loom_fp32_to_fp16(0.5f);
                    memcpy(hf + r * 34, &d, 2);
                    for (int c = 0; c < 32; c++) hf[r * 34 + 2 + c] = (uint8_t)(r * 3 + c + w * 50);
                }
                cr_assert_eq(loom_model_permute_rows(hf, gg, rows, 34, w ? nkv : TNH), LOOM_OK);
                uint64_t ne[2] = {TH, (uint64_t)rows};
                gb_tensor_add(b, w ? N("attn_k.weight") : N("attn_q.weight"), GG_Q8_0, 2, ne, gg,
                              (size_t)rows * 34);
                if (!w) t->q8_hf[l] = hf;
                t->bufs[t->nb++] = (float *)gg;
                if (w) t->bufs[t->nb++] = (float *)hf;
            }
        } else {
            for (int w = 0; w < 2; w++) {
                int rows = w ? rows_k : rows_q;
                float *hf = tiny_buf(t, (size_t)rows * TH, 0);
                for (int r = 0; r < rows; r++)
                    for (int c = 0; c < TH; c++) hf[r * TH + c] = (float)(l * 10000 + w * 1000 + r * 10) + c * 0.01f;
                float *gg = tiny_buf(t, (size_t)rows * TH, 0);
                if (permute) np_permute(hf, gg, rows, TH, w ? nkv : TNH);
                else memcpy(gg, hf, (size_t)rows * TH * 4);
                uint64_t ne[2] = {TH, (uint64_t)rows};
                gb_tensor_add(b, w ? N("attn_k.weight") : N("attn_q.weight"), GG_F32, 2, ne, gg,
                              (size_t)rows * TH * 4);
                if (w) t->hf_k[l] = hf;
                else t->hf_q[l] = hf;
            }
        }
        tiny_add(t, N("attn_v.weight"), nkv * THD, TH, 30.0f + l);
        if (flags & (F_BIAS | F_QWEN2)) {
            for (int w = 0; w < 2; w++) {
                int rows = w ? nkv * THD : TNH * THD;
                float *hf = tiny_buf(t, (size_t)rows, (float)(100 * (w + 1) + l));
                float *gg = tiny_buf(t, (size_t)rows, 0);
                if (permute) np_permute(hf, gg, rows, 1, w ? nkv : TNH);
                else memcpy(gg, hf, (size_t)rows * 4);
                uint64_t ne[1] = {(uint64_t)rows};
                gb_tensor_add(b, w ? N("attn_k.bias") : N("attn_q.bias"), GG_F32, 1, ne, gg, (size_t)rows * 4);
                if (w) t->hf_kb[l] = hf;
                else t->hf_qb[l] = hf;
            }
            tiny_add(t, N("attn_v.bias"), nkv * THD, 0, 40.0f);
        }
        tiny_add(t, N("attn_output.weight"), TH, TNH * THD, 50.0f);
        tiny_add(t, N("ffn_norm.weight"), TH, 0, 60.0f);
        if (!((flags & F_MISSING) && l == 1)) tiny_add(t, N("ffn_gate.weight"), TI, TH, 70.0f);
        tiny_add(t, N("ffn_up.weight"), (flags & F_BAD_FFN_UP) && l == 1 ? TI : TI, (flags & F_BAD_FFN_UP) && l == 1 ? TH + 1 : TH, 80.0f);
        if ((flags & F_IQ_REQUIRED) && l == 0) {
            static uint8_t iq[66 * TH * TI / 256 + 66];
            uint64_t ne[2] = {256, (uint64_t)(TH * TI / 256)}; /* shape is wrong anyway: type is what fails first */
            gb_tensor_add(b, N("ffn_down.weight"), GG_IQ2_XXS, 2, ne, iq, 66 * ne[1]);
        } else {
            tiny_add(t, N("ffn_down.weight"), TH, TI, 90.0f);
        }
        if (flags & F_GEMMA3) {
            tiny_add(t, N("attn_q_norm.weight"), THD, 0, 1.0f);
            tiny_add(t, N("attn_k_norm.weight"), THD, 0, 1.5f);
            tiny_add(t, N("post_attention_norm.weight"), TH, 0, 2.0f);
            if (!((flags & F_NO_POST_NORM) && l == 1)) tiny_add(t, N("post_ffw_norm.weight"), TH, 0, 2.5f);
        }
#undef N
    }
    if (flags & F_IQ_EXTRA) {
        static uint8_t iq[66];
        uint64_t ne[1] = {256};
        gb_tensor_add(b, "extra.iq.weight", GG_IQ2_XXS, 1, ne, iq, sizeof iq);
    }
}

static const char *write_tiny(tiny *t, const char *name) {
    gw f = gb_finish(&t->b);
    const char *p = tmp_path(name);
    cr_assert_eq(gw_write_file(&f, p), 0);
    free(f.buf);
    return p;
}

static void free_tiny(tiny *t) {
    for (int i = 0; i < t->nb; i++) free(t->bufs[i]);
    for (int l = 0; l < TL; l++) free(t->q8_hf[l]);
    gb_free(&t->b);
}

/* ------------------------------------------------------------ permutation */

Test(model, permute_matches_numpy_and_inverts) {
    /* expected sequences computed with numpy from llama.cpp's expression */
    float in[12], out[12], back[12];
    for (int i = 0; i < 12; i++) in[i] = (float)i;
    cr_assert_eq(loom_model_permute_rows(in, out, 8, 4, 1), LOOM_OK);
    const float want8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    cr_assert_eq(memcmp(out, want8, sizeof want8), 0);
    cr_assert_eq(loom_model_permute_rows(in, out, 12, 4, 2), LOOM_OK);
    const float want12[12] = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
    cr_assert_eq(memcmp(out, want12, sizeof want12), 0);
    cr_assert_eq(loom_model_unpermute_rows(out, back, 12, 4, 2), LOOM_OK);
    cr_assert_eq(memcmp(in, back, sizeof in), 0);
    cr_assert_eq(loom_model_permute_rows(in, out, 12, 4, 4), LOOM_ERR_INVALID, "3 rows per head is odd");

    /* random rows of odd byte widths, many head counts: unpermute(permute(x)) == x,
     * permute(unpermute(x)) == x, and the test's numpy-style permute agrees */
    uint64_t s = 7;
    int heads[] = {1, 2, 3, 8, 9, 32};
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
        int nh = heads[hi], hd = 64, rows = nh * hd;
        size_t rb = 20; /* e.g. one Q4_1 block */
        uint8_t *a = malloc(rows * rb), *p = malloc(rows * rb), *u = malloc(rows * rb);
        for (size_t i = 0; i < rows * rb; i++) a[i] = (uint8_t)((s = s * 6364136223846793005ull + 1) >> 56);
        cr_assert_eq(loom_model_permute_rows(a, p, rows, rb, nh), LOOM_OK);
        cr_assert_neq(memcmp(a, p, rows * rb), 0, "permutation is not the identity");
        cr_assert_eq(loom_model_unpermute_rows(p, u, rows, rb, nh), LOOM_OK);
        cr_assert_eq(memcmp(a, u, rows * rb), 0);
        cr_assert_eq(loom_model_unpermute_rows(a, p, rows, rb, nh), LOOM_OK);
        cr_assert_eq(loom_model_permute_rows(p, u, rows, rb, nh), LOOM_OK);
        cr_assert_eq(memcmp(a, u, rows * rb), 0);
        float *fa = malloc(rows * 3 * sizeof *fa), *fp = malloc(rows * 3 * sizeof *fp),
              *fq = malloc(rows * 3 * sizeof *fq);
        for (int i = 0; i < rows * 3; i++) fa[i] = (float)i;
        np_permute(fa, fp, rows, 3, nh);
        cr_assert_eq(loom_model_permute_rows(fa, fq, rows, 3 * sizeof *fa, nh), LOOM_OK);
        cr_assert_eq(memcmp(fp, fq, rows * 3 * sizeof *fa), 0);
        free(fa), free(fp), free(fq), free(a), free(p), free(u);
    }
}

/* ------------------------------------------------------------ GGUF models */

Test(model, gguf_tiny_llama_loads_and_unpermutes) {
    make_tmpdir();
    tiny t;
    build_tiny(&t, F_BIAS);
    const char *p = write_tiny(&t, "tiny.gguf");
    loom_model *m = load_ok(p, "auto");
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert_eq(c->struct_size, sizeof *c);
    cr_assert_eq(c->arch, LOOM_ARCH_LLAMA);
    cr_assert(c->num_layers == TL && c->hidden_size == TH && c->intermediate_size == TI);
    cr_assert(c->num_heads == TNH && c->num_kv_heads == TNKV && c->head_dim == THD && c->vocab_size == TV);
    cr_assert(c->max_context == 128 && c->rope_theta == 50000.0f && c->rms_norm_eps == 1e-6f);
    cr_assert(c->bos_token_id == 1 && c->eos_token_id == 2 && !c->tie_embeddings && c->qkv_bias);
    cr_assert_eq(c->rope_scaling, LOOM_ROPE_SCALING_NONE);
    cr_assert_str_eq(c->name, "tiny test model");
    cr_assert_str_eq(loom_model_format_name(m), "gguf");
    cr_assert_not_null(loom_model_gguf(m));
    cr_assert_null(loom_model_tokenizer_json(m));
    cr_assert_str_eq(loom_model_dir(m), g_dir);

    const loom_model_view *v = loom_model_view_get(m);
    cr_assert_eq(v->config, c);
    cr_assert_eq(v->count(v->ctx), t.b.n_t);
    for (int32_t i = 0; i < v->count(v->ctx); i++) {
        const loom_tensor *x = v->at(v->ctx, i);
        cr_assert_eq(v->get(v->ctx, x->name), x);
        cr_assert_eq(x->device, LOOM_DEVICE_HOST);
    }
    cr_assert_null(v->at(v->ctx, -1));
    cr_assert_null(v->get(v->ctx, "nope"));
    /* dims reversed: GGML ne = {in, out} -> {out, in} */
    const loom_tensor *x = v->get(v->ctx, "blk.0.ffn_down.weight");
    cr_assert(x && x->ndim == 2 && x->shape[0] == TH && x->shape[1] == TI && x->dtype == LOOM_DTYPE_F32);
    cr_assert_eq(x->nbytes, (size_t)TH * TI * 4);
    x = v->get(v->ctx, "token_embd.weight");
    cr_assert(x->shape[0] == TV && x->shape[1] == TH && ((float *)x->data)[1] == 1.001f);
    x = v->get(v->ctx, "output_norm.weight");
    cr_assert(x->ndim == 1 && x->shape[0] == TH);
    /* Q/K weights and biases are back in HF order */
    for (int l = 0; l < TL; l++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%d.attn_q.weight", l);
        x = v->get(v->ctx, n);
        cr_assert(x->shape[0] == TNH * THD && x->shape[1] == TH);
        cr_assert_eq(memcmp(x->data, t.hf_q[l], x->nbytes), 0, "%s not un-permuted", n);
        snprintf(n, sizeof n, "blk.%d.attn_k.weight", l);
        x = v->get(v->ctx, n);
        cr_assert_eq(memcmp(x->data, t.hf_k[l], x->nbytes), 0, "%s not un-permuted", n);
        snprintf(n, sizeof n, "blk.%d.attn_q.bias", l);
        x = v->get(v->ctx, n);
        cr_assert_eq(memcmp(x->data, t.hf_qb[l], x->nbytes), 0, "%s not un-permuted", n);
        snprintf(n, sizeof n, "blk.%d.attn_k.bias", l);
        x = v->get(v->ctx, n);
        cr_assert_eq(memcmp(x->data, t.hf_kb[l], x->nbytes), 0, "%s not un-permuted", n);
    }
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_quantized_qk_rows_moved_whole) {
    make_tmpdir();
    tiny t;
    build_tiny(&t, F_Q8 | F_TIE);
    const char *p = write_tiny(&t, "q8.gguf");
    loom_model *m = load_ok(p, "gguf");
    cr_assert(loom_model_config_get(m)->tie_embeddings);
    cr_assert_null(loom_model_tensor(m, "output.weight"));
    const loom_tensor *x = loom_model_tensor(m, "blk.1.attn_q.weight");
    cr_assert(x->dtype == LOOM_DTYPE_Q8_0 && x->shape[0] == TNH * THD && x->shape[1] == TH);
    cr_assert_eq(memcmp(x->data, t.q8_hf[1], x->nbytes), 0);
    /* and the dequantized rows agree with dequantizing the originals */
    float a[TH], b[TH];
    for (int r = 0; r < TNH * THD; r++) {
        loom_dequant_row(LOOM_DTYPE_Q8_0, (const uint8_t *)x->data + r * 34, a, TH);
        loom_dequant_row(LOOM_DTYPE_Q8_0, t.q8_hf[1] + r * 34, b, TH);
        cr_assert_eq(memcmp(a, b, sizeof a), 0);
    }
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_qwen2_not_permuted) {
    make_tmpdir();
    tiny t;
    build_tiny(&t, F_QWEN2 | F_TIE);
    const char *p = write_tiny(&t, "qwen.gguf");
    loom_model *m = load_ok(p, NULL);
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert(c->arch == LOOM_ARCH_QWEN2 && c->qkv_bias && c->tie_embeddings);
    const loom_tensor *x = loom_model_tensor(m, "blk.0.attn_q.weight");
    cr_assert_eq(memcmp(x->data, t.hf_q[0], x->nbytes), 0);
    x = loom_model_tensor(m, "blk.1.attn_k.bias");
    cr_assert_eq(memcmp(x->data, t.hf_kb[1], x->nbytes), 0);
    cr_assert_eq((const void *)x->data, loom_gguf_find_tensor(loom_model_gguf(m), "blk.1.attn_k.bias")->data,
                 "qwen2 tensors stay in the mapping");
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_default_kv_heads) {
    make_tmpdir();
    tiny t;
    build_tiny(&t, F_NO_KV_HEADS);
    loom_model *m = load_ok(write_tiny(&t, "mha.gguf"), NULL);
    cr_assert_eq(loom_model_config_get(m)->num_kv_heads, TNH);
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_shape_errors) {
    make_tmpdir();
    loom_error err;
    tiny t;
    build_tiny(&t, F_BAD_FFN_UP);
    load_err(write_tiny(&t, "bad.gguf"), &err);
    cr_assert(strstr(err.message, "blk.1.ffn_up.weight: shape (64, 33) expected (64, 32) from "
                                  "llama.feed_forward_length=64, llama.embedding_length=32"),
              "%s", err.message);
    cr_assert(strstr(err.message, "bad.gguf"), "%s", err.message);
    free_tiny(&t);

    build_tiny(&t, F_MISSING);
    load_err(write_tiny(&t, "missing.gguf"), &err);
    cr_assert(strstr(err.message, "blk.1.ffn_gate.weight is missing"), "%s", err.message);
    free_tiny(&t);

    /* the metadata says 3 layers: layer 2 is missing */
    build_tiny(&t, 0);
    gb_u32(&t.b, "llama.block_count", 3); /* duplicate key: rejected by the reader */
    load_err(write_tiny(&t, "dup.gguf"), &err);
    cr_assert(strstr(err.message, "duplicate metadata key"), "%s", err.message);
    free_tiny(&t);

    /* head_count_kv that does not divide head_count */
    build_tiny(&t, F_NO_KV_HEADS);
    gb_u32(&t.b, "llama.attention.head_count_kv", 3);
    load_err(write_tiny(&t, "gqa.gguf"), &err);
    cr_assert(strstr(err.message, "not a multiple"), "%s", err.message);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_unsupported_types) {
    make_tmpdir();
    loom_error err;
    tiny t;
    build_tiny(&t, F_IQ_REQUIRED);
    cr_assert_eq(load_err(write_tiny(&t, "iq.gguf"), &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "blk.0.ffn_down.weight") && strstr(err.message, "iq2_xxs"), "%s", err.message);
    free_tiny(&t);
    /* an unsupported tensor nobody needs does not stop the load */
    build_tiny(&t, F_IQ_EXTRA);
    loom_model *m = load_ok(write_tiny(&t, "extra.gguf"), NULL);
    cr_assert_null(loom_model_tensor(m, "extra.iq.weight"));
    const loom_gguf_tensor_info *ti = loom_gguf_find_tensor(loom_model_gguf(m), "extra.iq.weight");
    cr_assert(ti && !ti->supported);
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

Test(model, gguf_arch_and_keys) {
    make_tmpdir();
    loom_error err;
    tiny t;
    build_tiny(&t, 0);
    /* rewrite general.architecture: first kv; value "llama" -> "gpt2x" (same length) */
    gw f = gb_finish(&t.b);
    uint8_t *at = memmem(f.buf, f.len, "llama", 5);
    cr_assert_not_null(at);
    memcpy(at, "gpt2x", 5);
    const char *p = tmp_path("gpt2.gguf");
    gw_write_file(&f, p);
    free(f.buf);
    cr_assert_eq(load_err(p, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "architecture 'gpt2x' is not supported"), "%s", err.message);
    free_tiny(&t);

    /* rope scaling keys */
    build_tiny(&t, 0);
    gb_s(&t.b, "llama.rope.scaling.type", "linear");
    gb_f32(&t.b, "llama.rope.scaling.factor", 4.0f);
    loom_model *m = load_ok(write_tiny(&t, "linear.gguf"), NULL);
    cr_assert_eq(loom_model_config_get(m)->rope_scaling, LOOM_ROPE_SCALING_LINEAR);
    cr_assert_eq(loom_model_config_get(m)->rope_factor, 4.0f);
    loom_model_free(m);
    free_tiny(&t);
    build_tiny(&t, 0);
    gb_s(&t.b, "llama.rope.scaling.type", "yarn");
    load_err(write_tiny(&t, "yarn.gguf"), &err);
    cr_assert(strstr(err.message, "yarn"), "%s", err.message);
    free_tiny(&t);
    /* Llama 3.1 style: rope_freqs.weight tensor */
    build_tiny(&t, 0);
    static float freqs[THD / 2];
    for (int i = 0; i < THD / 2; i++) freqs[i] = i == 0 ? 1.0f : 8.0f;
    uint64_t ne[1] = {THD / 2};
    gb_tensor_add(&t.b, "rope_freqs.weight", GG_F32, 1, ne, freqs, sizeof freqs);
    m = load_ok(write_tiny(&t, "l31.gguf"), NULL);
    cr_assert_eq(loom_model_config_get(m)->rope_scaling, LOOM_ROPE_SCALING_LLAMA3);
    cr_assert_eq(loom_model_config_get(m)->rope_factor, 8.0f);
    cr_assert_not_null(loom_model_tensor(m, "rope_freqs.weight"));
    loom_model_free(m);
    free_tiny(&t);
    rm_tmpdir();
}

/* Gemma 3: the keys (llama.cpp's defaults where absent), the config's
 * flags, Q/K rows left as stored, the four extra norms required, and the
 * errors naming the key or tensor at fault. */
Test(model, gguf_gemma3_config) {
    make_tmpdir();
    loom_error err;
    tiny t;
    build_tiny(&t, F_GEMMA3);
    loom_model *m = load_ok(write_tiny(&t, "gemma3.gguf"), NULL);
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert_eq(c->arch, LOOM_ARCH_GEMMA3);
    cr_assert(c->qk_norm && c->post_norms && c->ffn_act == LOOM_FFN_GELU_TANH);
    cr_assert(c->sliding_window == 4 && c->global_every == 6 && c->rope_theta_local == 10000.0f);
    cr_assert_eq(c->rope_theta, 50000.0f);
    cr_assert_float_eq(c->attn_scale, 1.0f / sqrtf((float)THD), 1e-7f);
    cr_assert_float_eq(c->embed_scale, sqrtf((float)TH), 1e-6f);
    const loom_tensor *q = loom_model_tensor(m, "blk.1.attn_q.weight");
    cr_assert_eq(memcmp(q->data, t.hf_q[1], (size_t)TNH * THD * TH * 4), 0, "gemma3 q rows must stay as stored");
    cr_assert_not_null(loom_model_tensor(m, "blk.0.attn_k_norm.weight"));
    loom_model_free(m);
    free_tiny(&t);

    build_tiny(&t, F_GEMMA3);
    gb_f32(&t.b, "gemma3.rope.freq_base_swa", 5000.0f);
    gb_u32(&t.b, "gemma3.attention.sliding_window_pattern", 2);
    m = load_ok(write_tiny(&t, "gemma3b.gguf"), NULL);
    c = loom_model_config_get(m);
    cr_assert(c->rope_theta_local == 5000.0f && c->global_every == 2);
    loom_model_free(m);
    free_tiny(&t);

    build_tiny(&t, F_GEMMA3 | F_NO_WINDOW);
    cr_assert_eq(load_err(write_tiny(&t, "nowin.gguf"), &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "gemma3.attention.sliding_window is missing"), "%s", err.message);
    free_tiny(&t);

    build_tiny(&t, F_GEMMA3 | F_NO_WINDOW);
    gb_u32(&t.b, "gemma3.attention.sliding_window", 0);
    cr_assert_eq(load_err(write_tiny(&t, "win0.gguf"), &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "sliding_window=0") && strstr(err.message, "positive"), "%s", err.message);
    free_tiny(&t);

    build_tiny(&t, F_GEMMA3 | F_NO_POST_NORM);
    cr_assert_eq(load_err(write_tiny(&t, "nopost.gguf"), &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "blk.1.post_ffw_norm.weight is missing") && strstr(err.message, "gemma3"), "%s",
              err.message);
    free_tiny(&t);
    rm_tmpdir();
}

/* general.alignment = 1 lets tensor data sit at any address (issue 29):
 * every tensor must still reach the model aligned (copied when needed) with
 * its values intact, and rope_freqs.weight must be read safely. A padding
 * key of 0..3 bytes is tried until rope_freqs.weight lands at an odd offset. */
Test(model, gguf_alignment_one_misaligned_tensors) {
    make_tmpdir();
    static float freqs[THD / 2];
    for (int i = 0; i < THD / 2; i++) freqs[i] = i == 0 ? 1.0f : 8.0f;
    bool odd = false;
    for (int pad = 0; pad < 4 && !odd; pad++) {
        tiny t;
        build_tiny(&t, 0);
        t.b.alignment = 1;
        gb_u32(&t.b, "general.alignment", 1);
        char padv[8] = "";
        memset(padv, 'p', (size_t)pad);
        gb_s(&t.b, "x.pad", padv);
        uint64_t ne[1] = {THD / 2};
        gb_tensor_add(&t.b, "rope_freqs.weight", GG_F32, 1, ne, freqs, sizeof freqs);
        gw f = gb_finish(&t.b);
        /* rope_freqs.weight is last: its data ends the file */
        odd = (f.len - sizeof freqs) % 4 != 0;
        const char *p = tmp_path("align1.gguf");
        cr_assert_eq(gw_write_file(&f, p), 0);
        free(f.buf);
        if (!odd) { free_tiny(&t); continue; }
        loom_model *m = load_ok(p, NULL);
        cr_expect_eq(loom_model_config_get(m)->rope_scaling, LOOM_ROPE_SCALING_LLAMA3);
        cr_expect_eq(loom_model_config_get(m)->rope_factor, 8.0f);
        const loom_tensor *rf = loom_model_tensor(m, "rope_freqs.weight");
        cr_assert_not_null(rf);
        cr_expect_eq((uintptr_t)rf->data % 32, 0, "rope_freqs.weight copied to aligned storage");
        cr_expect_arr_eq(rf->data, freqs, sizeof freqs);
        const loom_tensor *emb = loom_model_tensor(m, "token_embd.weight");
        cr_assert_not_null(emb);
        cr_expect_eq((uintptr_t)emb->data % 32, 0, "token_embd.weight aligned");
        float e0;
        memcpy(&e0, emb->data, 4);
        cr_expect_float_eq(e0, 1.0f, 1e-6f, "token_embd.weight values kept");
        loom_model_free(m);
        free_tiny(&t);
    }
    cr_assert(odd, "no padding put rope_freqs.weight at an odd offset");
    rm_tmpdir();
}

/* ------------------------------------------------------------ safetensors */

typedef struct st_entry {
    const char *name, *dtype;
    int nd;
    int64_t shape[2];
} st_entry;

/* Write a .safetensors with the given entries (or a raw header instead);
 * element j of tensor i is (i + 1) * 1000 + j % 1000 in that dtype. */
static void write_safetensors(const char *path, const st_entry *e, int n, const char *header_override) {
    char hdr[16384];
    size_t off = 0;
    int k = snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t esz = !strcmp(e[i].dtype, "F32") ? 4 : 2;
        int64_t numel = e[i].nd == 1 ? e[i].shape[0] : e[i].shape[0] * e[i].shape[1];
        char shp[64];
        if (e[i].nd == 1) snprintf(shp, sizeof shp, "[%lld]", (long long)e[i].shape[0]);
        else snprintf(shp, sizeof shp, "[%lld,%lld]", (long long)e[i].shape[0], (long long)e[i].shape[1]);
        k += snprintf(hdr + k, sizeof hdr - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                      e[i].name, e[i].dtype, shp, off, off + (size_t)numel * esz);
        off += numel * esz;
    }
    k += snprintf(hdr + k, sizeof hdr - k, "}");
    if (header_override) k = snprintf(hdr, sizeof hdr, "%s", header_override);
    while (k % 8) hdr[k++] = ' ';
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint64_t hl = (uint64_t)k;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, (size_t)k, f);
    for (int i = 0; i < n; i++) {
        int64_t numel = e[i].nd == 1 ? e[i].shape[0] : e[i].shape[0] * e[i].shape[1];
        for (int64_t j = 0; j < numel; j++) {
            float v = (float)((i + 1) * 1000 + j % 1000);
            if (!strcmp(e[i].dtype, "F32")) fwrite(&v, 4, 1, f);
            else {
                uint16_t h = !strcmp(e[i].dtype, "BF16") ? loom_fp32_to_bf16(v) : loom_fp32_to_fp16(v);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    fclose(f);
}

/* HF tensor list for the tiny config (hidden 32, 4 heads of 8, 2 kv heads, ffn 64, vocab 40, 2 layers) */
static int hf_entries(st_entry *e, const char *dtype, bool lm_head, bool bias, char names[][96]) {
    int n = 0;
#define E(nm, nd_, a, b_)                                                       \
    do {                                                                        \
        snprintf(names[n], 96, "%s", nm);                                       \
        e[n] = (st_entry){names[n], dtype, nd_, {a, b_}};                       \
        n++;                                                                    \
    } while (0)
    E("model.embed_tokens.weight", 2, TV, TH);
    E("model.norm.weight", 1, TH, 0);
    if (lm_head) E("lm_head.weight", 2, TV, TH);
    char nm[96];
    for (int l = 0; l < TL; l++) {
#define L(s, nd_, a, b_) do { snprintf(nm, sizeof nm, "model.layers.%d." s, l); E(nm, nd_, a, b_); } while (0)
        L("input_layernorm.weight", 1, TH, 0);
        L("post_attention_layernorm.weight", 1, TH, 0);
        L("self_attn.q_proj.weight", 2, TNH * THD, TH);
        L("self_attn.k_proj.weight", 2, TNKV * THD, TH);
        L("self_attn.v_proj.weight", 2, TNKV * THD, TH);
        if (bias) {
            L("self_attn.q_proj.bias", 1, TNH * THD, 0);
            L("self_attn.k_proj.bias", 1, TNKV * THD, 0);
            L("self_attn.v_proj.bias", 1, TNKV * THD, 0);
        }
        L("self_attn.o_proj.weight", 2, TH, TNH * THD);
        L("mlp.gate_proj.weight", 2, TI, TH);
        L("mlp.up_proj.weight", 2, TI, TH);
        L("mlp.down_proj.weight", 2, TH, TI);
#undef L
    }
    E("model.rotary_emb.inv_freq", 1, THD / 2, 0); /* ignored by loom */
#undef E
    return n;
}

static const char *k_config =
    "{\"architectures\":[\"%s\"],\"model_type\":\"llama\",\"vocab_size\":40,\"hidden_size\":32,"
    "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":256,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-05,\"bos_token_id\":1,"
    "\"eos_token_id\":[2,3],\"tie_word_embeddings\":%s,\"torch_dtype\":\"bfloat16\",\"head_dim\":8,"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
    "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}}";

static void write_config(const char *arch, bool tie) {
    char cfg[2048];
    snprintf(cfg, sizeof cfg, k_config, arch, tie ? "true" : "false");
    write_text(tmp_path("config.json"), cfg);
}

/* transformers >= 5 writes rope_theta (and any scaling) inside a
 * `rope_parameters` object, as seen on the GPU machine's transformers 5.17.
 * A loader that only read the top-level rope_theta silently used 10000. */
Test(model, safetensors_rope_parameters_v5) {
    make_tmpdir();
    st_entry e[64];
    char names[64][96];
    int n = hf_entries(e, "BF16", true, false, names);
    write_safetensors(tmp_path("model.safetensors"), e, n, NULL);
    write_text(tmp_path("config.json"),
               "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":40,"
               "\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-05,"
               "\"head_dim\":8,\"tie_word_embeddings\":false,"
               "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"default\"}}");
    loom_model *m = load_ok(g_dir, "auto");
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert_eq(c->rope_theta, 500000.0f);
    cr_assert_eq(c->rope_scaling, LOOM_ROPE_SCALING_NONE);
    loom_model_free(m);

    write_text(tmp_path("config.json"),
               "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":40,"
               "\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"max_position_embeddings\":256,\"head_dim\":8,"
               "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"llama3\",\"factor\":8.0,"
               "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}}");
    m = load_ok(g_dir, "auto");
    c = loom_model_config_get(m);
    cr_assert(c->rope_theta == 500000.0f && c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3 && c->rope_factor == 8.0f &&
              c->rope_original_context == 64);
    loom_model_free(m);
}

/* Numbers in config.json that do not fit their field are errors naming the
 * key and the value (issue 29: original_max_position_embeddings 1e20 was
 * converted to int32 with undefined behavior, a context of -2147483648). */
static void config_value_err(const char *from, const char *to, const char *want1, const char *want2) {
    char cfg[2048], out[2048];
    snprintf(cfg, sizeof cfg, k_config, "LlamaForCausalLM", "false");
    char *at = strstr(cfg, from);
    cr_assert_not_null(at, "%s", from);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    write_text(tmp_path("config.json"), out);
    loom_error err;
    cr_expect_eq(load_err(g_dir, &err), LOOM_ERR_FORMAT, "%s", to);
    cr_expect(strstr(err.message, want1) && strstr(err.message, want2), "%s: %s", to, err.message);
}

Test(model, safetensors_config_numbers_out_of_range) {
    make_tmpdir();
    st_entry e[64];
    char names[64][96];
    int n = hf_entries(e, "F32", true, false, names);
    write_safetensors(tmp_path("model.safetensors"), e, n, NULL);
    const char *orig = "\"original_max_position_embeddings\":64";
    config_value_err(orig, "\"original_max_position_embeddings\":1e20", "original_max_position_embeddings", "1e+20");
    config_value_err(orig, "\"original_max_position_embeddings\":-5", "original_max_position_embeddings", "-5");
    config_value_err(orig, "\"original_max_position_embeddings\":64.5", "original_max_position_embeddings", "64.5");
    config_value_err("\"factor\":8.0", "\"factor\":1e300", "\"factor\"", "1e+300");
    config_value_err("\"rope_theta\":500000.0", "\"rope_theta\":-1e39", "\"rope_theta\"", "-1e+39");
    config_value_err("\"max_position_embeddings\":256", "\"max_position_embeddings\":-2147483648",
                     "\"max_position_embeddings\"", "-2147483648");
    config_value_err("\"max_position_embeddings\":256", "\"max_position_embeddings\":1e20",
                     "\"max_position_embeddings\"", "1e+20");
    rm_tmpdir();
}

Test(model, safetensors_single_file) {
    make_tmpdir();
    st_entry e[64];
    char names[64][96];
    int n = hf_entries(e, "BF16", true, false, names);
    write_safetensors(tmp_path("model.safetensors"), e, n, NULL);
    write_config("LlamaForCausalLM", false);
    write_text(tmp_path("tokenizer.json"), "{}");
    loom_model *m = load_ok(g_dir, "auto");
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert(c->arch == LOOM_ARCH_LLAMA && c->num_layers == 2 && c->hidden_size == 32 && c->head_dim == 8);
    cr_assert(c->num_kv_heads == 2 && c->vocab_size == 40 && c->max_context == 256 && c->rope_theta == 500000.0f);
    cr_assert(c->bos_token_id == 1 && c->eos_token_id == 2 && !c->tie_embeddings && !c->qkv_bias);
    cr_assert(c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3 && c->rope_factor == 8.0f &&
              c->rope_original_context == 64 && c->rope_high_freq_factor == 4.0f);
    cr_assert_str_eq(loom_model_format_name(m), "safetensors");
    cr_assert_str_eq(loom_model_tokenizer_json(m), tmp_path("tokenizer.json"));
    cr_assert_str_eq(loom_model_dir(m), g_dir);
    cr_assert_null(loom_model_gguf(m));
    const loom_tensor *x = loom_model_tensor(m, "blk.1.attn_q.weight");
    cr_assert(x && x->dtype == LOOM_DTYPE_BF16 && x->ndim == 2 && x->shape[0] == 32 && x->shape[1] == 32);
    x = loom_model_tensor(m, "blk.0.ffn_down.weight");
    cr_assert(x && x->shape[0] == TH && x->shape[1] == TI);
    x = loom_model_tensor(m, "output.weight");
    cr_assert(x && ((const uint16_t *)x->data)[0] == loom_fp32_to_bf16(3000.0f), "lm_head data");
    cr_assert_not_null(loom_model_tensor(m, "output_norm.weight"));
    cr_assert_not_null(loom_model_tensor(m, "blk.1.ffn_norm.weight"));
    cr_assert_null(loom_model_tensor(m, "model.rotary_emb.inv_freq"));
    const loom_model_view *v = loom_model_view_get(m);
    cr_assert_eq(v->count(v->ctx), n - 1);
    loom_model_free(m);

    /* a path to the file inside the directory works too */
    m = load_ok(tmp_path("model.safetensors"), NULL);
    loom_model_free(m);
    rm_tmpdir();
}

Test(model, safetensors_qwen2_tied_sharded) {
    make_tmpdir();
    st_entry e[64];
    char names[64][96];
    int n = hf_entries(e, "F16", true, true, names); /* lm_head stored although tied */
    int half = n / 2;
    write_safetensors(tmp_path("model-00001-of-00002.safetensors"), e, half, NULL);
    write_safetensors(tmp_path("model-00002-of-00002.safetensors"), e + half, n - half, NULL);
    char idx[16384];
    int k = snprintf(idx, sizeof idx, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < n; i++)
        k += snprintf(idx + k, sizeof idx - k, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "",
                      e[i].name, i < half ? 1 : 2);
    snprintf(idx + k, sizeof idx - k, "}}");
    write_text(tmp_path("model.safetensors.index.json"), idx);
    write_config("Qwen2ForCausalLM", true);
    loom_model *m = load_ok(g_dir, "safetensors");
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert(c->arch == LOOM_ARCH_QWEN2 && c->qkv_bias && c->tie_embeddings);
    cr_assert_null(loom_model_tensor(m, "output.weight"), "tied: lm_head is not exposed");
    const loom_tensor *x = loom_model_tensor(m, "blk.1.attn_v.bias");
    cr_assert(x && x->dtype == LOOM_DTYPE_F16 && x->ndim == 1 && x->shape[0] == TNKV * THD);
    cr_assert_null(loom_model_tokenizer_json(m));
    loom_model_free(m);

    /* index naming a shard that lacks the tensor */
    k = snprintf(idx, sizeof idx, "{\"weight_map\":{");
    for (int i = 0; i < n; i++)
        k += snprintf(idx + k, sizeof idx - k, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "",
                      e[i].name, 1);
    snprintf(idx + k, sizeof idx - k, "}}");
    write_text(tmp_path("model.safetensors.index.json"), idx);
    loom_error err;
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "not present"), "%s", err.message);
    /* path traversal in the index */
    write_text(tmp_path("model.safetensors.index.json"), "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "shard file in the same directory"), "%s", err.message);
    rm_tmpdir();
}

Test(model, safetensors_errors) {
    make_tmpdir();
    loom_error err;
    st_entry e[64];
    char names[64][96];
    int n = hf_entries(e, "F32", true, false, names);
    write_config("LlamaForCausalLM", false);

    /* no weights */
    cr_assert_eq(load_err(g_dir, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "model.safetensors"), "%s", err.message);

    const char *p = tmp_path("model.safetensors");
    /* header length beyond the file */
    FILE *f = fopen(p, "wb");
    uint64_t big = 1ull << 40;
    fwrite(&big, 8, 1, f);
    fclose(f);
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "header length"), "%s", err.message);
    /* shorter than 8 bytes */
    write_text(p, "abc");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "truncated"), "%s", err.message);
    /* invalid JSON */
    write_safetensors(p, e, 0, "{\"a\": [1, 2");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "not a valid JSON"), "%s", err.message);
    /* offsets past the end */
    write_safetensors(p, e, 0,
                      "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[0,128]}}");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "model.norm.weight") && strstr(err.message, "past the end"), "%s", err.message);
    /* size inconsistent with shape */
    write_safetensors(p, e, 0, "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[0,0]}}");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "model.norm.weight") && strstr(err.message, "needs 32 elements"), "%s",
              err.message);
    /* unsupported dtype on a used tensor */
    write_safetensors(p, e, 0, "{\"model.norm.weight\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,0]}}");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "model.norm.weight has dtype I64"), "%s", err.message);
    /* wrong shape for the config */
    e[3].shape[0] = 31; /* blk.0.attn_norm */
    write_safetensors(p, e, n, NULL);
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "blk.0.attn_norm.weight: shape (31) expected (32) from config.json hidden_size=32"),
              "%s", err.message);
    e[3].shape[0] = TH;
    /* unsupported architecture */
    write_safetensors(p, e, n, NULL);
    write_config("GPT2LMHeadModel", false);
    cr_assert_eq(load_err(g_dir, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "GPT2LMHeadModel"), "%s", err.message);
    /* broken config.json */
    write_text(tmp_path("config.json"), "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32,");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "config.json") && strstr(err.message, "invalid JSON"), "%s", err.message);
    write_text(tmp_path("config.json"), "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 32}");
    load_err(g_dir, &err);
    cr_assert(strstr(err.message, "\"vocab_size\" is missing"), "%s", err.message);
    /* a directory without config.json */
    unlink(tmp_path("config.json"));
    cr_assert_eq(load_err(g_dir, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "config.json"), "%s", err.message);
    rm_tmpdir();
}

/* ------------------------------------------------------------ dummy */

static loom_model *dummy(const char *shape, loom_dtype dt, uint64_t seed, int layers) {
    loom_model_load_opts o = {.format = "dummy", .dummy_shape = shape, .dummy_dtype = dt, .seed = seed,
                              .num_layers_override = layers};
    loom_model *m = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_OK, "%s", err.message);
    return m;
}

static bool same_weights(const loom_model *a, const loom_model *b) {
    const loom_model_view *va = loom_model_view_get(a), *vb = loom_model_view_get(b);
    cr_assert_eq(va->count(va->ctx), vb->count(vb->ctx));
    for (int32_t i = 0; i < va->count(va->ctx); i++) {
        const loom_tensor *x = va->at(va->ctx, i), *y = vb->at(vb->ctx, i);
        cr_assert_str_eq(x->name, y->name);
        cr_assert_eq(x->nbytes, y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes) != 0) return false;
    }
    return true;
}

Test(model, dummy_deterministic) {
    loom_model *a = dummy("tiny", LOOM_DTYPE_F32, 42, 0), *b = dummy("tiny", LOOM_DTYPE_F32, 42, 0),
               *c = dummy("tiny", LOOM_DTYPE_F32, 43, 0);
    cr_assert(same_weights(a, b), "same seed, same bytes");
    cr_assert(!same_weights(a, c), "different seed, different bytes");
    const loom_model_config *cfg = loom_model_config_get(a);
    cr_assert(cfg->num_layers == 2 && cfg->hidden_size == 64 && cfg->num_heads == 4 && cfg->num_kv_heads == 2 &&
              cfg->intermediate_size == 128 && cfg->vocab_size == 256 && cfg->head_dim == 16);
    cr_assert_str_eq(loom_model_format_name(a), "dummy");
    cr_assert_null(loom_model_dir(a));
    /* value ranges: matrices within 1/sqrt(fan_in), norms near 1; not constant */
    const loom_tensor *w = loom_model_tensor(a, "blk.1.ffn_down.weight");
    const float *f = w->data;
    float lim = 1.0f / sqrtf(128.0f), mn = 1, mx = -1;
    double mean = 0;
    for (int64_t i = 0; i < loom_tensor_numel(w); i++) {
        cr_assert(fabsf(f[i]) <= lim);
        mn = fminf(mn, f[i]);
        mx = fmaxf(mx, f[i]);
        mean += f[i];
    }
    mean /= (double)loom_tensor_numel(w);
    cr_assert(mx - mn > lim && fabs(mean) < 0.01, "spread %g..%g mean %g", mn, mx, mean);
    f = loom_model_tensor(a, "output_norm.weight")->data;
    for (int i = 0; i < 64; i++) cr_assert(f[i] > 0.94f && f[i] < 1.06f);
    /* each tensor distinct from the others (streams differ per tensor) */
    cr_assert_neq(memcmp(loom_model_tensor(a, "blk.0.ffn_up.weight")->data,
                         loom_model_tensor(a, "blk.0.ffn_gate.weight")->data, 64 * 4), 0);
    loom_model_free(a);
    loom_model_free(b);
    loom_model_free(c);
}

static double g_last_fraction = -1;
static int g_calls;
static void on_progress(void *user, const char *what, double fraction) {
    (void)what;
    *(int *)user += 1;
    g_last_fraction = fraction;
    g_calls++;
}

Test(model, dummy_dtypes_shapes_progress) {
    loom_model *f32 = dummy("tiny", LOOM_DTYPE_F32, 5, 0);
    loom_model *bf = dummy("tiny", LOOM_DTYPE_BF16, 5, 0);
    loom_model *h = dummy("tiny", LOOM_DTYPE_F16, 5, 0);
    const loom_tensor *a = loom_model_tensor(f32, "blk.0.attn_q.weight"), *b = loom_model_tensor(bf, "blk.0.attn_q.weight"),
                      *c = loom_model_tensor(h, "blk.0.attn_q.weight");
    cr_assert(b->dtype == LOOM_DTYPE_BF16 && c->dtype == LOOM_DTYPE_F16 && b->nbytes * 2 == a->nbytes);
    for (int i = 0; i < 64; i++) {
        float x = ((const float *)a->data)[i];
        cr_assert_eq(((const uint16_t *)b->data)[i], loom_fp32_to_bf16(x), "bf16 = rounded f32 values");
        cr_assert_eq(((const uint16_t *)c->data)[i], loom_fp32_to_fp16(x));
    }
    loom_model_free(f32);
    loom_model_free(bf);
    loom_model_free(h);

    int calls = 0;
    loom_model_load_opts o = {.format = "auto", .dummy_shape = "qwen2-0.5b", .dummy_dtype = LOOM_DTYPE_BF16,
                              .num_layers_override = 1, .progress = on_progress, .user = &calls};
    loom_model *m = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_OK, "%s", err.message);
    cr_assert(calls >= 2 && g_last_fraction == 1.0);
    const loom_model_config *cfg = loom_model_config_get(m);
    cr_assert(cfg->arch == LOOM_ARCH_QWEN2 && cfg->qkv_bias && cfg->tie_embeddings && cfg->num_layers == 1);
    cr_assert_not_null(loom_model_tensor(m, "blk.0.attn_k.bias"));
    cr_assert_null(loom_model_tensor(m, "output.weight"));
    const loom_tensor *x = loom_model_tensor(m, "token_embd.weight");
    cr_assert(x->shape[0] == 151936 && x->shape[1] == 896);
    x = loom_model_tensor(m, "blk.0.attn_k.weight");
    cr_assert(x->shape[0] == 128 && x->shape[1] == 896);
    loom_model_free(m);

    m = dummy("smollm2-135m", LOOM_DTYPE_BF16, 1, 2);
    cfg = loom_model_config_get(m);
    cr_assert(cfg->hidden_size == 576 && cfg->num_heads == 9 && cfg->num_kv_heads == 3 && cfg->head_dim == 64);
    cr_assert(cfg->tie_embeddings && cfg->rope_theta == 100000.0f);
    loom_model_free(m);

    o = (loom_model_load_opts){.format = "dummy", .dummy_shape = "gpt-5"};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "unknown dummy shape 'gpt-5'") && strstr(err.message, "llama3-8b"), "%s",
              err.message);
    o = (loom_model_load_opts){.format = "dummy", .dummy_shape = "tiny", .dummy_dtype = LOOM_DTYPE_Q4_0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_UNSUPPORTED);
    for (const char *const *s = loom_model_dummy_shapes(); *s; s++) cr_assert_gt(strlen(*s), 0);
}

/* Gemma 3 270M's and Qwen3-0.6B's dummy shapes carry their models' config
 * (window pattern, scales, QK-norm, post-norms) and norm tensors, as their
 * GGUF loaders would fill them. */
Test(model, dummy_gemma3_qwen3) {
    loom_model *m = dummy("gemma3-270m", LOOM_DTYPE_BF16, 3, 2);
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert(c->arch == LOOM_ARCH_GEMMA3 && c->hidden_size == 640 && c->num_heads == 4 && c->num_kv_heads == 1 &&
              c->head_dim == 256 && c->vocab_size == 262144 && c->tie_embeddings);
    cr_assert(c->sliding_window == 512 && c->global_every == 6 && c->rope_theta_local == 10000.0f &&
              c->rope_theta == 1000000.0f);
    cr_assert(c->qk_norm && c->post_norms && c->ffn_act == LOOM_FFN_GELU_TANH);
    cr_assert_float_eq(c->attn_scale, 0.0625f, 1e-9f);
    cr_assert_float_eq(c->embed_scale, sqrtf(640.0f), 1e-6f);
    const char *norms[4] = {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"};
    const int64_t width[4] = {256, 256, 640, 640};
    char nm[64];
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 4; i++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, norms[i]);
            const loom_tensor *t = loom_model_tensor(m, nm);
            cr_assert(t && t->ndim == 1 && t->shape[0] == width[i], "%s", nm);
        }
    loom_model_free(m);

    m = dummy("qwen3-0.6b", LOOM_DTYPE_BF16, 3, 1);
    c = loom_model_config_get(m);
    cr_assert(c->arch == LOOM_ARCH_QWEN3 && c->qk_norm && !c->post_norms && c->ffn_act == LOOM_FFN_SILU &&
              c->sliding_window == 0 && c->head_dim == 128 && c->num_heads * c->head_dim != c->hidden_size);
    cr_assert_not_null(loom_model_tensor(m, "blk.0.attn_q_norm.weight"));
    cr_assert_null(loom_model_tensor(m, "blk.0.post_ffw_norm.weight"));
    loom_model_free(m);
}

Test(model, dispatch_errors) {
    loom_model *m = NULL;
    loom_error err = {0};
    loom_model_load_opts o = {0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "no model given"), "%s", err.message);
    o.path = "/nonexistent/model.gguf";
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "/nonexistent/model.gguf"), "%s", err.message);
    o.format = "onnx";
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "onnx"), "%s", err.message);
    make_tmpdir();
    write_text(tmp_path("notes.txt"), "hello");
    o = (loom_model_load_opts){.path = tmp_path("notes.txt")};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "cannot tell the model format"), "%s", err.message);
    o.format = "gguf";
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "not a GGUF file"), "%s", err.message);
    tiny t;
    build_tiny(&t, 0);
    o = (loom_model_load_opts){.path = write_tiny(&t, "t.gguf"), .num_layers_override = 1};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "dummy"), "%s", err.message);
    free_tiny(&t);
    cr_assert_null(m);
    rm_tmpdir();
}

/* ------------------------------------------------------------ real model */

/* llama.cpp's RoPE for arch llama rotates adjacent pairs (2j, 2j+1); NeoX
 * (Hugging Face) rotates (j, j + hd/2). Both use angle pos * theta^(-2j/hd). */
static void rope(float *x, int hd, int pos, double theta, bool neox) {
    for (int j = 0; j < hd / 2; j++) {
        double ang = pos * pow(theta, -2.0 * j / hd);
        int a = neox ? j : 2 * j, b = neox ? j + hd / 2 : 2 * j + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = (float)(x0 * cos(ang) - x1 * sin(ang));
        x[b] = (float)(x0 * sin(ang) + x1 * cos(ang));
    }
}

static void matvec(const loom_tensor *w, const void *data, const float *x, float *y) {
    int64_t rows = w->shape[0], cols = w->shape[1];
    size_t rb = loom_dtype_row_bytes(w->dtype, cols);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        loom_dequant_row(w->dtype, (const uint8_t *)data + r * rb, row, cols);
        double acc = 0;
        for (int64_t c = 0; c < cols; c++) acc += (double)row[c] * x[c];
        y[r] = (float)acc;
    }
    free(row);
}

Test(model, real_model_smollm2, .timeout = 60) {
    const char *path = getenv("LOOM_TEST_MODEL");
    if (!path || !*path) cr_skip_test("LOOM_TEST_MODEL not set (scripts/fetch-model.sh prints the path)");
    loom_model *m = load_ok(path, "auto");
    const loom_model_config *c = loom_model_config_get(m);
    cr_assert_eq(c->arch, LOOM_ARCH_LLAMA);
    cr_assert_eq(c->num_layers, 30);
    cr_assert_eq(c->hidden_size, 576);
    cr_assert_eq(c->intermediate_size, 1536);
    cr_assert_eq(c->num_heads, 9);
    cr_assert_eq(c->num_kv_heads, 3);
    cr_assert_eq(c->head_dim, 64);
    cr_assert_eq(c->vocab_size, 49152);
    cr_assert_eq(c->rope_theta, 100000.0f);
    cr_assert_eq(c->max_context, 8192);
    cr_assert(c->tie_embeddings && !c->qkv_bias && c->bos_token_id == 1 && c->eos_token_id == 2);
    cr_assert(fabsf(c->rms_norm_eps - 1e-5f) < 1e-9f);
    const loom_gguf *g = loom_model_gguf(m);
    cr_assert_not_null(g);

    /* bytewise: HF row h*hd + i*hd/2 + j == GGUF row h*hd + 2j + i */
    for (int l = 0; l < 30; l += 29) {
        for (int w = 0; w < 2; w++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.attn_%c.weight", l, w ? 'k' : 'q');
            const loom_tensor *t = loom_model_tensor(m, n);
            const loom_gguf_tensor_info *ti = loom_gguf_find_tensor(g, n);
            cr_assert(t && ti && t->dtype == LOOM_DTYPE_Q4_1 && t->data != ti->data);
            size_t rb = loom_dtype_row_bytes(t->dtype, t->shape[1]);
            int nh = w ? 3 : 9, hd = 64;
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < hd / 2; j++)
                        cr_assert_eq(memcmp((const uint8_t *)t->data + (size_t)(h * hd + i * hd / 2 + j) * rb,
                                            (const uint8_t *)ti->data + (size_t)(h * hd + 2 * j + i) * rb, rb),
                                     0);
        }
    }
    /* numerically: attention scores with llama.cpp layout + interleaved RoPE equal
     * those with loom's layout + NeoX RoPE, for every head of layer 3 */
    const loom_tensor *tq = loom_model_tensor(m, "blk.3.attn_q.weight"), *tk = loom_model_tensor(m, "blk.3.attn_k.weight");
    const void *gq = loom_gguf_find_tensor(g, "blk.3.attn_q.weight")->data;
    const void *gk = loom_gguf_find_tensor(g, "blk.3.attn_k.weight")->data;
    float x[576], y[576], qg[576], qh[576], kg[192], kh[192];
    uint64_t s = 3;
    for (int i = 0; i < 576; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) / 1000.0f;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (float)((int64_t)(s >> 33) % 2001 - 1000) / 1000.0f;
    }
    matvec(tq, gq, x, qg);
    matvec(tq, tq->data, x, qh);
    matvec(tk, gk, y, kg);
    matvec(tk, tk->data, y, kh);
    int pq = 37, pk = 5;
    for (int h = 0; h < 9; h++) {
        rope(qg + h * 64, 64, pq, c->rope_theta, false);
        rope(qh + h * 64, 64, pq, c->rope_theta, true);
    }
    for (int h = 0; h < 3; h++) {
        rope(kg + h * 64, 64, pk, c->rope_theta, false);
        rope(kh + h * 64, 64, pk, c->rope_theta, true);
    }
    double total = 0;
    for (int h = 0; h < 9; h++) {
        int kvh = h / 3;
        double sg = 0, sh = 0, wrong = 0;
        for (int d = 0; d < 64; d++) {
            sg += (double)qg[h * 64 + d] * kg[kvh * 64 + d];
            sh += (double)qh[h * 64 + d] * kh[kvh * 64 + d];
            wrong += (double)qg[h * 64 + d] * kh[kvh * 64 + d]; /* mixed layouts: should differ */
        }
        cr_assert(fabs(sg - sh) <= 1e-4 * (fabs(sg) + 1), "head %d: llama.cpp %g vs loom %g", h, sg, sh);
        total += fabs(sg - wrong);
    }
    cr_assert_gt(total, 1e-2, "sanity: the check can fail");
    loom_model_free(m);
}

/* ------------------------------------------------------------ in memory */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    char *b = malloc(*n + 1);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    b[*n] = 0;
    return b;
}

/* Issue 29 (parsers take bytes): a GGUF image in memory loads with every
 * check of the file path — config, tensors, shapes — and the same result;
 * a damaged one fails the same way, naming the given name. */
Test(model, gguf_from_memory_matches_file) {
    make_tmpdir();
    tiny t;
    build_tiny(&t, 0);
    const char *p = write_tiny(&t, "mem.gguf");
    size_t n;
    char *img = slurp(p, &n);
    loom_model *a = load_ok(p, "gguf");
    loom_model_load_opts o = {.path = "mem.gguf", .format = "gguf", .data = img, .size = n};
    loom_model *b = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_model_load(&o, &b, &err), LOOM_OK, "%s", err.message);
    const loom_model_view *va = loom_model_view_get(a), *vb = loom_model_view_get(b);
    cr_assert_eq(va->count(va->ctx), vb->count(vb->ctx));
    for (int32_t i = 0; i < va->count(va->ctx); i++) {
        const loom_tensor *x = va->at(va->ctx, i), *y = vb->get(vb->ctx, x->name);
        cr_assert(y && y->nbytes == x->nbytes && memcmp(x->data, y->data, x->nbytes) == 0, "%s", x->name);
    }
    cr_assert_eq(loom_model_config_get(b)->num_layers, loom_model_config_get(a)->num_layers);
    cr_assert_null(loom_model_dir(b), "a model in memory has no directory");
    loom_model_free(a);
    loom_model_free(b);

    /* the tensor checks run: cut the image inside the data section */
    o.size = n - 8;
    cr_assert_neq(loom_model_load(&o, &b, &err), LOOM_OK);
    cr_assert_null(b);
    cr_assert(strstr(err.message, "mem.gguf"), "%s", err.message);
    /* "auto" cannot sniff a buffer */
    o.size = n, o.format = "auto";
    cr_assert_eq(loom_model_load(&o, &b, &err), LOOM_ERR_INVALID);
    free(img);
    free_tiny(&t);
    rm_tmpdir();
}

/* A safetensors file and config.json's text in memory: the checks of a
 * directory load (config, header, shapes against the config). */
Test(model, safetensors_from_memory) {
    make_tmpdir();
    st_entry e[64];
    char names[64][96];
    int ne = hf_entries(e, "BF16", true, false, names);
    write_safetensors(tmp_path("model.safetensors"), e, ne, NULL);
    write_config("LlamaForCausalLM", false);
    size_t n, cn;
    char *img = slurp(tmp_path("model.safetensors"), &n), *cfg = slurp(tmp_path("config.json"), &cn);
    loom_model_load_opts o = {.format = "safetensors", .data = img, .size = n, .config_json = cfg,
                              .config_json_len = cn};
    loom_model *m = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(loom_model_config_get(m)->hidden_size, 32);
    const loom_tensor *x = loom_model_tensor(m, "output.weight");
    cr_assert(x && ((const uint16_t *)x->data)[0] == loom_fp32_to_bf16(3000.0f), "lm_head data");
    cr_assert_null(loom_model_dir(m));
    loom_model_free(m);

    /* config.json that does not fit the weights: the shape check runs */
    char *bad = strdup(cfg);
    char *h = strstr(bad, "\"hidden_size\":32");
    cr_assert_not_null(h, "%s", bad);
    h[15] = '6'; /* 32 -> 36 */
    o.config_json = bad;
    cr_assert_neq(loom_model_load(&o, &m, &err), LOOM_OK);
    cr_assert_null(m);
    /* no config: refused by name */
    o.config_json = NULL, o.config_json_len = 0;
    cr_assert_eq(loom_model_load(&o, &m, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "config.json"), "%s", err.message);
    free(bad);
    free(img);
    free(cfg);
    rm_tmpdir();
}
