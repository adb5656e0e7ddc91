/*
 * tests/constraint/test_grammar.c — the grammar constraint's engine on its
 * own: GBNF errors named with line:column, left recursion and undefined
 * rules refused, the limits (elements, repetition, schema depth, text
 * size, parse-stack depth) as errors or narrowed masks, token masks over
 * multi-byte and partial UTF-8 pieces, the end allowed exactly when the
 * text is complete, and the plugin's ops through the fake host.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fake_host.h"
#include "constraint_util.h"
#include "gram.h"

static const gram_limits k_lim = {1 << 20, 100000, 16, 64, 64, 100};

static loom_status parse(const char *text, gram *g, char *why) {
    return gram_parse(text, strlen(text), &k_lim, g, why, 256);
}

static void expect_bad(const char *text, const char *needle) {
    gram g;
    char why[256] = "";
    cr_assert_neq(parse(text, &g, why), LOOM_OK, "accepted: %s", text);
    cr_assert(strstr(why, needle), "'%s' for %s (wanted '%s')", why, text, needle);
}

Test(gbnf, errors_name_line_and_column) {
    expect_bad("root ::= \"a\"\nroot ::= \"b\"", "2:1: rule defined twice");
    expect_bad("root ::= foo", "rule 'foo' is used but never defined");
    expect_bad("start ::= \"a\"", "no `root ::= ...` rule");
    expect_bad("root ::= \"abc", "unterminated string literal");
    expect_bad("root ::= [a-", "unterminated character class");
    expect_bad("root ::= [z-a]", "end before its start");
    expect_bad("root ::= (\"a\"", "unclosed '('");
    expect_bad("root ::= \"a\"{3,1}", "n must be a count >= m");
    expect_bad("", "empty grammar");
    expect_bad("root ::= \"\\q\"", "1:12: unknown escape");
}

Test(gbnf, left_recursion_refused) {
    expect_bad("root ::= root \"a\" | \"a\"", "left recursion");
    expect_bad("root ::= x \"a\"\nx ::= y\ny ::= \"\" | root", "left recursion");
    gram g;
    char why[256];
    cr_assert_eq(parse("root ::= \"a\" root | \"a\"", &g, why), LOOM_OK, "%s", why); /* right recursion is fine */
    gram_free(&g);
}

Test(gbnf, limits_are_errors_naming_them) {
    expect_bad("root ::= \"a\"{0,5000}", "max_repeat");
    char *big = malloc(300000), *at = big + sprintf(big, "root ::= ");
    for (int i = 0; i < 20000; i++) at += sprintf(at, "\"abcde\" ");
    expect_bad(big, "max_elements");
    free(big);
    char *deep = malloc(4096);
    strcpy(deep, "root ::= ");
    for (int i = 0; i < 300; i++) strcat(deep, "(");
    expect_bad(deep, "nested deeper than 256");
    free(deep);
}

Test(schema, limits_and_unsupported_keywords) {
    char *out = NULL, why[256];
    char deep[4096] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"null\"}");
    for (int i = 0; i < 40; i++) strcat(deep, "}");
    cr_assert_eq(gram_schema_to_gbnf(deep, strlen(deep), &k_lim, &out, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "max_schema_depth"), "%s", why);
    static const char *const bad[][2] = {
        {"{\"type\":\"string\",\"pattern\":\"a\"}", "keyword 'pattern'"},
        {"{\"type\":\"integer\",\"minimum\":3}", "keyword 'minimum'"},
        {"{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "could both match"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "allOf"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "does not resolve"},
        {"{\"type\":\"object\",\"required\":[\"x\"]}", "required property 'x' is not declared"},
        {"{\"type\":\"array\",\"maxItems\":100000}", "max_repeat"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "no enum value satisfies"},
        {"{\"type\":\"strin\"}", "unknown type 'strin'"},
        {"{\"type\":", "not valid JSON"},
        {"false", "allows nothing"},
        {"{\"properties\":{\"a\":{\"not\":{}}}}", "'#/properties/a'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        cr_assert_neq(gram_schema_to_gbnf(bad[i][0], strlen(bad[i][0]), &k_lim, &out, why, sizeof why), LOOM_OK,
                      "accepted %s", bad[i][0]);
        cr_assert(strstr(why, bad[i][1]), "'%s' for %s (wanted '%s')", why, bad[i][0], bad[i][1]);
    }
}

/* A compiled grammar over the synthetic vocabulary. */
typedef struct fixture {
    cu_vocab v;
    vtrie *trie;
    gram_compiled c;
    gmatch *m;
    uint32_t mask[LOOM_MASK_WORDS(512)];
} fixture;

static fixture *open_grammar(const char *gbnf, const gram_limits *lim) {
    fixture *f = calloc(1, sizeof *f);
    char why[256];
    cu_vocab_init(&f->v);
    cr_assert_eq(vtrie_build(&f->v.view, &f->trie, why, sizeof why), LOOM_OK);
    f->c = (gram_compiled){.trie = f->trie, .vocab = &f->v.view, .lim = *lim};
    cr_assert_eq(gram_parse(gbnf, strlen(gbnf), lim, &f->c.g, why, sizeof why), LOOM_OK, "%s", why);
    cr_assert_eq(gmatch_new(&f->c, &f->m, why, sizeof why), LOOM_OK);
    return f;
}

static void close_grammar(fixture *f) {
    gmatch_free(f->m);
    gram_free(&f->c.g);
    vtrie_free(f->trie);
    free(f);
}

static int32_t id_of(const cu_vocab *v, const char *piece) {
    for (int32_t i = 0; i < v->view.size; i++)
        if (v->pieces[i] && v->lens[i] == strlen(piece) && !memcmp(v->pieces[i], piece, v->lens[i])) return i;
    cr_assert_fail("no token '%s'", piece);
    return -1;
}

static void fill(fixture *f) {
    char why[256];
    cr_assert_eq(gmatch_fill_mask(f->m, f->mask, why, sizeof why), LOOM_OK);
}

Test(match, masks_follow_the_grammar_across_multibyte_pieces) {
    fixture *f = open_grammar("root ::= \"{\\\"\" [a-z]+ \"\\\":\" (\"true\" | \"12\") \"}\"", &k_lim);
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "{\"")) && cu_allowed(f->mask, '{'));
    cr_assert(!cu_allowed(f->mask, id_of(&f->v, "\":")) && !cu_allowed(f->mask, f->v.eog[0]));
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "{\"")));
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "name")));
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "\":")) && cu_allowed(f->mask, id_of(&f->v, "ab")));
    cr_assert(!cu_allowed(f->mask, id_of(&f->v, "\": ")), "a space the grammar has no room for");
    cr_assert(!gmatch_accept_token(f->m, id_of(&f->v, "\": ")), "refused, state unchanged");
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "\":")));
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "true")) && cu_allowed(f->mask, id_of(&f->v, "tr")));
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "12")) && !cu_allowed(f->mask, id_of(&f->v, "false")));
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "12")));
    cr_assert(!gmatch_can_end(f->m));
    cr_assert(gmatch_accept_token(f->m, '}'));
    fill(f);
    cr_assert(gmatch_can_end(f->m) && cu_allowed(f->mask, f->v.eog[0]));
    for (int32_t i = 0; i < f->v.view.size; i++)
        cr_assert(i == f->v.eog[0] || !cu_allowed(f->mask, i), "only the end may follow, not %d", i);
    cr_assert(gmatch_accept_token(f->m, f->v.eog[0]));
    fill(f);
    for (size_t w = 0; w < LOOM_MASK_WORDS(f->v.view.size); w++) cr_assert_eq(f->mask[w], 0u, "terminated");
    close_grammar(f);
}

Test(match, partial_utf8_pieces) {
    fixture *f = open_grammar("root ::= \"中\" [^a]*", &k_lim);
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "中文")) && cu_allowed(f->mask, id_of(&f->v, "\xe4\xb8")));
    cr_assert(cu_allowed(f->mask, 0xE4), "a lead byte that can still become 中");
    cr_assert(!cu_allowed(f->mask, 0xC3) && !cu_allowed(f->mask, id_of(&f->v, "é")));
    cr_assert(!cu_allowed(f->mask, id_of(&f->v, "\xad")), "a continuation byte cannot start a character");
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "\xe4\xb8")));
    cr_assert(!gmatch_can_end(f->m), "inside a character");
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "\xad")) && !cu_allowed(f->mask, f->v.eog[0]));
    cr_assert(!cu_allowed(f->mask, 'x'));
    cr_assert(gmatch_accept_token(f->m, id_of(&f->v, "\xad")));
    fill(f);
    cr_assert(cu_allowed(f->mask, id_of(&f->v, "😀")) && !cu_allowed(f->mask, 'a') && gmatch_can_end(f->m));
    close_grammar(f);
}

Test(match, stack_depth_limit_narrows_the_mask) {
    gram_limits lim = k_lim;
    lim.max_stack_depth = 8;
    fixture *f = open_grammar("root ::= \"[\" root? \"]\"", &lim);
    int depth = 0;
    for (; depth < 20; depth++) {
        fill(f);
        if (!cu_allowed(f->mask, '[')) break;
        cr_assert(gmatch_accept_token(f->m, '['));
    }
    cr_assert(depth > 2 && depth < 20, "nesting stopped at %d", depth);
    cr_assert(cu_allowed(f->mask, ']'), "closing is still allowed");
    close_grammar(f);
}

/* ------------------------------------------------------- the plugin's ops */

static const loom_constraint_ops *load_ops(void **dl) {
    const char *so = getenv("LOOM_CONSTRAINT_SO");
    cr_assert(so, "LOOM_CONSTRAINT_SO is not set (run through meson test)");
    *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert(*dl, "%s", dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(*dl, LOOM_PLUGIN_ENTRY_SYMBOL);
    const loom_plugin_desc *d = entry();
    cr_assert_eq(d->components[0].kind, LOOM_KIND_CONSTRAINT);
    return d->components[0].ops;
}

/* The grammar plugin's parameters, in gr_params' order. */
typedef struct {
    int64_t text, elems, depth, stack, stacks, rep, cache, grammars;
} grammar_cfg;

/* Requests with one language and text share one grammar (and its mask
 * cache); released grammars are kept up to grammar_cache, then freed
 * least recently released first. */
Test(plugin, grammars_are_shared_by_text) {
    void *dl;
    const loom_constraint_ops *ops = load_ops(&dl);
    grammar_cfg cfg = {1 << 20, 100000, 16, 64, 64, 100, 4, 1};
    void *self, *a, *b, *c, *d;
    loom_error err = {0};
    cr_assert_eq(ops->create(fake_host(), &cfg, &self, &err), LOOM_OK, "%s", err.message);
    static cu_vocab v;
    cu_vocab_init(&v);
    const char *s1 = "{\"type\":\"integer\"}", *s2 = "{\"type\":\"string\"}";
    cr_assert_eq(ops->compile(self, "json_schema", s1, strlen(s1), &v.view, &a, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->compile(self, "json_schema", s1, strlen(s1), &v.view, &b, &err), LOOM_OK);
    cr_assert_eq(ops->compile(self, "json_schema", s2, strlen(s2), &v.view, &c, &err), LOOM_OK);
    cr_assert_neq(ops->compile(self, "gbnf", s1, strlen(s1), &v.view, &d, &err), LOOM_OK,
                  "the same text in another language is compiled as that language (not GBNF)");
    cr_assert(a == b && a != c);
    void *m = NULL;
    ops->grammar_free(self, a);
    cr_assert_eq(ops->matcher_new(self, b, &m, &err), LOOM_OK, "b still holds the shared grammar");
    uint32_t mask[LOOM_MASK_WORDS(512)];
    cr_assert_eq(ops->fill_mask(self, m, mask, &err), LOOM_OK);
    cr_assert(cu_allowed(mask, '7') && !cu_allowed(mask, '"'));
    ops->matcher_free(self, m);
    ops->grammar_free(self, b);
    ops->grammar_free(self, c); /* two released, one kept: s1's, released first, is freed */
    cr_assert_eq(ops->compile(self, "json_schema", s2, strlen(s2), &v.view, &d, &err), LOOM_OK);
    cr_assert_eq(d, c, "the kept grammar is reused");
    ops->grammar_free(self, d);
    ops->destroy(self);
    dlclose(dl);
}

Test(plugin, compile_match_and_errors_through_the_ops) {
    void *dl;
    const loom_constraint_ops *ops = load_ops(&dl);
    const loom_host *h = fake_host();
    grammar_cfg cfg = {1 << 20, 100000, 16, 64, 64, 100, 4, 2};
    void *self, *g = NULL, *m = NULL;
    loom_error err = {0};
    cr_assert_eq(ops->create(h, &cfg, &self, &err), LOOM_OK, "%s", err.message);
    static cu_vocab v;
    cu_vocab_init(&v);
    cr_assert_eq(ops->compile(self, "lark", "a", 1, &v.view, &g, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "unknown language 'lark'"), "%s", err.message);
    cr_assert_null(g);
    const char *bad = "{\"type\":\"string\",\"format\":\"date\"}";
    cr_assert_eq(ops->compile(self, "json_schema", bad, strlen(bad), &v.view, &g, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "'format'"), "%s", err.message);
    cr_assert_eq(ops->compile(self, "json_object", "", 0, &v.view, &g, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->matcher_new(self, g, &m, &err), LOOM_OK);
    uint32_t mask[LOOM_MASK_WORDS(512)];
    cr_assert_eq(ops->fill_mask(self, m, mask, &err), LOOM_OK);
    cr_assert(cu_allowed(mask, '{') && !cu_allowed(mask, '[') && !cu_allowed(mask, v.eog[0]));
    cr_assert_eq(ops->accept(self, m, '[', &err), LOOM_ERR_INVALID);
    cr_assert(strstr(err.message, "token 91"), "%s", err.message);
    cr_assert_eq(ops->accept(self, m, id_of(&v, "{}"), &err), LOOM_OK);
    cr_assert(ops->can_end(self, m));
    cr_assert_eq(ops->accept(self, m, v.eog[0], &err), LOOM_OK);
    ops->matcher_free(self, m);
    ops->grammar_free(self, g);
    ops->destroy(self);
    dlclose(dl);
}

Test(regex, refusals_name_the_construct_and_offset) {
    static const char *const bad[][2] = {
        {"a(?=b)", "offset 3: lookarounds"},   {"\\bword", "escape '\\b'"},      {"(a)\\1", "escape '\\1'"},
        {"a^b", "anchors are supported only"}, {"a$b", "anchors are supported only"}, {"(ab", "unclosed '('"},
        {"ab)", "')' without '('"},          {"*a", "nothing to repeat"},      {"a**", "multiple repeat"},
        {"[a-", "unterminated class"},       {"[z-a]", "end before its start"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *out = NULL, why[256] = "";
        cr_assert_neq(gram_regex_to_gbnf(bad[i][0], strlen(bad[i][0]), &k_lim, &out, why, sizeof why), LOOM_OK,
                      "accepted %s", bad[i][0]);
        cr_assert(strstr(why, bad[i][1]), "'%s' for %s (wanted '%s')", why, bad[i][0], bad[i][1]);
        cr_assert_null(out);
    }
}
