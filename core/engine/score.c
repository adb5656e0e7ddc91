/*
 * core/engine/score.c — teacher-forced scoring (perplexity): one sequence's
 * tokens through the runner in chunks, the log-probability of each next
 * token under the model's raw distribution. Uses the cache manager for
 * slots like any sequence, and frees them at the end.
 */
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
    const int32_t bs = e->layout.block_size;
    for (int32_t i = 0; i < c; i++) {
        int32_t p = start + i;
        e->tok_ids[i] = tokens[p];
        e->positions[i] = p;
        e->slots[i] = (int64_t)e->block_table[p / bs] * bs + p % bs;
        e->logits_index[i] = i;
    }
    e->query_start[0] = 0;
    e->query_start[1] = c;
    e->context_len[0] = start + c;
    return (loom_batch){
        .struct_size = sizeof(loom_batch), .num_seqs = 1, .num_tokens = c, .token_ids = e->tok_ids,
        .positions = e->positions, .query_start = e->query_start, .context_len = e->context_len,
        .block_table = e->block_table, .block_table_stride = e->bt_stride, .slot_mapping = e->slots,
        .num_logits = c, .logits_index = e->logits_index,
    };
}

static loom_status score_run(loom_engine *e, const loom_seq_info *info, const int32_t *tokens, int32_t n,
                             float *logprobs, loom_error *err) {
    loom_status st = engine_run_block_ops(e, err);
    if (st != LOOM_OK) return st;
    if (engine_step_buffers(e, 1, SCORE_CHUNK, e->bt_stride) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if ((st = engine_logits_room(e, SCORE_CHUNK, err)) != LOOM_OK) return st;
    int32_t nb = e->cache->block_table(e->cache_self, info->id, e->block_table, e->bt_stride);
    for (int32_t k = nb; k < e->bt_stride; k++) e->block_table[k] = -1;
    logprobs[0] = 0.0f;
    for (int32_t start = 0; start < n; start += SCORE_CHUNK) {
        int32_t c = n - start < SCORE_CHUNK ? n - start : SCORE_CHUNK;
        loom_batch batch = score_batch(e, tokens, start, c);
        if ((st = e->run.forward(e->run.self, &batch, e->logits, err)) != LOOM_OK) return st;
        for (int32_t i = 0; i < c && start + i + 1 < n; i++)
            logprobs[start + i + 1] =
                engine_raw_logprob(e->logits + (size_t)i * e->vocab, e->vocab, tokens[start + i + 1]);
    }
    return LOOM_OK;
}

loom_status loom_engine_score(loom_engine *e, const int32_t *tokens, int32_t n, float *logprobs, loom_error *err) {
    loom_status st = score_check(e, tokens, n, err);
    if (st != LOOM_OK) return st;
    loom_seq_info info = {
        .struct_size = sizeof info,
        .id = e->next_seq_id++,
        .request_id = -1,
        .num_prompt_tokens = n,
        .num_tokens = n,
        .max_total_tokens = n,
        .tokens = tokens,
    };
    st = e->cache->allocate(e->cache_self, &info, n, err);
    if (st == LOOM_ERR_NO_SPACE)
        return loom_error_set(err, LOOM_ERR_NO_SPACE,
                              "loom_engine_score: the KV cache cannot hold %d tokens (%d blocks of %d): give the "
                              "cache more memory or score shorter windows",
                              n, e->layout.num_blocks, e->layout.block_size);
    if (st != LOOM_OK) return st;
    st = score_run(e, &info, tokens, n, logprobs, err);
    e->cache->free(e->cache_self, info.id);
    return st;
}
