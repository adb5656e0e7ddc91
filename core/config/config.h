/*
 * core/config/config.h — YAML pipeline files as a typed tree with source
 * locations, `include:` of a base file, `--set a.b=value` overrides, and
 * binding a section to a component's declared parameter table.
 *
 * Errors are collected, not thrown: a loom_diag gathers every problem (with
 * file:line:column, 1-based) so the user sees all of them at once.
 *
 * YAML accepted: one document; an empty document is an empty map. Anchors
 * and aliases work (an alias is a deep copy of the anchored node), as does
 * the `<<` merge key. Rejected with a position: duplicate keys (the message
 * names both positions), non-scalar keys, a second document, NUL bytes.
 * A plain `~`, `null`, `Null`, `NULL` or empty value is LOOM_CFG_NULL;
 * quoted text never is.
 *
 * Trees are not shared between threads; separate trees are independent.
 */
#ifndef LOOM_CORE_CONFIG_H
#define LOOM_CORE_CONFIG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"

typedef enum loom_cfg_type {
    LOOM_CFG_SCALAR = 1, /* text as written; typed when bound            */
    LOOM_CFG_MAP = 2,    /* ordered key -> node                          */
    LOOM_CFG_SEQ = 3,    /* ordered list                                 */
    LOOM_CFG_NULL = 4,   /* `~`, `null` or empty value                   */
} loom_cfg_type;

/* Where a node came from. `file` is owned by the tree. line/col 1-based. */
typedef struct loom_cfg_mark {
    const char *file;
    int line;
    int col;
} loom_cfg_mark;

typedef struct loom_cfg_node loom_cfg_node;

/* ---- diagnostics ---------------------------------------------------- */

typedef struct loom_diag_entry {
    loom_cfg_mark mark;   /* file NULL when no location applies */
    char message[LOOM_ERROR_MSG_MAX];
} loom_diag_entry;

typedef struct loom_diag {
    int count;
    int capacity;
    loom_diag_entry *entries; /* heap, owned; free with loom_diag_free */
} loom_diag;

void loom_diag_init(loom_diag *d);
void loom_diag_free(loom_diag *d);
/* Append "file:line:col: message" (mark may be NULL). */
void loom_diag_add(loom_diag *d, const loom_cfg_mark *mark, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* va_list form of loom_diag_add. Entries own a copy of mark->file. */
void loom_diag_vadd(loom_diag *d, const loom_cfg_mark *mark, const char *fmt, va_list ap);
/* Location text without a trailing colon: "file:line:col", "file:line",
 * "file (argument N)" for --set values (line 0, col = argument index),
 * "file", or "" when mark or its file is NULL. */
void loom_cfg_mark_format(const loom_cfg_mark *mark, char *buf, size_t size);
/* Print every entry, one per line, as "file:line:col: error: message". */
void loom_diag_print(const loom_diag *d, void *file /* FILE* */);
/* Summarise into err: first entry plus "(and N more)"; returns code. */
loom_status loom_diag_to_error(const loom_diag *d, loom_status code, loom_error *err);

/* ---- loading --------------------------------------------------------- */

/* Parse `path` (YAML, one document whose root is a map). A top-level key
 * `include: base.yaml` (relative to the including file; may be a list)
 * loads the base first and deep-merges this file over it (maps merge key by
 * key; scalars and sequences replace). Include cycles are an error.
 * Returns NULL and fills diag on any error (syntax errors carry the
 * position libyaml reports, converted to 1-based). */
loom_cfg_node *loom_cfg_load_file(const char *path, loom_diag *diag);
/* Same from `len` bytes in memory (need not be NUL-terminated; a NUL in
 * them is an error), under the same limits as a file (nesting, nodes,
 * include depth, files and bytes: docs/security.md). `name` (NULL:
 * "<buffer>") is the file name in marks. `include:` names are relative to
 * include_dir ("" or "." for the current directory); include_dir NULL turns
 * includes off — an `include:` is then an error — so untrusted text reads no
 * file (what tests/fuzz uses). loom_cfg_load_file reads the file and parses
 * it the same way. */
loom_cfg_node *loom_cfg_load_buffer(const char *text, size_t len, const char *name, const char *include_dir,
                                    loom_diag *diag);
/* A NUL-terminated string; includes relative to the current directory. */
loom_cfg_node *loom_cfg_load_string(const char *text, const char *name, loom_diag *diag);
void loom_cfg_free(loom_cfg_node *root);
/* An empty root map (e.g. a pipeline built only from --set overrides);
 * `file` (may be NULL) names it in marks. NULL on out of memory. */
loom_cfg_node *loom_cfg_new_map(const char *file);

/* Apply "a.b.c=value" (value parsed as a YAML scalar or flow value, e.g.
 * `[1,2]`); creates missing maps. Mark of the new node: file
 * "<command line>", line 0, col = argument index. The value replaces what
 * was there (a map value replaces a map; it is not merged). A null on the
 * way (`section:` left empty) becomes a map; a scalar or list on the way is
 * an error. LOOM_ERR_INVALID for a malformed assignment, an unparsable
 * value or a non-map on the path (the tree is then unchanged). */
loom_status loom_cfg_set_override(loom_cfg_node *root, const char *assignment, int arg_index,
                                  loom_diag *diag);

/* ---- reading --------------------------------------------------------- */

loom_cfg_type loom_cfg_type_of(const loom_cfg_node *n);
const loom_cfg_mark *loom_cfg_mark_of(const loom_cfg_node *n);
/* Map lookup by key; NULL when absent or n is not a map. */
loom_cfg_node *loom_cfg_get(const loom_cfg_node *map, const char *key);
/* Dotted path lookup "backend.device". */
loom_cfg_node *loom_cfg_get_path(const loom_cfg_node *root, const char *dotted);
/* Map/seq size and entries (key is NULL for seq items). */
int loom_cfg_size(const loom_cfg_node *n);
loom_cfg_node *loom_cfg_child(const loom_cfg_node *n, int i, const char **key);
/* Where the key of map entry i was written (NULL when n is not a map or i
 * is out of range); for "unknown section" style errors. */
const loom_cfg_mark *loom_cfg_key_mark(const loom_cfg_node *n, int i);
/* "scalar", "map", "list", "null". */
const char *loom_cfg_type_name(loom_cfg_type t);
/* Scalar text (NULL when not a scalar). */
const char *loom_cfg_scalar(const loom_cfg_node *n);

/* Typed scalar readers: false (and a diag entry naming the key, the expected
 * type and the position) when the node is not of that type. */
bool loom_cfg_as_bool(const loom_cfg_node *n, const char *key_path, bool *out, loom_diag *diag);
bool loom_cfg_as_int(const loom_cfg_node *n, const char *key_path, int64_t *out, loom_diag *diag);
bool loom_cfg_as_double(const loom_cfg_node *n, const char *key_path, double *out, loom_diag *diag);

/* ---- binding to a declared parameter table ----------------------------- */

/* Fill `config` (config_size bytes, zeroed first) from the map `section`
 * according to `params`: defaults for absent keys, a diag entry for each
 * unknown key (listing the valid ones), wrong type, out-of-range value,
 * unknown enum choice (listing the choices) and missing required key.
 * Keys named in `ignore` (NULL-terminated, e.g. {"plugin", NULL}) are
 * skipped. `section_path` (e.g. "scheduler") prefixes key names in
 * messages. `section` may be NULL (all defaults). A key whose value is
 * null counts as absent (its default applies). Returns true when no
 * error was added. */
bool loom_cfg_bind(const loom_cfg_node *section, const char *section_path,
                   const loom_param *params, const char *const *ignore, void *config,
                   size_t config_size, loom_diag *diag);
/* Bytes a parameter of type t takes in a config struct (0: unknown type):
 * what the binder writes at its offset, and what the registry checks fits
 * when it loads a plugin's table. */
size_t loom_param_size(loom_param_type t);

/* Print the tree as YAML (block style, keys in order) to a FILE*; quoting
 * as written is kept, and the output re-parses to the same tree. */
void loom_cfg_print(const loom_cfg_node *root, void *file);

#endif
