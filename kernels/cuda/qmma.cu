/*
 * kernels/cuda/qmma.cu — W8A16 and INT4 linear layers for mid-size batches
 * (above the GEMV's rows, up to LC_QMMA_MAX_M) on the tensor cores, the
 * weights decoded in registers: lc_qmma (qgemm.c dispatches).
 *
 * Why: the other way for these formats above the GEMV's 8 rows is to
 * dequantize the whole weight into a bf16 scratch copy and run cuBLASLt on
 * it — per call one read of the codes, a write and a read of twice their
 * bytes: 5 bytes a weight against bf16's 2 (batch-64 decode at ~0.4x of
 * bf16). Here every weight byte is read once and multiplied with all the
 * batch's tokens while in registers: one Llama-3-8B layer at M = 16 133 us
 * (W8A16, INT4) against 349 / 358 dequantized and 141 bf16; at M = 64
 * 215 / 227 against 389 / 489 and 154 bf16 (H200,
 * bench/results/h200-quant-linears.json).
 *
 * Two kernels per call (three with K slices):
 *   lc_qmma_prep   per token: x scaled by a power of two 2^e with max |x 2^e|
 *                  in [2^14, 2^15) and stored as f16 (exact for every bf16
 *                  value down to 2^-29 of the token's maximum, as in
 *                  qgemv_tc.cu), 2^-e kept to undo it; INT4 also the sum of
 *                  each 128-column block of the scaled row (the group bias
 *                  term), and its columns stored in the order the nibble
 *                  decode yields, (0,4)(1,5)(2,6)(3,7) per 8.
 *   lc_qmma        a CTA of 4 warps owns 64 weight rows (16 a warp: the mma's
 *                  M) and up to 64 tokens (8 n-tiles of 8: the mma's N). Per
 *                  k-step each of a warp's 16 rows gives one whole 128-byte
 *                  line (lc_qm says how lanes split it), loaded straight from
 *                  global memory into registers LC_QMMA_WP steps ahead and
 *                  decoded to exact f16 codes — int8: one PRMT under 1024 and
 *                  one HSUB2 per two weights; int4: qgemv_tc.cu's LOP3 +
 *                  HSUB2 / HFMA2 — while the token tiles stream into shared
 *                  memory by cp.async (2-3 stages). mma.sync m16n8k16
 *                  f16 x f16 -> f32. Operand order trick (as qgemv_tc.cu): a
 *                  lane's A registers are its bytes as loaded, and it reads B
 *                  at the same physical columns.
 *   lc_ksplit_reduce (mma.cuh) matrices of fewer than 2 x 132 row tiles (the O and down
 *                  projections of an 8B model) are also split over K (grid
 *                  z); the slices' f32 partial sums are added here in slice
 *                  order, so results do not depend on timing.
 *
 * Accuracy: products exact (8-bit / 4-bit codes x f16 activations), fp32
 * accumulation; INT4's group map s * sum(x q) + b * sum(x) per 128-column
 * block (group % 128 == 0), the scales applied in fp32; W8A16's row scale
 * and every token's 2^-e at the end — the GEMV's arithmetic up to the
 * activations' f16 rounding below 2^-29 of a token's max.
 *
 * What it is not (yet): a Hopper wgmma kernel, nor one with weights
 * repacked at load for fully contiguous warp loads (Marlin's layout): it
 * beats bf16 at 16 rows (1.06x) but not at 64 (0.68-0.72x; its mma.sync
 * pipeline is far from the tensor cores' peak), and above LC_QMMA_MAX_M
 * rows dequantize + cuBLASLt takes over again.
 *
 * Contract: K % 128 == 0 (INT4: K % 256 == 0 and group % 128 == 0), 16-byte
 * aligned x and weight rows; M <= LC_QMMA_MAX_M. lc_qmma_ok says whether
 * it applies.
 */
#include "common.cuh"

#include "cp_async.cuh"
#include "mma.cuh"
#include "qgemm.h"

#define LC_QMMA_WARPS 4
#define LC_QMMA_ROWS (LC_QMMA_WARPS * 16) /* weight rows per CTA */
#define LC_QMMA_SMS 132                   /* CTAs to aim for: 2 per SM of an H100 / H200 */

template <int FMT> struct lc_qm {
    static constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    /* Per k-step a warp's rows each give one whole 128-byte line: int8 128
     * columns, lane t bytes [32 t, 32 t + 32); int4 256 columns as two
     * 128-column blocks (a group never straddles one), lane t bytes
     * [16 t, +16) of each half. Half lines per row and step ran at ~1.3 TB/s
     * (H200: W8A16 at M = 16 175 vs 136 us a layer). */
    static constexpr int KS = I4 ? 256 : 128; /* columns per k-step */
    static constexpr int LO = I4 ? 16 : 32;   /* a lane's first byte in the line, per t */
    static constexpr int VS = I4 ? 64 : 16;   /* from its first 16-byte vector to its second */
    /* halves per staged token row: KS / 8 + 2 16-byte chunks (= 2 mod 8), so
     * the 8 lanes of a 16-byte shared load phase (rows g, g + 1; t = 0..3)
     * hit 8 different 4-bank groups (with lc_qm_chunk's swizzle) */
    static constexpr int XROW = KS + 16;
};

/* Where 16-byte chunk c of a staged token row lives: lane t reads chunks
 * 4t + j (j = 0..3) in turn, and t, t + 2 would share banks. */
__device__ __forceinline__ int lc_qm_chunk(int c) { return c ^ ((c >> 3) & 1); }


/* ------------------------------------------------------------ prepare x */

/* One CTA per token: x16 (M, K) f16 scaled rows, inv (M) the 2^-e to undo,
 * xg (M, K / 128) INT4's per-step sums of the scaled row. */
template <typename T, bool I4>
__global__ void __launch_bounds__(256)
    lc_qmma_prep_kernel(const T *__restrict__ x, int K, uint16_t *__restrict__ x16,
                        float *__restrict__ inv, float *__restrict__ xg) {
    __shared__ float red[32];
    const int m = blockIdx.x;
    const T *xr = x + (size_t)m * K;
    lc_pdl_trigger();
    lc_pdl_wait();
    float a = 0.0f;
    for (int k = threadIdx.x * 8; k < K; k += 256 * 8) {
        float v[8];
        lc_unpack8<T>(lc_ldg16(xr + k), v);
#pragma unroll
        for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(v[e]));
    }
    a = lc_block_max(a, red);
    const int e = lc_tok_exp(a);
    const float sc = lc_pow2(e);
    if (threadIdx.x == 0) inv[m] = lc_pow2(-e);
    /* each half-warp's 16 chunks are one 128-column block, and the full-mask
     * shuffle below needs whole warps in the loop: K % 256 == 0 for INT4
     * (lc_qmma_ok) */
    for (int k = threadIdx.x * 8; k < K; k += 256 * 8) {
        float v[8];
        lc_unpack8<T>(lc_ldg16(xr + k), v);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __half2float(__float2half_rn(v[i] * sc));
        lc_stg16(x16 + (size_t)m * K + k, lc_pack_h8<I4>(v));
        if constexpr (I4) {
            float s8 = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) s8 += __shfl_xor_sync(0xffffffffu, s8, o);
            if ((threadIdx.x & 15) == 0) xg[(size_t)m * (K / 128) + k / 128] = s8;
        }
    }
}

/* ------------------------------------------------------------------ GEMM */

/* grid (row tiles of 64, token tiles of 8 NT, K slices). Z == 1: y (M, N)
 * dt or f32; else part (Z, M, N) f32 unscaled by W8A16's row scales and by
 * the tokens' 2^-e (lc_qmma_reduce applies them).
 *
 * The weights of the next LC_QMMA_WP steps are in flight in registers (a
 * ring, indexed statically by unrolling), the token tiles (from L2)
 * lc_qmma_xs() steps deep in shared memory. Measured on the H200 (calls
 * E-H): what mattered was whole 128-byte lines per row and step (half lines:
 * ~1.3 TB/s of weights); a 4-deep ring with half lines gained nothing. */
#define LC_QMMA_WP 2
template <int FMT> constexpr int lc_qmma_xs() { return FMT == LOOM_CUDA_Q_INT4 ? 2 : 3; }
template <int FMT, int NT> constexpr size_t lc_qmma_smem() {
    return (size_t)lc_qmma_xs<FMT>() * 8 * NT * lc_qm<FMT>::XROW * 2 +
           (lc_qm<FMT>::I4 ? (size_t)lc_qmma_xs<FMT>() * 8 * NT * 2 * 4 : 0);
}

template <typename T, int FMT, int NT, bool F32>
__global__ void __launch_bounds__(LC_QMMA_WARPS * 32)
    lc_qmma_kernel(const uint16_t *__restrict__ x16, const float *__restrict__ inv,
                   const float *__restrict__ xg, const uint8_t *__restrict__ wd,
                   const float *__restrict__ sc, void *__restrict__ y, float *__restrict__ part, int M,
                   int N, int K, int group) {
    typedef lc_qm<FMT> F;
    constexpr int TOK = 8 * NT, XS = lc_qmma_xs<FMT>(), WP = LC_QMMA_WP;
    extern __shared__ __align__(16) uint16_t lc_qm_xs[]; /* [XS][TOK][XROW] halves, then INT4's [XS][TOK][2] sums */
    float *xgs = reinterpret_cast<float *>(lc_qm_xs + XS * TOK * F::XROW);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * LC_QMMA_ROWS + warp * 16, m0 = blockIdx.y * TOK;
    const int S = K / F::KS, Z = (int)gridDim.z, z = (int)blockIdx.z;
    const int s_lo = (int)((long long)S * z / Z), s_hi = (int)((long long)S * (z + 1) / Z);
    const size_t row_bytes = F::I4 ? (size_t)K / 2 : (size_t)K;
    const int ra = n0 + g < N ? n0 + g : N - 1, rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
    const uint8_t *wa = wd + (size_t)ra * row_bytes + F::LO * t;
    const uint8_t *wb = wd + (size_t)rb * row_bytes + F::LO * t;
    const int groups = F::I4 ? K / group : 1;
    const float2 *sa = reinterpret_cast<const float2 *>(sc) + (F::I4 ? (size_t)ra * groups : 0);
    const float2 *sb = reinterpret_cast<const float2 *>(sc) + (F::I4 ? (size_t)rb * groups : 0);

    /* the first WP steps' weights do not depend on the kernel before */
    uint4 wra[WP][2], wrb[WP][2];
#pragma unroll
    for (int u = 0; u < WP; u++)
        if (s_lo + u < s_hi)
#pragma unroll
            for (int v = 0; v < 2; v++) {
                wra[u][v] = __ldcs(reinterpret_cast<const uint4 *>(wa + (size_t)(s_lo + u) * 128 + v * F::VS));
                wrb[u][v] = __ldcs(reinterpret_cast<const uint4 *>(wb + (size_t)(s_lo + u) * 128 + v * F::VS));
            }
    lc_pdl_trigger();
    lc_pdl_wait();

    /* the token tile of step s into buffer b (zeros past M); one cp.async
     * group per call, empty past the slice so the waits count alike */
    auto stage = [&](int s, int b) {
        if (s < s_hi) {
            constexpr int CH = F::KS / 8; /* 16-byte chunks per token row */
            for (int i = threadIdx.x; i < TOK * CH; i += LC_QMMA_WARPS * 32) {
                const int tk = i / CH, c = i % CH, m = m0 + tk;
                const bool ok = m < M;
                lc_cp16(lc_qm_xs + ((size_t)b * TOK + tk) * F::XROW + lc_qm_chunk(c) * 8,
                        x16 + (size_t)(ok ? m : 0) * K + (size_t)s * F::KS + c * 8, ok);
            }
            if constexpr (F::I4) {
                for (int i = threadIdx.x; i < 2 * TOK; i += LC_QMMA_WARPS * 32) {
                    const int tk = i >> 1, h = i & 1, m = m0 + tk;
                    const bool ok = m < M;
                    lc_cp4(xgs + (b * TOK + tk) * 2 + h, xg + (size_t)(ok ? m : 0) * (K / 128) + 2 * s + h, ok);
                }
            }
        }
        lc_cp_commit();
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

#pragma unroll
    for (int i = 0; i < XS - 1; i++) stage(s_lo + i, i);
    for (int s0 = s_lo; s0 < s_hi; s0 += WP) {
#pragma unroll
        for (int u = 0; u < WP; u++) {
            const int s = s0 + u;
            if (s >= s_hi) break;
            const int b = (s - s_lo) % XS;
            stage(s + XS - 1, (s - s_lo + XS - 1) % XS); /* the buffer step s - 1 used */
            lc_cp_wait<XS - 1>();
            __syncthreads();
            uint32_t A[8], B[8];
#pragma unroll
            for (int v = 0; v < 2; v++) {
                A[4 * v] = wra[u][v].x, A[4 * v + 1] = wra[u][v].y, A[4 * v + 2] = wra[u][v].z, A[4 * v + 3] = wra[u][v].w;
                B[4 * v] = wrb[u][v].x, B[4 * v + 1] = wrb[u][v].y, B[4 * v + 2] = wrb[u][v].z, B[4 * v + 3] = wrb[u][v].w;
            }
            if (s + WP < s_hi) /* refill the slot: step s + WP */
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    wra[u][v] = __ldcs(reinterpret_cast<const uint4 *>(wa + (size_t)(s + WP) * 128 + v * F::VS));
                    wrb[u][v] = __ldcs(reinterpret_cast<const uint4 *>(wb + (size_t)(s + WP) * 128 + v * F::VS));
                }
            const uint16_t *xs = lc_qm_xs + (size_t)b * TOK * F::XROW;
            if constexpr (!F::I4) {
                /* lane t: columns [32 t, 32 t + 32) of the step, word j = 4 of them */
                uint32_t a0[8], a1[8], a2[8], a3[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    lc_i8x4_h2(A[j], a0[j], a2[j]);
                    lc_i8x4_h2(B[j], a1[j], a3[j]);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint16_t *xr = xs + (nt * 8 + g) * F::XROW;
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const uint4 xv = *reinterpret_cast<const uint4 *>(xr + lc_qm_chunk(4 * t + c) * 8);
                        lc_mma_f16(acc[nt], a0[2 * c], a1[2 * c], a2[2 * c], a3[2 * c], xv.x, xv.y);
                        lc_mma_f16(acc[nt], a0[2 * c + 1], a1[2 * c + 1], a2[2 * c + 1], a3[2 * c + 1], xv.z, xv.w);
                    }
                }
            } else {
                /* block h (128 columns, one group): lane t columns
                 * [128 h + 32 t, +32), word j = 8 of them */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t P[4][4], Q[4][4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        lc_u4x8_h2(A[4 * h + j], P[j]);
                        lc_u4x8_h2(B[4 * h + j], Q[j]);
                    }
                    const int grp = (s * F::KS + 128 * h) / group;
                    const float2 fa = __ldg(sa + grp), fb = __ldg(sb + grp);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        const uint16_t *xr = xs + (nt * 8 + g) * F::XROW;
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const uint4 xv = *reinterpret_cast<const uint4 *>(xr + lc_qm_chunk(16 * h + 4 * t + j) * 8);
                            lc_mma_f16(d, P[j][0], Q[j][0], P[j][1], Q[j][1], xv.x, xv.y);
                            lc_mma_f16(d, P[j][2], Q[j][2], P[j][3], Q[j][3], xv.z, xv.w);
                        }
                        const float *xgb = xgs + ((size_t)b * TOK + nt * 8 + 2 * t) * 2 + h;
                        const float X0 = xgb[0], X1 = xgb[2];
                        acc[nt][0] = fmaf(fa.x, d[0], fmaf(fa.y, X0, acc[nt][0]));
                        acc[nt][1] = fmaf(fa.x, d[1], fmaf(fa.y, X1, acc[nt][1]));
                        acc[nt][2] = fmaf(fb.x, d[2], fmaf(fb.y, X0, acc[nt][2]));
                        acc[nt][3] = fmaf(fb.x, d[3], fmaf(fb.y, X1, acc[nt][3]));
                    }
                }
            }
            __syncthreads(); /* buffer b is restaged XS - 1 steps on */
        }
    }
    lc_cp_wait<0>(); /* no copy may land after the CTA has gone */

    /* C: rows g, g + 8 of the warp's 16; tokens 2t, 2t + 1 of each n-tile */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = n0 + g + (i >= 2 ? 8 : 0), m = m0 + nt * 8 + 2 * t + (i & 1);
            if (n >= N || m >= M) continue;
            const size_t o = (size_t)m * N + n;
            if (Z > 1) {
                part[(size_t)z * M * N + o] = acc[nt][i];
                continue;
            }
            float v = acc[nt][i] * inv[m];
            if constexpr (FMT == LOOM_CUDA_Q_INT8_W8A16) v *= sc[n];
            if (F32) static_cast<float *>(y)[o] = v;
            else static_cast<T *>(y)[o] = lc_from_f<T>(v);
        }
}


/* ------------------------------------------------------------- dispatch */

extern "C" int lc_qmma_ok(const loom_cuda_qweight *w, int M) {
    if (M < 1 || M > LC_QMMA_MAX_M || w->N <= 0 || w->K <= 0 || w->K % 128) return 0;
    if (w->fmt == LOOM_CUDA_Q_INT8_W8A16) return 1;
    return w->fmt == LOOM_CUDA_Q_INT4 && w->K % 256 == 0 && w->group > 0 && w->group % 128 == 0 &&
           w->K % w->group == 0;
}

/* K slices: enough CTAs for two per SM when the row tiles are few */
static int lc_qmma_splits(const loom_cuda_qweight *w) {
    const int tiles = (w->N + LC_QMMA_ROWS - 1) / LC_QMMA_ROWS;
    const int steps = w->K / (w->fmt == LOOM_CUDA_Q_INT4 ? 256 : 128);
    int z = tiles >= 2 * LC_QMMA_SMS ? 1 : (2 * LC_QMMA_SMS + tiles - 1) / tiles;
    if (z > 8) z = 8;
    if (z > steps / 4) z = steps / 4 > 0 ? steps / 4 : 1;
    return z;
}

/* The scratch of a call at M rows, regions 256-byte aligned: x16 (M, K)
 * f16 | inv (M) | INT4's xg (M, K / 128) | the K slices' partial sums. */
struct lc_qmma_layout {
    size_t inv, xg, part, bytes;
};
static lc_qmma_layout lc_qmma_layout_of(const loom_cuda_qweight *w, int M) {
    auto r256 = [](size_t n) { return (n + 255) & ~(size_t)255; };
    lc_qmma_layout l;
    l.inv = r256((size_t)M * w->K * 2);
    l.xg = l.inv + r256((size_t)M * 4);
    l.part = l.xg + (w->fmt == LOOM_CUDA_Q_INT4 ? r256((size_t)M * (w->K / 128) * 4) : 0);
    const int z = lc_qmma_splits(w);
    l.bytes = l.part + (z > 1 ? (size_t)z * M * w->N * 4 : 0);
    return l;
}

extern "C" size_t lc_qmma_scratch_bytes(const loom_cuda_qweight *w, int M) {
    return lc_qmma_layout_of(w, M < LC_QMMA_MAX_M ? M : LC_QMMA_MAX_M).bytes;
}

/* Raise the kernel's dynamic shared-memory limit (up to 70 KB against the
 * default 48), once per device (lc_smem_limit). */
template <typename T, int FMT, int NT, bool F32>
static cudaError_t lc_qmma_prepare(size_t smem) {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_qmma_kernel<T, FMT, NT, F32>, smem);
}

template <typename T, int FMT, bool F32>
static cudaError_t lc_qmma_t(int M, const loom_cuda_qweight *w, const void *x, void *y, uint8_t *scr,
                             cudaStream_t s) {
    typedef lc_qm<FMT> F;
    const lc_qmma_layout l = lc_qmma_layout_of(w, M);
    uint16_t *x16 = reinterpret_cast<uint16_t *>(scr);
    float *inv = reinterpret_cast<float *>(scr + l.inv);
    float *xg = F::I4 ? reinterpret_cast<float *>(scr + l.xg) : NULL;
    float *part = reinterpret_cast<float *>(scr + l.part);
    cudaError_t e = lc_launch(lc_qmma_prep_kernel<T, F::I4>, dim3((unsigned)M), dim3(256), 0, s,
                              static_cast<const T *>(x), w->K, x16, inv, xg);
    if (e != cudaSuccess) return e;
    const int Z = lc_qmma_splits(w);
    const unsigned gx = (unsigned)((w->N + LC_QMMA_ROWS - 1) / LC_QMMA_ROWS);
    /* token tiles of 64; a last (or only) smaller batch takes fewer n-tiles */
    const int NT = M > 32 ? 8 : M > 16 ? 4 : 2;
    const int tok = 8 * NT;
    const dim3 grid(gx, (unsigned)((M + tok - 1) / tok), (unsigned)Z);
#define LC_QMMA_GO(NT_)                                                                            \
    do {                                                                                           \
        constexpr size_t smem = lc_qmma_smem<FMT, NT_>();                                          \
        const cudaError_t attr = lc_qmma_prepare<T, FMT, NT_, F32>(smem);                          \
        if (attr != cudaSuccess) return attr;                                                      \
        e = lc_launch(lc_qmma_kernel<T, FMT, NT_, F32>, grid, dim3(LC_QMMA_WARPS * 32), smem, s,  \
                      x16, (const float *)inv, (const float *)xg,                                  \
                      static_cast<const uint8_t *>(w->data), (const float *)w->scales, y, part, M, \
                      w->N, w->K, w->group);                                                       \
    } while (0)
    if (NT == 8) LC_QMMA_GO(8);
    else if (NT == 4) LC_QMMA_GO(4);
    else LC_QMMA_GO(2);
#undef LC_QMMA_GO
    if (e != cudaSuccess || Z == 1) return e;
    return lc_ksplit_reduce<T, FMT == LOOM_CUDA_Q_INT8_W8A16, F32>((const float *)part, (const float *)inv,
                                                                   w->scales, y, M, w->N, Z, s);
}

extern "C" cudaError_t lc_qmma(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                               const void *x, void *y, void *scratch, cudaStream_t s) {
    if (!lc_qmma_ok(w, M)) return cudaErrorInvalidValue;
    uint8_t *scr = static_cast<uint8_t *>(scratch);
#define LC_QMMA_T(T)                                                                               \
    (w->fmt == LOOM_CUDA_Q_INT4                                                                    \
         ? (out_f32 ? lc_qmma_t<T, LOOM_CUDA_Q_INT4, true>(M, w, x, y, scr, s)                     \
                    : lc_qmma_t<T, LOOM_CUDA_Q_INT4, false>(M, w, x, y, scr, s))                   \
         : (out_f32 ? lc_qmma_t<T, LOOM_CUDA_Q_INT8_W8A16, true>(M, w, x, y, scr, s)               \
                    : lc_qmma_t<T, LOOM_CUDA_Q_INT8_W8A16, false>(M, w, x, y, scr, s)))
    return dt == LOOM_CUDA_F16 ? LC_QMMA_T(__half) : LC_QMMA_T(__nv_bfloat16);
#undef LC_QMMA_T
}
