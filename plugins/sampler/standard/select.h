/*
 * plugins/sampler/standard/select.h — ranking candidates without sorting the
 * whole vocabulary.
 *
 * A candidate is a (logit, token id) pair plus a weight slot the sampler
 * fills. Candidates are ranked by one total order: larger logit first, and
 * on equal logits the lower token id first. Every selection, sort and argmax
 * in this plugin uses that order, so results never depend on the order of
 * an unstable sort and greedy, top-k and top-p agree on ties.
 *
 * Scope: host memory, single thread; no allocation (callers pass scratch).
 */
#ifndef LOOM_SAMPLER_STANDARD_SELECT_H
#define LOOM_SAMPLER_STANDARD_SELECT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct std_cand {
    float v;    /* penalised logit, before temperature                     */
    int32_t id; /* token id, 0..vocab-1                                     */
    double w;   /* weight; meaning set by the caller (see standard.c)      */
} std_cand;

/* True when `a` ranks strictly before `b` (larger v; on ties lower id). */
static inline bool std_cand_before(const std_cand *a, const std_cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

/* Sort c[0..n) best first. O(n log n). */
void    std_cand_sort(std_cand *c, int64_t n);

/* Partial selection (nth_element): afterwards c[0..k) hold the k best of
 * c[0..n), in no particular order. O(n) expected; falls back to a full sort
 * of the remaining range on a degenerate pivot sequence. No-op if k <= 0 or
 * k >= n. */
void    std_cand_select(std_cand *c, int64_t n, int64_t k);

/* The k best finite entries of logits (vocab) written to out[0..ret), best
 * first, using a bounded heap: O(vocab) compares plus O(k log k) per
 * replacement, cheap for small k. -inf entries are skipped (callers have
 * already turned NaN into -inf). Returns min(k, number of finite entries).
 * w of each output is set to 0. */
int64_t std_cand_top_k(const float *logits, int32_t vocab, int64_t k, std_cand *out);

#endif
