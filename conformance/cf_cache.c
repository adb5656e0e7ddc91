/*
 * conformance/cf_cache.c — the cache-manager checks (loom/cache.h).
 *
 * cache.traffic[...]: a small engine model drives thousands of random
 * operations over many sequences — admission with shared prefixes, prefill
 * chunks, decode steps, speculative drafts with partial acceptance, fork,
 * truncate, recompute and swap preemption, finish — and simulates the
 * backend: every slot of the device and host pools holds the (position,
 * token) last written there, and queued COPY/SWAP ops are applied before
 * each "forward pass" as the core does. After every operation:
 *   - every computed position of every resident sequence reads back its own
 *     token through its block table (prefix hits returned blocks holding
 *     exactly the query's tokens; copy-on-write and swaps moved the right
 *     data; no write landed in a block another sequence reads);
 *   - a block a forward pass writes is in no other live sequence's table;
 *   - block ids are in range; a waiting or swapped sequence has no device
 *     blocks; tables cover what was allocated;
 *   - free blocks + blocks in live tables <= the pool (no double free);
 *   - a failed (NO_SPACE) call changed nothing and queued nothing;
 *   - acquire_prefix answers a block multiple in [0, tokens - 1].
 * Periodically, and at the end, every sequence is freed: then every block
 * must be free again, device and host (no leaked reference), and destroy()
 * must return every host allocation. A probe (the shipped manager's debug
 * hooks, in its own tests) adds exact refcounts and its self-check.
 *
 * With block-table groups (a case's `groups`, taken by the manager) every
 * group's table is checked alike, its slots remembering their group too,
 * except that a windowed group need only hold what the next query's window
 * reads — and, for the shipped manager (exact_tables), must have released
 * every block before the window its last allocate() saw.
 * cache.contract: the calls' edge cases — init's layout, unknown ids,
 * lengths no pool could hold (LOOM_ERR_INVALID, not NO_SPACE),
 * acquire_prefix on a sequence holding blocks, truncate beyond the end,
 * forks of unknown or swapped parents, block_table(NULL, 0).
 *
 * Parameters are set through the component's declared table; cases name
 * the well-known keys (block_size, num_blocks, num_cpu_blocks,
 * prefix_caching, watermark) and keys a manager does not declare are
 * dropped, so any manager runs every case it can.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "loom/cache.h"

#define CT_MAX_SEQS 64
#define CT_FAMILIES 4
#define CT_FAMILY_LEN 72
#define CT_MAX_TABLE 1024
#define CT_BYTES_PER_TOKEN 1024

enum { CT_WAITING, CT_RUNNING, CT_SWAPPED };

typedef struct ct_seq {
    bool live;
    loom_seq_id id;
    int state;
    int32_t toks[CT_MAX_TABLE];
    int32_t n;        /* tokens                                     */
    int32_t computed; /* leading tokens whose K/V are in the cache  */
    int32_t released_at; /* num_computed at its last allocate / hit  */
} ct_seq;

typedef struct ct {
    const loom_conformance_cache_case *cs;
    const loom_conformance_cache_probe *probe;
    const loom_cache_ops *ops;
    void *self;
    loom_kv_layout layout;
    int32_t bs, nblocks, ncpu;
    int32_t G;        /* tables per sequence (1 unless groups taken) */
    int32_t win[LOOM_KV_GROUPS_MAX]; /* each group's window; 0 = all  */
    int32_t nfree0;   /* num_free_blocks() of the new pool            */
    bool can_swap;    /* swap_out/in present                          */
    uint64_t seed;
    cf_rng g;
    int64_t step;
    const char *op;
    char why[CF_WHY_MAX];
    bool failed;
    ct_seq seqs[CT_MAX_SEQS];
    loom_seq_id next_id;
    int32_t families[CT_FAMILIES][CT_FAMILY_LEN];
    int64_t *dev;     /* (nblocks * bs) pos<<32 | token; -1 = never written */
    int64_t *host;    /* (ncpu * bs)                                         */
    int32_t *refs;    /* (nblocks) table references, scratch                 */
    int32_t *hrefs;   /* (ncpu + 1)                                          */
    loom_conformance_cache_tally tally;
} ct;

/* Record the first failure with its replay context; returns false. */
static bool ct_fail(ct *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool ct_fail(ct *t, const char *fmt, ...) {
    if (t->failed) return false;
    t->failed = true;
    char msg[CF_WHY_MAX - 160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(t->why, sizeof t->why, "%s [case %s, seed 0x%llx, op #%lld %s]", msg, t->cs->label,
             (unsigned long long)t->seed, (long long)t->step, t->op);
    return false;
}

#define CT_ENSURE(t, cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) return ct_fail((t), __VA_ARGS__);                                             \
    } while (0)

static int32_t ct_rand(ct *t, int32_t n) { return cf_rng_below(&t->g, n); }

/* What position pos (token tok) of a layer of group g leaves in its slot. */
static int64_t ct_enc(int32_t g, int32_t pos, int32_t tok) {
    return ((int64_t)g << 56) | ((int64_t)pos << 32) | (uint32_t)tok;
}

/* The first position group g must still hold for a query at q. */
static int32_t ct_lo(const ct *t, int32_t g, int32_t q) {
    return t->win[g] > 0 && q - t->win[g] + 1 > 0 ? q - t->win[g] + 1 : 0;
}

static loom_seq_info ct_info(const ct_seq *s, int32_t num_draft) {
    return (loom_seq_info){.struct_size = sizeof(loom_seq_info), .id = s->id, .request_id = s->id,
                           .num_prompt_tokens = s->n, .num_tokens = s->n, .num_computed = s->computed,
                           .max_total_tokens = s->n + 64, .tokens = s->toks, .num_draft = num_draft};
}

static int32_t ct_blocks_for(const ct *t, int32_t tokens) { return (tokens + t->bs - 1) / t->bs; }

/* ---------------------------------------------------------- the backend */

/* Apply queued ops to the simulated pools, in order. */
static bool ct_apply_ops(ct *t) {
    loom_block_op ops[64];
    int32_t n, bs = t->bs;
    while ((n = t->ops->take_block_ops(t->self, ops, 64)) > 0) {
        CT_ENSURE(t, n <= 64, "take_block_ops returned %d with room for 64", n);
        for (int32_t i = 0; i < n; i++) {
            const loom_block_op *o = &ops[i];
            CT_ENSURE(t, o->kind >= LOOM_BLOCK_COPY && o->kind <= LOOM_BLOCK_SWAP_IN, "block op of unknown kind %d",
                      (int)o->kind);
            int64_t *src = o->kind == LOOM_BLOCK_SWAP_IN ? t->host : t->dev;
            int64_t *dst = o->kind == LOOM_BLOCK_SWAP_OUT ? t->host : t->dev;
            int32_t ns = o->kind == LOOM_BLOCK_SWAP_IN ? t->ncpu : t->nblocks;
            int32_t nd = o->kind == LOOM_BLOCK_SWAP_OUT ? t->ncpu : t->nblocks;
            CT_ENSURE(t, o->src >= 0 && o->src < ns && o->dst >= 0 && o->dst < nd,
                      "block op (kind %d) %d -> %d is outside the pools (%d device, %d host blocks)", (int)o->kind,
                      o->src, o->dst, t->nblocks, t->ncpu);
            memmove(dst + (size_t)o->dst * bs, src + (size_t)o->src * bs, (size_t)bs * sizeof *dst);
            if (o->kind == LOOM_BLOCK_COPY) t->tally.copies++;
            else t->tally.swapped_blocks++;
        }
    }
    CT_ENSURE(t, n == 0, "take_block_ops returned %d", n);
    return true;
}

/* Group g's device table of seq id (block_table() for group 0). */
static int32_t ct_group_table(ct *t, loom_seq_id id, int32_t g, int32_t *out) {
    return g == 0 ? t->ops->block_table(t->self, id, out, CT_MAX_TABLE)
                  : t->ops->group_table(t->self, id, g, out, CT_MAX_TABLE);
}

/* Group g's device table of s into out (cap CT_MAX_TABLE); -1 after a
 * failure. */
static int32_t ct_table(ct *t, const ct_seq *s, int32_t g, int32_t *out) {
    int32_t n = ct_group_table(t, s->id, g, out);
    if (n < 0 || n > CT_MAX_TABLE) {
        ct_fail(t, "table of group %d (seq %lld) has %d entries", g, (long long)s->id, n);
        return -1;
    }
    return n;
}

/* Whether block b is in a device table of any live sequence but s. */
static bool ct_shared(ct *t, const ct_seq *s, int32_t b) {
    int32_t tab[CT_MAX_TABLE];
    for (int i = 0; i < CT_MAX_SEQS; i++) {
        const ct_seq *o = &t->seqs[i];
        if (!o->live || o == s || o->state == CT_SWAPPED) continue;
        for (int32_t g = 0; g < t->G; g++) {
            int32_t n = ct_group_table(t, o->id, g, tab);
            for (int32_t j = 0; j < n && j < CT_MAX_TABLE; j++)
                if (tab[j] == b) return true;
        }
    }
    return false;
}

/* The forward pass: write K/V of positions [from, to) of s, in every
 * group. */
static bool ct_forward(ct *t, ct_seq *s, int32_t from, int32_t to) {
    int32_t tab[CT_MAX_TABLE], bs = t->bs;
    for (int32_t g = 0; g < t->G; g++) {
        int32_t nb = ct_table(t, s, g, tab);
        if (nb < 0) return false;
        CT_ENSURE(t, nb >= ct_blocks_for(t, to),
                  "seq %lld has %d blocks in group %d for %d tokens after a successful allocate", (long long)s->id,
                  nb, g, to);
        for (int32_t p = from; p < to; p++) {
            int32_t b = tab[p / bs];
            CT_ENSURE(t, b >= 0 && b < t->nblocks, "seq %lld group %d: block id %d for position %d outside [0, %d)",
                      (long long)s->id, g, b, p, t->nblocks);
            if (p == from || p % bs == 0) {
                CT_ENSURE(t, !ct_shared(t, s, b),
                          "seq %lld writes position %d into block %d, which another live sequence's table holds "
                          "(a write into a shared block must be copied first)",
                          (long long)s->id, p, b);
                if (t->probe && t->probe->refcount)
                    CT_ENSURE(t, t->probe->refcount(t->self, b, false) == 1,
                              "seq %lld writes position %d into block %d of refcount %d", (long long)s->id, p, b,
                              t->probe->refcount(t->self, b, false));
            }
            t->dev[(size_t)b * bs + p % bs] = ct_enc(g, p, s->toks[p]);
        }
    }
    s->computed = to;
    return true;
}

/* ------------------------------------------------------------- invariants */

/* Group g's host table of swapped s into tab; -2 when no probe can say
 * (then nothing is checked). */
static int32_t ct_host_table(ct *t, const ct_seq *s, int32_t g, int32_t *tab, bool *sw) {
    if (t->probe && t->probe->group_host_table)
        return t->probe->group_host_table(t->self, s->id, g, tab, CT_MAX_TABLE, sw);
    if (t->probe && t->probe->host_table && t->G == 1)
        return t->probe->host_table(t->self, s->id, tab, CT_MAX_TABLE, sw);
    return -2;
}

/* Swapped s's group g: its host blocks keep the window's data. */
static bool ct_check_swapped(ct *t, const ct_seq *s, int32_t g) {
    int32_t tab[CT_MAX_TABLE];
    bool sw = false;
    int32_t nb = ct_host_table(t, s, g, tab, &sw);
    if (nb == -2) return true;
    CT_ENSURE(t, sw && nb == ct_blocks_for(t, s->computed), "swapped seq %lld: %d host blocks in group %d for %d tokens",
              (long long)s->id, nb, g, s->computed);
    for (int32_t j = 0; j < nb; j++) {
        CT_ENSURE(t, tab[j] >= -1 && tab[j] < t->ncpu, "host block id %d out of range", tab[j]);
        if (tab[j] >= 0) t->hrefs[tab[j]]++;
    }
    for (int32_t p = ct_lo(t, g, s->computed); p < s->computed; p++) {
        int32_t b = tab[p / t->bs];
        CT_ENSURE(t, b >= 0 && t->host[(size_t)b * t->bs + p % t->bs] == ct_enc(g, p, s->toks[p]),
                  "swapped seq %lld position %d lost its data in host block %d of group %d", (long long)s->id, p, b,
                  g);
    }
    return true;
}

/* Resident s's group g: the positions its next query reads hold its own
 * tokens; counts its references and released entries. */
static bool ct_check_resident(ct *t, const ct_seq *s, int32_t g) {
    int32_t tab[CT_MAX_TABLE];
    int32_t nb = ct_table(t, s, g, tab);
    if (nb < 0) return false;
    CT_ENSURE(t, nb >= ct_blocks_for(t, s->computed), "seq %lld: %d blocks in group %d for %d computed tokens",
              (long long)s->id, nb, g, s->computed);
    if (t->probe && t->probe->exact_tables)
        CT_ENSURE(t, nb == ct_blocks_for(t, s->computed), "seq %lld: %d blocks for %d tokens (want exactly %d)",
                  (long long)s->id, nb, s->computed, ct_blocks_for(t, s->computed));
    const int32_t lo = ct_lo(t, g, s->computed) / t->bs;
    const int32_t gone = ct_lo(t, g, s->released_at) / t->bs; /* released at its last allocate */
    for (int32_t j = 0; j < nb; j++) {
        if (tab[j] == -1 && j < lo) {
            t->tally.released++;
            continue;
        }
        CT_ENSURE(t, tab[j] >= 0 && tab[j] < t->nblocks, "seq %lld group %d: block id %d outside [0, %d)",
                  (long long)s->id, g, tab[j], t->nblocks);
        CT_ENSURE(t, !(t->probe && t->probe->exact_tables) || j >= gone,
                  "seq %lld group %d (window %d) still holds block %d at entry %d, before the window of position "
                  "%d that its last allocate computed from",
                  (long long)s->id, g, t->win[g], tab[j], j, s->released_at);
        t->refs[tab[j]]++;
    }
    for (int32_t p = ct_lo(t, g, s->computed); p < s->computed; p++) {
        int64_t got = t->dev[(size_t)tab[p / t->bs] * t->bs + p % t->bs];
        CT_ENSURE(t, got == ct_enc(g, p, s->toks[p]),
                  "seq %lld position %d (token %d) of group %d reads back group %d position %d token %d from block "
                  "%d: a prefix hit, copy, swap or write went to the wrong block",
                  (long long)s->id, p, s->toks[p], g, got < 0 ? -1 : (int32_t)(got >> 56),
                  got < 0 ? -1 : (int32_t)((got >> 32) & 0xffffff), got < 0 ? -1 : (int32_t)(uint32_t)got,
                  tab[p / t->bs]);
    }
    return true;
}

/* s's positions read back its tokens; counts its references. */
static bool ct_check_seq(ct *t, const ct_seq *s) {
    for (int32_t g = 0; g < t->G; g++) {
        if (s->state == CT_RUNNING) {
            if (!ct_check_resident(t, s, g)) return false;
            continue;
        }
        int32_t tab[CT_MAX_TABLE];
        int32_t nb = ct_group_table(t, s->id, g, tab);
        CT_ENSURE(t, nb == 0, "%s seq %lld holds %d device blocks in group %d",
                  s->state == CT_WAITING ? "freed" : "swapped-out", (long long)s->id, nb, g);
        if (s->state == CT_SWAPPED && !ct_check_swapped(t, s, g)) return false;
    }
    return true;
}

static bool ct_check_pool(ct *t) {
    int32_t used = 0, unreferenced = 0;
    for (int32_t b = 0; b < t->nblocks; b++) {
        used += t->refs[b] > 0;
        if (t->probe && t->probe->never_shares)
            CT_ENSURE(t, t->refs[b] <= 1, "block %d is in %d tables (this manager never shares)", b, t->refs[b]);
        if (!t->probe || !t->probe->refcount) continue;
        int32_t rc = t->probe->refcount(t->self, b, false);
        CT_ENSURE(t, rc == t->refs[b], "block %d: refcount %d, but %d live tables hold it", b, rc, t->refs[b]);
        unreferenced += rc == 0;
    }
    if (t->probe && t->probe->refcount)
        CT_ENSURE(t, unreferenced / t->G == t->ops->num_free_blocks(t->self),
                  "%d unreferenced blocks in %d groups, num_free_blocks() says %d", unreferenced, t->G,
                  t->ops->num_free_blocks(t->self));
    for (int32_t b = 0; t->probe && t->probe->refcount && t->probe->host_table && b < t->ncpu; b++)
        CT_ENSURE(t, t->probe->refcount(t->self, b, true) == t->hrefs[b], "host block %d: refcount %d, %d tables",
                  b, t->probe->refcount(t->self, b, true), t->hrefs[b]);
    int32_t nfree = t->ops->num_free_blocks(t->self);
    CT_ENSURE(t, nfree >= 0 && nfree * t->G + used <= t->nblocks,
              "num_free_blocks() = %d while %d distinct blocks are in live tables of a %d-block pool: a "
              "block is counted free while referenced (double free?)",
              nfree, used, t->nblocks);
    if (t->ops->stats) {
        loom_cache_stats st = {.struct_size = sizeof st};
        t->ops->stats(t->self, &st);
        CT_ENSURE(t, st.num_blocks == t->nblocks && st.free_blocks >= nfree * t->G && st.free_blocks + used <= t->nblocks,
                  "stats: num_blocks %d, free_blocks %d; the layout has %d blocks, num_free_blocks() says %d can be "
                  "handed out, %d are in live tables",
                  st.num_blocks, st.free_blocks, t->nblocks, nfree, used);
        CT_ENSURE(t, st.peak_used_blocks <= st.num_blocks && st.peak_used_blocks >= used,
                  "stats: peak_used_blocks %d, but %d blocks are in use of %d", st.peak_used_blocks, used,
                  st.num_blocks);
        if (used > t->tally.peak_used) t->tally.peak_used = used;
    }
    if (t->probe && t->probe->self_check) {
        char msg[256] = "";
        CT_ENSURE(t, t->probe->self_check(t->self, msg, sizeof msg), "self-check: %s", msg);
    }
    return true;
}

static bool ct_check(ct *t) {
    loom_block_op op;
    CT_ENSURE(t, t->ops->take_block_ops(t->self, &op, 1) == 0, "block ops left unapplied");
    memset(t->refs, 0, (size_t)t->nblocks * sizeof *t->refs);
    memset(t->hrefs, 0, ((size_t)t->ncpu + 1) * sizeof *t->hrefs);
    for (int i = 0; i < CT_MAX_SEQS; i++)
        if (t->seqs[i].live && !ct_check_seq(t, &t->seqs[i])) return false;
    return ct_check_pool(t);
}

/* Snapshot for "a failed call changed nothing". */
typedef struct ct_snap {
    int32_t nb, tab[LOOM_KV_GROUPS_MAX][CT_MAX_TABLE], free_blocks;
    loom_cache_stats st;
} ct_snap;

static void ct_snapshot(ct *t, const ct_seq *s, ct_snap *sn) {
    memset(sn, 0, sizeof *sn);
    for (int32_t g = 0; g < t->G; g++) sn->nb = ct_group_table(t, s->id, g, sn->tab[g]);
    sn->free_blocks = t->ops->num_free_blocks(t->self);
    sn->st.struct_size = sizeof sn->st;
    if (t->ops->stats) t->ops->stats(t->self, &sn->st);
}

static bool ct_unchanged(ct *t, const ct_seq *s, const ct_snap *before, const char *call) {
    ct_snap after;
    ct_snapshot(t, s, &after);
    loom_block_op op;
    CT_ENSURE(t, t->ops->take_block_ops(t->self, &op, 1) == 0, "a failed %s queued block ops", call);
    CT_ENSURE(t, after.nb == before->nb && after.nb >= 0 && after.nb <= CT_MAX_TABLE,
              "a failed %s changed seq %lld's table length", call, (long long)s->id);
    for (int32_t g = 0; g < t->G; g++)
        CT_ENSURE(t, !memcmp(after.tab[g], before->tab[g], sizeof(int32_t) * (size_t)after.nb),
                  "a failed %s changed seq %lld's block table of group %d", call, (long long)s->id, g);
    CT_ENSURE(t, after.free_blocks == before->free_blocks && !memcmp(&after.st, &before->st, sizeof after.st),
              "a failed %s changed the pool (free blocks %d -> %d)", call, before->free_blocks,
              after.free_blocks);
    return true;
}

/* ------------------------------------------------------------ operations */

static ct_seq *ct_pick(ct *t, int state) {
    int idx[CT_MAX_SEQS], n = 0;
    for (int i = 0; i < CT_MAX_SEQS; i++)
        if (t->seqs[i].live && (state < 0 || t->seqs[i].state == state)) idx[n++] = i;
    return n ? &t->seqs[idx[ct_rand(t, n)]] : NULL;
}

static ct_seq *ct_slot(ct *t) {
    for (int i = 0; i < CT_MAX_SEQS; i++)
        if (!t->seqs[i].live) return &t->seqs[i];
    return NULL;
}

static void ct_finish(ct *t, ct_seq *s) {
    t->ops->free(t->self, s->id);
    s->live = false;
}

/* Preempt s: swap out when there is a host pool and a coin says so, else
 * recompute (free). */
static bool ct_preempt(ct *t, ct_seq *s) {
    loom_error err = {0};
    if (t->can_swap && ct_rand(t, 2)) {
        ct_snap sn;
        ct_snapshot(t, s, &sn);
        loom_status st = t->ops->swap_out(t->self, s->id, &err);
        if (st == LOOM_OK) {
            s->state = CT_SWAPPED;
            return ct_apply_ops(t);
        }
        CT_ENSURE(t, st == LOOM_ERR_NO_SPACE || st == LOOM_ERR_UNSUPPORTED,
                  "swap_out(seq %lld) failed with status %d (%s); only NO_SPACE or UNSUPPORTED are ordinary",
                  (long long)s->id, (int)st, err.message);
        if (!ct_unchanged(t, s, &sn, "swap_out")) return false;
    }
    t->ops->free(t->self, s->id);
    s->state = CT_WAITING;
    s->computed = 0;
    return true;
}

static void ct_append(ct *t, ct_seq *s, int32_t k) {
    /* Sometimes follow a family so decode output is shared too. */
    const int32_t *fam = t->families[s->id % CT_FAMILIES];
    bool follow = ct_rand(t, 3) == 0;
    for (int32_t i = 0; i < k && s->n < CT_MAX_TABLE; i++, s->n++)
        s->toks[s->n] = follow && s->n < CT_FAMILY_LEN ? fam[s->n] : ct_rand(t, 6);
}

/* Slots up to `to`: *ok false on NO_SPACE (atomicity checked). */
static bool ct_allocate(ct *t, ct_seq *s, int32_t to, int32_t num_draft, bool *ok) {
    loom_seq_info info = ct_info(s, num_draft);
    loom_error err = {0};
    ct_snap sn;
    ct_snapshot(t, s, &sn);
    loom_status st = t->ops->allocate(t->self, &info, to, &err);
    t->tally.allocs++;
    *ok = st == LOOM_OK;
    if (*ok) s->released_at = s->computed;
    if (st == LOOM_ERR_NO_SPACE) {
        t->tally.nospace++;
        return ct_unchanged(t, s, &sn, "allocate");
    }
    CT_ENSURE(t, st == LOOM_OK, "allocate(seq %lld, %d tokens) failed with status %d: %s", (long long)s->id, to,
              (int)st, err.message);
    return ct_apply_ops(t);
}

static bool ct_op_new(ct *t) {
    ct_seq *s = ct_slot(t);
    if (!s) return true;
    memset(s, 0, sizeof *s);
    s->live = true;
    s->id = t->next_id++;
    s->state = CT_WAITING;
    const int32_t *fam = t->families[ct_rand(t, CT_FAMILIES)];
    int32_t shared = ct_rand(t, CT_FAMILY_LEN + 1);
    memcpy(s->toks, fam, (size_t)shared * sizeof *fam);
    s->n = shared;
    int32_t extra = 1 + ct_rand(t, 24);
    for (int32_t i = 0; i < extra; i++) s->toks[s->n++] = ct_rand(t, 6);
    if (s->n > t->cs->max_model_len / 2) s->n = t->cs->max_model_len / 2;
    return true;
}

static bool ct_op_admit(ct *t) {
    ct_seq *s = ct_pick(t, CT_WAITING);
    if (!s) return true;
    loom_seq_info info = ct_info(s, 0);
    int32_t k = t->ops->acquire_prefix(t->self, &info);
    CT_ENSURE(t, k >= 0 && k % t->bs == 0 && k <= s->n - 1,
              "acquire_prefix(seq %lld of %d tokens) returned %d: must be a multiple of block_size %d in "
              "[0, tokens - 1]",
              (long long)s->id, s->n, k, t->bs);
    t->tally.prefix_hit_tokens += k;
    s->state = CT_RUNNING;
    s->computed = k;
    s->released_at = k;
    if (!ct_check(t)) return false; /* the hit blocks must hold exactly s's tokens */
    int32_t to = k + 1 + ct_rand(t, s->n - k);
    bool ok;
    if (!ct_allocate(t, s, to, 0, &ok)) return false;
    if (!ok) { /* the scheduler gives up on it for now */
        t->ops->free(t->self, s->id);
        s->state = CT_WAITING;
        s->computed = 0;
        return true;
    }
    return ct_forward(t, s, k, to);
}

/* After a verified step with drafts: keep a random number, roll back the rest. */
static bool ct_verify(ct *t, ct_seq *s, int32_t drafts) {
    for (int32_t g = 0; t->probe && t->probe->hashed && g < t->G; g++) {
        int32_t tab[CT_MAX_TABLE];
        int32_t nb = ct_table(t, s, g, tab);
        for (int32_t j = (s->n - drafts) / t->bs; j < nb; j++)
            CT_ENSURE(t, !t->probe->hashed(t->self, tab[j]), "block %d holding drafts of seq %lld is in the prefix cache",
                      tab[j], (long long)s->id);
    }
    int32_t keep = s->n - drafts + ct_rand(t, drafts + 1);
    loom_seq_info info = ct_info(s, 0);
    s->n = keep;
    s->computed = keep;
    info.num_tokens = keep;
    info.num_computed = keep;
    t->ops->truncate(t->self, &info, keep);
    int32_t tab[CT_MAX_TABLE];
    int32_t nb = ct_table(t, s, 0, tab);
    CT_ENSURE(t, nb == ct_blocks_for(t, keep), "truncate(seq %lld, %d) left %d blocks; want %d", (long long)s->id,
              keep, nb, ct_blocks_for(t, keep));
    return true;
}

static bool ct_op_step(ct *t) {
    ct_seq *s = ct_pick(t, CT_RUNNING);
    if (!s) return true;
    bool ok;
    if (s->computed < s->n) { /* prefill chunk */
        int32_t to = s->computed + 1 + ct_rand(t, s->n - s->computed);
        if (!ct_allocate(t, s, to, 0, &ok)) return false;
        return ok ? ct_forward(t, s, s->computed, to) : ct_preempt(t, s);
    }
    if (s->n + 5 > t->cs->max_model_len) {
        ct_finish(t, s);
        return true;
    }
    int32_t drafts = ct_rand(t, 3) == 0 ? 1 + ct_rand(t, 4) : 0;
    int32_t from = s->computed;
    ct_append(t, s, 1 + drafts); /* one decode token (+ drafts to verify) */
    if (!ct_allocate(t, s, s->n, drafts, &ok)) return false;
    if (!ok) {
        s->n = from; /* nothing was sampled after all */
        return ct_preempt(t, s);
    }
    if (!ct_forward(t, s, from, s->n)) return false;
    return drafts ? ct_verify(t, s, drafts) : true;
}

static bool ct_op_fork(ct *t) {
    ct_seq *p = ct_pick(t, CT_RUNNING), *c = ct_slot(t);
    if (!p || !c) return true;
    loom_seq_id cid = t->next_id++;
    loom_error err = {0};
    ct_snap sn;
    ct_snapshot(t, p, &sn);
    loom_status st = t->ops->fork(t->self, p->id, cid, &err);
    if (st == LOOM_ERR_NO_SPACE) return ct_unchanged(t, p, &sn, "fork");
    CT_ENSURE(t, st == LOOM_OK, "fork(%lld -> %lld) failed with status %d: %s", (long long)p->id, (long long)cid,
              (int)st, err.message);
    if (!ct_apply_ops(t)) return false;
    *c = *p;
    c->id = cid;
    t->tally.forks++;
    return true;
}

/* Truncate to a random length: with windows, not below what the last
 * allocate computed from (windowed groups released what lies before that;
 * the engine only rolls back drafts), except to 0. */
static bool ct_op_truncate(ct *t) {
    ct_seq *s = ct_pick(t, CT_RUNNING);
    if (!s || s->computed == 0) return true;
    int32_t floor = 0;
    for (int32_t g = 0; g < t->G; g++)
        if (t->win[g] > 0) floor = s->released_at;
    int32_t r = floor + ct_rand(t, s->computed - floor + 1);
    if (floor > 0 && ct_rand(t, 4) == 0) r = 0;
    loom_seq_info info = ct_info(s, 0);
    t->ops->truncate(t->self, &info, r);
    s->n = r;
    s->computed = r;
    int32_t tab[CT_MAX_TABLE];
    int32_t nb = ct_table(t, s, 0, tab);
    CT_ENSURE(t, nb == ct_blocks_for(t, r), "truncate(seq %lld, %d) left %d blocks; want %d", (long long)s->id, r,
              nb, ct_blocks_for(t, r));
    if (r == 0) { /* an empty sequence is a finished one here */
        s->state = CT_WAITING;
        t->ops->free(t->self, s->id);
        ct_append(t, s, 3);
    }
    return true;
}

static bool ct_op_swap_in(ct *t) {
    ct_seq *s = ct_pick(t, CT_SWAPPED);
    if (!s) return true;
    loom_error err = {0};
    ct_snap sn;
    ct_snapshot(t, s, &sn);
    loom_status st = t->ops->swap_in(t->self, s->id, &err);
    if (st == LOOM_ERR_NO_SPACE) return ct_unchanged(t, s, &sn, "swap_in");
    CT_ENSURE(t, st == LOOM_OK, "swap_in(seq %lld) failed with status %d: %s", (long long)s->id, (int)st,
              err.message);
    s->state = CT_RUNNING;
    return ct_apply_ops(t);
}

/* Free everything: every block must come back. */
static bool ct_drain(ct *t) {
    for (int i = 0; i < CT_MAX_SEQS; i++)
        if (t->seqs[i].live) ct_finish(t, &t->seqs[i]);
    if (!ct_check(t)) return false;
    int32_t nfree = t->ops->num_free_blocks(t->self);
    CT_ENSURE(t, nfree == t->nfree0,
              "after every sequence was freed, num_free_blocks() = %d; the new pool had %d: %s", nfree, t->nfree0,
              nfree < t->nfree0 ? "a block reference leaked" : "more blocks free than at the start (double free)");
    if (t->ops->stats) {
        loom_cache_stats st = {.struct_size = sizeof st};
        t->ops->stats(t->self, &st);
        CT_ENSURE(t, st.free_blocks == t->nblocks && st.free_cpu_blocks == st.num_cpu_blocks,
                  "after every sequence was freed, stats say %d/%d device and %d/%d host blocks are free (a "
                  "leaked reference)",
                  st.free_blocks, st.num_blocks, st.free_cpu_blocks, st.num_cpu_blocks);
    }
    for (int32_t b = 0; t->probe && t->probe->refcount && b < t->nblocks; b++)
        CT_ENSURE(t, t->probe->refcount(t->self, b, false) == 0, "block %d still referenced", b);
    t->tally.drains++;
    return true;
}

/* ----------------------------------------------------------------- a run */

static size_t ct_block_bytes(void *ctx, int32_t block_size) {
    (void)ctx;
    return block_size > 0 ? (size_t)block_size * CT_BYTES_PER_TOKEN : 0;
}

/* A loom_cache_init for a fake backend with room for about 64 blocks of 16
 * tokens, so a manager that sizes its pool from memory runs full too. */
static loom_cache_init ct_init_desc(int32_t max_model_len, const loom_kv_groups *groups) {
    size_t free_bytes = (size_t)64 * 16 * CT_BYTES_PER_TOKEN;
    return (loom_cache_init){.struct_size = sizeof(loom_cache_init), .block_bytes = ct_block_bytes,
                             .device_free_bytes = free_bytes, .device_total_bytes = free_bytes * 2,
                             .max_model_len = max_model_len, .backend_can_swap = true, .groups = groups};
}

/* init() and the layout it reports. */
static bool ct_open(ct *t) {
    loom_cache_init in = ct_init_desc(t->cs->max_model_len, t->cs->groups);
    loom_error err = {0};
    t->layout = (loom_kv_layout){.struct_size = sizeof t->layout, .dtype = LOOM_DTYPE_F16};
    loom_status st = t->ops->init(t->self, &in, &t->layout, &err);
    CT_ENSURE(t, st == LOOM_OK, "init failed with status %d: %s", (int)st, err.message);
    CT_ENSURE(t, t->layout.dtype == LOOM_DTYPE_F16, "init changed layout.dtype (the core's to set)");
    CT_ENSURE(t, t->layout.block_size >= 1 && t->layout.block_size <= 4096 && t->layout.num_blocks >= 1 &&
                     t->layout.num_blocks <= (1 << 20) && t->layout.num_cpu_blocks >= 0 &&
                     t->layout.num_cpu_blocks <= (1 << 20),
              "init's layout is implausible: block_size %d, num_blocks %d, num_cpu_blocks %d",
              t->layout.block_size, t->layout.num_blocks, t->layout.num_cpu_blocks);
    t->bs = t->layout.block_size;
    t->nblocks = t->layout.num_blocks;
    t->ncpu = t->layout.num_cpu_blocks;
    t->G = 1;
    if (t->layout.num_groups > 0) {
        const loom_kv_groups *g = t->cs->groups;
        CT_ENSURE(t, g && t->layout.num_groups == g->num_groups,
                  "init set layout.num_groups %d; the backend proposed %d", t->layout.num_groups,
                  g ? g->num_groups : 0);
        CT_ENSURE(t, g->num_groups == 1 || t->ops->group_table, "init took %d groups without a group_table()",
                  g->num_groups);
        t->G = g->num_groups;
        memcpy(t->win, g->window, sizeof t->win);
    }
    t->tally.num_groups = t->G;
    t->can_swap = t->ops->swap_out && t->ops->swap_in;
    t->tally.num_blocks = t->nblocks;
    t->nfree0 = t->ops->num_free_blocks(t->self);
    CT_ENSURE(t, t->nfree0 > 0 && t->nfree0 <= t->nblocks, "a new pool of %d blocks has num_free_blocks() = %d",
              t->nblocks, t->nfree0);
    if (t->probe && t->probe->prepare) t->probe->prepare(t->self);
    size_t ndev = (size_t)t->nblocks * (size_t)t->bs, nhost = (size_t)t->ncpu * (size_t)t->bs;
    t->dev = malloc((ndev + 1) * sizeof *t->dev);
    t->host = malloc((nhost + 1) * sizeof *t->host);
    t->refs = calloc((size_t)t->nblocks + 1, sizeof *t->refs);
    t->hrefs = calloc((size_t)t->ncpu + 1, sizeof *t->hrefs);
    CT_ENSURE(t, t->dev && t->host && t->refs && t->hrefs, "out of memory simulating %zu slots", ndev);
    memset(t->dev, 0xff, (ndev + 1) * sizeof *t->dev);
    memset(t->host, 0xff, (nhost + 1) * sizeof *t->host);
    return true;
}

/* One random operation; weights in percent: new 12, admit 18, step 40,
 * fork 5, truncate 6, preempt 5, swap_in 5, finish 8, and 1 of which one
 * in five drains everything. */
static bool ct_op(ct *t) {
    int r = ct_rand(t, 100);
    ct_seq *s;
    if (r < 12) {
        t->op = "new";
        return ct_op_new(t);
    } else if (r < 30) {
        t->op = "admit";
        return ct_op_admit(t);
    } else if (r < 70) {
        t->op = "step";
        return ct_op_step(t);
    } else if (r < 75) {
        t->op = "fork";
        return ct_op_fork(t);
    } else if (r < 81) {
        t->op = "truncate";
        return ct_op_truncate(t);
    } else if (r < 86) {
        t->op = "preempt";
        return (s = ct_pick(t, CT_RUNNING)) ? ct_preempt(t, s) : true;
    } else if (r < 91) {
        t->op = "swap_in";
        return t->can_swap ? ct_op_swap_in(t) : true;
    } else if (r < 99) {
        t->op = "finish";
        if ((s = ct_pick(t, -1))) ct_finish(t, s);
        return true;
    } else if (ct_rand(t, 5) == 0) {
        t->op = "drain";
        return ct_drain(t);
    }
    return true;
}

static bool ct_expectations(ct *t) {
    const loom_conformance_cache_case *c = t->cs;
    const loom_conformance_cache_tally *y = &t->tally;
    CT_ENSURE(t, !c->expect_nospace || y->nospace > 0, "the pool never ran full; shrink it");
    CT_ENSURE(t, !c->expect_prefix_hits || y->prefix_hit_tokens > 0, "no prefix hits");
    CT_ENSURE(t, !c->expect_swaps || y->swapped_blocks > 0, "no swaps");
    CT_ENSURE(t, !c->expect_cow || y->copies > 0, "no copy-on-write");
    CT_ENSURE(t, !c->expect_released || y->released > 0, "no windowed group released a block");
    return true;
}

static bool ct_run(ct *t, int32_t num_ops, char *where) {
    t->op = "init";
    if (!ct_open(t)) return false;
    t->next_id = 1;
    for (int f = 0; f < CT_FAMILIES; f++)
        for (int i = 0; i < CT_FAMILY_LEN; i++) t->families[f][i] = 10 + ct_rand(t, 8);
    for (t->step = 0; t->step < num_ops; t->step++) {
        if (where) snprintf(where, CF_WHERE_MAX, "case %s, op #%lld", t->cs->label, (long long)t->step);
        if (!ct_op(t) || !ct_check(t)) return false;
        t->tally.ops++;
    }
    t->op = "final drain";
    return ct_drain(t) && ct_expectations(t);
}

static void ct_free(ct *t) {
    free(t->dev);
    free(t->host);
    free(t->refs);
    free(t->hrefs);
    free(t);
}

/* Create with the case's parameters on the counting host, run, destroy. */
static bool ct_traffic(const loom_component *comp, const loom_conformance_cache_case *c,
                       const loom_conformance_cache_probe *probe, uint64_t seed, cf_run *r,
                       loom_conformance_cache_tally *tally, char *why, size_t cap) {
    ct *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(why, cap, "out of memory");
        return false;
    }
    t->cs = c;
    t->probe = probe;
    t->ops = comp->ops;
    t->seed = seed;
    t->g = cf_rng_make(seed);
    bool ok = cf_create(r, c->sets, &t->self);
    if (ok) {
        ok = ct_run(t, c->num_ops, r->where);
        t->ops->destroy(t->self);
        long live = cf_host_live();
        if (ok && live) ok = ct_fail(t, "destroy() left %ld host allocations unfreed", live);
    } else {
        snprintf(t->why, sizeof t->why, "%s", r->why);
    }
    if (tally) *tally = t->tally;
    if (!ok) snprintf(why, cap, "%s", t->why);
    ct_free(t);
    return ok;
}

bool loom_conformance_cache_traffic(const loom_component *comp, const loom_conformance_cache_case *c,
                                    const loom_conformance_cache_probe *probe, uint64_t seed,
                                    loom_conformance_cache_tally *tally, char *why, size_t cap) {
    static const loom_conformance_opts opts = {0};
    cf_run r = {.opts = &opts, .comp = comp, .check = "cache.traffic", .seed = seed};
    cf_host_reset(false);
    return ct_traffic(comp, c, probe, seed, &r, tally, why, cap);
}

/* ------------------------------------------------------------- the checks */

/* A backend's proposal of three block-table groups: one global, two
 * sliding-window ones of 9 tokens, each block holding 2 of 6 layers. */
static const loom_kv_groups k_groups3 = {.struct_size = sizeof(loom_kv_groups), .num_groups = 3,
                                         .layers_per_block = 2, .num_layers = 6, .window = {0, 9, 9}};

/* The default cases of `loom plugin-test` (the shipped manager's own tests
 * run more, with its debug hooks: tests/cache/test_property.c). */
static const loom_conformance_cache_case k_cases[] = {
    {"bs=4 prefix swap", "block_size=4,num_blocks=64,num_cpu_blocks=24,prefix_caching=true,watermark=0.05", 128,
     12000},
    {"bs=1 prefix", "block_size=1,num_blocks=160,num_cpu_blocks=0,prefix_caching=true,watermark=0", 128, 6000},
    {"bs=5 no-prefix swap", "block_size=5,num_blocks=40,num_cpu_blocks=16,prefix_caching=false,watermark=0.02",
     120, 6000},
    {"bs=16 prefix swap", "block_size=16,num_blocks=24,num_cpu_blocks=12,prefix_caching=true,watermark=0", 192,
     6000},
    {"defaults, pool sized from memory", "", 128, 6000},
    {.label = "bs=4 prefix swap, 3 block-table groups (windows 0, 9, 9)",
     .sets = "block_size=4,num_blocks=96,num_cpu_blocks=24,prefix_caching=true,watermark=0.02",
     .max_model_len = 128, .num_ops = 8000, .groups = &k_groups3},
};

static bool check_traffic(cf_run *r, const void *arg) {
    const loom_conformance_cache_case *c = arg;
    loom_conformance_cache_case run = *c;
    run.num_ops = (int32_t)cf_iters(r, c->num_ops, 500);
    loom_conformance_cache_tally y;
    if (!ct_traffic(r->comp, &run, NULL, r->seed, r, &y, r->why, sizeof r->why)) {
        r->failed = true;
        return false;
    }
    cf_note(r, "%lld ops on %d blocks: %lld allocations (%lld NO_SPACE), %lld prefix-hit tokens, %lld copies, "
               "%lld swapped blocks, %lld forks, %lld drains",
            (long long)y.ops, y.num_blocks, (long long)y.allocs, (long long)y.nospace, (long long)y.prefix_hit_tokens,
            (long long)y.copies, (long long)y.swapped_blocks, (long long)y.forks, (long long)y.drains);
    return true;
}

/* An instance after init with `csv`; NULL (failure recorded) if not. */
static void *cc_open(cf_run *r, const char *csv, loom_kv_layout *layout) {
    void *self;
    if (!cf_create(r, csv, &self)) return NULL;
    const loom_cache_ops *ops = r->comp->ops;
    loom_cache_init in = ct_init_desc(64, NULL);
    loom_error err = {0};
    *layout = (loom_kv_layout){.struct_size = sizeof *layout, .dtype = LOOM_DTYPE_F16};
    cf_where(r, "init()");
    loom_status st = ops->init(self, &in, layout, &err);
    if (st != LOOM_OK || layout->block_size < 1 || layout->num_blocks < 1 || layout->num_cpu_blocks < 0) {
        if (st != LOOM_OK) cf_fail(r, "init failed with status %d: %s", (int)st, err.message);
        else cf_fail(r, "init's layout is implausible: block_size %d, num_blocks %d, num_cpu_blocks %d",
                     layout->block_size, layout->num_blocks, layout->num_cpu_blocks);
        ops->destroy(self);
        return NULL;
    }
    return self;
}

static loom_seq_info cc_seq(loom_seq_id id, const int32_t *toks, int32_t n) {
    return (loom_seq_info){.struct_size = sizeof(loom_seq_info), .id = id, .request_id = id,
                           .num_prompt_tokens = n, .num_tokens = n, .max_total_tokens = n + 8, .tokens = toks};
}

/* Unknown ids, impossible lengths, repeated acquire_prefix, truncate beyond. */
static bool cc_edges(cf_run *r, void *self, const loom_kv_layout *L, int32_t *toks) {
    const loom_cache_ops *ops = r->comp->ops;
    loom_error err = {0};
    int32_t nfree = ops->num_free_blocks(self);
    cf_where(r, "calls on unknown sequence ids");
    CF_ENSURE(r, ops->block_table(self, 999, NULL, 0) == 0, "block_table of an unknown id is not 0");
    ops->free(self, 999);
    loom_seq_info ghost = cc_seq(998, toks, 4);
    ops->truncate(self, &ghost, 1);
    loom_block_op op;
    CF_ENSURE(r, ops->take_block_ops(self, &op, 1) == 0, "calls on unknown ids queued block ops");
    loom_status st = ops->fork(self, 999, 1000, &err);
    CF_ENSURE(r, st == LOOM_ERR_INVALID, "fork of an unknown parent answered %d, want LOOM_ERR_INVALID", (int)st);
    CF_ENSURE(r, ops->num_free_blocks(self) == nfree && ops->block_table(self, 1000, NULL, 0) == 0,
              "a refused fork changed the pool");

    cf_where(r, "allocate beyond the pool");
    int32_t huge = (L->num_blocks + 1) * L->block_size;
    loom_seq_info big = cc_seq(5, toks, huge);
    st = ops->allocate(self, &big, huge, &err);
    CF_ENSURE(r, st == LOOM_ERR_INVALID,
              "allocate(%d tokens) on a pool of %d x %d answered %d: a length no pool state could hold must be "
              "LOOM_ERR_INVALID, not NO_SPACE (which makes a scheduler preempt forever)",
              huge, L->num_blocks, L->block_size, (int)st);
    CF_ENSURE(r, ops->num_free_blocks(self) == nfree && ops->block_table(self, 5, NULL, 0) == 0,
              "a refused allocate changed the pool");

    cf_where(r, "allocate, acquire_prefix on a holder, truncate beyond the end");
    loom_seq_info a = cc_seq(1, toks, 10);
    int32_t k = ops->acquire_prefix(self, &a);
    CF_ENSURE(r, k >= 0 && k <= 9 && k % L->block_size == 0, "acquire_prefix returned %d for 10 tokens", k);
    a.num_computed = k;
    CF_ENSURE(r, ops->allocate(self, &a, 10, &err) == LOOM_OK, "allocate(10 tokens) failed: %s", err.message);
    int32_t want = (10 + L->block_size - 1) / L->block_size;
    CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == want, "block_table(NULL, 0) gives %d for 10 tokens, want %d",
              ops->block_table(self, 1, NULL, 0), want);
    a.num_computed = 10;
    int32_t again = ops->acquire_prefix(self, &a);
    CF_ENSURE(r, again == 0, "acquire_prefix on a sequence that holds blocks returned %d, want 0", again);
    CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == want, "acquire_prefix on a holder changed its table");
    ops->truncate(self, &a, 40);
    CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == want, "truncate to a longer length changed the table");
    while (ops->take_block_ops(self, &op, 1) > 0) {
    }
    return true;
}

/* Swap a holder out and in, refusing allocate/fork while it is out. */
static bool cc_swap(cf_run *r, void *self, const loom_kv_layout *L, int32_t *toks) {
    const loom_cache_ops *ops = r->comp->ops;
    loom_error err = {0};
    int32_t want = ops->block_table(self, 1, NULL, 0);
    cf_where(r, "swap_out");
    loom_status st = ops->swap_out(self, 1, &err);
    if (L->num_cpu_blocks == 0) {
        CF_ENSURE(r, st == LOOM_ERR_UNSUPPORTED, "swap_out without a host pool answered %d, want UNSUPPORTED",
                  (int)st);
        CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == want, "a refused swap_out changed the table");
        return true;
    }
    CF_ENSURE(r, st == LOOM_OK, "swap_out of a 10-token sequence with %d free host blocks failed (%d): %s",
              L->num_cpu_blocks, (int)st, err.message);
    CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == 0, "a swapped-out sequence still has device blocks");
    loom_seq_info a = cc_seq(1, toks, 12);
    a.num_computed = 10;
    cf_where(r, "allocate and fork while swapped out");
    st = ops->allocate(self, &a, 12, &err);
    CF_ENSURE(r, st == LOOM_ERR_INVALID, "allocate on a swapped-out sequence answered %d, want INVALID", (int)st);
    st = ops->fork(self, 1, 77, &err);
    CF_ENSURE(r, st == LOOM_ERR_INVALID, "fork of a swapped-out parent answered %d, want INVALID", (int)st);
    cf_where(r, "swap_in");
    st = ops->swap_in(self, 1, &err);
    CF_ENSURE(r, st == LOOM_OK, "swap_in failed (%d): %s", (int)st, err.message);
    CF_ENSURE(r, ops->block_table(self, 1, NULL, 0) == want, "swap_in restored %d blocks of %d",
              ops->block_table(self, 1, NULL, 0), want);
    loom_block_op op;
    while (ops->take_block_ops(self, &op, 1) > 0) {
    }
    return true;
}

static bool check_contract(cf_run *r, const void *arg) {
    const char *csv = arg;
    loom_kv_layout L;
    void *self = cc_open(r, csv, &L);
    if (!self) return false;
    const loom_cache_ops *ops = r->comp->ops;
    int32_t nfree0 = ops->num_free_blocks(self);
    int32_t *toks = calloc((size_t)(L.num_blocks + 2) * (size_t)L.block_size, sizeof *toks);
    bool ok = toks && cc_edges(r, self, &L, toks);
    if (ok && ops->swap_out && ops->swap_in) ok = cc_swap(r, self, &L, toks);
    if (ok) {
        cf_where(r, "fork and free");
        loom_error err = {0};
        loom_status st = ops->fork(self, 1, 2, &err);
        if (st == LOOM_OK)
            ok = ops->block_table(self, 2, NULL, 0) == ops->block_table(self, 1, NULL, 0) ||
                 cf_fail(r, "a forked child holds %d blocks, its parent %d", ops->block_table(self, 2, NULL, 0),
                         ops->block_table(self, 1, NULL, 0));
        else if (st != LOOM_ERR_NO_SPACE) ok = cf_fail(r, "fork failed (%d): %s", (int)st, err.message);
        loom_block_op op;
        while (ops->take_block_ops(self, &op, 1) > 0) {
        }
        ops->free(self, 2);
        ops->free(self, 1);
        int32_t nfree = ops->num_free_blocks(self);
        if (ok && nfree != nfree0)
            ok = cf_fail(r, "after freeing everything num_free_blocks() = %d; the new pool had %d: %s", nfree, nfree0,
                         nfree < nfree0 ? "a block reference leaked" : "more blocks free than at the start (double free)");
    }
    free(toks);
    if (!ok) {
        ops->destroy(self);
        return false;
    }
    return cf_destroy(r, self);
}

int cf_checks_cache(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_contract, "block_size=4,num_blocks=32,num_cpu_blocks=8,prefix_caching=true",
               "cache.contract[host pool]");
    n = cf_add(out, n, cap, check_contract, "block_size=4,num_blocks=32,num_cpu_blocks=0",
               "cache.contract[no host pool]");
    char seen[8][256];
    int nseen = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char label[256];
        cf_config_label(c, k_cases[i].sets, label, sizeof label);
        bool dup = false;
        for (int j = 0; j < nseen; j++) dup |= !strcmp(seen[j], label);
        if (dup && k_cases[i].sets[0]) continue; /* the same case once this manager's keys are kept */
        if (nseen < 8) snprintf(seen[nseen++], sizeof seen[0], "%s", label);
        n = cf_add(out, n, cap, check_traffic, &k_cases[i], "cache.traffic[%s]", label[0] ? label : "defaults");
    }
    return n;
}
