/*
 * kernels/cuda/mma.cuh — what the tensor-core kernels of the quantized
 * linear layers and the grouped expert GEMMs share (qgemv_tc.cu: 2..8 rows;
 * qmma.cu: W8A16 / INT4 at 9..128 rows; qtiled.cu: the tiled layout;
 * moe_tile.cuh): the bf16 / f16 mma, packed f16
 * arithmetic, the decodes of int8 / int4 codes into exact f16 values, and
 * the K-split kernels' reduction.
 */
#ifndef LOOM_CUDA_MMA_CUH
#define LOOM_CUDA_MMA_CUH

#include <stdint.h>

#include "common.cuh"

/* c (16 x 8, f32) += a (16 x 16) b (16 x 8), operands in T (bf16 or f16),
 * one warp. */
template <typename T>
__device__ __forceinline__ void lc_mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void lc_mma16816<__nv_bfloat16>(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void lc_mma16816<__half>(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c (16 x 8, f32) += a (16 x 16, f16) b (16 x 8, f16), one warp: the f16
 * lc_mma16816 with the A fragment in four registers. */
__device__ __forceinline__ void lc_mma_f16(float *c, uint32_t a0, uint32_t a1, uint32_t a2,
                                           uint32_t a3, uint32_t b0, uint32_t b1) {
    const uint32_t a[4] = {a0, a1, a2, a3};
    lc_mma16816<__half>(c, a, b0, b1);
}

/* ldmatrix: four (x4) or two (x2) 8 x 8 b16 matrices from shared memory,
 * lane l giving the address of row l % 8 of matrix l / 8; each lane gets
 * one 32-bit word of each matrix, in the mma fragments' order. */
__device__ __forceinline__ void lc_ldsm4(const void *p, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}
__device__ __forceinline__ void lc_ldsm2(const void *p, uint32_t &r0, uint32_t &r1) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(s));
}

__device__ __forceinline__ uint32_t lc_hsub2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t lc_hfma2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Eight int4 codes (low nibble of byte i = column 2i) -> four f16x2 of
 * exact codes 0..15: columns (0,4), (1,5), (2,6), (3,7). Low nibbles under
 * 1024 minus 1024; high nibbles under 1024 are 16 q: times 1/16 (0x2C00)
 * minus 64 (0xD400). */
__device__ __forceinline__ void lc_u4x8_h2(uint32_t w, uint32_t *p) {
    const uint32_t v = w >> 8;
    p[0] = lc_hsub2((w & 0x000F000Fu) | 0x64006400u, 0x64006400u);
    p[1] = lc_hfma2((w & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, 0xD400D400u);
    p[2] = lc_hsub2((v & 0x000F000Fu) | 0x64006400u, 0x64006400u);
    p[3] = lc_hfma2((v & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, 0xD400D400u);
}

/* Four int8 codes (word w, byte 0 first) -> two f16x2 of exact values
 * (q0, q1) and (q2, q3): byte ^ 0x80 = q + 128 under 1024's exponent by one
 * PRMT, minus 1152. */
__device__ __forceinline__ void lc_i8x4_h2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t u = w ^ 0x80808080u;
    lo = lc_hsub2(__byte_perm(u, 0x64646464u, 0x4140u), 0x64806480u);
    hi = lc_hsub2(__byte_perm(u, 0x64646464u, 0x4342u), 0x64806480u);
}

/* The token scaling of the f16 kernels fed one token at a time (qmma.cu's
 * prep): 2^e puts max |x| = amax in [2^14, 2^15), clamped to
 * float's normal exponents (e = 0 for an all-zero token), so x 2^e rounds
 * to f16 exactly for every bf16 value down to 2^-29 of amax. */
__device__ __forceinline__ int lc_tok_exp(float amax) {
    if (!(amax > 0.0f)) return 0;
    const int e = 141 - (int)((__float_as_uint(amax) >> 23) & 0xFFu); /* 14 - unbiased exponent */
    return e < -126 ? -126 : e > 126 ? 126 : e;
}
/* 2^e for e in [-126, 126], exactly. */
__device__ __forceinline__ float lc_pow2(int e) { return __uint_as_float((uint32_t)(127 + e) << 23); }

/* Eight f16-exact floats as f16 in a 16-byte vector: in column order, or
 * (I4) in the order lc_u4x8_h2 yields the codes, (0,4)(1,5)(2,6)(3,7). */
template <bool I4> __device__ __forceinline__ uint4 lc_pack_h8(const float *v) {
    if constexpr (I4)
        return make_uint4(lc_pack2<__half>(v[0], v[4]), lc_pack2<__half>(v[1], v[5]),
                          lc_pack2<__half>(v[2], v[6]), lc_pack2<__half>(v[3], v[7]));
    else
        return make_uint4(lc_pack2<__half>(v[0], v[1]), lc_pack2<__half>(v[2], v[3]),
                          lc_pack2<__half>(v[4], v[5]), lc_pack2<__half>(v[6], v[7]));
}

/* The K-split kernels' second pass (qmma.cu, qtiled.cu): y (M, N) = the
 * sum over z of part (z, M, N) in z order (so results do not depend on
 * timing), times the token's inv[m] when inv, and W8A16's row scale sc[n]
 * when W8. NOUT outputs a thread (4 where N % 4 == 0: 16-byte loads), the
 * loads of up to ZB slices issued before their additions, so a thread
 * waits on L2 once for eight slices, not once a slice. */
template <typename T, bool W8, bool F32, int NOUT>
__global__ void __launch_bounds__(256)
    lc_ksplit_reduce_kernel(const float *__restrict__ part, const float *__restrict__ inv,
                            const float *__restrict__ sc, void *__restrict__ y, int M, int N, int Z) {
    lc_pdl_trigger();
    lc_pdl_wait();
    constexpr int ZB = 8; /* slices in flight */
    const size_t MN = (size_t)M * N;
    for (size_t o = ((size_t)blockIdx.x * 256 + threadIdx.x) * NOUT; o < MN; o += (size_t)gridDim.x * 256 * NOUT) {
        float v[NOUT] = {};
        for (int z0 = 0; z0 < Z; z0 += ZB) {
            float p[ZB][NOUT];
#pragma unroll
            for (int i = 0; i < ZB; i++) {
                if (z0 + i >= Z) continue;
                const float *src = part + (size_t)(z0 + i) * MN + o; /* read once */
                if constexpr (NOUT == 4) {
                    const float4 t = __ldcs(reinterpret_cast<const float4 *>(src));
                    p[i][0] = t.x, p[i][1] = t.y, p[i][2] = t.z, p[i][3] = t.w;
                } else {
                    p[i][0] = __ldcs(src);
                }
            }
#pragma unroll
            for (int i = 0; i < ZB; i++)
                if (z0 + i < Z)
#pragma unroll
                    for (int e = 0; e < NOUT; e++) v[e] += p[i][e];
        }
        if (inv || W8) { /* the NOUT outputs lie in one row */
            const size_t row = o / (size_t)N, n = o - row * N;
            const float r = inv ? inv[row] : 1.0f;
#pragma unroll
            for (int e = 0; e < NOUT; e++) {
                v[e] *= r;
                if constexpr (W8) v[e] *= sc[n + e];
            }
        }
        if constexpr (NOUT == 4) {
            if (F32) reinterpret_cast<float4 *>(y)[o / 4] = make_float4(v[0], v[1], v[2], v[3]);
            else reinterpret_cast<uint2 *>(y)[o / 4] = make_uint2(lc_pack2<T>(v[0], v[1]), lc_pack2<T>(v[2], v[3]));
        } else {
            if (F32) static_cast<float *>(y)[o] = v[0];
            else static_cast<T *>(y)[o] = lc_from_f<T>(v[0]);
        }
    }
}

template <typename T, bool W8, bool F32>
static cudaError_t lc_ksplit_reduce(const float *part, const float *inv, const float *sc, void *y, int M, int N, int Z,
                                    cudaStream_t s) {
    /* four outputs a thread read part and write y 16 (f32) / 8 bytes at a
     * time: every caller's part is scratch at 256-byte offsets and its y
     * rows start at multiples of N */
    const size_t mn = (size_t)M * N;
    if (N % 4 == 0) {
        const size_t n4 = (mn / 4 + 255) / 256;
        return lc_launch(lc_ksplit_reduce_kernel<T, W8, F32, 4>, dim3((unsigned)(n4 < 4096 ? n4 : 4096)), dim3(256),
                         0, s, part, inv, sc, y, M, N, Z);
    }
    const size_t n1 = (mn + 255) / 256;
    return lc_launch(lc_ksplit_reduce_kernel<T, W8, F32, 1>, dim3((unsigned)(n1 < 4096 ? n1 : 4096)), dim3(256), 0, s,
                     part, inv, sc, y, M, N, Z);
}

#endif
