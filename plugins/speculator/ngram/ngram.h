/*
 * plugins/speculator/ngram/ngram.h — private to the `ngram` speculator and
 * its tests: the config struct the host fills, the ops table, and the pure
 * suffix matcher. Not part of the SDK; never installed.
 *
 * Split like plugins/cache/paged: ngram.c (the drafter) and ngram_entry.c
 * (the descriptor), so tests/spec compiles ngram.c into its own program.
 */
#ifndef LOOM_PLUGIN_SPEC_NGRAM_H
#define LOOM_PLUGIN_SPEC_NGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/spec.h"

/* `search`: where an earlier occurrence of the suffix may lie. */
enum { LOOM_NGRAM_SEARCH_PROMPT = 0, LOOM_NGRAM_SEARCH_CONTEXT = 1 };

/* Filled by the host from loom_ngram_params (offsets into this struct). */
typedef struct loom_ngram_config {
    int64_t num_draft_tokens; /* k max, drafts per sequence per step, >= 1   */
    int64_t min_ngram;        /* shortest suffix tried, tokens                */
    int64_t max_ngram;        /* longest suffix tried (first), tokens         */
    int64_t search;           /* LOOM_NGRAM_SEARCH_*                          */
    bool adaptive;            /* k follows each sequence's acceptance         */
    int64_t max_batch;        /* plan() returns 0 above this many decoders; 0 = never */
    int64_t max_verify_tokens;/* positions verified per step, batch * (k+1), at most; 0 = no cap */
} loom_ngram_config;

extern const loom_spec_ops loom_ngram_ops;
extern const loom_param loom_ngram_params[];

/*
 * Prompt lookup: find the longest n in [max_n .. min_n] such that the last
 * n tokens of tokens[0, num_tokens) occur earlier, the most recent
 * occurrence first, and copy up to max_k of the tokens that followed it
 * into draft. An occurrence must end at or before `search_end` (the prompt
 * length to match against the prompt only; num_tokens - 1 for the whole
 * context) and strictly before the suffix itself ends. Returns the number
 * of drafts written (0: no match); *match_len gets n (0 when none).
 * O(num_tokens * max_n) time, no memory.
 */
int32_t loom_ngram_match(const int32_t *tokens, int32_t num_tokens, int32_t search_end, int32_t min_n,
                         int32_t max_n, int32_t max_k, int32_t *draft, int32_t *match_len);

#endif
