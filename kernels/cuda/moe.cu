/*
 * kernels/cuda/moe.cu — the mixture-of-experts FFN's kernels
 * (cuda_kernels.h, "Mixture of experts"): routing, grouping the
 * (token, expert) pairs by expert on the device, the experts' linear
 * layers as a grouped tensor-core GEMM or (few pairs) GEMVs that read only
 * the chosen experts, and the weighted combine with the shared expert.
 *
 * Nothing here synchronises with the host or sizes a launch from routed
 * data: every grid depends on the token count only, and the per-expert row
 * counts and tile lists live in device memory, so a step is capturable in
 * a CUDA graph. The grouped GEMM's grid has room for the most tiles any
 * routing of P pairs can need (loom_cuda_moe_max_tiles); tiles past the
 * routing's count exit at once.
 *
 * Pair p = t * K + j is token t's j-th choice (descending weight). The
 * grouped layout sorts pairs by expert: row i of the sorted activations is
 * pair perm[i], and pair p sits at row inv[p]; within an expert the order
 * is whatever the atomics gave, which changes nothing (every output row of
 * a GEMM depends only on its own input row) — the combine sums each
 * token's K rows in slot order, so results are deterministic.
 */
#include "cp_async.cuh"
#include "moe_tile.cuh"
#include "wgmma.cuh"

/* ------------------------------------------------------------- routing */

/* One warp per token: p = softmax(logits) over E in float32, its K largest
 * (ties to the lower expert) in descending order, divided by their sum when
 * `norm`; sel holds each choice as an expert of [e0, e0 + el) (this rank's,
 * numbered from 0) or -1 (another rank's). The probabilities live in
 * registers, E / 32 a lane. */
template <int PER>
__global__ void lc_moe_route_kernel(const float *__restrict__ logits, int T, int E, int K, int norm, int e0,
                                    int el, int32_t *__restrict__ sel, float *__restrict__ wt) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T) return;
    const float *lg = logits + (size_t)t * E;
    float p[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        p[i] = e < E ? lg[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        p[i] = lane + 32 * i < E ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int i = 0; i < PER; i++) p[i] = lane + 32 * i < E ? p[i] / sum : -1.0f;
    float ksum = 0.0f, mine = 0.0f;
    for (int j = 0; j < K; j++) {
        /* this lane's best (lowest expert among equals), then the warp's */
        float bv = -2.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (p[i] > bv) bv = p[i], be = lane + 32 * i;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (ov > bv || (ov == bv && oe < be)) bv = ov, be = oe;
        }
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (lane + 32 * i == be) p[i] = -1.0f; /* probabilities are >= 0: never again */
        be = be < E ? be : 0; /* NaN logits: no order; stay in bounds */
        ksum += bv;
        if (lane == j) mine = bv;
        if (lane == 0) sel[(size_t)t * K + j] = be >= e0 && be < e0 + el ? be - e0 : -1;
    }
    if (lane < K) wt[(size_t)t * K + lane] = norm ? mine / ksum : mine;
}

extern "C" cudaError_t loom_cuda_moe_route(const float *logits, int T, int E, int K, int norm, int e0, int el,
                                           int32_t *sel, float *wt, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (E < 1 || E > LOOM_CUDA_MOE_MAX_EXPERTS || K < 1 || K > E || K > 32 || e0 < 0 || el < 1 || e0 + el > E)
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)lc_ceil_div(T, 4)), block(128);
    if (E <= 32) return lc_launch(lc_moe_route_kernel<1>, grid, block, 0, s, logits, T, E, K, norm, e0, el, sel, wt);
    if (E <= 64) return lc_launch(lc_moe_route_kernel<2>, grid, block, 0, s, logits, T, E, K, norm, e0, el, sel, wt);
    if (E <= 128)
        return lc_launch(lc_moe_route_kernel<4>, grid, block, 0, s, logits, T, E, K, norm, e0, el, sel, wt);
    return lc_launch(lc_moe_route_kernel<8>, grid, block, 0, s, logits, T, E, K, norm, e0, el, sel, wt);
}

/* ------------------------------------------------------------ grouping */

static_assert(LC_MOE_BM == LOOM_CUDA_MOE_TILE_ROWS, "the mma.sync tiles are the list's 64-row tiles");

extern "C" int loom_cuda_moe_max_tiles(int P, int E, int tile_rows) {
    return (P + tile_rows - 1) / tile_rows + (E < P ? E : P);
}

/* One CTA: counts per expert (shared atomics), their exclusive scan into
 * off (E + 1), each pair's row (perm / inv), and the tile list: tile i is
 * (expert, first sorted row, rows) with tiles[0] = their count. A pair of
 * another rank's expert (sel < 0) gets no row: inv = -1. */
__global__ void __launch_bounds__(1024)
    lc_moe_group_kernel(const int32_t *__restrict__ sel, int P, int E, int bm, int32_t *__restrict__ off,
                        int32_t *__restrict__ perm, int32_t *__restrict__ inv, int32_t *__restrict__ tiles) {
    extern __shared__ int32_t sm[]; /* cnt (E), cur (E), toff (E + 1) */
    lc_pdl_trigger();
    lc_pdl_wait();
    int32_t *cnt = sm, *cur = sm + E, *toff = sm + 2 * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x)
        if (sel[p] >= 0) atomicAdd(&cnt[sel[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t o = 0, to = 0;
        for (int e = 0; e < E; e++) {
            cur[e] = o;
            toff[e] = to;
            off[e] = o;
            o += cnt[e];
            to += (cnt[e] + bm - 1) / bm;
        }
        off[E] = o;
        toff[E] = to;
        tiles[0] = to;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        if (sel[p] < 0) {
            inv[p] = -1;
            continue;
        }
        const int32_t i = atomicAdd(&cur[sel[p]], 1);
        perm[i] = p;
        inv[p] = i;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const int32_t r0 = cur[e] - cnt[e]; /* cur ended at the expert's end */
        for (int32_t k = toff[e]; k < toff[e + 1]; k++) {
            const int32_t r = r0 + (k - toff[e]) * bm;
            const int32_t n = r0 + cnt[e] - r;
            int32_t *tl = tiles + 1 + 3 * k;
            tl[0] = e, tl[1] = r, tl[2] = n < bm ? n : bm;
        }
    }
}

extern "C" cudaError_t loom_cuda_moe_group(const int32_t *sel, int P, int E, int tile_rows, int32_t *off,
                                           int32_t *perm, int32_t *inv, int32_t *tiles, cudaStream_t s) {
    if (P <= 0 || E < 1 || E > LOOM_CUDA_MOE_MAX_EXPERTS || tile_rows < 1) return cudaErrorInvalidValue;
    return lc_launch(lc_moe_group_kernel, dim3(1), dim3(1024), (size_t)(3 * E + 1) * sizeof(int32_t), s, sel, P, E,
                     tile_rows, off, perm, inv, tiles);
}

/* ------------------------------------ expert parallelism: all-to-all */

/* out[i] = v when 0 <= v < lim, else -1, v = sel[perm ? perm[i] : i] + add. */
__global__ void lc_moe_ids_kernel(const int32_t *__restrict__ sel, const int32_t *__restrict__ perm, int n,
                                  int add, int lim, int32_t *__restrict__ out) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int v = sel[perm ? perm[i] : i] + add;
    out[i] = v >= 0 && v < lim ? v : -1;
}

extern "C" cudaError_t loom_cuda_moe_ids(const int32_t *sel, const int32_t *perm, int n, int add, int lim,
                                         int32_t *out, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    return lc_launch(lc_moe_ids_kernel, dim3((unsigned)lc_ceil_div(n, 256)), dim3(256), 0, s, sel, perm, n, add,
                     lim, out);
}

/* Row i of out = row rows[i] / div of x (rows NULL: row i / div; rows[i]
 * < 0: zeros); 16-byte vectors, a CTA a row. */
__global__ void lc_moe_gather_kernel(const uint4 *__restrict__ x, const int32_t *__restrict__ rows, int div,
                                     int vecs, uint4 *__restrict__ out) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int i = blockIdx.x, r = rows ? rows[i] : i;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x)
        out[(size_t)i * vecs + v] = r < 0 ? make_uint4(0u, 0u, 0u, 0u) : x[(size_t)(r / div) * vecs + v];
}

/* cnt[d] = off[(d + 1) el] - off[d el], d < n: the pairs for each owner of
 * el experts. */
__global__ void lc_moe_owner_counts_kernel(const int32_t *__restrict__ off, int n, int el, int32_t *__restrict__ cnt) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d < n) cnt[d] = off[(d + 1) * el] - off[d * el];
}

extern "C" cudaError_t loom_cuda_moe_owner_counts(const int32_t *off, int n, int el, int32_t *cnt, cudaStream_t s) {
    if (n < 1 || el < 1) return cudaErrorInvalidValue;
    return lc_launch(lc_moe_owner_counts_kernel, dim3((unsigned)lc_ceil_div(n, 256)), dim3(256), 0, s, off, n, el,
                     cnt);
}

extern "C" cudaError_t loom_cuda_moe_gather(const void *x, const int32_t *rows, int div, int n, int H, void *out,
                                            cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (H % 8 || div < 1) return cudaErrorInvalidValue;
    return lc_launch(lc_moe_gather_kernel, dim3((unsigned)n), dim3(128), 0, s, (const uint4 *)x, rows, div, H / 8,
                     (uint4 *)out);
}

/* --------------------------------------------------------- grouped GEMM */

#define LC_MOE_STAGES 3 /* x 15 KB: the most that static shared memory (48 KB) holds */

/* y (P, N) sorted rows = x rows @ W_e^T per tile. Block (n tile, tile
 * slot): tile slot i < tiles[0] is (e, r0, n) of tiles[1 + 3i ..]; input
 * row of sorted row r: x[rows ? perm[r] / div : r]. 4 warps, 2 x 2, each
 * 32 x 64 of the 64 x 128 tile; K in steps of 32 through a ring of
 * LC_MOE_STAGES stages filled by cp.async (45 KB of static shared memory);
 * columns past K and rows past the tile read as zeros. */
template <typename T>
__global__ void __launch_bounds__(128)
    lc_moe_gemm_kernel(const T *__restrict__ x, const int32_t *__restrict__ perm, int div, const T *__restrict__ w,
                       const int32_t *__restrict__ tiles, int N, int K, T *__restrict__ y) {
    __shared__ __align__(16) lc_moe_stage<T> st[LC_MOE_STAGES];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int slot = blockIdx.y;
    if (slot >= tiles[0]) return;
    const int32_t e = tiles[1 + 3 * slot], r0 = tiles[2 + 3 * slot], nrows = tiles[3 + 3 * slot];
    const int n0 = blockIdx.x * LC_MOE_BN;
    const T *we = w + (size_t)e * N * K;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 64;
    /* loaders: A 64 rows x 4 chunks (2 per thread), B 128 rows x 4 chunks (4 per thread) */
    const T *arow[2];
    bool aok[2];
    int ar[2], ac[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = tid + 128 * i;
        ar[i] = c >> 2, ac[i] = (c & 3) * 8;
        aok[i] = ar[i] < nrows;
        const int32_t r = r0 + (aok[i] ? ar[i] : 0);
        arow[i] = x + (size_t)(perm ? perm[r] / div : r) * K;
    }
    const T *brow[4];
    bool bok[4];
    int br[4], bc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = tid + 128 * i;
        br[i] = c >> 2, bc[i] = (c & 3) * 8;
        bok[i] = n0 + br[i] < N;
        brow[i] = we + (size_t)(bok[i] ? n0 + br[i] : 0) * K;
    }
    auto load = [&](int s, int k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const bool ok = aok[i] && k0 + ac[i] < K;
            lc_cp16(&st[s].a[ar[i]][ac[i]], ok ? arow[i] + k0 + ac[i] : arow[i], ok);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool ok = bok[i] && k0 + bc[i] < K;
            lc_cp16(&st[s].b[br[i]][bc[i]], ok ? brow[i] + k0 + bc[i] : brow[i], ok);
        }
    };
    lc_moe_acc acc;
    lc_moe_acc_zero(acc);
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int nk = (K + LC_MOE_BK - 1) / LC_MOE_BK;
    /* the ring: stage kt + STAGES - 1 is copied while stage kt is multiplied;
     * a group is committed every step, empty past K, so wait<STAGES - 2>
     * always means "stage kt has landed" */
#pragma unroll
    for (int s = 0; s < LC_MOE_STAGES - 1; s++) {
        if (s < nk) load(s, s * LC_MOE_BK);
        lc_cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        lc_cp_wait<LC_MOE_STAGES - 2>();
        __syncthreads(); /* stage kt visible to all; stage kt - 1 free for refill */
        const int next = kt + LC_MOE_STAGES - 1;
        if (next < nk) load(next % LC_MOE_STAGES, next * LC_MOE_BK);
        lc_cp_commit();
        lc_moe_tile_step<T>(acc, st[kt % LC_MOE_STAGES], wm, wn, lane);
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wm + 16 * i + g + 8 * h;
            if (m >= nrows) continue;
            T *yr = y + (size_t)(r0 + m) * N;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int n = n0 + wn + 8 * j + c2;
                if (n < N) /* N % 8 == 0: n + 1 < N too */
                    *reinterpret_cast<uint32_t *>(yr + n) = lc_pack2<T>(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
        }
}

extern "C" cudaError_t loom_cuda_moe_gemm(loom_cuda_dt dt, const void *x, const int32_t *perm, int div,
                                          const void *w, const int32_t *tiles, int max_tiles, int N, int K,
                                          void *y, cudaStream_t s) {
    if (max_tiles <= 0) return cudaSuccess;
    if (N % 8 || K % 8 || max_tiles > 65535) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)lc_ceil_div(N, LC_MOE_BN), (unsigned)max_tiles);
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_moe_gemm_kernel<E>, grid, dim3(128), 0, s, (const E *)x, perm, div,
                                            (const E *)w, tiles, N, K, (E *)y));
    return e;
}

/* The same grouped GEMM on Hopper's warpgroup MMA: a CTA of two
 * warpgroups owns a tile of the list and 256 output columns — A (the
 * tile's tokens, each warp its 16 rows) by ldmatrix from padded rows, B
 * (the expert's weight rows, K-major) read by the tensor cores from shared
 * memory in the 128-byte swizzle (a row's 64 columns one 128-byte row, its
 * 16-byte chunk c at c ^ (row % 8)). Two tile heights (the list's):
 *   BM 64: both warpgroups the tile's 64 rows, each 128 of the columns
 *          (wgmma m64n128k16), a 5-stage ring of 41 KB stages;
 *   BM 128: each warpgroup 64 of the rows and all 256 columns (m64n256k16,
 *          128 accumulators a thread), a 4-stage ring of 50 KB stages — each
 *          weight chunk brought to shared memory feeds 128 rows instead of
 *          64, for steps whose experts have the rows to fill such tiles.
 * K in stages of 64 columns through a ring of ST stages, cp.async filling
 * ST - 2 ahead: a warpgroup waits for all but its latest wgmma after each
 * one, so the buffer refilled at the top of stage it (read by stage it -
 * 2) is free once the CTA has passed the barrier (qtiled.cu's wgmma path
 * does the same). */
#define LC_MOE_WG_BN 256
#define LC_MOE_WG_BK 64
#define LC_MOE_WG_LDA (LC_MOE_WG_BK + 8) /* 144-byte A rows: an ldmatrix's 8 rows on distinct banks */
template <int BM> struct lc_moe_wg_cfg {
    static constexpr int ST = BM == 64 ? 5 : 4;            /* ring stages                         */
    static constexpr int WN = BM == 64 ? 128 : 256;        /* columns a warpgroup                 */
    static constexpr int AB = BM * LC_MOE_WG_LDA * 2;      /* 9 / 18 KB: keeps B 1024-aligned     */
    static constexpr int STB = AB + LC_MOE_WG_BN * 128;    /* a stage: A, then B's 256 rows       */
    static constexpr size_t SMEM = (size_t)ST * STB + 1024; /* + alignment slack                  */
    static_assert(AB % 1024 == 0, "B's swizzle atoms are 1024-aligned");
    static_assert(SMEM <= 227 * 1024, "grouped wgmma GEMM: shared memory");
};

template <typename T, int BM>
__global__ void __launch_bounds__(256, 1)
    lc_moe_gemm_wg_kernel(const T *__restrict__ x, const int32_t *__restrict__ perm, int div, const T *__restrict__ w,
                          const int32_t *__restrict__ tiles, int N, int K, T *__restrict__ y) {
    typedef lc_moe_wg_cfg<BM> C;
    constexpr int ST = C::ST, D = ST - 2, WN = C::WN, AR = BM / 32;
    extern __shared__ __align__(16) uint8_t lc_mw_raw[]; /* aligned to 1024 below, at run time */
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(lc_mw_raw);
    uint8_t *sm = lc_mw_raw + ((1024u - (raw_s & 1023u)) & 1023u);
    const uint32_t sm_s = (uint32_t)__cvta_generic_to_shared(sm);
    lc_pdl_trigger();
    lc_pdl_wait();
    const int slot = blockIdx.y;
    if (slot >= tiles[0]) return;
    const int32_t e = tiles[1 + 3 * slot], r0 = tiles[2 + 3 * slot], nrows = tiles[3 + 3 * slot];
    const int n0 = blockIdx.x * LC_MOE_WG_BN;
    const T *we = w + (size_t)e * N * K;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    /* loaders: thread tid copies chunk tid % 8 (8 columns) of rows tid / 8 + 32 i:
     * A's BM rows BM / 32 a thread, B's 256 eight */
    const int ch = tid & 7, rl = tid >> 3;
    const T *arow[AR];
    bool aok[AR];
#pragma unroll
    for (int i = 0; i < AR; i++) {
        const int r = rl + 32 * i;
        aok[i] = r < nrows;
        const int32_t sr = r0 + (aok[i] ? r : 0);
        arow[i] = x + (size_t)(perm ? perm[sr] / div : sr) * K + ch * 8;
    }
    const T *brow[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int n = n0 + rl + 32 * i;
        brow[i] = n < N ? we + (size_t)n * K + ch * 8 : nullptr;
    }
    /* rl % 8 is each of a thread's B rows' place in its swizzle atom */
    const uint32_t b_dst = (uint32_t)(rl * 128 + ((ch ^ (rl & 7)) << 4));
    auto load = [&](int b, int k0) {
        uint8_t *st = sm + (size_t)b * C::STB;
        const bool kin = k0 + ch * 8 < K;
#pragma unroll
        for (int i = 0; i < AR; i++) {
            const bool ok = aok[i] && kin;
            lc_cp16(st + ((rl + 32 * i) * LC_MOE_WG_LDA + ch * 8) * 2, ok ? arow[i] + k0 : x, ok);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const bool ok = brow[i] && kin;
            lc_cp16(st + C::AB + b_dst + i * 32 * 128, ok ? brow[i] + k0 : we, ok);
        }
    };
    const int nk = (K + LC_MOE_WG_BK - 1) / LC_MOE_WG_BK;
#pragma unroll
    for (int i = 0; i < D; i++) {
        if (i < nk) load(i, i * LC_MOE_WG_BK);
        lc_cp_commit();
    }
    float acc[WN / 2];
#pragma unroll
    for (int i = 0; i < WN / 2; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < WN / 2; i++) lc_wg_reg_fence(acc[i]);
    /* the warpgroup's rows (BM 128: its own 64) and its B columns (BM 64: its 128) */
    const int m_wg = BM == 64 ? 0 : wg * 64;
    const uint32_t b_wg = BM == 64 ? (uint32_t)(wg * 128 * 128) : 0u;
    const int ar = m_wg + wq * 16 + (lane & 15), ac = (lane >> 4) * 8;
    for (int it = 0; it < nk; it++) {
        lc_cp_wait<D - 1>();
        lc_wg_proxy_fence(); /* the landed weights, for wgmma's reads */
        __syncthreads();
        {
            const int nx = it + D;
            if (nx < nk) load(nx % ST, nx * LC_MOE_WG_BK);
            lc_cp_commit();
        }
        const int b = it % ST;
        const T *as = reinterpret_cast<const T *>(sm + (size_t)b * C::STB);
        const uint32_t bs = sm_s + (uint32_t)(b * C::STB + C::AB) + b_wg;
#pragma unroll
        for (int q = 0; q < LC_MOE_WG_BK / 16; q++) {
            uint32_t a[4];
            lc_ldsm4(as + ar * LC_MOE_WG_LDA + q * 16 + ac, a[0], a[1], a[2], a[3]);
            lc_wg_fence();
            lc_wgmma<T, WN>::mma(acc, a, lc_wg_desc_sw128(bs + (uint32_t)(q * 32)));
            lc_wg_commit();
            lc_wg_wait<1>();
        }
    }
    lc_wg_wait<0>();
#pragma unroll
    for (int i = 0; i < WN / 2; i++) lc_wg_reg_fence(acc[i]);
    lc_cp_wait<0>(); /* no copy may land after the CTA has gone */
    /* accumulators: rows wq 16 + g, + 8 of the warpgroup's; columns 8 i + 2 t, + 1 of its WN */
    const int g = lane >> 2, c2 = (lane & 3) * 2, nb = n0 + (BM == 64 ? wg * 128 : 0);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = m_wg + wq * 16 + g + 8 * h;
        if (m >= nrows) continue;
        T *yr = y + (size_t)(r0 + m) * N;
#pragma unroll
        for (int i = 0; i < WN / 8; i++) {
            const int n = nb + 8 * i + c2;
            if (n < N) /* N % 8 == 0: n + 1 < N too */
                *reinterpret_cast<uint32_t *>(yr + n) = lc_pack2<T>(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        }
    }
}

template <typename T, int BM> static cudaError_t lc_moe_gemm_wg_prepare() {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_moe_gemm_wg_kernel<T, BM>, lc_moe_wg_cfg<BM>::SMEM);
}

template <typename T, int BM>
static cudaError_t lc_moe_gemm_wg_launch(dim3 grid, const void *x, const int32_t *perm, int div, const void *w,
                                         const int32_t *tiles, int N, int K, void *y, cudaStream_t s) {
    cudaError_t e = lc_moe_gemm_wg_prepare<T, BM>();
    if (e != cudaSuccess) return e;
    return lc_launch(lc_moe_gemm_wg_kernel<T, BM>, grid, dim3(256), lc_moe_wg_cfg<BM>::SMEM, s, (const T *)x, perm,
                     div, (const T *)w, tiles, N, K, (T *)y);
}

extern "C" cudaError_t loom_cuda_moe_gemm_wg(loom_cuda_dt dt, const void *x, const int32_t *perm, int div,
                                             const void *w, const int32_t *tiles, int max_tiles, int tile_rows,
                                             int N, int K, void *y, cudaStream_t s) {
    if (max_tiles <= 0) return cudaSuccess;
    if (N % 8 || K % 8 || max_tiles > 65535 || (tile_rows != 64 && tile_rows != 128)) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)lc_ceil_div(N, LC_MOE_WG_BN), (unsigned)max_tiles);
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = tile_rows == 64
                                      ? lc_moe_gemm_wg_launch<E, 64>(grid, x, perm, div, w, tiles, N, K, y, s)
                                      : lc_moe_gemm_wg_launch<E, 128>(grid, x, perm, div, w, tiles, N, K, y, s));
    return e;
}

/* ---------------------------------------------------------------- GEMVs */

#define LC_MOE_GEMV_WARPS 4

/* y (P, N) = per pair p: x[p / div] @ W_{sel[p]}^T. A warp per output row,
 * lanes over K in 8-element chunks; blockIdx.y is the pair. Only the
 * chosen experts' rows are read; a pair of another rank's expert (sel < 0)
 * reads nothing and gets zeros. */
template <typename T>
__global__ void __launch_bounds__(LC_MOE_GEMV_WARPS * 32)
    lc_moe_gemv_kernel(const T *__restrict__ x, int div, const int32_t *__restrict__ sel, const T *__restrict__ w,
                       int N, int K, T *__restrict__ y) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31, p = blockIdx.y;
    const int n = blockIdx.x * LC_MOE_GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    if (sel[p] < 0) {
        if (lane == 0) y[(size_t)p * N + n] = lc_from_f<T>(0.0f);
        return;
    }
    const T *xr = x + (size_t)(p / div) * K;
    const T *wr = w + ((size_t)sel[p] * N + n) * K;
    float acc = 0.0f;
    int c = lane * 8;
    for (; c + 256 < K; c += 512) { /* two chunks in flight a lane */
        const uint4 w0 = lc_ldg16(wr + c), w1 = lc_ldg16(wr + c + 256);
        float xf[8], wf[8];
        lc_unpack8<T>(lc_ldg16(xr + c), xf);
        lc_unpack8<T>(w0, wf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(xf[i], wf[i], acc);
        lc_unpack8<T>(lc_ldg16(xr + c + 256), xf);
        lc_unpack8<T>(w1, wf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(xf[i], wf[i], acc);
    }
    if (c < K) {
        float xf[8], wf[8];
        lc_unpack8<T>(lc_ldg16(xr + c), xf);
        lc_unpack8<T>(lc_ldg16(wr + c), wf);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(xf[i], wf[i], acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[(size_t)p * N + n] = lc_from_f<T>(acc);
}

extern "C" cudaError_t loom_cuda_moe_gemv(loom_cuda_dt dt, const void *x, int div, const int32_t *sel,
                                          const void *w, int P, int N, int K, void *y, cudaStream_t s) {
    if (P <= 0) return cudaSuccess;
    if (K % 8 || div < 1 || div > 32768) return cudaErrorInvalidValue;
    const size_t elt = 2;
    /* the grid height holds 65535 pairs: launches of whole tokens' pairs */
    const int chunk = 32768 / div * div;
    for (int p0 = 0; p0 < P; p0 += chunk) {
        const int n = P - p0 < chunk ? P - p0 : chunk;
        const dim3 grid((unsigned)lc_ceil_div(N, LC_MOE_GEMV_WARPS), (unsigned)n);
        const uint8_t *xc = (const uint8_t *)x + (size_t)(p0 / div) * K * elt;
        uint8_t *yc = (uint8_t *)y + (size_t)p0 * N * elt;
        cudaError_t e;
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_moe_gemv_kernel<E>, grid, dim3(LC_MOE_GEMV_WARPS * 32), 0, s,
                                                (const E *)xc, div, sel + p0, (const E *)w, N, K, (E *)yc));
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------------- combine */

/* One CTA per token: g = sigmoid(xn[t] . sh_gate) when there is a shared
 * expert; r[t] = sum_j wt[t, j] y[row(t, j)] (+ g ysh[t]), in slot order,
 * leaving out the pairs without a sorted row (inv = -1: another rank's). */
template <typename T>
__global__ void __launch_bounds__(256)
    lc_moe_combine_kernel(T *__restrict__ r, const T *__restrict__ y, const int32_t *__restrict__ inv,
                          const float *__restrict__ wt, int K, int H, const T *__restrict__ ysh,
                          const T *__restrict__ xn, const float *__restrict__ sh_gate) {
    __shared__ float red[32];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int t = blockIdx.x;
    float g = 0.0f;
    if (ysh) {
        float d = 0.0f;
        for (int i = threadIdx.x; i < H; i += blockDim.x) d += lc_to_f(xn[(size_t)t * H + i]) * sh_gate[i];
        d = lc_block_sum(d, red);
        g = 1.0f / (1.0f + expf(-d));
    }
    for (int c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
        float o[8] = {0, 0, 0, 0, 0, 0, 0, 0}, v[8];
        for (int j = 0; j < K; j++) {
            const int p = t * K + j, row = inv ? inv[p] : p;
            if (row < 0) continue;
            const float a = wt[p];
            lc_unpack8<T>(lc_ldg16(y + (size_t)row * H + c), v);
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] += a * v[i];
        }
        if (ysh) {
            lc_unpack8<T>(lc_ldg16(ysh + (size_t)t * H + c), v);
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] += g * v[i];
        }
        lc_stg16(r + (size_t)t * H + c, lc_pack8<T>(o));
    }
}

extern "C" cudaError_t loom_cuda_moe_combine(loom_cuda_dt dt, void *r, const void *y, const int32_t *inv,
                                             const float *wt, int T, int K, int H, const void *ysh, const void *xn,
                                             const float *sh_gate, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (H % 8) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_moe_combine_kernel<E>, dim3((unsigned)T), dim3(256), 0, s, (E *)r,
                                            (const E *)y, inv, wt, K, H, (const E *)ysh, (const E *)xn, sh_gate));
    return e;
}

/* ------------------------------------------- fused GEMVs (few pairs) */

/* acc[r] += lane's share of x[r] . w[r] over K (8-element chunks strided
 * by the warp, two a lane in flight per row): R rows at once, so a lane has
 * 2R weight loads outstanding. */
template <typename T, int R>
__device__ __forceinline__ void lc_moe_dots(const T *const *x, const T *const *w, int K, int lane, float *acc) {
    int c = lane * 8;
    for (; c + 256 < K; c += 512) {
        uint4 wa[R], wb[R];
#pragma unroll
        for (int r = 0; r < R; r++) wa[r] = lc_ldg16(w[r] + c), wb[r] = lc_ldg16(w[r] + c + 256);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xf[8], wf[8];
            lc_unpack8<T>(lc_ldg16(x[r] + c), xf);
            lc_unpack8<T>(wa[r], wf);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r] = fmaf(xf[i], wf[i], acc[r]);
            lc_unpack8<T>(lc_ldg16(x[r] + c + 256), xf);
            lc_unpack8<T>(wb[r], wf);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r] = fmaf(xf[i], wf[i], acc[r]);
        }
    }
    if (c < K) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            float xf[8], wf[8];
            lc_unpack8<T>(lc_ldg16(x[r] + c), xf);
            lc_unpack8<T>(lc_ldg16(w[r] + c), wf);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r] = fmaf(xf[i], wf[i], acc[r]);
        }
    }
}

/* lc_moe_dots with U chunks a row issued before any is used (the last
 * round's beyond K not loaded): up to R U weight loads outstanding a
 * lane. Each row's chain runs over its chunks in ascending order, so the
 * sums are lc_moe_dots' bit for bit. The gate|up GEMV takes U = 4 (56
 * registers; Qwen3-30B-A3B batch-1 TPOT 1.7-2.2% lower on an H100); the
 * down GEMV + combine keeps lc_moe_dots, whose 62-64 registers leave it
 * four CTAs an SM (U = 2 here: 71, U = 3: 100). */
template <typename T, int R, int U>
__device__ __forceinline__ void lc_moe_dots_deep(const T *const *x, const T *const *w, int K, int lane, float *acc) {
    for (int c = lane * 8; c < K; c += 256 * U) {
        uint4 wv[R][U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (c + 256 * u < K) wv[r][u] = lc_ldg16(w[r] + c + 256 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (c + 256 * u < K) {
                    float xf[8], wf[8];
                    lc_unpack8<T>(lc_ldg16(x[r] + c + 256 * u), xf);
                    lc_unpack8<T>(wv[r][u], wf);
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r] = fmaf(xf[i], wf[i], acc[r]);
                }
    }
}

__device__ __forceinline__ float lc_moe_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* act[p, n] = silu(g) u, g / u = x[p / div] . rows n / I + n of W_{sel[p]}
 * (E, 2I, K): a warp per n, blockIdx.y the pair; zeros for a pair of
 * another rank's expert (sel < 0). */
template <typename T>
__global__ void __launch_bounds__(LC_MOE_GEMV_WARPS * 32)
    lc_moe_gemv_swiglu_kernel(const T *__restrict__ x, int div, const int32_t *__restrict__ sel,
                              const T *__restrict__ w, int I, int K, T *__restrict__ act) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31, p = blockIdx.y;
    const int n = blockIdx.x * LC_MOE_GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= I) return;
    if (sel[p] < 0) {
        if (lane == 0) act[(size_t)p * I + n] = lc_from_f<T>(0.0f);
        return;
    }
    const T *xr = x + (size_t)(p / div) * K;
    const T *wg = w + ((size_t)sel[p] * 2 * I + n) * K;
    const T *xs[2] = {xr, xr}, *ws[2] = {wg, wg + (size_t)I * K};
    float acc[2] = {0.0f, 0.0f};
    lc_moe_dots_deep<T, 2, 4>(xs, ws, K, lane, acc);
    const float g = lc_moe_warp_sum(acc[0]), u = lc_moe_warp_sum(acc[1]);
    if (lane == 0) act[(size_t)p * I + n] = lc_from_f<T>(lc_silu_mul(g, u));
}

extern "C" cudaError_t loom_cuda_moe_gemv_swiglu(loom_cuda_dt dt, const void *x, int div, const int32_t *sel,
                                                 const void *w, int P, int I, int K, void *act, cudaStream_t s) {
    if (P <= 0) return cudaSuccess;
    if (K % 8 || div < 1 || div > 32768) return cudaErrorInvalidValue;
    const int chunk = 32768 / div * div; /* the grid height holds 65535 pairs: whole tokens a launch */
    for (int p0 = 0; p0 < P; p0 += chunk) {
        const int n = P - p0 < chunk ? P - p0 : chunk;
        const dim3 grid((unsigned)lc_ceil_div(I, LC_MOE_GEMV_WARPS), (unsigned)n);
        const uint8_t *xc = (const uint8_t *)x + (size_t)(p0 / div) * K * 2;
        uint8_t *ac = (uint8_t *)act + (size_t)p0 * I * 2;
        cudaError_t e;
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_moe_gemv_swiglu_kernel<E>, grid, dim3(LC_MOE_GEMV_WARPS * 32), 0,
                                                s, (const E *)xc, div, sel + p0, (const E *)w, I, K, (E *)ac));
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* r[t, n] = sum_j wt[t K + j] (act[t K + j] . row n of W_{sel[t K + j]})
 * (W (E, H, I)) over the slots of this rank's experts (sel >= 0): the down
 * GEMVs and the combine in one. A CTA per
 * (LC_MOE_CMB_ROWS rows n, token t = blockIdx.y); its warp w takes row
 * w % ROWS and every (WARPS / ROWS)-th of the token's experts from w / ROWS,
 * up to four dots in flight, so one round of loads covers Qwen3-MoE's 8
 * experts of 768; the warps' sums meet in shared memory (a fixed order). */
#define LC_MOE_CMB_ROWS 4
#define LC_MOE_CMB_WARPS 8
template <typename T>
__global__ void __launch_bounds__(LC_MOE_CMB_WARPS * 32)
    lc_moe_gemv_combine_kernel(const T *__restrict__ act, const int32_t *__restrict__ sel,
                               const float *__restrict__ wt, const T *__restrict__ w, int Kx, int H, int I,
                               T *__restrict__ r) {
    __shared__ float red[LC_MOE_CMB_WARPS];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.y;
    const int n = blockIdx.x * LC_MOE_CMB_ROWS + warp % LC_MOE_CMB_ROWS;
    const int step = LC_MOE_CMB_WARPS / LC_MOE_CMB_ROWS, p0 = t * Kx, j0 = warp / LC_MOE_CMB_ROWS;
    float tot = 0.0f;
    if (n < H) {
        /* the warp's slots j0, j0 + step, ... whose expert is this rank's
         * (sel >= 0), taken in ascending order: 4, then 2, then 1 at once */
        const bool mine = lane < Kx && lane >= j0 && (lane - j0) % step == 0 && sel[p0 + lane] >= 0;
        unsigned m = __ballot_sync(0xffffffffu, mine);
        auto next = [&]() {
            const int j = __ffs((int)m) - 1;
            m &= m - 1;
            return p0 + j;
        };
        while (__popc(m) >= 4) {
            const T *xs[4], *ws[4];
            int p[4];
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                p[q] = next();
                xs[q] = act + (size_t)p[q] * I, ws[q] = w + ((size_t)sel[p[q]] * H + n) * I;
            }
            lc_moe_dots<T, 4>(xs, ws, I, lane, acc);
#pragma unroll
            for (int q = 0; q < 4; q++) tot += wt[p[q]] * acc[q];
        }
        if (__popc(m) >= 2) {
            const int pa = next(), pb = next();
            const T *xs[2] = {act + (size_t)pa * I, act + (size_t)pb * I};
            const T *ws[2] = {w + ((size_t)sel[pa] * H + n) * I, w + ((size_t)sel[pb] * H + n) * I};
            float acc[2] = {0.0f, 0.0f};
            lc_moe_dots<T, 2>(xs, ws, I, lane, acc);
            tot += wt[pa] * acc[0] + wt[pb] * acc[1];
        }
        if (m) {
            const int p = next();
            const T *xs[1] = {act + (size_t)p * I}, *ws[1] = {w + ((size_t)sel[p] * H + n) * I};
            float acc[1] = {0.0f};
            lc_moe_dots<T, 1>(xs, ws, I, lane, acc);
            tot += wt[p] * acc[0];
        }
    }
    tot = lc_moe_warp_sum(tot);
    if (lane == 0) red[warp] = tot;
    __syncthreads();
    const int nn = blockIdx.x * LC_MOE_CMB_ROWS + threadIdx.x;
    if (threadIdx.x < LC_MOE_CMB_ROWS && nn < H) {
        float sum = 0.0f;
        for (int q = threadIdx.x; q < LC_MOE_CMB_WARPS; q += LC_MOE_CMB_ROWS) sum += red[q];
        r[(size_t)t * H + nn] = lc_from_f<T>(sum);
    }
}

extern "C" cudaError_t loom_cuda_moe_gemv_combine(loom_cuda_dt dt, const void *act, const int32_t *sel,
                                                  const float *wt, const void *w, int T, int K, int H, int I,
                                                  void *r, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (I % 8 || K < 1 || K > 32) return cudaErrorInvalidValue; /* a warp's ballot holds the slots */
    for (int t0 = 0; t0 < T; t0 += 32768) {
        const int n = T - t0 < 32768 ? T - t0 : 32768;
        const dim3 grid((unsigned)lc_ceil_div(H, LC_MOE_CMB_ROWS), (unsigned)n);
        const size_t p0 = (size_t)t0 * K;
        cudaError_t e;
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_moe_gemv_combine_kernel<E>, grid, dim3(LC_MOE_CMB_WARPS * 32), 0,
                                                s, (const E *)act + p0 * I, sel + p0, wt + p0, (const E *)w, K, H,
                                                I, (E *)r + (size_t)t0 * H));
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
