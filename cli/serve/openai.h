/*
 * cli/serve/openai.h — the OpenAI-compatible request bodies `loom serve`
 * accepts (/v1/completions, /v1/chat/completions), parsed into engine
 * requests, and the JSON it answers with. No HTTP here and no engine calls:
 * pure functions, unit-tested on their own (tests/serve).
 *
 * What a demanding client of vLLM or the OpenAI API sends is read, tools
 * included (rendered and read back in tools.h); fields loom cannot honour
 * (suffix, images, best_of > n)
 * are refused with a message naming the field, never silently dropped.
 * Unknown fields are ignored, as vLLM and the OpenAI SDKs expect.
 */
#ifndef LOOM_SERVE_OPENAI_H
#define LOOM_SERVE_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "loom/engine.h"
#include "tools.h"

/* One request's most prompts (the batch form) and choices (prompts x n). */
#define SERVE_MAX_PROMPTS 256
#define SERVE_MAX_CHOICES 1024

typedef enum serve_api {
    SERVE_COMPLETIONS = 0, /* POST /v1/completions      */
    SERVE_CHAT = 1,        /* POST /v1/chat/completions */
    SERVE_TOKENIZE = 2,    /* POST /tokenize (vLLM's): "prompt" text or "messages" */
    SERVE_DETOKENIZE = 3,  /* POST /detokenize (vLLM's): "tokens"                  */
} serve_api;

/* One prompt of a completions request (a request may carry several: the
 * OpenAI batch form, choices numbered prompt * n + sample). */
typedef struct serve_prompt {
    const char *text;      /* or NULL when tokens are given */
    int32_t *tokens;       /* owned */
    int32_t num_tokens;
} serve_prompt;

typedef struct serve_req {
    serve_api api;
    loom_request base;          /* sampling, n, max_tokens, stop; prompt unset */
    serve_prompt *prompts;      /* completions: (num_prompts); owned           */
    int32_t num_prompts;        /* chat: 1 (the conversation in base.messages) */
    loom_chat_message *messages;/* chat: owned array; strings in `root` or `owned` */
    const char *model;          /* as sent, or NULL                            */
    bool stream;
    bool include_usage;         /* stream_options.include_usage                */
    int32_t logprobs;           /* alternatives per token; -1 = no logprobs    */
    bool echo;                  /* completions: the prompt before the text (and
                                   its logprobs, with logprobs); with
                                   max_tokens 0 only the prompt (base.prompt_only) */
    bool add_special;           /* tokenize: add_special_tokens               */
    /* chat tool calling (tools.h): the functions offered with tool_choice
     * auto (none with tool_choice none), the messages as sent with their
     * tool fields, and the messages the family's rendering made */
    serve_tool *tools;          /* (num_tools); owned array                   */
    int32_t num_tools;
    bool parallel_tool_calls;   /* false: at most one call is read            */
    bool tool_required;         /* tool_choice "required": the answer is calls */
    const char *tool_named;     /* tool_choice names this function, or NULL   */
    serve_tool_msg *tool_msgs;  /* (base.num_messages as parsed); owned array */
    bool tool_turns;            /* a tool message or an assistant's tool_calls */
    loom_chat_message *rendered;/* serve_req_apply_tools' messages; owned    */
    char **rendered_text;       /* their texts; owned                         */
    int32_t num_rendered_text;
    /* storage the pointers above reach into */
    cJSON *root;
    char **owned;
    int32_t num_owned;
    const char **stop;          /* NULL-terminated; owned array                */
    loom_logit_bias *logit_bias;/* base.logit_bias; owned array                */
} serve_req;

/* Parse a request body of `len` bytes for `api` (body[len] must be NUL):
 * completions and chat into base and prompts/messages; tokenize into
 * prompts[0].text or messages (and add_special); detokenize into
 * prompts[0].tokens (ids >= 0; the server checks the vocabulary). On failure returns false
 * with a message in `why` (naming the field, or the byte offset of a JSON
 * syntax error) and the offending field in *param (NULL if none); *out is
 * then freed already. `default_max_tokens` applies when the body has none
 * (<= 0: up to the context). */
bool serve_parse(serve_api api, const char *body, size_t len, int32_t default_max_tokens, serve_req *out,
                 char *why, size_t why_size, const char **param);
void serve_req_free(serve_req *r);

/* Chat and tokenize: when the request offers tools or holds tool turns,
 * render them for the model's chat template family (loom_engine_chat_
 * template) into new messages (base.messages then points at them). False
 * with why (a 400 naming 'tools' or 'messages', in *param) when the family
 * has no tool format or a tool turn is malformed. */
bool serve_req_apply_tools(serve_req *r, const char *family, char *why, size_t why_size, const char **param);

/* The bytes of text a request asks the tokenizer to read, for the server's
 * cap on prompt size (checked before tokenizing): completions (and
 * tokenize) — the longest text prompt (token-id prompts count 0), its index
 * in *which; messages (chat, tokenize) — every message's content together
 * (*which 0), as rendered with the tools when serve_req_apply_tools ran. */
size_t serve_prompt_bytes(const serve_req *r, int32_t *which);

/* OpenAI's name for a finish reason: "stop" (end of generation or a stop
 * string), "length", "abort", "error". */
const char *serve_finish_name(loom_finish_reason f);

/* Drop a UTF-8 character cut off at the end of s (after a cut at a byte
 * limit), so the cut falls between characters. Returns s. */
char *serve_utf8_trim(char *s);
/* s cut to at most `max` bytes between characters, into out (size bytes). */
const char *serve_utf8_clip(const char *s, size_t max, char *out, size_t size);
/* A malloc'd copy of s that is valid UTF-8: each ill-formed sequence (bytes
 * from a URL, or cut) becomes U+FFFD. NULL when out of memory. */
char *serve_utf8_valid(const char *s);

/* A JSON string node holding the n bytes at s, NUL characters included
 * (written "\u0000"; cJSON's own strings end at the first NUL): what
 * generated text goes out as. s is UTF-8 (the engine's text is). NULL when
 * out of memory. */
cJSON *serve_json_text(const char *s, size_t n);

/* {"error": {"message", "type", "param", "code"}} as vLLM sends it, valid
 * UTF-8 JSON whatever bytes the message holds; the caller frees it. */
char *serve_error_json(int http_status, const char *message, const char *param);

#endif
