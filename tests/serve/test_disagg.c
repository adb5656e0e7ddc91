/*
 * tests/serve/test_disagg.c — disaggregated serving, two real processes:
 * `loom serve --role prefill` and `--role decode` over the shm and the tcp
 * kv_connector, each against a colocated server on the same model
 * (SmolLM2 through LOOM_TEST_MODEL; skipped when unset).
 *   - identical greedy text and logprobs (and a seeded sample) vs colocated;
 *   - KV blocks freed on both sides afterwards (/metrics kv_blocks_used);
 *   - a client leaving mid-transfer, the prefill server killed mid-request:
 *     the client gets an error, both servers keep serving; the decode
 *     server killed mid-request: the prefill server frees the blocks and
 *     serves the next one;
 *   - a decode server with the wrong key is refused; hostile bytes on the
 *     prefill port leave it serving.
 */
#include <math.h>
#include <sys/stat.h>

#include "serve_harness.h"

#define CFG_DEFAULT "configs/default.yaml"
#define CFG_SHM "configs/disagg/cpu-shm.yaml"
#define CFG_TCP "configs/disagg/cpu-tcp.yaml"

/* One thread per server: three share the test machine's cores. A loaded
 * machine gets a generous connector timeout (it also bounds the prefill). */
#define ONE_THREAD "--set", "engine.threads=1", "--set", "kv_connector.timeout_ms=30000"

static const char *chat_body =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Name three rivers of Europe and say where each one "
    "flows.\"}],\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}";
static const char *completion_body =
    "{\"prompt\":\"The history of the printing press begins\",\"max_tokens\":8,\"temperature\":0,"
    "\"logprobs\":2}";
static const char *seeded_body =
    "{\"prompt\":\"Once upon a time, in a quiet village\",\"max_tokens\":8,\"temperature\":0.9,\"seed\":7}";

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void write_key(const char *path, const char *key) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(key, f);
    fclose(f);
    chmod(path, 0600);
}

static reply post(int port, const char *path, const char *body) {
    return http(port, "POST", path, body, NULL);
}

/* The answer's text and its per-token logprobs (NULL json when absent). */
static const char *answer_text(const reply *r, bool chat) {
    cr_assert_eq(r->status, 200, "status %d: %s", r->status, r->body);
    return str(r->json, chat ? "choices.0.message.content" : "choices.0.text");
}

/* Same text, same tokens, logprobs within float tolerance: the decode side
 * recomputes the prompt's last token alone, the colocated server in one
 * prefill batch, so the last bits of the float sums may differ. */
static void expect_same(const char *body, const char *path, bool chat, int disagg_port, int colo_port) {
    reply a = post(disagg_port, path, body), b = post(colo_port, path, body);
    cr_assert_str_eq(answer_text(&a, chat), answer_text(&b, chat), "disaggregated vs colocated answers differ");
    const cJSON *la = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a.json, "choices"), 0), "logprobs");
    const cJSON *lb = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b.json, "choices"), 0), "logprobs");
    if (la && !cJSON_IsNull(la)) {
        const cJSON *xa = chat ? cJSON_GetObjectItem(la, "content") : cJSON_GetObjectItem(la, "token_logprobs");
        const cJSON *xb = chat ? cJSON_GetObjectItem(lb, "content") : cJSON_GetObjectItem(lb, "token_logprobs");
        int n = cJSON_GetArraySize(xa);
        cr_assert_eq(n, cJSON_GetArraySize(xb));
        cr_assert_gt(n, 0);
        for (int i = 0; i < n; i++) {
            const cJSON *ea = cJSON_GetArrayItem(xa, i), *eb = cJSON_GetArrayItem(xb, i);
            double va = chat ? num(ea, "logprob") : ea->valuedouble, vb = chat ? num(eb, "logprob") : eb->valuedouble;
            cr_assert(fabs(va - vb) < 2e-3, "token %d: logprob %g disaggregated, %g colocated", i, va, vb);
        }
    }
    reply_free(&a);
    reply_free(&b);
}

/* Both sides idle and holding no KV block, no request waiting for its KV
 * and no hand-over in flight (a parked request holds no block, so the
 * server's idle gauges alone would pass too early). */
static void expect_freed(int prefill_port, int decode_port) {
    bool quiet = false;
    for (int i = 0; i < 300 && !quiet; i++) {
        quiet = metric(decode_port, "loom_kv_waiting") == 0 && metric(decode_port, "loom_kv_transfers_in_flight") == 0 &&
                metric(prefill_port, "loom_kv_transfers_in_flight") == 0;
        if (!quiet) usleep(100000);
    }
    cr_assert(quiet, "a hand-over is still running after 30 s");
    cr_assert(wait_idle(prefill_port, 20), "the prefill server still holds KV blocks");
    cr_assert(wait_idle(decode_port, 20), "the decode server still holds KV blocks");
}

/* A prompt of about `words` words (a long prefill), as a completions body. */
static char *long_body(int words) {
    size_t cap = (size_t)words * 8 + 128;
    char *b = malloc(cap);
    size_t n = (size_t)snprintf(b, cap, "{\"max_tokens\":4,\"temperature\":0,\"prompt\":\"");
    for (int i = 0; i < words; i++) n += (size_t)snprintf(b + n, cap - n, "word%d ", i % 97);
    snprintf(b + n, cap - n, "\"}");
    return b;
}

/* Send a long request and leave before its answer. */
static void leave_mid_request(int port) {
    char *body = long_body(60);
    int fd = dial(port);
    send_request(fd, "POST", "/v1/completions", body, NULL);
    usleep(150000);
    close(fd);
    free(body);
}

Test(disagg, shm_matches_colocated_and_frees_blocks, .timeout = 240) {
    need_model();
    char sock[64], path_set[96];
    snprintf(sock, sizeof sock, "/tmp/loom-kv-test-%d.sock", (int)getpid());
    snprintf(path_set, sizeof path_set, "kv_connector.path=%s", sock);
    server c = start(CFG_DEFAULT, (const char *[]){"--set", "engine.threads=1", NULL});
    server p = start(CFG_SHM, (const char *[]){"--role", "prefill", "--set", path_set, ONE_THREAD, NULL});
    server d = start(CFG_SHM, (const char *[]){"--role", "decode", "--set", path_set, ONE_THREAD, NULL});

    expect_same(chat_body, "/v1/chat/completions", true, d.port, c.port);
    expect_same(completion_body, "/v1/completions", false, d.port, c.port);
    expect_same(seeded_body, "/v1/completions", false, d.port, c.port);
    expect_freed(p.port, d.port);
    cr_assert_geq(metric(d.port, "loom_kv_transfers_total"), 3);
    cr_assert_gt(metric(d.port, "loom_kv_imported_blocks_total"), 0);
    cr_assert_eq(metric(p.port, "loom_kv_exported_blocks_total"), metric(d.port, "loom_kv_imported_blocks_total"));
    /* cpu backends: every byte goes through host memory, on both sides */
    cr_assert_gt(metric(d.port, "loom_kv_transfer_bytes_total"), 0);
    cr_assert_eq(metric(d.port, "loom_kv_host_staged_bytes_total"), metric(d.port, "loom_kv_transfer_bytes_total"));
    cr_assert_eq(metric(p.port, "loom_kv_host_staged_bytes_total"), metric(p.port, "loom_kv_transfer_bytes_total"));

    /* a client that leaves while its prompt's KV is on the way */
    leave_mid_request(d.port);
    expect_freed(p.port, d.port);
    expect_same(completion_body, "/v1/completions", false, d.port, c.port);

    /* the decode server killed while its prompt is prefilled: the prefill
     * server frees the blocks and serves the next decode server */
    char *body = long_body(60);
    int fd = dial(d.port);
    send_request(fd, "POST", "/v1/completions", body, NULL);
    free(body);
    usleep(100000);
    kill(d.pid, SIGKILL);
    waitpid(d.pid, NULL, 0);
    unlink(d.err_path);
    close(fd);
    d = start(CFG_SHM, (const char *[]){"--role", "decode", "--set", path_set, ONE_THREAD, NULL});
    expect_same(completion_body, "/v1/completions", false, d.port, c.port);
    expect_freed(p.port, d.port);

    free(stop(&d, 30));
    free(stop(&p, 30));
    free(stop(&c, 30));
    struct stat sb;
    cr_assert_neq(stat(sock, &sb), 0, "the prefill server left its socket file %s", sock);
}

Test(disagg, tcp_key_hostile_peers_and_a_killed_prefill, .timeout = 240) {
    need_model();
    char key[64], bad[64], key_set[96], bad_set[96], port_set[64];
    snprintf(key, sizeof key, "/tmp/loom-kv-test-%d.key", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/loom-kv-test-%d.bad", (int)getpid());
    write_key(key, "a shared secret of enough bytes\n");
    write_key(bad, "another secret, not the same one\n");
    snprintf(key_set, sizeof key_set, "kv_connector.key_file=%s", key);
    snprintf(bad_set, sizeof bad_set, "kv_connector.key_file=%s", bad);
    int kv_port = free_port();
    snprintf(port_set, sizeof port_set, "kv_connector.port=%d", kv_port);
    const char *pargs[] = {"--role", "prefill", "--set", key_set, "--set", port_set, ONE_THREAD, NULL};
    server c = start(CFG_DEFAULT, (const char *[]){"--set", "engine.threads=1", NULL});
    server p = start(CFG_TCP, pargs);
    server d = start(CFG_TCP, (const char *[]){"--role", "decode", "--set", key_set, "--set", port_set, ONE_THREAD,
                                               NULL});
    expect_same(chat_body, "/v1/chat/completions", true, d.port, c.port);

    /* a decode server holding another key: refused, the client told why */
    server w = start(CFG_TCP, (const char *[]){"--role", "decode", "--set", bad_set, "--set", port_set, ONE_THREAD,
                                               NULL});
    expect_error(post(w.port, "/v1/completions", completion_body), 500, "remote prefill failed");
    /* the prefill server counts the refused handshake on its connection's
     * thread, which may finish after the decode side has already answered */
    double auth_failures = 0;
    for (int i = 0; i < 50 && auth_failures < 1; i++) {
        auth_failures = metric(p.port, "loom_kv_auth_failures_total");
        if (auth_failures < 1) usleep(100000);
    }
    cr_assert_geq(auth_failures, 1);
    free(stop(&w, 30));

    /* hostile bytes on the KV port: garbage, then a frame announcing a 2 GiB head */
    for (int k = 0; k < 2; k++) {
        int fd = dial(kv_port);
        unsigned char junk[64];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + k);
        if (k == 1) memcpy(junk, "LMKV\x02\x00\xff\x7f\x00\x00\x00\x80", 12);
        write_all(fd, (const char *)junk, sizeof junk);
        char sink[256];
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        while (poll(&pf, 1, 3000) > 0 && read(fd, sink, sizeof sink) > 0) {}
        close(fd);
    }
    expect_same(completion_body, "/v1/completions", false, d.port, c.port);
    expect_freed(p.port, d.port);

    /* a client leaving mid-transfer */
    leave_mid_request(d.port);
    expect_freed(p.port, d.port);

    /* the prefill server killed with a request in its hands: stopped before the request is sent, so a fast
     * machine cannot finish the prefill first (it did, 100 ms after sending, on CI) */
    char *body = long_body(60);
    kill(p.pid, SIGSTOP);
    int fd = dial(d.port);
    send_request(fd, "POST", "/v1/completions", body, NULL);
    usleep(500000);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    unlink(p.err_path);
    reply r = read_reply_within(fd, 30000, NULL, 0);
    close(fd);
    free(body);
    expect_error(r, 500, "remote prefill failed");
    reply h = http(d.port, "GET", "/health", NULL, NULL);
    cr_assert_eq(h.status, 200, "the decode server stopped serving after its prefill peer died");
    reply_free(&h);
    cr_assert(wait_idle(d.port, 20));

    /* a new prefill server on the same port: disaggregated serving resumes */
    p = start(CFG_TCP, pargs);
    expect_same(completion_body, "/v1/completions", false, d.port, c.port);
    expect_freed(p.port, d.port);

    free(stop(&d, 30));
    free(stop(&p, 30));
    free(stop(&c, 30));
    unlink(key);
    unlink(bad);
}
