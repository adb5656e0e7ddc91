/*
 * kernels/cuda/qgemv_tc.cu — the quantized GEMV of small decode batches on
 * the tensor cores, for 2..8 rows of x (INT4: 3..8): lc_qgemv (qgemm.cu)
 * runs it when lc_qgemv_use_tc() says so, else its own CUDA-core kernel.
 *
 * Why, and where it pays (H200, one Llama-3-8B layer's four linears,
 * bench/gpu/gpu_bench --quant): the CUDA-core kernel decodes each
 * weight to fp32 and spends one FMA per weight and token, so its cost grows
 * with M — FP8 at M = 8 took 1.8x its M = 1 time, INT4 3.7x. An mma.sync
 * takes 16 rows x 32 (8-bit) or 16 (f16) columns per instruction and the
 * token count rides in its N = 8 columns for free, so this kernel costs
 * about the same at M = 8 as at M = 1: FP8 1.82x bf16 at M = 8 (CUDA cores
 * 1.07x), W8A8 1.90x (1.67x), INT4 190 vs 299 us. At M = 1 it is slower
 * than the CUDA-core kernel in every format (it reaches only 12-17% occupancy
 * and 36-72% of DRAM bandwidth on these shapes), so M = 1 stays there, as
 * does W8A16 (no gain at M = 8); other layouts at M = 1 were no faster
 * (docs/performance.md, "Tried and rejected").
 *
 *   FP8  (e4m3 x e4m3, m16n8k32; on sm_90 the compiler lowers it to f16
 *        HMMA with F2FP conversions) and W8A8 (s8 x s8, m16n8k32): the
 *        weight bytes are the A operand as loaded;
 *   INT4 (m16n8k16): one LOP3 places two nibbles under 1024 (or 1024 + 16
 *        nibble), one HSUB2 / HFMA2 makes them exact f16 codes 0..15.
 *
 * Operand order trick: a dot product does not care in which order its k
 * terms are summed, so each lane loads 16 contiguous bytes of its rows and
 * uses them as its A-fragment registers as they are; the activation
 * fragment (B) is loaded at the same physical columns. The mma layouts
 * tie a lane's k positions only to its thread-in-group index (never to its
 * row group), which is what makes this legal: lane (g, t) = (lane / 4,
 * lane % 4) holds rows g and g + 8 of the 16-row tile and token g of B, all
 * at bytes [64 s + 16 t, +16) of k-step s (64 weight bytes per row and
 * step: 64 columns of 8-bit codes, 128 of int4).
 *
 * f16 activations (INT4): x is bf16 / f16 and may exceed f16's range, so
 * each token is scaled by a power of two 2^e chosen from its max |x| (max
 * |x 2^e| in [2^14, 2^15)): exact for every bf16 value (8 significant bits
 * in f16's 11) down to 2^-29 of the token's maximum, and undone on the
 * output (y = acc 2^-e, exact). Each CTA stages its x, scaled and converted
 * once, into shared memory phase by phase (1024 columns, double-buffered),
 * each 8-column block as (0,4)(1,5)(2,6)(3,7) — the pairs the nibble
 * extraction yields — with the per-step sums of x that the group bias
 * needs (w = scale q + bias: acc += scale sum(x q) + bias sum(x) per
 * 128-column step; a step never straddles a group).
 *
 * Accuracy: products are exact (8-bit codes x 8-bit codes, 4-bit codes x
 * 11-bit f16); the tensor core's own fp32 sums are short (one mma for FP8,
 * whose accumulation on Hopper keeps fewer bits; one 128-column step for
 * INT4) and feed fp32 register sums. W8A8 sums int32 exactly, so its bits
 * equal the CUDA-core kernel's.
 *
 * Layout: one CTA of 4 warps per 16 output rows; the CTA's k-steps go in
 * phases of 1024 columns, each warp taking a quarter of a phase (4 8-bit or
 * 2 int4 steps) and loading the next phase's weights (and 8-bit
 * activations) into registers while it multiplies this one — the first
 * phase's weights before lc_pdl_wait(), as they do not depend on the kernel
 * before (loom_cuda_qweight's contract: no kernel writes a weight). Two independent mma chains per step hide the mma latency. The
 * warps' partial tiles are summed in shared memory in a fixed order.
 */
#include "common.cuh"

#include <atomic>

#include "mma.cuh"
#include "qgemm.h"

#define LC_TC_WARPS 4
#define LC_TC_PHASE_K 1024             /* columns of one phase                 */
#define LC_TC_XSTRIDE (LC_TC_PHASE_K + 8) /* halves per staged token (+16 B: no bank conflicts) */

/* ------------------------------------------------------------------ mma */

__device__ __forceinline__ void lc_mma_e4m3(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ void lc_mma_s8(int *c, uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ------------------------------------------------------------------ GEMV */

template <int FMT> struct lc_tc_fmt {
    static constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4; /* also: f16 activations staged */
    static constexpr int KSTEP = I4 ? 128 : 64; /* columns per 64-byte step */
    static constexpr int U = LC_TC_PHASE_K / KSTEP / LC_TC_WARPS; /* steps per warp per phase */
};

/* This warp's U steps of phase p: weights of rows g, g + 8 (and INT4's
 * {scale, bias} of each), steps past the row's end left alone. */
template <int FMT>
__device__ __forceinline__ void lc_tc_load_w(const uint8_t *wa, const uint8_t *wb, const float2 *sa,
                                             const float2 *sb, int s0, int S, int t, int group,
                                             uint4 *va, uint4 *vb, float2 *fa, float2 *fb) {
    typedef lc_tc_fmt<FMT> F;
#pragma unroll
    for (int u = 0; u < F::U; u++) {
        const int s = s0 + u;
        if (s < S) {
            va[u] = __ldcs(reinterpret_cast<const uint4 *>(wa + (size_t)s * 64 + 16 * t));
            vb[u] = __ldcs(reinterpret_cast<const uint4 *>(wb + (size_t)s * 64 + 16 * t));
            if constexpr (F::I4) {
                const int grp = s * F::KSTEP / group;
                fa[u] = __ldg(sa + grp);
                fb[u] = __ldg(sb + grp);
            }
        }
    }
}

/* x (M, K) dt for INT4; xq (M, K) codes and sx (M) for FP8 / W8A8.
 * y (M, N) dt or f32. Dynamic shared memory: INT4 only,
 * 2 x M x LC_TC_XSTRIDE halves. */
template <typename T, int FMT, bool F32>
__global__ void __launch_bounds__(LC_TC_WARPS * 32)
    lc_tcgemv_kernel(const T *__restrict__ x, const uint8_t *__restrict__ xq,
                     const float *__restrict__ sx, const uint8_t *__restrict__ wd,
                     const float *__restrict__ sc, void *__restrict__ y, int M, int N, int K,
                     int group) {
    typedef lc_tc_fmt<FMT> F;
    constexpr int U = F::U;
    extern __shared__ __align__(16) uint16_t lc_tc_xs[]; /* [2][M][LC_TC_XSTRIDE] */
    __shared__ float red[LC_TC_WARPS - 1][32][4];
    __shared__ float xsum[2][8][LC_TC_PHASE_K / 128]; /* INT4: sum of x per step */
    __shared__ float amax_w[8][LC_TC_WARPS];
    __shared__ float tok_scale[8], tok_inv[8];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16;
    const size_t row_bytes = F::I4 ? (size_t)K / 2 : (size_t)K;
    const int S = (int)(row_bytes / 64);                /* steps */
    const int PS = U * LC_TC_WARPS;                     /* steps per phase */
    const int NP = (S + PS - 1) / PS;                   /* phases */
    const int ra = n0 + g < N ? n0 + g : N - 1, rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
    const uint8_t *wa = wd + (size_t)ra * row_bytes, *wb = wd + (size_t)rb * row_bytes;
    const int groups = F::I4 ? K / group : 1;
    const float2 *sa = reinterpret_cast<const float2 *>(sc) + (F::I4 ? (size_t)ra * groups : 0);
    const float2 *sb = reinterpret_cast<const float2 *>(sc) + (F::I4 ? (size_t)rb * groups : 0);
    const int tok = g < M ? g : M - 1; /* B column g: token g (columns >= M are discarded) */

    uint4 wa0[U], wb0[U], wa1[U], wb1[U];
    float2 fa0[U], fb0[U], fa1[U], fb1[U];
    /* weights do not depend on the previous kernel: the first phase's are
     * in flight while it finishes */
    lc_tc_load_w<FMT>(wa, wb, sa, sb, warp * U, S, t, group, wa0, wb0, fa0, fb0);
    lc_pdl_trigger();
    lc_pdl_wait();
    /* and the second phase's, so two phases stream during the f16 prologue */
    if (NP > 1) lc_tc_load_w<FMT>(wa, wb, sa, sb, PS + warp * U, S, t, group, wa1, wb1, fa1, fb1);

    /* f16 staging: x (scaled) into buffer b for phase p */
    auto stage = [&](int p, int b) {
        if constexpr (F::I4) {
            const int k0 = p * LC_TC_PHASE_K + threadIdx.x * 8; /* one 8-column chunk a thread */
            const bool in = k0 < K;
            uint4 raw[8]; /* every token's chunk requested before any is used */
#pragma unroll
            for (int m = 0; m < 8; m++)
                if (m < M && in) raw[m] = lc_ldg16(x + (size_t)m * K + k0);
#pragma unroll
            for (int m = 0; m < 8; m++) {
                if (m >= M) break;
                float v[8];
                if (in) {
                    lc_unpack8<T>(raw[m], v);
                    const float s = tok_scale[m];
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] *= s;
                    const uint4 h = make_uint4(lc_pack2<__half>(v[0], v[4]), lc_pack2<__half>(v[1], v[5]),
                                               lc_pack2<__half>(v[2], v[6]), lc_pack2<__half>(v[3], v[7]));
                    *reinterpret_cast<uint4 *>(lc_tc_xs + ((size_t)b * M + m) * LC_TC_XSTRIDE +
                                               threadIdx.x * 8) = h;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = 0.0f;
                }
                /* 16 chunks = one 128-column step: lanes 0-15 / 16-31 */
                float s8 = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) s8 += __shfl_xor_sync(0xffffffffu, s8, o);
                if ((lane & 15) == 0) xsum[b][m][threadIdx.x >> 4] = s8;
            }
        }
    };

    if constexpr (F::I4) {
        /* per-token scale 2^e with max |x 2^e| in [2^14, 2^15) */
        constexpr int CH = LC_TC_WARPS * 32 * 8; /* columns the CTA covers per load */
#pragma unroll 1
        for (int m = 0; m < M; m++) {
            float a = 0.0f;
            /* 8 loads in flight per thread: K = 14336 is two round trips */
            for (int k = threadIdx.x * 8; k < K; k += 8 * CH) {
                uint4 raw[8];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (k + i * CH < K) raw[i] = lc_ldg16(x + (size_t)m * K + k + i * CH);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (k + i * CH < K) {
                        float v[8];
                        lc_unpack8<T>(raw[i], v);
#pragma unroll
                        for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(v[e]));
                    }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
            if (lane == 0) amax_w[m][warp] = a;
        }
        __syncthreads();
        if (threadIdx.x < M) {
            const int m = threadIdx.x;
            float a = amax_w[m][0];
#pragma unroll
            for (int w = 1; w < LC_TC_WARPS; w++) a = fmaxf(a, amax_w[m][w]);
            int e = 0;
            if (a > 0.0f) {
                e = 141 - (int)((__float_as_uint(a) >> 23) & 0xFFu); /* 14 - unbiased exponent */
                e = e < -126 ? -126 : e > 126 ? 126 : e;
            }
            tok_scale[m] = __uint_as_float((uint32_t)(127 + e) << 23);
            tok_inv[m] = __uint_as_float((uint32_t)(127 - e) << 23);
        }
        __syncthreads();
        stage(0, 0);
        __syncthreads();
    }

    /* 8-bit activations: this lane's token row, read at the weights' columns */
    const uint8_t *xr = F::I4 ? nullptr : xq + (size_t)tok * K;
    uint4 xa0[F::I4 ? 1 : U], xa1[F::I4 ? 1 : U];
    auto load_x = [&](int s0, uint4 *xv) {
        if constexpr (!F::I4) {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (s0 + u < S) xv[u] = __ldg(reinterpret_cast<const uint4 *>(xr + (size_t)(s0 + u) * 64 + 16 * t));
        }
    };
    load_x(warp * U, xa0);
    if (NP > 1) load_x(PS + warp * U, xa1);

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int iacc[4] = {0, 0, 0, 0}, iacc2[4] = {0, 0, 0, 0};

    /* multiply phase p (steps s0 .. s0 + U - 1 of this warp) */
    auto compute = [&](int p, int s0, const uint4 *va, const uint4 *vb, const float2 *fa,
                       const float2 *fb, const uint4 *xv) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int s = s0 + u;
            if (s >= S) break;
            if constexpr (FMT == LOOM_CUDA_Q_FP8) {
                float d[4];
                lc_mma_e4m3(d, va[u].x, vb[u].x, va[u].y, vb[u].y, xv[u].x, xv[u].y);
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] += d[i];
                lc_mma_e4m3(d, va[u].z, vb[u].z, va[u].w, vb[u].w, xv[u].z, xv[u].w);
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] += d[i];
            } else if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) {
                lc_mma_s8(iacc, va[u].x, vb[u].x, va[u].y, vb[u].y, xv[u].x, xv[u].y);
                lc_mma_s8(iacc2, va[u].z, vb[u].z, va[u].w, vb[u].w, xv[u].z, xv[u].w); /* exact: any split */
            } else {
                const int b = p & 1;
                const uint16_t *xs = lc_tc_xs + ((size_t)b * M + tok) * LC_TC_XSTRIDE +
                                     (s * F::KSTEP - p * LC_TC_PHASE_K) + t * (F::KSTEP / 4);
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                float e[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* the second mma chain */
                const uint32_t A[4] = {va[u].x, va[u].y, va[u].z, va[u].w};
                const uint32_t B[4] = {vb[u].x, vb[u].y, vb[u].z, vb[u].w};
#pragma unroll
                for (int j = 0; j < 4; j++) { /* word j: columns 8j .. 8j + 7 of the lane's 32 */
                    const uint4 xj = *reinterpret_cast<const uint4 *>(xs + 8 * j);
                    uint32_t P[4], Q[4];
                    lc_u4x8_h2(A[j], P);
                    lc_u4x8_h2(B[j], Q);
                    lc_mma_f16(d, P[0], Q[0], P[1], Q[1], xj.x, xj.y);
                    lc_mma_f16(e, P[2], Q[2], P[3], Q[3], xj.z, xj.w);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) d[i] += e[i];
                /* C columns: tokens 2t, 2t + 1 */
                const int sl = s - p * (LC_TC_PHASE_K / 128);
                const int t0 = 2 * t < M ? 2 * t : M - 1, t1 = 2 * t + 1 < M ? 2 * t + 1 : M - 1;
                const float X0 = xsum[b][t0][sl], X1 = xsum[b][t1][sl];
                acc[0] = fmaf(fa[u].x, d[0], fmaf(fa[u].y, X0, acc[0]));
                acc[1] = fmaf(fa[u].x, d[1], fmaf(fa[u].y, X1, acc[1]));
                acc[2] = fmaf(fb[u].x, d[2], fmaf(fb[u].y, X0, acc[2]));
                acc[3] = fmaf(fb[u].x, d[3], fmaf(fb[u].y, X1, acc[3]));
            }
        }
    };

    /* phases two at a time so the register buffers never swap */
#pragma unroll 1
    for (int p = 0; p < NP; p += 2) {
        const int s0 = p * PS + warp * U, s1 = s0 + PS;
        if (p + 1 < NP) {
            if (p > 0) { /* phase 1 was loaded before the loop */
                lc_tc_load_w<FMT>(wa, wb, sa, sb, s1, S, t, group, wa1, wb1, fa1, fb1);
                load_x(s1, xa1);
            }
            stage(p + 1, (p + 1) & 1);
        }
        compute(p, s0, wa0, wb0, fa0, fb0, xa0);
        if constexpr (F::I4) __syncthreads();
        if (p + 1 < NP) {
            if (p + 2 < NP) {
                lc_tc_load_w<FMT>(wa, wb, sa, sb, s1 + PS, S, t, group, wa0, wb0, fa0, fb0);
                load_x(s1 + PS, xa0);
                stage(p + 2, p & 1);
            }
            compute(p + 1, s1, wa1, wb1, fa1, fb1, xa1);
            if constexpr (F::I4) __syncthreads();
        }
    }

#pragma unroll
    for (int i = 0; i < 4; i++) iacc[i] += iacc2[i];
    /* the warps' partial tiles, summed in a fixed order */
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            red[warp - 1][lane][i] = FMT == LOOM_CUDA_Q_INT8_W8A8 ? __int_as_float(iacc[i]) : acc[i];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int w = 0; w < LC_TC_WARPS - 1; w++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) iacc[i] += __float_as_int(red[w][lane][i]);
            else acc[i] += red[w][lane][i];
        }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int n = n0 + g + (i >= 2 ? 8 : 0), m = 2 * t + (i & 1);
        if (n >= N || m >= M) continue;
        float v;
        if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A8) v = (float)iacc[i] * (sx[m] * sc[n]);
        else if constexpr (FMT == LOOM_CUDA_Q_FP8) v = acc[i] * (sx[m] * sc[n]);
        else v = acc[i] * tok_inv[m];
        const size_t o = (size_t)m * N + n;
        if (F32) static_cast<float *>(y)[o] = v;
        else static_cast<T *>(y)[o] = lc_from_f<T>(v);
    }
}

/* ------------------------------------------------------------- dispatch */

/* The smallest M the kernel takes unless the GEMM context says otherwise
 * (loom_cuda_qgemm_set_tc_min_m; the cuda backend's qgemv_tc_min_rows):
 * measured on the H200 (gpu_bench --quant, one Llama-3-8B layer) W8A8 /
 * FP8 at M = 2 already as fast or faster (92.9 vs 93.9, 105.7
 * vs 108.0 us), INT4 at M = 2 slower (115.8 vs 111.1) but at M = 8 1.6x
 * faster; its crossover, interpolated, lies between 2 and 3. */
#define LC_TC_MIN_M 2    /* W8A8 / FP8 */
#define LC_TC_MIN_M_I4 3 /* INT4 */
static std::atomic<long> lc_tc_launches{0}, lc_cc_launches{0};

extern "C" void lc_qgemv_count(long *tc, long *cc) {
    *tc = lc_tc_launches;
    *cc = lc_cc_launches;
}
extern "C" void lc_qgemv_count_cc(void) { lc_cc_launches++; }

/* the shapes the kernel takes */
static int lc_tc_shape_ok(loom_cuda_qfmt fmt, int K, int group) {
    switch (fmt) {
    case LOOM_CUDA_Q_INT8_W8A8:
    case LOOM_CUDA_Q_FP8: return K > 0 && K % 64 == 0;
    case LOOM_CUDA_Q_INT4: return K > 0 && K % 128 == 0 && group > 0 && group % 128 == 0 && K % group == 0;
    default: return 0;
    }
}

extern "C" int lc_qgemv_use_tc(loom_cuda_qfmt fmt, int K, int group, int M, int invariant, int min_m) {
    if (invariant) return 0;
    if (min_m <= 0) min_m = fmt == LOOM_CUDA_Q_INT4 ? LC_TC_MIN_M_I4 : LC_TC_MIN_M;
    return M >= min_m && M <= LC_QGEMV_MAX_M && lc_tc_shape_ok(fmt, K, group);
}

template <typename T, int FMT, bool F32>
static cudaError_t lc_tcgemv_f(int M, const loom_cuda_qweight *w, const void *x, const void *xq,
                               const float *sx, void *y, cudaStream_t s) {
    const size_t smem = lc_tc_fmt<FMT>::I4 ? (size_t)2 * M * LC_TC_XSTRIDE * 2 : 0;
    return lc_launch(lc_tcgemv_kernel<T, FMT, F32>, dim3((unsigned)((w->N + 15) / 16)),
                     dim3(LC_TC_WARPS * 32), smem, s, static_cast<const T *>(x),
                     static_cast<const uint8_t *>(xq), sx, static_cast<const uint8_t *>(w->data),
                     w->scales, y, M, w->N, w->K, w->group);
}

template <typename T, bool F32>
static cudaError_t lc_tcgemv_t(int M, const loom_cuda_qweight *w, const void *x, const void *xq,
                               const float *sx, void *y, cudaStream_t s) {
    switch (w->fmt) {
    case LOOM_CUDA_Q_INT8_W8A8:
        return lc_tcgemv_f<T, LOOM_CUDA_Q_INT8_W8A8, F32>(M, w, x, xq, sx, y, s);
    case LOOM_CUDA_Q_FP8: return lc_tcgemv_f<T, LOOM_CUDA_Q_FP8, F32>(M, w, x, xq, sx, y, s);
    case LOOM_CUDA_Q_INT4: return lc_tcgemv_f<T, LOOM_CUDA_Q_INT4, F32>(M, w, x, xq, sx, y, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t lc_qgemv_tc(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                                   const void *x, const void *xq, const float *sx, void *y,
                                   cudaStream_t s) {
    if (M < 1 || M > LC_QGEMV_MAX_M || w->N <= 0 || !lc_tc_shape_ok(w->fmt, w->K, w->group))
        return cudaErrorInvalidValue;
    lc_tc_launches++;
    if (dt == LOOM_CUDA_F16)
        return out_f32 ? lc_tcgemv_t<__half, true>(M, w, x, xq, sx, y, s)
                       : lc_tcgemv_t<__half, false>(M, w, x, xq, sx, y, s);
    return out_f32 ? lc_tcgemv_t<__nv_bfloat16, true>(M, w, x, xq, sx, y, s)
                   : lc_tcgemv_t<__nv_bfloat16, false>(M, w, x, xq, sx, y, s);
}
