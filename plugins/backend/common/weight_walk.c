/*
 * plugins/backend/common/weight_walk.c — see weight_walk.h: the model's
 * tensors checked, windowed for this rank and planned, once for every
 * backend.
 */
#include "weight_walk.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const char *const ww_lin_names[LOOM_WW_NLIN] = {"attn_q",   "attn_k", "attn_v", "attn_output",
                                                      "ffn_gate", "ffn_up", "ffn_down"};

const char *loom_ww_lin_name(int k) { return k >= 0 && k < LOOM_WW_NLIN ? ww_lin_names[k] : "?"; }

const char *loom_ww_qformat_name(loom_qformat f) {
    switch (f) {
    case LOOM_QFMT_NONE: return "none";
    case LOOM_QFMT_INT8_W8A16: return "int8_w8a16";
    case LOOM_QFMT_INT8_W8A8: return "int8_w8a8";
    case LOOM_QFMT_FP8_W8A8: return "fp8_w8a8";
    case LOOM_QFMT_INT4_W4A16: return "int4_w4a16";
    case LOOM_QFMT_GGUF: return "gguf";
    }
    return "unknown";
}

loom_status loom_ww_begin(loom_ww *w, const loom_host *host, const char *who, const char *log_who,
                          bool loaded, const loom_model_view *m, const loom_comm *comm,
                          loom_error *err) {
    *w = (loom_ww){.host = host, .who = who, .log_who = log_who};
    char why[LOOM_ERROR_MSG_MAX - 64];
    loom_status st = host->check_load(loaded, m, comm, why, sizeof why);
    if (st != LOOM_OK) return host->error(host->ctx, err, st, "%s: %s", who, why);
    const loom_model_config *c = w->config = m->config;
    st = host->shard_plan(c, comm ? comm->rank : 0, comm ? comm->size : 1, &w->shard, why, sizeof why);
    if (st != LOOM_OK) return host->error(host->ctx, err, st, "%s: load_shard(): %s", who, why);
    const loom_shard *s = &w->shard;
    const int64_t D = c->head_dim;
    w->hidden = c->hidden_size;
    w->vocab = c->vocab_size;
    w->inter = c->intermediate_size;
    w->q_dim = (int64_t)c->num_heads * D;
    w->kv_dim = (int64_t)c->num_kv_heads * D;
    w->layers = c->num_layers;
    w->q_rows = (int64_t)s->heads * D;
    w->kv_rows = (int64_t)s->kv_heads * D;
    w->qkv_rows = w->q_rows + 2 * w->kv_rows;
    w->inter_rows = s->inter;
    w->q0 = (int64_t)s->head0 * D;
    w->k0 = (int64_t)s->kv0 * D;
    w->i0 = s->inter0;
    w->group[LOOM_WW_G_QKV] = (loom_ww_group){LOOM_WW_Q, LOOM_WW_O, w->qkv_rows, w->hidden};
    w->group[LOOM_WW_G_O] = (loom_ww_group){LOOM_WW_O, LOOM_WW_GATE, w->hidden, w->q_rows};
    w->group[LOOM_WW_G_GU] = (loom_ww_group){LOOM_WW_GATE, LOOM_WW_DOWN, 2 * w->inter_rows, w->hidden};
    w->group[LOOM_WW_G_DOWN] = (loom_ww_group){LOOM_WW_DOWN, LOOM_WW_NLIN, w->hidden, w->inter_rows};
    return LOOM_OK;
}

/* host->model_tensor with the backend's prefix on its reason. */
static loom_status ww_tensor(const loom_ww *w, const loom_model_view *m, const char *name, int64_t d0,
                             int64_t d1, bool required, const loom_tensor **out, loom_error *err) {
    char why[LOOM_ERROR_MSG_MAX - 16];
    loom_status st = w->host->model_tensor(m, name, d0, d1, required, out, why, sizeof why);
    if (st != LOOM_OK) return w->host->error(w->host->ctx, err, st, "%s: %s", w->who, why);
    return LOOM_OK;
}

static void ww_window(loom_ww_part *p, const loom_tensor *t, const char *name, int64_t r0, int64_t nr,
                      int64_t c0, int64_t nc) {
    *p = (loom_ww_part){.t = t, .r0 = r0, .nr = nr, .c0 = c0, .nc = nc};
    snprintf(p->name, sizeof p->name, "%s", name);
}

/* The quantizer's plan for linear weight t (NONE without a quantizer):
 * packed AWQ/GPTQ data needs a quantizer that reads it; a quantized format
 * needs the backend's kernels (hooks) and, unless its GGUF blocks are used
 * as stored, the quantizer's quantize()/release(). */
static loom_status ww_plan(const loom_ww *w, const loom_model_view *m, const loom_quant_binding *q,
                           const loom_ww_hooks *hk, const loom_tensor *t, const char *name,
                           loom_quant_plan *plan, loom_error *err) {
    const loom_host *h = w->host;
    loom_status st;
    *plan = (loom_quant_plan){.struct_size = sizeof *plan, .format = LOOM_QFMT_NONE};
    if (q && q->ops && q->ops->plan && (st = q->ops->plan(q->self, m, t, plan, err)) != LOOM_OK)
        return st;
    if (plan->format == LOOM_QFMT_NONE) {
        if (!h->packed_qweight(m, t)) return LOOM_OK;
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' is stored only as packed 4-bit AWQ/GPTQ data, but %s; use "
                        "quantizer: {plugin: int4, source: awq | gptq | gptq_v2} and keep the tensor "
                        "out of quantizer.skip",
                        w->who, name,
                        q && q->ops ? "the quantizer keeps it unquantized" : "the pipeline has no quantizer");
    }
    /* a plan other than NONE came from q->ops->plan */
    if (hk && hk->runnable && (st = hk->runnable(hk->ctx, q, t, name, plan, err)) != LOOM_OK) return st;
    if (plan->format != LOOM_QFMT_GGUF && (!q->ops->quantize || !q->ops->release))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "%s: quantizer '%s' planned format %s for tensor '%s' but has no "
                        "quantize()/release() to produce it",
                        w->who, q->name ? q->name : "?", loom_ww_qformat_name(plan->format), name);
    return LOOM_OK;
}

/* Layer l's whole 1-D tensors that the config asks for beyond Llama's:
 * QK-norm weights (head_dim) and post-norm weights (hidden). */
static loom_status ww_layer_norms(loom_ww *w, const loom_model_view *m, int32_t l, loom_error *err) {
    const loom_model_config *c = w->config;
    loom_ww_layer *ly = &w->layer[l];
    const struct {
        bool want;
        const char *suffix;
        int64_t n;
        loom_ww_part *dst;
    } norms[] = {
        {c->qk_norm, "attn_q_norm", c->head_dim, &ly->q_norm},
        {c->qk_norm, "attn_k_norm", c->head_dim, &ly->k_norm},
        {c->post_norms, "post_attention_norm", w->hidden, &ly->post_attn_norm},
        {c->post_norms, "post_ffw_norm", w->hidden, &ly->post_ffn_norm},
    };
    char name[96];
    const loom_tensor *t;
    loom_status st;
    for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) {
        if (!norms[i].want) continue;
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, norms[i].suffix);
        if ((st = ww_tensor(w, m, name, norms[i].n, -1, true, &t, err))) return st;
        ww_window(norms[i].dst, t, name, 0, 1, 0, norms[i].n);
    }
    return LOOM_OK;
}

void loom_ww_expert_view(const loom_ww *w, const loom_tensor *t, int32_t e, loom_tensor *out) {
    const size_t bytes = w->host->dtype_row_bytes(t->dtype, t->shape[2]) * (size_t)t->shape[1];
    *out = *t;
    out->ndim = 2;
    out->shape[0] = t->shape[1];
    out->shape[1] = t->shape[2];
    out->shape[2] = 1;
    out->data = (uint8_t *)t->data + (size_t)e * bytes; /* read-only: the model's data */
    out->nbytes = bytes;
}

/* A stacked expert tensor (d0, d1, d2) with whole rows of data. */
static loom_status ww_tensor3(const loom_ww *w, const loom_model_view *m, const char *name, int64_t d0,
                              int64_t d1, int64_t d2, const loom_tensor **out, loom_error *err) {
    const loom_host *h = w->host;
    const loom_tensor *t = *out = m->get(m->ctx, name);
    if (!t)
        return h->error(h->ctx, err, LOOM_ERR_NOT_FOUND, "%s: model '%s' has no tensor %s (a mixture of %d "
                        "experts needs it)", w->who, w->config->name, name, w->config->num_experts);
    const size_t row = h->dtype_row_bytes(t->dtype, d2);
    if (t->ndim != 3 || t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2 || !t->data || row == 0 ||
        t->nbytes != row * (size_t)(d0 * d1))
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor %s is (%lld, %lld, %lld) %s of %zu bytes; expected (%lld, %lld, %lld) with "
                        "data from the model's configuration",
                        w->who, name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                        (long long)(t->ndim > 2 ? t->shape[2] : 0), h->dtype_name(t->dtype), t->nbytes,
                        (long long)d0, (long long)d1, (long long)d2);
    return LOOM_OK;
}

/* Layer l's experts: the router, the three stacked expert tensors (each
 * kind planned once through expert 0's view) and the shared expert. */
static loom_status ww_moe(loom_ww *w, const loom_model_view *m, const loom_quant_binding *q,
                          const loom_ww_hooks *hk, int32_t l, loom_error *err) {
    const loom_model_config *c = w->config;
    loom_ww_layer *ly = &w->layer[l];
    const int64_t H = w->hidden, E = c->num_experts, I = c->expert_intermediate_size,
                  S = c->shared_expert_intermediate_size;
    static const char *const exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    static const char *const shexp[3] = {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
    char name[96];
    const loom_tensor *t;
    loom_status st;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    if ((st = ww_tensor(w, m, name, E, H, true, &t, err))) return st;
    ww_window(&ly->router, t, name, 0, E, 0, H);
    for (int k = 0; k < 3; k++) {
        const int64_t rows = k < 2 ? I : H, cols = k < 2 ? H : I;
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, exps[k]);
        if ((st = ww_tensor3(w, m, name, E, rows, cols, &t, err))) return st;
        ww_window(&ly->exps[k], t, name, w->expert0 * rows, w->experts * rows, 0, cols);
        loom_tensor view;
        loom_ww_expert_view(w, t, 0, &view);
        if ((st = ww_plan(w, m, q, hk, &view, name, &ly->exps_plan[k], err))) return st;
    }
    if (S <= 0) return LOOM_OK;
    for (int k = 0; k < 3; k++) {
        const int64_t rows = k < 2 ? S : H, cols = k < 2 ? H : S;
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, shexp[k]);
        if ((st = ww_tensor(w, m, name, rows, cols, true, &t, err)) ||
            (st = ww_plan(w, m, q, hk, t, name, &ly->shexp[k].plan, err)))
            return st;
        /* gate and up keep this rank's rows, down its input columns */
        if (k < 2) ww_window(&ly->shexp[k].w, t, name, w->shexp0, w->shexp_rows, 0, cols);
        else ww_window(&ly->shexp[k].w, t, name, 0, rows, w->shexp0, w->shexp_rows);
    }
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
    if ((st = ww_tensor(w, m, name, H, -1, true, &t, err))) return st;
    ww_window(&ly->shexp_gate, t, name, 0, 1, 0, H);
    return LOOM_OK;
}

/* Layer l's tensors: the seven linear weights (each with its plan), the two
 * norms and, with w->bias, the Q/K/V biases. */
static loom_status ww_layer(loom_ww *w, const loom_model_view *m, const loom_quant_binding *q,
                            const loom_ww_hooks *hk, int32_t l, loom_error *err) {
    loom_ww_layer *ly = &w->layer[l];
    const int64_t H = w->hidden, I = w->inter, QD = w->q_dim, KVD = w->kv_dim;
    const int64_t QDl = w->q_rows, KVDl = w->kv_rows, Il = w->inter_rows;
    const int64_t q0 = w->q0, k0 = w->k0, i0 = w->i0;
    /* whole shapes, and the window kept: Q, K, V, gate and up are
     * column-parallel (a slice of rows), O and down row-parallel (a slice
     * of their input columns, summed over ranks in forward) */
    const int64_t shape[LOOM_WW_NLIN][2] = {{QD, H}, {KVD, H}, {KVD, H}, {H, QD}, {I, H}, {I, H}, {H, I}};
    const int64_t part[LOOM_WW_NLIN][4] = {{q0, QDl, 0, H}, {k0, KVDl, 0, H}, {k0, KVDl, 0, H},
                                           {0, H, q0, QDl}, {i0, Il, 0, H},   {i0, Il, 0, H},
                                           {0, H, i0, Il}};
    static const int group[LOOM_WW_NLIN] = {LOOM_WW_G_QKV, LOOM_WW_G_QKV, LOOM_WW_G_QKV, LOOM_WW_G_O,
                                            LOOM_WW_G_GU,  LOOM_WW_G_GU,  LOOM_WW_G_DOWN};
    const int64_t group_row[LOOM_WW_NLIN] = {0, QDl, QDl + KVDl, 0, 0, Il, 0};
    char name[96];
    const loom_tensor *t;
    loom_status st;
    const bool moe = w->config->num_experts > 0;
    for (int k = 0; k < LOOM_WW_NLIN; k++) {
        loom_ww_lin *li = &ly->lin[k];
        li->group = group[k];
        li->group_row = group_row[k];
        li->plan = (loom_quant_plan){.struct_size = sizeof li->plan, .format = LOOM_QFMT_NONE};
        if (moe && k >= LOOM_WW_GATE) continue; /* experts instead (ww_moe) */
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, ww_lin_names[k]);
        if ((st = ww_tensor(w, m, name, shape[k][0], shape[k][1], true, &t, err)) ||
            (st = ww_plan(w, m, q, hk, t, name, &li->plan, err)))
            return st;
        ww_window(&li->w, t, name, part[k][0], part[k][1], part[k][2], part[k][3]);
    }
    snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
    if ((st = ww_tensor(w, m, name, H, -1, true, &t, err))) return st;
    ww_window(&ly->attn_norm, t, name, 0, 1, 0, H);
    snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
    if ((st = ww_tensor(w, m, name, H, -1, true, &t, err))) return st;
    ww_window(&ly->ffn_norm, t, name, 0, 1, 0, H);
    for (int k = 0; w->bias && k < 3; k++) {
        snprintf(name, sizeof name, "blk.%d.%s.bias", l, ww_lin_names[k]);
        if ((st = ww_tensor(w, m, name, k == 0 ? QD : KVD, -1, true, &t, err))) return st;
        ww_window(&ly->bias[k], t, name, 0, 1, k == 0 ? q0 : k0, k == 0 ? QDl : KVDl);
    }
    if ((st = ww_layer_norms(w, m, l, err))) return st;
    return moe ? ww_moe(w, m, q, hk, l, err) : LOOM_OK;
}

/* Expert parallelism over the shard's ranks: a contiguous block of
 * experts per rank and a slice of the shared expert's width. */
static loom_status ww_expert_split(loom_ww *w, loom_error *err) {
    const loom_model_config *c = w->config;
    const int32_t n = w->shard.size, r = w->shard.rank;
    const int64_t S = c->shared_expert_intermediate_size;
    if (c->num_experts <= 0) return LOOM_OK;
    if (c->num_experts % n != 0 || S % n != 0)
        return w->host->error(w->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                              "%s: model '%s' has %d experts and a shared expert of width %lld; expert parallelism "
                              "over %d ranks needs both divisible by the rank count",
                              w->who, c->name, c->num_experts, (long long)S, n);
    w->experts = c->num_experts / n;
    w->expert0 = r * w->experts;
    w->shexp_rows = S / n;
    w->shexp0 = r * w->shexp_rows;
    return LOOM_OK;
}

loom_status loom_ww_collect(loom_ww *w, const loom_model_view *m, const loom_quant_binding *q,
                            const loom_ww_hooks *hooks, loom_error *err) {
    const loom_host *h = w->host;
    const loom_model_config *c = w->config;
    const int64_t H = w->hidden, V = w->vocab;
    const loom_tensor *t_embed, *t_onorm, *t_out, *t_probe;
    loom_status st;
    if ((st = ww_expert_split(w, err))) return st;
    if ((st = ww_tensor(w, m, "token_embd.weight", V, H, true, &t_embed, err)) ||
        (st = ww_tensor(w, m, "output_norm.weight", H, -1, true, &t_onorm, err)) ||
        (st = ww_tensor(w, m, "output.weight", V, H, false, &t_out, err)))
        return st;
    if (!t_out && !c->tie_embeddings && w->shard.rank == 0)
        h->log(h->ctx, LOOM_LOG_WARN, w->log_who,
               "model '%s' has no output.weight and tie_embeddings is false; using the token "
               "embeddings as the LM head",
               c->name);
    if ((st = ww_tensor(w, m, "blk.0.attn_q.bias", w->q_dim, -1, false, &t_probe, err))) return st;
    w->bias = c->qkv_bias || t_probe != NULL;
    /* vocabulary-parallel: this rank's rows of the embedding and LM head */
    ww_window(&w->embed, t_embed, "token_embd.weight", w->shard.vocab_lo, w->shard.vocab_rows, 0, H);
    ww_window(&w->out_norm, t_onorm, "output_norm.weight", 0, 1, 0, H);
    ww_window(&w->out, t_out, "output.weight", w->shard.vocab_lo, w->shard.vocab_rows, 0, H);
    w->out_plan = (loom_quant_plan){.struct_size = sizeof w->out_plan, .format = LOOM_QFMT_NONE};
    if (t_out && (st = ww_plan(w, m, q, hooks, t_out, "output.weight", &w->out_plan, err))) return st;
    w->layer = h->calloc(h->ctx, (size_t)w->layers, sizeof *w->layer);
    if (!w->layer)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "%s: out of host memory for %d layers' weight list", w->who, w->layers);
    for (int32_t l = 0; l < w->layers; l++)
        if ((st = ww_layer(w, m, q, hooks, l, err)) != LOOM_OK) {
            loom_ww_free(w);
            return st;
        }
    return LOOM_OK;
}

bool loom_ww_any_quant(const loom_ww *w) {
    if (w->out.t && w->out_plan.format != LOOM_QFMT_NONE) return true;
    for (int32_t l = 0; w->layer && l < w->layers; l++)
        for (int k = 0; k < LOOM_WW_NLIN; k++)
            if (w->layer[l].lin[k].plan.format != LOOM_QFMT_NONE ||
                (k < 3 && (w->layer[l].exps_plan[k].format != LOOM_QFMT_NONE ||
                           w->layer[l].shexp[k].plan.format != LOOM_QFMT_NONE)))
                return true;
    return false;
}

void loom_ww_free(loom_ww *w) {
    if (w->layer) w->host->free(w->host->ctx, w->layer);
    w->layer = NULL;
}

loom_status loom_ww_check_stage(const loom_host *h, const char *who, const loom_model_view *m,
                                const loom_stage *stage, loom_error *err) {
    if (!stage || stage->struct_size < offsetof(loom_stage, device_links))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: load_stage() needs a stage of ABI 2.3 or later "
                        "(struct_size %u)", who, stage ? stage->struct_size : 0u);
    const int32_t L = m && m->config ? m->config->num_layers : 0;
    const int32_t i = stage->index, n = stage->count, f = stage->first_layer, k = stage->num_layers;
    if (n < 1 || i < 0 || i >= n || k < 1 || f < 0 || (int64_t)f + k > L)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: stage %d of %d holds layers %d..%d, outside the model's %d layers (0..%d)", who, i, n,
                        f, f + k - 1, L, L - 1);
    if ((i == 0) != (f == 0) || (i == n - 1) != (f + k == L))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: stage %d of %d holds layers %d..%d: the first stage must start at layer 0 and the "
                        "last end at layer %d, and only they",
                        who, i, n, f, f + k - 1, L - 1);
    if ((i > 0 && !stage->recv_prev) || (i < n - 1 && !stage->send_next))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: stage %d of %d has no %s link", who, i, n,
                        i > 0 && !stage->recv_prev ? "recv_prev" : "send_next");
    return LOOM_OK;
}

void loom_ww_copy_stage(loom_stage *out, const loom_stage *stage) {
    memset(out, 0, sizeof *out);
    if (stage) memcpy(out, stage, stage->struct_size < sizeof *out ? stage->struct_size : sizeof *out);
}
