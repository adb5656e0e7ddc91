/*
 * tests/spec/tspec_plugin.c — a test speculator built twice, to check how
 * the core calls the two proposal entry points (tests/spec/test_engine.c):
 *
 *   loom-speculator-tspec-single.so (-DTSPEC_SINGLE) a table without the
 *       OPTIONAL propose_batch: the core must go through propose() per
 *       sequence.
 *   loom-speculator-tspec-batch.so  a table with propose_batch; propose()
 *       counts calls the core should no longer make.
 *
 * Drafts (both): prompt lookup of the last token — the tokens that followed
 * its most recent earlier occurrence — enough for the tiny model's loops to
 * accept some. Deterministic (q_valid 0). plan() keeps a step's verified
 * rows within max_rows (default 16: the CPU backend's batch-invariant
 * GEMM), so greedy outputs must equal those without speculation bit for
 * bit.
 *
 * Metrics (host metric_add): tspec.propose_calls, tspec.batch_calls,
 * tspec.batch_seqs, tspec.batch_max (metric_set: the largest n seen).
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/spec.h"

typedef struct tspec_config {
    int64_t k;
    int64_t max_rows;
    bool fill;
} tspec_config;

static const loom_param tspec_params[] = {
    {"num_draft_tokens", LOOM_PARAM_INT, offsetof(tspec_config, k), "3", 1, 64, NULL, "k max"},
    {"max_rows", LOOM_PARAM_INT, offsetof(tspec_config, max_rows), "16", 0, 1 << 20, NULL,
     "batch x (k + 1) at most; 0 = no cap"},
    {"fill", LOOM_PARAM_BOOL, offsetof(tspec_config, fill), "false", 0, 0, NULL,
     "always propose max_k drafts, each (last token + vocab / 2) mod vocab: every KV slot the core "
     "allows, and (nearly) never accepted, so the sequences advance as without drafts"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct tspec {
    const loom_host *h;
    int32_t k;
    int32_t max_rows;
    bool fill;
    int32_t vocab;
    int64_t proposed, accepted;
    double batch_max;
} tspec;

static loom_status tspec_create(const loom_host *h, const void *config, void **self, loom_error *err) {
    (void)err;
    tspec *s = h->calloc(h->ctx, 1, sizeof *s);
    if (!s) return LOOM_ERR_NOMEM;
    s->h = h;
    s->k = (int32_t)((const tspec_config *)config)->k;
    s->max_rows = (int32_t)((const tspec_config *)config)->max_rows;
    s->fill = ((const tspec_config *)config)->fill;
    *self = s;
    return LOOM_OK;
}

static void tspec_destroy(void *self) {
    tspec *s = self;
    if (s) s->h->free(s->h->ctx, s);
}

static loom_status tspec_init(void *self, const loom_spec_init *init, loom_error *err) {
    (void)err;
    ((tspec *)self)->vocab = init->vocab_size;
    return LOOM_OK;
}

static int32_t tspec_plan(void *self, int32_t batch) {
    tspec *s = self;
    if (s->max_rows == 0) return s->k;
    int32_t k = s->max_rows / (batch > 0 ? batch : 1) - 1;
    return k < s->k ? (k > 0 ? k : 0) : s->k;
}

static int32_t tspec_draft(tspec *s, const loom_seq_info *seq, int32_t max_k, int32_t *draft) {
    int32_t n = seq->num_tokens, last = n - 1, k = max_k < s->k ? max_k : s->k;
    if (s->fill) {
        for (int32_t m = 0; m < k; m++) draft[m] = (seq->tokens[last] + s->vocab / 2) % s->vocab;
        s->proposed += k;
        return k;
    }
    for (int32_t j = last - 1; j >= 0; j--)
        if (seq->tokens[j] == seq->tokens[last]) {
            int32_t m = 0;
            while (m < k && j + 1 + m < n) draft[m] = seq->tokens[j + 1 + m], m++;
            s->proposed += m;
            return m;
        }
    return 0;
}

static int32_t tspec_propose(void *self, const loom_seq_info *seq, const loom_sampling_params *params,
                             int32_t max_k, int32_t *draft, float *q, int32_t *q_valid) {
    (void)params;
    (void)q;
    tspec *s = self;
    s->h->metric_add(s->h->ctx, "tspec.propose_calls", 1);
    if (q_valid) *q_valid = 0;
    return tspec_draft(s, seq, max_k, draft);
}

#ifndef TSPEC_SINGLE
static void tspec_propose_batch(void *self, int32_t n, const loom_seq_info *const *seqs,
                                const loom_sampling_params *const *params, const int32_t *max_k,
                                int32_t *const *draft, float *const *q, int32_t *q_valid, int32_t *num) {
    (void)params;
    (void)q;
    tspec *s = self;
    s->h->metric_add(s->h->ctx, "tspec.batch_calls", 1);
    s->h->metric_add(s->h->ctx, "tspec.batch_seqs", n);
    if (n > s->batch_max) s->h->metric_set(s->h->ctx, "tspec.batch_max", s->batch_max = n);
    for (int32_t i = 0; i < n; i++) {
        num[i] = tspec_draft(s, seqs[i], max_k[i], draft[i]);
        q_valid[i] = 0;
    }
}
#endif

static void tspec_observe(void *self, loom_seq_id seq, int32_t proposed, int32_t accepted) {
    (void)seq;
    (void)proposed;
    ((tspec *)self)->accepted += accepted;
}

static void tspec_release(void *self, loom_seq_id seq) {
    (void)self;
    (void)seq;
}

static void tspec_stats(void *self, loom_spec_stats *out) {
    tspec *s = self;
    out->proposed = s->proposed;
    out->accepted = s->accepted;
    out->steps_off = 0;
}

static const loom_spec_ops tspec_ops = {
    .struct_size = sizeof(loom_spec_ops),
    .create = tspec_create,
    .destroy = tspec_destroy,
    .init = tspec_init,
    .plan = tspec_plan,
    .propose = tspec_propose,
    .observe = tspec_observe,
    .release = tspec_release,
    .stats = tspec_stats,
#ifndef TSPEC_SINGLE
    .propose_batch = tspec_propose_batch,
#endif
};

#ifdef TSPEC_SINGLE
#define TSPEC_NAME "tspec-single"
#else
#define TSPEC_NAME "tspec-batch"
#endif

static const loom_component tspec_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SPECULATOR,
    .name = TSPEC_NAME,
    .summary = "test speculator (tests/spec/tspec_plugin.c)",
    .ops = &tspec_ops,
    .params = tspec_params,
    .config_size = sizeof(tspec_config),
}};

static const loom_plugin_desc tspec_desc = {
    .struct_size = sizeof(loom_plugin_desc),
    .abi_major = LOOM_ABI_MAJOR,
    .abi_minor = LOOM_ABI_MINOR,
    .build_signature = LOOM_BUILD_SIGNATURE,
    .name = "loom-speculator-" TSPEC_NAME,
    .version = "0.0.1",
    .num_components = 1,
    .components = tspec_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &tspec_desc; }
