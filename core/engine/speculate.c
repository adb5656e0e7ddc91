/*
 * core/engine/speculate.c — speculative decoding around the speculator
 * plugin: drafts before the step, verification after it (loom/spec.h).
 *
 * Before scheduling, every decoding sequence may get up to k drafts
 * appended (seq->info.num_draft counts them); the scheduler budgets them
 * like any token and the forward pass returns a logits row for the last
 * real token and each draft. Verification (spec_verify.c) accepts a prefix
 * of the drafts and adds one token of the target's own; the rejected
 * drafts' slots are rolled back through the cache manager's truncate().
 * Greedy requests whose rows came back as candidates are verified from
 * each row's argmax alone.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/spec_verify.h"
#include "util/util.h"

/* A sequence decoding this step: exactly one token not yet computed, no
 * drafts yet, past its first generated token. */
static bool spec_decoding(const loom_seq *s) {
    return !s->finished && s->info.num_draft == 0 && s->info.num_computed == s->info.num_tokens - 1 &&
           s->num_generated > 0;
}

/* Room for propose_batch's arguments for n sequences (one block). */
typedef struct spec_args {
    loom_seq **seqs;
    const loom_seq_info **infos;
    const loom_sampling_params **params;
    int32_t **draft;
    float **q;
    int32_t *max_k, *q_valid, *num;
    int32_t n;
} spec_args;

static loom_status spec_args_get(loom_engine *e, int32_t n, spec_args *a) {
    const size_t per = 5 * sizeof(void *) + 3 * sizeof(int32_t);
    if (n > e->spec_cap) {
        void *b = realloc(e->spec_buf, (size_t)n * per);
        if (!b) return LOOM_ERR_NOMEM;
        e->spec_buf = b;
        e->spec_cap = n;
    }
    char *p = e->spec_buf;
    const size_t c = (size_t)e->spec_cap;
    a->seqs = (loom_seq **)(void *)p, p += c * sizeof(void *);
    a->infos = (const loom_seq_info **)(void *)p, p += c * sizeof(void *);
    a->params = (const loom_sampling_params **)(void *)p, p += c * sizeof(void *);
    a->draft = (int32_t **)(void *)p, p += c * sizeof(void *);
    a->q = (float **)(void *)p, p += c * sizeof(void *);
    a->max_k = (int32_t *)(void *)p, p += c * sizeof(int32_t);
    a->q_valid = (int32_t *)(void *)p, p += c * sizeof(int32_t);
    a->num = (int32_t *)(void *)p;
    a->n = 0;
    return LOOM_OK;
}

/* Append the n drafts the speculator wrote after s's tokens (at most max_k). */
static loom_status spec_take(loom_engine *e, loom_seq *s, int32_t n, int32_t max_k, int32_t q_valid,
                             loom_error *err) {
    if (n <= 0) return LOOM_OK;
    if (n > max_k) n = max_k;
    for (int32_t d = 0; d < n; d++)
        if (s->tokens[s->info.num_tokens + d] < 0 || s->tokens[s->info.num_tokens + d] >= e->vocab)
            return loom_error_set(err, LOOM_ERR_INVALID, "speculator proposed token %d outside the vocabulary",
                                  s->tokens[s->info.num_tokens + d]);
    s->info.num_tokens += n;
    s->info.num_draft = n;
    s->spec_q_valid = q_valid != 0;
    e->stats.spec_proposed += n;
    return LOOM_OK;
}

/* How many drafts s may take: k, within its token budget and context (room
 * for the token verification adds), and within the slots left in its last
 * block plus `spare` whole blocks. */
static int32_t spec_max_k(const loom_engine *e, const loom_seq *s, int32_t k, int64_t spare, int32_t *slack) {
    const int32_t bs = e->layout.block_size;
    int32_t room_new = s->req->max_new - s->num_generated - 1;
    int32_t room_ctx = e->max_model_len - s->info.num_tokens - 1;
    int32_t max_k = k < room_new ? k : room_new;
    if (room_ctx < max_k) max_k = room_ctx;
    *slack = (bs - s->info.num_tokens % bs) % bs;
    int64_t fit = *slack + (spare > 0 ? spare * bs : 0);
    return fit < max_k ? (int32_t)fit : max_k;
}

/* Room for max_k drafts after s's tokens and their distributions. */
static loom_status spec_room(loom_engine *e, loom_seq *s, int32_t max_k, loom_error *err) {
    if (engine_seq_reserve(s, s->info.num_tokens + max_k) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for drafts");
    size_t qn = (size_t)max_k * (size_t)e->vocab;
    if (qn <= s->spec_q_cap) return LOOM_OK;
    float *q = realloc(s->spec_q, qn * sizeof(float));
    if (!q) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for draft distributions");
    s->spec_q = q;
    s->spec_q_cap = qn;
    return LOOM_OK;
}

/*
 * Before scheduling: drafts for every decoding sequence — in one
 * propose_batch call when the speculator has it, else one propose() per
 * sequence. Drafts use only KV blocks free now, after one block per
 * decoding sequence is set aside for its real token: speculation must never
 * make the scheduler preempt (or fail) a sequence that runs without it.
 * One at a time, each sequence's cap comes out of what the sequences before
 * it really drafted; a batch is capped before anyone drafts, so each is
 * charged the blocks its whole max_k would take (charging actual counts
 * could hand the same spare block to two sequences).
 */
loom_status engine_spec_propose(loom_engine *e, loom_error *err) {
    int32_t decoding = 0;
    for (int32_t i = 0; i < e->num_seqs; i++) decoding += spec_decoding(e->seqs[i]);
    if (decoding == 0) return LOOM_OK;
    int32_t k = e->spec->plan(e->spec_self, decoding);
    if (k <= 0) return LOOM_OK;
    const bool batch = e->spec->propose_batch != NULL;
    spec_args a = {0};
    if (batch && spec_args_get(e, decoding, &a) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for drafts");
    const int32_t bs = e->layout.block_size;
    int64_t spare = (int64_t)e->cache->num_free_blocks(e->cache_self) - decoding;
    for (int32_t i = 0; i < e->num_seqs; i++) {
        loom_seq *s = e->seqs[i];
        if (!spec_decoding(s)) continue;
        int32_t slack, max_k = spec_max_k(e, s, k, spare, &slack);
        if (max_k <= 0) continue;
        loom_status st = spec_room(e, s, max_k, err);
        if (st != LOOM_OK) return st;
        int32_t *draft = s->tokens + s->info.num_tokens;
        if (batch) {
            if (max_k > slack) spare -= (max_k - slack + bs - 1) / bs;
            int32_t j = a.n++;
            a.seqs[j] = s, a.infos[j] = &s->info, a.params[j] = &s->req->r.params, a.max_k[j] = max_k;
            a.draft[j] = draft, a.q[j] = s->spec_q, a.q_valid[j] = 0, a.num[j] = 0;
            continue;
        }
        int32_t q_valid = 0;
        int32_t n = e->spec->propose(e->spec_self, &s->info, &s->req->r.params, max_k, draft, s->spec_q, &q_valid);
        if (n > max_k) n = max_k;
        if ((st = spec_take(e, s, n, max_k, q_valid, err)) != LOOM_OK) return st;
        if (n > slack) spare -= (n - slack + bs - 1) / bs;
    }
    if (a.n == 0) return LOOM_OK;
    e->spec->propose_batch(e->spec_self, a.n, a.infos, a.params, a.max_k, a.draft, a.q, a.q_valid, a.num);
    for (int32_t i = 0; i < a.n; i++) {
        loom_status st = spec_take(e, a.seqs[i], a.num[i], a.max_k[i], a.q_valid[i], err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* Drop a sequence's drafts, keeping what was computed of its real tokens. */
void engine_spec_drop(loom_engine *e, loom_seq *s) {
    int32_t real = s->info.num_tokens - s->info.num_draft;
    s->info.num_tokens = real;
    s->info.num_draft = 0;
    /* The last real token is recomputed so it gets logits again. */
    if (s->info.num_computed > real - 1) s->info.num_computed = real - 1;
    e->cache->truncate(e->cache_self, &s->info, s->info.num_computed);
}

/* After verifying s's n drafts: tell the speculator, count, and roll the
 * sequence back to its real tokens plus the `accepted` drafts, whose K/V
 * stay (the rest of the drafts' slots are freed). The caller then appends
 * the accepted tokens and the target's own. */
static void spec_settle(loom_engine *e, loom_seq *s, int32_t n, int32_t accepted) {
    const int32_t real = s->info.num_tokens - n;
    e->spec->observe(e->spec_self, s->info.id, n, accepted);
    e->stats.spec_accepted += accepted;
    s->info.num_tokens = real;
    s->info.num_draft = 0;
    s->info.num_computed = real + accepted;
    e->cache->truncate(e->cache_self, &s->info, s->info.num_computed);
}

/* After the forward: verify s's drafts against rows (num_draft + 1, vocab)
 * of raw logits and append what was accepted plus one token. */
loom_status engine_spec_accept(loom_engine *e, loom_seq *s, const float *rows, loom_error *err) {
    int32_t n = s->info.num_draft;
    int32_t real = s->info.num_tokens - n;
    float *p = engine_scratch_rows(e, n + 1);
    int32_t *out = malloc((size_t)(n + 1) * 2 * sizeof(int32_t));
    if (!p || !out) {
        free(out);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory verifying drafts");
    }
    int32_t *draft = out + n + 1;
    memcpy(draft, s->tokens + real, (size_t)n * sizeof(int32_t));
    /* p_i: what the sampler would draw from after real tokens + drafts[0..i). */
    memcpy(p, rows, (size_t)(n + 1) * e->vocab * sizeof(float));
    for (int32_t i = 0; i <= n; i++) {
        loom_sample_row sr = engine_sample_row(s, real + i);
        loom_status st = e->smp->probs(e->smp_self, p + (size_t)i * e->vocab, e->vocab, &sr, err);
        if (st != LOOM_OK) {
            free(out);
            loom_error_prefix(err, "sampler probs");
            return st;
        }
    }
    int32_t accepted = 0;
    int32_t m = loom_spec_verify(p, s->spec_q_valid ? s->spec_q : NULL, draft, n, e->vocab, s->rng, out, &accepted);
    spec_settle(e, s, n, accepted);
    const int32_t want = s->req->r.params.logprobs;
    for (int32_t i = 0; i < m && !s->finished; i++) {
        const float *row = rows + (size_t)i * e->vocab;
        engine_top top;
        engine_token t = {.id = out[i], .top_ids = top.ids, .top_logprobs = top.lps};
        if (want > 0) {
            t.logprob = engine_raw_logprob(row, e->vocab, out[i]);
            t.num_top = engine_raw_top(row, e->vocab, want, top.ids, top.lps);
        }
        s->cur_probs = s->req->r.want_probs ? p + (size_t)i * e->vocab : NULL;
        engine_accept_token(e, s, &t);
    }
    s->cur_probs = NULL;
    if (!s->finished) s->info.num_computed = s->info.num_tokens - 1;
    free(out);
    return LOOM_OK;
}

/* Greedy verification from forward_topk candidates (ids/vals: (n + 1, k)
 * rows, lse: (n + 1)): a draft is accepted while it is its row's argmax,
 * then the argmax of the first rejected (or the bonus) row is appended —
 * what engine_spec_accept computes for greedy rows, without whole rows. */
void engine_spec_accept_greedy(loom_engine *e, loom_seq *s, const int32_t *ids, const float *vals, const float *lse,
                               int32_t k) {
    const int32_t n = s->info.num_draft, real = s->info.num_tokens - n;
    int32_t a = 0;
    while (a < n && s->tokens[real + a] == ids[(size_t)a * k]) a++;
    spec_settle(e, s, n, a);
    const int32_t want = s->req->r.params.logprobs, ntop = want < k ? want : k;
    for (int32_t i = 0; i <= a && !s->finished; i++) {
        const int32_t *ri = ids + (size_t)i * k;
        const float *rv = vals + (size_t)i * k;
        engine_top top;
        for (int32_t j = 0; j < ntop; j++) top.ids[j] = ri[j], top.lps[j] = rv[j] - lse[i];
        engine_token t = {.id = ri[0], .logprob = want > 0 ? rv[0] - lse[i] : 0.0f, .num_top = ntop,
                          .top_ids = top.ids, .top_logprobs = top.lps};
        engine_accept_token(e, s, &t);
    }
    if (!s->finished) s->info.num_computed = s->info.num_tokens - 1;
}
