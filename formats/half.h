/*
 * formats/half.h — scalar conversions between float32 and the 16-bit
 * float formats found in model files: IEEE binary16 ("f16", GGUF/GGML and
 * safetensors F16) and bfloat16 ("bf16", the top half of a float32).
 *
 * Header-only and dependency-free so loaders, CPU kernels and tests can share
 * one definition. All conversions are exact where the value is representable;
 * float32 -> 16-bit rounds to nearest, ties to even, overflows to infinity,
 * and keeps NaN a (quiet) NaN with the sign preserved. Not vectorised: the
 * hot loops that need speed convert whole rows in their own kernels.
 */
#ifndef LOOM_FORMATS_HALF_H
#define LOOM_FORMATS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t loom_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float loom_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* binary16 -> float32: exact for every input (subnormals, inf, NaN payload). */
static inline float loom_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) return loom_bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf / NaN */
    if (exp == 0) {
        /* zero or subnormal: value = mant * 2^-24, exact in float32 */
        float f = (float)mant * 0x1p-24f;
        return loom_bits_f32(loom_f32_bits(f) | sign);
    }
    return loom_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13)); /* rebias 15 -> 127 */
}

/* float32 -> binary16, round to nearest even. */
static inline uint16_t loom_fp32_to_fp16(float f) {
    uint32_t x = loom_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf or NaN (NaN stays NaN: force the quiet bit) */
        return (uint16_t)(sign | (x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {
        /* below the smallest normal 2^-14: result is a multiple of 2^-24.
         * Adding 0.5f (ulp 2^-24) lets the FPU do the round-to-even. */
        float r = loom_bits_f32(x) + 0.5f;
        return (uint16_t)(sign | (loom_f32_bits(r) - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000000u /* (15-127) << 23, rebias */ + 0xfffu + odd;
    return (uint16_t)(sign | (x >> 13));
}

/* bfloat16 -> float32: exact. */
static inline float loom_bf16_to_fp32(uint16_t b) { return loom_bits_f32((uint32_t)b << 16); }

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t loom_fp32_to_bf16(float f) {
    uint32_t x = loom_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
