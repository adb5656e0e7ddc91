/*
 * loom/tensor.h — element types and the tensor descriptor that crosses the
 * plugin boundary.
 *
 * A loom_tensor is a view: it never owns its data. Shapes are row-major
 * (the LAST dimension is contiguous), PyTorch order: a linear weight of
 * `out` x `in` has shape {out, in}. Block-quantized types (Q4_1, ...) pack
 * whole blocks along the last dimension, so a row of `in` elements takes
 * loom_dtype_row_bytes(type, in) bytes.
 */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Values are stable ABI; append only. */
typedef enum loom_dtype {
    LOOM_DTYPE_F32 = 0,
    LOOM_DTYPE_F16 = 1,
    LOOM_DTYPE_BF16 = 2,
    LOOM_DTYPE_Q8_0 = 3,   /* GGUF: 32 elems, f16 scale + 32 x int8          */
    LOOM_DTYPE_Q4_0 = 4,   /* GGUF: 32 elems, f16 scale + 16 B nibbles       */
    LOOM_DTYPE_Q4_1 = 5,   /* GGUF: 32 elems, f16 scale, f16 min + 16 B       */
    LOOM_DTYPE_Q4_K = 6,   /* GGUF: 256-elem super-blocks, 144 B             */
    LOOM_DTYPE_Q6_K = 7,   /* GGUF: 256-elem super-blocks, 210 B             */
    LOOM_DTYPE_I8 = 8,
    LOOM_DTYPE_I32 = 9,
    LOOM_DTYPE_FP8_E4M3 = 10,
    LOOM_DTYPE_U8 = 11,
    LOOM_DTYPE_COUNT
} loom_dtype;

typedef enum loom_device_kind {
    LOOM_DEVICE_HOST = 0,  /* ordinary (possibly mmap'd) host memory          */
    LOOM_DEVICE_CUDA = 1,  /* device memory of `device_index`                  */
} loom_device_kind;

#define LOOM_TENSOR_MAX_DIMS 4

typedef struct loom_tensor {
    uint32_t struct_size;         /* sizeof(loom_tensor); grows only at end  */
    loom_dtype dtype;             /* element type                            */
    int32_t ndim;                 /* 1..LOOM_TENSOR_MAX_DIMS                 */
    int64_t shape[LOOM_TENSOR_MAX_DIMS]; /* row-major, last dim contiguous  */
    void *data;                   /* borrowed; owner is whoever made it      */
    size_t nbytes;                /* bytes at data                           */
    loom_device_kind device;      /* where `data` lives                      */
    int32_t device_index;         /* CUDA ordinal; 0 for host                */
    const char *name;             /* canonical name, e.g. "blk.0.attn_q.weight"; may be NULL */
} loom_tensor;

/* Elements per block (1 for plain types). */
static inline int64_t loom_dtype_block_elems(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_Q8_0: case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q4_1: return 32;
    case LOOM_DTYPE_Q4_K: case LOOM_DTYPE_Q6_K: return 256;
    default: return 1;
    }
}

/* Bytes per block (per element for plain types); 0 for an unknown type. */
static inline size_t loom_dtype_block_bytes(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: return 2;
    case LOOM_DTYPE_I8: case LOOM_DTYPE_U8: case LOOM_DTYPE_FP8_E4M3: return 1;
    case LOOM_DTYPE_Q8_0: return 34;
    case LOOM_DTYPE_Q4_0: return 18;
    case LOOM_DTYPE_Q4_1: return 20;
    case LOOM_DTYPE_Q4_K: return 144;
    case LOOM_DTYPE_Q6_K: return 210;
    default: return 0;
    }
}

/* Bytes of one row of `n` elements; 0 if n is not a whole number of blocks. */
static inline size_t loom_dtype_row_bytes(loom_dtype t, int64_t n) {
    int64_t be = loom_dtype_block_elems(t);
    if (n < 0 || n % be != 0) return 0;
    return (size_t)(n / be) * loom_dtype_block_bytes(t);
}

static inline const char *loom_dtype_name(loom_dtype t) {
    static const char *const names[LOOM_DTYPE_COUNT] = {
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "i8", "i32", "fp8_e4m3", "u8"};
    return (t >= 0 && t < LOOM_DTYPE_COUNT) ? names[t] : "unknown";
}

static inline int64_t loom_tensor_numel(const loom_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#ifdef __cplusplus
}
#endif
#endif /* LOOM_TENSOR_H */
