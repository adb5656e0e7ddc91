/*
 * loom/executor.h — executors: one model over several devices (tensor
 * parallel today; pipeline and expert parallel have the same shape).
 *
 * An executor owns no device itself. The engine creates N instances of the
 * pipeline's `backend:` component (N from inner_count()), hands them to
 * attach_inner(), and from then on drives the executor exactly as it would
 * drive one backend: the model-runner methods below mean what the
 * same-named methods of loom_backend_ops mean (loom/backend.h), for the
 * model as a whole. The executor decides how the work is split (shard
 * plans, communicators, threads per rank) and calls the inner backends'
 * methods — load_shard() instead of load() where it shards.
 *
 * Ownership: the engine creates the inner instances before attach_inner()
 * and destroys them after the executor's destroy(); the executor never
 * destroys them. Every method is [engine].
 */
#ifndef LOOM_EXECUTOR_H
#define LOOM_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_executor_ops {
    uint32_t struct_size;      /* sizeof(loom_executor_ops)                  */

    /* REQUIRED. As every component (loom/plugin.h). */
    loom_status (*create)(const loom_host *host, const void *config, void **self, loom_error *err);
    /* REQUIRED. Free the executor's own state (threads, communicators);
     * never the inner backends. self may be NULL. */
    void (*destroy)(void *self);

    /* --- the inner backends ------------------------------------------ */

    /* REQUIRED. How many inner backend instances to create (1..1024). */
    int32_t (*inner_count)(void *self);
    /* REQUIRED. Receive them, once, before load(): `inner` is the backend
     * component's table, `instances` its n = inner_count() instances
     * (borrowed until destroy). Refuse (LOOM_ERR_UNSUPPORTED) a backend
     * that lacks what the executor needs (e.g. load_shard), naming it. */
    loom_status (*attach_inner)(void *self, const loom_backend_ops *inner, void *const *instances, int32_t n,
                                loom_error *err);

    /* --- the model runner: as loom_backend_ops ---------------------------- */

    /* REQUIRED. */
    loom_status (*load)(void *self, const loom_model_view *model, const loom_quant_binding *quant,
                        loom_error *err);
    /* REQUIRED. Bytes of one block on the device that needs the most: one
     * block id names the same block on every device. */
    size_t (*kv_block_bytes)(void *self, int32_t block_size, loom_dtype dtype);
    /* REQUIRED. What every device of the group can give: the least free
     * memory (shared host RAM divided among the ranks). */
    loom_status (*memory)(void *self, loom_backend_memory *out, loom_error *err);
    /* REQUIRED. */
    loom_status (*kv_alloc)(void *self, const loom_kv_layout *layout, loom_error *err);
    /* REQUIRED. */
    loom_status (*forward)(void *self, const loom_batch *batch, float *logits, loom_error *err);
    /* REQUIRED. */
    loom_status (*copy_blocks)(void *self, const int32_t *pairs, int32_t n, loom_error *err);
    /* OPTIONAL (NULL = whole rows). */
    loom_status (*forward_topk)(void *self, const loom_batch *batch, const loom_logits_topk *out,
                                loom_error *err);
    /* OPTIONAL (NULL = no swapping). */
    loom_status (*swap_blocks)(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                               loom_error *err);
    /* since ABI 2.0 — add new members below this line only */
} loom_executor_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_EXECUTOR_H */
