/*
 * tests/engine/lazy_sampler.c — sampler "lazy", a test plugin: greedy
 * (argmax of each whole row), writes tokens and the chosen token's
 * log-prob but never the alternatives (top_ids / top_logprobs), which
 * loom/sampler.h allows a sampler to leave as the core set them. The
 * engine tests check what a request asking for logprobs then receives.
 * With `force` >= 0 it picks that token every time (a model then generates
 * exactly what a test needs, e.g. byte 0).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/sampler.h"

typedef struct lazy {
    const loom_host *host;
    int64_t force;
} lazy;

typedef struct lazy_config {
    int64_t force; /* >= 0: always this token */
} lazy_config;

static loom_status lazy_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    lazy *l = host->calloc(host->ctx, 1, sizeof *l);
    if (!l) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "sampler.lazy: out of memory");
    l->host = host;
    l->force = ((const lazy_config *)config)->force;
    *self = l;
    return LOOM_OK;
}

static void lazy_destroy(void *self) {
    lazy *l = self;
    if (l) l->host->free(l->host->ctx, l);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (x[v] > x[best]) best = v;
    return best;
}

static loom_status lazy_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    (void)err;
    const lazy *l = self;
    for (int32_t r = 0; r < b->n; r++) {
        const float *x = b->logits + (size_t)r * b->width;
        int32_t t = l->force >= 0 && l->force < b->width ? (int32_t)l->force : argmax(x, b->width);
        out->tokens[r] = t;
        if (out->logprobs) {
            double z = 0;
            for (int32_t v = 0; v < b->width; v++) z += exp((double)x[v] - x[t]);
            out->logprobs[r] = (float)-log(z);
        }
        /* top_ids / top_logprobs: deliberately never written */
    }
    return LOOM_OK;
}

static loom_status lazy_probs(void *self, float *logits, int32_t vocab, const loom_sample_row *row,
                              loom_error *err) {
    (void)self, (void)row, (void)err;
    int32_t t = argmax(logits, vocab);
    for (int32_t v = 0; v < vocab; v++) logits[v] = v == t ? 1.0f : 0.0f;
    return LOOM_OK;
}

static const loom_sampler_ops lazy_ops = {.struct_size = sizeof lazy_ops, .create = lazy_create,
                                          .destroy = lazy_destroy, .sample = lazy_sample, .probs = lazy_probs};

static const loom_param lazy_params[] = {
    {.key = "force", .type = LOOM_PARAM_INT, .offset = offsetof(lazy_config, force), .default_value = "-1",
     .min = -1, .max = 1e9, .doc = "pick this token every time (-1: greedy)"},
    {0}};

static const loom_component lazy_components[] = {{.struct_size = sizeof(loom_component),
                                                  .kind = LOOM_KIND_SAMPLER,
                                                  .name = "lazy",
                                                  .summary = "greedy; never writes logprob alternatives (tests)",
                                                  .ops = &lazy_ops,
                                                  .params = lazy_params,
                                                  .config_size = sizeof(lazy_config)}};

static const loom_plugin_desc lazy_desc = {LOOM_PLUGIN_DESC_HEADER, .name = "lazy-sampler", .version = "0.0.0",
                                           .num_components = 1, .components = lazy_components};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &lazy_desc; }
