/*
 * tests/kernels/test_cpu_q8dot.c — kernels/cpu/q8dot.h (GGUF weight rows
 * dotted with 8-bit block-quantized activations) against float64
 * references, for every block type (q4_0, q4_1, q5_0, q8_0, q4_k, q5_k, q6_k), every
 * instruction set this CPU runs (portable always; avx2, avx512,
 * avx512vnni where present), batch 1 (one row, two and four rows a call) and small batches
 * (1..4 tokens a call; one, two and four rows a call at one token), the group kernel (1..8
 * interleaved tokens, several rows; bit for bit the row kernel's results), on random blocks
 * (seed printed; LOOM_TEST_SEED replays).
 *
 * Two references a row must meet:
 *   exact   sum of w (formats/gguf_blocks.h's float decode) times the
 *           activation as quantized (d q), float64; tolerance 3e-6 of the
 *           sum of |terms| (only float32 rounding of scales and sums
 *           differs);
 *   float   sum of w times the float activation; the gap may be the
 *           activation rounding alone: sum of |w| d / 2 over the row (plus
 *           the exact tolerance).
 * 16-bit float rows (f16, bf16) against a float64 product likewise.
 * The quantizer: every code within [-127, 127], |x - d q| <= d / 2 (plus
 * float32 rounding), s = d sum(q).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf_blocks.h"
#include "formats/dtype.h"
#include "formats/half.h"
#include "q8dot.h"
#include "rng.h"

#define MAXK 2048

static void fini(void) { loom_cpu_q8_force_isa(NULL); }
TestSuite(q8dot, .fini = fini);

static const loom_dtype types[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_Q4_1, LOOM_DTYPE_Q5_0, LOOM_DTYPE_Q8_0,
                                   LOOM_DTYPE_Q4_K, LOOM_DTYPE_Q5_K, LOOM_DTYPE_Q6_K};
static const char *const isas[] = {"portable", "avx2", "avx512", "avx512vnni"};

static size_t blk_bytes(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_Q4_0: return LOOM_GGUF_Q4_0_BYTES;
    case LOOM_DTYPE_Q4_1: return LOOM_GGUF_Q4_1_BYTES;
    case LOOM_DTYPE_Q5_0: return LOOM_GGUF_Q5_0_BYTES;
    case LOOM_DTYPE_Q8_0: return LOOM_GGUF_Q8_0_BYTES;
    case LOOM_DTYPE_Q4_K: return LOOM_GGUF_Q4_K_BYTES;
    case LOOM_DTYPE_Q5_K: return LOOM_GGUF_Q5_K_BYTES;
    default: return LOOM_GGUF_Q6_K_BYTES;
    }
}
static int blk_elems(loom_dtype t) {
    return t == LOOM_DTYPE_Q4_K || t == LOOM_DTYPE_Q5_K || t == LOOM_DTYPE_Q6_K ? 256 : 32;
}

static void put_f16(uint8_t *p, double v) {
    uint16_t h = loom_fp32_to_fp16((float)v);
    memcpy(p, &h, 2);
}

/* A random row of K elements of type t: random codes, scales of the sizes
 * real files hold (signed where the format allows a sign). */
static void make_row(test_rng *r, loom_dtype t, int64_t K, uint8_t *row) {
    const size_t bb = blk_bytes(t), nb = (size_t)(K / blk_elems(t));
    for (size_t i = 0; i < bb * nb; i++) row[i] = (uint8_t)rng_next(r);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = row + b * bb;
        switch (t) {
        case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q5_0: case LOOM_DTYPE_Q8_0:
            put_f16(p, rng_range(r, -0.05, 0.05));
            break;
        case LOOM_DTYPE_Q4_1:
            put_f16(p, rng_range(r, 0.001, 0.05));
            put_f16(p + 2, rng_range(r, -0.4, 0.0));
            break;
        case LOOM_DTYPE_Q4_K: case LOOM_DTYPE_Q5_K:
            put_f16(p, rng_range(r, 0.0005, 0.005));
            put_f16(p + 2, rng_range(r, 0.0005, 0.005));
            break;
        default: put_f16(p + LOOM_GGUF_Q6_K_D, rng_range(r, -0.002, 0.002)); break;
        }
    }
}

/* The row as float (the formats' own scalar decoders). */
static void decode_row(loom_dtype t, const uint8_t *row, int64_t K, float *w) {
    const size_t bb = blk_bytes(t);
    const int be = blk_elems(t);
    for (int64_t b = 0; b < K / be; b++) {
        const uint8_t *p = row + (size_t)b * bb;
        float *o = w + b * be;
        switch (t) {
        case LOOM_DTYPE_Q4_0: loom_gguf_dec_q4_0(p, o); break;
        case LOOM_DTYPE_Q4_1: loom_gguf_dec_q4_1(p, o); break;
        case LOOM_DTYPE_Q5_0: loom_gguf_dec_q5_0(p, o); break;
        case LOOM_DTYPE_Q8_0: loom_gguf_dec_q8_0(p, o); break;
        case LOOM_DTYPE_Q4_K: loom_gguf_dec_q4_k(p, o); break;
        case LOOM_DTYPE_Q5_K: loom_gguf_dec_q5_k(p, o); break;
        default: loom_gguf_dec_q6_k(p, o); break;
        }
    }
}

/* |additive term| per element of block type t (q4_0's 8 d, q5_0's 16 d,
 * q4_1's m, q4_k's and q5_k's dmin mn): decoded weights cancel it, the
 * kernels keep it apart. */
static double offset_mag(loom_dtype t, const uint8_t *row, int64_t k) {
    const uint8_t *p = row + (size_t)(k / blk_elems(t)) * blk_bytes(t);
    if (t == LOOM_DTYPE_Q4_0) return 8 * fabs(loom_gguf_f16(p));
    if (t == LOOM_DTYPE_Q5_0) return 16 * fabs(loom_gguf_f16(p));
    if (t == LOOM_DTYPE_Q4_1) return fabs(loom_gguf_f16(p + 2));
    if (t == LOOM_DTYPE_Q4_K || t == LOOM_DTYPE_Q5_K) return 63 * fabs(loom_gguf_f16(p + 2));
    return 0;
}

/* Sum over k of |terms| of row . x (decoded w, the additive offsets
 * apart): the scale of float32 rounding in a product. */
static double term_mag(loom_dtype t, const uint8_t *row, const float *w, const loom_cpu_q8 *xq,
                       int64_t K) {
    double mag = 0;
    for (int64_t k = 0; k < K; k++)
        mag += (fabs(w[k]) + offset_mag(t, row, k)) * fabs((double)xq->d[k / 32] * xq->q[k]);
    return mag;
}

/* got[m] (m < mr) against both references for `row` (decoded: w). */
static void check_out(loom_dtype t, int64_t K, const uint8_t *row, const float *w,
                      float (*x)[MAXK], const loom_cpu_q8 *xq, int mr, const float *got,
                      const char *isa, const char *path) {
    for (int m = 0; m < mr; m++) {
        double exact = 0, fl = 0, round = 0;
        for (int64_t k = 0; k < K; k++) {
            const double d = xq[m].d[k / 32], xe = d * xq[m].q[k];
            exact += (double)w[k] * xe;
            fl += (double)w[k] * x[m][k];
            round += fabs(w[k]) * d / 2;
        }
        const double tol = 3e-6 * term_mag(t, row, w, &xq[m], K) + 1e-30;
        cr_assert(fabs(got[m] - exact) <= tol,
                  "%s %s %s K %lld token %d/%d: %.9g, exact reference %.9g (|diff| %.3g > %.3g)",
                  isa, path, loom_dtype_name(t), (long long)K, m, mr, got[m], exact,
                  fabs(got[m] - exact), tol);
        cr_assert(fabs(got[m] - fl) <= round * 1.0001 + tol,
                  "%s %s %s K %lld token %d/%d: %.9g, float reference %.9g (|diff| %.3g > "
                  "rounding bound %.3g)",
                  isa, path, loom_dtype_name(t), (long long)K, m, mr, got[m], fl,
                  fabs(got[m] - fl), round + tol);
    }
}

/* One row of type t and K against mr tokens, on the current ISA; at one
 * token also the two-row kernel, with the row first and second beside
 * another random row, which must give the one-row kernel's results. */
static void check_row(test_rng *r, loom_dtype t, int64_t K, int mr, const char *isa) {
    static uint8_t row[MAXK * 2], other[MAXK * 2];
    static float w[MAXK], wo[MAXK], x[LOOM_CPU_Q8_MR][MAXK];
    static _Alignas(64) uint8_t xb[LOOM_CPU_Q8_MR][MAXK * 2];
    loom_cpu_q8 xq[LOOM_CPU_Q8_MR];
    make_row(r, t, K, row);
    decode_row(t, row, K, w);
    /* activations of varied size, a few outliers, sometimes an all-zero block */
    for (int m = 0; m < mr; m++) {
        rng_fill(r, x[m], K, rng_range(r, 0.1, 4.0));
        x[m][rng_int(r, K)] *= 30.0f;
        if (rng_int(r, 4) == 0) memset(x[m] + 32 * rng_int(r, K / 32), 0, 32 * sizeof(float));
        loom_cpu_q8_quantize(x[m], K, xb[m], &xq[m]);
    }
    float got[LOOM_CPU_Q8_MR];
    loom_cpu_q8dot(t)(row, K, xq, mr, got);
    check_out(t, K, row, w, x, xq, mr, got, isa, "row");
    if (mr > 1) return;
    make_row(r, t, K, other);
    decode_row(t, other, K, wo);
    float p[2], q[2];
    loom_cpu_q8dot2(t)(row, other, K, xq, p);
    loom_cpu_q8dot2(t)(other, row, K, xq, q);
    check_out(t, K, row, w, x, xq, 1, &p[0], isa, "pair first");
    check_out(t, K, other, wo, x, xq, 1, &p[1], isa, "pair second");
    /* batch invariance: a row's result is the one-row kernel's, bit for
     * bit, wherever it sits */
    float o;
    loom_cpu_q8dot(t)(other, K, xq, 1, &o);
    cr_assert(p[0] == got[0] && q[1] == got[0] && p[1] == o && q[0] == o,
              "%s %s K %lld: two-row kernel %.9g %.9g / %.9g %.9g, one-row %.9g %.9g", isa,
              loom_dtype_name(t), (long long)K, p[0], p[1], q[0], q[1], got[0], o);
    /* the four-row kernel: the row in each place among three others, rows
     * one stride apart */
    static uint8_t quad[4 * MAXK * 2];
    const size_t rb = (size_t)(K / blk_elems(t)) * blk_bytes(t), stride = rb + 4 * (size_t)rng_int(r, 3);
    for (int at = 0; at < 4; at++) {
        for (int k = 0; k < 4; k++) memcpy(quad + (size_t)k * stride, k == at ? row : other, rb);
        float f[4];
        loom_cpu_q8dot4(t)(quad, stride, K, xq, f);
        for (int k = 0; k < 4; k++)
            cr_assert(f[k] == (k == at ? got[0] : o), "%s %s K %lld: four-row kernel row %d of 4 (row at %d) "
                      "%.9g, one-row %.9g", isa, loom_dtype_name(t), (long long)K, k, at, f[k],
                      k == at ? got[0] : o);
    }
}

Test(q8dot, quantizer_rounds_within_half_a_step) {
    test_rng r = rng_seeded("q8dot.quantizer");
    static float x[MAXK];
    static _Alignas(64) uint8_t buf[MAXK * 2];
    for (int it = 0; it < 50; it++) {
        const int64_t K = 32 * (1 + rng_int(&r, MAXK / 32));
        rng_fill(&r, x, K, rng_range(&r, 1e-3, 10));
        if (it % 5 == 0) memset(x, 0, 32 * sizeof(float));
        loom_cpu_q8 q;
        loom_cpu_q8_quantize(x, K, buf, &q);
        cr_assert_eq(loom_cpu_q8_bytes(K), (size_t)K + 20 * (size_t)(K / 32));
        for (int64_t b = 0; b < K / 32; b++) {
            double amax = 0;
            int64_t sum = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[32 * b + j]));
            cr_assert(fabs(q.d[b] - amax / 127) <= 1e-6 * amax, "block %lld scale %g, amax %g",
                      (long long)b, q.d[b], amax);
            for (int j = 0; j < 32; j++) {
                const int v = q.q[32 * b + j];
                cr_assert(v >= -127 && v <= 127);
                cr_assert(fabs(x[32 * b + j] - (double)q.d[b] * v) <= q.d[b] * 0.5001 + 1e-30,
                          "x %g, code %d, scale %g", x[32 * b + j], v, q.d[b]);
                sum += v;
            }
            cr_assert(fabs(q.s[b] - (double)q.d[b] * (double)sum) <= 1e-6 * fabs(q.d[b] * (double)sum) + 1e-30);
            cr_assert_eq(q.n[b], sum, "block %lld: code sum %d, want %lld", (long long)b, q.n[b], (long long)sum);
            int64_t half = 0;
            for (int j = 0; j < 16; j++) half += q.q[32 * b + j];
            cr_assert(q.h[2 * b] == half && q.h[2 * b + 1] == sum - half, "block %lld: half sums %d %d",
                      (long long)b, q.h[2 * b], q.h[2 * b + 1]);
        }
    }
}

/* The vector quantizers give the portable one's bytes (codes, scales, sums),
 * ties and outliers included: a token's activations must not depend on
 * the instruction set that quantized them. */
Test(q8dot, quantizer_is_the_same_on_every_isa) {
    test_rng r = rng_seeded("q8dot.quantizer_isas");
    static float x[MAXK];
    static _Alignas(64) uint8_t want[MAXK * 2], got[MAXK * 2];
    int ran = 0;
    for (int it = 0; it < 40; it++) {
        const int64_t K = 32 * (1 + rng_int(&r, MAXK / 32));
        rng_fill(&r, x, K, rng_range(&r, 1e-3, 10));
        x[rng_int(&r, K)] *= 50.0f;
        /* exact halves of a step: 127 / amax times x lands on k + 0.5 */
        for (int j = 0; j < 8; j++) x[j] = (float)j * 0.5f, x[8 + j] = -(float)j * 0.5f;
        x[16] = 63.5f;
        if (it % 4 == 0) memset(x + 32 * rng_int(&r, K / 32), 0, 32 * sizeof(float));
        loom_cpu_q8 q;
        cr_assert(loom_cpu_q8_force_isa("portable"));
        loom_cpu_q8_quantize(x, K, want, &q);
        for (size_t i = 1; i < sizeof isas / sizeof isas[0]; i++) {
            if (!loom_cpu_q8_force_isa(isas[i])) continue;
            ran++;
            memset(got, 0xA5, loom_cpu_q8_bytes(K));
            loom_cpu_q8_quantize(x, K, got, &q);
            cr_assert(!memcmp(got, want, loom_cpu_q8_bytes(K)), "%s quantizer differs from portable at K %lld",
                      isas[i], (long long)K);
            cr_assert(q.q == (const int8_t *)got && q.d == (const float *)(got + K));
        }
    }
    cr_assert(loom_cpu_q8_force_isa(NULL));
    if (!ran) cr_log_info("q8dot: only the portable quantizer runs on this CPU");
}

/* Every type, every ISA here, batch 1 and 2..4 tokens, K from one block up. */
Test(q8dot, rows_match_references_on_every_isa) {
    test_rng r = rng_seeded("q8dot.rows");
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) {
            cr_log_info("q8dot: this CPU has no %s; skipped", isas[i]);
            continue;
        }
        cr_assert_str_eq(loom_cpu_q8_isa(), isas[i]);
        ran++;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const loom_dtype t = types[ti];
            cr_assert(loom_cpu_q8dot(t) && loom_cpu_q8dot2(t) && loom_cpu_q8dot4(t));
            for (int it = 0; it < 60; it++) {
                const int64_t be = blk_elems(t), K = be * (1 + rng_int(&r, MAXK / be));
                check_row(&r, t, K, 1 + it % LOOM_CPU_Q8_MR, isas[i]);
            }
        }
    }
    cr_assert_geq(ran, 1);
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

/* The group kernel (q8dot.h, loom_cpu_q8gemm): nr rows at a stride against
 * mr = 1..8 interleaved tokens, every type that has one and every ISA
 * here. Each result must be the row kernel's for that row and token, bit
 * for bit (a token's product may not depend on its batch: decode and a
 * verify step must agree), and so meet the row kernel's references;
 * nothing outside the nr x mr results is written. */
Test(q8dot, group_kernel_is_the_row_kernel_bit_for_bit) {
    test_rng r = rng_seeded("q8dot.group");
    enum { NR = 5 };
    static uint8_t rows[NR * MAXK * 2];
    static float w[NR][MAXK], x[LOOM_CPU_Q8_G][MAXK];
    static _Alignas(64) uint8_t xb[LOOM_CPU_Q8_G][MAXK * 2];
    static _Alignas(64) uint8_t gb[LOOM_CPU_Q8_G * MAXK * 2];
    loom_cpu_q8 xq[LOOM_CPU_Q8_G];
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) continue;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const loom_dtype t = types[ti];
            loom_cpu_q8gemm_fn *gemm = loom_cpu_q8gemm(t);
            if (!gemm) continue;
            ran++;
            for (int it = 0; it < 40; it++) {
                const int64_t be = blk_elems(t), K = be * (1 + rng_int(&r, MAXK / be));
                const int mr = 1 + it % LOOM_CPU_Q8_G, nr = 1 + (int)rng_int(&r, NR);
                const size_t rb = (size_t)(K / be) * blk_bytes(t), stride = rb + 2 * (size_t)rng_int(&r, 3);
                for (int k = 0; k < nr; k++) {
                    make_row(&r, t, K, rows + k * stride);
                    decode_row(t, rows + k * stride, K, w[k]);
                }
                for (int m = 0; m < mr; m++) {
                    rng_fill(&r, x[m], K, rng_range(&r, 0.1, 4.0));
                    x[m][rng_int(&r, K)] *= 30.0f;
                    if (rng_int(&r, 4) == 0) memset(x[m] + 32 * rng_int(&r, K / 32), 0, 32 * sizeof(float));
                    loom_cpu_q8_quantize(x[m], K, xb[m], &xq[m]);
                }
                cr_assert_leq(loom_cpu_q8g_bytes(K), sizeof gb);
                loom_cpu_q8g g;
                loom_cpu_q8g_pack(xq, mr, K, gb, &g);
                const int64_t ldo = LOOM_CPU_Q8_G + 1;
                float out[NR * (LOOM_CPU_Q8_G + 1)];
                for (size_t e = 0; e < sizeof out / sizeof *out; e++) out[e] = 777.f;
                gemm(rows, stride, nr, K, &g, mr, out, ldo);
                for (int k = 0; k < nr; k++) {
                    float one[LOOM_CPU_Q8_MR];
                    for (int m = 0; m < mr; m++) {
                        loom_cpu_q8dot(t)(rows + k * stride, K, &xq[m], 1, one);
                        cr_assert(out[k * ldo + m] == one[0],
                                  "%s %s K %lld row %d token %d of %d: group kernel %.9g, row kernel %.9g",
                                  isas[i], loom_dtype_name(t), (long long)K, k, m, mr, out[k * ldo + m],
                                  one[0]);
                        check_out(t, K, rows + k * stride, w[k], &x[m], &xq[m], 1, &out[k * ldo + m],
                                  isas[i], "group");
                    }
                    for (int64_t m = mr; m < ldo; m++)
                        cr_assert(out[k * ldo + m] == 777.f, "%s %s: group kernel wrote token %lld of %d",
                                  isas[i], loom_dtype_name(t), (long long)m, mr);
                }
            }
        }
    }
    if (!ran) cr_log_info("q8dot: no group kernel on this CPU (portable only)");
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

/* q5_0 is dotted as the q8_0 block of the same values (codes - 16): on
 * every ISA here each of its kernels (row at 1..4 tokens, pair, quad,
 * group) gives bit for bit what the q8_0 kernel gives on the row widened by
 * loom_gguf_q5_0_to_q8_0. */
Test(q8dot, q5_0_is_q8_0_of_the_widened_row_bit_for_bit) {
    test_rng r = rng_seeded("q8dot.q5_0_widened");
    static uint8_t row[4 * MAXK], wide[4 * MAXK * 2];
    static float x[LOOM_CPU_Q8_G][MAXK];
    static _Alignas(64) uint8_t xb[LOOM_CPU_Q8_G][MAXK * 2];
    static _Alignas(64) uint8_t gb[LOOM_CPU_Q8_G * MAXK * 2];
    loom_cpu_q8 xq[LOOM_CPU_Q8_G];
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) continue;
        for (int it = 0; it < 30; it++) {
            const int64_t K = 32 * (1 + rng_int(&r, MAXK / 32)), nb = K / 32;
            const size_t rb = (size_t)nb * LOOM_GGUF_Q5_0_BYTES, wb = (size_t)nb * LOOM_GGUF_Q8_0_BYTES;
            for (int k = 0; k < 4; k++) {
                make_row(&r, LOOM_DTYPE_Q5_0, K, row + k * rb);
                for (int64_t b = 0; b < nb; b++)
                    loom_gguf_q5_0_to_q8_0(row + k * rb + b * LOOM_GGUF_Q5_0_BYTES,
                                           wide + k * wb + b * LOOM_GGUF_Q8_0_BYTES);
            }
            for (int m = 0; m < LOOM_CPU_Q8_G; m++) {
                rng_fill(&r, x[m], K, rng_range(&r, 0.1, 4.0));
                loom_cpu_q8_quantize(x[m], K, xb[m], &xq[m]);
            }
            const int mr = 1 + it % LOOM_CPU_Q8_MR;
            float a[LOOM_CPU_Q8_G * 4], b[LOOM_CPU_Q8_G * 4];
            loom_cpu_q8dot(LOOM_DTYPE_Q5_0)(row, K, xq, mr, a);
            loom_cpu_q8dot(LOOM_DTYPE_Q8_0)(wide, K, xq, mr, b);
            cr_assert(!memcmp(a, b, sizeof(float) * mr), "%s K %lld: q5_0 row %.9g, widened q8_0 %.9g", isas[i],
                      (long long)K, a[0], b[0]);
            loom_cpu_q8dot2(LOOM_DTYPE_Q5_0)(row, row + rb, K, xq, a);
            loom_cpu_q8dot2(LOOM_DTYPE_Q8_0)(wide, wide + wb, K, xq, b);
            cr_assert(!memcmp(a, b, sizeof(float) * 2), "%s K %lld: pair", isas[i], (long long)K);
            loom_cpu_q8dot4(LOOM_DTYPE_Q5_0)(row, rb, K, xq, a);
            loom_cpu_q8dot4(LOOM_DTYPE_Q8_0)(wide, wb, K, xq, b);
            cr_assert(!memcmp(a, b, sizeof(float) * 4), "%s K %lld: quad", isas[i], (long long)K);
            loom_cpu_q8gemm_fn *g5 = loom_cpu_q8gemm(LOOM_DTYPE_Q5_0), *g8 = loom_cpu_q8gemm(LOOM_DTYPE_Q8_0);
            cr_assert((g5 == NULL) == (g8 == NULL));
            if (!g5) continue;
            const int gm = 1 + it % LOOM_CPU_Q8_G;
            loom_cpu_q8g g;
            loom_cpu_q8g_pack(xq, gm, K, gb, &g);
            g5(row, rb, 4, K, &g, gm, a, LOOM_CPU_Q8_G);
            g8(wide, wb, 4, K, &g, gm, b, LOOM_CPU_Q8_G);
            for (int k = 0; k < 4; k++)
                cr_assert(!memcmp(a + k * LOOM_CPU_Q8_G, b + k * LOOM_CPU_Q8_G, sizeof(float) * gm),
                          "%s K %lld: group, row %d of %d tokens", isas[i], (long long)K, k, gm);
        }
    }
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

/* Block-exact reference (q8dot.h) for one row and one token, from the raw
 * bytes: per block of 32 the integer dot of (c - z) with the codes, then
 * acc = fma(dot, d dx, acc) (q4_k / q5_k: d sc of the sub-block; q6_k: the
 * dot is sc0 dot0 + sc1 dot1 over the halves); q4_1's offsets m s and the
 * k-quants' dmin mn s summed apart, added / subtracted at the end. q6_k's
 * codes as ggml's dequantize_row_q6_K reads them. */
static float exact_ref(loom_dtype t, const uint8_t *row, int64_t K, const loom_cpu_q8 *x) {
    const size_t bb = blk_bytes(t);
    const bool kq = t == LOOM_DTYPE_Q4_K || t == LOOM_DTYPE_Q5_K;
    float acc = 0.0f, off = 0.0f;
    for (int64_t b = 0; b < K / 32; b++) {
        const bool super = kq || t == LOOM_DTYPE_Q6_K; /* 8 blocks of 32 a super-block */
        const uint8_t *p = super ? row + (size_t)(b / 8) * bb : row + (size_t)b * bb;
        const int j = (int)(b % 8);
        float scale, offset = 0.0f;
        int sc6[2] = {0, 0};
        if (t == LOOM_DTYPE_Q6_K) {
            scale = loom_gguf_f16(p + LOOM_GGUF_Q6_K_D);
        } else if (kq) {
            uint32_t sw[3], sc, mn;
            memcpy(sw, p + LOOM_GGUF_Q4_K_SCALES, sizeof sw);
            loom_q4k_scale_min(sw, j, &sc, &mn);
            scale = loom_gguf_f16(p) * (float)sc;
            offset = loom_gguf_f16(p + 2) * (float)mn;
        } else {
            scale = loom_gguf_f16(p);
            if (t == LOOM_DTYPE_Q4_1) offset = loom_gguf_f16(p + 2);
        }
        int64_t dot = 0, half[2] = {0, 0};
        for (int e = 0; e < 32; e++) {
            int v;
            switch (t) {
            case LOOM_DTYPE_Q4_0: v = (e < 16 ? p[2 + e] & 15 : p[2 + e - 16] >> 4) - 8; break;
            case LOOM_DTYPE_Q4_1: v = e < 16 ? p[4 + e] & 15 : p[4 + e - 16] >> 4; break;
            case LOOM_DTYPE_Q5_0: {
                const uint32_t qh =
                    (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
                v = ((e < 16 ? p[6 + e] & 15 : p[6 + e - 16] >> 4) | (int)((qh >> e) & 1) << 4) - 16;
                break;
            }
            case LOOM_DTYPE_Q4_K: v = (p[LOOM_GGUF_Q4_K_QS + 32 * (j / 2) + e] >> (4 * (j & 1))) & 15; break;
            case LOOM_DTYPE_Q5_K:
                v = ((p[LOOM_GGUF_Q5_K_QS + 32 * (j / 2) + e] >> (4 * (j & 1))) & 15) |
                    ((p[LOOM_GGUF_Q5_K_QH + e] >> j) & 1) << 4;
                break;
            case LOOM_DTYPE_Q6_K: { /* element l of 128-weight half n, quarter j % 4 */
                const int n = j / 4, qq = j % 4;
                const uint8_t lb = p[64 * n + e + 32 * (qq & 1)], hb = p[128 + 32 * n + e];
                v = ((qq < 2 ? lb & 15 : lb >> 4) | ((hb >> (2 * qq)) & 3) << 4) - 32;
                sc6[e / 16] = (int8_t)p[192 + 8 * n + 2 * qq + e / 16];
                break;
            }
            default: v = (int8_t)p[2 + e]; break;
            }
            half[e / 16] += (int64_t)v * x->q[32 * b + e];
        }
        dot = t == LOOM_DTYPE_Q6_K ? sc6[0] * half[0] + sc6[1] * half[1] : half[0] + half[1];
        acc = fmaf((float)dot, scale * x->d[b], acc);
        if (t == LOOM_DTYPE_Q4_1 || kq) off = fmaf(offset, x->s[b], off);
    }
    return t == LOOM_DTYPE_Q4_1 ? acc + off : kq ? acc - off : acc;
}

/* The 16-row tiles (avx512vnni: every block type): 1..16 rows at a
 * stride, 1..70 tokens; every result bit for bit the block-exact reference
 * and the set's row kernel (a token's result is the same in a tile as
 * alone); rows past nr give 0; nothing past the mr tokens is written. The
 * other sets have no tiles. */
Test(q8dot, tiles_are_block_exact) {
    test_rng r = rng_seeded("q8dot.tiles");
    enum { MT = 70, TK = 512 };
    static uint8_t rows[16 * TK * 2], tile[TK / 32 * LOOM_CPU_Q8_TILE_BLOCK];
    static float x[TK];
    static _Alignas(64) uint8_t xb[MT][TK * 2];
    static float out[16 * (MT + 1)];
    loom_cpu_q8 xq[MT];
    cr_assert_eq(loom_cpu_q8tile_bytes(TK), sizeof tile);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) continue;
        if (strcmp(isas[i], "avx512vnni")) {
            for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
                cr_assert_null(loom_cpu_q8tile(types[ti]), "%s has tiles", isas[i]);
            continue;
        }
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const loom_dtype t = types[ti];
            const loom_cpu_q8tile_kernel *tk = loom_cpu_q8tile(t);
            cr_assert(tk && tk->pack && tk->dot);
            for (int it = 0; it < 25; it++) {
                const int64_t be = blk_elems(t), K = be * (1 + rng_int(&r, TK / be));
                const int nr = 1 + (int)rng_int(&r, 16), mr = 1 + (int)rng_int(&r, MT);
                const size_t stride = (size_t)(K / be) * blk_bytes(t) + (size_t)rng_int(&r, 5);
                for (int k = 0; k < nr; k++) make_row(&r, t, K, rows + k * stride);
                for (int m = 0; m < mr; m++) {
                    rng_fill(&r, x, K, rng_range(&r, 0.1, 4.0));
                    x[rng_int(&r, K)] *= 30.0f;
                    loom_cpu_q8_quantize(x, K, xb[m], &xq[m]);
                }
                for (size_t e = 0; e < sizeof out / sizeof *out; e++) out[e] = 777.f;
                tk->pack(rows, stride, nr, K, it % 2 ? rows : NULL, tile);
                tk->dot(tile, K, xq, mr, out);
                for (int m = 0; m < mr; m++)
                    for (int k = 0; k < 16; k++) {
                        const float got = out[16 * m + k];
                        if (k >= nr) {
                            cr_assert(got == 0.0f, "%s K %lld: row %d past %d gave %g", loom_dtype_name(t),
                                      (long long)K, k, nr, got);
                            continue;
                        }
                        float one;
                        loom_cpu_q8dot(t)(rows + k * stride, K, &xq[m], 1, &one);
                        const float want = exact_ref(t, rows + k * stride, K, &xq[m]);
                        cr_assert(!memcmp(&got, &want, 4) && !memcmp(&one, &want, 4),
                                  "%s K %lld row %d/%d token %d/%d: tile %.9g, row kernel %.9g, "
                                  "reference %.9g",
                                  loom_dtype_name(t), (long long)K, k, nr, m, mr, got, one, want);
                    }
                for (size_t e = 16 * (size_t)mr; e < sizeof out / sizeof *out; e++)
                    cr_assert(out[e] == 777.f, "%s: the tile wrote past %d tokens", loom_dtype_name(t), mr);
            }
        }
    }
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

/* 16-bit float rows (f16, bf16; any K, tails included) times float
 * activations, every instruction set here, 1..4 tokens: within float32
 * rounding of the float64 product (the weights convert exactly), and each
 * token's result the same whatever the token count of the call. */
Test(q8dot, sixteen_bit_rows_match_float64_on_every_isa) {
    test_rng r = rng_seeded("q8dot.hdot");
    static uint16_t row[MAXK];
    static float x[LOOM_CPU_Q8_MR][MAXK];
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) continue;
        ran++;
        for (int b = 0; b < 2; b++) {
            const loom_dtype t = b ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F16;
            loom_cpu_hdot_fn *dot = loom_cpu_hdot(t);
            cr_assert_not_null(dot);
            for (int it = 0; it < 40; it++) {
                const int64_t K = 1 + rng_int(&r, MAXK);
                const int mr = 1 + it % LOOM_CPU_Q8_MR;
                for (int64_t k = 0; k < K; k++) {
                    const float v = rng_int(&r, 10) == 0 ? (float)rng_range(&r, -1, 1) * 1e-6f
                                                         : (float)rng_range(&r, -2, 2);
                    row[k] = b ? loom_fp32_to_bf16(v) : loom_fp32_to_fp16(v);
                }
                const float *xs[LOOM_CPU_Q8_MR];
                for (int m = 0; m < mr; m++) {
                    rng_fill(&r, x[m], K, rng_range(&r, 0.1, 4.0));
                    xs[m] = x[m];
                }
                float got[LOOM_CPU_Q8_MR], one;
                dot((const uint8_t *)row, K, xs, mr, got);
                for (int m = 0; m < mr; m++) {
                    double want = 0, mag = 0;
                    for (int64_t k = 0; k < K; k++) {
                        const double w = b ? loom_bf16_to_fp32(row[k]) : loom_fp16_to_fp32(row[k]);
                        want += w * x[m][k];
                        mag += fabs(w * x[m][k]);
                    }
                    cr_assert(fabs(got[m] - want) <= 1e-6 * mag + 1e-30,
                              "%s %s K %lld token %d/%d: %.9g, float64 %.9g (|diff| %.3g, terms %.3g)",
                              isas[i], loom_dtype_name(t), (long long)K, m, mr, got[m], want,
                              fabs(got[m] - want), mag);
                    dot((const uint8_t *)row, K, &xs[m], 1, &one);
                    cr_assert(one == got[m], "%s %s K %lld: token %d alone %.9g, among %d %.9g", isas[i],
                              loom_dtype_name(t), (long long)K, m, one, mr, got[m]);
                }
            }
        }
    }
    cr_assert_geq(ran, 1);
    cr_assert_null(loom_cpu_hdot(LOOM_DTYPE_F32));
    cr_assert_null(loom_cpu_hdot(LOOM_DTYPE_Q4_K));
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

Test(q8dot, unknown_types_and_isas_are_refused) {
    cr_assert_null(loom_cpu_q8dot(LOOM_DTYPE_F32));
    cr_assert_null(loom_cpu_q8dot(LOOM_DTYPE_BF16));
    cr_assert_null(loom_cpu_q8dot2(LOOM_DTYPE_F16));
    cr_assert_not(loom_cpu_q8_force_isa("sse9"));
    cr_assert(loom_cpu_q8_force_isa("portable"));
    cr_assert_str_eq(loom_cpu_q8_isa(), "portable");
}
