/*
 * core/config/config_tree.c — the in-memory tree: nodes, lookup, deep copy,
 * deep merge (for `include:`), and printing back to YAML through libyaml's
 * emitter (which decides quoting, so whatever we print re-parses to the same
 * tree). Parsing lives in config_load.c, typed reading in config_bind.c.
 */
#include "config/config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "util/util.h"

/* ------------------------------------------------------------------ nodes */

bool loom_cfg__mark_copy(loom_cfg_mark *dst, const loom_cfg_mark *src) {
    dst->file = NULL;
    dst->line = src ? src->line : 0;
    dst->col = src ? src->col : 0;
    if (!src || !src->file) return true;
    dst->file = loom_strdup(src->file);
    return dst->file != NULL;
}

void loom_cfg__mark_release(loom_cfg_mark *m) {
    free((char *)m->file);
    m->file = NULL;
}

loom_cfg_node *loom_cfg__node_new(loom_cfg_type t, const loom_cfg_mark *m) {
    loom_cfg_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = t;
    if (!loom_cfg__mark_copy(&n->mark, m)) {
        free(n);
        return NULL;
    }
    return n;
}

void loom_cfg_free(loom_cfg_node *n) {
    if (!n) return;
    for (int i = 0; i < n->count; i++) {
        free(n->items[i].key);
        loom_cfg__mark_release(&n->items[i].key_mark);
        loom_cfg_free(n->items[i].value);
    }
    free(n->items);
    free(n->index);
    free(n->text);
    loom_cfg__mark_release(&n->mark);
    free(n);
}

/* ------------------------------------------------------------ key index */

#define CFG_INDEX_MIN 16 /* maps smaller than this are scanned */

static uint32_t key_hash(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void index_put(int32_t *slots, uint32_t mask, const char *key, int32_t i) {
    uint32_t h = key_hash(key) & mask;
    while (slots[h] >= 0) h = (h + 1) & mask;
    slots[h] = i;
}

/* (Re)build n's index for its current keys; without one (small map, or no
 * memory) lookups scan, which is still correct. */
static void index_build(loom_cfg_node *n) {
    free(n->index);
    n->index = NULL;
    if (n->type != LOOM_CFG_MAP || n->count < CFG_INDEX_MIN) return;
    uint32_t size = 64;
    while (size < (uint32_t)n->count * 2u) size *= 2;
    int32_t *slots = malloc(size * sizeof *slots);
    if (!slots) return;
    memset(slots, 0xff, size * sizeof *slots);
    for (int i = 0; i < n->count; i++)
        if (n->items[i].key) index_put(slots, size - 1, n->items[i].key, i);
    n->index = slots;
    n->index_mask = size - 1;
}

/* Item i was just appended: index it (growing the table at half full). */
static void index_added(loom_cfg_node *n, int i) {
    if (!n->index || (uint32_t)n->count * 2u > n->index_mask + 1u) {
        index_build(n);
        return;
    }
    if (n->items[i].key) index_put(n->index, n->index_mask, n->items[i].key, i);
}

bool loom_cfg__append(loom_cfg_node *n, const char *key, const loom_cfg_mark *key_mark,
                      loom_cfg_node *value) {
    if (n->count == n->capacity) {
        int cap = n->capacity ? n->capacity * 2 : 4;
        loom_cfg_item *items = realloc(n->items, (size_t)cap * sizeof *items);
        if (!items) return false;
        n->items = items;
        n->capacity = cap;
    }
    loom_cfg_item it = {0};
    if (key && !(it.key = loom_strdup(key))) return false;
    if (!loom_cfg__mark_copy(&it.key_mark, key_mark)) {
        free(it.key);
        return false;
    }
    it.value = value;
    n->items[n->count++] = it;
    if (n->type == LOOM_CFG_MAP) index_added(n, n->count - 1);
    return true;
}

int loom_cfg__find(const loom_cfg_node *n, const char *key) {
    if (!n || n->type != LOOM_CFG_MAP || !key) return -1;
    if (n->index) {
        for (uint32_t h = key_hash(key) & n->index_mask; n->index[h] >= 0; h = (h + 1) & n->index_mask)
            if (strcmp(n->items[n->index[h]].key, key) == 0) return n->index[h];
        return -1;
    }
    for (int i = 0; i < n->count; i++)
        if (n->items[i].key && strcmp(n->items[i].key, key) == 0) return i;
    return -1;
}

void loom_cfg__remove(loom_cfg_node *n, int i) {
    if (!n || i < 0 || i >= n->count) return;
    free(n->items[i].key);
    loom_cfg__mark_release(&n->items[i].key_mark);
    loom_cfg_free(n->items[i].value);
    memmove(&n->items[i], &n->items[i + 1], (size_t)(n->count - i - 1) * sizeof n->items[0]);
    n->count--;
    if (n->index) index_build(n); /* indices after i moved */
}

loom_cfg_node *loom_cfg__clone(const loom_cfg_node *n) {
    if (!n) return NULL;
    loom_cfg_node *c = loom_cfg__node_new(n->type, &n->mark);
    if (!c) return NULL;
    c->style = n->style;
    if (n->text && !(c->text = loom_strdup(n->text))) goto fail;
    for (int i = 0; i < n->count; i++) {
        loom_cfg_node *v = loom_cfg__clone(n->items[i].value);
        if (!v) goto fail;
        if (!loom_cfg__append(c, n->items[i].key, &n->items[i].key_mark, v)) {
            loom_cfg_free(v);
            goto fail;
        }
    }
    return c;
fail:
    loom_cfg_free(c);
    return NULL;
}

size_t loom_cfg__count_nodes(const loom_cfg_node *n) {
    if (!n) return 0;
    size_t total = 1;
    for (int i = 0; i < n->count; i++) total += loom_cfg__count_nodes(n->items[i].value);
    return total;
}

bool loom_cfg__merge(loom_cfg_node *dst, loom_cfg_node *src) {
    bool ok = true;
    for (int i = 0; i < src->count; i++) {
        loom_cfg_item *s = &src->items[i];
        int j = loom_cfg__find(dst, s->key);
        if (j >= 0 && dst->items[j].value->type == LOOM_CFG_MAP && s->value->type == LOOM_CFG_MAP) {
            loom_cfg_node *sub = s->value;
            s->value = NULL;
            if (!loom_cfg__merge(dst->items[j].value, sub)) ok = false;
        } else if (j >= 0) {
            /* Replace the value; the key now points where the override was written. */
            loom_cfg_free(dst->items[j].value);
            dst->items[j].value = s->value;
            s->value = NULL;
            loom_cfg__mark_release(&dst->items[j].key_mark);
            dst->items[j].key_mark = s->key_mark;
            s->key_mark.file = NULL;
        } else if (loom_cfg__append(dst, s->key, &s->key_mark, s->value)) {
            s->value = NULL;
        } else {
            ok = false;
        }
    }
    loom_cfg_free(src); /* frees whatever was not moved */
    return ok;
}

/* ---------------------------------------------------------------- reading */

loom_cfg_type loom_cfg_type_of(const loom_cfg_node *n) { return n ? n->type : LOOM_CFG_NULL; }

const loom_cfg_mark *loom_cfg_mark_of(const loom_cfg_node *n) { return n ? &n->mark : NULL; }

const char *loom_cfg_type_name(loom_cfg_type t) {
    switch (t) {
    case LOOM_CFG_SCALAR: return "scalar";
    case LOOM_CFG_MAP: return "map";
    case LOOM_CFG_SEQ: return "list";
    case LOOM_CFG_NULL: return "null";
    }
    return "unknown";
}

loom_cfg_node *loom_cfg_get(const loom_cfg_node *map, const char *key) {
    int i = loom_cfg__find(map, key);
    return i < 0 ? NULL : map->items[i].value;
}

loom_cfg_node *loom_cfg_get_path(const loom_cfg_node *root, const char *dotted) {
    if (!root || !dotted) return NULL;
    const loom_cfg_node *cur = root;
    const char *p = dotted;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (len == 0 || !cur || cur->type != LOOM_CFG_MAP) return NULL;
        const loom_cfg_node *next = NULL;
        for (int i = 0; i < cur->count; i++) {
            const char *k = cur->items[i].key;
            if (strlen(k) == len && memcmp(k, p, len) == 0) {
                next = cur->items[i].value;
                break;
            }
        }
        if (!next) return NULL;
        if (!dot) return (loom_cfg_node *)next;
        cur = next;
        p = dot + 1;
    }
}

int loom_cfg_size(const loom_cfg_node *n) {
    return n && (n->type == LOOM_CFG_MAP || n->type == LOOM_CFG_SEQ) ? n->count : 0;
}

loom_cfg_node *loom_cfg_child(const loom_cfg_node *n, int i, const char **key) {
    if (key) *key = NULL;
    if (!n || i < 0 || i >= loom_cfg_size(n)) return NULL;
    if (key) *key = n->items[i].key;
    return n->items[i].value;
}

const loom_cfg_mark *loom_cfg_key_mark(const loom_cfg_node *n, int i) {
    if (!n || n->type != LOOM_CFG_MAP || i < 0 || i >= n->count) return NULL;
    return &n->items[i].key_mark;
}

const char *loom_cfg_scalar(const loom_cfg_node *n) {
    return n && n->type == LOOM_CFG_SCALAR ? n->text : NULL;
}

loom_cfg_node *loom_cfg_new_map(const char *file) {
    loom_cfg_mark m = {file, file ? 1 : 0, file ? 1 : 0};
    return loom_cfg__node_new(LOOM_CFG_MAP, &m);
}

bool loom_cfg__is_null_text(const char *s) {
    return !s || !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

void loom_cfg__describe(const loom_cfg_node *n, char *buf, size_t size) {
    if (!n) {
        snprintf(buf, size, "nothing");
        return;
    }
    switch (n->type) {
    case LOOM_CFG_MAP: snprintf(buf, size, "a map"); return;
    case LOOM_CFG_SEQ: snprintf(buf, size, "a list"); return;
    case LOOM_CFG_NULL: snprintf(buf, size, "null"); return;
    case LOOM_CFG_SCALAR: break;
    }
    /* "text" with control characters escaped, cut at 60 bytes. */
    size_t o = 0;
    if (size < 8) {
        if (size) buf[0] = '\0';
        return;
    }
    buf[o++] = '"';
    const unsigned char *s = (const unsigned char *)(n->text ? n->text : "");
    size_t shown = 0;
    for (; *s && o + 6 < size; s++, shown++) {
        if (shown == 60) break;
        if (*s == '"' || *s == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*s;
        } else if (*s < 0x20 || *s == 0x7f) {
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", *s);
        } else {
            buf[o++] = (char)*s;
        }
    }
    buf[o++] = '"';
    if (*s && o + 4 < size) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
}

/* --------------------------------------------------------------- printing */

static int emit_scalar(yaml_emitter_t *e, const char *text, yaml_scalar_style_t style) {
    yaml_event_t ev;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1,
                                      1, style))
        return 0;
    return yaml_emitter_emit(e, &ev);
}

static int emit_node(yaml_emitter_t *e, const loom_cfg_node *n) {
    yaml_event_t ev;
    switch (n->type) {
    case LOOM_CFG_NULL: return emit_scalar(e, "null", YAML_PLAIN_SCALAR_STYLE);
    case LOOM_CFG_SCALAR: {
        /* Keep the quoting as written; text spelled like null must stay quoted
         * or it would come back as a null. */
        yaml_scalar_style_t st = (yaml_scalar_style_t)n->style;
        if (st == YAML_PLAIN_SCALAR_STYLE) st = YAML_ANY_SCALAR_STYLE;
        if (st == YAML_ANY_SCALAR_STYLE && loom_cfg__is_null_text(n->text))
            st = YAML_DOUBLE_QUOTED_SCALAR_STYLE;
        return emit_scalar(e, n->text ? n->text : "", st);
    }
    case LOOM_CFG_MAP:
        if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) ||
            !yaml_emitter_emit(e, &ev))
            return 0;
        for (int i = 0; i < n->count; i++) {
            const char *k = n->items[i].key;
            /* A plain "<<" key would come back as a YAML merge key. */
            yaml_scalar_style_t ks = strcmp(k, "<<") == 0 || k[0] == '\0'
                                         ? YAML_DOUBLE_QUOTED_SCALAR_STYLE
                                         : YAML_ANY_SCALAR_STYLE;
            if (!emit_scalar(e, k, ks) || !emit_node(e, n->items[i].value)) return 0;
        }
        return yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(e, &ev);
    case LOOM_CFG_SEQ:
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE) ||
            !yaml_emitter_emit(e, &ev))
            return 0;
        for (int i = 0; i < n->count; i++)
            if (!emit_node(e, n->items[i].value)) return 0;
        return yaml_sequence_end_event_initialize(&ev) && yaml_emitter_emit(e, &ev);
    }
    return 0;
}

void loom_cfg_print(const loom_cfg_node *root, void *file) {
    FILE *f = file ? (FILE *)file : stdout;
    if (!root) return;
    yaml_emitter_t e;
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&e)) {
        fprintf(f, "# loom: cannot print the configuration: out of memory\n");
        return;
    }
    yaml_emitter_set_output_file(&e, f);
    yaml_emitter_set_unicode(&e, 1);
    yaml_emitter_set_width(&e, -1); /* never fold long scalars */
    yaml_emitter_set_indent(&e, 2);
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) &&
             yaml_emitter_emit(&e, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) &&
             yaml_emitter_emit(&e, &ev) && emit_node(&e, root) &&
             yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&e, &ev) &&
             yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&e, &ev) &&
             yaml_emitter_flush(&e);
    if (!ok)
        fprintf(f, "\n# loom: cannot print the configuration: %s\n",
                e.problem ? e.problem : "emitter error");
    yaml_emitter_delete(&e);
}
