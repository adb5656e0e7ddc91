/*
 * core/engine/score.c — teacher-forced scoring: one sequence's tokens
 * through the runner in chunks, the log-probability of each next token
 * under the model's raw distribution (and its most likely alternatives,
 * when asked). Uses the cache manager for slots like any sequence, and
 * frees them at the end. Two callers: loom_engine_score (perplexity, on an
 * idle engine) and a request's prompt_logprobs, scored between steps when
 * it is admitted.
 */
#include <math.h>
#include <stdlib.h>

#include "engine/engine_internal.h"
#include "util/util.h"

enum { SCORE_CHUNK = 256 };

static loom_status score_check(loom_engine *e, const int32_t *tokens, int32_t n, loom_error *err) {
    pthread_mutex_lock(&e->inbox_mu);
    int32_t active = e->active;
    pthread_mutex_unlock(&e->inbox_mu);
    if (active > 0)
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: %d requests are still running", active);
    if (n < 1 || n > e->max_model_len)
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: %d tokens do not fit the context (1..%d)", n,
                              e->max_model_len);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->vocab)
            return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: token %d at %d outside [0, %d)", tokens[i],
                                  i, e->vocab);
    return LOOM_OK;
}

/* Tokens [start, start + c) as one batch of sequence 0, every row wanted. */
static loom_batch score_batch(loom_engine *e, const int32_t *tokens, int32_t start, int32_t c) {
    for (int32_t i = 0; i < c; i++) {
        int32_t p = start + i;
        e->tok_ids[i] = tokens[p];
        e->positions[i] = p;
        e->logits_index[i] = i;
    }
    e->query_start[0] = 0;
    e->query_start[1] = c;
    e->context_len[0] = start + c;
    return (loom_batch){
        .struct_size = sizeof(loom_batch), .num_seqs = 1, .num_tokens = c, .token_ids = e->tok_ids,
        .positions = e->positions, .query_start = e->query_start, .context_len = e->context_len,
        .block_table = e->block_table, .block_table_stride = e->step_stride, .slot_mapping = e->slots,
        .num_logits = c, .logits_index = e->logits_index, .num_groups = e->num_groups,
        .group_window = e->group_window,
    };
}

/* Where a score goes: logprobs (n), and when k > 0 the k most likely
 * tokens of each position with their logprobs (n, k); row 0 untouched. */
typedef struct score_out {
    float *logprobs;
    int32_t k;
    int32_t *top_ids;
    float *top_lps;
} score_out;

static loom_status score_run(loom_engine *e, const loom_seq_info *info, const int32_t *tokens, int32_t n,
                             const score_out *o, loom_error *err) {
    loom_status st = engine_run_block_ops(e, err);
    if (st != LOOM_OK) return st;
    if (engine_step_buffers(e, 1, SCORE_CHUNK, e->bt_stride) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if ((st = engine_logits_room(e, SCORE_CHUNK, err)) != LOOM_OK) return st;
    e->step_stride = e->bt_stride;
    if ((st = engine_table_rows(e, info->id, 0, 1, n, err)) != LOOM_OK) return st;
    for (int32_t start = 0; start < n; start += SCORE_CHUNK) {
        int32_t c = n - start < SCORE_CHUNK ? n - start : SCORE_CHUNK;
        if ((st = engine_fill_slots(e, 0, 1, c, 0, start, start + c, err)) != LOOM_OK) return st;
        loom_batch batch = score_batch(e, tokens, start, c);
        if ((st = e->run.forward(e->run.self, &batch, e->logits, err)) != LOOM_OK) return st;
        for (int32_t i = 0; i < c && start + i + 1 < n; i++) {
            const float *row = e->logits + (size_t)i * e->vocab;
            const int32_t p = start + i + 1;
            o->logprobs[p] = engine_raw_logprob(row, e->vocab, tokens[p]);
            if (o->k > 0)
                engine_raw_top(row, e->vocab, o->k, o->top_ids + (size_t)p * o->k, o->top_lps + (size_t)p * o->k);
        }
    }
    return LOOM_OK;
}

/* Score tokens (n) as a sequence of its own: slots from the cache manager,
 * the forward in chunks, the slots freed (their full blocks stay in the
 * prefix cache). */
static loom_status score_tokens(loom_engine *e, const int32_t *tokens, int32_t n, const score_out *o,
                                loom_error *err) {
    loom_seq_info info = {
        .struct_size = sizeof info,
        .id = e->next_seq_id++,
        .request_id = -1,
        .num_prompt_tokens = n,
        .num_tokens = n,
        .max_total_tokens = n,
        .tokens = tokens,
    };
    loom_status st = e->cache->allocate(e->cache_self, &info, n, err);
    if (st == LOOM_ERR_NO_SPACE)
        return loom_error_set(err, LOOM_ERR_NO_SPACE,
                              "the KV cache cannot hold %d tokens to score now (%d blocks of %d, %d free): give the "
                              "cache more memory, score shorter texts, or retry when fewer requests run",
                              n, e->layout.num_blocks, e->layout.block_size,
                              e->cache->num_free_blocks(e->cache_self));
    if (st != LOOM_OK) return st;
    st = score_run(e, &info, tokens, n, o, err);
    e->cache->free(e->cache_self, info.id);
    return st;
}

/* How many of the prompt's tokens the prefix cache holds before scoring
 * registers the prompt's own blocks: a probe sequence takes the prefix and
 * drops it at once (the cache counts it as one more prefix query). The
 * request's cached_prompt_tokens is capped at this, so blocks it produced
 * itself are not reported as served by the cache. */
static int32_t cached_before_score(loom_engine *e, const loom_req *rq) {
    loom_seq_info probe = {
        .struct_size = sizeof probe,
        .id = e->next_seq_id++,
        .request_id = -1,
        .num_prompt_tokens = rq->prompt_len,
        .num_tokens = rq->prompt_len,
        .max_total_tokens = rq->prompt_len,
        .tokens = rq->prompt,
    };
    int32_t hit = e->cache->acquire_prefix(e->cache_self, &probe);
    e->cache->free(e->cache_self, probe.id);
    return hit;
}

loom_status engine_score_prompt(loom_engine *e, loom_req *rq, loom_error *err) {
    const int32_t n = rq->prompt_len, k = rq->r.params.logprobs;
    if (!rq->prompt_lp) rq->prompt_lp = malloc((size_t)n * sizeof *rq->prompt_lp);
    if (k > 0 && !rq->prompt_top_ids) { /* a retry (after NO_SPACE) reuses them */
        rq->prompt_top_ids = calloc((size_t)n * (size_t)k, sizeof *rq->prompt_top_ids);
        rq->prompt_top_lps = calloc((size_t)n * (size_t)k, sizeof *rq->prompt_top_lps);
    }
    if (!rq->prompt_lp || (k > 0 && (!rq->prompt_top_ids || !rq->prompt_top_lps)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for the logprobs of %d prompt tokens", n);
    rq->prompt_lp[0] = NAN;
    rq->prompt_num_top = k;
    score_out o = {rq->prompt_lp, k, rq->prompt_top_ids, rq->prompt_top_lps};
    rq->cached_before_score = cached_before_score(e, rq);
    loom_status st = score_tokens(e, rq->prompt, n, &o, err);
    rq->prompt_scored = st == LOOM_OK;
    return st;
}

loom_status loom_engine_score(loom_engine *e, const int32_t *tokens, int32_t n, float *logprobs, loom_error *err) {
    loom_status st = score_check(e, tokens, n, err);
    if (st != LOOM_OK) return st;
    logprobs[0] = 0.0f;
    score_out o = {.logprobs = logprobs};
    st = score_tokens(e, tokens, n, &o, err);
    if (st != LOOM_OK) loom_error_prefix(err, "loom_engine_score");
    return st;
}
