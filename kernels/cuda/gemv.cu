/*
 * kernels/cuda/gemv.cu — the linear layers of small decode batches:
 * y (M, N) = x (M, K) @ w^T for M <= 8, bf16/f16 operands, float32
 * accumulation, output dt or float32.
 *
 * Why not cuBLAS here: at M = 1..8 a linear layer is a pure weight stream
 * (each weight byte used M times), and measured on an H200 cuBLASLt's
 * heuristic picks reach only 1.8-3.6 TB/s on Llama-3-8B's layer shapes
 * against ~4.2 TB/s of copy bandwidth. This kernel streams each weight row
 * once with 16-byte evict-first loads, U chunks per lane in flight, and keeps
 * x in L1 (it is at most 8 x K x 2 bytes, re-read by every warp).
 *
 * Layout: a warp owns R consecutive output rows (R = 1 for M = 1, 2 for
 * M <= 4, 4 for M <= 8, so the L1 traffic of x stays below twice the
 * weight traffic), 4 warps per CTA; lanes split K in 8-element chunks;
 * warp shuffles reduce the partial dots. K % 8 == 0 and 16-byte aligned
 * rows are the caller's contract.
 *
 * Row invariance: each (output row n, input row m) dot is one lane-strided
 * fmaf chain over K in ascending chunk order (lane, lane + 32, ...), then
 * the same 5-step shuffle tree — neither depends on M, on R or on which
 * other rows share the launch. So a row's bits are the same at every M,
 * which the batch-invariant mode (lc_gemv_rows, any M in passes of 8 rows;
 * docs/gpu.md) relies on.
 */
#include <atomic>

#include "common.cuh"
#include "epilogue.cuh"

#include "gemv.h"

#define LC_GEMV_WARPS 4
#define LC_GEMV_U 4 /* 16-byte weight chunks per row per lane in flight */

extern "C" int lc_weight_prefetch(size_t matrix_bytes) { return matrix_bytes <= LC_PREFETCH_MAX_BYTES; }

/* 8 activations of row m, chunk c of x (M, K). */
template <typename T>
__device__ __forceinline__ void lc_gemv_x8(const T *__restrict__ x, int K, int m, int c, float *xf) {
    lc_unpack8<T>(lc_ldg16(x + (size_t)m * K + (size_t)c * 8), xf);
}

/* A lane's round: its chunks c + 32 u (u < LC_GEMV_U) of the R rows at wr
 * into wv — those at or past nc as zeros when GUARD — and then their dots
 * with x's rows added to acc, chunk by chunk in ascending order. */
template <typename T, int R, bool GUARD>
__device__ __forceinline__ void lc_gemv_load(uint4 (&wv)[R][LC_GEMV_U], const T *const (&wr)[R], int c, int nc) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int u = 0; u < LC_GEMV_U; u++)
            wv[r][u] = !GUARD || c + 32 * u < nc
                           ? __ldcs(reinterpret_cast<const uint4 *>(wr[r] + (size_t)(c + 32 * u) * 8))
                           : make_uint4(0u, 0u, 0u, 0u);
}
template <typename T, int M, int R, bool GUARD>
__device__ __forceinline__ void lc_gemv_dots(const uint4 (&wv)[R][LC_GEMV_U], const T *__restrict__ x, int K,
                                             int c, int nc, float (&acc)[R][M]) {
#pragma unroll
    for (int u = 0; u < LC_GEMV_U; u++) {
        if (GUARD && c + 32 * u >= nc) break;
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) lc_unpack8<T>(wv[r][u], wf[r]);
#pragma unroll
        for (int m = 0; m < M; m++) {
            float xf[8];
            lc_gemv_x8<T>(x, K, m, c + 32 * u, xf);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
        }
    }
}

/* grid (row tiles x passes): block b computes pass b % passes — input and
 * output rows [pass M, pass M + M) — of row tile b / passes, so the passes
 * over one tile of weight rows run side by side and share it in L2.
 * PAIR (M = 1, one pass): the rows in pairs (n, n + P) and epi applied to
 * them (epilogue.cuh) — same dot per row, so the same sums.
 * At M = 1 a lane loads its first round of weights before lc_pdl_wait()
 * (common.cuh, "Early weights"), the L2 prefetch's place; more rows keep
 * the prefetch. */
template <typename T, int M, int R, bool F32, bool PAIR = false>
__global__ void __launch_bounds__(LC_GEMV_WARPS * 32)
    lc_gemv_kernel(const T *__restrict__ x, const T *__restrict__ w, void *__restrict__ y, int N,
                   int K, int passes, int pf, int P, loom_cuda_epi epi) {
    static_assert(!PAIR || (M == 1 && !F32 && LC_GEMV_WARPS == LC_EPI_WARPS), "pair epilogue: one dt row");
    constexpr bool EARLY = M == 1;
    const int lane = threadIdx.x & 31;
    const int pass = (int)(blockIdx.x % (unsigned)passes), tile = (int)(blockIdx.x / (unsigned)passes);
    bool live = true;
    const int n0 = PAIR ? lc_epi_row0(R, P, N, threadIdx.x >> 5, &live)
                        : (tile * LC_GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (!PAIR) live = n0 < N;
    const int nc = K / 8;
    const T *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(n0 + r < N ? n0 + r : n0) * K;
    uint4 wv[R][LC_GEMV_U];
    if (EARLY && live) lc_gemv_load<T, R, true>(wv, wr, lane, nc);
    /* else this warp's R weight rows are contiguous: ask L2 for them first */
    if (!EARLY && pf && live && pass == 0)
        lc_prefetch_rows(w + (size_t)n0 * K, N - n0 < R ? N - n0 : R, (size_t)K * sizeof(T), lane);
    lc_pdl_trigger();
    lc_pdl_wait();
    if (!PAIR && !live) return; /* PAIR: every warp reaches lc_epi_finish's barrier */
    const size_t row0 = (size_t)pass * M; /* first input / output row of this pass */
    x += row0 * (size_t)K;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;

    int c = lane;
    if (EARLY) { /* the round loaded above (dead lanes of a PAIR warp: zeros, never stored) */
        if (!live) lc_gemv_load<T, R, true>(wv, wr, c, 0);
        lc_gemv_dots<T, M, R, true>(wv, x, K, c, nc, acc);
        c += 32 * LC_GEMV_U;
    }
    for (; c + 32 * (LC_GEMV_U - 1) < nc; c += 32 * LC_GEMV_U) {
        lc_gemv_load<T, R, false>(wv, wr, c, nc);
        lc_gemv_dots<T, M, R, false>(wv, x, K, c, nc, acc);
    }
    if (c < nc) {
        /* the tail, fewer than U chunks for this lane: its loads issued
         * together, not one round trip each (small K is all tail: SmolLM2's
         * K = 576 is 2-3 chunks a lane). Same chunks in the same order as
         * a chunk-at-a-time loop, so the same bits. */
        lc_gemv_load<T, R, true>(wv, wr, c, nc);
        lc_gemv_dots<T, M, R, true>(wv, x, K, c, nc, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if constexpr (PAIR) {
        float sum[R];
#pragma unroll
        for (int r = 0; r < R; r++) sum[r] = acc[r][0];
        lc_epi_finish<T, R>(epi, y, P, N, sum);
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (n0 + r >= N) break;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const size_t i = (row0 + m) * N + n0 + r;
                if (F32) static_cast<float *>(y)[i] = acc[r][m];
                else static_cast<T *>(y)[i] = lc_from_f<T>(acc[r][m]);
            }
        }
    }
}

/* `passes` consecutive groups of M rows in one launch. */
template <typename T, int M, bool F32>
static cudaError_t lc_gemv_m(const void *x, const void *w, void *y, int N, int K, int passes,
                             cudaStream_t s) {
    constexpr int R = M == 1 ? 1 : M <= 4 ? 2 : 4;
    const int rows_per_cta = LC_GEMV_WARPS * R;
    const unsigned long long grid =
        (unsigned long long)((N + rows_per_cta - 1) / rows_per_cta) * (unsigned long long)passes;
    if (passes < 1 || grid > 0x7fffffffull) return cudaErrorInvalidValue;
    const int pf = M > 1 && lc_weight_prefetch((size_t)N * K * sizeof(T)); /* one row loads early instead */
    return lc_launch(lc_gemv_kernel<T, M, R, F32>, dim3((unsigned)grid), dim3(LC_GEMV_WARPS * 32),
                     0, s, static_cast<const T *>(x), static_cast<const T *>(w), y, N, K, passes, pf, 0,
                     loom_cuda_epi{});
}

template <typename T, bool F32>
static cudaError_t lc_gemv_t(int M, const void *x, const void *w, void *y, int N, int K,
                             cudaStream_t s, int passes = 1) {
    switch (M) {
    case 1: return lc_gemv_m<T, 1, F32>(x, w, y, N, K, passes, s);
    case 2: return lc_gemv_m<T, 2, F32>(x, w, y, N, K, passes, s);
    case 3: return lc_gemv_m<T, 3, F32>(x, w, y, N, K, passes, s);
    case 4: return lc_gemv_m<T, 4, F32>(x, w, y, N, K, passes, s);
    case 5: return lc_gemv_m<T, 5, F32>(x, w, y, N, K, passes, s);
    case 6: return lc_gemv_m<T, 6, F32>(x, w, y, N, K, passes, s);
    case 7: return lc_gemv_m<T, 7, F32>(x, w, y, N, K, passes, s);
    case 8: return lc_gemv_m<T, 8, F32>(x, w, y, N, K, passes, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t lc_gemv(loom_cuda_dt dt, int out_f32, int M, int N, int K, const void *x,
                               const void *w, void *y, cudaStream_t s) {
    if (M < 1 || M > LC_GEMV_MAX_M || K % 8 || N <= 0) return cudaErrorInvalidValue;
    if (dt == LOOM_CUDA_F16)
        return out_f32 ? lc_gemv_t<__half, true>(M, x, w, y, N, K, s)
                       : lc_gemv_t<__half, false>(M, x, w, y, N, K, s);
    return out_f32 ? lc_gemv_t<__nv_bfloat16, true>(M, x, w, y, N, K, s)
                   : lc_gemv_t<__nv_bfloat16, false>(M, x, w, y, N, K, s);
}

/* Fused pair epilogues: the count of launches. */
static std::atomic<long> lc_epi_fused{0};

extern "C" long loom_cuda_epi_fused_count(void) { return lc_epi_fused; }
extern "C" void lc_epi_count(void) { lc_epi_fused++; }

extern "C" cudaError_t lc_gemv_epi(loom_cuda_dt dt, int N, int K, const void *x, const void *w, void *y,
                                   const loom_cuda_epi *epi, cudaStream_t s) {
    const int P = lc_epi_p(epi, N);
    if (!P || K % 8) return cudaErrorNotSupported;
    constexpr int R = 1; /* as lc_gemv_m at M = 1 */
    const unsigned grid = (unsigned)((N / 2 + 2 * R - 1) / (2 * R));
    const int pf = 0; /* one row: early weights, no L2 prefetch (lc_gemv_kernel) */
    cudaError_t e;
    if (dt == LOOM_CUDA_F16)
        e = lc_launch(lc_gemv_kernel<__half, 1, R, false, true>, dim3(grid), dim3(LC_GEMV_WARPS * 32), 0, s,
                      static_cast<const __half *>(x), static_cast<const __half *>(w), y, N, K, 1, pf, P, *epi);
    else
        e = lc_launch(lc_gemv_kernel<__nv_bfloat16, 1, R, false, true>, dim3(grid),
                      dim3(LC_GEMV_WARPS * 32), 0, s, static_cast<const __nv_bfloat16 *>(x),
                      static_cast<const __nv_bfloat16 *>(w), y, N, K, 1, pf, P, *epi);
    if (e == cudaSuccess) lc_epi_fused++;
    return e;
}

/* Any M: the whole passes of LC_GEMV_MAX_M rows in one launch, the rest
 * (M % 8 rows) in a second. Every row's bits equal those of the same row
 * computed at M = 1 (see "Row invariance" above). */
template <typename T, bool F32>
static cudaError_t lc_gemv_rows_t(int M, const void *x, const void *w, void *y, int N, int K,
                                  cudaStream_t s) {
    const int full = M / LC_GEMV_MAX_M, rest = M % LC_GEMV_MAX_M;
    const size_t done = (size_t)full * LC_GEMV_MAX_M;
    cudaError_t e = cudaSuccess;
    if (full > 0) e = lc_gemv_t<T, F32>(LC_GEMV_MAX_M, x, w, y, N, K, s, full);
    if (e == cudaSuccess && rest > 0)
        e = lc_gemv_t<T, F32>(rest, static_cast<const T *>(x) + done * K, w,
                              static_cast<char *>(y) + done * N * (F32 ? sizeof(float) : sizeof(T)), N, K,
                              s);
    return e;
}

extern "C" cudaError_t lc_gemv_rows(loom_cuda_dt dt, int out_f32, int M, int N, int K, const void *x,
                                    const void *w, void *y, cudaStream_t s) {
    if (M < 1 || K % 8 || N <= 0) return cudaErrorInvalidValue;
    if (dt == LOOM_CUDA_F16)
        return out_f32 ? lc_gemv_rows_t<__half, true>(M, x, w, y, N, K, s)
                       : lc_gemv_rows_t<__half, false>(M, x, w, y, N, K, s);
    return out_f32 ? lc_gemv_rows_t<__nv_bfloat16, true>(M, x, w, y, N, K, s)
                   : lc_gemv_rows_t<__nv_bfloat16, false>(M, x, w, y, N, K, s);
}
