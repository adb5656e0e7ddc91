/*
 * tests/fuzz/fuzz_encode.c — arbitrary bytes through the SmolLM2
 * tokenizer (byte-level BPE, the GPT-2 style pre-tokenizer regexes):
 * encode with and without special tokens, then decode. Checked: ids stay
 * in the vocabulary; with special tokens off the tokens' bytes, joined,
 * are the input with at most some bytes dropped (byte-level BPE is
 * lossless on what its vocabulary can spell; SmolLM2's cannot spell a few
 * bytes, which are dropped as transformers does); the decoded text is
 * valid UTF-8.
 */
#include <stdint.h>

#include "fuzz_util.h"

/* Every byte is either kept or (an unspellable control byte) dropped. */
static bool subsequence(const char *a, size_t na, const char *b, size_t nb) {
    size_t j = 0;
    for (size_t i = 0; i < nb && j < na; i++)
        if (a[j] == b[i]) j++;
    return j == na;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t adv;
        if (loom_utf8_next(s + i, n - i, &adv) != 1) return false;
        i += adv;
    }
    return true;
}

/* The tokens' bytes joined (before decode's UTF-8 repair); malloc'd. */
static char *joined(const loom_tokenizer *t, const int32_t *ids, int32_t n, size_t *len) {
    size_t cap = 1, k = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l;
        loom_tokenizer_piece(t, ids[i], &l);
        cap += l;
    }
    char *s = malloc(cap);
    FUZZ_CHECK(s != NULL);
    for (int32_t i = 0; i < n; i++) {
        size_t l;
        const char *p = loom_tokenizer_piece(t, ids[i], &l);
        memcpy(s + k, p, l);
        k += l;
    }
    *len = k;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    const loom_tokenizer *t = fuzz_smollm2();
    int32_t nv = loom_tokenizer_vocab_size(t);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL, n = 0;
        loom_error err = {0};
        FUZZ_CHECK(loom_tokenizer_encode(t, (const char *)data, size, false, special, &ids, &n, &err) == LOOM_OK);
        for (int32_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv);
        if (!special) {
            size_t jl;
            char *j = joined(t, ids, n, &jl);
            FUZZ_CHECK(subsequence(j, jl, (const char *)data, size));
            free(j);
        }
        char *back = NULL;
        size_t len = 0;
        FUZZ_CHECK(loom_tokenizer_decode_bytes(t, ids, n, false, &back, &len, &err) == LOOM_OK);
        FUZZ_CHECK(valid_utf8((const uint8_t *)back, len));
        free(back);
        free(ids);
    }
    return 0;
}
