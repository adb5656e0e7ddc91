/*
 * core/engine/step.c — the step loop: schedule -> build the batch ->
 * forward -> sample / verify -> update.
 *
 * The engine owns requests, sequences, the model and the tokenizer; every
 * decision is a plugin's. One step:
 *   drain the inbox (requests.c) -> drafts (speculate.c) -> the scheduler
 *   picks {seq: tokens}, allocating slots through the cache manager and
 *   preempting on NO_SPACE (schedule) -> the cache's queued block copies
 *   and swaps run on the runner, the batch is flattened (batch.c) ->
 *   forward, whole rows or device-reduced candidates (forward) -> drafts
 *   verified, the other rows sampled (sample_step; sample.c) -> tokens
 *   appended, streamed and stop-checked (sequence.c) -> finished requests
 *   reaped.
 *
 * It refuses to be clever: no policy lives here.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "util/workers.h"
#include "util/util.h"

/* ------------------------------------------------------------ schedule */

/* What a schedule() call left to do this step. */
typedef enum sched_result { SCHED_RUN, SCHED_RETRY, SCHED_STALLED } sched_result;

/* Entry i of the scheduler's output against its sequence s: a live
 * sequence's range within its tokens (checked without int32 overflow), and
 * an entry that reaches the end of a sequence with drafts covers every one
 * of its 1 + num_draft verification rows (each gets a logits row, counted
 * back from the entry's end). */
static loom_status check_entry(const char *name, int32_t i, const loom_sched_entry *en, const loom_seq *s,
                               loom_error *err) {
    if (!s || s->finished)
        return loom_error_set(err, LOOM_ERR_INTERNAL, "scheduler '%s' entry %d names seq %lld, which is not live", name,
                              i, (long long)en->seq);
    const int32_t n = s->info.num_tokens, nd = s->info.num_draft;
    if (en->num_tokens <= 0 || en->num_computed < 0 || en->num_computed > n || en->num_tokens > n - en->num_computed)
        return loom_error_set(err, LOOM_ERR_INTERNAL,
                              "scheduler '%s' entry %d (seq %lld: num_computed %d, num_tokens %d) does not fit the "
                              "sequence's %d tokens",
                              name, i, (long long)en->seq, en->num_computed, en->num_tokens, n);
    if (nd > 0 && en->num_computed + en->num_tokens == n && en->num_tokens < 1 + nd)
        return loom_error_set(err, LOOM_ERR_INTERNAL,
                              "scheduler '%s' entry %d (seq %lld: num_computed %d, num_tokens %d) ends at the "
                              "sequence's end but covers %d of its %d verification rows (1 + %d drafts); an entry "
                              "that reaches the drafts must include them all",
                              name, i, (long long)en->seq, en->num_computed, en->num_tokens, en->num_tokens, 1 + nd,
                              nd);
    return LOOM_OK;
}

/* The scheduler's output obeys loom/scheduler.h: within capacity, every
 * entry a live sequence's uncomputed-or-recomputed range (check_entry), no
 * sequence both scheduled and preempted. */
static loom_status check_output(loom_engine *e, const loom_sched_output *out, loom_error *err) {
    const char *name = loom_pipeline_slot_get(e->pipe, LOOM_KIND_SCHEDULER)->component->name;
    if (out->num_scheduled < 0 || out->num_scheduled > out->capacity || out->num_preempted < 0 ||
        out->num_preempted > out->capacity)
        return loom_error_set(err, LOOM_ERR_INTERNAL,
                              "scheduler '%s' wrote %d entries and %d preemptions (capacity %d)", name,
                              out->num_scheduled, out->num_preempted, out->capacity);
    for (int32_t i = 0; i < out->num_scheduled; i++) {
        const loom_sched_entry *en = &out->scheduled[i];
        loom_status st = check_entry(name, i, en, loom_engine_find_seq(e, en->seq), err);
        if (st != LOOM_OK) return st;
        for (int32_t j = 0; j < out->num_preempted; j++)
            if (out->preempted[j] == en->seq)
                return loom_error_set(err, LOOM_ERR_INTERNAL,
                                      "scheduler '%s' both scheduled and preempted seq %lld; take the entry back "
                                      "before preempting (loom/scheduler.h)",
                                      name, (long long)en->seq);
    }
    return LOOM_OK;
}

/* Nothing can run and nothing was freed: the cache cannot hold even one
 * waiting sequence. End the oldest rather than hang. */
static void fail_stalled(loom_engine *e) {
    for (int32_t i = 0; i < e->num_seqs; i++) {
        loom_seq *s = e->seqs[i];
        if (s->finished) continue;
        char msg[LOOM_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "no progress possible: the KV cache (%d blocks of %d tokens) cannot hold this "
                 "sequence of %d tokens; give the cache more memory or lower engine.max_model_len",
                 e->layout.num_blocks, e->layout.block_size, s->info.num_tokens);
        engine_seq_finish(e, s, LOOM_FINISH_ERROR, msg);
        return;
    }
}

static loom_status schedule(loom_engine *e, double now, loom_sched_output *out, sched_result *res, loom_error *err) {
    /* the scheduler's arrays hold every live sequence; block-table rows are
     * sized by engine_build_batch for the sequences it schedules */
    if (engine_step_buffers(e, e->num_seqs, 1, 0) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory growing step buffers");
    *out = (loom_sched_output){.struct_size = sizeof *out, .capacity = e->sched_cap, .scheduled = e->sched_entries,
                               .preempted = e->preempted, .preempt_mode = e->preempt_modes};
    loom_sched_env env = {.struct_size = sizeof env, .ctx = e, .get_seq = engine_env_get_seq, .cache = e->cache,
                          .cache_self = e->cache_self, .now = now};
    loom_status st = e->sch->schedule(e->sch_self, &env, out, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "scheduler");
        return st;
    }
    if ((st = check_output(e, out, err)) != LOOM_OK) return st;
    for (int32_t i = 0; i < out->num_preempted; i++) {
        loom_seq *s = loom_engine_find_seq(e, out->preempted[i]);
        if (!s) continue;
        e->stats.preemptions++;
        if (out->preempt_mode[i] != LOOM_PREEMPT_RECOMPUTE) continue;
        s->info.num_computed = 0;
        if (s->info.num_draft) engine_spec_drop(e, s);
    }
    *res = out->num_scheduled > 0 ? SCHED_RUN : out->num_preempted > 0 ? SCHED_RETRY : SCHED_STALLED;
    return LOOM_OK;
}

/* ------------------------------------------------------------- forward */

/* Room for `rows` forward_topk rows of k candidates. */
static loom_status topk_reserve(loom_engine *e, int32_t rows, int32_t k, loom_error *err) {
    if (rows <= e->top_cap) return LOOM_OK;
    int32_t cap = rows > 2 * e->top_cap ? rows : 2 * e->top_cap;
    int32_t *ids = realloc(e->top_ids, (size_t)cap * (size_t)k * sizeof *ids);
    if (ids) e->top_ids = ids;
    float *vals = realloc(e->top_vals, (size_t)cap * (size_t)k * sizeof *vals);
    if (vals) e->top_vals = vals;
    float *lse = realloc(e->top_lse, (size_t)cap * sizeof *lse);
    if (lse) e->top_lse = lse;
    uint8_t *wf = realloc(e->want_full, (size_t)cap);
    if (wf) e->want_full = wf;
    loom_seq **sq = realloc(e->top_seqs, (size_t)cap * sizeof *sq);
    if (sq) e->top_seqs = sq;
    const uint32_t **ra = realloc(e->row_allowed, (size_t)cap * sizeof *ra);
    if (ra) e->row_allowed = ra;
    int32_t *mr = realloc(e->mask_rows, (size_t)cap * sizeof *mr);
    if (mr) e->mask_rows = mr;
    loom_status *ms = realloc(e->mask_status, (size_t)cap * sizeof *ms);
    if (ms) e->mask_status = ms;
    if (!ids || !vals || !lse || !wf || !sq || !ra || !mr || !ms)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for %d candidate rows", rows);
    e->top_cap = cap;
    return LOOM_OK;
}

/* Which rows come back as candidates (want_full[r] == 0) and how many per
 * row: what the most demanding candidate row needs (0 = all rows whole);
 * *masked: some candidate row is constrained (row_allowed[r] its mask,
 * filled by fill_step_masks while the forward runs). */
static loom_status plan_rows(loom_engine *e, int32_t nlog, int32_t *topk, bool *masked, loom_error *err) {
    const int32_t kmax = e->vocab < LOOM_LOGITS_TOPK_MAX ? e->vocab : LOOM_LOGITS_TOPK_MAX;
    *topk = 0;
    *masked = false;
    for (int32_t r = 0; r < nlog; r++) e->logit_seqs[r]->mask_ready = false;
    if (!e->device_sampling || nlog == 0) return LOOM_OK;
    loom_status st = topk_reserve(e, nlog, kmax, err);
    if (st != LOOM_OK) return st;
    for (int32_t r = 0; r < nlog; r++) {
        loom_seq *s = e->logit_seqs[r];
        int32_t k = engine_row_candidates(e, s, kmax);
        e->want_full[r] = k == 0;
        if (k > *topk) *topk = k;
        e->row_allowed[r] = k > 0 && s->matcher ? engine_constraint_mask_buffer(e, s) : NULL;
        if (k > 0 && s->matcher && !e->row_allowed[r])
            return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for a constraint mask");
        *masked |= e->row_allowed[r] != NULL;
    }
    return LOOM_OK;
}

/* One row's mask (a worker of fill_step_masks). Different matchers may
 * fill concurrently (loom/constraint.h); each row is its own sequence. */
static void fill_one_mask(void *ctx, int32_t i) {
    loom_engine *e = ctx;
    const int32_t r = e->mask_rows[i];
    loom_seq *s = e->logit_seqs[r];
    loom_error le = {0};
    e->mask_status[i] = engine_constraint_fill(e, s, &le);
    s->mask_ready = e->mask_status[i] == LOOM_OK;
}

/* The pool of mask workers: engine.mask_threads, 0 = the online cores
 * minus the step's own thread, at most 15. NULL: the step's thread alone. */
static struct loom_workers *mask_pool(loom_engine *e) {
    if (!e->mask_workers) {
        int32_t n = loom_pipeline_engine(e->pipe)->mask_threads;
        if (n == 0) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            n = cores > 16 ? 15 : cores > 1 ? (int32_t)cores - 1 : 0;
        }
        e->mask_workers = loom_workers_new(n); /* NULL (no memory): filled serially below */
    }
    return e->mask_workers;
}

/* [the runner's reducing thread, while the engine thread waits in
 * forward_topk] loom_logits_topk.fill_masks: the masks of the step's
 * constrained candidate rows, once, spread over the mask workers; a dead
 * end's row goes unmasked (the sample ends with the constraint's error
 * when its token is checked). */
static loom_status fill_step_masks(void *ctx, loom_error *err) {
    loom_engine *e = ctx;
    if (e->masks_filled) return LOOM_OK;
    e->masks_filled = true;
    const double t0 = loom_now();
    int32_t n = 0;
    for (int32_t r = 0; r < e->step_logits; r++)
        if (e->row_allowed[r]) e->mask_rows[n++] = r;
    struct loom_workers *w = n > 1 ? mask_pool(e) : NULL;
    if (w) loom_workers_run(w, n, fill_one_mask, e);
    else
        for (int32_t i = 0; i < n; i++) fill_one_mask(e, i);
    e->stats.constraint_mask_seconds += loom_now() - t0;
    e->stats.constraint_masks += n;
    for (int32_t i = 0; i < n; i++) {
        const int32_t r = e->mask_rows[i];
        if (e->mask_status[i] != LOOM_OK)
            return loom_error_set(err, e->mask_status[i], "constraint mask of request %lld: %s",
                                  (long long)e->logit_seqs[r]->req->id, loom_status_name(e->mask_status[i]));
        if (!e->logit_seqs[r]->mask_live) e->row_allowed[r] = NULL;
    }
    return LOOM_OK;
}

static loom_status forward(loom_engine *e, const loom_batch *batch, int32_t *topk, loom_error *err) {
    bool masked;
    const double tr = loom_now();
    loom_status st = plan_rows(e, batch->num_logits, topk, &masked, err);
    if (st != LOOM_OK) return st;
    const double t0 = loom_now();
    e->phase_seconds[ENGINE_PH_ROWS] += t0 - tr;
    if (*topk > 0) {
        e->step_logits = batch->num_logits;
        e->masks_filled = false;
        /* without masks, the ABI 2.3 size: an older runner copying the
         * struct never claims fields it did not copy */
        loom_logits_topk o = {.struct_size = masked ? sizeof o : offsetof(loom_logits_topk, allowed), .k = *topk, .top_ids = e->top_ids, .top_vals = e->top_vals,
                              .lse = e->top_lse, .want_full = e->want_full, .full = e->logits,
                              .allowed = masked ? e->row_allowed : NULL,
                              .fill_masks = masked ? fill_step_masks : NULL, .fill_ctx = e};
        st = e->run.forward_topk(e->run.self, batch, &o, err);
        if (st == LOOM_OK && masked && !e->masks_filled)
            st = loom_error_set(err, LOOM_ERR_INTERNAL, "it returned constrained candidate rows without calling "
                                "fill_masks (loom/backend.h, ABI 2.4)");
    } else {
        st = e->run.forward(e->run.self, batch, e->logits, err);
    }
    const double dt = loom_now() - t0;
    e->stats.backend_seconds += dt;
    e->phase_seconds[ENGINE_PH_FORWARD] += dt;
    if (st != LOOM_OK)
        loom_error_prefix(err, "%s '%s' forward (%d sequences, %d tokens)",
                          e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend", e->run.name, batch->num_seqs,
                          batch->num_tokens);
    return st;
}

/* After the forward: the scheduled tokens are computed; drafts whose
 * verification rows were not all computed are dropped. */
static void mark_computed(loom_engine *e, const loom_sched_output *out) {
    for (int32_t i = 0; i < out->num_scheduled; i++) {
        const loom_sched_entry *en = &out->scheduled[i];
        loom_seq *s = loom_engine_find_seq(e, en->seq);
        s->info.num_computed = en->num_computed + en->num_tokens;
        if (s->info.num_draft &&
            (s->info.num_computed < s->info.num_tokens || en->num_tokens < 1 + s->info.num_draft))
            engine_spec_drop(e, s);
    }
}

/* ------------------------------------------------------------- sample */

/* Move candidate row r to slot c (c <= r), keeping order. */
static void compact_candidate(loom_engine *e, int32_t r, int32_t c, int32_t topk) {
    if (c == r) return;
    memmove(e->top_ids + (size_t)c * topk, e->top_ids + (size_t)r * topk, (size_t)topk * sizeof(int32_t));
    memmove(e->top_vals + (size_t)c * topk, e->top_vals + (size_t)r * topk, (size_t)topk * sizeof(float));
    e->top_lse[c] = e->top_lse[r];
}

/* Verify sequences with drafts one by one; sample every other row in one
 * call for whole rows and one for candidate rows (each compacted to the
 * front of its buffer, order kept). */
static loom_status sample_step(loom_engine *e, int32_t nlog, int32_t topk, loom_error *err) {
    int32_t nwhole = 0, ncand = 0;
    loom_status st = LOOM_OK;
    for (int32_t r = 0; r < nlog && st == LOOM_OK;) {
        loom_seq *s = e->logit_seqs[r];
        const int32_t rows = 1 + s->info.num_draft;
        const bool cand = topk > 0 && !e->want_full[r];
        if (s->info.num_draft && cand) {
            engine_spec_accept_greedy(e, s, e->top_ids + (size_t)r * topk, e->top_vals + (size_t)r * topk,
                                      e->top_lse + r, topk);
        } else if (s->info.num_draft) {
            st = engine_spec_accept(e, s, e->logits + (size_t)r * e->vocab, err);
        } else if (cand) {
            compact_candidate(e, r, ncand, topk);
            e->top_seqs[ncand++] = s;
        } else {
            if (nwhole != r)
                memmove(e->logits + (size_t)nwhole * e->vocab, e->logits + (size_t)r * e->vocab,
                        (size_t)e->vocab * sizeof(float));
            e->logit_seqs[nwhole++] = s;
        }
        r += rows;
    }
    if (st == LOOM_OK && nwhole > 0) st = engine_sample_rows(e, e->logits, e->vocab, e->logit_seqs, nwhole, NULL, NULL, err);
    if (st == LOOM_OK && ncand > 0) {
        e->stats.device_sampled_rows += ncand;
        st = engine_sample_rows(e, e->top_vals, topk, e->top_seqs, ncand, e->top_ids, e->top_lse, err);
    }
    return st;
}

/* --------------------------------------------------------------- step */

/* Whether any tracked sequence is unfinished (the first one found). */
static bool any_live_seq(const loom_engine *e) {
    for (int32_t i = 0; i < e->num_seqs; i++)
        if (!e->seqs[i]->finished) return true;
    return false;
}

/* Schedule, run and sample one step of live sequences. */
static loom_status run_step(loom_engine *e, loom_error *err) {
    const double t0 = loom_now();
    loom_status st = e->spec ? engine_spec_propose(e, err) : LOOM_OK;
    loom_sched_output out;
    sched_result res = SCHED_STALLED;
    const double ts = loom_now();
    e->phase_seconds[ENGINE_PH_PROPOSE] += ts - t0;
    if (st == LOOM_OK) st = schedule(e, t0, &out, &res, err);
    const double tb = loom_now();
    e->phase_seconds[ENGINE_PH_SCHEDULE] += tb - ts;
    if (st != LOOM_OK || res == SCHED_RETRY) return st; /* retry: blocks were freed, the next schedule() differs */
    if (res == SCHED_STALLED) {
        fail_stalled(e);
        return LOOM_OK;
    }
    loom_batch batch;
    loom_step_kind kind;
    int32_t topk;
    if ((st = engine_run_block_ops(e, err)) != LOOM_OK) return st;
    if ((st = engine_build_batch(e, &out, &batch, &kind, err)) != LOOM_OK) return st;
    const double backend0 = e->stats.backend_seconds;
    e->phase_seconds[ENGINE_PH_BATCH] += loom_now() - tb;
    if ((st = forward(e, &batch, &topk, err)) != LOOM_OK) return st;
    const double tsm = loom_now();
    mark_computed(e, &out);
    if ((st = sample_step(e, batch.num_logits, topk, err)) != LOOM_OK) return st;
    const double t1 = loom_now();
    e->phase_seconds[ENGINE_PH_SAMPLE] += t1 - tsm;
    e->phase_steps++;
    double dt = t1 - t0;
    if (kind != LOOM_STEP_PREFILL) e->stats.decode_seconds += dt;
    else e->stats.prefill_seconds += dt;
    e->stats.steps++;
    e->stats.kind_steps[kind]++;
    e->stats.kind_tokens[kind] += batch.num_tokens;
    e->stats.kind_seconds[kind] += dt;
    e->stats.kind_backend_seconds[kind] += e->stats.backend_seconds - backend0;
    if (out.num_scheduled > e->stats.max_running) e->stats.max_running = out.num_scheduled;
    return LOOM_OK;
}

loom_status loom_engine_step(loom_engine *e, int32_t *active, loom_error *err) {
    const double t0 = loom_now();
    engine_drain_inbox(e, err);
    e->phase_seconds[ENGINE_PH_INBOX] += loom_now() - t0;
    loom_status st = any_live_seq(e) ? run_step(e, err) : LOOM_OK;
    if (st != LOOM_OK) return st;
    const double tr = loom_now();
    engine_reap(e);
    e->phase_seconds[ENGINE_PH_REAP] += loom_now() - tr;
    if (active) {
        pthread_mutex_lock(&e->inbox_mu);
        /* requests still waiting for a delivery wait for it, not for a
         * step; a delivered one waiting for room needs the steps that
         * retry it once others free their blocks */
        *active = e->active - engine_kv_undelivered(e);
        pthread_mutex_unlock(&e->inbox_mu);
    }
    return LOOM_OK;
}

loom_status loom_engine_run(loom_engine *e, loom_error *err) {
    int32_t active = 1;
    while (active > 0) {
        loom_status st = loom_engine_step(e, &active, err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

static void engine_stats_fill(loom_engine *e, loom_engine_stats *out) {
    *out = e->stats;
    out->struct_size = sizeof *out;
    loom_sched_stats ss = {.struct_size = sizeof ss};
    if (e->sch->stats) e->sch->stats(e->sch_self, &ss);
    out->running = ss.num_running;
    out->waiting = ss.num_waiting;
    out->swapped = ss.num_swapped;
    loom_cache_stats cs = {.struct_size = sizeof cs};
    if (e->cache->stats) e->cache->stats(e->cache_self, &cs);
    out->kv_blocks_total = cs.num_blocks;
    out->kv_blocks_used = cs.num_blocks - cs.free_blocks;
    out->kv_blocks_peak = cs.peak_used_blocks;
    out->block_size = cs.block_size;
    out->prefix_queries = cs.prefix_queries;
    out->prefix_hits = cs.prefix_hits;
    out->evictions = cs.evictions;
    out->swaps_out = cs.swaps_out;
    out->swaps_in = cs.swaps_in;
    out->kv_waiting = e->num_parked;
    out->kv_block_bytes = cs.block_bytes;
    out->kv_groups = cs.num_groups > 0 ? cs.num_groups : 1;
    out->kv_peak_seq_blocks = cs.peak_seq_blocks;
    if (e->spec && e->spec->stats) {
        loom_spec_stats sp = {.struct_size = sizeof sp};
        e->spec->stats(e->spec_self, &sp);
        out->spec_proposed = sp.proposed;
        out->spec_accepted = sp.accepted;
    }
}

void loom_engine_get_stats(loom_engine *e, loom_engine_stats *out, size_t size) {
    if (!out || size < sizeof out->struct_size) return;
    loom_engine_stats all;
    engine_stats_fill(e, &all);
    if (size > sizeof all) size = sizeof all;
    all.struct_size = (uint32_t)size;
    memcpy(out, &all, size);
}
