/*
 * cli/serve/openai.c — OpenAI request bodies → loom requests (see openai.h).
 */
#include "openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h" /* loom_utf8_next */

/* A parse in progress: the request being filled and where errors go. */
typedef struct parse_ctx {
    serve_req *r;
    char *why;
    size_t why_size;
    const char **param;
} parse_ctx;

static bool fail(parse_ctx *c, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(parse_ctx *c, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if ((size_t)vsnprintf(c->why, c->why_size, fmt, ap) >= c->why_size) serve_utf8_trim(c->why);
    va_end(ap);
    *c->param = param;
    return false;
}

/* The value as the client sent it, short enough for a message. */
static const char *shown(const cJSON *v, char *buf, size_t size) {
    char *s = cJSON_PrintUnformatted(v);
    snprintf(buf, size, "%s", s ? s : "?");
    if (s && strlen(s) >= size && size > 4) {
        buf[size - 4] = 0;
        strcat(serve_utf8_trim(buf), "...");
    }
    free(s);
    return buf;
}

/* A field that is absent or JSON null counts as not given. */
static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool num_field(parse_ctx *c, const cJSON *o, const char *key, double lo, double hi, bool integer,
                      double *out) {
    const cJSON *v = field(o, key);
    if (!v) return true;
    char b[64];
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi ||
        (integer && v->valuedouble != floor(v->valuedouble)))
        return fail(c, key, "'%s' must be %s in [%g, %g], got %s", key, integer ? "an integer" : "a number", lo,
                    hi, shown(v, b, sizeof b));
    *out = v->valuedouble;
    return true;
}

/* A float field whose default is what *dst already holds. */
static bool float_field(parse_ctx *c, const cJSON *o, const char *key, double lo, double hi, float *dst) {
    double d = *dst;
    if (!num_field(c, o, key, lo, hi, false, &d)) return false;
    *dst = (float)d;
    return true;
}

static bool bool_field(parse_ctx *c, const cJSON *o, const char *key, bool *out) {
    const cJSON *v = field(o, key);
    if (!v) return true;
    char b[64];
    if (!cJSON_IsBool(v)) return fail(c, key, "'%s' must be true or false, got %s", key, shown(v, b, sizeof b));
    *out = cJSON_IsTrue(v);
    return true;
}

static char *keep(serve_req *r, char *s) {
    char **o = s ? realloc(r->owned, (size_t)(r->num_owned + 1) * sizeof *o) : NULL;
    if (!o) {
        free(s);
        return NULL;
    }
    r->owned = o;
    r->owned[r->num_owned++] = s;
    return s;
}

/* An array of token ids into p (ids must be integers >= 0; the engine checks
 * them against the vocabulary), for the field `param` (`where` names the
 * list in messages); empty only when allow_empty. */
static bool token_array(parse_ctx *c, const cJSON *a, const char *param, const char *where, bool allow_empty,
                        serve_prompt *p) {
    int32_t n = cJSON_GetArraySize(a);
    if (n == 0 && !allow_empty) return fail(c, param, "%s is an empty token list", where);
    p->tokens = malloc((size_t)(n ? n : 1) * sizeof *p->tokens);
    if (!p->tokens) return fail(c, param, "out of memory reading %d tokens", n);
    int32_t i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, a) {
        char b[64];
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > INT32_MAX ||
            t->valuedouble != floor(t->valuedouble))
            return fail(c, param, "%s[%d] must be a token id (an integer >= 0), got %s", where, i,
                        shown(t, b, sizeof b));
        p->tokens[i++] = (int32_t)t->valuedouble;
    }
    p->num_tokens = n;
    return true;
}

/* prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...] */
static bool parse_prompt(parse_ctx *c, const cJSON *root) {
    serve_req *r = c->r;
    const cJSON *p = field(root, "prompt");
    char b[64];
    if (!p) return fail(c, "prompt", "'prompt' is required (text, a list of texts, or token ids)");
    if (cJSON_IsString(p)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return fail(c, NULL, "out of memory");
        r->num_prompts = 1;
        r->prompts[0].text = p->valuestring;
        return true;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return fail(c, "prompt", "'prompt' must be text, a non-empty list of texts, or token ids; got %s",
                    shown(p, b, sizeof b));
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsNumber(first)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return fail(c, NULL, "out of memory");
        r->num_prompts = 1;
        return token_array(c, p, "prompt", "prompt", false, &r->prompts[0]);
    }
    int32_t n = cJSON_GetArraySize(p);
    if (n > SERVE_MAX_PROMPTS)
        return fail(c, "prompt", "%d prompts in one request: at most %d (send several requests; they are "
                    "batched together anyway)", n, SERVE_MAX_PROMPTS);
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return fail(c, NULL, "out of memory");
    r->num_prompts = n;
    int32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
        char where[32];
        snprintf(where, sizeof where, "prompt[%d]", i);
        if (cJSON_IsString(first) && cJSON_IsString(e)) {
            r->prompts[i].text = e->valuestring;
        } else if (cJSON_IsArray(first) && cJSON_IsArray(e)) {
            if (!token_array(c, e, "prompt", where, false, &r->prompts[i])) return false;
        } else {
            return fail(c, "prompt", "%s is %s: a prompt list holds all texts or all token lists", where,
                        shown(e, b, sizeof b));
        }
        i++;
    }
    return true;
}

/* Message content: text, or a list of {"type": "text", "text": ...} parts
 * (joined with newlines, as vLLM does). */
static bool message_content(parse_ctx *c, const cJSON *m, int32_t i, const char **out) {
    const cJSON *ct = field(m, "content");
    char b[64];
    if (!ct && cJSON_IsArray(field(m, "tool_calls"))) { /* an assistant's calls alone */
        *out = NULL;
        return true;
    }
    if (!ct) return fail(c, "messages", "messages[%d] has no content", i);
    if (cJSON_IsString(ct)) {
        *out = ct->valuestring;
        return true;
    }
    if (!cJSON_IsArray(ct))
        return fail(c, "messages", "messages[%d].content must be text or a list of text parts, got %s", i,
                    shown(ct, b, sizeof b));
    size_t len = 0;
    int32_t j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, ct) {
        const cJSON *type = field(part, "type"), *text = field(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return fail(c, "messages", "messages[%d].content[%d] is %s: only {\"type\": \"text\", \"text\": ...} "
                        "parts are supported (this server has no image or audio input)",
                        i, j, shown(part, b, sizeof b));
        len += strlen(text->valuestring) + 1;
        j++;
    }
    char *s = keep(c->r, malloc(len + 1));
    if (!s) return fail(c, NULL, "out of memory");
    s[0] = 0;
    size_t at = 0;
    cJSON_ArrayForEach(part, ct) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        if (at) s[at++] = '\n';
        memcpy(s + at, t, l + 1);
        at += l;
    }
    *out = s;
    return true;
}

/* A message's tool fields: an assistant's tool_calls (a list of
 * {"type": "function", "function": {"name", "arguments"}}) and a tool
 * message's text content. */
static bool tool_fields(parse_ctx *c, const cJSON *m, int32_t i, const char *role, serve_tool_msg *out) {
    const cJSON *tc = field(m, "tool_calls");
    char b[64];
    if (tc && (strcmp(role, "assistant") || !cJSON_IsArray(tc) || cJSON_GetArraySize(tc) > SERVE_MAX_TOOL_CALLS))
        return fail(c, "messages", "messages[%d].tool_calls must be a list of at most %d calls on an assistant "
                    "message, got %s", i, SERVE_MAX_TOOL_CALLS, shown(tc, b, sizeof b));
    if (tc && cJSON_GetArraySize(tc) > 0) {
        out->tool_calls = tc;
        c->r->tool_turns = true;
    }
    if (!strcmp(role, "tool")) {
        const cJSON *ct = field(m, "content"), *id = field(m, "tool_call_id");
        if (!cJSON_IsString(ct)) return fail(c, "messages", "messages[%d] (role tool) needs text content", i);
        if (id && !cJSON_IsString(id))
            return fail(c, "messages", "messages[%d].tool_call_id must be text, got %s", i, shown(id, b, sizeof b));
        out->tool_call_id = id ? id->valuestring : NULL;
        c->r->tool_turns = true;
    }
    return true;
}

static bool parse_messages(parse_ctx *c, const cJSON *root) {
    serve_req *r = c->r;
    const cJSON *ms = field(root, "messages");
    char b[64];
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
        return fail(c, "messages", "'messages' must be a non-empty list of {\"role\", \"content\"}%s%s",
                    ms ? ", got " : "", ms ? shown(ms, b, sizeof b) : "");
    int32_t n = cJSON_GetArraySize(ms);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    r->tool_msgs = calloc((size_t)n, sizeof *r->tool_msgs);
    if (!r->messages || !r->tool_msgs) return fail(c, NULL, "out of memory");
    int32_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return fail(c, "messages", "messages[%d] must be an object with a text 'role', got %s", i,
                        shown(m, b, sizeof b));
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system"; /* OpenAI's newer name for it */
        char rb[64];
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))
            return fail(c, "messages", "messages[%d].role '%s' is not supported: use system, user, assistant or tool%s",
                        i, serve_utf8_clip(rs, 48, rb, sizeof rb),
                        !strcmp(rs, "function") ? " (the legacy 'function' role: send 'tool')" : "");
        r->messages[i].role = rs;
        if (!message_content(c, m, i, &r->messages[i].content)) return false;
        if (!tool_fields(c, m, i, rs, &r->tool_msgs[i])) return false;
        r->tool_msgs[i].role = rs, r->tool_msgs[i].content = r->messages[i].content;
        if (!r->messages[i].content) r->messages[i].content = "";
        i++;
    }
    r->base.messages = r->messages;
    r->base.num_messages = n;
    r->num_prompts = 1;
    return true;
}

static bool parse_stop(parse_ctx *c, const cJSON *root) {
    const cJSON *s = field(root, "stop");
    char b[64];
    if (!s) return true;
    int32_t n = cJSON_IsString(s) ? 1 : cJSON_IsArray(s) ? cJSON_GetArraySize(s) : -1;
    if (n < 0) return fail(c, "stop", "'stop' must be text or a list of texts, got %s", shown(s, b, sizeof b));
    if (n == 0) return true;
    c->r->stop = calloc((size_t)n + 1, sizeof(char *));
    if (!c->r->stop) return fail(c, NULL, "out of memory");
    if (cJSON_IsString(s)) {
        c->r->stop[0] = s->valuestring;
    } else {
        int32_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, s) {
            if (!cJSON_IsString(e))
                return fail(c, "stop", "stop[%d] must be text, got %s", i, shown(e, b, sizeof b));
            c->r->stop[i++] = e->valuestring;
        }
    }
    for (int32_t i = 0; i < n; i++)
        if (!c->r->stop[i][0]) return fail(c, "stop", "stop strings must not be empty (stop[%d] is \"\")", i);
    c->r->base.stop = c->r->stop;
    return true;
}

/* Fields loom cannot honour: refused by name rather than ignored. */
static bool refuse_unsupported(parse_ctx *c, const cJSON *root, serve_api api) {
    const cJSON *v;
    if ((v = field(root, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0]))
        return fail(c, "suffix", "'suffix' (fill-in-the-middle) is not supported");
    if (api != SERVE_CHAT && (v = field(root, "tools")) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return fail(c, "tools", "'tools' (function calling) is supported on /v1/chat/completions only");
    if (api != SERVE_CHAT && (v = field(root, "tool_choice")) &&
        !(cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"))))
        return fail(c, "tool_choice", "'tool_choice' forcing a call is supported on /v1/chat/completions only");
    if ((v = field(root, "functions")) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return fail(c, "functions", "'functions' (the legacy form of function calling) is not supported: send "
                    "'tools'");
    /* vLLM's extensions that change what is generated: refused when set */
    static const char *const guided[] = {"structured_outputs", "prompt_logprobs"};
    for (size_t i = 0; i < sizeof guided / sizeof *guided; i++)
        if (field(root, guided[i]))
            return fail(c, guided[i], "'%s' is not supported by loom serve (use response_format or "
                        "guided_json / guided_regex / guided_choice / guided_grammar)", guided[i]);
    static const char *const flags[] = {"use_beam_search", "include_stop_str_in_output", "continue_final_message"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if ((v = field(root, flags[i])) && !cJSON_IsFalse(v))
            return fail(c, flags[i], "'%s' is not supported by loom serve (leave it unset or false)", flags[i]);
    if (api == SERVE_CHAT && (v = field(root, "echo")) && !cJSON_IsFalse(v))
        return fail(c, "echo", "'echo' is supported on /v1/completions only (leave it unset or false here)");
    if ((v = field(root, "min_tokens")) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return fail(c, "min_tokens", "'min_tokens' is not supported by loom's sampler");
    if ((v = field(root, "stop_token_ids")) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return fail(c, "stop_token_ids", "'stop_token_ids' is not supported: use 'stop' strings");
    return true;
}

/* A function name as OpenAI allows it: 1..64 of [A-Za-z0-9_-]. */
static bool tool_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > SERVE_MAX_TOOL_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

static bool offered_tool(const serve_req *r, const char *name) {
    for (int32_t i = 0; i < r->num_tools; i++)
        if (!strcmp(r->tools[i].name, name)) return true;
    return false;
}

/* tool_choice: "none", "auto" (the default), "required", or {"type":
 * "function", "function": {"name": N}}; *mode is what it said. */
static bool parse_tool_choice(parse_ctx *c, const cJSON *tc, const char **mode, const char **named) {
    char b[64];
    *mode = "auto", *named = NULL;
    if (!tc || cJSON_IsNull(tc)) return true;
    if (cJSON_IsString(tc) && (!strcmp(tc->valuestring, "none") || !strcmp(tc->valuestring, "auto") ||
                               !strcmp(tc->valuestring, "required"))) {
        *mode = tc->valuestring;
        return true;
    }
    const cJSON *type = cJSON_IsObject(tc) ? field(tc, "type") : NULL, *f = type ? field(tc, "function") : NULL;
    const cJSON *name = cJSON_IsObject(f) ? field(f, "name") : NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
        return fail(c, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                    "\"function\", \"function\": {\"name\": ...}}, got %s", shown(tc, b, sizeof b));
    *mode = "named", *named = name->valuestring;
    return true;
}

/* tools: [{"type": "function", "function": {"name", "description",
 * "parameters"}}], offered with tool_choice auto (the default), required
 * or named; with tool_choice none they are checked but not offered. */
static bool parse_tools(parse_ctx *c, const cJSON *root) {
    serve_req *r = c->r;
    const cJSON *v = field(root, "tools"), *t;
    const char *mode, *named;
    char b[64];
    r->parallel_tool_calls = true;
    if (!bool_field(c, root, "parallel_tool_calls", &r->parallel_tool_calls)) return false;
    if (!parse_tool_choice(c, field(root, "tool_choice"), &mode, &named)) return false;
    const bool forced = !strcmp(mode, "required") || named;
    if (forced && (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0))
        return fail(c, "tool_choice", "'tool_choice' %s needs the functions in 'tools'", named ? "naming a function"
                                                                                               : "\"required\"");
    if (!v) return true;
    const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > SERVE_MAX_TOOLS)
        return fail(c, "tools", "'tools' must be a list of at most %d functions, got %s", SERVE_MAX_TOOLS,
                    shown(v, b, sizeof b));
    if (n == 0) return true;
    r->tools = calloc((size_t)n, sizeof *r->tools);
    if (!r->tools) return fail(c, NULL, "out of memory");
    int i = 0;
    cJSON_ArrayForEach(t, v) {
        const cJSON *type = field(t, "type"), *f = field(t, "function");
        const cJSON *name = f ? field(f, "name") : NULL, *params = f ? field(f, "parameters") : NULL;
        const cJSON *desc = f ? field(f, "description") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(f))
            return fail(c, "tools", "tools[%d] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!cJSON_IsString(name) || !tool_name_ok(name->valuestring))
            return fail(c, "tools", "tools[%d].function.name must be 1 to %d letters, digits, '_' or '-'", i,
                        SERVE_MAX_TOOL_NAME);
        if ((params && !cJSON_IsObject(params)) || (desc && !cJSON_IsString(desc)))
            return fail(c, "tools", "tools[%d].function: 'parameters' must be a JSON schema object and "
                        "'description' text", i);
        for (int k = 0; k < i; k++)
            if (!strcmp(r->tools[k].name, name->valuestring))
                return fail(c, "tools", "tools[%d]: the function name '%s' is offered twice", i, name->valuestring);
        r->tools[i++] = (serve_tool){name->valuestring, t};
    }
    r->num_tools = !strcmp(mode, "none") ? 0 : n; /* none: checked, not offered */
    r->tool_required = !strcmp(mode, "required");
    r->tool_named = named;
    if (named && !offered_tool(r, named))
        return fail(c, "tool_choice", "'tool_choice' names the function '%.64s', which 'tools' does not offer", named);
    return true;
}

/* tool_choice "required" or named: the answer constrained to the calls'
 * JSON (tools.h, serve_tool_forced_schema); not with another constraint. */
static bool apply_tool_choice(parse_ctx *c) {
    serve_req *r = c->r;
    if (!r->tool_required && !r->tool_named) return true;
    if (r->base.constraint_lang)
        return fail(c, "tool_choice", "'tool_choice' %s with response_format or guided_*: send one way of "
                    "constraining the output", r->tool_named ? "naming a function" : "\"required\"");
    char *schema = keep(r, serve_tool_forced_schema(r->tools, r->num_tools, r->tool_named,
                                                    r->parallel_tool_calls ? SERVE_MAX_TOOL_CALLS : 1));
    if (!schema) return fail(c, "tool_choice", "out of memory building the tool-call schema");
    r->base.constraint_lang = "json_schema";
    r->base.constraint = schema;
    return true;
}

bool serve_req_apply_tools(serve_req *r, const char *family, char *why, size_t why_size, const char **param) {
    *param = NULL;
    if (r->num_tools == 0 && !r->tool_turns) return true;
    *param = r->num_tools > 0 ? "tools" : "messages";
    if (!serve_tools_render(family, r->tools, r->num_tools, r->tool_msgs, r->base.num_messages, &r->rendered,
                            &r->base.num_messages, &r->rendered_text, &r->num_rendered_text, why, why_size))
        return false;
    r->base.messages = r->rendered;
    *param = NULL;
    return true;
}

/* OpenAI's response_format: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}},
 * enforced by the pipeline's constraint plugin (always strictly); the
 * engine refuses a schema it cannot enforce, naming the keyword. */
static bool parse_response_format(parse_ctx *c, const cJSON *root) {
    const cJSON *v = field(root, "response_format");
    char b[64];
    if (!v || cJSON_IsNull(v)) return true;
    const cJSON *type = cJSON_IsObject(v) ? field(v, "type") : NULL;
    if (!cJSON_IsString(type))
        return fail(c, "response_format", "'response_format' must be an object with a \"type\", got %s",
                    shown(v, b, sizeof b));
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_object")) {
        c->r->base.constraint_lang = "json_object";
        return true;
    }
    if (strcmp(t, "json_schema"))
        return fail(c, "response_format", "'response_format' type \"%.32s\" is not supported: \"text\", "
                    "\"json_object\" or \"json_schema\"", t);
    const cJSON *js = field(v, "json_schema"), *schema = js ? field(js, "schema") : NULL;
    if (!cJSON_IsObject(js))
        return fail(c, "response_format", "'response_format.json_schema' must be an object with a \"schema\"");
    const cJSON *name = field(js, "name"), *strict = field(js, "strict");
    if (name && !cJSON_IsString(name))
        return fail(c, "response_format", "'response_format.json_schema.name' must be text, got %s",
                    shown(name, b, sizeof b));
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return fail(c, "response_format", "'response_format.json_schema.strict' must be true or false");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return fail(c, "response_format", "'response_format.json_schema.schema' must be a JSON schema (an object), "
                    "got %s", schema ? shown(schema, b, sizeof b) : "nothing");
    char *text = keep(c->r, cJSON_PrintUnformatted(schema));
    if (!text) return fail(c, "response_format", "out of memory reading the schema");
    c->r->base.constraint_lang = "json_schema";
    c->r->base.constraint = text;
    return true;
}

/* guided_choice as a regex: the choices as literals (ASCII punctuation
 * escaped), one of them exactly. NULL when out of memory. */
static char *choice_regex(const cJSON *v) {
    size_t cap = 3;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) cap += 2 * strlen(e->valuestring) + 1;
    char *re = malloc(cap), *o = re;
    if (!re) return NULL;
    cJSON_ArrayForEach(e, v) {
        if (o != re) *o++ = '|';
        for (const unsigned char *s = (const unsigned char *)e->valuestring; *s; s++) {
            if (*s < 0x80 && !((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
                *o++ = '\\';
            *o++ = (char)*s;
        }
    }
    *o = '\0';
    return re;
}

/* vLLM's guided decoding fields: guided_json (a schema, or its text),
 * guided_regex, guided_grammar (GBNF) and guided_choice (a list of texts),
 * at most one of them and not with a response_format that constrains. */
static bool parse_guided(parse_ctx *c, const cJSON *root) {
    static const char *const keys[] = {"guided_json", "guided_regex", "guided_grammar", "guided_choice"};
    const cJSON *v = NULL;
    const char *key = NULL;
    char b[64];
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *f = field(root, keys[i]);
        if (!f || cJSON_IsNull(f)) continue;
        if (key || c->r->base.constraint_lang)
            return fail(c, keys[i], "'%s' with %s: send one way of constraining the output", keys[i],
                        key ? key : "response_format");
        v = f, key = keys[i];
    }
    if (!key) return true;
    char *text = NULL;
    if (!strcmp(key, "guided_json")) {
        if (!cJSON_IsObject(v) && !cJSON_IsString(v))
            return fail(c, key, "'guided_json' must be a JSON schema (an object or its text), got %s",
                        shown(v, b, sizeof b));
        text = cJSON_IsString(v) ? strdup(v->valuestring) : cJSON_PrintUnformatted(v);
        c->r->base.constraint_lang = "json_schema";
    } else if (!strcmp(key, "guided_choice")) {
        const cJSON *e;
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
            return fail(c, key, "'guided_choice' must be a non-empty list of texts, got %s", shown(v, b, sizeof b));
        cJSON_ArrayForEach(e, v) if (!cJSON_IsString(e) || !e->valuestring[0])
            return fail(c, key, "'guided_choice' entries must be non-empty texts");
        text = choice_regex(v);
        c->r->base.constraint_lang = "regex";
    } else {
        if (!cJSON_IsString(v) || !v->valuestring[0])
            return fail(c, key, "'%s' must be a non-empty text, got %s", key, shown(v, b, sizeof b));
        text = strdup(v->valuestring);
        c->r->base.constraint_lang = !strcmp(key, "guided_regex") ? "regex" : "gbnf";
    }
    if (!(c->r->base.constraint = keep(c->r, text))) return fail(c, key, "out of memory reading '%s'", key);
    return true;
}

/* OpenAI's logit_bias: an object of token id (a decimal string) to a bias in
 * [-100, 100]. The engine checks the ids against the vocabulary. */
static bool parse_logit_bias(parse_ctx *c, const cJSON *root) {
    const cJSON *v = field(root, "logit_bias"), *e;
    char b[64];
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsObject(v)) return fail(c, "logit_bias", "'logit_bias' must be an object of token id to bias, got %s",
                                        shown(v, b, sizeof b));
    const int n = cJSON_GetArraySize(v);
    if (n == 0) return true;
    if (n > LOOM_MAX_LOGIT_BIAS)
        return fail(c, "logit_bias", "'logit_bias' has %d entries: at most %d", n, LOOM_MAX_LOGIT_BIAS);
    loom_logit_bias *lb = calloc((size_t)n, sizeof *lb);
    if (!lb) return fail(c, "logit_bias", "out of memory reading 'logit_bias'");
    c->r->logit_bias = lb;
    int i = 0;
    cJSON_ArrayForEach(e, v) {
        char *end = NULL;
        errno = 0;
        const long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || errno || id < 0 || id > INT32_MAX)
            return fail(c, "logit_bias", "'logit_bias' key \"%.32s\" is not a token id", e->string);
        if (!cJSON_IsNumber(e) || !(fabs(e->valuedouble) <= LOOM_LOGIT_BIAS_MAX))
            return fail(c, "logit_bias", "'logit_bias' for token %ld must be a number in [-100, 100], got %s", id,
                        shown(e, b, sizeof b));
        lb[i++] = (loom_logit_bias){.token = (int32_t)id, .bias = (float)e->valuedouble};
    }
    c->r->base.logit_bias = lb;
    c->r->base.num_logit_bias = n;
    return true;
}

/* logprobs: completions — how many alternatives (0..20); chat — a bool
 * plus top_logprobs. The engine reports the chosen token's logprob only
 * when it computes alternatives, so at least one is asked for. With echo
 * the prompt's own logprobs are asked for too. */
static bool parse_logprobs(parse_ctx *c, const cJSON *root, serve_api api) {
    serve_req *r = c->r;
    double d = -1;
    r->logprobs = -1;
    if (api == SERVE_COMPLETIONS) {
        if (!num_field(c, root, "logprobs", 0, LOOM_MAX_LOGPROBS, true, &d)) return false;
        r->logprobs = (int32_t)d;
    } else {
        bool lp = false;
        if (!bool_field(c, root, "logprobs", &lp)) return false;
        d = 0;
        if (!num_field(c, root, "top_logprobs", 0, LOOM_MAX_LOGPROBS, true, &d)) return false;
        if (d > 0 && !lp) return fail(c, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
        r->logprobs = lp ? (int32_t)d : -1;
    }
    if (r->logprobs >= 0) r->base.params.logprobs = r->logprobs > 0 ? r->logprobs : 1;
    r->base.prompt_logprobs = r->echo && r->logprobs >= 0;
    return true;
}

static bool parse_sampling(parse_ctx *c, const cJSON *root, serve_api api, int32_t default_max_tokens) {
    serve_req *r = c->r;
    loom_sampling_params *p = &r->base.params;
    double d;
    if (!float_field(c, root, "temperature", 0, 100, &p->temperature)) return false;
    if (!float_field(c, root, "top_p", 1e-9, 1, &p->top_p)) return false;
    d = 0;
    if (!num_field(c, root, "top_k", -1, 1e9, true, &d)) return false;
    p->top_k = d < 0 ? 0 : (int32_t)d; /* vLLM's -1 = off */
    if (!float_field(c, root, "min_p", 0, 1, &p->min_p)) return false;
    if (!float_field(c, root, "repetition_penalty", 1e-3, 100, &p->repetition_penalty)) return false;
    if (!float_field(c, root, "presence_penalty", -2, 2, &p->presence_penalty)) return false;
    if (!float_field(c, root, "frequency_penalty", -2, 2, &p->frequency_penalty)) return false;
    if (field(root, "seed")) {
        if (!num_field(c, root, "seed", -9.2e18, 1.8e19, true, &d)) return false;
        p->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
        p->has_seed = true;
    }
    d = 1;
    if (!num_field(c, root, "n", 1, 64, true, &d)) return false;
    r->base.n = (int32_t)d;
    if ((int64_t)r->num_prompts * r->base.n > SERVE_MAX_CHOICES)
        return fail(c, "n", "%d prompts x n = %d is %lld choices: at most %d in one request", r->num_prompts,
                    r->base.n, (long long)r->num_prompts * r->base.n, SERVE_MAX_CHOICES);
    if (field(root, "best_of")) {
        double bo = 0;
        if (!num_field(c, root, "best_of", 1, 64, true, &bo)) return false;
        if ((int32_t)bo != r->base.n)
            return fail(c, "best_of", "'best_of' %d is not supported: loom returns every sample (leave it unset, "
                        "or equal to n = %d)", (int32_t)bo, r->base.n);
    }
    r->base.max_tokens = default_max_tokens;
    const char *mt = api == SERVE_CHAT && field(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                                : "max_tokens";
    if (api == SERVE_COMPLETIONS && !bool_field(c, root, "echo", &r->echo)) return false;
    d = default_max_tokens;
    /* 0 only with echo: the prompt back, scored with logprobs, nothing generated */
    if (!num_field(c, root, mt, r->echo ? 0 : 1, 1e9, true, &d)) return false;
    r->base.max_tokens = (int32_t)d;
    r->base.prompt_only = r->echo && d == 0;
    /* asked for explicitly: more than fits is an error, as OpenAI and vLLM
     * have it; the default (16, or the rest of the context) is cut to fit */
    r->base.strict_max_tokens = field(root, mt) != NULL;
    if (!bool_field(c, root, "ignore_eos", &r->base.ignore_eos)) return false;
    if (!parse_logit_bias(c, root)) return false;
    if (!parse_response_format(c, root) || !parse_guided(c, root) || !apply_tool_choice(c)) return false;
    if (!parse_logprobs(c, root, api)) return false;

    if (!bool_field(c, root, "stream", &r->stream)) return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        char b[64];
        if (!cJSON_IsObject(so))
            return fail(c, "stream_options", "'stream_options' must be an object, got %s", shown(so, b, sizeof b));
        if (!r->stream) return fail(c, "stream_options", "'stream_options' is only allowed with \"stream\": true");
        if (!bool_field(c, so, "include_usage", &r->include_usage)) return false;
    }
    return parse_stop(c, root);
}

/* POST /tokenize: {"prompt": text} or {"messages": [...]} (rendered with
 * the assistant's turn to speak), and add_special_tokens (vLLM's defaults:
 * true for a prompt, false for messages, whose template writes its own). */
static bool parse_tokenize(parse_ctx *c, const cJSON *root) {
    serve_req *r = c->r;
    const cJSON *p = field(root, "prompt"), *ms = field(root, "messages"), *agp = field(root, "add_generation_prompt");
    char b[64];
    if (p && ms) return fail(c, "messages", "give either 'prompt' or 'messages', not both");
    if (agp && !cJSON_IsTrue(agp))
        return fail(c, "add_generation_prompt", "'add_generation_prompt' %s is not supported: the conversation is "
                    "rendered with the assistant's turn to speak, as chat completions read it",
                    shown(agp, b, sizeof b));
    if ((p = field(root, "continue_final_message")) && !cJSON_IsFalse(p))
        return fail(c, "continue_final_message", "'continue_final_message' is not supported by loom serve");
    p = field(root, "prompt");
    r->add_special = !ms;
    if (!bool_field(c, root, "add_special_tokens", &r->add_special)) return false;
    if (ms) return refuse_unsupported(c, root, SERVE_CHAT) && parse_messages(c, root) && parse_tools(c, root);
    if (!cJSON_IsString(p))
        return fail(c, "prompt", "'prompt' must be text (or send 'messages')%s%s", p ? ", got " : "",
                    p ? shown(p, b, sizeof b) : "");
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) return fail(c, NULL, "out of memory");
    r->num_prompts = 1;
    r->prompts[0].text = p->valuestring;
    return true;
}

/* POST /detokenize: {"tokens": [id, ...]} (may be empty). */
static bool parse_detokenize(parse_ctx *c, const cJSON *root) {
    serve_req *r = c->r;
    const cJSON *t = field(root, "tokens");
    char b[64];
    if (!cJSON_IsArray(t))
        return fail(c, "tokens", "'tokens' must be a list of token ids%s%s", t ? ", got " : "",
                    t ? shown(t, b, sizeof b) : "");
    r->prompts = calloc(1, sizeof *r->prompts);
    if (!r->prompts) return fail(c, NULL, "out of memory");
    r->num_prompts = 1;
    return token_array(c, t, "tokens", "tokens", true, &r->prompts[0]);
}

/* The request's own fields, by route. */
static bool parse_route(parse_ctx *c, const cJSON *root, serve_api api, int32_t default_max_tokens) {
    switch (api) {
    case SERVE_TOKENIZE: return parse_tokenize(c, root);
    case SERVE_DETOKENIZE: return parse_detokenize(c, root);
    case SERVE_CHAT:
        return refuse_unsupported(c, root, api) && parse_messages(c, root) && parse_tools(c, root) &&
               parse_sampling(c, root, api, default_max_tokens);
    default:
        return refuse_unsupported(c, root, api) && parse_prompt(c, root) &&
               parse_sampling(c, root, api, default_max_tokens);
    }
}

/* Offset of a "\u0000" escape in a JSON text, or -1: cJSON decodes it to a
 * NUL byte, which would silently cut a prompt, message or stop string. An
 * escaped backslash is skipped as a pair, so "\\u0000" is not one. */
static long escaped_nul(const char *s, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 6 <= len && !memcmp(s + i + 2, "0000", 4)) return (long)i;
        i++; /* the escaped character */
    }
    return -1;
}

bool serve_parse(serve_api api, const char *body, size_t len, int32_t default_max_tokens, serve_req *out,
                 char *why, size_t why_size, const char **param) {
    memset(out, 0, sizeof *out);
    out->api = api;
    out->base = loom_request_default();
    out->base.params.temperature = 1.0f; /* the OpenAI API's default (loom run's is greedy) */
    out->logprobs = -1;
    parse_ctx c = {out, why, why_size, param};
    *param = NULL;
    const char *end = NULL, *nul = body ? memchr(body, 0, len) : NULL;
    /* body[len] is NUL: parsing len + 1 bytes and requiring the NUL makes
     * trailing text after the object an error too */
    out->root = body && len && !nul ? cJSON_ParseWithLengthOpts(body, len + 1, &end, true) : NULL;
    bool ok;
    long esc = out->root ? escaped_nul(body, len) : -1;
    if (nul) {
        ok = fail(&c, NULL, "the request body has a NUL byte at offset %zu: send UTF-8 JSON", (size_t)(nul - body));
    } else if (esc >= 0) {
        ok = fail(&c, NULL, "the request body has a \\u0000 (NUL) escape at byte %ld: text with NUL characters is "
                  "not supported", esc + 1);
    } else if (!out->root) {
        size_t at = end && body ? (size_t)(end - body) + 1 : len; /* 1-based */
        if (at > len) at = len;
        ok = len == 0 ? fail(&c, NULL, "the request body is empty: send a JSON object")
                      : fail(&c, NULL, "the request body is not valid JSON (error at byte %zu of %zu)", at, len);
    } else if (!cJSON_IsObject(out->root)) {
        ok = fail(&c, NULL, "the request body must be a JSON object");
    } else {
        const cJSON *m = field(out->root, "model");
        char b[64];
        ok = true;
        if (m && !cJSON_IsString(m))
            ok = fail(&c, "model", "'model' must be text, got %s", shown(m, b, sizeof b));
        if (ok) out->model = m ? m->valuestring : NULL;
        ok = ok && parse_route(&c, out->root, api, default_max_tokens);
    }
    if (!ok) serve_req_free(out);
    return ok;
}

void serve_req_free(serve_req *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->num_prompts && r->prompts; i++) free(r->prompts[i].tokens);
    free(r->prompts);
    free(r->messages);
    free(r->tools);
    free(r->tool_msgs);
    free(r->rendered);
    for (int32_t i = 0; i < r->num_rendered_text; i++) free(r->rendered_text[i]);
    free(r->rendered_text);
    for (int32_t i = 0; i < r->num_owned; i++) free(r->owned[i]);
    free(r->owned);
    free(r->stop);
    free(r->logit_bias);
    cJSON_Delete(r->root);
    memset(r, 0, sizeof *r);
}

size_t serve_prompt_bytes(const serve_req *r, int32_t *which) {
    size_t most = 0;
    *which = 0;
    if (r->base.num_messages > 0) { /* after serve_req_apply_tools: the tools' text counts too */
        for (int32_t i = 0; i < r->base.num_messages; i++)
            most += r->base.messages[i].content ? strlen(r->base.messages[i].content) : 0;
        return most;
    }
    for (int32_t p = 0; p < r->num_prompts; p++) {
        size_t n = r->prompts[p].text ? strlen(r->prompts[p].text) : 0;
        if (n > most) most = n, *which = p;
    }
    return most;
}

const char *serve_finish_name(loom_finish_reason f) {
    switch (f) {
    case LOOM_FINISH_EOS:
    case LOOM_FINISH_STOP: return "stop";
    case LOOM_FINISH_LENGTH: return "length";
    case LOOM_FINISH_ABORT: return "abort";
    case LOOM_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

char *serve_utf8_trim(char *s) {
    size_t n = strlen(s), back = 0;
    while (back < 3 && back < n && ((unsigned char)s[n - 1 - back] & 0xC0) == 0x80) back++;
    if (back == n) return s;
    size_t at = n - 1 - back, adv = 0; /* the last byte that is no continuation */
    if (loom_utf8_next((const unsigned char *)s + at, n - at, &adv) == 0) s[at] = 0;
    return s;
}

const char *serve_utf8_clip(const char *s, size_t max, char *out, size_t size) {
    snprintf(out, max + 1 < size ? max + 1 : size, "%s", s ? s : "");
    return serve_utf8_trim(out);
}

cJSON *serve_json_text(const char *s, size_t n) {
    size_t cap = 3;
    for (size_t i = 0; i < n; i++) cap += (unsigned char)s[i] < 0x20 ? 6 : s[i] == '"' || s[i] == '\\' ? 2 : 1;
    char *q = malloc(cap), *w = q;
    if (!q) return NULL;
    *w++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') *w++ = '\\', *w++ = (char)c;
        else if (c < 0x20) w += sprintf(w, "\\u%04x", c);
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = 0;
    cJSON *o = cJSON_CreateRaw(q);
    free(q);
    return o;
}

char *serve_utf8_valid(const char *s) {
    size_t n = strlen(s);
    char *t = malloc(3 * n + 1), *w = t;
    if (!t) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0, adv; i < n;) {
        if (loom_utf8_next(p + i, n - i, &adv) == 1) {
            memcpy(w, p + i, adv), w += adv, i += adv;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3), w += 3; /* U+FFFD for the ill-formed part */
            i += adv ? adv : n - i;
        }
    }
    *w = 0;
    return t;
}

char *serve_error_json(int http_status, const char *message, const char *param) {
    const char *type = http_status == 401   ? "authentication_error"
                       : http_status == 404 ? "not_found_error"
                       : http_status >= 500 ? "server_error"
                                            : "invalid_request_error";
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    char *m = serve_utf8_valid(message ? message : "");
    cJSON_AddStringToObject(e, "message", m ? m : "(out of memory)");
    free(m);
    cJSON_AddStringToObject(e, "type", type);
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", http_status);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
