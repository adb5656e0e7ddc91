/*
 * tests/model/hf_gguf_image.h — the llama.cpp GGUF of a loaded Hugging Face
 * checkpoint, written in memory (gguf_writer.h), so a test can load the
 * same model from both sources: tests/backend/test_cpu_hf_moe.c (cpu) and
 * tests/gpu/test_gpu_backend.c (cuda) on transformers' tiny MoE and Qwen3
 * checkpoints. Test-only, header-only.
 */
#ifndef LOOM_TEST_HF_GGUF_IMAGE_H
#define LOOM_TEST_HF_GGUF_IMAGE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/half.h"
#include "gguf_writer.h"
#include "model/model.h"

/* Edits for the error tests and the quantized experts. */
typedef struct hm_gguf_opts {
    const char *rename_from, *rename_to; /* write tensor rename_from under this name */
    const char *drop_key;                /* leave out <arch>.<drop_key>              */
    bool q8_experts;                     /* stacked experts with 32-multiple rows as Q8_0 */
    bool q5_0_matrices;                  /* every 2-D tensor with 32-multiple rows as Q5_0 */
} hm_gguf_opts;

/* Q8_0 blocks of n floats (n % 32 == 0): per 32, an f16 scale d = max|x| /
 * 127 and round(x / d) as int8 — ggml's layout, written here from its
 * description. */
static inline uint8_t *hm_q8_0(const float *x, int64_t n) {
    uint8_t *out = malloc((size_t)(n / 32) * 34);
    if (!out) abort();
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        const uint16_t d = loom_fp32_to_fp16(amax / 127.0f);
        const float df = loom_fp16_to_fp32(d);
        memcpy(out + b * 34, &d, 2);
        for (int i = 0; i < 32; i++) {
            float q = df > 0 ? roundf(x[b * 32 + i] / df) : 0;
            ((int8_t *)out)[b * 34 + 2 + i] = (int8_t)fmaxf(-127, fminf(127, q));
        }
    }
    return out;
}

/* Q5_0 blocks of n floats (n % 32 == 0): per 32, the value of largest
 * magnitude m, an f16 scale d = m / -16 (so m takes code 0) and codes
 * round(x / d) + 16 clamped to 0..31, low nibbles of elements j and j + 16
 * in byte j, bit 4 of element j in bit j of the 32-bit qh (ggml's
 * quantize_row_q5_0, written here from the layout). */
static inline uint8_t *hm_q5_0(const float *x, int64_t n) {
    uint8_t *out = malloc((size_t)(n / 32) * 22);
    if (!out) abort();
    for (int64_t b = 0; b < n / 32; b++) {
        float m = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[b * 32 + i]) > fabsf(m)) m = x[b * 32 + i];
        const uint16_t d = loom_fp32_to_fp16(m / -16.0f);
        const float df = loom_fp16_to_fp32(d);
        uint8_t *o = out + b * 22;
        uint32_t qh = 0;
        memset(o + 6, 0, 16);
        for (int i = 0; i < 32; i++) {
            const float q = df != 0 ? roundf(x[b * 32 + i] / df) + 16 : 16;
            const uint32_t c = (uint32_t)fmaxf(0, fminf(31, q));
            o[6 + i % 16] |= (uint8_t)((c & 15) << (i < 16 ? 0 : 4));
            qh |= (c >> 4) << i;
        }
        memcpy(o, &d, 2);
        for (int k = 0; k < 4; k++) o[2 + k] = (uint8_t)(qh >> (8 * k));
    }
    return out;
}

/* The llama.cpp GGUF of model m (canonical names and layout already; GGML
 * dims reversed) into *img, as llama.cpp's converter writes it: arch qwen3 /
 * qwen3moe / qwen2moe, or Mixtral as "llama" with expert keys and Q/K rows
 * in its interleaved order. Every tensor float32 (Q8_0 experts with
 * o.q8_experts, Q5_0 matrices with o.q5_0_matrices). NULL, or why not (img
 * left empty). */
static inline const char *hf_gguf_image(const loom_model *m, hm_gguf_opts o, gw *img) {
    const loom_model_view *v = loom_model_view_get(m);
    const loom_model_config *c = v->config;
    const char *a = c->arch == LOOM_ARCH_QWEN3       ? "qwen3"
                    : c->arch == LOOM_ARCH_QWEN3_MOE ? "qwen3moe"
                    : c->arch == LOOM_ARCH_QWEN2_MOE ? "qwen2moe"
                                                     : "llama";
    const int32_t n = v->count(v->ctx);
    for (int32_t i = 0; i < n; i++)
        if (v->at(v->ctx, i)->dtype != LOOM_DTYPE_F32) return "a tensor of the checkpoint is not float32";
    gb b;
    gb_init(&b);
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
    gb_s(&b, "general.architecture", a);
    const struct {
        const char *key;
        int32_t v;
    } ints[] = {{"block_count", c->num_layers},          {"embedding_length", c->hidden_size},
                {"feed_forward_length", c->intermediate_size}, {"attention.head_count", c->num_heads},
                {"attention.head_count_kv", c->num_kv_heads}, {"attention.key_length", c->head_dim},
                {"context_length", c->max_context},       {"vocab_size", c->vocab_size},
                {"expert_count", c->num_experts},         {"expert_used_count", c->num_experts_used},
                {"expert_feed_forward_length", c->expert_intermediate_size},
                {"expert_shared_feed_forward_length", c->shared_expert_intermediate_size}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].v > 0 && (!o.drop_key || strcmp(ints[i].key, o.drop_key)))
            gb_u32(&b, KEY(ints[i].key), (uint32_t)ints[i].v);
    gb_f32(&b, KEY("rope.freq_base"), c->rope_theta);
    gb_f32(&b, KEY("attention.layer_norm_rms_epsilon"), c->rms_norm_eps);
#undef KEY
    void **perm = calloc((size_t)n, sizeof *perm);
    if (!perm) abort();
    const char *why = NULL;
    for (int32_t i = 0; i < n && !why; i++) {
        const loom_tensor *t = v->at(v->ctx, i);
        uint64_t ne[3];
        for (int d = 0; d < t->ndim; d++) ne[d] = (uint64_t)t->shape[t->ndim - 1 - d];
        const void *data = t->data;
        const bool q = strstr(t->name, ".attn_q.weight") != NULL, kk = strstr(t->name, ".attn_k.weight") != NULL;
        if (!strcmp(a, "llama") && (q || kk)) {
            if (!(perm[i] = malloc(t->nbytes))) abort();
            if (loom_model_permute_rows(t->data, perm[i], t->shape[0], t->nbytes / (size_t)t->shape[0],
                                        q ? c->num_heads : c->num_kv_heads) != LOOM_OK)
                why = "permuting the Q / K rows into llama.cpp's order failed";
            data = perm[i];
        }
        const bool ren = o.rename_from && !strcmp(t->name, o.rename_from);
        const int64_t cols = t->shape[t->ndim - 1], numel = (int64_t)(t->nbytes / sizeof(float));
        if (o.q8_experts && strstr(t->name, "_exps.") && cols % 32 == 0) {
            perm[i] = hm_q8_0(t->data, numel);
            gb_tensor_add(&b, t->name, GG_Q8_0, (uint32_t)t->ndim, ne, perm[i], (size_t)(numel / 32) * 34);
            continue;
        }
        if (o.q5_0_matrices && t->ndim == 2 && cols % 32 == 0) {
            uint8_t *q5 = hm_q5_0(data, numel);
            free(perm[i]);
            perm[i] = q5;
            gb_tensor_add(&b, ren ? o.rename_to : t->name, GG_Q5_0, 2, ne, q5, (size_t)(numel / 32) * 22);
            continue;
        }
        gb_tensor_add(&b, ren ? o.rename_to : t->name, GG_F32, (uint32_t)t->ndim, ne, data, t->nbytes);
    }
    if (!why) *img = gb_finish(&b);
    gb_free(&b);
    for (int32_t i = 0; i < n; i++) free(perm[i]);
    free(perm);
    return why;
}

#endif
