/*
 * loom/seq.h — what schedulers, cache managers and speculators may see of a
 * sequence. The core owns sequences; plugins get read-only views that are
 * valid only during the call they are passed to.
 *
 * A request with n > 1 samples becomes n sequences sharing a request_id
 * (forked after prefill, so they share the prompt's KV blocks).
 */
#ifndef LOOM_SEQ_H
#define LOOM_SEQ_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int64_t loom_seq_id;

/* Grows only at its end. */
typedef struct loom_seq_info {
    uint32_t struct_size;
    loom_seq_id id;
    int64_t request_id;        /* shared by the n samples of one request     */
    int32_t priority;          /* lower value is served first; default 0     */
    double arrival_time;       /* seconds on the core's monotonic clock      */
    int32_t num_prompt_tokens; /* tokens of the prompt                       */
    int32_t num_tokens;        /* prompt + generated (+ drafts, see below)   */
    int32_t num_computed;      /* leading tokens whose K/V are in the cache  */
    int32_t max_total_tokens;  /* prompt + max new tokens: upper bound       */
    const int32_t *tokens;     /* (num_tokens) borrowed                      */
    int32_t num_draft;         /* trailing tokens that are speculative drafts */
} loom_seq_info;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_SEQ_H */
