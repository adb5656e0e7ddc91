/*
 * core/tokenizer/decode.c — ids -> text, whole and streaming.
 *
 * Both paths share one rule set, so that streaming every id and flushing
 * gives exactly the whole decode: token bytes are concatenated first, then
 * made valid UTF-8 with each maximal ill-formed subpart replaced by one
 * U+FFFD (what Python's and Rust's lossy decoders do). The streaming side
 * holds back only a trailing sequence that may still complete.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static bool is_special_type(uint8_t ty) {
    return ty == LOOM_TOKEN_CONTROL || ty == LOOM_TOKEN_UNKNOWN;
}

/* The bytes token `id` contributes, after skip_special and the
 * SentencePiece leading-space rule (the space the encoder put before the
 * first text is dropped when nothing precedes it in the output). *started
 * tracks the latter. */
static const char *token_bytes(const loom_tokenizer *t, int32_t id, bool skip_special,
                               bool *started, size_t *len) {
    uint8_t ty = t->types[id];
    *len = 0;
    if (skip_special && is_special_type(ty)) return NULL;
    const char *p = t->piece_arena + t->piece_off[id];
    size_t n = t->piece_len[id];
    if (n > 0) { /* like HF's Strip decoder: only a space at the very start goes */
        if (!*started && t->kind == TOK_SPM && t->add_space_prefix && p[0] == ' ') { p++; n--; }
        *started = true;
    }
    *len = n;
    return p;
}

loom_status loom_tokenizer_decode_bytes(const loom_tokenizer *t, const int32_t *ids, int32_t n, bool skip_special,
                                        char **out, size_t *len, loom_error *err) {
    if (!out || !len) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer decode: NULL output");
    *out = NULL;
    *len = 0;
    if (!t || n < 0 || (n > 0 && !ids))
        return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer decode: bad argument");
    tok_buf raw = {0}, res = {0};
    bool started = false;
    tok_buf_put(&raw, "", 0);
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            free(raw.p);
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "tokenizer decode: id %d at position %d is outside the "
                                  "vocabulary (%d tokens)",
                                  (int)ids[i], (int)i, (int)t->n_vocab);
        }
        size_t len;
        const char *p = token_bytes(t, ids[i], skip_special, &started, &len);
        tok_buf_put(&raw, p, len);
    }
    tok_buf_put(&res, "", 0);
    const unsigned char *s = (const unsigned char *)raw.p;
    for (size_t i = 0; i < raw.n && !raw.oom;) {
        size_t adv;
        int r = tok_utf8_next(s + i, raw.n - i, &adv);
        if (r == 1) tok_buf_put(&res, s + i, adv);
        else tok_buf_put(&res, REPLACEMENT, 3);
        i += adv;
    }
    bool oom = raw.oom || res.oom;
    free(raw.p);
    if (oom) {
        free(res.p);
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer decode: out of memory");
    }
    *out = res.p;
    *len = res.n;
    return LOOM_OK;
}

loom_status loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, int32_t n,
                                  bool skip_special, char **out, loom_error *err) {
    size_t len;
    return loom_tokenizer_decode_bytes(t, ids, n, skip_special, out, &len, err);
}

/* ------------------------------------------------------------ streaming */

void loom_detok_init(loom_detok *d, const loom_tokenizer *t, bool skip_special) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->skip_special = skip_special;
}

/* Emit from src (pending ++ new bytes) into out; keep what must wait. */
static size_t detok_emit(loom_detok *d, const unsigned char *src, size_t n, bool final,
                         char *out, size_t cap) {
    size_t w = 0, i = 0;
    size_t room = cap ? cap - 1 : 0;
    while (i < n) {
        size_t adv;
        int r = tok_utf8_next(src + i, n - i, &adv);
        if (r == 0 && !final) break;                 /* may still complete */
        size_t need = r == 1 ? adv : 3;
        if (w + need > room) break;                  /* does not fit: keep */
        if (r == 1) memcpy(out + w, src + i, adv);
        else memcpy(out + w, REPLACEMENT, 3);
        w += need;
        i += adv;
    }
    size_t rest = n - i;
    if (rest > LOOM_DETOK_PENDING_MAX) { /* only when out buffers are far too small */
        rest = LOOM_DETOK_PENDING_MAX;
        d->overflowed = true;
    }
    memmove(d->pending, src + i, rest);
    d->n_pending = (uint32_t)rest;
    if (cap) out[w] = '\0';
    return w;
}

size_t loom_detok_push(loom_detok *d, int32_t id, char *out, size_t cap) {
    const loom_tokenizer *t = d->t;
    if (cap) out[0] = '\0';
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    size_t len;
    const char *p = token_bytes(t, id, d->skip_special, &d->started, &len);
    if (len == 0 && d->n_pending == 0) return 0;
    unsigned char local[1024];
    size_t n = d->n_pending + len;
    unsigned char *buf = n <= sizeof local ? local : malloc(n);
    if (!buf) { /* cannot combine: keep what is pending, drop this token's bytes */
        d->overflowed = true;
        return 0;
    }
    memcpy(buf, d->pending, d->n_pending);
    if (len) memcpy(buf + d->n_pending, p, len);
    size_t w = detok_emit(d, buf, n, false, out, cap);
    if (buf != local) free(buf);
    return w;
}

size_t loom_detok_flush(loom_detok *d, char *out, size_t cap) {
    unsigned char buf[LOOM_DETOK_PENDING_MAX];
    size_t n = d->n_pending;
    memcpy(buf, d->pending, n);
    size_t w = detok_emit(d, buf, n, true, out, cap);
    if (d->n_pending == 0) { /* all out: ready for a new stream */
        const loom_tokenizer *t = d->t;
        bool skip = d->skip_special;
        loom_detok_init(d, t, skip);
    }
    return w;
}
