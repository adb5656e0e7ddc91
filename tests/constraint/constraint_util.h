/*
 * tests/constraint/constraint_util.h — a synthetic vocabulary for the
 * grammar constraint's tests: every single byte (so any text can be
 * spelled), multi-byte pieces that cross JSON's structure ("{\"", "\":",
 * "],"), whole and partial UTF-8 characters, a control token that is never
 * allowed and an end-of-generation token (the last id): the conformance
 * kit's byte vocabulary over cu_multi. Header-only.
 */
#ifndef LOOM_TEST_CONSTRAINT_UTIL_H
#define LOOM_TEST_CONSTRAINT_UTIL_H

#include <stdint.h>
#include <string.h>

#include "../../conformance/cf_byte_vocab.h"
#include "loom/constraint.h"

static const char *const cu_multi[] = {
    "{\"", "\":", "\",", "\"}", " \"", "\": \"", "\":\"", "true", "false", "null", ", ", ",\n", "[", "]}", "],",
    "}]", "}}", "0", "12", "3.5", "-1", "1e5", "e+", "\\n", "\\\"", "\\u00e9", "{\n  \"", "\n}", "ab", "name",
    "id", "value", "é", "中文", "\xe4\xb8", "\xad", "😀", "  ", "\t", "\":[", "\":{", "\": ", "{}", "[]", "\"\"",
    "tr", "ue", "nu", "ll", "fa", "lse", "00", "0.", ".0", "E-", "a b", "x\"", "\"a", "1,", "2]", NULL};

typedef cf_byte_vocab cu_vocab;

/* Ids: 0..255 bytes, then cu_multi, then a control token, then eog. */
static inline void cu_vocab_init(cu_vocab *v) { (void)cf_byte_vocab_init(v, cu_multi); }

static inline bool cu_allowed(const uint32_t *mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

#endif
