/*
 * kernels/cuda/qtiled_row.cu — one token through an INT4 weight in the
 * tiled layout (qtiled.cu's top comment): batch-1 decode, where the weight
 * stream is the whole cost.
 *
 * Why not qtiled.cu's kernel at one row: it stages every weight vector
 * through shared memory (cp.async, a CTA barrier a stage) in CTAs of 128
 * rows, so an SM holds 1-2 CTAs of 4 warps, and the short matrices (QKV, O,
 * down) split K over CTAs into a second, reducing launch; at one row it
 * streamed ~1.9 TB/s on an H200 where the row-major GEMV reached 2.5.
 * Here each lane loads its 16-byte vectors straight into registers, three
 * ahead (the first round before the launch wait: the weights do not depend
 * on the kernel before), and a CTA of R x KW warps owns R row tiles, KW
 * warps splitting each one's K; the KW partial sums meet in shared memory
 * in a fixed order: no second launch, and the split depends on N and K
 * only (lc_qr_kw).
 *
 * The token is staged once per CTA into shared memory in B-fragment order
 * (lane t's 8 words of a warp tile contiguous), so a vector's B operand is
 * two 16-byte shared loads a lane, the same address for the 8 lanes of a
 * t. Every lane supplies the token as its column, so the 8 columns of the
 * mma's C are the same dot; lanes t = 0 keep rows g and g + 8.
 *
 * The raw decode (qtiled.cuh lc_qt_raw4, one LOP3 per two weights): the
 * mma sums (M + q) x over a group; at the group's end, or the warp's
 * range's, acc += s d + (b' - (M + 8) s) X with X the token's sum over the
 * same columns, summed per 64-column warp tile at staging.
 *
 * PAIR: the rows in pairs (n, n + P) (epilogue.cuh) — a CTA's first R / 2
 * row tiles and their partners P / 16 tiles on — and the pair epilogue on
 * the sums: the bits of this kernel without it followed by the separate
 * kernel (PAIR changes which warps share a CTA, not the split).
 *
 * Not in batch-invariant mode: there qtiled.cu's kernel gives a row the
 * bits it has at every M. Not W8A16: the same design (its exact codes, the
 * row scale after the sum) measured slower than qtiled.cu's path on an H100
 * (one decode layer 108.8 vs 106.8 us, its down projection alone 37.3 vs
 * 31.3 us: twice INT4's vectors a warp at K = 14336 with 16 warps an SM;
 * bench/results/h100-llama3-8b-decode-layer.json, h100-quant-linears.json
 * gpu_bench_m1_printed).
 */
#include "common.cuh"
#include "epilogue.cuh"
#include "gemv.h" /* lc_epi_count */
#include "mma.cuh"
#include "qgemm.h"
#include "qtiled.cuh"

#define LC_QR_WARPS 8             /* warps a CTA (16 for PAIR at KW = 8)        */
#define LC_QR_MAX_WARPS 16
#define LC_QR_CTAS 4              /* CTAs of 8 warps an SM (64 registers a thread) */
#define LC_QR_SMS 132             /* the split's SM count (H100 / H200)          */
#define LC_QR_MAX_SMEM (160 << 10) /* the token's bytes limit K (~80k columns) */

#define LC_QR_KC 64 /* columns of a warp tile (one lane vector) */
#define LC_QR_J 4   /* k16 steps of a warp tile */
/* vectors a lane has in flight: as many as 64 registers hold (LC_QR_CTAS
 * CTAs an SM) without spilling; an SM then has 32 warps' 48 KB in flight */
#define LC_QR_U 3

/* The shared word of token columns (c, c + 1), c even: warp tile c / KC,
 * lane t, the step within the tile, the fragment half (b0: 2t, 2t + 1; b1:
 * 8 on). */
__device__ __forceinline__ int lc_qr_slot(int c) {
    constexpr int J = LC_QR_J;
    const int s = c >> 4, r = c & 15, t = (r & 7) >> 1, h = r >> 3;
    return ((s / J) * 4 + t) * (2 * J) + 2 * (s % J) + h;
}

/* x (1, K) into shared memory in B-fragment order, and each warp tile's
 * sum in float (8 values a thread in order, then a butterfly over
 * the 8 threads of a tile: every thread runs every round). A thread's
 * LC_QR_XR chunks of a round are loaded before any is used: one L2 round
 * trip a round, not a chunk (K = 14336 at 256 threads: 7 chunks a thread). */
#define LC_QR_XR 4
template <typename T>
__device__ __forceinline__ void lc_qr_stage(const uint16_t *__restrict__ x, int K, uint32_t *xs, float *xt) {
    constexpr int J = LC_QR_J;
    const int nc = K / 8, tid = (int)threadIdx.x, nt = (int)blockDim.x;
    for (int base = 0; base < nc; base += LC_QR_XR * nt) {
        uint4 u[LC_QR_XR];
#pragma unroll
        for (int r = 0; r < LC_QR_XR; r++)
            if (base + r * nt + tid < nc) u[r] = lc_ldg16(x + (size_t)(base + r * nt + tid) * 8);
#pragma unroll
        for (int r = 0; r < LC_QR_XR; r++) {
            const int c8 = base + r * nt + tid;
            float sum = 0.0f;
            if (c8 < nc) {
                const int s0 = lc_qr_slot(c8 * 8); /* columns 2p on: lane t = p */
                xs[s0] = u[r].x, xs[s0 + 2 * J] = u[r].y, xs[s0 + 4 * J] = u[r].z, xs[s0 + 6 * J] = u[r].w;
                float f[8];
                lc_unpack8<T>(u[r], f);
#pragma unroll
                for (int e = 0; e < 8; e++) sum += f[e];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            if (c8 < nc && (tid & 7) == 0) xt[c8 >> 3] = sum;
        }
    }
}

/* grid: CTAs of R x KW warps (blockDim), R row tiles each (PAIR: R / 2
 * pairs of row tiles). Shared: the token (K / 2 words), its tile sums
 * (K / 64), the warps' partial sums (16 each). */
template <typename T, bool F32, bool PAIR>
__global__ void __launch_bounds__(PAIR ? LC_QR_MAX_WARPS * 32 : LC_QR_WARPS * 32, PAIR ? 2 : LC_QR_CTAS)
    lc_qtiled_row_kernel(const uint16_t *__restrict__ x, const uint8_t *__restrict__ wd,
                         const float *__restrict__ sc, void *__restrict__ y, int N, int K, int group, int KW, int P,
                         loom_cuda_epi epi) {
    constexpr int U = LC_QR_U;
    extern __shared__ __align__(16) uint32_t lc_qr_sm[];
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int R = (int)(blockDim.x >> 5) / KW, slot = warp / KW, kp = warp % KW;
    const int ntiles = N / 16, nv = K / LC_QR_KC;

    /* this warp's row tile and its share of K, in warp tiles [v0, v1) */
    int rt;
    bool live;
    if constexpr (PAIR) {
        const int Pt = P / 16, half = R / 2, i = (int)blockIdx.x * half + slot % half;
        live = i < ntiles / 2;
        rt = (i / Pt) * 2 * Pt + i % Pt + (slot >= half ? Pt : 0);
    } else {
        rt = (int)blockIdx.x * R + slot;
        live = rt < ntiles;
    }
    const int v0 = (int)((long long)nv * kp / KW), v1 = live ? (int)((long long)nv * (kp + 1) / KW) : v0;
    const uint8_t *wp = wd + (size_t)(live ? rt : 0) * nv * 512 + lane * 16;
    const int groups = K / group, vpg = group / LC_QR_KC;
    const uint32_t *sp = reinterpret_cast<const uint32_t *>(sc) + (size_t)(live ? rt : 0) * groups * 16 + g;

    /* the ring: vector v in slot (v - v0) % U; the (s, b') pairs of rows g
     * and g + 8 for the group being summed (pa, pb) and the next
     * one (na, nb), loaded a group ahead */
    uint4 ring[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (v0 + u < v1) ring[u] = __ldcs(reinterpret_cast<const uint4 *>(wp + (size_t)(v0 + u) * 512));
    int gi = v0 / vpg; /* the group being summed */
    uint32_t pa = 0, pb = 0, na = 0, nb = 0;
    auto pair = [&](int gr, uint32_t &a, uint32_t &b) {
        if (gr < groups && v0 < v1) a = __ldg(sp + (size_t)gr * 16), b = __ldg(sp + (size_t)gr * 16 + 8);
    };
    pair(gi, pa, pb), pair(gi + 1, na, nb);
    lc_pdl_trigger();
    lc_pdl_wait();

    uint32_t *xs = lc_qr_sm;
    float *xt = reinterpret_cast<float *>(xs + K / 2);
    float *part = xt + K / 64;
    lc_qr_stage<T>(x, K, xs, xt);
    __syncthreads();

    const uint4 *xs4 = reinterpret_cast<const uint4 *>(xs);
    constexpr float MAGF = std::is_same<T, __half>::value ? 1024.0f : 128.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xg = 0.0f;
    int cg = v0 % vpg; /* the consumed vector's place in its group */
    for (int vb = v0; vb < v1; vb += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int v = vb + u;
            if (v >= v1) break;
            const uint4 wv = ring[u];
            if (v + U < v1) ring[u] = __ldcs(reinterpret_cast<const uint4 *>(wp + (size_t)(v + U) * 512));
            uint32_t a[4];
            const uint4 b01 = xs4[(v * 4 + t) * 2], b23 = xs4[(v * 4 + t) * 2 + 1];
            lc_qt_raw4<T>(wv.x, a);
            lc_mma16816<T>(d, a, b01.x, b01.y);
            lc_qt_raw4<T>(wv.y, a);
            lc_mma16816<T>(d, a, b01.z, b01.w);
            lc_qt_raw4<T>(wv.z, a);
            lc_mma16816<T>(d, a, b23.x, b23.y);
            lc_qt_raw4<T>(wv.w, a);
            lc_mma16816<T>(d, a, b23.z, b23.w);
            xg += xt[v];
            if (++cg == vpg || v == v1 - 1) {
                /* b' = b + 8 s stored: b - M s = b' - (M + 8) s */
                const float sa = lc_qt_half_f<T>(pa & 0xFFFFu), sb = lc_qt_half_f<T>(pb & 0xFFFFu);
                const float ca = lc_qt_half_f<T>(pa >> 16) - (MAGF + 8.0f) * sa;
                const float cb = lc_qt_half_f<T>(pb >> 16) - (MAGF + 8.0f) * sb;
                acc[0] = fmaf(sa, d[0], fmaf(ca, xg, acc[0]));
                acc[2] = fmaf(sb, d[2], fmaf(cb, xg, acc[2]));
                d[0] = d[1] = d[2] = d[3] = 0.0f, xg = 0.0f, cg = 0;
                pa = na, pb = nb;
                pair(++gi + 1, na, nb);
            }
        }
    }
    if (t == 0) part[warp * 16 + g] = acc[0], part[warp * 16 + g + 8] = acc[2];
    __syncthreads();

    /* a row's sum: its KW warps' partial sums in order */
    auto row_sum = [&](int sl, int r) {
        float v = 0.0f;
        for (int k = 0; k < KW; k++) v += part[(sl * KW + k) * 16 + r];
        return v;
    };
    if constexpr (PAIR) {
        const int half = R / 2, sl = tid >> 4, r = tid & 15;
        const int i = (int)blockIdx.x * half + sl;
        if (tid < half * 16 && i < ntiles / 2) {
            lc_epi_pair<T>(epi, static_cast<T *>(y), i * 16 + r, P, row_sum(sl, r), row_sum(sl + half, r));
        }
    } else {
        const int sl = tid >> 4, r = tid & 15, tile = (int)blockIdx.x * R + sl;
        if (tid < R * 16 && tile < ntiles) {
            const int n = tile * 16 + r;
            const float v = row_sum(sl, r);
            if constexpr (F32) static_cast<float *>(y)[n] = v;
            else static_cast<T *>(y)[n] = lc_from_f<T>(v);
        }
    }
}

/* ------------------------------------------------------------- dispatch */

/* Warps splitting a row tile's K: doubled (up to 8) while the grid stays
 * one wave (LC_QR_CTAS CTAs of 8 warps an SM: a second, partial wave would
 * add a whole CTA's time; shared memory holds 4 of them up to K ~ 27k, 3
 * above, where the wave is an estimate) and each warp keeps >= 8 vectors
 * (Llama-3-8B: QKV, O and down 8, gate|up 2, the LM head 1). */
static int lc_qr_kw(const loom_cuda_qweight *w) {
    const long ntiles = w->N / 16;
    const int nv = w->K / LC_QR_KC;
    int kw = 1;
    while (kw < 8 && (ntiles * 2 * kw + LC_QR_WARPS - 1) / LC_QR_WARPS <= (long)LC_QR_CTAS * LC_QR_SMS &&
           nv / (2 * kw) >= 8)
        kw *= 2;
    return kw;
}

static size_t lc_qr_smem(const loom_cuda_qweight *w, int warps) {
    return (size_t)w->K * 2 + (size_t)w->K / LC_QR_KC * 4 + (size_t)warps * 16 * 4;
}

static long lc_qr_runs; /* __atomic builtins: launches may come from several threads */
extern "C" long lc_qtiled_row_count(void) { return __atomic_load_n(&lc_qr_runs, __ATOMIC_RELAXED); }

extern "C" int lc_qtiled_row_kw(const loom_cuda_qweight *w) {
    if (!lc_qtiled_ok(w) || w->fmt != LOOM_CUDA_Q_INT4 || w->layout != LOOM_CUDA_QLAYOUT_TILED ||
        lc_qr_smem(w, LC_QR_MAX_WARPS) > LC_QR_MAX_SMEM)
        return 0;
    return lc_qr_kw(w);
}

template <typename T, bool F32, bool PAIR>
static cudaError_t lc_qr_go(const loom_cuda_qweight *w, int kw, const void *x, void *y, int P,
                            const loom_cuda_epi *epi, cudaStream_t s) {
    static unsigned long long done = 0;
    const int r = PAIR && LC_QR_WARPS / kw < 2 ? 2 : LC_QR_WARPS / kw;
    const int per = PAIR ? r / 2 : r, units = PAIR ? w->N / 32 : w->N / 16;
    const size_t smem = lc_qr_smem(w, r * kw);
    const cudaError_t e = lc_smem_limit(&done, (const void *)lc_qtiled_row_kernel<T, F32, PAIR>, LC_QR_MAX_SMEM);
    if (e != cudaSuccess) return e;
    const loom_cuda_epi none = {};
    return lc_launch(lc_qtiled_row_kernel<T, F32, PAIR>, dim3((unsigned)((units + per - 1) / per)),
                     dim3((unsigned)(r * kw * 32)), smem, s, static_cast<const uint16_t *>(x),
                     static_cast<const uint8_t *>(w->data), (const float *)w->scales, y, w->N, w->K, w->group, kw, P,
                     epi ? *epi : none);
}

extern "C" cudaError_t lc_qtiled_row(loom_cuda_dt dt, int out_f32, const loom_cuda_qweight *w, const void *x,
                                     void *y, const loom_cuda_epi *epi, int *fused, cudaStream_t s) {
    const int kw = lc_qtiled_row_kw(w); /* (tile_dt is bf16 or f16) */
    if (!kw || dt != w->tile_dt) return cudaErrorNotSupported;
    /* the pair epilogue where the rows pair by whole row tiles */
    int P = epi && !out_f32 ? lc_epi_p(epi, w->N) : 0;
    if (P % 16) P = 0;
    cudaError_t e;
#define LC_QR_T(T)                                                                                              \
    (P ? lc_qr_go<T, false, true>(w, kw, x, y, P, epi, s)                                                       \
       : out_f32 ? lc_qr_go<T, true, false>(w, kw, x, y, 0, NULL, s)                                             \
                 : lc_qr_go<T, false, false>(w, kw, x, y, 0, NULL, s))
    e = dt == LOOM_CUDA_F16 ? LC_QR_T(__half) : LC_QR_T(__nv_bfloat16);
#undef LC_QR_T
    if (e != cudaSuccess) return e;
    __atomic_fetch_add(&lc_qr_runs, 1, __ATOMIC_RELAXED);
    if (P) {
        lc_epi_count();
        if (fused) *fused = 1;
    }
    return cudaSuccess;
}
