/*
 * loom/plugin.h — the plugin ABI: what every loom plugin exports and what the
 * host hands it.
 *
 * A plugin is a shared object exporting one symbol, LOOM_PLUGIN_ENTRY_SYMBOL,
 * that returns a static loom_plugin_desc: pure data (no allocation, no device
 * work), so `loom plugins` can list every plugin without initialising any.
 * The descriptor lists components; each component has a kind, a name, a
 * kind-specific ops table and a declared parameter table. The host parses the
 * YAML, checks every key against the parameter table, fills a config struct
 * of `config_size` bytes and passes it to the component's create().
 *
 * Versioning, three layers:
 *   - LOOM_ABI_MAJOR must match exactly; LOOM_ABI_MINOR of the plugin may not
 *     exceed the host's.
 *   - The build signature (pointer size, tensor layout revision) must match.
 *   - Every struct that crosses the boundary starts with `struct_size` and
 *     GROWS ONLY AT ITS END. Never reorder or remove a field; add new fields
 *     below a "since ABI 1.N" marker.
 *
 * Threads: each function carries one tag —
 *   [any]      any thread, concurrently;
 *   [engine]   only the engine's step-loop thread;
 *   [instance] any thread, but never concurrently on one instance.
 */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdbool.h>

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define LOOM_ABI_MAJOR 1
#define LOOM_ABI_MINOR 4

/* Bumped whenever loom_tensor or the batch layout changes meaning. */
#define LOOM_TENSOR_LAYOUT_REV 1

/* Build signature: pointer size in bytes, tensor layout revision. A plugin
 * built with another signature is "not binary compatible". */
#define LOOM_BUILD_SIGNATURE ((uint32_t)(sizeof(void *) << 16) | LOOM_TENSOR_LAYOUT_REV)

#define LOOM_PLUGIN_ENTRY_SYMBOL "loom_plugin_entry"

#if defined(__GNUC__)
#define LOOM_EXPORT __attribute__((visibility("default")))
#else
#define LOOM_EXPORT
#endif

/* ------------------------------------------------------------ status/error */

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_INVALID = 1,      /* bad argument or bad input data           */
    LOOM_ERR_NOMEM = 2,        /* host or device allocation failed         */
    LOOM_ERR_NOT_FOUND = 3,    /* file, plugin, tensor or key not found    */
    LOOM_ERR_IO = 4,           /* read/write/mmap failed                   */
    LOOM_ERR_FORMAT = 5,       /* malformed file (GGUF, YAML, JSON, ...)   */
    LOOM_ERR_UNSUPPORTED = 6,  /* valid request this component cannot do   */
    LOOM_ERR_ABI = 7,          /* version or layout mismatch               */
    LOOM_ERR_NO_SPACE = 8,     /* ordinary: no free KV blocks; not a fault */
    LOOM_ERR_DEVICE = 9,       /* CUDA/driver/NCCL failure                 */
    LOOM_ERR_INTERNAL = 10,    /* broken invariant: a bug                  */
} loom_status;

#define LOOM_ERROR_MSG_MAX 512

/* Caller-owned error. Functions that fail fill it (when non-NULL) with a
 * message that says what failed, where, and what to do next. */
typedef struct loom_error {
    loom_status code;                /* LOOM_OK when nothing failed            */
    char message[LOOM_ERROR_MSG_MAX]; /* NUL-terminated, human readable        */
} loom_error;

/* ------------------------------------------------------------- parameters */

/* Type of a declared parameter; decides the C type at `offset` in the
 * component's config struct. */
typedef enum loom_param_type {
    LOOM_PARAM_BOOL = 1,   /* bool                                           */
    LOOM_PARAM_INT = 2,    /* int64_t, checked against [min, max]            */
    LOOM_PARAM_FLOAT = 3,  /* double,  checked against [min, max]            */
    LOOM_PARAM_STRING = 4, /* char[LOOM_PARAM_STRING_MAX], NUL-terminated    */
    LOOM_PARAM_ENUM = 5,   /* int64_t index into `choices`                   */
} loom_param_type;

#define LOOM_PARAM_STRING_MAX 256

/* One entry of a component's declared configuration (cf. nginx directives).
 * Tables end with an entry whose key is NULL. */
typedef struct loom_param {
    const char *key;          /* YAML key, e.g. "max_num_seqs"                 */
    loom_param_type type;     /* see loom_param_type                           */
    size_t offset;            /* offsetof(config struct, field)                */
    const char *default_value;/* textual default, parsed like YAML; NULL = required */
    double min, max;          /* inclusive bounds for INT/FLOAT (ignored if min > max) */
    const char *const *choices; /* ENUM only: NULL-terminated list of names    */
    const char *doc;          /* one line for `loom plugins --params`          */
} loom_param;

/* --------------------------------------------------------------- host table */

typedef enum loom_log_level {
    LOOM_LOG_DEBUG = 0,
    LOOM_LOG_INFO = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_ERROR = 3,
} loom_log_level;

/*
 * The table of host services handed to every create(). Valid until the
 * instance is destroyed. Grows only at its end; check struct_size before
 * using a field added after ABI 1.0.
 */
typedef struct loom_host {
    uint32_t struct_size;    /* sizeof(loom_host) as the host built it       */
    uint32_t abi_major;      /* host's LOOM_ABI_MAJOR                        */
    uint32_t abi_minor;      /* host's LOOM_ABI_MINOR                        */
    void *ctx;               /* host's private state; pass back as first arg */

    /* [any] Log a message tagged with `who` (the component name). */
    void (*log)(void *ctx, loom_log_level level, const char *who, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 4, 5)))
#endif
        ;
    /* [any] Allocation on the host heap. Memory from alloc is released only
     * by the same table's free. alloc returns NULL on failure; size 0 is ok. */
    void *(*alloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t n, size_t size);
    void (*free)(void *ctx, void *ptr);

    /* [any] Fill `err` (may be NULL) with code and printf-style message;
     * returns `code` so plugins can `return host->error(...)`. */
    loom_status (*error)(void *ctx, loom_error *err, loom_status code, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 4, 5)))
#endif
        ;

    /* [any] Metrics: add `delta` to counter `name` (created on first use),
     * or set gauge `name` to `value`. Names are dotted, e.g. "cache.evictions". */
    void (*metric_add)(void *ctx, const char *name, double delta);
    void (*metric_set)(void *ctx, const char *name, double value);

    /* [any] Dequantize `n` elements (a whole number of blocks) of `dtype` at
     * `src` into float32 `dst`. Covers every type in loom/tensor.h that the
     * model loaders produce; LOOM_ERR_UNSUPPORTED otherwise. */
    loom_status (*dequantize)(void *ctx, loom_dtype dtype, const void *src, float *dst, int64_t n);
    /* [any] Number of worker threads the user asked for (`threads` in the
     * pipeline, default: all cores). Backends size their pools from it. */
    int32_t (*num_threads)(void *ctx);
    /* since ABI 1.1 — add new members below this line only */
} loom_host;

/* ----------------------------------------------------------- the descriptor */

typedef enum loom_kind {
    LOOM_KIND_BACKEND = 1,    /* forward pass on one device (loom/backend.h)   */
    LOOM_KIND_EXECUTOR = 2,   /* forward over several devices (loom/backend.h) */
    LOOM_KIND_SCHEDULER = 3,  /* which sequences run each step (loom/scheduler.h) */
    LOOM_KIND_CACHE = 4,      /* KV block management (loom/cache.h)           */
    LOOM_KIND_QUANTIZER = 5,  /* weight/activation/KV formats (loom/quant.h)  */
    LOOM_KIND_SAMPLER = 6,    /* logits -> tokens (loom/sampler.h)            */
    LOOM_KIND_SPECULATOR = 7, /* draft + verify (loom/spec.h)                 */
} loom_kind;

/* "backend", "scheduler", ... ; NULL for an unknown kind. */
static inline const char *loom_kind_name(loom_kind k) {
    switch (k) {
    case LOOM_KIND_BACKEND: return "backend";
    case LOOM_KIND_EXECUTOR: return "executor";
    case LOOM_KIND_SCHEDULER: return "scheduler";
    case LOOM_KIND_CACHE: return "cache";
    case LOOM_KIND_QUANTIZER: return "quantizer";
    case LOOM_KIND_SAMPLER: return "sampler";
    case LOOM_KIND_SPECULATOR: return "speculator";
    }
    return NULL;
}

/* One feature a plugin offers. `ops` points to the kind's ops table (e.g.
 * loom_scheduler_ops), which itself starts with struct_size. */
typedef struct loom_component {
    uint32_t struct_size;     /* sizeof(loom_component)                        */
    loom_kind kind;           /* which slot it fills                           */
    const char *name;         /* unique among plugins, e.g. "continuous"       */
    const char *summary;      /* one line for `loom plugins`                   */
    const void *ops;          /* kind-specific table; never NULL               */
    const loom_param *params; /* NULL-key-terminated; NULL = no parameters     */
    size_t config_size;       /* bytes of the config struct the host fills     */
} loom_component;

/* Returned by the entry symbol; static, never freed. */
typedef struct loom_plugin_desc {
    uint32_t struct_size;        /* sizeof(loom_plugin_desc)                    */
    uint32_t abi_major;          /* LOOM_ABI_MAJOR the plugin was built with    */
    uint32_t abi_minor;          /* LOOM_ABI_MINOR the plugin was built with    */
    uint32_t build_signature;    /* LOOM_BUILD_SIGNATURE                        */
    const char *name;            /* plugin (shared object) name                 */
    const char *version;         /* plugin's own version, e.g. "0.1.0"          */
    uint32_t num_components;     /* entries in `components`                     */
    const loom_component *components; /* array of num_components               */
} loom_plugin_desc;

typedef const loom_plugin_desc *(*loom_plugin_entry_fn)(void);

/* Fill the version fields of a descriptor: use in a designated initialiser. */
#define LOOM_PLUGIN_DESC_HEADER                                                                    \
    .struct_size = sizeof(loom_plugin_desc), .abi_major = LOOM_ABI_MAJOR,                          \
    .abi_minor = LOOM_ABI_MINOR, .build_signature = LOOM_BUILD_SIGNATURE

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PLUGIN_H */
