/*
 * tests/quant/test_awq_gptq.c — 4-bit AWQ / GPTQ checkpoints into loom INT4,
 * on synthetic packed tensors: random codes, zeros and f16 scales are packed
 * here by independent packers written from the formats' descriptions
 * (GPTQ: sequential nibbles along the input dim, stored zero = zero - 1 in
 * v1; AWQ: nibbles along the output dim in the order [0, 2, 4, 6, 1, 3, 5,
 * 7]), then read back through the int4 plugin (source awq / gptq /
 * gptq_v2) and through awq_gptq.c directly. Act-order GPTQ (a permuted
 * g_idx) and every layout mismatch the plugin must name are covered too.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../plugins/quantizer/int4/awq_gptq.h"
#include "rng.h"
#include "fake_host.h"
#include "formats/half.h"
#include "qt_util.h"

#define SETS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A synthetic quantized Linear (n out, k in, groups of g). */
typedef struct syn {
    int64_t n, k, g;
    uint8_t *Q;      /* (n, k) codes 0..15                      */
    uint8_t *Z;      /* (k/g, n) zeros 0..15                    */
    uint16_t *S;     /* (k/g, n) f16 scales                      */
    int32_t *gidx;   /* (k) group of each input                 */
} syn;

static void syn_make(syn *s, test_rng *r, int64_t n, int64_t k, int64_t g, bool act_order) {
    *s = (syn){.n = n, .k = k, .g = g};
    int64_t G = k / g;
    s->Q = malloc((size_t)(n * k));
    s->Z = malloc((size_t)(G * n));
    s->S = malloc((size_t)(G * n) * 2);
    s->gidx = malloc((size_t)k * 4);
    for (int64_t i = 0; i < n * k; i++) s->Q[i] = (uint8_t)rng_int(r, 16);
    for (int64_t i = 0; i < G * n; i++) {
        s->Z[i] = (uint8_t)rng_int(r, 16); /* 0 and 15 included: v1's wrap-around */
        s->S[i] = loom_fp32_to_fp16((float)rng_range(r, 0.001, 0.05));
    }
    for (int64_t i = 0; i < k; i++) s->gidx[i] = (int32_t)(i / g);
    if (act_order) /* GPTQ desc_act: groups formed in a permuted input order */
        for (int64_t i = k - 1; i > 0; i--) {
            int64_t j = rng_int(r, i + 1);
            int32_t t = s->gidx[i];
            s->gidx[i] = s->gidx[j];
            s->gidx[j] = t;
        }
}

static void syn_free(syn *s) { free(s->Q), free(s->Z), free(s->S), free(s->gidx); }

static double syn_w(const syn *s, int64_t c, int64_t r) {
    int64_t grp = s->gidx[r];
    return ((double)s->Q[c * s->k + r] - s->Z[grp * s->n + c]) *
           loom_fp16_to_fp32(s->S[grp * s->n + c]);
}

/* Add the packed tensors of s under "blk.0.attn_q.*" plus a shape-only
 * .weight descriptor (no data: the loader would expose just its shape). */
static void syn_pack(const syn *s, qt_model *m, i4_packing pk, bool with_gidx) {
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const int64_t n = s->n, k = s->k, G = k / s->g;
    qt_model_add(m, "blk.0.attn_q.weight", LOOM_DTYPE_F16, 2, n, k, NULL, 0, false);
    uint32_t *qw = calloc((size_t)(n * k / 8), 4), *qz = calloc((size_t)(G * n / 8), 4);
    if (pk == I4_PACK_AWQ) {
        for (int64_t r = 0; r < k; r++)
            for (int64_t i = 0; i < n / 8; i++)
                for (int j = 0; j < 8; j++)
                    qw[r * (n / 8) + i] |= (uint32_t)s->Q[(8 * i + order[j]) * k + r] << (4 * j);
        qt_model_add(m, "blk.0.attn_q.qweight", LOOM_DTYPE_I32, 2, k, n / 8, qw,
                     (size_t)(n * k / 2), true);
    } else {
        for (int64_t i = 0; i < k / 8; i++)
            for (int64_t c = 0; c < n; c++)
                for (int j = 0; j < 8; j++)
                    qw[i * n + c] |= (uint32_t)s->Q[c * k + 8 * i + j] << (4 * j);
        qt_model_add(m, "blk.0.attn_q.qweight", LOOM_DTYPE_I32, 2, k / 8, n, qw,
                     (size_t)(n * k / 2), true);
    }
    for (int64_t grp = 0; grp < G; grp++)
        for (int64_t i = 0; i < n / 8; i++)
            for (int j = 0; j < 8; j++) {
                int64_t c = 8 * i + (pk == I4_PACK_AWQ ? order[j] : j);
                uint32_t z = s->Z[grp * n + c];
                if (pk == I4_PACK_GPTQ) z = (z - 1) & 15u; /* v1 stores zero - 1 */
                qz[grp * (n / 8) + i] |= z << (4 * j);
            }
    qt_model_add(m, "blk.0.attn_q.qzeros", LOOM_DTYPE_I32, 2, G, n / 8, qz, (size_t)(G * n / 2),
                 true);
    uint16_t *sc = malloc((size_t)(G * n) * 2);
    memcpy(sc, s->S, (size_t)(G * n) * 2);
    qt_model_add(m, "blk.0.attn_q.scales", LOOM_DTYPE_F16, 2, G, n, sc, (size_t)(G * n) * 2, true);
    if (with_gidx) {
        int32_t *gi = malloc((size_t)k * 4);
        memcpy(gi, s->gidx, (size_t)k * 4);
        qt_model_add(m, "blk.0.attn_q.g_idx", LOOM_DTYPE_I32, 1, k, 0, gi, (size_t)k * 4, true);
    }
}

static const char *src_of(i4_packing pk) {
    return pk == I4_PACK_AWQ ? "source=awq" : pk == I4_PACK_GPTQ ? "source=gptq" : "source=gptq_v2";
}

/* Plan and quantize blk.0.attn_q.weight of m with the int4 plugin. */
static loom_status run_plugin(qt_model *m, const char *const *sets, loom_quant_plan *p,
                              loom_qtensor *q, void **self, loom_error *err) {
    const loom_component *c = qt_component("LOOM_QUANT_INT4_SO");
    const loom_quant_ops *ops = c->ops;
    loom_status st = qt_create(c, sets, self, err);
    cr_assert_eq(st, LOOM_OK, "%s", err->message);
    const loom_tensor *w = m->view.get(m->view.ctx, "blk.0.attn_q.weight");
    if ((st = ops->plan(*self, &m->view, w, p, err))) return st;
    memset(q, 0, sizeof *q);
    q->struct_size = sizeof *q;
    return ops->quantize(*self, &m->view, w, p, q, err);
}

static void done_plugin(void *self, loom_qtensor *q) {
    const loom_quant_ops *ops = qt_component("LOOM_QUANT_INT4_SO")->ops;
    ops->release(self, q);
    ops->destroy(self);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(awq_gptq, unpack_bit_exact_every_packing) {
    test_rng r = rng_seeded("awq_gptq.exact");
    static const int64_t shapes[][3] = {{64, 256, 64}, {8, 64, 32}, {24, 128, 128}, {40, 96, 8}};
    for (int pk = 0; pk < 3; pk++)
        for (int sh = 0; sh < 4; sh++) {
            syn s;
            syn_make(&s, &r, shapes[sh][0], shapes[sh][1], shapes[sh][2], false);
            qt_model m;
            qt_model_init(&m);
            syn_pack(&s, &m, (i4_packing)pk, pk != I4_PACK_AWQ && sh % 2);
            char gs[32];
            snprintf(gs, sizeof gs, "group_size=%lld", (long long)s.g);
            loom_quant_plan p;
            loom_qtensor q;
            void *self;
            loom_error err = {0};
            cr_assert_eq(run_plugin(&m, SETS(src_of((i4_packing)pk), gs), &p, &q, &self, &err),
                         LOOM_OK, "%s: %s", i4_packing_name((i4_packing)pk), err.message);
            cr_assert_eq(p.format, LOOM_QFMT_INT4_W4A16);
            cr_assert_eq(p.group_size, s.g);
            cr_assert_eq(q.group_size, s.g);
            const uint8_t *d = q.data.data;
            const float *sc = q.scales.data, *z = q.zeros.data;
            const int64_t G = s.k / s.g;
            for (int64_t c = 0; c < s.n; c++) {
                for (int64_t rr = 0; rr < s.k; rr++) {
                    int code = (d[c * (s.k / 2) + rr / 2] >> (4 * (rr & 1))) & 15;
                    cr_assert_eq(code, s.Q[c * s.k + rr], "%s: code (%lld, %lld)",
                                 i4_packing_name((i4_packing)pk), (long long)c, (long long)rr);
                }
                for (int64_t g = 0; g < G; g++) {
                    cr_assert_eq(z[c * G + g], (float)s.Z[g * s.n + c], "%s zero (%lld, %lld)",
                                 i4_packing_name((i4_packing)pk), (long long)c, (long long)g);
                    cr_assert_eq(sc[c * G + g], loom_fp16_to_fp32(s.S[g * s.n + c]));
                }
            }
            done_plugin(self, &q);
            qt_model_free(&m);
            syn_free(&s);
        }
}

Test(awq_gptq, act_order_exact_floats_and_int8_fallback) {
    test_rng r = rng_seeded("awq_gptq.act_order");
    syn s;
    syn_make(&s, &r, 32, 256, 64, true);
    qt_model m;
    qt_model_init(&m);
    syn_pack(&s, &m, I4_PACK_GPTQ, true);
    /* direct: exact float weights through the permuted g_idx */
    i4_packed p = {.packing = I4_PACK_GPTQ, .n = s.n, .k = s.k,
                   .qweight = m.view.get(m.view.ctx, "blk.0.attn_q.qweight"),
                   .qzeros = m.view.get(m.view.ctx, "blk.0.attn_q.qzeros"),
                   .scales = m.view.get(m.view.ctx, "blk.0.attn_q.scales"),
                   .g_idx = m.view.get(m.view.ctx, "blk.0.attn_q.g_idx")};
    loom_error err = {0};
    const loom_host *h = fake_host();
    cr_assert_eq(i4_packed_check(h, "test", "blk.0.attn_q.weight", &p, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_eq(p.group_size, 64);
    cr_assert_not(i4_gidx_trivial(&p));
    float *w = malloc((size_t)(s.n * s.k) * 4);
    cr_assert_eq(i4_unpack_f32(h, "test", "x", &p, w, &err), LOOM_OK);
    for (int64_t c = 0; c < s.n; c++)
        for (int64_t rr = 0; rr < s.k; rr++)
            cr_assert_eq((double)w[c * s.k + rr], (double)(float)syn_w(&s, c, rr));
    /* i4_unpack refuses act-order */
    cr_assert_eq(i4_unpack(h, "test", "x", &p, NULL, NULL, NULL, &err), LOOM_ERR_INTERNAL);
    /* the plugin keeps it as int8 (default act_order: int8) */
    loom_quant_plan pl;
    loom_qtensor q;
    void *self;
    cr_assert_eq(run_plugin(&m, SETS("source=gptq", "group_size=64"), &pl, &q, &self, &err),
                 LOOM_OK, "%s", err.message);
    cr_assert_eq(pl.format, LOOM_QFMT_INT8_W8A16);
    cr_assert_eq(q.data.dtype, LOOM_DTYPE_I8);
    const int8_t *d = q.data.data;
    const float *sc = q.scales.data;
    for (int64_t c = 0; c < s.n; c++)
        for (int64_t rr = 0; rr < s.k; rr++)
            cr_assert_leq(fabsf((float)d[c * s.k + rr] * sc[c] - w[c * s.k + rr]),
                          sc[c] * 0.5f * 1.0001f);
    done_plugin(self, &q);
    /* ... or refuses, naming the tensor */
    cr_assert_eq(run_plugin(&m, SETS("source=gptq", "group_size=64", "act_order=error"), &pl, &q,
                            &self, &err),
                 LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "blk.0.attn_q.weight") && strstr(err.message, "act-order") &&
                  strstr(err.message, "act_order: int8"),
              "%s", err.message);
    done_plugin(self, &q);
    free(w);
    qt_model_free(&m);
    syn_free(&s);
}

/* Pack s as `pk`, ask the plugin with `sets`, expect `want` and every
 * needle in the message. */
static void expect_error(const syn *s, i4_packing pk, bool gidx, const char *const *sets,
                         loom_status want, const char *const *needles,
                         void (*tamper)(qt_model *)) {
    qt_model m;
    qt_model_init(&m);
    syn_pack(s, &m, pk, gidx);
    if (tamper) tamper(&m);
    loom_quant_plan p;
    loom_qtensor q;
    void *self;
    loom_error err = {0};
    loom_status st = run_plugin(&m, sets, &p, &q, &self, &err);
    cr_assert_eq(st, want, "status %d (%s), want %d", st, err.message, want);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(err.message, needles[i]), "message lacks '%s': %s", needles[i],
                  err.message);
    done_plugin(self, &q);
    qt_model_free(&m);
}

static void drop_qzeros(qt_model *m) {
    for (int i = 0; i < m->n; i++)
        if (strstr(m->names[i], "qzeros")) snprintf(m->names[i], sizeof m->names[i], "gone");
}
static void bad_gidx(qt_model *m) {
    const loom_tensor *t = m->view.get(m->view.ctx, "blk.0.attn_q.g_idx");
    ((int32_t *)t->data)[5] = 99;
}
static void f32_qweight(qt_model *m) {
    ((loom_tensor *)m->view.get(m->view.ctx, "blk.0.attn_q.qweight"))->dtype = LOOM_DTYPE_F32;
}

Test(awq_gptq, layout_mismatches_are_named) {
    test_rng r = rng_seeded("awq_gptq.errors");
    syn s;
    syn_make(&s, &r, 64, 256, 64, false);
    expect_error(&s, I4_PACK_AWQ, false, SETS("source=gptq", "group_size=64"), LOOM_ERR_FORMAT,
                 (const char *const[]){"blk.0.attn_q.weight", "AWQ layout",
                                       "set quantizer.source: awq", NULL},
                 NULL);
    expect_error(&s, I4_PACK_GPTQ, false, SETS("source=awq", "group_size=64"), LOOM_ERR_FORMAT,
                 (const char *const[]){"GPTQ layout", "set quantizer.source: gptq", NULL}, NULL);
    expect_error(&s, I4_PACK_GPTQ, false, SETS("source=gptq"), LOOM_ERR_INVALID,
                 (const char *const[]){"blk.0.attn_q.weight", "groups of 64",
                                       "set quantizer.group_size: 64", NULL},
                 NULL);
    expect_error(&s, I4_PACK_AWQ, false, SETS("source=awq", "group_size=64"), LOOM_ERR_NOT_FOUND,
                 (const char *const[]){"qzeros", NULL}, drop_qzeros);
    expect_error(&s, I4_PACK_GPTQ, true, SETS("source=gptq", "group_size=64"), LOOM_ERR_FORMAT,
                 (const char *const[]){"g_idx[5] = 99", NULL}, bad_gidx);
    expect_error(&s, I4_PACK_GPTQ_V2, false, SETS("source=gptq_v2", "group_size=64"),
                 LOOM_ERR_FORMAT, (const char *const[]){"int32", NULL}, f32_qweight);
    syn_free(&s);
}
