/*
 * loom/tensor.h — element types and the tensor descriptor that crosses the
 * plugin boundary.
 *
 * A loom_tensor is a view: it never owns its data. Shapes are row-major
 * (the LAST dimension is contiguous), PyTorch order: a linear weight of
 * `out` x `in` has shape {out, in}. Block-quantized types (Q4_1, ...) pack
 * whole blocks along the last dimension, so a row of `in` elements takes
 * host->dtype_row_bytes(type, in) bytes (loom/plugin.h). Declarations only:
 * the sizes and names of the types are host functions.
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
    /* since ABI 2.5 (an older host names it "unknown" and refuses it; a
     * plugin of ABI 2.4 or older built LOOM_DTYPE_COUNT as 12) */
    LOOM_DTYPE_Q5_K = 12,  /* GGUF: 256-elem super-blocks, 176 B             */
    /* since ABI 2.7 (a plugin of ABI 2.6 or older built LOOM_DTYPE_COUNT
     * as 13 or less) */
    LOOM_DTYPE_Q5_0 = 13,  /* GGUF: 32 elems, f16 scale + 4 B high bits + 16 B nibbles */
    LOOM_DTYPE_COUNT
} loom_dtype;

typedef enum loom_device_kind {
    LOOM_DEVICE_HOST = 0,  /* ordinary (possibly mmap'd) host memory          */
    LOOM_DEVICE_CUDA = 1,  /* device memory of `device_index`                  */
} loom_device_kind;

#define LOOM_TENSOR_MAX_DIMS 4

typedef struct loom_tensor {
    uint32_t struct_size;         /* sizeof(loom_tensor); frozen: embedded in loom_qtensor */
    loom_dtype dtype;             /* element type                            */
    int32_t ndim;                 /* 1..LOOM_TENSOR_MAX_DIMS                 */
    int64_t shape[LOOM_TENSOR_MAX_DIMS]; /* row-major, last dim contiguous  */
    void *data;                   /* borrowed; owner is whoever made it      */
    size_t nbytes;                /* bytes at data                           */
    loom_device_kind device;      /* where `data` lives                      */
    int32_t device_index;         /* CUDA ordinal; 0 for host                */
    const char *name;             /* canonical name, e.g. "blk.0.attn_q.weight"; may be NULL */
} loom_tensor;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_TENSOR_H */
