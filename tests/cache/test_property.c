/*
 * tests/cache/test_property.c — randomized property tests for the cache
 * managers. A small engine model drives thousands of random operations over
 * many sequences (admit with shared prefixes, prefill chunks, decode steps,
 * speculative drafts with partial acceptance, fork, truncate, recompute and
 * swap preemption, finish) and simulates the backend: every slot of the
 * device and host pools holds the (position, token) last written there, and
 * queued COPY/SWAP ops are applied before each "forward pass" as the core
 * does.
 *
 * After every operation it checks:
 *   - every computed position of every live sequence reads back its own
 *     token through the block table (so prefix hits returned blocks holding
 *     exactly the query's tokens, copy-on-write and swaps moved the right
 *     data, and no write ever landed in a block another sequence reads);
 *   - a block written by a forward pass has refcount 1 (never shared);
 *   - (paged) refcount of every block == number of live table entries
 *     referencing it, on the device and host pools; free == blocks with
 *     refcount 0; free + referenced == total; ids in range; no live
 *     sequence holds a freed block; the manager's own structural check
 *     (free lists disjoint, hash table consistent, stored tokens re-hash);
 *   - a failed (NO_SPACE) call changed nothing and queued nothing;
 *   - blocks holding draft positions are never in the prefix cache.
 * Periodically, and at the end, everything is freed: all blocks must be
 * free with refcount 0 (no leak, no double free), and no host memory leaks.
 *
 * The seed comes from LOOM_TEST_SEED if set, else the clock; it is printed
 * so a failure can be replayed exactly.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache_test.h"
#include "contiguous.h"
#include "fake_host.h"
#include "paged.h"

#define PT_MAX_SEQS 64
#define PT_FAMILIES 4
#define PT_FAMILY_LEN 72
#define PT_MAX_TABLE 1024

/* --------------------------------------------------------------- random */

static uint64_t pt_rng;

static uint64_t pt_next(void) { /* xorshift64* */
    pt_rng ^= pt_rng >> 12;
    pt_rng ^= pt_rng << 25;
    pt_rng ^= pt_rng >> 27;
    return pt_rng * 0x2545f4914f6cdd1dULL;
}

static int32_t pt_rand(int32_t n) { return n <= 1 ? 0 : (int32_t)(pt_next() % (uint64_t)n); }

static uint64_t pt_seed(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    if (s && *s) return strtoull(s, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- model */

enum { PT_WAITING, PT_RUNNING, PT_SWAPPED };

typedef struct pt_seq {
    bool live;
    loom_seq_id id;
    int state;
    int32_t toks[PT_MAX_TABLE];
    int32_t n;        /* tokens                                     */
    int32_t computed; /* leading tokens whose K/V are in the cache  */
} pt_seq;

typedef struct pt_cfg {
    const char *name;
    bool paged;
    int32_t bs;
    int32_t num_blocks;
    int32_t num_cpu_blocks;
    bool prefix_caching;
    double watermark;
    int32_t max_model_len;
    int32_t num_ops;
    uint64_t key_mask;  /* paged: != 0 forces prefix-table key collisions */
} pt_cfg;

typedef struct pt {
    const pt_cfg *cfg;
    tc_cache c;
    uint64_t seed;
    int64_t step;         /* operation index, for messages */
    const char *op;       /* current operation, for messages */
    pt_seq seqs[PT_MAX_SEQS];
    loom_seq_id next_id;
    int32_t families[PT_FAMILIES][PT_FAMILY_LEN];
    int64_t *dev;         /* (num_blocks * bs) simulated K/V: pos<<32 | token, -1 = never */
    int64_t *host;        /* (num_cpu_blocks * bs)                         */
    int64_t hits, allocs, nospace, cows, swaps, forks, drains;
} pt;

/* Assert with the replay context (config, seed, operation index) first. */
#define PT_ASSERT(t, cond, ...)                                                                   \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            char pt_msg_[1024];                                                                   \
            snprintf(pt_msg_, sizeof pt_msg_, __VA_ARGS__);                                       \
            cr_assert(0, "[%s seed=0x%llx op#%lld %s] %s", (t)->cfg->name,                        \
                      (unsigned long long)(t)->seed, (long long)(t)->step, (t)->op, pt_msg_);     \
        }                                                                                         \
    } while (0)

static int64_t pt_enc(int32_t pos, int32_t tok) { return ((int64_t)pos << 32) | (uint32_t)tok; }

static loom_seq_info pt_info(const pt_seq *s, int32_t num_draft) {
    return tc_seq(s->id, s->toks, s->n, num_draft);
}

/* Apply queued ops to the simulated pools, in order. */
static void pt_apply_ops(pt *t) {
    loom_block_op ops[64];
    int32_t n, bs = t->cfg->bs;
    while ((n = t->c.ops->take_block_ops(t->c.self, ops, 64)) > 0) {
        for (int32_t i = 0; i < n; i++) {
            const loom_block_op *o = &ops[i];
            int64_t *src = o->kind == LOOM_BLOCK_SWAP_IN ? t->host : t->dev;
            int64_t *dst = o->kind == LOOM_BLOCK_SWAP_OUT ? t->host : t->dev;
            int32_t ns = o->kind == LOOM_BLOCK_SWAP_IN ? t->cfg->num_cpu_blocks
                                                        : t->cfg->num_blocks;
            int32_t nd = o->kind == LOOM_BLOCK_SWAP_OUT ? t->cfg->num_cpu_blocks
                                                         : t->cfg->num_blocks;
            PT_ASSERT(t, o->src >= 0 && o->src < ns && o->dst >= 0 && o->dst < nd,
                      "op %d: %d -> %d out of range", o->kind, o->src, o->dst);
            memmove(dst + (size_t)o->dst * bs, src + (size_t)o->src * bs,
                    (size_t)bs * sizeof *dst);
            if (o->kind == LOOM_BLOCK_COPY) t->cows++;
            else t->swaps++;
        }
    }
}

/* Device table of s (host table while swapped, paged only). */
static int32_t pt_table(pt *t, const pt_seq *s, int32_t *out, bool *swapped) {
    *swapped = false;
    if (s->state == PT_SWAPPED) {
        int32_t n = loom_paged_debug_table(t->c.self, s->id, out, PT_MAX_TABLE, swapped);
        PT_ASSERT(t, *swapped, "seq %lld swapped in the model, resident in the cache",
                  (long long)s->id);
        return n;
    }
    return t->c.ops->block_table(t->c.self, s->id, out, PT_MAX_TABLE);
}

/* The forward pass: write K/V of positions [from, to) of s. */
static void pt_forward(pt *t, pt_seq *s, int32_t from, int32_t to) {
    int32_t tab[PT_MAX_TABLE], bs = t->cfg->bs;
    bool sw;
    int32_t nb = pt_table(t, s, tab, &sw);
    PT_ASSERT(t, nb >= (to + bs - 1) / bs, "seq %lld has %d blocks for %d tokens",
              (long long)s->id, nb, to);
    for (int32_t p = from; p < to; p++) {
        int32_t b = tab[p / bs];
        if (t->cfg->paged)
            PT_ASSERT(t, loom_paged_debug_refcount(t->c.self, b, false) == 1,
                      "seq %lld writes position %d into shared block %d (ref %d)",
                      (long long)s->id, p, b, loom_paged_debug_refcount(t->c.self, b, false));
        t->dev[(size_t)b * bs + p % bs] = pt_enc(p, s->toks[p]);
    }
    s->computed = to;
}

static void pt_check(pt *t) {
    const pt_cfg *cfg = t->cfg;
    int32_t bs = cfg->bs;
    int32_t *refs = calloc((size_t)cfg->num_blocks, sizeof *refs);
    int32_t *hrefs = calloc((size_t)cfg->num_cpu_blocks + 1, sizeof *hrefs);
    int32_t tab[PT_MAX_TABLE];
    char msg[256] = "";
    loom_block_op op;
    PT_ASSERT(t, t->c.ops->take_block_ops(t->c.self, &op, 1) == 0, "ops left unapplied");
    for (int i = 0; i < PT_MAX_SEQS; i++) {
        pt_seq *s = &t->seqs[i];
        if (!s->live) continue;
        if (s->state == PT_WAITING) {
            PT_ASSERT(t, t->c.ops->block_table(t->c.self, s->id, tab, PT_MAX_TABLE) == 0,
                      "waiting seq %lld holds blocks", (long long)s->id);
            continue;
        }
        bool sw;
        int32_t nb = pt_table(t, s, tab, &sw);
        PT_ASSERT(t, nb == (s->computed + bs - 1) / bs, "seq %lld: %d blocks for %d tokens",
                  (long long)s->id, nb, s->computed);
        int32_t limit = sw ? cfg->num_cpu_blocks : cfg->num_blocks;
        for (int32_t j = 0; j < nb; j++) {
            PT_ASSERT(t, tab[j] >= 0 && tab[j] < limit, "seq %lld: block id %d out of range",
                      (long long)s->id, tab[j]);
            if (sw) hrefs[tab[j]]++;
            else refs[tab[j]]++;
        }
        const int64_t *pool = sw ? t->host : t->dev;
        for (int32_t p = 0; p < s->computed; p++) {
            int64_t got = pool[(size_t)tab[p / bs] * bs + p % bs];
            PT_ASSERT(t, got == pt_enc(p, s->toks[p]),
                      "seq %lld position %d: cache holds (pos %lld, tok %d), expected tok %d",
                      (long long)s->id, p, (long long)(got >> 32), (int32_t)(got & 0xffffffff),
                      s->toks[p]);
        }
    }
    if (cfg->paged) {
        PT_ASSERT(t, loom_paged_debug_check(t->c.self, msg, sizeof msg), "internal: %s", msg);
        int32_t nfree = 0;
        for (int32_t b = 0; b < cfg->num_blocks; b++) {
            int32_t r = loom_paged_debug_refcount(t->c.self, b, false);
            PT_ASSERT(t, r == refs[b], "block %d: refcount %d, live references %d", b, r,
                      refs[b]);
            nfree += r == 0;
        }
        PT_ASSERT(t, nfree == t->c.ops->num_free_blocks(t->c.self),
                  "%d unreferenced blocks, num_free_blocks says %d", nfree,
                  t->c.ops->num_free_blocks(t->c.self));
        for (int32_t b = 0; b < cfg->num_cpu_blocks; b++)
            PT_ASSERT(t, loom_paged_debug_refcount(t->c.self, b, true) == hrefs[b],
                      "host block %d: refcount %d, live references %d", b,
                      loom_paged_debug_refcount(t->c.self, b, true), hrefs[b]);
    } else {
        PT_ASSERT(t, loom_contiguous_debug_check(t->c.self, msg, sizeof msg), "internal: %s",
                  msg);
        for (int32_t b = 0; b < cfg->num_blocks; b++)
            PT_ASSERT(t, refs[b] <= 1, "contiguous block %d in %d tables", b, refs[b]);
    }
    loom_cache_stats st = {.struct_size = sizeof st};
    t->c.ops->stats(t->c.self, &st);
    PT_ASSERT(t, st.num_blocks == cfg->num_blocks && st.free_blocks >= 0 &&
                     st.free_blocks <= st.num_blocks && st.peak_used_blocks <= st.num_blocks &&
                     st.peak_used_blocks >= st.num_blocks - st.free_blocks,
              "stats out of range");
    free(refs);
    free(hrefs);
}

/* Snapshot for "NO_SPACE changed nothing". */
typedef struct pt_snap {
    int32_t nb, tab[PT_MAX_TABLE], free_blocks;
    loom_cache_stats st;
} pt_snap;

static void pt_snapshot(pt *t, const pt_seq *s, pt_snap *sn) {
    bool sw;
    memset(sn, 0, sizeof *sn);
    sn->nb = pt_table(t, s, sn->tab, &sw);
    sn->free_blocks = t->c.ops->num_free_blocks(t->c.self);
    sn->st.struct_size = sizeof sn->st;
    t->c.ops->stats(t->c.self, &sn->st);
}

static void pt_expect_unchanged(pt *t, const pt_seq *s, const pt_snap *before) {
    pt_snap after;
    pt_snapshot(t, s, &after);
    loom_block_op op;
    PT_ASSERT(t, t->c.ops->take_block_ops(t->c.self, &op, 1) == 0, "failed call queued ops");
    PT_ASSERT(t, after.nb == before->nb &&
                     !memcmp(after.tab, before->tab, sizeof(int32_t) * (size_t)after.nb),
              "failed call changed seq %lld's table", (long long)s->id);
    PT_ASSERT(t, after.free_blocks == before->free_blocks &&
                     !memcmp(&after.st, &before->st, sizeof after.st),
              "failed call changed the pool");
}

/* ---------------------------------------------------------- operations */

static pt_seq *pt_pick(pt *t, int state) {
    int idx[PT_MAX_SEQS], n = 0;
    for (int i = 0; i < PT_MAX_SEQS; i++)
        if (t->seqs[i].live && (state < 0 || t->seqs[i].state == state)) idx[n++] = i;
    return n ? &t->seqs[idx[pt_rand(n)]] : NULL;
}

static pt_seq *pt_slot(pt *t) {
    for (int i = 0; i < PT_MAX_SEQS; i++)
        if (!t->seqs[i].live) return &t->seqs[i];
    return NULL;
}

static void pt_finish(pt *t, pt_seq *s) {
    t->c.ops->free(t->c.self, s->id);
    s->live = false;
}

/* Preempt s: swap out when there is a host pool and it fits, else recompute. */
static void pt_preempt(pt *t, pt_seq *s) {
    loom_error err = {0};
    if (t->cfg->num_cpu_blocks > 0 && pt_rand(2)) {
        pt_snap sn;
        pt_snapshot(t, s, &sn);
        loom_status st = t->c.ops->swap_out(t->c.self, s->id, &err);
        if (st == LOOM_OK) {
            pt_apply_ops(t);
            s->state = PT_SWAPPED;
            return;
        }
        PT_ASSERT(t, st == LOOM_ERR_NO_SPACE, "swap_out: %s", err.message);
        pt_expect_unchanged(t, s, &sn);
    }
    t->c.ops->free(t->c.self, s->id);
    s->state = PT_WAITING;
    s->computed = 0;
}

static void pt_append(pt *t, pt_seq *s, int32_t k) {
    /* Sometimes follow a family so decode output is shared too. */
    const int32_t *fam = t->families[s->id % PT_FAMILIES];
    bool follow = pt_rand(3) == 0;
    for (int32_t i = 0; i < k && s->n < PT_MAX_TABLE; i++, s->n++)
        s->toks[s->n] = follow && s->n < PT_FAMILY_LEN ? fam[s->n] : pt_rand(6);
}

/* Ask for slots up to `to`; on NO_SPACE check atomicity and preempt. */
static bool pt_allocate(pt *t, pt_seq *s, int32_t to, int32_t num_draft) {
    loom_seq_info info = pt_info(s, num_draft);
    loom_error err = {0};
    pt_snap sn;
    pt_snapshot(t, s, &sn);
    loom_status st = t->c.ops->allocate(t->c.self, &info, to, &err);
    t->allocs++;
    if (st == LOOM_ERR_NO_SPACE) {
        t->nospace++;
        pt_expect_unchanged(t, s, &sn);
        return false;
    }
    PT_ASSERT(t, st == LOOM_OK, "allocate(%lld, %d): %s", (long long)s->id, to, err.message);
    pt_apply_ops(t);
    return true;
}

static void pt_op_new(pt *t) {
    pt_seq *s = pt_slot(t);
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->live = true;
    s->id = t->next_id++;
    s->state = PT_WAITING;
    const int32_t *fam = t->families[pt_rand(PT_FAMILIES)];
    int32_t shared = pt_rand(PT_FAMILY_LEN + 1);
    memcpy(s->toks, fam, (size_t)shared * sizeof *fam);
    s->n = shared;
    int32_t extra = 1 + pt_rand(24);
    for (int32_t i = 0; i < extra; i++) s->toks[s->n++] = pt_rand(6);
    if (s->n > t->cfg->max_model_len / 2) s->n = t->cfg->max_model_len / 2;
}

static void pt_op_admit(pt *t) {
    pt_seq *s = pt_pick(t, PT_WAITING);
    if (!s) return;
    loom_seq_info info = pt_info(s, 0);
    int32_t k = t->c.ops->acquire_prefix(t->c.self, &info);
    PT_ASSERT(t, k >= 0 && k % t->cfg->bs == 0 && k <= s->n - 1,
              "acquire_prefix returned %d for %d tokens", k, s->n);
    if (!t->cfg->paged || !t->cfg->prefix_caching) PT_ASSERT(t, k == 0, "hit without cache");
    t->hits += k;
    s->state = PT_RUNNING;
    s->computed = k;
    pt_check(t); /* the hit blocks must hold exactly s's tokens */
    int32_t to = k + 1 + pt_rand(s->n - k);
    if (!pt_allocate(t, s, to, 0)) {
        t->c.ops->free(t->c.self, s->id); /* the scheduler gives up on it for now */
        s->state = PT_WAITING;
        s->computed = 0;
        return;
    }
    pt_forward(t, s, k, to);
}

static void pt_op_step(pt *t) {
    pt_seq *s = pt_pick(t, PT_RUNNING);
    if (!s) return;
    if (s->computed < s->n) { /* prefill chunk */
        int32_t to = s->computed + 1 + pt_rand(s->n - s->computed);
        if (pt_allocate(t, s, to, 0)) pt_forward(t, s, s->computed, to);
        else pt_preempt(t, s);
        return;
    }
    if (s->n + 5 > t->cfg->max_model_len) {
        pt_finish(t, s);
        return;
    }
    int32_t drafts = pt_rand(3) == 0 ? 1 + pt_rand(4) : 0;
    int32_t from = s->computed;
    pt_append(t, s, 1 + drafts); /* one decode token (+ drafts to verify) */
    if (!pt_allocate(t, s, s->n, drafts)) {
        s->n = from; /* nothing was sampled after all */
        pt_preempt(t, s);
        return;
    }
    if (drafts && t->cfg->paged) {
        int32_t tab[PT_MAX_TABLE];
        int32_t nb = t->c.ops->block_table(t->c.self, s->id, tab, PT_MAX_TABLE);
        for (int32_t j = (s->n - drafts) / t->cfg->bs; j < nb; j++)
            PT_ASSERT(t, !loom_paged_debug_hashed(t->c.self, tab[j]),
                      "block %d holding drafts of seq %lld is in the prefix cache", tab[j],
                      (long long)s->id);
    }
    pt_forward(t, s, from, s->n);
    if (drafts) { /* verify: keep a random number of drafts, roll back the rest */
        int32_t keep = s->n - drafts + pt_rand(drafts + 1);
        loom_seq_info info = pt_info(s, 0);
        s->n = keep;
        s->computed = keep;
        info.num_tokens = keep;
        t->c.ops->truncate(t->c.self, &info, keep);
    }
}

static void pt_op_fork(pt *t) {
    pt_seq *p = pt_pick(t, PT_RUNNING), *c = pt_slot(t);
    if (!p || !c) return;
    loom_seq_id cid = t->next_id++;
    loom_error err = {0};
    pt_snap sn;
    pt_snapshot(t, p, &sn);
    loom_status st = t->c.ops->fork(t->c.self, p->id, cid, &err);
    if (st == LOOM_ERR_NO_SPACE) {
        PT_ASSERT(t, !t->cfg->paged, "paged fork never needs space");
        pt_expect_unchanged(t, p, &sn);
        return;
    }
    PT_ASSERT(t, st == LOOM_OK, "fork: %s", err.message);
    pt_apply_ops(t);
    *c = *p;
    c->id = cid;
    t->forks++;
}

static void pt_op_truncate(pt *t) {
    pt_seq *s = pt_pick(t, PT_RUNNING);
    if (!s || s->computed == 0) return;
    int32_t r = pt_rand(s->computed + 1);
    loom_seq_info info = pt_info(s, 0);
    t->c.ops->truncate(t->c.self, &info, r);
    s->n = r;
    s->computed = r;
    if (r == 0) { /* an empty sequence is a finished one here */
        s->state = PT_WAITING;
        t->c.ops->free(t->c.self, s->id);
        pt_append(t, s, 3);
    }
}

static void pt_op_swap_in(pt *t) {
    pt_seq *s = pt_pick(t, PT_SWAPPED);
    if (!s) return;
    loom_error err = {0};
    pt_snap sn;
    pt_snapshot(t, s, &sn);
    loom_status st = t->c.ops->swap_in(t->c.self, s->id, &err);
    if (st == LOOM_ERR_NO_SPACE) {
        pt_expect_unchanged(t, s, &sn);
        return;
    }
    PT_ASSERT(t, st == LOOM_OK, "swap_in: %s", err.message);
    pt_apply_ops(t);
    s->state = PT_RUNNING;
}

/* Free everything: every block must come back with refcount 0. */
static void pt_drain(pt *t) {
    for (int i = 0; i < PT_MAX_SEQS; i++)
        if (t->seqs[i].live) pt_finish(t, &t->seqs[i]);
    pt_check(t);
    PT_ASSERT(t, t->c.ops->num_free_blocks(t->c.self) == t->cfg->num_blocks ||
                     !t->cfg->paged,
              "after freeing everything %d of %d blocks are free",
              t->c.ops->num_free_blocks(t->c.self), t->cfg->num_blocks);
    loom_cache_stats st = {.struct_size = sizeof st};
    t->c.ops->stats(t->c.self, &st);
    PT_ASSERT(t, st.free_blocks == t->cfg->num_blocks && st.free_cpu_blocks == st.num_cpu_blocks,
              "leak: %d/%d device, %d/%d host blocks free", st.free_blocks, st.num_blocks,
              st.free_cpu_blocks, st.num_cpu_blocks);
    for (int32_t b = 0; t->cfg->paged && b < t->cfg->num_blocks; b++)
        PT_ASSERT(t, loom_paged_debug_refcount(t->c.self, b, false) == 0,
                  "block %d still referenced", b);
    t->drains++;
}

static void pt_run(const pt_cfg *cfg) {
    pt *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->cfg = cfg;
    t->seed = pt_seed();
    pt_rng = t->seed ? t->seed : 1;
    fprintf(stderr, "cache property %s: seed=0x%llx (replay with LOOM_TEST_SEED)\n", cfg->name,
            (unsigned long long)t->seed);
    cr_log_info("cache property %s: seed=0x%llx", cfg->name, (unsigned long long)t->seed);
    t->next_id = 1;
    t->op = "init";
    for (int f = 0; f < PT_FAMILIES; f++)
        for (int i = 0; i < PT_FAMILY_LEN; i++) t->families[f][i] = 10 + pt_rand(8);

    loom_error err = {0};
    loom_cache_init in = tc_init_desc((size_t)1 << 30, cfg->max_model_len, true);
    loom_status st;
    if (cfg->paged) {
        loom_paged_config pc;
        cr_assert(tc_apply_defaults(loom_paged_params, &pc, sizeof pc));
        pc.block_size = cfg->bs;
        pc.num_blocks = cfg->num_blocks;
        pc.num_cpu_blocks = cfg->num_cpu_blocks;
        pc.prefix_caching = cfg->prefix_caching;
        pc.watermark = cfg->watermark;
        st = tc_open(&t->c, &loom_paged_ops, &pc, &in, &err);
        if (st == LOOM_OK && cfg->key_mask) loom_paged_debug_set_key_mask(t->c.self, cfg->key_mask);
    } else {
        loom_contiguous_config cc;
        cr_assert(tc_apply_defaults(loom_contiguous_params, &cc, sizeof cc));
        cc.block_size = cfg->bs;
        cc.num_blocks = cfg->num_blocks;
        st = tc_open(&t->c, &loom_contiguous_ops, &cc, &in, &err);
    }
    cr_assert_eq(st, LOOM_OK, "open %s: %s", cfg->name, err.message);
    cr_assert_eq(t->c.layout.num_blocks, cfg->num_blocks);
    size_t ndev = (size_t)cfg->num_blocks * cfg->bs, nhost = (size_t)cfg->num_cpu_blocks * cfg->bs;
    t->dev = malloc((ndev + 1) * sizeof *t->dev);
    t->host = malloc((nhost + 1) * sizeof *t->host);
    memset(t->dev, 0xff, (ndev + 1) * sizeof *t->dev);
    memset(t->host, 0xff, (nhost + 1) * sizeof *t->host);

    for (t->step = 0; t->step < cfg->num_ops; t->step++) {
        /* Weights in percent: new 12, admit 18, step 40, fork 5, truncate 6,
         * preempt 5, swap_in 5, finish 8, drain 1 (of which 1 in 5 runs). */
        int r = pt_rand(100);
        pt_seq *s;
        if (r < 12) {
            t->op = "new";
            pt_op_new(t);
        } else if (r < 30) {
            t->op = "admit";
            pt_op_admit(t);
        } else if (r < 70) {
            t->op = "step";
            pt_op_step(t);
        } else if (r < 75) {
            t->op = "fork";
            pt_op_fork(t);
        } else if (r < 81) {
            t->op = "truncate";
            pt_op_truncate(t);
        } else if (r < 86) {
            t->op = "preempt";
            if ((s = pt_pick(t, PT_RUNNING))) pt_preempt(t, s);
        } else if (r < 91) {
            t->op = "swap_in";
            pt_op_swap_in(t);
        } else if (r < 99) {
            t->op = "finish";
            if ((s = pt_pick(t, -1))) pt_finish(t, s);
        } else if (pt_rand(5) == 0) {
            t->op = "drain";
            pt_drain(t);
        }
        pt_check(t);
    }
    t->op = "final drain";
    pt_drain(t);
    if (!cfg->paged) { /* swap is not a thing there */
        PT_ASSERT(t, t->c.ops->swap_out(t->c.self, 1, &err) == LOOM_ERR_UNSUPPORTED, "swap");
    }
    loom_cache_stats cs = {.struct_size = sizeof cs};
    t->c.ops->stats(t->c.self, &cs);
    fprintf(stderr,
            "cache property %s: %d ops, %lld allocs (%lld NO_SPACE), %lld prefix-hit tokens, "
            "%lld copies, %lld swapped blocks, %lld forks, %lld drains, %lld evictions, peak %d "
            "of %d blocks\n",
            cfg->name, cfg->num_ops, (long long)t->allocs, (long long)t->nospace,
            (long long)t->hits, (long long)t->cows, (long long)t->swaps, (long long)t->forks,
            (long long)t->drains, (long long)cs.evictions, cs.peak_used_blocks, cs.num_blocks);
    /* The workload must actually exercise what it claims to. */
    cr_assert_gt(t->nospace, 0, "%s: pool never ran full; shrink it", cfg->name);
    if (cfg->paged && cfg->prefix_caching) cr_assert_gt(t->hits, 0, "%s: no prefix hits", cfg->name);
    if (cfg->num_cpu_blocks > 0) cr_assert_gt(t->swaps, 0, "%s: no swaps", cfg->name);
    if (cfg->paged && cfg->bs > 1) /* with 1-token blocks nothing is ever partial */
        cr_assert_gt(t->cows, 0, "%s: no copy-on-write", cfg->name);
    tc_close(&t->c);
    cr_assert_eq(fake_host_live_allocs(), 0, "%s: %ld host allocations leaked", cfg->name,
                 fake_host_live_allocs());
    free(t->dev);
    free(t->host);
    free(t);
}

Test(cache, property_paged_bs4_prefix_swap, .timeout = 120) {
    pt_cfg c = {"paged bs=4 prefix+swap", true, 4, 64, 24, true, 0.05, 128, 20000};
    pt_run(&c);
}

Test(cache, property_paged_bs1_prefix, .timeout = 120) {
    pt_cfg c = {"paged bs=1 prefix", true, 1, 160, 0, true, 0.0, 128, 12000};
    pt_run(&c);
}

Test(cache, property_paged_bs5_noprefix_swap, .timeout = 120) {
    pt_cfg c = {"paged bs=5 no-prefix+swap", true, 5, 40, 16, false, 0.02, 120, 12000};
    pt_run(&c);
}

Test(cache, property_paged_bs16_prefix_swap, .timeout = 120) {
    pt_cfg c = {"paged bs=16 prefix+swap", true, 16, 24, 12, true, 0.0, 192, 12000};
    pt_run(&c);
}

/* Only 8 table keys: most lookups land on a block with other contents,
 * which the full-hash + stored-token check must reject. */
Test(cache, property_paged_bs2_colliding_keys, .timeout = 120) {
    pt_cfg c = {"paged bs=2 8 keys", true, 2, 96, 0, true, 0.0, 96, 12000, 0x7};
    pt_run(&c);
}

Test(cache, property_contiguous, .timeout = 120) {
    pt_cfg c = {"contiguous bs=4", false, 4, 70, 0, false, 0.0, 64, 12000};
    pt_run(&c);
}
