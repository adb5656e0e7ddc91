/*
 * plugins/executor/pp/pp.h — private state of the pipeline-parallel
 * executor (loom-executor-pp.so), shared by its sources:
 *   pp.c       descriptor, parameters, lifetime, the per-rank worker
 *              threads and the executor ops (load, KV, forward, blocks)
 *   pp_link.c  the threads links: point-to-point send/recv of the residual
 *              stream between ranks that are threads of this process
 *   pp_split.c micro-batches: a step's batch cut into sub-batches of whole
 *              sequences
 * Collectives inside a stage (tensor parallelism) are the tp executor's
 * threads communicator (plugins/executor/tp/tp_comm.c, compiled in).
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
