/*
 * hello.c — the smallest useful loom plugin, built outside loom's tree
 * against the installed SDK (`pkg-config --cflags loom-plugin`).
 *
 * What it demonstrates:
 *   - the one exported symbol, loom_plugin_entry(), returning a static
 *     descriptor (LOOM_PLUGIN_DESC_HEADER fills the ABI version and build
 *     signature the host checks);
 *   - components of kind "sampler", each with its ops table (struct_size
 *     first, then create/destroy, then the sampler methods): "hello" sets
 *     every REQUIRED method and leaves the OPTIONAL candidates() NULL;
 *     "hello-topk" declares candidates() too;
 *   - a declared parameter table: the host parses and checks the YAML and
 *     hands create() a filled `hello_config` — the plugin parses nothing;
 *   - the host table: allocation, logging tagged with our name, errors;
 *   - ownership: the config is borrowed only during create(), so we copy
 *     what we keep; memory from host->alloc goes back through host->free;
 *   - candidate rows: a sampler that does not declare candidates() always
 *     gets whole rows; one that does may get a row's best logits with their
 *     token ids. Both log, at info level, which kind of rows each call
 *     brought, so the SDK test can prove it.
 *
 * The sampler itself is greedy (argmax) and logs its greeting once, on the
 * first call to sample(). Use it with:  sampler: {plugin: hello}
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/sampler.h"

/* ------------------------------------------------------------ config */

/* Filled by the host from the `sampler:` section (see hello_params). */
typedef struct hello_config {
    char greeting[LOOM_PARAM_STRING_MAX]; /* logged once, on first use */
} hello_config;

static const loom_param hello_params[] = {
    {.key = "greeting", .type = LOOM_PARAM_STRING, .offset = offsetof(hello_config, greeting),
     .default_value = "hello", .min = 1, .max = 0, /* min > max: no bounds */
     .doc = "what to log on the first sample() call"},
    {0}, /* NULL key ends the table */
};

/* ---------------------------------------------------------- instance */

typedef struct hello {
    const loom_host *host; /* valid until destroy                  */
    hello_config cfg;      /* our own copy: the config is borrowed */
    bool greeted;          /* the greeting was logged              */
} hello;

/* [engine] */
static loom_status hello_create(const loom_host *host, const void *config, void **self,
                                loom_error *err) {
    hello *h = host->calloc(host->ctx, 1, sizeof *h);
    if (!h) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "hello: out of memory");
    h->host = host;
    memcpy(&h->cfg, config, sizeof h->cfg);
    *self = h;
    return LOOM_OK;
}

/* [engine] */
static void hello_destroy(void *self) {
    hello *h = self;
    if (h) h->host->free(h->host->ctx, h);
}

static int32_t argmax(const float *row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* [instance] Greedy: the most likely token of each row. Whole rows are
 * (n, vocab) logits; candidate rows (only if we declared candidates) are
 * each row's best `width` logits with their token ids. */
static loom_status hello_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    hello *h = self;
    const loom_host *host = h->host;
    if (b->width <= 0 || b->vocab <= 0)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "hello: width %d, vocab %d", b->width, b->vocab);
    if (!h->greeted) {
        h->greeted = true;
        host->log(host->ctx, LOOM_LOG_INFO, "hello", "%s", h->cfg.greeting);
    }
    host->log(host->ctx, LOOM_LOG_INFO, "hello", "%s rows: %d of width %d (vocab %d)",
              b->candidates ? "candidate" : "whole", b->n, b->width, b->vocab);
    for (int32_t r = 0; r < b->n; r++) {
        const float *row = b->logits + (size_t)r * (size_t)b->width;
        int32_t col = argmax(row, b->width);
        out->tokens[r] = b->candidates ? b->candidates[(size_t)r * b->width + col] : col;
        if (out->logprobs) {
            /* log-softmax of the chosen token, over the whole row */
            double lse = 0.0;
            if (b->lse) {
                lse = b->lse[r];
            } else {
                for (int32_t i = 0; i < b->width; i++) lse += exp((double)row[i] - (double)row[col]);
                lse = row[col] + log(lse);
            }
            out->logprobs[r] = (float)(row[col] - lse);
        }
    }
    return LOOM_OK;
}

/* [instance] Greedy's distribution is one-hot on the argmax. */
static loom_status hello_probs(void *self, float *logits, int32_t vocab,
                               const loom_sample_row *row, loom_error *err) {
    (void)self, (void)row, (void)err;
    int32_t tok = argmax(logits, vocab);
    for (int32_t i = 0; i < vocab; i++) logits[i] = i == tok ? 1.0f : 0.0f;
    return LOOM_OK;
}

/* [instance] Greedy needs only each row's best logit ("hello-topk"). */
static int32_t hello_candidates(void *self, const loom_sampling_params *params) {
    (void)self, (void)params;
    return 1;
}

/* ------------------------------------------------------- descriptor */

static const loom_sampler_ops hello_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = hello_create,
    .destroy = hello_destroy,
    .sample = hello_sample,
    .probs = hello_probs,
    /* .candidates NULL: every row arrives whole */
};

static const loom_sampler_ops hello_topk_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = hello_create,
    .destroy = hello_destroy,
    .sample = hello_sample,
    .probs = hello_probs,
    .candidates = hello_candidates,
};

static const loom_component hello_components[] = {
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_SAMPLER,
        .name = "hello",
        .summary = "greedy sampler that says hello once (SDK example)",
        .ops = &hello_ops,
        .params = hello_params,
        .config_size = sizeof(hello_config),
    },
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_SAMPLER,
        .name = "hello-topk",
        .summary = "the hello sampler, declaring that a row's best logit is enough",
        .ops = &hello_topk_ops,
        .params = hello_params,
        .config_size = sizeof(hello_config),
    },
};

static const loom_plugin_desc hello_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "hello",
    .version = "1.0.0",
    .num_components = 2,
    .components = hello_components,
};

/* The only exported symbol. Pure data: no allocation, no side effects. */
LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &hello_desc; }
