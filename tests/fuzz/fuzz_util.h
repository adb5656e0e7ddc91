/*
 * tests/fuzz/fuzz_util.h — what the libFuzzer harnesses share: quiet
 * logging, the SmolLM2 tokenizer from tests/tokenizer/data (loaded once,
 * for the targets that need a real vocabulary) and a NUL-terminated copy
 * of an input. Header-only: each harness is one translation unit.
 */
#ifndef LOOM_FUZZ_UTIL_H
#define LOOM_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/util.h"

#ifndef LOOM_FUZZ_DATA_DIR
#error "LOOM_FUZZ_DATA_DIR (tests/tokenizer/data) must be defined by the build"
#endif

/* Errors are the expected outcome of most inputs: keep stderr for findings. */
static inline void fuzz_quiet(void) { loom_log_set_level(LOOM_LOG_ERROR + 1); }

/* The SmolLM2 tokenizer (byte-level BPE with ChatML), loaded on first use;
 * a missing file is a broken checkout, not a finding: abort with a message. */
static inline const loom_tokenizer *fuzz_smollm2(void) {
    static loom_tokenizer *t;
    if (t) return t;
    loom_error err = {0};
    if (loom_tokenizer_from_json(LOOM_FUZZ_DATA_DIR "/smollm2-tokenizer.json",
                                 LOOM_FUZZ_DATA_DIR "/smollm2-tokenizer_config.json", &t, &err) != LOOM_OK) {
        fprintf(stderr, "fuzz: cannot load the SmolLM2 tokenizer: %s\n", err.message);
        abort();
    }
    return t;
}

/* LOOM_FUZZ_VERBOSE=1: say why an input was refused (to check that seeds
 * load, or see what a corpus file exercises). */
static inline void fuzz_note(const char *what, const loom_error *err) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("LOOM_FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "fuzz: %s: %s\n", what, err->message[0] ? err->message : "ok");
}

/* A malloc'd NUL-terminated copy of n bytes (for APIs that take C strings). */
static inline char *fuzz_cstr(const uint8_t *d, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, d, n);
    s[n] = 0;
    return s;
}

/* An invariant the harness checks broke: report it as a crash. */
#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

#endif
