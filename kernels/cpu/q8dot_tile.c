/*
 * kernels/cpu/q8dot_tile.c — the block-exact kernels of q8dot.h on AVX-512
 * VNNI for every block type (q4_0, q4_1, q5_0, q8_0, q4_k, q5_k, q6_k):
 * the 16-row tiles, and the row, pair, quad and group kernels of those
 * types on that set, which give the tiles' bits (q8dot.h says the
 * arithmetic). Built with the vnni flags; q8dot.c calls it only on a CPU
 * that has them.
 *
 * A tile holds, per block of 32 columns, LOOM_CPU_Q8_TILE_BLOCK bytes:
 *   codes  8 vectors of 64 bytes: vector j, 32-bit lane r = row r's
 *          codes 4j..4j+3 (unsigned), so one vpdpbusd with the token's
 *          codes 4j..4j+3 broadcast dots 4 columns of all 16 rows;
 *   d      16 floats, row r's scale (q4_k / q5_k: the sub-block's d sc;
 *          q6_k: the super-block's d);
 *   m      16 floats, row r's offset (q4_1's m; q4_k's / q5_k's dmin mn,
 *          subtracted; 0 for the others); q6_k: int32, the first half's
 *          scale;
 *   s1     q6_k: 16 int32, the second half's scale.
 * A k-quant super-block is 8 such blocks.
 */
#define QD_AVX512 1
#include "q8dot_codes.h"

#include <math.h>


enum { QT_D = 512, QT_M = 576, QT_S1 = 640 };

/* q4_k and q5_k: super-blocks of 8 sub-blocks, each w = (d sc) c - dmin mn */
QD_INLINE int qt_is_k(const int kind) { return kind == LOOM_CPU_Q8_Q4_K || kind == LOOM_CPU_Q8_Q5_K; }

/* q6_k: super-blocks of 8 sub-blocks, w = d sc (c - 32), sc an int8 a half
 * of 16 */
QD_INLINE int qt_is_6(const int kind) { return kind == LOOM_CPU_Q8_Q6_K; }

/* The offset's sign in the result: q4_1 adds m s, q4_k and q5_k subtract
 * (dmin mn) s, the others have none. */
QD_INLINE int qt_off_sign(const int kind) {
    return kind == LOOM_CPU_Q8_Q4_1 ? 1 : qt_is_k(kind) ? -1 : 0;
}

/* Bytes of one block (a k-quant's: one super-block). */
QD_INLINE size_t qt_block_bytes(const int kind) {
    switch (kind) {
    case LOOM_CPU_Q8_Q4_K: return LOOM_GGUF_Q4_K_BYTES;
    case LOOM_CPU_Q8_Q5_K: return LOOM_GGUF_Q5_K_BYTES;
    case LOOM_CPU_Q8_Q6_K: return LOOM_GGUF_Q6_K_BYTES;
    case LOOM_CPU_Q8_Q4_0: return LOOM_GGUF_Q4_0_BYTES;
    case LOOM_CPU_Q8_Q4_1: return LOOM_GGUF_Q4_1_BYTES;
    case LOOM_CPU_Q8_Q5_0: return LOOM_GGUF_Q5_0_BYTES;
    default: return LOOM_GGUF_Q8_0_BYTES;
    }
}

/* The zero z of a kind's unsigned codes: w = d (c - z) (+ m for q4_1). */
QD_INLINE int qt_zero(const int kind) {
    switch (kind) {
    case LOOM_CPU_Q8_Q4_0: return 8;
    case LOOM_CPU_Q8_Q4_1: case LOOM_CPU_Q8_Q4_K: case LOOM_CPU_Q8_Q5_K: return 0;
    case LOOM_CPU_Q8_Q5_0: return 16;
    case LOOM_CPU_Q8_Q6_K: return 32;
    default: return 128;
    }
}

/* A block's 32 codes, unsigned, in element order. */
QD_INLINE __m256i qt_codes(const uint8_t *blk, const int kind) {
    switch (kind) {
    case LOOM_CPU_Q8_Q4_0: return qd_nibbles16(blk + 2);
    case LOOM_CPU_Q8_Q4_1: return qd_nibbles16(blk + 4);
    case LOOM_CPU_Q8_Q5_0:
        return _mm256_or_si256(qd_nibbles16(blk + LOOM_GGUF_Q5_0_QS), qd_q5_0_bits(blk + LOOM_GGUF_Q5_0_QH));
    default: /* int8 codes + 128 */
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    }
}

QD_INLINE float qt_offset(const uint8_t *blk, const int kind) {
    return kind == LOOM_CPU_Q8_Q4_1 ? qd_f16(blk + 2) : 0.0f;
}

/* Sub-block j's 32 codes of a q4_k / q5_k super-block, unsigned. */
QD_INLINE __m256i qt_k_codes(const uint8_t *sb, const int j, const int kind) {
    const int q5 = kind == LOOM_CPU_Q8_Q5_K;
    const __m256i qh = q5 ? qd_load(sb + LOOM_GGUF_Q5_K_QH) : _mm256_setzero_si256();
    __m256i lo, hi;
    qd_qk_codes(sb, j / 2, qh, q5, &lo, &hi);
    return j & 1 ? hi : lo;
}

/* Prefetch, for each of the 16 rows at `stride` from `next`, the cache
 * lines of bytes [from, to). */
QD_INLINE void qt_prefetch(const uint8_t *next, size_t stride, size_t from, size_t to) {
    for (int r = 0; r < LOOM_CPU_Q8_TILE; r++) {
        const uint8_t *p = next + (size_t)r * stride;
        for (size_t o = from; o < to; o += 64) __builtin_prefetch(p + o, 0, 1);
        __builtin_prefetch(p + to - 1, 0, 1);
    }
}

/* ------------------------------------------------------------ the tile */

/* z[k] holds rows 2k (lanes 0..7) and 2k + 1 (lanes 8..15), 8 words of
 * codes each; afterwards z[j] holds word j of rows 0..15. Three rounds of
 * two-source permutes, each swapping one bit of the vector index with one
 * bit of the word index (the last also puts the rows in lane order). */
QD_INLINE void qt_transpose(__m512i z[8]) {
    static const int32_t ix[3][2][16] = {
        {{0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30},
         {1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31}},
        {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
         {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
         {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}}};
    for (int s = 0; s < 3; s++) {
        const __m512i i0 = _mm512_loadu_si512(ix[s][0]), i1 = _mm512_loadu_si512(ix[s][1]);
        const int bit = 1 << s;
        for (int k = 0; k < 8; k++) {
            if (k & bit) continue;
            const __m512i a = z[k], b = z[k | bit];
            z[k] = _mm512_permutex2var_epi32(a, i0, b);
            z[k | bit] = _mm512_permutex2var_epi32(a, i1, b);
        }
    }
}

/* Byte offsets of the 16 rows at `stride` (a tile's row stride is below
 * LOOM_CPU_Q8_TILE_MAX_STRIDE, so 15 strides fit an int32). */
QD_INLINE __m512i qt_row_starts(const size_t stride) {
    const __m512i rows = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_mullo_epi32(rows, _mm512_set1_epi32((int)stride));
}

/* The 16 rows' 32-bit words at byte `off` of their blocks at `base`
 * (rows past `live` read nothing and give 0). */
QD_INLINE __m512i qt_words(const uint8_t *base, const __m512i at, const __mmask16 live, const size_t off) {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, at, base + off, 1);
}

QD_INLINE __m512i qt_bits(const __m512i w, const int shift, const int mask) {
    return _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_set1_epi32(shift)), _mm512_set1_epi32(mask));
}

/* Pack rows [0, nr) of a tile. `next` (or NULL): the first of 16 rows at
 * the same stride that the caller packs next, prefetched a block at a time
 * (each cache line once: where a block's last byte enters a new one) so
 * that they arrive while this tile is dotted — 16 row streams are more
 * than the hardware prefetcher keeps ahead of one core. */
QD_INLINE void qt_pack(const uint8_t *row0, size_t stride, int nr, int64_t K, const uint8_t *next,
                       void *tile, const int kind) {
    const size_t bb = qt_block_bytes(kind);
    const int64_t nb = K / 32;
    /* the 16 rows' block starts; the scales come in one gather (a 32-bit
     * word at each start: d, and q4_1's m above it) */
    const __m512i at = qt_row_starts(stride);
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    uint8_t *t = tile;
    for (int64_t b = 0; b < nb; b++, t += LOOM_CPU_Q8_TILE_BLOCK) {
        if (next)
            for (int r = 0; r < LOOM_CPU_Q8_TILE; r++) {
                /* the line of the block's last byte, where it is not the
                 * previous block's (bb < 64: at most one line is new) */
                const uint8_t *row = next + (size_t)r * stride, *e = row + (size_t)(b + 1) * bb - 1;
                if (b == 0) __builtin_prefetch(row, 0, 1);
                if (b == 0 || (uintptr_t)e / 64 != (uintptr_t)(e - bb) / 64) __builtin_prefetch(e, 0, 1);
            }
        const uint8_t *base = row0 + (size_t)b * bb;
        __m512i z[8];
        for (int k = 0; k < 8; k++) {
            __m256i c[2];
            for (int h = 0; h < 2; h++) {
                const int r = 2 * k + h;
                c[h] = r < nr ? qt_codes(base + (size_t)r * stride, kind) : _mm256_setzero_si256();
            }
            z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(c[0]), c[1], 1);
        }
        qt_transpose(z);
        for (int j = 0; j < 8; j++) _mm512_storeu_si512(t + 64 * j, z[j]);
        const __m512i dm = qt_words(base, at, live, 0);
        _mm512_storeu_ps(t + QT_D, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        _mm512_storeu_ps(t + QT_M, kind == LOOM_CPU_Q8_Q4_1
                                       ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)))
                                       : _mm512_setzero_ps());
    }
}

/* A q4_k / q5_k super-block's scales for 16 rows at once: sub-block j's
 * d sc and dmin mn (loom_q4k_scale_min's fields, the same products) into
 * tile block j's d and m. One gather a word of the 12 scale bytes and a
 * few vector ops a sub-block serve all 16 rows: at batch 1 a row-by-row
 * scalar unpack would cost more than the tile's dots. */
QD_INLINE void qt_k_scales(const uint8_t *base, const __m512i at, const __mmask16 live, uint8_t *t) {
    const __m512i dm = qt_words(base, at, live, 0);
    const __m512i s0 = qt_words(base, at, live, LOOM_GGUF_Q4_K_SCALES);
    const __m512i s1 = qt_words(base, at, live, LOOM_GGUF_Q4_K_SCALES + 4);
    const __m512i s2 = qt_words(base, at, live, LOOM_GGUF_Q4_K_SCALES + 8);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    for (int j = 0; j < 8; j++) {
        __m512i sc, mn;
        if (j < 4) { /* bytes j and j + 4, low 6 bits */
            sc = qt_bits(s0, 8 * j, 63);
            mn = qt_bits(s1, 8 * j, 63);
        } else { /* byte j + 4's nibbles, the top 2 bits of bytes j - 4 and j above them */
            const int i = j - 4;
            sc = _mm512_or_si512(qt_bits(s2, 8 * i, 15), _mm512_slli_epi32(qt_bits(s0, 8 * i + 6, 3), 4));
            mn = _mm512_or_si512(qt_bits(s2, 8 * i + 4, 15), _mm512_slli_epi32(qt_bits(s1, 8 * i + 6, 3), 4));
        }
        uint8_t *tj = t + j * LOOM_CPU_Q8_TILE_BLOCK;
        _mm512_storeu_ps(tj + QT_D, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        _mm512_storeu_ps(tj + QT_M, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
    }
}

/* A q6_k super-block's scales for 16 rows at once: its d into every tile
 * block, and sub-block j's two int8 scales (bytes 2j and 2j + 1 of the 16,
 * loom_q6k_sub_at) into block j's two halves. */
QD_INLINE void qt_6_scales(const uint8_t *base, const __m512i at, const __mmask16 live, uint8_t *t) {
    /* d is the upper half of the word 2 bytes before it: a word at d would
     * read past the last block of a row */
    const __m512i dw = qt_words(base, at, live, LOOM_GGUF_Q6_K_D - 2);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dw, 16)));
    for (int q = 0; q < 4; q++) {
        const __m512i w = qt_words(base, at, live, (size_t)loom_q6k_sub_at(2 * q).sc);
        for (int h = 0; h < 2; h++) { /* sub-block 2q + h: bytes 2h, 2h + 1 of w, sign-extended */
            uint8_t *tj = t + (2 * q + h) * LOOM_CPU_Q8_TILE_BLOCK;
            const __m512i s0 = _mm512_sllv_epi32(w, _mm512_set1_epi32(24 - 16 * h));
            const __m512i s1 = _mm512_sllv_epi32(w, _mm512_set1_epi32(16 - 16 * h));
            _mm512_storeu_ps(tj + QT_D, d);
            _mm512_storeu_si512(tj + QT_M, _mm512_srai_epi32(s0, 24));
            _mm512_storeu_si512(tj + QT_S1, _mm512_srai_epi32(s1, 24));
        }
    }
}

/* Pack rows [0, nr) of a k-quant tile: each super-block's 8 sub-blocks
 * become 8 tile blocks; `next` as qt_pack's, a super-block at a time. */
QD_INLINE void qt_pack_k(const uint8_t *row0, size_t stride, int nr, int64_t K, const uint8_t *next,
                         void *tile, const int kind) {
    const size_t bb = qt_block_bytes(kind);
    const __m512i at = qt_row_starts(stride);
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    uint8_t *t = tile;
    for (int64_t sb = 0; sb < K / 256; sb++, t += 8 * LOOM_CPU_Q8_TILE_BLOCK) {
        const uint8_t *base = row0 + (size_t)sb * bb;
        if (next) qt_prefetch(next, stride, (size_t)sb * bb, (size_t)(sb + 1) * bb);
        if (qt_is_6(kind)) qt_6_scales(base, at, live, t);
        else qt_k_scales(base, at, live, t);
        for (int j = 0; j < 8; j++) {
            __m512i z[8];
            for (int k = 0; k < 8; k++) {
                __m256i cd[2];
                for (int h = 0; h < 2; h++) {
                    const int r = 2 * k + h;
                    const uint8_t *rb = base + (size_t)r * stride;
                    cd[h] = r >= nr            ? _mm256_setzero_si256()
                            : qt_is_6(kind) ? qd_q6_k_ucodes(rb, loom_q6k_sub_at(j))
                                            : qt_k_codes(rb, j, kind);
                }
                z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(cd[0]), cd[1], 1);
            }
            qt_transpose(z);
            for (int w = 0; w < 8; w++) _mm512_storeu_si512(t + j * LOOM_CPU_Q8_TILE_BLOCK + 64 * w, z[w]);
        }
    }
}

/* G tokens (1 or 4) against a tile: per token two vpdpbusd chains, the
 * block's halves (words 0..3 and 4..7; integer sums, so any split is
 * exact), started at -z n (q6_k: -32 h of each half, each half then times
 * its scale), so that the sum is sum (c - z) q. */
QD_INLINE void qt_dot_g(const uint8_t *tile, int64_t K, const loom_cpu_q8 *x, const int G,
                        float *out, const int kind) {
    const int z = qt_zero(kind);
    __m512 acc[4], off[4];
    for (int t = 0; t < G; t++) acc[t] = off[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 32; b++, tile += LOOM_CPU_Q8_TILE_BLOCK) {
        __m512i w[8];
        for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(tile + 64 * j);
        const __m512 d = _mm512_loadu_ps(tile + QT_D);
        for (int t = 0; t < G; t++) {
            const uint8_t *q = (const uint8_t *)(x[t].q + 32 * b);
            __m512i s0, s1;
            if (qt_is_6(kind)) {
                s0 = _mm512_set1_epi32(-z * x[t].h[2 * b]);
                s1 = _mm512_set1_epi32(-z * x[t].h[2 * b + 1]);
            } else {
                s0 = z ? _mm512_set1_epi32(-z * x[t].n[b]) : _mm512_setzero_si512();
                s1 = _mm512_setzero_si512();
            }
            for (int j = 0; j < 4; j++) {
                int32_t q0, q1;
                memcpy(&q0, q + 4 * j, 4);
                memcpy(&q1, q + 4 * j + 16, 4);
                s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(q0));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 4], _mm512_set1_epi32(q1));
            }
            if (qt_is_6(kind)) { /* each half times its scale */
                s0 = _mm512_mullo_epi32(s0, _mm512_loadu_si512(tile + QT_M));
                s1 = _mm512_mullo_epi32(s1, _mm512_loadu_si512(tile + QT_S1));
            }
            const __m512i dot = _mm512_add_epi32(s0, s1);
            const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(x[t].d[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc[t]);
            if (qt_off_sign(kind))
                off[t] = _mm512_fmadd_ps(_mm512_loadu_ps(tile + QT_M), _mm512_set1_ps(x[t].s[b]), off[t]);
        }
    }
    for (int t = 0; t < G; t++)
        _mm512_storeu_ps(out + 16 * t, qt_off_sign(kind) > 0   ? _mm512_add_ps(acc[t], off[t])
                                       : qt_off_sign(kind) < 0 ? _mm512_sub_ps(acc[t], off[t])
                                                               : acc[t]);
}

QD_INLINE void qt_dot(const void *tile, int64_t K, const loom_cpu_q8 *x, int64_t mr, float *out,
                      const int kind) {
    int64_t t = 0;
    for (; t + 4 <= mr; t += 4) qt_dot_g(tile, K, x + t, 4, out + 16 * t, kind);
    for (; t < mr; t++) qt_dot_g(tile, K, x + t, 1, out + 16 * t, kind);
}

#define QT_KERNEL(name, kind)                                                                     \
    static void name##_pack(const uint8_t *row0, size_t stride, int nr, int64_t K,             \
                            const uint8_t *next, void *tile) {                                    \
        if (qt_is_k(kind) || qt_is_6(kind)) qt_pack_k(row0, stride, nr, K, next, tile, kind);     \
        else qt_pack(row0, stride, nr, K, next, tile, kind);                                      \
    }                                                                                             \
    static void name##_dot(const void *tile, int64_t K, const loom_cpu_q8 *x, int64_t mr,        \
                           float *out) {                                                          \
        qt_dot(tile, K, x, mr, out, kind);                                                        \
    }                                                                                             \
    static const loom_cpu_q8tile_kernel name = {name##_pack, name##_dot};
QT_KERNEL(qt_q4_0, LOOM_CPU_Q8_Q4_0)
QT_KERNEL(qt_q4_1, LOOM_CPU_Q8_Q4_1)
QT_KERNEL(qt_q5_0, LOOM_CPU_Q8_Q5_0)
QT_KERNEL(qt_q8_0, LOOM_CPU_Q8_Q8_0)
QT_KERNEL(qt_q4_k, LOOM_CPU_Q8_Q4_K)
QT_KERNEL(qt_q5_k, LOOM_CPU_Q8_Q5_K)
QT_KERNEL(qt_q6_k, LOOM_CPU_Q8_Q6_K)

/* ------------------------------------- one row at a time, the same bits */

/* Row . token for one row of K columns: block b of the token's codes at
 * xq + b * xstep bytes, its d, s and n at index b * sstep, its halves'
 * sums at 2 b sstep and 2 b sstep + 1. The tile dot's operations per
 * row, in its order. */
QD_INLINE float qt_row(const uint8_t *row, int64_t K, const int8_t *xq, size_t xstep, const float *xd,
                       const float *xs, const int32_t *xn, const int32_t *xh, size_t sstep, const int kind) {
    const size_t bb = qt_block_bytes(kind);
    const int z = qt_zero(kind), sign = qt_off_sign(kind);
    float acc = 0.0f, off = 0.0f, ka[8], kc[8];
    for (int64_t b = 0; b < K / 32; b++) {
        __m256i codes;
        float a, c = 0.0f;
        int32_t sc0 = 0, sc1 = 0;
        if (qt_is_6(kind)) {
            const uint8_t *sb = row + (size_t)(b / 8) * bb;
            const int s = (int)(b % 8), at = loom_q6k_sub_at(s).sc;
            codes = qd_q6_k_ucodes(sb, loom_q6k_sub_at(s));
            a = qd_f16(sb + LOOM_GGUF_Q6_K_D);
            sc0 = (int8_t)sb[at], sc1 = (int8_t)sb[at + 1];
        } else if (qt_is_k(kind)) {
            const uint8_t *sb = row + (size_t)(b / 8) * bb;
            if (b % 8 == 0) qd_qk_scales(sb, ka, kc);
            codes = qt_k_codes(sb, (int)(b % 8), kind);
            a = ka[b % 8], c = kc[b % 8];
        } else {
            const uint8_t *blk = row + (size_t)b * bb;
            codes = qt_codes(blk, kind);
            a = qd_f16(blk), c = qt_offset(blk, kind);
        }
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes,
                                              _mm256_loadu_si256((const __m256i *)(xq + b * xstep)));
        /* lanes 0..3 hold the first half's sums, 4..7 the second's */
        __m128i h0 = _mm256_castsi256_si128(p), h1 = _mm256_extracti128_si256(p, 1);
        h0 = _mm_add_epi32(h0, _mm_shuffle_epi32(h0, 0x4E));
        h0 = _mm_add_epi32(h0, _mm_shuffle_epi32(h0, 0xB1));
        h1 = _mm_add_epi32(h1, _mm_shuffle_epi32(h1, 0x4E));
        h1 = _mm_add_epi32(h1, _mm_shuffle_epi32(h1, 0xB1));
        const int32_t lo = _mm_cvtsi128_si32(h0), hi = _mm_cvtsi128_si32(h1);
        const int32_t *h = xh + 2 * b * sstep;
        const int32_t dot =
            qt_is_6(kind) ? sc0 * (lo - z * h[0]) + sc1 * (hi - z * h[1]) : lo + hi - z * xn[b * sstep];
        acc = fmaf((float)dot, a * xd[b * sstep], acc);
        if (sign) off = fmaf(c, xs[b * sstep], off);
    }
    return sign > 0 ? acc + off : sign < 0 ? acc - off : acc;
}

QD_INLINE float qt_row1(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, const int kind) {
    return qt_row(row, K, x->q, 32, x->d, x->s, x->n, x->h, 1, kind);
}

#define QT_ROWS(name, kind)                                                                        \
    static void name##_row(const uint8_t *row, int64_t K, const loom_cpu_q8 *x, int mr, float *out) { \
        for (int t = 0; t < mr; t++) out[t] = qt_row1(row, K, &x[t], kind);                        \
    }                                                                                              \
    static void name##_pair(const uint8_t *r0, const uint8_t *r1, int64_t K, const loom_cpu_q8 *x, \
                            float *out) {                                                          \
        out[0] = qt_row1(r0, K, x, kind);                                                          \
        out[1] = qt_row1(r1, K, x, kind);                                                          \
    }                                                                                              \
    static void name##_quad(const uint8_t *r0, size_t stride, int64_t K, const loom_cpu_q8 *x,    \
                            float *out) {                                                          \
        for (int r = 0; r < 4; r++) out[r] = qt_row1(r0 + (size_t)r * stride, K, x, kind);        \
    }                                                                                              \
    static void name##_group(const uint8_t *r0, size_t stride, int64_t nr, int64_t K,             \
                             const loom_cpu_q8g *x, int mr, float *out, int64_t ldo) {             \
        for (int64_t r = 0; r < nr; r++)                                                           \
            for (int t = 0; t < mr; t++)                                                           \
                out[r * ldo + t] = qt_row(r0 + (size_t)r * stride, K, x->q + 32 * t,               \
                                          32 * LOOM_CPU_Q8_G, x->d + t, x->s + t, x->n + t,        \
                                          x->h + 2 * t, LOOM_CPU_Q8_G, kind);                      \
    }
QT_ROWS(qt_q4_0, LOOM_CPU_Q8_Q4_0)
QT_ROWS(qt_q4_1, LOOM_CPU_Q8_Q4_1)
QT_ROWS(qt_q5_0, LOOM_CPU_Q8_Q5_0)
QT_ROWS(qt_q8_0, LOOM_CPU_Q8_Q8_0)
QT_ROWS(qt_q4_k, LOOM_CPU_Q8_Q4_K)
QT_ROWS(qt_q5_k, LOOM_CPU_Q8_Q5_K)
QT_ROWS(qt_q6_k, LOOM_CPU_Q8_Q6_K)

#define QT_KINDS(pre, post)                                                                        \
    {[LOOM_CPU_Q8_Q4_0] = pre##q4_0##post, [LOOM_CPU_Q8_Q4_1] = pre##q4_1##post,                  \
     [LOOM_CPU_Q8_Q5_0] = pre##q5_0##post, [LOOM_CPU_Q8_Q8_0] = pre##q8_0##post,                  \
     [LOOM_CPU_Q8_Q4_K] = pre##q4_k##post, [LOOM_CPU_Q8_Q5_K] = pre##q5_k##post,                  \
     [LOOM_CPU_Q8_Q6_K] = pre##q6_k##post}
const loom_cpu_q8exact loom_cpu_q8exact_vnni = {
    .row = QT_KINDS(qt_, _row),
    .pair = QT_KINDS(qt_, _pair),
    .quad = QT_KINDS(qt_, _quad),
    .group = QT_KINDS(qt_, _group),
    .tile = QT_KINDS(&qt_, ),
};
