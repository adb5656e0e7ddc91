/*
 * plugins/quantizer/common/qcalib.h — activation statistics for SmoothQuant:
 * the calibration file `loom calibrate` writes and the quantizers read,
 * and the smoothing arithmetic (Xiao et al. 2023, "SmoothQuant").
 *
 * The file (".act", little-endian, no padding), keyed by canonical weight
 * names; each record is the per-input-channel maximum of |x| over every
 * calibration token of the input that weight multiplies:
 *
 *   offset  size  field
 *   0       8     magic "LOOMACT1"
 *   8       4     u32 version (1)
 *   12      4     u32 count: records that follow
 *   16      8     u64 tokens: calibration tokens the maxima were taken over
 *   24      ...   count records, each
 *                   u32 name_len (1..QC_CALIB_NAME_MAX-1)
 *                   name_len bytes: canonical name, e.g. "blk.3.attn_q.weight"
 *                   u32 cols: the weight's input width (> 0)
 *                   cols x f32: max |x[:, j]|, finite and >= 0
 *   end           nothing after the last record
 *
 * Weights that share an input (Q, K, V; gate, up) have one record each
 * holding the same vector, so a reader needs no knowledge of the model's
 * fusion. Names are unique. Reading checks every field and reports the file
 * and the record (index and name when known) at fault.
 *
 * Compiled into the int8 and fp8 quantizers (read, through qsmooth.h) and
 * the `loom` CLI (writes); depends on libc only, allocates with malloc.
 */
#ifndef LOOM_QUANT_QCALIB_H
#define LOOM_QUANT_QCALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QC_CALIB_MAGIC "LOOMACT1"
#define QC_CALIB_VERSION 1u
#define QC_CALIB_NAME_MAX 128   /* bytes of a name, NUL included              */
#define QC_CALIB_MAX_COLS (1 << 24)

typedef struct qc_calib_entry {
    char name[QC_CALIB_NAME_MAX]; /* canonical weight name                   */
    int64_t cols;                 /* input channels                          */
    float *amax;                  /* (cols) max |x| per channel; malloc'd     */
} qc_calib_entry;

typedef struct qc_calib {
    uint64_t tokens;              /* calibration tokens                      */
    int32_t count;                /* entries                                 */
    qc_calib_entry *e;            /* (count) malloc'd                         */
} qc_calib;

/* Read `path` into *out (emptied first). false with why[size] naming the
 * file and what is wrong (truncated, bad magic, a record's name or width,
 * a non-finite value, trailing bytes, a duplicate name). */
bool qc_calib_read(const char *path, qc_calib *out, char *why, size_t size);

/* Write c to `path` (created or truncated). false with why on I/O errors. */
bool qc_calib_write(const char *path, const qc_calib *c, char *why, size_t size);

/* The entry named `name`, or NULL. */
const qc_calib_entry *qc_calib_find(const qc_calib *c, const char *name);

/* Free every entry; NULL-safe, leaves *c empty. */
void qc_calib_free(qc_calib *c);

/* ------------------------------------------------------------ smoothing */

/* Smallest value a maximum or a factor is clamped to (as the reference
 * implementation's clamp(min=1e-5)), and the largest factor. */
#define QC_SMOOTH_MIN 1e-5f
#define QC_SMOOTH_MAX 1e5f

/* SmoothQuant factors for one input shared by n weights:
 *   s[j] = max(amax[j], MIN)^alpha / max(wmax[j], MIN)^(1 - alpha)
 * clamped to [QC_SMOOTH_MIN, QC_SMOOTH_MAX], where wmax[j] = max over the
 * rows of every weight w[i] (rows[i], cols) of |w[i][r, j]|; s[j] = 1 for a
 * channel whose activation and weights are all zero. alpha in (0, 1]. */
void qc_smooth_factors(const float *amax, const float *const *w, const int64_t *rows, int n,
                       int64_t cols, double alpha, float *s);

/* w (rows, cols) *= diag(s): column j scaled by s[j], in place. */
void qc_smooth_apply(float *w, int64_t rows, int64_t cols, const float *s);

/* Expand ${VAR}, ${VAR:-default} and a leading ~ in `in` into out[size]
 * (as the pipeline does for model.path). false with why. */
bool qc_expand_path(const char *in, char *out, size_t size, char *why, size_t whysize);

#endif
