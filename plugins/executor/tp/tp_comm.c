/*
 * plugins/executor/tp/tp_comm.c — the threads communicator: all-reduce and
 * all-gather among tensor-parallel ranks that are threads of this process,
 * over host memory (loom_comm.host_memory = 1): host backends (cpu) pass
 * their buffers, device backends (cuda) stage theirs through pinned host
 * memory, so their ranks may share one GPU. It is what lets the sharding
 * be tested without several GPUs: the same backend code calls the same
 * loom_comm entry points it would call with NCCL.
 *
 * Zero-copy: each rank publishes its buffer pointer, and after a barrier
 * every rank works directly on its peers' buffers. All-reduce is a
 * reduce-scatter and an all-gather in one pass: rank r sums elements
 * [count r / n, count (r+1) / n) of every rank's buffer in rank order
 * 0..n-1 and writes the sum back into every buffer; a second barrier ends
 * the call. The summation order is fixed, so the result is independent of
 * timing and identical on every rank. All-gather copies every rank's send
 * buffer into each recv buffer between the same two barriers, and
 * all-to-all (all_to_allv) copies, into each rank's recv buffer, its part
 * of every rank's send buffer, the offsets being prefix sums of the
 * published counts; every rank checks every pair of counts, so a
 * mismatch fails the call on all ranks alike.
 *
 * The barrier is a mutex and condition variable (ranks may outnumber cores;
 * spinning would steal the core a peer needs) that can be aborted: when a
 * rank fails outside a collective the executor calls tp_threads_abort, and
 * every rank waiting, or arriving later, returns an error instead of
 * waiting forever for it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"

#include "formats/dtype.h"
#include "formats/half.h"

typedef enum tp_coll { TP_COLL_REDUCE = 1, TP_COLL_GATHER = 2, TP_COLL_A2AV = 3 } tp_coll;

struct tp_threads {
    const loom_host *host;
    int32_t n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t arrived;          /* ranks waiting at the current barrier        */
    uint64_t gen;             /* barriers completed                          */
    bool aborted;
    /* what each rank called, published before the first barrier (n each) */
    void **bufs;              /* all-reduce buffer / all-gather recv         */
    const void **sends;       /* all-gather / all-to-all send                */
    const int64_t **scounts;  /* all-to-all per-destination counts           */
    const int64_t **rcounts;  /* all-to-all per-source counts                */
    int64_t *counts;
    int32_t *dtypes;
    int32_t *colls;
};

tp_threads *tp_threads_create(const loom_host *host, int32_t n) {
    tp_threads *g = host->calloc(host->ctx, 1, sizeof *g);
    if (!g) return NULL;
    g->host = host;
    g->n = n;
    g->bufs = host->calloc(host->ctx, (size_t)n, sizeof *g->bufs);
    g->sends = host->calloc(host->ctx, (size_t)n, sizeof *g->sends);
    g->scounts = host->calloc(host->ctx, (size_t)n, sizeof *g->scounts);
    g->rcounts = host->calloc(host->ctx, (size_t)n, sizeof *g->rcounts);
    g->counts = host->calloc(host->ctx, (size_t)n, sizeof *g->counts);
    g->dtypes = host->calloc(host->ctx, (size_t)n, sizeof *g->dtypes);
    g->colls = host->calloc(host->ctx, (size_t)n, sizeof *g->colls);
    if (!g->bufs || !g->sends || !g->scounts || !g->rcounts || !g->counts || !g->dtypes || !g->colls) goto fail_mem;
    if (pthread_mutex_init(&g->mu, NULL) != 0) goto fail_mem;
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        goto fail_mem;
    }
    return g;
fail_mem:
    host->free(host->ctx, g->bufs);
    host->free(host->ctx, g->sends);
    host->free(host->ctx, g->scounts);
    host->free(host->ctx, g->rcounts);
    host->free(host->ctx, g->counts);
    host->free(host->ctx, g->dtypes);
    host->free(host->ctx, g->colls);
    host->free(host->ctx, g);
    return NULL;
}

void tp_threads_destroy(tp_threads *g) {
    if (!g) return;
    const loom_host *h = g->host;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    h->free(h->ctx, g->bufs);
    h->free(h->ctx, g->sends);
    h->free(h->ctx, g->scounts);
    h->free(h->ctx, g->rcounts);
    h->free(h->ctx, g->counts);
    h->free(h->ctx, g->dtypes);
    h->free(h->ctx, g->colls);
    h->free(h->ctx, g);
}

void tp_threads_abort(tp_threads *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void tp_threads_reset(tp_threads *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = false;
    g->arrived = 0;
    pthread_mutex_unlock(&g->mu);
}

/* Wait until all n ranks arrive; false when the group was aborted first. */
static bool tp_barrier(tp_threads *g) {
    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return false;
    }
    uint64_t gen = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return true;
    }
    while (gen == g->gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    bool ok = gen != g->gen;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* ------------------------------------------------------------- elements */

/* Bytes of one element of a plain (unblocked) type; 0 for block types. */
static size_t tp_elem_bytes(loom_dtype d) {
    return loom_dtype_block_elems(d) == 1 ? loom_dtype_block_bytes(d) : 0;
}

#define TP_TILE 512 /* elements summed per pass: a few KiB, stays in L1 */

/* Sum elements [lo, hi) of the n buffers in rank order and store the sum in
 * every buffer. Floats accumulate in float32 (f16 / bf16 rounded once at
 * the end, by formats/half.h); i32 wraps like two's complement. */
static void tp_reduce_range(void *const *bufs, int32_t n, loom_dtype dt, int64_t lo, int64_t hi) {
    float acc[TP_TILE];
    int32_t iacc[TP_TILE];
    for (int64_t i = lo; i < hi; i += TP_TILE) {
        int64_t m = hi - i < TP_TILE ? hi - i : TP_TILE;
        switch (dt) {
        case LOOM_DTYPE_F32:
            memcpy(acc, (const float *)bufs[0] + i, (size_t)m * sizeof(float));
            for (int32_t k = 1; k < n; k++) {
                const float *src = (const float *)bufs[k] + i;
                for (int64_t j = 0; j < m; j++) acc[j] += src[j];
            }
            for (int32_t k = 0; k < n; k++)
                memcpy((float *)bufs[k] + i, acc, (size_t)m * sizeof(float));
            break;
        case LOOM_DTYPE_F16:
        case LOOM_DTYPE_BF16: {
            bool bf = dt == LOOM_DTYPE_BF16;
            for (int64_t j = 0; j < m; j++) acc[j] = 0.0f;
            for (int32_t k = 0; k < n; k++) {
                const uint16_t *src = (const uint16_t *)bufs[k] + i;
                for (int64_t j = 0; j < m; j++)
                    acc[j] += bf ? loom_bf16_to_fp32(src[j]) : loom_fp16_to_fp32(src[j]);
            }
            for (int32_t k = 0; k < n; k++) {
                uint16_t *dst = (uint16_t *)bufs[k] + i;
                for (int64_t j = 0; j < m; j++)
                    dst[j] = bf ? loom_fp32_to_bf16(acc[j]) : loom_fp32_to_fp16(acc[j]);
            }
            break;
        }
        case LOOM_DTYPE_I32:
            for (int64_t j = 0; j < m; j++) iacc[j] = 0;
            for (int32_t k = 0; k < n; k++) {
                const int32_t *src = (const int32_t *)bufs[k] + i;
                for (int64_t j = 0; j < m; j++)
                    iacc[j] = (int32_t)((uint32_t)iacc[j] + (uint32_t)src[j]);
            }
            for (int32_t k = 0; k < n; k++)
                memcpy((int32_t *)bufs[k] + i, iacc, (size_t)m * sizeof(int32_t));
            break;
        default: return; /* rejected by the caller */
        }
    }
}

/* ----------------------------------------------------------- collectives */

/* Checks common to both collectives, before this rank publishes anything. */
static loom_status tp_check_call(tp_threads *g, const char *what, int32_t rank, int64_t count,
                                 size_t es, const void *stream, loom_error *err) {
    const loom_host *h = g->host;
    if (stream)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor tp: rank %d passed a device stream to %s, but the threads "
                        "communicator works on host memory (loom_comm.host_memory): stage the "
                        "buffers through host memory, or set executor.comm: nccl",
                        rank, what);
    if (rank < 0 || rank >= g->n || count < 0 || es == 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: %s called with rank %d (group of %d), count %lld and an "
                        "element type of %zu bytes",
                        what, rank, g->n, (long long)count, es);
    return LOOM_OK;
}

/* After the first barrier: did every rank make the same call as rank 0? */
static loom_status tp_check_peers(tp_threads *g, const char *what, int32_t rank, loom_error *err) {
    for (int32_t k = 1; k < g->n; k++)
        if (g->colls[k] != g->colls[0] || g->counts[k] != g->counts[0] ||
            g->dtypes[k] != g->dtypes[0])
            return g->host->error(g->host->ctx, err, LOOM_ERR_INTERNAL,
                                  "executor tp: rank %d in %s: ranks disagree (rank 0: collective "
                                  "%d, %lld x %s; rank %d: collective %d, %lld x %s); every rank "
                                  "must make the same calls in the same order",
                                  rank, what, g->colls[0], (long long)g->counts[0],
                                  loom_dtype_name((loom_dtype)g->dtypes[0]), k, g->colls[k],
                                  (long long)g->counts[k], loom_dtype_name((loom_dtype)g->dtypes[k]));
    return LOOM_OK;
}

static loom_status tp_aborted(tp_threads *g, const char *what, int32_t rank, loom_error *err) {
    return g->host->error(g->host->ctx, err, LOOM_ERR_INTERNAL,
                          "executor tp: rank %d left %s: another rank failed", rank, what);
}

loom_status tp_threads_all_reduce(void *ctx, int32_t rank, void *buf, int64_t count,
                                  loom_dtype dtype, void *stream, loom_error *err) {
    tp_threads *g = ctx;
    const char *what = "all_reduce_sum";
    bool summable = dtype == LOOM_DTYPE_F32 || dtype == LOOM_DTYPE_F16 ||
                    dtype == LOOM_DTYPE_BF16 || dtype == LOOM_DTYPE_I32;
    loom_status st = tp_check_call(g, what, rank, count, summable ? tp_elem_bytes(dtype) : 0,
                                   stream, err);
    if (st != LOOM_OK) return st;
    if (count > 0 && !buf)
        return g->host->error(g->host->ctx, err, LOOM_ERR_INVALID,
                              "executor tp: rank %d: %s of %lld elements with no buffer", rank,
                              what, (long long)count);
    g->bufs[rank] = buf;
    g->counts[rank] = count;
    g->dtypes[rank] = (int32_t)dtype;
    g->colls[rank] = TP_COLL_REDUCE;
    if (!tp_barrier(g)) return tp_aborted(g, what, rank, err);
    st = tp_check_peers(g, what, rank, err);
    if (st == LOOM_OK && g->n > 1) {
        int64_t lo = count * rank / g->n, hi = count * (rank + 1) / g->n;
        tp_reduce_range(g->bufs, g->n, dtype, lo, hi);
    }
    /* every rank's slice is written before any rank reuses its buffer */
    if (!tp_barrier(g) && st == LOOM_OK) return tp_aborted(g, what, rank, err);
    return st;
}

loom_status tp_threads_all_gather(void *ctx, int32_t rank, const void *send, void *recv,
                                  int64_t count, loom_dtype dtype, void *stream, loom_error *err) {
    tp_threads *g = ctx;
    const char *what = "all_gather";
    size_t es = tp_elem_bytes(dtype);
    loom_status st = tp_check_call(g, what, rank, count, es, stream, err);
    if (st != LOOM_OK) return st;
    if (count > 0 && (!send || !recv))
        return g->host->error(g->host->ctx, err, LOOM_ERR_INVALID,
                              "executor tp: rank %d: %s of %lld elements with no %s buffer", rank,
                              what, (long long)count, !send ? "send" : "recv");
    g->sends[rank] = send;
    g->bufs[rank] = recv;
    g->counts[rank] = count;
    g->dtypes[rank] = (int32_t)dtype;
    g->colls[rank] = TP_COLL_GATHER;
    if (!tp_barrier(g)) return tp_aborted(g, what, rank, err);
    st = tp_check_peers(g, what, rank, err);
    if (st == LOOM_OK) {
        size_t bytes = (size_t)count * es;
        for (int32_t k = 0; k < g->n; k++) {
            uint8_t *dst = (uint8_t *)recv + (size_t)k * bytes;
            if (bytes && dst != (const uint8_t *)g->sends[k]) /* in place: already there */
                memcpy(dst, g->sends[k], bytes);
        }
    }
    /* every rank has copied before any rank reuses its send buffer */
    if (!tp_barrier(g) && st == LOOM_OK) return tp_aborted(g, what, rank, err);
    return st;
}

/* Sum of counts[0..k). */
static int64_t tp_prefix(const int64_t *counts, int32_t k) {
    int64_t s = 0;
    for (int32_t i = 0; i < k; i++) s += counts[i];
    return s;
}

/* This rank's own arguments: counts >= 0, buffers present for nonzero sums. */
static loom_status tp_a2av_args(tp_threads *g, int32_t rank, const void *send, const int64_t *sc, void *recv,
                                const int64_t *rc, loom_error *err) {
    const loom_host *h = g->host;
    if (!sc || !rc)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: rank %d: all_to_allv without %s counts",
                        rank, !sc ? "send" : "receive");
    for (int32_t k = 0; k < g->n; k++)
        if (sc[k] < 0 || rc[k] < 0)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "executor tp: rank %d: all_to_allv with a negative count for rank %d (send %lld, "
                            "receive %lld)",
                            rank, k, (long long)sc[k], (long long)rc[k]);
    if ((tp_prefix(sc, g->n) > 0 && !send) || (tp_prefix(rc, g->n) > 0 && !recv))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: rank %d: all_to_allv with counts but no %s buffer",
                        rank, !send && tp_prefix(sc, g->n) > 0 ? "send" : "receive");
    return LOOM_OK;
}

/* After the first barrier: does every rank receive what its peers send? */
static loom_status tp_a2av_pairs(tp_threads *g, int32_t rank, loom_error *err) {
    for (int32_t s = 0; s < g->n; s++)
        for (int32_t d = 0; d < g->n; d++)
            if (g->scounts[s][d] != g->rcounts[d][s])
                return g->host->error(g->host->ctx, err, LOOM_ERR_INTERNAL,
                                      "executor tp: rank %d in all_to_allv: rank %d sends %lld elements to rank %d, "
                                      "which expects %lld; exchange the counts first",
                                      rank, s, (long long)g->scounts[s][d], d, (long long)g->rcounts[d][s]);
    return LOOM_OK;
}

loom_status tp_threads_all_to_allv(void *ctx, int32_t rank, const void *send, const int64_t *send_counts, void *recv,
                                   const int64_t *recv_counts, loom_dtype dtype, void *stream, loom_error *err) {
    tp_threads *g = ctx;
    const char *what = "all_to_allv";
    const size_t es = tp_elem_bytes(dtype);
    loom_status st = tp_check_call(g, what, rank, 0, es, stream, err);
    if (st == LOOM_OK) st = tp_a2av_args(g, rank, send, send_counts, recv, recv_counts, err);
    if (st != LOOM_OK) return st;
    g->sends[rank] = send;
    g->bufs[rank] = recv;
    g->scounts[rank] = send_counts;
    g->rcounts[rank] = recv_counts;
    g->counts[rank] = 0;
    g->dtypes[rank] = (int32_t)dtype;
    g->colls[rank] = TP_COLL_A2AV;
    if (!tp_barrier(g)) return tp_aborted(g, what, rank, err);
    st = tp_check_peers(g, what, rank, err);
    if (st == LOOM_OK) st = tp_a2av_pairs(g, rank, err);
    for (int32_t s = 0; st == LOOM_OK && s < g->n; s++) {
        const size_t bytes = (size_t)recv_counts[s] * es;
        if (!bytes) continue;
        const uint8_t *src = (const uint8_t *)g->sends[s] + (size_t)tp_prefix(g->scounts[s], rank) * es;
        memcpy((uint8_t *)recv + (size_t)tp_prefix(recv_counts, s) * es, src, bytes);
    }
    /* every rank has copied before any rank reuses its send buffer */
    if (!tp_barrier(g) && st == LOOM_OK) return tp_aborted(g, what, rank, err);
    return st;
}
