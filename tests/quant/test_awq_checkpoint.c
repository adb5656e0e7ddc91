/*
 * tests/quant/test_awq_checkpoint.c — AutoAWQ / AutoGPTQ checkpoint
 * directories through the safetensors loader, the int4 quantizer and the
 * cpu backend (suite 'quant'; no network, no tokenizer).
 *
 * Each test writes a tiny Llama (hidden 32, 4 heads of 8, 2 KV heads, FFN
 * 64, vocabulary 40, 2 layers) whose linear weights are random floats
 * quantized here by a reference quantizer (asymmetric, 4 bits, groups of
 * 16 inputs, f16 scales: AutoAWQ's zero-point formula) and packed by
 * reference packers written from the formats' descriptions, independent of
 * plugins/quantizer/int4/awq_gptq.c:
 *   AWQ   qweight (in, out/8): word [r, i] nibble j = output 8i + [0,2,4,6,1,3,5,7][j]
 *         qzeros (in/g, out/8) interleaved the same way; scales (in/g, out) f16
 *   GPTQ  qweight (in/8, out): word [i, c] nibble j = input 8i + j
 *         qzeros (in/g, out/8): nibble j = output 8i + j, storing zero - 1 (v1)
 *         or the zero (gptq_v2); scales (in/g, out) f16; g_idx (in) I32
 * plus config.json with transformers' quantization_config. The same model
 * with the dequantized float32 weights is written next to it.
 *
 * What is checked: names, shapes and types the loader exposes; every
 * unpacked int4 weight dequantizes to the reference values exactly; teacher-
 * forced log-probs of the packed model on the cpu backend (quantizer int4,
 * source awq / gptq / gptq_v2) match the float model's; every bad
 * checkpoint and every mismatched pipeline is refused with its reason.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rng.h"
#include "fake_host.h"
#include "loom/backend.h"
#include "loom/engine.h"
#include "formats/half.h"
#include "model/model.h"
#include "qt_util.h"

#define CH 32  /* hidden            */
#define CNH 4  /* heads             */
#define CNKV 2 /* KV heads          */
#define CHD 8  /* head dim          */
#define CFF 64 /* FFN width         */
#define CV 40  /* vocabulary        */
#define CL 2   /* layers            */
#define CG 16  /* group size        */

/* ------------------------------------------------------------ files */

static char g_root[256];

static void make_root(void) {
    snprintf(g_root, sizeof g_root, "/tmp/loom-awqckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(g_root));
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* After each test: the directory make_root made, and all in it. */
static void rm_root(void) {
    if (g_root[0]) nftw(g_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    g_root[0] = 0;
}

TestSuite(awq_checkpoint, .fini = rm_root);

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "%s", p);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_str(const char *dir, const char *name, const char *s) { write_file(dir, name, s, strlen(s)); }

/* One tensor of a safetensors file: data copied in. */
typedef struct st_t {
    char name[96];
    const char *dtype; /* "F32" | "F16" | "I32" */
    int nd;
    int64_t shape[2];
    void *data;
    size_t bytes;
} st_t;

typedef struct st_list {
    st_t t[160];
    int n;
} st_list;

static void st_add(st_list *l, const char *name, const char *dtype, int nd, int64_t d0, int64_t d1,
                   const void *data, size_t bytes) {
    cr_assert_lt(l->n, 160);
    cr_assert_lt(strlen(name), sizeof l->t[0].name, "tensor name %s too long for the test's table", name);
    st_t *t = &l->t[l->n++];
    memcpy(t->name, name, strlen(name) + 1);
    t->dtype = dtype, t->nd = nd, t->shape[0] = d0, t->shape[1] = d1;
    t->data = malloc(bytes ? bytes : 1);
    memcpy(t->data, data, bytes);
    t->bytes = bytes;
}

static st_t *st_find(st_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    return NULL;
}

static void st_remove(st_list *l, const char *name) {
    st_t *t = st_find(l, name);
    cr_assert_not_null(t, "%s", name);
    free(t->data);
    *t = l->t[--l->n];
}

static void st_free(st_list *l) {
    for (int i = 0; i < l->n; i++) free(l->t[i].data);
    l->n = 0;
}

/* u64 LE header length | JSON header | data, in list order. */
static void st_write(const char *dir, const st_list *l) {
    size_t cap = 65536, k = 0, off = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < l->n; i++) {
        const st_t *t = &l->t[i];
        char shp[64];
        if (t->nd == 1) snprintf(shp, sizeof shp, "[%lld]", (long long)t->shape[0]);
        else snprintf(shp, sizeof shp, "[%lld,%lld]", (long long)t->shape[0], (long long)t->shape[1]);
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              t->name, t->dtype, shp, off, off + t->bytes);
        off += t->bytes;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';
    cr_assert_lt(k, cap);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    uint64_t hl = k;
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, k, f);
    for (int i = 0; i < l->n; i++) fwrite(l->t[i].data, 1, l->t[i].bytes, f);
    fclose(f);
    free(h);
}

/* ------------------------------------------------------------ the model */

typedef enum pack_kind { PK_AWQ, PK_GPTQ, PK_GPTQ_V2 } pack_kind;

/* One quantized linear: codes, zeros, f16 scales and the exact float
 * weights they stand for. */
typedef struct ref_lin {
    char hf[96];     /* e.g. model.layers.0.self_attn.q_proj */
    char canon[64];  /* e.g. blk.0.attn_q                     */
    int64_t n, k;
    uint8_t *q;      /* (n, k) codes 0..15                   */
    uint8_t *z;      /* (k/g, n) zeros 0..15                 */
    uint16_t *s;     /* (k/g, n) f16 scales                  */
    float *w;        /* (n, k) (q - z) * s, exactly          */
} ref_lin;

typedef struct ref_model {
    ref_lin lin[CL * 7];
    float *embed, *head, *norm, *lnorm[CL][2];
} ref_model;

/* Reference RTN of float weights f (n, k) in groups of g along k: AutoAWQ's
 * zero-point formula with the scale rounded to f16 first. */
static void ref_quantize(ref_lin *L, const float *f, int64_t g) {
    const int64_t n = L->n, k = L->k, G = k / g;
    for (int64_t c = 0; c < n; c++)
        for (int64_t gi = 0; gi < G; gi++) {
            const float *x = f + c * k + gi * g;
            float lo = x[0], hi = x[0];
            for (int64_t j = 1; j < g; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
            float s = loom_fp16_to_fp32(loom_fp32_to_fp16(fmaxf(hi - lo, 1e-5f) / 15.0f));
            int z = (int)fminf(fmaxf(-rintf(lo / s), 0.0f), 15.0f);
            L->s[gi * n + c] = loom_fp32_to_fp16(s);
            L->z[gi * n + c] = (uint8_t)z;
            for (int64_t j = 0; j < g; j++) {
                int q = (int)fminf(fmaxf(rintf(x[j] / s) + (float)z, 0.0f), 15.0f);
                L->q[c * k + gi * g + j] = (uint8_t)q;
                L->w[c * k + gi * g + j] = (float)(q - z) * s;
            }
        }
}

static void ref_make(ref_model *M, test_rng *r) {
    static const struct {
        const char *hf, *gg;
        int64_t n, k;
    } lin[7] = {
        {"self_attn.q_proj", "attn_q", CNH * CHD, CH},    {"self_attn.k_proj", "attn_k", CNKV * CHD, CH},
        {"self_attn.v_proj", "attn_v", CNKV * CHD, CH},   {"self_attn.o_proj", "attn_output", CH, CNH * CHD},
        {"mlp.gate_proj", "ffn_gate", CFF, CH},           {"mlp.up_proj", "ffn_up", CFF, CH},
        {"mlp.down_proj", "ffn_down", CH, CFF},
    };
    memset(M, 0, sizeof *M);
    M->embed = malloc(sizeof(float) * CV * CH);
    M->norm = malloc(sizeof(float) * CH);
    M->head = malloc(sizeof(float) * CV * CH);
    rng_fill(r, M->embed, CV * CH, 1.0);
    rng_fill(r, M->head, CV * CH, 0.2); /* logits of a few units: log-probs far from saturated */
    for (int i = 0; i < CH; i++) M->norm[i] = (float)rng_range(r, 0.8, 1.2);
    for (int l = 0; l < CL; l++) {
        for (int j = 0; j < 2; j++) {
            M->lnorm[l][j] = malloc(sizeof(float) * CH);
            for (int i = 0; i < CH; i++) M->lnorm[l][j][i] = (float)rng_range(r, 0.8, 1.2);
        }
        for (int j = 0; j < 7; j++) {
            ref_lin *L = &M->lin[l * 7 + j];
            snprintf(L->hf, sizeof L->hf, "model.layers.%d.%s", l, lin[j].hf);
            snprintf(L->canon, sizeof L->canon, "blk.%d.%s", l, lin[j].gg);
            L->n = lin[j].n, L->k = lin[j].k;
            int64_t G = L->k / CG;
            L->q = malloc((size_t)(L->n * L->k));
            L->w = malloc(sizeof(float) * (size_t)(L->n * L->k));
            L->z = malloc((size_t)(G * L->n));
            L->s = malloc(2 * (size_t)(G * L->n));
            float *f = malloc(sizeof(float) * (size_t)(L->n * L->k));
            rng_fill(r, f, L->n * L->k, 0.3);
            ref_quantize(L, f, CG);
            free(f);
        }
    }
}

static void ref_free(ref_model *M) {
    free(M->embed), free(M->head), free(M->norm);
    for (int l = 0; l < CL; l++) free(M->lnorm[l][0]), free(M->lnorm[l][1]);
    for (int i = 0; i < CL * 7; i++) free(M->lin[i].q), free(M->lin[i].w), free(M->lin[i].z), free(M->lin[i].s);
}

/* Embeddings, norms (and lm_head: a float one, never packed). */
static void add_plain(st_list *l, const ref_model *M) {
    st_add(l, "model.embed_tokens.weight", "F32", 2, CV, CH, M->embed, sizeof(float) * CV * CH);
    st_add(l, "lm_head.weight", "F32", 2, CV, CH, M->head, sizeof(float) * CV * CH);
    st_add(l, "model.norm.weight", "F32", 1, CH, 0, M->norm, sizeof(float) * CH);
    char nm[128];
    for (int i = 0; i < CL; i++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", i);
        st_add(l, nm, "F32", 1, CH, 0, M->lnorm[i][0], sizeof(float) * CH);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", i);
        st_add(l, nm, "F32", 1, CH, 0, M->lnorm[i][1], sizeof(float) * CH);
    }
}

/* The float checkpoint: the dequantized weights as F32. */
static void add_float_linears(st_list *l, const ref_model *M) {
    char nm[128];
    for (int i = 0; i < CL * 7; i++) {
        const ref_lin *L = &M->lin[i];
        snprintf(nm, sizeof nm, "%s.weight", L->hf);
        st_add(l, nm, "F32", 2, L->n, L->k, L->w, sizeof(float) * (size_t)(L->n * L->k));
    }
}

/* Pack one linear; `gidx` (k) may be NULL (then r / g); it also selects
 * which group's zero and scale each input uses (act-order). */
static void add_packed_linear(st_list *l, const ref_lin *L, pack_kind pk, const int32_t *gidx) {
    static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const int64_t n = L->n, k = L->k, G = k / CG;
    char nm[128];
    uint32_t *qw = calloc((size_t)(n * k / 8), 4), *qz = calloc((size_t)(G * n / 8), 4);
    if (pk == PK_AWQ) {
        for (int64_t r = 0; r < k; r++)
            for (int64_t i = 0; i < n / 8; i++)
                for (int j = 0; j < 8; j++)
                    qw[r * (n / 8) + i] |= (uint32_t)L->q[(8 * i + awq_order[j]) * k + r] << (4 * j);
        snprintf(nm, sizeof nm, "%s.qweight", L->hf);
        st_add(l, nm, "I32", 2, k, n / 8, qw, (size_t)(n * k / 2));
    } else {
        for (int64_t i = 0; i < k / 8; i++)
            for (int64_t c = 0; c < n; c++)
                for (int j = 0; j < 8; j++) qw[i * n + c] |= (uint32_t)L->q[c * k + 8 * i + j] << (4 * j);
        snprintf(nm, sizeof nm, "%s.qweight", L->hf);
        st_add(l, nm, "I32", 2, k / 8, n, qw, (size_t)(n * k / 2));
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t i = 0; i < n / 8; i++)
            for (int j = 0; j < 8; j++) {
                int64_t c = 8 * i + (pk == PK_AWQ ? awq_order[j] : j);
                uint32_t z = L->z[g * n + c];
                if (pk == PK_GPTQ) z = (z - 1) & 15u;
                qz[g * (n / 8) + i] |= z << (4 * j);
            }
    snprintf(nm, sizeof nm, "%s.qzeros", L->hf);
    st_add(l, nm, "I32", 2, G, n / 8, qz, (size_t)(G * n / 2));
    snprintf(nm, sizeof nm, "%s.scales", L->hf);
    st_add(l, nm, "F16", 2, G, n, L->s, 2 * (size_t)(G * n));
    if (pk != PK_AWQ) {
        int32_t *gi = malloc(4 * (size_t)k);
        for (int64_t r = 0; r < k; r++) gi[r] = gidx ? gidx[r] : (int32_t)(r / CG);
        snprintf(nm, sizeof nm, "%s.g_idx", L->hf);
        st_add(l, nm, "I32", 1, k, 0, gi, 4 * (size_t)k);
        free(gi);
    }
    free(qw), free(qz);
}

static const char *k_cfg_head =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":40,\"hidden_size\":32,"
    "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":256,\"rope_theta\":10000.0,\"rms_norm_eps\":1e-05,\"bos_token_id\":1,"
    "\"eos_token_id\":2,\"tie_word_embeddings\":false,\"torch_dtype\":\"float16\"";

/* transformers' quantization_config as AutoAWQ / AutoGPTQ / GPTQModel write it. */
static const char *qcfg_of(pack_kind pk) {
    switch (pk) {
    case PK_AWQ:
        return "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":16,\"version\":\"gemm\",\"zero_point\":true,"
               "\"modules_to_not_convert\":null}";
    case PK_GPTQ:
        return "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":16,\"desc_act\":false,\"sym\":false,"
               "\"damp_percent\":0.01,\"true_sequential\":true,\"checkpoint_format\":\"gptq\"}";
    default:
        return "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":16,\"desc_act\":false,\"sym\":false,"
               "\"checkpoint_format\":\"gptq_v2\"}";
    }
}

/* config.json with `qcfg` (NULL: a float checkpoint). */
static void write_config(const char *dir, const char *qcfg) {
    char buf[4096];
    if (qcfg) snprintf(buf, sizeof buf, "%s,\"quantization_config\":%s}", k_cfg_head, qcfg);
    else snprintf(buf, sizeof buf, "%s}", k_cfg_head);
    write_str(dir, "config.json", buf);
}

/* A fresh subdirectory of g_root. */
static const char *subdir(const char *name) {
    static char p[8][512];
    static int k;
    char *d = p[k++ % 8];
    snprintf(d, 512, "%s/%s", g_root, name);
    cr_assert_eq(mkdir(d, 0755), 0, "%s", d);
    return d;
}

/* The packed checkpoint of M into a list (callers may break it). */
static void packed_list(st_list *l, const ref_model *M, pack_kind pk) {
    l->n = 0;
    add_plain(l, M);
    for (int i = 0; i < CL * 7; i++) add_packed_linear(l, &M->lin[i], pk, NULL);
}

static const char *write_packed(const char *name, const ref_model *M, pack_kind pk) {
    const char *d = subdir(name);
    st_list *l = calloc(1, sizeof *l);
    packed_list(l, M, pk);
    st_write(d, l);
    write_config(d, qcfg_of(pk));
    st_free(l);
    free(l);
    return d;
}

static const char *write_float(const char *name, const ref_model *M) {
    const char *d = subdir(name);
    st_list *l = calloc(1, sizeof *l);
    add_plain(l, M);
    add_float_linears(l, M);
    st_write(d, l);
    write_config(d, NULL);
    st_free(l);
    free(l);
    return d;
}

static loom_model *load_ok(const char *dir) {
    loom_model_load_opts o = {.path = dir, .format = "auto"};
    loom_model *m = NULL;
    loom_error err = {0};
    loom_status st = loom_model_load(&o, &m, &err);
    cr_assert_eq(st, LOOM_OK, "%s: %s", dir, err.message);
    return m;
}

/* Load must fail with a message containing every one of `want`. */
static void load_fails(const char *dir, const char *const *want) {
    loom_model_load_opts o = {.path = dir, .format = "safetensors"};
    loom_model *m = NULL;
    loom_error err = {0};
    loom_status st = loom_model_load(&o, &m, &err);
    cr_assert_neq(st, LOOM_OK, "%s loaded but should not", dir);
    cr_assert_null(m);
    for (; *want; want++) cr_assert(strstr(err.message, *want), "%s: want '%s' in: %s", dir, *want, err.message);
}

#define WANT(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ------------------------------------------------------------ loader + unpack */

static const char *src_set(pack_kind pk) {
    return pk == PK_AWQ ? "source=awq" : pk == PK_GPTQ ? "source=gptq" : "source=gptq_v2";
}

/* Load the packed checkpoint, check what the view shows, then unpack every
 * linear with the int4 plugin and compare with the reference bit for bit. */
static void check_unpack(pack_kind pk) {
    test_rng r = rng_seeded(pk == PK_AWQ ? "awqckpt.awq" : pk == PK_GPTQ ? "awqckpt.gptq" : "awqckpt.gptq_v2");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    const char *d = write_packed("packed", &M, pk);
    loom_model *m = load_ok(d);
    const loom_model_packing *p = loom_model_packing_get(m);
    cr_assert_not_null(p);
    cr_assert_str_eq(p->method, pk == PK_AWQ ? "awq" : pk == PK_GPTQ ? "gptq" : "gptq_v2");
    cr_assert_eq(p->bits, 4);
    cr_assert_eq(p->group_size, CG);
    const loom_model_view *v = loom_model_view_get(m);

    const loom_component *comp = qt_component("LOOM_QUANT_INT4_SO");
    const loom_quant_ops *ops = comp->ops;
    void *self = NULL;
    loom_error err = {0};
    cr_assert_eq(qt_create(comp, ((const char *const[]){src_set(pk), "group_size=16", NULL}), &self, &err),
                 LOOM_OK, "%s", err.message);
    for (int i = 0; i < CL * 7; i++) {
        const ref_lin *L = &M.lin[i];
        char nm[96];
        snprintf(nm, sizeof nm, "%s.weight", L->canon);
        const loom_tensor *w = v->get(v->ctx, nm);
        cr_assert_not_null(w, "%s", nm);
        cr_assert(w->ndim == 2 && w->shape[0] == L->n && w->shape[1] == L->k, "%s: (%lld, %lld)", nm,
                  (long long)w->shape[0], (long long)w->shape[1]);
        cr_assert_eq(w->dtype, LOOM_DTYPE_F16, "%s: the scales' type", nm);
        cr_assert(w->data == NULL && w->nbytes == 0, "%s: a shape-only descriptor", nm);
        cr_assert(loom_model_is_packed_weight(m, w));
        snprintf(nm, sizeof nm, "%s.qweight", L->canon);
        const loom_tensor *qw = v->get(v->ctx, nm);
        cr_assert(qw && qw->dtype == LOOM_DTYPE_I32, "%s", nm);
        snprintf(nm, sizeof nm, "%s.g_idx", L->canon);
        cr_assert_eq(v->get(v->ctx, nm) != NULL, pk != PK_AWQ, "%s", nm);

        loom_quant_plan plan = {.struct_size = sizeof plan};
        cr_assert_eq(ops->plan(self, v, w, &plan, &err), LOOM_OK, "%s: %s", L->canon, err.message);
        cr_assert_eq(plan.format, LOOM_QFMT_INT4_W4A16);
        cr_assert_eq(plan.group_size, CG);
        loom_qtensor q = {.struct_size = sizeof q};
        cr_assert_eq(ops->quantize(self, v, w, &plan, &q, &err), LOOM_OK, "%s: %s", L->canon, err.message);
        const uint8_t *data = q.data.data;
        const float *sc = q.scales.data, *zp = q.zeros.data;
        const int64_t G = L->k / CG;
        int64_t bad = 0;
        for (int64_t c = 0; c < L->n; c++)
            for (int64_t k = 0; k < L->k; k++) {
                int code = (data[c * (L->k / 2) + k / 2] >> (4 * (k & 1))) & 15;
                float got = ((float)code - zp[c * G + k / CG]) * sc[c * G + k / CG];
                if (got != L->w[c * L->k + k] && bad++ < 3)
                    cr_log_error("%s[%lld, %lld]: %g, reference %g", L->canon, (long long)c, (long long)k,
                                 (double)got, (double)L->w[c * L->k + k]);
            }
        cr_assert_eq(bad, 0, "%s: %lld weights differ from the reference", L->canon, (long long)bad);
        ops->release(self, &q);
    }
    ops->destroy(self);
    cr_assert_eq(fake_host_live_allocs(), 0);
    /* the float model of the same weights loads with no packing */
    loom_model *f = load_ok(write_float("float", &M));
    cr_assert_null(loom_model_packing_get(f));
    loom_model_free(f);
    loom_model_free(m);
    ref_free(&M);
}

Test(awq_checkpoint, awq_loads_and_unpacks_exactly) { check_unpack(PK_AWQ); }
Test(awq_checkpoint, gptq_loads_and_unpacks_exactly) { check_unpack(PK_GPTQ); }
Test(awq_checkpoint, gptq_v2_loads_and_unpacks_exactly) { check_unpack(PK_GPTQ_V2); }

/* AutoGPTQ's own quantize_config.json (no quant_method) and AutoAWQ's
 * quant_config.json (w_bit, q_group_size, "GEMM"), with no
 * quantization_config in config.json. */
Test(awq_checkpoint, quantizer_own_config_files) {
    test_rng r = rng_seeded("awqckpt.files");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    st_list *l = calloc(1, sizeof *l);
    const char *d = subdir("gptq");
    packed_list(l, &M, PK_GPTQ);
    st_write(d, l);
    st_free(l);
    write_config(d, NULL);
    write_str(d, "quantize_config.json", "{\"bits\":4,\"group_size\":16,\"desc_act\":false,\"sym\":true}");
    loom_model *m = load_ok(d);
    cr_assert_str_eq(loom_model_packing_get(m)->method, "gptq");
    loom_model_free(m);
    d = subdir("awq");
    packed_list(l, &M, PK_AWQ);
    st_write(d, l);
    st_free(l);
    write_config(d, NULL);
    write_str(d, "quant_config.json", "{\"zero_point\":true,\"q_group_size\":16,\"w_bit\":4,\"version\":\"GEMM\"}");
    m = load_ok(d);
    cr_assert_str_eq(loom_model_packing_get(m)->method, "awq");
    cr_assert_eq(loom_model_packing_get(m)->group_size, 16);
    loom_model_free(m);
    free(l);
    ref_free(&M);
}

/* desc_act: a permuted g_idx loads; int4 keeps it as int8 (act_order:
 * int8) or refuses it (act_order: error). */
Test(awq_checkpoint, gptq_act_order) {
    test_rng r = rng_seeded("awqckpt.actorder");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    const char *d = subdir("actorder");
    st_list *l = calloc(1, sizeof *l);
    add_plain(l, &M);
    int32_t gi[CFF];
    for (int i = 0; i < CL * 7; i++) {
        int64_t k = M.lin[i].k;
        for (int64_t j = 0; j < k; j++) gi[j] = (int32_t)(((j * 5) % k) / CG); /* a permutation of r / g */
        add_packed_linear(l, &M.lin[i], PK_GPTQ, gi);
    }
    st_write(d, l);
    st_free(l);
    free(l);
    write_config(d, "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":16,\"desc_act\":true}");
    loom_model *m = load_ok(d);
    cr_assert(loom_model_packing_get(m)->desc_act);
    const loom_model_view *v = loom_model_view_get(m);
    const loom_tensor *w = v->get(v->ctx, "blk.1.ffn_down.weight");
    const loom_component *comp = qt_component("LOOM_QUANT_INT4_SO");
    const loom_quant_ops *ops = comp->ops;
    void *self = NULL;
    loom_error err = {0};
    loom_quant_plan plan = {.struct_size = sizeof plan};
    cr_assert_eq(qt_create(comp, ((const char *const[]){"source=gptq", "group_size=16", NULL}), &self, &err),
                 LOOM_OK);
    cr_assert_eq(ops->plan(self, v, w, &plan, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(plan.format, LOOM_QFMT_INT8_W8A16);
    ops->destroy(self);
    cr_assert_eq(qt_create(comp, ((const char *const[]){"source=gptq", "group_size=16", "act_order=error", NULL}),
                           &self, &err),
                 LOOM_OK);
    cr_assert_neq(ops->plan(self, v, w, &plan, &err), LOOM_OK);
    cr_assert(strstr(err.message, "act-order"), "%s", err.message);
    ops->destroy(self);
    loom_model_free(m);
    ref_free(&M);
}

/* ------------------------------------------------------------ bad checkpoints */

/* A packed checkpoint of kind pk with `mutate` applied to its tensor list
 * and config.json's quantization_config replaced by `qcfg` (NULL: the
 * default for pk; "" none at all). */
static const char *write_broken(const char *name, const ref_model *M, pack_kind pk, void (*mutate)(st_list *),
                                const char *qcfg) {
    const char *d = subdir(name);
    st_list *l = calloc(1, sizeof *l);
    packed_list(l, M, pk);
    if (mutate) mutate(l);
    st_write(d, l);
    st_free(l);
    free(l);
    write_config(d, qcfg ? (*qcfg ? qcfg : NULL) : qcfg_of(pk));
    return d;
}

static void drop_qzeros(st_list *l) { st_remove(l, "model.layers.1.mlp.up_proj.qzeros"); }
static void drop_scales(st_list *l) { st_remove(l, "model.layers.0.self_attn.k_proj.scales"); }
static void drop_qweight(st_list *l) { st_remove(l, "model.layers.0.self_attn.v_proj.qweight"); }

/* scales of q_proj with one group for all 32 inputs instead of 2 */
static void wrong_scales(st_list *l) {
    st_t *t = st_find(l, "model.layers.0.self_attn.q_proj.scales");
    t->shape[0] = 1;
    t->bytes /= 2;
}

/* AWQ-layout qweight (in, out/8) for a GPTQ config: same bytes, other shape */
static void awq_shaped(st_list *l) {
    st_t *t = st_find(l, "model.layers.0.mlp.gate_proj.qweight");
    t->shape[0] = CH, t->shape[1] = CFF / 8;
}

/* a float .weight next to the packed parts of the same layer */
static void float_and_packed(st_list *l) {
    float *f = calloc((size_t)CH * CH, sizeof(float));
    st_add(l, "model.layers.0.self_attn.o_proj.weight", "F32", 2, CH, CH, f, sizeof(float) * CH * CH);
    free(f);
}

static void qweight_f32(st_list *l) { st_find(l, "model.layers.1.self_attn.q_proj.qweight")->dtype = "F32"; }

Test(awq_checkpoint, bad_checkpoints_refused) {
    test_rng r = rng_seeded("awqckpt.bad");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    load_fails(write_broken("method", &M, PK_AWQ, NULL, "{\"quant_method\":\"bitsandbytes\",\"load_in_4bit\":true}"),
               WANT("quant_method \"bitsandbytes\" is not supported"));
    load_fails(write_broken("bits", &M, PK_GPTQ, NULL, "{\"quant_method\":\"gptq\",\"bits\":8,\"group_size\":16}"),
               WANT("8-bit GPTQ is not supported"));
    load_fails(write_broken("gemv", &M, PK_AWQ, NULL,
                            "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":16,\"version\":\"gemv\"}"),
               WANT("AWQ version \"gemv\"", "GEMM"));
    load_fails(write_broken("nozp", &M, PK_AWQ, NULL,
                            "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":16,\"zero_point\":false}"),
               WANT("zero_point false"));
    load_fails(write_broken("marlin", &M, PK_GPTQ, NULL,
                            "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":16,\"checkpoint_format\":\"marlin\"}"),
               WANT("checkpoint_format \"marlin\""));
    load_fails(write_broken("chan", &M, PK_GPTQ, NULL, "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":-1}"),
               WANT("group_size -1"));
    load_fails(write_broken("nobits", &M, PK_AWQ, NULL, "{\"quant_method\":\"awq\",\"group_size\":16}"),
               WANT("needs \"bits\" and \"group_size\""));
    load_fails(write_broken("noqz", &M, PK_AWQ, drop_qzeros, NULL),
               WANT("blk.1.ffn_up", "has no blk.1.ffn_up.qzeros"));
    load_fails(write_broken("nosc", &M, PK_GPTQ, drop_scales, NULL), WANT("has no blk.0.attn_k.scales"));
    load_fails(write_broken("noqw", &M, PK_GPTQ, drop_qweight, NULL),
               WANT("blk.0.attn_v.qzeros has no blk.0.attn_v.qweight"));
    load_fails(write_broken("scshape", &M, PK_AWQ, wrong_scales, NULL),
               WANT("blk.0.attn_q.scales has shape (1, 32), expected (2, 32)", "groups of 32 inputs"));
    load_fails(write_broken("layout", &M, PK_GPTQ, awq_shaped, NULL),
               WANT("blk.0.ffn_gate.qweight has shape (32, 8)", "AWQ layout"));
    load_fails(write_broken("nodiv", &M, PK_AWQ, NULL,
                            "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":24,\"version\":\"gemm\"}"),
               WANT("group_size 24", "does not divide the 32 inputs"));
    load_fails(write_broken("twice", &M, PK_AWQ, float_and_packed, NULL),
               WANT("blk.0.attn_output is stored twice"));
    load_fails(write_broken("f32words", &M, PK_AWQ, qweight_f32, NULL),
               WANT("blk.1.attn_q.qweight is f32", "must be I32"));
    load_fails(write_broken("nocfg", &M, PK_AWQ, NULL, ""), WANT("has no quantization_config"));
    /* a quantization_config over float weights */
    const char *d = write_float("floatq", &M);
    write_config(d, qcfg_of(PK_AWQ));
    load_fails(d, WANT("declares a 4-bit awq checkpoint, but no tensor is packed"));
    ref_free(&M);
}

/* ------------------------------------------------------------ forward */

/* A pipeline for model `dir` on the cpu backend; `quant` is the quantizer
 * section's body ("" for none). Returns the yaml path. */
static const char *write_pipeline(const char *name, const char *dir, const char *quant) {
    static char p[8][512];
    static int k;
    char *path = p[k++ % 8];
    char y[2048];
    snprintf(y, sizeof y,
             "model:\n  path: %s\n  format: safetensors\nengine:\n  threads: 1\n  max_model_len: 64\n"
             "backend:\n  plugin: cpu\n  threads: 1\n  kv_dtype: f32\nscheduler:\n  plugin: continuous\ncache:\n  plugin: paged\n"
             "  memory_gib: 0.01\nsampler:\n  plugin: standard\n%s%s\n",
             dir, *quant ? "quantizer:\n" : "", quant);
    write_str(g_root, name, y);
    snprintf(path, 512, "%s/%s", g_root, name);
    return path;
}

static loom_engine *engine_ok(const char *yaml) {
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = loom_engine_create(yaml, NULL, 0, &e, &err);
    cr_assert_eq(st, LOOM_OK, "%s: %s", yaml, err.message);
    return e;
}

static void engine_fails(const char *yaml, const char *const *want) {
    loom_engine *e = NULL;
    loom_error err = {0};
    cr_assert_neq(loom_engine_create(yaml, NULL, 0, &e, &err), LOOM_OK, "%s: created but should not", yaml);
    cr_assert_null(e);
    for (; *want; want++) cr_assert(strstr(err.message, *want), "%s: want '%s' in: %s", yaml, *want, err.message);
}

#define NTOK 32

static void score(loom_engine *e, float *lp) {
    int32_t toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = (int32_t)((i * 7 + 3) % CV);
    loom_error err = {0};
    cr_assert_eq(loom_engine_score(e, toks, NTOK, lp, &err), LOOM_OK, "%s", err.message);
}

/* The packed checkpoint through int4 on the cpu backend against the float
 * checkpoint of the dequantized weights: the same function, so log-probs
 * agree to float32 rounding (different summation order only). */
static void check_forward(pack_kind pk, bool tp) {
    test_rng r = rng_seeded("awqckpt.forward");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    const char *dp = write_packed("packed", &M, pk), *df = write_float("float", &M);
    char q[256];
    /* tp: the packed model split over 2 tensor-parallel ranks (each keeps
     * its rows / whole groups of input columns of the unpacked weights) */
    snprintf(q, sizeof q, "  plugin: int4\n  %s\n  group_size: 16\n%s",
             pk == PK_AWQ ? "source: awq" : pk == PK_GPTQ ? "source: gptq" : "source: gptq_v2",
             tp ? "executor:\n  plugin: tp\n  size: 2\n  comm: threads\n" : "");
    loom_engine *ef = engine_ok(write_pipeline("float.yaml", df, ""));
    loom_engine *eq = engine_ok(write_pipeline("packed.yaml", dp, q));
    float lf[NTOK], lq[NTOK];
    score(ef, lf);
    score(eq, lq);
    double worst = 0, mean = 0;
    for (int i = 1; i < NTOK; i++) {
        double d = fabs((double)lf[i] - lq[i]);
        worst = fmax(worst, d);
        mean += fabs(lf[i]) / (NTOK - 1);
    }
    cr_log_info("%s%s: max |lp_packed - lp_float| = %.3g (mean |lp| %.3g)",
                pk == PK_AWQ ? "awq" : pk == PK_GPTQ ? "gptq" : "gptq_v2", tp ? " tp 2" : "", worst, mean);
    cr_assert_lt(worst, 5e-5, "max |lp_packed - lp_float| = %g", worst);
    cr_assert_gt(mean, 0.5, "the model is not trivially uniform");
    loom_engine_destroy(eq);
    loom_engine_destroy(ef);
    ref_free(&M);
}

Test(awq_checkpoint, awq_forward_matches_float, .timeout = 120) { check_forward(PK_AWQ, false); }
Test(awq_checkpoint, gptq_forward_matches_float, .timeout = 120) { check_forward(PK_GPTQ, false); }
Test(awq_checkpoint, gptq_v2_forward_matches_float, .timeout = 120) { check_forward(PK_GPTQ_V2, false); }
Test(awq_checkpoint, awq_tp2_forward_matches_float, .timeout = 120) { check_forward(PK_AWQ, true); }

/* Pipelines that cannot run a packed checkpoint: each refused before the
 * backend loads anything, saying what to write. */
Test(awq_checkpoint, mismatched_pipelines_refused, .timeout = 120) {
    test_rng r = rng_seeded("awqckpt.pipes");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    const char *awq = write_packed("awq", &M, PK_AWQ), *gptq = write_packed("gptq", &M, PK_GPTQ);
    const char *fix = "quantizer: {plugin: int4, source: awq, group_size: 16}";
    engine_fails(write_pipeline("none.yaml", awq, ""), WANT("4-bit awq checkpoint", "needs", fix));
    engine_fails(write_pipeline("rtn.yaml", awq, "  plugin: int4\n  group_size: 16\n"),
                 WANT("quantizer.source is quantize", fix));
    engine_fails(write_pipeline("gguf.yaml", awq, "  plugin: int4\n  source: gguf\n"),
                 WANT("quantizer.source is gguf", fix));
    engine_fails(write_pipeline("other.yaml", awq, "  plugin: int4\n  source: gptq\n  group_size: 16\n"),
                 WANT("quantizer.source is gptq", fix));
    engine_fails(write_pipeline("v2.yaml", gptq, "  plugin: int4\n  source: gptq_v2\n  group_size: 16\n"),
                 WANT("quantizer.source is gptq_v2", "zero point minus 1",
                      "quantizer: {plugin: int4, source: gptq, group_size: 16}"));
    engine_fails(write_pipeline("int8.yaml", awq, "  plugin: int8\n"),
                 WANT("quantizer 'int8' quantizes float weights", fix));
    engine_fails(write_pipeline("fp8.yaml", gptq, "  plugin: fp8\n"), WANT("quantizer 'fp8' quantizes float weights"));
    engine_fails(write_pipeline("group.yaml", awq, "  plugin: int4\n  source: awq\n"),
                 WANT("quantizer.group_size is 128", "groups of 16", fix));
    engine_fails(write_pipeline("skip.yaml", awq,
                                "  plugin: int4\n  source: awq\n  group_size: 16\n  skip: \"token_embd,output,blk.1\"\n"),
                 WANT("keeps tensor 'blk.1.", "remove it from skip"));
    ref_free(&M);
}

/* Without the engine's check (a backend driven directly), the cpu backend
 * still refuses to treat a packed weight as float. */
Test(awq_checkpoint, cpu_backend_refuses_unplanned_packed_weight, .timeout = 120) {
    test_rng r = rng_seeded("awqckpt.backend");
    make_root();
    ref_model M;
    ref_make(&M, &r);
    loom_model *m = load_ok(write_packed("awq", &M, PK_AWQ));
    const char *so = getenv("LOOM_CPU_BACKEND_SO");
    cr_assert(so && *so, "LOOM_CPU_BACKEND_SO is not set (run through meson test)");
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert(dl, "dlopen(%s): %s", so, dlerror());
    loom_plugin_entry_fn fn = (loom_plugin_entry_fn)dlsym(dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(fn);
    const loom_component *cpu = &fn()->components[0];
    cr_assert_eq(cpu->kind, LOOM_KIND_BACKEND);
    const loom_backend_ops *ops = cpu->ops;
    void *cfg = qt_config(cpu, ((const char *const[]){"threads=1", NULL}));
    void *self = NULL;
    loom_error err = {0};
    cr_assert_eq(ops->create(fake_host(), cfg, &self, &err), LOOM_OK, "%s", err.message);
    free(cfg);
    cr_assert_neq(ops->load(self, loom_model_view_get(m), NULL, &err), LOOM_OK);
    cr_assert(strstr(err.message, "stored only as packed 4-bit AWQ/GPTQ data"), "%s", err.message);
    cr_assert(strstr(err.message, "no quantizer"), "%s", err.message);
    ops->destroy(self);
    loom_model_free(m);
    ref_free(&M);
}
