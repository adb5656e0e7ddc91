/*
 * conformance/cf_sampler.c — the sampler checks (loom/sampler.h), on random
 * rows and random parameters drawn from the check's seed:
 *
 *   sample.range       tokens in [0, vocab), never a -inf (masked) logit;
 *                      rows of a batch independent of each other.
 *   sample.logprobs    out->logprobs is the log-softmax of the RAW row at
 *                      the chosen token; top_ids / top_logprobs are the
 *                      params->logprobs best tokens of that distribution,
 *                      best first, -1 / -inf padded.
 *   sample.rng         a row's rng state moves only by steps of the host's
 *                      generator (host->rng_*), and seeded streams repeat.
 *   sample.refusals    parameters no sampler can honour (temperature < 0 or
 *                      NaN, top_k < 0, logprobs outside 0..20) are refused
 *                      with LOOM_ERR_INVALID and a message; a failed call
 *                      writes no token and advances no rng — not even a
 *                      valid row's of the same batch.
 *   sample.dry         the core's dry sample: flat logits, neutral and
 *                      greedy parameters, vocab 1 — no crash, a token.
 *   sample.check       (samplers that declare check()) check() of a row
 *                      refuses exactly what sample() of that row refuses,
 *                      with LOOM_ERR_INVALID and a message, and moves no
 *                      rng.
 *   sample.seeds       same seed, same stream; other seed, other stream;
 *                      batching does not change a seeded stream.
 *   probs.shape        probs() is a distribution (finite, >= 0, sums to
 *                      1), one-hot at an argmax for greedy, softmax of the
 *                      raw row with neutral parameters, within the k best
 *                      for top_k = k.
 *   sample.chi2        sample() draws from probs(): Pearson chi-square at
 *                      alpha = 1e-6 over several parameter sets, with the
 *                      test's power shown against a sharpened distribution.
 *   sample.candidates  (samplers that declare candidates()) k within
 *                      1..LOOM_LOGITS_TOPK_MAX; a candidate row of the k or
 *                      more best logits, with ids and the whole row's lse,
 *                      gives the same token, logprobs, alternatives and rng
 *                      state as the whole row.
 *
 * Parameters a sampler refuses (LOOM_ERR_INVALID) are allowed except the
 * neutral ones (T = 1, every filter off) and greedy (T = 0); a refusal is
 * counted in the note and checked for atomicity.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "chi2.h"
#include "loom/backend.h"
#include "loom/sampler.h"
#include "plugin/host.h"

#define SP_MAX_ROWS 8
#define SP_HIST 16

typedef struct sp {
    cf_run *r;
    const loom_sampler_ops *ops;
    void *self;
    cf_rng g;
    int refusals;
} sp;

/* ---------------------------------------------------------------- helpers */

static loom_sampling_params sp_neutral(void) {
    return (loom_sampling_params){.struct_size = sizeof(loom_sampling_params), .temperature = 1.0f, .top_p = 1.0f,
                                  .repetition_penalty = 1.0f};
}

static loom_sample_row sp_row(const loom_sampling_params *p, uint64_t *rng) {
    return (loom_sample_row){.struct_size = sizeof(loom_sample_row), .params = p, .rng_state = rng};
}

/* One sample() call over n rows of width floats each (candidates NULL:
 * whole rows, width == vocab). */
static loom_status sp_call(sp *x, float *logits, int32_t vocab, int32_t width, const loom_sample_row *rows,
                           int32_t n, const int32_t *cand, const float *lse, loom_sample_out *out, loom_error *err) {
    const loom_sample_row *ptrs[SP_MAX_ROWS];
    for (int32_t i = 0; i < n && i < SP_MAX_ROWS; i++) ptrs[i] = &rows[i];
    loom_sample_batch b = {.struct_size = sizeof b, .n = n, .vocab = vocab, .width = width, .logits = logits,
                           .rows = ptrs, .candidates = cand, .lse = lse};
    out->struct_size = sizeof *out;
    cf_where(x->r, "sample() of %d row%s, vocab %d%s", n, n == 1 ? "" : "s", vocab, cand ? ", candidate rows" : "");
    return x->ops->sample(x->self, &b, out, err);
}

static void sp_logits(sp *x, float *l, int32_t V, double scale) {
    for (int32_t i = 0; i < V; i++) l[i] = (float)(scale * cf_rng_normal(&x->g));
}

/* log(sum exp(l)) in double, -inf entries counting 0. */
static double sp_lse(const float *l, int32_t V) {
    double mx = -INFINITY, z = 0;
    for (int32_t i = 0; i < V; i++)
        if (l[i] > mx) mx = l[i];
    for (int32_t i = 0; i < V; i++)
        if (!isinf(l[i])) z += exp((double)l[i] - mx);
    return mx + log(z);
}

/* Random parameters: greedy 15%, penalties 25% (need a history), logprobs
 * 40%, seeds always. */
static loom_sampling_params sp_params(sp *x) {
    loom_sampling_params p = sp_neutral();
    cf_rng *g = &x->g;
    p.temperature = cf_rng_unif(g) < 0.15 ? 0.0f : (float)(0.3 + 1.2 * cf_rng_unif(g));
    double u = cf_rng_unif(g);
    p.top_k = u < 0.4 ? 0 : u < 0.8 ? 1 + cf_rng_below(g, 40) : 100 + cf_rng_below(g, 400);
    p.top_p = cf_rng_unif(g) < 0.5 ? 1.0f : (float)(0.1 + 0.89 * cf_rng_unif(g));
    p.min_p = cf_rng_unif(g) < 0.7 ? 0.0f : (float)(0.2 * cf_rng_unif(g));
    if (cf_rng_unif(g) < 0.25) {
        p.repetition_penalty = (float)(0.7 + 0.8 * cf_rng_unif(g));
        p.presence_penalty = (float)(cf_rng_unif(g) - 0.3);
        p.frequency_penalty = (float)(0.5 * cf_rng_unif(g));
    }
    p.logprobs = cf_rng_unif(g) < 0.4 ? cf_rng_below(g, LOOM_MAX_LOGPROBS + 1) : 0;
    p.seed = cf_rng_next(g);
    p.has_seed = true;
    return p;
}

/* A random history in [0, V) for penalties. */
static void sp_history(sp *x, loom_sample_row *row, int32_t *hist, int32_t V) {
    for (int i = 0; i < SP_HIST; i++) hist[i] = cf_rng_below(&x->g, V);
    row->prompt = hist;
    row->prompt_len = SP_HIST / 2;
    row->output = hist + SP_HIST / 2;
    row->output_len = SP_HIST / 2;
}

/* j such that j steps of the host's generator take `from` to `to`, or -1. */
static int32_t sp_rng_distance(const uint64_t from[4], const uint64_t to[4]) {
    uint64_t s[4];
    memcpy(s, from, sizeof s);
    for (int32_t j = 0; j <= 4096; j++) {
        if (!memcmp(s, to, sizeof s)) return j;
        loom_host_default()->rng_next(s);
    }
    return -1;
}

static bool sp_open(cf_run *r, sp *x) {
    memset(x, 0, sizeof *x);
    x->r = r;
    x->ops = r->comp->ops;
    x->g = cf_rng_make(r->seed);
    return cf_create(r, "", &x->self);
}

static bool sp_close(sp *x, bool ok) {
    if (!ok) {
        x->ops->destroy(x->self);
        return false;
    }
    return cf_destroy(x->r, x->self);
}

/* -------------------------------------------------- random cases (range, ...) */

enum { SP_RANGE = 1, SP_LOGPROBS = 2, SP_RNG = 4 };

typedef struct sp_batch {
    int32_t n, V;
    float *l;                        /* (n, V) raw logits               */
    float *x;                        /* (n, V) the copy sample() gets   */
    loom_sampling_params p[SP_MAX_ROWS];
    loom_sample_row rows[SP_MAX_ROWS];
    uint64_t rng[SP_MAX_ROWS][4], rng0[SP_MAX_ROWS][4];
    int32_t hist[SP_MAX_ROWS][SP_HIST];
    int32_t tok[SP_MAX_ROWS + 1];
    float lp[SP_MAX_ROWS];
    int32_t top_ids[SP_MAX_ROWS * LOOM_MAX_LOGPROBS];
    float top_lp[SP_MAX_ROWS * LOOM_MAX_LOGPROBS];
} sp_batch;

/* Fill b with n random rows of vocab V (some masked logits). */
static void sp_batch_fill(sp *x, sp_batch *b) {
    for (int32_t r = 0; r < b->n; r++) {
        float *row = b->l + (size_t)r * b->V;
        sp_logits(x, row, b->V, 0.5 + 3.0 * cf_rng_unif(&x->g));
        if (b->V > 2 && cf_rng_unif(&x->g) < 0.2)
            for (int32_t i = 0; i < b->V / 4; i++) row[cf_rng_below(&x->g, b->V)] = -INFINITY;
        row[cf_rng_below(&x->g, b->V)] = 1.0f; /* at least one finite */
        b->p[r] = sp_params(x);
        loom_host_default()->rng_seed(b->rng[r], b->p[r].seed);
        memcpy(b->rng0[r], b->rng[r], sizeof b->rng[r]);
        b->rows[r] = sp_row(&b->p[r], b->rng[r]);
        sp_history(x, &b->rows[r], b->hist[r], b->V);
    }
}

/* The alternatives of row r: the best params->logprobs of the raw row
 * (tokens of probability 0, -inf logits, may be left out: -1 pads). */
static bool sp_check_top(sp *x, const sp_batch *b, int32_t r, double lse) {
    const float *l = b->l + (size_t)r * b->V;
    int32_t want = b->p[r].logprobs, finite = 0;
    for (int32_t t = 0; t < b->V; t++) finite += !isinf(l[t]);
    float prev = INFINITY;
    for (int32_t i = 0; i < LOOM_MAX_LOGPROBS; i++) {
        int32_t id = b->top_ids[r * LOOM_MAX_LOGPROBS + i];
        float v = b->top_lp[r * LOOM_MAX_LOGPROBS + i];
        if (i >= want || i >= finite) {
            CF_ENSURE(x->r, (id == -1 && isinf(v) && v < 0) || (i < want && i < b->V && id >= 0 && id < b->V &&
                                                                isinf(l[id]) && isinf(v)),
                      "row %d asked for %d alternatives (%d tokens of nonzero probability); slot %d holds id %d, "
                      "logprob %g (want -1, -inf)", r, want, finite, i, id, v);
            continue;
        }
        CF_ENSURE(x->r, id >= 0 && id < b->V, "row %d alternative %d has id %d outside [0, %d)", r, i, id, b->V);
        CF_ENSURE(x->r, fabs(v - ((double)l[id] - lse)) <= 1e-4 + 1e-5 * fabs(v),
                  "row %d alternative %d (id %d): logprob %g, but its raw log-softmax is %g", r, i, id, v,
                  (double)l[id] - lse);
        CF_ENSURE(x->r, v <= prev, "row %d alternatives not best first (%g after %g)", r, v, prev);
        prev = v;
        int32_t better = 0; /* ids strictly more likely than this one */
        for (int32_t t = 0; t < b->V; t++) better += l[t] > l[id];
        CF_ENSURE(x->r, better <= i, "row %d alternative %d is id %d, but %d tokens are more likely", r, i, id, better);
    }
    return true;
}

static bool sp_check_row(sp *x, const sp_batch *b, int32_t r, unsigned what) {
    const float *l = b->l + (size_t)r * b->V;
    int32_t t = b->tok[r];
    if (what & SP_RANGE) {
        CF_ENSURE(x->r, t >= 0 && t < b->V, "row %d: token %d outside [0, %d)", r, t, b->V);
        CF_ENSURE(x->r, !isinf(l[t]), "row %d: token %d has logit -inf (probability 0)", r, t);
    }
    if (what & SP_LOGPROBS) {
        if (t < 0 || t >= b->V) return cf_fail(x->r, "row %d: token %d outside [0, %d)", r, t, b->V);
        double lse = sp_lse(l, b->V), want = (double)l[t] - lse;
        CF_ENSURE(x->r, fabs(b->lp[r] - want) <= 1e-4 + 1e-5 * fabs(want),
                  "row %d: logprob of token %d is %g; the raw row's log-softmax gives %g (before penalties and "
                  "temperature)", r, t, b->lp[r], want);
        if (!sp_check_top(x, b, r, lse)) return false;
    }
    if (what & SP_RNG) {
        int32_t j = sp_rng_distance(b->rng0[r], b->rng[r]);
        CF_ENSURE(x->r, j >= 0, "row %d: its rng state changed other than by steps of host->rng_next / rng_uniform",
                  r);
    }
    return true;
}

/* A refused call: no token written, no rng advanced. */
static bool sp_check_refusal(sp *x, const sp_batch *b, loom_status st, const loom_error *err) {
    CF_ENSURE(x->r, st == LOOM_ERR_INVALID, "sample() failed with status %d (%s); a refusal of parameters is "
              "LOOM_ERR_INVALID", (int)st, err->message);
    CF_ENSURE(x->r, err->message[0], "sample() refused a batch without a message");
    for (int32_t r = 0; r < b->n; r++) {
        CF_ENSURE(x->r, b->tok[r] == -77, "a failed sample() wrote token %d for row %d", b->tok[r], r);
        CF_ENSURE(x->r, !memcmp(b->rng[r], b->rng0[r], sizeof b->rng[r]), "a failed sample() advanced row %d's rng", r);
    }
    return true;
}

static bool sp_random_cases(cf_run *r, unsigned what) {
    sp x;
    if (!sp_open(r, &x)) return false;
    int64_t cases = cf_iters(r, 400, 80), rows = 0;
    sp_batch *b = calloc(1, sizeof *b);
    b->l = malloc(sizeof(float) * SP_MAX_ROWS * 4000);
    b->x = malloc(sizeof(float) * SP_MAX_ROWS * 4000);
    bool ok = b->l && b->x;
    for (int64_t c = 0; ok && c < cases; c++) {
        b->n = 1 + cf_rng_below(&x.g, 4);
        b->V = c % 10 == 9 ? 1000 + cf_rng_below(&x.g, 3000) : 1 + cf_rng_below(&x.g, 300);
        sp_batch_fill(&x, b);
        memcpy(b->x, b->l, sizeof(float) * (size_t)b->n * (size_t)b->V);
        for (int32_t i = 0; i <= b->n; i++) b->tok[i] = -77;
        loom_sample_out out = {.tokens = b->tok, .logprobs = b->lp, .top_ids = b->top_ids, .top_logprobs = b->top_lp};
        loom_error err = {0};
        loom_status st = sp_call(&x, b->x, b->V, b->V, b->rows, b->n, NULL, NULL, &out, &err);
        if (st != LOOM_OK) {
            x.refusals++;
            ok = sp_check_refusal(&x, b, st, &err);
            continue;
        }
        if (b->tok[b->n] != -77) ok = cf_fail(r, "sample() wrote a token past its %d rows", b->n);
        for (int32_t i = 0; ok && i < b->n; i++) ok = sp_check_row(&x, b, i, what);
        rows += b->n;
    }
    if (ok) cf_note(r, "%lld random rows in %lld batches (vocab 1..4000), %d batches refused", (long long)rows,
                    (long long)cases, x.refusals);
    if (b) {
        free(b->l);
        free(b->x);
    }
    free(b);
    return sp_close(&x, ok);
}

static bool check_range(cf_run *r, const void *arg) { return sp_random_cases(r, SP_RANGE); }
static bool check_logprobs(cf_run *r, const void *arg) { return sp_random_cases(r, SP_RANGE | SP_LOGPROBS); }
static bool check_rng(cf_run *r, const void *arg) { return sp_random_cases(r, SP_RANGE | SP_RNG); }

/* ------------------------------------------------------------- refusals */

/* Row 0 valid, row 1 with one parameter no sampler can honour. */
static bool check_refusals(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    static const struct {
        const char *what;
        int field;
        double v;
    } bad[] = {{"temperature = -1", 0, -1.0}, {"temperature = NaN", 0, NAN}, {"top_k = -1", 1, -1},
               {"logprobs = 21", 2, LOOM_MAX_LOGPROBS + 1}, {"logprobs = -1", 2, -1}};
    bool ok = true;
    for (size_t c = 0; ok && c < sizeof bad / sizeof bad[0]; c++) {
        sp_batch b = {.n = 2, .V = 16};
        float l[32], xl[32];
        b.l = l;
        b.x = xl;
        sp_batch_fill(&x, &b);
        b.p[0] = sp_neutral();
        b.p[1] = sp_neutral();
        if (bad[c].field == 0) b.p[1].temperature = (float)bad[c].v;
        if (bad[c].field == 1) b.p[1].top_k = (int32_t)bad[c].v;
        if (bad[c].field == 2) b.p[1].logprobs = (int32_t)bad[c].v;
        memcpy(xl, l, sizeof l);
        b.tok[0] = b.tok[1] = -77;
        loom_sample_out out = {.tokens = b.tok, .logprobs = b.lp, .top_ids = b.top_ids, .top_logprobs = b.top_lp};
        loom_error err = {0};
        loom_status st = sp_call(&x, xl, 16, 16, b.rows, 2, NULL, NULL, &out, &err);
        if (st == LOOM_OK) ok = cf_fail(r, "sample() accepted %s (row 1)", bad[c].what);
        else ok = sp_check_refusal(&x, &b, st, &err);
        if (!ok) snprintf(r->why + strlen(r->why), sizeof r->why - strlen(r->why), " [%s in row 1]", bad[c].what);
    }
    if (ok) cf_note(r, "%zu kinds of bad parameters refused atomically", sizeof bad / sizeof bad[0]);
    return sp_close(&x, ok);
}

/* ------------------------------------------------------------------ dry */

/* What the core does for each new request: one sample of flat logits. */
static bool check_dry(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    static const int32_t vocabs[] = {1, 2, 256, 4096};
    bool ok = true;
    for (size_t v = 0; ok && v < sizeof vocabs / sizeof vocabs[0]; v++) {
        int32_t V = vocabs[v];
        float *l = calloc((size_t)V, sizeof *l);
        for (int greedy = 0; ok && l && greedy < 2; greedy++) {
            loom_sampling_params p = sp_neutral();
            if (greedy) p.temperature = 0.0f;
            uint64_t rng[4];
            loom_host_default()->rng_seed(rng, 1);
            loom_sample_row row = sp_row(&p, rng);
            int32_t tok = -77;
            loom_sample_out out = {.tokens = &tok};
            loom_error err = {0};
            memset(l, 0, sizeof *l * (size_t)V);
            loom_status st = sp_call(&x, l, V, V, &row, 1, NULL, NULL, &out, &err);
            if (st != LOOM_OK)
                ok = cf_fail(r, "a dry sample of flat logits (vocab %d, %s) failed: %s", V,
                             greedy ? "greedy" : "neutral parameters", err.message);
            else if (tok < 0 || tok >= V)
                ok = cf_fail(r, "a dry sample of flat logits (vocab %d) gave token %d", V, tok);
        }
        free(l);
    }
    return sp_close(&x, ok);
}

/* ---------------------------------------------------------------- check */

/* check() of one row, its rng state compared before and after. */
static loom_status sp_check_call(sp *x, const loom_sample_row *row, int32_t V, loom_error *err, bool *rng_moved) {
    uint64_t before[4] = {0};
    if (row->rng_state) memcpy(before, row->rng_state, sizeof before);
    loom_status st = x->ops->check(x->self, row, V, err);
    *rng_moved = row->rng_state && memcmp(before, row->rng_state, sizeof before) != 0;
    return st;
}

/* Random rows alone and the parameters no sampler can honour: check()
 * refuses exactly what sample() refuses, and moves no rng. */
static bool check_check(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    if (!LOOM_HAS_FIELD(x.ops, loom_sampler_ops, check) || !x.ops->check) {
        cf_note(r, "no check(): the core checks new requests with a dry sample()");
        return sp_close(&x, true);
    }
    int64_t cases = cf_iters(r, 400, 80);
    int agreed_refusals = 0;
    sp_batch *b = calloc(1, sizeof *b);
    float *l = malloc(sizeof(float) * 300), *xl = malloc(sizeof(float) * 300);
    bool ok = b && l && xl;
    for (int64_t c = 0; ok && c < cases; c++) {
        b->n = 1;
        b->V = 1 + cf_rng_below(&x.g, 300);
        b->l = l;
        b->x = xl;
        sp_batch_fill(&x, b);
        if (c % 4 == 3) b->p[0].logprobs = (int32_t)cf_rng_below(&x.g, 3) - 1 + (c % 8 == 7) * 22;
        if (c % 16 == 15) b->p[0].temperature = -0.5f;
        loom_error ec = {0}, es = {0};
        bool moved = false;
        loom_status sc = sp_check_call(&x, &b->rows[0], b->V, &ec, &moved);
        if (moved) ok = cf_fail(r, "check() moved the row's rng state");
        memcpy(xl, l, sizeof(float) * (size_t)b->V);
        int32_t tok = -77;
        loom_sample_out out = {.tokens = &tok, .logprobs = b->lp, .top_ids = b->top_ids, .top_logprobs = b->top_lp};
        loom_status ss = sp_call(&x, xl, b->V, b->V, b->rows, 1, NULL, NULL, &out, &es);
        if (ok && (sc == LOOM_OK) != (ss == LOOM_OK))
            ok = cf_fail(r, "check() %s a row that sample() %s (temperature %g, top_k %d, logprobs %d): %s",
                         sc == LOOM_OK ? "accepted" : "refused", ss == LOOM_OK ? "accepts" : "refuses",
                         (double)b->p[0].temperature, b->p[0].top_k, b->p[0].logprobs,
                         sc == LOOM_OK ? es.message : ec.message);
        else if (ok && sc != LOOM_OK && (sc != LOOM_ERR_INVALID || !ec.message[0]))
            ok = cf_fail(r, "check() refused with status %d and message '%s'; a refusal of parameters is "
                         "LOOM_ERR_INVALID with a message", (int)sc, ec.message);
        agreed_refusals += sc != LOOM_OK;
    }
    if (ok) cf_note(r, "%lld random rows: check() agreed with sample() on each (%d refused)", (long long)cases,
                    agreed_refusals);
    free(l);
    free(xl);
    free(b);
    return sp_close(&x, ok);
}

/* ---------------------------------------------------------------- seeds */

/* n tokens of one row sampled one call at a time from rng seeded `seed`. */
static bool sp_stream(sp *x, const float *l, int32_t V, const loom_sampling_params *p, uint64_t seed, int32_t n,
                      int32_t *toks) {
    uint64_t rng[4];
    loom_host_default()->rng_seed(rng, seed);
    loom_sample_row row = sp_row(p, rng);
    float *xl = malloc(sizeof(float) * (size_t)V);
    CF_ENSURE(x->r, xl, "out of memory");
    for (int32_t i = 0; i < n; i++) {
        memcpy(xl, l, sizeof(float) * (size_t)V);
        loom_sample_out out = {.tokens = &toks[i]};
        loom_error err = {0};
        if (sp_call(x, xl, V, V, &row, 1, NULL, NULL, &out, &err) != LOOM_OK) {
            free(xl);
            return cf_fail(x->r, "sample() with neutral parameters failed: %s", err.message);
        }
    }
    free(xl);
    return true;
}

/* Three rows sampled together for `steps` steps equal each sampled alone. */
static bool sp_batching(sp *x, const float *l, int32_t V) {
    enum { R = 3, STEPS = 40 };
    loom_sampling_params ps[R] = {sp_neutral(), sp_neutral(), sp_neutral()};
    ps[0].temperature = 0.8f;
    ps[1].temperature = 0.0f;
    ps[2].top_k = 10;
    uint64_t rng[R][4];
    int32_t batched[R][STEPS];
    float *xl = malloc(sizeof(float) * R * (size_t)V);
    CF_ENSURE(x->r, xl, "out of memory");
    for (int i = 0; i < R; i++) loom_host_default()->rng_seed(rng[i], 500 + (uint64_t)i);
    for (int s = 0; s < STEPS; s++) {
        loom_sample_row rows[R];
        for (int i = 0; i < R; i++) {
            rows[i] = sp_row(&ps[i], rng[i]);
            memcpy(xl + (size_t)i * V, l + (size_t)i * V, sizeof(float) * (size_t)V);
        }
        int32_t toks[R];
        loom_sample_out out = {.tokens = toks};
        loom_error err = {0};
        if (sp_call(x, xl, V, V, rows, R, NULL, NULL, &out, &err) != LOOM_OK) {
            free(xl);
            return cf_fail(x->r, "sample() of three rows failed: %s", err.message);
        }
        for (int i = 0; i < R; i++) batched[i][s] = toks[i];
    }
    free(xl);
    for (int i = 0; i < R; i++) {
        int32_t alone[STEPS];
        if (!sp_stream(x, l + (size_t)i * V, V, &ps[i], 500 + (uint64_t)i, STEPS, alone)) return false;
        for (int s = 0; s < STEPS; s++)
            CF_ENSURE(x->r, alone[s] == batched[i][s],
                      "row %d step %d: token %d sampled in a batch of 3, %d alone: batching changed a seeded stream", i,
                      s, batched[i][s], alone[s]);
    }
    return true;
}

static bool check_seeds(cf_run *r, const void *arg) {
    enum { V = 50, N = 200 };
    sp x;
    if (!sp_open(r, &x)) return false;
    float l[3 * V];
    sp_logits(&x, l, 3 * V, 1.0);
    loom_sampling_params p = sp_neutral();
    int32_t a[N], b[N], c[N];
    bool ok = sp_stream(&x, l, V, &p, 42, N, a) && sp_stream(&x, l, V, &p, 42, N, b) &&
              sp_stream(&x, l, V, &p, 43, N, c);
    if (ok && memcmp(a, b, sizeof a)) ok = cf_fail(r, "the same seed gave two different token streams");
    int diff = 0;
    for (int i = 0; ok && i < N; i++) diff += a[i] != c[i];
    if (ok && diff <= N / 4)
        ok = cf_fail(r, "seeds 42 and 43 agree on %d of %d tokens: the row's rng state is not what draws them", N - diff,
                     N);
    if (ok) ok = sp_batching(&x, l, V);
    return sp_close(&x, ok);
}

/* ---------------------------------------------------------------- probs */

/* probs() of a copy of l into pr; *refused when the sampler refused p. */
static bool sp_probs(sp *x, const float *l, int32_t V, const loom_sample_row *row, float *pr, bool *refused) {
    memcpy(pr, l, sizeof(float) * (size_t)V);
    loom_error err = {0};
    cf_where(x->r, "probs() of vocab %d", V);
    loom_status st = x->ops->probs(x->self, pr, V, row, &err);
    *refused = st != LOOM_OK;
    if (st == LOOM_OK) return true;
    CF_ENSURE(x->r, st == LOOM_ERR_INVALID && err.message[0], "probs() failed with status %d: %s", (int)st,
              err.message);
    return true;
}

static bool sp_check_dist(sp *x, const float *l, const float *pr, int32_t V, const char *what) {
    double sum = 0;
    for (int32_t i = 0; i < V; i++) {
        CF_ENSURE(x->r, isfinite(pr[i]) && pr[i] >= 0, "probs() (%s) gives token %d probability %g", what, i, pr[i]);
        CF_ENSURE(x->r, pr[i] == 0 || !isinf(l[i]), "probs() (%s) gives masked token %d probability %g", what, i, pr[i]);
        sum += pr[i];
    }
    CF_ENSURE(x->r, fabs(sum - 1.0) <= 1e-4, "probs() (%s) sums to %.7f, not 1", what, sum);
    return true;
}

/* Greedy: one-hot at an argmax. Neutral: softmax. top_k: within the k best. */
static bool sp_probs_semantics(sp *x, const float *l, float *pr, int32_t V) {
    loom_sampling_params p = sp_neutral();
    loom_sample_row row = sp_row(&p, NULL);
    bool refused;
    double mx = -INFINITY, lse = sp_lse(l, V);
    for (int32_t i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    if (!sp_probs(x, l, V, &row, pr, &refused)) return false;
    CF_ENSURE(x->r, !refused, "probs() refused neutral parameters (temperature 1, every filter off)");
    for (int32_t i = 0; i < V; i++)
        CF_ENSURE(x->r, fabs(pr[i] - exp((double)l[i] - lse)) <= 1e-5, "neutral parameters: probs()[%d] = %g, softmax "
                  "of the raw row gives %g", i, pr[i], exp((double)l[i] - lse));
    p.temperature = 0.0f;
    if (!sp_probs(x, l, V, &row, pr, &refused)) return false;
    CF_ENSURE(x->r, !refused, "probs() refused greedy parameters (temperature 0)");
    for (int32_t i = 0; i < V; i++)
        CF_ENSURE(x->r, pr[i] == 0.0f || (pr[i] == 1.0f && l[i] == mx), "greedy: probs()[%d] = %g (logit %g, max %g); "
                  "want one-hot at an argmax", i, pr[i], l[i], mx);
    p.temperature = 1.0f;
    p.top_k = 1 + cf_rng_below(&x->g, V);
    if (!sp_probs(x, l, V, &row, pr, &refused) || refused) return !x->r->failed;
    int32_t kept = 0;
    for (int32_t i = 0; i < V; i++) {
        if (pr[i] == 0.0f) continue;
        kept++;
        int32_t better = 0;
        for (int32_t t = 0; t < V; t++) better += l[t] > l[i];
        CF_ENSURE(x->r, better < p.top_k, "top_k = %d: token %d has probability %g but %d tokens are better", p.top_k,
                  i, pr[i], better);
    }
    CF_ENSURE(x->r, kept <= p.top_k, "top_k = %d keeps %d tokens", p.top_k, kept);
    return true;
}

static bool check_probs(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    float *l = malloc(sizeof(float) * 300), *pr = malloc(sizeof(float) * 300);
    bool ok = l && pr;
    int64_t cases = cf_iters(r, 200, 40);
    for (int64_t c = 0; ok && c < cases; c++) {
        int32_t V = 1 + cf_rng_below(&x.g, 300);
        sp_logits(&x, l, V, 0.5 + 2.5 * cf_rng_unif(&x.g));
        if (c % 2) ok = sp_probs_semantics(&x, l, pr, V);
        if (!ok) break;
        if (V > 2 && c % 5 == 0) { /* a masked token; token 0 stays finite */
            l[cf_rng_below(&x.g, V - 1) + 1] = -INFINITY;
            l[0] = 0.5f;
        }
        loom_sampling_params p = sp_params(&x);
        int32_t hist[SP_HIST];
        loom_sample_row row = sp_row(&p, NULL);
        sp_history(&x, &row, hist, V);
        bool refused;
        ok = sp_probs(&x, l, V, &row, pr, &refused);
        if (ok && refused) x.refusals++;
        else if (ok) ok = sp_check_dist(&x, l, pr, V, "random parameters");
    }
    if (ok) cf_note(r, "%lld rows, %d parameter sets refused", (long long)cases, x.refusals);
    free(l);
    free(pr);
    return sp_close(&x, ok);
}

/* ----------------------------------------------------------- chi-square */

typedef struct sp_dist_case {
    const char *what;
    int32_t V;
    float temperature, top_p, min_p, rep;
    int32_t top_k;
} sp_dist_case;

static const sp_dist_case k_dist[] = {
    {"neutral", 8, 1.0f, 1.0f, 0.0f, 1.0f, 0},
    {"temperature 0.7, top_k 5", 10, 0.7f, 1.0f, 0.0f, 1.0f, 5},
    {"temperature 1.3, top_p 0.8", 12, 1.3f, 0.8f, 0.0f, 1.0f, 0},
    {"temperature 0.9, top_k 6, top_p 0.95, min_p 0.05, penalties", 8, 0.9f, 0.95f, 0.05f, 1.2f, 6},
};

/* Chi-square of `counts` against pr, and its power against pr sharpened. */
static bool sp_chi2(sp *x, const sp_dist_case *c, const float *pr, const long *counts, long N, int *powerless) {
    double p[64], q[64], zq = 0;
    int support = 0;
    for (int32_t i = 0; i < c->V; i++) {
        p[i] = pr[i];
        q[i] = pow(pr[i], 1.5);
        zq += q[i];
        support += pr[i] > 0;
    }
    int df;
    double stat = loom_chi2_statistic(counts, p, c->V, N, &df), crit = loom_chi2_critical(df, LOOM_CHI2_Z_1E6);
    if (df > 0)
        CF_ENSURE(x->r, stat < crit, "%s: sample() does not draw from probs(): chi-square %.1f >= %.1f (df %d, "
                  "alpha 1e-6, %ld draws)", c->what, stat, crit, df, N);
    else
        for (int32_t i = 0; i < c->V; i++)
            CF_ENSURE(x->r, !counts[i] || p[i] > 0, "%s: sample() drew token %d, which probs() gives 0", c->what, i);
    for (int32_t i = 0; i < c->V; i++) q[i] /= zq;
    double s2 = loom_chi2_statistic(counts, q, c->V, N, &df);
    if (support >= 3 && !(s2 > crit)) (*powerless)++;
    return true;
}

static bool sp_dist_case_run(sp *x, const sp_dist_case *c, long N, int *powerless, int *refused) {
    float l[64], pr[64], xl[64];
    int32_t hist[SP_HIST] = {1, 4, 3, 3, 0, 1, 2, 5};
    sp_logits(x, l, c->V, 1.2);
    loom_sampling_params p = sp_neutral();
    p.temperature = c->temperature;
    p.top_k = c->top_k;
    p.top_p = c->top_p;
    p.min_p = c->min_p;
    p.repetition_penalty = c->rep;
    if (c->rep != 1.0f) {
        p.presence_penalty = 0.3f;
        p.frequency_penalty = 0.2f;
    }
    uint64_t rng[4];
    loom_host_default()->rng_seed(rng, cf_rng_next(&x->g));
    loom_sample_row row = sp_row(&p, rng);
    if (c->rep != 1.0f) {
        row.prompt = hist;
        row.prompt_len = 2;
        row.output = hist + 2;
        row.output_len = 6;
    }
    bool ref;
    if (!sp_probs(x, l, c->V, &row, pr, &ref)) return false;
    if (ref) {
        (*refused)++;
        return true;
    }
    if (!sp_check_dist(x, l, pr, c->V, c->what)) return false;
    long counts[64] = {0};
    for (long i = 0; i < N; i++) {
        memcpy(xl, l, sizeof(float) * (size_t)c->V);
        int32_t tok = -1;
        loom_sample_out out = {.tokens = &tok};
        loom_error err = {0};
        loom_status st = sp_call(x, xl, c->V, c->V, &row, 1, NULL, NULL, &out, &err);
        CF_ENSURE(x->r, st == LOOM_OK, "%s: sample() failed where probs() did not: %s", c->what, err.message);
        CF_ENSURE(x->r, tok >= 0 && tok < c->V, "%s: token %d outside [0, %d)", c->what, tok, c->V);
        counts[tok]++;
    }
    return sp_chi2(x, c, pr, counts, N, powerless);
}

static bool check_chi2(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    long N = (long)cf_iters(r, 20000, 5000);
    int powerless = 0, refused = 0;
    bool ok = true;
    for (size_t c = 0; ok && c < sizeof k_dist / sizeof k_dist[0]; c++) ok = sp_dist_case_run(&x, &k_dist[c], N, &powerless, &refused);
    if (ok)
        cf_note(r, "%zu parameter sets x %ld draws%s%s", sizeof k_dist / sizeof k_dist[0] - (size_t)refused, N,
                refused ? " (some refused)" : "", powerless ? " (a set lacked the power to reject a sharper distribution)" : "");
    return sp_close(&x, ok);
}

/* ----------------------------------------------------------- candidates */

/* One random row: whole vs a candidate row of w >= k best logits. */
static bool sp_candidate_case(sp *x, float *l, float *xl, int32_t V, int *compared) {
    loom_sampling_params p = sp_params(x);
    int32_t hist[SP_HIST];
    cf_where(x->r, "candidates()");
    int32_t k = x->ops->candidates(x->self, &p);
    CF_ENSURE(x->r, k >= 0 && k <= LOOM_LOGITS_TOPK_MAX, "candidates() returned %d: must be 0 (whole rows) or "
              "1..%d", k, LOOM_LOGITS_TOPK_MAX);
    if (k == 0 || k > V) return true;
    int32_t hi = V < LOOM_LOGITS_TOPK_MAX ? V : LOOM_LOGITS_TOPK_MAX;
    int32_t w = k + cf_rng_below(&x->g, hi - k + 1);
    int32_t ids[LOOM_LOGITS_TOPK_MAX];
    float vals[LOOM_LOGITS_TOPK_MAX], lse;
    cf_host()->logits_topk_row(l, V, w, ids, vals, &lse);
    uint64_t ra[4], rb[4];
    loom_host_default()->rng_seed(ra, p.seed);
    memcpy(rb, ra, sizeof ra);
    loom_sample_row rowa = sp_row(&p, ra), rowb = sp_row(&p, rb);
    sp_history(x, &rowa, hist, V);
    rowb.prompt = rowa.prompt;
    rowb.prompt_len = rowa.prompt_len;
    rowb.output = rowa.output;
    rowb.output_len = rowa.output_len;
    int32_t ta = -1, tb = -1, ia[LOOM_MAX_LOGPROBS], ib[LOOM_MAX_LOGPROBS];
    float la = 0, lb = 0, pa[LOOM_MAX_LOGPROBS], pb[LOOM_MAX_LOGPROBS];
    for (int32_t i = 0; i < LOOM_MAX_LOGPROBS; i++) /* what the core pads with: unwritten entries compare as that */
        ia[i] = ib[i] = -1, pa[i] = pb[i] = -INFINITY;
    loom_sample_out oa = {.tokens = &ta, .logprobs = &la, .top_ids = ia, .top_logprobs = pa};
    loom_sample_out ob = {.tokens = &tb, .logprobs = &lb, .top_ids = ib, .top_logprobs = pb};
    loom_error err = {0};
    memcpy(xl, l, sizeof(float) * (size_t)V);
    loom_status sa = sp_call(x, xl, V, V, &rowa, 1, NULL, NULL, &oa, &err);
    if (sa != LOOM_OK) return true; /* refused parameters: nothing to compare */
    loom_status sb = sp_call(x, vals, V, w, &rowb, 1, ids, &lse, &ob, &err);
    CF_ENSURE(x->r, sb == LOOM_OK, "candidates() = %d for these parameters, but sample() of a candidate row of %d "
              "failed: %s", k, w, err.message);
    CF_ENSURE(x->r, ta == tb, "candidates() = %d: the whole row (vocab %d) gave token %d, a candidate row of its %d "
              "best gave %d (same rng state; temperature %g, top_k %d, top_p %g, min_p %g)", k, V, ta, w, tb,
              p.temperature, p.top_k, p.top_p, p.min_p);
    CF_ENSURE(x->r, fabs(la - lb) <= 1e-4 + 1e-5 * fabs(la), "candidate row: logprob %g, whole row %g", lb, la);
    CF_ENSURE(x->r, !memcmp(ra, rb, sizeof ra), "candidate row and whole row left the rng in different states");
    for (int32_t i = 0; i < p.logprobs; i++)
        CF_ENSURE(x->r, ia[i] == ib[i] && (fabs(pa[i] - pb[i]) <= 1e-4 || (isinf(pa[i]) && isinf(pb[i]))),
                  "alternative %d: whole row (%d, %g), candidate row (%d, %g)", i, ia[i], pa[i], ib[i], pb[i]);
    (*compared)++;
    return true;
}

static bool check_candidates(cf_run *r, const void *arg) {
    sp x;
    if (!sp_open(r, &x)) return false;
    if (!x.ops->candidates) {
        sp_close(&x, true);
        return r->failed ? false : cf_skip(r, "candidates() is NULL (optional): this sampler always gets whole rows");
    }
    float *l = malloc(sizeof(float) * 2000), *xl = malloc(sizeof(float) * 2000);
    bool ok = l && xl;
    int compared = 0;
    int64_t cases = cf_iters(r, 600, 120);
    for (int64_t c = 0; ok && c < cases; c++) {
        int32_t V = c % 4 == 3 ? 500 + cf_rng_below(&x.g, 1500) : 2 + cf_rng_below(&x.g, 120);
        sp_logits(&x, l, V, 0.5 + 3.0 * cf_rng_unif(&x.g));
        ok = sp_candidate_case(&x, l, xl, V, &compared);
    }
    if (ok) cf_note(r, "%d candidate rows compared with their whole rows (of %lld random parameter sets)", compared,
                    (long long)cases);
    if (ok && compared == 0) cf_note(r, "candidates() never returned k > 0 for random parameters");
    free(l);
    free(xl);
    return sp_close(&x, ok);
}

int cf_checks_sampler(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_range, NULL, "sample.range");
    n = cf_add(out, n, cap, check_logprobs, NULL, "sample.logprobs");
    n = cf_add(out, n, cap, check_rng, NULL, "sample.rng");
    n = cf_add(out, n, cap, check_refusals, NULL, "sample.refusals");
    n = cf_add(out, n, cap, check_dry, NULL, "sample.dry");
    n = cf_add(out, n, cap, check_check, NULL, "sample.check");
    n = cf_add(out, n, cap, check_seeds, NULL, "sample.seeds");
    n = cf_add(out, n, cap, check_probs, NULL, "probs.shape");
    n = cf_add(out, n, cap, check_chi2, NULL, "sample.chi2");
    n = cf_add(out, n, cap, check_candidates, NULL, "sample.candidates");
    return n;
}
