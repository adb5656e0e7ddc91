/*
 * plugins/quantizer/int8/int8.c — loom-quantizer-int8.so: the "int8"
 * quantizer component.
 *
 * Every linear weight not kept by `skip` becomes int8 with one symmetric
 * f32 scale per output channel (w = q * scale[row], q in [-127, 127]):
 *   mode w8a16: activations stay in the backend's float type; the backend's
 *               kernel fuses the dequantization into its GEMV/GEMM;
 *   mode w8a8:  activations are quantized per token at run time (dynamic,
 *               symmetric int8) and the product accumulates in int32.
 * The KV cache stays the backend's default unless `kv_cache` says f16/fp8.
 *
 * SmoothQuant (mode w8a8, smoothquant = alpha > 0, calibration = a file
 * from `loom calibrate`, format in ../common/qcalib.h): for the input shared
 * by a group of weights (Q K V; gate up; O; down) the factors
 *   s[j] = max|X_j|^alpha / max|W_j|^(1 - alpha)
 * (W_j: column j of every weight of the group) are computed once and kept
 * until destroy (../common/qsmooth.h, shared with fp8); each weight is
 * quantized as W diag(s), and its qtensor's `smooth` points at s, so the
 * backend divides the activations by s before quantizing them
 * (loom/quant.h). The parts of a fused group share one vector (the same
 * pointer), which the kernels require to fuse them.
 *
 * Weight-only exceptions (mode w8a8, `weight_only` = patterns in `skip`'s
 * syntax): a matching tensor is planned INT8_W8A16 instead (the same int8
 * weights, float activations, no smoothing and no calibration record
 * needed), e.g. weight_only: "ffn_down" for the projections where W8A8
 * loses most on SmolLM2 (docs/quantization.md). `skip` wins over
 * `weight_only` (a tensor matched by both stays float). Matching only part
 * of a fused group (Q/K/V, gate/up) runs on the cpu backend (the parts
 * then run separately); the cuda backend refuses mixed groups at load.
 *
 * What it refuses: weights already packed as 4-bit AWQ/GPTQ (use int4);
 * smoothquant with mode w8a16 (activations stay float: nothing to smooth);
 * weight_only with mode w8a16 (every tensor already is), or a malformed
 * pattern in skip / weight_only (the parameter named);
 * smoothquant without a calibration file, or with one that lacks a
 * quantized tensor or records another width for it.
 */
#include <string.h>

#include "../common/qcommon.h"
#include "../common/qsmooth.h"
#include "loom/quant.h"

#define INT8_WHO "quantizer int8"

enum { INT8_MODE_W8A16 = 0, INT8_MODE_W8A8 = 1 };
enum { INT8_KV_AUTO = 0, INT8_KV_F16 = 1, INT8_KV_FP8 = 2 };

/* Filled by the host from int8_params. */
typedef struct int8_config {
    int64_t mode;                      /* INT8_MODE_*                           */
    double smoothquant;                /* alpha; 0 = off                        */
    char skip[LOOM_PARAM_STRING_MAX];  /* patterns kept unquantized             */
    int64_t kv_cache;                  /* INT8_KV_*                             */
    char calibration[LOOM_PARAM_STRING_MAX]; /* SmoothQuant statistics file   */
    char weight_only[LOOM_PARAM_STRING_MAX]; /* patterns kept W8A16 in w8a8    */
} int8_config;

typedef struct int8_quant {
    const loom_host *host;             /* borrowed until destroy                */
    int8_config cfg;
    qc_smoother smooth;                /* SmoothQuant vectors (w8a8, alpha > 0) */
    const void *checked;               /* the model whose names the patterns matched */
} int8_quant;

static const char *const int8_mode_choices[] = {"w8a16", "w8a8", NULL};
static const char *const int8_kv_choices[] = {"auto", "f16", "fp8", NULL};

static const loom_param int8_params[] = {
    {.key = "mode", .type = LOOM_PARAM_ENUM, .offset = offsetof(int8_config, mode),
     .default_value = "w8a16", .min = 1, .max = 0, .choices = int8_mode_choices,
     .doc = "w8a16: int8 weights, float activations; w8a8: int8 weights and per-token int8 "
            "activations (int32 accumulate)"},
    QC_SMOOTH_PARAM_ALPHA(int8_config, " for w8a8"),
    QC_SKIP_PARAM(int8_config),
    {.key = "kv_cache", .type = LOOM_PARAM_ENUM, .offset = offsetof(int8_config, kv_cache),
     .default_value = "auto", .min = 1, .max = 0, .choices = int8_kv_choices,
     .doc = "KV-cache element type: auto = the backend's default, f16, or fp8 (e4m3)"},
    QC_SMOOTH_PARAM_CALIBRATION(int8_config),
    {.key = "weight_only", .type = LOOM_PARAM_STRING, .offset = offsetof(int8_config, weight_only),
     .default_value = "",
     .doc = "mode w8a8 only: comma-separated tensor-name patterns (skip's syntax, e.g. "
            "'ffn_down', 'blk.29') quantized W8A16 instead: int8 weights, float activations, "
            "no smoothing; skip wins over it"},
    {.key = NULL},
};

static loom_status int8_create(const loom_host *host, const void *config, void **self,
                               loom_error *err) {
    *self = NULL;
    int8_config cfg = {.mode = INT8_MODE_W8A16, .skip = "token_embd,output"};
    if (config) memcpy(&cfg, config, sizeof cfg);
    cfg.skip[sizeof cfg.skip - 1] = 0;
    if (cfg.mode < 0 || cfg.mode > 1 || cfg.kv_cache < 0 || cfg.kv_cache > 2)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: bad config (mode %lld in {0 w8a16, 1 w8a8}, kv_cache %lld in "
                           "{0 auto, 1 f16, 2 fp8})",
                           INT8_WHO, (long long)cfg.mode, (long long)cfg.kv_cache);
    cfg.calibration[sizeof cfg.calibration - 1] = 0;
    cfg.weight_only[sizeof cfg.weight_only - 1] = 0;
    if (cfg.smoothquant > 0.0 && cfg.mode != INT8_MODE_W8A8)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: smoothquant %g with mode w8a16: SmoothQuant moves activation "
                           "outliers into the weights so that int8 activations lose less; with "
                           "w8a16 the activations stay float. Set quantizer.mode: w8a8, or "
                           "smoothquant: 0",
                           INT8_WHO, cfg.smoothquant);
    if (cfg.weight_only[0] && cfg.mode != INT8_MODE_W8A8)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: weight_only \"%s\" with mode w8a16: every tensor is already "
                           "W8A16 (int8 weights, float activations); weight_only picks W8A16 "
                           "exceptions inside mode: w8a8. Set quantizer.mode: w8a8, or "
                           "weight_only: \"\"",
                           INT8_WHO, cfg.weight_only);
    loom_status st = qc_smooth_check(host, INT8_WHO, cfg.smoothquant, cfg.calibration, err);
    if (st != LOOM_OK) return st;
    if ((st = qc_skip_check(host, INT8_WHO, cfg.skip, err)) != LOOM_OK) return st;
    char bad[LOOM_PARAM_STRING_MAX];
    if (!qc_patterns_valid(cfg.weight_only, bad, sizeof bad))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: weight_only pattern '%s' is malformed (no spaces, no empty dot "
                           "components); e.g. weight_only: \"ffn_down\" or \"blk.29,ffn_down\"",
                           INT8_WHO, bad);
    int8_quant *q = host->calloc(host->ctx, 1, sizeof *q);
    if (!q)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", INT8_WHO);
    q->host = host;
    q->cfg = cfg;
    if ((st = qc_smoother_open(&q->smooth, host, INT8_WHO, cfg.smoothquant, cfg.calibration,
                               err)) != LOOM_OK) {
        host->free(host->ctx, q);
        return st;
    }
    *self = q;
    return LOOM_OK;
}

static void int8_destroy(void *self) {
    int8_quant *q = self;
    if (!q) return;
    qc_smoother_free(&q->smooth);
    q->host->free(q->host->ctx, q);
}

static loom_status int8_plan(void *self, const loom_model_view *model, const loom_tensor *w,
                             loom_quant_plan *out, loom_error *err) {
    int8_quant *q = self;
    const loom_host *h = q->host;
    *out = (loom_quant_plan){.struct_size = sizeof *out, .format = LOOM_QFMT_NONE,
                             .per_channel = true};
    loom_status st;
    /* no pattern may match nothing (checked once per model) */
    if ((st = qc_check_patterns_once(&q->checked, h, INT8_WHO, model, q->cfg.skip, q->cfg.weight_only,
                                     err)))
        return st;
    if (!qc_plan_float_linear(h, INT8_WHO, "int8", model, w, q->cfg.skip, &st, err)) return st;
    bool w8a8 = q->cfg.mode == INT8_MODE_W8A8 && !qc_name_matches(w->name, q->cfg.weight_only);
    out->format = w8a8 ? LOOM_QFMT_INT8_W8A8 : LOOM_QFMT_INT8_W8A16;
    return LOOM_OK;
}

static loom_status int8_quantize(void *self, const loom_model_view *model, const loom_tensor *w,
                                 const loom_quant_plan *plan, loom_qtensor *out,
                                 loom_error *err) {
    int8_quant *q = self;
    const loom_host *h = q->host;
    if (!plan || (plan->format != LOOM_QFMT_INT8_W8A16 && plan->format != LOOM_QFMT_INT8_W8A8))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: quantize('%s') with plan format %d; int8 makes only INT8_W8A16 (1) "
                        "and INT8_W8A8 (2)",
                        INT8_WHO, w && w->name ? w->name : "?", plan ? (int)plan->format : -1);
    const float *sm = NULL;
    loom_status st = LOOM_OK;
    if (plan->format == LOOM_QFMT_INT8_W8A8 && qc_smoother_on(&q->smooth) &&
        (st = qc_smoother_for(&q->smooth, model, w, &sm, err)) != LOOM_OK)
        return st;
    return qc_quantize_8bit(h, INT8_WHO, w, sm, plan->format, true, out, err);
}

static void int8_release(void *self, loom_qtensor *t) {
    int8_quant *q = self;
    qc_release(q->host, t);
}

static loom_dtype int8_kv_dtype(void *self) {
    int8_quant *q = self;
    switch (q->cfg.kv_cache) {
    case INT8_KV_F16: return LOOM_DTYPE_F16;
    case INT8_KV_FP8: return LOOM_DTYPE_FP8_E4M3;
    default: return LOOM_DTYPE_COUNT;
    }
}

static const loom_quant_ops int8_ops = {
    .struct_size = sizeof(loom_quant_ops),
    .create = int8_create,
    .destroy = int8_destroy,
    .plan = int8_plan,
    .quantize = int8_quantize,
    .release = int8_release,
    .kv_dtype = int8_kv_dtype,
};

static const loom_component int8_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_QUANTIZER,
    .name = "int8",
    .summary = "int8 weights, per-channel scales: W8A16 or W8A8 (per-token dynamic activations)",
    .ops = &int8_ops,
    .params = int8_params,
    .config_size = sizeof(int8_config),
}};

static const loom_plugin_desc int8_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-quantizer-int8",
    .version = "0.1.0",
    .num_components = 1,
    .components = int8_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &int8_desc; }
