/*
 * core/engine/constrain.c — decoding constraints (loom/constraint.h) in the
 * engine: the tokenizer as a vocab view, a request's constraint compiled
 * when it is added (so a bad schema is refused before any compute), a
 * matcher per sample, the mask of each constrained row before sampling
 * and the chosen token fed back after.
 *
 * Where the masks apply: with a runner that masks candidates (ABI 2.4,
 * loom_logits_topk.allowed) a constrained row that asks for no logprob
 * alternatives comes back as its best allowed candidates, the masks
 * computed while the forward runs (step.c); otherwise it comes back whole
 * and the sampler applies the mask on the host, as it applies logit_bias.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/util.h"

/* A token constrained text may hold: not a control, unused or unknown
 * token and not an end of generation (those the mask adds itself). */
static const char *vocab_piece(const void *ctx, int32_t id, size_t *len) {
    const loom_engine *e = ctx;
    *len = 0;
    loom_token_type t = loom_tokenizer_token_type(e->tok, id);
    if (t == LOOM_TOKEN_CONTROL || t == LOOM_TOKEN_UNUSED || t == LOOM_TOKEN_UNKNOWN) return NULL;
    if (loom_tokenizer_is_eog(e->tok, id)) return NULL;
    return loom_tokenizer_piece(e->tok, id, len);
}

loom_status engine_constraint_init(loom_engine *e, loom_error *err) {
    if (!e->con || !e->tok) return LOOM_OK;
    int32_t n = 0;
    for (int32_t id = 0; id < e->vocab; id++) n += loom_tokenizer_is_eog(e->tok, id);
    if (!(e->eog_ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t))))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    n = 0;
    for (int32_t id = 0; id < e->vocab; id++)
        if (loom_tokenizer_is_eog(e->tok, id)) e->eog_ids[n++] = id;
    e->vocab_view = (loom_vocab_view){.struct_size = sizeof(loom_vocab_view), .size = e->vocab, .ctx = e,
                                      .piece = vocab_piece, .eog = e->eog_ids, .num_eog = n};
    return LOOM_OK;
}

void engine_constraint_fini(loom_engine *e) { free(e->eog_ids); }

/* [any] The request's constraint through the pipeline's constraint plugin;
 * what it cannot run with is refused here, naming why. */
loom_status engine_constraint_compile(loom_engine *e, const loom_request *full, loom_req *rq, loom_error *err) {
    rq->r.constraint_lang = NULL;
    rq->r.constraint = NULL;
    const char *lang = full->constraint_lang;
    if (!lang || !lang[0]) return LOOM_OK;
    if (!e->con)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "constraint '%.64s': the pipeline has no constraint section (e.g. `constraint: "
                              "{plugin: grammar}`)", lang);
    if (!e->tok)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "constraint '%.64s': the model has no tokenizer", lang);
    if (e->spec)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "constraint '%.64s' with speculative decoding: the engine does not mask or roll back "
                              "drafts; use a pipeline without a speculator for constrained requests", lang);
    if (full->ignore_eos)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "constraint '%.64s' with ignore_eos: a constrained text ends where the constraint "
                              "says", lang);
    if (full->want_probs)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "constraint '%.64s' with want_probs: the distributions would not show the mask", lang);
    const char *text = full->constraint ? full->constraint : "";
    void *g = NULL;
    loom_status st = e->con->compile(e->con_self, lang, text, strlen(text), &e->vocab_view, &g, err);
    if (st == LOOM_OK && !g)
        st = loom_error_set(err, LOOM_ERR_INTERNAL, "constraint plugin returned LOOM_OK without a grammar");
    if (st != LOOM_OK) return st;
    rq->grammar = g;
    rq->con = e->con;
    rq->con_self = e->con_self;
    return LOOM_OK;
}

void engine_constraint_req_free(loom_req *rq) {
    if (rq->grammar) rq->con->grammar_free(rq->con_self, rq->grammar);
    rq->grammar = NULL;
}

/* Keep why s's constraint failed (the sample ends with it); returns it. */
/* what a failure says when its own message found no memory: never NULL,
 * so a failed matcher is never taken for a live one */
static char con_oom_msg[] = "the constraint failed (out of memory for its message)";

static void con_error_free(loom_seq *s) {
    if (s->con_error != con_oom_msg) free(s->con_error);
    s->con_error = NULL;
}

static const char *seq_con_error(loom_seq *s, const char *msg) {
    con_error_free(s);
    s->con_error = strdup(msg);
    if (!s->con_error) s->con_error = con_oom_msg;
    return s->con_error;
}

/* A matcher for a new sample of a constrained request. */
loom_status engine_constraint_seq_init(loom_seq *s) {
    loom_req *rq = s->req;
    if (!rq->grammar) return LOOM_OK;
    loom_error le = {0};
    if (rq->con->matcher_new(rq->con_self, rq->grammar, &s->matcher, &le) != LOOM_OK) return le.code;
    s->con = rq->con;
    s->con_self = rq->con_self;
    return LOOM_OK;
}

void engine_constraint_seq_free(loom_seq *s) {
    con_error_free(s);
    if (s->matcher) s->con->matcher_free(s->con_self, s->matcher);
    s->matcher = NULL;
    free(s->mask);
    s->mask = NULL;
}

uint32_t *engine_constraint_mask_buffer(const loom_engine *e, loom_seq *s) {
    if (!s->mask) s->mask = malloc(LOOM_MASK_WORDS(e->vocab) * sizeof(uint32_t));
    return s->mask;
}

/* Feed s's kept token to its matcher; true when it failed (s->con_error says why). */
static bool feed_pending(loom_seq *s) {
    loom_error le = {0};
    s->con_has_pending = false;
    if (s->con->accept(s->con_self, s->matcher, s->con_pending, &le) != LOOM_OK) {
        /* the plugin's reason when it gave one (a work budget) */
        seq_con_error(s, le.code != LOOM_ERR_INVALID && le.message[0] ? le.message
                                                                      : "the constraint refused the chosen token");
        return true;
    }
    return false;
}

/* The mask of s's next token into s->mask; s->mask_live says whether it
 * allows anything. */
loom_status engine_constraint_fill(loom_engine *e, loom_seq *s, loom_error *err) {
    s->mask_live = false;
    if (!s->matcher) return LOOM_OK;
    if (s->con_has_pending && feed_pending(s)) return LOOM_OK; /* failed: the sample ends with its message */
    const size_t words = LOOM_MASK_WORDS(e->vocab);
    if (!engine_constraint_mask_buffer(e, s))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for a constraint mask");
    /* A failure is this sample's, not the step's: a grammar too ambiguous
     * to match within the plugin's budget (or a mask it has no memory for)
     * ends this sample with the plugin's message when its token is checked;
     * the other rows of the step go on. */
    loom_error le = {0};
    if (s->con->fill_mask(s->con_self, s->matcher, s->mask, &le) != LOOM_OK) {
        seq_con_error(s, le.message[0] ? le.message : "the constraint failed to compute a token mask");
        return LOOM_OK;
    }
    for (size_t i = 0; i < words && !s->mask_live; i++) s->mask_live = s->mask[i] != 0;
    return LOOM_OK;
}

/* NULL when tok may follow for s, else why it may not (s's sample must end). */
const char *engine_constraint_check_token(const loom_seq *s, int32_t tok) {
    if (!s->matcher) return NULL;
    if (s->con_error) return s->con_error;
    if (!s->mask_live)
        return "the constraint reached a dead end: no token can continue the text inside the schema or grammar";
    if (!((s->mask[tok >> 5] >> (tok & 31)) & 1u))
        return "the sampler chose a token the constraint's mask forbids (a sampler built before ABI 2.3 ignores "
               "loom_sample_row.allowed)";
    return NULL;
}

/* s's chosen token is kept, not fed to the matcher yet: a token the
 * engine accepts has passed s's mask (engine_constraint_check_token), so
 * the matcher takes it unless its work budget or memory runs out, and
 * feeding it waits for the next mask (feed_pending), which the mask
 * workers compute while the GPU runs: the matchers advance off the step's
 * critical path. Such a failure ends the sample at its next token, with
 * the plugin's message. NULL, or why the sample must end. */
const char *engine_constraint_accept(loom_seq *s, int32_t tok) {
    if (!s->matcher) return NULL;
    s->mask_live = false;
    if (s->con_has_pending && feed_pending(s)) return s->con_error; /* two tokens without a mask between: not met */
    s->con_pending = tok;
    s->con_has_pending = true;
    return NULL;
}

