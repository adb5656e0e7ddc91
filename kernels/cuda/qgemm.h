/*
 * kernels/cuda/qgemm.h — internal: the kernels of the quantized linear
 * layers (qgemm.cu, qgguf.cu) and the cuBLASLt FP8 / int8 GEMMs (gemm.c) that
 * loom_cuda_qgemm_run (qgemm.c) puts together. Not part of the C API.
 */
#ifndef LOOM_CUDA_QGEMM_H
#define LOOM_CUDA_QGEMM_H

#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LC_QGEMV_MAX_M 8   /* rows of x one GEMV pass takes                    */
#define LC_QCHUNK_M 2048   /* rows of x one GEMM-path pass takes (scratch bound) */

/* y (M, N) = x (M, K) @ dequant(w)^T for M in [1, 8], y dt or f32.
 * W8A16 / INT4 read x (M, K) dt; W8A8 / FP8 read xq (M, K) int8 / e4m3 and
 * sx (M) per-token scales from lc_quant_act (x unused). invariant: the
 * batch-invariant mode's call (the CUDA-core kernel at every M, unsplit).
 * tc_min_m: the GEMM context's tensor-core bound (lc_qgemv_use_tc). */
cudaError_t lc_qgemv(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                     const void *x, const void *xq, const float *sx, void *y, int invariant,
                     int tc_min_m, cudaStream_t s);

/* lc_qgemv at M = 1 with epi's pair epilogue fused (cuda_kernels.h:
 * loom_cuda_epi; qgemm.cu's CUDA-core kernel), or cudaErrorNotSupported
 * where lc_qgemv would not run that kernel (tensor-core, GGUF) or
 * the output rows do not pair — the caller then runs lc_qgemv and the
 * separate kernel. */
cudaError_t lc_qgemv_epi(loom_cuda_dt dt, const loom_cuda_qweight *w, const void *x, const void *xq,
                         const float *sx, void *y, const loom_cuda_epi *epi, int invariant, int tc_min_m,
                         cudaStream_t s);

/* Whether lc_qgemv hands M rows to the tensor-core GEMV (qgemv_tc.cu): W8A8
 * / FP8 with K % 64 == 0 and INT4 with K and group multiples of 128, from
 * min_m rows (lc_gemm_q_tc_min_m; 0: as measured, 2 for W8A8 / FP8 and 3
 * for INT4; above 8: never), never in batch-invariant mode (whose rows must
 * have the same bits at every M: the CUDA-core kernel's). */
int lc_qgemv_use_tc(loom_cuda_qfmt fmt, int K, int group, int M, int invariant, int min_m);
/* The one-row CUDA-core GEMV splits K across a CTA's warps in two slices
 * (outside the batch-invariant mode) where the unsplit grid does not fill
 * the GPU once: matrices of few rows get as many warps as wide ones. The
 * pair-epilogue GEMV does not split. Split launches so far (tests): */
long lc_qgemv_split_count(void);
/* Whether lc_qgemv at M = 1 on w would split K (the CUDA-core kernel, not
 * in batch-invariant mode, the split chosen). */
int lc_qgemv_splits(loom_cuda_dt dt, const loom_cuda_qweight *w, int invariant, int tc_min_m);
/* GEMV launches so far, tensor-core and CUDA-core (tests name what ran). */
void lc_qgemv_count(long *tc, long *cc);
void lc_qgemv_count_cc(void);
cudaError_t lc_qgemv_tc(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                        const void *x, const void *xq, const float *sx, void *y, cudaStream_t s);

/* GGUF (qgguf.cu): y (M, N) = x (M, K) @ dequant(w)^T for M in [1, 8],
 * one launch per segment; y dt or f32 (out_f32), x dt. */
cudaError_t lc_gguf_gemv(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                         const void *x, void *y, cudaStream_t s);
/* GGUF weight -> out (N, K) dt, the CPU's decode bit for bit before the
 * rounding to dt. */
cudaError_t lc_gguf_dequant(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out,
                            cudaStream_t s);

/* Per-token activation quantization, one CTA per row of x (M, K) dt:
 *   v = x / smooth (smooth may be NULL: v = x), amax = max|v|,
 *   int8 (fp8 == 0): sx = amax / 127, xq = clamp(rint(v * (127 / amax)), +-127)
 *   e4m3 (fp8 == 1): sx = amax / 448, xq = e4m3_satfinite(v / sx)
 * (0 codes and sx 0 for an all-zero row) — the arithmetic of
 * kernels/cpu/qlinear.c, in float32. xq (M, K) bytes, sx (M) f32.
 * swiglu: x is a fused gate|up output (M, 2K) and the row quantized is
 * silu(gate) * up rounded to dt — the bits loom_cuda_swiglu would store, so
 * the codes equal those of the two kernels in a row, without writing and
 * re-reading the (M, K) activations. K % 8 == 0, x and smooth 16-byte
 * aligned, xq 8-byte aligned (else cudaErrorInvalidValue). */
cudaError_t lc_quant_act(loom_cuda_dt dt, int fp8, int swiglu, int M, int K, const void *x,
                         const float *smooth, void *xq, float *sx, cudaStream_t s);

/* loom_cuda_add_rmsnorm (no gather) whose y — the same dt bits — is not
 * stored but quantized per token as lc_quant_act does (fp8: e4m3, else
 * int8; divided by smooth first when not NULL): v = x (+ r), x = v when r,
 * xq (T, H) codes, sx (T) scales. H % 8 == 0, H <= 32768 (elementwise.cu). */
cudaError_t lc_add_rmsnorm_quant(loom_cuda_dt dt, int fp8, float *x, const void *r, const float *w,
                                 int T, int H, float eps, const float *smooth, void *xq, float *sx,
                                 cudaStream_t s);

/* W8A16 / INT4 above the GEMV's rows (qmma.cu): the tensor-core kernel that
 * decodes the weights in registers, for M <= LC_QMMA_MAX_M, K % 128 == 0
 * (INT4: group % 128 == 0). lc_qmma_ok: whether it takes (w, M). Scratch:
 * lc_qmma_scratch_bytes (the f16 tokens, their scales, K-slice partial
 * sums). */
#define LC_QMMA_MAX_M 128 /* above: dequantize + cuBLASLt is faster (H200, M = 256: 444 vs 684 us) */
int lc_qmma_ok(const loom_cuda_qweight *w, int M);
size_t lc_qmma_scratch_bytes(const loom_cuda_qweight *w, int M);
cudaError_t lc_qmma(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w, const void *x,
                    void *y, void *scratch, cudaStream_t s);

/* W8A16 / INT4 on weights in the tiled layout (qtiled.cu), 1 ..
 * LC_QT_MAX_M rows. lc_qtiled_ok: whether w's shape can be tiled (N % 16,
 * K % 128, INT4 group % 64). Scratch: lc_qtiled_scratch_bytes (the K
 * slices' partial sums, up to max_m rows). invariant: the split of one row
 * at every M (batch-invariant mode). lc_qtiled_dequant: a tiled weight ->
 * (N, K) dt for the dequantize + cuBLASLt path above the tiled bound.
 * wgmma_min_m: from these rows the Hopper wgmma kernel (0: never; not in
 * batch-invariant mode), below it the mma.sync one. */
#define LC_QT_MAX_M 256
/* the default tiled bound: on the H200 (one Llama-3-8B layer's linears) the
 * kernel's wgmma path beats the tiled dequantize + cuBLASLt at 128 rows
 * (W8A16 185 vs 491 us, INT4 196 vs 559) and at 256 (W8A16 319 vs 536,
 * INT4 361 vs 606); on an H100 its 256-row chunks still do at 384 rows
 * (INT4 377 vs 502, W8A16 408 vs 529) and 512 (463 vs 532, 500 vs 557),
 * not at 768 (INT4 673 vs 677, W8A16 730 vs 700) nor 1024 (891 vs 797, 964
 * vs 821). An H100's figures: the H200's dequantize is cheaper next to the
 * kernel, so its crossover may sit lower (not measured) */
#define LC_QT_DEFAULT_MAX_M 512
/* the largest tiled bound: above LC_QT_MAX_M rows the kernel runs in chunks
 * of LC_QT_MAX_M, each re-reading the weight */
#define LC_QT_CHUNKED_MAX_M 65536
int lc_qtiled_ok(const loom_cuda_qweight *w);
size_t lc_qtiled_scratch_bytes(const loom_cuda_qweight *w, int max_m);
/* epi (NULL: none): the pair epilogue of a one-row dt call, fused into
 * the K-split reduce where K is split (*fused 1; else 0 and nothing of it
 * ran). */
cudaError_t lc_qtiled(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w, const void *x, void *y,
                      void *scratch, int invariant, int wgmma_min_m, const loom_cuda_epi *epi, int *fused,
                      cudaStream_t s);
/* the default of loom_cuda_qgemm_set_tiled_wgmma_min_m: the wgmma path
 * (Hopper warpgroup MMA) from this many rows, mma.sync below */
#define LC_QT_DEFAULT_WG_MIN_M 17
int lc_gemm_q_tiled_wg_min_m(const loom_cuda_gemm *g);
/* lc_qtiled calls that took the wgmma path so far. */
long lc_qtiled_wgmma_count(void);
/* the wgmma path's kernel: 0 cp.async + CTA barriers, 1 TMA + mbarriers,
 * 2 (default) by format and M as measured (qtiled.cu), 3 TMA as if no
 * tensor map could be made (its cp.async fallback), 4 the wide TMA kernel
 * (256-row CTAs); for gpu_bench and the kernel tests, process-wide */
void lc_qtiled_set_wgmma_tma(int mode);
/* TMA calls of the wgmma path that fell back to cp.async (no tensor map). */
long lc_qtiled_tma_fallback_count(void);
/* Launches of the wide (256-row CTA) TMA kernel so far. */
long lc_qtiled_wide_count(void);
cudaError_t lc_qtiled_dequant(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out, cudaStream_t s);
/* The tiled bound of loom_cuda_qgemm_set_tiled_max_m (gemm.c holds it). */
int lc_gemm_q_tiled_max_m(const loom_cuda_gemm *g);
/* W8A16 / INT4 calls that ran lc_qtiled so far. */
long lc_qgemm_qtiled_count(void);

/* Dequantize a W8A16 / INT4 weight into out (N, K) dt. */
cudaError_t lc_dequant_weight(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out,
                              cudaStream_t s);

/* Scale epilogue: y[m, n] = in[m, n] * sx[m] * sw[n] over (M, N).
 * in_kind 0: in is dt (may equal y), 1: f32, 2: int32. y dt or f32. */
cudaError_t lc_scale_epilogue(loom_cuda_dt dt, int in_kind, const void *in, int out_f32, void *y,
                              const float *sx, const float *sw, int M, int N, cudaStream_t s);

/* cuBLASLt GEMMs on quantized operands, D (M, N) = xq (M, K) @ wq^T
 * (gemm.c; plans cached with the dt GEMM's):
 *   LC_LT_FP8_BF16 / _F16 / _F32: e4m3 x e4m3, fp32 accumulation, unit
 *     scales, D of that type (sx, sw unused);
 *   LC_LT_FP8_VEC_BF16 / _F16 / _F32: the same with cuBLASLt's outer-vector
 *     scaling, D[m, n] = sum * sx[m] * sw[n] rounded once — no epilogue pass;
 *   LC_LT_I8_I32: int8 x int8, int32 accumulation, D int32.
 * Returns 0, or LC_LT_NOT_SUPPORTED when no algorithm fits the
 * shape (remembered per shape; the caller falls back: a _VEC kind to the
 * unit-scale GEMM + epilogue, that to the GEMV), or another cuBLAS status
 * with msg. */
#define LC_LT_NOT_SUPPORTED 15 /* CUBLAS_STATUS_NOT_SUPPORTED, without cuBLAS's header */
enum {
    LC_LT_FP8_BF16 = 1,
    LC_LT_FP8_F16 = 2,
    LC_LT_FP8_F32 = 3,
    LC_LT_I8_I32 = 4,
    LC_LT_FP8_VEC_BF16 = 5,
    LC_LT_FP8_VEC_F16 = 6,
    LC_LT_FP8_VEC_F32 = 7
};
int lc_gemm_lt_q(loom_cuda_gemm *g, int kind, int M, int N, int K, const void *xq,
                 const void *wq, const float *sx, const float *sw, void *d, cudaStream_t s,
                 char *msg, size_t msg_size);
/* Whether g's FP8 GEMMs try the scale vectors first (on from
 * loom_cuda_gemm_create); tests and gpu_bench set it off to run the
 * fallback of the shapes without such an algorithm (unit scales + the
 * epilogue pass) and compare both paths. */
int lc_gemm_fp8_vec(const loom_cuda_gemm *g);
void lc_gemm_set_fp8_vec(loom_cuda_gemm *g, int on);
/* the fewest rows whose FP8 GEMM takes the scale vectors (loom_cuda_qgemm_set_fp8_vec_min_m) */
int lc_gemm_fp8_vec_min_m(const loom_cuda_gemm *g);
/* FP8 GEMM-path calls so far that ran with the scale vectors / with unit
 * scales and the epilogue (tests and gpu_bench name what ran). */
void lc_qgemm_fp8_count(long *vec, long *epilogue);
/* W8A16 / INT4 calls that ran the tensor-core kernel (qmma.cu) so far. */
long lc_qgemm_qmma_count(void);
/* loom_cuda_gemm_run without its GEMV: cuBLASLt at every M (the large-M
 * path of W8A16 / INT4 also runs when a test forces it at small M). */
int lc_gemm_run_lt(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M, int N, int K,
                   const void *x, const void *w, void *y, cudaStream_t s, char *msg,
                   size_t msg_size);
/* Whether g is in batch-invariant mode (gemm.c holds it). */
int lc_gemm_invariant(const loom_cuda_gemm *g);
/* Per-format GEMV bound of loom_cuda_qgemm_set_gemv_max_m (gemm.c holds it). */
int lc_gemm_q_gemv_max_m(const loom_cuda_gemm *g, loom_cuda_qfmt fmt);
/* The tensor-core GEMV's bound of loom_cuda_qgemm_set_tc_min_m (0: the
 * measured per-format default; gemm.c holds it). */
int lc_gemm_q_tc_min_m(const loom_cuda_gemm *g);

#ifdef __cplusplus
}
#endif
#endif
