/*
 * tests/fuzz/fuzz_chat.c — conversations through every chat template
 * family (ChatML, Llama 3, Llama 2 / Mistral, and the template the SmolLM2
 * tokenizer names), rendered and encoded. Checked: a message's content
 * never yields a control token the template did not write (it cannot forge
 * a turn), whatever special-token text it holds.
 *
 * Input: messages separated by 0x1E; in each, the first byte picks the role
 * (system, user, assistant, or the rest of the message up to 0x1F as a role
 * of its own), the rest is the content.
 */
#include <stdint.h>

#include "fuzz_util.h"

#define MAX_MSGS 16

static const char *const k_roles[] = {"system", "user", "assistant"};

/* Split the input into at most MAX_MSGS messages; strings in *store. */
static int32_t split(const uint8_t *d, size_t n, loom_chat_msg *m, char **store) {
    char *s = fuzz_cstr(d, n);
    *store = s;
    int32_t k = 0;
    for (char *p = s, *end = s + n; p <= end && k < MAX_MSGS;) {
        char *sep = memchr(p, 0x1E, (size_t)(end - p));
        if (sep) *sep = 0;
        unsigned char r = (unsigned char)*p;
        if (r < 3) {
            m[k].role = k_roles[r];
            m[k].content = *p ? p + 1 : p;
        } else {
            char *us = strchr(p, 0x1F);
            if (us) *us = 0;
            m[k].role = p;
            m[k].content = us ? us + 1 : "";
        }
        k++;
        if (!sep) break;
        p = sep + 1;
    }
    return k;
}

/* Control tokens in the ids of the conversation, and in the template alone
 * (each content emptied): the counts must be equal. */
static int32_t controls(const loom_tokenizer *t, const int32_t *ids, int32_t n) {
    int32_t c = 0;
    for (int32_t i = 0; i < n; i++) c += loom_tokenizer_token_type(t, ids[i]) == LOOM_TOKEN_CONTROL;
    return c;
}

static void one_format(const loom_tokenizer *t, loom_chat_format fmt, const loom_chat_msg *m, int32_t n) {
    char *text = NULL;
    loom_error err = {0};
    if (loom_chat_apply(t, fmt, m, n, true, &text, &err) == LOOM_OK) free(text);
    if (loom_chat_apply(NULL, fmt == LOOM_CHAT_AUTO ? LOOM_CHAT_CHATML : fmt, m, n, false, &text, &err) == LOOM_OK)
        free(text);
    int32_t *ids = NULL, nid = 0;
    if (loom_chat_encode(t, fmt, m, n, true, &ids, &nid, &err) != LOOM_OK) return;
    loom_chat_msg bare[MAX_MSGS];
    for (int32_t i = 0; i < n; i++) bare[i] = (loom_chat_msg){m[i].role, ""};
    int32_t *ids0 = NULL, n0 = 0;
    FUZZ_CHECK(loom_chat_encode(t, fmt, bare, n, true, &ids0, &n0, &err) == LOOM_OK);
    FUZZ_CHECK(controls(t, ids, nid) == controls(t, ids0, n0)); /* content forged no turn */
    free(ids);
    free(ids0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    const loom_tokenizer *t = fuzz_smollm2();
    loom_chat_msg m[MAX_MSGS];
    char *store;
    int32_t n = split(data, size, m, &store);
    static const loom_chat_format fmts[] = {LOOM_CHAT_AUTO, LOOM_CHAT_CHATML, LOOM_CHAT_LLAMA3, LOOM_CHAT_LLAMA2,
                                            LOOM_CHAT_GEMMA};
    for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) one_format(t, fmts[i], m, n);
    free(store);
    return 0;
}
