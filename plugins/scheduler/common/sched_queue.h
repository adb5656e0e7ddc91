/*
 * plugins/scheduler/common/sched_queue.h — what the two schedulers
 * (continuous, static) share: a queue of fixed-size sequence records kept
 * sorted by the scheduler's own order, grown only outside schedule() (add()
 * reserves room, so moving sequences between queues never allocates), and
 * the check of the limits both take from YAML. Header-only: each plugin
 * .so compiles its own copy; plugins see only the public SDK.
 */
#ifndef LOOM_SCHED_QUEUE_H
#define LOOM_SCHED_QUEUE_H

#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"

/* Grow *v (records of `elt` bytes, *cap of them, n in use) to hold `want`,
 * doubling from 16; `who` names the scheduler in the error. */
static inline loom_status sq_reserve(const loom_host *h, const char *who, void **v, int32_t *cap, int32_t n,
                                     int32_t want, size_t elt, loom_error *err) {
    if (*cap >= want) return LOOM_OK;
    int32_t c = *cap ? *cap : 16;
    while (c < want) c *= 2;
    void *nv = h->alloc(h->ctx, (size_t)c * elt);
    if (!nv)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory growing a queue to %d sequences", who,
                        c);
    if (n) memcpy(nv, *v, (size_t)n * elt);
    h->free(h->ctx, *v);
    *v = nv;
    *cap = c;
    return LOOM_OK;
}

/* Insert record x after every record that does not order after it (cmp
 * <= 0: equals keep arrival order); room must be reserved. Returns its
 * index. */
static inline int32_t sq_insert(void *v, int32_t *n, const void *x, size_t elt,
                                int (*cmp)(const void *ctx, const void *a, const void *b), const void *ctx) {
    char *base = v;
    int32_t lo = 0, hi = *n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (cmp(ctx, base + (size_t)mid * elt, x) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(base + (size_t)(lo + 1) * elt, base + (size_t)lo * elt, (size_t)(*n - lo) * elt);
    memcpy(base + (size_t)lo * elt, x, elt);
    (*n)++;
    return lo;
}

/* Remove record i, keeping the order. */
static inline void sq_remove(void *v, int32_t *n, int32_t i, size_t elt) {
    char *base = v;
    memmove(base + (size_t)i * elt, base + (size_t)(i + 1) * elt, (size_t)(*n - i - 1) * elt);
    (*n)--;
}

/* The limits both schedulers bind: max_num_seqs in [1, 2^20] and
 * max_batched_tokens in [1, 2^30]. */
static inline loom_status sq_check_limits(const loom_host *h, const char *who, int64_t max_num_seqs,
                                          int64_t max_batched_tokens, loom_error *err) {
    if (max_num_seqs < 1 || max_num_seqs > (1 << 20))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: max_num_seqs = %lld, must be in [1, %d]", who,
                        (long long)max_num_seqs, 1 << 20);
    if (max_batched_tokens < 1 || max_batched_tokens > (1 << 30))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "%s: max_batched_tokens = %lld, must be in [1, %d]", who,
                        (long long)max_batched_tokens, 1 << 30);
    return LOOM_OK;
}

#endif /* LOOM_SCHED_QUEUE_H */
