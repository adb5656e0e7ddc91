/*
 * core/tokenizer/encode.c — text -> ids.
 *
 * Three stages: (1) special/added tokens are cut out of the text first
 * (leftmost, longest); (2) each remaining fragment is pre-tokenized — for
 * byte-level BPE by the family's PCRE2 split steps, for SentencePiece by
 * turning spaces into ▁ — (3) each piece is merged by BPE: a linked list of
 * symbols and a binary heap of candidate pairs ordered by (priority, left
 * position), O(n log n) per piece. Priority is the merge rank (byte-level,
 * or tokenizer.json merges) or minus the merged token's score (GGUF
 * SentencePiece). Symbols the vocabulary lacks fall back to byte tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

typedef struct bpe_sym {
    int32_t id;          /* token of this symbol's bytes, -1 if none */
    int32_t prev, next;  /* neighbours, -1 at the ends */
    uint32_t start, len; /* bytes of the piece; len 0 = merged away */
} bpe_sym;

typedef struct bpe_cand {
    double prio;         /* lower merges first */
    int32_t left, right; /* symbol indices */
    uint32_t size;       /* left.len + right.len when queued: stale check */
    int32_t result;
} bpe_cand;

typedef struct tok_range {
    uint32_t start, len;
    bool delim;
} tok_range;

typedef struct enc_ctx {
    const loom_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    bool oom;
    bpe_sym *sym;
    size_t sym_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
    tok_range *pa, *pb, *seg; /* piece lists (current, next) and one piece's segments */
    size_t pa_cap, pb_cap, seg_cap;
    pcre2_match_data *md;
    tok_buf scratch;
} enc_ctx;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void push_id(enc_ctx *c, int32_t id) {
    if (c->oom) return;
    if (!grow((void **)&c->ids, &c->cap, c->n + 1, sizeof *c->ids)) { c->oom = true; return; }
    c->ids[c->n++] = id;
}

/* --------------------------------------------------------------- the heap */

static bool cand_less(const bpe_cand *a, const bpe_cand *b) {
    if (a->prio != b->prio) return a->prio < b->prio;
    return a->left < b->left;
}

static void heap_push(enc_ctx *c, bpe_cand v) {
    if (!grow((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap)) { c->oom = true; return; }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&v, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = v;
}

static bpe_cand heap_pop(enc_ctx *c) {
    bpe_cand top = c->heap[0];
    bpe_cand last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_cand *best = &last;
        if (l < n && cand_less(&c->heap[l], best)) { m = l; best = &c->heap[l]; }
        if (r < n && cand_less(&c->heap[r], best)) { m = r; }
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* --------------------------------------------------------------------- BPE */

static void try_pair(enc_ctx *c, const char *s, int32_t l, int32_t r) {
    const loom_tokenizer *t = c->t;
    bpe_sym *a = &c->sym[l], *b = &c->sym[r];
    if (t->pairs) {
        if (a->id < 0 || b->id < 0) return;
        const tok_pair_slot *p = tok_pair_find(t, a->id, b->id);
        if (p) heap_push(c, (bpe_cand){(double)p->rank, l, r, a->len + b->len, p->result});
        return;
    }
    /* SentencePiece scores: the merged bytes must be a token; best score first. */
    int32_t id = tok_map_find(&t->bpe_map, s + a->start, a->len + b->len);
    if (id < 0) return;
    double score = t->scores ? (double)t->scores[id] : 0.0;
    heap_push(c, (bpe_cand){-score, l, r, a->len + b->len, id});
}

static void emit_fallback(enc_ctx *c, const char *s, uint32_t n) {
    const loom_tokenizer *t = c->t;
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = t->byte_tok[(unsigned char)s[i]];
        if (b >= 0) push_id(c, b);
        else if (t->unk_bytes && (i == 0 || t->byte_tok[(unsigned char)s[i - 1]] >= 0))
            push_id(c, t->unk); /* one <unk> per run of unencodable bytes */
    }
}

/* Merge one pre-token `s` (n bytes). */
static void bpe_piece(enc_ctx *c, const char *s, size_t n) {
    const loom_tokenizer *t = c->t;
    if (n == 0 || c->oom) return;
    if (t->ignore_merges || n == 1) {
        int32_t id = tok_map_find(&t->bpe_map, s, n);
        if (id >= 0) { push_id(c, id); return; }
    }
    if (!grow((void **)&c->sym, &c->sym_cap, n, sizeof *c->sym)) { c->oom = true; return; }
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t adv = 1;
        if (t->kind == TOK_SPM) (void)tok_utf8_next((const unsigned char *)s + i, n - i, &adv);
        int32_t id = t->kind == TOK_BYTELEVEL ? t->byte_tok[(unsigned char)s[i]]
                                              : tok_map_find(&t->bpe_map, s + i, adv);
        c->sym[ns] = (bpe_sym){id, ns - 1, ns + 1, (uint32_t)i, (uint32_t)adv};
        ns++;
        i += adv;
    }
    c->sym[ns - 1].next = -1;
    c->heap_n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) try_pair(c, s, i, i + 1);
    while (c->heap_n > 0 && !c->oom) {
        bpe_cand m = heap_pop(c);
        bpe_sym *a = &c->sym[m.left], *b = &c->sym[m.right];
        if (a->len == 0 || b->len == 0 || a->next != m.right || a->len + b->len != m.size) continue;
        a->len += b->len;
        a->id = m.result;
        a->next = b->next;
        if (b->next >= 0) c->sym[b->next].prev = m.left;
        b->len = 0;
        if (a->prev >= 0) try_pair(c, s, a->prev, m.left);
        if (a->next >= 0) try_pair(c, s, m.left, a->next);
    }
    for (int32_t i = 0; i >= 0; i = c->sym[i].next) {
        const bpe_sym *y = &c->sym[i];
        if (y->id >= 0) push_id(c, y->id);
        else emit_fallback(c, s + y->start, y->len);
    }
}

/* ------------------------------------------------------- pre-tokenization */

static void add_range(enc_ctx *c, tok_range **arr, size_t *cap, size_t *n, uint32_t start,
                      uint32_t len, bool delim) {
    if (len == 0) return;
    if (!grow((void **)arr, cap, *n + 1, sizeof **arr)) { c->oom = true; return; }
    (*arr)[(*n)++] = (tok_range){start, len, delim};
}

/* Append segment [start, start+len) (may be empty) to the segment list. */
static void add_seg(enc_ctx *c, size_t *n, uint32_t start, uint32_t len, bool delim) {
    if (!grow((void **)&c->seg, &c->seg_cap, *n + 1, sizeof *c->seg)) { c->oom = true; return; }
    c->seg[(*n)++] = (tok_range){start, len, delim};
}

/* Cut piece [0, pl) of subj into gaps and matches, as Hugging Face's
 * Pattern::find_matches over onig's find_iter: an empty match right where
 * the previous match ended is skipped (the search moves on one character),
 * a match may be empty (it still separates pieces), and a match at the very
 * end (pl) is possible. Segment starts are offset by ps. Returns the count. */
static size_t find_segments(enc_ctx *c, const tok_split *sp, const unsigned char *subj, uint32_t ps,
                            uint32_t pl) {
    size_t nseg = 0;
    PCRE2_SIZE last_end = 0, prev = 0, last_match = PCRE2_UNSET;
    while (last_end <= pl && !c->oom) {
        int rc = pcre2_match(sp->re, subj, pl, last_end, 0, c->md, NULL);
        if (rc < 0) break; /* no match (or a match error: rest is a gap) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me <= ms && last_match == me) { /* empty, right after the last match */
            if (last_end >= pl) break;
            size_t adv = 1;
            (void)tok_utf8_next(subj + last_end, pl - last_end, &adv);
            last_end += adv;
            continue;
        }
        if (me < ms) me = ms; /* \K in a lookahead: treat as empty */
        last_end = last_match = me;
        if (ms > prev) add_seg(c, &nseg, ps + (uint32_t)prev, (uint32_t)(ms - prev), sp->invert);
        add_seg(c, &nseg, ps + (uint32_t)ms, (uint32_t)(me - ms), !sp->invert);
        prev = me;
    }
    if (prev < pl) add_seg(c, &nseg, ps + (uint32_t)prev, (uint32_t)(pl - prev), sp->invert);
    return nseg;
}

/* Fold segments into pieces by the split's behavior, as Hugging Face's
 * NormalizedString::split: pieces may be empty here (dropped by the caller);
 * `prev` is whether the previous segment was a match. */
static void fold_segments(enc_ctx *c, const tok_split *sp, size_t nseg, size_t first, size_t *nb) {
    bool prev = false;
    for (size_t k = 0; k < nseg && !c->oom; k++) {
        size_t i = sp->behavior == TOK_SPLIT_MERGED_NEXT ? nseg - 1 - k : k;
        tok_range g = c->seg[i];
        bool join = false;
        switch (sp->behavior) {
        case TOK_SPLIT_ISOLATED: break;
        case TOK_SPLIT_REMOVED:
            if (g.delim) continue;
            break;
        case TOK_SPLIT_MERGED_PREV:
        case TOK_SPLIT_MERGED_NEXT: join = g.delim && !prev; break;
        case TOK_SPLIT_CONTIGUOUS: join = g.delim == prev; break;
        }
        prev = g.delim;
        if (join && *nb > first) {
            tok_range *last = &c->pb[*nb - 1]; /* pieces are adjacent: grow toward g */
            if (sp->behavior == TOK_SPLIT_MERGED_NEXT) last->start = g.start;
            last->len += g.len;
            continue;
        }
        if (!grow((void **)&c->pb, &c->pb_cap, *nb + 1, sizeof *c->pb)) { c->oom = true; return; }
        c->pb[(*nb)++] = (tok_range){g.start, g.len, false};
    }
}

/* Split piece [ps, ps+pl) of s by one step; append the non-empty results to pb. */
static void split_piece(enc_ctx *c, const tok_split *sp, const char *s, uint32_t ps, uint32_t pl,
                        size_t *nb) {
    size_t nseg = find_segments(c, sp, (const unsigned char *)s + ps, ps, pl);
    if (c->oom) return;
    size_t first = *nb; /* pieces from this parent start here */
    fold_segments(c, sp, nseg, first, nb);
    if (c->oom) return;
    if (sp->behavior == TOK_SPLIT_MERGED_NEXT) /* folded back to front: restore text order */
        for (size_t i = first, j = *nb; i + 1 < j; i++, j--) {
            tok_range tmp = c->pb[i]; c->pb[i] = c->pb[j - 1]; c->pb[j - 1] = tmp;
        }
    size_t keep = first;
    for (size_t i = first; i < *nb; i++)
        if (c->pb[i].len > 0) c->pb[keep++] = c->pb[i];
    *nb = keep;
}

static void encode_bytelevel(enc_ctx *c, const char *s, size_t n) {
    const loom_tokenizer *t = c->t;
    if (t->bl_prefix_space && n > 0 && s[0] != ' ') {
        c->scratch.n = 0;
        tok_buf_put(&c->scratch, " ", 1);
        tok_buf_put(&c->scratch, s, n);
        if (c->scratch.oom) { c->oom = true; return; }
        s = c->scratch.p;
        n = c->scratch.n;
    }
    size_t na = 0;
    add_range(c, &c->pa, &c->pa_cap, &na, 0, (uint32_t)n, false);
    for (int32_t k = 0; k < t->n_splits && !c->oom; k++) {
        size_t nb = 0;
        for (size_t i = 0; i < na && !c->oom; i++) split_piece(c, &t->splits[k], s, c->pa[i].start, c->pa[i].len, &nb);
        tok_range *tmp = c->pa; c->pa = c->pb; c->pb = tmp;
        size_t tc = c->pa_cap; c->pa_cap = c->pb_cap; c->pb_cap = tc;
        na = nb;
    }
    for (size_t i = 0; i < na && !c->oom; i++) bpe_piece(c, s + c->pa[i].start, c->pa[i].len);
}

static void encode_spm(enc_ctx *c, const char *s, size_t n, bool prefix) {
    const loom_tokenizer *t = c->t;
    c->scratch.n = 0;
    if (prefix && t->add_space_prefix && !(t->spm_prefix_unless_space && s[0] == ' '))
        tok_buf_put(&c->scratch, "\xE2\x96\x81", 3);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ') continue;
        tok_buf_put(&c->scratch, s + run, i - run);
        tok_buf_put(&c->scratch, "\xE2\x96\x81", 3);
        run = i + 1;
    }
    tok_buf_put(&c->scratch, s + run, n - run);
    if (c->scratch.oom) { c->oom = true; return; }
    if (!t->spm_split) {
        bpe_piece(c, c->scratch.p, c->scratch.n);
        return;
    }
    /* Metaspace split: each word starts at a ▁ (the ▁ joins the word after it). */
    const char *p = c->scratch.p;
    size_t start = 0;
    for (size_t i = 1; i + 3 <= c->scratch.n; i++) {
        if (memcmp(p + i, "\xE2\x96\x81", 3) != 0) continue;
        bpe_piece(c, p + start, i - start);
        start = i;
        i += 2;
    }
    bpe_piece(c, p + start, c->scratch.n - start);
}

/* at_start: the fragment begins the text; after_special: it follows a
 * special token (or begins the text). */
static void encode_fragment(enc_ctx *c, const char *s, size_t n, bool at_start, bool after_special) {
    if (n == 0) return;
    if (c->t->kind == TOK_SPM) encode_spm(c, s, n, c->t->spm_prefix_first ? at_start : after_special);
    else encode_bytelevel(c, s, n);
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Does [pos, end) overlap a plain span? *cur walks the sorted spans. */
static bool in_plain(const tok_span *plain, size_t n_plain, size_t *cur, size_t pos, size_t end) {
    while (*cur < n_plain && plain[*cur].end <= pos) (*cur)++;
    return *cur < n_plain && plain[*cur].start < end;
}

/* The special token that text[pos..] starts with, or NULL. Outside
 * parse_special, and anywhere inside a plain span, only the `always` ones
 * (user-defined added tokens) count. */
static const tok_special *special_at(const loom_tokenizer *t, const char *text, size_t len, size_t pos,
                                     bool parse_special, const tok_span *plain, size_t n_plain, size_t *cur) {
    unsigned char b = (unsigned char)text[pos];
    for (int32_t k = t->special_first[b]; k < t->special_first[b + 1]; k++) {
        const tok_special *sp = &t->specials[k];
        if (sp->len > len - pos || memcmp(text + pos, sp->text, sp->len) != 0) continue;
        if (sp->always) return sp;
        if (parse_special && !in_plain(plain, n_plain, cur, pos, pos + sp->len)) return sp;
    }
    return NULL;
}

loom_status loom_tokenizer_encode(const loom_tokenizer *t, const char *text, size_t len,
                                  bool add_bos, bool parse_special, int32_t **ids, int32_t *n,
                                  loom_error *err) {
    return tok_encode_spans(t, text, len, add_bos, parse_special, NULL, 0, ids, n, err);
}

loom_status tok_encode_spans(const loom_tokenizer *t, const char *text, size_t len, bool add_bos,
                             bool parse_special, const tok_span *plain, size_t n_plain, int32_t **ids,
                             int32_t *n, loom_error *err) {
    if (!ids || !n) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer encode: NULL output");
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len)) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer encode: NULL argument");
    if (len > (size_t)INT32_MAX / 2)
        return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer encode: text of %zu bytes is too long", len);
    loom_status st = LOOM_OK;
    enc_ctx c = {.t = t};
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md || !grow((void **)&c.ids, &c.cap, len / 3 + 16, sizeof *c.ids)) { c.oom = true; goto done; }

    if (add_bos && t->add_bos && t->bos >= 0) push_id(&c, t->bos);
    bool scan = t->n_specials > 0;
    size_t frag = 0, pos = 0, cur = 0;
    bool after_special = true; /* SentencePiece: ▁ before the first fragment */
    while (scan && pos < len && !c.oom) {
        const tok_special *hit = special_at(t, text, len, pos, parse_special, plain, n_plain, &cur);
        if (!hit) { pos++; continue; }
        size_t end = pos;
        if (hit->lstrip) while (end > frag && is_space(text[end - 1])) end--;
        encode_fragment(&c, text + frag, end - frag, frag == 0, after_special);
        push_id(&c, hit->id);
        pos += hit->len;
        if (hit->rstrip) while (pos < len && is_space(text[pos])) pos++;
        frag = pos;
        after_special = true;
    }
    if (!c.oom) encode_fragment(&c, text + frag, len - frag, frag == 0, after_special);
done:
    if (c.oom || c.n > INT32_MAX) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer encode: out of memory for %zu bytes of text", len);
        free(c.ids);
    } else {
        *ids = c.ids;
        *n = (int32_t)c.n;
    }
    free(c.sym);
    free(c.heap);
    free(c.pa);
    free(c.pb);
    free(c.seg);
    free(c.scratch.p);
    pcre2_match_data_free(c.md);
    return st;
}
