/*
 * tests/spec/test_ngram.c — the ngram speculator without the engine (suite
 * 'spec'): the suffix matcher, the per-sequence table, the adaptive k rule
 * (shrinks on rejections, turns a hopeless sequence off and probes it
 * again, grows back), the batch-size cut-off, stats and metrics, and no
 * leaked allocations — all through a fake host (tests/common/fake_host.h).
 * ngram.c is compiled into this program (its symbols are hidden in the .so).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "fake_host.h"
#include "ngram.h"
#include "plugin/host_rules.h"

static loom_ngram_config cfg_default(void) {
    loom_ngram_config c = {.num_draft_tokens = 4, .min_ngram = 1, .max_ngram = 3,
                           .search = LOOM_NGRAM_SEARCH_CONTEXT, .adaptive = true, .max_batch = 16};
    return c;
}

static void *make(const loom_host *h, loom_ngram_config c) {
    void *self = NULL;
    loom_error err = {0};
    cr_assert_eq(loom_ngram_ops.create(h, &c, &self, &err), LOOM_OK, "%s", err.message);
    loom_spec_init si = {sizeof si, 256, ".", 1024, NULL};
    cr_assert_eq(loom_ngram_ops.init(self, &si, &err), LOOM_OK, "%s", err.message);
    return self;
}

static loom_seq_info seq_of(loom_seq_id id, const int32_t *t, int32_t n, int32_t prompt) {
    loom_seq_info s = {.struct_size = sizeof s, .id = id, .num_prompt_tokens = prompt, .num_tokens = n,
                       .num_computed = n - 1, .max_total_tokens = 4096, .tokens = t};
    return s;
}

Test(spec, ngram_match_longest_most_recent) {
    /*                 0  1  2  3  4  5  6  7  8  9 10 11 12 */
    int32_t t[] = {1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 1, 2, 3};
    int32_t d[8], n, len;
    /* suffix (1 2 3) occurs at 0 -> continuation 9 9 2 3 */
    n = loom_ngram_match(t, 13, 12, 1, 3, 4, d, &len);
    cr_assert_eq(n, 4);
    cr_assert_eq(len, 3);
    cr_assert(d[0] == 9 && d[1] == 9 && d[2] == 2 && d[3] == 3);
    /* max_ngram 2: suffix (2 3), most recent earlier occurrence at 5 -> 7 8 5 */
    n = loom_ngram_match(t, 13, 12, 1, 2, 3, d, &len);
    cr_assert_eq(n, 3);
    cr_assert_eq(len, 2);
    cr_assert(d[0] == 7 && d[1] == 8 && d[2] == 5);
    /* prompt-only search ending at 5: (2 3) occurs at 1 only -> 9 9 */
    n = loom_ngram_match(t, 13, 5, 2, 2, 2, d, &len);
    cr_assert_eq(n, 2);
    cr_assert(d[0] == 9 && d[1] == 9);
    /* continuation shorter than k is cut at the end of the context */
    int32_t u[] = {4, 5, 6, 4};
    n = loom_ngram_match(u, 4, 3, 1, 3, 4, d, &len);
    cr_assert_eq(n, 3);
    cr_assert(d[0] == 5 && d[1] == 6 && d[2] == 4);
    /* no match; min_ngram above what matches */
    int32_t w[] = {1, 2, 3, 4};
    cr_assert_eq(loom_ngram_match(w, 4, 3, 1, 3, 4, d, &len), 0);
    cr_assert_eq(len, 0);
    int32_t x[] = {1, 2, 7, 2};
    cr_assert_eq(loom_ngram_match(x, 4, 3, 2, 3, 4, d, &len), 0);
    cr_assert_eq(loom_ngram_match(x, 4, 3, 1, 3, 4, d, &len), 2);
    /* degenerate inputs */
    cr_assert_eq(loom_ngram_match(x, 1, 0, 1, 3, 4, d, &len), 0);
    cr_assert_eq(loom_ngram_match(x, 4, 3, 1, 3, 0, d, &len), 0);
    /* a run of one token matches itself one step back */
    int32_t r[] = {6, 6, 6, 6, 6};
    cr_assert_eq(loom_ngram_match(r, 5, 4, 1, 3, 4, d, &len), 1);
    cr_assert_eq(len, 3);
}

Test(spec, ngram_match_against_brute_force) {
    uint64_t rng[4];
    loom_rng_seed(rng, 5);
    for (int iter = 0; iter < 3000; iter++) {
        int32_t t[64], d[8], e[8];
        int32_t n = 2 + (int32_t)(loom_rng_next(rng) % 60), V = 2 + (int32_t)(loom_rng_next(rng) % 6);
        for (int i = 0; i < n; i++) t[i] = (int32_t)(loom_rng_next(rng) % (uint64_t)V);
        int32_t minn = 1 + (int32_t)(loom_rng_next(rng) % 2), maxn = minn + (int32_t)(loom_rng_next(rng) % 3);
        int32_t k = 1 + (int32_t)(loom_rng_next(rng) % 6);
        int32_t se = (int32_t)(loom_rng_next(rng) % (uint64_t)n);
        int32_t len, got = loom_ngram_match(t, n, se, minn, maxn, k, d, &len);
        /* brute force: longest n first, then the largest start */
        int32_t want = 0, wlen = 0;
        int32_t end = se < n - 1 ? se : n - 1;
        for (int32_t g = maxn; g >= minn && !wlen; g--) {
            if (g > end) continue;
            for (int32_t j = end - g; j >= 0; j--) {
                if (memcmp(t + j, t + n - g, (size_t)g * sizeof(int32_t))) continue;
                int32_t av = n - (j + g);
                want = av < k ? av : k;
                memcpy(e, t + j + g, (size_t)want * sizeof(int32_t));
                wlen = g;
                break;
            }
        }
        cr_assert_eq(got, want, "iter %d: %d drafts, expected %d", iter, got, want);
        cr_assert_eq(len, wlen, "iter %d", iter);
        cr_assert(memcmp(d, e, (size_t)got * sizeof(int32_t)) == 0, "iter %d: drafts differ", iter);
    }
}

Test(spec, ngram_propose_and_stats) {
    const loom_host *h = fake_host();
    void *s = make(h, cfg_default());
    int32_t t[] = {10, 11, 12, 13, 14, 15, 10, 11};
    loom_seq_info si = seq_of(1, t, 8, 8);
    int32_t d[8], qv = 7;
    float q[8];
    cr_assert_eq(loom_ngram_ops.plan(s, 1), 4);
    int32_t n = loom_ngram_ops.propose(s, &si, NULL, 4, d, q, &qv);
    cr_assert_eq(n, 4);
    cr_assert_eq(qv, 0, "ngram drafts are deterministic: q_valid 0");
    cr_assert(d[0] == 12 && d[1] == 13 && d[2] == 14 && d[3] == 15);
    /* the core's cap wins over k */
    cr_assert_eq(loom_ngram_ops.propose(s, &si, NULL, 2, d, q, &qv), 2);
    loom_ngram_ops.observe(s, 1, 4, 3);
    loom_spec_stats st = {.struct_size = sizeof st};
    loom_ngram_ops.stats(s, &st);
    cr_assert_eq(st.proposed, 6);
    cr_assert_eq(st.accepted, 3);
    cr_assert_float_eq(fake_host_metric("spec.acceptance_rate"), 0.75, 1e-9);
    cr_assert_float_eq(fake_host_metric("spec.ngram.k.4"), 1, 1e-9);
    cr_assert_float_eq(fake_host_metric("spec.ngram.k.2"), 1, 1e-9);
    /* large batches: off, counted */
    cr_assert_eq(loom_ngram_ops.plan(s, 17), 0);
    cr_assert_eq(loom_ngram_ops.plan(s, 16), 4);
    loom_ngram_ops.stats(s, &st);
    cr_assert_eq(st.steps_off, 1);
    cr_assert_float_eq(fake_host_metric("spec.ngram.steps_off"), 1, 1e-9);
    loom_ngram_ops.release(s, 1);
    loom_ngram_ops.release(s, 12345); /* unknown: ignored */
    loom_ngram_ops.destroy(s);
    cr_assert_eq(fake_host_live_allocs(), 0, "leaked %ld allocations", fake_host_live_allocs());
}

/* max_verify_tokens: k shrinks with the batch, off when no draft fits. */
Test(spec, ngram_verify_budget) {
    const loom_host *h = fake_host();
    loom_ngram_config c = cfg_default();
    c.max_verify_tokens = 16;
    c.max_batch = 0;
    void *s = make(h, c);
    cr_assert_eq(loom_ngram_ops.plan(s, 1), 4);
    cr_assert_eq(loom_ngram_ops.plan(s, 4), 3);
    cr_assert_eq(loom_ngram_ops.plan(s, 8), 1);
    cr_assert_eq(loom_ngram_ops.plan(s, 9), 0);
    cr_assert_eq(loom_ngram_ops.plan(s, 1000), 0);
    loom_spec_stats st = {.struct_size = sizeof st};
    loom_ngram_ops.stats(s, &st);
    cr_assert_eq(st.steps_off, 2);
    loom_ngram_ops.destroy(s);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(spec, ngram_prompt_search_ignores_output) {
    const loom_host *h = fake_host();
    loom_ngram_config c = cfg_default();
    c.search = LOOM_NGRAM_SEARCH_PROMPT;
    void *s = make(h, c);
    /* prompt 1 2 3 4; output 5 6 5: "5" occurs only in the output */
    int32_t t[] = {1, 2, 3, 4, 5, 6, 5};
    loom_seq_info si = seq_of(3, t, 7, 4);
    int32_t d[4], qv;
    cr_assert_eq(loom_ngram_ops.propose(s, &si, NULL, 4, d, NULL, &qv), 0);
    c.search = LOOM_NGRAM_SEARCH_CONTEXT;
    void *s2 = make(h, c);
    cr_assert_eq(loom_ngram_ops.propose(s2, &si, NULL, 4, d, NULL, &qv), 2);
    loom_ngram_ops.destroy(s);
    loom_ngram_ops.destroy(s2);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* k follows acceptance: shrinks to 1, turns off after a streak of zero
 * acceptance, probes after the backoff, comes back on a good probe. */
Test(spec, ngram_adaptive_k) {
    const loom_host *h = fake_host();
    void *s = make(h, cfg_default());
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = i % 5; /* periodic: always matches with a long continuation */
    loom_seq_info si = seq_of(7, t, 40, 10);
    int32_t d[8], qv;
    cr_assert_eq(loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv), 4, "starts optimistic at k max");
    int32_t last = 4, steps = 0;
    /* Reject everything: k falls, then the sequence turns off. */
    for (;;) {
        int32_t n = loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv);
        if (n == 0) break;
        cr_assert(n <= last, "k must not grow while everything is rejected (%d after %d)", n, last);
        last = n;
        loom_ngram_ops.observe(s, 7, n, 0);
        cr_assert(++steps < 50, "never turned off");
    }
    cr_assert_eq(last, 1, "k should reach 1 before turning off");
    /* Off: the backoff (8 calls, the first of which returned 0 above). */
    int32_t zeros = 1;
    int32_t n;
    while ((n = loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv)) == 0) {
        zeros++;
        cr_assert(zeros < 100, "never probed");
    }
    cr_assert_eq(zeros, 8, "off for %d calls, expected 8", zeros);
    cr_assert_eq(n, 2, "probe with k = 2");
    /* A failed probe doubles the backoff. */
    loom_ngram_ops.observe(s, 7, n, 0);
    zeros = 0;
    while ((n = loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv)) == 0) zeros++;
    cr_assert_eq(zeros, 16);
    /* A good probe turns it back on, and full acceptance grows k to max. */
    loom_ngram_ops.observe(s, 7, n, n);
    for (int i = 0; i < 10; i++) {
        n = loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv);
        cr_assert(n > 0);
        loom_ngram_ops.observe(s, 7, n, n);
    }
    cr_assert_eq(n, 4);
    /* Non-adaptive: always k max. */
    loom_ngram_config c = cfg_default();
    c.adaptive = false;
    void *s2 = make(h, c);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(loom_ngram_ops.propose(s2, &si, NULL, 8, d, NULL, &qv), 4);
        loom_ngram_ops.observe(s2, 7, 4, 0);
    }
    loom_ngram_ops.destroy(s);
    loom_ngram_ops.destroy(s2);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

/* Many sequences in and out of the table: state stays per sequence. */
Test(spec, ngram_table_many_sequences) {
    const loom_host *h = fake_host();
    void *s = make(h, cfg_default());
    int32_t t[20];
    for (int i = 0; i < 20; i++) t[i] = i % 4;
    int32_t d[8], qv;
    uint64_t rng[4];
    loom_rng_seed(rng, 9);
    bool live[600] = {0};
    for (int iter = 0; iter < 20000; iter++) {
        loom_seq_id id = (loom_seq_id)(loom_rng_next(rng) % 600);
        if (live[id] && loom_rng_next(rng) % 3 == 0) {
            loom_ngram_ops.release(s, id);
            live[id] = false;
            continue;
        }
        loom_seq_info si = seq_of(id, t, 20, 5);
        int32_t n = loom_ngram_ops.propose(s, &si, NULL, 8, d, NULL, &qv);
        live[id] = true;
        /* Odd ids accept everything: they must stay at k max. */
        if (n > 0) loom_ngram_ops.observe(s, id, n, id % 2 ? n : 0);
        if (id % 2) cr_assert_eq(n, 4, "seq %lld lost its state (k %d)", (long long)id, n);
    }
    for (loom_seq_id id = 0; id < 600; id++) loom_ngram_ops.release(s, id);
    loom_ngram_ops.destroy(s);
    cr_assert_eq(fake_host_live_allocs(), 0);
}

Test(spec, ngram_rejects_bad_config) {
    const loom_host *h = fake_host();
    loom_ngram_config c = cfg_default();
    c.min_ngram = 4;
    c.max_ngram = 2;
    void *self = (void *)1;
    loom_error err = {0};
    cr_assert_eq(loom_ngram_ops.create(h, &c, &self, &err), LOOM_ERR_INVALID);
    cr_assert_null(self);
    cr_assert(strstr(err.message, "min_ngram"), "%s", err.message);
    cr_assert_eq(fake_host_live_allocs(), 0);
}
