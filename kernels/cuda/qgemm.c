/*
 * kernels/cuda/qgemm.c — loom_cuda_qgemm_run: which kernels compute a
 * quantized linear layer at a given M, and the scratch they share.
 *
 *   M <= gemv bound (per format, loom_cuda_qgemm_set_gemv_max_m): the fused
 *     GEMV of qgemm.cu (GGUF: qgguf.cu, one launch per segment) in passes
 *     of 8 rows (W8A8 / FP8 first quantize the rows per token into scratch);
 *   W8A16 / INT4 from 9 to LC_QMMA_MAX_M rows, where qmma.cu takes the shape
 *     (K % 128; INT4 K % 256, group % 128) and not in batch-invariant mode:
 *     its tensor-core kernel, weights decoded in registers — ahead of the
 *     GEMV's passes too (one 8B layer at 16 rows: 133 vs 350 us);
 *   W8A16 / INT4 / GGUF otherwise above the bound: dequantize the whole
 *     weight into scratch as dt, then the dt GEMM (cuBLASLt). This costs one
 *     extra write and read of a dt copy of the weight per call — acceptable
 *     for prefill, where the GEMM's arithmetic dominates;
 *   FP8 / W8A8 above it: per chunk of up to LC_QCHUNK_M rows, quantize x per
 *     token, then cuBLASLt's e4m3 GEMM (fp32 accumulation) with sx and s as
 *     its outer scale vectors, written straight into y in one rounding
 *     (LC_LT_FP8_VEC_*) — for bf16 output from loom_cuda_qgemm_set_fp8_vec_min_m
 *     rows of the call (129): below them the vector-scaled kernels measure
 *     slower, and the unit-scale GEMM writes bf16 straight into y (f16 and
 *     f32 outputs, the LM head's, would add an f32 scratch round trip, not
 *     timed). Below those rows, where cuBLASLt has no algorithm for the
 *     vectors (or a test asks: lc_gemm_set_fp8_vec), and for int8 (int32
 *     accumulation), the GEMM runs with unit scales and lc_scale_epilogue
 *     multiplies row m / column n by sx[m] * s[n] in a second pass. That
 *     FP8 GEMM writes bf16 straight into y when dt is bf16 (rounding the
 *     unscaled sum is the same relative error as rounding the scaled one)
 *     and float32 into scratch otherwise (f16 would overflow on unscaled
 *     sums; the LM head wants float32).
 *     Should cuBLASLt have no algorithm for the shape (alignment), the GEMV
 *     runs in passes of 8 rows instead — slow but always correct.
 *
 * The activations W8A8 / FP8 quantize (lc_qin): x itself; or, for
 * loom_cuda_qgemm_swiglu_run, silu(gate) * up formed from a gate|up output;
 * or, for loom_cuda_qgemm_norm_run, rmsnorm(x += r) formed from the residual
 * stream — both rounded to dt as the separate kernels would store them, so
 * the codes are the same and nothing (M, K) is written.
 *
 * Scratch layout (each region 256-byte aligned): sx (chunk) f32 | xq
 * (chunk, K) bytes | big: the dequantized weight (N, K) dt, qmma.cu's
 * buffers (lc_qmma_scratch_bytes), or the GEMM output (chunk, N) f32 /
 * int32.
 */
#include <stdio.h>
#include <string.h>

#include "cuda_kernels.h"
#include "gemv.h" /* lc_epi_separate */
#include "qgemm.h"

static size_t lc_r256(size_t n) { return (n + 255) & ~(size_t)255; }

int loom_cuda_qweight_ok(loom_cuda_qfmt fmt, int K, int group) {
    switch (fmt) {
    case LOOM_CUDA_Q_INT8_W8A16:
    case LOOM_CUDA_Q_INT8_W8A8:
    case LOOM_CUDA_Q_FP8: return K > 0 && K % 16 == 0;
    case LOOM_CUDA_Q_INT4: return K > 0 && group > 0 && group % 32 == 0 && K % group == 0;
    case LOOM_CUDA_Q_GGUF: return K > 0 && K % 32 == 0; /* per segment: _valid */
    default: return 0;
    }
}

int loom_cuda_qweight_valid(const loom_cuda_qweight *w, char *why, size_t n) {
    if (!w || w->N <= 0 || !loom_cuda_qweight_ok(w->fmt, w->K, w->group)) {
        if (why && n)
            snprintf(why, n, "quantized weight (format %d, N=%d K=%d, group %d) breaks the "
                     "kernels' contract (K %% 16, INT4 group %% 32, GGUF K %% 32)",
                     w ? (int)w->fmt : -1, w ? w->N : 0, w ? w->K : 0, w ? w->group : 0);
        return 0;
    }
    if (w->fmt != LOOM_CUDA_Q_GGUF) return 1;
    if (w->nseg < 1 || w->nseg > LOOM_CUDA_QSEG_MAX) {
        if (why && n) snprintf(why, n, "GGUF weight with %d segments (1..%d)", w->nseg,
                               LOOM_CUDA_QSEG_MAX);
        return 0;
    }
    long rows = 0;
    for (int i = 0; i < w->nseg; i++) {
        const loom_cuda_qseg *sg = &w->seg[i];
        if (!loom_cuda_gguf_ok(sg->type, w->K) || sg->rows <= 0 || !sg->data ||
            ((uintptr_t)sg->data & 15)) {
            if (why && n)
                snprintf(why, n, "GGUF segment %d (type %s, %d rows, data %p) of a weight with "
                         "K=%d: the type must read K (a multiple of its block), rows > 0, data "
                         "16-byte aligned", i, loom_cuda_gguf_name(sg->type), sg->rows, sg->data,
                         w->K);
            return 0;
        }
        rows += sg->rows;
    }
    if (rows != w->N) {
        if (why && n) snprintf(why, n, "GGUF segments hold %ld rows, the weight N=%d", rows, w->N);
        return 0;
    }
    return 1;
}

static _Atomic long lc_fp8_vec_runs, lc_fp8_epi_runs;
void lc_qgemm_fp8_count(long *vec, long *epilogue) {
    *vec = lc_fp8_vec_runs;
    *epilogue = lc_fp8_epi_runs;
}
static _Atomic long lc_qmma_runs, lc_qtiled_runs;
long lc_qgemm_qmma_count(void) { return lc_qmma_runs; }
long lc_qgemm_qtiled_count(void) { return lc_qtiled_runs; }

static int lc_tiled(const loom_cuda_qweight *w) {
    return (w->fmt == LOOM_CUDA_Q_INT8_W8A16 || w->fmt == LOOM_CUDA_Q_INT4) && w->layout == LOOM_CUDA_QLAYOUT_TILED;
}
/* Whether a tiled weight runs qtiled.cu's kernel at M rows (else dequantize
 * + cuBLASLt): up to the tiled bound, at every M in batch-invariant mode. */
static int lc_tiled_kernel(const loom_cuda_gemm *g, int M) {
    return lc_gemm_invariant(g) || M <= lc_gemm_q_tiled_max_m(g);
}

static int lc_acts_quantized(loom_cuda_qfmt f) {
    return f == LOOM_CUDA_Q_INT8_W8A8 || f == LOOM_CUDA_Q_FP8;
}

/* Big-region bytes for a GEMM-path pass of `ch` rows. */
static size_t lc_big_bytes(loom_cuda_dt dt, int out_f32, const loom_cuda_qweight *w, int ch) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16:
    case LOOM_CUDA_Q_INT4:
    case LOOM_CUDA_Q_GGUF: return (size_t)w->N * (size_t)w->K * 2;
    case LOOM_CUDA_Q_INT8_W8A8: return (size_t)ch * (size_t)w->N * 4;
    case LOOM_CUDA_Q_FP8:
        return dt == LOOM_CUDA_BF16 && !out_f32 ? 0 : (size_t)ch * (size_t)w->N * 4;
    default: return 0;
    }
}

/* Whether qmma.cu's kernel computes W8A16 / INT4 at M rows (above the
 * GEMV's 8): its formats and shapes (lc_qmma_ok), on, and not the
 * batch-invariant mode (whose rows come from the GEMV at every M). */
static int lc_qmma_takes(const loom_cuda_gemm *g, const loom_cuda_qweight *w, int M) {
    return M > LC_QGEMV_MAX_M && !lc_gemm_invariant(g) && lc_qmma_ok(w, M);
}

/* (the need of a call at M = max_m is exactly what run() checks; it grows
 * with max_m, so the bytes for the largest M cover every smaller one) */
size_t loom_cuda_qgemm_scratch_bytes(const loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32,
                                     const loom_cuda_qweight *w, int max_m) {
    if (!w || w->fmt == LOOM_CUDA_Q_NONE || max_m <= 0) return 0;
    if (lc_tiled(w)) {
        /* the kernel's K-slice sums up to the bound, the dequantized copy above it */
        const int tm = lc_gemm_q_tiled_max_m(g);
        size_t big = lc_r256(lc_qtiled_scratch_bytes(w, max_m < LC_QT_MAX_M ? max_m : LC_QT_MAX_M));
        if (max_m > tm && !lc_gemm_invariant(g)) {
            const size_t d = lc_r256(lc_big_bytes(dt, out_f32, w, max_m));
            if (d > big) big = d;
        }
        return big;
    }
    const int ch = max_m < LC_QCHUNK_M ? max_m : LC_QCHUNK_M;
    size_t b = 0;
    if (lc_acts_quantized(w->fmt)) b += lc_r256((size_t)ch * 4) + lc_r256((size_t)ch * (size_t)w->K);
    /* the big region: the dequantized copy for the Ms that take that path,
     * qmma.cu's buffers for the Ms it takes (above the GEMV's 8 rows) */
    const int gm = lc_gemm_q_gemv_max_m(g, w->fmt);
    const int q = lc_qmma_takes(g, w, max_m < LC_QMMA_MAX_M ? max_m : LC_QMMA_MAX_M);
    /* dequantized: the Ms above the GEMV's bound that qmma.cu does not take
     * (all of them, or those above its rows, or those up to 8 when the
     * bound is set below 8) */
    const int deq = max_m > gm && (!q || gm < LC_QGEMV_MAX_M || max_m > LC_QMMA_MAX_M);
    size_t big = deq ? lc_r256(lc_big_bytes(dt, out_f32, w, ch)) : 0;
    if (q) {
        const size_t qb = lc_r256(lc_qmma_scratch_bytes(w, max_m));
        if (qb > big) big = qb;
    }
    b += big;
    return b;
}

int loom_cuda_qgemm_splits(const loom_cuda_gemm *g, loom_cuda_dt dt, const loom_cuda_qweight *w) {
    /* one row goes to the GEMV (lc_gemv_passes) when its bound admits it;
     * a tiled weight's row to qtiled.cu's kernel (0 here: the step decides
     * its SwiGLU fusion by the layout) */
    if (!w || w->fmt == LOOM_CUDA_Q_NONE || lc_tiled(w) || lc_gemm_q_gemv_max_m(g, w->fmt) < 1) return 0;
    return lc_qgemv_splits(dt, w, lc_gemm_invariant(g), lc_gemm_q_tc_min_m(g));
}

static int lc_cuda_fail(cudaError_t e, const char *what, const loom_cuda_qweight *w, int M,
                        char *msg, size_t n) {
    (void)cudaGetLastError(); /* reported here: not to be blamed on a later kernel */
    if (msg && n)
        snprintf(msg, n, "%s failed for quantized GEMM (format %d) M=%d N=%d K=%d: %s", what,
                 (int)w->fmt, M, w->N, w->K, cudaGetErrorString(e));
    return 10000 + (int)e;
}

/* The GEMV over rows [0, M) in passes of 8; xq / sx hold those rows'
 * quantized activations when the format needs them. With epi (M = 1, y
 * dt) its pair epilogue is fused where the kernel allows, and *fused says
 * so (else the caller runs the separate kernel). */
static int lc_gemv_passes(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                          const void *x, const uint8_t *xq, const float *sx, void *y, int invariant, int tc_min_m,
                          const loom_cuda_epi *epi, int *fused, cudaStream_t s, char *msg, size_t n) {
    const size_t xel = 2, yel = out_f32 ? 4 : 2;
    if (epi && epi->kind != LOOM_CUDA_EPI_NONE && M == 1 && !out_f32) {
        const cudaError_t e = lc_qgemv_epi(dt, w, x, xq, sx, y, epi, invariant, tc_min_m, s);
        if (e == cudaSuccess) {
            *fused = 1;
            return 0;
        }
        if (e != cudaErrorNotSupported) return lc_cuda_fail(e, "quantized GEMV (fused epilogue) launch", w, 1, msg, n);
        /* declined: nothing was launched, so no error state to clear */
    }
    for (int m0 = 0; m0 < M; m0 += LC_QGEMV_MAX_M) {
        const int mc = M - m0 < LC_QGEMV_MAX_M ? M - m0 : LC_QGEMV_MAX_M;
        const void *xm = (const uint8_t *)x + (size_t)m0 * w->K * xel;
        void *ym = (uint8_t *)y + (size_t)m0 * w->N * yel;
        cudaError_t e = w->fmt == LOOM_CUDA_Q_GGUF
                            ? lc_gguf_gemv(dt, out_f32, mc, w, xm, ym, s)
                            : lc_qgemv(dt, out_f32, mc, w, xm, xq ? xq + (size_t)m0 * w->K : NULL,
                                       sx ? sx + m0 : NULL, ym, invariant, tc_min_m, s);
        if (e != cudaSuccess) return lc_cuda_fail(e, "quantized GEMV launch", w, mc, msg, n);
    }
    return 0;
}

/* What the activation quantization of W8A8 / FP8 reads (the other formats
 * only ever get LC_IN_X: loom_cuda_qgemm_swiglu_run / _norm_run form their
 * input with the separate kernels first). */
typedef enum {
    LC_IN_X,      /* x (M, K) dt                                            */
    LC_IN_SWIGLU, /* x a gate|up output (M, 2K): silu(gate) * up            */
    LC_IN_NORM    /* rmsnorm(res (+)= r) with weight nw: the residual f32 */
} lc_in_kind;
typedef struct {
    lc_in_kind kind;
    float *res;       /* LC_IN_NORM: residual (M, K) f32, advanced when r */
    const float *nw;  /* norm weight (K) */
    float eps;
} lc_qin;

/* loom_cuda_qgemm_run with the input `in` says (x: dt input, or for
 * LC_IN_NORM the r added to the residual, may be NULL). */
static int lc_qgemm(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                    const void *x, const lc_qin *in, void *y, const loom_cuda_epi *epi, int *fused,
                    void *scratch, size_t scratch_bytes, cudaStream_t s, char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    out_f32 = out_f32 ? 1 : 0;
    if (M != 1) epi = NULL; /* a one-row call only (not the last one-row chunk of a longer one) */
    if (!loom_cuda_qweight_valid(w, msg, msg_size)) return 10000 + (int)cudaErrorInvalidValue;
    const size_t need = loom_cuda_qgemm_scratch_bytes(g, dt, out_f32, w, M);
    if (scratch_bytes < need) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "quantized GEMM M=%d N=%d K=%d needs %zu bytes of scratch, "
                     "got %zu", M, w->N, w->K, need, scratch_bytes);
        return 10000 + (int)cudaErrorInvalidValue;
    }
    const int acts = lc_acts_quantized(w->fmt);
    const int ch_max = M < LC_QCHUNK_M ? M : LC_QCHUNK_M;
    uint8_t *sp = scratch;
    float *sx = acts ? (float *)sp : NULL;
    uint8_t *xq = acts ? sp + lc_r256((size_t)ch_max * 4) : NULL;
    uint8_t *big = sp + (acts ? lc_r256((size_t)ch_max * 4) + lc_r256((size_t)ch_max * w->K) : 0);
    const int gemv_max = lc_gemm_q_gemv_max_m(g, w->fmt);
    const int invariant = lc_gemm_invariant(g), tc_min_m = lc_gemm_q_tc_min_m(g);
    cudaError_t e;
    int rc;

    if (lc_tiled(w)) {
        /* tiled weights: qtiled.cu's kernel up to the bound (in chunks of
         * its 256 rows), or dequantize + cuBLASLt above it; a one-row call's
         * pair epilogue where its K-split reduce takes it (else
         * *fused stays 0: the caller runs the separate kernel) */
        if (lc_tiled_kernel(g, M)) {
            const size_t yel = out_f32 ? 4 : 2;
            for (int m0 = 0; m0 < M; m0 += LC_QT_MAX_M) {
                const int mc = M - m0 < LC_QT_MAX_M ? M - m0 : LC_QT_MAX_M;
                int fz = 0;
                if ((e = lc_qtiled(dt, out_f32, mc, w, (const uint8_t *)x + (size_t)m0 * w->K * 2,
                                   (uint8_t *)y + (size_t)m0 * w->N * yel, big, invariant,
                                   lc_gemm_q_tiled_wg_min_m(g), epi, &fz, s)) != cudaSuccess)
                    return lc_cuda_fail(e, "tiled quantized GEMM launch", w, mc, msg, msg_size);
                lc_qtiled_runs++;
                if (fz) *fused = 1, lc_epi_count();
            }
            return 0;
        }
        if ((e = lc_qtiled_dequant(dt, w, big, s)) != cudaSuccess)
            return lc_cuda_fail(e, "tiled dequantize kernel launch", w, M, msg, msg_size);
        return lc_gemm_run_lt(g, dt, out_f32, M, w->N, w->K, x, big, y, s, msg, msg_size);
    }
    if (!acts) {
        /* above 8 rows the tensor-core kernel with the decode in registers
         * where it takes the shape (it beats passes of the GEMV: one
         * Llama-3-8B layer at M = 16 on the H200, W8A16 133 vs 349 us, INT4
         * 133 vs 358), else the GEMV up to its bound */
        if (lc_qmma_takes(g, w, M)) {
            if ((e = lc_qmma(dt, out_f32, M, w, x, y, big, s)) != cudaSuccess)
                return lc_cuda_fail(e, "tensor-core quantized GEMM launch", w, M, msg, msg_size);
            lc_qmma_runs++;
            return 0;
        }
        if (M <= gemv_max)
            return lc_gemv_passes(dt, out_f32, M, w, x, NULL, NULL, y, invariant, tc_min_m, epi, fused, s, msg,
                                  msg_size);
        /* dequantize into scratch, then the dt GEMM (never its GEMV: M > 8) */
        e = w->fmt == LOOM_CUDA_Q_GGUF ? lc_gguf_dequant(dt, w, big, s)
                                       : lc_dequant_weight(dt, w, big, s);
        if (e != cudaSuccess)
            return lc_cuda_fail(e, "dequantize kernel launch", w, M, msg, msg_size);
        return lc_gemm_run_lt(g, dt, out_f32, M, w->N, w->K, x, big, y, s, msg, msg_size);
    }

    /* W8A8 / FP8: per chunk of rows, quantize x, then GEMV passes or GEMM */
    const size_t xel = 2, yel = out_f32 ? 4 : 2;
    const int fp8 = w->fmt == LOOM_CUDA_Q_FP8;
    for (int m0 = 0; m0 < M; m0 += ch_max) {
        const int mc = M - m0 < ch_max ? M - m0 : ch_max;
        const void *xc = x ? (const uint8_t *)x + (size_t)m0 * w->K * xel * (in->kind == LC_IN_SWIGLU ? 2 : 1) : NULL;
        void *yc = (uint8_t *)y + (size_t)m0 * w->N * yel;
        e = in->kind == LC_IN_NORM
                ? lc_add_rmsnorm_quant(dt, fp8, in->res + (size_t)m0 * w->K, xc, in->nw, mc, w->K,
                                       in->eps, w->smooth, xq, sx, s)
                : lc_quant_act(dt, fp8, in->kind == LC_IN_SWIGLU, mc, w->K, xc, w->smooth, xq, sx, s);
        if (e != cudaSuccess)
            return lc_cuda_fail(e, in->kind == LC_IN_NORM ? "RMSNorm + activation quantization launch (K % 8, K <= 32768)"
                                   : in->kind == LC_IN_SWIGLU ? "SwiGLU + activation quantization launch (K % 8)"
                                                              : "activation quantization launch (K % 8, x 16-byte aligned)",
                                w, mc, msg, msg_size);
        if (M <= gemv_max) {
            if ((rc = lc_gemv_passes(dt, out_f32, mc, w, NULL, xq, sx, yc, invariant, tc_min_m, epi, fused, s, msg,
                                     msg_size)))
                return rc;
            continue;
        }
        /* FP8 with the scales applied by cuBLASLt, straight into y */
        if (fp8 && lc_gemm_fp8_vec(g) &&
            (M >= lc_gemm_fp8_vec_min_m(g) || dt != LOOM_CUDA_BF16 || out_f32)) {
            const int vk = out_f32 ? LC_LT_FP8_VEC_F32
                                   : dt == LOOM_CUDA_BF16 ? LC_LT_FP8_VEC_BF16 : LC_LT_FP8_VEC_F16;
            rc = lc_gemm_lt_q(g, vk, mc, w->N, w->K, xq, w->data, sx, w->scales, yc, s, msg, msg_size);
            if (rc != LC_LT_NOT_SUPPORTED) {
                if (rc) return rc;
                lc_fp8_vec_runs++;
                continue;
            }
            /* no algorithm for the scale vectors at this shape */
        }
        const int kind = fp8 ? (dt == LOOM_CUDA_BF16 && !out_f32 ? LC_LT_FP8_BF16 : LC_LT_FP8_F32)
                             : LC_LT_I8_I32;
        void *d = kind == LC_LT_FP8_BF16 ? yc : big;
        rc = lc_gemm_lt_q(g, kind, mc, w->N, w->K, xq, w->data, NULL, NULL, d, s, msg, msg_size);
        if (rc == LC_LT_NOT_SUPPORTED) { /* no algorithm for this shape */
            if ((rc = lc_gemv_passes(dt, out_f32, mc, w, NULL, xq, sx, yc, invariant, tc_min_m, NULL, NULL, s, msg,
                                     msg_size)))
                return rc;
            continue;
        }
        if (rc) return rc;
        if (fp8) lc_fp8_epi_runs++;
        const int in_kind = kind == LC_LT_FP8_BF16 ? 0 : kind == LC_LT_I8_I32 ? 2 : 1;
        if ((e = lc_scale_epilogue(dt, in_kind, d, out_f32, yc, sx, w->scales, mc, w->N, s)) !=
            cudaSuccess)
            return lc_cuda_fail(e, "scale epilogue launch", w, mc, msg, msg_size);
    }
    return 0;
}

static const lc_qin lc_in_x = {.kind = LC_IN_X};

int loom_cuda_qgemm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M,
                        const loom_cuda_qweight *w, const void *x, void *y, void *scratch,
                        size_t scratch_bytes, cudaStream_t s, char *msg, size_t msg_size) {
    return lc_qgemm(g, dt, out_f32, M, w, x, &lc_in_x, y, NULL, NULL, scratch, scratch_bytes, s, msg, msg_size);
}

int loom_cuda_qgemm_norm_epi_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w, float *x,
                                 const void *r, const float *norm_w, float eps, void *xn, void *y,
                                 const loom_cuda_epi *epi, void *scratch, size_t scratch_bytes, cudaStream_t s,
                                 char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    if (!w) {
        if (msg && msg_size) snprintf(msg, msg_size, "RMSNorm + quantized GEMM: no weight");
        return 10000 + (int)cudaErrorInvalidValue;
    }
    int fused = 0, rc;
    if (lc_acts_quantized(w->fmt)) {
        const lc_qin in = {.kind = LC_IN_NORM, .res = x, .nw = norm_w, .eps = eps};
        rc = lc_qgemm(g, dt, 0, M, w, r, &in, y, epi, &fused, scratch, scratch_bytes, s, msg, msg_size);
    } else {
        const cudaError_t e = loom_cuda_add_rmsnorm(dt, xn, x, r, norm_w, NULL, M, w->K, eps, s);
        if (e != cudaSuccess) {
            if (msg && msg_size) snprintf(msg, msg_size, "add_rmsnorm launch failed: %s", cudaGetErrorString(e));
            return 10000 + (int)e;
        }
        rc = lc_qgemm(g, dt, 0, M, w, xn, &lc_in_x, y, epi, &fused, scratch, scratch_bytes, s, msg, msg_size);
    }
    if (rc || fused || !epi || epi->kind == LOOM_CUDA_EPI_NONE) return rc;
    return lc_epi_separate(dt, M, w->N, y, epi, s, msg, msg_size);
}

int loom_cuda_qgemm_norm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w,
                             float *x, const void *r, const float *norm_w, float eps, void *xn, void *y,
                             void *scratch, size_t scratch_bytes, cudaStream_t s, char *msg,
                             size_t msg_size) {
    return loom_cuda_qgemm_norm_epi_run(g, dt, M, w, x, r, norm_w, eps, xn, y, NULL, scratch, scratch_bytes, s, msg,
                                        msg_size);
}

int loom_cuda_qgemm_swiglu_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w,
                               const void *gu, void *act, void *y, void *scratch,
                               size_t scratch_bytes, cudaStream_t s, char *msg, size_t msg_size) {
    if (M <= 0) return 0;
    if (w && lc_acts_quantized(w->fmt))
        return lc_qgemm(g, dt, 0, M, w, gu, &(const lc_qin){.kind = LC_IN_SWIGLU}, y, NULL, NULL, scratch,
                        scratch_bytes, s, msg, msg_size);
    if (!w || w->K % 8) {
        if (msg && msg_size) snprintf(msg, msg_size, "SwiGLU + quantized GEMM: %s", w ? "K % 8 != 0" : "no weight");
        return 10000 + (int)cudaErrorInvalidValue;
    }
    const cudaError_t e = loom_cuda_swiglu(dt, act, gu, M, w->K, s);
    if (e != cudaSuccess) {
        if (msg && msg_size) snprintf(msg, msg_size, "swiglu launch failed: %s", cudaGetErrorString(e));
        return 10000 + (int)e;
    }
    return lc_qgemm(g, dt, 0, M, w, act, &lc_in_x, y, NULL, NULL, scratch, scratch_bytes, s, msg, msg_size);
}
