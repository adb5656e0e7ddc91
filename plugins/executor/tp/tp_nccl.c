/*
 * plugins/executor/tp/tp_nccl.c — the NCCL communicator of the tp executor:
 * one ncclComm_t per local rank (one GPU each, devices 0..local-1), driven
 * by that rank's own thread, collectives enqueued on the stream the backend
 * passes (so they order with its kernels; nothing here synchronises).
 *
 * Small collectives of one node can go through loom's own peer-to-peer
 * kernels instead (tp_p2p.cu; tp_nccl_enable_p2p, executor.p2p_kib): lower
 * latency than NCCL for a decode step's 8 KB all-reduces, and capturable in
 * CUDA graphs. Larger messages, other dtypes and multi-node use NCCL.
 *
 * One node: ncclCommInitAll. Several nodes (executor.rendezvous set): node 0
 * creates the unique id and serves it over TCP (tp_rendezvous.c); every node
 * then initialises its local ranks with ncclCommInitRank inside one group
 * call, rank = node_rank * local + i.
 *
 * Built only with LOOM_TP_HAVE_NCCL (CUDA and libnccl found at configure).
 * The single-node path is what CI compiles and the GPU machine runs; the
 * multi-node path is NCCL's own mechanism and documented in
 * docs/tensor-parallel.md.
 */
#ifdef LOOM_TP_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"

#include "formats/dtype.h"
#include "tp_p2p.h"

struct tp_nccl {
    const loom_host *host;
    int32_t local;            /* ranks (GPUs) in this process              */
    int32_t world;            /* ranks in the group, all nodes             */
    int32_t base;             /* global rank of local rank 0               */
    ncclComm_t *comms;        /* (local)                                   */
    atomic_bool aborted;
    tp_p2p *p2p;              /* small collectives, or NULL                */
    size_t p2p_cap;           /* bytes per rank it serves                  */
};

int tp_nccl_device_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why) *why = cudaGetErrorString(e);
        return -1;
    }
    return n;
}

static loom_status tp_nccl_fail(const loom_host *h, loom_error *err, const char *what,
                                ncclResult_t r) {
    return h->error(h->ctx, err, LOOM_ERR_DEVICE, "executor tp: %s failed: %s (%s)", what,
                    ncclGetErrorString(r), ncclGetLastError(NULL));
}

loom_status tp_nccl_create(const loom_host *h, int32_t local, int32_t nodes, int32_t node_rank,
                           const char *rendezvous, int32_t timeout_s, tp_nccl **out,
                           loom_error *err) {
    *out = NULL;
    loom_status st = LOOM_OK;
    tp_nccl *c = h->calloc(h->ctx, 1, sizeof *c);
    if (!c) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor tp: out of memory");
    c->host = h;
    c->local = local;
    c->world = local * nodes;
    c->base = node_rank * local;
    atomic_init(&c->aborted, false);
    c->comms = h->calloc(h->ctx, (size_t)local, sizeof *c->comms);
    if (!c->comms) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor tp: out of memory");
        goto fail;
    }
    ncclResult_t r;
    if (nodes == 1 && (!rendezvous || !*rendezvous)) {
        if ((r = ncclCommInitAll(c->comms, local, NULL)) != ncclSuccess) {
            st = tp_nccl_fail(h, err, "ncclCommInitAll over devices 0..size-1", r);
            goto fail;
        }
    } else {
        ncclUniqueId id;
        if (node_rank == 0) {
            if ((r = ncclGetUniqueId(&id)) != ncclSuccess) {
                st = tp_nccl_fail(h, err, "ncclGetUniqueId", r);
                goto fail;
            }
            if (nodes > 1 &&
                (st = tp_rdv_serve(h, rendezvous, &id, sizeof id, nodes - 1, timeout_s, err)))
                goto fail;
        } else if ((st = tp_rdv_fetch(h, rendezvous, node_rank, nodes, &id, sizeof id, timeout_s,
                                      err))) {
            goto fail;
        }
        /* one thread initialises several ranks: a group call, or the first
         * ncclCommInitRank would wait forever for the others */
        if ((r = ncclGroupStart()) != ncclSuccess) {
            st = tp_nccl_fail(h, err, "ncclGroupStart", r);
            goto fail;
        }
        for (int32_t i = 0; i < local; i++) {
            cudaError_t e = cudaSetDevice(i);
            if (e != cudaSuccess) {
                ncclGroupEnd();
                st = h->error(h->ctx, err, LOOM_ERR_DEVICE, "executor tp: cudaSetDevice(%d): %s",
                              i, cudaGetErrorString(e));
                goto fail;
            }
            ncclCommInitRank(&c->comms[i], c->world, id, c->base + i);
        }
        if ((r = ncclGroupEnd()) != ncclSuccess) {
            st = tp_nccl_fail(h, err, "ncclCommInitRank (group of this node's ranks)", r);
            goto fail;
        }
    }
    h->log(h->ctx, LOOM_LOG_INFO, TP_WHO, "NCCL: %d local rank(s) of %d, node %d of %d", local,
           c->world, node_rank, nodes);
    *out = c;
    return LOOM_OK;
fail:
    tp_nccl_destroy(c);
    return st;
}

void tp_nccl_destroy(tp_nccl *c) {
    if (!c) return;
    const loom_host *h = c->host;
    tp_p2p_destroy(c->p2p);
    bool aborted = atomic_load(&c->aborted);
    for (int32_t i = 0; c->comms && i < c->local; i++)
        if (c->comms[i] && !aborted) ncclCommDestroy(c->comms[i]);
    h->free(h->ctx, c->comms);
    h->free(h->ctx, c);
}

void tp_nccl_abort(tp_nccl *c) {
    bool was = atomic_exchange(&c->aborted, true);
    if (was) return;
    tp_p2p_abort(c->p2p);
    /* unblocks ranks whose collectives wait for the failed one; the
     * communicators are unusable afterwards */
    for (int32_t i = 0; i < c->local; i++)
        if (c->comms[i]) ncclCommAbort(c->comms[i]);
}

bool tp_nccl_aborted(const tp_nccl *c) { return atomic_load(&c->aborted); }

loom_status tp_nccl_bind_thread(tp_nccl *c, int32_t local, loom_error *err) {
    cudaError_t e = cudaSetDevice(local);
    if (e != cudaSuccess)
        return c->host->error(c->host->ctx, err, LOOM_ERR_DEVICE,
                              "executor tp: rank thread %d: cudaSetDevice(%d): %s", local, local,
                              cudaGetErrorString(e));
    return LOOM_OK;
}

static bool tp_nccl_type(loom_dtype d, ncclDataType_t *t) {
    switch (d) {
    case LOOM_DTYPE_F32: *t = ncclFloat32; return true;
    case LOOM_DTYPE_F16: *t = ncclFloat16; return true;
    case LOOM_DTYPE_BF16: *t = ncclBfloat16; return true;
    case LOOM_DTYPE_I32: *t = ncclInt32; return true;
    case LOOM_DTYPE_I8: *t = ncclInt8; return true;
    case LOOM_DTYPE_U8: *t = ncclUint8; return true;
    default: return false;
    }
}

/* Checks common to both collectives; the local rank's communicator. */
static loom_status tp_nccl_prep(tp_nccl *c, const char *what, int32_t rank, loom_dtype dtype,
                                const void *stream, ncclComm_t *comm, ncclDataType_t *type,
                                loom_error *err) {
    const loom_host *h = c->host;
    if (atomic_load(&c->aborted))
        return h->error(h->ctx, err, LOOM_ERR_DEVICE,
                        "executor tp: rank %d: %s on an aborted NCCL communicator (a rank failed "
                        "earlier); recreate the engine",
                        rank, what);
    if (!stream)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor tp: rank %d called %s without a CUDA stream: the NCCL "
                        "communicator needs device buffers; host backends (cpu) use "
                        "executor.comm: threads",
                        rank, what);
    int32_t i = rank - c->base;
    if (i < 0 || i >= c->local)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: %s from rank %d, but this node holds ranks %d..%d", what,
                        rank, c->base, c->base + c->local - 1);
    if (!tp_nccl_type(dtype, type))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor tp: %s of %s elements is not supported over NCCL", what,
                        loom_dtype_name(dtype));
    *comm = c->comms[i];
    return LOOM_OK;
}

loom_status tp_nccl_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype,
                               void *stream, loom_error *err) {
    tp_nccl *c = ctx;
    ncclComm_t comm = NULL;
    ncclDataType_t type = ncclFloat32;
    loom_status st = tp_nccl_prep(c, "all_reduce_sum", rank, dtype, stream, &comm, &type, err);
    if (st != LOOM_OK) return st;
    const size_t bytes = loom_dtype_row_bytes(dtype, count);
    if (c->p2p && bytes <= c->p2p_cap &&
        (dtype == LOOM_DTYPE_F32 || dtype == LOOM_DTYPE_BF16 || dtype == LOOM_DTYPE_F16)) {
        int e = tp_p2p_all_reduce(c->p2p, rank - c->base, buf, count,
                                  dtype == LOOM_DTYPE_F32 ? TP_P2P_F32 : dtype == LOOM_DTYPE_BF16 ? TP_P2P_BF16 : TP_P2P_F16,
                                  stream);
        return e == 0 ? LOOM_OK
                      : c->host->error(c->host->ctx, err, LOOM_ERR_DEVICE,
                                       "executor tp: rank %d: peer-to-peer all-reduce launch: %s", rank,
                                       tp_p2p_error_string(e));
    }
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, type, ncclSum, comm,
                                   (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : tp_nccl_fail(c->host, err, "ncclAllReduce", r);
}

loom_status tp_nccl_all_gather(void *ctx, int32_t rank, const void *send, void *recv,
                               int64_t count, loom_dtype dtype, void *stream, loom_error *err) {
    tp_nccl *c = ctx;
    ncclComm_t comm = NULL;
    ncclDataType_t type = ncclFloat32;
    loom_status st = tp_nccl_prep(c, "all_gather", rank, dtype, stream, &comm, &type, err);
    if (st != LOOM_OK) return st;
    const size_t bytes = loom_dtype_row_bytes(dtype, count);
    if (c->p2p && bytes <= c->p2p_cap) {
        int e = tp_p2p_all_gather(c->p2p, rank - c->base, send, recv, (int64_t)bytes, stream);
        return e == 0 ? LOOM_OK
                      : c->host->error(c->host->ctx, err, LOOM_ERR_DEVICE,
                                       "executor tp: rank %d: peer-to-peer all-gather launch: %s", rank,
                                       tp_p2p_error_string(e));
    }
    ncclResult_t r = ncclAllGather(send, recv, (size_t)count, type, comm, (cudaStream_t)stream);
    return r == ncclSuccess ? LOOM_OK : tp_nccl_fail(c->host, err, "ncclAllGather", r);
}

/* All-to-all with per-peer counts as one NCCL group of a send and a
 * receive per peer (zero counts skipped; NCCL pairs them by peer and
 * order). Not routed through the peer-to-peer kernels: the counts vary
 * per step, so these calls are never graph-captured. */
loom_status tp_nccl_all_to_allv(void *ctx, int32_t rank, const void *send, const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts, loom_dtype dtype, void *stream, loom_error *err) {
    tp_nccl *c = ctx;
    ncclComm_t comm = NULL;
    ncclDataType_t type = ncclFloat32;
    loom_status st = tp_nccl_prep(c, "all_to_allv", rank, dtype, stream, &comm, &type, err);
    if (st != LOOM_OK) return st;
    if (!send_counts || !recv_counts)
        return c->host->error(c->host->ctx, err, LOOM_ERR_INVALID, "executor tp: rank %d: all_to_allv without counts",
                              rank);
    for (int32_t k = 0; k < c->world; k++)
        if (send_counts[k] < 0 || recv_counts[k] < 0)
            return c->host->error(c->host->ctx, err, LOOM_ERR_INVALID,
                                  "executor tp: rank %d: all_to_allv with a negative count for rank %d", rank, k);
    ncclResult_t r = ncclGroupStart();
    size_t so = 0, ro = 0; /* bytes */
    for (int32_t k = 0; k < c->world && r == ncclSuccess; k++) {
        if (send_counts[k] > 0)
            r = ncclSend((const uint8_t *)send + so, (size_t)send_counts[k], type, k, comm, (cudaStream_t)stream);
        if (r == ncclSuccess && recv_counts[k] > 0)
            r = ncclRecv((uint8_t *)recv + ro, (size_t)recv_counts[k], type, k, comm, (cudaStream_t)stream);
        so += loom_dtype_row_bytes(dtype, send_counts[k]);
        ro += loom_dtype_row_bytes(dtype, recv_counts[k]);
    }
    ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after a failed call */
    if (r == ncclSuccess) r = e;
    return r == ncclSuccess ? LOOM_OK : tp_nccl_fail(c->host, err, "ncclSend/ncclRecv", r);
}

size_t tp_nccl_enable_p2p(tp_nccl *c, size_t cap) {
    const loom_host *h = c->host;
    if (c->world != c->local) {
        h->log(h->ctx, LOOM_LOG_INFO, TP_WHO, "p2p_kib ignored: the group spans nodes; NCCL for all");
        return 0;
    }
    char why[200] = "";
    c->p2p = tp_p2p_create(c->local, cap, why, sizeof why);
    if (!c->p2p) {
        h->log(h->ctx, LOOM_LOG_WARN, TP_WHO, "peer-to-peer collectives unavailable (%s); NCCL for all", why);
        return 0;
    }
    c->p2p_cap = tp_p2p_cap(c->p2p);
    h->log(h->ctx, LOOM_LOG_INFO, TP_WHO, "collectives of at most %zu KiB per rank: peer-to-peer kernels",
           c->p2p_cap >> 10);
    return c->p2p_cap;
}

loom_status tp_nccl_check(tp_nccl *c, loom_error *err) {
    unsigned s = tp_p2p_status(c->p2p);
    if (!s) return LOOM_OK;
    return c->host->error(c->host->ctx, err, LOOM_ERR_DEVICE,
                          "executor tp: rank %u waited 60 s for its peers in a peer-to-peer collective "
                          "(a rank failed or hangs); recreate the engine",
                          s - 1 + (unsigned)c->base);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int tp_nccl_not_built;
#endif
