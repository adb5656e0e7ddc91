/*
 * core/plugin/registry.c — the plugin loader: search path, dlopen, the ABI
 * checks on every descriptor, lookup by name or path, listing, and the
 * per-object reference count that keeps code mapped while instances live.
 *
 * Every file is opened at most once per registry (cached by real path,
 * failures included), so a broken file costs one dlopen and one message.
 * Checks run in an order that keeps reading safe: struct_size large enough
 * for the version fields, then ABI major (another major's descriptor may
 * have any layout after its first three fields, which are frozen forever),
 * then minor, then the full size, build signature, components, ops tables
 * (size and every REQUIRED member non-NULL) and parameter tables. A plugin failing any check is closed again; a component
 * that is wrong rejects the whole file (nothing half-loaded).
 */
#include "plugin/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "loom/backend.h"
#include "loom/cache.h"
#include "loom/executor.h"
#include "loom/quant.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/spec.h"
#include "loom/constraint.h"
#include "loom/kv_connector.h"
#include "loom_build_config.h"
#include "plugin/host.h"
#include "util/util.h"

#define SEARCH_DEPTH 3          /* subdirectory levels below each search dir */
#define MAX_PARAMS 4096         /* runaway guard for unterminated tables     */
#define MSG LOOM_ERROR_MSG_MAX

/* ------------------------------------------------------------ ABI helpers */

#define END_OF(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* One member of an ops table: where it is, what it is called, and whether
 * the kind's header marks it REQUIRED. */
typedef struct ops_member {
    size_t offset;
    const char *name;
    bool required;
    int since_minor; /* the ABI 2.N that added it: a 2.0 table may end before it */
} ops_member;

#define REQ(type, f) {offsetof(type, f), #f, true, 0}
#define OPT(type, f) {offsetof(type, f), #f, false, 0}
#define OPT_SINCE(minor, type, f) {offsetof(type, f), #f, false, minor}

static const ops_member backend_members[] = {
    REQ(loom_backend_ops, create), REQ(loom_backend_ops, destroy), REQ(loom_backend_ops, load),
    REQ(loom_backend_ops, kv_block_bytes), REQ(loom_backend_ops, memory), REQ(loom_backend_ops, kv_alloc),
    REQ(loom_backend_ops, forward), REQ(loom_backend_ops, copy_blocks), OPT(loom_backend_ops, forward_topk),
    OPT(loom_backend_ops, swap_blocks), OPT(loom_backend_ops, load_shard), OPT(loom_backend_ops, set_observer),
    OPT_SINCE(3, loom_backend_ops, load_stage), OPT_SINCE(4, loom_backend_ops, kv_read_blocks),
    OPT_SINCE(4, loom_backend_ops, kv_write_blocks), OPT_SINCE(4, loom_backend_ops, kv_groups),
    OPT_SINCE(6, loom_backend_ops, kv_image_device), OPT_SINCE(8, loom_backend_ops, kv_default_dtype),
    {0, NULL, false, 0}};
static const ops_member executor_members[] = {
    REQ(loom_executor_ops, create), REQ(loom_executor_ops, destroy), REQ(loom_executor_ops, inner_count),
    REQ(loom_executor_ops, attach_inner), REQ(loom_executor_ops, load), REQ(loom_executor_ops, kv_block_bytes),
    REQ(loom_executor_ops, memory), REQ(loom_executor_ops, kv_alloc), REQ(loom_executor_ops, forward),
    REQ(loom_executor_ops, copy_blocks), OPT(loom_executor_ops, forward_topk),
    OPT(loom_executor_ops, swap_blocks), {0, NULL, false}};
static const ops_member scheduler_members[] = {
    REQ(loom_scheduler_ops, create), REQ(loom_scheduler_ops, destroy), REQ(loom_scheduler_ops, add),
    REQ(loom_scheduler_ops, remove), REQ(loom_scheduler_ops, schedule), OPT(loom_scheduler_ops, stats),
    {0, NULL, false}};
static const ops_member cache_members[] = {
    REQ(loom_cache_ops, create), REQ(loom_cache_ops, destroy), REQ(loom_cache_ops, init),
    REQ(loom_cache_ops, acquire_prefix), REQ(loom_cache_ops, allocate), REQ(loom_cache_ops, truncate),
    REQ(loom_cache_ops, free), REQ(loom_cache_ops, fork), OPT(loom_cache_ops, swap_out),
    OPT(loom_cache_ops, swap_in), REQ(loom_cache_ops, block_table), REQ(loom_cache_ops, take_block_ops),
    REQ(loom_cache_ops, num_free_blocks), OPT(loom_cache_ops, stats), OPT_SINCE(4, loom_cache_ops, group_table),
    {0, NULL, false, 0}};
static const ops_member quant_members[] = {
    REQ(loom_quant_ops, create), REQ(loom_quant_ops, destroy), REQ(loom_quant_ops, plan),
    REQ(loom_quant_ops, quantize), REQ(loom_quant_ops, release), OPT(loom_quant_ops, kv_dtype),
    OPT(loom_quant_ops, accepts_packing), {0, NULL, false}};
static const ops_member sampler_members[] = {
    REQ(loom_sampler_ops, create), REQ(loom_sampler_ops, destroy), REQ(loom_sampler_ops, sample),
    REQ(loom_sampler_ops, probs), OPT(loom_sampler_ops, candidates), OPT_SINCE(1, loom_sampler_ops, check),
    {0, NULL, false, 0}};
static const ops_member spec_members[] = {
    REQ(loom_spec_ops, create), REQ(loom_spec_ops, destroy), REQ(loom_spec_ops, init),
    REQ(loom_spec_ops, plan), REQ(loom_spec_ops, propose), REQ(loom_spec_ops, observe),
    REQ(loom_spec_ops, release), OPT(loom_spec_ops, stats), OPT(loom_spec_ops, propose_batch),
    {0, NULL, false}};

static const ops_member constraint_members[] = {
    REQ(loom_constraint_ops, create), REQ(loom_constraint_ops, destroy), REQ(loom_constraint_ops, compile),
    REQ(loom_constraint_ops, grammar_free), REQ(loom_constraint_ops, matcher_new),
    REQ(loom_constraint_ops, matcher_free), REQ(loom_constraint_ops, fill_mask), REQ(loom_constraint_ops, accept),
    REQ(loom_constraint_ops, can_end), OPT(loom_constraint_ops, rollback), {0, NULL, false}};
static const ops_member kv_connector_members[] = {
    REQ(loom_kv_connector_ops, create), REQ(loom_kv_connector_ops, destroy), REQ(loom_kv_connector_ops, limits),
    REQ(loom_kv_connector_ops, listen), REQ(loom_kv_connector_ops, accept), REQ(loom_kv_connector_ops, connect),
    REQ(loom_kv_connector_ops, send), REQ(loom_kv_connector_ops, recv), REQ(loom_kv_connector_ops, close),
    OPT_SINCE(6, loom_kv_connector_ops, payload_buffer), OPT_SINCE(6, loom_kv_connector_ops, payload_to_host),
    OPT_SINCE(6, loom_kv_connector_ops, payload_release),
    {0, NULL, false}};

static const ops_member *kind_members(loom_kind kind) {
    switch (kind) {
    case LOOM_KIND_BACKEND: return backend_members;
    case LOOM_KIND_EXECUTOR: return executor_members;
    case LOOM_KIND_SCHEDULER: return scheduler_members;
    case LOOM_KIND_CACHE: return cache_members;
    case LOOM_KIND_QUANTIZER: return quant_members;
    case LOOM_KIND_SAMPLER: return sampler_members;
    case LOOM_KIND_SPECULATOR: return spec_members;
    case LOOM_KIND_CONSTRAINT: return constraint_members;
    case LOOM_KIND_KV_CONNECTOR: return kv_connector_members;
    }
    return NULL;
}

size_t loom_kind_min_ops_size(loom_kind kind) {
    /* Every member a 2.0 table has: the least a plugin of this major may
     * export. Members appended in 2.1+ are read only when struct_size
     * covers them (LOOM_HAS_FIELD). */
    const ops_member *m = kind_members(kind);
    if (!m) return 0;
    size_t end = 0;
    for (; m->name; m++)
        if (m->since_minor == 0 && m->offset + sizeof(void (*)(void)) > end) end = m->offset + sizeof(void (*)(void));
    return end;
}

const char *loom_ops_missing(loom_kind kind, const void *ops) {
    const ops_member *m = kind_members(kind);
    if (!m || !ops) return NULL;
    uint32_t size;
    memcpy(&size, ops, sizeof size); /* every ops table starts with struct_size */
    for (; m->name; m++) {
        if (m->offset + sizeof(void (*)(void)) > size) continue; /* a member newer than the table */
        void (*fn)(void);
        memcpy(&fn, (const char *)ops + m->offset, sizeof fn);
        if (m->required && !fn) return m->name;
    }
    return NULL;
}

const char *loom_kind_name(loom_kind k) {
    switch (k) {
    case LOOM_KIND_BACKEND: return "backend";
    case LOOM_KIND_EXECUTOR: return "executor";
    case LOOM_KIND_SCHEDULER: return "scheduler";
    case LOOM_KIND_CACHE: return "cache";
    case LOOM_KIND_QUANTIZER: return "quantizer";
    case LOOM_KIND_SAMPLER: return "sampler";
    case LOOM_KIND_SPECULATOR: return "speculator";
    case LOOM_KIND_CONSTRAINT: return "constraint";
    case LOOM_KIND_KV_CONNECTOR: return "kv_connector";
    }
    return NULL;
}

const char *loom_kind_with_article(loom_kind kind) {
    switch (kind) {
    case LOOM_KIND_BACKEND: return "a backend";
    case LOOM_KIND_EXECUTOR: return "an executor";
    case LOOM_KIND_SCHEDULER: return "a scheduler";
    case LOOM_KIND_CACHE: return "a cache";
    case LOOM_KIND_QUANTIZER: return "a quantizer";
    case LOOM_KIND_SAMPLER: return "a sampler";
    case LOOM_KIND_SPECULATOR: return "a speculator";
    case LOOM_KIND_CONSTRAINT: return "a constraint";
    case LOOM_KIND_KV_CONNECTOR: return "a kv_connector";
    }
    return "an unknown kind of";
}

loom_kind loom_kind_from_name(const char *name) {
    if (!name) return (loom_kind)0;
    for (int k = LOOM_KIND_BACKEND; k <= LOOM_KIND_KV_CONNECTOR; k++)
        if (strcmp(loom_kind_name((loom_kind)k), name) == 0) return (loom_kind)k;
    return (loom_kind)0;
}

static bool kind_valid(loom_kind k) { return k >= LOOM_KIND_BACKEND && k <= LOOM_KIND_KV_CONNECTOR; }

/* The header that declares a kind's ops table, without ".h". */
static const char *kind_header(loom_kind k) {
    switch (k) {
    case LOOM_KIND_QUANTIZER: return "quant";
    case LOOM_KIND_SPECULATOR: return "spec";
    default: return loom_kind_name(k);
    }
}

static const char *kind_str(loom_kind k) {
    const char *s = loom_kind_name(k);
    return s ? s : "unknown";
}

/* ----------------------------------------------------------------- types */

struct loom_plugin {
    char *path;                   /* real path, owned                        */
    void *handle;                 /* dlopen handle                           */
    const loom_plugin_desc *desc; /* static data inside the object           */
    atomic_int refs;              /* registry's + one per live instance      */
    atomic_int instances;         /* live instances only                     */
};

typedef struct search_dir {
    char *path;   /* absolute when it could be made so; owned */
    char *origin; /* "LOOM_PLUGIN_PATH", "build tree", ...; owned */
    bool exists;
} search_dir;

/* A file the registry tried to open (every outcome cached). */
typedef struct opened {
    char *real;          /* real path, owned (key)                         */
    char *found;         /* path as found in the search path, owned         */
    loom_plugin *plugin; /* NULL when it failed                             */
    loom_status status;
    char *error;         /* owned; "" on success                            */
    bool not_plugin;     /* dlopen failed or no entry symbol                */
} opened;

/* A *.so under the search path. */
typedef struct found_file {
    char *path; /* as found, owned */
    char *real; /* owned; dedup key */
} found_file;

struct loom_registry {
    search_dir *dirs;
    int ndirs;
    found_file *files; /* every *.so under the dirs, in search order        */
    int nfiles;
    bool files_done;
    opened **open;     /* cache of attempts; entries never move            */
    int nopen;
    int capopen;
    loom_registry_item *items; /* listing, built once                       */
    char **item_errors;        /* owned messages for duplicates             */
    int nitems;
    bool listed;
};

/* ------------------------------------------------------------- refcount */

static void plugin_unref(loom_plugin *p) {
    if (!p) return;
    if (atomic_fetch_sub(&p->refs, 1) != 1) return;
    /* Last reference: no instance can run code from the object any more. */
    dlclose(p->handle);
    free(p->path);
    free(p);
}

const char *loom_plugin_path(const loom_plugin *p) { return p ? p->path : NULL; }
const loom_plugin_desc *loom_plugin_desc_of(const loom_plugin *p) { return p ? p->desc : NULL; }

int loom_plugin_live_instances(const loom_plugin *p) {
    return p ? atomic_load(&((loom_plugin *)p)->instances) : 0;
}

const loom_component *loom_plugin_component(const loom_plugin *p, loom_kind kind,
                                            const char *name) {
    if (!p || !name) return NULL;
    const loom_plugin_desc *d = p->desc;
    for (uint32_t i = 0; i < d->num_components; i++) {
        const loom_component *c = &d->components[i];
        if (c->kind == kind && strcmp(c->name, name) == 0) return c;
    }
    return NULL;
}

/* First component named `name` of any kind other than `kind`. */
static const loom_component *component_other_kind(const loom_plugin *p, loom_kind kind,
                                                  const char *name) {
    const loom_plugin_desc *d = p->desc;
    for (uint32_t i = 0; i < d->num_components; i++) {
        const loom_component *c = &d->components[i];
        if (c->kind != kind && strcmp(c->name, name) == 0) return c;
    }
    return NULL;
}

loom_status loom_plugin_create_instance(loom_plugin *p, const loom_component *comp,
                                        const loom_host *host, const void *config, void **self,
                                        loom_error *err) {
    if (!p || !comp || !self)
        return loom_error_set(err, LOOM_ERR_INVALID, "create_instance: no plugin or component");
    *self = NULL;
    const loom_ops_head *ops = comp->ops;
    atomic_fetch_add(&p->refs, 1); /* before create: it may start threads */
    void *inst = NULL;
    loom_error local = {0};
    loom_status st = ops->create(host ? host : loom_host_default(), config, &inst, &local);
    if (st != LOOM_OK) {
        plugin_unref(p);
        if (!local.message[0]) snprintf(local.message, sizeof local.message, "%s", loom_status_name(st));
        return loom_error_set(err, st, "%s '%s' (%s): create failed: %s", kind_str(comp->kind),
                              comp->name, p->path, local.message);
    }
    if (!inst) {
        /* Nothing to destroy (destroy(NULL) is a no-op) and nothing to
         * reach this reference through later: refuse rather than leak it. */
        plugin_unref(p);
        return loom_error_set(err, LOOM_ERR_INTERNAL,
                              "%s '%s' (%s): create returned LOOM_OK without an instance (*self NULL); "
                              "loom/plugin.h (loom_create_fn) requires one",
                              kind_str(comp->kind), comp->name, p->path);
    }
    atomic_fetch_add(&p->instances, 1);
    *self = inst;
    return LOOM_OK;
}

void loom_plugin_destroy_instance(loom_plugin *p, const loom_component *comp, void *self) {
    if (!p || !comp) return;
    const loom_ops_head *ops = comp->ops;
    ops->destroy(self);
    atomic_fetch_sub(&p->instances, 1);
    plugin_unref(p);
}

/* ------------------------------------------------------------ small bits */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Levenshtein distance, capped inputs (names are short). */
int loom_name_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int prev[64], cur[64];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}

/* Append printf text to buf (size total), truncating with "...". */
static void appendf(char *buf, size_t size, const char *fmt, ...) LOOM_PRINTF(3, 4);
static void appendf(char *buf, size_t size, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n >= size - len && size > 4) memcpy(buf + size - 4, "...", 4);
}

/* ---------------------------------------------------------------- checks */

static bool name_valid(const char *s) {
    if (!s || !s[0] || ends_with(s, ".so")) return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            return false;
    return true;
}

/* Check one component; message into msg. */
static loom_status check_component(const char *path, uint32_t idx, const loom_component *c,
                                   char *msg, size_t n) {
    const size_t min_comp = END_OF(loom_component, config_size);
    if (c->struct_size < min_comp) {
        snprintf(msg, n,
                 "'%s': component #%u has struct_size %u, smaller than ABI 2.0's loom_component "
                 "(%zu bytes): corrupt descriptor or not built against loom/plugin.h",
                 path, idx, c->struct_size, min_comp);
        return LOOM_ERR_ABI;
    }
    if (!kind_valid(c->kind)) {
        snprintf(msg, n, "'%s': component #%u has unknown kind %d", path, idx, (int)c->kind);
        return LOOM_ERR_FORMAT;
    }
    if (!name_valid(c->name)) {
        snprintf(msg, n,
                 "'%s': component #%u (%s) has a missing or invalid name (letters, digits, '-', "
                 "'_', '.'; not ending in .so)",
                 path, idx, kind_str(c->kind));
        return LOOM_ERR_FORMAT;
    }
    const loom_ops_head *ops = c->ops;
    if (!ops) {
        snprintf(msg, n, "'%s': %s '%s' has no ops table", path, kind_str(c->kind), c->name);
        return LOOM_ERR_FORMAT;
    }
    size_t min_ops = loom_kind_min_ops_size(c->kind);
    if (ops->struct_size < min_ops) {
        snprintf(msg, n,
                 "'%s': %s '%s' ops table struct_size is %u bytes, but ABI %d.0's %s ops table "
                 "is %zu bytes: rebuild the plugin against this loom's headers",
                 path, kind_str(c->kind), c->name, ops->struct_size, LOOM_ABI_MAJOR, kind_str(c->kind), min_ops);
        return LOOM_ERR_ABI;
    }
    const char *missing = loom_ops_missing(c->kind, ops);
    if (missing) {
        snprintf(msg, n, "'%s': %s '%s' has no %s() (NULL): loom/%s.h marks it REQUIRED", path,
                 kind_str(c->kind), c->name, missing, kind_header(c->kind));
        return LOOM_ERR_FORMAT;
    }
    if (c->kind == LOOM_KIND_CACHE && !((const loom_cache_ops *)ops)->swap_out != !((const loom_cache_ops *)ops)->swap_in) {
        snprintf(msg, n, "'%s': cache '%s' has only one of swap_out() and swap_in(): loom/cache.h wants both or neither",
                 path, c->name);
        return LOOM_ERR_FORMAT;
    }
    if (c->kind == LOOM_KIND_BACKEND && LOOM_HAS_FIELD((const loom_backend_ops *)ops, loom_backend_ops, kv_write_blocks) &&
        !((const loom_backend_ops *)ops)->kv_read_blocks != !((const loom_backend_ops *)ops)->kv_write_blocks) {
        snprintf(msg, n,
                 "'%s': backend '%s' has only one of kv_read_blocks() and kv_write_blocks(): loom/backend.h wants "
                 "both or neither",
                 path, c->name);
        return LOOM_ERR_FORMAT;
    }
    if (!c->params) return LOOM_OK;
    for (int i = 0; i < MAX_PARAMS; i++) {
        const loom_param *p = &c->params[i];
        if (!p->key) return LOOM_OK;
        size_t sz = loom_param_size(p->type);
        const char *why = NULL;
        if (!p->key[0]) why = "has an empty key";
        else if (sz == 0) why = "has an unknown type";
        else if (p->offset > c->config_size || sz > c->config_size - p->offset)
            why = "lies outside the config struct (offset + size > config_size)";
        else if (p->type == LOOM_PARAM_ENUM && (!p->choices || !p->choices[0]))
            why = "is an enum without choices";
        for (int j = 0; !why && j < i; j++)
            if (strcmp(c->params[j].key, p->key) == 0) why = "is declared twice";
        if (why) {
            snprintf(msg, n, "'%s': %s '%s': parameter '%s' %s", path, kind_str(c->kind), c->name,
                     p->key[0] ? p->key : "?", why);
            return LOOM_ERR_FORMAT;
        }
    }
    snprintf(msg, n, "'%s': %s '%s': parameter table is not terminated by a NULL key", path,
             kind_str(c->kind), c->name);
    return LOOM_ERR_FORMAT;
}

static void describe_signature(uint32_t sig, char *buf, size_t n) {
    snprintf(buf, n, "0x%x (%u-bit pointers, tensor layout rev %u)", sig, (sig >> 16) * 8,
             sig & 0xffffu);
}

/* The descriptor checks, in the order that keeps every read in bounds. */
static loom_status check_desc(const char *path, const loom_plugin_desc *d, char *msg, size_t n) {
    const size_t min_head = END_OF(loom_plugin_desc, abi_minor);
    const size_t min_desc = END_OF(loom_plugin_desc, components);
    if (!d) {
        snprintf(msg, n, "'%s': %s() returned NULL", path, LOOM_PLUGIN_ENTRY_SYMBOL);
        return LOOM_ERR_FORMAT;
    }
    if (d->struct_size < min_head) {
        snprintf(msg, n,
                 "'%s': descriptor struct_size is %u bytes, smaller than the version fields of "
                 "loom_plugin_desc (%zu bytes): use LOOM_PLUGIN_DESC_HEADER",
                 path, d->struct_size, min_head);
        return LOOM_ERR_ABI;
    }
    if (d->abi_major != LOOM_ABI_MAJOR) {
        snprintf(msg, n,
                 "'%s': plugin ABI %u.%u, host ABI %d.%d: the major version must match; rebuild "
                 "the plugin against this loom's SDK (pkg-config loom-plugin)",
                 path, d->abi_major, d->abi_minor, LOOM_ABI_MAJOR, LOOM_ABI_MINOR);
        return LOOM_ERR_ABI;
    }
    if (d->abi_minor > LOOM_ABI_MINOR) {
        snprintf(msg, n,
                 "'%s': plugin ABI %u.%u is newer than host ABI %d.%d: it may rely on host "
                 "features this loom lacks; upgrade loom or rebuild the plugin against this SDK",
                 path, d->abi_major, d->abi_minor, LOOM_ABI_MAJOR, LOOM_ABI_MINOR);
        return LOOM_ERR_ABI;
    }
    if (d->struct_size < min_desc) {
        snprintf(msg, n,
                 "'%s': descriptor struct_size is %u bytes, smaller than ABI 2.0's "
                 "loom_plugin_desc (%zu bytes): use LOOM_PLUGIN_DESC_HEADER",
                 path, d->struct_size, min_desc);
        return LOOM_ERR_ABI;
    }
    if (d->build_signature != LOOM_BUILD_SIGNATURE) {
        char ps[96], hs[96];
        describe_signature(d->build_signature, ps, sizeof ps);
        describe_signature(LOOM_BUILD_SIGNATURE, hs, sizeof hs);
        snprintf(msg, n,
                 "'%s' is not binary compatible: plugin build signature %s, host %s; rebuild it "
                 "for this machine",
                 path, ps, hs);
        return LOOM_ERR_ABI;
    }
    if (!d->name || !d->name[0]) {
        snprintf(msg, n, "'%s': descriptor has no name", path);
        return LOOM_ERR_FORMAT;
    }
    if (d->num_components == 0 || !d->components) {
        snprintf(msg, n, "'%s': plugin '%s' lists no components", path, d->name);
        return LOOM_ERR_FORMAT;
    }
    for (uint32_t i = 0; i < d->num_components; i++) {
        loom_status st = check_component(path, i, &d->components[i], msg, n);
        if (st != LOOM_OK) return st;
        for (uint32_t j = 0; j < i; j++)
            if (d->components[j].kind == d->components[i].kind &&
                strcmp(d->components[j].name, d->components[i].name) == 0) {
                snprintf(msg, n, "'%s': %s '%s' is listed twice", path,
                         kind_str(d->components[i].kind), d->components[i].name);
                return LOOM_ERR_FORMAT;
            }
    }
    return LOOM_OK;
}

/* --------------------------------------------------------------- opening */

static char *real_path(const char *path) {
    char *r = realpath(path, NULL);
    return r ? r : loom_strdup(path);
}

/* The cached outcome of opening the file whose real path is `real`, or NULL. */
static opened *find_opened(const loom_registry *reg, const char *real) {
    for (int i = 0; i < reg->nopen; i++)
        if (strcmp(reg->open[i]->real, real) == 0) return reg->open[i];
    return NULL;
}

/* Room for one more cache entry; false when out of memory. */
static bool reserve_open(loom_registry *reg) {
    if (reg->nopen < reg->capopen) return true;
    int cap = reg->capopen ? reg->capopen * 2 : 16;
    opened **arr = realloc(reg->open, (size_t)cap * sizeof *arr);
    if (!arr) return false;
    reg->open = arr;
    reg->capopen = cap;
    return true;
}

/* dlopen `real` (found as `path`) and call its entry function: *h and *d on
 * success. A file that is missing, not a shared object or without the entry
 * symbol sets *not_plugin; *h is closed on every failure. */
static loom_status open_entry(const char *path, const char *real, void **h, const loom_plugin_desc **d,
                              bool *not_plugin, char *msg, size_t n) {
    struct stat sb;
    *not_plugin = true;
    if (stat(path, &sb) != 0) {
        snprintf(msg, n, "cannot open plugin '%s': %s", path, strerror(errno));
        return LOOM_ERR_NOT_FOUND;
    }
    dlerror();
    /* RTLD_NODELETE: a plugin stays mapped after its last reference.
     * Runtimes inside plugins (CUDA's libstdc++, cuBLAS) register
     * process-wide state — exception pools, atexit handlers, TLS — that
     * does not survive an unmap (ggml's "backends cannot be unloaded");
     * the reference counts still decide when the registry lets go. */
    *h = dlopen(real, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!*h) {
        const char *e = dlerror();
        snprintf(msg, n,
                 "'%s' is not a loadable shared object: %s — is it a loom plugin built for this "
                 "machine?",
                 path, e ? e : "dlopen failed");
        return LOOM_ERR_FORMAT;
    }
    dlerror();
    void *sym = dlsym(*h, LOOM_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        snprintf(msg, n,
                 "'%s' has no entry symbol '%s': not a loom plugin (a plugin exports it with "
                 "LOOM_EXPORT)",
                 path, LOOM_PLUGIN_ENTRY_SYMBOL);
        dlclose(*h);
        return LOOM_ERR_FORMAT;
    }
    *not_plugin = false;
    loom_plugin_entry_fn entry;
    /* POSIX guarantees object and function pointers convert through dlsym. */
    memcpy(&entry, &sym, sizeof entry);
    *d = entry();
    return LOOM_OK;
}

/* Load the plugin at `path` into o->plugin, or leave o->plugin NULL and
 * describe why in msg. */
static loom_status load_plugin(opened *o, const char *path, char *msg, size_t n) {
    void *h = NULL;
    const loom_plugin_desc *d = NULL;
    loom_status st = open_entry(path, o->real, &h, &d, &o->not_plugin, msg, n);
    if (st != LOOM_OK) return st;
    if ((st = check_desc(path, d, msg, n)) != LOOM_OK) goto close_handle;
    loom_plugin *p = calloc(1, sizeof *p);
    if (!p || !(p->path = loom_strdup(o->real))) {
        free(p);
        snprintf(msg, n, "out of memory loading '%s'", path);
        st = LOOM_ERR_NOMEM;
        goto close_handle;
    }
    p->handle = h;
    p->desc = d;
    atomic_init(&p->refs, 1); /* the registry's reference */
    atomic_init(&p->instances, 0);
    o->plugin = p;
    return LOOM_OK;
close_handle:
    dlclose(h);
    return st;
}

/* Open `path` (or return the cached outcome). NULL only on OOM. */
static opened *open_file(loom_registry *reg, const char *path) {
    char *real = real_path(path);
    if (!real) return NULL;
    opened *o = find_opened(reg, real);
    if (o) {
        free(real);
        return o;
    }
    /* Heap entries, so pointers callers hold stay valid as the cache grows. */
    if (!reserve_open(reg) || !(o = calloc(1, sizeof *o))) {
        free(real);
        return NULL;
    }
    o->real = real;
    o->found = loom_strdup(path);
    char msg[MSG] = "";
    o->status = load_plugin(o, path, msg, sizeof msg);
    o->error = loom_strdup(msg);
    if (!o->found || !o->error) {
        /* OOM while recording: report the attempt as failed without text. */
        if (o->plugin) plugin_unref(o->plugin);
        free(o->found);
        free(o->error);
        free(o->real);
        free(o);
        return NULL;
    }
    reg->open[reg->nopen++] = o;
    return o;
}

loom_status loom_registry_open(loom_registry *reg, const char *path, loom_plugin **plugin,
                               loom_error *err) {
    if (plugin) *plugin = NULL;
    if (!reg || !path || !plugin)
        return loom_error_set(err, LOOM_ERR_INVALID, "registry_open: missing argument");
    opened *o = open_file(reg, path);
    if (!o) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory opening '%s'", path);
    if (!o->plugin) return loom_error_set(err, o->status, "%s", o->error);
    *plugin = o->plugin;
    return LOOM_OK;
}

/* -------------------------------------------------------- search path */

static bool add_dir(loom_registry *reg, const char *path, const char *origin) {
    if (!path || !path[0]) return true;
    char *abs = NULL;
    if (path[0] == '/') {
        abs = loom_strdup(path);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd)) {
            size_t n = strlen(cwd) + strlen(path) + 2;
            abs = malloc(n);
            if (abs) snprintf(abs, n, "%s/%s", cwd, path);
        } else {
            abs = loom_strdup(path);
        }
    }
    if (!abs) return false;
    size_t len = strlen(abs);
    while (len > 1 && abs[len - 1] == '/') abs[--len] = '\0';
    /* The same directory twice (LOOM_PLUGIN_PATH = build tree) is searched once. */
    for (int i = 0; i < reg->ndirs; i++)
        if (strcmp(reg->dirs[i].path, abs) == 0) {
            free(abs);
            return true;
        }
    search_dir *d = realloc(reg->dirs, (size_t)(reg->ndirs + 1) * sizeof *d);
    if (!d) {
        free(abs);
        return false;
    }
    reg->dirs = d;
    struct stat sb;
    d[reg->ndirs] = (search_dir){.path = abs, .origin = loom_strdup(origin ? origin : "")};
    d[reg->ndirs].exists = stat(abs, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (!d[reg->ndirs].origin) {
        free(abs);
        return false;
    }
    reg->ndirs++;
    return true;
}

static char *dir_name(const char *path) {
    char *s = loom_strdup(path);
    if (!s) return NULL;
    char *slash = strrchr(s, '/');
    if (slash && slash != s) *slash = '\0';
    else if (slash) s[1] = '\0';
    else strcpy(s, ".");
    return s;
}

/* Where this libloom lives (real path), or NULL. */
static char *libloom_path(void) {
    Dl_info info;
    void *fn;
    loom_status (*self)(const char *const *, int, const char *, unsigned, loom_registry **,
                        loom_error *) = loom_registry_create;
    memcpy(&fn, &self, sizeof fn);
    if (!dladdr(fn, &info) || !info.dli_fname) return NULL;
    return realpath(info.dli_fname, NULL);
}

static bool add_builtin_dirs(loom_registry *reg) {
    bool ok = true;
    char *lib = libloom_path();
    char *build_root = dir_name(LOOM_BUILD_PLUGIN_DIR);
    char *build_real = build_root ? realpath(build_root, NULL) : NULL;
    bool in_tree = false;
    if (lib && build_real) {
        size_t n = strlen(build_real);
        in_tree = strncmp(lib, build_real, n) == 0 && lib[n] == '/';
    }
    if (in_tree) {
        ok = add_dir(reg, LOOM_BUILD_PLUGIN_DIR, "build tree");
    } else {
        if (lib) {
            char *libdir = dir_name(lib);
            if (libdir) {
                size_t n = strlen(libdir) + sizeof "/loom/plugins";
                char *rel = malloc(n);
                if (rel) {
                    snprintf(rel, n, "%s/loom/plugins", libdir);
                    ok = add_dir(reg, rel, "install dir") && ok;
                    free(rel);
                }
                free(libdir);
            }
        }
        ok = add_dir(reg, LOOM_INSTALL_PLUGIN_DIR, "install dir") && ok;
    }
    free(build_real);
    free(build_root);
    free(lib);
    return ok;
}

loom_status loom_registry_create(const char *const *dirs, int num_dirs, const char *origin,
                                 unsigned flags, loom_registry **out, loom_error *err) {
    if (!out) return loom_error_set(err, LOOM_ERR_INVALID, "registry_create: out is NULL");
    *out = NULL;
    loom_registry *reg = calloc(1, sizeof *reg);
    if (!reg) goto oom;
    for (int i = 0; i < num_dirs; i++)
        if (!add_dir(reg, dirs[i], origin ? origin : "plugin_path")) goto oom;
    const char *env = (flags & LOOM_REGISTRY_NO_ENV) ? NULL : getenv("LOOM_PLUGIN_PATH");
    if (env) {
        char *copy = loom_strdup(env);
        if (!copy) goto oom;
        char *save = NULL;
        for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save))
            if (!add_dir(reg, tok, "LOOM_PLUGIN_PATH")) {
                free(copy);
                goto oom;
            }
        free(copy);
    }
    const char *only = getenv("LOOM_PLUGIN_PATH_ONLY");
    bool skip_builtin = (flags & LOOM_REGISTRY_NO_BUILTIN) || (only && only[0] && strcmp(only, "0"));
    if (!skip_builtin && !add_builtin_dirs(reg)) goto oom;
    *out = reg;
    return LOOM_OK;
oom:
    loom_registry_destroy(reg);
    return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory building the plugin search path");
}

void loom_registry_destroy(loom_registry *reg) {
    if (!reg) return;
    for (int i = 0; i < reg->ndirs; i++) {
        free(reg->dirs[i].path);
        free(reg->dirs[i].origin);
    }
    free(reg->dirs);
    for (int i = 0; i < reg->nfiles; i++) {
        free(reg->files[i].path);
        free(reg->files[i].real);
    }
    free(reg->files);
    for (int i = 0; i < reg->nopen; i++) {
        plugin_unref(reg->open[i]->plugin);
        free(reg->open[i]->real);
        free(reg->open[i]->found);
        free(reg->open[i]->error);
        free(reg->open[i]);
    }
    free(reg->open);
    for (int i = 0; i < reg->nitems; i++) free(reg->item_errors[i]);
    free(reg->item_errors);
    free(reg->items);
    free(reg);
}

int loom_registry_num_dirs(const loom_registry *reg) { return reg ? reg->ndirs : 0; }

const char *loom_registry_dir(const loom_registry *reg, int i, const char **origin, bool *exists) {
    if (!reg || i < 0 || i >= reg->ndirs) return NULL;
    if (origin) *origin = reg->dirs[i].origin;
    if (exists) *exists = reg->dirs[i].exists;
    return reg->dirs[i].path;
}

/* ------------------------------------------------------------- walking */

static bool add_file(loom_registry *reg, const char *path) {
    char *real = real_path(path);
    if (!real) return false;
    for (int i = 0; i < reg->nfiles; i++)
        if (strcmp(reg->files[i].real, real) == 0) {
            free(real);
            return true;
        }
    found_file *f = realloc(reg->files, (size_t)(reg->nfiles + 1) * sizeof *f);
    if (!f) {
        free(real);
        return false;
    }
    reg->files = f;
    char *p = loom_strdup(path);
    if (!p) {
        free(real);
        return false;
    }
    f[reg->nfiles++] = (found_file){.path = p, .real = real};
    return true;
}

static void walk(loom_registry *reg, const char *dir, int depth) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) return;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        /* Hidden entries and meson's per-target object dirs (*.p) hold no plugins. */
        if (nm[0] == '.' || ends_with(nm, ".p")) continue;
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, nm) >= sizeof path) continue;
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            if (depth < SEARCH_DEPTH) walk(reg, path, depth + 1);
        } else if (S_ISREG(sb.st_mode) && ends_with(nm, ".so")) {
            add_file(reg, path);
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static void collect_files(loom_registry *reg) {
    if (reg->files_done) return;
    reg->files_done = true;
    for (int i = 0; i < reg->ndirs; i++)
        if (reg->dirs[i].exists) walk(reg, reg->dirs[i].path, 0);
}

/* -------------------------------------------------------------- lookup */

static bool is_path(const char *name) { return strchr(name, '/') || ends_with(name, ".so"); }

static loom_status wrong_kind(loom_kind want, const char *name, const loom_component *c,
                              const char *path, loom_error *err) {
    return loom_error_set(err, LOOM_ERR_INVALID,
                          "'%s' is %s plugin, but the %s slot needs %s (found in %s)", name,
                          loom_kind_with_article(c->kind), kind_str(want),
                          loom_kind_with_article(want), path);
}

static loom_status duplicate(loom_kind kind, const char *name, const char *a, const char *b,
                             loom_error *err) {
    return loom_error_set(err, LOOM_ERR_INVALID,
                          "two plugins provide %s '%s': %s and %s; remove one, or take one "
                          "directory out of the search path",
                          kind_str(kind), name, a, b);
}

/* `path` was given explicitly: use its one component of `kind`. */
static loom_status find_in_file(loom_registry *reg, loom_kind kind, const char *path,
                                const loom_component **comp, loom_plugin **plugin,
                                loom_error *err) {
    loom_plugin *p = NULL;
    loom_status st = loom_registry_open(reg, path, &p, err);
    if (st != LOOM_OK) return st;
    const loom_plugin_desc *d = p->desc;
    const loom_component *pick = NULL;
    int count = 0;
    char names[256] = "";
    for (uint32_t i = 0; i < d->num_components; i++)
        if (d->components[i].kind == kind) {
            if (!pick) pick = &d->components[i];
            appendf(names, sizeof names, "%s%s", count ? ", " : "", d->components[i].name);
            count++;
        }
    if (count == 1) {
        *comp = pick;
        *plugin = p;
        return LOOM_OK;
    }
    if (count > 1)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "'%s' provides several %ss (%s): load one by name, with the "
                              "file's directory in plugin_path",
                              path, kind_str(kind), names);
    for (uint32_t i = 0; i < d->num_components; i++)
        appendf(names, sizeof names, "%s%s %s", i ? ", " : "",
                kind_str(d->components[i].kind), d->components[i].name);
    return loom_error_set(err, LOOM_ERR_INVALID,
                          "'%s' provides no %s (it provides: %s), but the %s slot needs %s", path,
                          kind_str(kind), names, kind_str(kind), loom_kind_with_article(kind));
}

static void search_path_text(const loom_registry *reg, char *buf, size_t n) {
    if (reg->ndirs == 0) {
        appendf(buf, n, "(the search path is empty)");
        return;
    }
    for (int i = 0; i < reg->ndirs; i++)
        appendf(buf, n, "%s%s (%s%s)", i ? ", " : "", reg->dirs[i].path, reg->dirs[i].origin,
                reg->dirs[i].exists ? "" : ", missing");
}

/* Step 1 of a lookup by name: the file `want` (loom-<kind>-<name>.so) in the
 * search path; *hit NULL when there is none, an error when there are two. */
static loom_status find_named_file(const loom_registry *reg, loom_kind kind, const char *name, const char *want,
                                   const found_file **hit, loom_error *err) {
    *hit = NULL;
    for (int i = 0; i < reg->nfiles; i++) {
        if (strcmp(base_name(reg->files[i].path), want) != 0) continue;
        if (*hit) return duplicate(kind, name, (*hit)->path, reg->files[i].path, err);
        *hit = &reg->files[i];
    }
    return LOOM_OK;
}

/* The file named for (kind, name) must load and provide it. */
static loom_status open_named_file(loom_registry *reg, loom_kind kind, const char *name, const found_file *hit,
                                   const loom_component **comp, loom_plugin **plugin, loom_error *err) {
    opened *o = open_file(reg, hit->path);
    if (!o) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory opening '%s'", hit->path);
    if (!o->plugin)
        return loom_error_set(err, o->status, "%s '%s': %s", kind_str(kind), name, o->error);
    const loom_component *c = loom_plugin_component(o->plugin, kind, name);
    if (c) {
        *comp = c;
        *plugin = o->plugin;
        return LOOM_OK;
    }
    const loom_component *other = component_other_kind(o->plugin, kind, name);
    if (other) return wrong_kind(kind, name, other, hit->path, err);
    return loom_error_set(err, LOOM_ERR_FORMAT,
                          "'%s' is named like %s plugin '%s' but does not provide one; check "
                          "its descriptor",
                          hit->path, kind_str(kind), name);
}

/* What scanning every descriptor found for one name. */
typedef struct scan_result {
    const loom_component *found, *other; /* of the kind; of another kind      */
    const opened *found_o, *other_o;     /* the files they are in             */
    const char *best;                    /* closest name of the kind, or NULL */
    int best_d;                          /* its edit distance                 */
    int broken;                          /* plugin files that failed to load  */
} scan_result;

/* Note the components of one loaded file that answer (kind, name). A second
 * file providing it is an error. */
static loom_status scan_plugin(const opened *o, loom_kind kind, const char *name, scan_result *r,
                               loom_error *err) {
    const loom_plugin_desc *d = o->plugin->desc;
    for (uint32_t j = 0; j < d->num_components; j++) {
        const loom_component *c = &d->components[j];
        if (strcmp(c->name, name) == 0) {
            if (c->kind == kind) {
                if (r->found) return duplicate(kind, name, r->found_o->found, o->found, err);
                r->found = c;
                r->found_o = o;
            } else if (!r->other) {
                r->other = c;
                r->other_o = o;
            }
        } else if (c->kind == kind) {
            int dist = loom_name_distance(c->name, name);
            if (dist < r->best_d) {
                r->best_d = dist;
                r->best = c->name;
            }
        }
    }
    return LOOM_OK;
}

/* Step 2: not under its own name, so open everything and read descriptors. */
static loom_status find_by_scan(loom_registry *reg, loom_kind kind, const char *name, scan_result *r,
                                loom_error *err) {
    *r = (scan_result){.best_d = 3};
    for (int i = 0; i < reg->nfiles; i++) {
        opened *o = open_file(reg, reg->files[i].path);
        if (!o) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory scanning plugins");
        if (!o->plugin) {
            if (!o->not_plugin || strncmp(base_name(o->found), "loom-", 5) == 0) r->broken++;
            continue;
        }
        loom_status st = scan_plugin(o, kind, name, r, err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* Nothing provides (kind, name): say what comes close, what failed to load
 * and where we looked. */
static loom_status not_found(const loom_registry *reg, loom_kind kind, const char *name, const char *want,
                             const scan_result *r, loom_error *err) {
    char msg[MSG] = "";
    appendf(msg, sizeof msg, "no %s plugin named '%s'", kind_str(kind), name);
    if (r->best) appendf(msg, sizeof msg, " (did you mean '%s'?)", r->best);
    appendf(msg, sizeof msg,
            ". Run `loom plugins` to list what is available, or add the plugin's directory to "
            "LOOM_PLUGIN_PATH or plugin_path.");
    if (r->broken)
        appendf(msg, sizeof msg, " %d file%s in the path could not be loaded (see `loom plugins`).",
                r->broken, r->broken == 1 ? "" : "s");
    appendf(msg, sizeof msg, " Looked for %s, and any *.so providing it, in: ", want);
    search_path_text(reg, msg, sizeof msg);
    return loom_error_set(err, LOOM_ERR_NOT_FOUND, "%s", msg);
}

loom_status loom_registry_find(loom_registry *reg, loom_kind kind, const char *name,
                               const loom_component **comp, loom_plugin **plugin,
                               loom_error *err) {
    if (comp) *comp = NULL;
    if (plugin) *plugin = NULL;
    if (!reg || !comp || !plugin)
        return loom_error_set(err, LOOM_ERR_INVALID, "registry_find: missing argument");
    if (!kind_valid(kind))
        return loom_error_set(err, LOOM_ERR_INVALID, "registry_find: unknown kind %d", (int)kind);
    if (!name || !name[0])
        return loom_error_set(err, LOOM_ERR_INVALID, "no %s plugin name given", kind_str(kind));
    if (is_path(name)) return find_in_file(reg, kind, name, comp, plugin, err);

    collect_files(reg);
    char want[PATH_MAX];
    snprintf(want, sizeof want, "loom-%s-%s.so", kind_str(kind), name);
    const found_file *hit;
    loom_status st = find_named_file(reg, kind, name, want, &hit, err);
    if (st != LOOM_OK) return st;
    if (hit) return open_named_file(reg, kind, name, hit, comp, plugin, err);
    scan_result r;
    if ((st = find_by_scan(reg, kind, name, &r, err)) != LOOM_OK) return st;
    if (r.found) {
        *comp = r.found;
        *plugin = r.found_o->plugin;
        return LOOM_OK;
    }
    if (r.other) return wrong_kind(kind, name, r.other, r.other_o->found, err);
    return not_found(reg, kind, name, want, &r, err);
}

/* -------------------------------------------------------------- listing */

const loom_registry_item *loom_registry_list(loom_registry *reg, int *count) {
    if (count) *count = 0;
    if (!reg) return NULL;
    if (reg->listed) {
        if (count) *count = reg->nitems;
        return reg->items;
    }
    reg->listed = true;
    collect_files(reg);
    reg->items = calloc(reg->nfiles ? (size_t)reg->nfiles : 1, sizeof *reg->items);
    reg->item_errors = calloc(reg->nfiles ? (size_t)reg->nfiles : 1, sizeof(char *));
    if (!reg->items || !reg->item_errors) return NULL;
    for (int i = 0; i < reg->nfiles; i++) {
        opened *o = open_file(reg, reg->files[i].path);
        if (!o) continue;
        /* Helper libraries next to plugins are not plugins: stay quiet. */
        if (!o->plugin && o->not_plugin && strncmp(base_name(o->found), "loom-", 5) != 0) continue;
        loom_registry_item *it = &reg->items[reg->nitems++];
        it->path = o->found;
        it->plugin = o->plugin;
        it->desc = o->plugin ? o->plugin->desc : NULL;
        it->status = o->status;
        it->error = o->error;
    }
    /* Duplicates across files: each file names the other. */
    for (int i = 0; i < reg->nitems; i++) {
        loom_registry_item *a = &reg->items[i];
        if (!a->desc) continue;
        for (int j = 0; j < reg->nitems; j++) {
            loom_registry_item *b = &reg->items[j];
            if (i == j || !b->desc || reg->item_errors[i]) continue;
            for (uint32_t k = 0; k < a->desc->num_components; k++) {
                const loom_component *c = &a->desc->components[k];
                if (!loom_plugin_component(b->plugin, c->kind, c->name)) continue;
                char msg[MSG];
                snprintf(msg, sizeof msg, "duplicate: %s '%s' is also provided by %s",
                         kind_str(c->kind), c->name, b->path);
                reg->item_errors[i] = loom_strdup(msg);
                if (reg->item_errors[i]) {
                    a->status = LOOM_ERR_INVALID;
                    a->error = reg->item_errors[i];
                }
                break;
            }
        }
    }
    if (count) *count = reg->nitems;
    return reg->items;
}
