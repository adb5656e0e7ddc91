/*
 * tests/common/tp_util.c — see tp_util.h.
 */
#include "tp_util.h"

#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const char *arg) {
    fprintf(stderr, "test helper: %s %s failed\n", what, arg ? arg : "");
    abort();
}

const char *tp_env(const char *name) {
    const char *v = getenv(name);
    if (!v || !v[0]) die("getenv (run through meson test)", name);
    return v;
}

char *tp_mkdtemp(void) {
    const char *base = getenv("TMPDIR");
    char *t = tp_join(base && base[0] ? base : "/tmp", "loom-test-XXXXXX");
    if (!mkdtemp(t)) die("mkdtemp", t);
    return t;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void tp_rm_rf(const char *path) {
    if (path) nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *tp_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) die("malloc", NULL);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

void tp_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) die("fopen", path);
    fputs(text, f);
    fclose(f);
}

void tp_writef(const char *path, const char *fmt, ...) {
    FILE *f = fopen(path, "w");
    if (!f) die("fopen", path);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

void tp_copy(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) die("copy", src);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    fclose(out);
}

char *tp_read(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("fopen", path);
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    size_t n;
    while (s && (n = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) s = realloc(s, cap *= 2);
    }
    fclose(f);
    if (!s) die("malloc", NULL);
    s[len] = '\0';
    return s;
}
