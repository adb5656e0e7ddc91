/*
 * core/model/gguf.h — GGUF v2/v3 reader over mmap.
 *
 * Opens a file, validates its header, every metadata value and every tensor
 * record (type known, dims sane, data inside the file, aligned), and exposes
 * them read-only. Nothing is copied: strings and tensor data point into the
 * mapping, valid until loom_gguf_close(). Malformed files are errors that
 * name the file, the byte offset and the field, never crashes.
 */
#ifndef LOOM_CORE_GGUF_H
#define LOOM_CORE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/tensor.h"

/* GGUF metadata value types (spec numbering). */
typedef enum loom_gguf_type {
    LOOM_GGUF_UINT8 = 0, LOOM_GGUF_INT8 = 1, LOOM_GGUF_UINT16 = 2, LOOM_GGUF_INT16 = 3,
    LOOM_GGUF_UINT32 = 4, LOOM_GGUF_INT32 = 5, LOOM_GGUF_FLOAT32 = 6, LOOM_GGUF_BOOL = 7,
    LOOM_GGUF_STRING = 8, LOOM_GGUF_ARRAY = 9, LOOM_GGUF_UINT64 = 10, LOOM_GGUF_INT64 = 11,
    LOOM_GGUF_FLOAT64 = 12,
} loom_gguf_type;

typedef struct loom_gguf_str {
    const char *ptr;  /* NOT NUL-terminated; points into the mapping */
    uint64_t len;
} loom_gguf_str;

typedef struct loom_gguf loom_gguf;

typedef struct loom_gguf_tensor_info {
    loom_gguf_str name;
    uint32_t ggml_type;     /* raw GGML type number from the file          */
    loom_dtype dtype;       /* mapped loom type (valid when supported)     */
    bool supported;         /* false: a type loom cannot read (named in errors) */
    uint32_t n_dims;
    uint64_t ne[4];         /* GGML order: ne[0] is the contiguous dim     */
    uint64_t offset;        /* relative to the data section                */
    const void *data;       /* pointer into the mapping                    */
    size_t nbytes;
} loom_gguf_tensor_info;

loom_status loom_gguf_open(const char *path, loom_gguf **out, loom_error *err);
void loom_gguf_close(loom_gguf *g);

uint32_t loom_gguf_version(const loom_gguf *g);
const char *loom_gguf_path(const loom_gguf *g);

/* Metadata. Index of key or -1. */
int64_t loom_gguf_find(const loom_gguf *g, const char *key);
int64_t loom_gguf_num_kv(const loom_gguf *g);
loom_gguf_str loom_gguf_key(const loom_gguf *g, int64_t i);
loom_gguf_type loom_gguf_kv_type(const loom_gguf *g, int64_t i);
/* Scalar getters convert between integer widths (and to double) when the
 * value fits; return false when the key is absent or of another kind. */
bool loom_gguf_get_i64(const loom_gguf *g, const char *key, int64_t *out);
bool loom_gguf_get_f64(const loom_gguf *g, const char *key, double *out);
bool loom_gguf_get_bool(const loom_gguf *g, const char *key, bool *out);
bool loom_gguf_get_str(const loom_gguf *g, const char *key, loom_gguf_str *out);
/* Arrays: element type and length; element accessors (i < len). */
bool loom_gguf_get_arr(const loom_gguf *g, const char *key, loom_gguf_type *elem_type, uint64_t *len);
loom_gguf_str loom_gguf_arr_str(const loom_gguf *g, const char *key, uint64_t i);
/* Pointer to packed numeric array data (little-endian, elem size by type). */
const void *loom_gguf_arr_data(const loom_gguf *g, const char *key);

/* Tensors. */
int64_t loom_gguf_num_tensors(const loom_gguf *g);
const loom_gguf_tensor_info *loom_gguf_tensor(const loom_gguf *g, int64_t i);
const loom_gguf_tensor_info *loom_gguf_find_tensor(const loom_gguf *g, const char *name);

/* ---------------------------------------------------------------- additions
 * (beyond the original contract; all [any] thread, read-only) */

/* Parse a GGUF image already in memory. `data` is borrowed and must outlive
 * the handle; `name` (copied) stands in for the file name in errors. */
loom_status loom_gguf_open_buffer(const void *data, size_t size, const char *name,
                                  loom_gguf **out, loom_error *err);
/* Alignment of tensor data (general.alignment, default 32). */
uint64_t loom_gguf_alignment(const loom_gguf *g);
/* Byte offset of the data section in the file. */
uint64_t loom_gguf_data_offset(const loom_gguf *g);
/* GGML type name ("q4_1", "iq2_xxs", ...) or "unknown". */
const char *loom_gguf_type_name(uint32_t ggml_type);
/* Element i of a numeric array, converted like the scalar getters (the
 * packed data from loom_gguf_arr_data may be unaligned; these are not). */
bool loom_gguf_arr_i64(const loom_gguf *g, const char *key, uint64_t i, int64_t *out);
bool loom_gguf_arr_f64(const loom_gguf *g, const char *key, uint64_t i, double *out);
/* True when s equals the NUL-terminated c. */
bool loom_gguf_str_eq(loom_gguf_str s, const char *c);

#endif
