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
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

typedef struct rx {
    const char *s;
    size_t len, pos;
    char *out;
    size_t n, cap;
    bool oom;
    char *why;
    size_t why_cap;
    loom_status st;
    int depth;
} rx;

static void rx_put(rx *r, const char *s) {
    size_t k = strlen(s);
    if (r->oom) return;
    if (r->n + k + 1 > r->cap) {
        size_t nc = r->cap ? 2 * r->cap : 256;
        while (nc < r->n + k + 1) nc *= 2;
        char *q = realloc(r->out, nc);
        if (!q) {
            r->oom = true;
            return;
        }
        r->out = q;
        r->cap = nc;
    }
    memcpy(r->out + r->n, s, k + 1);
    r->n += k;
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

/* A shorthand class as GBNF class body text: its ASCII members only, a
 * subset of Python's Unicode classes either way (\D must not take an
 * Arabic-Indic digit, \S must not take U+001C, which Python calls space). */
static const char *rx_shorthand(int c) {
    switch (c) {
    case 'd': return "0-9";
    case 'D': return "\\x00-\\x2F\\x3A-\\x7F";
    case 'w': return "0-9A-Za-z_";
    case 'W': return "\\x00-\\x2F\\x3A-\\x40\\x5B-\\x5E\\x60\\x7B-\\x7F";
    case 's': return " \\t\\n\\r\\x0B\\x0C";
    case 'S': return "\\x00-\\x08\\x0E-\\x1B\\x21-\\x7F";
    }
    return NULL;
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

/* One member of a class (a character, a range or a shorthand) into the
 * GBNF class body. */
static bool rx_class_item(rx *r) {
    uint32_t lo, hi;
    if (rx_peek(r) == '\\') {
        r->pos++;
        int c = rx_peek(r);
        r->pos++;
        const char *sh = rx_shorthand(c);
        if (sh) {
            rx_put(r, sh);
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
    rx_cp(r, lo);
    if (hi != lo) {
        rx_put(r, "-");
        rx_cp(r, hi);
    }
    return true;
}

static bool rx_class(rx *r) {
    r->pos++; /* [ */
    rx_put(r, "[");
    if (rx_peek(r) == '^') {
        r->pos++;
        rx_put(r, "^");
    }
    bool first = true;
    while (rx_peek(r) != ']' || first) {
        if (rx_peek(r) < 0) return rx_fail(r, "unterminated class");
        if (rx_peek(r) == ']') { /* a ']' first is a literal */
            r->pos++;
            rx_cp(r, ']');
        } else if (!rx_class_item(r)) {
            return false;
        }
        first = false;
    }
    r->pos++;
    rx_put(r, "]");
    return true;
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
        rx_put(r, "[^\\n]");
        return true;
    }
    if (c == '^' || c == '$') return rx_fail(r, "anchors are supported only at the very start (^) and end ($)");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(r, "nothing to repeat");
    if (c == '\\') {
        r->pos++;
        c = rx_peek(r);
        if (c < 0) return rx_fail(r, "a trailing backslash");
        r->pos++;
        const char *sh = rx_shorthand(c);
        if (sh) {
            rx_put(r, "[");
            rx_put(r, sh);
            rx_put(r, "]");
            return true;
        }
        if (!rx_escape_cp(r, c, &cp)) return false;
    } else if (!rx_utf8(r, &cp)) {
        return false;
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

loom_status gram_regex_to_gbnf(const char *re, size_t len, const gram_limits *lim, char **gbnf, char *why,
                               size_t cap) {
    *gbnf = NULL;
    if ((int64_t)len > lim->max_text_bytes) {
        snprintf(why, cap, "regex of %zu bytes is past the plugin's max_text_bytes (%lld)", len,
                 (long long)lim->max_text_bytes);
        return LOOM_ERR_INVALID;
    }
    rx r = {.s = re, .len = len, .why = why, .why_cap = cap};
    if (rx_peek(&r) == '^') r.pos++;
    rx_put(&r, "root ::= ");
    bool ok = rx_alts(&r);
    if (ok && rx_peek(&r) == '$' && r.pos + 1 == r.len) r.pos++;
    if (ok && r.pos != r.len) ok = rx_fail(&r, rx_peek(&r) == ')' ? "')' without '('" : "unexpected character");
    if (ok && r.oom) {
        snprintf(why, cap, "out of memory translating the regex");
        r.st = LOOM_ERR_NOMEM;
        ok = false;
    }
    if (!ok) {
        free(r.out);
        return r.st;
    }
    rx_put(&r, "\n");
    *gbnf = r.out;
    return LOOM_OK;
}
