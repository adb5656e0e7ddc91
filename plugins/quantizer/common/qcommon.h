/*
 * plugins/quantizer/common/qcommon.h — what the three quantizer plugins
 * (int8, fp8, int4) share: which tensors a rule set keeps, reading a weight
 * as float32 through the host, the quantized-tensor allocation that
 * release() frees, the per-scheme quantize/dequantize arithmetic, and the
 * FP8 E4M3 codec.
 *
 * Compiled into each plugin .so (no shared library between plugins); sees
 * only the public SDK. Functions that can fail return loom_status and fill
 * a caller-owned loom_error through host->error, naming the tensor.
 *
 * Not an installed header; the kernels in kernels/cpu carry their own copy
 * of the E4M3 codec (plugins never include kernel headers), and
 * tests/quant checks both against the same float64 reference.
 */
#ifndef LOOM_QUANT_COMMON_H
#define LOOM_QUANT_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/quant.h"
#include "loom/tensor.h"

/* ------------------------------------------------------------ rules */

/* Does `name` match one of the comma-separated patterns in `list`?
 * A pattern with '*' or '?' is a glob over the whole name (fnmatch, '*'
 * crosses dots); a plain pattern matches a run of whole dot-separated
 * components: "output" matches "output.weight" but not
 * "blk.3.attn_output.weight"; "blk.0" matches every tensor of layer 0;
 * "ffn_down" matches every layer's down projection. Spaces around commas
 * are ignored; an empty list matches nothing. NULL name matches nothing. */
bool qc_name_matches(const char *name, const char *list);

/* Is `w` a candidate for quantization: a 2-D host tensor whose name ends in
 * ".weight"? (Norms are 1-D; biases are not ".weight".) */
bool qc_is_linear(const loom_tensor *w);

/* Is any pattern of `list` malformed (empty component, stray '.', ...)?
 * On a bad one, copies it to bad[size] and returns false. */
bool qc_patterns_valid(const char *list, char *bad, size_t size);

/* Does every pattern of `list` match some tensor of the model `m`? One that
 * matches none is almost always a typo ("ffn_dwn", "blk.29" on a 24-layer
 * model) that would silently quantize what it meant to keep, or keep what
 * it meant to quantize. The default skip's "token_embd" and "output" are
 * exempt: a model with tied embeddings has no LM head of its own, and a
 * partial view (a test's, a shard's) may hold neither. A view without
 * count/at is not checked. On the first unmatched pattern,
 * copies it to bad[size] and returns false. */
bool qc_patterns_match_model(const loom_model_view *m, const char *list, char *bad, size_t size);

/* Check `list` (parameter `param`, e.g. "skip") against m as above; LOOM_OK,
 * or an error naming the pattern, the parameter and what the model's linear
 * weights are called. */
loom_status qc_check_patterns(const loom_host *h, const char *who, const char *param, const char *list,
                              const loom_model_view *m, loom_error *err);

/* qc_check_patterns of `skip` and (when not NULL) `weight_only` against m,
 * once per model: *checked remembers the model view (its ctx) already
 * checked; plan() runs per tensor and tensor-parallel ranks may plan at once
 * (atomics). LOOM_OK without a model view. */
loom_status qc_check_patterns_once(const void **checked, const loom_host *h, const char *who,
                                   const loom_model_view *m, const char *skip, const char *weight_only,
                                   loom_error *err);

/* `name` with its trailing ".weight" replaced by `suffix` (e.g. ".qweight")
 * into out[size]; false when it does not fit or does not end in ".weight". */
bool qc_sibling_name(const char *name, const char *suffix, char *out, size_t size);

/* If the model stores `w` pre-quantized (AWQ/GPTQ: a sibling "<base>.qweight"
 * exists), returns that tensor, else NULL. */
const loom_tensor *qc_packed_sibling(const loom_model_view *m, const loom_tensor *w);

/* For int8 and fp8's plan(): false (and LOOM_OK) when w is kept in float
 * (not a linear weight, or matched by `skip`); true when it is a float
 * linear weight to quantize. A packed AWQ/GPTQ weight or a row that is not
 * whole blocks of its type is an error naming the tensor and the fix;
 * `scheme` ("int8", "fp8") says what quantizes it. */
bool qc_plan_float_linear(const loom_host *h, const char *who, const char *scheme, const loom_model_view *m,
                          const loom_tensor *w, const char *skip, loom_status *st, loom_error *err);

/* ------------------------------------------------------- float input */

/* The whole of 2-D `w` as float32 (rows, cols), allocated with host->alloc
 * into *out (caller frees with host->free). Rows are converted with
 * host->dequantize; `who` prefixes messages ("quantizer int8"). */
loom_status qc_read_f32(const loom_host *h, const char *who, const loom_tensor *w, float **out,
                        loom_error *err);

/* ---------------------------------------------------- qtensor storage */

/* Allocate one block for a quantized tensor: data of `data_bytes` (dtype
 * `data_dtype`, shape (rows, data_cols)), `nscales` f32 scales of shape
 * (scale_rows, scale_cols), and when `with_zeros` the same count of zeros.
 * Fills out (format, rows, cols, group_size, the three tensors, owner) and
 * zeroes the data. Freed by qc_release. */
loom_status qc_qtensor_alloc(const loom_host *h, const char *who, const char *name,
                             loom_qformat format, int64_t rows, int64_t cols, int32_t group_size,
                             loom_dtype data_dtype, int64_t data_cols, size_t data_bytes,
                             int64_t scale_rows, int64_t scale_cols, bool with_zeros,
                             loom_qtensor *out, loom_error *err);

/* Free what qc_qtensor_alloc made; NULL-safe, idempotent (empties *q). */
void qc_release(const loom_host *h, loom_qtensor *q);

/* -------------------------------------------------------- schemes */

/* Each scheme below runs its rows on the host's worker threads (h->num_threads).
 *
 * INT8 symmetric per output channel: for each row r of w (rows, cols),
 * scale[r] = max|w[r,:]| / 127 and q = round_half_even(w / scale) in
 * [-127, 127]; an all-zero row gets scale 0 and q 0. */
void qc_int8_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, int8_t *q, float *scales);

/* FP8 E4M3: per_channel: scale[r] = max|w[r,:]| / 448; else one scale for
 * the tensor (scales[0]). q = e4m3(w / scale). Zero rows: scale 0, q 0. */
void qc_fp8_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, bool per_channel, uint8_t *q,
                 float *scales);

/* INT4 asymmetric group-wise: for each row and group of `group` columns,
 * picks [lo, hi] among a few clipped copies of [min, max] minimising the
 * group's squared error (ratio 1 is a candidate, so the error never exceeds
 * plain min/max rounding), scale = (hi - lo) / 15, zero = -lo / scale (not
 * rounded: the F32 zeros keep lo and hi exact), q = clamp(round(w / scale
 * + zero), 0, 15). data (rows, cols/2): low nibble = even column.
 * cols % group == 0, group even and <= QC_INT4_MAX_GROUP (checked by the
 * caller). */
#define QC_INT4_MAX_GROUP 4096
void qc_int4_rows(const loom_host *h, const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *data,
                  float *scales, float *zeros);

/* The inverse of each scheme into float32 (rows, cols), for tests and the
 * int4 act-order fallback. */
void qc_int8_dequant(const int8_t *q, const float *scales, int64_t rows, int64_t cols, float *w);
void qc_fp8_dequant(const uint8_t *q, const float *scales, bool per_channel, int64_t rows,
                    int64_t cols, float *w);
void qc_int4_dequant(const uint8_t *data, const float *scales, const float *zeros, int64_t rows,
                     int64_t cols, int32_t group, float *w);

/* ----------------------------------------------------- FP8 E4M3 codec */

/* OCP E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 * infinities; S.1111.111 is NaN; largest finite 448, smallest subnormal
 * 2^-9. Encoding rounds to nearest, ties to even; |x| >= 448 (and +-inf)
 * saturates to +-448; NaN gives 0x7f with the sign of x; the sign of zero
 * is kept (-0 -> 0x80). */
#define QC_FP8_MAX 448.0f

static inline uint8_t qc_e4m3_encode(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN                    */
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 saturates      */
    int e = (int)(a >> 23) - 127;                          /* unbiased exponent     */
    if (e >= -6) {
        /* normal: keep 3 of 23 mantissa bits, round half to even; a carry
         * into the exponent field is the correct next binade */
        uint32_t m = a & 0x7fffffu, keep = m >> 20, rem = m & 0xfffffu;
        uint32_t code = ((uint32_t)(e + 7) << 3) | keep;
        if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) code++;
        return (uint8_t)(sign | code);
    }
    if ((a >> 23) == 0) return sign; /* float32 subnormal: far below 2^-10       */
    /* e4m3 subnormal: q = value * 2^9 = m24 * 2^(e + 9 - 23) */
    uint32_t m24 = (a & 0x7fffffu) | 0x800000u;
    int shift = 14 - e; /* >= 21 */
    if (shift > 24) return sign; /* value < 2^-10: rounds to 0                  */
    uint32_t q = m24 >> shift, rem = m24 & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q); /* q == 8 is code 0x08 = 2^-6, the first normal  */
}

static inline float qc_e4m3_decode(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t e = (c >> 3) & 15u, m = c & 7u, bits;
    if (e == 15u && m == 7u) {
        bits = sign | 0x7fc00000u; /* NaN */
    } else if (e == 0) {
        float v = (float)m * 0x1p-9f; /* subnormal */
        memcpy(&bits, &v, 4);
        bits |= sign;
    } else {
        bits = sign | ((e + 120u) << 23) | (m << 20); /* rebias 7 -> 127 */
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
