/*
 * plugins/cache/paged/paged.c — the `paged` KV-cache manager: a pool of
 * fixed-size blocks handed out by id, per-sequence block tables, reference
 * counts, copy-on-write after fork, content-hash prefix caching with LRU
 * eviction, and swapping whole sequences to a host pool.
 *
 * It deals in ids and counts only (loom/cache.h): the backend owns the K/V
 * tensors and executes the copies and swaps this manager queues.
 *
 * Block life cycle. A block is in exactly one of three places:
 *   USED    ref > 0, referenced by that many sequence table entries;
 *   FREE    ref == 0, no prefix hash: the plain free list;
 *   CACHED  ref == 0, still registered in the prefix cache: the LRU list.
 * allocate() takes the front of the plain free list first (most recently
 * freed partial blocks: warm and worthless to keep) and only then evicts the
 * head of the LRU list (the least recently released cached block), removing
 * its hash. Releasing a sequence appends its cached blocks to the LRU tail in
 * reverse table order, so a sequence's deepest blocks are evicted before its
 * first ones (a prefix is only reachable through its first block; cf. vLLM's
 * FreeKVCacheBlockQueue).
 *
 * Prefix hashes. Block j of a sequence is keyed by
 *     h1[j] = H1(h1[j-1], tokens[j*bs .. (j+1)*bs))     h1[-1] = root
 * and likewise by an independently built second hash h2. The hash table maps
 * h1 -> block (tests may mask the key to force collisions); a hit requires
 * the block's full h1 and h2 to match and its stored tokens (kept for every
 * registered block: num_blocks * block_size int32s) to equal the query's
 * exactly. Both hashes are injective in the parent for fixed tokens, so a hit
 * proves this block's tokens and that the earlier prefix has the same h1 and
 * h2; a false hit needs two different earlier prefixes colliding in both
 * 64-bit hashes at once. The hashes are fast mixers, not cryptographic: a
 * workload crafted to collide them is out of scope.
 *
 * Registration. allocate() registers blocks that are full of known,
 * non-draft tokens (tokens below num_tokens - num_draft); a block whose key
 * is already taken stays an unregistered duplicate. A truncated sequence's
 * last, now partial block keeps its registration while its contents are
 * still whole; it is copied (if shared) or unregistered (if not) only when
 * allocate() is about to write into it.
 *
 * Admission watermark: a sequence's first successful allocate() must leave
 * watermark * num_blocks blocks free, unless nothing else holds blocks.
 *
 * Swap moves a sequence's whole table to the host pool and back, one op per
 * block; shared blocks are copied out (sharing is not preserved across a
 * swap) and the device copies of registered blocks stay cached.
 *
 * Groups and windows (loom/cache.h). With the backend's block-table groups
 * taken (sliding_window: auto), a sequence has G tables of equal length in
 * one array and every new table position takes a block in each group. A
 * group with window W releases, at allocate(), its leading blocks that no
 * query from seq->num_computed on reads — block j once (j+1)*bs <=
 * num_computed - W + 1 — leaving -1 there (`dropped` counts that leading
 * run; a run that skips past the table's end is never allocated). A
 * released registered block stays cached like any other. Prefix keys mix
 * in the group (group 0's key is h1 itself, so one group hashes as
 * before), and a prefix of m blocks is a hit when every global group holds
 * blocks 0..m-1 and every windowed group the blocks inside the window of
 * position m*bs — the most such m wins (cf. vLLM's sliding-window manager,
 * which searches its window's run of hits from the right).
 *
 * What this file refuses to be: it never touches device memory, never
 * blocks, and is not thread-safe — every call is [engine].
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "paged.h"

#define PAGED_WHO "cache.paged"
#define PAGED_MAX_BLOCKS (1 << 26) /* ids stay far from INT32_MAX; 2^26 blocks is >100 TB of KV */
#define PAGED_GIB (1024.0 * 1024.0 * 1024.0)
#define PAGED_MIB (1024.0 * 1024.0)

/* ------------------------------------------------------------ parameters */

static const char *const paged_window_choices[] = {"auto", "off", NULL};

const loom_param loom_paged_params[] = {
    {"block_size", LOOM_PARAM_INT, offsetof(loom_paged_config, block_size), "16", 1, 1024, NULL,
     "tokens per KV block (any >= 1; backends may accept only some sizes)"},
    {"memory_fraction", LOOM_PARAM_FLOAT, offsetof(loom_paged_config, memory_fraction), "0.9",
     0.0, 1.0, NULL, "share (0,1] of the backend's free memory given to the KV pool"},
    {"num_blocks", LOOM_PARAM_INT, offsetof(loom_paged_config, num_blocks), "0", 0,
     PAGED_MAX_BLOCKS, NULL, "exact device block count; 0 = size from memory_fraction/memory_gib"},
    {"memory_gib", LOOM_PARAM_FLOAT, offsetof(loom_paged_config, memory_gib), "0", 0, 1e6, NULL,
     "absolute KV budget in GiB; 0 = use memory_fraction"},
    {"prefix_caching", LOOM_PARAM_BOOL, offsetof(loom_paged_config, prefix_caching), "true", 0,
     0, NULL, "reuse full blocks whose tokens (and prefix) match"},
    {"watermark", LOOM_PARAM_FLOAT, offsetof(loom_paged_config, watermark), "0.01", 0, 0.99,
     NULL, "share of blocks kept free when admitting a new sequence"},
    {"cpu_swap_gib", LOOM_PARAM_FLOAT, offsetof(loom_paged_config, cpu_swap_gib), "0", 0, 1e6,
     NULL, "host swap pool in GiB; 0 = no swapping (preempt by recompute)"},
    {"num_cpu_blocks", LOOM_PARAM_INT, offsetof(loom_paged_config, num_cpu_blocks), "0", 0,
     PAGED_MAX_BLOCKS, NULL, "exact host block count; 0 = size from cpu_swap_gib"},
    {"sliding_window", LOOM_PARAM_ENUM, offsetof(loom_paged_config, sliding_window), "auto", 0, 0,
     paged_window_choices,
     "auto: block tables per layer group, windowed layers' old blocks freed; off: keep all"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* ------------------------------------------------------------------ state */

enum { PAGED_USED = 0, PAGED_FREE = 1, PAGED_CACHED = 2 };

typedef struct paged_block {
    int32_t ref;     /* table entries referencing it                        */
    int32_t prev;    /* list links while FREE/CACHED; sentinels are N, N+1  */
    int32_t next;
    uint8_t where;   /* PAGED_USED / PAGED_FREE / PAGED_CACHED              */
    uint8_t hashed;  /* registered in the prefix table under h1             */
    uint8_t group;   /* the group whose table registered it (key of h1)     */
    uint64_t h1, h2; /* valid when hashed                                   */
} paged_block;

/* Open-addressing map u64 -> i64 (linear probing, backward-shift delete).
 * Used for prefix hash -> block id and seq id -> paged_seq*. */
typedef struct paged_map {
    uint64_t *keys;
    int64_t *vals;
    uint8_t *used;
    size_t cap;      /* power of two, or 0 before the first insert */
    size_t count;
} paged_map;

typedef struct paged_seq {
    loom_seq_id id;
    int32_t len;        /* tokens that have slots; nblocks == ceil(len / bs) */
    int32_t nblocks;    /* entries of each group's table                     */
    int32_t cap;        /* capacity of each table and of h1/h2               */
    int32_t *blocks;    /* (G, cap): group g's table at g * cap; device ids,
                           host ids while swapped, -1 for released ones      */
    int32_t dropped[LOOM_KV_GROUPS_MAX]; /* leading released entries per group */
    uint64_t *h1, *h2;  /* (num_hashed) chain hashes of the leading blocks   */
    int32_t num_hashed; /* leading full blocks whose chain hash is known     */
    bool swapped;
    bool admitted;      /* allocate() succeeded once: watermark is behind it */
} paged_seq;

typedef struct paged {
    const loom_host *host;
    loom_paged_config cfg;
    bool inited;

    int32_t bs;              /* tokens per block                             */
    int32_t G;               /* block tables per sequence                    */
    int32_t window[LOOM_KV_GROUPS_MAX]; /* per group, tokens; 0 = keep all   */
    bool any_window;         /* some group releases blocks                   */
    int32_t *ok;             /* (ok_cap) acquire_prefix's scratch            */
    int32_t ok_cap;
    int32_t num_blocks;      /* device blocks                                */
    int32_t num_cpu_blocks;  /* host blocks (0 = no swap)                    */
    int32_t watermark_blocks;
    size_t block_bytes;      /* bytes per block from the backend (0 unknown) */

    paged_block *blocks;     /* (num_blocks + 2): last two are list sentinels */
    int32_t num_plain;       /* blocks on the plain free list                */
    int32_t num_cached;      /* blocks on the LRU list                       */
    int32_t *tokens;         /* (num_blocks, bs) tokens of registered blocks */
    paged_map prefix;        /* h1 -> block id                               */
    paged_map seqs;          /* seq id -> paged_seq*                         */

    uint64_t key_mask;       /* prefix table key = h1 & key_mask; ~0 except
                              * in tests that force key collisions         */
    int32_t *host_ref;       /* (num_cpu_blocks)                             */
    int32_t *host_free;      /* (num_cpu_blocks) stack of free host ids      */
    int32_t num_host_free;

    loom_block_op *ops;      /* pending ops [ops_head, num_ops)              */
    int32_t num_ops, ops_head, ops_cap;

    loom_cache_stats st;     /* counters (free counts filled on demand)      */
} paged;

#define PLAIN_HEAD(p) ((p)->num_blocks)
#define LRU_HEAD(p) ((p)->num_blocks + 1)

/* --------------------------------------------------------------- hashing */

static const uint64_t PAGED_ROOT1 = 0x6c6f6f6d2d6b7631ULL; /* "loom-kv1" */
static const uint64_t PAGED_ROOT2 = 0x6c6f6f6d2d6b7632ULL; /* "loom-kv2" */

/* splitmix64 finaliser: a bijection on 64 bits. */
static inline uint64_t paged_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* H1: per token h = mix(h ^ token*K); every step is a bijection of h, so
 * for fixed tokens the result is injective in `parent`. */
static uint64_t paged_hash1(uint64_t parent, const int32_t *t, int32_t n) {
    uint64_t h = paged_mix64(parent ^ 0x9e3779b97f4a7c15ULL);
    for (int32_t i = 0; i < n; i++)
        h = paged_mix64(h ^ ((uint64_t)(uint32_t)t[i] * 0xc2b2ae3d27d4eb4fULL));
    return h;
}

/* H2: FNV-1a over the token bytes from a parent-seeded basis, then the
 * murmur3 finaliser; built differently from H1 so their collisions are
 * unrelated, and likewise injective in `parent` for fixed tokens. */
static uint64_t paged_hash2(uint64_t parent, const int32_t *t, int32_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ parent;
    for (int32_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xffu;
            h *= 0x100000001b3ULL;
        }
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* ------------------------------------------------------------------- map */

static size_t paged_map_home(const paged_map *m, uint64_t key) {
    return (size_t)(paged_mix64(key) & (m->cap - 1));
}

static bool paged_map_find(const paged_map *m, uint64_t key, int64_t *val) {
    if (m->cap == 0) return false;
    for (size_t i = paged_map_home(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (!m->used[i]) return false;
        if (m->keys[i] == key) {
            if (val) *val = m->vals[i];
            return true;
        }
    }
}

static void paged_map_release(const loom_host *h, paged_map *m) {
    h->free(h->ctx, m->keys);
    h->free(h->ctx, m->vals);
    h->free(h->ctx, m->used);
    memset(m, 0, sizeof *m);
}

/* Resize to `cap` (power of two > count). On failure the map is unchanged. */
static bool paged_map_resize(const loom_host *h, paged_map *m, size_t cap) {
    paged_map n = {0};
    n.cap = cap;
    n.keys = h->alloc(h->ctx, cap * sizeof *n.keys);
    n.vals = h->alloc(h->ctx, cap * sizeof *n.vals);
    n.used = h->calloc(h->ctx, cap, 1);
    if (!n.keys || !n.vals || !n.used) {
        paged_map_release(h, &n);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->used[i]) continue;
        size_t j = paged_map_home(&n, m->keys[i]);
        while (n.used[j]) j = (j + 1) & (cap - 1);
        n.used[j] = 1;
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
        n.count++;
    }
    paged_map_release(h, m);
    *m = n;
    return true;
}

/* Make room for one more key without failing later. */
static bool paged_map_reserve(const loom_host *h, paged_map *m) {
    if ((m->count + 1) * 2 <= m->cap) return true;
    return paged_map_resize(h, m, m->cap ? m->cap * 2 : 16);
}

/* Insert a key known to be absent; room must have been reserved. */
static void paged_map_put(paged_map *m, uint64_t key, int64_t val) {
    size_t i = paged_map_home(m, key);
    while (m->used[i]) i = (i + 1) & (m->cap - 1);
    m->used[i] = 1;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

static void paged_map_del(paged_map *m, uint64_t key) {
    if (m->cap == 0) return;
    size_t mask = m->cap - 1, i = paged_map_home(m, key);
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & mask;
    if (!m->used[i]) return;
    /* Backward shift: pull later entries of the probe run into the hole
     * unless their home lies cyclically in (hole, j]. */
    for (size_t j = (i + 1) & mask; m->used[j]; j = (j + 1) & mask) {
        size_t k = paged_map_home(m, m->keys[j]);
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        i = j;
    }
    m->used[i] = 0;
    m->count--;
}

/* ------------------------------------------------------------ block lists */

static void paged_list_unlink(paged *p, int32_t b) {
    paged_block *B = p->blocks;
    B[B[b].prev].next = B[b].next;
    B[B[b].next].prev = B[b].prev;
    if (B[b].where == PAGED_FREE) p->num_plain--;
    else if (B[b].where == PAGED_CACHED) p->num_cached--;
    B[b].where = PAGED_USED;
    B[b].prev = B[b].next = -1;
}

/* Insert b after `at` (a sentinel or a listed block). */
static void paged_list_insert_after(paged *p, int32_t at, int32_t b) {
    paged_block *B = p->blocks;
    B[b].prev = at;
    B[b].next = B[at].next;
    B[B[at].next].prev = b;
    B[at].next = b;
}

static int32_t paged_num_free(const paged *p) { return p->num_plain + p->num_cached; }

static void paged_note_peak(paged *p) {
    int32_t used = p->num_blocks - paged_num_free(p);
    if (used > p->st.peak_used_blocks) p->st.peak_used_blocks = used;
}

/* Prefix-table key of a block of group g with chain hash h1: h1 itself in
 * group 0 (one group hashes as before), a bijective remix in the others. */
static uint64_t paged_key(const paged *p, uint64_t h1, int32_t g) {
    uint64_t k = g ? paged_mix64(h1 ^ (0xa0761d6478bd642fULL * (uint64_t)g)) : h1;
    return k & p->key_mask;
}

/* Group g's table of s. */
static inline int32_t *paged_tab(const paged_seq *s, int32_t g) {
    return s->blocks + (size_t)g * s->cap;
}

/* Blocks s holds now, all groups (device or host). */
static int32_t paged_seq_held(const paged *p, const paged_seq *s) {
    int32_t n = 0;
    for (int32_t g = 0; g < p->G; g++)
        if (s->nblocks > s->dropped[g]) n += s->nblocks - s->dropped[g];
    return n;
}

static void paged_note_seq(paged *p, const paged_seq *s) {
    int32_t held = paged_seq_held(p, s);
    if (held > p->st.peak_seq_blocks) p->st.peak_seq_blocks = held;
}

static void paged_unregister(paged *p, int32_t b) {
    paged_block *blk = &p->blocks[b];
    if (!blk->hashed) return;
    int64_t v;
    uint64_t key = paged_key(p, blk->h1, blk->group);
    if (paged_map_find(&p->prefix, key, &v) && v == b) paged_map_del(&p->prefix, key);
    blk->hashed = 0;
}

/* Take a free block (caller checked there is one): plain list first, else
 * evict the least recently released cached block. Returns it with ref 1. */
static int32_t paged_take_free(paged *p) {
    paged_block *B = p->blocks;
    int32_t b;
    if (p->num_plain > 0) {
        b = B[PLAIN_HEAD(p)].next;
    } else {
        b = B[LRU_HEAD(p)].next;
        paged_unregister(p, b);
        p->st.evictions++;
    }
    paged_list_unlink(p, b);
    B[b].ref = 1;
    return b;
}

static void paged_ref(paged *p, int32_t b) {
    if (p->blocks[b].ref == 0) paged_list_unlink(p, b);
    p->blocks[b].ref++;
}

/* Drop one reference. A block reaching 0 keeps its hash and joins the LRU
 * tail if registered, else the plain list's front (reused first). */
static void paged_unref(paged *p, int32_t b) {
    paged_block *blk = &p->blocks[b];
    if (--blk->ref > 0) return;
    if (blk->hashed) {
        paged_list_insert_after(p, p->blocks[LRU_HEAD(p)].prev, b);
        blk->where = PAGED_CACHED;
        p->num_cached++;
    } else {
        paged_list_insert_after(p, PLAIN_HEAD(p), b);
        blk->where = PAGED_FREE;
        p->num_plain++;
    }
}

static void paged_host_unref(paged *p, int32_t hb) {
    if (--p->host_ref[hb] == 0) p->host_free[p->num_host_free++] = hb;
}

/* Release entries [from, nblocks) of every table of s, deepest first (LRU
 * order). */
static void paged_release_tail(paged *p, paged_seq *s, int32_t from) {
    for (int32_t j = s->nblocks - 1; j >= from; j--)
        for (int32_t g = 0; g < p->G; g++) {
            int32_t b = paged_tab(s, g)[j];
            if (b < 0) continue;
            if (s->swapped) paged_host_unref(p, b);
            else paged_unref(p, b);
        }
    if (from < s->nblocks) s->nblocks = from;
    for (int32_t g = 0; g < p->G; g++)
        if (s->dropped[g] > s->nblocks) s->dropped[g] = s->nblocks;
}

/* --------------------------------------------------------------- metrics */

/* Gauges through host->metric_set, published when the step's ops are
 * drained (take_block_ops returning 0, once per step) and on stats(), not
 * on every call: allocate runs per sequence per step. Counters are
 * published as their running totals. */

static void paged_publish(paged *p) {
    const loom_host *h = p->host;
    if (!h->metric_set || p->num_blocks == 0) return;
    int32_t free_blocks = paged_num_free(p);
    h->metric_set(h->ctx, "cache.usage",
                  (double)(p->num_blocks - free_blocks) / (double)p->num_blocks);
    h->metric_set(h->ctx, "cache.free_blocks", free_blocks);
    h->metric_set(h->ctx, "cache.cached_blocks", p->num_cached);
    h->metric_set(h->ctx, "cache.peak_used_blocks", p->st.peak_used_blocks);
    h->metric_set(h->ctx, "cache.prefix_hit_rate",
                  p->st.prefix_queries ? (double)p->st.prefix_hits / (double)p->st.prefix_queries
                                       : 0.0);
    h->metric_set(h->ctx, "cache.prefix_queries", (double)p->st.prefix_queries);
    h->metric_set(h->ctx, "cache.prefix_hits", (double)p->st.prefix_hits);
    h->metric_set(h->ctx, "cache.evictions", (double)p->st.evictions);
    h->metric_set(h->ctx, "cache.cow_copies", (double)p->st.cow_copies);
    if (p->num_cpu_blocks > 0) {
        h->metric_set(h->ctx, "cache.cpu_usage",
                      (double)(p->num_cpu_blocks - p->num_host_free) / p->num_cpu_blocks);
        h->metric_set(h->ctx, "cache.swaps_out", (double)p->st.swaps_out);
        h->metric_set(h->ctx, "cache.swaps_in", (double)p->st.swaps_in);
    }
}

/* ----------------------------------------------------------------- seqs */

static paged_seq *paged_seq_find(paged *p, loom_seq_id id) {
    int64_t v;
    return paged_map_find(&p->seqs, (uint64_t)id, &v) ? (paged_seq *)(intptr_t)v : NULL;
}

/* Find or create an empty state for id; NULL only on allocation failure.
 * *created tells the caller to undo it if a later step fails. */
static paged_seq *paged_seq_get(paged *p, loom_seq_id id, bool *created) {
    *created = false;
    paged_seq *s = paged_seq_find(p, id);
    if (s) return s;
    if (!paged_map_reserve(p->host, &p->seqs)) return NULL;
    s = p->host->calloc(p->host->ctx, 1, sizeof *s);
    if (!s) return NULL;
    s->id = id;
    paged_map_put(&p->seqs, (uint64_t)id, (int64_t)(intptr_t)s);
    *created = true;
    return s;
}

static void paged_seq_destroy(paged *p, paged_seq *s) {
    const loom_host *h = p->host;
    paged_map_del(&p->seqs, (uint64_t)s->id);
    h->free(h->ctx, s->blocks);
    h->free(h->ctx, s->h1);
    h->free(h->ctx, s->h2);
    h->free(h->ctx, s);
}

/* Grow s's arrays to hold n entries per table; false (and s unchanged) on
 * failure. */
static bool paged_seq_reserve(paged *p, paged_seq *s, int32_t n) {
    if (n <= s->cap) return true;
    const loom_host *h = p->host;
    int32_t cap = s->cap ? s->cap : 8;
    while (cap < n) cap = cap > INT32_MAX / 2 ? n : cap * 2;
    int32_t *b = h->alloc(h->ctx, (size_t)cap * (size_t)p->G * sizeof *b);
    uint64_t *x = h->alloc(h->ctx, (size_t)cap * sizeof *x);
    uint64_t *y = h->alloc(h->ctx, (size_t)cap * sizeof *y);
    if (!b || !x || !y) {
        h->free(h->ctx, b);
        h->free(h->ctx, x);
        h->free(h->ctx, y);
        return false;
    }
    for (int32_t g = 0; s->nblocks && g < p->G; g++)
        memcpy(b + (size_t)g * cap, paged_tab(s, g), (size_t)s->nblocks * sizeof *b);
    if (s->num_hashed) {
        memcpy(x, s->h1, (size_t)s->num_hashed * sizeof *x);
        memcpy(y, s->h2, (size_t)s->num_hashed * sizeof *y);
    }
    h->free(h->ctx, s->blocks);
    h->free(h->ctx, s->h1);
    h->free(h->ctx, s->h2);
    s->blocks = b;
    s->h1 = x;
    s->h2 = y;
    s->cap = cap;
    return true;
}

/* Drafts are the trailing tokens; num_draft exists since ABI 1.0 but read
 * it defensively in case a smaller struct is passed. */
static int32_t paged_seq_num_draft(const loom_seq_info *seq) {
    if (seq->struct_size < offsetof(loom_seq_info, num_draft) + sizeof seq->num_draft) return 0;
    return seq->num_draft > 0 ? seq->num_draft : 0;
}

/* Room for n flags in p->ok. */
static bool paged_ok_reserve(paged *p, int32_t n) {
    if (n <= p->ok_cap) return true;
    int32_t *ok = p->host->alloc(p->host->ctx, (size_t)n * sizeof *ok);
    if (!ok) return false;
    p->host->free(p->host->ctx, p->ok);
    p->ok = ok;
    p->ok_cap = n;
    return true;
}

static bool paged_ops_reserve(paged *p, int32_t extra) {
    if (p->num_ops + extra <= p->ops_cap) return true;
    int32_t cap = p->ops_cap ? p->ops_cap : 64;
    while (cap < p->num_ops + extra) cap *= 2;
    loom_block_op *o = p->host->alloc(p->host->ctx, (size_t)cap * sizeof *o);
    if (!o) return false;
    if (p->num_ops) memcpy(o, p->ops, (size_t)p->num_ops * sizeof *o);
    p->host->free(p->host->ctx, p->ops);
    p->ops = o;
    p->ops_cap = cap;
    return true;
}

static void paged_ops_push(paged *p, loom_block_op_kind kind, int32_t src, int32_t dst) {
    p->ops[p->num_ops++] = (loom_block_op){.kind = kind, .src = src, .dst = dst};
}

/* Register the blocks of s that are full with known, non-draft tokens and
 * not yet hashed: blocks [num_hashed, L / bs) with L = min(len, num_tokens -
 * num_draft). A block whose hash is already taken (another copy of the same
 * prefix, or a true collision) stays unregistered. */
static void paged_register_full(paged *p, paged_seq *s, const loom_seq_info *seq) {
    if (!p->cfg.prefix_caching || !seq->tokens) return;
    int32_t known = seq->num_tokens - paged_seq_num_draft(seq);
    int32_t limit = s->len < known ? s->len : known;
    int32_t full = limit / p->bs;
    for (int32_t j = s->num_hashed; j < full; j++) {
        const int32_t *toks = seq->tokens + (size_t)j * p->bs;
        uint64_t a = paged_hash1(j ? s->h1[j - 1] : PAGED_ROOT1, toks, p->bs);
        uint64_t b = paged_hash2(j ? s->h2[j - 1] : PAGED_ROOT2, toks, p->bs);
        s->h1[j] = a;
        s->h2[j] = b;
        for (int32_t g = 0; g < p->G; g++) {
            int32_t blk = paged_tab(s, g)[j];
            if (blk < 0 || p->blocks[blk].hashed ||
                paged_map_find(&p->prefix, paged_key(p, a, g), NULL))
                continue;
            /* The prefix table was sized for every block: the put cannot fail. */
            paged_map_put(&p->prefix, paged_key(p, a, g), blk);
            p->blocks[blk].hashed = 1;
            p->blocks[blk].group = (uint8_t)g;
            p->blocks[blk].h1 = a;
            p->blocks[blk].h2 = b;
            memcpy(p->tokens + (size_t)blk * p->bs, toks, (size_t)p->bs * sizeof *toks);
        }
    }
    if (full > s->num_hashed) s->num_hashed = full;
}

/* ------------------------------------------------------------ lifecycle */

static loom_status paged_create(const loom_host *host, const void *config, void **self,
                                loom_error *err) {
    const loom_paged_config *c = config;
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    if (!c) return host->error(host->ctx, err, LOOM_ERR_INVALID, "cache.paged: no config given");
    if (c->block_size < 1 || c->block_size > 1024)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: block_size=%lld is out of range [1, 1024]",
                           (long long)c->block_size);
    if (!(c->memory_fraction > 0.0 && c->memory_fraction <= 1.0))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: memory_fraction=%g must be in (0, 1]",
                           c->memory_fraction);
    if (c->num_blocks < 0 || c->num_blocks > PAGED_MAX_BLOCKS || c->num_cpu_blocks < 0 ||
        c->num_cpu_blocks > PAGED_MAX_BLOCKS)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: num_blocks=%lld / num_cpu_blocks=%lld must be in "
                           "[0, %d]",
                           (long long)c->num_blocks, (long long)c->num_cpu_blocks,
                           PAGED_MAX_BLOCKS);
    if (!(c->memory_gib >= 0.0) || !(c->cpu_swap_gib >= 0.0))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: memory_gib=%g and cpu_swap_gib=%g must be >= 0",
                           c->memory_gib, c->cpu_swap_gib);
    if (!(c->watermark >= 0.0 && c->watermark < 1.0))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: watermark=%g must be in [0, 1)", c->watermark);
    if (c->sliding_window != PAGED_WINDOW_AUTO && c->sliding_window != PAGED_WINDOW_OFF)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "cache.paged: sliding_window=%lld is neither auto (0) nor off (1)",
                           (long long)c->sliding_window);
    paged *p = host->calloc(host->ctx, 1, sizeof *p);
    if (!p)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                           "cache.paged: out of host memory creating the instance");
    p->host = host;
    p->cfg = *c;
    p->key_mask = ~(uint64_t)0;
    p->bs = (int32_t)c->block_size;
    p->G = 1;
    *self = p;
    return LOOM_OK;
}

static void paged_destroy(void *self) {
    paged *p = self;
    if (!p) return;
    const loom_host *h = p->host;
    for (size_t i = 0; i < p->seqs.cap; i++) {
        if (!p->seqs.used[i]) continue;
        paged_seq *s = (paged_seq *)(intptr_t)p->seqs.vals[i];
        h->free(h->ctx, s->blocks);
        h->free(h->ctx, s->h1);
        h->free(h->ctx, s->h2);
        h->free(h->ctx, s);
    }
    paged_map_release(h, &p->seqs);
    paged_map_release(h, &p->prefix);
    h->free(h->ctx, p->blocks);
    h->free(h->ctx, p->tokens);
    h->free(h->ctx, p->host_ref);
    h->free(h->ctx, p->host_free);
    h->free(h->ctx, p->ops);
    h->free(h->ctx, p->ok);
    h->free(h->ctx, p);
}

/* Decide the device block count from the config and the backend. */
static loom_status paged_size_device(paged *p, const loom_cache_init *in, int64_t *out,
                                     loom_error *err) {
    const loom_host *h = p->host;
    const loom_paged_config *c = &p->cfg;
    if (c->num_blocks > 0) {
        *out = c->num_blocks;
        return LOOM_OK;
    }
    if (p->block_bytes == 0)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "cache.paged: the backend reports 0 bytes per block of %d tokens (KV "
                        "dtype or block_size unsupported there); change cache.block_size or "
                        "set cache.num_blocks",
                        p->bs);
    double budget = c->memory_gib > 0.0 ? c->memory_gib * PAGED_GIB
                                        : c->memory_fraction * (double)in->device_free_bytes;
    double n = floor(budget / (double)p->block_bytes);
    if (n < 1.0)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.paged: a KV budget of %.1f MiB (%s) holds no block of %d tokens "
                        "(%.2f MiB each); raise cache.%s or set cache.num_blocks",
                        budget / PAGED_MIB,
                        c->memory_gib > 0.0 ? "memory_gib" : "memory_fraction of free memory",
                        p->bs, (double)p->block_bytes / PAGED_MIB,
                        c->memory_gib > 0.0 ? "memory_gib" : "memory_fraction");
    if (n > PAGED_MAX_BLOCKS) {
        h->log(h->ctx, LOOM_LOG_WARN, PAGED_WHO,
               "budget allows %.0f blocks; capping the pool at %d", n, PAGED_MAX_BLOCKS);
        n = PAGED_MAX_BLOCKS;
    }
    *out = (int64_t)n;
    return LOOM_OK;
}

/* Take the backend's block-table groups (loom/cache.h) unless
 * sliding_window is off, the core passes none, or the layout cannot say
 * so; then one block holds layers_per_block layers, not all of them. */
static loom_status paged_take_groups(paged *p, const loom_cache_init *in, loom_kv_layout *layout,
                                     loom_error *err) {
    const loom_host *h = p->host;
    const loom_kv_groups *g = LOOM_HAS_FIELD(in, loom_cache_init, groups) ? in->groups : NULL;
    if (!g || p->cfg.sliding_window == PAGED_WINDOW_OFF ||
        !LOOM_HAS_FIELD(layout, loom_kv_layout, num_groups))
        return LOOM_OK;
    bool ok = g->struct_size >= offsetof(loom_kv_groups, window) + sizeof g->window &&
              g->num_groups >= 1 && g->num_groups <= LOOM_KV_GROUPS_MAX && g->num_layers >= 1 &&
              g->layers_per_block >= 1 && g->layers_per_block <= g->num_layers;
    for (int32_t i = 0; ok && i < g->num_groups; i++) ok = g->window[i] >= 0;
    if (!ok)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: malformed block-table groups from the backend (%d groups, %d "
                        "of %d layers per block); set cache.sliding_window: off",
                        g->num_groups, g->layers_per_block, g->num_layers);
    p->G = g->num_groups;
    for (int32_t i = 0; i < p->G; i++) {
        p->window[i] = g->window[i];
        p->any_window |= g->window[i] > 0;
    }
    if (p->G > 1)
        p->block_bytes = p->block_bytes * (size_t)g->layers_per_block / (size_t)g->num_layers;
    layout->num_groups = p->G;
    return LOOM_OK;
}

/* Blocks one sequence of len tokens needs at least, all groups: each
 * windowed group only the blocks one query's window spans. */
static int64_t paged_min_seq_blocks(const paged *p, int32_t len) {
    int64_t whole = len > 0 ? (len + p->bs - 1) / p->bs : 1, n = 0;
    for (int32_t g = 0; g < p->G; g++) {
        int64_t w = p->window[g] > 0 ? (p->window[g] - 1 + p->bs - 1) / p->bs + 1 : whole;
        n += w < whole ? w : whole;
    }
    return n;
}

static loom_status paged_init(void *self, const loom_cache_init *in, loom_kv_layout *layout,
                              loom_error *err) {
    paged *p = self;
    const loom_host *h = p->host;
    if (p->inited)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.paged: init called twice");
    if (!in || !layout)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.paged: init without init/layout");
    p->block_bytes = in->block_bytes ? in->block_bytes(in->ctx, p->bs) : 0;
    loom_status st = paged_take_groups(p, in, layout, err);
    if (st != LOOM_OK) return st;

    int64_t n = 0;
    st = paged_size_device(p, in, &n, err);
    if (st != LOOM_OK) return st;

    int64_t per_seq = paged_min_seq_blocks(p, in->max_model_len);
    if (n < per_seq) {
        double need = (double)per_seq * (double)p->block_bytes / PAGED_MIB;
        double have = (double)n * (double)p->block_bytes / PAGED_MIB;
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.paged: one sequence of max_model_len=%d tokens needs %lld blocks "
                        "of %d tokens (%.1f MiB) but the pool has %lld blocks (%.1f MiB); raise "
                        "cache.%s, or lower max_model_len",
                        in->max_model_len, (long long)per_seq, p->bs, need, (long long)n, have,
                        p->cfg.num_blocks > 0 ? "num_blocks"
                        : p->cfg.memory_gib > 0 ? "memory_gib"
                                                : "memory_fraction (or set memory_gib)");
    }

    int64_t ncpu = 0;
    if (p->cfg.num_cpu_blocks > 0) ncpu = p->cfg.num_cpu_blocks;
    else if (p->cfg.cpu_swap_gib > 0.0 && p->block_bytes > 0)
        ncpu = (int64_t)floor(p->cfg.cpu_swap_gib * PAGED_GIB / (double)p->block_bytes);
    if (ncpu > PAGED_MAX_BLOCKS) ncpu = PAGED_MAX_BLOCKS;
    if (ncpu > 0 && !in->backend_can_swap) {
        h->log(h->ctx, LOOM_LOG_WARN, PAGED_WHO,
               "the backend cannot swap blocks: ignoring cpu_swap_gib/num_cpu_blocks "
               "(preemption recomputes)");
        ncpu = 0;
    }

    p->num_blocks = (int32_t)n;
    p->num_cpu_blocks = (int32_t)ncpu;
    p->watermark_blocks = (int32_t)(p->cfg.watermark * (double)n);

    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    p->blocks = h->calloc(h->ctx, (size_t)n + 2, sizeof *p->blocks);
    if (p->cfg.prefix_caching)
        p->tokens = h->alloc(h->ctx, (size_t)n * (size_t)p->bs * sizeof *p->tokens);
    bool ok = p->blocks && (!p->cfg.prefix_caching || p->tokens);
    if (ok && p->cfg.prefix_caching) ok = paged_map_resize(h, &p->prefix, cap);
    if (ok && ncpu > 0) {
        p->host_ref = h->calloc(h->ctx, (size_t)ncpu, sizeof *p->host_ref);
        p->host_free = h->alloc(h->ctx, (size_t)ncpu * sizeof *p->host_free);
        ok = p->host_ref && p->host_free;
    }
    if (!ok) {
        h->free(h->ctx, p->blocks);
        h->free(h->ctx, p->tokens);
        h->free(h->ctx, p->host_ref);
        h->free(h->ctx, p->host_free);
        paged_map_release(h, &p->prefix);
        p->blocks = NULL;
        p->tokens = NULL;
        p->host_ref = p->host_free = NULL;
        p->num_blocks = p->num_cpu_blocks = 0;
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.paged: out of host memory for the bookkeeping of %lld blocks "
                        "(prefix caching keeps %d tokens per block); lower the pool size",
                        (long long)n, p->bs);
    }

    /* All blocks start on the plain list in id order (0 handed out first). */
    paged_block *B = p->blocks;
    B[PLAIN_HEAD(p)].prev = B[PLAIN_HEAD(p)].next = PLAIN_HEAD(p);
    B[LRU_HEAD(p)].prev = B[LRU_HEAD(p)].next = LRU_HEAD(p);
    for (int32_t b = 0; b < p->num_blocks; b++) {
        paged_list_insert_after(p, B[PLAIN_HEAD(p)].prev, b);
        B[b].where = PAGED_FREE;
    }
    p->num_plain = p->num_blocks;
    for (int32_t i = 0; i < p->num_cpu_blocks; i++)
        p->host_free[i] = p->num_cpu_blocks - 1 - i; /* pop gives 0 first */
    p->num_host_free = p->num_cpu_blocks;

    layout->block_size = p->bs;
    layout->num_blocks = p->num_blocks;
    layout->num_cpu_blocks = p->num_cpu_blocks;
    p->inited = true;
    h->log(h->ctx, LOOM_LOG_INFO, PAGED_WHO,
           "%d device blocks of %d tokens (%.1f MiB), %d host blocks, prefix caching %s, "
           "watermark %d blocks, %d block-table group%s%s",
           p->num_blocks, p->bs, (double)p->num_blocks * (double)p->block_bytes / PAGED_MIB,
           p->num_cpu_blocks, p->cfg.prefix_caching ? "on" : "off", p->watermark_blocks, p->G,
           p->G == 1 ? "" : "s",
           p->any_window ? " (windowed groups free what left the window)" : "");
    paged_publish(p);
    return LOOM_OK;
}

/* ------------------------------------------------------------- the calls */

/* The registered block of group g holding block j of a sequence whose
 * chain hashes there are a, b and tokens toks; -1 when none (a colliding
 * key is a different block, not a hit). */
static int32_t paged_lookup(const paged *p, int32_t g, uint64_t a, uint64_t b,
                            const int32_t *toks) {
    int64_t v;
    if (!paged_map_find(&p->prefix, paged_key(p, a, g), &v)) return -1;
    const paged_block *blk = &p->blocks[v];
    if (blk->h1 != a || blk->h2 != b || blk->group != g ||
        memcmp(p->tokens + (size_t)v * p->bs, toks, (size_t)p->bs * sizeof *toks) != 0)
        return -1;
    return (int32_t)v;
}

/* First block of a windowed group that the token at position q still
 * reads (0 for a group that keeps everything). */
static int32_t paged_window_lo(const paged *p, int32_t g, int64_t q) {
    int64_t first = q - p->window[g] + 1;
    return p->window[g] > 0 && first > 0 ? (int32_t)(first / p->bs) : 0;
}

/* Chain hashes of s's first blocks into s->h1/h2 while every global group
 * has them cached: how many blocks (at most max_blocks) that is. */
static int32_t paged_global_run(paged *p, paged_seq *s, const loom_seq_info *seq,
                                int32_t max_blocks) {
    for (int32_t j = 0; j < max_blocks; j++) {
        const int32_t *toks = seq->tokens + (size_t)j * p->bs;
        s->h1[j] = paged_hash1(j ? s->h1[j - 1] : PAGED_ROOT1, toks, p->bs);
        s->h2[j] = paged_hash2(j ? s->h2[j - 1] : PAGED_ROOT2, toks, p->bs);
        for (int32_t g = 0; g < p->G; g++)
            if (p->window[g] == 0 && paged_lookup(p, g, s->h1[j], s->h2[j], toks) < 0) return j;
    }
    return max_blocks;
}

/* The longest hit of at most M blocks (chain hashes known) for which every
 * windowed group has the blocks of its window cached: p->ok[m] stays 1
 * while a prefix of m blocks serves every group seen so far. */
static int32_t paged_window_hit(paged *p, const paged_seq *s, const loom_seq_info *seq, int32_t M) {
    if (!p->any_window) return M;
    for (int32_t m = 0; m <= M; m++) p->ok[m] = 1;
    for (int32_t g = 0; g < p->G; g++) {
        if (p->window[g] == 0) continue;
        int32_t run = 0; /* cached blocks ending at j */
        for (int32_t j = 0; j < M; j++) {
            const int32_t *toks = seq->tokens + (size_t)j * p->bs;
            run = paged_lookup(p, g, s->h1[j], s->h2[j], toks) >= 0 ? run + 1 : 0;
            if (j + 1 - paged_window_lo(p, g, (int64_t)(j + 1) * p->bs) > run) p->ok[j + 1] = 0;
        }
    }
    int32_t m = M;
    while (m > 0 && !p->ok[m]) m--;
    return m;
}

static int32_t paged_acquire_prefix(void *self, const loom_seq_info *seq) {
    paged *p = self;
    if (!p->inited || !p->cfg.prefix_caching || !seq || !seq->tokens || seq->num_tokens <= 0)
        return 0;
    int32_t limit = seq->num_tokens - 1;
    int32_t known = seq->num_tokens - paged_seq_num_draft(seq);
    if (known < limit) limit = known;
    int32_t max_blocks = limit > 0 ? limit / p->bs : 0;

    bool created;
    paged_seq *s = paged_seq_get(p, seq->id, &created);
    if (!s) return 0; /* no host memory: behave as a miss */
    /* Only a sequence without blocks can take a prefix (contract: before the
     * first allocation); anything else is answered as a miss. */
    if (s->nblocks > 0 || s->swapped) return 0;
    if (!paged_seq_reserve(p, s, max_blocks) || !paged_ok_reserve(p, max_blocks + 1)) {
        if (created) paged_seq_destroy(p, s);
        return 0;
    }

    p->st.prefix_queries += seq->num_tokens;
    int32_t m = paged_window_hit(p, s, seq, paged_global_run(p, s, seq, max_blocks));
    for (int32_t g = 0; g < p->G; g++) {
        int32_t *tab = paged_tab(s, g);
        s->dropped[g] = paged_window_lo(p, g, (int64_t)m * p->bs);
        for (int32_t j = 0; j < m; j++) {
            tab[j] = j < s->dropped[g]
                         ? -1
                         : paged_lookup(p, g, s->h1[j], s->h2[j], seq->tokens + (size_t)j * p->bs);
            if (tab[j] >= 0) paged_ref(p, tab[j]);
        }
    }
    s->nblocks = m;
    s->num_hashed = m;
    s->len = m * p->bs;
    p->st.prefix_hits += s->len;
    paged_note_peak(p);
    paged_note_seq(p, s);
    return s->len;
}

/* What allocate() will do to s, decided before anything changes. */
typedef struct paged_plan {
    int32_t total;                         /* table entries after          */
    int32_t drop_to[LOOM_KV_GROUPS_MAX];   /* leading entries released      */
    int32_t last;                          /* partial block written, or -1  */
    bool cow[LOOM_KV_GROUPS_MAX];          /* ... shared there: copied      */
    int32_t extra;                         /* blocks taken                  */
    int32_t reclaim;                       /* blocks its releases free      */
    int32_t held;                          /* blocks it holds after         */
} paged_plan;

static int32_t paged_seq_num_computed(const loom_seq_info *seq, int32_t num_tokens) {
    if (seq->struct_size < offsetof(loom_seq_info, num_computed) + sizeof seq->num_computed)
        return 0;
    int32_t nc = seq->num_computed;
    return nc < 0 ? 0 : nc > num_tokens ? num_tokens : nc;
}

/* The plan for growing s to num_tokens with num_computed of them computed:
 * per group, entries the window left behind are released (those past the
 * table's end never allocated), new entries take a block each, and a
 * shared partial last block is copied. */
static void paged_plan_grow(const paged *p, const paged_seq *s, int32_t num_tokens, int32_t nc,
                            paged_plan *pl) {
    int32_t need = (int32_t)(((int64_t)num_tokens + p->bs - 1) / p->bs);
    memset(pl, 0, sizeof *pl);
    pl->total = s->nblocks > need ? s->nblocks : need;
    pl->last = num_tokens > s->len && s->len % p->bs != 0 ? s->len / p->bs : -1;
    for (int32_t g = 0; g < p->G; g++) {
        const int32_t *tab = paged_tab(s, g);
        int32_t d = paged_window_lo(p, g, nc);
        if (d > pl->total) d = pl->total;
        if (d < s->dropped[g]) d = s->dropped[g];
        pl->drop_to[g] = d;
        for (int32_t j = s->dropped[g]; j < d && j < s->nblocks; j++)
            pl->reclaim += tab[j] >= 0 && p->blocks[tab[j]].ref == 1;
        pl->extra += pl->total - (s->nblocks > d ? s->nblocks : d);
        if (pl->last >= d && tab[pl->last] >= 0 && p->blocks[tab[pl->last]].ref > 1) {
            pl->cow[g] = true;
            pl->extra++;
        }
        pl->held += pl->total - d;
    }
}

/* Carry out a plan checked to fit: release what every group drops, then
 * copy or unregister the written partial block, take the new entries. The
 * plan counts the blocks the drops free toward the copies' room, so every
 * group's drops come before any group's copy (a copy in group 0 may need a
 * block that group 3's window frees). */
static void paged_commit_grow(paged *p, paged_seq *s, const paged_plan *pl) {
    for (int32_t g = 0; g < p->G; g++) {
        int32_t *tab = paged_tab(s, g);
        int32_t upto = pl->drop_to[g] < s->nblocks ? pl->drop_to[g] : s->nblocks;
        for (int32_t j = upto - 1; j >= s->dropped[g]; j--) {
            if (tab[j] >= 0) paged_unref(p, tab[j]);
            tab[j] = -1;
        }
        s->dropped[g] = pl->drop_to[g];
    }
    for (int32_t g = 0; g < p->G; g++) {
        int32_t *tab = paged_tab(s, g);
        if (pl->last < 0 || pl->last < pl->drop_to[g] || tab[pl->last] < 0) continue;
        int32_t old = tab[pl->last];
        if (pl->cow[g]) {
            int32_t nb = paged_take_free(p);
            paged_ops_push(p, LOOM_BLOCK_COPY, old, nb);
            paged_unref(p, old);
            tab[pl->last] = nb;
            p->st.cow_copies++;
        } else {
            paged_unregister(p, old);
        }
    }
    for (int32_t j = s->nblocks; j < pl->total; j++)
        for (int32_t g = 0; g < p->G; g++)
            paged_tab(s, g)[j] = j < pl->drop_to[g] ? -1 : paged_take_free(p);
    s->nblocks = pl->total;
}

static loom_status paged_allocate(void *self, const loom_seq_info *seq, int32_t num_tokens,
                                  loom_error *err) {
    paged *p = self;
    const loom_host *h = p->host;
    if (!p->inited)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.paged: allocate before init");
    if (!seq || num_tokens < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: allocate needs a sequence and num_tokens >= 0 (got %d)",
                        num_tokens);
    int64_t need_total = ((int64_t)num_tokens + p->bs - 1) / p->bs;
    if (need_total > p->num_blocks)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: seq %lld asks for %d tokens = %lld blocks but the pool "
                        "has only %d; lower max_model_len or enlarge the pool",
                        (long long)seq->id, num_tokens, (long long)need_total, p->num_blocks);

    bool created;
    paged_seq *s = paged_seq_get(p, seq->id, &created);
    if (!s)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.paged: out of host memory tracking seq %lld", (long long)seq->id);
    loom_status st = LOOM_OK;
    if (s->swapped) {
        st = h->error(h->ctx, err, LOOM_ERR_INVALID,
                      "cache.paged: seq %lld is swapped out; swap_in before allocate",
                      (long long)seq->id);
        goto undo_create;
    }

    paged_plan pl;
    paged_plan_grow(p, s, num_tokens, paged_seq_num_computed(seq, num_tokens), &pl);
    if (pl.held > p->num_blocks) {
        st = h->error(h->ctx, err, LOOM_ERR_INVALID,
                      "cache.paged: seq %lld needs %d blocks in its %d block tables for %d tokens "
                      "but the pool has only %d; lower max_model_len, compute long prompts in "
                      "smaller chunks, or enlarge the pool",
                      (long long)seq->id, pl.held, p->G, num_tokens, p->num_blocks);
        goto undo_create;
    }
    int32_t free_now = paged_num_free(p);
    if (pl.extra > free_now + pl.reclaim) {
        st = h->error(h->ctx, err, LOOM_ERR_NO_SPACE,
                      "cache.paged: seq %lld needs %d more blocks, %d free", (long long)seq->id,
                      pl.extra - pl.reclaim, free_now);
        goto undo_create;
    }
    /* Watermark at admission: leave headroom for running sequences to grow;
     * pointless (and a livelock) when nothing else holds blocks. */
    int32_t used = p->num_blocks - free_now;
    if (!s->admitted && pl.extra > 0 && used > paged_seq_held(p, s) &&
        free_now + pl.reclaim - pl.extra < p->watermark_blocks) {
        st = h->error(h->ctx, err, LOOM_ERR_NO_SPACE,
                      "cache.paged: admitting seq %lld would leave %d free blocks, under the "
                      "watermark of %d",
                      (long long)seq->id, free_now + pl.reclaim - pl.extra, p->watermark_blocks);
        goto undo_create;
    }
    if (!paged_seq_reserve(p, s, pl.total) || !paged_ops_reserve(p, p->G)) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                      "cache.paged: out of host memory growing seq %lld's block table",
                      (long long)seq->id);
        goto undo_create;
    }

    /* Commit: nothing below can fail. */
    paged_commit_grow(p, s, &pl);
    if (num_tokens > s->len) s->len = num_tokens;
    s->admitted = true;
    paged_register_full(p, s, seq);
    paged_note_peak(p);
    paged_note_seq(p, s);
    return LOOM_OK;

undo_create:
    if (created) paged_seq_destroy(p, s);
    return st;
}

static void paged_truncate(void *self, const loom_seq_info *seq, int32_t num_tokens) {
    paged *p = self;
    if (!seq) return;
    paged_seq *s = paged_seq_find(p, seq->id);
    if (!s) return;
    if (num_tokens < 0) num_tokens = 0;
    if (num_tokens >= s->len) return;
    /* A kept partial block stays registered until it is written (allocate
     * unregisters or copies it then): its contents are still whole now. */
    paged_release_tail(p, s, (num_tokens + p->bs - 1) / p->bs);
    s->len = num_tokens;
    if (s->num_hashed > num_tokens / p->bs) s->num_hashed = num_tokens / p->bs;
}

static void paged_free(void *self, loom_seq_id id) {
    paged *p = self;
    paged_seq *s = paged_seq_find(p, id);
    if (!s) return;
    paged_release_tail(p, s, 0);
    paged_seq_destroy(p, s);
}

static loom_status paged_fork(void *self, loom_seq_id parent, loom_seq_id child,
                              loom_error *err) {
    paged *p = self;
    const loom_host *h = p->host;
    paged_seq *ps = paged_seq_find(p, parent);
    if (!ps)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: fork from unknown seq %lld", (long long)parent);
    if (parent == child)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: fork of seq %lld onto itself", (long long)parent);
    if (ps->swapped)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: seq %lld is swapped out; swap_in before fork",
                        (long long)parent);
    paged_seq *cs = paged_seq_find(p, child);
    if (cs && (cs->nblocks > 0 || cs->swapped))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "cache.paged: fork target seq %lld already holds blocks; free it first",
                        (long long)child);
    bool created;
    cs = paged_seq_get(p, child, &created);
    if (!cs || !paged_seq_reserve(p, cs, ps->nblocks)) { /* num_hashed <= nblocks */
        if (cs && created) paged_seq_destroy(p, cs);
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "cache.paged: out of host memory forking seq %lld", (long long)parent);
    }
    for (int32_t g = 0; g < p->G; g++) {
        for (int32_t j = 0; j < ps->nblocks; j++) {
            int32_t b = paged_tab(ps, g)[j];
            paged_tab(cs, g)[j] = b;
            if (b >= 0) paged_ref(p, b);
        }
        cs->dropped[g] = ps->dropped[g];
    }
    if (ps->num_hashed) {
        memcpy(cs->h1, ps->h1, (size_t)ps->num_hashed * sizeof *cs->h1);
        memcpy(cs->h2, ps->h2, (size_t)ps->num_hashed * sizeof *cs->h2);
    }
    cs->nblocks = ps->nblocks;
    cs->num_hashed = ps->num_hashed;
    cs->len = ps->len;
    cs->admitted = true;
    paged_note_seq(p, cs);
    return LOOM_OK;
}

/* What swap_out (`out`) and swap_in check first: a host pool exists, `id`
 * is known and on the side it leaves, the side it goes to has room for its
 * blocks, and the op queue can take them. The sequence, or NULL with the
 * error's status in *st. */
static paged_seq *paged_swap_check(paged *p, loom_seq_id id, bool out, loom_status *st,
                                   loom_error *err) {
    const loom_host *h = p->host;
    if (p->num_cpu_blocks == 0) {
        *st = h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                       "cache.paged: no host swap pool (set cache.cpu_swap_gib or "
                       "cache.num_cpu_blocks on a backend that can swap)");
        return NULL;
    }
    paged_seq *s = paged_seq_find(p, id);
    if (!s || s->swapped == out) {
        *st = h->error(h->ctx, err, LOOM_ERR_INVALID, "cache.paged: %s of %s seq %lld",
                       out ? "swap_out" : "swap_in",
                       !s ? "unknown" : out ? "an already swapped" : "a resident", (long long)id);
        return NULL;
    }
    int32_t room = out ? p->num_host_free : paged_num_free(p), held = paged_seq_held(p, s);
    if (held > room) {
        *st = h->error(h->ctx, err, LOOM_ERR_NO_SPACE,
                       "cache.paged: seq %lld needs %d %s blocks, %d free", (long long)id, held,
                       out ? "host" : "device", room);
        return NULL;
    }
    if (!paged_ops_reserve(p, held)) {
        *st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                       "cache.paged: out of host memory queueing swap ops");
        return NULL;
    }
    return s;
}

/* Move s's held blocks to the host pool (out) or back, one queued op
 * each in table order, table entries rewritten in place; the device
 * blocks a swap-out leaves go back deepest first (registered ones stay
 * cached). Room was checked. Returns the blocks moved. */
static int32_t paged_swap_move(paged *p, paged_seq *s, bool out) {
    const int32_t k0 = p->num_ops;
    for (int32_t g = 0; g < p->G; g++) {
        int32_t *tab = paged_tab(s, g);
        for (int32_t j = s->dropped[g]; j < s->nblocks; j++) {
            int32_t other = out ? p->host_free[--p->num_host_free] : paged_take_free(p);
            paged_ops_push(p, out ? LOOM_BLOCK_SWAP_OUT : LOOM_BLOCK_SWAP_IN, tab[j], other);
            if (out) {
                p->host_ref[other] = 1;
            } else {
                paged_host_unref(p, tab[j]);
                tab[j] = other;
            }
        }
    }
    for (int32_t g = 0, k = k0; out && g < p->G; k += s->nblocks - s->dropped[g], g++) {
        int32_t *tab = paged_tab(s, g);
        for (int32_t j = s->nblocks - 1; j >= s->dropped[g]; j--) {
            paged_unref(p, tab[j]);
            tab[j] = p->ops[k + j - s->dropped[g]].dst;
        }
    }
    s->swapped = out;
    return p->num_ops - k0;
}

static loom_status paged_swap_out(void *self, loom_seq_id id, loom_error *err) {
    paged *p = self;
    loom_status st = LOOM_OK;
    paged_seq *s = paged_swap_check(p, id, true, &st, err);
    if (!s) return st;
    p->st.swaps_out += paged_swap_move(p, s, true);
    return LOOM_OK;
}

static loom_status paged_swap_in(void *self, loom_seq_id id, loom_error *err) {
    paged *p = self;
    loom_status st = LOOM_OK;
    paged_seq *s = paged_swap_check(p, id, false, &st, err);
    if (!s) return st;
    p->st.swaps_in += paged_swap_move(p, s, false);
    /* The new blocks are unregistered: recompute the chain at the next
     * allocate so they can be registered (and shared) again. */
    s->num_hashed = 0;
    paged_note_peak(p);
    return LOOM_OK;
}

static int32_t paged_group_table(void *self, loom_seq_id id, int32_t group, int32_t *out,
                                 int32_t cap) {
    paged *p = self;
    paged_seq *s = paged_seq_find(p, id);
    /* a swapped seq has no device blocks */
    if (!s || s->swapped || group < 0 || group >= p->G) return 0;
    int32_t n = s->nblocks < cap ? s->nblocks : cap;
    if (n > 0 && out) memcpy(out, paged_tab(s, group), (size_t)n * sizeof *out);
    return s->nblocks;
}

static int32_t paged_block_table(void *self, loom_seq_id id, int32_t *out, int32_t cap) {
    return paged_group_table(self, id, 0, out, cap);
}

/* The core drains this once per step: the natural moment to publish. */
static int32_t paged_take_block_ops(void *self, loom_block_op *out, int32_t cap) {
    paged *p = self;
    int32_t n = p->num_ops - p->ops_head;
    if (n > cap) n = cap;
    if (n <= 0 || !out) {
        paged_publish(p);
        return 0;
    }
    memcpy(out, p->ops + p->ops_head, (size_t)n * sizeof *out);
    p->ops_head += n;
    if (p->ops_head == p->num_ops) p->ops_head = p->num_ops = 0;
    return n;
}

/* In table positions: each takes a block in every group. */
static int32_t paged_num_free_blocks(void *self) {
    paged *p = self;
    return paged_num_free(p) / p->G;
}

/* Writes only the fields the caller's struct_size covers (0 = all). */
static void paged_stats(void *self, loom_cache_stats *out) {
    paged *p = self;
    if (!out) return;
    loom_cache_stats s = p->st;
    uint32_t size = out->struct_size ? out->struct_size : (uint32_t)sizeof s;
    if (size > sizeof s) size = sizeof s;
    s.struct_size = size;
    s.num_blocks = p->num_blocks;
    s.free_blocks = paged_num_free(p);
    s.cached_blocks = p->num_cached;
    s.num_cpu_blocks = p->num_cpu_blocks;
    s.free_cpu_blocks = p->num_host_free;
    s.block_size = p->bs;
    s.num_groups = p->G;
    s.block_bytes = (int64_t)p->block_bytes;
    memcpy(out, &s, size);
    paged_publish(p);
}

const loom_cache_ops loom_paged_ops = {
    .struct_size = sizeof(loom_cache_ops),
    .create = paged_create,
    .destroy = paged_destroy,
    .init = paged_init,
    .acquire_prefix = paged_acquire_prefix,
    .allocate = paged_allocate,
    .truncate = paged_truncate,
    .free = paged_free,
    .fork = paged_fork,
    .swap_out = paged_swap_out,
    .swap_in = paged_swap_in,
    .block_table = paged_block_table,
    .take_block_ops = paged_take_block_ops,
    .num_free_blocks = paged_num_free_blocks,
    .stats = paged_stats,
    .group_table = paged_group_table,
};

/* ----------------------------------------------------------- debug hooks */

int32_t loom_paged_debug_refcount(void *self, int32_t block, bool host) {
    paged *p = self;
    if (host) return block >= 0 && block < p->num_cpu_blocks ? p->host_ref[block] : -1;
    return block >= 0 && block < p->num_blocks ? p->blocks[block].ref : -1;
}

void loom_paged_debug_set_key_mask(void *self, uint64_t mask) {
    paged *p = self;
    if (p->prefix.count == 0) p->key_mask = mask;
}

bool loom_paged_debug_hashed(void *self, int32_t block) {
    paged *p = self;
    return block >= 0 && block < p->num_blocks && p->blocks[block].hashed;
}

int32_t loom_paged_debug_group_table(void *self, loom_seq_id id, int32_t group, int32_t *out,
                                     int32_t cap, bool *swapped) {
    paged *p = self;
    paged_seq *s = paged_seq_find(p, id);
    if (!s || group < 0 || group >= p->G) return -1;
    if (swapped) *swapped = s->swapped;
    int32_t n = s->nblocks < cap ? s->nblocks : cap;
    if (n > 0 && out) memcpy(out, paged_tab(s, group), (size_t)n * sizeof *out);
    return s->nblocks;
}

int32_t loom_paged_debug_table(void *self, loom_seq_id id, int32_t *out, int32_t cap,
                               bool *swapped) {
    return loom_paged_debug_group_table(self, id, 0, out, cap, swapped);
}

#define PAGED_CHECK(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(msg, msg_size, __VA_ARGS__);                                                  \
            ok = false;                                                                            \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* Walk one free list from its sentinel; counts its members. */
static bool paged_check_list(const paged *p, int32_t head, uint8_t where, int32_t *count,
                             char *msg, size_t msg_size) {
    bool ok = true;
    const paged_block *B = p->blocks;
    int32_t n = 0, prev = head;
    for (int32_t b = B[head].next; b != head; prev = b, b = B[b].next) {
        PAGED_CHECK(b >= 0 && b < p->num_blocks, "list %d holds bad id %d", head, b);
        PAGED_CHECK(B[b].prev == prev, "block %d: prev link %d, expected %d", b, B[b].prev, prev);
        PAGED_CHECK(B[b].where == where, "block %d on list %d but marked %d", b, head,
                    B[b].where);
        PAGED_CHECK(B[b].ref == 0, "free block %d has ref %d", b, B[b].ref);
        PAGED_CHECK((where == PAGED_CACHED) == (B[b].hashed != 0),
                    "block %d: hashed=%d on list %d", b, B[b].hashed, head);
        PAGED_CHECK(++n <= p->num_blocks, "list %d has a cycle", head);
    }
    *count = n;
done:
    return ok;
}

/* One sequence's tables: lengths, the released leading runs, ids in range
 * (counted into refs / hrefs), registered blocks agreeing with its chain. */
static bool paged_check_seq(const paged *p, const paged_seq *s, int32_t *refs, int32_t *hrefs,
                            char *msg, size_t msg_size) {
    bool ok = true;
    const paged_block *B = p->blocks;
    PAGED_CHECK(s->nblocks == (s->len + p->bs - 1) / p->bs, "seq %lld: %d blocks for len %d",
                (long long)s->id, s->nblocks, s->len);
    PAGED_CHECK(s->num_hashed <= s->len / p->bs, "seq %lld: %d hashed blocks for len %d",
                (long long)s->id, s->num_hashed, s->len);
    for (int32_t g = 0; g < p->G; g++) {
        const int32_t *tab = paged_tab(s, g);
        PAGED_CHECK(s->dropped[g] >= 0 && s->dropped[g] <= s->nblocks &&
                        (p->window[g] > 0 || s->dropped[g] == 0),
                    "seq %lld group %d: %d released entries of %d (window %d)", (long long)s->id, g,
                    s->dropped[g], s->nblocks, p->window[g]);
        for (int32_t j = 0; j < s->nblocks; j++) {
            int32_t b = tab[j];
            PAGED_CHECK((j < s->dropped[g]) == (b == -1),
                        "seq %lld group %d entry %d is %d with %d leading entries released",
                        (long long)s->id, g, j, b, s->dropped[g]);
            if (b == -1) continue;
            if (s->swapped) {
                PAGED_CHECK(b >= 0 && b < p->num_cpu_blocks, "seq %lld: bad host id %d",
                            (long long)s->id, b);
                hrefs[b]++;
                continue;
            }
            PAGED_CHECK(b >= 0 && b < p->num_blocks, "seq %lld: bad id %d", (long long)s->id, b);
            refs[b]++;
            if (j >= s->num_hashed || !B[b].hashed) continue;
            PAGED_CHECK(B[b].group == g && B[b].h1 == s->h1[j] && B[b].h2 == s->h2[j],
                        "seq %lld block %d (#%d of group %d): registered hash or group differs "
                        "from the chain",
                        (long long)s->id, b, j, g);
            const int32_t *t = p->tokens + (size_t)b * p->bs;
            PAGED_CHECK(paged_hash1(j ? s->h1[j - 1] : PAGED_ROOT1, t, p->bs) == B[b].h1 &&
                            paged_hash2(j ? s->h2[j - 1] : PAGED_ROOT2, t, p->bs) == B[b].h2,
                        "seq %lld block %d: stored tokens do not hash to its hash",
                        (long long)s->id, b);
        }
    }
done:
    return ok;
}

bool loom_paged_debug_check(void *self, char *msg, size_t msg_size) {
    paged *p = self;
    const loom_host *h = p->host;
    bool ok = true;
    int32_t *refs = NULL, *hrefs = NULL;
    if (!p->inited) return true;
    const paged_block *B = p->blocks;
    int32_t nplain = 0, ncached = 0;
    if (!paged_check_list(p, PLAIN_HEAD(p), PAGED_FREE, &nplain, msg, msg_size)) return false;
    if (!paged_check_list(p, LRU_HEAD(p), PAGED_CACHED, &ncached, msg, msg_size)) return false;
    refs = h->calloc(h->ctx, (size_t)p->num_blocks, sizeof *refs);
    hrefs = h->calloc(h->ctx, (size_t)(p->num_cpu_blocks + 1), sizeof *hrefs);
    PAGED_CHECK(refs && hrefs, "out of memory in check");
    PAGED_CHECK(nplain == p->num_plain && ncached == p->num_cached,
                "list counts %d/%d, recorded %d/%d", nplain, ncached, p->num_plain,
                p->num_cached);

    int32_t used = 0, hashed = 0;
    for (int32_t b = 0; b < p->num_blocks; b++) {
        PAGED_CHECK(B[b].ref >= 0, "block %d has negative ref %d", b, B[b].ref);
        PAGED_CHECK((B[b].ref > 0) == (B[b].where == PAGED_USED),
                    "block %d: ref %d but where=%d", b, B[b].ref, B[b].where);
        used += B[b].ref > 0;
        if (!B[b].hashed) continue;
        hashed++;
        int64_t v;
        PAGED_CHECK(B[b].group < p->G &&
                        paged_map_find(&p->prefix, paged_key(p, B[b].h1, B[b].group), &v) &&
                        v == b,
                    "hashed block %d is not in the prefix table under its hash", b);
    }
    PAGED_CHECK(used + nplain + ncached == p->num_blocks, "used %d + free %d + cached %d != %d",
                used, nplain, ncached, p->num_blocks);
    PAGED_CHECK(hashed == (int32_t)p->prefix.count, "%d hashed blocks, %zu table entries",
                hashed, p->prefix.count);

    for (size_t i = 0; i < p->seqs.cap; i++) {
        if (!p->seqs.used[i]) continue;
        if (!paged_check_seq(p, (const paged_seq *)(intptr_t)p->seqs.vals[i], refs, hrefs, msg,
                             msg_size)) {
            ok = false;
            goto done;
        }
    }
    for (int32_t b = 0; b < p->num_blocks; b++)
        PAGED_CHECK(refs[b] == B[b].ref, "block %d: ref %d, referenced by %d table entries", b,
                    B[b].ref, refs[b]);
    int32_t hfree = 0;
    for (int32_t b = 0; b < p->num_cpu_blocks; b++) {
        PAGED_CHECK(hrefs[b] == p->host_ref[b], "host block %d: ref %d, referenced %d", b,
                    p->host_ref[b], hrefs[b]);
        hfree += p->host_ref[b] == 0;
    }
    PAGED_CHECK(hfree == p->num_host_free, "%d host blocks unreferenced, %d on the free stack",
                hfree, p->num_host_free);
    for (int32_t i = 0; i < p->num_host_free; i++)
        PAGED_CHECK(p->host_ref[p->host_free[i]] == 0, "host free stack holds used block %d",
                    p->host_free[i]);
    for (int32_t i = p->ops_head; i < p->num_ops; i++) {
        const loom_block_op *o = &p->ops[i];
        int32_t src_n = o->kind == LOOM_BLOCK_SWAP_IN ? p->num_cpu_blocks : p->num_blocks;
        int32_t dst_n = o->kind == LOOM_BLOCK_SWAP_OUT ? p->num_cpu_blocks : p->num_blocks;
        PAGED_CHECK(o->src >= 0 && o->src < src_n && o->dst >= 0 && o->dst < dst_n,
                    "queued op %d has ids out of range (%d -> %d)", i, o->src, o->dst);
    }
done:
    h->free(h->ctx, refs);
    h->free(h->ctx, hrefs);
    return ok;
}
