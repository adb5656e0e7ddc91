/*
 * tests/plugin/good/stub_ops.h — do-nothing implementations of every
 * REQUIRED method of every kind, so test plugins that exist to exercise the
 * loader, the pipeline and the CLI pass the loader's NULL-method check.
 * Each STUB_<KIND>_OPS expands to designated initialisers for the methods
 * other than create/destroy. They refuse (LOOM_ERR_UNSUPPORTED) or report
 * nothing when called.
 */
#ifndef LOOM_TEST_STUB_OPS_H
#define LOOM_TEST_STUB_OPS_H

#include "loom/cache.h"
#include "loom/executor.h"
#include "loom/quant.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/spec.h"

#define STUB_NO LOOM_ERR_UNSUPPORTED

static inline loom_status stub_load(void *s, const loom_model_view *m, const loom_quant_binding *q, loom_error *e) {
    return (void)s, (void)m, (void)q, (void)e, STUB_NO;
}
static inline size_t stub_kv_block_bytes(void *s, int32_t b, loom_dtype d) { return (void)s, (void)b, (void)d, 0; }
static inline loom_status stub_memory(void *s, loom_backend_memory *o, loom_error *e) {
    return (void)s, (void)o, (void)e, STUB_NO;
}
static inline loom_status stub_kv_alloc(void *s, const loom_kv_layout *l, loom_error *e) {
    return (void)s, (void)l, (void)e, STUB_NO;
}
static inline loom_status stub_forward(void *s, const loom_batch *b, float *l, loom_error *e) {
    return (void)s, (void)b, (void)l, (void)e, STUB_NO;
}
static inline loom_status stub_copy_blocks(void *s, const int32_t *p, int32_t n, loom_error *e) {
    return (void)s, (void)p, (void)n, (void)e, STUB_NO;
}
static inline int32_t stub_inner_count(void *s) { return (void)s, 1; }
static inline loom_status stub_attach_inner(void *s, const loom_backend_ops *o, void *const *i, int32_t n,
                                            loom_error *e) {
    return (void)s, (void)o, (void)i, (void)n, (void)e, STUB_NO;
}
static inline loom_status stub_add(void *s, const loom_seq_info *q, loom_error *e) {
    return (void)s, (void)q, (void)e, STUB_NO;
}
static inline void stub_remove(void *s, loom_seq_id q) { (void)s, (void)q; }
static inline loom_status stub_schedule(void *s, const loom_sched_env *v, loom_sched_output *o, loom_error *e) {
    return (void)s, (void)v, (void)o, (void)e, STUB_NO;
}
static inline loom_status stub_init(void *s, const loom_cache_init *i, loom_kv_layout *l, loom_error *e) {
    return (void)s, (void)i, (void)l, (void)e, STUB_NO;
}
static inline int32_t stub_prefix(void *s, const loom_seq_info *q) { return (void)s, (void)q, 0; }
static inline loom_status stub_allocate(void *s, const loom_seq_info *q, int32_t n, loom_error *e) {
    return (void)s, (void)q, (void)n, (void)e, LOOM_ERR_NO_SPACE;
}
static inline void stub_truncate(void *s, const loom_seq_info *q, int32_t n) { (void)s, (void)q, (void)n; }
static inline void stub_free(void *s, loom_seq_id q) { (void)s, (void)q; }
static inline loom_status stub_fork(void *s, loom_seq_id a, loom_seq_id b, loom_error *e) {
    return (void)s, (void)a, (void)b, (void)e, STUB_NO;
}
static inline int32_t stub_table(void *s, loom_seq_id q, int32_t *o, int32_t c) {
    return (void)s, (void)q, (void)o, (void)c, 0;
}
static inline int32_t stub_take_ops(void *s, loom_block_op *o, int32_t c) { return (void)s, (void)o, (void)c, 0; }
static inline int32_t stub_num_free(void *s) { return (void)s, 0; }
static inline loom_status stub_plan(void *s, const loom_model_view *m, const loom_tensor *w, loom_quant_plan *o,
                                    loom_error *e) {
    return (void)s, (void)m, (void)w, (void)e, o->format = LOOM_QFMT_NONE, LOOM_OK;
}
static inline loom_status stub_quantize(void *s, const loom_model_view *m, const loom_tensor *w,
                                        const loom_quant_plan *p, loom_qtensor *o, loom_error *e) {
    return (void)s, (void)m, (void)w, (void)p, (void)o, (void)e, STUB_NO;
}
static inline void stub_release(void *s, loom_qtensor *q) { (void)s, (void)q; }
static inline loom_status stub_sample(void *s, const loom_sample_batch *b, loom_sample_out *o, loom_error *e) {
    return (void)s, (void)b, (void)o, (void)e, STUB_NO;
}
static inline loom_status stub_probs(void *s, float *l, int32_t v, const loom_sample_row *r, loom_error *e) {
    return (void)s, (void)l, (void)v, (void)r, (void)e, STUB_NO;
}
static inline loom_status stub_spec_init(void *s, const loom_spec_init *i, loom_error *e) {
    return (void)s, (void)i, (void)e, LOOM_OK;
}
static inline int32_t stub_spec_plan(void *s, int32_t n) { return (void)s, (void)n, 0; }
static inline int32_t stub_propose(void *s, const loom_seq_info *q, const loom_sampling_params *p, int32_t k,
                                   int32_t *d, float *f, int32_t *v) {
    return (void)s, (void)q, (void)p, (void)k, (void)d, (void)f, (void)v, 0;
}
static inline void stub_observe(void *s, loom_seq_id q, int32_t a, int32_t b) { (void)s, (void)q, (void)a, (void)b; }

#define STUB_RUNNER_OPS                                                                                  \
    .load = stub_load, .kv_block_bytes = stub_kv_block_bytes, .memory = stub_memory,                   \
    .kv_alloc = stub_kv_alloc, .forward = stub_forward, .copy_blocks = stub_copy_blocks
#define STUB_BACKEND_OPS STUB_RUNNER_OPS
#define STUB_EXECUTOR_OPS STUB_RUNNER_OPS, .inner_count = stub_inner_count, .attach_inner = stub_attach_inner
#define STUB_SCHEDULER_OPS .add = stub_add, .remove = stub_remove, .schedule = stub_schedule
#define STUB_CACHE_OPS                                                                                   \
    .init = stub_init, .acquire_prefix = stub_prefix, .allocate = stub_allocate, .truncate = stub_truncate, \
    .free = stub_free, .fork = stub_fork, .block_table = stub_table, .take_block_ops = stub_take_ops,       \
    .num_free_blocks = stub_num_free
#define STUB_QUANTIZER_OPS .plan = stub_plan, .quantize = stub_quantize, .release = stub_release
#define STUB_SAMPLER_OPS .sample = stub_sample, .probs = stub_probs
#define STUB_SPECULATOR_OPS                                                                              \
    .init = stub_spec_init, .plan = stub_spec_plan, .propose = stub_propose, .observe = stub_observe,      \
    .release = stub_remove

#endif
