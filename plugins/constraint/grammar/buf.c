/*
 * plugins/constraint/grammar/buf.c — the growing text buffer the
 * translators (schema.c, regex.c, range.c) write GBNF into. A failed
 * allocation sets `oom` and later writes do nothing, so a translator
 * checks once at the end.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

void gbuf_add(gbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->s, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->s = q;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void gbuf_put(gbuf *b, const char *s) { gbuf_add(b, s, strlen(s)); }

void gbuf_printf(gbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
    } else if ((size_t)n < sizeof small) {
        gbuf_add(b, small, (size_t)n);
    } else {
        char *tmp = malloc((size_t)n + 1);
        if (tmp) {
            vsnprintf(tmp, (size_t)n + 1, fmt, ap2);
            gbuf_add(b, tmp, (size_t)n);
        } else {
            b->oom = true;
        }
        free(tmp);
    }
    va_end(ap2);
}
