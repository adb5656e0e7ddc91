/*
 * core/model/gguf.c — GGUF v2/v3 reader (see gguf.h for the contract).
 *
 * File layout (all little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { str key | u32 type | value }            str = u64 len + bytes
 *   n_tensors x { str name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to general.alignment | tensor data (offsets relative to here)
 * Array values are { u32 elem_type | u64 len | elements }, elements may be
 * arrays themselves (accepted and skipped; their contents are not exposed).
 *
 * Every read goes through rd_need(), which checks the bytes exist and, when
 * they do not, reports file, byte offset and what was being read. Counts read
 * from the file are checked against the bytes left before anything is
 * allocated, so a hostile header cannot make us allocate or loop beyond the
 * file's size. Lookups (keys, tensor names) use sorted index arrays.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

#define GGUF_MAX_NAME 64          /* GGML_MAX_NAME: tensor names are shorter   */
#define GGUF_MAX_KEY 65535        /* spec: keys are at most 2^16-1 bytes       */
#define GGUF_MAX_NEST 8           /* arrays of arrays deeper than this: refused */
#define GGUF_DEFAULT_ALIGNMENT 32

/* ------------------------------------------------------------ ggml types */

typedef struct ggml_type_desc {
    const char *name;
    uint32_t blck;      /* elements per block, 0 = unknown/removed type */
    uint32_t size;      /* bytes per block                              */
    int loom;           /* loom_dtype, or -1 when loom cannot read it   */
} ggml_type_desc;

/* GGML type numbers (ggml.h). Removed numbers (4, 5, 31-33, 36-38) stay unknown. */
static const ggml_type_desc k_types[] = {
    [0] = {"f32", 1, 4, LOOM_DTYPE_F32},
    [1] = {"f16", 1, 2, LOOM_DTYPE_F16},
    [2] = {"q4_0", 32, 18, LOOM_DTYPE_Q4_0},
    [3] = {"q4_1", 32, 20, LOOM_DTYPE_Q4_1},
    [6] = {"q5_0", 32, 22, LOOM_DTYPE_Q5_0},
    [7] = {"q5_1", 32, 24, -1},
    [8] = {"q8_0", 32, 34, LOOM_DTYPE_Q8_0},
    [9] = {"q8_1", 32, 36, -1},
    [10] = {"q2_k", 256, 84, -1},
    [11] = {"q3_k", 256, 110, -1},
    [12] = {"q4_k", 256, 144, LOOM_DTYPE_Q4_K},
    [13] = {"q5_k", 256, 176, LOOM_DTYPE_Q5_K},
    [14] = {"q6_k", 256, 210, LOOM_DTYPE_Q6_K},
    [15] = {"q8_k", 256, 292, -1},
    [16] = {"iq2_xxs", 256, 66, -1},
    [17] = {"iq2_xs", 256, 74, -1},
    [18] = {"iq3_xxs", 256, 98, -1},
    [19] = {"iq1_s", 256, 50, -1},
    [20] = {"iq4_nl", 32, 18, -1},
    [21] = {"iq3_s", 256, 110, -1},
    [22] = {"iq2_s", 256, 82, -1},
    [23] = {"iq4_xs", 256, 136, -1},
    [24] = {"i8", 1, 1, LOOM_DTYPE_I8},
    [25] = {"i16", 1, 2, -1},
    [26] = {"i32", 1, 4, LOOM_DTYPE_I32},
    [27] = {"i64", 1, 8, -1},
    [28] = {"f64", 1, 8, -1},
    [29] = {"iq1_m", 256, 56, -1},
    [30] = {"bf16", 1, 2, LOOM_DTYPE_BF16},
    [34] = {"tq1_0", 256, 54, -1},
    [35] = {"tq2_0", 256, 66, -1},
    [39] = {"mxfp4", 32, 17, -1},
    [40] = {"nvfp4", 64, 36, -1},
    [41] = {"q1_0", 128, 18, -1},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static const ggml_type_desc *type_desc(uint32_t t) {
    if (t >= N_TYPES || k_types[t].blck == 0) return NULL;
    return &k_types[t];
}

const char *loom_gguf_type_name(uint32_t t) {
    const ggml_type_desc *d = type_desc(t);
    return d ? d->name : "unknown";
}

/* ------------------------------------------------------------ structures */

typedef struct gguf_kv {
    loom_gguf_str key;
    loom_gguf_type type;
    uint64_t val_off;           /* scalars: the value; strings: the u64 length;
                                 * arrays: the first element                     */
    loom_gguf_type elem_type;   /* arrays only                                   */
    uint64_t len;               /* arrays only                                   */
    uint64_t *str_offs;         /* string arrays: offset of each element's length */
} gguf_kv;

struct loom_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    void *map;                  /* non-NULL when we own an mmap of `size` bytes */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_start;
    gguf_kv *kvs;
    int64_t n_kv;
    int64_t *kv_sorted;         /* kv indices sorted by key                      */
    loom_gguf_tensor_info *tensors;
    int64_t n_tensors;
    int64_t *t_sorted;          /* tensor indices sorted by name                 */
};

/* ------------------------------------------------------------ reading */

typedef struct rd {
    const uint8_t *p;
    size_t size;
    size_t pos;
    const char *path;
    loom_error *err;
} rd;

static loom_status rd_need(rd *r, uint64_t n, const char *fmt, ...) LOOM_PRINTF(3, 4);

/* Check that n more bytes exist at r->pos; otherwise report what was being
 * read (fmt is only formatted on failure, so callers pass cheap arguments). */
static loom_status rd_need(rd *r, uint64_t n, const char *fmt, ...) {
    if (n <= (uint64_t)(r->size - r->pos)) return LOOM_OK;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return loom_error_set(r->err, LOOM_ERR_FORMAT,
                          "%s: truncated at byte %zu while reading %s (needs %llu more bytes, the file has "
                          "%zu); the file is incomplete or damaged: download or convert it again",
                          r->path, r->pos, what, (unsigned long long)n, r->size - r->pos);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32); }

static uint32_t rd_u32(rd *r) { uint32_t v = get_u32(r->p + r->pos); r->pos += 4; return v; }
static uint64_t rd_u64(rd *r) { uint64_t v = get_u64(r->p + r->pos); r->pos += 8; return v; }

static const char *type_str(uint32_t t) {
    static const char *const n[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                    "bool", "string", "array", "uint64", "int64", "float64"};
    return t < 13 ? n[t] : "invalid";
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case LOOM_GGUF_UINT8: case LOOM_GGUF_INT8: case LOOM_GGUF_BOOL: return 1;
    case LOOM_GGUF_UINT16: case LOOM_GGUF_INT16: return 2;
    case LOOM_GGUF_UINT32: case LOOM_GGUF_INT32: case LOOM_GGUF_FLOAT32: return 4;
    case LOOM_GGUF_UINT64: case LOOM_GGUF_INT64: case LOOM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Short printable form of a (non-terminated) key for messages. */
#define KEYFMT "'%.*s'"
#define KEYARG(s) (int)((s).len > 80 ? 80 : (s).len), (s).ptr

/* Read one string (u64 length + bytes). `what` describes it for errors. */
static loom_status rd_str(rd *r, loom_gguf_str *out, const char *what, loom_gguf_str key) {
    loom_status st = rd_need(r, 8, "the length of %s " KEYFMT, what, KEYARG(key));
    if (st) return st;
    uint64_t len = rd_u64(r);
    if ((st = rd_need(r, len, "%s " KEYFMT " (%llu bytes)", what, KEYARG(key), (unsigned long long)len)))
        return st;
    out->ptr = (const char *)(r->p + r->pos);
    out->len = len;
    r->pos += (size_t)len;
    return LOOM_OK;
}

/* Skip/validate one value of type t; depth counts array nesting. */
static loom_status rd_value(rd *r, uint32_t t, loom_gguf_str key, int depth);

static loom_status rd_array(rd *r, loom_gguf_str key, int depth, uint32_t *elem_type, uint64_t *len,
                            uint64_t *first, uint64_t **str_offs) {
    loom_status st;
    if (depth > GGUF_MAX_NEST)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: metadata " KEYFMT " at byte %zu: arrays nested deeper than %d levels; "
                              "the file is damaged",
                              r->path, KEYARG(key), r->pos, GGUF_MAX_NEST);
    if ((st = rd_need(r, 12, "the element type and length of array " KEYFMT, KEYARG(key)))) return st;
    size_t type_at = r->pos;
    uint32_t et = rd_u32(r);
    uint64_t n = rd_u64(r);
    if (et > LOOM_GGUF_FLOAT64)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: metadata " KEYFMT ": invalid array element type %u at byte %zu (valid: 0..12); "
                              "the file is damaged or not GGUF v2/v3",
                              r->path, KEYARG(key), et, type_at);
    *elem_type = et;
    *len = n;
    *first = r->pos;
    uint64_t left = r->size - r->pos;
    size_t es = scalar_size(et);
    if (es) {
        if (n > left / es)
            return rd_need(r, left + 1, "%llu %s elements of array " KEYFMT, (unsigned long long)n,
                           type_str(et), KEYARG(key));
        if (et == LOOM_GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (r->p[r->pos + i] > 1)
                    return loom_error_set(r->err, LOOM_ERR_FORMAT,
                                          "%s: metadata " KEYFMT ": bool element %llu at byte %zu is %u (must be 0 "
                                          "or 1); the file is damaged",
                                          r->path, KEYARG(key), (unsigned long long)i, r->pos + (size_t)i,
                                          r->p[r->pos + i]);
        }
        r->pos += (size_t)(n * es);
        return LOOM_OK;
    }
    /* strings need >= 8 bytes each, arrays >= 12: bound n before looping */
    uint64_t min_elem = et == LOOM_GGUF_STRING ? 8 : 12;
    if (n > left / min_elem)
        return rd_need(r, left + 1, "%llu %s elements of array " KEYFMT, (unsigned long long)n, type_str(et),
                       KEYARG(key));
    if (et == LOOM_GGUF_STRING && str_offs) {
        *str_offs = malloc((size_t)(n ? n : 1) * sizeof **str_offs);
        if (!*str_offs)
            return loom_error_set(r->err, LOOM_ERR_NOMEM, "%s: out of memory indexing %llu strings of " KEYFMT,
                                  r->path, (unsigned long long)n, KEYARG(key));
    }
    for (uint64_t i = 0; i < n; i++) {
        if (et == LOOM_GGUF_STRING) {
            loom_gguf_str s;
            if (str_offs) (*str_offs)[i] = r->pos;
            char what[64];
            snprintf(what, sizeof what, "string element %llu of array", (unsigned long long)i);
            if ((st = rd_str(r, &s, what, key))) return st;
        } else if ((st = rd_value(r, LOOM_GGUF_ARRAY, key, depth + 1))) {
            return st;
        }
    }
    return LOOM_OK;
}

static loom_status rd_value(rd *r, uint32_t t, loom_gguf_str key, int depth) {
    loom_status st;
    if (t == LOOM_GGUF_STRING) {
        loom_gguf_str s;
        return rd_str(r, &s, "the string value of", key);
    }
    if (t == LOOM_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n, first;
        return rd_array(r, key, depth, &et, &n, &first, NULL);
    }
    size_t es = scalar_size(t);
    if ((st = rd_need(r, es, "the %s value of " KEYFMT, type_str(t), KEYARG(key)))) return st;
    if (t == LOOM_GGUF_BOOL && r->p[r->pos] > 1)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: metadata " KEYFMT ": bool at byte %zu is %u (must be 0 or 1); the file is damaged",
                              r->path, KEYARG(key), r->pos, r->p[r->pos]);
    r->pos += es;
    return LOOM_OK;
}

/* ------------------------------------------------------------ sorting */

static int str_cmp(loom_gguf_str a, loom_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

/* qsort has no context argument in C11: sort (name, index) pairs instead. */
typedef struct named_idx {
    loom_gguf_str s;
    int64_t i;
} named_idx;

static int named_cmp(const void *a, const void *b) {
    const named_idx *x = a, *y = b;
    int c = str_cmp(x->s, y->s);
    if (c) return c;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Sort indices by name; on a duplicate, set dup_a and dup_b (a < b) and return false. */
static bool sort_names(named_idx *tmp, int64_t n, int64_t *out, int64_t *dup_a, int64_t *dup_b) {
    qsort(tmp, (size_t)n, sizeof *tmp, named_cmp);
    for (int64_t i = 0; i < n; i++) {
        out[i] = tmp[i].i;
        if (i > 0 && str_cmp(tmp[i - 1].s, tmp[i].s) == 0) {
            *dup_a = tmp[i - 1].i;
            *dup_b = tmp[i].i;
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ parsing */

static void gguf_free(loom_gguf *g) {
    if (!g) return;
    if (g->kvs)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kvs[i].str_offs);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    if (g->map) munmap(g->map, g->size);
    free(g->path);
    free(g);
}

void loom_gguf_close(loom_gguf *g) { gguf_free(g); }

static bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* The fixed header: magic, version, and the two counts, each refused when the
 * bytes left could not hold that many records. */
static loom_status parse_header(loom_gguf *g, rd *r, uint64_t *n_tensors, uint64_t *n_kv) {
    loom_status st;
    if ((st = rd_need(r, 4, "the magic number"))) return st;
    if (memcmp(r->p, "GGUF", 4) != 0) {
        const uint8_t *m = r->p;
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: not a GGUF file (magic %02x %02x %02x %02x, expected 47 47 55 46 \"GGUF\"); "
                              "check the path, or set the model format explicitly",
                              g->path, m[0], m[1], m[2], m[3]);
    }
    r->pos = 4;
    if ((st = rd_need(r, 4, "the version"))) return st;
    g->version = rd_u32(r);
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped == 2 || swapped == 3)
            return loom_error_set(r->err, LOOM_ERR_UNSUPPORTED,
                                  "%s: big-endian GGUF (version %u byte-swapped) is not supported; use a "
                                  "little-endian conversion of the model",
                                  g->path, swapped);
        return loom_error_set(r->err, LOOM_ERR_UNSUPPORTED,
                              "%s: unsupported GGUF version %u (loom reads versions 2 and 3); re-convert the "
                              "model with a current llama.cpp convert_hf_to_gguf.py",
                              g->path, v);
    }
    if ((st = rd_need(r, 16, "the tensor and metadata counts"))) return st;
    *n_tensors = rd_u64(r);
    *n_kv = rd_u64(r);
    /* each kv takes at least 13 bytes (8 key length + 4 type + 1 value), each
     * tensor record 33 (8 + 1 name + 4 + 8 + 4 + 8): refuse counts the file cannot hold */
    uint64_t left = r->size - r->pos;
    if (*n_kv > left / 13)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: header at byte 16 claims %llu metadata entries but only %llu bytes follow; "
                              "the file is truncated or damaged",
                              g->path, (unsigned long long)*n_kv, (unsigned long long)left);
    if (*n_tensors > left / 33)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: header at byte 8 claims %llu tensors but only %llu bytes follow; the file is "
                              "truncated or damaged",
                              g->path, (unsigned long long)*n_tensors, (unsigned long long)left);
    return LOOM_OK;
}

/* How messages call a record's length-prefixed name: a metadata entry's
 * key or a tensor's name. */
typedef struct name_field {
    const char *record;     /* what the record is: "metadata entry", "tensor" */
    const char *field;      /* what the name is: "key", "name"                 */
    const char *nul_what;   /* the name in the NUL-byte message                */
    int max;                /* longest allowed, bytes                          */
} name_field;

static const name_field k_key_field = {"metadata entry", "key", "metadata key", GGUF_MAX_KEY};
static const name_field k_tensor_name_field = {"tensor", "name", "the name of tensor", GGUF_MAX_NAME};

/* The name of record #i: 1..f->max bytes without a NUL. */
static loom_status parse_name(loom_gguf *g, rd *r, uint64_t i, const name_field *f, loom_gguf_str *name) {
    unsigned long long ii = (unsigned long long)i;
    loom_status st;
    if ((st = rd_need(r, 8, "the %s length of %s #%llu", f->field, f->record, ii))) return st;
    size_t len_at = r->pos;
    uint64_t len = rd_u64(r);
    if (len == 0 || len > (uint64_t)f->max)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: %s #%llu at byte %zu has a %s length of %llu (must be 1..%d); the file is "
                              "damaged",
                              g->path, f->record, ii, len_at, f->field, (unsigned long long)len, f->max);
    if ((st = rd_need(r, len, "the %s of %s #%llu (%llu bytes)", f->field, f->record, ii, (unsigned long long)len)))
        return st;
    name->ptr = (const char *)(r->p + r->pos);
    name->len = len;
    if (memchr(name->ptr, 0, (size_t)len))
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: %s #%llu at byte %zu contains a NUL byte; the file is damaged", g->path,
                              f->nul_what, ii, r->pos);
    r->pos += (size_t)len;
    return LOOM_OK;
}

/* One metadata entry: key, value type, then the value (validated, and for
 * arrays indexed, but not copied). */
static loom_status parse_kv(loom_gguf *g, rd *r, uint64_t i) {
    gguf_kv *kv = &g->kvs[i];
    loom_status st;
    if ((st = parse_name(g, r, i, &k_key_field, &kv->key))) return st;
    if ((st = rd_need(r, 4, "the value type of " KEYFMT, KEYARG(kv->key)))) return st;
    size_t type_at = r->pos;
    uint32_t t = rd_u32(r);
    if (t > LOOM_GGUF_FLOAT64)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: metadata " KEYFMT ": invalid value type %u at byte %zu (valid: 0..12); the "
                              "file is damaged or not GGUF v2/v3",
                              g->path, KEYARG(kv->key), t, type_at);
    kv->type = (loom_gguf_type)t;
    kv->val_off = r->pos;
    if (t != LOOM_GGUF_ARRAY) return rd_value(r, t, kv->key, 0);
    uint32_t et;
    if ((st = rd_array(r, kv->key, 1, &et, &kv->len, &kv->val_off, &kv->str_offs))) return st;
    kv->elem_type = (loom_gguf_type)et;
    return LOOM_OK;
}

static loom_status parse_metadata(loom_gguf *g, rd *r, uint64_t n_kv) {
    loom_status st;
    g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kvs);
    g->kv_sorted = malloc((size_t)(n_kv ? n_kv : 1) * sizeof *g->kv_sorted);
    if (!g->kvs || !g->kv_sorted)
        return loom_error_set(r->err, LOOM_ERR_NOMEM, "%s: out of memory for %llu metadata entries", g->path,
                              (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        /* counted before reading, so gguf_free() frees a half-read entry's index */
        g->n_kv = (int64_t)i + 1;
        if ((st = parse_kv(g, r, i))) return st;
    }
    return LOOM_OK;
}

/* Sort the metadata keys for lookups; a key twice is a damaged file. */
static loom_status index_keys(loom_gguf *g, named_idx *tmp, loom_error *err) {
    int64_t da, db;
    for (int64_t i = 0; i < g->n_kv; i++) tmp[i] = (named_idx){g->kvs[i].key, i};
    if (sort_names(tmp, g->n_kv, g->kv_sorted, &da, &db)) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_FORMAT,
                          "%s: duplicate metadata key " KEYFMT " (entries #%lld and #%lld); the file is damaged",
                          g->path, KEYARG(g->kvs[da].key), (long long)da, (long long)db);
}

/* general.alignment, when present, replaces the default: tensor offsets and
 * the data section are checked against it. */
static loom_status read_alignment(loom_gguf *g, loom_error *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (loom_gguf_find(g, "general.alignment") < 0) return LOOM_OK;
    int64_t a;
    if (!loom_gguf_get_i64(g, "general.alignment", &a) || a <= 0 || !is_pow2((uint64_t)a) || a > (1 << 30))
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: general.alignment must be an integer power of two (at most 2^30); the file "
                              "is damaged",
                              g->path);
    g->alignment = (uint64_t)a;
    return LOOM_OK;
}

/* Dimension count and dimensions; *numel is their product (no overflow). */
static loom_status parse_tensor_shape(loom_gguf *g, rd *r, loom_gguf_tensor_info *ti, uint64_t *numel) {
    loom_status st;
    if ((st = rd_need(r, 4, "the dimension count of tensor " KEYFMT, KEYARG(ti->name)))) return st;
    size_t nd_at = r->pos;
    ti->n_dims = rd_u32(r);
    if (ti->n_dims < 1 || ti->n_dims > 4)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: tensor " KEYFMT " has %u dimensions at byte %zu (must be 1..4); the file is "
                              "damaged",
                              g->path, KEYARG(ti->name), ti->n_dims, nd_at);
    if ((st = rd_need(r, 8ull * ti->n_dims, "the %u dimensions of tensor " KEYFMT, ti->n_dims, KEYARG(ti->name))))
        return st;
    *numel = 1;
    for (uint32_t d = 0; d < 4; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < ti->n_dims; d++) {
        size_t at = r->pos;
        uint64_t v = rd_u64(r);
        if (v == 0 || v > (uint64_t)INT64_MAX / *numel)
            return loom_error_set(r->err, LOOM_ERR_FORMAT,
                                  "%s: tensor " KEYFMT " dimension %u at byte %zu is %llu (%s); the file is damaged",
                                  g->path, KEYARG(ti->name), d, at, (unsigned long long)v,
                                  v == 0 ? "must be > 0" : "element count overflows");
        ti->ne[d] = v;
        *numel *= v;
    }
    return LOOM_OK;
}

/* The GGML type, and from it the loom dtype and the byte size of numel elements. */
static loom_status parse_tensor_type(loom_gguf *g, rd *r, loom_gguf_tensor_info *ti, uint64_t numel) {
    loom_status st;
    if ((st = rd_need(r, 4, "the type of tensor " KEYFMT, KEYARG(ti->name)))) return st;
    size_t type_at = r->pos;
    ti->ggml_type = rd_u32(r);
    const ggml_type_desc *td = type_desc(ti->ggml_type);
    if (!td)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: tensor " KEYFMT " has unknown GGML type %u at byte %zu; the file is damaged "
                              "or newer than this loom",
                              g->path, KEYARG(ti->name), ti->ggml_type, type_at);
    ti->supported = td->loom >= 0;
    ti->dtype = td->loom >= 0 ? (loom_dtype)td->loom : LOOM_DTYPE_COUNT;
    if (ti->ne[0] % td->blck != 0)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: tensor " KEYFMT ": row length %llu is not a multiple of the %s block size %u; "
                              "the file is damaged",
                              g->path, KEYARG(ti->name), (unsigned long long)ti->ne[0], td->name, td->blck);
    uint64_t nblocks = numel / td->blck;
    if (nblocks > (uint64_t)SIZE_MAX / td->size)
        return loom_error_set(r->err, LOOM_ERR_FORMAT, "%s: tensor " KEYFMT ": byte size overflows", g->path,
                              KEYARG(ti->name));
    ti->nbytes = (size_t)(nblocks * td->size);
    return LOOM_OK;
}

/* One tensor record: name, shape, type, aligned data offset. */
static loom_status parse_tensor_info(loom_gguf *g, rd *r, uint64_t i) {
    loom_gguf_tensor_info *ti = &g->tensors[i];
    uint64_t numel = 0;
    loom_status st;
    if ((st = parse_name(g, r, i, &k_tensor_name_field, &ti->name))) return st;
    if ((st = parse_tensor_shape(g, r, ti, &numel))) return st;
    if ((st = parse_tensor_type(g, r, ti, numel))) return st;
    if ((st = rd_need(r, 8, "the data offset of tensor " KEYFMT, KEYARG(ti->name)))) return st;
    size_t off_at = r->pos;
    ti->offset = rd_u64(r);
    if (ti->offset % g->alignment != 0)
        return loom_error_set(r->err, LOOM_ERR_FORMAT,
                              "%s: tensor " KEYFMT ": data offset %llu (at byte %zu) is not a multiple of the "
                              "alignment %llu; the file is damaged",
                              g->path, KEYARG(ti->name), (unsigned long long)ti->offset, off_at,
                              (unsigned long long)g->alignment);
    return LOOM_OK;
}

static loom_status parse_tensor_infos(loom_gguf *g, rd *r, uint64_t n_tensors) {
    loom_status st;
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    g->t_sorted = malloc((size_t)(n_tensors ? n_tensors : 1) * sizeof *g->t_sorted);
    if (!g->tensors || !g->t_sorted)
        return loom_error_set(r->err, LOOM_ERR_NOMEM, "%s: out of memory for %llu tensor records", g->path,
                              (unsigned long long)n_tensors);
    g->n_tensors = (int64_t)n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((st = parse_tensor_info(g, r, i))) return st;
    return LOOM_OK;
}

/* The data section starts at the first aligned byte after the records (at
 * end_infos); every tensor's bytes must lie inside the file. */
static loom_status place_tensor_data(loom_gguf *g, uint64_t end_infos, loom_error *err) {
    g->data_start = (end_infos + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        loom_gguf_tensor_info *ti = &g->tensors[i];
        uint64_t begin = g->data_start + ti->offset; /* offset < 2^64 - 2^31: checked below */
        if (ti->offset > (uint64_t)g->size || g->data_start > (uint64_t)g->size ||
            begin > (uint64_t)g->size || ti->nbytes > (uint64_t)g->size - begin)
            return loom_error_set(err, LOOM_ERR_FORMAT,
                                  "%s: tensor " KEYFMT " (%s, %zu bytes) at data offset %llu ends past the end of "
                                  "the file (%zu bytes, data section at byte %llu); the file is truncated: download "
                                  "or convert it again",
                                  g->path, KEYARG(ti->name), loom_gguf_type_name(ti->ggml_type), ti->nbytes,
                                  (unsigned long long)ti->offset, g->size, (unsigned long long)g->data_start);
        ti->data = g->base + begin;
    }
    return LOOM_OK;
}

/* Sort the tensor names for lookups; a name twice is a damaged file. */
static loom_status index_tensor_names(loom_gguf *g, named_idx *tmp, loom_error *err) {
    int64_t da, db;
    for (int64_t i = 0; i < g->n_tensors; i++) tmp[i] = (named_idx){g->tensors[i].name, i};
    if (sort_names(tmp, g->n_tensors, g->t_sorted, &da, &db)) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_FORMAT,
                          "%s: duplicate tensor name " KEYFMT " (records #%lld and #%lld); the file is damaged",
                          g->path, KEYARG(g->tensors[da].name), (long long)da, (long long)db);
}

/* Header, metadata, alignment, tensor records, data section, in file order:
 * the first fault found is the one reported. */
static loom_status parse(loom_gguf *g, loom_error *err) {
    rd r = {.p = g->base, .size = g->size, .pos = 0, .path = g->path, .err = err};
    uint64_t n_tensors = 0, n_kv = 0;
    named_idx *tmp = NULL;
    loom_status st;

    if ((st = parse_header(g, &r, &n_tensors, &n_kv))) goto out;
    if ((st = parse_metadata(g, &r, n_kv))) goto out;
    /* one scratch array serves both sorts */
    tmp = malloc((size_t)((n_kv > n_tensors ? n_kv : n_tensors) + 1) * sizeof *tmp);
    if (!tmp) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", g->path);
        goto out;
    }
    if ((st = index_keys(g, tmp, err))) goto out;
    if ((st = read_alignment(g, err))) goto out;
    if ((st = parse_tensor_infos(g, &r, n_tensors))) goto out;
    if ((st = place_tensor_data(g, r.pos, err))) goto out;
    st = index_tensor_names(g, tmp, err);
out:
    free(tmp);
    return st;
}

static loom_status open_common(loom_gguf *g, loom_gguf **out, loom_error *err) {
    loom_status st = parse(g, err);
    if (st != LOOM_OK) {
        gguf_free(g);
        return st;
    }
    *out = g;
    return LOOM_OK;
}

loom_status loom_gguf_open_buffer(const void *data, size_t size, const char *name, loom_gguf **out,
                                  loom_error *err) {
    static const uint8_t empty[1];
    if (!out || (!data && size))
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_gguf_open_buffer: NULL argument");
    *out = NULL;
    loom_gguf *g = calloc(1, sizeof *g);
    if (!g) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory opening GGUF");
    g->path = loom_strdup(name ? name : "<buffer>");
    g->base = data ? data : empty;
    g->size = size;
    if (!g->path) {
        gguf_free(g);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory opening GGUF");
    }
    return open_common(g, out, err);
}

loom_status loom_gguf_open(const char *path, loom_gguf **out, loom_error *err) {
    static const uint8_t empty[1];
    if (!out || !path) return loom_error_set(err, LOOM_ERR_INVALID, "loom_gguf_open: NULL argument");
    *out = NULL;
    loom_status st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return loom_error_set(err, e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO,
                              "%s: cannot open: %s%s", path, strerror(e),
                              e == ENOENT ? " (run scripts/fetch-model.sh for the default model)" : "");
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = loom_error_set(err, LOOM_ERR_INVALID, "%s: not a regular file (expected a .gguf file)", path);
        goto out_fd;
    }
    loom_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = loom_strdup(path))) {
        free(g);
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
        goto out_fd;
    }
    g->size = (size_t)sb.st_size;
    g->base = empty;
    if (g->size > 0) {
        void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st = loom_error_set(err, LOOM_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, g->size,
                                strerror(errno));
            g->size = 0;
            gguf_free(g);
            goto out_fd;
        }
        g->map = m;
        g->base = m;
    }
    close(fd);
    return open_common(g, out, err);
out_fd:
    close(fd);
    return st;
}

/* ------------------------------------------------------------ accessors */

uint32_t loom_gguf_version(const loom_gguf *g) { return g->version; }
const char *loom_gguf_path(const loom_gguf *g) { return g->path; }
uint64_t loom_gguf_alignment(const loom_gguf *g) { return g->alignment; }
uint64_t loom_gguf_data_offset(const loom_gguf *g) { return g->data_start; }

bool loom_gguf_str_eq(loom_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static int64_t bsearch_idx(const int64_t *sorted, int64_t n, const void *recs, size_t stride, size_t str_off,
                           const char *key) {
    loom_gguf_str k = {key, strlen(key)};
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        loom_gguf_str s;
        memcpy(&s, (const char *)recs + (size_t)sorted[mid] * stride + str_off, sizeof s);
        int c = str_cmp(s, k);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int64_t loom_gguf_find(const loom_gguf *g, const char *key) {
    if (!g || !key) return -1;
    return bsearch_idx(g->kv_sorted, g->n_kv, g->kvs, sizeof(gguf_kv), offsetof(gguf_kv, key), key);
}

int64_t loom_gguf_num_kv(const loom_gguf *g) { return g->n_kv; }

loom_gguf_str loom_gguf_key(const loom_gguf *g, int64_t i) {
    if (i < 0 || i >= g->n_kv) return (loom_gguf_str){NULL, 0};
    return g->kvs[i].key;
}

loom_gguf_type loom_gguf_kv_type(const loom_gguf *g, int64_t i) {
    if (i < 0 || i >= g->n_kv) return (loom_gguf_type)-1;
    return g->kvs[i].type;
}

/* Read a scalar of type t at p as either an integer (is_int) or a double. */
static bool scalar_at(const uint8_t *p, uint32_t t, bool *is_int, int64_t *iv, uint64_t *uv, bool *is_unsigned,
                      double *dv) {
    *is_int = true;
    *is_unsigned = false;
    switch (t) {
    case LOOM_GGUF_UINT8: *uv = p[0]; *is_unsigned = true; break;
    case LOOM_GGUF_INT8: *iv = (int8_t)p[0]; break;
    case LOOM_GGUF_UINT16: *uv = (uint16_t)(p[0] | (p[1] << 8)); *is_unsigned = true; break;
    case LOOM_GGUF_INT16: *iv = (int16_t)(uint16_t)(p[0] | (p[1] << 8)); break;
    case LOOM_GGUF_UINT32: *uv = get_u32(p); *is_unsigned = true; break;
    case LOOM_GGUF_INT32: *iv = (int32_t)get_u32(p); break;
    case LOOM_GGUF_UINT64: *uv = get_u64(p); *is_unsigned = true; break;
    case LOOM_GGUF_INT64: *iv = (int64_t)get_u64(p); break;
    case LOOM_GGUF_FLOAT32: {
        float f;
        uint32_t u = get_u32(p);
        memcpy(&f, &u, 4);
        *dv = f;
        *is_int = false;
        break;
    }
    case LOOM_GGUF_FLOAT64: {
        uint64_t u = get_u64(p);
        memcpy(dv, &u, 8);
        *is_int = false;
        break;
    }
    default: return false;
    }
    return true;
}

static bool to_i64(const uint8_t *p, uint32_t t, int64_t *out) {
    bool is_int, is_u;
    int64_t iv = 0;
    uint64_t uv = 0;
    double dv = 0;
    if (!scalar_at(p, t, &is_int, &iv, &uv, &is_u, &dv) || !is_int) return false;
    if (is_u) {
        if (uv > (uint64_t)INT64_MAX) return false;
        iv = (int64_t)uv;
    }
    *out = iv;
    return true;
}

static bool to_f64(const uint8_t *p, uint32_t t, double *out) {
    bool is_int, is_u;
    int64_t iv = 0;
    uint64_t uv = 0;
    double dv = 0;
    if (!scalar_at(p, t, &is_int, &iv, &uv, &is_u, &dv)) return false;
    *out = !is_int ? dv : is_u ? (double)uv : (double)iv;
    return true;
}

static const gguf_kv *kv_get(const loom_gguf *g, const char *key) {
    int64_t i = loom_gguf_find(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

bool loom_gguf_get_i64(const loom_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv = kv_get(g, key);
    return kv && to_i64(g->base + kv->val_off, kv->type, out);
}

bool loom_gguf_get_f64(const loom_gguf *g, const char *key, double *out) {
    const gguf_kv *kv = kv_get(g, key);
    return kv && to_f64(g->base + kv->val_off, kv->type, out);
}

bool loom_gguf_get_bool(const loom_gguf *g, const char *key, bool *out) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_BOOL) return false;
    *out = g->base[kv->val_off] != 0;
    return true;
}

static loom_gguf_str str_at(const loom_gguf *g, uint64_t off) {
    return (loom_gguf_str){(const char *)g->base + off + 8, get_u64(g->base + off)};
}

bool loom_gguf_get_str(const loom_gguf *g, const char *key, loom_gguf_str *out) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_STRING) return false;
    *out = str_at(g, kv->val_off);
    return true;
}

bool loom_gguf_get_arr(const loom_gguf *g, const char *key, loom_gguf_type *elem_type, uint64_t *len) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (len) *len = kv->len;
    return true;
}

loom_gguf_str loom_gguf_arr_str(const loom_gguf *g, const char *key, uint64_t i) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_ARRAY || kv->elem_type != LOOM_GGUF_STRING || i >= kv->len || !kv->str_offs)
        return (loom_gguf_str){NULL, 0};
    return str_at(g, kv->str_offs[i]);
}

const void *loom_gguf_arr_data(const loom_gguf *g, const char *key) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_ARRAY || !scalar_size(kv->elem_type)) return NULL;
    return g->base + kv->val_off;
}

static const uint8_t *arr_elem(const loom_gguf *g, const char *key, uint64_t i, uint32_t *t) {
    const gguf_kv *kv = kv_get(g, key);
    if (!kv || kv->type != LOOM_GGUF_ARRAY || i >= kv->len) return NULL;
    size_t es = scalar_size(kv->elem_type);
    if (!es) return NULL;
    *t = kv->elem_type;
    return g->base + kv->val_off + i * es;
}

bool loom_gguf_arr_i64(const loom_gguf *g, const char *key, uint64_t i, int64_t *out) {
    uint32_t t;
    const uint8_t *p = arr_elem(g, key, i, &t);
    return p && to_i64(p, t, out);
}

bool loom_gguf_arr_f64(const loom_gguf *g, const char *key, uint64_t i, double *out) {
    uint32_t t;
    const uint8_t *p = arr_elem(g, key, i, &t);
    return p && to_f64(p, t, out);
}

int64_t loom_gguf_num_tensors(const loom_gguf *g) { return g->n_tensors; }

const loom_gguf_tensor_info *loom_gguf_tensor(const loom_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const loom_gguf_tensor_info *loom_gguf_find_tensor(const loom_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    int64_t i = bsearch_idx(g->t_sorted, g->n_tensors, g->tensors, sizeof(loom_gguf_tensor_info),
                            offsetof(loom_gguf_tensor_info, name), name);
    return i < 0 ? NULL : &g->tensors[i];
}
