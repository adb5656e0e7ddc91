/*
 * core/tokenizer/gguf_load.c — the adapter from a GGUF file's tokenizer.*
 * keys to loom_tokenizer_from_arrays(). Reads: tokenizer.ggml.{model, pre,
 * tokens, scores, token_type, merges, bos/eos/unknown/eot/eom/padding
 * _token_id, add_bos_token, add_space_prefix} and tokenizer.chat_template.
 * GGUF strings are not NUL-terminated: lengths travel alongside.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

static int32_t gguf_id(const loom_gguf *g, const char *key) {
    int64_t v;
    if (!loom_gguf_get_i64(g, key, &v) || v < 0 || v > INT32_MAX) return -1;
    return (int32_t)v;
}

static int gguf_flag(const loom_gguf *g, const char *key) {
    bool b;
    return loom_gguf_get_bool(g, key, &b) ? (int)b : -1;
}

/* Element i of a numeric GGUF array of type et at p, as a double; false
 * when et is not numeric. */
static bool gguf_number_at(loom_gguf_type et, const unsigned char *p, uint64_t i, double *v) {
    switch (et) {
    case LOOM_GGUF_INT8: { int8_t x; memcpy(&x, p + i, 1); *v = x; return true; }
    case LOOM_GGUF_UINT8: *v = p[i]; return true;
    case LOOM_GGUF_INT16: { int16_t x; memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case LOOM_GGUF_UINT16: { uint16_t x; memcpy(&x, p + 2 * i, 2); *v = x; return true; }
    case LOOM_GGUF_INT32: { int32_t x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case LOOM_GGUF_UINT32: { uint32_t x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case LOOM_GGUF_FLOAT32: { float x; memcpy(&x, p + 4 * i, 4); *v = x; return true; }
    case LOOM_GGUF_FLOAT64: { double x; memcpy(&x, p + 8 * i, 8); *v = x; return true; }
    default: return false;
    }
}

/* Copy a numeric GGUF array of n entries into int32 (types) or float
 * (scores). Every value must convert exactly: an integer in int32 range for
 * ints (token types), within float range (or not finite) for floats. */
static loom_status gguf_numbers(const loom_gguf *g, const char *key, uint64_t n, int32_t *ints,
                                float *flts, loom_error *err) {
    loom_gguf_type et = LOOM_GGUF_STRING;
    uint64_t len = 0;
    const unsigned char *p = loom_gguf_get_arr(g, key, &et, &len) ? loom_gguf_arr_data(g, key) : NULL;
    double v = 0;
    if (len != n || (!p && n) || (n && !gguf_number_at(et, p, 0, &v)))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is not a numeric array of %llu entries",
                              loom_gguf_path(g), key, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        (void)gguf_number_at(et, p, i, &v);
        bool ok = ints ? v == floor(v) && v >= INT32_MIN && v <= INT32_MAX /* false for NaN */
                       : !isfinite(v) || fabs(v) <= FLT_MAX;
        if (!ok)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s[%llu] = %g is out of range (%s)",
                                  loom_gguf_path(g), key, (unsigned long long)i, v,
                                  ints ? "a token type is a small integer" : "not a float");
        if (ints) ints[i] = (int32_t)v;
        if (flts) flts[i] = (float)v;
    }
    return LOOM_OK;
}

/* Gather a string array as pointer + length lists (pointing into the map). */
static loom_status gguf_strings(const loom_gguf *g, const char *key, uint64_t *n,
                                const char ***ptrs, uint32_t **lens, loom_error *err) {
    loom_gguf_type et;
    uint64_t len;
    *ptrs = NULL;
    *lens = NULL;
    *n = 0;
    if (!loom_gguf_get_arr(g, key, &et, &len)) return LOOM_ERR_NOT_FOUND;
    if (et != LOOM_GGUF_STRING)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: '%s' is not an array of strings",
                              loom_gguf_path(g), key);
    if (len > (1u << 24))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: '%s' has %llu entries (max %u)",
                              loom_gguf_path(g), key, (unsigned long long)len, 1u << 24);
    *ptrs = malloc((len ? len : 1) * sizeof **ptrs);
    *lens = malloc((len ? len : 1) * sizeof **lens);
    if (!*ptrs || !*lens) {
        free(*ptrs);
        free(*lens);
        *ptrs = NULL;
        *lens = NULL;
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory reading '%s'", key);
    }
    for (uint64_t i = 0; i < len; i++) {
        loom_gguf_str s = loom_gguf_arr_str(g, key, i);
        (*ptrs)[i] = s.ptr ? s.ptr : "";
        (*lens)[i] = s.ptr && s.len < UINT32_MAX / 2 ? (uint32_t)s.len : 0;
    }
    *n = len;
    return LOOM_OK;
}

/* What the tokenizer.* keys hold, as arrays loom_tokenizer_from_arrays()
 * takes; strings point into the mapping, the rest is owned. */
typedef struct gguf_tok_arrays {
    uint64_t nv, nm;
    const char **toks, **merges;
    uint32_t *tok_lens, *merge_lens;
    int32_t *types;     /* [nv]                   */
    float *scores;      /* [nv] or NULL           */
    char *tmpl;         /* NUL-terminated or NULL */
} gguf_tok_arrays;

static void gguf_tok_arrays_free(gguf_tok_arrays *a) {
    free(a->toks);
    free(a->tok_lens);
    free(a->merges);
    free(a->merge_lens);
    free(a->types);
    free(a->scores);
    free(a->tmpl);
}

/* Tokens (required, not empty) and merges (required for byte-level BPE). */
static loom_status read_strings(const loom_gguf *g, const char *model, gguf_tok_arrays *a, loom_error *err) {
    loom_status st = gguf_strings(g, "tokenizer.ggml.tokens", &a->nv, &a->toks, &a->tok_lens, err);
    if (st == LOOM_ERR_NOT_FOUND)
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing",
                            loom_gguf_path(g));
    if (st) return st;
    if (a->nv == 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", loom_gguf_path(g));
    st = gguf_strings(g, "tokenizer.ggml.merges", &a->nm, &a->merges, &a->merge_lens, err);
    if (st == LOOM_ERR_NOT_FOUND) st = LOOM_OK;
    if (st) return st;
    if (strcmp(model, "gpt2") == 0 && a->nm == 0)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: byte-level BPE vocabulary without tokenizer.ggml.merges",
                              loom_gguf_path(g));
    return LOOM_OK;
}

/* Token types (all normal when absent) and scores (optional). */
static loom_status read_types_scores(const loom_gguf *g, gguf_tok_arrays *a, loom_error *err) {
    a->types = malloc(a->nv * sizeof *a->types);
    if (!a->types) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    if (loom_gguf_find(g, "tokenizer.ggml.token_type") < 0) {
        for (uint64_t i = 0; i < a->nv; i++) a->types[i] = LOOM_TOKEN_NORMAL;
    } else {
        loom_status st = gguf_numbers(g, "tokenizer.ggml.token_type", a->nv, a->types, NULL, err);
        if (st) return st;
    }
    if (loom_gguf_find(g, "tokenizer.ggml.scores") < 0) return LOOM_OK;
    a->scores = malloc(a->nv * sizeof *a->scores);
    if (!a->scores) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    return gguf_numbers(g, "tokenizer.ggml.scores", a->nv, NULL, a->scores, err);
}

/* tokenizer.chat_template, NUL-terminated (GGUF strings are not). */
static loom_status read_template(const loom_gguf *g, gguf_tok_arrays *a, loom_error *err) {
    loom_gguf_str s;
    if (!loom_gguf_get_str(g, "tokenizer.chat_template", &s) || s.len == 0) return LOOM_OK;
    if (!(a->tmpl = loom_strndup(s.ptr, (size_t)s.len)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    return LOOM_OK;
}

static void fill_spec(const loom_gguf *g, const gguf_tok_arrays *a, const char *model, const char *pre,
                      loom_tokenizer_spec *spec) {
    loom_tokenizer_spec_init(spec);
    spec->model = model;
    spec->pre = pre[0] ? pre : NULL;
    spec->n_vocab = (int32_t)a->nv;
    spec->tokens = a->toks;
    spec->token_lens = a->tok_lens;
    spec->scores = a->scores;
    spec->token_types = a->types;
    spec->n_merges = (int32_t)a->nm;
    spec->merges = a->merges;
    spec->merge_lens = a->merge_lens;
    spec->bos_id = gguf_id(g, "tokenizer.ggml.bos_token_id");
    spec->eos_id = gguf_id(g, "tokenizer.ggml.eos_token_id");
    spec->unk_id = gguf_id(g, "tokenizer.ggml.unknown_token_id");
    spec->eot_id = gguf_id(g, "tokenizer.ggml.eot_token_id");
    spec->eom_id = gguf_id(g, "tokenizer.ggml.eom_token_id");
    spec->pad_id = gguf_id(g, "tokenizer.ggml.padding_token_id");
    spec->add_bos = gguf_flag(g, "tokenizer.ggml.add_bos_token");
    spec->add_space_prefix = gguf_flag(g, "tokenizer.ggml.add_space_prefix");
    spec->chat_template = a->tmpl;
}

loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out, loom_error *err) {
    gguf_tok_arrays a = {0};
    char model[32] = "", pre[64] = "";
    loom_status st;
    if (!g || !out) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: NULL argument");
    *out = NULL;

    loom_gguf_str s;
    if (!loom_gguf_get_str(g, "tokenizer.ggml.model", &s)) {
        return loom_error_set(err, LOOM_ERR_NOT_FOUND,
                              "%s: no tokenizer.ggml.model key; this GGUF carries no tokenizer "
                              "(load the model's tokenizer.json instead)",
                              loom_gguf_path(g));
    }
    snprintf(model, sizeof model, "%.*s", (int)(s.len < 31 ? s.len : 31), s.ptr);
    if (loom_gguf_get_str(g, "tokenizer.ggml.pre", &s))
        snprintf(pre, sizeof pre, "%.*s", (int)(s.len < 63 ? s.len : 63), s.ptr);

    if ((st = read_strings(g, model, &a, err))) goto free_arrays;
    if ((st = read_types_scores(g, &a, err))) goto free_arrays;
    if ((st = read_template(g, &a, err))) goto free_arrays;
    loom_tokenizer_spec spec;
    fill_spec(g, &a, model, pre, &spec);
    st = loom_tokenizer_from_arrays(&spec, out, err);
    if (st) loom_error_prefix(err, "%s", loom_gguf_path(g));
    /* Byte-level BPE drops bytes its vocabulary cannot spell, as Hugging
     * Face's BPE model without unk_token and llama.cpp do: unknown_token_id
     * comes from tokenizer_config.json, which that model does not use. */
    else if ((*out)->kind == TOK_BYTELEVEL) (*out)->unk_bytes = false;
free_arrays:
    gguf_tok_arrays_free(&a);
    return st;
}
