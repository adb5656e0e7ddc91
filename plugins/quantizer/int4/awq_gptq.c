/*
 * plugins/quantizer/int4/awq_gptq.c — see awq_gptq.h: checking and
 * unpacking AWQ / GPTQ 4-bit checkpoints into loom's INT4 layout.
 *
 * Unpacking runs once per tensor at load, on the engine thread; it favours
 * one obviously correct element loop (nibble of input r, output c) over
 * word-level tricks, except for GPTQ's qweight, whose little-endian words
 * are already loom's bytes (nibble j = input 8i + j, low nibble first).
 */
#include "awq_gptq.h"

#include <stdio.h>
#include <string.h>

/* AWQ: output 8i + c is stored in nibble awq_pos[c] of its word (the
 * inverse of AutoAWQ's pack order [0, 2, 4, 6, 1, 3, 5, 7]). */
static const int awq_pos[8] = {0, 4, 1, 5, 2, 6, 3, 7};

const char *i4_packing_name(i4_packing p) {
    switch (p) {
    case I4_PACK_AWQ: return "awq";
    case I4_PACK_GPTQ: return "gptq";
    case I4_PACK_GPTQ_V2: return "gptq_v2";
    }
    return "?";
}

static bool i4_is_2d(const loom_tensor *t, int64_t d0, int64_t d1) {
    return t && t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

/* Host data of at least numel * elem bytes. */
static bool i4_has_data(const loom_tensor *t, size_t elem) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return t->device == LOOM_DEVICE_HOST && t->data && t->nbytes >= (size_t)n * elem;
}

static const char *i4_tname(const loom_tensor *t, const char *fallback) {
    return t && t->name ? t->name : fallback;
}

loom_status i4_packed_check(const loom_host *h, const char *who, const char *name, i4_packed *p,
                            loom_error *err) {
    const int64_t n = p->n, k = p->k;
    const loom_tensor *qw = p->qweight, *qz = p->qzeros, *sc = p->scales, *gi = p->g_idx;
    const char *pk = i4_packing_name(p->packing);
    bool awq = p->packing == I4_PACK_AWQ;
    if (!qw || !qz || !sc)
        return h->error(h->ctx, err, LOOM_ERR_NOT_FOUND,
                        "%s: tensor '%s': the %s checkpoint lacks %s (need qweight, qzeros and "
                        "scales next to each other)",
                        who, name, pk, !qw ? "qweight" : !qz ? "qzeros" : "scales");
    if (n % 8 || k % 8)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s' is (%lld, %lld); 4-bit packing needs both dimensions to "
                        "be multiples of 8",
                        who, name, (long long)n, (long long)k);
    if (qw->dtype != LOOM_DTYPE_I32 || qz->dtype != LOOM_DTYPE_I32)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': %s is %s; packed 4-bit words must be int32", who, name,
                        qw->dtype != LOOM_DTYPE_I32 ? "qweight" : "qzeros",
                        h->dtype_name(qw->dtype != LOOM_DTYPE_I32 ? qw->dtype : qz->dtype));
    int64_t want0 = awq ? k : k / 8, want1 = awq ? n / 8 : n;
    if (!i4_is_2d(qw, want0, want1)) {
        bool other = awq ? i4_is_2d(qw, k / 8, n) : i4_is_2d(qw, k, n / 8);
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': %s has shape (%lld, %lld), but %s packing of a (%lld "
                        "out, %lld in) weight needs (%lld, %lld)%s",
                        who, name, i4_tname(qw, "qweight"), (long long)qw->shape[0],
                        (long long)(qw->ndim > 1 ? qw->shape[1] : 0), pk, (long long)n,
                        (long long)k, (long long)want0, (long long)want1,
                        other ? (awq ? "; it is the GPTQ layout (k/8, n): set quantizer.source: "
                                       "gptq"
                                     : "; it is the AWQ layout (k, n/8): set quantizer.source: awq")
                              : "; the checkpoint does not match the model config");
    }
    if (sc->ndim != 2 || sc->shape[1] != n || sc->shape[0] <= 0 || k % sc->shape[0] != 0)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': %s has shape (%lld, %lld); expected (k/group, %lld) "
                        "with k = %lld",
                        who, name, i4_tname(sc, "scales"), (long long)sc->shape[0],
                        (long long)(sc->ndim > 1 ? sc->shape[1] : 0), (long long)n, (long long)k);
    int64_t G = sc->shape[0], g = k / G;
    if (g % 2)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "%s: tensor '%s': group size %lld is odd; loom's INT4 layout needs even "
                        "groups",
                        who, name, (long long)g);
    if (sc->dtype != LOOM_DTYPE_F16 && sc->dtype != LOOM_DTYPE_BF16 && sc->dtype != LOOM_DTYPE_F32)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': scales are %s; expected f16, bf16 or f32", who, name,
                        h->dtype_name(sc->dtype));
    if (!i4_is_2d(qz, G, n / 8))
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': %s has shape (%lld, %lld); expected (%lld, %lld) for "
                        "%lld groups of %lld",
                        who, name, i4_tname(qz, "qzeros"), (long long)qz->shape[0],
                        (long long)(qz->ndim > 1 ? qz->shape[1] : 0), (long long)G,
                        (long long)(n / 8), (long long)G, (long long)g);
    if (!i4_has_data(qw, 4) || !i4_has_data(qz, 4) ||
        !i4_has_data(sc, h->dtype_block_bytes(sc->dtype)))
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "%s: tensor '%s': packed tensors are not complete host data", who, name);
    if (gi) {
        if (awq)
            h->log(h->ctx, LOOM_LOG_WARN, who, "tensor '%s': AWQ checkpoints have no g_idx; "
                   "ignoring the one found", name);
        else if (gi->dtype != LOOM_DTYPE_I32 || gi->ndim != 1 || gi->shape[0] != k ||
                 !i4_has_data(gi, 4))
            return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                            "%s: tensor '%s': g_idx is %s of %lld elements; expected int32 (%lld)",
                            who, name, h->dtype_name(gi->dtype),
                            (long long)(gi->ndim == 1 ? gi->shape[0] : -1), (long long)k);
        else {
            const int32_t *g_idx = gi->data;
            for (int64_t r = 0; r < k; r++)
                if (g_idx[r] < 0 || g_idx[r] >= G)
                    return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                                    "%s: tensor '%s': g_idx[%lld] = %d outside [0, %lld groups)",
                                    who, name, (long long)r, g_idx[r], (long long)G);
        }
    }
    if (awq) p->g_idx = NULL;
    p->group_size = (int32_t)g;
    return LOOM_OK;
}

bool i4_gidx_trivial(const i4_packed *p) {
    if (!p->g_idx) return true;
    const int32_t *g = p->g_idx->data;
    for (int64_t r = 0; r < p->k; r++)
        if (g[r] != r / p->group_size) return false;
    return true;
}

/* Code of input r, output c. */
static inline int i4_code(const i4_packed *p, int64_t r, int64_t c) {
    const uint32_t *w = p->qweight->data;
    if (p->packing == I4_PACK_AWQ)
        return (int)((w[r * (p->n / 8) + c / 8] >> (4 * awq_pos[c % 8])) & 15u);
    return (int)((w[(r / 8) * p->n + c] >> (4 * (r % 8))) & 15u);
}

/* Real zero point of group grp, output c. */
static inline float i4_zero(const i4_packed *p, int64_t grp, int64_t c) {
    const uint32_t *z = p->qzeros->data;
    uint32_t word = z[grp * (p->n / 8) + c / 8];
    int pos = p->packing == I4_PACK_AWQ ? awq_pos[c % 8] : (int)(c % 8);
    int v = (int)((word >> (4 * pos)) & 15u);
    /* GPTQ v1 stores zero - 1 as a nibble (0 - 1 wraps to 15); AutoGPTQ
     * reads it back as (stored + 1) & 15 */
    if (p->packing == I4_PACK_GPTQ) v = (v + 1) & 15;
    return (float)v;
}

/* scales (G, n) as float32 into a host->alloc'd buffer. */
static loom_status i4_scales_f32(const loom_host *h, const char *who, const char *name,
                                 const i4_packed *p, float **out, loom_error *err) {
    int64_t G = p->k / p->group_size, n = p->n;
    float *s = h->alloc(h->ctx, (size_t)(G * n) * sizeof(float));
    if (!s) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "%s: out of memory for '%s'", who, name);
    size_t rb = h->dtype_row_bytes(p->scales->dtype, n);
    for (int64_t g = 0; g < G; g++)
        if (h->convert(LOOM_DTYPE_F32, s + g * n, p->scales->dtype, (const uint8_t *)p->scales->data + g * rb,
                       n) != LOOM_OK) {
            h->free(h->ctx, s);
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "%s: tensor '%s': cannot read %s scales", who, name,
                            h->dtype_name(p->scales->dtype));
        }
    *out = s;
    return LOOM_OK;
}

loom_status i4_unpack(const loom_host *h, const char *who, const char *name, const i4_packed *p,
                      uint8_t *data, float *scales, float *zeros, loom_error *err) {
    if (!i4_gidx_trivial(p))
        return h->error(h->ctx, err, LOOM_ERR_INTERNAL,
                        "%s: tensor '%s': i4_unpack on an act-order tensor", who, name);
    float *s = NULL;
    loom_status st = i4_scales_f32(h, who, name, p, &s, err);
    if (st) return st;
    const int64_t n = p->n, k = p->k, G = k / p->group_size;
    for (int64_t c = 0; c < n; c++)
        for (int64_t g = 0; g < G; g++) {
            scales[c * G + g] = s[g * n + c];
            zeros[c * G + g] = i4_zero(p, g, c);
        }
    if (p->packing == I4_PACK_AWQ) {
        memset(data, 0, (size_t)(n * (k / 2)));
        for (int64_t r = 0; r < k; r++)
            for (int64_t c = 0; c < n; c++)
                data[c * (k / 2) + r / 2] |= (uint8_t)(i4_code(p, r, c) << (4 * (r & 1)));
    } else {
        /* GPTQ word [i, c], little-endian, is loom's bytes 4i..4i+3 of row c */
        const uint32_t *w = p->qweight->data;
        for (int64_t i = 0; i < k / 8; i++)
            for (int64_t c = 0; c < n; c++) {
                uint32_t v = w[i * n + c];
                uint8_t *d = data + c * (k / 2) + 4 * i;
                d[0] = (uint8_t)v, d[1] = (uint8_t)(v >> 8), d[2] = (uint8_t)(v >> 16),
                d[3] = (uint8_t)(v >> 24);
            }
    }
    h->free(h->ctx, s);
    return LOOM_OK;
}

loom_status i4_unpack_f32(const loom_host *h, const char *who, const char *name,
                          const i4_packed *p, float *w, loom_error *err) {
    float *s = NULL;
    loom_status st = i4_scales_f32(h, who, name, p, &s, err);
    if (st) return st;
    const int64_t n = p->n, k = p->k;
    const int32_t *g_idx = p->g_idx ? p->g_idx->data : NULL;
    for (int64_t r = 0; r < k; r++) {
        int64_t g = g_idx ? g_idx[r] : r / p->group_size;
        for (int64_t c = 0; c < n; c++)
            w[c * k + r] = ((float)i4_code(p, r, c) - i4_zero(p, g, c)) * s[g * n + c];
    }
    h->free(h->ctx, s);
    return LOOM_OK;
}
