/*
 * conformance/sched_sim.c — see sched_sim.h. Plays the core's part of the
 * step loop with a check at every contract point of loom/scheduler.h.
 */
#include "sched_sim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_GUARD 4                  /* entries past `capacity` that must stay untouched */
#define SIM_CANARY_SEQ ((loom_seq_id)0x5eed5eed5eedLL)

static bool sim_fail(loom_sched_sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool sim_fail(loom_sched_sim *s, const char *fmt, ...) {
    if (s->failed) return false;
    s->failed = true;
    char msg[sizeof s->why - 32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(s->why, sizeof s->why, "step %lld: %s", (long long)s->step, msg);
    return false;
}

#define SIM_ENSURE(s, cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) return sim_fail((s), __VA_ARGS__);                                            \
    } while (0)

uint64_t loom_sched_sim_rand(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const loom_seq_info *sim_get_seq(void *ctx, loom_seq_id id) {
    loom_sched_sim *s = ctx;
    if (id < 0 || id >= s->n || s->seqs[id].state != LOOM_SIM_LIVE) return NULL;
    return &s->seqs[id].info;
}

static bool sim_push(loom_sched_sim *s, loom_sim_seq *q, int32_t tok) {
    SIM_ENSURE(s, q->info.num_tokens < q->cap, "sequence %lld outgrew its %d-token buffer (a kit bug)",
               (long long)q->info.id, q->cap);
    q->tokens[q->info.num_tokens++] = tok;
    return true;
}

/* Prompts share nothing across requests unless a workload wants prefix
 * hits; a request's samples share their prompt and then differ. */
static int32_t sim_token(const loom_sim_seq *q, int32_t pos) {
    if (pos < q->req.shared_prefix) return (pos * 13 + 5) % 32000;
    return (int32_t)((q->info.id * 7919 + pos * 31) % 32000);
}

/* ------------------------------------------------------------------ setup */

static int32_t sim_samples(const loom_sim_req *r) { return r->n > 1 ? r->n : 1; }

static bool sim_init_seq(loom_sched_sim *s, int32_t idx, const loom_sim_req *r, int32_t parent) {
    loom_sim_seq *q = &s->seqs[idx];
    q->req = *r;
    q->parent = parent;
    q->cap = r->total + r->drafts + 2;
    q->tokens = calloc((size_t)q->cap, sizeof *q->tokens);
    if (!q->tokens) return sim_fail(s, "out of memory");
    q->info = (loom_seq_info){
        .struct_size = sizeof q->info,
        .id = idx,
        .request_id = parent >= 0 ? parent : idx,
        .priority = r->priority,
        .arrival_time = (double)r->arrive + r->arrival_offset,
        .num_prompt_tokens = r->prompt,
        .max_total_tokens = r->total,
        .tokens = q->tokens,
    };
    if (parent >= 0) return true; /* its prompt is copied when it is forked */
    for (int32_t p = 0; p < r->prompt; p++)
        if (!sim_push(s, q, sim_token(q, p))) return false;
    return true;
}

static bool sim_alloc_out(loom_sched_sim *s) {
    size_t n = (size_t)(s->n ? s->n : 1) + SIM_GUARD;
    s->out = (loom_sched_output){
        .struct_size = sizeof s->out,
        .capacity = s->n ? s->n : 1,
        .scheduled = calloc(n, sizeof(loom_sched_entry)),
        .preempted = calloc(n, sizeof(loom_seq_id)),
        .preempt_mode = calloc(n, sizeof(loom_preempt_mode)),
    };
    return s->out.scheduled && s->out.preempted && s->out.preempt_mode;
}

static bool sim_setup_cache(loom_sched_sim *s, const loom_sched_sim_opts *o) {
    if (o->cache_ops) {
        s->cops = o->cache_ops;
        s->cself = o->cache_self;
    } else {
        s->fc = loom_ref_cache_new(o->block_size ? o->block_size : 16, o->num_blocks ? o->num_blocks : 1024,
                                   o->num_cpu_blocks, s->n);
        if (!s->fc) return false;
        s->fc->prefix_tokens = o->prefix_tokens;
        if (o->no_swap) s->fc->swap_supported = false;
        s->cops = &loom_ref_cache_ops;
        s->cself = s->fc;
    }
    loom_cache_stats cs = {.struct_size = sizeof cs};
    if (s->cops->stats) s->cops->stats(s->cself, &cs);
    s->block_size = cs.block_size > 0 ? cs.block_size : 16;
    s->num_blocks = cs.num_blocks > 0 ? cs.num_blocks : s->cops->num_free_blocks(s->cself);
    return true;
}

loom_sched_sim *loom_sched_sim_new(const loom_sched_sim_opts *o, const loom_sim_req *reqs, int32_t n, char *why,
                                   size_t cap) {
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(reqs[i].prompt >= 1 && reqs[i].total > reqs[i].prompt && reqs[i].arrive >= 1)) {
            snprintf(why, cap, "bad request %d", i);
            return NULL;
        }
        total += sim_samples(&reqs[i]);
    }
    loom_sched_sim *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->ops = o->ops;
    s->sched = o->sched;
    s->max_num_seqs = o->max_num_seqs;
    s->max_batched_tokens = o->max_batched_tokens;
    s->n = total;
    s->nreq = n;
    s->rng = o->seed ? o->seed : 1;
    s->seqs = calloc((size_t)(total ? total : 1), sizeof *s->seqs);
    if (!s->seqs || !sim_alloc_out(s) || !sim_setup_cache(s, o)) goto oom;
    /* Requests' first samples at 0..n-1 (so a request's index is its id),
     * the other samples after them. */
    int32_t next = n;
    for (int32_t i = 0; i < n; i++) {
        if (!sim_init_seq(s, i, &reqs[i], -1)) goto oom;
        if (sim_samples(&reqs[i]) > 1) s->seqs[i].children = next;
        for (int32_t k = 1; k < sim_samples(&reqs[i]); k++)
            if (!sim_init_seq(s, next++, &reqs[i], i)) goto oom;
    }
    return s;
oom:
    snprintf(why, cap, "out of memory simulating %d sequences", total);
    loom_sched_sim_free(s);
    return NULL;
}

void loom_sched_sim_free(loom_sched_sim *s) {
    if (!s) return;
    for (int32_t i = 0; s->seqs && i < s->n; i++) free(s->seqs[i].tokens);
    free(s->seqs);
    free(s->out.scheduled);
    free(s->out.preempted);
    free(s->out.preempt_mode);
    loom_ref_cache_free(s->fc);
    free(s);
}

const loom_sched_entry *loom_sched_sim_entry(const loom_sched_sim *s, loom_seq_id id) {
    for (int32_t k = 0; k < s->out.num_scheduled && k < s->out.capacity; k++)
        if (s->out.scheduled[k].seq == id) return &s->out.scheduled[k];
    return NULL;
}

/* ------------------------------------------------------------ the core's part */

static int32_t sim_blocks(const loom_sched_sim *s, loom_seq_id id) {
    return s->cops->block_table(s->cself, id, NULL, 0);
}

static void sim_end_seq(loom_sched_sim *s, loom_sim_seq *q, int state) {
    s->ops->remove(s->sched, q->info.id);
    s->cops->free(s->cself, q->info.id);
    q->state = state;
    q->done_step = s->step;
    s->live--;
}

/* Pending samples of request `parent` that will never be forked now. */
static void sim_abort_pending(loom_sched_sim *s, const loom_sim_seq *parent) {
    for (int32_t k = 1; parent->children && k < sim_samples(&parent->req); k++) {
        loom_sim_seq *c = &s->seqs[parent->children + k - 1];
        if (c->state == LOOM_SIM_PENDING) c->state = LOOM_SIM_ABORTED;
    }
}

static bool sim_sample(loom_sched_sim *s, loom_sim_seq *q);

/* The prompt of `p` has logits: fork samples 1..n-1 in the cache (sharing
 * p's blocks) and add each with p's num_computed, as the core does. */
static bool sim_fork_samples(loom_sched_sim *s, loom_sim_seq *p) {
    p->forked = true;
    for (int32_t k = 1; k < sim_samples(&p->req); k++) {
        loom_sim_seq *c = &s->seqs[p->children + k - 1];
        for (int32_t i = 0; i < p->req.prompt; i++)
            if (!sim_push(s, c, p->tokens[i])) return false;
        c->info.num_computed = p->info.num_computed;
        loom_error err = {0};
        loom_status st = s->cops->fork(s->cself, p->info.id, c->info.id, &err);
        if (st != LOOM_OK) { /* the core fails the request's sample; here it is dropped */
            c->state = LOOM_SIM_ABORTED;
            continue;
        }
        st = s->ops->add(s->sched, &c->info, &err);
        SIM_ENSURE(s, st == LOOM_OK, "add(forked sample %lld) failed: %s", (long long)c->info.id, err.message);
        c->state = LOOM_SIM_LIVE;
        c->fresh = false;
        s->live++;
        s->forks++;
        if (!sim_sample(s, c)) return false;
    }
    return true;
}

/* q caught up (num_computed == num_tokens): verify drafts, fork the
 * request's samples after its prompt, sample a token, finish at the
 * length, else propose new drafts. */
static bool sim_sample(loom_sched_sim *s, loom_sim_seq *q) {
    loom_seq_info *v = &q->info;
    if (v->num_draft > 0) {
        int32_t accepted = (int32_t)(loom_sched_sim_rand(&s->rng) % (uint64_t)(v->num_draft + 1));
        int32_t keep = v->num_tokens - v->num_draft + accepted;
        v->num_tokens = keep;
        v->num_computed = keep;
        v->num_draft = 0;
        s->cops->truncate(s->cself, v, keep);
    }
    if (q->children && !q->forked && v->num_tokens == q->req.prompt && !sim_fork_samples(s, q)) return false;
    if (!sim_push(s, q, sim_token(q, v->num_tokens))) return false; /* the sampled (bonus) token */
    if (v->num_tokens >= q->req.total) {
        SIM_ENSURE(s, v->num_tokens == q->req.total, "seq %lld overshot its length", (long long)v->id);
        q->final_len = v->num_tokens;
        q->finishes++;
        sim_end_seq(s, q, LOOM_SIM_DONE);
        return true;
    }
    int32_t k = q->req.drafts;
    if (k > q->req.total - 1 - v->num_tokens) k = q->req.total - 1 - v->num_tokens;
    for (int32_t d = 0; d < k; d++)
        if (!sim_push(s, q, sim_token(q, v->num_tokens) ^ 1)) return false;
    v->num_draft = k > 0 ? k : 0;
    return true;
}

/* Arrivals and aborts of this step. */
static bool sim_arrivals(loom_sched_sim *s) {
    loom_error err = {0};
    for (int32_t i = 0; i < s->nreq; i++) {
        loom_sim_seq *q = &s->seqs[i];
        if (q->state != LOOM_SIM_PENDING || q->req.arrive > s->step) continue;
        loom_status st = s->ops->add(s->sched, &q->info, &err);
        SIM_ENSURE(s, st == LOOM_OK, "add(seq %d) failed: %s", i, err.message);
        q->state = LOOM_SIM_LIVE;
        q->fresh = true;
        s->live++;
    }
    for (int32_t i = 0; i < s->n; i++) {
        loom_sim_seq *q = &s->seqs[i];
        if (q->state == LOOM_SIM_LIVE && q->req.abort_at == s->step) {
            sim_end_seq(s, q, LOOM_SIM_ABORTED);
            if (q->parent < 0) sim_abort_pending(s, q);
        }
    }
    return true;
}

/* Call schedule() as the core does: zeroed counts, capacity = the live
 * sequences, guard entries past it. */
static bool sim_schedule(loom_sched_sim *s) {
    loom_sched_output *out = &s->out;
    out->capacity = s->live > 0 ? s->live : 1;
    out->num_scheduled = out->num_preempted = 0;
    for (int32_t g = 0; g < SIM_GUARD; g++) {
        out->scheduled[out->capacity + g] = (loom_sched_entry){SIM_CANARY_SEQ, -7, -7};
        out->preempted[out->capacity + g] = SIM_CANARY_SEQ;
    }
    loom_sched_env env = {.struct_size = sizeof env, .ctx = s, .get_seq = sim_get_seq, .cache = s->cops,
                          .cache_self = s->cself, .now = (double)s->step};
    loom_error err = {0};
    loom_status rc = s->ops->schedule(s->sched, &env, out, &err);
    SIM_ENSURE(s, rc == LOOM_OK, "schedule() failed (status %d): %s", (int)rc, err.message);
    for (int32_t g = 0; g < SIM_GUARD; g++)
        SIM_ENSURE(s, out->scheduled[out->capacity + g].seq == SIM_CANARY_SEQ &&
                          out->preempted[out->capacity + g] == SIM_CANARY_SEQ,
                   "schedule() wrote past the output's capacity of %d", out->capacity);
    SIM_ENSURE(s, out->num_scheduled >= 0 && out->num_scheduled <= out->capacity && out->num_preempted >= 0 &&
                      out->num_preempted <= out->capacity,
               "schedule() reports %d entries and %d preemptions with capacity %d", out->num_scheduled,
               out->num_preempted, out->capacity);
    /* The core runs the cache's queued copies/swaps before the forward. */
    loom_block_op ops[64];
    for (int32_t got; (got = s->cops->take_block_ops(s->cself, ops, 64)) > 0;) s->block_ops += got;
    return true;
}

static bool sim_check_entry(loom_sched_sim *s, const loom_sched_entry *e) {
    SIM_ENSURE(s, e->seq >= 0 && e->seq < s->n && s->seqs[e->seq].state == LOOM_SIM_LIVE,
               "entry for unknown or finished sequence %lld", (long long)e->seq);
    loom_sim_seq *q = &s->seqs[e->seq];
    SIM_ENSURE(s, q->seen_step != s->step, "sequence %lld scheduled twice", (long long)e->seq);
    q->seen_step = s->step;
    SIM_ENSURE(s, e->num_tokens > 0, "seq %lld gets %d tokens", (long long)e->seq, e->num_tokens);
    SIM_ENSURE(s, e->num_computed >= 0 && e->num_computed + e->num_tokens <= q->info.num_tokens,
               "seq %lld entry [%d, +%d) outside its %d tokens", (long long)e->seq, e->num_computed, e->num_tokens,
               q->info.num_tokens);
    if (q->fresh) {
        SIM_ENSURE(s, e->num_computed % s->block_size == 0 && e->num_computed < q->info.num_tokens,
                   "fresh seq %lld starts at %d (not a block-aligned prefix)", (long long)e->seq, e->num_computed);
        if (s->fc)
            SIM_ENSURE(s, e->num_computed == s->fc->seqs[e->seq].prefix,
                       "fresh seq %lld starts at %d, but acquire_prefix reported %d", (long long)e->seq,
                       e->num_computed, s->fc->seqs[e->seq].prefix);
    } else {
        SIM_ENSURE(s, e->num_computed == q->info.num_computed, "seq %lld entry starts at %d, the core has %d computed",
                   (long long)e->seq, e->num_computed, q->info.num_computed);
    }
    SIM_ENSURE(s, sim_blocks(s, e->seq) * s->block_size >= e->num_computed + e->num_tokens,
               "seq %lld scheduled to %d tokens but holds %d blocks of %d (allocate first)", (long long)e->seq,
               e->num_computed + e->num_tokens, sim_blocks(s, e->seq), s->block_size);
    if (s->fc)
        SIM_ENSURE(s, !s->fc->seqs[e->seq].swapped, "seq %lld scheduled while swapped out", (long long)e->seq);
    return true;
}

static bool sim_check_entries(loom_sched_sim *s) {
    const loom_sched_output *out = &s->out;
    SIM_ENSURE(s, !s->max_num_seqs || out->num_scheduled <= s->max_num_seqs, "%d entries > max_num_seqs %d",
               out->num_scheduled, s->max_num_seqs);
    int64_t tokens = 0;
    for (int32_t k = 0; k < out->num_scheduled; k++) {
        if (!sim_check_entry(s, &out->scheduled[k])) return false;
        tokens += out->scheduled[k].num_tokens;
    }
    SIM_ENSURE(s, !s->max_batched_tokens || tokens <= s->max_batched_tokens, "%lld tokens > max_batched_tokens %d",
               (long long)tokens, s->max_batched_tokens);
    if (tokens > s->max_step_tokens) s->max_step_tokens = tokens;
    if (out->num_scheduled > s->max_step_seqs) s->max_step_seqs = out->num_scheduled;
    return true;
}

static bool sim_check_preempted(loom_sched_sim *s) {
    const loom_sched_output *out = &s->out;
    for (int32_t k = 0; k < out->num_preempted; k++) {
        loom_seq_id id = out->preempted[k];
        SIM_ENSURE(s, id >= 0 && id < s->n && s->seqs[id].state == LOOM_SIM_LIVE,
                   "preempted unknown or finished sequence %lld", (long long)id);
        loom_sim_seq *q = &s->seqs[id];
        SIM_ENSURE(s, q->seen_step != s->step, "seq %lld both scheduled and preempted (or preempted twice)",
                   (long long)id);
        q->seen_step = s->step;
        SIM_ENSURE(s, sim_blocks(s, id) == 0, "preempted seq %lld still holds %d device blocks (release them "
                   "through env->cache before reporting it)", (long long)id, sim_blocks(s, id));
        q->preempts++;
        if (out->preempt_mode[k] == LOOM_PREEMPT_RECOMPUTE) {
            if (s->fc)
                SIM_ENSURE(s, !s->fc->seqs[id].swapped && !s->fc->seqs[id].cpu_blocks,
                           "seq %lld reported RECOMPUTE but is swapped out", (long long)id);
            q->info.num_computed = 0;
            q->info.num_tokens -= q->info.num_draft; /* the core drops its drafts */
            q->info.num_draft = 0;
            q->fresh = true;
            s->preempt_recompute++;
        } else {
            SIM_ENSURE(s, out->preempt_mode[k] == LOOM_PREEMPT_SWAP, "seq %lld preempted with unknown mode %d",
                       (long long)id, (int)out->preempt_mode[k]);
            if (s->fc)
                SIM_ENSURE(s, s->fc->seqs[id].swapped, "seq %lld reported SWAP but was not swapped out",
                           (long long)id);
            s->preempt_swap++;
        }
    }
    return true;
}

/* As the core does after the forward pass. */
static bool sim_apply(loom_sched_sim *s) {
    for (int32_t k = 0; k < s->out.num_scheduled; k++) {
        const loom_sched_entry *e = &s->out.scheduled[k];
        loom_sim_seq *q = &s->seqs[e->seq];
        q->info.num_computed = e->num_computed + e->num_tokens;
        q->fresh = false;
        if (!q->first_step) {
            q->first_step = s->step;
            q->first_rank = ++s->ranks;
        }
        if (q->info.num_computed == q->info.num_tokens && !sim_sample(s, q)) return false;
    }
    return true;
}

static bool sim_after(loom_sched_sim *s, int32_t live_before) {
    if (s->ops->stats) {
        loom_sched_stats st = {.struct_size = sizeof st};
        s->ops->stats(s->sched, &st);
        SIM_ENSURE(s, st.num_waiting + st.num_running + st.num_swapped == s->live,
                   "stats() counts %d waiting + %d running + %d swapped sequences, %d are live", st.num_waiting,
                   st.num_running, st.num_swapped, s->live);
        if (st.num_swapped > s->max_swapped_seen) s->max_swapped_seen = st.num_swapped;
    }
    if (live_before > 0 && s->out.num_scheduled == 0) s->empty_steps++;
    SIM_ENSURE(s, !(live_before > 0 && s->out.num_scheduled == 0 && s->out.num_preempted == 0),
               "scheduled and preempted nothing while %d sequences wait and the cache has %d of %d blocks free: a "
               "stall (every request fits the cache alone)",
               live_before, s->cops->num_free_blocks(s->cself), s->num_blocks);
    if (s->fc) SIM_ENSURE(s, s->fc->violations == 0, "cache misuse: %s", s->fc->violation);
    return true;
}

bool loom_sched_sim_step(loom_sched_sim *s, int32_t *entries) {
    if (entries) *entries = 0;
    if (s->failed) return false;
    s->step++;
    if (s->where) snprintf(s->where, 256, "simulated step %lld", (long long)s->step);
    if (!sim_arrivals(s)) return false;
    int32_t live_before = s->live;
    if (!sim_schedule(s) || !sim_check_entries(s) || !sim_check_preempted(s)) return false;
    int32_t n = s->out.num_scheduled;
    if (!sim_apply(s) || !sim_after(s, live_before)) return false;
    if (entries) *entries = n;
    return true;
}

static bool sim_all_done(const loom_sched_sim *s) {
    for (int32_t i = 0; i < s->n; i++)
        if (s->seqs[i].state == LOOM_SIM_PENDING || s->seqs[i].state == LOOM_SIM_LIVE) return false;
    return true;
}

static bool sim_end_state(loom_sched_sim *s) {
    for (int32_t i = 0; i < s->n; i++) {
        const loom_sim_seq *q = &s->seqs[i];
        if (q->state == LOOM_SIM_ABORTED) {
            SIM_ENSURE(s, q->finishes == 0, "aborted seq %d also finished", i);
            continue;
        }
        SIM_ENSURE(s, q->finishes == 1, "seq %d finished %d times", i, q->finishes);
        SIM_ENSURE(s, q->final_len == q->req.total, "seq %d ended with %d tokens, wanted %d", i, q->final_len,
                   q->req.total);
    }
    if (s->ops->stats) {
        loom_sched_stats st = {.struct_size = sizeof st};
        s->ops->stats(s->sched, &st);
        SIM_ENSURE(s, st.num_waiting == 0 && st.num_running == 0 && st.num_swapped == 0,
                   "queues not empty at the end: %d waiting, %d running, %d swapped", st.num_waiting,
                   st.num_running, st.num_swapped);
    }
    int32_t nfree = s->cops->num_free_blocks(s->cself);
    SIM_ENSURE(s, nfree == s->num_blocks, "the cache has %d of %d blocks free at the end", nfree, s->num_blocks);
    if (s->fc) {
        SIM_ENSURE(s, s->fc->free_cpu_blocks == s->fc->num_cpu_blocks, "host blocks leaked: %d of %d free",
                   s->fc->free_cpu_blocks, s->fc->num_cpu_blocks);
        SIM_ENSURE(s, s->fc->violations == 0, "cache misuse: %s", s->fc->violation);
    }
    return true;
}

bool loom_sched_sim_run(loom_sched_sim *s, int64_t max_steps) {
    while (!sim_all_done(s)) {
        SIM_ENSURE(s, s->step < max_steps, "no completion within %lld steps (%d live): a livelock",
                   (long long)max_steps, s->live);
        if (!loom_sched_sim_step(s, NULL)) return false;
    }
    return sim_end_state(s);
}
