/*
 * kernels/cuda/qgguf.cu — the linear layers on GGUF blocks as the file
 * stores them (loom_cuda_qweight fmt GGUF, gguf_layout.h; qgemm.c decides
 * which runs):
 *
 *   lc_gguf_gemv     fused dequantize-GEMV for 1..8 rows of x, one launch
 *                    per segment (block type) of the weight;
 *   lc_gguf_dequant  weight -> (N, K) dt, for the large-M path (then the
 *                    dt GEMM, as INT4 does).
 *
 * Why shared memory: blocks are 18 / 20 / 34 / 144 / 210 bytes and rows
 * start on any even byte, so a lane cannot own whole 16-byte chunks of
 * whole blocks as qgemm.cu's GEMV does. A warp stages a tile of a row —
 * 32 sub-blocks of 32 weights: q4_0 576 bytes, q4_1 640, q8_0 1088, q4_k
 * 576 (4 super-blocks), q6_k 840 — into its own shared memory with
 * coalesced 16-byte evict-first loads of the 16-byte chunks covering it,
 * then each lane decodes one sub-block from shared memory (32-bit words at
 * any even address by a funnel shift). Each weight byte is read from memory
 * once; a 16-byte chunk straddling two tiles or rows is loaded by both but
 * the second load hits L2. The next tile's loads are in flight while the
 * current one is decoded.
 *
 * Decoding: every type is w = a * q + b per 16 weights, q an integer code
 * (to float by one PRMT, minus its offset, exact: common.cuh) and (a, b)
 * from the block:
 *   q4_0: q = nibble - 8, a = d        q4_1: q = nibble, a = d, b = m
 *   q8_0: q = int8, a = d              q4_k: q = nibble, a = d sc, b = -dmin mn
 *   q6_k: q = 6-bit code - 32, a = d sc
 * The GEMV accumulates p = sum(x q) per 16 weights and adds a p (q4_1 and
 * q4_k also b sum(x)): one or two FMAs per 16 weights instead of one per
 * weight. The dequantize kernel forms fmaf(q, a, b) (b = -0 where the CPU
 * has a plain product, so even the sign of a zero agrees), equal bit for
 * bit to the CPU's decode (formats/gguf_blocks.h, which formats/dequant.c
 * and kernels/cpu/qlinear.c run; its scale and code geometry is shared
 * with prep() below):
 * the products there are exact in fp32 (at most 23 significant bits) and
 * the one addition of q4_1 / q4_k rounds once either way.
 *
 * Bytes streamed per weight at M = 1 (bf16: 2): q4_0 0.5625, q4_1 0.625,
 * q4_k 0.5625, q6_k 0.8203, q8_0 1.0625; x and the output are small.
 *
 * What this is not: a tensor-core kernel, or a repacking of the blocks
 * into a friendlier layout (the blocks stay byte-identical to the file).
 */
#include "common.cuh"

#include "formats/gguf_blocks.h"
#include "qgemm.h"

#define LC_GG_WARPS 4

/* ------------------------------------------------------------ geometry */

__host__ __device__ constexpr int lc_gg_bytes(int t) {
    return t == LOOM_CUDA_GGUF_Q8_0   ? LOOM_GGUF_Q8_0_BYTES
           : t == LOOM_CUDA_GGUF_Q4_0 ? LOOM_GGUF_Q4_0_BYTES
           : t == LOOM_CUDA_GGUF_Q4_1 ? LOOM_GGUF_Q4_1_BYTES
           : t == LOOM_CUDA_GGUF_Q4_K ? LOOM_GGUF_Q4_K_BYTES
                                      : LOOM_GGUF_Q6_K_BYTES;
}
__host__ __device__ constexpr int lc_gg_subs(int t) {
    return t == LOOM_CUDA_GGUF_Q4_K || t == LOOM_CUDA_GGUF_Q6_K ? 8 : 1;
}

/* A tile is 32 sub-blocks of 32 weights; a lane decodes one. */
template <int TYPE> struct lc_gt {
    static constexpr int BB = lc_gg_bytes(TYPE);    /* bytes per block             */
    static constexpr int SUBS = lc_gg_subs(TYPE);   /* 32-weight sub-blocks / block */
    static constexpr int ELEMS = 32 * SUBS;         /* weights per block           */
    static constexpr int TILE = 32 / SUBS * BB;     /* bytes of a tile             */
    static constexpr int N16 = (14 + TILE + 15) / 16; /* 16-byte chunks covering one
                                                       starting at any even byte    */
    static constexpr int SM16 = N16 + 1;            /* + the funnel's word past it  */
    static constexpr int LD = (N16 + 31) / 32;      /* chunk loads per lane        */
    static_assert(SM16 <= 32 * LD, "the stores must fill the slack chunk too");
};

/* Four bytes of w (byte 0 first) as floats, minus OFF. */
template <int OFF> __device__ __forceinline__ void lc_bytes4(uint32_t w, float *f) {
    f[0] = lc_byte_f<0, OFF>(w);
    f[1] = lc_byte_f<1, OFF>(w);
    f[2] = lc_byte_f<2, OFF>(w);
    f[3] = lc_byte_f<3, OFF>(w);
}

/* ------------------------------------------------- shared-memory reads */

/* NW little-endian 32-bit words from byte o (even) of the words sw. */
template <int NW> __device__ __forceinline__ void lc_sw_words(const uint32_t *sw, int o, uint32_t *w) {
    const uint32_t *a = sw + (o >> 2);
    const uint32_t sh = (uint32_t)(o & 3) * 8;
    uint32_t lo = a[0];
#pragma unroll
    for (int i = 0; i < NW; i++) {
        const uint32_t hi = a[i + 1];
        w[i] = __funnelshift_r(lo, hi, sh);
        lo = hi;
    }
}
/* The 16-bit little-endian value at byte o (even). */
__device__ __forceinline__ uint32_t lc_sw_u16(const uint32_t *sw, int o) {
    return (sw[o >> 2] >> ((o & 2) * 8)) & 0xFFFFu;
}
__device__ __forceinline__ float lc_f16_bits(uint32_t b) {
    __half_raw r;
    r.x = (unsigned short)(b & 0xFFFFu);
    return __half2float(__half(r));
}

/* --------------------------------------------------------------- decode */

/* What a lane keeps of its sub-block for both halves. prep() reads the
 * block's scales (and, for the 4-bit 32-weight types, its 16 code bytes);
 * half(h) gives codes q[16] of weights 16h .. 16h + 15 and (a, b) with
 * w = a q + b. sw: the tile's words in shared memory; o: the block's first
 * byte there; j: the sub-block within the block (k-quants). AFFINE: b can
 * be nonzero (else it is -0 and the GEMV skips sum(x)). */
template <int TYPE> struct lc_gg_sub;

template <> struct lc_gg_sub<LOOM_CUDA_GGUF_Q4_0> {
    static constexpr bool AFFINE = false;
    float d;
    uint32_t w[4];
    __device__ __forceinline__ void prep(const uint32_t *sw, int o, int) {
        d = lc_f16_bits(lc_sw_u16(sw, o));
        lc_sw_words<4>(sw, o + 2, w);
    }
    __device__ __forceinline__ void half(const uint32_t *, int h, float *q, float &a, float &b) const {
#pragma unroll
        for (int i = 0; i < 4; i++) lc_bytes4<8>((w[i] >> (4 * h)) & 0x0F0F0F0Fu, q + 4 * i);
        a = d, b = -0.0f;
    }
};

template <> struct lc_gg_sub<LOOM_CUDA_GGUF_Q4_1> {
    static constexpr bool AFFINE = true;
    float d, m;
    uint32_t w[4];
    __device__ __forceinline__ void prep(const uint32_t *sw, int o, int) {
        uint32_t dm;
        lc_sw_words<1>(sw, o, &dm);
        d = lc_f16_bits(dm), m = lc_f16_bits(dm >> 16);
        lc_sw_words<4>(sw, o + 4, w);
    }
    __device__ __forceinline__ void half(const uint32_t *, int h, float *q, float &a, float &b) const {
#pragma unroll
        for (int i = 0; i < 4; i++) lc_bytes4<0>((w[i] >> (4 * h)) & 0x0F0F0F0Fu, q + 4 * i);
        a = d, b = m;
    }
};

template <> struct lc_gg_sub<LOOM_CUDA_GGUF_Q8_0> {
    static constexpr bool AFFINE = false;
    float d;
    int qo;
    __device__ __forceinline__ void prep(const uint32_t *sw, int o, int) {
        d = lc_f16_bits(lc_sw_u16(sw, o));
        qo = o + 2;
    }
    __device__ __forceinline__ void half(const uint32_t *sw, int h, float *q, float &a, float &b) const {
        uint32_t w[4];
        lc_sw_words<4>(sw, qo + 16 * h, w);
#pragma unroll
        for (int i = 0; i < 4; i++) lc_i8x4(w[i], q + 4 * i);
        a = d, b = -0.0f;
    }
};

/* q4_k: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes
 * of nibbles; sub-blocks 2i and 2i + 1 are the low and high nibbles of
 * bytes [32 i, 32 i + 32). */
template <> struct lc_gg_sub<LOOM_CUDA_GGUF_Q4_K> {
    static constexpr bool AFFINE = true;
    float a_, b_;
    int qo, sh;
    __device__ __forceinline__ void prep(const uint32_t *sw, int o, int j) {
        uint32_t hw[4];
        lc_sw_words<4>(sw, o, hw);
        const float d = lc_f16_bits(hw[0]), dmin = lc_f16_bits(hw[0] >> 16);
        uint32_t sc, mn;
        loom_q4k_scale_min(hw + 1, j, &sc, &mn); /* the 12 scale bytes: words 1..3 */
        a_ = d * (float)sc, b_ = -(dmin * (float)mn);
        qo = o + LOOM_GGUF_Q4_K_QS + 32 * (j >> 1);
        sh = 4 * (j & 1);
    }
    __device__ __forceinline__ void half(const uint32_t *sw, int h, float *q, float &a, float &b) const {
        uint32_t w[4];
        lc_sw_words<4>(sw, qo + 16 * h, w);
#pragma unroll
        for (int i = 0; i < 4; i++) lc_bytes4<0>((w[i] >> sh) & 0x0F0F0F0Fu, q + 4 * i);
        a = a_, b = b_;
    }
};

/* q6_k: ql[128] low nibbles, qh[64] 2-bit high parts, int8 scales[16], f16
 * d; where sub-block s keeps its codes and scales: loom_q6k_sub_at. */
template <> struct lc_gg_sub<LOOM_CUDA_GGUF_Q6_K> {
    static constexpr bool AFFINE = false;
    float a0, a1;
    int lo, ho, nsh, hsh;
    __device__ __forceinline__ void prep(const uint32_t *sw, int o, int s) {
        const float d = lc_f16_bits(lc_sw_u16(sw, o + LOOM_GGUF_Q6_K_D));
        const loom_q6k_sub g = loom_q6k_sub_at(s);
        const uint32_t scp = lc_sw_u16(sw, o + g.sc);
        a0 = d * (float)(int8_t)(scp & 0xFFu);
        a1 = d * (float)(int8_t)(scp >> 8);
        lo = o + g.lo;
        ho = o + g.ho;
        nsh = g.nsh;
        hsh = g.hsh;
    }
    __device__ __forceinline__ void half(const uint32_t *sw, int h, float *q, float &a, float &b) const {
        uint32_t l[4], hb[4];
        lc_sw_words<4>(sw, lo + 16 * h, l);
        lc_sw_words<4>(sw, ho + 16 * h, hb);
#pragma unroll
        for (int i = 0; i < 4; i++)
            lc_bytes4<32>(((l[i] >> nsh) & 0x0F0F0F0Fu) | (((hb[i] >> hsh) & 0x03030303u) << 4),
                          q + 4 * i);
        a = h ? a1 : a0;
        b = -0.0f;
    }
};

/* ------------------------------------------------------------ staging */

/* Issue the loads of tile t of R rows (wr: each row's first byte; all rows
 * row_bytes long): the 16-byte chunks covering it into ld, and where the
 * tile starts in the first chunk into off. */
template <int TYPE, int R>
__device__ __forceinline__ void lc_gg_issue(const uint8_t *const (&wr)[R], size_t row_bytes, int t,
                                            int lane, uint4 (&ld)[R][lc_gt<TYPE>::LD],
                                            int (&off)[R]) {
    using G = lc_gt<TYPE>;
    const size_t b0 = (size_t)t * G::TILE;
    const int nb = row_bytes - b0 < (size_t)G::TILE ? (int)(row_bytes - b0) : G::TILE;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uintptr_t s = reinterpret_cast<uintptr_t>(wr[r]) + b0;
        const uint4 *base = reinterpret_cast<const uint4 *>(s & ~(uintptr_t)15);
        off[r] = (int)(s & 15);
        const int n16 = (off[r] + nb + 15) >> 4;
#pragma unroll
        for (int i = 0; i < G::LD; i++) {
            const int c = lane + 32 * i;
            ld[r][i] = c < n16 ? __ldcs(base + c) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* Put the loaded chunks into the warp's shared tiles (R of SM16 chunks). */
template <int TYPE, int R>
__device__ __forceinline__ void lc_gg_stage(uint32_t (*sm)[lc_gt<TYPE>::SM16 * 4], int lane,
                                            const uint4 (&ld)[R][lc_gt<TYPE>::LD]) {
    using G = lc_gt<TYPE>;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < G::LD; i++) {
            const int c = lane + 32 * i;
            if (c < G::SM16) reinterpret_cast<uint4 *>(sm[r])[c] = ld[r][i];
        }
}

/* ------------------------------------------------------------------ GEMV */

/* y[m, n] (row stride ldy) = sum_k x[m, k] w[n, k] for the `rows` rows of
 * one segment: wd (rows, K / ELEMS blocks) of TYPE; x (M, K) dt; y dt or
 * f32. A warp owns R consecutive rows, 4 warps per CTA; lane l decodes
 * sub-block 32 t + l of each tile t. */
template <typename T, int TYPE, int M, int R>
__global__ void __launch_bounds__(LC_GG_WARPS * 32)
    lc_gguf_gemv_kernel(const T *__restrict__ x, const uint8_t *__restrict__ wd, int rows, int K,
                        void *__restrict__ y, int ldy, int out_f32, int pf) {
    using G = lc_gt<TYPE>;
    __shared__ __align__(16) uint32_t sm[LC_GG_WARPS][R][G::SM16 * 4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n0 = (blockIdx.x * LC_GG_WARPS + warp) * R;
    const size_t row_bytes = (size_t)(K / G::ELEMS) * G::BB;
    /* the warp's R rows of blocks are contiguous: ask L2 for them first */
    if (pf && n0 < rows)
        lc_prefetch_rows(wd + (size_t)n0 * row_bytes, rows - n0 < R ? rows - n0 : R, row_bytes, lane);
    lc_pdl_trigger();
    lc_pdl_wait();
    if (n0 >= rows) return; /* whole warps only; nothing below syncs the CTA */
    const int nsb = K >> 5, ntiles = (nsb + 31) >> 5;
    const uint8_t *wr[R]; /* rows past the end read row n0 again, never stored */
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = wd + (size_t)(n0 + r < rows ? n0 + r : n0) * row_bytes;
    /* where the lane's sub-block starts in a tile, and which one of its block */
    const int bo = (lane / G::SUBS) * G::BB, j = lane % G::SUBS;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++) acc[r][m] = 0.0f;
    uint4 ld[R][G::LD];
    int off[R], off_next[R];
    lc_gg_issue<TYPE, R>(wr, row_bytes, 0, lane, ld, off_next);
    for (int t = 0; t < ntiles; t++) {
        __syncwarp(); /* every lane is done with the previous tile */
        lc_gg_stage<TYPE, R>(sm[warp], lane, ld);
#pragma unroll
        for (int r = 0; r < R; r++) off[r] = off_next[r];
        __syncwarp();
        if (t + 1 < ntiles) lc_gg_issue<TYPE, R>(wr, row_bytes, t + 1, lane, ld, off_next);
        const int sb = (t << 5) + lane;
        if (sb >= nsb) continue; /* the last tile of a short row */
        lc_gg_sub<TYPE> st[R];
#pragma unroll
        for (int r = 0; r < R; r++) st[r].prep(sm[warp][r], off[r] + bo, j);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float q[R][16], a[R], b[R];
#pragma unroll
            for (int r = 0; r < R; r++) st[r].half(sm[warp][r], h, q[r], a[r], b[r]);
#pragma unroll
            for (int m = 0; m < M; m++) {
                const T *xp = x + (size_t)m * K + (size_t)sb * 32 + h * 16;
                float xf[16];
                lc_unpack8<T>(lc_ldg16(xp), xf);
                lc_unpack8<T>(lc_ldg16(xp + 8), xf + 8);
                float xs = 0.0f;
                if constexpr (lc_gg_sub<TYPE>::AFFINE) {
#pragma unroll
                    for (int e = 0; e < 16; e++) xs += xf[e];
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float p = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; e++) p = fmaf(q[r][e], xf[e], p);
                    acc[r][m] = lc_gg_sub<TYPE>::AFFINE ? fmaf(a[r], p, fmaf(b[r], xs, acc[r][m]))
                                                        : fmaf(a[r], p, acc[r][m]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int n = n0 + r;
            if (n >= rows) break;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const size_t i = (size_t)m * ldy + n;
                if (out_f32) static_cast<float *>(y)[i] = acc[r][m];
                else static_cast<T *>(y)[i] = lc_from_f<T>(acc[r][m]);
            }
        }
    }
}

template <typename T, int TYPE, int M>
static cudaError_t lc_gg_gemv_m(const loom_cuda_qseg *sg, int K, const void *x, void *y, int ldy,
                                int out_f32, cudaStream_t s) {
    /* rows per warp: more reuse each x load (which M multiplies), fewer keep
     * the R x 16 codes and R x M sums in registers */
    constexpr int R = M <= 4 ? 2 : 4;
    const int rows_per_cta = LC_GG_WARPS * R;
    const unsigned grid = (unsigned)((sg->rows + rows_per_cta - 1) / rows_per_cta);
    return lc_launch(lc_gguf_gemv_kernel<T, TYPE, M, R>, dim3(grid), dim3(LC_GG_WARPS * 32), 0, s,
                     static_cast<const T *>(x), static_cast<const uint8_t *>(sg->data), sg->rows,
                     K, y, ldy, out_f32,
                     lc_weight_prefetch((size_t)sg->rows * (size_t)(K / lc_gt<TYPE>::ELEMS) * lc_gt<TYPE>::BB));
}

template <typename T, int TYPE>
static cudaError_t lc_gg_gemv_t(int M, const loom_cuda_qseg *sg, int K, const void *x, void *y,
                                int ldy, int out_f32, cudaStream_t s) {
    switch (M) {
    case 1: return lc_gg_gemv_m<T, TYPE, 1>(sg, K, x, y, ldy, out_f32, s);
    case 2: return lc_gg_gemv_m<T, TYPE, 2>(sg, K, x, y, ldy, out_f32, s);
    case 3: return lc_gg_gemv_m<T, TYPE, 3>(sg, K, x, y, ldy, out_f32, s);
    case 4: return lc_gg_gemv_m<T, TYPE, 4>(sg, K, x, y, ldy, out_f32, s);
    case 5: return lc_gg_gemv_m<T, TYPE, 5>(sg, K, x, y, ldy, out_f32, s);
    case 6: return lc_gg_gemv_m<T, TYPE, 6>(sg, K, x, y, ldy, out_f32, s);
    case 7: return lc_gg_gemv_m<T, TYPE, 7>(sg, K, x, y, ldy, out_f32, s);
    case 8: return lc_gg_gemv_m<T, TYPE, 8>(sg, K, x, y, ldy, out_f32, s);
    default: return cudaErrorInvalidValue;
    }
}

template <typename T>
static cudaError_t lc_gg_gemv_seg(int M, const loom_cuda_qseg *sg, int K, const void *x, void *y,
                                  int ldy, int out_f32, cudaStream_t s) {
    switch (sg->type) {
    case LOOM_CUDA_GGUF_Q4_0: return lc_gg_gemv_t<T, LOOM_CUDA_GGUF_Q4_0>(M, sg, K, x, y, ldy, out_f32, s);
    case LOOM_CUDA_GGUF_Q4_1: return lc_gg_gemv_t<T, LOOM_CUDA_GGUF_Q4_1>(M, sg, K, x, y, ldy, out_f32, s);
    case LOOM_CUDA_GGUF_Q8_0: return lc_gg_gemv_t<T, LOOM_CUDA_GGUF_Q8_0>(M, sg, K, x, y, ldy, out_f32, s);
    case LOOM_CUDA_GGUF_Q4_K: return lc_gg_gemv_t<T, LOOM_CUDA_GGUF_Q4_K>(M, sg, K, x, y, ldy, out_f32, s);
    case LOOM_CUDA_GGUF_Q6_K: return lc_gg_gemv_t<T, LOOM_CUDA_GGUF_Q6_K>(M, sg, K, x, y, ldy, out_f32, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t lc_gguf_gemv(loom_cuda_dt dt, int out_f32, int M, const loom_cuda_qweight *w,
                                    const void *x, void *y, cudaStream_t s) {
    if (M < 1 || M > LC_QGEMV_MAX_M || !loom_cuda_qweight_valid(w, NULL, 0))
        return cudaErrorInvalidValue;
    const size_t yel = out_f32 ? 4 : 2;
    int row0 = 0; /* the segment's first output column */
    for (int i = 0; i < w->nseg; i++) {
        const loom_cuda_qseg *sg = &w->seg[i];
        void *ys = static_cast<uint8_t *>(y) + (size_t)row0 * yel;
        cudaError_t e = dt == LOOM_CUDA_F16
                            ? lc_gg_gemv_seg<__half>(M, sg, w->K, x, ys, w->N, out_f32, s)
                            : lc_gg_gemv_seg<__nv_bfloat16>(M, sg, w->K, x, ys, w->N, out_f32, s);
        if (e != cudaSuccess) return e;
        row0 += sg->rows;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------- dequantize to dt */

/* out (rows, K) dt = the segment's weights. One warp per (row, tile), grid
 * stride; lane l writes the 32 weights of sub-block 32 t + l. */
template <typename T, int TYPE>
__global__ void __launch_bounds__(LC_GG_WARPS * 32)
    lc_gguf_dequant_kernel(const uint8_t *__restrict__ wd, int rows, int K, T *__restrict__ out) {
    using G = lc_gt<TYPE>;
    __shared__ __align__(16) uint32_t sm[LC_GG_WARPS][1][G::SM16 * 4];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t row_bytes = (size_t)(K / G::ELEMS) * G::BB;
    const int nsb = K >> 5, ntiles = (nsb + 31) >> 5;
    const int bo = (lane / G::SUBS) * G::BB, j = lane % G::SUBS;
    const size_t items = (size_t)rows * (size_t)ntiles;
    for (size_t it = (size_t)blockIdx.x * LC_GG_WARPS + warp; it < items;
         it += (size_t)gridDim.x * LC_GG_WARPS) {
        const size_t n = it / (size_t)ntiles;
        const int t = (int)(it % (size_t)ntiles);
        const uint8_t *wr[1] = {wd + n * row_bytes};
        uint4 ld[1][G::LD];
        int off[1];
        lc_gg_issue<TYPE, 1>(wr, row_bytes, t, lane, ld, off);
        __syncwarp(); /* every lane is done with the previous item */
        lc_gg_stage<TYPE, 1>(sm[warp], lane, ld);
        __syncwarp();
        const int sb = (t << 5) + lane;
        if (sb >= nsb) continue;
        lc_gg_sub<TYPE> st;
        st.prep(sm[warp][0], off[0] + bo, j);
        T *o = out + n * (size_t)K + (size_t)sb * 32;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float q[16], a, b;
            st.half(sm[warp][0], h, q, a, b);
#pragma unroll
            for (int e = 0; e < 16; e++) q[e] = fmaf(q[e], a, b);
            lc_stg16(o + 16 * h, lc_pack8<T>(q));
            lc_stg16(o + 16 * h + 8, lc_pack8<T>(q + 8));
        }
    }
}

template <typename T, int TYPE>
static cudaError_t lc_gg_dequant_t(const loom_cuda_qseg *sg, int K, T *out, cudaStream_t s) {
    const size_t items = (size_t)sg->rows * (size_t)((K / 32 + 31) / 32);
    size_t blocks = (items + LC_GG_WARPS - 1) / LC_GG_WARPS;
    if (blocks > 132 * 16) blocks = 132 * 16; /* grid-stride beyond ~16 waves of CTAs */
    return lc_launch(lc_gguf_dequant_kernel<T, TYPE>, dim3((unsigned)blocks),
                     dim3(LC_GG_WARPS * 32), 0, s, static_cast<const uint8_t *>(sg->data),
                     sg->rows, K, out);
}

template <typename T>
static cudaError_t lc_gg_dequant_seg(const loom_cuda_qseg *sg, int K, T *out, cudaStream_t s) {
    switch (sg->type) {
    case LOOM_CUDA_GGUF_Q4_0: return lc_gg_dequant_t<T, LOOM_CUDA_GGUF_Q4_0>(sg, K, out, s);
    case LOOM_CUDA_GGUF_Q4_1: return lc_gg_dequant_t<T, LOOM_CUDA_GGUF_Q4_1>(sg, K, out, s);
    case LOOM_CUDA_GGUF_Q8_0: return lc_gg_dequant_t<T, LOOM_CUDA_GGUF_Q8_0>(sg, K, out, s);
    case LOOM_CUDA_GGUF_Q4_K: return lc_gg_dequant_t<T, LOOM_CUDA_GGUF_Q4_K>(sg, K, out, s);
    case LOOM_CUDA_GGUF_Q6_K: return lc_gg_dequant_t<T, LOOM_CUDA_GGUF_Q6_K>(sg, K, out, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t lc_gguf_dequant(loom_cuda_dt dt, const loom_cuda_qweight *w, void *out,
                                       cudaStream_t s) {
    if (!loom_cuda_qweight_valid(w, NULL, 0)) return cudaErrorInvalidValue;
    size_t row0 = 0;
    for (int i = 0; i < w->nseg; i++) {
        const loom_cuda_qseg *sg = &w->seg[i];
        cudaError_t e = cudaErrorInvalidValue;
        LOOM_CUDA_DISPATCH_DT(dt, {
            e = lc_gg_dequant_seg<E>(sg, w->K, static_cast<E *>(out) + row0 * (size_t)w->K, s);
        });
        if (e != cudaSuccess) return e;
        row0 += (size_t)sg->rows;
    }
    return cudaSuccess;
}
