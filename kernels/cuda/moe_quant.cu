/*
 * kernels/cuda/moe_quant.cu — the mixture-of-experts FFN's linear layers on
 * quantized expert weights (cuda_kernels.h, "Quantized experts"): int8
 * (W8A16 and W8A8), e4m3 (FP8: e4m3 activations too) and group-wise int4,
 * stacked E experts deep in loom_cuda_qweight's layout. moe.cu's routing,
 * grouping and combine are unchanged; these replace its two linear kernels:
 *
 *   loom_cuda_moe_qgemv  few pairs: per pair the GEMV of its own expert —
 *                        qgemm.cu's one-row CUDA-core GEMV (the same
 *                        decodes and inner pass: qdecode.cuh) with the
 *                        expert's data and scales picked from sel[p], so
 *                        only the chosen experts' bytes are read;
 *   loom_cuda_moe_qgemm  many pairs: moe.cu's grouped mma.sync GEMM (64 x
 *                        128 tiles over the rows sorted by expert) whose
 *                        tile loader decodes the weights in registers on
 *                        their way to shared memory: int8 / e4m3 codes as
 *                        exact dt values (the per-row scale is applied in
 *                        the epilogue), int4 as q s + b rounded to dt (a
 *                        32-column step lies inside one group). W8A8 / FP8
 *                        take the activations as codes (exact in dt too)
 *                        and scale by the token's sx in the epilogue, so
 *                        the products are the cpu backend's.
 *
 * Weights (and W8A8 / FP8 activation codes) are loaded through registers
 * one k-step ahead, since their decode needs the bytes there anyway; dt
 * activation tiles come by cp.async; two stages, not moe.cu's ring of three
 * (the decoded tiles pass through registers). Fragments by ldmatrix
 * (moe_tile.cuh).
 */
#include "cp_async.cuh"
#include "moe_tile.cuh"
#include "qdecode.cuh"
#include "qgemm.h"

#define LC_MQ_WARPS 4

/* ----------------------------------------------------------- the layout */

static bool lc_mq_fmt(loom_cuda_qfmt f) {
    return f == LOOM_CUDA_Q_INT8_W8A16 || f == LOOM_CUDA_Q_INT8_W8A8 || f == LOOM_CUDA_Q_FP8 || f == LOOM_CUDA_Q_INT4;
}

extern "C" int loom_cuda_moe_qweight_ok(loom_cuda_qfmt fmt, int N, int K, int group) {
    if (!lc_mq_fmt(fmt) || N <= 0 || N % 8 || K <= 0) return 0;
    /* the GEMM's weight loader moves 16 codes (int4: 32) a load */
    if (fmt == LOOM_CUDA_Q_INT4) return group >= 32 && group % 32 == 0 && K % group == 0;
    return K % 16 == 0;
}

extern "C" size_t loom_cuda_moe_qdata_bytes(const loom_cuda_qweight *w) {
    return (size_t)w->N * (w->fmt == LOOM_CUDA_Q_INT4 ? (size_t)w->K / 2 : (size_t)w->K);
}

extern "C" size_t loom_cuda_moe_qscale_floats(const loom_cuda_qweight *w) {
    return w->fmt == LOOM_CUDA_Q_INT4 ? (size_t)w->N * (size_t)(w->K / w->group) * 2 : (size_t)w->N;
}

extern "C" int loom_cuda_moe_qacts(loom_cuda_qfmt fmt) {
    return fmt == LOOM_CUDA_Q_INT8_W8A8 ? 1 : fmt == LOOM_CUDA_Q_FP8 ? 2 : 0;
}

extern "C" cudaError_t loom_cuda_moe_quant_act(loom_cuda_dt dt, loom_cuda_qfmt fmt, int swiglu, int M, int K,
                                               const void *x, void *xq, float *sx, cudaStream_t s) {
    if (M <= 0) return cudaSuccess;
    if (!loom_cuda_moe_qacts(fmt)) return cudaErrorInvalidValue;
    return lc_quant_act(dt, fmt == LOOM_CUDA_Q_FP8, swiglu, M, K, x, NULL, xq, sx, s);
}

/* ---------------------------------------------------------------- GEMVs */

/* y (P, N) = per pair p: row p / div of x (xq, sx) @ dequant(W_{sel[p]})^T.
 * A warp per R output rows, blockIdx.y the pair: qgemm.cu's one-row
 * kernel (lc_qgemv_pass) on the pair's expert; zeros for a pair of another
 * rank's expert (sel < 0). */
template <typename T, int FMT, int R, int U>
__global__ void __launch_bounds__(LC_MQ_WARPS * 32)
    lc_moe_qgemv_kernel(const T *__restrict__ x, const uint8_t *__restrict__ xq, const float *__restrict__ sx,
                        int div, const int32_t *__restrict__ sel, const uint8_t *__restrict__ wd,
                        const float *__restrict__ sc, size_t wstride, size_t sstride, int N, int K, int group,
                        T *__restrict__ y) {
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = blockIdx.y;
    const int n0 = (blockIdx.x * LC_MQ_WARPS + warp) * R;
    if (n0 >= N) return;
    const int t = p / div, e = sel[p];
    if (e < 0) { /* another rank's expert: zeros, nothing read */
        for (int r = lane; r < R && n0 + r < N; r += 32) y[(size_t)p * N + n0 + r] = lc_from_f<T>(0.0f);
        return;
    }
    const T *xr = x ? x + (size_t)t * K : nullptr;
    const uint8_t *xqr = xq ? xq + (size_t)t * K : nullptr;
    const uint8_t *we = wd + (size_t)e * wstride;
    const float *se = sc + (size_t)e * sstride;
    const size_t row_bytes = I4 ? (size_t)K / 2 : (size_t)K;
    const int nc = (int)(row_bytes / 16), groups = I4 ? K / group : 1;
    int nr[R];
    const uint8_t *wr[R];
    lc_qgemv_rows<R>(n0, N, we, row_bytes, nr, wr);
    float acc[R][1];
    int iacc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = 0.0f, iacc[r][0] = 0;
    uint4 wv[U][R];
    for (int c = lane; c < nc; c += 32 * U) {
        lc_qgemv_load<U, R>(wv, wr, c, nc);
        lc_qgemv_pass<T, FMT, 1, R, U>(wv, xr, xqr, se, nr, K, groups, group, c, nc, acc, iacc);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) iacc[r][0] += __shfl_xor_sync(0xffffffffu, iacc[r][0], o);
            else acc[r][0] += __shfl_xor_sync(0xffffffffu, acc[r][0], o);
        }
    if (lane) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int n = n0 + r;
        if (n >= N) break;
        float v;
        if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A16) v = acc[r][0] * se[n];
        else if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) v = (float)iacc[r][0] * (sx[t] * se[n]);
        else if constexpr (FMT == LOOM_CUDA_Q_FP8) v = acc[r][0] * (sx[t] * se[n]);
        else v = acc[r][0];
        y[(size_t)p * N + n] = lc_from_f<T>(v);
    }
}

template <typename T, int FMT>
static cudaError_t lc_moe_qgemv_f(const void *x, const void *xq, const float *sx, int div, const int32_t *sel,
                                  const loom_cuda_qweight *w, int P, void *y, cudaStream_t s) {
    constexpr int R = FMT == LOOM_CUDA_Q_INT4 ? 4 : 2, U = 4;
    const size_t ws = loom_cuda_moe_qdata_bytes(w), ss = loom_cuda_moe_qscale_floats(w);
    const int chunk = 32768 / div * div; /* the grid height: launches of whole tokens' pairs */
    const size_t xrow = loom_cuda_moe_qacts(w->fmt) ? (size_t)w->K : (size_t)w->K * sizeof(T);
    for (int p0 = 0; p0 < P; p0 += chunk) {
        const int n = P - p0 < chunk ? P - p0 : chunk, t0 = p0 / div;
        const dim3 grid((unsigned)lc_ceil_div(w->N, LC_MQ_WARPS * R), (unsigned)n);
        lc_moe_qgemv_kernel<T, FMT, R, U><<<grid, LC_MQ_WARPS * 32, 0, s>>>(
            loom_cuda_moe_qacts(w->fmt) ? nullptr : (const T *)((const uint8_t *)x + (size_t)t0 * xrow),
            loom_cuda_moe_qacts(w->fmt) ? (const uint8_t *)xq + (size_t)t0 * xrow : nullptr,
            sx ? sx + t0 : nullptr, div, sel + p0, (const uint8_t *)w->data, w->scales, ws, ss, w->N, w->K,
            w->group, (T *)y + (size_t)p0 * w->N);
    }
    return cudaGetLastError();
}

template <typename T>
static cudaError_t lc_moe_qgemv_t(const void *x, const void *xq, const float *sx, int div, const int32_t *sel,
                                  const loom_cuda_qweight *w, int P, void *y, cudaStream_t s) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16: return lc_moe_qgemv_f<T, LOOM_CUDA_Q_INT8_W8A16>(x, xq, sx, div, sel, w, P, y, s);
    case LOOM_CUDA_Q_INT8_W8A8: return lc_moe_qgemv_f<T, LOOM_CUDA_Q_INT8_W8A8>(x, xq, sx, div, sel, w, P, y, s);
    case LOOM_CUDA_Q_FP8: return lc_moe_qgemv_f<T, LOOM_CUDA_Q_FP8>(x, xq, sx, div, sel, w, P, y, s);
    case LOOM_CUDA_Q_INT4: return lc_moe_qgemv_f<T, LOOM_CUDA_Q_INT4>(x, xq, sx, div, sel, w, P, y, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t loom_cuda_moe_qgemv(loom_cuda_dt dt, const void *x, const void *xq, const float *sx, int div,
                                           const int32_t *sel, const loom_cuda_qweight *w, int P, void *y,
                                           cudaStream_t s) {
    if (P <= 0) return cudaSuccess;
    if (!w || !loom_cuda_moe_qweight_ok(w->fmt, w->N, w->K, w->group) || div < 1 || div > 32768 ||
        (loom_cuda_moe_qacts(w->fmt) ? !xq || !sx : !x))
        return cudaErrorInvalidValue;
    return dt == LOOM_CUDA_F16 ? lc_moe_qgemv_t<__half>(x, xq, sx, div, sel, w, P, y, s)
                               : lc_moe_qgemv_t<__nv_bfloat16>(x, xq, sx, div, sel, w, P, y, s);
}

/* --------------------------------------------------------- grouped GEMM */

/* Eight int8 codes (words a, b) as exact dt values. */
template <typename T> __device__ __forceinline__ uint4 lc_mq_i8x8(uint32_t a, uint32_t b) {
    float f[8];
    lc_i8x4(a, f);
    lc_i8x4(b, f + 4);
    return lc_pack8<T>(f);
}

/* y (P, N) sorted rows = x rows @ dequant(W_e)^T per tile, as moe.cu's
 * lc_moe_gemm_kernel: block (n tile, tile slot), 4 warps 2 x 2 of 32 x 64.
 * Input row of sorted row r: perm ? perm[r] / div : r — of x (dt) or, for
 * W8A8 / FP8, of the codes xq with scale sx. */
template <typename T, int FMT>
__global__ void __launch_bounds__(128)
    lc_moe_qgemm_kernel(const T *__restrict__ x, const uint8_t *__restrict__ xq, const float *__restrict__ sx,
                        const int32_t *__restrict__ perm, int div, const uint8_t *__restrict__ wd,
                        const float *__restrict__ sc, size_t wstride, size_t sstride,
                        const int32_t *__restrict__ tiles, int N, int K, int group, T *__restrict__ y) {
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    constexpr bool AQ = FMT == LOOM_CUDA_Q_INT8_W8A8 || FMT == LOOM_CUDA_Q_FP8;
    __shared__ __align__(16) lc_moe_stage<T> st[2];
    const int slot = blockIdx.y;
    if (slot >= tiles[0]) return;
    const int32_t e = tiles[1 + 3 * slot], r0 = tiles[2 + 3 * slot], nrows = tiles[3 + 3 * slot];
    const int n0 = blockIdx.x * LC_MOE_BN;
    const uint8_t *we = wd + (size_t)e * wstride;
    const float *se = sc + (size_t)e * sstride;
    const size_t row_bytes = I4 ? (size_t)K / 2 : (size_t)K;
    const int groups = I4 ? K / group : 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;
    /* A: 64 rows x 4 chunks of 8 elements, 2 a thread */
    int ar[2], ac[2];
    bool aok[2];
    size_t arow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = tid + 128 * i;
        ar[i] = c >> 2, ac[i] = (c & 3) * 8;
        aok[i] = ar[i] < nrows;
        const int32_t r = r0 + (aok[i] ? ar[i] : 0);
        arow[i] = (size_t)(perm ? perm[r] / div : r);
    }
    /* B: int8 / e4m3 128 rows x 2 chunks of 16 codes, 2 a thread; int4 128
     * rows x 1 chunk of 32 codes, 1 a thread */
    constexpr int BL = I4 ? 1 : 2;
    int br[BL], bc[BL];
    bool bok[BL];
#pragma unroll
    for (int i = 0; i < BL; i++) {
        const int c = tid + 128 * i;
        br[i] = I4 ? c : c >> 1, bc[i] = I4 ? 0 : (c & 1) * 16;
        bok[i] = n0 + br[i] < N;
    }
    uint2 areg[2];
    uint4 breg[BL];
    float2 bsb = make_float2(0.0f, 0.0f);
    auto fetch = [&](int s, int k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const bool ok = aok[i] && k0 + ac[i] < K;
            if constexpr (AQ) {
                areg[i] = ok ? __ldg(reinterpret_cast<const uint2 *>(xq + arow[i] * K + k0 + ac[i])) : make_uint2(0u, 0u);
            } else {
                lc_cp16(&st[s].a[ar[i]][ac[i]], x + arow[i] * K + (ok ? k0 + ac[i] : 0), ok);
            }
        }
        if constexpr (!AQ) lc_cp_commit();
#pragma unroll
        for (int i = 0; i < BL; i++) {
            const bool ok = bok[i] && k0 + (I4 ? 0 : bc[i]) < K;
            const size_t off = (size_t)(n0 + br[i]) * row_bytes + (I4 ? (size_t)k0 / 2 : (size_t)(k0 + bc[i]));
            breg[i] = ok ? __ldcs(reinterpret_cast<const uint4 *>(we + off)) : make_uint4(0u, 0u, 0u, 0u);
            if constexpr (I4)
                bsb = ok ? __ldg(reinterpret_cast<const float2 *>(se) + (size_t)(n0 + br[i]) * groups + k0 / group)
                         : make_float2(0.0f, 0.0f);
        }
    };
    auto store = [&](int s) {
        if constexpr (AQ) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint4 v;
                if constexpr (FMT == LOOM_CUDA_Q_FP8) v = lc_e4m3x8<T>(areg[i]);
                else v = lc_mq_i8x8<T>(areg[i].x, areg[i].y);
                *reinterpret_cast<uint4 *>(&st[s].a[ar[i]][ac[i]]) = v;
            }
        }
#pragma unroll
        for (int i = 0; i < BL; i++) {
            if constexpr (I4) {
                /* q s + b; zero codes past the row end stay 0 (s = b = 0) */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float f[8];
                    lc_u4x8(lc_word(breg[i], j), f);
#pragma unroll
                    for (int q = 0; q < 8; q++) f[q] = fmaf(f[q], bsb.x, bsb.y);
                    *reinterpret_cast<uint4 *>(&st[s].b[br[i]][8 * j]) = lc_pack8<T>(f);
                }
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t a = lc_word(breg[i], 2 * h), b = lc_word(breg[i], 2 * h + 1);
                    uint4 v;
                    if constexpr (FMT == LOOM_CUDA_Q_FP8) v = lc_e4m3x8<T>(make_uint2(a, b));
                    else v = lc_mq_i8x8<T>(a, b);
                    *reinterpret_cast<uint4 *>(&st[s].b[br[i]][bc[i] + 8 * h]) = v;
                }
            }
        }
    };
    lc_moe_acc acc;
    lc_moe_acc_zero(acc);
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int nk = (K + LC_MOE_BK - 1) / LC_MOE_BK;
    fetch(0, 0);
    store(0);
    if constexpr (!AQ) lc_cp_wait<0>();
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        const int s = kt & 1;
        const bool more = kt + 1 < nk;
        if (more) fetch(s ^ 1, (kt + 1) * LC_MOE_BK);
        lc_moe_tile_step<T>(acc, st[s], wm, wn, lane);
        if (more) {
            store(s ^ 1);
            if constexpr (!AQ) lc_cp_wait<0>();
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wm + 16 * i + g + 8 * h;
            if (m >= nrows) continue;
            float rs = 1.0f;
            if constexpr (AQ) rs = sx[perm ? perm[r0 + m] / div : r0 + m];
            T *yr = y + (size_t)(r0 + m) * N;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int n = n0 + wn + 8 * j + c2;
                if (n < N) { /* N % 8 == 0: n + 1 < N too */
                    float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                    if constexpr (!I4) v0 *= rs * se[n], v1 *= rs * se[n + 1];
                    *reinterpret_cast<uint32_t *>(yr + n) = lc_pack2<T>(v0, v1);
                }
            }
        }
}

template <typename T, int FMT>
static cudaError_t lc_moe_qgemm_f(const void *x, const void *xq, const float *sx, const int32_t *perm, int div,
                                  const loom_cuda_qweight *w, const int32_t *tiles, int max_tiles, void *y,
                                  cudaStream_t s) {
    const dim3 grid((unsigned)lc_ceil_div(w->N, LC_MOE_BN), (unsigned)max_tiles);
    lc_moe_qgemm_kernel<T, FMT><<<grid, 128, 0, s>>>(
        (const T *)x, (const uint8_t *)xq, sx, perm, div, (const uint8_t *)w->data, w->scales,
        loom_cuda_moe_qdata_bytes(w), loom_cuda_moe_qscale_floats(w), tiles, w->N, w->K, w->group, (T *)y);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t lc_moe_qgemm_t(const void *x, const void *xq, const float *sx, const int32_t *perm, int div,
                                  const loom_cuda_qweight *w, const int32_t *tiles, int max_tiles, void *y,
                                  cudaStream_t s) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A16:
        return lc_moe_qgemm_f<T, LOOM_CUDA_Q_INT8_W8A16>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s);
    case LOOM_CUDA_Q_INT8_W8A8:
        return lc_moe_qgemm_f<T, LOOM_CUDA_Q_INT8_W8A8>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s);
    case LOOM_CUDA_Q_FP8: return lc_moe_qgemm_f<T, LOOM_CUDA_Q_FP8>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s);
    case LOOM_CUDA_Q_INT4: return lc_moe_qgemm_f<T, LOOM_CUDA_Q_INT4>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t loom_cuda_moe_qgemm(loom_cuda_dt dt, const void *x, const void *xq, const float *sx,
                                           const int32_t *perm, int div, const loom_cuda_qweight *w,
                                           const int32_t *tiles, int max_tiles, void *y, cudaStream_t s) {
    if (max_tiles <= 0) return cudaSuccess;
    if (!w || !loom_cuda_moe_qweight_ok(w->fmt, w->N, w->K, w->group) || max_tiles > 65535 || div < 1 ||
        (loom_cuda_moe_qacts(w->fmt) ? !xq || !sx : !x))
        return cudaErrorInvalidValue;
    return dt == LOOM_CUDA_F16 ? lc_moe_qgemm_t<__half>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s)
                               : lc_moe_qgemm_t<__nv_bfloat16>(x, xq, sx, perm, div, w, tiles, max_tiles, y, s);
}
