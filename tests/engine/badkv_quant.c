/*
 * tests/engine/badkv_quant.c — quantizer "badkv", a test plugin: keeps
 * every weight as it is (plan NONE) and answers kv_dtype() with its `kv`
 * parameter, a raw loom_dtype value — including ones loom/quant.h does not
 * allow there (a GGUF block type, out-of-range numbers), which the engine
 * must refuse before the backend sees them.
 */
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/quant.h"

typedef struct badkv_config {
    int64_t kv;
} badkv_config;

static const loom_param badkv_params[] = {
    {"kv", LOOM_PARAM_INT, offsetof(badkv_config, kv), "1000", -1000, 1000, NULL,
     "the loom_dtype value kv_dtype() returns (1000, the default: LOOM_DTYPE_COUNT, the backend's default)"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct badkv {
    const loom_host *h;
    int64_t kv;
} badkv;

static loom_status badkv_create(const loom_host *h, const void *config, void **self, loom_error *err) {
    badkv *q = h->calloc(h->ctx, 1, sizeof *q);
    if (!q) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "quantizer.badkv: out of memory");
    q->h = h;
    q->kv = ((const badkv_config *)config)->kv;
    if (q->kv == 1000) q->kv = LOOM_DTYPE_COUNT; /* the value moves as dtypes are added */
    *self = q;
    return LOOM_OK;
}

static void badkv_destroy(void *self) {
    badkv *q = self;
    if (q) q->h->free(q->h->ctx, q);
}

static loom_status badkv_plan(void *self, const loom_model_view *m, const loom_tensor *w, loom_quant_plan *out,
                              loom_error *err) {
    (void)self, (void)m, (void)w, (void)err;
    out->format = LOOM_QFMT_NONE;
    return LOOM_OK;
}

static loom_status badkv_quantize(void *self, const loom_model_view *m, const loom_tensor *w,
                                  const loom_quant_plan *plan, loom_qtensor *out, loom_error *err) {
    badkv *q = self;
    (void)m, (void)w, (void)plan, (void)out;
    return q->h->error(q->h->ctx, err, LOOM_ERR_UNSUPPORTED, "quantizer.badkv: plans NONE only");
}

static void badkv_release(void *self, loom_qtensor *t) { (void)self, (void)t; }

static loom_dtype badkv_kv_dtype(void *self) { return (loom_dtype)((badkv *)self)->kv; }

static const loom_quant_ops badkv_ops = {.struct_size = sizeof badkv_ops, .create = badkv_create,
                                         .destroy = badkv_destroy, .plan = badkv_plan, .quantize = badkv_quantize,
                                         .release = badkv_release, .kv_dtype = badkv_kv_dtype};

static const loom_component badkv_components[] = {{.struct_size = sizeof(loom_component),
                                                   .kind = LOOM_KIND_QUANTIZER,
                                                   .name = "badkv",
                                                   .summary = "kv_dtype() returns any value (tests)",
                                                   .ops = &badkv_ops,
                                                   .params = badkv_params,
                                                   .config_size = sizeof(badkv_config)}};

static const loom_plugin_desc badkv_desc = {LOOM_PLUGIN_DESC_HEADER, .name = "badkv-quantizer", .version = "0.0.0",
                                            .num_components = 1, .components = badkv_components};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &badkv_desc; }
