/*
 * conformance/cf_scheduler.c — the scheduler checks (loom/scheduler.h),
 * run in the simulated core of sched_sim.h:
 *
 *   sched.basics        add/remove bookkeeping: unknown ids ignored, an
 *                       empty step schedules nothing, stats() follow.
 *   sched.random[...]   hundreds of requests with random prompt and output
 *                       lengths, arrivals, priorities, speculative drafts,
 *                       aborts and n > 1 samples (forked after the prompt,
 *                       arriving with blocks), over a cache that runs
 *                       full: every step is checked (budgets, caps, slots,
 *                       start offsets, preemption ownership), every request
 *                       must finish exactly once with its length, no step
 *                       may stall, the cache ends all free.
 *   sched.paged         the same workload against the real `paged` cache
 *                       (found in the search path; SKIP when it is not).
 *
 * Budgets are checked against the well-known parameters max_num_seqs and
 * max_batched_tokens when the scheduler declares them; variants also set
 * policy, preemption, chunked_prefill and max_prefill_seqs where declared.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "loom/scheduler.h"
#include "plugin/registry.h"
#include "sched_sim.h"

typedef struct ss_case {
    const char *sets;        /* scheduler parameters                        */
    int32_t num_blocks;      /* reference cache: blocks of 8 tokens         */
    int32_t num_cpu_blocks;  /* reference cache host pool                   */
    int32_t prefix_tokens;   /* reference cache prefix hits                 */
    bool drafts;             /* some requests speculate                     */
    bool long_prompts;       /* some prompts longer than the token budget   */
    bool forks;              /* some requests have n > 1 samples            */
} ss_case;

static const ss_case k_cases[] = {
    {"max_num_seqs=16,max_batched_tokens=256", 128, 0, 0, false, true, true},
    {"max_num_seqs=16,max_batched_tokens=256,policy=priority,preemption=swap", 128, 48, 0, false, true, true},
    {"max_num_seqs=16,max_batched_tokens=256,chunked_prefill=false,preemption=swap", 128, 48, 0, false, true, false},
    {"max_num_seqs=16,max_batched_tokens=256,chunked_prefill=false,policy=priority,max_prefill_seqs=2", 128, 0, 32,
     false, true, true},
    {"max_num_seqs=16,max_batched_tokens=128,preemption=swap", 128, 64, 16, true, false, true},
    {"max_num_seqs=4,max_batched_tokens=64", 64, 0, 16, true, false, true},
};

/* n requests; every one fits the cache alone (<= 716 tokens with long
 * prompts, <= 320 plus drafts without; a forked request's samples may
 * have to take turns), a handful at once do not. Caller frees. */
static loom_sim_req *ss_requests(const ss_case *c, uint64_t seed, int32_t n) {
    uint64_t r = seed;
    loom_sim_req *reqs = calloc((size_t)n, sizeof *reqs);
    for (int32_t i = 0; reqs && i < n; i++) {
        int32_t prompt = 1 + (int32_t)(loom_sched_sim_rand(&r) % 200);
        bool long_prompt = c->long_prompts && loom_sched_sim_rand(&r) % 10 == 0;
        if (long_prompt) prompt = 257 + (int32_t)(loom_sched_sim_rand(&r) % 340);
        int32_t out = 1 + (int32_t)(loom_sched_sim_rand(&r) % 120);
        int64_t arrive = 1 + (int64_t)(loom_sched_sim_rand(&r) % 400);
        reqs[i] = (loom_sim_req){
            .prompt = prompt,
            .total = prompt + out,
            .priority = (int32_t)(loom_sched_sim_rand(&r) % 4),
            .arrive = arrive,
            .arrival_offset = (double)(loom_sched_sim_rand(&r) % 1000) * 1e-4,
            .abort_at = loom_sched_sim_rand(&r) % 20 == 0 ? arrive + (int64_t)(loom_sched_sim_rand(&r) % 200) : 0,
            .drafts = c->drafts && loom_sched_sim_rand(&r) % 3 == 0 ? 1 + (int32_t)(loom_sched_sim_rand(&r) % 3) : 0,
            .shared_prefix = loom_sched_sim_rand(&r) % 2 ? 48 : 0,
            .n = c->forks && !long_prompt && loom_sched_sim_rand(&r) % 8 == 0 ? 2 + (int32_t)(loom_sched_sim_rand(&r) % 3)
                                                                              : 1,
        };
    }
    return reqs;
}

static int32_t ss_budget(const cf_run *r, const void *cfg, const char *key) {
    int64_t v = 0;
    return cf_config_int(r->comp, cfg, key, &v) && v > 0 && v < (1 << 30) ? (int32_t)v : 0;
}

/* Run one workload: the scheduler from (sets), the cache given or the
 * reference one. */
static bool ss_run(cf_run *r, const ss_case *c, const loom_cache_ops *cops, void *cself, int32_t nreq) {
    char why[LOOM_ERROR_MSG_MAX];
    void *cfg = cf_config(r, c->sets, why, sizeof why);
    CF_ENSURE(r, cfg, "cannot build a config: %s", why);
    loom_sched_sim_opts o = {.ops = r->comp->ops, .max_num_seqs = ss_budget(r, cfg, "max_num_seqs"),
                             .max_batched_tokens = ss_budget(r, cfg, "max_batched_tokens"), .block_size = 8,
                             .num_blocks = c->num_blocks, .num_cpu_blocks = c->num_cpu_blocks, .prefix_tokens = c->prefix_tokens,
                             .cache_ops = cops, .cache_self = cself, .seed = r->seed ^ 0x5eed};
    free(cfg);
    if (!cf_create(r, c->sets, &o.sched)) return false;
    loom_sim_req *reqs = ss_requests(c, r->seed, nreq);
    loom_sched_sim *s = reqs ? loom_sched_sim_new(&o, reqs, nreq, why, sizeof why) : NULL;
    bool ok = s != NULL;
    if (!ok) cf_fail(r, "cannot set up the simulation: %s", reqs ? why : "out of memory");
    if (ok) {
        s->where = r->where;
        ok = loom_sched_sim_run(s, 200000);
    }
    if (s && s->failed) ok = cf_fail(r, "%s (seed 0x%llx)", s->why, (unsigned long long)r->seed);
    if (ok) {
        int32_t done = 0, aborted = 0;
        for (int32_t i = 0; i < s->n; i++) {
            done += s->seqs[i].state == LOOM_SIM_DONE;
            aborted += s->seqs[i].state == LOOM_SIM_ABORTED;
        }
        cf_note(r, "%d requests (%lld forked samples): %d done, %d aborted in %lld steps; preemptions: %lld recompute, "
                   "%lld swap; budgets checked: max_num_seqs %d, max_batched_tokens %d",
                nreq, (long long)s->forks, done, aborted, (long long)s->step, (long long)s->preempt_recompute,
                (long long)s->preempt_swap, o.max_num_seqs, o.max_batched_tokens);
        if (s->preempt_recompute + s->preempt_swap == 0)
            strncat(r->note, "; the cache never ran short (preemption untested in this run)",
                    sizeof r->note - strlen(r->note) - 1);
    }
    loom_sched_sim_free(s);
    free(reqs);
    const loom_ops_head *ops = r->comp->ops;
    cf_where(r, "destroy()");
    ops->destroy(o.sched);
    if (ok && cf_host_live() && !cops) ok = cf_fail(r, "destroy() left %ld host allocations unfreed", cf_host_live());
    return ok;
}

static bool check_random(cf_run *r, const void *arg) {
    return ss_run(r, arg, NULL, NULL, (int32_t)cf_iters(r, 300, 80));
}

static size_t ss_block_bytes(void *ctx, int32_t block_size) { return (size_t)block_size * 512; }

/* The workload of the first case against the real paged cache manager
 * (prefix caching and host swap on), found through the search path. */
static bool check_paged(cf_run *r, const void *arg) {
    const loom_component *pc = NULL;
    struct loom_plugin *pp = NULL;
    loom_error err = {0};
    if (!cf_registry() || loom_registry_find(cf_registry(), LOOM_KIND_CACHE, "paged", &pc, &pp, &err) != LOOM_OK)
        return cf_skip(r, "the `paged` cache is not in the search path (LOOM_PLUGIN_PATH)");
    static const loom_conformance_opts paged_opts = {0}; /* --set is for the scheduler */
    cf_run cr = *r;
    cr.opts = &paged_opts;
    cr.comp = pc;
    void *cself = NULL;
    if (!cf_create(&cr, "block_size=8,num_blocks=128,num_cpu_blocks=48,prefix_caching=true,watermark=0", &cself))
        return cf_fail(r, "paged: %s", cr.why);
    const loom_cache_ops *cops = pc->ops;
    loom_cache_init in = {.struct_size = sizeof in, .block_bytes = ss_block_bytes,
                          .device_free_bytes = (size_t)1 << 30, .device_total_bytes = (size_t)1 << 31,
                          .max_model_len = 1024, .backend_can_swap = true};
    loom_kv_layout layout = {.struct_size = sizeof layout, .dtype = LOOM_DTYPE_F16};
    bool ok = cops->init(cself, &in, &layout, &err) == LOOM_OK || cf_fail(r, "paged init: %s", err.message);
    if (ok) ok = ss_run(r, arg, cops, cself, (int32_t)cf_iters(r, 300, 80));
    if (ok) {
        loom_cache_stats cs = {.struct_size = sizeof cs};
        cops->stats(cself, &cs);
        if (cs.free_cpu_blocks != cs.num_cpu_blocks) ok = cf_fail(r, "host blocks leaked in paged");
    }
    cops->destroy(cself);
    if (ok && cf_host_live()) ok = cf_fail(r, "%ld host allocations leaked", cf_host_live());
    return ok;
}

static const loom_seq_info *ss_no_seq(void *ctx, loom_seq_id id) { return NULL; }

/* add/remove bookkeeping and an empty step. */
static bool check_basics(cf_run *r, const void *arg) {
    (void)arg;
    void *self;
    if (!cf_create(r, "", &self)) return false;
    const loom_scheduler_ops *ops = r->comp->ops;
    loom_ref_cache *rc = loom_ref_cache_new(16, 64, 0, 16);
    CF_ENSURE(r, rc, "out of memory");
    loom_sched_entry ent[4];
    loom_seq_id pre[4];
    loom_preempt_mode mode[4];
    loom_sched_output out = {.struct_size = sizeof out, .capacity = 4, .scheduled = ent, .preempted = pre,
                             .preempt_mode = mode};
    loom_sched_env env = {.struct_size = sizeof env, .get_seq = ss_no_seq, .cache = &loom_ref_cache_ops,
                          .cache_self = rc};
    loom_error err = {0};
    bool ok = true;
    cf_where(r, "remove() of an unknown id");
    ops->remove(self, 12345);
    int32_t toks[4] = {1, 2, 3, 4};
    loom_seq_info a = {.struct_size = sizeof a, .id = 7, .num_prompt_tokens = 4, .num_tokens = 4,
                       .max_total_tokens = 8, .tokens = toks};
    cf_where(r, "add()");
    if (ops->add(self, &a, &err) != LOOM_OK) ok = cf_fail(r, "add() of a 4-token sequence failed: %s", err.message);
    loom_sched_stats st = {.struct_size = sizeof st};
    if (ok && ops->stats) {
        ops->stats(self, &st);
        if (st.num_waiting + st.num_running + st.num_swapped != 1)
            ok = cf_fail(r, "after one add() stats() count %d sequences", st.num_waiting + st.num_running + st.num_swapped);
    }
    cf_where(r, "remove(), then schedule() with nothing queued");
    ops->remove(self, 7);
    if (ok && ops->stats) {
        st = (loom_sched_stats){.struct_size = sizeof st};
        ops->stats(self, &st);
        if (st.num_waiting + st.num_running + st.num_swapped != 0) ok = cf_fail(r, "remove() left it counted in stats()");
    }
    out.num_scheduled = out.num_preempted = 0;
    if (ok && ops->schedule(self, &env, &out, &err) != LOOM_OK)
        ok = cf_fail(r, "schedule() with no sequence failed: %s", err.message);
    if (ok && (out.num_scheduled || out.num_preempted))
        ok = cf_fail(r, "schedule() with no sequence emitted %d entries, %d preemptions", out.num_scheduled,
                     out.num_preempted);
    loom_ref_cache_free(rc);
    if (!ok) {
        ops->destroy(self);
        return false;
    }
    return cf_destroy(r, self);
}

int cf_checks_scheduler(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_basics, NULL, "sched.basics");
    char seen[8][320];
    int nseen = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char label[256], full[320];
        cf_config_label(c, k_cases[i].sets, label, sizeof label);
        snprintf(full, sizeof full, "%s%s%s%s", label[0] ? label : "defaults", k_cases[i].num_cpu_blocks ? " swap-pool" : "",
                 k_cases[i].drafts ? " drafts" : "", k_cases[i].forks ? " forks" : "");
        bool dup = false;
        for (int j = 0; j < nseen; j++) dup |= !strcmp(seen[j], full);
        if (dup) continue;
        if (nseen < 8) snprintf(seen[nseen++], sizeof seen[0], "%s", full);
        n = cf_add(out, n, cap, check_random, &k_cases[i], "sched.random[%s]", full);
    }
    n = cf_add(out, n, cap, check_paged, &k_cases[0], "sched.paged");
    return n;
}
