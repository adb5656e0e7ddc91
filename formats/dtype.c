/*
 * formats/dtype.c — sizes and names of loom's element types, and the
 * one conversion entry point (host->convert) over formats/half.h,
 * formats/e4m3.h and formats/dequant.h; block sizes are
 * formats/gguf_blocks.h's.
 */
#include "formats/dtype.h"

#include <string.h>

#include "formats/dequant.h"
#include "formats/e4m3.h"
#include "formats/gguf_blocks.h"
#include "formats/half.h"

int64_t loom_dtype_block_elems(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_Q8_0: return LOOM_GGUF_Q8_0_ELEMS;
    case LOOM_DTYPE_Q4_0: return LOOM_GGUF_Q4_0_ELEMS;
    case LOOM_DTYPE_Q4_1: return LOOM_GGUF_Q4_1_ELEMS;
    case LOOM_DTYPE_Q4_K: return LOOM_GGUF_Q4_K_ELEMS;
    case LOOM_DTYPE_Q6_K: return LOOM_GGUF_Q6_K_ELEMS;
    case LOOM_DTYPE_Q5_K: return LOOM_GGUF_Q5_K_ELEMS;
    case LOOM_DTYPE_Q5_0: return LOOM_GGUF_Q5_0_ELEMS;
    case LOOM_DTYPE_F32: case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: case LOOM_DTYPE_I8:
    case LOOM_DTYPE_I32: case LOOM_DTYPE_FP8_E4M3: case LOOM_DTYPE_U8: return 1;
    default: return 0;
    }
}

size_t loom_dtype_block_bytes(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: return 2;
    case LOOM_DTYPE_I8: case LOOM_DTYPE_U8: case LOOM_DTYPE_FP8_E4M3: return 1;
    case LOOM_DTYPE_Q8_0: return LOOM_GGUF_Q8_0_BYTES;
    case LOOM_DTYPE_Q4_0: return LOOM_GGUF_Q4_0_BYTES;
    case LOOM_DTYPE_Q4_1: return LOOM_GGUF_Q4_1_BYTES;
    case LOOM_DTYPE_Q4_K: return LOOM_GGUF_Q4_K_BYTES;
    case LOOM_DTYPE_Q6_K: return LOOM_GGUF_Q6_K_BYTES;
    case LOOM_DTYPE_Q5_K: return LOOM_GGUF_Q5_K_BYTES;
    case LOOM_DTYPE_Q5_0: return LOOM_GGUF_Q5_0_BYTES;
    default: return 0;
    }
}

size_t loom_dtype_row_bytes(loom_dtype t, int64_t n) {
    int64_t be = loom_dtype_block_elems(t);
    if (be == 0 || n < 0 || n % be != 0) return 0;
    return (size_t)(n / be) * loom_dtype_block_bytes(t);
}

const char *loom_dtype_name(loom_dtype t) {
    static const char *const names[LOOM_DTYPE_COUNT] = {
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "i8", "i32", "fp8_e4m3", "u8", "q5_k", "q5_0"};
    return ((int)t >= 0 && t < LOOM_DTYPE_COUNT) ? names[t] : "unknown";
}

int64_t loom_tensor_numel(const loom_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* F32 into a 16-bit or 8-bit float type, element by element. */
static loom_status from_f32(loom_dtype dst_type, uint8_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, (const uint8_t *)src + 4 * i, 4);
        switch (dst_type) {
        case LOOM_DTYPE_F16: put16(dst + 2 * i, loom_fp32_to_fp16(f)); break;
        case LOOM_DTYPE_BF16: put16(dst + 2 * i, loom_fp32_to_bf16(f)); break;
        default: dst[i] = loom_fp32_to_e4m3(f); break;
        }
    }
    return LOOM_OK;
}

loom_status loom_convert(loom_dtype dst_type, void *dst, loom_dtype src_type, const void *src, int64_t n) {
    if (n < 0 || (n > 0 && (!dst || !src))) return LOOM_ERR_INVALID;
    if (dst_type == LOOM_DTYPE_F32 && src_type == LOOM_DTYPE_FP8_E4M3) {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            float f = loom_e4m3_to_fp32(s[i]);
            memcpy((uint8_t *)dst + 4 * i, &f, 4);
        }
        return LOOM_OK;
    }
    if (dst_type == LOOM_DTYPE_F32) {
        if (!loom_dequant_supported(src_type)) return LOOM_ERR_UNSUPPORTED;
        return loom_dequant_row(src_type, src, dst, n);
    }
    if (src_type == LOOM_DTYPE_F32 &&
        (dst_type == LOOM_DTYPE_F16 || dst_type == LOOM_DTYPE_BF16 || dst_type == LOOM_DTYPE_FP8_E4M3))
        return from_f32(dst_type, dst, src, n);
    return LOOM_ERR_UNSUPPORTED;
}
