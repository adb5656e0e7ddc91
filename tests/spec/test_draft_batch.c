/*
 * tests/spec/test_draft_batch.c — the draft-model speculator's batched
 * proposal (propose_batch) against its per-sequence one, without
 * the target engine (suite 'spec'). The plugin's source is included here
 * (its symbols are hidden in the .so), driven through a fake host with the
 * real engine API, so the test can look into its draft engine.
 *
 * Two instances built alike draft for the same simulated sequences round
 * after round: A with propose() one sequence at a time, B with one
 * propose_batch() for all. Each round:
 *   - the drafts (ids, counts, q_valid) of A and B are identical, and q
 *     rows agree (to float rounding: a batched draft step may take another
 *     GEMM than a lone one);
 *   - B's draft engine ran ~k + 1 steps for the round, A's ~n x (k + 1);
 *   - neither draft engine keeps a KV block in use afterwards;
 * then the "target" accepts a random prefix of the drafts and appends a
 * token of its own (the draft caches see rollbacks: the next context
 * parts from the last proposal), sequences are released and replaced, and
 * per-sequence max_k varies (0 included). Greedy and sampled (fixed
 * seeds) sequences are mixed in one batch, and two sequences share a
 * prompt. On the dummy tiny model always; on the real model when
 * LOOM_TEST_MODEL is set.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"

/* The plugin itself: draft_ops, draft_spec and its statics. */
#include "draft_model.c"
#include "plugin/host_rules.h"

#define TS_N 5         /* sequences per round                    */
#define TS_CAP 1024    /* tokens a simulated sequence may hold   */
#define TS_KMAX 4

typedef struct tseq {
    loom_seq_info info;
    int32_t toks[TS_CAP];
    loom_sampling_params p;
} tseq;

typedef struct world {
    const char *yaml;       /* draft pipeline (tests/spec/data)   */
    const char *overrides;
    int32_t vocab;
    int32_t limit;          /* restart a sequence past this length */
    bool adaptive;
    int32_t rounds;
    int32_t prompt_min, prompt_span;
    bool check_steps;       /* no preemption in the draft: bound its steps */
    bool want_preempt;      /* the batched draft engine must preempt      */
} world;

static const char *data_dir(void) {
    static char buf[1024];
    const char *src = getenv("LOOM_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/tests/spec/data", src ? src : ".");
    return buf;
}

static draft_spec *make(const loom_host *h, const world *w) {
    draft_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.pipeline, sizeof c.pipeline, "%s", w->yaml);
    snprintf(c.overrides, sizeof c.overrides, "%s", w->overrides);
    c.num_draft_tokens = TS_KMAX;
    c.adaptive = w->adaptive;
    c.max_batch = 0;
    c.max_verify_tokens = 0;
    void *self = NULL;
    loom_error err = {0};
    cr_assert_eq(draft_ops.create(h, &c, &self, &err), LOOM_OK, "%s", err.message);
    loom_spec_init si = {sizeof si, w->vocab, data_dir(), 4096, loom_engine_api_get()};
    cr_assert_eq(draft_ops.init(self, &si, &err), LOOM_OK, "%s", err.message);
    return self;
}

static loom_engine_stats draft_stats_of(draft_spec *s) {
    loom_engine_stats st = {.struct_size = sizeof st};
    loom_engine_get_stats(s->draft, &st, sizeof st);
    return st;
}

static int32_t kv_used(draft_spec *s) { return draft_stats_of(s).kv_blocks_used; }

/* A prompt: real text through the draft's tokenizer when it has one (the
 * real model), else random ids with repeats (tiny). */
static int32_t make_prompt(draft_spec *s, const world *w, uint64_t *rng, int32_t *out) {
    static const char *texts[] = {
        "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to "
        "continental Europe and North America during the nineteenth century.",
        "def sum_list(values):\n    total = 0\n    for v in values:\n        total = total + v\n    return total\n",
        "Copy this shopping list, putting a dash before each item: apples, bread, milk, eggs, cheese.",
        "Once upon a time",
        "Water boils at one hundred degrees Celsius at sea level, but at the top of a mountain",
    };
    int32_t n = w->prompt_min + (int32_t)(loom_rng_next(rng) % (uint64_t)w->prompt_span);
    if (w->vocab > 256) {
        int32_t *ids = NULL, m = 0;
        loom_error err = {0};
        const char *t = texts[loom_rng_next(rng) % 5];
        cr_assert_eq(loom_engine_tokenize(s->draft, t, true, &ids, &m, &err), LOOM_OK, "%s", err.message);
        if (m > TS_CAP / 2) m = TS_CAP / 2;
        memcpy(out, ids, (size_t)m * sizeof *ids);
        free(ids);
        return m;
    }
    int32_t period = 3 + (int32_t)(loom_rng_next(rng) % 9);
    for (int32_t i = 0; i < n; i++)
        out[i] = i < period || loom_rng_next(rng) % 6 == 0 ? (int32_t)(loom_rng_next(rng) % (uint64_t)w->vocab)
                                                           : out[i - period];
    return n;
}

static void seq_start(tseq *t, loom_seq_id id, const int32_t *prompt, int32_t n, uint64_t *rng) {
    memset(t, 0, sizeof *t);
    memcpy(t->toks, prompt, (size_t)n * sizeof *prompt);
    t->info = (loom_seq_info){.struct_size = sizeof t->info, .id = id, .num_prompt_tokens = n, .num_tokens = n,
                              .num_computed = n - 1, .max_total_tokens = TS_CAP, .tokens = t->toks};
    t->p = loom_sampling_params_default();
    /* Every other sequence samples; the rest are greedy. */
    if (id % 2) {
        t->p.temperature = 0.7f + 0.1f * (float)(id % 3);
        t->p.top_k = id % 3 ? 40 : 0;
        t->p.top_p = 0.95f;
        t->p.has_seed = true;
        t->p.seed = loom_rng_next(rng);
    }
}

static void run_world(const world *w) {
    const loom_host *h = fake_host();
    draft_spec *A = make(h, w), *B = make(h, w);
    uint64_t rng[4];
    loom_rng_seed(rng, 77);
    static tseq ts[TS_N];
    int32_t prompt[TS_CAP];
    loom_seq_id next_id = 1;
    for (int i = 0; i < TS_N; i++) {
        /* sequences 2 and 3 share their prompt */
        int32_t n = i == 3 ? ts[2].info.num_prompt_tokens : make_prompt(A, w, rng, prompt);
        seq_start(&ts[i], next_id++, i == 3 ? ts[2].toks : prompt, n, rng);
    }
    const size_t qrow = (size_t)TS_KMAX * (size_t)w->vocab;
    float *qa = malloc(TS_N * qrow * sizeof(float)), *qb = malloc(TS_N * qrow * sizeof(float));
    cr_assert(qa && qb);
    int32_t da[TS_N][TS_KMAX], db[TS_N][TS_KMAX];
    int64_t drafted = 0, sampled_drafts = 0, rounds_batched = 0;
    double qdiff = 0;
    for (int r = 0; r < w->rounds; r++) {
        int32_t maxk[TS_N], na[TS_N], nb[TS_N], qva[TS_N], qvb[TS_N];
        const loom_seq_info *infos[TS_N];
        const loom_sampling_params *params[TS_N];
        int32_t *dbp[TS_N];
        float *qbp[TS_N];
        for (int i = 0; i < TS_N; i++) {
            maxk[i] = loom_rng_next(rng) % 8 == 0 ? 0 : 1 + (int32_t)(loom_rng_next(rng) % TS_KMAX);
            infos[i] = &ts[i].info;
            params[i] = &ts[i].p;
            dbp[i] = db[i];
            qbp[i] = qb + (size_t)i * qrow;
        }
        memset(da, 0xff, sizeof da);
        memset(db, 0xff, sizeof db);
        int64_t sa0 = A->draft_steps, sb0 = B->draft_steps;
        for (int i = 0; i < TS_N; i++)
            na[i] = draft_ops.propose(A, &ts[i].info, &ts[i].p, maxk[i], da[i], qa + (size_t)i * qrow, &qva[i]);
        draft_ops.propose_batch(B, TS_N, infos, params, maxk, dbp, qbp, qvb, nb);
        cr_assert(!A->broken && !B->broken, "round %d: a draft engine failed", r);
        int32_t busy = 0, kmax = 0;
        for (int i = 0; i < TS_N; i++) {
            cr_assert_eq(na[i], nb[i], "round %d seq %d: %d drafts one at a time, %d batched", r, i, na[i], nb[i]);
            cr_assert(na[i] >= 0 && na[i] <= maxk[i], "round %d seq %d: %d drafts for max_k %d", r, i, na[i], maxk[i]);
            cr_assert_eq(qva[i], qvb[i], "round %d seq %d: q_valid %d vs %d", r, i, qva[i], qvb[i]);
            cr_assert_eq(qva[i], ts[i].p.temperature > 0 && na[i] > 0, "round %d seq %d: q_valid %d", r, i, qva[i]);
            for (int d = 0; d < na[i]; d++) {
                cr_assert_eq(da[i][d], db[i][d], "round %d seq %d (%s) draft %d: %d one at a time, %d batched", r, i,
                             ts[i].p.temperature > 0 ? "sampled" : "greedy", d, da[i][d], db[i][d]);
                cr_assert(da[i][d] >= 0 && da[i][d] < w->vocab);
            }
            if (qva[i])
                for (size_t j = 0; j < (size_t)na[i] * (size_t)w->vocab; j++) {
                    double dq = fabs((double)qa[i * qrow + j] - (double)qb[i * qrow + j]);
                    if (dq > qdiff) qdiff = dq;
                }
            busy += na[i] > 0;
            if (na[i] > kmax) kmax = na[i];
            drafted += na[i];
            if (qva[i]) sampled_drafts += na[i];
        }
        /* Steps: B ran the round's requests together. */
        int64_t sa = A->draft_steps - sa0, sb = B->draft_steps - sb0;
        if (busy >= 2) rounds_batched++;
        /* (Round 0 prefills whole prompts, maybe in chunks.) */
        if (busy >= 2 && r > 0 && w->check_steps) {
            cr_expect(sb <= kmax + 1, "round %d: the batch took %lld draft steps for k <= %d", r, (long long)sb,
                      kmax);
            cr_expect(sa > sb, "round %d: %d sequences one at a time took %lld draft steps, batched %lld", r, busy,
                      (long long)sa, (long long)sb);
        }
        cr_assert_eq(kv_used(A), 0, "round %d: per-sequence draft engine holds %d KV blocks", r, kv_used(A));
        cr_assert_eq(kv_used(B), 0, "round %d: batched draft engine holds %d KV blocks", r, kv_used(B));

        /* The "target": accept a prefix, add a token, feed back; restart
         * sequences that grew too long (release, new id). */
        for (int i = 0; i < TS_N; i++) {
            tseq *t = &ts[i];
            int32_t n = na[i];
            int32_t acc = n > 0 ? (int32_t)(loom_rng_next(rng) % (uint64_t)(n + 1)) : 0;
            for (int32_t d = 0; d < acc; d++) t->toks[t->info.num_tokens++] = da[i][d];
            t->toks[t->info.num_tokens++] = (int32_t)(loom_rng_next(rng) % (uint64_t)w->vocab);
            t->info.num_computed = t->info.num_tokens - 1;
            if (n > 0) {
                draft_ops.observe(A, t->info.id, n, acc);
                draft_ops.observe(B, t->info.id, n, acc);
            }
            if (t->info.num_tokens + TS_KMAX + 2 > w->limit) {
                draft_ops.release(A, t->info.id);
                draft_ops.release(B, t->info.id);
                int32_t m = make_prompt(A, w, rng, prompt);
                seq_start(t, next_id++, prompt, m, rng);
            }
        }
    }
    loom_spec_stats sa = {.struct_size = sizeof sa}, sb = {.struct_size = sizeof sb};
    draft_ops.stats(A, &sa);
    draft_ops.stats(B, &sb);
    cr_expect_eq(sa.proposed, sb.proposed);
    cr_expect_eq(sa.accepted, sb.accepted);
    cr_expect(drafted > 20 && sampled_drafts > 5 && rounds_batched > w->rounds / 2,
              "%s: %lld drafts (%lld sampled), %lld batched rounds: too little exercised", w->yaml,
              (long long)drafted, (long long)sampled_drafts, (long long)rounds_batched);
    cr_expect(qdiff <= 1e-5, "%s: q rows differ by up to %g between batched and per-sequence drafts", w->yaml, qdiff);
    cr_log_info("%s: %lld drafts (%lld sampled) over %d rounds, draft steps %lld per-sequence vs %lld batched, "
                "max |dq| %g",
                w->yaml, (long long)drafted, (long long)sampled_drafts, w->rounds, (long long)A->draft_steps,
                (long long)B->draft_steps, qdiff);
    cr_expect_eq(fake_host_metric("spec.draft-model.requests"), (double)B->requests);
    loom_engine_stats ds = draft_stats_of(B);
    if (w->want_preempt)
        cr_expect(ds.preemptions > 0, "the batched draft engine never preempted: the cache is not small enough");
    else
        cr_expect_eq(ds.preemptions, 0, "the batched draft engine preempted %lld times", (long long)ds.preemptions);
    cr_log_info("%s: batched draft engine: %lld preemptions, peak %d of %d KV blocks", w->yaml,
                (long long)ds.preemptions, ds.kv_blocks_peak, ds.kv_blocks_total);
    free(qa);
    free(qb);
    draft_ops.destroy(A);
    draft_ops.destroy(B);
    cr_expect_eq(fake_host_live_allocs(), 0, "%ld host allocations leaked", fake_host_live_allocs());
}

Test(spec, draft_batch_equals_per_sequence_tiny, .timeout = 120) {
    world w = {.yaml = "tiny.yaml", .overrides = "cache.num_blocks=512", .vocab = 256, .limit = 120,
               .adaptive = true, .rounds = 60, .prompt_min = 4, .prompt_span = 60, .check_steps = true};
    run_world(&w);
}

/* A draft cache that cannot hold every sequence of a batch at once (64
 * blocks of 4 tokens for up to 5 x 120): the draft engine preempts inside
 * the round; still the same drafts and no block left behind. */
Test(spec, draft_batch_small_draft_cache_tiny, .timeout = 120) {
    world w = {.yaml = "tiny.yaml", .overrides = "cache.num_blocks=64", .vocab = 256, .limit = 120,
               .adaptive = false, .rounds = 40, .prompt_min = 30, .prompt_span = 60, .want_preempt = true};
    run_world(&w);
}

Test(spec, draft_batch_equals_per_sequence_real, .timeout = 300) {
    const char *m = getenv("LOOM_TEST_MODEL");
    if (!m || !m[0]) cr_skip_test("LOOM_TEST_MODEL is not set: no real-model draft test");
    world w = {.yaml = "smol.yaml", .overrides = "cache.memory_gib=0.1", .vocab = 49152, .limit = 400,
               .adaptive = true, .rounds = 24, .prompt_min = 0, .prompt_span = 1, .check_steps = true};
    run_world(&w);
}
