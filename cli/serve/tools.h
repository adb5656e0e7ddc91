/*
 * cli/serve/tools.h — OpenAI tool calling over a chat template family: the
 * offered tools and the conversation's tool turns written into messages the
 * way the family's models were trained to read them, and the model's answer
 * read back into tool calls. Pure functions on text (no HTTP, no engine),
 * unit-tested in tests/serve and fuzzed (tests/fuzz/fuzz_openai.c).
 *
 * Families (loom_engine_chat_template):
 *   chatml — Hermes / Qwen2.5: the tools in the system turn inside <tools>,
 *            calls as <tool_call>{"name", "arguments"}</tool_call>, results
 *            as a user turn of <tool_response> blocks;
 *   llama3 — Llama 3.1's JSON tool calling: the tools in the first user
 *            turn, a call as the whole answer {"name", "parameters"}
 *            (several separated by ';'), results as "ipython" turns;
 *   mistral — Mistral's tokenizer v3 as mistral-common encodes it: the
 *            tools as JSON (Python's json.dumps spacing) in an
 *            "available_tools" turn just before the last user turn, an
 *            assistant's calls as a "tool_calls" turn [{"name",
 *            "arguments", "id"}], results as "tool_results" turns
 *            {"content", "call_id"}, ids of 9 letters and digits, a
 *            system message in front of the last user message; the
 *            chat renderer (core/tokenizer/chat.c) puts the control tokens
 *            around them. The answer is read back from a JSON list of calls
 *            (its [TOOL_CALLS] is a control token, which the text leaves out).
 * Other families (llama2, gemma) are refused: Gemma's chat template has no
 * tool turns of its own, Llama 2 was not trained on any.
 *
 * tool_choice "required" or a named function is kept by a decoding
 * constraint (the constraint plugin kind) over plain JSON rather than the
 * family's call format, as vLLM does it: a named function's answer is its
 * arguments object; "required" answers a list of {"name", "parameters"}
 * objects. serve_tool_forced_schema writes that schema, serve_tool_forced_
 * parse reads the answer back, for any family.
 */
#ifndef LOOM_SERVE_TOOLS_H
#define LOOM_SERVE_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "loom/engine.h"

#define SERVE_MAX_TOOLS 128        /* tools one request may offer            */
#define SERVE_MAX_TOOL_CALLS 64    /* calls read from one answer; more: text */
#define SERVE_MAX_TOOL_NAME 64     /* bytes of a function name               */

/* A function the request offers. Pointers into the request's JSON. */
typedef struct serve_tool {
    const char *name;
    const cJSON *def;          /* {"type": "function", "function": {...}}   */
} serve_tool;

/* One call read from an answer; name and arguments (a JSON object as
 * compact text) are malloc'd. */
typedef struct serve_tool_call {
    char *name;
    char *arguments;
} serve_tool_call;

/* One message of the request as the client sent it, tool fields included. */
typedef struct serve_tool_msg {
    const char *role;          /* system, user, assistant, tool             */
    const char *content;       /* text, or NULL (an assistant's calls only) */
    const cJSON *tool_calls;   /* an assistant's [{"function": {...}}], or NULL */
    const char *tool_call_id;  /* a tool message's, or NULL                 */
} serve_tool_msg;

/* Messages for the engine: the conversation with the tools and the tool
 * turns written in the family's conventions. On success *out (n_out
 * entries) and the texts they point to are owned by *store (free each,
 * then the array); on failure false with why (a 400's message). */
bool serve_tools_render(const char *family, const serve_tool *tools, int32_t num_tools, const serve_tool_msg *msgs,
                        int32_t n, loom_chat_message **out, int32_t *n_out, char ***store, int32_t *n_store,
                        char *why, size_t why_size);

/* The tool calls in an answer of `len` bytes: how many (0 when the text is
 * not a well-formed call to an offered function, which then stays the
 * answer's content), filled into calls (max of them), and in *content_len
 * how many leading bytes of the text are content before the calls. */
int32_t serve_tool_calls_parse(const char *family, const serve_tool *tools, int32_t num_tools, const char *text,
                               size_t len, serve_tool_call *calls, int32_t max, size_t *content_len);
void serve_tool_calls_free(serve_tool_call *calls, int32_t n);

/* How many leading bytes of a streamed answer can go out as content now:
 * none once it may be a call (llama3: it starts with '{'; mistral: it
 * starts with '[', or the part from a "[TOOL_CALLS]" written as text;
 * chatml: the part from a "<tool_call>", or from a '<' that may begin
 * one). */
size_t serve_tool_stream_safe(const char *family, const char *text, size_t len);

/* tool_choice "required" (named NULL) or a named function: the JSON schema
 * the answer is constrained to — the function's parameters (an object with
 * no properties when it declares none), or a list of 1..max_calls
 * {"name": an offered function, "parameters": its parameters}. malloc'd
 * compact text, or NULL when out of memory. */
char *serve_tool_forced_schema(const serve_tool *tools, int32_t num_tools, const char *named, int32_t max_calls);

/* The calls in a constrained answer (see serve_tool_forced_schema): for a
 * named function always one call whose arguments are the text as generated
 * (cut short by max_tokens it is cut short, as OpenAI streams it); for
 * "required" the list read back, or 0 when it is not a complete list of
 * offered calls (cut off by max_tokens: the text stays content). */
int32_t serve_tool_forced_parse(const serve_tool *tools, int32_t num_tools, const char *named, const char *text,
                                size_t len, serve_tool_call *calls, int32_t max);

#endif
