/*
 * tests/common/fmt_ref.h — float64 references for the number formats of
 * formats/, written from the formats' definitions and sharing no code with
 * them (no bit manipulation of float32: values are built with ldexp and
 * rounded by the FPU in double), so a test that compares formats/ or a
 * kernel against these checks the codec, not a copy of it.
 *
 *   fr_e4m3_value(c)   OCP E4M3 "fn" code c (bias 7, 3 mantissa bits, no
 *                      infinities; S.1111.111 is NaN, with its sign)
 *   fr_e4m3_code(x)    the code nearest x, ties to the even code; |x| >= 448
 *                      and +-inf saturate to +-448; NaN -> S.1111.111
 *   fr_f16_value(h)    IEEE binary16 bits h
 *
 * Header-only; tests include it by relative path.
 */
#ifndef LOOM_TESTS_FMT_REF_H
#define LOOM_TESTS_FMT_REF_H

#include <math.h>
#include <stdint.h>

static inline double fr_e4m3_value(int c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return (c & 0x80) ? -NAN : NAN;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (c & 0x80) ? -v : v;
}

static inline int fr_e4m3_code(double x) {
    const int sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7f;
    const double a = fabs(x);
    if (a >= 448.0) return sign | 0x7e;
    /* codes of a's binade [2^ex, 2^(ex+1)) are 2^(ex-3) apart (2^-9 below
     * 2^-6): q = a / that step, rounded to nearest even by the FPU */
    int e;
    frexp(a, &e);
    int ex = e - 1 < -6 ? -6 : e - 1;
    double q = nearbyint(ldexp(a, 3 - ex));
    if (q == 16) q = 8, ex++; /* rounded up into the next binade */
    return sign | (q < 8 ? (int)q : (ex + 7) * 8 + (int)q - 8);
}

static inline double fr_f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

#endif
