/*
 * plugins/kv_connector/shm/shm.c — loom-kv_connector-shm.so: the `shm` KV
 * connector, for a prefill and a decode engine on one host. Control frames
 * (kvc.h) travel over a Unix-domain socket; a payload (the KV block images)
 * is written once into a fresh POSIX shared-memory segment that the peer
 * maps read-only, so the blocks never pass through a socket buffer.
 *
 * Handshake: the listener accepts only peers running as its own user
 * (SO_PEERCRED) and, when key_file is set, the key handshake as well.
 * Segments: the sender creates "/loom-kv-<pid>-<n>-<random>" (O_EXCL, mode
 * 0600), names it in the frame, waits (bounded) for the peer's
 * acknowledgement that it has mapped it, and unlinks it; a sender that
 * fails or times out unlinks it too, so no segment outlives a hand-over
 * unless the sender process itself dies in that window.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <openssl/rand.h>

#include "kvc.h"

#define SHM_PREFIX "/loom-kv-"

typedef struct shm_config {
    kvc_config base;
    char path[LOOM_PARAM_STRING_MAX];
} shm_config;

static const loom_param shm_params[] = {
    KVC_PARAMS(shm_config),
    {"path", LOOM_PARAM_STRING, offsetof(shm_config, path), "/tmp/loom-kv.sock", 1, 0, NULL,
     "Unix-domain socket the prefill engine listens on and the decode engine connects to "
     "(at most 107 bytes)"},
    {0},
};

typedef struct shm_inst {
    kvc_inst in;
    struct sockaddr_un addr;
    bool owns_path;            /* listen() created the socket file          */
    atomic_uint seg_counter;
} shm_inst;

static loom_status shm_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    const shm_config *cfg = config;
    shm_inst *t = host->calloc(host->ctx, 1, sizeof *t);
    if (!t) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "kv_connector shm: out of memory");
    loom_status st = kvc_inst_init(&t->in, host, "shm", &cfg->base, false, err);
    if (st == LOOM_OK && (!cfg->path[0] || strlen(cfg->path) >= sizeof t->addr.sun_path))
        st = host->error(host->ctx, err, LOOM_ERR_INVALID, "kv_connector shm: path '%s' must be 1 to %zu bytes",
                         cfg->path, sizeof t->addr.sun_path - 1);
    if (st == LOOM_OK && cfg->base.max_head_bytes <= KVC_SHM_NAME)
        st = host->error(host->ctx, err, LOOM_ERR_INVALID, "kv_connector shm: max_head_bytes too small");
    if (st != LOOM_OK) {
        host->free(host->ctx, t);
        return st;
    }
    t->addr.sun_family = AF_UNIX;
    snprintf(t->addr.sun_path, sizeof t->addr.sun_path, "%s", cfg->path);
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
    if (t->in.lfd >= 0) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: listen() called twice");
    struct stat sb;
    if (lstat(t->addr.sun_path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode) || path_in_use(t))
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: '%s' exists and is %s", t->addr.sun_path,
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
        return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: cannot listen on '%s': %s", t->addr.sun_path,
                        strerror(e));
    }
    t->in.lfd = fd;
    t->owns_path = true;
    t->in.host->log(t->in.host->ctx, LOOM_LOG_INFO, "shm", "listening on %s", t->addr.sun_path);
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
                                    (int32_t)t->in.cfg.timeout_ms, &fd, "shm", t->addr.sun_path, err);
    if (st != LOOM_OK) return st;
    char why[128];
    if (!same_user(fd, why, sizeof why)) {
        close(fd);
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: '%s': %s", t->addr.sun_path, why);
    }
    kvc_conn *c;
    st = kvc_inst_connected(&t->in, fd, t->addr.sun_path, &c, err);
    *conn = (loom_kv_conn *)c;
    return st;
}

/* ------------------------------------------------------------ segments */

/* A new segment holding the payload; its name in name[KVC_SHM_NAME]. */
static loom_status seg_write(shm_inst *t, const void *payload, uint64_t len, char *name, loom_error *err) {
    uint32_t rnd = 0;
    RAND_bytes((unsigned char *)&rnd, sizeof rnd);
    memset(name, 0, KVC_SHM_NAME);
    snprintf(name, KVC_SHM_NAME, SHM_PREFIX "%d-%u-%08x", (int)getpid(), atomic_fetch_add(&t->seg_counter, 1), rnd);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: shm_open(%s): %s", name, strerror(errno));
    void *m = MAP_FAILED;
    int e = 0;
    if (ftruncate(fd, (off_t)len) != 0 || (m = mmap(NULL, (size_t)len, PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return kvc_fail(err, e == ENOSPC || e == ENOMEM ? LOOM_ERR_NOMEM : LOOM_ERR_IO,
                        "kv_connector shm: a segment of %llu bytes: %s (is /dev/shm large enough?)",
                        (unsigned long long)len, strerror(e));
    }
    memcpy(m, payload, (size_t)len);
    munmap(m, (size_t)len);
    return LOOM_OK;
}

static loom_status shm_send(void *self, loom_kv_conn *conn, const loom_kv_msg *m, loom_error *err) {
    shm_inst *t = self;
    kvc_conn *c = (kvc_conn *)conn;
    if (!c || !m || m->struct_size < sizeof *m)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: send() needs a connection and a message");
    if (m->payload_len == 0) return kvc_send_frame(c, m->type, 0, m->head, m->head_len, NULL, 0, "shm", err);
    if (m->head_len > c->max_head - KVC_SHM_NAME || !m->payload || m->payload_len > c->max_payload)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: message outside the limits or without its payload");
    uint8_t *head = malloc((size_t)m->head_len + KVC_SHM_NAME);
    if (!head) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector shm: out of memory");
    if (m->head_len) memcpy(head, m->head, m->head_len);
    char *name = (char *)head + m->head_len;
    loom_status st = seg_write(t, m->payload, m->payload_len, name, err);
    if (st == LOOM_OK) {
        st = kvc_send_frame(c, m->type, KVC_FLAG_SHM, head, m->head_len + KVC_SHM_NAME, NULL, m->payload_len, "shm",
                            err);
        kvc_frame f;
        if (st == LOOM_OK && (st = kvc_recv_head(c, &f, "shm", err)) == LOOM_OK && f.type != KVC_T_SHM_ACK)
            st = kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector shm: peer answered a segment with frame type 0x%x",
                          f.type);
        shm_unlink(name);
    }
    free(head);
    return st;
}

/* A segment name from a peer: ours in shape, NUL-terminated. */
static bool seg_name_ok(const char *n) {
    size_t l = strnlen(n, KVC_SHM_NAME);
    if (l == KVC_SHM_NAME || strncmp(n, SHM_PREFIX, strlen(SHM_PREFIX)) != 0) return false;
    for (size_t i = 1; i < l; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'z') || n[i] == '-')) return false;
    return true;
}

static loom_status seg_map(kvc_conn *c, const kvc_frame *f, loom_kv_msg *out, loom_error *err) {
    char name[KVC_SHM_NAME];
    memcpy(name, c->head + f->head_len - KVC_SHM_NAME, KVC_SHM_NAME);
    if (!seg_name_ok(name))
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector shm: peer named a segment that is not a loom KV segment");
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return kvc_fail(err, LOOM_ERR_IO, "kv_connector shm: shm_open(%s): %s", name, strerror(errno));
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == f->payload_len)
        m = mmap(NULL, (size_t)f->payload_len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector shm: segment %s is not the %llu bytes announced", name,
                        (unsigned long long)f->payload_len);
    c->map = m;
    c->map_len = (size_t)f->payload_len;
    *out = (loom_kv_msg){.struct_size = sizeof *out, .type = f->type,
                         .head = f->head_len > KVC_SHM_NAME ? c->head : NULL, .head_len = f->head_len - KVC_SHM_NAME,
                         .payload = m, .payload_len = f->payload_len};
    return kvc_send_frame(c, KVC_T_SHM_ACK, 0, NULL, 0, NULL, 0, "shm", err);
}

static loom_status shm_recv(void *self, loom_kv_conn *conn, loom_kv_msg *out, loom_error *err) {
    kvc_conn *c = (kvc_conn *)conn;
    if (!c || !out) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector shm: recv() needs a connection");
    if (c->map) {
        munmap(c->map, c->map_len);
        c->map = NULL;
    }
    kvc_frame f;
    loom_status st = kvc_recv_head(c, &f, "shm", err);
    if (st != LOOM_OK) return st;
    if (f.flags & KVC_FLAG_SHM) return seg_map(c, &f, out, err);
    return kvc_recv_payload(c, &f, out, "shm", err);
}

static void shm_close(void *self, loom_kv_conn *conn) { kvc_conn_free((kvc_conn *)conn); }

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
};

static const loom_component shm_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_KV_CONNECTOR,
    .name = "shm",
    .summary = "KV hand-over on one host: control over a Unix socket, blocks in POSIX shared memory",
    .ops = &shm_ops,
    .params = shm_params,
    .config_size = sizeof(shm_config),
}};

static const loom_plugin_desc shm_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-kv_connector-shm",
    .version = "0.1.0",
    .num_components = 1,
    .components = shm_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &shm_desc; }
