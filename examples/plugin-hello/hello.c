/*
 * hello.c — the smallest useful loom plugin, built outside loom's tree
 * against the installed SDK (`pkg-config --cflags loom-plugin`).
 *
 * What it demonstrates:
 *   - the one exported symbol, loom_plugin_entry(), returning a static
 *     descriptor (LOOM_PLUGIN_DESC_HEADER fills the ABI version and build
 *     signature the host checks);
 *   - one component of kind "sampler" named "hello", with its ops table
 *     (struct_size first, then create/destroy, then the sampler methods);
 *   - a declared parameter table: the host parses and checks the YAML and
 *     hands create() a filled `hello_config` — the plugin parses nothing;
 *   - the host table: allocation, logging tagged with our name, errors;
 *   - ownership: the config is borrowed only during create(), so we copy
 *     what we keep; memory from host->alloc goes back through host->free.
 *
 * The sampler itself is greedy (argmax) and logs its greeting once, on the
 * first call to sample(). Use it with:  sampler: {plugin: hello}
 */
#include <math.h>
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
    int greeted;           /* 0 until the greeting was logged      */
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

static int32_t argmax(const float *row, int32_t vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* [instance] Greedy: the most likely token of each row (logits (n, vocab)). */
static loom_status hello_sample(void *self, float *logits, int32_t vocab,
                                const loom_sample_row *rows, int32_t n, loom_sample_out *out,
                                loom_error *err) {
    hello *h = self;
    (void)rows;
    if (vocab <= 0) return h->host->error(h->host->ctx, err, LOOM_ERR_INVALID, "hello: vocab %d", vocab);
    if (!h->greeted) {
        h->greeted = 1;
        h->host->log(h->host->ctx, LOOM_LOG_INFO, "hello", "%s", h->cfg.greeting);
    }
    for (int32_t r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * (size_t)vocab;
        int32_t tok = argmax(row, vocab);
        out->tokens[r] = tok;
        if (out->logprobs) {
            /* log-softmax of the chosen token, computed stably */
            double sum = 0.0;
            for (int32_t i = 0; i < vocab; i++) sum += exp((double)row[i] - (double)row[tok]);
            out->logprobs[r] = (float)-log(sum);
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

/* ------------------------------------------------------- descriptor */

static const loom_sampler_ops hello_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = hello_create,
    .destroy = hello_destroy,
    .sample = hello_sample,
    .probs = hello_probs,
};

static const loom_component hello_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SAMPLER,
    .name = "hello",
    .summary = "greedy sampler that says hello once (SDK example)",
    .ops = &hello_ops,
    .params = hello_params,
    .config_size = sizeof(hello_config),
}};

static const loom_plugin_desc hello_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "hello",
    .version = "1.0.0",
    .num_components = 1,
    .components = hello_components,
};

/* The only exported symbol. Pure data: no allocation, no side effects. */
LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &hello_desc; }
