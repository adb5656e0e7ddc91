/*
 * plugins/speculator/ngram/spec_adapt.h — what both speculator plugins
 * (ngram, draft-model) share: per-sequence state keyed by sequence id, the
 * adaptive draft-length rule, the batch-size cut-off and the statistics
 * every speculator reports. Header-only (static functions), so each plugin
 * compiles its own copy and the two .so files share no symbols;
 * plugins/speculator/draft-model includes it from this folder.
 *
 * The adaptive rule, per sequence:
 *   - ema: exponential moving average of accepted/proposed over the
 *     sequence's verified steps (weight SPEC_ADAPT_EMA_W on the newest),
 *     starting optimistic at 1.
 *   - k = clamp(1 + floor(ema * k_max), 1, k_max): one draft more than the
 *     expected accepted run, so a sequence that accepts everything grows to
 *     k_max and one that accepts little falls to 1.
 *   - "off": after SPEC_ADAPT_PATIENCE verified steps in a row with ema
 *     below SPEC_ADAPT_OFF_BELOW, the sequence proposes nothing for
 *     `backoff` propose() calls, then probes once with k = min(2, k_max).
 *     A probe that accepts anything turns it back on (ema restarts from the
 *     probe's ratio, backoff resets); a probe that accepts nothing doubles
 *     backoff (SPEC_ADAPT_BACKOFF_MIN..MAX) and stays off.
 * With adaptive off, k = k_max always and sequences are never turned off.
 *
 * plan() turns speculation off for a whole step when more than max_batch
 * sequences decode: large batches are compute-bound and the k+1 verify
 * positions per sequence then cost more than they save. max_verify_tokens
 * (0 = no cap) caps the positions a step verifies, batch * (k + 1): k
 * shrinks as the batch grows, and speculation is off once not even one
 * draft per sequence fits (the CPU backend, for one, is memory-bound only
 * up to 16 rows per linear layer).
 *
 * Not thread-safe: every speculator call is [engine] (loom/spec.h).
 */
#ifndef LOOM_SPEC_ADAPT_H
#define LOOM_SPEC_ADAPT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/seq.h"
#include "loom/spec.h"

#define SPEC_ADAPT_EMA_W 0.3        /* weight of the newest step's ratio        */
#define SPEC_ADAPT_OFF_BELOW 0.1    /* ema under this counts as "near 0"        */
#define SPEC_ADAPT_PATIENCE 4       /* verified steps near 0 before turning off */
#define SPEC_ADAPT_BACKOFF_MIN 8    /* propose() calls skipped after turning off */
#define SPEC_ADAPT_BACKOFF_MAX 256  /* cap of the doubling backoff              */
#define SPEC_ADAPT_K_HIST 16        /* k histogram buckets kept in stats        */

/* One sequence's adaptive state. */
typedef struct spec_seq {
    loom_seq_id id;       /* key; valid only when used                        */
    bool used;            /* slot holds a live sequence                        */
    bool off;             /* proposing nothing (waiting to probe)              */
    bool probing;         /* the last proposal was a probe                     */
    double ema;           /* EMA of accepted/proposed, [0, 1]                  */
    int32_t low_streak;   /* verified steps in a row with ema < OFF_BELOW      */
    int32_t off_left;     /* propose() calls still skipped while off           */
    int32_t backoff;      /* length of the next off period, calls              */
} spec_seq;

/* Open-addressing table (linear probing, backward-shift deletion) of
 * spec_seq, sized to a power of two kept at most half full. */
typedef struct spec_table {
    spec_seq *slots;      /* (cap) host-allocated                              */
    int32_t cap;          /* power of two, 0 before the first insert           */
    int32_t count;        /* used slots                                        */
} spec_table;

/* Everything a speculator reports. */
typedef struct spec_counters {
    int64_t proposed;         /* drafts returned by propose()                  */
    int64_t verified;         /* drafts the core verified (observe)            */
    int64_t accepted;         /* drafts accepted (observe)                     */
    int64_t steps_off;        /* plan() calls that returned 0 (batch too big)  */
    int64_t seq_skips;        /* propose() calls skipped by a sequence's off state */
    int64_t k_hist[SPEC_ADAPT_K_HIST + 1]; /* propose() calls by k asked (last: larger) */
} spec_counters;

static inline uint64_t spec_hash_id(loom_seq_id id) {
    uint64_t z = (uint64_t)id + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Slot of id, or -1. */
static inline int32_t spec_table_find(const spec_table *t, loom_seq_id id) {
    if (t->cap == 0) return -1;
    int32_t mask = t->cap - 1;
    for (int32_t i = (int32_t)(spec_hash_id(id) & (uint64_t)mask);; i = (i + 1) & mask) {
        if (!t->slots[i].used) return -1;
        if (t->slots[i].id == id) return i;
    }
}

static inline void spec_table_free(spec_table *t, const loom_host *h) {
    if (t->slots) h->free(h->ctx, t->slots);
    memset(t, 0, sizeof *t);
}

/* Place a used entry into a table known to have room and not to hold it. */
static inline void spec_table_place(spec_table *t, const spec_seq *s) {
    int32_t mask = t->cap - 1;
    int32_t i = (int32_t)(spec_hash_id(s->id) & (uint64_t)mask);
    while (t->slots[i].used) i = (i + 1) & mask;
    t->slots[i] = *s;
    t->count++;
}

/* The state of id, created (optimistic: ema 1) on first use; NULL when out
 * of memory (callers then speculate without adapting). */
static inline spec_seq *spec_table_get(spec_table *t, const loom_host *h, loom_seq_id id) {
    int32_t i = spec_table_find(t, id);
    if (i >= 0) return &t->slots[i];
    if ((t->count + 1) * 2 > t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 16;
        spec_seq *ns = h->calloc(h->ctx, (size_t)cap, sizeof *ns);
        if (!ns) return NULL;
        spec_table old = *t;
        t->slots = ns;
        t->cap = cap;
        t->count = 0;
        for (int32_t k = 0; k < old.cap; k++)
            if (old.slots[k].used) spec_table_place(t, &old.slots[k]);
        if (old.slots) h->free(h->ctx, old.slots);
    }
    spec_seq s = {.id = id, .used = true, .ema = 1.0, .backoff = SPEC_ADAPT_BACKOFF_MIN};
    spec_table_place(t, &s);
    return &t->slots[spec_table_find(t, id)];
}

/* Drop id (no-op when unknown); backward-shift keeps probe chains whole. */
static inline void spec_table_remove(spec_table *t, loom_seq_id id) {
    int32_t i = spec_table_find(t, id);
    if (i < 0) return;
    int32_t mask = t->cap - 1;
    t->slots[i].used = false;
    t->count--;
    for (int32_t j = (i + 1) & mask; t->slots[j].used; j = (j + 1) & mask) {
        int32_t home = (int32_t)(spec_hash_id(t->slots[j].id) & (uint64_t)mask);
        /* Move j back to i when i lies cyclically in [home, j). */
        bool move = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (move) {
            t->slots[i] = t->slots[j];
            t->slots[j].used = false;
            i = j;
        }
    }
}

/* plan(): k_max, capped so batch_size * (k + 1) <= max_verify (when > 0),
 * or 0 when more than max_batch sequences decode or not even one draft per
 * sequence fits max_verify. */
static inline int32_t spec_adapt_plan(spec_counters *c, const loom_host *h, const char *who,
                                      int32_t k_max, int64_t max_batch, int64_t max_verify,
                                      int32_t batch_size) {
    int32_t k = k_max;
    if (max_verify > 0 && batch_size > 0) {
        int64_t per = max_verify / batch_size - 1;
        if (per < k) k = per < 0 ? 0 : (int32_t)per;
    }
    if ((max_batch > 0 && batch_size > max_batch) || k <= 0) {
        c->steps_off++;
        char name[96];
        snprintf(name, sizeof name, "spec.%s.steps_off", who);
        h->metric_add(h->ctx, name, 1);
        return 0;
    }
    return k;
}

/* How many drafts seq s should propose now (0: off this call), given the
 * core's cap max_k. s may be NULL (no state: propose max_k). Advances the
 * off/probe state, so call it once per propose(). */
static inline int32_t spec_adapt_k(spec_counters *c, const loom_host *h, const char *who, spec_seq *s,
                                   bool adaptive, int32_t k_max, int32_t max_k) {
    int32_t k = k_max;
    if (adaptive && s) {
        s->probing = false;
        if (s->off) {
            if (s->off_left > 0) {
                s->off_left--;
                c->seq_skips++;
                char name[96];
                snprintf(name, sizeof name, "spec.%s.seq_paused", who);
                h->metric_add(h->ctx, name, 1);
                return 0;
            }
            s->probing = true;
            k = k_max < 2 ? k_max : 2;
        } else {
            k = 1 + (int32_t)floor(s->ema * k_max);
            if (k > k_max) k = k_max;
            if (k < 1) k = 1;
        }
    }
    return k < max_k ? k : max_k;
}

/* Count a proposal of n drafts (after the drafter ran) in stats/metrics. */
static inline void spec_adapt_proposed(spec_counters *c, const loom_host *h, const char *who,
                                       int32_t k_asked, int32_t n) {
    if (k_asked > 0) {
        c->k_hist[k_asked < SPEC_ADAPT_K_HIST ? k_asked : SPEC_ADAPT_K_HIST]++;
        char name[96];
        snprintf(name, sizeof name, "spec.%s.k.%d", who, k_asked);
        h->metric_add(h->ctx, name, 1);
    }
    if (n > 0) {
        c->proposed += n;
        h->metric_add(h->ctx, "spec.proposed", n);
    }
}

/* Feedback after verification: update the counters and s's adaptive state. */
static inline void spec_adapt_observe(spec_counters *c, const loom_host *h, spec_seq *s,
                                      int32_t proposed, int32_t accepted) {
    if (proposed <= 0) return;
    if (accepted < 0) accepted = 0;
    if (accepted > proposed) accepted = proposed;
    c->verified += proposed;
    c->accepted += accepted;
    h->metric_add(h->ctx, "spec.accepted", accepted);
    h->metric_set(h->ctx, "spec.acceptance_rate", c->verified ? (double)c->accepted / c->verified : 0);
    if (!s) return;
    double r = (double)accepted / proposed;
    if (s->probing) {
        s->probing = false;
        if (accepted > 0) {
            s->off = false;
            s->ema = r;
            s->low_streak = 0;
            s->backoff = SPEC_ADAPT_BACKOFF_MIN;
        } else {
            s->backoff = s->backoff * 2 > SPEC_ADAPT_BACKOFF_MAX ? SPEC_ADAPT_BACKOFF_MAX : s->backoff * 2;
            s->off_left = s->backoff;
        }
        return;
    }
    s->ema = (1.0 - SPEC_ADAPT_EMA_W) * s->ema + SPEC_ADAPT_EMA_W * r;
    s->low_streak = s->ema < SPEC_ADAPT_OFF_BELOW ? s->low_streak + 1 : 0;
    if (s->low_streak >= SPEC_ADAPT_PATIENCE) {
        s->off = true;
        s->off_left = s->backoff;
        s->low_streak = 0;
    }
}

static inline void spec_adapt_stats(const spec_counters *c, loom_spec_stats *out) {
    if (!out || out->struct_size < offsetof(loom_spec_stats, steps_off) + sizeof out->steps_off) return;
    out->proposed = c->proposed;
    out->accepted = c->accepted;
    out->steps_off = c->steps_off;
}

#endif /* LOOM_SPEC_ADAPT_H */
