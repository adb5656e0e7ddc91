/*
 * kernels/cuda/qtiled.cu — W8A16 and INT4 linear layers on weights repacked
 * once at load into a tensor-core tile layout ("tiled", Marlin's idea), one
 * kernel family for 1 .. LC_QT_MAX_M rows: lc_qtiled_pack (load time),
 * lc_qtiled (qgemm.c dispatches: mma.sync below wgmma_min_m rows, from
 * there the Hopper wgmma kernels further down), lc_qtiled_dequant (the
 * large-M path).
 *
 * Layout (loom_cuda_qweight.layout == LOOM_CUDA_QLAYOUT_TILED): the weight
 * (N, K) is cut into row tiles of 16 rows (N % 16 == 0); a row tile is K /
 * KC "warp tiles" of 16 rows x KC columns (INT4 KC = 64, int8 32), 512
 * bytes each, one 16-byte vector per lane, the tiles of one row tile
 * consecutive over K — the same bytes as the row-major matrix, permuted
 * within each 16-row block, so the repack replaces the codes in place of
 * size. Lane l = 4 g + t's vector holds exactly its A fragments of the
 * mma.sync m16n8k16 (the weight rows are the mma's M: at few tokens the
 * 8-wide N is the batch, nothing wasted at M <= 8) for J consecutive
 * k16 steps (INT4 4, int8 2): with p = 2t, 2t+1, 2t+8, 2t+9 the step's
 * columns a lane's fragment takes,
 *   INT4 word j (step j): nibble i (bits 4i..4i+3) and i + 4 (bits
 *        16+4i..) = a_i's two halves: i = 0 row g cols (2t, 2t+1), 1 row
 *        g+8 the same, 2 row g cols (2t+8, 2t+9), 3 row g+8 the same;
 *   int8 words 2j, 2j+1 (step j): bytes (row g: 2t, 2t+1; row g+8: 2t,
 *        2t+1), then the same at 2t+8, 2t+9.
 * So one 16-byte load per lane is the whole A operand of J mma k-steps, and
 * a warp's 512 bytes are contiguous. W8A16's scales stay as uploaded (f32
 * a row); INT4's {s, b} f32 pairs are rewritten in place as (s, b' = b +
 * 8 s) pairs in the activations' dt, the 16 rows of a row tile and group
 * together (64 bytes: four 16-byte copies bring a tile's group; half the
 * bytes of f32). The kernels take INT4 codes centred, w = (q - 8) s + b':
 * b' is small where the zero sits mid-range, so its rounding to dt costs
 * less than b's would (|b| up to 15 s).
 *
 * Kernel: a CTA owns 128 weight rows and up to 8 NT tokens (4 warps, 2 row
 * tiles each; from 64 tokens 8 warps, 4 over the rows x 2 over the
 * tokens); per stage of 128 columns cp.async brings the weight tiles, the
 * tokens' columns (straight from x, dt: no preparation kernel; rows past M
 * and tiles past N are not copied) and INT4's tile scales into shared
 * memory, 4 stages deep (3 at 128 tokens). A warp reads its vectors
 * (LDS.128), decodes them in registers — INT4: LOP3 into the mantissa of
 * 1024 (f16) / 128 (bf16), one subtraction (of the magic + 8) and one fma
 * with the group's (s, b'): w in dt, the precision class of the dequantize
 * + GEMM path; at up to 16 tokens ("raw") the mma takes the codes still
 * under the magic into per-group sums, a second mma with an all-ones A sums
 * the tokens over the group, and s d + (b' - (M + 8) s) X applies in fp32
 * at the group's end (one LOP3 per two weights: the stream, not the mma,
 * bounds those rows); int8: the exact code (f16: one PRMT and HSUB2 per two
 * weights; bf16: through fp32's 2^23), the row scale in fp32 at the end —
 * and multiplies them with the token tiles by mma.sync m16n8k16 in dt, B
 * fragments by ldmatrix from token rows padded to 272 bytes. Matrices with
 * few row tiles are split over K (grid z) into f32 partial sums that
 * lc_ksplit_reduce (mma.cuh) adds in slice order (results never depend on
 * timing; the split depends on N, K and M only; batch-invariant mode: the
 * split of one row and the fused decode at every M) — at one row with a
 * pair epilogue lc_ksplit_pair (epilogue.cuh), which finishes the pairs.
 *
 * Measured (H200, one Llama-3-8B layer's four linears, bench/results/
 * h200-quant-linears.json gpu_bench_mM), tiled vs row-major vs bf16, us:
 * INT4 1 row 73.6 / 73.6 / 132.2, 8 rows 74.3 / 193.2 / 193.8, 16 rows
 * 88.4 / 131.1 / 145.7, 64 rows 114.9 / 227.8 / 154.7, 256 rows 251.7 /
 * 550.4 / 213.1; W8A16 1 row 100.4 / 87.0, 16 rows 110.6 / 134.2, 64
 * rows 145.8 / 213.2. Up to 16 rows the mma.sync kernel is bound by the
 * instructions it issues (~3 a weight at 16 rows, 49% of DRAM peak on an
 * H100's gate|up: docs/performance.md), not by bytes; from 17 rows the
 * wgmma kernels (gate|up at 256 rows: INT4 114.4 us, ~525 TFLOP/s,
 * against cuBLASLt's bf16 101.8 us).
 *
 * Contract (lc_qtiled_ok): N % 16 == 0, K % 128 == 0, INT4 group % 64 == 0
 * dividing K; x rows 16-byte aligned (K % 8).
 */
#include <type_traits>

#include <cuda.h> /* CUtensorMap */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

#include "common.cuh"

#include "cp_async.cuh"
#include "epilogue.cuh"
#include "mma.cuh"
#include "qgemm.h"
#include "qtiled.cuh"
#include "wgmma.cuh"

#define LC_QT_WARPS 4
#define LC_QT_MT 2                        /* row tiles per warp       */
#define LC_QT_TILES (LC_QT_WARPS * LC_QT_MT) /* row tiles per CTA        */
#define LC_QT_ROWS (LC_QT_TILES * 16)      /* weight rows per CTA      */
#define LC_QT_KS 128                       /* columns per stage        */
#define LC_QT_SMS 132

template <int FMT> struct lc_qt {
    static constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    static constexpr int KC = I4 ? 64 : 32; /* columns per warp tile */
    static constexpr int V = LC_QT_KS / KC; /* warp tiles per row tile and stage */
    static constexpr int J = I4 ? 4 : 2;    /* k16 steps per warp tile */
};

template <int FMT, int NT> constexpr int lc_qt_stages() { return NT >= 16 ? 3 : 4; }
/* bytes of one stage: weights | tokens | INT4 scales (2 groups a row at most) */
template <int FMT> constexpr int lc_qt_wb() { return LC_QT_TILES * lc_qt<FMT>::V * 512; }
template <int FMT> constexpr int lc_qt_sb() { return lc_qt<FMT>::I4 ? LC_QT_TILES * 2 * 64 : 0; }
/* a staged token row: 128 columns and 16 bytes of padding (272 bytes: the 8
 * rows of an ldmatrix fall on 8 different 4-bank groups) */
#define LC_QT_XR 136
template <int FMT, int NT> constexpr int lc_qt_stb() {
    return lc_qt_wb<FMT>() + NT * 8 * LC_QT_XR * 2 + lc_qt_sb<FMT>();
}
template <int FMT, int NT> constexpr size_t lc_qt_smem() {
    return (size_t)lc_qt_stages<FMT, NT>() * lc_qt_stb<FMT, NT>();
}

/* An INT4 stage's first column, its group and the column where the next
 * group starts, stepped a stage at a time (group % 64 == 0: a stage of 128
 * columns crosses at most two boundaries) — no division in the loop. */
struct lc_qt_gcur {
    int col, g, next;
    __device__ __forceinline__ void init(int c, int group) {
        col = c, g = c / group, next = (g + 1) * group;
    }
    __device__ __forceinline__ void step(int group) {
        col += LC_QT_KS;
        if (col >= next) g++, next += group;
        if (col >= next) g++, next += group;
    }
    /* whether column c (inside the stage) lies past the stage's first group */
    __device__ __forceinline__ bool past_first(int c) const { return c >= next; }
    /* whether a group ends at column c (col < c <= col + LC_QT_KS) */
    __device__ __forceinline__ bool ends_at(int c, int group) const { return c == next || c == next + group; }
};

/* Warps along the tokens: from 64-token tiles a CTA has 8 warps, 4 over its
 * 128 rows times 2 over its tokens (each decodes its rows' weights for its
 * half of the tokens), so an SM keeps 8-16 warps issuing mma.sync. */
template <int NT> constexpr int lc_qt_wn() { return NT >= 8 ? 2 : 1; }
/* INT4 at up to 16 tokens ("raw"): the mma takes the codes as decoded under
 * the magic, M + q (M = 128 in bf16, 1024 in f16: one LOP3 per two weights,
 * no subtraction or scale per weight), into per-group partial sums; a second
 * mma with an all-ones A gives the tokens' sums over the group, X, and at
 * the group's end acc += s d + (b - M s) X in fp32, s and b the tile's dt
 * pairs — w = q s + b exactly as the fused decode, fewer instructions where
 * the weight stream, not the mma, bounds the time. */
/* (dispatch: at NT <= 2 outside batch-invariant mode, whose rows must have
 * the bits of one row at every M: there the fused decode at every NT) */

/* grid (CTA row blocks of 128, token tiles of 8 NT, K slices). Z == 1: y
 * (M, N) dt or f32; else part (Z, M, N) f32 without W8A16's row scale. */
template <typename T, int FMT, int NT, bool F32, bool RAWP>
__global__ void __launch_bounds__(LC_QT_WARPS * 32 * lc_qt_wn<NT>())
    lc_qtiled_kernel(const uint16_t *__restrict__ x, const uint8_t *__restrict__ wd,
                     const float *__restrict__ sc, void *__restrict__ y, float *__restrict__ part, int M, int N,
                     int K, int group) {
    typedef lc_qt<FMT> F;
    constexpr int TOK = 8 * NT, ST = lc_qt_stages<FMT, NT>(), WN = lc_qt_wn<NT>(), NTW = NT / WN;
    constexpr int NTHR = LC_QT_WARPS * 32 * WN;
    constexpr bool RAW = RAWP && FMT == LOOM_CUDA_Q_INT4;
    constexpr int WB = lc_qt_wb<FMT>(), XB = TOK * LC_QT_XR * 2, STB = lc_qt_stb<FMT, NT>();
    extern __shared__ __align__(16) uint8_t lc_qt_sm[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wr = warp % LC_QT_WARPS, wc = warp / LC_QT_WARPS; /* row group, token group */
    const int tile0 = blockIdx.x * LC_QT_TILES, ntiles = N / 16;
    const int m0 = blockIdx.y * TOK;
    const int S = K / LC_QT_KS, Z = (int)gridDim.z, z = (int)blockIdx.z;
    const int s_lo = (int)((long long)S * z / Z), s_hi = (int)((long long)S * (z + 1) / Z);
    const int nst = s_hi - s_lo;
    const size_t tile_bytes = (size_t)K / F::KC * 512;
    const int groups = F::I4 ? K / group : 1;

    /* Each thread's copies are fixed but for the stage, so their shared
     * addresses, source pointers and validity are set up once and the
     * pointers step a stage at a time (each copy's address one offset from
     * its stream's base; no division in the loop): weights, vector rem of
     * row tiles tl0, tl0 + TPK, ...; tokens, chunk c of rows r0, r0 +
     * NTHR / 16, ...; INT4's scales, 16 bytes of (row tile, group h) a
     * thread of the first 64. Row tiles past N and tokens past M are not
     * copied: their shared memory holds stale or undefined values that only
     * reach output rows / token columns never stored. */
    constexpr int VW = F::V * 32, TPK = NTHR / VW, CPW = LC_QT_TILES / TPK;
    const uint32_t sm0 = (uint32_t)__cvta_generic_to_shared(lc_qt_sm);
    const int w_tl0 = tid / VW;
    const size_t w_step = (size_t)TPK * tile_bytes;
    const uint8_t *w_src = wd + (size_t)(tile0 + w_tl0) * tile_bytes + (tid % VW) * 16 + (size_t)s_lo * VW * 16;
    unsigned w_ok = 0;
#pragma unroll
    for (int k = 0; k < CPW; k++)
        if (tile0 + w_tl0 + k * TPK < ntiles) w_ok |= 1u << k;
    constexpr int XPT = (TOK * 16 + NTHR - 1) / NTHR, XRS = NTHR / 16; /* copies a thread, rows apart */
    const int x_r0 = tid >> 4, x_c = tid & 15;
    const uint16_t *x_src = x + (size_t)(m0 + x_r0) * K + x_c * 8 + (size_t)s_lo * LC_QT_KS;
    unsigned x_ok = 0;
#pragma unroll
    for (int k = 0; k < XPT; k++)
        if (x_r0 + k * XRS < TOK && m0 + x_r0 + k * XRS < M) x_ok |= 1u << k;
    /* the tiles' (s, b) dt pairs of the stage's groups (at most two: group
     * % 64 == 0): 64 bytes a (row tile, group), four copies */
    const int s_h = (tid >> 2) & 1;
    const bool s_ok = F::I4 && tid < LC_QT_TILES * 2 * 4 && tile0 + (tid >> 3) < ntiles;
    const float *s_src = F::I4 ? sc + ((size_t)(tile0 + (tid >> 3)) * groups + s_h) * 16 + (tid & 3) * 4 : sc;
    lc_qt_gcur lg{}, cg{}; /* the loads' stage and the math's */
    if constexpr (F::I4) lg.init(s_lo * LC_QT_KS, group), cg = lg;
    auto load_w = [&](int b) {
        const uint32_t ws = sm0 + (uint32_t)(b * STB);
#pragma unroll
        for (int k = 0; k < CPW; k++)
            if (w_ok >> k & 1) lc_cp16s(ws + (uint32_t)((tid + k * NTHR) * 16), w_src + k * w_step);
        w_src += VW * 16;
        if constexpr (F::I4) {
            if (s_ok && lg.g + s_h < groups) lc_cp16s(ws + (uint32_t)(WB + XB + tid * 16), s_src + (size_t)lg.g * 16);
            lg.step(group);
        }
    };
    auto load_x = [&](int b) {
        const uint32_t xs = sm0 + (uint32_t)(b * STB + WB);
#pragma unroll
        for (int k = 0; k < XPT; k++)
            if (x_ok >> k & 1)
                lc_cp16s(xs + (uint32_t)(((x_r0 + k * XRS) * LC_QT_XR + x_c * 8) * 2), x_src + (size_t)k * XRS * K);
        x_src += LC_QT_KS;
    };

    /* the weights do not depend on the kernel before */
#pragma unroll
    for (int i = 0; i < ST - 1; i++)
        if (i < nst) load_w(i);
    lc_pdl_trigger();
    lc_pdl_wait();
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (i < nst) load_x(i);
        lc_cp_commit();
    }

    float acc[LC_QT_MT][NTW][4];
    /* RAW: the group's partial sums and the tokens' sums over it */
    float dg[RAW ? LC_QT_MT : 1][RAW ? NTW : 1][4], xg[RAW ? NTW : 1][4]; /* xg: rows g, g + 8 alike */
#pragma unroll
    for (int mt = 0; mt < LC_QT_MT; mt++)
#pragma unroll
        for (int j = 0; j < NTW; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;
    auto zero_group = [&]() {
        if constexpr (RAW) {
#pragma unroll
            for (int mt = 0; mt < LC_QT_MT; mt++)
#pragma unroll
                for (int j = 0; j < NTW; j++) dg[mt][j][0] = dg[mt][j][1] = dg[mt][j][2] = dg[mt][j][3] = 0.0f;
#pragma unroll
            for (int j = 0; j < NTW; j++) xg[j][0] = xg[j][1] = xg[j][2] = xg[j][3] = 0.0f;
        }
    };
    zero_group();
    /* where the mma of row tile mt, n-tile nt accumulates */
    auto sum_of = [&](int mt, int nt) -> float * {
        if constexpr (RAW) return dg[mt][nt];
        else return acc[mt][nt];
    };
    constexpr uint32_t ONES = std::is_same<T, __half>::value ? 0x3C003C00u : 0x3F803F80u;
    constexpr float MAGF = std::is_same<T, __half>::value ? 1024.0f : 128.0f;
    const uint32_t ones[4] = {ONES, ONES, ONES, ONES};

    /* ldmatrix lane roles: matrix mat = lane / 8 (x4: tokens +8 for mat >= 2,
     * columns +8 for odd mat), row lane % 8 */
    const int lm_mat = lane >> 3, lm_r = lane & 7;
    const int r_base = wc * NTW * 8; /* the warp's first token row in the tile */

    int read_buf = 0, fill_buf = ST - 1; /* the stage buffers read and refilled */
    for (int it = 0; it < nst; it++) {
        lc_cp_wait<ST - 2>();
        __syncthreads();
        if (it + ST - 1 < nst) {
            load_w(fill_buf);
            load_x(fill_buf);
        }
        lc_cp_commit();
        fill_buf = fill_buf == ST - 1 ? 0 : fill_buf + 1;
        const uint8_t *ws = lc_qt_sm + (size_t)read_buf * STB;
        read_buf = read_buf == ST - 1 ? 0 : read_buf + 1;
        const uint16_t *xs = reinterpret_cast<const uint16_t *>(ws + WB);
        const uint32_t *ss = reinterpret_cast<const uint32_t *>(ws + WB + XB);
#pragma unroll
        for (int v = 0; v < F::V; v++) {
            uint4 av[LC_QT_MT];
            uint32_t pa[LC_QT_MT], pb[LC_QT_MT], s2a[LC_QT_MT], b2a[LC_QT_MT], s2b[LC_QT_MT], b2b[LC_QT_MT];
            /* the vector's group past the stage's first (group >= KC) */
            const int h = F::I4 && v > 0 ? cg.past_first(cg.col + v * F::KC) : 0;
#pragma unroll
            for (int mt = 0; mt < LC_QT_MT; mt++) {
                const int tl = wr * LC_QT_MT + mt;
                av[mt] = *reinterpret_cast<const uint4 *>(ws + ((size_t)(tl * F::V + v) * 32 + lane) * 16);
                if constexpr (F::I4) {
                    pa[mt] = ss[(tl * 2 + h) * 16 + g], pb[mt] = ss[(tl * 2 + h) * 16 + g + 8];
                    if constexpr (!RAW) {
                        s2a[mt] = __byte_perm(pa[mt], 0, 0x1010), b2a[mt] = __byte_perm(pa[mt], 0, 0x3232);
                        s2b[mt] = __byte_perm(pb[mt], 0, 0x1010), b2b[mt] = __byte_perm(pb[mt], 0, 0x3232);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < F::J; j++) {
                uint32_t a[LC_QT_MT][4];
#pragma unroll
                for (int mt = 0; mt < LC_QT_MT; mt++) {
                    if constexpr (RAW) {
                        lc_qt_raw4<T>(lc_qt_word(av[mt], j), a[mt]);
                    } else if constexpr (F::I4) {
                        lc_qt_dec4<T>(lc_qt_word(av[mt], j), s2a[mt], b2a[mt], s2b[mt], b2b[mt], a[mt]);
                    } else {
                        lc_qt_dec8<T>(lc_qt_word(av[mt], 2 * j), a[mt][0], a[mt][1]);
                        lc_qt_dec8<T>(lc_qt_word(av[mt], 2 * j + 1), a[mt][2], a[mt][3]);
                    }
                }
                const int kc = (v * F::KC + 16 * j) >> 3; /* 16-byte chunk of the stage's columns */
                if constexpr (NTW == 1) {
                    const int r = r_base + lm_r, c = kc + (lm_mat & 1);
                    uint32_t b0, b1;
                    lc_ldsm2(xs + r * LC_QT_XR + c * 8, b0, b1);
                    if constexpr (RAW) lc_mma16816<T>(xg[0], ones, b0, b1);
#pragma unroll
                    for (int mt = 0; mt < LC_QT_MT; mt++) lc_mma16816<T>(sum_of(mt, 0), a[mt], b0, b1);
                } else {
#pragma unroll
                    for (int np = 0; np < NTW / 2; np++) {
                        const int r = r_base + np * 16 + (lm_mat >> 1) * 8 + lm_r, c = kc + (lm_mat & 1);
                        uint32_t b0, b1, b2, b3;
                        lc_ldsm4(xs + r * LC_QT_XR + c * 8, b0, b1, b2, b3);
                        if constexpr (RAW) {
                            lc_mma16816<T>(xg[2 * np], ones, b0, b1);
                            lc_mma16816<T>(xg[2 * np + 1], ones, b2, b3);
                        }
#pragma unroll
                        for (int mt = 0; mt < LC_QT_MT; mt++) {
                            lc_mma16816<T>(sum_of(mt, 2 * np), a[mt], b0, b1);
                            lc_mma16816<T>(sum_of(mt, 2 * np + 1), a[mt], b2, b3);
                        }
                    }
                }
            }
            if constexpr (RAW) {
                /* the group ends with this vector (group % 64 == 0), or the
                 * slice does: acc += s d + (b - M s) X, then a fresh group */
                if (cg.ends_at(cg.col + (v + 1) * F::KC, group) || (it == nst - 1 && v == F::V - 1)) {
#pragma unroll
                    for (int mt = 0; mt < LC_QT_MT; mt++) {
                        const float sa = lc_qt_half_f<T>(pa[mt] & 0xFFFFu), sb = lc_qt_half_f<T>(pb[mt] & 0xFFFFu);
                        /* b' = b + 8 s stored: b - M s = b' - (M + 8) s */
                        const float ca = lc_qt_half_f<T>(pa[mt] >> 16) - (MAGF + 8.0f) * sa;
                        const float cb = lc_qt_half_f<T>(pb[mt] >> 16) - (MAGF + 8.0f) * sb;
#pragma unroll
                        for (int nt = 0; nt < NTW; nt++) {
                            acc[mt][nt][0] = fmaf(sa, dg[mt][nt][0], fmaf(ca, xg[nt][0], acc[mt][nt][0]));
                            acc[mt][nt][1] = fmaf(sa, dg[mt][nt][1], fmaf(ca, xg[nt][1], acc[mt][nt][1]));
                            acc[mt][nt][2] = fmaf(sb, dg[mt][nt][2], fmaf(cb, xg[nt][0], acc[mt][nt][2]));
                            acc[mt][nt][3] = fmaf(sb, dg[mt][nt][3], fmaf(cb, xg[nt][1], acc[mt][nt][3]));
                        }
                    }
                    zero_group();
                }
            }
        }
        if constexpr (F::I4) cg.step(group);
    }
    lc_cp_wait<0>(); /* no copy may land after the CTA has gone */

    /* C: rows g, g + 8 of each row tile; tokens 2t, 2t + 1 of each n-tile */
#pragma unroll
    for (int mt = 0; mt < LC_QT_MT; mt++) {
        const int nb = (tile0 + wr * LC_QT_MT + mt) * 16;
        if (nb >= N) continue;
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int n = nb + g + (i >= 2 ? 8 : 0), m = m0 + (wc * NTW + nt) * 8 + 2 * t + (i & 1);
                if (m >= M) continue;
                const size_t o = (size_t)m * N + n;
                if (Z > 1) {
                    part[(size_t)z * M * N + o] = acc[mt][nt][i];
                    continue;
                }
                float val = acc[mt][nt][i];
                if constexpr (!F::I4) val *= __ldg(sc + n);
                if (F32) static_cast<float *>(y)[o] = val;
                else static_cast<T *>(y)[o] = lc_from_f<T>(val);
            }
    }
}


/* ------------------------------------------------- wgmma (Hopper) path */

/* From 17 rows (lc_qtiled's wgmma_min_m) a CTA of two warpgroups owns the
 * same 128 weight rows (warp w decodes row tile w exactly as above: the
 * tiled vectors are the A fragments of wgmma m64nNk16 too, each warp of a
 * warpgroup its 16 rows) and TOK = 32 .. 256 tokens, the wgmma's N: one
 * wgmma.mma_async a warpgroup and k16 step, A from the decoded registers,
 * B the stage's tokens in shared memory (K-major, the 128-byte swizzle: a
 * token's 64 columns one 128-byte row, its 16-byte chunk c at c ^ (token %
 * 8)), fp32 accumulators (TOK / 2 a thread). A stage is KS = 64 columns
 * (128 at 128 tokens); cp.async brings weights, tokens and INT4's tile
 * scales ST stages deep, D = ST - 2 ahead: a warpgroup waits for all but its
 * latest wgmma after each one (wait_group 1), so the buffer refilled at the
 * top of stage it — read by stage it - 2 — is free once the CTA passed the
 * barrier. INT4 decodes fused (w = (q - 8) s + b' in dt, as the mma.sync
 * path from 32 tokens); W8A16 the exact codes, the row scale at the end.
 * Not in batch-invariant mode (the mma.sync path's sums there). */
#define LC_QW_THREADS 256

/* columns a stage: 128 for the 128-row kernels' 128-token tiles, else 64
 * (the wide kernel: its registers hold two row tiles' stage vectors); CTAs
 * an SM: two 128-row CTAs at <= 64 tokens, else one (host and device both
 * size the work by these) */
constexpr int lc_qw_ks_of(int tok, int tl) { return tok == 128 && tl == LC_QT_TILES ? 128 : 64; }
constexpr int lc_qw_per_sm(int tok, int tl) { return tok <= 64 && tl == LC_QT_TILES ? 2 : 1; }
template <int TOK, int TL = LC_QT_TILES> constexpr int lc_qw_ks() { return lc_qw_ks_of(TOK, TL); }
/* TL row tiles a CTA: LC_QT_TILES (128 rows), or twice that in the wide
 * TMA kernel further down (256 rows, one CTA an SM whatever its tokens) */
template <int FMT, int TOK, int TL = LC_QT_TILES> constexpr int lc_qw_wb() {
    return TL * (lc_qw_ks<TOK, TL>() / lc_qt<FMT>::KC) * 512;
}
/* INT4: a (row tile, group) 64 bytes, KS / 64 groups a stage at most */
template <int FMT, int TOK, int TL = LC_QT_TILES> constexpr int lc_qw_sb() {
    return lc_qt<FMT>::I4 ? TL * (lc_qw_ks<TOK, TL>() / 64) * 64 : 0;
}
/* stage: tokens (TOK x KS, 1024-aligned swizzle atoms) | weights | scales */
template <int FMT, int TOK, int TL = LC_QT_TILES> constexpr int lc_qw_stb() {
    return (TOK * lc_qw_ks<TOK, TL>() * 2 + lc_qw_wb<FMT, TOK, TL>() + lc_qw_sb<FMT, TOK, TL>() + 1023) / 1024 * 1024;
}
/* stages: up to 6 in an SM's 220 KB shared by its CTAs */
template <int FMT, int TOK, int TL = LC_QT_TILES> constexpr int lc_qw_stages() {
    return 220 * 1024 / lc_qw_per_sm(TOK, TL) / lc_qw_stb<FMT, TOK, TL>() > 6
               ? 6
               : 220 * 1024 / lc_qw_per_sm(TOK, TL) / lc_qw_stb<FMT, TOK, TL>();
}
template <int FMT, int TOK, int TL = LC_QT_TILES> constexpr size_t lc_qw_smem() {
    return (size_t)lc_qw_stages<FMT, TOK, TL>() * lc_qw_stb<FMT, TOK, TL>() + 1024; /* + alignment slack */
}

/* Row tile j (< RT) of consumer warp `warp` within its CTA's TL tiles:
 * with one tile a warp, tile `warp`; with two (the wide kernel) warpgroup
 * h = warp / 4's wgmma j takes the 64 rows of tiles 8 h + 4 j .. + 3, one
 * a warp of the warpgroup. */
template <int RT> __device__ __forceinline__ int lc_qw_tile(int warp, int j) {
    return RT == 1 ? warp : (warp >> 2) * 8 + j * 4 + (warp & 3);
}

/* One stage of a consumer warp in the wgmma kernels: its RT row tiles'
 * weight vectors (and int4 scale pairs) from the stage in shared memory
 * (`st` generic, `st_s` its shared address; tokens at 0, weights at XB,
 * scales at XB + WB), decoded to A fragments a k step at a time, each
 * wgmma'd against the step's token columns into its tile's TOK / 2
 * accumulators (acc + j TOK / 2), the RT wgmmas of a step one commit
 * group; after the first step's wait_group 1 (every wgmma of the stage
 * before done) `after_first` runs. */
template <typename T, int FMT, int TOK, int RT, int TL, typename Fn>
__device__ __forceinline__ void lc_qw_stage(float *acc, const uint8_t *st, uint32_t st_s, int s_col, int group,
                                            int warp, int lane, Fn after_first) {
    typedef lc_qt<FMT> F;
    constexpr int KS = lc_qw_ks<TOK, TL>(), V = KS / F::KC, STEPS = KS / 16, NSL = KS / 64;
    constexpr int XB = TOK * KS * 2, WB = lc_qw_wb<FMT, TOK, TL>();
    const int g = lane >> 2;
    const uint8_t *ws = st + XB;
    const uint32_t *ss = reinterpret_cast<const uint32_t *>(ws + WB);
    const int g_st = F::I4 ? s_col / group : 0;
    uint4 av[RT][V];
    uint32_t s2a[RT][V], b2a[RT][V], s2b[RT][V], b2b[RT][V];
#pragma unroll
    for (int j = 0; j < RT; j++) {
        const int tl = lc_qw_tile<RT>(warp, j);
#pragma unroll
        for (int v = 0; v < V; v++) {
            av[j][v] = *reinterpret_cast<const uint4 *>(ws + ((size_t)(tl * V + v) * 32 + lane) * 16);
            if constexpr (F::I4) {
                const int h = (s_col + v * F::KC) / group - g_st;
                const uint32_t pa = ss[(tl * NSL + h) * 16 + g], pb = ss[(tl * NSL + h) * 16 + g + 8];
                s2a[j][v] = __byte_perm(pa, 0, 0x1010), b2a[j][v] = __byte_perm(pa, 0, 0x3232);
                s2b[j][v] = __byte_perm(pb, 0, 0x1010), b2b[j][v] = __byte_perm(pb, 0, 0x3232);
            }
        }
    }
#pragma unroll
    for (int q = 0; q < STEPS; q++) {
        const int v = q / F::J, jw = q % F::J;
        uint32_t a[RT][4];
#pragma unroll
        for (int j = 0; j < RT; j++) {
            if constexpr (F::I4) {
                lc_qt_dec4<T>(lc_qt_word(av[j][v], jw), s2a[j][v], b2a[j][v], s2b[j][v], b2b[j][v], a[j]);
            } else {
                lc_qt_dec8<T>(lc_qt_word(av[j][v], 2 * jw), a[j][0], a[j][1]);
                lc_qt_dec8<T>(lc_qt_word(av[j][v], 2 * jw + 1), a[j][2], a[j][3]);
            }
        }
        /* k step q: 64-column block q / 4, 32 bytes a step within its rows */
        const uint64_t desc = lc_wg_desc_sw128(st_s + (uint32_t)((q >> 2) * (TOK * 128) + (q & 3) * 32));
        lc_wg_fence();
#pragma unroll
        for (int j = 0; j < RT; j++) lc_wgmma<T, TOK>::mma(acc + j * (TOK / 2), a[j], desc);
        lc_wg_commit();
        lc_wg_wait<1>();
        if (q == 0) after_first();
    }
}

/* The accumulators of a consumer warp (rows nb + g, + 8 of its row tile;
 * tokens m0 + 8 i + 2 t, + 1) to y, scaled by W8A16's row scale, or to
 * its K slice's partial sums. */
template <typename T, int FMT, int TOK, bool F32>
__device__ __forceinline__ void lc_qw_store(const float *acc, const float *__restrict__ sc, void *__restrict__ y,
                                            float *__restrict__ part, int M, int N, int m0, int nb, int z, int Z,
                                            int lane) {
    typedef lc_qt<FMT> F;
    const int g = lane >> 2, t = lane & 3;
    if (nb >= N) return;
#pragma unroll
    for (int i = 0; i < TOK / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int n = nb + g + (e >= 2 ? 8 : 0), m = m0 + 8 * i + 2 * t + (e & 1);
            if (m >= M) continue;
            const size_t o = (size_t)m * N + n;
            if (Z > 1) {
                part[(size_t)z * M * N + o] = acc[4 * i + e];
                continue;
            }
            float val = acc[4 * i + e];
            if constexpr (!F::I4) val *= __ldg(sc + n);
            if (F32) static_cast<float *>(y)[o] = val;
            else static_cast<T *>(y)[o] = lc_from_f<T>(val);
        }
}

template <typename T, int FMT, int TOK, bool F32>
__global__ void __launch_bounds__(LC_QW_THREADS, 1)
    lc_qtiled_wg_kernel(const uint16_t *__restrict__ x, const uint8_t *__restrict__ wd, const float *__restrict__ sc,
                        void *__restrict__ y, float *__restrict__ part, int M, int N, int K, int group) {
    typedef lc_qt<FMT> F;
    constexpr int KS = lc_qw_ks<TOK>(), V = KS / F::KC, NSL = KS / 64;
    constexpr int XB = TOK * KS * 2, WB = lc_qw_wb<FMT, TOK>(), STB = lc_qw_stb<FMT, TOK>();
    constexpr int ST = lc_qw_stages<FMT, TOK>(), D = ST - 2;
    static_assert(ST >= 3, "wgmma path: too few stages");
    static_assert(lc_qw_smem<FMT, TOK>() <= 227 * 1024, "wgmma path: shared memory");
    extern __shared__ __align__(1024) uint8_t lc_qw_raw[];
    /* 1024-aligned (the swizzle atoms') */
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(lc_qw_raw);
    uint8_t *sm = lc_qw_raw + ((1024u - (raw_s & 1023u)) & 1023u);
    const uint32_t sm_s = (uint32_t)__cvta_generic_to_shared(sm);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tile0 = blockIdx.x * LC_QT_TILES, ntiles = N / 16;
    const int m0 = blockIdx.y * TOK;
    const int S = K / KS, Z = (int)gridDim.z, z = (int)blockIdx.z;
    const int s_lo = (int)((long long)S * z / Z), s_hi = (int)((long long)S * (z + 1) / Z);
    const int nst = s_hi - s_lo;
    const size_t tile_bytes = (size_t)K / F::KC * 512;
    const int groups = F::I4 ? K / group : 1;

    auto load_w = [&](int s, int b) {
        uint8_t *ws = sm + (size_t)b * STB + XB;
#pragma unroll
        for (int k = 0; k < V; k++) { /* 8 row tiles x V vectors of 512 bytes */
            const int i = tid + k * LC_QW_THREADS, tl = i / (V * 32), within = i % (V * 32);
            if (tile0 + tl < ntiles)
                lc_cp16(ws + (size_t)i * 16, wd + (size_t)(tile0 + tl) * tile_bytes + (size_t)s * V * 512 + within * 16,
                        true);
        }
        if constexpr (F::I4) {
            uint8_t *ss = ws + WB;
            const int g0 = (s * KS) / group;
            if (tid < LC_QT_TILES * NSL * 4) {
                const int tl = tid / (NSL * 4), h = (tid >> 2) % NSL, q = tid & 3, gt = tile0 + tl;
                if (gt < ntiles && g0 + h < groups)
                    lc_cp16(ss + tid * 16, sc + ((size_t)gt * groups + g0 + h) * 16 + q * 4, true);
            }
        }
    };
    constexpr int CPR = KS / 8, XPT = TOK * CPR / LC_QW_THREADS; /* 16-byte chunks a token row, a thread */
    static_assert(TOK * CPR % LC_QW_THREADS == 0, "token copies");
    auto load_x = [&](int s, int b) {
        uint8_t *xs = sm + (size_t)b * STB;
#pragma unroll
        for (int k = 0; k < XPT; k++) {
            const int i = tid + k * LC_QW_THREADS, r = i / CPR, c = i % CPR;
            if (m0 + r < M)
                lc_cp16(xs + (c >> 3) * (TOK * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4),
                        x + (size_t)(m0 + r) * K + (size_t)s * KS + c * 8, true);
        }
    };

#pragma unroll
    for (int i = 0; i < D; i++)
        if (i < nst) load_w(s_lo + i, i);
    lc_pdl_trigger();
    lc_pdl_wait();
#pragma unroll
    for (int i = 0; i < D; i++) {
        if (i < nst) load_x(s_lo + i, i);
        lc_cp_commit();
    }

    float acc[TOK / 2];
#pragma unroll
    for (int i = 0; i < TOK / 2; i++) acc[i] = 0.0f;

    for (int it = 0; it < nst; it++) {
        lc_cp_wait<D - 1>();
        lc_wg_proxy_fence(); /* the landed tokens, for wgmma's reads */
        __syncthreads();
        {
            const int nx = it + D;
            if (nx < nst) {
                load_w(s_lo + nx, nx % ST);
                load_x(s_lo + nx, nx % ST);
            }
            lc_cp_commit();
        }
        const int b = it % ST;
        lc_qw_stage<T, FMT, TOK, 1, LC_QT_TILES>(acc, sm + (size_t)b * STB, sm_s + (uint32_t)(b * STB),
                                                 (s_lo + it) * KS, group, warp, lane, [] {});
    }
    lc_wg_wait<0>();
#pragma unroll
    for (int i = 0; i < TOK / 2; i++) lc_wg_reg_fence(acc[i]);
    lc_cp_wait<0>(); /* no copy may land after the CTA has gone */
    lc_qw_store<T, FMT, TOK, F32>(acc, sc, y, part, M, N, m0, (tile0 + warp) * 16, z, Z, lane);
}


/* The same wgmma path with its copies by the tensor-memory accelerator:
 * one producer lane issues, per stage, three copies that complete on the
 * stage's `full` mbarrier — a box of the tiled weight's tensor map (the
 * stage's V warp tiles of every row tile of the CTA), one of INT4's scale
 * pairs (the stage's groups of every row tile) and the tokens' (a 64-column
 * block each: the map does the 128-byte swizzle), boxes past N or M read
 * as zeros — and the eight consumer warps wait for `full`, decode, run the
 * wgmmas and, once a stage's wgmmas are done (the wait_group 1 of the next
 * stage's first step), arrive on its `empty` barrier, which the producer
 * waits for before refilling it: ST stages in flight, no CTA barrier in
 * the loop, no copy instructions in the consumers. Every consumer thread
 * arrives on `empty` (count 256): behind a lane-0 branch ptxas serializes
 * every wgmma (C7513). (A bulk copy a row tile and a scale group, as
 * before the weight maps, made 17-33 copies a stage that ptxas issues one
 * at a time.)
 *
 * RT row tiles a consumer warp. RT = 1: 128 weight rows a CTA (a warp its
 * row tile), 8 + 1 warps. RT = 2, the wide kernel: 256 rows a CTA, so a
 * stage's token copy feeds twice the weight rows (at 64 rows the 128-row
 * CTAs' token bytes are ~4x INT4's weight bytes); two consumer warpgroups
 * own 128 rows each (lc_qw_tile<2>: two m64 wgmmas a k16 step, one commit
 * group, 2 x TOK / 2 accumulators a thread) — more than the 168 registers
 * a thread of 384 has, so the producer is a warpgroup (one warp of it
 * copies) that hands its registers over: setmaxnreg 40 producer, 232
 * consumer; 64-column stages, one CTA an SM. Both take tiles of at most
 * 128 tokens (256 would want more registers than a consumer has). */
template <int RT> constexpr int lc_qw_tma_threads() { return RT == 2 ? 384 : 288; }

template <typename T, int FMT, int TOK, bool F32, int RT>
__global__ void __launch_bounds__(lc_qw_tma_threads<RT>(), 1)
    lc_qtiled_tma_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                         const __grid_constant__ CUtensorMap smap, const float *__restrict__ sc, void *__restrict__ y,
                         float *__restrict__ part, int M, int N, int K, int group) {
    typedef lc_qt<FMT> F;
    constexpr int TL = RT * LC_QT_TILES, KS = lc_qw_ks<TOK, TL>(), V = KS / F::KC, SUB = KS / 64;
    constexpr int XB = TOK * KS * 2, WB = lc_qw_wb<FMT, TOK, TL>(), STB = lc_qw_stb<FMT, TOK, TL>();
    constexpr int ST = lc_qw_stages<FMT, TOK, TL>();
    /* what a stage's copies bring, whole boxes (zeros past N and M count) */
    constexpr uint32_t BYTES = WB + lc_qw_sb<FMT, TOK, TL>() + SUB * TOK * 128;
    static_assert(TOK <= 128, "TMA wgmma kernels: at most 128 tokens (their accumulators)");
    static_assert(ST >= 2, "wgmma path: too few stages");
    static_assert(lc_qw_smem<FMT, TOK, TL>() + 128 <= 227 * 1024, "wgmma path: shared memory");
    extern __shared__ __align__(1024) uint8_t lc_qwt_raw[];
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(lc_qwt_raw);
    uint8_t *sm = lc_qwt_raw + ((1024u - (raw_s & 1023u)) & 1023u);
    const uint32_t sm_s = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t full0 = sm_s + ST * STB, empty0 = full0 + ST * 8; /* ST mbarriers each, 8 bytes */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tile0 = blockIdx.y * TL; /* grid (token tiles, row blocks, K slices) */
    const int m0 = blockIdx.x * TOK;
    const int S = K / KS, Z = (int)gridDim.z, z = (int)blockIdx.z;
    const int s_lo = (int)((long long)S * z / Z), s_hi = (int)((long long)S * (z + 1) / Z);
    const int nst = s_hi - s_lo;

    if (tid == 0) {
        for (int i = 0; i < ST; i++) {
            lc_mbar_init(full0 + i * 8, 1);
            lc_mbar_init(empty0 + i * 8, LC_QW_THREADS); /* one arrival a consumer thread */
        }
        lc_mbar_init_fence();
    }
    __syncthreads();

    if (warp >= LC_QT_TILES) { /* the producer (RT = 2: its warpgroup, one lane working) */
        if constexpr (RT == 2) lc_wg_regs_dec<40>();
        if (warp != LC_QT_TILES || lane != 0) return;
        /* stage it's bytes announced on its `full` barrier, then its
         * weights (warp tiles (s V .. + V) of row tiles tile0 ..) and
         * INT4's scales (groups from the stage's first) */
        auto weights = [&](int it) {
            const int s = s_lo + it, b = it % ST;
            const uint32_t ws = sm_s + b * STB + XB, fb = full0 + b * 8;
            lc_mbar_arrive_tx(fb, BYTES);
            lc_tma_3d(ws, &wmap, 0, s * V, tile0, fb);
            if constexpr (F::I4) lc_tma_3d(ws + WB, &smap, 0, (s * KS) / group, tile0, fb);
        };
        /* the weights of the first ST stages before the kernel before has
         * finished (they do not depend on it), then their tokens */
        const int pre = nst < ST ? nst : ST;
        for (int it = 0; it < pre; it++) weights(it);
        lc_pdl_trigger();
        lc_pdl_wait();
        for (int it = 0; it < nst; it++) {
            const int b = it % ST;
            if (it >= ST) {
                lc_mbar_wait(empty0 + b * 8, (uint32_t)((it / ST - 1) & 1));
                weights(it);
            }
#pragma unroll
            for (int sub = 0; sub < SUB; sub++)
                lc_tma_2d(sm_s + b * STB + sub * (TOK * 128), &xmap, (s_lo + it) * KS + sub * 64, m0, full0 + b * 8);
        }
        return;
    }

    if constexpr (RT == 2) lc_wg_regs_inc<232>();
    lc_pdl_trigger();
    lc_pdl_wait();
    float acc[RT * (TOK / 2)];
#pragma unroll
    for (int i = 0; i < RT * (TOK / 2); i++) acc[i] = 0.0f;
    /* zeroed before the first wgmma: left to ptxas, the second tile's
     * zeroing sinks past the first tile's wgmma and serializes them (C7515) */
#pragma unroll
    for (int i = 0; i < RT * (TOK / 2); i++) lc_wg_reg_fence(acc[i]);

    for (int it = 0; it < nst; it++) {
        const int b = it % ST;
        lc_mbar_wait(full0 + b * 8, (uint32_t)((it / ST) & 1));
        /* all but the first step's wgmmas done: the stage before is free */
        lc_qw_stage<T, FMT, TOK, RT, TL>(acc, sm + (size_t)b * STB, sm_s + (uint32_t)(b * STB), (s_lo + it) * KS,
                                         group, warp, lane, [&] {
                                             if (it > 0) lc_mbar_arrive(empty0 + ((it - 1) % ST) * 8);
                                         });
    }
    lc_wg_wait<0>();
#pragma unroll
    for (int i = 0; i < RT * (TOK / 2); i++) lc_wg_reg_fence(acc[i]);
#pragma unroll
    for (int j = 0; j < RT; j++)
        lc_qw_store<T, FMT, TOK, F32>(acc + j * (TOK / 2), sc, y, part, M, N, m0,
                                      (tile0 + lc_qw_tile<RT>(warp, j)) * 16, z, Z, lane);
}

/* ------------------------------------------------------- layout mapping */

/* Where byte / nibble e (INT4: nibble index 0..31 of the lane's vector,
 * int8: byte 0..15) of lane l's vector in warp tile c of a row tile comes
 * from: row within the row tile, column within the matrix. */
__host__ __device__ inline void lc_qt_src(bool i4, int l, int c, int e, int *row, int *col) {
    const int g = l >> 2, t = l & 3;
    if (i4) {
        const int j = e >> 3, nib = e & 7, i = nib & 3, hi = nib >> 2;
        *row = g + (i & 1) * 8;
        *col = c * 64 + 16 * j + 2 * t + (i >> 1) * 8 + hi;
    } else {
        const int j = e >> 3, w = (e >> 2) & 1, bb = e & 3;
        *row = g + (bb >> 1) * 8;
        *col = c * 32 + 16 * j + 2 * t + w * 8 + (bb & 1);
    }
}

/* one thread per 16-byte lane vector: src row-major (N, K) codes -> dst tiled */
__global__ void lc_qtiled_pack_kernel(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int N, int K,
                                      int i4) {
    const int KC = i4 ? 64 : 32, C = K / KC;
    const size_t nvec = (size_t)(N / 16) * C * 32;
    const size_t rb = i4 ? (size_t)K / 2 : (size_t)K;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += (size_t)gridDim.x * blockDim.x) {
        const int l = (int)(v % 32), c = (int)((v / 32) % C);
        const size_t rt = v / 32 / C;
        uint32_t w[4] = {0, 0, 0, 0};
        for (int e = 0; e < (i4 ? 32 : 16); e++) {
            int r, col;
            lc_qt_src(i4, l, c, e, &r, &col);
            const uint8_t *row = src + (rt * 16 + r) * rb;
            if (i4) {
                const uint32_t q = (row[col >> 1] >> ((col & 1) * 4)) & 15u;
                /* nibble e: word e / 8, bits 4 (e % 8 & 3) + 16 (e % 8 >> 2) */
                const int nib = e & 7;
                w[e >> 3] |= q << (4 * (nib & 3) + 16 * (nib >> 2));
            } else {
                w[e >> 2] |= (uint32_t)row[col] << (8 * (e & 3));
            }
        }
        reinterpret_cast<uint4 *>(dst)[v] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

/* INT4 scales {s, b} f32 (N, groups) -> tiled (s, b' = b + 8 s) dt pairs
 * (N / 16, groups, 16), s in the low half: the kernels take the codes
 * centred, w = (q - 8) s + b', so b' is small where the zero is mid-range
 * and its rounding to dt costs less than b's (|b| up to 15 s) */
template <typename T>
__global__ void lc_qtiled_scales_kernel(const float *__restrict__ src, uint32_t *__restrict__ dst, int N, int groups) {
    const size_t n_all = (size_t)N * groups;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / groups, gi = i % groups;
        const float sv = src[i * 2], bv = src[i * 2 + 1];
        const uint32_t p = lc_pack2<T>(sv, fmaf(8.0f, sv, bv)); /* b' = b + 8 s */
        dst[((n / 16) * groups + gi) * 16 + n % 16] = p;
    }
}

/* tiled -> (N, K) dt: INT4 (q - 8) s + b' in one fma in dt from the tiled
 * dt pairs (lc_qt_dec4: the weights of the kernel's fused decode), int8 q s in fp32
 * rounded to dt. A warp per warp tile (16 rows x KC columns), two tiles in
 * flight: each lane decodes its vector — the tile's A fragments, four dt
 * pairs a k16 step — into a shared tile whose rows are padded by 16 bytes
 * (a store's 32 lanes then hit 32 banks), and the warp writes the 16 rows
 * as 16-byte stores. */
#define LC_QT_DQ_WARPS 8
template <typename T, bool I4>
__device__ __forceinline__ void lc_qt_dequant_tile(const uint4 u, size_t wt, int C, int groups, int group,
                                                   const float *__restrict__ sc, uint32_t *tl,
                                                   T *__restrict__ out, int K, int lane) {
    constexpr int KC = I4 ? 64 : 32, J = I4 ? 4 : 2, PW = (KC + 8) / 2; /* padded row, 32-bit words */
    const int g = lane >> 2, t = lane & 3, c = (int)(wt % C);
    const size_t rt = wt / C;
    uint32_t a[J][4];
    if constexpr (I4) {
        const uint32_t *p = reinterpret_cast<const uint32_t *>(sc) + (rt * groups + (size_t)c * KC / group) * 16;
        const uint32_t pa = __ldg(p + g), pb = __ldg(p + g + 8);
        const uint32_t s2a = __byte_perm(pa, 0, 0x1010), b2a = __byte_perm(pa, 0, 0x3232);
        const uint32_t s2b = __byte_perm(pb, 0, 0x1010), b2b = __byte_perm(pb, 0, 0x3232);
#pragma unroll
        for (int j = 0; j < J; j++) lc_qt_dec4<T>(lc_qt_word(u, j), s2a, b2a, s2b, b2b, a[j]);
    } else {
        /* word 2j + h: bytes 0, 1 row g, 2, 3 row g + 8, columns 16 j + 2 t + 8 h */
        const float sa = __ldg(sc + rt * 16 + g), sb = __ldg(sc + rt * 16 + g + 8);
#pragma unroll
        for (int i = 0; i < 2 * J; i++) {
            const uint32_t w = lc_qt_word(u, i);
            const float q0 = (float)(int8_t)(w & 255u), q1 = (float)(int8_t)((w >> 8) & 255u);
            const float q2 = (float)(int8_t)((w >> 16) & 255u), q3 = (float)(int8_t)(w >> 24);
            a[i >> 1][(i & 1) * 2] = lc_pack2<T>(q0 * sa, q1 * sa);
            a[i >> 1][(i & 1) * 2 + 1] = lc_pack2<T>(q2 * sb, q3 * sb);
        }
    }
    /* a[j]: (row g, cols 16 j + 2 t), (row g + 8, the same), both again 8 columns on */
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int w0 = 8 * j + t;
        tl[g * PW + w0] = a[j][0], tl[(g + 8) * PW + w0] = a[j][1];
        tl[g * PW + w0 + 4] = a[j][2], tl[(g + 8) * PW + w0 + 4] = a[j][3];
    }
    __syncwarp();
    constexpr int CPR = KC / 8; /* 16-byte chunks a row */
#pragma unroll
    for (int i = lane; i < 16 * CPR; i += 32) {
        const int r = i / CPR, q = i % CPR;
        *reinterpret_cast<uint4 *>(out + (rt * 16 + r) * (size_t)K + (size_t)c * KC + q * 8) =
            *reinterpret_cast<const uint4 *>(tl + r * PW + q * 4);
    }
    __syncwarp();
}

template <typename T, bool I4>
__global__ void __launch_bounds__(LC_QT_DQ_WARPS * 32)
    lc_qtiled_dequant_kernel(const uint8_t *__restrict__ wd, const float *__restrict__ sc, T *__restrict__ out,
                             int N, int K, int group) {
    constexpr int KC = I4 ? 64 : 32;
    __shared__ __align__(16) uint32_t tile[LC_QT_DQ_WARPS][16 * (KC + 8) / 2];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, C = K / KC, groups = I4 ? K / group : 1;
    const size_t ntile = (size_t)(N / 16) * C, step = (size_t)gridDim.x * LC_QT_DQ_WARPS;
    for (size_t wt = (size_t)blockIdx.x * LC_QT_DQ_WARPS + warp; wt < ntile; wt += 2 * step) {
        const bool two = wt + step < ntile;
        const uint4 u0 = lc_ldg16(wd + (wt * 32 + lane) * 16);
        const uint4 u1 = two ? lc_ldg16(wd + ((wt + step) * 32 + lane) * 16) : u0;
        lc_qt_dequant_tile<T, I4>(u0, wt, C, groups, group, sc, tile[warp], out, K, lane);
        if (two) lc_qt_dequant_tile<T, I4>(u1, wt + step, C, groups, group, sc, tile[warp], out, K, lane);
    }
}

/* ------------------------------------------------------------- dispatch */

extern "C" int lc_qtiled_ok(const loom_cuda_qweight *w) {
    if (!w || w->N <= 0 || w->N % 16 || w->K <= 0 || w->K % LC_QT_KS) return 0;
    if (w->fmt == LOOM_CUDA_Q_INT8_W8A16) return 1;
    return w->fmt == LOOM_CUDA_Q_INT4 && w->group > 0 && w->group % 64 == 0 && w->K % w->group == 0;
}

extern "C" int loom_cuda_qweight_tileable(const loom_cuda_qweight *w) { return lc_qtiled_ok(w); }

static int lc_qt_nt(int M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= 64 ? 8 : 16; }

/* K slices: as many as fit one wave of two CTAs an SM (one at 128-token
 * tiles), >= 4 stages a slice. Rounded down: rounded up, QKV's 48 row
 * blocks took 6 slices (288 CTAs for 264 places) and gate|up's 224 two
 * (1.7 waves, and a reduce) where one slice fills the wave alike. */
static int lc_qt_splits(const loom_cuda_qweight *w, int M) {
    const int nt = lc_qt_nt(M), tok = 8 * nt;
    const long ctas = (long)((w->N / 16 + LC_QT_TILES - 1) / LC_QT_TILES) * ((M + tok - 1) / tok);
    const long want = nt >= 16 ? LC_QT_SMS : 2 * LC_QT_SMS;
    const int S = w->K / LC_QT_KS;
    int z = ctas >= want ? 1 : (int)(want / ctas);
    if (z > 8) z = 8;
    if (z > S / 4) z = S / 4 > 0 ? S / 4 : 1;
    return z;
}

/* the wgmma path's token tile: its wgmma N */
static int lc_qw_tok(int M) { return M <= 32 ? 32 : M <= 64 ? 64 : M <= 128 ? 128 : 256; }

/* K slices of the wgmma path: as many as fill one wave of CTAs
 * (lc_qw_per_sm an SM) without starting a second, >= 4 stages a slice; tl
 * row tiles a CTA */
static int lc_qw_splits(const loom_cuda_qweight *w, int M, int tok, int tl = LC_QT_TILES) {
    const int ks = lc_qw_ks_of(tok, tl);
    const long ctas = (long)((w->N / 16 + tl - 1) / tl) * ((M + tok - 1) / tok);
    const long slots = (long)lc_qw_per_sm(tok, tl) * LC_QT_SMS;
    const int S = w->K / ks;
    int z = ctas >= slots ? 1 : (int)(slots / ctas);
    if (z > 8) z = 8;
    if (z > S / 4) z = S / 4 > 0 ? S / 4 : 1;
    return z;
}

extern "C" size_t lc_qtiled_scratch_bytes(const loom_cuda_qweight *w, int max_m) {
    size_t b = 0;
    const int z1 = lc_qt_splits(w, 1);
    for (int m = 1; m <= max_m && m <= LC_QT_MAX_M; m++) {
        int z = lc_qt_splits(w, m);
        if (z1 > z) z = z1; /* the batch-invariant split */
        /* the wgmma path's, whatever its kernel (TMA: at most 128-token tiles) */
        const int zw = lc_qw_splits(w, m, lc_qw_tok(m)), zt = lc_qw_splits(w, m, lc_qw_tok(m < 128 ? m : 128));
        const int zv = lc_qw_splits(w, m, lc_qw_tok(m < 128 ? m : 128), 2 * LC_QT_TILES); /* the wide kernel's */
        if (zw > z) z = zw;
        if (zt > z) z = zt;
        if (zv > z) z = zv;
        const size_t need = z > 1 ? (size_t)z * m * w->N * 4 : 0;
        if (need > b) b = need;
    }
    return b;
}

template <typename T, int FMT, int NT, bool F32, bool RAW> static cudaError_t lc_qt_prepare(size_t smem) {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_qtiled_kernel<T, FMT, NT, F32, RAW>, smem);
}

/* Whether a one-row call with epi fuses its pair epilogue (*P its rows
 * apart): where K is split, in the reduce. (SwiGLU in the unsplit kernel
 * was slower: docs/performance.md, "Tried and rejected".) */
static int lc_qt_pairs(const loom_cuda_qweight *w, const loom_cuda_epi *epi, int Z, int *P) {
    *P = lc_epi_p(epi, w->N);
    return *P > 0 && Z > 1;
}

/* the K-split second pass of every tiled kernel: Z slices of part summed
 * in slice order, times the scales where W8A16 left them out */
template <typename T, int FMT, bool F32>
static cudaError_t lc_qt_reduce(const float *part, const loom_cuda_qweight *w, void *y, int M, int Z, cudaStream_t s) {
    return lc_ksplit_reduce<T, FMT == LOOM_CUDA_Q_INT8_W8A16, F32>(part, nullptr, w->scales, y, M, w->N, Z, s);
}

template <typename T, int FMT, bool F32>
static cudaError_t lc_qtiled_t(int M, const loom_cuda_qweight *w, const void *x, void *y, float *part,
                               int invariant, const loom_cuda_epi *epi, int *fused, cudaStream_t s) {
    const int NT = lc_qt_nt(M), tok = 8 * NT;
    /* batch-invariant: the split of one row at every M (each output's sum
     * then runs the same mma steps in the same order whatever the tiling) */
    const int Z = lc_qt_splits(w, invariant ? 1 : M);
    const dim3 grid((unsigned)((w->N / 16 + LC_QT_TILES - 1) / LC_QT_TILES), (unsigned)((M + tok - 1) / tok),
                    (unsigned)Z);
    int P = 0;
    *fused = !F32 && M == 1 && epi && lc_qt_pairs(w, epi, Z, &P);
    cudaError_t e;
#define LC_QT_GO(NT_, RAW_)                                                                            \
    do {                                                                                               \
        constexpr size_t smem = lc_qt_smem<FMT, NT_>();                                                \
        const cudaError_t attr = lc_qt_prepare<T, FMT, NT_, F32, RAW_>(smem);                          \
        if (attr != cudaSuccess) return attr;                                                          \
        e = lc_launch(lc_qtiled_kernel<T, FMT, NT_, F32, RAW_>,                                        \
                      grid, dim3(LC_QT_WARPS * 32 * lc_qt_wn<NT_>()), smem, s,                         \
                      static_cast<const uint16_t *>(x), static_cast<const uint8_t *>(w->data),         \
                      (const float *)w->scales, y, part, M, w->N, w->K, w->group);                     \
    } while (0)
    /* the raw INT4 decode at up to 16 tokens, not in batch-invariant mode */
    constexpr bool I4 = FMT == LOOM_CUDA_Q_INT4;
    switch (NT) {
    case 1:
        if (I4 && !invariant) LC_QT_GO(1, I4);
        else LC_QT_GO(1, false);
        break;
    case 2:
        if (I4 && !invariant) LC_QT_GO(2, I4);
        else LC_QT_GO(2, false);
        break;
    case 4: LC_QT_GO(4, false); break;
    case 8: LC_QT_GO(8, false); break;
    default: LC_QT_GO(16, false); break;
    }
#undef LC_QT_GO
    if (e != cudaSuccess || Z == 1) return e;
    if (*fused)
        return lc_ksplit_pair<T, FMT == LOOM_CUDA_Q_INT8_W8A16>((const float *)part, w->scales, y, w->N, Z, P, epi, s);
    return lc_qt_reduce<T, FMT, F32>(part, w, y, M, Z, s);
}

template <typename T, int FMT, int TOK, bool F32> static cudaError_t lc_qw_prepare(size_t smem) {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_qtiled_wg_kernel<T, FMT, TOK, F32>, smem);
}

template <typename T, int FMT, bool F32>
static cudaError_t lc_qtiled_wg_t(int M, const loom_cuda_qweight *w, const void *x, void *y, float *part,
                                  cudaStream_t s) {
    const int tok = lc_qw_tok(M), Z = lc_qw_splits(w, M, tok);
    const dim3 grid((unsigned)((w->N / 16 + LC_QT_TILES - 1) / LC_QT_TILES), (unsigned)((M + tok - 1) / tok),
                    (unsigned)Z);
    cudaError_t e;
#define LC_QW_GO(TOK_)                                                                                 \
    do {                                                                                               \
        constexpr size_t smem = lc_qw_smem<FMT, TOK_>();                                               \
        const cudaError_t attr = lc_qw_prepare<T, FMT, TOK_, F32>(smem);                               \
        if (attr != cudaSuccess) return attr;                                                          \
        e = lc_launch(lc_qtiled_wg_kernel<T, FMT, TOK_, F32>, grid, dim3(LC_QW_THREADS), smem, s,      \
                      static_cast<const uint16_t *>(x), static_cast<const uint8_t *>(w->data),         \
                      (const float *)w->scales, y, part, M, w->N, w->K, w->group);                     \
    } while (0)
    switch (tok) {
    case 32: LC_QW_GO(32); break;
    case 64: LC_QW_GO(64); break;
    case 128: LC_QW_GO(128); break;
    default: LC_QW_GO(256); break;
    }
#undef LC_QW_GO
    if (e != cudaSuccess || Z == 1) return e;
    return lc_qt_reduce<T, FMT, F32>(part, w, y, M, Z, s);
}

/* The TMA kernel: x (M, K) 16-bit row-major as a tensor map of boxes of
 * 64 columns x TOK rows in the 128-byte swizzle (rows past M read as
 * zeros). cuTensorMapEncodeTiled through the runtime's driver entry point
 * (host only: nothing enters a stream, so a launch being captured is
 * fine). */
static PFN_cuTensorMapEncodeTiled_v12000 lc_qw_encode_fn(void) {
    /* tensor-parallel ranks are threads of one process: the pointer is
     * looked up by whichever comes first (they find the same one) */
    static void *fn = nullptr;
    static int tried = 0;
    if (!__atomic_load_n(&tried, __ATOMIC_ACQUIRE)) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            __atomic_store_n(&fn, p, __ATOMIC_RELAXED);
        __atomic_store_n(&tried, 1, __ATOMIC_RELEASE);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(__atomic_load_n(&fn, __ATOMIC_RELAXED));
}

static int lc_qw_tma = 2;        /* lc_qtiled_set_wgmma_tma */
static long lc_qw_fallbacks;      /* TMA calls that ran cp.async for want of a tensor map */
extern "C" long lc_qtiled_tma_fallback_count(void) { return __atomic_load_n(&lc_qw_fallbacks, __ATOMIC_RELAXED); }
static long lc_qw_wide_runs; /* launches of the wide (256-row) TMA kernel (the kernel tests check the dispatch) */
extern "C" long lc_qtiled_wide_count(void) { return __atomic_load_n(&lc_qw_wide_runs, __ATOMIC_RELAXED); }

static cudaError_t lc_qw_xmap(CUtensorMap *map, const void *x, int M, int K, int tok) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = lc_qw_encode_fn();
    if (!enc || __atomic_load_n(&lc_qw_tma, __ATOMIC_RELAXED) == 3) return cudaErrorNotSupported;
    const cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)M}, stride[1] = {(cuuint64_t)K * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)tok}, estr[2] = {1, 1};
    const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void *>(x), dim, stride, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* A 3-D tensor map of 32-bit words, dim[0] innermost, packed (no gaps
 * between rows), no swizzle, boxes past the end read as zeros: the tiled
 * weight as (128 words a 512-byte warp tile, K / KC warp tiles, N / 16 row
 * tiles) in boxes of (128, V, row tiles a CTA), INT4's scale pairs as (16
 * words a (row tile, group), groups, N / 16) in boxes of (16, groups a
 * stage, row tiles a CTA) — the stage layout the consumers read. */
static cudaError_t lc_qw_map3(CUtensorMap *map, const void *p, const cuuint64_t dim[3], const cuuint32_t box[3]) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = lc_qw_encode_fn(); /* (mode 3: lc_qw_xmap refused first) */
    if (!enc) return cudaErrorNotSupported;
    const cuuint64_t stride[2] = {dim[0] * 4, dim[0] * dim[1] * 4};
    const cuuint32_t estr[3] = {1, 1, 1};
    const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 3, const_cast<void *>(p), dim, stride, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* The three maps of a TMA kernel call: tokens, weights, INT4 scales (W8A16:
 * the weights' again, unread). */
template <int FMT, int TOK, int TL>
static cudaError_t lc_qw_maps(CUtensorMap *xm, CUtensorMap *wm, CUtensorMap *smp, const loom_cuda_qweight *w,
                              const void *x, int M) {
    typedef lc_qt<FMT> F;
    constexpr int KS = lc_qw_ks<TOK, TL>();
    cudaError_t e = lc_qw_xmap(xm, x, M, w->K, TOK);
    const cuuint64_t wdim[3] = {128, (cuuint64_t)(w->K / F::KC), (cuuint64_t)(w->N / 16)};
    const cuuint32_t wbox[3] = {128, KS / F::KC, TL};
    if (e == cudaSuccess) e = lc_qw_map3(wm, w->data, wdim, wbox);
    if (e != cudaSuccess || !F::I4) {
        *smp = *wm;
        return e;
    }
    const cuuint64_t sdim[3] = {16, (cuuint64_t)(w->K / w->group), (cuuint64_t)(w->N / 16)};
    const cuuint32_t sbox[3] = {16, KS / 64, TL};
    return lc_qw_map3(smp, w->scales, sdim, sbox);
}

template <typename T, int FMT, int TOK, bool F32, int RT> static cudaError_t lc_qwt_prepare(size_t smem) {
    static unsigned long long done = 0;
    return lc_smem_limit(&done, (const void *)lc_qtiled_tma_kernel<T, FMT, TOK, F32, RT>, smem);
}

/* the TMA kernel of RT row tiles a warp (128 or 256 rows a CTA) */
template <typename T, int FMT, bool F32, int RT>
static cudaError_t lc_qtiled_tma_t(int M, const loom_cuda_qweight *w, const void *x, void *y, float *part,
                                   cudaStream_t s) {
    constexpr int TL = RT * LC_QT_TILES;
    /* at most 128 tokens a tile; the token tiles of a row block side by
     * side in the grid (x), so they run together and the second reads its
     * weights from L2 */
    const int tok = lc_qw_tok(M < 128 ? M : 128), Z = lc_qw_splits(w, M, tok, TL);
    const dim3 grid((unsigned)((M + tok - 1) / tok), (unsigned)((w->N / 16 + TL - 1) / TL), (unsigned)Z);
    CUtensorMap xm, wm, smp;
    cudaError_t e = cudaSuccess;
#define LC_QWT_GO(TOK_)                                                                                \
    do {                                                                                               \
        if ((e = lc_qw_maps<FMT, TOK_, TL>(&xm, &wm, &smp, w, x, M)) != cudaSuccess) {                 \
            /* no tensor map: cp.async */                                                              \
            __atomic_fetch_add(&lc_qw_fallbacks, 1, __ATOMIC_RELAXED);                                 \
            return lc_qtiled_wg_t<T, FMT, F32>(M, w, x, y, part, s);                                   \
        }                                                                                              \
        constexpr size_t smem = lc_qw_smem<FMT, TOK_, TL>() + 128; /* + the mbarriers */               \
        const cudaError_t attr = lc_qwt_prepare<T, FMT, TOK_, F32, RT>(smem);                          \
        if (attr != cudaSuccess) return attr;                                                          \
        e = lc_launch(lc_qtiled_tma_kernel<T, FMT, TOK_, F32, RT>, grid, dim3(lc_qw_tma_threads<RT>()), \
                      smem, s, xm, wm, smp, (const float *)w->scales, y, part, M, w->N, w->K, w->group); \
        if (RT == 2 && e == cudaSuccess) __atomic_fetch_add(&lc_qw_wide_runs, 1, __ATOMIC_RELAXED);   \
    } while (0)
    switch (tok) {
    case 32: LC_QWT_GO(32); break;
    case 64: LC_QWT_GO(64); break;
    default: LC_QWT_GO(128); break;
    }
#undef LC_QWT_GO
    if (e != cudaSuccess || Z == 1) return e;
    return lc_qt_reduce<T, FMT, F32>(part, w, y, M, Z, s);
}

/* which kernel and copies the wgmma path runs (lc_qtiled_set_wgmma_tma):
 * 0 cp.async + CTA barriers, 1 TMA + mbarriers, 3 TMA as if no tensor map
 * could be made (its cp.async fallback, for the kernel tests), 4 the wide
 * TMA kernel (256-row CTAs, a producer warpgroup), 2 (the default) as
 * measured on an H100 (one Llama-3-8B layer's linears, gpu_bench --quant;
 * cp.async / TMA / wide, us): INT4 the wide kernel from 64 rows (64: 135.2 /
 * 122.3 / 115.6, 128: 199.6 / 160.6 / 153.1, 256: 362.4 / 269.8 / 258.9),
 * W8A16 TMA above 64 rows (128: 190.9 / 172.8 / 185.9, 256: 361.3 / 272.9
 * / 287.3; 64: 141.3 / 139.1 / 146.0), cp.async below those. gpu_bench and
 * the kernel tests force each. */
extern "C" void lc_qtiled_set_wgmma_tma(int mode) {
    __atomic_store_n(&lc_qw_tma, mode < 0 || mode > 4 ? 2 : mode, __ATOMIC_RELAXED);
}

static long lc_qtiled_wg_runs; /* calls that took the wgmma path (the kernel tests check the dispatch) */
extern "C" long lc_qtiled_wgmma_count(void) { return __atomic_load_n(&lc_qtiled_wg_runs, __ATOMIC_RELAXED); }

/* whether the kernels take w (tiled, a tileable shape, INT4 tiled for dt) */
static bool lc_qtiled_takes(loom_cuda_dt dt, const loom_cuda_qweight *w) {
    return lc_qtiled_ok(w) && w->layout == LOOM_CUDA_QLAYOUT_TILED && (w->fmt != LOOM_CUDA_Q_INT4 || dt == w->tile_dt);
}
/* the wgmma path from wgmma_min_m rows (0: never), not in batch-invariant
 * mode */
static bool lc_qtiled_wgmma_at(int M, int invariant, int wgmma_min_m) {
    return !invariant && wgmma_min_m > 0 && M >= wgmma_min_m;
}

/* one format and output type: the mma.sync kernel or the wgmma path's
 * kernel that `mode` (lc_qw_tma's) picks */
template <typename T, int FMT, bool F32>
static cudaError_t lc_qtiled_go(int M, const loom_cuda_qweight *w, const void *x, void *y, float *part,
                                int invariant, bool wg, int mode, const loom_cuda_epi *epi, int *fused,
                                cudaStream_t s) {
    if (!wg) return lc_qtiled_t<T, FMT, F32>(M, w, x, y, part, invariant, epi, fused, s);
    if (mode == 2) mode = FMT == LOOM_CUDA_Q_INT8_W8A16 ? (M > 64 ? 1 : 0) : (M >= 64 ? 4 : 0);
    if (mode == 0) return lc_qtiled_wg_t<T, FMT, F32>(M, w, x, y, part, s);
    if (mode == 4) return lc_qtiled_tma_t<T, FMT, F32, 2>(M, w, x, y, part, s);
    return lc_qtiled_tma_t<T, FMT, F32, 1>(M, w, x, y, part, s); /* 1, 3 */
}

extern "C" cudaError_t lc_qtiled(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w, const void *x,
                                 void *y, void *scratch, int invariant, int wgmma_min_m, const loom_cuda_epi *epi,
                                 int *fused, cudaStream_t s) {
    *fused = 0;
    if (!lc_qtiled_takes(dt, w) || M < 1 || M > LC_QT_MAX_M) return cudaErrorInvalidValue;
    float *part = static_cast<float *>(scratch);
    const bool wg = lc_qtiled_wgmma_at(M, invariant, wgmma_min_m);
    const int mode = __atomic_load_n(&lc_qw_tma, __ATOMIC_RELAXED);
    if (wg) __atomic_fetch_add(&lc_qtiled_wg_runs, 1, __ATOMIC_RELAXED);
#define LC_QT_F(T, FMT)                                                                            \
    (out_f32 ? lc_qtiled_go<T, FMT, true>(M, w, x, y, part, invariant, wg, mode, epi, fused, s)    \
             : lc_qtiled_go<T, FMT, false>(M, w, x, y, part, invariant, wg, mode, epi, fused, s))
#define LC_QT_T(T) (w->fmt == LOOM_CUDA_Q_INT4 ? LC_QT_F(T, LOOM_CUDA_Q_INT4) : LC_QT_F(T, LOOM_CUDA_Q_INT8_W8A16))
    return dt == LOOM_CUDA_F16 ? LC_QT_T(__half) : LC_QT_T(__nv_bfloat16);
#undef LC_QT_T
#undef LC_QT_F
}

extern "C" cudaError_t lc_qtiled_dequant(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out, cudaStream_t s) {
    if (!lc_qtiled_takes(dt, w)) return cudaErrorInvalidValue;
    const int i4 = w->fmt == LOOM_CUDA_Q_INT4;
    const size_t ntile = (size_t)(w->N / 16) * (w->K / (i4 ? 64 : 32)), per = 2 * LC_QT_DQ_WARPS;
    const unsigned grid = (unsigned)((ntile + per - 1) / per < 65535 ? (ntile + per - 1) / per : 65535);
    const uint8_t *wd = static_cast<const uint8_t *>(w->data);
    const float *sc = (const float *)w->scales;
    const dim3 blk(LC_QT_DQ_WARPS * 32);
#define LC_QT_DQ(T)                                                                                             \
    (i4 ? lc_launch(lc_qtiled_dequant_kernel<T, true>, dim3(grid), blk, 0, s, wd, sc, static_cast<T *>(out), w->N, \
                    w->K, w->group)                                                                             \
        : lc_launch(lc_qtiled_dequant_kernel<T, false>, dim3(grid), blk, 0, s, wd, sc, static_cast<T *>(out),    \
                    w->N, w->K, w->group))
    return dt == LOOM_CUDA_F16 ? LC_QT_DQ(__half) : LC_QT_DQ(__nv_bfloat16);
#undef LC_QT_DQ
}

/* Repack w's row-major codes into the tiled layout in place (through a
 * temporary device copy of the codes, freed before returning; synchronizes
 * s). */
extern "C" cudaError_t loom_cuda_qweight_tile(loom_cuda_qweight *w, loom_cuda_dt dt, cudaStream_t s) {
    if (!w || w->layout == LOOM_CUDA_QLAYOUT_TILED) return cudaSuccess;
    if (!lc_qtiled_ok(w) || (dt != LOOM_CUDA_BF16 && dt != LOOM_CUDA_F16)) return cudaErrorInvalidValue;
    const int i4 = w->fmt == LOOM_CUDA_Q_INT4;
    const size_t bytes = (size_t)w->N * (i4 ? (size_t)w->K / 2 : (size_t)w->K);
    const size_t sbytes = i4 ? (size_t)w->N * (w->K / w->group) * 8 : 0;
    void *tmp = NULL;
    cudaError_t e = cudaMalloc(&tmp, bytes + sbytes);
    if (e != cudaSuccess) return e;
    e = cudaMemcpyAsync(tmp, w->data, bytes, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess && i4)
        e = cudaMemcpyAsync(static_cast<uint8_t *>(tmp) + bytes, w->scales, sbytes, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess) {
        const size_t nvec = bytes / 16;
        const unsigned grid = (unsigned)((nvec + 255) / 256 < 65535 ? (nvec + 255) / 256 : 65535);
        lc_qtiled_pack_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t *>(tmp),
                                                   static_cast<uint8_t *>(const_cast<void *>(w->data)), w->N,
                                                   w->K, i4);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && i4) {
        const float *src = reinterpret_cast<const float *>(static_cast<uint8_t *>(tmp) + bytes);
        uint32_t *dst = reinterpret_cast<uint32_t *>(const_cast<float *>(w->scales));
        const int groups = w->K / w->group;
        const size_t n = (size_t)w->N * groups;
        const unsigned grid = (unsigned)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535);
        if (dt == LOOM_CUDA_F16) lc_qtiled_scales_kernel<__half><<<grid, 256, 0, s>>>(src, dst, w->N, groups);
        else lc_qtiled_scales_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(src, dst, w->N, groups);
        e = cudaGetLastError();
    }
    const cudaError_t e2 = cudaStreamSynchronize(s);
    cudaFree(tmp);
    if (e == cudaSuccess) e = e2;
    if (e == cudaSuccess) w->layout = LOOM_CUDA_QLAYOUT_TILED, w->tile_dt = dt;
    return e;
}
