/*
 * loom/shard.h — the tensor-parallel shard plan every backend's load_shard()
 * must follow, so ranks of any backends agree on who holds what.
 *
 * Megatron-style: query heads split evenly; KV heads split evenly when
 * there are at least as many as ranks, else each rank keeps the one KV head
 * its (consecutive) query heads read, replicated over size / num_kv_heads
 * ranks; the FFN width splits evenly; the vocabulary is cut into
 * ceil(vocab / size) rows per rank, the last rank holding the remainder
 * (possibly none), so every rank's logits slice has the same padded width.
 * Header-only (static inline): plugins never link libloom.
 */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/model.h"
#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_shard {
    int32_t rank, size;
    int32_t heads, head0;      /* query heads kept, first one                */
    int32_t kv_heads, kv0;     /* KV heads kept, first one                   */
    int32_t inter, inter0;     /* FFN columns kept, first one                */
    int32_t vocab_lo;          /* first vocabulary row kept                  */
    int32_t vocab_rows;        /* vocabulary rows kept (may be 0)            */
    int32_t vocab_pad;         /* ceil(vocab / size): every rank's slice width */
} loom_shard;

/* [any] Rank `rank` of `size`'s part of model `c`. On a model that does not
 * split, returns LOOM_ERR_UNSUPPORTED (LOOM_ERR_INVALID for a bad rank) and
 * writes why — without a "backend x:" prefix — into `why`. */
static inline loom_status loom_shard_plan(const loom_model_config *c, int32_t rank, int32_t size,
                                          loom_shard *s, char *why, size_t why_cap) {
    if (size < 1 || rank < 0 || rank >= size) {
        snprintf(why, why_cap, "rank %d of a group of %d", rank, size);
        return LOOM_ERR_INVALID;
    }
    if (c->num_heads % size != 0 || c->intermediate_size % size != 0 ||
        (c->num_kv_heads % size != 0 && size % c->num_kv_heads != 0)) {
        snprintf(why, why_cap,
                 "model '%s' (%d heads, %d KV heads, FFN width %d) does not split over %d ranks: heads "
                 "and FFN width must divide by the size, and KV heads divide by it or it by them",
                 c->name, c->num_heads, c->num_kv_heads, c->intermediate_size, size);
        return LOOM_ERR_UNSUPPORTED;
    }
    s->rank = rank;
    s->size = size;
    s->heads = c->num_heads / size;
    s->head0 = rank * s->heads;
    if (c->num_kv_heads >= size) {
        s->kv_heads = c->num_kv_heads / size;
        s->kv0 = rank * s->kv_heads;
    } else {
        s->kv_heads = 1;
        s->kv0 = s->head0 / (c->num_heads / c->num_kv_heads);
    }
    s->inter = c->intermediate_size / size;
    s->inter0 = rank * s->inter;
    s->vocab_pad = (int32_t)(((int64_t)c->vocab_size + size - 1) / size);
    int64_t lo = (int64_t)rank * s->vocab_pad;
    s->vocab_lo = (int32_t)(lo < c->vocab_size ? lo : c->vocab_size);
    int64_t rows = (int64_t)c->vocab_size - s->vocab_lo;
    s->vocab_rows = (int32_t)(rows < s->vocab_pad ? rows : s->vocab_pad);
    return LOOM_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SHARD_H */
