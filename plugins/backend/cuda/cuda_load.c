/*
 * plugins/backend/cuda/cuda_load.c — the cuda backend's load(): every
 * weight to the device in the compute type, the RoPE table, and the work
 * buffers forward() will use.
 *
 * Weights stream tensor by tensor, never the whole model on the host in
 * float32: a tensor already in the compute type is copied straight from the
 * model's (often mmap'd) memory; anything else is dequantized row by row
 * through host->convert, rounded to bf16/f16 by it (or kept float32 for norms
 * and biases) into one of two pinned staging buffers by a few threads, and
 * uploaded asynchronously while the other buffer fills. Q/K/V and gate/up
 * land at their row offsets in the fused matrices, so fusing costs nothing.
 *
 * A linear weight the quantizer plans in a quantized format is quantized
 * on the host by the quantizer, checked against loom/quant.h's layout and
 * uploaded as kernels/cuda reads it (cb_upload_q); the parts of a fused
 * group (Q/K/V, gate/up) become consecutive rows of one quantized matrix.
 * A tensor-parallel rank quantizes the whole tensor and keeps its window.
 * A weight planned GGUF (the int4 quantizer's `source: gguf`) is not
 * quantized or dequantized at all: its blocks are copied from the model's
 * memory as they are (cb_upload_gguf), a group's parts of one block type
 * sharing a segment and a change of type (q4_k Q/K, q6_k V) starting the
 * next (kernels/cuda/gguf_layout.h); a rank keeps whole rows, and its
 * column window (O, down) must fall on whole blocks. q5_0 has no kernel
 * here: its blocks are rewritten on the host as the q8_0 blocks of the same
 * values as they upload (exact), and run on the q8_0 kernels.
 *
 * Which tensors there are, each tensor-parallel rank's window of each and
 * the quantizer's plans are the weight walk's (plugins/backend/common/
 * weight_walk.h, shared with the cpu backend). Every tensor and plan is
 * checked before anything is allocated; the device arena is sized exactly and
 * checked against cudaMemGetInfo first, so running out of device memory is
 * an error with numbers, not a crash half-way.
 */
#include "cuda_backend.h"
#include "weight_walk.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define CB_ALIGN 256                 /* bytes: every weight starts here       */
#define CB_STAGE_BYTES ((size_t)32 << 20) /* per pinned staging buffer       */
#define CB_MAX_THREADS 16            /* dequantizing threads                  */
#define CB_ATTN_WS_FLOATS ((size_t)4 << 20) /* split-K workspace (16 MiB)    */
/* Batch-invariant attention: tiles (= tokens) one launch's workspace holds
 * at least — a graph step of up to 64 tokens in one launch per layer;
 * larger steps take several (Llama-3-8B: 65 MiB). */
#define CB_INV_ATTN_TILES 64

static size_t cb_round(size_t n) { return (n + CB_ALIGN - 1) & ~(size_t)(CB_ALIGN - 1); }
static double cb_mib(size_t n) { return (double)n / (1024.0 * 1024.0); }

/* ------------------------------------------------------------- checking */

/* GGUF types are loom dtypes cast (gguf_layout.c checks); the cuda
 * formats are loom formats cast; a layer's groups are the weight walk's. */
_Static_assert((int)LOOM_CUDA_Q_GGUF == (int)LOOM_QFMT_GGUF &&
                   (int)LOOM_CUDA_Q_INT4 == (int)LOOM_QFMT_INT4_W4A16,
               "loom_cuda_qfmt values must be loom_qformat's");
_Static_assert((int)CB_G_QKV == (int)LOOM_WW_G_QKV && (int)CB_G_O == (int)LOOM_WW_G_O &&
                   (int)CB_G_GU == (int)LOOM_WW_G_GU && (int)CB_G_DOWN == (int)LOOM_WW_G_DOWN &&
                   (int)CB_NGROUPS == (int)LOOM_WW_NGROUPS,
               "cuda_layer.q[] is indexed by the weight walk's groups");

/* The block type a GGUF tensor has on the device: its own, but q8_0 for
 * q5_0, which the kernels do not read; cb_upload_gguf rewrites its blocks
 * (exact: same scale, codes - 16 fit int8) at 34 / 22 of the bytes. */
static loom_cuda_gguf cb_gguf_type(loom_dtype t) {
    return t == LOOM_DTYPE_Q5_0 ? LOOM_CUDA_GGUF_Q8_0 : (loom_cuda_gguf)t;
}

/* The weight walk's hook: the quantized formats this backend has kernels
 * for — INT8_W8A16, INT8_W8A8, FP8_W8A8, INT4_W4A16, and GGUF blocks as
 * stored of q4_0, q4_1, q4_k, q6_k and q8_0, and q5_0 as q8_0 (whole
 * blocks per row). */
static loom_status cb_runnable(void *ctx, const loom_quant_binding *q, const loom_tensor *t,
                               const char *name, const loom_quant_plan *plan, loom_error *err) {
    cuda_backend *b = ctx;
    switch (plan->format) {
    case LOOM_QFMT_INT8_W8A16:
    case LOOM_QFMT_INT8_W8A8:
    case LOOM_QFMT_FP8_W8A8:
    case LOOM_QFMT_INT4_W4A16:
        return LOOM_OK;
    case LOOM_QFMT_GGUF:
        /* the blocks are read as stored: their type needs a kernel here */
        if (loom_cuda_gguf_ok(cb_gguf_type(t->dtype), t->shape[1])) return LOOM_OK;
        return b->host->error(
            b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
            "backend cuda: quantizer '%s' planned GGUF blocks as stored for tensor '%s', but "
            "it is %s with %lld columns; the cuda kernels read rows of whole q4_0, q4_1, "
            "q4_k, q6_k and q8_0 blocks (q5_0 as q8_0); skip the tensor in the quantizer or "
            "use source: quantize",
            q->name ? q->name : "?", name, loom_dtype_name(t->dtype), (long long)t->shape[1]);
    default:
        return b->host->error(
            b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
            "backend cuda: quantizer '%s' planned format %s (%d) for tensor '%s', but the cuda "
            "backend has no linear kernel for it (it runs none, int8_w8a16, int8_w8a8, "
            "fp8_w8a8, int4_w4a16 and gguf)",
            q->name ? q->name : "?", loom_ww_qformat_name(plan->format), (int)plan->format, name);
    }
}

/* Formats whose activations are quantized per token, after dividing by a
 * SmoothQuant vector when the quantizer gives one. */
#define CB_SMOOTHED(f) ((f) == LOOM_QFMT_INT8_W8A8 || (f) == LOOM_QFMT_FP8_W8A8)

/* Device bytes of one quantized matrix of n rows x k columns (data, scales,
 * smooth; each region CB_ALIGN-aligned, carved in that order). */
static size_t cb_qbytes(loom_qformat f, int64_t n, int64_t k, int32_t g) {
    const size_t data = f == LOOM_QFMT_INT4_W4A16 ? (size_t)(n * (k / 2)) : (size_t)(n * k);
    const size_t sc = f == LOOM_QFMT_INT4_W4A16 ? (size_t)(n * (k / g)) * 8 : (size_t)n * 4;
    const size_t sm = CB_SMOOTHED(f) ? (size_t)k * 4 : 0;
    return cb_round(data) + cb_round(sc) + (sm ? cb_round(sm) : 0);
}

/* --------------------------------------------------------------- upload */

typedef struct cb_uploader {
    cuda_backend *b;
    uint8_t *stage[2];      /* pinned, CB_STAGE_BYTES each                 */
    cudaEvent_t done[2];    /* recorded after the upload from stage[i]      */
    bool used[2];
    int cur;
    int nthreads;
    float *rowbuf;          /* (nthreads, max_cols) dequantized rows        */
    int64_t max_cols;
} cb_uploader;

typedef struct cb_conv_job {
    const loom_host *host;
    const loom_tensor *t;
    const uint8_t *src;     /* first row of the chunk                       */
    size_t src_row_bytes;
    int64_t cols, rows;
    int64_t c0, nc;         /* columns kept of each row: [c0, c0 + nc)     */
    uint8_t *dst;           /* staging, rows of nc elements                 */
    int out;                /* 0 bf16, 1 f16, 2 f32                          */
    float *rowbuf;          /* this worker's row                            */
    int64_t r0, r1;         /* rows of the chunk this worker converts        */
    atomic_int *failed;
} cb_conv_job;

static void *cb_conv_main(void *arg) {
    cb_conv_job *j = arg;
    /* a column window (tensor-parallel row-parallel weights, bias slices)
     * dequantizes whole rows into rowbuf and keeps the window */
    const bool whole = j->c0 == 0 && j->nc == j->cols;
    for (int64_t r = j->r0; r < j->r1; r++) {
        float *f = j->out == 2 && whole ? (float *)(j->dst + (size_t)r * j->cols * 4) : j->rowbuf;
        if (j->host->convert(LOOM_DTYPE_F32, f, j->t->dtype, j->src + (size_t)r * j->src_row_bytes, j->cols) !=
            LOOM_OK) {
            atomic_store(j->failed, 1);
            return NULL;
        }
        if (j->out == 2) {
            if (!whole)
                memcpy(j->dst + (size_t)r * j->nc * 4, f + j->c0, (size_t)j->nc * 4);
            continue;
        }
        /* rounded to nearest even, as the host rounds every 16-bit float */
        if (j->host->convert(j->out == 0 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F16,
                             j->dst + (size_t)r * j->nc * 2, LOOM_DTYPE_F32, f + j->c0, j->nc) != LOOM_OK) {
            atomic_store(j->failed, 1);
            return NULL;
        }
    }
    return NULL;
}

static loom_status cb_uploader_init(cuda_backend *b, cb_uploader *u, int64_t max_cols,
                                    loom_error *err) {
    const loom_host *h = b->host;
    loom_status st;
    memset(u, 0, sizeof *u);
    u->b = b;
    int n = h->num_threads ? h->num_threads(h->ctx) : 1;
    u->nthreads = n < 1 ? 1 : n > CB_MAX_THREADS ? CB_MAX_THREADS : n;
    u->max_cols = max_cols;
    u->rowbuf = h->alloc(h->ctx, (size_t)u->nthreads * (size_t)max_cols * sizeof(float));
    if (!u->rowbuf)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory for %d "
                        "dequantization rows", u->nthreads);
    for (int i = 0; i < 2; i++) {
        if ((st = CB_CUDA(b, err, cudaHostAlloc((void **)&u->stage[i], CB_STAGE_BYTES,
                                                cudaHostAllocDefault))) ||
            (st = CB_CUDA(b, err, cudaEventCreateWithFlags(&u->done[i], cudaEventDisableTiming))))
            return st;
    }
    return LOOM_OK;
}

static void cb_uploader_free(cb_uploader *u) {
    const loom_host *h = u->b->host;
    cudaStreamSynchronize(u->b->stream);
    for (int i = 0; i < 2; i++) {
        if (u->stage[i]) cudaFreeHost(u->stage[i]);
        if (u->done[i]) cudaEventDestroy(u->done[i]);
    }
    h->free(h->ctx, u->rowbuf);
}

/* Upload tensor t (rows x cols, any dtype the host dequantizes) to dst as
 * dt (out_f32 = false) or float32, keeping columns [c0, c0 + nc) of every
 * row (0 and cols: all of it) as a dense (rows, nc) matrix. Asynchronous on
 * b->stream; the staging buffers are reused only after their previous
 * upload finished. */
static loom_status cb_upload(cb_uploader *u, const loom_tensor *t, int64_t rows, int64_t cols,
                             int64_t c0, int64_t nc, void *dst, bool out_f32, loom_error *err) {
    cuda_backend *b = u->b;
    const loom_host *h = b->host;
    loom_status st;
    const size_t oel = out_f32 ? 4 : b->elt;
    const bool same = out_f32 ? t->dtype == LOOM_DTYPE_F32 : t->dtype == b->ldt;
    const bool whole = c0 == 0 && nc == cols;
    if (same && whole) /* straight from the model's memory: pageable, staged by the driver */
        return CB_CUDA(b, err, cudaMemcpyAsync(dst, t->data, (size_t)rows * (size_t)cols * oel,
                                               cudaMemcpyHostToDevice, b->stream));
    if (same) /* a column window: one strided copy, source pitch a whole row */
        return CB_CUDA(b, err, cudaMemcpy2DAsync(dst, (size_t)nc * oel,
                                                 (const uint8_t *)t->data + (size_t)c0 * oel,
                                                 (size_t)cols * oel, (size_t)nc * oel,
                                                 (size_t)rows, cudaMemcpyHostToDevice, b->stream));
    const size_t src_row = loom_dtype_row_bytes(t->dtype, cols);
    const size_t dst_row = (size_t)nc * oel;
    const int64_t chunk_rows = (int64_t)(CB_STAGE_BYTES / dst_row);
    if (chunk_rows < 1 || cols > u->max_cols)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: tensor '%s' rows of %lld elements exceed the loader's "
                        "staging (%zu bytes)", t->name ? t->name : "?", (long long)cols,
                        (size_t)CB_STAGE_BYTES);
    atomic_int failed;
    atomic_init(&failed, 0);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        const int64_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        const int s = u->cur;
        if (u->used[s] && (st = CB_CUDA(b, err, cudaEventSynchronize(u->done[s])))) return st;
        /* convert rows [r0, r0 + n) into stage[s], spread over threads */
        int nt = u->nthreads;
        if (n < 64 * nt) nt = (int)((n + 63) / 64);
        if (nt < 1) nt = 1;
        cb_conv_job jobs[CB_MAX_THREADS];
        pthread_t tids[CB_MAX_THREADS];
        bool started[CB_MAX_THREADS] = {false};
        for (int i = 0; i < nt; i++) {
            jobs[i] = (cb_conv_job){.host = h, .t = t,
                                    .src = (const uint8_t *)t->data + (size_t)r0 * src_row,
                                    .src_row_bytes = src_row, .cols = cols, .rows = n,
                                    .c0 = c0, .nc = nc, .dst = u->stage[s],
                                    .out = out_f32 ? 2 : (b->dt == LOOM_CUDA_F16 ? 1 : 0),
                                    .rowbuf = u->rowbuf + (size_t)i * (size_t)u->max_cols,
                                    .r0 = n * i / nt, .r1 = n * (i + 1) / nt, .failed = &failed};
            if (i > 0) started[i] = pthread_create(&tids[i], NULL, cb_conv_main, &jobs[i]) == 0;
        }
        for (int i = 1; i < nt; i++)
            if (!started[i]) cb_conv_main(&jobs[i]); /* no thread: do it here */
        cb_conv_main(&jobs[0]);
        for (int i = 1; i < nt; i++)
            if (started[i]) pthread_join(tids[i], NULL);
        if (atomic_load(&failed))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cuda: cannot dequantize tensor '%s' of type %s; the host's "
                            "dequantizer does not handle it",
                            t->name ? t->name : "?", loom_dtype_name(t->dtype));
        if ((st = CB_CUDA(b, err, cudaMemcpyAsync((uint8_t *)dst + (size_t)r0 * dst_row,
                                                  u->stage[s], (size_t)n * dst_row,
                                                  cudaMemcpyHostToDevice, b->stream))) ||
            (st = CB_CUDA(b, err, cudaEventRecord(u->done[s], b->stream))))
            return st;
        u->used[s] = true;
        u->cur ^= 1;
    }
    return LOOM_OK;
}

/* Upload the part {rows [r0, r0 + nr), columns [c0, c0 + nc)} of t — a
 * (rows, cols) matrix, or a 1-D tensor as one row — to dst as a dense
 * (nr, nc) matrix. The whole tensor is (0, rows, 0, cols); a tensor-parallel
 * shard cuts rows (column-parallel weights: a view starting at row r0) or
 * columns (row-parallel weights and bias slices). Nothing for an empty part. */
static loom_status cb_upload_part(cb_uploader *u, const loom_tensor *t, int64_t r0, int64_t nr,
                                  int64_t c0, int64_t nc, void *dst, bool out_f32,
                                  loom_error *err) {
    if (nr <= 0 || nc <= 0) return LOOM_OK;
    const int64_t cols = t->shape[t->ndim - 1];
    const size_t row_bytes = loom_dtype_row_bytes(t->dtype, cols);
    loom_tensor v = *t;
    v.data = (uint8_t *)t->data + (size_t)r0 * row_bytes;
    v.nbytes = (size_t)nr * row_bytes;
    if (v.ndim > 1) v.shape[0] = nr;
    return cb_upload(u, &v, nr, cols, c0, nc, dst, out_f32, err);
}

/* The weight walk's window p of its tensor, as cb_upload_part. */
static loom_status cb_upload_win(cb_uploader *u, const loom_ww_part *p, void *dst, bool out_f32,
                                 loom_error *err) {
    return cb_upload_part(u, p->t, p->r0, p->nr, p->c0, p->nc, dst, out_f32, err);
}

/* ------------------------------------------------------ quantized upload */

/* Is t a host tensor of `dtype` with at least `count` elements? */
static bool cb_qis(const loom_tensor *t, loom_dtype dtype, int64_t count) {
    return t->data && t->device == LOOM_DEVICE_HOST && t->dtype == dtype &&
           loom_tensor_numel(t) >= count &&
           t->nbytes >= (size_t)count * loom_dtype_block_bytes(dtype);
}

/* Why quantized tensor qt does not have the layout loom/quant.h promises
 * for `plan` and a (rows, cols) weight, or why[0] = 0 when it does. */
static void cb_qlayout_why(const loom_qtensor *qt, const loom_quant_plan *plan, int64_t rows,
                           int64_t cols, char *why, size_t size) {
    const loom_qformat f = plan->format;
    why[0] = 0;
    const int32_t g = f == LOOM_QFMT_INT4_W4A16 ? qt->group_size : 1;
    const int64_t ns = loom_tensor_numel(&qt->scales);
    if (qt->format != f || qt->rows != rows || qt->cols != cols)
        snprintf(why, size, "format %s shape (%lld, %lld), expected %s (%lld, %lld)",
                 loom_ww_qformat_name(qt->format), (long long)qt->rows, (long long)qt->cols,
                 loom_ww_qformat_name(f), (long long)rows, (long long)cols);
    else if ((f == LOOM_QFMT_INT8_W8A16 || f == LOOM_QFMT_INT8_W8A8) &&
             (!cb_qis(&qt->data, LOOM_DTYPE_I8, rows * cols) ||
              !cb_qis(&qt->scales, LOOM_DTYPE_F32, rows)))
        snprintf(why, size, "int8 data (%lld, %lld) and f32 scales (%lld) expected",
                 (long long)rows, (long long)cols, (long long)rows);
    else if (f == LOOM_QFMT_FP8_W8A8 &&
             (!cb_qis(&qt->data, LOOM_DTYPE_FP8_E4M3, rows * cols) || !(ns == rows || ns == 1) ||
              !cb_qis(&qt->scales, LOOM_DTYPE_F32, ns)))
        snprintf(why, size, "fp8_e4m3 data (%lld, %lld) and f32 scales (%lld) or (1) "
                 "expected", (long long)rows, (long long)cols, (long long)rows);
    else if (f == LOOM_QFMT_INT4_W4A16 &&
             (g != plan->group_size || g < 2 || cols % g ||
              !cb_qis(&qt->data, LOOM_DTYPE_U8, rows * (cols / 2)) ||
              !cb_qis(&qt->scales, LOOM_DTYPE_F32, rows * (cols / g)) ||
              !cb_qis(&qt->zeros, LOOM_DTYPE_F32, rows * (cols / g))))
        snprintf(why, size, "u8 data (%lld, %lld), f32 scales and zeros (%lld, %lld / %d) "
                 "with group_size %d expected (got group_size %d)", (long long)rows,
                 (long long)(cols / 2), (long long)rows, (long long)cols, plan->group_size,
                 plan->group_size, g);
    else if (CB_SMOOTHED(f) && qt->smooth.data &&
             !cb_qis(&qt->smooth, LOOM_DTYPE_F32, cols))
        snprintf(why, size, "smooth must be f32 (%lld)", (long long)cols);
}

/* One part of a quantized group: quantize p's tensor (rows, cols) on the
 * host through the quantizer, check the layout it gave (loom/quant.h), and
 * upload p's window, rows [r0, r0 + nr) x columns [c0, c0 + nc), into rows
 * [row_off, row_off + nr) of the group's device matrix `dst` (dst->K ==
 * nc): the data as is, FP8 per-tensor scales expanded to every row, INT4
 * {scale, zero} repacked as {s, -zero * s} (loom_cuda_qweight). The
 * quantizer's tensor is released once the copies have left host memory.
 * W8A8 SmoothQuant vectors: the group's first part uploads its columns
 * into dst->smooth and keeps a host copy in *smooth_ref; later parts must
 * carry the same vector (one activation quantization serves the group). */
/* quant_layout tiled: repack a fully uploaded W8A16 / INT4 weight into
 * qtiled.cu's tiles in place (loom_cuda_qweight_tile: a temporary device
 * copy of its codes while it runs); shapes that do not tile keep their rows
 * (and so do the other weights of their layer: cb_layer_tiles). */
static bool cb_tiled_fmt(const loom_cuda_qweight *q) {
    return q->fmt == LOOM_CUDA_Q_INT8_W8A16 || q->fmt == LOOM_CUDA_Q_INT4;
}

static loom_status cb_tile_q(cuda_backend *b, loom_cuda_qweight *q, loom_error *err) {
    if (b->cfg.quant_layout != 1 || !cb_tiled_fmt(q) || !loom_cuda_qweight_tileable(q))
        return LOOM_OK;
    return CB_CUDA(b, err, loom_cuda_qweight_tile(q, b->dt, b->stream));
}

/* A decoder layer's W8A16 / INT4 weights tile all together or not at all:
 * in a layer of mixed layouts (SmolLM2's K = 576 keeps QKV, O and gate|up
 * on rows while its down projection would tile) the row-layout GEMVs lose
 * their fused SwiGLU to one tiled matrix (cb_swiglu_fuses). */
static bool cb_layer_tiles(const loom_cuda_qweight *q, int n) {
    for (int gi = 0; gi < n; gi++)
        if (cb_tiled_fmt(&q[gi]) && !loom_cuda_qweight_tileable(&q[gi]))
            return false;
    return true;
}

static loom_status cb_upload_q(cuda_backend *b, const loom_model_view *m,
                               const loom_quant_binding *qb, const loom_ww_part *p,
                               const loom_quant_plan *plan, const loom_cuda_qweight *dst,
                               int64_t row_off, bool first_part, float **smooth_ref,
                               loom_error *err) {
    const loom_host *h = b->host;
    const loom_tensor *t = p->t;
    const char *name = p->name;
    const int64_t r0 = p->r0, nr = p->nr, c0 = p->c0, nc = p->nc;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const loom_qformat f = plan->format;
    const char *qn = qb->name ? qb->name : "?";
    loom_qtensor q = {.struct_size = sizeof q};
    float *tmp = NULL;
    char why[200] = "";
    loom_status st = qb->ops->quantize(qb->self, m, t, plan, &q, err);
    if (st != LOOM_OK) return st;
    /* the layout loom/quant.h promises, for the rows and columns we read */
    cb_qlayout_why(&q, plan, rows, cols, why, sizeof why);
    const int32_t g = f == LOOM_QFMT_INT4_W4A16 ? q.group_size : 1;
    const int64_t ns = loom_tensor_numel(&q.scales);
    if (why[0]) {
        st = h->error(h->ctx, err, LOOM_ERR_FORMAT,
                      "backend cuda: quantizer '%s' gave tensor '%s' a layout the kernels cannot "
                      "read: %s", qn, name, why);
        goto out;
    }
    /* data: a strided window, one 2-D copy (pageable source: staged before
     * the call returns) */
    {
        const bool i4 = f == LOOM_QFMT_INT4_W4A16;
        const size_t src_pitch = i4 ? (size_t)cols / 2 : (size_t)cols;
        const size_t width = i4 ? (size_t)nc / 2 : (size_t)nc;
        const size_t col0 = i4 ? (size_t)c0 / 2 : (size_t)c0;
        uint8_t *d = (uint8_t *)dst->data + (size_t)row_off * width;
        if ((st = CB_CUDA(b, err, cudaMemcpy2DAsync(d, width,
                                                    (const uint8_t *)q.data.data +
                                                        (size_t)r0 * src_pitch + col0,
                                                    src_pitch, width, (size_t)nr,
                                                    cudaMemcpyHostToDevice, b->stream))))
            goto out;
        /* scales */
        const int64_t gl = i4 ? nc / g : 1; /* groups per kept row */
        const size_t tmp_floats = i4 ? (size_t)(nr * gl) * 2 : (size_t)nr;
        tmp = h->alloc(h->ctx, tmp_floats * sizeof(float));
        if (!tmp) {
            st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory for the "
                          "scales of '%s'", name);
            goto out;
        }
        const float *sc = q.scales.data, *z = q.zeros.data;
        if (i4) {
            const int64_t gr = cols / g; /* groups per whole row */
            for (int64_t r = 0; r < nr; r++)
                for (int64_t i = 0; i < gl; i++) {
                    const size_t k = (size_t)((r0 + r) * gr + c0 / g + i);
                    tmp[(size_t)(r * gl + i) * 2] = sc[k];
                    tmp[(size_t)(r * gl + i) * 2 + 1] = -(z[k] * sc[k]);
                }
        } else {
            for (int64_t r = 0; r < nr; r++) tmp[r] = ns == 1 ? sc[0] : sc[r0 + r];
        }
        if ((st = CB_CUDA(b, err, cudaMemcpyAsync((float *)dst->scales +
                                                      (size_t)row_off * (i4 ? (size_t)gl * 2 : 1),
                                                  tmp, tmp_floats * sizeof(float),
                                                  cudaMemcpyHostToDevice, b->stream))))
            goto out;
    }
    /* SmoothQuant vector (int8 W8A8, fp8) */
    if (CB_SMOOTHED(f)) {
        const float *sm = q.smooth.data ? (const float *)q.smooth.data + c0 : NULL;
        if (first_part && sm) {
            *smooth_ref = h->alloc(h->ctx, (size_t)nc * sizeof(float));
            if (!*smooth_ref) {
                st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
                goto out;
            }
            memcpy(*smooth_ref, sm, (size_t)nc * sizeof(float));
            if ((st = CB_CUDA(b, err, cudaMemcpyAsync((void *)dst->smooth, sm,
                                                      (size_t)nc * sizeof(float),
                                                      cudaMemcpyHostToDevice, b->stream))))
                goto out;
        } else if (!first_part && ((sm != NULL) != (*smooth_ref != NULL) ||
                                   (sm && memcmp(sm, *smooth_ref, (size_t)nc * sizeof(float))))) {
            st = h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                          "backend cuda: tensor '%s' has a SmoothQuant vector different from the "
                          "other parts of its fused projection (Q/K/V or gate/up share one "
                          "activation quantization here); calibrate them with one vector",
                          name);
            goto out;
        }
    }
    /* the copies above may still read q and tmp until they are staged */
    st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
out:
    h->free(h->ctx, tmp);
    qb->ops->release(qb->self, &q);
    return st;
}

/* ----------------------------------------------------- GGUF as stored */

/* Rows [r0, r0 + nr) x columns [c0, c0 + nc) of q5_0 tensor t (rows of
 * `pitch` bytes) to dst as dense q8_0 rows of `width` bytes: rewritten on
 * the host (loom_cuda_q5_0_rows_as_q8_0) a staging buffer at a time, each
 * uploaded before the buffer is refilled. */
static loom_status cb_upload_q5_0(cuda_backend *b, const loom_tensor *t, int64_t r0, int64_t nr, int64_t c0,
                                  int64_t nc, size_t pitch, void *dst, size_t width, loom_error *err) {
    const loom_host *h = b->host;
    const int64_t cols = t->shape[1];
    int64_t chunk = (int64_t)(CB_STAGE_BYTES / width);
    chunk = chunk < 1 ? 1 : chunk > nr ? nr : chunk;
    uint8_t *buf = h->alloc(h->ctx, (size_t)chunk * width);
    if (!buf)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory rewriting q5_0 tensor "
                        "'%s' as q8_0", t->name ? t->name : "?");
    loom_status st = LOOM_OK;
    for (int64_t r = 0; r < nr && !st; r += chunk) {
        const int64_t n = nr - r < chunk ? nr - r : chunk;
        char why[160] = "";
        if (!loom_cuda_q5_0_rows_as_q8_0((const uint8_t *)t->data + (size_t)(r0 + r) * pitch, pitch, cols, n, c0, nc,
                                         buf, why, sizeof why)) {
            st = h->error(h->ctx, err, LOOM_ERR_FORMAT, "backend cuda: q5_0 tensor '%s': %s", t->name ? t->name : "?",
                          why);
            break;
        }
        if (!(st = CB_CUDA(b, err, cudaMemcpyAsync((uint8_t *)dst + (size_t)r * width, buf, (size_t)n * width,
                                                   cudaMemcpyHostToDevice, b->stream))))
            st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    }
    h->free(h->ctx, buf);
    return st;
}

/* p's window, rows [r0, r0 + nr) x columns [c0, c0 + nc) of a GGUF
 * tensor, to dst as a dense (nr, row_bytes(nc)) block matrix: one 2-D copy
 * straight from the model's (mmap'd) memory, the blocks byte for byte
 * (q5_0: rewritten as q8_0, cb_upload_q5_0). The window was checked at
 * planning (cb_gguf_group); checked again here because the copy trusts it. */
static loom_status cb_upload_gguf(cuda_backend *b, const loom_ww_part *p, void *dst, loom_error *err) {
    const loom_tensor *t = p->t;
    const char *name = p->name;
    const int64_t r0 = p->r0, nr = p->nr, c0 = p->c0, nc = p->nc;
    if (nr <= 0) return LOOM_OK;
    const loom_cuda_gguf ty = cb_gguf_type(t->dtype);
    const int64_t cols = t->shape[1];
    const size_t pitch = loom_dtype_row_bytes(t->dtype, cols); /* as stored */
    size_t src_off = 0, width = 0;
    char why[160] = "";
    if (!loom_cuda_gguf_window(ty, cols, c0, nc, &src_off, &width, why, sizeof why) || !t->data ||
        pitch == 0 || t->nbytes < (size_t)(r0 + nr) * pitch)
        return b->host->error(b->host->ctx, err, LOOM_ERR_FORMAT,
                              "backend cuda: GGUF tensor '%s' (%s, %zu bytes): cannot copy rows "
                              "[%lld, %lld) x columns [%lld, %lld) as stored%s%s",
                              name, loom_dtype_name(t->dtype), t->nbytes, (long long)r0,
                              (long long)(r0 + nr), (long long)c0, (long long)(c0 + nc),
                              why[0] ? ": " : "", why);
    if (t->dtype == LOOM_DTYPE_Q5_0) return cb_upload_q5_0(b, t, r0, nr, c0, nc, pitch, dst, width, err);
    return CB_CUDA(b, err, cudaMemcpy2DAsync(dst, width,
                                             (const uint8_t *)t->data + (size_t)r0 * pitch + src_off,
                                             pitch, width, (size_t)nr, cudaMemcpyHostToDevice,
                                             b->stream));
}

/* The device weight of a GGUF group laid out as `lay` at `base`: N rows,
 * K columns, one segment per run of one block type. */
static loom_cuda_qweight cb_gguf_qweight(const loom_cuda_gguf_layout *lay, void *base, int64_t n,
                                         int64_t k) {
    loom_cuda_qweight w = {.fmt = LOOM_CUDA_Q_GGUF, .N = (int)n, .K = (int)k, .data = base,
                           .nseg = lay->nseg};
    for (int i = 0; i < lay->nseg; i++)
        w.seg[i] = (loom_cuda_qseg){.type = lay->seg[i].type, .rows = (int)lay->seg[i].rows,
                                    .data = (const uint8_t *)base + lay->seg[i].offset};
    return w;
}

/* ----------------------------------------------------------------- RoPE */

/* Rotary frequencies, float64 — the same formula as kernels/cpu/rope.c
 * (Hugging Face's default, linear and llama3 rope_type), so both backends
 * rotate by identical angles. */
static void cb_rope_inv_freq(double *inv_freq, const loom_model_config *c, bool local) {
    const int32_t hd = c->head_dim, half = hd / 2;
    const double theta = local ? c->rope_theta_local : c->rope_theta, factor = local ? 0 : c->rope_factor;
    for (int32_t i = 0; i < half; i++) {
        double f = pow(theta, -(double)(2 * i) / (double)hd);
        if (c->rope_scaling == LOOM_ROPE_SCALING_LINEAR && factor > 0) {
            f /= factor;
        } else if (c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3 && factor > 0) {
            double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double octx = c->rope_original_context;
            double low_freq_wavelen = octx / lo, high_freq_wavelen = octx / hi;
            double wavelen = 2.0 * M_PI / f;
            double scaled = wavelen > low_freq_wavelen ? f / factor : f;
            bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            if (medium) {
                double smooth = (octx / wavelen - lo) / (hi - lo);
                scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
            }
            f = scaled;
        }
        inv_freq[i] = f;
    }
}

/* One cos/sin table of max_pos positions into *cs: the model's, or
 * (local) its sliding-window layers' — their own base, unscaled, as the
 * cpu backend's (cpu_load_done). */
static loom_status cb_rope_table(cuda_backend *b, int64_t max_pos, bool local, float **cs, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    loom_status st;
    const int half = c->head_dim / 2;
    double *inv = h->alloc(h->ctx, (size_t)half * sizeof(double));
    double *inv_dev = NULL;
    if (!inv) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
    cb_rope_inv_freq(inv, c, local);
    if (!(st = CB_CUDA(b, err, cudaMalloc((void **)cs, (size_t)max_pos * half * 2 * sizeof(float)))) &&
        !(st = CB_CUDA(b, err, cudaMalloc((void **)&inv_dev, (size_t)half * sizeof(double)))) &&
        !(st = CB_CUDA(b, err, cudaMemcpyAsync(inv_dev, inv, (size_t)half * sizeof(double),
                                               cudaMemcpyHostToDevice, b->stream))) &&
        !(st = CB_CUDA(b, err, loom_cuda_rope_table(*cs, inv_dev, (int)max_pos, half, b->stream))))
        st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    cudaFree(inv_dev);
    h->free(h->ctx, inv);
    return st;
}

static loom_status cb_rope_init(cuda_backend *b, loom_error *err) {
    const loom_model_config *c = &b->mc;
    loom_status st;
    int64_t max_pos = b->cfg.max_positions > 0 ? b->cfg.max_positions : c->max_context;
    if (max_pos <= 0) max_pos = 8192;
    if ((st = cb_rope_table(b, max_pos, false, &b->rope_cs, err)) ||
        (c->sliding_window > 0 && (st = cb_rope_table(b, max_pos, true, &b->rope_cs_local, err))))
        return st;
    b->rope_max_pos = (int32_t)max_pos;
    return LOOM_OK;
}

/* ---------------------------------------------------------- work buffers */

#define CB_WORK_BUFS 17

/* forward_topk's mask staging: a chunk's rows of bits, then its flags. */
static size_t cb_mask_bytes(const cuda_backend *b) {
    return (size_t)b->logits_rows * ((size_t)b->mask_words * 4 + 1);
}

static loom_status cb_work_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    loom_status st;
    const size_t MT = (size_t)b->cfg.max_batched_tokens, H = (size_t)c->hidden_size;
    const size_t I = (size_t)c->intermediate_size, V = (size_t)c->vocab_size, e = b->elt;
    b->max_tokens = (int32_t)MT;
    b->logits_rows = cb_logits_rows(&b->cfg);
    b->mask_words = (int32_t)((c->vocab_size + 31) / 32);
    const size_t LR = (size_t)b->logits_rows;
    /* sharded: this rank's logits slice and every rank's, gathered (empty,
     * so the layout is unchanged, otherwise) */
    const size_t VP = b->sharded ? (size_t)b->vocab_pad : 0;
    const size_t NR = b->sharded ? (size_t)b->comm.size : 0;
    const size_t TK = LOOM_CUDA_TOPK_MAX;
    size_t attn_ws = CB_ATTN_WS_FLOATS;
    if (b->cfg.batch_invariant) {
        const size_t per_tile = loom_cuda_attn_invariant_ws_floats(c->num_heads, c->num_kv_heads, c->head_dim);
        const size_t want = per_tile * (MT < CB_INV_ATTN_TILES ? MT : CB_INV_ATTN_TILES);
        if (want > attn_ws) attn_ws = want;
    }
    /* the last: quantized-GEMM scratch (0 without quantized weights) */
    size_t sz[CB_WORK_BUFS] = {MT * H * 4,      MT * H * e,  MT * (size_t)b->qkv_rows * e,
                     MT * (size_t)b->q_dim * e, MT * H * e, MT * 2 * I * e, MT * I * e,
                     LR * H * e,      LR * V * 4,  attn_ws * 4,
                     MT * (size_t)c->num_kv_heads * sizeof(int), LR * VP * 4, NR * LR * VP * 4,
                     LR * (2 * TK + 1) * 4,
                     loom_cuda_topk_ws_bytes((int)LR, (int)V, (int)TK), cb_mask_bytes(b), b->qscratch_bytes};
    size_t total = 0;
    for (int i = 0; i < CB_WORK_BUFS; i++) total += cb_round(sz[i]);
    size_t free_b = 0, tot = 0;
    if ((st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &tot)))) return st;
    if (total > free_b)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cuda: work buffers for max_batched_tokens = %lld need %.1f MiB "
                        "(%.1f MiB of it quantized-GEMM scratch), device %d has %.1f MiB free "
                        "after the weights; lower the backend's max_batched_tokens (and "
                        "scheduler.max_batched_tokens with it)",
                        (long long)MT, cb_mib(total), cb_mib(b->qscratch_bytes), b->device,
                        cb_mib(free_b));
    if ((st = CB_CUDA(b, err, cudaMalloc(&b->work, total)))) return st;
    uint8_t *p = b->work;
    void **dst[CB_WORK_BUFS] = {(void **)&b->x, &b->xn, &b->qkv, &b->att, &b->r, &b->gu, &b->act, &b->xs,
                      (void **)&b->logits_dev, (void **)&b->attn_ws, (void **)&b->attn_sem,
                      (void **)&b->logits_local, (void **)&b->logits_gathered,
                      (void **)&b->topk_dev, &b->topk_ws, (void **)&b->mask_dev, &b->qscratch};
    for (int i = 0; i < CB_WORK_BUFS; i++) {
        *dst[i] = p;
        p += cb_round(sz[i]);
    }
    if (!b->sharded) b->logits_local = b->logits_gathered = NULL;
    if (!b->qscratch_bytes) b->qscratch = NULL;
    /* the split-K counters start at zero; the attention kernel leaves them so */
    if ((st = CB_CUDA(b, err, cudaMemsetAsync(b->attn_sem, 0, sz[10], b->stream))) ||
        (st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream))))
        return st;
    b->attn_ws_floats = attn_ws;
    for (int k = 0; k < 2; k++) {
        int per_sm = loom_cuda_attn_ctas_per_sm(b->dt, LOOM_CUDA_KV_DT, (loom_cuda_attn_shape)k, c->head_dim);
        b->attn_resident[k] = (per_sm > 0 ? per_sm : 1) * b->num_sms;
    }
    if ((st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->logits_host, LR * V * 4,
                                            cudaHostAllocDefault))) ||
        (st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->topk_host, LR * (2 * TK + 1) * 4,
                                            cudaHostAllocDefault))) ||
        (st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->mask_host, cb_mask_bytes(b), cudaHostAllocDefault))))
        return st;
    /* metadata starts at 1 MiB and grows with the batch (cuda_forward.c) */
    b->meta_cap = (size_t)1 << 20;
    if ((st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->meta_host, b->meta_cap,
                                            cudaHostAllocDefault))) ||
        (st = CB_CUDA(b, err, cudaMalloc((void **)&b->meta_dev, b->meta_cap))))
        return st;
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "work buffers: %.1f MiB for %lld tokens/step",
           cb_mib(total), (long long)MT);
    return LOOM_OK;
}

/* ------------------------------------------------------------------ load */

/* Layer l's group gi (parts [first, end) of the walk's lin[]), planned
 * GGUF: each part's block type (its tensor's), this rank's rows of it and
 * its input columns [c0, c0 + k) — checked (a kernel for the type, a
 * column window on whole blocks) and laid out as one device allocation
 * into *lay. Parts of different block types are fine (one segment each),
 * as the cpu backend runs them; a window that cuts blocks is refused. */
static loom_status cb_gguf_group(cuda_backend *b, const loom_ww *w, int32_t l, int gi, bool sharded,
                                 loom_cuda_gguf_layout *lay, loom_error *err) {
    const loom_host *h = b->host;
    const loom_ww_group *g = &w->group[gi];
    loom_cuda_gguf types[LOOM_CUDA_QSEG_MAX];
    int64_t rows[LOOM_CUDA_QSEG_MAX];
    char why[200];
    for (int k = g->first; k < g->end; k++) {
        const loom_ww_part *p = &w->layer[l].lin[k].w;
        const loom_tensor *t = p->t;
        types[k - g->first] = cb_gguf_type(t->dtype);
        rows[k - g->first] = p->nr;
        size_t so, wd;
        if (!loom_cuda_gguf_window(types[k - g->first], t->shape[1], p->c0, g->k, &so, &wd, why,
                                   sizeof why))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cuda: tensor '%s' (%s blocks as stored) cannot be split "
                            "here: this %s keeps input columns [%lld, %lld): %s; use a "
                            "tensor-parallel size whose share of the %lld columns is whole "
                            "blocks of %d, or quantizer source: quantize",
                            p->name, loom_dtype_name(t->dtype), sharded ? "rank" : "model",
                            (long long)p->c0, (long long)(p->c0 + g->k), why,
                            (long long)t->shape[1], loom_cuda_gguf_block_elems(types[k - g->first]));
    }
    if (!loom_cuda_gguf_plan_group(types, rows, g->end - g->first, g->k, lay, why, sizeof why))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: layer %d: the GGUF parts 'blk.%d.%s' .. '%s' cannot run "
                        "as stored: %s",
                        l, l, loom_ww_lin_name(g->first), loom_ww_lin_name(g->end - 1), why);
    return LOOM_OK;
}

/* Layer l's groups as this backend runs them, one GEMM each: one format
 * (and group size) for all the parts of a group; a GGUF group laid out
 * into glay[gi]; a quantized group within the kernels' shape contract. */
static loom_status cb_check_layer(cuda_backend *b, const loom_ww *w, int32_t l, bool sharded,
                                  loom_cuda_gguf_layout *glay, loom_error *err) {
    const loom_host *h = b->host;
    const loom_ww_layer *wl = &w->layer[l];
    loom_status st;
    for (int gi = 0; gi < CB_NGROUPS; gi++) {
        const loom_ww_group *g = &w->group[gi];
        const loom_quant_plan *p0 = &wl->lin[g->first].plan;
        for (int k = g->first + 1; k < g->end; k++) {
            const loom_quant_plan *pk = &wl->lin[k].plan;
            if (pk->format != p0->format ||
                (p0->format == LOOM_QFMT_INT4_W4A16 && pk->group_size != p0->group_size))
                return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                                "backend cuda: layer %d: tensor 'blk.%d.%s.weight' is planned "
                                "%s (group %d) but 'blk.%d.%s.weight' %s (group %d); the cuda "
                                "backend runs Q/K/V and gate/up as one fused GEMM each, so "
                                "their parts need one format: skip all of a group in the "
                                "quantizer or none (e.g. skip: \"attn_q,attn_k,attn_v\")",
                                l, l, loom_ww_lin_name(g->first), loom_ww_qformat_name(p0->format),
                                p0->group_size, l, loom_ww_lin_name(k), loom_ww_qformat_name(pk->format),
                                pk->group_size);
        }
        if (p0->format == LOOM_QFMT_NONE) continue;
        if (p0->format == LOOM_QFMT_GGUF) {
            if ((st = cb_gguf_group(b, w, l, gi, sharded, &glay[gi], err))) return st;
            continue;
        }
        const int32_t gs = p0->format == LOOM_QFMT_INT4_W4A16 ? p0->group_size : 0;
        const int64_t c0 = wl->lin[g->first].w.c0;
        if (!loom_cuda_qweight_ok((loom_cuda_qfmt)p0->format, (int)g->k, gs) || (gs > 0 && c0 % gs != 0))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cuda: tensor 'blk.%d.%s.weight' planned %s: the cuda "
                            "kernels need %s, and this %s keeps %lld input columns from column "
                            "%lld; %s",
                            l, loom_ww_lin_name(g->first), loom_ww_qformat_name(p0->format),
                            gs ? "group_size a multiple of 32 dividing the input columns"
                               : "input columns a multiple of 16",
                            sharded ? "rank" : "model", (long long)g->k, (long long)c0,
                            gs ? "pick group_size 32, 64 or 128 (one that divides it), or fewer "
                                 "ranks"
                               : "skip the tensor in the quantizer");
    }
    return LOOM_OK;
}

/* The LM head's quantized plan as the kernels run it: GGUF blocks laid out
 * into *lay (this rank's vocabulary rows, zero rows up to vocab_pad), any
 * other format within the kernels' shape contract. */
static loom_status cb_check_lm(cuda_backend *b, const loom_ww *w, loom_cuda_gguf_layout *lay,
                               loom_error *err) {
    const loom_host *h = b->host;
    const loom_quant_plan *p = &w->out_plan;
    const int64_t H = w->hidden, Vp = w->shard.vocab_pad;
    if (!w->out.t || p->format == LOOM_QFMT_NONE) return LOOM_OK;
    if (p->format == LOOM_QFMT_GGUF) {
        const loom_cuda_gguf ty = cb_gguf_type(w->out.t->dtype);
        char why[160];
        if (!loom_cuda_gguf_plan_group(&ty, &Vp, 1, H, lay, why, sizeof why))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cuda: output.weight as stored: %s", why);
        return LOOM_OK;
    }
    if (!loom_cuda_qweight_ok((loom_cuda_qfmt)p->format, (int)H,
                              p->format == LOOM_QFMT_INT4_W4A16 ? p->group_size : 0))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: output.weight planned %s, but the cuda kernels need hidden "
                        "size %lld to be a multiple of 16 (int4: of a group_size that is a "
                        "multiple of 32); keep output in the quantizer's skip list",
                        loom_ww_qformat_name(p->format), (long long)H);
    return LOOM_OK;
}

/* Does this instance hold the embedding table? The first stage looks
 * tokens up in it; the last uses it as a tied LM head. A middle stage (or a
 * last one with its own LM head) does not. */
static bool cb_keeps_embed(const cuda_backend *b, const loom_ww *w) {
    return b->first_stage || (b->last_stage && !w->out.t);
}

/* Device bytes of a layer's QK-norm and post-norm weights (f32). */
static size_t cb_norms_bytes(const cuda_backend *b, const loom_ww *w) {
    const size_t D = (size_t)b->mc.head_dim, H = (size_t)w->hidden;
    return (b->mc.qk_norm ? 2 * cb_round(D * 4) : 0) + (b->mc.post_norms ? 2 * cb_round(H * 4) : 0);
}

/* ------------------------------------------------- mixture of experts */

/* This rank's experts and shared-expert columns, as the walk split them
 * (loom_ww_collect: the whole model's without a communicator), within what
 * the kernels take. */
static loom_status cb_moe_split(cuda_backend *b, const loom_ww *w, loom_error *err) {
    const loom_model_config *c = &b->mc;
    b->moe_e0 = w->expert0, b->moe_el = w->experts, b->moe_sh = (int32_t)w->shexp_rows;
    if (c->num_experts > 0 && (b->moe_el < 1 || b->moe_sh % 8 != 0))
        return b->host->error(b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                              "backend cuda: model '%s' over %d ranks leaves %d experts and %d shared-expert "
                              "columns a rank; the cuda kernels need at least one expert and a multiple of 8 "
                              "columns: pick a rank count that keeps shared width / ranks a multiple of 8",
                              c->name, w->shard.size, b->moe_el, b->moe_sh);
    return LOOM_OK;
}

/* Is group gi replaced by the experts (its dense matrix absent)? */
static bool cb_moe_group(const cuda_backend *b, int gi) {
    return b->mc.num_experts > 0 && (gi == CB_G_GU || gi == CB_G_DOWN);
}

/* A routed expert matrix's quantized shape under plan p: gate|up (gu:
 * (2I, hidden) per expert, gate then up) or down ((hidden, I)). */
static loom_cuda_qweight cb_moe_qshape(const cuda_backend *b, const loom_quant_plan *p, bool gu) {
    const int H = b->mc.hidden_size, I = b->mc.expert_intermediate_size;
    return (loom_cuda_qweight){.fmt = (loom_cuda_qfmt)p->format, .N = gu ? 2 * I : H, .K = gu ? H : I,
                               .group = p->format == LOOM_QFMT_INT4_W4A16 ? p->group_size : 0};
}

/* Device bytes of E experts' stacked quantized matrices of shape q (data,
 * scales, and for W8A8 / FP8 a SmoothQuant slot cb_upload_q may fill). */
static size_t cb_moe_qstack_bytes(size_t E, const loom_cuda_qweight *q) {
    return cb_round(E * loom_cuda_moe_qdata_bytes(q)) + cb_round(E * loom_cuda_moe_qscale_floats(q) * 4) +
           (CB_SMOOTHED((loom_qformat)q->fmt) ? cb_round((size_t)q->K * 4) : 0);
}

/* Device bytes of one layer's router, this rank's routed experts and its
 * slice of the shared expert, as cb_carve_moe carves them (0 for a dense
 * model); *qbytes: the quantized ones among them. */
static size_t cb_moe_bytes(const cuda_backend *b, const loom_ww_layer *wl, size_t *qbytes) {
    const loom_model_config *c = &b->mc;
    *qbytes = 0;
    if (c->num_experts <= 0) return 0;
    const size_t E = (size_t)b->moe_el, H = (size_t)c->hidden_size, I = (size_t)c->expert_intermediate_size;
    const size_t S = (size_t)b->moe_sh, e = b->elt;
    size_t n = cb_round((size_t)c->num_experts * H * e); /* the router, whole */
    for (int k = 0; k < 3; k += 2) { /* gate|up (plans 0 and 1 agree), down */
        const loom_quant_plan *p = &wl->exps_plan[k];
        if (p->format == LOOM_QFMT_NONE) {
            n += cb_round(E * (k ? H * I : 2 * I * H) * e);
        } else {
            const loom_cuda_qweight q = cb_moe_qshape(b, p, k == 0);
            *qbytes += cb_moe_qstack_bytes(E, &q);
        }
    }
    if (S) {
        const loom_quant_plan *pg = &wl->shexp[0].plan, *pd = &wl->shexp[2].plan;
        if (pg->format == LOOM_QFMT_NONE) n += cb_round(2 * S * H * e);
        else *qbytes += cb_qbytes(pg->format, (int64_t)(2 * S), (int64_t)H, pg->group_size);
        if (pd->format == LOOM_QFMT_NONE) n += cb_round(H * S * e);
        else *qbytes += cb_qbytes(pd->format, (int64_t)H, (int64_t)S, pd->group_size);
        n += cb_round(H * 4);
    }
    return n + *qbytes;
}

/* The experts' quantizer plans as the cuda MoE layer runs them
 * (cuda_moe_quant.c): int8 (W8A16, W8A8), fp8 and int4 on the routed and
 * the shared experts, gate and up in one format (one fused matrix each),
 * shapes within the kernels' contract; GGUF blocks as stored are refused. */
static loom_status cb_check_moe_layer(cuda_backend *b, const loom_ww *w, int32_t l, loom_error *err) {
    const loom_host *h = b->host;
    const loom_ww_layer *wl = &w->layer[l];
    if (!wl->router.t) return LOOM_OK;
    const int H = b->mc.hidden_size, I = b->mc.expert_intermediate_size, S = b->moe_sh;
    for (int sh = 0; sh < 2; sh++) {
        if (sh && !wl->shexp[0].w.t) break;
        const loom_quant_plan *p[3];
        const char *name[3];
        for (int k = 0; k < 3; k++) {
            p[k] = sh ? &wl->shexp[k].plan : &wl->exps_plan[k];
            name[k] = sh ? wl->shexp[k].w.name : wl->exps[k].name;
            if (p[k]->format == LOOM_QFMT_GGUF)
                return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                                "backend cuda: tensor '%s' is planned as GGUF blocks as stored; the cuda MoE layer "
                                "runs expert weights in %s or quantized by the int8, fp8 or int4 quantizers, not "
                                "GGUF blocks; dequantize them (quantizer source: quantize, or none) or use "
                                "backend: cpu",
                                name[k], loom_dtype_name(b->ldt));
        }
        if (p[0]->format != p[1]->format ||
            (p[0]->format == LOOM_QFMT_INT4_W4A16 && p[0]->group_size != p[1]->group_size))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cuda: tensor '%s' is planned %s (group %d) but '%s' %s (group %d); the cuda "
                            "MoE layer runs each expert's gate and up as one fused matrix, so they need one "
                            "format: skip both in the quantizer or neither",
                            name[0], loom_ww_qformat_name(p[0]->format), p[0]->group_size, name[1],
                            loom_ww_qformat_name(p[1]->format), p[1]->group_size);
        for (int k = 0; k < 3; k += 2) {
            if (p[k]->format == LOOM_QFMT_NONE) continue;
            const int gs = p[k]->format == LOOM_QFMT_INT4_W4A16 ? p[k]->group_size : 0;
            const int N = k ? H : 2 * (sh ? S : I), K = k ? (sh ? S : I) : H;
            const bool ok = sh ? loom_cuda_qweight_ok((loom_cuda_qfmt)p[k]->format, K, gs)
                               : loom_cuda_moe_qweight_ok((loom_cuda_qfmt)p[k]->format, N, K, gs);
            if (!ok)
                return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                                "backend cuda: tensor '%s' planned %s: the cuda expert kernels need %s, and it has "
                                "%d input columns; %s",
                                name[k], loom_ww_qformat_name(p[k]->format),
                                gs ? "group_size a multiple of 32 dividing the input columns"
                                   : "input columns a multiple of 16",
                                K, gs ? "pick group_size 32, 64 or 128 (one that divides it)" : "skip the tensor in the quantizer");
        }
    }
    return LOOM_OK;
}

/* Device bytes of this rank's weights into b->weight_bytes (the quantized
 * ones also into b->qweight_bytes), as cb_load_vocab and cb_carve_layer
 * carve them; a quantized group takes its quantized size instead of dt.
 * glay: (layers, CB_NGROUPS) GGUF layouts, then the LM head's. */
static void cb_size_weights(cuda_backend *b, const loom_ww *w, const loom_cuda_gguf_layout *glay) {
    const size_t e = b->elt, H = (size_t)w->hidden, Vp = (size_t)w->shard.vocab_pad;
    const loom_quant_plan *po = &w->out_plan;
    const bool q_lm = w->out.t && po->format != LOOM_QFMT_NONE;
    const size_t lm_qb = !q_lm                            ? 0
                         : po->format == LOOM_QFMT_GGUF ? cb_round(glay[(size_t)w->layers * CB_NGROUPS].bytes)
                                                        : cb_qbytes(po->format, (int64_t)Vp, (int64_t)H,
                                                                    po->group_size);
    b->weight_bytes = (cb_keeps_embed(b, w) ? cb_round(Vp * H * e) : 0) + cb_round(H * 4);
    if (w->out.t && b->last_stage) b->weight_bytes += q_lm ? lm_qb : cb_round(Vp * H * e);
    b->qweight_bytes = b->last_stage ? lm_qb : 0;
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++) {
        const loom_ww_layer *wl = &w->layer[l];
        b->weight_bytes += 2 * cb_round(H * 4) + (w->bias ? cb_round((size_t)w->qkv_rows * 4) : 0);
        b->weight_bytes += cb_norms_bytes(b, w);
        size_t moe_qb = 0;
        b->weight_bytes += cb_moe_bytes(b, wl, &moe_qb);
        b->qweight_bytes += moe_qb;
        for (int gi = 0; gi < CB_NGROUPS; gi++) {
            if (cb_moe_group(b, gi)) continue;
            const loom_ww_group *g = &w->group[gi];
            const loom_quant_plan *p0 = &wl->lin[g->first].plan;
            if (p0->format == LOOM_QFMT_NONE) {
                b->weight_bytes += cb_round((size_t)(g->n * g->k) * e);
                continue;
            }
            const size_t qb = p0->format == LOOM_QFMT_GGUF
                                  ? cb_round(glay[(size_t)l * CB_NGROUPS + gi].bytes)
                                  : cb_qbytes(p0->format, g->n, g->k, p0->group_size);
            b->weight_bytes += qb;
            b->qweight_bytes += qb;
        }
    }
}

/* The device arena for b->weight_bytes, after checking the device has
 * them free, and the host table of layers. */
static loom_status cb_alloc_weights(cuda_backend *b, bool any_quant, loom_error *err) {
    const loom_host *h = b->host;
    loom_status st;
    size_t free_b = 0, total = 0;
    if ((st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &total)))) return st;
    if (b->weight_bytes > free_b) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                      "backend cuda: weights of '%s' need %.1f MiB in %s%s but device %d (%s) has "
                      "%.1f MiB free of %.1f MiB; use a smaller model, a quantizer, or another "
                      "device",
                      b->mc.name, cb_mib(b->weight_bytes), loom_dtype_name(b->ldt),
                      any_quant ? " and quantized formats" : "", b->device, b->device_name,
                      cb_mib(free_b), cb_mib(total));
        b->weight_bytes = 0;
        return st;
    }
    b->layers = h->calloc(h->ctx, (size_t)b->mc.num_layers, sizeof *b->layers);
    if (!b->layers) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
    return CB_CUDA(b, err, cudaMalloc(&b->weights, b->weight_bytes));
}

/* `bytes` from the device arena's cursor; every piece CB_ALIGN-aligned. */
static void *cb_carve(uint8_t **cur, size_t bytes) {
    void *p = *cur;
    *cur += cb_round(bytes);
    return p;
}

/* A quantized matrix of n x k in format f (INT4: group size gs): data,
 * scales, smooth, in cb_qbytes' order. */
static loom_cuda_qweight cb_carve_q(uint8_t **cur, loom_qformat f, int64_t n, int64_t k, int32_t gs) {
    const bool i4 = f == LOOM_QFMT_INT4_W4A16;
    loom_cuda_qweight qw = {.fmt = (loom_cuda_qfmt)f, .N = (int)n, .K = (int)k, .group = i4 ? (int)gs : 0};
    qw.data = cb_carve(cur, i4 ? (size_t)(n * (k / 2)) : (size_t)(n * k));
    qw.scales = cb_carve(cur, i4 ? (size_t)(n * (k / gs)) * 8 : (size_t)n * 4);
    qw.smooth = CB_SMOOTHED(f) ? cb_carve(cur, (size_t)k * 4) : NULL;
    return qw;
}

/* Zero rows [from, to) of a (to, cols) dt matrix: a sharded rank's rows
 * past the end of the vocabulary. */
static loom_status cb_zero_rows(cuda_backend *b, void *base, int64_t from, int64_t to, int64_t cols,
                                loom_error *err) {
    if (from >= to) return LOOM_OK;
    return CB_CUDA(b, err, cudaMemsetAsync((uint8_t *)base + (size_t)(from * cols) * b->elt, 0,
                                           (size_t)((to - from) * cols) * b->elt, b->stream));
}

/* This rank's vocabulary rows of the embedding (dt) and of the LM head (dt,
 * the quantizer's format or GGUF blocks as stored; tied: the embedding),
 * each with zero rows up to vocab_pad, and the output norm (f32). */
static loom_status cb_load_vocab(cuda_backend *b, const loom_model_view *m,
                                 const loom_quant_binding *quant, const loom_ww *w,
                                 const loom_cuda_gguf_layout *glay_out, cb_uploader *up,
                                 uint8_t **cur, loom_error *err) {
    const loom_host *h = b->host;
    const int64_t H = w->hidden, Vp = w->shard.vocab_pad, Vl = w->shard.vocab_rows;
    const loom_quant_plan *po = &w->out_plan;
    loom_status st;
    const bool embed = cb_keeps_embed(b, w);
    b->embed = embed ? cb_carve(cur, (size_t)(Vp * H) * b->elt) : NULL;
    b->out_norm = cb_carve(cur, (size_t)H * 4);
    b->lm_head = b->embed;
    if ((embed && ((st = cb_upload_win(up, &w->embed, b->embed, false, err)) ||
                   (st = cb_zero_rows(b, b->embed, Vl, Vp, H, err)))) ||
        (st = cb_upload_win(up, &w->out_norm, b->out_norm, true, err)))
        return st;
    if (!w->out.t || !b->last_stage) return LOOM_OK;
    if (po->format == LOOM_QFMT_GGUF) {
        /* zeroed first: padding rows (zero blocks: scale 0) give logits 0 */
        void *base = cb_carve(cur, glay_out->bytes);
        b->lm_q = cb_gguf_qweight(glay_out, base, Vp, H);
        b->lm_head = NULL;
        if ((st = CB_CUDA(b, err, cudaMemsetAsync(base, 0, glay_out->bytes, b->stream))))
            return st;
        return cb_upload_gguf(b, &w->out, base, err);
    }
    if (po->format != LOOM_QFMT_NONE) {
        /* zeroed first: padding rows (data and scales 0) give logits 0 */
        uint8_t *q0p = *cur;
        b->lm_q = cb_carve_q(cur, po->format, Vp, H, po->group_size);
        b->lm_head = NULL;
        float *sm = NULL;
        if ((st = CB_CUDA(b, err, cudaMemsetAsync(q0p, 0, (size_t)(*cur - q0p), b->stream))) ||
            (Vl > 0 && (st = cb_upload_q(b, m, quant, &w->out, po, &b->lm_q, 0, true, &sm, err)))) {
            h->free(h->ctx, sm);
            return st;
        }
        if (!sm) b->lm_q.smooth = NULL;
        h->free(h->ctx, sm);
        return Vl > 0 ? cb_tile_q(b, &b->lm_q, err) : LOOM_OK;
    }
    b->lm_head = cb_carve(cur, (size_t)(Vp * H) * b->elt);
    if ((st = cb_upload_win(up, &w->out, b->lm_head, false, err))) return st;
    return cb_zero_rows(b, b->lm_head, Vl, Vp, H, err);
}

/* E experts' stacked quantized matrices of shape q from *cur: data,
 * scales, the SmoothQuant slot (in smooth until the upload clears it). */
static loom_cuda_qweight cb_carve_qstack(uint8_t **cur, size_t E, loom_cuda_qweight q) {
    q.data = cb_carve(cur, E * loom_cuda_moe_qdata_bytes(&q));
    q.scales = cb_carve(cur, E * loom_cuda_moe_qscale_floats(&q) * 4);
    q.smooth = CB_SMOOTHED((loom_qformat)q.fmt) ? cb_carve(cur, (size_t)q.K * 4) : NULL;
    return q;
}

/* Layer l's router (whole), this rank's experts and shared-expert slice,
 * after its other weights (cb_moe_bytes): each matrix in dt or, planned
 * so, quantized. */
static void cb_carve_moe(cuda_backend *b, const loom_ww_layer *wl, cuda_layer *ly, uint8_t **cur) {
    const loom_model_config *c = &b->mc;
    const size_t E = (size_t)b->moe_el, H = (size_t)c->hidden_size, I = (size_t)c->expert_intermediate_size;
    const size_t S = (size_t)b->moe_sh, e = b->elt;
    ly->router = cb_carve(cur, (size_t)c->num_experts * H * e);
    if (wl->exps_plan[0].format == LOOM_QFMT_NONE) ly->wgu_exps = cb_carve(cur, E * 2 * I * H * e);
    else ly->q_gu_exps = cb_carve_qstack(cur, E, cb_moe_qshape(b, &wl->exps_plan[0], true));
    if (wl->exps_plan[2].format == LOOM_QFMT_NONE) ly->wdown_exps = cb_carve(cur, E * H * I * e);
    else ly->q_down_exps = cb_carve_qstack(cur, E, cb_moe_qshape(b, &wl->exps_plan[2], false));
    if (!S) return;
    const loom_quant_plan *pg = &wl->shexp[0].plan, *pd = &wl->shexp[2].plan;
    if (pg->format == LOOM_QFMT_NONE) ly->wgu_sh = cb_carve(cur, 2 * S * H * e);
    else ly->q_gu_sh = cb_carve_q(cur, pg->format, (int64_t)(2 * S), (int64_t)H, pg->group_size);
    if (pd->format == LOOM_QFMT_NONE) ly->wdown_sh = cb_carve(cur, H * S * e);
    else ly->q_down_sh = cb_carve_q(cur, pd->format, (int64_t)H, (int64_t)S, pd->group_size);
    ly->sh_gate = cb_carve(cur, H * 4);
}

/* Layer l's device memory, carved from *cur in this order: attn_norm, then
 * per group its dt matrix, its GGUF segments (zeroed: the kernels read the
 * 16-byte alignment gaps) or its quantized matrix, with the Q/K/V bias
 * after the first group and ffn_norm after the second. gbase[gi]: the
 * group's dt matrix or GGUF blocks (NULL when quantized). */
static loom_status cb_carve_layer(cuda_backend *b, const loom_ww *w, int32_t l,
                                  const loom_cuda_gguf_layout *glay, uint8_t **cur, void **gbase,
                                  loom_error *err) {
    cuda_layer *ly = &b->layers[l];
    const loom_ww_layer *wl = &w->layer[l];
    const size_t H = (size_t)w->hidden;
    loom_status st;
    ly->attn_norm = cb_carve(cur, H * 4);
    for (int gi = 0; gi < CB_NGROUPS; gi++) {
        const loom_ww_group *g = &w->group[gi];
        const loom_quant_plan *p0 = &wl->lin[g->first].plan;
        gbase[gi] = NULL;
        if (cb_moe_group(b, gi)) {
            /* the experts instead (cb_carve_moe) */
        } else if (p0->format == LOOM_QFMT_NONE) {
            gbase[gi] = cb_carve(cur, (size_t)(g->n * g->k) * b->elt);
        } else if (p0->format == LOOM_QFMT_GGUF) {
            gbase[gi] = cb_carve(cur, glay[gi].bytes);
            ly->q[gi] = cb_gguf_qweight(&glay[gi], gbase[gi], g->n, g->k);
            if ((st = CB_CUDA(b, err, cudaMemsetAsync(gbase[gi], 0, glay[gi].bytes, b->stream))))
                return st;
        } else {
            ly->q[gi] = cb_carve_q(cur, p0->format, g->n, g->k, p0->group_size);
        }
        if (gi == CB_G_QKV) ly->bqkv = w->bias ? cb_carve(cur, (size_t)w->qkv_rows * 4) : NULL;
        if (gi == CB_G_O) ly->ffn_norm = cb_carve(cur, H * 4);
    }
    const size_t D = (size_t)b->mc.head_dim;
    ly->q_norm = b->mc.qk_norm ? cb_carve(cur, D * 4) : NULL;
    ly->k_norm = b->mc.qk_norm ? cb_carve(cur, D * 4) : NULL;
    ly->post_attn_norm = b->mc.post_norms ? cb_carve(cur, H * 4) : NULL;
    ly->post_ffn_norm = b->mc.post_norms ? cb_carve(cur, H * 4) : NULL;
    if (b->mc.num_experts > 0) cb_carve_moe(b, wl, ly, cur);
    /* a quantized group has no dt matrix (gbase: its GGUF blocks) */
    ly->wqkv = wl->lin[LOOM_WW_Q].plan.format == LOOM_QFMT_NONE ? gbase[CB_G_QKV] : NULL;
    ly->wo = wl->lin[LOOM_WW_O].plan.format == LOOM_QFMT_NONE ? gbase[CB_G_O] : NULL;
    ly->wgu = wl->lin[LOOM_WW_GATE].plan.format == LOOM_QFMT_NONE ? gbase[CB_G_GU] : NULL;
    ly->wdown = wl->lin[LOOM_WW_DOWN].plan.format == LOOM_QFMT_NONE ? gbase[CB_G_DOWN] : NULL;
    return LOOM_OK;
}

/* One expert's parts [k0, k1) of its fused matrix (gate|up or down),
 * quantized by the quantizer into dst (rows one after another). A
 * SmoothQuant vector is refused for routed experts (routed: the stacked
 * kernels quantize their rows without one) and kept for the shared one. */
static loom_status cb_upload_moe_q(cuda_backend *b, const loom_model_view *m, const loom_quant_binding *quant,
                                   const loom_ww_part *parts, const loom_quant_plan *const *plans, int n,
                                   loom_cuda_qweight *dst, bool routed, loom_error *err) {
    const loom_host *h = b->host;
    float *sm = NULL;
    loom_status st = LOOM_OK;
    int64_t row = 0;
    for (int k = 0; k < n && st == LOOM_OK; k++) {
        st = cb_upload_q(b, m, quant, &parts[k], plans[k], dst, row, k == 0, &sm, err);
        row += parts[k].nr;
    }
    if (st == LOOM_OK && sm && routed)
        st = h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                      "backend cuda: tensor '%s' came with a SmoothQuant vector; the cuda MoE layer quantizes "
                      "routed experts' activations without one (calibration records no expert inputs)",
                      parts[0].name);
    if (!sm) dst->smooth = NULL;
    h->free(h->ctx, sm);
    return st;
}

/* Layer l's router and this rank's experts (w->expert0 ..), each matrix in
 * dt or quantized by the quantizer (the shared expert's gate vector f32):
 * each expert's gate and up as rows [0, I) and [I, 2I) of its gate|up
 * matrix, its down matrix after the one before; the shared expert's
 * window of the rank (gate, up by rows, down by columns). */
static loom_status cb_upload_moe(cb_uploader *up, const loom_model_view *m, const loom_quant_binding *quant,
                                 const loom_ww *w, const loom_ww_layer *wl, cuda_layer *ly, loom_error *err) {
    cuda_backend *b = up->b;
    const int64_t H = w->hidden, I = b->mc.expert_intermediate_size, S = b->moe_sh;
    const size_t e = b->elt;
    const bool qgu = wl->exps_plan[0].format != LOOM_QFMT_NONE, qd = wl->exps_plan[2].format != LOOM_QFMT_NONE;
    const loom_quant_plan *ep[3] = {&wl->exps_plan[0], &wl->exps_plan[1], &wl->exps_plan[2]};
    loom_status st;
    if ((st = cb_upload_win(up, &wl->router, ly->router, false, err))) return st;
    for (int32_t x = 0; x < w->experts; x++) {
        loom_tensor v[3];
        loom_ww_part parts[3];
        for (int k = 0; k < 3; k++) {
            loom_ww_expert_view(w, wl->exps[k].t, w->expert0 + x, &v[k]);
            parts[k] = (loom_ww_part){.t = &v[k], .r0 = 0, .nr = v[k].shape[0], .c0 = 0, .nc = v[k].shape[1]};
            snprintf(parts[k].name, sizeof parts[k].name, "%s", wl->exps[k].name);
        }
        if (qgu) {
            loom_cuda_qweight d = ly->q_gu_exps;
            d.data = (const uint8_t *)d.data + (size_t)x * loom_cuda_moe_qdata_bytes(&d);
            d.scales += (size_t)x * loom_cuda_moe_qscale_floats(&d);
            if ((st = cb_upload_moe_q(b, m, quant, parts, ep, 2, &d, true, err))) return st;
        } else {
            uint8_t *gu = (uint8_t *)ly->wgu_exps + (size_t)(x * 2 * I * H) * e;
            if ((st = cb_upload_part(up, &v[0], 0, I, 0, H, gu, false, err)) ||
                (st = cb_upload_part(up, &v[1], 0, I, 0, H, gu + (size_t)(I * H) * e, false, err)))
                return st;
        }
        if (qd) {
            loom_cuda_qweight d = ly->q_down_exps;
            d.data = (const uint8_t *)d.data + (size_t)x * loom_cuda_moe_qdata_bytes(&d);
            d.scales += (size_t)x * loom_cuda_moe_qscale_floats(&d);
            if ((st = cb_upload_moe_q(b, m, quant, &parts[2], &ep[2], 1, &d, true, err))) return st;
        } else if ((st = cb_upload_part(up, &v[2], 0, H, 0, I, (uint8_t *)ly->wdown_exps + (size_t)(x * H * I) * e,
                                        false, err))) {
            return st;
        }
    }
    ly->q_gu_exps.smooth = ly->q_down_exps.smooth = NULL;
    if (!S) return LOOM_OK;
    const loom_quant_plan *sp[3] = {&wl->shexp[0].plan, &wl->shexp[1].plan, &wl->shexp[2].plan};
    const loom_ww_part sparts[3] = {wl->shexp[0].w, wl->shexp[1].w, wl->shexp[2].w};
    if (sp[0]->format != LOOM_QFMT_NONE) {
        if ((st = cb_upload_moe_q(b, m, quant, sparts, sp, 2, &ly->q_gu_sh, false, err))) return st;
    } else if ((st = cb_upload_win(up, &wl->shexp[0].w, ly->wgu_sh, false, err)) ||
               (st = cb_upload_win(up, &wl->shexp[1].w, (uint8_t *)ly->wgu_sh + (size_t)(S * H) * e, false, err))) {
        return st;
    }
    if (sp[2]->format != LOOM_QFMT_NONE) {
        if ((st = cb_upload_moe_q(b, m, quant, &sparts[2], &sp[2], 1, &ly->q_down_sh, false, err))) return st;
    } else if ((st = cb_upload_win(up, &wl->shexp[2].w, ly->wdown_sh, false, err))) {
        return st;
    }
    return cb_upload_win(up, &wl->shexp_gate, ly->sh_gate, true, err);
}

/* Layer l's weights into what cb_carve_layer carved: each linear part at
 * its rows of its group — dt through the uploader, GGUF blocks as stored,
 * or quantized by the quantizer (whole on the host, its window uploaded) —
 * then the norms and the Q/K/V biases (f32, sliced like their rows). */
static loom_status cb_upload_layer(cuda_backend *b, const loom_model_view *m,
                                   const loom_quant_binding *quant, const loom_ww *w, int32_t l,
                                   const loom_cuda_gguf_layout *glay, void *const *gbase,
                                   cb_uploader *up, loom_error *err) {
    const loom_host *h = b->host;
    cuda_layer *ly = &b->layers[l];
    const loom_ww_layer *wl = &w->layer[l];
    loom_status st = LOOM_OK;
    float *smooth_ref = NULL;
    for (int k = 0; k < LOOM_WW_NLIN && st == LOOM_OK; k++) {
        const loom_ww_lin *li = &wl->lin[k];
        const int gi = li->group;
        const loom_ww_group *g = &w->group[gi];
        if (!li->w.t) continue; /* a mixture of experts' absent dense FFN */
        if (li->plan.format == LOOM_QFMT_NONE) {
            void *dst = (uint8_t *)gbase[gi] + (size_t)(li->group_row * g->k) * b->elt;
            st = cb_upload_win(up, &li->w, dst, false, err);
        } else if (li->plan.format == LOOM_QFMT_GGUF) {
            st = cb_upload_gguf(b, &li->w, (uint8_t *)gbase[gi] + glay[gi].part_offset[k - g->first], err);
        } else {
            const bool first = k == g->first;
            if (first) {
                h->free(h->ctx, smooth_ref);
                smooth_ref = NULL;
            }
            st = cb_upload_q(b, m, quant, &li->w, &li->plan, &ly->q[gi], li->group_row, first,
                             &smooth_ref, err);
            if (st == LOOM_OK && k + 1 == g->end && !smooth_ref) ly->q[gi].smooth = NULL;
        }
    }
    h->free(h->ctx, smooth_ref);
    if (st != LOOM_OK) return st;
    const bool tiles = cb_layer_tiles(ly->q, CB_NGROUPS);
    bool tiled = false;
    for (int gi = 0; gi < CB_NGROUPS && tiles; gi++) {
        if ((st = cb_tile_q(b, &ly->q[gi], err))) return st;
        tiled |= ly->q[gi].layout == LOOM_CUDA_QLAYOUT_TILED;
    }
    /* the tests' evidence that a shape (a tp rank's windows, say) took the
     * tiled kernels */
    if (tiled && h->metric_add) h->metric_add(h->ctx, "backend.cuda.qtiled_layers", 1);
    if ((st = cb_upload_win(up, &wl->attn_norm, ly->attn_norm, true, err)) ||
        (st = cb_upload_win(up, &wl->ffn_norm, ly->ffn_norm, true, err)))
        return st;
    /* QK-norm and post-norms: the walk has them exactly when the config
     * says so (the weights as the loader presents them: Gemma's GGUF holds
     * 1 + w, as the cpu backend multiplies them) */
    const loom_ww_part *src[4] = {&wl->q_norm, &wl->k_norm, &wl->post_attn_norm, &wl->post_ffn_norm};
    float *dst[4] = {ly->q_norm, ly->k_norm, ly->post_attn_norm, ly->post_ffn_norm};
    for (int i = 0; i < 4; i++) {
        if (!dst[i]) continue;
        if (!src[i]->t)
            return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: layer %d has no %s weight its config asks for",
                            (int)l, i < 2 ? (i ? "attn_k_norm" : "attn_q_norm")
                                          : (i == 2 ? "post_attention_norm" : "post_ffw_norm"));
        if ((st = cb_upload_win(up, src[i], dst[i], true, err))) return st;
    }
    for (int k = 0; w->bias && k < 3; k++) {
        float *bd = ly->bqkv + (k == 0 ? 0 : w->q_rows + (k - 1) * w->kv_rows);
        if ((st = cb_upload_win(up, &wl->bias[k], bd, true, err))) return st;
    }
    return wl->router.t ? cb_upload_moe(up, m, quant, w, wl, ly, err) : LOOM_OK;
}

/* Quantized-GEMM scratch: the largest any quantized weight needs at the
 * work buffers' row count (the LM head at its logits chunk). */
static void cb_size_qscratch(cuda_backend *b) {
    const int mt = (int)b->cfg.max_batched_tokens;
    const int lr = cb_logits_rows(&b->cfg);
    b->qscratch_bytes = 0;
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++)
        for (int gi = 0; gi < CB_NGROUPS; gi++) {
            size_t n = loom_cuda_qgemm_scratch_bytes(b->gemm, b->dt, 0, &b->layers[l].q[gi], mt);
            if (n > b->qscratch_bytes) b->qscratch_bytes = n;
        }
    /* a quantized shared expert runs as a dense FFN (cuda_moe_quant.c) */
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++)
        for (int k = 0; k < 2; k++) {
            const loom_cuda_qweight *q = k ? &b->layers[l].q_down_sh : &b->layers[l].q_gu_sh;
            if (q->fmt == LOOM_CUDA_Q_NONE) continue;
            size_t n = loom_cuda_qgemm_scratch_bytes(b->gemm, b->dt, 0, q, mt);
            if (n > b->qscratch_bytes) b->qscratch_bytes = n;
        }
    size_t n = loom_cuda_qgemm_scratch_bytes(b->gemm, b->dt, 1, &b->lm_q, lr);
    if (n > b->qscratch_bytes) b->qscratch_bytes = n;
}

/* This backend's rule on a rank's shape — its FFN width a multiple of 8
 * (the kernels move 16-byte vectors: SwiGLU, the down projection's K) like
 * the model's — then the device and the GEMM modes the rest of load()
 * sizes things by. */
static loom_status cb_load_begin(cuda_backend *b, const loom_ww *w, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    loom_status st;
    if (c->num_experts == 0 && w->shard.inter % 8 != 0)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' FFN width %d over %d ranks leaves %d columns per "
                        "rank, not a multiple of 8 as the cuda kernels need; use a size that "
                        "keeps FFN width / size a multiple of 8",
                        c->name, c->intermediate_size, w->shard.size, w->shard.inter);
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device))) ||
        (st = CB_CUDA(b, err, loom_cuda_set_trigger_first(b->cfg.trigger_first))))
        return st;
    /* before the quantized-GEMM scratch is sized: the mode moves the
     * quantized GEMV bound */
    loom_cuda_gemm_set_batch_invariant(b->gemm, b->cfg.batch_invariant);
    loom_cuda_qgemm_set_tc_min_m(b->gemm, (int)b->cfg.qgemv_tc_min_rows);
    loom_cuda_qgemm_set_tiled_max_m(b->gemm, (int)b->cfg.qtiled_max_rows);
    loom_cuda_qgemm_set_tiled_wgmma_min_m(b->gemm, (int)b->cfg.qtiled_wgmma_rows);
    loom_cuda_qgemm_set_fp8_vec_min_m(b->gemm, (int)b->cfg.fp8_vec_rows);
    b->q_dim = (int32_t)w->q_rows;
    b->kv_dim = (int32_t)w->kv_rows;
    b->qkv_rows = (int32_t)w->qkv_rows;
    b->group = w->shard.heads / w->shard.kv_heads;
    return LOOM_OK;
}

/* A pipeline stage's link buffer, for max_tokens rows: device memory for
 * device links, pinned host memory for host links. */
static loom_status cb_link_buf_init(cuda_backend *b, loom_error *err) {
    if (!b->stage.struct_size || b->stage.count < 2) return LOOM_OK;
    const size_t n = cb_link_bytes(b, b->max_tokens);
    if (b->stage.device_links) return CB_CUDA(b, err, cudaMalloc(&b->link_buf, n));
    return CB_CUDA(b, err, cudaHostAlloc(&b->link_buf, n, cudaHostAllocDefault));
}

void cb_link_buf_free(cuda_backend *b) {
    if (!b->link_buf) return;
    if (b->stage.device_links) cudaFree(b->link_buf);
    else cudaFreeHost(b->link_buf);
    b->link_buf = NULL;
}

/* After the weights: the model as this rank runs it, the communicator, the
 * RoPE table and the work buffers, the log line. */
static loom_status cb_load_done(cuda_backend *b, const loom_ww *w, const loom_comm *comm,
                                const loom_quant_binding *quant, bool any_quant, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const loom_shard *sh = &w->shard;
    loom_status st;
    /* from here on mc is the model as this rank runs it (the work buffers,
     * KV pools and kernels size themselves from it) */
    b->mc.num_heads = sh->heads;
    b->mc.num_kv_heads = sh->kv_heads;
    b->mc.intermediate_size = sh->inter;
    /* a mixture of experts has no dense FFN: gu / act serve its shared
     * expert (width 8 when it has none: buffers of a few bytes) */
    if (c->num_experts > 0)
        b->mc.intermediate_size = b->moe_sh ? b->moe_sh : 8;
    b->vocab_lo = sh->vocab_lo;
    b->vocab_rows = sh->vocab_rows;
    b->vocab_pad = sh->vocab_pad;
    b->sharded = comm && comm->size > 1;
    if (b->sharded) { /* an older executor's table is shorter: its new fields read 0 */
        memset(&b->comm, 0, sizeof b->comm);
        memcpy(&b->comm, comm, comm->struct_size < sizeof b->comm ? comm->struct_size : sizeof b->comm);
        b->comm_host = b->comm.host_memory != 0;
    }
    if ((st = cb_rope_init(b, err)) || (st = cb_work_init(b, err)) || (st = cb_link_buf_init(b, err)) ||
        (st = cb_comm_init(b, err)) ||
        (c->num_experts > 0 && ((st = cb_moe_work_init(b, err)) || (st = cb_moe_qwork_init(b, err)))))
        return st;
    b->loaded = true;
    if (h->metric_set) h->metric_set(h->ctx, "backend.cuda.weight_bytes", (double)b->weight_bytes);
    if (b->sharded && b->cfg.batch_invariant)
        h->log(h->ctx, LOOM_LOG_WARN, CB_WHO,
               "batch_invariant covers one GPU: with %d ranks the NCCL all-reduce's summation "
               "order follows the message size (the step's token count), so results may still "
               "depend on the batch",
               b->comm.size);
    if (b->stage.struct_size)
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "stage %d/%d of '%s' on device %d: layers %d..%d%s%s, %s links",
               b->stage.index, b->stage.count, c->name, b->device, b->layer0, b->layer0 + b->nlayers - 1,
               b->first_stage ? ", embedding" : "", b->last_stage ? ", LM head" : "",
               b->stage.device_links ? "device" : "host (staged through pinned memory)");
    if (comm)
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
               "rank %d/%d of '%s' on device %d: heads %d..%d, KV heads %d..%d, FFN %lld..%lld, "
               "vocab %d..%d, %.1f MiB %s weights%s",
               sh->rank, sh->size, c->name, b->device, sh->head0, sh->head0 + sh->heads - 1, sh->kv0,
               sh->kv0 + sh->kv_heads - 1, (long long)w->i0, (long long)(w->i0 + w->inter_rows - 1),
               sh->vocab_lo, sh->vocab_lo + sh->vocab_rows - 1, cb_mib(b->weight_bytes),
               loom_dtype_name(b->ldt),
               !b->cfg.cuda_graphs || !b->sharded ? ""
               : b->comm_host ? "; collectives through pinned host memory (threads), CUDA graphs off"
               : b->comm.graph_safe_bytes > 0 ? "; CUDA graphs for steps whose collectives are peer-to-peer kernels"
                                              : "; CUDA graphs off (NCCL collectives; executor.p2p_kib enables them)");
    else
        h->log(h->ctx, LOOM_LOG_INFO, CB_WHO,
               "loaded '%s': %d layers, %.1f MiB %s weights (%.1f MiB quantized%s%s)%s%s",
               c->name, w->layers, cb_mib(b->weight_bytes), loom_dtype_name(b->ldt),
               cb_mib(b->qweight_bytes), quant && quant->name && any_quant ? " by " : "",
               quant && quant->name && any_quant ? quant->name : "",
               w->out.t ? "" : " (tied LM head)", w->bias ? ", QKV bias" : "");
    return LOOM_OK;
}

/* Free what a failed load() made; the instance is as before load(). */
static void cb_load_undo(cuda_backend *b) {
    const loom_host *h = b->host;
    cudaStreamSynchronize(b->stream);
    cudaFree(b->weights);
    cudaFree(b->rope_cs);
    cudaFree(b->rope_cs_local);
    cudaFree(b->work);
    cudaFree(b->moe_work);
    cudaFree(b->moe_qwork);
    cb_moe_ep_free(b);
    if (b->comm_stage) cudaFreeHost(b->comm_stage);
    b->comm_stage = NULL, b->comm_stage_bytes = 0;
    cudaFree(b->meta_dev);
    if (b->meta_host) cudaFreeHost(b->meta_host);
    if (b->logits_host) cudaFreeHost(b->logits_host);
    if (b->topk_host) cudaFreeHost(b->topk_host);
    if (b->mask_host) cudaFreeHost(b->mask_host);
    cb_link_buf_free(b);
    h->free(h->ctx, b->layers);
    b->weights = b->work = b->moe_work = b->moe_qwork = NULL;
    b->rope_cs = NULL;
    b->rope_cs_local = NULL;
    b->meta_dev = b->meta_host = NULL;
    b->logits_host = NULL;
    b->topk_host = NULL;
    b->mask_host = b->mask_dev = NULL;
    b->layers = NULL;
    b->weight_bytes = 0;
    b->qweight_bytes = 0;
    b->lm_q = (loom_cuda_qweight){0};
    b->sharded = b->comm_host = false;
    b->logits_local = b->logits_gathered = NULL;
}

/* Every weight checked (the weight walk, then this backend's rules on each
 * group and the LM head), sized, carved from one device arena and uploaded. */
static loom_status cb_load_weights(cuda_backend *b, const loom_model_view *m,
                                   const loom_quant_binding *quant, const loom_ww *w,
                                   const loom_cuda_gguf_layout *glay, loom_error *err) {
    loom_status st;
    cb_uploader up;
    /* whole source rows: a column window dequantizes the full row first */
    int64_t max_cols = w->hidden > w->inter ? w->hidden : w->inter;
    if (w->q_dim > max_cols) max_cols = w->q_dim;
    if (b->mc.expert_intermediate_size > max_cols) max_cols = b->mc.expert_intermediate_size;
    if (b->mc.shared_expert_intermediate_size > max_cols) max_cols = b->mc.shared_expert_intermediate_size;
    if ((st = cb_uploader_init(b, &up, max_cols, err))) goto out;
    uint8_t *cur = b->weights;
    if ((st = cb_load_vocab(b, m, quant, w, &glay[(size_t)w->layers * CB_NGROUPS], &up, &cur, err)))
        goto out;
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++) {
        void *gbase[CB_NGROUPS];
        const loom_cuda_gguf_layout *gl = &glay[(size_t)l * CB_NGROUPS];
        if ((st = cb_carve_layer(b, w, l, gl, &cur, gbase, err)) ||
            (st = cb_upload_layer(b, m, quant, w, l, gl, gbase, &up, err)))
            goto out;
    }
    st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
out:
    cb_uploader_free(&up);
    return st;
}

/* The layers this instance holds: `stage`'s (checked by cb_load_stage),
 * or all of them. */
static void cb_set_layers(cuda_backend *b, const loom_stage *stage) {
    loom_ww_copy_stage(&b->stage, stage); /* an older executor's stage is shorter: its new fields read 0 */
    b->layer0 = stage ? stage->first_layer : 0;
    b->nlayers = stage ? stage->num_layers : b->mc.num_layers;
    b->first_stage = !stage || stage->index == 0;
    b->last_stage = !stage || stage->index == stage->count - 1;
}

/* load(), load_shard() and load_stage(): `comm` NULL keeps the whole
 * width, `stage` NULL every layer. What to load is the weight walk's
 * (plugins/backend/common/weight_walk.h). */
static loom_status cb_load_impl(cuda_backend *b, const loom_model_view *m,
                                const loom_quant_binding *quant, const loom_comm *comm,
                                const loom_stage *stage, loom_error *err) {
    const loom_host *h = b->host;
    loom_status st = LOOM_OK;
    loom_ww w;
    if ((st = loom_ww_begin(&w, h, "backend cuda", CB_WHO, b->loaded, m, comm, err)) != LOOM_OK)
        return st;
    b->mc = *m->config;
    cb_set_layers(b, stage);
    const loom_model_config *c = &b->mc;
    if (!LOOM_CUDA_HEAD_DIM_OK(c->head_dim) || c->hidden_size % 8 != 0 || c->intermediate_size % 8 != 0 ||
        c->hidden_size > 32768 || c->num_heads / c->num_kv_heads > LOOM_CUDA_MAX_GQA)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' config not runnable here (hidden %d: multiple of 8 "
                        "and <= 32768, ffn %d: multiple of 8, heads %d/%d kv: at most %d per kv "
                        "head, head_dim %d: one of 16, 32, 64, 128, 256)",
                        c->name, c->hidden_size, c->intermediate_size, c->num_heads, c->num_kv_heads,
                        LOOM_CUDA_MAX_GQA, c->head_dim);
    /* mixtures of experts: cuda_moe.c says which it runs */
    if (c->num_experts > 0 && ((st = cb_moe_check_config(b, c, err)) || (st = cb_moe_check_comm(b, c, comm, err))))
        return st;
    /* Gemma 3's and Qwen3's pieces run here (QK-norm, post-norms, GeGLU,
     * sliding windows, scales); an activation this backend has no kernel
     * for is refused rather than run as SiLU */
    if (c->ffn_act != LOOM_FFN_SILU && c->ffn_act != LOOM_FFN_GELU_TANH)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' has FFN activation %d; this backend runs SiLU (SwiGLU) and tanh "
                        "GELU (GeGLU); use backend: cpu",
                        c->name, (int)c->ffn_act);
    if (c->sliding_window < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: model '%s' has sliding window %d (need >= 0)",
                        c->name, c->sliding_window);
    if ((st = cb_load_begin(b, &w, err)) != LOOM_OK) return st;
    /* GGUF groups' device layouts: (L, CB_NGROUPS), then output.weight */
    loom_cuda_gguf_layout *glay = h->calloc(h->ctx, (size_t)w.layers * CB_NGROUPS + 1, sizeof *glay);
    if (!glay)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cuda: out of host memory for %d layers' GGUF layouts", w.layers);
    const loom_ww_hooks hooks = {.ctx = b, .runnable = cb_runnable};
    if ((st = loom_ww_collect(&w, m, quant, &hooks, err)) || (st = cb_moe_split(b, &w, err)) ||
        (st = cb_check_lm(b, &w, &glay[(size_t)w.layers * CB_NGROUPS], err)))
        goto fail;
    for (int32_t l = 0; l < w.layers; l++)
        if ((st = cb_check_layer(b, &w, l, comm != NULL, &glay[(size_t)l * CB_NGROUPS], err)) ||
            (st = cb_check_moe_layer(b, &w, l, err)))
            goto fail;
    const bool any_quant = loom_ww_any_quant(&w);
    cb_size_weights(b, &w, glay);
    if ((st = cb_alloc_weights(b, any_quant, err)) || (st = cb_load_weights(b, m, quant, &w, glay, err)))
        goto fail;
    h->free(h->ctx, glay);
    glay = NULL;
    cb_size_qscratch(b);
    if ((st = cb_load_done(b, &w, comm, quant, any_quant, err))) goto fail;
    loom_ww_free(&w);
    return LOOM_OK;

fail:
    loom_ww_free(&w);
    h->free(h->ctx, glay);
    cb_load_undo(b);
    return st;
}

loom_status cb_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                    loom_error *err) {
    return cb_load_impl(self, m, quant, NULL, NULL, err);
}

/* Tensor parallelism: keep rank comm->rank's shard and join the ranks
 * through `comm` in forward() (cuda_forward.c). A device communicator
 * (nccl) gets this instance's stream and device buffers: bind to the
 * rank's GPU, current on this thread (the executor made it so). A host one
 * (comm->host_memory, the executor's threads) gets pinned host copies
 * (cb_all_reduce): stay on the configured device — every rank may share
 * one GPU. No collective is called here: ranks load one after another. */
loom_status cb_load_shard(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                          const loom_comm *comm, loom_error *err) {
    cuda_backend *b = self;
    loom_status st;
    if (!comm)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: load_shard() needs a communicator");
    if (b->loaded)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: load() called twice; create a new instance per "
                              "model");
    const bool host_comm = LOOM_HAS_FIELD(comm, loom_comm, host_memory) && comm->host_memory;
    if (!host_comm && (st = cb_bind_current_device(b, err)) != LOOM_OK) return st;
    return cb_load_impl(b, m, quant, comm, NULL, err);
}

/* A stage that does not fit the model's L layers, or lacks a link it needs. */
static loom_status cb_check_stage(cuda_backend *b, const loom_model_view *m, const loom_stage *stage,
                                  const loom_comm *comm, loom_error *err) {
    const loom_host *h = b->host;
    loom_status st = loom_ww_check_stage(h, "backend cuda", m, stage, err);
    if (st != LOOM_OK) return st;
    /* host links come with host collectives (the executor's threads), which
     * cb_all_reduce stages through host memory; a communicator that does
     * not say so would be handed device buffers */
    const bool device_links = LOOM_HAS_FIELD(stage, loom_stage, device_links) && stage->device_links;
    const bool host_comm = comm && LOOM_HAS_FIELD(comm, loom_comm, host_memory) && comm->host_memory;
    if (comm && comm->size > 1 && !device_links && !host_comm)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: tensor parallelism inside a pipeline stage needs device links and "
                        "collectives (executor comm: nccl), or a communicator that says it takes host memory "
                        "(loom_comm.host_memory, ABI 2.9); this executor's has neither");
    return LOOM_OK;
}

/* Pipeline parallelism: keep `stage`'s layers (with `comm`, this rank's
 * shard of them) and move the residual stream through the stage's links
 * in forward() (cuda_forward.c). Device links (nccl): bind to the GPU the
 * executor made current, as load_shard. Host links (threads): stay on the
 * configured device — every stage may share one GPU. */
loom_status cb_load_stage(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                          const loom_stage *stage, const loom_comm *comm, loom_error *err) {
    cuda_backend *b = self;
    loom_status st;
    if (b->loaded)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cuda: load() called twice; create a new instance per model");
    if ((st = cb_check_stage(b, m, stage, comm, err))) return st;
    if (LOOM_HAS_FIELD(stage, loom_stage, device_links) && stage->device_links &&
        (st = cb_bind_current_device(b, err)) != LOOM_OK)
        return st;
    return cb_load_impl(b, m, quant, comm, stage, err);
}
