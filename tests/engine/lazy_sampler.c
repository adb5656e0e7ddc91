/*
 * tests/engine/lazy_sampler.c — sampler "lazy", a test plugin: greedy
 * (argmax of each whole row), writes tokens and the chosen token's
 * log-prob but never the alternatives (top_ids / top_logprobs), which
 * loom/sampler.h allows a sampler to leave as the core set them. The
 * engine tests check what a request asking for logprobs then receives.
 * With `force` >= 0 it picks that token every time (a model then generates
 * exactly what a test needs, e.g. byte 0); with `script` (token ids,
 * comma-separated) output token i is the script's i-th, then `force` or
 * greedy again (a model then "answers" a text a test chose, e.g. a tool
 * call, whole rows only).
 */
#include <stdlib.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/sampler.h"

#define LAZY_SCRIPT_MAX 128

typedef struct lazy {
    const loom_host *host;
    int64_t force;
    int32_t script[LAZY_SCRIPT_MAX]; /* output token i of every request */
    int32_t script_len;
} lazy;

typedef struct lazy_config {
    int64_t force; /* >= 0: always this token */
    char script[LOOM_PARAM_STRING_MAX]; /* "id,id,...": the first output tokens */
} lazy_config;

static loom_status lazy_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    lazy *l = host->calloc(host->ctx, 1, sizeof *l);
    if (!l) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "sampler.lazy: out of memory");
    l->host = host;
    l->force = ((const lazy_config *)config)->force;
    const char *p = ((const lazy_config *)config)->script;
    for (char *end; *p && l->script_len < LAZY_SCRIPT_MAX; p = *end == ',' ? end + 1 : end) {
        long id = strtol(p, &end, 10);
        if (end == p || id < 0) {
            host->free(host->ctx, l);
            return host->error(host->ctx, err, LOOM_ERR_INVALID, "sampler.lazy: script '%s' is not id,id,...",
                               ((const lazy_config *)config)->script);
        }
        l->script[l->script_len++] = (int32_t)id;
    }
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
        const int32_t at = b->rows[r]->output_len;
        int32_t t = l->force >= 0 && l->force < b->width ? (int32_t)l->force : argmax(x, b->width);
        if (at < l->script_len && l->script[at] < b->width && !b->candidates) t = l->script[at];
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
    {.key = "script", .type = LOOM_PARAM_STRING, .offset = offsetof(lazy_config, script), .default_value = "",
     .doc = "token ids, comma-separated: the first output tokens of every request"},
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
