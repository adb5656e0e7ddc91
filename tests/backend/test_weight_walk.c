/*
 * tests/backend/test_weight_walk.c — the weight walk both backends load
 * through (plugins/backend/common/weight_walk.h), on the fake host and a
 * tiny in-memory model: which tensors it lists, the window a
 * tensor-parallel rank keeps of each (rows of Q/K/V, gate/up and the
 * vocabulary, input columns of O and down, bias slices), where each part
 * lands in its fused group, and what it refuses — a missing tensor, a
 * packed AWQ/GPTQ weight nothing can read, a quantized plan the backend
 * (hook) or the quantizer (no quantize()) cannot produce — leaving nothing
 * allocated.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "weight_walk.h"

/* ------------------------------------------------------- a tiny model */

#define TW_MAX 64

typedef struct tw_model {
    loom_model_config c;
    loom_tensor t[TW_MAX];
    char names[TW_MAX][64];
    int n;
    loom_model_view view;
} tw_model;

static const loom_tensor *tw_get(void *ctx, const char *name) {
    tw_model *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return &m->t[i];
    return NULL;
}

/* An f32 tensor (d0) or (d0, d1) of zeros; `packed`: a shape-only weight
 * with a `.qweight` beside it, as a packed AWQ/GPTQ checkpoint has. */
static void tw_add(tw_model *m, const char *name, int64_t d0, int64_t d1, bool packed) {
    cr_assert_lt(m->n, TW_MAX);
    int i = m->n++;
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    int64_t n = d0 * (d1 > 0 ? d1 : 1);
    m->t[i] = (loom_tensor){.struct_size = sizeof(loom_tensor), .dtype = LOOM_DTYPE_F32,
                            .ndim = d1 > 0 ? 2 : 1, .shape = {d0, d1 > 0 ? d1 : 0},
                            .device = LOOM_DEVICE_HOST, .name = m->names[i]};
    if (!packed) {
        m->t[i].data = calloc((size_t)n, sizeof(float));
        m->t[i].nbytes = (size_t)n * sizeof(float);
        return;
    }
    char q[64];
    snprintf(q, sizeof q, "%.*s.qweight", (int)(strlen(name) - 7), name);
    tw_add(m, q, d0, d1 / 8, false);
}

/* 2 layers, hidden 64, 4 heads of 16 (2 KV heads), FFN 128, vocab 100. */
static tw_model *tw_make(bool bias, bool untied, const char *packed) {
    tw_model *m = calloc(1, sizeof *m);
    m->c = (loom_model_config){.struct_size = sizeof m->c, .arch = LOOM_ARCH_LLAMA,
                               .vocab_size = 100, .hidden_size = 64, .intermediate_size = 128,
                               .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
                               .max_context = 128, .rope_theta = 10000, .rms_norm_eps = 1e-5f,
                               .tie_embeddings = !untied, .qkv_bias = bias};
    snprintf(m->c.name, sizeof m->c.name, "tiny");
    tw_add(m, "token_embd.weight", 100, 64, false);
    tw_add(m, "output_norm.weight", 64, -1, false);
    if (untied) tw_add(m, "output.weight", 100, 64, false);
    static const char *lin[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t shape[7][2] = {{64, 64}, {32, 64}, {32, 64}, {64, 64},
                                 {128, 64}, {128, 64}, {64, 128}};
    char name[64];
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, lin[k]);
            tw_add(m, name, shape[k][0], shape[k][1], packed && !strcmp(name, packed));
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        tw_add(m, name, 64, -1, false);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        tw_add(m, name, 64, -1, false);
        for (int k = 0; bias && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, lin[k]);
            tw_add(m, name, shape[k][0], -1, false);
        }
    }
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->c, .ctx = m,
                                .get = tw_get};
    return m;
}

static void tw_free(tw_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    free(m);
}

/* A communicator's collectives: check_load wants them; the walk calls none. */
static loom_status tw_reduce(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype,
                             void *stream, loom_error *err) {
    return LOOM_ERR_INTERNAL;
}
static loom_status tw_gather(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                             loom_dtype dtype, void *stream, loom_error *err) {
    return LOOM_ERR_INTERNAL;
}

/* The host of the test (fake_host() starts a fresh one, its allocation
 * count at zero). */
static const loom_host *g_h;

static void tw_setup(void) { g_h = fake_host(); }

/* Rank `rank` of `size` (size 0: a whole model, no communicator). */
static loom_status tw_walk(loom_ww *w, tw_model *m, int rank, int size, const loom_quant_binding *q,
                           const loom_ww_hooks *hk, loom_error *err) {
    loom_comm comm = {.struct_size = sizeof comm, .rank = rank, .size = size,
                      .all_reduce_sum = tw_reduce, .all_gather = tw_gather};
    loom_status st = loom_ww_begin(w, g_h, "backend test", "backend.test", false, &m->view,
                                   size ? &comm : NULL, err);
    if (st != LOOM_OK) return st;
    return loom_ww_collect(w, &m->view, q, hk, err);
}

static void tw_expect(const loom_ww_part *p, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    cr_assert(p->t, "%s: no tensor", p->name);
    cr_assert(p->r0 == r0 && p->nr == nr && p->c0 == c0 && p->nc == nc,
              "%s: window rows [%lld +%lld) cols [%lld +%lld), want [%lld +%lld) [%lld +%lld)",
              p->name, (long long)p->r0, (long long)p->nr, (long long)p->c0, (long long)p->nc,
              (long long)r0, (long long)nr, (long long)c0, (long long)nc);
}

/* -------------------------------------------------------------- tests */

Test(weight_walk, whole_model_lists_every_tensor_whole, .init = tw_setup) {
    tw_model *m = tw_make(false, false, NULL);
    loom_ww w;
    loom_error err = {0};
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(w.layers, 2);
    cr_assert_not(w.bias);
    cr_assert_null(w.out.t, "tied: no LM head tensor");
    cr_assert_not(loom_ww_any_quant(&w));
    tw_expect(&w.embed, 0, 100, 0, 64);
    tw_expect(&w.out_norm, 0, 1, 0, 64);
    const int64_t want[7][5] = {/* r0, nr, c0, nc, row in group */
                                {0, 64, 0, 64, 0},  {0, 32, 0, 64, 64}, {0, 32, 0, 64, 96},
                                {0, 64, 0, 64, 0},  {0, 128, 0, 64, 0}, {0, 128, 0, 64, 128},
                                {0, 64, 0, 128, 0}};
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < LOOM_WW_NLIN; k++) {
            const loom_ww_lin *li = &w.layer[l].lin[k];
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, loom_ww_lin_name(k));
            cr_assert_str_eq(li->w.name, name);
            tw_expect(&li->w, want[k][0], want[k][1], want[k][2], want[k][3]);
            cr_assert_eq(li->group_row, want[k][4], "%s", name);
            cr_assert_eq(li->plan.format, LOOM_QFMT_NONE);
        }
        tw_expect(&w.layer[l].attn_norm, 0, 1, 0, 64);
        cr_assert_null(w.layer[l].bias[0].t);
    }
    const int64_t gn[4] = {128, 64, 256, 64}, gk[4] = {64, 64, 64, 128};
    for (int g = 0; g < LOOM_WW_NGROUPS; g++)
        cr_assert(w.group[g].n == gn[g] && w.group[g].k == gk[g], "group %d: %lld x %lld", g,
                  (long long)w.group[g].n, (long long)w.group[g].k);
    loom_ww_free(&w);
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);
}

/* Gemma 3's flags ask for four more 1-D tensors a layer, listed whole; a
 * missing one is an error naming it. */
Test(weight_walk, gemma3_norms_listed_and_required, .init = tw_setup) {
    tw_model *m = tw_make(false, false, NULL);
    m->c.qk_norm = m->c.post_norms = true;
    loom_ww w;
    loom_error err = {0};
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "blk.0.attn_q_norm.weight"), "%s", err.message);
    char name[64];
    static const char *norms[] = {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"};
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[k]);
            tw_add(m, name, k < 2 ? 16 : 64, -1, false);
        }
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    for (int l = 0; l < 2; l++) {
        tw_expect(&w.layer[l].q_norm, 0, 1, 0, 16);
        tw_expect(&w.layer[l].k_norm, 0, 1, 0, 16);
        tw_expect(&w.layer[l].post_attn_norm, 0, 1, 0, 64);
        tw_expect(&w.layer[l].post_ffn_norm, 0, 1, 0, 64);
    }
    loom_ww_free(&w);
    m->c.qk_norm = m->c.post_norms = false; /* a Llama config lists none of them */
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    cr_assert(!w.layer[1].q_norm.t && !w.layer[1].post_ffn_norm.t);
    loom_ww_free(&w);
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);
}

Test(weight_walk, a_rank_keeps_its_rows_and_columns, .init = tw_setup) {
    tw_model *m = tw_make(true, true, NULL);
    loom_ww w;
    loom_error err = {0};
    cr_assert_eq(tw_walk(&w, m, 1, 2, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    /* rank 1 of 2: heads 2..3 (rows 32..63), KV head 1 (rows 16..31), FFN
     * columns 64..127, vocabulary rows 50..99 */
    cr_assert(w.bias && w.out.t);
    tw_expect(&w.embed, 50, 50, 0, 64);
    tw_expect(&w.out, 50, 50, 0, 64);
    const loom_ww_layer *ly = &w.layer[1];
    tw_expect(&ly->lin[LOOM_WW_Q].w, 32, 32, 0, 64);
    tw_expect(&ly->lin[LOOM_WW_K].w, 16, 16, 0, 64);
    tw_expect(&ly->lin[LOOM_WW_V].w, 16, 16, 0, 64);
    tw_expect(&ly->lin[LOOM_WW_O].w, 0, 64, 32, 32);
    tw_expect(&ly->lin[LOOM_WW_GATE].w, 64, 64, 0, 64);
    tw_expect(&ly->lin[LOOM_WW_UP].w, 64, 64, 0, 64);
    tw_expect(&ly->lin[LOOM_WW_DOWN].w, 0, 64, 64, 64);
    cr_assert(ly->lin[LOOM_WW_K].group_row == 32 && ly->lin[LOOM_WW_V].group_row == 48 &&
              ly->lin[LOOM_WW_UP].group_row == 64);
    tw_expect(&ly->bias[0], 0, 1, 32, 32);
    tw_expect(&ly->bias[1], 0, 1, 16, 16);
    tw_expect(&ly->bias[2], 0, 1, 16, 16);
    cr_assert(w.group[LOOM_WW_G_QKV].n == 64 && w.group[LOOM_WW_G_O].k == 32 &&
              w.group[LOOM_WW_G_GU].n == 128 && w.group[LOOM_WW_G_DOWN].k == 64);
    loom_ww_free(&w);
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);
}

Test(weight_walk, refuses_what_no_backend_can_load, .init = tw_setup) {
    loom_ww w;
    loom_error err = {0};
    tw_model *m = tw_make(false, false, NULL);
    m->c.qkv_bias = true; /* the config promises biases the file lacks */
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_ERR_NOT_FOUND);
    cr_assert(strstr(err.message, "backend test: model 'tiny' has no tensor 'blk.0.attn_q.bias'"),
              "%s", err.message);
    cr_assert_null(w.layer);
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);

    m = tw_make(false, false, "blk.1.ffn_up.weight");
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "backend test: tensor 'blk.1.ffn_up.weight' is stored only as "
                                  "packed 4-bit AWQ/GPTQ data, but the pipeline has no quantizer"),
              "%s", err.message);
    cr_assert_eq(fake_host_live_allocs(), 0);
    cr_assert_eq(tw_walk(&w, m, 0, 3, NULL, NULL, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "backend test: load_shard(): model 'tiny'"), "%s", err.message);
    cr_assert_eq(loom_ww_begin(&w, g_h, "backend test", "backend.test", true, &m->view, NULL, &err),
                 LOOM_ERR_INVALID);
    cr_assert_str_eq(err.message, "backend test: load() called twice; create a new instance per model");
    tw_free(m);
}

/* ------------------------------------------------- quantizer and hooks */

typedef struct tw_quant {
    loom_qformat fmt;     /* planned for every linear weight but the LM head */
    int hook_calls;
} tw_quant;

static loom_status tw_plan(void *self, const loom_model_view *mv, const loom_tensor *t,
                           loom_quant_plan *out, loom_error *err) {
    tw_quant *q = self;
    out->format = strcmp(t->name, "output.weight") ? q->fmt : LOOM_QFMT_NONE;
    out->group_size = 32;
    return LOOM_OK;
}

static loom_status tw_no_fp8(void *ctx, const loom_quant_binding *qb, const loom_tensor *t,
                             const char *name, const loom_quant_plan *plan, loom_error *err) {
    tw_quant *q = qb->self;
    q->hook_calls++;
    if (plan->format != LOOM_QFMT_FP8_W8A8) return LOOM_OK;
    return g_h->error(NULL, err, LOOM_ERR_UNSUPPORTED, "no fp8 kernel for %s", name);
}

Test(weight_walk, plans_go_through_the_backend_and_the_quantizer, .init = tw_setup) {
    tw_model *m = tw_make(false, true, NULL);
    tw_quant tq = {.fmt = LOOM_QFMT_INT8_W8A16};
    loom_quant_ops ops = {.struct_size = sizeof ops, .plan = tw_plan};
    loom_quant_binding qb = {.struct_size = sizeof qb, .ops = &ops, .self = &tq, .name = "tq"};
    loom_ww_hooks hk = {.ctx = NULL, .runnable = tw_no_fp8};
    loom_ww w;
    loom_error err = {0};
    /* int8 without quantize()/release(): refused, naming both */
    cr_assert_eq(tw_walk(&w, m, 0, 0, &qb, &hk, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "backend test: quantizer 'tq' planned format int8_w8a16 for "
                                  "tensor 'blk.0.attn_q.weight' but has no quantize()/release()"),
              "%s", err.message);
    cr_assert_eq(tq.hook_calls, 1);
    /* the backend's hook speaks first */
    tq.fmt = LOOM_QFMT_FP8_W8A8;
    cr_assert_eq(tw_walk(&w, m, 0, 0, &qb, &hk, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert_str_eq(err.message, "no fp8 kernel for blk.0.attn_q.weight");
    /* GGUF blocks are used as stored: no quantize() needed */
    tq.fmt = LOOM_QFMT_GGUF;
    tq.hook_calls = 0;
    cr_assert_eq(tw_walk(&w, m, 0, 0, &qb, &hk, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(tq.hook_calls, 14, "the hook sees every quantized plan");
    cr_assert(loom_ww_any_quant(&w));
    cr_assert_eq(w.out_plan.format, LOOM_QFMT_NONE);
    cr_assert_eq(w.layer[1].lin[LOOM_WW_DOWN].plan.format, LOOM_QFMT_GGUF);
    loom_ww_free(&w);
    loom_ww_free(&w); /* idempotent */
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);
}

/* ------------------------------------------------- mixture of experts */

/* tw_make's model as a mixture of 6 experts of width 16 with a shared
 * expert of width 32: every layer's dense FFN replaced by the router, the
 * stacked experts and the shared expert. */
static tw_model *tw_make_moe(void) {
    tw_model *m = tw_make(false, false, NULL);
    m->c.arch = LOOM_ARCH_QWEN2_MOE;
    m->c.num_experts = 6, m->c.num_experts_used = 2, m->c.expert_intermediate_size = 16;
    m->c.shared_expert_intermediate_size = 32;
    char name[64];
    for (int l = 0; l < 2; l++) {
        const struct {
            const char *s;
            int64_t d0, d1, d2;
        } t[] = {{"ffn_gate_inp", 6, 64, 0},   {"ffn_gate_exps", 6, 16, 64}, {"ffn_up_exps", 6, 16, 64},
                 {"ffn_down_exps", 6, 64, 16}, {"ffn_gate_shexp", 32, 64, 0}, {"ffn_up_shexp", 32, 64, 0},
                 {"ffn_down_shexp", 64, 32, 0}, {"ffn_gate_inp_shexp", 64, -1, 0}};
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[k].s);
            tw_add(m, name, t[k].d0, t[k].d2 > 0 ? t[k].d1 * t[k].d2 : t[k].d1, false);
            if (t[k].d2 > 0) { /* stacked: (experts, rows, cols) over the same zeros */
                loom_tensor *x = &m->t[m->n - 1];
                x->ndim = 3, x->shape[1] = t[k].d1, x->shape[2] = t[k].d2;
            }
        }
    }
    return m;
}

Test(weight_walk, experts_split_over_ranks, .init = tw_setup) {
    tw_model *m = tw_make_moe();
    loom_ww w;
    loom_error err = {0};
    cr_assert_eq(tw_walk(&w, m, 0, 0, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    const loom_ww_layer *ly = &w.layer[1];
    cr_assert(!ly->lin[LOOM_WW_GATE].w.t && !ly->lin[LOOM_WW_DOWN].w.t, "a MoE layer has no dense FFN");
    tw_expect(&ly->router, 0, 6, 0, 64);
    tw_expect(&ly->exps[0], 0, 96, 0, 64);
    tw_expect(&ly->exps[2], 0, 384, 0, 16);
    tw_expect(&ly->shexp[2].w, 0, 64, 0, 32);
    loom_ww_free(&w);
    /* rank 1 of 2: experts 3..5, shared-expert columns 16..31 */
    cr_assert_eq(tw_walk(&w, m, 1, 2, NULL, NULL, &err), LOOM_OK, "%s", err.message);
    ly = &w.layer[0];
    cr_assert(w.expert0 == 3 && w.experts == 3);
    tw_expect(&ly->router, 0, 6, 0, 64);
    tw_expect(&ly->exps[1], 48, 48, 0, 64);
    tw_expect(&ly->exps[2], 192, 192, 0, 16);
    tw_expect(&ly->shexp[0].w, 16, 16, 0, 64);
    tw_expect(&ly->shexp[2].w, 0, 64, 16, 16);
    tw_expect(&ly->shexp_gate, 0, 1, 0, 64);
    loom_ww_free(&w);
    /* 6 experts over 4 ranks: refused, nothing left allocated */
    cr_assert_eq(tw_walk(&w, m, 0, 4, NULL, NULL, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "6 experts") && strstr(err.message, "over 4 ranks"), "%s", err.message);
    cr_assert_eq(fake_host_live_allocs(), 0);
    tw_free(m);
}
