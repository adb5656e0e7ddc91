/*
 * plugins/kv_connector/common/kvc.c — frames, deadline-bounded socket I/O
 * and the key handshake shared by the tcp and shm connectors (kvc.h).
 */
#include "kvc.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

loom_status kvc_fail(loom_error *err, loom_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return code;
}

double kvc_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------ frames */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

bool kvc_frame_parse(const uint8_t hdr[KVC_HEADER_BYTES], uint32_t max_head, uint64_t max_payload,
                     kvc_frame *out, char *why, size_t cap) {
    kvc_frame f = {.type = rd32(hdr + 4), .head_len = rd32(hdr + 8), .flags = rd32(hdr + 12),
                   .payload_len = rd64(hdr + 16)};
    if (rd32(hdr) != KVC_MAGIC)
        snprintf(why, cap, "not a loom KV frame (magic 0x%08x)", rd32(hdr));
    else if (f.type == 0)
        snprintf(why, cap, "frame type 0");
    else if (f.flags & ~KVC_FLAG_SHM)
        snprintf(why, cap, "unknown frame flags 0x%x", f.flags);
    else if (rd64(hdr + 24) != 0)
        snprintf(why, cap, "reserved header bytes are not zero");
    else if (f.head_len > max_head)
        snprintf(why, cap, "head of %u bytes exceeds the limit of %u (max_head_bytes)", f.head_len, max_head);
    else if (f.payload_len > max_payload)
        snprintf(why, cap, "payload of %llu bytes exceeds the limit of %llu (max_payload_bytes)",
                 (unsigned long long)f.payload_len, (unsigned long long)max_payload);
    else if ((f.flags & KVC_FLAG_SHM) && f.head_len < KVC_SHM_NAME)
        snprintf(why, cap, "shared-memory frame without a segment name (head %u bytes)", f.head_len);
    else {
        *out = f;
        return true;
    }
    return false;
}

void kvc_frame_write(uint8_t hdr[KVC_HEADER_BYTES], const kvc_frame *f) {
    memset(hdr, 0, KVC_HEADER_BYTES);
    wr32(hdr, KVC_MAGIC);
    wr32(hdr + 4, f->type);
    wr32(hdr + 8, f->head_len);
    wr32(hdr + 12, f->flags);
    wr64(hdr + 16, f->payload_len);
}

/* -------------------------------------------------------------- connection */

kvc_conn *kvc_conn_new(int fd, const kvc_config *cfg, const char *peer) {
    kvc_conn *c = calloc(1, sizeof *c);
    if (c) c->head = malloc((size_t)cfg->max_head_bytes);
    if (!c || !c->head) {
        free(c);
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->timeout_ms = (int32_t)cfg->timeout_ms;
    c->max_head = (uint32_t)cfg->max_head_bytes;
    c->max_payload = (uint64_t)cfg->max_payload_bytes;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return c;
}

void kvc_conn_free(kvc_conn *c) {
    if (!c) return;
    if (c->oob && c->oob_close) c->oob_close(c->oob);
    if (c->fd >= 0) close(c->fd);
    free(c->head);
    free(c->payload);
    free(c);
}

/* Wait until fd is ready for `events` or the deadline passes. */
static loom_status wait_fd(kvc_conn *c, short events, double deadline, const char *who, const char *what,
                           loom_error *err) {
    for (;;) {
        double left = deadline - kvc_now_ms();
        if (left <= 0)
            return kvc_fail(err, LOOM_ERR_IO, "timeout: kv_connector %s: %s %s took longer than %d ms", who, what,
                            c->peer, c->timeout_ms);
        struct pollfd p = {.fd = c->fd, .events = events};
        int r = poll(&p, 1, (int)(left + 1));
        if (r > 0) return LOOM_OK; /* readable, writable, or an error the next call reports */
        if (r < 0 && errno != EINTR)
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: poll on %s: %s", who, c->peer, strerror(errno));
    }
}

loom_status kvc_write_all(kvc_conn *c, const void *p, size_t n, const char *who, loom_error *err) {
    const char *b = p;
    double deadline = kvc_now_ms() + c->timeout_ms;
    while (n > 0) {
        ssize_t w = send(c->fd, b, n, MSG_NOSIGNAL);
        if (w > 0) {
            b += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: sending to %s: %s", who, c->peer, strerror(errno));
        loom_status st = wait_fd(c, POLLOUT, deadline, who, "sending to", err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

loom_status kvc_read_all(kvc_conn *c, void *p, size_t n, const char *who, loom_error *err) {
    char *b = p;
    double deadline = kvc_now_ms() + c->timeout_ms;
    while (n > 0) {
        ssize_t r = recv(c->fd, b, n, 0);
        if (r > 0) {
            b += r, n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: %s closed the connection mid-message", who, c->peer);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: receiving from %s: %s", who, c->peer,
                            strerror(errno));
        loom_status st = wait_fd(c, POLLIN, deadline, who, "waiting for", err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

loom_status kvc_send_frame(kvc_conn *c, uint32_t type, uint32_t flags, const void *head, uint32_t head_len,
                           const void *payload, uint64_t payload_len, const char *who, loom_error *err) {
    if (type == 0 || head_len > c->max_head || payload_len > c->max_payload || (head_len && !head) ||
        (payload_len && !(flags & KVC_FLAG_SHM) && !payload))
        return kvc_fail(err, LOOM_ERR_INVALID,
                        "kv_connector %s: message (type %u, head %u bytes, payload %llu bytes) outside the limits "
                        "(head %u, payload %llu) or missing its data",
                        who, type, head_len, (unsigned long long)payload_len, c->max_head,
                        (unsigned long long)c->max_payload);
    uint8_t hdr[KVC_HEADER_BYTES];
    kvc_frame_write(hdr, &(kvc_frame){.type = type, .head_len = head_len, .flags = flags,
                                      .payload_len = payload_len});
    loom_status st = kvc_write_all(c, hdr, sizeof hdr, who, err);
    if (st == LOOM_OK && head_len) st = kvc_write_all(c, head, head_len, who, err);
    if (st == LOOM_OK && payload_len && !(flags & KVC_FLAG_SHM)) st = kvc_write_all(c, payload, payload_len, who, err);
    return st;
}

loom_status kvc_recv_head(kvc_conn *c, kvc_frame *f, const char *who, loom_error *err) {
    uint8_t hdr[KVC_HEADER_BYTES];
    loom_status st = kvc_read_all(c, hdr, sizeof hdr, who, err);
    if (st != LOOM_OK) return st;
    char why[160];
    if (!kvc_frame_parse(hdr, c->max_head, c->max_payload, f, why, sizeof why))
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector %s: bad frame from %s: %s", who, c->peer, why);
    return f->head_len ? kvc_read_all(c, c->head, f->head_len, who, err) : LOOM_OK;
}

loom_status kvc_recv_inline(kvc_conn *c, loom_kv_msg *out, const char *who, loom_error *err) {
    kvc_frame f;
    loom_status st = kvc_recv_head(c, &f, who, err);
    if (st != LOOM_OK) return st;
    if (f.flags & KVC_FLAG_SHM)
        return kvc_fail(err, LOOM_ERR_FORMAT, "kv_connector %s: %s sent a shared-memory frame on a socket-only link",
                        who, c->peer);
    return kvc_recv_payload(c, &f, out, who, err);
}

loom_status kvc_recv_payload(kvc_conn *c, const kvc_frame *fp, loom_kv_msg *out, const char *who, loom_error *err) {
    const kvc_frame f = *fp;
    loom_status st;
    if (f.payload_len > c->payload_cap) {
        free(c->payload);
        c->payload_cap = 0;
        if (!(c->payload = malloc((size_t)f.payload_len)))
            return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector %s: out of memory for a payload of %llu bytes", who,
                            (unsigned long long)f.payload_len);
        c->payload_cap = f.payload_len;
    }
    if (f.payload_len && (st = kvc_read_all(c, c->payload, (size_t)f.payload_len, who, err)) != LOOM_OK) return st;
    *out = (loom_kv_msg){.struct_size = sizeof *out, .type = f.type, .head = f.head_len ? c->head : NULL,
                         .head_len = f.head_len, .payload = f.payload_len ? c->payload : NULL,
                         .payload_len = f.payload_len};
    return LOOM_OK;
}

/* ---------------------------------------------------------------- the key */

loom_status kvc_load_key(const kvc_config *cfg, bool required, uint8_t *key, size_t *len, const char *who,
                         loom_error *err) {
    *len = 0;
    if (!cfg->key_file[0])
        return required ? kvc_fail(err, LOOM_ERR_INVALID,
                                   "kv_connector %s: key_file is required (a file of >= %d secret bytes both "
                                   "engines read)",
                                   who, KVC_KEY_MIN)
                        : LOOM_OK;
    FILE *f = fopen(cfg->key_file, "rb");
    if (!f) return kvc_fail(err, LOOM_ERR_NOT_FOUND, "kv_connector %s: key_file '%s': %s", who, cfg->key_file,
                            strerror(errno));
    size_t n = fread(key, 1, KVC_KEY_MAX, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    while (n > 0 && (key[n - 1] == '\n' || key[n - 1] == '\r')) n--; /* a key written with echo */
    if (more || n < KVC_KEY_MIN)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: key_file '%s' holds %s bytes; a key is %d to %d bytes",
                        who, cfg->key_file, more ? "too many" : "too few", KVC_KEY_MIN, KVC_KEY_MAX);
    *len = n;
    return LOOM_OK;
}

/* HMAC-SHA256(key, label | a | b). */
static bool mac(const uint8_t *key, size_t klen, const char *label, const uint8_t *a, const uint8_t *b,
                uint8_t out[KVC_MAC]) {
    uint8_t msg[32 + 2 * KVC_NONCE];
    size_t l = strlen(label);
    memcpy(msg, label, l);
    memcpy(msg + l, a, KVC_NONCE);
    memcpy(msg + l + KVC_NONCE, b, KVC_NONCE);
    unsigned int n = 0;
    return HMAC(EVP_sha256(), key, (int)klen, msg, l + 2 * KVC_NONCE, out, &n) && n == KVC_MAC;
}

/* The next frame must be exactly `type` with a head of `len` bytes. */
static loom_status expect(kvc_conn *c, uint32_t type, uint32_t len, const char *who, loom_error *err) {
    kvc_frame f;
    loom_status st = kvc_recv_head(c, &f, who, err);
    if (st != LOOM_OK) return st;
    if (f.type != type || f.head_len != len || f.payload_len || f.flags)
        return kvc_fail(err, LOOM_ERR_INVALID,
                        "kv_connector %s: %s broke the handshake (frame type 0x%x with %u bytes, want 0x%x with %u)",
                        who, c->peer, f.type, f.head_len, type, len);
    return LOOM_OK;
}

loom_status kvc_auth_server(kvc_conn *c, const uint8_t *key, size_t klen, const char *who, loom_error *err) {
    if (klen == 0) return LOOM_OK;
    uint8_t ns[KVC_NONCE], want[KVC_MAC], reply[KVC_MAC];
    if (RAND_bytes(ns, sizeof ns) != 1)
        return kvc_fail(err, LOOM_ERR_INTERNAL, "kv_connector %s: no random bytes for a nonce", who);
    loom_status st = kvc_send_frame(c, KVC_T_CHALLENGE, 0, ns, KVC_NONCE, NULL, 0, who, err);
    if (st == LOOM_OK) st = expect(c, KVC_T_PROOF, KVC_NONCE + KVC_MAC, who, err);
    if (st != LOOM_OK) return st;
    const uint8_t *nc = c->head;
    if (!mac(key, klen, "loom-kv client", ns, nc, want) || CRYPTO_memcmp(want, c->head + KVC_NONCE, KVC_MAC) != 0)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: %s failed authentication (wrong key)", who,
                        c->peer);
    if (!mac(key, klen, "loom-kv server", nc, ns, reply))
        return kvc_fail(err, LOOM_ERR_INTERNAL, "kv_connector %s: HMAC failed", who);
    return kvc_send_frame(c, KVC_T_ACCEPT, 0, reply, KVC_MAC, NULL, 0, who, err);
}

loom_status kvc_auth_client(kvc_conn *c, const uint8_t *key, size_t klen, const char *who, loom_error *err) {
    if (klen == 0) return LOOM_OK;
    loom_status st = expect(c, KVC_T_CHALLENGE, KVC_NONCE, who, err);
    if (st != LOOM_OK) return st;
    uint8_t ns[KVC_NONCE], proof[KVC_NONCE + KVC_MAC], want[KVC_MAC];
    memcpy(ns, c->head, KVC_NONCE);
    if (RAND_bytes(proof, KVC_NONCE) != 1 || !mac(key, klen, "loom-kv client", ns, proof, proof + KVC_NONCE))
        return kvc_fail(err, LOOM_ERR_INTERNAL, "kv_connector %s: no random bytes or HMAC failed", who);
    st = kvc_send_frame(c, KVC_T_PROOF, 0, proof, sizeof proof, NULL, 0, who, err);
    if (st == LOOM_OK) st = expect(c, KVC_T_ACCEPT, KVC_MAC, who, err);
    if (st != LOOM_OK) {
        if (strstr(err ? err->message : "", "closed"))
            kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: %s refused the handshake (wrong key?)", who, c->peer);
        return err ? err->code : st;
    }
    if (!mac(key, klen, "loom-kv server", proof, ns, want) || CRYPTO_memcmp(want, c->head, KVC_MAC) != 0)
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: %s answered the handshake with a wrong MAC", who,
                        c->peer);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- sockets */

loom_status kvc_accept_fd(int listen_fd, int32_t timeout_ms, int *fd, const char *who, loom_error *err) {
    *fd = -1;
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r == 0 || (r < 0 && errno == EINTR))
        return kvc_fail(err, LOOM_ERR_IO, "timeout: kv_connector %s: no peer within %d ms", who, timeout_ms);
    if (r < 0) return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: poll: %s", who, strerror(errno));
    *fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (*fd < 0) {
        int e = errno;
        return kvc_fail(err, LOOM_ERR_IO, "%skv_connector %s: accept: %s",
                        e == EAGAIN || e == ECONNABORTED ? "timeout: " : "", who, strerror(e));
    }
    return LOOM_OK;
}

loom_status kvc_connect_fd(int family, const struct sockaddr *addr, unsigned addrlen, int32_t timeout_ms, int *fd,
                           const char *who, const char *peer, loom_error *err) {
    *fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (*fd < 0) return kvc_fail(err, LOOM_ERR_IO, "kv_connector %s: socket: %s", who, strerror(errno));
    int rc = connect(*fd, addr, addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = *fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t l = sizeof soerr;
        int r;
        while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {}
        if (r == 0) errno = ETIMEDOUT;
        else if (r > 0 && getsockopt(*fd, SOL_SOCKET, SO_ERROR, &soerr, &l) == 0) errno = soerr;
        rc = r > 0 && soerr == 0 ? 0 : -1;
    }
    if (rc == 0) return LOOM_OK;
    int e = errno;
    close(*fd);
    *fd = -1;
    return kvc_fail(err, LOOM_ERR_IO, "%skv_connector %s: cannot connect to %s: %s", e == ETIMEDOUT ? "timeout: " : "",
                    who, peer, strerror(e));
}

/* --------------------------------------------------------------- instances */

loom_status kvc_inst_init(kvc_inst *in, const loom_host *host, const char *who, const kvc_config *cfg,
                          bool key_required, loom_error *err) {
    in->host = host;
    in->who = who;
    in->cfg = *cfg;
    in->lfd = -1;
    return kvc_load_key(cfg, key_required, in->key, &in->key_len, who, err);
}

void kvc_inst_limits(const kvc_inst *in, loom_kv_limits *out) {
    uint32_t size = out->struct_size;
    loom_kv_limits l = {.struct_size = size, .max_head = (uint32_t)in->cfg.max_head_bytes,
                        .max_payload = (uint64_t)in->cfg.max_payload_bytes, .timeout_ms = (int32_t)in->cfg.timeout_ms};
    memcpy(out, &l, size < sizeof l ? size : sizeof l);
}

loom_status kvc_inst_accept(kvc_inst *in, int32_t timeout_ms, bool (*check)(int fd, char *why, size_t cap),
                            kvc_conn **out, loom_error *err) {
    *out = NULL;
    if (in->lfd < 0) return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: accept() before listen()", in->who);
    int fd;
    loom_status st = kvc_accept_fd(in->lfd, timeout_ms, &fd, in->who, err);
    if (st != LOOM_OK) return st;
    char why[128];
    if (check && !check(fd, why, sizeof why)) {
        close(fd);
        return kvc_fail(err, LOOM_ERR_INVALID, "kv_connector %s: peer refused: %s", in->who, why);
    }
    kvc_conn *c = kvc_conn_new(fd, &in->cfg, "the decode engine");
    if (!c) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector %s: out of memory", in->who);
    c->auth_key = in->key;
    c->auth_key_len = in->key_len;
    c->auth_pending = in->key_len > 0;
    *out = c;
    return LOOM_OK;
}

loom_status kvc_conn_auth(kvc_conn *c, const char *who, loom_error *err) {
    if (!c->auth_pending) return LOOM_OK;
    c->auth_pending = false;
    loom_status st = kvc_auth_server(c, c->auth_key, c->auth_key_len, who, err);
    if (st == LOOM_OK) return LOOM_OK;
    shutdown(c->fd, SHUT_RDWR); /* nothing more from or to a peer that failed */
    return LOOM_ERR_INVALID;    /* a failed handshake, whatever broke it */
}

loom_status kvc_inst_connected(kvc_inst *in, int fd, const char *peer, kvc_conn **out, loom_error *err) {
    *out = NULL;
    kvc_conn *c = kvc_conn_new(fd, &in->cfg, peer);
    if (!c) return kvc_fail(err, LOOM_ERR_NOMEM, "kv_connector %s: out of memory", in->who);
    loom_status st = kvc_auth_client(c, in->key, in->key_len, in->who, err);
    if (st != LOOM_OK) {
        kvc_conn_free(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}
