/*
 * plugins/constraint/grammar/grammar.c — the "grammar" constraint: JSON
 * schemas, "any JSON object" and GBNF grammars compiled to a pushdown
 * matcher over code points, masked token by token through a byte trie of
 * the vocabulary (gram.h, docs/constraints.md).
 *
 * Languages: "json_schema" (text: the schema), "json_object" (no text: any
 * JSON object), "regex" (text: a regular expression the whole output
 * must match), "gbnf" (text: the grammar, start rule `root`). The trie of
 * a vocabulary is built on the first compile against it and kept for the
 * instance's life (one per vocab view, guarded by a mutex: compile is
 * [any]).
 *
 * Compiled grammars are shared: requests with the same language and text
 * (a server's clients sending one schema) get one grammar, and with it one
 * mask cache, so a parse state one request has seen is a copy for every
 * other; the last `grammar_cache` grammars no request holds are kept for
 * the next.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "loom/constraint.h"

#define GR_NAME "grammar"

typedef struct gr_config {
    int64_t max_text_bytes;
    int64_t max_elements;
    int64_t max_schema_depth;
    int64_t max_stack_depth;
    int64_t max_stacks;
    int64_t max_repeat;
    int64_t mask_cache;
    int64_t grammar_cache;
    bool mask_cut_keys;
    int64_t max_match_steps;
} gr_config;

static const loom_param gr_params[] = {
    {"max_text_bytes", LOOM_PARAM_INT, offsetof(gr_config, max_text_bytes), "1048576", 64, 1 << 26, NULL,
     "longest schema or grammar text accepted, in bytes"},
    {"max_elements", LOOM_PARAM_INT, offsetof(gr_config, max_elements), "1000000", 64, 1 << 26, NULL,
     "largest compiled grammar, in elements (repetitions expanded)"},
    {"max_schema_depth", LOOM_PARAM_INT, offsetof(gr_config, max_schema_depth), "64", 1, 4096, NULL,
     "deepest nesting of subschemas in a JSON schema"},
    {"max_stack_depth", LOOM_PARAM_INT, offsetof(gr_config, max_stack_depth), "512", 8, 65536, NULL,
     "deepest parse stack: how deep the generated text may nest"},
    {"max_stacks", LOOM_PARAM_INT, offsetof(gr_config, max_stacks), "256", 1, 65536, NULL,
     "parse stacks kept at once for an ambiguous grammar (fewer only narrows the mask)"},
    {"max_repeat", LOOM_PARAM_INT, offsetof(gr_config, max_repeat), "1000", 1, 100000, NULL,
     "largest count of a repetition {m,n}, maxItems or maxLength"},
    {"mask_cache", LOOM_PARAM_INT, offsetof(gr_config, mask_cache), "256", 0, 65536, NULL,
     "token masks kept per grammar, by parse state (0 = none; each is vocab/8 bytes)"},
    {"grammar_cache", LOOM_PARAM_INT, offsetof(gr_config, grammar_cache), "16", 0, 1024, NULL,
     "compiled grammars kept after their last request ends, for requests with the same text (0 = none)"},
    {"mask_cut_keys", LOOM_PARAM_BOOL, offsetof(gr_config, mask_cut_keys), "true", 0, 0, NULL,
     "also cache masks under keys that leave out the parse-stack frames below where a token can reach, so the "
     "same place in every repeated item shares one mask (false = by whole parse states only)"},
    {"max_match_steps", LOOM_PARAM_INT, offsetof(gr_config, max_match_steps), "4000000", 1000, INT64_C(1) << 40,
     NULL,
     "parse-stack expansion steps one token mask or one accepted token may take; past it the request fails with "
     "an error naming its grammar (a work budget against grammars too ambiguous to match quickly)"},
    {0},
};

typedef struct gr_trie {
    const loom_vocab_view *vocab;
    vtrie *trie;
} gr_trie;

/* A compiled grammar shared by every request with its language and text. */
typedef struct gr_shared {
    gram_compiled *c;
    char *lang, *text;         /* owned copies (text: len bytes)             */
    size_t len;
    int32_t refs;              /* requests holding it; 0 = kept for reuse    */
    uint64_t last_used;        /* clock when refs last fell to 0             */
} gr_shared;

typedef struct gr_self {
    const loom_host *host;
    gram_limits lim;
    int32_t mask_cache, grammar_cache;
    bool mask_cut_keys;
    pthread_mutex_t mu;        /* guards tries and shared                    */
    gr_trie *tries;
    int32_t n_tries, cap_tries;
    gr_shared *shared;
    int32_t n_shared, cap_shared;
    uint64_t clock;
} gr_self;

static loom_status gr_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    const gr_config *c = config;
    gr_self *s = calloc(1, sizeof *s);
    if (!s) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "constraint '%s': out of memory", GR_NAME);
    s->host = host;
    s->lim = (gram_limits){c->max_text_bytes, c->max_elements, c->max_schema_depth,
                           c->max_stack_depth, c->max_stacks, c->max_repeat, c->max_match_steps};
    s->mask_cache = (int32_t)c->mask_cache;
    s->grammar_cache = (int32_t)c->grammar_cache;
    s->mask_cut_keys = c->mask_cut_keys;
    pthread_mutex_init(&s->mu, NULL);
    *self = s;
    return LOOM_OK;
}

static void compiled_free(gram_compiled *c) {
    if (!c) return;
    gram_free(&c->g);
    mask_cache_free(c->cache);
    free(c);
}

static void shared_drop(gr_self *s, int32_t i) {
    compiled_free(s->shared[i].c);
    free(s->shared[i].lang);
    free(s->shared[i].text);
    s->shared[i] = s->shared[--s->n_shared];
}

static void gr_destroy(void *self) {
    gr_self *s = self;
    if (!s) return;
    while (s->n_shared > 0) shared_drop(s, s->n_shared - 1); /* the engine freed every grammar before */
    free(s->shared);
    for (int32_t i = 0; i < s->n_tries; i++) vtrie_free(s->tries[i].trie);
    free(s->tries);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The trie of `v`, built on first use. */
static loom_status gr_trie_for(gr_self *s, const loom_vocab_view *v, const vtrie **out, char *why, size_t cap) {
    loom_status st = LOOM_OK;
    pthread_mutex_lock(&s->mu);
    *out = NULL;
    for (int32_t i = 0; i < s->n_tries; i++)
        if (s->tries[i].vocab == v) *out = s->tries[i].trie;
    if (!*out) {
        vtrie *t = NULL;
        if (s->n_tries == s->cap_tries) {
            int32_t nc = s->cap_tries ? 2 * s->cap_tries : 4;
            gr_trie *q = realloc(s->tries, (size_t)nc * sizeof *q);
            if (q) s->tries = q, s->cap_tries = nc;
        }
        if (s->n_tries == s->cap_tries) {
            snprintf(why, cap, "out of memory");
            st = LOOM_ERR_NOMEM;
        } else if ((st = vtrie_build(v, &t, why, cap)) == LOOM_OK) {
            s->tries[s->n_tries++] = (gr_trie){v, t};
            *out = t;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* The shared grammar of (vocab, lang, text), one more reference taken, or
 * NULL. Under s->mu. */
static gram_compiled *shared_take(gr_self *s, const loom_vocab_view *vocab, const char *lang, const char *text,
                                  size_t len) {
    for (int32_t i = 0; i < s->n_shared; i++) {
        gr_shared *e = &s->shared[i];
        if (e->c->vocab == vocab && e->len == len && !strcmp(e->lang, lang) && !memcmp(e->text, text, len)) {
            e->refs++;
            return e->c;
        }
    }
    return NULL;
}

/* Share c from now on (one reference: the caller's); when memory runs out
 * it is simply not shared. Under s->mu. */
static void shared_add(gr_self *s, gram_compiled *c, const char *lang, const char *text, size_t len) {
    if (s->n_shared == s->cap_shared) {
        int32_t nc = s->cap_shared ? 2 * s->cap_shared : 8;
        gr_shared *q = realloc(s->shared, (size_t)nc * sizeof *q);
        if (!q) return;
        s->shared = q, s->cap_shared = nc;
    }
    char *l = strdup(lang), *t = malloc(len + 1);
    if (!l || !t) {
        free(l);
        free(t);
        return;
    }
    memcpy(t, text, len);
    t[len] = '\0';
    s->shared[s->n_shared++] = (gr_shared){.c = c, .lang = l, .text = t, .len = len, .refs = 1};
    c->shared = true;
}

/* Free the least recently released grammars no request holds, past
 * grammar_cache of them. Under s->mu. */
static void shared_trim(gr_self *s) {
    for (;;) {
        int32_t idle = 0, oldest = -1;
        for (int32_t i = 0; i < s->n_shared; i++) {
            if (s->shared[i].refs > 0) continue;
            idle++;
            if (oldest < 0 || s->shared[i].last_used < s->shared[oldest].last_used) oldest = i;
        }
        if (idle <= s->grammar_cache) return;
        shared_drop(s, oldest);
    }
}

/* c->what: the language and the start of the text, for errors a matcher
 * meets later (the budget), so a client sees which grammar it was. */
static void gram_describe(gram_compiled *c, const char *lang, const char *text, size_t len) {
    enum { SHOW = 60 };
    char t[SHOW + 1];
    size_t n = 0;
    for (size_t i = 0; i < len && n < SHOW; i++) /* control bytes as spaces: it goes into one line */
        t[n++] = (unsigned char)text[i] < 0x20 ? ' ' : text[i];
    if (len > SHOW) { /* cut at a character boundary: the text goes into JSON error bodies */
        size_t lead = n;
        while (lead > 0 && ((unsigned char)t[lead - 1] & 0xC0) == 0x80) lead--;
        if (lead > 0 && (unsigned char)t[lead - 1] >= 0xC0) {
            const unsigned char b = (unsigned char)t[lead - 1];
            const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
            if (lead - 1 + need > n) n = lead - 1;
        }
    }
    t[n] = '\0';
    if (len == 0) snprintf(c->what, sizeof c->what, "%s", lang);
    else snprintf(c->what, sizeof c->what, "%s `%s%s`", lang, t, len > SHOW ? "..." : "");
}

static loom_status compile_new(gr_self *s, const char *lang, const char *text, size_t len,
                               const loom_vocab_view *vocab, gram_compiled **out, char *why, size_t cap) {
    gram_compiled *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return snprintf(why, cap, "out of memory"), LOOM_ERR_NOMEM;
    c->lim = s->lim;
    c->vocab = vocab;
    c->plain_keys = !s->mask_cut_keys;
    gram_describe(c, lang, text, len);
    loom_status st = gram_compile_lang(lang, text, len, &s->lim, &c->g, why, cap);
    if (st == LOOM_OK) st = gr_trie_for(s, vocab, &c->trie, why, cap);
    if (st == LOOM_OK && s->mask_cache > 0 && !(c->cache = mask_cache_new(s->mask_cache, vocab->size)))
        st = LOOM_ERR_NOMEM, snprintf(why, cap, "out of memory");
    if (st != LOOM_OK) compiled_free(c);
    else *out = c;
    return st;
}

static loom_status gr_compile(void *self, const char *lang, const char *text, size_t len, const loom_vocab_view *vocab,
                              void **grammar, loom_error *err) {
    gr_self *s = self;
    const loom_host *h = s->host;
    char why[LOOM_ERROR_MSG_MAX - 64] = "";
    *grammar = NULL;
    if (!lang || !vocab || vocab->struct_size < sizeof(loom_vocab_view) || !vocab->piece || vocab->size <= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "constraint '%s': compile needs a language and a vocabulary",
                        GR_NAME);
    if (!text) text = "", len = 0;
    pthread_mutex_lock(&s->mu);
    gram_compiled *c = shared_take(s, vocab, lang, text, len);
    pthread_mutex_unlock(&s->mu);
    if (c) {
        *grammar = c;
        return LOOM_OK;
    }
    /* compiled outside the lock (a large grammar takes a while); two
     * requests racing on one new text each compile, and both are shared */
    loom_status st = compile_new(s, lang, text, len, vocab, &c, why, sizeof why);
    if (st != LOOM_OK) return h->error(h->ctx, err, st, "constraint '%s' (%s): %s", GR_NAME, lang, why);
    pthread_mutex_lock(&s->mu);
    shared_add(s, c, lang, text, len);
    pthread_mutex_unlock(&s->mu);
    *grammar = c;
    return LOOM_OK;
}

static void gr_grammar_free(void *self, void *grammar) {
    gr_self *s = self;
    gram_compiled *c = grammar;
    if (!c) return;
    if (!c->shared) {
        compiled_free(c);
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->n_shared; i++)
        if (s->shared[i].c == c && --s->shared[i].refs == 0) s->shared[i].last_used = ++s->clock;
    shared_trim(s);
    pthread_mutex_unlock(&s->mu);
}

static loom_status gr_matcher_new(void *self, void *grammar, void **matcher, loom_error *err) {
    gr_self *s = self;
    char why[256];
    gmatch *m = NULL;
    *matcher = NULL;
    if (!grammar)
        return s->host->error(s->host->ctx, err, LOOM_ERR_INVALID, "constraint '%s': matcher_new: no grammar",
                              GR_NAME);
    loom_status st = gmatch_new(grammar, &m, why, sizeof why);
    if (st != LOOM_OK)
        return s->host->error(s->host->ctx, err, st, "constraint '%s' (%s): %s", GR_NAME,
                              ((const gram_compiled *)grammar)->what, why);
    *matcher = m;
    return LOOM_OK;
}

static void gr_matcher_free(void *self, void *matcher) {
    (void)self;
    gmatch_free(matcher);
}

static loom_status gr_fill_mask(void *self, void *matcher, uint32_t *mask, loom_error *err) {
    gr_self *s = self;
    char why[256];
    if (!matcher || !mask)
        return s->host->error(s->host->ctx, err, LOOM_ERR_INVALID, "constraint '%s': fill_mask: matcher and mask "
                              "are required", GR_NAME);
    loom_status st = gmatch_fill_mask(matcher, mask, why, sizeof why);
    if (st != LOOM_OK)
        return s->host->error(s->host->ctx, err, st, "constraint '%s' (%s): %s", GR_NAME, gmatch_grammar(matcher)->what,
                              why);
    return LOOM_OK;
}

static loom_status gr_accept(void *self, void *matcher, int32_t token, loom_error *err) {
    gr_self *s = self;
    if (matcher && gmatch_accept_token(matcher, token)) return LOOM_OK;
    if (matcher && gmatch_over_budget(matcher)) {
        const gram_compiled *c = gmatch_grammar(matcher);
        return s->host->error(s->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                              "constraint '%s' (%s): token %d took more than max_match_steps (%lld) parse-stack "
                              "expansion steps: the grammar is too ambiguous to match within the budget",
                              GR_NAME, c->what, token, (long long)c->lim.max_match_steps);
    }
    return s->host->error(s->host->ctx, err, LOOM_ERR_INVALID,
                          "constraint '%s': token %d does not continue the constrained text", GR_NAME, token);
}

static bool gr_can_end(void *self, const void *matcher) {
    (void)self;
    return matcher && gmatch_can_end(matcher);
}

static const loom_constraint_ops gr_ops = {
    .struct_size = sizeof(loom_constraint_ops),
    .create = gr_create,
    .destroy = gr_destroy,
    .compile = gr_compile,
    .grammar_free = gr_grammar_free,
    .matcher_new = gr_matcher_new,
    .matcher_free = gr_matcher_free,
    .fill_mask = gr_fill_mask,
    .accept = gr_accept,
    .can_end = gr_can_end,
    .rollback = NULL,
};

static const loom_component gr_components[] = {
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_CONSTRAINT,
        .name = GR_NAME,
        .summary = "structured outputs: JSON schema, any JSON object, regex, GBNF grammars, as per-step token masks",
        .ops = &gr_ops,
        .params = gr_params,
        .config_size = sizeof(gr_config),
    },
};

static const loom_plugin_desc gr_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-constraint-grammar",
    .version = "0.1.0",
    .num_components = 1,
    .components = gr_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &gr_desc; }
