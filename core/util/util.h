/*
 * core/util/util.h — small helpers shared by the core: error filling,
 * logging, checked allocation, string helpers. Internal: never installed.
 */
#ifndef LOOM_CORE_UTIL_H
#define LOOM_CORE_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"

#if defined(__GNUC__)
#define LOOM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LOOM_PRINTF(a, b)
#endif

/* Fill `err` (may be NULL) and return `code`. */
loom_status loom_error_set(loom_error *err, loom_status code, const char *fmt, ...) LOOM_PRINTF(3, 4);
loom_status loom_error_vset(loom_error *err, loom_status code, const char *fmt, va_list ap);
/* Prefix an existing message: "<prefix>: <old message>". */
void loom_error_prefix(loom_error *err, const char *fmt, ...) LOOM_PRINTF(2, 3);
/* "ok", "invalid argument", ... */
const char *loom_status_name(loom_status s);

/* Logging to stderr at the most verbose level any live engine holds (its
 * pipeline's engine.log_level), else at loom_log_set_level()'s (default
 * warn). */
void loom_log_set_level(loom_log_level level);
/* An engine's level: +1 when it is created, -1 when it is destroyed. */
void loom_log_hold(loom_log_level level, int delta);
loom_log_level loom_log_get_level(void);
void loom_log(loom_log_level level, const char *who, const char *fmt, ...) LOOM_PRINTF(3, 4);
void loom_vlog(loom_log_level level, const char *who, const char *fmt, va_list ap);

/* strdup that returns NULL on NULL. */
char *loom_strdup(const char *s);
/* The n bytes at s (not necessarily NUL-terminated: a GGUF string, part of
 * a path) as a new NUL-terminated string; NULL when out of memory. */
char *loom_strndup(const char *s, size_t n);
/* Monotonic clock in seconds. */
double loom_now(void);

#endif
