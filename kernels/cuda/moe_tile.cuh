/*
 * kernels/cuda/moe_tile.cuh — the tile the grouped expert GEMMs share
 * (moe.cu: experts in the compute type, loaded by cp.async; moe_quant.cu:
 * quantized experts decoded into the tile): a 64 x 128 output tile per CTA
 * of 4 warps (2 x 2, 32 x 64 each), K in steps of LC_MOE_BK held in shared
 * memory, mma.sync m16n8k16 with float32 accumulation (mma.cuh). Its rows are the
 * tiles of loom_cuda_moe_group's list (LC_MOE_BM rows an expert tile).
 */
#ifndef LOOM_CUDA_MOE_TILE_CUH
#define LOOM_CUDA_MOE_TILE_CUH

#include "common.cuh"
#include "mma.cuh"

#define LC_MOE_BM 64
#define LC_MOE_BN 128
#define LC_MOE_BK 32
#define LC_MOE_PAD 8 /* smem row padding (elements): conflict-free fragment loads */

/* One stage of the tiles: A (BM, BK) tokens and B (BN, BK) weights, rows padded. */
template <typename T> struct lc_moe_stage {
    T a[LC_MOE_BM][LC_MOE_BK + LC_MOE_PAD];
    T b[LC_MOE_BN][LC_MOE_BK + LC_MOE_PAD];
};

/* A warp's 32 x 64 accumulators. */
typedef float lc_moe_acc[2][8][4];

__device__ __forceinline__ void lc_moe_acc_zero(lc_moe_acc &acc) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
}

/* acc += the stage's A rows [wm, wm + 32) x its B rows [wn, wn + 64), over
 * the stage's LC_MOE_BK columns: per 16 columns 2 + 4 ldmatrix.x4 and 2 x 8
 * mma. A's x4 is a 16 x 16 fragment (lanes 0-15 rows at column kk, 16-31 at
 * kk + 8); B's is two 8-row n tiles x k 0-7, 8-15 (lane l: row (l / 16) 8 +
 * l % 8, column (l / 8 % 2) 8). The padded rows (80 bytes) put an
 * ldmatrix's 8 rows on 8 distinct 4-bank groups. The fragments (and so the
 * bits) are those of 32-bit loads, at 6 instead of 24 loads a warp per 16
 * mma; docs/performance.md has the timing. */
template <typename T>
__device__ __forceinline__ void lc_moe_tile_step(lc_moe_acc &acc, const lc_moe_stage<T> &st, int wm, int wn,
                                                 int lane) {
    const int ar = lane & 15, ac = (lane >> 4) * 8;
    const int br = ((lane >> 4) << 3) + (lane & 7), bc = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < LC_MOE_BK; kk += 16) {
        uint32_t af[2][4], bf[8][2];
#pragma unroll
        for (int i = 0; i < 2; i++) lc_ldsm4(&st.a[wm + 16 * i + ar][kk + ac], af[i][0], af[i][1], af[i][2], af[i][3]);
#pragma unroll
        for (int j = 0; j < 8; j += 2)
            lc_ldsm4(&st.b[wn + 8 * j + br][kk + bc], bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1]);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) lc_mma16816<T>(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
}

#endif
