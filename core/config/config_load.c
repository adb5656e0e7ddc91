/*
 * core/config/config_load.c — YAML text to loom_cfg_node trees: libyaml's
 * event parser driven by a small recursive descent, then `include:`
 * resolution (deep merge over the included bases) and `--set` overrides.
 *
 * What the parser accepts beyond plain maps, lists and scalars:
 *   - anchors and aliases (an alias is a deep copy of the anchored node, so
 *     the tree stays a tree; total size is capped against alias bombs);
 *   - the `<<` merge key (a map or a list of maps; explicit keys win, then
 *     earlier merged maps win over later ones);
 *   - an empty document, which is an empty map.
 * What it rejects, with a position: duplicate keys (both positions), keys
 * that are not scalars, several documents in one file, NUL characters,
 * nesting deeper than CFG_MAX_DEPTH.
 *
 * Marks: libyaml counts lines and columns from zero; we store them 1-based.
 */
#include "config/config_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "util/util.h"

#define CFG_MAX_DEPTH 200       /* nesting levels; recursion is bounded by this   */
#define CFG_MAX_NODES 1000000   /* nodes per parse, aliases expanded              */
#define CFG_MAX_FILE (64u << 20) /* bytes; a pipeline file is a few KiB           */
#define CFG_MAX_INCLUDE_DEPTH 32 /* levels of include: below the C stack's limit   */
#define CFG_MAX_INCLUDE_FILES 256 /* files loaded for one configuration           */

typedef struct cfg_parser {
    yaml_parser_t yp;
    const char *file;            /* name used in marks                           */
    const unsigned char *text;   /* the input (for offsets of reader errors)     */
    size_t len;                  /* bytes of text                                */
    loom_diag *diag;
    int errors;                  /* diag entries added by this parse             */
    bool fatal;                  /* stop: syntax error, OOM or a limit           */
    int arg_index;               /* >= 0: a --set value; marks point at the arg  */
    const char *assignment;      /* the --set argument, for messages             */
    loom_cfg_node *anchors;      /* map: anchor name -> private deep copy (owned) */
    size_t nodes;                /* created so far, compared to CFG_MAX_NODES    */
} cfg_parser;

static void perr(cfg_parser *p, const loom_cfg_mark *m, const char *fmt, ...)
    LOOM_PRINTF(3, 4);

static void perr(cfg_parser *p, const loom_cfg_mark *m, const char *fmt, ...) {
    char msg[LOOM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->assignment)
        loom_diag_add(p->diag, m, "in --set '%s': %s", p->assignment, msg);
    else
        loom_diag_add(p->diag, m, "%s", msg);
    p->errors++;
}

static void oom(cfg_parser *p, const loom_cfg_mark *m) {
    perr(p, m, "out of memory while reading the configuration");
    p->fatal = true;
}

static loom_cfg_mark mark_at(const cfg_parser *p, yaml_mark_t ym) {
    loom_cfg_mark m;
    if (p->arg_index >= 0) {
        m.file = LOOM_CFG_CMDLINE_FILE;
        m.line = 0;
        m.col = p->arg_index;
    } else {
        m.file = p->file;
        m.line = (int)ym.line + 1;
        m.col = (int)ym.column + 1;
    }
    return m;
}

/* Line and column of a byte offset, for reader errors (which carry none). */
static loom_cfg_mark mark_at_offset(const cfg_parser *p, size_t off) {
    yaml_mark_t ym = {0};
    for (size_t i = 0; i < off && i < p->len; i++) {
        if (p->text[i] == '\n') {
            ym.line++;
            ym.column = 0;
        } else {
            ym.column++;
        }
    }
    return mark_at(p, ym);
}

static void syntax_error(cfg_parser *p) {
    yaml_parser_t *y = &p->yp;
    p->fatal = true;
    if (y->error == YAML_MEMORY_ERROR) {
        oom(p, NULL);
        return;
    }
    if (y->error == YAML_READER_ERROR) {
        loom_cfg_mark m = mark_at_offset(p, y->problem_offset);
        if (y->problem_value != -1)
            perr(p, &m, "%s (byte 0x%02x); save the file as UTF-8", y->problem,
                 (unsigned)y->problem_value & 0xffu);
        else
            perr(p, &m, "%s; save the file as UTF-8", y->problem);
        return;
    }
    loom_cfg_mark m = mark_at(p, y->problem_mark);
    const char *problem = y->problem ? y->problem : "syntax error";
    if (y->context) {
        loom_cfg_mark c = mark_at(p, y->context_mark);
        if (c.line > 0 && (c.line != m.line || c.col != m.col))
            perr(p, &m, "%s (%s at line %d, column %d)", problem, y->context, c.line, c.col);
        else
            perr(p, &m, "%s (%s)", problem, y->context);
    } else {
        perr(p, &m, "%s", problem);
    }
}

static bool next_event(cfg_parser *p, yaml_event_t *ev) {
    if (!yaml_parser_parse(&p->yp, ev)) {
        syntax_error(p);
        return false;
    }
    return true;
}

static bool budget(cfg_parser *p, size_t more, const loom_cfg_mark *m) {
    p->nodes += more;
    if (p->nodes <= CFG_MAX_NODES) return true;
    perr(p, m, "configuration has more than %d nodes (aliases expanded); is an alias "
               "repeated recursively?", CFG_MAX_NODES);
    p->fatal = true;
    return false;
}

static void anchors_free(cfg_parser *p) {
    loom_cfg_free(p->anchors);
    p->anchors = NULL;
}

/* Remember a copy of `n` under `name`; a later anchor of the same name wins.
 * The anchors are a map node, so lookups are hashed (a file may hold many). */
static void anchor_add(cfg_parser *p, const char *name, const loom_cfg_node *n) {
    loom_cfg_node *copy = loom_cfg__clone(n);
    if (!copy || (!p->anchors && !(p->anchors = loom_cfg__node_new(LOOM_CFG_MAP, NULL)))) goto nomem;
    int i = loom_cfg__find(p->anchors, name);
    if (i >= 0) {
        loom_cfg_free(p->anchors->items[i].value);
        p->anchors->items[i].value = copy;
        return;
    }
    if (loom_cfg__append(p->anchors, name, NULL, copy)) return;
nomem:
    loom_cfg_free(copy);
    oom(p, &n->mark);
}

static loom_cfg_node *alias_resolve(cfg_parser *p, const char *name, const loom_cfg_mark *m) {
    int i = loom_cfg__find(p->anchors, name);
    if (i >= 0) {
        const loom_cfg_node *a = p->anchors->items[i].value;
        if (!budget(p, loom_cfg__count_nodes(a), m)) return NULL;
        loom_cfg_node *c = loom_cfg__clone(a);
        if (!c) oom(p, m);
        return c;
    }
    perr(p, m, "alias '*%s' refers to no anchor defined before it (define '&%s' first)", name,
         name);
    return NULL;
}

static loom_cfg_node *make_scalar(cfg_parser *p, const yaml_event_t *ev, const loom_cfg_mark *m) {
    const char *v = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    if (memchr(v, '\0', len)) {
        perr(p, m, "text contains a NUL character, which configuration values cannot hold");
        return NULL;
    }
    const char *tag = (const char *)ev->data.scalar.tag;
    bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    /* Plain "~", "null", "" (or "!!null ...") is a null; quoted or tagged
     * text never is. */
    bool is_null = plain && (tag ? strcmp(tag, YAML_NULL_TAG) == 0 : loom_cfg__is_null_text(v));
    loom_cfg_node *n = loom_cfg__node_new(is_null ? LOOM_CFG_NULL : LOOM_CFG_SCALAR, m);
    if (!n || !(n->text = loom_strdup(v))) {
        loom_cfg_free(n);
        oom(p, m);
        return NULL;
    }
    n->style = ev->data.scalar.style;
    /* "!!str null" is text that must be quoted when printed. */
    if (!is_null && plain && tag)
        n->style = YAML_DOUBLE_QUOTED_SCALAR_STYLE;
    return n;
}

static loom_cfg_node *parse_node(cfg_parser *p, yaml_event_t *ev, int depth);

static loom_cfg_node *parse_seq(cfg_parser *p, const loom_cfg_mark *m, int depth) {
    loom_cfg_node *n = loom_cfg__node_new(LOOM_CFG_SEQ, m);
    if (!n) {
        oom(p, m);
        return NULL;
    }
    for (;;) {
        yaml_event_t ev;
        if (!next_event(p, &ev)) goto fail;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        loom_cfg_node *child = parse_node(p, &ev, depth + 1);
        if (p->fatal) {
            loom_cfg_free(child);
            goto fail;
        }
        if (!child) continue; /* reported; keep reading to find more errors */
        if (!loom_cfg__append(n, NULL, NULL, child)) {
            loom_cfg_free(child);
            oom(p, m);
            goto fail;
        }
    }
    return n;
fail:
    loom_cfg_free(n);
    return NULL;
}

/* Apply the `<<` merge sources collected for map n: keys not written
 * explicitly are copied in, earlier sources first so they win. */
static void apply_merges(cfg_parser *p, loom_cfg_node *n, loom_cfg_node **srcs, int n_srcs) {
    for (int s = 0; s < n_srcs && !p->fatal; s++) {
        loom_cfg_node *src = srcs[s];
        for (int i = 0; i < src->count; i++) {
            if (loom_cfg__find(n, src->items[i].key) >= 0) continue;
            loom_cfg_node *v = loom_cfg__clone(src->items[i].value);
            if (!v || !loom_cfg__append(n, src->items[i].key, &src->items[i].key_mark, v)) {
                loom_cfg_free(v);
                oom(p, &src->mark);
                return;
            }
        }
    }
}

/* A map key as read: its text (owned) and where it stands. */
typedef struct map_key {
    char *text;            /* NULL when refused                         */
    loom_cfg_mark mark;
    bool ok;               /* false: refused and reported              */
    bool is_merge;         /* the plain `<<` merge key                  */
} map_key;

/* Read the key that *kev starts; always deletes *kev. A key that is not
 * usable text is consumed whole (so parsing goes on), reported and marked
 * not ok. false on a fatal error. */
static bool parse_key(cfg_parser *p, yaml_event_t *kev, int depth, map_key *k) {
    *k = (map_key){.mark = mark_at(p, kev->start_mark), .ok = true};
    if (kev->type == YAML_SCALAR_EVENT) {
        const char *kv = (const char *)kev->data.scalar.value;
        if (kev->data.scalar.length == 0) {
            perr(p, &k->mark, "empty key; write a name before ':'");
            k->ok = false;
        } else if (memchr(kv, '\0', kev->data.scalar.length)) {
            perr(p, &k->mark, "key contains a NUL character");
            k->ok = false;
        } else if (!(k->text = loom_strdup(kv))) {
            yaml_event_delete(kev);
            oom(p, &k->mark);
            return false;
        }
        k->is_merge = k->ok && kev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp(kv, "<<") == 0;
        yaml_event_delete(kev);
        return true;
    }
    bool alias = kev->type == YAML_ALIAS_EVENT;
    if (alias) {
        yaml_event_delete(kev);
    } else {
        loom_cfg_node *junk = parse_node(p, kev, depth + 1);
        loom_cfg_free(junk);
        if (p->fatal) return false;
    }
    perr(p, &k->mark, alias ? "an alias cannot be used as a key; write the key out"
                            : "keys must be plain text, not a map or a list");
    k->ok = false;
    return true;
}

/* `<<: *base` or `<<: [*a, *b]`: keep the value (a map or a list of maps)
 * in *merges for the end of the map; anything else is reported and freed.
 * Takes value. false on a fatal error (reported at m, the map's mark). */
static bool keep_merge(cfg_parser *p, const loom_cfg_mark *m, loom_cfg_node ***merges, int *n_merges,
                       loom_cfg_node *value) {
    int k = value->type == LOOM_CFG_SEQ ? value->count : 1;
    bool shape_ok = value->type == LOOM_CFG_MAP || value->type == LOOM_CFG_SEQ;
    for (int i = 0; value->type == LOOM_CFG_SEQ && i < value->count; i++)
        if (value->items[i].value->type != LOOM_CFG_MAP) shape_ok = false;
    if (!shape_ok) {
        char got[96];
        loom_cfg__describe(value, got, sizeof got);
        perr(p, &value->mark, "merge key '<<' needs a map or a list of maps, got %s", got);
        loom_cfg_free(value);
        return true;
    }
    loom_cfg_node **mg = realloc(*merges, (size_t)(*n_merges + k + 1) * sizeof *mg);
    if (!mg) {
        loom_cfg_free(value);
        oom(p, m);
        return false;
    }
    *merges = mg;
    /* Keep `value` itself so the sub-maps stay alive; freed at the end. */
    mg[(*n_merges)++] = value;
    return true;
}

/* Add key: value to map n; a duplicate key is reported with both places.
 * Takes value. false on a fatal error. */
static bool add_entry(cfg_parser *p, loom_cfg_node *n, const map_key *k, loom_cfg_node *value) {
    int first = loom_cfg__find(n, k->text);
    if (first >= 0) {
        char where[512];
        loom_cfg_mark_format(&n->items[first].key_mark, where, sizeof where);
        perr(p, &k->mark, "duplicate key '%s' (first defined at %s); remove one of them", k->text, where);
        loom_cfg_free(value);
        return true;
    }
    if (!loom_cfg__append(n, k->text, &k->mark, value)) {
        loom_cfg_free(value);
        oom(p, &k->mark);
        return false;
    }
    return true;
}

/* Expand the merge sources: each kept value is a map or a list of maps. */
static void expand_merges(cfg_parser *p, loom_cfg_node *n, loom_cfg_node **merges, int n_merges) {
    for (int s = 0; s < n_merges && !p->fatal; s++) {
        loom_cfg_node *v = merges[s];
        if (v->type == LOOM_CFG_MAP) {
            apply_merges(p, n, &v, 1);
        } else {
            for (int i = 0; i < v->count && !p->fatal; i++)
                apply_merges(p, n, &v->items[i].value, 1);
        }
    }
}

static void free_merges(loom_cfg_node **merges, int n_merges) {
    for (int s = 0; s < n_merges; s++) loom_cfg_free(merges[s]);
    free(merges);
}

/* Key/value pairs up to the end of the map; bad keys and values are
 * reported and skipped, `<<` merges applied last. */
static loom_cfg_node *parse_map(cfg_parser *p, const loom_cfg_mark *m, int depth) {
    loom_cfg_node *n = loom_cfg__node_new(LOOM_CFG_MAP, m);
    loom_cfg_node **merges = NULL; /* maps named by `<<`, in order */
    int n_merges = 0;
    if (!n) {
        oom(p, m);
        return NULL;
    }
    for (;;) {
        yaml_event_t kev, vev;
        map_key k;
        if (!next_event(p, &kev)) goto free_map;
        if (kev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&kev);
            break;
        }
        if (!parse_key(p, &kev, depth, &k)) goto free_map;
        if (!next_event(p, &vev)) {
            free(k.text);
            goto free_map;
        }
        loom_cfg_node *value = parse_node(p, &vev, depth + 1);
        if (p->fatal || !k.ok || !value) {
            free(k.text);
            loom_cfg_free(value);
            if (p->fatal) goto free_map;
            continue;
        }
        bool go_on = k.is_merge ? keep_merge(p, m, &merges, &n_merges, value) : add_entry(p, n, &k, value);
        free(k.text);
        if (!go_on) goto free_map;
    }
    expand_merges(p, n, merges, n_merges);
    if (p->fatal) goto free_map;
    free_merges(merges, n_merges);
    return n;
free_map:
    free_merges(merges, n_merges);
    loom_cfg_free(n);
    return NULL;
}

/* Build the node that starts with *ev; always deletes *ev. NULL with an
 * error reported (p->fatal tells whether parsing can go on). */
static loom_cfg_node *parse_node(cfg_parser *p, yaml_event_t *ev, int depth) {
    loom_cfg_node *n = NULL;
    loom_cfg_mark m = mark_at(p, ev->start_mark);
    const char *anchor = NULL;
    if (depth > CFG_MAX_DEPTH) {
        perr(p, &m, "nested more than %d levels deep", CFG_MAX_DEPTH);
        p->fatal = true;
        goto done;
    }
    if (!budget(p, 1, &m)) goto done;
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        n = alias_resolve(p, (const char *)ev->data.alias.anchor, &m);
        break;
    case YAML_SCALAR_EVENT:
        anchor = (const char *)ev->data.scalar.anchor;
        n = make_scalar(p, ev, &m);
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = (const char *)ev->data.sequence_start.anchor;
        n = parse_seq(p, &m, depth);
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = (const char *)ev->data.mapping_start.anchor;
        n = parse_map(p, &m, depth);
        break;
    default:
        perr(p, &m, "internal error: unexpected YAML event %d", (int)ev->type);
        p->fatal = true;
        break;
    }
    /* Registered after the node is complete, so a node cannot alias itself. */
    if (n && anchor && !p->fatal) anchor_add(p, anchor, n);
done:
    yaml_event_delete(ev);
    return n;
}

/* Parse one document. Empty input gives a NULL-type node. */
static loom_cfg_node *parse_document(cfg_parser *p) {
    yaml_event_t ev;
    loom_cfg_node *root = NULL;
    if (!next_event(p, &ev)) return NULL; /* STREAM_START */
    yaml_event_delete(&ev);
    if (!next_event(p, &ev)) return NULL;
    if (ev.type == YAML_STREAM_END_EVENT) {
        loom_cfg_mark m = mark_at(p, ev.start_mark);
        m.line = m.line > 0 ? 1 : 0;
        m.col = m.line > 0 ? 1 : m.col;
        yaml_event_delete(&ev);
        root = loom_cfg__node_new(LOOM_CFG_NULL, &m);
        if (!root) oom(p, &m);
        return root;
    }
    yaml_event_delete(&ev); /* DOCUMENT_START */
    if (!next_event(p, &ev)) return NULL;
    root = parse_node(p, &ev, 0);
    if (p->fatal) goto fail;
    if (!next_event(p, &ev)) goto fail; /* DOCUMENT_END */
    yaml_event_delete(&ev);
    if (!next_event(p, &ev)) goto fail;
    if (ev.type == YAML_DOCUMENT_START_EVENT) {
        loom_cfg_mark m = mark_at(p, ev.start_mark);
        perr(p, &m, "a second YAML document ('---') is not supported; put everything in one "
                    "document or use 'include:'");
        yaml_event_delete(&ev);
        goto fail;
    }
    yaml_event_delete(&ev); /* STREAM_END */
    return root;
fail:
    loom_cfg_free(root);
    return NULL;
}

/* Parse `len` bytes of YAML. arg_index >= 0 marks every node as coming from
 * that --set argument. Returns NULL when any error was reported. */
static loom_cfg_node *parse_text(const char *text, size_t len, const char *file, int arg_index,
                                 const char *assignment, loom_diag *diag) {
    cfg_parser p;
    memset(&p, 0, sizeof p);
    p.file = file;
    p.text = (const unsigned char *)text;
    p.len = len;
    p.diag = diag;
    p.arg_index = arg_index;
    p.assignment = assignment;
    if (!yaml_parser_initialize(&p.yp)) {
        oom(&p, NULL);
        return NULL;
    }
    yaml_parser_set_input_string(&p.yp, (const unsigned char *)text, len);
    loom_cfg_node *root = parse_document(&p);
    if (p.errors > 0) {
        loom_cfg_free(root);
        root = NULL;
    }
    anchors_free(&p);
    yaml_parser_delete(&p.yp);
    return root;
}

/* Root of a pipeline file: a map; an empty document counts as an empty one. */
static loom_cfg_node *check_root(loom_cfg_node *root, loom_diag *diag) {
    if (!root) return NULL;
    if (root->type == LOOM_CFG_NULL) {
        root->type = LOOM_CFG_MAP;
        free(root->text);
        root->text = NULL;
        root->style = 0;
        return root;
    }
    if (root->type != LOOM_CFG_MAP) {
        loom_diag_add(diag, &root->mark,
                      "the top level must be a map of sections ('key: value' lines), got %s",
                      root->type == LOOM_CFG_SEQ ? "a list" : "a single value");
        loom_cfg_free(root);
        return NULL;
    }
    return root;
}

/* ---------------------------------------------------------------- includes */

/* What one configuration has loaded so far, against the include limits
 * (a file including another many times multiplies the work). */
typedef struct include_budget {
    int files;    /* files loaded, CFG_MAX_INCLUDE_FILES at most          */
    size_t bytes; /* their bytes together, CFG_MAX_FILE at most           */
} include_budget;

/* One file on the current include chain, innermost last. */
typedef struct include_frame {
    const char *real;                   /* realpath; NULL for a string  */
    const char *shown;                  /* name as used in marks        */
    const struct include_frame *parent; /* the file that included this  */
    const char *rel;                    /* includes are relative to its
                                           directory; NULL: includes off */
    int depth;                          /* 0 for the top file           */
    include_budget *budget;             /* shared along the whole load  */
} include_frame;

static loom_cfg_node *load_path(const char *shown, const loom_cfg_mark *from,
                                const include_frame *parent, include_budget *budget, loom_diag *diag);

/* "dir/of/including/" + name, unless name is absolute or there is no dir. */
static char *include_path(const char *including, const char *name) {
    const char *slash = including ? strrchr(including, '/') : NULL;
    if (name[0] == '/' || !slash) return loom_strdup(name);
    size_t dl = (size_t)(slash - including) + 1, nl = strlen(name);
    char *s = malloc(dl + nl + 1);
    if (!s) return NULL;
    memcpy(s, including, dl);
    memcpy(s + dl, name, nl + 1);
    return s;
}

/* Load every file named by root's `include:` (relative to self->rel's
 * directory), merge them in order, merge root over the result and drop the
 * key. Consumes root. */
static loom_cfg_node *resolve_includes(loom_cfg_node *root, const include_frame *self, loom_diag *diag) {
    int idx = loom_cfg__find(root, "include");
    if (idx < 0) return root;
    loom_cfg_node *inc = root->items[idx].value;
    if (!self->rel) { /* text from a buffer whose caller reads no files */
        loom_diag_add(diag, &inc->mark, "'include' is not allowed here: %s is read without access to files",
                      self->shown);
        loom_cfg_free(root);
        return NULL;
    }
    loom_cfg_node *base = NULL;
    bool ok = true;
    int n = inc->type == LOOM_CFG_SEQ ? inc->count : inc->type == LOOM_CFG_NULL ? 0 : 1;
    if (inc->type == LOOM_CFG_MAP) {
        loom_diag_add(diag, &inc->mark,
                      "'include' takes a file name or a list of file names, got a map");
        ok = false;
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        loom_cfg_node *item = inc->type == LOOM_CFG_SEQ ? inc->items[i].value : inc;
        if (item->type != LOOM_CFG_SCALAR) {
            char got[96];
            loom_cfg__describe(item, got, sizeof got);
            loom_diag_add(diag, &item->mark, "'include' entries must be file names, got %s", got);
            ok = false;
            continue;
        }
        char *path = include_path(self->rel, item->text);
        if (!path) {
            loom_diag_add(diag, &item->mark, "out of memory");
            ok = false;
            break;
        }
        loom_cfg_node *sub = load_path(path, &item->mark, self, self->budget, diag);
        free(path);
        if (!sub) {
            ok = false;
            continue;
        }
        if (!base) {
            base = sub;
        } else if (!loom_cfg__merge(base, sub)) {
            loom_diag_add(diag, &item->mark, "out of memory while merging includes");
            ok = false;
        }
    }
    loom_cfg__remove(root, idx);
    if (!ok) {
        loom_cfg_free(base);
        loom_cfg_free(root);
        return NULL;
    }
    if (!base) return root;
    loom_cfg_mark rm = root->mark; /* root node goes away in the merge */
    char *rmfile = loom_strdup(rm.file);
    if (!loom_cfg__merge(base, root)) {
        rm.file = rmfile;
        loom_diag_add(diag, &rm, "out of memory while merging includes");
        free(rmfile);
        loom_cfg_free(base);
        return NULL;
    }
    free(rmfile);
    return base;
}

static char *read_all(const char *path, size_t *len, int *err) {
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    *err = 0;
    if (fd < 0) goto fail;
    if (fstat(fd, &st) != 0) goto fail;
    if (S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        goto fail;
    }
    if (st.st_size > (off_t)CFG_MAX_FILE) {
        errno = EFBIG;
        goto fail;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    buf = malloc(cap);
    if (!buf) goto fail;
    for (;;) {
        if (n + 1 >= cap) { /* file grew, or a pipe reporting size 0 */
            if (cap > CFG_MAX_FILE) {
                errno = EFBIG;
                goto fail;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) goto fail;
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto fail;
        if (r == 0) break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    close(fd);
    *len = n;
    return buf;
fail:
    *err = errno ? errno : ENOMEM;
    free(buf);
    if (fd >= 0) close(fd);
    return NULL;
}

/* Human chain "a.yaml -> b.yaml -> a.yaml" for a cycle closing at `again`. */
static void cycle_chain(const include_frame *f, const char *again, char *buf, size_t size) {
    const include_frame *stack[64];
    int n = 0;
    for (; f && n < 64; f = f->parent) stack[n++] = f;
    size_t o = 0;
    buf[0] = '\0';
    for (int i = n - 1; i >= 0 && o < size; i--)
        o += (size_t)snprintf(buf + o, size - o, "%s -> ", stack[i]->shown);
    if (o < size) snprintf(buf + o, size - o, "%s", again);
}

/* Would loading `shown` (included at `at` by parent) pass the include
 * limits? Counts it; reports and returns false when not. */
static bool include_allowed(const char *shown, const loom_cfg_mark *at, const include_frame *parent,
                            include_budget *budget, loom_diag *diag) {
    if (parent && parent->depth + 1 > CFG_MAX_INCLUDE_DEPTH) {
        loom_diag_add(diag, at, "cannot include '%s': includes nest more than %d levels deep (is there a "
                      "runaway chain of includes?)", shown, CFG_MAX_INCLUDE_DEPTH);
        return false;
    }
    if (++budget->files > CFG_MAX_INCLUDE_FILES) {
        loom_diag_add(diag, at, "cannot include '%s': the configuration loads more than %d files "
                      "(a file included many times counts each time)", shown, CFG_MAX_INCLUDE_FILES);
        return false;
    }
    return true;
}

/* A pipe, socket or device (e.g. /dev/stdin on a pipe, whose /proc link
 * names no file, so realpath fails): read by its own name, once, with no
 * include-cycle check (it cannot be read again anyway). */
static bool is_stream(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode);
}

/* One file's (or buffer's) text, loaded at `at`: counted against the
 * byte budget, parsed, its root checked and its includes resolved. What
 * loom_cfg_load_file and loom_cfg_load_buffer share. */
static loom_cfg_node *load_text(const char *text, size_t len, const loom_cfg_mark *at, const include_frame *self,
                                loom_diag *diag) {
    if ((self->budget->bytes += len) > CFG_MAX_FILE) {
        loom_diag_add(diag, at, "cannot load '%s': the configuration's files total more than %u bytes", self->shown,
                      CFG_MAX_FILE);
        return NULL;
    }
    loom_cfg_node *root = check_root(parse_text(text, len, self->shown, -1, NULL, diag), diag);
    return root ? resolve_includes(root, self, diag) : NULL;
}

static loom_cfg_node *load_path(const char *shown, const loom_cfg_mark *from,
                                const include_frame *parent, include_budget *budget, loom_diag *diag) {
    loom_cfg_mark file_mark = {shown, 0, 0};
    const loom_cfg_mark *at = from ? from : &file_mark;
    char *real = NULL, *text = NULL;
    loom_cfg_node *root = NULL;
    size_t len = 0;
    int err = 0;

    if (!include_allowed(shown, at, parent, budget, diag)) return NULL;

    real = realpath(shown, NULL);
    if (!real && !is_stream(shown)) {
        err = errno;
        goto cannot_read;
    }
    for (const include_frame *f = parent; f && real; f = f->parent) {
        if (f->real && strcmp(f->real, real) == 0) {
            char chain[LOOM_ERROR_MSG_MAX];
            cycle_chain(parent, shown, chain, sizeof chain);
            loom_diag_add(diag, at, "include cycle: %s; remove one of these includes", chain);
            goto done;
        }
    }
    text = read_all(real ? real : shown, &len, &err); /* a stream by its own name */
    if (!text) goto cannot_read;
    include_frame self = {real, shown, parent, shown, parent ? parent->depth + 1 : 0, budget};
    root = load_text(text, len, at, &self, diag);
    goto done;
cannot_read:
    if (from)
        loom_diag_add(diag, at, "cannot read included file '%s': %s", shown, strerror(err));
    else
        loom_diag_add(diag, at, "cannot read pipeline file: %s", strerror(err));
done:
    free(text);
    free(real);
    return root;
}

loom_cfg_node *loom_cfg_load_file(const char *path, loom_diag *diag) {
    if (!path || !*path) {
        loom_diag_add(diag, NULL, "no pipeline file given");
        return NULL;
    }
    include_budget budget = {0};
    return load_path(path, NULL, NULL, &budget, diag);
}

loom_cfg_node *loom_cfg_load_buffer(const char *text, size_t len, const char *name, const char *include_dir,
                                    loom_diag *diag) {
    if (!name) name = "<buffer>";
    loom_cfg_mark m = {name, 0, 0};
    if (!text && len) {
        loom_diag_add(diag, &m, "no configuration text given");
        return NULL;
    }
    include_budget budget = {0};
    if (!include_allowed(name, &m, NULL, &budget, diag)) return NULL;
    /* include_path takes the directory of its first argument: "dir/" + name */
    char *rel = NULL;
    if (include_dir) {
        size_t dl = strlen(include_dir);
        bool here = dl == 0 || strcmp(include_dir, ".") == 0; /* names as written, "./" not added */
        rel = malloc(dl + 2);
        if (!rel) {
            loom_diag_add(diag, &m, "out of memory");
            return NULL;
        }
        if (here) rel[0] = '\0';
        else snprintf(rel, dl + 2, "%s%s", include_dir, include_dir[dl - 1] == '/' ? "" : "/");
    }
    include_frame self = {NULL, name, NULL, rel, 0, &budget};
    loom_cfg_node *root = load_text(text ? text : "", len, &m, &self, diag);
    free(rel);
    return root;
}

loom_cfg_node *loom_cfg_load_string(const char *text, const char *name, loom_diag *diag) {
    if (!text) {
        loom_cfg_mark m = {name ? name : "<string>", 0, 0};
        loom_diag_add(diag, &m, "no configuration text given");
        return NULL;
    }
    return loom_cfg_load_buffer(text, strlen(text), name ? name : "<string>", ".", diag);
}

/* --------------------------------------------------------------- overrides */

/* Every dotted component must be non-empty: "a..b", ".a", "a." are typos. */
static bool key_path_ok(const char *key) {
    for (const char *c = key;; c++) {
        const char *dot = strchr(c, '.');
        if (*c == '.' || *c == '\0' || (dot && dot == c)) return false;
        if (!dot) return true;
        c = dot;
    }
}

/* The map under key comp of cur (at index i, -1 when absent; next is its
 * value): created when absent, made from a `section:` left empty in the
 * file. NULL when out of memory. */
static loom_cfg_node *open_map(loom_cfg_node *cur, int i, const char *comp, loom_cfg_node *next,
                               const loom_cfg_mark *cmd) {
    if (next && next->type == LOOM_CFG_NULL) {
        loom_cfg_node *m = loom_cfg__node_new(LOOM_CFG_MAP, &next->mark);
        if (!m) return NULL;
        loom_cfg_free(next);
        cur->items[i].value = m;
        return m;
    }
    if (next) return next;
    next = loom_cfg__node_new(LOOM_CFG_MAP, cmd);
    if (!next) return NULL;
    if (!loom_cfg__append(cur, comp, cmd, next)) {
        loom_cfg_free(next);
        return NULL;
    }
    return next;
}

/* Walk the dotted key from root to the parent map, creating maps on the way,
 * and put *value there (then *value is NULL). key is restored on return
 * except on a non-map, where it is cut after that component for the message. */
static loom_status set_at_path(loom_cfg_node *root, char *key, const char *assignment, const loom_cfg_mark *cmd,
                               loom_cfg_node **value, loom_diag *diag) {
    loom_cfg_node *cur = root;
    char *comp = key;
    for (;;) {
        char *dot = strchr(comp, '.');
        if (dot) *dot = '\0';
        int i = loom_cfg__find(cur, comp);
        if (!dot) {
            if (i >= 0) {
                loom_cfg_free(cur->items[i].value);
                cur->items[i].value = *value;
            } else if (!loom_cfg__append(cur, comp, cmd, *value)) {
                loom_diag_add(diag, cmd, "out of memory");
                return LOOM_ERR_NOMEM;
            }
            *value = NULL;
            return LOOM_OK;
        }
        loom_cfg_node *next = i >= 0 ? cur->items[i].value : NULL;
        if (next && next->type != LOOM_CFG_NULL && next->type != LOOM_CFG_MAP) {
            char where[512], what[96];
            loom_cfg_mark_format(&next->mark, where, sizeof where);
            loom_cfg__describe(next, what, sizeof what);
            loom_diag_add(diag, cmd,
                          "--set '%s': cannot set a key inside '%s', which is %s (set at %s), "
                          "not a map",
                          assignment, key, what, where);
            return LOOM_ERR_INVALID;
        }
        if (!(next = open_map(cur, i, comp, next, cmd))) {
            loom_diag_add(diag, cmd, "out of memory");
            return LOOM_ERR_NOMEM;
        }
        *dot = '.';
        cur = next;
        comp = dot + 1;
    }
}

loom_status loom_cfg_set_override(loom_cfg_node *root, const char *assignment, int arg_index,
                                  loom_diag *diag) {
    loom_cfg_mark cmd = {LOOM_CFG_CMDLINE_FILE, 0, arg_index > 0 ? arg_index : 0};
    loom_status st = LOOM_OK;
    loom_cfg_node *value = NULL;
    int p_errors = diag ? diag->count : 0;

    if (!assignment) {
        loom_diag_add(diag, &cmd, "--set needs an argument KEY.PATH=VALUE");
        return LOOM_ERR_INVALID;
    }
    if (!root || root->type != LOOM_CFG_MAP) {
        loom_diag_add(diag, &cmd, "cannot apply --set '%s': there is no configuration map",
                      assignment);
        return LOOM_ERR_INVALID;
    }
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        loom_diag_add(diag, &cmd,
                      "--set '%s': expected KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=64",
                      assignment);
        return LOOM_ERR_INVALID;
    }
    char *key = strndup(assignment, (size_t)(eq - assignment));
    if (!key) {
        loom_diag_add(diag, &cmd, "out of memory");
        return LOOM_ERR_NOMEM;
    }
    if (!key_path_ok(key)) {
        loom_diag_add(diag, &cmd,
                      "--set '%s': key path '%s' has an empty component; expected "
                      "KEY.PATH=VALUE, e.g. scheduler.max_num_seqs=64",
                      assignment, key);
        st = LOOM_ERR_INVALID;
        goto free_key;
    }
    const char *vtext = eq + 1;
    value = parse_text(vtext, strlen(vtext), LOOM_CFG_CMDLINE_FILE, cmd.col, assignment, diag);
    if (!value) {
        st = diag && diag->count > p_errors ? LOOM_ERR_INVALID : LOOM_ERR_NOMEM;
        goto free_key;
    }
    st = set_at_path(root, key, assignment, &cmd, &value, diag);
    loom_cfg_free(value);
free_key:
    free(key);
    return st;
}
