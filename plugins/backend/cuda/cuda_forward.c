/*
 * plugins/backend/cuda/cuda_forward.c — the cuda backend's forward pass
 * over one flattened batch (loom/backend.h):
 *   x = embed(ids)
 *   per layer: xn = rmsnorm(x [+= r]); qkv = xn Wqkv^T; rope + bias + KV
 *              write; att = paged_attention(q, cache); r = att Wo^T;
 *              xn = rmsnorm(x += r); gu = xn Wgu^T; act = swiglu(gu);
 *              r = act Wdown^T (a mixture of experts: r = its experts' FFN
 *              of xn, cuda_moe.c)
 *   logits rows: xs = rmsnorm(x[idx] + r[idx]); logits = xs LM^T (float32)
 * with x the float32 residual stream and everything else bf16/f16.
 * Qwen3 and Gemma 3 (the config's flags, loom/model.h) change, as the cpu
 * backend does: each q and k head is RMS-normed before RoPE (in the RoPE
 * kernel, loom_cuda_rope_kv_norm); Gemma 3 also scales the embeddings,
 * gives its sliding-window layers their own RoPE table and a window in
 * attention, runs GeGLU instead of SwiGLU, and adds the O and down
 * products to x through their own RMSNorm (loom_cuda_add_normed) as soon
 * as they are made, so no r is left pending for the next norm. W8A8 /
 * FP8 weights never see xn or act: their per-token activation codes are
 * made inside the RMSNorm / SwiGLU kernels (loom_cuda_qgemm_norm_run,
 * loom_cuda_qgemm_swiglu_run).
 *
 * Per step the host packs everything the kernels index — token ids,
 * positions, slots, logits rows, attention tiles and the block table — into
 * one pinned buffer and uploads it with a single copy; kernels read the
 * block-table row length from that buffer too, so nothing that changes from
 * step to step is a kernel argument. That is what lets a pure decode step
 * (every sequence one token, every token's logits) be captured once per
 * batch bucket as a CUDA graph and replayed: the step is padded to the
 * bucket with dummy rows (token 0 at position 0, slot -1 so nothing is
 * written, block table row of zeros, logits discarded), the metadata is
 * uploaded at the bucket's fixed offsets, and the graph runs the same
 * kernels and GEMMs at the same addresses. The first step of a bucket runs
 * the padded sequence eagerly (warming up every kernel and cuBLASLt plan it
 * uses) and is then captured; a failed capture leaves that bucket eager.
 *
 * Every other step (prefill, mixed prefill + decode; its attention launches
 * depend on the step's tiles) runs piecewise, as vLLM does: its T rows pad
 * to a token bucket (cb_tok_bucket: multiples of 16) with dummy tokens
 * (token 0 at position 0, no KV write, in no attention tile), and the
 * launches between two attention launches — the embedding or a layer's
 * FFN block, then the next layer's norm, QKV GEMM and RoPE — are one
 * captured graph each (layers + 1 per bucket), replayed with each layer's
 * attention launched eagerly between them; the LM head over the step's
 * own logits rows runs eagerly after. Every bucket up to max_graph_tokens
 * is captured at kv_alloc (cb_warm_pieces), so no step pays a capture;
 * one whose graphs were dropped runs eagerly and recaptures. On SmolLM2's
 * shape a mixed step is ~330 launches of a few microseconds of work each:
 * without graphs the GPU waits on the host.
 *
 * The only host synchronisation is on this instance's stream, before the
 * logits are read.
 *
 * Loaded by load_shard (tensor parallelism), a rank holds its heads, FFN
 * columns and vocabulary rows, and the step gains collectives (cuda_comm.c),
 * enqueued on this instance's stream — a device communicator (NCCL) orders
 * them with the kernels and nothing waits for a peer; a host one (the
 * executor's threads) syncs the stream and meets the peers in each call,
 * so its steps never run as graphs: token ids are mapped to this
 * rank's embedding rows at packing time (-1 outside its slice, a zero row)
 * and x is all-reduced after the embedding; after each row-parallel GEMM
 * (O and down, the last layer's too) its partial output r is all-reduced in
 * place, so every rank adds the same complete r to the same x; the LM head
 * computes this rank's (rows, vocab_pad) slice, an all-gather collects every
 * rank's and the rank given a logits buffer reorders them into whole rows
 * (ranks given none — the executor passes NULL to all but rank 0 — still
 * take part in every collective and sync). Decode graphs only when the
 * communicator's collectives are plain kernels (see cb_graph_bucket); no
 * piecewise graphs (cb_piece_bucket).
 *
 * Loaded by load_stage (pipeline parallelism), an instance runs only its
 * layers [layer0, layer0 + nlayers): a stage after the first receives x
 * and r from the previous stage before the step's launches instead of
 * embedding, a stage before the last sends them after its last layer
 * instead of the LM head (cb_recv_prev / cb_send_next). Its decode and
 * piecewise graphs cover its own layers; the links run outside them.
 */
#include <time.h>

#include "cuda_backend.h"
#include "kv_groups.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* ----------------------------------------------------------- batch checks */

static loom_status cb_check_batch(cuda_backend *b, const loom_batch *bt, const float *logits,
                                  loom_error *err) {
    const loom_host *h = b->host;
    if (!b->loaded || !b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: forward() before %s", !b->loaded ? "load()" : "kv_alloc()");
    char why[LOOM_ERROR_MSG_MAX - 16];
    /* only the last stage, and with tensor parallelism only some rank,
     * returns logits */
    loom_status st = b->host->check_batch(bt, logits, b->sharded || !b->last_stage, b->kv_layout.block_size,
                                      b->kv_layout.num_blocks, b->mc.vocab_size, b->rope_max_pos, why,
                                      sizeof why);
    if (st != LOOM_OK) return h->error(h->ctx, err, st, "backend cuda: %s", why);
    const int32_t groups = LOOM_HAS_FIELD(bt, loom_batch, num_groups) && bt->num_groups > 1 ? bt->num_groups : 1;
    if (groups != b->kv_groups)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: the batch has %d block-table groups, the KV layout %d", groups,
                        b->kv_groups);
    if (bt->num_tokens > b->max_tokens)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: batch of %d tokens exceeds the work buffers' %d; raise the "
                        "backend's max_batched_tokens or lower scheduler.max_batched_tokens",
                        bt->num_tokens, b->max_tokens);
    return LOOM_OK;
}

/* -------------------------------------------------------------- metadata */

/* Byte offsets of the regions of one step's metadata block; every region
 * starts 16-byte aligned. The block tables come last (their size varies
 * with the stride, the rest depends only on the capacities). With G
 * block-table groups there are G slot mappings of Tcap rows (group g's at
 * g * Tcap) and G tables of the step's rows (group g's at g * rows *
 * stride elements, the header's second int). */
typedef struct cb_meta_layout {
    size_t hdr, ids, pos, slot, lidx, dtiles, ptiles, bt;
} cb_meta_layout;

static size_t cb_a16(size_t n) { return (n + 15) & ~(size_t)15; }

static void cb_meta_layout_of(int32_t Tcap, int32_t NLcap, int32_t ndec, int32_t npre, int32_t G,
                              cb_meta_layout *l) {
    size_t o = 0;
    l->hdr = o, o += 16;
    l->ids = o, o += cb_a16((size_t)Tcap * 4);
    l->pos = o, o += cb_a16((size_t)Tcap * 4);
    l->slot = o, o += cb_a16((size_t)G * Tcap * 8);
    l->lidx = o, o += cb_a16((size_t)NLcap * 4);
    l->dtiles = o, o += (size_t)ndec * sizeof(loom_cuda_attn_tile);
    l->ptiles = o, o += (size_t)npre * sizeof(loom_cuda_attn_tile);
    l->bt = o;
}

/* Grow the metadata buffers to hold `bytes` (drops captured graphs: they
 * point into the old buffer). */
static loom_status cb_meta_reserve(cuda_backend *b, size_t bytes, loom_error *err) {
    if (bytes <= b->meta_cap) return LOOM_OK;
    size_t cap = b->meta_cap ? b->meta_cap : 1;
    while (cap < bytes) cap *= 2;
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream)))) return st;
    cb_graphs_reset(b);
    cudaFree(b->meta_dev);
    cudaFreeHost(b->meta_host);
    b->meta_dev = NULL;
    b->meta_host = NULL;
    b->meta_cap = 0;
    if ((st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->meta_host, cap, cudaHostAllocDefault))) ||
        (st = CB_CUDA(b, err, cudaMalloc((void **)&b->meta_dev, cap))))
        return st;
    b->meta_cap = cap;
    return LOOM_OK;
}

/* Split-K bound for a launch of `ntiles` tiles: one full wave of CTAs,
 * within the workspace. */
static int32_t cb_max_splits(const cuda_backend *b, loom_cuda_attn_shape shape, int32_t ntiles) {
    if (ntiles <= 0) return 1;
    int32_t ms = loom_cuda_attn_max_splits(ntiles, b->mc.num_kv_heads, b->attn_resident[shape]);
    while (ms > 1 && loom_cuda_attn_workspace_floats(shape, ntiles, b->mc.num_kv_heads,
                                                     b->mc.head_dim, (int)ms) > b->attn_ws_floats)
        ms--;
    return ms;
}

/* Pack the step's metadata into meta_host and fill the plan. pad_to > 0:
 * the graph layout — pad_to sequences of exactly q query tokens each:
 * sequence s's tokens at rows [s q, s q + n_s), then q - n_s dummy tokens
 * (the last real token's id and position, no KV write: their attention
 * reads what the real tokens read and their outputs are never used), then
 * pad_to - S dummy sequences (position 0, block table of zeros, no KV
 * write); logits rows are computed for all pad_to * q tokens, the wanted
 * ones first, in the caller's order. pad_to = 0 and pad_rows > T: the
 * piecewise layout — the batch as given, then pad_rows - T dummy tokens
 * (token 0 at position 0, no KV write, in no attention tile; logits only
 * for the batch's own rows). */
static loom_status cb_meta_build(cuda_backend *b, const loom_batch *bt, int32_t pad_to, int32_t q,
                                 int32_t pad_rows, cuda_plan *p, loom_error *err) {
    const int32_t S = bt->num_seqs, T = bt->num_tokens, G = b->group;
    const int32_t dec_rows = loom_cuda_attn_rows(LOOM_CUDA_ATTN_DECODE);
    const int32_t tpt = loom_cuda_attn_rows(LOOM_CUDA_ATTN_PREFILL) / G; /* tokens per tile */
    /* batch-invariant: one token per tile, every tile of one shape, so no
     * token's split plan follows another token's position */
    const bool inv = b->cfg.batch_invariant;
    const bool inv_dec = loom_cuda_attn_invariant_shape(G) == LOOM_CUDA_ATTN_DECODE;
    const bool pad = pad_to > 0;
    const int32_t rowsT = pad ? pad_to * q : pad_rows > T ? pad_rows : T, rowsS = pad ? pad_to : S;
    const int32_t NL = pad ? pad_to * q : bt->num_logits;
    const int32_t stride = bt->block_table_stride;

    int32_t ndec = 0, npre = 0;
    for (int32_t s = 0; s < rowsS; s++) {
        int32_t n = pad ? q : bt->query_start[s + 1] - bt->query_start[s];
        if (n <= 0) continue;
        if (inv) *(inv_dec ? &ndec : &npre) += n;
        else if (n * G <= dec_rows) ndec++;
        else npre += (n + tpt - 1) / tpt;
    }
    const int32_t NG = b->kv_groups;
    cb_meta_layout l;
    cb_meta_layout_of(rowsT, NL, ndec, npre, NG, &l);
    const size_t bytes = l.bt + (size_t)NG * rowsS * (size_t)stride * 4;
    loom_status st = cb_meta_reserve(b, bytes, err);
    if (st) return st;

    uint8_t *m = b->meta_host;
    int32_t *hdr = (int32_t *)(m + l.hdr);
    int32_t *ids = (int32_t *)(m + l.ids), *pos = (int32_t *)(m + l.pos);
    int64_t *slot = (int64_t *)(m + l.slot);
    int32_t *lidx = (int32_t *)(m + l.lidx), *btab = (int32_t *)(m + l.bt);
    loom_cuda_attn_tile *dt = (loom_cuda_attn_tile *)(m + l.dtiles);
    loom_cuda_attn_tile *pt = (loom_cuda_attn_tile *)(m + l.ptiles);
    hdr[0] = stride, hdr[1] = rowsS * stride, hdr[2] = hdr[3] = 0;
    if (!pad) {
        memcpy(ids, bt->token_ids, (size_t)T * 4);
        memcpy(pos, bt->positions, (size_t)T * 4);
        for (int32_t g = 0; g < NG; g++) {
            memcpy(slot + (size_t)g * rowsT, bt->slot_mapping + (size_t)g * T, (size_t)T * 8);
            for (int32_t r = T; r < rowsT; r++) slot[(size_t)g * rowsT + r] = -1;
        }
        memcpy(lidx, bt->logits_index, (size_t)NL * 4);
        for (int32_t r = T; r < rowsT; r++) ids[r] = 0, pos[r] = 0;
    } else {
        for (int32_t s = 0; s < rowsS; s++) {
            const int32_t q0 = s < S ? bt->query_start[s] : 0, n = s < S ? bt->query_start[s + 1] - q0 : 0;
            for (int32_t j = 0; j < q; j++) {
                const int32_t r = s * q + j, t = q0 + (j < n ? j : n - 1);
                ids[r] = n > 0 ? bt->token_ids[t] : 0;
                pos[r] = n > 0 ? bt->positions[t] : 0;
                for (int32_t g = 0; g < NG; g++)
                    slot[(size_t)g * rowsT + r] = n > 0 && j < n ? bt->slot_mapping[(size_t)g * T + t] : -1;
            }
        }
        /* wanted rows first (t -> its padded row), then any row */
        for (int32_t i = 0, s = 0; i < bt->num_logits; i++) {
            const int32_t t = bt->logits_index[i];
            while (s + 1 < S && bt->query_start[s + 1] <= t) s++; /* logits_index ascends */
            lidx[i] = s * q + (t - bt->query_start[s]);
        }
        for (int32_t i = bt->num_logits; i < NL; i++) lidx[i] = i;
    }
    if (b->sharded) /* vocabulary-parallel: this rank's embedding rows, -1 = a zero row */
        for (int32_t t = 0; t < rowsT; t++) {
            int64_t v = (int64_t)ids[t] - b->vocab_lo;
            ids[t] = v >= 0 && v < b->vocab_rows ? (int32_t)v : -1;
        }
    for (int32_t g = 0; g < NG; g++) { /* dummy sequences: rows of block 0 */
        int32_t *gt = btab + (size_t)g * rowsS * stride;
        memcpy(gt, bt->block_table + (size_t)g * S * stride, (size_t)S * (size_t)stride * 4);
        memset(gt + (size_t)S * stride, 0, (size_t)(rowsS - S) * (size_t)stride * 4);
    }
    int32_t id = 0, ip = 0;
    for (int32_t s = 0; s < rowsS; s++) {
        int32_t q0 = pad ? s * q : bt->query_start[s], n = pad ? q : bt->query_start[s + 1] - q0;
        if (n <= 0) continue;
        if (inv) {
            for (int32_t k = 0; k < n; k++) {
                const loom_cuda_attn_tile one = {.seq = s, .tok0 = q0 + k, .ntok = 1, .pad = 0};
                if (inv_dec) dt[id++] = one;
                else pt[ip++] = one;
            }
        } else if (n * G <= dec_rows) {
            dt[id++] = (loom_cuda_attn_tile){.seq = s, .tok0 = q0, .ntok = n, .pad = 0};
        } else {
            for (int32_t k = 0; k < n; k += tpt)
                pt[ip++] = (loom_cuda_attn_tile){.seq = s, .tok0 = q0 + k,
                                                 .ntok = n - k < tpt ? n - k : tpt, .pad = 0};
        }
    }

    uint8_t *d = b->meta_dev;
    *p = (cuda_plan){.T = rowsT, .NL = NL, .n_dec = ndec, .n_pre = npre,
                     .dec_splits = cb_max_splits(b, LOOM_CUDA_ATTN_DECODE, ndec),
                     .pre_splits = cb_max_splits(b, LOOM_CUDA_ATTN_PREFILL, npre),
                     .ids = (const int32_t *)(d + l.ids), .pos = (const int32_t *)(d + l.pos),
                     .slot = (const int64_t *)(d + l.slot), .lidx = (const int32_t *)(d + l.lidx),
                     .stride = (const int32_t *)(d + l.hdr), .bt = (const int32_t *)(d + l.bt),
                     .dec_tiles = (const loom_cuda_attn_tile *)(d + l.dtiles),
                     .pre_tiles = (const loom_cuda_attn_tile *)(d + l.ptiles), .bytes = bytes};
    return LOOM_OK;
}

/* --------------------------------------------------------------- record */

/* y (M, N) = x (M, K) @ W^T: the dt matrix w, or the quantized q when a
 * quantizer changed this group (q->fmt != NONE; w is NULL then). */
static loom_status cb_gemm(cuda_backend *b, bool out_f32, int32_t M, int32_t N, int32_t K,
                           const void *x, const void *w, const loom_cuda_qweight *q, void *y,
                           const char *what, loom_error *err) {
    char msg[256] = "";
    int rc = q && q->fmt != LOOM_CUDA_Q_NONE
                 ? loom_cuda_qgemm_run(b->gemm, b->dt, out_f32, M, q, x, y, b->qscratch,
                                       b->qscratch_bytes, b->stream, msg, sizeof msg)
                 : loom_cuda_gemm_run(b->gemm, b->dt, out_f32, M, N, K, x, w, y, b->stream, msg,
                                      sizeof msg);
    if (rc == 0) return LOOM_OK;
    (void)cudaGetLastError(); /* as cb_cuda_check: a later call is not to be blamed */
    return b->host->error(b->host->ctx, err, LOOM_ERR_DEVICE,
                          "backend cuda (device %d): %s GEMM (%d x %d x %d): %s", b->device, what,
                          M, N, K, msg);
}

/* y (T, N) = rmsnorm(x (+)= r) @ W^T (QKV, gate|up): add_rmsnorm into xn
 * then the GEMM; a quantized weight goes to loom_cuda_qgemm_norm_run, where
 * W8A8 / FP8 quantize the normalised rows inside the norm kernel (xn is not
 * written then: nothing after these GEMMs reads it). epi (NULL: none): the
 * kernel that follows (RoPE + KV write, SwiGLU), which a one-row GEMV does
 * itself (cuda_kernels.h: loom_cuda_epi). */
static loom_status cb_norm_gemm(cuda_backend *b, int32_t T, int32_t N, const float *norm_w, const void *r,
                                const void *w, const loom_cuda_qweight *q, void *y, const loom_cuda_epi *epi,
                                const char *what, loom_error *err) {
    const int32_t H = b->mc.hidden_size;
    char msg[256] = "";
    int rc;
    if (!q || q->fmt == LOOM_CUDA_Q_NONE) {
        loom_status st = CB_CUDA(b, err, loom_cuda_add_rmsnorm(b->dt, b->xn, b->x, r, norm_w, NULL, T, H,
                                                               b->mc.rms_norm_eps, b->stream));
        if (st) return st;
        if (!epi) return cb_gemm(b, false, T, N, H, b->xn, w, q, y, what, err);
        rc = loom_cuda_gemm_epi_run(b->gemm, b->dt, T, N, H, b->xn, w, y, epi, b->stream, msg, sizeof msg);
    } else {
        rc = loom_cuda_qgemm_norm_epi_run(b->gemm, b->dt, T, q, b->x, r, norm_w, b->mc.rms_norm_eps, b->xn, y, epi,
                                          b->qscratch, b->qscratch_bytes, b->stream, msg, sizeof msg);
    }
    if (rc == 0) return LOOM_OK;
    (void)cudaGetLastError();
    return b->host->error(b->host->ctx, err, LOOM_ERR_DEVICE, "backend cuda (device %d): %s GEMM (%d x %d x %d): %s",
                          b->device, what, T, N, H, msg);
}

/* r (T, H) = SwiGLU(gu) @ w_down^T: through act (loom_cuda_gemm_swiglu_run
 * decides whether to fuse; a quantized weight goes to
 * loom_cuda_qgemm_swiglu_run, where W8A8 / FP8 form the SwiGLU inside their
 * activation quantization and the others take act). */
static loom_status cb_swiglu_down(cuda_backend *b, int32_t T, const void *wdown, const loom_cuda_qweight *q,
                                  loom_error *err) {
    const int32_t H = b->mc.hidden_size, I = b->mc.intermediate_size;
    char msg[256] = "";
    const bool quant = q && q->fmt != LOOM_CUDA_Q_NONE;
    int rc = quant ? loom_cuda_qgemm_swiglu_run(b->gemm, b->dt, T, q, b->gu, b->act, b->r, b->qscratch,
                                                b->qscratch_bytes, b->stream, msg, sizeof msg)
                   : loom_cuda_gemm_swiglu_run(b->gemm, b->dt, T, H, I, b->gu, wdown, b->act, b->r,
                                               b->stream, msg, sizeof msg);
    if (rc == 0) return LOOM_OK;
    (void)cudaGetLastError();
    return b->host->error(b->host->ctx, err, LOOM_ERR_DEVICE, "backend cuda (device %d): ffn_down (%d x %d x %d): %s",
                          b->device, T, H, I, msg);
}

/* Whether a one-token step fuses SwiGLU into the gate|up GEMV for a layer
 * whose down projection is q. bf16 / W8A8 / FP8: yes. W8A16 / INT4: only
 * where that down projection's one-row GEMV splits K (loom_cuda_qgemm_splits):
 * unsplit, their down projection (512 / 256 CTAs on 132 SMs) runs a quarter
 * of the warps an SM holds, which a kernel between hides, and the fused
 * layer is slower (W8A16 82.6 -> 87.8 us); split, it is the faster one
 * (W8A16 77.8 -> 77.2 us, INT4 63.5 -> 62.6; docs/performance.md, "Tried
 * and rejected"). So not in batch-invariant mode. A tiled down
 * projection: with the qtiled_epilogues parameter, outside that mode,
 * whether it splits or not (not measured apart) — then SwiGLU goes into
 * the gate|up GEMM before it, whatever that one's format. GGUF (its own
 * GEMV, not measured): no. */
static bool cb_swiglu_fuses(const cuda_backend *b, const loom_cuda_qweight *q) {
    if (!q || q->fmt == LOOM_CUDA_Q_NONE || q->fmt == LOOM_CUDA_Q_INT8_W8A8 || q->fmt == LOOM_CUDA_Q_FP8)
        return true;
    if (q->layout == LOOM_CUDA_QLAYOUT_TILED) return b->cfg.qtiled_epilogues && !b->cfg.batch_invariant;
    return (q->fmt == LOOM_CUDA_Q_INT8_W8A16 || q->fmt == LOOM_CUDA_Q_INT4) && loom_cuda_qgemm_splits(b->gemm, b->dt, q);
}

/* Whether a one-token step hands q's GEMM its pair epilogue: yes but for
 * a tiled weight without the qtiled_epilogues parameter. (A tiled gate|up
 * without it takes cb_swiglu_down's path, as one before an unsplit
 * down projection does.) */
static bool cb_epi_ok(const cuda_backend *b, const loom_cuda_qweight *q) {
    return q->layout != LOOM_CUDA_QLAYOUT_TILED || b->cfg.qtiled_epilogues;
}

/* The residual's pending addend for the norm before a GEMM: the last O
 * or down product r, or NULL where nothing is pending (the first layer;
 * post-norm models, whose products went into x through their norm). */
static const void *cb_pending(const cuda_backend *b, int32_t l) {
    return l > 0 && !b->mc.post_norms ? b->r : NULL;
}

/* Layer l before attention: xn = rmsnorm(x [+= r]); qkv = xn Wqkv^T; RoPE
 * on q and k (QK-norm first where the model has it; a sliding-window
 * layer's own table), k and v written to the cache. */
static loom_status cb_record_pre_attention(cuda_backend *b, const cuda_plan *p, int32_t l, loom_error *err) {
    const loom_model_config *c = &b->mc;
    const int32_t T = p->T;
    const cuda_layer *ly = &b->layers[l];
    void *kc = b->pools[ly->kv_slot], *vc = b->pools[b->kv_npools + ly->kv_slot];
    const int64_t *slot = p->slot + (size_t)ly->kv_group * T; /* this layer's group's mapping */
    const float *cs = loom_kv_layer_window(c, l) > 0 ? b->rope_cs_local : b->rope_cs;
    /* (T, H) -> (T, QKV), RoPE + KV write; the pair epilogue at one row
     * (not with QK-norm: the norm sits between the GEMM and the rotation;
     * tiled weights only with qtiled_epilogues: cb_epi_ok) */
    const loom_cuda_epi rope = {.kind = LOOM_CUDA_EPI_ROPE_KV, .kv = b->kv, .bias = ly->bqkv,
                                .cs = cs, .pos = p->pos, .slot = slot, .k_cache = kc,
                                .v_cache = vc, .num_heads = c->num_heads, .num_kv_heads = c->num_kv_heads,
                                .head_dim = c->head_dim, .block_size = b->kv_layout.block_size};
    const bool fuse = T == 1 && !ly->q_norm && cb_epi_ok(b, &ly->q[CB_G_QKV]);
    loom_status st;
    if ((st = cb_norm_gemm(b, T, b->qkv_rows, ly->attn_norm, cb_pending(b, l), ly->wqkv, &ly->q[CB_G_QKV], b->qkv,
                           fuse ? &rope : NULL, "QKV", err)))
        return st;
    if (fuse) return LOOM_OK;
    if (ly->q_norm)
        return CB_CUDA(b, err, loom_cuda_rope_kv_norm(b->dt, b->kv, b->qkv, b->qkv_rows, ly->bqkv, ly->q_norm,
                                                      ly->k_norm, c->rms_norm_eps, cs, p->pos, slot, kc, vc, T,
                                                      c->num_heads, c->num_kv_heads, c->head_dim,
                                                      b->kv_layout.block_size, b->stream));
    return CB_CUDA(b, err, loom_cuda_rope_kv(b->dt, b->kv, b->qkv, b->qkv_rows, ly->bqkv, cs, p->pos,
                                             slot, kc, vc, T, c->num_heads, c->num_kv_heads, c->head_dim,
                                             b->kv_layout.block_size, b->stream));
}

/* Layer l's attention over the plan's tiles: qkv -> att (T, q_dim). The
 * launches depend on the step's tiles, so this part never goes into a
 * piecewise graph. */
static loom_status cb_record_attention(cuda_backend *b, const cuda_plan *p, int32_t l, loom_error *err) {
    const loom_model_config *c = &b->mc;
    cudaStream_t s = b->stream;
    const cuda_layer *ly = &b->layers[l];
    loom_cuda_attn_args aa = {.dt = b->dt, .kv = b->kv, .out = b->att, .ldo = b->q_dim, .q = b->qkv,
                              .ldq = b->qkv_rows, .block_table = p->bt, .bt_stride = p->stride,
                              .positions = p->pos, .num_heads = c->num_heads,
                              .num_kv_heads = c->num_kv_heads, .head_dim = c->head_dim,
                              .block_size = b->kv_layout.block_size,
                              .scale = c->attn_scale > 0 ? c->attn_scale : (float)(1.0 / sqrt((double)c->head_dim)),
                              .partial = b->attn_ws, .sem = b->attn_sem,
                              .k_cache = b->pools[ly->kv_slot], .v_cache = b->pools[b->kv_npools + ly->kv_slot],
                              .window = loom_kv_layer_window(c, l), .bt_group = ly->kv_group};
    loom_status st;
    if (b->cfg.batch_invariant) { /* one token per tile, all in one of the lists */
        aa.tiles = p->n_dec > 0 ? p->dec_tiles : p->pre_tiles, aa.num_tiles = p->n_dec + p->n_pre;
        return CB_CUDA(b, err, loom_cuda_attention_invariant(&aa, b->attn_ws_floats, s));
    }
    if (p->n_dec > 0) {
        aa.shape = LOOM_CUDA_ATTN_DECODE, aa.tiles = p->dec_tiles, aa.num_tiles = p->n_dec;
        aa.max_splits = p->dec_splits;
        if ((st = CB_CUDA(b, err, loom_cuda_attention(&aa, s)))) return st;
    }
    if (p->n_pre > 0) {
        aa.shape = LOOM_CUDA_ATTN_PREFILL, aa.tiles = p->pre_tiles, aa.num_tiles = p->n_pre;
        aa.max_splits = p->pre_splits;
        if ((st = CB_CUDA(b, err, loom_cuda_attention(&aa, s)))) return st;
    }
    return LOOM_OK;
}

/* Gemma 3's post-norm: x += rmsnorm(r) * w (w NULL: nothing, r stays
 * pending for the next norm). */
static loom_status cb_post_norm(cuda_backend *b, int32_t T, const float *w, loom_error *err) {
    if (!w) return LOOM_OK;
    return CB_CUDA(b, err, loom_cuda_add_normed(b->dt, b->x, b->r, w, T, b->mc.hidden_size, b->mc.rms_norm_eps,
                                                b->stream));
}

/* r (T, H) = GeGLU(gu) @ w_down^T: act = gelu_tanh(gate) * up, then the
 * down GEMM (any weight format). */
static loom_status cb_geglu_down(cuda_backend *b, int32_t T, const cuda_layer *ly, loom_error *err) {
    const int32_t H = b->mc.hidden_size, I = b->mc.intermediate_size;
    loom_status st = CB_CUDA(b, err, loom_cuda_geglu_tanh(b->dt, b->act, b->gu, T, I, b->stream));
    if (st) return st;
    return cb_gemm(b, false, T, H, I, b->act, ly->wdown, &ly->q[CB_G_DOWN], b->r, "ffn_down", err);
}

/* Layer l after attention: r = att Wo^T; x += r (Gemma: x += rmsnorm(r)
 * now); gu = rmsnorm(x) Wgu^T; r = SwiGLU(gu) Wdown^T (Gemma: GeGLU, then
 * x += rmsnorm(r)). The row-parallel GEMMs' partial r are summed over ranks
 * (sharded) before any norm reads them. */
static loom_status cb_record_post_attention(cuda_backend *b, const cuda_plan *p, int32_t l, loom_error *err) {
    const int32_t T = p->T, H = b->mc.hidden_size, I = b->mc.intermediate_size;
    const cuda_layer *ly = &b->layers[l];
    const bool gelu = b->mc.ffn_act == LOOM_FFN_GELU_TANH;
    if (b->mc.num_experts > 0) { /* r = the experts' FFN of rmsnorm(x += r) (cuda_moe.c) */
        loom_status st;
        bool summed = false;
        if ((st = cb_gemm(b, false, T, H, b->q_dim, b->att, ly->wo, &ly->q[CB_G_O], b->r, "attn_output", err)) ||
            (st = cb_all_reduce(b, b->r, (int64_t)T * H, b->ldt, err)) ||
            (st = CB_CUDA(b, err, loom_cuda_add_rmsnorm(b->dt, b->xn, b->x, b->r, ly->ffn_norm, NULL, T, H,
                                                        b->mc.rms_norm_eps, b->stream))) ||
            (st = cb_moe_ffn(b, T, l, &summed, err)))
            return st;
        /* expert parallelism: the ranks' shares (unless already gathered) */
        return summed ? LOOM_OK : cb_all_reduce(b, b->r, (int64_t)T * H, b->ldt, err);
    }
    const loom_cuda_epi swiglu = {.kind = LOOM_CUDA_EPI_SWIGLU, .act = b->act};
    const bool swiglu1 =
        T == 1 && !gelu && cb_swiglu_fuses(b, &ly->q[CB_G_DOWN]) && cb_epi_ok(b, &ly->q[CB_G_GU]);
    loom_status st;
    if ((st = cb_gemm(b, false, T, H, b->q_dim, b->att, ly->wo, &ly->q[CB_G_O], b->r, "attn_output", err)) ||
        (st = cb_all_reduce(b, b->r, (int64_t)T * H, b->ldt, err)) ||
        (st = cb_post_norm(b, T, ly->post_attn_norm, err)) ||
        (st = cb_norm_gemm(b, T, 2 * I, ly->ffn_norm, ly->post_attn_norm ? NULL : b->r, ly->wgu, &ly->q[CB_G_GU],
                           b->gu, swiglu1 ? &swiglu : NULL, "ffn_gate_up", err)))
        return st;
    if (gelu) st = cb_geglu_down(b, T, ly, err);
    else if (swiglu1) st = cb_gemm(b, false, T, H, I, b->act, ly->wdown, &ly->q[CB_G_DOWN], b->r, "ffn_down", err);
    else st = cb_swiglu_down(b, T, ly->wdown, &ly->q[CB_G_DOWN], err);
    if (st || (st = cb_all_reduce(b, b->r, (int64_t)T * H, b->ldt, err))) return st;
    return cb_post_norm(b, T, ly->post_ffn_norm, err);
}

/* Piece i in [layer0, layer0 + nlayers] of the layers held: everything
 * between attention launches i - 1 and i — the embedding (i = 0; a later
 * pipeline stage has received x and r instead) or layer i - 1's FFN block,
 * then layer i's QKV (i < the end). The same launches for every step of
 * the same rows, which is what a piecewise graph captures. */
static loom_status cb_record_piece(cuda_backend *b, const cuda_plan *p, int32_t i, loom_error *err) {
    const int32_t T = p->T, H = b->mc.hidden_size;
    loom_status st;
    if (i == b->layer0) {
        const float scale = b->mc.embed_scale > 0 ? b->mc.embed_scale : 1.0f;
        if (b->first_stage &&
            ((st = CB_CUDA(b, err, loom_cuda_embedding_scaled(b->dt, b->x, b->embed, p->ids, T, H, scale, b->stream))) ||
             (st = cb_all_reduce(b, b->x, (int64_t)T * H, LOOM_DTYPE_F32, err))))
            return st;
    } else if ((st = cb_record_post_attention(b, p, i - 1, err))) {
        return st;
    }
    return i < b->layer0 + b->nlayers ? cb_record_pre_attention(b, p, i, err) : LOOM_OK;
}

/* Enqueue the embedding and every layer for p->T rows. Leaves the residual
 * stream in x and the last layer's down projection in r (sharded: both
 * already summed over the ranks). A one-token step (batch-1 decode) hands
 * RoPE + KV write — and SwiGLU where it pays (cb_swiglu_fuses) — to the
 * QKV and gate|up GEMVs (tiled weights: with qtiled_epilogues, cb_epi_ok;
 * pair epilogues, cuda_kernels.h: loom_cuda_epi; a
 * launch and a kernel boundary fewer each, the same bits as the separate
 * kernels after an unsplit GEMV; in a CUDA graph
 * on the H200 the separate kernels cost ~2.2 us each of a Llama-3-8B
 * layer, bench/results/h200-llama3-8b-decode-layer.json); the down
 * projection then reads act, which the epilogue wrote. */
static loom_status cb_record_layers(cuda_backend *b, const cuda_plan *p, loom_error *err) {
    loom_status st;
    const int32_t end = b->layer0 + b->nlayers;
    for (int32_t i = b->layer0; i <= end; i++)
        if ((st = cb_record_piece(b, p, i, err)) || (i < end && (st = cb_record_attention(b, p, i, err))))
            return st;
    return LOOM_OK;
}

/* Vocabulary-parallel LM head on xs (n, H): this rank's (n, vocab_pad)
 * slice (zero columns past its vocab_rows: the padded weight rows are
 * zero), all-gathered as (size, n, vocab_pad), reordered into logits_dev
 * (n, vocab) when `to_host` (this rank was given a logits buffer). */
static loom_status cb_lm_head_shard(cuda_backend *b, int32_t n, bool to_host, loom_error *err) {
    const int64_t H = b->mc.hidden_size, V = b->mc.vocab_size, P = b->vocab_pad;
    loom_status st;
    if ((st = cb_gemm(b, true, n, (int32_t)P, (int32_t)H, b->xs, b->lm_head, &b->lm_q,
                      b->logits_local, "lm_head", err)) ||
        (st = cb_all_gather(b, b->logits_local, b->logits_gathered, (int64_t)n * P, LOOM_DTYPE_F32, err)))
        return st;
    if (!to_host) return LOOM_OK;
    for (int64_t r = 0; r < b->comm.size; r++) {
        const int64_t lo = r * P, w = V - lo < P ? V - lo : P;
        if (w <= 0) continue; /* a rank without vocabulary: padding only */
        if ((st = CB_CUDA(b, err, cudaMemcpy2DAsync(b->logits_dev + lo, (size_t)V * sizeof(float),
                                                    b->logits_gathered + r * n * P,
                                                    (size_t)P * sizeof(float),
                                                    (size_t)w * sizeof(float), (size_t)n,
                                                    cudaMemcpyDeviceToDevice, b->stream))))
            return st;
    }
    return LOOM_OK;
}

/* Enqueue the final norm and LM head for logits rows [row0, row0 + n)
 * into logits_dev (n, vocab) float32 — for a sharded rank only when
 * `to_host` (this rank returns logits). Moving them to the host is
 * cb_emit_logits's, after the step (outside any captured graph). */
static loom_status cb_record_logits(cuda_backend *b, const cuda_plan *p, int32_t row0, int32_t n,
                                    bool to_host, loom_error *err) {
    const loom_model_config *c = &b->mc;
    loom_status st;
    if ((st = CB_CUDA(b, err, loom_cuda_add_rmsnorm(b->dt, b->xs, b->x, cb_pending(b, c->num_layers), b->out_norm,
                                                    p->lidx + row0, n, c->hidden_size,
                                                    c->rms_norm_eps, b->stream))))
        return st;
    if (b->sharded) return cb_lm_head_shard(b, n, to_host, err);
    return cb_gemm(b, true, n, c->vocab_size, c->hidden_size, b->xs, b->lm_head, &b->lm_q, b->logits_dev,
                   "lm_head", err);
}

/* Phase accounting (cuda_backend.h, CB_PH_*): the wall time since the
 * last mark goes to `phase` of the step's path. Nothing outside a timed
 * step (the warm-up at kv_alloc). */
static double cb_now(void);
static void cb_mark(cuda_backend *b, int phase) {
    if (!b->in_step) return;
    const double now = cb_now();
    b->ph[b->cur_path][phase] += now - b->mark_t;
    b->mark_t = now;
}

/* The GPU's side of a timed step: an event before its first upload and one
 * before each of its waits (cb_sync; recorded again, the last one counts);
 * the events are made at the first timed step (a failure only leaves the
 * GPU split out). */
static void cb_event(cuda_backend *b, bool end) {
    if (!b->in_step || (!end && b->ev_started)) return;
    if (!b->ev_start && (cudaEventCreate(&b->ev_start) != cudaSuccess || cudaEventCreate(&b->ev_end) != cudaSuccess ||
                         cudaEventCreate(&b->ev_prev_end) != cudaSuccess)) {
        (void)cudaGetLastError();
        return;
    }
    if (!b->ev_prev_end) return;
    if (cudaEventRecord(end ? b->ev_end : b->ev_start, b->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (end) b->ev_ended = true;
    else b->ev_started = true;
}

static loom_status cb_upload_meta(cuda_backend *b, const cuda_plan *p, loom_error *err) {
    cb_event(b, false);
    return CB_CUDA(b, err, cudaMemcpyAsync(b->meta_dev, b->meta_host, p->bytes,
                                           cudaMemcpyHostToDevice, b->stream));
}

/* Copy `rows` rows of logits from the pinned mirror to the caller. One
 * thread moves ~10 GB/s; a batch-64 step of a 128k vocabulary is 33 MB, so
 * large copies are split over a few threads. */
typedef struct cb_copy_job {
    char *dst;
    const char *src;
    size_t n;
} cb_copy_job;

static void *cb_copy_main(void *arg) {
    cb_copy_job *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

#define CB_COPY_THREADS 8
#define CB_COPY_SPLIT ((size_t)2 << 20) /* bytes per thread, at least */

static void cb_logits_out(cuda_backend *b, float *dst, int32_t rows) {
    const size_t bytes = (size_t)rows * (size_t)b->mc.vocab_size * sizeof(float);
    int nt = (int)(bytes / CB_COPY_SPLIT);
    int host_threads = b->host->num_threads ? b->host->num_threads(b->host->ctx) : 1;
    if (nt > CB_COPY_THREADS) nt = CB_COPY_THREADS;
    if (nt > host_threads) nt = host_threads;
    if (nt <= 1) {
        memcpy(dst, b->logits_host, bytes);
        return;
    }
    cb_copy_job jobs[CB_COPY_THREADS];
    pthread_t tids[CB_COPY_THREADS];
    bool started[CB_COPY_THREADS] = {false};
    for (int i = 0; i < nt; i++) {
        size_t a = bytes * (size_t)i / (size_t)nt, e = bytes * (size_t)(i + 1) / (size_t)nt;
        a &= ~(size_t)63, e = i + 1 == nt ? bytes : e & ~(size_t)63;
        jobs[i] = (cb_copy_job){(char *)dst + a, (const char *)b->logits_host + a, e - a};
        if (i > 0) started[i] = pthread_create(&tids[i], NULL, cb_copy_main, &jobs[i]) == 0;
    }
    cb_copy_main(&jobs[0]);
    for (int i = 1; i < nt; i++) {
        if (started[i]) pthread_join(tids[i], NULL);
        else cb_copy_main(&jobs[i]);
    }
}

static double cb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The step's wait for the GPU, timed (cb_destroy logs the split). */
static loom_status cb_sync(cuda_backend *b, loom_error *err) {
    cb_mark(b, CB_PH_EMIT);
    cb_event(b, true);
    const double t0 = cb_now();
    loom_status st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    b->wait_seconds += cb_now() - t0;
    cb_mark(b, CB_PH_WAIT);
    return st;
}

/* A failure after copies were enqueued from pinned staging: wait for the
 * stream (its own status aside) so the next step cannot rewrite staging a
 * copy still reads. */
static loom_status cb_drain(cuda_backend *b, loom_status st) {
    (void)cudaStreamSynchronize(b->stream);
    return st;
}

/* Row r's constraint mask in tk, or NULL (loom/backend.h, ABI 2.4). */
static const uint32_t *cb_row_mask(const loom_logits_topk *tk, size_t r) {
    return LOOM_HAS_FIELD(tk, loom_logits_topk, fill_masks) && tk->allowed ? tk->allowed[r] : NULL;
}

/* The masks of rows [r0, r0 + nreal) to the device (bits | flags, one
 * copy), or *d_masks NULL when none of them has one. */
static loom_status cb_upload_masks(cuda_backend *b, int32_t r0, int32_t nreal, const loom_logits_topk *tk,
                                   const uint32_t **d_masks, const uint8_t **d_has, loom_error *err) {
    const size_t W = (size_t)b->mask_words;
    uint8_t *has = (uint8_t *)(b->mask_host + (size_t)nreal * W);
    bool any = false;
    for (int32_t i = 0; i < nreal; i++) {
        const uint32_t *m = cb_row_mask(tk, (size_t)(r0 + i));
        has[i] = m != NULL;
        if (m) memcpy(b->mask_host + (size_t)i * W, m, W * 4);
        any |= has[i];
    }
    *d_masks = NULL;
    *d_has = NULL;
    if (!any) return LOOM_OK;
    const size_t bytes = (size_t)nreal * (W * 4 + 1);
    loom_status st;
    if (!b->mask_copied) { /* both or neither: a half-made pair is made again next time */
        if (!b->mask_stream && (st = CB_CUDA(b, err, cudaStreamCreateWithFlags(&b->mask_stream, cudaStreamNonBlocking))))
            return st;
        if ((st = CB_CUDA(b, err, cudaEventCreateWithFlags(&b->mask_copied, cudaEventDisableTiming)))) {
            b->mask_copied = NULL;
            return st;
        }
    }
    /* staging is rewritten only after the step's sync, which waited for this copy */
    if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->mask_dev, b->mask_host, bytes, cudaMemcpyHostToDevice,
                                              b->mask_stream))) ||
        (st = CB_CUDA(b, err, cudaEventRecord(b->mask_copied, b->mask_stream))) ||
        (st = CB_CUDA(b, err, cudaStreamWaitEvent(b->stream, b->mask_copied, 0)))) {
        (void)cudaStreamSynchronize(b->mask_stream); /* the copy may still read the staging */
        return st;
    }
    *d_masks = b->mask_dev;
    *d_has = (const uint8_t *)(b->mask_dev + (size_t)nreal * W);
    return LOOM_OK;
}

/* Move logits rows [r0, r0 + nreal) of the step, now in logits_dev rows
 * [0, nreal), to the caller, and wait for the stream. Whole rows
 * (`logits`, tk NULL) go through the pinned mirror. With `tk`
 * (forward_topk) the rows are reduced on the device and only the summary
 * and the rows tk->want_full marks cross; vocabularies the kernel does not
 * serve are reduced on the host instead (host->logits_topk_row). Neither:
 * a tensor-parallel rank that returns nothing; just wait. */
static loom_status cb_emit_logits(cuda_backend *b, int32_t r0, int32_t nreal, float *logits,
                                  const loom_logits_topk *tk, loom_error *err) {
    const size_t V = (size_t)b->mc.vocab_size, row_bytes = V * sizeof(float);
    loom_status st;
    /* every launch of the step is enqueued: has the GPU already run them
     * all (then it waited for the host)? */
    cb_mark(b, CB_PH_LAUNCH);
    if (b->in_step && r0 == 0 && cudaStreamQuery(b->stream) == cudaSuccess) b->starved[b->cur_path]++;
    if (nreal <= 0 || (!logits && !tk)) return cb_sync(b, err);
    if (!tk) {
        if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->logits_host, b->logits_dev, (size_t)nreal * row_bytes,
                                                  cudaMemcpyDeviceToHost, b->stream))) ||
            (st = cb_sync(b, err)))
            return st;
        cb_logits_out(b, logits + (size_t)r0 * V, nreal);
        return LOOM_OK;
    }
    const int32_t k = tk->k;
    const bool on_device = loom_cuda_topk_supported((int)V, k);
    /* the masks are computed by the caller while the step runs */
    if (LOOM_HAS_FIELD(tk, loom_logits_topk, fill_masks) && tk->fill_masks) {
        const double t0 = cb_now();
        if ((st = tk->fill_masks(tk->fill_ctx, err)) != LOOM_OK) return st;
        b->mask_seconds += cb_now() - t0;
        b->mask_steps++;
        b->mask_late += cudaStreamQuery(b->stream) == cudaSuccess; /* the GPU waited for them */
        cb_mark(b, CB_PH_MASK);
    }
    const uint32_t *d_masks = NULL;
    const uint8_t *d_has = NULL;
    if (on_device && (st = cb_upload_masks(b, r0, nreal, tk, &d_masks, &d_has, err))) return st;
    /* the summary packed as ids (nreal, k) | values (nreal, k) | lse (nreal),
     * so one small copy crosses instead of three — each copy is a few
     * microseconds of a batch-1 step that is ~0.7 ms on SmolLM2 */
    const size_t nk = (size_t)nreal * (size_t)k;
    int32_t *d_ids = b->topk_dev, *h_ids = b->topk_host;
    float *d_vals = (float *)(d_ids + nk), *d_lse = d_vals + nk;
    const float *h_vals = (const float *)(h_ids + nk), *h_lse = h_vals + nk;
    if (on_device) {
        if ((st = CB_CUDA(b, err, loom_cuda_logits_topk(b->logits_dev, nreal, (int)V, k, d_masks, d_has, d_ids,
                                                        d_vals, d_lse, b->topk_ws, b->stream))) ||
            (st = CB_CUDA(b, err, cudaMemcpyAsync(h_ids, d_ids, (2 * nk + (size_t)nreal) * 4,
                                                  cudaMemcpyDeviceToHost, b->stream))))
            return cb_drain(b, st);
    }
    for (int32_t i = 0; i < nreal; i++) {
        if (on_device && !tk->want_full[r0 + i]) continue;
        if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->logits_host + (size_t)i * V, b->logits_dev + (size_t)i * V,
                                                  row_bytes, cudaMemcpyDeviceToHost, b->stream))))
            return cb_drain(b, st);
    }
    if ((st = cb_sync(b, err))) return st;
    for (int32_t i = 0; i < nreal; i++) {
        const size_t r = (size_t)(r0 + i);
        if (on_device) {
            memcpy(tk->top_ids + r * k, h_ids + (size_t)i * k, (size_t)k * sizeof(int32_t));
            memcpy(tk->top_vals + r * k, h_vals + (size_t)i * k, (size_t)k * sizeof(float));
            tk->lse[r] = h_lse[i];
        } else {
            const float *row = b->logits_host + (size_t)i * V;
            const uint32_t *m = cb_row_mask(tk, r);
            if (m) b->host->logits_topk_masked_row(row, (int32_t)V, m, k, tk->top_ids + r * k, tk->top_vals + r * k,
                                                   tk->lse + r);
            else b->host->logits_topk_row(row, (int32_t)V, k, tk->top_ids + r * k, tk->top_vals + r * k, tk->lse + r);
        }
        if (tk->want_full[r]) memcpy(tk->full + r * V, b->logits_host + (size_t)i * V, row_bytes);
    }
    return LOOM_OK;
}

/* Pipeline links (loom/backend.h, loom_stage): one message per step of
 * the step's real rows, x (f32) then r (dt) — what the next layer's norm
 * would add (cb_link_bytes). Device links move link_buf on the stream;
 * host links stage it through pinned memory, waiting for the GPU before
 * a send. Either way the step ends synchronised, like one that returns
 * logits. */
static loom_status cb_recv_prev(cuda_backend *b, loom_error *err) {
    const int64_t T = b->step_tokens, n = T * b->mc.hidden_size;
    const size_t xb = (size_t)n * 4;
    const bool dev = b->stage.device_links;
    loom_status st = b->stage.recv_prev(b->stage.ctx, b->link_buf, (int64_t)cb_link_bytes(b, T), LOOM_DTYPE_U8,
                                        dev ? (void *)b->stream : NULL, err);
    if (st) return st;
    const enum cudaMemcpyKind kind = dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->x, b->link_buf, xb, kind, b->stream))) ||
        (st = CB_CUDA(b, err, cudaMemcpyAsync(b->r, (uint8_t *)b->link_buf + xb, (size_t)n * b->elt, kind,
                                              b->stream))))
        return cb_drain(b, st);
    return LOOM_OK;
}

/* A step's rows as this stage lays them out (the plan: a graph bucket
 * spreads sequences s * q + j, padded), the same on every stage for the
 * same batch; a stage after the first receives them before its launches. */
static loom_status cb_stage_in(cuda_backend *b, const cuda_plan *p, loom_error *err) {
    b->step_tokens = p->T;
    return b->first_stage ? LOOM_OK : cb_recv_prev(b, err);
}

static loom_status cb_send_next(cuda_backend *b, loom_error *err) {
    const int64_t T = b->step_tokens, n = T * b->mc.hidden_size;
    const size_t xb = (size_t)n * 4;
    const bool dev = b->stage.device_links;
    const enum cudaMemcpyKind kind = dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    loom_status st;
    if ((st = CB_CUDA(b, err, cudaMemcpyAsync(b->link_buf, b->x, xb, kind, b->stream))) ||
        (st = CB_CUDA(b, err, cudaMemcpyAsync((uint8_t *)b->link_buf + xb, b->r, (size_t)n * b->elt, kind,
                                              b->stream))))
        return cb_drain(b, st);
    if (!dev && (st = cb_sync(b, err))) return st;
    st = b->stage.send_next(b->stage.ctx, b->link_buf, (int64_t)cb_link_bytes(b, T), LOOM_DTYPE_U8,
                            dev ? (void *)b->stream : NULL, err);
    if (st) return cb_drain(b, st);
    return dev ? cb_sync(b, err) : LOOM_OK;
}

/* The LM head over all p->NL rows in chunks of logits_rows, of which the
 * first `real_logits` go to the caller, and the wait for the step's end. */
static loom_status cb_run_logits(cuda_backend *b, const cuda_plan *p, float *logits, const loom_logits_topk *tk,
                                 int32_t real_logits, loom_error *err) {
    if (!b->last_stage) return cb_send_next(b, err);
    loom_status st = LOOM_OK;
    for (int32_t r0 = 0; r0 < p->NL; r0 += b->logits_rows) {
        int32_t n = p->NL - r0 < b->logits_rows ? p->NL - r0 : b->logits_rows;
        int32_t nreal = real_logits - r0 < n ? real_logits - r0 : n;
        /* logits and tk NULL: a tensor-parallel rank other than the one
         * that returns them (cb_check_batch allows it only when sharded) */
        if ((st = cb_record_logits(b, p, r0, n, logits != NULL || tk != NULL, err)) ||
            (st = cb_emit_logits(b, r0, nreal, logits, tk, err)))
            return st;
    }
    return p->NL == 0 ? cb_sync(b, err) : st;
}

/* Whole step eagerly: layers, then the logits (a padded step computes its
 * dummy rows too, so the warm-up runs exactly the GEMM shapes the graph
 * will capture). */
static loom_status cb_run_eager(cuda_backend *b, const cuda_plan *p, float *logits, const loom_logits_topk *tk,
                                int32_t real_logits, loom_error *err) {
    loom_status st;
    if ((st = cb_upload_meta(b, p, err)) || (st = cb_record_layers(b, p, err))) return st;
    b->eager_steps++;
    return cb_run_logits(b, p, logits, tk, real_logits, err);
}

/* A step through token bucket kt's piecewise graphs: each piece replayed,
 * each layer's attention launched between them for this step's tiles, the
 * LM head eagerly (its rows are the step's own). */
static loom_status cb_run_piecewise(cuda_backend *b, const cuda_plan *p, int kt, float *logits,
                                    const loom_logits_topk *tk, int32_t real_logits, loom_error *err) {
    const cuda_piece_set *ps = &b->pieces[kt];
    const int32_t end = b->layer0 + b->nlayers;
    loom_status st;
    if ((st = cb_upload_meta(b, p, err))) return st;
    for (int32_t i = b->layer0; i <= end; i++)
        if ((st = CB_CUDA(b, err, cudaGraphLaunch(ps->exec[i - b->layer0], b->stream))) ||
            (i < end && (st = cb_record_attention(b, p, i, err))))
            return st;
    b->piecewise_replays++;
    if (b->host->metric_add) b->host->metric_add(b->host->ctx, "backend.cuda.piecewise_replays", 1);
    return cb_run_logits(b, p, logits, tk, real_logits, err);
}

/* Capture piece `piece` of plan p (cb_record_piece's numbering; < 0: the
 * whole padded decode step with its LM head — a pipeline stage before the
 * last has none) as an instantiated graph in *exec. */
static loom_status cb_capture_one(cuda_backend *b, const cuda_plan *p, int32_t piece, cudaGraphExec_t *exec,
                                  loom_error *err) {
    cudaGraph_t graph = NULL;
    *exec = NULL;
    loom_status st = CB_CUDA(b, err, cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
    if (st) return st;
    if (piece >= 0) st = cb_record_piece(b, p, piece, err);
    else if ((st = cb_record_layers(b, p, err)) == LOOM_OK && b->last_stage)
        st = cb_record_logits(b, p, 0, p->NL, true, err);
    cudaError_t ce = cudaStreamEndCapture(b->stream, &graph); /* always end what was begun */
    if (st == LOOM_OK) st = cb_cuda_check(b, err, ce, "cudaStreamEndCapture", __FILE__, __LINE__);
    if (st == LOOM_OK && (st = CB_CUDA(b, err, cudaGraphInstantiateWithFlags(exec, graph, 0))))
        *exec = NULL;
    /* on the device now, not at its first launch inside a timed step */
    if (st == LOOM_OK && (st = CB_CUDA(b, err, cudaGraphUpload(*exec, b->stream)))) {
        cudaGraphExecDestroy(*exec);
        *exec = NULL;
    }
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return st;
}

/* Capture every piece of token bucket kt from the padded plan p. Failure
 * leaves the bucket eager and is only logged. */
static void cb_capture_pieces(cuda_backend *b, int kt, const cuda_plan *p) {
    const loom_host *h = b->host;
    const int32_t L = b->nlayers;
    cuda_piece_set *ps = &b->pieces[kt];
    ps->tried = true;
    loom_error e = {0};
    loom_status st = LOOM_OK;
    ps->exec = h->calloc(h->ctx, (size_t)L + 1, sizeof *ps->exec);
    if (!ps->exec) st = h->error(h->ctx, &e, LOOM_ERR_NOMEM, "out of host memory");
    for (int32_t i = 0; st == LOOM_OK && i <= L; i++) st = cb_capture_one(b, p, b->layer0 + i, &ps->exec[i], &e);
    if (st == LOOM_OK) {
        h->log(h->ctx, LOOM_LOG_DEBUG, CB_WHO, "captured %d piecewise graphs for %d token rows", L + 1, p->T);
        if (h->metric_add) h->metric_add(h->ctx, "backend.cuda.graph_captures", L + 1);
        return;
    }
    h->log(h->ctx, LOOM_LOG_WARN, CB_WHO, "piecewise graph capture for %d token rows failed; that size stays eager: %s",
           p->T, e.message);
    if (ps->exec)
        for (int32_t i = 0; i <= L; i++)
            if (ps->exec[i]) cudaGraphExecDestroy(ps->exec[i]);
    h->free(h->ctx, ps->exec);
    ps->exec = NULL;
}

/* Capture the padded step of plan p as graph (q, bucket k). Failure
 * leaves that graph eager and is only logged. */
static void cb_capture(cuda_backend *b, int q, int k, const cuda_plan *p) {
    const loom_host *h = b->host;
    cuda_graph_slot *g = &b->graphs[q - 1][k];
    g->tried = true;
    loom_error e = {0};
    if (cb_capture_one(b, p, -1, &g->exec, &e) != LOOM_OK)
        h->log(h->ctx, LOOM_LOG_WARN, CB_WHO,
               "CUDA graph capture for batch %d x %d tokens failed; that shape stays eager: %s",
               cb_buckets[k], q, e.message);
    else {
        h->log(h->ctx, LOOM_LOG_DEBUG, CB_WHO, "captured graph for batch %d x %d tokens", cb_buckets[k], q);
        if (h->metric_add) h->metric_add(h->ctx, "backend.cuda.graph_captures", 1);
    }
}

/* Bucket index for a step that may use a graph, or -1; *q = the tokens
 * every sequence is padded to. Any step whose sequences each bring 1..
 * CB_GRAPH_MAX_Q query tokens qualifies: decode (q = 1), draft
 * verification (q = k + 1), short prefill tails. */
static int cb_graph_bucket(const cuda_backend *b, const loom_batch *bt, int32_t *q) {
    /* Sharded: graphs only when every collective of the step is one the
     * communicator runs as a plain kernel (comm.graph_safe_bytes, the tp
     * executor's peer-to-peer path), never NCCL: on 2 H200s a sharded
     * step that captured NCCL collectives (two ranks, one thread each, one
     * process) never finished. Every rank sees the
     * same batches, so all capture and replay the same buckets together. */
    /* host collectives and the all-to-all form wait for the host */
    if (!b->cfg.cuda_graphs || b->comm_host || cb_moe_a2a(b)) return -1;
    const int64_t comm_row_bytes =
        4 * (b->mc.hidden_size > b->vocab_pad ? (int64_t)b->mc.hidden_size : (int64_t)b->vocab_pad);
    const int32_t S = bt->num_seqs;
    int32_t qmax = 0;
    for (int32_t s = 0; s < S; s++) {
        int32_t n = bt->query_start[s + 1] - bt->query_start[s];
        if (n < 1 || n > CB_GRAPH_MAX_Q) return -1;
        if (n > qmax) qmax = n;
    }
    if (S > b->cfg.max_graph_batch) return -1;
    for (int k = 0; k < CB_NUM_BUCKETS; k++) {
        if (cb_buckets[k] < S) continue;
        const int32_t rows = cb_buckets[k] * qmax;
        if (cb_buckets[k] > b->cfg.max_graph_batch || rows > b->max_tokens || rows > b->logits_rows) return -1;
        /* f32 x after the embedding, f32 logits slices: 4 bytes a column */
        if (b->sharded && (int64_t)rows * comm_row_bytes > b->comm.graph_safe_bytes) return -1;
        *q = qmax;
        return k;
    }
    return -1;
}

/* Rows of token bucket kt as this instance pads to them: the last bucket
 * that reaches past the work buffers stops at their end. */
static int32_t cb_piece_rows(const cuda_backend *b, int kt) {
    const int32_t rows = cb_tok_bucket_rows(kt);
    return rows < b->max_tokens ? rows : b->max_tokens;
}

/* The plan of `rows` dummy tokens (token 0 at position 0, no KV write, no
 * attention tile, no logits) in the piecewise layout of that many rows:
 * its ids / positions / slots sit where a real step of the same bucket
 * puts them, so pieces captured from it serve every such step. */
static loom_status cb_meta_dummy(cuda_backend *b, int32_t rows, cuda_plan *p, loom_error *err) {
    cb_meta_layout l;
    cb_meta_layout_of(rows, 0, 0, 0, b->kv_groups, &l);
    loom_status st = cb_meta_reserve(b, l.bt, err);
    if (st) return st;
    uint8_t *m = b->meta_host;
    int32_t *hdr = (int32_t *)(m + l.hdr), *ids = (int32_t *)(m + l.ids), *pos = (int32_t *)(m + l.pos);
    int64_t *slot = (int64_t *)(m + l.slot);
    hdr[0] = hdr[1] = hdr[2] = hdr[3] = 0;
    for (int32_t r = 0; r < rows; r++) ids[r] = 0, pos[r] = 0;
    for (int32_t r = 0; r < rows * b->kv_groups; r++) slot[r] = -1;
    const uint8_t *d = b->meta_dev;
    *p = (cuda_plan){.T = rows, .dec_splits = 1, .pre_splits = 1, .ids = (const int32_t *)(d + l.ids),
                     .pos = (const int32_t *)(d + l.pos), .slot = (const int64_t *)(d + l.slot),
                     .lidx = (const int32_t *)(d + l.lidx), .stride = (const int32_t *)(d + l.hdr),
                     .bt = (const int32_t *)(d + l.bt), .bytes = l.bt};
    return LOOM_OK;
}

/* Bytes of free device memory now (0 when the query fails). */
static size_t cb_free_bytes(void) {
    size_t free_b = 0, total = 0;
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? free_b : 0;
}

/* Capture the pieces of every token bucket a step of up to
 * max_graph_tokens rows can take, now (after kv_alloc), as vLLM does at
 * start-up: lazily, each bucket's first step would pay its eager warm-up
 * and captures (~1 ms a layer), which lands in whatever is being timed
 * then. Each bucket runs its dummy plan eagerly first (kernels and
 * cuBLASLt plans warmed outside a capture). Buckets of at most
 * CB_GRAPH_MAX_Q rows are left out: every step that small is a decode-graph
 * step. A failed capture leaves its bucket eager and is only logged; a
 * failed eager run is a device error and fails kv_alloc. */
loom_status cb_warm_pieces(cuda_backend *b, loom_error *err) {
    if (!b->cfg.cuda_graphs || !b->cfg.piecewise_graphs || b->cfg.batch_invariant || b->sharded) return LOOM_OK;
    const loom_host *h = b->host;
    const int32_t most = b->cfg.max_graph_tokens < b->max_tokens ? (int32_t)b->cfg.max_graph_tokens : b->max_tokens;
    const double t0 = cb_now();
    const size_t free0 = cb_free_bytes();
    int n = 0;
    /* room for the metadata of most steps (a block table of ~200 sequences
     * x 4096 blocks besides 8192 tokens): a step that needs more regrows
     * it, which drops every graph (they hold its address) for lazy
     * recapture */
    loom_status st = cb_meta_reserve(b, (size_t)4 << 20, err);
    for (int kt = cb_tok_bucket(CB_GRAPH_MAX_Q + 1); st == LOOM_OK && kt <= cb_tok_bucket(most); kt++) {
        const int32_t rows = cb_piece_rows(b, kt);
        cuda_plan p;
        b->warming = true; /* the launches the capture will record, nothing eager-only */
        st = cb_meta_dummy(b, rows, &p, err);
        if (st == LOOM_OK && (st = cb_upload_meta(b, &p, err)) == LOOM_OK) st = cb_record_layers(b, &p, err);
        b->warming = false;
        if (st || (st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream)))) /* not cb_sync: no step's wait */
            break;
        cb_capture_pieces(b, kt, &p);
        n += b->pieces[kt].exec != NULL;
    }
    if (st != LOOM_OK) return st;
    const size_t free1 = cb_free_bytes();
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
           "piecewise graphs: %d token buckets (%d..%d rows, %d graphs each) captured in %.2f s, %.1f MiB",
           n, CB_GRAPH_MAX_Q + 1, most, b->nlayers + 1, cb_now() - t0,
           free0 > free1 ? (double)(free0 - free1) / (1024.0 * 1024.0) : 0.0);
    return LOOM_OK;
}

/* Token bucket for a step that is to run piecewise, or -1: a step with
 * graphs on that no decode bucket took, of at most max_graph_tokens rows.
 * The LM head runs eagerly, so the logits buffers do not bound it. Not on
 * a sharded instance: its pieces would hold collectives, and the tp test's
 * bit-for-bit comparisons of graph and eager sharded steps assume
 * unpadded prefill (two GPUs are needed to measure it). */
static int cb_piece_bucket(const cuda_backend *b, const loom_batch *bt) {
    if (!b->cfg.cuda_graphs || !b->cfg.piecewise_graphs || b->cfg.batch_invariant || b->sharded ||
        bt->num_tokens > b->cfg.max_graph_tokens)
        return -1;
    return cb_tok_bucket(bt->num_tokens); /* T <= max_tokens (checked): cb_piece_rows(kt) >= T */
}

/* A step no decode graph takes: piecewise when its token bucket has (or
 * is now to get) its graphs, else eagerly. The first step of a bucket runs
 * padded and eagerly (warm-up and its logits), then the bucket is
 * captured. */
static loom_status cb_step_other(cuda_backend *b, const loom_batch *bt, float *logits,
                                 const loom_logits_topk *tk, loom_error *err) {
    cuda_plan p;
    const int kt = cb_piece_bucket(b, bt);
    const int32_t rows = kt < 0 ? 0 : cb_piece_rows(b, kt);
    loom_status st = cb_meta_build(b, bt, 0, 0, rows, &p, err);
    b->cur_path = kt >= 0 && b->pieces[kt].exec ? CB_PATH_PIECE : CB_PATH_EAGER;
    cb_mark(b, CB_PH_PREP);
    if (st || (st = cb_stage_in(b, &p, err))) return st;
    /* a failure after the metadata's copy was enqueued drains the stream
     * (cb_drain): the next step rewrites the pinned staging it reads */
    if (kt >= 0 && b->pieces[kt].exec) {
        st = cb_run_piecewise(b, &p, kt, logits, tk, bt->num_logits, err);
        return st ? cb_drain(b, st) : LOOM_OK;
    }
    if ((st = cb_run_eager(b, &p, logits, tk, bt->num_logits, err))) return cb_drain(b, st);
    if (kt >= 0 && !b->pieces[kt].tried) {
        cb_mark(b, CB_PH_OUT);
        cb_capture_pieces(b, kt, &p);
        cb_mark(b, CB_PH_CAPTURE);
    }
    return LOOM_OK;
}

/* One step: through the decode bucket's graph when it has one, else
 * cb_step_other (capturing the bucket after its first eager run). Logits
 * leave as whole rows (`logits`) or reduced (`tk`, forward_topk). */
static loom_status cb_step(cuda_backend *b, const loom_batch *bt, float *logits, const loom_logits_topk *tk,
                           loom_error *err) {
    loom_status st;
    /* the launch order is per device: another backend on it may differ */
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device))) ||
        (st = CB_CUDA(b, err, loom_cuda_set_trigger_first(b->cfg.trigger_first))))
        return st;
    cuda_plan p;
    int32_t q = 1;
    const int k = cb_graph_bucket(b, bt, &q);
    if (k < 0) return cb_step_other(b, bt, logits, tk, err);
    cuda_graph_slot *g = &b->graphs[q - 1][k];
    b->cur_path = g->exec ? CB_PATH_GRAPH : CB_PATH_EAGER;
    st = cb_meta_build(b, bt, cb_buckets[k], q, 0, &p, err);
    cb_mark(b, CB_PH_PREP);
    if (st || (st = cb_stage_in(b, &p, err))) return st;
    if (g->exec) {
        if ((st = cb_upload_meta(b, &p, err)) ||
            (st = CB_CUDA(b, err, cudaGraphLaunch(g->exec, b->stream))) ||
            (st = b->last_stage ? cb_emit_logits(b, 0, bt->num_logits, logits, tk, err) : cb_send_next(b, err)))
            return cb_drain(b, st); /* as cb_step_other */
        b->graph_replays++;
        if (b->host->metric_add) b->host->metric_add(b->host->ctx, "backend.cuda.graph_replays", 1);
        return LOOM_OK;
    }
    /* first time for this bucket: the padded step eagerly (warm-up and this
     * step's logits), then capture it for the next ones */
    if ((st = cb_run_eager(b, &p, logits, tk, bt->num_logits, err))) return cb_drain(b, st);
    if (!g->tried) {
        cb_mark(b, CB_PH_OUT);
        cb_capture(b, q, k, &p);
        cb_mark(b, CB_PH_CAPTURE);
    }
    return LOOM_OK;
}

/* cb_step, timed (cb_destroy logs host work vs waiting for the GPU). */
static loom_status cb_step_timed(cuda_backend *b, const loom_batch *bt, float *logits, const loom_logits_topk *tk,
                                 loom_error *err) {
    const double t0 = cb_now();
    /* the phase marks and GPU events only with step_split (in_step gates them) */
    b->in_step = b->cfg.step_split, b->mark_t = t0, b->cur_path = CB_PATH_EAGER;
    b->ev_started = b->ev_ended = false;
    loom_status st = cb_step(b, bt, logits, tk, err);
    cb_mark(b, CB_PH_OUT);
    b->in_step = false;
    b->step_seconds += cb_now() - t0;
    b->steps_timed++;
    b->path_steps[b->cur_path]++;
    /* the GPU's side: both events have completed (the step waited); a
     * failed query only leaves the split out (its error is cleared, so no
     * later check takes it for its own) */
    float ms = 0;
    if (st == LOOM_OK && b->ev_started && b->ev_ended) {
        if (cudaEventElapsedTime(&ms, b->ev_start, b->ev_end) != cudaSuccess) {
            (void)cudaGetLastError();
            b->ev_have_prev = false;
            return st;
        }
        b->gpu_busy[b->cur_path] += 1e-3 * ms;
        if (b->ev_have_prev) {
            if (cudaEventElapsedTime(&ms, b->ev_prev_end, b->ev_start) == cudaSuccess) b->gpu_gap[b->cur_path] += 1e-3 * ms;
            else (void)cudaGetLastError();
        }
        cudaEvent_t e = b->ev_prev_end;
        b->ev_prev_end = b->ev_end, b->ev_end = e, b->ev_have_prev = true;
    } else {
        b->ev_have_prev = false;
    }
    return st;
}

loom_status cb_forward(void *self, const loom_batch *bt, float *logits, loom_error *err) {
    cuda_backend *b = self;
    loom_status st = cb_check_batch(b, bt, logits, err);
    if (st != LOOM_OK || bt->num_tokens == 0) return st;
    return cb_step_timed(b, bt, logits, NULL, err);
}

loom_status cb_forward_topk(void *self, const loom_batch *bt, const loom_logits_topk *tk, loom_error *err) {
    cuda_backend *b = self;
    const loom_host *h = b->host;
    if (!b->last_stage) return cb_forward(self, bt, NULL, err); /* no logits here */
    if (!tk || tk->struct_size < offsetof(loom_logits_topk, allowed) || tk->k < 1 || tk->k > LOOM_LOGITS_TOPK_MAX ||
        tk->k > b->mc.vocab_size || tk->k > LOOM_CUDA_TOPK_MAX)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: forward_topk: k = %d is outside 1..%d",
                        tk ? tk->k : 0, LOOM_LOGITS_TOPK_MAX);
    /* a tensor-parallel rank given `tk` gathers the vocabulary slices into
     * logits_dev (cb_lm_head_shard) and reduces them like an unsharded one;
     * its peers run forward() with no logits buffer */
    /* the batch check wants a logits buffer: the summary arrays stand in */
    loom_status st = cb_check_batch(b, bt, tk->top_vals, err);
    if (st != LOOM_OK || bt->num_tokens == 0) return st;
    for (int32_t i = 0; i < bt->num_logits; i++)
        if (!tk->top_ids || !tk->lse || !tk->want_full || (tk->want_full[i] && !tk->full))
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "backend cuda: forward_topk: row %d: NULL summary arrays or no whole-row buffer", i);
    return cb_step_timed(b, bt, NULL, tk, err);
}
