/*
 * core/plugin/host_rules.c — the shared rules behind the host table (see
 * host_rules.h): batch, model and tensor checks, the tensor-parallel shard
 * plan, the host reference of forward_topk(), and the xoshiro256** stream
 * every sampler draws from.
 */
#include "plugin/host_rules.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "formats/dtype.h"

/* What every later check of a batch of T > 0 tokens indexes by: the pool's
 * shape, and the whole of query_start (0 == qs[0] <= qs[s] <= qs[s+1] <=
 * qs[S] == T) before any token is read through it. */
static bool batch_shape_ok(const loom_batch *bt, int32_t bs, int32_t nblk, char *why, size_t cap) {
    const int32_t S = bt->num_seqs, T = bt->num_tokens;
    if (bs <= 0 || nblk < 0) {
        snprintf(why, cap, "KV pool of block_size %d, num_blocks %d: need block_size > 0 and num_blocks >= 0", bs,
                 nblk);
        return false;
    }
    if (bt->query_start[0] != 0 || bt->query_start[S] != T) {
        snprintf(why, cap, "batch query_start[0] = %d and query_start[%d] = %d; must be 0 and num_tokens (%d)",
                 bt->query_start[0], S, bt->query_start[S], T);
        return false;
    }
    for (int32_t s = 1; s < S; s++) {
        int32_t q0 = bt->query_start[s - 1], q1 = bt->query_start[s];
        if (q1 < q0 || q1 > T) {
            snprintf(why, cap,
                     "batch query_start[%d] = %d after query_start[%d] = %d: must be non-decreasing and <= "
                     "num_tokens (%d)",
                     s, q1, s - 1, q0, T);
            return false;
        }
    }
    return true;
}

/* Block-table groups of a batch (loom/backend.h, since ABI 2.4): 1 for
 * a batch built before them. */
static int32_t batch_groups(const loom_batch *bt) {
    if (!LOOM_HAS_FIELD(bt, loom_batch, group_window) || bt->num_groups <= 1) return 1;
    return bt->num_groups;
}

/* Sequence s's row in every group's table: the `need` entries its context
 * covers are pool blocks, except those of a windowed group wholly before
 * the window of its first query (position q0) — released, maybe -1. */
static bool batch_rows_ok(const loom_batch *bt, int32_t s, int32_t bs, int32_t nblk, int64_t need, int32_t q0,
                          char *why, size_t cap) {
    const int32_t G = batch_groups(bt);
    const bool windows = LOOM_HAS_FIELD(bt, loom_batch, group_window) && bt->group_window;
    if (G > LOOM_KV_GROUPS_MAX) {
        snprintf(why, cap, "batch has %d block-table groups; at most %d", G, LOOM_KV_GROUPS_MAX);
        return false;
    }
    for (int32_t g = 0; g < G; g++) {
        const int32_t *row = bt->block_table + ((int64_t)g * bt->num_seqs + s) * bt->block_table_stride;
        const int32_t w = windows ? bt->group_window[g] : 0;
        if (w < 0) {
            snprintf(why, cap, "batch group %d has window %d (>= 0)", g, w);
            return false;
        }
        const int64_t released = w > 0 && q0 - w + 1 > 0 ? (q0 - w + 1) / bs : 0;
        for (int64_t j = 0; j < need; j++) {
            if (j < released && row[j] == -1) continue;
            if (row[j] < 0 || row[j] >= nblk) {
                snprintf(why, cap, "sequence %d block_table[%lld] of group %d = %d is outside the pool [0, %d)", s,
                         (long long)j, g, row[j], nblk);
                return false;
            }
        }
    }
    return true;
}

loom_status loom_check_batch(const loom_batch *bt, const float *logits, bool logits_optional, int32_t block_size,
                             int32_t num_blocks, int32_t vocab, int32_t max_positions, char *why, size_t cap) {
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
    if (!batch_shape_ok(bt, bs, nblk, why, cap)) return LOOM_ERR_INVALID;
    if (bt->block_table_stride <= 0)
        LOOM_BATCH_FAIL("batch block_table_stride is %d; must be > 0", bt->block_table_stride);
    for (int32_t s = 0; s < S; s++) {
        int32_t q0 = bt->query_start[s], q1 = bt->query_start[s + 1];
        if (q1 == q0) continue;
        int32_t ctx = bt->context_len[s];
        int64_t need = ((int64_t)ctx + bs - 1) / bs;
        if (ctx <= 0 || need > bt->block_table_stride)
            LOOM_BATCH_FAIL("sequence %d has context_len %d: must be > 0 and fit its block table (%d blocks "
                            "of %d tokens)",
                            s, ctx, bt->block_table_stride, bs);
        if (!batch_rows_ok(bt, s, bs, nblk, need, ctx - (q1 - q0), why, cap)) return LOOM_ERR_INVALID;
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
            for (int32_t g = 0; g < batch_groups(bt); g++) {
                int64_t slot = bt->slot_mapping[(int64_t)g * T + t];
                if (slot < -1 || slot >= (int64_t)nblk * bs)
                    LOOM_BATCH_FAIL("token %d has slot %lld in group %d outside [-1, %lld)", t, (long long)slot, g,
                                    (long long)nblk * bs);
            }
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

/* The fields since ABI 2.3 (Gemma 3) in range. */
static bool model_features_ok(const loom_model_config *c, char *why, size_t cap) {
    if ((unsigned)c->ffn_act > LOOM_FFN_GELU_TANH || !(c->embed_scale >= 0) || !(c->attn_scale >= 0) ||
        !isfinite(c->embed_scale) || !isfinite(c->attn_scale)) {
        snprintf(why, cap, "model '%s': ffn activation %d (0 silu, 1 gelu_tanh), embedding scale %g and "
                 "attention scale %g (finite, >= 0) out of range",
                 c->name, (int)c->ffn_act, (double)c->embed_scale, (double)c->attn_scale);
        return false;
    }
    if (c->sliding_window < 0 || (c->sliding_window > 0 && (c->global_every <= 0 || !(c->rope_theta_local > 0)))) {
        snprintf(why, cap, "model '%s': sliding window %d (>= 0) needs global_every %d > 0 and a local RoPE "
                 "base %g > 0",
                 c->name, c->sliding_window, c->global_every, (double)c->rope_theta_local);
        return false;
    }
    return true;
}

/* The mixture-of-experts fields (since ABI 2.4) consistent. */
static bool model_moe_ok(const loom_model_config *c, char *why, size_t cap) {
    const bool moe_arch = c->arch == LOOM_ARCH_QWEN3_MOE || c->arch == LOOM_ARCH_QWEN2_MOE ||
                          c->arch == LOOM_ARCH_MIXTRAL;
    if (c->num_experts == 0 && !moe_arch) return true;
    if (c->num_experts <= 0 || c->num_experts_used < 1 || c->num_experts_used > c->num_experts ||
        c->expert_intermediate_size <= 0 || c->shared_expert_intermediate_size < 0) {
        snprintf(why, cap, "model '%s': %d experts, %d per token, expert width %d, shared expert width %d: need "
                 "1 <= per token <= experts, width > 0, shared >= 0",
                 c->name, c->num_experts, c->num_experts_used, c->expert_intermediate_size,
                 c->shared_expert_intermediate_size);
        return false;
    }
    return true;
}

loom_status loom_check_model_config(const loom_model_config *c, char *why, size_t cap) {
    if ((unsigned)c->arch > LOOM_ARCH_MIXTRAL ||
        (c->arch > LOOM_ARCH_GEMMA3 && !LOOM_HAS_FIELD(c, loom_model_config, moe_norm_topk))) {
        snprintf(why, cap, "model '%s' has architecture %d; only llama (0), qwen2 (1), gemma3 (2), qwen3 (3), "
                 "qwen3moe (4), qwen2moe (5) and mixtral (6) run here",
                 c->name, (int)c->arch);
        return LOOM_ERR_UNSUPPORTED;
    }
    if (LOOM_HAS_FIELD(c, loom_model_config, rope_theta_local) && !model_features_ok(c, why, cap))
        return LOOM_ERR_FORMAT;
    if (LOOM_HAS_FIELD(c, loom_model_config, moe_norm_topk) && !model_moe_ok(c, why, cap))
        return LOOM_ERR_FORMAT;
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

loom_status loom_check_load(bool already_loaded, const loom_model_view *m, const loom_comm *comm, char *why,
                            size_t cap) {
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
    /* a post-norm needs the whole sum of a row-parallel GEMM before the
     * residual add; the shard plan adds the partial sums onto it */
    if (comm && LOOM_HAS_FIELD(m->config, loom_model_config, post_norms) && m->config->post_norms) {
        snprintf(why, cap, "model '%s' normalises the attention and FFN outputs before the residual add "
                 "(Gemma 3 post-norms); tensor parallelism does not run such models yet: use one rank",
                 m->config->name);
        return LOOM_ERR_UNSUPPORTED;
    }
    return loom_check_model_config(m->config, why, cap);
}

const loom_tensor *loom_model_packed_qweight(const loom_model_view *m, const loom_tensor *t) {
    char nm[256];
    size_t n = t && t->name ? strlen(t->name) : 0;
    if (!m || !m->get || !t || t->data || t->nbytes || n <= 7 || n + 2 > sizeof nm ||
        strcmp(t->name + n - 7, ".weight") != 0)
        return NULL;
    snprintf(nm, sizeof nm, "%.*s.qweight", (int)(n - 7), t->name);
    return m->get(m->ctx, nm);
}

loom_status loom_model_tensor_check(const loom_model_view *m, const char *name, int64_t d0, int64_t d1,
                                    bool required, const loom_tensor **out, char *why, size_t cap) {
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

loom_status loom_shard_plan(const loom_model_config *c, int32_t rank, int32_t size, loom_shard *s, char *why,
                            size_t why_cap) {
    if (size < 1 || rank < 0 || rank >= size) {
        snprintf(why, why_cap, "rank %d of a group of %d", rank, size);
        return LOOM_ERR_INVALID;
    }
    if (c->num_heads % size != 0 || c->intermediate_size % size != 0 ||
        (c->num_kv_heads % size != 0 && size % c->num_kv_heads != 0)) {
        snprintf(why, why_cap,
                 "model '%s' (%d heads, %d KV heads, FFN width %d) does not split over %d ranks: heads "
                 "and FFN width must divide by the size, and KV heads divide by it or it by them",
                 c->name, c->num_heads, c->num_kv_heads, c->intermediate_size, size);
        return LOOM_ERR_UNSUPPORTED;
    }
    *s = (loom_shard){.struct_size = sizeof *s};
    s->rank = rank;
    s->size = size;
    s->heads = c->num_heads / size;
    s->head0 = rank * s->heads;
    if (c->num_kv_heads >= size) {
        s->kv_heads = c->num_kv_heads / size;
        s->kv0 = rank * s->kv_heads;
    } else {
        s->kv_heads = 1;
        s->kv0 = s->head0 / (c->num_heads / c->num_kv_heads);
    }
    s->inter = c->intermediate_size / size;
    s->inter0 = rank * s->inter;
    s->vocab_pad = (int32_t)(((int64_t)c->vocab_size + size - 1) / size);
    int64_t lo = (int64_t)rank * s->vocab_pad;
    s->vocab_lo = (int32_t)(lo < c->vocab_size ? lo : c->vocab_size);
    int64_t rows = (int64_t)c->vocab_size - s->vocab_lo;
    s->vocab_rows = (int32_t)(rows < s->vocab_pad ? rows : s->vocab_pad);
    return LOOM_OK;
}

/* Both host functions: the ranking sees a token outside `allowed` (when
 * given) as -inf, the log-sum-exp always the raw row. */
static void topk_row(const float *row, int32_t vocab, const uint32_t *allowed, int32_t k, int32_t *ids,
                     float *vals, float *lse) {
    if (k <= 0) return; /* nothing asked: nothing written (loom/plugin.h) */
    int32_t n = 0;
    float mx = -INFINITY;
    for (int32_t v = 0; v < vocab; v++) {
        float x = row[v];
        if (x != x) x = -INFINITY;
        if (x > mx) mx = x;
        if (allowed && !((allowed[v >> 5] >> (v & 31)) & 1u)) x = -INFINITY;
        /* a later id enters only when strictly greater than the k-th */
        if (n == k && !(x > vals[k - 1])) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && x > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = x;
        ids[j] = v;
    }
    for (; n < k; n++) { /* k > vocab: the tail is padding */
        ids[n] = -1;
        vals[n] = -INFINITY;
    }
    if (!(mx > -INFINITY) || mx == INFINITY) {
        *lse = mx;
        return;
    }
    double z = 0.0;
    for (int32_t v = 0; v < vocab; v++)
        if (row[v] == row[v]) z += exp((double)row[v] - (double)mx);
    *lse = (float)((double)mx + log(z));
}

void loom_logits_topk_row(const float *row, int32_t vocab, int32_t k, int32_t *ids, float *vals, float *lse) {
    topk_row(row, vocab, NULL, k, ids, vals, lse);
}

void loom_logits_topk_masked_row(const float *row, int32_t vocab, const uint32_t *allowed, int32_t k, int32_t *ids,
                                 float *vals, float *lse) {
    topk_row(row, vocab, allowed, k, ids, vals, lse);
}

void loom_rng_seed(uint64_t state[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        state[i] = z ^ (z >> 31);
    }
}

uint64_t loom_rng_next(uint64_t s[4]) {
    uint64_t r = s[1] * 5, t = s[1] << 17;
    r = ((r << 7) | (r >> 57)) * 9;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = (s[3] << 45) | (s[3] >> 19);
    return r;
}

double loom_rng_uniform(uint64_t s[4]) {
    return (double)(loom_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}
