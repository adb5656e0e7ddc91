/*
 * plugins/quantizer/int4/int4.c — loom-quantizer-int4.so: the "int4"
 * quantizer component (W4A16, group-wise asymmetric).
 *
 * Where the 4-bit weights come from (`source`):
 *   quantize  round-to-nearest from the float weights: per row and group of
 *             `group_size` inputs a scale and an f32 zero (w = (q - zero) *
 *             scale), the group's range chosen among a few clipped copies
 *             of [min, max] by squared error (see qc_int4_rows);
 *   gguf      GGUF Q4_0 / Q4_1 / Q5_0 / Q4_K / Q5_K / Q8_0 / Q6_K tensors kept exactly as
 *             stored (plan LOOM_QFMT_GGUF; nothing is dequantized at load);
 *   awq, gptq, gptq_v2
 *             a packed checkpoint's <name>.qweight / .qzeros / .scales /
 *             .g_idx unpacked into loom INT4 bit for bit (awq_gptq.c).
 *             GPTQ act-order tensors (non-monotonic g_idx) have no exact
 *             contiguous-group form: `act_order: int8` keeps their exact
 *             float weights as int8 per-channel (W8A16), `error` refuses.
 * The backend's kernel unpacks nibbles and applies the group scale and zero
 * inside its GEMV/GEMM. The KV cache stays the backend's default.
 */
#include <stdio.h>
#include <string.h>

#include "../common/qcommon.h"
#include "awq_gptq.h"
#include "loom/quant.h"

#define INT4_WHO "quantizer int4"

enum { INT4_SRC_QUANTIZE = 0, INT4_SRC_GGUF = 1, INT4_SRC_AWQ = 2, INT4_SRC_GPTQ = 3,
       INT4_SRC_GPTQ_V2 = 4 };
enum { INT4_ACT_ORDER_INT8 = 0, INT4_ACT_ORDER_ERROR = 1 };

/* Filled by the host from int4_params. */
typedef struct int4_config {
    int64_t group_size;                /* inputs per group                      */
    int64_t source;                    /* INT4_SRC_*                            */
    char skip[LOOM_PARAM_STRING_MAX];  /* patterns kept unquantized             */
    int64_t act_order;                 /* INT4_ACT_ORDER_*                      */
} int4_config;

typedef struct int4_quant {
    const loom_host *host;             /* borrowed until destroy                */
    int4_config cfg;
    const void *checked;               /* the model whose names the patterns matched */
} int4_quant;

static const char *const int4_source_choices[] = {"quantize", "gguf", "awq", "gptq", "gptq_v2",
                                                  NULL};
static const char *const int4_act_order_choices[] = {"int8", "error", NULL};

static const loom_param int4_params[] = {
    {.key = "group_size", .type = LOOM_PARAM_INT, .offset = offsetof(int4_config, group_size),
     .default_value = "128", .min = 2, .max = QC_INT4_MAX_GROUP,
     .doc = "input elements per scale/zero group (even; must divide every quantized weight's "
            "input dimension); awq/gptq: must equal the checkpoint's"},
    {.key = "source", .type = LOOM_PARAM_ENUM, .offset = offsetof(int4_config, source),
     .default_value = "quantize", .min = 1, .max = 0, .choices = int4_source_choices,
     .doc = "quantize: RTN from float weights; gguf: keep GGUF q4_0/q4_1/q4_k/q8_0/q6_k as "
            "stored; awq / gptq / gptq_v2: unpack a packed checkpoint"},
    QC_SKIP_PARAM(int4_config),
    {.key = "act_order", .type = LOOM_PARAM_ENUM, .offset = offsetof(int4_config, act_order),
     .default_value = "int8", .min = 1, .max = 0, .choices = int4_act_order_choices,
     .doc = "GPTQ act-order (desc_act) tensors: int8 = keep them as exact int8 W8A16, error = "
            "refuse"},
    {.key = NULL},
};

/* ---------------------------------------------------------------- helpers */

/* Largest even divisor of n that is <= g (0 if none), preferring powers of
 * two when `pow2`. */
static int64_t int4_divisor(int64_t n, int64_t g, bool pow2) {
    for (int64_t d = g; d >= 2; d--)
        if (n % d == 0 && d % 2 == 0 && (!pow2 || (d & (d - 1)) == 0)) return d;
    return 0;
}

/* The packed tensors of `w` (a .weight name) in the model view. */
static void int4_packed_of(const loom_model_view *m, const loom_tensor *w, i4_packing packing,
                           i4_packed *p) {
    static const char *const sfx[4] = {".qweight", ".qzeros", ".scales", ".g_idx"};
    const loom_tensor *t[4] = {NULL};
    char nm[256];
    for (int i = 0; i < 4; i++)
        if (qc_sibling_name(w->name, sfx[i], nm, sizeof nm)) t[i] = m->get(m->ctx, nm);
    *p = (i4_packed){.packing = packing, .n = w->shape[0], .k = w->shape[1], .qweight = t[0],
                     .qzeros = t[1], .scales = t[2], .g_idx = t[3]};
}

static i4_packing int4_packing(int64_t source) {
    return source == INT4_SRC_AWQ    ? I4_PACK_AWQ
           : source == INT4_SRC_GPTQ ? I4_PACK_GPTQ
                                     : I4_PACK_GPTQ_V2;
}

/* ---------------------------------------------------------------- lifetime */

static loom_status int4_create(const loom_host *host, const void *config, void **self,
                               loom_error *err) {
    *self = NULL;
    int4_config cfg = {.group_size = 128, .source = INT4_SRC_QUANTIZE, .skip = "token_embd,output"};
    if (config) memcpy(&cfg, config, sizeof cfg);
    cfg.skip[sizeof cfg.skip - 1] = 0;
    if (cfg.source < 0 || cfg.source > 4 || cfg.act_order < 0 || cfg.act_order > 1)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: bad config (source %lld in [0, 4], act_order %lld in [0, 1])",
                           INT4_WHO, (long long)cfg.source, (long long)cfg.act_order);
    if (cfg.group_size < 2 || cfg.group_size > QC_INT4_MAX_GROUP || cfg.group_size % 2)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: group_size %lld must be even and in [2, %d]; common choices are "
                           "32, 64 and 128",
                           INT4_WHO, (long long)cfg.group_size, QC_INT4_MAX_GROUP);
    loom_status st = qc_skip_check(host, INT4_WHO, cfg.skip, err);
    if (st != LOOM_OK) return st;
    int4_quant *q = host->calloc(host->ctx, 1, sizeof *q);
    if (!q) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", INT4_WHO);
    q->host = host;
    q->cfg = cfg;
    *self = q;
    return LOOM_OK;
}

static void int4_destroy(void *self) {
    int4_quant *q = self;
    if (q) q->host->free(q->host->ctx, q);
}

/* -------------------------------------------------------------------- plan */

static loom_status int4_plan_packed(int4_quant *q, const loom_model_view *model,
                                    const loom_tensor *w, loom_quant_plan *out, loom_error *err) {
    const loom_host *h = q->host;
    const char *src = int4_source_choices[q->cfg.source];
    if (!qc_packed_sibling(model, w))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: source %s, but tensor '%s' has no packed '%.*s.qweight' next to it: "
                        "the checkpoint is not %s-packed (or its loader does not expose packed "
                        "tensors); use source: quantize for float checkpoints",
                        INT4_WHO, src, w->name, (int)strlen(w->name) - 7, w->name, src);
    i4_packed p;
    int4_packed_of(model, w, int4_packing(q->cfg.source), &p);
    loom_status st = i4_packed_check(h, INT4_WHO, w->name, &p, err);
    if (st) return st;
    if (p.group_size != q->cfg.group_size)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' is packed in groups of %d inputs (scales has %lld rows "
                        "for %lld inputs), but group_size is %lld; set quantizer.group_size: %d",
                        INT4_WHO, w->name, p.group_size, (long long)(p.k / p.group_size),
                        (long long)p.k, (long long)q->cfg.group_size, p.group_size);
    if (i4_gidx_trivial(&p)) {
        out->format = LOOM_QFMT_INT4_W4A16;
        out->group_size = p.group_size;
        return LOOM_OK;
    }
    if (q->cfg.act_order == INT4_ACT_ORDER_ERROR)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "%s: tensor '%s' is GPTQ act-order (g_idx is not input / %d): loom's INT4 "
                        "layout needs contiguous groups. Set quantizer.act_order: int8 to keep it "
                        "as exact int8, or use a checkpoint made with desc_act=False",
                        INT4_WHO, w->name, p.group_size);
    out->format = LOOM_QFMT_INT8_W8A16;
    out->group_size = 0;
    return LOOM_OK;
}

static loom_status int4_plan(void *self, const loom_model_view *model, const loom_tensor *w,
                             loom_quant_plan *out, loom_error *err) {
    int4_quant *q = self;
    const loom_host *h = q->host;
    *out = (loom_quant_plan){.struct_size = sizeof *out, .format = LOOM_QFMT_NONE};
    /* no pattern may match nothing (checked once per model) */
    loom_status st = qc_check_patterns_once(&q->checked, h, INT4_WHO, model, q->cfg.skip, NULL, err);
    if (st) return st;
    if (!qc_is_linear(w) || qc_name_matches(w->name, q->cfg.skip)) return LOOM_OK;
    const int64_t cols = w->shape[1], g = q->cfg.group_size;
    switch (q->cfg.source) {
    case INT4_SRC_GGUF:
        if (qc_packed_sibling(model, w))
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "%s: source gguf, but tensor '%s' is a packed AWQ/GPTQ checkpoint; "
                            "set quantizer.source: awq or gptq",
                            INT4_WHO, w->name);
        switch (w->dtype) {
        case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q4_1: case LOOM_DTYPE_Q5_0: case LOOM_DTYPE_Q4_K:
        case LOOM_DTYPE_Q5_K: case LOOM_DTYPE_Q8_0: case LOOM_DTYPE_Q6_K:
            if (h->dtype_row_bytes(w->dtype, cols) == 0)
                return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                                "%s: tensor '%s' (%s) has %lld columns, not whole %lld-element "
                                "blocks; the file is damaged",
                                INT4_WHO, w->name, h->dtype_name(w->dtype), (long long)cols,
                                (long long)h->dtype_block_elems(w->dtype));
            out->format = LOOM_QFMT_GGUF;
            return LOOM_OK;
        default:
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "%s: source gguf keeps GGUF q4_0/q4_1/q5_0/q4_k/q5_k/q8_0/q6_k tensors as "
                            "stored, but tensor '%s' is %s; use source: quantize, or add it to "
                            "skip (e.g. skip: \"token_embd,output,%s\")",
                            INT4_WHO, w->name, h->dtype_name(w->dtype), w->name);
        }
    case INT4_SRC_AWQ: case INT4_SRC_GPTQ: case INT4_SRC_GPTQ_V2:
        return int4_plan_packed(q, model, w, out, err);
    default:
        break;
    }
    /* source quantize */
    if (qc_packed_sibling(model, w))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' is stored as a packed 4-bit AWQ/GPTQ checkpoint; set "
                        "quantizer.source: awq (or gptq) to load it as it is",
                        INT4_WHO, w->name);
    if (cols % g != 0) {
        int64_t d2 = int4_divisor(cols, g, true), d = int4_divisor(cols, g, false);
        char hint[96] = "";
        if (d2 && d != d2) snprintf(hint, sizeof hint, " such as %lld or %lld", (long long)d2,
                                    (long long)d);
        else if (d) snprintf(hint, sizeof hint, " such as %lld", (long long)d);
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' has %lld input columns, not a multiple of group_size "
                        "%lld; set quantizer.group_size to an even divisor of %lld%s, or add the "
                        "tensor to skip",
                        INT4_WHO, w->name, (long long)cols, (long long)g, (long long)cols, hint);
    }
    if (h->dtype_row_bytes(w->dtype, cols) == 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: tensor '%s' has %lld columns, not whole %s blocks", INT4_WHO,
                        w->name, (long long)cols, h->dtype_name(w->dtype));
    out->format = LOOM_QFMT_INT4_W4A16;
    out->group_size = (int32_t)g;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- quantize */

static loom_status int4_quantize(void *self, const loom_model_view *model, const loom_tensor *w,
                                 const loom_quant_plan *plan, loom_qtensor *out,
                                 loom_error *err) {
    int4_quant *q = self;
    const loom_host *h = q->host;
    const char *nm = w && w->name ? w->name : "?";
    bool packed = q->cfg.source >= INT4_SRC_AWQ;
    if (!plan || !w || w->ndim != 2 ||
        !(plan->format == LOOM_QFMT_INT4_W4A16 || (packed && plan->format == LOOM_QFMT_INT8_W8A16)))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: quantize('%s') with plan format %d; int4 makes INT4_W4A16 (4) and, "
                        "for act-order GPTQ, INT8_W8A16 (1)",
                        INT4_WHO, nm, plan ? (int)plan->format : -1);
    const int64_t rows = w->shape[0], cols = w->shape[1];
    loom_status st;
    if (plan->format == LOOM_QFMT_INT8_W8A16) {
        /* act-order GPTQ: exact floats, then int8 per channel */
        i4_packed p;
        int4_packed_of(model, w, int4_packing(q->cfg.source), &p);
        if ((st = i4_packed_check(h, INT4_WHO, nm, &p, err))) return st;
        float *f = h->alloc(h->ctx, (size_t)(rows * cols) * sizeof(float));
        if (!f) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory for '%s'", INT4_WHO, nm);
        st = i4_unpack_f32(h, INT4_WHO, nm, &p, f, err);
        if (st == LOOM_OK)
            st = qc_qtensor_alloc(h, INT4_WHO, nm, LOOM_QFMT_INT8_W8A16, rows, cols, 0,
                                  LOOM_DTYPE_I8, cols, (size_t)(rows * cols), rows, 0, false, out,
                                  err);
        if (st == LOOM_OK) qc_int8_rows(h, f, rows, cols, out->data.data, out->scales.data);
        h->free(h->ctx, f);
        if (st == LOOM_OK)
            h->log(h->ctx, LOOM_LOG_INFO, INT4_WHO, "'%s': act-order GPTQ kept as int8 W8A16", nm);
        return st;
    }
    int32_t g = plan->group_size;
    if (g < 2 || g % 2 || g > QC_INT4_MAX_GROUP || cols % g)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: quantize('%s'): plan group_size %d does not divide %lld columns into "
                        "even groups",
                        INT4_WHO, nm, g, (long long)cols);
    int64_t ng = cols / g;
    st = qc_qtensor_alloc(h, INT4_WHO, nm, LOOM_QFMT_INT4_W4A16, rows, cols, g, LOOM_DTYPE_U8,
                          cols / 2, (size_t)(rows * (cols / 2)), rows, ng, true, out, err);
    if (st) return st;
    if (packed) {
        i4_packed p;
        int4_packed_of(model, w, int4_packing(q->cfg.source), &p);
        if ((st = i4_packed_check(h, INT4_WHO, nm, &p, err)) ||
            (st = i4_unpack(h, INT4_WHO, nm, &p, out->data.data, out->scales.data,
                            out->zeros.data, err)))
            goto fail;
    } else {
        float *f = NULL;
        if ((st = qc_read_f32(h, INT4_WHO, w, &f, err))) goto fail;
        qc_int4_rows(h, f, rows, cols, g, out->data.data, out->scales.data, out->zeros.data);
        h->free(h->ctx, f);
    }
    if (h->metric_add) {
        h->metric_add(h->ctx, "quant.int4.tensors", 1);
        h->metric_add(h->ctx, "quant.int4.bytes", (double)(rows * (cols / 2) + rows * ng * 8));
    }
    return LOOM_OK;
fail:
    qc_release(h, out);
    return st;
}

static void int4_release(void *self, loom_qtensor *t) {
    int4_quant *q = self;
    qc_release(q->host, t);
}

static loom_dtype int4_kv_dtype(void *self) {
    (void)self;
    return LOOM_DTYPE_COUNT;
}

/* A packed checkpoint runs through this instance only when `source` names
 * its very packing and group_size is the checkpoint's. */
static loom_status int4_accepts_packing(void *self, const loom_model_view *model, loom_error *err) {
    int4_quant *q = self;
    const loom_host *h = q->host;
    const loom_model_packing *pk = model ? model->packing : NULL;
    if (!pk) return LOOM_OK;
    const char *have = int4_source_choices[q->cfg.source];
    char want[128];
    snprintf(want, sizeof want, "quantizer: {plugin: int4, source: %s, group_size: %d}", pk->method,
             pk->group_size);
    if (q->cfg.source != INT4_SRC_AWQ && q->cfg.source != INT4_SRC_GPTQ && q->cfg.source != INT4_SRC_GPTQ_V2)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "quantizer.source is %s, but model '%s' is a packed 4-bit %s checkpoint (%s); use %s", have,
                        model->config->name, pk->method, pk->source, want);
    if (strcmp(have, pk->method) != 0) {
        bool gptq_pair = !strncmp(have, "gptq", 4) && !strncmp(pk->method, "gptq", 4);
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "quantizer.source is %s, but model '%s' is a packed 4-bit %s checkpoint (%s)%s; use %s", have,
                        model->config->name, pk->method, pk->source,
                        gptq_pair ? " (gptq v1 stores each zero point minus 1, gptq_v2 the zero point itself)" : "",
                        want);
    }
    if (q->cfg.group_size != pk->group_size)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "quantizer.group_size is %lld, but model '%s' was packed in groups of %d (%s); use %s",
                        (long long)q->cfg.group_size, model->config->name, pk->group_size, pk->source, want);
    return LOOM_OK;
}

static const loom_quant_ops int4_ops = {
    .struct_size = sizeof(loom_quant_ops),
    .create = int4_create,
    .destroy = int4_destroy,
    .plan = int4_plan,
    .quantize = int4_quantize,
    .release = int4_release,
    .kv_dtype = int4_kv_dtype,
    .accepts_packing = int4_accepts_packing,
};

static const loom_component int4_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_QUANTIZER,
    .name = "int4",
    .summary = "4-bit group-wise W4A16: RTN from floats, GGUF q4 blocks as stored, AWQ / GPTQ",
    .ops = &int4_ops,
    .params = int4_params,
    .config_size = sizeof(int4_config),
}};

static const loom_plugin_desc int4_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-quantizer-int4",
    .version = "0.1.0",
    .num_components = 1,
    .components = int4_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &int4_desc; }
