/*
 * loom/kv_connector.h — KV connectors (since ABI 2.4): the transport that
 * carries a finished prefill from one engine to another (prefill/decode
 * disaggregation, docs/disaggregation.md).
 *
 * A connector moves framed messages between two processes over one
 * authenticated connection; it knows nothing of engines, blocks or tokens.
 * The core speaks its own small protocol over it (core/disagg: a decode
 * engine sends the prompt, the prefill engine answers with the KV blocks of
 * all layers for all but the prompt's last token, or an error). What a
 * connector decides is how the bytes travel: a socket (`tcp`), a Unix
 * socket for control and POSIX shared memory for the blocks (`shm`), GPU
 * memory shared through CUDA IPC (`cuda-ipc`).
 *
 * A message is a type, a head (small, parsed by the core: at most the
 * connector's declared head limit) and a payload (the block images: at most
 * its payload limit). Every limit is checked BEFORE anything is allocated
 * for it, so a hostile or broken peer gets an error, never an unbounded
 * allocation; every wait is bounded by the connector's timeout, so a dead
 * peer gets an error, never a hang.
 *
 * Roles: the prefill side calls listen() once and then accept() in a loop;
 * the decode side calls connect() for each hand-over. Both sides then
 * exchange messages with send() / recv() and end with close(). A
 * connection carries one hand-over; the core opens a new one for the next.
 *
 * Threads: create, destroy and listen are [engine] in the sense of
 * loom/plugin.h (one thread, never concurrently with anything else on the
 * instance). accept() is called from one thread at a time (the listener
 * thread). connect() may be called from several threads at once ([any]);
 * each connection it or accept() returns is then [instance]: any thread,
 * never two calls at once on one connection; different connections of one
 * instance are used concurrently. destroy() comes after every connection
 * was closed.
 *
 * Errors: every fallible method returns a status and fills `err` (may be
 * NULL) naming the connector, the peer and what failed: LOOM_ERR_IO for a
 * socket or peer failure (including a timeout — the message says so),
 * LOOM_ERR_FORMAT for a malformed or over-limit message from the peer,
 * LOOM_ERR_INVALID for a failed authentication or a bad argument,
 * LOOM_ERR_UNSUPPORTED when the transport cannot work here (cuda-ipc
 * without a GPU). After an error on a connection the only valid call on it
 * is close().
 */
#ifndef LOOM_KV_CONNECTOR_H
#define LOOM_KV_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One connection, opaque to the host. */
typedef struct loom_kv_conn loom_kv_conn;

/*
 * One message. Sending: the caller fills it and keeps every pointer valid
 * for the send() call. Receiving: the connector fills it; head and payload
 * point into memory the connection owns, valid until the next recv() or
 * close() on that connection. Grows only at its end.
 */
typedef struct loom_kv_msg {
    uint32_t struct_size;      /* sizeof(loom_kv_msg) as its writer built it */
    uint32_t type;             /* the core's message type, opaque here (> 0) */
    const void *head;          /* (head_len) bytes; NULL when head_len is 0  */
    uint32_t head_len;         /* <= the connector's head limit              */
    const void *payload;       /* (payload_len) bytes; NULL when 0           */
    uint64_t payload_len;      /* <= the connector's payload limit           */
    /* since ABI 2.6 (a shorter struct: host memory). Sending: false when
     * the payload is host memory, true when it is device memory of CUDA
     * ordinal payload_device (a connector that cannot send device memory
     * refuses it, LOOM_ERR_UNSUPPORTED). Receiving: the connector sets both
     * (the caller sets payload_on_device false before the call); true when
     * the payload is device memory (cuda-ipc: the sender's buffer, mapped).
     * Such a payload is acknowledged to the sender only by
     * payload_release(), the next recv() or close() on the connection, so
     * the sender's send() waits, and keeps it, that long: read it in place
     * (a backend's kv_write_blocks) or copy it out with payload_to_host(),
     * then release it. */
    bool payload_on_device;
    int32_t payload_device;
} loom_kv_msg;

/* What the core needs to know of an instance. Grows only at its end. */
typedef struct loom_kv_limits {
    uint32_t struct_size;      /* set by the core before the call            */
    uint32_t max_head;         /* bytes of the largest head it sends/accepts */
    uint64_t max_payload;      /* bytes of the largest payload               */
    int32_t timeout_ms;        /* its bound on every wait for the peer       */
} loom_kv_limits;

typedef struct loom_kv_connector_ops {
    uint32_t struct_size;      /* sizeof(loom_kv_connector_ops)              */
    loom_create_fn *create;    /* REQUIRED (loom/plugin.h). Reads the config
                                  (address, key file, limits) and checks it;
                                  opens no socket yet.                       */
    loom_destroy_fn *destroy;  /* REQUIRED. Closes the listening socket and
                                  removes what listen() created (a socket
                                  file); every connection was closed first. */

    /* REQUIRED. The instance's limits into *out (out->struct_size set by
     * the caller; the connector fills the fields it covers). [any]. */
    void (*limits)(void *self, loom_kv_limits *out);

    /* REQUIRED. Prefill side: start listening at the configured address.
     * Called at most once. LOOM_ERR_IO naming the address when it cannot
     * be bound. */
    loom_status (*listen)(void *self, loom_error *err);

    /* REQUIRED. Prefill side, after listen(): wait up to timeout_ms (>= 0)
     * for one peer. On LOOM_OK *conn is a new connection the caller
     * closes. No peer within the time: LOOM_ERR_IO with *conn NULL and a
     * message starting "timeout"; the caller loops (that is how a listener
     * thread notices shutdown). A peer refused before any exchange (e.g.
     * another user) is LOOM_ERR_INVALID; the listener goes on. The key
     * handshake may be left to the connection's first send() or recv(),
     * on the connection's own thread, so a silent peer never stalls the
     * listener: a failed handshake then comes back from that call as
     * LOOM_ERR_INVALID, and nothing of the peer's is read past it. */
    loom_status (*accept)(void *self, int32_t timeout_ms, loom_kv_conn **conn, loom_error *err);

    /* REQUIRED. Decode side: connect to the configured address and
     * authenticate (both sides prove they hold the key), within the
     * connector's timeout. On LOOM_OK *conn is a new connection the caller
     * closes; on failure *conn is NULL and nothing is left open. With a
     * handshake left to the accepted side's first send() or recv() (see
     * accept), connect() returns only once that side made it: the
     * accepting side must read or write while connect() runs. */
    loom_status (*connect)(void *self, loom_kv_conn **conn, loom_error *err);

    /* REQUIRED. Send one message (m borrowed for the call; type > 0, head
     * and payload within the limits, else LOOM_ERR_INVALID and nothing is
     * sent). Returns once the peer may read it all (a socket: written to
     * the kernel; shared memory: the segment is written and announced). */
    loom_status (*send)(void *self, loom_kv_conn *conn, const loom_kv_msg *m, loom_error *err);

    /* REQUIRED. Receive the next message into *out (see loom_kv_msg for
     * who owns what). A peer that sends a head or payload over the limits,
     * a bad frame, or closes mid-message: LOOM_ERR_FORMAT / LOOM_ERR_IO;
     * nothing past the limits is allocated. */
    loom_status (*recv)(void *self, loom_kv_conn *conn, loom_kv_msg *out, loom_error *err);

    /* REQUIRED. Close and free the connection; NULL is a no-op. Never
     * fails; a peer blocked in recv() on the other side sees LOOM_ERR_IO. */
    void (*close)(void *self, loom_kv_conn *conn);
    /* since ABI 2.4 — add new members below this line only */

    /* OPTIONAL, since ABI 2.6 (NULL = payloads are sent from where the
     * caller has them). [instance]: lend a buffer of len bytes in the
     * transport's own memory for the next send() on conn, so the sender
     * writes the payload there and the connector sends it without a copy
     * (cuda-ipc: an exported device buffer; *device its CUDA ordinal, -1
     * for host memory). Valid until that send() returns or the connection
     * closes; a send() whose payload is another buffer copies as before.
     * LOOM_ERR_NOMEM when none can be had: the caller then sends from its
     * own memory. */
    loom_status (*payload_buffer)(void *self, loom_kv_conn *conn, uint64_t len, void **ptr, int32_t *device,
                                  loom_error *err);
    /* REQUIRED when recv() can return device payloads, else OPTIONAL
     * (since ABI 2.6). [instance]: copy the payload of the last recv() on
     * conn into host memory dst of exactly its payload_len bytes (for a
     * receiver that cannot read that device's memory). */
    loom_status (*payload_to_host)(void *self, loom_kv_conn *conn, void *dst, uint64_t len, loom_error *err);
    /* REQUIRED when recv() can return device payloads, else OPTIONAL
     * (since ABI 2.6). [instance]: the caller is done with the payload of
     * the last recv() on conn (its pointer is invalid from here on); a
     * device payload is unmapped and acknowledged now, so the sender's
     * send() returns. Nothing received: a no-op. Never fails. */
    void (*payload_release)(void *self, loom_kv_conn *conn);
    /* since ABI 2.6 — add new members below this line only */
} loom_kv_connector_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_KV_CONNECTOR_H */
