/*
 * tests/scheduler/fake_cache.c — see fake_cache.h.
 */
#include "fake_cache.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fc_violation(fake_cache *fc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fc->violation, sizeof fc->violation, fmt, ap);
    va_end(ap);
    fc->violations++;
}

static fake_cache_seq *fc_seq(fake_cache *fc, loom_seq_id id, const char *who) {
    if (id < 0 || id >= fc->max_ids) {
        fc_violation(fc, "%s: sequence id %lld out of range", who, (long long)id);
        return NULL;
    }
    return &fc->seqs[id];
}

static int32_t fc_blocks_for(const fake_cache *fc, int32_t tokens) {
    return (tokens + fc->block_size - 1) / fc->block_size;
}

static void fc_take(fake_cache *fc, fake_cache_seq *q, int32_t n) {
    q->blocks += n;
    fc->free_blocks -= n;
    int32_t used = fc->num_blocks - fc->free_blocks;
    if (used > fc->peak_used) fc->peak_used = used;
}

static int32_t fc_acquire_prefix(void *self, const loom_seq_info *seq) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, seq->id, "acquire_prefix");
    if (!q) return 0;
    fc->acquires++;
    if (q->blocks || q->cpu_blocks || q->swapped) {
        fc_violation(fc, "acquire_prefix on sequence %lld that still holds %d+%d blocks",
                     (long long)seq->id, q->blocks, q->cpu_blocks);
        return 0;
    }
    int32_t p = (seq->num_tokens - 1) / fc->block_size * fc->block_size;
    if (p > fc->prefix_tokens) p = fc->prefix_tokens / fc->block_size * fc->block_size;
    int32_t b = p / fc->block_size;
    if (b > fc->free_blocks) b = fc->free_blocks;
    fc_take(fc, q, b);
    q->prefix = b * fc->block_size;
    return q->prefix;
}

static loom_status fc_allocate(void *self, const loom_seq_info *seq, int32_t num_tokens,
                               loom_error *err) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, seq->id, "allocate");
    if (!q) return LOOM_ERR_INVALID;
    if (fc->fail_allocate != LOOM_OK) {
        if (err) {
            err->code = fc->fail_allocate;
            snprintf(err->message, sizeof err->message, "fake cache: injected failure");
        }
        return fc->fail_allocate;
    }
    if (q->swapped) {
        fc_violation(fc, "allocate on swapped-out sequence %lld", (long long)seq->id);
        return LOOM_ERR_INVALID;
    }
    if (num_tokens < 1 || num_tokens > seq->num_tokens) {
        fc_violation(fc, "allocate(%lld, %d) but the sequence has %d tokens", (long long)seq->id,
                     num_tokens, seq->num_tokens);
        return LOOM_ERR_INVALID;
    }
    int32_t need = fc_blocks_for(fc, num_tokens) - q->blocks;
    if (need <= 0) return LOOM_OK;
    if (need > fc->free_blocks) {
        fc->nospace++;
        if (err) {
            err->code = LOOM_ERR_NO_SPACE;
            snprintf(err->message, sizeof err->message, "fake cache: %d blocks needed, %d free",
                     need, fc->free_blocks);
        }
        return LOOM_ERR_NO_SPACE;
    }
    fc_take(fc, q, need);
    return LOOM_OK;
}

static void fc_truncate(void *self, const loom_seq_info *seq, int32_t num_tokens) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, seq->id, "truncate");
    if (!q) return;
    int32_t keep = fc_blocks_for(fc, num_tokens);
    if (q->blocks > keep) {
        fc->free_blocks += q->blocks - keep;
        q->blocks = keep;
    }
}

static void fc_free(void *self, loom_seq_id id) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, id, "free");
    if (!q) return;
    fc->free_blocks += q->blocks;
    fc->free_cpu_blocks += q->cpu_blocks;
    *q = (fake_cache_seq){0};
}

static loom_status fc_fork(void *self, loom_seq_id parent, loom_seq_id child, loom_error *err) {
    return LOOM_ERR_UNSUPPORTED;
}

static loom_status fc_swap_out(void *self, loom_seq_id id, loom_error *err) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, id, "swap_out");
    if (!q) return LOOM_ERR_INVALID;
    if (!fc->swap_supported) return LOOM_ERR_UNSUPPORTED;
    if (q->swapped) {
        fc_violation(fc, "swap_out of already swapped sequence %lld", (long long)id);
        return LOOM_ERR_INVALID;
    }
    if (q->blocks > fc->free_cpu_blocks) return LOOM_ERR_NO_SPACE;
    fc->free_cpu_blocks -= q->blocks;
    fc->free_blocks += q->blocks;
    q->cpu_blocks = q->blocks;
    q->blocks = 0;
    q->swapped = true;
    fc->swaps_out++;
    return LOOM_OK;
}

static loom_status fc_swap_in(void *self, loom_seq_id id, loom_error *err) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, id, "swap_in");
    if (!q) return LOOM_ERR_INVALID;
    if (!q->swapped) {
        fc_violation(fc, "swap_in of sequence %lld that is not swapped out", (long long)id);
        return LOOM_ERR_INVALID;
    }
    if (q->cpu_blocks > fc->free_blocks) return LOOM_ERR_NO_SPACE;
    fc->free_cpu_blocks += q->cpu_blocks;
    fc_take(fc, q, q->cpu_blocks);
    q->cpu_blocks = 0;
    q->swapped = false;
    fc->swaps_in++;
    return LOOM_OK;
}

static int32_t fc_block_table(void *self, loom_seq_id id, int32_t *out, int32_t cap) {
    fake_cache *fc = self;
    fake_cache_seq *q = fc_seq(fc, id, "block_table");
    if (!q || q->swapped) return 0;
    for (int32_t i = 0; i < q->blocks && i < cap; i++) out[i] = i;
    return q->blocks;
}

static int32_t fc_take_block_ops(void *self, loom_block_op *out, int32_t cap) { return 0; }

static int32_t fc_num_free_blocks(void *self) { return ((fake_cache *)self)->free_blocks; }

static void fc_stats(void *self, loom_cache_stats *out) {
    fake_cache *fc = self;
    *out = (loom_cache_stats){
        .struct_size = sizeof *out,
        .num_blocks = fc->num_blocks,
        .free_blocks = fc->free_blocks,
        .num_cpu_blocks = fc->num_cpu_blocks,
        .free_cpu_blocks = fc->free_cpu_blocks,
        .block_size = fc->block_size,
        .swaps_out = fc->swaps_out,
        .swaps_in = fc->swaps_in,
        .peak_used_blocks = fc->peak_used,
    };
}

const loom_cache_ops fake_cache_ops = {
    .struct_size = sizeof(loom_cache_ops),
    .acquire_prefix = fc_acquire_prefix,
    .allocate = fc_allocate,
    .truncate = fc_truncate,
    .free = fc_free,
    .fork = fc_fork,
    .swap_out = fc_swap_out,
    .swap_in = fc_swap_in,
    .block_table = fc_block_table,
    .take_block_ops = fc_take_block_ops,
    .num_free_blocks = fc_num_free_blocks,
    .stats = fc_stats,
};

fake_cache *fake_cache_new(int32_t block_size, int32_t num_blocks, int32_t num_cpu_blocks,
                           int32_t max_ids) {
    fake_cache *fc = calloc(1, sizeof *fc);
    if (!fc) return NULL;
    fc->seqs = calloc((size_t)(max_ids > 0 ? max_ids : 1), sizeof *fc->seqs);
    if (!fc->seqs) {
        free(fc);
        return NULL;
    }
    fc->block_size = block_size;
    fc->num_blocks = fc->free_blocks = num_blocks;
    fc->num_cpu_blocks = fc->free_cpu_blocks = num_cpu_blocks;
    fc->swap_supported = num_cpu_blocks > 0;
    fc->max_ids = max_ids;
    return fc;
}

void fake_cache_free(fake_cache *fc) {
    if (!fc) return;
    free(fc->seqs);
    free(fc);
}
