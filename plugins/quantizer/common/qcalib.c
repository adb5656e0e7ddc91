/*
 * plugins/quantizer/common/qcalib.c — see qcalib.h: the SmoothQuant
 * calibration file (read, write) and the smoothing arithmetic.
 *
 * Fields are read and written byte by byte in little-endian order, so the
 * file means the same on every host; floats travel as their IEEE-754 bits.
 */
#include "qcalib.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ file */

static bool qcal_get(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static bool qcal_u32(FILE *f, uint32_t *v) {
    uint8_t b[4];
    if (!qcal_get(f, b, 4)) return false;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return true;
}

static bool qcal_u64(FILE *f, uint64_t *v) {
    uint32_t lo, hi;
    if (!qcal_u32(f, &lo) || !qcal_u32(f, &hi)) return false;
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

static bool qcal_put_u32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return fwrite(b, 1, 4, f) == 4;
}

void qc_calib_free(qc_calib *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->count; i++) free(c->e[i].amax);
    free(c->e);
    memset(c, 0, sizeof *c);
}

const qc_calib_entry *qc_calib_find(const qc_calib *c, const char *name) {
    if (!c || !name) return NULL;
    for (int32_t i = 0; i < c->count; i++)
        if (!strcmp(c->e[i].name, name)) return &c->e[i];
    return NULL;
}

bool qc_calib_read(const char *path, qc_calib *out, char *why, size_t size) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, size, "cannot open calibration file %s: %s", path, strerror(errno));
        return false;
    }
    char magic[8];
    uint32_t version = 0, count = 0;
    uint64_t tokens = 0;
    if (!qcal_get(f, magic, 8) || memcmp(magic, QC_CALIB_MAGIC, 8) != 0) {
        snprintf(why, size, "%s is not a loom calibration file (no \"%s\" magic); make one with "
                 "`loom calibrate CONFIG TEXTFILE --out %s`", path, QC_CALIB_MAGIC, path);
        goto fail;
    }
    if (!qcal_u32(f, &version) || !qcal_u32(f, &count) || !qcal_u64(f, &tokens)) {
        snprintf(why, size, "%s: truncated header (24 bytes expected)", path);
        goto fail;
    }
    if (version != QC_CALIB_VERSION) {
        snprintf(why, size, "%s: calibration file version %u, this build reads %u; recalibrate",
                 path, version, QC_CALIB_VERSION);
        goto fail;
    }
    if (count == 0 || count > (1u << 20)) {
        snprintf(why, size, "%s: %u records (expected 1..%u)", path, count, 1u << 20);
        goto fail;
    }
    out->tokens = tokens;
    out->e = calloc(count, sizeof *out->e);
    if (!out->e) {
        snprintf(why, size, "%s: out of memory for %u records", path, count);
        goto fail;
    }
    for (uint32_t i = 0; i < count; i++) {
        qc_calib_entry *e = &out->e[i];
        uint32_t nl = 0, cols = 0;
        if (!qcal_u32(f, &nl)) {
            snprintf(why, size, "%s: truncated at record %u of %u (its name length)", path, i, count);
            goto fail;
        }
        if (nl == 0 || nl >= QC_CALIB_NAME_MAX) {
            snprintf(why, size, "%s: record %u: name length %u (expected 1..%d)", path, i, nl,
                     QC_CALIB_NAME_MAX - 1);
            goto fail;
        }
        if (!qcal_get(f, e->name, nl)) {
            snprintf(why, size, "%s: truncated in record %u's name", path, i);
            goto fail;
        }
        e->name[nl] = 0;
        if (strlen(e->name) != nl) {
            snprintf(why, size, "%s: record %u: name contains a NUL byte", path, i);
            goto fail;
        }
        if (qc_calib_find(&(qc_calib){.count = (int32_t)i, .e = out->e}, e->name)) {
            snprintf(why, size, "%s: record %u: tensor '%s' appears twice", path, i, e->name);
            goto fail;
        }
        if (!qcal_u32(f, &cols)) {
            snprintf(why, size, "%s: truncated in record %u ('%s') before its width", path, i, e->name);
            goto fail;
        }
        if (cols == 0 || cols > QC_CALIB_MAX_COLS) {
            snprintf(why, size, "%s: record %u ('%s'): width %u (expected 1..%d)", path, i, e->name,
                     cols, QC_CALIB_MAX_COLS);
            goto fail;
        }
        e->cols = cols;
        if (!(e->amax = malloc((size_t)cols * sizeof(float)))) {
            snprintf(why, size, "%s: out of memory for '%s'", path, e->name);
            goto fail;
        }
        out->count = (int32_t)i + 1;
        for (uint32_t j = 0; j < cols; j++) {
            uint32_t bits;
            if (!qcal_u32(f, &bits)) {
                snprintf(why, size, "%s: truncated in record %u ('%s'): %u of %u values", path, i,
                         e->name, j, cols);
                goto fail;
            }
            float v;
            memcpy(&v, &bits, 4);
            if (!isfinite(v) || v < 0.0f) {
                snprintf(why, size, "%s: record %u ('%s'): channel %u has max |x| = %g (must be "
                         "finite and >= 0)", path, i, e->name, j, (double)v);
                goto fail;
            }
            e->amax[j] = v;
        }
    }
    if (fgetc(f) != EOF) {
        snprintf(why, size, "%s: bytes after the last of %u records (a corrupt or concatenated "
                 "file)", path, count);
        goto fail;
    }
    fclose(f);
    return true;
fail:
    fclose(f);
    qc_calib_free(out);
    return false;
}

bool qc_calib_write(const char *path, const qc_calib *c, char *why, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(why, size, "cannot create %s: %s", path, strerror(errno));
        return false;
    }
    bool ok = fwrite(QC_CALIB_MAGIC, 1, 8, f) == 8 && qcal_put_u32(f, QC_CALIB_VERSION) &&
              qcal_put_u32(f, (uint32_t)c->count) && qcal_put_u32(f, (uint32_t)c->tokens) &&
              qcal_put_u32(f, (uint32_t)(c->tokens >> 32));
    for (int32_t i = 0; ok && i < c->count; i++) {
        const qc_calib_entry *e = &c->e[i];
        uint32_t nl = (uint32_t)strlen(e->name);
        ok = qcal_put_u32(f, nl) && fwrite(e->name, 1, nl, f) == nl &&
             qcal_put_u32(f, (uint32_t)e->cols);
        for (int64_t j = 0; ok && j < e->cols; j++) {
            uint32_t bits;
            memcpy(&bits, &e->amax[j], 4);
            ok = qcal_put_u32(f, bits);
        }
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) snprintf(why, size, "cannot write %s: %s", path, strerror(errno));
    return ok;
}

/* ------------------------------------------------------------ smoothing */

void qc_smooth_factors(const float *amax, const float *const *w, const int64_t *rows, int n,
                       int64_t cols, double alpha, float *s) {
    for (int64_t j = 0; j < cols; j++) s[j] = 0.0f; /* wmax first */
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < rows[i]; r++) {
            const float *row = w[i] + r * cols;
            for (int64_t j = 0; j < cols; j++) s[j] = fmaxf(s[j], fabsf(row[j]));
        }
    for (int64_t j = 0; j < cols; j++) {
        if (amax[j] == 0.0f && s[j] == 0.0f) {
            s[j] = 1.0f;
            continue;
        }
        double a = fmax((double)amax[j], QC_SMOOTH_MIN), wm = fmax((double)s[j], QC_SMOOTH_MIN);
        double v = pow(a, alpha) / pow(wm, 1.0 - alpha);
        s[j] = (float)fmin(fmax(v, QC_SMOOTH_MIN), QC_SMOOTH_MAX);
    }
}

void qc_smooth_apply(float *w, int64_t rows, int64_t cols, const float *s) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) w[r * cols + j] *= s[j];
}

bool qc_expand_path(const char *in, char *out, size_t size, char *why, size_t whysize) {
    char tmp[4096];
    size_t o = 0;
    for (const char *p = in; *p;) {
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p + 2, '}');
            if (!end) {
                snprintf(why, whysize, "unterminated '${' in \"%s\"", in);
                return false;
            }
            const char *colon = strstr(p + 2, ":-");
            const char *name_end = colon && colon < end ? colon : end;
            char name[256], def[1024];
            size_t len = (size_t)(name_end - (p + 2));
            if (len == 0 || len >= sizeof name) {
                snprintf(why, whysize, "bad variable reference in \"%s\"", in);
                return false;
            }
            memcpy(name, p + 2, len);
            name[len] = 0;
            const char *val = getenv(name);
            if (!val || !val[0]) {
                if (name_end == end) {
                    snprintf(why, whysize, "environment variable %.100s is not set (write "
                             "${%.100s:-default} to give a default)", name, name);
                    return false;
                }
                size_t dl = (size_t)(end - (colon + 2));
                if (dl >= sizeof def) dl = sizeof def - 1;
                memcpy(def, colon + 2, dl);
                def[dl] = 0;
                val = def;
            }
            size_t vl = strlen(val);
            if (o + vl >= sizeof tmp) goto overflow;
            memcpy(tmp + o, val, vl);
            o += vl;
            p = end + 1;
        } else {
            if (o + 1 >= sizeof tmp) goto overflow;
            tmp[o++] = *p++;
        }
    }
    tmp[o] = 0;
    if (tmp[0] == '~' && (tmp[1] == '/' || tmp[1] == 0)) {
        const char *home = getenv("HOME");
        if (!home || !home[0]) {
            snprintf(why, whysize, "cannot expand '~' in \"%s\": HOME is not set", in);
            return false;
        }
        if ((size_t)snprintf(out, size, "%s%s", home, tmp + 1) >= size) goto overflow;
        return true;
    }
    if ((size_t)snprintf(out, size, "%s", tmp) >= size) goto overflow;
    return true;
overflow:
    snprintf(why, whysize, "path too long after expansion: \"%s\"", in);
    return false;
}
