/*
 * core/config/config_bind.c — typed reading of scalars and binding a config
 * section to a component's declared parameter table (loom_param), the way
 * nginx fills a module's config struct from its directive table.
 *
 * Scalar grammar (text as written; quoting does not matter):
 *   bool   true/false, yes/no, on/off, case-insensitive;
 *   int    optional sign, then decimal digits or 0x/0X hex digits; nothing
 *          else (no "1e3", no "1.0", no spaces), must fit in int64_t;
 *   double anything strtod reads in full (so integers too), plus YAML's
 *          .inf/-.inf; NaN and overflow are rejected.
 * A key present with a null value (`key:` or `key: ~`) counts as absent, so
 * its default applies.
 *
 * Binding never stops at the first problem: every error goes to the diag.
 */
#include "config/config_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/util.h"

/* ------------------------------------------------------------- grammars */

static bool parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
}

/* 0 ok, 1 not an integer, 2 does not fit in int64_t. */
static int parse_int(const char *s, int64_t *out) {
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    unsigned base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!*s) return 1;
    uint64_t v = 0;
    bool overflow = false;
    for (; *s; s++) {
        unsigned d;
        if (*s >= '0' && *s <= '9') d = (unsigned)(*s - '0');
        else if (base == 16 && *s >= 'a' && *s <= 'f') d = (unsigned)(*s - 'a' + 10);
        else if (base == 16 && *s >= 'A' && *s <= 'F') d = (unsigned)(*s - 'A' + 10);
        else return 1;
        if (v > (UINT64_MAX - d) / base) overflow = true;
        else v = v * base + d;
    }
    if (overflow) return 2;
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) return 2;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX) return 2;
        *out = (int64_t)v;
    }
    return 0;
}

/* 0 ok, 1 not a number (or NaN), 2 overflows a double. */
static int parse_double(const char *s, double *out) {
    const char *t = s + (*s == '+' || *s == '-');
    if (!strcasecmp(t, ".inf")) {
        *out = *s == '-' ? -INFINITY : INFINITY;
        return 0;
    }
    if (!*s || !(*t == '.' || (*t >= '0' && *t <= '9') || !strncasecmp(t, "inf", 3)))
        return 1; /* also refuses strtod's leading blanks and "nan" */
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || isnan(v)) return 1;
    if (errno == ERANGE && isinf(v)) return 2;
    *out = v;
    return 0;
}

/* ---------------------------------------------------------- typed readers */

static const char *path_or_value(const char *key_path) {
    return key_path && *key_path ? key_path : "value";
}

bool loom_cfg_as_bool(const loom_cfg_node *n, const char *key_path, bool *out, loom_diag *diag) {
    bool v;
    if (n && n->type == LOOM_CFG_SCALAR && parse_bool(n->text, &v)) {
        if (out) *out = v;
        return true;
    }
    char got[96];
    loom_cfg__describe(n, got, sizeof got);
    loom_diag_add(diag, loom_cfg_mark_of(n), "%s: expected a boolean (true/false, yes/no, "
                  "on/off), got %s", path_or_value(key_path), got);
    return false;
}

bool loom_cfg_as_int(const loom_cfg_node *n, const char *key_path, int64_t *out, loom_diag *diag) {
    int64_t v = 0;
    int r = n && n->type == LOOM_CFG_SCALAR ? parse_int(n->text, &v) : 1;
    if (r == 0) {
        if (out) *out = v;
        return true;
    }
    char got[96];
    loom_cfg__describe(n, got, sizeof got);
    loom_diag_add(diag, loom_cfg_mark_of(n), "%s: expected an integer%s, got %s",
                  path_or_value(key_path), r == 2 ? " that fits in 64 bits" : "", got);
    return false;
}

bool loom_cfg_as_double(const loom_cfg_node *n, const char *key_path, double *out,
                        loom_diag *diag) {
    double v = 0;
    int r = n && n->type == LOOM_CFG_SCALAR ? parse_double(n->text, &v) : 1;
    if (r == 0) {
        if (out) *out = v;
        return true;
    }
    char got[96];
    loom_cfg__describe(n, got, sizeof got);
    loom_diag_add(diag, loom_cfg_mark_of(n), "%s: expected a number%s, got %s",
                  path_or_value(key_path), r == 2 ? " within double range" : "", got);
    return false;
}

/* ----------------------------------------------------------------- binding */

/* Optimal-string-alignment distance (edits, with adjacent swaps), capped. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* Names of a parameter table or of an enum's choices, by index; NULL ends. */
typedef const char *(*name_at_fn)(const void *list, int i);
static const char *param_name(const void *list, int i) {
    return ((const loom_param *)list)[i].key;
}
static const char *choice_name(const void *list, int i) {
    return ((const char *const *)list)[i];
}

/* " did you mean 'x'?" for the closest name (distance <= 2), else "". */
static void suggest(const char *word, const void *list, name_at_fn name_at, char *buf,
                    size_t size) {
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; name_at(list, i); i++) {
        int dist = edit_distance(word, name_at(list, i));
        if (dist < best_d) {
            best_d = dist;
            best = name_at(list, i);
        }
    }
    if (best)
        snprintf(buf, size, " did you mean '%s'?", best);
    else if (size)
        buf[0] = '\0';
}

/* "a, b, c" (cut to fit `size`). */
static void join_names(const void *list, name_at_fn name_at, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; name_at(list, i) && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", o ? ", " : "", name_at(list, i));
}

static void fmt_bound(double v, char *buf, size_t size) {
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, size, "%.0f", v);
    else
        snprintf(buf, size, "%g", v);
}

size_t loom_param_size(loom_param_type t) {
    switch (t) {
    case LOOM_PARAM_BOOL: return sizeof(bool);
    case LOOM_PARAM_INT: return sizeof(int64_t);
    case LOOM_PARAM_FLOAT: return sizeof(double);
    case LOOM_PARAM_STRING: return LOOM_PARAM_STRING_MAX;
    case LOOM_PARAM_ENUM: return sizeof(int64_t);
    }
    return 0;
}

/* Check and store one value. `n` is the node (or a stand-in for a default). */
static bool bind_one(const loom_param *p, const loom_cfg_node *n, const char *key_path,
                     char *dst, loom_diag *diag) {
    char lo[48], hi[48], got[96];
    switch (p->type) {
    case LOOM_PARAM_BOOL: {
        bool v;
        if (!loom_cfg_as_bool(n, key_path, &v, diag)) return false;
        memcpy(dst, &v, sizeof v);
        return true;
    }
    case LOOM_PARAM_INT: {
        int64_t v;
        if (!loom_cfg_as_int(n, key_path, &v, diag)) return false;
        if (p->min <= p->max && ((double)v < p->min || (double)v > p->max)) {
            fmt_bound(p->min, lo, sizeof lo);
            fmt_bound(p->max, hi, sizeof hi);
            loom_diag_add(diag, &n->mark, "%s: %lld is out of range [%s, %s]", key_path,
                          (long long)v, lo, hi);
            return false;
        }
        memcpy(dst, &v, sizeof v);
        return true;
    }
    case LOOM_PARAM_FLOAT: {
        double v;
        if (!loom_cfg_as_double(n, key_path, &v, diag)) return false;
        if (p->min <= p->max && (v < p->min || v > p->max)) {
            fmt_bound(p->min, lo, sizeof lo);
            fmt_bound(p->max, hi, sizeof hi);
            loom_diag_add(diag, &n->mark, "%s: %s is out of range [%s, %s]", key_path, n->text, lo,
                          hi);
            return false;
        }
        memcpy(dst, &v, sizeof v);
        return true;
    }
    case LOOM_PARAM_STRING: {
        if (n->type != LOOM_CFG_SCALAR) {
            loom_cfg__describe(n, got, sizeof got);
            loom_diag_add(diag, &n->mark, "%s: expected a string, got %s", key_path, got);
            return false;
        }
        size_t len = strlen(n->text);
        if (len >= LOOM_PARAM_STRING_MAX) {
            loom_diag_add(diag, &n->mark, "%s: string is %zu bytes long; at most %d allowed",
                          key_path, len, LOOM_PARAM_STRING_MAX - 1);
            return false;
        }
        memcpy(dst, n->text, len + 1);
        return true;
    }
    case LOOM_PARAM_ENUM: {
        char list[LOOM_ERROR_MSG_MAX], hint[96] = "";
        if (!p->choices) {
            loom_diag_add(diag, &n->mark, "%s: enum parameter declares no choices (plugin bug)",
                          key_path);
            return false;
        }
        if (n->type == LOOM_CFG_SCALAR) {
            for (int64_t i = 0; p->choices[i]; i++) {
                if (strcmp(p->choices[i], n->text) == 0) {
                    memcpy(dst, &i, sizeof i);
                    return true;
                }
            }
            suggest(n->text, p->choices, choice_name, hint, sizeof hint);
        }
        loom_cfg__describe(n, got, sizeof got);
        join_names(p->choices, choice_name, list, sizeof list);
        loom_diag_add(diag, &n->mark, "%s: unknown choice %s;%s expected one of: %s", key_path, got,
                      hint, list);
        return false;
    }
    }
    loom_diag_add(diag, &n->mark, "%s: parameter has unknown type %d (plugin bug)", key_path,
                  (int)p->type);
    return false;
}

static bool ignored(const char *const *ignore, const char *key) {
    for (; ignore && *ignore; ignore++)
        if (strcmp(*ignore, key) == 0) return true;
    return false;
}

static void key_path_of(const char *section_path, const char *key, char *buf, size_t size) {
    if (section_path && *section_path)
        snprintf(buf, size, "%s.%s", section_path, key);
    else
        snprintf(buf, size, "%s", key);
}

/* Report every key of map that no parameter (nor `ignore`) names; false
 * when there is one. */
static bool check_unknown_keys(const loom_cfg_node *map, const char *section_path, const loom_param *params,
                               const char *const *ignore, loom_diag *diag) {
    bool ok = true;
    for (int i = 0; map && i < map->count; i++) {
        const char *key = map->items[i].key;
        if (ignored(ignore, key)) continue;
        bool known = false;
        for (const loom_param *p = params; p->key; p++)
            if (strcmp(p->key, key) == 0) known = true;
        if (known) continue;
        char path[256], hint[96], list[LOOM_ERROR_MSG_MAX];
        key_path_of(section_path, key, path, sizeof path);
        suggest(key, params, param_name, hint, sizeof hint);
        join_names(params, param_name, list, sizeof list);
        if (params[0].key)
            loom_diag_add(diag, &map->items[i].key_mark, "%s: unknown key;%s valid keys: %s", path,
                          hint, list);
        else
            loom_diag_add(diag, &map->items[i].key_mark,
                          "%s: unknown key; this component takes no parameters", path);
        ok = false;
    }
    return ok;
}

/* Fill parameter p of config from its key in map (may be NULL), or from its
 * default; a required key absent or empty is reported. `sect` names the
 * section in messages. */
static bool bind_param(const loom_param *p, const loom_cfg_node *section, const loom_cfg_node *map,
                       const char *section_path, const char *sect, void *config, size_t config_size,
                       loom_diag *diag) {
    char path[256];
    key_path_of(section_path, p->key, path, sizeof path);
    size_t sz = loom_param_size(p->type);
    if (!config || sz == 0 || p->offset > config_size || sz > config_size - p->offset) {
        loom_diag_add(diag, NULL,
                      "%s: parameter table entry does not fit the config struct (offset %zu, "
                      "%zu bytes, struct %zu bytes; plugin bug)",
                      path, p->offset, sz, config_size);
        return false;
    }
    char *dst = (char *)config + p->offset;
    const loom_cfg_node *n = loom_cfg_get(map, p->key);
    if (n && n->type != LOOM_CFG_NULL) return bind_one(p, n, path, dst, diag);
    if (!p->default_value) {
        if (n)
            loom_diag_add(diag, &n->mark, "required key '%s' in section '%s' is empty; give "
                          "it a value", p->key, sect);
        else
            loom_diag_add(diag, section ? &section->mark : NULL,
                          "missing required key '%s' in section '%s'", p->key, sect);
        return false;
    }
    /* Defaults go through the same checks; a failure is the plugin's bug. */
    loom_cfg_node def = {.type = LOOM_CFG_SCALAR, .text = (char *)p->default_value};
    loom_diag sub;
    bool ok = true;
    loom_diag_init(&sub);
    if (!bind_one(p, &def, path, dst, &sub)) {
        loom_diag_add(diag, NULL, "invalid default value \"%s\" in the parameter table "
                      "(plugin bug): %s", p->default_value,
                      sub.count ? sub.entries[0].message : "out of memory");
        ok = false;
    }
    loom_diag_free(&sub);
    return ok;
}

bool loom_cfg_bind(const loom_cfg_node *section, const char *section_path,
                   const loom_param *params, const char *const *ignore, void *config,
                   size_t config_size, loom_diag *diag) {
    int before = diag ? diag->count : 0;
    bool ok = true; /* also tracks errors when diag is NULL */
    const char *sect = section_path && *section_path ? section_path : "(top level)";
    static const loom_param no_params[] = {{0}};
    if (!params) params = no_params;
    if (config && config_size) memset(config, 0, config_size);

    if (section && section->type != LOOM_CFG_MAP && section->type != LOOM_CFG_NULL) {
        char got[96];
        loom_cfg__describe(section, got, sizeof got);
        loom_diag_add(diag, &section->mark,
                      "section '%s' must be a map of parameters ('key: value' lines), got %s",
                      sect, got);
        return false;
    }
    const loom_cfg_node *map = section && section->type == LOOM_CFG_MAP ? section : NULL;
    /* Unknown keys first: they are the likely cause of "missing" ones. */
    if (!check_unknown_keys(map, section_path, params, ignore, diag)) ok = false;
    for (const loom_param *p = params; p->key; p++)
        if (!bind_param(p, section, map, section_path, sect, config, config_size, diag)) ok = false;
    return ok && (!diag || diag->count == before);
}
