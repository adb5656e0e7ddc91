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
 * model's — except eager steps whose experts are few and large
 * (moe_expert_gemm_rows): they read the grouping's offsets on the host once
 * a layer and run one cuBLASLt GEMM an expert. The loading side (weights
 * per expert in dt) is in cuda_load.c.
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
#include <string.h>

/* Pairs up to which a step runs per-pair GEMVs instead of the grouped
 * GEMM: a batch-1 decode step of Mixtral (2) or Qwen3-MoE (8), and small
 * decode batches, whose pairs mostly choose distinct experts. */
#define CB_MOE_GEMV_PAIRS 16

static size_t cb_moe_round(size_t n) { return (n + 255) & ~(size_t)255; }

loom_status cb_moe_alloc(cuda_backend *b, const size_t *sz, void **const *dst, int n, const char *what,
                         const char *advice, void **dev, size_t *total, loom_error *err) {
    size_t free_b = 0, tot = 0;
    *total = 0;
    for (int i = 0; i < n; i++) *total += cb_moe_round(sz[i]);
    loom_status st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &tot));
    if (st) return st;
    if (*total > free_b)
        return b->host->error(b->host->ctx, err, LOOM_ERR_NOMEM,
                              "backend cuda: %s for max_batched_tokens = %d need %.1f MiB, device %d has %.1f MiB "
                              "free after the weights; %s",
                              what, b->max_tokens, (double)*total / 1048576.0, b->device,
                              (double)free_b / 1048576.0, advice);
    if ((st = CB_CUDA(b, err, cudaMalloc(dev, *total)))) return st;
    uint8_t *p = *dev;
    for (int i = 0; i < n; i++) {
        *dst[i] = sz[i] ? p : NULL;
        p += cb_moe_round(sz[i]);
    }
    return LOOM_OK;
}

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

bool cb_moe_a2a(const cuda_backend *b) {
    return b->sharded && b->mc.num_experts > 0 && b->cfg.moe_dispatch == 1;
}

/* The experts a step's P pairs spread over: this rank's under all-to-all
 * (it received only their pairs), every expert under all-reduce (each rank
 * routes every token). */
static int64_t cb_moe_experts_of_pairs(const cuda_backend *b, int E) {
    return cb_moe_a2a(b) ? E : b->mc.num_experts;
}

/* Whether the experts' widths suit one cuBLASLt GEMM an expert: hidden and
 * expert rows of whole 256-byte units (cuBLASLt's plans assume operands
 * that aligned, and an expert's rows start anywhere). */
static bool cb_moe_lt_widths(const cuda_backend *b) {
    const size_t H = (size_t)b->mc.hidden_size * b->elt, I = (size_t)b->mc.expert_intermediate_size * b->elt;
    return H % 256 == 0 && I % 256 == 0;
}

loom_status cb_moe_check_comm(cuda_backend *b, const loom_model_config *c, const loom_comm *comm, loom_error *err) {
    if (!comm || comm->size < 2 || c->num_experts <= 0 || b->cfg.moe_dispatch != 1) return LOOM_OK;
    if (LOOM_HAS_FIELD(comm, loom_comm, all_to_allv) && comm->all_to_allv) return LOOM_OK;
    return b->host->error(b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                          "backend cuda: moe_dispatch: all_to_all, but the executor's communicator has no "
                          "all_to_allv (struct_size %u; ABI 2.5 added it, the pp executor's NCCL stages lack it); "
                          "use moe_dispatch: all_reduce",
                          comm->struct_size);
}

void cb_moe_ep_free(cuda_backend *b) {
    cudaFree(b->ep.dev);
    b->host->free(b->host->ctx, b->ep.all_h);
    b->host->free(b->host->ctx, b->ep.sc);
    memset(&b->ep, 0, sizeof b->ep);
}

/* The all-to-all form's buffers (b->ep) for max_tokens x K pairs over n
 * ranks: device ones in one allocation, the host counts beside. */
static loom_status cb_moe_ep_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const size_t MT = (size_t)b->max_tokens, P = MT * (size_t)b->mc.num_experts_used, n = (size_t)b->comm.size;
    const size_t H = (size_t)b->mc.hidden_size, e = b->elt, slice = (MT + n - 1) / n;
    enum { N = 10 };
    const size_t sz[N] = {P * 4, P * 4, P * 4, P * 4, n * 4, n * n * 4, P * H * e, P * H * e, slice * H * e,
                          n * slice * H * e};
    void **dst[N] = {(void **)&b->ep.sid, (void **)&b->ep.rid, (void **)&b->ep.rsel, (void **)&b->ep.inv,
                     (void **)&b->ep.cnt, (void **)&b->ep.all, &b->ep.sx,           &b->ep.rx,
                     &b->ep.gs,           &b->ep.gr};
    size_t total = 0;
    loom_status st = cb_moe_alloc(b, sz, dst, N, "moe_dispatch all_to_all's buffers",
                                  "lower the backend's max_batched_tokens or use moe_dispatch: all_reduce", &b->ep.dev,
                                  &total, err);
    if (st) return st;
    b->ep.all_h = h->calloc(h->ctx, n * n, sizeof(int32_t));
    b->ep.sc = h->calloc(h->ctx, 2 * n, sizeof(int64_t));
    if (!b->ep.all_h || !b->ep.sc)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory for the all-to-all counts");
    b->ep.rc = b->ep.sc + n;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "expert all-to-all buffers: %.1f MiB (%zu pairs over %zu ranks)",
           (double)total / 1048576.0, P, n);
    return LOOM_OK;
}

loom_status cb_moe_work_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const size_t MT = (size_t)b->max_tokens, E = (size_t)c->num_experts, K = (size_t)c->num_experts_used;
    const size_t I = (size_t)c->expert_intermediate_size, H = (size_t)c->hidden_size, e = b->elt;
    const size_t P = MT * K;
    loom_status st;
    if (P > (size_t)INT_MAX / 2 || loom_cuda_moe_max_tiles((int)P, (int)E, LOOM_CUDA_MOE_TILE_ROWS) > 65535)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: max_batched_tokens %zu x %zu experts per token is more (token, expert) "
                        "pairs than the grouped expert GEMM's grid takes (about 4 million); lower the "
                        "backend's max_batched_tokens",
                        MT, K);
    /* the 64-row list is the longer: room for either */
    const int tiles = loom_cuda_moe_max_tiles((int)P, (int)E, LOOM_CUDA_MOE_TILE_ROWS);
    /* the per-expert cuBLASLt GEMMs pad each expert's rows (cb_moe_lt_rows:
     * under max(64, n / 8) more), the last expert's past P — room only where
     * a step can take them (cb_moe_lt_pays; this rank's experts are the
     * fewest its pairs can spread over) */
    const int64_t lt_rows = b->cfg.moe_expert_gemm_rows;
    const bool lt_can =
        lt_rows > 0 && cb_moe_lt_widths(b) && (int64_t)P >= lt_rows * cb_moe_experts_of_pairs(b, b->moe_el);
    const size_t PL = lt_can ? P + P / 8 + 64 : P;
    b->moe_rows_cap = (int32_t)PL;
    enum { N = 11 };
    const size_t sz[N] = {MT * E * 4, P * 4,         P * 4,     (E + 1) * 4,
                          P * 4,      P * 4,         (1 + 3 * (size_t)tiles) * 4,
                          PL * 2 * I * e, PL * I * e, PL * H * e, c->shared_expert_intermediate_size ? MT * H * e : 0};
    void **dst[N] = {(void **)&b->moe_logits, (void **)&b->moe_sel,  (void **)&b->moe_wt,
                     (void **)&b->moe_off,    (void **)&b->moe_perm, (void **)&b->moe_inv,
                     (void **)&b->moe_tiles,  &b->moe_gu,            &b->moe_act,
                     &b->moe_y,               &b->moe_ysh};
    size_t total = 0;
    if ((st = cb_moe_alloc(b, sz, dst, N, "the experts' work buffers",
                           "lower the backend's max_batched_tokens (and scheduler.max_batched_tokens with it)",
                           &b->moe_work, &total, err)))
        return st;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "expert work buffers: %.1f MiB for %zu tokens/step (%zu pairs)",
           (double)total / 1048576.0, MT, P);
    return cb_moe_a2a(b) ? cb_moe_ep_init(b, err) : LOOM_OK;
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

/* Whether this step's experts take cb_moe_experts_lt: only an eager step
 * (a graph cannot carry a host read of routed counts) whose pairs average
 * at least moe_expert_gemm_rows rows an expert — in the all-reduce form of
 * expert parallelism P counts every rank's pairs, so over all experts —
 * with widths cb_moe_lt_widths takes, input rows not in moe_y (which that
 * path gathers into). */
static bool cb_moe_lt_pays(const cuda_backend *b, const cb_moe_rows *in, int E) {
    const int64_t rows = b->cfg.moe_expert_gemm_rows, experts = cb_moe_experts_of_pairs(b, E);
    if (rows <= 0 || b->warming || (int64_t)in->P < rows * experts || !cb_moe_lt_widths(b) || in->x == b->moe_y)
        return false;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(b->stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone;
}

/* Rows an expert's cuBLASLt GEMM runs for its n rows from sorted row r0:
 * n rounded up to a multiple of an eighth of its power of two (at least
 * 64), so a step meets a few GEMM shapes an octave, not one per count
 * (cuBLASLt's heuristic runs once per shape, on the host, and its plan
 * cache holds 96), from 512 rows on at most 12.5% more — and at most
 * `cap` rows, the work buffers' end (moe_rows_cap leaves room for that
 * padding past P, so the clamp, which would make the count itself the
 * shape, never acts). The rows past n are the next expert's, whose own
 * GEMM runs later on the stream and overwrites them; every output row
 * depends on its input row alone. */
static int32_t cb_moe_lt_rows(int32_t n, int32_t r0, int32_t cap) {
    int32_t p2 = 1;
    while (p2 <= n / 2) p2 *= 2;
    const int32_t step = p2 / 8 > 64 ? p2 / 8 : 64, m = (n + step - 1) / step * step;
    return m < cap - r0 ? m : cap - r0;
}

/* moe_y (P, H) in sorted rows = the experts' SwiGLU FFNs, one cuBLASLt GEMM
 * an expert for gate|up and one for down, where few large experts give
 * cuBLASLt whole GEMMs (Mixtral's prefill: ~2.6x the grouped wgmma kernel
 * on an H100): the grouping's offsets are read on the host (the stream
 * waits for the routing once a layer), the pairs' input rows gathered in sorted order
 * into moe_y, which is free until the down GEMMs write it. */
static loom_status cb_moe_experts_lt(cuda_backend *b, int32_t l, const cb_moe_rows *in, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int E = b->moe_el;
    const size_t I = (size_t)c->expert_intermediate_size, H = (size_t)c->hidden_size, e = b->elt;
    const int32_t cap = b->moe_rows_cap;
    cudaStream_t s = b->stream;
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->moe_off_h, b->moe_off, (size_t)(E + 1) * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, s))) ||
        (st = CB_CUDA(b, err, cudaStreamSynchronize(s))))
        return st;
    const int32_t *off = b->moe_off_h, nrows = off[E];
    if (off[0] != 0 || nrows < 0 || nrows > in->P) /* P <= cap */
        return b->host->error(b->host->ctx, err, LOOM_ERR_INTERNAL,
                              "backend cuda: layer %d: the expert grouping's offsets read back as %d..%d for %d pairs", l,
                              off[0], nrows, in->P);
    if ((st = cb_moe_launch(b, loom_cuda_moe_gather(in->x, b->moe_perm, in->div, nrows, (int)H, b->moe_y, s),
                            "expert rows gathered", l, err)))
        return st;
    char msg[256];
    for (int pass = 0; pass < 2; pass++) { /* gate|up for every expert, then (after SwiGLU) down */
        const size_t N = pass ? H : 2 * I, K = pass ? I : H;
        const char *x = pass ? b->moe_act : b->moe_y;
        char *y = pass ? b->moe_y : b->moe_gu;
        const char *w = pass ? ly->wdown_exps : ly->wgu_exps;
        if (pass && (st = cb_moe_launch(b, loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, nrows, (int)I, s),
                                        "expert SwiGLU", l, err)))
            return st;
        for (int x_e = 0; x_e < E; x_e++) {
            const int32_t r0 = off[x_e], n = off[x_e + 1] - r0;
            if (n <= 0) continue;
            const int rc = loom_cuda_gemm_run(b->gemm, b->dt, 0, cb_moe_lt_rows(n, r0, cap), (int)N, (int)K,
                                              x + (size_t)r0 * K * e, w + (size_t)x_e * N * K * e,
                                              y + (size_t)r0 * N * e, s, msg, sizeof msg);
            if (rc)
                return cb_moe_rc(b, rc, msg, pass ? "expert down GEMM (cuBLASLt)" : "expert gate|up GEMM (cuBLASLt)",
                                 l, err);
        }
    }
    b->moe_lt_layers++;
    if (b->host->metric_add) b->host->metric_add(b->host->ctx, "backend.cuda.moe_expert_gemm_layers", 1);
    return LOOM_OK;
}

/* moe_y (P, H) in sorted rows (moe_inv maps pairs to them) = the pairs'
 * experts' SwiGLU FFNs through the grouping: the per-expert cuBLASLt GEMMs
 * where they pay (cb_moe_lt_pays), else the grouped GEMM kernels. */
static loom_status cb_moe_experts_grouped(cuda_backend *b, int32_t l, const cb_moe_rows *in, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int E = b->moe_el, I = c->expert_intermediate_size, H = c->hidden_size, P = in->P, div = in->div;
    cudaStream_t s = b->stream;
    loom_status st;
    /* wgmma's tiles where experts have rows enough to fill them, 128 rows
     * high where they fill those (the step's size decides, so a captured
     * graph holds the same choice) */
    const int64_t experts = cb_moe_experts_of_pairs(b, E), wg_rows = b->cfg.moe_wgmma_rows;
    const int64_t tall_rows = b->cfg.moe_wgmma_128_rows;
    const bool wg = wg_rows > 0 && (int64_t)P >= wg_rows * experts;
    const int tile_rows = wg && tall_rows > 0 && (int64_t)P >= tall_rows * experts ? 128 : LOOM_CUDA_MOE_TILE_ROWS;
    const int tiles = loom_cuda_moe_max_tiles(P, E, tile_rows);
    /* SwiGLU runs over all P rows though only the first off[E] are this
     * rank's pairs (no grid sized by the routing): the rest are stale
     * rows nothing reads — under expert parallelism most of them */
    if ((st = cb_moe_launch(b, loom_cuda_moe_group(in->sel, P, E, tile_rows, b->moe_off, b->moe_perm, b->moe_inv,
                                                   b->moe_tiles, s),
                            "expert grouping", l, err)))
        return st;
    if (cb_moe_lt_pays(b, in, E)) return cb_moe_experts_lt(b, l, in, err);
    for (int pass = 0; pass < 2; pass++) { /* gate|up, then (after SwiGLU) down */
        const void *x = pass ? b->moe_act : in->x, *w = pass ? ly->wdown_exps : ly->wgu_exps;
        const int32_t *perm = pass ? NULL : b->moe_perm;
        const int N = pass ? H : 2 * I, K = pass ? I : H, d = pass ? 1 : div;
        void *y = pass ? b->moe_y : b->moe_gu;
        if (pass && (st = cb_moe_launch(b, loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, P, I, s), "expert SwiGLU",
                                        l, err)))
            return st;
        const cudaError_t e =
            wg ? loom_cuda_moe_gemm_wg(b->dt, x, perm, d, w, b->moe_tiles, tiles, tile_rows, N, K, y, s)
               : loom_cuda_moe_gemm(b->dt, x, perm, d, w, b->moe_tiles, tiles, N, K, y, s);
        if ((st = cb_moe_launch(b, e, pass ? "expert down GEMM" : "expert gate|up GEMM", l, err))) return st;
    }
    /* counted when launched (a captured step once, at capture): which kernel a step shape takes */
    if (wg && b->host->metric_add) b->host->metric_add(b->host->ctx, "backend.cuda.moe_wgmma_layers", 1);
    if (tile_rows == 128 && b->host->metric_add)
        b->host->metric_add(b->host->ctx, "backend.cuda.moe_wgmma_128_layers", 1);
    return LOOM_OK;
}

/* moe_y (P, H) = the chosen experts' SwiGLU FFNs of the pairs of `in`;
 * *rows: the row of pair p in moe_y (NULL: row p). *combined: r already
 * holds the combine (cb_moe_gemv_fused: only when `fuse`, for the tokens'
 * own pairs, div = K). */
static loom_status cb_moe_experts(cuda_backend *b, int32_t l, const cb_moe_rows *in, bool fuse, const int32_t **rows,
                                  bool *combined, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int I = c->expert_intermediate_size, H = c->hidden_size, P = in->P, div = in->div;
    const bool gemv = P <= CB_MOE_GEMV_PAIRS || b->cfg.batch_invariant;
    cudaStream_t s = b->stream;
    loom_status st;
    if (cb_moe_q_routed(ly)) /* quantized experts: cuda_moe_quant.c */
        return cb_moe_qexperts(b, l, in, gemv, rows, err);
    if (gemv) {
        *rows = NULL;
        /* the fused pair writes the combine itself: only without a shared
         * expert (a quantized one leaves wgu_sh NULL, so ask the config) */
        if (fuse && !c->shared_expert_intermediate_size) {
            *combined = true;
            return cb_moe_gemv_fused(b, in->nx, l, err);
        }
        if ((st = cb_moe_launch(b, loom_cuda_moe_gemv(b->dt, in->x, div, in->sel, ly->wgu_exps, P, 2 * I, H,
                                                      b->moe_gu, s),
                                "expert gate|up GEMVs", l, err)) ||
            (st = cb_moe_launch(b, loom_cuda_swiglu(b->dt, b->moe_act, b->moe_gu, P, I, s), "expert SwiGLU", l,
                                err)))
            return st;
        return cb_moe_launch(b, loom_cuda_moe_gemv(b->dt, b->moe_act, 1, in->sel, ly->wdown_exps, P, H, I,
                                                   b->moe_y, s),
                             "expert down GEMVs", l, err);
    }
    *rows = b->moe_inv;
    return cb_moe_experts_grouped(b, l, in, err);
}

/* logits (T, E) f32 of the T rows from x and their routing into moe_sel /
 * moe_wt as this rank sees it (experts [e0, e0 + el)). */
static loom_status cb_moe_route(cuda_backend *b, int32_t l, const void *x, int32_t T, int e0, int el,
                                loom_error *err) {
    const loom_model_config *c = &b->mc;
    char msg[256] = "";
    loom_status st = cb_moe_rc(b,
                               loom_cuda_gemm_run(b->gemm, b->dt, 1, T, c->num_experts, c->hidden_size, x,
                                                  b->layers[l].router, b->moe_logits, b->stream, msg, sizeof msg),
                               msg, "router GEMM", l, err);
    if (st) return st;
    return cb_moe_launch(b,
                         loom_cuda_moe_route(b->moe_logits, T, c->num_experts, c->num_experts_used, c->moe_norm_topk,
                                             e0, el, b->moe_sel, b->moe_wt, b->stream),
                         "routing", l, err);
}

/* moe_ysh (T, H) = this rank's slice of the shared expert over xn. */
static loom_status cb_moe_shared(cuda_backend *b, int32_t T, int32_t l, loom_error *err) {
    const cuda_layer *ly = &b->layers[l];
    const int H = b->mc.hidden_size, S = b->moe_sh;
    char msg[256] = "";
    if (cb_moe_q_shared(ly)) return cb_moe_qshared(b, T, l, err);
    loom_status st = cb_moe_rc(
        b, loom_cuda_gemm_run(b->gemm, b->dt, 0, T, 2 * S, H, b->xn, ly->wgu_sh, b->gu, b->stream, msg, sizeof msg),
        msg, "shared expert gate|up GEMM", l, err);
    if (st) return st;
    return cb_moe_rc(b,
                     loom_cuda_gemm_swiglu_run(b->gemm, b->dt, T, H, S, b->gu, ly->wdown_sh, b->act, b->moe_ysh,
                                               b->stream, msg, sizeof msg),
                     msg, "shared expert down GEMM", l, err);
}

/* ------------------------------------------ expert parallel: all-to-all */

/* Route this rank's slice [t0, t0 + ts) of the T tokens and pack its
 * pairs in expert order (so each owner's, a block of experts, are
 * contiguous): ep.sid their experts, ep.sx their rows, ep.inv where each
 * pair's result will sit, ep.cnt the pairs for each rank (device). */
static loom_status cb_ep_pack(cuda_backend *b, int32_t l, int32_t t0, int32_t ts, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const int n = b->comm.size, K = c->num_experts_used, E = c->num_experts, H = c->hidden_size, P = ts * K;
    cudaStream_t s = b->stream;
    loom_status st;
    if (ts == 0) return CB_CUDA(b, err, cudaMemsetAsync(b->ep.cnt, 0, (size_t)n * 4, s));
    const void *xs = (const uint8_t *)b->xn + (size_t)t0 * H * b->elt;
    if ((st = cb_moe_route(b, l, xs, ts, 0, E, err)) ||
        (st = cb_moe_launch(b, loom_cuda_moe_group(b->moe_sel, P, E, LOOM_CUDA_MOE_TILE_ROWS, b->moe_off,
                                                   b->moe_perm, b->moe_inv, b->moe_tiles, s),
                            "expert grouping (dispatch)", l, err)) ||
        (st = cb_moe_launch(b, loom_cuda_moe_ids(b->moe_sel, b->moe_perm, P, 0, E, b->ep.sid, s), "dispatch ids", l,
                            err)) ||
        (st = cb_moe_launch(b, loom_cuda_moe_gather(xs, b->moe_perm, K, P, H, b->ep.sx, s), "dispatch rows", l,
                            err)) ||
        (st = CB_CUDA(b, err, cudaMemcpyAsync(b->ep.inv, b->moe_inv, (size_t)P * 4, cudaMemcpyDeviceToDevice, s))))
        return st;
    return cb_moe_launch(b, loom_cuda_moe_owner_counts(b->moe_off, n, b->moe_el, b->ep.cnt, s), "dispatch counts", l,
                         err);
}

/* Every rank's pair counts (all-gathered, then read on the host: the one
 * wait of the dispatch), then each pair's expert and row to its owner: *R
 * pairs received into ep.rid / ep.rx. n <= E <= LOOM_CUDA_MOE_MAX_EXPERTS
 * (every rank holds an expert). */
static loom_status cb_ep_dispatch(cuda_backend *b, int64_t *R, loom_error *err) {
    const int n = b->comm.size, r = b->comm.rank;
    const int64_t H = b->mc.hidden_size;
    int64_t scx[LOOM_CUDA_MOE_MAX_EXPERTS], rcx[LOOM_CUDA_MOE_MAX_EXPERTS];
    loom_status st;
    if ((st = cb_all_gather(b, b->ep.cnt, b->ep.all, n, LOOM_DTYPE_I32, err)) ||
        (st = CB_CUDA(b, err, cudaMemcpyAsync(b->ep.all_h, b->ep.all, (size_t)n * n * 4, cudaMemcpyDeviceToHost,
                                              b->stream))) ||
        (st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream))))
        return st;
    *R = 0;
    for (int k = 0; k < n; k++) { /* row q of all: what rank q sends to each rank */
        b->ep.sc[k] = b->ep.all_h[r * n + k];
        b->ep.rc[k] = b->ep.all_h[k * n + r];
        scx[k] = b->ep.sc[k] * H, rcx[k] = b->ep.rc[k] * H;
        *R += b->ep.rc[k];
    }
    if ((st = cb_all_to_allv(b, b->ep.sid, b->ep.sc, b->ep.rid, b->ep.rc, LOOM_DTYPE_I32, err))) return st;
    return cb_all_to_allv(b, b->ep.sx, scx, b->ep.rx, rcx, b->ldt, err);
}

/* This rank's experts over the R rows received, each result back over its
 * row of ep.rx, then every result to the rank that sent it, into ep.sx in
 * the order it was sent. */
static loom_status cb_ep_experts(cuda_backend *b, int32_t l, int64_t R, loom_error *err) {
    const int n = b->comm.size, H = b->mc.hidden_size;
    int64_t scx[LOOM_CUDA_MOE_MAX_EXPERTS], rcx[LOOM_CUDA_MOE_MAX_EXPERTS];
    for (int k = 0; k < n; k++) scx[k] = b->ep.sc[k] * H, rcx[k] = b->ep.rc[k] * H;
    loom_status st;
    if (R > 0) {
        /* a received number outside this rank's experts cannot happen (the
         * senders split by the same blocks); made -1, it would get a zero
         * row (the GEMVs' zeros, or no sorted row: the gather's zeros) */
        const cb_moe_rows in = {.x = b->ep.rx, .nx = (int32_t)R, .div = 1, .P = (int32_t)R, .sel = b->ep.rsel};
        const int32_t *rows = NULL;
        bool combined = false;
        if ((st = cb_moe_launch(b, loom_cuda_moe_ids(b->ep.rid, NULL, (int)R, -b->moe_e0, b->moe_el, b->ep.rsel,
                                                     b->stream),
                                "received expert ids", l, err)) ||
            (st = cb_moe_experts(b, l, &in, false, &rows, &combined, err)) ||
            (st = cb_moe_launch(b, loom_cuda_moe_gather(b->moe_y, rows, 1, (int)R, H, b->ep.rx, b->stream),
                                "results in the order received", l, err)))
            return st;
    }
    return cb_all_to_allv(b, b->ep.rx, rcx, b->ep.sx, scx, b->ldt, err);
}

/* The all-to-all form (docs/moe.md): this rank routes its slice of the
 * tokens, sends each pair to its expert's owner, runs its own experts on
 * what it receives and sends the results back, then combines its slice.
 * Without a shared expert the slices are all-gathered into r (*summed);
 * with one, r holds the slice's rows plus this rank's shared-expert part
 * on every row, and the block's all-reduce sums the ranks. The counts
 * cross the host: such steps are never captured in a graph. */
static loom_status cb_moe_ffn_a2a(cuda_backend *b, int32_t T, int32_t l, bool *summed, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int n = b->comm.size, r = b->comm.rank, K = c->num_experts_used, H = c->hidden_size;
    const int32_t t0 = (int32_t)((int64_t)T * r / n), ts = (int32_t)((int64_t)T * (r + 1) / n) - t0;
    const size_t row = (size_t)H * b->elt;
    cudaStream_t s = b->stream;
    int64_t R = 0;
    loom_status st;
    if ((st = cb_ep_pack(b, l, t0, ts, err)) || (st = cb_ep_dispatch(b, &R, err)) ||
        (st = cb_ep_experts(b, l, R, err)))
        return st;
    const void *ysh = NULL;
    if (ly->sh_gate) {
        if ((st = cb_moe_shared(b, T, l, err))) return st;
        ysh = b->moe_ysh;
    }
    /* r rows: [0, t0) and [t0 + ts, T) the shared expert alone (K = 0), the
     * slice its pairs in slot order as one backend sums them */
    const int32_t lo[3] = {0, t0, t0 + ts}, cnt[3] = {t0, ts, T - t0 - ts};
    uint8_t *out = ysh ? (uint8_t *)b->r : (uint8_t *)b->ep.gs;
    for (int i = 0; i < 3; i++) {
        if (cnt[i] == 0 || (!ysh && i != 1)) continue;
        const size_t o = (size_t)lo[i] * row;
        const bool mine = i == 1;
        if ((st = cb_moe_launch(b,
                                loom_cuda_moe_combine(b->dt, out + (ysh ? o : 0), mine ? b->ep.sx : NULL,
                                                      mine ? b->ep.inv : NULL, mine ? b->moe_wt : NULL, cnt[i],
                                                      mine ? K : 0, H, ysh ? (const uint8_t *)ysh + o : NULL,
                                                      (const uint8_t *)b->xn + o, ly->sh_gate, s),
                                "expert combine", l, err)))
            return st;
    }
    if (ysh) return LOOM_OK;
    /* every rank's slice (ceil(T / n) rows each, the tail unused) into r */
    const int32_t slice = (T + n - 1) / n;
    if ((st = cb_all_gather(b, b->ep.gs, b->ep.gr, (int64_t)slice * H, b->ldt, err))) return st;
    for (int q = 0; q < n; q++) {
        const int32_t q0 = (int32_t)((int64_t)T * q / n), qs = (int32_t)((int64_t)T * (q + 1) / n) - q0;
        if (qs > 0 &&
            (st = CB_CUDA(b, err, cudaMemcpyAsync((uint8_t *)b->r + (size_t)q0 * row,
                                                  (const uint8_t *)b->ep.gr + (size_t)q * slice * row,
                                                  (size_t)qs * row, cudaMemcpyDeviceToDevice, s))))
            return st;
    }
    *summed = true;
    return LOOM_OK;
}

loom_status cb_moe_ffn(cuda_backend *b, int32_t T, int32_t l, bool *summed, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const cuda_layer *ly = &b->layers[l];
    const int K = c->num_experts_used, H = c->hidden_size;
    const int32_t *rows = NULL;
    bool combined = false;
    loom_status st;
    *summed = false;
    if (cb_moe_a2a(b)) return cb_moe_ffn_a2a(b, T, l, summed, err);
    const cb_moe_rows in = {.x = b->xn, .nx = T, .div = K, .P = T * K, .sel = b->moe_sel};
    if ((st = cb_moe_route(b, l, b->xn, T, b->moe_e0, b->moe_el, err)) ||
        (st = cb_moe_experts(b, l, &in, true, &rows, &combined, err)) || combined)
        return st;
    if (ly->sh_gate && (st = cb_moe_shared(b, T, l, err))) return st;
    return cb_moe_launch(b,
                         loom_cuda_moe_combine(b->dt, b->r, b->moe_y, rows, b->moe_wt, T, K, H,
                                               ly->sh_gate ? b->moe_ysh : NULL, b->xn, ly->sh_gate, b->stream),
                         "expert combine", l, err);
}
