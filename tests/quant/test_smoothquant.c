/*
 * tests/quant/test_smoothquant.c — SmoothQuant in the int8 (w8a8) and fp8
 * quantizers (suite 'quant'):
 *   - the factor formula (qcalib.c) on hand-computed cases: group maximum
 *     over several weights, alpha 1, the clamps, all-zero channels;
 *   - each plugin (dlopen'ed, fake host) on fresh random Q/K/V and down
 *     weights whose activations have outlier channels: Q, K and V share one
 *     smoothing vector (one pointer), dequantized W' diag(1/s) reproduces W
 *     within one rounding step per element (half an int8 step; E4M3's half
 *     ulp), and the product through the cpu kernel (which divides x by s) is
 *     closer to the float64 reference than without smoothing (int8; fp8 with
 *     per-channel scales — per-tensor fp8 is checked for the arithmetic only,
 *     see fp8_outliers_lower_error);
 *   - the statistics file: exact round trip, and every bad input (missing,
 *     bad magic, version, truncated anywhere, zero width, NaN, duplicate
 *     name, trailing bytes) refused with the file (and record) named;
 *   - int8 `weight_only` inside w8a8 + SmoothQuant: a matched tensor is the
 *     plain W8A16 tensor (no vector, no calibration record, float
 *     activations in the kernel), the others W8A8 smoothed;
 *   - the plugins' configuration errors: int8 w8a16; for both, no file, an
 *     unreadable file, a file lacking a tensor or recording another width.
 * The real-model checks (perplexity on a slice, calibrated on a disjoint
 * slice) are in test_cli.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../plugins/quantizer/common/qcalib.h"
#include "../../plugins/quantizer/common/qcommon.h"
#include "rng.h"
#include "fake_host.h"
#include "qlinear.h"
#include "qt_util.h"

#define SETS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const loom_quant_ops *ops_of(const loom_component *c) { return c->ops; }

/* create() through the current fake host without resetting its counters
 * (fake_host(), which qt_create calls, starts them from zero), so two live
 * instances are both counted. */
static loom_status create_kept(const loom_component *comp, const char *const *sets, void **self,
                               loom_error *err) {
    void *cfg = qt_config(comp, sets);
    static const loom_host *h;
    if (!h) h = fake_host();
    loom_status st = ops_of(comp)->create(h, cfg, self, err);
    free(cfg);
    return st;
}

/* A temporary file name; the caller unlinks it. */
static void tmp_name(char *out, size_t n, const char *tag) {
    snprintf(out, n, "/tmp/loom-sq-%s-%d-XXXXXX", tag, (int)getpid());
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
}

/* ------------------------------------------------------------ formula */

Test(smoothquant, factors_formula) {
    /* two weights (2 x 4) and (1 x 4) sharing one input of 4 channels */
    const float w0[] = {1, -2, 0, 0.5f, /**/ -3, 1, 0, 0.25f};
    const float w1[] = {2, 4, 0, -1};
    const float *ws[] = {w0, w1};
    const int64_t rows[] = {2, 1};
    const float amax[] = {9, 16, 0, 4};
    float s[4];
    qc_smooth_factors(amax, ws, rows, 2, 4, 0.5, s);
    /* wmax = {3, 4, 0, 1} over both weights */
    cr_assert_float_eq(s[0], sqrtf(9.0f) / sqrtf(3.0f), 1e-6);
    cr_assert_float_eq(s[1], 4.0f / 2.0f, 1e-6);
    cr_assert_float_eq(s[2], 1.0f, 0, "all-zero channel keeps s = 1");
    cr_assert_float_eq(s[3], 2.0f, 1e-6);
    qc_smooth_factors(amax, ws, rows, 2, 4, 1.0, s); /* alpha 1: s = amax */
    cr_assert_float_eq(s[1], 16.0f, 1e-5);
    /* a dead activation channel with live weights: max(0, 1e-5)^a / wmax^(1-a), clamped */
    const float dead[] = {0, 0, 0, 0};
    qc_smooth_factors(dead, ws, rows, 2, 4, 0.9, s);
    for (int j = 0; j < 4; j++) cr_assert(s[j] >= QC_SMOOTH_MIN && s[j] <= QC_SMOOTH_MAX);
    const float huge[] = {1e30f, 1e30f, 1e30f, 1e30f};
    qc_smooth_factors(huge, ws, rows, 2, 4, 1.0, s);
    cr_assert_float_eq(s[0], QC_SMOOTH_MAX, 0);
}

/* --------------------------------------------------- plugin on outliers */

enum { K = 256, NQ = 96, NKV = 32, ND = 64, KD = 128, M_CAL = 64, M_TEST = 48 };

/* Activations (rows, cols): N(0, 1) with every 37th channel `big` times
 * larger, as the LLM activations SmoothQuant addresses. */
static void outlier_acts(test_rng *r, float *x, int64_t rows, int64_t cols, double big) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < cols; j++)
            x[t * cols + j] = (float)(rng_normal(r) * (j % 37 == 5 ? big : 1.0));
}

static void col_amax(const float *x, int64_t rows, int64_t cols, float *amax) {
    for (int64_t j = 0; j < cols; j++) amax[j] = 0;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < cols; j++) amax[j] = fmaxf(amax[j], fabsf(x[t * cols + j]));
}

/* A stats file for layer 0's q, k, v (one vector) and down. */
static void write_stats(const char *path, const float *amax_qkv, const float *amax_down,
                        const char *skip_name, int64_t bad_width) {
    static const char *const names[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                        "blk.0.attn_v.weight", "blk.0.ffn_down.weight"};
    qc_calib c = {.tokens = M_CAL, .e = calloc(4, sizeof(qc_calib_entry))};
    for (int i = 0; i < 4; i++) {
        if (skip_name && !strcmp(skip_name, names[i])) continue;
        qc_calib_entry *e = &c.e[c.count++];
        snprintf(e->name, sizeof e->name, "%s", names[i]);
        e->cols = i < 3 ? K : KD;
        e->amax = (float *)(i < 3 ? amax_qkv : amax_down);
        if (i == 0 && bad_width) e->cols = bad_width;
    }
    char why[512];
    cr_assert(qc_calib_write(path, &c, why, sizeof why), "%s", why);
    free(c.e);
}

static void small_layer(qt_model *m, test_rng *r) {
    qt_model_init(m);
    qt_model_add_f32(m, "blk.0.attn_q.weight", NQ, K, 0.05, false, r);
    qt_model_add_f32(m, "blk.0.attn_k.weight", NKV, K, 0.05, false, r);
    qt_model_add_f32(m, "blk.0.attn_v.weight", NKV, K, 0.05, false, r);
    qt_model_add_f32(m, "blk.0.ffn_down.weight", ND, KD, 0.05, false, r);
}

/* y (M, N) = x (M, K) @ W^T through the cpu kernel for the qtensors of the
 * fused parts; returns max-relative error against float64. */
static double kernel_err(loom_qtensor *const *q, const loom_tensor *const *w, int nparts,
                         const float *x, int64_t M) {
    loom_cpu_pool *pool = loom_cpu_pool_create(2);
    loom_cpu_qscratch *sc = loom_cpu_qscratch_create();
    cr_assert(pool && sc);
    loom_cpu_qweight qw[4];
    const loom_cpu_qweight *ptr[4];
    int64_t N = 0, k = w[0]->shape[1];
    char why[256];
    for (int p = 0; p < nparts; p++) {
        cr_assert(loom_cpu_qweight_init(&qw[p], q[p], why, sizeof why), "%s", why);
        ptr[p] = &qw[p];
        N += w[p]->shape[0];
    }
    float *y = calloc((size_t)(M * N), sizeof(float));
    double *ref = calloc((size_t)(M * N), sizeof(double));
    cr_assert(loom_cpu_qlinear_multi(y, N, x, k, ptr, NULL, nparts, M, 0.0f, sc, pool));
    int64_t off = 0;
    for (int p = 0; p < nparts; p++) {
        const float *wf = w[p]->data;
        for (int64_t t = 0; t < M; t++)
            for (int64_t r = 0; r < w[p]->shape[0]; r++) {
                double acc = 0;
                for (int64_t j = 0; j < k; j++) acc += (double)x[t * k + j] * wf[r * k + j];
                ref[t * N + off + r] = acc;
            }
        off += w[p]->shape[0];
    }
    double e = 0, den = 0; /* Frobenius relative error */
    for (int64_t i = 0; i < M * N; i++) {
        e += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    free(y);
    free(ref);
    loom_cpu_qscratch_destroy(sc);
    loom_cpu_pool_destroy(pool);
    return sqrt(e / den);
}

/* One quantizer with SmoothQuant on outlier activations. */
typedef struct sq_case {
    const char *so_env;        /* LOOM_QUANT_*_SO: the plugin                      */
    const char *base;          /* its W8A8 setting ("mode=w8a8", "scales=...")     */
    loom_qformat fmt;          /* the plan format it makes                         */
    bool per_channel;          /* FP8: one scale per row (int8 always)             */
    double big;                /* outlier channels' magnitude                      */
    double qkv_ratio;          /* smoothed QKV error must be below ratio x plain,
                                  and down's below plain; 0: not compared          */
    const char *tag;
} sq_case;

/* Bound on |W'[r, j] - dequant(quant(W'))[r, j]| for the smoothed weight
 * element w (row scale sc): half an int8 step, or E4M3's half ulp (2^-4
 * relative for normal codes, 2^-10 x scale in the subnormal range). */
static double elem_bound(const sq_case *c, double w, double sc) {
    return c->fmt == LOOM_QFMT_INT8_W8A8 ? 0.5 * sc : 0x1p-4 * fabs(w) + 0x1p-10 * sc;
}

/* The plugin (dlopen'ed, fake host) on fresh random Q/K/V and down weights
 * whose activations have outlier channels: shared vector, the documented
 * factors, W' diag(1/s) close to W, and a lower W8A8 product error through
 * the cpu kernel. */
static void outliers_case(const sq_case *c) {
    test_rng r = rng_seeded(c->tag);
    const loom_component *comp = qt_component(c->so_env);
    qt_model m;
    small_layer(&m, &r);
    float *xc = malloc(sizeof(float) * M_CAL * K), *xt = malloc(sizeof(float) * M_TEST * K);
    float amax_qkv[K], amax_down[KD];
    outlier_acts(&r, xc, M_CAL, K, c->big);
    col_amax(xc, M_CAL, K, amax_qkv);
    outlier_acts(&r, xc, M_CAL, KD, c->big);
    col_amax(xc, M_CAL, KD, amax_down);
    char path[128];
    tmp_name(path, sizeof path, "stats");
    write_stats(path, amax_qkv, amax_down, NULL, 0);
    char cal[200];
    snprintf(cal, sizeof cal, "calibration=%s", path);

    void *plain = NULL, *smooth = NULL;
    loom_error err = {0};
    cr_assert_eq(create_kept(comp, SETS(c->base), &plain, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(create_kept(comp, SETS(c->base, "smoothquant=0.5", cal), &smooth, &err), LOOM_OK,
                 "%s", err.message);
    const loom_quant_ops *ops = ops_of(comp);
    static const char *const qkv[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                      "blk.0.attn_v.weight"};
    /* quantize V first: the group's vector must not depend on the order */
    static const int order[] = {2, 0, 1};
    loom_qtensor qp[3], qs[3];
    const loom_tensor *w[3];
    for (int i = 0; i < 3; i++) {
        int p = order[i];
        w[p] = m.view.get(m.view.ctx, qkv[p]);
        loom_quant_plan plan;
        cr_assert_eq(ops->plan(smooth, &m.view, w[p], &plan, &err), LOOM_OK, "%s", err.message);
        cr_assert_eq(plan.format, c->fmt);
        cr_assert_eq(ops->quantize(plain, &m.view, w[p], &plan, &qp[p], &err), LOOM_OK, "%s", err.message);
        cr_assert_eq(ops->quantize(smooth, &m.view, w[p], &plan, &qs[p], &err), LOOM_OK, "%s", err.message);
        cr_assert_null(qp[p].smooth.data, "no smoothing without smoothquant");
    }
    const float *s = qs[0].smooth.data;
    cr_assert_not_null(s);
    cr_assert_eq(qs[0].smooth.dtype, LOOM_DTYPE_F32);
    cr_assert_eq(qs[0].smooth.shape[0], K);
    cr_assert_eq(qs[1].smooth.data, s, "Q, K, V share one vector (fused kernels need it)");
    cr_assert_eq(qs[2].smooth.data, s);

    /* the same factors from the documented formula over Q, K, V together */
    float want[K];
    const float *wf[3] = {w[0]->data, w[1]->data, w[2]->data};
    const int64_t rows[3] = {NQ, NKV, NKV};
    qc_smooth_factors(amax_qkv, wf, rows, 3, K, 0.5, want);
    for (int j = 0; j < K; j++) cr_assert_float_eq(s[j], want[j], 0, "channel %d", j);

    /* W' diag(1/s) reproduces W within one rounding step of the smoothed row */
    for (int p = 0; p < 3; p++) {
        int64_t n = w[p]->shape[0];
        float *dq = malloc(sizeof(float) * (size_t)(n * K));
        if (c->fmt == LOOM_QFMT_INT8_W8A8) qc_int8_dequant(qs[p].data.data, qs[p].scales.data, n, K, dq);
        else qc_fp8_dequant(qs[p].data.data, qs[p].scales.data, c->per_channel, n, K, dq);
        const float *sc = qs[p].scales.data, *wo = w[p]->data;
        for (int64_t rr = 0; rr < n; rr++)
            for (int j = 0; j < K; j++) {
                double back = (double)dq[rr * K + j] / s[j];
                double ws = (double)wo[rr * K + j] * s[j];
                double bound = elem_bound(c, ws, sc[c->per_channel ? rr : 0]) / s[j] * (1 + 1e-5) + 1e-12;
                cr_assert_leq(fabs(back - wo[rr * K + j]), bound, "%s [%lld, %d]: %g vs %g", qkv[p],
                              (long long)rr, j, back, wo[rr * K + j]);
            }
        free(dq);
    }

    /* the W8A8 product on fresh activations with the same outlier channels */
    outlier_acts(&r, xt, M_TEST, K, c->big);
    loom_qtensor *pp[3] = {&qp[0], &qp[1], &qp[2]}, *ps[3] = {&qs[0], &qs[1], &qs[2]};
    double e_plain = kernel_err(pp, w, 3, xt, M_TEST), e_smooth = kernel_err(ps, w, 3, xt, M_TEST);
    cr_log_info("%s: QKV relative error: %.5f unsmoothed, %.5f smoothed (alpha 0.5)", c->tag, e_plain,
                e_smooth);
    fprintf(stderr, "%s: QKV relative error: %.5f unsmoothed, %.5f smoothed (alpha 0.5)\n", c->tag,
            e_plain, e_smooth);
    if (c->qkv_ratio > 0)
        cr_assert_lt(e_smooth, e_plain * c->qkv_ratio, "%s: smoothing should cut the error: %g vs %g",
                     c->tag, e_smooth, e_plain);

    /* down (alone in its group): its own vector */
    const loom_tensor *wd = m.view.get(m.view.ctx, "blk.0.ffn_down.weight");
    loom_quant_plan plan;
    loom_qtensor qd, qdp;
    cr_assert_eq(ops->plan(smooth, &m.view, wd, &plan, &err), LOOM_OK);
    cr_assert_eq(ops->quantize(smooth, &m.view, wd, &plan, &qd, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->quantize(plain, &m.view, wd, &plan, &qdp, &err), LOOM_OK, "%s", err.message);
    cr_assert(qd.smooth.data && qd.smooth.data != s && qd.smooth.shape[0] == KD);
    outlier_acts(&r, xt, M_TEST, KD, c->big);
    loom_qtensor *pd[1] = {&qd}, *pdp[1] = {&qdp};
    const loom_tensor *wdv[1] = {wd};
    double d_plain = kernel_err(pdp, wdv, 1, xt, M_TEST), d_smooth = kernel_err(pd, wdv, 1, xt, M_TEST);
    fprintf(stderr, "%s: down relative error: %.5f unsmoothed, %.5f smoothed\n", c->tag, d_plain,
            d_smooth);
    if (c->qkv_ratio > 0) cr_assert_lt(d_smooth, d_plain, "%s", c->tag);

    for (int p = 0; p < 3; p++) {
        ops->release(plain, &qp[p]);
        ops->release(smooth, &qs[p]);
    }
    ops->release(smooth, &qd);
    ops->release(plain, &qdp);
    ops->destroy(plain);
    ops->destroy(smooth);
    unlink(path);
    free(xc);
    free(xt);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0, "every host allocation returned (%ld live)", fake_host_live_allocs());
}

Test(smoothquant, plugin_outliers_lower_error) {
    outliers_case(&(sq_case){"LOOM_QUANT_INT8_SO", "mode=w8a8", LOOM_QFMT_INT8_W8A8, true, 60.0, 0.75,
                             "smoothquant.plugin_outliers_lower_error"});
}

/* E4M3 keeps ~2^-4 relative precision at every magnitude, so outliers hurt
 * fp8 activations far less than int8 ones (the error is dominated by the
 * outlier channels' own rounding): smoothing gains ~13% on QKV and ~17% on
 * down here with per-channel weight scales (measured 0.0319 -> 0.0278,
 * 0.0289 -> 0.0240; 12-28% at 300x..3000x outliers). With one scale per
 * tensor the boosted columns set the tensor's scale and the gain is gone
 * (+-5%, either sign; SmolLM2's perplexity gets worse too, see
 * docs/quantization.md), so per-tensor is checked for the arithmetic only.
 * The QKV bound is loose because the seed is fresh each run: over 200 seeds
 * the ratio averaged 0.84 with a worst of 0.93, and one run in a few
 * hundred lands above 0.95; a smoothing that does nothing sits at 1.0. */
Test(smoothquant, fp8_outliers_lower_error) {
    outliers_case(&(sq_case){"LOOM_QUANT_FP8_SO", "scales=per_channel", LOOM_QFMT_FP8_W8A8, true, 60.0,
                             0.98, "smoothquant.fp8_per_channel"});
    outliers_case(&(sq_case){"LOOM_QUANT_FP8_SO", "scales=per_tensor", LOOM_QFMT_FP8_W8A8, false, 60.0,
                             0.0, "smoothquant.fp8_per_tensor"});
}

/* int8 w8a8 + SmoothQuant with weight_only = "ffn_down": down becomes
 * W8A16 — exactly the weights a plain w8a16 instance makes (no smoothing,
 * scale = max|row| / 127 of the original row, within half a step of each
 * element), no `smooth` vector and no calibration record needed (the file
 * here has none for down) — and its product through the cpu kernel keeps
 * the activations float, so on outlier activations its error is the weight
 * rounding alone, far below W8A8's; Q, K, V (not matched) stay W8A8 with
 * their shared vector. */
Test(smoothquant, int8_weight_only_down_is_w8a16) {
    test_rng r = rng_seeded("smoothquant.weight_only");
    const loom_component *comp = qt_component("LOOM_QUANT_INT8_SO");
    const loom_quant_ops *ops = ops_of(comp);
    qt_model m;
    small_layer(&m, &r);
    float *xc = malloc(sizeof(float) * M_CAL * K), *xt = malloc(sizeof(float) * M_TEST * KD);
    float amax_qkv[K], amax_down[KD];
    outlier_acts(&r, xc, M_CAL, K, 60.0);
    col_amax(xc, M_CAL, K, amax_qkv);
    for (int j = 0; j < KD; j++) amax_down[j] = 1.0f;
    char path[128], cal[200];
    tmp_name(path, sizeof path, "wonly");
    write_stats(path, amax_qkv, amax_down, "blk.0.ffn_down.weight", 0); /* no record for down */
    snprintf(cal, sizeof cal, "calibration=%s", path);

    void *wo = NULL, *w16 = NULL, *w8 = NULL;
    loom_error err = {0};
    cr_assert_eq(create_kept(comp, SETS("mode=w8a8", "smoothquant=0.5", cal, "weight_only=ffn_down"), &wo,
                             &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(create_kept(comp, SETS("mode=w8a16"), &w16, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(create_kept(comp, SETS("mode=w8a8"), &w8, &err), LOOM_OK, "%s", err.message);

    /* down: W8A16, bit for bit what w8a16 makes */
    const loom_tensor *wd = m.view.get(m.view.ctx, "blk.0.ffn_down.weight");
    loom_quant_plan pd, p16, p8;
    loom_qtensor qd = {.struct_size = sizeof qd}, q16 = {.struct_size = sizeof q16},
                 q8 = {.struct_size = sizeof q8};
    cr_assert_eq(ops->plan(wo, &m.view, wd, &pd, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(pd.format, LOOM_QFMT_INT8_W8A16);
    cr_assert_eq(ops->quantize(wo, &m.view, wd, &pd, &qd, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(qd.format, LOOM_QFMT_INT8_W8A16);
    cr_assert_null(qd.smooth.data, "a weight-only tensor has no SmoothQuant vector");
    cr_assert_eq(ops->plan(w16, &m.view, wd, &p16, &err), LOOM_OK);
    cr_assert_eq(ops->quantize(w16, &m.view, wd, &p16, &q16, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(memcmp(qd.data.data, q16.data.data, (size_t)(ND * KD)), 0);
    cr_assert_eq(memcmp(qd.scales.data, q16.scales.data, sizeof(float) * ND), 0);
    const float *w = wd->data, *sc = qd.scales.data;
    const int8_t *d = qd.data.data;
    for (int64_t i = 0; i < ND; i++) {
        float amax = 0;
        for (int j = 0; j < KD; j++) amax = fmaxf(amax, fabsf(w[i * KD + j]));
        cr_assert_float_eq(sc[i], amax / 127.0f, amax * 1e-6f, "row %lld", (long long)i);
        for (int j = 0; j < KD; j++)
            cr_assert_leq(fabsf((float)d[i * KD + j] * sc[i] - w[i * KD + j]), sc[i] * 0.5f * 1.0001f);
    }
    cr_assert_eq(ops->plan(w8, &m.view, wd, &p8, &err), LOOM_OK);
    cr_assert_eq(p8.format, LOOM_QFMT_INT8_W8A8);
    cr_assert_eq(ops->quantize(w8, &m.view, wd, &p8, &q8, &err), LOOM_OK, "%s", err.message);

    /* the kernel path: float activations, so outliers cost nothing extra */
    char why[256];
    loom_cpu_qweight cw;
    cr_assert(loom_cpu_qweight_init(&cw, &qd, why, sizeof why), "%s", why);
    cr_assert_eq(cw.format, LOOM_QFMT_INT8_W8A16);
    cr_assert_null(cw.smooth);
    outlier_acts(&r, xt, M_TEST, KD, 60.0);
    loom_qtensor *a[1] = {&qd}, *b[1] = {&q8};
    const loom_tensor *wv[1] = {wd};
    double e16 = kernel_err(a, wv, 1, xt, M_TEST), e8 = kernel_err(b, wv, 1, xt, M_TEST);
    fprintf(stderr, "weight_only down: relative error %.5f W8A16, %.5f W8A8 (outliers 60x)\n", e16, e8);
    cr_assert_lt(e16, 0.012, "W8A16 error %.5f should be weight rounding only (< 1.2%%)", e16);
    cr_assert_lt(e16, e8 / 2, "W8A16 %.5f should be far below W8A8 %.5f on outlier activations", e16, e8);

    /* Q, K, V are not matched: W8A8 with one shared vector */
    static const char *const qkv[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"};
    loom_qtensor qs[3];
    for (int i = 0; i < 3; i++) {
        const loom_tensor *t = m.view.get(m.view.ctx, qkv[i]);
        loom_quant_plan p;
        qs[i] = (loom_qtensor){.struct_size = sizeof qs[i]};
        cr_assert_eq(ops->plan(wo, &m.view, t, &p, &err), LOOM_OK);
        cr_assert_eq(p.format, LOOM_QFMT_INT8_W8A8, "%s", qkv[i]);
        cr_assert_eq(ops->quantize(wo, &m.view, t, &p, &qs[i], &err), LOOM_OK, "%s", err.message);
        cr_assert_not_null(qs[i].smooth.data, "%s", qkv[i]);
        cr_assert_eq(qs[i].smooth.data, qs[0].smooth.data);
    }
    for (int i = 0; i < 3; i++) ops->release(wo, &qs[i]);
    ops->release(wo, &qd);
    ops->release(w16, &q16);
    ops->release(w8, &q8);
    ops->destroy(wo);
    ops->destroy(w16);
    ops->destroy(w8);
    unlink(path);
    free(xc);
    free(xt);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0, "every host allocation returned (%ld live)", fake_host_live_allocs());
}

/* --------------------------------------------------------- the file */

Test(smoothquant_file, round_trip) {
    test_rng r = rng_seeded("smoothquant_file.round_trip");
    qc_calib c = {.tokens = 123456789012ull, .count = 3, .e = calloc(3, sizeof(qc_calib_entry))};
    const int64_t widths[] = {576, 1, 1536};
    for (int i = 0; i < 3; i++) {
        snprintf(c.e[i].name, sizeof c.e[i].name, "blk.%d.ffn_down.weight", i);
        c.e[i].cols = widths[i];
        c.e[i].amax = malloc(sizeof(float) * (size_t)widths[i]);
        for (int64_t j = 0; j < widths[i]; j++) c.e[i].amax[j] = (float)fabs(rng_normal(&r)) * 100.0f;
    }
    c.e[0].amax[3] = 0.0f;
    c.e[2].amax[7] = 0x1p-140f; /* a subnormal survives */
    char path[128], why[512];
    tmp_name(path, sizeof path, "rt");
    cr_assert(qc_calib_write(path, &c, why, sizeof why), "%s", why);
    qc_calib back;
    cr_assert(qc_calib_read(path, &back, why, sizeof why), "%s", why);
    cr_assert_eq(back.tokens, c.tokens);
    cr_assert_eq(back.count, 3);
    for (int i = 0; i < 3; i++) {
        const qc_calib_entry *e = qc_calib_find(&back, c.e[i].name);
        cr_assert_not_null(e, "%s", c.e[i].name);
        cr_assert_eq(e->cols, widths[i]);
        cr_assert_eq(memcmp(e->amax, c.e[i].amax, sizeof(float) * (size_t)widths[i]), 0);
    }
    cr_assert_null(qc_calib_find(&back, "blk.9.ffn_down.weight"));
    qc_calib_free(&back);
    qc_calib_free(&c);
    unlink(path);
}

/* Write bytes, read them back, expect failure with every `want` substring. */
static void expect_bad(const char *tag, const void *bytes, size_t n, const char *want1,
                       const char *want2) {
    char path[128], why[512];
    tmp_name(path, sizeof path, tag);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    qc_calib c;
    cr_assert_not(qc_calib_read(path, &c, why, sizeof why), "%s: read succeeded", tag);
    cr_assert(strstr(why, path), "%s: '%s' does not name the file", tag, why);
    cr_assert(strstr(why, want1), "%s: '%s' lacks '%s'", tag, why, want1);
    if (want2) cr_assert(strstr(why, want2), "%s: '%s' lacks '%s'", tag, why, want2);
    cr_assert_eq(c.count, 0);
    cr_assert_null(c.e);
    unlink(path);
}

static size_t put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
    return 4;
}

/* A good two-record file (widths 4 and 2) into buf; returns its length. */
static size_t good_file(uint8_t *buf, const char *name0, uint32_t version) {
    size_t o = 0;
    memcpy(buf, "LOOMACT1", 8);
    o = 8;
    o += put32(buf + o, version);
    o += put32(buf + o, 2);
    o += put32(buf + o, 100);
    o += put32(buf + o, 0);
    const char *names[] = {name0, "blk.0.attn_output.weight"};
    for (int i = 0; i < 2; i++) {
        o += put32(buf + o, (uint32_t)strlen(names[i]));
        memcpy(buf + o, names[i], strlen(names[i]));
        o += strlen(names[i]);
        uint32_t w = i == 0 ? 4 : 2;
        o += put32(buf + o, w);
        for (uint32_t j = 0; j < w; j++) {
            float v = 1.5f + (float)j;
            uint32_t bits;
            memcpy(&bits, &v, 4);
            o += put32(buf + o, bits);
        }
    }
    return o;
}

Test(smoothquant_file, bad_input_is_named) {
    char why[512];
    qc_calib c;
    cr_assert_not(qc_calib_read("/nonexistent/dir/stats.act", &c, why, sizeof why));
    cr_assert(strstr(why, "/nonexistent/dir/stats.act") && strstr(why, "No such file"), "%s", why);

    uint8_t buf[512];
    size_t n = good_file(buf, "blk.0.attn_q.weight", 1);
    {
        char path[128];
        tmp_name(path, sizeof path, "good");
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
        cr_assert(qc_calib_read(path, &c, why, sizeof why), "the hand-written file is valid: %s", why);
        cr_assert_eq(c.count, 2);
        cr_assert_eq(c.tokens, 100);
        cr_assert_float_eq(qc_calib_find(&c, "blk.0.attn_output.weight")->amax[1], 2.5f, 0);
        qc_calib_free(&c);
        unlink(path);
    }
    /* every truncation point is refused */
    for (size_t cut = 0; cut < n; cut++) {
        char tag[32];
        snprintf(tag, sizeof tag, "cut%zu", cut);
        expect_bad(tag, buf, cut, cut < 8 ? "not a loom calibration file" : "truncated", NULL);
    }
    uint8_t bad[512];
    memcpy(bad, buf, n);
    bad[0] = 'X';
    expect_bad("magic", bad, n, "loom calibrate", NULL);
    n = good_file(bad, "blk.0.attn_q.weight", 7);
    expect_bad("version", bad, n, "version 7", NULL);
    /* record 0's width field sits after 24 + 4 + 19 bytes */
    n = good_file(bad, "blk.0.attn_q.weight", 1);
    put32(bad + 24 + 4 + 19, 0);
    expect_bad("width0", bad, n, "blk.0.attn_q.weight", "width 0");
    n = good_file(bad, "blk.0.attn_q.weight", 1);
    put32(bad + 24 + 4 + 19 + 4 + 8, 0x7fc00000u); /* channel 2 = NaN */
    expect_bad("nan", bad, n, "blk.0.attn_q.weight", "channel 2");
    n = good_file(bad, "blk.0.attn_q.weight", 1);
    put32(bad + 24 + 4 + 19 + 4, 0xbf800000u); /* -1 */
    expect_bad("negative", bad, n, "channel 0", NULL);
    n = good_file(bad, "blk.0.attn_output.weight", 1);
    expect_bad("dup", bad, n, "blk.0.attn_output.weight", "twice");
    n = good_file(bad, "blk.0.attn_q.weight", 1);
    bad[n] = 0;
    expect_bad("trailing", bad, n + 1, "after the last", NULL);
    n = good_file(bad, "blk.0.attn_q.weight", 1);
    put32(bad + 24, 5000);
    expect_bad("namelen", bad, n, "record 0", "name length 5000");
}

/* ------------------------------------------------- plugin config errors */

/* The errors both quantizers share (../common/qsmooth.c): no file, a file
 * that cannot be read, smoothquant 0 ignoring the file, a tensor the file
 * lacks, a width that differs; each names the plugin (`who`). */
static void config_errors_for(const char *so_env, const char *base, const char *who,
                              const char *tag) {
    test_rng r = rng_seeded(tag);
    const loom_component *comp = qt_component(so_env);
    void *self = NULL;
    loom_error err = {0};
    cr_assert_neq(qt_create(comp, SETS(base, "smoothquant=0.5"), &self, &err), LOOM_OK);
    cr_assert(strstr(err.message, who) && strstr(err.message, "loom calibrate") &&
                  strstr(err.message, "calibration"),
              "%s", err.message);
    cr_assert_neq(qt_create(comp, SETS(base, "smoothquant=0.5", "calibration=/no/such.act"), &self, &err),
                  LOOM_OK);
    cr_assert(strstr(err.message, who) && strstr(err.message, "/no/such.act"), "%s", err.message);
    /* smoothquant 0 ignores the file entirely */
    cr_assert_eq(qt_create(comp, SETS(base, "calibration=/no/such.act"), &self, &err), LOOM_OK, "%s",
                 err.message);
    ops_of(comp)->destroy(self);

    qt_model m;
    small_layer(&m, &r);
    float amax[K] = {0}, amax_d[KD] = {0};
    for (int j = 0; j < K; j++) amax[j] = 1.0f;
    for (int j = 0; j < KD; j++) amax_d[j] = 1.0f;
    char path[128], cal[200];
    tmp_name(path, sizeof path, "miss");
    snprintf(cal, sizeof cal, "calibration=%s", path);
    const loom_quant_ops *ops = ops_of(comp);
    loom_quant_plan plan;
    loom_qtensor q;
    /* a tensor the file lacks */
    write_stats(path, amax, amax_d, "blk.0.ffn_down.weight", 0);
    cr_assert_eq(qt_create(comp, SETS(base, "smoothquant=0.5", cal), &self, &err), LOOM_OK, "%s",
                 err.message);
    const loom_tensor *wd = m.view.get(m.view.ctx, "blk.0.ffn_down.weight");
    cr_assert_eq(ops->plan(self, &m.view, wd, &plan, &err), LOOM_OK);
    cr_assert_neq(ops->quantize(self, &m.view, wd, &plan, &q, &err), LOOM_OK);
    cr_assert(strstr(err.message, who) && strstr(err.message, "blk.0.ffn_down.weight") &&
                  strstr(err.message, path) && strstr(err.message, "no statistics"),
              "%s", err.message);
    ops->destroy(self);
    /* a width that does not match */
    write_stats(path, amax, amax_d, NULL, 200);
    cr_assert_eq(qt_create(comp, SETS(base, "smoothquant=0.8", cal), &self, &err), LOOM_OK, "%s",
                 err.message);
    const loom_tensor *wq = m.view.get(m.view.ctx, "blk.0.attn_q.weight");
    cr_assert_eq(ops->plan(self, &m.view, wq, &plan, &err), LOOM_OK);
    cr_assert_neq(ops->quantize(self, &m.view, wq, &plan, &q, &err), LOOM_OK);
    cr_assert(strstr(err.message, who) && strstr(err.message, "blk.0.attn_q.weight") &&
                  strstr(err.message, "256") && strstr(err.message, "200"),
              "%s", err.message);
    ops->destroy(self);
    unlink(path);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(smoothquant, config_errors) {
    /* int8's own: w8a16 has float activations, nothing to smooth */
    const loom_component *comp = qt_component("LOOM_QUANT_INT8_SO");
    void *self = NULL;
    loom_error err = {0};
    cr_assert_neq(qt_create(comp, SETS("mode=w8a16", "smoothquant=0.5", "calibration=x.act"), &self, &err),
                  LOOM_OK);
    cr_assert(strstr(err.message, "w8a16") && strstr(err.message, "mode: w8a8"), "%s", err.message);
    config_errors_for("LOOM_QUANT_INT8_SO", "mode=w8a8", "quantizer int8", "smoothquant.config_errors");
}

Test(smoothquant, fp8_config_errors) {
    config_errors_for("LOOM_QUANT_FP8_SO", "scales=per_channel", "quantizer fp8",
                      "smoothquant.fp8_config_errors");
    config_errors_for("LOOM_QUANT_FP8_SO", "scales=per_tensor", "quantizer fp8",
                      "smoothquant.fp8_config_errors_pt");
}
