/*
 * cli/serve/tools.c — tool calling over a chat template family (see
 * tools.h): rendering the offered tools and the tool turns into messages,
 * and reading calls back out of the model's answer.
 */
#include "tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- text */

typedef struct tbuf {
    char *p;
    size_t n, cap;
    bool oom;
} tbuf;

static void tb_put(tbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void tb_puts(tbuf *b, const char *s) { tb_put(b, s, strlen(s)); }

/* A JSON value as compact text into b. */
static void tb_json(tbuf *b, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        b->oom = true;
        return;
    }
    tb_puts(b, s);
    free(s);
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static bool fail(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *why, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return false;
}

/* ---------------------------------------------------------- rendering */

/* The render in progress: messages out and the texts they own. */
typedef struct render {
    loom_chat_message *out;
    int32_t n;
    char **store;
    int32_t n_store;
    bool oom;
} render;

/* Append a message; a tbuf's text (taken) becomes its content. */
static void emit(render *r, const char *role, tbuf *text) {
    if (text->oom) r->oom = true;
    if (r->oom) {
        free(text->p);
        *text = (tbuf){0};
        return;
    }
    r->store[r->n_store++] = text->p ? text->p : NULL;
    r->out[r->n++] = (loom_chat_message){role, text->p ? text->p : ""};
    *text = (tbuf){0};
}

/* An assistant's tool_calls as [(name, arguments text)], checked: each
 * {"function": {"name": text, "arguments": JSON-object text or object}}. */
static bool call_parts(const cJSON *call, int32_t i, int32_t k, const char **name, cJSON **args, char *why,
                       size_t whyn) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *nm = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
    const cJSON *a = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
    if (!cJSON_IsString(nm) || !nm->valuestring[0])
        return fail(why, whyn, "messages[%d].tool_calls[%d] needs function.name", i, k);
    *name = nm->valuestring;
    *args = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : a ? cJSON_Duplicate(a, true) : cJSON_CreateObject();
    if (!cJSON_IsObject(*args)) {
        cJSON_Delete(*args);
        return fail(why, whyn, "messages[%d].tool_calls[%d].function.arguments must be a JSON object (as text)", i,
                    k);
    }
    return true;
}

/* Hermes / Qwen2.5: the instructions and <tools> block of the system turn. */
static void hermes_tools(tbuf *b, const serve_tool *tools, int32_t n) {
    tb_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
               "with function signatures within <tools></tools> XML tags:\n<tools>");
    for (int32_t i = 0; i < n; i++) {
        tb_puts(b, "\n");
        tb_json(b, tools[i].def);
    }
    tb_puts(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>");
}

/* An assistant turn's calls as <tool_call> blocks after its text. */
static bool hermes_calls(tbuf *b, const serve_tool_msg *m, int32_t i, char *why, size_t whyn) {
    int32_t k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, m->tool_calls) {
        const char *name;
        cJSON *args;
        if (!call_parts(call, i, k++, &name, &args, why, whyn)) return false;
        if (b->n) tb_puts(b, "\n");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddItemToObject(o, "arguments", args);
        tb_puts(b, "<tool_call>\n");
        tb_json(b, o);
        tb_puts(b, "\n</tool_call>");
        cJSON_Delete(o);
    }
    return true;
}

static bool render_hermes(render *r, const serve_tool *tools, int32_t nt, const serve_tool_msg *m, int32_t n,
                          char *why, size_t whyn) {
    int32_t i = 0;
    tbuf b = {0};
    if (nt > 0) { /* the tools go into the system turn, made when there is none */
        if (n > 0 && !strcmp(m[0].role, "system")) {
            tb_puts(&b, m[0].content ? m[0].content : "");
            tb_puts(&b, "\n\n");
            i = 1;
        }
        hermes_tools(&b, tools, nt);
        emit(r, "system", &b);
    }
    for (; i < n; i++) {
        if (!strcmp(m[i].role, "tool")) { /* consecutive results: one user turn */
            for (; i < n && !strcmp(m[i].role, "tool"); i++) {
                tb_puts(&b, b.n ? "\n<tool_response>\n" : "<tool_response>\n");
                tb_puts(&b, m[i].content ? m[i].content : "");
                tb_puts(&b, "\n</tool_response>");
            }
            i--;
            emit(r, "user", &b);
            continue;
        }
        tb_puts(&b, m[i].content ? m[i].content : "");
        if (m[i].tool_calls && !hermes_calls(&b, &m[i], i, why, whyn)) {
            free(b.p);
            return false;
        }
        emit(r, m[i].role, &b);
    }
    return true;
}

/* Llama 3.1's instructions before the first user turn's text. */
static void llama3_tools(tbuf *b, const serve_tool *tools, int32_t n) {
    tb_puts(b, "Given the following functions, please respond with a JSON for a function call with its proper "
               "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
               "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
    for (int32_t i = 0; i < n; i++) {
        tb_json(b, tools[i].def);
        tb_puts(b, "\n\n");
    }
}

/* A Llama 3.1 assistant turn's one call as {"name", "parameters"}. */
static bool llama3_call(tbuf *b, const serve_tool_msg *m, int32_t i, char *why, size_t whyn) {
    if (cJSON_GetArraySize(m->tool_calls) != 1)
        return fail(why, whyn, "messages[%d] has %d tool calls: the llama3 template writes one per assistant turn",
                    i, cJSON_GetArraySize(m->tool_calls));
    const char *name;
    cJSON *args;
    if (!call_parts(cJSON_GetArrayItem(m->tool_calls, 0), i, 0, &name, &args, why, whyn)) return false;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddItemToObject(o, "parameters", args);
    tb_json(b, o);
    cJSON_Delete(o);
    return true;
}

static bool render_llama3(render *r, const serve_tool *tools, int32_t nt, const serve_tool_msg *m, int32_t n,
                          char *why, size_t whyn) {
    bool tools_put = nt == 0;
    for (int32_t i = 0; i < n; i++) {
        tbuf b = {0};
        const char *role = !strcmp(m[i].role, "tool") ? "ipython" : m[i].role;
        if (!tools_put && !strcmp(role, "user")) {
            llama3_tools(&b, tools, nt);
            tools_put = true;
        }
        tb_puts(&b, m[i].content ? m[i].content : "");
        if (m[i].tool_calls && !llama3_call(&b, &m[i], i, why, whyn)) {
            free(b.p);
            return false;
        }
        emit(r, role, &b);
    }
    if (!tools_put) return fail(why, whyn, "the llama3 template puts the tools in the first user message: send one");
    return true;
}

/* Mistral (tokenizer v3): JSON as mistral-common writes it with Python's
 * json.dumps(..., ensure_ascii=False): ", " and ": " between items, only
 * what JSON must escape escaped (control characters as \u00xx). */
static void py_str(tbuf *b, const char *s) {
    tb_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        static const char from[] = "\"\\\n\r\t\b\f", to[] = "\"\\nrtbf";
        const char *e = *p ? strchr(from, *p) : NULL;
        char esc[8];
        if (e) snprintf(esc, sizeof esc, "\\%c", to[e - from]);
        else if (*p < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *p);
        else esc[0] = (char)*p, esc[1] = 0;
        tb_puts(b, esc);
    }
    tb_puts(b, "\"");
}

static void py_json(tbuf *b, const cJSON *v) {
    if (cJSON_IsString(v)) {
        py_str(b, v->valuestring);
        return;
    }
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) { /* numbers, true, false, null */
        tb_json(b, v);
        return;
    }
    tb_puts(b, cJSON_IsObject(v) ? "{" : "[");
    for (const cJSON *c = v->child; c; c = c->next) {
        if (cJSON_IsObject(v)) {
            py_str(b, c->string);
            tb_puts(b, ": ");
        }
        py_json(b, c);
        if (c->next) tb_puts(b, ", ");
    }
    tb_puts(b, cJSON_IsObject(v) ? "}" : "]");
}

/* The tools as mistral-common dumps its Tool models: {"type": "function",
 * "function": {"name", "description" ("" when absent), "parameters" ({}
 * when absent)}}. */
static void mistral_tools(tbuf *b, const serve_tool *tools, int32_t n) {
    cJSON *list = cJSON_CreateArray();
    for (int32_t i = 0; list && i < n; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tools[i].def, "function");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(f, "description");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        cJSON *t = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddItemToArray(list, t);
        cJSON_AddStringToObject(t, "type", "function");
        cJSON_AddItemToObject(t, "function", fn);
        cJSON_AddStringToObject(fn, "name", tools[i].name);
        cJSON_AddStringToObject(fn, "description", cJSON_IsString(d) ? d->valuestring : "");
        cJSON_AddItemToObject(fn, "parameters", p ? cJSON_Duplicate(p, true) : cJSON_CreateObject());
    }
    if (!list) b->oom = true;
    else py_json(b, list);
    cJSON_Delete(list);
}

/* A call id as Mistral v3 writes it: 9 letters and digits. An id that is
 * one is kept; another becomes the last 9 of its letters and digits (the
 * same for a call and its result). False when it has fewer. */
static bool mistral_id(const char *id, char out[10]) {
    size_t n = 0, len = strlen(id);
    out[9] = 0;
    for (size_t i = len; i-- > 0 && n < 9;)
        if ((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z'))
            out[8 - n++] = id[i];
    return n == 9;
}

/* An assistant turn's calls: [{"name", "arguments", "id"}, ...]. */
static bool mistral_calls(tbuf *b, const serve_tool_msg *m, int32_t i, char *why, size_t whyn) {
    cJSON *list = cJSON_CreateArray();
    int32_t k = 0;
    const cJSON *call;
    bool ok = list != NULL;
    cJSON_ArrayForEach(call, m->tool_calls) {
        const char *name;
        cJSON *args;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
        char id9[10];
        if (!ok || !(ok = call_parts(call, i, k, &name, &args, why, whyn))) break;
        ok = cJSON_IsString(id) && mistral_id(id->valuestring, id9);
        if (!ok) {
            cJSON_Delete(args);
            fail(why, whyn, "messages[%d].tool_calls[%d] needs an id with at least 9 letters and digits (the mistral "
                 "template writes 9)", i, k);
            break;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(list, o);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddItemToObject(o, "arguments", args);
        cJSON_AddStringToObject(o, "id", id9);
        k++;
    }
    if (ok) py_json(b, list);
    else if (!list) fail(why, whyn, "out of memory");
    cJSON_Delete(list);
    return ok;
}

/* A tool's result: {"content": its text read as JSON when it is JSON, else
 * the text, "call_id": the call's id}. */
static bool mistral_result(tbuf *b, const serve_tool_msg *m, int32_t i, char *why, size_t whyn) {
    char id9[10];
    if (!m->tool_call_id || !mistral_id(m->tool_call_id, id9))
        return fail(why, whyn, "messages[%d] (role tool) needs a tool_call_id with at least 9 letters and digits "
                    "(the mistral template writes 9)", i);
    const char *text = m->content ? m->content : "";
    cJSON *o = cJSON_CreateObject(), *parsed = cJSON_ParseWithOpts(text, NULL, true);
    cJSON_AddItemToObject(o, "content", parsed ? parsed : cJSON_CreateString(text));
    cJSON_AddStringToObject(o, "call_id", id9);
    py_json(b, o);
    cJSON_Delete(o);
    return true;
}

static bool render_mistral(render *r, const serve_tool *tools, int32_t nt, const serve_tool_msg *m, int32_t n,
                           char *why, size_t whyn) {
    int32_t last_user = -1;
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(m[i].role, "user")) last_user = i;
    if (nt > 0 && last_user < 0)
        return fail(why, whyn, "the mistral template puts the tools before the last user message: send one");
    /* a leading system message goes in front of the last user message, as
     * mistral-common's v3 writes it (not the first, as plain chat does) */
    const bool sys = n > 0 && !strcmp(m[0].role, "system") && last_user > 0;
    for (int32_t i = sys; i < n; i++) {
        tbuf b = {0};
        bool ok = true;
        const char *role = m[i].role;
        if (i == last_user && nt > 0) {
            mistral_tools(&b, tools, nt);
            emit(r, "available_tools", &b);
        }
        if (i == last_user && sys) {
            tb_puts(&b, m[0].content ? m[0].content : "");
            tb_puts(&b, "\n\n");
        }
        if (!strcmp(role, "tool")) {
            ok = mistral_result(&b, &m[i], i, why, whyn);
            role = "tool_results";
        } else if (m[i].tool_calls) {
            const char *c = m[i].content ? m[i].content : "";
            while (is_ws(*c)) c++;
            ok = !*c ? mistral_calls(&b, &m[i], i, why, whyn)
                     : fail(why, whyn, "messages[%d] has text and tool calls: the mistral template writes an "
                            "assistant turn's text or its calls, not both", i);
            role = "tool_calls";
        } else {
            tb_puts(&b, m[i].content ? m[i].content : "");
        }
        if (!ok) {
            free(b.p);
            return false;
        }
        emit(r, role, &b);
    }
    return true;
}

bool serve_tools_render(const char *family, const serve_tool *tools, int32_t num_tools, const serve_tool_msg *msgs,
                        int32_t n, loom_chat_message **out, int32_t *n_out, char ***store, int32_t *n_store,
                        char *why, size_t why_size) {
    const bool hermes = family && !strcmp(family, "chatml"), llama3 = family && !strcmp(family, "llama3");
    const bool mistral = family && !strcmp(family, "mistral");
    if (!hermes && !llama3 && !mistral)
        return fail(why, why_size, "tool calling needs a chatml (Hermes, Qwen2.5), llama3 or mistral chat template; "
                    "this model's is %s", family ? family : "none");
    render r = {.out = calloc((size_t)n + 2, sizeof *r.out), .store = calloc((size_t)n + 2, sizeof *r.store)};
    bool ok = r.out && r.store;
    if (!ok) fail(why, why_size, "out of memory");
    if (ok) ok = hermes  ? render_hermes(&r, tools, num_tools, msgs, n, why, why_size)
                 : llama3 ? render_llama3(&r, tools, num_tools, msgs, n, why, why_size)
                          : render_mistral(&r, tools, num_tools, msgs, n, why, why_size);
    if (ok && r.oom) ok = fail(why, why_size, "out of memory rendering the tools");
    if (!ok) {
        for (int32_t i = 0; r.store && i < r.n_store; i++) free(r.store[i]);
        free(r.store);
        free(r.out);
        return false;
    }
    *out = r.out, *n_out = r.n, *store = r.store, *n_store = r.n_store;
    return true;
}

/* ------------------------------------------------------------ parsing */

static bool offered(const serve_tool *tools, int32_t n, const char *name) {
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(tools[i].name, name)) return true;
    return false;
}

/* One call from a JSON object: its name (an offered function) and its
 * arguments under args_key (or the other key), an object; NULL fields on
 * refusal. */
static bool call_from_json(const cJSON *o, const serve_tool *tools, int32_t nt, serve_tool_call *c) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(nm) || !offered(tools, nt, nm->valuestring)) return false;
    cJSON *parsed = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : NULL;
    const cJSON *args = parsed ? parsed : a;
    if (args && !cJSON_IsObject(args)) {
        cJSON_Delete(parsed);
        return false;
    }
    c->name = strdup(nm->valuestring);
    c->arguments = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    cJSON_Delete(parsed);
    return c->name && c->arguments;
}

/* A JSON object at text[*at..len), parsed (nesting within cJSON's limit);
 * *at moves past it. NULL when there is none. */
static cJSON *json_at(const char *text, size_t len, size_t *at) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text + *at, len - *at, &end, false);
    if (!o) return NULL;
    *at = (size_t)(end - text);
    return o;
}

static size_t skip_ws(const char *t, size_t len, size_t at) {
    while (at < len && is_ws(t[at])) at++;
    return at;
}

static const char *find(const char *t, size_t len, size_t from, const char *needle) {
    size_t n = strlen(needle);
    return from <= len ? memmem(t + from, len - from, needle, n) : NULL;
}

/* Hermes: text, then <tool_call> JSON </tool_call> blocks with only space
 * between them (the last may be cut off by max_tokens before its close). */
static int32_t parse_hermes(const serve_tool *tools, int32_t nt, const char *t, size_t len, serve_tool_call *calls,
                            int32_t max, size_t *content_len) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *first = find(t, len, 0, open);
    if (!first) return 0;
    size_t at = (size_t)(first - t);
    *content_len = at;
    while (*content_len > 0 && is_ws(t[*content_len - 1])) (*content_len)--;
    int32_t n = 0;
    while (at < len) {
        if (len - at < sizeof open - 1 || memcmp(t + at, open, sizeof open - 1) || n == max) goto refuse;
        at += sizeof open - 1;
        const char *c = find(t, len, at, close);
        size_t body_end = c ? (size_t)(c - t) : len;
        cJSON *o = json_at(t, body_end, &at);
        bool ok = o && call_from_json(o, tools, nt, &calls[n]);
        cJSON_Delete(o);
        n++; /* calls[n - 1] holds what it got, freed on refusal */
        if (!ok || skip_ws(t, body_end, at) != body_end) goto refuse;
        at = skip_ws(t, len, c ? body_end + sizeof close - 1 : len);
    }
    return n;
refuse:
    serve_tool_calls_free(calls, n);
    *content_len = len;
    return 0;
}

/* Llama 3.1: the whole answer is calls, JSON objects separated by ';',
 * after an optional <|python_tag|>. */
static int32_t parse_llama3(const serve_tool *tools, int32_t nt, const char *t, size_t len, serve_tool_call *calls,
                            int32_t max, size_t *content_len) {
    static const char tag[] = "<|python_tag|>";
    size_t at = skip_ws(t, len, 0);
    if (len - at >= sizeof tag - 1 && !memcmp(t + at, tag, sizeof tag - 1)) at = skip_ws(t, len, at + sizeof tag - 1);
    if (at == len || t[at] != '{') return 0;
    int32_t n = 0;
    while (at < len) {
        if (n == max || t[at] != '{') goto refuse;
        cJSON *o = json_at(t, len, &at);
        bool ok = o && call_from_json(o, tools, nt, &calls[n]);
        cJSON_Delete(o);
        n++;
        if (!ok) goto refuse;
        at = skip_ws(t, len, at);
        if (at < len && t[at] == ';') at = skip_ws(t, len, at + 1);
    }
    *content_len = 0;
    return n;
refuse:
    serve_tool_calls_free(calls, n);
    *content_len = len;
    return 0;
}

/* Mistral: a JSON list of {"name", "arguments"} (an "id" ignored), the
 * whole answer — or after a "[TOOL_CALLS]" the text spells out (its
 * control token leaves the text empty where it stood), with content
 * before it. */
static const char k_mistral_tag[] = "[TOOL_CALLS]";

static int32_t parse_mistral(const serve_tool *tools, int32_t nt, const char *t, size_t len, serve_tool_call *calls,
                             int32_t max, size_t *content_len) {
    const char *hit = find(t, len, 0, k_mistral_tag);
    size_t at = skip_ws(t, len, hit ? (size_t)(hit - t) + sizeof k_mistral_tag - 1 : 0);
    if (at == len || t[at] != '[') return 0;
    cJSON *a = json_at(t, len, &at);
    int32_t n = 0;
    const cJSON *e;
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) > 0 && cJSON_GetArraySize(a) <= max &&
              skip_ws(t, len, at) == len;
    if (ok) cJSON_ArrayForEach(e, a) {
            if (!(ok = call_from_json(e, tools, nt, &calls[n++]))) break;
        }
    cJSON_Delete(a);
    if (!ok) {
        serve_tool_calls_free(calls, n);
        return 0;
    }
    *content_len = hit ? (size_t)(hit - t) : 0;
    while (*content_len > 0 && is_ws(t[*content_len - 1])) (*content_len)--;
    return n;
}

int32_t serve_tool_calls_parse(const char *family, const serve_tool *tools, int32_t num_tools, const char *text,
                               size_t len, serve_tool_call *calls, int32_t max, size_t *content_len) {
    *content_len = len;
    if (!family || num_tools <= 0 || max <= 0) return 0;
    memset(calls, 0, (size_t)max * sizeof *calls);
    if (!strcmp(family, "chatml")) return parse_hermes(tools, num_tools, text, len, calls, max, content_len);
    if (!strcmp(family, "llama3")) return parse_llama3(tools, num_tools, text, len, calls, max, content_len);
    if (!strcmp(family, "mistral")) return parse_mistral(tools, num_tools, text, len, calls, max, content_len);
    return 0;
}

void serve_tool_calls_free(serve_tool_call *calls, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
        calls[i] = (serve_tool_call){0};
    }
}

/* The bytes before `tag` in text, or before a tail that may be its start. */
static size_t before_tag(const char *text, size_t len, const char *tag) {
    const char *hit = find(text, len, 0, tag);
    if (hit) return (size_t)(hit - text);
    for (size_t k = strlen(tag) - 1; k > 0; k--)
        if (len >= k && !memcmp(text + len - k, tag, k)) return len - k;
    return len;
}

size_t serve_tool_stream_safe(const char *family, const char *text, size_t len) {
    const bool llama3 = family && !strcmp(family, "llama3"), mistral = family && !strcmp(family, "mistral");
    if (llama3 || mistral) {
        size_t at = skip_ws(text, len, 0);
        if (at == len || text[at] == (llama3 ? '{' : '[') || (llama3 && text[at] == '<')) return 0;
        return llama3 ? len : before_tag(text, len, k_mistral_tag);
    }
    return before_tag(text, len, "<tool_call>");
}

/* ----------------------------------------------- forced calls (tool_choice) */

static const serve_tool *tool_named(const serve_tool *tools, int32_t n, const char *name) {
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(tools[i].name, name)) return &tools[i];
    return NULL;
}

/* A function's parameter schema, or an object with no properties. A new
 * item (a copy), or NULL when out of memory. */
static cJSON *params_schema(const serve_tool *t) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t->def, "function");
    const cJSON *p = f ? cJSON_GetObjectItemCaseSensitive(f, "parameters") : NULL;
    if (p) return cJSON_Duplicate(p, true);
    cJSON *o = cJSON_CreateObject();
    if (!cJSON_AddStringToObject(o, "type", "object") || !cJSON_AddObjectToObject(o, "properties") ||
        !cJSON_AddFalseToObject(o, "additionalProperties")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* {"type": "object", "properties": {"name": {"const": NAME}, "parameters":
 * P}, "required": [...], "additionalProperties": false} */
static cJSON *call_schema(const serve_tool *t) {
    cJSON *o = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(o, "properties");
    cJSON *name = cJSON_AddObjectToObject(props, "name"), *p = params_schema(t);
    const char *req[] = {"name", "parameters"};
    bool ok = cJSON_AddStringToObject(o, "type", "object") && name && cJSON_AddStringToObject(name, "const", t->name) &&
              p && cJSON_AddItemToObject(props, "parameters", p) &&
              cJSON_AddItemToObject(o, "required", cJSON_CreateStringArray(req, 2)) &&
              cJSON_AddFalseToObject(o, "additionalProperties");
    if (!ok && p && !cJSON_GetObjectItemCaseSensitive(props, "parameters")) cJSON_Delete(p);
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

static cJSON *required_schema(const serve_tool *tools, int32_t n, int32_t max_calls) {
    cJSON *o = cJSON_CreateObject(), *items = cJSON_AddObjectToObject(o, "items");
    cJSON *any = cJSON_AddArrayToObject(items, "anyOf");
    bool ok = cJSON_AddStringToObject(o, "type", "array") && cJSON_AddNumberToObject(o, "minItems", 1) &&
              cJSON_AddNumberToObject(o, "maxItems", max_calls) && any;
    for (int32_t i = 0; ok && i < n; i++) {
        cJSON *c = call_schema(&tools[i]);
        ok = c && cJSON_AddItemToArray(any, c);
        if (!ok) cJSON_Delete(c);
    }
    if (!ok) cJSON_Delete(o);
    return ok ? o : NULL;
}

char *serve_tool_forced_schema(const serve_tool *tools, int32_t num_tools, const char *named, int32_t max_calls) {
    const serve_tool *t = named ? tool_named(tools, num_tools, named) : NULL;
    if (named && !t) return NULL;
    cJSON *s = named ? params_schema(t) : required_schema(tools, num_tools, max_calls);
    char *text = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    return text;
}

int32_t serve_tool_forced_parse(const serve_tool *tools, int32_t num_tools, const char *named, const char *text,
                                size_t len, serve_tool_call *calls, int32_t max) {
    if (max <= 0) return 0;
    memset(calls, 0, (size_t)max * sizeof *calls);
    if (named) {
        calls[0].name = strdup(named);
        calls[0].arguments = strndup(text, len);
        if (calls[0].name && calls[0].arguments) return 1;
        serve_tool_calls_free(calls, 1);
        return 0;
    }
    size_t at = skip_ws(text, len, 0);
    cJSON *a = at < len && text[at] == '[' ? json_at(text, len, &at) : NULL;
    int32_t n = 0;
    const cJSON *e;
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) > 0 && cJSON_GetArraySize(a) <= max &&
              skip_ws(text, len, at) == len;
    if (ok) cJSON_ArrayForEach(e, a) {
            if (!(ok = call_from_json(e, tools, num_tools, &calls[n++]))) break;
        }
    cJSON_Delete(a);
    if (ok) return n;
    serve_tool_calls_free(calls, n);
    return 0;
}
