/*
 * kernels/cpu/vexp.h — e^x on 8 floats at once, for the CPU kernels whose
 * scalar libm expf calls were a visible share of a step: attention's
 * softmax (one exp a query and key) and SwiGLU (one a hidden unit).
 * Internal to kernels/cpu; loom_cpu_exp (cpu_kernels.h) exposes it to the
 * tests.
 *
 * Written with GCC vector extensions, not intrinsics: a caller built for
 * x86-64-v3/v4 (target_clones) gets one ymm register a vector, a baseline
 * build two SSE halves, another architecture its own SIMD or scalar code.
 *
 * Method (Cephes' expf, vectorised): n = round(x log2 e), r = x - n ln 2
 * in two parts (Cody-Waite, exact to float precision for |n| < 2^10),
 * e^r by a degree-7 polynomial on |r| <= ln2 / 2, times 2^n built in the
 * exponent bits. 2^n is applied as two factors 2^(n>>1) and 2^(n - n>>1),
 * each a normal float, so results that over- or underflow round as IEEE
 * multiplication does (to inf, to subnormals, to 0) instead of wrapping.
 * Accuracy: within 2 ulp of e^x (tests/kernels: test_cpu_kernels, exp);
 * e^0 = 1 exactly (the online softmax tests corr != 1), e^-inf = 0,
 * e^+inf = inf, NaN stays NaN.
 */
#ifndef LOOM_CPU_VEXP_H
#define LOOM_CPU_VEXP_H

#include <stdint.h>

typedef float loom_v8f __attribute__((vector_size(32)));
typedef int32_t loom_v8i __attribute__((vector_size(32)));

/* where m is all ones, a; else b (bitwise, so NaN passes through) */
static inline __attribute__((always_inline)) loom_v8f loom_v8_select(loom_v8i m, loom_v8f a,
                                                                     loom_v8f b) {
    return (loom_v8f)(((loom_v8i)a & m) | ((loom_v8i)b & ~m));
}

static inline __attribute__((always_inline)) loom_v8f loom_v8_exp(loom_v8f x) {
    /* e^-110 is below half the smallest subnormal and e^89 above FLT_MAX:
     * clamping there keeps n small enough for the two exponent factors
     * and changes no result */
    const loom_v8f lo = {-110.f, -110.f, -110.f, -110.f, -110.f, -110.f, -110.f, -110.f};
    const loom_v8f hi = {89.f, 89.f, 89.f, 89.f, 89.f, 89.f, 89.f, 89.f};
    x = loom_v8_select(x < lo, lo, x);
    x = loom_v8_select(x > hi, hi, x);
    /* round to nearest: adding 1.5 * 2^23 leaves no fraction bits */
    const float shifter = 12582912.0f;
    loom_v8f n = (x * 1.44269504088896341f + shifter) - shifter;
    loom_v8f r = x - n * 0.693359375f;  /* ln 2 = C1 + C2, C1 exact in 9 bits */
    r = r - n * -2.12194440e-4f;
    const loom_v8f r2 = r * r;
    loom_v8f p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    const loom_v8i ni = __builtin_convertvector(n, loom_v8i);
    const loom_v8i h = ni >> 1;
    const loom_v8f s1 = (loom_v8f)((h + 127) << 23), s2 = (loom_v8f)((ni - h + 127) << 23);
    return p * s1 * s2;
}

#endif
