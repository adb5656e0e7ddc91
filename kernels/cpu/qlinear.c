/*
 * kernels/cpu/qlinear.c — quantized linear layers on the CPU (see
 * qlinear.h for the formats and the arithmetic each one promises).
 *
 * Structure: the caller's thread prepares the activations a format needs
 * (int8 codes + per-token scales for W8A8, E4M3-rounded floats + scales for
 * FP8, q8 blocks for GGUF; all spread over the pool by token), then weight
 * rows are spread over the pool, by M:
 *   GGUF      at every M, each row's blocks are dotted in integers with the
 *             q8 activations (q8dot.h): on AVX-512 VNNI as 16-row tiles
 *             repacked once a call; elsewhere 4 rows a call at M = 1 and
 *             above, the group kernel (8 tokens interleaved);
 *   M <= 4    each row is decoded 32 weights at a time into vector registers
 *             and multiplied with every token (decode is the cost at batch 1,
 *             so it happens once per weight, next to the FMAs);
 *   M <= 31   a thread decodes a tile of a few rows (~8 KiB of float32, in
 *             L1) and runs a 2 rows x 4 tokens register-blocked kernel;
 *   M >= 32   float-activation formats (W8A16, INT4) decode 256-row panels
 *             and multiply them with OpenBLAS's sgemm (prefill is
 *             compute-bound);
 *   W8A8      dots int8 rows with int8 tokens in int32 at every M.
 * Measured choices (one core of the dev machine, N 1536 x K 576, weights
 * out of cache): fusing beats the tile at M = 1..4 by 1.3-1.8x; a 64 KiB
 * tile was 10-30% slower than an 8 KiB one at M = 4..16; GCC 12 scalarises
 * 8-bit -> float __builtin_convertvector, hence the widening in steps.
 */
#include "qlinear.h"
#include "q8dot.h"

#include "formats/dtype.h"
#include "formats/e4m3.h"
#include "formats/gguf_blocks.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QL_CLONES
#endif
#define QL_INLINE static inline __attribute__((always_inline))

#define QL_TILE_FLOATS 2048  /* ~8 KiB of decoded weight per thread: stays in L1  */
#define QL_PANEL_ROWS 256    /* weight rows decoded per sgemm panel (large M)   */
#define QL_FUSED_M 4         /* up to this many tokens, rows decode into registers */


#define QL_ALIGN 64

typedef float ql_v16 __attribute__((vector_size(64)));
typedef float ql_v8 __attribute__((vector_size(32)));
typedef float ql_v4 __attribute__((vector_size(16)));
typedef int8_t ql_i8x16 __attribute__((vector_size(16)));
typedef uint8_t ql_u8x16 __attribute__((vector_size(16)));
typedef uint8_t ql_u8x8 __attribute__((vector_size(8)));
typedef int16_t ql_i16x16 __attribute__((vector_size(32)));
typedef int32_t ql_i32x16 __attribute__((vector_size(64)));
typedef uint32_t ql_u32x16 __attribute__((vector_size(64)));
typedef uint16_t ql_u16x16 __attribute__((vector_size(32)));

/* Unaligned 16-float load (a macro: passing 64-byte vectors by value has a
 * target-dependent ABI). */
#define QL_LD(v, p) memcpy(&(v), (p), sizeof(ql_v16))

QL_INLINE float ql_hsum(const ql_v16 *v) {
    ql_v8 a = __builtin_shufflevector(*v, *v, 0, 1, 2, 3, 4, 5, 6, 7);
    ql_v8 b = __builtin_shufflevector(*v, *v, 8, 9, 10, 11, 12, 13, 14, 15);
    ql_v8 s8 = a + b;
    ql_v4 c = __builtin_shufflevector(s8, s8, 0, 1, 2, 3);
    ql_v4 d = __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
    ql_v4 s4 = c + d;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* ------------------------------------------------------------- FP8 E4M3 */

/* The codec is formats/e4m3.h's; decoding goes through a table of its 256
 * values. */
static float ql_e4m3_lut[256];
static pthread_once_t ql_lut_once = PTHREAD_ONCE_INIT;

static void ql_lut_init(void) {
    for (int i = 0; i < 256; i++) ql_e4m3_lut[i] = loom_e4m3_to_fp32((uint8_t)i);
}

void loom_cpu_f32_to_e4m3(uint8_t *dst, const float *src, int64_t n, float inv_scale) {
    for (int64_t i = 0; i < n; i++) dst[i] = loom_fp32_to_e4m3(src[i] * inv_scale);
}

void loom_cpu_e4m3_to_f32(float *dst, const uint8_t *src, int64_t n, float scale) {
    pthread_once(&ql_lut_once, ql_lut_init);
    for (int64_t i = 0; i < n; i++) dst[i] = ql_e4m3_lut[src[i]] * scale;
}

/* ------------------------------------------------------------ f16 helper */

/* IEEE binary16 at p (little-endian) -> float32, exact. _Float16 (GCC 12
 * on x86-64) becomes one vcvtph2ps in the x86-64-v3/v4 clones. */
QL_INLINE float ql_f16(const uint8_t *p) {
#if defined(__FLT16_MAX__)
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
#else
    return loom_gguf_f16(p);
#endif
}

/* ------------------------------------------------------------ weights */

bool loom_cpu_qformat_supported(loom_qformat format, loom_dtype dtype) {
    switch (format) {
    case LOOM_QFMT_INT8_W8A16: case LOOM_QFMT_INT8_W8A8: case LOOM_QFMT_FP8_W8A8:
    case LOOM_QFMT_INT4_W4A16:
        return true;
    case LOOM_QFMT_GGUF:
        return dtype == LOOM_DTYPE_Q4_0 || dtype == LOOM_DTYPE_Q4_1 || dtype == LOOM_DTYPE_Q5_0 ||
               dtype == LOOM_DTYPE_Q4_K || dtype == LOOM_DTYPE_Q8_0 || dtype == LOOM_DTYPE_Q6_K ||
               dtype == LOOM_DTYPE_Q5_K ||
               dtype == LOOM_DTYPE_F16 || dtype == LOOM_DTYPE_BF16;
    default:
        return false;
    }
}

static bool ql_why(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool ql_why(char *why, size_t size, const char *fmt, ...) {
    if (why && size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, size, fmt, ap);
        va_end(ap);
    }
    return false;
}

/* t is a host tensor of `dtype` with at least `count` elements. */
static bool ql_is(const loom_tensor *t, loom_dtype dtype, int64_t count) {
    return t->data && t->device == LOOM_DEVICE_HOST && t->dtype == dtype &&
           loom_tensor_numel(t) >= count && t->nbytes >= (size_t)count * loom_dtype_block_bytes(dtype);
}

bool loom_cpu_qweight_init(loom_cpu_qweight *w, const loom_qtensor *q, char *why, size_t size) {
    memset(w, 0, sizeof *w);
    if (!q) return ql_why(why, size, "no quantized tensor");
    const int64_t n = q->rows, k = q->cols;
    if (n <= 0 || k <= 0) return ql_why(why, size, "shape (%lld, %lld) is empty", (long long)n, (long long)k);
    w->format = q->format;
    w->n = n;
    w->k = k;
    switch (q->format) {
    case LOOM_QFMT_INT8_W8A16:
    case LOOM_QFMT_INT8_W8A8:
        if (!ql_is(&q->data, LOOM_DTYPE_I8, n * k))
            return ql_why(why, size, "data must be i8 (%lld, %lld) on the host, got %s of %zu bytes",
                          (long long)n, (long long)k, loom_dtype_name(q->data.dtype), q->data.nbytes);
        if (!ql_is(&q->scales, LOOM_DTYPE_F32, n))
            return ql_why(why, size, "scales must be f32 (%lld)", (long long)n);
        w->dtype = LOOM_DTYPE_I8;
        w->row_bytes = (size_t)k;
        break;
    case LOOM_QFMT_FP8_W8A8: {
        if (!ql_is(&q->data, LOOM_DTYPE_FP8_E4M3, n * k))
            return ql_why(why, size, "data must be fp8_e4m3 (%lld, %lld) on the host, got %s of %zu bytes",
                          (long long)n, (long long)k, loom_dtype_name(q->data.dtype), q->data.nbytes);
        int64_t ns = loom_tensor_numel(&q->scales);
        if (!(ns == n || ns == 1) || !ql_is(&q->scales, LOOM_DTYPE_F32, ns))
            return ql_why(why, size, "scales must be f32 (%lld) or (1), got %lld", (long long)n, (long long)ns);
        w->per_tensor = ns == 1 && n != 1;
        w->dtype = LOOM_DTYPE_FP8_E4M3;
        w->row_bytes = (size_t)k;
        break;
    }
    case LOOM_QFMT_INT4_W4A16: {
        int32_t g = q->group_size;
        if (g < 2 || g % 2 || k % g)
            return ql_why(why, size, "group_size %d must be even and divide %lld columns", g, (long long)k);
        if (!ql_is(&q->data, LOOM_DTYPE_U8, n * (k / 2)))
            return ql_why(why, size, "data must be u8 (%lld, %lld) on the host, got %s of %zu bytes",
                          (long long)n, (long long)(k / 2), loom_dtype_name(q->data.dtype), q->data.nbytes);
        if (!ql_is(&q->scales, LOOM_DTYPE_F32, n * (k / g)) || !ql_is(&q->zeros, LOOM_DTYPE_F32, n * (k / g)))
            return ql_why(why, size, "scales and zeros must be f32 (%lld, %lld)", (long long)n, (long long)(k / g));
        w->dtype = LOOM_DTYPE_U8;
        w->group_size = g;
        w->row_bytes = (size_t)(k / 2);
        w->zeros = q->zeros.data;
        break;
    }
    default:
        return ql_why(why, size, "format %d has no CPU kernel here (GGUF tensors: use loom_cpu_qweight_gguf)",
                      (int)q->format);
    }
    /* SmoothQuant: the formats whose activations are quantized (W8A8) */
    if ((q->format == LOOM_QFMT_INT8_W8A8 || q->format == LOOM_QFMT_FP8_W8A8) && q->smooth.data) {
        if (!ql_is(&q->smooth, LOOM_DTYPE_F32, k))
            return ql_why(why, size, "smooth must be f32 (%lld)", (long long)k);
        w->smooth = q->smooth.data;
    }
    w->data = q->data.data;
    w->scales = q->scales.data;
    w->row_stride = w->row_bytes;
    w->scale_stride = w->group_size > 0 ? k / w->group_size : 0;
    return true;
}

bool loom_cpu_qweight_gguf(loom_cpu_qweight *w, const loom_tensor *t, char *why, size_t size) {
    memset(w, 0, sizeof *w);
    if (!t || t->ndim != 2) return ql_why(why, size, "not a 2-D tensor");
    if (!loom_cpu_qformat_supported(LOOM_QFMT_GGUF, t->dtype))
        return ql_why(why, size, "type %s has no CPU kernel as stored (q4_0, q4_1, q5_0, q4_k, q5_k, q8_0, q6_k, f16, bf16 do)",
                      loom_dtype_name(t->dtype));
    const int64_t n = t->shape[0], k = t->shape[1];
    size_t rb = loom_dtype_row_bytes(t->dtype, k);
    if (n <= 0 || rb == 0)
        return ql_why(why, size, "%lld columns are not whole %s blocks of %lld", (long long)k,
                      loom_dtype_name(t->dtype), (long long)loom_dtype_block_elems(t->dtype));
    if (!t->data || t->device != LOOM_DEVICE_HOST || t->nbytes < rb * (size_t)n)
        return ql_why(why, size, "%zu bytes of host data, need %zu", t->nbytes, rb * (size_t)n);
    *w = (loom_cpu_qweight){.format = LOOM_QFMT_GGUF, .dtype = t->dtype, .n = n, .k = k,
                            .row_bytes = rb, .row_stride = rb, .data = t->data};
    return true;
}

bool loom_cpu_qweight_slice(loom_cpu_qweight *out, const loom_cpu_qweight *w, int64_t r0,
                            int64_t nr, int64_t c0, int64_t nc, char *why, size_t size) {
    if (r0 < 0 || nr <= 0 || r0 + nr > w->n || c0 < 0 || nc <= 0 || c0 + nc > w->k)
        return ql_why(why, size, "slice rows [%lld, %lld) x columns [%lld, %lld) is outside "
                      "(%lld, %lld)", (long long)r0, (long long)(r0 + nr), (long long)c0,
                      (long long)(c0 + nc), (long long)w->n, (long long)w->k);
    int64_t align = w->format == LOOM_QFMT_INT4_W4A16 ? w->group_size
                    : w->format == LOOM_QFMT_GGUF    ? loom_dtype_block_elems(w->dtype)
                                                     : 1;
    if (c0 % align || nc % align)
        return ql_why(why, size, "column slice [%lld, %lld) does not start and end on a %s of %lld",
                      (long long)c0, (long long)(c0 + nc),
                      w->format == LOOM_QFMT_GGUF ? "block" : "group", (long long)align);
    loom_cpu_qweight v = *w;
    v.n = nr;
    v.k = nc;
    v.data = w->data + (size_t)r0 * w->row_stride;
    switch (w->format) {
    case LOOM_QFMT_INT4_W4A16:
        v.data += c0 / 2;
        v.row_bytes = (size_t)(nc / 2);
        v.scales = w->scales + r0 * w->scale_stride + c0 / w->group_size;
        v.zeros = w->zeros + r0 * w->scale_stride + c0 / w->group_size;
        break;
    case LOOM_QFMT_GGUF:
        v.data += (size_t)(c0 / align) * loom_dtype_block_bytes(w->dtype);
        v.row_bytes = loom_dtype_row_bytes(w->dtype, nc);
        break;
    default: /* one byte per weight, one scale per row (or per tensor) */
        v.data += c0;
        v.row_bytes = (size_t)nc;
        if (!w->per_tensor) v.scales = w->scales + r0;
        if (w->smooth) v.smooth = w->smooth + c0;
        break;
    }
    *out = v;
    return true;
}

size_t loom_cpu_qweight_bytes(const loom_cpu_qweight *w) {
    size_t b = w->row_bytes * (size_t)w->n;
    if (w->format == LOOM_QFMT_INT4_W4A16) b += (size_t)w->n * (size_t)(w->k / w->group_size) * 8;
    else if (w->format != LOOM_QFMT_GGUF) b += (size_t)(w->per_tensor ? 1 : w->n) * 4;
    return b;
}

/* ------------------------------------------------------------ decoders */

/* One GGUF row of K elements into dst, block by block (formats/gguf_blocks.h:
 * the layouts and their scalar decode, inlined here into this file's
 * target clones). */
#define QL_GGUF_ROW(T, dec)                                                                        \
    for (int64_t i = 0; i < K / LOOM_GGUF_##T##_ELEMS; i++)                                        \
        dec(b + (size_t)i * LOOM_GGUF_##T##_BYTES, y + i * LOOM_GGUF_##T##_ELEMS)

QL_INLINE void ql_dec_gguf(loom_dtype t, const uint8_t *b, int64_t K, float *y) {
    switch (t) {
    case LOOM_DTYPE_Q8_0: QL_GGUF_ROW(Q8_0, loom_gguf_dec_q8_0); break;
    case LOOM_DTYPE_Q4_0: QL_GGUF_ROW(Q4_0, loom_gguf_dec_q4_0); break;
    case LOOM_DTYPE_Q5_0: QL_GGUF_ROW(Q5_0, loom_gguf_dec_q5_0); break;
    case LOOM_DTYPE_Q4_1: QL_GGUF_ROW(Q4_1, loom_gguf_dec_q4_1); break;
    case LOOM_DTYPE_Q4_K: QL_GGUF_ROW(Q4_K, loom_gguf_dec_q4_k); break;
    case LOOM_DTYPE_Q6_K: QL_GGUF_ROW(Q6_K, loom_gguf_dec_q6_k); break;
    case LOOM_DTYPE_Q5_K: QL_GGUF_ROW(Q5_K, loom_gguf_dec_q5_k); break;
    case LOOM_DTYPE_F16:
        for (int64_t i = 0; i < K; i++) y[i] = loom_fp16_to_fp32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        break;
    case LOOM_DTYPE_BF16:
        for (int64_t i = 0; i < K; i++) y[i] = loom_bf16_to_fp32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        break;
    default: break;
    }
}

/* ------------------------------------------------ 16-wide decoders */

/* Formats decoded 16 weights at a time into one vector (every 16-aligned
 * run of a row shares one scale / zero / block): the fused small-M kernel
 * and the tile decoder use them. Others (q5_0, q4_k, q5_k, q6_k, int4 groups
 * that are not multiples of 16) take the scalar decoder: GGUF blocks reach
 * these decoders only through loom_cpu_qweight_rows (they run on q8dot.h). */
enum { QK_I8, QK_FP8, QK_I4, QK_Q4_0, QK_Q4_1, QK_Q8_0, QK_F16, QK_BF16, QK_NONE };

/* 16-bit float weights kept as stored. */
static inline bool ql_is_16(const loom_cpu_qweight *w) {
    return w->format == LOOM_QFMT_GGUF && (w->dtype == LOOM_DTYPE_F16 || w->dtype == LOOM_DTYPE_BF16);
}

/* Does w run on the 8-bit block activations of q8dot.h? (GGUF blocks do;
 * 16-bit float weights kept as stored multiply float activations.) */
static inline bool ql_is_q8(const loom_cpu_qweight *w) {
    return w->format == LOOM_QFMT_GGUF && !ql_is_16(w);
}

static inline int ql_kind(const loom_cpu_qweight *w) {
    switch (w->format) {
    case LOOM_QFMT_INT8_W8A16: case LOOM_QFMT_INT8_W8A8: return QK_I8;
    case LOOM_QFMT_FP8_W8A8: return QK_FP8;
    case LOOM_QFMT_INT4_W4A16: return w->group_size % 16 == 0 ? QK_I4 : QK_NONE;
    case LOOM_QFMT_GGUF:
        return w->dtype == LOOM_DTYPE_Q4_0   ? QK_Q4_0
               : w->dtype == LOOM_DTYPE_Q4_1 ? QK_Q4_1
               : w->dtype == LOOM_DTYPE_Q8_0 ? QK_Q8_0
               : w->dtype == LOOM_DTYPE_F16  ? QK_F16
               : w->dtype == LOOM_DTYPE_BF16 ? QK_BF16
                                             : QK_NONE;
    default: return QK_NONE;
    }
}

/* Per-row state of a 16-wide decoder. */
typedef struct ql_row {
    const uint8_t *p;          /* the row's data                               */
    float s;                   /* INT8 / FP8 scale                             */
    const float *sc, *z;       /* INT4 (k/g) scales and zeros of the row       */
    int32_t g;                 /* INT4 group                                   */
    int gshift;                /* log2(g) when g is a power of two, else -1    */
} ql_row;

/* Group of input k (a division only for groups that are not powers of two). */
QL_INLINE int64_t ql_group(const ql_row *q, int64_t k) {
    return q->gshift >= 0 ? k >> q->gshift : k / q->g;
}

QL_INLINE ql_row ql_row_of(const loom_cpu_qweight *w, int64_t r) {
    ql_row q = {.p = w->data + (size_t)r * w->row_stride, .g = w->group_size, .gshift = -1};
    if (w->format == LOOM_QFMT_INT4_W4A16) {
        if ((q.g & (q.g - 1)) == 0) q.gshift = __builtin_ctz((unsigned)q.g);
        q.sc = w->scales + r * w->scale_stride;
        q.z = w->zeros + r * w->scale_stride;
    } else if (w->format != LOOM_QFMT_GGUF) {
        q.s = w->per_tensor ? w->scales[0] : w->scales[r];
    }
    return q;
}

/* int8 / uint8 lanes -> float lanes, widening one step at a time: GCC 12
 * scalarises a direct 8-bit -> 32-bit or -> float __builtin_convertvector
 * but turns each doubling into one pmovsx/pmovzx. */
#define QL_I8F(c)                                                                                  \
    __builtin_convertvector(                                                                       \
        __builtin_convertvector(__builtin_convertvector((c), ql_i16x16), ql_i32x16), ql_v16)

/* IEEE half codes (in 32-bit lanes) -> float32 bits, exactly, in integer
 * vector arithmetic (no F16C needed, so every target_clones build
 * vectorises it; a _Float16 vector conversion is scalarised by GCC 12):
 * exponent and mantissa move up 13 bits and the exponent is rebiased by
 * 112 (127 - 15); Inf / NaN (exponent 31) get 112 more so they stay at
 * 255; subnormals (exponent 0) are built as 2^-14 (1 + m / 1024) and
 * 2^-14 subtracted, which leaves m 2^-24 exactly (zero stays zero).
 * Pointers, not vector values: a 64-byte vector argument or return value
 * has a target-dependent ABI. */
QL_INLINE void ql_f16_bits(const ql_u32x16 *hp, ql_u32x16 *out) {
    const ql_u32x16 h = *hp;
    const ql_u32x16 m = (h & 0x7fffu) << 13, e = m & (0x7c00u << 13);
    ql_u32x16 o = m + (112u << 23);
    o += (ql_u32x16)(e == (0x7c00u << 13)) & (112u << 23);
    ql_u32x16 sb = o + (1u << 23);
    ql_v16 sf;
    memcpy(&sf, &sb, sizeof sf);
    sf -= 0x1p-14f;
    memcpy(&sb, &sf, sizeof sb);
    const ql_u32x16 sub = (ql_u32x16)(e == 0u);
    *out = ((sb & sub) | (o & ~sub)) | (h & 0x8000u) << 16;
}

/* Weights [k, k + 16) of the row, dequantized, into *out; k a multiple of
 * 16. (An out-parameter: a 64-byte vector return value has a
 * target-dependent ABI.) */
QL_INLINE void ql_dec16(const int kind, const ql_row *q, int64_t k, ql_v16 *out) {
    ql_v16 v = {0};
    switch (kind) {
    case QK_I8: {
        ql_i8x16 c;
        memcpy(&c, q->p + k, 16);
        v = QL_I8F(c) * q->s;
        break;
    }
    case QK_FP8: {
        ql_u8x16 c8;
        memcpy(&c8, q->p + k, 16);
        /* E4M3 -> f32 by bits: normal codes rebias the exponent (7 -> 127),
         * subnormal codes (exponent 0) are mantissa * 2^-9; no NaN weights */
        ql_u32x16 c = (ql_u32x16)__builtin_convertvector(__builtin_convertvector(c8, ql_i16x16),
                                                         ql_i32x16);
        ql_u32x16 em = c & 0x7fu, sg = (c & 0x80u) << 24;
        ql_u32x16 nb = sg | ((em << 20) + (120u << 23)), sb;
        ql_v16 sf = __builtin_convertvector((ql_i32x16)em, ql_v16) * 0x1p-9f;
        memcpy(&sb, &sf, sizeof sb);
        sb |= sg;
        ql_u32x16 m = (ql_u32x16)(em >= 8u), bits = (nb & m) | (sb & ~m);
        memcpy(&v, &bits, sizeof v);
        v *= q->s;
        break;
    }
    case QK_I4: {
        /* 8 bytes -> 16 nibbles, low nibble first; one group per 16 */
        const int64_t gi = ql_group(q, k);
        const float a = q->sc[gi], c0 = -q->z[gi] * a;
        ql_u8x8 b;
        memcpy(&b, q->p + k / 2, 8);
        ql_u8x8 lo = b & 15, hi = b >> 4;
        ql_u8x16 d = __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14,
                                             7, 15);
        v = QL_I8F(d) * a + c0;
        break;
    }
    case QK_Q4_0:
    case QK_Q4_1: {
        /* block of 32: elements 0..15 are the low nibbles of qs[16], 16..31
         * the high ones */
        const bool q41 = kind == QK_Q4_1;
        const uint8_t *blk = q->p + (k / 32) * (q41 ? 20 : 18);
        const float d = ql_f16(blk), m = q41 ? ql_f16(blk + 2) : -8.0f * d;
        ql_u8x16 c;
        memcpy(&c, blk + (q41 ? 4 : 2), 16);
        c = (k & 16) ? c >> 4 : c & 15;
        v = QL_I8F(c) * d + m;
        break;
    }
    case QK_Q8_0: {
        const uint8_t *blk = q->p + (k / 32) * 34;
        ql_i8x16 c;
        memcpy(&c, blk + 2 + (k & 16), 16);
        v = QL_I8F(c) * ql_f16(blk);
        break;
    }
    case QK_F16:
    case QK_BF16: {
        ql_u16x16 h;
        memcpy(&h, q->p + 2 * k, 32);
        const ql_u32x16 c = __builtin_convertvector(h, ql_u32x16);
        ql_u32x16 bits = c << 16;
        if (kind == QK_F16) ql_f16_bits(&c, &bits);
        memcpy(&v, &bits, sizeof v);
        break;
    }
    default: break;
    }
    *out = v;
}

/* Weights [k, k + 32) into *v0 (first 16) and *v1; k a multiple of 32.
 * One load of a q4 block's 16 bytes gives both halves. */
QL_INLINE void ql_dec32(const int kind, const ql_row *q, int64_t k, ql_v16 *v0, ql_v16 *v1) {
    switch (kind) {
    case QK_I4: {
        const int64_t g0 = ql_group(q, k), g1 = ql_group(q, k + 16);
        const float a0 = q->sc[g0], c0 = -q->z[g0] * a0, a1 = q->sc[g1], c1 = -q->z[g1] * a1;
        ql_u8x16 b;
        memcpy(&b, q->p + k / 2, 16);
        ql_u8x16 lo = b & 15, hi = b >> 4;
        /* interleave back to column order: unpacklo / unpackhi of bytes */
        ql_u8x16 e0 = __builtin_shufflevector(lo, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6,
                                              22, 7, 23);
        ql_u8x16 e1 = __builtin_shufflevector(lo, hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29,
                                              14, 30, 15, 31);
        *v0 = QL_I8F(e0) * a0 + c0;
        *v1 = QL_I8F(e1) * a1 + c1;
        break;
    }
    case QK_Q4_0:
    case QK_Q4_1: {
        const bool q41 = kind == QK_Q4_1;
        const uint8_t *blk = q->p + (k / 32) * (q41 ? 20 : 18);
        const float d = ql_f16(blk), m = q41 ? ql_f16(blk + 2) : -8.0f * d;
        ql_u8x16 c;
        memcpy(&c, blk + (q41 ? 4 : 2), 16);
        ql_u8x16 lo = c & 15, hi = c >> 4;
        *v0 = QL_I8F(lo) * d + m;
        *v1 = QL_I8F(hi) * d + m;
        break;
    }
    case QK_Q8_0: {
        const uint8_t *blk = q->p + (k / 32) * 34;
        const float d = ql_f16(blk);
        ql_i8x16 c0, c1;
        memcpy(&c0, blk + 2, 16);
        memcpy(&c1, blk + 18, 16);
        *v0 = QL_I8F(c0) * d;
        *v1 = QL_I8F(c1) * d;
        break;
    }
    default:
        ql_dec16(kind, q, k, v0);
        ql_dec16(kind, q, k + 16, v1);
        break;
    }
}

/* Weight k of the row for the K % 16 tail (INT8, FP8, F16 and BF16 only:
 * the other vector kinds have K a multiple of 16). */
QL_INLINE float ql_dec1(const int kind, const ql_row *q, int64_t k) {
    if (kind == QK_F16 || kind == QK_BF16) {
        const uint16_t h = (uint16_t)(q->p[2 * k] | q->p[2 * k + 1] << 8);
        return kind == QK_F16 ? loom_fp16_to_fp32(h) : loom_bf16_to_fp32(h);
    }
    return kind == QK_FP8 ? ql_e4m3_lut[q->p[k]] * q->s : (float)(int8_t)q->p[k] * q->s;
}

/* Rows [r0, r0 + nr) of w as float32 into t (nr, K), scalar. */
QL_INLINE void ql_decode_scalar(const loom_cpu_qweight *w, int64_t r0, int64_t nr, float *t) {
    const int64_t K = w->k;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *row = w->data + (size_t)(r0 + r) * w->row_stride;
        float *dst = t + r * K;
        switch (w->format) {
        case LOOM_QFMT_INT8_W8A16:
        case LOOM_QFMT_INT8_W8A8: {
            const int8_t *q = (const int8_t *)row;
            float s = w->scales[r0 + r];
            for (int64_t k = 0; k < K; k++) dst[k] = (float)q[k] * s;
            break;
        }
        case LOOM_QFMT_FP8_W8A8: {
            float s = w->per_tensor ? w->scales[0] : w->scales[r0 + r];
            for (int64_t k = 0; k < K; k++) dst[k] = ql_e4m3_lut[row[k]] * s;
            break;
        }
        case LOOM_QFMT_INT4_W4A16: {
            const int32_t g = w->group_size;
            const int64_t ng = K / g;
            const float *sc = w->scales + (r0 + r) * w->scale_stride;
            const float *zr = w->zeros + (r0 + r) * w->scale_stride;
            for (int64_t gi = 0; gi < ng; gi++) {
                /* (q - zero) * scale as one FMA: q * scale + (-zero * scale) */
                const float a = sc[gi], c = -zr[gi] * a;
                const uint8_t *p = row + gi * (g / 2);
                float *o = dst + gi * g;
                for (int32_t i = 0; i < g / 2; i++) {
                    o[2 * i] = (float)(p[i] & 0xF) * a + c;
                    o[2 * i + 1] = (float)(p[i] >> 4) * a + c;
                }
            }
            break;
        }
        case LOOM_QFMT_GGUF:
            ql_dec_gguf(w->dtype, row, K, dst);
            break;
        default:
            memset(dst, 0, (size_t)K * sizeof(float));
            break;
        }
    }
}

/* Rows [r0, r0 + nr) of w into t (nr, K): 16-wide where the format allows. */
QL_INLINE void ql_decode_kind(const int kind, const loom_cpu_qweight *w, int64_t r0, int64_t nr,
                              float *t) {
    const int64_t K = w->k, K16 = K & ~(int64_t)15;
    for (int64_t r = 0; r < nr; r++) {
        const ql_row q = ql_row_of(w, r0 + r);
        float *dst = t + r * K;
        const int64_t K32 = K & ~(int64_t)31;
        for (int64_t k = 0; k < K32; k += 32) {
            ql_v16 v0, v1;
            ql_dec32(kind, &q, k, &v0, &v1);
            memcpy(dst + k, &v0, sizeof v0);
            memcpy(dst + k + 16, &v1, sizeof v1);
        }
        if (K16 > K32) {
            ql_v16 v;
            ql_dec16(kind, &q, K32, &v);
            memcpy(dst + K32, &v, sizeof v);
        }
        for (int64_t k = K16; k < K; k++) dst[k] = ql_dec1(kind, &q, k);
    }
}

QL_INLINE void ql_decode(const loom_cpu_qweight *w, int64_t r0, int64_t nr, float *t) {
    switch (ql_kind(w)) {
    case QK_I8: ql_decode_kind(QK_I8, w, r0, nr, t); break;
    case QK_FP8: ql_decode_kind(QK_FP8, w, r0, nr, t); break;
    case QK_I4: ql_decode_kind(QK_I4, w, r0, nr, t); break;
    case QK_Q4_0: ql_decode_kind(QK_Q4_0, w, r0, nr, t); break;
    case QK_Q4_1: ql_decode_kind(QK_Q4_1, w, r0, nr, t); break;
    case QK_Q8_0: ql_decode_kind(QK_Q8_0, w, r0, nr, t); break;
    case QK_F16: ql_decode_kind(QK_F16, w, r0, nr, t); break;
    case QK_BF16: ql_decode_kind(QK_BF16, w, r0, nr, t); break;
    default: ql_decode_scalar(w, r0, nr, t); break;
    }
}

void loom_cpu_qweight_rows(const loom_cpu_qweight *w, int64_t r0, int64_t nr, float *dst) {
    pthread_once(&ql_lut_once, ql_lut_init);
    ql_decode(w, r0, nr, dst);
}

/* ------------------------------------------------------------ scratch */

struct loom_cpu_qscratch {
    float *tiles;      /* (threads, tile_floats)                            */
    size_t tiles_cap;  /* floats                                            */
    int8_t *xq;        /* W8A8: (M, K) int8 codes                           */
    size_t xq_cap;     /* bytes                                             */
    float *xf;         /* FP8: (M, K) E4M3-rounded activations (unscaled)   */
    size_t xf_cap;     /* floats                                            */
    float *sx;         /* (2, M): W8A8 then FP8 per-token scales            */
    size_t sx_cap;     /* floats                                            */
    float *panel;      /* large M: (QL_PANEL_ROWS, K) decoded rows for sgemm */
    size_t panel_cap;  /* floats                                            */
    uint8_t *x8;       /* GGUF: (M, loom_cpu_q8_bytes(K)) q8 activations     */
    size_t x8_cap;     /* bytes                                             */
    loom_cpu_q8 *x8v;  /* GGUF: (M) views into x8                           */
    size_t x8v_cap;    /* entries                                           */
    uint8_t *x8g;      /* GGUF, M > 1: (M/8 up, loom_cpu_q8g_bytes(K)) groups */
    size_t x8g_cap;    /* bytes                                             */
    loom_cpu_q8g *x8gv; /* GGUF, M > 1: views into x8g                      */
    size_t x8gv_cap;   /* entries                                           */
    uint8_t *q8t;      /* GGUF tiles: (threads, ql_q8t_bytes(K))            */
    size_t q8t_cap;    /* bytes                                             */
};

loom_cpu_qscratch *loom_cpu_qscratch_create(void) {
    pthread_once(&ql_lut_once, ql_lut_init);
    return calloc(1, sizeof(loom_cpu_qscratch));
}

void loom_cpu_qscratch_destroy(loom_cpu_qscratch *s) {
    if (!s) return;
    free(s->tiles);
    free(s->xq);
    free(s->xf);
    free(s->sx);
    free(s->panel);
    free(s->x8);
    free(s->x8v);
    free(s->x8g);
    free(s->x8gv);
    free(s->q8t);
    free(s);
}

/* Make *p hold `need` elements of `elem` bytes (64-byte aligned). */
static bool ql_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    void *q = NULL;
    size_t bytes = need * elem;
    if (posix_memalign(&q, QL_ALIGN, bytes ? bytes : QL_ALIGN) != 0) return false;
    free(*p);
    *p = q;
    *cap = need;
    return true;
}

/* ------------------------------------------------------------ the job */

typedef struct ql_job {
    float *y;
    int64_t ldy;
    const float *x;            /* float activations (M, ldx)                    */
    int64_t ldx;
    const float *xf;           /* FP8: E4M3-rounded activations (M, K) or NULL  */
    const float *sxf;          /* FP8: per-token scales (M)                     */
    const int8_t *xq;          /* W8A8: int8 activations (M, K) or NULL         */
    const float *sxq;          /* W8A8: per-token scales (M)                    */
    const float *smooth;       /* INT8 / FP8 W8A8: smoothing vector, or NULL    */
    uint8_t *x8buf;            /* GGUF: (M, loom_cpu_q8_bytes(K)) or NULL       */
    loom_cpu_q8 *x8;           /* GGUF: (M) q8 activations of each token        */
    uint8_t *x8gbuf;           /* GGUF, M > 1: the groups' bytes, or NULL       */
    loom_cpu_q8g *x8g;         /* GGUF, M > 1: tokens 8g.. interleaved, or NULL */
    int64_t M, K;
    float beta;
    int nparts;
    const loom_cpu_qweight *w[LOOM_CPU_QLINEAR_MAX_PARTS];
    const float *bias[LOOM_CPU_QLINEAR_MAX_PARTS];
    int64_t off[LOOM_CPU_QLINEAR_MAX_PARTS + 1]; /* first output column of each part */
    float *tiles;              /* (threads, tile_floats)                        */
    size_t tile_floats;
    int64_t tile_rows;         /* R                                             */
    uint8_t *q8t;              /* GGUF tiles: (threads, q8t_bytes) or NULL      */
    size_t q8t_bytes;
} ql_job;

QL_INLINE void ql_store(const ql_job *j, int64_t m, int64_t col, float v) {
    float *o = j->y + m * j->ldy + col;
    *o = j->beta != 0.0f ? v + j->beta * *o : v;
}

/* M = 1: rows of the tile t (nr, K) against the single token x, four rows
 * at a time. Output columns col.., bias indexed from 0 (already offset);
 * xs: per-token scale or NULL. */
QL_INLINE void ql_tile_m1(const ql_job *j, const float *t, int64_t nr, const float *x,
                          const float *xs, int64_t col, const float *bias) {
    const int64_t K = j->K, K16 = K & ~(int64_t)15;
    for (int64_t r = 0; r < nr; r += 4) {
        int rr = nr - r < 4 ? (int)(nr - r) : 4;
        const float *w0 = t + r * K;
        const float *w1 = rr > 1 ? w0 + K : w0, *w2 = rr > 2 ? w0 + 2 * K : w0;
        const float *w3 = rr > 3 ? w0 + 3 * K : w0;
        ql_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t k = 0; k < K16; k += 16) {
            ql_v16 xv, v0, v1, v2, v3;
            QL_LD(xv, x + k);
            QL_LD(v0, w0 + k), QL_LD(v1, w1 + k), QL_LD(v2, w2 + k), QL_LD(v3, w3 + k);
            a0 += v0 * xv, a1 += v1 * xv, a2 += v2 * xv, a3 += v3 * xv;
        }
        float s[4] = {ql_hsum(&a0), ql_hsum(&a1), ql_hsum(&a2), ql_hsum(&a3)};
        for (int64_t k = K16; k < K; k++) {
            s[0] += w0[k] * x[k], s[1] += w1[k] * x[k];
            s[2] += w2[k] * x[k], s[3] += w3[k] * x[k];
        }
        for (int i = 0; i < rr; i++) {
            float v = xs ? s[i] * xs[0] : s[i];
            if (bias) v += bias[r + i];
            ql_store(j, 0, col + r + i, v);
        }
    }
}

/* M > 1: two tile rows x four tokens per block (missing rows / tokens
 * alias the first: computed, never stored). x (M, ldx). */
QL_INLINE void ql_tile_mn(const ql_job *j, const float *t, int64_t nr, const float *x,
                          int64_t ldx, const float *xs, int64_t col, const float *bias) {
    const int64_t K = j->K, K16 = K & ~(int64_t)15, M = j->M;
    for (int64_t r = 0; r < nr; r += 2) {
        int rr = r + 1 < nr ? 2 : 1;
        const float *w0 = t + r * K, *w1 = rr == 2 ? w0 + K : w0;
        for (int64_t m = 0; m < M; m += 4) {
            int mr = M - m < 4 ? (int)(M - m) : 4;
            const float *x0 = x + m * ldx;
            const float *x1 = mr > 1 ? x0 + ldx : x0, *x2 = mr > 2 ? x0 + 2 * ldx : x0;
            const float *x3 = mr > 3 ? x0 + 3 * ldx : x0;
            ql_v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};
            ql_v16 a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
            for (int64_t k = 0; k < K16; k += 16) {
                ql_v16 v0, v1, b0, b1, b2, b3;
                QL_LD(v0, w0 + k), QL_LD(v1, w1 + k);
                QL_LD(b0, x0 + k), QL_LD(b1, x1 + k), QL_LD(b2, x2 + k), QL_LD(b3, x3 + k);
                a00 += v0 * b0, a01 += v0 * b1, a02 += v0 * b2, a03 += v0 * b3;
                a10 += v1 * b0, a11 += v1 * b1, a12 += v1 * b2, a13 += v1 * b3;
            }
            float s[2][4] = {{ql_hsum(&a00), ql_hsum(&a01), ql_hsum(&a02), ql_hsum(&a03)},
                             {ql_hsum(&a10), ql_hsum(&a11), ql_hsum(&a12), ql_hsum(&a13)}};
            for (int64_t k = K16; k < K; k++) {
                s[0][0] += w0[k] * x0[k], s[0][1] += w0[k] * x1[k];
                s[0][2] += w0[k] * x2[k], s[0][3] += w0[k] * x3[k];
                s[1][0] += w1[k] * x0[k], s[1][1] += w1[k] * x1[k];
                s[1][2] += w1[k] * x2[k], s[1][3] += w1[k] * x3[k];
            }
            for (int a = 0; a < rr; a++)
                for (int c = 0; c < mr; c++) {
                    float v = xs ? s[a][c] * xs[m + c] : s[a][c];
                    if (bias) v += bias[r + a];
                    ql_store(j, m + c, col + r + a, v);
                }
        }
    }
}

/* W8A8: rows [n0, n1) of w, int8 x int8 -> int32, four tokens at a time. */
QL_INLINE void ql_int8_rows(const ql_job *j, const loom_cpu_qweight *w, int64_t n0, int64_t n1,
                            int64_t col, const float *bias) {
    const int64_t K = j->K, M = j->M;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *wq = (const int8_t *)(w->data + (size_t)n * w->row_stride);
        const float sw = w->scales[n];
        for (int64_t m = 0; m < M; m += 4) {
            int mr = M - m < 4 ? (int)(M - m) : 4;
            const int8_t *x0 = j->xq + m * K;
            const int8_t *x1 = mr > 1 ? x0 + K : x0, *x2 = mr > 2 ? x0 + 2 * K : x0;
            const int8_t *x3 = mr > 3 ? x0 + 3 * K : x0;
            int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t k = 0; k < K; k++) {
                int32_t wk = wq[k];
                s0 += wk * x0[k], s1 += wk * x1[k], s2 += wk * x2[k], s3 += wk * x3[k];
            }
            int32_t s[4] = {s0, s1, s2, s3};
            for (int c = 0; c < mr; c++) {
                float v = (float)s[c] * (j->sxq[m + c] * sw);
                if (bias) v += bias[n - n0];
                ql_store(j, m + c, col + n - n0, v);
            }
        }
    }
}

/* GGUF: rows [n0, n1) of w dotted with the q8 activations (q8dot.h), for
 * the instruction sets without tiles (ql_q8_tiles below).
 * Batch 1 through the one-, two- and four-row kernels; more tokens through
 * the group kernel (every such type on x86): the rows go in panels of ~12 KiB
 * (in L1), and every group of 8 tokens passes over a panel before the
 * next, so each weight row is read from L2 or memory once a call and
 * unpacked once a group. Without one (the portable set): up to
 * LOOM_CPU_Q8_MR tokens a call, tokens in tiles of QL_Q8_TILE_M (their
 * codes ~10 KiB at K 576, in L1) with the rows inside. */
#define QL_Q8_TILE_M 16
#define QL_Q8_PANEL_BYTES 12288
#define QL_Q8_PANEL_MAX 64

/* `rows` rows' bytes toward the cache while the current ones are dotted:
 * the hardware prefetcher alone leaves a one-core GEMV's loads and compute
 * unoverlapped (docs/performance.md, the CPU section). `locality` is
 * __builtin_prefetch's (3: prefetcht0, 1: prefetcht2). */
#define ql_prefetch_rows(row, stride, rows, bytes, locality)                                       \
    do {                                                                                           \
        for (int r_ = 0; r_ < (rows); r_++)                                                        \
            for (size_t o_ = 0; o_ < (bytes); o_ += 64)                                            \
                __builtin_prefetch((row) + (size_t)r_ * (stride) + o_, 0, locality);               \
    } while (0)

/* Batch 1 prefetches the rows about this many bytes ahead of the ones being
 * dotted, with prefetcht2: nearer with prefetcht0 the prefetches themselves
 * stall on miss buffers, farther they are evicted before use (measured in
 * docs/performance.md, the CPU section; bench/cpu_smollm2_chain.c). */
#define QL_PF_AHEAD_BYTES 6144

/* The 16-row tiles (q8dot.h; every block type on AVX-512 VNNI), at
 * every M: each tile of rows repacked once, then dotted with the tokens
 * QL_Q8T_TOKENS at a time. A thread's scratch: the tile, then the results
 * of one pass of tokens. */
#define QL_Q8T_TOKENS 64
static size_t ql_q8t_tile_bytes(int64_t K) {
    return (loom_cpu_q8tile_bytes(K) + QL_ALIGN - 1) / QL_ALIGN * QL_ALIGN;
}
static size_t ql_q8t_bytes(int64_t K) {
    return ql_q8t_tile_bytes(K) + sizeof(float) * LOOM_CPU_Q8_TILE * QL_Q8T_TOKENS;
}

QL_INLINE void ql_q8_tiles(const ql_job *j, const loom_cpu_qweight *w, const loom_cpu_q8tile_kernel *tk,
                           int64_t n0, int64_t n1, int64_t col, const float *bias, int worker) {
    uint8_t *tile = j->q8t + (size_t)worker * j->q8t_bytes;
    float *o = (float *)(tile + ql_q8t_tile_bytes(j->K));
    const size_t rs = w->row_stride;
    for (int64_t n = n0; n < n1; n += LOOM_CPU_Q8_TILE) {
        const int nr = n1 - n < LOOM_CPU_Q8_TILE ? (int)(n1 - n) : LOOM_CPU_Q8_TILE;
        /* the next tile's rows are prefetched when it is a whole one */
        const int64_t nx = n + LOOM_CPU_Q8_TILE;
        const uint8_t *next = nx + LOOM_CPU_Q8_TILE <= n1 ? w->data + (size_t)nx * rs : NULL;
        tk->pack(w->data + (size_t)n * rs, rs, nr, j->K, next, tile);
        for (int64_t m = 0; m < j->M; m += QL_Q8T_TOKENS) {
            const int64_t mr = j->M - m < QL_Q8T_TOKENS ? j->M - m : QL_Q8T_TOKENS;
            tk->dot(tile, j->K, j->x8 + m, mr, o);
            for (int64_t t = 0; t < mr; t++)
                for (int r = 0; r < nr; r++) {
                    const float v = o[LOOM_CPU_Q8_TILE * t + r];
                    ql_store(j, m + t, col + n + r - n0, bias ? v + bias[n + r - n0] : v);
                }
        }
    }
}

QL_INLINE void ql_q8_rows(const ql_job *j, const loom_cpu_qweight *w, int64_t n0, int64_t n1,
                          int64_t col, const float *bias) {
    loom_cpu_q8dot_fn *dot = loom_cpu_q8dot(w->dtype);
    if (j->M == 1) { /* decode: rows in fours, then a pair, then one */
        loom_cpu_q8dot4_fn *dot4 = loom_cpu_q8dot4(w->dtype);
        loom_cpu_q8dot2_fn *dot2 = loom_cpu_q8dot2(w->dtype);
        const size_t rs = w->row_stride;
        /* rows ahead: a multiple of 4, at least one call */
        const int64_t ahead = ((int64_t)(QL_PF_AHEAD_BYTES / (rs ? rs : 1)) + 3) & ~(int64_t)3;
        const int64_t pa = ahead < 4 ? 4 : ahead;
        int64_t n = n0;
        for (; n + 3 < n1; n += 4) {
            float o[4];
            const uint8_t *row = w->data + (size_t)n * rs;
            if (n + pa + 3 < w->n) ql_prefetch_rows(row + (size_t)pa * rs, rs, 4, w->row_bytes, 1);
            dot4(row, rs, j->K, j->x8, o);
            for (int c = 0; c < 4; c++)
                ql_store(j, 0, col + n + c - n0, bias ? o[c] + bias[n + c - n0] : o[c]);
        }
        for (; n + 1 < n1; n += 2) {
            float o[2];
            const uint8_t *row = w->data + (size_t)n * rs;
            dot2(row, row + rs, j->K, j->x8, o);
            for (int c = 0; c < 2; c++)
                ql_store(j, 0, col + n + c - n0, bias ? o[c] + bias[n + c - n0] : o[c]);
        }
        if (n < n1) {
            float o[1];
            dot(w->data + (size_t)n * rs, j->K, j->x8, 1, o);
            ql_store(j, 0, col + n - n0, bias ? o[0] + bias[n - n0] : o[0]);
        }
        return;
    }
    loom_cpu_q8gemm_fn *gemm = j->x8g ? loom_cpu_q8gemm(w->dtype) : NULL;
    if (gemm) {
        const size_t rs = w->row_stride;
        int64_t pr = QL_Q8_PANEL_BYTES / (int64_t)(w->row_bytes ? w->row_bytes : 1);
        pr = pr < 4 ? 4 : pr > QL_Q8_PANEL_MAX ? QL_Q8_PANEL_MAX : pr;
        float o[QL_Q8_PANEL_MAX * LOOM_CPU_Q8_G];
        for (int64_t n = n0; n < n1; n += pr) {
            const int64_t nr = n1 - n < pr ? n1 - n : pr;
            for (int64_t m = 0; m < j->M; m += LOOM_CPU_Q8_G) {
                const int mr = j->M - m < LOOM_CPU_Q8_G ? (int)(j->M - m) : LOOM_CPU_Q8_G;
                gemm(w->data + (size_t)n * rs, rs, nr, j->K, &j->x8g[m / LOOM_CPU_Q8_G], mr, o,
                     LOOM_CPU_Q8_G);
                for (int64_t r = 0; r < nr; r++) {
                    const float b = bias ? bias[n + r - n0] : 0.0f;
                    for (int c = 0; c < mr; c++) {
                        const float v = o[r * LOOM_CPU_Q8_G + c];
                        ql_store(j, m + c, col + n + r - n0, bias ? v + b : v);
                    }
                }
            }
        }
        return;
    }
    for (int64_t m0 = 0; m0 < j->M; m0 += QL_Q8_TILE_M) {
        const int64_t m1 = j->M - m0 < QL_Q8_TILE_M ? j->M : m0 + QL_Q8_TILE_M;
        for (int64_t n = n0; n < n1; n++) {
            const uint8_t *row = w->data + (size_t)n * w->row_stride;
            for (int64_t m = m0; m < m1; m += LOOM_CPU_Q8_MR) {
                const int mr = m1 - m < LOOM_CPU_Q8_MR ? (int)(m1 - m) : LOOM_CPU_Q8_MR;
                float o[LOOM_CPU_Q8_MR];
                dot(row, j->K, j->x8 + m, mr, o);
                for (int c = 0; c < mr; c++)
                    ql_store(j, m + c, col + n - n0, bias ? o[c] + bias[n - n0] : o[c]);
            }
        }
    }
}

/* 16-bit float weights below the sgemm panels (M < LOOM_CPU_QLINEAR_PANEL_M):
 * each row through the instruction-set kernel of q8dot.h (F16C for f16;
 * GCC's vector conversion of _Float16 is scalarised), 4 tokens a call while
 * the row sits in L1, the next row prefetched meanwhile. A token's result
 * is the same whichever group of 4 it is in. */
QL_INLINE void ql_h_rows(const ql_job *j, const loom_cpu_qweight *w, int64_t n0, int64_t n1,
                         int64_t col, const float *bias) {
    loom_cpu_hdot_fn *dot = loom_cpu_hdot(w->dtype);
    const size_t rs = w->row_stride;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->data + (size_t)n * rs;
        if (n + 1 < w->n) ql_prefetch_rows(row + rs, rs, 1, w->row_bytes, 3);
        for (int64_t m0 = 0; m0 < j->M; m0 += LOOM_CPU_Q8_MR) {
            const int mr = j->M - m0 < LOOM_CPU_Q8_MR ? (int)(j->M - m0) : LOOM_CPU_Q8_MR;
            const float *xs[LOOM_CPU_Q8_MR];
            float o[LOOM_CPU_Q8_MR];
            for (int m = 0; m < mr; m++) xs[m] = j->x + (m0 + m) * j->ldx;
            dot(row, j->K, xs, mr, o);
            for (int m = 0; m < mr; m++)
                ql_store(j, m0 + m, col + n - n0, bias ? o[m] + bias[n - n0] : o[m]);
        }
    }
}

/* Small M (<= 4 tokens): rows [n0, n1) of w decoded 16 weights at a time
 * straight into registers and multiplied with all MR token rows (MR = 1 or
 * 4, a compile-time constant after inlining; missing tokens alias the
 * first, computed, never stored). x (M, ldx); xs per-token scales or NULL. */
QL_INLINE void ql_fused(const ql_job *j, const int kind, const int MR, const loom_cpu_qweight *w,
                        int64_t n0, int64_t n1, int64_t col, const float *bias, const float *x,
                        int64_t ldx, const float *xs) {
    const int64_t K = j->K, K16 = K & ~(int64_t)15, M = j->M;
    const int mr = (int)M;
    const float *x0 = x, *x1 = mr > 1 ? x + ldx : x, *x2 = mr > 2 ? x + 2 * ldx : x;
    const float *x3 = mr > 3 ? x + 3 * ldx : x;
    for (int64_t n = n0; n < n1; n++) {
        const ql_row q = ql_row_of(w, n);
        /* the next row streams in while this one is computed */
        __builtin_prefetch(q.p + w->row_stride);
        __builtin_prefetch(q.p + w->row_stride + 64);
        ql_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        const int64_t K32 = K & ~(int64_t)31;
        for (int64_t k = 0; k < K32; k += 32) {
            ql_v16 w0, w1, b, c;
            ql_dec32(kind, &q, k, &w0, &w1);
            QL_LD(b, x0 + k), QL_LD(c, x0 + k + 16);
            a0 += w0 * b + w1 * c;
            if (MR > 1) {
                QL_LD(b, x1 + k), QL_LD(c, x1 + k + 16);
                a1 += w0 * b + w1 * c;
                QL_LD(b, x2 + k), QL_LD(c, x2 + k + 16);
                a2 += w0 * b + w1 * c;
                QL_LD(b, x3 + k), QL_LD(c, x3 + k + 16);
                a3 += w0 * b + w1 * c;
            }
        }
        if (K16 > K32) {
            ql_v16 wv, b;
            ql_dec16(kind, &q, K32, &wv);
            QL_LD(b, x0 + K32);
            a0 += wv * b;
            if (MR > 1) {
                QL_LD(b, x1 + K32);
                a1 += wv * b;
                QL_LD(b, x2 + K32);
                a2 += wv * b;
                QL_LD(b, x3 + K32);
                a3 += wv * b;
            }
        }
        float s[4] = {ql_hsum(&a0), MR > 1 ? ql_hsum(&a1) : 0.0f, MR > 1 ? ql_hsum(&a2) : 0.0f,
                      MR > 1 ? ql_hsum(&a3) : 0.0f};
        for (int64_t k = K16; k < K; k++) {
            float wk = ql_dec1(kind, &q, k);
            s[0] += wk * x0[k];
            if (MR > 1) s[1] += wk * x1[k], s[2] += wk * x2[k], s[3] += wk * x3[k];
        }
        for (int c = 0; c < mr; c++) {
            float v = xs ? s[c] * xs[c] : s[c];
            if (bias) v += bias[n - n0];
            ql_store(j, c, col + n - n0, v);
        }
    }
}

/* Global output rows [b, e) (over all parts). */
QL_CLONES
static void ql_range(const ql_job *j, int64_t b, int64_t e, int worker) {
    float *tile = j->tiles + (size_t)worker * j->tile_floats;
    for (int p = 0; p < j->nparts; p++) {
        int64_t s = b > j->off[p] ? b : j->off[p], t = e < j->off[p + 1] ? e : j->off[p + 1];
        if (s >= t) continue;
        const loom_cpu_qweight *w = j->w[p];
        const int64_t n0 = s - j->off[p], n1 = t - j->off[p];
        const float *bias = j->bias[p];
        if (w->format == LOOM_QFMT_INT8_W8A8) {
            ql_int8_rows(j, w, n0, n1, s, bias ? bias + n0 : NULL);
            continue;
        }
        if (ql_is_q8(w)) {
            /* a row too wide for the tiles runs the row kernels: the same bits */
            const loom_cpu_q8tile_kernel *tk =
                j->q8t && w->row_stride < LOOM_CPU_Q8_TILE_MAX_STRIDE ? loom_cpu_q8tile(w->dtype) : NULL;
            if (tk) ql_q8_tiles(j, w, tk, n0, n1, s, bias ? bias + n0 : NULL, worker);
            else ql_q8_rows(j, w, n0, n1, s, bias ? bias + n0 : NULL);
            continue;
        }
        if (ql_is_16(w)) { /* M >= LOOM_CPU_QLINEAR_PANEL_M went to sgemm panels */
            ql_h_rows(j, w, n0, n1, s, bias ? bias + n0 : NULL);
            continue;
        }
        const bool fp8 = w->format == LOOM_QFMT_FP8_W8A8;
        const float *x = fp8 ? j->xf : j->x, *xs = fp8 ? j->sxf : NULL;
        const int64_t ldx = fp8 ? j->K : j->ldx;
        const float *bn = bias ? bias + n0 : NULL;
        const int kind = ql_kind(w);
        if (j->M <= QL_FUSED_M && kind != QK_NONE) {
#define QL_FUSED(K)                                                                    \
    case K:                                                                            \
        if (j->M == 1) ql_fused(j, K, 1, w, n0, n1, s, bn, x, ldx, xs);                 \
        else ql_fused(j, K, 4, w, n0, n1, s, bn, x, ldx, xs);                           \
        break;
            switch (kind) {
                QL_FUSED(QK_I8)
                QL_FUSED(QK_FP8)
                QL_FUSED(QK_I4)
                QL_FUSED(QK_F16)
                QL_FUSED(QK_BF16)
            }
#undef QL_FUSED
            continue;
        }
        for (int64_t r = n0; r < n1; r += j->tile_rows) {
            int64_t nr = n1 - r < j->tile_rows ? n1 - r : j->tile_rows;
            ql_decode(w, r, nr, tile);
            const float *br = bias ? bias + r : NULL;
            if (j->M == 1) ql_tile_m1(j, tile, nr, x, xs, j->off[p] + r, br);
            else ql_tile_mn(j, tile, nr, x, ldx, xs, j->off[p] + r, br);
        }
    }
}

static void ql_task(void *ctx, int64_t b, int64_t e, int worker) { ql_range(ctx, b, e, worker); }

/* Items are 16-row tiles: a thread's rows start on one. */
static void ql_task_tiles(void *ctx, int64_t b, int64_t e, int worker) {
    const ql_job *j = ctx;
    const int64_t N = j->off[j->nparts], r1 = e * LOOM_CPU_Q8_TILE;
    ql_range(ctx, b * LOOM_CPU_Q8_TILE, r1 < N ? r1 : N, worker);
}

/* ------------------------------------------------- activation quantizers */

/* W8A8 tokens [b, e): xq = rint(xs * (127 / amax)), sxq = amax / 127 where
 * xs = x (or x / smooth). */
static void ql_prep_int8(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    const ql_job *j = ctx;
    int8_t *xq = (int8_t *)j->xq;
    float *sx = (float *)j->sxq;
    const float *sm = j->smooth;
    for (int64_t m = b; m < e; m++) {
        const float *x = j->x + m * j->ldx;
        float amax = 0.0f;
        for (int64_t k = 0; k < j->K; k++) amax = fmaxf(amax, fabsf(sm ? x[k] / sm[k] : x[k]));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        sx[m] = amax / 127.0f;
        int8_t *q = xq + m * j->K;
        for (int64_t k = 0; k < j->K; k++) {
            float v = rintf((sm ? x[k] / sm[k] : x[k]) * inv);
            q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

/* GGUF tokens [b, e): q8 blocks of x (q8dot.h). */
static void ql_prep_q8(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    const ql_job *j = ctx;
    const size_t tb = loom_cpu_q8_bytes(j->K);
    for (int64_t m = b; m < e; m++)
        loom_cpu_q8_quantize(j->x + m * j->ldx, j->K, j->x8buf + (size_t)m * tb, &j->x8[m]);
}

/* GGUF groups [b, e) of 8 tokens: the q8 activations interleaved. */
static void ql_prep_q8g(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    const ql_job *j = ctx;
    const size_t gb = loom_cpu_q8g_bytes(j->K);
    for (int64_t g = b; g < e; g++) {
        const int64_t m = g * LOOM_CPU_Q8_G;
        const int mr = j->M - m < LOOM_CPU_Q8_G ? (int)(j->M - m) : LOOM_CPU_Q8_G;
        loom_cpu_q8g_pack(&j->x8[m], mr, j->K, j->x8gbuf + (size_t)g * gb, &j->x8g[g]);
    }
}

/* FP8 tokens [b, e): xf = decode(e4m3(xs / sx)), sxf = amax / 448 where
 * xs = x (or x / smooth). */
static void ql_prep_fp8(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    const ql_job *j = ctx;
    float *xf = (float *)j->xf, *sx = (float *)j->sxf;
    const float *sm = j->smooth;
    for (int64_t m = b; m < e; m++) {
        const float *x = j->x + m * j->ldx;
        float amax = 0.0f;
        for (int64_t k = 0; k < j->K; k++) amax = fmaxf(amax, fabsf(sm ? x[k] / sm[k] : x[k]));
        float s = amax / 448.0f;
        sx[m] = s;
        float *o = xf + m * j->K;
        for (int64_t k = 0; k < j->K; k++)
            o[k] = s > 0.0f ? ql_e4m3_lut[loom_fp32_to_e4m3((sm ? x[k] / sm[k] : x[k]) / s)]
                            : 0.0f;
    }
}

/* ------------------------------------------------------------ entry */

/* Large M, float activations: rows [b, e) of the panel's weight decoded
 * into the panel. */
typedef struct ql_panel_job {
    const loom_cpu_qweight *w;
    int64_t r0;                /* first weight row of the panel                 */
    float *panel;              /* (rows, K)                                     */
} ql_panel_job;

QL_CLONES
static void ql_panel_rows(const ql_panel_job *pj, int64_t b, int64_t e) {
    ql_decode(pj->w, pj->r0 + b, e - b, pj->panel + b * pj->w->k);
}

static void ql_panel_task(void *ctx, int64_t b, int64_t e, int worker) {
    (void)worker;
    ql_panel_rows(ctx, b, e);
}

/* Large M with float activations (W8A16, INT4, GGUF): the product is
 * compute-bound, so panels of QL_PANEL_ROWS weight rows are decoded (in
 * parallel) into a float32 scratch panel and multiplied by OpenBLAS's sgemm
 * (loom_cpu_linear). Only one panel exists at a time; the decode costs
 * 1 / M of the multiply. */
static bool ql_panels(float *y, int64_t ldy, const float *x, int64_t ldx,
                      const loom_cpu_qweight *w, const float *bias, int64_t M, float beta,
                      loom_cpu_qscratch *s, loom_cpu_pool *pool) {
    const int64_t K = w->k;
    if (!ql_grow((void **)&s->panel, &s->panel_cap, (size_t)(QL_PANEL_ROWS * K), sizeof(float)))
        return false;
    for (int64_t r0 = 0; r0 < w->n; r0 += QL_PANEL_ROWS) {
        int64_t nr = w->n - r0 < QL_PANEL_ROWS ? w->n - r0 : QL_PANEL_ROWS;
        ql_panel_job pj = {.w = w, .r0 = r0, .panel = s->panel};
        loom_cpu_pool_for(pool, nr, 8, ql_panel_task, &pj);
        loom_cpu_linear(y + r0, ldy, x, ldx, s->panel, bias ? bias + r0 : NULL, M, nr, K, beta,
                        pool);
    }
    return true;
}

bool loom_cpu_qlinear_multi(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const loom_cpu_qweight *const *w, const float *const *bias,
                            int nparts, int64_t M, float beta, loom_cpu_qscratch *s,
                            loom_cpu_pool *pool) {
    if (M <= 0 || nparts <= 0) return true;
    if (nparts > LOOM_CPU_QLINEAR_MAX_PARTS) return false;
    pthread_once(&ql_lut_once, ql_lut_init);
    /* large M: the parts left for the fused job (w and bias may point here) */
    const loom_cpu_qweight *rest[LOOM_CPU_QLINEAR_MAX_PARTS];
    const float *rbias[LOOM_CPU_QLINEAR_MAX_PARTS];
    if (M >= LOOM_CPU_QLINEAR_PANEL_M) {
        /* float-activation parts through sgemm panels, the rest below */
        int64_t off = 0, roff[LOOM_CPU_QLINEAR_MAX_PARTS];
        int nrest = 0;
        bool contiguous = true; /* the rest occupy adjacent columns */
        for (int p = 0; p < nparts; p++) {
            const float *bp = bias ? bias[p] : NULL;
            if (w[p]->format == LOOM_QFMT_INT8_W8A8 || w[p]->format == LOOM_QFMT_FP8_W8A8 ||
                ql_is_q8(w[p])) {
                contiguous &= nrest == 0 || off == roff[nrest - 1] + rest[nrest - 1]->n;
                roff[nrest] = off;
                rbias[nrest] = bp;
                rest[nrest++] = w[p];
            } else if (!ql_panels(y + off, ldy, x, ldx, w[p], bp, M, beta, s, pool)) {
                return false;
            }
            off += w[p]->n;
        }
        if (nrest == 0) return true;
        if (nrest < nparts) {
            if (!contiguous) {
                for (int p = 0; p < nrest; p++)
                    if (!loom_cpu_qlinear_multi(y + roff[p], ldy, x, ldx, &rest[p],
                                                bias ? &rbias[p] : NULL, 1, M, beta, s, pool))
                        return false;
                return true;
            }
            y += roff[0];
            w = rest;
            bias = bias ? rbias : NULL;
            nparts = nrest;
        }
    }
    /* parts that quantize x (INT8 / FP8 W8A8) with different smoothing
     * vectors quantize it differently: run them one call each */
    const float *smooth = NULL;
    bool any_w8a8 = false, any_fp8 = false, any_act = false, any_gguf = false, any_g = false;
    bool any_t = false; /* a part on the 16-row tiles */
    for (int p = 0; p < nparts; p++) {
        const bool act = w[p]->format == LOOM_QFMT_INT8_W8A8 || w[p]->format == LOOM_QFMT_FP8_W8A8;
        if (act) {
            if (any_act && w[p]->smooth != smooth) {
                int64_t off = 0;
                for (int q = 0; q < nparts; q++) {
                    if (!loom_cpu_qlinear(y + off, ldy, x, ldx, w[q], bias ? bias[q] : NULL, M,
                                          beta, s, pool))
                        return false;
                    off += w[q]->n;
                }
                return true;
            }
            any_act = true;
            smooth = w[p]->smooth;
        }
        any_w8a8 |= w[p]->format == LOOM_QFMT_INT8_W8A8;
        any_fp8 |= w[p]->format == LOOM_QFMT_FP8_W8A8;
        any_gguf |= ql_is_q8(w[p]);
        const bool tiles = ql_is_q8(w[p]) && loom_cpu_q8tile(w[p]->dtype);
        any_t |= tiles;
        any_g |= M > 1 && ql_is_q8(w[p]) && !tiles && loom_cpu_q8gemm(w[p]->dtype);
    }

    ql_job j = {.y = y, .ldy = ldy, .x = x, .ldx = ldx, .smooth = smooth, .M = M, .K = w[0]->k,
                .beta = beta, .nparts = nparts};
    j.off[0] = 0;
    for (int p = 0; p < nparts; p++) {
        j.w[p] = w[p];
        j.bias[p] = bias ? bias[p] : NULL;
        j.off[p + 1] = j.off[p] + w[p]->n;
    }
    const int64_t K = j.K, N = j.off[nparts];
    int64_t R = QL_TILE_FLOATS / (K > 0 ? K : 1);
    R = R < 2 ? 2 : R > 32 ? 32 : R & ~(int64_t)1;
    j.tile_rows = R;
    j.tile_floats = (size_t)(R * K + 16) & ~(size_t)15;
    size_t threads = (size_t)loom_cpu_pool_size(pool);
    if (!ql_grow((void **)&s->tiles, &s->tiles_cap, j.tile_floats * threads, sizeof(float)) ||
        !ql_grow((void **)&s->sx, &s->sx_cap, 2 * (size_t)M, sizeof(float)) ||
        (any_w8a8 && !ql_grow((void **)&s->xq, &s->xq_cap, (size_t)(M * K), 1)) ||
        (any_fp8 && !ql_grow((void **)&s->xf, &s->xf_cap, (size_t)(M * K), sizeof(float))) ||
        (any_gguf && !ql_grow((void **)&s->x8, &s->x8_cap, (size_t)M * loom_cpu_q8_bytes(K), 1)) ||
        (any_gguf && !ql_grow((void **)&s->x8v, &s->x8v_cap, (size_t)M, sizeof(loom_cpu_q8))) ||
        (any_t && !ql_grow((void **)&s->q8t, &s->q8t_cap, ql_q8t_bytes(K) * threads, 1)))
        return false;
    const int64_t groups = (M + LOOM_CPU_Q8_G - 1) / LOOM_CPU_Q8_G;
    if (any_g && (!ql_grow((void **)&s->x8g, &s->x8g_cap, (size_t)groups * loom_cpu_q8g_bytes(K), 1) ||
                  !ql_grow((void **)&s->x8gv, &s->x8gv_cap, (size_t)groups, sizeof(loom_cpu_q8g))))
        return false;
    j.tiles = s->tiles;
    j.sxq = s->sx;
    j.sxf = s->sx + M;
    if (any_w8a8) {
        j.xq = s->xq;
        loom_cpu_pool_for(pool, M, 4, ql_prep_int8, &j);
    }
    if (any_fp8) {
        j.xf = s->xf;
        loom_cpu_pool_for(pool, M, 4, ql_prep_fp8, &j);
    }
    if (any_gguf) {
        j.x8buf = s->x8;
        j.x8 = s->x8v;
        loom_cpu_pool_for(pool, M, 4, ql_prep_q8, &j);
    }
    if (any_g) {
        j.x8gbuf = s->x8g;
        j.x8g = s->x8gv;
        loom_cpu_pool_for(pool, groups, 1, ql_prep_q8g, &j);
    }
    if (any_t) {
        j.q8t = s->q8t;
        j.q8t_bytes = ql_q8t_bytes(K);
        const int64_t tiles = (N + LOOM_CPU_Q8_TILE - 1) / LOOM_CPU_Q8_TILE;
        loom_cpu_pool_for(pool, tiles, (R + LOOM_CPU_Q8_TILE - 1) / LOOM_CPU_Q8_TILE, ql_task_tiles, &j);
    } else {
        loom_cpu_pool_for(pool, N, R, ql_task, &j);
    }
    return true;
}

bool loom_cpu_qlinear(float *y, int64_t ldy, const float *x, int64_t ldx,
                      const loom_cpu_qweight *w, const float *bias, int64_t M, float beta,
                      loom_cpu_qscratch *s, loom_cpu_pool *pool) {
    const float *b[1] = {bias};
    return loom_cpu_qlinear_multi(y, ldy, x, ldx, &w, bias ? b : NULL, 1, M, beta, s, pool);
}
