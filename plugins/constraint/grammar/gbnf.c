/*
 * plugins/constraint/grammar/gbnf.c — GBNF text to a flat grammar (gram.h).
 *
 * The dialect is llama.cpp's: `name ::= alternatives`, "literals" with C
 * escapes, [classes] with ranges and ^, `.` (any code point), ( groups ),
 * | , the repetitions * + ? {m} {m,} {m,n}, and # comments. Rules may come
 * in any order; a rule ends where the next `name ::=` begins. Repetitions
 * are expanded into rules here, so the matcher knows only classes and
 * references. Refused, naming line:column: undefined rules, no `root`, left
 * recursion (the matcher expands leftmost references eagerly and would not
 * terminate), and anything past the limits (text, elements, repetition).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

typedef struct rule_buf {
    char *name;                /* owned; NULL for a generated rule           */
    bool defined;
    size_t first_use;          /* offset of the first reference (errors)     */
    g_elem *e;
    int32_t n, cap;
} rule_buf;

typedef struct parser {
    const char *s;
    size_t len, pos;
    const gram_limits *lim;
    rule_buf *rules;
    int32_t n_rules, cap_rules;
    g_class *classes;
    int32_t n_classes, cap_classes;
    uint32_t *ranges;          /* pairs                                      */
    int32_t n_ranges, cap_ranges;
    int64_t total;             /* elements in every rule                     */
    int32_t *names;            /* (names_cap) rule ids by name hash, -1 empty */
    int32_t names_cap, named;
    char *why;
    size_t cap;
    loom_status st;            /* first failure; LOOM_OK while parsing       */
} parser;

/* ------------------------------------------------------------- errors */

static void where(const parser *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static bool fail_at(parser *p, size_t at, loom_status code, const char *msg) {
    if (p->st != LOOM_OK) return false;
    int line, col;
    where(p, at, &line, &col);
    snprintf(p->why, p->cap, "grammar %d:%d: %s", line, col, msg);
    p->st = code;
    return false;
}

static bool fail(parser *p, const char *msg) { return fail_at(p, p->pos, LOOM_ERR_INVALID, msg); }

static bool grow(void **arr, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*arr, (size_t)nc * elem);
    if (!q) return false;
    *arr = q;
    *cap = nc;
    return true;
}

/* -------------------------------------------------------------- building */

static bool push(parser *p, int32_t rid, int32_t type, int32_t arg) {
    if (++p->total > p->lim->max_elements) {
        char m[128];
        snprintf(m, sizeof m, "the grammar grows past %lld elements (the plugin's max_elements)",
                 (long long)p->lim->max_elements);
        return fail_at(p, p->pos, LOOM_ERR_INVALID, m);
    }
    rule_buf *r = &p->rules[rid];
    if (!grow((void **)&r->e, &r->cap, r->n + 1, sizeof(g_elem))) return fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
    r->e[r->n++] = (g_elem){type, arg};
    return true;
}

static int32_t new_rule(parser *p, const char *name, size_t nlen) {
    if (!grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(rule_buf))) {
        fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
        return -1;
    }
    rule_buf *r = &p->rules[p->n_rules];
    *r = (rule_buf){.first_use = p->pos};
    if (name) {
        if (!(r->name = strndup(name, nlen))) {
            fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
            return -1;
        }
    }
    return p->n_rules++;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* Double the name table and re-place every named rule. */
static bool names_grow(parser *p) {
    int32_t nc = p->names_cap ? 2 * p->names_cap : 256;
    int32_t *t = malloc((size_t)nc * sizeof *t);
    if (!t) return false;
    memset(t, 0xFF, (size_t)nc * sizeof *t);
    for (int32_t i = 0; i < p->n_rules; i++) {
        if (!p->rules[i].name) continue;
        uint32_t j = name_hash(p->rules[i].name, strlen(p->rules[i].name)) & (uint32_t)(nc - 1);
        while (t[j] >= 0) j = (j + 1) & (uint32_t)(nc - 1);
        t[j] = i;
    }
    free(p->names);
    p->names = t;
    p->names_cap = nc;
    return true;
}

/* The rule named name[0..nlen), created on first use (a hash table: a
 * grammar of many rules must not cost a scan per reference). */
static int32_t find_rule(parser *p, const char *name, size_t nlen) {
    if (2 * (p->named + 1) > p->names_cap && !names_grow(p)) {
        fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
        return -1;
    }
    uint32_t mask = (uint32_t)(p->names_cap - 1), j = name_hash(name, nlen) & mask;
    for (; p->names[j] >= 0; j = (j + 1) & mask) {
        const char *n = p->rules[p->names[j]].name;
        if (strlen(n) == nlen && !memcmp(n, name, nlen)) return p->names[j];
    }
    int32_t id = new_rule(p, name, nlen);
    if (id >= 0) {
        p->names[j] = id;
        p->named++;
    }
    return id;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* A class from `n` [lo, hi] pairs (sorted and merged here). */
static int32_t add_class(parser *p, bool negated, uint32_t *pairs, int32_t n) {
    if (n > 0) qsort(pairs, (size_t)n, 2 * sizeof(uint32_t), cmp_range);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m > 0 && pairs[2 * i] <= pairs[2 * (m - 1) + 1] + 1) {
            if (pairs[2 * i + 1] > pairs[2 * (m - 1) + 1]) pairs[2 * (m - 1) + 1] = pairs[2 * i + 1];
        } else {
            pairs[2 * m] = pairs[2 * i];
            pairs[2 * m + 1] = pairs[2 * i + 1];
            m++;
        }
    }
    if (!grow((void **)&p->classes, &p->cap_classes, p->n_classes + 1, sizeof(g_class)) ||
        !grow((void **)&p->ranges, &p->cap_ranges, 2 * (p->n_ranges + m), sizeof(uint32_t))) {
        fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
        return -1;
    }
    if (m > 0) memcpy(p->ranges + 2 * p->n_ranges, pairs, (size_t)m * 2 * sizeof(uint32_t));
    p->classes[p->n_classes] = (g_class){.negated = negated, .first = p->n_ranges, .count = m};
    p->n_ranges += m;
    return p->n_classes++;
}

static bool push_char(parser *p, int32_t rid, uint32_t cp) {
    uint32_t pair[2] = {cp, cp};
    int32_t c = add_class(p, false, pair, 1);
    return c >= 0 && push(p, rid, G_CLASS, c);
}

/* ------------------------------------------------------------- lexing */

static int peek(const parser *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n') p->pos++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->pos++;
        } else {
            break;
        }
    }
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static size_t name_len_at(const parser *p, size_t at) {
    size_t n = 0;
    while (at + n < p->len && is_name_char((unsigned char)p->s[at + n])) n++;
    return n;
}

/* Offset just past `::=` when the text at pos is `name ::=`, else 0. */
static size_t rule_body_at(const parser *p) {
    size_t n = name_len_at(p, p->pos);
    if (n == 0) return 0;
    size_t q = p->pos + n;
    while (q < p->len && (p->s[q] == ' ' || p->s[q] == '\t')) q++;
    return q + 3 <= p->len && !memcmp(p->s + q, "::=", 3) ? q + 3 : 0;
}

static bool at_rule_start(const parser *p) { return rule_body_at(p) != 0; }

/* One UTF-8 code point of the text (the grammar's own characters). */
static bool read_utf8(parser *p, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)p->s + p->pos;
    size_t left = p->len - p->pos;
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || (size_t)n > left) return fail(p, "invalid UTF-8 in the grammar text");
    uint32_t v = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail(p, "invalid UTF-8 in the grammar text");
        v = (v << 6) | (s[i] & 0x3F);
    }
    p->pos += (size_t)n;
    *cp = v;
    return true;
}

static bool read_hex(parser *p, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int c = peek(p);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(p, "bad hex escape");
        v = v * 16 + (uint32_t)d;
        p->pos++;
    }
    if (v > 0x10FFFF) return fail(p, "escape beyond U+10FFFF");
    *cp = v;
    return true;
}

/* One character of a literal or class, escapes decoded. */
static bool read_char(parser *p, uint32_t *cp) {
    if (peek(p) < 0) return fail(p, "unexpected end of the grammar text");
    if (peek(p) != '\\') return read_utf8(p, cp);
    p->pos++;
    int c = peek(p);
    p->pos++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'x': return read_hex(p, 2, cp);
    case 'u': return read_hex(p, 4, cp);
    case 'U': return read_hex(p, 8, cp);
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = (uint32_t)c; return true;
    default: p->pos--; return fail(p, "unknown escape");
    }
}

/* ------------------------------------------------------------- parsing */

static bool parse_alternatives(parser *p, int32_t rid, int depth);

static bool parse_literal(parser *p, int32_t rid) {
    p->pos++; /* opening quote */
    while (peek(p) != '"') {
        uint32_t cp;
        if (peek(p) < 0) return fail(p, "unterminated string literal");
        if (!read_char(p, &cp) || !push_char(p, rid, cp)) return false;
    }
    p->pos++;
    return true;
}

static bool parse_class(parser *p, int32_t rid) {
    p->pos++; /* [ */
    bool neg = false;
    if (peek(p) == '^') {
        neg = true;
        p->pos++;
    }
    uint32_t *pairs = NULL;
    int32_t n = 0, cap = 0;
    bool ok = true;
    while (ok && peek(p) != ']') {
        uint32_t lo, hi;
        if (peek(p) < 0) {
            ok = fail(p, "unterminated character class");
            break;
        }
        if (!(ok = read_char(p, &lo))) break;
        hi = lo;
        if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
            p->pos++;
            if (!(ok = read_char(p, &hi))) break;
            if (hi < lo) {
                ok = fail(p, "class range with its end before its start");
                break;
            }
        }
        if (!(ok = grow((void **)&pairs, &cap, 2 * (n + 1), sizeof(uint32_t)))) {
            fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
            break;
        }
        pairs[2 * n] = lo;
        pairs[2 * n + 1] = hi;
        n++;
    }
    int32_t c = ok ? add_class(p, neg, pairs, n) : -1;
    free(pairs);
    if (c < 0) return false;
    p->pos++; /* ] */
    return push(p, rid, G_CLASS, c);
}

static bool parse_group(parser *p, int32_t rid, int depth) {
    size_t open = p->pos++;
    int32_t sub = new_rule(p, NULL, 0);
    if (sub < 0 || !parse_alternatives(p, sub, depth + 1) || !push(p, sub, G_END, 0)) return false;
    skip_ws(p);
    if (peek(p) != ')') return fail_at(p, open, LOOM_ERR_INVALID, "unclosed '('");
    p->pos++;
    return push(p, rid, G_REF, sub);
}

static bool parse_primary(parser *p, int32_t rid, int depth) {
    int c = peek(p);
    if (c == '"') return parse_literal(p, rid);
    if (c == '[') return parse_class(p, rid);
    if (c == '(') return parse_group(p, rid, depth);
    if (c == '.') {
        p->pos++;
        int32_t cls = add_class(p, true, NULL, 0);
        return cls >= 0 && push(p, rid, G_CLASS, cls);
    }
    size_t n = name_len_at(p, p->pos);
    if (n == 0) return fail(p, "expected a literal, a [class], a rule name or '('");
    int32_t ref = find_rule(p, p->s + p->pos, n);
    p->pos += n;
    return ref >= 0 && push(p, rid, G_REF, ref);
}

/* Parse {m}, {m,}, {m,n} after '{'; max -1 = unbounded. */
/* Decimal digits at pos (inside the text, which need not be
 * NUL-terminated), saturating past 10^12; -1 when there are none. */
static int64_t read_count(parser *p) {
    int64_t v = -1;
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (peek(p) - '0');
        if (v > 1000000000000LL) v = 1000000000000LL;
        p->pos++;
    }
    return v;
}

static bool parse_braces(parser *p, int64_t *min, int64_t *max) {
    p->pos++;
    if ((*min = read_count(p)) < 0) return fail(p, "expected a count after '{'");
    *max = *min;
    if (peek(p) == ',') {
        p->pos++;
        *max = -1;
        if (peek(p) != '}' && ((*max = read_count(p)) < 0 || *max < *min))
            return fail(p, "bad {m,n}: n must be a count >= m");
    }
    if (peek(p) != '}') return fail(p, "expected '}'");
    p->pos++;
    int64_t biggest = *max > *min ? *max : *min;
    if (biggest > p->lim->max_repeat) {
        char m[128];
        snprintf(m, sizeof m, "repetition count %lld is past the plugin's max_repeat (%lld)", (long long)biggest,
                 (long long)p->lim->max_repeat);
        return fail(p, m);
    }
    return true;
}

static bool push_slice(parser *p, int32_t rid, const g_elem *x, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!push(p, rid, x[i].type, x[i].arg)) return false;
    return true;
}

/* The item x (n elements) repeated min..max times (max -1: unbounded),
 * appended to rule rid: min copies, then a rule for the optional rest. */
static bool repeat(parser *p, int32_t rid, const g_elem *x, int32_t n, int64_t min, int64_t max) {
    for (int64_t i = 0; i < min; i++)
        if (!push_slice(p, rid, x, n)) return false;
    if (max == min) return true;
    int32_t tail = -1;
    if (max < 0) { /* R ::= x R | "" */
        if ((tail = new_rule(p, NULL, 0)) < 0) return false;
        if (!push_slice(p, tail, x, n) || !push(p, tail, G_REF, tail) || !push(p, tail, G_ALT, 0) ||
            !push(p, tail, G_END, 0))
            return false;
        return push(p, rid, G_REF, tail);
    }
    for (int64_t k = 0; k < max - min; k++) { /* O_k ::= x O_{k-1} | "" */
        int32_t o = new_rule(p, NULL, 0);
        if (o < 0 || !push_slice(p, o, x, n)) return false;
        if (tail >= 0 && !push(p, o, G_REF, tail)) return false;
        if (!push(p, o, G_ALT, 0) || !push(p, o, G_END, 0)) return false;
        tail = o;
    }
    return push(p, rid, G_REF, tail);
}

static bool parse_postfix(parser *p, int32_t rid, int32_t item_start) {
    int c = peek(p);
    int64_t min, max;
    if (c == '*') min = 0, max = -1;
    else if (c == '+') min = 1, max = -1;
    else if (c == '?') min = 0, max = 1;
    else if (c != '{') return true;
    if (c == '{') {
        if (!parse_braces(p, &min, &max)) return false;
    } else {
        p->pos++;
    }
    rule_buf *r = &p->rules[rid];
    int32_t n = r->n - item_start;
    if (n == 0) return true; /* "" repeated is still "" */
    g_elem *x = malloc((size_t)n * sizeof *x);
    if (!x) return fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory");
    memcpy(x, r->e + item_start, (size_t)n * sizeof *x);
    r->n = item_start;
    p->total -= n;
    bool ok = repeat(p, rid, x, n, min, max);
    free(x);
    return ok;
}

static bool parse_sequence(parser *p, int32_t rid, int depth) {
    for (;;) {
        skip_ws(p);
        int c = peek(p);
        if (c < 0 || c == '|' || c == ')' || at_rule_start(p)) return true;
        int32_t start = p->rules[rid].n;
        if (!parse_primary(p, rid, depth)) return false;
        if (!parse_postfix(p, rid, start)) return false;
    }
}

static bool parse_alternatives(parser *p, int32_t rid, int depth) {
    if (depth > 256) return fail(p, "groups nested deeper than 256");
    if (!parse_sequence(p, rid, depth)) return false;
    while (peek(p) == '|') {
        p->pos++;
        if (!push(p, rid, G_ALT, 0) || !parse_sequence(p, rid, depth)) return false;
    }
    return true;
}

static bool parse_rules(parser *p) {
    skip_ws(p);
    if (peek(p) < 0) return fail(p, "empty grammar: it needs at least `root ::= ...`");
    while (skip_ws(p), peek(p) >= 0) {
        if (!at_rule_start(p)) return fail(p, "expected a rule `name ::= ...`");
        size_t n = name_len_at(p, p->pos);
        int32_t rid = find_rule(p, p->s + p->pos, n);
        if (rid < 0) return false;
        if (p->rules[rid].defined) return fail(p, "rule defined twice");
        p->rules[rid].defined = true;
        p->pos = rule_body_at(p);
        if (!parse_alternatives(p, rid, 0) || !push(p, rid, G_END, 0)) return false;
        if (peek(p) == ')') return fail(p, "')' without '('");
    }
    return true;
}

/* -------------------------------------------------------------- checks */

static bool check_defined(parser *p, int32_t *root) {
    *root = -1;
    for (int32_t i = 0; i < p->n_rules; i++) {
        if (p->rules[i].name && !p->rules[i].defined) {
            char m[160];
            snprintf(m, sizeof m, "rule '%.64s' is used but never defined", p->rules[i].name);
            return fail_at(p, p->rules[i].first_use, LOOM_ERR_INVALID, m);
        }
        if (p->rules[i].name && !strcmp(p->rules[i].name, "root")) *root = i;
    }
    if (*root < 0) return fail_at(p, 0, LOOM_ERR_INVALID, "no `root ::= ...` rule");
    return true;
}

static void flatten(parser *p, gram *g) {
    int32_t at = 0;
    for (int32_t i = 0; i < p->n_rules; i++) {
        g->rule_start[i] = at;
        memcpy(g->elems + at, p->rules[i].e, (size_t)p->rules[i].n * sizeof(g_elem));
        at += p->rules[i].n;
    }
    g->n_elems = at;
}

static void compute_nullable(const gram *g, bool *nullable) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            bool alt_ok = true;
            for (int32_t i = g->rule_start[r];; i++) {
                const g_elem *e = &g->elems[i];
                if (e->type == G_ALT || e->type == G_END) {
                    if (alt_ok) {
                        nullable[r] = changed = true;
                        break;
                    }
                    if (e->type == G_END) break;
                    alt_ok = true;
                } else if (e->type == G_CLASS || (e->type == G_REF && !nullable[e->arg])) {
                    alt_ok = false;
                }
            }
        }
    }
}

/* Rules referenced at a leftmost position of rule r (after only nullable
 * elements), into out; returns how many. A reference of r to itself that
 * ends its alternative is left out: nothing is pushed beneath it, so the
 * matcher re-enters r on the same stack and its expansion stops there (a
 * stack is expanded once per set, match.c) — that is how `x*` of an x that
 * can match nothing (`R ::= x R | ""`, regex `(a*)*`) loops, and it cannot
 * grow the stack. Every other cycle still is left recursion. */
static int32_t left_refs(const gram *g, const bool *nullable, int32_t r, int32_t *out) {
    int32_t n = 0;
    bool blocked = false;
    for (int32_t i = g->rule_start[r];; i++) {
        const g_elem *e = &g->elems[i];
        if (e->type == G_END) break;
        if (e->type == G_ALT) {
            blocked = false;
            continue;
        }
        if (blocked) continue;
        if (e->type == G_CLASS) blocked = true;
        else {
            const int32_t t = g->elems[i + 1].type;
            if (e->arg != r || (t != G_ALT && t != G_END)) out[n++] = e->arg;
            if (!nullable[e->arg]) blocked = true;
        }
    }
    return n;
}

/* Left recursion: a cycle in the leftmost-reference graph (iterative DFS). */
static bool check_left_recursion(parser *p, const gram *g) {
    bool *nullable = calloc((size_t)g->n_rules, sizeof(bool));
    uint8_t *color = calloc((size_t)g->n_rules, 1);
    int32_t *edges = malloc((size_t)(g->n_elems + 1) * sizeof(int32_t));
    int32_t *off = malloc((size_t)(g->n_rules + 1) * sizeof(int32_t));
    int32_t *stack = malloc((size_t)(g->n_rules + 1) * 2 * sizeof(int32_t));
    bool ok = nullable && color && edges && off && stack;
    if (!ok) fail_at(p, 0, LOOM_ERR_NOMEM, "out of memory");
    if (ok) {
        compute_nullable(g, nullable);
        int32_t ne = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            off[r] = ne;
            ne += left_refs(g, nullable, r, edges + ne);
        }
        off[g->n_rules] = ne;
    }
    for (int32_t s = 0; ok && s < g->n_rules; s++) {
        if (color[s]) continue;
        int32_t sp = 0;
        stack[sp++] = s, stack[sp++] = off[s];
        color[s] = 1;
        while (ok && sp > 0) {
            int32_t r = stack[sp - 2], *next = &stack[sp - 1];
            if (*next == off[r + 1]) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            int32_t t = edges[(*next)++];
            if (color[t] == 1) {
                char m[160];
                snprintf(m, sizeof m, "left recursion through rule '%.64s': a rule may not begin with itself",
                         p->rules[t].name ? p->rules[t].name : p->rules[r].name ? p->rules[r].name : "(group)");
                ok = fail_at(p, p->rules[t].first_use, LOOM_ERR_INVALID, m);
            } else if (color[t] == 0) {
                color[t] = 1;
                stack[sp++] = t, stack[sp++] = off[t];
            }
        }
    }
    free(nullable);
    free(color);
    free(edges);
    free(off);
    free(stack);
    return ok;
}

/* ---------------------------------------------------------------- entry */

static void parser_free(parser *p) {
    for (int32_t i = 0; i < p->n_rules; i++) {
        free(p->rules[i].name);
        free(p->rules[i].e);
    }
    free(p->rules);
    free(p->names);
    free(p->classes);
    free(p->ranges);
}

/* g->min_rest: for each element, the fewest code points that finish its
 * alternative from there (G_MIN_REST_MAX when none or not found in the
 * passes below: an estimate the matcher uses only to choose cache keys). */
static bool min_rest(gram *g) {
    int32_t n = g->n_elems;
    int32_t *rule = malloc((size_t)(g->n_rules > 0 ? g->n_rules : 1) * sizeof *rule);
    if (!(g->min_rest = malloc((size_t)(n > 0 ? n : 1) * sizeof *g->min_rest)) || !rule) {
        free(rule);
        return false;
    }
    for (int32_t r = 0; r < g->n_rules; r++) rule[r] = G_MIN_REST_MAX;
    for (int pass = 0, changed = 1; changed && pass < 64; pass++) {
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            int64_t best = G_MIN_REST_MAX, sum = 0;
            for (int32_t a = g->rule_start[r];; a++) {
                const g_elem *e = &g->elems[a];
                if (e->type == G_ALT || e->type == G_END) {
                    if (sum < best) best = sum;
                    sum = 0;
                    if (e->type == G_END) break;
                } else {
                    sum += e->type == G_CLASS ? 1 : rule[e->arg];
                    if (sum > G_MIN_REST_MAX) sum = G_MIN_REST_MAX;
                }
            }
            if (best < rule[r]) rule[r] = (int32_t)best, changed = 1;
        }
    }
    for (int32_t r = 0; r < g->n_rules; r++) { /* suffix sums, alternative by alternative */
        int32_t end = g->rule_start[r];
        while (g->elems[end].type != G_END) end++;
        int64_t sum = 0;
        for (int32_t a = end; a >= g->rule_start[r]; a--) {
            const g_elem *e = &g->elems[a];
            if (e->type == G_ALT || e->type == G_END) sum = 0;
            else sum += e->type == G_CLASS ? 1 : rule[e->arg];
            if (sum > G_MIN_REST_MAX) sum = G_MIN_REST_MAX;
            g->min_rest[a] = (int32_t)sum;
        }
    }
    free(rule);
    return true;
}

loom_status gram_parse(const char *text, size_t len, const gram_limits *lim, gram *out, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    parser p = {.s = text, .len = len, .lim = lim, .why = why, .cap = cap};
    if ((int64_t)len > lim->max_text_bytes) {
        snprintf(why, cap, "grammar text of %zu bytes is past the plugin's max_text_bytes (%lld)", len,
                 (long long)lim->max_text_bytes);
        return LOOM_ERR_INVALID;
    }
    if (memchr(text, '\0', len)) {
        snprintf(why, cap, "grammar text holds a NUL byte");
        return LOOM_ERR_INVALID;
    }
    int32_t root = -1;
    bool ok = parse_rules(&p) && check_defined(&p, &root);
    if (ok) {
        out->rule_start = malloc((size_t)p.n_rules * sizeof(int32_t));
        out->elems = malloc((size_t)(p.total + 1) * sizeof(g_elem));
        if (!out->rule_start || !out->elems) ok = fail_at(&p, 0, LOOM_ERR_NOMEM, "out of memory");
    }
    if (ok) {
        out->n_rules = p.n_rules;
        out->root = root;
        flatten(&p, out);
        ok = check_left_recursion(&p, out);
    }
    if (ok && !min_rest(out)) ok = fail_at(&p, 0, LOOM_ERR_NOMEM, "out of memory");
    if (ok) {
        out->classes = p.classes, out->n_classes = p.n_classes;
        out->ranges = p.ranges, out->n_ranges = p.n_ranges;
        p.classes = NULL, p.ranges = NULL;
    }
    parser_free(&p);
    if (!ok) gram_free(out);
    return ok ? LOOM_OK : p.st;
}

void gram_free(gram *g) {
    free(g->min_rest);
    free(g->elems);
    free(g->rule_start);
    free(g->classes);
    free(g->ranges);
    memset(g, 0, sizeof *g);
}

bool gram_class_has(const gram *g, int32_t cls, uint32_t cp) {
    const g_class *c = &g->classes[cls];
    if (c->count == 0) return c->negated; /* "." has no ranges at all */
    const uint32_t *r = g->ranges + 2 * c->first;
    int32_t lo = 0, hi = c->count - 1;
    bool in = false;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        if (cp < r[2 * mid]) hi = mid - 1;
        else if (cp > r[2 * mid + 1]) lo = mid + 1;
        else {
            in = true;
            break;
        }
    }
    return in != c->negated;
}
