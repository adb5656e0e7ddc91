/*
 * tests/serve/test_tools.c — tool calling's text side (cli/serve/tools.c):
 * the offered tools and tool turns rendered per chat template family
 * (Hermes / Qwen2.5 on chatml, Llama 3.1 JSON on llama3, Mistral v3 on
 * mistral, with golden strings as mistral-common writes them; refused
 * elsewhere), and the model's answer read back into calls — well-formed
 * calls, text around them, and hostile or malformed answers, which stay
 * content and never crash, hang or yield arguments that are not a JSON
 * object.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/tools.h"

static cJSON *g_defs;
static serve_tool g_tools[2];

static void tools_setup(void) {
    g_defs = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                         "{\"type\": \"object\"}}}, {\"type\": \"function\", \"function\": {\"name\": \"add\"}}]");
    cr_assert_not_null(g_defs);
    g_tools[0] = (serve_tool){"get_weather", cJSON_GetArrayItem(g_defs, 0)};
    g_tools[1] = (serve_tool){"add", cJSON_GetArrayItem(g_defs, 1)};
}

static void tools_teardown(void) { cJSON_Delete(g_defs); }

TestSuite(tools, .init = tools_setup, .fini = tools_teardown);

/* Calls read from text; each call's arguments must be a JSON object. */
static int32_t parse(const char *family, const char *text, serve_tool_call *calls, int32_t max, size_t *content) {
    int32_t n = serve_tool_calls_parse(family, g_tools, 2, text, strlen(text), calls, max, content);
    cr_assert(n >= 0 && n <= max);
    cr_assert_leq(*content, strlen(text));
    for (int32_t i = 0; i < n; i++) {
        cJSON *a = cJSON_Parse(calls[i].arguments);
        cr_assert(cJSON_IsObject(a), "call %d arguments '%s'", i, calls[i].arguments);
        cJSON_Delete(a);
    }
    return n;
}

/* Whatever the text, no call: it stays content, whole. */
static void stays_content(const char *family, const char *text) {
    serve_tool_call calls[4];
    size_t content;
    cr_assert_eq(parse(family, text, calls, 4, &content), 0, "%s: '%s' read as a call", family, text);
    cr_assert_eq(content, strlen(text), "'%s'", text);
}

Test(tools, hermes_calls_read) {
    serve_tool_call calls[4];
    size_t content;
    const char *one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    cr_assert_eq(parse("chatml", one, calls, 4, &content), 1);
    cr_assert_str_eq(calls[0].name, "get_weather");
    cr_assert_str_eq(calls[0].arguments, "{\"city\":\"Rome\"}");
    cr_assert_eq(content, 0);
    serve_tool_calls_free(calls, 1);
    const char *two = "Let me check.\n\n<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>\n";
    cr_assert_eq(parse("chatml", two, calls, 4, &content), 2);
    cr_assert_str_eq(calls[0].arguments, "{\"a\":1}", "arguments given as JSON text are read");
    cr_assert_str_eq(calls[1].arguments, "{}", "no arguments: an empty object");
    cr_assert_eq(content, strlen("Let me check."), "the text before the calls, trailing space left out");
    serve_tool_calls_free(calls, 2);
    /* cut off by max_tokens after its JSON: the call is whole all the same */
    cr_assert_eq(parse("chatml", "<tool_call>{\"name\": \"add\", \"arguments\": {}}\n</tool_", calls, 4, &content), 0,
                 "a half-written close tag is not space");
    cr_assert_eq(parse("chatml", "<tool_call>{\"name\": \"add\", \"arguments\": {}}\n", calls, 4, &content), 1);
    serve_tool_calls_free(calls, 1);
    /* parallel_tool_calls false: max 1, two calls stay text */
    cr_assert_eq(parse("chatml", two, calls, 1, &content), 0);
}

Test(tools, hermes_malformed_stays_content) {
    stays_content("chatml", "no call here");
    stays_content("chatml", "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>"); /* not offered */
    stays_content("chatml", "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>");
    stays_content("chatml", "<tool_call>{\"name\": \"add\", \"arguments\": \"not json\"}</tool_call>");
    stays_content("chatml", "<tool_call>{\"name\": 7}</tool_call>");
    stays_content("chatml", "<tool_call>[\"add\"]</tool_call>");
    stays_content("chatml", "<tool_call>{\"name\": \"add\"} trailing</tool_call>");
    stays_content("chatml", "<tool_call>{\"name\": \"add\"}</tool_call> and then some text");
    stays_content("chatml", "<tool_call>{\"name\": \"add\"</tool_call>");
    stays_content("chatml", "<tool_call></tool_call>");
    stays_content("chatml", "<tool_call>");
    stays_content("chatml", "<tool_call><tool_call><tool_call>");
    stays_content("chatml", "</tool_call>{\"name\": \"add\"}");
    stays_content("chatml", "<tool_call>{\"name\": \"add\", \"name\": \"add\", \"arguments\": {\"a\": \"\\ud800\"}");
    stays_content("llama3", "<tool_call>{\"name\": \"add\"}</tool_call>");
    stays_content("llama2", "<tool_call>{\"name\": \"add\"}</tool_call>");
    stays_content(NULL, "{\"name\": \"add\"}");
}

Test(tools, llama3_calls_read) {
    serve_tool_call calls[4];
    size_t content;
    cr_assert_eq(parse("llama3", " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", calls, 4,
                       &content), 1);
    cr_assert_str_eq(calls[0].arguments, "{\"city\":\"Rome\"}");
    cr_assert_eq(content, 0);
    serve_tool_calls_free(calls, 1);
    cr_assert_eq(parse("llama3", "<|python_tag|>{\"name\": \"add\", \"parameters\": {}}; {\"name\": \"add\", "
                       "\"arguments\": {\"b\": 2}}", calls, 4, &content), 2);
    cr_assert_str_eq(calls[1].arguments, "{\"b\":2}");
    serve_tool_calls_free(calls, 2);
    stays_content("llama3", "The weather is fine.");
    stays_content("llama3", "{\"name\": \"add\"} and more");
    stays_content("llama3", "{\"name\": \"nope\", \"parameters\": {}}");
    stays_content("llama3", "{\"name\": \"add\", \"parameters\": 3}");
    stays_content("llama3", "{\"name\": \"add\";");
    stays_content("llama3", "{");
    stays_content("llama3", "");
}

/* 20000 copies of the bases (in turn), each with 3 random bytes spliced
 * in, read by each family (parse() checks every call it reads); s holds
 * the longest base. */
static void parse_mutations(const char *const *bases, int nb, const char *const *families, int nf, unsigned seed,
                            char *s) {
    serve_tool_call calls[4];
    size_t content;
    for (int it = 0; it < 20000; it++) {
        strcpy(s, bases[it % nb]);
        size_t len = strlen(s);
        for (int k = 0; k < 3; k++) {
            seed = seed * 1103515245u + 12345u;
            s[(seed >> 8) % len] = (char)(1 + (seed >> 16) % 255);
        }
        for (int f = 0; f < nf; f++) {
            int32_t got = parse(families[f], s, calls, 4, &content);
            serve_tool_calls_free(calls, got);
        }
    }
}

/* Hostile answers: deep nesting, many calls, huge repeats — bounded work,
 * no call unless it is well-formed, never past max calls. */
Test(tools, hostile_answers, .timeout = 30) {
    const size_t big = 1 << 20;
    char *s = malloc(big + 64);
    strcpy(s, "<tool_call>{\"name\": \"add\", \"arguments\": ");
    size_t n = strlen(s);
    while (n < big) s[n++] = '[';
    s[n] = 0;
    stays_content("chatml", s);
    s[0] = 0;
    for (n = 0; n + 12 < big; n += 11) memcpy(s + n, "<tool_call>", 11);
    s[n] = 0;
    stays_content("chatml", s);
    /* more calls than allowed: all text, none read */
    s[0] = 0;
    for (int i = 0; i <= SERVE_MAX_TOOL_CALLS; i++) strcat(s, "<tool_call>{\"name\": \"add\"}</tool_call>");
    serve_tool_call calls[SERVE_MAX_TOOL_CALLS];
    size_t content;
    cr_assert_eq(parse("chatml", s, calls, SERVE_MAX_TOOL_CALLS, &content), 0);
    s[strlen(s) - strlen("<tool_call>{\"name\": \"add\"}</tool_call>")] = 0;
    cr_assert_eq(parse("chatml", s, calls, SERVE_MAX_TOOL_CALLS, &content), SERVE_MAX_TOOL_CALLS);
    serve_tool_calls_free(calls, SERVE_MAX_TOOL_CALLS);
    /* random bytes spliced into a call: never a crash, arguments always an object */
    const char *base[] = {"ok <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"n\": "
                          "[1, 2]}}</tool_call>"};
    parse_mutations(base, 1, (const char *[]){"chatml", "llama3"}, 2, 12345, s);
    free(s);
}

Test(tools, stream_holds_back_what_may_be_a_call) {
    cr_assert_eq(serve_tool_stream_safe("chatml", "Hello", 5), 5);
    cr_assert_eq(serve_tool_stream_safe("chatml", "Hello <tool", 11), 6);
    cr_assert_eq(serve_tool_stream_safe("chatml", "Hello <tool_call>{", 18), 6);
    cr_assert_eq(serve_tool_stream_safe("chatml", "a <b", 4), 4, "'<b' cannot begin <tool_call>");
    cr_assert_eq(serve_tool_stream_safe("chatml", "x<", 2), 1);
    cr_assert_eq(serve_tool_stream_safe("llama3", "  {\"na", 6), 0);
    cr_assert_eq(serve_tool_stream_safe("llama3", "  ", 2), 0);
    cr_assert_eq(serve_tool_stream_safe("llama3", "Sure", 4), 4);
}

/* Rendered messages, and the texts they hold (freed here). */
typedef struct rendered {
    loom_chat_message *m;
    int32_t n;
    char **store;
    int32_t ns;
} rendered;

static rendered render_ok(const char *family, int32_t nt, const serve_tool_msg *msgs, int32_t n) {
    rendered r = {0};
    char why[256];
    cr_assert(serve_tools_render(family, g_tools, nt, msgs, n, &r.m, &r.n, &r.store, &r.ns, why, sizeof why), "%s",
              why);
    return r;
}

static void rendered_free(rendered *r) {
    for (int32_t i = 0; i < r->ns; i++) free(r->store[i]);
    free(r->store);
    free(r->m);
}

Test(tools, hermes_rendering) {
    cJSON *calls = cJSON_Parse("[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                               "\"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}}]");
    serve_tool_msg m[] = {{"system", "Be brief.", NULL}, {"user", "Weather in Rome?", NULL},
                          {"assistant", NULL, calls}, {"tool", "18 C", NULL}, {"tool", "sunny", NULL},
                          {"user", "Thanks", NULL}};
    rendered r = render_ok("chatml", 2, m, 6);
    cr_assert_eq(r.n, 5, "two tool results make one user turn");
    cr_assert_str_eq(r.m[0].role, "system");
    cr_assert(!strncmp(r.m[0].content, "Be brief.\n\n# Tools", 18), "%s", r.m[0].content);
    cr_assert(strstr(r.m[0].content, "<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\""));
    cr_assert(strstr(r.m[0].content, "\"name\":\"add\"}}\n</tools>"), "%s", r.m[0].content);
    cr_assert_str_eq(r.m[2].content, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}\n"
                                     "</tool_call>");
    cr_assert_str_eq(r.m[3].role, "user");
    cr_assert_str_eq(r.m[3].content, "<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n"
                                     "</tool_response>");
    cr_assert_str_eq(r.m[4].content, "Thanks");
    rendered_free(&r);
    /* no system message: one is made for the tools; no tools: none is */
    r = render_ok("chatml", 2, m + 1, 1);
    cr_assert_eq(r.n, 2);
    cr_assert(!strncmp(r.m[0].content, "# Tools", 7));
    rendered_free(&r);
    r = render_ok("chatml", 0, m + 1, 3);
    cr_assert_eq(r.n, 3);
    cr_assert_str_eq(r.m[0].role, "user");
    rendered_free(&r);
    cJSON_Delete(calls);
}

Test(tools, llama3_rendering_and_refusals) {
    cJSON *calls = cJSON_Parse("[{\"function\": {\"name\": \"add\", \"arguments\": {\"a\": 1}}}]");
    serve_tool_msg m[] = {{"system", "S", NULL}, {"user", "Add one", NULL}, {"assistant", "", calls},
                          {"tool", "2", NULL}};
    rendered r = render_ok("llama3", 2, m, 4);
    cr_assert_eq(r.n, 4);
    cr_assert_str_eq(r.m[0].content, "S");
    cr_assert(!strncmp(r.m[1].content, "Given the following functions", 29));
    cr_assert(strstr(r.m[1].content, "\n\nAdd one"), "the question after the tools: %s", r.m[1].content);
    cr_assert_str_eq(r.m[2].content, "{\"name\":\"add\",\"parameters\":{\"a\":1}}");
    cr_assert_str_eq(r.m[3].role, "ipython");
    rendered_free(&r);
    char why[256];
    loom_chat_message *out;
    int32_t n, ns;
    char **store;
    cr_assert(!serve_tools_render("llama3", g_tools, 2, m, 1, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "first user message"), "%s", why);
    cr_assert(!serve_tools_render("llama2", g_tools, 2, m, 2, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "model's is llama2"), "%s", why);
    cr_assert(!serve_tools_render(NULL, g_tools, 2, m, 2, &out, &n, &store, &ns, why, sizeof why));
    cJSON *two = cJSON_Parse("[{\"function\": {\"name\": \"add\"}}, {\"function\": {\"name\": \"add\"}}]");
    serve_tool_msg m2[] = {{"user", "x", NULL}, {"assistant", NULL, two}};
    cr_assert(!serve_tools_render("llama3", g_tools, 2, m2, 2, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "one per assistant turn"), "%s", why);
    cJSON *bad = cJSON_Parse("[{\"function\": {\"name\": \"add\", \"arguments\": \"[1]\"}}]");
    serve_tool_msg m3[] = {{"user", "x", NULL}, {"assistant", NULL, bad}};
    cr_assert(!serve_tools_render("chatml", g_tools, 2, m3, 2, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "messages[1].tool_calls[0].function.arguments"), "%s", why);
    cJSON_Delete(calls), cJSON_Delete(two), cJSON_Delete(bad);
}

/* tool_choice required / named: the schema the answer is held to, and the
 * answer read back; what is not a complete list of offered calls stays
 * content. */
Test(tools, forced_schema_and_parse) {
    char *named = serve_tool_forced_schema(g_tools, 2, "get_weather", 4);
    cr_assert_str_eq(named, "{\"type\":\"object\"}", "the function's own parameters");
    free(named);
    cr_assert_null(serve_tool_forced_schema(g_tools, 2, "nope", 4));
    char *req = serve_tool_forced_schema(g_tools, 2, NULL, 3);
    cJSON *s = cJSON_Parse(req);
    cr_assert_eq(cJSON_GetObjectItem(s, "maxItems")->valueint, 3);
    cr_assert_eq(cJSON_GetObjectItem(s, "minItems")->valueint, 1);
    const cJSON *any = cJSON_GetObjectItem(cJSON_GetObjectItem(s, "items"), "anyOf");
    cr_assert_eq(cJSON_GetArraySize(any), 2);
    const cJSON *add = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(any, 1), "properties"), "parameters");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(add, "additionalProperties")), "no parameters: an empty object");
    cJSON_Delete(s);
    free(req);

    serve_tool_call calls[3];
    const char *two = " [{\"name\": \"add\", \"parameters\": {}}, {\"name\": \"get_weather\", \"parameters\": "
                      "{\"city\": \"Oslo\"}}] ";
    cr_assert_eq(serve_tool_forced_parse(g_tools, 2, NULL, two, strlen(two), calls, 3), 2);
    cr_assert_str_eq(calls[1].name, "get_weather");
    cr_assert_str_eq(calls[1].arguments, "{\"city\":\"Oslo\"}");
    serve_tool_calls_free(calls, 2);
    cr_assert_eq(serve_tool_forced_parse(g_tools, 2, NULL, two, strlen(two), calls, 1), 0, "more than max");
    const char *bad[] = {"", "[]", "[{\"name\": \"add\", \"parameters\": {}}", "[{\"name\": \"x\", \"parameters\": {}}]",
                         "[{\"name\": \"add\", \"parameters\": 3}]", "[{\"name\": \"add\"}] tail", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(serve_tool_forced_parse(g_tools, 2, NULL, bad[i], strlen(bad[i]), calls, 3), 0, "'%s'", bad[i]);
    const char *args = "{\"city\": \"Ber";
    cr_assert_eq(serve_tool_forced_parse(g_tools, 2, "get_weather", args, strlen(args), calls, 3), 1);
    cr_assert_str_eq(calls[0].arguments, args, "a named call's arguments are the text, as streamed");
    serve_tool_calls_free(calls, 1);
}

/* Mistral (tokenizer v3): the strings mistral-common encodes between the
 * control tokens, which json.dumps writes with ", " and ": ". */
Test(tools, mistral_rendering_golden) {
    cJSON *calls = cJSON_Parse("[{\"id\": \"call_abc123def\", \"type\": \"function\", \"function\": {\"name\": "
                               "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\", \\\"n\\\": [1, 2.5]}\"}}]");
    serve_tool_msg m[] = {{"system", "Be brief.", NULL, NULL},
                          {"user", "Hi", NULL, NULL},
                          {"assistant", "Hello.", NULL, NULL},
                          {"user", "Weather in Rome?", NULL, NULL},
                          {"assistant", "", calls, NULL},
                          {"tool", "{\"temp\": 18}", NULL, "call_abc123def"},
                          {"tool", "sunny \"mostly\"\n\x01\xc3\xa9", NULL, "abc123def"}};
    rendered r = render_ok("mistral", 2, m, 7);
    cr_assert_eq(r.n, 7, "the tools add one turn, the system message joins the last user turn");
    const char *roles[] = {"user", "assistant", "available_tools", "user", "tool_calls", "tool_results",
                           "tool_results"};
    for (int i = 0; i < 7; i++) cr_assert_str_eq(r.m[i].role, roles[i], "message %d", i);
    cr_assert_str_eq(r.m[0].content, "Hi");
    cr_assert_str_eq(r.m[2].content,
                     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"\", "
                     "\"parameters\": {\"type\": \"object\"}}}, {\"type\": \"function\", \"function\": {\"name\": "
                     "\"add\", \"description\": \"\", \"parameters\": {}}}]",
                     "before the last user message, as mistral-common's Tool models dump");
    cr_assert_str_eq(r.m[3].content, "Be brief.\n\nWeather in Rome?", "mistral-common v3 puts the system prompt "
                     "before the last user message");
    cr_assert_str_eq(r.m[4].content,
                     "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"n\": [1, 2.5]}, \"id\": "
                     "\"abc123def\"}]",
                     "a call id becomes its last 9 letters and digits");
    cr_assert_str_eq(r.m[5].content, "{\"content\": {\"temp\": 18}, \"call_id\": \"abc123def\"}",
                     "a result that is JSON is embedded as JSON");
    cr_assert_str_eq(r.m[6].content, "{\"content\": \"sunny \\\"mostly\\\"\\n\\u0001\xc3\xa9\", \"call_id\": "
                     "\"abc123def\"}", "else as a string, non-ASCII kept as json.dumps(ensure_ascii=False) does");
    rendered_free(&r);
    cJSON_Delete(calls);
}

Test(tools, mistral_refusals) {
    char why[256];
    loom_chat_message *out;
    int32_t n, ns;
    char **store;
    cJSON *calls = cJSON_Parse("[{\"id\": \"ab_12\", \"function\": {\"name\": \"add\", \"arguments\": {}}}]");
    serve_tool_msg m[] = {{"user", "x", NULL, NULL}, {"assistant", NULL, calls, NULL}, {"tool", "1", NULL, NULL}};
    cr_assert(!serve_tools_render("mistral", g_tools, 2, m, 2, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "messages[1].tool_calls[0] needs an id with at least 9"), "%s", why);
    cJSON_Delete(calls);
    calls = cJSON_Parse("[{\"id\": \"abcdefghi\", \"function\": {\"name\": \"add\", \"arguments\": {}}}]");
    m[1].tool_calls = calls;
    cr_assert(!serve_tools_render("mistral", g_tools, 2, m, 3, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "messages[2] (role tool) needs a tool_call_id"), "%s", why);
    m[1].content = "I will call it.";
    cr_assert(!serve_tools_render("mistral", g_tools, 2, m, 2, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "text and tool calls"), "%s", why);
    serve_tool_msg sys[] = {{"system", "s", NULL, NULL}};
    cr_assert(!serve_tools_render("mistral", g_tools, 2, sys, 1, &out, &n, &store, &ns, why, sizeof why));
    cr_assert(strstr(why, "before the last user message"), "%s", why);
    cJSON_Delete(calls);
}

Test(tools, mistral_calls_read) {
    serve_tool_call calls[4];
    size_t content;
    /* the control token [TOOL_CALLS] leaves no text: the answer is the list */
    const char *two = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": \"abc123def\"}, "
                      "{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}]\n";
    cr_assert_eq(parse("mistral", two, calls, 4, &content), 2);
    cr_assert_str_eq(calls[0].name, "get_weather");
    cr_assert_str_eq(calls[0].arguments, "{\"city\":\"Rome\"}");
    cr_assert_str_eq(calls[1].arguments, "{\"a\":1}");
    cr_assert_eq(content, 0);
    serve_tool_calls_free(calls, 2);
    /* spelled out as text (a vocabulary without the control token), after content */
    cr_assert_eq(parse("mistral", "Checking. [TOOL_CALLS] [{\"name\": \"add\"}]", calls, 4, &content), 1);
    cr_assert_eq(content, strlen("Checking."));
    cr_assert_str_eq(calls[0].arguments, "{}");
    serve_tool_calls_free(calls, 1);
    cr_assert_eq(parse("mistral", two, calls, 1, &content), 0, "parallel_tool_calls false: two stay text");
    stays_content("mistral", "The weather is fine.");
    stays_content("mistral", "[link](http://x)");
    stays_content("mistral", "[]");
    stays_content("mistral", "[{\"name\": \"nope\", \"arguments\": {}}]");
    stays_content("mistral", "[{\"name\": \"add\", \"arguments\": [1]}]");
    stays_content("mistral", "[{\"name\": \"add\"}] and more");
    stays_content("mistral", "[{\"name\": \"add\"}, 3]");
    stays_content("mistral", "[{\"name\": \"add\"");
    stays_content("mistral", "[TOOL_CALLS]");
    stays_content("mistral", "[TOOL_CALLS] {\"name\": \"add\"}");
    stays_content("mistral", "");
}

Test(tools, mistral_hostile_answers, .timeout = 30) {
    const size_t big = 1 << 20;
    char *s = malloc(big + 64);
    size_t n = 0;
    while (n < big) s[n++] = '[';
    s[n] = 0;
    stays_content("mistral", s);
    for (n = 0; n + 13 < big; n += 12) memcpy(s + n, "[TOOL_CALLS]", 12);
    s[n] = 0;
    stays_content("mistral", s);
    const char *base[] = {"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"n\": "
                          "[1, 2]}}]",
                          "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"add\"}]"};
    parse_mutations(base, 2, (const char *[]){"mistral"}, 1, 777, s);
    free(s);
}

Test(tools, mistral_stream_holds_back_what_may_be_a_call) {
    cr_assert_eq(serve_tool_stream_safe("mistral", "  [{\"na", 7), 0);
    cr_assert_eq(serve_tool_stream_safe("mistral", " ", 1), 0);
    cr_assert_eq(serve_tool_stream_safe("mistral", "Sure", 4), 4);
    cr_assert_eq(serve_tool_stream_safe("mistral", "Sure [TOOL", 10), 5);
    cr_assert_eq(serve_tool_stream_safe("mistral", "Sure [TOOL_CALLS] [", 19), 5);
    cr_assert_eq(serve_tool_stream_safe("mistral", "a [b", 4), 4, "'[b' cannot begin [TOOL_CALLS]");
}
