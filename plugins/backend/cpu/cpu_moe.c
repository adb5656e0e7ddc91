/*
 * plugins/backend/cpu/cpu_moe.c — the cpu backend's mixture-of-experts FFN
 * (loom/model.h, num_experts > 0): loading the router and experts, and per
 * layer
 *   xn = rmsnorm(x); logits = xn Wr^T (T, experts);
 *   p = softmax(logits) in float32; keep the top-k of each token
 *       (renormalised when moe_norm_topk);
 *   tokens grouped by expert; for each expert with tokens, over its rows
 *   only: gu = xg [Wgate; Wup]^T, act = silu(gate) * up, y = act Wdown^T;
 *   out[token] += p * y;  (+ sigmoid(xn . w_shgate) * shared(xn))
 *   x += out.
 * Only experts some token chose are read, so a decode step of one token
 * streams k experts' weights, not all of them. The order of operations is
 * transformers' (weights multiply each expert's output before the sum; the
 * residual is added last), which the tests compare against.
 *
 * Expert weights are float32 in the arena or, when the quantizer (or
 * weight_dtype: gguf) plans them, quantized per expert: each expert's
 * matrix is a 2-D view of the stacked tensor (loom_ww_expert_view) given
 * to the quantizer like any linear weight.
 *
 * Expert parallelism (load_shard, the tp executor): a rank holds a block
 * of the experts and a slice of the shared expert's width, while attention
 * is tensor-parallel; every rank has every token (the attention
 * all-reduce replicates x), routes all of them the same way, runs only its
 * own experts and adds its partial FFN output into x, and the all-reduce
 * after the block sums the ranks (dispatch is implicit, combine is that
 * all-reduce).
 */
#include "cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static size_t cpu_moe_round(size_t n) { return (n + 15) & ~(size_t)15; }

/* ------------------------------------------------------------------- load */

/* Floats one expert of width W keeps as float32 under the plans of its
 * gate, up and down: gate|up carved together, down apart. */
static size_t cpu_expert_floats(int64_t W, int64_t H, const loom_quant_plan *const plans[CPU_NEXP]) {
    size_t gu = 0;
    for (int k = CPU_EGATE; k <= CPU_EUP; k++)
        if (plans[k]->format == LOOM_QFMT_NONE) gu += (size_t)(W * H);
    return cpu_moe_round(gu) + (plans[CPU_EDOWN]->format == LOOM_QFMT_NONE ? cpu_moe_round((size_t)(W * H)) : 0);
}

size_t cpu_moe_floats(const cpu_backend *b, const loom_ww_layer *wl) {
    if (!wl->router.t) return 0;
    const loom_model_config *c = &b->mc;
    const int64_t H = c->hidden_size, E = c->num_experts, El = wl->exps[0].nr / c->expert_intermediate_size;
    const loom_quant_plan *ep[CPU_NEXP] = {&wl->exps_plan[0], &wl->exps_plan[1], &wl->exps_plan[2]};
    size_t n = cpu_moe_round((size_t)(E * H)) + (size_t)El * cpu_expert_floats(c->expert_intermediate_size, H, ep);
    if (wl->shexp_gate.t) {
        const loom_quant_plan *sp[CPU_NEXP] = {&wl->shexp[0].plan, &wl->shexp[1].plan, &wl->shexp[2].plan};
        n += cpu_moe_round((size_t)H) + cpu_expert_floats(wl->shexp[0].w.nr, H, sp);
    }
    return n;
}

/* One expert of width W (this rank's): part k its window of a 2-D tensor
 * (a routed expert's view, or the shared expert's matrix), float32 into
 * the arena or, planned otherwise, quantized. */
static loom_status cpu_expert_load(cpu_backend *b, const loom_model_view *m, cpu_expert *ex, int64_t W,
                                   const loom_ww_part parts[CPU_NEXP], const loom_quant_plan *const plans[CPU_NEXP],
                                   float **cur, loom_error *err) {
    const int64_t H = b->mc.hidden_size;
    size_t gu_floats = 0;
    for (int k = CPU_EGATE; k <= CPU_EUP; k++)
        if (plans[k]->format == LOOM_QFMT_NONE) gu_floats += (size_t)(W * H);
    float *gu = gu_floats ? cpu_carve(cur, gu_floats) : NULL, *next = gu;
    loom_status st;
    for (int k = 0; k < CPU_NEXP; k++) {
        if (plans[k]->format != LOOM_QFMT_NONE) {
            if ((st = cpu_load_qlin(b, m, &parts[k], plans[k], &ex->lin[k], err))) return st;
            continue;
        }
        float *dst = k == CPU_EDOWN ? cpu_carve(cur, (size_t)(W * H)) : next;
        if (k != CPU_EDOWN) next += W * H;
        if ((st = cpu_dequant_win(b, &parts[k], dst, err))) return st;
        ex->lin[k] = (cpu_lin){.f = dst};
    }
    ex->wgu = !ex->lin[CPU_EGATE].quant && !ex->lin[CPU_EUP].quant ? gu : NULL;
    ex->wdown = ex->lin[CPU_EDOWN].quant ? NULL : ex->lin[CPU_EDOWN].f;
    return LOOM_OK;
}

/* The shared expert (this rank's slice of its width) and its gate vector. */
static loom_status cpu_shared_load(cpu_backend *b, const loom_model_view *m, const loom_ww_layer *wl, cpu_moe *mo,
                                   float **cur, loom_error *err) {
    const loom_ww_part parts[CPU_NEXP] = {wl->shexp[0].w, wl->shexp[1].w, wl->shexp[2].w};
    const loom_quant_plan *plans[CPU_NEXP] = {&wl->shexp[0].plan, &wl->shexp[1].plan, &wl->shexp[2].plan};
    loom_status st = cpu_expert_load(b, m, &mo->sh, wl->shexp[0].w.nr, parts, plans, cur, err);
    if (st) return st;
    float *g = cpu_carve(cur, (size_t)b->mc.hidden_size);
    if ((st = cpu_dequant_win(b, &wl->shexp_gate, g, err))) return st;
    mo->sh_gate = g;
    mo->sh_width = wl->shexp[0].w.nr;
    return LOOM_OK;
}

loom_status cpu_moe_load(cpu_backend *b, const loom_model_view *m, const loom_ww_layer *wl, cpu_layer *ly,
                         float **cur, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const int64_t H = c->hidden_size, E = c->num_experts, I = c->expert_intermediate_size;
    const int32_t e0 = (int32_t)(wl->exps[0].r0 / I), El = (int32_t)(wl->exps[0].nr / I);
    cpu_moe *mo = &ly->moe;
    loom_status st;
    float *router = cpu_carve(cur, (size_t)(E * H));
    if ((st = cpu_dequant_win(b, &wl->router, router, err))) return st;
    mo->router = router;
    mo->e0 = e0;
    mo->n = El;
    mo->ex = h->calloc(h->ctx, (size_t)El, sizeof *mo->ex);
    if (!mo->ex)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cpu: out of memory for %d experts' tables", El);
    const loom_quant_plan *plans[CPU_NEXP] = {&wl->exps_plan[0], &wl->exps_plan[1], &wl->exps_plan[2]};
    const loom_ww w = {.host = h};
    for (int32_t e = 0; e < El; e++) {
        loom_tensor view[CPU_NEXP];
        loom_ww_part parts[CPU_NEXP];
        for (int k = 0; k < CPU_NEXP; k++) {
            loom_ww_expert_view(&w, wl->exps[k].t, e0 + e, &view[k]);
            parts[k] = (loom_ww_part){.t = &view[k], .r0 = 0, .nr = view[k].shape[0], .c0 = 0,
                                      .nc = view[k].shape[1]};
            snprintf(parts[k].name, sizeof parts[k].name, "%s", wl->exps[k].name);
        }
        if ((st = cpu_expert_load(b, m, &mo->ex[e], I, parts, plans, cur, err))) return st;
    }
    return wl->shexp_gate.t ? cpu_shared_load(b, m, wl, mo, cur, err) : LOOM_OK;
}

/* Release one expert's quantizer-owned tensors. */
static void cpu_expert_release(cpu_backend *b, cpu_expert *ex) {
    const loom_quant_binding *q = &b->quant;
    for (int k = 0; k < CPU_NEXP; k++)
        if (ex->lin[k].owned && q->ops && q->ops->release) q->ops->release(q->self, &ex->lin[k].q);
    *ex = (cpu_expert){0};
}

void cpu_moe_release(cpu_backend *b) {
    for (int32_t l = 0; b->layers && l < b->mc.num_layers; l++) {
        cpu_moe *mo = &b->layers[l].moe;
        if (!mo->ex) continue;
        for (int32_t e = 0; e < mo->n; e++) cpu_expert_release(b, &mo->ex[e]);
        cpu_expert_release(b, &mo->sh);
        b->host->free(b->host->ctx, mo->ex);
        *mo = (cpu_moe){0};
    }
}

/* ---------------------------------------------------------------- forward */

/* The scratch for T token rows. */
static loom_status cpu_moe_scratch(cpu_backend *b, int64_t T, loom_error *err) {
    if (T <= b->moe_rows) return LOOM_OK;
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const int64_t rows = T < 16 ? 16 : T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_used;
    const int64_t W = c->expert_intermediate_size > c->shared_expert_intermediate_size
                          ? c->expert_intermediate_size
                          : c->shared_expert_intermediate_size;
    const size_t fl[8] = {(size_t)(rows * E), (size_t)(rows * H), (size_t)(rows * 2 * W), (size_t)(rows * W),
                          (size_t)(rows * H), (size_t)(rows * H), (size_t)(rows * K), (size_t)(rows * K)};
    const size_t ints[4] = {(size_t)(rows * K), (size_t)(rows * K), (size_t)(E + 1), (size_t)E};
    size_t total = 0;
    for (int i = 0; i < 8; i++) total += cpu_moe_round(fl[i]) * sizeof(float);
    for (int i = 0; i < 4; i++) total += cpu_moe_round(ints[i]) * sizeof(int32_t);
    uint8_t *p = h->alloc(h->ctx, total);
    if (!p)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: out of memory for %.1f MiB of expert activations (%lld tokens); lower "
                        "max_num_batched_tokens",
                        (double)total / (1 << 20), (long long)T);
    h->free(h->ctx, b->moe_scratch);
    b->moe_scratch = p;
    b->moe_rows = rows;
    float **fd[8] = {&b->moe_logits, &b->moe_xg, &b->moe_gu,  &b->moe_act,
                     &b->moe_y,      &b->moe_out, &b->moe_wt, &b->moe_slotw};
    for (int i = 0; i < 8; i++) {
        *fd[i] = (float *)p;
        p += cpu_moe_round(fl[i]) * sizeof(float);
    }
    int32_t **id[4] = {&b->moe_tok, &b->moe_sel, &b->moe_off, &b->moe_fill};
    for (int i = 0; i < 4; i++) {
        *id[i] = (int32_t *)p;
        p += cpu_moe_round(ints[i]) * sizeof(int32_t);
    }
    return LOOM_OK;
}

/* One token's routing: p = softmax(logits[0..E)) in place, then its K
 * largest (ties to the lower expert) into sel/wt in descending order,
 * divided by their sum when `norm`. As transformers does it: softmax
 * over all experts first, the sum taken in that order. */
static void cpu_moe_route(float *p, int32_t E, int32_t K, bool norm, int32_t *sel, float *wt) {
    float mx = p[0], sum = 0;
    for (int32_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int32_t e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
    for (int32_t e = 0; e < E; e++) p[e] /= sum;
    for (int32_t j = 0; j < K; j++) {
        int32_t best = 0;
        for (int32_t e = 1; e < E; e++) best = p[e] > p[best] ? e : best;
        sel[j] = best;
        wt[j] = p[best];
        p[best] = -1.0f; /* probabilities are >= 0: never chosen again */
    }
    if (!norm) return;
    float s = 0;
    for (int32_t j = 0; j < K; j++) s += wt[j];
    for (int32_t j = 0; j < K; j++) wt[j] /= s;
}

/* Route every token and group the (token, weight) pairs by expert:
 * expert e's pairs are moe_tok / moe_wt [moe_off[e], moe_off[e+1]), in
 * token order. moe_logits holds the router logits on entry. */
static void cpu_moe_group(cpu_backend *b, int64_t T) {
    const loom_model_config *c = &b->mc;
    const int32_t E = c->num_experts, K = c->num_experts_used;
    int32_t *sel = b->moe_sel, *off = b->moe_off, *fill = b->moe_fill;
    float *w = b->moe_slotw;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int64_t t = 0; t < T; t++) {
        cpu_moe_route(b->moe_logits + t * E, E, K, c->moe_norm_topk, sel + t * K, w + t * K);
        for (int32_t j = 0; j < K; j++) off[sel[t * K + j] + 1]++;
    }
    for (int32_t e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(fill, off, (size_t)E * sizeof *fill);
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < K; j++) {
            int32_t i = fill[sel[t * K + j]]++;
            b->moe_tok[i] = (int32_t)t;
            b->moe_wt[i] = w[t * K + j];
        }
}

/* y (M, ldy) columns [col0, col0 + N) = x (M, K) @ lin^T. */
static loom_status cpu_lin_apply(cpu_backend *b, const cpu_lin *lin, float *y, int64_t ldy, const float *x,
                                 int64_t M, int64_t N, int64_t K, loom_error *err) {
    if (!lin->quant) {
        loom_cpu_linear(y, ldy, x, K, lin->f, NULL, M, N, K, 0.0f, b->pool);
        return LOOM_OK;
    }
    if (!loom_cpu_qlinear(y, ldy, x, K, &lin->w, NULL, M, 0.0f, b->qscratch, b->pool))
        return b->host->error(b->host->ctx, err, LOOM_ERR_NOMEM,
                              "backend cpu: out of memory for the quantized kernels' scratch (%lld expert rows)",
                              (long long)M);
    return LOOM_OK;
}

/* y (M, H) = down(silu(gate x) * up x) of expert ex (width W) over x (M, H). */
static loom_status cpu_expert_ffn(cpu_backend *b, const cpu_expert *ex, int64_t W, const float *x, int64_t M,
                                  float *y, loom_error *err) {
    const int64_t H = b->mc.hidden_size;
    float *gu = b->moe_gu, *act = b->moe_act;
    loom_status st;
    /* (M, H) -> (M, 2W) -> (M, W) -> (M, H) */
    if (ex->wgu) loom_cpu_linear(gu, 2 * W, x, H, ex->wgu, NULL, M, 2 * W, H, 0.0f, b->pool);
    else if ((st = cpu_lin_apply(b, &ex->lin[CPU_EGATE], gu, 2 * W, x, M, W, H, err)) ||
             (st = cpu_lin_apply(b, &ex->lin[CPU_EUP], gu + W, 2 * W, x, M, W, H, err)))
        return st;
    loom_cpu_swiglu(act, gu, 2 * W, gu + W, 2 * W, M, W, b->pool);
    return cpu_lin_apply(b, &ex->lin[CPU_EDOWN], y, H, act, M, H, W, err);
}

/* out (T, H) += sigmoid(xn . w_g) * shared(xn), per token. */
static loom_status cpu_moe_shared(cpu_backend *b, const cpu_moe *mo, const float *xn, int64_t T, float *out,
                                  loom_error *err) {
    const int64_t H = b->mc.hidden_size, S = mo->sh_width;
    loom_status st = cpu_expert_ffn(b, &mo->sh, S, xn, T, b->moe_y, err);
    if (st) return st;
    for (int64_t t = 0; t < T; t++) {
        float d = 0;
        for (int64_t i = 0; i < H; i++) d += xn[t * H + i] * mo->sh_gate[i];
        const float g = 1.0f / (1.0f + expf(-d));
        for (int64_t i = 0; i < H; i++) out[t * H + i] += g * b->moe_y[t * H + i];
    }
    return LOOM_OK;
}

/* out (n, H) += w * y over the pairs [p0, p0 + n) of moe_tok / moe_wt,
 * token rows relative to `out`: the combine, in pair order. */
static void cpu_moe_combine(cpu_backend *b, float *out, int32_t p0, int32_t n, const float *y) {
    const int64_t H = b->mc.hidden_size;
    for (int32_t i = 0; i < n; i++) {
        float *o = out + (int64_t)b->moe_tok[p0 + i] * H;
        const float w = b->moe_wt[p0 + i], *yi = y + (int64_t)i * H;
        for (int64_t k = 0; k < H; k++) o[k] += w * yi[k];
    }
}

/* x = beta_res * x + out over T rows. */
static void cpu_moe_residual(float *x, const float *out, int64_t TH, float beta_res) {
    if (beta_res == 0.0f) memcpy(x, out, (size_t)TH * sizeof *x);
    else
        for (int64_t i = 0; i < TH; i++) x[i] += out[i];
}

/* The all-reduce form: every token through this rank's experts. */
static loom_status cpu_moe_local(cpu_backend *b, const cpu_moe *mo, int64_t T, float *out, loom_error *err) {
    const int64_t H = b->mc.hidden_size, E = b->mc.num_experts, I = b->mc.expert_intermediate_size;
    loom_status st;
    loom_cpu_linear(b->moe_logits, E, b->xn, H, mo->router, NULL, T, E, H, 0.0f, b->pool);
    cpu_moe_group(b, T);
    memset(out, 0, (size_t)(T * H) * sizeof *out);
    for (int32_t e = mo->e0; e < mo->e0 + mo->n; e++) { /* this rank's experts */
        const int32_t p0 = b->moe_off[e], n = b->moe_off[e + 1] - p0;
        if (n == 0) continue; /* an expert no token chose is never read */
        for (int32_t i = 0; i < n; i++)
            memcpy(b->moe_xg + (int64_t)i * H, b->xn + (int64_t)b->moe_tok[p0 + i] * H, (size_t)H * sizeof *b->xn);
        if ((st = cpu_expert_ffn(b, &mo->ex[e - mo->e0], I, b->moe_xg, n, b->moe_y, err))) return st;
        cpu_moe_combine(b, out, p0, n, b->moe_y);
    }
    return LOOM_OK;
}

/* ----------------------------------------------- expert parallel: all-to-all */

/* One step's all-to-all state, carved from b->moe_ep for T tokens. */
typedef struct cpu_ep {
    int32_t n, r;                  /* ranks, this rank                             */
    int64_t t0, ts, slice;         /* this rank's tokens [t0, t0 + ts); ceil(T/n)  */
    int32_t *cnt, *all;            /* (n) pairs sent to each rank; (n, n) everyone's */
    int64_t *sc, *rc, *scx, *rcx;  /* (n) pairs / floats sent to and received from */
    int32_t *sid, *rid;            /* expert of each pair sent (T K) / received (T K) */
    int32_t *idx, *eoff;           /* (T K) received pairs by local expert; (El + 1) */
    float *sx, *rx;                /* (T K, H) rows sent, then their results; received */
    float *gs, *gr;                /* (slice, H) this rank's output; (n slice, H) all */
} cpu_ep;

/* Carve (growing b->moe_ep when needed) the buffers of `ep` for T tokens. */
static loom_status cpu_ep_scratch(cpu_backend *b, const cpu_moe *mo, int64_t T, cpu_ep *ep, loom_error *err) {
    const loom_host *h = b->host;
    const int64_t n = ep->n, H = b->mc.hidden_size, K = b->mc.num_experts_used;
    const int64_t rows = T < 16 ? 16 : T, PK = rows * K, sl = (rows + n - 1) / n;
    const size_t ints[6] = {(size_t)n, (size_t)(n * n), (size_t)PK, (size_t)PK, (size_t)PK, (size_t)mo->n + 1};
    const size_t fl[4] = {(size_t)(PK * H), (size_t)(PK * H), (size_t)(sl * H), (size_t)(n * sl * H)};
    size_t total = 4 * cpu_moe_round((size_t)n) * sizeof(int64_t);
    for (int i = 0; i < 6; i++) total += cpu_moe_round(ints[i]) * sizeof(int32_t);
    for (int i = 0; i < 4; i++) total += cpu_moe_round(fl[i]) * sizeof(float);
    if (T > b->moe_ep_rows || !b->moe_ep) {
        uint8_t *p = h->alloc(h->ctx, total);
        if (!p)
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "backend cpu: out of memory for %.1f MiB of expert-parallel all-to-all buffers (%lld "
                            "tokens); lower max_num_batched_tokens",
                            (double)total / (1 << 20), (long long)T);
        h->free(h->ctx, b->moe_ep);
        b->moe_ep = p;
        b->moe_ep_rows = rows;
    }
    uint8_t *p = b->moe_ep;
    int64_t **l64[4] = {&ep->sc, &ep->rc, &ep->scx, &ep->rcx};
    for (int i = 0; i < 4; i++) {
        *l64[i] = (int64_t *)p;
        p += cpu_moe_round((size_t)n) * sizeof(int64_t);
    }
    int32_t **i32[6] = {&ep->cnt, &ep->all, &ep->sid, &ep->rid, &ep->idx, &ep->eoff};
    for (int i = 0; i < 6; i++) {
        *i32[i] = (int32_t *)p;
        p += cpu_moe_round(ints[i]) * sizeof(int32_t);
    }
    float **f[4] = {&ep->sx, &ep->rx, &ep->gs, &ep->gr};
    for (int i = 0; i < 4; i++) {
        *f[i] = (float *)p;
        p += cpu_moe_round(fl[i]) * sizeof(float);
    }
    return LOOM_OK;
}

/* Route this rank's slice and pack the pairs for their experts' owners:
 * pairs in expert order, so each owner's (a contiguous block of experts)
 * are contiguous and ascending. */
static void cpu_ep_pack(cpu_backend *b, const cpu_moe *mo, cpu_ep *ep) {
    const int64_t H = b->mc.hidden_size, E = b->mc.num_experts;
    const float *xs = b->xn + ep->t0 * H;
    loom_cpu_linear(b->moe_logits, E, xs, H, mo->router, NULL, ep->ts, E, H, 0.0f, b->pool);
    cpu_moe_group(b, ep->ts);
    for (int32_t e = 0; e < E; e++)
        for (int32_t i = b->moe_off[e]; i < b->moe_off[e + 1]; i++) {
            ep->sid[i] = e;
            memcpy(ep->sx + (int64_t)i * H, xs + (int64_t)b->moe_tok[i] * H, (size_t)H * sizeof *xs);
        }
    for (int32_t d = 0; d < ep->n; d++) ep->cnt[d] = b->moe_off[(d + 1) * mo->n] - b->moe_off[d * mo->n];
}

/* Exchange the pair counts (all_gather) and send every pair's expert id
 * and row to its owner. */
static loom_status cpu_ep_dispatch(cpu_backend *b, cpu_ep *ep, int64_t *received, loom_error *err) {
    const loom_comm *cm = &b->comm;
    const int64_t H = b->mc.hidden_size;
    loom_status st = cm->all_gather(cm->ctx, cm->rank, ep->cnt, ep->all, ep->n, LOOM_DTYPE_I32, NULL, err);
    if (st) return st;
    *received = 0;
    for (int32_t k = 0; k < ep->n; k++) {
        ep->sc[k] = ep->cnt[k];
        ep->rc[k] = ep->all[(int64_t)k * ep->n + ep->r];
        ep->scx[k] = ep->sc[k] * H;
        ep->rcx[k] = ep->rc[k] * H;
        *received += ep->rc[k];
    }
    if ((st = cm->all_to_allv(cm->ctx, cm->rank, ep->sid, ep->sc, ep->rid, ep->rc, LOOM_DTYPE_I32, NULL, err)))
        return st;
    return cm->all_to_allv(cm->ctx, cm->rank, ep->sx, ep->scx, ep->rx, ep->rcx, LOOM_DTYPE_F32, NULL, err);
}

/* Run this rank's experts over the R received rows, each result written
 * over its row; rows of one expert batched together. */
static loom_status cpu_ep_experts(cpu_backend *b, const cpu_moe *mo, cpu_ep *ep, int64_t R, loom_error *err) {
    const int64_t H = b->mc.hidden_size, I = b->mc.expert_intermediate_size;
    memset(ep->eoff, 0, (size_t)(mo->n + 1) * sizeof *ep->eoff);
    for (int64_t i = 0; i < R; i++) {
        const int32_t e = ep->rid[i] - mo->e0;
        if (e < 0 || e >= mo->n)
            return b->host->error(b->host->ctx, err, LOOM_ERR_INTERNAL,
                                  "backend cpu: rank %d received a row for expert %d, but holds experts %d..%d",
                                  ep->r, ep->rid[i], mo->e0, mo->e0 + mo->n - 1);
        ep->eoff[e + 1]++;
    }
    for (int32_t e = 0; e < mo->n; e++) ep->eoff[e + 1] += ep->eoff[e];
    for (int64_t i = 0; i < R; i++) ep->idx[ep->eoff[ep->rid[i] - mo->e0]++] = (int32_t)i; /* eoff[e] -> end */
    for (int32_t e = 0, p0 = 0; e < mo->n; p0 = ep->eoff[e++]) {
        const int32_t m = ep->eoff[e] - p0;
        if (m == 0) continue;
        for (int32_t i = 0; i < m; i++)
            memcpy(b->moe_xg + (int64_t)i * H, ep->rx + (int64_t)ep->idx[p0 + i] * H, (size_t)H * sizeof(float));
        loom_status st = cpu_expert_ffn(b, &mo->ex[e], I, b->moe_xg, m, b->moe_y, err);
        if (st) return st;
        for (int32_t i = 0; i < m; i++)
            memcpy(ep->rx + (int64_t)ep->idx[p0 + i] * H, b->moe_y + (int64_t)i * H, (size_t)H * sizeof(float));
    }
    return LOOM_OK;
}

/* The all-to-all form: the routed experts' output of this rank's slice
 * of the tokens into ep->gs (rows [0, ts), the rest of the slice zero). */
static loom_status cpu_ep_routed(cpu_backend *b, const cpu_moe *mo, cpu_ep *ep, loom_error *err) {
    const loom_comm *cm = &b->comm;
    const int64_t H = b->mc.hidden_size;
    int64_t R = 0;
    cpu_ep_pack(b, mo, ep);
    loom_status st = cpu_ep_dispatch(b, ep, &R, err);
    if (st || (st = cpu_ep_experts(b, mo, ep, R, err))) return st;
    /* results back to their sources, in the order the pairs were sent */
    if ((st = cm->all_to_allv(cm->ctx, cm->rank, ep->rx, ep->rcx, ep->sx, ep->scx, LOOM_DTYPE_F32, NULL, err)))
        return st;
    memset(ep->gs, 0, (size_t)(ep->slice * H) * sizeof *ep->gs);
    /* pairs by ascending expert: each token sums its experts in the
     * order one backend does */
    const int32_t pairs = b->moe_off[b->mc.num_experts];
    cpu_moe_combine(b, ep->gs, 0, pairs, ep->sx);
    return LOOM_OK;
}

/* out (T, H) = every rank's slice, all-gathered. */
static loom_status cpu_ep_gather(cpu_backend *b, cpu_ep *ep, int64_t T, float *out, loom_error *err) {
    const loom_comm *cm = &b->comm;
    const int64_t H = b->mc.hidden_size;
    loom_status st = cm->all_gather(cm->ctx, cm->rank, ep->gs, ep->gr, ep->slice * H, LOOM_DTYPE_F32, NULL, err);
    if (st) return st;
    for (int32_t s = 0; s < ep->n; s++) {
        const int64_t t0 = T * s / ep->n, t1 = T * (s + 1) / ep->n;
        memcpy(out + t0 * H, ep->gr + (int64_t)s * ep->slice * H, (size_t)((t1 - t0) * H) * sizeof *out);
    }
    return LOOM_OK;
}

/* The all-to-all form of the block. Without a shared expert the slices are
 * all-gathered and every rank adds the whole output to its (replicated)
 * x: *combined. With one, each rank's slice rows join its partial shared
 * expert output and the caller's all-reduce sums them (an all-gather
 * first would move the same rows twice). */
static loom_status cpu_moe_a2a(cpu_backend *b, const cpu_moe *mo, int64_t T, float beta_res, bool *combined,
                               loom_error *err) {
    const int64_t H = b->mc.hidden_size;
    cpu_ep ep = {.n = b->comm.size, .r = b->comm.rank, .t0 = T * b->comm.rank / b->comm.size,
                 .slice = (T + b->comm.size - 1) / b->comm.size};
    ep.ts = T * (ep.r + 1) / ep.n - ep.t0;
    loom_status st = cpu_ep_scratch(b, mo, T, &ep, err);
    if (st || (st = cpu_ep_routed(b, mo, &ep, err))) return st;
    float *out = b->moe_out;
    if (!mo->sh_gate) {
        if ((st = cpu_ep_gather(b, &ep, T, out, err))) return st;
        cpu_moe_residual(b->x, out, T * H, 1.0f);
        *combined = true;
        return LOOM_OK;
    }
    memset(out, 0, (size_t)(T * H) * sizeof *out);
    memcpy(out + ep.t0 * H, ep.gs, (size_t)(ep.ts * H) * sizeof *out);
    if ((st = cpu_moe_shared(b, mo, b->xn, T, out, err))) return st;
    cpu_moe_residual(b->x, out, T * H, beta_res);
    return LOOM_OK;
}

loom_status cpu_moe_check_comm(const cpu_backend *b, const loom_model_config *c, const loom_comm *comm,
                               loom_error *err) {
    if (!comm || c->num_experts <= 0 || b->cfg.moe_dispatch != CPU_MOE_ALL_TO_ALL) return LOOM_OK;
    if (LOOM_HAS_FIELD(comm, loom_comm, all_to_allv) && comm->all_to_allv) return LOOM_OK;
    return b->host->error(b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                          "backend cpu: moe_dispatch: all_to_all, but the executor's communicator has no "
                          "all_to_allv (struct_size %u; ABI 2.5 added it); use moe_dispatch: all_reduce",
                          comm->struct_size);
}

loom_status cpu_moe_block(cpu_backend *b, int64_t T, int32_t l, float beta_res, bool *combined, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cpu_layer *ly = &b->layers[l];
    const cpu_moe *mo = &ly->moe;
    const int64_t H = c->hidden_size;
    loom_status st;
    *combined = false;
    if ((st = cpu_moe_scratch(b, T, err))) return st;
    loom_cpu_rmsnorm(b->xn, H, b->x, H, ly->ffn_norm, T, H, c->rms_norm_eps, b->pool);
    if (b->sharded && b->cfg.moe_dispatch == CPU_MOE_ALL_TO_ALL)
        return cpu_moe_a2a(b, mo, T, beta_res, combined, err);
    float *out = b->moe_out;
    if ((st = cpu_moe_local(b, mo, T, out, err))) return st;
    if (mo->sh_gate && (st = cpu_moe_shared(b, mo, b->xn, T, out, err))) return st;
    /* expert parallel: this rank's partial sum; the residual joins on one
     * rank only and the caller's all-reduce adds the ranks up */
    cpu_moe_residual(b->x, out, T * H, beta_res);
    return LOOM_OK;
}
