/*
 * plugins/executor/pp/pp_nccl.c — the NCCL kind of the pp executor's links
 * and stage collectives, for GPU backends: rank i (stage i / tp_size,
 * tensor rank i % tp_size) on device i of this node.
 *
 *   links        one communicator over all ranks (ncclCommInitAll on devices
 *                0..size-1); send_next is ncclSend to rank + tp_size,
 *                recv_prev ncclRecv from rank - tp_size, both enqueued on
 *                the stream the backend passes, so they order with its
 *                kernels and nothing here synchronises; NCCL pairs a pair's
 *                sends and receives in call order, which is the order
 *                loom_stage promises;
 *   collectives  with tp_size > 1, one communicator per stage over its
 *                devices (ncclCommInitAll on that device list), used as the
 *                stage's loom_comm (all_reduce_sum, all_gather).
 *
 * Unlike the threads links, NCCL does not see a count mismatch between
 * sender and receiver (the stages run the same backend on the same
 * micro-batches, so there is none). After a rank fails every communicator
 * is aborted (ncclCommAbort) so peers blocked in NCCL return; the engine
 * must then be recreated.
 *
 * UNTESTED: built with LOOM_PP_HAVE_NCCL (CUDA and libnccl found at
 * configure) and compiled in the CUDA build; the cuda backend's stages
 * (load_stage, device links) have run on one GPU over the threads links
 * only — a run here needs several GPUs. Single node only.
 */
#ifdef LOOM_PP_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>

#include "pp.h"

#include "formats/dtype.h"

struct pp_nccl {
    const loom_host *host;
    int32_t size, tp;            /* ranks; tensor ranks per stage               */
    ncclComm_t *world;           /* (size) the links' communicator, per rank    */
    ncclComm_t *stage;           /* (size) rank i's stage communicator (tp > 1) */
    pp_nccl_stage *stage_ctx;    /* (size / tp) each stage's loom_comm ctx      */
    atomic_bool aborted;
};

int pp_nccl_device_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) *why = cudaGetErrorString(e);
        return -1;
    }
    return n;
}

static loom_status pp_nccl_fail(const loom_host *h, loom_error *err, const char *what, ncclResult_t r) {
    return h->error(h->ctx, err, LOOM_ERR_DEVICE, "executor pp: %s failed: %s (%s)", what, ncclGetErrorString(r),
                    ncclGetLastError(NULL));
}

/* Each stage's collectives: a communicator over its tp devices. */
static loom_status pp_nccl_stages(pp_nccl *c, loom_error *err) {
    const int32_t stages = c->size / c->tp;
    int devs[64];
    for (int32_t s = 0; s < stages; s++) {
        c->stage_ctx[s] = (pp_nccl_stage){.nc = c, .stage = s};
        if (c->tp == 1) continue;
        for (int32_t k = 0; k < c->tp; k++) devs[k] = s * c->tp + k;
        ncclResult_t r = ncclCommInitAll(c->stage + s * c->tp, c->tp, devs);
        if (r != ncclSuccess) return pp_nccl_fail(c->host, err, "ncclCommInitAll over a stage's devices", r);
    }
    return LOOM_OK;
}

loom_status pp_nccl_create(const loom_host *h, int32_t size, int32_t tp, pp_nccl **out, loom_error *err) {
    *out = NULL;
    loom_status st = LOOM_OK;
    pp_nccl *c = h->calloc(h->ctx, 1, sizeof *c);
    if (!c) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory");
    c->host = h;
    c->size = size;
    c->tp = tp;
    atomic_init(&c->aborted, false);
    c->world = h->calloc(h->ctx, (size_t)size, sizeof *c->world);
    c->stage = h->calloc(h->ctx, (size_t)size, sizeof *c->stage);
    c->stage_ctx = h->calloc(h->ctx, (size_t)(size / tp), sizeof *c->stage_ctx);
    if (!c->world || !c->stage || !c->stage_ctx) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory");
        goto fail;
    }
    ncclResult_t r = ncclCommInitAll(c->world, size, NULL);
    if (r != ncclSuccess) {
        st = pp_nccl_fail(h, err, "ncclCommInitAll over devices 0..pp_size x tp_size - 1", r);
        goto fail;
    }
    if ((st = pp_nccl_stages(c, err)) != LOOM_OK) goto fail;
    h->log(h->ctx, LOOM_LOG_INFO, PP_WHO, "NCCL: %d ranks on devices 0..%d, %d per stage", size, size - 1, tp);
    *out = c;
    return LOOM_OK;
fail:
    pp_nccl_destroy(c);
    return st;
}

void pp_nccl_destroy(pp_nccl *c) {
    if (!c) return;
    const loom_host *h = c->host;
    bool aborted = atomic_load(&c->aborted);
    for (int32_t i = 0; i < c->size && !aborted; i++) {
        if (c->world && c->world[i]) ncclCommDestroy(c->world[i]);
        if (c->stage && c->stage[i]) ncclCommDestroy(c->stage[i]);
    }
    h->free(h->ctx, c->world);
    h->free(h->ctx, c->stage);
    h->free(h->ctx, c->stage_ctx);
    h->free(h->ctx, c);
}

void pp_nccl_abort(pp_nccl *c) {
    if (!c || atomic_exchange(&c->aborted, true)) return;
    for (int32_t i = 0; i < c->size; i++) {
        if (c->world[i]) ncclCommAbort(c->world[i]);
        if (c->stage[i]) ncclCommAbort(c->stage[i]);
    }
}

bool pp_nccl_aborted(const pp_nccl *c) { return c && atomic_load(&c->aborted); }

pp_nccl_stage *pp_nccl_stage_ctx(pp_nccl *c, int32_t stage) { return &c->stage_ctx[stage]; }

loom_status pp_nccl_bind_thread(pp_nccl *c, int32_t rank, loom_error *err) {
    cudaError_t e = cudaSetDevice(rank);
    if (e != cudaSuccess)
        return c->host->error(c->host->ctx, err, LOOM_ERR_DEVICE, "executor pp: rank %d: cudaSetDevice(%d): %s", rank,
                              rank, cudaGetErrorString(e));
    return LOOM_OK;
}

static bool pp_nccl_type(loom_dtype d, ncclDataType_t *t) {
    switch (d) {
    case LOOM_DTYPE_F32: *t = ncclFloat32; return true;
    case LOOM_DTYPE_F16: *t = ncclFloat16; return true;
    case LOOM_DTYPE_BF16: *t = ncclBfloat16; return true;
    case LOOM_DTYPE_I32: *t = ncclInt32; return true;
    case LOOM_DTYPE_U8: *t = ncclUint8; return true; /* the cuda backend's x | r messages */
    default: return false;
    }
}

/* Checks common to every call; *type is always set (ncclFloat32 when the
 * call is refused). */
static loom_status pp_nccl_prep(pp_nccl *c, const char *what, int32_t rank, loom_dtype dtype, const void *stream,
                                ncclDataType_t *type, loom_error *err) {
    const loom_host *h = c->host;
    *type = ncclFloat32;
    if (atomic_load(&c->aborted))
        return h->error(h->ctx, err, LOOM_ERR_DEVICE,
                        "executor pp: rank %d: %s on an aborted NCCL communicator (a rank failed earlier); "
                        "recreate the engine",
                        rank, what);
    if (!stream)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor pp: rank %d called %s without a CUDA stream: NCCL needs device buffers; "
                        "host backends (cpu) use executor.comm: threads",
                        rank, what);
    if (!pp_nccl_type(dtype, type))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED, "executor pp: %s of %s elements is not supported over NCCL",
                        what, loom_dtype_name(dtype));
    return LOOM_OK;
}

loom_status pp_nccl_send(void *ctx, const void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err) {
    const pp_nccl_end *e = ctx;
    ncclDataType_t type;
    loom_status st = pp_nccl_prep(e->nc, "send_next", e->rank, dtype, stream, &type, err);
    if (st != LOOM_OK) return st;
    ncclResult_t r = ncclSend(buf, (size_t)count, type, e->next, e->nc->world[e->rank], (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : pp_nccl_fail(e->nc->host, err, "ncclSend", r);
}

loom_status pp_nccl_recv(void *ctx, void *buf, int64_t count, loom_dtype dtype, void *stream, loom_error *err) {
    const pp_nccl_end *e = ctx;
    ncclDataType_t type;
    loom_status st = pp_nccl_prep(e->nc, "recv_prev", e->rank, dtype, stream, &type, err);
    if (st != LOOM_OK) return st;
    ncclResult_t r = ncclRecv(buf, (size_t)count, type, e->prev, e->nc->world[e->rank], (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : pp_nccl_fail(e->nc->host, err, "ncclRecv", r);
}

/* The stage communicator of `trank` (its tensor rank) in ctx's stage. */
static ncclComm_t pp_nccl_stage_comm(const pp_nccl_stage *s, int32_t trank) {
    return s->nc->stage[s->stage * s->nc->tp + trank];
}

loom_status pp_nccl_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype, void *stream,
                               loom_error *err) {
    const pp_nccl_stage *s = ctx;
    ncclDataType_t type;
    loom_status st = pp_nccl_prep(s->nc, "all_reduce_sum", rank, dtype, stream, &type, err);
    if (st != LOOM_OK) return st;
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, type, ncclSum, pp_nccl_stage_comm(s, rank),
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : pp_nccl_fail(s->nc->host, err, "ncclAllReduce", r);
}

loom_status pp_nccl_all_gather(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                               loom_dtype dtype, void *stream, loom_error *err) {
    const pp_nccl_stage *s = ctx;
    ncclDataType_t type;
    loom_status st = pp_nccl_prep(s->nc, "all_gather", rank, dtype, stream, &type, err);
    if (st != LOOM_OK) return st;
    ncclResult_t r =
        ncclAllGather(send, recv, (size_t)count, type, pp_nccl_stage_comm(s, rank), (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : pp_nccl_fail(s->nc->host, err, "ncclAllGather", r);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int pp_nccl_not_built;
#endif
