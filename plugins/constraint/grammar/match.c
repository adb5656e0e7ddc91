/*
 * plugins/constraint/grammar/match.c — the pushdown matcher and the token
 * masks: the set of parse stacks the text so far allows (gram.h), advanced
 * one code point at a time, with the UTF-8 decoding state shared by every
 * stack (all see the same bytes).
 *
 * A mask is one walk of the vocabulary's byte trie (built once per vocab
 * view): at each trie node the parse state after that prefix is derived
 * from its parent's, a subtree whose prefix leaves the language is pruned,
 * and the tokens ending at a surviving node are allowed. Sets live in one
 * arena of int32 that the walk rewinds on the way back up, so a mask
 * allocates nothing once the arena has grown. A set is encoded flat:
 * [stacks, (length, positions bottom..top)...]. Two shortcuts keep the
 * first mask of a state cheap (a string state's walk would visit ~100 000
 * nodes of a real vocabulary): a dense row per interned set says what each
 * byte leads to, and a subtree whose bytes all lie in the set's uniform
 * class of its depth (dense_uni) is allowed, whole or down to a length,
 * without a visit. gram_compiled.ref_walk turns both off (the tests'
 * reference).
 *
 * Masks are cached by whole state and by cut key (fill_cut: the stacks'
 * shared bottom frames, which a token cannot reach in fewer than
 * CUT_MIN_REACH code points, replaced by one marker frame; the tokens that
 * do pop into it are left to a walk with the whole stacks), so the same
 * place in each of many repeated items shares one mask.
 *
 * Limits: a stack deeper than max_stack_depth is dropped (the text may not
 * nest deeper), and at most max_stacks stacks are kept; dropping a stack
 * only narrows what is allowed, so everything allowed still parses.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

/* ----------------------------------------------------------------- trie */

typedef struct tnode {
    int32_t edge_first, n_edges;
    int32_t tok_first, n_toks;
} tnode;

struct vtrie {
    tnode *nodes;
    int32_t n_nodes, cap_nodes;
    uint8_t *edge_byte;        /* (n_edges)                                  */
    int32_t *edge_child;
    int32_t n_edges, cap_edges;
    int32_t *toks;             /* token ids, grouped by node                 */
    int32_t n_toks;
    int32_t *sub_end;          /* (n_nodes) nodes are numbered in preorder:
                                * node i's subtree is [i, sub_end[i])        */
    /* What lies below node i, for the walk's shortcut (uniform_below): the
     * ASCII bytes on the edges of its subtree and the longest path down,
     * in bytes (SUB_NONE: a byte >= 0x80 below, or deeper than
     * UNI_MAX_DEPTH). Tokens are numbered in preorder too, so the tokens
     * below node i are toks[tok_first + n_toks .. tok_end(sub_end[i])). */
    uint64_t (*sub_bytes)[2];  /* (n_nodes)                                  */
    uint8_t *sub_depth;        /* (n_nodes)                                  */
    uint16_t *node_depth;      /* (n_nodes) bytes of the node's prefix       */
    uint16_t *tok_depth;       /* (n_toks) bytes of each token in toks       */
};

/* The shortcut covers subtrees at most this deep (bytes below the node). */
#define UNI_MAX_DEPTH 32
#define SUB_NONE 0xFF

/* Longest piece the trie holds; a longer token is never allowed. */
#define VTRIE_MAX_PIECE 1024

typedef struct vt_tok {
    const uint8_t *b;
    size_t n;
    int32_t id;
} vt_tok;

static int vt_cmp(const void *a, const void *b) {
    const vt_tok *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->b, y->b, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool vt_grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t nc = *cap ? *cap * 2 : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

/* The node for tokens [lo, hi), which share their first `depth` bytes. */
static int32_t vt_node(vtrie *t, const vt_tok *tk, int32_t lo, int32_t hi, size_t depth) {
    if (!vt_grow((void **)&t->nodes, &t->cap_nodes, t->n_nodes + 1, sizeof(tnode))) return -1;
    int32_t id = t->n_nodes++;
    int32_t i = lo;
    t->nodes[id].tok_first = t->n_toks;
    while (i < hi && tk[i].n == depth) t->toks[t->n_toks++] = tk[i++].id;
    t->nodes[id].n_toks = t->n_toks - t->nodes[id].tok_first;
    int32_t groups = 0;
    for (int32_t j = i; j < hi; j++)
        if (j == i || tk[j].b[depth] != tk[j - 1].b[depth]) groups++;
    int32_t first = t->n_edges;
    if (t->n_edges + groups > t->cap_edges) return -1; /* sized for every prefix up front */
    t->n_edges += groups;
    t->nodes[id].edge_first = first;
    t->nodes[id].n_edges = groups;
    int32_t g = 0;
    for (int32_t j = i; j < hi;) {
        int32_t k = j;
        while (k < hi && tk[k].b[depth] == tk[j].b[depth]) k++;
        int32_t child = vt_node(t, tk, j, k, depth + 1);
        if (child < 0) return -1;
        t->edge_byte[first + g] = tk[j].b[depth];
        t->edge_child[first + g] = child;
        g++;
        j = k;
    }
    return id;
}

loom_status vtrie_build(const loom_vocab_view *v, vtrie **out, char *why, size_t cap) {
    *out = NULL;
    vt_tok *tk = malloc((size_t)(v->size > 0 ? v->size : 1) * sizeof *tk);
    vtrie *t = calloc(1, sizeof *t);
    int32_t n = 0;
    size_t bytes = 0;
    if (tk && t) {
        for (int32_t id = 0; id < v->size; id++) {
            size_t len = 0;
            const char *b = v->piece(v->ctx, id, &len);
            if (!b || len == 0 || len > VTRIE_MAX_PIECE) continue;
            tk[n++] = (vt_tok){(const uint8_t *)b, len, id};
            bytes += len;
        }
        qsort(tk, (size_t)n, sizeof *tk, vt_cmp);
        /* every edge is a distinct prefix of some token: at most `bytes` */
        t->edge_child = malloc((bytes + 1) * sizeof(int32_t));
        t->edge_byte = malloc(bytes + 1);
        t->cap_edges = (int32_t)bytes + 1;
        t->toks = malloc((size_t)(n + 1) * sizeof(int32_t));
    }
    if (!tk || !t || !t->edge_child || !t->edge_byte || !t->toks || vt_node(t, tk, 0, n, 0) != 0) {
        free(tk);
        vtrie_free(t);
        snprintf(why, cap, "out of memory building the vocabulary trie");
        return LOOM_ERR_NOMEM;
    }
    free(tk);
    if (!(t->sub_end = malloc((size_t)t->n_nodes * sizeof *t->sub_end))) {
        vtrie_free(t);
        snprintf(why, cap, "out of memory building the vocabulary trie");
        return LOOM_ERR_NOMEM;
    }
    t->sub_bytes = calloc((size_t)t->n_nodes, sizeof *t->sub_bytes);
    t->sub_depth = malloc((size_t)t->n_nodes);
    t->node_depth = malloc((size_t)t->n_nodes * sizeof *t->node_depth);
    t->tok_depth = malloc((size_t)(t->n_toks + 1) * sizeof *t->tok_depth);
    if (!t->sub_bytes || !t->sub_depth || !t->node_depth || !t->tok_depth) {
        vtrie_free(t);
        snprintf(why, cap, "out of memory building the vocabulary trie");
        return LOOM_ERR_NOMEM;
    }
    for (int32_t i = t->n_nodes - 1; i >= 0; i--) { /* children come after their parent */
        const tnode *nd = &t->nodes[i];
        t->sub_end[i] = nd->n_edges ? t->sub_end[t->edge_child[nd->edge_first + nd->n_edges - 1]] : i + 1;
        int depth = 0;
        for (int32_t e = nd->edge_first; e < nd->edge_first + nd->n_edges; e++) {
            const uint8_t b = t->edge_byte[e];
            const int32_t c = t->edge_child[e];
            int d = t->sub_depth[c] == SUB_NONE || b >= 0x80 ? SUB_NONE : 1 + t->sub_depth[c];
            if (d > UNI_MAX_DEPTH) d = SUB_NONE;
            if (d > depth) depth = d;
            if (b < 0x80) t->sub_bytes[i][b >> 6] |= 1ull << (b & 63);
            t->sub_bytes[i][0] |= t->sub_bytes[c][0];
            t->sub_bytes[i][1] |= t->sub_bytes[c][1];
        }
        t->sub_depth[i] = (uint8_t)depth;
    }
    t->node_depth[0] = 0;
    for (int32_t i = 0; i < t->n_nodes; i++) { /* parents come before their children */
        const tnode *nd = &t->nodes[i];
        for (int32_t e = nd->edge_first; e < nd->edge_first + nd->n_edges; e++)
            t->node_depth[t->edge_child[e]] = (uint16_t)(t->node_depth[i] + 1); /* pieces <= VTRIE_MAX_PIECE */
        for (int32_t k = nd->tok_first; k < nd->tok_first + nd->n_toks; k++) t->tok_depth[k] = t->node_depth[i];
    }
    *out = t;
    return LOOM_OK;
}

void vtrie_free(vtrie *t) {
    if (!t) return;
    free(t->nodes);
    free(t->edge_byte);
    free(t->edge_child);
    free(t->toks);
    free(t->sub_end);
    free(t->sub_bytes);
    free(t->sub_depth);
    free(t->node_depth);
    free(t->tok_depth);
    free(t);
}

/* ---------------------------------------------------------------- UTF-8 */

typedef struct utf8_state {
    uint32_t val;              /* bits so far                                */
    int8_t need;               /* continuation bytes still to come           */
    int8_t len;                /* bytes of the character being read          */
} utf8_state;

/* 1: a code point completed (*cp), 0: more bytes needed, -1: invalid. */
static int utf8_step(utf8_state *u, uint8_t b, uint32_t *cp) {
    if (u->need == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        if (b >= 0xC2 && b <= 0xDF) *u = (utf8_state){b & 0x1Fu, 1, 2};
        else if (b >= 0xE0 && b <= 0xEF) *u = (utf8_state){b & 0x0Fu, 2, 3};
        else if (b >= 0xF0 && b <= 0xF4) *u = (utf8_state){b & 0x07u, 3, 4};
        else return -1;
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    u->val = (u->val << 6) | (b & 0x3Fu);
    if (--u->need > 0) return 0;
    const uint32_t v = u->val;
    const int8_t len = u->len;
    *u = (utf8_state){0};
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
    if ((len == 3 && v < 0x800) || (len == 4 && v < 0x10000)) return -1; /* overlong */
    *cp = v;
    return 1;
}

/* The code points a partly read character may still become. */
static void utf8_span(const utf8_state *u, uint32_t *lo, uint32_t *hi) {
    int shift = 6 * u->need;
    const uint32_t least = u->len == 4 ? 0x10000 : u->len == 3 ? 0x800 : 0x80; /* shorter forms are overlong */
    *lo = u->val << shift;
    *hi = *lo | ((1u << shift) - 1u);
    if (*lo < least) *lo = least;
    if (*hi > 0x10FFFF) *hi = 0x10FFFF;
}

/* -------------------------------------------------------------- matcher */

typedef struct dedup_slot {
    uint32_t epoch;            /* the set it belongs to                      */
    int32_t off;               /* arena offset of the stack's length word    */
} dedup_slot;

struct gmatch {
    const gram_compiled *c;
    dedup_slot *dedup;         /* (dedup_cap) stacks of the set being built  */
    uint32_t dedup_cap, dedup_epoch;
    int32_t *cur;              /* the current set, encoded                   */
    int32_t cur_len, cur_cap;
    utf8_state u;
    bool terminated;
    int32_t *arena;            /* scratch sets                               */
    int32_t arena_len, arena_cap;
    int32_t *buf;              /* one stack being expanded                   */
    int32_t buf_cap;
    int32_t out_off;           /* the set being emitted into (arena offset)  */
    bool oom;
    /* Stacks whose top is a reference, expanded already into the set being
     * built (tagged by its epoch, as dedup): a stack reached again by
     * another path (a repetition whose body can match nothing, nested in
     * another; alternatives that end in the same rule) would only emit what
     * the first visit emitted, so it is not expanded twice. Without this
     * the paths, not the stacks, are walked: exponentially many. */
    dedup_slot *visit;         /* (visit_cap) offsets into vstk             */
    uint32_t visit_cap, visit_n;
    int32_t *vstk;             /* the visited stacks: (length, frames)...    */
    int32_t vstk_len, vstk_cap;
    /* Work budget: expansion steps of the current mask or accepted token
     * (max_match_steps); past it `over` stops every expansion and the
     * operation fails. */
    int64_t steps, steps_total;
    bool over;
    /* The walk's memo, kept across masks: sets interned by content, and
     * (interned set, code point) -> interned set or -1 (nothing survives). */
    int32_t *iset;             /* interned sets, encoded back to back        */
    int32_t iset_len, iset_cap;
    int32_t *itab;             /* (itab_cap) offsets into iset, -1 empty     */
    int32_t itab_cap, icount;
    uint64_t *tkey;            /* (tcap) (set << 21 | cp) + 1, 0 empty       */
    int32_t *tval;
    int32_t tcap, tcount;
    /* Dense rows of that memo for the walk: per interned set met at a
     * character boundary, what each byte leads to (a set, DT_PARTIAL, -1
     * pruned, -3 a hole; DT_UNKNOWN until asked), so the walk's step at a
     * trie node is an array read, not a hash probe. A set's row index is
     * the word before it in iset (-1: none yet). */
    int32_t *drow;             /* (n_drows * 256)                            */
    struct dense_uni *duni;    /* (n_drows) the rows' uniform classes        */
    int32_t n_drows, cap_drows;
    int64_t uni_whole, uni_cut; /* subtrees decided without a visit: whole, cut at a depth */
    /* A walk of a set whose stacks' bottom frames are cut off (a hole,
     * below): `hole` is set when an expansion pops into it, `cut_abort`
     * when the walk must be given up (a set reached max_stacks, or too
     * many tokens depend on the frames cut off). */
    bool cut, hole, cut_abort;
    int32_t *unc;              /* trie nodes whose subtrees depend on the cut frames */
    int32_t n_unc, unc_cap;
    int64_t unc_nodes;         /* their subtrees' sizes, summed              */
};

/* A hole: the bottom k frames of a stack, cut off for a cache key shared
 * by every context they stand for, encoded as one frame -1 - k (frames
 * are element indices, never negative). */
static int32_t hole_frames(int32_t marker) { return -1 - marker; }

static bool arena_room(gmatch *m, int32_t more) {
    if (m->arena_len + more <= m->arena_cap) return true;
    if (!vt_grow((void **)&m->arena, &m->arena_cap, m->arena_len + more, sizeof(int32_t))) {
        m->oom = true;
        return false;
    }
    return true;
}

/* FNV-1a over n ints: the hash of stacks, sets and cache keys. */
static uint64_t hash_ints(const int32_t *x, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)x[i]) * 1099511628211ull;
    return h;
}

/* Start a new set at the arena's end (its count word); emit() adds to it. */
static int32_t set_begin(gmatch *m) {
    if (!arena_room(m, 1)) return -1;
    m->out_off = m->arena_len;
    m->arena[m->arena_len++] = 0;
    if (++m->dedup_epoch == 0) { /* wrapped: no slot may hold a stale epoch 0 */
        memset(m->dedup, 0, m->dedup_cap * sizeof *m->dedup);
        if (m->visit) memset(m->visit, 0, m->visit_cap * sizeof *m->visit);
        m->dedup_epoch = 1;
    }
    m->visit_n = 0;
    m->vstk_len = 0;
    return m->out_off;
}

/* Add buf[0..len) to the set at out_off unless it is there already (a
 * hash of the set's stacks, tagged by the set's epoch, finds duplicates
 * without scanning). */
static void emit(gmatch *m, int32_t len) {
    const uint64_t h = hash_ints(m->buf, len);
    const uint32_t mask = m->dedup_cap - 1;
    uint32_t j = (uint32_t)(h ^ (h >> 32)) & mask;
    for (; m->dedup[j].epoch == m->dedup_epoch; j = (j + 1) & mask) {
        int32_t at = m->dedup[j].off;
        if (m->arena[at] == len && !memcmp(m->arena + at + 1, m->buf, (size_t)len * sizeof(int32_t))) return;
    }
    if (m->arena[m->out_off] >= m->c->lim.max_stacks) {
        if (m->cut) m->cut_abort = true;
        return;
    }
    if (!arena_room(m, len + 1)) return;
    m->dedup[j] = (dedup_slot){m->dedup_epoch, m->arena_len};
    m->arena[m->arena_len++] = len;
    memcpy(m->arena + m->arena_len, m->buf, (size_t)len * sizeof(int32_t));
    m->arena_len += len;
    m->arena[m->out_off]++;
}

static void expand(gmatch *m, int32_t len, int depth);

/* Whether buf[0..len) was expanded already into the set being built;
 * records it when not. At most VISIT_MAX_INTS ints of stacks are recorded
 * per set (4 MiB): past that, or when memory runs out, a stack is expanded
 * again (only slower; the budget, max_match_steps, bounds the work). */
#define VISIT_MAX_INTS (1 << 20)
static bool visited(gmatch *m, int32_t len) {
    /* hashing (and recording) a stack costs its length: charged to the
     * budget, so max_match_steps bounds the time of deep stacks too */
    m->steps += len >> 4;
    if (2 * (m->visit_n + 1) > m->visit_cap) {
        uint32_t nc = m->visit_cap ? 2 * m->visit_cap : 256;
        dedup_slot *t = calloc(nc, sizeof *t);
        if (!t) return false;
        for (int32_t at = 0; at < m->vstk_len; at += 1 + m->vstk[at]) { /* rehash this set's stacks */
            uint64_t h = hash_ints(m->vstk + at + 1, m->vstk[at]);
            uint32_t j = (uint32_t)(h ^ (h >> 32)) & (nc - 1);
            while (t[j].epoch == m->dedup_epoch) j = (j + 1) & (nc - 1);
            t[j] = (dedup_slot){m->dedup_epoch, at};
        }
        free(m->visit);
        m->visit = t;
        m->visit_cap = nc;
    }
    const uint64_t h = hash_ints(m->buf, len);
    const uint32_t mask = m->visit_cap - 1;
    uint32_t j = (uint32_t)(h ^ (h >> 32)) & mask;
    for (; m->visit[j].epoch == m->dedup_epoch; j = (j + 1) & mask) {
        int32_t at = m->visit[j].off;
        if (m->vstk[at] == len && !memcmp(m->vstk + at + 1, m->buf, (size_t)len * sizeof(int32_t))) return true;
    }
    if (m->vstk_len + len + 1 > VISIT_MAX_INTS ||
        !vt_grow((void **)&m->vstk, &m->vstk_cap, m->vstk_len + len + 1, sizeof(int32_t)))
        return false;
    m->visit[j] = (dedup_slot){m->dedup_epoch, m->vstk_len};
    m->vstk[m->vstk_len] = len;
    memcpy(m->vstk + m->vstk_len + 1, m->buf, (size_t)len * sizeof(int32_t));
    m->vstk_len += len + 1;
    m->visit_n++;
    return false;
}

/* Every alternative of rule r on top of buf[0..base). */
static void expand_alts(gmatch *m, int32_t r, int32_t base, int depth) {
    const gram *g = &m->c->g;
    for (int32_t a = g->rule_start[r];;) {
        if (g->elems[a].type == G_ALT || g->elems[a].type == G_END) {
            expand(m, base, depth + 1); /* an empty alternative */
        } else if (base < m->buf_cap) {
            m->buf[base] = a;
            expand(m, base + 1, depth + 1);
        }
        while (g->elems[a].type != G_ALT && g->elems[a].type != G_END) a++;
        if (g->elems[a].type == G_END) break;
        a++;
    }
}

/* Expand buf[0..len) until its top is a class (or it is empty), emitting
 * each result. */
static void expand(gmatch *m, int32_t len, int depth) {
    /* a cut stack is as deep as the frames it stands for */
    const int32_t real = len > 0 && m->buf[0] < 0 ? len - 1 + hole_frames(m->buf[0]) : len;
    /* a full set takes nothing more: stop expanding (only narrows the mask) */
    if (m->arena[m->out_off] >= m->c->lim.max_stacks) {
        if (m->cut) m->cut_abort = true; /* which stacks a full set keeps depends on the cut frames */
        return;
    }
    if (depth > 4096 || real > m->c->lim.max_stack_depth || m->over) return;
    if (++m->steps > m->c->lim.max_match_steps && m->c->lim.max_match_steps > 0) {
        m->over = true; /* the operation fails (gmatch_over_budget) */
        return;
    }
    if (len == 0) {
        emit(m, 0);
        return;
    }
    const gram *g = &m->c->g;
    int32_t pos = m->buf[len - 1];
    if (pos < 0) { /* popped into the cut frames: what follows depends on them */
        m->hole = true;
        return;
    }
    if (g->elems[pos].type == G_CLASS) {
        emit(m, len);
        return;
    }
    if (visited(m, len)) return;
    /* a reference: continue after it, beneath the rule's alternatives */
    int32_t next = pos + 1, base = len - 1;
    if (g->elems[next].type != G_ALT && g->elems[next].type != G_END) m->buf[base++] = next;
    expand_alts(m, g->elems[pos].arg, base, depth);
}

static int32_t set_count(const gmatch *m, int32_t off) { return m->arena[off]; }

/* A new operation (a mask, a token, the start) gets the whole budget. */
static void budget_start(gmatch *m) {
    if (m->vstk_cap > (1 << 16)) { /* a hostile grammar's visited stacks are not kept between operations */
        free(m->vstk);
        free(m->visit);
        m->vstk = NULL, m->visit = NULL;
        m->vstk_cap = m->vstk_len = 0;
        m->visit_cap = m->visit_n = 0;
    }
    m->steps_total += m->steps;
    m->steps = 0;
    m->over = false;
}

bool gmatch_over_budget(const gmatch *m) { return m->over; }
void gmatch_walk_stats(const gmatch *m, int64_t *whole, int64_t *cut) {
    *whole = m->uni_whole;
    *cut = m->uni_cut;
}
int64_t gmatch_steps(const gmatch *m) { return m->steps_total + m->steps; }
const gram_compiled *gmatch_grammar(const gmatch *m) { return m->c; }

/* Where a set lives: the scratch arena (rewound as the walk returns) or
 * the interned sets (kept while the memo lasts). */
static const int32_t *set_base(const gmatch *m, bool interned) { return interned ? m->iset : m->arena; }

/* A new set at the arena's end: the stacks of set `in` whose top class
 * holds cp, advanced past it. Returns its offset. */
static int32_t advance(gmatch *m, bool interned, int32_t in, uint32_t cp) {
    const gram *g = &m->c->g;
    int32_t saved_out = m->out_off;
    int32_t out = set_begin(m);
    if (out < 0) return -1;
    int32_t at = in + 1, n = set_base(m, interned)[in];
    for (int32_t s = 0; s < n; s++) {
        const int32_t *src = set_base(m, interned); /* the arena may have moved */
        int32_t len = src[at];
        int32_t top = len > 0 ? src[at + len] : -1;
        if (len > 0 && gram_class_has(g, g->elems[top].arg, cp) && len <= m->buf_cap) {
            memcpy(m->buf, src + at + 1, (size_t)len * sizeof(int32_t));
            int32_t next = top + 1, l = len - 1;
            if (g->elems[next].type != G_ALT && g->elems[next].type != G_END) m->buf[l++] = next;
            expand(m, l, 0);
        }
        at += 1 + len;
    }
    m->out_off = saved_out;
    return out;
}

/* Some code point in [lo, hi] is in class cls. */
static bool class_meets(const gram *g, int32_t cls, uint32_t lo, uint32_t hi) {
    const g_class *c = &g->classes[cls];
    if (c->count == 0) return c->negated;
    const uint32_t *r = g->ranges + 2 * c->first;
    for (int32_t i = 0; i < c->count; i++) {
        bool overlap = r[2 * i] <= hi && r[2 * i + 1] >= lo;
        if (!c->negated && overlap) return true;
        if (c->negated && r[2 * i] <= lo && r[2 * i + 1] >= hi) return false;
    }
    return c->negated;
}

/* Some stack of set `in` can take a character that starts as u does. */
static bool partial_fits(const gmatch *m, bool interned, int32_t in, const utf8_state *u) {
    const gram *g = &m->c->g;
    const int32_t *src = set_base(m, interned);
    uint32_t lo, hi;
    utf8_span(u, &lo, &hi);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false; /* only surrogates or nothing left */
    int32_t at = in + 1, n = src[in];
    for (int32_t s = 0; s < n; s++) {
        int32_t len = src[at];
        if (len > 0 && class_meets(g, g->elems[src[at + len]].arg, lo, hi)) return true;
        at += 1 + len;
    }
    return false;
}

static bool set_has_empty(const int32_t *set) {
    int32_t at = 1;
    for (int32_t s = 0; s < set[0]; s++) {
        if (set[at] == 0) return true;
        at += 1 + set[at];
    }
    return false;
}

/* Copy the current set to the start of the arena; returns its offset (0). */
static int32_t load_cur(gmatch *m) {
    m->arena_len = 0;
    if (!arena_room(m, m->cur_len)) return -1;
    memcpy(m->arena, m->cur, (size_t)m->cur_len * sizeof(int32_t));
    m->arena_len = m->cur_len;
    return 0;
}

static bool store_cur(gmatch *m, int32_t off) {
    int32_t end = off + 1;
    for (int32_t s = 0; s < m->arena[off]; s++) end += 1 + m->arena[end];
    int32_t len = end - off;
    if (!vt_grow((void **)&m->cur, &m->cur_cap, len, sizeof(int32_t))) return false;
    memcpy(m->cur, m->arena + off, (size_t)len * sizeof(int32_t));
    m->cur_len = len;
    return true;
}

loom_status gmatch_new(const gram_compiled *c, gmatch **out, char *why, size_t cap) {
    gmatch *m = calloc(1, sizeof *m);
    *out = NULL;
    if (!m) goto oom;
    m->c = c;
    m->buf_cap = (int32_t)c->lim.max_stack_depth + 2;
    m->dedup_cap = 16;
    while (m->dedup_cap < 4 * (uint64_t)c->lim.max_stacks) m->dedup_cap *= 2;
    if (!(m->buf = malloc((size_t)m->buf_cap * sizeof(int32_t))) ||
        !(m->dedup = calloc(m->dedup_cap, sizeof *m->dedup)) || set_begin(m) != 0)
        goto oom;
    budget_start(m);
    expand_alts(m, c->g.root, 0, 0);
    if (m->over) {
        gmatch_free(m);
        snprintf(why, cap, "the grammar's start took more than max_match_steps (%lld) parse-stack expansion steps: "
                 "it is too ambiguous to match within the budget", (long long)c->lim.max_match_steps);
        return LOOM_ERR_UNSUPPORTED;
    }
    if (m->oom || !store_cur(m, 0)) goto oom;
    *out = m;
    return LOOM_OK;
oom:
    gmatch_free(m);
    snprintf(why, cap, "out of memory starting a matcher");
    return LOOM_ERR_NOMEM;
}

void gmatch_free(gmatch *m) {
    if (!m) return;
    free(m->dedup);
    free(m->visit);
    free(m->vstk);
    free(m->iset);
    free(m->itab);
    free(m->tkey);
    free(m->tval);
    free(m->drow);
    free(m->duni);
    free(m->cur);
    free(m->arena);
    free(m->buf);
    free(m->unc);
    free(m);
}

/* The bytes keep the text in the language; commit: advance to after them. */
static bool accept_bytes(gmatch *m, const uint8_t *b, size_t n, bool commit) {
    if (m->terminated) return false;
    budget_start(m);
    int32_t set = load_cur(m);
    if (set < 0) return false;
    utf8_state u = m->u;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        int r = utf8_step(&u, b[i], &cp);
        if (r < 0) return false;
        if (r == 0) {
            if (!partial_fits(m, false, set, &u)) return false;
            continue;
        }
        if ((set = advance(m, false, set, cp)) < 0 || m->over || set_count(m, set) == 0) return false;
    }
    if (!commit) return !m->oom;
    if (m->oom || !store_cur(m, set)) return false;
    m->u = u;
    return true;
}

bool gmatch_accept_bytes(gmatch *m, const uint8_t *b, size_t n) { return accept_bytes(m, b, n, true); }

bool gmatch_can_end(const gmatch *m) { return !m->terminated && m->u.need == 0 && set_has_empty(m->cur); }
bool gmatch_terminated(const gmatch *m) { return m->terminated; }

static bool is_eog(const loom_vocab_view *v, int32_t token) {
    for (int32_t i = 0; i < v->num_eog; i++)
        if (v->eog[i] == token) return true;
    return false;
}

bool gmatch_accept_token(gmatch *m, int32_t token) {
    const loom_vocab_view *v = m->c->vocab;
    m->over = false; /* a refusal below is not the previous operation's budget */
    if (token < 0 || token >= v->size || m->terminated) return false;
    if (is_eog(v, token)) {
        if (!gmatch_can_end(m)) return false;
        m->terminated = true;
        return true;
    }
    size_t len = 0;
    const char *b = v->piece(v->ctx, token, &len);
    if (!b || len == 0) return false;
    return gmatch_accept_bytes(m, (const uint8_t *)b, len);
}

/* ------------------------------------------------------------ mask cache */

typedef struct mc_entry {
    uint64_t hash, used;       /* used: the shard's clock at the last hit    */
    int32_t *key;              /* the encoded set then the UTF-8 state       */
    int32_t key_len;
    uint32_t *mask;            /* NULL: a cut key whose walk was given up    */
    int32_t *unc;              /* (n_unc) trie nodes a cut key's mask leaves
                                * to a walk with the whole stacks           */
    int32_t n_unc;
} mc_entry;

/* The cache is split by key hash into shards, each with its own lock and an
 * open-addressed index (2x its entries, slots hold entry indices, -1 empty),
 * so the step's mask workers rarely wait on one another and a lookup costs
 * one probe sequence whatever the cache's size. */
#define MC_SHARDS 16

typedef struct mc_shard {
    pthread_mutex_t mu;
    mc_entry *e;
    int32_t *slot;             /* (2 * cap) entry index or -1                */
    int32_t n, cap;
    uint64_t clock;
} mc_shard;

struct mask_cache {
    mc_shard sh[MC_SHARDS];
    size_t words;
    _Atomic int64_t hits, misses; /* masks served from an entry / by a walk */
    _Atomic int64_t cut_hits, cut_misses, unc_walks; /* through cut keys     */
};

mask_cache *mask_cache_new(int32_t entries, int32_t vocab) {
    if (entries <= 0) return NULL;
    mask_cache *mc = calloc(1, sizeof *mc);
    if (!mc) return NULL;
    mc->words = LOOM_MASK_WORDS(vocab);
    for (int32_t i = 0; i < MC_SHARDS; i++) pthread_mutex_init(&mc->sh[i].mu, NULL);
    for (int32_t i = 0; i < MC_SHARDS; i++) {
        mc_shard *sh = &mc->sh[i];
        sh->cap = (entries + MC_SHARDS - 1 - i) / MC_SHARDS; /* the shards' caps sum to entries */
        if (sh->cap == 0) continue;
        sh->e = calloc((size_t)sh->cap, sizeof *sh->e);
        sh->slot = malloc((size_t)sh->cap * 2 * sizeof *sh->slot);
        if (!sh->e || !sh->slot) {
            mask_cache_free(mc);
            return NULL;
        }
        memset(sh->slot, 0xFF, (size_t)sh->cap * 2 * sizeof *sh->slot);
    }
    return mc;
}

void mask_cache_free(mask_cache *mc) {
    if (!mc) return;
    for (int32_t s = 0; s < MC_SHARDS; s++) {
        mc_shard *sh = &mc->sh[s];
        for (int32_t i = 0; i < sh->n; i++) {
            free(sh->e[i].key);
            free(sh->e[i].mask);
            free(sh->e[i].unc);
        }
        free(sh->e);
        free(sh->slot);
        pthread_mutex_destroy(&sh->mu);
    }
    free(mc);
}

void mask_cache_stats(mask_cache *mc, int64_t *hits, int64_t *misses) {
    *hits = mc->hits;
    *misses = mc->misses;
}

void mask_cache_cut_stats(mask_cache *mc, int64_t *hits, int64_t *misses, int64_t *unc_walks) {
    *hits = mc->cut_hits;
    *misses = mc->cut_misses;
    *unc_walks = mc->unc_walks;
}

static mc_shard *shard_of(mask_cache *mc, uint64_t h) { return &mc->sh[(h >> 59) & (MC_SHARDS - 1)]; }

/* The index slot holding key, or the empty slot where it would go. */
static int32_t shard_find(const mc_shard *sh, const int32_t *key, int32_t len, uint64_t h) {
    const uint32_t n = (uint32_t)sh->cap * 2;
    uint32_t j = (uint32_t)(h % n);
    for (;; j = j + 1 == n ? 0 : j + 1) {
        int32_t i = sh->slot[j];
        if (i < 0) return (int32_t)j;
        const mc_entry *e = &sh->e[i];
        if (e->hash == h && e->key_len == len && !memcmp(e->key, key, (size_t)len * sizeof *key)) return (int32_t)j;
    }
}

/* Rebuild the index after an eviction: open addressing cannot just clear
 * the evicted entry's slot (a later key's probe may run through it). */
static void shard_reindex(mc_shard *sh) {
    memset(sh->slot, 0xFF, (size_t)sh->cap * 2 * sizeof *sh->slot);
    for (int32_t i = 0; i < sh->n; i++)
        if (sh->e[i].key) sh->slot[shard_find(sh, sh->e[i].key, sh->e[i].key_len, sh->e[i].hash)] = i;
}

/* The matcher's state as a cache key in m->arena (after the set), its hash. */
static int32_t state_key(gmatch *m, uint64_t *hash) {
    if (!arena_room(m, m->cur_len + 3)) return -1;
    int32_t off = m->arena_len;
    memcpy(m->arena + off, m->cur, (size_t)m->cur_len * sizeof(int32_t));
    m->arena[off + m->cur_len] = (int32_t)m->u.val;
    m->arena[off + m->cur_len + 1] = m->u.need;
    m->arena[off + m->cur_len + 2] = m->u.len;
    *hash = hash_ints(m->arena + off, m->cur_len + 3);
    return off;
}

static bool unc_room(gmatch *m, int32_t n);

/* 1: found, its mask copied and its uncertain nodes into m->unc; -1: a
 * given-up cut key; 0: absent (or no room for the nodes). */
static int cache_get(mask_cache *mc, gmatch *m, const int32_t *key, int32_t len, uint64_t h, uint32_t *mask) {
    mc_shard *sh = shard_of(mc, h);
    int r = 0;
    pthread_mutex_lock(&sh->mu);
    int32_t i = sh->cap ? sh->slot[shard_find(sh, key, len, h)] : -1; /* a cache smaller than its shards */
    if (i >= 0) {
        const mc_entry *e = &sh->e[i];
        if (!e->mask) {
            r = -1;
        } else if (unc_room(m, e->n_unc)) {
            memcpy(mask, e->mask, mc->words * sizeof *mask);
            if (e->n_unc > 0) memcpy(m->unc, e->unc, (size_t)e->n_unc * sizeof *e->unc);
            m->n_unc = e->n_unc;
            r = 1;
        }
        sh->e[i].used = ++sh->clock;
    }
    pthread_mutex_unlock(&sh->mu);
    return r;
}

/* Keep mask under key in its shard, evicting the shard's least recently
 * used entry when full (nothing is kept when memory runs out: caching is
 * only a saving; a key another worker put meanwhile is kept once). */
static void cache_put(mask_cache *mc, const int32_t *key, int32_t len, uint64_t h, const uint32_t *mask,
                      const int32_t *unc, int32_t n_unc) {
    mc_shard *sh = shard_of(mc, h);
    if (sh->cap == 0) return;
    int32_t *k = malloc((size_t)len * sizeof *k);
    uint32_t *mk = mask ? malloc(mc->words * sizeof *mk) : NULL;
    int32_t *uk = n_unc > 0 ? malloc((size_t)n_unc * sizeof *uk) : NULL;
    if (!k || (mask && !mk) || (n_unc > 0 && !uk)) {
        free(k);
        free(mk);
        free(uk);
        return;
    }
    memcpy(k, key, (size_t)len * sizeof *k);
    if (mask) memcpy(mk, mask, mc->words * sizeof *mk);
    if (n_unc > 0) memcpy(uk, unc, (size_t)n_unc * sizeof *uk);
    pthread_mutex_lock(&sh->mu);
    if (sh->slot[shard_find(sh, key, len, h)] >= 0) {
        pthread_mutex_unlock(&sh->mu);
        free(k);
        free(mk);
        free(uk);
        return;
    }
    int32_t at = sh->n;
    if (sh->n == sh->cap) {
        at = 0;
        for (int32_t i = 1; i < sh->n; i++)
            if (sh->e[i].used < sh->e[at].used) at = i;
        free(sh->e[at].key);
        free(sh->e[at].mask);
        free(sh->e[at].unc);
        sh->e[at] = (mc_entry){0};
        shard_reindex(sh);
    } else {
        sh->n++;
    }
    sh->e[at] = (mc_entry){.hash = h, .used = ++sh->clock, .key = k, .key_len = len, .mask = mk, .unc = uk,
                           .n_unc = n_unc};
    sh->slot[shard_find(sh, key, len, h)] = at;
    pthread_mutex_unlock(&sh->mu);
}

/* ----------------------------------------------------------------- masks */

static void allow_node(const vtrie *t, const tnode *nd, uint32_t *mask) {
    for (int32_t i = 0; i < nd->n_toks; i++) {
        int32_t id = t->toks[nd->tok_first + i];
        mask[id >> 5] |= 1u << (id & 31);
    }
}

/* ------------------------------------------------------------- the memo */

/* The memo grows with the distinct states a walk meets; past these it is
 * dropped before the next mask. */
#define MEMO_MAX_INTS (1 << 21)
#define MEMO_MAX_TRANS (1 << 20)
#define DROWS_MAX 1024         /* dense rows, 1.5 KiB each with their levels */

static int32_t set_len_of(const int32_t *set) {
    int32_t end = 1;
    for (int32_t s = 0; s < set[0]; s++) end += 1 + set[end];
    return end;
}

static void memo_reset(gmatch *m) {
    m->iset_len = m->icount = m->tcount = m->n_drows = 0;
    if (m->itab) memset(m->itab, 0xFF, (size_t)m->itab_cap * sizeof(int32_t));
    if (m->tkey) memset(m->tkey, 0, (size_t)m->tcap * sizeof(uint64_t));
}

static bool itab_grow(gmatch *m) {
    int32_t nc = m->itab_cap ? 2 * m->itab_cap : 1024;
    int32_t *t = malloc((size_t)nc * sizeof *t);
    if (!t) return false;
    memset(t, 0xFF, (size_t)nc * sizeof *t);
    for (int32_t i = 0; i < m->itab_cap; i++) {
        int32_t off = m->itab[i];
        if (off < 0) continue;
        uint64_t h = hash_ints(m->iset + off, set_len_of(m->iset + off));
        size_t j = h & (size_t)(nc - 1);
        while (t[j] >= 0) j = (j + 1) & (size_t)(nc - 1);
        t[j] = off;
    }
    free(m->itab);
    m->itab = t;
    m->itab_cap = nc;
    return true;
}

/* The interned copy of the encoded set at x; -1 when out of memory. */
static int32_t intern(gmatch *m, const int32_t *x) {
    int32_t len = set_len_of(x);
    if (2 * (m->icount + 1) > m->itab_cap && !itab_grow(m)) return -1;
    uint64_t h = hash_ints(x, len);
    size_t j = h & (size_t)(m->itab_cap - 1);
    for (; m->itab[j] >= 0; j = (j + 1) & (size_t)(m->itab_cap - 1)) {
        const int32_t *y = m->iset + m->itab[j];
        if (set_len_of(y) == len && !memcmp(x, y, (size_t)len * sizeof *x)) return m->itab[j];
    }
    if (!vt_grow((void **)&m->iset, &m->iset_cap, m->iset_len + len + 1, sizeof(int32_t))) return -1;
    m->iset[m->iset_len] = -1; /* no dense row yet */
    memcpy(m->iset + m->iset_len + 1, x, (size_t)len * sizeof *x);
    m->itab[j] = m->iset_len + 1;
    m->icount++;
    m->iset_len += len + 1;
    return m->itab[j];
}

static bool trans_grow(gmatch *m) {
    int32_t nc = m->tcap ? 2 * m->tcap : 4096;
    uint64_t *k = calloc((size_t)nc, sizeof *k);
    int32_t *v = malloc((size_t)nc * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    for (int32_t i = 0; i < m->tcap; i++) {
        if (!m->tkey[i]) continue;
        size_t j = (m->tkey[i] * 0x9E3779B97F4A7C15ull) >> 20 & (size_t)(nc - 1);
        while (k[j]) j = (j + 1) & (size_t)(nc - 1);
        k[j] = m->tkey[i];
        v[j] = m->tval[i];
    }
    free(m->tkey);
    free(m->tval);
    m->tkey = k;
    m->tval = v;
    m->tcap = nc;
    return true;
}

/* Slot of (set, cp) in the transition table; *found says whether it holds it. */
static int64_t trans_slot(gmatch *m, int32_t set, uint32_t cp, bool *found) {
    *found = false;
    if (2 * (m->tcount + 1) > m->tcap && !trans_grow(m)) return -1;
    uint64_t key = (((uint64_t)set << 21) | cp) + 1;
    size_t j = (key * 0x9E3779B97F4A7C15ull) >> 20 & (size_t)(m->tcap - 1);
    for (; m->tkey[j]; j = (j + 1) & (size_t)(m->tcap - 1))
        if (m->tkey[j] == key) {
            *found = true;
            return (int64_t)j;
        }
    m->tkey[j] = key;
    m->tcount++;
    return (int64_t)j;
}

/* The interned set after cp from interned set `set`: -1 when nothing
 * survives, -2 when out of memory, -3 (a cut set) when some stack pops
 * into its cut frames, -4 (a cut set) when the walk must be given up, -5
 * past the work budget (m->over). */
static int32_t step_interned(gmatch *m, int32_t set, uint32_t cp) {
    bool found;
    int64_t slot = trans_slot(m, set, cp, &found);
    if (slot < 0) return -2;
    if (found) return m->tval[slot];
    int32_t mark = m->arena_len;
    m->hole = false;
    int32_t off = advance(m, true, set, cp), next;
    if (off < 0) next = -2;
    else if (m->over) next = -5;
    else if (m->cut_abort) next = -4;
    else if (m->hole) next = -3;
    else if (m->arena[off] == 0) next = -1;
    else if ((next = intern(m, m->arena + off)) < 0) next = -2;
    m->arena_len = mark;
    if (next == -2 || next == -4 || next == -5) {
        m->tkey[slot] = 0; /* not kept: out of memory, a given-up walk, or cut short by the budget */
        m->tcount--;
        return next;
    }
    m->tval[slot] = next;
    return next;
}

/* Nodes whose tokens a cut walk leaves to a walk with the whole stacks:
 * few and small, or the cut is not worth its key. */
#define UNC_MAX_NODES 32
#define UNC_MAX_SUBTREE 1024

static bool unc_room(gmatch *m, int32_t n) {
    return vt_grow((void **)&m->unc, &m->unc_cap, n > 0 ? n : 1, sizeof *m->unc);
}

/* What a dense row says of a byte not asked yet. */
#define DT_UNKNOWN INT32_MIN
#define DT_PARTIAL (-8)

/* A set's uniform classes: the set most ASCII bytes lead to (succ) and,
 * for d = 1..levels, u[d-1] = the ASCII bytes b such that every string
 * of d bytes drawn from them is a walk through succ, succ's succ, ... (so
 * every one of them survives). A subtree of the trie whose bytes all lie
 * in u[depth-1] is allowed whole, without visiting its nodes. */
typedef struct dense_uni {
    int32_t succ;              /* DT_UNKNOWN until the row is complete; -1 none */
    int32_t levels;
    uint64_t dead[2];          /* the ASCII bytes nothing survives           */
    uint64_t u[UNI_MAX_DEPTH][2];
} dense_uni;

/* Subtrees smaller than this are walked: the shortcut's check would cost
 * about what it saves. A node with fewer edges asks its bytes one by one
 * instead of completing its set's row. */
#define UNI_MIN_NODES 8
#define ROW_MIN_EDGES 8

/* The dense row of interned set `set` (allocated on first use); -1 when
 * the rows are full or memory ran out (the walk then probes the hash). */
static int32_t dense_row(gmatch *m, int32_t set) {
    int32_t r = m->iset[set - 1];
    if (r >= 0 || m->n_drows >= DROWS_MAX) return r;
    if (m->n_drows == m->cap_drows) {
        int32_t nc = m->cap_drows ? 2 * m->cap_drows : 16;
        int32_t *d = realloc(m->drow, (size_t)nc * 256 * sizeof *d);
        if (d) m->drow = d;
        dense_uni *du = d ? realloc(m->duni, (size_t)nc * sizeof *du) : NULL;
        if (!du) return -1;
        m->duni = du;
        m->cap_drows = nc;
    }
    r = m->n_drows++;
    m->duni[r].succ = DT_UNKNOWN;
    m->duni[r].levels = 0;
    for (int32_t i = 0; i < 256; i++) m->drow[(size_t)r * 256 + i] = DT_UNKNOWN;
    m->iset[set - 1] = r;
    return r;
}

static bool row_complete(gmatch *m, int32_t set, int32_t row);

/* The set after edge byte b from interned set `set` in UTF-8 state *u
 * (updated): >= 0 a set (the same one while a character is partly read),
 * -1 pruned, else step_interned's codes (-2 out of memory, -3 a hole, -4
 * a given-up cut walk, -5 past the budget). At a character boundary the
 * answer comes from the set's dense row, computed once. */
static int32_t edge_next(gmatch *m, int32_t set, utf8_state *u, uint8_t b, bool complete) {
    int32_t row = u->need == 0 && !m->c->ref_walk ? dense_row(m, set) : -1, v = DT_UNKNOWN;
    if (complete && row >= 0 && b < 0x80 && m->drow[(size_t)row * 256 + b] == DT_UNKNOWN &&
        !row_complete(m, set, row))
        return m->oom ? -2 : m->over ? -5 : -4;
    if (row >= 0 && (v = m->drow[(size_t)row * 256 + b]) != DT_UNKNOWN && v != DT_PARTIAL) return v;
    uint32_t cp;
    int r = utf8_step(u, b, &cp);
    if (v == DT_PARTIAL) return set;
    if (r < 0) v = -1;
    else if (r == 1) v = step_interned(m, set, cp);
    else v = partial_fits(m, true, set, u) ? DT_PARTIAL : -1;
    if (row >= 0 && v != -2 && v != -4 && v != -5) m->drow[(size_t)row * 256 + b] = v; /* as step_interned keeps */
    return v == DT_PARTIAL ? set : v;
}

/* Every ASCII byte of interned set `set`'s dense row. advance() depends on
 * a code point only through which stacks' top classes hold it, so bytes
 * with the same such signature lead to the same set: one step_interned a
 * signature (for sets of at most 64 stacks; larger ones ask every byte).
 * false when a step stopped the walk (as edge_next's would). */
static bool row_complete(gmatch *m, int32_t set, int32_t row) {
    const gram *g = &m->c->g;
    uint64_t sig[0x80] = {0}, dsig[0x80];
    int32_t dval[0x80], nd = 0;
    const int32_t *src = m->iset + set, n = src[0];
    const bool group = n <= 64;
    for (int32_t s = 0, at = 1; s < n && group; s++) {
        const int32_t len = src[at];
        if (len > 0 && len <= m->buf_cap) { /* the class's ranges, clipped to ASCII */
            const g_class *c = &g->classes[g->elems[src[at + len]].arg];
            uint64_t in[2] = {0, 0};
            for (int32_t i = 0; i < c->count; i++) {
                const uint32_t lo = g->ranges[2 * (c->first + i)], hi = g->ranges[2 * (c->first + i) + 1];
                for (uint32_t b = lo; b <= hi && b < 0x80; b++) in[b >> 6] |= 1ull << (b & 63);
            }
            for (int32_t b = 0; b < 0x80; b++)
                if ((bool)((in[b >> 6] >> (b & 63)) & 1u) != c->negated) sig[b] |= 1ull << s;
        }
        at += 1 + len;
    }
    int32_t *r = m->drow + (size_t)row * 256;
    for (int32_t b = 0; b < 0x80 && group; b++) { /* what the walk asked already */
        int32_t j = 0;
        while (j < nd && dsig[j] != sig[b]) j++;
        if (r[b] != DT_UNKNOWN && j == nd) dsig[nd] = sig[b], dval[nd++] = r[b];
    }
    for (int32_t b = 0; b < 0x80; b++) {
        if (r[b] != DT_UNKNOWN) continue;
        int32_t j = 0, v;
        while (group && j < nd && dsig[j] != sig[b]) j++;
        if (group && j < nd) {
            v = dval[j];
        } else if (group && sig[b] == 0) {
            v = -1; /* no stack takes it */
        } else {
            v = step_interned(m, set, (uint32_t)b);
            if (v == -2) m->oom = true;
            if (v == -2 || v == -4 || v == -5) return false;
            r = m->drow + (size_t)row * 256;
            if (group) dsig[nd] = sig[b], dval[nd++] = v;
        }
        r[b] = v;
    }
    return true;
}

/* Level d of the uniform classes of interned set `set` (dense_uni) into
 * out; false when the rows are full, or when completing a row stopped the
 * walk (m->oom, m->cut_abort or m->over set: the step_interned codes, as
 * any step of the walk would have). Completing a row asks every ASCII
 * byte, some of which the walk itself might not have asked. */
static bool uni_level(gmatch *m, int32_t set, int32_t d, uint64_t out[2]) {
    const int32_t row = dense_row(m, set);
    if (row < 0) return false;
    if (m->duni[row].succ == DT_UNKNOWN) {
        if (!row_complete(m, set, row)) return false;
        int32_t vote = -1, count = 0;
        for (int32_t b = 0; b < 0x80; b++) {
            const int32_t v = m->drow[(size_t)row * 256 + b];
            if (v < 0) continue;
            if (count == 0) vote = v; /* the majority vote: the set most bytes lead to, if any has most */
            count += v == vote ? 1 : -1;
        }
        dense_uni *du = &m->duni[row];
        du->succ = vote;
        du->u[0][0] = du->u[0][1] = du->dead[0] = du->dead[1] = 0;
        for (int32_t b = 0; b < 0x80; b++) {
            const int32_t v = m->drow[(size_t)row * 256 + b];
            if (v == vote && vote >= 0) du->u[0][b >> 6] |= 1ull << (b & 63);
            if (v == -1) du->dead[b >> 6] |= 1ull << (b & 63);
        }
        du->levels = 1;
    }
    while (m->duni[row].levels < d) {
        const int32_t l = m->duni[row].levels, succ = m->duni[row].succ; /* computing u[l] */
        uint64_t next[2] = {0, 0};
        if (succ >= 0 && (m->duni[row].u[l - 1][0] | m->duni[row].u[l - 1][1]) && !uni_level(m, succ, l, next))
            return false;
        dense_uni *du = &m->duni[row]; /* the rows may have moved */
        du->u[l][0] = du->u[0][0] & next[0];
        du->u[l][1] = du->u[0][1] & next[1];
        du->levels = l + 1;
    }
    out[0] = m->duni[row].u[d - 1][0];
    out[1] = m->duni[row].u[d - 1][1];
    return true;
}

/* The tokens below `node` (not its own) at most `j` bytes longer than
 * its prefix into the mask. */
static void allow_below(const vtrie *t, int32_t node, int32_t j, uint32_t *mask) {
    const int32_t end = t->sub_end[node];
    const int32_t lo = t->nodes[node].tok_first + t->nodes[node].n_toks;
    const int32_t hi = end < t->n_nodes ? t->nodes[end].tok_first : t->n_toks;
    if (j >= t->sub_depth[node]) {
        for (int32_t i = lo; i < hi; i++) mask[t->toks[i] >> 5] |= 1u << (t->toks[i] & 31);
        return;
    }
    const int32_t most = t->node_depth[node] + j;
    for (int32_t i = lo; i < hi; i++)
        if (t->tok_depth[i] <= most) mask[t->toks[i] >> 5] |= 1u << (t->toks[i] & 31);
}

static bool bytes_in(const uint64_t a[2], const uint64_t b[2]) { return !(a[0] & ~b[0]) && !(a[1] & ~b[1]); }

/* The subtree below `node`, reached in interned set `set` at a character
 * boundary, decided without visiting it: returns j when every path down
 * of at most j bytes survives (its bytes all lie in the set's uniform
 * class of level j) and every longer one dies at its (j+1)-th byte (the
 * set j uniform steps on takes none of the subtree's bytes); j is the
 * subtree's depth when every path survives. -1: walk it. */
static int32_t uniform_below(gmatch *m, int32_t node, int32_t set) {
    const vtrie *t = m->c->trie;
    const int d = t->sub_depth[node];
    if (d == SUB_NONE || d == 0 || t->sub_end[node] - node < UNI_MIN_NODES) return -1;
    const uint64_t *bytes = t->sub_bytes[node];
    int32_t j = 0; /* levels 1..j hold the bytes: computed one at a time, as far as they do */
    for (uint64_t u[2]; j < d; j++)
        if (!uni_level(m, set, j + 1, u) || !bytes_in(bytes, u)) break;
    if (j == d) return d;
    if (j == 0 || m->oom || m->cut_abort || m->over) return -1;
    int32_t row = m->iset[set - 1]; /* level j + 1 of `set` made the rows of the chain's first j + 1 sets */
    for (int32_t l = 0; l < j; l++) row = m->iset[m->duni[row].succ - 1];
    if (row < 0 || m->duni[row].succ == DT_UNKNOWN || !bytes_in(bytes, m->duni[row].dead)) return -1;
    return j;
}

static void walk(gmatch *m, int32_t node, int32_t set, utf8_state u, uint32_t *mask) {
    const vtrie *t = m->c->trie;
    const tnode *nd = &t->nodes[node];
    if (u.need == 0 && !m->c->ref_walk) {
        const int32_t j = uniform_below(m, node, set);
        if (j > 0) {
            if (j >= t->sub_depth[node]) m->uni_whole++;
            else m->uni_cut++;
            allow_below(t, node, j, mask);
            return;
        }
        if (m->oom || m->cut_abort || m->over) return;
    }
    for (int32_t e = 0; e < nd->n_edges && !m->oom && !m->cut_abort && !m->over; e++) {
        utf8_state u2 = u;
        int32_t child = t->edge_child[nd->edge_first + e];
        int32_t next = edge_next(m, set, &u2, t->edge_byte[nd->edge_first + e], nd->n_edges >= ROW_MIN_EDGES);
        if (next == -2) m->oom = true;
        if (next == -3) { /* this subtree depends on the cut frames: left to the whole stacks */
            m->unc_nodes += t->sub_end[child] - child;
            if (m->n_unc >= UNC_MAX_NODES || m->unc_nodes > UNC_MAX_SUBTREE || !unc_room(m, m->n_unc + 1))
                m->cut_abort = true;
            else
                m->unc[m->n_unc++] = child;
        }
        if (next < 0) continue;
        allow_node(t, &t->nodes[child], mask);
        if (t->nodes[child].n_edges > 0) walk(m, child, next, u2, mask);
    }
}

/* The tokens under the trie nodes unc[lo..hi) (preorder ids, sorted, no
 * one inside another), walked from `node` with the whole stacks. */
static void walk_unc(gmatch *m, int32_t node, int32_t set, utf8_state u, uint32_t *mask, const int32_t *unc,
                     int32_t lo, int32_t hi) {
    const vtrie *t = m->c->trie;
    const tnode *nd = &t->nodes[node];
    for (int32_t e = 0; e < nd->n_edges && lo < hi && !m->oom && !m->over; e++) {
        int32_t child = t->edge_child[nd->edge_first + e], end = t->sub_end[child];
        while (lo < hi && unc[lo] < child) lo++; /* not below this node (cannot happen) */
        int32_t j = lo;
        while (j < hi && unc[j] < end) j++;
        if (j == lo) continue;
        utf8_state u2 = u;
        uint32_t cp;
        int r = utf8_step(&u2, t->edge_byte[nd->edge_first + e], &cp);
        int32_t next = set;
        if (r == 1) {
            next = step_interned(m, set, cp);
            if (next == -2) m->oom = true;
        } else if (r < 0 || !partial_fits(m, true, set, &u2)) {
            next = -1;
        }
        if (next >= 0) {
            if (unc[lo] == child) {
                allow_node(t, &t->nodes[child], mask);
                if (t->nodes[child].n_edges > 0) walk(m, child, next, u2, mask);
            } else {
                walk_unc(m, child, next, u2, mask, unc, lo, j);
            }
        }
        lo = j;
    }
}

/* The current set with the bottom k frames of every stack cut off (each
 * stack keeps at least its top) followed by the UTF-8 state, in the arena:
 * a cache key for every context those frames may hold. Returns its offset;
 * *len its length. */
static int32_t cut_key(gmatch *m, int32_t k, int32_t *len, uint64_t *hash) {
    if (!arena_room(m, m->cur_len + 3)) return -1;
    int32_t off = m->arena_len, w = off + 1, at = 1;
    int32_t *a = m->arena;
    a[off] = m->cur[0];
    for (int32_t s = 0; s < m->cur[0]; s++) {
        int32_t n = m->cur[at];
        a[w++] = n - k + 1;
        a[w++] = -1 - k;
        memcpy(a + w, m->cur + at + 1 + k, (size_t)(n - k) * sizeof *a);
        w += n - k;
        at += 1 + n;
    }
    a[w++] = (int32_t)m->u.val;
    a[w++] = m->u.need;
    a[w++] = m->u.len;
    *len = w - off;
    *hash = hash_ints(a + off, *len);
    return off;
}

/* The frames every stack of the current set shares at its bottom, at most
 * the shortest stack's length less one. */
static int32_t shared_bottom(const gmatch *m) {
    const int32_t *c = m->cur;
    if (c[0] == 0) return 0;
    int32_t k = c[1] - 1;
    for (int32_t s = 0, at = 1; s < c[0] && k > 0; s++) {
        int32_t n = c[at];
        if (n - 1 < k) k = n - 1;
        int32_t i = 0;
        while (i < k && c[at + 1 + i] == c[2 + i]) i++;
        k = i;
        at += 1 + n;
    }
    return k > 0 ? k : 0;
}

static void add_eog(gmatch *m, uint32_t *mask) {
    const loom_vocab_view *v = m->c->vocab;
    if (gmatch_can_end(m))
        for (int32_t i = 0; i < v->num_eog; i++)
            if (v->eog[i] >= 0 && v->eog[i] < v->size) mask[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
}

/* How many cuts a mask tries, the deepest first, and the fewest code
 * points a token must hold to reach a cut's frames (fewer: too many tokens
 * would be left to the whole stacks). */
#define CUT_TRIES 3
#define CUT_MIN_REACH 3

/* The fewest code points that pop some stack of the current set into its
 * bottom k frames. */
static int64_t cut_reach(const gmatch *m, int32_t k) {
    const int32_t *c = m->cur, *rest = m->c->g.min_rest;
    int64_t best = INT64_MAX;
    for (int32_t s = 0, at = 1; s < c[0]; s++) {
        int64_t sum = 0;
        for (int32_t i = k; i < c[at]; i++) sum += rest[c[at + 1 + i]];
        if (sum < best) best = sum;
        at += 1 + c[at];
    }
    return best;
}

/* The mask through a cut key (the frames below where a token can reach
 * are left out, so the same place in each of many repeated items shares
 * one entry): from the cache, or one walk of the cut set, which leaves the
 * tokens that reach the cut frames (m->unc) to a walk of the whole set.
 * Returns 1 when done (*hit: from the cache), 0 when no cut serves (a
 * plain key then), -1 out of memory. */
static int fill_cut(gmatch *m, uint32_t *mask, bool *hit) {
    mask_cache *mc = m->c->cache;
    int32_t top = shared_bottom(m), base = m->arena_len;
    while (top >= 1 && cut_reach(m, top) < CUT_MIN_REACH) top--;
    for (int32_t k = top; k >= 1 && k > top - CUT_TRIES; k--) {
        int32_t len;
        uint64_t h;
        m->arena_len = base;
        int32_t key = cut_key(m, k, &len, &h);
        if (key < 0) return -1;
        m->arena_len = key + len;
        int r = cache_get(mc, m, m->arena + key, len, h, mask);
        if (r < 0) continue;
        *hit = r > 0;
        if (r == 0) {
            int32_t set = intern(m, m->arena + key);
            if (set < 0) return -1;
            m->cut = true;
            m->cut_abort = false;
            m->n_unc = 0;
            m->unc_nodes = 0;
            walk(m, 0, set, m->u, mask);
            m->cut = false;
            if (m->oom || m->over) return -1;
            if (m->cut_abort) {
                m->cut_abort = false;
                memset(mask, 0, LOOM_MASK_WORDS(m->c->vocab->size) * sizeof(uint32_t));
                cache_put(mc, m->arena + key, len, h, NULL, NULL, 0);
                continue;
            }
            add_eog(m, mask);
            cache_put(mc, m->arena + key, len, h, mask, m->unc, m->n_unc);
        }
        atomic_fetch_add(*hit ? &mc->cut_hits : &mc->cut_misses, 1);
        if (m->n_unc > 0) {
            atomic_fetch_add(&mc->unc_walks, 1);
            int32_t set = intern(m, m->cur);
            if (set < 0) return -1;
            walk_unc(m, 0, set, m->u, mask, m->unc, 0, m->n_unc);
            if (m->oom || m->over) return -1;
        }
        return 1;
    }
    m->arena_len = base;
    return 0;
}

loom_status gmatch_fill_mask(gmatch *m, uint32_t *mask, char *why, size_t cap) {
    const loom_vocab_view *v = m->c->vocab;
    memset(mask, 0, LOOM_MASK_WORDS(v->size) * sizeof(uint32_t));
    if (m->terminated) return LOOM_OK;
    mask_cache *mc = m->c->cache;
    uint64_t h = 0;
    int32_t key = -1, set;
    m->arena_len = 0;
    budget_start(m);
    if (m->iset_len > MEMO_MAX_INTS || m->tcount > MEMO_MAX_TRANS || m->n_drows >= DROWS_MAX) memo_reset(m);
    if (mc && !m->c->plain_keys && m->c->g.min_rest) {
        bool hit = false;
        int r = fill_cut(m, mask, &hit);
        if (r < 0) goto oom;
        if (r > 0) {
            atomic_fetch_add(hit ? &mc->hits : &mc->misses, 1);
            return LOOM_OK;
        }
    }
    if (mc) {
        if ((key = state_key(m, &h)) < 0) goto oom;
        m->arena_len = key + m->cur_len + 3;
        int r = cache_get(mc, m, m->arena + key, m->cur_len + 3, h, mask);
        atomic_fetch_add(r > 0 ? &mc->hits : &mc->misses, 1);
        if (r > 0) return LOOM_OK;
    }
    if ((set = intern(m, m->cur)) < 0) goto oom;
    walk(m, 0, set, m->u, mask);
    if (m->oom || m->over) goto oom;
    add_eog(m, mask);
    if (key >= 0) cache_put(mc, m->arena + key, m->cur_len + 3, h, mask, NULL, 0);
    return LOOM_OK;
oom:
    m->cut = m->cut_abort = false;
    if (m->over) {
        memset(mask, 0, LOOM_MASK_WORDS(v->size) * sizeof(uint32_t));
        m->oom = false;
        snprintf(why, cap, "one token mask took more than max_match_steps (%lld) parse-stack expansion steps: the "
                 "grammar is too ambiguous to match within the budget", (long long)m->c->lim.max_match_steps);
        return LOOM_ERR_UNSUPPORTED;
    }
    snprintf(why, cap, "out of memory computing a token mask");
    m->oom = false;
    return LOOM_ERR_NOMEM;
}

bool gmatch_token_allowed(gmatch *m, int32_t token) {
    const loom_vocab_view *v = m->c->vocab;
    if (token < 0 || token >= v->size || m->terminated) return false;
    size_t len = 0;
    const char *b = v->piece(v->ctx, token, &len);
    bool bytes = b && len > 0 && len <= VTRIE_MAX_PIECE && accept_bytes(m, (const uint8_t *)b, len, false);
    return bytes || (is_eog(v, token) && gmatch_can_end(m));
}
