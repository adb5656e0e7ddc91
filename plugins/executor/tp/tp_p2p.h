/*
 * plugins/executor/tp/tp_p2p.h — peer-to-peer collectives among the GPUs of
 * one process (tp_p2p.cu): one-shot all-reduce and all-gather kernels that
 * read the peers' staging buffers directly, for small messages where NCCL's
 * per-call latency dominates, and which a CUDA graph can capture. Used by
 * the NCCL communicator (tp_nccl.c) when executor.p2p_kib > 0.
 * Not an installed header.
 */
#ifndef LOOM_PLUGIN_TP_P2P_H
#define LOOM_PLUGIN_TP_P2P_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_P2P_MAX_RANKS 8

enum { TP_P2P_F32 = 0, TP_P2P_BF16 = 1, TP_P2P_F16 = 2 };

typedef struct tp_p2p tp_p2p;

/* [engine] Staging buffers of `cap` bytes (x2) on devices 0..n-1 and peer
 * access between every pair; NULL with *why filled when the GPUs cannot
 * reach each other's memory or allocation fails. Restores the current
 * device. */
tp_p2p *tp_p2p_create(int n, size_t cap, char *why, size_t why_n);
void tp_p2p_destroy(tp_p2p *p);
/* Largest message (bytes per rank) one call serves. */
size_t tp_p2p_cap(const tp_p2p *p);
/* [any] Make every waiting kernel give up (a rank failed). */
void tp_p2p_abort(tp_p2p *p);
/* 0, or 1 + the rank whose kernel gave up waiting for a peer (60 s). */
unsigned tp_p2p_status(const tp_p2p *p);
/* [instance] Enqueue on `stream` (the rank's device current); every rank
 * calls with the same count/bytes, in the same order. cudaError_t values. */
int tp_p2p_all_reduce(tp_p2p *p, int rank, void *buf, int64_t count, int dtype, void *stream);
int tp_p2p_all_gather(tp_p2p *p, int rank, const void *send, void *recv, int64_t bytes, void *stream);
const char *tp_p2p_error_string(int e);

#ifdef __cplusplus
}
#endif
#endif
