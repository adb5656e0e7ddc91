/*
 * tests/gpu/test_gpu_backend.c — the cuda backend against the cpu backend
 * on the same model and the same batches. Runs only on a Hopper GPU (not a
 * meson test(): CI has none).
 *
 *   gpu_backend_test [cuda.so cpu.so [seed]]
 *       (defaults: the paths meson compiled in, or $LOOM_CUDA_BACKEND_SO /
 *        $LOOM_CPU_BACKEND_SO; seed from the clock, printed)
 *
 * Both plugins are dlopen'd and driven through loom_backend_ops on a small
 * host table of our own, over fake model views with random weights: tiny
 * Llama shapes with head_dim 64 and 128 (one Qwen2-style with QKV bias), a
 * GQA-8 head_dim-64 shape, and a Llama-3-8B-like shape cut to 2 layers
 * (smaller vocabulary). Some store their matrices in bf16 (uploaded as is),
 * others in f32 (the loader's dequantize, round and stage path, several
 * 32 MiB chunks for the 8B-like shape); one runs the cuda backend in f16. Three backend instances run every step —
 * cpu (float32), cuda eager (cuda_graphs false) and cuda with graphs — so
 * two cuda instances coexist in the process. Steps, on shuffled (paged)
 * block tables of 16-token blocks: a ragged prefill (lengths 1..100,
 * block boundaries), chunked prefill, a mixed step (decodes + chunks), a
 * fork through copy_blocks, a swap out and in, two steps of 1..8 tokens
 * per sequence (draft verification; graph (q 8, bucket 8) captured, then
 * replayed), and runs of pure decode steps at batch 6, 3 and 1 (graph
 * buckets 8, 4 and 1: captured, then replayed); on the graphs instance the
 * prefill and mixed steps run piecewise (token buckets captured at kv_alloc,
 * up to the 1024 rows of max_batched_tokens). Checks print `PASS|FAIL name err` (err: largest row-wise
 * ||a - b|| / ||b|| over the logits rows); exit status = failures.
 * Then the same sequence with each quantizer plugin (int8 W8A16 / W8A8,
 * fp8 per channel / per tensor, int4 groups of 32 / 64 / 128, one with a
 * quantized LM head) loaded by both backends: cuda's quantized kernels
 * against the cpu backend's, on the same quantized weights; models whose
 * linear weights are random GGUF blocks (all q4_1 like SmolLM2; q4_k / q6_k
 * like a Q4_K_M file, with mixed-type Q/K/V and gate/up and a q6_k LM
 * head; q8_0 / q4_0 with a Qwen2 bias) run as stored on both (int4
 * quantizer, source gguf); and two plans the cuda backend must refuse (a
 * mixed Q/K/V group, GGUF blocks planned for bf16 tensors).
 * Quantizers are dlopen'd from $LOOM_QUANTIZER_DIR/NAME/ or
 * $LOOM_QUANTIZER_DIR/ (default: the build tree's plugins/quantizer).
 * The tiny shape's W8A8 / FP8 / INT4 again with backend.qgemv_tc_min_rows
 * 9 (the CUDA-core GEMV at every batch) and 1 (the tensor-core one from a
 * single row). Last, batch_invariant = true (run_invariant): one sequence's next 5
 * tokens as 5 decode steps vs as one verify step (alone, next to other
 * sequences' decode / verify tokens in a padded graph bucket, next to a
 * prefill chunk), eager and through graphs — the logits must be equal bit
 * for bit ("... = decode x5", "graphs = eager"); with bf16/f16 and with
 * int4 / fp8 / int8-w8a8 weights.
 * Gemma 3 and Qwen3 (run_gemma): Gemma-3-like shapes (QK-norm, post-norms,
 * GeGLU, the embedding and attention scales, head_dim 256 with MQA and 64
 * with GQA 4, windows of 37 and 16 tokens shorter than the prompts, local
 * layers' own RoPE base), in bf16, f16 and with an FP8 KV cache, and with
 * the backends' block-table groups (kv_groups(): both must propose the
 * same; each group its own blocks, a windowed group's blocks before the
 * step's window -1); a Qwen3-like shape (QK-norm, head_dim 128 over a
 * 256-wide residual); batch invariance under windows.
 * LOOM_GPU_BACKEND_TESTS=gemma runs only those; =quant only the quantizer
 * configs on dense shapes and what follows them (GGUF, SmoothQuant, the
 * quantized batch-invariant runs). W8A16 / INT4 run on the default
 * quant_layout tiled (kernels/cuda/qtiled.cu) where the shapes tile, and
 * once more with quant_layout=rows (the GEMVs, qmma.cu, the tensor-core
 * GEMV), int4 also batch-invariant; tiled also with qtiled_epilogues off.
 * FP8 KV cache: shapes marked kv-fp8 give every instance (cpu, cuda eager,
 * cuda graphs) a kv layout of fp8_e4m3, as the engine does for a
 * quantizer's kv_cache: fp8 — both backends store e4m3(x) with scale 1.0;
 * bf16 vs float32 activations move a code now and then, hence a looser
 * tolerance (an estimate until measured) — and so does the fp8 quantizer
 * configured with kv_cache=fp8 (its kv_dtype, asked as the engine asks);
 * run_invariant with an fp8 KV cache too.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_util.h"
#include "loom/backend.h"
#include "loom/plugin.h"
#include "qcalib.h"
#include "loom/quant.h"
#include "formats/dtype.h"
#include "formats/half.h"
#include "model/model.h"
#include "plugin/host.h"
#include "../model/hf_gguf_image.h"

#ifndef LOOM_CUDA_BACKEND_DEFAULT
#define LOOM_CUDA_BACKEND_DEFAULT "loom-backend-cuda.so"
#endif
#ifndef LOOM_CPU_BACKEND_DEFAULT
#define LOOM_CPU_BACKEND_DEFAULT "loom-backend-cpu.so"
#endif
/* quantizer plugins: DIR/NAME/loom-quantizer-NAME.so (a build tree's
 * plugins/quantizer) or DIR/loom-quantizer-NAME.so; $LOOM_QUANTIZER_DIR
 * overrides the directory meson compiled in */
#ifndef LOOM_QUANTIZER_DIR_DEFAULT
#define LOOM_QUANTIZER_DIR_DEFAULT "plugins/quantizer"
#endif

#define TOL_CPU 2e-2   /* bf16 weights+activations vs float32 activations */
#define TOL_GRAPH 1e-2 /* graph replay vs eager (GEMM shapes differ by padding) */
/* FP8 KV cache on both backends: a K/V value that rounds differently in bf16
 * and float32 can land on the neighbouring e4m3 code (6-12% apart), so
 * cuda vs cpu — and graphs vs eager, whose GEMMs round differently — move
 * more than with a dt cache. Estimates, not yet measured on a GPU. */
#define TOL_KV_FP8 5e-2
#define TOL_KV_FP8_QUANT 1e-1 /* fp8 weights and activations too */

static int g_fail, g_pass;
static double g_graph_replays, g_graph_captures, g_piecewise_replays, g_moe_lt_layers, g_moe_wg_layers,
    g_moe_wg128_layers;

/* ---------------------------------------------------------------- host */

/* The real host table (libloom's rules and formats); logging and the graph
 * counters are this test's own. */
static void h_log(void *ctx, loom_log_level lv, const char *who, const char *fmt, ...) {
    (void)ctx;
    if (lv < LOOM_LOG_WARN && !getenv("GPU_TEST_VERBOSE")) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", who ? who : "?");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
static void h_metric_add(void *ctx, const char *name, double d) {
    (void)ctx;
    if (!strcmp(name, "backend.cuda.graph_replays")) g_graph_replays += d;
    if (!strcmp(name, "backend.cuda.graph_captures")) g_graph_captures += d;
    if (!strcmp(name, "backend.cuda.piecewise_replays")) g_piecewise_replays += d;
    if (!strcmp(name, "backend.cuda.moe_expert_gemm_layers")) g_moe_lt_layers += d;
    if (!strcmp(name, "backend.cuda.moe_wgmma_layers")) g_moe_wg_layers += d;
    if (!strcmp(name, "backend.cuda.moe_wgmma_128_layers")) g_moe_wg128_layers += d;
}
static void h_metric_set(void *ctx, const char *name, double v) { (void)ctx, (void)name, (void)v; }

static loom_host g_host;

static void host_init(void) {
    g_host = *loom_host_default();
    g_host.log = h_log;
    g_host.metric_add = h_metric_add;
    g_host.metric_set = h_metric_set;
}

/* -------------------------------------------------------------- plugins */

typedef struct plugin {
    void *lib;
    const loom_component *comp;
    const loom_backend_ops *ops;
} plugin;

static bool plugin_open(plugin *p, const char *path, const char *name) {
    memset(p, 0, sizeof *p);
    p->comp = gpu_plugin_find(&p->lib, path, LOOM_KIND_BACKEND, name);
    if (p->comp) p->ops = p->comp->ops;
    return p->comp != NULL;
}

/* ------------------------------------------------------------ fake model */

#define MAX_TENSORS 64

typedef struct fake_model {
    loom_model_config cfg;
    loom_model_view view;
    loom_tensor t[MAX_TENSORS];
    char names[MAX_TENSORS][64];
    int n;
} fake_model;


static const loom_tensor *fm_get(void *ctx, const char *name) {
    fake_model *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return &m->t[i];
    return NULL;
}
static int32_t fm_count(void *ctx) { return ((fake_model *)ctx)->n; }
static const loom_tensor *fm_at(void *ctx, int32_t i) { return &((fake_model *)ctx)->t[i]; }

/* Matrices are stored in this type (bf16 goes to the device as is; f32
 * takes the loader's dequantize-and-round path through pinned staging). */
static loom_dtype g_matrix_dtype = LOOM_DTYPE_BF16;

/* Add a tensor: matrices U(-a, a) in g_matrix_dtype, or f32 vectors c + U(-a, a). */
static void fm_add(fake_model *m, const char *name, int64_t d0, int64_t d1, bool f32, float c,
                   float a) {
    if (!f32 && g_matrix_dtype == LOOM_DTYPE_F32) f32 = true, c = 0;
    loom_tensor *t = &m->t[m->n];
    snprintf(m->names[m->n], sizeof m->names[0], "%s", name);
    int64_t n = d0 * (d1 > 0 ? d1 : 1);
    *t = (loom_tensor){.struct_size = sizeof *t, .dtype = f32 ? LOOM_DTYPE_F32 : LOOM_DTYPE_BF16,
                       .ndim = d1 > 0 ? 2 : 1, .shape = {d0, d1 > 0 ? d1 : 0},
                       .nbytes = (size_t)n * (f32 ? 4 : 2), .device = LOOM_DEVICE_HOST,
                       .name = m->names[m->n]};
    t->data = malloc(t->nbytes);
    if (f32)
        for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = c + gpu_rng_unif(-a, a);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)t->data)[i] = loom_fp32_to_bf16(gpu_rng_unif(-a, a));
    m->n++;
}

/* Initialise the fields after `gguf` by name (.window = 37): a field
 * inserted among them shifts positional initialisers silently. */
typedef struct shape {
    const char *name;
    loom_arch arch;
    int32_t vocab, hidden, inter, layers, heads, kv_heads, head_dim;
    float theta;
    bool tie, bias, llama3;
    bool f32_weights;   /* matrices stored f32 (exercises the converting upload) */
    const char *dtype;  /* cuda backend compute type; NULL = default (bf16)     */
    /* GGUF block types of the linear weights, or NULL: 7 per layer (attn_q,
     * attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down), then
     * output.weight's (BF16: keep it bf16) */
    const loom_dtype *gguf;
    bool kv_fp8;        /* KV cache fp8_e4m3 on every instance               */
    const char *cuda_ov; /* one more cuda backend parameter ("key=value"), or NULL */
    bool qk_norm;       /* Qwen3: RMSNorm of each q and k head before RoPE    */
    bool groups;        /* KV layout with the backends' block-table groups   */
    int32_t want_groups; /* with groups: the number kv_groups() must propose
                            (0: any); a test that meant several groups
                            fails rather than run one table           */
    int32_t window;     /* > 0: Gemma 3 — QK-norm, post-norms, GeGLU, the
                           embedding scale, attn_scale 1/sqrt(256), every
                           third layer global (RoPE base theta), the others
                           local over `window` tokens (base 10000)            */
    const struct moe_spec *moe; /* a mixture of experts, or NULL (dense FFN)  */
    const char *cuda_ov2; /* a second cuda backend parameter, or NULL        */
} shape;

/* A mixture-of-experts FFN in every layer (fm_moe). */
typedef struct moe_spec {
    int32_t experts, used, width, shared; /* shared: width of the shared expert, 0: none */
    bool norm_topk;
} moe_spec;

/* f as IEEE binary16 (formats/half.h: round to nearest even, subnormals
 * kept) at p, little-endian. */
static void put_f16(uint8_t *p, float f) {
    const uint16_t h = loom_fp32_to_fp16(f);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Random GGUF blocks for a (d0, d1) matrix of `type`: random codes and f16
 * scales sized so the weights are about +-a (the same block layouts as
 * formats/gguf_blocks.h). Both backends read these bytes as stored. */
static void fm_add_gguf(fake_model *m, const char *name, int64_t d0, int64_t d1, loom_dtype type,
                        float a) {
    loom_tensor *t = &m->t[m->n];
    snprintf(m->names[m->n], sizeof m->names[0], "%s", name);
    const size_t rb = loom_dtype_row_bytes(type, d1), bb = loom_dtype_block_bytes(type);
    *t = (loom_tensor){.struct_size = sizeof *t, .dtype = type, .ndim = 2, .shape = {d0, d1},
                       .nbytes = (size_t)d0 * rb, .device = LOOM_DEVICE_HOST,
                       .name = m->names[m->n]};
    uint8_t *p = malloc(t->nbytes);
    for (size_t i = 0; i < t->nbytes; i++) p[i] = (uint8_t)(gpu_rng_next() >> 56);
    for (uint8_t *b = p; b < p + t->nbytes; b += bb) {
        const float neg = gpu_rng_next() & 1 ? -1.0f : 1.0f, u = gpu_rng_unif(0.5f, 1.0f);
        switch (type) {
        case LOOM_DTYPE_Q4_0: put_f16(b, neg * u * a / 8); break;
        case LOOM_DTYPE_Q4_1: {
            /* q d + m with m = -(7.5 + j) d, j in [-1, 1] from the random
             * byte already at b[2] (no extra draw, so the other shapes'
             * data stay as they were): centred, like a real q4_1 block
             * (m its minimum, d its range / 15). The former m = -a gave
             * every weight a mean of -0.3 a: a rank-one common mode that
             * SwiGLU turns on or off by the sign of sum(x), so tokens
             * near that switch were ill-conditioned — a bf16 forward off
             * float64 by up to 2 (relative L2 of the logits) — and
             * "decode batch 3 step 2" failed for the cuda instances alike
             * (seed 1795969933: seq 2 at position 25, 0.54 vs cpu). */
            const float d = u * a / 8, j = (float)b[2] / 127.5f - 1.0f;
            put_f16(b, d), put_f16(b + 2, -(7.5f + j) * d);
            break;
        }
        case LOOM_DTYPE_Q8_0: put_f16(b, neg * u * a / 127); break;
        case LOOM_DTYPE_Q5_0: put_f16(b, neg * u * a / 16); break;
        case LOOM_DTYPE_Q4_K: put_f16(b, u * a / (63 * 8)), put_f16(b + 2, u * a / 63); break;
        case LOOM_DTYPE_Q6_K: put_f16(b + 208, neg * u * a / (127 * 32)); break;
        default: break;
        }
    }
    t->data = p;
    m->n++;
}

/* A stacked (d0, d1, d2) bf16 tensor U(-a, a) (the experts). */
static void fm_add3(fake_model *m, const char *name, int64_t d0, int64_t d1, int64_t d2, float a) {
    fm_add(m, name, d0 * d1, d2, false, 0, a);
    loom_tensor *t = &m->t[m->n - 1];
    t->ndim = 3, t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
}

/* Layer l's router and experts. Routing that two backends agree on: a
 * token's logits are its embedding's first E dims (the router reads dim e
 * for expert e), which fm_moe_embed sets 8 apart, so the order of a
 * token's experts is its own and no rounding difference between bf16 and
 * float32 activations can swap two of them — while different tokens choose
 * different experts (and small batches leave experts without tokens). */
static void fm_moe(fake_model *m, const moe_spec *ms, int l, int64_t H) {
    const int64_t E = ms->experts, I = ms->width, S = ms->shared;
    char nm[64];
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l), fm_add(m, nm, E, H, false, 0, 0);
    uint16_t *r = m->t[m->n - 1].data;
    for (int64_t e = 0; e < E; e++) r[e * H + e] = loom_fp32_to_bf16(1.0f);
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", l), fm_add3(m, nm, E, I, H, 1.0f / sqrtf((float)H));
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.weight", l), fm_add3(m, nm, E, I, H, 1.0f / sqrtf((float)H));
    snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.weight", l), fm_add3(m, nm, E, H, I, 1.0f / sqrtf((float)I));
    if (!S) return;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_shexp.weight", l), fm_add(m, nm, S, H, false, 0, 1.0f / sqrtf((float)H));
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_shexp.weight", l), fm_add(m, nm, S, H, false, 0, 1.0f / sqrtf((float)H));
    snprintf(nm, sizeof nm, "blk.%d.ffn_down_shexp.weight", l), fm_add(m, nm, H, S, false, 0, 1.0f / sqrtf((float)S));
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp_shexp.weight", l), fm_add(m, nm, H, 0, true, 0, 0.5f);
}

/* The embedding's first E dims: each token a random permutation of the
 * experts, 8 apart, centred (see fm_moe). */
static void fm_moe_embed(fake_model *m, const moe_spec *ms, int64_t V, int64_t H) {
    uint16_t *emb = m->t[0].data;
    int32_t perm[64];
    for (int64_t v = 0; v < V; v++) {
        for (int e = 0; e < ms->experts; e++) perm[e] = e;
        for (int e = ms->experts - 1; e > 0; e--) {
            const int j = (int)(gpu_rng_next() % (uint64_t)(e + 1)), x = perm[e];
            perm[e] = perm[j], perm[j] = x;
        }
        for (int e = 0; e < ms->experts; e++)
            emb[v * H + e] = loom_fp32_to_bf16(8.0f * ((float)perm[e] - 0.5f * (float)(ms->experts - 1)));
    }
}

static fake_model *fm_make(const shape *s) {
    fake_model *m = calloc(1, sizeof *m);
    g_matrix_dtype = s->f32_weights ? LOOM_DTYPE_F32 : LOOM_DTYPE_BF16;
    loom_model_config *c = &m->cfg;
    *c = (loom_model_config){.struct_size = sizeof *c, .arch = s->arch, .vocab_size = s->vocab,
                             .hidden_size = s->hidden, .intermediate_size = s->inter,
                             .num_layers = s->layers, .num_heads = s->heads,
                             .num_kv_heads = s->kv_heads, .head_dim = s->head_dim,
                             .max_context = 8192, .rope_theta = s->theta, .rms_norm_eps = 1e-5f,
                             .rope_scaling = s->llama3 ? LOOM_ROPE_SCALING_LLAMA3 : LOOM_ROPE_SCALING_NONE,
                             .rope_factor = 8, .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                             .rope_original_context = 8192, .tie_embeddings = s->tie,
                             .qkv_bias = s->bias, .bos_token_id = 1, .eos_token_id = 2};
    snprintf(c->name, sizeof c->name, "fake %s", s->name);
    c->qk_norm = s->qk_norm || s->window > 0;
    if (s->window > 0) { /* Gemma 3's config as model_gguf.c reads it */
        c->post_norms = true;
        c->ffn_act = LOOM_FFN_GELU_TANH;
        c->sliding_window = s->window;
        c->global_every = 3;
        c->rope_theta_local = 10000.0f;
        c->embed_scale = sqrtf((float)s->hidden);
        c->attn_scale = 0.0625f; /* query_pre_attn_scalar 256 */
        c->rms_norm_eps = 1e-6f;
    }
    if (s->moe)
        c->num_experts = s->moe->experts, c->num_experts_used = s->moe->used,
        c->expert_intermediate_size = s->moe->width, c->shared_expert_intermediate_size = s->moe->shared,
        c->moe_norm_topk = s->moe->norm_topk;
    const int64_t H = s->hidden, I = s->inter, QD = (int64_t)s->heads * s->head_dim;
    const int64_t KVD = (int64_t)s->kv_heads * s->head_dim;
    fm_add(m, "token_embd.weight", s->vocab, H, false, 0, 1.0f);
    if (s->moe) fm_moe_embed(m, s->moe, s->vocab, H);
    fm_add(m, "output_norm.weight", H, 0, true, 1, 0.05f);
    if (!s->tie) {
        const loom_dtype ot = s->gguf ? s->gguf[7 * s->layers] : LOOM_DTYPE_BF16;
        if (ot != LOOM_DTYPE_BF16) fm_add_gguf(m, "output.weight", s->vocab, H, ot, 1.0f / sqrtf((float)H));
        else fm_add(m, "output.weight", s->vocab, H, false, 0, 1.0f / sqrtf((float)H));
    }
    char nm[64];
    for (int l = 0; l < s->layers; l++) {
        int wi = 0; /* which linear of the layer, for s->gguf */
#define ADDW(suffix, d0, d1, fan)                                                                  \
    snprintf(nm, sizeof nm, "blk.%d." suffix, l),                                                  \
        s->gguf ? fm_add_gguf(m, nm, d0, d1, s->gguf[7 * l + wi++], 1.0f / sqrtf((float)(fan)))   \
                : fm_add(m, nm, d0, d1, false, 0, 1.0f / sqrtf((float)(fan)))
        ADDW("attn_q.weight", QD, H, H);
        ADDW("attn_k.weight", KVD, H, H);
        ADDW("attn_v.weight", KVD, H, H);
        ADDW("attn_output.weight", H, QD, QD);
        if (s->moe) {
            fm_moe(m, s->moe, l, H);
        } else {
            ADDW("ffn_gate.weight", I, H, H);
            ADDW("ffn_up.weight", I, H, H);
            ADDW("ffn_down.weight", H, I, I);
        }
#undef ADDW
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l), fm_add(m, nm, H, 0, true, 1, 0.05f);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l), fm_add(m, nm, H, 0, true, 1, 0.05f);
        if (c->qk_norm) { /* wide spread: a wrong head's weight shows */
            snprintf(nm, sizeof nm, "blk.%d.attn_q_norm.weight", l), fm_add(m, nm, s->head_dim, 0, true, 1, 0.5f);
            snprintf(nm, sizeof nm, "blk.%d.attn_k_norm.weight", l), fm_add(m, nm, s->head_dim, 0, true, 1, 0.5f);
        }
        if (c->post_norms) {
            snprintf(nm, sizeof nm, "blk.%d.post_attention_norm.weight", l), fm_add(m, nm, H, 0, true, 1, 0.05f);
            snprintf(nm, sizeof nm, "blk.%d.post_ffw_norm.weight", l), fm_add(m, nm, H, 0, true, 1, 0.05f);
        }
        if (s->bias) {
            snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l), fm_add(m, nm, QD, 0, true, 0, 0.5f);
            snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", l), fm_add(m, nm, KVD, 0, true, 0, 0.5f);
            snprintf(nm, sizeof nm, "blk.%d.attn_v.bias", l), fm_add(m, nm, KVD, 0, true, 0, 0.5f);
        }
    }
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->cfg, .ctx = m,
                                .get = fm_get, .count = fm_count, .at = fm_at};
    return m;
}

static void fm_free(fake_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    free(m);
}

/* ------------------------------------------------------ a tiny scheduler */

#define NB 1024          /* device blocks */
#define NCPU 64          /* swap blocks   */
#define BS 16
#define MAX_SEQ_BLOCKS 80 /* > 1025 tokens: the over-budget step builds one sequence of 1025 */

typedef struct seq {
    int32_t tokens[MAX_SEQ_BLOCKS * BS];
    int32_t len;         /* tokens known                         */
    int32_t done;        /* tokens whose K/V is in the cache     */
    int32_t blocks[MAX_SEQ_BLOCKS];
    int32_t nblocks;
} seq;

typedef struct sched {
    int32_t free_list[NB];
    int32_t n_free;
} sched;

/* Block-table groups of the shape run_shape runs (1: one table) and each
 * group's window, from the backends' kv_groups(). A sequence's block j in
 * group g is id blocks[j] + g * NB / g_groups: the scheduler hands out
 * ids below NB / g_groups, so no two groups share a block. */
#define MAX_GROUPS 4
static int g_groups = 1;
static int32_t g_gwin[MAX_GROUPS];

static int32_t gblk(int32_t b, int g) { return b + g * (NB / g_groups); }

static void sched_init(sched *s) {
    const int n = NB / g_groups;
    for (int i = 0; i < n; i++) s->free_list[i] = i;
    for (int i = n - 1; i > 0; i--) { /* shuffled: block tables are scattered */
        int j = (int)(gpu_rng_next() % (uint64_t)(i + 1)), t = s->free_list[i];
        s->free_list[i] = s->free_list[j], s->free_list[j] = t;
    }
    s->n_free = n;
}

static int32_t sched_alloc(sched *s) { return s->free_list[--s->n_free]; }

typedef struct batch_buf {
    loom_batch b;
    int32_t tok[4096], pos[4096], qs[65], ctx[64], bt[MAX_GROUPS * 64 * MAX_SEQ_BLOCKS], lidx[4096];
    int64_t slot[MAX_GROUPS * 4096];
} batch_buf;

/* Step where seqs[i] gets nnew[i] new tokens; logits for all tokens or
 * the last of each sequence. */
static void build(sched *sc, seq **seqs, const int *nnew, int nseq, bool all_logits, batch_buf *o) {
    int T = 0, nl = 0, stride = 1;
    for (int i = 0; i < nseq; i++) {
        seq *s = seqs[i];
        int need = (s->done + nnew[i] + BS - 1) / BS;
        while (s->nblocks < need) s->blocks[s->nblocks++] = sched_alloc(sc);
        if (s->nblocks > stride) stride = s->nblocks;
    }
    o->qs[0] = 0;
    for (int i = 0; i < nseq; i++) {
        seq *s = seqs[i];
        for (int g = 0; g < g_groups; g++) {
            /* a windowed group's blocks wholly before the step's first
             * window are -1, as the cache manager leaves them */
            const int lo = g_gwin[g] > 0 ? s->done - g_gwin[g] + 1 : 0;
            for (int j = 0; j < stride; j++)
                o->bt[(g * nseq + i) * stride + j] = j >= s->nblocks || (j + 1) * BS <= lo ? -1 : gblk(s->blocks[j], g);
        }
        for (int j = 0; j < nnew[i]; j++, T++) {
            int p = s->done + j;
            o->tok[T] = s->tokens[p];
            o->pos[T] = p;
            if (all_logits || j == nnew[i] - 1) o->lidx[nl++] = T;
        }
        o->qs[i + 1] = T;
        o->ctx[i] = s->done + nnew[i];
    }
    for (int g = 0; g < g_groups; g++) /* group g's slot mapping at g * T */
        for (int i = 0, t = 0; i < nseq; i++)
            for (int j = 0; j < nnew[i]; j++, t++) {
                const int p = seqs[i]->done + j;
                o->slot[g * T + t] = (int64_t)gblk(seqs[i]->blocks[p / BS], g) * BS + p % BS;
            }
    o->b = (loom_batch){.struct_size = sizeof(loom_batch), .num_seqs = nseq, .num_tokens = T,
                        .token_ids = o->tok, .positions = o->pos, .query_start = o->qs,
                        .context_len = o->ctx, .block_table = o->bt, .block_table_stride = stride,
                        .slot_mapping = o->slot, .num_logits = nl, .logits_index = o->lidx,
                        .num_groups = g_groups > 1 ? g_groups : 0, .group_window = g_groups > 1 ? g_gwin : NULL};
}

/* ------------------------------------------------------------- checking */

static void check(const char *name, const float *a, const float *b, int rows, int V, double tol) {
    double worst = 0;
    bool bad = false;
    for (int r = 0; r < rows; r++) {
        double d = 0, n = 0;
        for (int i = 0; i < V; i++) {
            double x = a[(size_t)r * V + i], y = b[(size_t)r * V + i];
            if (isnan(x) || isinf(x)) bad = true;
            d += (x - y) * (x - y);
            n += y * y;
        }
        double e = sqrt(d) / (n > 0 ? sqrt(n) : 1e-30);
        if (!(e <= worst)) worst = e;
    }
    bool ok = !bad && worst <= tol && rows > 0;
    printf("%s %-64s %.3e%s\n", ok ? "PASS" : "FAIL", name, worst, bad ? " (NaN)" : "");
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

static void expect_status(const char *name, loom_status got, loom_status want, const loom_error *e) {
    bool ok = got == want;
    printf("%s %-64s status %d%s%s\n", ok ? "PASS" : "FAIL", name, (int)got,
           e && e->message[0] ? ": " : "", e ? e->message : "");
    if (ok) g_pass++;
    else g_fail++;
}

typedef struct trio {
    const plugin *cpu_p, *cuda_p;
    void *cpu, *eager, *graph;
    float *l_cpu, *l_eager, *l_graph;
    int V;
    double tol;  /* cuda vs cpu */
    bool quantized;
    bool kv_fp8;  /* E4M3 KV cache: graphs vs eager within tol too */
} trio;

/* Run one step on the three instances and compare. */
static bool run_step(trio *t, const char *shape_name, const char *step, batch_buf *bb) {
    loom_error e = {0};
    loom_status st;
    char name[160];
    const int NLr = bb->b.num_logits;
    if ((st = t->cpu_p->ops->forward(t->cpu, &bb->b, t->l_cpu, &e)) ||
        (st = t->cuda_p->ops->forward(t->eager, &bb->b, t->l_eager, &e)) ||
        (st = t->cuda_p->ops->forward(t->graph, &bb->b, t->l_graph, &e))) {
        printf("FAIL %s %s: forward status %d: %s\n", shape_name, step, (int)st, e.message);
        g_fail++;
        return false;
    }
    snprintf(name, sizeof name, "%s %s cuda vs cpu (%d rows)", shape_name, step, NLr);
    check(name, t->l_eager, t->l_cpu, NLr, t->V, t->tol);
    snprintf(name, sizeof name, "%s %s graphs-on vs eager", shape_name, step);
    /* quantized shapes: a padded graph step can take another linear path
     * (GEMV vs tensor-core GEMM) than the eager one at the same M, so it
     * rounds differently — as much as cuda vs cpu may differ */
    check(name, t->l_graph, t->l_eager, NLr, t->V,
          (t->quantized || t->kv_fp8) && t->tol > TOL_GRAPH ? t->tol : TOL_GRAPH);
    return true;
}

static void advance(seq **seqs, const int *nnew, int n) {
    for (int i = 0; i < n; i++) seqs[i]->done += nnew[i];
}

/* ---------------------------------------------------------- block images */

/* Seq q's blocks as images: the eager cuda instance reads the same bytes
 * into host memory and into device memory of kv_image_device(); written
 * back from device memory into fresh blocks (of both cuda instances, the
 * graph one from the eager one's image) and from host memory into the cpu's,
 * the next decode step still matches. Where both pools hold the same type
 * (kv_default_dtype resolves the backends' defaults: the cpu's f16 and
 * cuda's bf16 have the same size and are not one layout) the cpu's own image
 * goes into the cuda blocks instead: block images are one layout across
 * backends. q moves to the fresh blocks. */
static bool check_block_images(trio *t, const char *shape, seq *q, sched *sc, loom_dtype kv_dt) {
    const loom_backend_ops *cu = t->cuda_p->ops, *cp = t->cpu_p->ops;
    char name[160];
    loom_error e = {0};
    const int32_t nb = q->nblocks;
    const size_t per = cu->kv_block_bytes(t->eager, BS, kv_dt), len = per * (size_t)nb;
    const size_t cpu_len = cp->kv_block_bytes(t->cpu, BS, kv_dt) * (size_t)nb; /* its own pool type */
    const loom_dtype t_cu = kv_dt != LOOM_DTYPE_COUNT ? kv_dt : cu->kv_default_dtype(t->eager),
                     t_cp = kv_dt != LOOM_DTYPE_COUNT ? kv_dt : cp->kv_default_dtype(t->cpu);
    const bool same_layout = cpu_len == len && t_cu == t_cp;
    const int32_t dev = cu->kv_image_device ? cu->kv_image_device(t->eager) : -1;
    snprintf(name, sizeof name, "%s block images: kv_image_device() names the device", shape);
    expect_status(name, dev >= 0 ? LOOM_OK : LOOM_ERR_UNSUPPORTED, LOOM_OK, NULL);
    uint8_t *h_cuda = malloc(len), *h_dev = malloc(len), *h_cpu = malloc(cpu_len);
    void *d = NULL;
    bool ok = h_cuda && h_dev && h_cpu && dev >= 0 && cudaSetDevice(dev) == cudaSuccess &&
              cudaMalloc(&d, len) == cudaSuccess;
    loom_status st = ok ? cu->kv_read_blocks(t->eager, q->blocks, nb, h_cuda, len, &e) : LOOM_ERR_NOMEM;
    if (!st) st = cu->kv_read_blocks(t->eager, q->blocks, nb, d, len, &e);
    if (!st && cudaMemcpy(h_dev, d, len, cudaMemcpyDeviceToHost) != cudaSuccess) st = LOOM_ERR_DEVICE;
    if (!st) st = cp->kv_read_blocks(t->cpu, q->blocks, nb, h_cpu, cpu_len, &e);
    snprintf(name, sizeof name, "%s block images: read into device memory == into host (%d blocks)", shape, nb);
    expect_status(name, st ? st : memcmp(h_cuda, h_dev, len) ? LOOM_ERR_INTERNAL : LOOM_OK, LOOM_OK, &e);
    int32_t fresh[MAX_SEQ_BLOCKS];
    for (int32_t j = 0; j < nb; j++) fresh[j] = sched_alloc(sc);
    /* into the cuda instances: the cpu's image when the layouts agree */
    if (!st && same_layout && cudaMemcpy(d, h_cpu, len, cudaMemcpyHostToDevice) != cudaSuccess) st = LOOM_ERR_DEVICE;
    if (!st) st = cu->kv_write_blocks(t->eager, fresh, nb, d, len, &e);
    if (!st) st = cu->kv_write_blocks(t->graph, fresh, nb, d, len, &e);
    if (!st) st = cp->kv_write_blocks(t->cpu, fresh, nb, h_cpu, cpu_len, &e);
    loom_error eb = {0}; /* a device buffer of the wrong length: refused by name */
    loom_status bad = cu->kv_write_blocks(t->eager, fresh, nb, d, len - 1, &eb);
    snprintf(name, sizeof name, "%s block images: a device buffer of the wrong length is refused", shape);
    expect_status(name, bad, LOOM_ERR_INVALID, &eb);
    snprintf(name, sizeof name, "%s block images: written from device memory (%s image)", shape,
             same_layout ? "the cpu's" : "cuda's own");
    expect_status(name, st, LOOM_OK, &e);
    cudaFree(d);
    free(h_cuda), free(h_dev), free(h_cpu);
    if (st) return false;
    memcpy(q->blocks, fresh, (size_t)nb * sizeof *fresh);
    static batch_buf bb;
    seq *ss[1] = {q};
    int nn[1] = {1};
    build(sc, ss, nn, 1, false, &bb);
    if (!run_step(t, shape, "decode after block images written from device memory", &bb)) return false;
    advance(ss, nn, 1);
    return true;
}

/* ------------------------------------------------------------ one shape */

/* qb: a quantizer every instance loads with (NULL: none); tol: cuda vs cpu. */
/* Block-table groups for shape sh: the cpu and cuda backends' kv_groups()
 * proposals must agree; the layout takes them (g_groups, g_gwin). */
static bool take_groups(const shape *sh, const plugin *const *pl, void **const *inst, loom_kv_layout *kvl) {
    loom_kv_groups pg[2] = {{.struct_size = sizeof pg[0]}, {.struct_size = sizeof pg[1]}};
    loom_error e = {0};
    char name[128];
    snprintf(name, sizeof name, "%s kv_groups(): cuda proposes what cpu does", sh->name);
    for (int i = 0; i < 2; i++)
        if (!pl[i]->ops->kv_groups || pl[i]->ops->kv_groups(*inst[i], &pg[i], &e)) {
            printf("FAIL %s: instance %d has no kv_groups() or it failed: %s\n", name, i, e.message);
            g_fail++;
            return false;
        }
    const bool same = pg[0].num_groups == pg[1].num_groups && pg[0].layers_per_block == pg[1].layers_per_block &&
                      !memcmp(pg[0].window, pg[1].window, sizeof pg[0].window);
    const bool want = sh->want_groups <= 0 || pg[0].num_groups == sh->want_groups;
    printf("%s %-64s %d groups, %d layers a block\n", same ? "PASS" : "FAIL", name, pg[1].num_groups,
           pg[1].layers_per_block);
    if (!want)
        printf("FAIL %s: kv_groups() proposes %d block-table groups, the shape is built for %d\n", sh->name,
               pg[0].num_groups, sh->want_groups);
    if (!same || !want || pg[0].num_groups > MAX_GROUPS) {
        g_fail++;
        return false;
    }
    g_pass++;
    g_groups = pg[0].num_groups;
    memcpy(g_gwin, pg[0].window, sizeof g_gwin);
    kvl->num_groups = g_groups;
    return true;
}

static void run_shape(const plugin *cpu_p, const plugin *cuda_p, const shape *sh,
                      const loom_quant_binding *qb, double tol) {
    /* the KV type the engine would ask for: the shape's, else the
     * quantizer's kv_dtype (fp8 with kv_cache=fp8), else the backend's */
    loom_dtype kv_dt = sh->kv_fp8 ? LOOM_DTYPE_FP8_E4M3 : LOOM_DTYPE_COUNT;
    if (!sh->kv_fp8 && qb && qb->ops->struct_size > offsetof(loom_quant_ops, kv_dtype) && qb->ops->kv_dtype)
        kv_dt = qb->ops->kv_dtype(qb->self);
    const bool kv_fp8 = kv_dt == LOOM_DTYPE_FP8_E4M3;
    printf("--- %s: vocab %d hidden %d ffn %d layers %d heads %d/%d head_dim %d%s%s%s%s, cuda %s%s%s%s\n",
           sh->name, sh->vocab, sh->hidden, sh->inter, sh->layers, sh->heads, sh->kv_heads,
           sh->head_dim, sh->bias ? " qkv-bias" : "", sh->llama3 ? " llama3-rope" : "",
           sh->window > 0 ? " gemma3 (window, qk-norm, post-norms, geglu)" : sh->qk_norm ? " qk-norm" : "",
           sh->gguf ? " gguf-block-weights" : sh->f32_weights ? " f32-weights" : " bf16-weights", sh->dtype ? sh->dtype : "bf16",
           qb ? ", quantizer " : "", qb ? qb->name : "", kv_fp8 ? ", fp8_e4m3 KV cache" : "");
    if ((sh->arch == LOOM_ARCH_GEMMA3) != (sh->window > 0)) { /* a Gemma 3 shape without its windows */
        printf("FAIL %s: arch %s with window %d (Gemma 3 shapes need a window, others none)\n", sh->name,
               sh->arch == LOOM_ARCH_GEMMA3 ? "gemma3" : "not gemma3", sh->window);
        g_fail++;
        return;
    }
    fake_model *m = fm_make(sh);
    loom_error e = {0};
    loom_status st;
    trio t = {.cpu_p = cpu_p, .cuda_p = cuda_p, .V = sh->vocab, .tol = tol, .quantized = qb != NULL,
              .kv_fp8 = kv_fp8};
    char dt_ov[32];
    snprintf(dt_ov, sizeof dt_ov, "dtype=%s", sh->dtype ? sh->dtype : "bf16");
    /* (cuda_ov2 only after cuda_ov: the list ends at the first NULL) */
    const char *ov_eager[] = {"cuda_graphs=false", "max_batched_tokens=1024", dt_ov, sh->cuda_ov, sh->cuda_ov2, NULL};
    const char *ov_graph[] = {"cuda_graphs=true", "max_batched_tokens=1024", dt_ov, sh->cuda_ov, sh->cuda_ov2, NULL};
    void *c_cpu = gpu_config_make(cpu_p->comp, NULL), *c_e = gpu_config_make(cuda_p->comp, ov_eager),
         *c_g = gpu_config_make(cuda_p->comp, ov_graph);
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = BS, .num_blocks = NB,
                          .num_cpu_blocks = NCPU, .dtype = kv_dt};
    void **inst[3] = {&t.cpu, &t.eager, &t.graph};
    const plugin *pl[3] = {cpu_p, cuda_p, cuda_p};
    void *cfgs[3] = {c_cpu, c_e, c_g};
    for (int i = 0; i < 3; i++) {
        if ((st = pl[i]->ops->create(&g_host, cfgs[i], inst[i], &e)) ||
            (st = pl[i]->ops->load(*inst[i], &m->view, qb, &e))) {
            printf("FAIL %s setup of instance %d: status %d: %s\n", sh->name, i, (int)st, e.message);
            g_fail++;
            goto out;
        }
    }
    if (sh->groups && !take_groups(sh, pl, inst, &kvl)) goto out;
    for (int i = 0; i < 3; i++) {
        if ((st = pl[i]->ops->kv_alloc(*inst[i], &kvl, &e))) {
            printf("FAIL %s kv_alloc of instance %d: status %d: %s\n", sh->name, i, (int)st, e.message);
            g_fail++;
            goto out;
        }
    }
    {
        loom_backend_memory mem = {0};
        st = cuda_p->ops->memory(t.eager, &mem, &e);
        printf("      cuda memory: total %.1f GiB, free %.1f GiB, weights %.1f MiB\n",
               mem.total_bytes / 1073741824.0, mem.free_bytes / 1073741824.0,
               mem.weight_bytes / 1048576.0);
    }
    t.l_cpu = malloc((size_t)1024 * sh->vocab * 4);
    t.l_eager = malloc((size_t)1024 * sh->vocab * 4);
    t.l_graph = malloc((size_t)1024 * sh->vocab * 4);

    sched sc;
    sched_init(&sc);
    static seq S[8];
    memset(S, 0, sizeof S);
    const int plen[6] = {1, 15, 16, 17, 33, 100};
    for (int i = 0; i < 8; i++) {
        S[i].len = MAX_SEQ_BLOCKS * BS;
        for (int j = 0; j < S[i].len; j++) S[i].tokens[j] = (int32_t)(gpu_rng_next() % (uint64_t)sh->vocab);
    }
    static batch_buf bb;
    /* 1. ragged prefill of seqs 0..3, every token's logits */
    {
        seq *ss[4] = {&S[0], &S[1], &S[2], &S[3]};
        int nn[4] = {plen[0], plen[1], plen[2], plen[3]};
        build(&sc, ss, nn, 4, true, &bb);
        if (!run_step(&t, sh->name, "prefill 1/15/16/17", &bb)) goto out;
        advance(ss, nn, 4);
    }
    /* 2. chunked prefill: seq 4 (33 tokens) and seq 5 (100) in pieces */
    {
        seq *ss[2] = {&S[4], &S[5]};
        int nn[2] = {20, 37};
        build(&sc, ss, nn, 2, true, &bb);
        if (!run_step(&t, sh->name, "chunked prefill 20+37", &bb)) goto out;
        advance(ss, nn, 2);
    }
    /* 3. mixed: decodes of 0..3 + the rest of 4 and a chunk of 5 */
    {
        seq *ss[6] = {&S[0], &S[1], &S[2], &S[3], &S[4], &S[5]};
        int nn[6] = {1, 1, 1, 1, 13, 40};
        build(&sc, ss, nn, 6, false, &bb);
        if (!run_step(&t, sh->name, "mixed 4 decodes + chunks 13, 40", &bb)) goto out;
        advance(ss, nn, 6);
    }
    /* 4. last chunk of 5 (verify-like: 23 tokens, all logits) */
    {
        seq *ss[1] = {&S[5]};
        int nn[1] = {23};
        build(&sc, ss, nn, 1, true, &bb);
        if (!run_step(&t, sh->name, "last chunk 23", &bb)) goto out;
        advance(ss, nn, 1);
    }
    /* 5. fork: seq 6 = copy of seq 4's blocks (copy_blocks), same next token */
    {
        int32_t pairs[2 * MAX_GROUPS * MAX_SEQ_BLOCKS];
        S[6] = S[4];
        S[6].nblocks = 0;
        for (int j = 0; j < S[4].nblocks; j++) S[6].blocks[S[6].nblocks++] = sched_alloc(&sc);
        int n = 0; /* every group's blocks */
        for (int g = 0; g < g_groups; g++)
            for (int j = 0; j < S[4].nblocks; j++, n++)
                pairs[2 * n] = gblk(S[4].blocks[j], g), pairs[2 * n + 1] = gblk(S[6].blocks[j], g);
        if ((st = cpu_p->ops->copy_blocks(t.cpu, pairs, n, &e)) ||
            (st = cuda_p->ops->copy_blocks(t.eager, pairs, n, &e)) ||
            (st = cuda_p->ops->copy_blocks(t.graph, pairs, n, &e))) {
            printf("FAIL %s copy_blocks: %s\n", sh->name, e.message);
            g_fail++;
            goto out;
        }
        seq *ss[2] = {&S[4], &S[6]};
        int nn[2] = {1, 1};
        build(&sc, ss, nn, 2, false, &bb);
        if (!run_step(&t, sh->name, "decode original + copy_blocks fork", &bb)) goto out;
        char name[128];
        snprintf(name, sizeof name, "%s fork logits equal original (cuda)", sh->name);
        check(name, t.l_eager + sh->vocab, t.l_eager, 1, sh->vocab, 1e-6);
        advance(ss, nn, 2);
    }
    /* 6. swap seq 1 out to host blocks and back in to fresh device blocks */
    {
        int32_t out_pairs[2 * MAX_GROUPS * MAX_SEQ_BLOCKS], in_pairs[2 * MAX_GROUPS * MAX_SEQ_BLOCKS];
        const int nb = S[1].nblocks;
        int n = 0; /* every group's blocks, host block j * G + g */
        for (int j = 0; j < nb; j++) {
            const int32_t fresh = sched_alloc(&sc);
            for (int g = 0; g < g_groups; g++, n++) {
                out_pairs[2 * n] = gblk(S[1].blocks[j], g), out_pairs[2 * n + 1] = j * g_groups + g;
                in_pairs[2 * n] = j * g_groups + g, in_pairs[2 * n + 1] = gblk(fresh, g);
            }
            S[1].blocks[j] = fresh;
        }
        const plugin *ps[3] = {cpu_p, cuda_p, cuda_p};
        void *is[3] = {t.cpu, t.eager, t.graph};
        for (int i = 0; i < 3; i++)
            if ((st = ps[i]->ops->swap_blocks(is[i], LOOM_SWAP_OUT, out_pairs, n, &e)) ||
                (st = ps[i]->ops->swap_blocks(is[i], LOOM_SWAP_IN, in_pairs, n, &e))) {
                printf("FAIL %s swap_blocks: %s\n", sh->name, e.message);
                g_fail++;
                goto out;
            }
        seq *ss[1] = {&S[1]};
        int nn[1] = {1};
        build(&sc, ss, nn, 1, false, &bb);
        if (!run_step(&t, sh->name, "decode after swap out + in", &bb)) goto out;
        advance(ss, nn, 1);
    }
    /* 6a. block images (kv_read_blocks / kv_write_blocks) */
    if (g_groups == 1 && !check_block_images(&t, sh->name, &S[1], &sc, kvl.dtype)) goto out;
    /* 6b. draft-verification shapes, 1..8 tokens per sequence (graphs pad
     * each to 8 and the batch to bucket 8): all logits, then only the last
     * of each sequence — the second replays the first's graph */
    for (int round = 0; round < 2; round++) {
        seq *ss[5] = {&S[0], &S[2], &S[3], &S[4], &S[6]};
        int nn[5] = {3, 1, 5, 8, 2};
        build(&sc, ss, nn, 5, round == 0, &bb);
        if (!run_step(&t, sh->name, round ? "verify shapes 3/1/5/8/2, last logits" : "verify shapes 3/1/5/8/2, all logits",
                      &bb))
            goto out;
        advance(ss, nn, 5);
    }
    /* 7. pure decode runs: batch 6 (bucket 8), 3 (bucket 4), 1 (bucket 1) */
    {
        const int sizes[3] = {6, 3, 1};
        for (int k = 0; k < 3; k++) {
            for (int step = 0; step < 4; step++) {
                seq *ss[6] = {&S[0], &S[1], &S[2], &S[3], &S[4], &S[5]};
                int nn[6] = {1, 1, 1, 1, 1, 1};
                build(&sc, ss, nn, sizes[k], false, &bb);
                char label[64];
                snprintf(label, sizeof label, "decode batch %d step %d", sizes[k], step);
                if (!run_step(&t, sh->name, label, &bb)) goto out;
                advance(ss, nn, sizes[k]);
            }
        }
    }
    /* 8. a batch over max_batched_tokens is refused with INVALID */
    {
        seq *ss[1] = {&S[7]};
        int nn[1] = {1025};
        build(&sc, ss, nn, 1, false, &bb);
        loom_error e2 = {0};
        st = cuda_p->ops->forward(t.eager, &bb.b, t.l_eager, &e2);
        char name[128];
        snprintf(name, sizeof name, "%s 1025 tokens > max_batched_tokens -> INVALID", sh->name);
        expect_status(name, st, LOOM_ERR_INVALID, &e2);
    }
out:
    for (int i = 0; i < 3; i++)
        if (*inst[i]) pl[i]->ops->destroy(*inst[i]);
    free(c_cpu), free(c_e), free(c_g);
    free(t.l_cpu), free(t.l_eager), free(t.l_graph);
    fm_free(m);
    g_groups = 1;
    memset(g_gwin, 0, sizeof g_gwin);
}

/* ---------------------------------------------------- batch invariance */

/* Bitwise comparison of rows x V logits: PASS when no element differs
 * (and none is NaN). */
static void check_bits(const char *name, const float *a, const float *b, int rows, int V) {
    long differ = 0;
    bool bad = false;
    for (size_t i = 0; i < (size_t)rows * V; i++) {
        if (isnan(a[i]) || isnan(b[i])) bad = true;
        differ += memcmp(a + i, b + i, sizeof *a) != 0;
    }
    bool ok = !bad && differ == 0 && rows > 0;
    printf("%s %-64s %ld differ%s\n", ok ? "PASS" : "FAIL", name, differ, bad ? " (NaN)" : "");
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

/* Fork seqs[0] into dst (same tokens and progress, fresh blocks holding a
 * copy of its KV) on every instance. */
static bool fork_seq(const plugin *cuda_p, void *const *inst, int ninst, sched *sc, seq *src, seq *dst) {
    int32_t pairs[2 * MAX_SEQ_BLOCKS];
    *dst = *src;
    dst->nblocks = 0;
    for (int j = 0; j < src->nblocks; j++) {
        dst->blocks[dst->nblocks++] = sched_alloc(sc);
        pairs[2 * j] = src->blocks[j], pairs[2 * j + 1] = dst->blocks[j];
    }
    loom_error e = {0};
    for (int i = 0; i < ninst; i++)
        if (cuda_p->ops->copy_blocks(inst[i], pairs, src->nblocks, &e)) {
            printf("FAIL copy_blocks for a fork: %s\n", e.message);
            g_fail++;
            return false;
        }
    return true;
}

/* batch_invariant = true. After the same prefill of a ctx-token prompt (in
 * chunks of at most 600), one sequence's next 5 tokens are computed
 *   (a) as 5 decode steps of that sequence alone,
 *   (b) as one 5-token step (draft verification), twice on two forks,
 *   (c) as 5 tokens next to another sequence's decode and a third's
 *       3-token step (graphs: bucket 4 with a dummy sequence, every
 *       sequence padded to 5 tokens), twice,
 *   (d) as 5 tokens next to another sequence's 30-token prefill chunk;
 * (b)-(d) must reproduce (a)'s logits bit for bit, on an eager instance
 * and on one with CUDA graphs (whose decode steps and second (b) / (c)
 * replay captured graphs), and the two instances must agree with each
 * other. A third instance without the mode runs the same steps: its (a)
 * must agree with the invariant one within tol (the mode changes rounding,
 * not results). Forks start from the prefilled sequence's KV (copy_blocks). */
static void run_invariant(const plugin *cuda_p, const shape *sh, const loom_quant_binding *qb, int ctx,
                          double tol) {
    printf("--- batch_invariant %s%s%s%s, prompt %d tokens: decode x5 vs verify steps\n", sh->name,
           qb ? ", quantizer " : "", qb ? qb->name : "", sh->kv_fp8 ? ", fp8_e4m3 KV cache" : "", ctx);
    fake_model *m = fm_make(sh);
    const int V = sh->vocab, NI = 3;
    char dt_ov[32];
    snprintf(dt_ov, sizeof dt_ov, "dtype=%s", sh->dtype ? sh->dtype : "bf16");
    const char *ov[3][6] = {
        {"batch_invariant=true", "cuda_graphs=false", "max_batched_tokens=1024", dt_ov, sh->cuda_ov, NULL},
        {"batch_invariant=true", "cuda_graphs=true", "max_batched_tokens=1024", dt_ov, sh->cuda_ov, NULL},
        {"batch_invariant=false", "cuda_graphs=false", "max_batched_tokens=1024", dt_ov, sh->cuda_ov, NULL}};
    const char *iname[3] = {"eager", "graphs", "ordinary"};
    void *cfg[3] = {NULL, NULL, NULL}, *inst[3] = {NULL, NULL, NULL};
    float *L[3][6] = {{NULL}}; /* [instance][(a), (b), (b'), (c), (c'), (d)]: (5, V) each */
    float *step_out = malloc((size_t)64 * V * sizeof(float));
    loom_error e = {0};
    loom_status st;
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = BS, .num_blocks = NB,
                          .num_cpu_blocks = 0, .dtype = sh->kv_fp8 ? LOOM_DTYPE_FP8_E4M3 : LOOM_DTYPE_COUNT};
    const double replays0 = g_graph_replays;
    for (int i = 0; i < NI; i++) {
        cfg[i] = gpu_config_make(cuda_p->comp, ov[i]);
        for (int k = 0; k < 6; k++) L[i][k] = malloc((size_t)5 * V * sizeof(float));
        if ((st = cuda_p->ops->create(&g_host, cfg[i], &inst[i], &e)) ||
            (st = cuda_p->ops->load(inst[i], &m->view, qb, &e)) ||
            (st = cuda_p->ops->kv_alloc(inst[i], &kvl, &e))) {
            printf("FAIL batch_invariant %s setup of the %s instance: status %d: %s\n", sh->name, iname[i],
                   (int)st, e.message);
            g_fail++;
            goto out;
        }
    }
    {
        sched sc;
        sched_init(&sc);
        static seq S[8]; /* 0 the sequence, 1..5 its forks, 6 and 7 the others */
        memset(S, 0, sizeof S);
        for (int i = 0; i < 8; i++) {
            S[i].len = MAX_SEQ_BLOCKS * BS;
            for (int j = 0; j < S[i].len; j++) S[i].tokens[j] = (int32_t)(gpu_rng_next() % (uint64_t)V);
        }
        static batch_buf bb;
        /* one step on every instance; rows [0, keep) of its logits to out[i] */
#define INV_STEP(seqs_, nn_, n_, all_, out_k_, label_)                                                   \
    do {                                                                                                 \
        build(&sc, seqs_, nn_, n_, all_, &bb);                                                           \
        for (int i_ = 0; i_ < NI; i_++) {                                                                \
            if ((st = cuda_p->ops->forward(inst[i_], &bb.b, step_out, &e))) {                             \
                printf("FAIL batch_invariant %s %s (%s): forward status %d: %s\n", sh->name, label_,      \
                       iname[i_], (int)st, e.message);                                                   \
                g_fail++;                                                                                \
                goto out;                                                                                \
            }                                                                                            \
            if ((out_k_) >= 0) memcpy(L[i_][(out_k_) / 5] + (size_t)((out_k_) % 5) * V, step_out,      \
                                      (size_t)(bb.b.num_logits < 5 ? bb.b.num_logits : 5) * V * 4);      \
        }                                                                                                \
        advance(seqs_, nn_, n_);                                                                         \
    } while (0)
        /* prefill: the sequence in chunks, then the two others together */
        for (int done = 0; done < ctx;) {
            seq *ss[1] = {&S[0]};
            int nn[1] = {ctx - done < 600 ? ctx - done : 600};
            INV_STEP(ss, nn, 1, false, -1, "prefill");
            done += nn[0];
        }
        {
            seq *ss[2] = {&S[6], &S[7]};
            int nn[2] = {40, 50};
            INV_STEP(ss, nn, 2, false, -1, "prefill of the others");
        }
        for (int f = 1; f <= 5; f++)
            if (!fork_seq(cuda_p, inst, NI, &sc, &S[0], &S[f])) goto out;
        /* (a) five decode steps: row j of L[.][0] */
        for (int j = 0; j < 5; j++) {
            seq *ss[1] = {&S[0]};
            int nn[1] = {1};
            INV_STEP(ss, nn, 1, false, j, "decode");
        }
        /* (b), (b'): the five tokens in one step, alone */
        for (int r = 0; r < 2; r++) {
            seq *ss[1] = {&S[1 + r]};
            int nn[1] = {5};
            INV_STEP(ss, nn, 1, true, 5 * (1 + r), "verify alone");
        }
        /* (c), (c'): next to a decode and a 3-token step (its rows first) */
        for (int r = 0; r < 2; r++) {
            seq *ss[3] = {&S[3 + r], &S[6], &S[7]};
            int nn[3] = {5, 1, 3};
            INV_STEP(ss, nn, 3, true, 5 * (3 + r), "verify with others");
        }
        /* (d): next to a 30-token prefill chunk */
        {
            seq *ss[2] = {&S[5], &S[7]};
            int nn[2] = {5, 30};
            INV_STEP(ss, nn, 2, true, 25, "verify with a prefill chunk");
        }
#undef INV_STEP
    }
    {
        static const char *what[6] = {"decode", "5-token step", "5-token step again",
                                      "5 tokens + decode + 3 tokens", "the same again",
                                      "5 tokens + 30-token prefill chunk"};
        char name[200];
        for (int i = 0; i < 2; i++)
            for (int k = 1; k < 6; k++) {
                snprintf(name, sizeof name, "%s ctx %d %s: %s = decode x5", sh->name, ctx, iname[i], what[k]);
                check_bits(name, L[i][k], L[i][0], 5, V);
            }
        for (int k = 0; k < 6; k++) {
            snprintf(name, sizeof name, "%s ctx %d graphs = eager: %s", sh->name, ctx, what[k]);
            check_bits(name, L[1][k], L[0][k], 5, V);
        }
        snprintf(name, sizeof name, "%s ctx %d invariant vs ordinary decode (tolerance)", sh->name, ctx);
        check(name, L[0][0], L[2][0], 5, V, tol);
        long ord_differ = 0;
        for (size_t i = 0; i < (size_t)5 * V; i++) ord_differ += memcmp(L[2][1] + i, L[2][0] + i, 4) != 0;
        printf("INFO %s ctx %d ordinary mode: %ld of %d logits of the 5-token step differ from decode\n",
               sh->name, ctx, ord_differ, 5 * V);
        const bool replayed = g_graph_replays > replays0;
        printf("%s %-64s %.0f replays\n", replayed ? "PASS" : "FAIL", "  ... graphs replayed in this run",
               g_graph_replays - replays0);
        if (replayed) g_pass++;
        else g_fail++;
    }
out:
    for (int i = 0; i < NI; i++) {
        if (inst[i]) cuda_p->ops->destroy(inst[i]);
        free(cfg[i]);
        for (int k = 0; k < 6; k++) free(L[i][k]);
    }
    free(step_out);
    fm_free(m);
}

/* Fake quantizers whose plans the cuda backend must refuse: int8 for
 * attn_q alone (a fused Q/K/V group of mixed formats), and GGUF blocks as
 * stored for tensors that are bf16 (no blocks to read). */
static loom_status fq_plan_mixed(void *self, const loom_model_view *m, const loom_tensor *w,
                                 loom_quant_plan *out, loom_error *err) {
    (void)self, (void)m, (void)err;
    out->format = strstr(w->name ? w->name : "", "attn_q") ? LOOM_QFMT_INT8_W8A16 : LOOM_QFMT_NONE;
    return LOOM_OK;
}
static loom_status fq_plan_gguf(void *self, const loom_model_view *m, const loom_tensor *w,
                                loom_quant_plan *out, loom_error *err) {
    (void)self, (void)m, (void)err, (void)w;
    out->format = LOOM_QFMT_GGUF;
    return LOOM_OK;
}

static void test_quant_refused(const plugin *cuda_p, bool gguf) {
    shape sh = {"quant", LOOM_ARCH_LLAMA, 256, 128, 256, 1, 2, 2, 64, 10000, true, false, false, false, NULL};
    fake_model *m = fm_make(&sh);
    static const loom_quant_ops qmixed = {.struct_size = sizeof qmixed, .plan = fq_plan_mixed};
    static const loom_quant_ops qgguf = {.struct_size = sizeof qgguf, .plan = fq_plan_gguf};
    loom_quant_binding qb = {.struct_size = sizeof qb, .ops = gguf ? &qgguf : &qmixed,
                             .self = NULL, .name = gguf ? "fake-gguf" : "fake-int8"};
    void *cfg = gpu_config_make(cuda_p->comp, NULL), *inst = NULL;
    loom_error e = {0};
    loom_status st = cuda_p->ops->create(&g_host, cfg, &inst, &e);
    if (st == LOOM_OK) st = cuda_p->ops->load(inst, &m->view, &qb, &e);
    expect_status(gguf ? "quantizer planning GGUF for bf16 tensors -> load UNSUPPORTED"
                       : "quantizer planning int8 for attn_q only (mixed Q/K/V) -> UNSUPPORTED",
                  st, LOOM_ERR_UNSUPPORTED, &e);
    if (inst) cuda_p->ops->destroy(inst);
    free(cfg);
    fm_free(m);
}

/* ------------------------------------------------------- real quantizers */

typedef struct qplugin {
    void *lib;
    const loom_component *comp;
    const loom_quant_ops *ops;
} qplugin;

/* dlopen DIR/NAME/loom-quantizer-NAME.so (or DIR/loom-quantizer-NAME.so)
 * and find its quantizer NAME. */
static bool qplugin_open(qplugin *q, const char *dir, const char *name) {
    memset(q, 0, sizeof *q);
    q->comp = gpu_quantizer_find(&q->lib, dir, name);
    if (q->comp) q->ops = q->comp->ops;
    return q->comp != NULL;
}

/* Quantizers whose expert plans the cuda backend must refuse; their
 * quantize() is never reached (load refuses first): int8 for the routed
 * experts' gate only (gate and up are one fused matrix), and int4 in
 * groups of 48 for every expert matrix (the kernels take multiples of 32). */
static loom_status fq_plan_gate_exps(void *self, const loom_model_view *m, const loom_tensor *w, loom_quant_plan *out,
                                     loom_error *err) {
    (void)self, (void)m, (void)err;
    out->format = strstr(w->name ? w->name : "", "ffn_gate_exps") ? LOOM_QFMT_INT8_W8A16 : LOOM_QFMT_NONE;
    return LOOM_OK;
}
static loom_status fq_plan_exps_g48(void *self, const loom_model_view *m, const loom_tensor *w, loom_quant_plan *out,
                                    loom_error *err) {
    (void)self, (void)m, (void)err;
    const bool e = strstr(w->name ? w->name : "", "_exps") != NULL;
    out->format = e ? LOOM_QFMT_INT4_W4A16 : LOOM_QFMT_NONE;
    out->group_size = e ? 48 : 0;
    return LOOM_OK;
}
static loom_status fq_quantize_none(void *self, const loom_model_view *m, const loom_tensor *w,
                                    const loom_quant_plan *plan, loom_qtensor *out, loom_error *err) {
    (void)self, (void)m, (void)w, (void)plan, (void)out;
    return g_host.error(g_host.ctx, err, LOOM_ERR_INTERNAL, "fake quantizer: quantize() reached");
}
static void fq_release_none(void *self, loom_qtensor *q) { (void)self, (void)q; }

/* What the cuda backend refuses of a quantized mixture of experts, with a
 * message naming it: gate and up in different formats, an int4 group the
 * expert kernels do not take. */
static void test_moe_refused(const plugin *cuda_p, const shape *mixtral) {
    static const loom_quant_ops qgate = {.struct_size = sizeof qgate, .plan = fq_plan_gate_exps,
                                         .quantize = fq_quantize_none, .release = fq_release_none};
    static const loom_quant_ops qg48 = {.struct_size = sizeof qg48, .plan = fq_plan_exps_g48,
                                        .quantize = fq_quantize_none, .release = fq_release_none};
    const loom_quant_ops *ops[2] = {&qgate, &qg48};
    const char *what[2] = {"one fused matrix", "group_size a multiple of 32"};
    const char *label[2] = {"moe: int8 for the experts' gate only (not up) -> UNSUPPORTED",
                            "moe: int4 groups of 48 on the experts -> UNSUPPORTED"};
    for (int i = 0; i < 2; i++) {
        fake_model *m = fm_make(mixtral);
        loom_quant_binding qb = {.struct_size = sizeof qb, .ops = ops[i], .self = NULL, .name = "fake-exps"};
        void *cfg = gpu_config_make(cuda_p->comp, NULL), *inst = NULL;
        loom_error e = {0};
        loom_status st = cuda_p->ops->create(&g_host, cfg, &inst, &e);
        if (st == LOOM_OK) st = cuda_p->ops->load(inst, &m->view, &qb, &e);
        const bool named = strstr(e.message, what[i]) != NULL;
        expect_status(label[i], st == LOOM_ERR_UNSUPPORTED && !named ? LOOM_ERR_INTERNAL : st, LOOM_ERR_UNSUPPORTED,
                      &e);
        if (inst) cuda_p->ops->destroy(inst);
        free(cfg);
        fm_free(m);
    }
}

static void moe_quant_greedy(const plugin *cpu_p, const plugin *cuda_p, const shape *sh, const loom_quant_binding *qb,
                             double tie);

/* The whole run_shape sequence with quantizer `name` configured by
 * `overrides` on both backends: cuda's quantized kernels against the cpu
 * backend's (kernels/cpu/qlinear.c) on the same quantized weights. The cpu
 * backend keeps float32 activations where cuda has bf16, so W8A8 / FP8
 * activation codes differ now and then; tol says how much that may move. */
static void run_quant(const plugin *cpu_p, const plugin *cuda_p, const char *dir, const char *name,
                      const char *const *overrides, const char *label, const shape *sh,
                      double tol) {
    qplugin qp;
    if (!qplugin_open(&qp, dir, name)) {
        printf("FAIL quantizer %s: cannot open it from %s (set LOOM_QUANTIZER_DIR)\n", name, dir);
        g_fail++;
        return;
    }
    void *cfg = gpu_config_make(qp.comp, overrides), *self = NULL;
    loom_error e = {0};
    loom_status st = qp.ops->create(&g_host, cfg, &self, &e);
    if (st != LOOM_OK) {
        printf("FAIL quantizer %s create: %s\n", label, e.message);
        g_fail++;
        free(cfg);
        return;
    }
    loom_quant_binding qb = {.struct_size = sizeof qb, .ops = qp.ops, .self = self, .name = label};
    run_shape(cpu_p, cuda_p, sh, &qb, tol);
    if (sh->moe) moe_quant_greedy(cpu_p, cuda_p, sh, &qb, tol);
    qp.ops->destroy(self);
    free(cfg);
}

/* A SmoothQuant statistics file for shape sh (what `loom calibrate` would
 * write): per linear input random activation maxima with a few outlier
 * channels. Returns the path (static buffer) or NULL. */
static const char *write_calib(const shape *sh) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/gpu_backend_test_%d.act", (int)getpid());
    static const char *lin[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t qd = (int64_t)sh->heads * sh->head_dim;
    const int64_t width[7] = {sh->hidden, sh->hidden, sh->hidden, qd, sh->hidden, sh->hidden, sh->inter};
    qc_calib c = {.tokens = 256, .count = 7 * sh->layers};
    c.e = calloc((size_t)c.count, sizeof *c.e);
    for (int l = 0, i = 0; l < sh->layers; l++)
        for (int k = 0; k < 7; k++, i++) {
            qc_calib_entry *e = &c.e[i];
            snprintf(e->name, sizeof e->name, "blk.%d.%s.weight", l, lin[k]);
            e->cols = width[k];
            e->amax = malloc((size_t)e->cols * sizeof(float));
            /* Q/K/V and gate/up read one input: one vector each */
            const qc_calib_entry *same = k == 1 || k == 2 ? &c.e[i - k] : k == 5 ? &c.e[i - 1] : NULL;
            for (int64_t j = 0; j < e->cols; j++)
                e->amax[j] = same ? same->amax[j] : (gpu_rng_unif(0.1f, 2.0f) * (j % 37 == 5 ? 40.0f : 1.0f));
        }
    char why[256] = "";
    bool ok = qc_calib_write(path, &c, why, sizeof why);
    for (int i = 0; i < c.count; i++) free(c.e[i].amax);
    free(c.e);
    if (!ok) printf("FAIL writing %s: %s\n", path, why);
    return ok ? path : NULL;
}

/* Gemma 3 and Qwen3 shapes (run_shape, batch invariance with windows);
 * LOOM_GPU_BACKEND_TESTS=gemma runs only these. */
static void run_gemma(const plugin *cpu_p, const plugin *cuda_p) {
    /* Gemma 3 and Qwen3: head_dim 256 with MQA (Gemma 3 270M: 4 heads, 1
     * KV head, hidden 640) and windows shorter than the prompts (37: not a
     * block multiple; 16: one block), head_dim 64 with GQA 4; Qwen3's
     * QK-norm at head_dim 128; an FP8 KV cache and f16 on the Gemma shapes */
    const shape gemma[] = {
        {"gemma3-like-d256", LOOM_ARCH_GEMMA3, 1024, 640, 2048, 3, 4, 1, 256, 1000000, true, false, false, false, NULL,
         .window = 37},
        {"gemma3-like-d64-gqa4", LOOM_ARCH_GEMMA3, 512, 512, 1024, 4, 8, 2, 64, 1000000, true, false, false, true, NULL,
         .window = 16},
        {"gemma3-like-d256-f16", LOOM_ARCH_GEMMA3, 1024, 640, 2048, 3, 4, 1, 256, 1000000, true, false, false, false,
         "f16", .window = 37},
        {"qwen3-like-d128", LOOM_ARCH_QWEN3, 512, 256, 512, 2, 8, 2, 128, 1000000, false, false, false, false, NULL,
         .qk_norm = true},
    };
    for (size_t i = 0; i < sizeof gemma / sizeof gemma[0]; i++)
        run_shape(cpu_p, cuda_p, &gemma[i], NULL, TOL_CPU);
    {
        shape g8 = gemma[0];
        g8.name = "kvfp8-gemma3-like-d256", g8.kv_fp8 = true;
        run_shape(cpu_p, cuda_p, &g8, NULL, TOL_KV_FP8);
        /* block-table groups (the window-aware cache), one layer a block:
         * 3 layers (local, local, global) make 3 groups, 4 layers (one
         * more local) 4; windowed groups' old blocks -1 */
        shape gg[2] = {gemma[0], gemma[1]};
        gg[0].name = "grouped-gemma3-like-d256", gg[1].name = "grouped-gemma3-like-d64-gqa4";
        gg[0].want_groups = 3, gg[1].want_groups = 4;
        for (int i = 0; i < 2; i++) {
            gg[i].groups = true, gg[i].cuda_ov = "kv_groups=true";
            run_shape(cpu_p, cuda_p, &gg[i], NULL, TOL_CPU);
        }
    }
    /* batch invariance under sliding windows: the window start moves with
     * each token */
    run_invariant(cuda_p, &gemma[0], NULL, 30, TOL_CPU);
    run_invariant(cuda_p, &gemma[1], NULL, 1100, TOL_CPU);
}

/* ------------------------------------------- transformers' tiny mixtures */

/* The numbers of JSON array `key` in text (at most max), or -1. */
static int json_numbers(const char *text, const char *key, double *out, int max) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(text, pat);
    if (!p || !(p = strchr(p, '['))) return -1;
    int n = 0;
    for (p++; *p && *p != ']' && n < max;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p) {
            p++;
            continue;
        }
        out[n++] = v, p = end;
    }
    return n;
}

/* One batch of a single sequence in contiguous blocks [0, ...): tokens
 * [done, done + n) of `tok`, logits of every one (all) or the last. */
static void hf_batch(batch_buf *o, const int32_t *tok, int done, int n, bool all) {
    for (int j = 0; j < 64; j++) o->bt[j] = j;
    for (int j = 0; j < n; j++) {
        o->tok[j] = tok[done + j], o->pos[j] = done + j, o->slot[j] = done + j;
        o->lidx[j] = j;
    }
    if (!all) o->lidx[0] = n - 1;
    o->qs[0] = 0, o->qs[1] = n, o->ctx[0] = done + n;
    o->b = (loom_batch){.struct_size = sizeof o->b, .num_seqs = 1, .num_tokens = n, .token_ids = o->tok,
                        .positions = o->pos, .query_start = o->qs, .context_len = o->ctx, .block_table = o->bt,
                        .block_table_stride = 64, .slot_mapping = o->slot, .num_logits = all ? n : 1,
                        .logits_index = o->lidx};
}

/* PASS when value <= limit. */
static void hf_report(const char *name, double value, double limit) {
    const bool ok = value <= limit;
    printf("%s %-64s %.3e (limit %.1e)\n", ok ? "PASS" : "FAIL", name, value, limit);
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

static double hf_logp(const float *row, int V, int tok) {
    double mx = row[0], s = 0;
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < V; i++) s += exp((double)row[i] - mx);
    return (double)row[tok] - mx - log(s);
}
static int hf_argmax(const float *row, int V) {
    int b = 0;
    for (int i = 1; i < V; i++) b = row[i] > row[b] ? i : b;
    return b;
}

/* A tiny random checkpoint transformers wrote (tests/backend/data/moe/NAME:
 * safetensors + reference.json, float32 on its CPU, by
 * tests/e2e/gen_moe_reference.py) through the cuda backend in `dtype`:
 * teacher-forced log-probs of its 32 tokens in one prefill — their mean
 * |difference| to transformers' within mean_tol and, when max_tol > 0,
 * every one within max_tol — and the same argmax everywhere; then greedy
 * decoding one token at a time from its 8-token prompt (a CUDA graph per
 * step): the same 16 tokens. */
/* Where hf_moe_check loads the checkpoint from: its safetensors directory,
 * or llama.cpp's GGUF of it (tests/model/hf_gguf_image.h) in float32 or
 * with Q8_0 experts, which the cuda loader dequantizes to the compute type
 * (its MoE layer runs no GGUF blocks as stored). */
typedef enum { HF_SAFETENSORS, HF_GGUF, HF_GGUF_Q8_EXPERTS } hf_source;

/* The checkpoint `name` of `dir` from `src` on the cuda backend in
 * `dtype`: teacher-forced log-probs against transformers' (mean within
 * mean_tol, each within max_tol when > 0); with `exact`, also the argmax
 * at every position and the greedy tokens. */
static void hf_moe_check(const plugin *cuda_p, const char *dir, const char *name, const char *dtype, hf_source src,
                         double max_tol, double mean_tol, bool exact) {
    char path[1024], label[128];
    snprintf(path, sizeof path, "%s/%s/reference.json", dir, name);
    snprintf(label, sizeof label, "transformers %s%s (cuda %s)", name,
             src == HF_GGUF ? " as GGUF" : src == HF_GGUF_Q8_EXPERTS ? " as GGUF, Q8_0 experts" : "", dtype);
    FILE *f = fopen(path, "rb");
    static char text[1 << 16];
    size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[len] = 0;
    double tk[64], lp[64], am[64], pr[16], gr[32];
    const int nt = json_numbers(text, "tokens", tk, 64), nl = json_numbers(text, "logprobs", lp, 64);
    const int na = json_numbers(text, "argmax", am, 64), np = json_numbers(text, "prompt", pr, 16);
    const int ng = json_numbers(text, "greedy", gr, 32);
    if (nt < 2 || nl != nt || na != nt || np < 1 || ng < 1) {
        printf("FAIL %s: cannot read %s\n", label, path);
        g_fail++;
        return;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    loom_model_load_opts o = {.path = path, .format = "safetensors"};
    loom_model *m = NULL;
    loom_error e = {0};
    char dt_ov[32];
    snprintf(dt_ov, sizeof dt_ov, "dtype=%s", dtype);
    const char *ov[] = {"cuda_graphs=true", "max_batched_tokens=256", dt_ov, NULL};
    void *cfg = gpu_config_make(cuda_p->comp, ov), *inst = NULL;
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = BS, .num_blocks = 64, .dtype = LOOM_DTYPE_COUNT};
    loom_status st = loom_model_load(&o, &m, &e);
    gw img = {0};
    if (st == LOOM_OK && src != HF_SAFETENSORS) {
        const char *why = hf_gguf_image(m, (hm_gguf_opts){.q8_experts = src == HF_GGUF_Q8_EXPERTS}, &img);
        loom_model_free(m);
        m = NULL;
        if (why) {
            st = LOOM_ERR_INVALID;
            snprintf(e.message, sizeof e.message, "writing the GGUF: %s", why);
        } else {
            loom_model_load_opts og = {.path = name, .format = "gguf", .data = img.buf, .size = img.len};
            st = loom_model_load(&og, &m, &e);
        }
    }
    const loom_model_config *c = st ? NULL : loom_model_view_get(m)->config;
    static batch_buf bb;
    float *lg = NULL;
    if (st || (st = cuda_p->ops->create(&g_host, cfg, &inst, &e)) ||
        (st = cuda_p->ops->load(inst, loom_model_view_get(m), NULL, &e)) ||
        (st = cuda_p->ops->kv_alloc(inst, &kvl, &e))) {
        printf("FAIL %s: setup: %s\n", label, e.message);
        g_fail++;
        goto out;
    }
    const int V = c->vocab_size;
    int32_t tok[64];
    for (int i = 0; i < nt; i++) tok[i] = (int32_t)tk[i];
    lg = malloc((size_t)nt * V * 4);
    hf_batch(&bb, tok, 0, nt, true);
    if ((st = cuda_p->ops->forward(inst, &bb.b, lg, &e))) {
        printf("FAIL %s: forward: %s\n", label, e.message);
        g_fail++;
        goto out;
    }
    double worst = 0, mean = 0;
    long wrong = 0;
    for (int i = 0; i < nt; i++) {
        if (i > 0) {
            const double d = fabs(hf_logp(lg + (size_t)(i - 1) * V, V, tok[i]) - lp[i]);
            worst = d > worst ? d : worst, mean += d / (nt - 1);
        }
        wrong += hf_argmax(lg + (size_t)i * V, V) != (int)am[i];
    }
    char nm[256];
    snprintf(nm, sizeof nm, "%s: %d teacher-forced log-probs, mean |d| (max %.2e)", label, nt - 1, worst);
    hf_report(nm, mean, mean_tol);
    if (max_tol > 0) {
        snprintf(nm, sizeof nm, "%s: %d teacher-forced log-probs, max |d|", label, nt - 1);
        hf_report(nm, worst, max_tol);
    }
    if (!exact) goto out;
    snprintf(nm, sizeof nm, "%s: argmax at %d positions", label, nt);
    hf_report(nm, (double)wrong, 0);
    /* greedy from the prompt, one token a step (a fresh sequence in the
     * same blocks: its prefill overwrites the cache from position 0) */
    int32_t seq[64];
    for (int i = 0; i < np; i++) seq[i] = (int32_t)pr[i];
    int n = np, differ = 0;
    hf_batch(&bb, seq, 0, np, false);
    for (int s = 0; s < ng; s++) {
        if ((st = cuda_p->ops->forward(inst, &bb.b, lg, &e))) {
            printf("FAIL %s: greedy step %d: %s\n", label, s, e.message);
            g_fail++;
            goto out;
        }
        seq[n] = (int32_t)hf_argmax(lg, V);
        differ += seq[n] != (int32_t)gr[s];
        seq[n] = (int32_t)gr[s]; /* keep transformers' context */
        hf_batch(&bb, seq, n, 1, false);
        n++;
    }
    snprintf(nm, sizeof nm, "%s: %d greedy tokens, decode steps of one token", label, ng);
    hf_report(nm, (double)differ, 0);
out:
    if (inst) cuda_p->ops->destroy(inst);
    free(cfg), free(lg);
    loom_model_free(m);
    free(img.buf);
}

/* Greedy decoding of shape sh with quantizer qb on both backends: the cpu
 * backend's 16 greedy tokens from an 8-token prompt (one token a step),
 * then the cuda backend (CUDA graphs) fed the same tokens: its argmax at
 * every step must be the cpu's, except where the cpu's two best logits are
 * within `tie` (relative to the largest) — counted and printed, not failed:
 * W8A8 / FP8 activation codes from float32 and from bf16 rows may differ. */
static void moe_quant_greedy(const plugin *cpu_p, const plugin *cuda_p, const shape *sh, const loom_quant_binding *qb,
                             double tie) {
    enum { NP = 8, NG = 16 };
    fake_model *m = fm_make(sh);
    const int V = sh->vocab;
    char dt_ov[32], label[128];
    snprintf(dt_ov, sizeof dt_ov, "dtype=%s", sh->dtype ? sh->dtype : "bf16");
    snprintf(label, sizeof label, "%s %s: %d greedy tokens cuda vs cpu", sh->name, qb->name, NG);
    const char *ov[] = {"cuda_graphs=true", "max_batched_tokens=256", dt_ov, NULL};
    void *cfg[2] = {gpu_config_make(cpu_p->comp, NULL), gpu_config_make(cuda_p->comp, ov)}, *inst[2] = {NULL, NULL};
    const plugin *pl[2] = {cpu_p, cuda_p};
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = BS, .num_blocks = 64, .dtype = LOOM_DTYPE_COUNT};
    loom_error e = {0};
    loom_status st = LOOM_OK;
    static batch_buf bb;
    float *lg = malloc((size_t)V * 4);
    int32_t seq[NP + NG + 1];
    int differ = 0, ties = 0;
    for (int i = 0; i < 2 && !st; i++)
        if ((st = pl[i]->ops->create(&g_host, cfg[i], &inst[i], &e)) ||
            (st = pl[i]->ops->load(inst[i], &m->view, qb, &e)) || (st = pl[i]->ops->kv_alloc(inst[i], &kvl, &e)))
            break;
    if (st) {
        printf("FAIL %s: setup: %s\n", label, e.message);
        g_fail++;
        goto out;
    }
    for (int i = 0; i < NP; i++) seq[i] = (int32_t)((i * 37 + 11) % V);
    double gap[NG];
    for (int k = 0; k < 2; k++) { /* k 0: the cpu's tokens; 1: cuda on them */
        hf_batch(&bb, seq, 0, NP, false);
        for (int s = 0; s < NG; s++) {
            if ((st = pl[k]->ops->forward(inst[k], &bb.b, lg, &e))) {
                printf("FAIL %s: %s step %d: %s\n", label, k ? "cuda" : "cpu", s, e.message);
                g_fail++;
                goto out;
            }
            const int a = hf_argmax(lg, V);
            if (k == 0) {
                int b2 = a ? 0 : 1;
                for (int i = 0; i < V; i++) b2 = i != a && lg[i] > lg[b2] ? i : b2;
                gap[s] = (lg[a] - lg[b2]) / (fabs(lg[a]) > 1e-30 ? fabs(lg[a]) : 1e-30);
                seq[NP + s] = a;
            } else if (a != seq[NP + s]) {
                if (gap[s] < tie) ties++;
                else differ++;
            }
            hf_batch(&bb, seq, NP + s, 1, false);
        }
    }
    printf("%s %-64s %d differ (%d more at near-ties < %.0e)\n", differ ? "FAIL" : "PASS", label, differ, ties, tie);
    if (differ) g_fail++;
    else g_pass++;
out:
    for (int i = 0; i < 2; i++) {
        if (inst[i]) pl[i]->ops->destroy(inst[i]);
        free(cfg[i]);
    }
    free(lg);
    fm_free(m);
}

/* Mixtures of experts: Mixtral-like (8 experts, top-2, renormalised)
 * and Qwen2-MoE-like (QKV bias; 16 experts, top-4, not renormalised,
 * a shared expert behind its sigmoid gate). Steps of more than 16
 * (token, expert) pairs run the grouped GEMM (prefills, mixed steps, and
 * qwen2-moe-like's decode steps of 5 sequences and more), smaller ones the
 * per-pair GEMVs */
static void run_moe_shapes(const plugin *cpu_p, const plugin *cuda_p) {
    static const moe_spec mixtral = {8, 2, 64, 0, true}, qwen2moe = {16, 4, 32, 48, false},
                          qwen3moe = {16, 4, 32, 0, true};
    /* expert widths of 128: rows of 256 bytes, which the per-expert
     * cuBLASLt path needs (cb_moe_lt_pays) */
    static const moe_spec mixtral_w = {8, 2, 128, 0, true}, qwen2moe_w = {16, 4, 128, 48, false};
    const shape moe[] = {
        {"mixtral-like", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false, false, NULL,
         .moe = &mixtral},
        {"qwen2-moe-like", LOOM_ARCH_QWEN2_MOE, 384, 128, 128, 2, 4, 2, 32, 1000000, false, true, false, false, NULL,
         .moe = &qwen2moe},
        {"mixtral-like-f16", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false, false,
         "f16", .moe = &mixtral},
        {"qwen3-moe-like", LOOM_ARCH_QWEN3_MOE, 384, 128, 128, 2, 4, 2, 32, 1000000, false, false, false, false, NULL,
         .qk_norm = true, .moe = &qwen3moe}, /* QK-norm attention, norm_topk_prob */
        /* eager steps of more than 16 pairs run their experts as one
         * cuBLASLt GEMM each (the offsets read on the host, padded rows);
         * the graph instance's captured steps keep the grouped kernel. The
         * same 128-wide shape with the default (1024 rows an expert, more
         * than these steps have) keeps the grouped kernel everywhere */
        {"mixtral-like-expert-gemms", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false,
         false, NULL, .moe = &mixtral_w, .cuda_ov = "moe_expert_gemm_rows=1"},
        {"qwen2-moe-like-expert-gemms", LOOM_ARCH_QWEN2_MOE, 384, 128, 128, 2, 4, 2, 32, 1000000, false, true, false,
         false, NULL, .moe = &qwen2moe_w, .cuda_ov = "moe_expert_gemm_rows=1"},
        {"mixtral-like-128", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false, false, NULL,
         .moe = &mixtral_w},
        /* the grouped steps' expert GEMMs on mma.sync instead of the
         * default wgmma, graphs included */
        {"mixtral-like-mma", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false, false, NULL,
         .moe = &mixtral, .cuda_ov = "moe_wgmma_rows=0"},
        {"qwen2-moe-like-mma-f16", LOOM_ARCH_QWEN2_MOE, 384, 128, 128, 2, 4, 2, 32, 1000000, false, true, false,
         false, "f16", .moe = &qwen2moe, .cuda_ov = "moe_wgmma_rows=0"},
        /* the wgmma GEMMs over 128-row tiles in every grouped step (the
         * default, 64 rows an expert, is more than most of these steps have) */
        {"mixtral-like-wgmma-128", LOOM_ARCH_MIXTRAL, 512, 128, 128, 2, 4, 2, 32, 1000000, false, false, false,
         false, NULL, .moe = &mixtral, .cuda_ov = "moe_wgmma_128_rows=1"},
        {"qwen2-moe-like-wgmma-128-f16", LOOM_ARCH_QWEN2_MOE, 384, 128, 128, 2, 4, 2, 32, 1000000, false, true,
         false, false, "f16", .moe = &qwen2moe, .cuda_ov = "moe_wgmma_128_rows=1"},
    };
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        const double lt0 = g_moe_lt_layers, wg0 = g_moe_wg_layers, t0 = g_moe_wg128_layers;
        run_shape(cpu_p, cuda_p, &moe[i], NULL, TOL_CPU);
        /* the per-expert cuBLASLt path ran where asked for (the default,
         * 1024 rows an expert, is more than these steps have), the wgmma
         * GEMM (the default) wherever not turned off: in the cuBLASLt
         * shapes, their captured steps (cuda_ov is one key=value) */
        const char *ov = moe[i].cuda_ov ? moe[i].cuda_ov : "";
        const bool want_lt = !strcmp(ov, "moe_expert_gemm_rows=1"), ran_lt = g_moe_lt_layers > lt0;
        const bool want_wg = strcmp(ov, "moe_wgmma_rows=0") != 0, ran_wg = g_moe_wg_layers > wg0;
        /* 128-row tiles: where asked for, and never off wgmma */
        const bool want_128 = !strcmp(ov, "moe_wgmma_128_rows=1"), ran_128 = g_moe_wg128_layers > t0;
        const bool ok = want_lt == ran_lt && want_wg == ran_wg && (!want_128 || ran_128) && (want_wg || !ran_128);
        printf("%s %-64s %.0f / %.0f / %.0f layers\n", ok ? "PASS" : "FAIL",
               want_lt    ? "moe: eager steps ran one cuBLASLt GEMM an expert"
               : want_128 ? "moe: grouped steps ran the wgmma GEMM on 128-row tiles"
               : want_wg  ? "moe: grouped steps ran the wgmma GEMM (defaults)"
                          : "moe: grouped steps ran mma.sync (moe_wgmma_rows=0)",
               g_moe_lt_layers - lt0, g_moe_wg_layers - wg0, g_moe_wg128_layers - t0);
        g_pass += ok, g_fail += !ok;
    }
    test_moe_refused(cuda_p, &moe[0]);
    /* quantized experts (and attention): each quantizer on both backends,
     * cuda's expert kernels (moe_quant.cu) against the cpu backend's on the
     * same quantized weights; tolerances as for the dense quantized shapes.
     * int4 on qwen2-moe-like keeps the shared expert's down projection
     * (48 input columns) in bf16: groups of 32 do not divide it. */
    {
        const char *qdir = getenv("LOOM_QUANTIZER_DIR") ? getenv("LOOM_QUANTIZER_DIR") : LOOM_QUANTIZER_DIR_DEFAULT;
        const char *w8a16[] = {"mode=w8a16", NULL}, *w8a8[] = {"mode=w8a8", NULL};
        const char *fp8c[] = {"scales=per_channel", NULL}, *fp8t[] = {"scales=per_tensor", NULL};
        const char *i4g32[] = {"group_size=32", NULL};
        const char *i4g32s[] = {"group_size=32", "skip=token_embd,output,ffn_down_shexp", NULL};
        for (int i = 0; i < 2; i++) {
            run_quant(cpu_p, cuda_p, qdir, "int8", w8a16, "int8-w8a16", &moe[i], 3e-2);
            run_quant(cpu_p, cuda_p, qdir, "int8", w8a8, "int8-w8a8", &moe[i], 6e-2);
            run_quant(cpu_p, cuda_p, qdir, "fp8", i ? fp8t : fp8c, i ? "fp8-per-tensor" : "fp8-per-channel", &moe[i],
                      8e-2);
            run_quant(cpu_p, cuda_p, qdir, "int4", i ? i4g32s : i4g32, "int4-g32", &moe[i], 3e-2);
        }
        run_quant(cpu_p, cuda_p, qdir, "fp8", fp8c, "fp8-per-channel", &moe[2], 8e-2); /* f16 */
        /* routed experts in bf16 beside a quantized shared expert: decode's
         * few pairs take moe.cu's fused GEMVs, which must leave the shared
         * expert to the combine */
        const char *w8a16_sh[] = {"mode=w8a16", "skip=ffn_gate_exps,ffn_up_exps,ffn_down_exps", NULL};
        run_quant(cpu_p, cuda_p, qdir, "int8", w8a16_sh, "int8-w8a16-shared-expert", &moe[1], 3e-2);
    }
    /* LOOM_TEST_HF_MOE_DIR: tests/backend/data/moe (transformers' tiny
     * float32 checkpoints and references). f16 (2^-11 relative rounding)
     * keeps the router logits' error below the checkpoints' smallest
     * top-k gaps (router_min_gap: 2.2e-3 Qwen2-MoE, 1.4e-2 Mixtral), so
     * every log-prob is held to 2e-2 (measured on the H200: max 1.1e-2 /
     * 1.2e-2). bf16 (2^-9) can swap two experts at such a near-tie — one
     * position of the Qwen2-MoE checkpoint moves by 1.07 — so bf16 is held
     * to the mean (measured 2.9e-2 / 6.3e-2) and, with f16, to identical
     * argmax and greedy tokens. */
    const char *hf = getenv("LOOM_TEST_HF_MOE_DIR");
    if (hf) {
        static const char *const names[2] = {"mixtral", "qwen2_moe"};
        for (int i = 0; i < 2; i++) {
            hf_moe_check(cuda_p, hf, names[i], "bf16", HF_SAFETENSORS, 0, 1e-1, true);
            hf_moe_check(cuda_p, hf, names[i], "f16", HF_SAFETENSORS, 2e-2, 1e-2, true);
            /* the same checkpoint through llama.cpp's GGUF layout (Mixtral's
             * interleaved Q/K rows, stacked ffn_*_exps): the same bounds; with
             * Q8_0 experts (dequantized at load) the cpu test's bound on the
             * mean, 0.1, and no argmax (the codes move near-ties) */
            hf_moe_check(cuda_p, hf, names[i], "f16", HF_GGUF, 2e-2, 1e-2, true);
            hf_moe_check(cuda_p, hf, names[i], "f16", HF_GGUF_Q8_EXPERTS, 0, 1e-1, false);
        }
    } else {
        printf("SKIP transformers checkpoints: set LOOM_TEST_HF_MOE_DIR=tests/backend/data/moe\n");
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: gpu_backend_test [CUDA_BACKEND.so CPU_BACKEND.so [SEED]]\n"
               "  the cuda backend's logits against the cpu backend's on random models of several\n"
               "  shapes, dtypes and quantizers, eager and through CUDA graphs (needs a GPU). The .so\n"
               "  paths default to LOOM_CUDA_BACKEND_SO / LOOM_CPU_BACKEND_SO or the build tree;\n"
               "  quantizer plugins come from LOOM_QUANTIZER_DIR. LOOM_GPU_BACKEND_TESTS=moe: the\n"
               "  mixture-of-experts shapes only (LOOM_TEST_HF_MOE_DIR=tests/backend/data/moe adds\n"
               "  transformers' tiny checkpoints); =quant: the quantized dense shapes only. Ends with\n"
               "  'N passed, N failed'.\n");
        return 0;
    }
    host_init();
    const char *cuda_so = argc > 2 ? argv[1] : getenv("LOOM_CUDA_BACKEND_SO");
    const char *cpu_so = argc > 2 ? argv[2] : getenv("LOOM_CPU_BACKEND_SO");
    if (!cuda_so) cuda_so = LOOM_CUDA_BACKEND_DEFAULT;
    if (!cpu_so) cpu_so = LOOM_CPU_BACKEND_DEFAULT;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : (uint64_t)time(NULL);
    gpu_rng_seed(seed);
    printf("gpu_backend_test: seed %llu\n  cuda: %s\n  cpu:  %s\n", (unsigned long long)seed,
           cuda_so, cpu_so);
    plugin cpu_p, cuda_p;
    if (!plugin_open(&cuda_p, cuda_so, "cuda") || !plugin_open(&cpu_p, cpu_so, "cpu")) return 100;
    const char *only = getenv("LOOM_GPU_BACKEND_TESTS");
    if (only && !strcmp(only, "gemma")) {
        printf("gpu_backend_test: LOOM_GPU_BACKEND_TESTS=gemma: the Gemma 3 / Qwen3 shapes only\n");
        run_gemma(&cpu_p, &cuda_p);
        goto done;
    }
    if (only && !strcmp(only, "quant")) { /* the quantizer configs on dense shapes onwards only */
        printf("gpu_backend_test: LOOM_GPU_BACKEND_TESTS=quant: the quantized dense shapes only\n");
        goto quant;
    }
    if (only && !strcmp(only, "moe")) { /* the mixture-of-experts shapes only */
        run_moe_shapes(&cpu_p, &cuda_p);
        const bool dec = g_graph_replays > 0, pw = g_piecewise_replays > 0;
        printf("%s %-64s replays %.0f\n", dec ? "PASS" : "FAIL", "moe: decode graphs replayed", g_graph_replays);
        printf("%s %-64s replays %.0f\n", pw ? "PASS" : "FAIL", "moe: piecewise graphs replayed", g_piecewise_replays);
        g_pass += dec + pw, g_fail += !dec + !pw;
        printf("gpu_backend_test: %d passed, %d failed (seed %llu)\n", g_pass, g_fail, (unsigned long long)seed);
        return g_fail > 255 ? 255 : g_fail;
    }

    const shape shapes[] = {
        {"tiny-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, false, NULL},
        {"tiny-d64-f16", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, true, "f16"},
        {"tiny-d128-qwen2", LOOM_ARCH_QWEN2, 384, 384, 768, 2, 6, 2, 128, 1000000, false, true, false, true, NULL},
        {"d64-gqa8", LOOM_ARCH_LLAMA, 8192, 2048, 5632, 2, 32, 4, 64, 100000, true, false, false, false, NULL},
        {"llama3-8b-2layer", LOOM_ARCH_LLAMA, 32768, 4096, 14336, 2, 32, 8, 128, 500000, false, false, true, true, NULL},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        run_shape(&cpu_p, &cuda_p, &shapes[i], NULL, TOL_CPU);
    /* backend.trigger_first=true: every kernel lets the next launch before
     * its wait, the same arithmetic; the shapes after these set the default
     * back before their steps (the setting is per device) */
    {
        const size_t last = sizeof shapes / sizeof shapes[0] - 1; /* the Llama-3-8B-like one */
        shape wf0 = shapes[0], wf4 = shapes[last];
        wf0.name = "tiny-d64 trigger_first=true", wf0.cuda_ov = "trigger_first=true";
        wf4.name = "llama3-8b-2layer trigger_first=true", wf4.cuda_ov = "trigger_first=true";
        run_shape(&cpu_p, &cuda_p, &wf0, NULL, TOL_CPU);
        run_shape(&cpu_p, &cuda_p, &wf4, NULL, TOL_CPU);
    }
    run_gemma(&cpu_p, &cuda_p);
    run_moe_shapes(&cpu_p, &cuda_p);
    /* FP8 E4M3 KV cache on both backends: head dims 64 and 128, GQA 2 / 3 / 4,
     * a QKV bias, f16 compute, the Llama-3-8B-like shape */
    {
        const shape kv8[] = {
            {"kvfp8-tiny-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, false, NULL, NULL, true},
            {"kvfp8-tiny-d64-f16", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, true, "f16", NULL, true},
            {"kvfp8-d128-qwen2", LOOM_ARCH_QWEN2, 384, 384, 768, 2, 6, 2, 128, 1000000, false, true, false, true, NULL, NULL, true},
            {"kvfp8-smollm2-like", LOOM_ARCH_LLAMA, 2048, 576, 1536, 2, 9, 3, 64, 10000, true, false, false, false, NULL, NULL, true},
            {"kvfp8-llama3-8b-2layer", LOOM_ARCH_LLAMA, 32768, 4096, 14336, 2, 32, 8, 128, 500000, false, false, true, true, NULL, NULL, true},
        };
        for (size_t i = 0; i < sizeof kv8 / sizeof kv8[0]; i++)
            run_shape(&cpu_p, &cuda_p, &kv8[i], NULL, TOL_KV_FP8);
    }
    test_quant_refused(&cuda_p, false);
    test_quant_refused(&cuda_p, true);

    /* batch_invariant: prompts that end just short of a block boundary
     * (30: the 5 tokens cross 32) and past one split chunk (1100 keys:
     * chunks of 128 over 9 splits); GQA 2, 3 (SmolLM2's 9/3 heads), 4
     * (Llama-3-8B), 32 (MQA: the prefill shape), f16 */
    {
        const shape smol = {"smollm2-like", LOOM_ARCH_LLAMA, 2048, 576, 1536, 2, 9, 3, 64, 10000, true, false, false, false, NULL};
        const shape mqa = {"mqa-g32", LOOM_ARCH_LLAMA, 512, 2048, 1024, 1, 32, 1, 64, 10000, true, false, false, false, NULL};
        run_invariant(&cuda_p, &shapes[0], NULL, 30, TOL_CPU);
        run_invariant(&cuda_p, &shapes[1], NULL, 30, TOL_CPU);
        run_invariant(&cuda_p, &shapes[2], NULL, 30, TOL_CPU);
        run_invariant(&cuda_p, &smol, NULL, 30, TOL_CPU);
        run_invariant(&cuda_p, &smol, NULL, 1100, TOL_CPU);
        run_invariant(&cuda_p, &mqa, NULL, 70, TOL_CPU);
        run_invariant(&cuda_p, &shapes[4], NULL, 1100, TOL_CPU);
        /* with an FP8 KV cache: the decode of the codes is per element, so
         * the mode's bit-invariance must hold as with bf16 */
        shape smol8 = smol, big8 = shapes[4];
        smol8.kv_fp8 = big8.kv_fp8 = true;
        smol8.name = "kvfp8-smollm2-like", big8.name = "kvfp8-llama3-8b-2layer";
        run_invariant(&cuda_p, &smol8, NULL, 30, TOL_KV_FP8);
        run_invariant(&cuda_p, &smol8, NULL, 1100, TOL_KV_FP8);
        run_invariant(&cuda_p, &big8, NULL, 1100, TOL_KV_FP8);
    }

    /* every quantizer config on cuda vs cpu (same quantizer, same weights) */
quant:;
    const char *qdir = getenv("LOOM_QUANTIZER_DIR") ? getenv("LOOM_QUANTIZER_DIR")
                                                    : LOOM_QUANTIZER_DIR_DEFAULT;
    const shape qs_tiny = {"q-tiny-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, false, NULL};
    const shape qs_qwen = {"q-d128-qwen2", LOOM_ARCH_QWEN2, 384, 384, 768, 2, 6, 2, 128, 1000000, false, true, false, true, NULL};
    const shape qs_8b = {"q-llama3-8b-2layer", LOOM_ARCH_LLAMA, 32768, 4096, 14336, 2, 32, 8, 128, 500000, false, false, true, false, NULL};
    const char *w8a16[] = {"mode=w8a16", NULL}, *w8a8[] = {"mode=w8a8", NULL};
    const char *w8a16_lm[] = {"mode=w8a16", "skip=token_embd", NULL}; /* LM head quantized too */
    const char *fp8c[] = {"scales=per_channel", NULL}, *fp8t[] = {"scales=per_tensor", NULL};
    const char *i4g64[] = {"group_size=64", NULL}, *i4g128[] = {"group_size=128", NULL};
    const char *i4g32[] = {"group_size=32", NULL};
    run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16, "int8-w8a16", &qs_tiny, 3e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16_lm, "int8-w8a16+lm_head", &qs_qwen, 3e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a8, "int8-w8a8", &qs_tiny, 6e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a8, "int8-w8a8", &qs_qwen, 6e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8c, "fp8-per-channel", &qs_tiny, 8e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8t, "fp8-per-tensor", &qs_qwen, 8e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g64, "int4-g64", &qs_tiny, 3e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g32, "int4-g32", &qs_qwen, 3e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", &qs_8b, 3e-2);
    run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16, "int8-w8a16", &qs_8b, 3e-2); /* RoPE in W8A16's reduce */
    run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8c, "fp8-per-channel", &qs_8b, 8e-2);
    /* the fp8 quantizer asking for an E4M3 KV cache (kv_cache=fp8): both
     * backends hold one, as the engine would set it up */
    const char *fp8kv[] = {"scales=per_channel", "kv_cache=fp8", NULL};
    run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8kv, "fp8-per-channel+kv_cache=fp8", &qs_tiny, TOL_KV_FP8_QUANT);
    run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8kv, "fp8-per-channel+kv_cache=fp8", &qs_8b, TOL_KV_FP8_QUANT);
    /* backend.qgemv_tc_min_rows: the CUDA-core GEMV at every batch (9), and
     * the tensor-core one from a single row (1), W8A8 / FP8 / INT4 (INT4's
     * GEMVs read the row layout) */
    {
        shape tc9 = qs_tiny, tc1 = qs_tiny;
        tc9.name = "q-tiny-d64 qgemv_tc_min_rows=9 rows", tc9.cuda_ov = "qgemv_tc_min_rows=9";
        tc1.name = "q-tiny-d64 qgemv_tc_min_rows=1 rows", tc1.cuda_ov = "qgemv_tc_min_rows=1";
        tc9.cuda_ov2 = tc1.cuda_ov2 = "quant_layout=rows";
        for (int i = 0; i < 2; i++) {
            const shape *ts = i ? &tc1 : &tc9;
            run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a8, "int8-w8a8", ts, 6e-2);
            run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8c, "fp8-per-channel", ts, 8e-2);
            run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", ts, 3e-2);
        }
    }
    /* backend.quant_layout=rows: W8A16 / INT4 codes as uploaded (the
     * default repacks them at load into qtiled.cu's tiles), on the tiny
     * shape and the Llama-3-8B-like one: the one-row GEMVs with their fused
     * epilogues, qmma.cu, dequantize + cuBLASLt (steps of <= 100 tokens;
     * the tiled kernel's 256-row chunks and the tiled dequantize above its
     * bound are gpu_kernel_tests') */
    {
        shape tt = qs_tiny, t8b = qs_8b, tq = qs_qwen;
        tt.name = "q-tiny-d64 quant_layout=rows", tt.cuda_ov = "quant_layout=rows";
        t8b.name = "q-llama3-8b-2layer quant_layout=rows", t8b.cuda_ov = "quant_layout=rows";
        tq.name = "q-d128-qwen2 quant_layout=rows", tq.cuda_ov = "quant_layout=rows";
        run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16, "int8-w8a16", &tt, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16_lm, "int8-w8a16+lm_head", &tq, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", &tt, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", &t8b, 3e-2);
        /* the tiled kernels with every kernel triggering before its wait */
        shape w8b = qs_8b;
        w8b.name = "q-llama3-8b-2layer tiled trigger_first=true", w8b.cuda_ov = "trigger_first=true";
        run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", &w8b, 3e-2);
        /* backend.qtiled_epilogues (default true: the runs above have
         * RoPE + KV write in the tiled QKV's K-split reduce at one row, the
         * Llama-3-8B-like shape's 5 slices) off: RoPE as its own kernel there;
         * on the Qwen2-like shape (no split) SwiGLU then reaches the down
         * projection through cb_swiglu_down rather than gate|up's epilogue */
        shape e8b = qs_8b, eq = qs_qwen;
        e8b.name = "q-llama3-8b-2layer tiled qtiled_epilogues=false", e8b.cuda_ov = "qtiled_epilogues=false";
        eq.name = "q-d128-qwen2 tiled qtiled_epilogues=false", eq.cuda_ov = "qtiled_epilogues=false";
        run_quant(&cpu_p, &cuda_p, qdir, "int4", i4g128, "int4-g128", &e8b, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16, "int8-w8a16", &e8b, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a16_lm, "int8-w8a16+lm_head", &eq, 3e-2);
    }
    /* GGUF blocks as stored (int4 quantizer, source gguf) on both backends:
     * SmolLM2-like all-q4_1; Q4_K_M-like (q4_k with q6_k V and down: two
     * segments in Q/K/V) then a layer of three types in Q/K/V, with a q6_k
     * LM head; q8_0 / q4_0 on the Qwen2 shape (hidden 384: no k-quants);
     * Gemma 3 Q4_K_M-like q5_0 (rewritten as q8_0 by the cuda loader: one
     * segment with a q8_0 V), with a q5_0 LM head */
    {
#define Q40 LOOM_DTYPE_Q4_0
#define Q41 LOOM_DTYPE_Q4_1
#define Q80 LOOM_DTYPE_Q8_0
#define Q50 LOOM_DTYPE_Q5_0
#define Q4K LOOM_DTYPE_Q4_K
#define Q6K LOOM_DTYPE_Q6_K
#define BF LOOM_DTYPE_BF16
        static const loom_dtype all_q41[15] = {Q41, Q41, Q41, Q41, Q41, Q41, Q41,
                                               Q41, Q41, Q41, Q41, Q41, Q41, Q41, BF};
        static const loom_dtype km[15] = {Q4K, Q4K, Q6K, Q4K, Q4K, Q4K, Q6K,
                                          Q40, Q80, Q41, Q80, Q40, Q41, Q40, Q6K};
        static const loom_dtype q8q4[15] = {Q80, Q80, Q80, Q40, Q40, Q40, Q80,
                                            Q40, Q40, Q40, Q80, Q80, Q80, Q40, BF};
        static const loom_dtype q5m[15] = {Q50, Q50, Q80, Q4K, Q50, Q50, Q6K,
                                           Q50, Q50, Q50, Q4K, Q50, Q50, Q4K, Q50};
        const shape g_q41 = {"g-q4_1-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, false, NULL, all_q41};
        const shape g_km = {"g-q4_k_m-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, false, false, false, false, NULL, km};
        const shape g_qwen = {"g-q8_0-qwen2", LOOM_ARCH_QWEN2, 384, 384, 768, 2, 6, 2, 128, 1000000, false, true, false, false, NULL, q8q4};
        const shape g_q5m = {"g-q5_0-d64", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, false, false, false, false, NULL, q5m};
        const shape g_f16 = {"g-q4_1-d64-f16", LOOM_ARCH_LLAMA, 512, 256, 512, 2, 4, 2, 64, 10000, true, false, false, false, "f16", all_q41};
        const char *gg[] = {"source=gguf", NULL}, *gg_lm[] = {"source=gguf", "skip=token_embd", NULL};
        run_quant(&cpu_p, &cuda_p, qdir, "int4", gg, "gguf-as-stored", &g_q41, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", gg_lm, "gguf-as-stored+lm_head", &g_km, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", gg, "gguf-as-stored", &g_qwen, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", gg, "gguf-as-stored", &g_f16, 3e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "int4", gg_lm, "gguf-as-stored+lm_head", &g_q5m, 3e-2);
#undef Q40
#undef Q41
#undef Q80
#undef Q50
#undef Q4K
#undef Q6K
#undef BF
    }
    /* SmoothQuant: the smoothing vector reaches the device for both W8A8
     * formats (activations divided by it before quantization) */
    const char *calib = write_calib(&qs_qwen);
    if (!calib) g_fail++;
    else {
        char cal_ov[128];
        snprintf(cal_ov, sizeof cal_ov, "calibration=%s", calib);
        const char *w8a8_sq[] = {"mode=w8a8", "smoothquant=0.5", cal_ov, NULL};
        const char *fp8_sq[] = {"scales=per_channel", "smoothquant=0.5", cal_ov, NULL};
        run_quant(&cpu_p, &cuda_p, qdir, "int8", w8a8_sq, "int8-w8a8+smoothquant", &qs_qwen, 6e-2);
        run_quant(&cpu_p, &cuda_p, qdir, "fp8", fp8_sq, "fp8+smoothquant", &qs_qwen, 8e-2);
        unlink(calib);
    }
    /* batch_invariant with quantized weights: every M on one kernel (W8A8 / FP8 the fused GEMV,
     * INT4 the tiled kernel, then on the row layout its GEMV) */
    {
        const char *const *ovs[3] = {i4g64, fp8c, w8a8};
        const char *names[3] = {"int4", "fp8", "int8"}, *labels[3] = {"int4-g64", "fp8-per-channel", "int8-w8a8"};
        const double tols[3] = {3e-2, 8e-2, 6e-2};
        for (int i = 0; i < 3; i++) {
            qplugin qp;
            void *qcfg = NULL, *qself = NULL;
            loom_error qe = {0};
            if (!qplugin_open(&qp, qdir, names[i]) ||
                qp.ops->create(&g_host, qcfg = gpu_config_make(qp.comp, ovs[i]), &qself, &qe)) {
                printf("FAIL batch_invariant quantizer %s: cannot open or create it: %s\n", labels[i], qe.message);
                g_fail++;
                free(qcfg);
                continue;
            }
            loom_quant_binding qb = {.struct_size = sizeof qb, .ops = qp.ops, .self = qself, .name = labels[i]};
            run_invariant(&cuda_p, &qs_qwen, &qb, 30, tols[i]);
            if (i == 0) { /* int4 on the row layout too: the fused GEMV at every M */
                shape tq = qs_qwen;
                tq.name = "q-d128-qwen2 quant_layout=rows", tq.cuda_ov = "quant_layout=rows";
                run_invariant(&cuda_p, &tq, &qb, 30, tols[i]);
                /* tiled, QKV's K split (5 slices): a one-token step's RoPE in
                 * the reduce, the same bits as the separate kernel at more rows */
                run_invariant(&cuda_p, &qs_8b, &qb, 30, tols[i]);
            }
            qp.ops->destroy(qself);
            free(qcfg);
        }
    }

    bool replayed = g_graph_replays > 0 && g_graph_captures > 0;
    printf("%s %-64s captures %.0f, replays %.0f\n", replayed ? "PASS" : "FAIL",
           "CUDA graphs captured and replayed", g_graph_captures, g_graph_replays);
    if (replayed) g_pass++;
    else g_fail++;
    /* the trio's prefill and mixed steps replay the token buckets its
     * graphs instance captured at kv_alloc */
    replayed = g_piecewise_replays > 0;
    printf("%s %-64s replays %.0f\n", replayed ? "PASS" : "FAIL",
           "piecewise graphs (prefill, mixed steps) replayed", g_piecewise_replays);
    if (replayed) g_pass++;
    else g_fail++;
done:
    printf("gpu_backend_test: %d passed, %d failed (seed %llu)\n", g_pass, g_fail,
           (unsigned long long)seed);
    return g_fail > 255 ? 255 : g_fail;
}
