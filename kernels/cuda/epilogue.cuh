/*
 * kernels/cuda/epilogue.cuh — internal: the pair epilogue of the one-row
 * GEMVs (gemv.cu, qgemm.cu) and of the tiled kernel's K-split reduce
 * (qtiled.cu); the contract is cuda_kernels.h's loom_cuda_epi. In a GEMV,
 * a CTA of LC_EPI_WARPS warps with R output rows a warp
 * takes 2R pairs: warps 0 and 1 the first rows of pairs [0, R) and [R, 2R),
 * warps 2 and 3 their partners P rows further on — each warp's R rows stay
 * consecutive (P % R == 0), so its loads are the plain kernel's. Lane 0 of
 * each warp leaves its R sums in shared memory and 2R threads finish one
 * pair each (lc_epi_pair): the separate kernel's arithmetic on the same
 * dt-rounded outputs, element by element.
 */
#ifndef LOOM_CUDA_EPILOGUE_CUH
#define LOOM_CUDA_EPILOGUE_CUH

#include "common.cuh"
#include "cuda_kernels.h"

#define LC_EPI_WARPS 4

/* Rows of the pair epilogue: P for kind on an output of N rows, or 0 when
 * the rows do not pair (N a whole number of 2P blocks; P % R == 0 for the
 * kernel's R <= 4, and whole CTAs of 2R pairs). */
static inline int lc_epi_p(const loom_cuda_epi *e, int N) {
    if (!e || N <= 0) return 0;
    int P = 0;
    if (e->kind == LOOM_CUDA_EPI_ROPE_KV) {
        const int D = e->head_dim;
        if (D <= 0 || D % 16 || N != (e->num_heads + 2 * e->num_kv_heads) * D) return 0;
        P = D / 2;
    } else if (e->kind == LOOM_CUDA_EPI_SWIGLU) {
        P = N / 2;
    }
    return P > 0 && P % 8 == 0 && N % (2 * P) == 0 ? P : 0;
}

/* The first row of the R consecutive rows a warp computes, and whether its
 * pairs exist (a warp past the last pair still reaches the barrier). */
__device__ __forceinline__ int lc_epi_row0(int R, int P, int N, int warp, bool *live) {
    const int q0 = (int)blockIdx.x * 2 * R + (warp & 1) * R;
    *live = q0 < N / 2;
    if (!*live) return 0;
    return (q0 / P) * 2 * P + q0 % P + (warp >> 1) * P;
}

/* Pair q of y (1, N) dt: a and b the float sums of rows na and na + P. */
template <typename T>
__device__ __forceinline__ void lc_epi_pair(const loom_cuda_epi &e, T *__restrict__ y, int q, int P, float a,
                                            float b) {
    const int na = (q / P) * 2 * P + q % P, nb = na + P;
    const T ta = lc_from_f<T>(a), tb = lc_from_f<T>(b);
    if (e.kind == LOOM_CUDA_EPI_SWIGLU) {
        y[na] = ta, y[nb] = tb;
        static_cast<T *>(e.act)[q] = lc_from_f<T>(lc_silu_mul(lc_to_f(ta), lc_to_f(tb)));
        return;
    }
    /* ROPE_KV: loom_cuda_rope_kv's per-element work (elementwise.cu) */
    const int D = e.head_dim, H = e.num_heads, KVH = e.num_kv_heads, half = D / 2;
    const int hh = na / D, i = na - hh * D; /* i < half */
    float fa = lc_to_f(ta), fb = lc_to_f(tb);
    if (e.bias) fa += e.bias[na], fb += e.bias[nb];
    float ra = fa, rb = fb;
    if (hh < H + KVH) {
        const float2 c = __ldg(reinterpret_cast<const float2 *>(e.cs) + (size_t)e.pos[0] * half + i);
        lc_rope_rot(fa, fb, c.x, c.y, ra, rb);
    }
    if (hh < H) { /* q: rotated in place */
        y[na] = lc_from_f<T>(ra), y[nb] = lc_from_f<T>(rb);
        return;
    }
    y[na] = ta, y[nb] = tb; /* k, v rows keep the GEMV's output, as unfused */
    const int64_t sl = e.slot[0];
    if (sl < 0) return;
    const bool k = hh < H + KVH;
    const int kh = k ? hh - H : hh - H - KVH;
    const size_t at = (((size_t)(sl / e.block_size) * KVH + kh) * e.block_size + sl % e.block_size) * D + i;
    void *cache = k ? e.k_cache : e.v_cache;
    if (e.kv == LOOM_CUDA_KV_E4M3) {
        static_cast<uint8_t *>(cache)[at] = (uint8_t)lc_e4m3_encode(__float_as_uint(ra));
        static_cast<uint8_t *>(cache)[at + half] = (uint8_t)lc_e4m3_encode(__float_as_uint(rb));
    } else {
        static_cast<T *>(cache)[at] = lc_from_f<T>(ra);
        static_cast<T *>(cache)[at + half] = lc_from_f<T>(rb);
    }
}

/* The CTA's end: lane 0 of each warp hands over its R sums (M = 1), then
 * one thread a pair. Every thread of the CTA must call it. */
template <typename T, int R>
__device__ __forceinline__ void lc_epi_finish(const loom_cuda_epi &e, void *y, int P, int N, const float (&sum)[R]) {
    __shared__ float pv[LC_EPI_WARPS][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++) pv[warp][r] = sum[r];
    __syncthreads();
    const int t = threadIdx.x, q = (int)blockIdx.x * 2 * R + t;
    if (t < 2 * R && q < N / 2) lc_epi_pair<T>(e, static_cast<T *>(y), q, P, pv[t / R][t % R], pv[2 + t / R][t % R]);
}

/* The K-split second pass (mma.cuh: lc_ksplit_reduce) of a one-row output
 * with its pair epilogue: pair q of y (1, N) from the z-ordered sums of
 * part (Z, 1, N) f32, times W8A16's row scale sc[n] when W8 — the plain
 * reduce's sums, then lc_epi_pair on them, so the bits are those of the
 * reduce followed by the separate kernel. */
template <typename T, bool W8>
__global__ void __launch_bounds__(256)
    lc_ksplit_pair_kernel(const float *__restrict__ part, const float *__restrict__ sc, T *__restrict__ y, int N,
                          int Z, int P, loom_cuda_epi e) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int q = (int)blockIdx.x * 256 + (int)threadIdx.x;
    if (q >= N / 2) return;
    const int na = (q / P) * 2 * P + q % P, nb = na + P;
    float a = 0.0f, b = 0.0f;
#pragma unroll 8
    for (int z = 0; z < Z; z++) a += __ldcs(part + (size_t)z * N + na), b += __ldcs(part + (size_t)z * N + nb);
    if constexpr (W8) a *= sc[na], b *= sc[nb];
    lc_epi_pair<T>(e, y, q, P, a, b);
}

/* Launches lc_ksplit_pair_kernel; P from lc_epi_p (> 0). */
template <typename T, bool W8>
static cudaError_t lc_ksplit_pair(const float *part, const float *sc, void *y, int N, int Z, int P,
                                  const loom_cuda_epi *e, cudaStream_t s) {
    const unsigned blocks = (unsigned)((N / 2 + 255) / 256);
    return lc_launch(lc_ksplit_pair_kernel<T, W8>, dim3(blocks), dim3(256), 0, s, part, sc, static_cast<T *>(y), N,
                     Z, P, *e);
}

#endif
