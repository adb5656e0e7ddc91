/*
 * loom/sampler.h — samplers: logits to tokens.
 *
 * The sampler sees one row of logits per sequence that needs a token, with
 * that sequence's parameters, its token history (for penalties) and its own
 * random state (core-owned, so a seeded request gives the same text however
 * it is batched). It may modify the logits rows in place.
 *
 * Rows arrive whole unless the sampler says, per request, that it can work
 * from a row's best k logits (candidates()): then the backend may reduce
 * the row on its device and the sampler is told, with the candidates' token
 * ids and the whole row's log-sum-exp. A sampler that does not declare it
 * always gets whole rows, whatever the request's parameters.
 */
#ifndef LOOM_SAMPLER_H
#define LOOM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAX_LOGPROBS 20

/* Per-request sampling parameters. Neutral values turn a feature off.
 * Frozen: embedded by value in loom_request (new knobs go into
 * loom_request). */
typedef struct loom_sampling_params {
    uint32_t struct_size;
    float temperature;         /* 0 = greedy (argmax)                       */
    int32_t top_k;             /* 0 = off                                    */
    float top_p;               /* 1 = off                                    */
    float min_p;               /* 0 = off: drop p < min_p * p_max            */
    float repetition_penalty;  /* 1 = off; over prompt + output (CTRL)       */
    float presence_penalty;    /* 0 = off; over output tokens (OpenAI)       */
    float frequency_penalty;   /* 0 = off; over output tokens (OpenAI)       */
    uint64_t seed;             /* used when has_seed                         */
    bool has_seed;
    int32_t logprobs;          /* alternatives to return, 0..LOOM_MAX_LOGPROBS */
} loom_sampling_params;

/* One entry of a request's logit bias (OpenAI `logit_bias`): `bias` is
 * added to token `token`'s logit before anything else the sampler does.
 * Passed in arrays: frozen for ABI 2. */
typedef struct loom_logit_bias {
    int32_t token;
    float bias;
} loom_logit_bias;

/* Most entries one request's logit bias may hold. */
#define LOOM_MAX_LOGIT_BIAS 1024
/* The range of one bias (OpenAI's: -100 bans a token, +100 all but forces it). */
#define LOOM_LOGIT_BIAS_MAX 100.0f

/* One sequence to sample for. Borrowed for the call. Grows only at its
 * end. */
typedef struct loom_sample_row {
    uint32_t struct_size;
    const loom_sampling_params *params;
    const int32_t *prompt;     /* (prompt_len) token ids                     */
    int32_t prompt_len;
    const int32_t *output;     /* (output_len) tokens generated so far       */
    int32_t output_len;
    uint64_t *rng_state;       /* (4) the sequence's own stream (core-owned);
                                  advance it only through host->rng_*       */
    /* since ABI 2.2 (read only when LOOM_HAS_FIELD(row, loom_sample_row,
     * num_logit_bias)): the request's logit bias, distinct tokens inside the
     * vocabulary, each |bias| <= LOOM_LOGIT_BIAS_MAX (the core checks that
     * before a row exists). A row with a bias always comes whole, never as
     * candidates: the bias can move tokens into the top k. */
    const loom_logit_bias *logit_bias; /* (num_logit_bias); NULL when 0     */
    int32_t num_logit_bias;
    /* since ABI 2.3 (read only when LOOM_HAS_FIELD(row, loom_sample_row,
     * allowed)): the request's decoding constraint (loom/constraint.h) as a
     * bitset over the vocabulary, bit v of word v / 32 set when token v may
     * be chosen, never all zero. A sampler treats every other token's
     * logit as -inf after it has taken the raw logprobs (they still report
     * what the model thought) and before anything else. NULL: no
     * constraint. A row with a mask comes whole, or, when the runner masks
     * candidates (loom/backend.h, loom_logits_topk.allowed), as the best
     * allowed tokens with the raw row's lse (the core then asks for no
     * logprob alternatives from it). The core checks
     * the chosen token against the mask and fails a sampler that ignored
     * it. */
    const uint32_t *allowed;   /* (LOOM_MASK_WORDS(vocab)) or NULL           */
} loom_sample_row;

/*
 * One call's rows: either all whole rows (candidates == NULL: width ==
 * vocab, column v is token v) or all candidate rows (candidates != NULL:
 * each row is its `width` largest raw logits, descending, equal values by
 * ascending id, column j standing for token candidates[r * width + j];
 * lse[r] is the log-sum-exp of the WHOLE raw row, so logprobs over the
 * vocabulary are value - lse). Candidate rows reach only a sampler that
 * declared it can use them (loom_sampler_ops.candidates). Grows only at
 * its end.
 */
typedef struct loom_sample_batch {
    uint32_t struct_size;
    int32_t n;                 /* rows                                       */
    int32_t vocab;             /* the model's vocabulary size                */
    int32_t width;             /* floats per row: vocab, or the candidates   */
    float *logits;             /* (n, width) raw logits; the sampler may
                                  modify them in place                      */
    const loom_sample_row *const *rows; /* (n)                               */
    const int32_t *candidates; /* (n, width) token ids, or NULL: whole rows  */
    const float *lse;          /* (n) whole rows' log-sum-exp, or NULL       */
} loom_sample_batch;

/* Results, core-owned arrays of the batch's n rows. The core sets
 * struct_size and the pointers; the sampler writes only through them.
 * Grows only at its end. */
typedef struct loom_sample_out {
    uint32_t struct_size;
    int32_t *tokens;           /* (n) chosen token ids (vocabulary ids)      */
    float *logprobs;           /* (n) or NULL: log-prob of the chosen token
                                  under the model's raw distribution (before
                                  penalties and temperature)                */
    int32_t *top_ids;          /* (n, LOOM_MAX_LOGPROBS) or NULL: the
                                  params->logprobs most likely tokens under
                                  that distribution, best first; -1 pads
                                  (also for tokens of probability 0)       */
    float *top_logprobs;       /* (n, LOOM_MAX_LOGPROBS) or NULL; -inf pads  */
} loom_sample_out;

typedef struct loom_sampler_ops {
    uint32_t struct_size;
    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    loom_destroy_fn *destroy;     /* REQUIRED                                 */
    /* REQUIRED [instance]. One token per row of `b`, written to `out`.
     * Refuse (LOOM_ERR_INVALID, naming the row and the value) parameters
     * the sampler cannot honour — at least a temperature that is negative
     * or not finite, top_k < 0 and logprobs outside 0..LOOM_MAX_LOGPROBS;
     * neutral and greedy parameters must be accepted. A new request is
     * checked alone before it runs (check() below, or one dry sample()
     * when check is NULL). A failed call may have
     * modified the logits but has written no token and advanced no rng. */
    loom_status (*sample)(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err);
    /* REQUIRED [instance]. Turn one WHOLE row of raw logits (vocab floats)
     * into the probability distribution sample() would draw from for `row`
     * (greedy: one-hot at the argmax), in place. The core verifies
     * speculative drafts against it and hands it to requests that want
     * their distributions (draft engines). */
    loom_status (*probs)(void *self, float *logits, int32_t vocab, const loom_sample_row *row,
                         loom_error *err);
    /* OPTIONAL [instance] (NULL = every row arrives whole). How many of a
     * row's best logits this sampler needs to sample a request with
     * `params` exactly as it would from the whole row — including the
     * params->logprobs alternatives it reports: 0 = the whole row; k in
     * 1..LOOM_LOGITS_TOPK_MAX = the row may arrive as a candidate row of at
     * least k candidates (loom_sample_batch), reduced on the device. The
     * core still sends whole rows when it needs them itself (the first
     * token of an n > 1 request, sampled draft verification, want_probs,
     * and the dry sample() that checks a new request when check is NULL).
     * Verifying the drafts of a greedy request (temperature 0) on
     * candidate rows, the core takes the best candidate itself, calling
     * neither sample() nor probs(): a sampler whose greedy choice is not the
     * raw argmax (masks, biases) returns 0 for such params. */
    int32_t (*candidates)(void *self, const loom_sampling_params *params);
    /* since ABI 2.1 (read it only when LOOM_HAS_FIELD(ops, loom_sampler_ops,
     * check): a 2.0 table ends before it) */
    /* OPTIONAL [instance] (NULL = the core checks a new request with one
     * dry sample() of a flat whole row, which costs a whole-row sample per
     * request: about a millisecond at a 128k vocabulary, paid on the step
     * loop's thread). Refuse, exactly as sample() would refuse that row,
     * the parameters of `row` (its params, prompt and output so far; no
     * logits), with LOOM_ERR_INVALID and a message naming the value. Must
     * not touch row->rng_state. The core calls it once per new request,
     * before the request is scheduled. */
    loom_status (*check)(void *self, const loom_sample_row *row, int32_t vocab, loom_error *err);
    /* add new members below this line only */
} loom_sampler_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SAMPLER_H */
