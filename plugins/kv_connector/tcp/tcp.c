/*
 * plugins/kv_connector/tcp/tcp.c — loom-kv_connector-tcp.so: the `tcp` KV
 * connector. Frames (kvc.h) over one TCP connection per hand-over, payload
 * inline; both ends prove they hold the shared key (HMAC-SHA256 over two
 * nonces) before anything else is read. Across hosts; no encryption
 * (docs/disaggregation.md says how to tunnel it).
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvc.h"

typedef struct tcp_config {
    kvc_config base;
    char host[LOOM_PARAM_STRING_MAX];
    int64_t port;
} tcp_config;

static const loom_param tcp_params[] = {
    KVC_PARAMS(tcp_config),
    {"host", LOOM_PARAM_STRING, offsetof(tcp_config, host), "127.0.0.1", 1, 0, NULL,
     "prefill side: address to listen on (0.0.0.0 = every interface); decode side: the prefill host"},
    {"port", LOOM_PARAM_INT, offsetof(tcp_config, port), "18600", 1, 65535, NULL,
     "TCP port the prefill engine listens on and the decode engine connects to"},
    {0},
};

typedef struct tcp_inst {
    kvc_inst in;
    char host[LOOM_PARAM_STRING_MAX];
    char port[16];
} tcp_inst;

static loom_status tcp_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    const tcp_config *cfg = config;
    tcp_inst *t = host->calloc(host->ctx, 1, sizeof *t);
    if (!t) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "kv_connector tcp: out of memory");
    loom_status st = kvc_inst_init(&t->in, host, "tcp", &cfg->base, true, err);
    if (st == LOOM_OK && !cfg->host[0])
        st = host->error(host->ctx, err, LOOM_ERR_INVALID, "kv_connector tcp: host is empty");
    if (st != LOOM_OK) {
        host->free(host->ctx, t);
        return st;
    }
    snprintf(t->host, sizeof t->host, "%s", cfg->host);
    snprintf(t->port, sizeof t->port, "%d", (int)cfg->port);
    *self = t;
    return LOOM_OK;
}

static void tcp_destroy(void *self) {
    tcp_inst *t = self;
    if (!t) return;
    if (t->in.lfd >= 0) close(t->in.lfd);
    const loom_host *h = t->in.host;
    h->free(h->ctx, t);
}

static void tcp_limits(void *self, loom_kv_limits *out) { kvc_inst_limits(self, out); }

static loom_status tcp_resolve(tcp_inst *t, bool passive, struct addrinfo **ai, loom_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    int rc = getaddrinfo(t->host, t->port, &hints, ai);
    if (rc != 0)
        return kvc_fail(err, LOOM_ERR_IO, "kv_connector tcp: cannot resolve %s:%s: %s", t->host, t->port,
                        gai_strerror(rc));
    return LOOM_OK;
}

static loom_status tcp_listen(void *self, loom_error *err) {
    tcp_inst *t = self;
    if (t->in.lfd >= 0) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector tcp: listen() called twice");
    struct addrinfo *ai;
    loom_status st = tcp_resolve(t, true, &ai, err);
    if (st != LOOM_OK) return st;
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd >= 0 && (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0)) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return kvc_fail(err, LOOM_ERR_IO, "kv_connector tcp: cannot listen on %s:%s: %s", t->host, t->port,
                        strerror(e));
    t->in.lfd = fd;
    t->in.host->log(t->in.host->ctx, LOOM_LOG_INFO, "tcp", "listening on %s:%s", t->host, t->port);
    return LOOM_OK;
}

static loom_status tcp_accept(void *self, int32_t timeout_ms, loom_kv_conn **conn, loom_error *err) {
    kvc_conn *c;
    loom_status st = kvc_inst_accept(self, timeout_ms, NULL, &c, err);
    if (st == LOOM_OK) {
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    *conn = (loom_kv_conn *)c;
    return st;
}

static loom_status tcp_connect(void *self, loom_kv_conn **conn, loom_error *err) {
    tcp_inst *t = self;
    *conn = NULL;
    struct addrinfo *ai;
    loom_status st = tcp_resolve(t, false, &ai, err);
    if (st != LOOM_OK) return st;
    char peer[LOOM_PARAM_STRING_MAX + 24];
    snprintf(peer, sizeof peer, "%s:%s", t->host, t->port);
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
        st = kvc_connect_fd(a->ai_family, a->ai_addr, a->ai_addrlen, (int32_t)t->in.cfg.timeout_ms, &fd, "tcp", peer,
                            err);
    freeaddrinfo(ai);
    if (fd < 0) return st;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    kvc_conn *c;
    st = kvc_inst_connected(&t->in, fd, peer, &c, err);
    *conn = (loom_kv_conn *)c;
    return st;
}

static loom_status tcp_send(void *self, loom_kv_conn *conn, const loom_kv_msg *m, loom_error *err) {
    if (!conn || !m || m->struct_size < offsetof(loom_kv_msg, payload_len) + sizeof m->payload_len)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector tcp: send() needs a connection and a message");
    if (m->payload_len && LOOM_HAS_FIELD(m, loom_kv_msg, payload_device) && m->payload_on_device)
        return kvc_fail(err, LOOM_ERR_UNSUPPORTED,
                        "kv_connector tcp: the payload is device memory (CUDA device %d); tcp sends host memory",
                        (int)m->payload_device);
    loom_status st = kvc_conn_auth((kvc_conn *)conn, "tcp", err);
    if (st != LOOM_OK) return st;
    return kvc_send_frame((kvc_conn *)conn, m->type, 0, m->head, m->head_len, m->payload, m->payload_len, "tcp", err);
}

static loom_status tcp_recv(void *self, loom_kv_conn *conn, loom_kv_msg *out, loom_error *err) {
    if (!conn || !out) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector tcp: recv() needs a connection");
    loom_status st = kvc_conn_auth((kvc_conn *)conn, "tcp", err);
    return st != LOOM_OK ? st : kvc_recv_inline((kvc_conn *)conn, out, "tcp", err);
}

static void tcp_close(void *self, loom_kv_conn *conn) { kvc_conn_free((kvc_conn *)conn); }

static const loom_kv_connector_ops tcp_ops = {
    .struct_size = sizeof(loom_kv_connector_ops),
    .create = tcp_create,
    .destroy = tcp_destroy,
    .limits = tcp_limits,
    .listen = tcp_listen,
    .accept = tcp_accept,
    .connect = tcp_connect,
    .send = tcp_send,
    .recv = tcp_recv,
    .close = tcp_close,
};

static const loom_component tcp_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_KV_CONNECTOR,
    .name = "tcp",
    .summary = "KV hand-over across hosts: one TCP connection per prefill, key-authenticated (HMAC-SHA256)",
    .ops = &tcp_ops,
    .params = tcp_params,
    .config_size = sizeof(tcp_config),
}};

static const loom_plugin_desc tcp_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-kv_connector-tcp",
    .version = "0.1.0",
    .num_components = 1,
    .components = tcp_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &tcp_desc; }
