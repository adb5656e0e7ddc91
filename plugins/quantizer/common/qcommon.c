/*
 * plugins/quantizer/common/qcommon.c — see qcommon.h: tensor rules, float
 * input, quantized-tensor storage and the arithmetic of each scheme.
 *
 * The arithmetic is plain C on the engine thread at load time; it runs once
 * per weight, so clarity wins over speed (SmolLM2's 106 M linear weights
 * quantize in a few seconds on one core).
 */
#include "qcommon.h"

#include <fnmatch.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define QC_ALIGN 64 /* bytes: every piece of a qtensor starts on a cache line */

/* ------------------------------------------------------------ rules */

/* One plain pattern (no wildcards) of length n against name: some
 * occurrence bounded by the start/end of the name or by dots. */
static bool qc_match_components(const char *name, const char *pat, size_t n) {
    size_t len = strlen(name);
    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(name + i, pat, n) != 0) continue;
        bool left = i == 0 || name[i - 1] == '.';
        bool right = i + n == len || name[i + n] == '.';
        if (left && right) return true;
    }
    return false;
}

/* Call fn on each trimmed, non-empty pattern of list; stops when fn
 * returns true and returns true then. */
static bool qc_each_pattern(const char *list, bool (*fn)(void *, const char *, size_t),
                            void *ctx) {
    if (!list) return false;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *s = p;
        while (*p && *p != ',') p++;
        const char *e = p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
        if (e > s && fn(ctx, s, (size_t)(e - s))) return true;
    }
    return false;
}

static bool qc_match_one(void *ctx, const char *pat, size_t n) {
    const char *name = ctx;
    if (memchr(pat, '*', n) || memchr(pat, '?', n) || memchr(pat, '[', n)) {
        char buf[LOOM_PARAM_STRING_MAX];
        if (n >= sizeof buf) return false;
        memcpy(buf, pat, n);
        buf[n] = 0;
        return fnmatch(buf, name, 0) == 0;
    }
    return qc_match_components(name, pat, n);
}

bool qc_name_matches(const char *name, const char *list) {
    if (!name) return false;
    return qc_each_pattern(list, qc_match_one, (void *)name);
}

typedef struct qc_bad {
    char *out;
    size_t size;
} qc_bad;

static bool qc_find_bad(void *ctx, const char *pat, size_t n) {
    qc_bad *b = ctx;
    bool bad = pat[0] == '.' || pat[n - 1] == '.';
    for (size_t i = 0; !bad && i < n; i++)
        bad = pat[i] == ' ' || pat[i] == '\t' || (i > 0 && pat[i] == '.' && pat[i - 1] == '.');
    if (bad) snprintf(b->out, b->size, "%.*s", (int)n, pat);
    return bad;
}

bool qc_patterns_valid(const char *list, char *bad, size_t size) {
    qc_bad b = {bad, size};
    return !qc_each_pattern(list, qc_find_bad, &b);
}

loom_status qc_skip_check(const loom_host *h, const char *who, const char *skip, loom_error *err) {
    char bad[LOOM_PARAM_STRING_MAX];
    if (qc_patterns_valid(skip, bad, sizeof bad)) return LOOM_OK;
    return h->error(h->ctx, err, LOOM_ERR_INVALID,
                    "%s: skip pattern '%s' is malformed (no spaces, no empty dot "
                    "components); e.g. skip: \"token_embd,output,blk.0\"",
                    who, bad);
}

typedef struct qc_unmatched {
    const loom_model_view *m;
    char *out;
    size_t size;
} qc_unmatched;

static bool qc_find_unmatched(void *ctx, const char *pat, size_t n) {
    qc_unmatched *u = ctx;
    char one[LOOM_PARAM_STRING_MAX];
    if (n >= sizeof one) return false; /* cannot be a real pattern: qc_patterns_valid's business */
    memcpy(one, pat, n);
    one[n] = 0;
    if (!strcmp(one, "output") || !strcmp(one, "token_embd")) return false; /* the default skip */
    const int32_t count = u->m->count(u->m->ctx);
    for (int32_t i = 0; i < count; i++) {
        const loom_tensor *t = u->m->at(u->m->ctx, i);
        if (t && qc_name_matches(t->name, one)) return false;
    }
    snprintf(u->out, u->size, "%s", one);
    return true;
}

bool qc_patterns_match_model(const loom_model_view *m, const char *list, char *bad, size_t size) {
    if (!m || !m->count || !m->at) return true;
    qc_unmatched u = {m, bad, size};
    return !qc_each_pattern(list, qc_find_unmatched, &u);
}

loom_status qc_check_patterns(const loom_host *h, const char *who, const char *param, const char *list,
                              const loom_model_view *m, loom_error *err) {
    char bad[LOOM_PARAM_STRING_MAX];
    if (qc_patterns_match_model(m, list, bad, sizeof bad)) return LOOM_OK;
    /* what the names look like: the first and the last linear weight */
    const char *first = NULL, *last = NULL;
    const int32_t count = m->count(m->ctx);
    for (int32_t i = 0; i < count; i++) {
        const loom_tensor *t = m->at(m->ctx, i);
        if (!qc_is_linear(t)) continue;
        if (!first) first = t->name;
        last = t->name;
    }
    return h->error(h->ctx, err, LOOM_ERR_INVALID,
                    "%s: %s pattern '%s' matches no tensor of this model (its linear weights are "
                    "named like '%s' ... '%s'); patterns are whole dot components such as ffn_down or "
                    "blk.3, or globs such as 'blk.1?.ffn_*': fix the pattern or remove it",
                    who, param, bad, first ? first : "?", last ? last : "?");
}

loom_status qc_check_patterns_once(const void **checked, const loom_host *h, const char *who,
                                   const loom_model_view *m, const char *skip, const char *weight_only,
                                   loom_error *err) {
    if (!m || __atomic_load_n(checked, __ATOMIC_ACQUIRE) == m->ctx) return LOOM_OK;
    loom_status st = qc_check_patterns(h, who, "skip", skip, m, err);
    if (!st && weight_only) st = qc_check_patterns(h, who, "weight_only", weight_only, m, err);
    if (!st) __atomic_store_n(checked, m->ctx, __ATOMIC_RELEASE);
    return st;
}

bool qc_is_linear(const loom_tensor *w) {
    if (!w || w->ndim != 2 || !w->name) return false;
    size_t n = strlen(w->name);
    return n > 7 && !strcmp(w->name + n - 7, ".weight");
}

bool qc_sibling_name(const char *name, const char *suffix, char *out, size_t size) {
    if (!name) return false;
    size_t n = strlen(name);
    if (n <= 7 || strcmp(name + n - 7, ".weight") != 0) return false;
    int k = snprintf(out, size, "%.*s%s", (int)(n - 7), name, suffix);
    return k > 0 && (size_t)k < size;
}

const loom_tensor *qc_packed_sibling(const loom_model_view *m, const loom_tensor *w) {
    char nm[256];
    if (!m || !m->get || !w || !qc_sibling_name(w->name, ".qweight", nm, sizeof nm)) return NULL;
    return m->get(m->ctx, nm);
}

bool qc_plan_float_linear(const loom_host *h, const char *who, const char *scheme, const loom_model_view *m,
                          const loom_tensor *w, const char *skip, loom_status *st, loom_error *err) {
    *st = LOOM_OK;
    if (!qc_is_linear(w) || qc_name_matches(w->name, skip)) return false;
    if (qc_packed_sibling(m, w))
        *st = h->error(h->ctx, err, LOOM_ERR_INVALID,
                       "%s: tensor '%s' is stored as a packed 4-bit AWQ/GPTQ checkpoint "
                       "(qweight/qzeros/scales); %s quantizes float weights. Use "
                       "`quantizer: {plugin: int4, source: awq}` (or gptq), or a float "
                       "checkpoint",
                       who, w->name, scheme);
    else if (h->dtype_row_bytes(w->dtype, w->shape[1]) == 0)
        *st = h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: tensor '%s' has %lld columns, not whole %s blocks",
                       who, w->name, (long long)w->shape[1], h->dtype_name(w->dtype));
    return *st == LOOM_OK;
}

/* ---------------------------------------------------- row parallelism */

static void qc_int8_range(const float *w, int64_t r0, int64_t r1, int64_t cols, int8_t *q, float *scales);
static void qc_fp8_range(const float *w, int64_t r0, int64_t r1, int64_t cols, bool per_channel, float tmax,
                         uint8_t *q, float *scales);
static void qc_int4_range(const float *w, int64_t r0, int64_t r1, int64_t cols, int32_t group, uint8_t *data,
                          float *scales, float *zeros);


/* Rows are independent in every scheme: quantizing an 8B model's weights
 * one thread at a time took minutes at load, so ranges of rows go to the
 * host's worker count of threads (a thread that cannot start runs its range
 * on the caller's). */
typedef struct qc_job {
    int kind; /* 0 int8, 1 fp8, 2 int4, 3 dequantize rows */
    const loom_host *h;
    const float *w;
    const uint8_t *src;
    size_t src_row_bytes;
    loom_dtype src_dtype;
    float *dst;
    int64_t r0, r1, cols;
    int32_t group;
    bool per_channel;
    float tmax;
    void *q;
    float *scales, *zeros;
    bool failed;
} qc_job;

static void *qc_job_main(void *arg) {
    qc_job *j = arg;
    switch (j->kind) {
    case 0: qc_int8_range(j->w, j->r0, j->r1, j->cols, j->q, j->scales); break;
    case 1: qc_fp8_range(j->w, j->r0, j->r1, j->cols, j->per_channel, j->tmax, j->q, j->scales); break;
    case 2: qc_int4_range(j->w, j->r0, j->r1, j->cols, j->group, j->q, j->scales, j->zeros); break;
    default:
        for (int64_t r = j->r0; r < j->r1 && !j->failed; r++)
            j->failed = j->h->convert(LOOM_DTYPE_F32, j->dst + r * j->cols, j->src_dtype,
                                      j->src + (size_t)r * j->src_row_bytes, j->cols) != LOOM_OK;
    }
    return NULL;
}

#define QC_MAX_THREADS 64

/* Run `proto` over rows [0, rows) split across threads; false when a
 * dequantizing job failed. */
static bool qc_par(const loom_host *h, qc_job proto, int64_t rows) {
    int nt = h && h->num_threads ? (int)h->num_threads(h->ctx) : 1;
    if (nt > QC_MAX_THREADS) nt = QC_MAX_THREADS;
    if ((int64_t)nt > rows / 8) nt = (int)(rows / 8);
    if (nt < 1) nt = 1;
    qc_job jobs[QC_MAX_THREADS];
    pthread_t tid[QC_MAX_THREADS];
    bool started[QC_MAX_THREADS] = {false};
    for (int i = 0; i < nt; i++) {
        jobs[i] = proto;
        jobs[i].r0 = rows * i / nt, jobs[i].r1 = rows * (i + 1) / nt;
        if (i > 0) started[i] = pthread_create(&tid[i], NULL, qc_job_main, &jobs[i]) == 0;
    }
    qc_job_main(&jobs[0]);
    bool ok = !jobs[0].failed;
    for (int i = 1; i < nt; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        else qc_job_main(&jobs[i]);
        ok = ok && !jobs[i].failed;
    }
    return ok;
}

/* ------------------------------------------------------- float input */

loom_status qc_read_f32(const loom_host *h, const char *who, const loom_tensor *w, float **out,
                        loom_error *err) {
    *out = NULL;
    const char *nm = w && w->name ? w->name : "(unnamed)";
    if (!w || w->ndim != 2 || w->shape[0] <= 0 || w->shape[1] <= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' is not a 2-D (out, in) weight", who, nm);
    int64_t rows = w->shape[0], cols = w->shape[1];
    size_t rb = h->dtype_row_bytes(w->dtype, cols);
    if (w->device != LOOM_DEVICE_HOST || !w->data || rb == 0 || w->nbytes < rb * (size_t)rows)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' (%s, %lld x %lld, %zu bytes) is not readable host data "
                        "of %lld rows x %zu bytes",
                        who, nm, h->dtype_name(w->dtype), (long long)rows, (long long)cols,
                        w->nbytes, (long long)rows, rb);
    float *f = h->alloc(h->ctx, (size_t)rows * (size_t)cols * sizeof(float));
    if (!f)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "%s: out of memory for %.1f MiB of float32 copy of '%s'", who,
                        (double)rows * (double)cols * 4.0 / (1 << 20), nm);
    if (!qc_par(h, (qc_job){.kind = 3, .h = h, .src = w->data, .src_row_bytes = rb, .src_dtype = w->dtype,
                            .dst = f, .cols = cols},
                rows)) {
            h->free(h->ctx, f);
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "%s: cannot read tensor '%s' of type %s as float32 (the host's "
                            "dequantizer does not handle it); add it to `skip`",
                            who, nm, h->dtype_name(w->dtype));
        }
    *out = f;
    return LOOM_OK;
}

/* ---------------------------------------------------- qtensor storage */

static size_t qc_round(size_t n) { return (n + QC_ALIGN - 1) & ~(size_t)(QC_ALIGN - 1); }

static loom_tensor qc_view(loom_dtype dt, int64_t d0, int64_t d1, void *data, size_t bytes,
                           const char *name) {
    loom_tensor t = {.struct_size = sizeof(loom_tensor), .dtype = dt, .ndim = d1 > 0 ? 2 : 1,
                     .data = data, .nbytes = bytes, .device = LOOM_DEVICE_HOST, .name = name};
    t.shape[0] = d0;
    if (d1 > 0) t.shape[1] = d1;
    return t;
}

loom_status qc_qtensor_alloc(const loom_host *h, const char *who, const char *name,
                             loom_qformat format, int64_t rows, int64_t cols, int32_t group_size,
                             loom_dtype data_dtype, int64_t data_cols, size_t data_bytes,
                             int64_t scale_rows, int64_t scale_cols, bool with_zeros,
                             loom_qtensor *out, loom_error *err) {
    size_t nsc = (size_t)scale_rows * (size_t)(scale_cols > 0 ? scale_cols : 1);
    size_t sb = nsc * sizeof(float);
    size_t total = QC_ALIGN + qc_round(data_bytes) + qc_round(sb) + (with_zeros ? qc_round(sb) : 0);
    void *block = h->alloc(h->ctx, total);
    if (!block)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "%s: out of memory for %.1f MiB of quantized '%s'", who,
                        (double)total / (1 << 20), name ? name : "?");
    uint8_t *base = (uint8_t *)(((uintptr_t)block + QC_ALIGN - 1) & ~(uintptr_t)(QC_ALIGN - 1));
    uint8_t *d = base, *s = d + qc_round(data_bytes), *z = s + qc_round(sb);
    memset(d, 0, data_bytes);
    *out = (loom_qtensor){.struct_size = sizeof(loom_qtensor), .format = format, .rows = rows,
                          .cols = cols, .group_size = group_size, .owner = block};
    out->data = qc_view(data_dtype, rows, data_cols, d, data_bytes, name);
    out->scales = qc_view(LOOM_DTYPE_F32, scale_rows, scale_cols, s, sb, NULL);
    if (with_zeros) out->zeros = qc_view(LOOM_DTYPE_F32, scale_rows, scale_cols, z, sb, NULL);
    return LOOM_OK;
}

void qc_release(const loom_host *h, loom_qtensor *q) {
    if (!q) return;
    if (q->owner) h->free(h->ctx, q->owner);
    uint32_t ss = q->struct_size;
    memset(q, 0, sizeof *q);
    q->struct_size = ss;
}

/* -------------------------------------------------------- schemes */

static void qc_int8_range(const float *w, int64_t r0, int64_t r1, int64_t cols, int8_t *q, float *scales) {
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = w + r * cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(wr[c]));
        float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        scales[r] = s;
        for (int64_t c = 0; c < cols; c++) {
            float v = rintf(wr[c] * inv);
            q[r * cols + c] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
}

static void qc_fp8_range(const float *w, int64_t r0, int64_t r1, int64_t cols, bool per_channel, float tmax,
                         uint8_t *q, float *scales) {
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = w + r * cols;
        float amax = tmax;
        if (per_channel) {
            amax = 0.0f;
            for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(wr[c]));
            scales[r] = amax / QC_FP8_MAX;
        }
        /* divide by the scale, not multiply by a rounded reciprocal, so that
         * the row maximum lands exactly on 448 */
        float s = amax / QC_FP8_MAX;
        for (int64_t c = 0; c < cols; c++)
            q[r * cols + c] = amax > 0.0f ? loom_fp32_to_e4m3(wr[c] / s) : 0;
    }
}

/* The clipped ranges tried per group: [min, max] shrunk about its centre. */
enum { QC_RATIOS = 8 };
static const float qc_ratios[QC_RATIOS] = {1.0f, 0.96f, 0.92f, 0.88f, 0.84f, 0.80f, 0.76f, 0.72f};

/* Quantize one group with each candidate's (scale, zero): element i's codes
 * into q[i][k], squared errors into err[k]. A candidate's operations and the
 * order of its sum are those of one candidate at a time (bit for bit,
 * tests/quant); side by side, the candidates' independent sums overlap
 * instead of each addition waiting on the one before. */
static void qc_int4_try(const float *v, int32_t g, const float *scale, const float *zero,
                        uint8_t (*q)[QC_RATIOS], double *err) {
    float inv[QC_RATIOS];
    double e[QC_RATIOS];
    for (int k = 0; k < QC_RATIOS; k++) inv[k] = scale[k] > 0.0f ? 1.0f / scale[k] : 0.0f, e[k] = 0.0;
    for (int32_t i = 0; i < g; i++)
        for (int k = 0; k < QC_RATIOS; k++) {
            float t = rintf(v[i] * inv[k] + zero[k]);
            /* -0 to +0: the same code and error; NaN (0 * inf where a
             * range below ~4e-38 gives a subnormal scale) to code 0 */
            t = t > 0.0f ? t : 0.0f;
            t = t < 15.0f ? t : 15.0f;
            q[i][k] = (uint8_t)t;
            double d = (double)((t - zero[k]) * scale[k]) - (double)v[i];
            e[k] += d * d;
        }
    for (int k = 0; k < QC_RATIOS; k++) err[k] = e[k];
}

/* Least-squares refit of each candidate's (scale, zero) for its fixed codes
 * q[k]: w ~ s*q + b, zero = -b / s; ok[k] false when the codes are all equal
 * (no fit). Candidates side by side as in qc_int4_try. */
static void qc_int4_refit(const float *v, uint8_t (*q)[QC_RATIOS], int32_t g, float *scale, float *zero,
                          bool *ok) {
    double sq[QC_RATIOS] = {0}, sw = 0, sqq[QC_RATIOS] = {0}, sqw[QC_RATIOS] = {0};
    for (int32_t i = 0; i < g; i++) {
        sw += v[i];
        for (int k = 0; k < QC_RATIOS; k++) {
            sq[k] += q[i][k];
            sqq[k] += (double)q[i][k] * q[i][k];
            sqw[k] += (double)q[i][k] * v[i];
        }
    }
    for (int k = 0; k < QC_RATIOS; k++) {
        double den = g * sqq[k] - sq[k] * sq[k];
        double s = den > 0 ? (g * sqw[k] - sq[k] * sw) / den : 0.0, b = (sw - s * sq[k]) / g;
        ok[k] = den > 0 && s > 0;
        if (ok[k]) scale[k] = (float)s, zero[k] = (float)(-b / s);
    }
}

/* All-zero codes: a constant group's (scale 1, zero -lo is exact), and the
 * pick's when no candidate has a finite error. Element i at [i * QC_RATIOS]. */
static const uint8_t qc_int4_zero_codes[QC_INT4_MAX_GROUP * QC_RATIOS] = {0};

/* One non-constant group [lo, hi]: every candidate range, its refit, and
 * the first of least error in candidate order (the selection stops where
 * the error is zero up to float rounding: the group already is a 4-bit
 * grid, e.g. a GGUF q4_1 block). Returns its codes: element i at
 * [i * QC_RATIOS]; *bs, *bz are left alone when no error is finite. */
static const uint8_t *qc_int4_pick(const float *v, int32_t group, float lo, float hi, double energy,
                                   uint8_t (*c)[QC_INT4_MAX_GROUP][QC_RATIOS], float *bs, float *bz) {
    float s[QC_RATIOS], z[QC_RATIOS], s2[QC_RATIOS], z2[QC_RATIOS];
    double e[QC_RATIOS], e2[QC_RATIOS];
    bool ok[QC_RATIOS];
    const float mid = 0.5f * (lo + hi), half = 0.5f * (hi - lo);
    for (int k = 0; k < QC_RATIOS; k++) {
        const float l = mid - half * qc_ratios[k], h = mid + half * qc_ratios[k];
        s[k] = s2[k] = (h - l) / 15.0f, z[k] = z2[k] = -l / s[k];
    }
    qc_int4_try(v, group, s, z, c[0], e);
    qc_int4_refit(v, c[0], group, s2, z2, ok);
    qc_int4_try(v, group, s2, z2, c[1], e2);
    const uint8_t *best = qc_int4_zero_codes;
    double berr = INFINITY;
    for (int k = 0; k < QC_RATIOS; k++) {
        const bool fit = ok[k] && e2[k] < e[k];
        const double ek = fit ? e2[k] : e[k];
        if (ek < berr) {
            berr = ek, *bs = fit ? s2[k] : s[k], *bz = fit ? z2[k] : z[k];
            best = (const uint8_t *)c[fit] + k;
        }
        if (berr <= 1e-12 * energy) break;
    }
    return best;
}

static void qc_int4_range(const float *w, int64_t r0, int64_t r1, int64_t cols, int32_t group, uint8_t *data,
                          float *scales, float *zeros) {
    int64_t ng = cols / group;
    /* the candidates' codes, first tries and refit tries, element-major so
     * that one element's candidates share a cache line (64 KiB of stack;
     * group <= QC_INT4_MAX_GROUP is checked by callers) */
    uint8_t c[2][QC_INT4_MAX_GROUP][QC_RATIOS];
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t gi = 0; gi < ng; gi++) {
            const float *v = w + r * cols + gi * group;
            float lo = v[0], hi = v[0];
            double energy = 0.0;
            for (int32_t i = 1; i < group; i++) lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
            for (int32_t i = 0; i < group; i++) energy += (double)v[i] * v[i];
            float bs = 1.0f, bz = -lo;
            const uint8_t *best =
                hi == lo ? qc_int4_zero_codes : qc_int4_pick(v, group, lo, hi, energy, c, &bs, &bz);
            scales[r * ng + gi] = bs;
            zeros[r * ng + gi] = bz;
            uint8_t *dst = data + r * (cols / 2) + gi * (group / 2);
            for (int32_t i = 0; i < group; i += 2)
                dst[i / 2] = (uint8_t)(best[i * QC_RATIOS] | (best[(i + 1) * QC_RATIOS] << 4));
        }
    }
}

void qc_int8_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, int8_t *q, float *scales) {
    qc_par(h, (qc_job){.kind = 0, .w = w, .cols = cols, .q = q, .scales = scales}, rows);
}

void qc_fp8_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, bool per_channel, uint8_t *q,
                 float *scales) {
    float tmax = 0.0f;
    if (!per_channel)
        for (int64_t i = 0; i < rows * cols; i++) tmax = fmaxf(tmax, fabsf(w[i]));
    if (!per_channel) scales[0] = tmax / QC_FP8_MAX;
    qc_par(h, (qc_job){.kind = 1, .w = w, .cols = cols, .per_channel = per_channel, .tmax = tmax, .q = q,
                       .scales = scales},
           rows);
}

void qc_int4_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *data,
                  float *scales, float *zeros) {
    qc_par(h, (qc_job){.kind = 2, .w = w, .cols = cols, .group = group, .q = data, .scales = scales,
                       .zeros = zeros},
           rows);
}

void qc_int8_dequant(const int8_t *q, const float *scales, int64_t rows, int64_t cols, float *w) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] = (float)q[r * cols + c] * scales[r];
}

void qc_fp8_dequant(const uint8_t *q, const float *scales, bool per_channel, int64_t rows,
                    int64_t cols, float *w) {
    for (int64_t r = 0; r < rows; r++) {
        float s = per_channel ? scales[r] : scales[0];
        for (int64_t c = 0; c < cols; c++) w[r * cols + c] = loom_e4m3_to_fp32(q[r * cols + c]) * s;
    }
}

void qc_int4_dequant(const uint8_t *data, const float *scales, const float *zeros, int64_t rows,
                     int64_t cols, int32_t group, float *w) {
    int64_t ng = cols / group;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            uint8_t b = data[r * (cols / 2) + c / 2];
            int q = (c & 1) ? b >> 4 : b & 15;
            int64_t g = r * ng + c / group;
            w[r * cols + c] = ((float)q - zeros[g]) * scales[g];
        }
}
