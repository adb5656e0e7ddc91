/*
 * tests/common/eng_util.c — see eng_util.h. Events are recorded on the
 * stepping thread (the engine's callback thread); tests read the records
 * after stepping, so no locking is needed here.
 */
#include "eng_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eng_rec_init(eng_rec *r, int32_t n) {
    memset(r, 0, sizeof *r);
    r->seen_id = -1;
    r->prompt_tokens = -1;
    r->n = n < 1 ? 1 : n;
    cr_assert_leq(r->n, ENG_MAX_SAMPLES);
}

void eng_rec_free(eng_rec *r) {
    for (int i = 0; i < ENG_MAX_SAMPLES; i++) {
        free(r->s[i].tokens);
        free(r->s[i].lps);
        free(r->s[i].alt);
        free(r->s[i].alt_lp);
        free(r->s[i].text);
    }
    memset(r, 0, sizeof *r);
}

void eng_on_token(void *user, const loom_token_event *ev) {
    eng_rec *r = user;
    if (r->seen_id < 0) r->seen_id = ev->request_id;
    if (r->prompt_tokens < 0) r->prompt_tokens = ev->prompt_tokens;
    if (ev->request_id != r->seen_id || ev->prompt_tokens != r->prompt_tokens || ev->prompt_tokens <= 0 || ev->sample_index < 0 || ev->sample_index >= r->n) {
        r->bad_events++;
        return;
    }
    eng_sample *s = &r->s[ev->sample_index];
    if (s->finals > 0) s->after_final++;
    if (ev->finish != LOOM_FINISH_NONE) {
        s->finals++;
        s->finish = ev->finish;
        s->final_token = ev->token;
        if (ev->error) snprintf(s->error, sizeof s->error, "%s", ev->error);
    } else if (ev->token >= 0) {
        if (s->ntok == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 64;
            s->tokens = realloc(s->tokens, (size_t)s->cap * sizeof *s->tokens);
            s->lps = realloc(s->lps, (size_t)s->cap * sizeof *s->lps);
            s->alt = realloc(s->alt, (size_t)s->cap * sizeof *s->alt);
            s->alt_lp = realloc(s->alt_lp, (size_t)s->cap * sizeof *s->alt_lp);
            if (!s->tokens || !s->lps || !s->alt || !s->alt_lp) abort();
        }
        s->tokens[s->ntok] = ev->token;
        s->lps[s->ntok] = ev->logprob;
        s->alt[s->ntok] = -1;
        s->alt_lp[s->ntok] = -INFINITY;
        for (int32_t k = 0; k < ev->num_top && k < 2; k++) {
            if (ev->top_ids[k] != ev->token) {
                s->alt[s->ntok] = ev->top_ids[k];
                s->alt_lp[s->ntok] = ev->top_logprobs[k];
                break;
            }
        }
        s->ntok++;
    }
    if (ev->text && ev->text[0]) {
        size_t n = strlen(ev->text);
        char *t = realloc(s->text, s->len + n + 1);
        if (!t) abort();
        memcpy(t + s->len, ev->text, n + 1);
        s->text = t;
        s->len += n;
    }
}

void eng_rec_check_done(const eng_rec *r) {
    cr_assert_eq(r->bad_events, 0, "%d events had a wrong request id or sample index", r->bad_events);
    for (int32_t i = 0; i < r->n; i++) {
        const eng_sample *s = &r->s[i];
        cr_assert_eq(s->finals, 1, "request %lld sample %d got %d final events (want exactly 1)",
                     (long long)r->seen_id, i, s->finals);
        cr_assert_eq(s->after_final, 0, "request %lld sample %d got %d events after its final one",
                     (long long)r->seen_id, i, s->after_final);
        cr_assert_eq(s->final_token, -1, "final event carries token %d, want -1", s->final_token);
    }
}

char *eng_data_in(const char *folder, const char *name) {
    const char *src = getenv("LOOM_SOURCE_DIR");
    cr_assert(src, "LOOM_SOURCE_DIR is not set (run through meson test)");
    size_t n = strlen(src) + strlen(folder) + strlen(name) + 32;
    char *p = malloc(n);
    cr_assert(p);
    snprintf(p, n, "%s/tests/%s/data/%s", src, folder, name);
    return p;
}

char *eng_data(const char *name) { return eng_data_in("engine", name); }

const char *eng_need_model(void) {
    const char *m = getenv("LOOM_TEST_MODEL");
    if (!m || !m[0])
        cr_skip_test("LOOM_TEST_MODEL is unset: set it to the SmolLM2-135M-Instruct Q4_1 GGUF "
                     "(scripts/fetch-model.sh prints the path) to run the real-model engine tests");
    return m;
}

loom_status eng_try_open_in(const char *folder, const char *pipeline, const char *const *overrides,
                            loom_engine **e, loom_error *err) {
    char *path = eng_data_in(folder, pipeline);
    int32_t n = 0;
    while (overrides && overrides[n]) n++;
    *e = NULL;
    loom_status st = loom_engine_create(path, overrides, n, e, err);
    free(path);
    return st;
}

loom_engine *eng_open_in(const char *folder, const char *pipeline, const char *const *overrides) {
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = eng_try_open_in(folder, pipeline, overrides, &e, &err);
    cr_assert_eq(st, LOOM_OK, "loom_engine_create(%s): %s", pipeline, err.message);
    return e;
}

float *eng_score(loom_engine *e, const int32_t *tok, int32_t n) {
    float *lp = malloc((size_t)n * sizeof(float));
    cr_assert_not_null(lp);
    loom_error err = {0};
    cr_assert_eq(loom_engine_score(e, tok, n, lp, &err), LOOM_OK, "score: %s", err.message);
    return lp;
}

loom_engine *eng_open(const char *pipeline, const char *const *overrides) {
    char *path = eng_data(pipeline);
    int32_t n = 0;
    while (overrides && overrides[n]) n++;
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = loom_engine_create(path, overrides, n, &e, &err);
    cr_assert_eq(st, LOOM_OK, "loom_engine_create(%s): %s", path, err.message);
    cr_assert_not_null(e);
    free(path);
    return e;
}

int64_t eng_add(loom_engine *e, loom_request req, eng_rec *rec) {
    req.on_token = eng_on_token;
    req.user = rec;
    loom_error err = {0};
    int64_t id = loom_engine_add_request(e, &req, &err);
    cr_assert_geq(id, 0, "loom_engine_add_request: %s", err.message);
    return id;
}

void eng_run(loom_engine *e, int32_t max_steps) {
    int32_t active = 1, steps = 0;
    loom_error err = {0};
    while (active > 0) {
        cr_assert_lt(steps, max_steps, "engine still has %d active requests after %d steps", active, steps);
        loom_status st = loom_engine_step(e, &active, &err);
        cr_assert_eq(st, LOOM_OK, "loom_engine_step: %s", err.message);
        steps++;
    }
}

void eng_prompt(int32_t *out, int32_t n, uint32_t seed, int32_t vocab) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        out[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(vocab - 3));
    }
}

int32_t eng_same_greedy(const eng_sample *a, const eng_sample *b, float tol, const char *what) {
    int32_t n = a->ntok < b->ntok ? a->ntok : b->ntok;
    for (int32_t i = 0; i < n; i++) {
        if (a->tokens[i] == b->tokens[i]) {
            cr_assert(fabsf(a->lps[i] - b->lps[i]) <= tol,
                      "%s: token %d (id %d) has log-prob %.6f vs %.6f (tolerance %g)", what, i, a->tokens[i],
                      (double)a->lps[i], (double)b->lps[i], (double)tol);
            continue;
        }
        /* A float near-tie: both runs rank the same two tokens on top with
         * almost equal log-probs, and only their order differs. */
        bool tie = a->alt[i] == b->tokens[i] && b->alt[i] == a->tokens[i] &&
                   fabsf(a->lps[i] - a->alt_lp[i]) <= tol && fabsf(b->lps[i] - b->alt_lp[i]) <= tol &&
                   fabsf(a->lps[i] - b->alt_lp[i]) <= tol;
        cr_assert(tie,
                  "%s: token %d differs: %d (lp %.6f, runner-up %d lp %.6f) vs %d (lp %.6f, runner-up %d "
                  "lp %.6f) and it is not a float near-tie",
                  what, i, a->tokens[i], (double)a->lps[i], a->alt[i], (double)a->alt_lp[i], b->tokens[i],
                  (double)b->lps[i], b->alt[i], (double)b->alt_lp[i]);
        cr_log_info("%s: near-tie at token %d (%d vs %d, lp %.6f vs %.6f); rest not compared", what, i,
                    a->tokens[i], b->tokens[i], (double)a->lps[i], (double)b->lps[i]);
        return i;
    }
    cr_assert_eq(a->ntok, b->ntok, "%s: %d vs %d tokens", what, a->ntok, b->ntok);
    cr_assert_eq(a->finish, b->finish, "%s: finish %d vs %d", what, a->finish, b->finish);
    return n;
}

loom_request eng_req_tokens(const int32_t *ids, int32_t n, int32_t max_tokens) {
    loom_request r = loom_request_default();
    r.tokens = ids;
    r.num_tokens = n;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
}

/* ------------------------------------------------------- a request set */

static const int32_t k_set_lens[ENG_SET_N] = {5, 37, 12, 64, 23};
static const int32_t k_set_outs[ENG_SET_N] = {20, 9, 16, 12, 25};

/* eng_on_token plus a copy of the distribution of every token event. */
static void eng_set_on_token(void *user, const loom_token_event *ev) {
    eng_set_rec *r = user;
    eng_on_token(&r->rec, ev);
    if (ev->token < 0 || !ev->probs || ev->vocab != r->vocab) return;
    const size_t V = (size_t)r->vocab;
    if (r->count == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 32;
        r->probs = realloc(r->probs, (size_t)r->cap * V * sizeof(float));
        if (!r->probs) abort();
    }
    memcpy(r->probs + (size_t)r->count * V, ev->probs, V * sizeof(float));
    r->count++;
}

void eng_set_run(const char *folder, int32_t vocab, const char *pipeline,
                 const char *const *overrides, eng_set_rec *recs, loom_engine_stats *st) {
    int32_t p[ENG_SET_N][64];
    loom_engine *e = eng_open_in(folder, pipeline, overrides);
    for (int i = 0; i < ENG_SET_N; i++) {
        eng_prompt(p[i], k_set_lens[i], 100 + (uint32_t)i, vocab);
        memset(&recs[i], 0, sizeof recs[i]);
        eng_rec_init(&recs[i].rec, 1);
        recs[i].vocab = vocab;
        loom_request rq = eng_req_tokens(p[i], k_set_lens[i], k_set_outs[i]);
        rq.params.logprobs = 2;
        rq.want_probs = i == 0;
        rq.on_token = eng_set_on_token;
        rq.user = &recs[i];
        loom_error err = {0};
        cr_assert_geq(loom_engine_add_request(e, &rq, &err), 0, "add_request: %s", err.message);
    }
    eng_run(e, 10000);
    for (int i = 0; i < ENG_SET_N; i++) {
        eng_rec_check_done(&recs[i].rec);
        cr_assert_eq(recs[i].rec.s[0].ntok, k_set_outs[i], "%s: request %d made %d tokens, want %d",
                     pipeline, i, recs[i].rec.s[0].ntok, k_set_outs[i]);
    }
    if (st) loom_engine_get_stats(e, st, sizeof *st);
    loom_engine_destroy(e);
}

void eng_set_free(eng_set_rec *recs) {
    for (int i = 0; i < ENG_SET_N; i++) {
        eng_rec_free(&recs[i].rec);
        free(recs[i].probs);
    }
}

static double eng_max_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

void eng_set_same(const eng_set_rec *a, const eng_set_rec *b, double tol, const char *what) {
    double worst = 0;
    for (int i = 0; i < ENG_SET_N; i++) {
        const eng_sample *x = &a[i].rec.s[0], *y = &b[i].rec.s[0];
        cr_assert_eq(x->ntok, y->ntok, "%s: request %d: %d vs %d tokens", what, i, x->ntok, y->ntok);
        for (int32_t k = 0; k < x->ntok; k++)
            cr_assert_eq(x->tokens[k], y->tokens[k], "%s: request %d token %d: %d vs %d", what, i, k,
                         x->tokens[k], y->tokens[k]);
        worst = fmax(worst, eng_max_diff(x->lps, y->lps, (size_t)x->ntok));
    }
    cr_assert_eq(a[0].count, b[0].count, "%s: %d vs %d distributions", what, a[0].count, b[0].count);
    cr_assert_eq(a[0].vocab, b[0].vocab, "%s: vocabulary %d vs %d", what, a[0].vocab, b[0].vocab);
    worst = fmax(worst, eng_max_diff(a[0].probs, b[0].probs, (size_t)a[0].count * (size_t)a[0].vocab));
    cr_log_info("%s: max |difference| of log-probs and probabilities %.3g", what, worst);
    cr_assert(worst <= tol, "%s: log-probs / distributions differ by up to %g (tolerance %g)", what,
              worst, tol);
}

/* ------------------------------------------------------------ SmolLM2 */

static char *eng_smol_generate(loom_engine *e, eng_rec *r) {
    loom_request rq = loom_request_default();
    rq.prompt = "Explain in two sentences why the sky is blue.";
    rq.chat = true;
    rq.max_tokens = 40;
    rq.params.logprobs = 2;
    eng_rec_init(r, 1);
    eng_add(e, rq, r);
    eng_run(e, 1000);
    eng_rec_check_done(r);
    return r->s[0].text;
}

void eng_smol_compare(const char *folder, const char *pipeline, const char *const *ref_overrides,
                      const char *const *overrides, const char *text, double tol, const char *what) {
    eng_rec ra, rb;
    loom_engine *ref = eng_open_in(folder, "smol.yaml", ref_overrides);
    int32_t *tok = NULL, n = 0;
    loom_error err = {0};
    cr_assert_eq(loom_engine_tokenize(ref, text, true, &tok, &n, &err), LOOM_OK, "%s", err.message);
    float *want = eng_score(ref, tok, n);
    char *ta = eng_smol_generate(ref, &ra);
    loom_engine_destroy(ref);

    loom_engine *e = eng_open_in(folder, pipeline, overrides);
    float *got = eng_score(e, tok, n);
    char *tb = eng_smol_generate(e, &rb);
    loom_engine_destroy(e);

    double worst = eng_max_diff(got, want, (size_t)n);
    cr_log_info("SmolLM2 %s: max |log-prob difference| %.3g over %d tokens", what, worst, n);
    cr_assert(worst <= tol, "%s: teacher-forced log-probs differ by up to %g (tolerance %g)", what, worst,
              tol);
    cr_assert(ta && tb, "no text generated");
    cr_assert_str_eq(ta, tb, "%s wrote other text than one backend:\n--- one backend\n%s\n--- %s\n%s",
                     what, ta, what, tb);
    cr_assert_eq(ra.s[0].ntok, rb.s[0].ntok);
    for (int32_t k = 0; k < ra.s[0].ntok; k++)
        cr_assert_eq(ra.s[0].tokens[k], rb.s[0].tokens[k], "%s: generated token %d: %d vs %d", what, k,
                     ra.s[0].tokens[k], rb.s[0].tokens[k]);
    double gen = eng_max_diff(ra.s[0].lps, rb.s[0].lps, (size_t)ra.s[0].ntok);
    cr_assert(gen <= tol, "%s: generated log-probs differ by up to %g (tolerance %g)", what, gen, tol);
    eng_rec_free(&ra);
    eng_rec_free(&rb);
    free(tok);
    free(want);
    free(got);
}
