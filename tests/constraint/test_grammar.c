/*
 * tests/constraint/test_grammar.c — the grammar constraint's engine on its
 * own: GBNF errors named with line:column, left recursion and undefined
 * rules refused, the limits (elements, repetition, schema depth, text
 * size, parse-stack depth) as errors or narrowed masks, token masks over
 * multi-byte and partial UTF-8 pieces, the end allowed exactly when the
 * text is complete, the shared mask cache (masks through it, from threads
 * at once and under eviction, equal masks computed from scratch), and the
 * plugin's ops through the fake host.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fake_host.h"
#include "../common/rng.h"
#include "constraint_util.h"
#include "gram.h"

static const gram_limits k_lim = {1 << 20, 100000, 16, 64, 64, 100, 20000000};

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
        {"{\"type\":\"integer\",\"multipleOf\":3}", "keyword 'multipleOf'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "format 'hostname' is not supported"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", "'maxLength' beside 'pattern'"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "'pattern': regex at offset 2: lookarounds"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}", "'pattern' beside 'format'"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "non-integer 'minimum'"},
        {"{\"type\":\"number\",\"exclusiveMaximum\":1e16}", "past 2^53"},
        {"{\"type\":\"integer\",\"minimum\":3,\"exclusiveMaximum\":3}", "no integer satisfies"},
        {"{\"type\":\"number\",\"minimum\":3,\"exclusiveMaximum\":3}", "no number satisfies"},
        {"{\"type\":\"integer\",\"minimum\":1e17}", "no value of at most 16 integer digits"},
        {"{\"type\":\"integer\",\"minimum\":\"3\"}", "'minimum' must be a number"},
        {"{\"minimum\":3}", "'minimum' without a 'type'"},
        {"{\"enum\":[\"a\"],\"format\":\"date\"}", "'format' beside 'enum'"},
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

/* Does the grammar of `schema` take `doc` whole (every byte, then the end)? */
static bool schema_accepts(const char *schema, const char *doc) {
    char *gbnf = NULL, why[256];
    cr_assert_eq(gram_schema_to_gbnf(schema, strlen(schema), &k_lim, &gbnf, why, sizeof why), LOOM_OK, "%s: %s",
                 schema, why);
    fixture *f = open_grammar(gbnf, &k_lim);
    free(gbnf);
    bool ok = gmatch_accept_bytes(f->m, (const uint8_t *)doc, strlen(doc)) && gmatch_can_end(f->m);
    close_grammar(f);
    return ok;
}

static void expect_docs(const char *schema, const char *const *good, const char *const *bad) {
    for (; good && *good; good++) cr_assert(schema_accepts(schema, *good), "%s refused %s", schema, *good);
    for (; bad && *bad; bad++) cr_assert(!schema_accepts(schema, *bad), "%s accepted %s", schema, *bad);
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

/* ------------------------------------------------------- the mask cache */

/* One thread's random walk: a matcher through the shared cache and one
 * with none, fed the same tokens (drawn from the reference mask, the end
 * only when nothing else is allowed); every mask compared word for word. */
typedef struct cache_walk {
    const gram_compiled *cached, *plain;
    const cu_vocab *v;
    uint64_t seed;
    int32_t steps, masks, mismatches;
    char first[300];
} cache_walk;

/* One document: masks compared until the walk ends or goes wrong. */
static bool cache_walk_doc(cache_walk *w, test_rng *r) {
    gmatch *a, *b;
    char why[256];
    if (gmatch_new(w->cached, &a, why, sizeof why) != LOOM_OK || gmatch_new(w->plain, &b, why, sizeof why) != LOOM_OK) {
        snprintf(w->first, sizeof w->first, "gmatch_new: %s", why);
        w->mismatches++;
        return false;
    }
    uint32_t ma[LOOM_MASK_WORDS(512)], mb[LOOM_MASK_WORDS(512)];
    const size_t words = LOOM_MASK_WORDS(w->v->view.size);
    bool ok = true;
    for (int32_t step = 0; ok && w->masks < w->steps && !gmatch_terminated(b); step++) {
        ok = gmatch_fill_mask(a, ma, why, sizeof why) == LOOM_OK && gmatch_fill_mask(b, mb, why, sizeof why) == LOOM_OK;
        if (!ok) break;
        w->masks++;
        if (memcmp(ma, mb, words * sizeof *ma)) {
            if (!w->mismatches++) snprintf(w->first, sizeof w->first, "step %d of seed %llu", step, (unsigned long long)w->seed);
            ok = false;
            break;
        }
        int32_t ids[600], n = 0;
        for (int32_t id = 0; id < w->v->view.size; id++)
            if (cu_allowed(mb, id) && id != w->v->eog[0]) ids[n++] = id;
        int32_t t = n ? ids[rng_int(r, n)] : w->v->eog[0];
        ok = cu_allowed(mb, t) && gmatch_accept_token(a, t) && gmatch_accept_token(b, t);
    }
    gmatch_free(a);
    gmatch_free(b);
    return ok;
}

/* Documents one after another until `steps` masks were compared. */
static void *cache_walk_run(void *arg) {
    cache_walk *w = arg;
    test_rng r = {.s = w->seed};
    while (w->masks < w->steps && cache_walk_doc(w, &r)) {}
    return NULL;
}

/* Random walks through grammars with many states (bounded strings in
 * unrolled arrays, enums, nested objects, numbers) by several threads
 * sharing one cache, for caches from one entry (most shards hold none:
 * every lookup misses or evicts) to more than the states met. */
Test(cache, shared_masks_equal_masks_from_scratch) {
    static const char *const schemas[] = {
        "{\"type\":\"array\",\"minItems\":6,\"maxItems\":6,\"items\":{\"type\":\"object\",\"additionalProperties\":false,"
        "\"required\":[\"name\",\"age\",\"city\",\"tags\"],\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
        "\"age\":{\"type\":\"integer\"},\"city\":{\"enum\":[\"Paris\",\"Rome\",\"Oslo\"]},\"tags\":{\"type\":\"array\","
        "\"maxItems\":3,\"items\":{\"type\":\"string\",\"maxLength\":4}}}}}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":-5,\"maximum\":70},\"b\":{\"type\":"
        "\"object\",\"properties\":{\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":[\"string\",\"null\"]}}},\"e\":{\"type\":"
        "\"string\",\"pattern\":\"^[a-c]{2,5}x?$\"}},\"required\":[\"a\",\"b\"]}",
        NULL,
    };
    static const int32_t entries[] = {1, 5, 17, 4096};
    cu_vocab v;
    cu_vocab_init(&v);
    vtrie *trie;
    char why[256], *gbnf;
    cr_assert_eq(vtrie_build(&v.view, &trie, why, sizeof why), LOOM_OK);
    int32_t masks = 0;
    for (int s = 0; schemas[s]; s++) {
        cr_assert_eq(gram_schema_to_gbnf(schemas[s], strlen(schemas[s]), &k_lim, &gbnf, why, sizeof why), LOOM_OK, "%s", why);
        for (size_t e = 0; e < sizeof entries / sizeof *entries; e++) {
            gram_compiled cached = {.trie = trie, .vocab = &v.view, .lim = k_lim}, plain;
            cr_assert_eq(gram_parse(gbnf, strlen(gbnf), &k_lim, &cached.g, why, sizeof why), LOOM_OK, "%s", why);
            cr_assert((cached.cache = mask_cache_new(entries[e], v.view.size)));
            plain = cached;
            plain.cache = NULL;
            enum { THREADS = 4 };
            cache_walk w[THREADS];
            pthread_t th[THREADS];
            for (int i = 0; i < THREADS; i++) {
                /* two threads per seed: both walk the same states, racing for the same entries */
                w[i] = (cache_walk){.cached = &cached, .plain = &plain, .v = &v, .seed = 1 + (uint64_t)(s * 100 + e * 10 + i / 2), .steps = 400};
                cr_assert_eq(pthread_create(&th[i], NULL, cache_walk_run, &w[i]), 0);
            }
            for (int i = 0; i < THREADS; i++) {
                pthread_join(th[i], NULL);
                cr_assert_eq(w[i].mismatches, 0, "schema %d, %d entries: cached mask differs at %s", s, entries[e], w[i].first);
                cr_assert_eq(w[i].masks, w[i].steps, "schema %d: the walks stopped after %d masks", s, w[i].masks);
                masks += w[i].masks;
            }
            int64_t hits, misses;
            mask_cache_stats(cached.cache, &hits, &misses);
            cr_assert_eq(hits + misses, w[0].masks + w[1].masks + w[2].masks + w[3].masks, "every mask looked up once");
            if (entries[e] >= 4096) cr_assert(hits > 0, "the twin walks share their states");
            mask_cache_free(cached.cache);
            gram_free(&cached.g);
        }
        free(gbnf);
    }
    cr_assert(masks > 200);
    vtrie_free(trie);
}

/* ------------------------------------- cut keys against brute force */

/* The synthetic vocabulary plus pieces that cross several levels of JSON's
 * structure at once ("\"]},", "}]}"), so tokens reach the frames a cut key
 * leaves out, and random pieces over the grammars' alphabet. */
static const char *bf_pieces[260];
static char bf_random[120][8];

static void bf_vocab_init(cu_vocab *v) {
    static const char *const extra[] = {"\"]},", "\"]}", "\"}]", "}]}", "\"},{\"", "\"]},\n", "\", \"", "\"],", "\"]",
                                        "},{", "}, {", "\"}, ", "]}]", "a\"]}", "1]}", "1}", "0]}", ", \"", "\"}}",
                                        "ab\"", "c\",", "x\"}", NULL};
    test_rng r = {.s = 0x5eed};
    static const char alpha[] = "\"{}[],: abcx019-.\n";
    int32_t n = 0;
    for (int i = 0; cu_multi[i]; i++) bf_pieces[n++] = cu_multi[i];
    for (int i = 0; extra[i]; i++) bf_pieces[n++] = extra[i];
    for (int i = 0; i < 120; i++) {
        int len = 2 + (int)rng_int(&r, 5);
        for (int j = 0; j < len; j++) bf_random[i][j] = alpha[rng_int(&r, (int64_t)sizeof alpha - 1)];
        bf_random[i][len] = 0;
        bf_pieces[n++] = bf_random[i];
    }
    bf_pieces[n] = NULL;
    cr_assert(cf_byte_vocab_init(v, bf_pieces), "the test vocabulary fits");
}

/* A random JSON schema: strings with lengths, integers with bounds, enums,
 * objects with required and optional members, arrays (often unrolled:
 * minItems = maxItems) nesting them. */
static void bf_schema(gbuf *b, test_rng *r, int depth) {
    switch (depth >= 3 ? rng_int(r, 4) : rng_int(r, 8)) {
    case 0:
        if (rng_int(r, 3)) gbuf_printf(b, "{\"type\":\"string\",\"maxLength\":%d}", (int)rng_int(r, 7));
        else gbuf_put(b, "{\"type\":\"string\"}");
        break;
    case 1: gbuf_printf(b, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", -(int)rng_int(r, 20), (int)rng_int(r, 200)); break;
    case 2: gbuf_put(b, rng_int(r, 2) ? "{\"enum\":[\"ab\",\"b\\\"c\",\"x\"]}" : "{\"enum\":[1,\"a\",null]}"); break;
    case 3: gbuf_put(b, "{\"type\":[\"boolean\",\"null\"]}"); break;
    case 4:
    case 5: {
        int n = 1 + (int)rng_int(r, 3);
        gbuf_put(b, "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{");
        for (int i = 0; i < n; i++) {
            gbuf_printf(b, "%s\"p%d\":", i ? "," : "", i);
            bf_schema(b, r, depth + 1);
        }
        gbuf_put(b, "},\"required\":[");
        for (int i = 0, first = 1; i < n; i++)
            if (rng_int(r, 3)) gbuf_printf(b, "%s\"p%d\"", first ? "" : ",", i), first = 0;
        gbuf_put(b, "]}");
        break;
    }
    default: {
        int lo = (int)rng_int(r, 4), hi = rng_int(r, 2) ? lo : lo + (int)rng_int(r, 3);
        gbuf_printf(b, "{\"type\":\"array\",\"minItems\":%d,\"maxItems\":%d,\"items\":", lo, hi);
        bf_schema(b, r, depth + 1);
        gbuf_put(b, "}");
    }
    }
}

/* A random quantifier. */
static void bf_repeat(gbuf *b, test_rng *r) {
    static const char *const q[] = {"", "", "?", "*", "+", "{2}", "{0,3}", "{1,4}"};
    gbuf_put(b, q[rng_int(r, 8)]);
}

/* A random regex: literals (quotes and JSON punctuation among them),
 * classes, groups with alternatives (empty ones among them), repetitions —
 * of groups that can match nothing too, nested in other repetitions (the
 * shape whose expansion is exponential in paths unless each stack is
 * expanded once per set, match.c). */
static void bf_regex(gbuf *b, test_rng *r, int depth) {
    static const char *const atom[] = {"a", "b", "x", "0", "\"", ",", ":", " ", "\\]", "\\}", "[a-c]", "[0-9]", "[^b\"]", "."};
    for (int i = 0, n = 1 + (int)rng_int(r, 3); i < n; i++) {
        if (depth < 3 && rng_int(r, 3) == 0) {
            gbuf_put(b, "(");
            if (rng_int(r, 8)) bf_regex(b, r, depth + 1); /* else an empty alternative */
            if (rng_int(r, 2)) gbuf_put(b, "|"), bf_regex(b, r, depth + 1);
            gbuf_put(b, ")");
        } else {
            gbuf_put(b, atom[rng_int(r, 14)]);
        }
        bf_repeat(b, r);
    }
}

/* A random GBNF grammar: rules referring only to later rules (no left
 * recursion), repeated items in unrolled lists; alternatives may match
 * nothing (a repeated item or an empty literal), so repetitions of rules
 * that can match nothing nest in one another. */
static void bf_gbnf(gbuf *b, test_rng *r) {
    static const char *const lit[] = {"\"[\"", "\"]\"", "\"{\"", "\"}\"", "\",\"", "\"\\\"\"", "\"ab\"", "\"x\"",
                                      "[a-c]", "[0-9]", "[^\\\"]", "\": \""};
    int rules = 2 + (int)rng_int(r, 4);
    gbuf_printf(b, "root ::= \"[\" r1 (\",\" r1){%d} \"]\"\n", 1 + (int)rng_int(r, 4));
    for (int i = 1; i < rules; i++) {
        gbuf_printf(b, "r%d ::= ", i);
        for (int a = 0, na = 1 + (int)rng_int(r, 3); a < na; a++) {
            if (a) gbuf_put(b, " | ");
            if (rng_int(r, 6)) gbuf_put(b, lit[rng_int(r, 12)]);
            else gbuf_put(b, "\"\"");
            bf_repeat(b, r);
            for (int k = 0, nk = (int)rng_int(r, 3); k < nk; k++) {
                gbuf_put(b, " ");
                if (i + 1 < rules && rng_int(r, 2)) gbuf_printf(b, "(r%d)", i + 1 + (int)rng_int(r, rules - i - 1));
                else gbuf_put(b, lit[rng_int(r, 12)]);
                bf_repeat(b, r);
            }
        }
        gbuf_put(b, "\n");
    }
}

/* Every mask of random walks through a grammar, by matchers sharing one
 * cache (cut keys on) and one with plain keys only, equal to the mask
 * brute force gives (every token of the vocabulary run through the
 * matcher). Returns the masks compared. */
static int32_t bf_check(const char *lang, const char *text, const cu_vocab *v, const vtrie *trie, test_rng *r,
                        int32_t entries, int64_t stats[3]) {
    gram_compiled cut = {.trie = trie, .vocab = &v->view, .lim = k_lim}, plain;
    char why[256];
    if (gram_compile_lang(lang, text, strlen(text), &k_lim, &cut.g, why, sizeof why) != LOOM_OK) return 0;
    cr_assert((cut.cache = mask_cache_new(entries, v->view.size)));
    plain = cut;
    plain.plain_keys = true;
    cr_assert((plain.cache = mask_cache_new(entries, v->view.size)));
    enum { SEQS = 3 };
    gmatch *m[SEQS], *p[SEQS];
    for (int i = 0; i < SEQS; i++) {
        cr_assert_eq(gmatch_new(&cut, &m[i], why, sizeof why), LOOM_OK);
        cr_assert_eq(gmatch_new(&plain, &p[i], why, sizeof why), LOOM_OK);
    }
    uint32_t mc[LOOM_MASK_WORDS(CF_BYTE_VOCAB_MAX)], mp[LOOM_MASK_WORDS(CF_BYTE_VOCAB_MAX)],
        bf[LOOM_MASK_WORDS(CF_BYTE_VOCAB_MAX)];
    int32_t compared = 0;
    for (int step = 0; step < 80; step++) {
        for (int i = 0; i < SEQS; i++) {
            if (gmatch_terminated(m[i])) continue;
            cr_assert_eq(gmatch_fill_mask(m[i], mc, why, sizeof why), LOOM_OK, "%s", why);
            cr_assert_eq(gmatch_fill_mask(p[i], mp, why, sizeof why), LOOM_OK, "%s", why);
            memset(bf, 0, sizeof bf);
            for (int32_t id = 0; id < v->view.size; id++)
                if (gmatch_token_allowed(m[i], id)) bf[id >> 5] |= 1u << (id & 31);
            for (int32_t id = 0; id < v->view.size; id++) {
                cr_assert_eq(cu_allowed(mc, id), cu_allowed(bf, id),
                             "%s %s, cache %d, seq %d step %d: token %d ('%.*s') is %s by the cut-key mask", lang, text,
                             entries, i, step, id, (int)v->lens[id], v->pieces[id] ? v->pieces[id] : "",
                             cu_allowed(mc, id) ? "allowed" : "refused");
                cr_assert_eq(cu_allowed(mp, id), cu_allowed(bf, id), "%s %s: plain-key mask differs at token %d",
                             lang, text, id);
            }
            compared++;
            /* the next token: multi-byte pieces half the time, so walks go deep */
            int32_t ids[CF_BYTE_VOCAB_MAX], n = 0, multi = 0;
            for (int32_t id = 0; id < v->view.size; id++)
                if (cu_allowed(bf, id) && id != v->eog[0]) ids[n++] = id, multi += id >= 256;
            int32_t t = v->eog[0];
            if (n) {
                bool want_multi = multi && rng_int(r, 2);
                do t = ids[rng_int(r, n)];
                while (want_multi && t < 256);
            }
            cr_assert(gmatch_accept_token(m[i], t) && gmatch_accept_token(p[i], t), "%s: token %d refused", text, t);
        }
    }
    for (int i = 0; i < SEQS; i++) gmatch_free(m[i]), gmatch_free(p[i]);
    int64_t h, mi, u;
    mask_cache_cut_stats(cut.cache, &h, &mi, &u);
    stats[0] += h, stats[1] += mi, stats[2] += u;
    mask_cache_free(cut.cache);
    mask_cache_free(plain.cache);
    gram_free(&cut.g);
    return compared;
}

/* Cut keys (a mask cached once for a place in a repeated item, tokens that
 * reach below the cut walked with the whole stacks) give exactly the masks
 * brute force gives, on random schemas, regexes and GBNF grammars, with
 * caches from one entry to more than the states met; and the cut path is
 * taken, hit and leaves tokens to the whole stacks somewhere among them. */
Test(cache, cut_keys_equal_brute_force) {
    static cu_vocab v;
    bf_vocab_init(&v);
    vtrie *trie;
    char why[256];
    cr_assert_eq(vtrie_build(&v.view, &trie, why, sizeof why), LOOM_OK);
    test_rng r = rng_seeded("cut_keys_equal_brute_force");
    static const int32_t entries[] = {1, 3, 16, 4096};
    int32_t masks = 0, grammars = 0;
    int64_t stats[3] = {0}; /* cut-key hits, cut walks, walks of tokens left to the whole stacks */
    /* fixed cases first: the people schema's shape, a tags list reaching the item below */
    static const char *const fixed[][2] = {
        {"json_schema", "{\"type\":\"array\",\"minItems\":5,\"maxItems\":5,\"items\":{\"type\":\"object\","
                        "\"additionalProperties\":false,\"required\":[\"a\",\"tags\"],\"properties\":{\"a\":{\"type\":"
                        "\"string\",\"maxLength\":3},\"tags\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"type\":"
                        "\"string\",\"maxLength\":2}}}}}"},
        {"regex", "(\"[a-c]{0,3}\",){4}\"x\""},
    };
    for (int i = 0; i < 60 + 2; i++) {
        gbuf b = {0};
        const char *lang = i < 2 ? fixed[i][0] : (const char *[]){"json_schema", "regex", "gbnf"}[i % 3];
        if (i < 2) gbuf_put(&b, fixed[i][1]);
        else if (i % 3 == 0) bf_schema(&b, &r, 0);
        else if (i % 3 == 1) bf_regex(&b, &r, 0);
        else bf_gbnf(&b, &r);
        cr_assert(!b.oom);
        int32_t n = bf_check(lang, b.s, &v, trie, &r, entries[i % 4], stats); /* 0: did not compile */
        masks += n;
        grammars += n > 0;
        free(b.s);
    }
    cr_assert(grammars >= 40, "only %d of the random grammars compiled", grammars);
    cr_assert(masks > 2000, "%d masks compared", masks);
    /* coverage, not correctness: the cut path must have served masks (60
     * runs gave 37-500+ hits, 400-1200 walks, 28+ walks below the cut,
     * depending on how many random items repeat) */
    cr_assert(stats[0] > 10 && stats[1] > 100 && stats[2] > 10,
              "the cut path was taken too rarely: %lld hits, %lld walks, %lld walks of tokens below the cut",
              (long long)stats[0], (long long)stats[1], (long long)stats[2]);
    cr_log_info("%d grammars, %d masks: cut keys %lld hits, %lld walks, %lld walks below the cut", grammars, masks,
                (long long)stats[0], (long long)stats[1], (long long)stats[2]);
    vtrie_free(trie);
}

/* ------------------------------- the walk's shortcuts against the plain walk */

/* Single bytes plus pieces over a small alphabet, up to 12 bytes long, so
 * the trie has deep subtrees of plain string characters (the shortcut's
 * case), some ending in JSON punctuation or a quote, some with a
 * multi-byte character (which the shortcut leaves to the walk). */
static char uw_random[236][16];

static void uw_vocab_init(cu_vocab *v) {
    static const char *pieces[240];
    static const char alpha[] = "abcx01 ";
    static const char *const tail[] = {"\"", "\",", "\"]", "\"}", ",", "]", "\\n", "é", ":", "\"]},"};
    test_rng r = {.s = 0xfa57};
    int32_t n = 0;
    for (int i = 0; i < 236; i++) {
        int len = 2 + (int)rng_int(&r, 11), at = 0;
        for (int j = 0; j < len; j++) uw_random[i][at++] = alpha[rng_int(&r, (int64_t)sizeof alpha - 1)];
        if (rng_int(&r, 4) == 0) { /* a tail after the plain characters */
            const char *t = tail[rng_int(&r, 10)];
            memcpy(uw_random[i] + at, t, strlen(t));
            at += (int)strlen(t);
        }
        uw_random[i][at] = 0;
        pieces[n++] = uw_random[i];
    }
    pieces[n] = NULL;
    cr_assert(cf_byte_vocab_init(v, pieces), "the test vocabulary fits");
}

/* Masks of random walks through a grammar by matchers walking the trie the
 * plugin's way (dense rows, subtrees decided whole or down to a depth) and
 * by matchers walking it node by node with hash probes (ref_walk), in
 * lockstep, compared word for word; with no cache (every mask a walk) or
 * with a shared cache and cut keys (cut walks, holes, tokens left to the
 * whole stacks). Returns the masks compared; adds the subtrees decided
 * without a visit to *whole and *cut. */
static int32_t uw_check(const char *lang, const char *text, const cu_vocab *v, const vtrie *trie, test_rng *r,
                        bool cached, int64_t *whole, int64_t *cut) {
    gram_compiled fast = {.trie = trie, .vocab = &v->view, .lim = k_lim}, ref;
    char why[256];
    if (gram_compile_lang(lang, text, strlen(text), &k_lim, &fast.g, why, sizeof why) != LOOM_OK) return 0;
    ref = fast;
    ref.ref_walk = true;
    if (cached) {
        cr_assert((fast.cache = mask_cache_new(64, v->view.size)));
        cr_assert((ref.cache = mask_cache_new(64, v->view.size)));
    }
    enum { SEQS = 3 };
    gmatch *m[SEQS], *p[SEQS];
    for (int i = 0; i < SEQS; i++) {
        cr_assert_eq(gmatch_new(&fast, &m[i], why, sizeof why), LOOM_OK);
        cr_assert_eq(gmatch_new(&ref, &p[i], why, sizeof why), LOOM_OK);
    }
    uint32_t mf[LOOM_MASK_WORDS(CF_BYTE_VOCAB_MAX)], mr[LOOM_MASK_WORDS(CF_BYTE_VOCAB_MAX)];
    const size_t words = LOOM_MASK_WORDS(v->view.size);
    int32_t compared = 0;
    for (int step = 0; step < 60; step++) {
        for (int i = 0; i < SEQS; i++) {
            if (gmatch_terminated(m[i])) continue;
            cr_assert_eq(gmatch_fill_mask(m[i], mf, why, sizeof why), LOOM_OK, "%s", why);
            cr_assert_eq(gmatch_fill_mask(p[i], mr, why, sizeof why), LOOM_OK, "%s", why);
            for (size_t w = 0; w < words; w++)
                cr_assert_eq(mf[w], mr[w], "%s %s (%s), seq %d step %d: mask word %zu is %08x, the plain walk's %08x",
                             lang, text, cached ? "cut keys" : "no cache", i, step, w, mf[w], mr[w]);
            /* and an independent one: every token's bytes fed one at a
             * time through the matcher (no trie, no rows, no memo) */
            for (int32_t id = 0; id < v->view.size; id++)
                cr_assert_eq(cu_allowed(mf, id), gmatch_token_allowed(m[i], id),
                             "%s %s (%s), seq %d step %d: token %d %s by the mask, not byte by byte", lang, text,
                             cached ? "cut keys" : "no cache", i, step, id, cu_allowed(mf, id) ? "allowed" : "refused");
            compared++;
            /* the next token: a long piece most of the time, so the text
             * goes deep into strings and the shortcuts meet every depth */
            int32_t ids[CF_BYTE_VOCAB_MAX], n = 0, longs = 0;
            for (int32_t id = 0; id < v->view.size; id++)
                if (cu_allowed(mf, id) && id != v->eog[0]) ids[n++] = id, longs += id >= 256;
            int32_t t = v->eog[0];
            if (n) {
                bool want_long = longs && rng_int(r, 4);
                do t = ids[rng_int(r, n)];
                while (want_long && t < 256);
            }
            cr_assert(gmatch_accept_token(m[i], t) && gmatch_accept_token(p[i], t), "%s: token %d refused", text, t);
        }
    }
    for (int i = 0; i < SEQS; i++) {
        int64_t w, c;
        gmatch_walk_stats(m[i], &w, &c);
        *whole += w, *cut += c;
        gmatch_walk_stats(p[i], &w, &c);
        cr_assert(w == 0 && c == 0, "the reference walk took a shortcut");
        gmatch_free(m[i]), gmatch_free(p[i]);
    }
    mask_cache_free(fast.cache);
    mask_cache_free(ref.cache);
    gram_free(&fast.g);
    return compared;
}

/* The walk's shortcuts (dense rows; subtrees of one uniform class allowed
 * whole or down to a depth without a visit) give masks bit for bit equal
 * to the node-by-node walk, on bounded and unbounded strings, random JSON
 * schemas, regexes and GBNF grammars, with and without cut keys; and both
 * kinds of shortcut are taken. */
Test(match, uniform_subtrees_equal_the_plain_walk) {
    static cu_vocab v;
    uw_vocab_init(&v);
    vtrie *trie;
    char why[256];
    cr_assert_eq(vtrie_build(&v.view, &trie, why, sizeof why), LOOM_OK);
    test_rng r = rng_seeded("uniform_subtrees_equal_the_plain_walk");
    static const char *const fixed[][2] = {
        {"json_object", ""},
        {"json_schema", "{\"type\":\"array\",\"minItems\":4,\"maxItems\":4,\"items\":{\"type\":\"object\","
                        "\"additionalProperties\":false,\"required\":[\"name\",\"tags\"],\"properties\":{\"name\":"
                        "{\"type\":\"string\",\"maxLength\":9},\"tags\":{\"type\":\"array\",\"maxItems\":3,\"items\":"
                        "{\"type\":\"string\",\"maxLength\":5}}}}}"},
        {"regex", "(\"[a-c0 ]{0,7}\",){3}\"x*\""},
        /* plain characters that lead to different sets that both survive:
         * a subtree of a, b and c is allowed down to two bytes only where
         * the longer paths die */
        {"regex", "([abc]{2}[ab]*( [01x]{1,3})*,){2}[abc ]{0,4}"},
        {"gbnf", "root ::= \"[\" item (\",\" item){0,4} \"]\"\nitem ::= \"\\\"\" [abcx01 ]{2,11} \"\\\"\" | [0-9]+\n"},
    };
    int32_t masks = 0, grammars = 0;
    int64_t whole = 0, cut = 0;
    for (int i = 0; i < 5 + 60; i++) {
        gbuf b = {0};
        const char *lang = i < 5 ? fixed[i][0] : (const char *[]){"json_schema", "regex", "gbnf"}[i % 3];
        if (i < 5) gbuf_put(&b, fixed[i][1]);
        else if (i % 3 == 0) bf_schema(&b, &r, 0);
        else if (i % 3 == 1) bf_regex(&b, &r, 0);
        else bf_gbnf(&b, &r);
        cr_assert(!b.oom);
        int32_t n = uw_check(lang, b.s ? b.s : "", &v, trie, &r, i % 2 == 1, &whole, &cut);
        masks += n;
        grammars += n > 0;
        free(b.s);
    }
    cr_assert(grammars >= 40, "only %d of the random grammars compiled", grammars);
    cr_assert(masks > 2000, "%d masks compared", masks);
    cr_assert(whole > 100 && cut > 100, "the shortcuts were taken too rarely: %lld subtrees whole, %lld cut at a depth",
              (long long)whole, (long long)cut);
    cr_log_info("%d grammars, %d masks; subtrees decided without a visit: %lld whole, %lld down to a depth", grammars,
                masks, (long long)whole, (long long)cut);
    vtrie_free(trie);
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
    bool cut_keys;
    int64_t match_steps;
} grammar_cfg;

/* Requests with one language and text share one grammar (and its mask
 * cache); released grammars are kept up to grammar_cache, then freed
 * least recently released first. */
Test(plugin, grammars_are_shared_by_text) {
    void *dl;
    const loom_constraint_ops *ops = load_ops(&dl);
    grammar_cfg cfg = {1 << 20, 100000, 16, 64, 64, 100, 4, 1, true, 4000000};
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
    grammar_cfg cfg = {1 << 20, 100000, 16, 64, 64, 100, 4, 2, true, 4000000};
    void *self, *g = NULL, *m = NULL;
    loom_error err = {0};
    cr_assert_eq(ops->create(h, &cfg, &self, &err), LOOM_OK, "%s", err.message);
    static cu_vocab v;
    cu_vocab_init(&v);
    cr_assert_eq(ops->compile(self, "lark", "a", 1, &v.view, &g, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "unknown language 'lark'"), "%s", err.message);
    cr_assert_null(g);
    const char *bad = "{\"type\":\"string\",\"format\":\"hostname\"}";
    cr_assert_eq(ops->compile(self, "json_schema", bad, strlen(bad), &v.view, &g, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "format 'hostname'"), "%s", err.message);
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

/* ------------------------------------------------- bounds, pattern, format */

/* Every integer near [lo, hi] is taken exactly when it lies inside (the
 * bounds given as the schema spells them: lo_kw / hi_kw may be exclusive,
 * and NULL leaves that side open). */
static void check_int_bounds(const char *lo_kw, double lo, const char *hi_kw, double hi, int64_t from, int64_t to) {
    char schema[256], *at = schema + sprintf(schema, "{\"type\":\"integer\"");
    if (lo_kw) at += sprintf(at, ",\"%s\":%.17g", lo_kw, lo);
    if (hi_kw) at += sprintf(at, ",\"%s\":%.17g", hi_kw, hi);
    strcpy(at, "}");
    char *gbnf = NULL, why[256];
    cr_assert_eq(gram_schema_to_gbnf(schema, strlen(schema), &k_lim, &gbnf, why, sizeof why), LOOM_OK, "%s", why);
    fixture *f = open_grammar(gbnf, &k_lim);
    free(gbnf);
    for (int64_t v = from; v <= to; v++) {
        bool in = (!lo_kw || (strcmp(lo_kw, "minimum") ? (double)v > lo : (double)v >= lo)) &&
                  (!hi_kw || (strcmp(hi_kw, "maximum") ? (double)v < hi : (double)v <= hi));
        char doc[32];
        snprintf(doc, sizeof doc, "%lld", (long long)v);
        gmatch *m;
        cr_assert_eq(gmatch_new(&f->c, &m, why, sizeof why), LOOM_OK);
        bool took = gmatch_accept_bytes(m, (const uint8_t *)doc, strlen(doc)) && gmatch_can_end(m);
        gmatch_free(m);
        cr_assert_eq(took, in, "%s: %s %s", schema, doc, in ? "refused" : "accepted");
    }
    close_grammar(f);
}

Test(schema, integer_bounds_exact) {
    check_int_bounds("minimum", 0, "maximum", 0, -30, 30);
    check_int_bounds("minimum", -15, "maximum", 7, -40, 40);
    check_int_bounds("minimum", 99, "maximum", 101, 0, 1200);
    check_int_bounds("exclusiveMinimum", -1000, "exclusiveMaximum", -101, -1100, 50);
    check_int_bounds("minimum", 7, "maximum", 12345, 0, 13000);
    check_int_bounds("minimum", -2.5, "exclusiveMaximum", 3.25, -10, 10);
    check_int_bounds("minimum", 10, NULL, 0, -20, 1100);
    check_int_bounds(NULL, 0, "maximum", -15, -1100, 20);
    check_int_bounds("exclusiveMinimum", -1, NULL, 0, -20, 20);
    /* random ranges with random probes */
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 40; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t a = (int64_t)(x % 20001) - 10000, b = a + (int64_t)((x >> 20) % 3000);
        check_int_bounds(x & 1 ? "minimum" : "exclusiveMinimum", (double)a, x & 2 ? "maximum" : "exclusiveMaximum",
                         (double)b, a - 40, b + 40);
    }
    expect_docs("{\"type\":\"integer\",\"minimum\":-9007199254740992}",
                (const char *[]){"-9007199254740992", "0", "9999999999999999", NULL},
                (const char *[]){"-9007199254740993", "-0", "01", "10000000000000000", NULL});
}

Test(schema, number_bounds_exact_at_the_ends) {
    expect_docs("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
                (const char *[]){"0", "0.5", "1", "1.000", "0.0000000000000001", "0.9999999999999999", NULL},
                (const char *[]){"1.0001", "-0.1", "-1", "2", "1.5", NULL});
    /* a 16th significant digit could round onto the exclusive bound */
    expect_docs("{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
                (const char *[]){"0.0001", "0.5", "0.999999999999999", "0.000000000000001", NULL},
                (const char *[]){"0", "0.000", "1", "1.0", "0.9999999999999999", "-0.5", NULL});
    expect_docs("{\"type\":\"number\",\"exclusiveMinimum\":5,\"maximum\":100}",
                (const char *[]){"5.00000000000001", "6", "99.9999999999999999", "100", "100.0", NULL},
                (const char *[]){"5", "5.0", "5.000000000000001", "100.01", "4.9", NULL});
    expect_docs("{\"type\":\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":-1}",
                (const char *[]){"-2.5", "-2", "-1.5", "-2.99999999999999", NULL},
                (const char *[]){"-3", "-1", "-1.0", "-0.5", "-3.5", "0", "-2.999999999999999", NULL});
    expect_docs("{\"type\":\"number\",\"minimum\":-1,\"maximum\":1}",
                (const char *[]){"-1", "-0.5", "0", "0.25", "1", "-1.0", NULL},
                (const char *[]){"-1.5", "-1.01", "1.01", "-0", NULL});
    expect_docs("{\"type\":\"number\",\"maximum\":0}", (const char *[]){"0", "-7.5", "-1000", NULL},
                (const char *[]){"0.5", "1", NULL});
}

Test(schema, pattern_escapes_what_json_must) {
    /* a quote, a backslash, a tab and any control character, as JSON writes them */
    expect_docs("{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\\\\\t.$\"}",
                (const char *[]){"\"a\\\"b\\\\\\t\\u0001\"", "\"a\\\"b\\\\\\tx\"", "\"a\\\"b\\\\\\t\\u001F\"",
                                 "\"a\\\"b\\\\\\t\\u001f\"", "\"a\\\"b\\\\\\t\\\"\"", NULL},
                (const char *[]){"\"a\"b\\\\\\tx\"", "\"a\\\"b\\\\\tx\"", "\"a\\\"b\\\\\\t\\n\"",
                                 "\"a\\\"b\\\\\\t\\r\"", "\"a\\\"b\\\\\\t\"", NULL});
    expect_docs("{\"type\":\"string\",\"pattern\":\"[^a-z]\"}",
                (const char *[]){"\"A\"", "\"\\n\"", "\"\\\\\"", "\"\\u0000\"", "\"中\"", NULL},
                (const char *[]){"\"a\"", "\"\n\"", "\"\\u000a\"", "\"\\x\"", NULL});
}

Test(schema, formats_only_valid_values) {
    expect_docs("{\"type\":\"string\",\"format\":\"date\"}",
                (const char *[]){"\"2023-02-28\"", "\"2024-12-31\"", "\"0001-04-30\"", NULL},
                (const char *[]){"\"2023-02-29\"", "\"2023-04-31\"", "\"0000-01-01\"", "\"2023-13-01\"",
                                 "\"2023-1-01\"", NULL});
    expect_docs("{\"type\":\"string\",\"format\":\"time\"}",
                (const char *[]){"\"23:59:59Z\"", "\"00:00:00.123+05:30\"", NULL},
                (const char *[]){"\"12:00:00\"", "\"24:00:00Z\"", "\"12:60:00Z\"", NULL});
    expect_docs("{\"type\":\"string\",\"format\":\"date-time\"}", (const char *[]){"\"2020-06-30T08:00:00-07:00\"", NULL},
                (const char *[]){"\"2020-06-31T08:00:00Z\"", "\"2020-06-30 08:00:00Z\"", NULL});
    expect_docs("{\"type\":\"string\",\"format\":\"ipv4\"}", (const char *[]){"\"255.0.10.1\"", "\"0.0.0.0\"", NULL},
                (const char *[]){"\"256.0.0.1\"", "\"01.0.0.0\"", "\"1.2.3\"", NULL});
    expect_docs("{\"type\":\"string\",\"format\":\"uuid\"}",
                (const char *[]){"\"123e4567-E89B-12d3-a456-426614174000\"", NULL},
                (const char *[]){"\"123e4567e89b12d3a456426614174000\"", NULL});
    expect_docs("{\"type\":\"string\",\"format\":\"email\"}", (const char *[]){"\"a.b+c@ex-1.example.org\"", NULL},
                (const char *[]){"\"a@b\"", "\"a..b@c.d\"", "\"@c.d\"", "\"a@-c.d\"", NULL});
    /* format constrains strings only: beside another type it changes nothing */
    expect_docs("{\"type\":\"integer\",\"format\":\"int32\"}", (const char *[]){"12", NULL}, NULL);
}

/* A repetition whose body can match nothing, nested in another repetition,
 * or alternatives that all lead to one rule: each stack is expanded once
 * per set (match.c), so a mask or a token costs steps in proportion to the
 * stacks, not to the paths (2^40 for the chain below). Counted by the matcher's step counter, not by
 * the clock; every mask must equal the one brute force gives, and the
 * text must be complete (or not) as the language says. */
Test(match, nullable_repetitions_expand_once) {
    gbuf chain = {0}, mixed = {0};
    gbuf_put(&chain, "root ::= c1 \"z\"\n");
    for (int i = 1; i < 40; i++) gbuf_printf(&chain, "c%d ::= c%d | c%d\n", i, i + 1, i + 1);
    gbuf_put(&chain, "c40 ::= \"a\"?\n");
    gbuf_put(&mixed, "root ::= d1 \"z\"\n");
    for (int i = 1; i < 12; i++) gbuf_printf(&mixed, "d%d ::= (d%d)? (d%d){0,2} | \"\"\n", i, i + 1, i + 1);
    gbuf_put(&mixed, "d12 ::= \"a\"?\n");
    cr_assert(!chain.oom && !mixed.oom);
    const struct {
        const char *lang, *text, *input;
        bool complete;
    } cases[] = {
        {"regex", "((a*){0,3}b?)*", "aababb", true},
        {"regex", "(a?)*", "aaa", true},
        {"regex", "(|a)*", "aa", true},
        {"regex", "(a?)+b", "aab", true},
        {"regex", "(((((a?){0,3}){0,3}){0,3}){0,3}){0,3}b", "aaaab", true},
        {"regex", "((a?){0,9}b?){0,9}c", "abaab", false},
        {"regex", "(((a?)*)*b?)*c", "aabbc", true},
        {"regex", "a+,+(\"{1,4}(x{0,3}( +))+|(a+\\]? {2}|0?0{1,4}:){0,3}[a-c]+(a{0,3}(:[^b\"]{2})?,?|\\}{0,3}){0,3})*",
         "aa,,aab", true},
        {"gbnf", "root ::= r1* \"z\"\nr1 ::= r2? r3{0,3}\nr2 ::= \"a\"?\nr3 ::= (r2 | \"\")*\n", "aaz", true},
        {"gbnf", chain.s, "az", true},
        {"gbnf", mixed.s, "aaa", false},
    };
    static cu_vocab v;
    cu_vocab_init(&v);
    vtrie *trie;
    char why[256];
    cr_assert_eq(vtrie_build(&v.view, &trie, why, sizeof why), LOOM_OK);
    int64_t worst = 0;
    gram_limits lim = k_lim;
    lim.max_stacks = 256; /* the plugin's default: "aaaa" of the nested {0,3} has more than 64 parses */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gram_compiled gc = {.trie = trie, .vocab = &v.view, .lim = lim};
        cr_assert_eq(gram_compile_lang(cases[c].lang, cases[c].text, strlen(cases[c].text), &lim, &gc.g, why,
                                       sizeof why),
                     LOOM_OK, "%s: %s", cases[c].text, why);
        gmatch *m;
        cr_assert_eq(gmatch_new(&gc, &m, why, sizeof why), LOOM_OK, "%s", why);
        int64_t before = gmatch_steps(m);
        if (before > worst) worst = before;
        uint32_t mask[LOOM_MASK_WORDS(512)];
        for (const char *p = cases[c].input;; p++) {
            before = gmatch_steps(m);
            cr_assert_eq(gmatch_fill_mask(m, mask, why, sizeof why), LOOM_OK, "%s: %s", cases[c].text, why);
            if (gmatch_steps(m) - before > worst) worst = gmatch_steps(m) - before;
            for (int32_t id = 0; id < v.view.size; id++)
                cr_assert_eq(cu_allowed(mask, id), gmatch_token_allowed(m, id), "%s after %d bytes: token %d",
                             cases[c].text, (int)(p - cases[c].input), id);
            if (!*p) break;
            cr_assert(cu_allowed(mask, (unsigned char)*p), "%s: '%c' refused", cases[c].text, *p);
            before = gmatch_steps(m);
            cr_assert(gmatch_accept_token(m, (unsigned char)*p));
            if (gmatch_steps(m) - before > worst) worst = gmatch_steps(m) - before;
        }
        cr_assert_eq(gmatch_can_end(m), cases[c].complete, "%s: complete after '%s'", cases[c].text, cases[c].input);
        cr_assert(!gmatch_over_budget(m));
        gmatch_free(m);
        gram_free(&gc.g);
    }
    /* polynomial: a few hundred steps an operation here (the chain alone
     * was 2^40 paths); a bound far below any exponential */
    cr_assert(worst < 20000, "an operation took %lld expansion steps", (long long)worst);
    cr_log_info("worst operation: %lld expansion steps", (long long)worst);
    vtrie_free(trie);
    free(chain.s);
    free(mixed.s);
}

/* A grammar whose stacks are all distinct yet never finish within
 * max_stack_depth (every one of 2^80 paths is dropped at the depth limit):
 * past max_match_steps the start, a mask or a token fails with an error
 * naming the limit (and, through the plugin, the grammar), never a hang. */
static void deep_grammar(gbuf *b, const char *first) {
    gbuf_printf(b, "root ::= %s r1\n", first);
    for (int i = 1; i < 80; i++) gbuf_printf(b, "r%d ::= r%d \"x\" | r%d \"y\"\n", i, i + 1, i + 1);
    gbuf_put(b, "r80 ::= \"z\"\n");
}

Test(match, work_budget_fails_by_name) {
    gram_limits lim = k_lim;
    lim.max_match_steps = 100000;
    static cu_vocab v;
    cu_vocab_init(&v);
    vtrie *trie;
    char why[256];
    cr_assert_eq(vtrie_build(&v.view, &trie, why, sizeof why), LOOM_OK);
    gbuf at_start = {0}, after_q = {0};
    deep_grammar(&at_start, "");
    deep_grammar(&after_q, "\"q\"");
    cr_assert(!at_start.oom && !after_q.oom);
    gram_compiled gc = {.trie = trie, .vocab = &v.view, .lim = lim};
    cr_assert_eq(gram_compile_lang("gbnf", at_start.s, strlen(at_start.s), &lim, &gc.g, why, sizeof why), LOOM_OK,
                 "%s", why);
    gmatch *m = NULL;
    cr_assert_eq(gmatch_new(&gc, &m, why, sizeof why), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "max_match_steps (100000)"), "%s", why);
    gram_free(&gc.g);
    /* the start is cheap; the 'q' is not: its mask and the token fail */
    cr_assert_eq(gram_compile_lang("gbnf", after_q.s, strlen(after_q.s), &lim, &gc.g, why, sizeof why), LOOM_OK);
    cr_assert_eq(gmatch_new(&gc, &m, why, sizeof why), LOOM_OK, "%s", why);
    uint32_t mask[LOOM_MASK_WORDS(512)];
    cr_assert_eq(gmatch_fill_mask(m, mask, why, sizeof why), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "max_match_steps (100000)") && gmatch_over_budget(m), "%s", why);
    cr_assert(!gmatch_accept_token(m, 'q') && gmatch_over_budget(m));
    cr_assert(!gmatch_accept_token(m, 'r') && !gmatch_over_budget(m), "a plain refusal is not the budget");
    cr_assert(!gmatch_accept_token(m, 'q') && gmatch_over_budget(m));
    cr_assert(!gmatch_accept_token(m, -1) && !gmatch_over_budget(m), "an invalid id is refused, not over the budget");
    gmatch_free(m);
    gram_free(&gc.g);
    vtrie_free(trie);

    /* through the plugin's ops: the errors name the parameter and the grammar */
    void *dl;
    const loom_constraint_ops *ops = load_ops(&dl);
    grammar_cfg cfg = {1 << 20, 100000, 16, 64, 64, 100, 4, 0, true, 100000};
    void *self, *g = NULL, *pm = NULL;
    loom_error err = {0};
    cr_assert_eq(ops->create(fake_host(), &cfg, &self, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->compile(self, "gbnf", at_start.s, strlen(at_start.s), &v.view, &g, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_eq(ops->matcher_new(self, g, &pm, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "max_match_steps (100000)") && strstr(err.message, "gbnf `root ::=  r1"), "%s",
              err.message);
    ops->grammar_free(self, g);
    cr_assert_eq(ops->compile(self, "gbnf", after_q.s, strlen(after_q.s), &v.view, &g, &err), LOOM_OK);
    cr_assert_eq(ops->matcher_new(self, g, &pm, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(ops->fill_mask(self, pm, mask, &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "max_match_steps (100000)") && strstr(err.message, "gbnf `root ::= \"q\" r1"), "%s",
              err.message);
    cr_assert_eq(ops->accept(self, pm, 'q', &err), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "token 113 took more than max_match_steps (100000)"), "%s", err.message);
    ops->matcher_free(self, pm);
    ops->grammar_free(self, g);
    /* the grammar's start in the message is cut at a character boundary:
     * a two-byte character over the 60-byte cut is left out whole */
    gbuf accented = {0};
    gbuf_put(&accented, "# a");
    for (int i = 0; i < 30; i++) gbuf_put(&accented, "\xc3\xa9"); /* U+00E9, bytes 3..62 */
    gbuf_put(&accented, "\n");
    deep_grammar(&accented, "");
    cr_assert(!accented.oom);
    cr_assert_eq(ops->compile(self, "gbnf", accented.s, strlen(accented.s), &v.view, &g, &err), LOOM_OK, "%s",
                 err.message);
    cr_assert_eq(ops->matcher_new(self, g, &pm, &err), LOOM_ERR_UNSUPPORTED);
    const char *shown = strstr(err.message, "gbnf `# a");
    cr_assert(shown, "%s", err.message);
    const char *end = strstr(shown, "...`");
    cr_assert(end, "%s", err.message);
    const size_t n = (size_t)(end - shown) - strlen("gbnf `# a");
    cr_assert(n % 2 == 0 && n == 56, "%zu bytes of U+00E9 shown, not 56 (28 whole characters; the 29th "
              "straddles the cut): %s", n, err.message);
    ops->grammar_free(self, g);
    free(accented.s);
    ops->destroy(self);
    dlclose(dl);
    free(at_start.s);
    free(after_q.s);
}
