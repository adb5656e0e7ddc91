/*
 * kernels/cpu/qlinear.h — CPU linear layers on quantized weights:
 *     y (M, N) = x (M, K) @ W^T  [+ bias]  [+ beta * y]
 * for every weight format of loom/quant.h:
 *   INT8_W8A16  int8 (N, K), f32 scale per row; dequantization fused.
 *   INT8_W8A8   the same weights; each token of x is quantized to int8 on
 *               the fly (symmetric, dynamic per token: sx = max|x| / 127,
 *               xq = rint(x * (127 / max|x|)) in float32), products
 *               accumulate in int32 and are scaled by sx * scale[row] at
 *               the end. With a SmoothQuant vector, x / smooth is quantized.
 *   FP8_W8A8    E4M3 (N, K), scale per row or per tensor; each token is
 *               quantized to E4M3 (sx = max|x| / 448, code = e4m3(x / sx)),
 *               products of decoded values accumulate in fp32 (an emulation
 *               of an FP8 tensor-core GEMM), scaled by sx * scale at the end.
 *               With a SmoothQuant vector, x / smooth is quantized.
 *   INT4_W4A16  U8 (N, K/2) nibbles (low = even column), f32 scale and zero
 *               per (row, group): w = (q - zero) * scale; unpack fused.
 *   GGUF        rows of q4_0 / q4_1 / q5_0 / q4_k / q5_k / q8_0 / q6_k blocks as stored;
 *               each token is quantized to 8-bit blocks of 32 (q8dot.h:
 *               scale max|x| / 127 per block) and dotted with the blocks in
 *               int32, as llama.cpp does, at every M (so a token's result
 *               does not depend on the batch it is in). On AVX-512 VNNI the
 *               block types go in 16-row tiles at every M (q8dot.h).
 *
 * How: rows of W are spread over the pool. At M <= 4 (decode) each row is
 * decoded 16/32 weights at a time straight into vector registers and
 * multiplied with every token (the weight bytes stream once). At larger M a
 * thread decodes a tile of a few rows (~8 KiB of float32) and runs a
 * register-blocked 2 rows x 4 tokens kernel over all tokens; from
 * LOOM_CPU_QLINEAR_PANEL_M tokens, float-activation formats hand 256-row
 * decoded panels to OpenBLAS. W8A8 dots int8 rows with int8 tokens in int32
 * at every M, GGUF blocks with q8 tokens likewise. GCC vector extensions, built for x86-64-v4/v3/baseline and
 * picked at load. The weight is never dequantized as a whole: only the
 * tile or panel in flight exists as float.
 *
 * What this is not: the fastest possible CPU kernel for every format: only
 * GGUF blocks have integer kernels (q8dot.h: AVX2, AVX-512, AVX-512 VNNI,
 * portable, picked at run time); the other formats are the CPU path that lets CI
 * test every scheme, with the right memory traffic for batch-1 decode.
 *
 * Threads: one call at a time per scratch; the pool is driven by the caller.
 */
#ifndef LOOM_CPU_QLINEAR_H
#define LOOM_CPU_QLINEAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "loom/quant.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A quantized weight as the kernels read it: borrowed pointers, no
 * ownership. Build it with loom_cpu_qweight_init / _gguf, which check
 * every size. */
typedef struct loom_cpu_qweight {
    loom_qformat format;    /* INT8_W8A16 .. GGUF                                */
    loom_dtype dtype;       /* data element / block type (i8, fp8_e4m3, u8, q4_1...) */
    int64_t n, k;           /* rows (outputs), columns (inputs)                  */
    int32_t group_size;     /* INT4: inputs per group                            */
    size_t row_bytes;       /* bytes of one row of data                          */
    size_t row_stride;      /* bytes from one row's data to the next (>= row_bytes;
                               larger in a column slice)                         */
    int64_t scale_stride;   /* INT4: floats from one row's scales / zeros to the
                               next (k / g, larger in a column slice)            */
    const uint8_t *data;    /* (n, row_stride)                                   */
    const float *scales;    /* INT8/FP8: (n), or (1) when per_tensor; INT4: (n, k/g) */
    const float *zeros;     /* INT4: (n, k/g); else NULL                         */
    const float *smooth;    /* INT8_W8A8, FP8_W8A8: (k) SmoothQuant divisor, or NULL */
    bool per_tensor;        /* FP8: one scale for the whole tensor               */
} loom_cpu_qweight;

/* Can these kernels run `format` (and, for GGUF, block type `dtype`)? */
bool loom_cpu_qformat_supported(loom_qformat format, loom_dtype dtype);

/* View a quantizer's tensor (format INT8_*, FP8_W8A8 or INT4_W4A16) for the
 * kernels, checking dtypes, shapes and byte counts. False with a reason in
 * why[size] (e.g. "scales hold 10 floats, need 576"). `q` must outlive w. */
bool loom_cpu_qweight_init(loom_cpu_qweight *w, const loom_qtensor *q, char *why, size_t size);

/* View a GGUF block-quantized 2-D tensor t (rows, cols) as stored (format
 * GGUF). False with a reason when its type has no kernel here or its rows
 * are not whole blocks. */
bool loom_cpu_qweight_gguf(loom_cpu_qweight *w, const loom_tensor *t, char *why, size_t size);

/* A view of rows [r0, r0 + nr) and columns [c0, c0 + nc) of w (tensor
 * parallelism: column-parallel layers keep a slice of rows, row-parallel
 * ones a slice of input columns). No copy. Columns must start and end on a
 * group (INT4) or block (GGUF) boundary; INT8 / FP8 slice anywhere (their
 * per-row scales stay; W8A8 / FP8 then scale each token over its slice).
 * False with a reason when the ranges or the alignment do not fit. */
bool loom_cpu_qweight_slice(loom_cpu_qweight *out, const loom_cpu_qweight *w, int64_t r0,
                            int64_t nr, int64_t c0, int64_t nc, char *why, size_t size);

/* Bytes of weight data one product streams (for bandwidth figures). */
size_t loom_cpu_qweight_bytes(const loom_cpu_qweight *w);

/* Per-call scratch: per-thread tiles and quantized activations. Grows on
 * demand (the only allocation in these kernels); keep one per backend and
 * reuse it, so steady-state calls never allocate. */
typedef struct loom_cpu_qscratch loom_cpu_qscratch;
loom_cpu_qscratch *loom_cpu_qscratch_create(void);
void loom_cpu_qscratch_destroy(loom_cpu_qscratch *s); /* NULL-safe */

/*
 * y (M, sum of w[i]->n) = x (M, K) @ [w[0]; w[1]; ...]^T (+ bias[i]) + beta * y
 * Part i writes columns [off_i, off_i + w[i]->n) of y, off_i = sum of the
 * earlier parts' n, so fused projections (Q, K, V or gate, up) need no
 * concatenated weight. Every part has the same k = K. x rows have stride
 * ldx floats, y rows ldy floats; beta = 0 never reads y. `bias` may be NULL
 * (no bias anywhere) or hold NULL entries. nparts in [1, 8]. Parts that
 * quantize x (INT8_W8A8, FP8_W8A8) are fused only when they share one
 * `smooth` pointer (or none); otherwise each part runs on its own.
 * Returns false when the scratch cannot grow (out of memory) or nparts is
 * out of range; y is then unspecified.
 */
#define LOOM_CPU_QLINEAR_MAX_PARTS 8
/* From this many tokens on, float-activation formats (W8A16, INT4)
 * decode 256-row panels into scratch and multiply them with OpenBLAS's
 * sgemm (loom_cpu_linear): prefill is compute-bound, the decode is 1/M of
 * it. W8A8, FP8 and GGUF keep their own arithmetic at every M. */
#define LOOM_CPU_QLINEAR_PANEL_M 32
bool loom_cpu_qlinear_multi(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const loom_cpu_qweight *const *w, const float *const *bias,
                            int nparts, int64_t M, float beta, loom_cpu_qscratch *s,
                            loom_cpu_pool *pool);

/* One weight: y (M, w->n) = x (M, w->k) @ W^T (+ bias) + beta * y. */
bool loom_cpu_qlinear(float *y, int64_t ldy, const float *x, int64_t ldx,
                      const loom_cpu_qweight *w, const float *bias, int64_t M, float beta,
                      loom_cpu_qscratch *s, loom_cpu_pool *pool);

/* Dequantize rows [r0, r0 + nr) of w into dst (nr, w->k) float32 — the
 * kernels' own decoder, for tests and for embedding lookups of quantized
 * tables (W8A8 rows decode as W8A16, ignoring smooth). */
void loom_cpu_qweight_rows(const loom_cpu_qweight *w, int64_t r0, int64_t nr, float *dst);

/* ---------------------------------------------------- FP8 E4M3 rows */

/* Rows of E4M3 codes (formats/e4m3.h's codec) <-> float32, for an FP8 KV
 * cache: dst[i] = e4m3(src[i] * inv_scale) and dst[i] = decode(src[i]) *
 * scale. */
void loom_cpu_f32_to_e4m3(uint8_t *dst, const float *src, int64_t n, float inv_scale);
void loom_cpu_e4m3_to_f32(float *dst, const uint8_t *src, int64_t n, float scale);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CPU_QLINEAR_H */
