/*
 * core/engine/spec_verify.c — see spec_verify.h. Pure arithmetic: no engine
 * state, so tests can check the output distribution by chi-square.
 */
#include "engine/spec_verify.h"

#include <stdbool.h>

#include "loom/sampler.h"
#include "plugin/host_rules.h"

/* Draw from a (possibly unnormalised) non-negative vector; -1 if all zero. */
static int32_t draw(const float *w, int32_t vocab, double total, uint64_t rng[4]) {
    if (!(total > 0)) return -1;
    double r = loom_rng_uniform(rng) * total, acc = 0;
    int32_t last = -1;
    for (int32_t v = 0; v < vocab; v++) {
        if (w[v] <= 0) continue;
        acc += w[v];
        last = v;
        if (r < acc) return v;
    }
    return last; /* rounding: the last token with weight */
}

static double sum(const float *w, int32_t vocab) {
    double s = 0;
    for (int32_t v = 0; v < vocab; v++) s += w[v] > 0 ? w[v] : 0;
    return s;
}

static int32_t argmax(const float *w, int32_t vocab) {
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; v++)
        if (w[v] > w[best]) best = v;
    return best;
}

int32_t loom_spec_verify(const float *p, const float *q, const int32_t *draft, int32_t n, int32_t vocab,
                         uint64_t rng[4], int32_t *out, int32_t *accepted) {
    int32_t a = 0;
    for (; a < n; a++) {
        const float *pi = p + (int64_t)a * vocab;
        int32_t d = draft[a];
        double pd = d >= 0 && d < vocab ? pi[d] : 0;
        double qd = q ? (d >= 0 && d < vocab ? q[(int64_t)a * vocab + d] : 0) : 1.0;
        /* Accept with probability min(1, p/q). p == 1 (greedy argmax)
         * accepts without touching the rng; p == 0 rejects likewise. */
        bool ok;
        if (pd >= qd) ok = true;
        else if (pd <= 0) ok = false;
        else ok = loom_rng_uniform(rng) * qd < pd;
        if (ok) {
            out[a] = d;
            continue;
        }
        /* Rejected: the residual max(0, p - q), renormalised. */
        double total = 0;
        int32_t tok;
        if (!q) {
            total = sum(pi, vocab) - (pd > 0 ? pd : 0);
            /* Same as drawing from p with d removed. */
            double r = loom_rng_uniform(rng) * total, acc = 0;
            tok = -1;
            for (int32_t v = 0; v < vocab && total > 0; v++) {
                if (v == d || pi[v] <= 0) continue;
                acc += pi[v];
                tok = v;
                if (r < acc) break;
            }
        } else {
            const float *qi = q + (int64_t)a * vocab;
            double r, acc = 0;
            for (int32_t v = 0; v < vocab; v++) {
                double w = (double)pi[v] - qi[v];
                if (w > 0) total += w;
            }
            r = loom_rng_uniform(rng) * total;
            tok = -1;
            for (int32_t v = 0; v < vocab && total > 0; v++) {
                double w = (double)pi[v] - qi[v];
                if (w <= 0) continue;
                acc += w;
                tok = v;
                if (r < acc) break;
            }
        }
        if (tok < 0) tok = argmax(pi, vocab); /* p == q up to rounding */
        out[a] = tok;
        *accepted = a;
        return a + 1;
    }
    /* All accepted: one more token from the target after the last draft. */
    const float *pn = p + (int64_t)n * vocab;
    int32_t tok = draw(pn, vocab, sum(pn, vocab), rng);
    out[n] = tok >= 0 ? tok : argmax(pn, vocab);
    *accepted = n;
    return n + 1;
}
