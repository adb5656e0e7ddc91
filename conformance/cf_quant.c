/*
 * conformance/cf_quant.c — the quantizer checks (loom/quant.h), on a small
 * Llama-shaped model of random float32 weights:
 *
 *   quant.plan        plan() of every linear weight answers a known
 *                     format; GGUF only for tensors stored as GGUF
 *                     blocks; INT4 with a group size dividing the width;
 *                     kv_dtype() (when present) a KV element type.
 *   quant.roundtrip   every weight planned to a quantized format is
 *                     quantized, read back through the layout loom/quant.h
 *                     documents (not through the plugin), and compared:
 *                       INT8  each element within half a step (scale / 2),
 *                             relative Frobenius error < 2%;
 *                       FP8   each element within max(|w| / 16, scale x
 *                             2^-10) (E4M3's rounding), error < 5%;
 *                       INT4  each group's squared error within min/max
 *                             rounding's bound g (D / 2)^2, D = range / 15,
 *                             error < 15%;
 *                     (SmoothQuant's `smooth` factors, when set, are
 *                     applied to the reference); release() returns every
 *                     allocation and is a no-op on an empty tensor.
 *   quant.refusals    what a quantizer cannot take is refused with a
 *                     message naming the tensor, allocating nothing: a
 *                     source dtype host->convert does not read, a plan in a
 *                     format it does not make (or it makes it correctly),
 *                     a width it cannot split (or it plans something that
 *                     round-trips).
 *   quant.nomem       each host allocation quantize() makes is refused in
 *                     turn: LOOM_ERR_NOMEM, nothing left behind.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "loom/quant.h"

#define QM_MAX 40

/* ------------------------------------------------------------ the model */

typedef struct qm {
    loom_model_config cfg;
    loom_tensor t[QM_MAX];
    char names[QM_MAX][64];
    int n;
    loom_model_view view;
} qm;

static const loom_tensor *qm_get(void *ctx, const char *name) {
    qm *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->names[i], name)) return &m->t[i];
    return NULL;
}
static int32_t qm_count(void *ctx) { return ((qm *)ctx)->n; }
static const loom_tensor *qm_at(void *ctx, int32_t i) {
    qm *m = ctx;
    return i >= 0 && i < m->n ? &m->t[i] : NULL;
}

static loom_tensor *qm_add(qm *m, const char *name, loom_dtype dt, int ndim, int64_t d0, int64_t d1, size_t esize) {
    int i = m->n++;
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    size_t n = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    m->t[i] = (loom_tensor){.struct_size = sizeof(loom_tensor), .dtype = dt, .ndim = ndim, .data = calloc(n, esize),
                            .nbytes = n * esize, .device = LOOM_DEVICE_HOST, .name = m->names[i]};
    m->t[i].shape[0] = d0;
    if (ndim > 1) m->t[i].shape[1] = d1;
    return &m->t[i];
}

static void qm_fill(loom_tensor *t, cf_rng *g, double scale) {
    float *w = t->data;
    int64_t n = (int64_t)(t->nbytes / sizeof(float));
    for (int64_t i = 0; w && i < n; i++) w[i] = (float)(scale * cf_rng_normal(g));
}

/* hidden 128, 2 layers of 4 heads x 32, 2 KV heads, FFN 256, vocab 96:
 * every linear width is 128 or 256, so group sizes up to 128 divide it. */
static void qm_init(qm *m, cf_rng *g) {
    memset(m, 0, sizeof *m);
    m->cfg = (loom_model_config){.struct_size = sizeof m->cfg, .arch = LOOM_ARCH_LLAMA, .vocab_size = 96,
                                 .hidden_size = 128, .intermediate_size = 256, .num_layers = 2, .num_heads = 4,
                                 .num_kv_heads = 2, .head_dim = 32, .max_context = 256, .rope_theta = 10000.0f,
                                 .rms_norm_eps = 1e-5f, .bos_token_id = 1, .eos_token_id = 2};
    snprintf(m->cfg.name, sizeof m->cfg.name, "conformance-quant");
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->cfg, .ctx = m, .get = qm_get,
                                .count = qm_count, .at = qm_at};
    qm_fill(qm_add(m, "token_embd.weight", LOOM_DTYPE_F32, 2, 96, 128, 4), g, 1.0);
    qm_fill(qm_add(m, "output.weight", LOOM_DTYPE_F32, 2, 96, 128, 4), g, 1.0);
    qm_add(m, "output_norm.weight", LOOM_DTYPE_F32, 1, 128, 0, 4);
    static const char *const lin[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    static const int64_t shape[7][2] = {{128, 128}, {64, 128}, {64, 128}, {128, 128},
                                        {256, 128}, {256, 128}, {128, 256}};
    for (int l = 0; l < 2; l++) {
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        qm_add(m, nm, LOOM_DTYPE_F32, 1, 128, 0, 4);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        qm_add(m, nm, LOOM_DTYPE_F32, 1, 128, 0, 4);
        for (int k = 0; k < 7; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, lin[k]);
            qm_fill(qm_add(m, nm, LOOM_DTYPE_F32, 2, shape[k][0], shape[k][1], 4), g, 0.02 + 0.08 * cf_rng_unif(g));
        }
    }
}

static void qm_free(qm *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
    m->n = 0;
}

static bool qm_linear(const loom_tensor *t) { return t->ndim == 2; }

/* ------------------------------------------------------------- helpers */

typedef struct qx {
    cf_run *r;
    const loom_quant_ops *ops;
    void *self;
    qm m;
    cf_rng g;
} qx;

/* An instance with parameters `csv` (undeclared keys dropped) and the model. */
static bool qx_open(cf_run *r, qx *x, const char *csv) {
    memset(x, 0, sizeof *x);
    x->r = r;
    x->ops = r->comp->ops;
    x->g = cf_rng_make(r->seed);
    qm_init(&x->m, &x->g);
    if (cf_create(r, csv, &x->self)) return true;
    qm_free(&x->m);
    return false;
}

static bool qx_close(qx *x, bool ok) {
    qm_free(&x->m);
    if (!ok) {
        x->ops->destroy(x->self);
        return false;
    }
    return cf_destroy(x->r, x->self);
}

static loom_status qx_plan(qx *x, const loom_tensor *t, loom_quant_plan *p, loom_error *err) {
    *p = (loom_quant_plan){.struct_size = sizeof *p};
    cf_where(x->r, "plan(%s)", t->name);
    return x->ops->plan(x->self, &x->m.view, t, p, err);
}

static const char *qx_fmt(loom_qformat f) {
    static const char *const names[] = {"NONE", "INT8_W8A16", "INT8_W8A8", "FP8_W8A8", "INT4_W4A16", "GGUF"};
    return f >= 0 && f <= LOOM_QFMT_GGUF ? names[f] : "unknown";
}

static bool qx_plan_ok(qx *x, const loom_tensor *t, const loom_quant_plan *p) {
    CF_ENSURE(x->r, p->format >= LOOM_QFMT_NONE && p->format <= LOOM_QFMT_GGUF, "plan(%s) answered format %d, not a "
              "loom_qformat", t->name, (int)p->format);
    CF_ENSURE(x->r, p->format != LOOM_QFMT_GGUF || t->dtype >= LOOM_DTYPE_Q8_0, "plan(%s) answered GGUF for a %s "
              "tensor: GGUF is the block type as stored", t->name, cf_host()->dtype_name(t->dtype));
    if (p->format == LOOM_QFMT_INT4_W4A16)
        CF_ENSURE(x->r, p->group_size > 0 && t->shape[1] % p->group_size == 0 && t->shape[1] % 2 == 0,
                  "plan(%s): INT4 with group_size %d for a width of %lld", t->name, p->group_size,
                  (long long)t->shape[1]);
    return true;
}

/* ----------------------------------------------------------- the layout */

/* Whether tensor `t` of a qtensor is host data of `dt` holding at least
 * `n` elements laid out as (d0, d1) (d1 < 0: one dimension). */
static bool qx_part(qx *x, const char *what, const loom_tensor *t, loom_dtype dt, int64_t d0, int64_t d1,
                    const char *name) {
    int64_t n = d0 * (d1 < 0 ? 1 : d1);
    CF_ENSURE(x->r, t->data && t->device == LOOM_DEVICE_HOST, "quantize(%s): %s has no host data", name, what);
    CF_ENSURE(x->r, t->dtype == dt, "quantize(%s): %s is %s, loom/quant.h says %s", name, what,
              cf_host()->dtype_name(t->dtype), cf_host()->dtype_name(dt));
    CF_ENSURE(x->r, t->nbytes >= cf_host()->dtype_row_bytes(dt, n), "quantize(%s): %s holds %zu bytes for %lld "
              "elements", name, what, t->nbytes, (long long)n);
    CF_ENSURE(x->r, t->shape[0] == d0 && (d1 < 0 || (t->ndim >= 2 && t->shape[1] == d1)) &&
                        (d1 >= 0 || t->ndim == 1 || t->shape[0] * t->shape[1] == d0),
              "quantize(%s): %s has shape (%lld, %lld), want (%lld%s%lld)", name, what, (long long)t->shape[0],
              (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)d0, d1 < 0 ? "" : ", ",
              (long long)(d1 < 0 ? 0 : d1));
    return true;
}

/* The documented layout of q for a weight of (rows, cols). */
static bool qx_layout(qx *x, const loom_qtensor *q, const loom_quant_plan *p, const loom_tensor *w) {
    const char *nm = w->name;
    int64_t rows = w->shape[0], cols = w->shape[1];
    CF_ENSURE(x->r, q->format == p->format && q->rows == rows && q->cols == cols, "quantize(%s) made format %s (%lld, "
              "%lld); the plan said %s (%lld, %lld)", nm, qx_fmt(q->format), (long long)q->rows, (long long)q->cols,
              qx_fmt(p->format), (long long)rows, (long long)cols);
    switch (p->format) {
    case LOOM_QFMT_INT8_W8A16:
    case LOOM_QFMT_INT8_W8A8:
        if (!qx_part(x, "data", &q->data, LOOM_DTYPE_I8, rows, cols, nm)) return false;
        if (!qx_part(x, "scales", &q->scales, LOOM_DTYPE_F32, rows, -1, nm)) return false;
        break;
    case LOOM_QFMT_FP8_W8A8: {
        if (!qx_part(x, "data", &q->data, LOOM_DTYPE_FP8_E4M3, rows, cols, nm)) return false;
        int64_t ns = q->scales.shape[0];
        CF_ENSURE(x->r, ns == 1 || ns == rows, "quantize(%s): FP8 scales of %lld entries (want 1 or %lld)", nm,
                  (long long)ns, (long long)rows);
        if (!qx_part(x, "scales", &q->scales, LOOM_DTYPE_F32, ns, -1, nm)) return false;
        break;
    }
    case LOOM_QFMT_INT4_W4A16: {
        int32_t g = q->group_size;
        CF_ENSURE(x->r, g == p->group_size && g > 0 && cols % g == 0, "quantize(%s): INT4 group_size %d (plan %d)", nm,
                  g, p->group_size);
        if (!qx_part(x, "data", &q->data, LOOM_DTYPE_U8, rows, cols / 2, nm)) return false;
        if (!qx_part(x, "scales", &q->scales, LOOM_DTYPE_F32, rows, cols / g, nm)) return false;
        if (!qx_part(x, "zeros", &q->zeros, LOOM_DTYPE_F32, rows, cols / g, nm)) return false;
        break;
    }
    default:
        return cf_fail(x->r, "quantize(%s) was asked for format %s", nm, qx_fmt(p->format));
    }
    if (q->smooth.data) {
        CF_ENSURE(x->r, p->format == LOOM_QFMT_INT8_W8A8 || p->format == LOOM_QFMT_FP8_W8A8, "quantize(%s): smooth "
                  "factors on a %s tensor (SmoothQuant is for W8A8 only)", nm, qx_fmt(p->format));
        if (!qx_part(x, "smooth", &q->smooth, LOOM_DTYPE_F32, cols, -1, nm)) return false;
    }
    return true;
}

/* ----------------------------------------------------------- round trip */

/* q read back as floats, written from loom/quant.h's layouts. */
static bool qx_dequant(qx *x, const loom_qtensor *q, float *out) {
    int64_t rows = q->rows, cols = q->cols;
    const float *s = q->scales.data;
    if (q->format == LOOM_QFMT_INT8_W8A16 || q->format == LOOM_QFMT_INT8_W8A8) {
        const int8_t *d = q->data.data;
        for (int64_t i = 0; i < rows * cols; i++) out[i] = (float)d[i] * s[i / cols];
    } else if (q->format == LOOM_QFMT_FP8_W8A8) {
        loom_status st = cf_host()->convert(LOOM_DTYPE_F32, out, LOOM_DTYPE_FP8_E4M3, q->data.data, rows * cols);
        CF_ENSURE(x->r, st == LOOM_OK, "host->convert cannot read FP8 (a kit bug)");
        bool per_row = q->scales.shape[0] == rows && rows > 1;
        for (int64_t i = 0; i < rows * cols; i++) out[i] *= s[per_row ? i / cols : 0];
    } else {
        const uint8_t *d = q->data.data;
        const float *z = q->zeros.data;
        int64_t gpr = cols / q->group_size;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t k = 0; k < cols; k++) {
                int qv = (d[i * (cols / 2) + k / 2] >> (4 * (k & 1))) & 15;
                int64_t gi = i * gpr + k / q->group_size;
                out[i * cols + k] = ((float)qv - z[gi]) * s[gi];
            }
    }
    return true;
}

/* The bounds of the file comment; `ref` is the weight (times smooth). The
 * relative ones hold for the kit's Gaussian weights (`relative`), the
 * per-element ones for any weights. */
static bool qx_bounds(qx *x, const loom_qtensor *q, const float *ref, const float *back, const char *nm,
                      bool relative) {
    int64_t rows = q->rows, cols = q->cols;
    double err2 = 0, norm2 = 0;
    for (int64_t i = 0; i < rows * cols; i++) {
        double e = (double)back[i] - ref[i];
        err2 += e * e;
        norm2 += (double)ref[i] * ref[i];
        CF_ENSURE(x->r, isfinite(back[i]), "%s reads back a non-finite value at element %lld", nm, (long long)i);
        if (q->format == LOOM_QFMT_INT8_W8A16 || q->format == LOOM_QFMT_INT8_W8A8) {
            double half = ((const float *)q->scales.data)[i / cols] * 0.5 * 1.001 + 1e-12;
            CF_ENSURE(x->r, fabs(e) <= half, "%s element (%lld, %lld): %g reads back %g, more than half a step "
                      "(%g) off", nm, (long long)(i / cols), (long long)(i % cols), ref[i], back[i], half);
        } else if (q->format == LOOM_QFMT_FP8_W8A8) {
            const float *s = q->scales.data;
            double sc = s[q->scales.shape[0] == rows && rows > 1 ? i / cols : 0];
            double lim = fmax(fabs(ref[i]) / 16.0, sc * 0x1p-10) * 1.001 + 1e-12;
            CF_ENSURE(x->r, fabs(e) <= lim, "%s element (%lld, %lld): %g reads back %g (scale %g): beyond E4M3's "
                      "rounding", nm, (long long)(i / cols), (long long)(i % cols), ref[i], back[i], sc);
        }
    }
    double rel = norm2 > 0 ? sqrt(err2 / norm2) : sqrt(err2);
    if (!relative) return true;
    double lim = q->format == LOOM_QFMT_INT4_W4A16 ? 0.15 : q->format == LOOM_QFMT_FP8_W8A8 ? 0.05 : 0.02;
    CF_ENSURE(x->r, rel < lim, "%s (%s) round-trips with a relative error of %.4f (bound %.2f)", nm, qx_fmt(q->format),
              rel, lim);
    return true;
}

/* INT4: each group within min/max rounding's hard bound, plus the read-back's
 * own float rounding: a few ulps (2^-21) of the group's largest magnitude an
 * element, which a group of nearly equal values (a range below one ulp of
 * them) is off by however it is coded. */
static bool qx_int4_groups(qx *x, const loom_qtensor *q, const float *ref, const float *back, const char *nm) {
    int64_t cols = q->cols, g = q->group_size;
    for (int64_t i = 0; i < q->rows; i++)
        for (int64_t gi = 0; gi < cols / g; gi++) {
            double lo = INFINITY, hi = -INFINITY, ge = 0;
            for (int64_t k = gi * g; k < (gi + 1) * g; k++) {
                lo = fmin(lo, ref[i * cols + k]), hi = fmax(hi, ref[i * cols + k]);
                double e = (double)back[i * cols + k] - ref[i * cols + k];
                ge += e * e;
            }
            const double D = (hi - lo) / 15.0, ulps = fmax(fabs(lo), fabs(hi)) * 0x1p-21;
            CF_ENSURE(x->r, ge <= g * D * D / 4.0 * 1.001 + g * ulps * ulps + 1e-18,
                      "%s row %lld group %lld: squared error %g beyond min/max rounding's %g (and float rounding's %g)",
                      nm, (long long)i, (long long)gi, ge, g * D * D / 4.0, g * ulps * ulps);
        }
    return true;
}

/* Layout, read back and bounds of q made from w under p; back (rows x
 * cols) receives the read-back weights. */
static bool qx_readback(qx *x, const loom_tensor *w, const loom_quant_plan *p, const loom_qtensor *q, float *back,
                        bool relative) {
    int64_t n = w->shape[0] * w->shape[1];
    if (!qx_layout(x, q, p, w) || !qx_dequant(x, q, back)) return false;
    float *ref = malloc(sizeof(float) * (size_t)n);
    CF_ENSURE(x->r, ref, "out of memory");
    const float *src = w->data, *sm = q->smooth.data;
    for (int64_t i = 0; i < n; i++) ref[i] = sm ? src[i] * sm[i % w->shape[1]] : src[i];
    bool ok = qx_bounds(x, q, ref, back, w->name, relative);
    if (ok && q->format == LOOM_QFMT_INT4_W4A16) ok = qx_int4_groups(x, q, ref, back, w->name);
    free(ref);
    return ok;
}

bool loom_conformance_quant_readback(const loom_tensor *w, const loom_quant_plan *p, const loom_qtensor *q,
                                     float *back, char *why, size_t cap) {
    static const loom_conformance_opts opts = {0};
    cf_run r = {.opts = &opts, .check = "quant.readback"};
    qx x = {.r = &r};
    bool ok = w && w->dtype == LOOM_DTYPE_F32 && w->ndim == 2 && w->data ? qx_readback(&x, w, p, q, back, false)
                                                                        : cf_fail(&r, "the weight must be f32 (rows, cols)");
    if (!ok) snprintf(why, cap, "%s", r.why);
    return ok;
}

/* quantize -> layout -> read back -> bounds -> release. */
static bool qx_roundtrip(qx *x, const loom_tensor *w, const loom_quant_plan *p) {
    loom_qtensor q = {.struct_size = sizeof q};
    loom_error err = {0};
    long before = cf_host_live();
    cf_where(x->r, "quantize(%s)", w->name);
    loom_status st = x->ops->quantize(x->self, &x->m.view, w, p, &q, &err);
    CF_ENSURE(x->r, st == LOOM_OK, "quantize(%s) of its own plan (%s) failed: %s", w->name, qx_fmt(p->format),
              err.message);
    float *back = malloc(sizeof(float) * (size_t)(w->shape[0] * w->shape[1]));
    bool ok = back ? qx_readback(x, w, p, &q, back, true) : cf_fail(x->r, "out of memory");
    free(back);
    cf_where(x->r, "release(%s)", w->name);
    x->ops->release(x->self, &q);
    loom_qtensor empty = {.struct_size = sizeof empty};
    x->ops->release(x->self, &empty);
    if (ok && cf_host_live() != before)
        ok = cf_fail(x->r, "release(%s) left %ld host allocations", w->name, cf_host_live() - before);
    return ok;
}

/* ---------------------------------------------------------------- checks */

static bool check_plan(cf_run *r, const void *arg) {
    qx x;
    if (!qx_open(r, &x, "")) return false;
    bool ok = true;
    int counts[LOOM_QFMT_GGUF + 1] = {0};
    for (int i = 0; ok && i < x.m.n; i++) {
        const loom_tensor *t = &x.m.t[i];
        if (!qm_linear(t)) continue;
        loom_quant_plan p;
        loom_error err = {0};
        loom_status st = qx_plan(&x, t, &p, &err);
        if (st != LOOM_OK) ok = cf_fail(r, "plan(%s) of a float32 (%lld, %lld) weight failed: %s", t->name,
                                        (long long)t->shape[0], (long long)t->shape[1], err.message);
        else if ((ok = qx_plan_ok(&x, t, &p))) counts[p.format]++;
    }
    if (ok && x.ops->kv_dtype) {
        cf_where(r, "kv_dtype()");
        loom_dtype d = x.ops->kv_dtype(x.self);
        if (d != LOOM_DTYPE_F32 && d != LOOM_DTYPE_F16 && d != LOOM_DTYPE_BF16 && d != LOOM_DTYPE_FP8_E4M3 &&
            d != LOOM_DTYPE_COUNT)
            ok = cf_fail(r, "kv_dtype() answered %d: a KV element type is f32, f16, bf16, fp8_e4m3 or "
                            "LOOM_DTYPE_COUNT (the backend's default)", (int)d);
    }
    if (ok)
        cf_note(r, "16 linear weights: %d kept, %d INT8_W8A16, %d INT8_W8A8, %d FP8, %d INT4", counts[0], counts[1],
                counts[2], counts[3], counts[4]);
    return qx_close(&x, ok);
}

static bool check_roundtrip(cf_run *r, const void *arg) {
    qx x;
    if (!qx_open(r, &x, arg)) return false;
    bool ok = true;
    int done = 0;
    for (int i = 0; ok && i < x.m.n; i++) {
        const loom_tensor *t = &x.m.t[i];
        if (!qm_linear(t)) continue;
        loom_quant_plan p;
        loom_error err = {0};
        if (qx_plan(&x, t, &p, &err) != LOOM_OK) {
            ok = cf_fail(r, "plan(%s) failed: %s", t->name, err.message);
            break;
        }
        if (!(ok = qx_plan_ok(&x, t, &p))) break;
        if (p.format == LOOM_QFMT_NONE || p.format == LOOM_QFMT_GGUF) continue;
        ok = qx_roundtrip(&x, t, &p);
        done++;
    }
    if (ok && done == 0) ok = cf_skip(r, "the default configuration quantizes no weight of the test model");
    else if (ok) cf_note(r, "%d weights quantized and read back within bounds", done);
    return qx_close(&x, ok);
}

/* A call that must be refused: status != OK, a message naming `nm`, no
 * host allocation left. */
static bool qx_refused(qx *x, loom_status st, const loom_error *err, long before, const char *what, const char *nm) {
    CF_ENSURE(x->r, st != LOOM_OK, "%s was accepted", what);
    CF_ENSURE(x->r, st == LOOM_ERR_INVALID || st == LOOM_ERR_UNSUPPORTED, "%s failed with status %d, not "
              "INVALID or UNSUPPORTED: %s", what, (int)st, err->message);
    CF_ENSURE(x->r, strstr(err->message, nm), "%s was refused, but the message does not name the tensor '%s': %s",
              what, nm, err->message);
    CF_ENSURE(x->r, cf_host_live() == before, "%s was refused but left %ld host allocations", what,
              cf_host_live() - before);
    return true;
}

/* A weight in each dtype host->convert cannot read into f32. */
static bool qx_refuse_dtype(qx *x, const loom_tensor *w, const loom_quant_plan *p) {
    for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
        float probe[256];
        uint8_t zeros[1024] = {0};
        int64_t blk = cf_host()->dtype_block_elems((loom_dtype)d);
        if (blk <= 0 || blk > 256 || cf_host()->convert(LOOM_DTYPE_F32, probe, (loom_dtype)d, zeros, blk) !=
                                         LOOM_ERR_UNSUPPORTED)
            continue; /* readable: not a refusal case */
        loom_tensor t = *w;
        t.dtype = (loom_dtype)d;
        t.nbytes = cf_host()->dtype_row_bytes(t.dtype, t.shape[1]) * (size_t)t.shape[0];
        char *data = calloc(1, t.nbytes ? t.nbytes : 1);
        if (!data) return cf_fail(x->r, "out of memory");
        t.data = data;
        loom_qtensor q = {.struct_size = sizeof q};
        loom_error err = {0};
        long before = cf_host_live();
        cf_where(x->r, "quantize(%s) of %s data", t.name, cf_host()->dtype_name(t.dtype));
        loom_status st = x->ops->quantize(x->self, &x->m.view, &t, p, &q, &err);
        if (st == LOOM_OK) x->ops->release(x->self, &q);
        free(data);
        char what[128];
        snprintf(what, sizeof what, "quantize(%s) of %s data (host->convert cannot read it)", t.name,
                 cf_host()->dtype_name(t.dtype));
        if (!qx_refused(x, st, &err, before, what, t.name)) return false;
    }
    return true;
}

/* A plan in every other format: made correctly, or refused by name. */
static bool qx_refuse_format(qx *x, const loom_tensor *w, const loom_quant_plan *own, int *made) {
    for (int f = LOOM_QFMT_INT8_W8A16; f <= LOOM_QFMT_INT4_W4A16; f++) {
        if (f == (int)own->format) continue;
        loom_quant_plan p = {.struct_size = sizeof p, .format = (loom_qformat)f, .group_size = 32, .per_channel = true};
        loom_qtensor q = {.struct_size = sizeof q};
        loom_error err = {0};
        long before = cf_host_live();
        cf_where(x->r, "quantize(%s) in format %s", w->name, qx_fmt(p.format));
        loom_status st = x->ops->quantize(x->self, &x->m.view, w, &p, &q, &err);
        if (st == LOOM_OK) {
            x->ops->release(x->self, &q);
            if (!qx_roundtrip(x, w, &p)) return false;
            (*made)++;
            continue;
        }
        char what[128];
        snprintf(what, sizeof what, "quantize(%s) with a plan in format %s, which plan() never gave", w->name,
                 qx_fmt(p.format));
        if (!qx_refused(x, st, &err, before, what, w->name)) return false;
    }
    return true;
}

/* A width no group divides: planned to something that round-trips, or refused. */
static bool qx_refuse_shape(qx *x) {
    loom_tensor *t = qm_add(&x->m, "blk.1.attn_q.weight_odd", LOOM_DTYPE_F32, 2, 8, 33, 4);
    snprintf(x->m.names[x->m.n - 1], sizeof x->m.names[0], "blk.1.attn_q.weight");
    t->name = x->m.names[x->m.n - 1];
    qm_fill(t, &x->g, 0.05);
    loom_tensor w = *t;
    loom_quant_plan p;
    loom_error err = {0};
    long before = cf_host_live();
    loom_status st = qx_plan(x, &w, &p, &err);
    if (st != LOOM_OK) return qx_refused(x, st, &err, before, "plan() of an (8, 33) weight", w.name);
    if (!qx_plan_ok(x, &w, &p)) return false;
    if (p.format == LOOM_QFMT_NONE || p.format == LOOM_QFMT_GGUF) return true;
    before = cf_host_live();
    loom_qtensor q = {.struct_size = sizeof q};
    cf_where(x->r, "quantize() of an (8, 33) weight");
    st = x->ops->quantize(x->self, &x->m.view, &w, &p, &q, &err);
    if (st != LOOM_OK) return qx_refused(x, st, &err, before, "quantize() of an (8, 33) weight", w.name);
    x->ops->release(x->self, &q);
    return qx_roundtrip(x, &w, &p);
}

/* plan() of w into *p; false after failing the check with its message. */
static bool qx_plan_or_fail(qx *x, const loom_tensor *w, loom_quant_plan *p) {
    loom_error err = {0};
    return qx_plan(x, w, p, &err) == LOOM_OK || cf_fail(x->r, "plan(%s) failed: %s", w->name, err.message);
}

static bool check_refusals(cf_run *r, const void *arg) {
    qx x;
    if (!qx_open(r, &x, "")) return false;
    const loom_tensor *w = qm_get(&x.m, "blk.0.ffn_up.weight");
    loom_quant_plan p;
    bool ok = qx_plan_or_fail(&x, w, &p);
    int made = 0;
    if (ok && p.format != LOOM_QFMT_NONE && p.format != LOOM_QFMT_GGUF) ok = qx_refuse_dtype(&x, w, &p);
    if (ok) ok = qx_refuse_format(&x, w, &p, &made);
    if (ok) ok = qx_refuse_shape(&x);
    if (ok) cf_note(r, "bad dtypes, foreign formats (%d of them made correctly instead) and an odd width", made);
    return qx_close(&x, ok);
}

/* Each host allocation of one quantize() refused in turn. */
static bool check_nomem(cf_run *r, const void *arg) {
    qx x;
    if (!qx_open(r, &x, "")) return false;
    const loom_tensor *w = qm_get(&x.m, "blk.0.ffn_up.weight");
    loom_quant_plan p;
    loom_error err = {0};
    bool ok = qx_plan_or_fail(&x, w, &p);
    int points = 0;
    for (long k = 0; ok && p.format != LOOM_QFMT_NONE && p.format != LOOM_QFMT_GGUF && k < 32; k++) {
        loom_qtensor q = {.struct_size = sizeof q};
        long before = cf_host_live();
        cf_host_fail_alloc(k);
        cf_where(r, "quantize(%s) with host allocation #%ld failing", w->name, k + 1);
        loom_status st = x.ops->quantize(x.self, &x.m.view, w, &p, &q, &err);
        long calls = cf_host_alloc_calls();
        cf_host_fail_alloc(-1);
        if (st == LOOM_OK) x.ops->release(x.self, &q);
        if (calls <= k) break;
        points++;
        if (st == LOOM_OK) ok = cf_fail(r, "quantize() returned LOOM_OK although host allocation #%ld failed", k + 1);
        else if (st != LOOM_ERR_NOMEM)
            ok = cf_fail(r, "quantize() answered a refused allocation (#%ld) with status %d: %s", k + 1, (int)st,
                         err.message);
        else if (cf_host_live() != before)
            ok = cf_fail(r, "quantize() failed (allocation #%ld refused) but left %ld host allocations", k + 1,
                         cf_host_live() - before);
    }
    if (ok) cf_note(r, "%d allocation point%s", points, points == 1 ? "" : "s");
    return qx_close(&x, ok);
}

int cf_checks_quantizer(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_plan, NULL, "quant.plan");
    /* Round trips with the defaults, then each variant of a well-known
     * parameter the quantizer declares. */
    static const char *const variants[] = {"mode=w8a8", "scales=per_tensor", "group_size=32", "group_size=64"};
    n = cf_add(out, n, cap, check_roundtrip, "", "quant.roundtrip");
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char label[64];
        cf_config_label(c, variants[i], label, sizeof label);
        if (label[0]) n = cf_add(out, n, cap, check_roundtrip, variants[i], "quant.roundtrip[%s]", label);
    }
    n = cf_add(out, n, cap, check_refusals, NULL, "quant.refusals");
    n = cf_add(out, n, cap, check_nomem, NULL, "quant.nomem");
    return n;
}
