/*
 * tests/tp/test_tp_comm.c — the tp executor's threads communicator and its
 * TCP rendezvous, compiled in from plugins/executor/tp (tp_comm.c,
 * tp_rendezvous.c) and run on the fake host.
 *
 * Communicator: all-reduce of f32 / f16 / bf16 / i32 equals the sum in rank
 * order 0..n-1 on every rank, bit for bit, over many rounds and odd counts
 * (fewer elements than ranks too); all-gather is rank-major, also in place;
 * mismatched calls are reported on every rank; an abort releases ranks
 * waiting in a collective and reset makes the group usable again; a device
 * stream is refused. All-to-all with per-peer counts: random counts with
 * zeros (ranks sending or receiving nothing) over 1..5 ranks and every
 * element type the engine moves, byte-exact; a count mismatch fails on
 * every rank; an abort releases waiting ranks; bad arguments are refused.
 *
 * Rendezvous: node 0 serves a 128-byte blob to two peers on localhost; a
 * duplicate node rank and a wrong node count are refused with the reason;
 * malformed host:port strings are rejected.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fake_host.h"
#include "tp.h"
#include "formats/dtype.h"

/* One rank's thread: run `fn` with its index. */
typedef struct rk {
    tp_threads *g;
    int32_t rank, n;
    void *arg;
    loom_status st;
    loom_error err;
} rk;

static void run_ranks(int32_t n, tp_threads *g, void *(*fn)(void *), rk *ranks, void *arg) {
    pthread_t th[16];
    for (int32_t i = 0; i < n; i++) {
        ranks[i] = (rk){.g = g, .rank = i, .n = n, .arg = arg};
        cr_assert_eq(pthread_create(&th[i], NULL, fn, &ranks[i]), 0);
    }
    for (int32_t i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* ---------------------------------------------------------- all-reduce */

#define ROUNDS 40
#define MAXC 1000

typedef struct reduce_case {
    loom_dtype dt;
    int64_t count;
    /* per rank, per round: input; output kept for comparison */
    void *in[8];
    void *out[8];
} reduce_case;

static size_t esz(loom_dtype d) { return d == LOOM_DTYPE_F32 || d == LOOM_DTYPE_I32 ? 4 : 2; }

static void *reduce_rank(void *arg) {
    rk *r = arg;
    reduce_case *c = r->arg;
    size_t bytes = (size_t)c->count * esz(c->dt);
    for (int k = 0; k < ROUNDS; k++) {
        uint8_t *buf = (uint8_t *)c->out[r->rank] + (size_t)k * bytes;
        memcpy(buf, (uint8_t *)c->in[r->rank] + (size_t)k * bytes, bytes);
        r->st = tp_threads_all_reduce(r->g, r->rank, buf, c->count, c->dt, NULL, &r->err);
        if (r->st != LOOM_OK) break;
    }
    return NULL;
}

static float h2f(uint16_t h, bool bf) {
    if (bf) {
        uint32_t b = (uint32_t)h << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

static uint16_t f2h(float f, bool bf) {
    if (bf) {
        uint32_t x;
        memcpy(&x, &f, 4);
        x += 0x7fffu + ((x >> 16) & 1);
        return (uint16_t)(x >> 16);
    }
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}

static void check_reduce(int32_t n, loom_dtype dt, int64_t count) {
    const loom_host *h = fake_host();
    tp_threads *g = tp_threads_create(h, n);
    cr_assert(g);
    reduce_case c = {.dt = dt, .count = count};
    size_t bytes = (size_t)count * esz(dt) * ROUNDS;
    uint64_t s = 0x1234567ull + (uint64_t)n * 77 + (uint64_t)count;
    for (int32_t r = 0; r < n; r++) {
        c.in[r] = malloc(bytes + 1);
        c.out[r] = malloc(bytes + 1);
        for (size_t i = 0; i < bytes / esz(dt); i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(s >> 11) * 0x1p-53 * 2.0 - 1.0;
            if (dt == LOOM_DTYPE_F32) ((float *)c.in[r])[i] = (float)(u * 1000.0);
            else if (dt == LOOM_DTYPE_I32) ((int32_t *)c.in[r])[i] = (int32_t)(s >> 33);
            else ((uint16_t *)c.in[r])[i] = f2h((float)(u * 10.0), dt == LOOM_DTYPE_BF16);
        }
    }
    rk ranks[8];
    run_ranks(n, g, reduce_rank, ranks, &c);
    for (int32_t r = 0; r < n; r++)
        cr_assert_eq(ranks[r].st, LOOM_OK, "rank %d: %s", r, ranks[r].err.message);
    for (size_t i = 0; i < bytes / esz(dt); i++) {
        /* the reference: rank order, float32 accumulation */
        float fsum = 0;
        uint32_t isum = 0;
        for (int32_t r = 0; r < n; r++) {
            if (dt == LOOM_DTYPE_F32) fsum = r == 0 ? ((float *)c.in[r])[i] : fsum + ((float *)c.in[r])[i];
            else if (dt == LOOM_DTYPE_I32) isum += (uint32_t)((int32_t *)c.in[r])[i];
            else fsum += h2f(((uint16_t *)c.in[r])[i], dt == LOOM_DTYPE_BF16);
        }
        for (int32_t r = 0; r < n; r++) {
            if (dt == LOOM_DTYPE_F32)
                cr_assert(!memcmp(&((float *)c.out[r])[i], &fsum, 4),
                          "n %d f32 element %zu rank %d: %.9g, want %.9g", n, i, r,
                          (double)((float *)c.out[r])[i], (double)fsum);
            else if (dt == LOOM_DTYPE_I32)
                cr_assert_eq((uint32_t)((int32_t *)c.out[r])[i], isum);
            else
                cr_assert_eq(((uint16_t *)c.out[r])[i], f2h(fsum, dt == LOOM_DTYPE_BF16),
                             "n %d %s element %zu rank %d", n, loom_dtype_name(dt), i, r);
        }
    }
    for (int32_t r = 0; r < n; r++) free(c.in[r]), free(c.out[r]);
    tp_threads_destroy(g);
    cr_assert_eq(fake_host_live_allocs(), 0, "communicator leaked");
}

Test(tp_comm, all_reduce_f32_is_rank_ordered_and_identical) {
    static const int64_t counts[] = {1, 3, 513, MAXC};
    for (int32_t n = 1; n <= 5; n++)
        for (int k = 0; k < 4; k++) check_reduce(n, LOOM_DTYPE_F32, counts[k]);
}

Test(tp_comm, all_reduce_half_types_and_i32) {
    check_reduce(3, LOOM_DTYPE_F16, 777);
    check_reduce(4, LOOM_DTYPE_BF16, 600);
    check_reduce(2, LOOM_DTYPE_I32, 99);
}

/* ---------------------------------------------------------- all-gather */

static void *gather_rank(void *arg) {
    rk *r = arg;
    int32_t *recv = r->arg;
    recv += (size_t)r->rank * (size_t)r->n * 7;
    int32_t send[7];
    for (int i = 0; i < 7; i++) send[i] = r->rank * 100 + i;
    r->st = tp_threads_all_gather(r->g, r->rank, send, recv, 7, LOOM_DTYPE_I32, NULL, &r->err);
    if (r->st != LOOM_OK) return NULL;
    /* in place: this rank's part already sits in its slot of recv */
    int32_t *buf = recv; /* reuse: fill own slot, gather in place */
    for (int i = 0; i < 7; i++) buf[(size_t)r->rank * 7 + i] = -(r->rank * 100 + i);
    r->st = tp_threads_all_gather(r->g, r->rank, buf + (size_t)r->rank * 7, buf, 7, LOOM_DTYPE_I32,
                                  NULL, &r->err);
    return NULL;
}

Test(tp_comm, all_gather_is_rank_major_and_works_in_place) {
    const int32_t n = 4;
    tp_threads *g = tp_threads_create(fake_host(), n);
    int32_t *recv = calloc((size_t)n * n * 7, sizeof(int32_t));
    rk ranks[4];
    run_ranks(n, g, gather_rank, ranks, recv);
    for (int32_t r = 0; r < n; r++) {
        cr_assert_eq(ranks[r].st, LOOM_OK, "rank %d: %s", r, ranks[r].err.message);
        for (int32_t k = 0; k < n; k++)
            for (int i = 0; i < 7; i++)
                cr_assert_eq(recv[((size_t)r * n + k) * 7 + i], -(k * 100 + i),
                             "rank %d slot %d element %d", r, k, i);
    }
    free(recv);
    tp_threads_destroy(g);
}

/* ------------------------------------------------------- all-to-all (v) */

#define A2A_MAXN 5
#define A2A_MAXC 6

/* Every rank's per-destination counts for one round: some zero, some whole
 * rows of zeros (a rank that sends nothing) and columns (one that receives
 * nothing). */
typedef struct a2a_case {
    loom_dtype dt;
    int64_t counts[A2A_MAXN][A2A_MAXN]; /* [source][destination] */
    uint32_t round;
} a2a_case;

/* The byte a source puts at element i, byte k of its message to dest. */
static uint8_t a2a_byte(uint32_t round, int32_t src, int32_t dst, int64_t i, size_t k) {
    return (uint8_t)(round * 131u + (uint32_t)src * 31u + (uint32_t)dst * 7u + (uint32_t)i * 3u + (uint32_t)k);
}

static void *a2a_rank(void *arg) {
    rk *r = arg;
    const a2a_case *c = r->arg;
    const size_t es = esz(c->dt);
    int64_t sc[A2A_MAXN], rc[A2A_MAXN], sn = 0, rn = 0;
    for (int32_t k = 0; k < r->n; k++) {
        sc[k] = c->counts[r->rank][k];
        rc[k] = c->counts[k][r->rank];
        sn += sc[k];
        rn += rc[k];
    }
    uint8_t *send = sn ? malloc((size_t)sn * es) : NULL, *recv = rn ? malloc((size_t)rn * es) : NULL;
    for (int32_t d = 0, o = 0; d < r->n; d++)
        for (int64_t i = 0; i < sc[d]; i++, o++)
            for (size_t k = 0; k < es; k++) send[(size_t)o * es + k] = a2a_byte(c->round, r->rank, d, i, k);
    if (rn) memset(recv, 0xEE, (size_t)rn * es);
    r->st = tp_threads_all_to_allv(r->g, r->rank, send, sc, recv, rc, c->dt, NULL, &r->err);
    for (int32_t s = 0, o = 0; r->st == LOOM_OK && s < r->n; s++)
        for (int64_t i = 0; i < rc[s]; i++, o++)
            for (size_t k = 0; k < es; k++)
                if (recv[(size_t)o * es + k] != a2a_byte(c->round, s, r->rank, i, k)) {
                    snprintf(r->err.message, sizeof r->err.message,
                             "rank %d: element %lld from rank %d, byte %zu wrong", r->rank, (long long)i, s, k);
                    r->st = LOOM_ERR_INTERNAL;
                }
    free(send);
    free(recv);
    return NULL;
}

/* Random counts (zeros included, ranks that send or receive nothing) over
 * 1..5 ranks, for every element type the engine moves: each rank receives
 * exactly its peers' parts, in source order, over many rounds. */
Test(tp_comm, all_to_allv_random_counts_every_dtype) {
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_I32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
    uint32_t seed = 12345;
    for (int32_t n = 1; n <= A2A_MAXN; n++) {
        tp_threads *g = tp_threads_create(fake_host(), n);
        for (uint32_t round = 0; round < 24; round++) {
            a2a_case c = {.dt = dts[round % 4], .round = round};
            const int32_t silent = round % 3 == 0 ? (int32_t)(round % (uint32_t)n) : -1;
            for (int32_t s = 0; s < n; s++)
                for (int32_t d = 0; d < n; d++) {
                    seed = seed * 1103515245u + 12345u;
                    const int64_t v = (int64_t)((seed >> 16) % A2A_MAXC);
                    c.counts[s][d] = s == silent || (round % 4 == 1 && d == n - 1) || v < 2 ? 0 : v;
                }
            rk ranks[A2A_MAXN];
            run_ranks(n, g, a2a_rank, ranks, &c);
            for (int32_t i = 0; i < n; i++)
                cr_assert_eq(ranks[i].st, LOOM_OK, "%d ranks, round %u, %s: %s", n, round, loom_dtype_name(c.dt),
                             ranks[i].err.message);
        }
        tp_threads_destroy(g);
    }
}

static void *a2a_mismatch_rank(void *arg) {
    rk *r = arg;
    float send[4] = {1, 2, 3, 4}, recv[8];
    int64_t sc[2] = {1, 1}, rc[2] = {1, r->rank == 1 ? 2 : 1}; /* rank 1 expects 2 from rank 1, which sends 1 */
    r->st = tp_threads_all_to_allv(r->g, r->rank, send, sc, recv, rc, LOOM_DTYPE_F32, NULL, &r->err);
    return NULL;
}

Test(tp_comm, all_to_allv_count_mismatch_fails_on_every_rank) {
    tp_threads *g = tp_threads_create(fake_host(), 2);
    rk ranks[2];
    run_ranks(2, g, a2a_mismatch_rank, ranks, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_neq(ranks[r].st, LOOM_OK, "rank %d did not notice", r);
        cr_assert(strstr(ranks[r].err.message, "exchange the counts first"), "%s", ranks[r].err.message);
    }
    tp_threads_destroy(g);
}

static void *a2a_waiting_rank(void *arg) {
    rk *r = arg;
    float send[3] = {1, 2, 3}, recv[3];
    int64_t c[3] = {1, 1, 1};
    r->st = tp_threads_all_to_allv(r->g, r->rank, send, c, recv, c, LOOM_DTYPE_F32, NULL, &r->err);
    return NULL;
}

/* Ranks 0 and 1 of g's 3 run `fn` (a collective) while rank 2 never
 * comes: the abort must release both with an error, never a hang. */
static void abort_two_waiters(tp_threads *g, void *(*fn)(void *)) {
    pthread_t th[2];
    rk ranks[2];
    for (int i = 0; i < 2; i++) {
        ranks[i] = (rk){.g = g, .rank = i, .n = 3};
        pthread_create(&th[i], NULL, fn, &ranks[i]);
    }
    usleep(50000);
    tp_threads_abort(g);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_assert_neq(ranks[i].st, LOOM_OK);
        cr_assert(strstr(ranks[i].err.message, "another rank failed"), "%s", ranks[i].err.message);
    }
}

Test(tp_comm, all_to_allv_abort_releases_waiting_ranks) {
    tp_threads *g = tp_threads_create(fake_host(), 3);
    abort_two_waiters(g, a2a_waiting_rank);
    tp_threads_destroy(g);
}

Test(tp_comm, all_to_allv_bad_arguments_are_refused) {
    tp_threads *g = tp_threads_create(fake_host(), 1);
    float x = 1, y = 0;
    int64_t one = 1, zero = 0, neg = -1;
    loom_error err = {0};
    cr_assert_neq(tp_threads_all_to_allv(g, 0, &x, &one, &y, &one, LOOM_DTYPE_F32, (void *)0x10, &err), LOOM_OK);
    cr_assert(strstr(err.message, "comm: nccl"), "%s", err.message);
    cr_assert_neq(tp_threads_all_to_allv(g, 0, &x, &neg, &y, &neg, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert(strstr(err.message, "negative count"), "%s", err.message);
    cr_assert_neq(tp_threads_all_to_allv(g, 0, NULL, &one, &y, &one, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert(strstr(err.message, "no send buffer"), "%s", err.message);
    cr_assert_neq(tp_threads_all_to_allv(g, 0, &x, NULL, &y, &one, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_neq(tp_threads_all_to_allv(g, 0, &x, &one, &y, &one, LOOM_DTYPE_Q4_0, NULL, &err), LOOM_OK);
    cr_assert_neq(tp_threads_all_to_allv(g, 1, &x, &one, &y, &one, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_eq(tp_threads_all_to_allv(g, 0, NULL, &zero, NULL, &zero, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_eq(tp_threads_all_to_allv(g, 0, &x, &one, &y, &one, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_eq(y, 1.0f);
    tp_threads_destroy(g);
}

/* ------------------------------------------------ misuse, abort, reset */

static void *mismatch_rank(void *arg) {
    rk *r = arg;
    float buf[8] = {0};
    r->st = tp_threads_all_reduce(r->g, r->rank, buf, r->rank == 1 ? 7 : 8, LOOM_DTYPE_F32, NULL,
                                  &r->err);
    return NULL;
}

Test(tp_comm, mismatched_calls_fail_on_every_rank) {
    tp_threads *g = tp_threads_create(fake_host(), 3);
    rk ranks[3];
    run_ranks(3, g, mismatch_rank, ranks, NULL);
    for (int r = 0; r < 3; r++) {
        cr_assert_neq(ranks[r].st, LOOM_OK, "rank %d did not notice", r);
        cr_assert(strstr(ranks[r].err.message, "ranks disagree"), "%s", ranks[r].err.message);
    }
    tp_threads_destroy(g);
}

static void *waiting_rank(void *arg) {
    rk *r = arg;
    float buf[4] = {1, 2, 3, 4};
    r->st = tp_threads_all_reduce(r->g, r->rank, buf, 4, LOOM_DTYPE_F32, NULL, &r->err);
    return NULL;
}

static void *summing_rank(void *arg) {
    rk *r = arg;
    float buf[4] = {1, 2, 3, 4};
    r->st = tp_threads_all_reduce(r->g, r->rank, buf, 4, LOOM_DTYPE_F32, NULL, &r->err);
    if (r->st == LOOM_OK && buf[3] != 4.0f * r->n) r->st = LOOM_ERR_INTERNAL;
    return NULL;
}

/* Ranks 0 and 1 of 3 wait for rank 2, which never comes: the abort must
 * release them with an error; after a reset all three sum again. */
Test(tp_comm, abort_releases_waiting_ranks_and_reset_recovers) {
    tp_threads *g = tp_threads_create(fake_host(), 3);
    rk ranks[3];
    abort_two_waiters(g, waiting_rank);
    /* arriving after the abort fails at once, too */
    float x = 1;
    loom_error err = {0};
    cr_assert_neq(tp_threads_all_reduce(g, 2, &x, 1, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    tp_threads_reset(g);
    run_ranks(3, g, summing_rank, ranks, NULL);
    for (int i = 0; i < 3; i++) cr_assert_eq(ranks[i].st, LOOM_OK, "rank %d after reset", i);
    tp_threads_destroy(g);
}

Test(tp_comm, device_streams_and_bad_arguments_are_refused) {
    tp_threads *g = tp_threads_create(fake_host(), 1);
    float x = 1;
    loom_error err = {0};
    cr_assert_neq(tp_threads_all_reduce(g, 0, &x, 1, LOOM_DTYPE_F32, (void *)0x10, &err), LOOM_OK);
    cr_assert(strstr(err.message, "comm: nccl"), "%s", err.message);
    cr_assert_neq(tp_threads_all_reduce(g, 1, &x, 1, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_neq(tp_threads_all_reduce(g, 0, &x, 1, LOOM_DTYPE_Q4_0, NULL, &err), LOOM_OK);
    cr_assert_neq(tp_threads_all_reduce(g, 0, NULL, 4, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_eq(tp_threads_all_reduce(g, 0, &x, 1, LOOM_DTYPE_F32, NULL, &err), LOOM_OK);
    cr_assert_eq(x, 1.0f);
    tp_threads_destroy(g);
}

/* ----------------------------------------------------------- rendezvous */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct peer {
    char addr[64];
    int32_t node_rank, nodes;
    uint8_t blob[128];
    loom_status st;
    loom_error err;
} peer;

static void *fetch_thread(void *arg) {
    peer *p = arg;
    p->st = tp_rdv_fetch(fake_host(), p->addr, p->node_rank, p->nodes, p->blob, sizeof p->blob, 10,
                         &p->err);
    return NULL;
}

Test(tp_comm, rendezvous_hands_the_id_to_every_node) {
    uint8_t id[128];
    for (int i = 0; i < 128; i++) id[i] = (uint8_t)(i * 37 + 11);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    peer p[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&p[i], 0, sizeof p[i]);
        snprintf(p[i].addr, sizeof p[i].addr, "%s", addr);
        p[i].node_rank = 2 - i; /* order does not matter */
        p[i].nodes = 3;
        pthread_create(&th[i], NULL, fetch_thread, &p[i]);
    }
    usleep(100000); /* peers retry until node 0 listens */
    loom_error err = {0};
    loom_status st = tp_rdv_serve(fake_host(), addr, id, sizeof id, 2, 10, &err);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    cr_assert_eq(st, LOOM_OK, "serve: %s", err.message);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(p[i].st, LOOM_OK, "node %d: %s", p[i].node_rank, p[i].err.message);
        cr_assert(!memcmp(p[i].blob, id, sizeof id), "node %d got another blob", p[i].node_rank);
    }
}

typedef struct server {
    char addr[64];
    int32_t clients, timeout;
    loom_status st;
    loom_error err;
} server;

static void *serve_thread(void *arg) {
    server *s = arg;
    uint8_t id[128] = {1, 2, 3};
    s->st = tp_rdv_serve(fake_host(), s->addr, id, sizeof id, s->clients, s->timeout, &s->err);
    return NULL;
}

Test(tp_comm, rendezvous_refuses_duplicates_and_wrong_node_counts) {
    server s = {.clients = 2, .timeout = 3};
    snprintf(s.addr, sizeof s.addr, "localhost:%d", free_port());
    pthread_t th;
    pthread_create(&th, NULL, serve_thread, &s);
    peer a = {.node_rank = 1, .nodes = 3}, b = {.node_rank = 1, .nodes = 3},
         c = {.node_rank = 2, .nodes = 4};
    snprintf(a.addr, sizeof a.addr, "%s", s.addr);
    snprintf(b.addr, sizeof b.addr, "%s", s.addr);
    snprintf(c.addr, sizeof c.addr, "%s", s.addr);
    fetch_thread(&a);
    cr_assert_eq(a.st, LOOM_OK, "%s", a.err.message);
    fetch_thread(&b);
    cr_assert_neq(b.st, LOOM_OK);
    cr_assert(strstr(b.err.message, "already joined"), "%s", b.err.message);
    fetch_thread(&c);
    cr_assert_neq(c.st, LOOM_OK);
    cr_assert(strstr(c.err.message, "executor.nodes differs"), "%s", c.err.message);
    pthread_join(th, NULL);
    cr_assert_neq(s.st, LOOM_OK, "node 0 should time out with one of two peers");
    cr_assert(strstr(s.err.message, "1 of 2 node(s) joined"), "%s", s.err.message);
}

Test(tp_comm, rendezvous_addresses) {
    char host[64];
    int port = 0;
    cr_assert(tp_rdv_parse("node0:29500", host, sizeof host, &port));
    cr_assert_str_eq(host, "node0");
    cr_assert_eq(port, 29500);
    cr_assert(tp_rdv_parse("[fe80::1]:1", host, sizeof host, &port));
    cr_assert_str_eq(host, "fe80::1");
    cr_assert_eq(port, 1);
    static const char *const bad[] = {"", "node0", ":29500", "node0:", "node0:0", "node0:65536",
                                      "node0:12x", "fe80::1:80", "[fe80::1]80", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert(!tp_rdv_parse(bad[i], host, sizeof host, &port), "'%s' accepted", bad[i]);
    loom_error err = {0};
    uint8_t blob[4];
    cr_assert_neq(tp_rdv_fetch(fake_host(), "nowhere", 1, 2, blob, 4, 1, &err), LOOM_OK);
    cr_assert(strstr(err.message, "not host:port"), "%s", err.message);
}
