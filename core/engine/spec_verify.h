/*
 * core/engine/spec_verify.h — speculative-decoding verification as a pure
 * function, so its distribution can be tested without a model.
 */
#ifndef LOOM_CORE_SPEC_VERIFY_H
#define LOOM_CORE_SPEC_VERIFY_H

#include <stdint.h>

/*
 * Verify n draft tokens (Leviathan et al. / Chen et al. rejection sampling).
 *   p     (n + 1, vocab) target distributions: row i is the distribution
 *         the sampler would draw from at draft position i given the drafts
 *         before it (row n: after all n drafts). Greedy sampling gives
 *         one-hot rows, which makes this plain "accept while equal to the
 *         argmax".
 *   q     (n, vocab) draft distributions, or NULL when the drafter is
 *         deterministic (q one-hot at draft[i]).
 *   draft (n) the proposed tokens.
 * For i = 0..n-1: accept draft[i] with probability min(1, p_i[d] / q_i[d]);
 * on the first rejection draw from normalise(max(0, p_i - q_i)) and stop.
 * If all n are accepted, draw one more token from p_n. The emitted tokens
 * then follow the target distribution exactly.
 * Writes accepted drafts + the final token to out (capacity n + 1), sets
 * *accepted and returns the number written (accepted + 1). rng is the
 * sequence's xoshiro256** state (plugin/host_rules.h).
 */
int32_t loom_spec_verify(const float *p, const float *q, const int32_t *draft, int32_t n, int32_t vocab,
                         uint64_t rng[4], int32_t *out, int32_t *accepted);

#endif
