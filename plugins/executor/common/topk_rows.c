/*
 * plugins/executor/common/topk_rows.c — whole logits rows reduced to
 * forward_topk's summaries on the host (contract in topk_rows.h).
 */
#include "topk_rows.h"

#include <string.h>

loom_status topk_rows_reserve(topk_rows *t, const loom_host *h, const char *who, int64_t nl,
                              int64_t vocab, loom_error *err) {
    const size_t need = (size_t)nl * (size_t)vocab;
    if (need <= t->cap) return LOOM_OK;
    float *p = h->alloc(h->ctx, need * sizeof(float));
    if (!p)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of host memory for %lld logits rows", who,
                        (long long)nl);
    h->free(h->ctx, t->rows);
    t->rows = p, t->cap = need;
    return LOOM_OK;
}

loom_status topk_rows_reduce(const topk_rows *t, const loom_host *h, int64_t nl, int64_t vocab,
                             const loom_logits_topk *out, loom_error *err) {
    const size_t V = (size_t)vocab;
    const bool masks = LOOM_HAS_FIELD(out, loom_logits_topk, fill_masks) && out->allowed;
    if (masks && out->fill_masks) {
        loom_status st = out->fill_masks(out->fill_ctx, err);
        if (st != LOOM_OK) return st;
    }
    for (int64_t r = 0; r < nl; r++) {
        const float *row = t->rows + (size_t)r * V;
        const uint32_t *m = masks ? out->allowed[r] : NULL;
        int32_t *ids = out->top_ids + r * out->k;
        float *vals = out->top_vals + r * out->k;
        if (m) h->logits_topk_masked_row(row, (int32_t)vocab, m, out->k, ids, vals, out->lse + r);
        else h->logits_topk_row(row, (int32_t)vocab, out->k, ids, vals, out->lse + r);
        if (out->want_full[r]) memcpy(out->full + (size_t)r * V, row, V * sizeof(float));
    }
    return LOOM_OK;
}

void topk_rows_free(topk_rows *t, const loom_host *h) {
    h->free(h->ctx, t->rows);
    *t = (topk_rows){0};
}
