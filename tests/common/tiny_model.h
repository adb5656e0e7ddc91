/*
 * tests/common/tiny_model.h — a tiny random Llama / Qwen2-shaped model as a
 * loom_model_view, for tests that drive a backend without a GGUF file (the
 * cpu backend test and the tp shard test). The caller fills `cfg`; then
 * tiny_add_tensors draws every tensor the config asks for (embedding,
 * final norm, untied LM head, per layer norms, Q/K/V (+ biases when
 * qkv_bias, QK-norms when qk_norm), O, gate/up/down or, with num_experts,
 * the router and stacked experts (+ a shared expert)) from a seeded stream, keeping the float
 * values the backend should see (after f16 rounding) for references.
 * Header-only; every helper fails the current Criterion test on error.
 */
#ifndef LOOM_TEST_TINY_MODEL_H
#define LOOM_TEST_TINY_MODEL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/dtype.h"
#include "loom/model.h"
#include "rng.h"

#define TINY_MAX 96

typedef struct tiny_model {
    loom_model_config cfg;
    loom_model_view view;
    int n;
    loom_tensor t[TINY_MAX];
    char names[TINY_MAX][64];
    float *val[TINY_MAX]; /* values the backend should see (after dequantization) */
    void *raw[TINY_MAX];  /* stored bytes (f32 or f16)                              */
} tiny_model;

static inline const loom_tensor *tiny_get(void *ctx, const char *name) {
    tiny_model *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return &m->t[i];
    return NULL;
}
static inline int32_t tiny_count(void *ctx) { return ((tiny_model *)ctx)->n; }
static inline const loom_tensor *tiny_at(void *ctx, int32_t i) { return &((tiny_model *)ctx)->t[i]; }

static inline const float *tiny_val(const tiny_model *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return m->val[i];
    cr_assert_fail("tiny model has no tensor %s", name);
    return NULL;
}

/* Add a random tensor (rows x cols, or d0 x rows x cols when d0 > 0;
 * cols < 0: 1-D of rows) ~ offset + scale N(0,1). */
static inline void tiny_add3(tiny_model *m, test_rng *r, const char *name, int64_t d0, int64_t rows, int64_t cols,
                             double scale, double offset, loom_dtype dt) {
    cr_assert_lt(m->n, TINY_MAX);
    int i = m->n++;
    int64_t n = (d0 > 0 ? d0 : 1) * rows * (cols < 0 ? 1 : cols);
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    m->val[i] = malloc(sizeof(float) * (size_t)n);
    for (int64_t k = 0; k < n; k++) m->val[i][k] = (float)(offset + scale * rng_normal(r));
    if (dt == LOOM_DTYPE_F16) {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
        for (int64_t k = 0; k < n; k++) {
            _Float16 v = (_Float16)m->val[i][k];
            memcpy(&h[k], &v, 2);
            m->val[i][k] = (float)v;
        }
        m->raw[i] = h;
    } else {
        m->raw[i] = malloc(sizeof(float) * (size_t)n);
        memcpy(m->raw[i], m->val[i], sizeof(float) * (size_t)n);
    }
    m->t[i] = (loom_tensor){.struct_size = sizeof(loom_tensor),
                            .dtype = dt,
                            .ndim = cols < 0 ? 1 : 2,
                            .shape = {rows, cols < 0 ? 0 : cols},
                            .data = m->raw[i],
                            .nbytes = (size_t)n * loom_dtype_block_bytes(dt),
                            .device = LOOM_DEVICE_HOST,
                            .name = m->names[i]};
    if (d0 > 0) {
        m->t[i].ndim = 3;
        m->t[i].shape[0] = d0, m->t[i].shape[1] = rows, m->t[i].shape[2] = cols;
    }
}

static inline void tiny_add(tiny_model *m, test_rng *r, const char *name, int64_t rows, int64_t cols,
                            double scale, double offset, loom_dtype dt) {
    tiny_add3(m, r, name, 0, rows, cols, scale, offset, dt);
}

/* Layer l's routed (and shared) experts instead of a dense FFN; the router
 * a bit larger so the experts' weights differ. */
static inline void tiny_add_moe(tiny_model *m, test_rng *r, int l, loom_dtype wdt) {
    const loom_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, E = c->num_experts, I = c->expert_intermediate_size,
                  S = c->shared_expert_intermediate_size;
    char name[64];
#define ADD3(suffix, d0, rows, cols, scale, dt)                                                    \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                       \
        tiny_add3(m, r, name, d0, rows, cols, scale, 0, dt);                                       \
    } while (0)
    ADD3("ffn_gate_inp.weight", 0, E, H, 3.0 / sqrt((double)H), LOOM_DTYPE_F32);
    ADD3("ffn_gate_exps.weight", E, I, H, 1.0 / sqrt((double)H), wdt);
    ADD3("ffn_up_exps.weight", E, I, H, 1.0 / sqrt((double)H), wdt);
    ADD3("ffn_down_exps.weight", E, H, I, 1.0 / sqrt((double)I), wdt);
    if (S > 0) {
        ADD3("ffn_gate_shexp.weight", 0, S, H, 1.0 / sqrt((double)H), wdt);
        ADD3("ffn_up_shexp.weight", 0, S, H, 1.0 / sqrt((double)H), wdt);
        ADD3("ffn_down_shexp.weight", 0, H, S, 1.0 / sqrt((double)S), wdt);
        ADD3("ffn_gate_inp_shexp.weight", 0, H, -1, 1.0 / sqrt((double)H), LOOM_DTYPE_F32);
    }
#undef ADD3
}

/* Every tensor m->cfg asks for: the embedding in `emb_dt`, matrices in
 * `wdt`, norms and biases in f32; then the view over them. */
static inline void tiny_add_tensors(tiny_model *m, test_rng *r, loom_dtype emb_dt, loom_dtype wdt) {
    const loom_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    int64_t QD = (int64_t)c->num_heads * c->head_dim, KVD = (int64_t)c->num_kv_heads * c->head_dim;
    tiny_add(m, r, "token_embd.weight", V, H, 1.0, 0, emb_dt);
    tiny_add(m, r, "output_norm.weight", H, -1, 0.1, 1, LOOM_DTYPE_F32);
    if (!c->tie_embeddings) tiny_add(m, r, "output.weight", V, H, 1.0, 0, wdt);
    char name[64];
    for (int l = 0; l < c->num_layers; l++) {
#define ADD(suffix, rows, cols, scale, off, dt)                                                    \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                       \
        tiny_add(m, r, name, rows, cols, scale, off, dt);                                          \
    } while (0)
        ADD("attn_norm.weight", H, -1, 0.1, 1, LOOM_DTYPE_F32);
        /* a bit larger Q/K so attention is not uniform */
        ADD("attn_q.weight", QD, H, 2.0 / sqrt((double)H), 0, wdt);
        ADD("attn_k.weight", KVD, H, 2.0 / sqrt((double)H), 0, wdt);
        ADD("attn_v.weight", KVD, H, 1.0 / sqrt((double)H), 0, wdt);
        if (c->qkv_bias) {
            ADD("attn_q.bias", QD, -1, 0.3, 0, LOOM_DTYPE_F32);
            ADD("attn_k.bias", KVD, -1, 0.3, 0, LOOM_DTYPE_F32);
            ADD("attn_v.bias", KVD, -1, 0.3, 0, LOOM_DTYPE_F32);
        }
        if (c->qk_norm) {
            ADD("attn_q_norm.weight", c->head_dim, -1, 0.2, 1, LOOM_DTYPE_F32);
            ADD("attn_k_norm.weight", c->head_dim, -1, 0.2, 1, LOOM_DTYPE_F32);
        }
        ADD("attn_output.weight", H, QD, 1.0 / sqrt((double)QD), 0, wdt);
        ADD("ffn_norm.weight", H, -1, 0.1, 1, LOOM_DTYPE_F32);
        if (c->num_experts > 0) {
            tiny_add_moe(m, r, l, wdt);
            continue;
        }
        ADD("ffn_gate.weight", I, H, 1.0 / sqrt((double)H), 0, wdt);
        ADD("ffn_up.weight", I, H, 1.0 / sqrt((double)H), 0, wdt);
        ADD("ffn_down.weight", H, I, 1.0 / sqrt((double)I), 0, wdt);
#undef ADD
    }
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->cfg, .ctx = m,
                                .get = tiny_get, .count = tiny_count, .at = tiny_at};
}

static inline void tiny_free(tiny_model *m) {
    for (int i = 0; i < m->n; i++) free(m->val[i]), free(m->raw[i]);
    free(m);
}

#endif
