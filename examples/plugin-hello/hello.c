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
 *     every REQUIRED method and the OPTIONAL check() (ABI 2.1), and leaves
 *     the OPTIONAL candidates() NULL; "hello-topk" declares candidates() too;
 *   - a declared parameter table: the host parses and checks the YAML and
 *     hands create() a filled `hello_config` — the plugin parses nothing;
 *   - the host table: allocation, logging tagged with our name, errors, the
 *     row's random stream (host->rng_uniform) and the top-k reference
 *     (host->logits_topk_row);
 *   - ownership: the config is borrowed only during create(), so we copy
 *     what we keep; memory from host->alloc goes back through host->free;
 *   - the sampler contract the conformance kit checks (`loom plugin-test`,
 *     which this file passes): refusing, all or nothing, the parameters it
 *     does not implement; logprobs and alternatives from the raw row; probs()
 *     as the distribution sample() draws from;
 *   - candidate rows: a sampler that does not declare candidates() always
 *     gets whole rows; one that does may get a row's best logits with their
 *     token ids. Both log, at info level, which kind of rows each call
 *     brought, so the SDK test can prove it.
 *
 * The sampler itself is greedy (argmax) when temperature is 0, otherwise
 * plain temperature sampling (softmax of logits / T, over the top_k best
 * when top_k is set); it refuses top_p, min_p and penalties. It logs its
 * greeting once, on the first call to sample(). Use it with:
 *   sampler: {plugin: hello}
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

/* Refuse what hello does not implement, before anything is written: a
 * failed call writes no token and moves no rng. The kit (`loom plugin-test`)
 * allows refusing any non-neutral filter; it requires accepting T = 0 and
 * neutral parameters. */
static loom_status hello_refuse(const loom_host *host, const loom_sampling_params *p, int32_t r, loom_error *err) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) /* NaN fails >= */
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "hello: row %d: temperature %g (want finite, >= 0)", r,
                           (double)p->temperature);
    if (p->top_k < 0)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "hello: row %d: top_k %d (want >= 0)", r, p->top_k);
    if (p->logprobs < 0 || p->logprobs > LOOM_MAX_LOGPROBS)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "hello: row %d: logprobs %d (want 0..%d)", r,
                           p->logprobs, LOOM_MAX_LOGPROBS);
    if (p->top_p != 1.0f || p->min_p != 0.0f || p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
        p->frequency_penalty != 0.0f)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "hello: row %d: top_p %g, min_p %g, penalties %g/%g/%g: hello implements only "
                           "temperature and top_k (use the standard sampler)", r, (double)p->top_p,
                           (double)p->min_p, (double)p->repetition_penalty, (double)p->presence_penalty,
                           (double)p->frequency_penalty);
    return LOOM_OK;
}

/* How many best logits the distribution keeps: 1 for greedy, top_k when it
 * cuts the row, 0 for all of them. */
static int32_t kept(const loom_sampling_params *p, int32_t n) {
    if (p->temperature == 0.0f) return 1;
    return p->top_k > 0 && p->top_k < n ? p->top_k : 0;
}

/* The distribution sample() draws from, written to dist (n floats; may be
 * x itself): softmax(x / T) over the kept best logits — for greedy (k = 1)
 * one-hot at the argmax. ids/vals: room for kept() entries. */
static void distribution(const loom_host *host, const float *x, float *dist, int32_t n,
                         const loom_sampling_params *p, int32_t *ids, float *vals) {
    double t = p->temperature > 0.0f ? p->temperature : 1.0, z = 0.0;
    int32_t k = kept(p, n);
    if (k > 0) {
        float lse;
        host->logits_topk_row(x, n, k, ids, vals, &lse); /* the k best, descending */
        for (int32_t j = 0; j < k; j++) z += exp((vals[j] - vals[0]) / t);
        for (int32_t i = 0; i < n; i++) dist[i] = 0.0f;
        for (int32_t j = 0; j < k; j++) dist[ids[j]] = (float)(exp((vals[j] - vals[0]) / t) / z);
        return;
    }
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int32_t i = 0; i < n; i++) z += exp((x[i] - mx) / t);
    for (int32_t i = 0; i < n; i++) dist[i] = (float)(exp((x[i] - mx) / t) / z);
}

/* Inverse CDF: the token under one uniform draw u in [0, 1). */
static int32_t draw(const float *dist, int32_t n, double u) {
    double total = 0.0, c = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; i++) total += dist[i];
    for (int32_t i = 0; i < n; i++) {
        if (dist[i] <= 0.0f) continue;
        last = i;
        if ((c += dist[i]) > u * total) return i;
    }
    return last; /* rounding: u * total at the very top */
}

/* [instance] Greedy when temperature is 0, else temperature sampling (with
 * top_k). Whole rows are (n, vocab) logits; candidate rows (only if we
 * declared candidates) are each row's best `width` logits with their token
 * ids and the whole row's log-sum-exp. */
static loom_status hello_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    hello *h = self;
    const loom_host *host = h->host;
    if (b->width <= 0 || b->vocab <= 0)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "hello: width %d, vocab %d", b->width, b->vocab);
    int32_t kmax = 1;
    for (int32_t r = 0; r < b->n; r++) { /* every row first: all or nothing */
        loom_status st = hello_refuse(host, b->rows[r]->params, r, err);
        if (st != LOOM_OK) return st;
        int32_t k = kept(b->rows[r]->params, b->width);
        kmax = k > kmax ? k : kmax;
    }
    float *dist = host->alloc(host->ctx, sizeof(float) * ((size_t)b->width + (size_t)kmax));
    int32_t *ids = host->alloc(host->ctx, sizeof(int32_t) * (size_t)kmax);
    if (!dist || !ids) {
        host->free(host->ctx, dist);
        host->free(host->ctx, ids);
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "hello: out of memory");
    }
    if (!h->greeted) {
        h->greeted = true;
        host->log(host->ctx, LOOM_LOG_INFO, "hello", "%s", h->cfg.greeting);
    }
    host->log(host->ctx, LOOM_LOG_INFO, "hello", "%s rows: %d of width %d (vocab %d)",
              b->candidates ? "candidate" : "whole", b->n, b->width, b->vocab);
    for (int32_t r = 0; r < b->n; r++) {
        const loom_sample_row *row = b->rows[r];
        const float *x = b->logits + (size_t)r * (size_t)b->width;
        const int32_t *cand = b->candidates ? b->candidates + (size_t)r * (size_t)b->width : NULL;
        /* The raw row's best columns, best first (ties: lowest id), and its
         * log-sum-exp: the argmax and the logprobs come from these. */
        int32_t top[LOOM_MAX_LOGPROBS];
        float topv[LOOM_MAX_LOGPROBS], lse;
        host->logits_topk_row(x, b->width, LOOM_MAX_LOGPROBS, top, topv, &lse);
        if (b->lse) lse = b->lse[r]; /* a candidate row: the whole row's */
        int32_t col = top[0];
        if (row->params->temperature > 0.0f) {
            distribution(host, x, dist, b->width, row->params, ids, dist + b->width);
            col = draw(dist, b->width, host->rng_uniform(row->rng_state)); /* one step of the row's rng */
        }
        out->tokens[r] = cand ? cand[col] : col;
        if (out->logprobs) out->logprobs[r] = x[col] - lse; /* raw log-softmax of the chosen token */
        for (int32_t i = 0; i < LOOM_MAX_LOGPROBS; i++) { /* the best alternatives; -1, -inf pad */
            bool alt = i < row->params->logprobs && top[i] >= 0;
            if (out->top_ids) out->top_ids[r * LOOM_MAX_LOGPROBS + i] = !alt ? -1 : cand ? cand[top[i]] : top[i];
            if (out->top_logprobs) out->top_logprobs[r * LOOM_MAX_LOGPROBS + i] = alt ? topv[i] - lse : -INFINITY;
        }
    }
    host->free(host->ctx, dist);
    host->free(host->ctx, ids);
    return LOOM_OK;
}

/* [instance] The distribution sample() draws from, in place. */
static loom_status hello_probs(void *self, float *logits, int32_t vocab, const loom_sample_row *row,
                               loom_error *err) {
    hello *h = self;
    const loom_host *host = h->host;
    loom_status st = hello_refuse(host, row->params, 0, err);
    if (st != LOOM_OK) return st;
    int32_t k = kept(row->params, vocab);
    int32_t *ids = host->alloc(host->ctx, sizeof(int32_t) * (size_t)(k + 1));
    float *vals = host->alloc(host->ctx, sizeof(float) * (size_t)(k + 1));
    if (ids && vals) distribution(host, logits, logits, vocab, row->params, ids, vals);
    host->free(host->ctx, ids);
    host->free(host->ctx, vals);
    return ids && vals ? LOOM_OK : host->error(host->ctx, err, LOOM_ERR_NOMEM, "hello: out of memory");
}

/* [instance] (ABI 2.1) A new request's parameters, refused exactly as
 * sample() would refuse them; saves the core a dry sample() per request. */
static loom_status hello_check(void *self, const loom_sample_row *row, int32_t vocab, loom_error *err) {
    hello *h = self;
    (void)vocab;
    return hello_refuse(h->host, row->params, 0, err);
}

/* [instance] ("hello-topk") Greedy needs only a row's best logit — and the
 * best `logprobs` for the alternatives it reports; sampling draws from the
 * whole row. */
static int32_t hello_candidates(void *self, const loom_sampling_params *params) {
    (void)self;
    if (params->temperature != 0.0f) return 0;
    return params->logprobs > 1 && params->logprobs <= LOOM_MAX_LOGPROBS ? params->logprobs : 1;
}

/* ------------------------------------------------------- descriptor */

static const loom_sampler_ops hello_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = hello_create,
    .destroy = hello_destroy,
    .sample = hello_sample,
    .probs = hello_probs,
    .candidates = NULL, /* every row arrives whole */
    .check = hello_check,
};

static const loom_sampler_ops hello_topk_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = hello_create,
    .destroy = hello_destroy,
    .sample = hello_sample,
    .probs = hello_probs,
    .candidates = hello_candidates,
    .check = hello_check,
};

static const loom_component hello_components[] = {
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_SAMPLER,
        .name = "hello",
        .summary = "greedy or temperature sampler that says hello once (SDK example)",
        .ops = &hello_ops,
        .params = hello_params,
        .config_size = sizeof(hello_config),
    },
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_SAMPLER,
        .name = "hello-topk",
        .summary = "the hello sampler, declaring that greedy needs only a row's best logits",
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
