/*
 * tests/common/eng_util.h — helpers for the engine's end-to-end tests: open
 * an engine from a pipeline under tests/engine/data with overrides, record
 * every streamed event of a request (per sample: token ids, log-probs, text,
 * final events), step until every request is done, and compare two runs
 * token by token; for the executor suites (tp, pp), a fixed set of batched
 * requests run on a plain backend and through an executor and compared.
 * Every helper fails the current Criterion test on error.
 */
#ifndef LOOM_TEST_ENG_UTIL_H
#define LOOM_TEST_ENG_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/engine.h"

#define ENG_MAX_SAMPLES 8

/* What one sample of a request streamed. */
typedef struct eng_sample {
    int32_t *tokens;       /* (ntok) ids of the token events              */
    float *lps;            /* (ntok) their log-probs                      */
    int32_t *alt;          /* (ntok) best other token (logprobs >= 2), -1 */
    float *alt_lp;         /* (ntok) its log-prob                          */
    int32_t ntok, cap;
    char *text;            /* concatenation of every event's text         */
    size_t len;
    int32_t finals;        /* events with finish != NONE                   */
    int32_t after_final;   /* events that came after a final one (bug)     */
    int32_t final_token;   /* token of the final event                     */
    loom_finish_reason finish;
    char error[1024];
} eng_sample;

/* One request's record; pass as loom_request.user with eng_on_token. */
typedef struct eng_rec {
    int64_t seen_id;       /* request_id of the events (-1: none yet)      */
    int32_t bad_events;    /* events with a wrong request id / sample index */
    int32_t n;             /* samples expected                             */
    int32_t prompt_tokens; /* loom_token_event.prompt_tokens (-1: none yet) */
    eng_sample s[ENG_MAX_SAMPLES];
} eng_rec;

void eng_rec_init(eng_rec *r, int32_t n);
void eng_rec_free(eng_rec *r);
void eng_on_token(void *user, const loom_token_event *ev);
/* Every sample ended with exactly one final event and nothing after it. */
void eng_rec_check_done(const eng_rec *r);

/* Path of tests/<folder>/data/<name>, malloc'd; eng_data: folder "engine". */
char *eng_data_in(const char *folder, const char *name);
char *eng_data(const char *name);
/* Skip the test when LOOM_TEST_MODEL is unset; returns its value. */
const char *eng_need_model(void);
/* Build an engine from tests/engine/data/<pipeline> with NULL-terminated overrides. */
loom_engine *eng_open(const char *pipeline, const char *const *overrides);
/* The same from tests/<folder>/data/<pipeline>. */
loom_engine *eng_open_in(const char *folder, const char *pipeline, const char *const *overrides);
/* As eng_open_in, but a failure is returned (err filled, *e NULL), not a
 * failed test: for the tests that expect one. */
loom_status eng_try_open_in(const char *folder, const char *pipeline, const char *const *overrides,
                            loom_engine **e, loom_error *err);
/* Teacher-forced log-probs of tok[0..n) (loom_engine_score), malloc'd (n). */
float *eng_score(loom_engine *e, const int32_t *tok, int32_t n);
/* Add a request recording into rec (sets on_token/user); fails the test on -1. */
int64_t eng_add(loom_engine *e, loom_request req, eng_rec *rec);
/* Step until nothing is active (at most max_steps steps). */
void eng_run(loom_engine *e, int32_t max_steps);

/* Deterministic token-id prompt of n ids in [3, vocab) from seed. */
void eng_prompt(int32_t *out, int32_t n, uint32_t seed, int32_t vocab);

/* Compare two greedy runs of one sample. Identical ids pass. At the first
 * difference, pass only when it is a float near-tie: each run's alternative
 * at that position is the other run's choice and the two choices' log-probs
 * are within tol (needs logprobs >= 2 on the request); the rest is then not
 * compared (the texts diverge). Returns the number of identical leading
 * tokens. `what` names the comparison in failure messages. */
int32_t eng_same_greedy(const eng_sample *a, const eng_sample *b, float tol, const char *what);

/* Greedy request with ids. */
loom_request eng_req_tokens(const int32_t *ids, int32_t n, int32_t max_tokens);

/* ------------------------------------------- a request set (executor tests) */

/* ENG_SET_N greedy requests of different prompt and output lengths, run
 * together so batches mix prefill chunks with decodes; request 0 also
 * records every sampling distribution it streams. The executor suites run
 * one set on a plain backend and one through their executor and compare. */
#define ENG_SET_N 5

typedef struct eng_set_rec {
    eng_rec rec;
    float *probs;          /* (count, vocab) request 0's distributions     */
    int32_t count, cap;
    int32_t vocab;
} eng_set_rec;

/* Run the set on tests/<folder>/data/<pipeline> with `overrides` (prompts
 * of ids below vocab, logprobs 2); every request must make its tokens.
 * Fills recs[ENG_SET_N] and, when st is not NULL, the engine's stats. */
void eng_set_run(const char *folder, int32_t vocab, const char *pipeline,
                 const char *const *overrides, eng_set_rec *recs, loom_engine_stats *st);
void eng_set_free(eng_set_rec *recs);
/* Identical greedy ids (no near-tie allowance); log-probs and request 0's
 * distributions within tol (0: bit-identical). */
void eng_set_same(const eng_set_rec *a, const eng_set_rec *b, double tol, const char *what);

/* SmolLM2 (LOOM_TEST_MODEL; call eng_need_model first) on
 * tests/<folder>/data/smol.yaml with ref_overrides against `pipeline`
 * with `overrides`: teacher-forced log-probs of `text` within tol, and a
 * chat answer (40 greedy tokens) with the same text and token ids and
 * log-probs within tol. `what` names the second in messages. */
void eng_smol_compare(const char *folder, const char *pipeline, const char *const *ref_overrides,
                      const char *const *overrides, const char *text, double tol, const char *what);

#endif
