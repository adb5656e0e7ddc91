/*
 * plugins/scheduler/continuous/continuous.c — the `continuous` scheduler:
 * iteration-level batching (Orca) with chunked prefill, FCFS or priority
 * order, and preemption by recompute or swap when the cache runs out.
 *
 * It decides, each step, which sequences run and how many tokens each; it
 * owns three queues of sequence ids and nothing else. Sequence state (tokens,
 * num_computed) belongs to the core and is read through env->get_seq; KV
 * slots belong to the cache manager and are asked for through env->cache.
 * It does not sample, detect stop conditions, or free the blocks of finished
 * sequences (the core does, then calls remove()).
 *
 * One step, in order (the shape of vLLM v1's scheduler, written anew):
 *
 *   1. RUNNING, decodes first, then unfinished prefill chunks, each pass in
 *      policy order. A sequence needs num_tokens - num_computed tokens (a
 *      decode: 1 + num_draft); it gets min(need, tokens left). Before its
 *      entry is emitted the cache must allocate slots for
 *      [0, num_computed + n); on NO_SPACE the last running sequence in
 *      policy order that has no entry yet (the youngest / lowest priority —
 *      possibly the one being placed) is preempted and the allocation
 *      retried. Recompute: cache->free, back to WAITING in policy order
 *      (so at the front of everything that arrived later). Swap:
 *      cache->swap_out, to SWAPPED; when swap_out answers NO_SPACE or
 *      UNSUPPORTED the victim is recomputed instead.
 *   2. If step 1 preempted anyone, stop here: memory is short, and admitting
 *      would only preempt again (vLLM does the same).
 *   3. SWAPPED and WAITING heads, merged in policy order, while a sequence
 *      slot (max_num_seqs) and tokens are left. A swapped head is swapped
 *      in and allocated; a waiting head gets acquire_prefix (tokens already
 *      cached), then allocate for its first chunk. The first head that does
 *      not fit stops admission: no skipping ahead (FCFS is FCFS). In
 *      priority mode a head that does not fit (no slot, or NO_SPACE) first
 *      preempts running sequences of strictly lower priority (larger value),
 *      taking back their entries of this step if they had one.
 *   4. Chunking: with chunked_prefill a waiting prompt takes whatever tokens
 *      are left (a partial chunk; the rest runs next steps as RUNNING pass
 *      2). Without it the whole remaining prompt must fit the tokens left,
 *      else admission stops — except a prompt longer than
 *      max_batched_tokens, which could never fit: it is admitted only into
 *      an otherwise empty step and then prefilled in budget-sized chunks, so
 *      it runs alone instead of starving the queue forever.
 *
 *   5. Waiting sequences that hold blocks: sequences added with
 *      num_computed > 0 (the n - 1 samples the core forks after a prompt)
 *      already share their parent's KV blocks while they wait (flag
 *      holds_blocks; cleared when admitted or freed). Such a sequence can
 *      sit behind an older head that does not fit (a preempted parent, an
 *      earlier request) and keep exactly the blocks that head needs: with
 *      nothing running, nothing would ever free them (and preempting a
 *      running parent frees nothing while its waiting samples still share
 *      its blocks). So such waiting sequences are victims too, freed by
 *      recompute (cache->free, reported as preempted; each keeps its place
 *      in the queue):
 *        - step 1: on NO_SPACE the youngest (policy order) of the victim
 *          candidates above and the waiting block holders gives up its
 *          blocks — a younger waiting holder before any running sequence;
 *        - step 3: when the waiting or swapped head gets NO_SPACE (after
 *          any priority preemption) and this step has no entry yet, the
 *          youngest waiting holder behind the head is freed and the head
 *          retried. Only when the step would otherwise be empty: while
 *          anything runs it will finish or be preempted and free blocks,
 *          and shared prompt blocks are not thrown away for nothing.
 *      Progress: a step that schedules nothing and preempts nothing has no
 *      running sequence and no waiting sequence holding device blocks other
 *      than the head, so the head does not fit an otherwise empty cache —
 *      the one case the core may report as "no progress possible". (A step
 *      that schedules nothing but preempts is not a stall: the core just
 *      steps again.)
 *
 * A sequence preempted in this step is never re-admitted in the same step:
 * the core resets num_computed only after schedule() returns.
 * Sequences added with num_computed > 0 skip acquire_prefix on their first
 * admission.
 * A waiting head that acquire_prefix'ed but then did not fit gives its
 * prefix references back (cache->free) and asks again next step.
 *
 * Threads: every op is [engine] (loom/scheduler.h); no locks, no globals.
 * schedule() never allocates: add() reserves room in every queue.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/scheduler.h"
#include "sched_queue.h"

#define CONT_WHO "scheduler.continuous"

/* ------------------------------------------------------------ configuration */

enum { CONT_POLICY_FCFS = 0, CONT_POLICY_PRIORITY = 1 };
enum { CONT_PREEMPT_RECOMPUTE = 0, CONT_PREEMPT_SWAP = 1 };

/* Filled by the host from cont_params; borrowed during create() only. */
typedef struct cont_config {
    int64_t max_num_seqs;       /* sequences holding a running slot, at most     */
    int64_t max_batched_tokens; /* tokens computed per step, at most             */
    bool chunked_prefill;       /* split prompts across steps                    */
    int64_t policy;             /* CONT_POLICY_*                                 */
    int64_t preemption;         /* CONT_PREEMPT_*                                */
    int64_t max_prefill_seqs;   /* prefilling sequences per step; 0 = no limit   */
} cont_config;

static const char *const cont_policy_choices[] = {"fcfs", "priority", NULL};
static const char *const cont_preempt_choices[] = {"recompute", "swap", NULL};

static const loom_param cont_params[] = {
    {"max_num_seqs", LOOM_PARAM_INT, offsetof(cont_config, max_num_seqs), "256", 1, 1 << 20,
     NULL, "most sequences running at once (each holds KV blocks)"},
    {"max_batched_tokens", LOOM_PARAM_INT, offsetof(cont_config, max_batched_tokens), "2048", 1,
     1 << 30, NULL, "most tokens computed in one step: prefill chunks + decodes + drafts"},
    {"chunked_prefill", LOOM_PARAM_BOOL, offsetof(cont_config, chunked_prefill), "true", 1, 0,
     NULL, "split long prompts across steps, filling the tokens left after decodes"},
    {"policy", LOOM_PARAM_ENUM, offsetof(cont_config, policy), "fcfs", 1, 0, cont_policy_choices,
     "fcfs: arrival order; priority: (priority asc, arrival asc), preempts lower priority"},
    {"preemption", LOOM_PARAM_ENUM, offsetof(cont_config, preemption), "recompute", 1, 0,
     cont_preempt_choices,
     "recompute: free blocks, prefill again later; swap: move blocks to host (else recompute)"},
    {"max_prefill_seqs", LOOM_PARAM_INT, offsetof(cont_config, max_prefill_seqs), "0", 0,
     1 << 20, NULL, "most sequences prefilling in one step; 0 = no limit"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* ------------------------------------------------------------------- state */

/* What the scheduler remembers of one sequence. */
typedef struct cont_seq {
    loom_seq_id id;
    int32_t priority;        /* lower first (priority policy)                    */
    double arrival;          /* seconds, core clock                              */
    uint64_t order;          /* add() counter: breaks ties in arrival            */
    bool needs_prefix;       /* acquire_prefix before the next admission         */
    bool holds_blocks;       /* waiting, yet holds device blocks (forked child)   */
    int64_t scheduled_step;  /* step of its last entry; -1 none                  */
    int64_t preempted_step;  /* step it was last preempted; -1 never             */
} cont_seq;

/* A queue kept sorted in policy order; capacity is reserved in add() so that
 * moving a sequence between queues during schedule() never allocates. */
typedef struct cont_queue {
    cont_seq *v;
    int32_t n, cap;
} cont_queue;

typedef struct cont_sched {
    const loom_host *host;   /* borrowed; outlives the instance                  */
    cont_config cfg;
    cont_queue waiting;      /* not admitted, or preempted by recompute          */
    cont_queue running;      /* hold a slot and device blocks                    */
    cont_queue swapped;      /* blocks on the host                               */
    uint64_t next_order;
    int64_t step;            /* schedule() calls so far                          */
    int64_t num_preemptions;
} cont_sched;

/* What one schedule() call carries between its phases. */
typedef struct cont_step {
    cont_sched *s;
    const loom_sched_env *env;
    loom_sched_output *out;
    loom_error *err;
    int32_t budget;          /* tokens left this step                            */
    int32_t num_prefills;    /* prefill entries emitted this step                */
    bool preempted;          /* someone was preempted this step                  */
} cont_step;

/* ----------------------------------------------------------------- helpers */

static int cont_cmp(const cont_sched *s, const cont_seq *a, const cont_seq *b) {
    if (s->cfg.policy == CONT_POLICY_PRIORITY && a->priority != b->priority)
        return a->priority < b->priority ? -1 : 1;
    if (a->arrival != b->arrival) return a->arrival < b->arrival ? -1 : 1;
    if (a->order != b->order) return a->order < b->order ? -1 : 1;
    return 0;
}

static int cont_cmp_any(const void *ctx, const void *a, const void *b) {
    return cont_cmp(ctx, a, b);
}

static loom_status cont_queue_reserve(cont_sched *s, cont_queue *q, int32_t want, loom_error *err) {
    return sq_reserve(s->host, CONT_WHO, (void **)&q->v, &q->cap, q->n, want, sizeof *q->v, err);
}

/* Insert in policy order (after equals); capacity must be reserved. Returns
 * the index it landed at. */
static int32_t cont_queue_insert(const cont_sched *s, cont_queue *q, const cont_seq *x) {
    return sq_insert(q->v, &q->n, x, sizeof *x, cont_cmp_any, s);
}

static void cont_queue_remove(cont_queue *q, int32_t i) { sq_remove(q->v, &q->n, i, sizeof q->v[0]); }

static int32_t cont_queue_find(const cont_queue *q, loom_seq_id id) {
    for (int32_t i = 0; i < q->n; i++)
        if (q->v[i].id == id) return i;
    return -1;
}

static int32_t cont_num_draft(const loom_seq_info *v) {
    if (v->struct_size < offsetof(loom_seq_info, num_draft) + sizeof v->num_draft) return 0;
    return v->num_draft > 0 ? v->num_draft : 0;
}

/* A prefill (or recompute) has more left than one decode with its drafts. */
static bool cont_is_prefill(const loom_seq_info *v, int32_t computed) {
    return v->num_tokens - computed > 1 + cont_num_draft(v);
}

static bool cont_prefill_allowed(const cont_step *st) {
    int64_t cap = st->s->cfg.max_prefill_seqs;
    return cap <= 0 || st->num_prefills < cap;
}

static int32_t cont_min(int32_t a, int32_t b) { return a < b ? a : b; }

/* Copy a cache error into the caller's error, naming the sequence. */
static loom_status cont_cache_fail(const cont_step *st, loom_status rc, const char *what,
                                   loom_seq_id id, const loom_error *cerr) {
    return st->s->host->error(st->s->host->ctx, st->err, rc,
                              CONT_WHO ": cache %s for sequence %lld failed: %s", what,
                              (long long)id, cerr->message[0] ? cerr->message : "(no message)");
}

static loom_status cont_emit(cont_step *st, cont_seq *r, int32_t computed, int32_t n,
                             bool prefill) {
    loom_sched_output *out = st->out;
    if (out->num_scheduled >= out->capacity)
        return st->s->host->error(st->s->host->ctx, st->err, LOOM_ERR_INTERNAL,
                                  CONT_WHO ": more entries than output capacity %d",
                                  out->capacity);
    out->scheduled[out->num_scheduled++] = (loom_sched_entry){r->id, computed, n};
    st->budget -= n;
    if (prefill) st->num_prefills++;
    r->scheduled_step = st->s->step;
    return LOOM_OK;
}

/* Take back the entry of `r` emitted earlier in this step. */
static void cont_unschedule(cont_step *st, cont_seq *r) {
    loom_sched_output *out = st->out;
    for (int32_t k = 0; k < out->num_scheduled; k++) {
        if (out->scheduled[k].seq != r->id) continue;
        loom_sched_entry e = out->scheduled[k];
        const loom_seq_info *v = st->env->get_seq(st->env->ctx, r->id);
        if (v && cont_is_prefill(v, e.num_computed) && st->num_prefills > 0) st->num_prefills--;
        st->budget += e.num_tokens;
        memmove(&out->scheduled[k], &out->scheduled[k + 1],
                (size_t)(out->num_scheduled - k - 1) * sizeof e);
        out->num_scheduled--;
        break;
    }
    r->scheduled_step = -1;
}

/* Preempt running[j]: swap it out (swap mode and allow_swap, when the cache
 * can) or free its blocks for recompute; report it. */
static loom_status cont_preempt(cont_step *st, int32_t j, bool allow_swap) {
    cont_sched *s = st->s;
    const loom_sched_env *env = st->env;
    loom_sched_output *out = st->out;
    cont_seq victim = s->running.v[j];
    loom_preempt_mode mode = LOOM_PREEMPT_RECOMPUTE;

    if (out->num_preempted >= out->capacity)
        return s->host->error(s->host->ctx, st->err, LOOM_ERR_INTERNAL,
                              CONT_WHO ": more preemptions than output capacity %d",
                              out->capacity);
    if (victim.scheduled_step == s->step) cont_unschedule(st, &s->running.v[j]);
    if (allow_swap && s->cfg.preemption == CONT_PREEMPT_SWAP && env->cache->swap_out) {
        loom_error cerr = {0};
        loom_status rc = env->cache->swap_out(env->cache_self, victim.id, &cerr);
        if (rc == LOOM_OK)
            mode = LOOM_PREEMPT_SWAP;
        else if (rc != LOOM_ERR_NO_SPACE && rc != LOOM_ERR_UNSUPPORTED)
            return cont_cache_fail(st, rc, "swap_out", victim.id, &cerr);
    }
    if (mode == LOOM_PREEMPT_RECOMPUTE) {
        env->cache->free(env->cache_self, victim.id);
        victim.needs_prefix = true;
    }
    victim.holds_blocks = false;
    cont_queue_remove(&s->running, j);
    victim.scheduled_step = -1;
    victim.preempted_step = s->step;
    cont_queue_insert(s, mode == LOOM_PREEMPT_SWAP ? &s->swapped : &s->waiting, &victim);

    out->preempted[out->num_preempted] = victim.id;
    out->preempt_mode[out->num_preempted] = mode;
    out->num_preempted++;
    s->num_preemptions++;
    st->preempted = true;
    s->host->metric_add(s->host->ctx, "sched.preemptions", 1);
    return LOOM_OK;
}

/* Index of the last running sequence without an entry this step, -1 none. */
static int32_t cont_last_unscheduled(const cont_sched *s) {
    for (int32_t j = s->running.n - 1; j >= 0; j--)
        if (s->running.v[j].scheduled_step != s->step) return j;
    return -1;
}

/* Priority mode: make room for `head` by preempting the last running
 * sequence when its priority value is strictly larger. *done says whether
 * anyone was preempted (then the caller retries). */
static loom_status cont_priority_preempt(cont_step *st, const cont_seq *head, bool *done) {
    cont_sched *s = st->s;
    *done = false;
    if (s->cfg.policy != CONT_POLICY_PRIORITY || s->running.n == 0) return LOOM_OK;
    int32_t j = s->running.n - 1;
    if (s->running.v[j].priority <= head->priority) return LOOM_OK;
    loom_status rc = cont_preempt(st, j, true);
    if (rc == LOOM_OK) *done = true;
    return rc;
}

/* Index of the youngest waiting sequence that holds blocks, other than
 * `except`; -1 none. The queue is in policy order: search from its end. */
static int32_t cont_youngest_holder(const cont_sched *s, loom_seq_id except) {
    for (int32_t j = s->waiting.n - 1; j >= 0; j--)
        if (s->waiting.v[j].holds_blocks && s->waiting.v[j].id != except) return j;
    return -1;
}

/* Header step 5: free waiting[j]'s blocks (recompute) and report it; it
 * keeps its place in the queue. */
static loom_status cont_free_holder(cont_step *st, int32_t j) {
    cont_sched *s = st->s;
    loom_sched_output *out = st->out;
    cont_seq *w = &s->waiting.v[j];
    if (out->num_preempted >= out->capacity)
        return s->host->error(s->host->ctx, st->err, LOOM_ERR_INTERNAL,
                              CONT_WHO ": more preemptions than output capacity %d",
                              out->capacity);
    st->env->cache->free(st->env->cache_self, w->id);
    w->holds_blocks = false;
    w->needs_prefix = true;
    w->preempted_step = s->step;
    out->preempted[out->num_preempted] = w->id;
    out->preempt_mode[out->num_preempted] = LOOM_PREEMPT_RECOMPUTE;
    out->num_preempted++;
    s->num_preemptions++;
    st->preempted = true;
    s->host->metric_add(s->host->ctx, "sched.preemptions", 1);
    return LOOM_OK;
}

/* Header step 5, admission: `head` got NO_SPACE. If this step has no entry
 * yet, free the youngest waiting sequence behind it that holds blocks; *done
 * says whether anyone was freed (then the caller retries). */
static loom_status cont_free_waiting_holder(cont_step *st, const cont_seq *head, bool *done) {
    *done = false;
    if (st->out->num_scheduled > 0) return LOOM_OK;
    int32_t j = cont_youngest_holder(st->s, head->id);
    if (j < 0) return LOOM_OK;
    *done = true;
    return cont_free_holder(st, j);
}

/* Drop a queued sequence the core no longer knows (it should have called
 * remove(); say so rather than stall on it). */
static void cont_drop_unknown(cont_sched *s, cont_queue *q, int32_t i, const char *queue) {
    s->host->log(s->host->ctx, LOOM_LOG_WARN, CONT_WHO,
                 "sequence %lld in the %s queue is unknown to the core (finished without "
                 "remove()?); dropping it", (long long)q->v[i].id, queue);
    cont_queue_remove(q, i);
}

/* ------------------------------------------------------------ step phases */

/* Phase 1: one pass over RUNNING, decodes or prefill chunks. */
static loom_status cont_pass_running(cont_step *st, bool decodes) {
    cont_sched *s = st->s;
    const loom_sched_env *env = st->env;
    int32_t i = 0;
    while (i < s->running.n && st->budget > 0) {
        cont_seq *r = &s->running.v[i];
        if (r->scheduled_step == s->step) {
            i++;
            continue;
        }
        const loom_seq_info *v = env->get_seq(env->ctx, r->id);
        if (!v) {
            cont_drop_unknown(s, &s->running, i, "running");
            continue;
        }
        int32_t need = v->num_tokens - v->num_computed;
        bool prefill = cont_is_prefill(v, v->num_computed);
        /* need <= 0: caught up, waiting on the core's sample; nothing to run. */
        if (need <= 0 || prefill == decodes || (prefill && !cont_prefill_allowed(st))) {
            i++;
            continue;
        }
        int32_t n = cont_min(need, st->budget);
        loom_error cerr = {0};
        loom_status rc = env->cache->allocate(env->cache_self, v, v->num_computed + n, &cerr);
        if (rc == LOOM_ERR_NO_SPACE) {
            /* Some unscheduled sequence at or after i always exists: r.
             * A waiting sequence holding blocks that is younger still
             * gives them up first (header step 5). */
            int32_t victim = cont_last_unscheduled(s);
            int32_t w = cont_youngest_holder(s, -1);
            if (w >= 0 && cont_cmp(s, &s->waiting.v[w], &s->running.v[victim]) > 0)
                rc = cont_free_holder(st, w);
            else
                rc = cont_preempt(st, victim, true);
            if (rc != LOOM_OK) return rc;
            continue; /* retry r, or (victim == i) the next one, now at i */
        }
        if (rc != LOOM_OK) return cont_cache_fail(st, rc, "allocate", r->id, &cerr);
        rc = cont_emit(st, r, v->num_computed, n, prefill);
        if (rc != LOOM_OK) return rc;
        i++;
    }
    return LOOM_OK;
}

/* Phase 3, swapped head: swap in and allocate its next tokens. *stop when
 * it does not fit. */
static loom_status cont_try_swap_in(cont_step *st, bool *stop) {
    cont_sched *s = st->s;
    const loom_sched_env *env = st->env;
    cont_seq head = s->swapped.v[0];
    *stop = true;

    const loom_seq_info *v = env->get_seq(env->ctx, head.id);
    if (!v) {
        cont_drop_unknown(s, &s->swapped, 0, "swapped");
        *stop = false;
        return LOOM_OK;
    }
    int32_t need = v->num_tokens - v->num_computed;
    bool prefill = cont_is_prefill(v, v->num_computed);
    if (prefill && !cont_prefill_allowed(st)) return LOOM_OK;
    int32_t n = need > 0 ? cont_min(need, st->budget) : 0;

    loom_error cerr = {0};
    if (!env->cache->swap_in || !env->cache->swap_out)
        return st->s->host->error(st->s->host->ctx, st->err, LOOM_ERR_INVALID,
                                  CONT_WHO ": sequence %lld is swapped out but the cache manager "
                                           "has no swap_in/swap_out", (long long)head.id);
    loom_status rc = env->cache->swap_in(env->cache_self, head.id, &cerr);
    if (rc == LOOM_ERR_NO_SPACE) {
        bool done = false;
        rc = cont_priority_preempt(st, &head, &done);
        if (rc == LOOM_OK && !done) rc = cont_free_waiting_holder(st, &head, &done);
        *stop = !done;
        return rc;
    }
    if (rc != LOOM_OK) return cont_cache_fail(st, rc, "swap_in", head.id, &cerr);
    if (n > 0) {
        rc = env->cache->allocate(env->cache_self, v, v->num_computed + n, &cerr);
        if (rc == LOOM_ERR_NO_SPACE) {
            /* Undo the swap-in; the blocks just left the host, so this only
             * fails if the cache cannot swap at all: then recompute. */
            loom_status rc2 = env->cache->swap_out(env->cache_self, head.id, &cerr);
            if (rc2 == LOOM_OK) {
                bool done = false;
                rc2 = cont_free_waiting_holder(st, &head, &done);
                *stop = !done;
                return rc2;
            }
            if (rc2 != LOOM_ERR_NO_SPACE && rc2 != LOOM_ERR_UNSUPPORTED)
                return cont_cache_fail(st, rc2, "swap_out", head.id, &cerr);
            /* Recompute it: move it to RUNNING so cont_preempt can report it. */
            cont_queue_remove(&s->swapped, 0);
            int32_t j = cont_queue_insert(s, &s->running, &head);
            return cont_preempt(st, j, false);
        }
        if (rc != LOOM_OK) return cont_cache_fail(st, rc, "allocate", head.id, &cerr);
    }
    cont_queue_remove(&s->swapped, 0);
    int32_t j = cont_queue_insert(s, &s->running, &head);
    if (n > 0) {
        rc = cont_emit(st, &s->running.v[j], v->num_computed, n, prefill);
        if (rc != LOOM_OK) return rc;
    }
    *stop = false;
    return LOOM_OK;
}

/* Phase 3, waiting head: acquire its cached prefix, allocate its first
 * chunk, admit it. *stop when it does not fit. */
static loom_status cont_try_admit(cont_step *st, bool *stop) {
    cont_sched *s = st->s;
    const loom_sched_env *env = st->env;
    cont_seq head = s->waiting.v[0];
    *stop = true;

    const loom_seq_info *v = env->get_seq(env->ctx, head.id);
    if (!v) {
        cont_drop_unknown(s, &s->waiting, 0, "waiting");
        *stop = false;
        return LOOM_OK;
    }
    if (v->num_tokens <= 0) {
        s->host->log(s->host->ctx, LOOM_LOG_WARN, CONT_WHO,
                     "sequence %lld has no tokens; leaving it waiting", (long long)head.id);
        return LOOM_OK;
    }
    int32_t start = head.needs_prefix ? env->cache->acquire_prefix(env->cache_self, v)
                                      : v->num_computed;
    if (start < 0) start = 0;
    if (start > v->num_tokens - 1) start = v->num_tokens - 1; /* always compute one */
    int32_t need = v->num_tokens - start;
    bool prefill = cont_is_prefill(v, start);
    int32_t n = 0;
    if (!prefill || cont_prefill_allowed(st)) {
        if (s->cfg.chunked_prefill || need <= st->budget)
            n = cont_min(need, st->budget);
        else if (need > s->cfg.max_batched_tokens && st->budget == s->cfg.max_batched_tokens)
            n = st->budget; /* never fits: runs alone, in budget-sized chunks */
    }
    loom_error cerr = {0};
    loom_status rc = n > 0 ? env->cache->allocate(env->cache_self, v, start + n, &cerr)
                           : LOOM_ERR_NO_SPACE;
    if (rc != LOOM_OK) {
        /* Give back the prefix references taken above; it is retried later. */
        if (head.needs_prefix) env->cache->free(env->cache_self, head.id);
        if (rc != LOOM_ERR_NO_SPACE) return cont_cache_fail(st, rc, "allocate", head.id, &cerr);
        if (n == 0) return LOOM_OK; /* token budget, not memory */
        bool done = false;
        rc = cont_priority_preempt(st, &head, &done);
        if (rc == LOOM_OK && !done) rc = cont_free_waiting_holder(st, &head, &done);
        *stop = !done;
        return rc;
    }
    head.needs_prefix = false;
    head.holds_blocks = false;
    cont_queue_remove(&s->waiting, 0);
    int32_t j = cont_queue_insert(s, &s->running, &head);
    rc = cont_emit(st, &s->running.v[j], start, n, prefill);
    if (rc != LOOM_OK) return rc;
    *stop = false;
    return LOOM_OK;
}

/* Phase 3: swapped and waiting heads in merged policy order. */
static loom_status cont_admit(cont_step *st) {
    cont_sched *s = st->s;
    for (;;) {
        if (s->swapped.n == 0 && s->waiting.n == 0) break;
        bool swapped = s->swapped.n > 0 &&
                       (s->waiting.n == 0 || cont_cmp(s, &s->swapped.v[0], &s->waiting.v[0]) <= 0);
        cont_seq head = swapped ? s->swapped.v[0] : s->waiting.v[0];
        if (head.preempted_step == s->step || st->budget <= 0) break;
        loom_status rc;
        bool stop;
        if (s->running.n >= s->cfg.max_num_seqs) {
            bool done = false;
            rc = cont_priority_preempt(st, &head, &done);
            if (rc != LOOM_OK) return rc;
            if (!done) break;
            continue;
        }
        rc = swapped ? cont_try_swap_in(st, &stop) : cont_try_admit(st, &stop);
        if (rc != LOOM_OK) return rc;
        if (stop) break;
    }
    return LOOM_OK;
}

/* ---------------------------------------------------------------- the ops */

static loom_status cont_create(const loom_host *host, const void *config, void **self,
                               loom_error *err) {
    if (!host || !self) return LOOM_ERR_INVALID;
    *self = NULL;
    if (!config)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           CONT_WHO ": create() needs a config (the host fills it from the "
                                    "parameter table)");
    const cont_config *cfg = config;
    loom_status st = sq_check_limits(host, CONT_WHO, cfg->max_num_seqs, cfg->max_batched_tokens, err);
    if (st != LOOM_OK) return st;
    if (cfg->policy != CONT_POLICY_FCFS && cfg->policy != CONT_POLICY_PRIORITY)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           CONT_WHO ": policy index %lld is not fcfs (0) or priority (1)",
                           (long long)cfg->policy);
    if (cfg->preemption != CONT_PREEMPT_RECOMPUTE && cfg->preemption != CONT_PREEMPT_SWAP)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           CONT_WHO ": preemption index %lld is not recompute (0) or swap (1)",
                           (long long)cfg->preemption);
    if (cfg->max_prefill_seqs < 0)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           CONT_WHO ": max_prefill_seqs = %lld, must be >= 0 (0 = no limit)",
                           (long long)cfg->max_prefill_seqs);
    cont_sched *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, CONT_WHO ": out of memory");
    s->host = host;
    s->cfg = *cfg;
    *self = s;
    return LOOM_OK;
}

static void cont_destroy(void *self) {
    cont_sched *s = self;
    if (!s) return;
    const loom_host *h = s->host;
    h->free(h->ctx, s->waiting.v);
    h->free(h->ctx, s->running.v);
    h->free(h->ctx, s->swapped.v);
    h->free(h->ctx, s);
}

static bool cont_known(const cont_sched *s, loom_seq_id id) {
    return cont_queue_find(&s->waiting, id) >= 0 || cont_queue_find(&s->running, id) >= 0 ||
           cont_queue_find(&s->swapped, id) >= 0;
}

static loom_status cont_add(void *self, const loom_seq_info *seq, loom_error *err) {
    cont_sched *s = self;
    const loom_host *h = s->host;
    if (!seq)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, CONT_WHO ": add() got a NULL sequence");
    if (seq->num_tokens < 1)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": sequence %lld has %d tokens; a prompt needs at least one",
                        (long long)seq->id, seq->num_tokens);
    if (isnan(seq->arrival_time))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": sequence %lld has a NaN arrival time", (long long)seq->id);
    if (cont_known(s, seq->id))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": sequence %lld was already added", (long long)seq->id);
    /* Every queue can hold every live sequence: schedule() never allocates. */
    int32_t total = s->waiting.n + s->running.n + s->swapped.n + 1;
    loom_status rc;
    if ((rc = cont_queue_reserve(s, &s->waiting, total, err)) != LOOM_OK) return rc;
    if ((rc = cont_queue_reserve(s, &s->running, total, err)) != LOOM_OK) return rc;
    if ((rc = cont_queue_reserve(s, &s->swapped, total, err)) != LOOM_OK) return rc;
    cont_seq x = {
        .id = seq->id,
        .priority = seq->priority,
        .arrival = seq->arrival_time,
        .order = s->next_order++,
        .needs_prefix = seq->num_computed <= 0,
        .holds_blocks = seq->num_computed > 0,
        .scheduled_step = -1,
        .preempted_step = -1,
    };
    cont_queue_insert(s, &s->waiting, &x);
    return LOOM_OK;
}

static void cont_remove(void *self, loom_seq_id id) {
    cont_sched *s = self;
    cont_queue *qs[] = {&s->running, &s->waiting, &s->swapped};
    for (size_t k = 0; k < sizeof qs / sizeof qs[0]; k++) {
        int32_t i = cont_queue_find(qs[k], id);
        if (i >= 0) {
            cont_queue_remove(qs[k], i);
            return;
        }
    }
}

static void cont_publish(const cont_sched *s, const cont_step *st) {
    const loom_host *h = s->host;
    h->metric_set(h->ctx, "sched.waiting", s->waiting.n);
    h->metric_set(h->ctx, "sched.running", s->running.n);
    h->metric_set(h->ctx, "sched.swapped", s->swapped.n);
    h->metric_set(h->ctx, "sched.batch_seqs", st->out->num_scheduled);
    h->metric_set(h->ctx, "sched.batch_tokens", (double)(s->cfg.max_batched_tokens - st->budget));
}

static loom_status cont_schedule(void *self, const loom_sched_env *env, loom_sched_output *out,
                                 loom_error *err) {
    cont_sched *s = self;
    const loom_host *h = s->host;
    if (!env || env->struct_size < offsetof(loom_sched_env, now) + sizeof env->now ||
        !env->get_seq || !env->cache || !env->cache->allocate || !env->cache->free ||
        !env->cache->acquire_prefix)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": schedule() needs an env with get_seq and a cache manager "
                                 "(acquire_prefix, allocate, free)");
    if (!out || !out->scheduled || !out->preempted || !out->preempt_mode)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": schedule() needs an output with its three arrays");
    int32_t live = s->waiting.n + s->running.n + s->swapped.n;
    if (out->capacity < live)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        CONT_WHO ": output capacity %d is below the %d live sequences",
                        out->capacity, live);
    out->num_scheduled = 0;
    out->num_preempted = 0;
    s->step++;
    cont_step st = {
        .s = s, .env = env, .out = out, .err = err,
        .budget = (int32_t)s->cfg.max_batched_tokens,
    };
    loom_status rc = cont_pass_running(&st, true);
    if (rc == LOOM_OK) rc = cont_pass_running(&st, false);
    if (rc == LOOM_OK && !st.preempted) rc = cont_admit(&st);
    cont_publish(s, &st);
    if (rc == LOOM_OK && err) err->code = LOOM_OK;
    return rc;
}

static void cont_stats(void *self, loom_sched_stats *out) {
    const cont_sched *s = self;
    if (!out) return;
    loom_sched_stats st = {
        .struct_size = sizeof st,
        .num_waiting = s->waiting.n,
        .num_running = s->running.n,
        .num_swapped = s->swapped.n,
        .num_preemptions = s->num_preemptions,
    };
    /* The caller's struct may be older (smaller): write what it has room for. */
    uint32_t n = out->struct_size && out->struct_size < sizeof st ? out->struct_size : sizeof st;
    memcpy(out, &st, n);
    out->struct_size = n;
}

/* --------------------------------------------------------------- the entry */

static const loom_scheduler_ops cont_ops = {
    .struct_size = sizeof(loom_scheduler_ops),
    .create = cont_create,
    .destroy = cont_destroy,
    .add = cont_add,
    .remove = cont_remove,
    .schedule = cont_schedule,
    .stats = cont_stats,
};

static const loom_component cont_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_SCHEDULER,
    .name = "continuous",
    .summary = "iteration-level batching: chunked prefill, fcfs/priority, recompute/swap "
               "preemption",
    .ops = &cont_ops,
    .params = cont_params,
    .config_size = sizeof(cont_config),
}};

static const loom_plugin_desc cont_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-scheduler-continuous",
    .version = "0.1.0",
    .num_components = 1,
    .components = cont_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &cont_desc; }
