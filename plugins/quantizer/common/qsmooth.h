/*
 * plugins/quantizer/common/qsmooth.h — SmoothQuant bookkeeping shared by the
 * quantizers whose activations are quantized (int8 w8a8, fp8): the
 * `smoothquant` / `calibration` configuration checks, the statistics file
 * (qcalib.h) kept open, and one smoothing vector per group of weights that
 * read the same input (Q K V; gate up; O; down), computed on the group's
 * first use and kept until qc_smoother_free, so every member's qtensor
 * points at the same vector (the kernels fuse only parts that share one).
 *
 * The arithmetic is qcalib.h's qc_smooth_factors / qc_smooth_apply; this file
 * adds what needs the host (reading weights, allocating, errors). Messages
 * are prefixed with the plugin's `who` ("quantizer int8").
 *
 * Compiled into each plugin that uses it together with qcommon.c and
 * qcalib.c; not an installed header.
 */
#ifndef LOOM_QUANT_QSMOOTH_H
#define LOOM_QUANT_QSMOOTH_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/quant.h"
#include "loom/tensor.h"
#include "qcalib.h"

/* One smoothing vector: the factors of the input that the weights of a
 * group read, keyed by the group's first weight name. */
typedef struct qc_smooth_vec {
    char key[QC_CALIB_NAME_MAX];       /* e.g. "blk.3.attn_q.weight"            */
    int64_t cols;
    float *s;                          /* (cols) host->alloc'd                   */
} qc_smooth_vec;

typedef struct qc_smoother {
    const loom_host *host;             /* borrowed; NULL until opened           */
    const char *who;                   /* message prefix, static storage        */
    double alpha;                      /* migration strength; 0 = off           */
    char path[4096];                   /* the calibration path, expanded        */
    qc_calib calib;                    /* loaded when alpha > 0                 */
    qc_smooth_vec *v;                  /* (n) computed on first use             */
    int32_t n, cap;
} qc_smoother;

/* The two parameters' table entries (loom_param) for a plugin whose config
 * struct `cfg_t` has `double smoothquant` and `char calibration[...]`;
 * `when` narrows the alpha's doc ("" or " for w8a8"). One definition, so
 * both plugins document them alike. */
#define QC_SMOOTH_PARAM_ALPHA(cfg_t, when)                                                         \
    {.key = "smoothquant", .type = LOOM_PARAM_FLOAT, .offset = offsetof(cfg_t, smoothquant),       \
     .default_value = "0", .min = 0, .max = 1,                                                     \
     .doc = "SmoothQuant migration strength alpha" when " (0.5 typical); 0 = off; > 0 needs "      \
            "`calibration`"}
#define QC_SMOOTH_PARAM_CALIBRATION(cfg_t)                                                         \
    {.key = "calibration", .type = LOOM_PARAM_STRING, .offset = offsetof(cfg_t, calibration),      \
     .default_value = "",                                                                          \
     .doc = "SmoothQuant activation statistics from `loom calibrate CONFIG TEXT --out FILE` "      \
            "(~ and ${VAR:-default} expanded; relative to the working directory)"}

/* The configuration checks of create(): alpha in [0, 1] (NaN refused), and a
 * calibration file named when alpha > 0 (the message says how to make one).
 * A plugin refuses its own incompatible modes before calling this. */
loom_status qc_smooth_check(const loom_host *h, const char *who, double alpha,
                            const char *calibration, loom_error *err);

/* Make *sm ready (emptied first): when alpha > 0, expands `calibration`
 * (~, ${VAR:-default}) and reads the file (errors name it and the record at
 * fault). alpha 0 ignores the file. qc_smooth_check must have passed. */
loom_status qc_smoother_open(qc_smoother *sm, const loom_host *h, const char *who, double alpha,
                             const char *calibration, loom_error *err);

/* Is smoothing on (alpha > 0)? */
static inline bool qc_smoother_on(const qc_smoother *sm) { return sm->alpha > 0.0; }

/* The smoothing factors for weight w (cols = w->shape[1]) into *s: the
 * vector of w's group, computed on the group's first use from the file's
 * record for w and the column maxima over every member the model has (read
 * through model->get), kept until qc_smoother_free. Errors: the file has no
 * record for w, or records another width (the file and both widths named). */
loom_status qc_smoother_for(qc_smoother *sm, const loom_model_view *model, const loom_tensor *w,
                            const float **s, loom_error *err);

/* w (rows, cols) *= diag(s) in place, and out->smooth = s (an F32 (cols)
 * host view, not owned by out: the smoother frees it). */
void qc_smooth_attach(float *w, int64_t rows, int64_t cols, const float *s, loom_qtensor *out);

/* The quantize() step of the 8-bit quantizers (int8, fp8): w read as f32,
 * W diag(s) when `s` is not NULL (out->smooth then points at s), then one
 * code a weight: int8 with per-channel scales for LOOM_QFMT_INT8_W8A16 /
 * _W8A8, E4M3 with per-channel or (per_channel false) one per-tensor scale
 * for LOOM_QFMT_FP8_W8A8; metrics quant.int8.* / quant.fp8.* (tensors,
 * bytes). */
loom_status qc_quantize_8bit(const loom_host *h, const char *who, const loom_tensor *w,
                             const float *s, loom_qformat format, bool per_channel,
                             loom_qtensor *out, loom_error *err);

/* Free every vector and the statistics; NULL-safe, leaves *sm empty. */
void qc_smoother_free(qc_smoother *sm);

/* The weights that read the same input as `name` ("blk.N.attn_k.weight" ->
 * its layer's attn_q, attn_k, attn_v; gate -> gate, up), written to
 * out[4][QC_CALIB_NAME_MAX], the group's key first; a weight outside those
 * groups is alone. Returns how many. */
int qc_smooth_group(const char *name, char out[4][QC_CALIB_NAME_MAX]);

#endif
