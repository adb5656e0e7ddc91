/*
 * tests/model/gguf_writer.h — a minimal GGUF writer for building test files
 * in memory: metadata of any type, tensors with raw data, configurable
 * version and alignment, and hooks to corrupt the result. Test-only; it
 * trusts its caller and aborts on allocation failure.
 */
#ifndef LOOM_TEST_GGUF_WRITER_H
#define LOOM_TEST_GGUF_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gw {
    uint8_t *buf;
    size_t len, cap;
} gw;

static inline void gw_raw(gw *w, const void *p, size_t n) {
    if (w->len + n > w->cap) {
        w->cap = (w->len + n) * 2 + 64;
        w->buf = realloc(w->buf, w->cap);
        if (!w->buf) abort();
    }
    if (n) memcpy(w->buf + w->len, p, n);
    w->len += n;
}
static inline void gw_u8(gw *w, uint8_t v) { gw_raw(w, &v, 1); }
static inline void gw_u16(gw *w, uint16_t v) { gw_raw(w, &v, 2); }
static inline void gw_u32(gw *w, uint32_t v) { gw_raw(w, &v, 4); }
static inline void gw_u64(gw *w, uint64_t v) { gw_raw(w, &v, 8); }
static inline void gw_f32(gw *w, float v) { gw_raw(w, &v, 4); }
static inline void gw_f64(gw *w, double v) { gw_raw(w, &v, 8); }
static inline void gw_str(gw *w, const char *s) {
    gw_u64(w, strlen(s));
    gw_raw(w, s, strlen(s));
}

/* GGUF value type numbers */
enum { GT_U8, GT_I8, GT_U16, GT_I16, GT_U32, GT_I32, GT_F32, GT_BOOL, GT_STR, GT_ARR, GT_U64, GT_I64, GT_F64 };
/* GGML tensor type numbers */
enum { GG_F32 = 0, GG_F16 = 1, GG_Q4_0 = 2, GG_Q4_1 = 3, GG_Q5_0 = 6, GG_Q8_0 = 8, GG_Q4_K = 12, GG_Q5_K = 13, GG_Q6_K = 14,
       GG_IQ2_XXS = 16, GG_BF16 = 30 };

typedef struct gb_tensor {
    char name[96];
    uint32_t nd;
    uint64_t ne[4];
    uint32_t type;
    const void *data;
    size_t nbytes;
    int64_t offset_override; /* >= 0: write this offset instead of the computed one */
} gb_tensor;

typedef struct gb {
    uint32_t version;
    uint32_t alignment;   /* used for layout; write general.alignment yourself if not 32 */
    gw kv;
    uint64_t n_kv;
    gb_tensor *t;
    int n_t, cap_t;
} gb;

static inline void gb_init(gb *b) {
    memset(b, 0, sizeof *b);
    b->version = 3;
    b->alignment = 32;
}
static inline void gb_free(gb *b) {
    free(b->kv.buf);
    free(b->t);
}

/* key + type header; the caller appends the value with gw_* on b->kv */
static inline gw *gb_key(gb *b, const char *key, uint32_t type) {
    gw_str(&b->kv, key);
    gw_u32(&b->kv, type);
    b->n_kv++;
    return &b->kv;
}
static inline void gb_u32(gb *b, const char *k, uint32_t v) { gw_u32(gb_key(b, k, GT_U32), v); }
static inline void gb_f32(gb *b, const char *k, float v) { gw_f32(gb_key(b, k, GT_F32), v); }
static inline void gb_s(gb *b, const char *k, const char *v) { gw_str(gb_key(b, k, GT_STR), v); }
static inline void gb_strarr(gb *b, const char *k, int n, const char *prefix) {
    gw *w = gb_key(b, k, GT_ARR);
    gw_u32(w, GT_STR);
    gw_u64(w, (uint64_t)n);
    char s[64];
    for (int i = 0; i < n; i++) {
        snprintf(s, sizeof s, "%s%d", prefix, i);
        gw_str(w, s);
    }
}

/* ne in GGML order (ne[0] contiguous) */
static inline gb_tensor *gb_tensor_add(gb *b, const char *name, uint32_t type, uint32_t nd, const uint64_t *ne,
                                       const void *data, size_t nbytes) {
    if (b->n_t == b->cap_t) {
        b->cap_t = b->cap_t ? b->cap_t * 2 : 16;
        b->t = realloc(b->t, (size_t)b->cap_t * sizeof *b->t);
        if (!b->t) abort();
    }
    gb_tensor *t = &b->t[b->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    uint32_t i = 0;
    for (; i < nd && i < 4; i++) t->ne[i] = ne[i]; /* read only the nd dims given */
    for (; i < 4; i++) t->ne[i] = 1;
    t->type = type;
    t->data = data;
    t->nbytes = nbytes;
    t->offset_override = -1;
    return t;
}

/* Serialise; the last tensor's data ends exactly at the end of the file. */
static inline gw gb_finish(const gb *b) {
    gw w = {0};
    gw_raw(&w, "GGUF", 4);
    gw_u32(&w, b->version);
    gw_u64(&w, (uint64_t)b->n_t);
    gw_u64(&w, b->n_kv);
    gw_raw(&w, b->kv.buf, b->kv.len);
    uint64_t off = 0;
    uint64_t *offs = calloc((size_t)b->n_t + 1, sizeof *offs);
    for (int i = 0; i < b->n_t; i++) {
        const gb_tensor *t = &b->t[i];
        gw_str(&w, t->name);
        gw_u32(&w, t->nd);
        for (uint32_t d = 0; d < t->nd; d++) gw_u64(&w, d < 4 ? t->ne[d] : 1); /* nd > 4: malformed on purpose */
        gw_u32(&w, t->type);
        offs[i] = off;
        gw_u64(&w, t->offset_override >= 0 ? (uint64_t)t->offset_override : off);
        off += (t->nbytes + b->alignment - 1) / b->alignment * b->alignment;
    }
    while (w.len % b->alignment) gw_u8(&w, 0);
    size_t data_start = w.len;
    for (int i = 0; i < b->n_t; i++) {
        while (w.len < data_start + offs[i]) gw_u8(&w, 0);
        gw_raw(&w, b->t[i].data, b->t[i].nbytes);
    }
    free(offs);
    return w;
}

static inline int gw_write_file(const gw *w, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(w->buf, 1, w->len, f);
    fclose(f);
    return n == w->len ? 0 : -1;
}

#endif
