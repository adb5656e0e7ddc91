/*
 * core/tokenizer/chat.c — chat templates without a Jinja engine: the family
 * is recognised from the template text (or the vocabulary) and rendered by
 * hand, reproducing what the Hugging Face templates print:
 *   ChatML   <|im_start|>{role}\n{content}<|im_end|>\n ... (SmolLM2, Qwen);
 *            the template's own default system prompt is added when the
 *            conversation does not start with one, as those templates do.
 *   Llama 3  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n
 *            {content|trim}<|eot_id|> ...
 *   Llama 2  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
 *            and its Mistral variant <s>[INST] {user} [/INST]{assistant}</s>
 *            (chosen when the template has [INST] but no <<SYS>>), which
 *            also writes Mistral's tool turns (tokenizer v3, as
 *            mistral-common encodes them) from three roles whose content
 *            is the JSON text: "available_tools" [AVAILABLE_TOOLS] {json}
 *            [/AVAILABLE_TOOLS] just before a user turn, "tool_calls" an
 *            assistant turn [TOOL_CALLS] {json}</s>, "tool_results"
 *            [TOOL_RESULTS] {json}[/TOOL_RESULTS] after the calls (the
 *            space before the JSON only for a SentencePiece vocabulary,
 *            where mistral-common's encoding of the JSON starts with one).
 *   Gemma    <bos><start_of_turn>user\n{system\n\n}{content|trim}<end_of_turn>\n
 *            <start_of_turn>model\n{content|trim}<end_of_turn>\n ... (the
 *            assistant's role is "model"; a system message opens the first
 *            user turn). Also chosen for a vocabulary with <start_of_turn>
 *            when the file has no template (Gemma 3 GGUFs carry none).
 * loom_chat_encode() also records where roles and contents were written, so
 * special-token text inside a message stays ordinary text: a message cannot
 * close its turn and forge another.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

loom_chat_format tok_detect_chat_format(const loom_tokenizer *t) {
    const char *tmpl = t->chat_template;
    if (tmpl) {
        if (strstr(tmpl, "<|im_start|>")) return LOOM_CHAT_CHATML;
        if (strstr(tmpl, "<|start_header_id|>")) return LOOM_CHAT_LLAMA3;
        if (strstr(tmpl, "[INST]")) return LOOM_CHAT_LLAMA2;
        if (strstr(tmpl, "<start_of_turn>")) return LOOM_CHAT_GEMMA;
    }
    if (loom_tokenizer_find(t, "<|im_start|>") >= 0) return LOOM_CHAT_CHATML;
    if (loom_tokenizer_find(t, "<|start_header_id|>") >= 0) return LOOM_CHAT_LLAMA3;
    if (loom_tokenizer_find(t, "<start_of_turn>") >= 0) return LOOM_CHAT_GEMMA;
    if (t->kind == TOK_SPM) return LOOM_CHAT_LLAMA2;
    return LOOM_CHAT_AUTO;
}

loom_chat_format loom_tokenizer_chat_format(const loom_tokenizer *t) {
    return t ? t->chat_fmt : LOOM_CHAT_AUTO;
}

const char *loom_chat_format_name(loom_chat_format fmt) {
    switch (fmt) {
    case LOOM_CHAT_AUTO: return "auto";
    case LOOM_CHAT_CHATML: return "chatml";
    case LOOM_CHAT_LLAMA3: return "llama3";
    case LOOM_CHAT_LLAMA2: return "llama2";
    case LOOM_CHAT_GEMMA: return "gemma";
    }
    return "?";
}

/* The literal default system prompt of a ChatML template:
 * '<|im_start|>system\n' TEXT '<|im_end|>' inside one string literal, with
 * \n either a real newline or the two characters backslash-n. Returns a
 * malloc'd copy or NULL. Linear in the template's length: the template
 * comes from a file (tokenizer_config.json, up to 64 MiB), and the first
 * <|im_end|> after a head is shared by every head before it, so it is
 * searched for once per stretch, not once per head. */
static char *chatml_default_system(const char *tmpl) {
    static const char head[] = "<|im_start|>system";
    const char *p = tmpl, *end = NULL; /* the first <|im_end|> after the last head searched from */
    bool searched = false;
    while (tmpl && (p = strstr(p, head)) != NULL) {
        p += sizeof head - 1;
        const char *q = p;
        if (*q == '\n') q++;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        if (!searched || (end && end < q)) {
            end = strstr(q, "<|im_end|>");
            searched = true;
        }
        if (!end) return NULL; /* none after this head: none after any later one */
        if (end == q) continue;
        bool clean = true; /* stops at the first unclean byte: a later head's '<' at the latest */
        for (const char *c = q; c < end && clean; c++)
            clean = !(*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '<' || *c == '\\');
        if (!clean) continue;
        return loom_strndup(q, (size_t)(end - q));
    }
    return NULL;
}

static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Append s with leading and trailing whitespace removed (Jinja trim/strip). */
static void put_trimmed(tok_buf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && ws(s[i])) i++;
    while (n > i && ws(s[n - 1])) n--;
    tok_buf_put(b, s + i, n - i);
}

/* Where the caller's text (roles, contents) sits in the rendered string;
 * NULL when not recorded (loom_chat_apply). */
typedef struct chat_spans {
    tok_span *v;
    size_t n, cap;
    bool oom;
} chat_spans;

static void span_add(chat_spans *sp, size_t start, size_t end) {
    if (!sp || end <= start) return;
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? sp->cap * 2 : 16;
        tok_span *v = realloc(sp->v, cap * sizeof *v);
        if (!v) { sp->oom = true; return; }
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = (tok_span){start, end};
}

/* Append the caller's text s (trimmed when asked), recording its span. */
static void put_user(tok_buf *b, chat_spans *sp, const char *s, bool trim) {
    size_t start = b->n;
    if (trim) put_trimmed(b, s);
    else tok_buf_puts(b, s);
    span_add(sp, start, b->n);
}

static const char *special_text(const loom_tokenizer *t, int32_t id, const char *dflt) {
    const char *s = (t && id >= 0) ? loom_tokenizer_token_text(t, id) : NULL;
    return s && *s ? s : dflt;
}

bool tok_chat_mistral(const loom_tokenizer *t) {
    return t && t->chat_template && strstr(t->chat_template, "[INST]") && !strstr(t->chat_template, "<<SYS>>");
}

/* Mistral's tool roles and the control tokens around each. None counts
 * in the user/assistant alternation: calls and their results sit where the
 * assistant's turn is, which its answer (or the next user turn) ends. */
static const struct {
    const char *role, *open, *close;
} k_mistral_tool_roles[] = {
    {"available_tools", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"},
    {"tool_calls", "[TOOL_CALLS]", NULL}, /* closed by </s> */
    {"tool_results", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"},
};

static int mistral_tool_role(const char *role) {
    for (int r = 0; r < 3; r++)
        if (!strcmp(role, k_mistral_tool_roles[r].role)) return r;
    return -1;
}

/* Message i in a Mistral tool role (tr) checked against its neighbours
 * and written; k counts the user/assistant turns before it. */
static loom_status render_mistral_tool(const loom_tokenizer *t, const loom_chat_msg *msgs, int32_t n, int32_t i,
                                       int tr, const char *eos, int32_t k, tok_buf *b, chat_spans *sp,
                                       loom_error *err) {
    const char *prev = i > 0 ? msgs[i - 1].role : "";
    bool ok = tr == 0   ? i + 1 < n && !strcmp(msgs[i + 1].role, "user")
              : tr == 1 ? k % 2 == 1
                        : !strcmp(prev, "tool_calls") || !strcmp(prev, "tool_results");
    if (!ok)
        return loom_error_set(err, LOOM_ERR_INVALID, "chat (mistral): message %d ('%s') must %s", (int)i,
                              msgs[i].role,
                              tr == 0   ? "come just before a user message"
                              : tr == 1 ? "take an assistant turn (after a user message)"
                                        : "follow the assistant's tool_calls or another tool_results");
    if (tr == 2 && loom_tokenizer_find(t, "[TOOL_CONTENT]") >= 0)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "chat (mistral): this vocabulary writes tool results "
                              "with [TOOL_CONTENT] (tokenizer v7 and later), which loom does not render");
    tok_buf_puts(b, k_mistral_tool_roles[tr].open);
    if (t && t->kind == TOK_SPM) tok_buf_puts(b, " ");
    put_user(b, sp, msgs[i].content, false);
    tok_buf_puts(b, k_mistral_tool_roles[tr].close ? k_mistral_tool_roles[tr].close : eos);
    return LOOM_OK;
}

static loom_status render_llama2(const loom_tokenizer *t, const loom_chat_msg *msgs, int32_t n,
                                 tok_buf *b, chat_spans *sp, loom_error *err) {
    bool spm = t && t->kind == TOK_SPM; /* else the markers are not this vocabulary's */
    const char *bos = special_text(t, spm ? t->bos : -1, "<s>");
    const char *eos = special_text(t, spm ? t->eos : -1, "</s>");
    bool mistral = tok_chat_mistral(t);
    const char *sys = NULL;
    int32_t first = 0;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
        sys = msgs[0].content;
        first = 1;
    }
    if (mistral) tok_buf_puts(b, bos);
    int32_t k = 0; /* user and assistant turns so far */
    for (int32_t i = first; i < n; i++, k++) {
        int tr = mistral ? mistral_tool_role(msgs[i].role) : -1;
        if (tr >= 0) {
            loom_status st = render_mistral_tool(t, msgs, n, i, tr, eos, k, b, sp, err);
            if (st) return st;
            k--; /* not a turn of the alternation */
            continue;
        }
        bool user = strcmp(msgs[i].role, "user") == 0;
        if (user && k % 2 == 1 && i > 0 && !strcmp(msgs[i - 1].role, "tool_results")) k++; /* the results ended it */
        if (!user && strcmp(msgs[i].role, "assistant") != 0)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "chat (%s): message %d has role '%s'; only a leading "
                                  "'system', then 'user'/'assistant' are allowed%s",
                                  mistral ? "mistral" : "llama2", (int)i, msgs[i].role,
                                  mistral ? " (and the tool roles available_tools, tool_calls, tool_results)" : "");
        if (user != (k % 2 == 0))
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "chat (llama2): roles must alternate user/assistant/user/... "
                                  "(message %d is '%s')",
                                  (int)i, msgs[i].role);
        if (mistral) {
            if (user) {
                tok_buf_puts(b, "[INST] ");
                if (k == 0 && sys) { put_user(b, sp, sys, false); tok_buf_puts(b, "\n\n"); }
                put_user(b, sp, msgs[i].content, false);
                tok_buf_puts(b, " [/INST]");
            } else {
                put_user(b, sp, msgs[i].content, false);
                tok_buf_puts(b, eos);
            }
            continue;
        }
        /* Llama 2: the system block is part of the first user turn, stripped with it. */
        tok_buf content = {0};
        tok_buf_puts(&content, "");
        if (k == 0 && sys) {
            tok_buf_puts(&content, "<<SYS>>\n");
            tok_buf_puts(&content, sys);
            tok_buf_puts(&content, "\n<</SYS>>\n\n");
        }
        tok_buf_puts(&content, msgs[i].content);
        if (content.oom) { free(content.p); b->oom = true; return LOOM_OK; }
        if (user) {
            tok_buf_puts(b, bos);
            tok_buf_puts(b, "[INST] ");
            put_user(b, sp, content.p, true); /* <<SYS>> is plain text, not a special token */
            tok_buf_puts(b, " [/INST]");
        } else {
            tok_buf_puts(b, " ");
            put_user(b, sp, content.p, true);
            tok_buf_puts(b, " ");
            tok_buf_puts(b, eos);
        }
        free(content.p);
    }
    return LOOM_OK;
}

/* Check the messages and pick the format (AUTO: detected, else ChatML). */
static loom_status chat_check(const loom_tokenizer *t, loom_chat_format *fmt, const loom_chat_msg *msgs,
                              int32_t n, loom_error *err) {
    if (n < 0 || (n > 0 && !msgs)) return loom_error_set(err, LOOM_ERR_INVALID, "chat: bad message list");
    for (int32_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return loom_error_set(err, LOOM_ERR_INVALID, "chat: message %d has no %s", (int)i,
                                  msgs[i].role ? "content" : "role");
    if (*fmt == LOOM_CHAT_AUTO) *fmt = t ? t->chat_fmt : LOOM_CHAT_AUTO;
    if (*fmt == LOOM_CHAT_AUTO) {
        loom_log(LOOM_LOG_INFO, "chat", "no chat template recognised; using ChatML");
        *fmt = LOOM_CHAT_CHATML;
    }
    return LOOM_OK;
}

static void render_chatml(const loom_tokenizer *t, const loom_chat_msg *msgs, int32_t n, bool add_generation_prompt,
                          tok_buf *b, chat_spans *sp) {
    if (n > 0 && strcmp(msgs[0].role, "system") != 0) {
        char *sys = chatml_default_system(t ? t->chat_template : NULL);
        if (sys) { /* the template's own text */
            tok_buf_puts(b, "<|im_start|>system\n");
            tok_buf_puts(b, sys);
            tok_buf_puts(b, "<|im_end|>\n");
            free(sys);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        tok_buf_puts(b, "<|im_start|>");
        put_user(b, sp, msgs[i].role, false);
        tok_buf_puts(b, "\n");
        put_user(b, sp, msgs[i].content, false);
        tok_buf_puts(b, "<|im_end|>\n");
    }
    if (add_generation_prompt) tok_buf_puts(b, "<|im_start|>assistant\n");
}

static void render_llama3(const loom_chat_msg *msgs, int32_t n, bool add_generation_prompt, tok_buf *b,
                          chat_spans *sp) {
    tok_buf_puts(b, "<|begin_of_text|>");
    for (int32_t i = 0; i < n; i++) {
        tok_buf_puts(b, "<|start_header_id|>");
        put_user(b, sp, msgs[i].role, false);
        tok_buf_puts(b, "<|end_header_id|>\n\n");
        put_user(b, sp, msgs[i].content, true);
        tok_buf_puts(b, "<|eot_id|>");
    }
    if (add_generation_prompt) tok_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma's template: roles alternate user/model after an optional system
 * message, which is written at the start of the first user turn. */
static loom_status render_gemma(const loom_tokenizer *t, const loom_chat_msg *msgs, int32_t n,
                                bool add_generation_prompt, tok_buf *b, chat_spans *sp, loom_error *err) {
    const bool spm = t && t->kind == TOK_SPM; /* else the marker is not this vocabulary's */
    tok_buf_puts(b, special_text(t, spm ? t->bos : -1, "<bos>"));
    int32_t first = n > 0 && strcmp(msgs[0].role, "system") == 0;
    for (int32_t i = first; i < n; i++) {
        bool user = strcmp(msgs[i].role, "user") == 0;
        if ((!user && strcmp(msgs[i].role, "assistant") != 0) || user != ((i - first) % 2 == 0))
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "chat (gemma): message %d has role '%s'; after an optional 'system', "
                                  "roles must alternate user/assistant/user/...",
                                  (int)i, msgs[i].role);
        tok_buf_puts(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == first && first) {
            put_user(b, sp, msgs[0].content, false);
            tok_buf_puts(b, "\n\n");
        }
        put_user(b, sp, msgs[i].content, true);
        tok_buf_puts(b, "<end_of_turn>\n");
    }
    if (add_generation_prompt) tok_buf_puts(b, "<start_of_turn>model\n");
    return LOOM_OK;
}

/* Render into *b (NUL-terminated on success), recording the caller's text in sp. */
static loom_status chat_render(const loom_tokenizer *t, loom_chat_format fmt, const loom_chat_msg *msgs,
                               int32_t n, bool add_generation_prompt, tok_buf *b, chat_spans *sp,
                               loom_error *err) {
    loom_status st = chat_check(t, &fmt, msgs, n, err);
    if (st) return st;
    tok_buf_puts(b, "");
    switch (fmt) {
    case LOOM_CHAT_CHATML: render_chatml(t, msgs, n, add_generation_prompt, b, sp); break;
    case LOOM_CHAT_LLAMA3: render_llama3(msgs, n, add_generation_prompt, b, sp); break;
    case LOOM_CHAT_LLAMA2: st = render_llama2(t, msgs, n, b, sp, err); break;
    case LOOM_CHAT_GEMMA: st = render_gemma(t, msgs, n, add_generation_prompt, b, sp, err); break;
    default: st = loom_error_set(err, LOOM_ERR_INVALID, "chat: unknown format %d", (int)fmt); break;
    }
    if (!st && (b->oom || (sp && sp->oom))) st = loom_error_set(err, LOOM_ERR_NOMEM, "chat: out of memory");
    return st;
}

loom_status loom_chat_apply(const loom_tokenizer *t, loom_chat_format fmt,
                            const loom_chat_msg *msgs, int32_t n, bool add_generation_prompt,
                            char **out, loom_error *err) {
    if (!out) return loom_error_set(err, LOOM_ERR_INVALID, "chat: NULL output");
    *out = NULL;
    tok_buf b = {0};
    loom_status st = chat_render(t, fmt, msgs, n, add_generation_prompt, &b, NULL, err);
    if (st) {
        free(b.p);
        return st;
    }
    *out = b.p;
    return LOOM_OK;
}

loom_status loom_chat_encode(const loom_tokenizer *t, loom_chat_format fmt, const loom_chat_msg *msgs,
                             int32_t n, bool add_generation_prompt, int32_t **ids, int32_t *n_ids,
                             loom_error *err) {
    if (!ids || !n_ids) return loom_error_set(err, LOOM_ERR_INVALID, "chat: NULL output");
    *ids = NULL;
    *n_ids = 0;
    if (!t) return loom_error_set(err, LOOM_ERR_INVALID, "chat: encoding needs a tokenizer");
    tok_buf b = {0};
    chat_spans sp = {0};
    loom_status st = chat_render(t, fmt, msgs, n, add_generation_prompt, &b, &sp, err);
    if (!st) st = tok_encode_spans(t, b.p, b.n, false, true, sp.v, sp.n, ids, n_ids, err);
    free(b.p);
    free(sp.v);
    return st;
}
