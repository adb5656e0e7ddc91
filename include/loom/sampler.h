/*
 * loom/sampler.h — samplers: logits to tokens.
 *
 * The sampler sees one row of logits per sequence that needs a token, with
 * that sequence's parameters, its token history (for penalties) and its own
 * random state (core-owned, so a seeded request gives the same text however
 * it is batched). It may modify the logits rows in place.
 */
#ifndef LOOM_SAMPLER_H
#define LOOM_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAX_LOGPROBS 20

/* Per-request sampling parameters. Neutral values turn a feature off.
 * Grows only at its end. */
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

/* Fill with neutral values (greedy). */
static inline loom_sampling_params loom_sampling_params_default(void) {
    loom_sampling_params p = {0};
    p.struct_size = sizeof p;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

/* One row to sample. Borrowed for the call. */
typedef struct loom_sample_row {
    const loom_sampling_params *params;
    const int32_t *prompt;     /* (prompt_len) */
    int32_t prompt_len;
    const int32_t *output;     /* (output_len) tokens generated so far */
    int32_t output_len;
    uint64_t *rng_state;       /* (4) per-sequence state; advanced by sample() */
} loom_sample_row;

/* Results, core-owned arrays. */
typedef struct loom_sample_out {
    int32_t *tokens;           /* (n)                                        */
    float *logprobs;           /* (n) log-prob of the chosen token under the
                                  model's distribution (before penalties/temperature) */
    int32_t *top_ids;          /* (n, LOOM_MAX_LOGPROBS) or NULL             */
    float *top_logprobs;       /* (n, LOOM_MAX_LOGPROBS) or NULL             */
} loom_sample_out;

typedef struct loom_sampler_ops {
    uint32_t struct_size;
    loom_status (*create)(const loom_host *host, const void *config, void **self, loom_error *err);
    void (*destroy)(void *self);
    /* [instance] Sample one token per row. logits: (n, vocab), modified. */
    loom_status (*sample)(void *self, float *logits, int32_t vocab, const loom_sample_row *rows,
                          int32_t n, loom_sample_out *out, loom_error *err);
    /* [instance] Turn one row of logits into the probability distribution
     * sample() would draw from (penalties, temperature, top-k/p, min-p
     * applied; greedy gives one-hot), in place. Used to verify drafts. */
    loom_status (*probs)(void *self, float *logits, int32_t vocab, const loom_sample_row *row,
                         loom_error *err);
    /* since ABI 1.1 — add new members below this line only */
} loom_sampler_ops;

/* Seed a per-sequence rng state (xoshiro256** convention) from a 64-bit
 * seed with splitmix64. Shared so core and plugins agree. */
static inline void loom_rng_seed(uint64_t state[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        state[i] = z ^ (z >> 31);
    }
}

/* Next 64 random bits (xoshiro256**). */
static inline uint64_t loom_rng_next(uint64_t s[4]) {
    uint64_t r = s[1] * 5, t = s[1] << 17;
    r = ((r << 7) | (r >> 57)) * 9;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = (s[3] << 45) | (s[3] >> 19);
    return r;
}

/* Uniform double in [0, 1). */
static inline double loom_rng_uniform(uint64_t s[4]) {
    return (double)(loom_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SAMPLER_H */
