/*
 * plugins/executor/common/topk_rows.h — forward_topk for an executor whose
 * ranks' backend has none: the executor asks its ranks for whole logits
 * rows into a host buffer kept from step to step, then reduces each row to
 * its top k (the host's logits_topk_row) and copies the rows asked for in
 * full. Shared by the tp and pp executors; a static library compiled into
 * each, like rank_pool.h.
 *
 * Threads: [engine] (the executor's calls; never concurrently on one
 * buffer). Ownership: the buffer is allocated and freed through the host
 * table passed to each call (always the same host); `out` is borrowed.
 */
#ifndef LOOM_EXECUTOR_TOPK_ROWS_H
#define LOOM_EXECUTOR_TOPK_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"

/* Embedded in the executor's state; zeroed = empty. */
typedef struct topk_rows {
    float *rows;                       /* (cap) logits, row-major (nl, vocab) */
    size_t cap;                        /* floats in rows                      */
} topk_rows;

/* [engine] Room for nl rows of vocab floats (the old buffer is replaced,
 * not copied). On failure err says "<who>: out of host memory for <nl>
 * logits rows" and the old buffer stays. */
loom_status topk_rows_reserve(topk_rows *t, const loom_host *h, const char *who, int64_t nl,
                              int64_t vocab, loom_error *err);
/* [engine] Fill `out` (k candidates and lse per row; the full row where
 * out->want_full[r]) from the first nl rows, after out->fill_masks; a
 * row with a constraint mask (out->allowed, ABI 2.4) through
 * host->logits_topk_masked_row. Fails only with fill_masks' error. */
loom_status topk_rows_reduce(const topk_rows *t, const loom_host *h, int64_t nl, int64_t vocab,
                             const loom_logits_topk *out, loom_error *err);
/* [engine] Release the buffer; the struct is empty again. NULL-safe rows. */
void        topk_rows_free(topk_rows *t, const loom_host *h);

#endif
