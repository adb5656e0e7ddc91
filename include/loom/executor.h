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

    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    loom_destroy_fn *destroy;     /* REQUIRED; the executor's own state (threads,
                                     communicators), never the inner backends */

    /* --- the inner backends ------------------------------------------ */

    /* REQUIRED. How many inner backend instances to create (1..1024). */
    int32_t (*inner_count)(void *self);
    /* REQUIRED. Receive them, once, before load(): `inner` is the backend
     * component's table, `instances` its n = inner_count() instances
     * (borrowed until destroy). Refuse (LOOM_ERR_UNSUPPORTED) a backend
     * that lacks what the executor needs (e.g. load_shard), naming it. */
    loom_status (*attach_inner)(void *self, const loom_backend_ops *inner, void *const *instances, int32_t n,
                                loom_error *err);

    /* --- the model runner (loom/backend.h), for the model as a whole ---- */

    loom_load_fn *load;                     /* REQUIRED                        */
    /* REQUIRED: bytes on the device that needs the most (one block id names
     * the same block on every device). */
    loom_kv_block_bytes_fn *kv_block_bytes;
    /* REQUIRED: what every device of the group can give (the least free
     * memory; shared host RAM divided among the ranks). */
    loom_memory_fn *memory;
    loom_kv_alloc_fn *kv_alloc;             /* REQUIRED                        */
    loom_forward_fn *forward;               /* REQUIRED                        */
    loom_copy_blocks_fn *copy_blocks;       /* REQUIRED                        */
    loom_forward_topk_fn *forward_topk;     /* OPTIONAL (NULL = whole rows)     */
    loom_swap_blocks_fn *swap_blocks;       /* OPTIONAL (NULL = no swapping)    */
    /* since ABI 2.0 — add new members below this line only */
} loom_executor_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_EXECUTOR_H */
