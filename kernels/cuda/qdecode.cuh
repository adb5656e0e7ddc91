/*
 * kernels/cuda/qdecode.cuh — the quantized weights' decodes and the
 * CUDA-core GEMV's inner pass (lc_qgemv_load, lc_qgemv_rows,
 * lc_qgemv_pass), shared by the dense quantized GEMV (qgemm.cu, whose
 * header comment explains the arithmetic) and the mixture-of-experts
 * kernels on quantized experts (moe_quant.cu).
 */
#ifndef LOOM_CUDA_QDECODE_CUH
#define LOOM_CUDA_QDECODE_CUH

#include <cuda_fp8.h>

#include "common.cuh"
#include "cuda_kernels.h"

/* ---------------------------------------------------------------- decode */

/* lc_byte_f and lc_i8x4 (int8 -> float) are common.cuh's. */

/* Eight int4 codes of word w (low nibble of byte i = column 2i, high =
 * 2i + 1) as floats 0..15 in column order. */
__device__ __forceinline__ void lc_u4x8(uint32_t w, float *f) {
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
    f[0] = lc_byte_f<0, 0>(lo);
    f[1] = lc_byte_f<0, 0>(hi);
    f[2] = lc_byte_f<1, 0>(lo);
    f[3] = lc_byte_f<1, 0>(hi);
    f[4] = lc_byte_f<2, 0>(lo);
    f[5] = lc_byte_f<2, 0>(hi);
    f[6] = lc_byte_f<3, 0>(lo);
    f[7] = lc_byte_f<3, 0>(hi);
}

/* lc_u4x8 without the subtraction: 2^23 + 2^16 q — the code in bits 16..19
 * of the mantissa of 2^23, one PRMT a weight. The kernel takes 2^23 sum(x)
 * off once per 32-weight chunk (its sum(x) is there for the group's bias
 * anyway) and scales by 2^-16. The code sits 7 bits below the offset, so
 * the rounding error is ~2^-17 sum|x| a chunk (in units of a code step):
 * ~1e-5 of a typical dot, far below int4's own error and the dt rounding
 * of y (tests hold float32 outputs to 1e-4). Activations beyond 2^104 would
 * overflow 2^23 x; no bf16 model produces them. */
__device__ __forceinline__ void lc_u4x8_off(uint32_t w, float *f) {
    const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
    f[0] = __int_as_float((int)__byte_perm(lo, 0x4B000000u, 0x7044u));
    f[1] = __int_as_float((int)__byte_perm(hi, 0x4B000000u, 0x7044u));
    f[2] = __int_as_float((int)__byte_perm(lo, 0x4B000000u, 0x7144u));
    f[3] = __int_as_float((int)__byte_perm(hi, 0x4B000000u, 0x7144u));
    f[4] = __int_as_float((int)__byte_perm(lo, 0x4B000000u, 0x7244u));
    f[5] = __int_as_float((int)__byte_perm(hi, 0x4B000000u, 0x7244u));
    f[6] = __int_as_float((int)__byte_perm(lo, 0x4B000000u, 0x7344u));
    f[7] = __int_as_float((int)__byte_perm(hi, 0x4B000000u, 0x7344u));
}

/* Two e4m3 codes (low byte first) as floats; exact (f16 holds every e4m3). */
__device__ __forceinline__ float2 lc_e4m3x2(uint32_t two) {
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3);
    return __half22float2(__half2(r));
}

/* Eight e4m3 codes in words a (codes 0..3) and b (4..7) as floats. */
__device__ __forceinline__ void lc_e4m3x8(uint32_t a, uint32_t b, float *f) {
    float2 v;
    v = lc_e4m3x2(a), f[0] = v.x, f[1] = v.y;
    v = lc_e4m3x2(a >> 16), f[2] = v.x, f[3] = v.y;
    v = lc_e4m3x2(b), f[4] = v.x, f[5] = v.y;
    v = lc_e4m3x2(b >> 16), f[6] = v.x, f[7] = v.y;
}

__device__ __forceinline__ uint32_t lc_word(const uint4 &v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* ------------------------------------------------------------------ GEMV */

/* Chunks c, c + 32, ..., c + 32 (U - 1) of each of the R rows (zeros past
 * the row's nc chunks). */
template <int U, int R>
__device__ __forceinline__ void lc_qgemv_load(uint4 (&wv)[U][R], const uint8_t *(&wr)[R], int c, int nc) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[u][r] = c + 32 * u < nc ? __ldcs(reinterpret_cast<const uint4 *>(wr[r] + (size_t)(c + 32 * u) * 16))
                                       : make_uint4(0u, 0u, 0u, 0u);
}

/* Rows of the warp's R slots (clamped: read, never stored) and where they
 * start. */
template <int R>
__device__ __forceinline__ void lc_qgemv_rows(int n0, int N, const uint8_t *wd, size_t row_bytes, int (&nr)[R],
                                              const uint8_t *(&wr)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        nr[r] = n0 + r < N ? n0 + r : n0;
        wr[r] = wd + (size_t)nr[r] * row_bytes;
    }
}

/* One pass of a lane: acc / iacc [r][m] += the dots of its chunks c + 32 u
 * (u < U, below nc) of rows r with x's (xq's) row m, in order. */
template <typename T, int FMT, int M, int R, int U>
__device__ __forceinline__ void lc_qgemv_pass(const uint4 (&wv)[U][R], const T *__restrict__ x,
                                              const uint8_t *__restrict__ xq, const float *__restrict__ sc,
                                              const int (&nr)[R], int K, int groups, int group, int c, int nc,
                                              float (&acc)[R][M], int (&iacc)[R][M]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int cc = c + 32 * u;
        if (cc >= nc) break;
        if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A16) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    lc_i8x4(lc_word(wv[u][r], 2 * h), wf[r]);
                    lc_i8x4(lc_word(wv[u][r], 2 * h + 1), wf[r] + 4);
                }
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float xf[8];
                    lc_unpack8<T>(lc_ldg16(x + (size_t)m * K + (size_t)cc * 16 + h * 8), xf);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
                }
            }
        } else if constexpr (FMT == LOOM_CUDA_Q_FP8) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++)
                    lc_e4m3x8(lc_word(wv[u][r], 2 * h), lc_word(wv[u][r], 2 * h + 1), wf[r]);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const uint2 xv = __ldg(reinterpret_cast<const uint2 *>(
                        xq + (size_t)m * K + (size_t)cc * 16 + h * 8));
                    float xf[8];
                    lc_e4m3x8(xv.x, xv.y, xf);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
                }
            }
        } else if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) {
#pragma unroll
            for (int m = 0; m < M; m++) {
                const uint4 xv = lc_ldg16(xq + (size_t)m * K + (size_t)cc * 16);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int a = iacc[r][m];
                    a = __dp4a((int)wv[u][r].x, (int)xv.x, a);
                    a = __dp4a((int)wv[u][r].y, (int)xv.y, a);
                    a = __dp4a((int)wv[u][r].z, (int)xv.z, a);
                    a = __dp4a((int)wv[u][r].w, (int)xv.w, a);
                    iacc[r][m] = a;
                }
            }
        } else { /* INT4: chunk cc = columns [32 cc, 32 cc + 32), one group */
            const int g = (cc * 32) / group;
            float2 sb[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                sb[r] = __ldg(reinterpret_cast<const float2 *>(sc) + (size_t)nr[r] * groups + g);
            float p[R][M], xs[M];
#pragma unroll
            for (int m = 0; m < M; m++) {
                xs[m] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) p[r][m] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) lc_u4x8_off(lc_word(wv[u][r], j), wf[r]);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float xf[8];
                    lc_unpack8<T>(lc_ldg16(x + (size_t)m * K + (size_t)cc * 32 + j * 8), xf);
#pragma unroll
                    for (int e = 0; e < 8; e++) xs[m] += xf[e];
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int e = 0; e < 8; e++) p[r][m] = fmaf(wf[r][e], xf[e], p[r][m]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < M; m++) {
                    /* p summed x (2^23 + 2^16 q): take 2^23 sum(x) off, scale by 2^-16 */
                    const float pq = fmaf(-8388608.0f, xs[m], p[r][m]) * 1.52587890625e-05f;
                    acc[r][m] = fmaf(sb[r].x, pq, fmaf(sb[r].y, xs[m], acc[r][m]));
                }
        }
    }
}

#endif
