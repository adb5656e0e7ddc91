/*
 * plugins/executor/tp/tp_rendezvous.c — rank-0 rendezvous for multi-node
 * tensor parallelism: node 0 listens on host:port and hands a small blob
 * (NCCL's 128-byte unique id) to every other node, which connects to it.
 * This is all NCCL needs from us to build one communicator across nodes;
 * the collectives then run over NCCL's own transports (NVLink, IB, TCP).
 *
 * Protocol (integers big-endian):
 *   peer -> node 0   "LOOMTPR1" | u32 node_rank | u32 nodes | u32 blob_len
 *   node 0 -> peer   "LOOMTPR1" | u32 status (0 ok, else refused) | blob
 * Node 0 refuses a hello whose nodes or blob length differ from its own, a
 * node rank outside 1..nodes-1 and a rank already served (two processes
 * launched with the same node_rank); the peer then fails with that reason.
 * Peers retry connecting until the timeout, so nodes may start in any order.
 *
 * What it is not: a general launcher or a secure channel — the id grants
 * joining the NCCL group; run it on a trusted cluster network.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tp.h"

#define TP_RDV_MAGIC "LOOMTPR1"
#define TP_RDV_MAGIC_LEN 8
#define TP_RDV_IO_MS 10000 /* per message, once connected */

bool tp_rdv_parse(const char *addr, char *host, size_t host_size, int *port) {
    if (!addr || !*addr) return false;
    const char *colon;
    const char *h0 = addr;
    size_t hlen;
    if (addr[0] == '[') { /* [v6]:port */
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':') return false;
        h0 = addr + 1;
        hlen = (size_t)(close - h0);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon) return false;
        hlen = (size_t)(colon - addr);
        if (memchr(addr, ':', hlen)) return false; /* bare v6 address: needs brackets */
    }
    if (hlen == 0 || hlen >= host_size) return false;
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || !end || *end || end == colon + 1 || p < 1 || p > 65535) return false;
    memcpy(host, h0, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return true;
}

static double tp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Move exactly n bytes (recv when `in`), each wait bounded by ms. */
static bool tp_io(int fd, void *buf, size_t n, bool in, int ms) {
    uint8_t *p = buf;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = in ? POLLIN : POLLOUT};
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t k = in ? recv(fd, p, n, 0) : send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static void tp_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t tp_get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

loom_status tp_rdv_serve(const loom_host *h, const char *addr, const void *blob, size_t len,
                         int32_t clients, int32_t timeout_s, loom_error *err) {
    char host[256], port_s[16];
    int port, fd = -1;
    loom_status st = LOOM_OK;
    bool *seen = NULL;
    if (!tp_rdv_parse(addr, host, sizeof host, &port))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: rendezvous '%s' is not host:port (e.g. node0:29500 or "
                        "[fe80::1]:29500)",
                        addr ? addr : "");
    snprintf(port_s, sizeof port_s, "%d", port);
    seen = h->calloc(h->ctx, (size_t)clients + 1, sizeof *seen);
    if (!seen) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor tp: out of memory");

    /* listen on every address of this node: `host` is how the others
     * reach node 0, which may not be an address it can bind (NAT, a name
     * mapped to 127.0.1.1 in /etc/hosts) */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL, *ai;
    int gai = getaddrinfo(NULL, port_s, &hints, &res);
    if (gai != 0) {
        st = h->error(h->ctx, err, LOOM_ERR_IO, "executor tp: rendezvous port %d: %s", port,
                      gai_strerror(gai));
        goto done;
    }
    int last_errno = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, clients + 4) == 0) break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        st = h->error(h->ctx, err, LOOM_ERR_IO,
                      "executor tp: node 0 cannot listen on rendezvous port %d: %s; pick a free "
                      "port in executor.rendezvous",
                      port, strerror(last_errno));
        goto done;
    }
    h->log(h->ctx, LOOM_LOG_INFO, TP_WHO, "rendezvous: node 0 waiting for %d node(s) on port %d",
           clients, port);

    double deadline = tp_now() + timeout_s;
    int32_t served = 0;
    while (served < clients) {
        int left_ms = (int)((deadline - tp_now()) * 1000);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = left_ms > 0 ? poll(&pf, 1, left_ms) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = h->error(h->ctx, err, LOOM_ERR_IO,
                          "executor tp: rendezvous timed out after %d s on port %d with %d of %d "
                          "node(s) joined; start every node with the same executor.rendezvous "
                          "and executor.nodes, node_rank 1..%d",
                          timeout_s, port, served, clients, clients);
            goto done;
        }
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        uint8_t hello[TP_RDV_MAGIC_LEN + 12], reply[TP_RDV_MAGIC_LEN + 4];
        if (!tp_io(c, hello, sizeof hello, true, TP_RDV_IO_MS) ||
            memcmp(hello, TP_RDV_MAGIC, TP_RDV_MAGIC_LEN) != 0) {
            close(c); /* not one of ours (a port scan, a stale peer) */
            continue;
        }
        uint32_t rank = tp_get32(hello + 8), nodes = tp_get32(hello + 12), blen = tp_get32(hello + 16);
        uint32_t status = 0;
        if (nodes != (uint32_t)clients + 1) status = 1;
        else if (rank < 1 || rank > (uint32_t)clients) status = 2;
        else if (blen != len) status = 3;
        else if (seen[rank]) status = 4;
        memcpy(reply, TP_RDV_MAGIC, TP_RDV_MAGIC_LEN);
        tp_put32(reply + 8, status);
        bool ok = tp_io(c, reply, sizeof reply, false, TP_RDV_IO_MS) &&
                  (status != 0 || tp_io(c, (void *)blob, len, false, TP_RDV_IO_MS));
        close(c);
        if (status != 0) {
            h->log(h->ctx, LOOM_LOG_WARN, TP_WHO,
                   "rendezvous: refused node rank %u (nodes %u, id %u bytes): reason %u", rank,
                   nodes, blen, status);
            continue;
        }
        if (ok) {
            seen[rank] = true;
            served++;
        }
    }
done:
    if (fd >= 0) close(fd);
    h->free(h->ctx, seen);
    return st;
}

loom_status tp_rdv_fetch(const loom_host *h, const char *addr, int32_t node_rank, int32_t nodes,
                         void *blob, size_t len, int32_t timeout_s, loom_error *err) {
    static const char *const why[] = {"", "its executor.nodes differs from this node's",
                                      "this node_rank is outside 1..nodes-1",
                                      "the NCCL id size differs (another NCCL version?)",
                                      "another node already joined with this node_rank"};
    char host[256], port_s[16];
    int port;
    if (!tp_rdv_parse(addr, host, sizeof host, &port))
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: rendezvous '%s' is not host:port (e.g. node0:29500 or "
                        "[fe80::1]:29500)",
                        addr ? addr : "");
    snprintf(port_s, sizeof port_s, "%d", port);
    double deadline = tp_now() + timeout_s;
    char last[256] = "no attempt";
    for (;;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        int gai = getaddrinfo(host, port_s, &hints, &res);
        if (gai != 0) snprintf(last, sizeof last, "%s", gai_strerror(gai));
        for (struct addrinfo *ai = gai == 0 ? res : NULL; ai; ai = ai->ai_next) {
            int c = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (c < 0) continue;
            if (connect(c, ai->ai_addr, ai->ai_addrlen) != 0) {
                snprintf(last, sizeof last, "%s", strerror(errno));
                close(c);
                continue;
            }
            uint8_t hello[TP_RDV_MAGIC_LEN + 12], reply[TP_RDV_MAGIC_LEN + 4];
            memcpy(hello, TP_RDV_MAGIC, TP_RDV_MAGIC_LEN);
            tp_put32(hello + 8, (uint32_t)node_rank);
            tp_put32(hello + 12, (uint32_t)nodes);
            tp_put32(hello + 16, (uint32_t)len);
            bool ok = tp_io(c, hello, sizeof hello, false, TP_RDV_IO_MS) &&
                      tp_io(c, reply, sizeof reply, true, TP_RDV_IO_MS) &&
                      memcmp(reply, TP_RDV_MAGIC, TP_RDV_MAGIC_LEN) == 0;
            uint32_t status = ok ? tp_get32(reply + 8) : 0;
            if (ok && status != 0) {
                close(c);
                freeaddrinfo(res);
                return h->error(h->ctx, err, LOOM_ERR_INVALID,
                                "executor tp: node 0 at %s refused node rank %d of %d: %s", addr,
                                node_rank, nodes, status < 5 ? why[status] : "unknown reason");
            }
            ok = ok && tp_io(c, blob, len, true, TP_RDV_IO_MS);
            close(c);
            if (ok) {
                freeaddrinfo(res);
                return LOOM_OK;
            }
            snprintf(last, sizeof last, "connection closed during the exchange");
        }
        if (res) freeaddrinfo(res);
        if (tp_now() >= deadline) break;
        usleep(200 * 1000); /* node 0 may not be listening yet */
    }
    return h->error(h->ctx, err, LOOM_ERR_IO,
                    "executor tp: node %d could not fetch the NCCL id from node 0 at %s within "
                    "%d s (last error: %s); is node 0 running with the same rendezvous?",
                    node_rank, addr, timeout_s, last);
}
