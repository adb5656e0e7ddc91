/*
 * plugins/constraint/grammar/regex.c — a regular expression to GBNF text
 * (the "regex" language): the whole generated text must match it, as
 * Python's re.fullmatch and vLLM's guided_regex read it.
 *
 * Supported: literals, `.` (any character but a newline), [classes] with
 * ranges, ^ and the escapes below, ( ) (?: ) (?P<name> ) (?<name> ) groups,
 * |, * + ? {m} {m,} {m,n} (a trailing ? or + — lazy, possessive — changes
 * nothing for a full match), \d \D \w \W \s \S (ASCII meaning), \n \t \r
 * \f \v \0 \xHH \uHHHH and escaped punctuation, ^ at the start and $ at the
 * end. The shorthands match their ASCII members only. Refused with the
 * offset: backreferences, lookarounds, \b \B \A \Z, anchors elsewhere and
 * flags groups.
 *
 * A class is gathered as code-point ranges before it is written, so the
 * JSON-string mode (a JSON schema's `pattern` and `format`) can split it:
 * the members JSON writes as themselves in one GBNF class, the ones it must
 * escape as their escape sequences beside it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

/* A class being read: inclusive code-point ranges, in source order. */
typedef struct rset {
    uint32_t *r;               /* (2 * n) lo, hi pairs                       */
    int32_t n, cap;
    bool negated;
    bool oom;
} rset;

typedef struct rx {
    const char *s;
    size_t len, pos;
    gbuf out;
    bool json;                 /* the JSON-string mode (gram_regex_json_body) */
    char *why;
    size_t why_cap;
    loom_status st;
    int depth;
} rx;

static void rx_put(rx *r, const char *s) { gbuf_put(&r->out, s); }

static void rset_add(rset *c, uint32_t lo, uint32_t hi) {
    if (c->oom) return;
    if (c->n == c->cap) {
        int32_t nc = c->cap ? 2 * c->cap : 16;
        uint32_t *q = realloc(c->r, (size_t)nc * 2 * sizeof *q);
        if (!q) {
            c->oom = true;
            return;
        }
        c->r = q;
        c->cap = nc;
    }
    c->r[2 * c->n] = lo;
    c->r[2 * c->n + 1] = hi;
    c->n++;
}

static bool rset_has(const rset *c, uint32_t cp) {
    bool in = false;
    for (int32_t i = 0; i < c->n && !in; i++) in = c->r[2 * i] <= cp && cp <= c->r[2 * i + 1];
    return in != c->negated;
}

static bool rx_fail(rx *r, const char *fmt, ...) {
    if (r->st != LOOM_OK) return false;
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(r->why, r->why_cap, "regex at offset %zu: %s", r->pos, m);
    r->st = LOOM_ERR_UNSUPPORTED;
    return false;
}

static int rx_peek(const rx *r) { return r->pos < r->len ? (unsigned char)r->s[r->pos] : -1; }

/* One code point as a GBNF escape. */
static void rx_cp(rx *r, uint32_t cp) {
    char b[16];
    snprintf(b, sizeof b, "\\U%08X", cp);
    rx_put(r, b);
}

static bool rx_utf8(rx *r, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)r->s + r->pos;
    size_t left = r->len - r->pos;
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || (size_t)n > left) return rx_fail(r, "invalid UTF-8");
    uint32_t v = n == 1 ? s[0] : s[0] & (0x7Fu >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return rx_fail(r, "invalid UTF-8");
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    r->pos += (size_t)n;
    *cp = v;
    return true;
}

static bool rx_hex(rx *r, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int c = rx_peek(r), d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return rx_fail(r, "bad hex escape");
        v = v * 16 + (uint32_t)d;
        r->pos++;
    }
    *cp = v;
    return true;
}

/* A shorthand class as inclusive ranges ending with 0, 0: its ASCII
 * members only, a subset of Python's Unicode classes either way (\D must
 * not take an Arabic-Indic digit, \S must not take U+001C, which Python
 * calls space). NULL when c names no shorthand. */
static const uint32_t *rx_shorthand(int c) {
    static const uint32_t d[] = {'0', '9', 0, 0}, D[] = {0x00, 0x2F, 0x3A, 0x7F, 0, 0},
                          w[] = {'0', '9', 'A', 'Z', 'a', 'z', '_', '_', 0, 0},
                          W[] = {0x00, 0x2F, 0x3A, 0x40, 0x5B, 0x5E, 0x60, 0x60, 0x7B, 0x7F, 0, 0},
                          sp[] = {' ', ' ', 0x09, 0x0D, 0, 0}, S[] = {0x00, 0x08, 0x0E, 0x1B, 0x21, 0x7F, 0, 0};
    switch (c) {
    case 'd': return d;
    case 'D': return D;
    case 'w': return w;
    case 'W': return W;
    case 's': return sp;
    case 'S': return S;
    }
    return NULL;
}

static void rset_add_shorthand(rset *c, const uint32_t *sh) {
    for (; sh[0] || sh[1]; sh += 2) rset_add(c, sh[0], sh[1]);
}

/* An escape after '\' that stands for one code point; false if it is not one. */
static bool rx_escape_cp(rx *r, int c, uint32_t *cp) {
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x': return rx_hex(r, 2, cp);
    case 'u': return rx_hex(r, 4, cp);
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
        r->pos--;
        return rx_fail(r, "escape '\\%c' is not supported (backreferences, \\b, \\A, \\Z ...)", c);
    }
    *cp = (uint32_t)c;
    return true;
}

/* One member of a class (a character, a range or a shorthand) into c. */
static bool rx_class_item(rx *r, rset *cls) {
    uint32_t lo, hi;
    if (rx_peek(r) == '\\') {
        r->pos++;
        int c = rx_peek(r);
        r->pos++;
        const uint32_t *sh = rx_shorthand(c);
        if (sh) {
            rset_add_shorthand(cls, sh);
            return true;
        }
        if (c < 0 || !rx_escape_cp(r, c, &lo)) return c < 0 ? rx_fail(r, "unterminated class") : false;
    } else if (!rx_utf8(r, &lo)) {
        return false;
    }
    hi = lo;
    if (rx_peek(r) == '-' && r->pos + 1 < r->len && r->s[r->pos + 1] != ']') {
        r->pos++;
        if (rx_peek(r) == '\\') {
            r->pos++;
            int c = rx_peek(r);
            r->pos++;
            if (c < 0 || rx_shorthand(c) || !rx_escape_cp(r, c, &hi)) return rx_fail(r, "bad class range end");
        } else if (!rx_utf8(r, &hi)) {
            return false;
        }
        if (hi < lo) return rx_fail(r, "class range with its end before its start");
    }
    rset_add(cls, lo, hi);
    return true;
}

/* The code points JSON writes escaped inside a string. */
static bool json_special(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

/* Ranges as GBNF class members. */
static void rx_ranges(rx *r, const uint32_t *rg, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        rx_cp(r, rg[2 * i]);
        if (rg[2 * i + 1] != rg[2 * i]) {
            rx_put(r, "-");
            rx_cp(r, rg[2 * i + 1]);
        }
    }
}

/* The members of c that JSON writes as themselves, as one GBNF class into
 * r; false when there are none. */
static bool rx_json_plain(rx *r, const rset *c) {
    if (c->negated) {
        rx_put(r, "[^\\x00-\\x1F\\x22\\x5C");
        rx_ranges(r, c->r, c->n);
        rx_put(r, "]");
        return true;
    }
    rset cut = {0};
    static const uint32_t holes[][2] = {{0x00, 0x1F}, {0x22, 0x22}, {0x5C, 0x5C}};
    for (int32_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[2 * i], hi = c->r[2 * i + 1];
        for (int h = 0; h < 3 && lo <= hi; h++) {
            if (hi < holes[h][0] || lo > holes[h][1]) continue;
            if (lo < holes[h][0]) rset_add(&cut, lo, holes[h][0] - 1);
            if (hi <= holes[h][1]) lo = 1, hi = 0; /* the rest falls in the hole */
            else lo = holes[h][1] + 1;
        }
        if (lo <= hi) rset_add(&cut, lo, hi);
    }
    if (cut.oom) r->out.oom = true;
    bool any = cut.n > 0;
    if (any) {
        rx_put(r, "[");
        rx_ranges(r, cut.r, cut.n);
        rx_put(r, "]");
    }
    free(cut.r);
    return any;
}

/* JSON's short escape letter for cp, or 0 when it has none (\u00XX). */
static char json_short_escape(uint32_t cp) {
    switch (cp) {
    case '\b': return 'b';
    case '\f': return 'f';
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    case '"': return '"';
    case '\\': return '\\';
    }
    return 0;
}

/* The escape sequence of special code point cp as a GBNF expression: the
 * backslash, then the letter, or u00 and two hex digits (either case). */
static void rx_json_escape(rx *r, uint32_t cp) {
    static const char hex[] = "0123456789ABCDEF";
    char e = json_short_escape(cp), lit[48];
    if (e == '"' || e == '\\') snprintf(lit, sizeof lit, "\"\\\\\\%c\"", e);
    else if (e) snprintf(lit, sizeof lit, "\"\\\\%c\"", e);
    else if ((cp & 15) < 10) snprintf(lit, sizeof lit, "\"\\\\u00%c%c\"", hex[cp >> 4], hex[cp & 15]);
    else snprintf(lit, sizeof lit, "\"\\\\u00%c\" [%c%c]", hex[cp >> 4], hex[cp & 15], hex[cp & 15] + 32);
    rx_put(r, lit);
}

/* Class c as GBNF: one class, or in the JSON-string mode the members JSON
 * writes as themselves and the escape sequences of the others, as
 * alternatives. */
static bool rx_emit_set(rx *r, const rset *c) {
    if (c->oom) {
        r->out.oom = true;
        return true;
    }
    if (!r->json) {
        rx_put(r, c->negated ? "[^" : "[");
        rx_ranges(r, c->r, c->n);
        rx_put(r, "]");
        return true;
    }
    rx_put(r, "(");
    bool any = rx_json_plain(r, c);
    for (uint32_t cp = 0; cp <= '\\'; cp++) {
        if (!json_special(cp) || !rset_has(c, cp)) continue;
        if (any) rx_put(r, " | ");
        rx_json_escape(r, cp);
        any = true;
    }
    rx_put(r, ")");
    return any ? true : rx_fail(r, "a class that no character matches");
}


static bool rx_class(rx *r) {
    r->pos++; /* [ */
    rset cls = {0};
    if (rx_peek(r) == '^') {
        r->pos++;
        cls.negated = true;
    }
    bool first = true, ok = true;
    while (ok && (rx_peek(r) != ']' || first)) {
        if (rx_peek(r) < 0) ok = rx_fail(r, "unterminated class");
        else if (rx_peek(r) == ']') { /* a ']' first is a literal */
            r->pos++;
            rset_add(&cls, ']', ']');
        } else {
            ok = rx_class_item(r, &cls);
        }
        first = false;
    }
    if (ok) {
        r->pos++;
        ok = rx_emit_set(r, &cls);
    }
    free(cls.r);
    return ok;
}

static bool rx_alts(rx *r);

static bool rx_group(rx *r) {
    r->pos++; /* ( */
    if (rx_peek(r) == '?') {
        r->pos++;
        int c = rx_peek(r);
        if (c == ':') {
            r->pos++;
        } else if (c == 'P' || (c == '<' && r->pos + 1 < r->len && r->s[r->pos + 1] != '=' && r->s[r->pos + 1] != '!')) {
            if (c == 'P') r->pos++;
            if (rx_peek(r) != '<') return rx_fail(r, "unsupported group syntax");
            while (rx_peek(r) >= 0 && rx_peek(r) != '>') r->pos++;
            if (rx_peek(r) != '>') return rx_fail(r, "unterminated group name");
            r->pos++;
        } else {
            return rx_fail(r, "lookarounds, flags and conditionals are not supported");
        }
    }
    rx_put(r, "(");
    if (!rx_alts(r)) return false;
    if (rx_peek(r) != ')') return rx_fail(r, "unclosed '('");
    r->pos++;
    rx_put(r, ")");
    return true;
}

static bool rx_atom(rx *r) {
    int c = rx_peek(r);
    uint32_t cp;
    if (c == '(') return rx_group(r);
    if (c == '[') return rx_class(r);
    if (c == '.') {
        r->pos++;
        rset dot = {.negated = true};
        rset_add(&dot, '\n', '\n');
        if (r->json) rset_add(&dot, '\r', '\r'), rset_add(&dot, 0x2028, 0x2029);
        bool ok = rx_emit_set(r, &dot);
        free(dot.r);
        return ok;
    }
    if (c == '^' || c == '$') return rx_fail(r, "anchors are supported only at the very start (^) and end ($)");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(r, "nothing to repeat");
    if (c == '\\') {
        r->pos++;
        c = rx_peek(r);
        if (c < 0) return rx_fail(r, "a trailing backslash");
        r->pos++;
        const uint32_t *sh = rx_shorthand(c);
        if (sh) {
            rset cls = {0};
            rset_add_shorthand(&cls, sh);
            bool ok = rx_emit_set(r, &cls);
            free(cls.r);
            return ok;
        }
        if (!rx_escape_cp(r, c, &cp)) return false;
    } else if (!rx_utf8(r, &cp)) {
        return false;
    }
    if (r->json && json_special(cp)) { /* one code point: its class form is its escape */
        rset one = {0};
        rset_add(&one, cp, cp);
        bool ok = rx_emit_set(r, &one);
        free(one.r);
        return ok;
    }
    rx_put(r, "\"");
    rx_cp(r, cp);
    rx_put(r, "\"");
    return true;
}

/* A quantifier after an atom, copied as GBNF; a lazy or possessive mark
 * after it is dropped. */
static bool rx_quantifier(rx *r) {
    int c = rx_peek(r);
    if (c == '*' || c == '+' || c == '?') {
        char q[2] = {(char)c, 0};
        rx_put(r, q);
        r->pos++;
    } else if (c == '{') {
        size_t start = r->pos;
        r->pos++;
        while (rx_peek(r) >= '0' && rx_peek(r) <= '9') r->pos++;
        if (rx_peek(r) == ',') r->pos++;
        while (rx_peek(r) >= '0' && rx_peek(r) <= '9') r->pos++;
        if (rx_peek(r) != '}' || r->pos == start + 1) {
            r->pos = start; /* Python reads a '{' that opens no count as a literal */
            return true;
        }
        r->pos++;
        char q[64];
        size_t k = r->pos - start < sizeof q - 1 ? r->pos - start : sizeof q - 1;
        memcpy(q, r->s + start, k);
        q[k] = 0;
        if (q[1] == ',') rx_put(r, "{0"), rx_put(r, q + 1); /* {,n} is {0,n} */
        else rx_put(r, q);
    } else {
        return true;
    }
    if (rx_peek(r) == '?' || rx_peek(r) == '+') r->pos++;
    if (rx_peek(r) == '*' || rx_peek(r) == '+' || rx_peek(r) == '?') return rx_fail(r, "multiple repeat");
    return true;
}

static bool rx_seq(rx *r) {
    rx_put(r, "(\"\"");
    for (;;) {
        int c = rx_peek(r);
        if (c < 0 || c == '|' || c == ')') break;
        if (c == '$' && r->pos + 1 == r->len) break;
        if (c == '{') { /* a '{' that opens no count is a literal (see rx_quantifier) */
            r->pos++;
            rx_put(r, " \"{\"");
            continue;
        }
        rx_put(r, " (");
        if (!rx_atom(r)) return false;
        rx_put(r, ")");
        if (!rx_quantifier(r)) return false;
    }
    rx_put(r, ")");
    return true;
}

static bool rx_alts(rx *r) {
    if (++r->depth > 256) return rx_fail(r, "groups nested deeper than 256");
    if (!rx_seq(r)) return false;
    while (rx_peek(r) == '|') {
        r->pos++;
        rx_put(r, " | ");
        if (!rx_seq(r)) return false;
    }
    r->depth--;
    return true;
}

/* The regex's alternatives as one GBNF expression into r->out; false
 * (r->st says why) when it cannot. */
static bool rx_translate(rx *r, const gram_limits *lim) {
    if ((int64_t)r->len > lim->max_text_bytes) {
        snprintf(r->why, r->why_cap, "regex of %zu bytes is past the plugin's max_text_bytes (%lld)", r->len,
                 (long long)lim->max_text_bytes);
        r->st = LOOM_ERR_INVALID;
        return false;
    }
    if (rx_peek(r) == '^') r->pos++;
    bool ok = rx_alts(r);
    if (ok && rx_peek(r) == '$' && r->pos + 1 == r->len) r->pos++;
    if (ok && r->pos != r->len) ok = rx_fail(r, rx_peek(r) == ')' ? "')' without '('" : "unexpected character");
    if (ok && r->out.oom) {
        snprintf(r->why, r->why_cap, "out of memory translating the regex");
        r->st = LOOM_ERR_NOMEM;
        ok = false;
    }
    return ok;
}

loom_status gram_regex_to_gbnf(const char *re, size_t len, const gram_limits *lim, char **gbnf, char *why,
                               size_t cap) {
    *gbnf = NULL;
    rx r = {.s = re, .len = len, .why = why, .why_cap = cap};
    rx_put(&r, "root ::= ");
    if (!rx_translate(&r, lim)) {
        free(r.out.s);
        return r.st;
    }
    rx_put(&r, "\n");
    if (r.out.oom) {
        free(r.out.s);
        snprintf(why, cap, "out of memory translating the regex");
        return LOOM_ERR_NOMEM;
    }
    *gbnf = r.out.s;
    return LOOM_OK;
}

loom_status gram_regex_json_body(const char *re, size_t len, const gram_limits *lim, char **body, char *why,
                                 size_t cap) {
    *body = NULL;
    rx r = {.s = re, .len = len, .json = true, .why = why, .why_cap = cap};
    if (!rx_translate(&r, lim)) {
        free(r.out.s);
        return r.st;
    }
    *body = r.out.s;
    return LOOM_OK;
}
