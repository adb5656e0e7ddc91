/*
 * plugins/executor/pp/pp.h — private state of the pipeline-parallel
 * executor (loom-executor-pp.so), shared by its sources:
 *   pp.c       descriptor, parameters, lifetime, the jobs the ranks run
 *              and the executor ops (load, KV, forward, blocks)
 *   pp_link.c  the threads links: point-to-point send/recv of the residual
 *              stream between ranks that are threads of this process
 *   pp_split.c micro-batches: a step's batch cut into sub-batches of whole
 *              sequences
 *   pp_nccl.c  links and stage collectives over NCCL (LOOM_PP_HAVE_NCCL;
 *              compiled, untested)
 * Collectives inside a stage (tensor parallelism) are the tp executor's
 * threads communicator (plugins/executor/tp/tp_comm.c, compiled in).
 * The ranks' worker threads and job hand-off, and forward_topk reduced on
 * the host, are plugins/executor/common's (rank_pool.h, topk_rows.h).
 * Not an installed header. See docs/tensor-parallel.md.
 */
#ifndef LOOM_PLUGIN_PP_H
#define LOOM_PLUGIN_PP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/plugin.h"

#define PP_WHO "executor.pp"
#define PP_MAX_MICRO_BATCHES 64

/* ------------------------------------------------------------ threads links */

/* `n` one-way links, each from one sender rank to one receiver rank, both
 * threads of this process, over host memory. A send waits until the
 * receiver has copied the message out of the sender's buffer (a
 * rendezvous: no queue, no copy but the receiver's), so messages on a link
 * pair in call order and the sender may reuse its buffer on return. */
typedef struct pp_links pp_links;

/* One rank's ends: the link it receives on and the one it sends on (-1 =
 * none); the ctx of its loom_stage. */
typedef struct pp_end {
    pp_links *links;
    int32_t recv_link, send_link;
    int32_t rank;                      /* for messages                        */
} pp_end;

/* [engine] n links; NULL on out of memory. */
pp_links *pp_links_create(const loom_host *host, int32_t n);
/* [engine] After every rank has left its sends and receives; NULL-safe. */
void pp_links_destroy(pp_links *g);
/* [any] A rank failed: wake every rank waiting on a link and make sends
 * and receives fail until pp_links_reset. */
void pp_links_abort(pp_links *g);
/* [engine] Clear an abort and any half-done message; only while no rank is
 * inside a send or receive. */
void pp_links_reset(pp_links *g);
/* loom_stage's send_next / recv_prev (ctx = the rank's pp_end). `stream`
 * must be NULL: the buffers are host memory. */
loom_status pp_link_send(void *ctx, const void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err);
loom_status pp_link_recv(void *ctx, void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err);

/* --------------------------------------------------------- NCCL (pp_nccl.c) */

#ifdef LOOM_PP_HAVE_NCCL
/* Links and stage collectives over NCCL: rank i on device i of this node.
 * Compiled in the CUDA build, never run (no GPU backend has load_stage). */
typedef struct pp_nccl pp_nccl;

/* A stage's loom_comm ctx. */
typedef struct pp_nccl_stage {
    pp_nccl *nc;
    int32_t stage;
} pp_nccl_stage;

/* A rank's loom_stage ctx: its peers' ranks (-1 = none). */
typedef struct pp_nccl_end {
    pp_nccl *nc;
    int32_t rank, prev, next;
} pp_nccl_end;

/* Visible CUDA devices, or -1 with *why filled when the runtime fails. */
int pp_nccl_device_count(const char **why);
/* [engine] Communicators for `size` ranks, `tp` per stage. */
loom_status pp_nccl_create(const loom_host *h, int32_t size, int32_t tp, pp_nccl **out, loom_error *err);
void pp_nccl_destroy(pp_nccl *c);
/* [any] Abort every communicator (a rank failed; peers may be blocked). */
void pp_nccl_abort(pp_nccl *c);
bool pp_nccl_aborted(const pp_nccl *c);
pp_nccl_stage *pp_nccl_stage_ctx(pp_nccl *c, int32_t stage);
/* [instance] Make device `rank` current on the calling (rank) thread. */
loom_status pp_nccl_bind_thread(pp_nccl *c, int32_t rank, loom_error *err);
/* loom_stage's links (ctx = the rank's pp_nccl_end) and loom_comm's
 * collectives (ctx = the stage's pp_nccl_stage, rank = the tensor rank). */
loom_status pp_nccl_send(void *ctx, const void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err);
loom_status pp_nccl_recv(void *ctx, void *buf, int64_t count, loom_dtype dtype, void *stream, loom_error *err);
loom_status pp_nccl_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype, void *stream,
                               loom_error *err);
loom_status pp_nccl_all_gather(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                               loom_dtype dtype, void *stream, loom_error *err);
#endif

/* -------------------------------------------------------------- micro-batches */

/* One micro-batch: a sub-batch of whole, consecutive sequences of the
 * step's batch, and where its logits rows go. */
typedef struct pp_mb {
    loom_batch batch;                  /* arrays borrowed from the step's batch
                                          or the pp_split's rebased copies   */
    int32_t row0;                      /* its first row of the step's logits  */
} pp_mb;

/* Buffers reused from step to step. */
typedef struct pp_split {
    pp_mb *mbs;
    int32_t *query_start;              /* rebased, every micro-batch's        */
    int32_t *logits_index;             /* rebased                             */
    int32_t cap_mbs, cap_qs, cap_li;
} pp_split;

/* Cut `b` (checked already) into min(want, num_seqs) micro-batches (want
 * at most PP_MAX_MICRO_BATCHES; at
 * least one) of consecutive sequences with about equal query tokens; each
 * has at least one sequence. Returns their number, or -1 on out of memory.
 * sp->mbs[i] stays valid until the next call; `b`'s arrays are borrowed. */
int32_t pp_split_batch(pp_split *sp, const loom_host *h, const loom_batch *b, int32_t want);
void pp_split_free(pp_split *sp, const loom_host *h);

#endif
