/*
 * loom/spec.h — speculators: propose draft tokens; the core verifies them.
 *
 * Before a step the core asks the speculator for up to k drafts per decoding
 * sequence. The drafts are appended to the sequence (seq->num_draft counts
 * them), the scheduler budgets k+1 positions, one target forward scores
 * them all, and the core verifies: greedy — accept while the draft equals
 * the target's argmax; sampling — accept with probability min(1, p/q), on
 * rejection resample from normalise(max(0, p - q)), with p and q both taken
 * through the sampler's probs() so temperature/top-k/top-p apply to both.
 * Rejected slots are rolled back through the cache manager's truncate().
 * A speculator that can draft for many sequences in one go sets
 * propose_batch; the core then asks once per step.
 *
 * All functions are [engine].
 */
#ifndef LOOM_SPEC_H
#define LOOM_SPEC_H

#include <stdint.h>

#include "loom/engine.h"
#include "loom/plugin.h"
#include "loom/sampler.h"
#include "loom/seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Grows only at its end. */
typedef struct loom_spec_init {
    uint32_t struct_size;
    int32_t vocab_size;
    const char *pipeline_dir;  /* directory of the main YAML (for relative draft paths) */
    int32_t max_model_len;     /* the target's context, tokens               */
    const loom_engine_api *engine_api; /* to build and run a draft engine    */
} loom_spec_init;

/* Grows only at its end. */
typedef struct loom_spec_stats {
    uint32_t struct_size;
    int64_t proposed;          /* draft tokens proposed                     */
    int64_t accepted;          /* draft tokens accepted                     */
    int64_t steps_off;         /* steps where speculation turned itself off */
} loom_spec_stats;

typedef struct loom_spec_ops {
    uint32_t struct_size;
    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    loom_destroy_fn *destroy;     /* REQUIRED                                 */
    /* REQUIRED. Once, after the target engine is built (`init` borrowed for
     * the call; init->engine_api lives as long as the process). */
    loom_status (*init)(void *self, const loom_spec_init *init, loom_error *err);
    /* REQUIRED. How many drafts per sequence this step for a batch of
     * `batch_size` decoding sequences; 0 turns speculation off for this
     * step. */
    int32_t (*plan)(void *self, int32_t batch_size);
    /* REQUIRED. Propose up to max_k drafts for seq (whose tokens hold
     * everything so far). Writes draft ids and, when `q` is non-NULL and the
     * drafter is stochastic, the draft distribution per position
     * (k, vocab), setting *q_valid to 1; a deterministic drafter leaves q
     * untouched and *q_valid 0 (q is then one-hot). Returns k (0..max_k). */
    int32_t (*propose)(void *self, const loom_seq_info *seq, const loom_sampling_params *params,
                       int32_t max_k, int32_t *draft, float *q, int32_t *q_valid);
    /* REQUIRED. Feedback after verification (adaptive k). */
    void (*observe)(void *self, loom_seq_id seq, int32_t proposed, int32_t accepted);
    /* REQUIRED. The sequence ended: drop per-sequence state. Unknown ids
     * are ignored. */
    void (*release)(void *self, loom_seq_id seq);
    /* OPTIONAL (NULL = the engine reports zeros). The core sets
     * out->struct_size and zeroes the rest. */
    void (*stats)(void *self, loom_spec_stats *out);
    /* OPTIONAL (NULL = the core calls propose() once per sequence).
     * propose() for n sequences at once, so a drafter can batch its work
     * across them (draft-model: one draft engine step per draft position
     * for all n, not one per sequence). Entry i must be exactly what
     *     num[i] = propose(self, seqs[i], params[i], max_k[i], draft[i], q[i], &q_valid[i])
     * would give, the calls made for i = 0..n-1 in order: num[i] drafts
     * (0..max_k[i]) written to draft[i]; q[i] is NULL or room for
     * (max_k[i], vocab) floats, filled as propose() fills q; q_valid[i] as
     * propose() sets *q_valid. The core calls it at most once per step,
     * with every sequence that may draft this step (each seq at most once). */
    void (*propose_batch)(void *self, int32_t n, const loom_seq_info *const *seqs,
                          const loom_sampling_params *const *params, const int32_t *max_k,
                          int32_t *const *draft, float *const *q, int32_t *q_valid, int32_t *num);
    /* since ABI 2.0 — add new members below this line only */
} loom_spec_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SPEC_H */
