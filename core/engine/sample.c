/*
 * core/engine/sample.c — logits rows to tokens through the sampler plugin:
 * which rows may be reduced to candidates on the device, one sample()
 * call per kind of row, the forks of n > 1 requests, and the raw logprobs
 * the engine reports itself (for tokens that come from verification).
 *
 * A row reaches the sampler as candidates (its best k logits with their
 * ids and the whole row's log-sum-exp, loom/sampler.h) only when the
 * sampler declared, for that request, how many it needs
 * (loom_sampler_ops.candidates) and the engine itself needs nothing more of
 * the row: not the first token of an n > 1 request (its forks draw from the
 * same raw row), not a request that wants its distribution, not sampled
 * draft verification. Every other row arrives whole.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "plugin/host_rules.h"
#include "util/util.h"

/* ------------------------------------------------------------ raw rows */

static double row_lse(const float *x, int32_t n) {
    double mx = -INFINITY, z = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (!(mx > -INFINITY)) return mx;
    for (int32_t i = 0; i < n; i++) z += exp((double)x[i] - mx);
    return mx + log(z);
}

float engine_raw_logprob(const float *row, int32_t vocab, int32_t tok) {
    return (float)((double)row[tok] - row_lse(row, vocab));
}

int32_t engine_raw_top(const float *row, int32_t vocab, int32_t n, int32_t *ids, float *lps) {
    if (n > LOOM_MAX_LOGPROBS) n = LOOM_MAX_LOGPROBS;
    if (n > vocab) n = vocab;
    if (n <= 0) return 0;
    float vals[LOOM_MAX_LOGPROBS], lse;
    loom_logits_topk_row(row, vocab, n, ids, vals, &lse);
    double z = row_lse(row, vocab);
    for (int32_t i = 0; i < n; i++) lps[i] = (float)((double)vals[i] - z);
    return n;
}

/* ----------------------------------------------------- which rows reduce */

/* The sampler's row for s, with the output history as of token `upto`. */
loom_sample_row engine_sample_row(loom_seq *s, int32_t upto) {
    return (loom_sample_row){.struct_size = sizeof(loom_sample_row),
                             .params = &s->req->r.params,
                             .prompt = s->tokens,
                             .prompt_len = s->info.num_prompt_tokens,
                             .output = s->tokens + s->info.num_prompt_tokens,
                             .output_len = upto - s->info.num_prompt_tokens,
                             .rng_state = s->rng,
                             .logit_bias = s->req->r.logit_bias,
                             .num_logit_bias = s->req->r.num_logit_bias,
                             .allowed = s->matcher && s->mask_live ? s->mask : NULL};
}

/* Candidates s's next logits row may be reduced to (> 0), or 0 when it
 * must come back whole. Rows that verify drafts: greedy verification needs
 * each row's argmax (and its logprobs) only; sampled verification needs
 * the whole distribution. A logit bias can lift any token into the top k,
 * so a biased row comes whole (loom/sampler.h); a constrained one comes
 * as candidates only when the runner masks them (ABI 2.4). */
int32_t engine_row_candidates(const loom_engine *e, const loom_seq *s, int32_t kmax) {
    const loom_req *rq = s->req;
    const loom_sampling_params *p = &rq->r.params;
    if (!e->device_sampling || !rq->forked || rq->r.want_probs || rq->r.num_logit_bias > 0) return 0;
    /* a masked row's candidates are its best allowed tokens: logprob
     * alternatives, which report the raw row, need it whole */
    if (s->matcher && (!e->device_masks || p->logprobs > 0)) return 0;
    int32_t k = e->smp->candidates(e->smp_self, p);
    if (s->info.num_draft > 0) {
        if (p->temperature != 0.0f || k <= 0) return 0;
        k = p->logprobs > 1 ? p->logprobs : 1;
    }
    return k > 0 && k <= kmax ? k : 0;
}

/* --------------------------------------------------------------- forks */

/* Sample k of rq could not be forked (why: le): it (c, when it was already
 * tracked and counted live) and the samples after it, which will never be
 * created, end with an error event, releasing what they took; the parent
 * and the samples before k go on, and so does the engine. */
static void fork_failed(loom_engine *e, loom_req *rq, int32_t k, loom_seq *c, loom_error *le) {
    loom_error_prefix(le, "forking sample %d of request %lld", k, (long long)rq->id);
    if (c) engine_seq_finish(e, c, LOOM_FINISH_ERROR, le->message);
    engine_end_unstarted(rq, c ? k + 1 : k, LOOM_FINISH_ERROR, le->message);
}

/* Create, fork and schedule sample k of parent's request. NULL (with le
 * set) when that failed; what was taken is released by fork_failed. */
static loom_seq *fork_one(loom_engine *e, loom_seq *parent, int32_t k, loom_seq **tracked, loom_error *le) {
    loom_req *rq = parent->req;
    *tracked = NULL;
    loom_seq *c = engine_seq_new(e, rq, k);
    if (!c || engine_track_seq(e, c) != LOOM_OK) {
        loom_engine_seq_free(c);
        loom_error_set(le, LOOM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    rq->seqs[k] = c;
    rq->live++;
    *tracked = c;
    c->info.num_computed = parent->info.num_computed;
    if (e->cache->fork(e->cache_self, parent->info.id, c->info.id, le) != LOOM_OK) return NULL;
    if (e->sch->add(e->sch_self, &c->info, le) != LOOM_OK) {
        loom_error_prefix(le, "scheduler");
        return NULL;
    }
    return c;
}

/* After the first sample's prompt has logits (row: whole and raw): make
 * samples 1..n-1 share its blocks and give each its own first token from
 * the same row. A sample that cannot be forked (the cache has no room —
 * an ordinary NO_SPACE — or the scheduler refuses it) ends alone, with the
 * samples not yet created; only a sampler failure fails the step. */
static loom_status fork_samples(loom_engine *e, loom_seq *parent, const float *row, loom_error *err) {
    loom_req *rq = parent->req;
    rq->forked = true;
    float *x = malloc((size_t)e->vocab * sizeof(float));
    if (!x) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory forking samples");
    loom_status st = LOOM_OK;
    for (int32_t k = 1; k < rq->n && st == LOOM_OK; k++) {
        loom_error le = {0};
        loom_seq *tracked, *c = fork_one(e, parent, k, &tracked, &le);
        if (!c) {
            fork_failed(e, rq, k, tracked, &le);
            break;
        }
        memcpy(x, row, (size_t)e->vocab * sizeof(float));
        engine_top top;
        engine_token t = {0};
        st = engine_sample_one(e, c, x, &top, &t, err);
        const char *refused = st == LOOM_OK ? engine_constraint_check_token(c, t.id) : NULL;
        if (refused) engine_seq_finish(e, c, LOOM_FINISH_ERROR, refused);
        else if (st == LOOM_OK) engine_accept_token(e, c, &t);
    }
    free(x);
    return st;
}

/* ------------------------------------------------------------ sampling */

/* Logprob alternatives of n rows as loom/sampler.h pads them (-1, -inf),
 * before sample() runs: a sampler that writes fewer (or none) leaves
 * padding in the events, not what the memory held before. */
static void pad_alternatives(int32_t *ids, float *lps, int32_t n) {
    for (size_t i = 0; i < (size_t)n * LOOM_MAX_LOGPROBS; i++) {
        ids[i] = -1;
        lps[i] = -INFINITY;
    }
}

/* One whole row for s through the sampler (x is modified): t->id and, when
 * the request asked, its logprobs, with t's arrays pointing into `top`. */
loom_status engine_sample_one(loom_engine *e, loom_seq *s, float *x, engine_top *top, engine_token *t,
                              loom_error *err) {
    loom_status st = engine_constraint_fill(e, s, err);
    if (st != LOOM_OK) return st;
    loom_sample_row row = engine_sample_row(s, s->info.num_tokens);
    const loom_sample_row *rows[1] = {&row};
    loom_sample_batch b = {.struct_size = sizeof b, .n = 1, .vocab = e->vocab, .width = e->vocab, .logits = x,
                           .rows = rows};
    const bool want_lp = s->req->r.params.logprobs > 0;
    loom_sample_out o = {.struct_size = sizeof o, .tokens = &t->id, .logprobs = want_lp ? &t->logprob : NULL,
                         .top_ids = want_lp ? top->ids : NULL, .top_logprobs = want_lp ? top->lps : NULL};
    t->logprob = 0.0f;
    if (want_lp) pad_alternatives(top->ids, top->lps, 1);
    st = e->smp->sample(e->smp_self, &b, &o, err);
    if (st != LOOM_OK) return st;
    t->num_top = want_lp ? s->req->r.params.logprobs : 0;
    t->top_ids = top->ids;
    t->top_logprobs = top->lps;
    return engine_check_token(e, t->id, err);
}

loom_status engine_check_token(const loom_engine *e, int32_t tok, loom_error *err) {
    if (tok >= 0 && tok < e->vocab) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_INTERNAL, "sampler chose token %d outside the vocabulary [0, %d)", tok,
                          e->vocab);
}

/* A new request's parameters through the sampler's check(), or one dry
 * sample() of a flat whole row when it has none; either way the request's
 * random stream is left as it was. */
loom_status engine_sampler_check(loom_engine *e, loom_seq *s, loom_error *err) {
    uint64_t saved[4];
    memcpy(saved, s->rng, sizeof saved);
    loom_status st;
    if (LOOM_HAS_FIELD(e->smp, loom_sampler_ops, check) && e->smp->check) {
        const loom_sample_row r = engine_sample_row(s, s->info.num_tokens);
        st = e->smp->check(e->smp_self, &r, e->vocab, err);
    } else {
        float *row = calloc((size_t)e->vocab, sizeof(float));
        if (!row) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory checking sampling parameters");
        engine_top top;
        engine_token t = {0};
        st = engine_sample_one(e, s, row, &top, &t, err);
        free(row);
    }
    memcpy(s->rng, saved, sizeof saved);
    return st;
}

/* Scratch for n rows of one sample() call. */
typedef struct sample_scratch {
    loom_sample_row *rows;
    const loom_sample_row **ptrs;
    int32_t *toks, *top_ids;
    float *lps, *top_lp;
    float *first_rows; /* raw rows of requests about to fork (whole rows only) */
    float *probs;      /* distributions of want_probs requests (whole rows only) */
} sample_scratch;

static void scratch_free(sample_scratch *sc) {
    free(sc->rows);
    free(sc->ptrs);
    free(sc->toks);
    free(sc->top_ids);
    free(sc->lps);
    free(sc->top_lp);
    free(sc->first_rows);
}

static loom_status scratch_get(sample_scratch *sc, int32_t n, loom_error *err) {
    *sc = (sample_scratch){0};
    sc->rows = calloc((size_t)n, sizeof *sc->rows);
    sc->ptrs = calloc((size_t)n, sizeof *sc->ptrs);
    sc->toks = malloc((size_t)n * sizeof(int32_t));
    sc->lps = calloc((size_t)n, sizeof(float));
    sc->top_ids = malloc((size_t)n * LOOM_MAX_LOGPROBS * sizeof(int32_t));
    sc->top_lp = malloc((size_t)n * LOOM_MAX_LOGPROBS * sizeof(float));
    if (sc->rows && sc->ptrs && sc->toks && sc->lps && sc->top_ids && sc->top_lp) return LOOM_OK;
    scratch_free(sc);
    return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory sampling %d rows", n);
}

/* What whole rows must keep before sample() rewrites them: the raw rows of
 * requests about to fork, and the distributions want_probs requests asked
 * for (the sampler's probs() of the raw row). */
static loom_status keep_raw(loom_engine *e, const float *logits, loom_seq **seqs, int32_t n, sample_scratch *sc,
                            loom_error *err) {
    bool fork = false, want = false;
    for (int32_t r = 0; r < n; r++) {
        fork |= !seqs[r]->req->forked;
        want |= seqs[r]->req->r.want_probs;
    }
    size_t bytes = (size_t)n * (size_t)e->vocab * sizeof(float);
    if (fork) {
        if (!(sc->first_rows = malloc(bytes))) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        memcpy(sc->first_rows, logits, bytes);
    }
    if (!want) return LOOM_OK;
    if (!(sc->probs = engine_scratch_rows(e, n))) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    for (int32_t r = 0; r < n; r++) {
        if (!seqs[r]->req->r.want_probs) continue;
        float *pr = sc->probs + (size_t)r * e->vocab;
        memcpy(pr, logits + (size_t)r * e->vocab, (size_t)e->vocab * sizeof(float));
        loom_status st = e->smp->probs(e->smp_self, pr, e->vocab, sc->ptrs[r], err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* Sample rows [0, n) of `logits` (width floats each), one per sequence in
 * seqs, in one sample() call, and accept each token. Whole rows: width ==
 * vocab, cand == lse == NULL. Candidate rows: cand (n, width) and lse (n)
 * from forward_topk. */
loom_status engine_sample_rows(loom_engine *e, float *logits, int32_t width, loom_seq **seqs, int32_t n,
                               const int32_t *cand, const float *lse, loom_error *err) {
    sample_scratch sc;
    loom_status st = scratch_get(&sc, n, err);
    if (st != LOOM_OK) return st;
    bool want_lp = false; /* the full log-softmax is paid only when asked for */
    for (int32_t r = 0; r < n && st == LOOM_OK; r++) {
        if (!seqs[r]->mask_ready) st = engine_constraint_fill(e, seqs[r], err);
        seqs[r]->mask_ready = false;
        sc.rows[r] = engine_sample_row(seqs[r], seqs[r]->info.num_tokens);
        sc.ptrs[r] = &sc.rows[r];
        want_lp |= seqs[r]->req->r.params.logprobs > 0;
    }
    if (st == LOOM_OK && !cand) st = keep_raw(e, logits, seqs, n, &sc, err);
    loom_sample_batch b = {.struct_size = sizeof b, .n = n, .vocab = e->vocab, .width = width, .logits = logits,
                           .rows = sc.ptrs, .candidates = cand, .lse = lse};
    loom_sample_out o = {.struct_size = sizeof o, .tokens = sc.toks, .logprobs = want_lp ? sc.lps : NULL,
                         .top_ids = want_lp ? sc.top_ids : NULL, .top_logprobs = want_lp ? sc.top_lp : NULL};
    if (want_lp) pad_alternatives(sc.top_ids, sc.top_lp, n);
    if (st == LOOM_OK && (st = e->smp->sample(e->smp_self, &b, &o, err)) != LOOM_OK) loom_error_prefix(err, "sampler");
    for (int32_t r = 0; r < n && st == LOOM_OK; r++) {
        loom_seq *s = seqs[r];
        if ((st = engine_check_token(e, sc.toks[r], err)) != LOOM_OK) break;
        /* Fork before sample 0 takes its token, so every sample starts
         * from the prompt alone. */
        if (!s->req->forked && (st = fork_samples(e, s, sc.first_rows + (size_t)r * width, err)) != LOOM_OK) break;
        const char *refused = engine_constraint_check_token(s, sc.toks[r]);
        if (refused) {
            engine_seq_finish(e, s, LOOM_FINISH_ERROR, refused);
            continue;
        }
        engine_token t = {.id = sc.toks[r], .logprob = sc.lps[r], .num_top = s->req->r.params.logprobs,
                          .top_ids = sc.top_ids + (size_t)r * LOOM_MAX_LOGPROBS,
                          .top_logprobs = sc.top_lp + (size_t)r * LOOM_MAX_LOGPROBS};
        s->cur_probs = sc.probs && s->req->r.want_probs ? sc.probs + (size_t)r * e->vocab : NULL;
        engine_accept_token(e, s, &t);
        s->cur_probs = NULL;
    }
    scratch_free(&sc);
    return st;
}
