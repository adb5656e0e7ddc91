/*
 * tests/fuzz/fuzz_openai.c — request bodies through the OpenAI parser of
 * `loom serve` (cli/serve/openai.c, no HTTP): both routes, the prompt-size
 * measure the server checks before tokenizing, the error body for the
 * parser's message, and a parsed conversation through the chat template.
 * First input byte: the route, its low two bits (0: completions, 1: chat,
 * 2: tokenize, 3: detokenize); bits 2-3 the chat template family tool
 * calls are rendered for and read in (chatml, llama3, mistral, chatml). A
 * request offering tools has them rendered, and the body itself read as a
 * model's answer: every call read has a JSON object as its arguments.
 */
#include <stdint.h>

#include "fuzz_util.h"
#include "serve/openai.h"

/* What the server does with a refusal: an error body that is valid JSON. */
static void check_error_body(const char *why, const char *param) {
    char *e = serve_error_json(400, why, param);
    FUZZ_CHECK(e != NULL);
    cJSON *back = cJSON_Parse(e);
    FUZZ_CHECK(back != NULL);
    cJSON_Delete(back);
    free(e);
}

/* The tool side of a parsed request: render its tools and tool turns, and
 * read `answer` as the model's reply. */
static void fuzz_tools(serve_req *q, const char *family, const char *answer, size_t len) {
    char why[512];
    const char *param = NULL;
    if (!serve_req_apply_tools(q, family, why, sizeof why, &param)) check_error_body(why, param);
    serve_tool_call calls[4];
    size_t content = 0;
    int32_t n = serve_tool_calls_parse(family, q->tools, q->num_tools, answer, len, calls, 4, &content);
    FUZZ_CHECK(n >= 0 && n <= 4 && content <= len);
    for (int32_t i = 0; i < n; i++) {
        cJSON *a = cJSON_Parse(calls[i].arguments);
        FUZZ_CHECK(cJSON_IsObject(a));
        cJSON_Delete(a);
    }
    serve_tool_calls_free(calls, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 1) return 0;
    static const serve_api routes[4] = {SERVE_COMPLETIONS, SERVE_CHAT, SERVE_TOKENIZE, SERVE_DETOKENIZE};
    serve_api api = routes[data[0] & 3];
    char *body = fuzz_cstr(data + 1, size - 1); /* serve_parse wants body[len] == 0 */
    serve_req q;
    char why[512];
    const char *param = NULL;
    if (serve_parse(api, body, size - 1, 16, &q, why, sizeof why, &param)) {
        int32_t which = 0;
        (void)serve_prompt_bytes(&q, &which);
        static const char *const families[4] = {"chatml", "llama3", "mistral", "chatml"};
        fuzz_tools(&q, families[(data[0] >> 2) & 3], body, size - 1);
        if (q.base.num_messages > 0) {
            loom_chat_msg *m = calloc((size_t)q.base.num_messages, sizeof *m);
            FUZZ_CHECK(m != NULL);
            for (int32_t i = 0; i < q.base.num_messages; i++)
                m[i] = (loom_chat_msg){q.base.messages[i].role, q.base.messages[i].content};
            int32_t *ids = NULL, n = 0;
            loom_error err = {0};
            if (loom_chat_encode(fuzz_smollm2(), LOOM_CHAT_AUTO, m, q.base.num_messages, true, &ids, &n, &err) ==
                LOOM_OK)
                free(ids);
            free(m);
        }
        serve_req_free(&q);
    } else {
        check_error_body(why, param);
    }
    free(body);
    return 0;
}
