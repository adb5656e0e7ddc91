/*
 * core/tokenizer/tok_internal.h — the tokenizer's private layout, shared by
 * the files of core/tokenizer/ only: vocabulary arenas, hash maps, the merge
 * table, pre-tokenizer steps and the helpers the loaders and the encoder share.
 */
#ifndef LOOM_CORE_TOK_INTERNAL_H
#define LOOM_CORE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

typedef enum tok_kind {
    TOK_BYTELEVEL = 1, /* GPT-2 byte<->unicode mapping; merges by rank */
    TOK_SPM = 2,       /* SentencePiece BPE: ▁ for spaces, scores or merges, <0xNN> */
} tok_kind;

/* How a split step turns matches into pieces (HF SplitDelimiterBehavior). */
typedef enum tok_split_behavior {
    TOK_SPLIT_ISOLATED = 0,     /* matches and the gaps between are pieces */
    TOK_SPLIT_REMOVED,          /* gaps only                               */
    TOK_SPLIT_MERGED_PREV,      /* match glued to the gap before it        */
    TOK_SPLIT_MERGED_NEXT,      /* match glued to the gap after it         */
    TOK_SPLIT_CONTIGUOUS,       /* runs of adjacent matches are one piece  */
} tok_split_behavior;

typedef struct tok_split {
    pcre2_code *re;
    tok_split_behavior behavior;
    bool invert; /* the pattern matches the pieces, not the delimiters */
} tok_split;

/* Open-addressing map from a token's bytes to its id. Keys live in the
 * tokenizer's arenas: slot -> id -> (off, len) in `arena`. */
typedef struct tok_strmap {
    int32_t *slots;       /* [mask+1], -1 empty */
    uint32_t mask;
    const char *arena;    /* set after the arena stops moving */
    const uint32_t *off;  /* [n_vocab] */
    const uint32_t *len;  /* [n_vocab] */
} tok_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_pair_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX empty */
    int32_t rank;
    int32_t result;
} tok_pair_slot;

typedef struct tok_special {
    int32_t id;
    uint32_t len;
    const char *text; /* into text arena */
    bool always;      /* USER_DEFINED / non-special added token: matched without parse_special */
    bool lstrip, rstrip;
} tok_special;

struct loom_tokenizer {
    tok_kind kind;
    char model_name[16];
    char pre_name[48];
    int32_t n_vocab;

    /* Token text as stored (NUL-terminated in the arena) and the bytes it
     * decodes to. */
    char *text_arena;
    uint32_t *text_off, *text_len;
    char *piece_arena;
    uint32_t *piece_off, *piece_len;
    float *scores;   /* [n_vocab] or NULL */
    uint8_t *types;  /* [n_vocab] loom_token_type */
    uint8_t *eog;    /* [n_vocab] 0/1 */
    size_t max_piece;

    tok_strmap text_map;  /* stored text -> id (all tokens)                      */
    tok_strmap bpe_map;   /* what BPE may produce: piece bytes (byte-level) or text (SPM) -> id */

    tok_pair_slot *pairs; /* merges; NULL when merging by scores */
    uint32_t pair_mask;
    bool ignore_merges;   /* whole pre-token in vocab wins (Llama 3)  */
    int32_t byte_tok[256]; /* single-byte token (byte-level) or <0xNN> (SPM); -1 none */

    tok_special *specials; /* sorted: first byte, then longest first */
    int32_t n_specials;
    int32_t special_first[257]; /* specials[special_first[b] .. special_first[b+1]) start with b */

    int32_t bos, eos, unk, eot, eom, pad;
    bool unk_bytes; /* bytes no token spells encode as unk (else dropped) */
    bool add_bos;
    bool add_space_prefix;   /* SPM: ▁ before the first fragment and after specials */
    bool spm_prefix_first;   /* ...but only before the fragment at offset 0 (Metaspace "first") */
    bool spm_split;          /* SPM: BPE each ▁-initial word separately (Metaspace split) */
    bool spm_prefix_unless_space; /* no ▁ added when the fragment starts with a space (Metaspace) */
    bool bl_prefix_space;    /* ByteLevel(add_prefix_space): space before each fragment */

    tok_split *splits;
    int32_t n_splits;

    char *chat_template;
    loom_chat_format chat_fmt;
};

/* Build-time options beyond the public spec (tokenizer.json). */
typedef struct tok_build_opts {
    bool skip_pre;          /* caller installs splits itself */
    int force_kind;         /* 0, TOK_BYTELEVEL or TOK_SPM */
    bool ignore_merges;
    bool bl_prefix_space;
    bool spm_prefix_first;
    bool spm_split;
    bool spm_prefix_unless_space;
    const uint8_t *lstrip;  /* [n_vocab] or NULL */
    const uint8_t *rstrip;  /* [n_vocab] or NULL */
} tok_build_opts;

loom_status tok_build(const loom_tokenizer_spec *spec, const tok_build_opts *opts,
                      loom_tokenizer **out, loom_error *err);
/* Compile and append one split step. */
loom_status tok_add_split(loom_tokenizer *t, const char *pattern, size_t pattern_len,
                          bool literal, tok_split_behavior behavior, bool invert, loom_error *err);
/* Install the regex list of a GGUF pre-tokenizer family. */
loom_status tok_set_pre(loom_tokenizer *t, const char *pre, loom_error *err);
int32_t tok_map_find(const tok_strmap *m, const char *s, size_t n);

static inline uint64_t tok_pair_hash(uint64_t k) { /* murmur3 finaliser */
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

/* The merge of (a, b), or NULL. */
static inline const tok_pair_slot *tok_pair_find(const loom_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = (uint32_t)tok_pair_hash(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const tok_pair_slot *p = &t->pairs[i];
        if (p->key == key) return p;
        if (p->key == UINT64_MAX) return NULL;
    }
}

/* UTF-8: 1 = valid char of *adv bytes; 0 = valid prefix cut by the end of
 * the buffer; -1 = invalid, *adv = length of the maximal ill-formed subpart. */
int tok_utf8_next(const unsigned char *s, size_t n, size_t *adv);

/* Growable byte buffer. */
/* Bytes [start, end) of a text. */
typedef struct tok_span {
    size_t start, end;
} tok_span;

/* loom_tokenizer_encode(), except that inside the sorted, disjoint spans
 * `plain` special tokens are not parsed (user-defined added tokens still are):
 * how message content is encoded inside a chat template. */
loom_status tok_encode_spans(const loom_tokenizer *t, const char *text, size_t len, bool add_bos,
                             bool parse_special, const tok_span *plain, size_t n_plain, int32_t **ids,
                             int32_t *n, loom_error *err);

typedef struct tok_buf {
    char *p;
    size_t n, cap;
    bool oom;
} tok_buf;
void tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_puts(tok_buf *b, const char *s);

loom_chat_format tok_detect_chat_format(const loom_tokenizer *t);

#endif
