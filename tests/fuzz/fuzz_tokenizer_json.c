/*
 * tests/fuzz/fuzz_tokenizer_json.c — tokenizer.json bytes through the
 * loader (loom_tokenizer_from_json_buffer: vocabulary, merges, added
 * tokens, normalizers, pre-tokenizers and their Split regexes), and a
 * tokenizer that loads through encode, decode and the streaming decoder on
 * a few fixed texts, and through its chat template.
 *
 * Input: tokenizer.json, optionally followed by "\n#CONFIG#\n" and a
 * tokenizer_config.json (chat_template, bos/eos, add_bos_token).
 */
#include <stdint.h>

#include "fuzz_util.h"

#define TEXT(s) {s, sizeof s - 1}
static const struct {
    const char *s;
    size_t n;
} k_texts[] = {TEXT(""), TEXT("ab"), TEXT("Hello, world!"), TEXT("  12345 naïve 😀\n\tx"), TEXT("a\0b"),
               TEXT("<|eot_id|> <x> \xE2\x96\x81" "a")};

/* Streaming every id then flushing equals decoding them all (tokenizer.h). */
static void check_stream(const loom_tokenizer *t, const int32_t *ids, int32_t n, const char *whole,
                         size_t whole_len) {
    size_t cap = loom_tokenizer_max_piece_len(t) + LOOM_DETOK_PENDING_MAX + 1;
    char *buf = malloc(cap), *acc = malloc(whole_len + 1);
    FUZZ_CHECK(buf && acc);
    size_t got = 0, k;
    loom_detok d;
    loom_detok_init(&d, t, false);
    for (int32_t i = 0; i < n; i++) {
        k = loom_detok_push(&d, ids[i], buf, cap);
        FUZZ_CHECK(got + k <= whole_len);
        memcpy(acc + got, buf, k);
        got += k;
    }
    while ((k = loom_detok_flush(&d, buf, cap)) > 0) {
        FUZZ_CHECK(got + k <= whole_len);
        memcpy(acc + got, buf, k);
        got += k;
    }
    FUZZ_CHECK(got == whole_len && memcmp(acc, whole, got) == 0);
    free(buf);
    free(acc);
}

/* The conversation of the chat template check: its default system prompt,
 * the family the template names. */
static void check_chat(const loom_tokenizer *t) {
    static const loom_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "<|im_end|>x"}};
    char *s = NULL;
    loom_error err = {0};
    if (loom_chat_apply(t, LOOM_CHAT_AUTO, m, 3, true, &s, &err) == LOOM_OK) free(s);
    int32_t *ids = NULL, n = 0;
    if (loom_chat_encode(t, LOOM_CHAT_AUTO, m, 3, true, &ids, &n, &err) == LOOM_OK) free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    static const char sep[] = "\n#CONFIG#\n";
    const char *cfg = memmem(data, size, sep, sizeof sep - 1);
    size_t tn = cfg ? (size_t)(cfg - (const char *)data) : size, cn = cfg ? size - tn - (sizeof sep - 1) : 0;
    loom_tokenizer *t = NULL;
    loom_error err = {0};
    loom_status st = loom_tokenizer_from_json_buffer((const char *)data, tn, cfg ? cfg + sizeof sep - 1 : NULL, cn,
                                                     "fuzz.json", &t, &err);
    fuzz_note("tokenizer", &err);
    if (st != LOOM_OK) {
        FUZZ_CHECK(t == NULL && err.message[0]);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_texts / sizeof *k_texts; i++) {
        int32_t *ids = NULL, n = 0;
        if (loom_tokenizer_encode(t, k_texts[i].s, k_texts[i].n, true, true, &ids, &n, &err) != LOOM_OK) continue;
        char *back = NULL;
        size_t len = 0;
        if (loom_tokenizer_decode_bytes(t, ids, n, false, &back, &len, &err) == LOOM_OK) {
            check_stream(t, ids, n, back, len);
            free(back);
        }
        free(ids);
    }
    check_chat(t);
    loom_tokenizer_free(t);
    return 0;
}
