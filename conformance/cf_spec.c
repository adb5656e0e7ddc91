/*
 * conformance/cf_spec.c — the speculator checks (loom/spec.h), on random
 * sequences over a vocabulary of opts->spec_vocab (default 256, the tiny
 * dummy model's, so a draft-model speculator can run a tiny draft):
 *
 *   spec.propose   init() with the engine API; plan() >= 0; propose()
 *                  returns 0..max_k drafts in [0, vocab), writes nothing
 *                  past max_k, sets q_valid to 0 (q untouched) or 1 (k
 *                  rows that are distributions); max_k = 0 proposes
 *                  nothing; observe / release (unknown ids too) hold up;
 *                  stats() (when present) accepted <= proposed.
 *   spec.batch     (speculators with propose_batch) two instances built
 *                  alike, fed the same rounds of sequences and feedback:
 *                  propose_batch() for all equals propose() one sequence
 *                  at a time, in order (counts, drafts, q_valid; q to
 *                  float rounding), with max_k varying (0 included).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cf_kit.h"
#include "loom/engine.h"
#include "loom/spec.h"

#define SX_SEQS 6
#define SX_CAP 400
#define SX_KMAX 6
#define SX_GUARD (-777)

typedef struct sx_seq {
    loom_seq_info info;
    int32_t toks[SX_CAP];
    loom_sampling_params p;
} sx_seq;

typedef struct sx {
    cf_run *r;
    const loom_spec_ops *ops;
    int32_t vocab;
    cf_rng g;
    sx_seq seqs[SX_SEQS];
    loom_seq_id next_id;
    float *q;       /* (SX_SEQS, SX_KMAX + 1, vocab) */
    float *q2;      /* the same                      */
} sx;

static int32_t sx_vocab(const cf_run *r) { return r->opts->spec_vocab > 0 ? r->opts->spec_vocab : 256; }

/* A new sequence: a random prompt with repeats, so n-gram lookups hit. */
static void sx_new_seq(sx *x, sx_seq *s) {
    memset(s, 0, sizeof *s);
    int32_t n = 4 + cf_rng_below(&x->g, 120);
    int32_t motif[8];
    for (int i = 0; i < 8; i++) motif[i] = cf_rng_below(&x->g, x->vocab);
    for (int32_t i = 0; i < n; i++)
        s->toks[i] = cf_rng_below(&x->g, 3) ? motif[i % 8] : cf_rng_below(&x->g, x->vocab);
    s->p = (loom_sampling_params){.struct_size = sizeof s->p, .temperature = cf_rng_below(&x->g, 2) ? 0.0f : 0.8f,
                                  .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = cf_rng_next(&x->g),
                                  .has_seed = true};
    s->info = (loom_seq_info){.struct_size = sizeof s->info, .id = x->next_id++, .num_prompt_tokens = n,
                              .num_tokens = n, .num_computed = n, .max_total_tokens = SX_CAP - SX_KMAX - 2,
                              .tokens = s->toks};
    s->info.request_id = s->info.id;
}

/* The "target" accepts a prefix of the drafts and adds a token of its own. */
static void sx_advance(sx *x, sx_seq *s, const int32_t *draft, int32_t k, int32_t accepted) {
    int32_t *n = &s->info.num_tokens;
    for (int32_t i = 0; i < accepted && *n < SX_CAP - 1; i++) s->toks[(*n)++] = draft[i];
    int32_t echo = s->toks[*n > 8 ? *n - 8 : 0]; /* repeats keep n-gram lookups hitting */
    if (*n < SX_CAP - 1) s->toks[(*n)++] = cf_rng_below(&x->g, 2) ? echo : cf_rng_below(&x->g, x->vocab);
    s->info.num_computed = *n;
}

static bool sx_create(cf_run *r, void **self) {
    if (!cf_create(r, "", self)) return false;
    const loom_spec_ops *ops = r->comp->ops;
    char cwd[1024];
    loom_spec_init in = {.struct_size = sizeof in, .vocab_size = sx_vocab(r),
                         .pipeline_dir = getcwd(cwd, sizeof cwd) ? cwd : ".", .max_model_len = SX_CAP,
                         .engine_api = loom_engine_api_get()};
    loom_error err = {0};
    cf_where(r, "init()");
    loom_status st = ops->init(*self, &in, &err);
    if (st == LOOM_OK) return true;
    ops->destroy(*self);
    *self = NULL;
    return cf_fail(r, "init(vocab %d) failed: %s", in.vocab_size, err.message);
}

/* Check one proposal's outputs. */
static bool sx_check(sx *x, const sx_seq *s, int32_t max_k, int32_t k, const int32_t *draft, const float *q,
                     int32_t q_valid) {
    CF_ENSURE(x->r, k >= 0 && k <= max_k, "propose(seq %lld, max_k %d) returned %d", (long long)s->info.id, max_k, k);
    CF_ENSURE(x->r, draft[max_k] == SX_GUARD, "propose(seq %lld) wrote past max_k = %d drafts", (long long)s->info.id,
              max_k);
    for (int32_t i = 0; i < k; i++)
        CF_ENSURE(x->r, draft[i] >= 0 && draft[i] < x->vocab, "propose(seq %lld): draft %d is token %d, outside [0, %d)",
                  (long long)s->info.id, i, draft[i], x->vocab);
    CF_ENSURE(x->r, q_valid == 0 || q_valid == 1, "propose() set q_valid to %d (0 or 1)", q_valid);
    if (!q) return true;
    if (!q_valid) {
        for (int32_t i = 0; i < max_k * x->vocab; i++)
            CF_ENSURE(x->r, q[i] == -1.0f, "propose() left q_valid 0 but wrote q[%d] (a deterministic drafter leaves q "
                      "untouched)", i);
        return true;
    }
    for (int32_t j = 0; j < k; j++) {
        double sum = 0;
        for (int32_t v = 0; v < x->vocab; v++) {
            float pv = q[(size_t)j * x->vocab + v];
            CF_ENSURE(x->r, isfinite(pv) && pv >= 0, "q row %d token %d is %g", j, v, pv);
            sum += pv;
        }
        CF_ENSURE(x->r, fabs(sum - 1.0) < 1e-3, "q row %d sums to %g, not 1", j, sum);
        CF_ENSURE(x->r, q[(size_t)j * x->vocab + draft[j]] > 0, "draft %d (token %d) has q = 0", j, draft[j]);
    }
    return true;
}

static int32_t sx_propose(sx *x, void *self, sx_seq *s, int32_t max_k, int32_t *draft, float *q, int32_t *q_valid) {
    for (int32_t i = 0; i <= SX_KMAX; i++) draft[i] = SX_GUARD;
    for (int32_t i = 0; q && i < max_k * x->vocab; i++) q[i] = -1.0f;
    *q_valid = -5;
    cf_where(x->r, "propose(seq %lld of %d tokens, max_k %d)", (long long)s->info.id, s->info.num_tokens, max_k);
    return x->ops->propose(self, &s->info, &s->p, max_k, draft, q, q_valid);
}

static bool sx_open(cf_run *r, sx *x) {
    memset(x, 0, sizeof *x);
    x->r = r;
    x->ops = r->comp->ops;
    x->vocab = sx_vocab(r);
    x->g = cf_rng_make(r->seed);
    x->q = malloc(sizeof(float) * SX_SEQS * (SX_KMAX + 1) * (size_t)x->vocab);
    x->q2 = malloc(sizeof(float) * SX_SEQS * (SX_KMAX + 1) * (size_t)x->vocab);
    return (x->q && x->q2) || cf_fail(r, "out of memory");
}

static void sx_close(sx *x) {
    free(x->q);
    free(x->q2);
}

static bool check_propose(cf_run *r, const void *arg) {
    sx x;
    void *self = NULL;
    if (!sx_open(r, &x) || !sx_create(r, &self)) {
        sx_close(&x);
        return false;
    }
    bool ok = true;
    int64_t proposed = 0, rounds = cf_iters(r, 40, 10);
    for (int i = 0; i < SX_SEQS; i++) sx_new_seq(&x, &x.seqs[i]);
    for (int64_t round = 0; ok && round < rounds; round++) {
        cf_where(r, "plan(%d)", SX_SEQS);
        int32_t k = x.ops->plan(self, SX_SEQS);
        if (k < 0 || k > 4096) {
            ok = cf_fail(r, "plan(%d) returned %d", SX_SEQS, k);
            break;
        }
        for (int i = 0; ok && i < SX_SEQS; i++) {
            sx_seq *s = &x.seqs[i];
            int32_t max_k = round % 7 == 3 ? 0 : 1 + cf_rng_below(&x.g, SX_KMAX);
            int32_t draft[SX_KMAX + 1], q_valid;
            float *q = i % 2 ? x.q : NULL;
            int32_t n = sx_propose(&x, self, s, max_k, draft, q, &q_valid);
            if (!(ok = sx_check(&x, s, max_k, n, draft, q, q_valid))) break;
            int32_t acc = n ? cf_rng_below(&x.g, n + 1) : 0;
            proposed += n;
            cf_where(r, "observe(seq %lld, %d, %d)", (long long)s->info.id, n, acc);
            if (n) x.ops->observe(self, s->info.id, n, acc);
            sx_advance(&x, s, draft, n, acc);
            if (s->info.num_tokens > SX_CAP - SX_KMAX - 4 || cf_rng_below(&x.g, 10) == 0) {
                cf_where(r, "release(seq %lld)", (long long)s->info.id);
                x.ops->release(self, s->info.id);
                sx_new_seq(&x, s);
            }
        }
    }
    cf_where(r, "release() of an unknown id");
    if (ok) x.ops->release(self, 987654321);
    if (ok && x.ops->stats) {
        loom_spec_stats st = {.struct_size = sizeof st};
        x.ops->stats(self, &st);
        if (st.proposed < 0 || st.accepted < 0 || st.accepted > st.proposed || st.steps_off < 0)
            ok = cf_fail(r, "stats(): proposed %lld, accepted %lld, steps_off %lld", (long long)st.proposed,
                         (long long)st.accepted, (long long)st.steps_off);
    }
    for (int i = 0; i < SX_SEQS; i++) x.ops->release(self, x.seqs[i].info.id);
    if (ok) cf_note(r, "%lld drafts proposed over %lld rounds of %d sequences", (long long)proposed, (long long)rounds,
                    SX_SEQS);
    sx_close(&x);
    if (!ok) {
        x.ops->destroy(self);
        return false;
    }
    return cf_destroy(r, self);
}

/* One round: A proposes one by one (drafts into da), B in one batch; they
 * must agree. */
static bool sx_batch_round(sx *x, void *a, void *b, int32_t *num_a, int32_t (*da)[SX_KMAX + 1]) {
    const loom_seq_info *seqs[SX_SEQS];
    const loom_sampling_params *params[SX_SEQS];
    int32_t max_k[SX_SEQS], db[SX_SEQS][SX_KMAX + 1], qva[SX_SEQS], qvb[SX_SEQS], nb[SX_SEQS];
    int32_t *drafts[SX_SEQS];
    float *qs[SX_SEQS];
    size_t room = (size_t)(SX_KMAX + 1) * (size_t)x->vocab;
    for (int i = 0; i < SX_SEQS; i++) {
        seqs[i] = &x->seqs[i].info;
        params[i] = &x->seqs[i].p;
        max_k[i] = cf_rng_below(&x->g, 5) == 0 ? 0 : 1 + cf_rng_below(&x->g, SX_KMAX);
        drafts[i] = db[i];
        qs[i] = i % 2 ? x->q2 + (size_t)i * room : NULL; /* odd sequences want q */
        for (int32_t j = 0; j <= SX_KMAX; j++) db[i][j] = SX_GUARD;
        for (size_t j = 0; qs[i] && j < (size_t)max_k[i] * (size_t)x->vocab; j++) qs[i][j] = -1.0f;
    }
    for (int i = 0; i < SX_SEQS; i++)
        num_a[i] = sx_propose(x, a, &x->seqs[i], max_k[i], da[i], i % 2 ? x->q + (size_t)i * room : NULL, &qva[i]);
    cf_where(x->r, "propose_batch(%d sequences)", SX_SEQS);
    x->ops->propose_batch(b, SX_SEQS, seqs, params, max_k, drafts, qs, qvb, nb);
    for (int i = 0; i < SX_SEQS; i++) {
        if (!sx_check(x, &x->seqs[i], max_k[i], nb[i], db[i], qs[i], qvb[i])) return false;
        CF_ENSURE(x->r, nb[i] == num_a[i] && !memcmp(da[i], db[i], sizeof(int32_t) * (size_t)nb[i]) && qva[i] == qvb[i],
                  "sequence %d (max_k %d): propose() gave %d drafts (q_valid %d), propose_batch() %d (q_valid %d)%s", i,
                  max_k[i], num_a[i], qva[i], nb[i], qvb[i], nb[i] == num_a[i] ? ", with different tokens" : "");
        for (size_t j = 0; qs[i] && qvb[i] && j < (size_t)nb[i] * (size_t)x->vocab; j++) {
            float va = x->q[(size_t)i * room + j], vb = qs[i][j];
            CF_ENSURE(x->r, fabsf(va - vb) <= 1e-4f + 1e-3f * fabsf(va), "sequence %d: q[%zu] is %g from propose(), "
                      "%g from propose_batch()", i, j, va, vb);
        }
    }
    return true;
}

static bool check_batch(cf_run *r, const void *arg) {
    if (!((const loom_spec_ops *)r->comp->ops)->propose_batch)
        return cf_skip(r, "propose_batch() is NULL (optional): the core proposes one sequence at a time");
    sx x;
    void *a = NULL, *b = NULL;
    if (!sx_open(r, &x) || !sx_create(r, &a) || !sx_create(r, &b)) {
        if (a) x.ops->destroy(a);
        sx_close(&x);
        return false;
    }
    bool ok = true;
    int64_t rounds = cf_iters(r, 24, 6);
    for (int i = 0; i < SX_SEQS; i++) sx_new_seq(&x, &x.seqs[i]);
    for (int64_t round = 0; ok && round < rounds; round++) {
        int32_t num[SX_SEQS], drafts[SX_SEQS][SX_KMAX + 1];
        x.ops->plan(a, SX_SEQS);
        x.ops->plan(b, SX_SEQS);
        if (!(ok = sx_batch_round(&x, a, b, num, drafts))) break;
        for (int i = 0; i < SX_SEQS; i++) {
            sx_seq *s = &x.seqs[i];
            int32_t acc = num[i] ? cf_rng_below(&x.g, num[i] + 1) : 0;
            if (num[i]) {
                x.ops->observe(a, s->info.id, num[i], acc);
                x.ops->observe(b, s->info.id, num[i], acc);
            }
            sx_advance(&x, s, drafts[i], num[i], acc);
            if (s->info.num_tokens > SX_CAP - SX_KMAX - 4 || cf_rng_below(&x.g, 8) == 0) {
                x.ops->release(a, s->info.id);
                x.ops->release(b, s->info.id);
                sx_new_seq(&x, s);
            }
        }
    }
    if (ok) cf_note(r, "%lld rounds of %d sequences", (long long)rounds, SX_SEQS);
    sx_close(&x);
    x.ops->destroy(a);
    if (!ok) {
        x.ops->destroy(b);
        return false;
    }
    return cf_destroy(r, b);
}

int cf_checks_speculator(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_propose, NULL, "spec.propose");
    n = cf_add(out, n, cap, check_batch, NULL, "spec.batch");
    return n;
}
