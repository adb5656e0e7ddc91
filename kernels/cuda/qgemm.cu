/*
 * kernels/cuda/qgemm.cu — the kernels of the quantized linear layers
 * (cuda_kernels.h: loom_cuda_qweight; qgemm.c puts them together):
 *
 *   lc_qgemv          fused dequantize-GEMV for 1..8 rows of x: each
 *                     weight byte is read once (evict-first 16-byte loads)
 *                     and decoded in registers. Decode M = 1 is a pure
 *                     weight stream, so int8 / e4m3 weights (1 byte) approach
 *                     2x the bf16 GEMV and int4 (0.5 byte + 8 bytes of
 *                     {scale, bias} per group) approaches 3-3.5x.
 *   lc_quant_act      per-token int8 / e4m3 activation quantization (W8A8,
 *                     FP8), the arithmetic of kernels/cpu/qlinear.c; of x,
 *                     or of silu(gate) * up read from a gate|up output (the
 *                     down projection's SwiGLU formed here, not stored).
 *                     elementwise.cu's lc_add_rmsnorm_quant does the same
 *                     for the normalised rows of the QKV / gate|up input.
 *   lc_dequant_weight W8A16 / INT4 weight -> (N, K) dt, for the large-M path
 *                     (dequantize into scratch, then the dt GEMM).
 *   lc_scale_epilogue y = D * sx[m] * sw[n] after a unit-scale cuBLASLt
 *                     int8 GEMM, or an FP8 one where cuBLASLt has no
 *                     outer-vector scaling for the shape.
 *
 * GEMV layout (as gemv.cu): a warp owns R consecutive output rows, 4 warps
 * per CTA; lanes split each row into 16-byte chunks (16 int8 / e4m3
 * weights, 32 int4 weights), U chunks per row in flight per lane; warp
 * shuffles reduce. At one row a matrix of few rows (Llama-3-8B's O and
 * down projections: 512 CTAs of W8A16 where an H200 holds ~1200) splits K
 * in two (S): two warps share a row group, one slice each, and add their
 * sums in shared memory — twice the warps, the GPU's weight stream full
 * (lc_qgemv_slices). Decoding is exact and cheap:
 *   int8 -> float: byte ^ 0x80 placed in the mantissa of 2^23 by one PRMT,
 *                  minus (2^23 + 128) — no int->float conversion unit;
 *   int4 -> float: (w & 0x0F0F0F0F) and ((w >> 4) & 0x0F0F0F0F) hold the
 *                  even and odd columns one per byte; one PRMT puts a code
 *                  in bits 16..19 of 2^23's mantissa and nothing is
 *                  subtracted per weight (lc_u4x8_off: the offset comes off
 *                  once per 32-weight chunk) — int4 is the format whose
 *                  GEMV is bound by instruction issue, so this is worth
 *                  ~13% of a Llama-3-8B layer at one row;
 *   e4m3 -> float: the sm_89+ e4m3x2 -> f16x2 conversion, then f16 -> f32.
 * INT4 never forms w = q * s + b per weight: per 32-weight chunk (inside
 * one group, as group % 32 == 0) it accumulates p = sum(x * q) and
 * xs = sum(x) and adds s * p + b * xs, so the group's affine map costs two
 * FMAs per chunk instead of one per weight (three with the decode offset). W8A8 multiplies int8 codes
 * with __dp4a into exact int32 sums (as the CPU does), FP8 multiplies the
 * decoded e4m3 values in fp32 (the CPU's emulation of an FP8 tensor core).
 *
 * What this is not: a tensor-core kernel. W8A8 / FP8 / INT4 at 2..8 rows
 * go to qgemv_tc.cu's mma kernel when the shape fits (its cost hardly grows
 * with M); this one serves M = 1 (where it was faster), W8A16, the other
 * shapes, batch-invariant mode and the rows below the tensor-core kernel's
 * bound (loom_cuda_qgemm_set_tc_min_m).
 * For larger M qgemm.c hands the work to qmma.cu or cuBLASLt.
 */
#include "common.cuh"
#include "epilogue.cuh"

#include <cuda_fp8.h>

#include <atomic>

#include "gemv.h" /* lc_epi_count */
#include "qgemm.h"

#define LC_QGEMV_WARPS 4

#include "qdecode.cuh" /* the decodes and the GEMV pass */

/* Which kernels load their first pass early (common.cuh: "Early weights"):
 * FP8 at one row only, the one a decode step measured faster with them
 * (batch-1 TPOT 3.105 -> 3.004 ms on Llama-3-8B). W8A16 was slower through
 * the engine although faster in a chain of GEMVs, INT4 gained only in that
 * chain, and W8A8 and more rows (registers grow: FP8 at 6-8 rows from 4 to
 * 3 CTAs an SM) are unmeasured: those keep the late loop and its L2
 * prefetch (docs/performance.md, "Tried and rejected"). */
#define LC_QGEMV_EARLY(FMT, M) ((FMT) == LOOM_CUDA_Q_FP8 && (M) == 1)

/* x (M, K) dt for W8A16 / INT4; xq (M, K) int8 / e4m3 codes and sx (M)
 * for W8A8 / FP8. wd: (N, row_bytes) data; sc: scales as in
 * loom_cuda_qweight. y (M, N) dt or f32. PAIR (M = 1, y dt): the rows in
 * pairs (n, n + P) and epi applied to them (epilogue.cuh) — each row's sum
 * as without. */
template <typename T, int FMT, int M, int R, int U, bool F32, bool PAIR = false, int S = 1>
__global__ void __launch_bounds__(LC_QGEMV_WARPS * 32)
    lc_qgemv_kernel(const T *__restrict__ x, const uint8_t *__restrict__ xq,
                    const float *__restrict__ sx, const uint8_t *__restrict__ wd,
                    const float *__restrict__ sc, void *__restrict__ y, int N, int K, int group,
                    int pf, int P, loom_cuda_epi epi) {
    static_assert(!PAIR || (M == 1 && !F32 && LC_QGEMV_WARPS == LC_EPI_WARPS && S == 1), "pair epilogue: one dt row");
    static_assert(LC_QGEMV_WARPS % S == 0, "S warps share a row group");
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    constexpr bool EARLY = LC_QGEMV_EARLY(FMT, M);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = warp % S; /* which of the S slices of K this warp sums (split; S = 1: all of K) */
    bool live = true;
    const int n0 = PAIR ? lc_epi_row0(R, P, N, warp, &live)
                        : (blockIdx.x * (LC_QGEMV_WARPS / S) + warp / S) * R;
    if (!PAIR) live = n0 < N;
    const size_t row_bytes = I4 ? (size_t)K / 2 : (size_t)K;
    /* 16-byte chunks: the slice [c0, nc) of each row (the launcher makes
     * the row's chunks a multiple of S) */
    const int ncs = (int)(row_bytes / 16) / S, c0 = ks * ncs + lane, nc = (ks + 1) * ncs;
    int nr[R];                            /* row of each slot (clamped: read, never stored) */
    const uint8_t *wr[R];
    uint4 wv[U][R];
    bool pre = false;
    if constexpr (EARLY) {
        /* early: the lane's first U chunks of each row into registers
         * before the wait, while the kernel before still runs (no kernel
         * writes a weight) — the loop below starts on them */
        lc_qgemv_rows<R>(n0, N, wd, row_bytes, nr, wr);
        pre = live;
        if (pre) lc_qgemv_load<U, R>(wv, wr, c0, nc);
    }
    /* else the warp's R rows of codes are contiguous: ask L2 for them first */
    if (!pre && pf && live && ks == 0)
        lc_prefetch_rows(wd + (size_t)n0 * row_bytes, N - n0 < R ? N - n0 : R, row_bytes, lane);
    lc_pdl_trigger();
    lc_pdl_wait();
    if (!PAIR && !live) return; /* PAIR: every warp reaches lc_epi_finish's barrier */
    if constexpr (!EARLY) lc_qgemv_rows<R>(n0, N, wd, row_bytes, nr, wr);
    const int groups = I4 ? K / group : 1;
    float acc[R][M];
    int iacc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f, iacc[r][m] = 0;

    if constexpr (EARLY) {
        /* the first pass on the loads above (or made now), peeled so that
         * the loop keeps its loads at the top of each pass. Loads at the
         * bottom of each pass instead (no peel) keep two passes' chunks
         * live (up to +40 registers at M > 1) and measured slower: FP8
         * 83.1 vs 79.7 us for one Llama-3-8B layer with its small kernels */
        if (!pre) lc_qgemv_load<U, R>(wv, wr, c0, nc);
        lc_qgemv_pass<T, FMT, M, R, U>(wv, x, xq, sc, nr, K, groups, group, c0, nc, acc, iacc);
        for (int c = c0 + 32 * U; c < nc; c += 32 * U) {
            lc_qgemv_load<U, R>(wv, wr, c, nc);
            lc_qgemv_pass<T, FMT, M, R, U>(wv, x, xq, sc, nr, K, groups, group, c, nc, acc, iacc);
        }
    } else {
        for (int c = c0; c < nc; c += 32 * U) {
            lc_qgemv_load<U, R>(wv, wr, c, nc);
            lc_qgemv_pass<T, FMT, M, R, U>(wv, x, xq, sc, nr, K, groups, group, c, nc, acc, iacc);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8)
                    iacc[r][m] += __shfl_xor_sync(0xffffffffu, iacc[r][m], o);
                else
                    acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
            }
    if constexpr (S > 1) {
        /* the slices' sums meet in shared memory; the row group's first
         * warp adds them in slice order (fixed: the same bits every run) */
        __shared__ float part[LC_QGEMV_WARPS][R][M];
        __shared__ int ipart[LC_QGEMV_WARPS][R][M];
        if (lane == 0 && ks > 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < M; m++) part[warp][r][m] = acc[r][m], ipart[warp][r][m] = iacc[r][m];
        __syncthreads(); /* every warp reaches it: a split launch has no dead warp (lc_qgemv_slices) */
        if (ks > 0) return;
#pragma unroll
        for (int j = 1; j < S; j++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < M; m++) acc[r][m] += part[warp + j][r][m], iacc[r][m] += ipart[warp + j][r][m];
    }
    if constexpr (PAIR) { /* the sums as the store below forms them (n0 + r < N here) */
        float sum[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int n = n0 + r;
            if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A16) sum[r] = acc[r][0] * sc[n];
            else if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) sum[r] = (float)iacc[r][0] * (sx[0] * sc[n]);
            else if constexpr (FMT == LOOM_CUDA_Q_FP8) sum[r] = acc[r][0] * (sx[0] * sc[n]);
            else sum[r] = acc[r][0];
        }
        lc_epi_finish<T, R>(epi, y, P, N, sum);
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int n = n0 + r;
            if (n >= N) break;
#pragma unroll
            for (int m = 0; m < M; m++) {
                float v;
                if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A16) v = acc[r][m] * sc[n];
                else if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8)
                    v = (float)iacc[r][m] * (sx[m] * sc[n]);
                else if constexpr (FMT == LOOM_CUDA_Q_FP8) v = acc[r][m] * (sx[m] * sc[n]);
                else v = acc[r][m];
                const size_t i = (size_t)m * N + n;
                if (F32) static_cast<float *>(y)[i] = v;
                else static_cast<T *>(y)[i] = lc_from_f<T>(v);
            }
        }
    }
}

/* Launches of the split one-row kernel (S = 2 in lc_qgemv_kernel) so far. */
static std::atomic<long> lc_split_launches{0};
extern "C" long lc_qgemv_split_count(void) { return lc_split_launches; }

/* The one-row kernel's rows a warp (R) and chunks a row in flight a lane (U). */
template <int FMT, int M>
constexpr int lc_qgemv_rows() {
    return FMT == LOOM_CUDA_Q_INT4 ? (M == 1 ? 4 : 2) : M <= 4 ? 2 : 4;
}
template <int M>
constexpr int lc_qgemv_u() {
    return M <= 2 ? 4 : 2;
}

/* CTAs of the unsplit one-row kernel the current device holds at once,
 * asked once per device (tensor-parallel ranks are threads on different
 * GPUs); 0 when the query fails (the caller then does not split; the
 * query's own error is not left for a later launch to be blamed for). */
template <typename T, int FMT, bool F32>
static int lc_qgemv_resident(void) {
    static std::atomic<int> memo[64];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        if (cudaPeekAtLastError() == e) (void)cudaGetLastError();
        return 0;
    }
    int v = memo[dev & 63].load(std::memory_order_relaxed);
    if (v > 0) return v;
    constexpr int R = lc_qgemv_rows<FMT, 1>(), U = lc_qgemv_u<1>();
    int per_sm = 0, sms = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lc_qgemv_kernel<T, FMT, 1, R, U, F32, false, 1>,
                                                      LC_QGEMV_WARPS * 32, 0);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess || per_sm < 1 || sms < 1) {
        if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError();
        return 0;
    }
    v = per_sm * sms;
    memo[dev & 63].store(v, std::memory_order_relaxed);
    return v;
}

/* S, the slices of K of a one-row call of w (1: unsplit): 2 where the
 * unsplit grid leaves the GPU short of a full wave — Llama-3-8B's O and
 * down projections, 512 CTAs of W8A16 (256 of INT4) on 132 SMs that hold
 * ~1200 (~530) — so that a matrix of few rows runs as many warps as a wide
 * one; one whole layer at one token on the H200 (gpu_bench --layer 256,
 * bench/results/h200-llama3-8b-decode-layer.json): W8A16 80.6 -> 77.8 us,
 * INT4 67.3 -> 63.5, where 4 slices are slower than none (82.2, 73.2: a
 * lane has fewer chunks in flight) and so are not built. Only where the
 * rows divide into whole split CTAs (so no warp of one is dead: every warp
 * meets the barrier) and the row's chunks into slices of at least one chunk
 * a lane. */
template <typename T, int FMT, bool F32>
static int lc_qgemv_slices(const loom_cuda_qweight *w) {
    constexpr int R = lc_qgemv_rows<FMT, 1>(), S = 2;
    const int rows_per_cta = LC_QGEMV_WARPS * R;
    const int chunks = (int)((FMT == LOOM_CUDA_Q_INT4 ? (size_t)w->K / 2 : (size_t)w->K) / 16);
    const int resident = lc_qgemv_resident<T, FMT, F32>();
    if (resident <= 0 || (w->N + rows_per_cta - 1) / rows_per_cta > resident) return 1;
    if (chunks % S || chunks / S < 32 || w->N % (rows_per_cta / S)) return 1;
    return S;
}

/* PAIR (M = 1, dt out): with the pair epilogue epi of P (lc_epi_p) — the
 * same R, U and loads; its 2R pairs a CTA are the plain kernel's 4R rows,
 * so the grid is the same too; it does not split K (splitting it too was
 * slower: H200, engine batch 1, W8A16-head 2.712 vs 2.663 ms, FP8 2.945 vs
 * 2.883 — those grids already fill the GPU). split (M = 1, not PAIR, not
 * batch-invariant: the sums' order changes): K may be split across the
 * CTA's warps (lc_qgemv_slices). */
template <typename T, int FMT, int M, bool F32, bool PAIR = false>
static cudaError_t lc_qgemv_m(const loom_cuda_qweight *w, const void *x, const void *xq,
                              const float *sx, void *y, cudaStream_t s, int P = 0,
                              const loom_cuda_epi *epi = nullptr, bool split = false) {
    /* rows per warp: enough to reuse each x load, few enough to keep the
     * registers of R x M accumulators (and INT4's partial sums). INT4 at
     * one row: 4 rows a warp with 4 chunks each in flight (128 registers) —
     * x's conversion and sum shared by twice the rows; one Llama-3-8B layer
     * 76.4 -> 72.8 us on the H200 (gpu_bench --quant-m 1), where the same
     * layout with 2 chunks in flight is slower (82.3). */
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    constexpr int R = lc_qgemv_rows<FMT, M>();
    constexpr int U = lc_qgemv_u<M>();
    const int rows_per_cta = LC_QGEMV_WARPS * R;
    const unsigned grid = (unsigned)((w->N + rows_per_cta - 1) / rows_per_cta);
    constexpr bool early = LC_QGEMV_EARLY(FMT, M); /* and then no L2 prefetch of the same bytes */
    const size_t row_bytes = I4 ? (size_t)w->K / 2 : (size_t)w->K;
    const int pf = early ? 0 : lc_weight_prefetch((size_t)w->N * row_bytes);
    const loom_cuda_epi e = epi ? *epi : loom_cuda_epi{};
    if constexpr (M == 1 && !PAIR) {
        const int S = split ? lc_qgemv_slices<T, FMT, F32>(w) : 1;
        if (S == 2) {
            lc_split_launches++;
            return lc_launch(lc_qgemv_kernel<T, FMT, M, R, U, F32, false, 2>,
                             dim3((unsigned)(w->N / (rows_per_cta / S))), dim3(LC_QGEMV_WARPS * 32), 0, s,
                             static_cast<const T *>(x), static_cast<const uint8_t *>(xq), sx,
                             static_cast<const uint8_t *>(w->data), w->scales, y, w->N, w->K, w->group, pf, P, e);
        }
    }
    return lc_launch(lc_qgemv_kernel<T, FMT, M, R, U, F32, PAIR>, dim3(grid), dim3(LC_QGEMV_WARPS * 32),
                     0, s, static_cast<const T *>(x), static_cast<const uint8_t *>(xq), sx,
                     static_cast<const uint8_t *>(w->data), w->scales, y, w->N, w->K, w->group, pf, P, e);
}

template <typename T>
static cudaError_t lc_qgemv_pair_t(const loom_cuda_qweight *w, const void *x, const void *xq, const float *sx,
                                   void *y, int P, const loom_cuda_epi *epi, cudaStream_t s) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16: return lc_qgemv_m<T, LOOM_CUDA_Q_INT8_W8A16, 1, false, true>(w, x, xq, sx, y, s, P, epi);
    case LOOM_CUDA_Q_INT8_W8A8: return lc_qgemv_m<T, LOOM_CUDA_Q_INT8_W8A8, 1, false, true>(w, x, xq, sx, y, s, P, epi);
    case LOOM_CUDA_Q_FP8: return lc_qgemv_m<T, LOOM_CUDA_Q_FP8, 1, false, true>(w, x, xq, sx, y, s, P, epi);
    case LOOM_CUDA_Q_INT4: return lc_qgemv_m<T, LOOM_CUDA_Q_INT4, 1, false, true>(w, x, xq, sx, y, s, P, epi);
    default: return cudaErrorNotSupported;
    }
}

template <typename T, int FMT, bool F32>
static cudaError_t lc_qgemv_f(int M, const loom_cuda_qweight *w, const void *x, const void *xq,
                              const float *sx, void *y, cudaStream_t s, bool split) {
    switch (M) {
    case 1: return lc_qgemv_m<T, FMT, 1, F32>(w, x, xq, sx, y, s, 0, nullptr, split);
    case 2: return lc_qgemv_m<T, FMT, 2, F32>(w, x, xq, sx, y, s);
    case 3: return lc_qgemv_m<T, FMT, 3, F32>(w, x, xq, sx, y, s);
    case 4: return lc_qgemv_m<T, FMT, 4, F32>(w, x, xq, sx, y, s);
    case 5: return lc_qgemv_m<T, FMT, 5, F32>(w, x, xq, sx, y, s);
    case 6: return lc_qgemv_m<T, FMT, 6, F32>(w, x, xq, sx, y, s);
    case 7: return lc_qgemv_m<T, FMT, 7, F32>(w, x, xq, sx, y, s);
    case 8: return lc_qgemv_m<T, FMT, 8, F32>(w, x, xq, sx, y, s);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T, bool F32>
static cudaError_t lc_qgemv_t(int M, const loom_cuda_qweight *w, const void *x, const void *xq,
                              const float *sx, void *y, cudaStream_t s, bool split) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16:
        return lc_qgemv_f<T, LOOM_CUDA_Q_INT8_W8A16, F32>(M, w, x, xq, sx, y, s, split);
    case LOOM_CUDA_Q_INT8_W8A8:
        return lc_qgemv_f<T, LOOM_CUDA_Q_INT8_W8A8, F32>(M, w, x, xq, sx, y, s, split);
    case LOOM_CUDA_Q_FP8: return lc_qgemv_f<T, LOOM_CUDA_Q_FP8, F32>(M, w, x, xq, sx, y, s, split);
    case LOOM_CUDA_Q_INT4: return lc_qgemv_f<T, LOOM_CUDA_Q_INT4, F32>(M, w, x, xq, sx, y, s, split);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t lc_qgemv_epi(loom_cuda_dt dt, const loom_cuda_qweight *w, const void *x, const void *xq,
                                    const float *sx, void *y, const loom_cuda_epi *epi, int invariant,
                                    int tc_min_m, cudaStream_t s) {
    /* only where lc_qgemv would run this kernel at M = 1 */
    const int P = lc_epi_p(epi, w->N);
    if (!P || w->fmt == LOOM_CUDA_Q_GGUF || !loom_cuda_qweight_ok(w->fmt, w->K, w->group) ||
        lc_qgemv_use_tc(w->fmt, w->K, w->group, 1, invariant, tc_min_m))
        return cudaErrorNotSupported;
    lc_qgemv_count_cc();
    const cudaError_t e = dt == LOOM_CUDA_F16 ? lc_qgemv_pair_t<__half>(w, x, xq, sx, y, P, epi, s)
                                              : lc_qgemv_pair_t<__nv_bfloat16>(w, x, xq, sx, y, P, epi, s);
    if (e == cudaSuccess) lc_epi_count();
    return e;
}

template <typename T>
static int lc_qgemv_slices_t(const loom_cuda_qweight *w) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16: return lc_qgemv_slices<T, LOOM_CUDA_Q_INT8_W8A16, false>(w);
    case LOOM_CUDA_Q_INT8_W8A8: return lc_qgemv_slices<T, LOOM_CUDA_Q_INT8_W8A8, false>(w);
    case LOOM_CUDA_Q_FP8: return lc_qgemv_slices<T, LOOM_CUDA_Q_FP8, false>(w);
    case LOOM_CUDA_Q_INT4: return lc_qgemv_slices<T, LOOM_CUDA_Q_INT4, false>(w);
    default: return 1;
    }
}

extern "C" int lc_qgemv_splits(loom_cuda_dt dt, const loom_cuda_qweight *w, int invariant, int tc_min_m) {
    /* lc_qgemv's choice at M = 1 (dt output; f32 outputs decide alike) */
    if (invariant || w->N <= 0 || w->fmt == LOOM_CUDA_Q_GGUF || !loom_cuda_qweight_ok(w->fmt, w->K, w->group) ||
        lc_qgemv_use_tc(w->fmt, w->K, w->group, 1, 0, tc_min_m))
        return 0;
    return (dt == LOOM_CUDA_F16 ? lc_qgemv_slices_t<__half>(w) : lc_qgemv_slices_t<__nv_bfloat16>(w)) > 1;
}

extern "C" cudaError_t lc_qgemv(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                                const void *x, const void *xq, const float *sx, void *y,
                                int invariant, int tc_min_m, cudaStream_t s) {
    if (M < 1 || M > LC_QGEMV_MAX_M || w->N <= 0 || !loom_cuda_qweight_ok(w->fmt, w->K, w->group))
        return cudaErrorInvalidValue;
    if (lc_qgemv_use_tc(w->fmt, w->K, w->group, M, invariant, tc_min_m))
        return lc_qgemv_tc(dt, out_f32, M, w, x, xq, sx, y, s);
    lc_qgemv_count_cc();
    const bool split = !invariant; /* the batch-invariant rows keep one order at every M */
    if (dt == LOOM_CUDA_F16)
        return out_f32 ? lc_qgemv_t<__half, true>(M, w, x, xq, sx, y, s, split)
                       : lc_qgemv_t<__half, false>(M, w, x, xq, sx, y, s, split);
    return out_f32 ? lc_qgemv_t<__nv_bfloat16, true>(M, w, x, xq, sx, y, s, split)
                   : lc_qgemv_t<__nv_bfloat16, false>(M, w, x, xq, sx, y, s, split);
}

/* -------------------------------------------------- activation quantizer */

#define LC_QACT_MAXC 8      /* 8-element chunks a thread keeps in registers    */
#define LC_QACT_THREADS 512 /* at most: ~90 registers x 512 fit the SM's 65536 */
#define LC_QACT_STREAM_M 128 /* rows from which threads are few and chunks many */

/* Eight activations of row m at chunk c: x (M, K) dt, or with SWIGLU
 * silu(g) * u from gu (M, 2K) rounded to dt — loom_cuda_swiglu's expression
 * and rounding, so the codes equal those of swiglu then quantize — each
 * divided by its SmoothQuant factor when there is one. */
template <typename T, bool SWIGLU>
__device__ __forceinline__ void lc_qact_load8(const T *__restrict__ x, const float *__restrict__ smooth,
                                              int m, int c, int K, float *v) {
    if (SWIGLU) {
        const T *g = x + (size_t)m * 2 * K + (size_t)c * 8;
        float gf[8], uf[8];
        lc_unpack8<T>(lc_ldg16(g), gf);
        lc_unpack8<T>(lc_ldg16(g + K), uf);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = lc_silu_mul(gf[e], uf[e]);
        lc_unpack8<T>(lc_pack8<T>(v), v);
    } else {
        lc_unpack8<T>(lc_ldg16(x + (size_t)m * K + (size_t)c * 8), v);
    }
    if (smooth) {
        const float4 s0 = __ldg(reinterpret_cast<const float4 *>(smooth + (size_t)c * 8));
        const float4 s1 = __ldg(reinterpret_cast<const float4 *>(smooth + (size_t)c * 8) + 1);
        v[0] /= s0.x, v[1] /= s0.y, v[2] /= s0.z, v[3] /= s0.w;
        v[4] /= s1.x, v[5] /= s1.y, v[6] /= s1.z, v[7] /= s1.w;
    }
}

/* One CTA per row m; see qgemm.h for the arithmetic. 16-byte loads, the
 * row kept in registers between the max and the quantization (KEEP: at
 * most LC_QACT_MAXC chunks a thread) or else loaded twice (the second time
 * from L1/L2). 8 codes stored at a time. */
template <typename T, bool FP8, bool SWIGLU, bool KEEP>
__global__ void __launch_bounds__(LC_QACT_THREADS) lc_quant_act_kernel(const T *__restrict__ x, const float *__restrict__ smooth,
                                    uint8_t *__restrict__ xq, float *__restrict__ sx, int K) {
    lc_pdl_trigger();
    lc_pdl_wait();
    __shared__ float red[32];
    const int m = blockIdx.x, nc = K / 8;
    uint8_t *qr = xq + (size_t)m * K;
    float v[KEEP ? LC_QACT_MAXC : 1][8];
    float amax = 0.0f;
    if constexpr (KEEP) {
#pragma unroll
        for (int j = 0; j < LC_QACT_MAXC; j++) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < nc) {
                lc_qact_load8<T, SWIGLU>(x, smooth, m, c, K, v[j]);
#pragma unroll
                for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[j][e]));
            }
        }
    } else {
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            lc_qact_load8<T, SWIGLU>(x, smooth, m, c, K, v[0]);
#pragma unroll
            for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[0][e]));
        }
    }
    amax = lc_block_max(amax, red);
    const float sc = FP8 ? amax / 448.0f : amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f; /* int8 */
    if (threadIdx.x == 0) sx[m] = sc;
    if constexpr (KEEP) {
#pragma unroll
        for (int j = 0; j < LC_QACT_MAXC; j++) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < nc) lc_qact_store8<FP8>(v[j], sc, inv, qr + (size_t)c * 8);
        }
    } else {
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            lc_qact_load8<T, SWIGLU>(x, smooth, m, c, K, v[0]);
            lc_qact_store8<FP8>(v[0], sc, inv, qr + (size_t)c * 8);
        }
    }
}

template <typename T, bool FP8, bool SWIGLU>
static cudaError_t lc_quant_act_t(int M, int K, const void *x, const float *smooth, void *xq,
                                  float *sx, cudaStream_t s) {
    /* Few rows (decode): latency — a chunk a thread where the row allows,
     * up to LC_QACT_THREADS threads. Many rows (prefill): bytes in flight —
     * the keeping kernel holds ~90 registers a thread, so a 512-thread CTA
     * with one chunk a thread is one CTA and 8 KB of loads an SM (H200: a
     * 2048-token FP8 prefill fell from 1.38x to 1.30x bf16 so); instead as
     * few threads as give each LC_QACT_MAXC chunks, all loaded at once
     * (K = 4096: 64 threads, ~11 CTAs an SM). Rows too wide to keep:
     * 256 threads reading the row twice (the second time from L1 / L2).
     * Every choice gives the same codes (a max and per-element maps). */
    const int nc = K / 8;
    const int want = M < LC_QACT_STREAM_M ? nc : (nc + LC_QACT_MAXC - 1) / LC_QACT_MAXC;
    int threads = ((want + 31) / 32) * 32;
    threads = threads < 64 ? 64 : threads > LC_QACT_THREADS ? LC_QACT_THREADS : threads;
    const bool keep = nc <= threads * LC_QACT_MAXC;
    if (!keep) threads = 256;
    auto *kern = keep ? lc_quant_act_kernel<T, FP8, SWIGLU, true> : lc_quant_act_kernel<T, FP8, SWIGLU, false>;
    return lc_launch(kern, dim3((unsigned)M), dim3(threads), 0, s, static_cast<const T *>(x), smooth,
                     static_cast<uint8_t *>(xq), sx, K);
}

extern "C" cudaError_t lc_quant_act(loom_cuda_dt dt, int fp8, int swiglu, int M, int K, const void *x,
                                    const float *smooth, void *xq, float *sx, cudaStream_t s) {
    if (M <= 0) return cudaSuccess;
    /* 16-byte loads of x, 8-byte code stores; smooth read as float4 */
    if (K % 8 || ((uintptr_t)x & 15) || ((uintptr_t)xq & 7) || ((uintptr_t)smooth & 15))
        return cudaErrorInvalidValue;
    cudaError_t e = cudaErrorInvalidValue;
    LOOM_CUDA_DISPATCH_DT(dt, {
        if (fp8) e = swiglu ? lc_quant_act_t<E, true, true>(M, K, x, smooth, xq, sx, s)
                            : lc_quant_act_t<E, true, false>(M, K, x, smooth, xq, sx, s);
        else e = swiglu ? lc_quant_act_t<E, false, true>(M, K, x, smooth, xq, sx, s)
                        : lc_quant_act_t<E, false, false>(M, K, x, smooth, xq, sx, s);
    });
    return e;
}

/* ------------------------------------------------------- dequantize to dt */

#define LC_DQ_THREADS 256

/* One thread per 16-byte chunk of weight data: 16 int8 or 32 int4 weights
 * -> dt. out (N, K). */
template <typename T, bool I4>
__global__ void __launch_bounds__(LC_DQ_THREADS)
    lc_dequant_kernel(const uint8_t *__restrict__ wd, const float *__restrict__ sc,
                      T *__restrict__ out, int N, int K, int group) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const size_t row_bytes = I4 ? (size_t)K / 2 : (size_t)K;
    const size_t per_row = row_bytes / 16, total = per_row * (size_t)N;
    for (size_t i = (size_t)blockIdx.x * LC_DQ_THREADS + threadIdx.x; i < total;
         i += (size_t)gridDim.x * LC_DQ_THREADS) {
        const size_t n = i / per_row, c = i % per_row;
        const uint4 v = __ldcs(reinterpret_cast<const uint4 *>(wd + n * row_bytes + c * 16));
        if (I4) {
            const float2 sb = __ldg(reinterpret_cast<const float2 *>(sc) +
                                    n * (size_t)(K / group) + (c * 32) / (size_t)group);
            T *o = out + n * (size_t)K + c * 32;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float f[8];
                lc_u4x8(lc_word(v, j), f);
#pragma unroll
                for (int e = 0; e < 8; e++) f[e] = fmaf(f[e], sb.x, sb.y);
                lc_stg16(o + j * 8, lc_pack8<T>(f));
            }
        } else {
            const float s = sc[n];
            T *o = out + n * (size_t)K + c * 16;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float f[8];
                lc_i8x4(lc_word(v, 2 * h), f);
                lc_i8x4(lc_word(v, 2 * h + 1), f + 4);
#pragma unroll
                for (int e = 0; e < 8; e++) f[e] *= s;
                lc_stg16(o + h * 8, lc_pack8<T>(f));
            }
        }
    }
}

extern "C" cudaError_t lc_dequant_weight(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out,
                                         cudaStream_t s) {
    const bool i4 = w->fmt == LOOM_CUDA_Q_INT4;
    if ((!i4 && w->fmt != LOOM_CUDA_Q_INT8_W8A16 && w->fmt != LOOM_CUDA_Q_INT8_W8A8) ||
        !loom_cuda_qweight_ok(w->fmt, w->K, w->group) || w->N <= 0)
        return cudaErrorInvalidValue;
    const size_t chunks = (size_t)w->N * (size_t)(i4 ? w->K / 32 : w->K / 16);
    size_t blocks = (chunks + LC_DQ_THREADS - 1) / LC_DQ_THREADS;
    if (blocks > 132 * 16) blocks = 132 * 16; /* grid-stride beyond ~16 waves of CTAs */
    cudaError_t e = cudaErrorInvalidValue;
    LOOM_CUDA_DISPATCH_DT(dt, {
        e = i4 ? lc_launch(lc_dequant_kernel<E, true>, dim3((unsigned)blocks), dim3(LC_DQ_THREADS),
                           0, s, static_cast<const uint8_t *>(w->data), w->scales,
                           static_cast<E *>(out), w->N, w->K, w->group)
               : lc_launch(lc_dequant_kernel<E, false>, dim3((unsigned)blocks),
                           dim3(LC_DQ_THREADS), 0, s, static_cast<const uint8_t *>(w->data),
                           w->scales, static_cast<E *>(out), w->N, w->K, w->group);
    });
    return e;
}

/* ------------------------------------------------------------- epilogue */

/* y[m, n] = in[m, n] * (sx[m] * sw[n]); IN: 0 dt, 1 f32, 2 int32. */
template <typename T, int IN, bool F32>
__global__ void __launch_bounds__(256)
    lc_scale_kernel(const void *in, void *y, const float *__restrict__ sx,
                    const float *__restrict__ sw, int M, int N) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const size_t total = (size_t)M * (size_t)N;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < total; i += (size_t)gridDim.x * 256) {
        const size_t m = i / (size_t)N, n = i % (size_t)N;
        float v;
        if (IN == 0) v = lc_to_f(static_cast<const T *>(in)[i]);
        else if (IN == 1) v = static_cast<const float *>(in)[i];
        else v = (float)static_cast<const int *>(in)[i];
        v *= sx[m] * sw[n];
        if (F32) static_cast<float *>(y)[i] = v;
        else static_cast<T *>(y)[i] = lc_from_f<T>(v);
    }
}

template <typename T, int IN>
static cudaError_t lc_scale_in(int out_f32, const void *in, void *y, const float *sx,
                               const float *sw, int M, int N, cudaStream_t s) {
    const size_t total = (size_t)M * (size_t)N;
    size_t blocks = (total + 255) / 256;
    if (blocks > 132 * 32) blocks = 132 * 32;
    return out_f32 ? lc_launch(lc_scale_kernel<T, IN, true>, dim3((unsigned)blocks), dim3(256), 0,
                               s, in, y, sx, sw, M, N)
                   : lc_launch(lc_scale_kernel<T, IN, false>, dim3((unsigned)blocks), dim3(256),
                               0, s, in, y, sx, sw, M, N);
}

extern "C" cudaError_t lc_scale_epilogue(loom_cuda_dt dt, int in_kind, const void *in,
                                         int out_f32, void *y, const float *sx, const float *sw,
                                         int M, int N, cudaStream_t s) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    cudaError_t e = cudaErrorInvalidValue;
    LOOM_CUDA_DISPATCH_DT(dt, {
        if (in_kind == 0) e = lc_scale_in<E, 0>(out_f32, in, y, sx, sw, M, N, s);
        else if (in_kind == 1) e = lc_scale_in<E, 1>(out_f32, in, y, sx, sw, M, N, s);
        else e = lc_scale_in<E, 2>(out_f32, in, y, sx, sw, M, N, s);
    });
    return e;
}
