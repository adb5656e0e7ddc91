/*
 * plugins/scheduler/static/static.c — the `static` scheduler: request-level
 * batching, the baseline `continuous` is measured against.
 *
 * It forms a batch, runs it until every member has left, and only then forms
 * the next one — the way servers batched before Orca. It exists to be A/B
 * tested against, not to be fast: a member that finishes early leaves its
 * slot idle until the longest member is done.
 *
 * One step:
 *   1. If the batch is empty: take up to max_num_seqs waiting sequences in
 *      FCFS order (arrival time, then add order). Each gets acquire_prefix
 *      and an allocation for ALL its tokens (the whole prompt) at once; the
 *      first one the cache refuses (NO_SPACE) closes the batch.
 *   2. Each member in batch order gets min(tokens it needs, tokens left):
 *      the prefill may thus be split across steps by max_batched_tokens;
 *      afterwards 1 (+ num_draft) per step. Before each entry the cache
 *      allocates [0, num_computed + n); on NO_SPACE the youngest member
 *      without an entry this step (possibly this one) is preempted by
 *      recompute: its blocks are freed, it leaves the batch and goes back to
 *      the waiting queue in arrival order (so it leads the next batch).
 *   3. No admission while any member remains; remove() (finish or abort)
 *      is the only way out besides preemption.
 *
 * Waiting sequences that hold blocks: sequences added with num_computed > 0
 * (the n - 1 samples the core forks after a prompt) share their parent's KV
 * blocks while they wait (flag holds_blocks; cleared when admitted or
 * freed), possibly behind an older head (a preempted parent) that needs
 * exactly those blocks (and preempting a member frees nothing while its
 * waiting samples still share its blocks). So waiting holders are victims
 * too, preempted by recompute (cache->free, reported; each keeps its place):
 * in step 1, when the head does not fit and the batch is still empty, the
 * youngest waiting holder behind the head is freed and the head retried
 * (with members in the batch the batch just closes: they run, and free
 * their blocks when they finish or are preempted); in step 2, a waiting
 * holder younger than the member that would be preempted is freed first.
 * Hence a step that schedules nothing and preempts nothing has an empty
 * batch and no blocks held by anyone but the head: its prompt alone does not
 * fit the cache, and the core reports the stall.
 * Preemption is always recompute (this baseline has no swap).
 * Threads: every op is [engine] (loom/scheduler.h); no locks, no globals.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/scheduler.h"
#include "sched_queue.h"

#define STAT_WHO "scheduler.static"

/* Filled by the host from stat_params; borrowed during create() only. */
typedef struct stat_config {
    int64_t max_num_seqs;       /* members of one batch, at most                 */
    int64_t max_batched_tokens; /* tokens computed per step, at most             */
} stat_config;

static const loom_param stat_params[] = {
    {"max_num_seqs", LOOM_PARAM_INT, offsetof(stat_config, max_num_seqs), "256", 1, 1 << 20,
     NULL, "members of one batch, at most"},
    {"max_batched_tokens", LOOM_PARAM_INT, offsetof(stat_config, max_batched_tokens), "2048", 1,
     1 << 30, NULL, "most tokens computed in one step (prefills split across steps)"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct stat_seq {
    loom_seq_id id;
    double arrival;          /* seconds, core clock                              */
    uint64_t order;          /* add() counter: breaks ties in arrival            */
    bool needs_prefix;       /* acquire_prefix at the next admission             */
    bool holds_blocks;       /* waiting, yet holds device blocks (forked child)   */
    bool fresh;              /* admitted, no entry yet: starts at `start`        */
    int32_t start;           /* tokens cached at admission (prefix hit)          */
    int64_t scheduled_step;  /* step of its last entry; -1 none                  */
    int64_t freed_step;      /* step a holder was freed while waiting; -1 never  */
} stat_seq;

typedef struct stat_queue {
    stat_seq *v;
    int32_t n, cap;
} stat_queue;

typedef struct stat_sched {
    const loom_host *host;   /* borrowed; outlives the instance                  */
    stat_config cfg;
    stat_queue waiting;      /* FCFS order                                       */
    stat_queue batch;        /* admission order                                  */
    uint64_t next_order;
    int64_t step;
    int64_t num_preemptions;
} stat_sched;

static int stat_cmp(const stat_seq *a, const stat_seq *b) {
    if (a->arrival != b->arrival) return a->arrival < b->arrival ? -1 : 1;
    if (a->order != b->order) return a->order < b->order ? -1 : 1;
    return 0;
}

static int stat_cmp_any(const void *ctx, const void *a, const void *b) {
    (void)ctx;
    return stat_cmp(a, b);
}

static loom_status stat_queue_reserve(stat_sched *s, stat_queue *q, int32_t want, loom_error *err) {
    return sq_reserve(s->host, STAT_WHO, (void **)&q->v, &q->cap, q->n, want, sizeof *q->v, err);
}

/* FCFS insert (after equals); capacity must be reserved. */
static void stat_queue_insert(stat_queue *q, const stat_seq *x) {
    sq_insert(q->v, &q->n, x, sizeof *x, stat_cmp_any, NULL);
}

static void stat_queue_remove(stat_queue *q, int32_t i) { sq_remove(q->v, &q->n, i, sizeof q->v[0]); }

static int32_t stat_queue_find(const stat_queue *q, loom_seq_id id) {
    for (int32_t i = 0; i < q->n; i++)
        if (q->v[i].id == id) return i;
    return -1;
}

static loom_status stat_cache_fail(stat_sched *s, loom_error *err, loom_status rc,
                                   const char *what, loom_seq_id id, const loom_error *cerr) {
    return s->host->error(s->host->ctx, err, rc, STAT_WHO ": cache %s for sequence %lld failed: %s",
                          what, (long long)id, cerr->message[0] ? cerr->message : "(no message)");
}

static void stat_drop_unknown(stat_sched *s, stat_queue *q, int32_t i) {
    s->host->log(s->host->ctx, LOOM_LOG_WARN, STAT_WHO,
                 "sequence %lld is unknown to the core (finished without remove()?); dropping it",
                 (long long)q->v[i].id);
    stat_queue_remove(q, i);
}

/* Free the youngest waiting sequence at index >= from that holds blocks
 * and is younger than `than` (NULL: any) by recompute, and report it; false
 * when there is none. */
static bool stat_free_waiting_holder(stat_sched *s, const loom_sched_env *env,
                                     loom_sched_output *out, int32_t from, const stat_seq *than) {
    for (int32_t j = s->waiting.n - 1; j >= from; j--) {
        stat_seq *w = &s->waiting.v[j];
        if (!w->holds_blocks) continue;
        if (than && stat_cmp(w, than) <= 0) return false;
        env->cache->free(env->cache_self, w->id);
        w->holds_blocks = false;
        w->needs_prefix = true;
        w->freed_step = s->step;
        out->preempted[out->num_preempted] = w->id; /* capacity >= live sequences */
        out->preempt_mode[out->num_preempted] = LOOM_PREEMPT_RECOMPUTE;
        out->num_preempted++;
        s->num_preemptions++;
        s->host->metric_add(s->host->ctx, "sched.preemptions", 1);
        return true;
    }
    return false;
}

/* Step 1: form a batch from the waiting queue. */
static loom_status stat_form_batch(stat_sched *s, const loom_sched_env *env,
                                   loom_sched_output *out, loom_error *err) {
    while (s->waiting.n > 0 && s->batch.n < s->cfg.max_num_seqs) {
        stat_seq head = s->waiting.v[0];
        /* The core resets its num_computed only after schedule() returns. */
        if (head.freed_step == s->step) break;
        const loom_seq_info *v = env->get_seq(env->ctx, head.id);
        if (!v) {
            stat_drop_unknown(s, &s->waiting, 0);
            continue;
        }
        if (v->num_tokens <= 0) break;
        int32_t start = head.needs_prefix ? env->cache->acquire_prefix(env->cache_self, v)
                                          : v->num_computed;
        if (start < 0) start = 0;
        if (start > v->num_tokens - 1) start = v->num_tokens - 1;
        loom_error cerr = {0};
        loom_status rc = env->cache->allocate(env->cache_self, v, v->num_tokens, &cerr);
        if (rc != LOOM_OK) {
            if (head.needs_prefix) env->cache->free(env->cache_self, head.id);
            if (rc == LOOM_ERR_NO_SPACE) {
                /* An empty batch would run nothing: free what waits behind. */
                if (s->batch.n == 0 && stat_free_waiting_holder(s, env, out, 1, NULL)) continue;
                break;
            }
            return stat_cache_fail(s, err, rc, "allocate", head.id, &cerr);
        }
        head.needs_prefix = false;
        head.holds_blocks = false;
        head.fresh = true;
        head.start = start;
        head.scheduled_step = -1;
        stat_queue_remove(&s->waiting, 0);
        s->batch.v[s->batch.n++] = head;
    }
    return LOOM_OK;
}

static loom_status stat_schedule(void *self, const loom_sched_env *env, loom_sched_output *out,
                                 loom_error *err) {
    stat_sched *s = self;
    const loom_host *h = s->host;
    if (!env || env->struct_size < offsetof(loom_sched_env, now) + sizeof env->now ||
        !env->get_seq || !env->cache || !env->cache->allocate || !env->cache->free ||
        !env->cache->acquire_prefix)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": schedule() needs an env with get_seq and a cache manager "
                                 "(acquire_prefix, allocate, free)");
    if (!out || !out->scheduled || !out->preempted || !out->preempt_mode)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": schedule() needs an output with its three arrays");
    int32_t live = s->waiting.n + s->batch.n;
    if (out->capacity < live)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": output capacity %d is below the %d live sequences",
                        out->capacity, live);
    out->num_scheduled = 0;
    out->num_preempted = 0;
    s->step++;

    loom_status rc = LOOM_OK;
    if (s->batch.n == 0) rc = stat_form_batch(s, env, out, err);

    int32_t budget = (int32_t)s->cfg.max_batched_tokens;
    int32_t i = 0;
    while (rc == LOOM_OK && i < s->batch.n && budget > 0) {
        stat_seq *r = &s->batch.v[i];
        const loom_seq_info *v = env->get_seq(env->ctx, r->id);
        if (!v) {
            stat_drop_unknown(s, &s->batch, i);
            continue;
        }
        int32_t computed = r->fresh ? r->start : v->num_computed;
        int32_t need = v->num_tokens - computed;
        if (need <= 0) {
            i++;
            continue;
        }
        int32_t n = need < budget ? need : budget;
        loom_error cerr = {0};
        rc = env->cache->allocate(env->cache_self, v, computed + n, &cerr);
        if (rc == LOOM_ERR_NO_SPACE) {
            /* The youngest member without an entry; r qualifies, so j >= i. */
            int32_t j = s->batch.n - 1;
            while (s->batch.v[j].scheduled_step == s->step) j--;
            /* A younger waiting sequence holding blocks gives them up first. */
            if (stat_free_waiting_holder(s, env, out, 0, &s->batch.v[j])) {
                rc = LOOM_OK;
                continue;
            }
            stat_seq victim = s->batch.v[j];
            env->cache->free(env->cache_self, victim.id);
            stat_queue_remove(&s->batch, j);
            victim.needs_prefix = true;
            victim.holds_blocks = false;
            victim.fresh = false;
            victim.scheduled_step = -1;
            stat_queue_insert(&s->waiting, &victim);
            out->preempted[out->num_preempted] = victim.id;
            out->preempt_mode[out->num_preempted] = LOOM_PREEMPT_RECOMPUTE;
            out->num_preempted++;
            s->num_preemptions++;
            h->metric_add(h->ctx, "sched.preemptions", 1);
            rc = LOOM_OK;
            continue; /* retry r, or the next member now at i */
        }
        if (rc != LOOM_OK) {
            rc = stat_cache_fail(s, err, rc, "allocate", r->id, &cerr);
            break;
        }
        out->scheduled[out->num_scheduled++] = (loom_sched_entry){r->id, computed, n};
        budget -= n;
        r->fresh = false;
        r->scheduled_step = s->step;
        i++;
    }
    h->metric_set(h->ctx, "sched.waiting", s->waiting.n);
    h->metric_set(h->ctx, "sched.running", s->batch.n);
    h->metric_set(h->ctx, "sched.swapped", 0);
    h->metric_set(h->ctx, "sched.batch_seqs", out->num_scheduled);
    h->metric_set(h->ctx, "sched.batch_tokens", (double)(s->cfg.max_batched_tokens - budget));
    if (rc == LOOM_OK && err) err->code = LOOM_OK;
    return rc;
}

static loom_status stat_create(const loom_host *host, const void *config, void **self,
                               loom_error *err) {
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    if (!config)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           STAT_WHO ": create() needs a config (the host fills it from the "
                                    "parameter table)");
    const stat_config *cfg = config;
    loom_status st = sq_check_limits(host, STAT_WHO, cfg->max_num_seqs, cfg->max_batched_tokens, err);
    if (st != LOOM_OK) return st;
    stat_sched *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s) return host->error(host->ctx, err, LOOM_ERR_NOMEM, STAT_WHO ": out of memory");
    s->host = host;
    s->cfg = *cfg;
    *self = s;
    return LOOM_OK;
}

static void stat_destroy(void *self) {
    stat_sched *s = self;
    if (!s) return;
    s->host->free(s->host->ctx, s->waiting.v);
    s->host->free(s->host->ctx, s->batch.v);
    s->host->free(s->host->ctx, s);
}

static loom_status stat_add(void *self, const loom_seq_info *seq, loom_error *err) {
    stat_sched *s = self;
    const loom_host *h = s->host;
    if (!seq)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, STAT_WHO ": add() got a NULL sequence");
    if (seq->num_tokens < 1)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": sequence %lld has %d tokens; a prompt needs at least one",
                        (long long)seq->id, seq->num_tokens);
    if (isnan(seq->arrival_time))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": sequence %lld has a NaN arrival time", (long long)seq->id);
    if (stat_queue_find(&s->waiting, seq->id) >= 0 || stat_queue_find(&s->batch, seq->id) >= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        STAT_WHO ": sequence %lld was already added", (long long)seq->id);
    int32_t total = s->waiting.n + s->batch.n + 1;
    loom_status rc;
    if ((rc = stat_queue_reserve(s, &s->waiting, total, err)) != LOOM_OK) return rc;
    if ((rc = stat_queue_reserve(s, &s->batch, total, err)) != LOOM_OK) return rc;
    stat_seq x = {
        .id = seq->id,
        .arrival = seq->arrival_time,
        .order = s->next_order++,
        .needs_prefix = seq->num_computed <= 0,
        .holds_blocks = seq->num_computed > 0,
        .scheduled_step = -1,
        .freed_step = -1,
    };
    stat_queue_insert(&s->waiting, &x);
    return LOOM_OK;
}

static void stat_remove(void *self, loom_seq_id id) {
    stat_sched *s = self;
    int32_t i = stat_queue_find(&s->batch, id);
    if (i >= 0) {
        stat_queue_remove(&s->batch, i);
        return;
    }
    i = stat_queue_find(&s->waiting, id);
    if (i >= 0) stat_queue_remove(&s->waiting, i);
}

static void stat_stats(void *self, loom_sched_stats *out) {
    const stat_sched *s = self;
    if (!out) return;
    loom_sched_stats st = {
        .struct_size = sizeof st,
        .num_waiting = s->waiting.n,
        .num_running = s->batch.n,
        .num_swapped = 0,
        .num_preemptions = s->num_preemptions,
    };
    uint32_t n = out->struct_size && out->struct_size < sizeof st ? out->struct_size : sizeof st;
    memcpy(out, &st, n);
    out->struct_size = n;
}

static const loom_scheduler_ops stat_ops = {
    .struct_size = sizeof(loom_scheduler_ops),
    .create = stat_create,
    .destroy = stat_destroy,
    .add = stat_add,
    .remove = stat_remove,
    .schedule = stat_schedule,
    .stats = stat_stats,
};

static const loom_component stat_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SCHEDULER,
    .name = "static",
    .summary = "request-level batching baseline: a batch runs until all its members finish",
    .ops = &stat_ops,
    .params = stat_params,
    .config_size = sizeof(stat_config),
}};

static const loom_plugin_desc stat_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-scheduler-static",
    .version = "0.1.0",
    .num_components = 1,
    .components = stat_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &stat_desc; }
