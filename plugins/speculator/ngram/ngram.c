/*
 * plugins/speculator/ngram/ngram.c — the "ngram" speculator: prompt-lookup
 * drafting (Saxena 2023; vLLM's ngram proposer). No extra model: the last
 * n tokens of a sequence are looked up earlier in its own tokens (the
 * prompt only, or the whole context), and what followed the most recent
 * occurrence is proposed as the draft. It pays on input-grounded work —
 * summarising, quoting, editing code, extraction — where the output copies
 * spans of the input; on free generation it rarely matches and then costs
 * nothing but the search.
 *
 * Deterministic: drafts are one-hot (q_valid = 0), so under sampling the
 * core accepts draft d with probability p(d) and the output still follows
 * the target distribution exactly.
 *
 * Cost: O(context * max_ngram) comparisons per propose() in the worst case
 * (a backwards scan, stopping at the first — most recent — match); a few
 * microseconds for contexts of a few thousand tokens, nothing next to a
 * forward pass. Per-sequence adaptive state lives in a table keyed by
 * sequence id (spec_adapt.h), dropped in release().
 *
 * Not here: suffix automata / suffix arrays over a corpus (REST), multiple
 * candidate continuations (tree drafts).
 */
#include "ngram.h"

#include <stddef.h>
#include <string.h>

#include "spec_adapt.h"

#define NGRAM_WHO "ngram"

/* ------------------------------------------------------------ parameters */

static const char *const ngram_search_choices[] = {"prompt", "context", NULL};

const loom_param loom_ngram_params[] = {
    {"num_draft_tokens", LOOM_PARAM_INT, offsetof(loom_ngram_config, num_draft_tokens), "4", 1, 64, NULL,
     "most draft tokens proposed per sequence per step (k; adaptive k stays in [1, this])"},
    {"min_ngram", LOOM_PARAM_INT, offsetof(loom_ngram_config, min_ngram), "1", 1, 64, NULL,
     "shortest suffix (tokens) looked up; must be <= max_ngram"},
    {"max_ngram", LOOM_PARAM_INT, offsetof(loom_ngram_config, max_ngram), "3", 1, 64, NULL,
     "longest suffix (tokens) looked up; longer suffixes are tried first"},
    {"search", LOOM_PARAM_ENUM, offsetof(loom_ngram_config, search), "context", 1, 0, ngram_search_choices,
     "where to look for the suffix: prompt (the prompt only) or context (prompt and output)"},
    {"adaptive", LOOM_PARAM_BOOL, offsetof(loom_ngram_config, adaptive), "true", 0, 0, NULL,
     "k follows each sequence's recent acceptance; sequences that accept nothing stop proposing and "
     "probe again later"},
    {"max_batch", LOOM_PARAM_INT, offsetof(loom_ngram_config, max_batch), "16", 0, 1 << 20, NULL,
     "speculation turns itself off for a step when more sequences than this decode; 0 = never"},
    {"max_verify_tokens", LOOM_PARAM_INT, offsetof(loom_ngram_config, max_verify_tokens), "0", 0, 1 << 20, NULL,
     "most positions verified per step, decoding sequences x (k + 1): k shrinks as the batch grows and "
     "speculation is off when not one draft per sequence fits; 0 = no cap"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* ------------------------------------------------------------------ state */

typedef struct ngram_spec {
    const loom_host *host;    /* borrowed until destroy                   */
    loom_ngram_config cfg;    /* copy of the bound config                 */
    spec_table seqs;          /* per-sequence adaptive state              */
    spec_counters c;          /* statistics                               */
} ngram_spec;

/* --------------------------------------------------------------- matcher */

int32_t loom_ngram_match(const int32_t *tokens, int32_t num_tokens, int32_t search_end, int32_t min_n,
                         int32_t max_n, int32_t max_k, int32_t *draft, int32_t *match_len) {
    if (match_len) *match_len = 0;
    if (!tokens || !draft || num_tokens < 2 || max_k <= 0 || min_n < 1) return 0;
    /* An occurrence must end before the suffix does, leaving a token after it. */
    int32_t end = search_end < num_tokens - 1 ? search_end : num_tokens - 1;
    if (max_n > end) max_n = end;
    const int32_t last = tokens[num_tokens - 1];
    for (int32_t n = max_n; n >= min_n; n--) {
        const int32_t *suffix = tokens + num_tokens - n;
        /* Most recent occurrence first: j + n <= end. */
        for (int32_t j = end - n; j >= 0; j--) {
            if (tokens[j + n - 1] != last) continue;
            int32_t i = n - 2;
            while (i >= 0 && tokens[j + i] == suffix[i]) i--;
            if (i >= 0) continue;
            int32_t from = j + n, avail = num_tokens - from;
            int32_t k = avail < max_k ? avail : max_k;
            memcpy(draft, tokens + from, (size_t)k * sizeof(int32_t));
            if (match_len) *match_len = n;
            return k;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------- ops */

static loom_status ngram_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    const loom_ngram_config *cfg = config;
    if (!cfg)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "speculator '%s': create: config is NULL",
                           NGRAM_WHO);
    if (cfg->min_ngram > cfg->max_ngram)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "speculator '%s': min_ngram %lld is larger than max_ngram %lld: make "
                           "min_ngram <= max_ngram",
                           NGRAM_WHO, (long long)cfg->min_ngram, (long long)cfg->max_ngram);
    ngram_spec *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "speculator '%s': out of memory", NGRAM_WHO);
    s->host = host;
    s->cfg = *cfg;
    *self = s;
    return LOOM_OK;
}

static void ngram_destroy(void *self) {
    ngram_spec *s = self;
    if (!s) return;
    const loom_host *h = s->host;
    spec_table_free(&s->seqs, h);
    h->free(h->ctx, s);
}

static loom_status ngram_init(void *self, const loom_spec_init *init, loom_error *err) {
    (void)self;
    (void)init;
    (void)err;
    return LOOM_OK; /* nothing to build: the drafts come from the sequence itself */
}

static int32_t ngram_plan(void *self, int32_t batch_size) {
    ngram_spec *s = self;
    return spec_adapt_plan(&s->c, s->host, NGRAM_WHO, (int32_t)s->cfg.num_draft_tokens, s->cfg.max_batch,
                           s->cfg.max_verify_tokens, batch_size);
}

static int32_t ngram_propose(void *self, const loom_seq_info *seq, const loom_sampling_params *params,
                             int32_t max_k, int32_t *draft, float *q, int32_t *q_valid) {
    (void)params;
    (void)q;
    ngram_spec *s = self;
    if (q_valid) *q_valid = 0;
    if (!s || !seq || !seq->tokens || !draft || max_k <= 0) return 0;
    spec_seq *st = spec_table_get(&s->seqs, s->host, seq->id);
    int32_t k = spec_adapt_k(&s->c, s->host, NGRAM_WHO, st, s->cfg.adaptive, (int32_t)s->cfg.num_draft_tokens,
                             max_k);
    if (k <= 0) return 0;
    /* The real tokens only (the core proposes before appending drafts). */
    int32_t ntok = seq->num_tokens - (seq->num_draft > 0 ? seq->num_draft : 0);
    int32_t search_end = s->cfg.search == LOOM_NGRAM_SEARCH_PROMPT ? seq->num_prompt_tokens : ntok - 1;
    int32_t n = loom_ngram_match(seq->tokens, ntok, search_end, (int32_t)s->cfg.min_ngram,
                                 (int32_t)s->cfg.max_ngram, k, draft, NULL);
    spec_adapt_proposed(&s->c, s->host, NGRAM_WHO, k, n);
    return n;
}

static void ngram_observe(void *self, loom_seq_id seq, int32_t proposed, int32_t accepted) {
    ngram_spec *s = self;
    if (!s) return;
    int32_t i = spec_table_find(&s->seqs, seq);
    spec_adapt_observe(&s->c, s->host, i >= 0 ? &s->seqs.slots[i] : NULL, proposed, accepted);
}

static void ngram_release(void *self, loom_seq_id seq) {
    ngram_spec *s = self;
    if (s) spec_table_remove(&s->seqs, seq);
}

static void ngram_stats(void *self, loom_spec_stats *out) {
    ngram_spec *s = self;
    if (s) spec_adapt_stats(&s->c, out);
}

const loom_spec_ops loom_ngram_ops = {
    .struct_size = sizeof(loom_spec_ops),
    .create = ngram_create,
    .destroy = ngram_destroy,
    .init = ngram_init,
    .plan = ngram_plan,
    .propose = ngram_propose,
    .observe = ngram_observe,
    .release = ngram_release,
    .stats = ngram_stats,
};
