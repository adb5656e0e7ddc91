/*
 * plugins/executor/tp/tp.h — private state of the tensor-parallel executor
 * (loom-executor-tp.so), shared by its sources:
 *   tp.c            descriptor, parameters, lifetime, the jobs the ranks run
 *                   and the executor ops (load, KV, forward, blocks)
 *   tp_comm.c       the threads communicator: shared-memory collectives
 *                   among ranks that are threads of this process
 *   tp_nccl.c       the NCCL communicator (built with LOOM_TP_HAVE_NCCL)
 *   tp_rendezvous.c rank-0 rendezvous over TCP: node 0 hands NCCL's unique
 *                   id to the other nodes
 * The ranks' worker threads and job hand-off, and forward_topk reduced on
 * the host, are plugins/executor/common's (rank_pool.h, topk_rows.h),
 * shared with the pp executor. Not an installed header. See
 * docs/tensor-parallel.md.
 */
#ifndef LOOM_PLUGIN_TP_H
#define LOOM_PLUGIN_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/executor.h"
#include "loom/plugin.h"

#define TP_WHO "executor.tp"

/* ------------------------------------------------------ threads communicator */

/* Collectives among `n` ranks that are threads of one process, on host
 * memory. Deterministic: sums run in rank order 0..n-1 whatever the timing,
 * so every rank gets bit-identical results and a run repeats exactly. */
typedef struct tp_threads tp_threads;

/* [engine] A group of n ranks; NULL on out of memory. */
tp_threads *tp_threads_create(const loom_host *host, int32_t n);
/* [engine] After every rank has left its collectives; NULL-safe. */
void tp_threads_destroy(tp_threads *g);
/* [any] A rank failed outside a collective: wake every rank waiting in one
 * and make collectives fail until tp_threads_reset. */
void tp_threads_abort(tp_threads *g);
/* [engine] Clear an abort; only while no rank is inside a collective. */
void tp_threads_reset(tp_threads *g);
/* loom_comm collectives (ctx = the tp_threads). `stream` must be NULL: the
 * buffers are host memory. */
loom_status tp_threads_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count,
                                  loom_dtype dtype, void *stream, loom_error *err);
loom_status tp_threads_all_gather(void *ctx, int32_t rank, const void *send, void *recv,
                                  int64_t count, loom_dtype dtype, void *stream, loom_error *err);
/* loom_comm.all_to_allv over host memory (counts checked pairwise). */
loom_status tp_threads_all_to_allv(void *ctx, int32_t rank, const void *send, const int64_t *send_counts, void *recv,
                                   const int64_t *recv_counts, loom_dtype dtype, void *stream, loom_error *err);

/* --------------------------------------------------------- NCCL communicator */

#ifdef LOOM_TP_HAVE_NCCL
typedef struct tp_nccl tp_nccl;

/* Visible CUDA devices, or -1 with *why filled when the runtime fails. */
int tp_nccl_device_count(const char **why);
/* [engine] Communicators for this process's `local` ranks (devices
 * 0..local-1) of a group of nodes * local ranks; this node's ranks are
 * node_rank * local + 0..local-1. One node: ncclCommInitAll. Several: node 0
 * creates the unique id and serves it at `rendezvous` (host:port), the
 * others fetch it, then ncclCommInitRank for every local rank. */
loom_status tp_nccl_create(const loom_host *host, int32_t local, int32_t nodes, int32_t node_rank,
                           const char *rendezvous, int32_t timeout_s, tp_nccl **out,
                           loom_error *err);
void tp_nccl_destroy(tp_nccl *c);
/* [any] Abort every communicator (a rank failed; peers may be blocked). */
void tp_nccl_abort(tp_nccl *c);
bool tp_nccl_aborted(const tp_nccl *c);
/* [instance] Make device `local` current on the calling (rank) thread. */
loom_status tp_nccl_bind_thread(tp_nccl *c, int32_t local, loom_error *err);
/* loom_comm collectives (ctx = the tp_nccl; rank is the global rank);
 * enqueued on `stream` (a cudaStream_t, required). */
loom_status tp_nccl_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype,
                               void *stream, loom_error *err);
loom_status tp_nccl_all_gather(void *ctx, int32_t rank, const void *send, void *recv,
                               int64_t count, loom_dtype dtype, void *stream, loom_error *err);
loom_status tp_nccl_all_to_allv(void *ctx, int32_t rank, const void *send, const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts, loom_dtype dtype, void *stream, loom_error *err);
/* [engine] Route collectives of at most `cap` bytes per rank through the
 * peer-to-peer kernels (tp_p2p.h); one node only. Returns the bytes served
 * (0 = unavailable, logged; NCCL serves everything). */
size_t tp_nccl_enable_p2p(tp_nccl *c, size_t cap);
/* [engine] After a step: an error if a peer-to-peer collective gave up
 * waiting for a peer. */
loom_status tp_nccl_check(tp_nccl *c, loom_error *err);
#endif

/* --------------------------------------------------------------- rendezvous */

/* Split "host:port" ("[v6addr]:port" too) into host and port; false when
 * malformed. */
bool tp_rdv_parse(const char *addr, char *host, size_t host_size, int *port);
/* [engine] Node 0: listen on addr's port and send `blob` (len bytes) to
 * `clients` peers, each of which says its node rank (1..clients, each
 * once); give up after timeout_s seconds. */
loom_status tp_rdv_serve(const loom_host *h, const char *addr, const void *blob, size_t len,
                         int32_t clients, int32_t timeout_s, loom_error *err);
/* [engine] Node node_rank > 0: connect to addr (retrying until timeout_s,
 * node 0 may start later) and receive the len-byte blob. */
loom_status tp_rdv_fetch(const loom_host *h, const char *addr, int32_t node_rank, int32_t nodes,
                         void *blob, size_t len, int32_t timeout_s, loom_error *err);

#endif
