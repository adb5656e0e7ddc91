/*
 * plugins/cache/contiguous/contiguous.c — the `contiguous` KV-cache manager:
 * the pre-paging baseline (FasterTransformer / early HF style) that the
 * paged manager is A/B-tested against.
 *
 * On its first allocate() a sequence reserves one contiguous run of
 * R = ceil(max_model_len / block_size) blocks, first-fit over the pool, and
 * keeps it until freed however short it stays: that internal waste (and the
 * external fragmentation between runs) is exactly what paging removes. The
 * block table it reports is the run's leading ceil(len / block_size) ids,
 * so the same kernels serve both managers.
 *
 * What it refuses to be: no prefix caching (acquire_prefix answers 0), no
 * sharing (fork reserves a second run and queues COPY ops for the used
 * blocks), no swapping (UNSUPPORTED). Every call is [engine].
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "contiguous.h"

#define CONTIG_WHO "cache.contiguous"
#define CONTIG_MAX_BLOCKS (1 << 26)
#define CONTIG_GIB (1024.0 * 1024.0 * 1024.0)
#define CONTIG_MIB (1024.0 * 1024.0)

const loom_param loom_contiguous_params[] = {
    {"block_size", LOOM_PARAM_INT, offsetof(loom_contiguous_config, block_size), "16", 1, 1024,
     NULL, "tokens per KV block (any >= 1; backends may accept only some sizes)"},
    {"memory_fraction", LOOM_PARAM_FLOAT, offsetof(loom_contiguous_config, memory_fraction),
     "0.9", 0.0, 1.0, NULL, "share (0,1] of the backend's free memory given to the KV pool"},
    {"num_blocks", LOOM_PARAM_INT, offsetof(loom_contiguous_config, num_blocks), "0", 0,
     CONTIG_MAX_BLOCKS, NULL,
     "exact device block count; 0 = size from memory_fraction/memory_gib"},
    {"memory_gib", LOOM_PARAM_FLOAT, offsetof(loom_contiguous_config, memory_gib), "0", 0, 1e6,
     NULL, "absolute KV budget in GiB; 0 = use memory_fraction"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct contig_seq {
    loom_seq_id id;
    int32_t start;   /* first block of the region; -1 = none reserved yet */
    int32_t len;     /* tokens with slots, <= region * bs                */
} contig_seq;

typedef struct contig {
    const loom_host *host;
    loom_contiguous_config cfg;
    bool inited;
    int32_t bs;
    int32_t num_blocks;
    int32_t region;          /* blocks per sequence                       */
    size_t block_bytes;
    uint8_t *used;           /* (num_blocks) 1 = inside some region       */
    int32_t num_used;
    contig_seq *seqs;        /* (num_seqs) unordered                      */
    int32_t num_seqs, seqs_cap;
    loom_block_op *ops;      /* pending [ops_head, num_ops)               */
    int32_t num_ops, ops_head, ops_cap;
    loom_cache_stats st;
} contig;

/* ---------------------------------------------------------------- helpers */

static void contig_publish(contig *c) {
    const loom_host *h = c->host;
    if (!h->metric_set || c->num_blocks == 0) return;
    h->metric_set(h->ctx, "cache.usage", (double)c->num_used / (double)c->num_blocks);
    h->metric_set(h->ctx, "cache.free_blocks", c->num_blocks - c->num_used);
    h->metric_set(h->ctx, "cache.peak_used_blocks", c->st.peak_used_blocks);
    h->metric_set(h->ctx, "cache.cow_copies", (double)c->st.cow_copies);
}

static contig_seq *contig_find(contig *c, loom_seq_id id) {
    for (int32_t i = 0; i < c->num_seqs; i++)
        if (c->seqs[i].id == id) return &c->seqs[i];
    return NULL;
}

/* Append an empty state for id (pointer valid until the next add/remove). */
static contig_seq *contig_add(contig *c, loom_seq_id id) {
    if (c->num_seqs == c->seqs_cap) {
        int32_t cap = c->seqs_cap ? c->seqs_cap * 2 : 16;
        contig_seq *n = c->host->alloc(c->host->ctx, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        if (c->num_seqs) memcpy(n, c->seqs, (size_t)c->num_seqs * sizeof *n);
        c->host->free(c->host->ctx, c->seqs);
        c->seqs = n;
        c->seqs_cap = cap;
    }
    contig_seq *s = &c->seqs[c->num_seqs++];
    *s = (contig_seq){.id = id, .start = -1, .len = 0};
    return s;
}

static void contig_remove(contig *c, contig_seq *s) {
    *s = c->seqs[--c->num_seqs];
}

/* First run of `region` free blocks, or -1. O(num_blocks). */
static int32_t contig_first_fit(const contig *c) {
    int32_t run = 0;
    for (int32_t b = 0; b < c->num_blocks; b++) {
        run = c->used[b] ? 0 : run + 1;
        if (run == c->region) return b - c->region + 1;
    }
    return -1;
}

static void contig_mark(contig *c, int32_t start, uint8_t v) {
    memset(c->used + start, v, (size_t)c->region);
    c->num_used += v ? c->region : -c->region;
    if (c->num_used > c->st.peak_used_blocks) c->st.peak_used_blocks = c->num_used;
}

static bool contig_ops_reserve(contig *c, int32_t extra) {
    if (c->num_ops + extra <= c->ops_cap) return true;
    int32_t cap = c->ops_cap ? c->ops_cap : 64;
    while (cap < c->num_ops + extra) cap *= 2;
    loom_block_op *o = c->host->alloc(c->host->ctx, (size_t)cap * sizeof *o);
    if (!o) return false;
    if (c->num_ops) memcpy(o, c->ops, (size_t)c->num_ops * sizeof *o);
    c->host->free(c->host->ctx, c->ops);
    c->ops = o;
    c->ops_cap = cap;
    return true;
}

/* ------------------------------------------------------------- lifecycle */

static loom_status contig_create(const loom_host *host, const void *config, void **self,
                                 loom_error *err) {
    const loom_contiguous_config *cfg = config;
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    if (!cfg)
        return host->error(host->ctx, err, LOOM_ERR_INVALID, "cache.contiguous: no config");
    if (cfg->block_size < 1 || cfg->block_size > 1024)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.contiguous: block_size=%lld is out of range [1, 1024]",
                           (long long)cfg->block_size);
    if (!(cfg->memory_fraction > 0.0 && cfg->memory_fraction <= 1.0))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.contiguous: memory_fraction=%g must be in (0, 1]",
                           cfg->memory_fraction);
    if (cfg->num_blocks < 0 || cfg->num_blocks > CONTIG_MAX_BLOCKS || !(cfg->memory_gib >= 0.0))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.contiguous: num_blocks=%lld must be in [0, %d] and "
                           "memory_gib=%g >= 0",
                           (long long)cfg->num_blocks, CONTIG_MAX_BLOCKS, cfg->memory_gib);
    contig *c = host->calloc(host->ctx, 1, sizeof *c);
    if (!c)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                           "cache.contiguous: out of host memory creating the instance");
    c->host = host;
    c->cfg = *cfg;
    c->bs = (int32_t)cfg->block_size;
    *self = c;
    return LOOM_OK;
}

static void contig_destroy(void *self) {
    contig *c = self;
    if (!c) return;
    const loom_host *h = c->host;
    h->free(h->ctx, c->used);
    h->free(h->ctx, c->seqs);
    h->free(h->ctx, c->ops);
    h->free(h->ctx, c);
}

static loom_status contig_init(void *self, const loom_cache_init *in, loom_kv_layout *layout,
                               loom_error *err) {
    contig *c = self;
    const loom_host *h = c->host;
    if (c->inited)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.contiguous: init called twice");
    if (!in || !layout)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: init without init/layout");
    if (in->max_model_len <= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: max_model_len=%d; the region size needs it > 0",
                        in->max_model_len);
    c->block_bytes = in->block_bytes ? in->block_bytes(in->ctx, c->bs) : 0;
    c->region = (in->max_model_len + c->bs - 1) / c->bs;

    double n;
    double budget = 0;
    if (c->cfg.num_blocks > 0) {
        n = (double)c->cfg.num_blocks;
    } else {
        if (c->block_bytes == 0)
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "cache.contiguous: the backend reports 0 bytes per block of %d "
                            "tokens; change cache.block_size or set cache.num_blocks",
                            c->bs);
        budget = c->cfg.memory_gib > 0.0 ? c->cfg.memory_gib * CONTIG_GIB
                                         : c->cfg.memory_fraction * (double)in->device_free_bytes;
        n = floor(budget / (double)c->block_bytes);
        if (n > CONTIG_MAX_BLOCKS) n = CONTIG_MAX_BLOCKS;
    }
    if (n < c->region)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.contiguous: one region of max_model_len=%d tokens needs %d "
                        "blocks of %d tokens (%.1f MiB) but the pool has %.0f blocks (%.1f MiB); "
                        "raise cache.%s or lower max_model_len",
                        in->max_model_len, c->region, c->bs,
                        (double)c->region * (double)c->block_bytes / CONTIG_MIB, n,
                        n * (double)c->block_bytes / CONTIG_MIB,
                        c->cfg.num_blocks > 0  ? "num_blocks"
                        : c->cfg.memory_gib > 0 ? "memory_gib"
                                                : "memory_fraction (or set memory_gib)");
    c->num_blocks = (int32_t)n;
    c->used = h->calloc(h->ctx, (size_t)c->num_blocks, 1);
    if (!c->used) {
        c->num_blocks = 0;
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.contiguous: out of host memory for %d block flags",
                        (int32_t)n);
    }
    layout->block_size = c->bs;
    layout->num_blocks = c->num_blocks;
    layout->num_cpu_blocks = 0;
    c->inited = true;
    h->log(h->ctx, LOOM_LOG_INFO, CONTIG_WHO,
           "%d blocks of %d tokens: %d regions of %d blocks (max_model_len %d)", c->num_blocks,
           c->bs, c->num_blocks / c->region, c->region, in->max_model_len);
    contig_publish(c);
    return LOOM_OK;
}

/* ------------------------------------------------------------- the calls */

static int32_t contig_acquire_prefix(void *self, const loom_seq_info *seq) {
    (void)self;
    (void)seq;
    return 0; /* no prefix caching in the baseline */
}

static loom_status contig_allocate(void *self, const loom_seq_info *seq, int32_t num_tokens,
                                   loom_error *err) {
    contig *c = self;
    const loom_host *h = c->host;
    if (!c->inited)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.contiguous: allocate before init");
    if (!seq || num_tokens < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: allocate needs a sequence and num_tokens >= 0");
    if ((int64_t)num_tokens > (int64_t)c->region * c->bs)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: seq %lld asks for %d tokens, beyond its region of "
                        "%d (max_model_len)",
                        (long long)seq->id, num_tokens, c->region * c->bs);
    contig_seq *s = contig_find(c, seq->id);
    if (!s || s->start < 0) {
        int32_t start = contig_first_fit(c);
        if (start < 0)
            return h->error(h->ctx, err, LOOM_ERR_NO_SPACE,
                            "cache.contiguous: no free run of %d blocks for seq %lld (%d of %d "
                            "blocks free)",
                            c->region, (long long)seq->id, c->num_blocks - c->num_used,
                            c->num_blocks);
        if (!s) s = contig_add(c, seq->id);
        if (!s)
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "cache.contiguous: out of host memory tracking seq %lld",
                            (long long)seq->id);
        s->start = start;
        contig_mark(c, start, 1);
    }
    if (num_tokens > s->len) s->len = num_tokens;
    return LOOM_OK;
}

static void contig_truncate(void *self, const loom_seq_info *seq, int32_t num_tokens) {
    contig *c = self;
    contig_seq *s = seq ? contig_find(c, seq->id) : NULL;
    if (!s) return;
    if (num_tokens < 0) num_tokens = 0;
    if (num_tokens < s->len) s->len = num_tokens;
}

static void contig_free(void *self, loom_seq_id id) {
    contig *c = self;
    contig_seq *s = contig_find(c, id);
    if (!s) return;
    if (s->start >= 0) contig_mark(c, s->start, 0);
    contig_remove(c, s);
}

static loom_status contig_fork(void *self, loom_seq_id parent, loom_seq_id child,
                               loom_error *err) {
    contig *c = self;
    const loom_host *h = c->host;
    contig_seq *ps = contig_find(c, parent);
    if (!ps)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: fork from unknown seq %lld", (long long)parent);
    if (parent == child)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: fork of seq %lld onto itself", (long long)parent);
    contig_seq *cs = contig_find(c, child);
    if (cs && cs->start >= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.contiguous: fork target seq %lld already holds a region",
                        (long long)child);
    int32_t pstart = ps->start, plen = ps->len;
    int32_t ncopy = (plen + c->bs - 1) / c->bs;
    int32_t start = -1;
    if (pstart >= 0) {
        start = contig_first_fit(c);
        if (start < 0)
            return h->error(h->ctx, err, LOOM_ERR_NO_SPACE,
                            "cache.contiguous: no free run of %d blocks to fork seq %lld",
                            c->region, (long long)parent);
        if (!contig_ops_reserve(c, ncopy))
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "cache.contiguous: out of host memory queueing copies");
    }
    if (!cs) cs = contig_add(c, child); /* may move ps: use the saved values */
    if (!cs)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.contiguous: out of host memory tracking seq %lld",
                        (long long)child);
    cs->len = plen;
    if (pstart >= 0) {
        cs->start = start;
        contig_mark(c, start, 1);
        for (int32_t j = 0; j < ncopy; j++)
            c->ops[c->num_ops++] =
                (loom_block_op){.kind = LOOM_BLOCK_COPY, .src = pstart + j, .dst = start + j};
        c->st.cow_copies += ncopy;
    }
    return LOOM_OK;
}

static loom_status contig_swap(void *self, loom_seq_id id, loom_error *err) {
    contig *c = self;
    return c->host->error(c->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                          "cache.contiguous: no swapping (seq %lld); preempt by recompute or "
                          "use the paged cache with cpu_swap_gib",
                          (long long)id);
}

static int32_t contig_block_table(void *self, loom_seq_id id, int32_t *out, int32_t cap) {
    contig *c = self;
    contig_seq *s = contig_find(c, id);
    if (!s || s->start < 0) return 0;
    int32_t n = (s->len + c->bs - 1) / c->bs;
    for (int32_t j = 0; j < n && j < cap && out; j++) out[j] = s->start + j;
    return n;
}

static int32_t contig_take_block_ops(void *self, loom_block_op *out, int32_t cap) {
    contig *c = self;
    int32_t n = c->num_ops - c->ops_head;
    if (n > cap) n = cap;
    if (n <= 0 || !out) { /* drained: once per step, publish the gauges */
        contig_publish(c);
        return 0;
    }
    memcpy(out, c->ops + c->ops_head, (size_t)n * sizeof *out);
    c->ops_head += n;
    if (c->ops_head == c->num_ops) c->ops_head = c->num_ops = 0;
    return n;
}

/* What allocate() could hand out now: whole regions only, so the blocks of
 * the regions that still fit in the free runs (fragments do not count). */
static int32_t contig_num_free_blocks(void *self) {
    contig *c = self;
    int32_t total = 0, run = 0;
    for (int32_t b = 0; b <= c->num_blocks; b++) {
        if (b < c->num_blocks && !c->used[b]) {
            run++;
            continue;
        }
        total += run / c->region * c->region;
        run = 0;
    }
    return total;
}

static void contig_stats(void *self, loom_cache_stats *out) {
    contig *c = self;
    if (!out) return;
    loom_cache_stats s = c->st;
    uint32_t size = out->struct_size ? out->struct_size : (uint32_t)sizeof s;
    if (size > sizeof s) size = sizeof s;
    s.struct_size = size;
    s.num_blocks = c->num_blocks;
    s.free_blocks = c->num_blocks - c->num_used;
    s.cached_blocks = 0;
    s.num_cpu_blocks = 0;
    s.free_cpu_blocks = 0;
    s.block_size = c->bs;
    memcpy(out, &s, size);
    contig_publish(c);
}

const loom_cache_ops loom_contiguous_ops = {
    .struct_size = sizeof(loom_cache_ops),
    .create = contig_create,
    .destroy = contig_destroy,
    .init = contig_init,
    .acquire_prefix = contig_acquire_prefix,
    .allocate = contig_allocate,
    .truncate = contig_truncate,
    .free = contig_free,
    .fork = contig_fork,
    .swap_out = contig_swap,
    .swap_in = contig_swap,
    .block_table = contig_block_table,
    .take_block_ops = contig_take_block_ops,
    .num_free_blocks = contig_num_free_blocks,
    .stats = contig_stats,
};

/* ----------------------------------------------------------- debug hooks */

int32_t loom_contiguous_debug_region(void *self) { return ((contig *)self)->region; }

int32_t loom_contiguous_debug_start(void *self, loom_seq_id id) {
    contig_seq *s = contig_find(self, id);
    return s ? s->start : -1;
}

bool loom_contiguous_debug_check(void *self, char *msg, size_t msg_size) {
    contig *c = self;
    const loom_host *h = c->host;
    if (!c->inited) return true;
    uint8_t *seen = h->calloc(h->ctx, (size_t)c->num_blocks, 1);
    bool ok = true;
    if (!seen) {
        snprintf(msg, msg_size, "out of memory in check");
        return false;
    }
    int32_t used = 0;
    for (int32_t i = 0; i < c->num_seqs && ok; i++) {
        const contig_seq *s = &c->seqs[i];
        for (int32_t k = i + 1; k < c->num_seqs && ok; k++)
            if (c->seqs[k].id == s->id) {
                snprintf(msg, msg_size, "seq %lld tracked twice", (long long)s->id);
                ok = false;
            }
        if (s->start < 0) continue;
        if (s->start + c->region > c->num_blocks || s->len > c->region * c->bs) {
            snprintf(msg, msg_size, "seq %lld: region %d+%d or len %d out of range",
                     (long long)s->id, s->start, c->region, s->len);
            ok = false;
        }
        for (int32_t b = s->start; b < s->start + c->region && ok; b++) {
            if (seen[b] || !c->used[b]) {
                snprintf(msg, msg_size, "block %d: %s", b,
                         seen[b] ? "in two regions" : "in a region but marked free");
                ok = false;
            }
            seen[b] = 1;
            used++;
        }
    }
    if (ok && used != c->num_used) {
        snprintf(msg, msg_size, "%d blocks in regions, %d marked used", used, c->num_used);
        ok = false;
    }
    h->free(h->ctx, seen);
    return ok;
}
