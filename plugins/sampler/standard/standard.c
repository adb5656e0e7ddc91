/*
 * plugins/sampler/standard/standard.c — the "standard" sampler: logits to
 * tokens with the knobs every OpenAI-style server exposes.
 *
 * Per row, in this order (as vLLM and llama.cpp do):
 *
 *   0. NaN logits count as -inf; a row with no finite logit, or with a +inf
 *      logit, is rejected (LOOM_ERR_INVALID) before any row is touched.
 *   1. Log-probabilities: log-softmax of the model's RAW logits, before any
 *      bias, penalty or temperature. out->logprobs and the top-N alternatives
 *      (out->top_ids / top_logprobs) report this distribution, so they say
 *      what the model thought, not what the knobs made of it.
 *   1a. Constraint mask (row->allowed, ABI 2.3): every token outside it
 *      becomes -inf, so nothing below can bring it back.
 *   1b. Logit bias (OpenAI logit_bias; row->logit_bias, ABI 2.2): logit +=
 *      bias for each listed token (a masked -inf logit stays masked), as
 *      llama.cpp's sampler chain does first.
 *   2. Repetition penalty (CTRL, Keskar et al. 2019): every distinct token of
 *      prompt + output, once: positive logit / penalty, negative * penalty.
 *   3. Presence and frequency penalties (OpenAI): over OUTPUT tokens only,
 *      logit -= presence + frequency * count.
 *   4. temperature == 0: greedy, argmax (ties -> lowest id); steps 5-8 are
 *      skipped (the argmax survives every filter anyway) and no random
 *      number is drawn.
 *   5. Temperature: logit / T.
 *   6. Top-k (0 = off): keep the k best.
 *   7. Top-p (1 = off): keep the smallest prefix of the sorted distribution
 *      (after top-k, renormalised) whose mass reaches top_p; at least one.
 *   8. Min-p (0 = off): drop tokens with p < min_p * p_max.
 *   9. Draw with ONE host->rng_uniform(row->rng_state): a seeded request gives
 *      the same token stream however it is batched.
 *
 * probs() runs steps 0 and 2-8 and writes the resulting distribution over
 * the whole row; sample() draws from exactly those float probabilities (both
 * go through std_row_dist), so a speculative verifier using probs() sees
 * the distribution sample() really uses.
 *
 * Candidate rows (the row's best logits with their token ids, declared
 * through candidates(): greedy, or top_k <= 64, and no penalties; the core
 * never sends a row with a logit bias as candidates) run the
 * same steps over the candidates' columns; the columns are ordered as the
 * ids would be, so the token drawn is the one the whole row would give,
 * and logprobs use the whole row's log-sum-exp the core passes along.
 *
 * Ranking ties are broken by lower token id everywhere (select.h). Cost per
 * row is O(vocab) for the log-softmax and the filters; sorting is limited
 * to the surviving candidates: a bounded heap for top-k <= STD_HEAP_MAX,
 * quickselect above, and top-p without top-k keeps the candidates above a
 * weight threshold that already holds the nucleus mass (std_nucleus_bound)
 * and sorts growing chunks of them until the nucleus is complete.
 *
 * Threads: sample() and probs() are [instance] (loom/sampler.h): the
 * scratch below is per instance, so one instance serves one thread at a
 * time; separate instances share nothing.
 *
 * Not here: beam search, grammar masks, typical-p, mirostat.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/sampler.h"

#include "select.h"

#define STD_NAME "standard"
/* Above this k a bounded heap loses to quickselect over all candidates. */
#define STD_HEAP_MAX 1024
/* First chunk sorted when looking for the top-p nucleus without top-k. */
#define STD_NUCLEUS_CHUNK 64
/* Bytes of loom_sampling_params up to the last field this plugin reads. */
#define STD_PARAMS_V1_SIZE (offsetof(loom_sampling_params, logprobs) + sizeof(int32_t))

/* ------------------------------------------------------------------ config */

/* Filled by the host from the declared table below. */
typedef struct std_config {
    int64_t max_logprobs; /* most alternatives a request may ask for, 0..20 */
} std_config;

static const loom_param std_params[] = {
    {.key = "max_logprobs",
     .type = LOOM_PARAM_INT,
     .offset = offsetof(std_config, max_logprobs),
     .default_value = "20",
     .min = 0,
     .max = LOOM_MAX_LOGPROBS,
     .doc = "most top-N alternatives a request may ask for (logprobs); larger requests are rejected"},
    {.key = NULL},
};

/* ------------------------------------------------------------------- state */

/* Per-token scratch for the bias and penalties, valid only where epoch ==
 * the current row's epoch, so nothing is cleared between rows. */
typedef struct std_slot {
    uint32_t epoch; /* row stamp; stale when != std_sampler.epoch            */
    int32_t count;  /* occurrences in the output (presence/frequency)       */
    float raw;      /* logit before bias and penalties (the chosen token's logprob) */
    float bias;     /* the row's logit bias for this token (0: none)         */
    bool prompt;    /* in the prompt (repetition penalty)                    */
} std_slot;

typedef struct std_sampler {
    const loom_host *host;  /* borrowed until destroy                     */
    int64_t max_logprobs;   /* from std_config                            */
    int32_t cap;            /* vocab the scratch below is sized for        */
    std_cand *cand;         /* (cap) candidates of the current row         */
    std_slot *slots;        /* (cap) penalty scratch, epoch-stamped        */
    int32_t *touched;       /* (cap) distinct penalised tokens of the row  */
    uint32_t epoch;         /* stamp of the current row in slots           */
} std_sampler;

/* What std_row_dist leaves behind: self->cand[0..n) with w = the float
 * probability (as double) of each candidate; every other token has 0. */
typedef struct std_dist {
    int64_t n;      /* candidates with non-zero probability (>= 1)        */
    bool greedy;    /* temperature 0: one-hot, no random draw             */
    bool penalised; /* slots hold this row's raw logits for touched ids   */
} std_dist;

/* --------------------------------------------------------------- helpers */

static loom_status std_fail_bare(loom_error *err, loom_status code, const char *msg) {
    if (err) {
        err->code = code;
        snprintf(err->message, sizeof err->message, "sampler '%s': %s", STD_NAME, msg);
    }
    return code;
}

static bool std_has_penalties(const loom_sampling_params *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* The row's logit-bias entries (0 from a core older than ABI 2.2). */
static int32_t std_num_bias(const loom_sample_row *row) {
    return LOOM_HAS_FIELD(row, loom_sample_row, num_logit_bias) ? row->num_logit_bias : 0;
}

/* Make the scratch hold `vocab` tokens. */
static loom_status std_reserve(std_sampler *s, int32_t vocab, loom_error *err) {
    if (vocab <= s->cap) return LOOM_OK;
    const loom_host *h = s->host;
    h->free(h->ctx, s->cand);
    h->free(h->ctx, s->slots);
    h->free(h->ctx, s->touched);
    s->cap = 0;
    s->epoch = 0;
    s->cand = h->alloc(h->ctx, (size_t)vocab * sizeof *s->cand);
    s->slots = h->calloc(h->ctx, (size_t)vocab, sizeof *s->slots);
    s->touched = h->alloc(h->ctx, (size_t)vocab * sizeof *s->touched);
    if (!s->cand || !s->slots || !s->touched) goto fail_alloc;
    s->cap = vocab;
    return LOOM_OK;

fail_alloc:
    h->free(h->ctx, s->cand);
    h->free(h->ctx, s->slots);
    h->free(h->ctx, s->touched);
    s->cand = NULL;
    s->slots = NULL;
    s->touched = NULL;
    return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                    "sampler '%s': cannot allocate scratch for vocab %d (%zu bytes)", STD_NAME,
                    vocab, (size_t)vocab * (sizeof(std_cand) + sizeof(std_slot) + sizeof(int32_t)));
}

static uint32_t std_next_epoch(std_sampler *s) {
    if (s->epoch == UINT32_MAX) {
        memset(s->slots, 0, (size_t)s->cap * sizeof *s->slots);
        s->epoch = 0;
    }
    return ++s->epoch;
}

/* ------------------------------------------------------------- validation */

static loom_status std_check_history(std_sampler *s, const int32_t *ids, int32_t len,
                                     const char *what, int32_t vocab, int32_t r, loom_error *err) {
    const loom_host *h = s->host;
    if (len < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "sampler '%s': row %d: %s_len = %d is negative",
                        STD_NAME, r, what, len);
    if (len > 0 && !ids)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': row %d: %s is NULL but %s_len = %d", STD_NAME, r, what, what,
                        len);
    for (int32_t i = 0; i < len; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "sampler '%s': row %d: %s[%d] = %d is outside the vocabulary [0, %d); "
                            "the token history does not belong to this model",
                            STD_NAME, r, what, i, ids[i], vocab);
    return LOOM_OK;
}

/* Everything about one row that can be checked without touching logits.
 * `need_rng`: sample() draws from row->rng_state when temperature > 0. */
static loom_status std_check_row(std_sampler *s, const loom_sample_row *row, int32_t vocab,
                                 int32_t r, bool need_rng, loom_error *err) {
    const loom_host *h = s->host;
    const loom_sampling_params *p = row->params;
    loom_status st = LOOM_OK;
#define STD_BAD(...) h->error(h->ctx, err, LOOM_ERR_INVALID, __VA_ARGS__)
    if (!p) return STD_BAD("sampler '%s': row %d: params is NULL", STD_NAME, r);
    if (p->struct_size < STD_PARAMS_V1_SIZE)
        return STD_BAD("sampler '%s': row %d: params.struct_size = %u, smaller than the %zu this sampler reads; "
                       "start from loom_sampling_params_default()",
                       STD_NAME, r, p->struct_size, (size_t)STD_PARAMS_V1_SIZE);
    if (!(isfinite(p->temperature) && p->temperature >= 0.0f))
        return STD_BAD("sampler '%s': row %d: temperature = %g is invalid; use 0 (greedy) or a "
                       "finite value > 0",
                       STD_NAME, r, (double)p->temperature);
    if (p->top_k < 0)
        return STD_BAD("sampler '%s': row %d: top_k = %d is invalid; use 0 (off) or a positive "
                       "count",
                       STD_NAME, r, p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return STD_BAD("sampler '%s': row %d: top_p = %g is invalid; it must be in (0, 1] (1 = off)",
                       STD_NAME, r, (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return STD_BAD("sampler '%s': row %d: min_p = %g is invalid; it must be in [0, 1] (0 = off)",
                       STD_NAME, r, (double)p->min_p);
    if (!(isfinite(p->repetition_penalty) && p->repetition_penalty > 0.0f))
        return STD_BAD("sampler '%s': row %d: repetition_penalty = %g is invalid; it must be finite "
                       "and > 0 (1 = off)",
                       STD_NAME, r, (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty))
        return STD_BAD("sampler '%s': row %d: presence_penalty = %g is invalid; it must be finite "
                       "(0 = off)",
                       STD_NAME, r, (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return STD_BAD("sampler '%s': row %d: frequency_penalty = %g is invalid; it must be finite "
                       "(0 = off)",
                       STD_NAME, r, (double)p->frequency_penalty);
    if (p->logprobs < 0 || p->logprobs > s->max_logprobs)
        return STD_BAD("sampler '%s': row %d: logprobs = %d is invalid; it must be in [0, %lld] "
                       "(max_logprobs of this sampler)",
                       STD_NAME, r, p->logprobs, (long long)s->max_logprobs);
    if (need_rng && p->temperature > 0.0f && !row->rng_state)
        return STD_BAD("sampler '%s': row %d: rng_state is NULL but temperature = %g needs it",
                       STD_NAME, r, (double)p->temperature);
    const int32_t nb = std_num_bias(row);
    if (nb < 0 || nb > LOOM_MAX_LOGIT_BIAS || (nb > 0 && !row->logit_bias))
        return STD_BAD("sampler '%s': row %d: num_logit_bias = %d%s; it must be in [0, %d]", STD_NAME, r, nb,
                       nb > 0 && !row->logit_bias ? " with a NULL logit_bias" : "", LOOM_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < nb; i++) {
        const loom_logit_bias *b = &row->logit_bias[i];
        if (b->token < 0 || b->token >= vocab || !(isfinite(b->bias) && fabsf(b->bias) <= LOOM_LOGIT_BIAS_MAX))
            return STD_BAD("sampler '%s': row %d: logit_bias[%d] = (token %d, bias %g): the token must be in "
                           "[0, %d) and the bias finite within +-%g",
                           STD_NAME, r, i, b->token, (double)b->bias, vocab, (double)LOOM_LOGIT_BIAS_MAX);
    }
#undef STD_BAD
    if (std_has_penalties(p)) {
        st = std_check_history(s, row->output, row->output_len, "output", vocab, r, err);
        if (st != LOOM_OK) return st;
        if (p->repetition_penalty != 1.0f)
            st = std_check_history(s, row->prompt, row->prompt_len, "prompt", vocab, r, err);
    }
    return st;
}

/* NaN -> -inf in place; reject rows with +inf or with nothing finite. */
static loom_status std_sanitize_row(std_sampler *s, float *x, int32_t vocab, int32_t r,
                                    loom_error *err) {
    const loom_host *h = s->host;
    bool any = false;
    for (int32_t i = 0; i < vocab; i++) {
        float v = x[i];
        if (isnan(v)) {
            x[i] = -INFINITY;
        } else if (v == INFINITY) {
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "sampler '%s': row %d: logit of token %d is +inf; the model output "
                            "overflowed (check the backend and its dtype)",
                            STD_NAME, r, i);
        } else if (v > -INFINITY) {
            any = true;
        }
    }
    if (!any)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': all logits are NaN or -inf in row %d (vocab %d); nothing "
                        "can be sampled",
                        STD_NAME, r, vocab);
    return LOOM_OK;
}

/* --------------------------------------------------------------- pipeline */

/* Step 1 inputs: max and log-sum-exp of the raw row (double); the row has
 * at least one finite logit. */
static void std_log_softmax_stats(const float *x, int32_t vocab, double *lse) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++)
        if (x[i] > -INFINITY) sum += exp((double)x[i] - (double)mx);
    *lse = (double)mx + log(sum);
}

/* The slot of token t for this row (epoch), first touched now: remember
 * its raw logit. */
static std_slot *std_touch(std_sampler *s, const float *x, int32_t t, uint32_t epoch, int32_t *ntouched) {
    std_slot *sl = &s->slots[t];
    if (sl->epoch != epoch) {
        *sl = (std_slot){.epoch = epoch, .raw = x[t]};
        s->touched[(*ntouched)++] = t;
    }
    return sl;
}

/* Steps 1b-3, in place on x. Returns whether slots now hold this row's raw
 * logits (for every touched token). */
static bool std_adjust_logits(std_sampler *s, float *x, const loom_sample_row *row) {
    const loom_sampling_params *p = row->params;
    const int32_t nb = std_num_bias(row);
    if (!std_has_penalties(p) && nb == 0) return false;
    const bool rep = p->repetition_penalty != 1.0f;
    const uint32_t epoch = std_next_epoch(s);
    int32_t ntouched = 0;
    for (int32_t i = 0; i < nb; i++)
        std_touch(s, x, row->logit_bias[i].token, epoch, &ntouched)->bias += row->logit_bias[i].bias;
    if (std_has_penalties(p)) {
        for (int32_t i = 0; i < row->output_len; i++) std_touch(s, x, row->output[i], epoch, &ntouched)->count++;
        if (rep)
            for (int32_t i = 0; i < row->prompt_len; i++) std_touch(s, x, row->prompt[i], epoch, &ntouched)->prompt = true;
    }

    const double rp = p->repetition_penalty;
    const double pres = p->presence_penalty, freq = p->frequency_penalty;
    for (int32_t i = 0; i < ntouched; i++) {
        const std_slot *sl = &s->slots[s->touched[i]];
        double l = sl->raw;
        if (!(l > -INFINITY)) continue; /* masked stays masked */
        l += sl->bias;
        if (rep && (sl->prompt || sl->count > 0)) l = l > 0.0 ? l / rp : l * rp;
        if (sl->count > 0) l -= pres + freq * sl->count;
        /* A tiny repetition penalty or a huge count must not turn a finite
         * logit into +-inf (which would poison the softmax or mask it). */
        if (l > FLT_MAX) l = FLT_MAX;
        if (l < -FLT_MAX) l = -FLT_MAX;
        x[s->touched[i]] = (float)l;
    }
    return true;
}

/* The nucleus is a prefix of the ranking, and w falls with the rank: when
 * the candidates with w >= t already hold more than the target mass, the
 * prefix ends among them, and ranking only them gives the same prefix with
 * the same running sums. Thresholds t = 2^-8, 2^-16, ... (w is relative to
 * the best candidate's 1); the first that holds the mass (with a margin
 * over the two summation orders' rounding) moves its candidates to the
 * front and is how many std_nucleus ranks, instead of quickselecting
 * chunks out of the whole vocabulary (a 262k-token row: most of a
 * sampled step's host time). Returns n when no threshold does. */
static int64_t std_nucleus_bound(std_cand *c, int64_t n, double target) {
    double t = 1.0;
    for (int tries = 0; tries < 8; tries++) {
        t *= 1.0 / 256;
        double m = 0.0;
        for (int64_t i = 0; i < n; i++)
            if (c[i].w >= t) m += c[i].w;
        if (!(m > target * (1.0 + 1e-9))) continue;
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++)
            if (c[i].w >= t) {
                const std_cand x = c[k];
                c[k++] = c[i];
                c[i] = x;
            }
        return k;
    }
    return n;
}

/* Top-p (step 7) over c[0..n) with unnormalised weights w and total mass
 * `z` of the post-top-k set. Reorders c so that the returned count are the
 * nucleus, best first. When `sorted`, c is already best first. */
static int64_t std_nucleus(std_cand *c, int64_t n, bool sorted, double top_p, double z) {
    const double target = top_p * z;
    if (!sorted) n = std_nucleus_bound(c, n, target);
    double cum = 0.0;
    int64_t lo = 0, chunk = sorted ? n : STD_NUCLEUS_CHUNK;
    while (lo < n) {
        int64_t hi = n - lo > chunk ? lo + chunk : n;
        if (!sorted) {
            std_cand_select(c + lo, n - lo, hi - lo);
            std_cand_sort(c + lo, hi - lo);
        }
        for (int64_t i = lo; i < hi; i++) {
            cum += c[i].w;
            if (cum >= target) return i + 1;
        }
        lo = hi;
        chunk *= 4;
    }
    return n;
}

/* Steps 2-8 on one sanitised row: the distribution to draw from, left in
 * s->cand (see std_dist). x keeps the penalised logits. */
static std_dist std_row_dist(std_sampler *s, float *x, int32_t vocab, const loom_sample_row *row) {
    const loom_sampling_params *p = row->params;
    std_dist d = {.n = 0, .greedy = false, .penalised = std_adjust_logits(s, x, row)};

    /* Argmax (first maximum = lowest id) and count of finite logits. */
    int32_t best = -1, nfin = 0;
    float vmax = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) {
        float v = x[i];
        if (!(v > -INFINITY)) continue;
        nfin++;
        if (best < 0 || v > vmax) {
            vmax = v;
            best = i;
        }
    }

    if (p->temperature == 0.0f) {
        s->cand[0] = (std_cand){.v = vmax, .id = best, .w = 1.0};
        d.n = 1;
        d.greedy = true;
        return d;
    }

    /* Step 6: top-k, or every finite token. With top_k set the candidates
     * are ranked best first even when top_k keeps every finite token, so
     * the draw walks them in the order a candidate row's columns have and
     * both give the same token for the same uniform (loom/sampler.h). */
    std_cand *c = s->cand;
    int64_t n = 0;
    bool sorted = false;
    const int64_t k = p->top_k > 0 && p->top_k < nfin ? p->top_k : nfin;
    if (p->top_k > 0 && k <= STD_HEAP_MAX) {
        n = std_cand_top_k(x, vocab, k, c);
        sorted = true;
    } else {
        for (int32_t i = 0; i < vocab; i++)
            if (x[i] > -INFINITY) c[n++] = (std_cand){.v = x[i], .id = i, .w = 0.0};
        if (k < n) {
            std_cand_select(c, n, k);
            n = k;
        }
    }

    /* Step 5: temperature. w = exp((v - vmax) / T), so the best token has
     * w = 1 exactly and w is also p / p_max (what min-p compares). */
    const double T = p->temperature;
    double z = 0.0;
    for (int64_t i = 0; i < n; i++) {
        c[i].w = exp(((double)c[i].v - (double)vmax) / T);
        z += c[i].w;
    }

    /* Steps 7-8. Min-p keeps a prefix of the ranking defined relative to the
     * max, which renormalisation does not move, and top-p keeps a prefix
     * measured against z (the post-top-k mass): so filtering min-p first and
     * then cutting the nucleus against z gives exactly "top-p, then min-p",
     * while top-p then has fewer candidates to rank. */
    if (p->min_p > 0.0f) {
        const double mp = p->min_p;
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (c[i].w >= mp) c[m++] = c[i];
        n = m;
    }
    if (p->top_p < 1.0f) n = std_nucleus(c, n, sorted, p->top_p, z);

    /* Final probabilities, rounded to float once: probs() writes exactly
     * these and sample() draws from exactly these. */
    double zk = 0.0;
    for (int64_t i = 0; i < n; i++) zk += c[i].w;
    for (int64_t i = 0; i < n; i++) c[i].w = (double)(float)(c[i].w / zk);
    d.n = n;
    return d;
}

/* Step 9: one uniform draw over s->cand[0..n) weighted by w. */
static int32_t std_draw(const std_sampler *s, const std_cand *c, int64_t n, uint64_t *rng) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) total += c[i].w;
    const double target = s->host->rng_uniform(rng) * total;
    double cum = 0.0;
    int64_t pick = -1;
    for (int64_t i = 0; i < n; i++) {
        if (c[i].w <= 0.0) continue;
        cum += c[i].w;
        pick = i;
        if (target < cum) break;
    }
    /* pick is the last positive candidate if rounding ran past the end;
     * there is always one (the best token has probability > 0). */
    return c[pick < 0 ? 0 : pick].id;
}

/* Step 1 output: the N best raw logprobs, descending; unused slots get id
 * -1 and -inf. */
static void std_write_top(const float *x, int32_t vocab, int32_t want, double lse, int32_t *ids,
                          float *lps) {
    std_cand top[LOOM_MAX_LOGPROBS];
    int64_t n = want > 0 ? std_cand_top_k(x, vocab, want, top) : 0;
    for (int64_t i = 0; i < LOOM_MAX_LOGPROBS; i++) {
        if (ids) ids[i] = i < n ? top[i].id : -1;
        if (lps) lps[i] = i < n ? (float)((double)top[i].v - lse) : -INFINITY;
    }
}

/* -------------------------------------------------------------------- ops */

static loom_status std_create(const loom_host *host, const void *config, void **self,
                              loom_error *err) {
    if (!host || !host->alloc || !host->calloc || !host->free || !host->error || !self)
        return std_fail_bare(err, LOOM_ERR_INVALID,
                             "create: host table (alloc/calloc/free/error) and self are required");
    const std_config defaults = {.max_logprobs = LOOM_MAX_LOGPROBS};
    const std_config *cfg = config ? config : &defaults;
    if (cfg->max_logprobs < 0 || cfg->max_logprobs > LOOM_MAX_LOGPROBS)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "sampler '%s': max_logprobs = %lld is out of range [0, %d]", STD_NAME,
                           (long long)cfg->max_logprobs, LOOM_MAX_LOGPROBS);
    std_sampler *s = host->calloc(host->ctx, 1, sizeof *s);
    if (!s)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "sampler '%s': cannot allocate %zu bytes",
                           STD_NAME, sizeof *s);
    s->host = host;
    s->max_logprobs = cfg->max_logprobs;
    *self = s;
    return LOOM_OK;
}

static void std_destroy(void *self) {
    std_sampler *s = self;
    if (!s) return;
    const loom_host *h = s->host;
    h->free(h->ctx, s->cand);
    h->free(h->ctx, s->slots);
    h->free(h->ctx, s->touched);
    h->free(h->ctx, s);
}

/* The batch's shape and pointers; rows are checked one by one after. */
static loom_status std_check_batch(std_sampler *s, const loom_sample_batch *b, loom_sample_out *out,
                                   loom_error *err) {
    const loom_host *h = s->host;
    if (!b || b->struct_size < sizeof *b || !out || out->struct_size < sizeof *out)
        return h->error(h->ctx, err, LOOM_ERR_ABI, "sampler '%s': sample: batch or out missing or too short",
                        STD_NAME);
    if (b->n < 0 || b->vocab <= 0 || b->width <= 0 || b->width > b->vocab ||
        (!b->candidates && b->width != b->vocab))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': sample: n = %d, vocab = %d, width = %d (whole rows need width == vocab, "
                        "candidate rows 0 < width <= vocab)",
                        STD_NAME, b->n, b->vocab, b->width);
    if (b->n > 0 && (!b->logits || !b->rows || !out->tokens || (b->candidates && !b->lse)))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': sample: logits, rows, out->tokens (and lse with candidates) are required",
                        STD_NAME);
    return LOOM_OK;
}

/* Candidate rows carry no penalties and no bias: those move tokens outside
 * the row. */
static loom_status std_check_cand_row(std_sampler *s, const loom_sample_batch *b, int32_t r, loom_error *err) {
    const loom_host *h = s->host;
    const int32_t *ids = b->candidates + (size_t)r * b->width;
    if (std_has_penalties(b->rows[r]->params) || std_num_bias(b->rows[r]) > 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': row %d: penalties and a logit bias need the whole row, but it came as %d "
                        "candidates",
                        STD_NAME, r, b->width);
    for (int32_t j = 0; j < b->width; j++)
        if (ids[j] < 0 || ids[j] >= b->vocab)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "sampler '%s': row %d: candidate %d has token id %d outside [0, %d)", STD_NAME, r, j,
                            ids[j], b->vocab);
    return LOOM_OK;
}

/* Step 1a: tokens outside the row's constraint mask to -inf (columns map
 * to token ids through ids when the row is candidates). */
static void std_apply_mask(float *x, int32_t width, const int32_t *ids, const loom_sample_row *row) {
    if (!LOOM_HAS_FIELD(row, loom_sample_row, allowed) || !row->allowed) return;
    for (int32_t i = 0; i < width; i++) {
        const int32_t t = ids ? ids[i] : i;
        if (!((row->allowed[t >> 5] >> (t & 31)) & 1u)) x[i] = -INFINITY;
    }
}

/* Steps 0-9 for row r (x: its `width` logits; ids: its candidates' token
 * ids or NULL; lse_given: the whole row's log-sum-exp for candidates). */
static void std_sample_row(std_sampler *s, float *x, int32_t width, const int32_t *ids, const float *lse_given,
                           const loom_sample_row *row, loom_sample_out *out, int32_t r) {
    const loom_sampling_params *p = row->params;
    const bool want_top = out->top_ids || out->top_logprobs;
    int32_t *top_ids = out->top_ids ? out->top_ids + (size_t)r * LOOM_MAX_LOGPROBS : NULL;
    double lse = 0.0;
    if (lse_given) lse = *lse_given;
    else if (out->logprobs || want_top) std_log_softmax_stats(x, width, &lse);
    if (want_top) {
        std_write_top(x, width, p->logprobs, lse, top_ids,
                      out->top_logprobs ? out->top_logprobs + (size_t)r * LOOM_MAX_LOGPROBS : NULL);
        for (int32_t i = 0; ids && top_ids && i < LOOM_MAX_LOGPROBS; i++)
            if (top_ids[i] >= 0) top_ids[i] = ids[top_ids[i]];
    }
    std_apply_mask(x, width, ids, row);
    std_dist d = std_row_dist(s, x, width, row);
    int32_t col = d.greedy ? s->cand[0].id : std_draw(s, s->cand, d.n, row->rng_state);
    out->tokens[r] = ids ? ids[col] : col;
    if (out->logprobs) {
        float raw = x[col];
        if (d.penalised && s->slots[col].epoch == s->epoch) raw = s->slots[col].raw;
        out->logprobs[r] = (float)((double)raw - lse);
    }
}

/* Rows are validated and sanitised first, so a bad row fails the call
 * before any rng state or output is touched (logits may already have had
 * NaN replaced by -inf). */
static loom_status std_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    std_sampler *s = self;
    if (!s) return std_fail_bare(err, LOOM_ERR_INVALID, "sample: self is NULL");
    loom_status st = std_check_batch(s, b, out, err);
    if (st != LOOM_OK || b->n == 0) return st;
    for (int32_t r = 0; r < b->n; r++) {
        if (!b->rows[r] || b->rows[r]->struct_size < sizeof(loom_sample_row))
            return s->host->error(s->host->ctx, err, LOOM_ERR_ABI, "sampler '%s': row %d missing or too short",
                                  STD_NAME, r);
        st = std_check_row(s, b->rows[r], b->vocab, r, true, err);
        if (st == LOOM_OK && b->candidates) st = std_check_cand_row(s, b, r, err);
        if (st == LOOM_OK) st = std_sanitize_row(s, b->logits + (size_t)r * (size_t)b->width, b->width, r, err);
        if (st != LOOM_OK) return st;
    }
    if ((st = std_reserve(s, b->vocab, err)) != LOOM_OK) return st;
    for (int32_t r = 0; r < b->n; r++)
        std_sample_row(s, b->logits + (size_t)r * (size_t)b->width, b->width,
                       b->candidates ? b->candidates + (size_t)r * b->width : NULL, b->lse ? b->lse + r : NULL,
                       b->rows[r], out, r);
    return LOOM_OK;
}

/* Whole rows are needed for penalties (they move any token) and for
 * sampling not bounded by top_k; greedy needs only the argmax. Either way
 * the reported alternatives must be among the candidates. */
static int32_t std_candidates(void *self, const loom_sampling_params *p) {
    (void)self;
    if (!p || std_has_penalties(p)) return 0;
    int32_t k = p->temperature == 0.0f ? 1 : p->top_k;
    if (k <= 0 || k > LOOM_LOGITS_TOPK_MAX) return 0;
    return p->logprobs > k ? p->logprobs : k;
}

/* A new request's parameters, refused exactly as std_sample would refuse
 * its row (std_check_row is what sample() runs before any logit). */
static loom_status std_check(void *self, const loom_sample_row *row, int32_t vocab, loom_error *err) {
    std_sampler *s = self;
    if (!s) return std_fail_bare(err, LOOM_ERR_INVALID, "check: self is NULL");
    if (vocab <= 0)
        return s->host->error(s->host->ctx, err, LOOM_ERR_INVALID, "sampler '%s': check: vocab = %d; it must be > 0",
                              STD_NAME, vocab);
    if (!row || row->struct_size < sizeof(loom_sample_row))
        return s->host->error(s->host->ctx, err, LOOM_ERR_ABI, "sampler '%s': check: row missing or too short",
                              STD_NAME);
    return std_check_row(s, row, vocab, 0, true, err);
}

static loom_status std_probs(void *self, float *logits, int32_t vocab, const loom_sample_row *row,
                             loom_error *err) {
    std_sampler *s = self;
    if (!s) return std_fail_bare(err, LOOM_ERR_INVALID, "probs: self is NULL");
    const loom_host *h = s->host;
    loom_status st = LOOM_OK;
    if (vocab <= 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': probs: vocab = %d; it must be > 0", STD_NAME, vocab);
    if (!logits || !row)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "sampler '%s': probs: logits and row are required", STD_NAME);
    st = std_check_row(s, row, vocab, 0, false, err);
    if (st != LOOM_OK) return st;
    st = std_sanitize_row(s, logits, vocab, 0, err);
    if (st != LOOM_OK) return st;
    st = std_reserve(s, vocab, err);
    if (st != LOOM_OK) return st;

    std_apply_mask(logits, vocab, NULL, row);
    std_dist d = std_row_dist(s, logits, vocab, row);
    for (int32_t i = 0; i < vocab; i++) logits[i] = 0.0f;
    for (int64_t i = 0; i < d.n; i++) logits[s->cand[i].id] = (float)s->cand[i].w;
    return LOOM_OK;
}

/* ------------------------------------------------------------- descriptor */

static const loom_sampler_ops std_ops = {
    .struct_size = sizeof(loom_sampler_ops),
    .create = std_create,
    .destroy = std_destroy,
    .sample = std_sample,
    .probs = std_probs,
    .candidates = std_candidates,
    .check = std_check,
};

static const loom_component std_components[] = {
    {
        .struct_size = sizeof(loom_component),
        .kind = LOOM_KIND_SAMPLER,
        .name = STD_NAME,
        .summary = "temperature, top-k, top-p, min-p, repetition/presence/frequency penalties, "
                   "seeded draws, logprobs",
        .ops = &std_ops,
        .params = std_params,
        .config_size = sizeof(std_config),
    },
};

static const loom_plugin_desc std_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-sampler-standard",
    .version = "0.1.0",
    .num_components = 1,
    .components = std_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &std_desc; }
