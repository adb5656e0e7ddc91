/*
 * formats/gguf_blocks.h — the GGUF (GGML) block formats loom reads, in one
 * place: each block's size, where its scales and codes sit, and the scalar
 * decode of one block to float32. Plain C that a C compiler, a C++
 * compiler and nvcc all build: the geometry helpers are __host__ __device__
 * under nvcc, so the CUDA kernels (kernels/cuda/qgguf.cu) unpack Q4_K's
 * scales and find Q6_K's codes with the code the host uses; the block
 * decoders are host code only (formats/dequant.c's rows, the cpu backend's
 * quantized-linear decode, the tests' references), unrolled over a block's
 * sub-blocks so their shifts are constants the compiler vectorises with.
 *
 * Layouts (little-endian, packed, no padding):
 *   Q8_0 (32 elems, 34 B):   f16 d; int8 q[32]            x = d q
 *   Q4_0 (32 elems, 18 B):   f16 d; u8 qs[16]             x[j] = d (lo(qs[j]) - 8), x[j + 16] = d (hi(qs[j]) - 8)
 *   Q4_1 (32 elems, 20 B):   f16 d; f16 m; u8 qs[16]      x[j] = d lo(qs[j]) + m, x[j + 16] = d hi(qs[j]) + m
 *   Q5_0 (32 elems, 22 B):   f16 d; u8 qh[4]; u8 qs[16]   q[j] = lo(qs[j]) | bit j of qh << 4,
 *                            q[j + 16] = hi(qs[j]) | bit j + 16 of qh << 4 (qh little-endian): x = d (q - 16)
 *        LOOM_DTYPE_Q5_0. loom_gguf_q5_0_to_q8_0 rewrites a block as the Q8_0 block of
 *        the same values (exact: same d, codes -16..15 fit int8), for a backend with
 *        Q8_0 kernels and none for Q5_0 (cuda).
 *   Q4_K (256 elems, 144 B): f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
 *        8 sub-blocks of 32, each a 6-bit scale sc and 6-bit min mn packed
 *        in `scales` (loom_q4k_scale_min); sub-blocks 2i and 2i + 1 are the
 *        low and high nibbles of qs[32 i .. 32 i + 32): x = (d sc) q - dmin mn.
 *   Q5_K (256 elems, 176 B): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *        Q4_K's scales and nibbles plus a fifth bit: sub-block j's weight l
 *        has bit j of qh[l] as its bit 4, so q = nibble | bit << 4 in 0..31:
 *        x = (d sc) q - dmin mn.
 *   Q6_K (256 elems, 210 B): u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d
 *        q = 4 low bits from ql | 2 high bits from qh, minus 32; 8 sub-blocks
 *        of 32 (loom_q6k_sub_at), two int8 scales each (16 weights a
 *        scale): x = (d sc) q.
 * Every product above is exact in float32 (at most 23 significant bits);
 * Q4_1, Q4_K and Q5_K round once, at their one addition.
 *
 * Internal (never installed); plugins reach these through host->convert.
 */
#ifndef LOOM_FORMATS_GGUF_BLOCKS_H
#define LOOM_FORMATS_GGUF_BLOCKS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LOOM_GG_FN static __host__ __device__ __forceinline__
#else
#define LOOM_GG_FN static inline
#endif

/* ---------------------------------------------------------- geometry */

#define LOOM_GGUF_Q8_0_ELEMS 32
#define LOOM_GGUF_Q8_0_BYTES 34
#define LOOM_GGUF_Q4_0_ELEMS 32
#define LOOM_GGUF_Q4_0_BYTES 18
#define LOOM_GGUF_Q4_1_ELEMS 32
#define LOOM_GGUF_Q4_1_BYTES 20
#define LOOM_GGUF_Q5_0_ELEMS 32
#define LOOM_GGUF_Q5_0_BYTES 22
#define LOOM_GGUF_Q4_K_ELEMS 256
#define LOOM_GGUF_Q4_K_BYTES 144
#define LOOM_GGUF_Q5_K_ELEMS 256
#define LOOM_GGUF_Q5_K_BYTES 176
#define LOOM_GGUF_Q6_K_ELEMS 256
#define LOOM_GGUF_Q6_K_BYTES 210

/* Byte offsets inside a block. */
#define LOOM_GGUF_Q5_0_QH 2      /* the 4 fifth-bit bytes (32 bits, little-endian) */
#define LOOM_GGUF_Q5_0_QS 6      /* the 16 nibble bytes                */
#define LOOM_GGUF_Q4_K_SCALES 4  /* the 12 packed (scale, min) bytes (Q5_K: the same place) */
#define LOOM_GGUF_Q4_K_QS 16     /* the 128 nibble bytes               */
#define LOOM_GGUF_Q5_K_QH 16     /* the 32 fifth-bit bytes             */
#define LOOM_GGUF_Q5_K_QS 48     /* the 128 nibble bytes               */
#define LOOM_GGUF_Q6_K_D 208     /* the f16 d                          */

/* Byte k (0..11) of Q4_K's 12 scale bytes held as three little-endian
 * words s[0..2]. */
LOOM_GG_FN uint32_t loom_q4k_byte(const uint32_t *s, int k) {
    const uint32_t w = k < 4 ? s[0] : k < 8 ? s[1] : s[2];
    return (w >> ((k & 3) * 8)) & 0xFFu;
}

/* Q4_K sub-block j's (0..7) 6-bit scale and min (ggml's get_scale_min_k4):
 * j < 4 keeps the low 6 bits of bytes j and j + 4; j >= 4 joins a nibble
 * of byte j + 4 with the top 2 bits of bytes j - 4 (scale) and j (min). */
LOOM_GG_FN void loom_q4k_scale_min(const uint32_t *s, int j, uint32_t *sc, uint32_t *mn) {
    if (j < 4) {
        *sc = loom_q4k_byte(s, j) & 63u;
        *mn = loom_q4k_byte(s, j + 4) & 63u;
    } else {
        *sc = (loom_q4k_byte(s, j + 4) & 0xFu) | ((loom_q4k_byte(s, j - 4) >> 6) << 4);
        *mn = (loom_q4k_byte(s, j + 4) >> 4) | ((loom_q4k_byte(s, j) >> 6) << 4);
    }
}

/* Where Q6_K sub-block s (0..7: half hh = s / 4 of 128 weights, quarter qq
 * = s % 4 of it) keeps weight l (0..31), as byte offsets from the block:
 * low bits (ql[lo + l] >> nsh) & 0xF, high bits (qh[ho + l] >> hsh) & 3,
 * scale the int8 at sc + l / 16. */
typedef struct loom_q6k_sub {
    int lo, nsh;                /* low-nibble bytes, shift 0 or 4          */
    int ho, hsh;                /* high-bit bytes, shift 0, 2, 4 or 6      */
    int sc;                     /* first of its two int8 scales            */
} loom_q6k_sub;

LOOM_GG_FN loom_q6k_sub loom_q6k_sub_at(int s) {
    const int hh = s >> 2, qq = s & 3;
    loom_q6k_sub g;
    g.hsh = 2 * qq;
    g.sc = 192 + 8 * hh + 2 * qq;
    g.lo = 32 * (qq & 1) + 64 * hh;
    g.ho = 32 * hh + 128;
    g.nsh = 4 * (qq >> 1);
    return g;
}

#undef LOOM_GG_FN

/* ------------------------------------------------ block decoders (host) */

#if !defined(__CUDACC__)
#include "formats/half.h"

static inline float loom_gguf_f16(const uint8_t *p) {
    return loom_fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline void loom_gguf_dec_q8_0(const uint8_t *b, float *y) {
    const float d = loom_gguf_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
}

static inline void loom_gguf_dec_q4_0(const uint8_t *b, float *y) {
    const float d = loom_gguf_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((int)(qs[j] & 0xF) - 8);
        y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
    }
}

static inline void loom_gguf_dec_q4_1(const uint8_t *b, float *y) {
    const float d = loom_gguf_f16(b), m = loom_gguf_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0xF) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0 block b's 32 codes, 0..31 (x = d (q - 16)). */
static inline void loom_gguf_q5_0_codes(const uint8_t *b, int *q) {
    const uint8_t *h = b + LOOM_GGUF_Q5_0_QH, *qs = b + LOOM_GGUF_Q5_0_QS;
    const uint32_t qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

static inline void loom_gguf_dec_q5_0(const uint8_t *b, float *y) {
    const float d = loom_gguf_f16(b);
    int q[32];
    loom_gguf_q5_0_codes(b, q);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(q[j] - 16);
}

/* One Q5_0 block (22 B) as the Q8_0 block (34 B) of the same values. */
static inline void loom_gguf_q5_0_to_q8_0(const uint8_t *b, uint8_t *out) {
    int q[32];
    loom_gguf_q5_0_codes(b, q);
    out[0] = b[0];
    out[1] = b[1];
    for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)(q[j] - 16);
}

/* Q4_K's and Q5_K's 12 scale bytes (at the same place in both) as three
 * little-endian words, for loom_q4k_scale_min. */
static inline void loom_gguf_kscales(const uint8_t *b, uint32_t *s) {
    for (int i = 0; i < 3; i++) {
        const uint8_t *p = b + LOOM_GGUF_Q4_K_SCALES + 4 * i;
        s[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
}

/* Q4_K (q5 = 0) and Q5_K (q5 = 1): the same scales and nibbles, Q5_K's
 * fifth code bit of sub-block j in bit j of qh[l]. */
static inline void loom_gguf_dec_qk(const uint8_t *b, float *y, const int q5) {
    const float d = loom_gguf_f16(b), dmin = loom_gguf_f16(b + 2);
    uint32_t s[3];
    loom_gguf_kscales(b, s);
    const uint8_t *qh = b + LOOM_GGUF_Q5_K_QH;
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = b + (q5 ? LOOM_GGUF_Q5_K_QS : LOOM_GGUF_Q4_K_QS) + 32 * (j >> 1);
        const int sh = 4 * (j & 1);
        uint32_t sc, mn;
        loom_q4k_scale_min(s, j, &sc, &mn);
        const float a = d * (float)sc, c = dmin * (float)mn;
        for (int l = 0; l < 32; l++) {
            const int hb = q5 ? ((qh[l] >> j) & 1) << 4 : 0;
            y[32 * j + l] = a * (float)(((q[l] >> sh) & 0xF) | hb) - c;
        }
    }
}

static inline void loom_gguf_dec_q4_k(const uint8_t *b, float *y) { loom_gguf_dec_qk(b, y, 0); }

static inline void loom_gguf_dec_q5_k(const uint8_t *b, float *y) { loom_gguf_dec_qk(b, y, 1); }

static inline void loom_gguf_dec_q6_k(const uint8_t *b, float *y) {
    const float d = loom_gguf_f16(b + LOOM_GGUF_Q6_K_D);
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        /* unrolled: the sub-block's places and shifts are constants */
        const loom_q6k_sub g = loom_q6k_sub_at(s);
        for (int h = 0; h < 2; h++) {
            const float a = d * (float)(int8_t)b[g.sc + h];
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                const int q = (int)(((b[g.lo + l] >> g.nsh) & 0xF) | (((b[g.ho + l] >> g.hsh) & 3) << 4)) - 32;
                y[32 * s + l] = a * (float)q;
            }
        }
    }
}

#endif /* !__CUDACC__ */

#endif
