/*
 * formats/dequant.c — scalar dequantization of GGML block formats and
 * 16-bit floats to float32, one row at a time.
 *
 * Layouts (little-endian, all fields packed, no padding):
 *   Q8_0 (32 elems, 34 B):  f16 d; int8 q[32];            x = d*q
 *   Q4_0 (32 elems, 18 B):  f16 d; u8 qs[16];             x[j] = d*(lo(qs[j])-8), x[j+16] = d*(hi(qs[j])-8)
 *   Q4_1 (32 elems, 20 B):  f16 d; f16 m; u8 qs[16];      x[j] = d*lo(qs[j])+m, x[j+16] = d*hi(qs[j])+m
 *   Q4_K (256 elems, 144 B): f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
 *        8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed in
 *        `scales`; sub-blocks 2i and 2i+1 share qs[32i..32i+32) (low / high
 *        nibbles): x = d*sc*q - dmin*m.
 *   Q6_K (256 elems, 210 B): u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d
 *        6-bit q = 4 low bits from ql | 2 high bits from qh, minus 32;
 *        16 sub-blocks of 16 with int8 scales: x = d*sc*q.
 */
#include "formats/dequant.h"
#include "formats/dtype.h"

#include <string.h>

#include "formats/half.h"

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

bool loom_dequant_supported(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: case LOOM_DTYPE_Q8_0:
    case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q4_1: case LOOM_DTYPE_Q4_K: case LOOM_DTYPE_Q6_K:
    case LOOM_DTYPE_I8: case LOOM_DTYPE_I32:
        return true;
    default:
        return false;
    }
}

/* Q4_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static inline void q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = loom_fp16_to_fp32(rd16(b));
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = loom_fp16_to_fp32(rd16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((int)(qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = loom_fp16_to_fp32(rd16(b));
        float m = loom_fp16_to_fp32(rd16(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 0xF) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = loom_fp16_to_fp32(rd16(b));
        float dmin = loom_fp16_to_fp32(rd16(b + 2));
        const uint8_t *scales = b + 4;
        const uint8_t *q = b + 16;
        for (int s = 0; s < 8; s += 2, q += 32) {
            uint8_t sc, m;
            q4k_scale_min(s, scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            q4k_scale_min(s + 1, scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = loom_fp16_to_fp32(rd16(b + 208));
        /* two halves of 128 elements; each uses 64 ql bytes, 32 qh bytes, 8 scales */
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

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
    case LOOM_DTYPE_Q8_0: deq_q8_0(s, dst, nb); break;
    case LOOM_DTYPE_Q4_0: deq_q4_0(s, dst, nb); break;
    case LOOM_DTYPE_Q4_1: deq_q4_1(s, dst, nb); break;
    case LOOM_DTYPE_Q4_K: deq_q4_k(s, dst, nb); break;
    case LOOM_DTYPE_Q6_K: deq_q6_k(s, dst, nb); break;
    default: return LOOM_ERR_INVALID;
    }
    return LOOM_OK;
}
