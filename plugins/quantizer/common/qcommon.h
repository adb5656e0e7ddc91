/*
 * plugins/quantizer/common/qcommon.h — what the three quantizer plugins
 * (int8, fp8, int4) share: which tensors a rule set keeps, reading a weight
 * as float32 through the host, the quantized-tensor allocation that
 * release() frees and the per-scheme quantize/dequantize arithmetic.
 *
 * Compiled into each plugin .so (no shared library between plugins); sees
 * the public SDK and, like the in-tree kernels, formats/ (the E4M3 codec
 * every backend reads). Functions that can fail return loom_status and
 * fill a caller-owned loom_error through host->error, naming the tensor.
 * Not an installed header.
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

#include "formats/e4m3.h"

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

/* create()'s check of the `skip` parameter: LOOM_OK, or LOOM_ERR_INVALID
 * naming the malformed pattern (with an example of good ones). */
loom_status qc_skip_check(const loom_host *h, const char *who, const char *skip, loom_error *err);

/* The `skip` parameter's table entry (loom_param) for a config struct
 * `cfg_t` with `char skip[LOOM_PARAM_STRING_MAX]`: one definition, so every
 * quantizer documents it alike. */
#define QC_SKIP_PARAM(cfg_t)                                                                       \
    {.key = "skip", .type = LOOM_PARAM_STRING, .offset = offsetof(cfg_t, skip),                    \
     .default_value = "token_embd,output",                                                         \
     .doc = "comma-separated tensor-name patterns kept unquantized (dot components, e.g. "         \
            "'output', 'blk.0', 'ffn_down', or globs 'blk.*.attn_v.weight')"}

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

/* OCP E4M3 ("fn"): formats/e4m3.h (loom_fp32_to_e4m3, loom_e4m3_to_fp32),
 * the codec every backend reads; largest finite value: */
#define QC_FP8_MAX 448.0f

#endif
