/*
 * core/plugin/registry.h — finding, loading and checking plugin shared
 * objects, and keeping each loaded while any instance made from it lives.
 *
 * Search path, in order (a registry is built once, the order never changes):
 *   1. the directories the caller passes (the pipeline's `plugin_path`,
 *      already resolved relative to the YAML file that wrote them);
 *   2. LOOM_PLUGIN_PATH, colon-separated;
 *   3. the build tree's plugins/ when this libloom runs from the build tree,
 *      otherwise the installed plugin dir: <dir of libloom.so>/loom/plugins
 *      (so a relocated or --destdir install finds its own plugins) and the
 *      configured LOOM_INSTALL_PLUGIN_DIR. Only one of build tree / install
 *      is used so an old installed copy never shadows what was just built.
 *   Setting LOOM_PLUGIN_PATH_ONLY=1 skips 3 (reproducible experiments, tests).
 * Every directory is searched recursively a few levels (build trees keep
 * plugins at plugins/<kind>/<name>/loom-<kind>-<name>.so).
 *
 * Lookup by name tries the conventional file name loom-<kind>-<name>.so in
 * every directory, then falls back to opening every *.so in the path and
 * reading its descriptor. Two different files providing the same kind+name
 * is an error naming both (found among conventionally named files on every
 * lookup, and among all files when the registry scans: listing or fallback).
 * A value containing '/' or ending in ".so" is a path, not a name.
 *
 * Lifetime: a loaded shared object (loom_plugin) is reference counted: one
 * reference for the registry, one per live instance. It is dlclose'd only
 * when the last reference goes, so destroying the registry (or the pipeline
 * that owns it) while instances live is safe — the code stays mapped until
 * the last instance is destroyed (ggml's "backends cannot be unloaded" FIXME).
 *
 * Threads: a registry is [engine] (one thread at a time); the instance
 * functions and loom_plugin_* accessors are [any].
 */
#ifndef LOOM_CORE_PLUGIN_REGISTRY_H
#define LOOM_CORE_PLUGIN_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"

typedef struct loom_registry loom_registry; /* search path + loaded objects */
typedef struct loom_plugin loom_plugin;     /* one loaded shared object     */

/* ------------------------------------------------------------ ABI helpers */

/* Every kind's ops table starts with these three members (see the headers
 * under include/loom/); the registry and pipeline only ever call these. */
typedef struct loom_ops_head {
    uint32_t struct_size;
    loom_create_fn *create;
    loom_destroy_fn *destroy;
} loom_ops_head;

/* Bytes of `kind`'s ops table at ABI 2.0 (the least a plugin may export);
 * 0 for an unknown kind. */
size_t loom_kind_min_ops_size(loom_kind kind);
/* The first REQUIRED member of `kind`'s table that `ops` leaves NULL, by
 * its name ("sample"), or NULL when none is missing. */
const char *loom_ops_missing(loom_kind kind, const void *ops);

/* "backend", "scheduler", ...; NULL for an unknown kind. */
const char *loom_kind_name(loom_kind kind);
/* "a cache", "an executor" — for messages. */
const char *loom_kind_with_article(loom_kind kind);
/* Kind by its name ("cache"); 0 when unknown. */
loom_kind   loom_kind_from_name(const char *name);
/* Edit distance between two short names (for did-you-mean); large when
 * either is longer than 63 bytes. */
int         loom_name_distance(const char *a, const char *b);

/* ------------------------------------------------------------- registry */

enum {
    LOOM_REGISTRY_DEFAULT = 0,
    LOOM_REGISTRY_NO_ENV = 1u << 0,     /* ignore LOOM_PLUGIN_PATH               */
    LOOM_REGISTRY_NO_BUILTIN = 1u << 1, /* skip the build-tree / install dirs   */
};

/* Build a registry over `dirs` (num_dirs entries, searched first; copied;
 * relative entries are taken relative to the current directory) plus the
 * default places per `flags`. Loads nothing yet. `origin` labels the
 * caller's dirs in messages (e.g. "plugin_path in x.yaml"); may be NULL. */
loom_status loom_registry_create(const char *const *dirs, int num_dirs, const char *origin,
                                 unsigned flags, loom_registry **out, loom_error *err);
/* Drop the registry's references; objects with live instances stay loaded
 * until their last instance is destroyed. NULL-safe. */
void        loom_registry_destroy(loom_registry *reg);

/* Search directories in order (missing ones included, flagged). Strings are
 * owned by the registry. */
int         loom_registry_num_dirs(const loom_registry *reg);
const char *loom_registry_dir(const loom_registry *reg, int i, const char **origin, bool *exists);

/* Find component `name` of `kind`. `name` is a component name or a path to
 * a shared object (relative paths against the current directory; resolve
 * them first if they are relative to something else). On success *comp and
 * *plugin are borrowed from the registry (valid until it is destroyed, or
 * longer while instances hold the plugin). Errors: LOOM_ERR_NOT_FOUND (every
 * place looked, a did-you-mean), LOOM_ERR_FORMAT (not a shared object / no
 * entry symbol / bad descriptor), LOOM_ERR_ABI (version, signature or
 * struct_size), LOOM_ERR_INVALID (wrong kind, duplicates). */
loom_status loom_registry_find(loom_registry *reg, loom_kind kind, const char *name,
                               const loom_component **comp, loom_plugin **plugin, loom_error *err);

/* Load one shared object by path and check it (ABI, signature, sizes,
 * tables). *plugin borrowed from the registry. */
loom_status loom_registry_open(loom_registry *reg, const char *path, loom_plugin **plugin,
                               loom_error *err);

/* One file found by a scan. `desc` is NULL when the file is broken; then
 * `error` says why. A working file may still carry an error: a component
 * that another file provides too ("duplicate"). */
typedef struct loom_registry_item {
    const char *path;             /* as found in the search path             */
    loom_plugin *plugin;          /* NULL when broken                        */
    const loom_plugin_desc *desc; /* NULL when broken                        */
    loom_status status;           /* LOOM_OK, or what is wrong               */
    const char *error;            /* "" when status is LOOM_OK               */
} loom_registry_item;

/* Open every *.so in the search path (each once, by real path), tolerating
 * broken files. Files named loom-*.so that fail are reported; other *.so
 * without the entry symbol are skipped silently (helper libraries). The
 * array is owned by the registry, cached, valid until destroy. */
const loom_registry_item *loom_registry_list(loom_registry *reg, int *count);

/* ------------------------------------------------------- loaded objects */

const char             *loom_plugin_path(const loom_plugin *p); /* real path */
const loom_plugin_desc *loom_plugin_desc_of(const loom_plugin *p);
/* Component `name` of `kind` in p, or NULL. */
const loom_component   *loom_plugin_component(const loom_plugin *p, loom_kind kind,
                                              const char *name);
/* Instances created from p and not yet destroyed. */
int                     loom_plugin_live_instances(const loom_plugin *p);

/* [engine] Create an instance of component `comp` (which belongs to p):
 * calls ops->create with `host` (NULL = loom_host_default()) and `config`
 * (borrowed for the call) and takes a reference on p that keeps it loaded.
 * On failure nothing is left behind; err names the component. A create()
 * that returns LOOM_OK without an instance (*self NULL) is refused
 * (LOOM_ERR_INTERNAL). */
loom_status loom_plugin_create_instance(loom_plugin *p, const loom_component *comp,
                                        const loom_host *host, const void *config, void **self,
                                        loom_error *err);
/* [engine] ops->destroy(self) and drop the reference (may dlclose p when the
 * registry is already gone). */
void        loom_plugin_destroy_instance(loom_plugin *p, const loom_component *comp, void *self);

#endif
