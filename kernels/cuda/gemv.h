/*
 * kernels/cuda/gemv.h — internal: the small-batch linear kernel (gemv.cu)
 * that loom_cuda_gemm_run (gemm.c) uses instead of cuBLASLt when M is at
 * most LC_GEMV_MAX_M. Not part of the C API.
 */
#ifndef LOOM_CUDA_GEMV_H
#define LOOM_CUDA_GEMV_H

#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LC_GEMV_MAX_M 8

/* y (M, N) = x (M, K) @ w^T; M in [1, LC_GEMV_MAX_M], K % 8 == 0, rows
 * 16-byte aligned; y dt or float32 (out_f32). */
cudaError_t lc_gemv(loom_cuda_dt dt, int out_f32, int M, int N, int K, const void *x,
                    const void *w, void *y, cudaStream_t s);

/* The same for any M >= 1, in passes of LC_GEMV_MAX_M rows (two launches
 * at most): each output row has the bits it has at M = 1 — the
 * batch-invariant mode's linear layer. Slow for large M (the weights are
 * re-read once per pass, from L2 when they fit). */
cudaError_t lc_gemv_rows(loom_cuda_dt dt, int out_f32, int M, int N, int K, const void *x,
                         const void *w, void *y, cudaStream_t s);

/* y (1, N) dt = x @ w^T with epi's pair epilogue fused (cuda_kernels.h:
 * loom_cuda_epi), or cudaErrorNotSupported when the rows do not pair. */
cudaError_t lc_gemv_epi(loom_cuda_dt dt, int N, int K, const void *x, const void *w, void *y,
                        const loom_cuda_epi *epi, cudaStream_t s);
/* One more fused launch (loom_cuda_epi_fused_count; qgemm.cu's count). */
void lc_epi_count(void);

/* epi's separate kernel (rope_kv / swiglu) over y (M, N) after an unfused
 * GEMM (gemm.c); returns like loom_cuda_gemm_run. */
int lc_epi_separate(loom_cuda_dt dt, int M, int N, void *y, const loom_cuda_epi *epi, cudaStream_t s, char *msg,
                    size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif
