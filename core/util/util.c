/*
 * core/util/util.c — error filling, stderr logging, small helpers.
 */
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

loom_status loom_error_vset(loom_error *err, loom_status code, const char *fmt, va_list ap) {
    if (err) {
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    return code;
}

loom_status loom_error_set(loom_error *err, loom_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    loom_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

void loom_error_prefix(loom_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[LOOM_ERROR_MSG_MAX], old[LOOM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->message, sizeof old);
    /* Prefix, then as much of the old message as still fits. */
    size_t n = strlen(prefix);
    if (n > sizeof err->message - 3) n = sizeof err->message - 3;
    memcpy(err->message, prefix, n);
    memcpy(err->message + n, ": ", 2);
    size_t room = sizeof err->message - n - 3, m = strnlen(old, sizeof old);
    if (m > room) m = room;
    memcpy(err->message + n + 2, old, m);
    err->message[n + 2 + m] = 0;
}

const char *loom_status_name(loom_status s) {
    switch (s) {
    case LOOM_OK: return "ok";
    case LOOM_ERR_INVALID: return "invalid argument";
    case LOOM_ERR_NOMEM: return "out of memory";
    case LOOM_ERR_NOT_FOUND: return "not found";
    case LOOM_ERR_IO: return "I/O error";
    case LOOM_ERR_FORMAT: return "malformed input";
    case LOOM_ERR_UNSUPPORTED: return "unsupported";
    case LOOM_ERR_ABI: return "ABI mismatch";
    case LOOM_ERR_NO_SPACE: return "no space";
    case LOOM_ERR_DEVICE: return "device error";
    case LOOM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

/* The process logs at the most verbose level a live engine asked for
 * (engine.log_level), else at the base level (warn, or what
 * loom_log_set_level set): so a draft engine created inside another
 * cannot silence its host's info lines. */
static _Atomic int g_base = LOOM_LOG_WARN;
static _Atomic int g_holds[LOOM_LOG_ERROR + 1];

void loom_log_set_level(loom_log_level level) { g_base = (int)level; }

void loom_log_hold(loom_log_level level, int delta) {
    if ((int)level >= LOOM_LOG_DEBUG && (int)level <= LOOM_LOG_ERROR) g_holds[level] += delta;
}

loom_log_level loom_log_get_level(void) {
    for (int lv = LOOM_LOG_DEBUG; lv <= LOOM_LOG_ERROR; lv++)
        if (g_holds[lv] > 0) return (loom_log_level)lv;
    return (loom_log_level)g_base;
}

void loom_vlog(loom_log_level level, const char *who, const char *fmt, va_list ap) {
    if (level < loom_log_get_level()) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "loom[%s]%s%s: %s\n", names[level], who ? " " : "", who ? who : "", line);
}

void loom_log(loom_log_level level, const char *who, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    loom_vlog(level, who, fmt, ap);
    va_end(ap);
}

char *loom_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *loom_strndup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
