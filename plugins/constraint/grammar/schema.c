/*
 * plugins/constraint/grammar/schema.c — a JSON schema to GBNF text, which
 * gbnf.c then compiles: one rule per subschema, a fixed set of rules for
 * JSON's lexical pieces, $ref as a rule reference (so recursive schemas
 * work).
 *
 * Enforced: type (one or a list), enum, const, properties + required +
 * additionalProperties (false, true or a schema), items, minItems,
 * maxItems, minLength, maxLength, pattern (regex.c's JSON-string mode),
 * format (date, time, date-time, uuid, ipv4, email, as regexes), minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum (range.c; integer bounds on
 * numbers), anyOf, oneOf (when its branches cannot both match: distinct
 * types), allOf of one schema, $ref to "#" or any JSON pointer inside the
 * document ($defs, definitions). Properties come in the order the schema
 * declares them. Whitespace between tokens is at most 16 characters;
 * numbers have at most 16 integer and 16 fraction digits. Refused with
 * LOOM_ERR_UNSUPPORTED, naming the keyword and its JSON pointer: every
 * validation keyword not listed (multipleOf, uniqueItems, prefixItems,
 * contains, patternProperties, not, if/then/else, ...), other formats,
 * non-integer bounds on numbers, and a type's narrowing keywords where
 * they would go unapplied (beside enum / const, or with no type), since
 * the output must always validate. Annotations (title, description,
 * default, examples, ...) and unknown keywords are ignored, as JSON Schema
 * says.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

/* `s` as a GBNF literal "..." (UTF-8 kept, quotes, backslashes and control
 * characters escaped). */
static void gbuf_literal(gbuf *b, const char *s) {
    gbuf_put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[3] = {'\\', (char)*p, 0};
            gbuf_put(b, e);
        } else if (*p < 0x20) {
            gbuf_printf(b, "\\x%02X", *p);
        } else {
            gbuf_add(b, (const char *)p, 1);
        }
    }
    gbuf_put(b, "\"");
}

typedef struct ref_rule {
    const cJSON *target;
    int32_t rule;
} ref_rule;

typedef struct gen {
    const cJSON *root;
    const gram_limits *lim;
    gbuf out;                  /* rules written so far                       */
    int32_t next_rule;
    ref_rule *refs;
    int32_t n_refs, cap_refs;
    char *why;
    size_t cap;
    loom_status st;
} gen;

/* The base rules every translation may use. */
static const char k_base[] =
    "ws ::= [ \\t\\n]{0,16}\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    /* \u escapes of surrogates are left out: a pair would be two characters
     * here but one for minLength / maxLength */
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" hex-not-surrogate)\n"
    "hex-not-surrogate ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}\n"
    "int-part ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "integer ::= \"-\"? int-part\n"
    "number ::= \"-\"? int-part (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "member ::= string ws \":\" ws value\n"
    "object ::= \"{\" ws (member (ws \",\" ws member)* ws)? \"}\"\n"
    "array ::= \"[\" ws (value (ws \",\" ws value)* ws)? \"]\"\n";

static bool fail(gen *g, loom_status code, const char *ptr, const char *fmt, ...) {
    if (g->st != LOOM_OK) return false;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(g->why, g->cap, "schema at '%s%s': %s", ptr[0] == '#' ? "" : "#", ptr, msg);
    g->st = code;
    return false;
}

static const char *const k_unsupported[] = {
    "multipleOf", "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
    "dependentSchemas", "dependencies", "uniqueItems", "contains", "minContains", "maxContains", "prefixItems",
    "additionalItems", "unevaluatedProperties", "unevaluatedItems", "not", "if", "then", "else",
    "$dynamicRef", "$recursiveRef", "contentSchema", NULL};

/* Keywords that may stand beside $ref / anyOf / oneOf without changing
 * what validates. */
static bool is_annotation(const char *k) {
    static const char *const a[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor",
                                    "strict", NULL};
    for (int i = 0; a[i]; i++)
        if (!strcmp(a[i], k)) return true;
    return false;
}

static int32_t gen_schema(gen *g, const cJSON *s, const char *ptr, int depth);

/* "ptr/key" into out. */
static void child_ptr(char *out, size_t cap, const char *ptr, const char *key) {
    snprintf(out, cap, "%s/%s", ptr, key);
}

/* ------------------------------------------------------------ literals */

static bool json_is_integer(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble;
}

/* Does value v have JSON-schema type t? */
static bool value_has_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    return false;
}

static bool value_fits_types(const cJSON *v, const cJSON *type) {
    if (!type) return true;
    if (cJSON_IsString(type)) return value_has_type(v, type->valuestring);
    const cJSON *t;
    cJSON_ArrayForEach(t, type) if (cJSON_IsString(t) && value_has_type(v, t->valuestring)) return true;
    return false;
}

/* One alternative per enum value (or the const) that also fits `type`. */
static bool gen_literals(gen *g, const cJSON *vals, bool single, const cJSON *type, gbuf *body, const char *ptr) {
    int n = 0;
    const cJSON *v;
    for (v = single ? vals : vals->child; v; v = single ? NULL : v->next) {
        if (!value_fits_types(v, type)) continue;
        char *text = cJSON_PrintUnformatted(v);
        if (!text) return fail(g, LOOM_ERR_NOMEM, ptr, "out of memory");
        if (n++) gbuf_put(body, " | ");
        gbuf_literal(body, text);
        free(text);
    }
    if (n == 0) return fail(g, LOOM_ERR_INVALID, ptr, "no %s value satisfies the schema's type", single ? "const" : "enum");
    return true;
}

/* --------------------------------------------------------------- objects */

/* The members of an object with declared properties, in declaration
 * order, required ones always present: rules S_i (nothing written yet)
 * and R_i (something written: a comma first), chained. */
/* Most properties (and required names) one object may declare: matching
 * required names to properties is a scan per name. */
#define SCHEMA_MAX_MEMBERS 1024

static bool gen_props(gen *g, const cJSON *props, const cJSON *required, gbuf *body, const char *ptr, int depth) {
    int n = cJSON_GetArraySize(props);
    int32_t *val = calloc((size_t)n + 1, sizeof(int32_t));
    bool *req = calloc((size_t)n + 1, sizeof(bool));
    if (!val || !req) {
        free(val);
        free(req);
        return fail(g, LOOM_ERR_NOMEM, ptr, "out of memory");
    }
    int i = 0;
    const cJSON *p;
    char cp[512];
    cJSON_ArrayForEach(p, props) {
        if (i >= n) break;
        const cJSON *r;
        cJSON_ArrayForEach(r, required) if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) req[i] = true;
        snprintf(cp, sizeof cp, "%s/properties/%s", ptr, p->string);
        if ((val[i++] = gen_schema(g, p, cp, depth + 1)) < 0) break;
    }
    bool ok = g->st == LOOM_OK;
    int32_t base = g->next_rule;
    g->next_rule += 2 * (n + 1);
    /* S_i = base + 2i, R_i = base + 2i + 1; S_n = R_n = "" */
    const cJSON *pi = props->child;
    for (i = 0; ok && i <= n; i++, pi = pi ? pi->next : NULL) {
        if (i == n) {
            gbuf_printf(&g->out, "s%d ::= \"\"\ns%d ::= \"\"\n", base + 2 * i, base + 2 * i + 1);
            break;
        }
        cJSON *name = cJSON_CreateString(pi->string);
        char *enc = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!enc) {
            ok = fail(g, LOOM_ERR_NOMEM, ptr, "out of memory");
            break;
        }
        gbuf kv = {0};
        gbuf_literal(&kv, enc);
        free(enc);
        gbuf_printf(&kv, " ws \":\" ws s%d ws", val[i]);
        for (int r = 0; r < 2 && !kv.oom; r++) {
            gbuf_printf(&g->out, "s%d ::= %s%s s%d", base + 2 * i + r, r ? "\",\" ws " : "", kv.s, base + 2 * (i + 1) + 1);
            if (!req[i]) gbuf_printf(&g->out, " | s%d", base + 2 * (i + 1) + r);
            gbuf_put(&g->out, "\n");
        }
        if (kv.oom) g->out.oom = true;
        free(kv.s);
    }
    if (ok) gbuf_printf(body, "\"{\" ws s%d \"}\"", base);
    free(val);
    free(req);
    return ok;
}

static bool check_required(gen *g, const cJSON *props, const cJSON *required, const char *ptr) {
    if (required && !cJSON_IsArray(required)) return fail(g, LOOM_ERR_INVALID, ptr, "'required' must be an array");
    const int np = props ? cJSON_GetArraySize(props) : 0, nr = required ? cJSON_GetArraySize(required) : 0;
    if (np > SCHEMA_MAX_MEMBERS || nr > SCHEMA_MAX_MEMBERS)
        return fail(g, LOOM_ERR_INVALID, ptr, "%d properties and %d required names: at most %d of each per object",
                    np, nr, SCHEMA_MAX_MEMBERS);
    const cJSON *r;
    cJSON_ArrayForEach(r, required) {
        if (!cJSON_IsString(r)) return fail(g, LOOM_ERR_INVALID, ptr, "'required' must hold strings");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                        "required property '%.64s' is not declared in 'properties' (required properties must be "
                        "declared)",
                        r->valuestring);
    }
    return true;
}

static bool gen_object(gen *g, const cJSON *s, gbuf *body, const char *ptr, int depth) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(g, LOOM_ERR_INVALID, ptr, "'properties' must be an object");
    if (!check_required(g, props, required, ptr)) return false;
    if (props && cJSON_GetArraySize(props) > 0) return gen_props(g, props, required, body, ptr, depth);
    if (cJSON_IsFalse(addl)) {
        gbuf_put(body, "\"{\" ws \"}\"");
        return true;
    }
    if (!addl || cJSON_IsTrue(addl)) {
        gbuf_put(body, "object");
        return true;
    }
    char cp[512];
    child_ptr(cp, sizeof cp, ptr, "additionalProperties");
    int32_t v = gen_schema(g, addl, cp, depth + 1);
    if (v < 0) return false;
    gbuf_printf(body, "\"{\" ws (string ws \":\" ws s%d (ws \",\" ws string ws \":\" ws s%d)* ws)? \"}\"", v, v);
    return true;
}

/* ---------------------------------------------------------------- arrays */

static bool get_count(gen *g, const cJSON *s, const char *key, int64_t dflt, int64_t *out, const char *ptr) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v) return true;
    if (!json_is_integer(v) || v->valuedouble < 0)
        return fail(g, LOOM_ERR_INVALID, ptr, "'%s' must be a non-negative integer", key);
    if (v->valuedouble > (double)g->lim->max_repeat)
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'%s' = %.0f is past the plugin's max_repeat (%lld)", key,
                    v->valuedouble, (long long)g->lim->max_repeat);
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool gen_array(gen *g, const cJSON *s, gbuf *body, const char *ptr, int depth) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    int64_t min, max;
    if (!get_count(g, s, "minItems", 0, &min, ptr) || !get_count(g, s, "maxItems", -1, &max, ptr)) return false;
    if (max >= 0 && max < min) return fail(g, LOOM_ERR_INVALID, ptr, "maxItems is below minItems");
    if (items && cJSON_IsArray(items))
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'items' as an array (tuples) is not supported");
    char cp[512];
    child_ptr(cp, sizeof cp, ptr, "items");
    char item[32] = "value";
    if (items) {
        int32_t v = gen_schema(g, items, cp, depth + 1);
        if (v < 0) return false;
        snprintf(item, sizeof item, "s%d", v);
    }
    if (max == 0) {
        gbuf_put(body, "\"[\" ws \"]\"");
        return true;
    }
    char rest[64];
    int64_t lo = min > 0 ? min - 1 : 0;
    if (max < 0) snprintf(rest, sizeof rest, "{%lld,}", (long long)lo);
    else snprintf(rest, sizeof rest, "{%lld,%lld}", (long long)lo, (long long)(max - 1));
    gbuf_printf(body, "\"[\" ws (%s (ws \",\" ws %s)%s ws)%s \"]\"", item, item, rest, min > 0 ? "" : "?");
    return true;
}

/* ----------------------------------------------------------------- types */

/* The formats enforced, each as a regex (regex.c's dialect) every match
 * of which is a valid value: days per month with February to 28, RFC 3339
 * times with an offset, dotted quads without leading zeros, RFC 5322
 * dot-atom addresses at a domain of two or more labels. */
#define RX_DATE                                                                                                     \
    "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"      \
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
#define RX_TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define RX_OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
#define RX_ATEXT "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
#define RX_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
static const struct {
    const char *name, *regex;
} k_formats[] = {
    {"date", RX_DATE},
    {"time", RX_TIME},
    {"date-time", RX_DATE "T" RX_TIME},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"ipv4", "(?:" RX_OCTET "\\.){3}" RX_OCTET},
    {"email", RX_ATEXT "+(?:\\." RX_ATEXT "+)*@" RX_LABEL "(?:\\." RX_LABEL ")+"},
};

/* A string whose content fully matches `pattern` or the regex of `format`
 * (a full match also satisfies JSON Schema's search). */
static bool gen_string_regex(gen *g, const cJSON *s, const cJSON *pat, const cJSON *fmt, gbuf *body,
                             const char *ptr) {
    const char *kw = pat ? "pattern" : "format";
    if (!cJSON_IsString(pat ? pat : fmt)) return fail(g, LOOM_ERR_INVALID, ptr, "'%s' must be a string", kw);
    if (pat && fmt) return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'pattern' beside 'format' is not supported");
    static const char *const lens[] = {"minLength", "maxLength"};
    for (int i = 0; i < 2; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, lens[i]))
            return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                        "'%s' beside '%s' is not supported (a length and a regular expression are not combined "
                        "exactly)",
                        lens[i], kw);
    const char *re = pat ? pat->valuestring : NULL;
    for (size_t i = 0; !re && i < sizeof k_formats / sizeof k_formats[0]; i++)
        if (!strcmp(fmt->valuestring, k_formats[i].name)) re = k_formats[i].regex;
    if (!re)
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                    "format '%.64s' is not supported (enforced: date, time, date-time, uuid, ipv4, email)",
                    fmt->valuestring);
    char *rb = NULL, why[256];
    loom_status st = gram_regex_json_body(re, strlen(re), g->lim, &rb, why, sizeof why);
    if (st != LOOM_OK) return fail(g, st, ptr, "'pattern': %s", why);
    gbuf_printf(body, "\"\\\"\" (%s) \"\\\"\"", rb);
    free(rb);
    return true;
}

static bool gen_string(gen *g, const cJSON *s, gbuf *body, const char *ptr) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (pat || fmt) return gen_string_regex(g, s, pat, fmt, body, ptr);
    int64_t min, max;
    if (!get_count(g, s, "minLength", 0, &min, ptr) || !get_count(g, s, "maxLength", -1, &max, ptr)) return false;
    if (max >= 0 && max < min) return fail(g, LOOM_ERR_INVALID, ptr, "maxLength is below minLength");
    if (min == 0 && max < 0) gbuf_put(body, "string");
    else if (max < 0) gbuf_printf(body, "\"\\\"\" char{%lld,} \"\\\"\"", (long long)min);
    else gbuf_printf(body, "\"\\\"\" char{%lld,%lld} \"\\\"\"", (long long)min, (long long)max);
    return true;
}

/* --------------------------------------------------------------- numbers */

static const char *const k_bound_keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};

/* Bound keyword k's value into *v; false with the error set when it is
 * not one the grammar can hold exactly. *present false when absent (or a
 * draft-4 boolean, which modifies minimum / maximum instead). */
static bool bound_value(gen *g, const cJSON *s, const char *k, bool integer, double *v, bool *present,
                        const char *ptr) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, k);
    *present = b && !cJSON_IsBool(b);
    if (!b || cJSON_IsBool(b)) return true;
    if (!cJSON_IsNumber(b) || !isfinite(b->valuedouble))
        return fail(g, LOOM_ERR_INVALID, ptr, "'%s' must be a number", k);
    *v = b->valuedouble;
    if (fabs(*v) > 9007199254740992.0 && fabs(*v) < 1e17)
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                    "'%s' = %.17g is past 2^53, where the bound cannot be read exactly", k, *v);
    if (!integer && floor(*v) != *v)
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                    "non-integer '%s' (%.17g) on a number is not supported (integer bounds are)", k, *v);
    return true;
}

/* The four bound keywords as a lower and an upper bound (the tighter of
 * minimum and exclusiveMinimum; equal ones: the exclusive), on integers
 * made inclusive; ends past GRAM_MAX_INT clamped (nothing longer is
 * written). false with the error set. */
static bool read_bounds(gen *g, const cJSON *s, bool integer, gram_bound *lo, gram_bound *hi, const char *ptr) {
    gram_bound end[2] = {{0}, {0}};
    for (int k = 0; k < 4; k++) {
        double v = 0;
        bool present;
        if (!bound_value(g, s, k_bound_keys[k], integer, &v, &present, ptr)) return false;
        if (!present) continue;
        int side = k / 2;
        bool incl = k % 2 == 0;
        if (incl && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, k_bound_keys[k + 1]))) incl = false; /* draft 4 */
        if (integer) { /* the nearest integer inside, inclusive */
            v = side == 0 ? (incl ? ceil(v) : floor(v) + 1) : (incl ? floor(v) : ceil(v) - 1);
            incl = true;
        }
        if (v < -(double)GRAM_MAX_INT) v = -(double)GRAM_MAX_INT - 1;
        if (v > (double)GRAM_MAX_INT) v = (double)GRAM_MAX_INT + 1;
        gram_bound *e = &end[side];
        bool tighter = !e->has || (side == 0 ? v > (double)e->v : v < (double)e->v) ||
                       ((double)e->v == v && !incl);
        if (tighter) *e = (gram_bound){true, incl, (int64_t)v};
    }
    /* past the 16 digits: unbounded on that side, or nothing writable */
    if (end[0].has && end[0].v < -GRAM_MAX_INT) end[0].has = false;
    if (end[1].has && end[1].v > GRAM_MAX_INT) end[1].has = false;
    if ((end[0].has && end[0].v > GRAM_MAX_INT) || (end[1].has && end[1].v < -GRAM_MAX_INT))
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "the bounds leave no value of at most %d integer digits",
                    GRAM_MAX_DIGITS);
    if (end[0].has && end[1].has &&
        (end[0].v > end[1].v || (end[0].v == end[1].v && !(end[0].incl && end[1].incl))))
        return fail(g, LOOM_ERR_INVALID, ptr, "no %s satisfies the bounds", integer ? "integer" : "number");
    *lo = end[0];
    *hi = end[1];
    return true;
}

static bool gen_bounded(gen *g, const cJSON *s, bool integer, gbuf *body, const char *ptr) {
    bool any = false;
    for (int k = 0; k < 4; k++) any |= cJSON_GetObjectItemCaseSensitive(s, k_bound_keys[k]) != NULL;
    if (!any) {
        gbuf_put(body, integer ? "integer" : "number");
        return true;
    }
    gram_bound lo, hi;
    if (!read_bounds(g, s, integer, &lo, &hi, ptr)) return false;
    if (integer) {
        gram_int_range(body, lo.has ? lo.v : -GRAM_MAX_INT, hi.has ? hi.v : GRAM_MAX_INT);
        return true;
    }
    if (!gram_number_range(body, lo, hi))
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "no number of at most %d integer and 15 significant digits "
                    "satisfies the bounds", GRAM_MAX_DIGITS);
    return true;
}

static bool gen_type(gen *g, const cJSON *s, const char *t, gbuf *body, const char *ptr, int depth) {
    if (!strcmp(t, "object")) return gen_object(g, s, body, ptr, depth);
    if (!strcmp(t, "array")) return gen_array(g, s, body, ptr, depth);
    if (!strcmp(t, "string")) return gen_string(g, s, body, ptr);
    if (!strcmp(t, "number") || !strcmp(t, "integer")) return gen_bounded(g, s, !strcmp(t, "integer"), body, ptr);
    if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        gbuf_put(body, t);
        return true;
    }
    return fail(g, LOOM_ERR_INVALID, ptr, "unknown type '%.32s'", t);
}

/* Bit set of the types a branch of oneOf can produce; 0 = unknown. */
static unsigned type_bits(const cJSON *s) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    const cJSON *t = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "type") : NULL;
    unsigned bits = 0;
    for (int i = 0; i < 7; i++) {
        bool has = false;
        if (cJSON_IsString(t)) has = !strcmp(t->valuestring, names[i]);
        const cJSON *e;
        if (cJSON_IsArray(t)) cJSON_ArrayForEach(e, t) has |= cJSON_IsString(e) && !strcmp(e->valuestring, names[i]);
        if (has) bits |= 1u << i;
    }
    if (bits & (1u << 3)) bits |= 1u << 4; /* number includes integer */
    if (bits & (1u << 4)) bits |= 1u << 3; /* and an integer is a number */
    return bits;
}

static bool gen_branches(gen *g, const cJSON *arr, const char *kw, gbuf *body, const char *ptr, int depth) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return fail(g, LOOM_ERR_INVALID, ptr, "'%s' must be a non-empty array", kw);
    if (!strcmp(kw, "oneOf")) {
        int n = cJSON_GetArraySize(arr);
        for (int i = 0; i < n; i++) {
            unsigned a = type_bits(cJSON_GetArrayItem(arr, i));
            for (int j = i + 1; j < n; j++) {
                unsigned b = type_bits(cJSON_GetArrayItem(arr, j));
                if (!a || !b || (a & b))
                    return fail(g, LOOM_ERR_UNSUPPORTED, ptr,
                                "oneOf branches %d and %d could both match (oneOf is enforced only when every branch "
                                "declares a 'type' and no two share one); use anyOf",
                                i, j);
            }
        }
    }
    int i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, arr) {
        char cp[512];
        snprintf(cp, sizeof cp, "%s/%s/%d", ptr, kw, i);
        int32_t r = gen_schema(g, b, cp, depth + 1);
        if (r < 0) return false;
        gbuf_printf(body, "%ss%d", i++ ? " | " : "", r);
    }
    return true;
}

/* ------------------------------------------------------------------ refs */

/* Resolve a local reference ("#" or "#/a/b" with ~0 ~1 escapes). */
static const cJSON *resolve(const cJSON *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') seg[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') seg[n++] = '/', p += 2;
            else seg[n++] = *p++;
        }
        seg[n] = '\0';
        if (cJSON_IsArray(at)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            at = *end || n == 0 ? NULL : cJSON_GetArrayItem(at, (int)idx);
        } else {
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
        }
    }
    return *p ? NULL : at;
}

static int32_t gen_ref(gen *g, const cJSON *ref, const char *ptr, int depth) {
    if (!cJSON_IsString(ref)) {
        fail(g, LOOM_ERR_INVALID, ptr, "'$ref' must be a string");
        return -1;
    }
    const cJSON *t = resolve(g->root, ref->valuestring);
    if (!t) {
        fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'$ref' \"%.128s\" does not resolve inside this schema (only local "
             "references such as #/$defs/name are supported)", ref->valuestring);
        return -1;
    }
    for (int32_t i = 0; i < g->n_refs; i++)
        if (g->refs[i].target == t) return g->refs[i].rule;
    if (g->n_refs == g->cap_refs) {
        int32_t nc = g->cap_refs ? 2 * g->cap_refs : 16;
        ref_rule *q = realloc(g->refs, (size_t)nc * sizeof *q);
        if (!q) {
            fail(g, LOOM_ERR_NOMEM, ptr, "out of memory");
            return -1;
        }
        g->refs = q;
        g->cap_refs = nc;
    }
    int32_t rule = g->next_rule++;
    g->refs[g->n_refs++] = (ref_rule){t, rule};
    int32_t body = gen_schema(g, t, ref->valuestring, depth + 1);
    if (body < 0) return -1;
    gbuf_printf(&g->out, "s%d ::= s%d\n", rule, body);
    return rule;
}

/* --------------------------------------------------------------- schemas */

static bool check_keywords(gen *g, const cJSON *s, const char *ptr, const char *only_beside) {
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        for (int i = 0; k_unsupported[i]; i++)
            if (!strcmp(k->string, k_unsupported[i]))
                return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "keyword '%s' is not supported by the grammar constraint",
                            k->string);
        if (only_beside && strcmp(k->string, only_beside) && !is_annotation(k->string))
            return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'%s' beside '%s' is not supported: move it into the branches",
                        k->string, only_beside);
    }
    return true;
}

/* Keywords that narrow one type's values, which the translation applies
 * only inside gen_type: beside enum / const (`beside`) or with no type
 * they would be ignored, so they are refused. */
static bool check_typed_keywords(gen *g, const cJSON *s, const char *beside, const char *ptr) {
    static const char *const k[] = {"pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                    "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", NULL};
    for (int i = 0; k[i]; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(s, k[i])) continue;
        if (beside) return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'%s' beside '%s' is not supported", k[i], beside);
        return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'%s' without a 'type' is not supported: declare the type it "
                    "applies to", k[i]);
    }
    return true;
}

/* The body of subschema s (a rule's right-hand side) into body. */
static bool gen_body(gen *g, const cJSON *s, gbuf *body, const char *ptr, int depth) {
    static const char *const alone[] = {"$ref", "anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, alone[i]);
        if (!v) continue;
        if (!check_keywords(g, s, ptr, alone[i])) return false;
        if (i == 0) {
            int32_t r = gen_ref(g, v, ptr, depth);
            if (r >= 0) gbuf_printf(body, "s%d", r);
            return r >= 0;
        }
        if (i == 3 && cJSON_GetArraySize(v) != 1)
            return fail(g, LOOM_ERR_UNSUPPORTED, ptr, "'allOf' of more than one schema is not supported");
        return gen_branches(g, v, alone[i], body, ptr, depth);
    }
    if (!check_keywords(g, s, ptr, NULL)) return false;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (type && !cJSON_IsString(type) && !(cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0))
        return fail(g, LOOM_ERR_INVALID, ptr, "'type' must be a string or a non-empty array of strings");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(s, "const"), *e = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if ((c || e) && !check_typed_keywords(g, s, c ? "const" : "enum", ptr)) return false;
    if (c) return gen_literals(g, c, true, type, body, ptr);
    if (e) {
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) == 0)
            return fail(g, LOOM_ERR_INVALID, ptr, "'enum' must be a non-empty array");
        return gen_literals(g, e, false, type, body, ptr);
    }
    if (cJSON_IsString(type)) return gen_type(g, s, type->valuestring, body, ptr, depth);
    if (type) {
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!cJSON_IsString(t)) return fail(g, LOOM_ERR_INVALID, ptr, "'type' entries must be strings");
            gbuf one = {0};
            bool ok = gen_type(g, s, t->valuestring, &one, ptr, depth);
            if (ok && !one.oom) gbuf_printf(body, "%s(%s)", i++ ? " | " : "", one.s);
            free(one.s);
            if (!ok) return false;
        }
        return true;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required"))
        return gen_object(g, s, body, ptr, depth);
    if (cJSON_GetObjectItemCaseSensitive(s, "items")) return gen_array(g, s, body, ptr, depth);
    if (!check_typed_keywords(g, s, NULL, ptr)) return false;
    gbuf_put(body, "value");
    return true;
}

/* A rule for subschema s; its number, or -1 (g->st says why). */
static int32_t gen_schema(gen *g, const cJSON *s, const char *ptr, int depth) {
    if (g->st != LOOM_OK) return -1;
    if (depth > g->lim->max_schema_depth) {
        fail(g, LOOM_ERR_INVALID, ptr, "the schema nests deeper than the plugin's max_schema_depth (%lld)",
             (long long)g->lim->max_schema_depth);
        return -1;
    }
    if ((int64_t)g->out.n > 8 * g->lim->max_text_bytes) {
        fail(g, LOOM_ERR_INVALID, ptr, "the schema's grammar grows past %lld bytes",
             (long long)(8 * g->lim->max_text_bytes));
        return -1;
    }
    int32_t rule = g->next_rule++;
    gbuf body = {0};
    bool ok;
    if (cJSON_IsTrue(s)) {
        gbuf_put(&body, "value");
        ok = true;
    } else if (cJSON_IsFalse(s)) {
        ok = fail(g, LOOM_ERR_UNSUPPORTED, ptr, "the schema 'false' allows nothing");
    } else if (!cJSON_IsObject(s)) {
        ok = fail(g, LOOM_ERR_INVALID, ptr, "a schema must be an object or a boolean");
    } else {
        ok = gen_body(g, s, &body, ptr, depth);
    }
    if (ok && (body.oom || !body.s)) ok = fail(g, LOOM_ERR_NOMEM, ptr, "out of memory");
    if (ok) gbuf_printf(&g->out, "s%d ::= %s\n", rule, body.s);
    free(body.s);
    return ok ? rule : -1;
}

loom_status gram_schema_to_gbnf(const char *schema, size_t len, const gram_limits *lim, char **gbnf, char *why,
                                size_t cap) {
    *gbnf = NULL;
    if ((int64_t)len > lim->max_text_bytes) {
        snprintf(why, cap, "schema of %zu bytes is past the plugin's max_text_bytes (%lld)", len,
                 (long long)lim->max_text_bytes);
        return LOOM_ERR_INVALID;
    }
    gen g = {.lim = lim, .why = why, .cap = cap};
    cJSON *root = NULL;
    if (schema) {
        root = cJSON_ParseWithLength(schema, len);
        if (!root) {
            const char *at = cJSON_GetErrorPtr();
            size_t off = at && at >= schema && at <= schema + len ? (size_t)(at - schema) : 0;
            snprintf(why, cap, "the schema is not valid JSON (near byte %zu)", off);
            return LOOM_ERR_INVALID;
        }
    }
    g.root = root;
    gbuf_put(&g.out, k_base);
    int32_t top = root ? gen_schema(&g, root, "", 0) : -1;
    if (!root) gbuf_put(&g.out, "root ::= object\n");
    else if (top >= 0) gbuf_printf(&g.out, "root ::= s%d\n", top);
    cJSON_Delete(root);
    free(g.refs);
    if (g.st == LOOM_OK && g.out.oom) {
        snprintf(why, cap, "out of memory translating the schema");
        g.st = LOOM_ERR_NOMEM;
    }
    if (g.st != LOOM_OK) {
        free(g.out.s);
        return g.st;
    }
    *gbnf = g.out.s;
    return LOOM_OK;
}
