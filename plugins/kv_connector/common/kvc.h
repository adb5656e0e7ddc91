/*
 * plugins/kv_connector/common/kvc.h — what the socket-based KV connectors
 * (tcp, shm) share: the frame on the wire, its parser (a pure function, the
 * fuzz target), reads and writes bounded by a deadline, the key-based
 * mutual authentication, and the parameters every one of them declares.
 *
 * A frame is a 32-byte header, then the head, then (for an inline payload)
 * the payload:
 *     magic "LMKV" | type u32 | head_len u32 | flags u32 | payload_len u64 | reserved u64
 * all little-endian. flags bit 0 (KVC_FLAG_SHM): the payload lives in a
 * shared-memory segment whose name ends the head (the last KVC_SHM_NAME
 * bytes, NUL-padded) instead of following on the socket.
 *
 * Authentication (both sides hold the same key, at least 16 bytes):
 *   server -> client  CHALLENGE: nonce_s (32 random bytes)
 *   client -> server  PROOF:     nonce_c, HMAC-SHA256(key, "loom-kv client" | nonce_s | nonce_c)
 *   server -> client  ACCEPT:    HMAC-SHA256(key, "loom-kv server" | nonce_c | nonce_s)
 * A wrong MAC closes the connection. Only the handshake is authenticated:
 * the frames after it are neither encrypted nor individually MACed, so a
 * link an attacker can write into needs a tunnel (docs/disaggregation.md).
 *
 * Static library linked into each connector .so; public headers, libcrypto
 * and libc only, never libloom.
 */
#ifndef LOOM_KVC_H
#define LOOM_KVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/kv_connector.h"

#define KVC_HEADER_BYTES 32
#define KVC_MAGIC 0x564B4D4Cu /* "LMKV" read little-endian */
#define KVC_FLAG_SHM 1u
#define KVC_SHM_NAME 64       /* bytes reserved for a segment name          */
#define KVC_NONCE 32
#define KVC_MAC 32
#define KVC_KEY_MAX 1024
#define KVC_KEY_MIN 16

/* Types the connectors use themselves (the core's types are small). */
#define KVC_T_CHALLENGE 0x7FFF0001u
#define KVC_T_PROOF 0x7FFF0002u
#define KVC_T_ACCEPT 0x7FFF0003u
#define KVC_T_SHM_ACK 0x7FFF0004u

/* The parameters every socket connector declares, at the start of its
 * config struct (kvc_params below lists them). */
typedef struct kvc_config {
    char key_file[LOOM_PARAM_STRING_MAX];
    int64_t timeout_ms;
    int64_t max_head_bytes;
    int64_t max_payload_bytes;
} kvc_config;

#define KVC_PARAMS(type)                                                                                        \
    {"key_file", LOOM_PARAM_STRING, offsetof(type, base.key_file), "", 1, 0, NULL,                              \
     "file holding the shared key (>= 16 bytes, mode 0600 advised) both engines must hold; ~ not expanded"},     \
        {"timeout_ms", LOOM_PARAM_INT, offsetof(type, base.timeout_ms), "60000", 1, 3600000, NULL,              \
         "bound on every wait for the peer (connect, handshake, each message) and on the prefill itself, ms"}, \
        {"max_head_bytes", LOOM_PARAM_INT, offsetof(type, base.max_head_bytes), "1048576", 4096, 67108864, NULL, \
         "largest message head accepted (the prompt's token ids travel in it), bytes"},                         \
        {"max_payload_bytes", LOOM_PARAM_INT, offsetof(type, base.max_payload_bytes), "1073741824", 0,           \
         1099511627776.0, NULL, "largest payload accepted (the KV block images of one prompt), bytes"}

/* A parsed frame header. */
typedef struct kvc_frame {
    uint32_t type;
    uint32_t head_len;
    uint32_t flags;
    uint64_t payload_len;
} kvc_frame;

/* Parse and check a header against the limits: magic, known flags, zero
 * reserved bytes, head_len <= max_head, payload_len <= max_payload, and a
 * shared-memory frame's head holding at least its segment name. On failure
 * false and a reason in why (cap bytes). Pure: the fuzz target. */
bool kvc_frame_parse(const uint8_t hdr[KVC_HEADER_BYTES], uint32_t max_head, uint64_t max_payload,
                     kvc_frame *out, char *why, size_t cap);
void kvc_frame_write(uint8_t hdr[KVC_HEADER_BYTES], const kvc_frame *f);

/* One connection's socket and receive buffers. */
typedef struct kvc_conn {
    int fd;
    int32_t timeout_ms;
    uint32_t max_head;
    uint64_t max_payload;
    uint8_t *head;             /* (max_head) received head                  */
    uint8_t *payload;          /* inline payload received, grown as needed  */
    uint64_t payload_cap;
    void *oob;                 /* a received out-of-band payload's handle   */
    void (*oob_close)(void *oob); /* releases it (at the next recv or free) */
    bool oob_ack_due;          /* its acknowledgement waits for that release
                                  (a device payload read in place)          */
    void *lent;                /* a payload buffer lent for the next send   */
    char peer[96];             /* for messages                              */
    /* accepted, handshake not run yet: it runs at the first send or recv,
     * on the connection's own thread, so a silent peer never stalls the
     * listener (kvc_conn_auth) */
    const uint8_t *auth_key;   /* the instance's key (outlives the conn)    */
    size_t auth_key_len;
    bool auth_pending;
} kvc_conn;

/* Make a connection around fd (owned from here on); NULL when out of memory
 * (fd closed). */
kvc_conn *kvc_conn_new(int fd, const kvc_config *cfg, const char *peer);
void kvc_conn_free(kvc_conn *c);

/* Write / read exactly n bytes before the connection's timeout. */
loom_status kvc_write_all(kvc_conn *c, const void *p, size_t n, const char *who, loom_error *err);
loom_status kvc_read_all(kvc_conn *c, void *p, size_t n, const char *who, loom_error *err);

/* One frame with an inline payload (or none). */
loom_status kvc_send_frame(kvc_conn *c, uint32_t type, uint32_t flags, const void *head, uint32_t head_len,
                           const void *payload, uint64_t payload_len, const char *who, loom_error *err);
/* The next frame's header and head (into c->head); the payload, if any,
 * is the caller's to read (inline) or map (shared memory). */
loom_status kvc_recv_head(kvc_conn *c, kvc_frame *f, const char *who, loom_error *err);
/* The inline payload of frame f (its head already read) into c->payload,
 * and *out filled. */
loom_status kvc_recv_payload(kvc_conn *c, const kvc_frame *f, loom_kv_msg *out, const char *who, loom_error *err);
/* The next frame in full with an inline payload (into c->payload). */
loom_status kvc_recv_inline(kvc_conn *c, loom_kv_msg *out, const char *who, loom_error *err);

/* The key from cfg->key_file into key (KVC_KEY_MAX bytes); *len 0 when
 * key_file is "" and `required` is false. */
loom_status kvc_load_key(const kvc_config *cfg, bool required, uint8_t *key, size_t *len, const char *who,
                         loom_error *err);
/* The handshake above; key_len 0 skips it (shm with same-user sockets). */
loom_status kvc_auth_server(kvc_conn *c, const uint8_t *key, size_t key_len, const char *who, loom_error *err);
loom_status kvc_auth_client(kvc_conn *c, const uint8_t *key, size_t key_len, const char *who, loom_error *err);

/* Sockets. kvc_accept_fd: wait up to timeout_ms for a peer on the
 * listening socket; LOOM_ERR_IO "timeout..." when none came (*fd -1).
 * kvc_connect_fd: a socket of `family` connected to addr within
 * timeout_ms. */
struct sockaddr;
loom_status kvc_accept_fd(int listen_fd, int32_t timeout_ms, int *fd, const char *who, loom_error *err);
loom_status kvc_connect_fd(int family, const struct sockaddr *addr, unsigned addrlen, int32_t timeout_ms, int *fd,
                           const char *who, const char *peer, loom_error *err);

/* What every socket connector instance holds; each embeds it first. */
typedef struct kvc_inst {
    const loom_host *host;
    const char *who;           /* "tcp", "shm": the component's name        */
    kvc_config cfg;
    uint8_t key[KVC_KEY_MAX];
    size_t key_len;            /* 0: no handshake (shm without a key file)  */
    int lfd;                   /* listening socket, -1 before listen()       */
} kvc_inst;

/* Fill the common part from the bound config (the key read here). */
loom_status kvc_inst_init(kvc_inst *in, const loom_host *host, const char *who, const kvc_config *cfg,
                          bool key_required, loom_error *err);
void kvc_inst_limits(const kvc_inst *in, loom_kv_limits *out);
/* accept() of loom/kv_connector.h: the socket, vetted by `check` (may be
 * NULL; e.g. the peer's user id), with its handshake left pending for the
 * connection's first send or recv (kvc_conn_auth). */
loom_status kvc_inst_accept(kvc_inst *in, int32_t timeout_ms, bool (*check)(int fd, char *why, size_t cap),
                            kvc_conn **out, loom_error *err);
/* A connected socket (owned from here on) through the client handshake. */
loom_status kvc_inst_connected(kvc_inst *in, int fd, const char *peer, kvc_conn **out, loom_error *err);

/* Run an accepted connection's pending handshake (a no-op afterwards):
 * every send and recv of a connector starts with it. */
loom_status kvc_conn_auth(kvc_conn *c, const char *who, loom_error *err);

/* Deadline arithmetic for poll(). */
double kvc_now_ms(void);

/* Fill err through the host table; returns code. */
loom_status kvc_fail(loom_error *err, loom_status code, const char *fmt, ...) LOOM_PRINTF_FMT(3, 4);

#endif
