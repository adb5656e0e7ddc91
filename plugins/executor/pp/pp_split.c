/*
 * plugins/executor/pp/pp_split.c — micro-batches: a step's flattened batch
 * (loom/backend.h) cut into sub-batches of whole, consecutive sequences, so
 * the stages of a pipeline overlap (stage s runs micro-batch m while stage
 * s + 1 runs m - 1; GPipe's schedule for inference, which has no backward).
 *
 * A micro-batch borrows the step's per-token arrays (token ids, positions,
 * slot mapping) and per-sequence arrays (context lengths, block-table rows)
 * at an offset; only query_start and logits_index, which hold offsets into
 * the tokens, are rebased into this file's buffers. logits_index is
 * ascending, so each micro-batch's logits rows are one contiguous run of
 * the step's rows, starting at row0.
 */
#include <string.h>

#include "pp.h"

/* Grow *p to hold n int32 (keeping nothing); false on out of memory. */
static bool pp_grow_i32(const loom_host *h, int32_t **p, int32_t *cap, int32_t n) {
    if (n <= *cap) return true;
    int32_t want = n < 64 ? 64 : n;
    int32_t *q = h->alloc(h->ctx, (size_t)want * sizeof *q);
    if (!q) return false;
    h->free(h->ctx, *p);
    *p = q;
    *cap = want;
    return true;
}

/* Sequence boundaries g[0..m]: about T * i / m query tokens before g[i],
 * each group at least one sequence. */
static void pp_cut(const loom_batch *b, int32_t m, int32_t *g) {
    const int32_t S = b->num_seqs;
    const int64_t T = b->num_tokens;
    g[0] = 0;
    for (int32_t i = 1; i < m; i++) {
        const int64_t target = T * i / m;
        int32_t s = g[i - 1] + 1;
        while (s < S - (m - i) && b->query_start[s] < target) s++;
        g[i] = s;
    }
    g[m] = S;
}

int32_t pp_split_batch(pp_split *sp, const loom_host *h, const loom_batch *b, int32_t want) {
    int32_t m = want < b->num_seqs ? want : b->num_seqs;
    if (m > PP_MAX_MICRO_BATCHES) m = PP_MAX_MICRO_BATCHES;
    if (m < 1) m = 1;
    if (m > sp->cap_mbs) {
        pp_mb *p = h->alloc(h->ctx, (size_t)m * sizeof *p);
        if (!p) return -1;
        h->free(h->ctx, sp->mbs);
        sp->mbs = p;
        sp->cap_mbs = m;
    }
    if (m == 1) { /* the step's batch as it is */
        sp->mbs[0] = (pp_mb){.batch = *b, .row0 = 0};
        return 1;
    }
    int32_t g[PP_MAX_MICRO_BATCHES + 1];
    pp_cut(b, m, g);
    if (!pp_grow_i32(h, &sp->query_start, &sp->cap_qs, b->num_seqs + m) ||
        !pp_grow_i32(h, &sp->logits_index, &sp->cap_li, b->num_logits > 0 ? b->num_logits : 1))
        return -1;
    int32_t *qs = sp->query_start, r = 0;
    for (int32_t i = 0; i < m; i++) {
        const int32_t s0 = g[i], s1 = g[i + 1];
        const int32_t t0 = b->query_start[s0], t1 = b->query_start[s1];
        for (int32_t s = s0; s <= s1; s++) qs[s - s0] = b->query_start[s] - t0;
        const int32_t r0 = r;
        while (r < b->num_logits && b->logits_index[r] < t1) {
            sp->logits_index[r] = b->logits_index[r] - t0;
            r++;
        }
        loom_batch mb = *b;
        mb.num_seqs = s1 - s0;
        mb.num_tokens = t1 - t0;
        mb.token_ids = b->token_ids + t0;
        mb.positions = b->positions + t0;
        mb.query_start = qs;
        mb.context_len = b->context_len + s0;
        mb.block_table = b->block_table + (int64_t)s0 * b->block_table_stride;
        mb.slot_mapping = b->slot_mapping + t0;
        mb.num_logits = r - r0;
        mb.logits_index = sp->logits_index + r0;
        sp->mbs[i] = (pp_mb){.batch = mb, .row0 = r0};
        qs += s1 - s0 + 1;
    }
    return m;
}

void pp_split_free(pp_split *sp, const loom_host *h) {
    h->free(h->ctx, sp->mbs);
    h->free(h->ctx, sp->query_start);
    h->free(h->ctx, sp->logits_index);
    memset(sp, 0, sizeof *sp);
}
