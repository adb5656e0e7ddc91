/*
 * core/tokenizer/vocab.c — building a tokenizer from plain arrays: copies the
 * vocabulary into two arenas (stored text, decoded bytes), builds the hash
 * maps and the merge table, sorts the special tokens for matching, picks the
 * pre-tokenizer regexes of a GGUF family, and answers the simple queries.
 * Encoding lives in encode.c, decoding in decode.c, loaders in gguf_load.c
 * and json_load.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

#define TOK_MAX_VOCAB (1 << 24)

/* ------------------------------------------------------------------ utf-8 */

int tok_utf8_next(const unsigned char *s, size_t n, size_t *adv) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the 2nd byte */
    if (c < 0x80) { *adv = 1; return 1; }
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;       /* no overlongs */
        if (c == 0xED) hi = 0x9F;       /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;       /* <= U+10FFFF */
    } else { *adv = 1; return -1; }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) { *adv = i; return 0; }
        unsigned char b = s[i];
        bool ok = (i == 1) ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) { *adv = i; return -1; }
    }
    *adv = need + 1;
    return 1;
}

int loom_utf8_next(const unsigned char *s, size_t n, size_t *adv) { return tok_utf8_next(s, n, adv); }

/* ---------------------------------------------------------------- buffers */

void tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void tok_buf_puts(tok_buf *b, const char *s) { tok_buf_put(b, s, strlen(s)); }

/* ------------------------------------------------------------------- maps */

static uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ull; }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static uint32_t tok_pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static loom_status tok_map_init(tok_strmap *m, uint64_t n) {
    uint32_t cap = tok_pow2_at_least(n * 2 + 1);
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots) return LOOM_ERR_NOMEM;
    memset(m->slots, 0xff, (size_t)cap * sizeof *m->slots);
    m->mask = cap - 1;
    return LOOM_OK;
}

int32_t tok_map_find(const tok_strmap *m, const char *s, size_t n) {
    if (!m->slots) return -1;
    uint32_t i = (uint32_t)tok_hash(s, n) & m->mask;
    for (;;) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (m->len[id] == n && memcmp(m->arena + m->off[id], s, n) == 0) return id;
        i = (i + 1) & m->mask;
    }
}

/* Insert id under its key unless the key is taken (first id wins). */
static void tok_map_add(tok_strmap *m, int32_t id) {
    const char *s = m->arena + m->off[id];
    size_t n = m->len[id];
    uint32_t i = (uint32_t)tok_hash(s, n) & m->mask;
    for (;;) {
        int32_t cur = m->slots[i];
        if (cur < 0) { m->slots[i] = id; return; }
        if (m->len[cur] == n && memcmp(m->arena + m->off[cur], s, n) == 0) return;
        i = (i + 1) & m->mask;
    }
}

static void tok_pair_add(loom_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t result) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)tok_pair_hash(key) & t->pair_mask;
    for (;;) {
        tok_pair_slot *s = &t->pairs[i];
        if (s->key == UINT64_MAX) { s->key = key; s->rank = rank; s->result = result; return; }
        if (s->key == key) return; /* lower rank already there */
        i = (i + 1) & t->pair_mask;
    }
}

/* ------------------------------------------------- GPT-2 byte <-> unicode */

/* Byte-level BPE writes every byte as a printable code point: bytes that are
 * printable Latin-1 map to themselves, the other 68 to U+0100.. in order.
 * rev[cp] = byte for cp < 256 + 68, -1 where cp is not a byte's image. */
static void tok_bl_table(int16_t rev[256 + 68]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (self) rev[b] = (int16_t)b;
        else { rev[b] = -1; rev[256 + n++] = (int16_t)b; }
    }
}

static uint32_t tok_utf8_decode(const unsigned char *s, size_t len) {
    if (len == 1) return s[0];
    if (len == 2) return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (len == 3) return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static int tok_hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Decoded bytes of one token into dst (capacity >= n); returns length. */
static size_t tok_make_piece(tok_kind kind, const int16_t *bl_rev, loom_token_type type,
                             const char *src, size_t n, char *dst) {
    const unsigned char *s = (const unsigned char *)src;
    size_t w = 0;
    if (type == LOOM_TOKEN_CONTROL || type == LOOM_TOKEN_USER_DEFINED ||
        type == LOOM_TOKEN_UNKNOWN) {
        if (kind == TOK_SPM && type == LOOM_TOKEN_USER_DEFINED) goto spm;
        memcpy(dst, src, n);
        return n;
    }
    if (kind == TOK_BYTELEVEL) {
        for (size_t i = 0; i < n;) {
            size_t adv;
            int r = tok_utf8_next(s + i, n - i, &adv);
            uint32_t cp = r == 1 ? tok_utf8_decode(s + i, adv) : UINT32_MAX;
            int b = cp < 256 + 68 ? bl_rev[cp] : -1;
            if (b >= 0) dst[w++] = (char)b;
            else { memcpy(dst + w, s + i, adv); w += adv; } /* not byte-level: keep as is */
            i += adv;
        }
        return w;
    }
    if (type == LOOM_TOKEN_BYTE && n == 6 && memcmp(src, "<0x", 3) == 0 && src[5] == '>') {
        int hi = tok_hexval(src[3]), lo = tok_hexval(src[4]);
        if (hi >= 0 && lo >= 0) {
            dst[0] = (char)(hi * 16 + lo);
            return 1;
        }
    }
spm:
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { /* ▁ */
            dst[w++] = ' ';
            i += 3;
        } else {
            dst[w++] = src[i++];
        }
    }
    return w;
}

/* ------------------------------------------------------- pre-tokenizers */

static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_TEKKEN[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_DIGIT[] = "\\p{N}";

static bool tok_name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return true;
    return false;
}

loom_status tok_add_split(loom_tokenizer *t, const char *pattern, size_t pattern_len,
                          bool literal, tok_split_behavior behavior, bool invert, loom_error *err) {
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    /* PCRE2_LITERAL refuses PCRE2_UCP (it only changes classes, which a
     * literal has none of): a String pattern matches its bytes exactly. */
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, pattern_len, opts, &ecode, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "tokenizer: pre-tokenizer regex '%.*s' does not compile at offset "
                              "%zu: %s",
                              (int)(pattern_len > 200 ? 200 : pattern_len), pattern, (size_t)eoff,
                              (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: interpreter otherwise */
    tok_split *s = realloc(t->splits, (size_t)(t->n_splits + 1) * sizeof *s);
    if (!s) {
        pcre2_code_free(re);
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory adding a split");
    }
    t->splits = s;
    t->splits[t->n_splits++] = (tok_split){.re = re, .behavior = behavior, .invert = invert};
    return LOOM_OK;
}

loom_status tok_set_pre(loom_tokenizer *t, const char *pre, loom_error *err) {
    static const char *const gpt2[] = {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais",
                                       "trillion", "granite-docling", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", "command-r",
                                         "codeshell", "exaone", "minerva", NULL};
    static const char *const llama3[] = {"llama-bpe", "llama3", "llama-v3", "falcon3",
                                         "pixtral", NULL};
    static const char *const llama3_keep[] = {"dbrx", "smaug-bpe", NULL};
    static const char *const qwen2[] = {"qwen2", "stablelm2", "deepseek-r1-qwen", "hunyuan",
                                        "megrez", NULL};
    static const char *const tekken[] = {"tekken", NULL};
    if (!pre || !*pre) pre = "default";
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pre);
    if (t->kind == TOK_SPM) return LOOM_OK; /* SentencePiece: no regex; ▁ handles spaces */
    loom_status st;
    if (tok_name_in(pre, gpt2)) {
        return tok_add_split(t, RE_GPT2, sizeof RE_GPT2 - 1, false, TOK_SPLIT_ISOLATED, false, err);
    }
    if (tok_name_in(pre, smollm)) {
        /* = HF Sequence[Digits(individual_digits=true), ByteLevel(use_regex)] */
        st = tok_add_split(t, RE_DIGIT, sizeof RE_DIGIT - 1, false, TOK_SPLIT_ISOLATED, false, err);
        if (st) return st;
        return tok_add_split(t, RE_GPT2, sizeof RE_GPT2 - 1, false, TOK_SPLIT_ISOLATED, false, err);
    }
    if (tok_name_in(pre, llama3) || tok_name_in(pre, llama3_keep)) {
        t->ignore_merges = tok_name_in(pre, llama3);
        return tok_add_split(t, RE_LLAMA3, sizeof RE_LLAMA3 - 1, false, TOK_SPLIT_ISOLATED, false,
                             err);
    }
    if (tok_name_in(pre, qwen2)) {
        return tok_add_split(t, RE_QWEN2, sizeof RE_QWEN2 - 1, false, TOK_SPLIT_ISOLATED, false,
                             err);
    }
    if (tok_name_in(pre, tekken)) {
        return tok_add_split(t, RE_TEKKEN, sizeof RE_TEKKEN - 1, false, TOK_SPLIT_ISOLATED, false,
                             err);
    }
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "tokenizer: pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported; "
                          "supported: default, gpt2, smollm, starcoder, llama-bpe, llama3, dbrx, "
                          "qwen2, stablelm2, tekken (or load the model's tokenizer.json)",
                          pre);
}

/* ------------------------------------------------------------- building */

void loom_tokenizer_spec_init(loom_tokenizer_spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->bos_id = spec->eos_id = spec->unk_id = spec->eot_id = spec->eom_id = spec->pad_id = -1;
    spec->add_bos = -1;
    spec->add_space_prefix = -1;
}

static int cmp_special(const void *a, const void *b) {
    const tok_special *x = a, *y = b;
    unsigned char fx = (unsigned char)x->text[0], fy = (unsigned char)y->text[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id < y->id ? -1 : (x->id > y->id);
}

static int32_t tok_check_id(const loom_tokenizer *t, int32_t id, const char *what) {
    if (id < 0) return -1;
    if (id >= t->n_vocab) {
        loom_log(LOOM_LOG_WARN, "tokenizer", "%s id %d is outside the vocabulary (%d tokens); ignored",
                 what, (int)id, (int)t->n_vocab);
        return -1;
    }
    return id;
}

static loom_status tok_build_merges(loom_tokenizer *t, const loom_tokenizer_spec *spec,
                                    loom_error *err) {
    t->pair_mask = tok_pow2_at_least((uint64_t)spec->n_merges * 2 + 1) - 1;
    t->pairs = malloc(((size_t)t->pair_mask + 1) * sizeof *t->pairs);
    if (!t->pairs) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory (merges)");
    for (size_t i = 0; i <= t->pair_mask; i++) t->pairs[i].key = UINT64_MAX;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    int32_t skipped = 0;
    for (int32_t r = 0; r < spec->n_merges; r++) {
        const char *m = spec->merges[r];
        if (!m) { skipped++; continue; }
        size_t n = spec->merge_lens ? spec->merge_lens[r] : strlen(m);
        int32_t a = -1, b = -1;
        size_t sp = 0;
        for (size_t i = 0; i < n && b < 0; i++) { /* first space that gives two known tokens */
            if (m[i] != ' ') continue;
            a = tok_map_find(&t->text_map, m, i);
            if (a >= 0) b = tok_map_find(&t->text_map, m + i + 1, n - i - 1);
            sp = i;
        }
        if (a < 0 || b < 0) { skipped++; continue; }
        if (n > tmp_cap) {
            char *p = realloc(tmp, n);
            if (!p) { free(tmp); return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory"); }
            tmp = p;
            tmp_cap = n;
        }
        memcpy(tmp, m, sp);
        memcpy(tmp + sp, m + sp + 1, n - sp - 1);
        int32_t res = tok_map_find(&t->text_map, tmp, n - 1);
        if (res < 0) { skipped++; continue; }
        tok_pair_add(t, a, b, r, res);
    }
    free(tmp);
    if (skipped)
        loom_log(LOOM_LOG_DEBUG, "tokenizer", "%d of %d merges name unknown tokens; skipped",
                 (int)skipped, (int)spec->n_merges);
    return LOOM_OK;
}

/* The spec's arrays are usable and its model names a family loom reads. */
static loom_status tok_check_spec(const loom_tokenizer_spec *spec, const tok_build_opts *opts, tok_kind *kind,
                                  loom_error *err) {
    if (!spec->model)
        return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: no model type (tokenizer.ggml.model)");
    if (spec->n_vocab <= 0 || spec->n_vocab > TOK_MAX_VOCAB || !spec->tokens)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "tokenizer: vocabulary of %d tokens is empty or too large (max %d)",
                              (int)spec->n_vocab, TOK_MAX_VOCAB);
    if (spec->n_merges < 0 || (spec->n_merges > 0 && !spec->merges))
        return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: bad merges array");
    if (opts->force_kind) *kind = (tok_kind)opts->force_kind;
    else if (strcmp(spec->model, "gpt2") == 0) *kind = TOK_BYTELEVEL;
    else if (strcmp(spec->model, "llama") == 0) *kind = TOK_SPM;
    else
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "tokenizer: model type '%s' is not supported; loom reads 'gpt2' "
                              "(byte-level BPE) and 'llama' (SentencePiece BPE)",
                              spec->model);
    return LOOM_OK;
}

/* Copy every token's stored text and the bytes it decodes to into the two
 * arenas, with its type and score. */
static loom_status tok_build_arenas(loom_tokenizer *t, const loom_tokenizer_spec *spec, loom_error *err) {
    size_t nv = (size_t)spec->n_vocab;
    size_t total = 0;
    for (size_t i = 0; i < nv; i++) {
        const char *s = spec->tokens[i] ? spec->tokens[i] : "";
        size_t n = spec->token_lens ? spec->token_lens[i] : strlen(s);
        if (n > UINT32_MAX / 2) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: token %zu too long", i);
        total += n + 1;
    }
    if (total > UINT32_MAX) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: vocabulary text over 4 GiB");
    t->text_arena = malloc(total);
    t->piece_arena = malloc(total);
    t->text_off = malloc(nv * sizeof(uint32_t));
    t->text_len = malloc(nv * sizeof(uint32_t));
    t->piece_off = malloc(nv * sizeof(uint32_t));
    t->piece_len = malloc(nv * sizeof(uint32_t));
    t->types = malloc(nv);
    t->eog = calloc(nv, 1);
    if (spec->scores) t->scores = malloc(nv * sizeof(float));
    if (!t->text_arena || !t->piece_arena || !t->text_off || !t->text_len || !t->piece_off ||
        !t->piece_len || !t->types || !t->eog || (spec->scores && !t->scores))
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", nv);
    size_t to = 0, po = 0;
    int16_t bl_rev[256 + 68];
    tok_bl_table(bl_rev);
    for (size_t i = 0; i < nv; i++) {
        const char *s = spec->tokens[i] ? spec->tokens[i] : "";
        size_t n = spec->token_lens ? spec->token_lens[i] : strlen(s);
        int32_t ty = spec->token_types ? spec->token_types[i] : LOOM_TOKEN_NORMAL;
        if (ty < LOOM_TOKEN_UNDEFINED || ty > LOOM_TOKEN_BYTE) ty = LOOM_TOKEN_NORMAL;
        if (ty == LOOM_TOKEN_UNDEFINED) ty = LOOM_TOKEN_NORMAL;
        t->types[i] = (uint8_t)ty;
        memcpy(t->text_arena + to, s, n);
        t->text_arena[to + n] = '\0';
        t->text_off[i] = (uint32_t)to;
        t->text_len[i] = (uint32_t)n;
        to += n + 1;
        size_t pn = tok_make_piece(t->kind, bl_rev, (loom_token_type)ty, s, n, t->piece_arena + po);
        t->piece_off[i] = (uint32_t)po;
        t->piece_len[i] = (uint32_t)pn;
        po += pn;
        if (pn > t->max_piece) t->max_piece = pn;
        if (t->scores) t->scores[i] = spec->scores[i];
    }
    return LOOM_OK;
}

/* The two maps (stored text; what BPE may produce) and the single-byte
 * tokens: byte-level pieces of one byte, or SPM <0xNN> tokens. */
static loom_status tok_build_maps(loom_tokenizer *t, loom_error *err) {
    size_t nv = (size_t)t->n_vocab;
    if (tok_map_init(&t->text_map, nv) || tok_map_init(&t->bpe_map, nv))
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory (maps)");
    t->text_map = (tok_strmap){t->text_map.slots, t->text_map.mask, t->text_arena, t->text_off, t->text_len};
    if (t->kind == TOK_BYTELEVEL)
        t->bpe_map = (tok_strmap){t->bpe_map.slots, t->bpe_map.mask, t->piece_arena, t->piece_off, t->piece_len};
    else
        t->bpe_map = (tok_strmap){t->bpe_map.slots, t->bpe_map.mask, t->text_arena, t->text_off, t->text_len};
    for (int32_t i = 0; i < t->n_vocab; i++) {
        tok_map_add(&t->text_map, i);
        uint8_t ty = t->types[i];
        if ((ty == LOOM_TOKEN_NORMAL || ty == LOOM_TOKEN_USER_DEFINED) && t->bpe_map.len[i] > 0)
            tok_map_add(&t->bpe_map, i);
    }
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    if (t->kind == TOK_BYTELEVEL) {
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            t->byte_tok[b] = tok_map_find(&t->bpe_map, &c, 1);
        }
        return LOOM_OK;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->text_arena + t->text_off[i];
        if (t->types[i] == LOOM_TOKEN_BYTE && t->text_len[i] == 6 && memcmp(s, "<0x", 3) == 0 &&
            s[5] == '>' && tok_hexval(s[3]) >= 0 && tok_hexval(s[4]) >= 0) {
            int b = tok_hexval(s[3]) * 16 + tok_hexval(s[4]);
            if (t->byte_tok[b] < 0) t->byte_tok[b] = i;
        }
    }
    return LOOM_OK;
}

/* Control, user-defined and unknown tokens with text are matched in raw
 * input before BPE. */
static bool tok_is_special(const loom_tokenizer *t, int32_t i) {
    uint8_t ty = t->types[i];
    return (ty == LOOM_TOKEN_CONTROL || ty == LOOM_TOKEN_USER_DEFINED || ty == LOOM_TOKEN_UNKNOWN) &&
           t->text_len[i] > 0;
}

/* The special tokens sorted for matching, and the index by first byte. */
static loom_status tok_build_specials(loom_tokenizer *t, const tok_build_opts *opts, loom_error *err) {
    int32_t ns = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (tok_is_special(t, i)) ns++;
    if (ns) {
        t->specials = malloc((size_t)ns * sizeof *t->specials);
        if (!t->specials) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
        for (int32_t i = 0, k = 0; i < t->n_vocab; i++) {
            if (!tok_is_special(t, i)) continue;
            t->specials[k++] = (tok_special){
                .id = i, .len = t->text_len[i], .text = t->text_arena + t->text_off[i],
                .always = t->types[i] == LOOM_TOKEN_USER_DEFINED,
                .lstrip = opts->lstrip && opts->lstrip[i], .rstrip = opts->rstrip && opts->rstrip[i]};
        }
        qsort(t->specials, (size_t)ns, sizeof *t->specials, cmp_special);
    }
    t->n_specials = ns;
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < ns && (unsigned char)t->specials[k].text[0] < b) k++;
        t->special_first[b] = k;
    }
    return LOOM_OK;
}

/* Special ids (each checked), BOS and space-prefix defaults of the family,
 * and the end-of-generation set: the usual end texts plus eos/eot/eom. */
static void tok_set_ids(loom_tokenizer *t, const loom_tokenizer_spec *spec) {
    t->bos = tok_check_id(t, spec->bos_id, "bos");
    t->eos = tok_check_id(t, spec->eos_id, "eos");
    t->unk = tok_check_id(t, spec->unk_id, "unknown");
    t->unk_bytes = t->unk >= 0;
    t->eot = tok_check_id(t, spec->eot_id, "eot");
    t->eom = tok_check_id(t, spec->eom_id, "eom");
    t->pad = tok_check_id(t, spec->pad_id, "padding");
    t->add_bos = spec->add_bos >= 0 ? spec->add_bos != 0 : t->kind == TOK_SPM;
    t->add_space_prefix = spec->add_space_prefix >= 0 ? spec->add_space_prefix != 0 : t->kind == TOK_SPM;
    if (t->kind == TOK_BYTELEVEL) t->add_space_prefix = false;
    if (t->add_bos && t->bos < 0) t->add_bos = false;

    static const char *const eog_text[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
        "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|return|>", "<|call|>", NULL};
    for (const char *const *e = eog_text; *e; e++) {
        int32_t id = tok_map_find(&t->text_map, *e, strlen(*e));
        if (id >= 0 && t->types[id] != LOOM_TOKEN_NORMAL) t->eog[id] = 1;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
}

static loom_status tok_copy_template(loom_tokenizer *t, const loom_tokenizer_spec *spec, loom_error *err) {
    if (!spec->chat_template) return LOOM_OK;
    size_t n = spec->chat_template_len ? spec->chat_template_len : strlen(spec->chat_template);
    if (!(t->chat_template = loom_strndup(spec->chat_template, n)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    return LOOM_OK;
}

/* Arenas, maps, merges, specials, ids, template, pre-tokenizer: each step
 * reads only what the ones before it built. */
loom_status tok_build(const loom_tokenizer_spec *spec, const tok_build_opts *opts,
                      loom_tokenizer **out, loom_error *err) {
    static const tok_build_opts no_opts;
    loom_status st = LOOM_OK;
    loom_tokenizer *t = NULL;
    tok_kind kind = 0;
    if (!opts) opts = &no_opts;
    if (!spec || !out) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: NULL argument");
    *out = NULL;
    if ((st = tok_check_spec(spec, opts, &kind, err))) return st;

    t = calloc(1, sizeof *t);
    if (!t) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    snprintf(t->model_name, sizeof t->model_name, "%s", kind == TOK_SPM ? "llama" : "gpt2");
    t->n_vocab = spec->n_vocab;
    if ((st = tok_build_arenas(t, spec, err))) goto free_t;
    if ((st = tok_build_maps(t, err))) goto free_t;
    if (spec->n_merges > 0 && (st = tok_build_merges(t, spec, err))) goto free_t;
    t->ignore_merges = opts->ignore_merges;
    t->bl_prefix_space = opts->bl_prefix_space;
    t->spm_prefix_first = opts->spm_prefix_first;
    t->spm_split = opts->spm_split;
    t->spm_prefix_unless_space = opts->spm_prefix_unless_space;
    if ((st = tok_build_specials(t, opts, err))) goto free_t;
    tok_set_ids(t, spec);
    if ((st = tok_copy_template(t, spec, err))) goto free_t;
    if (!opts->skip_pre) {
        if ((st = tok_set_pre(t, spec->pre, err))) goto free_t;
    } else {
        snprintf(t->pre_name, sizeof t->pre_name, "%s", spec->pre ? spec->pre : "json");
    }
    t->chat_fmt = tok_detect_chat_format(t);
    *out = t;
    return LOOM_OK;
free_t:
    loom_tokenizer_free(t);
    return st;
}

loom_status loom_tokenizer_from_arrays(const loom_tokenizer_spec *spec, loom_tokenizer **out,
                                       loom_error *err) {
    return tok_build(spec, NULL, out, err);
}

void loom_tokenizer_free(loom_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_splits; i++) pcre2_code_free(t->splits[i].re);
    free(t->splits);
    free(t->text_arena);
    free(t->piece_arena);
    free(t->text_off);
    free(t->text_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->eog);
    free(t->text_map.slots);
    free(t->bpe_map.slots);
    free(t->pairs);
    free(t->specials);
    free(t->chat_template);
    free(t);
}

/* ---------------------------------------------------------------- queries */

int32_t loom_tokenizer_vocab_size(const loom_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t loom_tokenizer_bos(const loom_tokenizer *t) { return t ? t->bos : -1; }
int32_t loom_tokenizer_eos(const loom_tokenizer *t) { return t ? t->eos : -1; }
bool loom_tokenizer_adds_bos(const loom_tokenizer *t) { return t && t->add_bos; }

bool loom_tokenizer_is_eog(const loom_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

int32_t loom_tokenizer_find(const loom_tokenizer *t, const char *piece) {
    if (!t || !piece) return -1;
    size_t n = strlen(piece);
    int32_t id = tok_map_find(&t->text_map, piece, n);
    if (id < 0 && t->kind == TOK_BYTELEVEL) id = tok_map_find(&t->bpe_map, piece, n);
    return id;
}

const char *loom_tokenizer_token_text(const loom_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->text_arena + t->text_off[id];
}

loom_token_type loom_tokenizer_token_type(const loom_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return LOOM_TOKEN_UNDEFINED;
    return (loom_token_type)t->types[id];
}

const char *loom_tokenizer_piece(const loom_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_len[id];
    return t->piece_arena + t->piece_off[id];
}

size_t loom_tokenizer_max_piece_len(const loom_tokenizer *t) { return t ? t->max_piece : 0; }
const char *loom_tokenizer_model_name(const loom_tokenizer *t) { return t ? t->model_name : NULL; }
const char *loom_tokenizer_pre_name(const loom_tokenizer *t) { return t ? t->pre_name : NULL; }
const char *loom_tokenizer_chat_template(const loom_tokenizer *t) { return t ? t->chat_template : NULL; }
