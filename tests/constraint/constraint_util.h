/*
 * tests/constraint/constraint_util.h — a synthetic vocabulary for the
 * grammar constraint's tests: every single byte (so any text can be
 * spelled), multi-byte pieces that cross JSON's structure ("{\"", "\":",
 * "],"), whole and partial UTF-8 characters, a control token that is never
 * allowed and an end-of-generation token (the last id). Header-only.
 */
#ifndef LOOM_TEST_CONSTRAINT_UTIL_H
#define LOOM_TEST_CONSTRAINT_UTIL_H

#include <stdint.h>
#include <string.h>

#include "loom/constraint.h"

static const char *const cu_multi[] = {
    "{\"", "\":", "\",", "\"}", " \"", "\": \"", "\":\"", "true", "false", "null", ", ", ",\n", "[", "]}", "],",
    "}]", "}}", "0", "12", "3.5", "-1", "1e5", "e+", "\\n", "\\\"", "\\u00e9", "{\n  \"", "\n}", "ab", "name",
    "id", "value", "é", "中文", "\xe4\xb8", "\xad", "😀", "  ", "\t", "\":[", "\":{", "\": ", "{}", "[]", "\"\"",
    "tr", "ue", "nu", "ll", "fa", "lse", "00", "0.", ".0", "E-", "a b", "x\"", "\"a", "1,", "2]", NULL};

typedef struct cu_vocab {
    loom_vocab_view view;
    const char *pieces[512];
    size_t lens[512];
    char bytes[256];
    int32_t eog[1];
} cu_vocab;

static const char *cu_piece(const void *ctx, int32_t id, size_t *len) {
    const cu_vocab *v = ctx;
    *len = 0;
    if (id < 0 || id >= v->view.size || !v->pieces[id]) return NULL;
    *len = v->lens[id];
    return v->pieces[id];
}

/* Ids: 0..255 bytes, then cu_multi, then a control token, then eog. */
static void cu_vocab_init(cu_vocab *v) {
    memset(v, 0, sizeof *v);
    int32_t n = 0;
    for (int b = 0; b < 256; b++) {
        v->bytes[b] = (char)b;
        v->pieces[n] = &v->bytes[b];
        v->lens[n++] = 1;
    }
    for (int i = 0; cu_multi[i]; i++) {
        v->pieces[n] = cu_multi[i];
        v->lens[n++] = strlen(cu_multi[i]);
    }
    v->pieces[n++] = NULL; /* a control token */
    v->eog[0] = n;
    v->pieces[n++] = NULL;
    v->view = (loom_vocab_view){.struct_size = sizeof(loom_vocab_view), .size = n, .ctx = v, .piece = cu_piece,
                                .eog = v->eog, .num_eog = 1};
}

static inline bool cu_allowed(const uint32_t *mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

#endif
