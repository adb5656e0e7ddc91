/*
 * conformance/cf_constraint.c — the constraint checks (loom/constraint.h),
 * over a vocabulary of every single byte, a few multi-byte pieces, a
 * token that never belongs (piece NULL) and an end-of-generation token:
 *
 *   constraint.unknown   compile() of a language no plugin knows returns
 *                        LOOM_ERR_UNSUPPORTED with a message and no grammar.
 *   constraint.walk      for the first of json_object, json_schema "{}" and
 *                        a one-rule gbnf the plugin compiles (skip if none):
 *                        random walks from the masks — no bit past the
 *                        vocabulary, never the NULL-piece token, the end
 *                        bit exactly when can_end(), a masked token
 *                        accepted, an unmasked one refused with
 *                        LOOM_ERR_INVALID leaving the mask as it was, and
 *                        nothing allowed after the end; two matchers of
 *                        one grammar independent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_byte_vocab.h"
#include "cf_kit.h"
#include "loom/constraint.h"

static const char *const cx_multi[] = {"{\"", "\":", "\",", "\"}", "true", "false", "null", ", ", "[]", "{}",
                                       "12", "é", "\xe4\xb8", "\xad", NULL};

typedef cf_byte_vocab cx_vocab;

/* The check's vocabulary: cx_multi always fits. */
static void cx_vocab_init(cx_vocab *v) { (void)cf_byte_vocab_init(v, cx_multi); }

static bool cx_bit(const uint32_t *m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1u; }

static bool check_unknown(cf_run *r, const void *arg) {
    (void)arg;
    const loom_constraint_ops *ops = r->comp->ops;
    void *self = NULL, *g = (void *)&g;
    if (!cf_create(r, NULL, &self)) return false;
    static cx_vocab v;
    cx_vocab_init(&v);
    loom_error err = {0};
    cf_where(r, "compile(\"loom-no-such-language\")");
    loom_status st = ops->compile(self, "loom-no-such-language", "x", 1, &v.view, &g, &err);
    bool ok = true;
    if (st != LOOM_ERR_UNSUPPORTED) ok = cf_fail(r, "compile of an unknown language returned %d, not LOOM_ERR_UNSUPPORTED (6)", st);
    else if (!err.message[0]) ok = cf_fail(r, "compile of an unknown language left no message");
    else if (g) ok = cf_fail(r, "compile failed but left *grammar non-NULL");
    return cf_destroy(r, self) && ok;
}

/* One grammar the plugin compiles, or NULL (its language in *lang). */
static void *cx_compile_any(const loom_constraint_ops *ops, void *self, const cx_vocab *v, const char **lang) {
    static const char *const langs[][2] = {{"json_object", ""}, {"json_schema", "{}"}, {"gbnf", "root ::= \"{}\""}};
    for (size_t i = 0; i < sizeof langs / sizeof *langs; i++) {
        void *g = NULL;
        loom_error err = {0};
        if (ops->compile(self, langs[i][0], langs[i][1], strlen(langs[i][1]), &v->view, &g, &err) == LOOM_OK && g) {
            *lang = langs[i][0];
            return g;
        }
    }
    return NULL;
}

/* One random walk of at most `steps` tokens on matcher m. */
static bool cx_walk(cf_run *r, const loom_constraint_ops *ops, void *self, void *m, const cx_vocab *v, cf_rng *g,
                    int steps) {
    uint32_t mask[LOOM_MASK_WORDS(300)], again[LOOM_MASK_WORDS(300)];
    const size_t words = LOOM_MASK_WORDS(v->view.size);
    loom_error err = {0};
    for (int s = 0; s < steps; s++) {
        cf_where(r, "fill_mask (step %d)", s);
        CF_ENSURE(r, ops->fill_mask(self, m, mask, &err) == LOOM_OK, "fill_mask failed: %s", err.message);
        for (int32_t id = v->view.size; id < (int32_t)(words * 32); id++)
            CF_ENSURE(r, !cx_bit(mask, id), "mask bit %d is past the vocabulary (%d)", id, v->view.size);
        CF_ENSURE(r, !cx_bit(mask, v->control), "token %d (piece NULL) is allowed", v->control);
        CF_ENSURE(r, cx_bit(mask, v->eog[0]) == ops->can_end(self, m), "end bit %d but can_end() %d",
                  cx_bit(mask, v->eog[0]), ops->can_end(self, m));
        int32_t allowed[300], n = 0, refused = -1;
        for (int32_t id = 0; id < v->view.size; id++) {
            if (cx_bit(mask, id)) allowed[n++] = id;
            else if (refused < 0 || cf_rng_below(g, 8) == 0) refused = id;
        }
        if (n == 0) return true; /* a dead end is allowed; nothing more to do */
        if (refused >= 0) {
            cf_where(r, "accept(%d) of a token the mask forbids", refused);
            CF_ENSURE(r, ops->accept(self, m, refused, &err) == LOOM_ERR_INVALID,
                      "accept(%d) of a token the mask forbids did not return LOOM_ERR_INVALID", refused);
            CF_ENSURE(r, ops->fill_mask(self, m, again, &err) == LOOM_OK, "fill_mask failed: %s", err.message);
            CF_ENSURE(r, !memcmp(mask, again, words * sizeof *mask), "a refused accept(%d) changed the mask",
                      refused);
        }
        int32_t t = cx_bit(mask, v->eog[0]) && cf_rng_below(g, 2) ? v->eog[0] : allowed[cf_rng_below(g, n)];
        cf_where(r, "accept(%d) of a token the mask allows", t);
        CF_ENSURE(r, ops->accept(self, m, t, &err) == LOOM_OK, "accept(%d) of an allowed token failed: %s", t,
                  err.message);
        if (t == v->eog[0]) {
            CF_ENSURE(r, ops->fill_mask(self, m, mask, &err) == LOOM_OK, "fill_mask failed: %s", err.message);
            for (size_t w = 0; w < words; w++) CF_ENSURE(r, mask[w] == 0, "tokens allowed after the end");
            return true;
        }
    }
    return true;
}

static bool check_walk(cf_run *r, const void *arg) {
    (void)arg;
    const loom_constraint_ops *ops = r->comp->ops;
    void *self = NULL;
    if (!cf_create(r, NULL, &self)) return false;
    static cx_vocab v;
    cx_vocab_init(&v);
    const char *lang = NULL;
    void *gr = cx_compile_any(ops, self, &v, &lang);
    if (!gr) {
        cf_skip(r, "the plugin compiles none of json_object, json_schema, gbnf");
        return cf_destroy(r, self);
    }
    cf_rng g = cf_rng_make(r->seed);
    bool ok = true;
    int64_t walks = cf_iters(r, 40, 8);
    loom_error err = {0};
    for (int64_t w = 0; ok && w < walks; w++) {
        void *a = NULL, *b = NULL;
        if (ops->matcher_new(self, gr, &a, &err) != LOOM_OK || ops->matcher_new(self, gr, &b, &err) != LOOM_OK) {
            ok = cf_fail(r, "matcher_new failed: %s", err.message);
        } else {
            ok = cx_walk(r, ops, self, a, &v, &g, 60) && cx_walk(r, ops, self, b, &v, &g, 60);
        }
        ops->matcher_free(self, a);
        ops->matcher_free(self, b);
    }
    ops->grammar_free(self, gr);
    if (ok) cf_note(r, "%lld walks of %s", (long long)walks, lang);
    return cf_destroy(r, self) && ok;
}

int cf_checks_constraint(const loom_component *c, cf_check *out, int cap) {
    (void)c;
    int n = 0;
    n = cf_add(out, n, cap, check_unknown, NULL, "constraint.unknown");
    n = cf_add(out, n, cap, check_walk, NULL, "constraint.walk");
    return n;
}
