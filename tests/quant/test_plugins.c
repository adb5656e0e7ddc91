/*
 * tests/quant/test_plugins.c — the int8, fp8 and int4 quantizer plugins,
 * dlopen'ed from the build tree and driven through the fake host:
 *   - plan() rules: embeddings / LM head / norms / biases kept, `skip`
 *     patterns (components, per-layer "blk.N", globs), tied models, int8's
 *     `weight_only` (W8A16 exceptions inside w8a8);
 *   - quantize -> dequantize on fresh random tensors: the layout check,
 *     the read-back (written from loom/quant.h's layouts, not taken from
 *     the plugins) and the per-element bounds every quantizer owes are the
 *     conformance kit's (loom_conformance_quant_readback); the tighter
 *     bounds derived per scheme here are these plugins' own (see each
 *     test); release() returning every allocation;
 *   - bad input: group size not dividing a dimension, a GGUF tensor of the
 *     wrong type, SmoothQuant without a calibration file, malformed patterns
 *     (skip, weight_only), weight_only with mode w8a16,
 *     packed checkpoints under the wrong quantizer, unreadable dtypes.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../plugins/quantizer/common/qcommon.h"
#include "rng.h"
#include "conformance.h"
#include "fake_host.h"
#include "qt_util.h"
#include "formats/dtype.h"

#define SETS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const loom_quant_ops *ops_of(const loom_component *c) { return c->ops; }

/* ---------------------------------------------------------------- rules */

Test(quant_rules, name_patterns) {
    cr_assert(qc_name_matches("output.weight", "token_embd,output"));
    cr_assert(qc_name_matches("token_embd.weight", "token_embd,output"));
    cr_assert_not(qc_name_matches("blk.3.attn_output.weight", "token_embd,output"));
    cr_assert(qc_name_matches("blk.3.attn_output.weight", "attn_output"));
    cr_assert(qc_name_matches("blk.0.attn_q.weight", "blk.0"));
    cr_assert_not(qc_name_matches("blk.10.attn_q.weight", "blk.1"));
    cr_assert(qc_name_matches("blk.10.attn_q.weight", " blk.1 , blk.10 "));
    cr_assert(qc_name_matches("blk.7.ffn_down.weight", "blk.*.ffn_down.weight"));
    cr_assert(qc_name_matches("blk.7.ffn_down.weight", "*down*"));
    cr_assert_not(qc_name_matches("blk.7.ffn_up.weight", "blk.*.ffn_down.weight"));
    cr_assert(qc_name_matches("blk.2.ffn_up.weight", "blk.2.ffn_up"));
    cr_assert_not(qc_name_matches("blk.2.ffn_up.weight", ""));
    cr_assert_not(qc_name_matches("blk.2.ffn_up.weight", ",,"));
    cr_assert_not(qc_name_matches(NULL, "output"));
    char bad[64];
    cr_assert(qc_patterns_valid("token_embd, output,blk.*.x", bad, sizeof bad));
    cr_assert_not(qc_patterns_valid("token_embd,blk..0", bad, sizeof bad));
    cr_assert_str_eq(bad, "blk..0");
    cr_assert_not(qc_patterns_valid("a b", bad, sizeof bad));
    cr_assert_not(qc_patterns_valid(".output", bad, sizeof bad));
}

/* A small Llama-shaped model: embeddings, LM head, two layers. */
static void small_model(qt_model *m, test_rng *r, bool tied) {
    qt_model_init(m);
    qt_model_add_f32(m, "token_embd.weight", 64, 32, 1.0, false, r);
    if (!tied) qt_model_add_f32(m, "output.weight", 64, 32, 1.0, false, r);
    float *norm = calloc(32, 4);
    qt_model_add(m, "output_norm.weight", LOOM_DTYPE_F32, 1, 32, 0, norm, 128, true);
    for (int l = 0; l < 2; l++) {
        char nm[64];
        static const char *const lin[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                          "ffn_gate", "ffn_up", "ffn_down"};
        for (int k = 0; k < 7; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, lin[k]);
            qt_model_add_f32(m, nm, k == 6 ? 32 : 64, k == 6 ? 64 : 32, 0.1, false, r);
        }
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        qt_model_add(m, nm, LOOM_DTYPE_F32, 1, 32, 0, calloc(32, 4), 128, true);
        snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
        qt_model_add(m, nm, LOOM_DTYPE_F32, 1, 64, 0, calloc(64, 4), 256, true);
    }
}

/* Plan every tensor of m with (comp, sets); returns how many were planned
 * to a format other than NONE and checks names kept by `kept` are NONE. */
static int plan_all(const loom_component *comp, const char *const *sets, qt_model *m,
                    const char *const *kept, loom_qformat want) {
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(comp, sets, &self, &err), LOOM_OK, "%s", err.message);
    int n = 0;
    for (int i = 0; i < m->n; i++) {
        loom_quant_plan p;
        cr_assert_eq(ops_of(comp)->plan(self, &m->view, &m->t[i], &p, &err), LOOM_OK, "%s",
                     err.message);
        cr_assert_eq(p.struct_size, sizeof p);
        bool keep = m->t[i].ndim != 2 || strstr(m->t[i].name, ".bias");
        for (int k = 0; kept && kept[k]; k++) keep |= qc_name_matches(m->t[i].name, kept[k]);
        if (keep)
            cr_assert_eq(p.format, LOOM_QFMT_NONE, "%s should be kept", m->t[i].name);
        else
            cr_assert_eq(p.format, want, "%s: format %d, want %d", m->t[i].name, p.format, want);
        n += p.format != LOOM_QFMT_NONE;
    }
    ops_of(comp)->destroy(self);
    return n;
}

Test(quant_rules, plan_skips_embeddings_head_norms_biases) {
    test_rng r = rng_seeded("rules.plan");
    qt_model m;
    small_model(&m, &r, false);
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    const loom_component *f8 = qt_component("LOOM_QUANT_FP8_SO");
    const loom_component *i4 = qt_component("LOOM_QUANT_INT4_SO");
    const char *const def[] = {"token_embd", "output", NULL};
    cr_assert_eq(plan_all(i8, NULL, &m, def, LOOM_QFMT_INT8_W8A16), 14);
    cr_assert_eq(plan_all(i8, SETS("mode=w8a8"), &m, def, LOOM_QFMT_INT8_W8A8), 14);
    cr_assert_eq(plan_all(f8, NULL, &m, def, LOOM_QFMT_FP8_W8A8), 14);
    cr_assert_eq(plan_all(i4, SETS("group_size=32"), &m, def, LOOM_QFMT_INT4_W4A16), 14);
    /* per-layer override: layer 0 kept whole, every down projection kept */
    const char *const l0[] = {"token_embd", "output", "blk.0", "ffn_down", NULL};
    cr_assert_eq(plan_all(i8, SETS("skip=token_embd,output,blk.0,ffn_down"), &m, l0,
                          LOOM_QFMT_INT8_W8A16), 6);
    /* a glob keeps every layer's V projection; output.weight is quantized */
    const char *const glob[] = {"token_embd", "blk.*.attn_v.weight", NULL};
    cr_assert_eq(plan_all(f8, SETS("skip=token_embd,blk.*.attn_v.weight"), &m, glob,
                          LOOM_QFMT_FP8_W8A8), 14 + 1 - 2);
    /* an empty skip list quantizes the LM head too */
    cr_assert_eq(plan_all(i8, SETS("skip="), &m, NULL, LOOM_QFMT_INT8_W8A16) >= 15, true);
    qt_model_free(&m);
}

/* int8 `weight_only` inside mode w8a8: matching tensors are planned W8A16,
 * the rest W8A8; skip wins over it; the same pattern syntax as skip. */
static void expect_formats(const loom_component *c, const char *const *sets, qt_model *m,
                           const char *const *names, const loom_qformat *want) {
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(c, sets, &self, &err), LOOM_OK, "%s", err.message);
    for (int i = 0; names[i]; i++) {
        loom_quant_plan p;
        cr_assert_eq(ops_of(c)->plan(self, &m->view, m->view.get(m->view.ctx, names[i]), &p, &err),
                     LOOM_OK, "%s", err.message);
        cr_assert_eq(p.format, want[i], "%s: format %d, want %d", names[i], p.format, want[i]);
        cr_assert(p.format == LOOM_QFMT_NONE || p.per_channel, "%s", names[i]);
    }
    ops_of(c)->destroy(self);
}

Test(quant_rules, int8_weight_only_patterns) {
    test_rng r = rng_seeded("rules.weight_only");
    qt_model m;
    small_model(&m, &r, false);
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    const loom_qformat N = LOOM_QFMT_NONE, A16 = LOOM_QFMT_INT8_W8A16, A8 = LOOM_QFMT_INT8_W8A8;
    /* over the whole model: both down projections W8A16, the other 12 W8A8 */
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(i8, SETS("mode=w8a8", "weight_only=ffn_down"), &self, &err), LOOM_OK, "%s",
                 err.message);
    int count[8] = {0};
    for (int i = 0; i < m.n; i++) {
        loom_quant_plan p;
        cr_assert_eq(ops_of(i8)->plan(self, &m.view, &m.t[i], &p, &err), LOOM_OK, "%s", err.message);
        cr_assert(p.format >= 0 && p.format < 8);
        count[p.format]++;
        if (p.format == A16) cr_assert(strstr(m.t[i].name, ".ffn_down."), "%s", m.t[i].name);
    }
    cr_assert_eq(count[A16], 2);
    cr_assert_eq(count[A8], 12);
    ops_of(i8)->destroy(self);
    static const char *const names[] = {"blk.0.ffn_down.weight", "blk.1.ffn_down.weight",
                                        "blk.0.ffn_up.weight",   "blk.1.attn_q.weight",
                                        "blk.1.attn_output.weight", "output.weight",
                                        "blk.0.attn_q.bias", NULL};
    expect_formats(i8, SETS("mode=w8a8", "weight_only=ffn_down"), &m, names,
                   (const loom_qformat[]){A16, A16, A8, A8, A8, N, N});
    /* a per-layer override and a glob; the default (empty) is all W8A8 */
    expect_formats(i8, SETS("mode=w8a8", "weight_only=blk.1, blk.*.ffn_up.weight"), &m, names,
                   (const loom_qformat[]){A8, A16, A16, A16, A16, N, N});
    expect_formats(i8, SETS("mode=w8a8"), &m, names,
                   (const loom_qformat[]){A8, A8, A8, A8, A8, N, N});
    /* skip wins over weight_only; weight_only never quantizes what skip keeps */
    expect_formats(i8, SETS("mode=w8a8", "skip=token_embd,output,blk.0", "weight_only=ffn_down,output"),
                   &m, names, (const loom_qformat[]){N, A16, N, A8, A8, N, N});
    /* with an empty skip the LM head can be W8A16 while the rest is W8A8 */
    expect_formats(i8, SETS("mode=w8a8", "skip=", "weight_only=output"), &m, names,
                   (const loom_qformat[]){A8, A8, A8, A8, A8, A16, N});
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(quant_rules, fp8_plan_scales_and_kv_dtype) {
    const loom_component *f8 = qt_component("LOOM_QUANT_FP8_SO");
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    const loom_component *i4 = qt_component("LOOM_QUANT_INT4_SO");
    test_rng r = rng_seeded("rules.kv");
    qt_model m;
    small_model(&m, &r, true);
    void *self;
    loom_error err;
    loom_quant_plan p;
    cr_assert_eq(qt_create(f8, SETS("scales=per_tensor", "kv_cache=fp8"), &self, &err), LOOM_OK);
    cr_assert_eq(ops_of(f8)->plan(self, &m.view, m.view.get(m.view.ctx, "blk.0.attn_q.weight"), &p,
                                  &err), LOOM_OK);
    cr_assert_eq(p.format, LOOM_QFMT_FP8_W8A8);
    cr_assert_not(p.per_channel);
    cr_assert_eq(ops_of(f8)->kv_dtype(self), LOOM_DTYPE_FP8_E4M3);
    ops_of(f8)->destroy(self);
    cr_assert_eq(qt_create(f8, NULL, &self, &err), LOOM_OK);
    cr_assert_eq(ops_of(f8)->kv_dtype(self), LOOM_DTYPE_COUNT);
    ops_of(f8)->destroy(self);
    static const struct { const char *set; loom_dtype want; } kv[] = {
        {"kv_cache=auto", LOOM_DTYPE_COUNT}, {"kv_cache=f16", LOOM_DTYPE_F16},
        {"kv_cache=fp8", LOOM_DTYPE_FP8_E4M3}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(qt_create(i8, SETS(kv[i].set), &self, &err), LOOM_OK);
        cr_assert_eq(ops_of(i8)->kv_dtype(self), kv[i].want);
        ops_of(i8)->destroy(self);
    }
    cr_assert_eq(qt_create(i4, NULL, &self, &err), LOOM_OK);
    cr_assert_eq(ops_of(i4)->kv_dtype(self), LOOM_DTYPE_COUNT);
    ops_of(i4)->destroy(self);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* ------------------------------------------------------ round trips */

/* Quantize tensor t with (comp, sets); return the qtensor (caller releases
 * through ops->release(self, q) and destroys self). */
static void quantize(const loom_component *comp, const char *const *sets, qt_model *m,
                     const loom_tensor *t, void **self, loom_quant_plan *p, loom_qtensor *q) {
    loom_error err = {0};
    cr_assert_eq(qt_create(comp, sets, self, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops_of(comp)->plan(*self, &m->view, t, p, &err), LOOM_OK, "%s", err.message);
    cr_assert_neq(p->format, LOOM_QFMT_NONE);
    memset(q, 0, sizeof *q);
    q->struct_size = sizeof *q;
    cr_assert_eq(ops_of(comp)->quantize(*self, &m->view, t, p, q, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_eq(q->format, p->format);
    cr_assert_eq(q->rows, t->shape[0]);
    cr_assert_eq(q->cols, t->shape[1]);
    cr_assert_not_null(q->owner);
}

static void finish(const loom_component *comp, void *self, loom_qtensor *q) {
    ops_of(comp)->release(self, q);
    cr_assert_null(q->owner);
    ops_of(comp)->release(self, q); /* idempotent on an empty tensor */
    ops_of(comp)->destroy(self);
    cr_assert_eq(fake_host_live_allocs(), 0, "leak: %ld allocations live", fake_host_live_allocs());
}

/* w (rows x cols) as the conformance kit reads q back (it checks the
 * layout and the per-element bounds first); malloc'd. */
static float *read_back(const loom_tensor *w, const loom_quant_plan *p, const loom_qtensor *q) {
    float *back = malloc((size_t)loom_tensor_numel(w) * 4);
    cr_assert(back);
    char why[1024];
    cr_assert(loom_conformance_quant_readback(w, p, q, back, why, sizeof why), "%s", why);
    return back;
}

/*
 * INT8 per-channel symmetric: every element's error is at most half a step,
 * scale[r] / 2 = max|w_r| / 254. For Gaussian rows of >= 100 elements the
 * largest |w| is <= ~4.5 sigma, so the rounding noise (uniform, step^2/12)
 * gives a relative Frobenius error of about 4.5 / (127 sqrt(12)) ~ 1.0% at
 * worst and ~0.7% typically; outliers widen the step of their rows only.
 */
Test(quant_roundtrip, int8_per_channel) {
    test_rng r = rng_seeded("roundtrip.int8");
    const loom_component *c = qt_component("LOOM_QUANT_INT8_SO");
    for (int it = 0; it < 8; it++) {
        qt_model m;
        qt_model_init(&m);
        int64_t rows = 16 + rng_int(&r, 200), cols = 100 + rng_int(&r, 700);
        bool outl = it % 2;
        loom_tensor *t = qt_model_add_f32(&m, "blk.0.ffn_up.weight", rows, cols, 0.05, outl, &r);
        void *self;
        loom_quant_plan p;
        loom_qtensor q;
        quantize(c, it % 3 ? SETS("mode=w8a8") : NULL, &m, t, &self, &p, &q);
        cr_assert_eq(q.data.dtype, LOOM_DTYPE_I8);
        cr_assert_eq(q.scales.dtype, LOOM_DTYPE_F32);
        cr_assert_eq(loom_tensor_numel(&q.scales), rows);
        cr_assert_null(q.smooth.data);
        const float *w = t->data, *s = q.scales.data;
        const int8_t *d = q.data.data;
        float *back = read_back(t, &p, &q);
        double bound2 = 0, norm2 = 0;
        for (int64_t i = 0; i < rows; i++) {
            float amax = 0;
            for (int64_t k = 0; k < cols; k++) amax = fmaxf(amax, fabsf(w[i * cols + k]));
            cr_assert_float_eq(s[i], amax / 127.0f, amax * 1e-6f);
            for (int64_t k = 0; k < cols; k++) {
                cr_assert(d[i * cols + k] >= -127);
                norm2 += (double)w[i * cols + k] * w[i * cols + k];
            }
            bound2 += (double)cols * s[i] * s[i] / 12.0; /* expected uniform rounding noise */
        }
        double e = qt_rel_err(back, w, rows * cols);
        cr_assert_leq(e, 1.3 * sqrt(bound2 / norm2), "int8 rel err %.4f vs noise model %.4f", e,
                      sqrt(bound2 / norm2));
        if (!outl) cr_assert_lt(e, 0.01, "int8 rel err %.4f >= 1%%", e);
        free(back);
        finish(c, self, &q);
        qt_model_free(&m);
    }
}

/*
 * FP8 E4M3: 3 mantissa bits, so a value in the normal range is off by at
 * most 2^-4 of its binade's base (<= |w| / 16); below 2^-6 * scale steps are
 * 2^-9 * scale (error <= 2^-10 * scale). The relative rounding error is
 * uniform over the binade: rms ~ 2^-4 / sqrt(3) / 1.5 ~ 2.4%, so < 5% for
 * any Gaussian tensor (per-channel or per-tensor).
 */
Test(quant_roundtrip, fp8_per_channel_and_per_tensor) {
    test_rng r = rng_seeded("roundtrip.fp8");
    const loom_component *c = qt_component("LOOM_QUANT_FP8_SO");
    for (int it = 0; it < 8; it++) {
        qt_model m;
        qt_model_init(&m);
        int64_t rows = 8 + rng_int(&r, 200), cols = 33 + rng_int(&r, 700);
        loom_tensor *t = qt_model_add_f32(&m, "blk.1.attn_v.weight", rows, cols, 0.02, it >= 6, &r);
        bool pt = it % 2;
        void *self;
        loom_quant_plan p;
        loom_qtensor q;
        quantize(c, pt ? SETS("scales=per_tensor") : NULL, &m, t, &self, &p, &q);
        cr_assert_eq(q.data.dtype, LOOM_DTYPE_FP8_E4M3);
        cr_assert_eq(loom_tensor_numel(&q.scales), pt ? 1 : rows);
        const float *w = t->data;
        const uint8_t *d = q.data.data;
        float *back = read_back(t, &p, &q);
        for (int64_t i = 0; i < rows * cols; i++) cr_assert_neq(d[i] & 0x7f, 0x7f, "NaN code");
        double e = qt_rel_err(back, w, rows * cols);
        cr_assert_lt(e, 0.05, "fp8 rel err %.4f >= 5%%", e);
        free(back);
        finish(c, self, &q);
        qt_model_free(&m);
    }
}

/*
 * INT4 asymmetric, group g: with the group's [min, max] the step is
 * D = (max - min) / 15 and every element is off by <= D / 2; the plugin
 * keeps the best of several clipped ranges (ratio 1 included), so the
 * group's squared error never exceeds the plain min/max rounding's, which is
 * <= g (D/2)^2 (hard bound) and ~ g D^2 / 12 in expectation (noise model).
 * For Gaussian groups of 128 the range is ~5.2 sigma: D^2/12 gives ~10% rel.
 * error; the clipping search and least-squares refit lower it to ~9.3%.
 */
Test(quant_roundtrip, int4_groupwise) {
    test_rng r = rng_seeded("roundtrip.int4");
    const loom_component *c = qt_component("LOOM_QUANT_INT4_SO");
    static const int32_t groups[] = {32, 64, 128, 2, 96};
    for (int it = 0; it < 10; it++) {
        qt_model m;
        qt_model_init(&m);
        int32_t g = groups[it % 5];
        int64_t rows = 32 + rng_int(&r, 100), cols = g * (1 + rng_int(&r, it % 5 == 3 ? 100 : 8));
        if (cols % 2) cols += g;
        loom_tensor *t = qt_model_add_f32(&m, "blk.0.ffn_gate.weight", rows, cols, 0.03, it >= 5, &r);
        char gs[32];
        snprintf(gs, sizeof gs, "group_size=%d", g);
        void *self;
        loom_quant_plan p;
        loom_qtensor q;
        quantize(c, SETS(gs), &m, t, &self, &p, &q);
        cr_assert_eq(p.group_size, g);
        cr_assert_eq(q.group_size, g);
        cr_assert_eq(q.data.dtype, LOOM_DTYPE_U8);
        cr_assert_eq(q.data.shape[1], cols / 2);
        cr_assert_eq(q.scales.shape[0], rows);
        cr_assert_eq(q.scales.shape[1], cols / g);
        cr_assert_eq(q.zeros.shape[1], cols / g);
        const float *w = t->data;
        float *back = read_back(t, &p, &q);
        double noise2 = 0, err2 = 0, norm2 = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t gi = 0; gi < cols / g; gi++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int64_t k = gi * g; k < (gi + 1) * g; k++) {
                    lo = fminf(lo, w[i * cols + k]), hi = fmaxf(hi, w[i * cols + k]);
                    double e = (double)back[i * cols + k] - w[i * cols + k];
                    err2 += e * e;
                    norm2 += (double)w[i * cols + k] * w[i * cols + k];
                }
                double D = ((double)hi - lo) / 15.0;
                noise2 += g * D * D / 12.0;
            }
        double e = sqrt(err2 / norm2);
        cr_assert_leq(e, 1.02 * sqrt(noise2 / norm2), "int4 g%d rel err %.4f vs noise %.4f", g, e,
                      sqrt(noise2 / norm2));
        /* Gaussian, no outliers: measured ~7.4% (g32), 8.5% (g64), 9.3% (g128) */
        if (it < 5 && g >= 32)
            cr_assert_lt(e, g == 32 ? 0.08 : g == 64 ? 0.09 : 0.10, "int4 g%d: %.4f", g, e);
        cr_assert_float_eq(qt_rel_err(back, w, rows * cols), e, 1e-6);
        free(back);
        finish(c, self, &q);
        qt_model_free(&m);
    }
}

/* qc_int4_rows against the search written plainly, one candidate range at
 * a time (try, least-squares refit, try again; the first of least error,
 * stopping at an exact grid): the same codes, scales and zeros bit for bit,
 * on Gaussian groups, groups with an outlier, constant groups, groups that
 * already are a 4-bit grid (the early stop), at group sizes 2 .. 4096. */
static double ref_int4_try(const float *v, int32_t g, float scale, float zero, uint8_t *q) {
    double e = 0.0;
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int32_t i = 0; i < g; i++) {
        float t = rintf(v[i] * inv + zero);
        t = t < 0.0f ? 0.0f : t > 15.0f ? 15.0f : t;
        q[i] = (uint8_t)t;
        double d = (double)((t - zero) * scale) - (double)v[i];
        e += d * d;
    }
    return e;
}

static bool ref_int4_refit(const float *v, const uint8_t *q, int32_t g, float *scale, float *zero) {
    double sq = 0, sw = 0, sqq = 0, sqw = 0;
    for (int32_t i = 0; i < g; i++) {
        sq += q[i];
        sw += v[i];
        sqq += (double)q[i] * q[i];
        sqw += (double)q[i] * v[i];
    }
    double den = g * sqq - sq * sq;
    if (den <= 0) return false;
    double s = (g * sqw - sq * sw) / den, b = (sw - s * sq) / g;
    if (!(s > 0)) return false;
    *scale = (float)s;
    *zero = (float)(-b / s);
    return true;
}

static void ref_int4_group(const float *v, int32_t g, uint8_t *best, float *bs, float *bz) {
    static const float ratios[8] = {1.0f, 0.96f, 0.92f, 0.88f, 0.84f, 0.80f, 0.76f, 0.72f};
    static uint8_t cur[4096], fit[4096];
    float lo = v[0], hi = v[0];
    double energy = 0.0;
    for (int32_t i = 1; i < g; i++) lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
    for (int32_t i = 0; i < g; i++) energy += (double)v[i] * v[i];
    *bs = 1.0f, *bz = -lo;
    memset(best, 0, (size_t)g);
    if (hi == lo) return;
    double berr = INFINITY;
    float c = 0.5f * (lo + hi), half = 0.5f * (hi - lo);
    for (int k = 0; k < 8; k++) {
        float l = c - half * ratios[k], h = c + half * ratios[k];
        float s = (h - l) / 15.0f, z = -l / s, s2 = s, z2 = z;
        double e = ref_int4_try(v, g, s, z, cur);
        if (ref_int4_refit(v, cur, g, &s2, &z2)) {
            double e2 = ref_int4_try(v, g, s2, z2, fit);
            if (e2 < e) e = e2, s = s2, z = z2, memcpy(cur, fit, (size_t)g);
        }
        if (e < berr) berr = e, *bs = s, *bz = z, memcpy(best, cur, (size_t)g);
        if (berr <= 1e-12 * energy) break;
    }
}

Test(quant_roundtrip, int4_search_matches_plain_reference) {
    test_rng r = rng_seeded("int4.search.reference");
    static const int32_t groups[] = {2, 32, 64, 96, 128, 4096};
    static uint8_t best[4096];
    for (int gi = 0; gi < 6; gi++) {
        const int32_t g = groups[gi];
        const int64_t rows = 24, ng = g == 4096 ? 1 : 4, cols = ng * g;
        float *w = malloc((size_t)(rows * cols) * sizeof *w);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t k = 0; k < ng; k++) {
                float *v = w + i * cols + k * g;
                const int kind = (int)((i * ng + k) % 4); /* Gaussian, outlier, constant, 4-bit grid */
                for (int32_t j = 0; j < g; j++) {
                    v[j] = (float)(rng_normal(&r) * 0.02);
                    if (kind == 2) v[j] = 0.125f;
                    if (kind == 3) v[j] = -0.3f + 0.05f * (float)rng_int(&r, 16);
                }
                if (kind == 1) v[rng_int(&r, g)] = 0.5f;
            }
        uint8_t *data = malloc((size_t)(rows * cols / 2));
        float *scales = malloc((size_t)(rows * ng) * sizeof *scales), *zeros = malloc((size_t)(rows * ng) * sizeof *zeros);
        qc_int4_rows(fake_host(), w, rows, cols, g, data, scales, zeros);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t k = 0; k < ng; k++) {
                float bs, bz;
                ref_int4_group(w + i * cols + k * g, g, best, &bs, &bz);
                cr_assert(memcmp(&bs, &scales[i * ng + k], 4) == 0 && memcmp(&bz, &zeros[i * ng + k], 4) == 0,
                          "g%d row %ld group %ld: scale %a zero %a, reference %a %a", g, (long)i, (long)k,
                          (double)scales[i * ng + k], (double)zeros[i * ng + k], (double)bs, (double)bz);
                const uint8_t *d = data + i * (cols / 2) + k * (g / 2);
                for (int32_t j = 0; j < g; j += 2)
                    cr_assert_eq(d[j / 2], (uint8_t)(best[j] | (best[j + 1] << 4)),
                                 "g%d row %ld group %ld: codes %d, %d differ", g, (long)i, (long)k, j, j + 1);
            }
        free(w), free(data), free(scales), free(zeros);
    }
    /* a range below ~4e-38 with an exact zero: subnormal scales, 0 * inf in
     * the search; still finite and within the group's range */
    float tiny[4] = {0.0f, 2e-38f, 1e-38f, 0.0f}, sc, zr;
    uint8_t d[2];
    qc_int4_rows(fake_host(), tiny, 1, 4, 4, d, &sc, &zr);
    for (int j = 0; j < 4; j++) {
        const double back = (((d[j / 2] >> (j % 2 * 4)) & 15) - (double)zr) * sc;
        cr_assert(isfinite(back) && fabs(back - tiny[j]) <= 2e-38, "tiny group: element %d reads back %g", j, back);
    }
}

Test(quant_roundtrip, int4_gguf_source_keeps_blocks) {
    const loom_component *c = qt_component("LOOM_QUANT_INT4_SO");
    qt_model m;
    qt_model_init(&m);
    static const loom_dtype ok[] = {LOOM_DTYPE_Q4_0, LOOM_DTYPE_Q4_1, LOOM_DTYPE_Q4_K,
                                    LOOM_DTYPE_Q8_0, LOOM_DTYPE_Q6_K, LOOM_DTYPE_Q5_K, LOOM_DTYPE_Q5_0};
    const int nok = (int)(sizeof ok / sizeof ok[0]);
    for (int i = 0; i < nok; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", i);
        size_t bytes = loom_dtype_row_bytes(ok[i], 256) * 4;
        qt_model_add(&m, nm, ok[i], 2, 4, 256, calloc(1, bytes), bytes, true);
    }
    void *self;
    loom_error err;
    cr_assert_eq(qt_create(c, SETS("source=gguf"), &self, &err), LOOM_OK);
    for (int i = 0; i < nok; i++) {
        loom_quant_plan p;
        cr_assert_eq(ops_of(c)->plan(self, &m.view, &m.t[i], &p, &err), LOOM_OK, "%s", err.message);
        cr_assert_eq(p.format, LOOM_QFMT_GGUF, "%s", loom_dtype_name(ok[i]));
    }
    ops_of(c)->destroy(self);
    qt_model_free(&m);
}

/* -------------------------------------------------------- bad input */

static void expect_plan_error(const loom_component *c, const char *const *sets, qt_model *m,
                              const char *tensor, loom_status want, const char *const *needles) {
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(c, sets, &self, &err), LOOM_OK, "%s", err.message);
    loom_quant_plan p;
    const loom_tensor *t = m->view.get(m->view.ctx, tensor);
    cr_assert_not_null(t);
    loom_status st = ops_of(c)->plan(self, &m->view, t, &p, &err);
    cr_assert_eq(st, want, "plan(%s) = %d (%s), want %d", tensor, st, err.message, want);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(err.message, needles[i]), "message lacks '%s': %s", needles[i],
                  err.message);
    ops_of(c)->destroy(self);
}

Test(quant_errors, group_size_not_dividing_names_tensor_and_fix) {
    test_rng r = rng_seeded("errors.group");
    const loom_component *c = qt_component("LOOM_QUANT_INT4_SO");
    qt_model m;
    qt_model_init(&m);
    qt_model_add_f32(&m, "blk.4.attn_q.weight", 8, 576, 1.0, false, &r);
    expect_plan_error(c, NULL, &m, "blk.4.attn_q.weight", LOOM_ERR_INVALID,
                      (const char *const[]){"blk.4.attn_q.weight", "576", "group_size 128",
                                            "64", "96", NULL});
    expect_plan_error(c, SETS("group_size=100"), &m, "blk.4.attn_q.weight", LOOM_ERR_INVALID,
                      (const char *const[]){"such as 64 or 96", NULL});
    qt_model_free(&m);
    void *self;
    loom_error err;
    cr_assert_eq(qt_create(c, SETS("group_size=33"), &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "33") && strstr(err.message, "even"), "%s", err.message);
}

Test(quant_errors, gguf_source_wrong_type) {
    test_rng r = rng_seeded("errors.gguf");
    const loom_component *c = qt_component("LOOM_QUANT_INT4_SO");
    qt_model m;
    qt_model_init(&m);
    qt_model_add_f32(&m, "blk.0.ffn_down.weight", 8, 64, 1.0, false, &r);
    expect_plan_error(c, SETS("source=gguf"), &m, "blk.0.ffn_down.weight", LOOM_ERR_INVALID,
                      (const char *const[]){"blk.0.ffn_down.weight", "f32", "source: quantize",
                                            "skip", NULL});
    qt_model_free(&m);
}

Test(quant_errors, smoothquant_without_calibration_and_bad_patterns) {
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    void *self;
    loom_error err;
    /* the rest of SmoothQuant's errors: tests/quant/test_smoothquant.c */
    cr_assert_eq(qt_create(i8, SETS("mode=w8a8", "smoothquant=0.5"), &self, &err),
                 LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "loom calibrate") && strstr(err.message, "quantizer.calibration"),
              "%s", err.message);
    cr_assert_eq(qt_create(i8, SETS("skip=token_embd,,blk..1"), &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "blk..1"), "%s", err.message);
    const loom_component *f8 = qt_component("LOOM_QUANT_FP8_SO");
    cr_assert_eq(qt_create(f8, SETS("skip=.output"), &self, &err), LOOM_ERR_INVALID);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* int8 weight_only: a malformed pattern and mode w8a16 are refused with the
 * parameter named and the fix; a good list with w8a8 is accepted. */
Test(quant_errors, int8_weight_only_refusals) {
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    void *self = NULL;
    loom_error err = {0};
    static const char *const bad[] = {"weight_only=ffn_down,,blk..1", "weight_only=.ffn_down",
                                      "weight_only=ffn down"};
    static const char *const shown[] = {"blk..1", ".ffn_down", "ffn down"};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(qt_create(i8, SETS("mode=w8a8", bad[i]), &self, &err), LOOM_ERR_INVALID, "%s",
                     bad[i]);
        cr_assert(strstr(err.message, "quantizer int8") && strstr(err.message, "weight_only") &&
                      strstr(err.message, shown[i]) && !strstr(err.message, "skip pattern"),
                  "%s", err.message);
    }
    /* w8a16 (the default mode): every tensor already is weight-only */
    cr_assert_eq(qt_create(i8, SETS("weight_only=ffn_down"), &self, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "weight_only") && strstr(err.message, "w8a16") &&
                  strstr(err.message, "mode: w8a8"),
              "%s", err.message);
    cr_assert_eq(qt_create(i8, SETS("mode=w8a16", "weight_only="), &self, &err), LOOM_OK, "%s",
                 err.message);
    ops_of(i8)->destroy(self);
    cr_assert_eq(qt_create(i8, SETS("mode=w8a8", "weight_only= ffn_down , blk.*.attn_v.weight"), &self,
                           &err), LOOM_OK, "%s", err.message);
    ops_of(i8)->destroy(self);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* A skip / weight_only pattern that matches no tensor of the model (a typo,
 * a layer the model does not have, a glob that hits nothing) is refused at
 * the first plan() with the parameter, the pattern and what the model's
 * weights are called; the default skip's names are exempt (a tied-embedding
 * model has no LM head of its own); patterns that match load as before. */
static void expect_unmatched(const loom_component *c, const char *const *sets, qt_model *m, const char *param,
                             const char *pat) {
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(c, sets, &self, &err), LOOM_OK, "%s", err.message);
    loom_quant_plan p;
    cr_assert_eq(ops_of(c)->plan(self, &m->view, m->view.get(m->view.ctx, "blk.0.attn_q.weight"), &p, &err),
                 LOOM_ERR_INVALID, "%s: %s accepted", param, pat);
    char want[96];
    snprintf(want, sizeof want, "%s pattern '%s' matches no tensor", param, pat);
    cr_assert(strstr(err.message, want) && strstr(err.message, "blk.1.ffn_down.weight") &&
                  strstr(err.message, "fix the pattern or remove it"),
              "%s", err.message);
    ops_of(c)->destroy(self);
}

Test(quant_errors, patterns_matching_nothing) {
    test_rng r = rng_seeded("errors.unmatched");
    qt_model m;
    small_model(&m, &r, true); /* tied embeddings: no output.weight */
    const loom_component *i8 = qt_component("LOOM_QUANT_INT8_SO");
    const loom_component *f8 = qt_component("LOOM_QUANT_FP8_SO");
    const loom_component *i4 = qt_component("LOOM_QUANT_INT4_SO");
    expect_unmatched(i8, SETS("skip=token_embd,output,ffn_dwn"), &m, "skip", "ffn_dwn");
    expect_unmatched(f8, SETS("skip=token_embd,blk.5"), &m, "skip", "blk.5"); /* 2 layers */
    expect_unmatched(i4, SETS("group_size=32", "skip=token_embd,blk.*.attn_qkv.weight"), &m, "skip",
                     "blk.*.attn_qkv.weight");
    expect_unmatched(i8, SETS("mode=w8a8", "weight_only=ffn_down,down_proj"), &m, "weight_only", "down_proj");
    /* the defaults on a tied model, an exempt "output", patterns that match: planned as before */
    const char *const def[] = {"token_embd", NULL};
    cr_assert_eq(plan_all(i8, NULL, &m, def, LOOM_QFMT_INT8_W8A16), 14);
    cr_assert_eq(plan_all(f8, SETS("skip=output, token_embd ,blk.1"), &m,
                          (const char *const[]){"token_embd", "blk.1", NULL}, LOOM_QFMT_FP8_W8A8),
                 7);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(quant_errors, packed_checkpoint_under_float_quantizers) {
    test_rng r = rng_seeded("errors.packed");
    qt_model m;
    qt_model_init(&m);
    qt_model_add_f32(&m, "blk.0.attn_k.weight", 8, 64, 1.0, false, &r);
    qt_model_add(&m, "blk.0.attn_k.qweight", LOOM_DTYPE_I32, 2, 8, 8, calloc(64, 4), 256, true);
    const char *const n1[] = {"blk.0.attn_k.weight", "int4", "awq", NULL};
    expect_plan_error(qt_component("LOOM_QUANT_INT8_SO"), NULL, &m, "blk.0.attn_k.weight",
                      LOOM_ERR_INVALID, n1);
    expect_plan_error(qt_component("LOOM_QUANT_FP8_SO"), NULL, &m, "blk.0.attn_k.weight",
                      LOOM_ERR_INVALID, n1);
    const char *const n2[] = {"blk.0.attn_k.weight", "source: awq", NULL};
    expect_plan_error(qt_component("LOOM_QUANT_INT4_SO"), SETS("group_size=32"), &m,
                      "blk.0.attn_k.weight", LOOM_ERR_INVALID, n2);
    qt_model_free(&m);
    /* and the reverse: awq asked of a float checkpoint */
    qt_model_init(&m);
    qt_model_add_f32(&m, "blk.0.attn_k.weight", 8, 64, 1.0, false, &r);
    const char *const n3[] = {"blk.0.attn_k.qweight", "source: quantize", NULL};
    expect_plan_error(qt_component("LOOM_QUANT_INT4_SO"), SETS("source=awq"), &m,
                      "blk.0.attn_k.weight", LOOM_ERR_INVALID, n3);
    qt_model_free(&m);
}

Test(quant_errors, unreadable_dtype_and_wrong_plan) {
    const loom_component *c = qt_component("LOOM_QUANT_INT8_SO");
    qt_model m;
    qt_model_init(&m);
    /* u8 source weights: the host's converter does not read them */
    loom_tensor *t = qt_model_add(&m, "blk.0.attn_q.weight", LOOM_DTYPE_U8, 2, 4, 8,
                                  calloc(32, 1), 32, true);
    void *self;
    loom_error err = {0};
    cr_assert_eq(qt_create(c, NULL, &self, &err), LOOM_OK);
    loom_quant_plan p;
    cr_assert_eq(ops_of(c)->plan(self, &m.view, t, &p, &err), LOOM_OK);
    loom_qtensor q = {.struct_size = sizeof q};
    loom_status st = ops_of(c)->quantize(self, &m.view, t, &p, &q, &err);
    cr_assert_eq(st, LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "blk.0.attn_q.weight") && strstr(err.message, "u8") &&
                  strstr(err.message, "skip"),
              "%s", err.message);
    p.format = LOOM_QFMT_INT4_W4A16;
    cr_assert_eq(ops_of(c)->quantize(self, &m.view, t, &p, &q, &err), LOOM_ERR_INVALID);
    ops_of(c)->destroy(self);
    qt_model_free(&m);
    cr_assert_eq(fake_host_live_allocs(), 0);
}
