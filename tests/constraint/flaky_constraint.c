/*
 * tests/constraint/flaky_constraint.c — constraint "flaky", a test plugin:
 * any language, every token allowed but the end-of-generation ones, and
 * its accept() refuses the `fail_at`-th token it is given (as a work
 * budget or memory running out would). The engine hands a sample's token
 * to its matcher just before that sample's next mask, so the refusal ends
 * the sample one token later with the plugin's message, and a sample whose
 * last token is the refused one ends normally (test_constraint_e2e.c).
 */
#include <stdio.h>
#include <string.h>

#include "loom/constraint.h"
#include "loom/plugin.h"

typedef struct flaky_config {
    int64_t fail_at;
} flaky_config;

static const loom_param flaky_params[] = {
    {"fail_at", LOOM_PARAM_INT, offsetof(flaky_config, fail_at), "3", 1, 1000000, NULL,
     "accept() refuses the fail_at-th token a matcher is given"},
    {0},
};

typedef struct flaky {
    const loom_host *host;
    int64_t fail_at;
} flaky;

typedef struct flaky_grammar {
    const loom_vocab_view *vocab;
} flaky_grammar;

typedef struct flaky_matcher {
    const flaky_grammar *g;
    int64_t accepted;
} flaky_matcher;

static loom_status flaky_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    flaky *f = host->calloc(host->ctx, 1, sizeof *f);
    if (!f) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "constraint.flaky: out of memory");
    f->host = host;
    f->fail_at = ((const flaky_config *)config)->fail_at;
    *self = f;
    return LOOM_OK;
}

static void flaky_destroy(void *self) {
    flaky *f = self;
    if (f) f->host->free(f->host->ctx, f);
}

static loom_status flaky_compile(void *self, const char *lang, const char *text, size_t len,
                                 const loom_vocab_view *vocab, void **grammar, loom_error *err) {
    flaky *f = self;
    flaky_grammar *g = f->host->calloc(f->host->ctx, 1, sizeof *g);
    if (!g) return f->host->error(f->host->ctx, err, LOOM_ERR_NOMEM, "constraint.flaky: out of memory");
    g->vocab = vocab;
    *grammar = g;
    return LOOM_OK;
}

static void flaky_grammar_free(void *self, void *grammar) {
    flaky *f = self;
    f->host->free(f->host->ctx, grammar);
}

static loom_status flaky_matcher_new(void *self, void *grammar, void **matcher, loom_error *err) {
    flaky *f = self;
    flaky_matcher *m = f->host->calloc(f->host->ctx, 1, sizeof *m);
    if (!m) return f->host->error(f->host->ctx, err, LOOM_ERR_NOMEM, "constraint.flaky: out of memory");
    m->g = grammar;
    *matcher = m;
    return LOOM_OK;
}

static void flaky_matcher_free(void *self, void *matcher) {
    flaky *f = self;
    f->host->free(f->host->ctx, matcher);
}

static loom_status flaky_fill_mask(void *self, void *matcher, uint32_t *mask, loom_error *err) {
    const loom_vocab_view *v = ((flaky_matcher *)matcher)->g->vocab;
    memset(mask, 0xff, LOOM_MASK_WORDS(v->size) * sizeof *mask);
    if (v->size % 32) mask[v->size / 32] = (1u << (v->size % 32)) - 1u;
    for (int32_t i = 0; i < v->num_eog; i++) mask[v->eog[i] >> 5] &= ~(1u << (v->eog[i] & 31));
    return LOOM_OK;
}

static loom_status flaky_accept(void *self, void *matcher, int32_t token, loom_error *err) {
    flaky *f = self;
    flaky_matcher *m = matcher;
    if (++m->accepted == f->fail_at)
        return f->host->error(f->host->ctx, err, LOOM_ERR_NO_SPACE, "constraint.flaky: token %lld refused (fail_at)",
                              (long long)m->accepted);
    return LOOM_OK;
}

static bool flaky_can_end(void *self, const void *matcher) { return false; }

static const loom_constraint_ops flaky_ops = {
    .struct_size = sizeof(loom_constraint_ops), .create = flaky_create, .destroy = flaky_destroy,
    .compile = flaky_compile, .grammar_free = flaky_grammar_free, .matcher_new = flaky_matcher_new,
    .matcher_free = flaky_matcher_free, .fill_mask = flaky_fill_mask, .accept = flaky_accept,
    .can_end = flaky_can_end};

static const loom_component flaky_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_CONSTRAINT,
    .name = "flaky",
    .summary = "test constraint: everything allowed, accept() refuses its fail_at-th token",
    .ops = &flaky_ops,
    .params = flaky_params,
    .config_size = sizeof(flaky_config),
}};

static const loom_plugin_desc flaky_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-constraint-flaky",
    .version = "0.0.0",
    .num_components = 1,
    .components = flaky_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &flaky_desc; }
