/*
 * kernels/cuda/qgemv_bulk.cu — W8A16 and INT4 linear layers at one row of
 * x (batch-1 decode) on sm_90: the weights staged in shared memory by the
 * bulk-copy engine (cp.async.bulk, the 1-D form of TMA) and multiplied on
 * the tensor cores. lc_qgemv_bulk; qgemm.cu's lc_qgemv calls it at M = 1
 * when lc_qgemv_bulk_ok says so — which is only on request
 * (LOOM_CUDA_QGEMV_BULK=1): measured, it is not faster than qgemm.cu's
 * CUDA-core GEMV, and it is kept, tested, as the measured starting point
 * for the next attempt.
 *
 * The question it answers: a Llama-3-8B layer's linears at M = 1, chained
 * in a CUDA graph as a decode step runs them, stream at ~3.0 TB/s (W8A16)
 * and ~2.1 TB/s (INT4) on qgemm.cu's kernel against bf16's 4.0 (H200,
 * bench/results/h200-2026-12-01-s8). A first version of this kernel with
 * qgemm.cu's arithmetic (16 rows a CTA, 512 B - 2 KB of each row a stage)
 * read the same weights at 3.8-4.3 TB/s (W8A16) and 3.1-4.0 (INT4) when its
 * arithmetic was skipped (gpu_bench's probe), and at 2.9-3.2 / 1.8-2.2 with
 * it: the arithmetic — ~3.5 instructions a weight (decode to f32, FFMA, the
 * token's conversion) — is the bound, not the loads. So this version does
 * ~1.3 a weight: codes to exact f16 pairs (mma.cuh: PRMT + HSUB2 for int8,
 * LOP3 + HSUB2 / HFMA2 for int4) and mma.sync m16n8k16 on 16 rows at a time
 * by the one token in the B operand's first column (the other seven are
 * zeros). Measured (call D): W8A16 71.5 us a layer chained against 73.0 on
 * qgemm.cu's kernel, INT4 85.4 against 58.5; in the engine at batch 1
 * slower for both (1.31x / 1.19x bf16, call D; the default kernels 1.48x /
 * 1.64x in call E). Its limits, as measured and reasoned: 4 consumer warps
 * a CTA and 2 CTAs an SM (the stages and the token's f16 copy fill shared
 * memory; 160 registers a thread — the token kept in registers, the
 * producer warp's included — cap it there as well) leave the mma and
 * shared-load latencies exposed; the token's scaling into f16 is repeated
 * by every CTA (one round trip and two CTA barriers before the first
 * mma); with 64 rows a CTA and 256-byte copies (call C) the stream fell to
 * ~0.9 TB/s even without arithmetic — small bulk copies are expensive.
 * The next attempt: 2-D tensor-map copies (one instruction a stage), more
 * consumer warps, the token prepared once per matrix.
 *
 * Structure: a producer thread keeps LC_QT_ST stages of the CTA's 16 rows
 * (2 KB of each) in flight; the first are requested before lc_pdl_wait()
 * (nothing writes weights, so they stream while the kernel before
 * finishes). 4 consumer warps scale the token by a power of two into f16 in
 * shared memory (qmma.cu's prep: exact for every bf16 value down to 2^-29
 * of the row's max; INT4 also the 128-column sums for the group bias, the
 * columns in its decode's order), then take a stage's units (W8A16: 64
 * columns; INT4: one group's 128-column windows) in turn, each into its own
 * sums, which meet in shared memory at the end in warp order.
 *
 * Fragments (the operand-order trick of qgemv_tc.cu / qmma.cu): per window
 * lane (g, t) loads bytes [16 t, 16 t + 16) of the window in rows g and
 * g + 8 and uses them as its A registers in a k order of its own; lanes
 * 0..3 (g = 0: B's column 0) read the token at the same physical columns,
 * every other lane gives zeros. Column 0 of D — the row sums — lands in
 * lanes t = 0. Rows lie LC_QT_RS = 2112 bytes apart, so the 8 lanes of a
 * 16-byte shared load phase (rows g, g + 1; t = 0..3) hit 8 different
 * 4-bank groups.
 *
 * Accuracy: exact products (8-bit / 4-bit codes x f16 activations) summed
 * in fp32 — qmma.cu's arithmetic; not the CUDA-core kernel's order, so the
 * batch-invariant mode (every M the same bits) never uses it.
 *
 * Contract (lc_qgemv_bulk_ok): sm_90 (the only code built); 16-byte aligned codes and scales;
 * W8A16 K % 64; INT4 groups of 128 .. 2048 dividing 2048 and K % (2 group)
 * (every stage's scale pairs in whole 16-byte pieces); K <= 65536 (the
 * token's f16 copy in shared memory). Others go to qgemm.cu's kernel.
 */
#include "common.cuh"

#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "mma.cuh"
#include "qgemm.h"

#define LC_QT_WARPS 4                      /* consumer warps                  */
#define LC_QT_ROWS 16                      /* rows a CTA: one mma tile        */
#define LC_QT_SB 2048                      /* bytes of a row a stage          */
#define LC_QT_RS (LC_QT_SB + 64)           /* their stride in shared memory   */
#define LC_QT_ST 2                         /* stages in flight                */
#define LC_QT_THREADS ((LC_QT_WARPS + 1) * 32)
#define LC_QT_XC 16                        /* token chunks a thread keeps (K <= 16384) */

/* Shared memory: LC_QT_ST stages of [rows' codes | INT4: rows' scale pairs
 * (scb bytes each)], the token as f16 (K halves), INT4's 128-column sums,
 * the warps' partial row sums (and the token max), the mbarriers. */
struct lc_qt_layout {
    size_t stage, x16, xg, red, bar, bytes;
};
__host__ __device__ inline lc_qt_layout lc_qt_layout_of(int K, int scb, bool i4) {
    lc_qt_layout l;
    l.stage = (size_t)LC_QT_ROWS * (LC_QT_RS + scb);
    l.x16 = (size_t)LC_QT_ST * l.stage;
    l.xg = l.x16 + (size_t)K * 2;
    l.red = l.xg + (i4 ? (size_t)(K / 128) * 4 : 0);
    l.bar = (l.red + (LC_QT_WARPS * LC_QT_ROWS + LC_QT_WARPS) * 4 + 7) & ~(size_t)7;
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

/* The token into shared memory as f16 scaled by 2^e (max |x 2^e| in
 * [2^14, 2^15)); INT4: its columns in the decode's order (0,4)(1,5)(2,6)
 * (3,7) per 8 and xg, the sums of the scaled values per 128 columns.
 * Returns 2^-e. The 128 consumer threads; chunks kept in registers when K
 * allows (one round trip), else read twice. */
template <typename T, bool I4>
__device__ __forceinline__ float lc_qt_token(const T *__restrict__ x, int K, uint16_t *x16, float *xg, float *red,
                                             int tid) {
    constexpr int NT = LC_QT_WARPS * 32;
    const int lane = tid & 31, warp = tid >> 5;
    const bool keep = K <= NT * 8 * LC_QT_XC;
    float v[LC_QT_XC][8];
    float a = 0.0f;
    if (keep) {
#pragma unroll
        for (int c = 0; c < LC_QT_XC; c++) {
            const int k = (c * NT + tid) * 8;
            if (k < K) lc_unpack8<T>(lc_ldg16(x + k), v[c]);
        }
#pragma unroll
        for (int c = 0; c < LC_QT_XC; c++)
            if ((c * NT + tid) * 8 < K)
#pragma unroll
                for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(v[c][e]));
    } else {
        for (int k = tid * 8; k < K; k += NT * 8) {
            float w[8];
            lc_unpack8<T>(lc_ldg16(x + k), w);
#pragma unroll
            for (int e = 0; e < 8; e++) a = fmaxf(a, fabsf(w[e]));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (lane == 0) red[warp] = a;
    asm volatile("bar.sync 1, %0;" ::"n"(LC_QT_WARPS * 32) : "memory");
    a = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    const int e = lc_tok_exp(a);
    const float scale = lc_pow2(e);
    /* chunk c of this thread (w: its values, zeros past K) into x16 / xg;
     * whole warps through every call: INT4's 16-lane shuffle sums */
    auto emit = [&](int c, float *w) {
        const int k = (c * NT + tid) * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = k < K ? __half2float(__float2half_rn(w[i] * scale)) : 0.0f;
        if (k < K) *reinterpret_cast<uint4 *>(x16 + k) = lc_pack_h8<I4>(w);
        if constexpr (I4) {
            float s8 = ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) s8 += __shfl_xor_sync(0xffffffffu, s8, o);
            if ((lane & 15) == 0 && k < K) xg[k / 128] = s8;
        }
    };
    if (keep) {
#pragma unroll
        for (int c = 0; c < LC_QT_XC; c++) {
            if (c * NT * 8 >= K) break;
            emit(c, v[c]);
        }
    } else {
        for (int c = 0; c * NT * 8 < K; c++) {
            const int k = (c * NT + tid) * 8;
            float w[8];
            if (k < K) lc_unpack8<T>(lc_ldg16(x + k), w);
            emit(c, w);
        }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(LC_QT_WARPS * 32) : "memory");
    return lc_pow2(-e);
}

/* grid: one CTA per 16 rows. x (1, K) dt; wd (N, row bytes) codes; sc as
 * loom_cuda_qweight; y (1, N) dt or f32. scb: INT4's scale bytes a row and
 * stage. probe: skip the arithmetic (gpu_bench). The 4 consumer warps take
 * a stage's units (W8A16: 64-column windows; INT4: a group's windows) in
 * turn, each into its own sums; the sums meet in shared memory at the end,
 * in warp order. */
template <typename T, int FMT, bool F32>
__global__ void __launch_bounds__(LC_QT_THREADS)
    lc_qgemv_bulk_kernel(const T *__restrict__ x, const uint8_t *__restrict__ wd,
                         const float *__restrict__ sc, void *__restrict__ y, int N, int K, int group,
                         int scb, int probe) {
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    constexpr int WB = 64;            /* bytes of a row a window */
    constexpr int WK = I4 ? 128 : 64; /* columns a window        */
    extern __shared__ __align__(128) uint8_t sm[];
    const lc_qt_layout L = lc_qt_layout_of(K, scb, I4);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + L.bar);
    uint64_t *empty = full + LC_QT_ST;
    uint16_t *x16 = reinterpret_cast<uint16_t *>(sm + L.x16);
    float *xg = reinterpret_cast<float *>(sm + L.xg);
    float *red = reinterpret_cast<float *>(sm + L.red); /* [warp][row] partial sums, then 4 maxima */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = blockIdx.x * LC_QT_ROWS;
    const int rows = N - n0 < LC_QT_ROWS ? N - n0 : LC_QT_ROWS;
    const uint32_t row_bytes = I4 ? (uint32_t)K / 2 : (uint32_t)K;
    const int nst = (int)((row_bytes + LC_QT_SB - 1) / LC_QT_SB);
    const int groups = I4 ? K / group : 0;
    const int gps = I4 ? 2 * LC_QT_SB / group : 0; /* groups a whole stage */
    const int upw = I4 ? group / WK : 1;           /* windows a unit */
    auto data = [&](int s, int r) { return sm + (size_t)s * L.stage + (size_t)r * LC_QT_RS; };
    auto scal = [&](int s, int r) {
        return sm + (size_t)s * L.stage + (size_t)LC_QT_ROWS * LC_QT_RS + (size_t)r * scb;
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < LC_QT_ST; s++) lc_mbar_init(&full[s], 1), lc_mbar_init(&empty[s], LC_QT_WARPS);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == LC_QT_WARPS) { /* producer: one thread issues every copy */
        if (lane == 0) {
            uint64_t policy;
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
            const uint8_t *base = wd + (size_t)n0 * row_bytes;
            const uint8_t *sbase = reinterpret_cast<const uint8_t *>(sc) + (size_t)n0 * groups * 8;
            for (int j = 0; j < nst; j++) {
                const int s = j % LC_QT_ST;
                if (j >= LC_QT_ST) lc_mbar_wait(&empty[s], (uint32_t)((j / LC_QT_ST) - 1) & 1u);
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
        lc_pdl_trigger();
        return;
    }

    /* consumers: the token is the previous kernels' output */
    lc_pdl_wait();
    lc_pdl_trigger();
    const float inv = lc_qt_token<T, I4>(x, K, x16, xg, red + LC_QT_WARPS * LC_QT_ROWS, threadIdx.x);

    const int g = lane >> 2, t = lane & 3;
    float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float tot0 = 0.0f, tot1 = 0.0f; /* INT4: rows g and g + 8 (lanes t = 0) */
    for (int j = 0; j < nst; j++) {
        const int s = j % LC_QT_ST;
        lc_mbar_wait(&full[s], (uint32_t)(j / LC_QT_ST) & 1u);
        __syncwarp(); /* converged again before mma.sync.aligned */
        const uint32_t off = (uint32_t)j * LC_QT_SB;
        const int nw = (int)((row_bytes - off < LC_QT_SB ? row_bytes - off : LC_QT_SB) / WB);
        const uint8_t *ra = data(s, g), *rb = data(s, g + 8);
        for (int u = warp; u * upw < nw && !probe; u += LC_QT_WARPS) {
            for (int wi = u * upw; wi < (u + 1) * upw; wi++) {
                const uint4 wa = *reinterpret_cast<const uint4 *>(ra + wi * WB + t * 16);
                const uint4 wb = *reinterpret_cast<const uint4 *>(rb + wi * WB + t * 16);
                const int kw = (int)(off + wi * WB) * (I4 ? 2 : 1); /* the window's first column */
                const uint32_t aw[4] = {wa.x, wa.y, wa.z, wa.w}, bw[4] = {wb.x, wb.y, wb.z, wb.w};
                if constexpr (!I4) {
                    /* columns kw + 16 t + 4 i + (0..3) in mma i */
                    const uint4 x0 = *reinterpret_cast<const uint4 *>(x16 + kw + 16 * t);
                    const uint4 x1 = *reinterpret_cast<const uint4 *>(x16 + kw + 16 * t + 8);
                    const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        uint32_t a0, a1, a2, a3;
                        lc_i8x4_h2(aw[i], a0, a2);
                        lc_i8x4_h2(bw[i], a1, a3);
                        const uint32_t b0 = g == 0 ? xw[2 * i] : 0u, b1 = g == 0 ? xw[2 * i + 1] : 0u;
                        lc_mma_f16(i & 1 ? c1 : c0, a0, a1, a2, a3, b0, b1);
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
                        lc_mma_f16(c0, pa[0], pb[0], pa[1], pb[1], g == 0 ? xv.x : 0u, g == 0 ? xv.y : 0u);
                        lc_mma_f16(c1, pa[2], pb[2], pa[3], pb[3], g == 0 ? xv.z : 0u, g == 0 ? xv.w : 0u);
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
    if (t == 0) {
        red[warp * LC_QT_ROWS + g] = I4 ? tot0 : c0[0] + c1[0];
        red[warp * LC_QT_ROWS + g + 8] = I4 ? tot1 : c0[2] + c1[2];
    }
    asm volatile("bar.sync 1, %0;" ::"n"(LC_QT_WARPS * 32) : "memory");
    if (warp != 0 || lane >= LC_QT_ROWS) return;
    const int n = n0 + lane;
    if (n >= N) return;
    float v = ((red[lane] + red[LC_QT_ROWS + lane]) + (red[2 * LC_QT_ROWS + lane] + red[3 * LC_QT_ROWS + lane])) * inv;
    if constexpr (!I4) v *= sc[n];
    if (F32) static_cast<float *>(y)[n] = v;
    else static_cast<T *>(y)[n] = lc_from_f<T>(v);
}

/* ------------------------------------------------------------- dispatch */

static std::atomic<int> lc_qb_override{-1};
static std::atomic<long> lc_qb_launches{0};
/* gpu_bench's probe: the consumers skip the arithmetic (wrong results), so
 * the weight stream's own rate is read */
static std::atomic<int> lc_qb_probe{0};
/* off unless the environment says LOOM_CUDA_QGEMV_BULK=1 (or on / true /
 * yes): measured slower than qgemm.cu's kernel (see the top of the file) */
static bool lc_qb_env_on() {
    static const bool on = lc_env_bool("LOOM_CUDA_QGEMV_BULK", false);
    return on;
}
extern "C" void lc_qgemv_bulk_set(int on) { lc_qb_override = on < 0 ? -1 : on ? 1 : 0; }
extern "C" int lc_qgemv_bulk_get(void) { return lc_qb_override; }
extern "C" long lc_qgemv_bulk_count(void) { return lc_qb_launches; }
extern "C" void lc_qgemv_bulk_set_probe(int on) { lc_qb_probe = on ? 1 : 0; }

extern "C" int lc_qgemv_bulk_ok(const loom_cuda_qweight *w) {
    const int o = lc_qb_override;
    if (!(o < 0 ? lc_qb_env_on() : o == 1)) return 0;
    if (w->N <= 0 || w->K <= 0 || w->K > 65536 || ((uintptr_t)w->data & 15) || ((uintptr_t)w->scales & 15))
        return 0;
    if (w->fmt == LOOM_CUDA_Q_INT8_W8A16) {
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

template <typename T, int FMT, bool F32>
static cudaError_t lc_qb_launch(const loom_cuda_qweight *w, const void *x, void *y, cudaStream_t s) {
    static unsigned long long done = 0;
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    const int scb = I4 ? 2 * LC_QT_SB / w->group * 8 : 0; /* the pairs of a stage's 4096 columns */
    const size_t smem = lc_qt_layout_of(w->K, scb, I4).bytes;
    /* the attribute once, for the largest a launch can ask (K = 65536) */
    const size_t smax = lc_qt_layout_of(65536, I4 ? 2 * LC_QT_SB / 128 * 8 : 0, I4).bytes;
    if (smem > 227 * 1024) return cudaErrorInvalidValue;
    cudaError_t e = lc_smem_limit(&done, (const void *)lc_qgemv_bulk_kernel<T, FMT, F32>,
                                  smax < 227 * 1024 ? smax : 227 * 1024);
    if (e != cudaSuccess) return e;
    const unsigned grid = (unsigned)((w->N + LC_QT_ROWS - 1) / LC_QT_ROWS);
    return lc_launch(lc_qgemv_bulk_kernel<T, FMT, F32>, dim3(grid), dim3(LC_QT_THREADS), smem, s,
                     static_cast<const T *>(x), static_cast<const uint8_t *>(w->data), w->scales, y, w->N,
                     w->K, w->group, scb, (int)lc_qb_probe);
}

template <typename T, bool F32>
static cudaError_t lc_qb_fmt(const loom_cuda_qweight *w, const void *x, void *y, cudaStream_t s) {
    return w->fmt == LOOM_CUDA_Q_INT4 ? lc_qb_launch<T, LOOM_CUDA_Q_INT4, F32>(w, x, y, s)
                                      : lc_qb_launch<T, LOOM_CUDA_Q_INT8_W8A16, F32>(w, x, y, s);
}

extern "C" cudaError_t lc_qgemv_bulk(loom_cuda_dt dt, int out_f32, const loom_cuda_qweight *w,
                                     const void *x, void *y, cudaStream_t s) {
    if (!lc_qgemv_bulk_ok(w)) return cudaErrorInvalidValue;
    cudaError_t e;
    if (dt == LOOM_CUDA_F16)
        e = out_f32 ? lc_qb_fmt<__half, true>(w, x, y, s) : lc_qb_fmt<__half, false>(w, x, y, s);
    else
        e = out_f32 ? lc_qb_fmt<__nv_bfloat16, true>(w, x, y, s) : lc_qb_fmt<__nv_bfloat16, false>(w, x, y, s);
    if (e == cudaSuccess) lc_qb_launches++;
    return e;
}
