/*
 * tests/kernels/test_cuda_e4m3.c — the FP8 KV codec the cuda kernels run
 * (formats/e4m3.h: plain C shared with the device code and the cpu
 * backend) against the float64 reference of tests/common/fmt_ref.h,
 * without CUDA or a GPU: the integer encoder the RoPE + KV-write kernel
 * runs must give the nearest code for every float32 (a sweep of every sign
 * / exponent / top-11-mantissa pattern with the low 12 bits at their
 * rounding edges, and random patterns), and the attention kernels' decode
 * (16-bit bit pattern, then one multiply by 2^120 (bf16) or 2^8 (f16), done
 * here in float32, which is exact) must give every finite code's value.
 * What is left to the device (tests/gpu/gpu_kernel_tests: "e4m3 ..."
 * checks) is that the GPU's bf16 / f16 multiply keeps the subnormal inputs
 * this relies on.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/fmt_ref.h"
#include "formats/e4m3.h"
#include "rng.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_encode(uint32_t u) {
    const uint32_t got = lc_e4m3_encode(u), want = (uint32_t)fr_e4m3_code((double)u2f(u));
    if (got != want)
        cr_assert_fail("float bits 0x%08x (%a): code 0x%02x, nearest code 0x%02x", u,
                       (double)u2f(u), got, want);
}

Test(cuda_e4m3, encoder_gives_the_nearest_code_on_every_code_and_edge) {
    /* every code's value (and NaN of either sign) round-trips */
    for (int c = 0; c < 256; c++) {
        const float v = (float)fr_e4m3_value(c);
        cr_assert_eq(lc_e4m3_encode(f2u(v)), (uint32_t)c, "code 0x%02x", c);
        if ((c & 0x7f) != 0x7f)
            cr_assert_eq(f2u(lc_e4m3_decode((uint32_t)c)), f2u(v), "code 0x%02x decodes", c);
    }
    /* specials */
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, -448.0f, 464.0f,
                        479.99f, 480.0f, 1e30f, 0x1p-10f, -0x1p-10f, 0x1.8p-9f, 0x1.8p-8f,
                        0x1p-149f, 0x1p-126f, 0x1.0001p-10f, 1.0625f, 1.1875f, -1.0625f};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) check_encode(f2u(sp[i]));
    /* every (sign, exponent, top 11 mantissa bits) with the low 12 bits at
     * the patterns rounding looks at (subnormal outputs shift up to 24) */
    static const uint32_t lows[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff, 0x400, 0xc00};
    for (uint32_t hi = 0; hi < (1u << 20); hi++)
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) check_encode(hi << 12 | lows[k]);
    /* random patterns, and random values in the range K/V take */
    test_rng r = rng_seeded("cuda_e4m3 encoder");
    for (int i = 0; i < (1 << 22); i++) check_encode((uint32_t)rng_next(&r));
    for (int i = 0; i < (1 << 20); i++) check_encode(f2u((float)(rng_normal(&r) * 4.0)));
}

/* Two codes as one PRMT places them: c0 in bits 8..15, c1 in 24..31. */
static uint32_t lanes(uint32_t c0, uint32_t c1) { return c0 << 8 | c1 << 24; }

Test(cuda_e4m3, decode_bits_give_every_code_value) {
    for (uint32_t c = 0; c < 256; c++) {
        const uint32_t c1 = (c * 37u + 11u) & 0xffu; /* another code in the other lane */
        const bool nan0 = (c & 0x7fu) == 0x7fu, nan1 = (c1 & 0x7fu) == 0x7fu;
        const uint32_t b = lc_e4m3_bf16_bits(lanes(c, c1)), h = lc_e4m3_f16_bits(lanes(c, c1));
        const uint32_t code[2] = {c, c1};
        const bool nan[2] = {nan0, nan1};
        for (int l = 0; l < 2; l++) {
            const uint16_t bl = (uint16_t)(b >> (16 * l)), hl = (uint16_t)(h >> (16 * l));
            /* bf16 -> float32 is a shift; the product is exact in float32
             * and representable in bf16 (low 16 bits zero) */
            const float vb = u2f((uint32_t)bl << 16) * LC_E4M3_BF16_SCALE;
            const double vh = fr_f16_value(hl) * LC_E4M3_F16_SCALE;
            cr_assert_eq(f2u(vb) & 0xffffu, 0u, "code 0x%02x: bf16 product not a bf16", code[l]);
            const double want = nan[l] ? ((code[l] & 0x80u) ? -480.0 : 480.0)
                                       : fr_e4m3_value((int)code[l]);
            cr_assert(vb == want && !signbit(vb) == !signbit(want),
                      "code 0x%02x lane %d: bf16 path %a, want %a", code[l], l, (double)vb, want);
            cr_assert(vh == want && !signbit(vh) == !signbit(want),
                      "code 0x%02x lane %d: f16 path %a, want %a", code[l], l, vh, want);
        }
    }
}
