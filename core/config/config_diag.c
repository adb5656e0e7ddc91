/*
 * core/config/config_diag.c — the diagnostic list every config function
 * appends to: a growing array of (mark, message) pairs, printed as
 * "file:line:col: error: message". Entries own a copy of the mark's file
 * name, so the list outlives the tree that produced it.
 *
 * When memory runs out an entry is dropped rather than failing the caller:
 * the caller already reports failure through its return value.
 */
#include "config/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void loom_diag_init(loom_diag *d) {
    if (!d) return;
    d->count = 0;
    d->capacity = 0;
    d->entries = NULL;
}

void loom_diag_free(loom_diag *d) {
    if (!d) return;
    for (int i = 0; i < d->count; i++) free((char *)d->entries[i].mark.file);
    free(d->entries);
    loom_diag_init(d);
}

void loom_diag_vadd(loom_diag *d, const loom_cfg_mark *mark, const char *fmt, va_list ap) {
    if (!d) return;
    if (d->count == d->capacity) {
        int cap = d->capacity ? d->capacity * 2 : 8;
        loom_diag_entry *e = realloc(d->entries, (size_t)cap * sizeof *e);
        if (!e) return;
        d->entries = e;
        d->capacity = cap;
    }
    loom_diag_entry *e = &d->entries[d->count];
    memset(e, 0, sizeof *e);
    if (mark) {
        e->mark = *mark;
        e->mark.file = loom_strdup(mark->file); /* NULL on OOM: location just omitted */
    }
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    d->count++;
}

void loom_diag_add(loom_diag *d, const loom_cfg_mark *mark, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    loom_diag_vadd(d, mark, fmt, ap);
    va_end(ap);
}

/* Location prefix without the trailing ": ". Marks of --set values have line
 * 0 and carry the argument index in col. */
void loom_cfg_mark_format(const loom_cfg_mark *m, char *buf, size_t size) {
    if (!buf || size == 0) return;
    buf[0] = '\0';
    if (!m || !m->file) return;
    if (m->line > 0 && m->col > 0)
        snprintf(buf, size, "%s:%d:%d", m->file, m->line, m->col);
    else if (m->line > 0)
        snprintf(buf, size, "%s:%d", m->file, m->line);
    else if (m->col > 0)
        snprintf(buf, size, "%s (argument %d)", m->file, m->col);
    else
        snprintf(buf, size, "%s", m->file);
}

void loom_diag_print(const loom_diag *d, void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    if (!d) return;
    for (int i = 0; i < d->count; i++) {
        char loc[1024];
        loom_cfg_mark_format(&d->entries[i].mark, loc, sizeof loc);
        if (loc[0])
            fprintf(f, "%s: error: %s\n", loc, d->entries[i].message);
        else
            fprintf(f, "error: %s\n", d->entries[i].message);
    }
}

loom_status loom_diag_to_error(const loom_diag *d, loom_status code, loom_error *err) {
    if (!d || d->count == 0)
        return loom_error_set(err, code, "configuration error (no details were recorded)");
    char loc[LOOM_ERROR_MSG_MAX];
    loom_cfg_mark_format(&d->entries[0].mark, loc, sizeof loc);
    char more[64] = "";
    if (d->count > 1)
        snprintf(more, sizeof more, " (and %d more error%s)", d->count - 1,
                 d->count - 1 == 1 ? "" : "s");
    loom_error_set(err, code, "%s%s%s", loc, loc[0] ? ": " : "", d->entries[0].message);
    if (err && more[0]) {
        /* Cut the message so truncation never hides that more errors exist. */
        size_t room = sizeof err->message - strlen(more) - 1;
        if (strlen(err->message) > room) err->message[room] = '\0';
        strcat(err->message, more);
    }
    return code;
}
