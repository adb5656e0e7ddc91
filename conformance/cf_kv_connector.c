/*
 * conformance/cf_kv_connector.c — the kv_connector contract
 * (loom/kv_connector.h) on one host: two instances of the component, one
 * listening and one connecting, exchange messages both ways; a message over
 * the head limit is refused before anything is sent; accept() without a
 * peer ends in a "timeout"; a lent payload buffer (cuda-ipc) travels whole,
 * device payloads read back through payload_to_host(). The connector must be able to listen and
 * connect under the run's configuration: give it an address with --set
 * (shm: path=...; tcp: port=... and key_file=...).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "loom/kv_connector.h"

typedef struct kc_side {
    const loom_kv_connector_ops *ops;
    void *self;
    loom_kv_conn *conn;
    loom_status st;
    loom_error err;
} kc_side;

static const loom_kv_msg kc_hello = {.struct_size = sizeof(loom_kv_msg), .type = 1, .head = "helo", .head_len = 4};

/* The connecting side: connect, then one first message. A connector may
 * finish its handshake only when the accepting side first reads, so
 * connect() and that read must overlap (loom/kv_connector.h). */
static void *kc_connect_main(void *arg) {
    kc_side *c = arg;
    c->st = c->ops->connect(c->self, &c->conn, &c->err);
    if (c->st == LOOM_OK) c->st = c->ops->send(c->self, c->conn, &kc_hello, &c->err);
    return NULL;
}

/* L listening and C connected to it (both created), the first message
 * received; false after a failure was recorded. */
static bool kc_pair(cf_run *r, kc_side *L, kc_side *C, loom_kv_conn **lconn) {
    const loom_kv_connector_ops *ops = r->comp->ops;
    *L = (kc_side){.ops = ops};
    *C = (kc_side){.ops = ops};
    *lconn = NULL;
    if (!cf_create(r, NULL, &L->self)) return false;
    if (!cf_create(r, NULL, &C->self)) return false;
    cf_where(r, "listen()");
    if ((L->st = ops->listen(L->self, &L->err)) != LOOM_OK)
        return cf_fail(r, "listen() failed (give the connector an address it can use here with --set): %s",
                       L->err.message);
    pthread_t t;
    pthread_create(&t, NULL, kc_connect_main, C);
    cf_where(r, "accept(10000 ms) and recv() while another instance connects and sends");
    loom_kv_msg got = {.struct_size = sizeof got};
    L->st = ops->accept(L->self, 10000, lconn, &L->err);
    if (L->st == LOOM_OK) L->st = ops->recv(L->self, *lconn, &got, &L->err);
    pthread_join(t, NULL);
    if (L->st != LOOM_OK || !*lconn) return cf_fail(r, "accept() or the first recv() failed: %s", L->err.message);
    if (C->st != LOOM_OK || !C->conn) return cf_fail(r, "connect() or the first send() failed: %s", C->err.message);
    CF_ENSURE(r, got.type == 1 && got.head_len == 4 && memcmp(got.head, "helo", 4) == 0,
              "the first message arrived changed");
    return true;
}

/* Close both ends and destroy both instances; every host allocation must
 * have come back once both are gone (the kit counts them process-wide). */
static void kc_unpair(cf_run *r, kc_side *L, kc_side *C, loom_kv_conn *lconn, bool *ok) {
    const loom_kv_connector_ops *ops = r->comp->ops;
    if (lconn) ops->close(L->self, lconn);
    if (C->conn) ops->close(C->self, C->conn);
    if (L->self) ops->destroy(L->self);
    if (C->self && !cf_destroy(r, C->self)) *ok = false;
}

/* Send m on (ops, self, conn) from a thread while the peer receives it. */
typedef struct kc_send {
    kc_side *s;
    loom_kv_conn *conn;
    const loom_kv_msg *m;
    loom_status st;
    loom_error err;
} kc_send;

static void *kc_send_main(void *arg) {
    kc_send *x = arg;
    x->st = x->s->ops->send(x->s->self, x->conn, x->m, &x->err);
    return NULL;
}

static bool kc_check_payload(cf_run *r, kc_side *b, loom_kv_conn *bc, const loom_kv_msg *got, const loom_kv_msg *m,
                             kc_send *x, pthread_t t);

/* One message from a to b (a sends on its thread: a shared-memory sender
 * waits for the receiver's acknowledgement), received intact. */
static bool kc_carry(cf_run *r, kc_side *a, loom_kv_conn *ac, kc_side *b, loom_kv_conn *bc, const loom_kv_msg *m) {
    kc_send x = {.s = a, .conn = ac, .m = m};
    pthread_t t;
    pthread_create(&t, NULL, kc_send_main, &x);
    loom_kv_msg got = {.struct_size = sizeof got};
    loom_error err = {0};
    loom_status st = b->ops->recv(b->self, bc, &got, &err);
    if (st != LOOM_OK) {
        pthread_join(t, NULL);
        return cf_fail(r, "recv() failed: %s", err.message);
    }
    bool ok = true;
    if (got.type != m->type || got.head_len != m->head_len || got.payload_len != m->payload_len)
        ok = cf_fail(r, "received type %u, head %u, payload %llu bytes; sent %u, %u, %llu", got.type, got.head_len,
                     (unsigned long long)got.payload_len, m->type, m->head_len, (unsigned long long)m->payload_len);
    else if (m->head_len && memcmp(got.head, m->head, m->head_len) != 0)
        ok = cf_fail(r, "the head arrived changed");
    return kc_check_payload(r, b, bc, &got, ok ? m : NULL, &x, t) && ok;
}

/* The received payload equals m's (m NULL: not compared), read through payload_to_host() when it is
 * device memory; payload_release() then acknowledges it and the sender's
 * thread (t, still waiting for that) ends. */
static bool kc_check_payload(cf_run *r, kc_side *b, loom_kv_conn *bc, const loom_kv_msg *got, const loom_kv_msg *m,
                             kc_send *x, pthread_t t) {
    const loom_kv_connector_ops *ops = b->ops;
    bool ok = true;
    uint8_t *host = NULL;
    loom_error err = {0};
    if (got->payload_on_device) {
        const bool has = LOOM_HAS_FIELD(ops, loom_kv_connector_ops, payload_release) && ops->payload_to_host &&
                         ops->payload_release;
        if (!has) ok = cf_fail(r, "recv() gave device memory but payload_to_host / payload_release are missing");
        host = ok ? malloc(got->payload_len ? (size_t)got->payload_len : 1) : NULL;
        if (ok && (!host || ops->payload_to_host(b->self, bc, host, got->payload_len, &err) != LOOM_OK))
            ok = cf_fail(r, "payload_to_host() failed: %s", err.message);
    }
    const void *bytes = got->payload_on_device ? host : got->payload;
    if (ok && m && m->payload && m->payload_len && memcmp(bytes, m->payload, (size_t)m->payload_len) != 0)
        ok = cf_fail(r, "the payload arrived changed");
    if (got->payload_on_device && ops->payload_release) ops->payload_release(b->self, bc);
    pthread_join(t, NULL);
    free(host);
    if (ok && x->st != LOOM_OK) ok = cf_fail(r, "send() failed: %s", x->err.message);
    return ok;
}

static bool check_round_trip(cf_run *r, const void *arg) {
    kc_side L, C;
    loom_kv_conn *lc;
    bool ok = kc_pair(r, &L, &C, &lc);
    cf_rng g = cf_rng_make(r->seed);
    size_t hl = 1000, pl = 3u << 20;
    uint8_t *head = malloc(hl), *payload = malloc(pl);
    for (size_t i = 0; head && i < hl; i++) head[i] = (uint8_t)cf_rng_next(&g);
    for (size_t i = 0; payload && i < pl; i++) payload[i] = (uint8_t)cf_rng_next(&g);
    loom_kv_msg big = {.struct_size = sizeof big, .type = 7, .head = head, .head_len = (uint32_t)hl,
                       .payload = payload, .payload_len = pl};
    loom_kv_msg small = {.struct_size = sizeof small, .type = 3, .head = head, .head_len = 12};
    cf_where(r, "decode side -> prefill side: 1000-byte head, 3 MiB payload; back: a head only");
    ok = ok && head && payload && kc_carry(r, &C, C.conn, &L, lc, &big) && kc_carry(r, &L, lc, &C, C.conn, &small) &&
         kc_carry(r, &L, lc, &C, C.conn, &big);
    kc_unpair(r, &L, &C, lc, &ok);
    free(head);
    free(payload);
    return ok;
}

/* A connector that lends payload buffers (payload_buffer): a lent buffer
 * sent as the payload arrives whole and acknowledged, twice on one
 * connection (host memory is filled and compared; device memory, which
 * this check cannot write, is checked for size and hand-over only). */
static bool check_lent_buffer(cf_run *r, const void *arg) {
    const loom_kv_connector_ops *ops = r->comp->ops;
    if (!LOOM_HAS_FIELD(ops, loom_kv_connector_ops, payload_buffer) || !ops->payload_buffer) return true;
    kc_side L, C;
    loom_kv_conn *lc;
    bool ok = kc_pair(r, &L, &C, &lc);
    cf_rng g = cf_rng_make(r->seed);
    for (int round = 0; ok && round < 2; round++) {
        const uint64_t len = (1u << 20) + 4096u * (uint64_t)round;
        void *buf = NULL;
        int32_t dev = -1;
        loom_error err = {0};
        cf_where(r, "payload_buffer() on the connecting side, sent as the payload");
        if (ops->payload_buffer(C.self, C.conn, len, &buf, &dev, &err) != LOOM_OK || !buf) {
            ok = cf_fail(r, "payload_buffer(%llu bytes) failed: %s", (unsigned long long)len, err.message);
            break;
        }
        if (dev < 0)
            for (uint64_t i = 0; i < len; i++) ((uint8_t *)buf)[i] = (uint8_t)cf_rng_next(&g);
        loom_kv_msg m = {.struct_size = sizeof m, .type = 9, .head = "lent", .head_len = 4, .payload = buf,
                         .payload_len = len, .payload_on_device = dev >= 0, .payload_device = dev};
        kc_send x = {.s = &C, .conn = C.conn, .m = &m};
        pthread_t t;
        pthread_create(&t, NULL, kc_send_main, &x);
        loom_kv_msg got = {.struct_size = sizeof got};
        if (ops->recv(L.self, lc, &got, &err) != LOOM_OK) {
            pthread_join(t, NULL);
            ok = cf_fail(r, "recv() of a lent buffer failed: %s", err.message);
            break;
        }
        if (got.payload_len != len) ok = cf_fail(r, "a lent buffer of %llu bytes arrived as %llu",
                                                 (unsigned long long)len, (unsigned long long)got.payload_len);
        loom_kv_msg host_copy = m; /* compared only when this side could write it */
        ok = kc_check_payload(r, &L, lc, &got, ok && dev < 0 ? &host_copy : NULL, &x, t) && ok;
    }
    kc_unpair(r, &L, &C, lc, &ok);
    return ok;
}

static bool check_head_limit(cf_run *r, const void *arg) {
    kc_side L, C;
    loom_kv_conn *lc;
    bool ok = kc_pair(r, &L, &C, &lc);
    loom_kv_limits lim = {.struct_size = sizeof lim};
    if (ok) C.ops->limits(C.self, &lim);
    uint8_t *head = ok ? calloc(1, (size_t)lim.max_head + 1) : NULL;
    if (ok && head) {
        loom_kv_msg m = {.struct_size = sizeof m, .type = 5, .head = head, .head_len = lim.max_head + 1};
        loom_error err = {0};
        cf_where(r, "send() of a head one byte over max_head (%u)", lim.max_head);
        loom_status st = C.ops->send(C.self, C.conn, &m, &err);
        if (st != LOOM_ERR_INVALID) ok = cf_fail(r, "a head over the limit gave %d, not LOOM_ERR_INVALID", st);
        m.head_len = 16; /* nothing was sent: the connection carries the next message */
        ok = ok && kc_carry(r, &C, C.conn, &L, lc, &m);
    }
    kc_unpair(r, &L, &C, lc, &ok);
    free(head);
    return ok;
}

static bool check_accept_timeout(cf_run *r, const void *arg) {
    const loom_kv_connector_ops *ops = r->comp->ops;
    void *self = NULL;
    if (!cf_create(r, NULL, &self)) return false;
    loom_error err = {0};
    loom_kv_conn *c = (loom_kv_conn *)&c;
    bool ok = ops->listen(self, &err) == LOOM_OK || cf_fail(r, "listen() failed: %s", err.message);
    if (ok) {
        cf_where(r, "accept(50 ms) with no peer");
        loom_status st = ops->accept(self, 50, &c, &err);
        if (st != LOOM_ERR_IO || strncmp(err.message, "timeout", 7) != 0 || c)
            ok = cf_fail(r, "accept() without a peer gave %d, conn %p, '%s'; want LOOM_ERR_IO, NULL, \"timeout...\"", st,
                         (void *)c, err.message);
    }
    return cf_destroy(r, self) && ok;
}

int cf_checks_kv_connector(const loom_component *c, cf_check *out, int cap) {
    int n = 0;
    n = cf_add(out, n, cap, check_accept_timeout, NULL, "kv_connector.accept_timeout");
    n = cf_add(out, n, cap, check_round_trip, NULL, "kv_connector.round_trip");
    n = cf_add(out, n, cap, check_head_limit, NULL, "kv_connector.head_limit");
    n = cf_add(out, n, cap, check_lent_buffer, NULL, "kv_connector.lent_buffer");
    return n;
}
