/*
 * tests/sampler/test_sampler.c — end-to-end tests of loom-sampler-standard.so.
 *
 * The plugin is dlopen'ed from the path in LOOM_SAMPLER_SO (set by meson),
 * created through the fake host with a config filled from its own declared
 * parameter table, and driven only through loom_sampler_ops: what the engine
 * sees is what is tested.
 *
 * What every sampler owes the contract — tokens in range, raw logprobs and
 * alternatives, the rng moved only by the host, seeds that repeat however
 * rows are batched, probs() a distribution that sample() draws from
 * (chi-square), candidate rows equal to whole rows, no leaks — is the
 * conformance kit's (conformance/cf_sampler.c), run here on this plugin
 * (`conformance_kit`). The tests below pin down this plugin's own policy:
 * the semantics of each knob, its tie rule, its messages. Statistical
 * tests use fixed seeds, so they are deterministic; their chi-square
 * threshold (alpha = 0.001) is also checked to REJECT a deliberately wrong
 * distribution, so a pass means something.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chi2.h"
#include "conformance.h"
#include "fake_host.h"
#include "loom/sampler.h"
#include "plugin/host_rules.h"
#include "loom/engine.h"

/* ------------------------------------------------------------- harness */

static void *g_dl;
static const loom_plugin_desc *g_desc;
static const loom_component *g_comp;
static const loom_sampler_ops *g_ops;
static const loom_host *g_host;
static void *g_self;

/* A config struct filled the way the host would: defaults from the table,
 * then `key` overridden with `value` (INT params only; NULL = none). */
static void *make_config(const char *key, long long value) {
    void *cfg = calloc(1, g_comp->config_size ? g_comp->config_size : 1);
    cr_assert(cfg);
    for (const loom_param *p = g_comp->params; p && p->key; p++) {
        cr_assert_eq(p->type, LOOM_PARAM_INT, "test only fills INT params; %s is not", p->key);
        int64_t v = p->default_value ? strtoll(p->default_value, NULL, 10) : 0;
        if (key && !strcmp(key, p->key)) v = value;
        memcpy((char *)cfg + p->offset, &v, sizeof v);
    }
    return cfg;
}

static void recreate(const char *key, long long value) {
    if (g_self) g_ops->destroy(g_self);
    g_self = NULL;
    void *cfg = make_config(key, value);
    loom_error err = {0};
    loom_status st = g_ops->create(g_host, cfg, &g_self, &err);
    free(cfg);
    cr_assert_eq(st, LOOM_OK, "create: %s", err.message);
}

static void setup(void) {
    const char *path = getenv("LOOM_SAMPLER_SO");
    cr_assert(path && *path, "LOOM_SAMPLER_SO is not set; run through `meson test`");
    g_dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(g_dl, "dlopen(%s): %s", path, dlerror());
    loom_plugin_entry_fn entry;
    *(void **)(&entry) = dlsym(g_dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(entry, "%s does not export %s", path, LOOM_PLUGIN_ENTRY_SYMBOL);
    g_desc = entry();
    cr_assert(g_desc && g_desc->num_components == 1);
    g_comp = &g_desc->components[0];
    g_ops = g_comp->ops;
    g_host = fake_host();
    recreate(NULL, 0);
}

static void teardown(void) {
    if (g_self) g_ops->destroy(g_self);
    g_self = NULL;
    if (g_dl) dlclose(g_dl);
    g_dl = NULL;
}

TestSuite(sampler, .init = setup, .fini = teardown, .timeout = 60);

/* ------------------------------------------------------------- helpers */

static loom_sampling_params params_t(float temperature) {
    loom_sampling_params p = loom_sampling_params_default();
    p.temperature = temperature;
    return p;
}

static loom_sample_row row_of(const loom_sampling_params *p, uint64_t *rng) {
    return (loom_sample_row){.struct_size = sizeof(loom_sample_row), .params = p, .rng_state = rng};
}

/* sample() over n whole rows of x (n, V), as the engine calls it. */
static loom_status call_sample(float *x, int V, const loom_sample_row *rows, int n, loom_sample_out *out,
                               loom_error *err) {
    const loom_sample_row *ptrs[64];
    cr_assert(n <= 64);
    for (int i = 0; i < n; i++) ptrs[i] = &rows[i];
    loom_sample_batch b = {.struct_size = sizeof b, .n = n, .vocab = V, .width = V, .logits = x, .rows = ptrs};
    out->struct_size = sizeof *out;
    return g_ops->sample(g_self, &b, out, err);
}

/* One sample of a copy of `logits` (V): the plugin modifies its input. */
static int32_t sample_row(const float *logits, int V, const loom_sample_row *row, float *lp) {
    float *x = malloc(sizeof(float) * (size_t)V);
    memcpy(x, logits, sizeof(float) * (size_t)V);
    int32_t tok = -7;
    float lpv = 0;
    loom_sample_out out = {.tokens = &tok, .logprobs = &lpv};
    loom_error err = {0};
    loom_status st = call_sample(x, V, row, 1, &out, &err);
    free(x);
    cr_assert_eq(st, LOOM_OK, "sample: %s", err.message);
    cr_assert(tok >= 0 && tok < V, "token %d outside [0, %d)", tok, V);
    if (lp) *lp = lpv;
    return tok;
}

/* probs() of a copy of `logits` into `pr` (V). */
static void probs_row(const float *logits, int V, const loom_sample_row *row, float *pr) {
    memcpy(pr, logits, sizeof(float) * (size_t)V);
    loom_error err = {0};
    loom_status st = g_ops->probs(g_self, pr, V, row, &err);
    cr_assert_eq(st, LOOM_OK, "probs: %s", err.message);
}

/* Reference softmax of logits/T in double (T > 0); -inf entries get 0. */
static void softmax_ref(const float *l, int V, double T, double *p) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++)
        if (l[i] > mx) mx = l[i];
    for (int i = 0; i < V; i++) z += p[i] = isinf(l[i]) ? 0.0 : exp((l[i] - mx) / T);
    for (int i = 0; i < V; i++) p[i] /= z;
}

/* Chi-square at alpha = 0.001 (fixed seeds here): the kit's helpers. */
static double chi2_crit(int df) { return loom_chi2_critical(df, LOOM_CHI2_Z_1E3); }
static double chi2_stat(const long *counts, const double *p, int V, long N, int *df) {
    return loom_chi2_statistic(counts, p, V, N, df);
}

/* Deterministic test data: standard normal logits times `scale`. */
static void random_logits(float *x, int V, uint64_t seed, double scale) {
    uint64_t s[4];
    loom_rng_seed(s, seed);
    for (int i = 0; i < V; i++) {
        double u1 = loom_rng_uniform(s), u2 = loom_rng_uniform(s);
        x[i] = (float)(scale * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
    }
}

typedef struct ref_item {
    double v;
    int id;
} ref_item;

static int ref_cmp(const void *a, const void *b) {
    const ref_item *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* Ids of `l` (V) ranked best first (larger value, then lower id). */
static ref_item *rank_ref(const float *l, int V) {
    ref_item *r = malloc(sizeof *r * (size_t)V);
    for (int i = 0; i < V; i++) r[i] = (ref_item){isnan(l[i]) ? -INFINITY : l[i], i};
    qsort(r, (size_t)V, sizeof *r, ref_cmp);
    return r;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------ the contract */

/* The kit's sampler checks on this plugin; LOOM_TEST_SEED replays a run. */
Test(sampler, conformance_kit, .timeout = 120) {
    loom_conformance_opts o = {.out = stderr, .seed = loom_conformance_default_seed()};
    loom_error err = {0};
    loom_conformance_summary sum;
    loom_status st = loom_conformance_run_component(g_comp, getenv("LOOM_SAMPLER_SO"), &o, &sum, &err);
    cr_assert_eq(st, LOOM_OK, "%s (seed 0x%llx; the lines above say which check)", err.message,
                 (unsigned long long)o.seed);
}

/* ---------------------------------------------------------- descriptor */

Test(sampler, descriptor_and_params) {
    cr_assert_eq(g_desc->abi_major, LOOM_ABI_MAJOR);
    cr_assert_leq(g_desc->abi_minor, LOOM_ABI_MINOR);
    cr_assert_eq(g_desc->build_signature, LOOM_BUILD_SIGNATURE);
    cr_assert_str_eq(g_desc->name, "loom-sampler-standard");
    cr_assert_eq(g_comp->kind, LOOM_KIND_SAMPLER);
    cr_assert_str_eq(g_comp->name, "standard");
    cr_assert(g_comp->summary && *g_comp->summary);
    cr_assert_eq(g_ops->struct_size, sizeof(loom_sampler_ops));
    cr_assert(g_ops->create && g_ops->destroy && g_ops->sample && g_ops->probs);
    const loom_param *p = g_comp->params;
    cr_assert(p && p[0].key);
    cr_assert_str_eq(p[0].key, "max_logprobs");
    cr_assert_str_eq(p[0].default_value, "20");
    cr_assert_eq(p[0].min, 0);
    cr_assert_eq(p[0].max, LOOM_MAX_LOGPROBS);
    cr_assert(p[0].doc && *p[0].doc);
    cr_assert_null(p[1].key, "one parameter only");
    cr_assert_geq(g_comp->config_size, p[0].offset + sizeof(int64_t));
}

/* --------------------------------------------------------------- greedy */

Test(sampler, greedy_is_argmax_with_ties_to_lowest_id) {
    const float l[6] = {1.0f, 5.0f, -2.0f, 5.0f, 4.9f, NAN};
    loom_sampling_params p = params_t(0.0f);
    loom_sample_row row = row_of(&p, NULL); /* greedy needs no rng */
    float lp;
    cr_assert_eq(sample_row(l, 6, &row, &lp), 1);
    float pr[6];
    probs_row(l, 6, &row, pr);
    for (int i = 0; i < 6; i++) cr_assert_eq(pr[i], i == 1 ? 1.0f : 0.0f, "probs[%d] = %g", i, pr[i]);

    /* A greedy row does not consume randomness. */
    uint64_t rng[4], before[4];
    loom_rng_seed(rng, 9);
    memcpy(before, rng, sizeof rng);
    row.rng_state = rng;
    sample_row(l, 6, &row, NULL);
    cr_assert_arr_eq(rng, before, sizeof rng);

    /* All ties: token 0. */
    const float flat[4] = {2, 2, 2, 2};
    cr_assert_eq(sample_row(flat, 4, &row, NULL), 0);
}

/* ----------------------------------------------------------- temperature */

Test(sampler, temperature_matches_softmax_chi_square) {
    enum { V = 8, N = 20000 };
    const float l[V] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, -1.0f};
    const float T = 0.7f;
    loom_sampling_params p = params_t(T);
    uint64_t rng[4];
    loom_rng_seed(rng, 1234);
    loom_sample_row row = row_of(&p, rng);
    long counts[V] = {0};
    for (int i = 0; i < N; i++) counts[sample_row(l, V, &row, NULL)]++;

    double ref[V];
    int df;
    softmax_ref(l, V, T, ref);
    double stat = chi2_stat(counts, ref, V, N, &df), crit = chi2_crit(df);
    cr_log_info("T=%.2f: chi2 = %.2f (df %d, crit %.2f)", T, stat, df, crit);
    cr_assert_lt(stat, crit, "draws do not follow softmax(logits / %g): chi2 %.2f >= %.2f", T, stat,
                 crit);

    /* The same test must reject a wrong temperature, near or far. */
    const double wrong[] = {0.6, 0.8, 1.0};
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
        softmax_ref(l, V, wrong[w], ref);
        double s2 = chi2_stat(counts, ref, V, N, &df);
        cr_log_info("against T=%.2f: chi2 = %.2f", wrong[w], s2);
        cr_assert_gt(s2, crit, "chi-square test cannot tell T=%g from T=%g (%.2f)", T, wrong[w], s2);
    }

    /* probs() is that softmax. */
    float pr[V];
    softmax_ref(l, V, T, ref);
    probs_row(l, V, &row, pr);
    for (int i = 0; i < V; i++) cr_assert_float_eq(pr[i], ref[i], 1e-6);
}

/* ------------------------------------------------------------------ top-k */

Test(sampler, top_k_only_returns_top_k_ids) {
    enum { V = 1000, K = 5 };
    float l[V];
    random_logits(l, V, 77, 1.0);
    ref_item *rk = rank_ref(l, V);
    bool in_top[V] = {0};
    for (int i = 0; i < K; i++) in_top[rk[i].id] = true;

    loom_sampling_params p = params_t(1.5f);
    p.top_k = K;
    uint64_t rng[4];
    loom_rng_seed(rng, 3);
    loom_sample_row row = row_of(&p, rng);
    bool seen[V] = {0};
    for (int i = 0; i < 5000; i++) {
        int t = sample_row(l, V, &row, NULL);
        cr_assert(in_top[t], "token %d is not among the top %d", t, K);
        seen[t] = true;
    }
    for (int i = 0; i < K; i++) cr_assert(seen[rk[i].id], "top-%d token %d never drawn", K, rk[i].id);

    /* probs(): softmax(l/T) over exactly those K. */
    float pr[V];
    probs_row(l, V, &row, pr);
    double z = 0;
    for (int i = 0; i < K; i++) z += exp((rk[i].v - rk[0].v) / 1.5);
    for (int i = 0; i < V; i++) {
        double want = in_top[i] ? exp((l[i] - rk[0].v) / 1.5) / z : 0.0;
        cr_assert_float_eq(pr[i], want, 1e-6, "probs[%d] = %g, want %g", i, pr[i], want);
    }
    free(rk);
}

Test(sampler, top_k_large_k_and_ties) {
    /* k above the heap limit takes the quickselect path. */
    enum { V = 10000, K = 3000 };
    float *l = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
    random_logits(l, V, 99, 2.0);
    ref_item *rk = rank_ref(l, V);
    loom_sampling_params p = params_t(1.0f);
    p.top_k = K;
    loom_sample_row row = row_of(&p, NULL);
    probs_row(l, V, &row, pr);
    int nz = 0;
    for (int i = 0; i < V; i++) nz += pr[i] > 0;
    cr_assert_eq(nz, K);
    for (int i = 0; i < K; i++) cr_assert_gt(pr[rk[i].id], 0.0f, "rank %d (id %d) dropped", i, rk[i].id);

    /* k >= vocab is the same as off. */
    p.top_k = V + 5;
    probs_row(l, V, &row, pr);
    nz = 0;
    for (int i = 0; i < V; i++) nz += pr[i] > 0;
    cr_assert_eq(nz, V);
    free(rk);

    /* Ties at the boundary keep the lower ids. */
    const float flat[5] = {1, 1, 1, 1, 1};
    float fp[5];
    p.top_k = 2;
    probs_row(flat, 5, &row, fp);
    cr_assert_float_eq(fp[0], 0.5f, 1e-7);
    cr_assert_float_eq(fp[1], 0.5f, 1e-7);
    cr_assert_eq(fp[2] + fp[3] + fp[4], 0.0f);
    free(l);
    free(pr);
}

/* A candidate row holding every finite logit (top_k >= the row's finite
 * count, e.g. a small vocabulary) draws the token the whole row draws with
 * the same rng state: both walk the candidates best first. */
Test(sampler, candidate_rows_equal_whole_rows_when_top_k_keeps_all) {
    enum { V = 20 };
    const int32_t ks[] = {V, 25, LOOM_LOGITS_TOPK_MAX};
    for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++) {
        loom_sampling_params p = params_t(0.9f);
        p.top_k = ks[c];
        cr_assert_geq(g_ops->candidates(g_self, &p), 1);
        for (uint64_t seed = 0; seed < 200; seed++) {
            float l[V], vals[V], lse;
            int32_t ids[V];
            random_logits(l, V, 4000 + seed, 2.0);
            loom_logits_topk_row(l, V, V, ids, vals, &lse);
            uint64_t ra[4], rb[4];
            loom_rng_seed(ra, seed);
            loom_rng_seed(rb, seed);
            loom_sample_row rowa = row_of(&p, ra), rowb = row_of(&p, rb);
            int32_t whole = sample_row(l, V, &rowa, NULL), cand = -1;
            const loom_sample_row *ptrs[1] = {&rowb};
            loom_sample_batch b = {.struct_size = sizeof b, .n = 1, .vocab = V, .width = V, .logits = vals,
                                   .rows = ptrs, .candidates = ids, .lse = &lse};
            loom_sample_out out = {.struct_size = sizeof out, .tokens = &cand};
            loom_error err = {0};
            cr_assert_eq(g_ops->sample(g_self, &b, &out, &err), LOOM_OK, "%s", err.message);
            cr_assert_eq(cand, whole, "top_k %d seed %llu: candidate row drew %d, whole row %d", ks[c],
                         (unsigned long long)seed, cand, whole);
        }
    }
}

/* ------------------------------------------------------------------ top-p */

/* logits = log(p) placed at shuffled ids so order != id order. */
static const double k_p4[4] = {0.5, 0.3, 0.15, 0.05};
static const int k_ids4[4] = {2, 0, 3, 1};

static void logits_from_p4(const double *p4, float *l) {
    for (int i = 0; i < 4; i++) l[k_ids4[i]] = (float)log(p4[i]);
}

static void expect_kept(const float *pr, const double *p4, int keep) {
    double z = 0;
    for (int i = 0; i < keep; i++) z += p4[i];
    for (int i = 0; i < 4; i++) {
        double want = i < keep ? p4[i] / z : 0.0;
        cr_assert_float_eq(pr[k_ids4[i]], want, 1e-6, "rank %d: %g, want %g (keep %d)", i,
                           pr[k_ids4[i]], want, keep);
    }
}

Test(sampler, top_p_keeps_minimal_nucleus) {
    float l[4], pr[4];
    logits_from_p4(k_p4, l);
    loom_sampling_params p = params_t(1.0f);
    loom_sample_row row = row_of(&p, NULL);
    const struct {
        float top_p;
        int keep;
    } cases[] = {{0.75f, 2}, {0.85f, 3}, {0.45f, 1}, {1e-6f, 1}, {0.97f, 4}, {1.0f, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_p = cases[c].top_p;
        probs_row(l, 4, &row, pr);
        expect_kept(pr, k_p4, cases[c].keep);
    }
}

/* Large vocab without top-k: the nucleus is found by sorting growing chunks;
 * compare to a full sort in double. */
static void check_big_nucleus(int V, uint64_t seed, double scale, float top_p, float T) {
    float *l = malloc(sizeof(float) * (size_t)V), *pr = malloc(sizeof(float) * (size_t)V);
    random_logits(l, V, seed, scale);
    double *ref = malloc(sizeof(double) * (size_t)V);
    softmax_ref(l, V, T, ref);
    ref_item *rk = rank_ref(l, V);
    int keep = 0;
    double cum = 0, kept = 0;
    while (keep < V && cum < top_p) cum += ref[rk[keep++].id];
    kept = cum;

    loom_sampling_params p = params_t(T);
    p.top_p = top_p;
    loom_sample_row row = row_of(&p, NULL);
    probs_row(l, V, &row, pr);
    int nz = 0;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        nz += pr[i] > 0;
        sum += pr[i];
    }
    cr_log_info("V=%d top_p=%.2f: nucleus %d tokens", V, top_p, keep);
    cr_assert_eq(nz, keep, "nucleus has %d tokens, want %d", nz, keep);
    cr_assert_float_eq(sum, 1.0, 1e-5);
    for (int i = 0; i < keep; i++) {
        int id = rk[i].id;
        cr_assert_float_eq(pr[id], ref[id] / kept, 1e-6 + 1e-4 * ref[id] / kept);
    }
    /* Minimal: dropping the smallest kept token falls below top_p. */
    cr_assert_lt(kept - ref[rk[keep - 1].id], top_p);
    free(rk);
    free(ref);
    free(l);
    free(pr);
}

/* Gemma 3's vocabulary too, peaked (the first weight threshold of
 * std_nucleus_bound holds the mass), in between, and flat (no threshold
 * does: the whole row is ranked). */
Test(sampler, top_p_large_vocab_matches_full_sort) {
    check_big_nucleus(5000, 11, 2.0, 0.9f, 1.0f);
    check_big_nucleus(128256, 12, 1.5, 0.9f, 0.8f);
    check_big_nucleus(128256, 13, 3.0, 0.5f, 1.0f);
    check_big_nucleus(262144, 14, 8.0, 0.95f, 0.7f);
    check_big_nucleus(262144, 15, 2.5, 0.99f, 1.0f);
    check_big_nucleus(262144, 16, 0.05, 0.9f, 1.0f);
}

/* ------------------------------------------------------------------ min-p */

Test(sampler, min_p_threshold_relative_to_max) {
    float l[4], pr[4];
    logits_from_p4(k_p4, l);
    loom_sampling_params p = params_t(1.0f);
    loom_sample_row row = row_of(&p, NULL);
    p.min_p = 0.2f; /* threshold 0.1: keeps .5 .3 .15 */
    probs_row(l, 4, &row, pr);
    expect_kept(pr, k_p4, 3);
    p.min_p = 0.7f; /* threshold 0.35: keeps .5 */
    probs_row(l, 4, &row, pr);
    expect_kept(pr, k_p4, 1);
    p.min_p = 0.05f; /* threshold 0.025: keeps all */
    probs_row(l, 4, &row, pr);
    expect_kept(pr, k_p4, 4);

    /* Order: top-p on the post-top-k distribution, THEN min-p.
     * p = .4 .3 .2 .1, top_p .72 -> {.4 .3 .2}; min_p .4 (>= .16) keeps those.
     * (min-p first would renormalise to .44 .33 .22 and top-p keep two.) */
    const double q[4] = {0.4, 0.3, 0.2, 0.1};
    logits_from_p4(q, l);
    p.min_p = 0.4f;
    p.top_p = 0.72f;
    probs_row(l, 4, &row, pr);
    expect_kept(pr, q, 3);
    p.top_p = 0.65f; /* top-p keeps two, min-p keeps three: two */
    probs_row(l, 4, &row, pr);
    expect_kept(pr, q, 2);
}

/* -------------------------------------------------------------- penalties */

/* logits, history and the hand-computed penalised logits; T = 1 so probs()
 * must be softmax(penalised). */
/* probs() of a fixed row with a prompt and output history, and `nb` logit
 * bias entries, against the softmax of `want` (the adjusted logits). */
static void check_biased(const loom_sampling_params *p, const loom_logit_bias *bias, int32_t nb,
                         const float *want) {
    const float l[6] = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f, -INFINITY};
    const int32_t prompt[3] = {0, 1, 0};
    const int32_t output[4] = {1, 1, 3, 5};
    loom_sample_row row = row_of(p, NULL);
    row.prompt = prompt;
    row.prompt_len = 3;
    row.output = output;
    row.output_len = 4;
    row.logit_bias = bias;
    row.num_logit_bias = nb;
    float pr[6];
    double ref[6];
    probs_row(l, 6, &row, pr);
    softmax_ref(want, 6, 1.0, ref);
    for (int i = 0; i < 6; i++)
        cr_assert_float_eq(pr[i], ref[i], 1e-6, "token %d: %g, want %g", i, pr[i], ref[i]);
}

static void check_penalised(const loom_sampling_params *p, const float *want) { check_biased(p, NULL, 0, want); }

Test(sampler, repetition_penalty_ctrl) {
    loom_sampling_params p = params_t(1.0f);
    p.repetition_penalty = 2.0f;
    /* 0 (prompt, twice: once) 2/2; 1 (prompt+output x3: once) -1*2; 3: 3/2;
     * 5 stays -inf; 2 and 4 untouched. */
    const float want[6] = {1.0f, -2.0f, 0.5f, 1.5f, 1.0f, -INFINITY};
    check_penalised(&p, want);
    p.repetition_penalty = 0.5f; /* < 1 rewards repeats */
    const float want2[6] = {4.0f, -0.5f, 0.5f, 6.0f, 1.0f, -INFINITY};
    check_penalised(&p, want2);
}

Test(sampler, presence_and_frequency_over_output_only) {
    loom_sampling_params p = params_t(1.0f);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    /* output counts: 1 x2, 3 x1; prompt-only token 0 untouched. */
    const float want[6] = {2.0f, -1.0f - 0.5f - 0.5f, 0.5f, 3.0f - 0.5f - 0.25f, 1.0f, -INFINITY};
    check_penalised(&p, want);

    /* All three: repetition first, then presence/frequency. */
    p.repetition_penalty = 2.0f;
    const float want2[6] = {1.0f, -2.0f - 1.0f, 0.5f, 1.5f - 0.75f, 1.0f, -INFINITY};
    check_penalised(&p, want2);

    /* Negative presence rewards tokens already said. */
    p.repetition_penalty = 1.0f;
    p.presence_penalty = -1.0f;
    p.frequency_penalty = 0.0f;
    const float want3[6] = {2.0f, 0.0f, 0.5f, 4.0f, 1.0f, -INFINITY};
    check_penalised(&p, want3);
}

Test(sampler, penalties_change_greedy_choice) {
    const float l[3] = {1.0f, 3.0f, 2.5f};
    const int32_t out1[1] = {1};
    loom_sampling_params p = params_t(0.0f);
    loom_sample_row row = row_of(&p, NULL);
    row.output = out1;
    row.output_len = 1;
    cr_assert_eq(sample_row(l, 3, &row, NULL), 1);
    p.frequency_penalty = 1.0f; /* 3 - 1 = 2 < 2.5 */
    float lp;
    cr_assert_eq(sample_row(l, 3, &row, &lp), 2);
    /* The reported logprob is the model's, not the penalised one. */
    double lse = log(exp(1.0) + exp(3.0) + exp(2.5));
    cr_assert_float_eq(lp, 2.5 - lse, 1e-6);
}

Test(sampler, logit_bias_adds_before_penalties_and_masked_stays_masked) {
    loom_sampling_params p = params_t(1.0f);
    const loom_logit_bias b[3] = {{2, 1.5f}, {4, -3.0f}, {5, 100.0f}};
    /* alone: 2 -> 2.0, 4 -> -2.0, 5 stays -inf */
    const float want[6] = {2.0f, -1.0f, 2.0f, 3.0f, -2.0f, -INFINITY};
    check_biased(&p, b, 3, want);
    /* with repetition 2: the bias first, then the penalty on history tokens
     * only (2 and 4 are in no history: bias alone) */
    const loom_logit_bias b2[2] = {{0, 2.0f}, {1, 3.0f}};
    p.repetition_penalty = 2.0f;
    const float want2[6] = {(2.0f + 2.0f) / 2.0f, (-1.0f + 3.0f) / 2.0f, 0.5f, 1.5f, 1.0f, -INFINITY};
    check_biased(&p, b2, 2, want2);
}

Test(sampler, logit_bias_steers_greedy_and_logprobs_stay_raw) {
    const float l[4] = {1.0f, 3.0f, 2.5f, 0.0f};
    loom_sampling_params p = params_t(0.0f);
    loom_sample_row row = row_of(&p, NULL);
    cr_assert_eq(sample_row(l, 4, &row, NULL), 1);
    const loom_logit_bias ban[1] = {{1, -100.0f}};
    row.logit_bias = ban, row.num_logit_bias = 1;
    float lp;
    cr_assert_eq(sample_row(l, 4, &row, &lp), 2, "-100 bans the argmax");
    const double lse = log(exp(1.0) + exp(3.0) + exp(2.5) + exp(0.0));
    cr_assert_float_eq(lp, 2.5 - lse, 1e-6, "the logprob is the model's raw one");
    const loom_logit_bias force[1] = {{3, 100.0f}};
    row.logit_bias = force;
    cr_assert_eq(sample_row(l, 4, &row, NULL), 3, "+100 all but forces a token");
    /* sampled: +100 on token 0 makes every other token negligible */
    loom_sampling_params pt = params_t(1.0f);
    loom_sample_row rt = row_of(&pt, NULL);
    const loom_logit_bias f0[1] = {{0, 100.0f}};
    rt.logit_bias = f0, rt.num_logit_bias = 1;
    float pr[4];
    probs_row(l, 4, &rt, pr);
    cr_assert_gt(pr[0], 0.999999f);
}

/* sample() on a copy of l (V <= 8); check() must agree with it. */
static loom_status check_row_status(const float *l, int V, const loom_sample_row *row, loom_error *e) {
    float x[8];
    cr_assert(V <= 8);
    memcpy(x, l, sizeof(float) * (size_t)V);
    int32_t tok = -5;
    loom_sample_out out = {.tokens = &tok};
    const loom_status st = call_sample(x, V, row, 1, &out, e);
    if (st != LOOM_OK) cr_assert_eq(tok, -5, "output written on failure");
    loom_error e2 = {0};
    cr_assert_eq(g_ops->check(g_self, row, V, &e2), st, "check() and sample() disagree: %s", e2.message);
    return st;
}

Test(sampler, logit_bias_out_of_range_is_rejected_by_name) {
    const float l[4] = {1.0f, 3.0f, 2.5f, 0.0f};
    loom_sampling_params p = params_t(0.0f);
    const loom_logit_bias bad[4][1] = {{{4, 1.0f}}, {{-1, 1.0f}}, {{0, 100.5f}}, {{0, NAN}}};
    for (int i = 0; i < 4; i++) {
        loom_sample_row row = row_of(&p, NULL);
        row.logit_bias = bad[i], row.num_logit_bias = 1;
        loom_error e = {0};
        cr_assert_eq(check_row_status(l, 4, &row, &e), LOOM_ERR_INVALID, "case %d", i);
        cr_assert(strstr(e.message, "logit_bias[0]"), "case %d: %s", i, e.message);
    }
    loom_sample_row row = row_of(&p, NULL);
    row.num_logit_bias = 2; /* with a NULL array */
    loom_error e = {0};
    cr_assert_eq(check_row_status(l, 4, &row, &e), LOOM_ERR_INVALID);
    cr_assert(strstr(e.message, "num_logit_bias"), "%s", e.message);
}

/* ------------------------------------------------------------------ seeds */

/* --------------------------------------------------------------- logprobs */

Test(sampler, logprobs_are_raw_log_softmax_and_top_n_sorted) {
    enum { V = 1000, R = 2 };
    float l[R][V];
    random_logits(l[0], V, 31, 2.0);
    random_logits(l[1], V, 32, 2.0);
    l[0][7] = NAN;
    l[0][8] = -INFINITY;
    l[1][3] = l[1][4] = 9.0f; /* a tie at the top: lower id first */

    /* Reference log-softmax in double, NaN as -inf. */
    double lse[R];
    ref_item *rk[R];
    for (int r = 0; r < R; r++) {
        double mx = -INFINITY, z = 0;
        for (int i = 0; i < V; i++)
            if (!isnan(l[r][i]) && l[r][i] > mx) mx = l[r][i];
        for (int i = 0; i < V; i++)
            if (!isnan(l[r][i]) && !isinf(l[r][i])) z += exp(l[r][i] - mx);
        lse[r] = mx + log(z);
        rk[r] = rank_ref(l[r], V);
    }

    /* Row 0 samples with penalties on likely tokens; row 1 greedy, 5 alts. */
    int32_t hist[4] = {rk[0][0].id, rk[0][1].id, rk[0][2].id, rk[0][1].id};
    loom_sampling_params p0 = params_t(0.8f), p1 = params_t(0.0f);
    p0.top_k = 40;
    p0.repetition_penalty = 0.7f; /* boosts the history: chosen tokens are often penalised ones */
    p0.presence_penalty = 0.2f;
    p0.frequency_penalty = 0.1f;
    p0.logprobs = 20;
    p1.logprobs = 5;
    uint64_t rng[4];
    loom_rng_seed(rng, 8);
    loom_sample_row rows[R] = {row_of(&p0, rng), row_of(&p1, NULL)};
    rows[0].prompt = hist;
    rows[0].prompt_len = 2;
    rows[0].output = hist + 2;
    rows[0].output_len = 2;

    int penalised_hits = 0;
    for (int it = 0; it < 50; it++) {
        float x[R * V];
        memcpy(x, l, sizeof x);
        int32_t toks[R], ids[R * LOOM_MAX_LOGPROBS];
        float lps[R], tlp[R * LOOM_MAX_LOGPROBS];
        loom_sample_out out = {.tokens = toks, .logprobs = lps, .top_ids = ids, .top_logprobs = tlp};
        loom_error err = {0};
        cr_assert_eq(call_sample(x, V, rows, R, &out, &err), LOOM_OK, "%s", err.message);
        for (int r = 0; r < R; r++) {
            int t = toks[r];
            cr_assert_float_eq(lps[r], l[r][t] - lse[r], 1e-5, "row %d token %d: %g, want %g", r, t,
                               lps[r], l[r][t] - lse[r]);
            int want_n = r == 0 ? 20 : 5;
            for (int i = 0; i < LOOM_MAX_LOGPROBS; i++) {
                const int32_t *id = &ids[r * LOOM_MAX_LOGPROBS + i];
                const float *v = &tlp[r * LOOM_MAX_LOGPROBS + i];
                if (i >= want_n) {
                    cr_assert_eq(*id, -1);
                    cr_assert(isinf(*v) && *v < 0);
                    continue;
                }
                cr_assert_eq(*id, rk[r][i].id, "row %d alt %d: id %d, want %d", r, i, *id,
                             rk[r][i].id);
                cr_assert_float_eq(*v, rk[r][i].v - lse[r], 1e-5);
                if (i) cr_assert_leq(*v, v[-1]);
            }
        }
        cr_assert_eq(toks[1], 3, "greedy tie must pick id 3");
        for (int h = 0; h < 4; h++) penalised_hits += toks[0] == hist[h];
    }
    cr_assert_gt(penalised_hits, 0, "no draw hit a penalised token; the test lost its point");
    free(rk[0]);
    free(rk[1]);
}

Test(sampler, max_logprobs_config_bounds_requests) {
    recreate("max_logprobs", 10);
    float l[30];
    random_logits(l, 30, 4, 1.0);
    loom_sampling_params p = params_t(0.0f);
    p.logprobs = 10;
    loom_sample_row row = row_of(&p, NULL);
    sample_row(l, 30, &row, NULL);
    p.logprobs = 11;
    int32_t tok;
    loom_sample_out out = {.tokens = &tok};
    loom_error err = {0};
    cr_assert_eq(call_sample(l, 30, &row, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "logprobs = 11"), "%s", err.message);
    cr_assert(strstr(err.message, "10"), "%s", err.message);
}

/* ------------------------------------------------------- probs vs sample */

/* Naive reference of the whole pipeline (steps 2-8 of standard.c): full
 * sort, prefixes, double precision. */
static void naive_probs(const float *l0, int V, const loom_sample_row *row, double *out) {
    const loom_sampling_params *p = row->params;
    float *l = malloc(sizeof(float) * (size_t)V);
    int *cnt = calloc((size_t)V, sizeof(int));
    bool *rep = calloc((size_t)V, sizeof(bool));
    memcpy(l, l0, sizeof(float) * (size_t)V);
    for (int i = 0; i < row->output_len; i++) cnt[row->output[i]]++, rep[row->output[i]] = true;
    for (int i = 0; i < row->prompt_len; i++) rep[row->prompt[i]] = true;
    for (int t = 0; t < V; t++) {
        double v = l[t];
        if (rep[t] && p->repetition_penalty != 1.0f)
            v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
        if (cnt[t]) v -= p->presence_penalty + (double)p->frequency_penalty * cnt[t];
        l[t] = (float)v;
    }
    ref_item *rk = rank_ref(l, V);
    for (int i = 0; i < V; i++) out[i] = 0;
    int n = 0;
    while (n < V && !isinf(rk[n].v)) n++;
    if (p->temperature == 0) {
        out[rk[0].id] = 1;
        goto done;
    }
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double *w = malloc(sizeof(double) * (size_t)n), z = 0;
    for (int i = 0; i < n; i++) z += w[i] = exp((rk[i].v - rk[0].v) / p->temperature);
    int keep = n;
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++)
            if ((cum += w[i]) >= p->top_p * z) {
                keep = i + 1;
                break;
            }
    }
    for (int i = 0; i < keep; i++)
        if (w[i] < p->min_p) keep = i; /* w = p / p_max; prefix */
    double zk = 0;
    for (int i = 0; i < keep; i++) zk += w[i];
    for (int i = 0; i < keep; i++) out[rk[i].id] = w[i] / zk;
    free(w);
done:
    free(rk);
    free(rep);
    free(cnt);
    free(l);
}

Test(sampler, probs_match_naive_reference_on_random_cases) {
    uint64_t s[4];
    loom_rng_seed(s, 31337);
    int checked = 0;
    for (int c = 0; c < 300; c++) {
        int V = 1 + (int)(loom_rng_uniform(s) * (c % 3 == 0 ? 5000 : 60));
        float *l = malloc(sizeof(float) * (size_t)V), *pr = malloc(sizeof(float) * (size_t)V);
        double *ref = malloc(sizeof(double) * (size_t)V);
        random_logits(l, V, 7000 + (uint64_t)c, 2.0);
        for (int i = 0; i < V; i++) {
            l[i] = roundf(l[i] * 4) / 4; /* many ties */
            if (loom_rng_uniform(s) < 0.05) l[i] = (c & 1) ? NAN : -INFINITY;
        }
        l[(int)(loom_rng_uniform(s) * V)] = 1.0f; /* at least one finite */
        int32_t hist[16];
        for (int i = 0; i < 16; i++) hist[i] = (int32_t)(loom_rng_uniform(s) * V);
        loom_sampling_params p = params_t(loom_rng_uniform(s) < 0.1 ? 0.0f
                                                                    : (float)(0.2 + 1.5 * loom_rng_uniform(s)));
        double u = loom_rng_uniform(s);
        p.top_k = u < 0.3 ? 0 : u < 0.7 ? 1 + (int)(loom_rng_uniform(s) * 40)
                                        : 1000 + (int)(loom_rng_uniform(s) * 3000);
        p.top_p = loom_rng_uniform(s) < 0.3 ? 1.0f : (float)(0.05 + 0.94 * loom_rng_uniform(s));
        p.min_p = loom_rng_uniform(s) < 0.5 ? 0.0f : (float)(0.3 * loom_rng_uniform(s));
        if (loom_rng_uniform(s) < 0.5) {
            p.repetition_penalty = (float)(0.5 + loom_rng_uniform(s));
            p.presence_penalty = (float)(loom_rng_uniform(s) - 0.5);
            p.frequency_penalty = (float)(loom_rng_uniform(s) - 0.3);
        }
        loom_sample_row row = row_of(&p, NULL);
        row.prompt = hist;
        row.prompt_len = 8;
        row.output = hist + 8;
        row.output_len = 8;
        probs_row(l, V, &row, pr);
        naive_probs(l, V, &row, ref);
        double sum = 0;
        for (int i = 0; i < V; i++) {
            cr_assert_eq(pr[i] > 0, ref[i] > 0,
                         "case %d (V %d, T %g, k %d, p %g, min_p %g): token %d kept %d vs ref %d",
                         c, V, p.temperature, p.top_k, p.top_p, p.min_p, i, pr[i] > 0, ref[i] > 0);
            cr_assert_float_eq(pr[i], ref[i], 1e-5, "case %d token %d: %g vs %g", c, i, pr[i], ref[i]);
            sum += pr[i];
        }
        cr_assert_float_eq(sum, 1.0, 1e-5, "case %d", c);
        checked++;
        free(l);
        free(pr);
        free(ref);
    }
    cr_assert_eq(checked, 300);
}

/* ---------------------------------------------------------- bad input */

Test(sampler, invalid_params_are_rejected_by_name) {
    const float l[4] = {0, 1, 2, 3};
    const struct {
        const char *name;
        int field;
        double v;
    } cases[] = {
        {"temperature", 0, -1.0},        {"temperature", 0, NAN},
        {"temperature", 0, INFINITY},    {"top_k", 1, -1},
        {"top_p", 2, 0.0},               {"top_p", 2, 1.5},
        {"top_p", 2, NAN},               {"min_p", 3, -0.1},
        {"min_p", 3, 1.5},               {"repetition_penalty", 4, 0.0},
        {"repetition_penalty", 4, -1.0}, {"repetition_penalty", 4, INFINITY},
        {"presence_penalty", 5, NAN},    {"frequency_penalty", 6, -INFINITY},
        {"logprobs", 7, -1},             {"logprobs", 7, 21},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        loom_sampling_params p = params_t(1.0f);
        switch (cases[c].field) {
        case 0: p.temperature = (float)cases[c].v; break;
        case 1: p.top_k = (int32_t)cases[c].v; break;
        case 2: p.top_p = (float)cases[c].v; break;
        case 3: p.min_p = (float)cases[c].v; break;
        case 4: p.repetition_penalty = (float)cases[c].v; break;
        case 5: p.presence_penalty = (float)cases[c].v; break;
        case 6: p.frequency_penalty = (float)cases[c].v; break;
        case 7: p.logprobs = (int32_t)cases[c].v; break;
        }
        uint64_t rng[4], before[4];
        loom_rng_seed(rng, 1);
        memcpy(before, rng, sizeof rng);
        loom_sample_row row = row_of(&p, rng);
        float x[4];
        memcpy(x, l, sizeof x);
        int32_t tok = -5;
        loom_sample_out out = {.tokens = &tok};
        loom_error err = {0};
        cr_assert_eq(call_sample(x, 4, &row, 1, &out, &err), LOOM_ERR_INVALID,
                     "%s = %g accepted", cases[c].name, cases[c].v);
        cr_assert_eq(err.code, LOOM_ERR_INVALID);
        cr_assert(strstr(err.message, cases[c].name), "message does not name %s: %s",
                  cases[c].name, err.message);
        cr_assert_eq(tok, -5, "output written on failure");
        cr_assert_arr_eq(rng, before, sizeof rng, "rng advanced on failure");
        loom_error err2 = {0};
        cr_assert_eq(g_ops->probs(g_self, x, 4, &row, &err2), LOOM_ERR_INVALID);
        cr_assert(strstr(err2.message, cases[c].name), "%s", err2.message);
    }
}

Test(sampler, bad_rows_are_rejected) {
    float x[8] = {0, 1, 2, 3, NAN, NAN, -INFINITY, NAN};
    loom_sampling_params p = params_t(1.0f);
    uint64_t rng[2][4], before[4];
    loom_rng_seed(rng[0], 1);
    loom_rng_seed(rng[1], 2);
    memcpy(before, rng[0], sizeof before);
    loom_sample_row rows[2] = {row_of(&p, rng[0]), row_of(&p, rng[1])};
    int32_t toks[2] = {-5, -5};
    loom_sample_out out = {.tokens = toks};
    loom_error err = {0};

    /* Row 1 is all NaN / -inf: rejected, row 0 left alone. */
    cr_assert_eq(call_sample(x, 4, rows, 2, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "all logits are NaN or -inf in row 1"), "%s", err.message);
    cr_assert_eq(toks[0], -5);
    cr_assert_arr_eq(rng[0], before, sizeof before);
    float y[4] = {NAN, NAN, NAN, NAN};
    cr_assert_eq(g_ops->probs(g_self, y, 4, &rows[0], &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "all logits are NaN or -inf in row 0"), "%s", err.message);

    /* vocab <= 0. */
    cr_assert_eq(call_sample(x, 0, rows, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "vocab"), "%s", err.message);
    cr_assert_eq(g_ops->probs(g_self, x, -3, rows, &err), LOOM_ERR_INVALID);

    /* +inf logit. */
    float z[3] = {0, INFINITY, 1};
    cr_assert_eq(call_sample(z, 3, rows, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "+inf"), "%s", err.message);

    /* A sampled (T > 0) row needs rng state. */
    loom_sample_row norng = row_of(&p, NULL);
    float w[3] = {0, 1, 2};
    cr_assert_eq(call_sample(w, 3, &norng, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "rng_state"), "%s", err.message);

    /* History outside the vocabulary, when a penalty reads it. */
    const int32_t bad[2] = {1, 3};
    p.repetition_penalty = 1.1f;
    loom_sample_row hrow = row_of(&p, rng[0]);
    hrow.prompt = bad;
    hrow.prompt_len = 2;
    cr_assert_eq(call_sample(w, 3, &hrow, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "prompt[1] = 3"), "%s", err.message);

    /* NULL params, a row without struct_size, negative n. */
    loom_sample_row nop = {.struct_size = sizeof nop, .params = NULL};
    cr_assert_eq(call_sample(w, 3, &nop, 1, &out, &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "params"), "%s", err.message);
    loom_sample_row old = {.params = &p};
    cr_assert_eq(call_sample(w, 3, &old, 1, &out, &err), LOOM_ERR_ABI);
    cr_assert_eq(call_sample(w, 3, rows, -1, &out, &err), LOOM_ERR_INVALID);
    cr_assert_eq(call_sample(w, 3, rows, 0, &out, &err), LOOM_OK, "n = 0 is a no-op");
}

Test(sampler, nan_logits_count_as_minus_inf) {
    const float l[5] = {NAN, 1.0f, NAN, 0.5f, -INFINITY};
    loom_sampling_params p = params_t(1.0f);
    uint64_t rng[4];
    loom_rng_seed(rng, 77);
    loom_sample_row row = row_of(&p, rng);
    for (int i = 0; i < 2000; i++) {
        int t = sample_row(l, 5, &row, NULL);
        cr_assert(t == 1 || t == 3, "drew token %d", t);
    }
    float pr[5];
    probs_row(l, 5, &row, pr);
    cr_assert_eq(pr[0] + pr[2] + pr[4], 0.0f);
    cr_assert_float_eq(pr[1], 1.0 / (1.0 + exp(-0.5)), 1e-6);
}

/* ----------------------------------------------------------- performance */

Test(sampler, vocab_128k_is_fast) {
    enum { V = 128256, R = 8 };
    float *l = malloc(sizeof(float) * V * R), *x = malloc(sizeof(float) * V * R);
    for (int r = 0; r < R; r++) random_logits(l + (size_t)r * V, V, 900 + (uint64_t)r, 3.0);
    int32_t hist[512];
    for (int i = 0; i < 512; i++) hist[i] = (i * 7919) % V;

    const struct {
        const char *what;
        int top_k;
        float top_p, min_p, rep;
        int logprobs;
    } cfgs[] = {
        {"top_k=50 top_p=0.9 rep=1.1 logprobs=20", 50, 0.9f, 0.0f, 1.1f, 20},
        {"top_k=50 top_p=0.9", 50, 0.9f, 0.0f, 1.0f, 0},
        {"top_p=0.9 (no top_k)", 0, 0.9f, 0.0f, 1.0f, 0},
        {"min_p=0.05", 0, 1.0f, 0.05f, 1.0f, 0},
        {"plain temperature", 0, 1.0f, 0.0f, 1.0f, 0},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        loom_sampling_params p = params_t(0.8f);
        p.top_k = cfgs[c].top_k;
        p.top_p = cfgs[c].top_p;
        p.min_p = cfgs[c].min_p;
        p.repetition_penalty = cfgs[c].rep;
        p.logprobs = cfgs[c].logprobs;
        uint64_t rng[R][4];
        loom_sample_row rows[R];
        for (int r = 0; r < R; r++) {
            loom_rng_seed(rng[r], (uint64_t)r);
            rows[r] = row_of(&p, rng[r]);
            rows[r].prompt = hist;
            rows[r].prompt_len = 512;
        }
        int32_t toks[R], ids[R * LOOM_MAX_LOGPROBS];
        float lps[R], tlp[R * LOOM_MAX_LOGPROBS];
        loom_sample_out out = {.tokens = toks, .logprobs = lps, .top_ids = ids, .top_logprobs = tlp};
        loom_error err = {0};
        const int reps = 3;
        double best = INFINITY;
        for (int k = 0; k < reps; k++) {
            memcpy(x, l, sizeof(float) * V * R);
            double t0 = now_ms();
            cr_assert_eq(call_sample(x, V, rows, R, &out, &err), LOOM_OK, "%s",
                         err.message);
            double dt = now_ms() - t0;
            if (dt < best) best = dt;
        }
        printf("sampler 'standard' vocab %d, %-40s %.3f ms/row\n", V, cfgs[c].what, best / R);
        cr_log_info("vocab %d, %s: %.3f ms/row", V, cfgs[c].what, best / R);
    }
    /* probs() on the same data sums to one. */
    loom_sampling_params p = params_t(0.8f);
    p.top_k = 50;
    p.top_p = 0.9f;
    loom_sample_row row = row_of(&p, NULL);
    probs_row(l, V, &row, x);
    double sum = 0;
    int nz = 0;
    for (int i = 0; i < V; i++) {
        sum += x[i];
        nz += x[i] > 0;
    }
    cr_assert_float_eq(sum, 1.0, 1e-5);
    cr_assert(nz >= 1 && nz <= 50, "%d tokens survive top_k=50", nz);
    free(l);
    free(x);
}
