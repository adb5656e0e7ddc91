/*
 * conformance/ref_cache.c — see ref_cache.h.
 */
#include "ref_cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void rc_violation(loom_ref_cache *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rc_violation(loom_ref_cache *rc, const char *fmt, ...) {
    if (!rc->violations++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rc->violation, sizeof rc->violation, fmt, ap);
        va_end(ap);
    }
}

static loom_status rc_err(loom_error *err, loom_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static loom_status rc_err(loom_error *err, loom_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

static loom_ref_cache_seq *rc_seq(loom_ref_cache *rc, loom_seq_id id, const char *who) {
    if (id < 0 || id >= rc->max_ids) {
        rc_violation(rc, "%s: sequence id %lld unknown to the core", who, (long long)id);
        return NULL;
    }
    return &rc->seqs[id];
}

static int32_t rc_blocks_for(const loom_ref_cache *rc, int32_t tokens) {
    return (tokens + rc->block_size - 1) / rc->block_size;
}

static bool rc_reserve(loom_ref_cache_seq *q, int32_t n) {
    if (n <= q->cap) return true;
    int32_t cap = q->cap ? q->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(q->table, (size_t)cap * sizeof *t);
    if (!t) return false;
    q->table = t;
    q->cap = cap;
    return true;
}

/* A fresh block (caller made sure one is free). */
static int32_t rc_take(loom_ref_cache *rc) {
    int32_t b = rc->free_list[--rc->free_blocks];
    rc->refs[b] = 1;
    int32_t used = rc->num_blocks - rc->free_blocks;
    if (used > rc->peak_used) rc->peak_used = used;
    return b;
}

static void rc_release(loom_ref_cache *rc, int32_t b) {
    if (--rc->refs[b] == 0) rc->free_list[rc->free_blocks++] = b;
}

static void rc_release_all(loom_ref_cache *rc, loom_ref_cache_seq *q) {
    for (int32_t i = 0; i < q->blocks; i++) rc_release(rc, q->table[i]);
    q->blocks = 0;
}

static int32_t rc_acquire_prefix(void *self, const loom_seq_info *seq) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, seq->id, "acquire_prefix");
    if (!q) return 0;
    rc->acquires++;
    if (q->blocks || q->cpu_blocks || q->swapped) {
        rc_violation(rc, "acquire_prefix on sequence %lld, which holds %d device + %d host blocks (a second "
                     "acquire, or a forked sample that arrived with num_computed %d)",
                     (long long)seq->id, q->blocks, q->cpu_blocks, seq->num_computed);
        return 0;
    }
    int32_t known = seq->num_tokens - seq->num_draft;
    int32_t p = (known - 1) / rc->block_size * rc->block_size;
    if (p > rc->prefix_tokens) p = rc->prefix_tokens / rc->block_size * rc->block_size;
    int32_t b = p > 0 ? p / rc->block_size : 0;
    if (b > rc->free_blocks) b = rc->free_blocks;
    if (!rc_reserve(q, b)) return 0;
    for (int32_t i = 0; i < b; i++) q->table[q->blocks++] = rc_take(rc);
    q->prefix = b * rc->block_size;
    return q->prefix;
}

/* Shared blocks that tokens from `from` on would write into. */
static int32_t rc_cow_count(const loom_ref_cache *rc, const loom_ref_cache_seq *q, int32_t from) {
    int32_t n = 0;
    for (int32_t j = from / rc->block_size; j < q->blocks; j++) n += rc->refs[q->table[j]] > 1;
    return n;
}

static loom_status rc_allocate(void *self, const loom_seq_info *seq, int32_t num_tokens, loom_error *err) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, seq->id, "allocate");
    if (!q) return LOOM_ERR_INVALID;
    if (rc->fail_allocate != LOOM_OK) return rc_err(err, rc->fail_allocate, "reference cache: injected failure");
    if (q->swapped) {
        rc_violation(rc, "allocate on swapped-out sequence %lld", (long long)seq->id);
        return rc_err(err, LOOM_ERR_INVALID, "reference cache: sequence %lld is swapped out", (long long)seq->id);
    }
    if (num_tokens < 1 || num_tokens > seq->num_tokens) {
        rc_violation(rc, "allocate(%lld, %d) but the sequence has %d tokens", (long long)seq->id, num_tokens,
                     seq->num_tokens);
        return rc_err(err, LOOM_ERR_INVALID, "reference cache: bad length %d", num_tokens);
    }
    if (rc_blocks_for(rc, num_tokens) > rc->num_blocks)
        return rc_err(err, LOOM_ERR_INVALID, "reference cache: %d tokens never fit", num_tokens);
    int32_t from = seq->num_computed > q->prefix ? seq->num_computed : q->prefix;
    int32_t grow = rc_blocks_for(rc, num_tokens) - q->blocks;
    int32_t cow = rc_cow_count(rc, q, from);
    int32_t need = (grow > 0 ? grow : 0) + cow;
    if (need == 0) return LOOM_OK;
    if (need > rc->free_blocks || !rc_reserve(q, q->blocks + (grow > 0 ? grow : 0))) {
        rc->nospace++;
        return rc_err(err, LOOM_ERR_NO_SPACE, "reference cache: %d blocks needed, %d free", need, rc->free_blocks);
    }
    for (int32_t j = from / rc->block_size; j < q->blocks; j++)
        if (rc->refs[q->table[j]] > 1) {
            rc_release(rc, q->table[j]);
            q->table[j] = rc_take(rc);
            rc->cows++;
        }
    for (int32_t i = 0; i < grow; i++) q->table[q->blocks++] = rc_take(rc);
    return LOOM_OK;
}

static void rc_truncate(void *self, const loom_seq_info *seq, int32_t num_tokens) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, seq->id, "truncate");
    if (!q || q->swapped) return;
    int32_t keep = rc_blocks_for(rc, num_tokens < 0 ? 0 : num_tokens);
    while (q->blocks > keep) rc_release(rc, q->table[--q->blocks]);
}

static void rc_free_seq(void *self, loom_seq_id id) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, id, "free");
    if (!q) return;
    rc_release_all(rc, q);
    rc->free_cpu_blocks += q->cpu_blocks;
    q->cpu_blocks = q->prefix = 0;
    q->swapped = false;
}

static loom_status rc_fork(void *self, loom_seq_id parent, loom_seq_id child, loom_error *err) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *p = rc_seq(rc, parent, "fork"), *c = rc_seq(rc, child, "fork");
    if (!p || !c || p->swapped)
        return rc_err(err, LOOM_ERR_INVALID, "reference cache: cannot fork %lld", (long long)parent);
    if (c->blocks || c->cpu_blocks) {
        rc_violation(rc, "fork into sequence %lld, which already holds blocks", (long long)child);
        return rc_err(err, LOOM_ERR_INVALID, "reference cache: child holds blocks");
    }
    if (!rc_reserve(c, p->blocks)) return rc_err(err, LOOM_ERR_NOMEM, "reference cache: out of memory");
    for (int32_t i = 0; i < p->blocks; i++) {
        c->table[i] = p->table[i];
        rc->refs[p->table[i]]++;
    }
    c->blocks = p->blocks;
    c->prefix = 0;
    rc->forks++;
    return LOOM_OK;
}

static loom_status rc_swap_out(void *self, loom_seq_id id, loom_error *err) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, id, "swap_out");
    if (!q) return LOOM_ERR_INVALID;
    if (!rc->swap_supported) return rc_err(err, LOOM_ERR_UNSUPPORTED, "reference cache: no host pool");
    if (q->swapped) {
        rc_violation(rc, "swap_out of already swapped sequence %lld", (long long)id);
        return LOOM_ERR_INVALID;
    }
    if (q->blocks > rc->free_cpu_blocks) return rc_err(err, LOOM_ERR_NO_SPACE, "reference cache: host pool full");
    rc->free_cpu_blocks -= q->blocks;
    q->cpu_blocks = q->blocks;
    rc_release_all(rc, q);
    q->swapped = true;
    rc->swaps_out++;
    return LOOM_OK;
}

static loom_status rc_swap_in(void *self, loom_seq_id id, loom_error *err) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, id, "swap_in");
    if (!q) return LOOM_ERR_INVALID;
    if (!q->swapped) {
        rc_violation(rc, "swap_in of sequence %lld, which is not swapped out", (long long)id);
        return LOOM_ERR_INVALID;
    }
    if (q->cpu_blocks > rc->free_blocks || !rc_reserve(q, q->cpu_blocks))
        return rc_err(err, LOOM_ERR_NO_SPACE, "reference cache: device pool full");
    rc->free_cpu_blocks += q->cpu_blocks;
    for (int32_t i = 0; i < q->cpu_blocks; i++) q->table[q->blocks++] = rc_take(rc);
    q->cpu_blocks = 0;
    q->swapped = false;
    rc->swaps_in++;
    return LOOM_OK;
}

static int32_t rc_block_table(void *self, loom_seq_id id, int32_t *out, int32_t cap) {
    loom_ref_cache *rc = self;
    loom_ref_cache_seq *q = rc_seq(rc, id, "block_table");
    if (!q || q->swapped) return 0;
    for (int32_t i = 0; i < q->blocks && i < cap; i++) out[i] = q->table[i];
    return q->blocks;
}

static int32_t rc_take_block_ops(void *self, loom_block_op *out, int32_t cap) { return 0; }

static int32_t rc_num_free_blocks(void *self) { return ((loom_ref_cache *)self)->free_blocks; }

static void rc_stats(void *self, loom_cache_stats *out) {
    loom_ref_cache *rc = self;
    *out = (loom_cache_stats){
        .struct_size = sizeof *out,
        .num_blocks = rc->num_blocks,
        .free_blocks = rc->free_blocks,
        .num_cpu_blocks = rc->num_cpu_blocks,
        .free_cpu_blocks = rc->free_cpu_blocks,
        .block_size = rc->block_size,
        .swaps_out = rc->swaps_out,
        .swaps_in = rc->swaps_in,
        .cow_copies = rc->cows,
        .peak_used_blocks = rc->peak_used,
    };
}

const loom_cache_ops loom_ref_cache_ops = {
    .struct_size = sizeof(loom_cache_ops),
    .acquire_prefix = rc_acquire_prefix,
    .allocate = rc_allocate,
    .truncate = rc_truncate,
    .free = rc_free_seq,
    .fork = rc_fork,
    .swap_out = rc_swap_out,
    .swap_in = rc_swap_in,
    .block_table = rc_block_table,
    .take_block_ops = rc_take_block_ops,
    .num_free_blocks = rc_num_free_blocks,
    .stats = rc_stats,
};

loom_ref_cache *loom_ref_cache_new(int32_t block_size, int32_t num_blocks, int32_t num_cpu_blocks,
                                   int32_t max_ids) {
    loom_ref_cache *rc = calloc(1, sizeof *rc);
    if (!rc) return NULL;
    rc->seqs = calloc((size_t)(max_ids > 0 ? max_ids : 1), sizeof *rc->seqs);
    rc->refs = calloc((size_t)(num_blocks > 0 ? num_blocks : 1), sizeof *rc->refs);
    rc->free_list = calloc((size_t)(num_blocks > 0 ? num_blocks : 1), sizeof *rc->free_list);
    if (!rc->seqs || !rc->refs || !rc->free_list) {
        loom_ref_cache_free(rc);
        return NULL;
    }
    rc->block_size = block_size;
    rc->num_blocks = rc->free_blocks = num_blocks;
    for (int32_t i = 0; i < num_blocks; i++) rc->free_list[i] = num_blocks - 1 - i; /* 0 first */
    rc->num_cpu_blocks = rc->free_cpu_blocks = num_cpu_blocks;
    rc->swap_supported = num_cpu_blocks > 0;
    rc->max_ids = max_ids;
    return rc;
}

void loom_ref_cache_free(loom_ref_cache *rc) {
    if (!rc) return;
    for (int32_t i = 0; rc->seqs && i < rc->max_ids; i++) free(rc->seqs[i].table);
    free(rc->seqs);
    free(rc->refs);
    free(rc->free_list);
    free(rc);
}
