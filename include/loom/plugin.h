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
 * Plugins link nothing from loom. Everything a plugin may call in the host —
 * logging, allocation, errors, metrics, and the shared rules every plugin of
 * a kind must follow (batch checks, shard plans, number formats, the rng) —
 * is a function of the loom_host table handed to create(), so a fix in the
 * host reaches every plugin without a rebuild (SQLite's
 * sqlite3_api_routines). The headers under loom/ hold declarations only.
 *
 * Versioning, three layers:
 *   - LOOM_ABI_MAJOR must match exactly; LOOM_ABI_MINOR of the plugin may not
 *     exceed the host's.
 *   - The build signature (pointer size, tensor layout revision) must match.
 *   - Every struct that crosses the boundary as one object starts with
 *     `struct_size` and GROWS ONLY AT ITS END: never reorder or remove a
 *     field. Every field is ABI 2.0 unless a "since ABI 2.N" line above it
 *     says otherwise; new fields go below such a line, and a reader checks
 *     struct_size before touching them (LOOM_HAS_FIELD).
 *   - FROZEN for the whole major version (a stride or an offset on the
 *     other side depends on their size): records passed as array elements
 *     (loom_component, loom_param, loom_sched_entry, loom_block_op,
 *     loom_chat_message, loom_logit_bias; new information goes into the struct that carries
 *     the array), structs embedded by value in others (loom_tensor in
 *     loom_qtensor, loom_sampling_params in loom_request), and loom_error,
 *     a caller-owned fixed buffer. loom_component and loom_tensor keep a
 *     struct_size the loader checks, but never grow.
 *
 * Methods: every ops-table member is marked REQUIRED or OPTIONAL. The loader
 * refuses a component whose table has NULL in a required slot, naming it
 * (`loom check` and `loom plugins` show the refusal). An optional member
 * may be NULL; its comment says what NULL means.
 *
 * Threads: each function carries one tag —
 *   [any]      any thread, concurrently;
 *   [engine]   only the engine's step-loop thread;
 *   [instance] any thread, but never concurrently on one instance.
 *
 * Lifetime, every kind: create() and destroy() are [engine]; create()
 * either succeeds fully or leaves nothing behind, and destroy() is never
 * called after a failed create(); the config pointer is borrowed for the
 * create() call only; destroy(NULL) is a no-op.
 */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define LOOM_ABI_MAJOR 2
#define LOOM_ABI_MINOR 9

/* Bumped whenever loom_tensor or the batch layout changes meaning. */
#define LOOM_TENSOR_LAYOUT_REV 1

/* Build signature: pointer size in bytes, tensor layout revision. A plugin
 * built with another signature is "not binary compatible". */
#define LOOM_BUILD_SIGNATURE ((uint32_t)(sizeof(void *) << 16) | LOOM_TENSOR_LAYOUT_REV)

#define LOOM_PLUGIN_ENTRY_SYMBOL "loom_plugin_entry"

#if defined(__GNUC__)
#define LOOM_EXPORT __attribute__((visibility("default")))
#define LOOM_PRINTF_FMT(a, b) __attribute__((format(printf, a, b)))
#else
#define LOOM_EXPORT
#define LOOM_PRINTF_FMT(a, b)
#endif

/* True when `obj` (a struct with struct_size, as its writer built it) is
 * large enough to hold `field`: use before reading a member added after
 * the struct first appeared. `obj` must not be NULL. */
#define LOOM_HAS_FIELD(obj, type, field)                                                           \
    ((obj)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

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
 * message that says what failed, where, and what to do next. Frozen. */
typedef struct loom_error {
    loom_status code;                 /* LOOM_OK when nothing failed           */
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
 * Tables end with an entry whose key is NULL. An array element: frozen. */
typedef struct loom_param {
    const char *key;            /* YAML key, e.g. "max_num_seqs"               */
    loom_param_type type;       /* see loom_param_type                         */
    size_t offset;              /* offsetof(config struct, field)              */
    const char *default_value;  /* textual default, parsed like YAML; NULL = required */
    double min, max;            /* inclusive bounds for INT/FLOAT (ignored if min > max) */
    const char *const *choices; /* ENUM only: NULL-terminated list of names    */
    const char *doc;            /* one line for `loom plugins --params`        */
} loom_param;

/* ----------------------------------------------------------- the kinds */

typedef enum loom_kind {
    LOOM_KIND_BACKEND = 1,    /* forward pass on one device (loom/backend.h)      */
    LOOM_KIND_EXECUTOR = 2,   /* forward over several devices (loom/executor.h)   */
    LOOM_KIND_SCHEDULER = 3,  /* which sequences run each step (loom/scheduler.h) */
    LOOM_KIND_CACHE = 4,      /* KV block management (loom/cache.h)               */
    LOOM_KIND_QUANTIZER = 5,  /* weight/activation/KV formats (loom/quant.h)      */
    LOOM_KIND_SAMPLER = 6,    /* logits -> tokens (loom/sampler.h)                */
    LOOM_KIND_SPECULATOR = 7, /* draft + verify (loom/spec.h)                     */
    /* since ABI 2.3 */
    LOOM_KIND_CONSTRAINT = 8, /* allowed-token masks (loom/constraint.h)          */
    /* since ABI 2.4 */
    LOOM_KIND_KV_CONNECTOR = 9, /* KV hand-over between engines (loom/kv_connector.h) */
} loom_kind;

/* --------------------------------------------------------------- host table */

typedef enum loom_log_level {
    LOOM_LOG_DEBUG = 0,
    LOOM_LOG_INFO = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_ERROR = 3,
} loom_log_level;

/* Declared in the kind headers; the host table refers to them by pointer. */
struct loom_model_config;
struct loom_model_view;
struct loom_batch;
struct loom_comm;
struct loom_shard;

/*
 * The table of host services handed to every create(). Static in the host:
 * valid for the life of the process, shared by every instance, so every
 * function is [any] and none is NULL. Grows only at its end: a plugin
 * built against a newer minor checks struct_size (LOOM_HAS_FIELD) before
 * using a member added after ABI 2.0.
 *
 * Functions that check something write a reason into `why` (cap bytes,
 * always NUL-terminated, no "plugin x:" prefix — the caller adds its own)
 * and return the status the caller should return.
 */
typedef struct loom_host {
    uint32_t struct_size;    /* sizeof(loom_host) as the host built it       */
    uint32_t abi_major;      /* host's LOOM_ABI_MAJOR                        */
    uint32_t abi_minor;      /* host's LOOM_ABI_MINOR                        */
    void *ctx;               /* host's private state; pass back as first arg */

    /* ---- services ---------------------------------------------------- */

    /* Log a message tagged with `who` (the component name). */
    void (*log)(void *ctx, loom_log_level level, const char *who, const char *fmt, ...)
        LOOM_PRINTF_FMT(4, 5);
    /* Heap allocation. Memory from alloc/calloc is released only by this
     * table's free. alloc/calloc return NULL on failure; size 0 is ok;
     * free(NULL) is a no-op. */
    void *(*alloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t n, size_t size);
    void (*free)(void *ctx, void *ptr);
    /* Fill `err` (may be NULL) with code and printf-style message; returns
     * `code` so plugins can `return host->error(...)`. */
    loom_status (*error)(void *ctx, loom_error *err, loom_status code, const char *fmt, ...)
        LOOM_PRINTF_FMT(4, 5);
    /* Metrics: add `delta` to counter `name` (created on first use), or set
     * gauge `name` to `value`. Names are dotted, e.g. "cache.evictions". */
    void (*metric_add)(void *ctx, const char *name, double delta);
    void (*metric_set)(void *ctx, const char *name, double value);
    /* Worker threads the user asked for (`engine.threads`, default: all
     * cores), always >= 1. Backends size their pools from it. */
    int32_t (*num_threads)(void *ctx);

    /* ---- element types (loom/tensor.h) -------------------------------- */

    /* "f32", "q4_k", ...; "unknown" for a value outside the enum. */
    const char *(*dtype_name)(loom_dtype t);
    /* Elements per block (1 for plain types; 32 or 256 for GGUF blocks);
     * 0 for an unknown type. */
    int64_t (*dtype_block_elems)(loom_dtype t);
    /* Bytes per block (per element for plain types); 0 for an unknown type. */
    size_t (*dtype_block_bytes)(loom_dtype t);
    /* Bytes of one row of `n` elements; 0 when n is negative, not a whole
     * number of blocks, or the type is unknown. */
    size_t (*dtype_row_bytes)(loom_dtype t, int64_t n);
    /* Convert `n` elements of `src_type` at `src` (any alignment) into
     * `dst_type` at `dst`. Any source type the model loaders produce (plain
     * floats, integers by value, GGUF blocks — n then a whole number of
     * blocks) into F32; F32 into F16, BF16 and FP8_E4M3 (round to nearest
     * even, E4M3 saturating at +-448); F16 / BF16 / FP8_E4M3 into F32.
     * LOOM_ERR_UNSUPPORTED for any other pair, LOOM_ERR_INVALID for a
     * partial block; nothing is written then. */
    loom_status (*convert)(loom_dtype dst_type, void *dst, loom_dtype src_type, const void *src, int64_t n);

    /* ---- rules every backend follows (loom/backend.h, loom/model.h) ----- */

    /* The model-config checks every backend makes before its own limits: a
     * supported architecture, positive sizes, query heads a multiple of KV
     * heads, usable RMSNorm epsilon and RoPE parameters.
     * LOOM_ERR_UNSUPPORTED for an architecture or shape no backend runs,
     * LOOM_ERR_FORMAT for inconsistent RoPE scaling. */
    loom_status (*check_model_config)(const struct loom_model_config *c, char *why, size_t cap);
    /* What load() and load_shard() check first: not loaded yet
     * (`already_loaded` false), a model view with a config and get(), a
     * communicator (NULL for a whole model) with both collectives, and
     * check_model_config. */
    loom_status (*check_load)(bool already_loaded, const struct loom_model_view *m,
                              const struct loom_comm *comm, char *why, size_t cap);
    /* Check a batch against a KV pool of `num_blocks` blocks of
     * `block_size` tokens and a vocabulary of `vocab`. `logits` may be NULL
     * only when `logits_optional` (a tensor-parallel rank other than 0).
     * `max_positions` > 0 bounds positions (e.g. a RoPE table). */
    loom_status (*check_batch)(const struct loom_batch *b, const float *logits, bool logits_optional,
                               int32_t block_size, int32_t num_blocks, int32_t vocab,
                               int32_t max_positions, char *why, size_t cap);
    /* Fetch weight `name` and check it is host data of shape (d0) (d1 < 0)
     * or (d0, d1) in a known type. A packed AWQ/GPTQ weight passes with no
     * data (packed_qweight tells). A missing optional tensor gives *out NULL
     * and LOOM_OK; a missing required one LOOM_ERR_NOT_FOUND; a bad one
     * LOOM_ERR_FORMAT. */
    loom_status (*model_tensor)(const struct loom_model_view *m, const char *name, int64_t d0, int64_t d1,
                                bool required, const loom_tensor **out, char *why, size_t cap);
    /* The model's `<stem>.qweight` when `t` is a packed AWQ/GPTQ linear
     * weight (a shape-only `<stem>.weight`: data NULL, nbytes 0) that only
     * a quantizer can read; NULL for every ordinary tensor. */
    const loom_tensor *(*packed_qweight)(const struct loom_model_view *m, const loom_tensor *t);
    /* Rank `rank` of `size`'s part of model `c` under tensor parallelism
     * (loom/backend.h, loom_shard). LOOM_ERR_UNSUPPORTED when the model
     * does not split over `size` ranks, LOOM_ERR_INVALID for a bad rank. */
    loom_status (*shard_plan)(const struct loom_model_config *c, int32_t rank, int32_t size,
                              struct loom_shard *out, char *why, size_t cap);
    /* The k (1..vocab) largest of row[0..vocab): vals descending, equal
     * values by ascending id, NaN ranked as -inf; *lse = log(sum exp(row))
     * (NaN terms count as 0). The reference of forward_topk(). k > vocab:
     * entries vocab..k-1 are padding, id -1 and value -inf. k <= 0: nothing
     * is written, not even *lse. */
    void (*logits_topk_row)(const float *row, int32_t vocab, int32_t k, int32_t *ids, float *vals,
                            float *lse);

    /* ---- the per-sequence random stream (loom/sampler.h) ---------------- */

    /* Seed a 4-word state from a 64-bit seed (splitmix64). */
    void (*rng_seed)(uint64_t state[4], uint64_t seed);
    /* Next 64 random bits (xoshiro256**), advancing the state. */
    uint64_t (*rng_next)(uint64_t state[4]);
    /* Uniform double in [0, 1) from the next 53 bits. */
    double (*rng_uniform)(uint64_t state[4]);

    /* since ABI 2.4 (check with LOOM_HAS_FIELD(host, loom_host,
     * logits_topk_masked_row)) */
    /* logits_topk_row of the row with every token outside `allowed` (a
     * loom/constraint.h bitset) ranked as -inf — equal values still by
     * ascending id, so when fewer than k are allowed the rest are forbidden
     * tokens at -inf — while *lse stays the raw row's: the reference of
     * forward_topk()'s masked rows (loom_logits_topk.allowed). */
    void (*logits_topk_masked_row)(const float *row, int32_t vocab, const uint32_t *allowed, int32_t k,
                                   int32_t *ids, float *vals, float *lse);

    /* since ABI 2.4 — add new members below this line only */
} loom_host;

/* ------------------------------------------------------------- lifetime */

struct loom_host;
/* Every kind's first two methods (REQUIRED). create: make an instance from
 * its bound config (borrowed for the call); on success *self is non-NULL
 * (the loader refuses LOOM_OK with *self NULL, LOOM_ERR_INTERNAL naming the
 * plugin); on failure nothing is left behind and destroy is not called.
 * destroy: free everything; self may be NULL. Both [engine]. */
typedef loom_status loom_create_fn(const struct loom_host *host, const void *config, void **self,
                                   loom_error *err);
typedef void loom_destroy_fn(void *self);

/* ----------------------------------------------------------- the descriptor */

/* One feature a plugin offers. `ops` points to the kind's ops table (e.g.
 * loom_scheduler_ops), which itself starts with struct_size, create and
 * destroy. An array element (loom_plugin_desc.components): frozen. */
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
