/*
 * plugins/kv_connector/shm/shm.c — the same-host KV connectors: `shm`
 * (loom-kv_connector-shm.so) and `cuda-ipc` (loom-kv_connector-cuda-ipc.so),
 * one source compiled against two payload transports (payload.h). Control
 * frames (kvc.h) travel over a Unix-domain socket; a payload (the KV block
 * images) goes out of band — a POSIX shared-memory segment the peer maps
 * read-only (payload_posix.c), or CUDA device memory the peer opens through
 * a CUDA IPC handle (payload_cuda.c) — and never through a socket buffer.
 *
 * Handshake: the listener accepts only peers running as its own user
 * (SO_PEERCRED) and, when key_file is set, the key handshake as well.
 * A payload's sender waits (bounded by timeout_ms) for the peer's
 * acknowledgement that it opened the payload, then releases its own handle;
 * a sender that fails or times out releases it too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvc.h"
#include "payload.h"


typedef struct shm_config {
    kvc_config base;
    char path[LOOM_PARAM_STRING_MAX];
#ifdef PAY_CUDA
    int64_t device;
#endif
} shm_config;

static const loom_param shm_params[] = {
    KVC_PARAMS(shm_config),
    {"path", LOOM_PARAM_STRING, offsetof(shm_config, path), "/tmp/loom-kv.sock", 1, 0, NULL,
     "Unix-domain socket the prefill engine listens on and the decode engine connects to "
     "(at most 107 bytes)"},
#ifdef PAY_CUDA
    {"device", LOOM_PARAM_INT, offsetof(shm_config, device), "0", 0, 1023, NULL,
     "CUDA ordinal the hand-over buffers live on: the backend's `device` (both servers must see it)"},
#endif
    {0},
};

typedef struct shm_inst {
    kvc_inst in;
    struct sockaddr_un addr;
    bool owns_path;            /* listen() created the socket file          */
    int32_t device;            /* cuda-ipc: the buffers' CUDA ordinal       */
} shm_inst;

static loom_status shm_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    const shm_config *cfg = config;
    shm_inst *t = host->calloc(host->ctx, 1, sizeof *t);
    if (!t) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "kv_connector " PAY_NAME ": out of memory");
    loom_status st = kvc_inst_init(&t->in, host, PAY_NAME, &cfg->base, false, err);
#ifdef PAY_CUDA
    t->device = (int32_t)cfg->device;
#endif
    if (st == LOOM_OK) st = pay_available(t->device, err);
    if (st == LOOM_OK && (!cfg->path[0] || strlen(cfg->path) >= sizeof t->addr.sun_path))
        st = host->error(host->ctx, err, LOOM_ERR_INVALID, "kv_connector " PAY_NAME ": path '%s' must be 1 to %zu bytes",
                         cfg->path, sizeof t->addr.sun_path - 1);
    if (st == LOOM_OK && cfg->base.max_head_bytes <= KVC_SHM_NAME)
        st = host->error(host->ctx, err, LOOM_ERR_INVALID, "kv_connector " PAY_NAME ": max_head_bytes too small");
    if (st != LOOM_OK) {
        host->free(host->ctx, t);
        return st;
    }
    t->addr.sun_family = AF_UNIX;
    memcpy(t->addr.sun_path, cfg->path, strlen(cfg->path) + 1); /* length checked above */
    *self = t;
    return LOOM_OK;
}

static void shm_destroy(void *self) {
    shm_inst *t = self;
    if (!t) return;
    if (t->in.lfd >= 0) close(t->in.lfd);
    if (t->owns_path) unlink(t->addr.sun_path);
    const loom_host *h = t->in.host;
    h->free(h->ctx, t);
}

static void shm_limits(void *self, loom_kv_limits *out) {
    kvc_inst_limits(self, out);
    out->max_head -= KVC_SHM_NAME; /* the segment name rides at the head's end */
}

/* A stale socket file (no one accepts on it) is replaced; a live one is
 * another server's: refuse. */
static bool path_in_use(shm_inst *t) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool live = connect(fd, (struct sockaddr *)&t->addr, sizeof t->addr) == 0;
    close(fd);
    return live;
}

static loom_status shm_listen(void *self, loom_error *err) {
    shm_inst *t = self;
    if (t->in.lfd >= 0) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector " PAY_NAME ": listen() called twice");
    struct stat sb;
    if (lstat(t->addr.sun_path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode) || path_in_use(t))
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector " PAY_NAME ": '%s' exists and is %s", t->addr.sun_path,
                            S_ISSOCK(sb.st_mode) ? "another server's live socket" : "not a socket");
        unlink(t->addr.sun_path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    mode_t old = umask(077); /* the socket file: this user only */
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&t->addr, sizeof t->addr) == 0 && listen(fd, 64) == 0;
    int e = errno;
    umask(old);
    if (!ok) {
        if (fd >= 0) close(fd);
        return kvc_fail(err, LOOM_ERR_IO, "kv_connector " PAY_NAME ": cannot listen on '%s': %s", t->addr.sun_path,
                        strerror(e));
    }
    t->in.lfd = fd;
    t->owns_path = true;
    t->in.host->log(t->in.host->ctx, LOOM_LOG_INFO, PAY_NAME, "listening on %s", t->addr.sun_path);
    return LOOM_OK;
}

static bool same_user(int fd, char *why, size_t cap) {
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0) {
        snprintf(why, cap, "SO_PEERCRED: %s", strerror(errno));
        return false;
    }
    if (cr.uid == getuid()) return true;
    snprintf(why, cap, "peer runs as uid %u, this engine as %u", (unsigned)cr.uid, (unsigned)getuid());
    return false;
}

static loom_status shm_accept(void *self, int32_t timeout_ms, loom_kv_conn **conn, loom_error *err) {
    kvc_conn *c;
    loom_status st = kvc_inst_accept(self, timeout_ms, same_user, &c, err);
    *conn = (loom_kv_conn *)c;
    return st;
}

static loom_status shm_connect(void *self, loom_kv_conn **conn, loom_error *err) {
    shm_inst *t = self;
    *conn = NULL;
    int fd;
    loom_status st = kvc_connect_fd(AF_UNIX, (struct sockaddr *)&t->addr, sizeof t->addr,
                                    (int32_t)t->in.cfg.timeout_ms, &fd, PAY_NAME, t->addr.sun_path, err);
    if (st != LOOM_OK) return st;
    char why[128];
    if (!same_user(fd, why, sizeof why)) {
        close(fd);
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector " PAY_NAME ": '%s': %s", t->addr.sun_path, why);
    }
    kvc_conn *c;
    st = kvc_inst_connected(&t->in, fd, t->addr.sun_path, &c, err);
    *conn = (loom_kv_conn *)c;
    return st;
}

static loom_status shm_send(void *self, loom_kv_conn *conn, const loom_kv_msg *m, loom_error *err) {
    shm_inst *t = self;
    kvc_conn *c = (kvc_conn *)conn;
    if (!c || !m || m->struct_size < offsetof(loom_kv_msg, payload_len) + sizeof m->payload_len)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: send() needs a connection and a message", PAY_NAME);
    loom_status ast = kvc_conn_auth(c, PAY_NAME, err);
    if (ast != LOOM_OK) return ast;
    if (m->head_len > c->max_head - KVC_SHM_NAME) /* the limit limits() reports, payload or not */
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: a head of %u bytes exceeds the limit of %u", PAY_NAME,
                        m->head_len, c->max_head - KVC_SHM_NAME);
    if (m->payload_len == 0) return kvc_send_frame(c, m->type, 0, m->head, m->head_len, NULL, 0, PAY_NAME, err);
    const int32_t dev = LOOM_HAS_FIELD(m, loom_kv_msg, payload_device) && m->payload_on_device ? m->payload_device : -1;
    if (!m->payload || m->payload_len > c->max_payload)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: message outside the limits or without its payload",
                        PAY_NAME);
    uint8_t *head = malloc((size_t)m->head_len + KVC_SHM_NAME);
    if (!head) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector %s: out of memory", PAY_NAME);
    if (m->head_len) memcpy(head, m->head, m->head_len);
    uint8_t *name = head + m->head_len;
    void *token = NULL;
    loom_status st = pay_put(t->device, m->payload, dev, m->payload_len, &c->lent, name, &token, err);
    if (st == LOOM_OK) {
        st = kvc_send_frame(c, m->type, KVC_FLAG_SHM, head, m->head_len + KVC_SHM_NAME, NULL, m->payload_len,
                            PAY_NAME, err);
        kvc_frame f;
        pay_outcome how = PAY_PEER_GONE; /* a failed write: the peer closed (it unmaps first) or died */
        if (st == LOOM_OK) {
            loom_error e = {0};
            st = kvc_recv_head(c, &f, PAY_NAME, &e);
            if (st == LOOM_OK && f.type != KVC_T_SHM_ACK)
                st = kvc_fail(&e, LOOM_ERR_FORMAT, "kv_connector %s: peer answered a payload with frame type 0x%x",
                              PAY_NAME, f.type);
            /* no acknowledgement: a peer that timed out or misbehaves may still read it */
            how = st == LOOM_OK                                                     ? PAY_ACKED
                  : st == LOOM_ERR_IO && strncmp(e.message, "timeout", 7) != 0 ? PAY_PEER_GONE
                                                                                  : PAY_PEER_MAY_READ;
            if (st != LOOM_OK && err) *err = e;
        }
        pay_release(token, name, how);
    }
    free(head);
    return st;
}

/* The out-of-band payload of frame f: opened, in *out, and acknowledged —
 * a host one at once (the peer may drop its name: the mapping stays), a
 * device one when it is released (oob_release), as it is read in place. */
static loom_status oob_open(shm_inst *t, kvc_conn *c, const kvc_frame *f, loom_kv_msg *out, loom_error *err) {
    const void *ptr;
    int32_t dev;
    loom_status st = pay_open(t->device, c->head + f->head_len - KVC_SHM_NAME, f->payload_len, &ptr, &dev, &c->oob,
                              err);
    const bool on_device = dev >= 0;
    if (st != LOOM_OK) return st;
    c->oob_close = pay_close;
    /* the host's message: never older than this plugin's header */
    *out = (loom_kv_msg){.struct_size = sizeof *out, .type = f->type,
                         .head = f->head_len > KVC_SHM_NAME ? c->head : NULL, .head_len = f->head_len - KVC_SHM_NAME,
                         .payload = ptr, .payload_len = f->payload_len, .payload_on_device = on_device,
                         .payload_device = dev};
    if (on_device) {
        c->oob_ack_due = true;
        return LOOM_OK;
    }
    return kvc_send_frame(c, KVC_T_SHM_ACK, 0, NULL, 0, NULL, 0, PAY_NAME, err);
}

/* Release the last received payload; one read in place is acknowledged
 * now, after its mapping is closed. */
static void oob_release(kvc_conn *c) {
    if (c->oob) c->oob_close(c->oob);
    c->oob = NULL;
    if (!c->oob_ack_due) return;
    c->oob_ack_due = false;
    loom_error err = {0}; /* a dead peer needs no acknowledgement */
    kvc_send_frame(c, KVC_T_SHM_ACK, 0, NULL, 0, NULL, 0, PAY_NAME, &err);
}

static loom_status shm_recv(void *self, loom_kv_conn *conn, loom_kv_msg *out, loom_error *err) {
    kvc_conn *c = (kvc_conn *)conn;
    if (!c || !out) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: recv() needs a connection", PAY_NAME);
    loom_status ast = kvc_conn_auth(c, PAY_NAME, err);
    if (ast != LOOM_OK) return ast;
    oob_release(c);
    kvc_frame f;
    loom_status st = kvc_recv_head(c, &f, PAY_NAME, err);
    if (st != LOOM_OK) return st;
    if (f.flags & KVC_FLAG_SHM) return oob_open(self, c, &f, out, err);
    return kvc_recv_payload(c, &f, out, PAY_NAME, err);
}

static void shm_close(void *self, loom_kv_conn *conn) {
    kvc_conn *c = (kvc_conn *)conn;
    if (!c) return;
    oob_release(c);
#ifdef PAY_CUDA
    pay_unlend(c->lent);
    c->lent = NULL;
#endif
    kvc_conn_free(c);
}

static loom_status shm_payload_to_host(void *self, loom_kv_conn *conn, void *dst, uint64_t len, loom_error *err) {
    kvc_conn *c = (kvc_conn *)conn;
    if (!c || !c->oob || (len && !dst))
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: payload_to_host() without a received payload",
                        PAY_NAME);
    return pay_to_host(c->oob, dst, len, err);
}

static void shm_payload_release(void *self, loom_kv_conn *conn) {
    if (conn) oob_release((kvc_conn *)conn);
}

#ifdef PAY_CUDA
static loom_status shm_payload_buffer(void *self, loom_kv_conn *conn, uint64_t len, void **ptr, int32_t *device,
                                      loom_error *err) {
    shm_inst *t = self;
    kvc_conn *c = (kvc_conn *)conn;
    *ptr = NULL;
    if (!c || len == 0 || len > c->max_payload)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: payload_buffer() of %llu bytes (limit %llu)",
                        PAY_NAME, (unsigned long long)len, (unsigned long long)(c ? c->max_payload : 0));
    pay_unlend(c->lent); /* one lent buffer a connection */
    c->lent = NULL;
    *device = t->device;
    return pay_lend(t->device, len, ptr, &c->lent, err);
}
#endif

static const loom_kv_connector_ops shm_ops = {
    .struct_size = sizeof(loom_kv_connector_ops),
    .create = shm_create,
    .destroy = shm_destroy,
    .limits = shm_limits,
    .listen = shm_listen,
    .accept = shm_accept,
    .connect = shm_connect,
    .send = shm_send,
    .recv = shm_recv,
    .close = shm_close,
#ifdef PAY_CUDA
    .payload_buffer = shm_payload_buffer,
#endif
    .payload_to_host = shm_payload_to_host,
    .payload_release = shm_payload_release,
};

static const loom_component shm_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_KV_CONNECTOR,
    .name = PAY_NAME,
    .summary = PAY_SUMMARY,
    .ops = &shm_ops,
    .params = shm_params,
    .config_size = sizeof(shm_config),
}};

static const loom_plugin_desc shm_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-kv_connector-" PAY_NAME,
    .version = "0.1.0",
    .num_components = 1,
    .components = shm_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &shm_desc; }
