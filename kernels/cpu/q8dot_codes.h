/*
 * kernels/cpu/q8dot_codes.h — a GGUF block's codes and scales as x86 vector
 * registers, shared by the kernels of q8dot_x86.h and q8dot_tile.c (each
 * includes it once per instruction set, with QD_AVX512 0 or 1 defined).
 * Codes come out unsigned, in element order.
 */
#ifndef LOOM_CPU_Q8DOT_CODES_H
#define LOOM_CPU_Q8DOT_CODES_H

#include "q8dot.h"

#include "formats/gguf_blocks.h"

#include <immintrin.h>
#include <string.h>

#ifndef QD_AVX512
#error "define QD_AVX512 (0 or 1) before including q8dot_codes.h"
#endif

#define QD_INLINE static inline __attribute__((always_inline))

QD_INLINE float qd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

QD_INLINE __m256i qd_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles first, then high ones (the
 * element order of a q4_0 / q4_1 block). */
QD_INLINE __m256i qd_nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* q5_0's fifth code bits: bit j of the 32 little-endian bits at p as bit 4
 * of byte j (element j), the rest 0. AVX-512 BW takes the bits as a byte
 * mask as they are; AVX2 gives each byte the byte of p that holds its bit
 * and compares that bit with itself. */
QD_INLINE __m256i qd_q5_0_bits(const uint8_t *p) {
    uint32_t h;
    memcpy(&h, p, 4);
#if QD_AVX512
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(0x10));
#else
    /* set1_epi32 repeats p's 4 bytes in both 128-bit lanes, which the
     * byte shuffle stays inside */
    const __m256i at = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)h),
                                           _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(at, bit), bit), _mm256_set1_epi8(0x10));
#endif
}

/* Bit j (0..7) of every byte of qh at bit 4, the rest 0 (q5_k's fifth
 * code bit of sub-block j). 16-bit shifts move both bytes of a lane alike;
 * shifting toward bit 4 keeps the wanted bit of the upper byte inside the
 * lane, and the mask drops what crossed from the other byte. */
QD_INLINE __m256i qd_q5_bit(__m256i qh, const int j) {
    const __m256i at = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(at, _mm256_set1_epi8(0x10));
}

/* A q4_k / q5_k super-block's 8 sub-block scales a[j] = d sc_j and
 * offsets c[j] = dmin mn_j (the row and group kernels' common start). */
QD_INLINE void qd_qk_scales(const uint8_t *blk, float *a, float *c) {
    const float d = qd_f16(blk), dmin = qd_f16(blk + 2);
    uint32_t sw[3];
    memcpy(sw, blk + LOOM_GGUF_Q4_K_SCALES, sizeof sw);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        uint32_t sc, mn;
        loom_q4k_scale_min(sw, j, &sc, &mn);
        a[j] = d * (float)sc;
        c[j] = dmin * (float)mn;
    }
}

/* Sub-blocks 2i (lo) and 2i + 1 (hi) of a q4_k (q5 = 0) / q5_k super-block
 * as unsigned codes, q5_k's bit 4 from qh (its 32 bytes, loaded once). */
QD_INLINE void qd_qk_codes(const uint8_t *blk, const int i, const __m256i qh, const int q5, __m256i *lo,
                           __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i raw = qd_load(blk + (q5 ? LOOM_GGUF_Q5_K_QS : LOOM_GGUF_Q4_K_QS) + 32 * i);
    *lo = _mm256_and_si256(raw, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if (q5) {
        *lo = _mm256_or_si256(*lo, qd_q5_bit(qh, 2 * i));
        *hi = _mm256_or_si256(*hi, qd_q5_bit(qh, 2 * i + 1));
    }
}

/* Sub-block g of a q6_k super-block as unsigned codes 0..63: the low
 * nibble and two high bits loom_q6k_sub_at places. */
QD_INLINE __m256i qd_q6_k_ucodes(const uint8_t *blk, const loom_q6k_sub g) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m256i ql = qd_load(blk + g.lo), qh = qd_load(blk + g.ho);
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, g.nsh), m4);
    const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g.hsh), m2), 4);
    return _mm256_or_si256(lo, hi);
}

#endif
