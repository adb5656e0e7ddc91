/*
 * tests/serve/serve_harness.h — driving the built `loom serve` binary from a
 * Criterion test: start it on a free port (--port 0; the URL it prints gives
 * the port), plain HTTP/1.0 requests, replies parsed as JSON, /metrics
 * values, SIGTERM with a clean exit. Shared by test_serve.c and
 * test_disagg.c; every helper fails the calling test on a broken server.
 */
#ifndef LOOM_TESTS_SERVE_HARNESS_H
#define LOOM_TESTS_SERVE_HARNESS_H

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct server {
    pid_t pid;
    int port;
    char err_path[64];
} server;

static inline void need_model(void) {
    const char *m = getenv("LOOM_TEST_MODEL");
    if (!m || !m[0]) cr_skip_test("LOOM_TEST_MODEL is unset (point it at SmolLM2-135M-Instruct.Q4_1.gguf)");
}

static inline char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

/* Start `loom serve CONFIG --port 0 ARGS...` (CONFIG relative to the source
 * tree) and wait for the line with its port (model load under sanitizers
 * can take a while). */
static inline server start(const char *config, const char *const *args) {
    const char *bin = getenv("LOOM_CLI"), *src = getenv("LOOM_SOURCE_DIR");
    cr_assert(bin && src, "LOOM_CLI / LOOM_SOURCE_DIR not set (run through meson test)");
    server s = {0};
    snprintf(s.err_path, sizeof s.err_path, "/tmp/loom-serve-test-XXXXXX");
    int efd = mkstemp(s.err_path);
    cr_assert_geq(efd, 0);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    s.pid = fork();
    cr_assert_neq(s.pid, -1);
    if (s.pid == 0) {
        /* a failed assertion ends the test before stop(): the server must
         * not outlive it (an orphan kept running after a failed CI run) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], 1);
        dup2(efd, 2);
        close(p[0]);
        if (chdir(src) != 0) _exit(127);
        char *argv[32] = {(char *)bin, "serve", (char *)config, "--port", "0"};
        int n = 5;
        for (int i = 0; args && args[i] && n < 31; i++) argv[n++] = (char *)args[i];
        argv[n] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    close(p[1]);
    close(efd);
    char line[256] = {0};
    size_t at = 0;
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    while (at < sizeof line - 1 && !strchr(line, '\n') && poll(&pf, 1, 300000) > 0) {
        ssize_t r = read(p[0], line + at, sizeof line - 1 - at);
        if (r <= 0) break;
        at += (size_t)r;
    }
    close(p[0]);
    char *colon = strrchr(line, ':');
    if (!strstr(line, "listening on http://127.0.0.1:") || !colon) {
        kill(s.pid, SIGKILL);
        waitpid(s.pid, NULL, 0);
        char *e = slurp(s.err_path);
        cr_assert_fail("loom serve did not start: stdout '%s', stderr:\n%s", line, e);
    }
    s.port = atoi(colon + 1);
    cr_assert_gt(s.port, 0);
    return s;
}

/* The server, sent SIGTERM, must exit 0 within `secs` seconds. Returns what
 * it wrote to stderr (malloc'd). */
static inline char *wait_exit(server *s, int secs) {
    int status = 0;
    for (int i = 0; i < secs * 10; i++) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            char *e = slurp(s->err_path);
            cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "loom serve ended with status %d:\n%s",
                      status, e);
            unlink(s->err_path);
            return e;
        }
        usleep(100000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    cr_assert_fail("loom serve did not stop within %d s of SIGTERM", secs);
    return NULL;
}

/* SIGTERM; the server must exit 0 within `secs` seconds. Returns what it
 * wrote to stderr (malloc'd). */
static inline char *stop(server *s, int secs) {
    cr_assert_eq(kill(s->pid, SIGTERM), 0);
    return wait_exit(s, secs);
}

static inline int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "cannot connect to port %d", port);
    return fd;
}

static inline void send_request(int fd, const char *method, const char *path, const char *body, const char *headers) {
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n%sContent-Length: "
                     "%zu\r\n\r\n",
                     method, path, headers ? headers : "", body ? strlen(body) : 0);
    cr_assert_eq(write(fd, head, (size_t)n), n);
    if (body) {
        size_t len = strlen(body), off = 0;
        while (off < len) {
            ssize_t w = write(fd, body + off, len - off);
            cr_assert_gt(w, 0);
            off += (size_t)w;
        }
    }
}

typedef struct reply {
    int status;
    char *body;   /* after the headers */
    cJSON *json;  /* body parsed, when it is JSON */
} reply;

static inline reply http(int port, const char *method, const char *path, const char *body, const char *headers) {
    int fd = dial(port);
    send_request(fd, method, path, body, headers);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (cap - n < 1024) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    reply rp = {0};
    cr_assert(sscanf(buf, "HTTP/1.%*d %d", &rp.status) == 1, "no status line in '%s'", buf);
    char *b = strstr(buf, "\r\n\r\n");
    rp.body = strdup(b ? b + 4 : "");
    free(buf);
    rp.json = cJSON_Parse(rp.body);
    return rp;
}

static inline void reply_free(reply *r) {
    free(r->body);
    cJSON_Delete(r->json);
}

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline void write_all(int fd, const char *p, size_t n) {
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, p + off, n - off);
        cr_assert_gt(w, 0, "write to the server failed after %zu of %zu bytes", off, n);
        off += (size_t)w;
    }
}

/* The reply on fd, read until the server closes it or `ms` pass (a hostile
 * test must not hang on a server that does not answer): status 0 when
 * nothing came. *first_line gets the first status line seen (may be NULL). */
static inline reply read_reply_within(int fd, int ms, char *first_line, size_t fl) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    double until = now_ms() + ms;
    for (;;) {
        int left = (int)(until - now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        if (cap - n < 1024) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    if (first_line) snprintf(first_line, fl, "%.*s", (int)strcspn(buf, "\r\n"), buf);
    reply rp = {0};
    /* skip an interim 100 Continue to the final status */
    const char *at = buf;
    while (!strncmp(at, "HTTP/1.1 100", 12) && strstr(at, "\r\n\r\n")) at = strstr(at, "\r\n\r\n") + 4;
    if (sscanf(at, "HTTP/1.%*d %d", &rp.status) != 1) rp.status = 0;
    char *b = strstr(at, "\r\n\r\n");
    rp.body = strdup(b && rp.status ? b + 4 : at); /* no status line: all of it (the rest of a stream) */
    rp.json = cJSON_Parse(rp.body);
    free(buf);
    return rp;
}

/* The server's peak resident memory (VmHWM) in KiB. */
static inline long peak_rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &kib) == 1) break;
    fclose(f);
    return kib;
}

static inline const cJSON *get(const cJSON *o, const char *path) {
    /* "a.b.0.c": object keys and array indices */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = o;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, atoi(k)) : cJSON_GetObjectItemCaseSensitive(v, k);
    cr_assert_not_null(v, "no '%s' in %s", path, cJSON_PrintUnformatted(o));
    return v;
}

static inline double num(const cJSON *o, const char *path) {
    const cJSON *v = get(o, path);
    cr_assert(cJSON_IsNumber(v), "'%s' is not a number", path);
    return v->valuedouble;
}

static inline const char *str(const cJSON *o, const char *path) {
    const cJSON *v = get(o, path);
    cr_assert(cJSON_IsString(v), "'%s' is not text", path);
    return v->valuestring;
}

/* An error reply: status, and the message contains `needle`. */
static inline void expect_error(reply r, int status, const char *needle) {
    cr_assert_eq(r.status, status, "status %d (expected %d): %s", r.status, status, r.body);
    cr_assert_not_null(r.json, "error body is not JSON: %s", r.body);
    cr_assert(strstr(str(r.json, "error.message"), needle), "'%s' lacks '%s'", str(r.json, "error.message"), needle);
    cr_assert_eq(num(r.json, "error.code"), status);
    reply_free(&r);
}

/* Server-sent events: each "data: {...}" parsed into out[] (up to max);
 * returns how many, and whether "data: [DONE]" ended the stream. */
static inline int sse_events(const char *body, cJSON **out, int max, bool *done) {
    int n = 0;
    *done = false;
    for (const char *p = body; (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        cr_assert_not_null(e, "an event without its blank line: %s", p);
        if (!strncmp(p, "[DONE]", 6)) {
            *done = true;
            cr_assert(!strstr(e, "data: "), "events after [DONE]");
            break;
        }
        char *one = strndup(p, (size_t)(e - p));
        cr_assert_lt(n, max);
        out[n] = cJSON_Parse(one);
        cr_assert_not_null(out[n], "event is not JSON: %s", one);
        free(one);
        n++;
        p = e;
    }
    return n;
}

static inline double metric(int port, const char *name) {
    reply r = http(port, "GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    char key[96];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    cr_assert_not_null(p, "no %s in /metrics:\n%s", name, r.body);
    double v = atof(p + strlen(key));
    reply_free(&r);
    return v;
}

/* /metrics is a snapshot taken after each engine step, so right after an
 * answer it may predate the request: poll until the engine is idle (nothing
 * running or waiting, no KV block held) or `secs` pass. */
static inline bool wait_idle(int port, int secs) {
    for (int i = 0; i < secs * 10; i++) {
        if (metric(port, "loom_requests_running") == 0 && metric(port, "loom_requests_waiting") == 0 &&
            metric(port, "loom_kv_blocks_used") == 0)
            return true;
        usleep(100000);
    }
    return false;
}

#endif
