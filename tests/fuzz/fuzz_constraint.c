/*
 * tests/fuzz/fuzz_constraint.c — the grammar constraint's compilers on
 * hostile text: JSON schemas (json_schema), GBNF grammars and regexes, compiled
 * under small limits against the synthetic test vocabulary; a grammar that
 * compiles is then driven for a few steps. Checked: a refusal has a
 * message; past the work budget (max_match_steps) the start, a mask or a
 * token fails saying so, never hangs; every other token a mask allows is
 * accepted; a dead end only ever
 * follows an empty mask; the end is allowed exactly when can_end says so.
 *
 * Input: the first byte picks the language (mod 3: json_schema, gbnf, regex);
 * the rest is the text, up to a 0x00 byte; what follows it is fed to the
 * matcher as a document.
 */
#include <stdint.h>

#include "../../plugins/constraint/grammar/gram.h"
#include "../constraint/constraint_util.h"
#include "fuzz_util.h"

static const gram_limits k_lim = {1 << 16, 20000, 32, 128, 64, 100, 200000};

static void drive(gram_compiled *c, const cu_vocab *v, const uint8_t *doc, size_t n) {
    gmatch *m;
    char why[256];
    loom_status st = gmatch_new(c, &m, why, sizeof why);
    if (st == LOOM_ERR_UNSUPPORTED) { /* the start alone is past the budget */
        FUZZ_CHECK(strstr(why, "max_match_steps") != NULL);
        return;
    }
    FUZZ_CHECK(st == LOOM_OK);
    uint32_t mask[LOOM_MASK_WORDS(512)];
    for (int step = 0; step < 32; step++) {
        st = gmatch_fill_mask(m, mask, why, sizeof why);
        if (st == LOOM_ERR_UNSUPPORTED) {
            FUZZ_CHECK(gmatch_over_budget(m) && strstr(why, "max_match_steps") != NULL);
            break;
        }
        FUZZ_CHECK(st == LOOM_OK);
        FUZZ_CHECK(cu_allowed(mask, v->eog[0]) == gmatch_can_end(m));
        int32_t pick = -1;
        for (int32_t id = 0; id < v->view.size && pick < 0; id++)
            if (cu_allowed(mask, (id + step * 7) % v->view.size)) pick = (id + step * 7) % v->view.size;
        if (pick < 0) break;
        if (!gmatch_accept_token(m, pick)) { /* only past the budget (its path was memoized for the mask) */
            FUZZ_CHECK(gmatch_over_budget(m));
            break;
        }
        if (pick == v->eog[0]) break;
    }
    gmatch_free(m);
    FUZZ_CHECK(gmatch_new(c, &m, why, sizeof why) == LOOM_OK);
    (void)gmatch_accept_bytes(m, doc, n);
    gmatch_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    static cu_vocab v;
    static vtrie *trie;
    char why[512] = "";
    if (!trie) {
        cu_vocab_init(&v);
        FUZZ_CHECK(vtrie_build(&v.view, &trie, why, sizeof why) == LOOM_OK);
    }
    if (n == 0) return 0;
    const int lang = d[0] % 3;
    const uint8_t *text = d + 1, *nul = memchr(text, 0, n - 1);
    const size_t tlen = nul ? (size_t)(nul - text) : n - 1;
    const uint8_t *doc = nul ? nul + 1 : d + n;
    static const char *const langs[] = {"json_schema", "gbnf", "regex"};
    char *src = fuzz_cstr(text, tlen);
    gram_compiled c = {.trie = trie, .vocab = &v.view, .lim = k_lim};
    loom_status st = gram_compile_lang(langs[lang], src, tlen, &k_lim, &c.g, why, sizeof why);
    if (st != LOOM_OK) FUZZ_CHECK(why[0] != '\0');
    else {
        drive(&c, &v, doc, (size_t)(d + n - doc));
        gram_free(&c.g);
    }
    free(src);
    return 0;
}
