/*
 * plugins/executor/pp/pp_link.c — the threads links: point-to-point
 * send/recv of the residual stream between pipeline stages that are
 * threads of this process, over host memory, for host backends (cpu). What
 * NCCL's ncclSend/ncclRecv are between GPUs, so the stage code is the same.
 *
 * Each link is a one-message rendezvous with its own mutex and condition
 * variable: the sender publishes its buffer (POSTED) and waits; the
 * receiver checks the count and type against its own, copies straight out
 * of the sender's buffer and marks it TAKEN (or REFUSED on a mismatch,
 * which fails both ends); the sender then empties the link. No queue and
 * one copy; the sender is free as soon as the receiver has copied, so stage
 * s computes micro-batch m + 1 while stage s + 1 computes micro-batch m.
 *
 * A rank that fails elsewhere makes the executor call pp_links_abort: every
 * end waiting, or arriving later, returns an error instead of waiting for a
 * peer that will never come.
 */
#include <pthread.h>
#include <string.h>

#include "pp.h"

#include "formats/dtype.h"

enum { PP_EMPTY = 0, PP_POSTED, PP_TAKEN, PP_REFUSED };

typedef struct pp_link {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;                /* PP_*                                        */
    bool aborted;
    const void *buf;          /* the sender's, while POSTED                  */
    int64_t count;
    loom_dtype dtype;
    int32_t sender;           /* rank, for messages                          */
} pp_link;

struct pp_links {
    const loom_host *host;
    int32_t n, ready;         /* links, links with mutex and cv initialised  */
    pp_link *link;
};

pp_links *pp_links_create(const loom_host *host, int32_t n) {
    pp_links *g = host->calloc(host->ctx, 1, sizeof *g);
    if (!g) return NULL;
    g->host = host;
    g->n = n;
    g->link = n > 0 ? host->calloc(host->ctx, (size_t)n, sizeof *g->link) : NULL;
    if (n > 0 && !g->link) {
        host->free(host->ctx, g);
        return NULL;
    }
    for (; g->ready < n; g->ready++) {
        pp_link *l = &g->link[g->ready];
        if (pthread_mutex_init(&l->mu, NULL) != 0) break;
        if (pthread_cond_init(&l->cv, NULL) != 0) {
            pthread_mutex_destroy(&l->mu);
            break;
        }
    }
    if (g->ready < n) {
        pp_links_destroy(g);
        return NULL;
    }
    return g;
}

void pp_links_destroy(pp_links *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->ready; i++) {
        pthread_cond_destroy(&g->link[i].cv);
        pthread_mutex_destroy(&g->link[i].mu);
    }
    g->host->free(g->host->ctx, g->link);
    g->host->free(g->host->ctx, g);
}

void pp_links_abort(pp_links *g) {
    for (int32_t i = 0; g && i < g->n; i++) {
        pp_link *l = &g->link[i];
        pthread_mutex_lock(&l->mu);
        l->aborted = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
}

void pp_links_reset(pp_links *g) {
    for (int32_t i = 0; g && i < g->n; i++) {
        pp_link *l = &g->link[i];
        pthread_mutex_lock(&l->mu);
        l->aborted = false;
        l->state = PP_EMPTY;
        l->buf = NULL;
        pthread_mutex_unlock(&l->mu);
    }
}

/* Bytes of one element of a plain (unblocked) type; 0 for block types. */
static size_t pp_elem_bytes(loom_dtype d) {
    return loom_dtype_block_elems(d) == 1 ? loom_dtype_block_bytes(d) : 0;
}

/* Checks common to both ends; the link of this end in *out. */
static loom_status pp_check_end(const pp_end *e, int32_t which, const char *what, const void *buf,
                                int64_t count, loom_dtype dtype, const void *stream, pp_link **out,
                                loom_error *err) {
    const loom_host *h = e->links->host;
    if (stream)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor pp: rank %d passed a device stream to %s, but the threads links "
                        "carry host memory (cpu, or a cuda stage's pinned staging)",
                        e->rank, what);
    if (which < 0 || which >= e->links->n)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: rank %d called %s, but its stage has no such neighbour", e->rank,
                        what);
    if (count < 0 || pp_elem_bytes(dtype) == 0 || (count > 0 && !buf))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: rank %d: %s of %lld elements of %s%s", e->rank, what,
                        (long long)count, loom_dtype_name(dtype), count > 0 && !buf ? " with no buffer" : "");
    *out = &e->links->link[which];
    return LOOM_OK;
}

static loom_status pp_left(const pp_end *e, const char *what, loom_error *err) {
    const loom_host *h = e->links->host;
    return h->error(h->ctx, err, LOOM_ERR_INTERNAL, "executor pp: rank %d left %s: another rank failed",
                    e->rank, what);
}

loom_status pp_link_send(void *ctx, const void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err) {
    const pp_end *e = ctx;
    pp_link *l = NULL;
    loom_status st = pp_check_end(e, e->send_link, "send_next", buf, count, dtype, stream, &l, err);
    if (st != LOOM_OK) return st;
    pthread_mutex_lock(&l->mu);
    while (l->state != PP_EMPTY && !l->aborted) pthread_cond_wait(&l->cv, &l->mu);
    if (l->aborted) {
        pthread_mutex_unlock(&l->mu);
        return pp_left(e, "send_next", err);
    }
    l->buf = buf, l->count = count, l->dtype = dtype, l->sender = e->rank;
    l->state = PP_POSTED;
    pthread_cond_broadcast(&l->cv);
    while (l->state == PP_POSTED && !l->aborted) pthread_cond_wait(&l->cv, &l->mu);
    int got = l->state;
    if (got == PP_TAKEN || got == PP_REFUSED) {
        l->state = PP_EMPTY;
        l->buf = NULL;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    if (got == PP_TAKEN) return LOOM_OK;
    if (got == PP_REFUSED)
        return e->links->host->error(e->links->host->ctx, err, LOOM_ERR_INTERNAL,
                                     "executor pp: rank %d's send_next of %lld x %s was refused by "
                                     "the next stage (it expected another size or type)",
                                     e->rank, (long long)count, loom_dtype_name(dtype));
    return pp_left(e, "send_next", err);
}

loom_status pp_link_recv(void *ctx, void *buf, int64_t count, loom_dtype dtype, void *stream,
                         loom_error *err) {
    const pp_end *e = ctx;
    pp_link *l = NULL;
    loom_status st = pp_check_end(e, e->recv_link, "recv_prev", buf, count, dtype, stream, &l, err);
    if (st != LOOM_OK) return st;
    pthread_mutex_lock(&l->mu);
    while (l->state != PP_POSTED && !l->aborted) pthread_cond_wait(&l->cv, &l->mu);
    if (l->aborted) {
        pthread_mutex_unlock(&l->mu);
        return pp_left(e, "recv_prev", err);
    }
    const int64_t sent = l->count;
    const loom_dtype sent_dt = l->dtype;
    const int32_t sender = l->sender;
    bool match = sent == count && sent_dt == dtype;
    if (match && count > 0) memcpy(buf, l->buf, (size_t)count * pp_elem_bytes(dtype));
    l->state = match ? PP_TAKEN : PP_REFUSED;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (match) return LOOM_OK;
    return e->links->host->error(e->links->host->ctx, err, LOOM_ERR_INTERNAL,
                                 "executor pp: rank %d expected %lld x %s from rank %d, which sent "
                                 "%lld x %s; every stage must run the same micro-batches",
                                 e->rank, (long long)count, loom_dtype_name(dtype), sender,
                                 (long long)sent, loom_dtype_name(sent_dt));
}
