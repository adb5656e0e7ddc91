/*
 * formats/dequant.h — reference (scalar, portable) conversion of one row
 * of any loom weight type to float32.
 *
 * Block layouts are GGML's (formats/gguf_blocks.h): a row of n elements of
 * a block type is n / block_elems consecutive blocks. These are the correctness
 * reference for optimised CPU/GPU kernels and the fallback for loaders that
 * need float weights; they are not tuned for speed.
 */
#ifndef LOOM_FORMATS_DEQUANT_H
#define LOOM_FORMATS_DEQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/tensor.h"
#include "formats/dtype.h"

/* True for the types loom_dequant_row() accepts: F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, I8, I32 (integers convert by value). */
bool loom_dequant_supported(loom_dtype t);

/* Convert n elements at src (loom_dtype_row_bytes(t, n) bytes, any alignment)
 * to float32 at dst (n floats). n must be a multiple of the type's block size.
 * Returns LOOM_ERR_INVALID (and writes nothing) for an unsupported type or a
 * partial block. [any] thread. */
loom_status loom_dequant_row(loom_dtype t, const void *src, float *dst, int64_t n);

#endif
