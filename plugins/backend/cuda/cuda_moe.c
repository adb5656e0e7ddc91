/*
 * plugins/backend/cuda/cuda_moe.c — the cuda backend's mixture-of-experts
 * FFN (docs/moe.md): which configs it runs, its work buffers, and per
 * layer, over the normed rows xn (T, H):
 *   logits (T, E) f32 = xn Wr^T;  sel / wt (T, K) = softmax + top-k
 *   (renormalised when moe_norm_topk), as the cpu backend routes;
 *   few pairs (P = T K <= CB_MOE_GEMV_PAIRS, and batch-invariant mode):
 *     per pair a GEMV of its own expert — only the chosen experts' weights
 *     are read; otherwise the pairs grouped by expert on the device and the
 *     experts' gate|up and down projections as grouped tensor-core GEMMs;
 *   SwiGLU between; r (T, H) = sum_j wt y_j (+ sigmoid(xn . w) shared(xn)).
 * Nothing waits for the host and no launch is sized by the routing, so
 * decode steps and piecewise steps are captured in CUDA graphs like a dense
 * model's. The loading side (weights per expert in dt) is in cuda_load.c.
 *
 * Expert parallelism (load_shard; docs/moe.md, the all-reduce form): a rank
 * holds experts [moe_e0, moe_e0 + moe_el) and moe_sh columns of the shared
 * expert. Every rank routes every token (the router is whole), the routing
 * marks other ranks' choices -1 and the kernels pass them over, so r is
 * this rank's share of the FFN — its experts' weighted outputs plus the
 * gate times its slice of the shared expert — and the all-reduce after the
 * block (cuda_forward.c) sums the ranks, as after a dense row-parallel
 * down projection.
 */
#include "cuda_backend.h"

#include <limits.h>
#include <stdio.h>

/* Pairs up to which a step runs per-pair GEMVs instead of the grouped
 * GEMM: a batch-1 decode step of Mixtral (2) or Qwen3-MoE (8), and small
 * decode batches, whose pairs mostly choose distinct experts. */
#define CB_MOE_GEMV_PAIRS 16

static size_t cb_moe_round(size_t n) { return (n + 255) & ~(size_t)255; }

loom_status cb_moe_check_config(cuda_backend *b, const loom_model_config *c, loom_error *err) {
    const loom_host *h = b->host;
    const char *who = c->name;
    /* the MoE block runs rmsnorm(x += r), the experts' SwiGLU and leaves r
     * pending: a post-norm or GeGLU config would silently run otherwise */
    if (c->post_norms || c->ffn_act != LOOM_FFN_SILU)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' is a mixture of experts with %s; the cuda MoE layer runs SwiGLU "
                        "experts without post-norms; use backend: cpu",
                        who, c->post_norms ? "post-norms" : "a non-SiLU FFN activation");
    const int32_t E = c->num_experts, K = c->num_experts_used, I = c->expert_intermediate_size,
                  S = c->shared_expert_intermediate_size;
    if (E > LOOM_CUDA_MOE_MAX_EXPERTS || K < 1 || K > E || K > 32 || I <= 0 || I % 8 || S < 0 || S % 8)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' has %d experts (%d per token) of width %d and a shared "
                        "expert of width %d; the cuda kernels take at most %d experts, 1..32 per token, "
                        "widths multiples of 8",
                        who, E, K, I, S, LOOM_CUDA_MOE_MAX_EXPERTS);
    return LOOM_OK;
}

loom_status cb_moe_work_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const size_t MT = (size_t)b->max_tokens, E = (size_t)c->num_experts, K = (size_t)c->num_experts_used;
    const size_t I = (size_t)c->expert_intermediate_size, H = (size_t)c->hidden_size, e = b->elt;
    const size_t P = MT * K;
    loom_status st;
    if (P > (size_t)INT_MAX / 2 || loom_cuda_moe_max_tiles((int)P, (int)E) > 65535)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: max_batched_tokens %zu x %zu experts per token is more (token, expert) "
                        "pairs than the grouped expert GEMM's grid takes (about 4 million); lower the "
                        "backend's max_batched_tokens",
                        MT, K);
    const int tiles = loom_cuda_moe_max_tiles((int)P, (int)E);
    enum { N = 11 };
    const size_t sz[N] = {MT * E * 4, P * 4,         P * 4,     (E + 1) * 4,
                          P * 4,      P * 4,         (1 + 3 * (size_t)tiles) * 4,
                          P * 2 * I * e, P * I * e, P * H * e, c->shared_expert_intermediate_size ? MT * H * e : 0};
    void **dst[N] = {(void **)&b->moe_logits, (void **)&b->moe_sel,  (void **)&b->moe_wt,
                     (void **)&b->moe_off,    (void **)&b->moe_perm, (void **)&b->moe_inv,
                     (void **)&b->moe_tiles,  &b->moe_gu,            &b->moe_act,
                     &b->moe_y,               &b->moe_ysh};
    size_t total = 0, free_b = 0, tot = 0;
    for (int i = 0; i < N; i++) total += cb_moe_round(sz[i]);
    if ((st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &tot)))) return st;
    if (total > free_b)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cuda: the experts' work buffers for max_batched_tokens = %zu need %.1f MiB, "
                        "device %d has %.1f MiB free after the weights; lower the backend's "
                        "max_batched_tokens (and scheduler.max_batched_tokens with it)",
                        MT, (double)total / 1048576.0, b->device, (double)free_b / 1048576.0);
    if ((st = CB_CUDA(b, err, cudaMalloc(&b->moe_work, total)))) return st;
    uint8_t *p = b->moe_work;
    for (int i = 0; i < N; i++) {
        *dst[i] = p;
        p += cb_moe_round(sz[i]);
    }
    if (!sz[N - 1]) b->moe_ysh = NULL;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "expert work buffers: %.1f MiB for %zu tokens/step (%zu pairs)",
           (double)total / 1048576.0, MT, P);
    return LOOM_OK;
}

/* A kernel's launch status as the step's error (cuda_backend.h). */
loom_status cb_moe_launch(cuda_backend *b, cudaError_t e, const char *what, int32_t l, loom_error *err) {
    if (e == cudaSuccess) return LOOM_OK;
    (void)cudaGetLastError();
    return b->host->error(b->host->ctx, err, LOOM_ERR_DEVICE, "backend cuda (device %d): layer %d %s: %s",
                          b->device, l, what, cudaGetErrorString(e));
}

/* A cuBLASLt / GEMV linear layer's status as the step's error (cuda_backend.h). */
loom_status cb_moe_rc(cuda_backend *b, int rc, const char *msg, const char *what, int32_t l,
                             loom_error *err) {
    if (rc == 0) return LOOM_OK;
    (void)cudaGetLastError();
    return b->host->error(b->host->ctx, err, LOOM_ERR_DEVICE, "backend cuda (device %d): layer %d %s: %s", b->device,
                          l, what, msg);
}

/* Few pairs and no shared expert (batch-1 decode of Mixtral and Qwen3-MoE):
 * gate|up GEMVs with SwiGLU fused, then the down GEMVs summing each token's
 * experts straight into r — two launches for the four (GEMVs, SwiGLU,
 * GEMVs, combine) of the general path; with Qwen3-30B-A3B's small experts
 * the launches, not the bytes, were most of a layer. */
static loom_status cb_moe_gemv_fused(cuda_backend *b, int32_t T, int32_t l, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int K = c->num_experts_used, I = c->expert_intermediate_size, H = c->hidden_size;
    loom_status st = cb_moe_launch(b, loom_cuda_moe_gemv_swiglu(b->dt, b->xn, K, b->moe_sel, ly->wgu_exps, T * K, I,
                                                                H, b->moe_act, b->stream),
                                   "expert gate|up GEMVs + SwiGLU", l, err);
    if (st) return st;
    return cb_moe_launch(b, loom_cuda_moe_gemv_combine(b->dt, b->moe_act, b->moe_sel, b->moe_wt, ly->wdown_exps, T, K,
                                                       H, I, b->r, b->stream),
                         "expert down GEMVs + combine", l, err);
}

/* moe_y (P, H) = the chosen experts' SwiGLU FFNs of their pairs' rows;
 * *rows: the row of pair p in moe_y (NULL: row p). *combined: r already
 * holds the combine (cb_moe_gemv_fused). */
static loom_status cb_moe_experts(cuda_backend *b, int32_t T, int32_t l, const int32_t **rows, bool *combined,
                                  loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int K = c->num_experts_used, E = b->moe_el, I = c->expert_intermediate_size, H = c->hidden_size;
    const int P = T * K;
    cudaStream_t s = b->stream;
    loom_status st;
    if (cb_moe_q_routed(ly)) /* quantized experts: cuda_moe_quant.c */
        return cb_moe_qexperts(b, T, l, P <= CB_MOE_GEMV_PAIRS || b->cfg.batch_invariant, rows, err);
    if (P <= CB_MOE_GEMV_PAIRS || b->cfg.batch_invariant) {
        *rows = NULL;
        /* the fused pair writes the combine itself: only without a shared
         * expert (a quantized one leaves wgu_sh NULL, so ask the config) */
        if (!c->shared_expert_intermediate_size) {
            *combined = true;
            return cb_moe_gemv_fused(b, T, l, err);
        }
        if ((st = cb_moe_launch(b, loom_cuda_moe_gemv(b->dt, b->xn, K, b->moe_sel, ly->wgu_exps, P, 2 * I, H,
                                                      b->moe_gu, s),
                                "expert gate|up GEMVs", l, err)) ||
            (st = cb_moe_launch(b, loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, P, I, s), "expert SwiGLU", l,
                                err)))
            return st;
        return cb_moe_launch(b, loom_cuda_moe_gemv(b->dt, b->moe_act, 1, b->moe_sel, ly->wdown_exps, P, H, I,
                                                   b->moe_y, s),
                             "expert down GEMVs", l, err);
    }
    const int tiles = loom_cuda_moe_max_tiles(P, E);
    *rows = b->moe_inv;
    if ((st = cb_moe_launch(b, loom_cuda_moe_group(b->moe_sel, P, E, b->moe_off, b->moe_perm, b->moe_inv,
                                                   b->moe_tiles, s),
                            "expert grouping", l, err)) ||
        (st = cb_moe_launch(b, loom_cuda_moe_gemm(b->dt, b->xn, b->moe_perm, K, ly->wgu_exps, b->moe_tiles, tiles,
                                                  2 * I, H, b->moe_gu, s),
                            "expert gate|up GEMM", l, err)) ||
        (st = cb_moe_launch(b, loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, P, I, s), "expert SwiGLU", l, err)))
        return st;
    return cb_moe_launch(b, loom_cuda_moe_gemm(b->dt, b->moe_act, NULL, 1, ly->wdown_exps, b->moe_tiles, tiles, H, I,
                                               b->moe_y, s),
                         "expert down GEMM", l, err);
}

loom_status cb_moe_ffn(cuda_backend *b, int32_t T, int32_t l, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int K = c->num_experts_used, E = c->num_experts, H = c->hidden_size, S = b->moe_sh;
    cudaStream_t s = b->stream;
    char msg[256] = "";
    const int32_t *rows = NULL;
    bool combined = false;
    loom_status st;
    /* (T, H) -> logits (T, E) f32 -> sel / wt (T, K) */
    if ((st = cb_moe_rc(b,
                        loom_cuda_gemm_run(b->gemm, b->dt, 1, T, E, H, b->xn, ly->router, b->moe_logits, s, msg,
                                           sizeof msg),
                        msg, "router GEMM", l, err)) ||
        (st = cb_moe_launch(b,
                            loom_cuda_moe_route(b->moe_logits, T, E, K, c->moe_norm_topk, b->moe_e0, b->moe_el,
                                                b->moe_sel, b->moe_wt, s),
                            "routing", l, err)) ||
        (st = cb_moe_experts(b, T, l, &rows, &combined, err)) || combined)
        return st;
    if (cb_moe_q_shared(ly) && (st = cb_moe_qshared(b, T, l, err))) return st;
    if (ly->wgu_sh && !cb_moe_q_shared(ly) &&
        ((st = cb_moe_rc(b,
                         loom_cuda_gemm_run(b->gemm, b->dt, 0, T, 2 * S, H, b->xn, ly->wgu_sh, b->gu, s, msg,
                                            sizeof msg),
                         msg, "shared expert gate|up GEMM", l, err)) ||
         (st = cb_moe_rc(b,
                         loom_cuda_gemm_swiglu_run(b->gemm, b->dt, T, H, S, b->gu, ly->wdown_sh, b->act, b->moe_ysh,
                                                   s, msg, sizeof msg),
                         msg, "shared expert down GEMM", l, err))))
        return st;
    return cb_moe_launch(b,
                         loom_cuda_moe_combine(b->dt, b->r, b->moe_y, rows, b->moe_wt, T, K, H,
                                               ly->sh_gate ? b->moe_ysh : NULL, b->xn, ly->sh_gate, s),
                         "expert combine", l, err);
}
