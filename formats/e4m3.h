/*
 * formats/e4m3.h — the OCP FP8 E4M3 ("fn") codec, in plain C that nvcc
 * (device code) and a C compiler both build, so the bits the GPU writes
 * and reads are the bits the host, the cpu backend, the quantizers and the
 * tests use: the one definition of E4M3 in the tree. Internal (never
 * installed); plugins built out of tree reach it through host->convert.
 *
 * Encoding (lc_e4m3_encode; loom_fp32_to_e4m3 takes a float) — OCP E4M3
 * "fn", round to nearest, ties to even; |x| >= 448 and +-inf
 * saturate to +-448 (0x7e / 0xfe); NaN -> S.1111.111 keeping its sign;
 * -0 -> 0x80; float32 subnormals -> signed zero. Not the hardware
 * conversion (cvt.rn.satfinite.e4m3x2.f32): cuda_fp8.hpp's own emulation
 * of it canonicalises NaN to +NaN (0x7f), where the cpu keeps the sign, so
 * the two are not bit-identical; an integer encoder is, by construction,
 * and costs nothing that matters in the RoPE + KV-write kernel.
 *
 * Decoding into bf16 / f16 without the conversion unit: a code's 7 low bits
 * (exponent e, mantissa m) shifted into the exponent and mantissa fields of
 * the 16-bit type give the code's value times a power of two, subnormal
 * codes included (they land on subnormals of the 16-bit type), and one
 * multiply (by 2^120 for bf16, 2^8 for f16; exact) restores it:
 *   bf16: bits = sign << 15 | (c & 0x7f) << 4  == value * 2^-120
 *   f16 : bits = sign << 15 | (c & 0x7f) << 7  == value * 2^-8
 * lc_e4m3_bf16_bits / lc_e4m3_f16_bits do the shifting for two codes at
 * once, each given at the top byte of its 16-bit lane (byte 1 and byte 3 of
 * a word: what one PRMT makes of two codes). Exact for every finite code;
 * the two NaN codes become +-480 (1.875 * 2^8) — the encoder only makes
 * them from NaN inputs, and a NaN in K or V has already poisoned the
 * step's attention on any backend.
 */
#ifndef LOOM_FORMATS_E4M3_H
#define LOOM_FORMATS_E4M3_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LC_E4M3_FN static __host__ __device__ __forceinline__
#else
#define LC_E4M3_FN static inline
#endif

/* The scale the 16-bit patterns below are off by (multiply to restore). */
#define LC_E4M3_BF16_SCALE 0x1p120f
#define LC_E4M3_F16_SCALE 256.0f

/* E4M3 code (low 8 bits) of the float32 with bits u. */
LC_E4M3_FN uint32_t lc_e4m3_encode(uint32_t u) {
    const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;  /* NaN               */
    if (a >= 0x43e00000u) return sign | 0x7eu; /* >= 448 saturates */
    const int e = (int)(a >> 23) - 127;
    if (e >= -6) {
        /* normal: 3 of 23 mantissa bits, round half to even; a carry runs
         * into the exponent field, which is the next binade */
        const uint32_t m = a & 0x7fffffu, keep = m >> 20, rem = m & 0xfffffu;
        uint32_t code = ((uint32_t)(e + 7) << 3) | keep;
        if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) code++;
        return sign | code;
    }
    if ((a >> 23) == 0) return sign; /* float32 subnormal: rounds to 0 */
    const uint32_t m24 = (a & 0x7fffffu) | 0x800000u;
    const int shift = 14 - e; /* subnormal code = value * 2^9 = m24 >> shift, >= 21 */
    if (shift > 24) return sign;
    uint32_t q = m24 >> shift;
    const uint32_t rem = m24 & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | q;
}

/* The float32 value of E4M3 code c (low 8 bits): exact; the NaN codes
 * (S.1111.111) give NaN with their sign. */
LC_E4M3_FN float lc_e4m3_decode(uint32_t c) {
    const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 15u, m = c & 7u;
    uint32_t bits;
    if (e == 15u && m == 7u) {
        bits = sign | 0x7fc00000u;
    } else if (e == 0u) {
        /* subnormal: m * 2^-9, exact in float32 */
        union { float f; uint32_t u; } v = {(float)m * 0x1p-9f};
        bits = sign | v.u;
    } else {
        bits = sign | ((e + 120u) << 23) | (m << 20); /* rebias 7 -> 127 */
    }
    union { uint32_t u; float f; } r = {bits};
    return r.f;
}

/* The same codec on floats: the code of f, and the value of code c. */
LC_E4M3_FN uint8_t loom_fp32_to_e4m3(float f) {
    union { float f; uint32_t u; } v = {f};
    return (uint8_t)lc_e4m3_encode(v.u);
}
LC_E4M3_FN float loom_e4m3_to_fp32(uint8_t c) { return lc_e4m3_decode(c); }

/* t: two codes at bits 8..15 and 24..31 (other bits zero). Returns the two
 * lanes' 16-bit patterns, value * 2^-120 as bf16 (low lane = bits 8..15). */
LC_E4M3_FN uint32_t lc_e4m3_bf16_bits(uint32_t t) {
    return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 4);
}

/* The same for f16: value * 2^-8. */
LC_E4M3_FN uint32_t lc_e4m3_f16_bits(uint32_t t) {
    return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 1);
}

#undef LC_E4M3_FN
#endif
