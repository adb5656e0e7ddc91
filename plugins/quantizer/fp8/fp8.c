/*
 * plugins/quantizer/fp8/fp8.c — loom-quantizer-fp8.so: the "fp8"
 * quantizer component (FP8 E4M3, W8A8).
 *
 * Every linear weight not kept by `skip` becomes E4M3 codes with f32 scales
 * (w = e4m3(q) * scale), one per output channel (`scales: per_channel`,
 * scale = max|row| / 448) or one per tensor (`per_tensor`). At run time the
 * backend quantizes each token's activations to E4M3 with a dynamic
 * per-token scale (max|x| / 448) and accumulates in fp32 (cuBLASLt FP8 GEMM
 * on sm_90; emulated on the CPU). `kv_cache: fp8` asks for an E4M3 KV
 * cache; backends without one fail kv_alloc with the type named.
 *
 * SmoothQuant (smoothquant = alpha > 0, calibration = a file from `loom
 * calibrate`): as in the int8 quantizer's w8a8 mode, with the same shared
 * code (../common/qsmooth.h): per input group (Q K V; gate up; O; down) the
 * factors s[j] = max|X_j|^alpha / max|W_j|^(1 - alpha); W diag(s) is what
 * becomes E4M3 (per-channel or per-tensor scales of the smoothed weight),
 * and the qtensor's `smooth` points at s (one pointer per group), so the
 * backend quantizes x / s per token.
 *
 * The E4M3 codec (round to nearest even, saturate at +-448, no infinity,
 * NaN kept) is in ../common/qcommon.h.
 */
#include <string.h>

#include "../common/qcommon.h"
#include "../common/qsmooth.h"
#include "loom/quant.h"

#define FP8_WHO "quantizer fp8"

enum { FP8_SCALES_PER_CHANNEL = 0, FP8_SCALES_PER_TENSOR = 1 };
enum { FP8_KV_AUTO = 0, FP8_KV_FP8 = 1 };

/* Filled by the host from fp8_params. */
typedef struct fp8_config {
    int64_t scales;                    /* FP8_SCALES_*                          */
    char skip[LOOM_PARAM_STRING_MAX];  /* patterns kept unquantized             */
    int64_t kv_cache;                  /* FP8_KV_*                              */
    double smoothquant;                /* alpha; 0 = off                        */
    char calibration[LOOM_PARAM_STRING_MAX]; /* SmoothQuant statistics file   */
} fp8_config;

typedef struct fp8_quant {
    const loom_host *host;             /* borrowed until destroy                */
    fp8_config cfg;
    qc_smoother smooth;                /* SmoothQuant vectors (alpha > 0)       */
    const void *checked;               /* the model whose names the patterns matched */
} fp8_quant;

static const char *const fp8_scale_choices[] = {"per_channel", "per_tensor", NULL};
static const char *const fp8_kv_choices[] = {"auto", "fp8", NULL};

static const loom_param fp8_params[] = {
    {.key = "scales", .type = LOOM_PARAM_ENUM, .offset = offsetof(fp8_config, scales),
     .default_value = "per_channel", .min = 1, .max = 0, .choices = fp8_scale_choices,
     .doc = "weight scales: one per output channel, or one per tensor"},
    QC_SKIP_PARAM(fp8_config),
    {.key = "kv_cache", .type = LOOM_PARAM_ENUM, .offset = offsetof(fp8_config, kv_cache),
     .default_value = "auto", .min = 1, .max = 0, .choices = fp8_kv_choices,
     .doc = "KV-cache element type: auto = the backend's default, fp8 = e4m3"},
    QC_SMOOTH_PARAM_ALPHA(fp8_config, ""),
    QC_SMOOTH_PARAM_CALIBRATION(fp8_config),
    {.key = NULL},
};

static loom_status fp8_create(const loom_host *host, const void *config, void **self,
                              loom_error *err) {
    *self = NULL;
    fp8_config cfg = {.scales = FP8_SCALES_PER_CHANNEL, .skip = "token_embd,output"};
    if (config) memcpy(&cfg, config, sizeof cfg);
    cfg.skip[sizeof cfg.skip - 1] = 0;
    if (cfg.scales < 0 || cfg.scales > 1 || cfg.kv_cache < 0 || cfg.kv_cache > 1)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "%s: bad config (scales %lld in {0 per_channel, 1 per_tensor}, "
                           "kv_cache %lld in {0 auto, 1 fp8})",
                           FP8_WHO, (long long)cfg.scales, (long long)cfg.kv_cache);
    cfg.calibration[sizeof cfg.calibration - 1] = 0;
    loom_status st = qc_smooth_check(host, FP8_WHO, cfg.smoothquant, cfg.calibration, err);
    if (st != LOOM_OK) return st;
    if ((st = qc_skip_check(host, FP8_WHO, cfg.skip, err)) != LOOM_OK) return st;
    fp8_quant *q = host->calloc(host->ctx, 1, sizeof *q);
    if (!q) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory", FP8_WHO);
    q->host = host;
    q->cfg = cfg;
    if ((st = qc_smoother_open(&q->smooth, host, FP8_WHO, cfg.smoothquant, cfg.calibration,
                               err)) != LOOM_OK) {
        host->free(host->ctx, q);
        return st;
    }
    *self = q;
    return LOOM_OK;
}

static void fp8_destroy(void *self) {
    fp8_quant *q = self;
    if (!q) return;
    qc_smoother_free(&q->smooth);
    q->host->free(q->host->ctx, q);
}

static loom_status fp8_plan(void *self, const loom_model_view *model, const loom_tensor *w,
                            loom_quant_plan *out, loom_error *err) {
    fp8_quant *q = self;
    const loom_host *h = q->host;
    bool pc = q->cfg.scales == FP8_SCALES_PER_CHANNEL;
    *out = (loom_quant_plan){.struct_size = sizeof *out, .format = LOOM_QFMT_NONE,
                             .per_channel = pc};
    loom_status st;
    /* no pattern may match nothing (checked once per model) */
    if ((st = qc_check_patterns_once(&q->checked, h, FP8_WHO, model, q->cfg.skip, NULL, err))) return st;
    if (!qc_plan_float_linear(h, FP8_WHO, "fp8", model, w, q->cfg.skip, &st, err)) return st;
    out->format = LOOM_QFMT_FP8_W8A8;
    return LOOM_OK;
}

static loom_status fp8_quantize(void *self, const loom_model_view *model, const loom_tensor *w,
                                const loom_quant_plan *plan, loom_qtensor *out, loom_error *err) {
    fp8_quant *q = self;
    const loom_host *h = q->host;
    if (!plan || plan->format != LOOM_QFMT_FP8_W8A8)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "%s: quantize('%s') with plan format %d; fp8 makes only FP8_W8A8 (3)",
                        FP8_WHO, w && w->name ? w->name : "?", plan ? (int)plan->format : -1);
    const float *sm = NULL;
    loom_status st = LOOM_OK;
    if (qc_smoother_on(&q->smooth) &&
        (st = qc_smoother_for(&q->smooth, model, w, &sm, err)) != LOOM_OK)
        return st;
    return qc_quantize_8bit(h, FP8_WHO, w, sm, LOOM_QFMT_FP8_W8A8, plan->per_channel, out, err);
}

static void fp8_release(void *self, loom_qtensor *t) {
    fp8_quant *q = self;
    qc_release(q->host, t);
}

static loom_dtype fp8_kv_dtype(void *self) {
    fp8_quant *q = self;
    return q->cfg.kv_cache == FP8_KV_FP8 ? LOOM_DTYPE_FP8_E4M3 : LOOM_DTYPE_COUNT;
}

static const loom_quant_ops fp8_ops = {
    .struct_size = sizeof(loom_quant_ops),
    .create = fp8_create,
    .destroy = fp8_destroy,
    .plan = fp8_plan,
    .quantize = fp8_quantize,
    .release = fp8_release,
    .kv_dtype = fp8_kv_dtype,
};

static const loom_component fp8_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_QUANTIZER,
    .name = "fp8",
    .summary = "FP8 E4M3 weights (per-channel or per-tensor scales), per-token E4M3 activations "
               "(optional SmoothQuant)",
    .ops = &fp8_ops,
    .params = fp8_params,
    .config_size = sizeof(fp8_config),
}};

static const loom_plugin_desc fp8_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-quantizer-fp8",
    .version = "0.1.0",
    .num_components = 1,
    .components = fp8_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &fp8_desc; }
