/*
 * tests/quant/test_fp8.c — the FP8 E4M3 codec (formats/e4m3.h: what the
 * quantizer plugins write and every backend reads) and the cpu kernels'
 * E4M3 rows over it (loom_cpu_f32_to_e4m3 / _e4m3_to_f32 in
 * kernels/cpu/qlinear.c), against a float64 reference:
 * every one of the 256 codes decoded, every code re-encoded, every midpoint
 * between neighbours (ties to even), saturation at +-448, NaN, infinities,
 * signed zero, the subnormal range, random values and a strided sweep over
 * all float32 bit patterns.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "../../plugins/quantizer/common/qcommon.h"
#include "rng.h"
#include "qlinear.h"

/* float64 value of code c (NaN for S.1111.111). */
static double ref_decode(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (c & 0x80) ? -v : v;
}

/* Nearest code by brute force in float64; ties to the even code;
 * saturating; NaN -> 0x7f with the sign. */
static int ref_encode(double x) {
    int sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7f;
    double a = fabs(x);
    if (a >= 448.0) return sign | 0x7e;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs(a - ref_decode(c));
        if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
    }
    return sign | best;
}

/* One element through the kernels' rows (scale 1). */
static int row_encode(float f) {
    uint8_t q;
    loom_cpu_f32_to_e4m3(&q, &f, 1, 1.0f);
    return q;
}
static float row_decode(uint8_t c) {
    float f;
    loom_cpu_e4m3_to_f32(&f, &c, 1, 1.0f);
    return f;
}

static void check_both(float f, int want) {
    int a = loom_fp32_to_e4m3(f), b = row_encode(f);
    cr_assert_eq(a, want, "codec: %a -> 0x%02x, want 0x%02x", (double)f, a, want);
    cr_assert_eq(b, want, "kernel rows: %a -> 0x%02x, want 0x%02x", (double)f, b, want);
}

Test(fp8, decode_all_256_codes) {
    for (int c = 0; c < 256; c++) {
        double r = ref_decode(c);
        float a = loom_e4m3_to_fp32((uint8_t)c), b = row_decode((uint8_t)c);
        if (isnan(r)) {
            cr_assert(isnan(a) && isnan(b), "code 0x%02x must decode to NaN", c);
            cr_assert_eq(!!signbit(a), !!(c & 0x80));
            continue;
        }
        cr_assert_eq((double)a, r, "codec decode 0x%02x = %a, want %a", c, (double)a, r);
        cr_assert_eq((double)b, r, "kernel decode 0x%02x = %a, want %a", c, (double)b, r);
        cr_assert_eq(!!signbit(a), !!(c & 0x80), "sign of 0x%02x", c);
    }
    cr_assert_eq(ref_decode(0x7e), 448.0);
    cr_assert_eq(ref_decode(0x01), ldexp(1.0, -9));
}

Test(fp8, every_code_round_trips) {
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        check_both((float)ref_decode(c), c);
    }
}

Test(fp8, midpoints_round_to_even) {
    for (int c = 0; c < 0x7e; c++) {
        double mid = 0.5 * (ref_decode(c) + ref_decode(c + 1)); /* exact in float */
        int want = (c & 1) ? c + 1 : c;
        cr_assert_eq(ref_encode(mid), want);
        check_both((float)mid, want);
        check_both((float)-mid, want | 0x80);
        /* one float ulp either side leaves the tie */
        check_both(nextafterf((float)mid, 0.0f), c);
        check_both(nextafterf((float)mid, INFINITY), c + 1);
    }
}

Test(fp8, specials_saturate_and_nan) {
    check_both(448.0f, 0x7e);
    check_both(449.0f, 0x7e);
    check_both(464.0f, 0x7e);   /* would round to 480 = NaN code without saturation */
    check_both(1e30f, 0x7e);
    check_both(INFINITY, 0x7e);
    check_both(-INFINITY, 0xfe);
    check_both(-1e30f, 0xfe);
    check_both(NAN, 0x7f);
    check_both(-NAN, 0xff);
    check_both(0.0f, 0x00);
    check_both(-0.0f, 0x80);
    check_both(0x1p-10f, 0x00);        /* tie between 0 and 2^-9: even = 0     */
    check_both(0x1.8p-10f, 0x01);      /* 0.75 * 2^-9 rounds up               */
    check_both(0x1p-11f, 0x00);
    check_both(0x1p-140f, 0x00);       /* float32 subnormal                   */
    check_both(0x1.ep-7f, 0x08);       /* 7.5 * 2^-9: tie 7 | 8 -> 8 = 2^-6   */
    check_both(240.0f, ref_encode(240.0));
}

Test(fp8, random_values_match_float64_reference) {
    test_rng r = rng_seeded("fp8.random");
    for (int i = 0; i < 200000; i++) {
        double mag = ldexp(1.0, (int)rng_int(&r, 26) - 16) * (1.0 + rng_unif(&r));
        float f = (float)(rng_unif(&r) < 0.5 ? -mag : mag);
        check_both(f, ref_encode((double)f));
    }
}

Test(fp8, float32_bit_sweep_codecs_agree) {
    /* every 251st bit pattern (17 M values) : the codec and the rows agree; every
     * 64th of those also against the brute-force reference */
    uint64_t checked = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        int a = loom_fp32_to_e4m3(f), c = row_encode(f);
        if (a != c) cr_assert_fail("codecs differ at bits 0x%08x: 0x%02x vs 0x%02x", b, a, c);
        if ((checked++ & 63) == 0 && a != ref_encode((double)f))
            cr_assert_fail("bits 0x%08x (%a): 0x%02x, reference 0x%02x", b, (double)f, a,
                           ref_encode((double)f));
    }
}

Test(fp8, kernel_rows_with_scale) {
    test_rng r = rng_seeded("fp8.rows");
    float x[300], back[300];
    uint8_t q[300];
    for (int i = 0; i < 300; i++) x[i] = (float)(rng_normal(&r) * 3.0);
    float amax = 0;
    for (int i = 0; i < 300; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / 448.0f;
    loom_cpu_f32_to_e4m3(q, x, 300, 1.0f / scale);
    loom_cpu_e4m3_to_f32(back, q, 300, scale);
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(q[i], ref_encode((double)(x[i] * (1.0f / scale))));
        cr_assert_eq(back[i], (float)ref_decode(q[i]) * scale);
        /* relative error of a normal E4M3 value is at most 2^-4 */
        if (fabsf(x[i]) > scale * 0x1p-6f)
            cr_assert_leq(fabs((double)back[i] - x[i]), fabs(x[i]) * 0.0625 * 1.0001);
    }
}
