/*
 * core/disagg/disagg.c — the two roles of disaggregated serving over a
 * kv_connector (disagg.h): the prefill side's listener and per-connection
 * handlers, and the decode side's per-request workers.
 */
#include "disagg/disagg.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "disagg/wire.h"
#include "engine/engine_internal.h"
#include "loom/kv_connector.h"
#include "util/util.h"

/* Handler or worker threads at once: a peer that opens connections faster
 * than they finish is answered "busy" rather than given a thread each. */
#define DISAGG_MAX_IN_FLIGHT 256
#define ACCEPT_POLL_MS 200

struct loom_disagg {
    loom_engine *e;
    loom_disagg_role role;
    const loom_pipeline_slot *slot;
    const loom_kv_connector_ops *ops;
    void *self;                /* the connector instance                    */
    loom_kv_limits lim;
    loom_kv_info info;
    void (*wake)(void *ctx);
    void *wake_ctx;
    pthread_mutex_t mu;        /* guards everything below                   */
    pthread_cond_t cv;         /* in_flight dropped                         */
    int32_t in_flight;
    bool stopping;
    bool listening;            /* the listener thread runs                  */
    pthread_t listener;
    loom_disagg_stats st;
};

static void count(loom_disagg *d, bool ok, uint64_t bytes, uint64_t host_bytes) {
    pthread_mutex_lock(&d->mu);
    if (ok) d->st.transfers_ok++, d->st.bytes += bytes, d->st.host_bytes += host_bytes;
    else d->st.transfers_failed++;
    pthread_mutex_unlock(&d->mu);
}

/* The connector's optional ABI 2.6 members, NULL when it predates them. */
static bool has_payload_buffer(const loom_disagg *d) {
    return LOOM_HAS_FIELD(d->ops, loom_kv_connector_ops, payload_buffer) && d->ops->payload_buffer;
}
static bool has_payload_to_host(const loom_disagg *d) {
    return LOOM_HAS_FIELD(d->ops, loom_kv_connector_ops, payload_to_host) && d->ops->payload_to_host;
}

static uint64_t now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static void add_time(loom_disagg *d, uint64_t *field, uint64_t t0) {
    uint64_t dt = now_us() - t0;
    pthread_mutex_lock(&d->mu);
    *field += dt;
    pthread_mutex_unlock(&d->mu);
}

static void thread_done(loom_disagg *d) {
    pthread_mutex_lock(&d->mu);
    d->in_flight--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Start fn(arg) detached, counted in in_flight; false when at the cap. */
static bool spawn(loom_disagg *d, void *(*fn)(void *), void *arg) {
    pthread_mutex_lock(&d->mu);
    bool room = d->in_flight < DISAGG_MAX_IN_FLIGHT && !d->stopping;
    if (room) d->in_flight++;
    pthread_mutex_unlock(&d->mu);
    if (!room) return false;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    bool ok = pthread_create(&t, &a, fn, arg) == 0;
    pthread_attr_destroy(&a);
    if (!ok) thread_done(d);
    return ok;
}

static loom_status send_error(loom_disagg *d, loom_kv_conn *c, loom_status code, const char *msg) {
    uint8_t head[12 + DISAGG_ERROR_MAX];
    size_t n = disagg_error_encode(head, code, msg);
    loom_kv_msg m = {.struct_size = sizeof m, .type = DISAGG_MSG_ERROR, .head = head, .head_len = (uint32_t)n};
    loom_error err = {0};
    return d->ops->send(d->self, c, &m, &err);
}

/* ================================================================ prefill */

/* One prefill request, shared by its handler and the engine's callbacks. */
typedef struct pf_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                  /* the handler's, and the engine's until its final event */
    bool done;                 /* the final event came                      */
    loom_finish_reason finish;
    char error[LOOM_ERROR_MSG_MAX];
    void *kv;                  /* block images of all but the last token    */
    size_t kv_len;
    bool kv_owned;             /* kv is ours (host), not the connector's lent buffer */
    int32_t kv_device;         /* kv's CUDA ordinal, -1 host                */
    void *lent;                /* the connector's buffer for the KV (device
                                  memory the engine reads into), or NULL    */
    uint64_t lent_len;
    int32_t lent_device;
    int32_t kv_tokens, kv_blocks, block_size;
    uint64_t max_payload;
} pf_job;

static void pf_unref(pf_job *j) {
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    if (j->kv_owned) free(j->kv);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* [engine thread] The prompt's KV, but its last token's: copied out here,
 * sent by the handler. */
static loom_status pf_export(void *user, const loom_kv_export *x) {
    pf_job *j = user;
    int32_t n = x->num_tokens - 1, nb = n > 0 ? (n + x->block_size - 1) / x->block_size : 0;
    size_t len = (size_t)nb * x->block_bytes;
    loom_error err = {0};
    if (n < 1 || (uint64_t)len > j->max_payload) {
        pthread_mutex_lock(&j->mu);
        snprintf(j->error, sizeof j->error, n < 1 ? "nothing to hand over (a prompt of one token)"
                 : "the prompt's KV (%zu bytes) exceeds the connector's max_payload_bytes", len);
        pthread_mutex_unlock(&j->mu);
        return LOOM_ERR_INVALID;
    }
    /* straight into the connector's buffer (one gather kernel) when it
     * lent one of this size; under the lock, so a handler that gave up
     * (pf_run's timeout) and takes it back never races this write */
    pthread_mutex_lock(&j->mu);
    if (j->lent && j->lent_len == len) {
        loom_status st = x->read(x->ctx, 0, nb, j->lent, len, &err);
        if (st == LOOM_OK) {
            j->kv = j->lent, j->kv_len = len, j->kv_tokens = n, j->kv_blocks = nb, j->block_size = x->block_size;
            j->kv_owned = false, j->kv_device = j->lent_device;
        } else {
            snprintf(j->error, sizeof j->error, "reading the KV out: %.400s", err.message);
        }
        pthread_mutex_unlock(&j->mu);
        return st;
    }
    pthread_mutex_unlock(&j->mu);
    void *buf = malloc(len);
    loom_status st = buf ? x->read(x->ctx, 0, nb, buf, len, &err) : LOOM_ERR_NOMEM;
    pthread_mutex_lock(&j->mu);
    if (st == LOOM_OK) {
        j->kv = buf, j->kv_len = len, j->kv_tokens = n, j->kv_blocks = nb, j->block_size = x->block_size;
        j->kv_owned = true, j->kv_device = -1;
        buf = NULL;
    } else {
        snprintf(j->error, sizeof j->error, "reading the KV out: %.400s", buf ? err.message : "out of memory");
    }
    pthread_mutex_unlock(&j->mu);
    free(buf);
    return st;
}

/* [engine thread] Only the final event matters here. */
static void pf_event(void *user, const loom_token_event *ev) {
    if (ev->finish == LOOM_FINISH_NONE) return;
    pf_job *j = user;
    pthread_mutex_lock(&j->mu);
    j->done = true;
    j->finish = ev->finish;
    if (ev->finish == LOOM_FINISH_ERROR && !j->error[0])
        snprintf(j->error, sizeof j->error, "%s", ev->error ? ev->error : "the prefill failed");
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pf_unref(j);
}

/* Wait for j's final event until deadline_ms (kvc clock: CLOCK_REALTIME
 * for the condition variable); false on timeout. */
static bool pf_wait(pf_job *j, int32_t timeout_ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&j->mu);
    int rc = 0;
    while (!j->done && rc == 0) rc = pthread_cond_timedwait(&j->cv, &j->mu, &t);
    bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    return done;
}

/* Run tokens as a one-token request and wait for it: OK with j->kv set, or
 * an error in why. */
static loom_status pf_run(loom_disagg *d, pf_job *j, const int32_t *tokens, int32_t n, char *why, size_t cap) {
    loom_request r = loom_request_default();
    r.tokens = tokens;
    r.num_tokens = n;
    r.max_tokens = 1;
    r.on_token = pf_event;
    r.on_kv_export = pf_export;
    r.user = j;
    loom_error err = {0};
    j->refs = 2;
    int64_t id = loom_engine_add_request(d->e, &r, &err);
    if (id < 0) {
        j->refs = 1;
        snprintf(why, cap, "the prefill engine refused the prompt: %.400s", err.message);
        return err.code ? err.code : LOOM_ERR_INVALID;
    }
    d->wake(d->wake_ctx);
    if (!pf_wait(j, d->lim.timeout_ms)) {
        pthread_mutex_lock(&j->mu); /* no export writes the lent buffer from here on */
        j->lent = NULL;
        pthread_mutex_unlock(&j->mu);
        loom_engine_abort(d->e, id);
        d->wake(d->wake_ctx);
        snprintf(why, cap, "the prefill took longer than the connector's timeout_ms (%d)", d->lim.timeout_ms);
        return LOOM_ERR_IO;
    }
    if (j->kv) return LOOM_OK;
    snprintf(why, cap, "the prefill ended without KV (%.400s)", j->error[0] ? j->error : "aborted");
    return LOOM_ERR_INTERNAL;
}

/* Ask the connector for a buffer the engine can read the prompt's KV
 * straight into (cuda-ipc: device memory on the backend's device), so no
 * byte crosses host memory; without one the KV goes through the host. */
static void pf_borrow(loom_disagg *d, loom_kv_conn *c, pf_job *j, int32_t n) {
    const int64_t bs = d->info.block_size, nb = (n - 1 + bs - 1) / bs;
    const uint64_t len = (uint64_t)nb * d->info.block_bytes;
    if (d->info.image_device < 0 || !has_payload_buffer(d) || n < 2 || len > d->lim.max_payload) return;
    void *ptr = NULL;
    int32_t dev = -1;
    loom_error err = {0};
    if (d->ops->payload_buffer(d->self, c, len, &ptr, &dev, &err) != LOOM_OK) {
        loom_log(LOOM_LOG_DEBUG, "disagg", "prefill: no connector buffer, the KV goes through host memory: %s",
                 err.message);
        return;
    }
    if (dev != d->info.image_device) return; /* memory the backend cannot gather into: the host path */
    j->lent = ptr, j->lent_len = len, j->lent_device = dev;
}

/* One decode engine's connection: PREFILL in, KV or ERROR out. */
static void pf_serve(loom_disagg *d, loom_kv_conn *c) {
    loom_error err = {0};
    loom_kv_msg m = {.struct_size = sizeof m};
    char why[LOOM_ERROR_MSG_MAX] = "";
    int32_t *tokens = NULL, n = 0;
    loom_status st = d->ops->recv(d->self, c, &m, &err);
    if (st != LOOM_OK) {
        loom_log(LOOM_LOG_WARN, "disagg", "prefill: reading a request: %s", err.message);
        pthread_mutex_lock(&d->mu);
        if (st == LOOM_ERR_INVALID) d->st.auth_failures++; /* the handshake failed */
        pthread_mutex_unlock(&d->mu);
        count(d, false, 0, 0);
        return;
    }
    if (m.type != DISAGG_MSG_PREFILL) {
        snprintf(why, sizeof why, "expected a prefill request, got message type %u", m.type);
        st = LOOM_ERR_FORMAT;
    } else {
        st = disagg_prefill_parse(m.head, m.head_len, &d->info, &tokens, &n, why, sizeof why);
    }
    pf_job *j = st == LOOM_OK ? calloc(1, sizeof *j) : NULL;
    if (st == LOOM_OK && !j) st = LOOM_ERR_NOMEM, snprintf(why, sizeof why, "out of memory");
    if (j) {
        pthread_mutex_init(&j->mu, NULL);
        pthread_cond_init(&j->cv, NULL);
        j->max_payload = d->lim.max_payload;
        pf_borrow(d, c, j, n);
        st = pf_run(d, j, tokens, n, why, sizeof why);
    }
    if (st == LOOM_OK) {
        uint8_t head[DISAGG_KV_HEAD];
        disagg_kv_encode(head, j->kv_tokens, j->block_size, j->kv_blocks, d->info.block_bytes);
        loom_kv_msg out = {.struct_size = sizeof out, .type = DISAGG_MSG_KV, .head = head, .head_len = sizeof head,
                           .payload = j->kv, .payload_len = j->kv_len,
                           .payload_on_device = j->kv_device >= 0, .payload_device = j->kv_device};
        uint64_t t0 = now_us();
        if ((st = d->ops->send(d->self, c, &out, &err)) != LOOM_OK) snprintf(why, sizeof why, "%s", err.message);
        else add_time(d, &d->st.send_us, t0);
    } else {
        send_error(d, c, st, why);
    }
    if (st != LOOM_OK) loom_log(LOOM_LOG_WARN, "disagg", "prefill: %s", why);
    count(d, st == LOOM_OK, st == LOOM_OK ? j->kv_len : 0, st == LOOM_OK && j->kv_device < 0 ? j->kv_len : 0);
    if (j) pf_unref(j);
    free(tokens);
}

typedef struct pf_arg {
    loom_disagg *d;
    loom_kv_conn *c;
} pf_arg;

static void *pf_handler(void *arg) {
    pf_arg a = *(pf_arg *)arg;
    free(arg);
    pf_serve(a.d, a.c);
    a.d->ops->close(a.d->self, a.c);
    thread_done(a.d);
    return NULL;
}

static void *pf_listener(void *arg) {
    loom_disagg *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        bool stop = d->stopping;
        pthread_mutex_unlock(&d->mu);
        if (stop) return NULL;
        loom_kv_conn *c = NULL;
        loom_error err = {0};
        loom_status st = d->ops->accept(d->self, ACCEPT_POLL_MS, &c, &err);
        if (st != LOOM_OK) {
            if (strncmp(err.message, "timeout", 7) == 0) continue;
            loom_log(LOOM_LOG_WARN, "disagg", "prefill: %s", err.message);
            pthread_mutex_lock(&d->mu);
            if (st == LOOM_ERR_INVALID) d->st.auth_failures++;
            pthread_mutex_unlock(&d->mu);
            continue;
        }
        pf_arg *a = malloc(sizeof *a);
        if (a) *a = (pf_arg){d, c};
        if (!a || !spawn(d, pf_handler, a)) {
            free(a);
            send_error(d, c, LOOM_ERR_NO_SPACE, "the prefill engine is busy (too many hand-overs in flight)");
            d->ops->close(d->self, c);
        }
    }
}

/* ================================================================= decode */

typedef struct dc_job {
    loom_disagg *d;
    int64_t id;
    int32_t *tokens;
    int32_t n;
} dc_job;

/* A delivery the engine reads in place: done() comes from its thread. */
typedef struct dc_lend {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    loom_status st;
} dc_lend;

static void dc_done(void *ctx, loom_status st) {
    dc_lend *l = ctx;
    pthread_mutex_lock(&l->mu);
    l->done = true;
    l->st = st;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Hand h's blocks (host, or device memory of the backend's device) to the
 * engine to read in place, and wait until it has: *taken when written in
 * (or no longer wanted: the request was aborted meanwhile). Not taken (no
 * room in the cache now) is no error: the caller delivers a copy, which
 * waits for room. The connection, and with it the sender's buffer, is held
 * only for this wait — until the engine's next step, so the engine must be
 * stepped (loom_disagg_stop before the step loop ends). */
static loom_status dc_deliver_in_place(dc_job *w, loom_kv_handoff *h, int32_t device, bool *taken, char *why,
                                       size_t cap) {
    loom_disagg *d = w->d;
    dc_lend l = {.st = LOOM_OK};
    pthread_mutex_init(&l.mu, NULL);
    pthread_cond_init(&l.cv, NULL);
    h->blocks_on_device = device >= 0;
    h->blocks_device = device;
    h->done = dc_done;
    h->done_ctx = &l;
    loom_error err = {0};
    loom_status st = loom_engine_kv_deliver(d->e, w->id, h, &err);
    if (st == LOOM_OK) {
        d->wake(d->wake_ctx);
        /* the engine answers at its next step, or when destroyed */
        pthread_mutex_lock(&l.mu);
        while (!l.done) pthread_cond_wait(&l.cv, &l.mu);
        pthread_mutex_unlock(&l.mu);
        *taken = l.st == LOOM_OK || l.st == LOOM_ERR_NOT_FOUND; /* written, or no longer wanted (aborted) */
        if (!*taken && l.st != LOOM_ERR_NO_SPACE)
            st = l.st, snprintf(why, cap, "the decode engine dropped the KV (the request was aborted or refused it)");
    } else {
        snprintf(why, cap, "%s", err.message);
    }
    h->done = NULL;
    h->blocks_on_device = false;
    pthread_mutex_destroy(&l.mu);
    pthread_cond_destroy(&l.cv);
    return st;
}

/* Hand h's blocks over as a host copy the engine keeps; device payloads
 * come to the host through the connector first. */
static loom_status dc_deliver_copy(dc_job *w, loom_kv_conn *c, loom_kv_handoff *h, int32_t device, char *why,
                                   size_t cap) {
    loom_disagg *d = w->d;
    loom_error err = {0};
    const uint64_t len = (uint64_t)h->num_blocks * h->block_bytes;
    void *host = NULL;
    if (device >= 0) {
        if (!has_payload_to_host(d))
            return snprintf(why, cap, "kv_connector '%s' sent device memory but cannot copy it to the host "
                            "(no payload_to_host)", d->slot->name), LOOM_ERR_UNSUPPORTED;
        if (!(host = malloc(len ? len : 1))) return snprintf(why, cap, "out of memory"), LOOM_ERR_NOMEM;
        loom_status st = d->ops->payload_to_host(d->self, c, host, len, &err);
        if (st != LOOM_OK) {
            free(host);
            return snprintf(why, cap, "%s", err.message), st;
        }
        h->blocks = host;
    }
    loom_status st = loom_engine_kv_deliver(d->e, w->id, h, &err);
    if (st != LOOM_OK) snprintf(why, cap, "%s", err.message);
    free(host);
    return st;
}

/* Send the prompt, read the answer; deliver or say why not. */
static loom_status dc_transfer(dc_job *w, loom_kv_conn *c, uint64_t *bytes, uint64_t *host_bytes, char *why,
                               size_t cap) {
    loom_disagg *d = w->d;
    loom_error err = {0};
    size_t hl = DISAGG_PREFILL_FIXED + 4 * (size_t)w->n;
    if (hl > d->lim.max_head) {
        snprintf(why, cap, "a prompt of %d tokens exceeds the connector's max_head_bytes", w->n);
        return LOOM_ERR_INVALID;
    }
    uint8_t *head = malloc(hl);
    if (!head) return snprintf(why, cap, "out of memory"), LOOM_ERR_NOMEM;
    disagg_prefill_encode(head, &d->info, w->tokens, w->n);
    loom_kv_msg m = {.struct_size = sizeof m, .type = DISAGG_MSG_PREFILL, .head = head, .head_len = (uint32_t)hl};
    loom_status st = d->ops->send(d->self, c, &m, &err);
    free(head);
    m.payload_on_device = false; /* a connector older than ABI 2.6 leaves it */
    if (st == LOOM_OK) st = d->ops->recv(d->self, c, &m, &err);
    if (st != LOOM_OK) return snprintf(why, cap, "%s", err.message), st;
    if (m.type == DISAGG_MSG_ERROR) {
        char msg[DISAGG_ERROR_MAX + 1];
        snprintf(why, cap, "the prefill engine answered: %.460s",
                 disagg_error_parse(m.head, m.head_len, msg, sizeof msg) ? msg : "(a malformed error)");
        return LOOM_ERR_IO;
    }
    if (m.type != DISAGG_MSG_KV) return snprintf(why, cap, "unexpected message type %u", m.type), LOOM_ERR_FORMAT;
    loom_kv_handoff h;
    st = disagg_kv_parse(m.head, m.head_len, m.payload_len, w->n, &d->info, &h, why, cap);
    if (st != LOOM_OK) return st;
    h.tokens = w->tokens;
    h.blocks = m.payload;
    uint64_t t0 = now_us();
    bool taken = false;
    const int32_t dev = m.payload_on_device ? m.payload_device : -1;
    if (dev < 0 || dev == d->info.image_device) {
        if ((st = dc_deliver_in_place(w, &h, dev, &taken, why, cap)) != LOOM_OK) return st;
        if (taken) *host_bytes = dev < 0 ? m.payload_len : 0;
    }
    if (!taken) { /* a copy the engine keeps: it waits for room, or reads memory the backend cannot */
        if ((st = dc_deliver_copy(w, c, &h, dev, why, cap)) != LOOM_OK) return st;
        *host_bytes = m.payload_len;
    }
    /* written in, or copied: the sender may reuse its buffer now */
    if (LOOM_HAS_FIELD(d->ops, loom_kv_connector_ops, payload_release) && d->ops->payload_release)
        d->ops->payload_release(d->self, c);
    add_time(d, &d->st.deliver_us, t0);
    *bytes = m.payload_len;
    return LOOM_OK;
}

static void *dc_worker(void *arg) {
    dc_job *w = arg;
    loom_disagg *d = w->d;
    loom_error err = {0};
    char why[LOOM_ERROR_MSG_MAX];
    uint64_t bytes = 0, host_bytes = 0;
    loom_kv_conn *c = NULL;
    loom_status st = d->ops->connect(d->self, &c, &err);
    if (st != LOOM_OK) snprintf(why, sizeof why, "%s", err.message);
    else st = dc_transfer(w, c, &bytes, &host_bytes, why, sizeof why);
    if (c) d->ops->close(d->self, c);
    if (st != LOOM_OK) {
        char msg[LOOM_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "remote prefill failed: %.470s", why);
        loom_log(LOOM_LOG_WARN, "disagg", "request %lld: %s", (long long)w->id, msg);
        loom_engine_kv_fail(d->e, w->id, msg);
    }
    count(d, st == LOOM_OK, bytes, host_bytes);
    d->wake(d->wake_ctx);
    free(w->tokens);
    free(w);
    thread_done(d);
    return NULL;
}

loom_status loom_disagg_remote_prefill(loom_disagg *d, int64_t request_id, const int32_t *tokens, int32_t n,
                                       loom_error *err) {
    if (!d || d->role != LOOM_DISAGG_DECODE || !tokens || n < 2)
        return loom_error_set(err, LOOM_ERR_INVALID, "remote prefill: a decode-role instance and >= 2 tokens needed");
    dc_job *w = calloc(1, sizeof *w);
    int32_t *t = w ? malloc((size_t)n * sizeof *t) : NULL;
    if (!t) {
        free(w);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    }
    memcpy(t, tokens, (size_t)n * sizeof *t);
    *w = (dc_job){.d = d, .id = request_id, .tokens = t, .n = n};
    if (!spawn(d, dc_worker, w)) {
        free(t);
        free(w);
        return loom_error_set(err, LOOM_ERR_NO_SPACE, "too many remote prefills in flight (%d)", DISAGG_MAX_IN_FLIGHT);
    }
    return LOOM_OK;
}

/* ============================================================== lifetime */

loom_status loom_disagg_create(loom_engine *e, loom_disagg_role role, void (*wake)(void *ctx), void *wake_ctx,
                               loom_disagg **out, loom_error *err) {
    *out = NULL;
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, LOOM_KIND_KV_CONNECTOR);
    if (!slot)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "--role %s needs a `kv_connector:` section in the pipeline (plugin: shm or tcp; "
                              "docs/disaggregation.md)",
                              role == LOOM_DISAGG_PREFILL ? "prefill" : "decode");
    loom_kv_info info = {.struct_size = sizeof info};
    loom_status st = loom_engine_kv_info(e, &info, err);
    if (st != LOOM_OK) return st;
    loom_disagg *d = calloc(1, sizeof *d);
    if (!d) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    *d = (loom_disagg){.e = e, .role = role, .slot = slot, .ops = slot->component->ops, .info = info,
                       .wake = wake, .wake_ctx = wake_ctx};
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if ((st = loom_pipeline_create_instance(slot, NULL, &d->self, err)) != LOOM_OK) {
        loom_disagg_destroy(d);
        return st;
    }
    d->lim.struct_size = sizeof d->lim;
    d->ops->limits(d->self, &d->lim);
    if (role == LOOM_DISAGG_PREFILL) {
        st = d->ops->listen(d->self, err);
        if (st == LOOM_OK && pthread_create(&d->listener, NULL, pf_listener, d) != 0)
            st = loom_error_set(err, LOOM_ERR_INTERNAL, "cannot start the KV listener thread");
        d->listening = st == LOOM_OK;
        if (st != LOOM_OK) {
            loom_error_prefix(err, "kv_connector '%s'", slot->name);
            loom_disagg_destroy(d);
            return st;
        }
    }
    *out = d;
    return LOOM_OK;
}

void loom_disagg_stop(loom_disagg *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stopping = true;
    pthread_mutex_unlock(&d->mu);
    if (d->listening) pthread_join(d->listener, NULL);
    d->listening = false;
    pthread_mutex_lock(&d->mu);
    while (d->in_flight > 0) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

void loom_disagg_destroy(loom_disagg *d) {
    if (!d) return;
    loom_disagg_stop(d);
    if (d->self) loom_pipeline_destroy_instance(d->slot, d->self);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

void loom_disagg_get_stats(loom_disagg *d, loom_disagg_stats *out) {
    memset(out, 0, sizeof *out);
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    out->in_flight = d->in_flight;
    pthread_mutex_unlock(&d->mu);
}
