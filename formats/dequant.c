/*
 * formats/dequant.c — a row of any type loom reads to float32: 16-bit
 * floats through formats/half.h, GGUF blocks through the block decoders of
 * formats/gguf_blocks.h (which documents each layout), integers by value.
 */
#include "formats/dequant.h"
#include "formats/dtype.h"

#include <string.h>

#include "formats/gguf_blocks.h"
#include "formats/half.h"

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

bool loom_dequant_supported(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: case LOOM_DTYPE_Q8_0:
    case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q4_1: case LOOM_DTYPE_Q4_K: case LOOM_DTYPE_Q6_K:
    case LOOM_DTYPE_Q5_K: case LOOM_DTYPE_Q5_0: case LOOM_DTYPE_I8: case LOOM_DTYPE_I32:
        return true;
    default:
        return false;
    }
}

/* Block i of a row of type T: its bytes and its first output element. */
#define DEQ_BLOCKS(T, dec)                                                                         \
    for (int64_t i = 0; i < nb; i++)                                                               \
        dec(s + (size_t)i * LOOM_GGUF_##T##_BYTES, dst + i * LOOM_GGUF_##T##_ELEMS)

loom_status loom_dequant_row(loom_dtype t, const void *src, float *dst, int64_t n) {
    if (!loom_dequant_supported(t) || n < 0 || n % loom_dtype_block_elems(t) != 0)
        return LOOM_ERR_INVALID;
    const uint8_t *s = (const uint8_t *)src;
    int64_t nb = n / loom_dtype_block_elems(t);
    switch (t) {
    case LOOM_DTYPE_F32: memmove(dst, s, (size_t)n * 4); break;
    case LOOM_DTYPE_F16: for (int64_t i = 0; i < n; i++) dst[i] = loom_fp16_to_fp32(rd16(s + 2 * i)); break;
    case LOOM_DTYPE_BF16: for (int64_t i = 0; i < n; i++) dst[i] = loom_bf16_to_fp32(rd16(s + 2 * i)); break;
    case LOOM_DTYPE_I8: for (int64_t i = 0; i < n; i++) dst[i] = (float)(int8_t)s[i]; break;
    case LOOM_DTYPE_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + 4 * i, 4);
            dst[i] = (float)v;
        }
        break;
    case LOOM_DTYPE_Q8_0: DEQ_BLOCKS(Q8_0, loom_gguf_dec_q8_0); break;
    case LOOM_DTYPE_Q4_0: DEQ_BLOCKS(Q4_0, loom_gguf_dec_q4_0); break;
    case LOOM_DTYPE_Q4_1: DEQ_BLOCKS(Q4_1, loom_gguf_dec_q4_1); break;
    case LOOM_DTYPE_Q4_K: DEQ_BLOCKS(Q4_K, loom_gguf_dec_q4_k); break;
    case LOOM_DTYPE_Q6_K: DEQ_BLOCKS(Q6_K, loom_gguf_dec_q6_k); break;
    case LOOM_DTYPE_Q5_K: DEQ_BLOCKS(Q5_K, loom_gguf_dec_q5_k); break;
    case LOOM_DTYPE_Q5_0: DEQ_BLOCKS(Q5_0, loom_gguf_dec_q5_0); break;
    default: return LOOM_ERR_INVALID;
    }
    return LOOM_OK;
}
