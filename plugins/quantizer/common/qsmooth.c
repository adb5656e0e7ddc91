/*
 * plugins/quantizer/common/qsmooth.c — SmoothQuant bookkeeping shared by
 * the int8 (w8a8) and fp8 quantizers; see qsmooth.h.
 */
#include "qsmooth.h"

#include <stdio.h>
#include <string.h>

#include "qcommon.h"

loom_status qc_smooth_check(const loom_host *h, const char *who, double alpha,
                            const char *calibration, loom_error *err) {
    if (alpha < 0.0 || alpha > 1.0 || alpha != alpha)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: smoothquant %g outside [0, 1]", who,
                        alpha);
    if (alpha > 0.0 && (!calibration || !calibration[0]))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: smoothquant %g needs activation statistics: run `loom calibrate "
                        "CONFIG TEXTFILE --out stats.act` (CONFIG: the same pipeline without "
                        "a quantizer) and set quantizer.calibration: stats.act",
                        who, alpha);
    return LOOM_OK;
}

loom_status qc_smoother_open(qc_smoother *sm, const loom_host *h, const char *who, double alpha,
                             const char *calibration, loom_error *err) {
    memset(sm, 0, sizeof *sm);
    sm->host = h;
    sm->who = who;
    if (!(alpha > 0.0)) return LOOM_OK;
    char why[LOOM_ERROR_MSG_MAX - 64];
    if (!qc_expand_path(calibration, sm->path, sizeof sm->path, why, sizeof why) ||
        !qc_calib_read(sm->path, &sm->calib, why, sizeof why))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: calibration: %s", who, why);
    sm->alpha = alpha;
    return LOOM_OK;
}

void qc_smoother_free(qc_smoother *sm) {
    if (!sm || !sm->host) return;
    const loom_host *h = sm->host;
    for (int32_t i = 0; i < sm->n; i++) h->free(h->ctx, sm->v[i].s);
    h->free(h->ctx, sm->v);
    qc_calib_free(&sm->calib);
    sm->v = NULL;
    sm->n = sm->cap = 0;
    sm->alpha = 0.0;
}

int qc_smooth_group(const char *name, char out[4][QC_CALIB_NAME_MAX]) {
    static const char *const groups[][4] = {{"attn_q", "attn_k", "attn_v", NULL},
                                            {"ffn_gate", "ffn_up", NULL, NULL}};
    const char *dot = strrchr(name, '.'); /* ".weight" */
    const char *prev = dot;
    while (prev > name && prev[-1] != '.') prev--; /* start of the last component before it */
    size_t plen = (size_t)(prev - name), clen = (size_t)(dot - prev);
    for (size_t g = 0; dot && plen > 0 && g < sizeof groups / sizeof groups[0]; g++)
        for (int k = 0; groups[g][k]; k++) {
            if (strlen(groups[g][k]) != clen || memcmp(prev, groups[g][k], clen) != 0) continue;
            int n = 0;
            for (; groups[g][n]; n++)
                snprintf(out[n], QC_CALIB_NAME_MAX, "%.*s%s%s", (int)plen, name, groups[g][n], dot);
            return n;
        }
    snprintf(out[0], QC_CALIB_NAME_MAX, "%s", name);
    return 1;
}

loom_status qc_smoother_for(qc_smoother *sm, const loom_model_view *model, const loom_tensor *w,
                            const float **s, loom_error *err) {
    const loom_host *h = sm->host;
    const char *who = sm->who;
    char members[4][QC_CALIB_NAME_MAX];
    int nm = qc_smooth_group(w->name, members);
    for (int32_t i = 0; i < sm->n; i++)
        if (!strcmp(sm->v[i].key, members[0])) {
            *s = sm->v[i].s;
            return LOOM_OK;
        }
    const int64_t cols = w->shape[1];
    const qc_calib_entry *e = qc_calib_find(&sm->calib, w->name);
    if (!e)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: calibration file %s has no statistics for '%s' (made for another "
                        "model, or the tensor is not a decoder layer's linear weight); "
                        "recalibrate with `loom calibrate` on this model, or add it to "
                        "quantizer.skip",
                        who, sm->path, w->name);
    if (e->cols != cols)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: '%s' has %lld input channels but calibration file %s records %lld "
                        "for it: the file was made for another model; recalibrate with `loom "
                        "calibrate` on this one",
                        who, w->name, (long long)cols, sm->path, (long long)e->cols);
    if (sm->n == sm->cap) {
        int32_t cap = sm->cap ? 2 * sm->cap : 64;
        qc_smooth_vec *p = h->alloc(h->ctx, (size_t)cap * sizeof *p);
        if (!p) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", who);
        if (sm->n) memcpy(p, sm->v, (size_t)sm->n * sizeof *p);
        h->free(h->ctx, sm->v);
        sm->v = p;
        sm->cap = cap;
    }
    float *f[4] = {NULL}, *v = h->alloc(h->ctx, (size_t)cols * sizeof(float));
    int64_t rows[4];
    int n = 0;
    loom_status st = LOOM_OK;
    if (!v) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", who);
    /* max |W_j| over the rows of every weight of the group the model has */
    for (int i = 0; i < nm && st == LOOM_OK; i++) {
        const loom_tensor *t = !strcmp(members[i], w->name) ? w
                               : model && model->get        ? model->get(model->ctx, members[i])
                                                            : NULL;
        if (!t || !qc_is_linear(t) || t->shape[1] != cols) continue;
        if ((st = qc_read_f32(h, who, t, &f[n], err)) == LOOM_OK) rows[n++] = t->shape[0];
    }
    if (st == LOOM_OK) {
        qc_smooth_factors(e->amax, (const float *const *)f, rows, n, cols, sm->alpha, v);
        qc_smooth_vec *sv = &sm->v[sm->n++];
        snprintf(sv->key, sizeof sv->key, "%s", members[0]);
        sv->cols = cols;
        sv->s = v;
        *s = v;
        v = NULL;
    }
    for (int i = 0; i < n; i++) h->free(h->ctx, f[i]);
    h->free(h->ctx, v);
    return st;
}

void qc_smooth_attach(float *w, int64_t rows, int64_t cols, const float *s, loom_qtensor *out) {
    /* W diag(s): the backend divides x by s (loom/quant.h) */
    qc_smooth_apply(w, rows, cols, s);
    out->smooth = (loom_tensor){.struct_size = sizeof(loom_tensor), .dtype = LOOM_DTYPE_F32,
                                .ndim = 1, .shape = {cols}, .data = (void *)s,
                                .nbytes = (size_t)cols * sizeof(float),
                                .device = LOOM_DEVICE_HOST};
}

loom_status qc_quantize_8bit(const loom_host *h, const char *who, const loom_tensor *w,
                             const float *s, loom_qformat format, bool per_channel,
                             loom_qtensor *out, loom_error *err) {
    float *f = NULL;
    loom_status st = qc_read_f32(h, who, w, &f, err);
    if (st != LOOM_OK) return st;
    const bool fp8 = format == LOOM_QFMT_FP8_W8A8;
    const bool pc = fp8 ? per_channel : true;
    int64_t rows = w->shape[0], cols = w->shape[1], nscales = pc ? rows : 1;
    st = qc_qtensor_alloc(h, who, w->name, format, rows, cols, 0,
                          fp8 ? LOOM_DTYPE_FP8_E4M3 : LOOM_DTYPE_I8, cols,
                          (size_t)rows * (size_t)cols, nscales, 0, false, out, err);
    if (st == LOOM_OK) {
        if (s) qc_smooth_attach(f, rows, cols, s, out); /* W diag(s); x / s in the backend */
        if (fp8) qc_fp8_rows(h, f, rows, cols, pc, out->data.data, out->scales.data);
        else qc_int8_rows(h, f, rows, cols, out->data.data, out->scales.data);
        if (h->metric_add) {
            h->metric_add(h->ctx, fp8 ? "quant.fp8.tensors" : "quant.int8.tensors", 1);
            h->metric_add(h->ctx, fp8 ? "quant.fp8.bytes" : "quant.int8.bytes",
                          (double)(rows * cols + nscales * 4));
        }
    }
    h->free(h->ctx, f);
    return st;
}
