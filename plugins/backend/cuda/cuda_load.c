/*
 * plugins/backend/cuda/cuda_load.c — the cuda backend's load(): every
 * weight to the device in the compute type, the RoPE table, and the work
 * buffers forward() will use.
 *
 * Weights stream tensor by tensor, never the whole model on the host in
 * float32: a tensor already in the compute type is copied straight from the
 * model's (often mmap'd) memory; anything else is dequantized row by row
 * through host->dequantize, rounded to bf16/f16 (or kept float32 for norms
 * and biases) into one of two pinned staging buffers by a few threads, and
 * uploaded asynchronously while the other buffer fills. Q/K/V and gate/up
 * land at their row offsets in the fused matrices, so fusing costs nothing.
 *
 * Every tensor (and the quantizer's plan for each linear weight) is checked
 * before anything is allocated; the device arena is sized exactly and
 * checked against cudaMemGetInfo first, so running out of device memory is
 * an error with numbers, not a crash half-way.
 */
#include "cuda_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define CB_ALIGN 256                 /* bytes: every weight starts here       */
#define CB_STAGE_BYTES ((size_t)32 << 20) /* per pinned staging buffer       */
#define CB_MAX_THREADS 16            /* dequantizing threads                  */
#define CB_ATTN_WS_FLOATS ((size_t)4 << 20) /* split-K workspace (16 MiB)    */

static size_t cb_round(size_t n) { return (n + CB_ALIGN - 1) & ~(size_t)(CB_ALIGN - 1); }
static double cb_mib(size_t n) { return (double)n / (1024.0 * 1024.0); }

/* ------------------------------------------------------ host conversions */

static inline uint32_t cb_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t cb_f32_to_bf16(float f) {
    uint32_t x = cb_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* float32 -> IEEE binary16, round to nearest even, overflow to inf. */
static inline uint16_t cb_f32_to_f16(float f) {
    uint32_t x = cb_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)
        return (uint16_t)(sign | (x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) {
        float a;
        memcpy(&a, &x, 4);
        float r = a + 0.5f;
        uint32_t rb;
        memcpy(&rb, &r, 4);
        return (uint16_t)(sign | (rb - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000000u + 0xfffu + odd;
    return (uint16_t)(sign | (x >> 13));
}

/* ------------------------------------------------------------- checking */

static const char *cb_qformat_name(loom_qformat f) {
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

/* Fetch `name` and check it is host data of shape (d0) (d1 < 0) or
 * (d0, d1). A missing optional tensor gives *out = NULL and LOOM_OK. */
static loom_status cb_tensor(cuda_backend *b, const loom_model_view *m, const char *name,
                             int64_t d0, int64_t d1, bool required, const loom_tensor **out,
                             loom_error *err) {
    const loom_host *h = b->host;
    const loom_tensor *t = m->get(m->ctx, name);
    *out = NULL;
    if (!t) {
        if (!required) return LOOM_OK;
        return h->error(h->ctx, err, LOOM_ERR_NOT_FOUND,
                        "backend cuda: model '%s' has no tensor '%s' (arch needs it); is the file "
                        "complete and of a Llama-family architecture?",
                        b->mc.name, name);
    }
    int ndim = d1 < 0 ? 1 : 2;
    bool shape_ok = t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1);
    if (!shape_ok)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "backend cuda: tensor '%s' has shape (%lld, %lld) [%d dims], the config "
                        "implies (%lld%s%lld)",
                        name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                        t->ndim, (long long)d0, ndim == 1 ? "" : ", ",
                        (long long)(ndim == 1 ? 0 : d1));
    int64_t cols = ndim == 1 ? d0 : d1, rows = ndim == 1 ? 1 : d0;
    size_t row_bytes = loom_dtype_row_bytes(t->dtype, cols);
    if (t->device != LOOM_DEVICE_HOST || !t->data || row_bytes == 0 ||
        t->nbytes < row_bytes * (size_t)rows)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "backend cuda: tensor '%s' (%s, %zu bytes, device %d) is not host data of "
                        "%lld rows x %zu bytes",
                        name, loom_dtype_name(t->dtype), t->nbytes, (int)t->device,
                        (long long)rows, row_bytes);
    *out = t;
    return LOOM_OK;
}

/* Ask the quantizer (if any) for a linear weight's plan: only NONE runs here. */
static loom_status cb_check_plan(cuda_backend *b, const loom_model_view *m,
                                 const loom_quant_binding *q, const loom_tensor *t,
                                 const char *name, loom_error *err) {
    if (!q || !q->ops || !q->ops->plan) return LOOM_OK;
    loom_quant_plan plan = {.struct_size = sizeof plan, .format = LOOM_QFMT_NONE};
    loom_status st = q->ops->plan(q->self, m, t, &plan, err);
    if (st != LOOM_OK) return st;
    if (plan.format != LOOM_QFMT_NONE)
        return b->host->error(
            b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
            "backend cuda: quantizer '%s' planned format %s for tensor '%s', but the cuda backend "
            "has no %s linear kernel yet (it runs %s weights, format none); drop the quantizer "
            "from the pipeline",
            q->name ? q->name : "?", cb_qformat_name(plan.format), name,
            cb_qformat_name(plan.format), loom_dtype_name(b->ldt));
    return LOOM_OK;
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
    uint8_t *dst;           /* staging                                      */
    int out;                /* 0 bf16, 1 f16, 2 f32                          */
    float *rowbuf;          /* this worker's row                            */
    int64_t r0, r1;         /* rows of the chunk this worker converts        */
    atomic_int *failed;
} cb_conv_job;

static void *cb_conv_main(void *arg) {
    cb_conv_job *j = arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        float *f = j->out == 2 ? (float *)(j->dst + (size_t)r * j->cols * 4) : j->rowbuf;
        if (j->host->dequantize(j->host->ctx, j->t->dtype, j->src + (size_t)r * j->src_row_bytes,
                                f, j->cols) != LOOM_OK) {
            atomic_store(j->failed, 1);
            return NULL;
        }
        if (j->out == 2) continue;
        uint16_t *d = (uint16_t *)(j->dst + (size_t)r * j->cols * 2);
        if (j->out == 0)
            for (int64_t c = 0; c < j->cols; c++) d[c] = cb_f32_to_bf16(f[c]);
        else
            for (int64_t c = 0; c < j->cols; c++) d[c] = cb_f32_to_f16(f[c]);
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
 * dt (out_f32 = false) or float32. Asynchronous on b->stream; the staging
 * buffers are reused only after their previous upload finished. */
static loom_status cb_upload(cb_uploader *u, const loom_tensor *t, int64_t rows, int64_t cols,
                             void *dst, bool out_f32, loom_error *err) {
    cuda_backend *b = u->b;
    const loom_host *h = b->host;
    loom_status st;
    const size_t oel = out_f32 ? 4 : b->elt;
    const bool same = out_f32 ? t->dtype == LOOM_DTYPE_F32 : t->dtype == b->ldt;
    if (same) /* straight from the model's memory: pageable, staged by the driver */
        return CB_CUDA(b, err, cudaMemcpyAsync(dst, t->data, (size_t)rows * (size_t)cols * oel,
                                               cudaMemcpyHostToDevice, b->stream));
    const size_t src_row = loom_dtype_row_bytes(t->dtype, cols);
    const size_t dst_row = (size_t)cols * oel;
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
                                    .dst = u->stage[s],
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

/* ----------------------------------------------------------------- RoPE */

/* Rotary frequencies, float64 — the same formula as kernels/cpu/rope.c
 * (Hugging Face's default, linear and llama3 rope_type), so both backends
 * rotate by identical angles. */
static void cb_rope_inv_freq(double *inv_freq, const loom_model_config *c) {
    const int32_t hd = c->head_dim, half = hd / 2;
    const double theta = c->rope_theta, factor = c->rope_factor;
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

static loom_status cb_rope_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    loom_status st;
    int64_t max_pos = b->cfg.max_positions > 0 ? b->cfg.max_positions : c->max_context;
    if (max_pos <= 0) max_pos = 8192;
    const int half = c->head_dim / 2;
    double *inv = h->alloc(h->ctx, (size_t)half * sizeof(double));
    double *inv_dev = NULL;
    if (!inv) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
    cb_rope_inv_freq(inv, c);
    if (!(st = CB_CUDA(b, err, cudaMalloc((void **)&b->rope_cs, (size_t)max_pos * half * 2 * sizeof(float)))) &&
        !(st = CB_CUDA(b, err, cudaMalloc((void **)&inv_dev, (size_t)half * sizeof(double)))) &&
        !(st = CB_CUDA(b, err, cudaMemcpyAsync(inv_dev, inv, (size_t)half * sizeof(double),
                                               cudaMemcpyHostToDevice, b->stream))) &&
        !(st = CB_CUDA(b, err, loom_cuda_rope_table(b->rope_cs, inv_dev, (int)max_pos, half,
                                                    b->stream))))
        st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream));
    cudaFree(inv_dev);
    h->free(h->ctx, inv);
    if (st == LOOM_OK) b->rope_max_pos = (int32_t)max_pos;
    return st;
}

/* ---------------------------------------------------------- work buffers */

static loom_status cb_work_init(cuda_backend *b, loom_error *err) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    loom_status st;
    const size_t MT = (size_t)b->cfg.max_batched_tokens, H = (size_t)c->hidden_size;
    const size_t I = (size_t)c->intermediate_size, V = (size_t)c->vocab_size, e = b->elt;
    b->max_tokens = (int32_t)MT;
    b->logits_rows = MT < CB_LOGITS_ROWS ? (int32_t)MT : CB_LOGITS_ROWS;
    const size_t LR = (size_t)b->logits_rows;
    size_t sz[11] = {MT * H * 4,      MT * H * e,  MT * (size_t)b->qkv_rows * e,
                     MT * (size_t)b->q_dim * e, MT * H * e, MT * 2 * I * e, MT * I * e,
                     LR * H * e,      LR * V * 4,  CB_ATTN_WS_FLOATS * 4,
                     MT * (size_t)c->num_kv_heads * sizeof(int)};
    size_t total = 0;
    for (int i = 0; i < 11; i++) total += cb_round(sz[i]);
    size_t free_b = 0, tot = 0;
    if ((st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &tot)))) return st;
    if (total > free_b)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cuda: work buffers for max_batched_tokens = %lld need %.1f MiB, "
                        "device %d has %.1f MiB free after the weights; lower the backend's "
                        "max_batched_tokens (and scheduler.max_batched_tokens with it)",
                        (long long)MT, cb_mib(total), b->device, cb_mib(free_b));
    if ((st = CB_CUDA(b, err, cudaMalloc(&b->work, total)))) return st;
    uint8_t *p = b->work;
    void **dst[11] = {(void **)&b->x, &b->xn, &b->qkv, &b->att, &b->r, &b->gu, &b->act, &b->xs,
                      (void **)&b->logits_dev, (void **)&b->attn_ws, (void **)&b->attn_sem};
    for (int i = 0; i < 11; i++) {
        *dst[i] = p;
        p += cb_round(sz[i]);
    }
    /* the split-K counters start at zero; the attention kernel leaves them so */
    if ((st = CB_CUDA(b, err, cudaMemsetAsync(b->attn_sem, 0, sz[10], b->stream))) ||
        (st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream))))
        return st;
    b->attn_ws_floats = CB_ATTN_WS_FLOATS;
    for (int k = 0; k < 2; k++) {
        int per_sm = loom_cuda_attn_ctas_per_sm(b->dt, (loom_cuda_attn_shape)k, c->head_dim);
        b->attn_resident[k] = (per_sm > 0 ? per_sm : 1) * b->num_sms;
    }
    if ((st = CB_CUDA(b, err, cudaHostAlloc((void **)&b->logits_host, LR * V * 4,
                                            cudaHostAllocDefault))))
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

static const char *const cb_lin[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                     "ffn_gate", "ffn_up", "ffn_down"};

loom_status cb_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                    loom_error *err) {
    cuda_backend *b = self;
    const loom_host *h = b->host;
    loom_status st = LOOM_OK;
    char name[96];
    if (b->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cuda: load() called twice; create a new instance per model");
    if (!m || !m->config || !m->get)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cuda: load() needs a model view");
    b->mc = *m->config;
    const loom_model_config *c = &b->mc;
    if (c->arch != LOOM_ARCH_LLAMA && c->arch != LOOM_ARCH_QWEN2)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' has architecture %d; only llama (0) and qwen2 "
                        "(1) run here",
                        c->name, (int)c->arch);
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 ||
        c->num_layers <= 0 || c->num_heads <= 0 || c->num_kv_heads <= 0 ||
        c->num_heads % c->num_kv_heads != 0 || !LOOM_CUDA_HEAD_DIM_OK(c->head_dim) ||
        c->hidden_size % 8 != 0 || c->intermediate_size % 8 != 0 ||
        c->hidden_size > 32768 || c->num_heads / c->num_kv_heads > LOOM_CUDA_MAX_GQA ||
        !(c->rms_norm_eps >= 0) || !(c->rope_theta > 0))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cuda: model '%s' config not runnable here (vocab %d, hidden %d: "
                        "multiple of 8 and <= 32768, ffn %d: multiple of 8, layers %d, heads %d/%d "
                        "kv: a multiple, at most %d per kv head, head_dim %d: one of 16, 32, 64, "
                        "128, rope_theta %g > 0)",
                        c->name, c->vocab_size, c->hidden_size, c->intermediate_size,
                        c->num_layers, c->num_heads, c->num_kv_heads, LOOM_CUDA_MAX_GQA,
                        c->head_dim, (double)c->rope_theta);
    if (c->rope_scaling == LOOM_ROPE_SCALING_LLAMA3 &&
        !(c->rope_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
          c->rope_low_freq_factor > 0 && c->rope_original_context > 0))
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "backend cuda: model '%s' asks for llama3 RoPE scaling with factor %g, "
                        "low/high freq factors %g/%g, original context %d: need factor > 0, "
                        "0 < low < high, context > 0",
                        c->name, (double)c->rope_factor, (double)c->rope_low_freq_factor,
                        (double)c->rope_high_freq_factor, c->rope_original_context);
    if ((st = CB_CUDA(b, err, cudaSetDevice(b->device)))) return st;

    const int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    const int32_t L = c->num_layers;
    b->q_dim = c->num_heads * c->head_dim;
    b->kv_dim = c->num_kv_heads * c->head_dim;
    b->qkv_rows = b->q_dim + 2 * b->kv_dim;
    b->group = c->num_heads / c->num_kv_heads;
    const int64_t QKV = b->qkv_rows, QD = b->q_dim, KVD = b->kv_dim;
    const size_t e = b->elt;

    /* --- check every tensor (and the quantizer's plan) before allocating */
    const loom_tensor *t_embed, *t_onorm, *t_out, *t_probe;
    if ((st = cb_tensor(b, m, "token_embd.weight", V, H, true, &t_embed, err)) ||
        (st = cb_tensor(b, m, "output_norm.weight", H, -1, true, &t_onorm, err)) ||
        (st = cb_tensor(b, m, "output.weight", V, H, false, &t_out, err)))
        return st;
    if (!t_out && !c->tie_embeddings)
        h->log(h->ctx, LOOM_LOG_WARN, CB_WHO,
               "model '%s' has no output.weight and tie_embeddings is false; using the token "
               "embeddings as the LM head",
               c->name);
    if (t_out && (st = cb_check_plan(b, m, quant, t_out, "output.weight", err))) return st;
    if ((st = cb_tensor(b, m, "blk.0.attn_q.bias", QD, -1, false, &t_probe, err))) return st;
    const bool bias = c->qkv_bias || t_probe != NULL;
    const int64_t lin_shape[7][2] = {{QD, H}, {KVD, H}, {KVD, H}, {H, QD},
                                     {I, H},  {I, H},   {H, I}};
    for (int32_t l = 0; l < L; l++) {
        const loom_tensor *t;
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, cb_lin[k]);
            if ((st = cb_tensor(b, m, name, lin_shape[k][0], lin_shape[k][1], true, &t, err)) ||
                (st = cb_check_plan(b, m, quant, t, name, err)))
                return st;
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = cb_tensor(b, m, name, H, -1, true, &t, err))) return st;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = cb_tensor(b, m, name, H, -1, true, &t, err))) return st;
        for (int k = 0; bias && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, cb_lin[k]);
            if ((st = cb_tensor(b, m, name, k == 0 ? QD : KVD, -1, true, &t, err))) return st;
        }
    }

    /* --- one device arena, carved in this order below */
    const size_t per_layer = 2 * cb_round((size_t)H * 4) + cb_round((size_t)(QKV * H) * e) +
                             (bias ? cb_round((size_t)QKV * 4) : 0) +
                             cb_round((size_t)(H * QD) * e) + cb_round((size_t)(2 * I * H) * e) +
                             cb_round((size_t)(H * I) * e);
    b->weight_bytes = cb_round((size_t)(V * H) * e) * (t_out ? 2 : 1) + cb_round((size_t)H * 4) +
                      per_layer * (size_t)L;
    size_t free_b = 0, total = 0;
    if ((st = CB_CUDA(b, err, cudaMemGetInfo(&free_b, &total)))) return st;
    if (b->weight_bytes > free_b) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                      "backend cuda: weights of '%s' need %.1f MiB in %s but device %d (%s) has "
                      "%.1f MiB free of %.1f MiB; use a smaller model or another device",
                      c->name, cb_mib(b->weight_bytes), loom_dtype_name(b->ldt), b->device,
                      b->device_name, cb_mib(free_b), cb_mib(total));
        b->weight_bytes = 0;
        return st;
    }
    b->layers = h->calloc(h->ctx, (size_t)L, sizeof *b->layers);
    if (!b->layers) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cuda: out of host memory");
        goto fail;
    }
    if ((st = CB_CUDA(b, err, cudaMalloc(&b->weights, b->weight_bytes)))) goto fail;

    cb_uploader up;
    int64_t max_cols = H > I ? H : I;
    if (QD > max_cols) max_cols = QD;
    if ((st = cb_uploader_init(b, &up, max_cols, err))) {
        cb_uploader_free(&up);
        goto fail;
    }
    uint8_t *cur = b->weights;
#define CB_CARVE(bytes) (cur += cb_round(bytes), (void *)(cur - cb_round(bytes)))
    b->embed = CB_CARVE((size_t)(V * H) * e);
    b->out_norm = CB_CARVE((size_t)H * 4);
    b->lm_head = b->embed;
    if ((st = cb_upload(&up, t_embed, V, H, b->embed, false, err)) ||
        (st = cb_upload(&up, t_onorm, 1, H, b->out_norm, true, err)))
        goto fail_up;
    if (t_out) {
        b->lm_head = CB_CARVE((size_t)(V * H) * e);
        if ((st = cb_upload(&up, t_out, V, H, b->lm_head, false, err))) goto fail_up;
    }
    for (int32_t l = 0; l < L; l++) {
        cuda_layer *ly = &b->layers[l];
        ly->attn_norm = CB_CARVE((size_t)H * 4);
        ly->wqkv = CB_CARVE((size_t)(QKV * H) * e);
        ly->bqkv = bias ? CB_CARVE((size_t)QKV * 4) : NULL;
        ly->wo = CB_CARVE((size_t)(H * QD) * e);
        ly->ffn_norm = CB_CARVE((size_t)H * 4);
        ly->wgu = CB_CARVE((size_t)(2 * I * H) * e);
        ly->wdown = CB_CARVE((size_t)(H * I) * e);
        /* destinations in the order of cb_lin[]: Q, K, V rows of the fused
         * matrix, O, then gate and up rows of the fused FFN input */
        uint8_t *qkv = ly->wqkv, *gu = ly->wgu;
        void *dst[7] = {qkv, qkv + (size_t)(QD * H) * e, qkv + (size_t)((QD + KVD) * H) * e,
                        ly->wo, gu, gu + (size_t)(I * H) * e, ly->wdown};
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, cb_lin[k]);
            if ((st = cb_upload(&up, m->get(m->ctx, name), lin_shape[k][0], lin_shape[k][1],
                                dst[k], false, err)))
                goto fail_up;
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = cb_upload(&up, m->get(m->ctx, name), 1, H, ly->attn_norm, true, err)))
            goto fail_up;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = cb_upload(&up, m->get(m->ctx, name), 1, H, ly->ffn_norm, true, err)))
            goto fail_up;
        for (int k = 0; bias && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, cb_lin[k]);
            float *bd = ly->bqkv + (k == 0 ? 0 : QD + (k - 1) * KVD);
            if ((st = cb_upload(&up, m->get(m->ctx, name), 1, k == 0 ? QD : KVD, bd, true, err)))
                goto fail_up;
        }
    }
#undef CB_CARVE
    if ((st = CB_CUDA(b, err, cudaStreamSynchronize(b->stream)))) goto fail_up;
    cb_uploader_free(&up);

    if ((st = cb_rope_init(b, err)) || (st = cb_work_init(b, err))) goto fail;
    b->loaded = true;
    if (h->metric_set) h->metric_set(h->ctx, "backend.cuda.weight_bytes", (double)b->weight_bytes);
    h->log(h->ctx, LOOM_LOG_INFO, CB_WHO, "loaded '%s': %d layers, %.1f MiB %s weights%s%s",
           c->name, L, cb_mib(b->weight_bytes), loom_dtype_name(b->ldt),
           t_out ? "" : " (tied LM head)", bias ? ", QKV bias" : "");
    return LOOM_OK;

fail_up:
    cb_uploader_free(&up);
fail:
    cudaStreamSynchronize(b->stream);
    cudaFree(b->weights);
    cudaFree(b->rope_cs);
    cudaFree(b->work);
    cudaFree(b->meta_dev);
    if (b->meta_host) cudaFreeHost(b->meta_host);
    if (b->logits_host) cudaFreeHost(b->logits_host);
    h->free(h->ctx, b->layers);
    b->weights = b->work = NULL;
    b->rope_cs = NULL;
    b->meta_dev = b->meta_host = NULL;
    b->logits_host = NULL;
    b->layers = NULL;
    b->weight_bytes = 0;
    return st;
}
