/*
 * plugins/constraint/grammar/gram.h — the grammar plugin's internals: a
 * GBNF-style grammar compiled to flat rules of code-point classes, the
 * pushdown matcher over it, the vocabulary trie the masks are computed
 * from, and the JSON-schema-to-GBNF translator. Private to this plugin
 * (tests link these files directly).
 *
 * A grammar is rules; a rule is alternatives; an alternative is a sequence
 * of elements, each a class of code points or a reference to a rule.
 * Elements are stored flat: a rule's alternatives follow one another, each
 * closed by G_ALT, the last by G_END. A parse position is an index into
 * that array; a parse stack is the positions still to match, innermost on
 * top, and the matcher keeps the set of stacks the input so far allows
 * (every top a class, or the stack empty: the input is complete).
 */
#ifndef LOOM_GRAMMAR_GRAM_H
#define LOOM_GRAMMAR_GRAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/constraint.h"
#include "loom/plugin.h"

/* Limits on what a hostile text can grow (the plugin's parameters). */
typedef struct gram_limits {
    int64_t max_text_bytes;    /* schema or grammar text                     */
    int64_t max_elements;      /* compiled grammar size, elements            */
    int64_t max_schema_depth;  /* nesting of a JSON schema                   */
    int64_t max_stack_depth;   /* parse stack: nesting of the generated text */
    int64_t max_stacks;        /* parse stacks kept at once (ambiguity)      */
    int64_t max_repeat;        /* the n of x{m,n}                            */
    int64_t max_match_steps;   /* parse-stack expansion steps one mask, one
                                * accepted token or a matcher's start may
                                * take (<= 0: no budget)                     */
} gram_limits;

enum { G_END = 0, G_ALT = 1, G_REF = 2, G_CLASS = 3 };

typedef struct g_elem {
    int32_t type;              /* G_END, G_ALT, G_REF, G_CLASS               */
    int32_t arg;               /* rule id (G_REF) or class id (G_CLASS)      */
} g_elem;

typedef struct g_class {
    bool negated;
    int32_t first, count;      /* ranges[first .. first+count), sorted, merged */
} g_class;

typedef struct gram {
    g_elem *elems;             /* (n_elems)                                  */
    int32_t n_elems;
    int32_t *rule_start;       /* (n_rules) first element of each rule       */
    int32_t n_rules;
    g_class *classes;          /* (n_classes)                                */
    int32_t n_classes;
    uint32_t *ranges;          /* (2 * n_ranges) inclusive [lo, hi] pairs    */
    int32_t n_ranges;
    int32_t root;              /* rule id of "root"                          */
    int32_t *min_rest;         /* (n_elems) fewest code points that finish an
                                * element's alternative from it (capped)     */
} gram;
#define G_MIN_REST_MAX (1 << 20)

/* buf.c: a growing NUL-terminated text; `oom` once an allocation failed
 * (later writes are dropped). Zero-initialise; the owner frees `s`. */
typedef struct gbuf {
    char *s;
    size_t n, cap;
    bool oom;
} gbuf;
void gbuf_add(gbuf *b, const char *s, size_t n);
void gbuf_put(gbuf *b, const char *s);
void gbuf_printf(gbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* gbnf.c: parse GBNF text (llama.cpp's dialect: rules `name ::= ...`,
 * "literals", [classes], ., ( ), | , * + ? {m} {m,} {m,n}, # comments) into
 * *out. Refuses undefined rules, a missing root, left recursion and
 * anything past the limits, naming line:column. */
loom_status gram_parse(const char *text, size_t len, const gram_limits *lim, gram *out, char *why, size_t cap);
void gram_free(gram *g);
bool gram_class_has(const gram *g, int32_t cls, uint32_t cp);

/* schema.c: a JSON schema (or NULL for "any JSON object") to GBNF text,
 * malloc'd into *gbnf. LOOM_ERR_UNSUPPORTED names a keyword it cannot
 * enforce with its JSON pointer; LOOM_ERR_INVALID a malformed schema. */
loom_status gram_schema_to_gbnf(const char *schema, size_t len, const gram_limits *lim, char **gbnf, char *why,
                                size_t cap);

/* regex.c: a regular expression (full match, Python's syntax, the subset
 * regex.c lists) to GBNF text, malloc'd into *gbnf; LOOM_ERR_UNSUPPORTED
 * names a construct it cannot translate and its offset. */
loom_status gram_regex_to_gbnf(const char *re, size_t len, const gram_limits *lim, char **gbnf, char *why,
                               size_t cap);

/* regex.c: the same regex as a GBNF expression (no rule name, no rule
 * references) for the text between the quotes of a JSON string: the
 * characters JSON must escape (", \, U+0000..U+001F) in their escaped
 * form (\" \\ \b \f \n \r \t, else \u00XX in either case of hex),
 * every other character as itself; `.` also leaves out \r, U+2028 and
 * U+2029 (a subset of both ECMA-262's and Python's meaning). Malloc'd into
 * *body. */
loom_status gram_regex_json_body(const char *re, size_t len, const gram_limits *lim, char **body, char *why,
                                 size_t cap);

/* range.c: GBNF expressions for decimal numbers in a range, as JSON
 * writes them (no leading zeros, no exponent, at most GRAM_MAX_DIGITS
 * integer digits). Integers lo..hi inclusive (|lo|, |hi| <= GRAM_MAX_INT,
 * lo <= hi). */
#define GRAM_MAX_DIGITS 16
#define GRAM_MAX_INT 9999999999999999LL
void gram_int_range(gbuf *b, int64_t lo, int64_t hi);
/* Numbers x with lo < x < hi, each end inclusive when its flag says so and
 * absent when its `has` flag is false; lo, hi integers within
 * +-GRAM_MAX_INT. Fractions beside an exclusive end are kept to 15
 * significant digits, so a reader parsing to a double never rounds them
 * onto the bound. Returns false (nothing written) when no number fits. */
typedef struct gram_bound {
    bool has;                  /* false = unbounded on this side             */
    bool incl;                 /* the bound itself is allowed                */
    int64_t v;                 /* the bound, an integer                      */
} gram_bound;
bool gram_number_range(gbuf *b, gram_bound lo, gram_bound hi);

/* lang.c: `lang` ("json_schema", "json_object", "regex", "gbnf") and its
 * text (len bytes; NULL for none) to a grammar in *out.
 * LOOM_ERR_UNSUPPORTED for an unknown language. */
loom_status gram_compile_lang(const char *lang, const char *text, size_t len, const gram_limits *lim, gram *out,
                              char *why, size_t cap);

/* match.c: the vocabulary as a byte trie (one per vocab view). */
typedef struct vtrie vtrie;
loom_status vtrie_build(const loom_vocab_view *v, vtrie **out, char *why, size_t cap);
void vtrie_free(vtrie *t);

/* Masks already computed for a grammar, by parse state: the state inside
 * a long string (or any loop) repeats step after step, so its mask is
 * computed once. Also by cut key (the state without the stack frames
 * below a token's reach, with the few tokens that reach them listed and
 * walked whole on each use), so repeated items share their masks.
 * Shared by the grammar's matchers (guarded). */
typedef struct mask_cache mask_cache;
mask_cache *mask_cache_new(int32_t entries, int32_t vocab);
void mask_cache_free(mask_cache *mc);
/* Lookups so far that found their mask / did not (for benchmarks). */
void mask_cache_stats(mask_cache *mc, int64_t *hits, int64_t *misses);
/* Of those, the masks served through cut keys (from an entry / by a cut
 * walk), and how many of them walked tokens left to the whole stacks. */
void mask_cache_cut_stats(mask_cache *mc, int64_t *hits, int64_t *misses, int64_t *unc_walks);

/* A compiled constraint: the grammar and the trie it is matched against. */
typedef struct gram_compiled {
    gram g;
    const vtrie *trie;         /* borrowed from the plugin's cache           */
    const loom_vocab_view *vocab;
    gram_limits lim;
    mask_cache *cache;         /* owned; NULL = no caching                   */
    bool plain_keys;           /* cache masks by whole parse states only (no
                                * cut keys shared by repeated items)        */
    bool shared;               /* in the plugin's table of shared grammars   */
    bool ref_walk;             /* masks by the plain walk: a hash probe a
                                * trie node, no dense rows, no uniform
                                * subtrees (the reference tests compare to) */
    char what[96];             /* the language and the text's start, for
                                * errors met while matching (the budget)    */
} gram_compiled;

typedef struct gmatch gmatch;
loom_status gmatch_new(const gram_compiled *c, gmatch **out, char *why, size_t cap);
void gmatch_free(gmatch *m);
/* Bytes in, the matcher advances; false (state unchanged) when the bytes
 * leave the language. */
bool gmatch_accept_bytes(gmatch *m, const uint8_t *b, size_t n);
bool gmatch_accept_token(gmatch *m, int32_t token);
bool gmatch_can_end(const gmatch *m);
/* The last mask, token or start stopped at max_match_steps (it failed: a
 * mask with LOOM_ERR_UNSUPPORTED, a token refused, the state unchanged). */
bool gmatch_over_budget(const gmatch *m);
/* Trie subtrees the matcher's walks decided without visiting them (for
 * tests): allowed whole, and allowed down to a depth. */
void gmatch_walk_stats(const gmatch *m, int64_t *whole, int64_t *cut);
/* Expansion steps so far, over the matcher's life (what the budget counts). */
int64_t gmatch_steps(const gmatch *m);
const gram_compiled *gmatch_grammar(const gmatch *m);
bool gmatch_terminated(const gmatch *m);
loom_status gmatch_fill_mask(gmatch *m, uint32_t *mask, char *why, size_t cap);
/* Token `token` may come next, checked by running the matcher on its
 * bytes (no trie, no cache): what its bit in the mask must say. */
bool gmatch_token_allowed(gmatch *m, int32_t token);

#endif
