/*
 * plugins/constraint/grammar/lang.c — one entry from a language name and
 * its text to a compiled grammar: JSON schemas, "any JSON object" and
 * regexes are translated to GBNF first, then everything goes through the
 * GBNF compiler. A translation may be several times longer than what it
 * came from, so its GBNF is held to 8 x max_text_bytes (the schema and
 * regex translators' own cap).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"

loom_status gram_compile_lang(const char *lang, const char *text, size_t len, const gram_limits *lim, gram *out,
                              char *why, size_t cap) {
    char *gbnf = NULL;
    loom_status st;
    memset(out, 0, sizeof *out);
    if (!text) len = 0;
    if (!strcmp(lang, "json_schema")) {
        if (len == 0) {
            snprintf(why, cap, "json_schema needs a schema");
            return LOOM_ERR_INVALID;
        }
        st = gram_schema_to_gbnf(text, len, lim, &gbnf, why, cap);
    } else if (!strcmp(lang, "json_object")) {
        st = gram_schema_to_gbnf(NULL, 0, lim, &gbnf, why, cap);
    } else if (!strcmp(lang, "regex")) {
        st = gram_regex_to_gbnf(text ? text : "", len, lim, &gbnf, why, cap);
    } else if (!strcmp(lang, "gbnf")) {
        return gram_parse(text ? text : "", len, lim, out, why, cap);
    } else {
        snprintf(why, cap, "unknown language '%.64s' (known: json_schema, json_object, regex, gbnf)", lang);
        return LOOM_ERR_UNSUPPORTED;
    }
    if (st == LOOM_OK) {
        gram_limits wide = *lim;
        wide.max_text_bytes = 8 * lim->max_text_bytes;
        st = gram_parse(gbnf, strlen(gbnf), &wide, out, why, cap);
    }
    free(gbnf);
    return st;
}
