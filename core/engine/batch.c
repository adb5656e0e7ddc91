/*
 * core/engine/batch.c — from the scheduler's decision to the runner's
 * input: the step buffers, the cache manager's queued block copies and
 * swaps, and the flattened batch (loom/backend.h: token ids, positions,
 * block tables, slot mapping, the rows that need logits).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/util.h"

/* Grow the per-step arrays for nseq sequences and ntok tokens. */
loom_status engine_step_buffers(loom_engine *e, int32_t nseq, int32_t ntok, int32_t bt_stride) {
    const int32_t G = e->num_groups > 1 ? e->num_groups : 1; /* tables and slot rows per sequence */
    if (engine_grow((void **)&e->sched_entries, &e->sched_cap, nseq, sizeof(loom_sched_entry)) != LOOM_OK)
        return LOOM_ERR_NOMEM;
    loom_seq_id *pre = realloc(e->preempted, (size_t)e->sched_cap * sizeof(loom_seq_id));
    if (pre) e->preempted = pre;
    loom_preempt_mode *modes = realloc(e->preempt_modes, (size_t)e->sched_cap * sizeof(loom_preempt_mode));
    if (modes) e->preempt_modes = modes;
    if (!pre || !modes) return LOOM_ERR_NOMEM;
    if (ntok > e->tok_cap) {
        int32_t n = ntok * 2;
        int32_t *ids = realloc(e->tok_ids, (size_t)n * sizeof(int32_t));
        if (ids) e->tok_ids = ids;
        int32_t *pos = realloc(e->positions, (size_t)n * sizeof(int32_t));
        if (pos) e->positions = pos;
        int64_t *slots = realloc(e->slots, (size_t)n * (size_t)G * sizeof(int64_t));
        if (slots) e->slots = slots;
        int32_t *li = realloc(e->logits_index, (size_t)n * sizeof(int32_t));
        if (li) e->logits_index = li;
        loom_seq **ls = realloc(e->logit_seqs, (size_t)n * sizeof(loom_seq *));
        if (ls) e->logit_seqs = ls;
        if (!ids || !pos || !slots || !li || !ls) return LOOM_ERR_NOMEM;
        e->tok_cap = n;
    }
    if (nseq + 1 > e->seq_cap) {
        int32_t n = (nseq + 1) * 2;
        int32_t *qs = realloc(e->query_start, (size_t)n * sizeof(int32_t));
        if (qs) e->query_start = qs;
        int32_t *cl = realloc(e->context_len, (size_t)n * sizeof(int32_t));
        if (cl) e->context_len = cl;
        if (!qs || !cl) return LOOM_ERR_NOMEM;
        e->seq_cap = n;
    }
    if ((int64_t)nseq * bt_stride * G > e->bt_cap) {
        int32_t n = nseq * bt_stride * G * 2;
        int32_t *bt = realloc(e->block_table, (size_t)n * sizeof(int32_t));
        if (!bt) return LOOM_ERR_NOMEM;
        e->block_table = bt;
        e->bt_cap = n;
    }
    return LOOM_OK;
}

/* Room for `rows` whole logits rows, grown as needed. */
loom_status engine_logits_room(loom_engine *e, int32_t rows, loom_error *err) {
    size_t need = (size_t)rows * (size_t)e->vocab;
    if (need <= e->logits_cap) return LOOM_OK;
    float *l = realloc(e->logits, need * sizeof(float));
    if (!l) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for %d logits rows", rows);
    e->logits = l;
    e->logits_cap = need;
    return LOOM_OK;
}

/* Scratch rows for verification and want_probs, grown as needed. */
float *engine_scratch_rows(loom_engine *e, int32_t rows) {
    size_t need = (size_t)rows * (size_t)e->vocab;
    if (need > e->scratch_cap) {
        float *p = realloc(e->scratch, need * sizeof(float));
        if (!p) return NULL;
        e->scratch = p;
        e->scratch_cap = need;
    }
    return e->scratch;
}

/* One run of block ops of one kind on the runner. */
static loom_status run_ops(loom_engine *e, loom_block_op_kind k, int32_t n, loom_error *err) {
    if (k == LOOM_BLOCK_COPY) return e->run.copy_blocks(e->run.self, e->pairs, n, err);
    if (!e->run.swap_blocks)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "the cache manager asked for a swap but %s '%s' cannot swap: set "
                              "cache.cpu_swap_gib: 0",
                              e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend", e->run.name);
    return e->run.swap_blocks(e->run.self, k == LOOM_BLOCK_SWAP_OUT ? LOOM_SWAP_OUT : LOOM_SWAP_IN, e->pairs, n,
                              err);
}

/* Run the cache manager's queued copies and swaps, grouped into runs of
 * one kind so the runner sees as few calls as possible, order kept. */
loom_status engine_run_block_ops(loom_engine *e, loom_error *err) {
    enum { CAP = 256 };
    if (!e->ops) {
        e->ops = malloc(CAP * sizeof(loom_block_op));
        e->pairs = malloc(CAP * 2 * sizeof(int32_t));
        if (!e->ops || !e->pairs) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    }
    int32_t n;
    while ((n = e->cache->take_block_ops(e->cache_self, e->ops, CAP)) > 0) {
        if (n > CAP) return loom_error_set(err, LOOM_ERR_INTERNAL, "cache take_block_ops returned %d > %d", n, CAP);
        for (int32_t i = 0, j; i < n; i = j) {
            loom_block_op_kind k = e->ops[i].kind;
            for (j = i; j < n && e->ops[j].kind == k; j++) {
                e->pairs[2 * (j - i)] = e->ops[j].src;
                e->pairs[2 * (j - i) + 1] = e->ops[j].dst;
            }
            loom_status st = run_ops(e, k, j - i, err);
            if (st != LOOM_OK) return st;
        }
    }
    return LOOM_OK;
}

/* Prompt-token accounting for one scheduled entry: tokens the prefix cache
 * served (first schedule of sample 0) and tokens actually prefilled. A
 * scored prompt's hits on blocks its own scoring pass registered are not
 * counted as served: only what the cache held before scoring. */
static void count_prompt(loom_engine *e, loom_seq *s, const loom_sched_entry *en, int32_t end) {
    const int32_t np = s->info.num_prompt_tokens;
    if (!s->prefix_counted && s->sample_index == 0) {
        s->prefix_counted = true;
        int32_t c = en->num_computed < np ? en->num_computed : np;
        if (s->req->prompt_scored && c > s->req->cached_before_score) c = s->req->cached_before_score;
        s->req->cached_prompt_tokens = c;
        e->stats.cached_prompt_tokens += s->req->cached_prompt_tokens;
    }
    if (en->num_computed < np) e->stats.prefill_tokens += (end < np ? end : np) - en->num_computed;
}

/* Row i (of S, rows of e->step_stride entries) of every group's block
 * table for sequence `id`: its first blocks, -1 past them; each group must
 * have blocks for tokens [0, end) within the row. */
loom_status engine_table_rows(loom_engine *e, loom_seq_id id, int32_t i, int32_t S, int32_t end, loom_error *err) {
    const int32_t bs = e->layout.block_size, stride = e->step_stride;
    for (int32_t g = 0; g < e->num_groups; g++) {
        int32_t *row = e->block_table + ((size_t)g * S + i) * stride;
        int32_t nb = g == 0 ? e->cache->block_table(e->cache_self, id, row, stride)
                            : e->cache->group_table(e->cache_self, id, g, row, stride);
        if (nb > e->bt_stride || (int64_t)(nb < stride ? nb : stride) * bs < end)
            return loom_error_set(err, LOOM_ERR_INTERNAL,
                                  "seq %lld has %d blocks in group %d for %d tokens: the scheduler did not allocate",
                                  (long long)id, nb, g, end);
        for (int32_t k = nb; k < stride; k++) row[k] = -1;
    }
    return LOOM_OK;
}

/* Slots of positions [from, end), written at tokens t.. of a batch of T
 * tokens, through row i (of S) of every group's table: (G, T). */
loom_status engine_fill_slots(loom_engine *e, int32_t i, int32_t S, int32_t T, int32_t t, int32_t from, int32_t end,
                              loom_error *err) {
    const int32_t bs = e->layout.block_size, stride = e->step_stride;
    for (int32_t g = 0; g < e->num_groups; g++) {
        const int32_t *row = e->block_table + ((size_t)g * S + i) * stride;
        int64_t *slots = e->slots + (size_t)g * T + t;
        for (int32_t p = from; p < end; p++) {
            if (row[p / bs] < 0)
                return loom_error_set(err, LOOM_ERR_INTERNAL,
                                      "the cache released block %d of group %d that position %d is written to", p / bs,
                                      g, p);
            slots[p - from] = (int64_t)row[p / bs] * bs + p % bs;
        }
    }
    return LOOM_OK;
}

/* Lay out entry i (of S, in a batch of T tokens; sequence s) at token
 * offset t: its block table rows, its tokens, positions and slots, and the
 * rows that need logits — its last token, or its last token and every
 * draft after it, when it catches up. */
static loom_status add_entry(loom_engine *e, int32_t i, int32_t S, int32_t T, const loom_sched_entry *en, loom_seq *s,
                             int32_t *t, int32_t *nlog, loom_error *err) {
    int32_t end = en->num_computed + en->num_tokens;
    loom_status st = engine_table_rows(e, s->info.id, i, S, end, err);
    if (st == LOOM_OK) st = engine_fill_slots(e, i, S, T, *t, en->num_computed, end, err);
    if (st != LOOM_OK) return st;
    e->query_start[i] = *t;
    e->context_len[i] = end;
    count_prompt(e, s, en, end);
    for (int32_t p = en->num_computed; p < end; p++, (*t)++) {
        e->tok_ids[*t] = s->tokens[p];
        e->positions[*t] = p;
    }
    if (end < s->info.num_tokens) return LOOM_OK;
    int32_t rows = 1 + s->info.num_draft; /* end == num_tokens: all drafts are in this step */
    for (int32_t r = 0; r < rows; r++, (*nlog)++) {
        e->logits_index[*nlog] = *t - rows + r;
        e->logit_seqs[*nlog] = s;
    }
    return LOOM_OK;
}

/* The step's flattened batch from the scheduler's entries, and *kind:
 * whether its entries are prompt chunks, past their prompt, or both. */
loom_status engine_build_batch(loom_engine *e, const loom_sched_output *out, loom_batch *batch, loom_step_kind *kind,
                               loom_error *err) {
    /* rows as wide as the step's longest context, not max_model_len: what
     * is filled here, packed by the runner and uploaded each step follows
     * the contexts that run (loom/backend.h: >= the blocks any seq uses) */
    const int32_t bs = e->layout.block_size;
    int32_t ntok = 0, width = 1;
    for (int32_t i = 0; i < out->num_scheduled; i++) {
        const loom_sched_entry *en = &out->scheduled[i];
        const int32_t nb = (int32_t)(((int64_t)en->num_computed + en->num_tokens + bs - 1) / bs);
        ntok += en->num_tokens;
        if (nb > width) width = nb;
    }
    width = width < e->bt_stride ? width : e->bt_stride;
    if (width != e->bt_width_metric && e->host->metric_set) {
        e->host->metric_set(e->host->ctx, "engine.block_table_width", width);
        e->bt_width_metric = width;
    }
    e->step_stride = width;
    if (engine_step_buffers(e, out->num_scheduled, ntok, e->step_stride) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory growing step buffers");
    int32_t t = 0, nlog = 0;
    bool any_decode = false, any_prompt = false;
    for (int32_t i = 0; i < out->num_scheduled; i++) {
        const loom_sched_entry *en = &out->scheduled[i];
        loom_seq *s = loom_engine_find_seq(e, en->seq);
        loom_status st = add_entry(e, i, out->num_scheduled, ntok, en, s, &t, &nlog, err);
        if (st != LOOM_OK) return st;
        if (en->num_computed >= s->info.num_prompt_tokens) any_decode = true;
        else any_prompt = true;
    }
    *kind = !any_decode ? LOOM_STEP_PREFILL : any_prompt ? LOOM_STEP_MIXED : LOOM_STEP_DECODE;
    e->query_start[out->num_scheduled] = t;
    *batch = (loom_batch){
        .struct_size = sizeof *batch,
        .num_seqs = out->num_scheduled,
        .num_tokens = ntok,
        .token_ids = e->tok_ids,
        .positions = e->positions,
        .query_start = e->query_start,
        .context_len = e->context_len,
        .block_table = e->block_table,
        .block_table_stride = e->step_stride,
        .slot_mapping = e->slots,
        .num_logits = nlog,
        .logits_index = e->logits_index,
        .num_groups = e->num_groups,
        .group_window = e->group_window,
    };
    return engine_logits_room(e, nlog, err);
}
