/*
 * tests/serve/test_openai.c — `loom serve`'s request parsing (cli/serve/
 * openai.c) without HTTP: every accepted form of prompt, messages, stop and
 * sampling fields maps onto the engine request, and each kind of bad body
 * is refused naming the field (or the byte of a JSON syntax error).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/openai.h"

static serve_req parse_ok(serve_api api, const char *body) {
    serve_req r;
    char why[512];
    const char *param = NULL;
    bool ok = serve_parse(api, body, strlen(body), 16, &r, why, sizeof why, &param);
    cr_assert(ok, "%s refused: %s", body, why);
    return r;
}

/* Refused, with `param` named and `needle` in the message. */
static void parse_bad(serve_api api, const char *body, const char *param, const char *needle) {
    serve_req r;
    char why[512];
    const char *p = NULL;
    bool ok = serve_parse(api, body, strlen(body), 16, &r, why, sizeof why, &p);
    cr_assert(!ok, "%s accepted", body);
    if (param)
        cr_assert(p && !strcmp(p, param), "%s: param %s, expected %s (%s)", body, p ? p : "(null)", param, why);
    else
        cr_assert_null(p, "%s: param %s (%s)", body, p, why);
    cr_assert(strstr(why, needle), "%s: message '%s' lacks '%s'", body, why, needle);
    cr_assert_null(r.root, "a refused parse frees what it built");
}

Test(openai, completions_defaults) {
    serve_req r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"Hello\"}");
    cr_assert_eq(r.num_prompts, 1);
    cr_assert_str_eq(r.prompts[0].text, "Hello");
    cr_assert_float_eq(r.base.params.temperature, 1.0f, 0, "OpenAI's default temperature is 1");
    cr_assert_eq(r.base.max_tokens, 16);
    cr_assert_eq(r.base.n, 1);
    cr_assert(!r.stream && r.logprobs == -1 && !r.base.stop && !r.model);
    cr_assert_eq(r.base.params.logprobs, 0);
    serve_req_free(&r);
}

Test(openai, completions_fields) {
    serve_req r = parse_ok(SERVE_COMPLETIONS,
                           "{\"model\": \"m\", \"prompt\": \"x\", \"max_tokens\": 7, \"temperature\": 0, "
                           "\"top_p\": 0.5, \"top_k\": -1, \"min_p\": 0.1, \"n\": 3, \"best_of\": 3, "
                           "\"seed\": 42, \"stop\": [\"a\", \"bc\"], \"presence_penalty\": 0.5, "
                           "\"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1, \"logprobs\": 0, "
                           "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"ignore_eos\": true, "
                           "\"user\": \"ignored\", \"echo\": false, \"suffix\": null, \"logit_bias\": {}}");
    cr_assert_str_eq(r.model, "m");
    cr_assert_eq(r.base.max_tokens, 7);
    cr_assert(r.base.strict_max_tokens, "an explicit max_tokens that does not fit is refused, as OpenAI's");
    cr_assert_float_eq(r.base.params.temperature, 0.0f, 0);
    cr_assert_float_eq(r.base.params.top_p, 0.5f, 1e-7);
    cr_assert_eq(r.base.params.top_k, 0, "vLLM's top_k -1 means off");
    cr_assert_float_eq(r.base.params.min_p, 0.1f, 1e-7);
    cr_assert_eq(r.base.n, 3);
    cr_assert(r.base.params.has_seed && r.base.params.seed == 42);
    cr_assert_str_eq(r.base.stop[0], "a");
    cr_assert_str_eq(r.base.stop[1], "bc");
    cr_assert_null(r.base.stop[2]);
    cr_assert_float_eq(r.base.params.presence_penalty, 0.5f, 1e-7);
    cr_assert_float_eq(r.base.params.frequency_penalty, -0.5f, 1e-7);
    cr_assert_float_eq(r.base.params.repetition_penalty, 1.1f, 1e-6);
    cr_assert_eq(r.logprobs, 0);
    cr_assert_eq(r.base.params.logprobs, 1, "the engine gives the chosen token's logprob only with alternatives");
    cr_assert(r.stream && r.include_usage && r.base.ignore_eos);
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stop\": \"END\", \"max_tokens\": null, \"logprobs\": 5}");
    cr_assert_str_eq(r.base.stop[0], "END");
    cr_assert_null(r.base.stop[1]);
    cr_assert_eq(r.base.max_tokens, 16, "null is the default");
    cr_assert(!r.base.strict_max_tokens, "the default is cut to fit the context, not refused");
    cr_assert_eq(r.logprobs, 5);
    cr_assert_eq(r.base.params.logprobs, 5);
    serve_req_free(&r);
}

Test(openai, completions_prompt_forms) {
    serve_req r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [1, 2, 3]}");
    cr_assert_eq(r.num_prompts, 1);
    cr_assert_null(r.prompts[0].text);
    cr_assert_eq(r.prompts[0].num_tokens, 3);
    cr_assert_eq(r.prompts[0].tokens[2], 3);
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [\"a\", \"b\"]}");
    cr_assert_eq(r.num_prompts, 2);
    cr_assert_str_eq(r.prompts[1].text, "b");
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [[5], [6, 7]]}");
    cr_assert_eq(r.num_prompts, 2);
    cr_assert_eq(r.prompts[1].num_tokens, 2);
    cr_assert_eq(r.prompts[1].tokens[1], 7);
    serve_req_free(&r);
    parse_bad(SERVE_COMPLETIONS, "{}", "prompt", "'prompt' is required");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": []}", "prompt", "non-empty");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": 5}", "prompt", "got 5");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": [\"a\", [1]]}", "prompt", "prompt[1]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": [1, -2]}", "prompt", "prompt[1] must be a token id");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": [1, 2.5]}", "prompt", "got 2.5");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": [[1], []]}", "prompt", "prompt[1] is an empty token list");
}

Test(openai, bad_json_named) {
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\",", NULL, "not valid JSON (error at byte 15 of 15)");
    parse_bad(SERVE_COMPLETIONS, "", NULL, "body is empty");
    parse_bad(SERVE_COMPLETIONS, "[1, 2]", NULL, "must be a JSON object");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\"} trailing", NULL, "not valid JSON");
    serve_req r;
    char why[256];
    const char *p;
    cr_assert(!serve_parse(SERVE_COMPLETIONS, "{\"prompt\": \"x\"}\0{}", 17, 16, &r, why, sizeof why, &p));
    cr_assert(strstr(why, "NUL byte at offset 15"), "%s", why);
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"a\\u0000b\"}", NULL, "\\u0000 (NUL) escape at byte 14");
    serve_req ok = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"a\\\\u0000b\"}"); /* an escaped backslash, then text */
    cr_assert_str_eq(ok.prompts[0].text, "a\\u0000b");
    serve_req_free(&ok);
}

Test(openai, bad_fields_named) {
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature", "\"hot\"");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"temperature\": -1}", "temperature", "[0, 100]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"top_p\": 0}", "top_p", "top_p");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"n\": 0}", "n", "an integer in [1, 64]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens", "max_tokens");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"max_tokens\": 1.5}", "max_tokens", "an integer");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logprobs\": 21}", "logprobs", "[0, 20]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stream\": 1}", "stream", "true or false");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stop\": 3}", "stop", "text or a list");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stop\": [\"a\", 1]}", "stop", "stop[1]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stop\": \"\"}", "stop", "must not be empty");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"model\": 3}", "model", "'model' must be text");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}",
              "stream_options", "only allowed with \"stream\": true");
}

/* logit_bias: token id keys (decimal strings), biases in [-100, 100];
 * anything else refused naming the field. */
Test(openai, logit_bias) {
    serve_req r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 10, \"50256\": -100}}");
    cr_assert_eq(r.base.num_logit_bias, 2);
    cr_assert(r.base.logit_bias[0].token == 5 && r.base.logit_bias[0].bias == 10.0f);
    cr_assert(r.base.logit_bias[1].token == 50256 && r.base.logit_bias[1].bias == -100.0f);
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logit_bias\": null}");
    cr_assert_eq(r.base.num_logit_bias, 0);
    serve_req_free(&r);
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}}", "logit_bias", "not a token id");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}", "logit_bias", "not a token id");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", "logit_bias", "[-100, 100]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", "logit_bias", "[-100, 100]");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"logit_bias\": [1]}", "logit_bias", "must be an object");
}

/* response_format: text, json_object and json_schema become the request's
 * constraint (the engine compiles it); anything else is refused by name. */
Test(openai, response_format) {
    serve_req r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                       "\"response_format\": {\"type\": \"json_object\"}}");
    cr_assert_str_eq(r.base.constraint_lang, "json_object");
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
                                    "\"json_schema\": {\"name\": \"p\", \"strict\": true, \"schema\": "
                                    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}}");
    cr_assert_str_eq(r.base.constraint_lang, "json_schema");
    cr_assert_str_eq(r.base.constraint, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                             "\"response_format\": {\"type\": \"text\"}}");
    cr_assert_null(r.base.constraint_lang);
    serve_req_free(&r);
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"regex\"}}",
              "response_format", "not supported");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": \"json\"}", "response_format",
              "must be an object");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\"}}",
              "response_format", "\"schema\"");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
              "\"json_schema\": {\"schema\": 3}}}", "response_format", "must be a JSON schema");
}

/* vLLM's guided_* fields: one of them becomes the request's constraint. */
Test(openai, guided_fields) {
    serve_req r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"integer\"}}");
    cr_assert_str_eq(r.base.constraint_lang, "json_schema");
    cr_assert_str_eq(r.base.constraint, "{\"type\":\"integer\"}");
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_regex\": \"[0-9]{3}\"}");
    cr_assert_str_eq(r.base.constraint_lang, "regex");
    cr_assert_str_eq(r.base.constraint, "[0-9]{3}");
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_choice\": [\"yes\", \"n.o\", \"é (x)\"]}");
    cr_assert_str_eq(r.base.constraint_lang, "regex");
    cr_assert_str_eq(r.base.constraint, "yes|n\\.o|é\\ \\(x\\)");
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                             "\"guided_grammar\": \"root ::= \\\"a\\\"\"}");
    cr_assert_str_eq(r.base.constraint_lang, "gbnf");
    serve_req_free(&r);
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_regex\": \"a\", \"guided_choice\": [\"b\"]}",
              "guided_choice", "one way");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}, "
              "\"guided_regex\": \"a\"}", "guided_regex", "response_format");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_choice\": []}", "guided_choice", "non-empty");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"guided_json\": 3}", "guided_json", "JSON schema");
}

Test(openai, unsupported_refused_by_name) {
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"echo\": true}", "echo",
              "/v1/completions only");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"suffix\": \"}\"}", "suffix", "fill-in-the-middle");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"n\": 2, \"best_of\": 4}", "best_of", "n = 2");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"structured_outputs\": {}}", "structured_outputs",
              "not supported");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"use_beam_search\": true}", "use_beam_search",
              "not supported");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"min_tokens\": 4}", "min_tokens", "min_tokens");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"stop_token_ids\": [2]}", "stop_token_ids", "'stop'");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
              "\"required\"}", "tool_choice", "needs the functions in 'tools'");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
              "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}}", "tool_choice", "needs the functions");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
              "\"always\"}", "tool_choice", "must be \"none\"");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"tools\": [{}]}", "tools", "chat/completions only");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"tool_choice\": \"required\"}", "tool_choice",
              "chat/completions only");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"functions\": [{}]}",
              "functions", "send 'tools'");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"none\", "
              "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", "tools",
              "tools[0].function.name");
    serve_req ok = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                        "\"tool_choice\": \"none\", \"functions\": [], \"min_tokens\": 0, "
                                        "\"use_beam_search\": false, \"stop_token_ids\": []}");
    serve_req_free(&ok);
    /* the batch form is bounded: prompts, and prompts x n */
    char body[4096] = "{\"prompt\": [";
    for (int i = 0; i < 257; i++) strcat(body, i ? ",\"a\"" : "\"a\"");
    strcat(body, "]}");
    parse_bad(SERVE_COMPLETIONS, body, "prompt", "at most 256");
    strcpy(body, "{\"n\": 64, \"prompt\": [");
    for (int i = 0; i < 17; i++) strcat(body, i ? ",\"a\"" : "\"a\"");
    strcat(body, "]}");
    parse_bad(SERVE_COMPLETIONS, body, "n", "1088 choices: at most 1024");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", "tools",
              "tools[0] must be");
    serve_req r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                       "\"response_format\": {\"type\": \"text\"}, \"tools\": []}");
    serve_req_free(&r);
}

/* echo: the prompt before the text; max_tokens 0 (nothing generated) only
 * with it; prompt logprobs asked of the engine only with logprobs. */
Test(openai, echo) {
    serve_req r =
        parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"echo\": true, \"max_tokens\": 0, \"logprobs\": 2}");
    cr_assert(r.echo && r.base.prompt_only && r.base.prompt_logprobs);
    cr_assert_eq(r.base.params.logprobs, 2);
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [1, 2], \"echo\": true, \"max_tokens\": 3}");
    cr_assert(r.echo && !r.base.prompt_only && !r.base.prompt_logprobs);
    cr_assert_eq(r.base.max_tokens, 3);
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"echo\": false, \"logprobs\": 0}");
    cr_assert(!r.echo && !r.base.prompt_only && !r.base.prompt_logprobs);
    serve_req_free(&r);
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens", "[1, ");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"echo\": 1}", "echo", "true or false");
    parse_bad(SERVE_COMPLETIONS, "{\"prompt\": \"x\", \"echo\": true, \"max_tokens\": -1}", "max_tokens", "[0, ");
}

/* POST /tokenize: text or messages, add_special_tokens with vLLM's defaults;
 * POST /detokenize: a list of ids, possibly empty. */
Test(openai, tokenize_and_detokenize) {
    serve_req r = parse_ok(SERVE_TOKENIZE, "{\"model\": \"m\", \"prompt\": \"Hello\"}");
    cr_assert_str_eq(r.prompts[0].text, "Hello");
    cr_assert(r.add_special && r.base.num_messages == 0);
    cr_assert_str_eq(r.model, "m");
    serve_req_free(&r);
    r = parse_ok(SERVE_TOKENIZE, "{\"prompt\": \"Hello\", \"add_special_tokens\": false}");
    cr_assert(!r.add_special);
    serve_req_free(&r);
    r = parse_ok(SERVE_TOKENIZE, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                                 "\"add_generation_prompt\": true}");
    cr_assert(!r.add_special && r.base.num_messages == 1);
    cr_assert_str_eq(r.base.messages[0].content, "hi");
    int32_t which;
    cr_assert_eq(serve_prompt_bytes(&r, &which), 2);
    serve_req_free(&r);
    parse_bad(SERVE_TOKENIZE, "{}", "prompt", "'prompt' must be text");
    parse_bad(SERVE_TOKENIZE, "{\"prompt\": [1, 2]}", "prompt", "'prompt' must be text");
    parse_bad(SERVE_TOKENIZE, "{\"prompt\": \"x\", \"messages\": []}", "messages", "not both");
    parse_bad(SERVE_TOKENIZE, "{\"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}", "messages", "role");
    parse_bad(SERVE_TOKENIZE, "{\"prompt\": \"x\", \"add_special_tokens\": \"yes\"}", "add_special_tokens",
              "true or false");
    parse_bad(SERVE_TOKENIZE, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                              "\"add_generation_prompt\": false}", "add_generation_prompt", "not supported");
    r = parse_ok(SERVE_DETOKENIZE, "{\"tokens\": [0, 17, 2147483647]}");
    cr_assert_eq(r.prompts[0].num_tokens, 3);
    cr_assert_eq(r.prompts[0].tokens[2], 2147483647);
    serve_req_free(&r);
    r = parse_ok(SERVE_DETOKENIZE, "{\"tokens\": []}");
    cr_assert_eq(r.prompts[0].num_tokens, 0);
    serve_req_free(&r);
    parse_bad(SERVE_DETOKENIZE, "{}", "tokens", "'tokens' must be a list");
    parse_bad(SERVE_DETOKENIZE, "{\"tokens\": \"12\"}", "tokens", "'tokens' must be a list");
    parse_bad(SERVE_DETOKENIZE, "{\"tokens\": [1, -2]}", "tokens", "tokens[1] must be a token id");
    parse_bad(SERVE_DETOKENIZE, "{\"tokens\": [1.5]}", "tokens", "tokens[0] must be a token id");
    parse_bad(SERVE_DETOKENIZE, "{\"tokens\": [3e10]}", "tokens", "tokens[0] must be a token id");
    parse_bad(SERVE_DETOKENIZE, "[1, 2]", NULL, "must be a JSON object");
}

/* tools and tool turns: read, checked, and rendered for a family. */
Test(openai, tools_and_tool_turns) {
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                        "\"description\": \"d\", \"parameters\": {\"type\": \"object\"}}}, {\"type\": \"function\", "
                        "\"function\": {\"name\": \"add-2_x\"}}]";
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": "
             "{\"name\": \"get_weather\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c\", "
             "\"content\": \"sunny\"}], \"parallel_tool_calls\": false, %s}", tools);
    serve_req r = parse_ok(SERVE_CHAT, body);
    cr_assert_eq(r.num_tools, 2);
    cr_assert_str_eq(r.tools[1].name, "add-2_x");
    cr_assert(r.tool_turns && !r.parallel_tool_calls);
    cr_assert_eq(r.base.num_messages, 3);
    cr_assert_str_eq(r.base.messages[1].content, "", "an assistant's calls alone: no text");
    char why[256];
    const char *param;
    cr_assert(!serve_req_apply_tools(&r, "llama2", why, sizeof why, &param));
    cr_assert_str_eq(param, "tools");
    cr_assert(serve_req_apply_tools(&r, "chatml", why, sizeof why, &param), "%s", why);
    cr_assert_eq(r.base.num_messages, 4, "a system turn for the tools");
    cr_assert(strstr(r.base.messages[0].content, "<tools>"));
    cr_assert(strstr(r.base.messages[2].content, "<tool_call>"));
    cr_assert_str_eq(r.base.messages[3].role, "user");
    int32_t which;
    cr_assert_gt(serve_prompt_bytes(&r, &which), 300, "the rendered tools count toward the cap");
    serve_req_free(&r);
    /* the tool message's tool_call_id reaches the renderer (mistral writes it) */
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}, {\"role\": "
             "\"assistant\", \"tool_calls\": [{\"id\": \"call_12345678_0_0\", \"function\": {\"name\": "
             "\"get_weather\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
             "\"call_12345678_0_0\", \"content\": \"sunny\"}], %s}", tools);
    r = parse_ok(SERVE_CHAT, body);
    cr_assert_str_eq(r.tool_msgs[2].tool_call_id, "call_12345678_0_0");
    cr_assert(serve_req_apply_tools(&r, "mistral", why, sizeof why, &param), "%s", why);
    cr_assert_eq(r.base.num_messages, 4);
    cr_assert_str_eq(r.base.messages[3].role, "tool_results");
    cr_assert_str_eq(r.base.messages[3].content, "{\"content\": \"sunny\", \"call_id\": \"234567800\"}");
    serve_req_free(&r);
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"tool\", \"tool_call_id\": 7, \"content\": \"x\"}]}",
              "messages", "messages[0].tool_call_id must be text");
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}], \"tool_choice\": "
             "\"none\", %s}", tools);
    r = parse_ok(SERVE_CHAT, body);
    cr_assert_eq(r.num_tools, 0, "tool_choice none: checked, not offered");
    cr_assert(serve_req_apply_tools(&r, NULL, why, sizeof why, &param), "nothing to render: no family needed");
    serve_req_free(&r);
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
              "\"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": {\"name\": "
              "\"f\"}}]}", "tools", "offered twice");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
              "\"function\", \"function\": {\"name\": \"f\", \"parameters\": []}}]}", "tools", "JSON schema object");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools",
              "at most 128");
    /* tool_choice required / named: the answer constrained to the calls' JSON */
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}], \"tool_choice\": "
             "{\"type\": \"function\", \"function\": {\"name\": \"add-2_x\"}}, %s}", tools);
    r = parse_ok(SERVE_CHAT, body);
    cr_assert_str_eq(r.tool_named, "add-2_x");
    cr_assert_str_eq(r.base.constraint_lang, "json_schema");
    cr_assert(strstr(r.base.constraint, "\"additionalProperties\":false"), "no parameters: an empty object");
    serve_req_free(&r);
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}], \"tool_choice\": "
             "\"required\", \"parallel_tool_calls\": false, %s}", tools);
    r = parse_ok(SERVE_CHAT, body);
    cr_assert(r.tool_required && !r.tool_named);
    cr_assert(strstr(r.base.constraint, "\"maxItems\":1"), "%s", r.base.constraint);
    cr_assert(strstr(r.base.constraint, "{\"const\":\"get_weather\"}"), "%s", r.base.constraint);
    serve_req_free(&r);
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}], \"tool_choice\": "
             "{\"type\": \"function\", \"function\": {\"name\": \"nope\"}}, %s}", tools);
    parse_bad(SERVE_CHAT, body, "tool_choice", "does not offer");
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"w?\"}], \"tool_choice\": "
             "\"required\", \"response_format\": {\"type\": \"json_object\"}, %s}", tools);
    parse_bad(SERVE_CHAT, body, "tool_choice", "one way of constraining");
    char *many = malloc(16384);
    strcpy(many, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [");
    for (int i = 0; i <= SERVE_MAX_TOOLS; i++)
        sprintf(many + strlen(many), "%s{\"type\": \"function\", \"function\": {\"name\": \"f%d\"}}", i ? "," : "",
                i);
    strcat(many, "]}");
    parse_bad(SERVE_CHAT, many, "tools", "at most 128");
    free(many);
}

Test(openai, chat_messages) {
    serve_req r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                                       "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                                       "{\"type\": \"text\", \"text\": \"b\"}], \"name\": \"u\"}, "
                                       "{\"role\": \"assistant\", \"content\": \"ok\"}, "
                                       "{\"role\": \"user\", \"content\": \"again\"}], "
                                       "\"max_completion_tokens\": 9}");
    cr_assert_eq(r.base.num_messages, 4);
    cr_assert_eq(r.num_prompts, 1);
    cr_assert_str_eq(r.base.messages[0].role, "system", "developer is OpenAI's newer name for system");
    cr_assert_str_eq(r.base.messages[1].content, "a\nb");
    cr_assert_str_eq(r.base.messages[2].role, "assistant");
    cr_assert_str_eq(r.base.messages[3].content, "again");
    cr_assert_eq(r.base.max_tokens, 9);
    cr_assert_null(r.base.prompt);
    serve_req_free(&r);
    parse_bad(SERVE_CHAT, "{\"prompt\": \"x\"}", "messages", "'messages' must be a non-empty list");
    parse_bad(SERVE_CHAT, "{\"messages\": []}", "messages", "non-empty");
    parse_bad(SERVE_CHAT, "{\"messages\": [\"hi\"]}", "messages", "messages[0] must be an object");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}", "messages",
              "send 'tool'");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"tool\"}]}", "messages", "has no content");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", "messages",
              "on an assistant message");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages", "messages[0] has no content");
    parse_bad(SERVE_CHAT,
              "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
              "messages", "messages[0].content[0]");
}

Test(openai, chat_logprobs) {
    serve_req r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    cr_assert_eq(r.logprobs, -1);
    cr_assert_eq(r.base.max_tokens, 16, "parse_ok passes 16 as the default");
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true}");
    cr_assert_eq(r.logprobs, 0);
    cr_assert_eq(r.base.params.logprobs, 1);
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 3}");
    cr_assert_eq(r.logprobs, 3);
    serve_req_free(&r);
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}",
              "top_logprobs", "needs \"logprobs\": true");
    parse_bad(SERVE_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 2}", "logprobs",
              "true or false");
}

/* The prompt text the server's byte cap measures (before tokenizing). */
Test(openai, prompt_bytes) {
    int32_t which = -1;
    serve_req r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [\"ab\", \"abcde\", \"\"]}");
    cr_assert_eq(serve_prompt_bytes(&r, &which), 5);
    cr_assert_eq(which, 1);
    serve_req_free(&r);
    r = parse_ok(SERVE_COMPLETIONS, "{\"prompt\": [1, 2, 3]}");
    cr_assert_eq(serve_prompt_bytes(&r, &which), 0, "token ids are not tokenized");
    serve_req_free(&r);
    r = parse_ok(SERVE_CHAT, "{\"messages\": [{\"role\": \"system\", \"content\": \"abc\"}, "
                             "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"de\"}]}]}");
    cr_assert_eq(serve_prompt_bytes(&r, &which), 5, "every message together");
    serve_req_free(&r);
}

/* Messages cut at a byte limit end between characters; bytes that are no
 * UTF-8 become U+FFFD, so an error body is always valid UTF-8 JSON. */
Test(openai, utf8_cut_and_cleaned) {
    char b[16];
    strcpy(b, "ab\xC3\xA9\xE2\x82"); /* "abé" + 2 of the 3 bytes of € */
    cr_assert_str_eq(serve_utf8_trim(b), "ab\xC3\xA9");
    cr_assert_str_eq(serve_utf8_trim(b), "ab\xC3\xA9", "a whole character stays");
    cr_assert_str_eq(serve_utf8_clip("\xC3\xA9\xC3\xA9", 3, b, sizeof b), "\xC3\xA9");
    cr_assert_str_eq(serve_utf8_clip("\xF0\x9F\x98\x80", 3, b, sizeof b), "");
    cr_assert_str_eq(serve_utf8_clip("abc", 2, b, 2), "a", "the buffer's size bounds it too");
    char *v = serve_utf8_valid("a\xFF" "b\xC3(\xED\xA0\x80\xE2\x82");
    cr_assert_str_eq(v, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(v);
    char *e = serve_error_json(404, "no route GET /\xFF\xC3", NULL);
    cr_assert(strstr(e, "/\xEF\xBF\xBD\xEF\xBF\xBD\""), "%s", e);
    free(e);
    /* a parse error at its length limit is cut between characters */
    char body[1024] = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_k\": \"";
    for (int i = 0; i < 100; i++) strcat(body, "\xC3\xA9");
    strcat(body, "\"}");
    serve_req r;
    const char *param = NULL;
    for (size_t size = 40; size < 64; size++) {
        char why[64];
        cr_assert(!serve_parse(SERVE_CHAT, body, strlen(body), 16, &r, why, size, &param));
        char *clean = serve_utf8_valid(why);
        cr_assert_str_eq(clean, why, "message cut to %zu bytes splits a character: %s", size, why);
        free(clean);
    }
}

Test(openai, error_json_shape) {
    char *s = serve_error_json(400, "bad \"x\"", "temperature");
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "message")->valuestring, "bad \"x\"");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
    cr_assert_str_eq(cJSON_GetObjectItem(e, "param")->valuestring, "temperature");
    cr_assert_eq(cJSON_GetObjectItem(e, "code")->valueint, 400);
    cJSON_Delete(o);
    free(s);
    s = serve_error_json(503, "down", NULL);
    cr_assert(strstr(s, "\"server_error\"") && strstr(s, "\"param\":null"), "%s", s);
    free(s);
    cr_assert_str_eq(serve_finish_name(LOOM_FINISH_EOS), "stop");
    cr_assert_str_eq(serve_finish_name(LOOM_FINISH_STOP), "stop");
    cr_assert_str_eq(serve_finish_name(LOOM_FINISH_LENGTH), "length");
    cr_assert_null(serve_finish_name(LOOM_FINISH_NONE));
}

/* ------------------------------------------------- mutated bodies
 * Valid bodies, randomly damaged (bytes flipped, spans cut or repeated,
 * JSON values of every type spliced in), never crash the parser: each is
 * either accepted as a request within the limits (prompts, choices,
 * logprobs) or refused with a message — and a refused parse keeps nothing
 * (ASan / LSan in CI check the memory side). Seeded from the clock or
 * LOOM_TEST_SEED; the seed is logged and in every failure message. */
static uint64_t mut_rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

Test(openai, mutated_bodies_never_crash, .timeout = 120) {
    static const char *const seeds[] = {
        "{\"model\": \"m\", \"prompt\": [\"a\", \"b\"], \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, "
        "\"n\": 2, \"stop\": [\"x\", \"yy\"], \"seed\": 3, \"logprobs\": 2, \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true}, \"top_k\": 5, \"min_p\": 0.1, \"ignore_eos\": false}",
        "{\"prompt\": [[1, 2, 3], [4]], \"max_tokens\": 1, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, "
        "\"repetition_penalty\": 1.1, \"user\": \"u\"}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": [{\"type\": "
        "\"text\", \"text\": \"hi\"}]}, {\"role\": \"assistant\", \"content\": \"yo\"}, {\"role\": \"user\", "
        "\"content\": \"again\"}], \"logprobs\": true, \"top_logprobs\": 3, \"max_completion_tokens\": 9, "
        "\"tool_choice\": \"none\", \"response_format\": {\"type\": \"text\"}}",
    };
    static const char *const splice[] = {"null", "true", "false", "0", "-1", "1e999", "-0.0", "4294967297",
                                         "\"\"", "\"\\ud800\"", "\"\\u0000\"", "[]", "{}", "[[[[[[", "}}}}",
                                         ",", ":", "\"prompt\"", "\"messages\"", "\"n\": 100000", "\xff\xfe"};
    const char *env = getenv("LOOM_TEST_SEED"); /* to replay a failure */
    uint64_t seed = (env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL)) | 1, s = seed;
    cr_log_info("mutated bodies: seed %llu (LOOM_TEST_SEED replays it)", (unsigned long long)seed);
    char buf[2048], why[512];
    int accepted = 0, refused = 0;
    for (int it = 0; it < 30000; it++) {
        const char *src = seeds[mut_rng(&s) % 3];
        /* mostly the body's own API, sometimes the other one */
        const bool own = mut_rng(&s) % 8 != 0, chat_body = src == seeds[2];
        const uint64_t route = mut_rng(&s) % 16; /* now and then a body for the tokenizer routes */
        const int api = route == 0 ? SERVE_TOKENIZE : route == 1 ? SERVE_DETOKENIZE
                        : chat_body == own ? SERVE_CHAT : SERVE_COMPLETIONS;
        size_t n = strlen(src);
        memcpy(buf, src, n + 1);
        const int edits = 1 + (int)(mut_rng(&s) % 4);
        for (int k = 0; k < edits && n > 0; k++) {
            size_t at = mut_rng(&s) % n;
            switch (mut_rng(&s) % 4) {
            case 0: buf[at] = (char)(mut_rng(&s) & 0xFF); break; /* any byte, NUL included */
            case 1: { /* cut a span */
                size_t len = 1 + mut_rng(&s) % 16;
                if (at + len > n) len = n - at;
                memmove(buf + at, buf + at + len, n - at - len + 1);
                n -= len;
                break;
            }
            case 2: { /* repeat a span */
                size_t len = 1 + mut_rng(&s) % 32;
                if (at + len > n) len = n - at;
                if (n + len >= sizeof buf) break;
                memmove(buf + at + len, buf + at, n - at + 1);
                n += len;
                break;
            }
            default: { /* splice a value in */
                const char *v = splice[mut_rng(&s) % (sizeof splice / sizeof *splice)];
                size_t len = strlen(v);
                if (n + len >= sizeof buf) break;
                memmove(buf + at + len, buf + at, n - at + 1);
                memcpy(buf + at, v, len);
                n += len;
            }
            }
        }
        buf[n] = 0;
        serve_req r;
        const char *param = NULL;
        why[0] = 0;
        if (serve_parse((serve_api)api, buf, n, 16, &r, why, sizeof why, &param)) {
            accepted++;
            const unsigned long long sd = (unsigned long long)seed;
            cr_assert(r.num_prompts >= 1 && r.num_prompts <= SERVE_MAX_PROMPTS, "seed %llu it %d: %d prompts", sd, it,
                      r.num_prompts);
            cr_assert(r.base.n >= 1 && (int64_t)r.base.n * r.num_prompts <= SERVE_MAX_CHOICES, "seed %llu it %d: n %d",
                      sd, it, r.base.n);
            cr_assert(r.logprobs >= -1 && r.logprobs <= 20, "seed %llu it %d: logprobs %d", sd, it, r.logprobs);
            serve_req_free(&r);
        } else {
            refused++;
            cr_assert(why[0], "iteration %d (seed %llu): refused without a message", it, (unsigned long long)seed);
            /* that a refused parse keeps nothing is LSan's to check (CI's ASan run) */
        }
    }
    cr_log_info("accepted %d, refused %d", accepted, refused);
    cr_assert(accepted > 100 && refused > 100, "accepted %d, refused %d: the mutations test one side only", accepted,
              refused);
}

/* Nesting far deeper than any request: refused, not a stack overflow. */
Test(openai, deep_nesting_refused) {
    const size_t depth = 200000;
    char *b = malloc(2 * depth + 32);
    size_t n = 0;
    n += (size_t)sprintf(b, "{\"prompt\": ");
    for (size_t i = 0; i < depth; i++) b[n++] = '[';
    for (size_t i = 0; i < depth; i++) b[n++] = ']';
    b[n++] = '}', b[n] = 0;
    serve_req r;
    char why[256];
    const char *p = NULL;
    cr_assert(!serve_parse(SERVE_COMPLETIONS, b, n, 16, &r, why, sizeof why, &p));
    cr_assert(why[0]);
    free(b);
}

/* Issue 29 (13): generated text that holds NUL goes out whole, as
 * "\u0000" (cJSON's strings end at the first NUL, so "a\0b" was sent as
 * "a"); quotes, backslashes and control characters are escaped. */
Test(openai, json_text_keeps_nul) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "text", serve_json_text("a\0b\"\\\n\x01\xC3\xA9", 9));
    char *s = cJSON_PrintUnformatted(o);
    cr_assert_str_eq(s, "{\"text\":\"a\\u0000b\\\"\\\\\\u000a\\u0001\xC3\xA9\"}");
    /* and it parses back to the same 9 bytes */
    cJSON *back = cJSON_Parse(s);
    cr_assert_not_null(back);
    free(s);
    cJSON_Delete(back);
    cJSON_Delete(o);
    o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "text", serve_json_text("", 0));
    s = cJSON_PrintUnformatted(o);
    cr_assert_str_eq(s, "{\"text\":\"\"}");
    free(s);
    cJSON_Delete(o);
}
