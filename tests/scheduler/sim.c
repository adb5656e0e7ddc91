/*
 * tests/scheduler/sim.c — see sim.h. Plays the core's part of the step loop
 * with Criterion asserts at every contract point.
 */
#include "sim.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "plugin/registry.h"

/* ---------------------------------------------------------------- plugins */

const char *sched_plugin_path(const char *name) {
    const char *var = !strcmp(name, "continuous") ? "LOOM_SCHED_CONTINUOUS_SO"
                      : !strcmp(name, "static")   ? "LOOM_SCHED_STATIC_SO"
                                                  : NULL;
    cr_assert(var, "no such scheduler plugin in this tree: %s", name);
    const char *path = getenv(var);
    cr_assert(path && *path, "%s is not set (meson test sets it to the built .so)", var);
    return path;
}

void plugin_open(const char *path, loom_kind kind, sched_plugin *p) {
    memset(p, 0, sizeof *p);
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(p->dl, "dlopen %s: %s", path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(p->dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(entry, "%s exports no %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = entry();
    cr_assert(d && d->abi_major == LOOM_ABI_MAJOR && d->build_signature == LOOM_BUILD_SIGNATURE,
              "%s: bad descriptor", path);
    for (uint32_t i = 0; i < d->num_components; i++)
        if (d->components[i].kind == kind) p->comp = &d->components[i];
    cr_assert(p->comp, "%s has no component of kind %s", path, loom_kind_name(kind));
    p->ops = p->comp->ops;
}

void plugin_close(sched_plugin *p) {
    if (p->dl) dlclose(p->dl);
    memset(p, 0, sizeof *p);
}

static const loom_param *param_find(const loom_component *c, const char *key, size_t len) {
    for (const loom_param *p = c->params; p && p->key; p++)
        if (strlen(p->key) == len && !strncmp(p->key, key, len)) return p;
    return NULL;
}

static void param_set(const loom_param *p, void *cfg, const char *val) {
    char *at = (char *)cfg + p->offset;
    switch (p->type) {
    case LOOM_PARAM_BOOL: {
        bool b = !strcmp(val, "true") || !strcmp(val, "1");
        cr_assert(b || !strcmp(val, "false") || !strcmp(val, "0"), "%s: bad bool %s", p->key, val);
        memcpy(at, &b, sizeof b);
        break;
    }
    case LOOM_PARAM_INT: {
        char *end;
        int64_t v = strtoll(val, &end, 10);
        cr_assert(*val && !*end, "%s: bad int %s", p->key, val);
        memcpy(at, &v, sizeof v);
        break;
    }
    case LOOM_PARAM_FLOAT: {
        double v = strtod(val, NULL);
        memcpy(at, &v, sizeof v);
        break;
    }
    case LOOM_PARAM_STRING:
        snprintf(at, LOOM_PARAM_STRING_MAX, "%s", val);
        break;
    case LOOM_PARAM_ENUM: {
        int64_t idx = -1;
        for (int64_t i = 0; p->choices && p->choices[i]; i++)
            if (!strcmp(p->choices[i], val)) idx = i;
        cr_assert(idx >= 0, "%s: %s is not one of its choices", p->key, val);
        memcpy(at, &idx, sizeof idx);
        break;
    }
    }
}

void *config_build(const loom_component *comp, const char *overrides) {
    void *cfg = calloc(1, comp->config_size ? comp->config_size : 1);
    cr_assert(cfg);
    for (const loom_param *p = comp->params; p && p->key; p++) {
        cr_assert(p->default_value, "%s.%s has no default", comp->name, p->key);
        param_set(p, cfg, p->default_value);
    }
    const char *s = overrides ? overrides : "";
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        cr_assert(eq, "override '%.*s' has no '='", (int)len, s);
        const loom_param *p = param_find(comp, s, (size_t)(eq - s));
        cr_assert(p, "%s has no parameter '%.*s'", comp->name, (int)(eq - s), s);
        char val[128];
        snprintf(val, sizeof val, "%.*s", (int)(len - (size_t)(eq - s) - 1), eq + 1);
        param_set(p, cfg, val);
        s += len + (comma ? 1 : 0);
    }
    return cfg;
}

int64_t config_get_int(const loom_component *comp, const void *cfg, const char *key) {
    const loom_param *p = param_find(comp, key, strlen(key));
    cr_assert(p, "%s has no parameter %s", comp->name, key);
    const char *at = (const char *)cfg + p->offset;
    if (p->type == LOOM_PARAM_BOOL) {
        bool b;
        memcpy(&b, at, sizeof b);
        return b;
    }
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* ------------------------------------------------------------- simulation */

uint64_t sim_rand(uint64_t *x) {
    /* splitmix64: good enough, and the same everywhere. */
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const loom_seq_info *sim_get_seq(void *ctx, loom_seq_id id) {
    sim *s = ctx;
    if (id < 0 || id >= s->n || s->seqs[id].state != SIM_LIVE) return NULL;
    return &s->seqs[id].info;
}

static void sim_push(sim_seq *q, int32_t tok) {
    cr_assert(q->info.num_tokens < q->cap, "sequence %lld outgrew its %d-token buffer",
              (long long)q->info.id, q->cap);
    q->tokens[q->info.num_tokens++] = tok;
}

/* Prompts share nothing across sequences unless a test wants prefix hits. */
static int32_t sim_token(const sim_seq *q, int32_t pos) {
    if (pos < q->req.shared_prefix) return (pos * 13 + 5) % 32000;
    return (int32_t)((q->info.id * 7919 + pos * 31) % 32000);
}

sim *sim_new(const sim_opts *o, const sim_req *reqs, int32_t n) {
    sim *s = calloc(1, sizeof *s);
    cr_assert(s);
    const loom_host *host = o->host ? o->host : fake_host();
    s->own_host = !o->host;
    plugin_open(sched_plugin_path(o->plugin), LOOM_KIND_SCHEDULER, &s->plug);
    s->cfg = config_build(s->plug.comp, o->params);
    s->max_num_seqs = (int32_t)config_get_int(s->plug.comp, s->cfg, "max_num_seqs");
    s->max_batched_tokens = (int32_t)config_get_int(s->plug.comp, s->cfg, "max_batched_tokens");
    loom_error err = {0};
    cr_assert_eq(s->plug.ops->create(host, s->cfg, &s->sched, &err), LOOM_OK, "create: %s",
                 err.message);
    if (o->cache_ops) {
        s->cops = o->cache_ops;
        s->cself = o->cache_self;
    } else {
        s->fc = fake_cache_new(o->block_size ? o->block_size : 16,
                               o->num_blocks ? o->num_blocks : 1024, o->num_cpu_blocks, n);
        cr_assert(s->fc);
        s->fc->prefix_tokens = o->prefix_tokens;
        if (o->no_swap) s->fc->swap_supported = false;
        s->cops = &fake_cache_ops;
        s->cself = s->fc;
    }
    loom_cache_stats cs = {.struct_size = sizeof cs};
    s->cops->stats(s->cself, &cs);
    s->block_size = cs.block_size;
    s->num_blocks = cs.num_blocks;

    s->n = n;
    s->seqs = calloc((size_t)(n ? n : 1), sizeof *s->seqs);
    cr_assert(s->seqs);
    for (int32_t i = 0; i < n; i++) {
        sim_seq *q = &s->seqs[i];
        q->req = reqs[i];
        cr_assert(q->req.prompt >= 1 && q->req.total > q->req.prompt && q->req.arrive >= 1,
                  "bad request %d", i);
        q->cap = q->req.total + q->req.drafts + 2;
        q->tokens = calloc((size_t)q->cap, sizeof *q->tokens);
        cr_assert(q->tokens);
        q->info = (loom_seq_info){
            .struct_size = sizeof q->info,
            .id = i,
            .request_id = i,
            .priority = q->req.priority,
            .arrival_time = (double)q->req.arrive + q->req.arrival_offset,
            .num_prompt_tokens = q->req.prompt,
            .max_total_tokens = q->req.total,
            .tokens = q->tokens,
        };
        for (int32_t p = 0; p < q->req.prompt; p++) sim_push(q, sim_token(q, p));
    }
    s->rng = o->seed ? o->seed : 1;
    s->out = (loom_sched_output){
        .struct_size = sizeof s->out,
        .capacity = n ? n : 1,
        .scheduled = calloc((size_t)(n ? n : 1), sizeof(loom_sched_entry)),
        .preempted = calloc((size_t)(n ? n : 1), sizeof(loom_seq_id)),
        .preempt_mode = calloc((size_t)(n ? n : 1), sizeof(loom_preempt_mode)),
    };
    cr_assert(s->out.scheduled && s->out.preempted && s->out.preempt_mode);
    return s;
}

void sim_free(sim *s) {
    if (!s) return;
    s->plug.ops->destroy(s->sched);
    if (s->own_host)
        cr_expect_eq(fake_host_live_allocs(), 0, "scheduler leaked %ld host allocations",
                     fake_host_live_allocs());
    plugin_close(&s->plug);
    for (int32_t i = 0; i < s->n; i++) free(s->seqs[i].tokens);
    free(s->seqs);
    free(s->cfg);
    free(s->out.scheduled);
    free(s->out.preempted);
    free(s->out.preempt_mode);
    fake_cache_free(s->fc);
    free(s);
}

const loom_sched_entry *sim_entry(const sim *s, loom_seq_id id) {
    for (int32_t k = 0; k < s->out.num_scheduled; k++)
        if (s->out.scheduled[k].seq == id) return &s->out.scheduled[k];
    return NULL;
}

static int32_t sim_blocks(const sim *s, loom_seq_id id) {
    return s->cops->block_table(s->cself, id, NULL, 0);
}

static void sim_end_seq(sim *s, sim_seq *q, int state) {
    s->plug.ops->remove(s->sched, q->info.id);
    s->cops->free(s->cself, q->info.id);
    q->state = state;
    q->done_step = s->step;
    s->live--;
}

/* q caught up (num_computed == num_tokens): verify drafts, sample a token,
 * finish at the length, else propose new drafts. */
static void sim_sample(sim *s, sim_seq *q) {
    loom_seq_info *v = &q->info;
    if (v->num_draft > 0) {
        int32_t accepted = (int32_t)(sim_rand(&s->rng) % (uint64_t)(v->num_draft + 1));
        int32_t keep = v->num_tokens - v->num_draft + accepted;
        v->num_tokens = keep;
        v->num_computed = keep;
        v->num_draft = 0;
        s->cops->truncate(s->cself, v, keep);
    }
    sim_push(q, sim_token(q, v->num_tokens)); /* the sampled (bonus) token */
    if (v->num_tokens >= q->req.total) {
        cr_assert_eq(v->num_tokens, q->req.total, "seq %lld overshot its length", (long long)v->id);
        q->final_len = v->num_tokens;
        q->finishes++;
        sim_end_seq(s, q, SIM_DONE);
        return;
    }
    int32_t k = q->req.drafts;
    if (k > q->req.total - 1 - v->num_tokens) k = q->req.total - 1 - v->num_tokens;
    for (int32_t d = 0; d < k; d++) sim_push(q, sim_token(q, v->num_tokens) ^ 1);
    v->num_draft = k > 0 ? k : 0;
}

int32_t sim_step(sim *s) {
    s->step++;
    const int64_t step = s->step;
    loom_error err = {0};
    for (int32_t i = 0; i < s->n; i++) {
        sim_seq *q = &s->seqs[i];
        if (q->state == SIM_PENDING && q->req.arrive <= step) {
            cr_assert_eq(s->plug.ops->add(s->sched, &q->info, &err), LOOM_OK, "add %d: %s", i,
                         err.message);
            q->state = SIM_LIVE;
            q->fresh = true;
            s->live++;
        }
    }
    for (int32_t i = 0; i < s->n; i++) {
        sim_seq *q = &s->seqs[i];
        if (q->state == SIM_LIVE && q->req.abort_at == step) sim_end_seq(s, q, SIM_ABORTED);
    }
    int32_t live_before = s->live;

    loom_sched_env env = {
        .struct_size = sizeof env,
        .ctx = s,
        .get_seq = sim_get_seq,
        .cache = s->cops,
        .cache_self = s->cself,
        .now = (double)step,
    };
    loom_sched_output *out = &s->out;
    loom_status rc = s->plug.ops->schedule(s->sched, &env, out, &err);
    cr_assert_eq(rc, LOOM_OK, "step %lld: schedule failed: %s", (long long)step, err.message);

    /* The core runs the cache's queued copies/swaps before the forward. */
    loom_block_op ops[64];
    for (int32_t got; (got = s->cops->take_block_ops(s->cself, ops, 64)) > 0;)
        s->block_ops += got;

    /* ---- check the output against the pre-step state */
    cr_assert(out->num_scheduled >= 0 && out->num_scheduled <= s->max_num_seqs,
              "step %lld: %d entries > max_num_seqs %d", (long long)step, out->num_scheduled,
              s->max_num_seqs);
    int64_t tokens = 0;
    for (int32_t k = 0; k < out->num_scheduled; k++) {
        const loom_sched_entry *e = &out->scheduled[k];
        cr_assert(e->seq >= 0 && e->seq < s->n && s->seqs[e->seq].state == SIM_LIVE,
                  "step %lld: entry for unknown or dead sequence %lld", (long long)step,
                  (long long)e->seq);
        sim_seq *q = &s->seqs[e->seq];
        cr_assert_neq(q->seen_step, step, "step %lld: sequence %lld scheduled twice",
                      (long long)step, (long long)e->seq);
        q->seen_step = step;
        cr_assert(e->num_tokens > 0, "step %lld: seq %lld gets %d tokens", (long long)step,
                  (long long)e->seq, e->num_tokens);
        cr_assert(e->num_computed >= 0 && e->num_computed + e->num_tokens <= q->info.num_tokens,
                  "step %lld: seq %lld entry [%d, +%d) outside its %d tokens", (long long)step,
                  (long long)e->seq, e->num_computed, e->num_tokens, q->info.num_tokens);
        if (q->fresh) {
            cr_assert(e->num_computed % s->block_size == 0 && e->num_computed < q->info.num_tokens,
                      "step %lld: fresh seq %lld starts at %d (not a block-aligned prefix)",
                      (long long)step, (long long)e->seq, e->num_computed);
            if (s->fc)
                cr_assert_eq(e->num_computed, s->fc->seqs[e->seq].prefix,
                             "step %lld: fresh seq %lld starts at %d, cache reported prefix %d",
                             (long long)step, (long long)e->seq, e->num_computed,
                             s->fc->seqs[e->seq].prefix);
        } else {
            cr_assert_eq(e->num_computed, q->info.num_computed,
                         "step %lld: seq %lld entry starts at %d, core has %d computed",
                         (long long)step, (long long)e->seq, e->num_computed,
                         q->info.num_computed);
        }
        cr_assert(sim_blocks(s, e->seq) * s->block_size >= e->num_computed + e->num_tokens,
                  "step %lld: seq %lld scheduled to %d tokens but holds %d blocks of %d",
                  (long long)step, (long long)e->seq, e->num_computed + e->num_tokens,
                  sim_blocks(s, e->seq), s->block_size);
        if (s->fc) cr_assert(!s->fc->seqs[e->seq].swapped, "seq %lld scheduled while swapped",
                             (long long)e->seq);
        tokens += e->num_tokens;
    }
    cr_assert(tokens <= s->max_batched_tokens, "step %lld: %lld tokens > max_batched_tokens %d",
              (long long)step, (long long)tokens, s->max_batched_tokens);
    if (tokens > s->max_step_tokens) s->max_step_tokens = tokens;
    if (out->num_scheduled > s->max_step_seqs) s->max_step_seqs = out->num_scheduled;

    for (int32_t k = 0; k < out->num_preempted; k++) {
        loom_seq_id id = out->preempted[k];
        cr_assert(id >= 0 && id < s->n && s->seqs[id].state == SIM_LIVE,
                  "step %lld: preempted unknown sequence %lld", (long long)step, (long long)id);
        sim_seq *q = &s->seqs[id];
        cr_assert_neq(q->seen_step, step, "step %lld: seq %lld both scheduled and preempted",
                      (long long)step, (long long)id);
        q->seen_step = step;
        cr_assert_eq(sim_blocks(s, id), 0, "step %lld: preempted seq %lld still holds blocks",
                     (long long)step, (long long)id);
        q->preempts++;
        if (out->preempt_mode[k] == LOOM_PREEMPT_RECOMPUTE) {
            if (s->fc) cr_assert(!s->fc->seqs[id].swapped && !s->fc->seqs[id].cpu_blocks);
            q->info.num_computed = 0;
            q->fresh = true;
            s->preempt_recompute++;
        } else {
            cr_assert_eq(out->preempt_mode[k], LOOM_PREEMPT_SWAP);
            if (s->fc) cr_assert(s->fc->seqs[id].swapped, "seq %lld reported SWAP, not swapped",
                                 (long long)id);
            s->preempt_swap++;
        }
    }

    /* ---- apply, as the core does after the forward pass */
    for (int32_t k = 0; k < out->num_scheduled; k++) {
        const loom_sched_entry *e = &out->scheduled[k];
        sim_seq *q = &s->seqs[e->seq];
        q->info.num_computed = e->num_computed + e->num_tokens;
        q->fresh = false;
        if (!q->first_step) {
            q->first_step = step;
            q->first_rank = ++s->ranks;
        }
        if (q->info.num_computed == q->info.num_tokens) sim_sample(s, q);
    }

    loom_sched_stats st = {.struct_size = sizeof st};
    s->plug.ops->stats(s->sched, &st);
    cr_assert_eq(st.num_waiting + st.num_running + st.num_swapped, s->live,
                 "step %lld: scheduler holds %d+%d+%d sequences, %d are live", (long long)step,
                 st.num_waiting, st.num_running, st.num_swapped, s->live);
    if (st.num_swapped > s->max_swapped_seen) s->max_swapped_seen = st.num_swapped;
    if (live_before > 0 && out->num_scheduled == 0) s->empty_steps++;
    if (s->fc)
        cr_assert_eq(s->fc->violations, 0, "step %lld: cache misuse: %s", (long long)step,
                     s->fc->violation);
    return out->num_scheduled;
}

static bool sim_all_done(const sim *s) {
    for (int32_t i = 0; i < s->n; i++)
        if (s->seqs[i].state == SIM_PENDING || s->seqs[i].state == SIM_LIVE) return false;
    return true;
}

int64_t sim_run(sim *s, int64_t max_steps) {
    while (!sim_all_done(s)) {
        cr_assert(s->step < max_steps, "no completion within %lld steps (%d live)",
                  (long long)max_steps, s->live);
        sim_step(s);
    }
    for (int32_t i = 0; i < s->n; i++) {
        const sim_seq *q = &s->seqs[i];
        if (q->state == SIM_ABORTED) {
            cr_assert_eq(q->finishes, 0);
            continue;
        }
        cr_assert_eq(q->finishes, 1, "seq %d finished %d times", i, q->finishes);
        cr_assert_eq(q->final_len, q->req.total, "seq %d ended with %d tokens, wanted %d", i,
                     q->final_len, q->req.total);
    }
    loom_sched_stats st = {.struct_size = sizeof st};
    s->plug.ops->stats(s->sched, &st);
    cr_assert(st.num_waiting == 0 && st.num_running == 0 && st.num_swapped == 0,
              "queues not empty at the end: %d/%d/%d", st.num_waiting, st.num_running,
              st.num_swapped);
    cr_assert_eq(s->cops->num_free_blocks(s->cself), s->num_blocks,
                 "cache has %d of %d blocks free at the end", s->cops->num_free_blocks(s->cself),
                 s->num_blocks);
    if (s->fc) {
        cr_assert_eq(s->fc->free_cpu_blocks, s->fc->num_cpu_blocks, "host blocks leaked");
        cr_assert_eq(s->fc->violations, 0, "cache misuse: %s", s->fc->violation);
    }
    return s->step;
}
