/*
 * plugins/speculator/draft-model/draft_model.c — the "draft-model"
 * speculator: drafts come from a second loom engine built from any pipeline
 * YAML — a smaller model with the same tokenizer, or the target itself
 * through a cheaper path (e.g. the int4 quantizer: self-speculation).
 *
 * How a proposal runs: the draft engine gets one request per sequence whose
 * prompt is the sequence's tokens so far (token ids, no tokenizer
 * involved), with the target request's sampling parameters (seed forced,
 * derived from the sequence id and length, so drafts are reproducible),
 * max_tokens = k and ignore_eos; the plugin steps the draft engine until
 * the requests end and collects their tokens — and, when sampling
 * (temperature > 0), the distribution each was drawn from (want_probs),
 * which the core's verifier needs as q. Greedy drafts are deterministic:
 * q_valid = 0 (one-hot).
 *
 * Batched (propose_batch): the core hands every decoding sequence
 * of a step over at once; all their requests go into the draft engine
 * together, whose continuous batching then runs them side by side — the
 * tails' prefill in one step and each draft position as one batched decode
 * step, ~k + 1 draft steps per target step instead of n x (k + 1).
 * propose() is the same code with n = 1. A request's tokens, seed and
 * parameters do not depend on what else is in the batch, so the drafts are
 * the per-sequence ones up to the draft backend's batch invariance (on the
 * CPU backend a step of more than 16 rows takes another GEMM whose sums
 * round differently: a near-tie draft token could flip — never the
 * output, which verification decides).
 *
 * The draft engine keeps its own KV cache. Each proposal is a fresh
 * request, so what keeps it cheap is the draft cache's prefix caching: every
 * full block of the context from the previous proposal is found again and
 * only the tail (< block_size tokens plus the newly accepted ones) is
 * recomputed. Keep `cache.prefix_caching: true` (the paged cache's default)
 * in the draft pipeline; without it every proposal re-reads the whole
 * context.
 *
 * The draft pipeline's own `speculator` section is always switched off
 * (an override "speculator=null" goes first), so a pipeline may name
 * itself as its draft without recursing.
 *
 * Threads: everything is [engine]; the draft engine is stepped on the
 * target's step-loop thread, inside propose() / propose_batch(), and its
 * token callbacks run there too.
 *
 * Not here: tree drafts, a draft that runs ahead asynchronously (each
 * step's proposals run to completion before the target's forward).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "loom/engine.h"
#include "loom/spec.h"

#include "spec_adapt.h"

#define DRAFT_WHO "draft-model"
#define DRAFT_MAX_OVERRIDES 32

/* ------------------------------------------------------------ parameters */

/* Filled by the host from draft_params. */
typedef struct draft_config {
    char pipeline[LOOM_PARAM_STRING_MAX];  /* draft YAML, relative to the main YAML's dir  */
    int64_t num_draft_tokens;              /* k max                                        */
    bool adaptive;                         /* k follows acceptance                         */
    int64_t max_batch;                     /* plan() returns 0 above this; 0 = never       */
    int64_t max_verify_tokens;             /* batch * (k+1) per step, at most; 0 = no cap  */
    char overrides[LOOM_PARAM_STRING_MAX]; /* "a.b=v;c.d=w" applied to the draft pipeline  */
} draft_config;

static const loom_param draft_params[] = {
    {"pipeline", LOOM_PARAM_STRING, offsetof(draft_config, pipeline), NULL, 1, 0, NULL,
     "the draft's pipeline YAML (same tokenizer as the target); relative to the main YAML's directory"},
    {"num_draft_tokens", LOOM_PARAM_INT, offsetof(draft_config, num_draft_tokens), "4", 1, 64, NULL,
     "most draft tokens proposed per sequence per step (k; adaptive k stays in [1, this])"},
    {"adaptive", LOOM_PARAM_BOOL, offsetof(draft_config, adaptive), "true", 0, 0, NULL,
     "k follows each sequence's recent acceptance; sequences that accept nothing stop proposing and "
     "probe again later"},
    {"max_batch", LOOM_PARAM_INT, offsetof(draft_config, max_batch), "8", 0, 1 << 20, NULL,
     "speculation turns itself off for a step when more sequences than this decode; 0 = never"},
    {"max_verify_tokens", LOOM_PARAM_INT, offsetof(draft_config, max_verify_tokens), "0", 0, 1 << 20, NULL,
     "most positions verified per step, decoding sequences x (k + 1): k shrinks as the batch grows and "
     "speculation is off when not one draft per sequence fits; 0 = no cap"},
    {"overrides", LOOM_PARAM_STRING, offsetof(draft_config, overrides), "", 1, 0, NULL,
     "';'-separated KEY.PATH=VALUE overrides for the draft pipeline, e.g. "
     "\"cache.memory_gib=0.5;engine.threads=2\""},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* ------------------------------------------------------------------ state */

typedef struct draft_spec {
    const loom_host *host;        /* borrowed until destroy                     */
    draft_config cfg;             /* copy of the bound config                   */
    const loom_engine_api *api;   /* from init; borrowed                        */
    loom_engine *draft;           /* owned; NULL before init / after failure    */
    int32_t vocab;                /* shared by target and draft                 */
    int32_t draft_ctx;            /* draft engine's max_model_len, tokens       */
    bool broken;                  /* the draft engine failed: stop proposing    */
    bool warned_ctx;              /* logged "context too long for the draft"    */
    bool warned_fail;             /* logged a failed draft request at warn      */
    spec_table seqs;              /* per-sequence adaptive state                */
    spec_counters c;              /* statistics                                 */
    int64_t draft_steps;          /* draft engine steps run                     */
    int64_t rounds;               /* proposal rounds that stepped the draft     */
    int64_t requests;             /* draft requests those rounds ran            */

    /* The proposals in flight, one per sequence (filled by draft_on_token). */
    struct draft_slot *slots;     /* (slots_cap) host-allocated                 */
    int32_t slots_cap;
} draft_spec;

/* One sequence's proposal in flight. */
typedef struct draft_slot {
    draft_spec *s;
    int32_t *draft;               /* (k) borrowed from the core                 */
    float *q;                     /* (k, vocab) or NULL when not wanted         */
    int32_t k;                    /* tokens asked for                           */
    int32_t n;                    /* tokens received                            */
    bool added;                   /* the draft engine took the request          */
    bool stochastic;              /* temperature > 0: q rows wanted             */
    bool missing_q;               /* a token came without its distribution      */
    bool error;                   /* the request ended with an error            */
    char msg[160];                /* that error                                 */
} draft_slot;

/* ------------------------------------------------------------- callbacks */

static void draft_on_token(void *user, const loom_token_event *ev) {
    draft_slot *t = user;
    if (ev->finish == LOOM_FINISH_ERROR) {
        t->error = true;
        snprintf(t->msg, sizeof t->msg, "%s", ev->error ? ev->error : "unknown error");
    }
    if (ev->token < 0 || t->n >= t->k) return;
    t->draft[t->n] = ev->token;
    if (t->q) {
        const int32_t v = t->s->vocab;
        if (ev->probs && ev->vocab == v)
            memcpy(t->q + (size_t)t->n * (size_t)v, ev->probs, (size_t)v * sizeof(float));
        else
            t->missing_q = true;
    }
    t->n++;
}

/* ------------------------------------------------------------------- ops */

static loom_status draft_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    const draft_config *cfg = config;
    if (!cfg)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "speculator '%s': create: config is NULL",
                           DRAFT_WHO);
    if (!cfg->pipeline[0])
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "speculator '%s': `pipeline` is empty: name the draft's pipeline YAML, e.g. "
                           "`pipeline: ../default.yaml`",
                           DRAFT_WHO);
    draft_spec *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "speculator '%s': out of memory", DRAFT_WHO);
    s->host = host;
    s->cfg = *cfg;
    *self = s;
    return LOOM_OK;
}

static void draft_destroy(void *self) {
    draft_spec *s = self;
    if (!s) return;
    const loom_host *h = s->host;
    if (s->rounds > 0)
        h->log(h->ctx, LOOM_LOG_INFO, DRAFT_WHO,
               "draft engine: %lld rounds, %lld requests, %lld steps (%.2f sequences and %.2f steps a round)",
               (long long)s->rounds, (long long)s->requests, (long long)s->draft_steps,
               (double)s->requests / (double)s->rounds, (double)s->draft_steps / (double)s->rounds);
    if (s->draft && s->api) s->api->destroy(s->draft);
    spec_table_free(&s->seqs, h);
    if (s->slots) h->free(h->ctx, s->slots);
    h->free(h->ctx, s);
}

/* Split "a=1; b=2" into trimmed assignments in buf (modified in place);
 * returns how many were written to out (at most cap), -1 if more. */
static int32_t draft_split_overrides(char *buf, const char **out, int32_t cap) {
    int32_t n = 0;
    for (char *p = buf; p && *p;) {
        char *semi = strchr(p, ';');
        if (semi) *semi = '\0';
        while (*p == ' ' || *p == '\t') p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (*p) {
            if (n == cap) return -1;
            out[n++] = p;
        }
        p = semi ? semi + 1 : NULL;
    }
    return n;
}

static loom_status draft_init(void *self, const loom_spec_init *init, loom_error *err) {
    draft_spec *s = self;
    const loom_host *h = s->host;
    if (!init || init->struct_size < offsetof(loom_spec_init, engine_api) + sizeof init->engine_api ||
        !init->engine_api)
        return h->error(h->ctx, err, LOOM_ERR_ABI,
                        "speculator '%s': the host gave no engine API (loom_spec_init.engine_api): this "
                        "loom is too old to run a draft model",
                        DRAFT_WHO);
    const loom_engine_api *api = init->engine_api;
    if (!LOOM_HAS_FIELD(api, loom_engine_api, request_default))
        return h->error(h->ctx, err, LOOM_ERR_ABI,
                        "speculator '%s': engine API table is %u bytes, need %zu", DRAFT_WHO,
                        api->struct_size, offsetof(loom_engine_api, request_default) + sizeof api->request_default);

    /* The draft's path, relative to the main YAML's directory. */
    char path[2 * LOOM_PARAM_STRING_MAX + 8];
    if (s->cfg.pipeline[0] == '/' || !init->pipeline_dir || !init->pipeline_dir[0])
        snprintf(path, sizeof path, "%s", s->cfg.pipeline);
    else
        snprintf(path, sizeof path, "%s/%s", init->pipeline_dir, s->cfg.pipeline);

    char obuf[LOOM_PARAM_STRING_MAX];
    const char *ov[DRAFT_MAX_OVERRIDES + 1];
    ov[0] = "speculator=null"; /* a draft never speculates itself */
    snprintf(obuf, sizeof obuf, "%s", s->cfg.overrides);
    int32_t nov = draft_split_overrides(obuf, ov + 1, DRAFT_MAX_OVERRIDES);
    if (nov < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "speculator '%s': `overrides` has more than %d assignments", DRAFT_WHO,
                        DRAFT_MAX_OVERRIDES);

    loom_engine *d = NULL;
    loom_status st = api->create(path, ov, nov + 1, &d, err);
    if (st != LOOM_OK) {
        if (err) {
            char msg[LOOM_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->message);
            h->error(h->ctx, err, st, "speculator '%s': building the draft engine from %s: %s", DRAFT_WHO, path,
                     msg);
        }
        return st;
    }
    int32_t dv = api->vocab_size(d);
    if (dv != init->vocab_size) {
        api->destroy(d);
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "speculator '%s': the draft model (%s) has a vocabulary of %d tokens but the target "
                        "has %d: a draft must share the target's tokenizer; pick a draft from the same "
                        "model family",
                        DRAFT_WHO, path, dv, init->vocab_size);
    }
    s->api = api;
    s->draft = d;
    s->vocab = dv;
    s->draft_ctx = api->max_context(d);
    h->log(h->ctx, LOOM_LOG_INFO, DRAFT_WHO, "draft engine from %s: vocab %d, context %d, k <= %lld", path,
           dv, s->draft_ctx, (long long)s->cfg.num_draft_tokens);
    return LOOM_OK;
}

static int32_t draft_plan(void *self, int32_t batch_size) {
    draft_spec *s = self;
    if (!s->draft || s->broken) return 0;
    return spec_adapt_plan(&s->c, s->host, DRAFT_WHO, (int32_t)s->cfg.num_draft_tokens, s->cfg.max_batch,
                           s->cfg.max_verify_tokens, batch_size);
}

/* A seed for this proposal: the request's (or a fixed base) mixed with the
 * sequence id and its length, so the same context drafts the same way. */
static uint64_t draft_seed(const loom_sampling_params *p, const loom_seq_info *seq, int32_t ntok) {
    uint64_t z = (p->has_seed ? p->seed : 0x5eedd4af7ULL) ^ ((uint64_t)seq->id * 0xD1B54A32D192ED03ULL) ^
                 ((uint64_t)ntok * 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Prepare sequence seq's request into rq and slot t; false when it drafts
 * nothing this time (adaptive pause, no room in the draft's context, a
 * stochastic draft without room for q). Advances the adaptive state once,
 * as one propose() does. */
static bool draft_prepare(draft_spec *s, const loom_seq_info *seq, const loom_sampling_params *params,
                          int32_t max_k, int32_t *draft, float *q, loom_request *rq, draft_slot *t) {
    const loom_host *h = s->host;
    if (!seq || !seq->tokens || !draft || !params || max_k <= 0) return false;
    spec_seq *st = spec_table_get(&s->seqs, h, seq->id);
    int32_t k = spec_adapt_k(&s->c, h, DRAFT_WHO, st, s->cfg.adaptive, (int32_t)s->cfg.num_draft_tokens,
                             max_k);
    if (k <= 0) return false;
    int32_t ntok = seq->num_tokens - (seq->num_draft > 0 ? seq->num_draft : 0);
    int32_t room = s->draft_ctx - ntok;
    if (room < k) k = room;
    if (k <= 0) {
        if (!s->warned_ctx)
            h->log(h->ctx, LOOM_LOG_INFO, DRAFT_WHO,
                   "sequence of %d tokens does not fit the draft's context of %d: no drafts for it", ntok,
                   s->draft_ctx);
        s->warned_ctx = true;
        return false;
    }

    /* The target's sampling parameters, with a seed of our own. */
    *rq = s->api->request_default();
    /* An older caller's shorter struct keeps our defaults for the rest. */
    size_t psz = params->struct_size >= sizeof(uint32_t) && params->struct_size <= sizeof rq->params
                     ? params->struct_size
                     : sizeof rq->params;
    memcpy(&rq->params, params, psz);
    rq->params.struct_size = sizeof rq->params;
    rq->params.has_seed = true;
    rq->params.seed = draft_seed(params, seq, ntok);
    rq->params.logprobs = 0;
    bool stochastic = rq->params.temperature > 0;
    /* A stochastic draft without its q would bias the output: no drafts. */
    if (stochastic && !q) return false;
    rq->tokens = seq->tokens;
    rq->num_tokens = ntok;
    rq->max_tokens = k;
    rq->ignore_eos = true;
    rq->want_probs = stochastic;
    rq->on_token = draft_on_token;
    rq->user = t;

    memset(t, 0, sizeof *t);
    t->s = s;
    t->draft = draft;
    t->q = stochastic ? q : NULL;
    t->k = k;
    t->stochastic = stochastic;
    return true;
}

/* Room for n slots; false when out of memory. Slots are never in flight
 * here (every round runs to completion). */
static bool draft_slots_reserve(draft_spec *s, int32_t n) {
    if (n <= s->slots_cap) return true;
    const loom_host *h = s->host;
    int32_t cap = n > 2 * s->slots_cap ? n : 2 * s->slots_cap;
    draft_slot *ns = h->calloc(h->ctx, (size_t)cap, sizeof *ns);
    if (!ns) return false;
    if (s->slots) h->free(h->ctx, s->slots);
    s->slots = ns;
    s->slots_cap = cap;
    return true;
}

static void draft_propose_batch(void *self, int32_t n, const loom_seq_info *const *seqs,
                                const loom_sampling_params *const *params, const int32_t *max_k,
                                int32_t *const *draft, float *const *q, int32_t *q_valid, int32_t *num) {
    draft_spec *s = self;
    const loom_host *h = s->host;
    if (n <= 0 || !seqs || !params || !max_k || !draft || !num) return;
    for (int32_t i = 0; i < n; i++) {
        num[i] = 0;
        if (q_valid) q_valid[i] = 0;
    }
    if (!s->draft || s->broken) return;
    if (!draft_slots_reserve(s, n)) {
        h->log(h->ctx, s->warned_fail ? LOOM_LOG_DEBUG : LOOM_LOG_WARN, DRAFT_WHO,
               "out of memory for %d proposals (no drafts this step)", n);
        s->warned_fail = true;
        return;
    }

    /* Every sequence's request first, then one stepping loop for all. */
    int32_t added = 0;
    for (int32_t i = 0; i < n; i++) {
        draft_slot *t = &s->slots[i];
        t->added = false;
        loom_request rq;
        if (!draft_prepare(s, seqs[i], params[i], max_k[i], draft[i], q ? q[i] : NULL, &rq, t)) continue;
        loom_error err = {0};
        if (s->api->add_request(s->draft, &rq, &err) < 0) {
            h->log(h->ctx, s->warned_fail ? LOOM_LOG_DEBUG : LOOM_LOG_WARN, DRAFT_WHO,
                   "draft request refused (no drafts this step): %s", err.message);
            s->warned_fail = true;
            continue;
        }
        t->added = true;
        added++;
    }
    if (added == 0) return;
    int32_t active = 1;
    while (active > 0) {
        loom_error err = {0};
        loom_status rc = s->api->step(s->draft, &active, &err);
        s->draft_steps++;
        if (rc != LOOM_OK) {
            /* The draft engine's state is unknown now: stop using it. The
             * target carries on without speculation. */
            s->broken = true;
            h->log(h->ctx, LOOM_LOG_ERROR, DRAFT_WHO, "draft engine failed; speculation is off from now: %s",
                   err.message);
            return;
        }
    }
    s->rounds++;
    s->requests += added;
    h->metric_set(h->ctx, "spec.draft-model.draft_steps", (double)s->draft_steps);
    h->metric_set(h->ctx, "spec.draft-model.rounds", (double)s->rounds);
    h->metric_set(h->ctx, "spec.draft-model.requests", (double)s->requests);

    for (int32_t i = 0; i < n; i++) {
        draft_slot *t = &s->slots[i];
        if (!t->added) continue;
        int32_t got = t->n;
        if (t->error) {
            /* Warn once: a draft cache too small for long contexts fails
             * every proposal the same way. */
            h->log(h->ctx, s->warned_fail ? LOOM_LOG_DEBUG : LOOM_LOG_WARN, DRAFT_WHO,
                   "draft request failed (no drafts this step): %s", t->msg);
            s->warned_fail = true;
            got = 0;
        }
        if (t->stochastic && t->missing_q) got = 0;
        spec_adapt_proposed(&s->c, h, DRAFT_WHO, t->k, got);
        num[i] = got;
        if (q_valid) q_valid[i] = t->stochastic && got > 0;
        t->added = false;
    }
}

/* One sequence: the batch of one (the same requests, seeds and steps). */
static int32_t draft_propose(void *self, const loom_seq_info *seq, const loom_sampling_params *params,
                             int32_t max_k, int32_t *draft, float *q, int32_t *q_valid) {
    int32_t num = 0, qv = 0;
    draft_propose_batch(self, 1, &seq, &params, &max_k, &draft, &q, &qv, &num);
    if (q_valid) *q_valid = qv;
    return num;
}

static void draft_observe(void *self, loom_seq_id seq, int32_t proposed, int32_t accepted) {
    draft_spec *s = self;
    int32_t i = spec_table_find(&s->seqs, seq);
    spec_adapt_observe(&s->c, s->host, i >= 0 ? &s->seqs.slots[i] : NULL, proposed, accepted);
}

static void draft_release(void *self, loom_seq_id seq) {
    draft_spec *s = self;
    spec_table_remove(&s->seqs, seq);
}

static void draft_stats(void *self, loom_spec_stats *out) {
    draft_spec *s = self;
    spec_adapt_stats(&s->c, out);
}

/* ------------------------------------------------------------- descriptor */

static const loom_spec_ops draft_ops = {
    .struct_size = sizeof(loom_spec_ops),
    .create = draft_create,
    .destroy = draft_destroy,
    .init = draft_init,
    .plan = draft_plan,
    .propose = draft_propose,
    .observe = draft_observe,
    .release = draft_release,
    .stats = draft_stats,
    .propose_batch = draft_propose_batch,
};

static const loom_component draft_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SPECULATOR,
    .name = "draft-model",
    .summary = "drafts from a second loom pipeline (smaller model, same tokenizer, or the target "
               "quantized: self-speculation); adaptive k",
    .ops = &draft_ops,
    .params = draft_params,
    .config_size = sizeof(draft_config),
}};

static const loom_plugin_desc draft_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-speculator-draft-model",
    .version = "0.1.0",
    .num_components = 1,
    .components = draft_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &draft_desc; }
