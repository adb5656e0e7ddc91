/*
 * loom/constraint.h — decoding constraints (structured outputs): a language
 * (a JSON schema, "any JSON object", a grammar, ...) compiled against the
 * model's vocabulary into a per-step mask of the tokens that may come next.
 *
 * The engine compiles a request's constraint once, when the request is
 * added (a bad schema is refused there, before any compute), gives each of
 * the request's samples a matcher, and at every step of a constrained
 * sample asks the matcher for the allowed tokens (fill_mask), hands the
 * mask to the sampler with the row (loom_sample_row.allowed), and tells the
 * matcher which token was chosen (accept) — just before that sample's next
 * fill_mask, on the same thread (a mask worker, while the GPU runs), so a
 * sample's last token is never accepted. End-of-generation tokens are in
 * the mask exactly when the text so far is complete (can_end). A sample
 * whose matcher allows nothing ends with LOOM_FINISH_ERROR and a message
 * saying the constraint reached a dead end, never with text that breaks it.
 *
 * A constraint plugin names the languages it compiles by string
 * ("json_schema", "json_object", "gbnf", ...), so third parties add a
 * language with a new component, not a new enum. compile() returns
 * LOOM_ERR_UNSUPPORTED for a language it does not know.
 *
 * What it is not: a sampler. It never sees logits; the mask is a bitset
 * over token ids, bit v of word v / 32 (1 = allowed).
 *
 * Threads: compile, grammar_free, matcher_new and matcher_free are [any]
 * (the engine compiles on the thread that adds the request); one matcher's
 * methods are [instance] (never concurrently on one matcher), while
 * different matchers of one grammar may run concurrently — fill_mask and
 * accept on the engine's mask workers — so whatever a grammar caches is
 * guarded by the plugin.
 */
#ifndef LOOM_CONSTRAINT_H
#define LOOM_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 32-bit words of a mask over `vocab` tokens. */
#define LOOM_MASK_WORDS(vocab) (((size_t)(vocab) + 31u) / 32u)

/*
 * The model's vocabulary as a constraint sees it. Owned by the engine and
 * valid for the life of the constraint instance it was handed to; the
 * same pointer is passed to every compile() of one engine, so a plugin may
 * cache what it derives from it (a token trie) keyed by the pointer.
 * Grows only at its end.
 */
typedef struct loom_vocab_view {
    uint32_t struct_size;
    int32_t size;              /* tokens: ids 0..size-1                      */
    const void *ctx;           /* passed back to piece()                     */
    /* The bytes token `id` decodes to (not NUL-terminated, may be part of a
     * UTF-8 character; *len its length), or NULL for a token that never
     * belongs in constrained text (control and unused tokens, and the
     * end-of-generation ids below). [any]. */
    const char *(*piece)(const void *ctx, int32_t id, size_t *len);
    const int32_t *eog;        /* (num_eog) end-of-generation token ids      */
    int32_t num_eog;
} loom_vocab_view;

typedef struct loom_constraint_ops {
    uint32_t struct_size;
    loom_create_fn *create;    /* REQUIRED (loom/plugin.h)                   */
    loom_destroy_fn *destroy;  /* REQUIRED                                   */
    /* REQUIRED [any]. Compile `text` (len bytes, not NUL-terminated; may be
     * empty when the language needs none, e.g. "json_object") of language
     * `lang` (NUL-terminated) against `vocab` into a grammar, *grammar
     * (plugin-owned, freed by grammar_free; shared by all the matchers of
     * one request). Errors: LOOM_ERR_UNSUPPORTED for an unknown language or
     * a feature the plugin cannot enforce (naming it), LOOM_ERR_INVALID
     * for bad text (naming what and where: a JSON pointer, a line:column),
     * LOOM_ERR_NOMEM; *grammar is then NULL. Bounded: text, nesting and
     * grammar size have limits the plugin declares as parameters, and going
     * past one is an ordinary LOOM_ERR_INVALID naming the limit. */
    loom_status (*compile)(void *self, const char *lang, const char *text, size_t len,
                           const loom_vocab_view *vocab, void **grammar, loom_error *err);
    /* REQUIRED [any]. Free a grammar after every matcher made from it is
     * freed. grammar may be NULL. */
    void (*grammar_free)(void *self, void *grammar);
    /* REQUIRED [any]. A matcher at the start of the text: *matcher is
     * plugin-owned, freed by matcher_free. The grammar must outlive it. */
    loom_status (*matcher_new)(void *self, void *grammar, void **matcher, loom_error *err);
    /* REQUIRED [any]. matcher may be NULL. */
    void (*matcher_free)(void *self, void *matcher);
    /* REQUIRED [instance]. Write the tokens that may come next into `mask`
     * (LOOM_MASK_WORDS(vocab->size) words, caller-owned, overwritten
     * whole): a token is allowed when the text so far followed by its
     * bytes is still a prefix of some text of the language; the eog
     * tokens exactly when can_end(). An all-zero mask is a dead end (the
     * engine ends the sample). Errors only for broken invariants or
     * memory. */
    loom_status (*fill_mask)(void *self, void *matcher, uint32_t *mask, loom_error *err);
    /* REQUIRED [instance]. Advance past `token`. A token fill_mask would not
     * allow is refused with LOOM_ERR_INVALID and the matcher is left as it
     * was. An eog token is accepted only when can_end(); after it the
     * matcher is terminated and allows nothing. */
    loom_status (*accept)(void *self, void *matcher, int32_t token, loom_error *err);
    /* REQUIRED [instance]. The text so far is a complete text of the
     * language (an eog token may come next). */
    bool (*can_end)(void *self, const void *matcher);
    /* OPTIONAL [instance] (NULL: the engine refuses constrained requests
     * with speculative decoding, which must undo rejected drafts). Undo the
     * last `n` accepted tokens; LOOM_ERR_INVALID when fewer were accepted. */
    loom_status (*rollback)(void *self, void *matcher, int32_t n, loom_error *err);
    /* add new members below this line only */
} loom_constraint_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CONSTRAINT_H */
