/*
 * tests/quant/test_qlinear.c — kernels/cpu/qlinear.c against float64
 * references on fresh random inputs, every format:
 *   INT8_W8A16, INT8_W8A8 (with and without a SmoothQuant vector),
 *   FP8_W8A8 (per-channel and per-tensor scales), INT4_W4A16 (several group
 *   sizes), GGUF q4_0 / q4_1 / q5_0 / q8_0 / q4_k / q5_k / q6_k;
 * many shapes (M = 1 .. 40 tokens, K not a multiple of 16 or 32 wherever the
 * format allows it), row strides, bias, beta, with and without a thread
 * pool; fused multi-part products against separate ones; the weight views'
 * size checks. The references are written from the layouts in loom/quant.h
 * (GGUF rows through the core's own dequantizer, times activations
 * quantized to 8-bit blocks of 32 as qlinear.h states), not from the
 * kernels.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../plugins/quantizer/common/qcommon.h"
#include "rng.h"
#include "formats/dequant.h"
#include "formats/half.h"
#include "q8dot.h"
#include "qlinear.h"

static loom_cpu_pool *g_pool;
static loom_cpu_qscratch *g_scratch;

static void setup(void) {
    g_pool = loom_cpu_pool_create(2);
    g_scratch = loom_cpu_qscratch_create();
    cr_assert(g_pool && g_scratch);
}
static void teardown(void) {
    loom_cpu_qscratch_destroy(g_scratch);
    loom_cpu_pool_destroy(g_pool);
}
TestSuite(qlinear, .init = setup, .fini = teardown);

/* ---------------------------------------------------------- test weights */

typedef struct tw {
    loom_qtensor q;           /* what a quantizer would hand over          */
    loom_tensor gguf;         /* GGUF: the stored tensor                    */
    loom_cpu_qweight w;
    double *ref;              /* (n, k) float64 weights                     */
    double *mag;              /* (n, k) magnitude of the terms a decoder adds
                                 ((q - z) s is q s - z s: cancellation), for
                                 the rounding tolerance                      */
    void *bufs[4];
} tw;

static loom_tensor view(loom_dtype dt, int64_t d0, int64_t d1, void *data, size_t bytes) {
    loom_tensor t = {.struct_size = sizeof t, .dtype = dt, .ndim = d1 > 0 ? 2 : 1, .data = data,
                     .nbytes = bytes, .device = LOOM_DEVICE_HOST};
    t.shape[0] = d0;
    if (d1 > 0) t.shape[1] = d1;
    return t;
}

static double ref_e4m3(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (c & 0x80) ? -v : v;
}

static uint16_t rand_f16(test_rng *r, double lo, double hi) {
    return loom_fp32_to_fp16((float)rng_range(r, lo, hi));
}

/* A random weight (n, k) of `fmt` (GGUF: block type gt; INT4: group g). */
static void tw_make(tw *t, test_rng *r, loom_qformat fmt, loom_dtype gt, int64_t n, int64_t k,
                    int32_t g, bool per_tensor) {
    memset(t, 0, sizeof *t);
    t->ref = malloc((size_t)(n * k) * sizeof(double));
    t->mag = malloc((size_t)(n * k) * sizeof(double));
    char why[256];
    if (fmt == LOOM_QFMT_GGUF) {
        size_t rb = loom_dtype_row_bytes(gt, k);
        uint8_t *d = malloc(rb * (size_t)n);
        for (size_t i = 0; i < rb * (size_t)n; i++) d[i] = (uint8_t)rng_next(r);
        if (gt == LOOM_DTYPE_F16 || gt == LOOM_DTYPE_BF16) /* finite values, zeros, subnormals */
            for (size_t i = 0; i < (size_t)(n * k); i++) {
                const int c = rng_int(r, 16);
                const float v = c == 0 ? 0.0f : c == 1 ? -0.0f : c == 2 ? (float)rng_range(r, -1, 1) * 1e-6f
                                                                        : (float)rng_range(r, -0.5, 0.5);
                const uint16_t h = gt == LOOM_DTYPE_F16 ? loom_fp32_to_fp16(v) : loom_fp32_to_bf16(v);
                memcpy(d + 2 * i, &h, 2);
            }
        size_t bb = loom_dtype_block_bytes(gt);
        int64_t be = loom_dtype_block_elems(gt);
        for (size_t b = 0; b < rb * (size_t)n / bb; b++) {
            uint8_t *p = d + b * bb;
            uint16_t h;
            switch (gt) {
            case LOOM_DTYPE_Q8_0: case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q5_0:
                h = rand_f16(r, -0.05, 0.05), memcpy(p, &h, 2);
                break;
            case LOOM_DTYPE_Q4_1:
                h = rand_f16(r, 0.001, 0.05), memcpy(p, &h, 2);
                h = rand_f16(r, -0.4, 0.0), memcpy(p + 2, &h, 2);
                break;
            case LOOM_DTYPE_Q4_K: case LOOM_DTYPE_Q5_K:
                h = rand_f16(r, 0.0005, 0.005), memcpy(p, &h, 2);
                h = rand_f16(r, 0.0005, 0.005), memcpy(p + 2, &h, 2);
                break;
            case LOOM_DTYPE_Q6_K:
                h = rand_f16(r, 0.0005, 0.002), memcpy(p + 208, &h, 2);
                break;
            default: break;
            }
        }
        t->bufs[0] = d;
        t->gguf = view(gt, n, k, d, rb * (size_t)n);
        float row[4096];
        cr_assert_leq(k, 4096);
        for (int64_t i = 0; i < n; i++) {
            cr_assert_eq(loom_dequant_row(gt, d + (size_t)i * rb, row, k), LOOM_OK);
            for (int64_t c = 0; c < k; c++) {
                t->ref[i * k + c] = row[c];
                /* the block's additive term: -8 d (q4_0), -16 d (q5_0), m (q4_1), dmin*m (q4_k, q5_k) */
                const uint8_t *blk = d + (size_t)i * rb + (size_t)(c / be) * bb;
                double off = 0;
                if (gt == LOOM_DTYPE_Q4_0) off = 8 * fabs(loom_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8)));
                if (gt == LOOM_DTYPE_Q5_0) off = 16 * fabs(loom_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8)));
                if (gt == LOOM_DTYPE_Q4_1) off = fabs(loom_fp16_to_fp32((uint16_t)(blk[2] | blk[3] << 8)));
                if (gt == LOOM_DTYPE_Q4_K || gt == LOOM_DTYPE_Q5_K) off = 63 * fabs(loom_fp16_to_fp32((uint16_t)(blk[2] | blk[3] << 8)));
                t->mag[i * k + c] = fabs(row[c]) + off;
            }
        }
        cr_assert(loom_cpu_qweight_gguf(&t->w, &t->gguf, why, sizeof why), "%s", why);
        return;
    }
    t->q = (loom_qtensor){.struct_size = sizeof(loom_qtensor), .format = fmt, .rows = n, .cols = k,
                          .group_size = g};
    if (fmt == LOOM_QFMT_INT4_W4A16) {
        int64_t ng = k / g;
        uint8_t *d = malloc((size_t)(n * k / 2));
        float *s = malloc((size_t)(n * ng) * 4), *z = malloc((size_t)(n * ng) * 4);
        for (int64_t i = 0; i < n * k / 2; i++) d[i] = (uint8_t)rng_next(r);
        for (int64_t i = 0; i < n * ng; i++) {
            s[i] = (float)rng_range(r, 0.001, 0.02);
            z[i] = (float)rng_range(r, 0, 15);
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < k; c++) {
                int q = (d[i * (k / 2) + c / 2] >> (4 * (c & 1))) & 15;
                t->ref[i * k + c] = ((double)q - z[i * ng + c / g]) * s[i * ng + c / g];
                t->mag[i * k + c] = ((double)q + z[i * ng + c / g]) * s[i * ng + c / g];
            }
        t->q.data = view(LOOM_DTYPE_U8, n, k / 2, d, (size_t)(n * k / 2));
        t->q.scales = view(LOOM_DTYPE_F32, n, ng, s, (size_t)(n * ng) * 4);
        t->q.zeros = view(LOOM_DTYPE_F32, n, ng, z, (size_t)(n * ng) * 4);
        t->bufs[0] = d, t->bufs[1] = s, t->bufs[2] = z;
    } else {
        bool fp8 = fmt == LOOM_QFMT_FP8_W8A8;
        int64_t ns = fp8 && per_tensor ? 1 : n;
        uint8_t *d = malloc((size_t)(n * k));
        float *s = malloc((size_t)ns * 4);
        for (int64_t i = 0; i < ns; i++) s[i] = (float)rng_range(r, 0.001, 0.02);
        for (int64_t i = 0; i < n * k; i++) {
            uint8_t c = (uint8_t)rng_next(r);
            if (fp8 && (c & 0x7f) == 0x7f) c ^= 1; /* no NaN weights */
            if (!fp8 && c == 0x80) c = 0x81;       /* int8 codes in [-127, 127] */
            d[i] = c;
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < k; c++)
                t->ref[i * k + c] = (fp8 ? ref_e4m3(d[i * k + c]) : (double)(int8_t)d[i * k + c]) *
                                    s[ns == 1 ? 0 : i];
        for (int64_t i = 0; i < n * k; i++) t->mag[i] = fabs(t->ref[i]);
        t->q.data = view(fp8 ? LOOM_DTYPE_FP8_E4M3 : LOOM_DTYPE_I8, n, k, d, (size_t)(n * k));
        t->q.scales = view(LOOM_DTYPE_F32, ns, 0, s, (size_t)ns * 4);
        t->bufs[0] = d, t->bufs[1] = s;
    }
    cr_assert(loom_cpu_qweight_init(&t->w, &t->q, why, sizeof why), "%s", why);
}

static void tw_free(tw *t) {
    for (int i = 0; i < 4; i++) free(t->bufs[i]);
    free(t->ref);
    free(t->mag);
}

/* ---------------------------------------------------------- reference */

/* The activations token m of x (M, ldx) becomes for format fmt, in float64,
 * with its per-token scale (1 for float formats): the same float32 steps
 * qlinear.h documents. */
static void ref_act(loom_qformat fmt, const float *x, int64_t K, const float *smooth, double *xe,
                    double *scale) {
    *scale = 1.0;
    if (fmt == LOOM_QFMT_GGUF) {
        /* 8-bit blocks of 32: d = max|x| / 127, code rint(x 127 / max|x|) */
        for (int64_t b = 0; b < K; b += 32) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
            float inv = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
            for (int j = 0; j < 32; j++) xe[b + j] = (double)d * rintf(x[b + j] * inv);
        }
    } else if (fmt == LOOM_QFMT_INT8_W8A8) {
        float amax = 0;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(smooth ? x[k] / smooth[k] : x[k]));
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float v = rintf((smooth ? x[k] / smooth[k] : x[k]) * inv);
            xe[k] = v > 127 ? 127 : v < -127 ? -127 : v;
        }
        *scale = amax / 127.0f;
    } else if (fmt == LOOM_QFMT_FP8_W8A8) {
        float amax = 0;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(smooth ? x[k] / smooth[k] : x[k]));
        float s = amax / 448.0f;
        for (int64_t k = 0; k < K; k++)
            xe[k] = s > 0 ? ref_e4m3(loom_fp32_to_e4m3((smooth ? x[k] / smooth[k] : x[k]) / s)) : 0;
        *scale = s;
    } else {
        for (int64_t k = 0; k < K; k++) xe[k] = x[k];
    }
}

/* Check y (M, ldy) columns [col, col + w->n) against the reference
 * product of tw t with x (y0 = y before the call). */
static void check_part(const tw *t, const float *x, int64_t ldx, int64_t M, const float *bias,
                       float beta, const float *y0, const float *y, int64_t ldy, int64_t col,
                       const float *smooth, const char *what) {
    const int64_t n = t->w.n, K = t->w.k;
    double *xe = malloc((size_t)K * sizeof(double));
    for (int64_t m = 0; m < M; m++) {
        double sx;
        /* 16-bit float weights kept as stored multiply the float activations */
        const bool f16w = t->w.dtype == LOOM_DTYPE_F16 || t->w.dtype == LOOM_DTYPE_BF16;
        ref_act(f16w ? LOOM_QFMT_NONE : t->w.format, x + m * ldx, K, smooth, xe, &sx);
        for (int64_t i = 0; i < n; i++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                acc += t->ref[i * K + k] * xe[k];
                mag += t->mag[i * K + k] * fabs(xe[k]);
            }
            double want = acc * sx + (bias ? bias[i] : 0.0);
            mag = mag * sx + (bias ? fabs(bias[i]) : 0.0);
            double y0v = y0[m * ldy + col + i];
            if (beta != 0.0f) want += beta * y0v, mag += fabs(beta * y0v);
            double got = y[m * ldy + col + i];
            double tol = 3e-6 * mag + 1e-30;
            if (!(fabs(got - want) <= tol))
                cr_assert_fail("%s: y[%lld, %lld] = %.9g, reference %.9g (|diff| %.3g > tol %.3g; "
                               "M %lld, n %lld, K %lld)",
                               what, (long long)m, (long long)i, got, want, fabs(got - want), tol,
                               (long long)M, (long long)n, (long long)K);
        }
    }
    free(xe);
}

/* One random product of weight t: random ldx/ldy padding, bias, beta, pool. */
static void run_one(test_rng *r, tw *t, int64_t M, const float *smooth, const char *what) {
    const int64_t n = t->w.n, K = t->w.k;
    int64_t ldx = K + rng_int(r, 3), ldy = n + rng_int(r, 3);
    float *x = malloc((size_t)(M * ldx) * 4), *y = malloc((size_t)(M * ldy) * 4);
    float *y0 = malloc((size_t)(M * ldy) * 4), *bias = malloc((size_t)n * 4);
    rng_fill(r, x, M * ldx, 1.0);
    rng_fill(r, y0, M * ldy, 1.0);
    rng_fill(r, bias, n, 0.1);
    memcpy(y, y0, (size_t)(M * ldy) * 4);
    bool with_bias = rng_int(r, 2);
    float beta = (float)(rng_int(r, 3) * 0.5);
    loom_cpu_pool *pool = rng_int(r, 2) ? g_pool : NULL;
    cr_assert(loom_cpu_qlinear(y, ldy, x, ldx, &t->w, with_bias ? bias : NULL, M, beta, g_scratch, pool));
    check_part(t, x, ldx, M, with_bias ? bias : NULL, beta, y0, y, ldy, 0, smooth, what);
    /* untouched padding columns */
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = n; c < ldy; c++) cr_assert_eq(y[m * ldy + c], y0[m * ldy + c]);
    free(x), free(y), free(y0), free(bias);
}

static int64_t rand_m(test_rng *r) {
    static const int64_t ms[] = {1, 1, 2, 3, 4, 5, 7, 8, 16, 17, 40};
    return ms[rng_int(r, (int64_t)(sizeof ms / sizeof ms[0]))];
}

static void dense_format(loom_qformat fmt, bool per_tensor, const char *name) {
    test_rng r = rng_seeded(name);
    static const int64_t ks[] = {1, 7, 16, 31, 64, 100, 257, 576};
    for (int it = 0; it < 40; it++) {
        int64_t K = ks[rng_int(&r, 8)], n = 1 + rng_int(&r, 70), M = rand_m(&r);
        tw t;
        tw_make(&t, &r, fmt, LOOM_DTYPE_COUNT, n, K, 0, per_tensor);
        run_one(&r, &t, M, NULL, name);
        tw_free(&t);
    }
}

Test(qlinear, int8_w8a16) { dense_format(LOOM_QFMT_INT8_W8A16, false, "qlinear.int8_w8a16"); }
Test(qlinear, int8_w8a8) { dense_format(LOOM_QFMT_INT8_W8A8, false, "qlinear.int8_w8a8"); }
Test(qlinear, fp8_per_channel) { dense_format(LOOM_QFMT_FP8_W8A8, false, "qlinear.fp8_pc"); }
Test(qlinear, fp8_per_tensor) { dense_format(LOOM_QFMT_FP8_W8A8, true, "qlinear.fp8_pt"); }

/* A SmoothQuant vector on a W8A8 format: x / smooth is what is quantized. */
static void smooth_format(loom_qformat fmt, bool per_tensor, const char *name) {
    test_rng r = rng_seeded(name);
    for (int it = 0; it < 12; it++) {
        int64_t K = 1 + rng_int(&r, 300), n = 1 + rng_int(&r, 40), M = rand_m(&r);
        tw t;
        tw_make(&t, &r, fmt, LOOM_DTYPE_COUNT, n, K, 0, per_tensor);
        float *sm = malloc((size_t)K * 4);
        for (int64_t k = 0; k < K; k++) sm[k] = (float)rng_range(&r, 0.2, 5.0);
        t.q.smooth = view(LOOM_DTYPE_F32, K, 0, sm, (size_t)K * 4);
        char why[128];
        cr_assert(loom_cpu_qweight_init(&t.w, &t.q, why, sizeof why), "%s", why);
        cr_assert_eq(t.w.smooth, sm);
        run_one(&r, &t, M, sm, name);
        free(sm);
        tw_free(&t);
    }
}

Test(qlinear, int8_w8a8_smoothquant) { smooth_format(LOOM_QFMT_INT8_W8A8, false, "qlinear.w8a8_smooth"); }
Test(qlinear, fp8_smoothquant_per_channel) { smooth_format(LOOM_QFMT_FP8_W8A8, false, "qlinear.fp8_smooth_pc"); }
Test(qlinear, fp8_smoothquant_per_tensor) { smooth_format(LOOM_QFMT_FP8_W8A8, true, "qlinear.fp8_smooth_pt"); }

Test(qlinear, int4_w4a16) {
    test_rng r = rng_seeded("qlinear.int4");
    static const int64_t kg[][2] = {{2, 2}, {6, 2}, {40, 8}, {96, 32}, {100, 10}, {576, 64},
                                    {576, 96}, {256, 128}, {1536, 128}};
    for (int it = 0; it < 40; it++) {
        int c = (int)rng_int(&r, 9);
        int64_t K = kg[c][0], n = 1 + rng_int(&r, 70), M = rand_m(&r);
        tw t;
        tw_make(&t, &r, LOOM_QFMT_INT4_W4A16, LOOM_DTYPE_COUNT, n, K, (int32_t)kg[c][1], false);
        run_one(&r, &t, M, NULL, "int4");
        tw_free(&t);
    }
}

Test(qlinear, gguf_blocks) {
    test_rng r = rng_seeded("qlinear.gguf");
    static const loom_dtype types[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_Q4_1, LOOM_DTYPE_Q5_0, LOOM_DTYPE_Q8_0,
                                       LOOM_DTYPE_Q4_K, LOOM_DTYPE_Q5_K, LOOM_DTYPE_Q6_K};
    const int ntypes = (int)(sizeof types / sizeof types[0]);
    for (int it = 0; it < 10 * ntypes; it++) {
        loom_dtype gt = types[it % ntypes];
        int64_t be = loom_dtype_block_elems(gt);
        int64_t K = be * (1 + rng_int(&r, be == 32 ? 20 : 3)), n = 1 + rng_int(&r, 50);
        int64_t M = rand_m(&r);
        tw t;
        tw_make(&t, &r, LOOM_QFMT_GGUF, gt, n, K, 0, false);
        run_one(&r, &t, M, NULL, loom_dtype_name(gt));
        tw_free(&t);
    }
}

/* A GGUF token's result does not depend on the batch it is in: M tokens at
 * once (past one 64-token pass of the 16-row tiles: 65, 130), the same
 * tokens alone and as a run of 8 give the same bits, with and without the
 * pool, for rows that end mid-tile, on every instruction set here (the
 * block-exact tiles on avx512vnni, the 8-lane kernels elsewhere). */
Test(qlinear, gguf_token_bits_do_not_depend_on_the_batch) {
    test_rng r = rng_seeded("qlinear.gguf_batch_bits");
    static const loom_dtype types[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_Q4_1, LOOM_DTYPE_Q5_0, LOOM_DTYPE_Q8_0,
                                       LOOM_DTYPE_Q4_K, LOOM_DTYPE_Q5_K, LOOM_DTYPE_Q6_K};
    static const char *const isas[] = {NULL, "avx512", "avx2", "portable"};
    const int ntypes = (int)(sizeof types / sizeof types[0]);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!loom_cpu_q8_force_isa(isas[i])) continue;
        for (int it = 0; it < 2 * ntypes; it++) {
            const loom_dtype gt = types[it % ntypes];
            const int64_t be = loom_dtype_block_elems(gt), K = be * (1 + rng_int(&r, be == 32 ? 12 : 2));
            const int64_t n = 1 + rng_int(&r, 70), M = it % 2 ? 130 : 65;
            tw t;
            tw_make(&t, &r, LOOM_QFMT_GGUF, gt, n, K, 0, false);
            float *x = malloc((size_t)(M * K) * 4), *all = malloc((size_t)(M * n) * 4);
            float *one = malloc((size_t)n * 4), *run = malloc((size_t)(8 * n) * 4);
            rng_fill(&r, x, M * K, 1.0);
            cr_assert(loom_cpu_qlinear(all, n, x, K, &t.w, NULL, M, 0.0f, g_scratch, g_pool));
            const int64_t m0 = rng_int(&r, M - 8);
            cr_assert(loom_cpu_qlinear(run, n, x + m0 * K, K, &t.w, NULL, 8, 0.0f, g_scratch, NULL));
            for (int64_t m = 0; m < M; m++) {
                cr_assert(loom_cpu_qlinear(one, n, x + m * K, K, &t.w, NULL, 1, 0.0f, g_scratch,
                                           m % 2 ? g_pool : NULL));
                cr_assert(!memcmp(one, all + m * n, (size_t)n * 4), "%s %s n %lld K %lld: token %lld of %lld "
                          "alone differs from the batch", isas[i] ? isas[i] : "best", loom_dtype_name(gt),
                          (long long)n, (long long)K, (long long)m, (long long)M);
                if (m >= m0 && m < m0 + 8)
                    cr_assert(!memcmp(run + (m - m0) * n, all + m * n, (size_t)n * 4),
                              "%s %s: token %lld in a run of 8 differs", isas[i] ? isas[i] : "best",
                              loom_dtype_name(gt), (long long)m);
            }
            check_part(&t, x, K, M, NULL, 0.0f, all, all, n, 0, NULL, loom_dtype_name(gt));
            free(x), free(all), free(one), free(run);
            tw_free(&t);
        }
    }
    cr_assert(loom_cpu_q8_force_isa(NULL));
}

/* f16 / bf16 weights kept as stored (what the cpu backend does with a 16-bit
 * file's linear weights): float activations, every M path (fused rows, tiles,
 * sgemm panels), K with and without a tail of 16. */
Test(qlinear, sixteen_bit_weights) {
    test_rng r = rng_seeded("qlinear.f16");
    static const int64_t ks[] = {1, 7, 16, 31, 64, 100, 257, 576};
    static const int64_t ms[] = {1, 2, 4, 5, 16, 33, 40};
    for (int it = 0; it < 48; it++) {
        const loom_dtype gt = it % 2 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F16;
        const int64_t K = ks[rng_int(&r, 8)], n = 1 + rng_int(&r, 60), M = ms[rng_int(&r, 7)];
        tw t;
        tw_make(&t, &r, LOOM_QFMT_GGUF, gt, n, K, 0, false);
        run_one(&r, &t, M, NULL, loom_dtype_name(gt));
        tw_free(&t);
    }
}

/* The kernels' vector half -> float decode is the scalar codec's, bit for
 * bit, on all 65536 codes (NaNs stay NaN); bf16 likewise. */
Test(qlinear, sixteen_bit_decode_every_code) {
    static uint16_t codes[65536];
    static float got[65536];
    for (int i = 0; i < 65536; i++) codes[i] = (uint16_t)i;
    for (int b = 0; b < 2; b++) {
        const loom_dtype dt = b ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F16;
        loom_tensor t = view(dt, 1, 65536, codes, sizeof codes);
        loom_cpu_qweight w;
        char why[256];
        cr_assert(loom_cpu_qweight_gguf(&w, &t, why, sizeof why), "%s", why);
        loom_cpu_qweight_rows(&w, 0, 1, got);
        for (int i = 0; i < 65536; i++) {
            const float want = b ? loom_bf16_to_fp32((uint16_t)i) : loom_fp16_to_fp32((uint16_t)i);
            uint32_t gb, wb;
            memcpy(&gb, &got[i], 4);
            memcpy(&wb, &want, 4);
            cr_assert(isnan(want) ? isnan(got[i]) : gb == wb, "%s code 0x%04x: %.9g (0x%08x), want %.9g (0x%08x)",
                      loom_dtype_name(dt), i, got[i], gb, want, wb);
        }
    }
}

Test(qlinear, fused_parts_match_reference) {
    test_rng r = rng_seeded("qlinear.parts");
    for (int it = 0; it < 10; it++) {
        /* M >= LOOM_CPU_QLINEAR_PANEL_M splits the call: sgemm panels for the
         * float-activation parts, the fused job for W8A8 + FP8 */
        const int64_t K = 64 * (1 + rng_int(&r, 4)), M = it < 3 ? 33 + it : rand_m(&r);
        /* mixed formats in one call, W8A8 and FP8 activations prepared once */
        static const loom_qformat f0[5] = {LOOM_QFMT_INT8_W8A16, LOOM_QFMT_INT4_W4A16,
                                           LOOM_QFMT_FP8_W8A8, LOOM_QFMT_INT8_W8A8, LOOM_QFMT_GGUF};
        static const loom_qformat f1[5] = {LOOM_QFMT_FP8_W8A8, LOOM_QFMT_GGUF, LOOM_QFMT_INT8_W8A8,
                                           LOOM_QFMT_INT4_W4A16, LOOM_QFMT_INT8_W8A16};
        const loom_qformat *f = it % 2 ? f1 : f0; /* W8A8/FP8 adjacent, or not */
        tw t[5];
        const loom_cpu_qweight *ws[5];
        const float *bs[5];
        float *bias[5];
        int64_t N = 0;
        for (int p = 0; p < 5; p++) {
            int64_t n = 1 + rng_int(&r, 40);
            tw_make(&t[p], &r, f[p], LOOM_DTYPE_Q4_1, n, K, 32, false);
            ws[p] = &t[p].w;
            bias[p] = malloc((size_t)n * 4);
            rng_fill(&r, bias[p], n, 0.1);
            bs[p] = p % 2 ? bias[p] : NULL;
            N += n;
        }
        float *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4);
        float *y0 = malloc((size_t)(M * N) * 4);
        rng_fill(&r, x, M * K, 1.0);
        rng_fill(&r, y0, M * N, 1.0);
        memcpy(y, y0, (size_t)(M * N) * 4);
        cr_assert(loom_cpu_qlinear_multi(y, N, x, K, ws, bs, 5, M, 1.0f, g_scratch, g_pool));
        int64_t col = 0;
        for (int p = 0; p < 5; p++) {
            check_part(&t[p], x, K, M, bs[p], 1.0f, y0, y, N, col, NULL, "parts");
            col += t[p].w.n;
            tw_free(&t[p]);
            free(bias[p]);
        }
        free(x), free(y), free(y0);
    }
}


/* Two parts (formats f0, f1) through one call; mode 0: different vectors,
 * 1: the second has none, 2: both share the first's (fused). */
static void parts_smoothing(loom_qformat f0, loom_qformat f1, int64_t M, int mode) {
    test_rng r = rng_seeded("qlinear.parts_smooth");
    const int64_t K = 48;
    tw t[2];
    float *sm[2];
    const loom_cpu_qweight *ws[2];
    const loom_qformat f[2] = {f0, f1};
    for (int p = 0; p < 2; p++) {
        tw_make(&t[p], &r, f[p], LOOM_DTYPE_COUNT, 9 + p, K, 0, false);
        sm[p] = malloc(K * 4);
        for (int64_t k = 0; k < K; k++) sm[p][k] = (float)rng_range(&r, 0.5, 2.0);
        const float *v = p == 0 || mode == 0 ? sm[p] : mode == 2 ? sm[0] : NULL;
        if (v) t[p].q.smooth = view(LOOM_DTYPE_F32, K, 0, (void *)v, K * 4);
        char why[128];
        cr_assert(loom_cpu_qweight_init(&t[p].w, &t[p].q, why, sizeof why));
        ws[p] = &t[p].w;
    }
    float *x = malloc((size_t)(M * K) * 4), *y = calloc((size_t)(M * 19), 4);
    float *y0 = calloc((size_t)(M * 19), 4);
    rng_fill(&r, x, M * K, 1.0);
    cr_assert(loom_cpu_qlinear_multi(y, 19, x, K, ws, NULL, 2, M, 0.0f, g_scratch, g_pool));
    check_part(&t[0], x, K, M, NULL, 0.0f, y0, y, 19, 0, sm[0], "smooth0");
    check_part(&t[1], x, K, M, NULL, 0.0f, y0, y, 19, 9, t[1].w.smooth, "smooth1");
    for (int p = 0; p < 2; p++) tw_free(&t[p]), free(sm[p]);
    free(x), free(y), free(y0);
}

/* Parts that quantize x (INT8 / FP8 W8A8, in any mix) with different
 * smoothing vectors, one with a vector and one without, or one shared
 * vector, at a fused M (5) and a panel M (40): each part's x / smooth is
 * its own. */
Test(qlinear, parts_with_different_smoothing_split) {
    static const loom_qformat fmts[][2] = {{LOOM_QFMT_INT8_W8A8, LOOM_QFMT_INT8_W8A8},
                                           {LOOM_QFMT_FP8_W8A8, LOOM_QFMT_FP8_W8A8},
                                           {LOOM_QFMT_INT8_W8A8, LOOM_QFMT_FP8_W8A8},
                                           {LOOM_QFMT_FP8_W8A8, LOOM_QFMT_INT8_W8A8}};
    for (int f = 0; f < 4; f++)
        for (int mode = 0; mode < 3; mode++) {
            parts_smoothing(fmts[f][0], fmts[f][1], 5, mode);
            parts_smoothing(fmts[f][0], fmts[f][1], 40, mode);
        }
}


/* Slices (tensor parallelism): rows and aligned columns of every format,
 * against the reference restricted to the same block. */
Test(qlinear, slices_match_reference) {
    test_rng r = rng_seeded("qlinear.slices");
    static const struct {
        loom_qformat f;
        loom_dtype gt;
        int32_t g;
        bool pt, smooth;
    } cases[] = {
        {LOOM_QFMT_INT8_W8A16, LOOM_DTYPE_COUNT, 0, false, false},
        {LOOM_QFMT_INT8_W8A8, LOOM_DTYPE_COUNT, 0, false, true},
        {LOOM_QFMT_FP8_W8A8, LOOM_DTYPE_COUNT, 0, false, false},
        {LOOM_QFMT_FP8_W8A8, LOOM_DTYPE_COUNT, 0, true, false},
        {LOOM_QFMT_FP8_W8A8, LOOM_DTYPE_COUNT, 0, false, true},
        {LOOM_QFMT_INT4_W4A16, LOOM_DTYPE_COUNT, 32, false, false},
        {LOOM_QFMT_INT4_W4A16, LOOM_DTYPE_COUNT, 8, false, false},
        {LOOM_QFMT_GGUF, LOOM_DTYPE_Q4_1, 0, false, false},
        {LOOM_QFMT_GGUF, LOOM_DTYPE_Q4_K, 0, false, false},
        {LOOM_QFMT_GGUF, LOOM_DTYPE_Q5_K, 0, false, false},
        {LOOM_QFMT_GGUF, LOOM_DTYPE_Q5_0, 0, false, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int it = 0; it < 4; it++) {
            const int64_t n = 24, K = 512;
            tw t;
            tw_make(&t, &r, cases[c].f, cases[c].gt, n, K, cases[c].g, cases[c].pt);
            float *sm = NULL;
            char why[256];
            if (cases[c].smooth) {
                sm = malloc(K * 4);
                for (int64_t k = 0; k < K; k++) sm[k] = (float)rng_range(&r, 0.5, 2.0);
                t.q.smooth = view(LOOM_DTYPE_F32, K, 0, sm, K * 4);
                cr_assert(loom_cpu_qweight_init(&t.w, &t.q, why, sizeof why));
            }
            int64_t al = cases[c].f == LOOM_QFMT_GGUF ? loom_dtype_block_elems(cases[c].gt)
                         : cases[c].g                 ? cases[c].g
                                                      : 1;
            if (al == 1) al = 1 + rng_int(&r, 7); /* any column for 1-byte formats */
            int64_t r0 = rng_int(&r, n - 1), nr = 1 + rng_int(&r, n - r0);
            int64_t nb = K / al, b0 = rng_int(&r, nb), bn = 1 + rng_int(&r, nb - b0);
            int64_t c0 = b0 * al, nc = bn * al;
            tw sub = {.ref = malloc((size_t)(nr * nc) * 8), .mag = malloc((size_t)(nr * nc) * 8)};
            cr_assert(loom_cpu_qweight_slice(&sub.w, &t.w, r0, nr, c0, nc, why, sizeof why), "%s",
                      why);
            for (int64_t i = 0; i < nr; i++)
                for (int64_t k = 0; k < nc; k++) {
                    sub.ref[i * nc + k] = t.ref[(r0 + i) * K + c0 + k];
                    sub.mag[i * nc + k] = t.mag[(r0 + i) * K + c0 + k];
                }
            int64_t M = rand_m(&r);
            float *x = malloc((size_t)(M * nc) * 4), *y = calloc((size_t)(M * nr), 4);
            float *y0 = calloc((size_t)(M * nr), 4);
            rng_fill(&r, x, M * nc, 1.0);
            cr_assert(loom_cpu_qlinear(y, nr, x, nc, &sub.w, NULL, M, 0.0f, g_scratch, g_pool));
            check_part(&sub, x, nc, M, NULL, 0.0f, y0, y, nr, 0, sm ? sm + c0 : NULL, "slice");
            free(x), free(y), free(y0), free(sub.ref), free(sub.mag), free(sm);
            tw_free(&t);
        }
    /* misaligned and out-of-range slices are refused with a reason */
    tw t;
    char why[256];
    loom_cpu_qweight v;
    tw_make(&t, &r, LOOM_QFMT_INT4_W4A16, LOOM_DTYPE_COUNT, 4, 64, 32, false);
    cr_assert_not(loom_cpu_qweight_slice(&v, &t.w, 0, 4, 16, 32, why, sizeof why));
    cr_assert(strstr(why, "group of 32"), "%s", why);
    cr_assert_not(loom_cpu_qweight_slice(&v, &t.w, 2, 3, 0, 64, why, sizeof why));
    cr_assert(strstr(why, "outside"), "%s", why);
    tw_free(&t);
}

Test(qlinear, decode_rows_matches_reference) {
    test_rng r = rng_seeded("qlinear.rows");
    tw t;
    tw_make(&t, &r, LOOM_QFMT_INT4_W4A16, LOOM_DTYPE_COUNT, 7, 64, 16, false);
    float out[3 * 64];
    loom_cpu_qweight_rows(&t.w, 2, 3, out);
    for (int i = 0; i < 3 * 64; i++)
        cr_assert_float_eq(out[i], t.ref[2 * 64 + i], 1e-6);
    cr_assert_eq(loom_cpu_qweight_bytes(&t.w), (size_t)(7 * 32 + 7 * 4 * 8));
    tw_free(&t);
    /* GGUF blocks with no 16-wide decoder (q5_0, q5_k) decode exactly as the
     * core's dequantizer does */
    static const loom_dtype gts[] = {LOOM_DTYPE_Q5_0, LOOM_DTYPE_Q5_K};
    for (int i = 0; i < 2; i++) {
        const int64_t K = gts[i] == LOOM_DTYPE_Q5_0 ? 96 : 256;
        float rows[3 * 256];
        tw_make(&t, &r, LOOM_QFMT_GGUF, gts[i], 5, K, 0, false);
        loom_cpu_qweight_rows(&t.w, 1, 3, rows);
        for (int64_t e = 0; e < 3 * K; e++)
            cr_assert(rows[e] == t.ref[K + e], "%s row %lld col %lld: %.9g, dequantizer %.9g", loom_dtype_name(gts[i]),
                      (long long)(1 + e / K), (long long)(e % K), rows[e], t.ref[K + e]);
        tw_free(&t);
    }
}

Test(qlinear, weight_views_check_sizes) {
    char why[256];
    loom_cpu_qweight w;
    int8_t d[12];
    float s[3], z[3];
    loom_qtensor q = {.struct_size = sizeof q, .format = LOOM_QFMT_INT8_W8A16, .rows = 3, .cols = 4};
    q.data = view(LOOM_DTYPE_I8, 3, 4, d, 12);
    q.scales = view(LOOM_DTYPE_F32, 2, 0, s, 8);
    cr_assert_not(loom_cpu_qweight_init(&w, &q, why, sizeof why));
    cr_assert(strstr(why, "scales"), "%s", why);
    q.scales = view(LOOM_DTYPE_F32, 3, 0, s, 12);
    cr_assert(loom_cpu_qweight_init(&w, &q, why, sizeof why), "%s", why);
    q.data.dtype = LOOM_DTYPE_U8;
    cr_assert_not(loom_cpu_qweight_init(&w, &q, why, sizeof why));
    cr_assert(strstr(why, "i8"), "%s", why);
    /* int4: group must divide the columns */
    loom_qtensor q4 = {.struct_size = sizeof q4, .format = LOOM_QFMT_INT4_W4A16, .rows = 1,
                       .cols = 6, .group_size = 4};
    q4.data = view(LOOM_DTYPE_U8, 1, 3, d, 3);
    q4.scales = view(LOOM_DTYPE_F32, 1, 1, s, 4);
    q4.zeros = view(LOOM_DTYPE_F32, 1, 1, z, 4);
    cr_assert_not(loom_cpu_qweight_init(&w, &q4, why, sizeof why));
    cr_assert(strstr(why, "group_size 4"), "%s", why);
    /* fp8 scale count */
    loom_qtensor q8 = {.struct_size = sizeof q8, .format = LOOM_QFMT_FP8_W8A8, .rows = 3, .cols = 4};
    q8.data = view(LOOM_DTYPE_FP8_E4M3, 3, 4, d, 12);
    q8.scales = view(LOOM_DTYPE_F32, 2, 0, s, 8);
    cr_assert_not(loom_cpu_qweight_init(&w, &q8, why, sizeof why));
    q8.scales = view(LOOM_DTYPE_F32, 1, 0, s, 4);
    cr_assert(loom_cpu_qweight_init(&w, &q8, why, sizeof why));
    cr_assert(w.per_tensor);
    /* GGUF: unsupported type, partial blocks */
    loom_tensor g = view(LOOM_DTYPE_I32, 2, 32, d, 12);
    cr_assert_not(loom_cpu_qweight_gguf(&w, &g, why, sizeof why));
    cr_assert(strstr(why, "i32"), "%s", why);
    g = view(LOOM_DTYPE_BF16, 2, 32, d, 12);
    cr_assert_not(loom_cpu_qweight_gguf(&w, &g, why, sizeof why)); /* 128 bytes needed */
    g = view(LOOM_DTYPE_Q4_K, 2, 255, d, 12);
    cr_assert_not(loom_cpu_qweight_gguf(&w, &g, why, sizeof why));
    g = view(LOOM_DTYPE_Q4_0, 2, 32, d, 12);
    cr_assert_not(loom_cpu_qweight_gguf(&w, &g, why, sizeof why)); /* 36 bytes needed */
    cr_assert(strstr(why, "36"), "%s", why);
    cr_assert_not(loom_cpu_qformat_supported(LOOM_QFMT_NONE, LOOM_DTYPE_F32));
    cr_assert(loom_cpu_qformat_supported(LOOM_QFMT_GGUF, LOOM_DTYPE_BF16));
    cr_assert_not(loom_cpu_qformat_supported(LOOM_QFMT_GGUF, LOOM_DTYPE_I32));
}
