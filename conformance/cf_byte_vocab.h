/*
 * conformance/cf_byte_vocab.h — a synthetic vocabulary for checking
 * decoding constraints (loom/constraint.h) without a tokenizer: ids
 * 0..255 are the single bytes (so any text can be spelled), then the
 * caller's multi-byte pieces, then a control token whose piece is NULL
 * (never allowed), then the end-of-generation token (the last id).
 * Header-only, so the constraint plugin's own tests, which link the
 * grammar sources alone, share it with the conformance kit.
 */
#ifndef LOOM_CF_BYTE_VOCAB_H
#define LOOM_CF_BYTE_VOCAB_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "loom/constraint.h"

#define CF_BYTE_VOCAB_MAX 512

typedef struct cf_byte_vocab {
    loom_vocab_view view;
    const char *pieces[CF_BYTE_VOCAB_MAX];
    size_t lens[CF_BYTE_VOCAB_MAX];
    char bytes[256];
    int32_t eog[1];
    int32_t control;           /* the NULL-piece token                       */
} cf_byte_vocab;

static inline const char *cf_byte_vocab_piece(const void *ctx, int32_t id, size_t *len) {
    const cf_byte_vocab *v = ctx;
    *len = 0;
    if (id < 0 || id >= v->view.size || !v->pieces[id]) return NULL;
    *len = v->lens[id];
    return v->pieces[id];
}

/* Fill v from `multi` (NULL-terminated); false when it does not fit
 * CF_BYTE_VOCAB_MAX ids. */
static inline bool cf_byte_vocab_init(cf_byte_vocab *v, const char *const *multi) {
    memset(v, 0, sizeof *v);
    int32_t n = 0;
    for (int b = 0; b < 256; b++) {
        v->bytes[b] = (char)b;
        v->pieces[n] = &v->bytes[b];
        v->lens[n++] = 1;
    }
    for (int i = 0; multi[i]; i++) {
        if (n + 2 >= CF_BYTE_VOCAB_MAX) return false;
        v->pieces[n] = multi[i];
        v->lens[n++] = strlen(multi[i]);
    }
    v->control = n++;
    v->eog[0] = n++;
    v->view = (loom_vocab_view){.struct_size = sizeof(loom_vocab_view), .size = n, .ctx = v,
                                .piece = cf_byte_vocab_piece, .eog = v->eog, .num_eog = 1};
    return true;
}

#endif
