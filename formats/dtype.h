/*
 * formats/dtype.h — the facts of loom's element types (loom/tensor.h) and
 * conversions between them, in one place for the core, the kernels, the
 * plugins' own code and the tests. Plugins built out of tree reach the
 * same functions through the host table (host->dtype_row_bytes,
 * host->convert, ...); in-tree kernel libraries link this directly.
 * Internal: never installed.
 */
#ifndef LOOM_FORMATS_DTYPE_H
#define LOOM_FORMATS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/tensor.h"

/* Elements per block: 1 for plain types, 32 or 256 for GGUF blocks; 0 for
 * an unknown type. */
int64_t     loom_dtype_block_elems(loom_dtype t);
/* Bytes per block (per element for plain types); 0 for an unknown type. */
size_t      loom_dtype_block_bytes(loom_dtype t);
/* Bytes of one row of n elements; 0 when n < 0, n is not a whole number of
 * blocks, or the type is unknown. */
size_t      loom_dtype_row_bytes(loom_dtype t, int64_t n);
/* "f32", "q4_k", ...; "unknown" outside the enum. */
const char *loom_dtype_name(loom_dtype t);
/* Elements of a tensor (the product of its shape). */
int64_t     loom_tensor_numel(const loom_tensor *t);

/* [any] Convert n elements of src_type at src (any alignment) to dst_type
 * at dst. Supported: every type formats/dequant.h reads -> F32; F32 -> F16,
 * BF16, FP8_E4M3 (round to nearest even; E4M3 saturates at +-448).
 * LOOM_ERR_UNSUPPORTED for other pairs, LOOM_ERR_INVALID for n < 0 or a
 * partial block; nothing is written then. What host->convert does. */
loom_status loom_convert(loom_dtype dst_type, void *dst, loom_dtype src_type, const void *src, int64_t n);

#endif
