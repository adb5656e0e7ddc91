/*
 * tests/scheduler/test_scheduler.c — behaviour of the `continuous` and
 * `static` scheduler plugins, dlopen'ed from the build tree and driven by
 * the conformance kit's simulated core and reference cache (sim.h,
 * conformance/sched_sim.h, conformance/ref_cache.h).
 *
 * Each test states the property it pins down; sim_step() re-checks the
 * whole contract (budgets, single scheduling, slots, start offsets) on every
 * step of every test, so each test is also a budget test.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "sim.h"

#define NREQ(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

/* ------------------------------------------------------ descriptor, config */

Test(scheduler, descriptors_and_params) {
    const char *names[] = {"continuous", "static"};
    for (int i = 0; i < 2; i++) {
        sched_plugin p;
        plugin_open(sched_plugin_path(names[i]), LOOM_KIND_SCHEDULER, &p);
        cr_assert_str_eq(p.comp->name, names[i]);
        cr_assert(p.ops->struct_size >= sizeof(loom_scheduler_ops));
        cr_assert(p.ops->create && p.ops->destroy && p.ops->add && p.ops->remove &&
                  p.ops->schedule && p.ops->stats);
        void *cfg = config_build(p.comp, NULL);
        cr_assert_eq(config_get_int(p.comp, cfg, "max_num_seqs"), 256);
        cr_assert_eq(config_get_int(p.comp, cfg, "max_batched_tokens"), 2048);
        if (i == 0) {
            cr_assert_eq(config_get_int(p.comp, cfg, "chunked_prefill"), 1);
            cr_assert_eq(config_get_int(p.comp, cfg, "policy"), 0);
            cr_assert_eq(config_get_int(p.comp, cfg, "preemption"), 0);
        }
        free(cfg);
        plugin_close(&p);
    }
}

Test(scheduler, create_rejects_bad_config) {
    const loom_host *host = fake_host();
    sched_plugin p;
    plugin_open(sched_plugin_path("continuous"), LOOM_KIND_SCHEDULER, &p);
    void *cfg = config_build(p.comp, "max_num_seqs=0");
    void *self = (void *)1;
    loom_error err = {0};
    cr_assert_eq(p.ops->create(host, cfg, &self, &err), LOOM_ERR_INVALID);
    cr_assert_null(self);
    cr_assert(strstr(err.message, "max_num_seqs"), "message: %s", err.message);
    free(cfg);
    cr_assert_eq(p.ops->create(host, NULL, &self, &err), LOOM_ERR_INVALID);
    cr_assert_eq(fake_host_live_allocs(), 0);
    plugin_close(&p);
}

Test(scheduler, add_remove_and_output_errors) {
    const loom_host *host = fake_host();
    const char *names[] = {"continuous", "static"};
    for (int i = 0; i < 2; i++) {
        sched_plugin p;
        plugin_open(sched_plugin_path(names[i]), LOOM_KIND_SCHEDULER, &p);
        void *cfg = config_build(p.comp, NULL);
        void *self = NULL;
        loom_error err = {0};
        cr_assert_eq(p.ops->create(host, cfg, &self, &err), LOOM_OK);
        int32_t toks[4] = {1, 2, 3, 4};
        loom_seq_info a = {.struct_size = sizeof a, .id = 7, .num_prompt_tokens = 4,
                           .num_tokens = 4, .max_total_tokens = 8, .tokens = toks};
        cr_assert_eq(p.ops->add(self, &a, &err), LOOM_OK);
        cr_assert_eq(p.ops->add(self, &a, &err), LOOM_ERR_INVALID, "duplicate id accepted");
        cr_assert(strstr(err.message, "7"), "message does not name the sequence: %s",
                  err.message);
        loom_seq_info empty = a;
        empty.id = 8;
        empty.num_tokens = 0;
        cr_assert_eq(p.ops->add(self, &empty, &err), LOOM_ERR_INVALID);
        a.id = 9;
        cr_assert_eq(p.ops->add(self, &a, &err), LOOM_OK);

        /* capacity below the live count is refused, not overrun */
        loom_sched_entry ent[1];
        loom_seq_id pre[1];
        loom_preempt_mode mode[1];
        loom_sched_output out = {.struct_size = sizeof out, .capacity = 1, .scheduled = ent,
                                 .preempted = pre, .preempt_mode = mode};
        loom_ref_cache *fc = loom_ref_cache_new(16, 64, 0, 16);
        loom_sched_env env = {.struct_size = sizeof env, .get_seq = NULL, .cache = &loom_ref_cache_ops,
                              .cache_self = fc};
        cr_assert_eq(p.ops->schedule(self, &env, &out, &err), LOOM_ERR_INVALID, "NULL get_seq");
        loom_ref_cache_free(fc);

        p.ops->remove(self, 12345); /* unknown: ignored */
        p.ops->remove(self, 7);
        loom_sched_stats st = {.struct_size = sizeof st};
        p.ops->stats(self, &st);
        cr_assert_eq(st.num_waiting + st.num_running + st.num_swapped, 1);
        p.ops->remove(self, 9);
        p.ops->stats(self, &st);
        cr_assert_eq(st.num_waiting, 0);
        p.ops->destroy(self);
        cr_assert_eq(fake_host_live_allocs(), 0);
        free(cfg);
        plugin_close(&p);
    }
}

static const loom_seq_info *no_seq(void *ctx, loom_seq_id id) { return NULL; }
static const loom_seq_info *one_seq(void *ctx, loom_seq_id id) {
    const loom_seq_info *v = ctx;
    return id == v->id ? v : NULL;
}

/* A hard cache error (not NO_SPACE) is returned with a message naming the
 * sequence; a queued sequence the core no longer knows is dropped with a
 * warning instead of stalling the queue. */
Test(scheduler, cache_errors_and_unknown_sequences) {
    const loom_host *host = fake_host();
    const char *names[] = {"continuous", "static"};
    for (int i = 0; i < 2; i++) {
        sched_plugin p;
        plugin_open(sched_plugin_path(names[i]), LOOM_KIND_SCHEDULER, &p);
        void *cfg = config_build(p.comp, NULL);
        void *self = NULL;
        loom_error err = {0};
        cr_assert_eq(p.ops->create(host, cfg, &self, &err), LOOM_OK);
        int32_t toks[4] = {1, 2, 3, 4};
        loom_seq_info a = {.struct_size = sizeof a, .id = 3, .num_prompt_tokens = 4,
                           .num_tokens = 4, .max_total_tokens = 8, .tokens = toks};
        cr_assert_eq(p.ops->add(self, &a, &err), LOOM_OK);
        loom_sched_entry ent[4];
        loom_seq_id pre[4];
        loom_preempt_mode mode[4];
        loom_sched_output out = {.struct_size = sizeof out, .capacity = 4, .scheduled = ent,
                                 .preempted = pre, .preempt_mode = mode};
        loom_ref_cache *fc = loom_ref_cache_new(16, 64, 0, 16);
        fc->fail_allocate = LOOM_ERR_DEVICE;
        loom_sched_env env = {.struct_size = sizeof env, .ctx = &a, .get_seq = one_seq,
                              .cache = &loom_ref_cache_ops, .cache_self = fc};
        cr_assert_eq(p.ops->schedule(self, &env, &out, &err), LOOM_ERR_DEVICE);
        cr_assert(strstr(err.message, "sequence 3") && strstr(err.message, "injected"),
                  "%s: message: %s", names[i], err.message);
        cr_assert_eq(fc->free_blocks, 64, "%s: the failed admission kept blocks", names[i]);

        env.get_seq = no_seq;
        cr_assert_eq(p.ops->schedule(self, &env, &out, &err), LOOM_OK);
        cr_assert_eq(out.num_scheduled, 0);
        loom_sched_stats st = {.struct_size = sizeof st};
        p.ops->stats(self, &st);
        cr_assert_eq(st.num_waiting + st.num_running, 0, "%s: unknown sequence kept", names[i]);
        loom_ref_cache_free(fc);
        p.ops->destroy(self);
        cr_assert_eq(fake_host_live_allocs(), 0);
        free(cfg);
        plugin_close(&p);
    }
}

/* ------------------------------------------------------ continuous batching */

/* Iteration-level: a request arriving while others decode joins the very
 * step it arrives in, alongside their decode tokens. */
Test(scheduler, continuous_admits_while_decoding) {
    sim_req reqs[] = {
        {.prompt = 10, .total = 60, .arrive = 1},
        {.prompt = 12, .total = 70, .arrive = 1},
        {.prompt = 20, .total = 40, .arrive = 6},
    };
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=8,max_batched_tokens=256"};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    for (int i = 0; i < 6; i++) sim_step(s);
    const loom_sched_entry *a = sim_entry(s, 0), *b = sim_entry(s, 1), *c = sim_entry(s, 2);
    cr_assert(a && b && c, "step 6 should run both decodes and the newcomer");
    cr_assert_eq(a->num_tokens, 1);
    cr_assert_eq(b->num_tokens, 1);
    cr_assert_eq(c->num_computed, 0);
    cr_assert_eq(c->num_tokens, 20);
    sim_run(s, 1000);
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);
}

/* Budgets: max_num_seqs and max_batched_tokens hold every step (sim_step
 * asserts) and are actually reached, so the check is not vacuous. */
Test(scheduler, budgets_hold_and_are_used) {
    sim_req reqs[40];
    uint64_t r = 42;
    for (int i = 0; i < NREQ(reqs); i++) {
        int32_t p = 1 + (int32_t)(sim_rand(&r) % 90);
        reqs[i] = (sim_req){.prompt = p, .total = p + 1 + (int32_t)(sim_rand(&r) % 40),
                            .arrive = 1 + (int64_t)(sim_rand(&r) % 30)};
    }
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=4,max_batched_tokens=64"};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    sim_run(s, 10000);
    cr_assert_eq(s->max_step_seqs, 4, "never ran 4 sequences at once");
    cr_assert_eq(s->max_step_tokens, 64, "never filled the token budget");
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);
}

/* Chunked prefill: a 5000-token prompt is split over steps of at most 512
 * tokens, contiguously, and an ongoing decode runs in every one of them. */
Test(scheduler, chunked_prefill_splits_and_mixes_decodes) {
    sim_req reqs[] = {
        {.prompt = 8, .total = 200, .arrive = 1},
        {.prompt = 5000, .total = 5003, .arrive = 3},
    };
    sim_opts o = {.plugin = "continuous",
                  .params = "max_num_seqs=8,max_batched_tokens=512",
                  .num_blocks = 1024};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    int32_t chunks = 0, next = 0;
    while (s->seqs[1].state != SIM_DONE) {
        sim_step(s);
        const loom_sched_entry *l = sim_entry(s, 1);
        if (!l || l->num_computed >= 5000) continue;
        chunks++;
        cr_assert_eq(l->num_computed, next, "chunks not contiguous");
        next = l->num_computed + l->num_tokens;
        const loom_sched_entry *d = sim_entry(s, 0);
        cr_assert(d && d->num_tokens == 1, "step %lld: no decode beside the prefill chunk",
                  (long long)s->step);
        if (next < 5000)
            cr_assert_eq(l->num_tokens + d->num_tokens, 512, "chunk leaves budget unused");
    }
    cr_assert_eq(next, 5000);
    cr_assert_geq(chunks, 10, "5000 tokens in %d chunks of <= 511", chunks);
    sim_run(s, 1000);
    sim_free(s);
}

/* Without chunking: a prompt runs whole or waits (no partial chunks), FCFS
 * admission stops at the first that does not fit; a prompt longer than the
 * budget is admitted alone into an empty step and then chunked. */
Test(scheduler, no_chunking_waits_until_prompt_fits) {
    sim_req reqs[] = {
        {.prompt = 300, .total = 320, .arrive = 1},
        {.prompt = 300, .total = 320, .arrive = 1},
        {.prompt = 1000, .total = 1005, .arrive = 2},
        {.prompt = 10, .total = 15, .arrive = 2},
    };
    sim_opts o = {.plugin = "continuous",
                  .params = "max_num_seqs=8,max_batched_tokens=512,chunked_prefill=false",
                  .num_blocks = 1024};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    sim_step(s);
    cr_assert_eq(s->out.num_scheduled, 1);
    cr_assert(sim_entry(s, 0) && sim_entry(s, 0)->num_tokens == 300);
    sim_step(s);
    cr_assert(sim_entry(s, 1) && sim_entry(s, 1)->num_computed == 0 &&
                  sim_entry(s, 1)->num_tokens == 300,
              "the second prompt runs whole once it fits");
    cr_assert_null(sim_entry(s, 3), "no skipping ahead of the long prompt (FCFS)");
    while (!s->seqs[2].first_step) {
        sim_step(s);
        if (sim_entry(s, 2)) break;
    }
    cr_assert_eq(s->out.num_scheduled, 1, "the oversize prompt runs alone");
    cr_assert_eq(sim_entry(s, 2)->num_tokens, 512);
    cr_assert_eq(s->seqs[0].state, SIM_DONE);
    cr_assert_eq(s->seqs[1].state, SIM_DONE);
    cr_assert_eq(s->seqs[3].first_step, 0, "the short one still waits behind it");
    sim_step(s);
    cr_assert_eq(sim_entry(s, 2)->num_computed, 512);
    cr_assert_eq(sim_entry(s, 2)->num_tokens, 488);
    cr_assert(sim_entry(s, 3) && sim_entry(s, 3)->num_tokens == 10,
              "the short prompt fits in the 24 tokens left next to the last chunk");
    sim_run(s, 1000);
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);
}

/* FCFS: first scheduled in arrival_time order, whatever the add order. */
Test(scheduler, fcfs_order_of_first_scheduling) {
    double off[] = {0.3, 0.1, 0.4, 0.0, 0.2};
    sim_req reqs[5];
    for (int i = 0; i < 5; i++)
        reqs[i] = (sim_req){.prompt = 5, .total = 9, .arrive = 1, .arrival_offset = off[i]};
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=1"};
    sim *s = sim_new(&o, reqs, 5);
    sim_run(s, 1000);
    int expect[] = {3, 1, 4, 0, 2};
    for (int k = 0; k < 5; k++)
        cr_assert_eq(s->seqs[expect[k]].first_rank, k + 1, "seq %d ranked %d, expected %d",
                     expect[k], s->seqs[expect[k]].first_rank, k + 1);
    sim_free(s);
}

/* Priority: (priority asc, arrival asc). */
Test(scheduler, priority_order) {
    int32_t prio[] = {2, 0, 1, 0};
    sim_req reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = (sim_req){.prompt = 5, .total = 9, .priority = prio[i], .arrive = 1,
                            .arrival_offset = 0.1 * i};
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=1,policy=priority"};
    sim *s = sim_new(&o, reqs, 4);
    sim_run(s, 1000);
    int expect[] = {1, 3, 2, 0};
    for (int k = 0; k < 4; k++)
        cr_assert_eq(s->seqs[expect[k]].first_rank, k + 1, "seq %d ranked %d, expected %d",
                     expect[k], s->seqs[expect[k]].first_rank, k + 1);
    sim_free(s);
}

/* Priority preemption: a high-priority arrival takes the slot of a running
 * low-priority sequence in the step it arrives; the victim recomputes
 * later and still ends with exactly its length. Equal priority never
 * preempts. */
Test(scheduler, priority_preempts_lower_priority) {
    sim_req reqs[] = {
        {.prompt = 10, .total = 100, .priority = 5, .arrive = 1},
        {.prompt = 10, .total = 20, .priority = 0, .arrive = 10},
        {.prompt = 10, .total = 20, .priority = 5, .arrive = 11},
    };
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=1,policy=priority"};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    for (int i = 0; i < 10; i++) sim_step(s);
    cr_assert_eq(s->out.num_preempted, 1);
    cr_assert_eq(s->out.preempted[0], 0);
    cr_assert_eq(s->out.preempt_mode[0], LOOM_PREEMPT_RECOMPUTE);
    cr_assert(sim_entry(s, 1) && sim_entry(s, 1)->num_tokens == 10);
    cr_assert_null(sim_entry(s, 0));
    sim_run(s, 1000);
    cr_assert_eq(s->seqs[0].preempts, 1);
    cr_assert_eq(s->seqs[2].preempts, 0);
    cr_assert_lt(s->seqs[0].done_step, s->seqs[2].first_step, "2 is younger than 0: after it");
    sim_free(s);
}

/* Cache full, recompute: the youngest is preempted, reported RECOMPUTE,
 * restarts from 0 (sim checks a fresh entry starts at the cache's prefix),
 * and every sequence still completes with its exact length. */
Test(scheduler, preemption_recompute_when_cache_full) {
    sim_req reqs[] = {
        {.prompt = 8, .total = 40, .arrive = 1},
        {.prompt = 8, .total = 40, .arrive = 1, .arrival_offset = 0.1},
        {.prompt = 8, .total = 40, .arrive = 1, .arrival_offset = 0.2},
    };
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=8,max_batched_tokens=512",
                  .block_size = 4, .num_blocks = 16};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    loom_seq_id first_victim = -1;
    int64_t victim_step = 0;
    while (first_victim < 0) {
        sim_step(s);
        cr_assert_lt(s->step, 100, "no preemption although 3x10 blocks > 16");
        if (s->out.num_preempted) {
            first_victim = s->out.preempted[0];
            victim_step = s->step;
            cr_assert_eq(s->out.preempt_mode[0], LOOM_PREEMPT_RECOMPUTE);
        }
    }
    cr_assert_eq(first_victim, 2, "the youngest goes first");
    cr_assert_eq(s->seqs[2].info.num_computed, 0);
    /* It comes back later as one recompute chunk of prompt + output so far. */
    int32_t had = s->seqs[2].info.num_tokens;
    while (!sim_entry(s, 2)) sim_step(s);
    cr_assert_gt(s->step, victim_step);
    cr_assert_eq(sim_entry(s, 2)->num_computed, 0);
    cr_assert_eq(sim_entry(s, 2)->num_tokens, had);
    sim_run(s, 2000);
    cr_assert_gt(s->preempt_recompute, 0);
    cr_assert_eq(s->preempt_swap, 0);
    cr_assert_eq(s->empty_steps, 0);
    loom_sched_stats st = {.struct_size = sizeof st};
    s->ops->stats(s->sched, &st);
    cr_assert_eq(st.num_preemptions, s->preempt_recompute);
    cr_assert_eq(fake_host_metric("sched.preemptions"), (double)s->preempt_recompute);
    sim_free(s);
}

/* A recompute victim keeps its arrival order: it goes back to the front of
 * the waiting queue, and a younger request that would fit is not admitted
 * ahead of it (no skipping in FCFS). */
Test(scheduler, recompute_victim_keeps_arrival_order) {
    sim_req reqs[] = {
        {.prompt = 8, .total = 40, .arrive = 1},
        {.prompt = 8, .total = 40, .arrive = 1, .arrival_offset = 0.1},
        {.prompt = 8, .total = 12, .arrive = 100000}, /* moved up below */
    };
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=8,max_batched_tokens=512",
                  .block_size = 4, .num_blocks = 12};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    while (!s->out.num_preempted) {
        sim_step(s);
        cr_assert_lt(s->step, 200, "2 x 10 blocks > 12 must preempt");
    }
    cr_assert_eq(s->out.preempted[0], 1);
    s->seqs[2].req.arrive = s->step + 1; /* arrives right after the preemption */
    for (;;) {
        sim_step(s);
        cr_assert_lt(s->step, 400);
        if (sim_entry(s, 1)) break;
        cr_assert_null(sim_entry(s, 2), "step %lld: younger seq 2 overtook preempted seq 1",
                       (long long)s->step);
    }
    sim_run(s, 2000);
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);
}

/* Swap mode: victims are reported SWAP, swapped back in later, and continue
 * from where they were (sim checks non-fresh entries start at the core's
 * num_computed); with no host pool it falls back to recompute. */
Test(scheduler, swap_preemption_and_swap_in) {
    sim_req reqs[] = {
        {.prompt = 8, .total = 40, .arrive = 1},
        {.prompt = 8, .total = 40, .arrive = 1, .arrival_offset = 0.1},
        {.prompt = 8, .total = 40, .arrive = 1, .arrival_offset = 0.2},
    };
    sim_opts o = {.plugin = "continuous",
                  .params = "max_num_seqs=8,max_batched_tokens=512,preemption=swap",
                  .block_size = 4, .num_blocks = 16, .num_cpu_blocks = 64};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    sim_run(s, 2000);
    cr_assert_gt(s->preempt_swap, 0);
    cr_assert_eq(s->preempt_recompute, 0);
    cr_assert_gt(s->max_swapped_seen, 0);
    cr_assert_eq(s->fc->swaps_in, s->fc->swaps_out);
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);

    sim_opts o2 = o;
    o2.num_cpu_blocks = 0; /* swap_out: UNSUPPORTED */
    s = sim_new(&o2, reqs, NREQ(reqs));
    sim_run(s, 2000);
    cr_assert_eq(s->preempt_swap, 0);
    cr_assert_gt(s->preempt_recompute, 0);
    sim_free(s);

    sim_opts o3 = o;
    o3.num_cpu_blocks = 2; /* swap_out: NO_SPACE for anything bigger */
    s = sim_new(&o3, reqs, NREQ(reqs));
    sim_run(s, 2000);
    cr_assert_gt(s->preempt_recompute, 0);
    sim_free(s);
}

/* Speculative drafts: a decode needs 1 + num_draft tokens and they count
 * against the token budget. */
Test(scheduler, drafts_count_in_budget) {
    sim_req reqs[6];
    for (int i = 0; i < 6; i++)
        reqs[i] = (sim_req){.prompt = 4, .total = 60, .arrive = 1, .drafts = 3};
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=8,max_batched_tokens=16",
                  .seed = 7};
    sim *s = sim_new(&o, reqs, 6);
    bool saw_verify = false;
    do {
        sim_step(s);
        for (int k = 0; k < s->out.num_scheduled; k++) {
            const loom_sched_entry *e = &s->out.scheduled[k];
            if (e->num_tokens == 4 && s->seqs[e->seq].first_step < s->step) saw_verify = true;
        }
    } while (s->live && s->step < 3000);
    cr_assert(saw_verify, "never scheduled 1 + 3 drafts");
    sim_run(s, 3000);
    cr_assert_eq(s->max_step_tokens, 16);
    sim_free(s);
}

/* Prefix hits: the first entry starts at the tokens the cache reports
 * computed (sim_step checks equality with the fake's answer). */
Test(scheduler, prefix_hit_starts_later) {
    sim_req reqs[] = {{.prompt = 100, .total = 104, .arrive = 1}};
    sim_opts o = {.plugin = "continuous", .prefix_tokens = 64};
    sim *s = sim_new(&o, reqs, 1);
    sim_step(s);
    cr_assert(sim_entry(s, 0));
    cr_assert_eq(sim_entry(s, 0)->num_computed, 64);
    cr_assert_eq(sim_entry(s, 0)->num_tokens, 36);
    sim_run(s, 100);
    sim_free(s);
}

/* max_prefill_seqs caps prefill entries per step. */
Test(scheduler, max_prefill_seqs) {
    sim_req reqs[6];
    for (int i = 0; i < 6; i++) reqs[i] = (sim_req){.prompt = 20, .total = 30, .arrive = 1};
    sim_opts o = {.plugin = "continuous", .params = "max_prefill_seqs=2"};
    sim *s = sim_new(&o, reqs, 6);
    sim_step(s);
    cr_assert_eq(s->out.num_scheduled, 2);
    sim_step(s);
    cr_assert_eq(s->out.num_scheduled, 4, "2 decodes + 2 new prefills");
    sim_run(s, 200);
    sim_free(s);
}

Test(scheduler, stats_and_metrics) {
    sim_req reqs[5];
    for (int i = 0; i < 5; i++) reqs[i] = (sim_req){.prompt = 5, .total = 30, .arrive = 1};
    sim_opts o = {.plugin = "continuous", .params = "max_num_seqs=2"};
    sim *s = sim_new(&o, reqs, 5);
    sim_step(s);
    loom_sched_stats st = {.struct_size = sizeof st};
    s->ops->stats(s->sched, &st);
    cr_assert_eq(st.num_running, 2);
    cr_assert_eq(st.num_waiting, 3);
    cr_assert_eq(st.num_swapped, 0);
    cr_assert_eq(fake_host_metric("sched.waiting"), 3.0);
    cr_assert_eq(fake_host_metric("sched.running"), 2.0);
    sim_run(s, 500);
    sim_free(s);
}

/* ---------------------------------------------------------------- static */

/* Request-level batching: nothing new starts until every member of the
 * batch has finished; slots of early finishers stay idle meanwhile. */
Test(scheduler, static_no_admission_until_batch_drains) {
    int32_t total[] = {20, 60, 30, 25, 25};
    sim_req reqs[5];
    for (int i = 0; i < 5; i++)
        reqs[i] = (sim_req){.prompt = 10, .total = total[i], .arrive = 1,
                            .arrival_offset = 0.1 * i};
    sim_opts o = {.plugin = "static", .params = "max_num_seqs=3,max_batched_tokens=512"};
    sim *s = sim_new(&o, reqs, 5);
    bool idle_slot = false;
    while (s->seqs[1].state != SIM_DONE) {
        sim_step(s);
        if (s->seqs[0].state == SIM_DONE && s->out.num_scheduled < 3) idle_slot = true;
        cr_assert_null(sim_entry(s, 3), "admitted while the batch runs");
        cr_assert_null(sim_entry(s, 4), "admitted while the batch runs");
    }
    cr_assert(idle_slot);
    sim_run(s, 1000);
    int64_t drained = s->seqs[1].done_step;
    cr_assert_gt(s->seqs[3].first_step, drained);
    cr_assert_gt(s->seqs[4].first_step, drained);
    cr_assert_eq(s->empty_steps, 0);
    sim_free(s);
}

/* Static splits a batch's prefill by the token budget and preempts (by
 * recompute) its youngest member when the cache runs out. */
Test(scheduler, static_budget_and_preemption) {
    sim_req reqs[] = {
        {.prompt = 300, .total = 330, .arrive = 1},
        {.prompt = 300, .total = 330, .arrive = 1, .arrival_offset = 0.1},
        {.prompt = 80, .total = 200, .arrive = 1, .arrival_offset = 0.2},
    };
    sim_opts o = {.plugin = "static", .params = "max_num_seqs=4,max_batched_tokens=256",
                  .block_size = 8, .num_blocks = 90};
    sim *s = sim_new(&o, reqs, NREQ(reqs));
    sim_run(s, 2000);
    cr_assert_gt(s->preempt_recompute, 0, "42+42+14 blocks > 90 while all three run: must preempt");
    cr_assert_eq(s->max_step_tokens, 256);
    sim_free(s);
}

static sim_req *mixed_workload(int32_t n, uint64_t seed) {
    sim_req *r = calloc((size_t)n, sizeof *r);
    cr_assert(r);
    for (int32_t i = 0; i < n; i++) {
        int32_t p = 16 + (int32_t)(sim_rand(&seed) % 48);
        int32_t out = (i % 4 == 0) ? 150 + (int32_t)(sim_rand(&seed) % 50)
                                   : 4 + (int32_t)(sim_rand(&seed) % 30);
        r[i] = (sim_req){.prompt = p, .total = p + out, .arrive = 1, .arrival_offset = 0.01 * i};
    }
    return r;
}

/* The point of continuous batching: on a mixed-length workload it finishes
 * in fewer steps than request-level batching with the same budgets. */
Test(scheduler, continuous_beats_static_on_mixed_lengths) {
    int32_t n = 32;
    sim_req *reqs = mixed_workload(n, 99);
    sim_opts oc = {.plugin = "continuous", .params = "max_num_seqs=8,max_batched_tokens=512"};
    sim *c = sim_new(&oc, reqs, n);
    int64_t steps_c = sim_run(c, 10000);
    sim_free(c);
    sim_opts os = {.plugin = "static", .params = "max_num_seqs=8,max_batched_tokens=512"};
    sim *st = sim_new(&os, reqs, n);
    int64_t steps_s = sim_run(st, 10000);
    sim_free(st);
    fprintf(stderr, "mixed workload, %d requests: continuous %lld steps, static %lld steps\n", n,
            (long long)steps_c, (long long)steps_s);
    cr_assert_lt(steps_c, steps_s);
    free(reqs);
}
