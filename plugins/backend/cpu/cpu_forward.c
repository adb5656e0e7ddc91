/*
 * plugins/backend/cpu/cpu_forward.c — the cpu backend's forward pass over
 * one flattened batch (loom/backend.h): embeddings, then per layer
 *   xn = rmsnorm(x); qkv = xn Wqkv^T (+ bias); RoPE on q, k; K/V -> cache;
 *   att = paged_attention(q, cache); x += att Wo^T;
 *   xn = rmsnorm(x); gu = xn Wgu^T; act = silu(gate) * up; x += act Wdown^T
 * then the final norm and the LM head for the `logits_index` rows only.
 * Gemma 3 (the config's flags, loom/model.h) adds: embeddings times
 * sqrt(hidden); RMSNorm of each q and k head before RoPE; local layers with
 * their own RoPE base that attend to a sliding window of keys; gelu_tanh
 * instead of silu; and x += rmsnorm(att Wo^T) (and of the FFN output)
 * instead of the plain adds.
 *
 * The residual adds ride on the GEMMs (beta = 1 into x), so the residual
 * stream is never copied. Weights a quantizer changed run on
 * kernels/cpu/qlinear.h with the same beta (cpu_group). Every index in the batch is checked before any
 * work, so a bad batch is an error naming the field, never a stray write.
 *
 * Loaded by load_shard (tensor parallelism), a rank holds its heads, FFN
 * columns and vocabulary rows, and three things change: the embedding looks
 * up only its vocabulary rows (zeros elsewhere) and all-reduces; after the
 * row-parallel O and down GEMMs the partial sums are all-reduced into x —
 * rank 0's GEMM adds onto the residual (beta = 1), the others' start from
 * zero (beta = 0), so the residual is counted once and every rank ends with
 * the same x; the LM head computes this rank's vocabulary slice and an
 * all-gather assembles whole rows, which the rank given a logits buffer
 * writes out.
 *
 * Loaded by load_stage (pipeline parallelism), an instance runs only its
 * layers: a stage after the first receives the residual stream x from the
 * previous stage instead of embedding, and a stage before the last sends x
 * on instead of the final norm and LM head (cpu_stage_in / cpu_stage_out).
 */
#include "cpu_backend.h"
#include "kv_groups.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ----------------------------------------------------------- batch checks */

/* Block-table groups of a batch and of the KV layout: 1 unless grouped. */
static int32_t cpu_batch_groups(const loom_batch *bt) {
    return LOOM_HAS_FIELD(bt, loom_batch, num_groups) && bt->num_groups > 1 ? bt->num_groups : 1;
}

static int32_t cpu_layout_groups(const cpu_backend *b) {
    return b->kv_layout.num_groups > 1 ? b->kv_layout.num_groups : 1;
}

static loom_status cpu_check_batch(cpu_backend *b, const loom_batch *bt, const float *logits,
                                   loom_error *err) {
    const loom_host *h = b->host;
    if (!b->loaded || !b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: forward() before %s", !b->loaded ? "load()" : "kv_alloc()");
    char why[LOOM_ERROR_MSG_MAX - 16];
    /* only the last stage, and with tensor parallelism only some rank,
     * writes logits */
    const bool logits_optional = b->sharded || !b->last_stage;
    loom_status st = b->host->check_batch(bt, logits, logits_optional, b->kv_layout.block_size,
                                      b->kv_layout.num_blocks, b->mc.vocab_size, 0, why, sizeof why);
    if (st != LOOM_OK) return h->error(h->ctx, err, st, "backend cpu: %s", why);
    if (cpu_batch_groups(bt) != cpu_layout_groups(b))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: the batch has %d block-table groups, the KV layout %d",
                        cpu_batch_groups(bt), cpu_layout_groups(b));
    return LOOM_OK;
}

/* ----------------------------------------------------------------- scratch */

/* Make the scratch hold `rows` token rows. */
static loom_status cpu_scratch(cpu_backend *b, int64_t rows, loom_error *err) {
    if (rows <= b->scratch_rows) return LOOM_OK;
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    if (rows < 16) rows = 16;
    /* each piece rounded to 16 floats so every buffer starts 64-B aligned
     * relative to the block */
    const size_t half = (size_t)c->head_dim / 2, local = c->sliding_window > 0 ? half : 0;
    /* a mixture of experts has no dense FFN: its buffers are cpu_moe.c's */
    const size_t inter = c->num_experts > 0 ? 0 : (size_t)c->intermediate_size;
    size_t r16[10] = {(size_t)c->hidden_size, (size_t)c->hidden_size, (size_t)b->qkv_rows,
                      (size_t)b->q_dim, 2 * inter, inter, half, half, local, local};
    size_t per_row[10], total = 0;
    for (int i = 0; i < 10; i++) {
        per_row[i] = (r16[i] * (size_t)rows + 15) & ~(size_t)15;
        total += per_row[i];
    }
    float *s = h->alloc(h->ctx, total * sizeof(float));
    if (!s)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: out of memory for %.1f MiB of activations (%lld tokens); "
                        "lower max_num_batched_tokens",
                        (double)total * sizeof(float) / (1 << 20), (long long)rows);
    h->free(h->ctx, b->scratch);
    b->scratch = s;
    b->scratch_rows = rows;
    float **dst[10] = {&b->x, &b->xn, &b->qkv, &b->att, &b->gu, &b->act, &b->rope_cos,
                       &b->rope_sin, &b->rope_cos_local, &b->rope_sin_local};
    for (int i = 0; i < 10; i++) {
        *dst[i] = s;
        s += per_row[i];
    }
    return LOOM_OK;
}

static loom_status cpu_lm_head(cpu_backend *b, float *y, int64_t ldy, const float *xn, int64_t NL,
                               loom_error *err);

/* The key-chunk states with which attention splits a long query's keys
 * over the threads (loom_cpu_attention_part_floats), grown to what the
 * batch wants up to 16 MiB; past that, or when it cannot grow, attention
 * runs unsplit — the same bits, fewer threads at a long decode. */
#define CPU_ATTN_PART_MAX ((int64_t)4 << 20)
static void cpu_attn_part(cpu_backend *b, loom_cpu_attn_args *aa) {
    const int64_t need = loom_cpu_attention_part_floats(aa);
    if (need > b->attn_part_floats && need <= CPU_ATTN_PART_MAX) {
        float *p = b->host->alloc(b->host->ctx, (size_t)need * sizeof(float));
        if (p) {
            b->host->free(b->host->ctx, b->attn_part);
            b->attn_part = p, b->attn_part_floats = need;
        }
    }
    aa->part = b->attn_part, aa->part_floats = b->attn_part_floats;
}

/* ------------------------------------------------------ tensor parallelism */

/* Sum x (n floats) over the ranks; nothing to do for a whole model. */
static loom_status cpu_all_reduce(cpu_backend *b, float *x, int64_t n, loom_error *err) {
    if (!b->sharded) return LOOM_OK;
    return b->comm.all_reduce_sum(b->comm.ctx, b->comm.rank, x, n, LOOM_DTYPE_F32, NULL, err);
}

/* Vocabulary-parallel embedding: x (T, H) gets this rank's rows (tokens of
 * other ranks' slices get zeros), then the sum over ranks. Exactly one rank
 * contributes each row, so the sum is exact. */
static loom_status cpu_embed_shard(cpu_backend *b, float *x, const int32_t *ids, int64_t T,
                                   int64_t H, loom_error *err) {
    for (int64_t t = 0; t < T; t++) {
        int64_t v = (int64_t)ids[t] - b->vocab_lo;
        if (v >= 0 && v < b->vocab_rows)
            memcpy(x + t * H, b->embed + v * H, (size_t)H * sizeof(float));
        else
            memset(x + t * H, 0, (size_t)H * sizeof(float));
    }
    return cpu_all_reduce(b, x, T * H, err);
}

/* Vocabulary-parallel LM head on xn (NL, H): this rank's (NL, vocab_pad)
 * slice, all-gathered as (size, NL, vocab_pad), reordered into logits
 * (NL, vocab) when this rank was given a buffer. */
static loom_status cpu_lm_head_shard(cpu_backend *b, const float *xn, int64_t NL, float *logits,
                                     loom_error *err) {
    const loom_host *h = b->host;
    const int64_t V = b->mc.vocab_size, P = b->vocab_pad;
    const int64_t n = b->comm.size;
    if (NL > b->lg_rows) {
        int64_t rows = NL < 16 ? 16 : NL;
        float *p = h->alloc(h->ctx, (size_t)(rows * P * (n + 1)) * sizeof(float));
        if (!p)
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "backend cpu: out of memory for %.1f MiB of logits (%lld rows of %lld "
                            "on %lld ranks)",
                            (double)(rows * P * (n + 1)) * sizeof(float) / (1 << 20),
                            (long long)rows, (long long)P, (long long)n);
        h->free(h->ctx, b->lg_local);
        b->lg_local = p;
        b->lg_all = p + rows * P;
        b->lg_rows = rows;
    }
    float *loc = b->lg_local;
    loom_status st = cpu_lm_head(b, loc, P, xn, NL, err);
    if (st != LOOM_OK) return st;
    if (b->vocab_rows < P) /* padding: gathered, never read; keep it defined */
        for (int64_t i = 0; i < NL; i++)
            memset(loc + i * P + b->vocab_rows, 0, (size_t)(P - b->vocab_rows) * sizeof(float));
    st = b->comm.all_gather(b->comm.ctx, b->comm.rank, loc, b->lg_all, NL * P,
                                        LOOM_DTYPE_F32, NULL, err);
    if (st != LOOM_OK || !logits) return st;
    for (int64_t r = 0; r < n; r++) {
        int64_t lo = r * P, w = V - lo < P ? V - lo : P;
        for (int64_t i = 0; w > 0 && i < NL; i++)
            memcpy(logits + i * V + lo, b->lg_all + (r * NL + i) * P, (size_t)w * sizeof(float));
    }
    return LOOM_OK;
}

/* ---------------------------------------------------- pipeline parallelism */

/* A stage before the last hands x (T, H) to the next one. */
static loom_status cpu_stage_out(cpu_backend *b, const float *x, int64_t T, int64_t H,
                                 loom_error *err) {
    return b->stage.send_next(b->stage.ctx, x, T * H, LOOM_DTYPE_F32, NULL, err);
}

/* ---------------------------------------------------------- linear groups */

/* Parts [k0, k1) of layer ly's linear weights side by side:
 * y (T, ldy) columns [off_k, off_k + rows_k) = x (T, K) @ W_k^T (+ bias)
 * + beta * y. `fused` is the float32 matrix of all the parts when every
 * part is float (one GEMM, as without a quantizer); otherwise consecutive
 * quantized parts run as one loom_cpu_qlinear_multi and consecutive float
 * parts (carved contiguously at load) as one loom_cpu_linear, each into its
 * column slice. */
static loom_status cpu_group(cpu_backend *b, const cpu_layer *ly, int k0, int k1, float *y,
                             int64_t ldy, const float *x, int64_t ldx, const float *fused,
                             const float *bias, int64_t T, int64_t K, float beta,
                             loom_error *err) {
    const int64_t rows[CPU_NLIN] = {b->q_dim, b->kv_dim, b->kv_dim, b->mc.hidden_size,
                                    b->mc.intermediate_size, b->mc.intermediate_size,
                                    b->mc.hidden_size};
    if (fused) {
        int64_t n = 0;
        for (int k = k0; k < k1; k++) n += rows[k];
        loom_cpu_linear(y, ldy, x, ldx, fused, bias, T, n, K, beta, b->pool);
        return LOOM_OK;
    }
    int64_t off = 0;
    for (int k = k0; k < k1;) {
        int64_t o0 = off;
        if (!ly->lin[k].quant) {
            const float *w = ly->lin[k].f;
            int64_t n = 0;
            while (k < k1 && !ly->lin[k].quant) n += rows[k++];
            loom_cpu_linear(y + o0, ldy, x, ldx, w, bias ? bias + o0 : NULL, T, n, K, beta,
                            b->pool);
            off += n;
            continue;
        }
        const loom_cpu_qweight *ws[CPU_NLIN];
        const float *bs[CPU_NLIN];
        int n = 0;
        while (k < k1 && ly->lin[k].quant) {
            ws[n] = &ly->lin[k].w;
            bs[n++] = bias ? bias + off : NULL;
            off += rows[k++];
        }
        if (!loom_cpu_qlinear_multi(y + o0, ldy, x, ldx, ws, bias ? bs : NULL, n, T, beta,
                                    b->qscratch, b->pool))
            return b->host->error(b->host->ctx, err, LOOM_ERR_NOMEM,
                                  "backend cpu: out of memory for the quantized kernels' scratch "
                                  "(%lld tokens); lower max_num_batched_tokens",
                                  (long long)T);
    }
    return LOOM_OK;
}

/* LM head rows this rank holds: y (NL, ldy) = xn (NL, H) @ head^T. */
static loom_status cpu_lm_head(cpu_backend *b, float *y, int64_t ldy, const float *xn, int64_t NL,
                               loom_error *err) {
    const int64_t H = b->mc.hidden_size;
    if (b->vocab_rows <= 0) return LOOM_OK;
    if (!b->lm_q.quant) {
        loom_cpu_linear(y, ldy, xn, H, b->lm_head, NULL, NL, b->vocab_rows, H, 0.0f, b->pool);
        return LOOM_OK;
    }
    if (!loom_cpu_qlinear(y, ldy, xn, H, &b->lm_q.w, NULL, NL, 0.0f, b->qscratch, b->pool))
        return b->host->error(b->host->ctx, err, LOOM_ERR_NOMEM,
                              "backend cpu: out of memory for the quantized kernels' scratch "
                              "(LM head, %lld rows)",
                              (long long)NL);
    return LOOM_OK;
}

/* ------------------------------------------------------------ calibration */

loom_status cpu_backend_set_observer(void *self, const loom_act_observer *obs, loom_error *err) {
    cpu_backend *b = self;
    const loom_host *h = b->host;
    if (!obs) {
        b->obs = (loom_act_observer){0};
        return LOOM_OK;
    }
    if (obs->struct_size < offsetof(loom_act_observer, record) + sizeof obs->record || !obs->record)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: set_observer: observer without record() (struct_size %u)",
                        obs->struct_size);
    if (b->sharded || b->stage.struct_size)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: a %s sees only %s; record activations on one whole backend",
                        b->sharded ? "tensor-parallel rank" : "pipeline stage",
                        b->sharded ? "its shard of each activation" : "its own layers");
    b->obs = (loom_act_observer){.struct_size = sizeof b->obs, .ctx = obs->ctx,
                                 .record = obs->record};
    return LOOM_OK;
}

/* Report x (T, cols), the input of layer l's weights `parts` (CPU_L*),
 * to the installed observer, if any. */
static void cpu_observe(const cpu_backend *b, int32_t l, const int *parts, int nparts,
                        const float *x, int64_t ldx, int64_t T, int64_t cols) {
    static const char *const canon[CPU_NLIN] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                "ffn_gate", "ffn_up", "ffn_down"};
    if (!b->obs.record) return;
    char buf[CPU_NLIN][48];
    const char *names[CPU_NLIN];
    for (int i = 0; i < nparts; i++) {
        snprintf(buf[i], sizeof buf[i], "blk.%d.%s.weight", (int)l, canon[parts[i]]);
        names[i] = buf[i];
    }
    b->obs.record(b->obs.ctx, names, nparts, x, ldx, T, cols);
}

/* ----------------------------------------------------------------- forward */

/* Layer l's attention block: x (T, H) += O(attention(RoPE(QKV(norm(x)))))
 * — the O product normed first (post_attn_norm) for Gemma 3, where a local
 * layer also reads its own RoPE tables and only its window of keys. With
 * block-table groups the layer's K/V go through its group's table and
 * slot mapping. */
static loom_status cpu_attention_block(cpu_backend *b, const loom_batch *bt, int32_t l,
                                       loom_cpu_attn_args *aa, float beta_res, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cpu_layer *ly = &b->layers[l];
    const int64_t T = bt->num_tokens, H = c->hidden_size, QKV = b->qkv_rows, QD = b->q_dim;
    const int32_t window = loom_kv_layer_window(c, l);
    const bool local = window > 0;
    const int64_t g = b->kv_group[l - b->layer0];
    const int64_t *slots = bt->slot_mapping + g * T;
    aa->block_table = bt->block_table + g * bt->num_seqs * bt->block_table_stride;
    const float *cos_t = local ? b->rope_cos_local : b->rope_cos;
    const float *sin_t = local ? b->rope_sin_local : b->rope_sin;
    float *x = b->x, *xn = b->xn, *qkv = b->qkv, *k = b->qkv + QD;
    loom_status st;
    /* (T, H) -> (T, QKV) -> (T, QD) -> (T, H) */
    loom_cpu_rmsnorm(xn, H, x, H, ly->attn_norm, T, H, c->rms_norm_eps, b->pool);
    cpu_observe(b, l, (const int[]){CPU_LQ, CPU_LK, CPU_LV}, 3, xn, H, T, H);
    if ((st = cpu_group(b, ly, CPU_LQ, CPU_LV + 1, qkv, QKV, xn, H, ly->wqkv, ly->bqkv, T, H,
                        0.0f, err)) != LOOM_OK)
        return st;
    if (ly->q_norm) {
        loom_cpu_head_rmsnorm(qkv, QKV, T, c->num_heads, c->head_dim, ly->q_norm, c->rms_norm_eps, b->pool);
        loom_cpu_head_rmsnorm(k, QKV, T, c->num_kv_heads, c->head_dim, ly->k_norm, c->rms_norm_eps, b->pool);
    }
    loom_cpu_rope_apply(qkv, QKV, T, c->num_heads, c->head_dim, cos_t, sin_t);
    loom_cpu_rope_apply(k, QKV, T, c->num_kv_heads, c->head_dim, cos_t, sin_t);
    loom_cpu_kv_write(aa->kv, k, QKV, k + b->kv_dim, QKV, slots, T);
    aa->window = window;
    loom_cpu_paged_attention(aa, b->pool);
    cpu_observe(b, l, (const int[]){CPU_LO}, 1, b->att, QD, T, QD);
    if (!ly->post_attn_norm)
        return cpu_group(b, ly, CPU_LO, CPU_LO + 1, x, H, b->att, QD, ly->wo, NULL, T, QD, beta_res, err);
    if ((st = cpu_group(b, ly, CPU_LO, CPU_LO + 1, xn, H, b->att, QD, ly->wo, NULL, T, QD, 0.0f, err)))
        return st;
    loom_cpu_add_normed(x, xn, ly->post_attn_norm, T, H, c->rms_norm_eps, b->pool);
    return LOOM_OK;
}

/* Layer l's FFN block: x (T, H) += down(act(gate) * up) of norm(x), the
 * down product normed first (post_ffn_norm) for Gemma 3. */
static loom_status cpu_ffn_block(cpu_backend *b, int64_t T, int32_t l, float beta_res, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cpu_layer *ly = &b->layers[l];
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    float *x = b->x, *xn = b->xn, *gu = b->gu, *act = b->act;
    loom_status st;
    /* (T, H) -> (T, 2I) -> (T, I) -> (T, H) */
    loom_cpu_rmsnorm(xn, H, x, H, ly->ffn_norm, T, H, c->rms_norm_eps, b->pool);
    cpu_observe(b, l, (const int[]){CPU_LGATE, CPU_LUP}, 2, xn, H, T, H);
    if ((st = cpu_group(b, ly, CPU_LGATE, CPU_LUP + 1, gu, 2 * I, xn, H, ly->wgu, NULL, T, H,
                        0.0f, err)) != LOOM_OK)
        return st;
    if (c->ffn_act == LOOM_FFN_GELU_TANH) loom_cpu_geglu_tanh(act, gu, 2 * I, gu + I, 2 * I, T, I, b->pool);
    else loom_cpu_swiglu(act, gu, 2 * I, gu + I, 2 * I, T, I, b->pool);
    cpu_observe(b, l, (const int[]){CPU_LDOWN}, 1, act, I, T, I);
    if (!ly->post_ffn_norm)
        return cpu_group(b, ly, CPU_LDOWN, CPU_LDOWN + 1, x, H, act, I, ly->wdown, NULL, T, I, beta_res, err);
    if ((st = cpu_group(b, ly, CPU_LDOWN, CPU_LDOWN + 1, xn, H, act, I, ly->wdown, NULL, T, I, 0.0f, err)))
        return st;
    loom_cpu_add_normed(x, xn, ly->post_ffn_norm, T, H, c->rms_norm_eps, b->pool);
    return LOOM_OK;
}

/* x (T, H): each token's row decoded from the embedding's GGUF blocks
 * (the same values the float32 copy would hold). */
static loom_status cpu_embed_blocks(cpu_backend *b, const int32_t *ids, int64_t T, loom_error *err) {
    const loom_host *h = b->host;
    const loom_tensor *e = b->embed_blocks;
    const int64_t H = b->mc.hidden_size;
    const size_t row = h->dtype_row_bytes(e->dtype, H);
    for (int64_t t = 0; t < T; t++)
        if (h->convert(LOOM_DTYPE_F32, b->x + t * H, e->dtype, (const uint8_t *)e->data + (size_t)ids[t] * row, H))
            return h->error(h->ctx, err, LOOM_ERR_INTERNAL, "backend cpu: cannot decode row %d of %s (%s)",
                            (int)ids[t], e->name ? e->name : "token_embd.weight", h->dtype_name(e->dtype));
    return LOOM_OK;
}

/* x (T, H): the token embeddings (times the model's embed_scale), or on a
 * later pipeline stage the residual stream the stage before sends; and the
 * RoPE tables of this batch's positions (the local layers' too). */
static loom_status cpu_embed(cpu_backend *b, const loom_batch *bt, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const int64_t T = bt->num_tokens, H = c->hidden_size, half = c->head_dim / 2;
    loom_status st;
    if (!b->first_stage) {
        if ((st = b->stage.recv_prev(b->stage.ctx, b->x, T * H, LOOM_DTYPE_F32, NULL, err)) != LOOM_OK)
            return st;
    } else if (b->embed_blocks) {
        if ((st = cpu_embed_blocks(b, bt->token_ids, T, err)) != LOOM_OK) return st;
    } else if (!b->sharded) {
        loom_cpu_embedding(b->x, b->embed, bt->token_ids, T, H);
    } else if ((st = cpu_embed_shard(b, b->x, bt->token_ids, T, H, err)) != LOOM_OK) {
        return st;
    }
    if (b->first_stage && c->embed_scale > 0 && c->embed_scale != 1.0f) loom_cpu_scale(b->x, T * H, c->embed_scale);
    loom_cpu_rope_table(b->rope_cos, b->rope_sin, bt->positions, T, b->inv_freq, (int32_t)half);
    if (c->sliding_window > 0)
        loom_cpu_rope_table(b->rope_cos_local, b->rope_sin_local, bt->positions, T, b->inv_freq_local,
                            (int32_t)half);
    return LOOM_OK;
}

loom_status cpu_backend_forward(void *self, const loom_batch *bt, float *logits, loom_error *err) {
    cpu_backend *b = self;
    loom_status st = cpu_check_batch(b, bt, logits, err);
    if (st != LOOM_OK || bt->num_tokens == 0) return st;
    const loom_model_config *c = &b->mc;
    const int64_t T = bt->num_tokens, H = c->hidden_size, QD = b->q_dim, QKV = b->qkv_rows;
    const int64_t NL = bt->num_logits;
    if ((st = cpu_scratch(b, T > NL ? T : NL, err)) != LOOM_OK) return st;
    if ((st = cpu_embed(b, bt, err)) != LOOM_OK) return st;
    /* the residual joins the row-parallel GEMMs on one rank only */
    const float beta_res = !b->sharded || b->comm.rank == 0 ? 1.0f : 0.0f;

    loom_cpu_kv kv = {.dtype = b->kv_layout.dtype,
                      .num_blocks = b->kv_layout.num_blocks,
                      .num_kv_heads = c->num_kv_heads,
                      .block_size = b->kv_layout.block_size,
                      .head_dim = c->head_dim};
    loom_cpu_attn_args aa = {.out = b->att,
                             .ldo = QD,
                             .q = b->qkv,
                             .ldq = QKV,
                             .kv = &kv,
                             .num_heads = c->num_heads,
                             .num_tokens = bt->num_tokens,
                             .num_seqs = bt->num_seqs,
                             .query_start = bt->query_start,
                             .positions = bt->positions,
                             .block_table = bt->block_table,
                             .block_table_stride = bt->block_table_stride,
                             .scale = c->attn_scale > 0 ? c->attn_scale
                                                        : (float)(1.0 / sqrt((double)c->head_dim))};
    cpu_attn_part(b, &aa);

    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++) {
        kv.k = cpu_pool_base(b, l, 0, false);
        kv.v = cpu_pool_base(b, l, 1, false);
        bool combined = false; /* the all-to-all MoE form may leave nothing to sum */
        if ((st = cpu_attention_block(b, bt, l, &aa, beta_res, err)) != LOOM_OK ||
            (st = cpu_all_reduce(b, b->x, T * H, err)) != LOOM_OK ||
            (st = b->layers[l].moe.ex ? cpu_moe_block(b, T, l, beta_res, &combined, err)
                                       : cpu_ffn_block(b, T, l, beta_res, err)) ||
            (!combined && (st = cpu_all_reduce(b, b->x, T * H, err)) != LOOM_OK))
            return st;
    }

    if (!b->last_stage) return cpu_stage_out(b, b->x, T, H, err);
    /* final norm and LM head on the wanted rows only: (NL, H) -> (NL, V) */
    float *x = b->x, *xn = b->xn;
    if (NL > 0) {
        for (int64_t i = 0; i < NL; i++)
            loom_cpu_rmsnorm(xn + i * H, H, x + (int64_t)bt->logits_index[i] * H, H, b->out_norm,
                             1, H, c->rms_norm_eps, NULL);
        if (b->sharded) return cpu_lm_head_shard(b, xn, NL, logits, err);
        return cpu_lm_head(b, logits, c->vocab_size, xn, NL, err);
    }
    return LOOM_OK;
}

/* The logits are on the host already: forward() into a kept buffer, then
 * the summary host->logits_topk_row defines, on the pool
 * (loom_cpu_logits_topk: the host's ids and values; the log-sum-exp from
 * float exps). It saves the engine no transfer here, but runs the engine's
 * candidate path in every CPU test. */
_Static_assert(LOOM_LOGITS_TOPK_MAX <= LOOM_CPU_TOPK_MAX, "the cpu top-k kernel holds every k forward_topk takes");
loom_status cpu_backend_forward_topk(void *self, const loom_batch *bt, const loom_logits_topk *out,
                                     loom_error *err) {
    cpu_backend *b = self;
    const int64_t V = b->mc.vocab_size, NL = bt ? bt->num_logits : 0;
    if (!out || out->struct_size < offsetof(loom_logits_topk, allowed) || out->k < 1 || out->k > LOOM_LOGITS_TOPK_MAX ||
        out->k > V || (NL > 0 && (!out->top_ids || !out->top_vals || !out->lse || !out->want_full)))
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cpu: forward_topk: bad request (k %d, vocab %lld, or NULL arrays)",
                              out ? out->k : 0, (long long)V);
    if (!b->last_stage) return cpu_backend_forward(self, bt, NULL, err); /* no logits here */
    const size_t need = (size_t)NL * (size_t)V;
    if (need > b->topk_cap) {
        float *p = b->host->alloc(b->host->ctx, need * sizeof(float));
        if (!p)
            return b->host->error(b->host->ctx, err, LOOM_ERR_NOMEM, "backend cpu: out of memory for %lld logits rows",
                                  (long long)NL);
        b->host->free(b->host->ctx, b->topk_logits);
        b->topk_logits = p;
        b->topk_cap = need;
    }
    loom_status st = cpu_backend_forward(self, bt, b->topk_logits, err);
    if (st != LOOM_OK) return st;
    /* constraint masks (ABI 2.4): the caller fills them now */
    const bool masks = LOOM_HAS_FIELD(out, loom_logits_topk, fill_masks) && out->allowed;
    if (masks && out->fill_masks && (st = out->fill_masks(out->fill_ctx, err)) != LOOM_OK) return st;
    for (int64_t r = 0; r < NL; r++) {
        const float *row = b->topk_logits + (size_t)r * (size_t)V;
        const uint32_t *m = masks ? out->allowed[r] : NULL;
        int32_t *ids = out->top_ids + r * out->k;
        float *vals = out->top_vals + r * out->k;
        loom_cpu_logits_topk(row, V, m, out->k, ids, vals, out->lse + r, b->pool);
        if (out->want_full[r]) {
            if (!out->full)
                return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID, "backend cpu: forward_topk: row %lld wants "
                                      "whole logits but no buffer was given", (long long)r);
            memcpy(out->full + (size_t)r * (size_t)V, row, (size_t)V * sizeof(float));
        }
    }
    return LOOM_OK;
}
