/*
 * tests/backend/test_cpu_backend.c — the cpu backend plugin (dlopen'd, on
 * the fake host) against a plain float64 Llama forward written here from
 * scratch (no shared kernels), on random tiny models: 2 layers, hidden 64,
 * 4 heads / 2 KV heads, FFN 128, vocab 97, in seven variants — Llama with
 * tied embeddings, Qwen2 (QKV bias, separate LM head, f16-stored weights the
 * backend must dequantize), Llama-3 RoPE scaling, Qwen3 (QK-norm), and the
 * mixtures of experts Qwen3-MoE (8 experts, top-2, renormalised), Qwen2-MoE
 * (6 experts, top-3, not renormalised, a shared expert, f16 weights) and
 * Mixtral (8 experts, top-2).
 *
 * Scenarios: one full prefill; the same prompt in 3 chunks then decoded;
 * 4 sequences of different lengths batched with mixed prefill chunks and
 * decodes (logits equal to the single-sequence runs); shuffled vs contiguous
 * block tables (bit-identical); f16 KV; swap out/in and copy-on-write block
 * copies; a MoE decode step that must not read the experts it did not
 * choose (their weights NaN); and the error paths (bad batch, bad layout, unsupported quant
 * plan, missing or misshapen tensors).
 *
 * Error measure: max |logit - reference| / max |reference logit| over every
 * compared row; float32 must stay under 1e-4 (observed ~1e-6).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "rng.h"
#include "loom/backend.h"
#include "tb_util.h"
#include "tiny_model.h"
#include "formats/dtype.h"

#define LOGIT_TOL 1e-4
#define LOGIT_TOL_F16KV 5e-3

/* ------------------------------------------------------------ tiny model */

typedef enum tm_variant { TM_LLAMA, TM_QWEN2, TM_LLAMA3, TM_QWEN3, TM_QWEN3_MOE, TM_QWEN2_MOE, TM_MIXTRAL } tm_variant;

/* The mixture-of-experts and Qwen3 variants on top of the Llama config:
 * Qwen3 QK-norm; 8 experts top-2 renormalised (Qwen3-MoE, Mixtral); 6
 * experts top-3 not renormalised plus a shared expert, QKV bias (Qwen2-MoE). */
static void tm_moe(tiny_model *m, tm_variant v) {
    loom_model_config *c = &m->cfg;
    static const loom_arch arch[] = {[TM_QWEN3] = LOOM_ARCH_QWEN3, [TM_QWEN3_MOE] = LOOM_ARCH_QWEN3_MOE,
                                     [TM_QWEN2_MOE] = LOOM_ARCH_QWEN2_MOE, [TM_MIXTRAL] = LOOM_ARCH_MIXTRAL};
    c->arch = arch[v];
    c->qk_norm = v == TM_QWEN3 || v == TM_QWEN3_MOE;
    c->qkv_bias = v == TM_QWEN2_MOE;
    if (v == TM_QWEN3) return;
    c->num_experts = v == TM_QWEN2_MOE ? 6 : 8;
    c->num_experts_used = v == TM_QWEN2_MOE ? 3 : 2;
    c->expert_intermediate_size = v == TM_MIXTRAL ? 48 : 32;
    c->shared_expert_intermediate_size = v == TM_QWEN2_MOE ? 40 : 0;
    c->moe_norm_topk = v != TM_QWEN2_MOE;
}

static tiny_model *tm_make(tm_variant v, test_rng *r) {
    tiny_model *m = calloc(1, sizeof *m);
    loom_model_config *c = &m->cfg;
    *c = (loom_model_config){.struct_size = sizeof *c,
                             .arch = v == TM_QWEN2 ? LOOM_ARCH_QWEN2 : LOOM_ARCH_LLAMA,
                             .vocab_size = 97,
                             .hidden_size = 64,
                             .intermediate_size = 128,
                             .num_layers = 2,
                             .num_heads = 4,
                             .num_kv_heads = 2,
                             .head_dim = 16,
                             .max_context = 1024,
                             .rope_theta = v == TM_QWEN2 ? 1000000.f : 10000.f,
                             .rms_norm_eps = 1e-5f,
                             .rope_scaling = v == TM_LLAMA3 ? LOOM_ROPE_SCALING_LLAMA3
                                                            : LOOM_ROPE_SCALING_NONE,
                             .rope_factor = 8,
                             .rope_low_freq_factor = 1,
                             .rope_high_freq_factor = 4,
                             .rope_original_context = 1024,
                             .tie_embeddings = v != TM_QWEN2,
                             .qkv_bias = v == TM_QWEN2,
                             .bos_token_id = 1,
                             .eos_token_id = 2};
    static const char *const names[] = {"llama", "qwen2", "llama3", "qwen3", "qwen3moe", "qwen2moe", "mixtral"};
    snprintf(c->name, sizeof c->name, "tiny-%s", names[v]);
    if (v >= TM_QWEN3) tm_moe(m, v);
    tiny_add_tensors(m, r, LOOM_DTYPE_F32,
                     v == TM_QWEN2 || v == TM_QWEN2_MOE ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32);
    return m;
}

/* ------------------------------------------------- float64 reference forward */

static void ref_rms(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* y (out) = W (out, in) x (in) [+ b] */
static void ref_matvec(double *y, const float *W, const float *b, const double *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < in; i++) s += (double)W[(int64_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* Transformers' default / linear / llama3 inverse frequencies. */
static void ref_freqs(const loom_model_config *c, double *f) {
    int D = c->head_dim;
    for (int i = 0; i < D / 2; i++) {
        double inv = 1.0 / pow((double)c->rope_theta, 2.0 * i / D);
        if (c->rope_scaling == LOOM_ROPE_SCALING_LINEAR) inv /= c->rope_factor;
        if (c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3) {
            double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double orig = c->rope_original_context, fac = c->rope_factor;
            double wl = 2 * M_PI / inv;
            if (wl > orig / lo) inv = inv / fac;
            else if (wl >= orig / hi) {
                double sm = (orig / wl - lo) / (hi - lo);
                inv = (1 - sm) * inv / fac + sm * inv;
            }
        }
        f[i] = inv;
    }
}

/* o (H) = the mixture-of-experts FFN of layer l on xn (H), as
 * loom/model.h states it: softmax over every expert, the top k (ties to the
 * lower index), renormalised when moe_norm_topk, each expert's SwiGLU
 * output times its weight, plus the sigmoid-gated shared expert. */
/* The experts ref_moe chose last in each layer (the NaN-poison test). */
static int g_ref_sel[8][64];

static void ref_moe(const tiny_model *m, int l, const double *xn, double *o) {
    const loom_model_config *c = &m->cfg;
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_used, I = c->expert_intermediate_size,
              S = c->shared_expert_intermediate_size, W = I > S ? I : S;
    double p[64], g[256], u[256], y[256], mx = -INFINITY, sum = 0;
    char nm[64];
#define W_(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), tiny_val(m, nm))
    cr_assert(E <= 64 && W <= 256 && H <= 256);
    ref_matvec(p, W_("ffn_gate_inp.weight"), NULL, xn, E, H);
    for (int e = 0; e < E; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < E; e++) sum += p[e] = exp(p[e] - mx);
    int sel[64];
    double wt[64], wsum = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
        if (l < 8) g_ref_sel[l][j] = best;
        wsum += wt[j] = p[best] / sum;
    }
    for (int i = 0; i < H; i++) o[i] = 0;
    for (int j = 0; j < K; j++) {
        const int e = sel[j];
        ref_matvec(g, W_("ffn_gate_exps.weight") + (int64_t)e * I * H, NULL, xn, I, H);
        ref_matvec(u, W_("ffn_up_exps.weight") + (int64_t)e * I * H, NULL, xn, I, H);
        for (int i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        ref_matvec(y, W_("ffn_down_exps.weight") + (int64_t)e * H * I, NULL, g, H, I);
        const double w = c->moe_norm_topk ? wt[j] / wsum : wt[j];
        for (int i = 0; i < H; i++) o[i] += w * y[i];
    }
    if (S == 0) return;
    ref_matvec(g, W_("ffn_gate_shexp.weight"), NULL, xn, S, H);
    ref_matvec(u, W_("ffn_up_shexp.weight"), NULL, xn, S, H);
    for (int i = 0; i < S; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    ref_matvec(y, W_("ffn_down_shexp.weight"), NULL, g, H, S);
    double d = 0;
    const float *gw = W_("ffn_gate_inp_shexp.weight");
    for (int i = 0; i < H; i++) d += gw[i] * xn[i];
    for (int i = 0; i < H; i++) o[i] += y[i] / (1 + exp(-d));
#undef W_
}

/* RMSNorm of each of n heads (D each) of z in place (Qwen3's QK-norm). */
static void ref_head_norm(double *z, int n, int D, const float *w, double eps) {
    for (int h = 0; h < n; h++) ref_rms(z + h * D, z + h * D, w, D, eps);
}

/* Logits (n, V) for every position of one sequence, by recomputing the
 * whole causal forward in float64. */
static void ref_forward(const tiny_model *m, const int32_t *tok, int n, double *logits) {
    const loom_model_config *c = &m->cfg;
    int H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, D = c->head_dim;
    int NH = c->num_heads, NKV = c->num_kv_heads, QD = NH * D, KVD = NKV * D;
    double *x = calloc((size_t)n * H, sizeof(double)), *xn = calloc(H, sizeof(double));
    double *q = calloc((size_t)n * QD, sizeof(double)), *k = calloc((size_t)n * KVD, sizeof(double));
    double *v = calloc((size_t)n * KVD, sizeof(double)), *att = calloc(QD, sizeof(double));
    double *o = calloc(H, sizeof(double)), *g = calloc(I, sizeof(double)), *u = calloc(I, sizeof(double));
    double *sc = calloc(n, sizeof(double)), freqs[128];
    ref_freqs(c, freqs);
    const float *emb = tiny_val(m, "token_embd.weight");
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++) x[t * H + i] = emb[(int64_t)tok[t] * H + i];
    char nm[64];
#define W(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), tiny_val(m, nm))
    for (int l = 0; l < c->num_layers; l++) {
        for (int t = 0; t < n; t++) {
            ref_rms(xn, x + t * H, W("attn_norm.weight"), H, c->rms_norm_eps);
            ref_matvec(q + t * QD, W("attn_q.weight"), c->qkv_bias ? W("attn_q.bias") : NULL, xn, QD, H);
            ref_matvec(k + t * KVD, W("attn_k.weight"), c->qkv_bias ? W("attn_k.bias") : NULL, xn, KVD, H);
            ref_matvec(v + t * KVD, W("attn_v.weight"), c->qkv_bias ? W("attn_v.bias") : NULL, xn, KVD, H);
            if (c->qk_norm) {
                ref_head_norm(q + t * QD, NH, D, W("attn_q_norm.weight"), c->rms_norm_eps);
                ref_head_norm(k + t * KVD, NKV, D, W("attn_k_norm.weight"), c->rms_norm_eps);
            }
            /* rotate_half RoPE at position t */
            for (int h = 0; h < NH + NKV; h++) {
                double *z = h < NH ? q + t * QD + h * D : k + t * KVD + (h - NH) * D;
                for (int i = 0; i < D / 2; i++) {
                    double a = t * freqs[i], z1 = z[i], z2 = z[i + D / 2];
                    z[i] = z1 * cos(a) - z2 * sin(a);
                    z[i + D / 2] = z2 * cos(a) + z1 * sin(a);
                }
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < NH; h++) {
                int kh = h / (NH / NKV);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < D; d++) s += q[t * QD + h * D + d] * k[j * KVD + kh * D + d];
                    sc[j] = s / sqrt((double)D);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < D; d++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++) s += sc[j] * v[j * KVD + kh * D + d];
                    att[h * D + d] = s / sum;
                }
            }
            ref_matvec(o, W("attn_output.weight"), NULL, att, H, QD);
            for (int i = 0; i < H; i++) x[t * H + i] += o[i];
            ref_rms(xn, x + t * H, W("ffn_norm.weight"), H, c->rms_norm_eps);
            if (c->num_experts > 0) {
                ref_moe(m, l, xn, o);
                for (int i = 0; i < H; i++) x[t * H + i] += o[i];
                continue;
            }
            ref_matvec(g, W("ffn_gate.weight"), NULL, xn, I, H);
            ref_matvec(u, W("ffn_up.weight"), NULL, xn, I, H);
            for (int i = 0; i < I; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            ref_matvec(o, W("ffn_down.weight"), NULL, g, H, I);
            for (int i = 0; i < H; i++) x[t * H + i] += o[i];
        }
    }
#undef W
    const float *head = c->tie_embeddings ? emb : tiny_val(m, "output.weight");
    for (int t = 0; t < n; t++) {
        ref_rms(xn, x + t * H, tiny_val(m, "output_norm.weight"), H, c->rms_norm_eps);
        ref_matvec(logits + (int64_t)t * V, head, NULL, xn, V, H);
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}

/* ------------------------------------------------------------ test driver */

typedef struct tb_opts {
    int threads;
    int kv_dtype;       /* 0 f32, 1 f16 */
    int block_size;
    int num_blocks;
    int num_cpu_blocks;
    uint64_t shuffle;   /* 0: blocks handed out in order */
    int weight_dtype;   /* 0 f32 (dequantized at load), 1 gguf (16-bit kept as stored) */
} tb_opts;

static void tb_start(tb *b, tiny_model *m, tb_opts o) {
    char msg[512];
    memset(b, 0, sizeof *b);
    cr_assert(tb_load_plugin(b, msg, sizeof msg), "%s", msg);
    const loom_host *host = fake_host();
    tb_config cfg = {.threads = o.threads, .kv_dtype = o.kv_dtype, .weight_dtype = o.weight_dtype};
    loom_error err = {0};
    cr_assert_eq(b->ops->create(host, &cfg, &b->self, &err), LOOM_OK, "create: %s", err.message);
    cr_assert_eq(b->ops->load(b->self, &m->view, NULL, &err), LOOM_OK, "load: %s", err.message);
    loom_kv_layout lay = {.struct_size = sizeof lay, .block_size = o.block_size,
                          .num_blocks = o.num_blocks, .num_cpu_blocks = o.num_cpu_blocks,
                          .dtype = o.kv_dtype ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32};
    cr_assert_eq(b->ops->kv_alloc(b->self, &lay, &err), LOOM_OK, "kv_alloc: %s", err.message);
    cr_assert(tb_blocks_init(b, o.block_size, o.num_blocks, o.shuffle));
}

/* Run one step; the logits rows (num_logits, V) go to *logits (malloc'd). */
static int32_t tb_run(tb *b, tb_seq **seqs, const int32_t *nnew, int32_t nseq, bool all_logits,
                      int V, float **logits) {
    tb_batch tbb;
    cr_assert(tb_build(b, seqs, nnew, nseq, all_logits, &tbb), "test ran out of KV blocks");
    size_t nf = (size_t)(tbb.batch.num_logits + 1) * V;
    *logits = malloc(sizeof(float) * nf);
    for (size_t i = 0; i < nf; i++) (*logits)[i] = NAN; /* poison: every row must be written */
    loom_error err = {0};
    loom_status st = b->ops->forward(b->self, &tbb.batch, *logits, &err);
    cr_assert_eq(st, LOOM_OK, "forward: %s", err.message);
    for (int32_t i = 0; i < nseq; i++) seqs[i]->done += nnew[i];
    int32_t nl = tbb.batch.num_logits;
    tb_batch_free(&tbb);
    return nl;
}

/* Relative error of one logits row vs the reference row; tracked as a max. */
static double row_err(const float *got, const double *ref, int V) {
    double num = 0, den = 1e-30;
    for (int i = 0; i < V; i++) {
        double d = fabs(got[i] - ref[i]);
        num = fmax(num, d != d ? INFINITY : d);
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}

static int32_t *random_tokens(test_rng *r, int n, int V) {
    int32_t *t = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) t[i] = (int32_t)rng_int(r, V);
    return t;
}

static const tm_variant all_variants[] = {TM_LLAMA, TM_QWEN2, TM_LLAMA3, TM_QWEN3, TM_QWEN3_MOE, TM_QWEN2_MOE,
                                          TM_MIXTRAL};
static const char *const variant_names[] = {"llama", "qwen2", "llama3", "qwen3", "qwen3moe", "qwen2moe", "mixtral"};
#define N_VARIANTS ((int)(sizeof all_variants / sizeof all_variants[0]))

/* ------------------------------------------------------------ scenarios */

Test(backend, full_prefill) {
    test_rng r = rng_seeded("backend.full_prefill");
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        tiny_model *m = tm_make(all_variants[vi], &r);
        int V = m->cfg.vocab_size, n = 37;
        int32_t *tok = random_tokens(&r, n, V);
        double *ref = malloc(sizeof(double) * n * V);
        ref_forward(m, tok, n, ref);
        tb b;
        tb_start(&b, m, (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 8});
        tb_seq s = {.tokens = tok, .len = n};
        tb_seq *ss[1] = {&s};
        int32_t nn[1] = {n};
        float *lg;
        cr_assert_eq(tb_run(&b, ss, nn, 1, true, V, &lg), n);
        double e = 0;
        for (int t = 0; t < n; t++) e = fmax(e, row_err(lg + (int64_t)t * V, ref + (int64_t)t * V, V));
        cr_assert_lt(e, LOGIT_TOL, "%s full prefill: rel err %g", variant_names[vi], e);
        fprintf(stderr, "[backend.full_prefill] %s rel err %.3g\n", variant_names[vi], e);
        free(lg);
        tb_close(&b);
        cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld host allocations",
                     fake_host_live_allocs());
        free(tok), free(ref);
        tiny_free(m);
    }
}

Test(backend, chunked_prefill_then_decode) {
    test_rng r = rng_seeded("backend.chunked_prefill_then_decode");
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        tiny_model *m = tm_make(all_variants[vi], &r);
        int V = m->cfg.vocab_size, prompt = 37, gen = 6, n = prompt + gen;
        int32_t *tok = random_tokens(&r, n, V);
        double *ref = malloc(sizeof(double) * n * V);
        ref_forward(m, tok, n, ref);
        tb b;
        tb_start(&b, m, (tb_opts){.threads = 3, .block_size = 16, .num_blocks = 8});
        tb_seq s = {.tokens = tok, .len = n};
        tb_seq *ss[1] = {&s};
        int32_t chunks[] = {13, 16, 8, 1, 1, 1, 1, 1, 1};
        double e = 0;
        for (int c = 0; c < 9; c++) {
            float *lg;
            int32_t nn[1] = {chunks[c]};
            cr_assert_eq(tb_run(&b, ss, nn, 1, true, V, &lg), chunks[c]);
            for (int j = 0; j < chunks[c]; j++) {
                int p = s.done - chunks[c] + j;
                e = fmax(e, row_err(lg + (int64_t)j * V, ref + (int64_t)p * V, V));
            }
            free(lg);
        }
        cr_assert_eq(s.done, n);
        cr_assert_lt(e, LOGIT_TOL, "%s chunked: rel err %g", variant_names[vi], e);
        tb_close(&b);
        free(tok), free(ref);
        tiny_free(m);
    }
}

/* The mixed schedule: 4 sequences; each step a mix of prefill chunks and
 * single decode tokens. Row order of `out`: per step, per sequence, its last
 * token. Returns rows written. */
#define MIX_SEQS 4
#define MIX_STEPS 6
static const int32_t mix_len[MIX_SEQS] = {26, 44, 12, 35};
static const int32_t mix_sched[MIX_STEPS][MIX_SEQS] = {
    {23, 16, 9, 10}, /* s0 whole prompt, s1 first chunk, s2 whole prompt, s3 chunk */
    {1, 16, 1, 21},  /* decodes and second chunks                                  */
    {1, 8, 1, 1},
    {1, 1, 0, 1},    /* s2 idle this step                                          */
    {0, 1, 1, 1},
    {0, 2, 0, 1},    /* a 2-token verify-like step                                 */
};

static int run_mix(tiny_model *m, tb_opts o, int32_t *const toks[MIX_SEQS], float *out,
                   int *row_seq, int *row_pos) {
    int V = m->cfg.vocab_size, rows = 0;
    tb b;
    tb_start(&b, m, o);
    tb_seq seqs[MIX_SEQS];
    for (int i = 0; i < MIX_SEQS; i++) seqs[i] = (tb_seq){.tokens = toks[i], .len = mix_len[i]};
    for (int st = 0; st < MIX_STEPS; st++) {
        tb_seq *ss[MIX_SEQS];
        int32_t nn[MIX_SEQS], ns = 0;
        for (int i = 0; i < MIX_SEQS; i++)
            if (mix_sched[st][i] > 0) ss[ns] = &seqs[i], nn[ns++] = mix_sched[st][i];
        float *lg;
        int32_t nl = tb_run(&b, ss, nn, ns, false, V, &lg);
        cr_assert_eq(nl, ns);
        for (int k = 0; k < ns; k++) {
            memcpy(out + (int64_t)rows * V, lg + (int64_t)k * V, sizeof(float) * V);
            row_seq[rows] = (int)(ss[k] - seqs);
            row_pos[rows] = ss[k]->done - 1;
            rows++;
        }
        free(lg);
    }
    for (int i = 0; i < MIX_SEQS; i++)
        cr_assert_eq(seqs[i].done, mix_len[i], "schedule covers seq %d", i);
    tb_close(&b);
    return rows;
}

Test(backend, mixed_batch_matches_single_sequences) {
    test_rng r = rng_seeded("backend.mixed_batch");
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        tiny_model *m = tm_make(all_variants[vi], &r);
        int V = m->cfg.vocab_size;
        int32_t *toks[MIX_SEQS];
        double *ref[MIX_SEQS];
        float *single[MIX_SEQS];
        for (int i = 0; i < MIX_SEQS; i++) {
            toks[i] = random_tokens(&r, mix_len[i], V);
            ref[i] = malloc(sizeof(double) * mix_len[i] * V);
            ref_forward(m, toks[i], mix_len[i], ref[i]);
            /* the same sequence alone, whole prompt at once, logits everywhere */
            tb b;
            tb_start(&b, m, (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 8});
            tb_seq s = {.tokens = toks[i], .len = mix_len[i]};
            tb_seq *ss[1] = {&s};
            int32_t nn[1] = {mix_len[i]};
            tb_run(&b, ss, nn, 1, true, V, &single[i]);
            tb_close(&b);
        }
        float *out = malloc(sizeof(float) * 64 * V);
        int row_seq[64], row_pos[64];
        int rows = run_mix(m, (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 32}, toks,
                           out, row_seq, row_pos);
        double e_ref = 0, e_single = 0;
        for (int k = 0; k < rows; k++) {
            int s = row_seq[k], p = row_pos[k];
            e_ref = fmax(e_ref, row_err(out + (int64_t)k * V, ref[s] + (int64_t)p * V, V));
            double sd[128];
            for (int i = 0; i < V; i++) sd[i] = single[s][(int64_t)p * V + i];
            e_single = fmax(e_single, row_err(out + (int64_t)k * V, sd, V));
        }
        fprintf(stderr, "[backend.mixed_batch] %s rows %d: vs float64 %.3g, vs single runs %.3g\n",
                variant_names[vi], rows, e_ref, e_single);
        cr_assert_lt(e_ref, LOGIT_TOL, "%s mixed batch vs reference: %g", variant_names[vi], e_ref);
        cr_assert_lt(e_single, LOGIT_TOL, "%s mixed batch vs single: %g", variant_names[vi],
                     e_single);
        for (int i = 0; i < MIX_SEQS; i++) free(toks[i]), free(ref[i]), free(single[i]);
        free(out);
        tiny_free(m);
    }
}

Test(backend, shuffled_block_table_is_bit_identical) {
    test_rng r = rng_seeded("backend.shuffled_blocks");
    tiny_model *m = tm_make(TM_LLAMA, &r);
    int V = m->cfg.vocab_size;
    int32_t *toks[MIX_SEQS];
    for (int i = 0; i < MIX_SEQS; i++) toks[i] = random_tokens(&r, mix_len[i], V);
    float *a = malloc(sizeof(float) * 64 * V), *c = malloc(sizeof(float) * 64 * V);
    int rs[64], rp[64];
    int na = run_mix(m, (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 40}, toks, a, rs, rp);
    int nc = run_mix(m,
                     (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 40,
                               .shuffle = rng_next(&r) | 1},
                     toks, c, rs, rp);
    cr_assert_eq(na, nc);
    cr_assert(!memcmp(a, c, sizeof(float) * na * V),
              "logits differ between contiguous and shuffled block tables");
    /* a different block size changes nothing but the tiling: close, not bitwise */
    int nd = run_mix(m,
                     (tb_opts){.threads = 2, .block_size = 5, .num_blocks = 64,
                               .shuffle = rng_next(&r) | 1},
                     toks, c, rs, rp);
    cr_assert_eq(nd, na);
    double e = 0;
    for (int k = 0; k < na; k++) {
        double row[128];
        for (int i = 0; i < V; i++) row[i] = a[(int64_t)k * V + i];
        e = fmax(e, row_err(c + (int64_t)k * V, row, V));
    }
    cr_assert_lt(e, LOGIT_TOL, "block size 5 vs 16: %g", e);
    for (int i = 0; i < MIX_SEQS; i++) free(toks[i]);
    free(a), free(c);
    tiny_free(m);
}

/* A decode step of one token reads only the experts it chose: every other
 * expert's weights are set to NaN (0 x NaN is NaN, so any read of them
 * would reach the logits), and the step still gives the float64
 * reference's logits: Qwen3-MoE at top-2 with float32 weights, Qwen2-MoE
 * (f16 weights) at top-3 and top-5, both dequantized and kept as stored
 * (weight_dtype gguf: the experts through the 16-bit kernels). */
Test(backend, moe_batch1_reads_only_chosen_experts) {
    test_rng r = rng_seeded("backend.moe_batch1");
    static const tm_variant vs[] = {TM_QWEN3_MOE, TM_QWEN2_MOE, TM_QWEN2_MOE};
    static const int32_t used[] = {0, 0, 5};
    for (int vi = 0; vi < 3; vi++) {
        tiny_model *m = tm_make(vs[vi], &r);
        if (used[vi]) m->cfg.num_experts_used = used[vi];
        const loom_model_config *c = &m->cfg;
        const int V = c->vocab_size, K = c->num_experts_used;
        int32_t tok = (int32_t)rng_int(&r, V);
        double *ref = malloc(sizeof(double) * V);
        ref_forward(m, &tok, 1, ref);
        char nm[64];
        int poisoned = 0;
        for (int l = 0; l < c->num_layers; l++)
            for (int e = 0; e < c->num_experts; e++) {
                bool chosen = false;
                for (int j = 0; j < K; j++) chosen |= g_ref_sel[l][j] == e;
                if (chosen) continue;
                static const char *const kinds[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
                for (int k = 0; k < 3; k++) {
                    snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, kinds[k]);
                    loom_tensor *t = (loom_tensor *)tiny_get(m, nm);
                    const int64_t n = t->shape[1] * t->shape[2];
                    for (int64_t i = 0; i < n; i++) {
                        if (t->dtype == LOOM_DTYPE_F16) ((_Float16 *)t->data)[e * n + i] = (_Float16)NAN;
                        else ((float *)t->data)[e * n + i] = NAN;
                    }
                }
                poisoned++;
            }
        cr_assert_eq(poisoned, c->num_layers * (c->num_experts - K));
        const int dtypes = vs[vi] == TM_QWEN2_MOE ? 2 : 1; /* an f32 model is float32 rows either way */
        for (int wd = 0; wd < dtypes; wd++) {
            tb b;
            tb_start(&b, m, (tb_opts){.threads = 2, .block_size = 16, .num_blocks = 4, .weight_dtype = wd});
            tb_seq s = {.tokens = &tok, .len = 1};
            tb_seq *ss[1] = {&s};
            int32_t nn[1] = {1};
            float *lg;
            cr_assert_eq(tb_run(&b, ss, nn, 1, true, V, &lg), 1);
            double e = row_err(lg, ref, V);
            fprintf(stderr, "[backend.moe_batch1] %s, top-%d, weight_dtype %s: %d of %d experts per layer NaN, "
                    "rel err %.3g\n",
                    variant_names[vs[vi]], K, wd ? "gguf" : "f32", c->num_experts - K, c->num_experts, e);
            cr_assert_lt(e, LOGIT_TOL, "%s, weight_dtype %d: a one-token step read an expert it did not choose, "
                         "or combined them wrongly (rel err %g)", variant_names[vs[vi]], wd, e);
            free(lg);
            tb_close(&b);
        }
        free(ref);
        tiny_free(m);
    }
}

Test(backend, f16_kv_cache) {
    test_rng r = rng_seeded("backend.f16_kv_cache");
    tiny_model *m = tm_make(TM_LLAMA3, &r);
    int V = m->cfg.vocab_size;
    int32_t *toks[MIX_SEQS];
    double *ref[MIX_SEQS];
    for (int i = 0; i < MIX_SEQS; i++) {
        toks[i] = random_tokens(&r, mix_len[i], V);
        ref[i] = malloc(sizeof(double) * mix_len[i] * V);
        ref_forward(m, toks[i], mix_len[i], ref[i]);
    }
    float *out = malloc(sizeof(float) * 64 * V);
    int rs[64], rp[64];
    int rows = run_mix(m, (tb_opts){.threads = 2, .kv_dtype = 1, .block_size = 16, .num_blocks = 32},
                       toks, out, rs, rp);
    double e = 0;
    for (int k = 0; k < rows; k++)
        e = fmax(e, row_err(out + (int64_t)k * V, ref[rs[k]] + (int64_t)rp[k] * V, V));
    fprintf(stderr, "[backend.f16_kv_cache] rel err %.3g\n", e);
    cr_assert_lt(e, LOGIT_TOL_F16KV, "f16 KV: rel err %g", e);
    for (int i = 0; i < MIX_SEQS; i++) free(toks[i]), free(ref[i]);
    free(out);
    tiny_free(m);
}

Test(backend, swap_and_copy_blocks) {
    test_rng r = rng_seeded("backend.swap_and_copy_blocks");
    tiny_model *m = tm_make(TM_LLAMA, &r);
    int V = m->cfg.vocab_size, n = 40, bs = 8;
    int32_t *tok = random_tokens(&r, n, V);
    double *ref = malloc(sizeof(double) * n * V);
    ref_forward(m, tok, n, ref);
    tb b;
    tb_start(&b, m, (tb_opts){.threads = 2, .block_size = bs, .num_blocks = 12, .num_cpu_blocks = 6});
    loom_error err = {0};
    tb_seq s = {.tokens = tok, .len = n};
    tb_seq *ss[1] = {&s};
    int32_t nn[1] = {30};
    float *lg;
    tb_run(&b, ss, nn, 1, false, V, &lg);
    free(lg);
    /* swap the sequence's 4 blocks out to host blocks 5,4,3,2 */
    int32_t out_pairs[8], in_pairs[8];
    for (int i = 0; i < s.nblocks; i++) out_pairs[2 * i] = s.blocks[i], out_pairs[2 * i + 1] = 5 - i;
    cr_assert_eq(b.ops->swap_blocks(b.self, LOOM_SWAP_OUT, out_pairs, s.nblocks, &err), LOOM_OK,
                 "%s", err.message);
    /* clobber the device blocks with another sequence's prefill */
    int32_t *other = random_tokens(&r, 32, V);
    tb_seq o = {.tokens = other, .len = 32};
    for (int i = 0; i < s.nblocks; i++) o.blocks[i] = s.blocks[i];
    o.nblocks = s.nblocks;
    tb_seq *os[1] = {&o};
    int32_t on[1] = {32};
    tb_run(&b, os, on, 1, false, V, &lg);
    free(lg);
    /* swap back in, into fresh device blocks */
    for (int i = 0; i < s.nblocks; i++) {
        int32_t fresh = b.free_list[--b.n_free];
        in_pairs[2 * i] = 5 - i, in_pairs[2 * i + 1] = fresh;
        s.blocks[i] = fresh;
    }
    cr_assert_eq(b.ops->swap_blocks(b.self, LOOM_SWAP_IN, in_pairs, s.nblocks, &err), LOOM_OK,
                 "%s", err.message);
    nn[0] = 1;
    tb_run(&b, ss, nn, 1, false, V, &lg);
    double e = row_err(lg, ref + (int64_t)30 * V, V);
    free(lg);
    cr_assert_lt(e, LOGIT_TOL, "decode after swap out/in: rel err %g", e);

    /* copy-on-write fork: copy the last (partial) block, then both forks decode */
    tb_seq f = s;
    int32_t last = s.blocks[s.nblocks - 1];
    f.blocks[f.nblocks - 1] = b.free_list[--b.n_free];
    int32_t pair[2] = {last, f.blocks[f.nblocks - 1]};
    cr_assert_eq(b.ops->copy_blocks(b.self, pair, 1, &err), LOOM_OK, "%s", err.message);
    int32_t *ftok = malloc(sizeof(int32_t) * n);
    memcpy(ftok, tok, sizeof(int32_t) * n);
    ftok[31] = (tok[31] + 1) % V; /* the fork diverges at position 31 */
    f.tokens = ftok;
    double *fref = malloc(sizeof(double) * n * V);
    ref_forward(m, ftok, n, fref);
    tb_seq *both[2] = {&s, &f};
    int32_t two[2] = {3, 3};
    cr_assert_eq(tb_run(&b, both, two, 2, false, V, &lg), 2);
    e = fmax(row_err(lg, ref + (int64_t)33 * V, V), row_err(lg + V, fref + (int64_t)33 * V, V));
    free(lg);
    cr_assert_lt(e, LOGIT_TOL, "forks after copy_blocks: rel err %g", e);

    /* bad pairs are errors, not crashes */
    int32_t bad[2] = {0, 99};
    cr_assert_eq(b.ops->copy_blocks(b.self, bad, 1, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "99"), "message names the bad block: %s", err.message);
    cr_assert_eq(b.ops->swap_blocks(b.self, LOOM_SWAP_OUT, bad, 1, &err), LOOM_ERR_INVALID);
    tb_close(&b);
    free(tok), free(ref), free(other), free(ftok), free(fref);
    tiny_free(m);
}

/* ------------------------------------------------------------ contracts */

static loom_status ep_noop_sum(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dt, void *stream,
                               loom_error *err) {
    (void)ctx, (void)rank, (void)buf, (void)count, (void)dt, (void)stream, (void)err;
    return LOOM_OK;
}

static loom_status ep_noop_gather(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                                  loom_dtype dt, void *stream, loom_error *err) {
    (void)ctx, (void)rank, (void)send, (void)recv, (void)count, (void)dt, (void)stream, (void)err;
    return LOOM_OK;
}

/* moe_dispatch: all_to_all needs the communicator's all_to_allv (ABI 2.5):
 * a MoE model sharded through an older communicator, or one that leaves
 * it NULL, is a load error naming both; all_reduce loads through it. */
Test(backend, moe_all_to_all_needs_all_to_allv) {
    tb b = {0};
    char msg[512];
    cr_assert(tb_load_plugin(&b, msg, sizeof msg), "%s", msg);
    test_rng r = rng_seeded("backend.moe_a2a");
    tiny_model *m = tm_make(TM_QWEN3_MOE, &r);
    const loom_host *host = fake_host();
    const loom_comm old = {.struct_size = offsetof(loom_comm, all_to_allv), .rank = 0, .size = 1,
                           .all_reduce_sum = ep_noop_sum, .all_gather = ep_noop_gather};
    const loom_comm none = {.struct_size = sizeof none, .rank = 0, .size = 1, .all_reduce_sum = ep_noop_sum,
                            .all_gather = ep_noop_gather};
    const loom_comm *comms[] = {&old, &none};
    for (int i = 0; i < 2; i++) {
        tb_config cfg = {.threads = 1, .moe_dispatch = 1};
        loom_error err = {0};
        cr_assert_eq(b.ops->create(host, &cfg, &b.self, &err), LOOM_OK, "%s", err.message);
        cr_assert_neq(b.ops->load_shard(b.self, &m->view, NULL, comms[i], &err), LOOM_OK);
        cr_assert(strstr(err.message, "all_to_allv") && strstr(err.message, "moe_dispatch"), "%s", err.message);
        b.ops->destroy(b.self);
        cfg.moe_dispatch = 0;
        cr_assert_eq(b.ops->create(host, &cfg, &b.self, &err), LOOM_OK, "%s", err.message);
        cr_assert_eq(b.ops->load_shard(b.self, &m->view, NULL, comms[i], &err), LOOM_OK, "%s", err.message);
        b.ops->destroy(b.self);
        b.self = NULL;
    }
    tb_config bad = {.threads = 1, .moe_dispatch = 2};
    loom_error err = {0};
    cr_assert_neq(b.ops->create(host, &bad, &b.self, &err), LOOM_OK);
    cr_assert(strstr(err.message, "moe_dispatch 2"), "%s", err.message);
    tb_close(&b);
    tiny_free(m);
}

Test(backend, descriptor_memory_and_sizes) {
    tb b = {0};
    char msg[512];
    cr_assert(tb_load_plugin(&b, msg, sizeof msg), "%s", msg);
    cr_assert_eq(b.desc->abi_major, LOOM_ABI_MAJOR);
    cr_assert_eq(b.desc->build_signature, LOOM_BUILD_SIGNATURE);
    cr_assert_eq(b.comp->config_size, sizeof(tb_config));
    cr_assert_eq(b.ops->struct_size, sizeof(loom_backend_ops));
    const char *keys[] = {"threads", "kv_dtype", "weight_dtype", "cpu_isa", "moe_dispatch"};
    size_t offs[] = {offsetof(tb_config, threads), offsetof(tb_config, kv_dtype),
                     offsetof(tb_config, weight_dtype), offsetof(tb_config, cpu_isa),
                     offsetof(tb_config, moe_dispatch)};
    for (int i = 0; i < 5; i++) {
        const loom_param *p = b.comp->params;
        while (p->key && strcmp(p->key, keys[i])) p++;
        cr_assert(p->key, "param %s missing", keys[i]);
        cr_assert_eq(p->offset, offs[i], "param %s offset", keys[i]);
        cr_assert(p->doc && *p->doc);
    }
    test_rng r = rng_seeded("backend.descriptor");
    tiny_model *m = tm_make(TM_QWEN2, &r);
    const loom_host *host = fake_host();
    loom_error err = {0};
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(b.ops->kv_block_bytes(b.self, 16, LOOM_DTYPE_F32), 0, "0 before load");
    cr_assert_eq(b.ops->load(b.self, &m->view, NULL, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(b.ops->load(b.self, &m->view, NULL, &err), LOOM_ERR_INVALID, "second load");
    /* 2 layers x (K + V) x 2 kv heads x 16 tokens x 16 dims x 4 bytes */
    cr_assert_eq(b.ops->kv_block_bytes(b.self, 16, LOOM_DTYPE_F32), (size_t)2 * 2 * 2 * 16 * 16 * 4);
    cr_assert_eq(b.ops->kv_block_bytes(b.self, 16, LOOM_DTYPE_F16), (size_t)2 * 2 * 2 * 16 * 16 * 2);
    cr_assert_eq(b.ops->kv_block_bytes(b.self, 16, LOOM_DTYPE_COUNT),
                 (size_t)2 * 2 * 2 * 16 * 16 * 2, "default kv dtype is the param (f16)");
    cr_assert_eq(b.ops->kv_block_bytes(b.self, 16, LOOM_DTYPE_BF16), 0);
    loom_backend_memory mem = {0};
    cr_assert_eq(b.ops->memory(b.self, &mem, &err), LOOM_OK);
    cr_assert(mem.total_bytes >= mem.free_bytes && mem.free_bytes > 0);
    /* params: 97*64 embed + 97*64 head + 64 norm + 2 layers of weights + biases */
    size_t params = 2 * 97 * 64 + 64 + 2 * (2 * 64 + 64 * 128 + 128 + 64 * 64 + 2 * 128 * 64 + 64 * 128);
    /* the f16 matrices (head and layers) stay 16-bit: 2 bytes less each */
    size_t f16_params = 0;
    for (int i = 0; i < m->n; i++)
        if (m->t[i].dtype == LOOM_DTYPE_F16 && m->t[i].ndim == 2)
            f16_params += (size_t)(m->t[i].shape[0] * m->t[i].shape[1]);
    cr_assert_gt(f16_params, params / 2, "the tiny qwen2 stores its matrices as f16");
    const size_t want = params * 4 - f16_params * 2;
    cr_assert_geq(mem.weight_bytes, want, "weight bytes %zu, want %zu", mem.weight_bytes, want);
    cr_assert_lt(mem.weight_bytes, want + 64 * 1024, "weight bytes %zu, want %zu", mem.weight_bytes, want);
    /* forward before kv_alloc */
    loom_batch empty = {.struct_size = sizeof empty};
    cr_assert_eq(b.ops->forward(b.self, &empty, NULL, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "kv_alloc"), "%s", err.message);
    /* layouts: unsupported dtype, too big */
    loom_kv_layout lay = {.struct_size = sizeof lay, .block_size = 16, .num_blocks = 4,
                          .dtype = LOOM_DTYPE_BF16};
    cr_assert_eq(b.ops->kv_alloc(b.self, &lay, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "bf16"), "%s", err.message);
    lay.dtype = LOOM_DTYPE_F32;
    lay.num_blocks = 2000000000;
    cr_assert_eq(b.ops->kv_alloc(b.self, &lay, &err), LOOM_ERR_NOMEM);
    cr_assert(strstr(err.message, "MiB") && strstr(err.message, "2000000000"), "%s", err.message);
    lay.num_blocks = 4;
    cr_assert_eq(b.ops->kv_alloc(b.self, &lay, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(b.ops->kv_alloc(b.self, &lay, &err), LOOM_ERR_INVALID, "second kv_alloc");
    /* an empty step is fine */
    cr_assert_eq(b.ops->forward(b.self, &empty, NULL, &err), LOOM_OK, "%s", err.message);
    b.ops->destroy(b.self);
    b.self = NULL;
    b.ops->destroy(NULL);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld", fake_host_live_allocs());
    tb_close(&b);
    tiny_free(m);
}

Test(backend, bad_batches_are_errors) {
    test_rng r = rng_seeded("backend.bad_batches");
    tiny_model *m = tm_make(TM_LLAMA, &r);
    int V = m->cfg.vocab_size;
    tb b;
    tb_start(&b, m, (tb_opts){.threads = 1, .block_size = 4, .num_blocks = 8});
    int32_t *tok = random_tokens(&r, 10, V);
    tb_seq s = {.tokens = tok, .len = 10};
    tb_seq *ss[1] = {&s};
    int32_t nn[1] = {6};
    tb_batch tbb;
    cr_assert(tb_build(&b, ss, nn, 1, false, &tbb));
    float *lg = malloc(sizeof(float) * V * 8);
    loom_error err = {0};
    struct {
        const char *what, *needle;
        void (*mutate)(tb_batch *);
    } cases[] = {
        {"token id", "vocabulary", NULL}, {"block id", "block_table", NULL},
        {"position", "position", NULL},   {"logits index", "logits_index", NULL},
        {"slot", "slot", NULL},           {"query_start", "query_start", NULL},
        {"context_len", "context_len", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tb_batch x = tbb;
        int32_t tok2[8], bt2[8], pos2[8], li2[8], qs2[2], ctx2[2];
        int64_t sl2[8];
        memcpy(tok2, tbb.tok, sizeof(int32_t) * 6), memcpy(pos2, tbb.pos, sizeof(int32_t) * 6);
        memcpy(bt2, tbb.bt, sizeof(int32_t) * tbb.batch.block_table_stride);
        memcpy(li2, tbb.lidx, sizeof(int32_t)), memcpy(sl2, tbb.slot, sizeof(int64_t) * 6);
        memcpy(qs2, tbb.qs, sizeof qs2), memcpy(ctx2, tbb.ctx, sizeof(int32_t));
        switch (i) {
        case 0: tok2[3] = V; break;
        case 1: bt2[1] = 8; break;
        case 2: pos2[5] = 6; break;
        case 3: li2[0] = 6; break;
        case 4: sl2[2] = 32; break;
        case 5: qs2[1] = 5; break;
        case 6: ctx2[0] = 999; break;
        }
        x.batch.token_ids = tok2, x.batch.block_table = bt2, x.batch.positions = pos2;
        x.batch.logits_index = li2, x.batch.slot_mapping = sl2, x.batch.query_start = qs2;
        x.batch.context_len = ctx2;
        memset(&err, 0, sizeof err);
        cr_assert_eq(b.ops->forward(b.self, &x.batch, lg, &err), LOOM_ERR_INVALID,
                     "bad %s accepted", cases[i].what);
        cr_assert(strstr(err.message, cases[i].needle), "bad %s: message '%s' lacks '%s'",
                  cases[i].what, err.message, cases[i].needle);
    }
    cr_assert_eq(b.ops->forward(b.self, NULL, lg, &err), LOOM_ERR_ABI);
    cr_assert_eq(b.ops->forward(b.self, &tbb.batch, lg, &err), LOOM_OK, "%s", err.message);
    tb_batch_free(&tbb);
    free(lg), free(tok);
    tb_close(&b);
    tiny_free(m);
}

/* A quantizer whose plan is INT8 for every attn_v weight. */
static loom_status q_plan(void *self, const loom_model_view *m, const loom_tensor *w,
                          loom_quant_plan *out, loom_error *err) {
    out->format = strstr(w->name, "attn_v") ? LOOM_QFMT_INT8_W8A16 : LOOM_QFMT_NONE;
    return LOOM_OK;
}

/* cpu_isa: portable and auto always create; a named set either runs here or
 * fails create naming it (never a silent fallback); out of range is bad
 * config. */
Test(backend, cpu_isa_param) {
    static const char *const names[] = {"auto", "avx512vnni", "avx512", "avx2", "portable"};
    tb b = {0};
    char msg[512];
    cr_assert(tb_load_plugin(&b, msg, sizeof msg), "%s", msg);
    const loom_host *host = fake_host();
    int ran = 0;
    for (int i = 0; i < 5; i++) {
        loom_error err = {0};
        tb_config cfg = {.weight_dtype = 1, .cpu_isa = i};
        void *self = NULL;
        loom_status st = b.ops->create(host, &cfg, &self, &err);
        if (st == LOOM_OK) {
            ran++;
            b.ops->destroy(self);
            continue;
        }
        cr_assert(i != 0 && i != 4, "cpu_isa %s must always create: %s", names[i], err.message);
        cr_assert_eq(st, LOOM_ERR_UNSUPPORTED, "%s: %s", names[i], err.message);
        cr_assert(strstr(err.message, names[i]) && strstr(err.message, "lacks"), "%s", err.message);
        cr_assert_null(self);
    }
    cr_assert_geq(ran, 2);
    loom_error err = {0};
    tb_config bad = {.cpu_isa = 5};
    void *self = NULL;
    cr_assert_eq(b.ops->create(host, &bad, &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "cpu_isa"), "%s", err.message);
    tb_close(&b);
}

Test(backend, load_errors) {
    test_rng r = rng_seeded("backend.load_errors");
    tb b = {0};
    char msg[512];
    cr_assert(tb_load_plugin(&b, msg, sizeof msg), "%s", msg);
    const loom_host *host = fake_host();
    loom_error err = {0};
    tiny_model *m = tm_make(TM_LLAMA, &r);

    /* quantizer asks for a format this backend lacks: named in the error */
    loom_quant_ops qops = {.struct_size = sizeof qops, .plan = q_plan};
    loom_quant_binding qb = {.struct_size = sizeof qb, .ops = &qops, .self = NULL, .name = "int8"};
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK);
    cr_assert_eq(b.ops->load(b.self, &m->view, &qb, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "blk.0.attn_v.weight") && strstr(err.message, "int8"), "%s",
              err.message);
    b.ops->destroy(b.self);
    /* a quantizer that keeps everything is fine */
    qops.plan = NULL;
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK);
    cr_assert_eq(b.ops->load(b.self, &m->view, &qb, &err), LOOM_OK, "%s", err.message);
    b.ops->destroy(b.self);

    /* missing tensor */
    strcpy(m->names[m->n - 1], "blk.1.ffn_down.weigh");
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK);
    cr_assert_eq(b.ops->load(b.self, &m->view, NULL, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "blk.1.ffn_down.weight"), "%s", err.message);
    b.ops->destroy(b.self);
    strcpy(m->names[m->n - 1], "blk.1.ffn_down.weight");
    /* wrong shape */
    m->t[m->n - 1].shape[1] = 127;
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK);
    cr_assert_eq(b.ops->load(b.self, &m->view, NULL, &err), LOOM_ERR_FORMAT);
    cr_assert(strstr(err.message, "blk.1.ffn_down.weight"), "%s", err.message);
    b.ops->destroy(b.self);
    m->t[m->n - 1].shape[1] = 128;
    /* a type the host cannot convert to f32 */
    m->t[3].dtype = LOOM_DTYPE_U8;
    m->t[3].nbytes = 64 * 64;
    cr_assert_eq(b.ops->create(host, NULL, &b.self, &err), LOOM_OK);
    cr_assert_neq(b.ops->load(b.self, &m->view, NULL, &err), LOOM_OK);
    cr_assert(strstr(err.message, m->names[3]), "%s", err.message);
    b.ops->destroy(b.self);
    m->t[3].dtype = LOOM_DTYPE_F32;
    /* bad config */
    tb_config bad = {.threads = -1};
    b.self = NULL;
    cr_assert_eq(b.ops->create(host, &bad, &b.self, &err), LOOM_ERR_INVALID);
    cr_assert_null(b.self);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld", fake_host_live_allocs());
    tb_close(&b);
    tiny_free(m);
}
