/*
 * tests/disagg/test_wire.c — the KV connectors' frame parser and handshake
 * and the core's disaggregation messages against random and mutated input:
 * a hostile peer gets an error, never a crash, an over-limit allocation or
 * a parse that accepts what the rules refuse. Seeded, so a failure
 * reproduces; run under the sanitizer build to catch any stray read.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "disagg/wire.h"
#include "kvc.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}
/* Flip, overwrite or zero a few bytes; lengths and magic words are the
 * interesting targets, so sometimes write an extreme 32-bit value. */
static void mutate(uint8_t *p, size_t n) {
    int k = 1 + (int)(rnd() % 4);
    for (int i = 0; i < k && n; i++) {
        size_t at = rnd() % n;
        switch (rnd() % 4) {
        case 0: p[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: p[at] = (uint8_t)rnd(); break;
        case 2: p[at] = 0; break;
        default:
            if (at + 4 <= n) {
                uint32_t v = rnd() % 2 ? 0xFFFFFFFFu : 0x80000000u;
                memcpy(p + at, &v, 4);
            }
        }
    }
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* ----------------------------------------------------------- frames */

Test(kvc_frame, random_and_mutated_headers_respect_the_limits) {
    const uint32_t max_head = 4096;
    const uint64_t max_payload = 1u << 20;
    uint8_t valid[KVC_HEADER_BYTES];
    kvc_frame_write(valid, &(kvc_frame){.type = 2, .head_len = 28, .payload_len = 4096});
    int accepted = 0;
    for (int i = 0; i < 200000; i++) {
        uint8_t h[KVC_HEADER_BYTES];
        if (i % 2) fill(h, sizeof h);
        else memcpy(h, valid, sizeof h), mutate(h, sizeof h);
        kvc_frame f = {0};
        char why[160];
        if (!kvc_frame_parse(h, max_head, max_payload, &f, why, sizeof why)) {
            cr_assert(why[0], "a refusal without a reason");
            continue;
        }
        accepted++;
        cr_assert_eq(le32(h), KVC_MAGIC);
        cr_assert_leq(f.head_len, max_head);
        cr_assert_leq(f.payload_len, max_payload);
        cr_assert_neq(f.type, 0);
        cr_assert_eq(f.flags & ~KVC_FLAG_SHM, 0);
        cr_assert(!(f.flags & KVC_FLAG_SHM) || f.head_len >= KVC_SHM_NAME);
    }
    cr_assert_gt(accepted, 100, "the mutations never produced a valid header: the test tests nothing");
}

/* A stream of hostile bytes into a real connection: every receive ends in
 * an error or a message within the limits, and no buffer grows past them. */
Test(kvc_frame, hostile_streams_end_in_errors_within_limits) {
    kvc_config cfg = {.timeout_ms = 200, .max_head_bytes = 4096, .max_payload_bytes = 8192};
    for (int round = 0; round < 400; round++) {
        int sv[2];
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        uint8_t buf[12000];
        size_t n = rnd() % sizeof buf;
        fill(buf, n);
        if (n >= KVC_HEADER_BYTES && rnd() % 2) { /* a plausible header, then garbage or a short body */
            kvc_frame_write(buf, &(kvc_frame){.type = 1 + rnd() % 3, .head_len = rnd() % 5000,
                                              .payload_len = rnd() % 10000});
            mutate(buf, KVC_HEADER_BYTES);
        }
        cr_assert_eq(write(sv[1], buf, n), (ssize_t)n);
        close(sv[1]);
        kvc_conn *c = kvc_conn_new(sv[0], &cfg, "a fuzzer");
        cr_assert_not_null(c);
        for (int k = 0; k < 8; k++) {
            loom_kv_msg m;
            loom_error err = {0};
            if (kvc_recv_inline(c, &m, "test", &err) != LOOM_OK) {
                cr_assert(err.message[0]);
                break;
            }
            cr_assert_leq(m.head_len, 4096);
            cr_assert_leq(m.payload_len, 8192);
        }
        cr_assert_leq(c->payload_cap, 8192);
        kvc_conn_free(c);
    }
}

/* ------------------------------------------------------- handshake */

typedef struct side {
    int fd;
    const char *key;
    bool server;
    loom_status st;
} side;

static void *run_side(void *arg) {
    side *s = arg;
    kvc_config cfg = {.timeout_ms = 2000, .max_head_bytes = 4096, .max_payload_bytes = 4096};
    kvc_conn *c = kvc_conn_new(s->fd, &cfg, s->server ? "client" : "server");
    loom_error err = {0};
    size_t l = strlen(s->key);
    s->st = s->server ? kvc_auth_server(c, (const uint8_t *)s->key, l, "test", &err)
                      : kvc_auth_client(c, (const uint8_t *)s->key, l, "test", &err);
    kvc_conn_free(c);
    return NULL;
}

static void handshake(const char *server_key, const char *client_key, loom_status *ss, loom_status *cs) {
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    side a = {.fd = sv[0], .key = server_key, .server = true}, b = {.fd = sv[1], .key = client_key};
    pthread_t t;
    pthread_create(&t, NULL, run_side, &a);
    run_side(&b);
    pthread_join(t, NULL);
    *ss = a.st, *cs = b.st;
}

Test(kvc_auth, same_key_passes_other_key_fails_on_both_sides) {
    loom_status s, c;
    handshake("sixteen byte key, or more", "sixteen byte key, or more", &s, &c);
    cr_assert_eq(s, LOOM_OK);
    cr_assert_eq(c, LOOM_OK);
    handshake("sixteen byte key, or more", "sixteen byte key, or less", &s, &c);
    cr_assert_eq(s, LOOM_ERR_INVALID);
    cr_assert_neq(c, LOOM_OK);
}

/* ------------------------------------------------------- core messages */

static const loom_kv_info info = {.struct_size = sizeof info, .block_size = 16, .block_bytes = 3 * 1024,
                                  .kv_dtype = LOOM_DTYPE_F32, .num_layers = 30, .vocab = 1000, .max_model_len = 4096};

Test(disagg_wire, prefill_round_trip_and_mutations) {
    int32_t toks[300];
    uint8_t buf[DISAGG_PREFILL_FIXED + 4 * 300];
    int accepted_mutants = 0;
    for (int i = 0; i < 20000; i++) {
        int32_t n = 2 + (int32_t)(rnd() % 299);
        for (int32_t k = 0; k < n; k++) toks[k] = (int32_t)(rnd() % 1000);
        size_t len = disagg_prefill_encode(buf, &info, toks, n);
        cr_assert_eq(len, DISAGG_PREFILL_FIXED + 4 * (size_t)n);
        int32_t *got, m;
        char why[256];
        bool mutant = i % 2;
        if (mutant) {
            mutate(buf, len);
            if (rnd() % 4 == 0) len = rnd() % (len + 1);
        }
        loom_status st = disagg_prefill_parse(buf, len, &info, &got, &m, why, sizeof why);
        if (!mutant) {
            cr_assert_eq(st, LOOM_OK, "%s", why);
            cr_assert_eq(m, n);
            cr_assert_arr_eq(got, toks, (size_t)n * sizeof *toks);
        }
        if (st == LOOM_OK) {
            accepted_mutants += mutant;
            cr_assert_geq(m, 2);
            cr_assert_eq(len, DISAGG_PREFILL_FIXED + 4 * (size_t)m);
            for (int32_t k = 0; k < m; k++) cr_assert(got[k] >= 0 && got[k] < info.vocab);
            free(got);
        } else {
            cr_assert_null(got);
            cr_assert(why[0]);
        }
    }
    cr_assert_gt(accepted_mutants, 0, "no mutant parsed: mutations too destructive to test acceptance");
}

/* Peers whose block images have the same size but another element type
 * (f16 vs bf16: 2 bytes each) are refused by name, not read as each other. */
Test(disagg_wire, same_size_other_kv_type_refused) {
    loom_kv_info f16 = info, bf16 = info;
    f16.kv_dtype = LOOM_DTYPE_F16, bf16.kv_dtype = LOOM_DTYPE_BF16;
    int32_t toks[4] = {1, 2, 3, 4};
    uint8_t buf[DISAGG_PREFILL_FIXED + 4 * 4];
    size_t len = disagg_prefill_encode(buf, &f16, toks, 4);
    int32_t *got = NULL, m = 0;
    char why[256] = "";
    cr_assert_neq(disagg_prefill_parse(buf, len, &bf16, &got, &m, why, sizeof why), LOOM_OK);
    cr_assert_null(got);
    cr_assert(strstr(why, "dtype") || strstr(why, "type"), "the refusal should name the type: %s", why);
    cr_assert_eq(disagg_prefill_parse(buf, len, &f16, &got, &m, why, sizeof why), LOOM_OK, "%s", why);
    free(got);
}

Test(disagg_wire, kv_head_checked_against_the_request) {
    uint8_t h[DISAGG_KV_HEAD];
    char why[256];
    loom_kv_handoff out;
    for (int32_t n = 2; n < 200; n++) {
        int32_t nt = n - 1, nb = (nt + 15) / 16;
        disagg_kv_encode(h, nt, 16, nb, info.block_bytes);
        cr_assert_eq(disagg_kv_parse(h, sizeof h, (uint64_t)nb * info.block_bytes, n, &info, &out, why, sizeof why),
                     LOOM_OK, "%s", why);
        cr_assert_eq(out.num_blocks, nb);
        /* the payload one byte off, the wrong prompt length, another block count */
        cr_assert_neq(disagg_kv_parse(h, sizeof h, (uint64_t)nb * info.block_bytes + 1, n, &info, &out, why, sizeof why),
                      LOOM_OK);
        cr_assert_neq(disagg_kv_parse(h, sizeof h, (uint64_t)nb * info.block_bytes, n + 1, &info, &out, why, sizeof why),
                      LOOM_OK);
    }
    for (int i = 0; i < 100000; i++) {
        uint8_t r[DISAGG_KV_HEAD + 8];
        size_t len = rnd() % sizeof r;
        if (i % 2) fill(r, len);
        else disagg_kv_encode(r, 40, 16, 3, info.block_bytes), mutate(r, DISAGG_KV_HEAD), len = DISAGG_KV_HEAD;
        uint64_t pl = rnd() % 2 ? 3 * info.block_bytes : rnd();
        if (disagg_kv_parse(r, len, pl, 41, &info, &out, why, sizeof why) == LOOM_OK) {
            cr_assert_eq(out.num_tokens, 40);
            cr_assert_eq(pl, (uint64_t)out.num_blocks * out.block_bytes);
        }
    }
}

Test(disagg_wire, error_messages_are_printable) {
    uint8_t h[12 + DISAGG_ERROR_MAX + 16];
    char msg[DISAGG_ERROR_MAX + 1];
    size_t len = disagg_error_encode(h, LOOM_ERR_IO, "peer said \x01 no\n");
    cr_assert(disagg_error_parse(h, len, msg, sizeof msg));
    cr_assert_str_eq(msg, "peer said ? no?");
    for (int i = 0; i < 50000; i++) {
        size_t n = rnd() % sizeof h;
        fill(h, n);
        if (i % 2 && n >= 4) memcpy(h, "LLKE", 4);
        if (!disagg_error_parse(h, n, msg, sizeof msg)) continue;
        for (const char *p = msg; *p; p++) cr_assert(*p >= 0x20 && *p < 0x7F);
    }
}
