/*
 * plugins/backend/cuda/cuda_moe_quant.c — the cuda MoE layer on quantized
 * expert weights (docs/moe.md, "Quantized experts on CUDA"). Routing,
 * grouping and the combine are cuda_moe.c's; what changes is each
 * projection's kernel:
 *   routed gate|up / down quantized: loom_cuda_moe_qgemv (few pairs) or
 *     loom_cuda_moe_qgemm (the grouped GEMM) on the stacked quantized
 *     experts; W8A8 / FP8 first quantize their input rows per row
 *     (loom_cuda_moe_quant_act: the normed rows once per step for gate|up,
 *     silu(gate) * up formed inside the quantization for down);
 *   the shared expert quantized: the dense quantized linear layers
 *     (loom_cuda_qgemm_run, loom_cuda_qgemm_swiglu_run), as a dense FFN.
 * A projection left in dt (the quantizer skipped it) runs moe.cu's kernel.
 */
#include "cuda_backend.h"

#include <stdio.h>

bool cb_moe_q_routed(const cuda_layer *ly) {
    return ly->q_gu_exps.fmt != LOOM_CUDA_Q_NONE || ly->q_down_exps.fmt != LOOM_CUDA_Q_NONE;
}

bool cb_moe_q_shared(const cuda_layer *ly) {
    return ly->q_gu_sh.fmt != LOOM_CUDA_Q_NONE || ly->q_down_sh.fmt != LOOM_CUDA_Q_NONE;
}


loom_status cb_moe_qwork_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    bool gu = false, down = false;
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++) {
        gu |= loom_cuda_moe_qacts(b->layers[l].q_gu_exps.fmt) != 0;
        down |= loom_cuda_moe_qacts(b->layers[l].q_down_exps.fmt) != 0;
    }
    b->moe_qwork = NULL;
    b->moe_xq = b->moe_aq = NULL;
    b->moe_xsx = b->moe_asx = NULL;
    if (!gu && !down) return LOOM_OK;
    const size_t MT = (size_t)b->max_tokens, P = MT * (size_t)c->num_experts_used;
    const size_t H = (size_t)c->hidden_size, I = (size_t)c->expert_intermediate_size;
    const size_t XR = cb_moe_a2a(b) ? P : MT; /* input rows: the tokens, or the pairs received */
    const size_t sz[4] = {gu ? XR * H : 0, gu ? XR * 4 : 0, down ? P * I : 0, down ? P * 4 : 0};
    void **dst[4] = {(void **)&b->moe_xq, (void **)&b->moe_xsx, (void **)&b->moe_aq, (void **)&b->moe_asx};
    size_t total = 0;
    loom_status st = cb_moe_alloc(b, sz, dst, 4, "the quantized experts' activation codes",
                                  "lower the backend's max_batched_tokens", &b->moe_qwork, &total, err);
    if (st) return st;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "quantized experts' activation codes: %.1f MiB",
           (double)total / 1048576.0);
    return LOOM_OK;
}

loom_status cb_moe_qexperts(cuda_backend *b, int32_t l, const cb_moe_rows *in, bool gemv, const int32_t **rows,
                            loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int E = b->moe_el, I = c->expert_intermediate_size, H = c->hidden_size, P = in->P, div = in->div;
    const loom_cuda_qweight *qgu = ly->q_gu_exps.fmt != LOOM_CUDA_Q_NONE ? &ly->q_gu_exps : NULL;
    const loom_cuda_qweight *qd = ly->q_down_exps.fmt != LOOM_CUDA_Q_NONE ? &ly->q_down_exps : NULL;
    const bool agu = qgu && loom_cuda_moe_qacts(qgu->fmt), ad = qd && loom_cuda_moe_qacts(qd->fmt);
    cudaStream_t s = b->stream;
    const int tiles = loom_cuda_moe_max_tiles(P, E, LOOM_CUDA_MOE_TILE_ROWS);
    loom_status st;
    *rows = gemv ? NULL : b->moe_inv;
    /* gate|up: in->x (nx, H) -> moe_gu (P, 2I), pair rows or sorted rows */
    if (agu && (st = cb_moe_launch(b,
                                   loom_cuda_moe_quant_act(b->dt, qgu->fmt, 0, in->nx, H, in->x, b->moe_xq,
                                                           b->moe_xsx, s),
                                   "expert input codes", l, err)))
        return st;
    if (!gemv && (st = cb_moe_launch(b, loom_cuda_moe_group(in->sel, P, E, LOOM_CUDA_MOE_TILE_ROWS, b->moe_off,
                                                           b->moe_perm, b->moe_inv, b->moe_tiles, s),
                                    "expert grouping", l, err)))
        return st;
    cudaError_t e;
    if (gemv)
        e = qgu ? loom_cuda_moe_qgemv(b->dt, in->x, b->moe_xq, b->moe_xsx, div, in->sel, qgu, P, b->moe_gu, s)
                : loom_cuda_moe_gemv(b->dt, in->x, div, in->sel, ly->wgu_exps, P, 2 * I, H, b->moe_gu, s);
    else
        e = qgu ? loom_cuda_moe_qgemm(b->dt, in->x, b->moe_xq, b->moe_xsx, b->moe_perm, div, qgu, b->moe_tiles,
                                      tiles, b->moe_gu, s)
                : loom_cuda_moe_gemm(b->dt, in->x, b->moe_perm, div, ly->wgu_exps, b->moe_tiles, tiles, 2 * I, H,
                                     b->moe_gu, s);
    if ((st = cb_moe_launch(b, e, gemv ? "expert gate|up GEMVs" : "expert gate|up GEMM", l, err))) return st;
    /* SwiGLU: into the codes of the down projection's input, or moe_act */
    e = ad ? loom_cuda_moe_quant_act(b->dt, qd->fmt, 1, P, I, b->moe_gu, b->moe_aq, b->moe_asx, s)
           : loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, P, I, s);
    if ((st = cb_moe_launch(b, e, ad ? "expert SwiGLU codes" : "expert SwiGLU", l, err))) return st;
    /* down: moe_act / codes (P, I) -> moe_y (P, H), same rows */
    if (gemv)
        e = qd ? loom_cuda_moe_qgemv(b->dt, b->moe_act, b->moe_aq, b->moe_asx, 1, in->sel, qd, P, b->moe_y, s)
               : loom_cuda_moe_gemv(b->dt, b->moe_act, 1, in->sel, ly->wdown_exps, P, H, I, b->moe_y, s);
    else
        e = qd ? loom_cuda_moe_qgemm(b->dt, b->moe_act, b->moe_aq, b->moe_asx, NULL, 1, qd, b->moe_tiles, tiles,
                                     b->moe_y, s)
               : loom_cuda_moe_gemm(b->dt, b->moe_act, NULL, 1, ly->wdown_exps, b->moe_tiles, tiles, H, I, b->moe_y,
                                    s);
    return cb_moe_launch(b, e, gemv ? "expert down GEMVs" : "expert down GEMM", l, err);
}

loom_status cb_moe_qshared(cuda_backend *b, int32_t T, int32_t l, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int H = c->hidden_size, S = b->moe_sh;
    cudaStream_t s = b->stream;
    char msg[256] = "";
    int rc = ly->q_gu_sh.fmt != LOOM_CUDA_Q_NONE
                 ? loom_cuda_qgemm_run(b->gemm, b->dt, 0, T, &ly->q_gu_sh, b->xn, b->gu, b->qscratch,
                                       b->qscratch_bytes, s, msg, sizeof msg)
                 : loom_cuda_gemm_run(b->gemm, b->dt, 0, T, 2 * S, H, b->xn, ly->wgu_sh, b->gu, s, msg, sizeof msg);
    loom_status st = cb_moe_rc(b, rc, msg, "shared expert gate|up", l, err);
    if (st) return st;
    rc = ly->q_down_sh.fmt != LOOM_CUDA_Q_NONE
             ? loom_cuda_qgemm_swiglu_run(b->gemm, b->dt, T, &ly->q_down_sh, b->gu, b->act, b->moe_ysh, b->qscratch,
                                          b->qscratch_bytes, s, msg, sizeof msg)
             : loom_cuda_gemm_swiglu_run(b->gemm, b->dt, T, H, S, b->gu, ly->wdown_sh, b->act, b->moe_ysh, s, msg,
                                         sizeof msg);
    return cb_moe_rc(b, rc, msg, "shared expert down", l, err);
}
