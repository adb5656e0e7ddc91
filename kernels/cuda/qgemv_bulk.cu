/*
 * kernels/cuda/qgemv_bulk.cu — W8A16, FP8 and INT4 linear layers at one
 * row of x (batch-1 decode) on sm_90: the weights streamed into shared
 * memory by the bulk-copy engine (cp.async.bulk, the 1-D form of TMA) and
 * multiplied on the tensor cores. lc_qgemv_bulk; qgemm.cu's lc_qgemv calls
 * it at M = 1 when lc_qgemv_bulk_ok says so — only on request
 * (LOOM_CUDA_QGEMV_BULK=1): it makes a decode step no faster than
 * qgemm.cu's CUDA-core GEMV (docs/performance.md, "Tried and rejected").
 *
 * The idea: qgemm.cu's one-row GEMV spends ~3.5-4.5 instructions a weight
 * (decode to f32, FFMA, the token's conversion); here the codes become
 * exact f16 pairs (mma.cuh: PRMT + HSUB2 for int8, LOP3 + HSUB2 / HFMA2 for
 * int4, one conversion instruction a pair for e4m3) and mma.sync m16n8k16
 * multiplies 16 rows at a time by the token (~1.3 instructions a weight).
 * GEMV after GEMV it streams W8A16 faster than the CUDA-core kernel, but
 * each launch pays a longer start — CTAs of ~77-97 KB of shared memory
 * wait for the kernel before to leave, then the token prologue and the
 * ring's fill — and in a decode step every GEMV follows a small kernel,
 * where that start shows. INT4 stays bound by its decode. The codes are
 * not entered as f16 subnormals (code x 2^-24, no subtraction): the tensor
 * core does not keep every bit of subnormal products (errors up to 1.8e-4
 * of float64), so the decode subtracts.
 *
 * Structure: a producer thread streams the CTA's tiles — LC_QT_ST stages
 * of 16 rows x 2 KB (INT4: and their scale pairs), a ring carried across
 * tiles — the first requested before lc_pdl_wait() (nothing writes weights,
 * so they stream while the kernel before finishes). Consumer warp w takes
 * units w, w + W, ... of every stage (W8A16 / FP8: 64-column windows; INT4:
 * one group's 128-column windows); before the first it converts the
 * token's columns of those units into f16 in shared memory, scaled by a
 * power of two from their max (qmma.cu's prep: exact for every bf16 value
 * down to 2^-29 of that max; INT4 in its decode's column order, with the
 * 128-column sums for the group bias; FP8: the e4m3 codes, exact). A
 * tile's per-warp sums, each times its warp's 2^-e, meet in shared memory
 * in warp order (double-buffered by tile: one consumer barrier a tile).
 *
 * Fragments (the operand-order trick of qgemv_tc.cu / qmma.cu): per window
 * lane (g, t) loads bytes [16 t, 16 t + 16) of the window in rows g and
 * g + 8 and uses them as its A registers in a k order of its own; every
 * lane gives the token at the same physical columns (B's 8 columns alike,
 * so D's are too). Row sums land in lanes t = 0. Rows lie LC_QT_RS = 2112
 * bytes apart, so the 8 lanes of a 16-byte shared load phase (rows g,
 * g + 1; t = 0..3) hit 8 different 4-bank groups; INT4's scale pairs lie
 * scb + 16 bytes apart for the same reason.
 *
 * Accuracy: exact products (8-bit / 4-bit codes x f16 activations, e4m3 x
 * e4m3) summed in fp32 — qmma.cu's arithmetic; not the CUDA-core kernel's
 * order, so the batch-invariant mode (every M the same bits) never uses it.
 *
 * Contract (lc_qgemv_bulk_ok): sm_90 (the only code built); 16-byte
 * aligned codes and scales; W8A16 / FP8 K % 64; INT4 groups of 128 .. 2048
 * dividing 2048 and K % (2 group) (every stage's scale pairs in whole
 * 16-byte pieces); K <= 65536 (the token's f16 copy in shared memory).
 * Others go to qgemm.cu's kernel.
 */
#include "common.cuh"

#include <atomic>

#include <cuda_fp8.h>

#include "mma.cuh"
#include "qgemm.h"

#define LC_QT_ROWS 16                      /* rows a tile: one mma tile       */
#define LC_QT_SB 2048                      /* bytes of a row a stage          */
#define LC_QT_RS (LC_QT_SB + 64)           /* their stride in shared memory   */
#define LC_QT_ST 2                         /* stages in flight                */
#define LC_QT_MAXW 8                       /* consumer warps, at most         */

/* Shared memory: LC_QT_ST stages of [rows' codes | INT4: rows' scale pairs
 * (scb bytes each, scb + 16 apart: no bank conflicts)], the token as f16 (K
 * halves), INT4's 128-column sums, the warps' partial row sums of two tiles
 * (rows of a partial last tile keep whatever the ring held: each mma row
 * depends on its own weight row only, and those rows are never stored),
 * the mbarriers. */
struct lc_qt_layout {
    size_t stage, x16, xg, red, bar, bytes;
};
__host__ __device__ inline lc_qt_layout lc_qt_layout_of(int K, int scb, bool i4) {
    lc_qt_layout l;
    l.stage = (size_t)LC_QT_ROWS * (LC_QT_RS + (i4 ? scb + 16 : 0));
    l.x16 = (size_t)LC_QT_ST * l.stage;
    l.xg = l.x16 + (size_t)K * 2;
    l.red = l.xg + (i4 ? (size_t)(K / 128) * 4 : 0);
    l.bar = (l.red + 2 * LC_QT_MAXW * LC_QT_ROWS * 4 + 7) & ~(size_t)7;
    l.bytes = l.bar + 2 * LC_QT_ST * 8;
    return l;
}

/* ------------------------------------------------------ mbarrier + bulk */

__device__ __forceinline__ uint32_t lc_sa(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void lc_mbar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lc_sa(b)), "r"(count) : "memory");
}
/* the producer's arrival, announcing `bytes` of bulk copies into the stage */
__device__ __forceinline__ void lc_mbar_expect(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lc_sa(b)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void lc_mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(lc_sa(b)) : "memory");
}
__device__ __forceinline__ void lc_mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(lc_sa(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* bytes (a multiple of 16, both ends 16-byte aligned) global -> shared,
 * completing on mbarrier b; evict-first in L2 (weights are read once) */
__device__ __forceinline__ void lc_bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *b,
                                            uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(lc_sa(dst)),
                 "l"(src), "r"(bytes), "r"(lc_sa(b)), "l"(policy)
                 : "memory");
}

/* ---------------------------------------------------------------- kernel */

/* Consumers' named barrier (the producer warp never joins it). */
template <int W> __device__ __forceinline__ void lc_qt_bar() {
    asm volatile("bar.sync 1, %0;" ::"n"(W * 32) : "memory");
}

/* Which columns a consumer warp multiplies: a stage holds `ups` units
 * (8-bit: 64-column windows; INT4: groups), warp w takes units w, w + W,
 * ... of every stage. ups is a multiple of W or below it (32 units of 8-bit
 * codes; INT4 4096 / group in 2..32), so over the whole row warp w owns the
 * units w, w + S, w + 2 S, ... with S = min(ups, W) — and none when w >= S. */
struct lc_qt_cols {
    int first, stride, units; /* the warp's first unit, the unit stride, its units */
    int unit_cols, cpu;       /* columns a unit, 8-column chunks a unit (a power of two) */
    __device__ __forceinline__ int col(int c) const { /* chunk c of the warp -> its first column */
        return (first + (c / cpu) * stride) * unit_cols + (c % cpu) * 8;
    }
};

/* The token's columns this warp multiplies, into shared memory as f16, by
 * the warp alone (no CTA barrier: the warp is the only reader): W8A16 /
 * INT4 scaled by 2^e, e from the max over these columns (max |x 2^e| in
 * [2^14, 2^15): qmma.cu's prep, exact for every bf16 value down to 2^-29 of
 * that max), INT4 in the decode's column order (0,4)(1,5)(2,6)(3,7) per 8
 * with xg, the sums of the scaled values per 128 columns; FP8: the e4m3
 * codes xq as f16 (exact, unscaled). Returns 2^-e (1 for FP8). x is read
 * twice (the max, then the conversion; the second time from L1). */
template <typename T, int FMT>
__device__ __forceinline__ float lc_qt_token(const T *__restrict__ x, const uint8_t *__restrict__ xq,
                                             const lc_qt_cols &cl, int lane, uint16_t *x16, float *xg) {
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    const int total = cl.units * cl.cpu;
    if constexpr (FMT == LOOM_CUDA_Q_FP8) {
        for (int c = lane; c < total; c += 32) {
            const int k = cl.col(c);
            *reinterpret_cast<uint4 *>(x16 + k) = lc_e4m3x8<__half>(__ldg(reinterpret_cast<const uint2 *>(xq + k)));
        }
        __syncwarp();
        return 1.0f;
    }
    float a = 0.0f;
#pragma unroll 4
    for (int c = lane; c < total; c += 32) {
        float w[8];
        lc_unpack8<T>(lc_ldg16(x + cl.col(c)), w);
#pragma unroll
        for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(w[e]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const int e = lc_tok_exp(a);
    const float scale = lc_pow2(e);
    /* whole warps through every pass: INT4's 16-lane shuffle sums (16
     * chunks = one 128-column block, inside one unit) */
    for (int c0 = 0; c0 < total; c0 += 32) {
        const int c = c0 + lane, k = c < total ? cl.col(c) : 0;
        float w[8];
        if (c < total) {
            lc_unpack8<T>(lc_ldg16(x + k), w);
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = __half2float(__float2half_rn(w[i] * scale));
            *reinterpret_cast<uint4 *>(x16 + k) = lc_pack_h8<I4>(w);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = 0.0f;
        }
        if constexpr (I4) {
            float s8 = ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) s8 += __shfl_xor_sync(0xffffffffu, s8, o);
            if ((lane & 15) == 0 && c < total) xg[k / 128] = s8;
        }
    }
    __syncwarp();
    return lc_pow2(-e);
}

/* Four e4m3 codes (word w, byte 0 first) -> two f16x2 (q0, q1), (q2, q3):
 * exact, one conversion instruction a pair (sm_89+). */
__device__ __forceinline__ void lc_e4m3x4_h2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = (uint32_t)a.x | (uint32_t)a.y << 16;
    hi = (uint32_t)b.x | (uint32_t)b.y << 16;
}

/* Persistent: CTA c takes the 16-row tiles [c tpc, (c + 1) tpc) (the
 * launcher picks tpc so every CTA has the same count, give or take one).
 * x (1, K) dt (W8A16 / INT4); xq (1, K) e4m3 codes and sx (1) (FP8); wd
 * (N, row bytes) codes; sc as loom_cuda_qweight; y (1, N) dt or f32. scb:
 * INT4's scale bytes a row and stage. probe: skip the arithmetic
 * (gpu_bench). The W consumer warps take a stage's units (8-bit: 64-column
 * windows; INT4: a group's 128-column windows) in turn, each into its own
 * sums with its own token scale; a tile's sums meet in shared memory in
 * warp order. */
template <typename T, int FMT, bool F32, int W>
__global__ void __launch_bounds__((W + 1) * 32, 2)
    lc_qgemv_bulk_kernel(const T *__restrict__ x, const uint8_t *__restrict__ xq, const float *__restrict__ sx,
                         const uint8_t *__restrict__ wd, const float *__restrict__ sc, void *__restrict__ y,
                         int N, int K, int group, int scb, int tpc, int probe) {
    static_assert(W == 4 || W == 8, "lc_qt_cols: W divides every stage's unit count or exceeds it");
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    constexpr int WB = 64;            /* bytes of a row a window */
    constexpr int WK = I4 ? 128 : 64; /* columns a window        */
    extern __shared__ __align__(128) uint8_t sm[];
    const lc_qt_layout L = lc_qt_layout_of(K, scb, I4);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + L.bar);
    uint64_t *empty = full + LC_QT_ST;
    uint16_t *x16 = reinterpret_cast<uint16_t *>(sm + L.x16);
    float *xg = reinterpret_cast<float *>(sm + L.xg);
    float *red = reinterpret_cast<float *>(sm + L.red); /* [tile & 1][warp][row] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = (N + LC_QT_ROWS - 1) / LC_QT_ROWS;
    const int tile0 = blockIdx.x * tpc, tile1 = tile0 + tpc < tiles ? tile0 + tpc : tiles;
    const uint32_t row_bytes = I4 ? (uint32_t)K / 2 : (uint32_t)K;
    const int nst = (int)((row_bytes + LC_QT_SB - 1) / LC_QT_SB);
    const int groups = I4 ? K / group : 0;
    const int gps = I4 ? 2 * LC_QT_SB / group : 0; /* groups a whole stage */
    const int upw = I4 ? group / WK : 1;           /* windows a unit */
    auto data = [&](int s, int r) { return sm + (size_t)s * L.stage + (size_t)r * LC_QT_RS; };
    auto scal = [&](int s, int r) {
        return sm + (size_t)s * L.stage + (size_t)LC_QT_ROWS * LC_QT_RS + (size_t)r * (scb + 16);
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < LC_QT_ST; s++) lc_mbar_init(&full[s], 1), lc_mbar_init(&empty[s], W);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == W) { /* producer: one thread issues every copy of every tile */
        /* the kernels after this one may launch now (they wait for its
         * completion themselves): a persistent grid would otherwise hold
         * them back until its last copies are issued */
        lc_pdl_trigger();
        if (lane == 0) {
            uint64_t policy;
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
            int it = 0; /* stages issued so far: ring slot it % LC_QT_ST */
            for (int tile = tile0; tile < tile1; tile++) {
                const int n0 = tile * LC_QT_ROWS;
                const int rows = N - n0 < LC_QT_ROWS ? N - n0 : LC_QT_ROWS;
                const uint8_t *base = wd + (size_t)n0 * row_bytes;
                const uint8_t *sbase = reinterpret_cast<const uint8_t *>(sc) + (size_t)n0 * groups * 8;
                for (int j = 0; j < nst; j++, it++) {
                    const int s = it % LC_QT_ST;
                    if (it >= LC_QT_ST) lc_mbar_wait(&empty[s], (uint32_t)((it / LC_QT_ST) - 1) & 1u);
                    const uint32_t off = (uint32_t)j * LC_QT_SB;
                    const uint32_t bytes = row_bytes - off < LC_QT_SB ? row_bytes - off : LC_QT_SB;
                    const uint32_t sbytes = I4 ? (uint32_t)(2 * bytes / group) * 8 : 0;
                    lc_mbar_expect(&full[s], (uint32_t)rows * (bytes + sbytes));
                    for (int r = 0; r < rows; r++) {
                        lc_bulk_g2s(data(s, r), base + (size_t)r * row_bytes + off, bytes, &full[s], policy);
                        if constexpr (I4)
                            lc_bulk_g2s(scal(s, r), sbase + ((size_t)r * groups + (size_t)j * gps) * 8, sbytes,
                                        &full[s], policy);
                    }
                }
            }
        }
        return;
    }

    /* consumers: the token is the previous kernels' output (the CTA's
     * launch trigger is the producer warp's, above) */
    lc_pdl_wait();
    const int ups = I4 ? gps : LC_QT_SB / WB;
    lc_qt_cols cl;
    cl.first = warp;
    cl.stride = ups < W ? ups : W;
    cl.unit_cols = I4 ? group : WK;
    cl.cpu = cl.unit_cols / 8;
    const int utot = K / cl.unit_cols;
    cl.units = warp < cl.stride ? (utot - warp + cl.stride - 1) / cl.stride : 0;
    const float inv = lc_qt_token<T, FMT>(x, xq, cl, lane, x16, xg);
    const float post = FMT == LOOM_CUDA_Q_FP8 ? sx[0] : 1.0f;

    const int g = lane >> 2, t = lane & 3;
    int it = 0;
    for (int tile = tile0; tile < tile1; tile++) {
        float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float tot0 = 0.0f, tot1 = 0.0f; /* INT4: rows g and g + 8 */
        for (int j = 0; j < nst; j++, it++) {
            const int s = it % LC_QT_ST;
            lc_mbar_wait(&full[s], (uint32_t)(it / LC_QT_ST) & 1u);
            __syncwarp(); /* converged again before mma.sync.aligned */
            const uint32_t off = (uint32_t)j * LC_QT_SB;
            const int nw = (int)((row_bytes - off < LC_QT_SB ? row_bytes - off : LC_QT_SB) / WB);
            const uint8_t *ra = data(s, g), *rb = data(s, g + 8);
            for (int u = warp; u * upw < nw && !probe; u += W) {
                for (int wi = u * upw; wi < (u + 1) * upw; wi++) {
                    const uint4 wa = *reinterpret_cast<const uint4 *>(ra + wi * WB + t * 16);
                    const uint4 wb = *reinterpret_cast<const uint4 *>(rb + wi * WB + t * 16);
                    const int kw = (int)(off + wi * WB) * (I4 ? 2 : 1); /* the window's first column */
                    const uint32_t aw[4] = {wa.x, wa.y, wa.z, wa.w}, bw[4] = {wb.x, wb.y, wb.z, wb.w};
                    if constexpr (!I4) {
                        /* columns kw + 16 t + 4 i + (0..3) in mma i; every
                         * lane gives the token (B's 8 columns alike) */
                        const uint4 x0 = *reinterpret_cast<const uint4 *>(x16 + kw + 16 * t);
                        const uint4 x1 = *reinterpret_cast<const uint4 *>(x16 + kw + 16 * t + 8);
                        const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            uint32_t a0, a1, a2, a3;
                            if constexpr (FMT == LOOM_CUDA_Q_FP8) {
                                lc_e4m3x4_h2(aw[i], a0, a2);
                                lc_e4m3x4_h2(bw[i], a1, a3);
                            } else {
                                lc_i8x4_h2(aw[i], a0, a2);
                                lc_i8x4_h2(bw[i], a1, a3);
                            }
                            lc_mma_f16(i & 1 ? c1 : c0, a0, a1, a2, a3, xw[2 * i], xw[2 * i + 1]);
                        }
                    } else {
                        /* word i: columns kw + 32 t + 8 i + (0..7), decoded as
                         * pairs (0,4)(1,5)(2,6)(3,7) — x16's order */
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            const uint4 xv = *reinterpret_cast<const uint4 *>(x16 + kw + 32 * t + 8 * i);
                            uint32_t pa[4], pb[4];
                            lc_u4x8_h2(aw[i], pa);
                            lc_u4x8_h2(bw[i], pb);
                            lc_mma_f16(c0, pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
                            lc_mma_f16(c1, pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
                        }
                    }
                }
                if constexpr (I4) { /* unit u is group u of the stage: s sum(x q) + b sum(x) */
                    const int gg = (int)(off * 2) / group + u;
                    const float2 sa = reinterpret_cast<const float2 *>(scal(s, g))[u];
                    const float2 sb = reinterpret_cast<const float2 *>(scal(s, g + 8))[u];
                    float xs = 0.0f;
                    for (int q = gg * upw; q < (gg + 1) * upw; q++) xs += xg[q];
                    tot0 = fmaf(sa.x, c0[0] + c1[0], fmaf(sa.y, xs, tot0));
                    tot1 = fmaf(sb.x, c0[2] + c1[2], fmaf(sb.y, xs, tot1));
#pragma unroll
                    for (int q = 0; q < 4; q++) c0[q] = c1[q] = 0.0f;
                }
            }
            __syncwarp();
            if (lane == 0) lc_mbar_arrive(&empty[s]);
        }
        /* the tile's sums, each warp's in its own token scale: red[tile & 1]
         * (a warp can be at most one tile ahead of warp 0's reading: the
         * barrier below) */
        float *rt = red + (tile & 1) * LC_QT_MAXW * LC_QT_ROWS;
        if (t == 0) {
            rt[warp * LC_QT_ROWS + g] = (I4 ? tot0 : c0[0] + c1[0]) * inv;
            rt[warp * LC_QT_ROWS + g + 8] = (I4 ? tot1 : c0[2] + c1[2]) * inv;
        }
        lc_qt_bar<W>();
        const int n = tile * LC_QT_ROWS + lane;
        if (warp == 0 && lane < LC_QT_ROWS && n < N) {
            float v = rt[lane];
#pragma unroll
            for (int w = 1; w < W; w++) v += rt[w * LC_QT_ROWS + lane];
            if constexpr (!I4) v *= sc[n] * post;
            if (F32) static_cast<float *>(y)[n] = v;
            else static_cast<T *>(y)[n] = lc_from_f<T>(v);
        }
    }
}

/* ------------------------------------------------------------- dispatch */

static std::atomic<int> lc_qb_override{-1};
static std::atomic<long> lc_qb_launches{0};
/* gpu_bench's probe: the consumers skip the arithmetic (wrong results), so
 * the weight stream's own rate is read */
static std::atomic<int> lc_qb_probe{0};
/* consumer warps a CTA (4 or 8; gpu_bench compares them) */
static std::atomic<int> lc_qb_warps{8};
/* off unless the environment says LOOM_CUDA_QGEMV_BULK=1 (or on / true /
 * yes) */
static bool lc_qb_env_on() {
    static const bool on = lc_env_bool("LOOM_CUDA_QGEMV_BULK", false);
    return on;
}
extern "C" void lc_qgemv_bulk_set(int on) { lc_qb_override = on < 0 ? -1 : on ? 1 : 0; }
extern "C" int lc_qgemv_bulk_get(void) { return lc_qb_override; }
extern "C" long lc_qgemv_bulk_count(void) { return lc_qb_launches; }
extern "C" void lc_qgemv_bulk_set_probe(int on) { lc_qb_probe = on ? 1 : 0; }
extern "C" void lc_qgemv_bulk_set_warps(int w) { lc_qb_warps = w == 4 ? 4 : 8; }

/* LOOM_CUDA_QGEMV_BULK_MIN_MB: only matrices of at least this many MiB of
 * codes take it (default 0: all) — its steady stream is faster, its start
 * slower, so a big LM head may gain where a layer's GEMVs lose */
static size_t lc_qb_min_bytes() {
    static const size_t b = [] {
        const char *e = getenv("LOOM_CUDA_QGEMV_BULK_MIN_MB");
        return e ? (size_t)strtoull(e, NULL, 10) << 20 : (size_t)0;
    }();
    return b;
}

extern "C" int lc_qgemv_bulk_ok(const loom_cuda_qweight *w) {
    const int o = lc_qb_override;
    if (!(o < 0 ? lc_qb_env_on() : o == 1)) return 0;
    if (o < 0 && (size_t)w->N * (size_t)w->K / (w->fmt == LOOM_CUDA_Q_INT4 ? 2 : 1) < lc_qb_min_bytes()) return 0;
    if (w->N <= 0 || w->K <= 0 || w->K > 65536 || ((uintptr_t)w->data & 15) || ((uintptr_t)w->scales & 15))
        return 0;
    if (w->fmt == LOOM_CUDA_Q_INT8_W8A16 || w->fmt == LOOM_CUDA_Q_FP8) {
        if (w->K % 64) return 0;
    } else if (w->fmt == LOOM_CUDA_Q_INT4) {
        /* whole 128-column windows a group; an even number of groups in
         * every stage, the last too, so scale pairs come in 16-byte pieces */
        if (w->group <= 0 || w->group % 128 || 2048 % w->group || w->K % (2 * w->group)) return 0;
    } else {
        return 0;
    }
    return 1; /* sm_90: the build holds sm_90a code only, as for every kernel here */
}

/* CTAs of one launch: as many as fit at once (the occupancy of this
 * instantiation at this shared-memory size, asked once per size and
 * device), then as few as give every CTA the same number of tiles — the
 * matrix streams at DRAM's rate from far fewer CTAs than fit, and a CTA
 * with a tile more than the others would set the time. */
template <typename T, int FMT, bool F32, int W>
static cudaError_t lc_qb_grid(size_t smem, int tiles, int *grid, int *tpc) {
    /* per device, a few shared-memory sizes (a model's K values): smem << 16 | slots */
    static std::atomic<unsigned long long> memo[64][4];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    std::atomic<unsigned long long> *m = memo[dev & 63];
    int slots = 0;
    for (int i = 0; i < 4 && !slots; i++) {
        const unsigned long long v = m[i].load(std::memory_order_acquire);
        if (v && (v >> 16) == smem) slots = (int)(v & 0xFFFFu);
    }
    if (!slots) {
        int per_sm = 0, sms = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lc_qgemv_bulk_kernel<T, FMT, F32, W>,
                                                          (W + 1) * 32, smem);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return e;
        if (per_sm < 1) return cudaErrorInvalidConfiguration;
        slots = per_sm * sms > 0xFFFF ? 0xFFFF : per_sm * sms;
        /* into the first free entry, else over the one this size hashes to */
        const unsigned long long v = (unsigned long long)smem << 16 | (unsigned long long)slots;
        int i = 0;
        while (i < 4 && m[i].load(std::memory_order_acquire)) i++;
        m[i < 4 ? i : (int)((smem >> 4) & 3)].store(v, std::memory_order_release);
    }
    *tpc = (tiles + slots - 1) / slots;
    *grid = (tiles + *tpc - 1) / *tpc;
    return cudaSuccess;
}

template <typename T, int FMT, bool F32, int W>
static cudaError_t lc_qb_launch(const loom_cuda_qweight *w, const void *x, const void *xq, const float *sx,
                                void *y, cudaStream_t s) {
    static unsigned long long done = 0;
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    const int scb = I4 ? 2 * LC_QT_SB / w->group * 8 : 0; /* the pairs of a stage's 4096 columns */
    const size_t smem = lc_qt_layout_of(w->K, scb, I4).bytes;
    /* the attribute once, for the largest a launch can ask (K = 65536) */
    const size_t smax = lc_qt_layout_of(65536, I4 ? 2 * LC_QT_SB / 128 * 8 : 0, I4).bytes;
    if (smem > 227 * 1024) return cudaErrorInvalidValue;
    cudaError_t e = lc_smem_limit(&done, (const void *)lc_qgemv_bulk_kernel<T, FMT, F32, W>,
                                  smax < 227 * 1024 ? smax : 227 * 1024);
    if (e != cudaSuccess) return e;
    const int tiles = (w->N + LC_QT_ROWS - 1) / LC_QT_ROWS;
    int grid, tpc;
    e = lc_qb_grid<T, FMT, F32, W>(smem, tiles, &grid, &tpc);
    if (e != cudaSuccess) return e;
    return lc_launch(lc_qgemv_bulk_kernel<T, FMT, F32, W>, dim3((unsigned)grid), dim3((W + 1) * 32), smem, s,
                     static_cast<const T *>(x), static_cast<const uint8_t *>(xq), sx,
                     static_cast<const uint8_t *>(w->data), w->scales, y, w->N, w->K, w->group, scb, tpc,
                     (int)lc_qb_probe);
}

template <typename T, bool F32, int W>
static cudaError_t lc_qb_fmt(const loom_cuda_qweight *w, const void *x, const void *xq, const float *sx, void *y,
                             cudaStream_t s) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT4: return lc_qb_launch<T, LOOM_CUDA_Q_INT4, F32, W>(w, x, xq, sx, y, s);
    case LOOM_CUDA_Q_FP8: return lc_qb_launch<T, LOOM_CUDA_Q_FP8, F32, W>(w, x, xq, sx, y, s);
    default: return lc_qb_launch<T, LOOM_CUDA_Q_INT8_W8A16, F32, W>(w, x, xq, sx, y, s);
    }
}

template <typename T, bool F32>
static cudaError_t lc_qb_warps_of(const loom_cuda_qweight *w, const void *x, const void *xq, const float *sx,
                                  void *y, cudaStream_t s) {
    return lc_qb_warps == 4 ? lc_qb_fmt<T, F32, 4>(w, x, xq, sx, y, s) : lc_qb_fmt<T, F32, 8>(w, x, xq, sx, y, s);
}

extern "C" cudaError_t lc_qgemv_bulk(loom_cuda_dt dt, int out_f32, const loom_cuda_qweight *w, const void *x,
                                     const void *xq, const float *sx, void *y, cudaStream_t s) {
    if (!lc_qgemv_bulk_ok(w)) return cudaErrorInvalidValue;
    if (w->fmt == LOOM_CUDA_Q_FP8 && (!xq || !sx)) return cudaErrorInvalidValue;
    cudaError_t e;
    if (dt == LOOM_CUDA_F16)
        e = out_f32 ? lc_qb_warps_of<__half, true>(w, x, xq, sx, y, s)
                    : lc_qb_warps_of<__half, false>(w, x, xq, sx, y, s);
    else
        e = out_f32 ? lc_qb_warps_of<__nv_bfloat16, true>(w, x, xq, sx, y, s)
                    : lc_qb_warps_of<__nv_bfloat16, false>(w, x, xq, sx, y, s);
    if (e == cudaSuccess) lc_qb_launches++;
    return e;
}
