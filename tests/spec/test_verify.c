/*
 * tests/spec/test_verify.c — the distribution test of speculative
 * verification (suite 'spec'): loom_spec_verify (core/engine/spec_verify.c)
 * must emit tokens that follow the TARGET distribution exactly, whatever
 * the draft distribution.
 *
 * The toy model: a Markov chain over a small vocabulary (6..10 tokens)
 * with a known target transition matrix P[prev][next] and a different draft
 * matrix Q (stochastic), or a deterministic draft f(prev) (one-hot q, the
 * ngram case). One generation = repeated speculative steps from a fixed
 * start token: draft k tokens from Q (or f), build the verifier's inputs
 * (p_i = P[prefix token before position i], q_i likewise), verify, append
 * what it emits; until two tokens exist. Over ~50k generations with fixed
 * seeds, the first token must follow P[start] and the first two tokens
 * must follow P[start][a] * P[a][b] — a chi-square goodness-of-fit test at
 * p = 0.001.
 *
 * So that the test can fail, the same harness runs deliberately wrong
 * verifiers (always accept; resample from p instead of the residual) and
 * expects the chi-square test to reject them.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/spec_verify.h"
#include "loom/sampler.h"
#include "plugin/host_rules.h"

#define MAXV 10
#define MAXK 4
#define DRAWS 50000

typedef struct toy {
    int32_t vocab;
    double P[MAXV][MAXV];  /* target transitions, rows sum to 1          */
    double Q[MAXV][MAXV];  /* draft transitions (stochastic draft)       */
    int32_t f[MAXV];       /* deterministic draft: next = f[prev]        */
    bool one_hot;          /* use f instead of Q                         */
} toy;

/* The verifier under test, or a deliberately broken one. */
typedef int32_t (*verify_fn)(const float *p, const float *q, const int32_t *draft, int32_t n, int32_t vocab,
                             uint64_t rng[4], int32_t *out, int32_t *accepted);

/* Broken: accept every draft, then one token from p_n. Emits Q's chain. */
static int32_t verify_always_accept(const float *p, const float *q, const int32_t *draft, int32_t n,
                                    int32_t vocab, uint64_t rng[4], int32_t *out, int32_t *accepted) {
    (void)q;
    for (int32_t i = 0; i < n; i++) out[i] = draft[i];
    const float *pn = p + (size_t)n * vocab;
    double r = loom_rng_uniform(rng), acc = 0;
    int32_t t = vocab - 1;
    for (int32_t v = 0; v < vocab; v++) {
        acc += pn[v];
        if (r < acc) {
            t = v;
            break;
        }
    }
    out[n] = t;
    *accepted = n;
    return n + 1;
}

/* Broken: the right acceptance test, but on rejection draw from p itself
 * (not the residual max(0, p - q)): over-weights the draft's tokens. */
static int32_t verify_resample_p(const float *p, const float *q, const int32_t *draft, int32_t n, int32_t vocab,
                                 uint64_t rng[4], int32_t *out, int32_t *accepted) {
    for (int32_t a = 0; a < n; a++) {
        const float *pi = p + (size_t)a * vocab;
        double pd = pi[draft[a]], qd = q ? q[(size_t)a * vocab + draft[a]] : 1.0;
        if (pd >= qd || loom_rng_uniform(rng) * qd < pd) {
            out[a] = draft[a];
            continue;
        }
        double r = loom_rng_uniform(rng), acc = 0;
        int32_t t = vocab - 1;
        for (int32_t v = 0; v < vocab; v++) {
            acc += pi[v];
            if (r < acc) {
                t = v;
                break;
            }
        }
        out[a] = t;
        *accepted = a;
        return a + 1;
    }
    return verify_always_accept(p, q, draft, n, vocab, rng, out, accepted);
}

/* Random distribution over v tokens with some exact zeros (like top-k/p
 * truncation) when `sparse`. */
static void random_row(double *row, int32_t v, uint64_t rng[4], bool sparse) {
    double s = 0;
    for (int32_t i = 0; i < v; i++) {
        double u = loom_rng_uniform(rng);
        row[i] = sparse && u < 0.25 ? 0.0 : 0.05 + u * u;
        s += row[i];
    }
    if (s == 0) {
        row[0] = 1;
        s = 1;
    }
    for (int32_t i = 0; i < v; i++) row[i] /= s;
}

static void toy_make(toy *t, int32_t vocab, bool one_hot, uint64_t seed) {
    uint64_t rng[4];
    loom_rng_seed(rng, seed);
    memset(t, 0, sizeof *t);
    t->vocab = vocab;
    t->one_hot = one_hot;
    for (int32_t a = 0; a < vocab; a++) {
        random_row(t->P[a], vocab, rng, a % 2 == 0);
        random_row(t->Q[a], vocab, rng, a % 3 == 0); /* q may put mass where p has none */
        t->f[a] = (int32_t)(loom_rng_next(rng) % (uint64_t)vocab);
    }
}

static int32_t draw_row(const double *row, int32_t v, uint64_t rng[4]) {
    double r = loom_rng_uniform(rng), acc = 0;
    for (int32_t i = 0; i < v; i++) {
        acc += row[i];
        if (r < acc) return i;
    }
    for (int32_t i = v - 1; i >= 0; i--)
        if (row[i] > 0) return i;
    return 0;
}

/* One generation of two tokens from `start` with k drafts per step. */
static void generate2(const toy *t, verify_fn verify, int32_t start, int32_t k, uint64_t rng[4], int32_t out2[2]) {
    float p[(MAXK + 1) * MAXV], q[MAXK * MAXV];
    int32_t draft[MAXK], out[MAXK + 1], seq[2 * (MAXK + 1)];
    int32_t have = 0, prev = start, V = t->vocab;
    while (have < 2) {
        int32_t d_prev = prev;
        for (int32_t i = 0; i < k; i++) {
            int32_t d = t->one_hot ? t->f[d_prev] : draw_row(t->Q[d_prev], V, rng);
            for (int32_t v = 0; v < V; v++) q[i * V + v] = (float)t->Q[d_prev][v];
            draft[i] = d;
            d_prev = d;
        }
        /* p_i: the target after the prefix (prev, draft[0..i)). */
        for (int32_t i = 0; i <= k; i++) {
            int32_t ctx = i == 0 ? prev : draft[i - 1];
            for (int32_t v = 0; v < V; v++) p[i * V + v] = (float)t->P[ctx][v];
        }
        int32_t accepted = -1;
        int32_t m = verify(p, t->one_hot ? NULL : q, draft, k, V, rng, out, &accepted);
        cr_assert(m == accepted + 1 && m >= 1 && m <= k + 1, "verify returned %d with %d accepted", m, accepted);
        for (int32_t i = 0; i < accepted; i++) cr_assert_eq(out[i], draft[i], "accepted tokens must be the drafts");
        for (int32_t i = 0; i < m; i++) {
            cr_assert(out[i] >= 0 && out[i] < V, "token %d outside the vocabulary", out[i]);
            seq[have++] = out[i];
        }
        prev = seq[have - 1];
    }
    out2[0] = seq[0];
    out2[1] = seq[1];
}

/* Chi-square critical value at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    const double z = 3.0902;
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Goodness of fit of counts to probabilities over n cells; cells with an
 * expected count under 5 are pooled. Returns statistic / critical value
 * (> 1: reject); infinite when a cell of probability 0 was observed. */
static double chi2_ratio(const long *obs, const double *prob, int n, long total, int *df_out) {
    double stat = 0, pool_e = 0;
    long pool_o = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        if (e < 5) {
            pool_e += e;
            pool_o += obs[i];
            /* a token the target gives probability 0 must never appear */
            if (prob[i] == 0 && obs[i] > 0) return INFINITY;
            continue;
        }
        stat += (obs[i] - e) * (obs[i] - e) / e;
        cells++;
    }
    if (pool_e >= 5) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    int df = cells - 1 > 0 ? cells - 1 : 1;
    if (df_out) *df_out = df;
    return stat / chi2_crit(df);
}

typedef struct fit {
    double first;  /* chi-square / critical, first token   */
    double joint;  /* chi-square / critical, first two     */
} fit;

static fit run_fit(const toy *t, verify_fn verify, int32_t k, uint64_t seed) {
    static long c1[MAXV], c2[MAXV * MAXV];
    double p1[MAXV], p2[MAXV * MAXV];
    int32_t V = t->vocab, start = 1 % V;
    memset(c1, 0, sizeof c1);
    memset(c2, 0, sizeof c2);
    uint64_t rng[4];
    loom_rng_seed(rng, seed);
    for (int i = 0; i < DRAWS; i++) {
        int32_t o[2];
        generate2(t, verify, start, k, rng, o);
        c1[o[0]]++;
        c2[o[0] * V + o[1]]++;
    }
    for (int32_t a = 0; a < V; a++) {
        p1[a] = t->P[start][a];
        for (int32_t b = 0; b < V; b++) p2[a * V + b] = t->P[start][a] * t->P[a][b];
    }
    fit f;
    f.first = chi2_ratio(c1, p1, V, DRAWS, NULL);
    f.joint = chi2_ratio(c2, p2, V * V, DRAWS, NULL);
    return f;
}

/* loom_spec_verify's first-token and joint distributions fit the target's
 * for vocabularies 6, 8, 10 and k = 1..3, with a stochastic or a one-hot
 * draft q (toy seeds from seed0, verify seeds from seed1). */
static void check_follows_target(bool one_hot, uint64_t seed0, uint64_t seed1) {
    const char *q = one_hot ? "one-hot q" : "stochastic q";
    int32_t vocabs[] = {6, 8, 10};
    for (int vi = 0; vi < 3; vi++)
        for (int32_t k = 1; k <= 3; k++) {
            toy t;
            toy_make(&t, vocabs[vi], one_hot, seed0 + (uint64_t)vi * 10 + (uint64_t)k);
            fit f = run_fit(&t, loom_spec_verify, k, seed1 + (uint64_t)k);
            cr_log_info("%s, vocab %d, k %d: chi2/crit first %.3f joint %.3f", q, vocabs[vi], k,
                        f.first, f.joint);
            cr_expect(f.first < 1 && f.joint < 1,
                      "vocab %d, k %d, %s: chi-square/critical first %.3f, joint %.3f (must be < 1)",
                      vocabs[vi], k, q, f.first, f.joint);
        }
}

Test(spec, verify_follows_target_stochastic_draft) { check_follows_target(false, 1000, 77); }

Test(spec, verify_follows_target_one_hot_draft) { check_follows_target(true, 2000, 99); }

/* The harness can fail: wrong verifiers are rejected. */
Test(spec, verify_test_rejects_wrong_verifiers) {
    for (int32_t k = 1; k <= 3; k++) {
        toy t;
        toy_make(&t, 8, false, 3000 + (uint64_t)k);
        fit f = run_fit(&t, verify_always_accept, k, 5);
        cr_log_info("always-accept, k %d: first %.3g", k, f.first);
        cr_expect(f.first > 1, "always-accept verifier (k %d) passed the first-token test: %.3f", k, f.first);
        f = run_fit(&t, verify_resample_p, k, 6);
        cr_log_info("resample-from-p, k %d: first %.3g joint %.3g", k, f.first, f.joint);
        cr_expect(f.first > 1 || f.joint > 1, "resample-from-p verifier (k %d) passed: first %.3f joint %.3f", k,
                  f.first, f.joint);
        toy_make(&t, 8, true, 4000 + (uint64_t)k);
        f = run_fit(&t, verify_always_accept, k, 7);
        cr_expect(f.first > 1, "always-accept verifier with one-hot drafts (k %d) passed: %.3f", k, f.first);
    }
}

/* Greedy: one-hot p. Accept exactly while the draft equals the argmax, then
 * the argmax after the last accepted draft, whatever the random state. */
Test(spec, verify_greedy_is_prefix_match) {
    enum { V = 7, K = 4 };
    int32_t target[K + 1] = {3, 1, 4, 1, 5};
    float p[(K + 1) * V] = {0};
    for (int i = 0; i <= K; i++) p[i * V + target[i]] = 1.0f;
    for (int32_t wrong_at = 0; wrong_at <= K; wrong_at++) {
        int32_t draft[K], out[K + 1], accepted = -1;
        for (int i = 0; i < K; i++) draft[i] = i == wrong_at ? (target[i] + 1) % V : target[i];
        uint64_t rng[4];
        loom_rng_seed(rng, 42 + (uint64_t)wrong_at);
        float q[K * V] = {0};
        for (int i = 0; i < K; i++) q[i * V + draft[i]] = 1.0f;
        for (int use_q = 0; use_q < 2; use_q++) {
            int32_t m = loom_spec_verify(p, use_q ? q : NULL, draft, K, V, rng, out, &accepted);
            cr_assert_eq(accepted, wrong_at, "wrong draft at %d: accepted %d", wrong_at, accepted);
            cr_assert_eq(m, wrong_at + 1);
            for (int i = 0; i < m; i++) cr_assert_eq(out[i], target[i], "position %d: %d != %d", i, out[i], target[i]);
        }
    }
}

/* Drafts with p = 0 are always rejected; drafts with p >= q always accepted. */
Test(spec, verify_edge_probabilities) {
    enum { V = 5 };
    float p[2 * V] = {0.5f, 0.5f, 0, 0, 0, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
    float q[V] = {0.1f, 0.1f, 0.8f, 0, 0};
    uint64_t rng[4];
    loom_rng_seed(rng, 3);
    for (int i = 0; i < 1000; i++) {
        int32_t out[2], acc, d = 2;
        loom_spec_verify(p, q, &d, 1, V, rng, out, &acc);
        cr_assert_eq(acc, 0);
        cr_assert(out[0] == 0 || out[0] == 1, "resampled %d outside p's support", out[0]);
        d = 0;
        loom_spec_verify(p, q, &d, 1, V, rng, out, &acc);
        cr_assert_eq(acc, 1, "p 0.5 >= q 0.1 must accept");
    }
}
