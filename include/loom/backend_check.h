/*
 * loom/backend_check.h — the input checks every backend makes, in one place
 * so backends agree on what a valid batch and a usable weight are and say
 * so in the same words. Header-only (static inline): plugins never link
 * libloom. Messages are written without a "backend x:" prefix; the caller
 * adds its own.
 */
#ifndef LOOM_BACKEND_CHECK_H
#define LOOM_BACKEND_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loom/backend.h"
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* [any] Check a batch against a KV pool of `num_blocks` blocks of
 * `block_size` tokens and a vocabulary of `vocab`. `logits` may be NULL only
 * when `logits_optional` (a non-zero tensor-parallel rank). `max_positions`
 * > 0 bounds positions (e.g. a RoPE table). LOOM_ERR_ABI for a short
 * struct, LOOM_ERR_INVALID otherwise, with `why` filled. */
static inline loom_status loom_batch_check(const loom_batch *bt, const float *logits, bool logits_optional,
                                           int32_t block_size, int32_t num_blocks, int32_t vocab,
                                           int32_t max_positions, char *why, size_t cap) {
    const size_t need_size = offsetof(loom_batch, logits_index) + sizeof(void *);
    if (!bt || bt->struct_size < need_size) {
        snprintf(why, cap, "forward() got %s batch (struct_size %u, need >= %zu)", bt ? "a short" : "no",
                 bt ? bt->struct_size : 0u, need_size);
        return LOOM_ERR_ABI;
    }
    const int32_t S = bt->num_seqs, T = bt->num_tokens, NL = bt->num_logits;
    const int32_t bs = block_size, nblk = num_blocks;
#define LOOM_BATCH_FAIL(...)              \
    do {                                  \
        snprintf(why, cap, __VA_ARGS__);  \
        return LOOM_ERR_INVALID;          \
    } while (0)
    if (S < 0 || T < 0 || NL < 0)
        LOOM_BATCH_FAIL("batch has num_seqs %d, num_tokens %d, num_logits %d (negative)", S, T, NL);
    if (T > 0 && (S == 0 || !bt->token_ids || !bt->positions || !bt->query_start || !bt->context_len ||
                  !bt->block_table || !bt->slot_mapping))
        LOOM_BATCH_FAIL("batch of %d tokens in %d sequences lacks one of token_ids, positions, query_start, "
                        "context_len, block_table, slot_mapping",
                        T, S);
    if (NL > 0 && (!bt->logits_index || (!logits && !logits_optional)))
        LOOM_BATCH_FAIL("%d logits rows asked but %s is NULL", NL, !logits ? "the logits buffer" : "logits_index");
    if (T == 0) {
        if (NL > 0) LOOM_BATCH_FAIL("%d logits rows asked of a batch with no tokens", NL);
        return LOOM_OK;
    }
    if (bt->query_start[0] != 0 || bt->query_start[S] != T)
        LOOM_BATCH_FAIL("batch query_start[0] = %d and query_start[%d] = %d; must be 0 and num_tokens (%d)",
                        bt->query_start[0], S, bt->query_start[S], T);
    if (bt->block_table_stride <= 0)
        LOOM_BATCH_FAIL("batch block_table_stride is %d; must be > 0", bt->block_table_stride);
    for (int32_t s = 0; s < S; s++) {
        int32_t q0 = bt->query_start[s], q1 = bt->query_start[s + 1];
        if (q1 < q0) LOOM_BATCH_FAIL("batch query_start decreases at sequence %d (%d -> %d)", s, q0, q1);
        if (q1 == q0) continue;
        int32_t ctx = bt->context_len[s];
        int64_t need = ((int64_t)ctx + bs - 1) / bs;
        if (ctx <= 0 || need > bt->block_table_stride)
            LOOM_BATCH_FAIL("sequence %d has context_len %d: must be > 0 and fit its block table (%d blocks "
                            "of %d tokens)",
                            s, ctx, bt->block_table_stride, bs);
        const int32_t *row = bt->block_table + (int64_t)s * bt->block_table_stride;
        for (int64_t j = 0; j < need; j++)
            if (row[j] < 0 || row[j] >= nblk)
                LOOM_BATCH_FAIL("sequence %d block_table[%lld] = %d is outside the pool [0, %d)", s,
                                (long long)j, row[j], nblk);
        for (int32_t t = q0; t < q1; t++) {
            if (bt->positions[t] < 0 || bt->positions[t] >= ctx)
                LOOM_BATCH_FAIL("token %d (sequence %d) has position %d outside [0, context_len %d)", t, s,
                                bt->positions[t], ctx);
            if (max_positions > 0 && bt->positions[t] >= max_positions)
                LOOM_BATCH_FAIL("token %d has position %d beyond the RoPE table (%d positions); raise the "
                                "backend's max_positions or lower engine.max_model_len",
                                t, bt->positions[t], max_positions);
            if (bt->token_ids[t] < 0 || bt->token_ids[t] >= vocab)
                LOOM_BATCH_FAIL("token %d has id %d outside the vocabulary [0, %d)", t, bt->token_ids[t], vocab);
            int64_t slot = bt->slot_mapping[t];
            if (slot < -1 || slot >= (int64_t)nblk * bs)
                LOOM_BATCH_FAIL("token %d has slot %lld outside [-1, %lld)", t, (long long)slot,
                                (long long)nblk * bs);
        }
    }
    for (int32_t i = 0; i < NL; i++) {
        int32_t k = bt->logits_index[i];
        if (k < 0 || k >= T || (i > 0 && k < bt->logits_index[i - 1]))
            LOOM_BATCH_FAIL("logits_index[%d] = %d: must be in [0, %d) and ascending", i, k, T);
    }
#undef LOOM_BATCH_FAIL
    return LOOM_OK;
}

/* [any] The model-config checks every backend makes before its own limits
 * (head_dim, alignment): a Llama-family architecture, positive sizes, query
 * heads a multiple of KV heads, a usable RMSNorm epsilon and RoPE base, and
 * RoPE-scaling parameters that mean something. LOOM_ERR_UNSUPPORTED for an
 * architecture or shape no backend runs, LOOM_ERR_FORMAT for inconsistent
 * RoPE scaling; `why` says which. */
static inline loom_status loom_model_config_check(const loom_model_config *c, char *why, size_t cap) {
    if (c->arch != LOOM_ARCH_LLAMA && c->arch != LOOM_ARCH_QWEN2) {
        snprintf(why, cap, "model '%s' has architecture %d; only llama (0) and qwen2 (1) run here", c->name,
                 (int)c->arch);
        return LOOM_ERR_UNSUPPORTED;
    }
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_layers <= 0 ||
        c->num_heads <= 0 || c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0 ||
        c->head_dim <= 0 || !(c->rms_norm_eps >= 0) || !(c->rope_theta > 0)) {
        snprintf(why, cap,
                 "model '%s' config not runnable (vocab %d, hidden %d, ffn %d, layers %d: all > 0; "
                 "heads %d a multiple of kv heads %d; head_dim %d > 0; rms_norm_eps %g >= 0; "
                 "rope_theta %g > 0)",
                 c->name, c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
                 c->num_kv_heads, c->head_dim, (double)c->rms_norm_eps, (double)c->rope_theta);
        return LOOM_ERR_UNSUPPORTED;
    }
    if (c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3 &&
        !(c->rope_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
          c->rope_low_freq_factor > 0 && c->rope_original_context > 0)) {
        snprintf(why, cap,
                 "model '%s' asks for llama3 RoPE scaling with factor %g, low/high freq factors %g/%g, "
                 "original context %d: need factor > 0, 0 < low < high, context > 0",
                 c->name, (double)c->rope_factor, (double)c->rope_low_freq_factor,
                 (double)c->rope_high_freq_factor, c->rope_original_context);
        return LOOM_ERR_FORMAT;
    }
    if (c->rope_scaling == LOOM_ROPE_SCALING_LINEAR && !(c->rope_factor > 0)) {
        snprintf(why, cap, "model '%s' asks for linear RoPE scaling with factor %g; need factor > 0", c->name,
                 (double)c->rope_factor);
        return LOOM_ERR_FORMAT;
    }
    return LOOM_OK;
}

/* [any] What load() and load_shard() check before anything else: this
 * instance has not loaded a model yet (`already_loaded`), `m` is a model
 * view with a config and get(), `comm` (NULL for a whole model) has
 * all_reduce_sum and all_gather, and the config passes
 * loom_model_config_check. LOOM_ERR_INVALID, LOOM_ERR_ABI or the config
 * check's status, with `why` filled. */
static inline loom_status loom_load_check(bool already_loaded, const loom_model_view *m, const loom_comm *comm,
                                          char *why, size_t cap) {
    if (already_loaded) {
        snprintf(why, cap, "load() called twice; create a new instance per model");
        return LOOM_ERR_INVALID;
    }
    if (!m || !m->config || !m->get) {
        snprintf(why, cap, "load() needs a model view with a config and get()");
        return LOOM_ERR_INVALID;
    }
    if (comm && (comm->struct_size < offsetof(loom_comm, all_gather) + sizeof(void *) || !comm->all_reduce_sum ||
                 !comm->all_gather)) {
        snprintf(why, cap, "load_shard() got a communicator without all_reduce_sum and all_gather (struct_size %u)",
                 comm->struct_size);
        return LOOM_ERR_ABI;
    }
    return loom_model_config_check(m->config, why, cap);
}

/* [any] The model's `<stem>.qweight` when `t` is a packed AWQ/GPTQ linear
 * weight: a shape-only `<stem>.weight` descriptor (data NULL, nbytes 0)
 * whose 4-bit data only a quantizer (int4, source awq / gptq) can read.
 * NULL for every ordinary tensor. */
static inline const loom_tensor *loom_model_packed_qweight(const loom_model_view *m, const loom_tensor *t) {
    char nm[256];
    size_t n = t && t->name ? strlen(t->name) : 0;
    if (!m || !m->get || !t || t->data || t->nbytes || n <= 7 || n + 2 > sizeof nm ||
        strcmp(t->name + n - 7, ".weight") != 0)
        return NULL;
    snprintf(nm, sizeof nm, "%.*s.qweight", (int)(n - 7), t->name);
    return m->get(m->ctx, nm);
}

/* [any] Fetch weight `name` from the model and check it is host data of
 * shape (d0) (d1 < 0) or (d0, d1) in a known element type. A packed
 * AWQ/GPTQ weight (loom_model_packed_qweight) passes with no data: the
 * caller must hand it to a quantizer, never read it. A missing
 * optional tensor gives *out = NULL and LOOM_OK; a missing required one
 * LOOM_ERR_NOT_FOUND; a bad one LOOM_ERR_FORMAT; `why` says which. */
static inline loom_status loom_model_tensor_check(const loom_model_view *m, const char *name, int64_t d0,
                                                  int64_t d1, bool required, const loom_tensor **out,
                                                  char *why, size_t cap) {
    const loom_tensor *t = m->get(m->ctx, name);
    *out = NULL;
    if (!t) {
        if (!required) return LOOM_OK;
        snprintf(why, cap,
                 "model '%s' has no tensor '%s' (arch needs it); is the file complete and of a "
                 "Llama-family architecture?",
                 m->config->name, name);
        return LOOM_ERR_NOT_FOUND;
    }
    int ndim = d1 < 0 ? 1 : 2;
    bool shape_ok = t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1);
    if (!shape_ok) {
        snprintf(why, cap, "tensor '%s' has shape (%lld, %lld) [%d dims], the config implies (%lld%s%lld)", name,
                 (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), t->ndim, (long long)d0,
                 ndim == 1 ? "" : ", ", (long long)(ndim == 1 ? 0 : d1));
        return LOOM_ERR_FORMAT;
    }
    if (ndim == 2 && loom_model_packed_qweight(m, t)) {
        *out = t;
        return LOOM_OK;
    }
    int64_t cols = ndim == 1 ? d0 : d1, rows = ndim == 1 ? 1 : d0;
    size_t row_bytes = loom_dtype_row_bytes(t->dtype, cols);
    if (t->device != LOOM_DEVICE_HOST || !t->data || row_bytes == 0 || t->nbytes < row_bytes * (size_t)rows) {
        snprintf(why, cap, "tensor '%s' (%s, %zu bytes, device %d) is not host data of %lld rows x %zu bytes",
                 name, loom_dtype_name(t->dtype), t->nbytes, (int)t->device, (long long)rows, row_bytes);
        return LOOM_ERR_FORMAT;
    }
    *out = t;
    return LOOM_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* LOOM_BACKEND_CHECK_H */
