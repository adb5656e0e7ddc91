/*
 * cli/serve/server.c — `loom serve`'s HTTP server and engine thread (see
 * server.h). Routes:
 *   GET  /health               200 {"status":"ok"}, 503 after an engine failure
 *   GET  /v1/models            the one model served
 *   GET  /v1/models/{id}       that model, or 404
 *   GET  /metrics              Prometheus text: queue, KV blocks, tokens
 *   POST /v1/completions       text or token prompts (several: the batch form)
 *   POST /v1/chat/completions  a conversation through the model's chat template
 *   POST /tokenize             vLLM's: text or messages to the prompt's token ids
 *   POST /detokenize           vLLM's: token ids to text
 * Both completion POSTs stream as server-sent events with "stream": true.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* POLLRDHUP */
#endif
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "commands.h" /* cli_now */
#include "disagg/disagg.h"
#include "openai.h"
#include "tokenizer/tokenizer.h" /* loom_utf8_next */

/* MHD's polling threads (each runs epoll over its share of the
 * connections; handlers never wait on the engine in them). */
#define SERVE_HTTP_THREADS 4

/* ------------------------------------------------------------ buffers */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static bool sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

/* --------------------------------------------------------------- state */

typedef struct server server;
typedef struct job job;

/* One choice of a response: prompt p, sample k is choice p * n + k. */
typedef struct choice {
    sbuf text;
    loom_finish_reason finish;
    int32_t tokens;           /* completion tokens                        */
    bool started;             /* chat stream: the role delta was sent     */
    bool echoed;              /* echo: the prompt went before the text    */
    size_t streamed;          /* tools: bytes of text sent as content     */
    serve_tool_call *calls;   /* tools: the calls read from the answer    */
    int32_t ncalls;
    size_t content_len;       /* tools: bytes of text before the calls    */
    cJSON *lp;                /* chat: logprobs.content entries; completions: the logprobs object */
    size_t lp_offset;         /* completions: text_offset of the next token */
    double t_last;            /* when its last token came (0: none yet)   */
} choice;

/* One engine request (one prompt of the HTTP request). */
typedef struct prompt_ctx {
    job *j;
    int32_t p;
    int64_t id;               /* engine request id, -1 before it is added */
    int32_t live;             /* samples without their final event        */
    int32_t prompt_tokens;
    int32_t cached_tokens;    /* of prompt_tokens, served by the prefix cache */
} prompt_ctx;

struct job {
    server *s;
    pthread_mutex_t mu;
    int refs;                 /* the connection + each live engine request */
    serve_req q;
    char id[48];
    long long created;
    int32_t n, nchoices, live;
    choice *ch;
    prompt_ctx *pc;
    char error[512];          /* a sample ended with LOOM_FINISH_ERROR     */
    sbuf sse;                 /* stream: events not yet read by MHD        */
    size_t sse_off;
    bool sse_done;
    double t0;
    int fd;                   /* the client's socket, to notice it leaving (-1: none yet) */
    char url[32];             /* one of the two routes                     */
    const char *tool_family;  /* chat with tools offered: the template family; else NULL */
    /* The connection waits suspended (no pool thread held) until there is
     * something to send; whoever has that marks it resumed under j->mu
     * (job_take_resume: once) and resumes it after unlocking. */
    struct MHD_Connection *conn;
    bool suspended;
    double suspended_at;      /* stream: when it went quiet (keep-alives)  */
    bool client_left;         /* the watcher saw the client's socket close */
    job *prev, *next;         /* the server's list of jobs in flight       */
};

/* A Prometheus histogram of seconds: counts per upper bound (cumulative
 * when printed), their sum and count. */
#define HIST_MAX_BOUNDS 24
typedef struct hist {
    const double *le;         /* ascending upper bounds, nle of them (+Inf implied) */
    int nle;
    uint64_t n[HIST_MAX_BOUNDS + 1];
    uint64_t count;
    double sum;
} hist;

/* vLLM's bucket bounds for the same three histograms (its names are
 * vllm:..., these loom_...), so the two engines' quantiles line up. */
static const double k_ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                   1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double k_tpot_le[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                   1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
static const double k_e2e_le[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                  40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define HIST_NLE(b) ((int)(sizeof(b) / sizeof *(b)))
#define HIST_OF(b) ((hist){.le = (b), .nle = HIST_NLE(b)})
_Static_assert(HIST_NLE(k_ttft_le) <= HIST_MAX_BOUNDS && HIST_NLE(k_tpot_le) <= HIST_MAX_BOUNDS &&
                   HIST_NLE(k_e2e_le) <= HIST_MAX_BOUNDS,
               "a histogram with more bounds than HIST_MAX_BOUNDS");

static void hist_add(hist *h, double v) {
    int i = 0;
    while (i < h->nle && v > h->le[i]) i++;
    h->n[i]++, h->count++, h->sum += v;
}

/* Latency metrics, filled by the engine thread as tokens arrive; their own
 * lock, taken last (under a job's), never holding another. */
typedef struct serve_metrics {
    pthread_mutex_t mu;
    hist ttft, tpot, e2e;     /* seconds: to the first token, between tokens, to a completed end; per sample */
    uint64_t finished[6];     /* samples ended, by loom_finish_reason (NONE unused) */
} serve_metrics;

struct server {
    loom_engine *eng;
    const serve_options *opt;
    const char *model;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending;             /* requests or aborts posted since the last step */
    bool busy;                /* the last step left requests active        */
    bool exit;                /* engine thread: return once idle           */
    bool stopping;            /* shutting down: new requests get 503       */
    atomic_bool shutting;     /* as `stopping`, read without s->mu: waiting
                               * connections answer 503 at once            */
    char fatal[512];          /* the engine failed: every request gets 500 */
    job *jobs;
    loom_engine_stats stats;  /* snapshot after each step                  */
    uint64_t http_requests[6];/* by status class: 1xx..5xx (index 1..5)    */
    uint64_t client_closed;   /* 499: the client left before its answer    */
    uint64_t next_id;
    int inflight;             /* HTTP requests between headers and sent reply */
    pthread_cond_t idle_cv;   /* signalled when inflight drops to 0        */
    serve_metrics m;
    size_t prompt_cap;        /* prompt text bytes: more is refused untokenized */
    bool watch_exit;          /* the watcher thread returns (under mu)     */
    pthread_cond_t watch_cv;
    pthread_t watcher;
    /* Connections taken for resuming (job_take_resume) and not resumed yet:
     * the shutdown waits for 0 before MHD_stop_daemon, so no thread resumes
     * a connection the stop is closing, and none is left suspended (MHD
     * refuses to stop with one). */
    atomic_int resuming;
    loom_disagg *dg;          /* --role prefill / decode, else NULL        */
};

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    for (int32_t c = 0; c < j->nchoices; c++) {
        free(j->ch[c].text.p);
        cJSON_Delete(j->ch[c].lp);
        serve_tool_calls_free(j->ch[c].calls, j->ch[c].ncalls);
        free(j->ch[c].calls);
    }
    free(j->ch);
    free(j->pc);
    free(j->sse.p);
    serve_req_free(&j->q);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Abort every engine request of j that is still running. Caller holds s->mu
 * (ids are written under it). */
static void job_abort_locked(job *j) {
    for (int32_t p = 0; p < j->q.num_prompts; p++)
        if (j->pc[p].id >= 0) loom_engine_abort(j->s->eng, j->pc[p].id);
    j->s->pending = true;
    pthread_cond_signal(&j->s->cv);
}

static void job_unlist(job *j) {
    server *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (j->prev) j->prev->next = j->next;
    else if (s->jobs == j) s->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    j->prev = j->next = NULL;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------ JSON pieces */

/* usage, with OpenAI's prompt_tokens_details.cached_tokens: the prompt
 * tokens the prefix cache served instead of computing them. */
static cJSON *usage_json(const job *j) {
    int32_t prompt = 0, completion = 0, cached = 0;
    for (int32_t p = 0; p < j->q.num_prompts; p++) prompt += j->pc[p].prompt_tokens, cached += j->pc[p].cached_tokens;
    for (int32_t c = 0; c < j->nchoices; c++) completion += j->ch[c].tokens;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", cached);
    return u;
}

static cJSON *response_head(const job *j, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model);
    return o;
}

/* A token as logprobs report it (engine thread: the tokenizer is its): its
 * vocabulary piece (loom_engine_token_piece: a SentencePiece piece keeps its
 * leading space) as text — bytes that are not valid UTF-8 (part of a
 * character split across tokens) and NUL become U+FFFD, so the JSON stays
 * valid — and, when `bytes` is given, the piece's raw bytes for the chat
 * API's "bytes" (which put split characters back together). Without a
 * tokenizer (dummy weights): "token_id:N". *nbytes (when given): how many
 * bytes the token adds to the generated text. NULL when out of memory. */
static char *token_text(server *s, int32_t id, cJSON **bytes, size_t *nbytes) {
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)loom_engine_token_piece(s->eng, id, &n);
    char b[32];
    if (!p) { /* no tokenizer (dummy weights): the id, as text and bytes */
        snprintf(b, sizeof b, "token_id:%d", id);
        p = (const unsigned char *)b, n = strlen(b);
    }
    if (nbytes) *nbytes = n;
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; *bytes && i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber(p[i]));
    }
    char *t = malloc(3 * n + 1), *w = t;
    if (!t) return NULL;
    for (size_t i = 0, adv; i < n;) {
        if (p[i] && loom_utf8_next(p + i, n - i, &adv) == 1) memcpy(w, p + i, adv), w += adv, i += adv;
        else memcpy(w, "\xEF\xBF\xBD", 3), w += 3, i++; /* a byte that starts no valid character */
    }
    *w = 0;
    return t;
}

/* This token's logprobs in the API's shape; NULL when not asked for. For
 * chat: one logprobs.content entry; for completions: {"tokens": [t], ...}
 * to be merged into the choice's arrays. */
static cJSON *token_logprobs(job *j, const loom_token_event *ev) {
    if (j->q.logprobs < 0 || ev->token < 0) return NULL;
    server *s = j->s;
    int32_t ntop = ev->num_top < j->q.logprobs ? ev->num_top : j->q.logprobs;
    cJSON *tb = NULL;
    size_t tn = 0;
    char *t = token_text(s, ev->token, j->q.api == SERVE_CHAT ? &tb : NULL, &tn);
    if (!t) {
        cJSON_Delete(tb);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (j->q.api == SERVE_CHAT) {
        cJSON_AddStringToObject(o, "token", t);
        cJSON_AddNumberToObject(o, "logprob", ev->logprob);
        cJSON_AddItemToObject(o, "bytes", tb);
        cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
        for (int32_t i = 0; i < ntop; i++) {
            cJSON *ab = NULL;
            char *a = token_text(s, ev->top_ids[i], &ab, NULL);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", a ? a : "");
            cJSON_AddNumberToObject(e, "logprob", ev->top_logprobs[i]);
            cJSON_AddItemToObject(e, "bytes", ab);
            cJSON_AddItemToArray(top, e);
            free(a);
        }
    } else {
        cJSON_AddItemToObject(o, "tokens", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "tokens"), cJSON_CreateString(t));
        cJSON_AddItemToObject(o, "token_logprobs", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int32_t i = 0; i < ntop; i++) {
            char *a = token_text(s, ev->top_ids[i], NULL, NULL);
            if (a && !cJSON_GetObjectItemCaseSensitive(top, a)) cJSON_AddNumberToObject(top, a, ev->top_logprobs[i]);
            free(a);
        }
        cJSON_AddItemToObject(o, "top_logprobs", cJSON_CreateArray());
        cJSON_AddItemToArray(cJSON_GetObjectItem(o, "top_logprobs"), top);
        cJSON_AddItemToObject(o, "text_offset", cJSON_CreateArray());
        /* byte offsets into the UTF-8 text: the piece's bytes, not its
         * printable form (3 bytes of U+FFFD per byte of a split character) */
        cJSON_AddNumberToObject(o, "len", (double)tn); /* consumed by the caller */
    }
    free(t);
    return o;
}

/* Completions' logprobs object with its four arrays, empty. */
static cJSON *completions_lp_new(void) {
    cJSON *lp = cJSON_CreateObject();
    const char *k[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int i = 0; i < 4; i++) cJSON_AddItemToObject(lp, k[i], cJSON_CreateArray());
    return lp;
}

/* Completions: append one token's arrays (from token_logprobs) to the
 * choice's logprobs object. */
static void completions_lp_merge(choice *ch, cJSON *one) {
    if (!ch->lp) ch->lp = completions_lp_new();
    const char *k[] = {"tokens", "token_logprobs", "top_logprobs"};
    for (int i = 0; i < 3; i++) {
        cJSON *src = cJSON_GetObjectItem(one, k[i]);
        cJSON *item = cJSON_DetachItemFromArray(src, 0);
        cJSON_AddItemToArray(cJSON_GetObjectItem(ch->lp, k[i]), item);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(ch->lp, "text_offset"), cJSON_CreateNumber((double)ch->lp_offset));
    ch->lp_offset += (size_t)cJSON_GetObjectItem(one, "len")->valuedouble;
}

/* ---------------------------------------------------------------- echo */

static void sse_put_json(job *j, cJSON *o);

/* The prompt a completions choice echoes, built on the engine thread from
 * the choice's first event: its text (as sent, or the token-id prompt
 * decoded) and, with logprobs, its tokens' logprobs in the completions
 * shape — the first token's logprob and alternatives null, as vLLM has them
 * (nothing comes before it). */
typedef struct echo_part {
    bool ready;
    const char *text;
    size_t len;
    char *owned;              /* text, when decoded here                  */
    cJSON *lp;                /* completions logprobs object, or NULL     */
} echo_part;

/* One prompt token's logprob entries appended to the four arrays of lp;
 * *offset advances by the token's bytes. */
static void echo_lp_token(server *s, cJSON *lp, const loom_token_event *ev, int32_t i, int32_t ntop, size_t *offset) {
    size_t n = 0;
    char *t = token_text(s, ev->prompt_token_ids[i], NULL, &n);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(t ? t : ""));
    free(t);
    const float v = ev->prompt_logprobs[i];
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"),
                         i == 0 || v != v ? cJSON_CreateNull() : cJSON_CreateNumber(v));
    cJSON *top = i == 0 ? cJSON_CreateNull() : cJSON_CreateObject();
    for (int32_t k = 0; i > 0 && k < ntop; k++) {
        char *a = token_text(s, ev->prompt_top_ids[(size_t)i * ev->prompt_num_top + k], NULL, NULL);
        if (a && !cJSON_GetObjectItemCaseSensitive(top, a))
            cJSON_AddNumberToObject(top, a, ev->prompt_top_logprobs[(size_t)i * ev->prompt_num_top + k]);
        free(a);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)*offset));
    *offset += n;
}

static void echo_build(job *j, const prompt_ctx *pc, const loom_token_event *ev, echo_part *ep) {
    const serve_prompt *p = &j->q.prompts[pc->p];
    *ep = (echo_part){.ready = true, .text = p->text ? p->text : "", .len = p->text ? strlen(p->text) : 0};
    loom_error err = {0};
    if (!p->text && loom_engine_detokenize_bytes(j->s->eng, p->tokens, p->num_tokens, &ep->owned, &ep->len, &err) ==
                        LOOM_OK)
        ep->text = ep->owned;
    if (j->q.logprobs < 0 || !LOOM_HAS_FIELD(ev, loom_token_event, prompt_top_logprobs) || !ev->prompt_logprobs)
        return;
    ep->lp = completions_lp_new();
    const int32_t ntop = ev->prompt_num_top < j->q.logprobs ? ev->prompt_num_top : j->q.logprobs;
    size_t offset = 0;
    for (int32_t i = 0; i < ev->prompt_tokens; i++) echo_lp_token(j->s, ep->lp, ev, i, ntop, &offset);
}

/* The echo into choice c — its text and logprobs first, and a stream's
 * chunk for them. Under j->mu; takes ep->lp. */
static void echo_put(job *j, int32_t c, echo_part *ep) {
    choice *ch = &j->ch[c];
    ch->echoed = true;
    sb_put(&ch->text, ep->text, ep->len);
    ch->lp_offset = ep->len; /* the generated tokens' text_offset counts from the echoed prompt's end */
    if (j->q.stream && !j->sse_done) {
        cJSON *o = response_head(j, "text_completion");
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
        cJSON_AddNumberToObject(e, "index", c);
        cJSON_AddItemToObject(e, "text", serve_json_text(ep->text, ep->len));
        cJSON_AddItemToObject(e, "logprobs", ep->lp ? cJSON_Duplicate(ep->lp, true) : cJSON_CreateNull());
        cJSON_AddNullToObject(e, "finish_reason");
        sse_put_json(j, o);
        cJSON_Delete(o);
    }
    ch->lp = ep->lp;
    ep->lp = NULL;
}

static void sse_put_json(job *j, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (s) {
        sb_put(&j->sse, "data: ", 6);
        sb_put(&j->sse, s, strlen(s));
        sb_put(&j->sse, "\n\n", 2);
    }
    free(s);
}

/* One streamed chunk for choice c: the new text, this token's logprobs and
 * the finish reason, whichever there are. Every token gets its chunk, also
 * one whose text is not complete yet (part of a UTF-8 character, or held
 * back by a stop string): clients time the first token by it. */
/* A chat chunk's logprobs: the token's entry (referenced), or null. */
static void chat_chunk_logprobs(cJSON *e, cJSON *lp_one) {
    if (lp_one) {
        cJSON *l = cJSON_AddObjectToObject(e, "logprobs");
        cJSON_AddItemReferenceToArray(cJSON_AddArrayToObject(l, "content"), lp_one);
    } else {
        cJSON_AddNullToObject(e, "logprobs");
    }
}

static void chunk_finish(cJSON *e, const char *fr) {
    if (fr)
        cJSON_AddStringToObject(e, "finish_reason", fr);
    else
        cJSON_AddNullToObject(e, "finish_reason");
}

static void sse_chunk(job *j, int32_t c, bool token, const char *text, size_t len, cJSON *lp_one,
                      loom_finish_reason finish) {
    choice *ch = &j->ch[c];
    bool chat = j->q.api == SERVE_CHAT;
    if (!token && !len && !lp_one && finish == LOOM_FINISH_NONE && (!chat || ch->started)) return;
    cJSON *o = response_head(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *cs = cJSON_AddArrayToObject(o, "choices"), *e = cJSON_CreateObject();
    cJSON_AddItemToArray(cs, e);
    cJSON_AddNumberToObject(e, "index", c);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(e, "delta");
        if (!ch->started) cJSON_AddStringToObject(d, "role", "assistant");
        if (len || !ch->started) cJSON_AddItemToObject(d, "content", serve_json_text(text, len));
        ch->started = true;
        chat_chunk_logprobs(e, lp_one);
    } else {
        cJSON_AddItemToObject(e, "text", serve_json_text(text, len));
        if (lp_one) {
            choice tmp = {.lp_offset = ch->lp_offset};
            cJSON *one = cJSON_Duplicate(lp_one, true);
            completions_lp_merge(&tmp, one);
            cJSON_Delete(one);
            cJSON_AddItemToObject(e, "logprobs", tmp.lp);
        } else {
            cJSON_AddNullToObject(e, "logprobs");
        }
    }
    chunk_finish(e, serve_finish_name(finish));
    sse_put_json(j, o);
    cJSON_Delete(o);
}

/* ------------------------------------------------------------- tools */

/* The answer's tool calls, read when its last event comes (the offered
 * functions only; at most one without parallel_tool_calls). Under j->mu. */
static void tools_read(job *j, choice *ch) {
    const int32_t max = j->q.parallel_tool_calls ? SERVE_MAX_TOOL_CALLS : 1;
    const char *text = ch->text.p ? ch->text.p : "";
    ch->calls = calloc((size_t)max, sizeof *ch->calls);
    if (!ch->calls) return;
    if (!j->q.tool_required && !j->q.tool_named) {
        ch->ncalls = serve_tool_calls_parse(j->tool_family, j->q.tools, j->q.num_tools, text, ch->text.n, ch->calls,
                                            max, &ch->content_len);
        return;
    }
    ch->ncalls = serve_tool_forced_parse(j->q.tools, j->q.num_tools, j->q.tool_named, text, ch->text.n, ch->calls,
                                         max);
    ch->content_len = ch->ncalls ? 0 : ch->text.n;
}

/* The finish reason of a choice: "tool_calls" when it made calls (but a
 * named tool_choice, which OpenAI ends as the generation ended). */
static const char *choice_finish(const job *j, const choice *ch) {
    return ch->ncalls && !j->q.tool_named ? "tool_calls" : serve_finish_name(ch->finish);
}

/* Call k of choice c's id. */
static void call_id(const job *j, int32_t c, int32_t k, char *id, size_t size) {
    /* The request id's tail after its "cmpl-"-style prefix; the whole id
     * when it has no '-', never past its NUL. */
    const char *dash = strchr(j->id, '-');
    snprintf(id, size, "call_%s_%d_%d", dash ? dash + 1 : j->id, c, k);
}

/* OpenAI's tool_calls list of choice c (with each call's index when it goes
 * out as a stream delta). */
static cJSON *tool_calls_json(const job *j, int32_t c, bool indexed) {
    const choice *ch = &j->ch[c];
    cJSON *a = cJSON_CreateArray();
    for (int32_t k = 0; k < ch->ncalls; k++) {
        char id[80];
        call_id(j, c, k, id, sizeof id);
        cJSON *t = cJSON_CreateObject();
        if (indexed) cJSON_AddNumberToObject(t, "index", k);
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "name", ch->calls[k].name);
        cJSON_AddStringToObject(f, "arguments", ch->calls[k].arguments);
        cJSON_AddItemToArray(a, t);
    }
    return a;
}

/* A chat stream with tools offered: content goes out only while it cannot
 * be the start of a call (serve_tool_stream_safe); at the last event the
 * answer is read, and its calls go out as one tool_calls delta with
 * finish_reason "tool_calls" — or, when it holds none, the held-back text
 * as content with the usual finish. Under j->mu, after the event's text was
 * appended to the choice. */
static void sse_tools_event(job *j, int32_t c, bool token, cJSON *lp_one, loom_finish_reason finish) {
    choice *ch = &j->ch[c];
    const char *text = ch->text.p ? ch->text.p : "";
    size_t safe = j->q.tool_required ? 0 : serve_tool_stream_safe(j->tool_family, text, ch->text.n);
    if (finish != LOOM_FINISH_NONE) {
        tools_read(j, ch);
        safe = ch->ncalls ? ch->content_len : ch->text.n;
    }
    if (safe < ch->streamed) safe = ch->streamed;
    sse_chunk(j, c, token, text + ch->streamed, safe - ch->streamed, lp_one, ch->ncalls ? LOOM_FINISH_NONE : finish);
    ch->streamed = safe;
    if (!ch->ncalls) return;
    cJSON *o = response_head(j, "chat.completion.chunk");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
    cJSON_AddNumberToObject(e, "index", c);
    cJSON_AddItemToObject(cJSON_AddObjectToObject(e, "delta"), "tool_calls", tool_calls_json(j, c, true));
    cJSON_AddNullToObject(e, "logprobs");
    cJSON_AddStringToObject(e, "finish_reason", "tool_calls");
    sse_put_json(j, o);
    cJSON_Delete(o);
}

/* A chat stream whose tool_choice names a function: the answer is the
 * call's arguments, sent as they come as tool_calls deltas (the first with
 * the call's id and name), ending as the generation ended. Under j->mu,
 * after the event's text was appended to the choice. */
static void sse_named_event(job *j, int32_t c, bool token, cJSON *lp_one, loom_finish_reason finish) {
    choice *ch = &j->ch[c];
    const size_t n = ch->text.n - ch->streamed;
    if (!token && !n && !lp_one && finish == LOOM_FINISH_NONE && ch->started) return;
    cJSON *o = response_head(j, "chat.completion.chunk");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
    cJSON_AddNumberToObject(e, "index", c);
    cJSON *d = cJSON_AddObjectToObject(e, "delta");
    if (!ch->started) {
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddNullToObject(d, "content");
    }
    cJSON *call = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), call);
    cJSON_AddNumberToObject(call, "index", 0);
    if (!ch->started) {
        char id[80];
        call_id(j, c, 0, id, sizeof id);
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(call, "function");
    if (!ch->started) cJSON_AddStringToObject(f, "name", j->q.tool_named);
    cJSON_AddItemToObject(f, "arguments", serve_json_text(ch->text.p ? ch->text.p + ch->streamed : "", n));
    ch->started = true;
    ch->streamed = ch->text.n;
    chat_chunk_logprobs(e, lp_one);
    chunk_finish(e, serve_finish_name(finish));
    sse_put_json(j, o);
    cJSON_Delete(o);
}

/* The stream's end: the usage chunk when asked for, then [DONE]. Under
 * j->mu. */
static void sse_finish(job *j) {
    if (j->q.include_usage) {
        cJSON *o = response_head(j, j->q.api == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(j));
        sse_put_json(j, o);
        cJSON_Delete(o);
    }
    sb_put(&j->sse, "data: [DONE]\n\n", 14);
    j->sse_done = true;
}

/* The job's connection if it waits suspended, now marked as resumed (NULL
 * if it does not wait): the caller resumes it with MHD_resume_connection
 * once it holds none of its locks (MHD takes its own), so no lock order
 * ties ours to MHD's. Until then MHD leaves the connection alone: nothing
 * else resumes it. Under j->mu. */
static struct MHD_Connection *job_take_resume(job *j) {
    if (!j->suspended || !j->conn) return NULL;
    j->suspended = false;
    atomic_fetch_add(&j->s->resuming, 1); /* until serve_resume */
    return j->conn;
}

/* Resume a connection job_take_resume gave out (see s->resuming). */
static void serve_resume(server *s, struct MHD_Connection *c) {
    if (!c) return;
    MHD_resume_connection(c);
    atomic_fetch_sub(&s->resuming, 1);
}

/* Connections to resume after the locks are released. */
typedef struct conn_list {
    server *s;
    struct MHD_Connection **c;
    size_t n, cap;
} conn_list;

static void conn_list_add(conn_list *l, struct MHD_Connection *c) {
    if (!c) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct MHD_Connection **p = realloc(l->c, cap * sizeof *p);
        if (!p) { /* out of memory: resume it now, under the locks (MHD takes no lock of ours) */
            serve_resume(l->s, c);
            return;
        }
        l->c = p, l->cap = cap;
    }
    l->c[l->n++] = c;
}

static void conn_list_resume(conn_list *l) {
    for (size_t i = 0; i < l->n; i++) serve_resume(l->s, l->c[i]);
    free(l->c);
    *l = (conn_list){.s = l->s};
}

/* Suspend the job's connection until it is resumed: it holds no pool
 * thread while it waits for the engine. From the access handler or the SSE
 * reader only (MHD's rule), under j->mu. */
static void job_suspend_locked(job *j) {
    MHD_suspend_connection(j->conn);
    j->suspended = true;
    j->suspended_at = cli_now();
}

/* ------------------------------------------------------ engine events */

/* [engine thread] The event's latencies into the histograms (TTFT, TPOT,
 * end to end) and its finish reason counted. Under j->mu. */
static void record_latency(job *j, choice *ch, const loom_token_event *ev) {
    const double t = cli_now();
    serve_metrics *m = &j->s->m;
    pthread_mutex_lock(&m->mu);
    if (ev->token >= 0 && ch->t_last > 0) hist_add(&m->tpot, t - ch->t_last);
    else if (ev->token >= 0) hist_add(&m->ttft, t - j->t0);
    if (ev->finish != LOOM_FINISH_NONE) {
        /* completed samples only: an abort or a failure is not a latency */
        if (ev->finish != LOOM_FINISH_ABORT && ev->finish != LOOM_FINISH_ERROR) hist_add(&m->e2e, t - j->t0);
        if ((unsigned)ev->finish < 6) m->finished[ev->finish]++;
    }
    pthread_mutex_unlock(&m->mu);
    if (ev->token >= 0) ch->t_last = t;
}

/* [engine thread] One token or final event of one sample. */
static void on_event(void *user, const loom_token_event *ev) {
    prompt_ctx *pc = user;
    job *j = pc->j;
    int32_t c = pc->p * j->n + ev->sample_index;
    cJSON *lp_one = token_logprobs(j, ev); /* outside the lock: it detokenizes */
    echo_part ep = {0}; /* `echoed` is the engine thread's alone: read without the lock */
    if (j->q.echo && !j->ch[c].echoed && ev->finish != LOOM_FINISH_ERROR) echo_build(j, pc, ev, &ep);
    pthread_mutex_lock(&j->mu);
    choice *ch = &j->ch[c];
    pc->prompt_tokens = ev->prompt_tokens;
    if (LOOM_HAS_FIELD(ev, loom_token_event, cached_prompt_tokens)) pc->cached_tokens = ev->cached_prompt_tokens;
    if (ep.ready) echo_put(j, c, &ep);
    if (ev->token >= 0) ch->tokens++;
    record_latency(j, ch, ev);
    const char *text = ev->text ? ev->text : "";
    size_t len = ev->text ? ev->text_len : 0; /* by length: text may hold NUL characters */
    if (len) sb_put(&ch->text, text, len);
    if (j->q.stream && !j->sse_done) { /* done already: ended at shutdown */
        if (j->q.tool_named) sse_named_event(j, c, ev->token >= 0, lp_one, ev->finish);
        else if (j->tool_family) sse_tools_event(j, c, ev->token >= 0, lp_one, ev->finish);
        else sse_chunk(j, c, ev->token >= 0, text, len, lp_one, ev->finish);
        if (ev->finish == LOOM_FINISH_ERROR) {
            char *e = serve_error_json(500, ev->error ? ev->error : "generation failed", NULL);
            if (e) {
                sb_put(&j->sse, "data: ", 6);
                sb_put(&j->sse, e, strlen(e));
                sb_put(&j->sse, "\n\n", 2);
            }
            free(e);
        }
    }
    if (!j->q.stream && j->tool_family && ev->finish != LOOM_FINISH_NONE) tools_read(j, ch);
    if (lp_one && j->q.api == SERVE_CHAT) {
        if (!ch->lp) ch->lp = cJSON_CreateArray();
        cJSON_AddItemToArray(ch->lp, lp_one);
        lp_one = NULL;
    } else if (lp_one) {
        completions_lp_merge(ch, lp_one);
    }
    bool prompt_done = false;
    if (ev->finish != LOOM_FINISH_NONE) {
        ch->finish = ev->finish;
        if (ev->finish == LOOM_FINISH_ERROR && !j->error[0])
            snprintf(j->error, sizeof j->error, "%s", ev->error ? ev->error : "generation failed");
        j->live--;
        prompt_done = --pc->live == 0;
        if (j->live == 0 && j->q.stream && !j->sse_done) sse_finish(j);
    }
    /* something to send: the whole answer, or more of the stream */
    bool ready = j->q.stream ? j->sse_off < j->sse.n : j->live == 0;
    struct MHD_Connection *wake = ready ? job_take_resume(j) : NULL;
    pthread_mutex_unlock(&j->mu);
    serve_resume(j->s, wake);
    cJSON_Delete(lp_one);
    free(ep.owned);
    if (prompt_done) job_unref(j);
}

/* ------------------------------------------------------ engine thread */

static void *engine_main(void *arg) {
    server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->pending && !s->busy && !s->exit) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->pending && !s->busy && s->exit) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        s->pending = false;
        pthread_mutex_unlock(&s->mu);

        int32_t active = 0;
        loom_error err = {0};
        loom_status st = loom_engine_step(s->eng, &active, &err);
        /* gone idle: one more (empty) step reaps the finished requests, so
         * /metrics shows the idle engine rather than the last busy step */
        if (st == LOOM_OK && active == 0) st = loom_engine_step(s->eng, &active, &err);
        loom_engine_stats stats = {.struct_size = sizeof stats};
        loom_engine_get_stats(s->eng, &stats, sizeof stats);
        pthread_mutex_lock(&s->mu);
        s->stats = stats;
        s->busy = st == LOOM_OK && active > 0;
        if (st != LOOM_OK) {
            /* A failed step (a backend error) leaves the engine unusable:
             * fail what runs and refuse what comes, but keep draining the
             * aborts so every client gets its answer. */
            if (!s->fatal[0]) {
                snprintf(s->fatal, sizeof s->fatal, "the engine failed: %.480s", err.message);
                serve_utf8_trim(s->fatal);
                fprintf(stderr, "loom serve: %s; /health now reports 503\n", s->fatal);
                /* once: the aborts set `pending`, so the next step drains them
                 * (its first act) and every sample gets its final event */
                for (job *j = s->jobs; j; j = j->next) job_abort_locked(j);
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---------------------------------------------------------- HTTP side */

static char *json_text(cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}

typedef struct conn_state {
    sbuf body;
    bool too_large;
    bool answered;            /* refused from its headers (401, 413) */
    job *job;                 /* a non-streaming answer waited for, suspended */
} conn_state;

static void count_status(server *s, unsigned status) {
    pthread_mutex_lock(&s->mu);
    if (status == 499) s->client_closed++; /* apart from 4xx: not a bad request either */
    else if (status / 100 >= 1 && status / 100 <= 5) s->http_requests[status / 100]++;
    pthread_mutex_unlock(&s->mu);
}

/* Queue a response whose body is the malloc'd `body` (taken). */
static enum MHD_Result reply(server *s, struct MHD_Connection *conn, unsigned status, char *body,
                             const char *content_type) {
    if (!body) body = strdup("{}");
    size_t n = strlen(body);
    char *b = malloc(n + 2);
    if (!b) {
        free(body);
        return MHD_NO;
    }
    memcpy(b, body, n);
    b[n] = '\n';
    b[n + 1] = 0;
    free(body);
    struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, b, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(b);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type ? content_type : "application/json");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "POST");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return ret;
}

static enum MHD_Result reply_error(server *s, struct MHD_Connection *conn, unsigned status, const char *msg,
                                   const char *param) {
    return reply(s, conn, status, serve_error_json((int)status, msg, param), NULL);
}

/* The client closed its connection (a non-streaming request waits on). */
/* (A client that half-closes after sending its request reads as gone: no
 * HTTP client loom knows of does that.) */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void deadline_in(struct timespec *t, long ms) {
    clock_gettime(CLOCK_REALTIME, t);
    t->tv_nsec += ms * 1000000L;
    t->tv_sec += t->tv_nsec / 1000000000L;
    t->tv_nsec %= 1000000000L;
}

static void log_request(const job *j, unsigned status) {
    int32_t prompt = 0, completion = 0;
    for (int32_t p = 0; p < j->q.num_prompts; p++) prompt += j->pc[p].prompt_tokens;
    for (int32_t c = 0; c < j->nchoices; c++) completion += j->ch[c].tokens;
    fprintf(stderr, "loom serve: POST %s %u %s prompt %d completion %d tokens %.3f s\n", j->url, status, j->id,
            prompt, completion, cli_now() - j->t0);
}

/* At shutdown, end a stream at once rather than after the engine's step:
 * every unfinished choice gets finish_reason "abort", then the usage and
 * [DONE]; the engine's later events for it are dropped. Under j->mu. */
static void sse_end_aborted(job *j) {
    for (int32_t c = 0; c < j->nchoices; c++)
        if (j->ch[c].finish == LOOM_FINISH_NONE) sse_chunk(j, c, false, "", 0, NULL, LOOM_FINISH_ABORT);
    sse_finish(j);
}

/* SSE reader: hands MHD what the engine thread has queued. With nothing
 * queued it suspends the connection (no pool thread waits) until on_event
 * has more, the watcher sees the client leave or sends a keep-alive, or the
 * server stops (then the stream ends at once, aborted). */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (atomic_load(&j->s->shutting) && !j->sse_done) sse_end_aborted(j); /* not after the step running now */
    ssize_t n;
    if (j->client_left) { /* MHD ends the response; sse_free aborts the request */
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->sse_off < j->sse.n) {
        size_t k = j->sse.n - j->sse_off < max ? j->sse.n - j->sse_off : max;
        memcpy(buf, j->sse.p + j->sse_off, k);
        j->sse_off += k;
        n = (ssize_t)k;
    } else if (j->sse_done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        job_suspend_locked(j);
        n = 0; /* called again once resumed */
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* The stream's response is gone (done, or the client left): stop what runs.
 * The stream is counted here, by how it ended — 200, 499 for a client that
 * left, 503 at shutdown — not when its 200 header was queued. */
static void sse_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool live = j->live > 0;
    j->suspended = false, j->conn = NULL; /* the connection is gone: nothing to resume or watch */
    unsigned status = j->client_left ? 499 : !live ? 200 : atomic_load(&j->s->shutting) ? 503 : 499;
    log_request(j, status); /* under j->mu: the engine thread may still count */
    pthread_mutex_unlock(&j->mu);
    count_status(j->s, status); /* after j->mu: s->mu is never taken inside j->mu */
    if (live) {
        pthread_mutex_lock(&j->s->mu);
        job_abort_locked(j);
        pthread_mutex_unlock(&j->s->mu);
    }
    job_unlist(j);
    job_unref(j);
}

/* ----------------------------------------------------- watcher thread */

/* MHD does not watch a suspended connection: every 0.2 s the watcher looks
 * at each job's client socket — a client that left has its request aborted
 * at once (its KV blocks freed) and its connection resumed to end it — and
 * gives a stream quiet for 15 s (queued, or a long prefill) an SSE comment
 * so proxies keep it open. Caller holds s->mu (the list); takes j->mu. */
static void watch_job(job *j, double now, conn_list *wake) {
    pthread_mutex_lock(&j->mu);
    if (!j->client_left && j->conn && client_gone(j->fd)) {
        j->client_left = true;
        job_abort_locked(j);
        conn_list_add(wake, job_take_resume(j));
    } else if (j->q.stream && j->suspended && now - j->suspended_at > 15.0) {
        sb_put(&j->sse, ": keep-alive\n\n", 14);
        conn_list_add(wake, job_take_resume(j));
    }
    pthread_mutex_unlock(&j->mu);
}

static void *watch_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->watch_exit) {
        struct timespec t;
        deadline_in(&t, 200);
        pthread_cond_timedwait(&s->watch_cv, &s->mu, &t);
        double now = cli_now();
        conn_list wake = {.s = s};
        for (job *j = s->jobs; j; j = j->next) watch_job(j, now, &wake);
        pthread_mutex_unlock(&s->mu);
        conn_list_resume(&wake);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static cJSON *final_response(job *j) {
    bool chat = j->q.api == SERVE_CHAT;
    cJSON *o = response_head(j, chat ? "chat.completion" : "text_completion");
    cJSON *cs = cJSON_AddArrayToObject(o, "choices");
    for (int32_t c = 0; c < j->nchoices; c++) {
        choice *ch = &j->ch[c];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", c);
        const char *text = ch->text.p ? ch->text.p : "";
        if (chat && ch->ncalls) { /* the text before the calls, if any, and the calls */
            cJSON *m = cJSON_AddObjectToObject(e, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", ch->content_len ? serve_json_text(text, ch->content_len)
                                                                : cJSON_CreateNull());
            cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(j, c, false));
        } else if (chat) {
            cJSON *m = cJSON_AddObjectToObject(e, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddItemToObject(m, "content", serve_json_text(text, ch->text.n));
        } else {
            cJSON_AddItemToObject(e, "text", serve_json_text(text, ch->text.n));
        }
        if (j->q.logprobs >= 0) {
            cJSON *lp = ch->lp;
            ch->lp = NULL;
            if (chat) {
                cJSON *l = cJSON_CreateObject();
                cJSON_AddItemToObject(l, "content", lp ? lp : cJSON_CreateArray());
                lp = l;
            } else if (!lp) { /* no token generated: the arrays, empty */
                lp = completions_lp_new();
            }
            cJSON_AddItemToObject(e, "logprobs", lp);
        } else {
            cJSON_AddNullToObject(e, "logprobs");
        }
        const char *fr = choice_finish(j, ch);
        cJSON_AddStringToObject(e, "finish_reason", fr ? fr : "stop");
        cJSON_AddItemToArray(cs, e);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    return o;
}

static void body_too_large(const server *s, char *why, size_t whyn) {
    snprintf(why, whyn, "the request body is larger than %zu bytes (loom serve --max-body)", s->opt->max_body);
}

/* Whether the request's prompt text is over the byte cap (then why, and the
 * parameter): checked before tokenizing, which costs seconds and hundreds of
 * megabytes for a prompt of megabytes that the context could never hold. */
static bool prompt_too_long(const server *s, const serve_req *q, char *why, size_t whyn, const char **param) {
    int32_t which = 0;
    size_t n = serve_prompt_bytes(q, &which);
    if (n <= s->prompt_cap) return false;
    /* Messages come with chat and with /tokenize; either way they are the field. */
    const bool msgs = q->api == SERVE_CHAT || q->base.num_messages > 0;
    char where[32] = "prompt";
    if (msgs) snprintf(where, sizeof where, "the messages");
    else if (q->num_prompts > 1) snprintf(where, sizeof where, "prompt[%d]", which);
    snprintf(why, whyn, "%s %s %zu bytes of text, over the %zu bytes loom serve takes for one prompt (the context "
             "holds %d tokens; loom serve --max-prompt-bytes): shorten the prompt", where,
             msgs ? "have" : "is", n, s->prompt_cap, loom_engine_max_context(s->eng));
    *param = msgs ? "messages" : "prompt";
    return true;
}

/* Whether the request names a model this server does not serve (then why:
 * a 404 for 'model'). */
static bool other_model(const server *s, const serve_req *q, char *why, size_t whyn) {
    if (!q->model || !strcmp(q->model, s->model)) return false;
    char mb[201], sb[201];
    snprintf(why, whyn, "the model '%s' does not exist: this server serves '%s' (GET /v1/models)",
             serve_utf8_clip(q->model, 200, mb, sizeof mb), serve_utf8_clip(s->model, 200, sb, sizeof sb));
    return true;
}

/* A job for the request body in cs, or NULL with the HTTP status, message
 * and offending parameter (may stay NULL) to reply with: 413 too large, 400
 * not a valid request, 404 another model, 500 out of memory. */
static job *job_new(server *s, const char *url, serve_api api, const conn_state *cs, unsigned *status,
                    char *why, size_t whyn, const char **param) {
    *param = NULL;
    if (cs->too_large) {
        *status = 413;
        body_too_large(s, why, whyn);
        return NULL;
    }
    *status = 500;
    snprintf(why, whyn, "out of memory");
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (!serve_parse(api, cs->body.p, cs->body.n, api == SERVE_CHAT ? 0 : s->opt->max_tokens, &j->q, why, whyn,
                     param)) {
        free(j);
        *status = 400;
        return NULL;
    }
    if (other_model(s, &j->q, why, whyn)) {
        serve_req_free(&j->q);
        free(j);
        *status = 404;
        *param = "model";
        return NULL;
    }
    if ((api == SERVE_CHAT && !serve_req_apply_tools(&j->q, loom_engine_chat_template(s->eng), why, whyn, param)) ||
        prompt_too_long(s, &j->q, why, whyn, param)) {
        serve_req_free(&j->q);
        free(j);
        *status = 400;
        return NULL;
    }
    if (j->q.num_tools > 0) j->tool_family = loom_engine_chat_template(s->eng);
    j->s = s;
    j->fd = -1;
    snprintf(j->url, sizeof j->url, "%s", url);
    j->t0 = cli_now();
    j->created = (long long)time(NULL);
    j->n = j->q.base.n;
    j->nchoices = j->q.num_prompts * j->n;
    j->live = j->nchoices;
    j->ch = calloc((size_t)j->nchoices, sizeof *j->ch);
    j->pc = calloc((size_t)j->q.num_prompts, sizeof *j->pc);
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    if (!j->ch || !j->pc) {
        j->nchoices = 0;
        job_unref(j);
        snprintf(why, whyn, "out of memory");
        *param = NULL;
        return NULL;
    }
    for (int32_t p = 0; p < j->q.num_prompts; p++) j->pc[p] = (prompt_ctx){.j = j, .p = p, .id = -1, .live = j->n};
    return j;
}

/* Name the job and put it on the server's list, unless the server is
 * stopping or failed: then 503 and why. The engine's reference per prompt
 * is taken here, before any can finish. */
static unsigned job_list(server *s, job *j, serve_api api, char *why, size_t whyn) {
    unsigned status = 0;
    pthread_mutex_lock(&j->mu);
    j->refs += j->q.num_prompts;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    snprintf(j->id, sizeof j->id, "%s-%llx%08llx", api == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id, (unsigned long long)(j->t0 * 1e6) & 0xffffffffull);
    if (s->stopping || s->fatal[0]) {
        status = 503;
        snprintf(why, whyn, "%s", s->stopping ? "the server is shutting down" : s->fatal);
    } else {
        j->next = s->jobs;
        if (s->jobs) s->jobs->prev = j;
        s->jobs = j;
    }
    pthread_mutex_unlock(&s->mu);
    return status;
}

/* Decode role: whether r's prompt is computed by the prefill engine — one
 * sample, no prompt logprobs, no constraint (those run here, colocated), a
 * prompt of at least two tokens — and then its tokens (*ids malloc'd) with
 * r marked kv_remote. */
static void remote_prompt(server *s, loom_request *r, int32_t **ids, int32_t *n) {
    loom_error err = {0};
    if (r->n > 1 || r->prompt_logprobs || r->prompt_only || r->constraint_lang) return;
    if (loom_engine_prompt_tokens(s->eng, r, true, ids, n, &err) != LOOM_OK) return; /* add_request says why */
    if (*n >= 2) {
        r->kv_remote = true;
        return;
    }
    free(*ids);
    *ids = NULL;
}

/* Add the job's prompts to the engine without holding the server lock —
 * tokenizing a long prompt must not stall the engine thread — storing each
 * id under it, so a shutdown or engine-failure sweep sees every id to
 * abort. Stops at a shutdown, a failure or a refused prompt (then the
 * status, 400 or 500, and why). Prompts never added get no events: their
 * share of live samples and references is given back. */
static unsigned job_add_prompts(server *s, job *j, serve_api api, char *why, size_t whyn) {
    unsigned status = 0;
    loom_error err = {0};
    int32_t added = 0;
    bool cut = false; /* shutdown or engine failure while adding */
    for (int32_t p = 0; p < j->q.num_prompts && !status && !cut; p++) {
        prompt_ctx *pc = &j->pc[p];
        loom_request r = j->q.base;
        if (api == SERVE_COMPLETIONS) {
            r.prompt = j->q.prompts[p].text;
            r.tokens = j->q.prompts[p].tokens;
            r.num_tokens = j->q.prompts[p].num_tokens;
        }
        r.on_token = on_event;
        r.user = pc;
        r.parse_special = s->opt->parse_special;
        int32_t *remote = NULL, nremote = 0; /* the prompt, when a prefill engine computes it */
        if (s->dg) remote_prompt(s, &r, &remote, &nremote);
        int64_t id = loom_engine_add_request(s->eng, &r, &err);
        if (id >= 0 && remote && loom_disagg_remote_prefill(s->dg, id, remote, nremote, &err) != LOOM_OK)
            loom_engine_kv_fail(s->eng, id, err.message);
        free(remote);
        pthread_mutex_lock(&s->mu);
        if (id >= 0) {
            pc->id = id;
            added++;
            cut = s->stopping || s->fatal[0];
            if (cut) job_abort_locked(j); /* the sweep may have run before this id was stored */
            s->pending = true;
            pthread_cond_signal(&s->cv);
        } else {
            status = err.code == LOOM_ERR_NOMEM ? 500 : 400;
            if (j->q.num_prompts > 1)
                snprintf(why, whyn, "prompt[%d]: %.480s", p, err.message);
            else
                snprintf(why, whyn, "%s", err.message);
            serve_utf8_trim(why); /* a long message cut between characters */
        }
        pthread_mutex_unlock(&s->mu);
    }
    int32_t unused = j->q.num_prompts - added;
    pthread_mutex_lock(&j->mu);
    j->live -= j->n * unused;
    j->refs -= unused; /* never the last: the connection holds one */
    pthread_mutex_unlock(&j->mu);
    return status;
}

/* Stream the job as server-sent events; sse_free ends it. */
static enum MHD_Result reply_stream(server *s, struct MHD_Connection *conn, job *j) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, j, sse_free);
    if (!r) {
        sse_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return ret; /* counted in sse_free, once it is known how the stream ended */
}

/* The whole answer of a finished job: 200 with the response, or the error
 * of a failed or aborted sample (500; 503 at shutdown). */
static enum MHD_Result reply_final(server *s, struct MHD_Connection *conn, job *j) {
    bool was_aborted = false;
    for (int32_t c = 0; c < j->nchoices; c++) was_aborted |= j->ch[c].finish == LOOM_FINISH_ABORT;
    enum MHD_Result ret;
    unsigned status;
    char why[512];
    if (j->error[0]) {
        status = 500;
        ret = reply_error(s, conn, 500, j->error, NULL);
    } else if (was_aborted) {
        pthread_mutex_lock(&s->mu);
        bool failed = s->fatal[0];
        snprintf(why, sizeof why, "%s", failed ? s->fatal : "the server is shutting down");
        pthread_mutex_unlock(&s->mu);
        status = failed ? 500 : 503;
        ret = reply_error(s, conn, status, why, NULL);
    } else {
        status = 200;
        cJSON *o = final_response(j);
        ret = reply(s, conn, 200, cJSON_PrintUnformatted(o), NULL);
        cJSON_Delete(o);
    }
    log_request(j, status);
    return ret;
}

/* A non-streaming job's connection is back from suspension (or never went):
 * answer it — the whole answer once every choice is done; at once when the
 * client left (499, nobody reads it, counted apart from the server's
 * errors) or the server stops (503, not after the engine's step running
 * now). Otherwise it waits on, suspended. */
static enum MHD_Result completion_resumed(server *s, struct MHD_Connection *conn, conn_state *cs) {
    job *j = cs->job;
    pthread_mutex_lock(&j->mu);
    bool done = j->live == 0, left = j->client_left, stop = atomic_load(&s->shutting);
    if (!done && !left && !stop) {
        job_suspend_locked(j);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    if (left || !done) log_request(j, left ? 499 : 503); /* under j->mu: the engine thread may still count */
    j->conn = NULL;
    pthread_mutex_unlock(&j->mu);
    cs->job = NULL;
    job_unlist(j);
    enum MHD_Result ret = left ? reply_error(s, conn, 499, "the client went away", NULL)
                          : done ? reply_final(s, conn, j)
                                 : reply_error(s, conn, 503, "the server is shutting down", NULL);
    job_unref(j);
    return ret;
}

/* POST /v1/completions and /v1/chat/completions: parse, list the job, add
 * its prompts, then stream the answer or wait for it (suspended). */
static enum MHD_Result completion(server *s, struct MHD_Connection *conn, const char *url, serve_api api,
                                  conn_state *cs) {
    char why[512];
    const char *param;
    unsigned status;
    job *j = job_new(s, url, api, cs, &status, why, sizeof why, &param);
    if (!j) return reply_error(s, conn, status, why, param);
    status = job_list(s, j, api, why, sizeof why);
    if (!status) status = job_add_prompts(s, j, api, why, sizeof why);
    if (status) {
        pthread_mutex_lock(&s->mu);
        job_abort_locked(j); /* the prompts added before the failing one */
        pthread_mutex_unlock(&s->mu);
        job_unlist(j);
        fprintf(stderr, "loom serve: POST %s %u: %s\n", url, status, why);
        enum MHD_Result r = reply_error(s, conn, status, why, api == SERVE_CHAT ? "messages" : "prompt");
        job_unref(j);
        return r;
    }
    /* a long answer must not be cut by the idle timeout (MHD counts only
     * socket traffic as activity) */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&j->mu); /* the watcher reads them */
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = conn;
    pthread_mutex_unlock(&j->mu);
    if (j->q.stream) return reply_stream(s, conn, j);
    cs->job = j;
    return completion_resumed(s, conn, cs);
}

/* ------------------------------------------------ tokenize, detokenize */

/* POST /tokenize: the token ids a completions prompt or a chat conversation
 * reads (vLLM's shape: tokens, count, max_model_len). On the polling
 * thread, as a completion's tokenizing is, bounded by the prompt byte cap. */
static char *tokenize_answer(server *s, const serve_req *q, unsigned *status, char *why, size_t whyn) {
    loom_request r = loom_request_default();
    if (q->base.num_messages > 0) r.messages = q->base.messages, r.num_messages = q->base.num_messages;
    else r.prompt = q->prompts[0].text;
    r.parse_special = s->opt->parse_special;
    int32_t *ids = NULL, n = 0;
    loom_error err = {0};
    if (loom_engine_prompt_tokens(s->eng, &r, q->add_special, &ids, &n, &err) != LOOM_OK) {
        *status = err.code == LOOM_ERR_NOMEM ? 500 : 400;
        snprintf(why, whyn, "%s", err.message);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
    for (int32_t i = 0; i < n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(o, "count", n);
    cJSON_AddNumberToObject(o, "max_model_len", loom_engine_max_context(s->eng));
    cJSON_AddNullToObject(o, "token_strs");
    free(ids);
    return json_text(o);
}

/* POST /detokenize: {"prompt": the ids' text} (NUL characters as \u0000),
 * every id checked against the vocabulary first. At most max_model_len ids,
 * the longest sequence the engine ever holds: the body cap alone lets some
 * 200k ids through, whose text (tens of MB) would be built on the polling
 * thread. */
static char *detokenize_answer(server *s, const serve_req *q, unsigned *status, char *why, size_t whyn) {
    const serve_prompt *p = &q->prompts[0];
    const int32_t vocab = loom_engine_vocab_size(s->eng), cap = loom_engine_max_context(s->eng);
    *status = 400;
    if (p->num_tokens > cap) {
        snprintf(why, whyn, "tokens has %d ids, over the %d (max_model_len) loom serve detokenizes at once",
                 p->num_tokens, cap);
        return NULL;
    }
    for (int32_t i = 0; i < p->num_tokens; i++)
        if (p->tokens[i] >= vocab) {
            snprintf(why, whyn, "tokens[%d] is %d, outside the vocabulary [0, %d)", i, p->tokens[i], vocab);
            return NULL;
        }
    char *text = NULL;
    size_t len = 0;
    loom_error err = {0};
    if (loom_engine_detokenize_bytes(s->eng, p->tokens, p->num_tokens, &text, &len, &err) != LOOM_OK) {
        *status = err.code == LOOM_ERR_NOMEM ? 500 : 400;
        snprintf(why, whyn, "%s", err.message);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "prompt", serve_json_text(text, len));
    free(text);
    return json_text(o);
}

static enum MHD_Result tokenizer_route(server *s, struct MHD_Connection *conn, serve_api api, conn_state *cs) {
    char why[512];
    const char *param = NULL;
    serve_req q;
    if (cs->too_large) {
        body_too_large(s, why, sizeof why);
        return reply_error(s, conn, 413, why, NULL);
    }
    if (!serve_parse(api, cs->body.p, cs->body.n, 0, &q, why, sizeof why, &param))
        return reply_error(s, conn, 400, why, param);
    unsigned status = 404;
    char *answer = NULL;
    if (other_model(s, &q, why, sizeof why)) param = "model";
    else if (api == SERVE_TOKENIZE &&
             !serve_req_apply_tools(&q, loom_engine_chat_template(s->eng), why, sizeof why, &param))
        status = 400;
    else if (api == SERVE_TOKENIZE && prompt_too_long(s, &q, why, sizeof why, &param)) status = 400;
    else if (api == SERVE_TOKENIZE) answer = tokenize_answer(s, &q, &status, why, sizeof why);
    else answer = detokenize_answer(s, &q, &status, why, sizeof why);
    if (!answer && (status == 400 || status == 500) && !param)
        param = api == SERVE_DETOKENIZE ? "tokens" : q.base.num_messages > 0 ? "messages" : "prompt";
    serve_req_free(&q);
    return answer ? reply(s, conn, 200, answer, NULL) : reply_error(s, conn, status, why, param);
}

/* The served model as OpenAI's model object. */
static cJSON *model_object(server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "loom");
    cJSON_AddNumberToObject(m, "max_model_len", loom_engine_max_context(s->eng));
    return m;
}

static char *models_json(server *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(s));
    return json_text(o);
}

/* GET /v1/models/{id}: the model object, or OpenAI's 404 for another id. */
static enum MHD_Result model_by_id(server *s, struct MHD_Connection *conn, const char *id) {
    if (!strcmp(id, s->model)) return reply(s, conn, 200, json_text(model_object(s)), NULL);
    char m[300], ib[161];
    snprintf(m, sizeof m, "the model '%s' does not exist: this server serves '%.100s'",
             serve_utf8_clip(id, 160, ib, sizeof ib), s->model);
    return reply_error(s, conn, 404, m, NULL);
}

static void hist_text(sbuf *b, const char *name, const char *help, const hist *h) {
    char line[256];
    snprintf(line, sizeof line, "# HELP loom_%s %s\n# TYPE loom_%s histogram\n", name, help, name);
    sb_put(b, line, strlen(line));
    uint64_t cum = 0;
    for (int i = 0; i <= h->nle; i++) {
        cum += h->n[i];
        char le[40];
        if (i < h->nle) { /* whole bounds as "1.0", as Prometheus' own clients print them */
            snprintf(le, sizeof le, "%.15g", h->le[i]); /* 0.3, not 0.29999999999999999 */
            if (!strpbrk(le, ".e")) strcat(le, ".0");
        } else {
            snprintf(le, sizeof le, "+Inf");
        }
        snprintf(line, sizeof line, "loom_%s_bucket{le=\"%s\"} %llu\n", name, le, (unsigned long long)cum);
        sb_put(b, line, strlen(line));
    }
    snprintf(line, sizeof line, "loom_%s_sum %.17g\nloom_%s_count %llu\n", name, h->sum, name,
             (unsigned long long)h->count);
    sb_put(b, line, strlen(line));
}

static char *metrics_text(server *s) {
    hist ttft, tpot, e2e;
    uint64_t fin[6];
    pthread_mutex_lock(&s->m.mu);
    ttft = s->m.ttft, tpot = s->m.tpot, e2e = s->m.e2e;
    memcpy(fin, s->m.finished, sizeof fin);
    pthread_mutex_unlock(&s->m.mu);
    pthread_mutex_lock(&s->mu);
    loom_engine_stats st = s->stats;
    uint64_t h[6], closed = s->client_closed;
    memcpy(h, s->http_requests, sizeof h);
    bool healthy = !s->fatal[0];
    pthread_mutex_unlock(&s->mu);
    sbuf b = {0};
    char line[256];
#define METRIC(name, type, help, fmt, val)                                                         \
    do {                                                                                           \
        snprintf(line, sizeof line, "# HELP loom_" name " " help "\n# TYPE loom_" name " " type "\n" \
                 "loom_" name " " fmt "\n", val);                                                  \
        sb_put(&b, line, strlen(line));                                                            \
    } while (0)
    METRIC("healthy", "gauge", "1 until the engine fails", "%d", healthy ? 1 : 0);
    METRIC("requests_running", "gauge", "sequences in the running batch", "%d", st.running);
    METRIC("requests_waiting", "gauge", "sequences waiting to be scheduled", "%d", st.waiting);
    METRIC("requests_swapped", "gauge", "sequences swapped to CPU memory", "%d", st.swapped);
    METRIC("kv_blocks_used", "gauge", "KV-cache blocks in use", "%d", st.kv_blocks_used);
    METRIC("kv_blocks_total", "gauge", "KV-cache blocks in the pool", "%d", st.kv_blocks_total);
    METRIC("prompt_tokens_total", "counter", "prompt tokens admitted", "%lld", (long long)st.prompt_tokens);
    METRIC("prefix_cached_tokens_total", "counter", "prompt tokens served by the prefix cache", "%lld",
           (long long)st.cached_prompt_tokens);
    METRIC("generation_tokens_total", "counter", "tokens generated", "%lld", (long long)st.generated_tokens);
    METRIC("preemptions_total", "counter", "sequences preempted", "%lld", (long long)st.preemptions);
    METRIC("steps_total", "counter", "engine steps", "%lld", (long long)st.steps);
    if (s->dg) {
        loom_disagg_stats ds;
        loom_disagg_get_stats(s->dg, &ds);
        METRIC("kv_transfers_total", "counter", "KV hand-overs completed (disaggregated serving)", "%llu",
               (unsigned long long)ds.transfers_ok);
        METRIC("kv_transfer_failures_total", "counter", "KV hand-overs that ended in an error", "%llu",
               (unsigned long long)ds.transfers_failed);
        METRIC("kv_transfer_bytes_total", "counter", "KV block-image bytes handed over", "%llu",
               (unsigned long long)ds.bytes);
        METRIC("kv_host_staged_bytes_total", "counter",
               "of them, bytes this side sent from or delivered out of host memory (0: device to device)", "%llu",
               (unsigned long long)ds.host_bytes);
        METRIC("kv_auth_failures_total", "counter", "KV peers refused by the connector's handshake", "%llu",
               (unsigned long long)ds.auth_failures);
        METRIC("kv_send_seconds_total", "counter",
               "prefill: time in the connector's send of KV (placing it, the peer's open and acknowledgement)",
               "%.6f", (double)ds.send_us / 1e6);
        METRIC("kv_deliver_seconds_total", "counter", "decode: time handing received KV to the engine", "%.6f",
               (double)ds.deliver_us / 1e6);
        METRIC("kv_transfers_in_flight", "gauge", "KV hand-overs running now", "%d", ds.in_flight);
        METRIC("kv_waiting", "gauge", "requests waiting for their prompt's KV", "%d", st.kv_waiting);
        METRIC("kv_exported_blocks_total", "counter", "KV blocks read out for decode engines", "%lld",
               (long long)st.kv_exported_blocks);
        METRIC("kv_imported_blocks_total", "counter", "KV blocks written in from a prefill engine", "%lld",
               (long long)st.kv_imported_blocks);
    }
#undef METRIC
    snprintf(line, sizeof line, "# HELP loom_http_responses_total HTTP responses by status class; "
             "499: the client left before its answer (in no class)\n"
             "# TYPE loom_http_responses_total counter\n");
    sb_put(&b, line, strlen(line));
    for (int c = 2; c <= 5; c++) {
        snprintf(line, sizeof line, "loom_http_responses_total{code=\"%dxx\"} %llu\n", c, (unsigned long long)h[c]);
        sb_put(&b, line, strlen(line));
    }
    snprintf(line, sizeof line, "loom_http_responses_total{code=\"499\"} %llu\n", (unsigned long long)closed);
    sb_put(&b, line, strlen(line));
    hist_text(&b, "time_to_first_token_seconds", "from a request's arrival (body read) to each sample's first token",
              &ttft);
    hist_text(&b, "time_per_output_token_seconds", "between consecutive tokens of a sample", &tpot);
    hist_text(&b, "e2e_request_latency_seconds",
              "from a request's arrival to each completed sample's end (aborts and failures left out)", &e2e);
    snprintf(line, sizeof line, "# HELP loom_request_success_total samples ended, by finish reason\n"
             "# TYPE loom_request_success_total counter\n");
    sb_put(&b, line, strlen(line));
    const char *why[] = {"stop", "length", "abort", "error"};
    const uint64_t nf[] = {fin[LOOM_FINISH_EOS] + fin[LOOM_FINISH_STOP], fin[LOOM_FINISH_LENGTH],
                           fin[LOOM_FINISH_ABORT], fin[LOOM_FINISH_ERROR]};
    for (int i = 0; i < 4; i++) {
        snprintf(line, sizeof line, "loom_request_success_total{finished_reason=\"%s\"} %llu\n", why[i],
                 (unsigned long long)nf[i]);
        sb_put(&b, line, strlen(line));
    }
    return b.p;
}

/* Whether the Authorization header carries `Bearer KEY`. The key's bytes are
 * compared in time that does not depend on where they differ, so a client
 * cannot find the key a byte at a time by timing 401s. */
static bool auth_ok(const char *auth, const char *key) {
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return false; /* the scheme's case is free (RFC 7235) */
    const unsigned char *a = (const unsigned char *)auth + 7, *k = (const unsigned char *)key;
    size_t na = strlen((const char *)a), nk = strlen(key);
    unsigned diff = na != nk;
    for (size_t i = 0; i < nk; i++) diff |= (unsigned)(k[i] ^ (i < na ? a[i] : 0u));
    return diff == 0;
}

/* The first call, headers only: refuse what the headers decide already — a
 * missing or wrong API key (401), a body announced larger than --max-body
 * (413) — before the client is told to go on (100 Continue) and before its
 * body is read: MHD then answers at once and discards the body. */
static enum MHD_Result header_stage(server *s, struct MHD_Connection *conn, const char *url, conn_state *cs) {
    if (s->opt->api_key && (!strncmp(url, "/v1/", 4) || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize"))) {
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth_ok(auth, s->opt->api_key)) {
            cs->answered = true;
            return reply_error(s, conn, 401, "missing or wrong API key: send 'Authorization: Bearer KEY' "
                               "(the key loom serve was started with)", NULL);
        }
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    char *end = NULL;
    unsigned long long n = cl ? strtoull(cl, &end, 10) : 0;
    if (cl && end != cl && n > s->opt->max_body) {
        cs->answered = true;
        char why[160];
        body_too_large(s, why, sizeof why);
        return reply_error(s, conn, 413, why, NULL);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) { /* headers only: set up for the body */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        pthread_mutex_lock(&s->mu);
        s->inflight++;
        pthread_mutex_unlock(&s->mu);
        return header_stage(s, conn, url, cs);
    }
    if (cs->job) return completion_resumed(s, conn, cs); /* back from suspension */
    if (cs->answered) { /* refused at the header stage: nothing more to do */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_large && cs->body.n + *upload_size > s->opt->max_body) cs->too_large = true;
        if (!cs->too_large && !sb_put(&cs->body, upload, *upload_size)) cs->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool chat = !strcmp(url, "/v1/chat/completions"), gen = chat || !strcmp(url, "/v1/completions");
    serve_api api = chat ? SERVE_CHAT : SERVE_COMPLETIONS;
    if (gen && post) return completion(s, conn, url, api, cs);
    bool tok = !strcmp(url, "/tokenize"), detok = !strcmp(url, "/detokenize");
    if ((tok || detok) && post) return tokenizer_route(s, conn, tok ? SERVE_TOKENIZE : SERVE_DETOKENIZE, cs);
    if (gen || tok || detok)
        return reply_error(s, conn, MHD_HTTP_METHOD_NOT_ALLOWED, "use POST with a JSON body", NULL);
    if (get && !strcmp(url, "/health")) {
        pthread_mutex_lock(&s->mu);
        bool ok = !s->fatal[0];
        char *msg = ok ? strdup("{\"status\":\"ok\"}") : serve_error_json(503, s->fatal, NULL);
        pthread_mutex_unlock(&s->mu);
        return reply(s, conn, ok ? 200 : 503, msg, NULL);
    }
    if (get && !strcmp(url, "/v1/models")) return reply(s, conn, 200, models_json(s), NULL);
    if (get && !strncmp(url, "/v1/models/", 11)) return model_by_id(s, conn, url + 11);
    if (get && !strcmp(url, "/metrics"))
        return reply(s, conn, 200, metrics_text(s), "text/plain; version=0.0.4");
    char m[400], mb[17], ub[161]; /* the method and URL as sent, cut between characters */
    snprintf(m, sizeof m, "no route %s %s: try POST /v1/completions, POST /v1/chat/completions, POST /tokenize, "
             "POST /detokenize, GET /v1/models, /v1/models/ID, /health, /metrics",
             serve_utf8_clip(method, 16, mb, sizeof mb),
             serve_utf8_clip(url, 160, ub, sizeof ub));
    return reply_error(s, conn, 404, m, NULL);
}

/* The reply is sent (or the connection died): the request is over. */
/* MHD's own complaints (a client gone mid-stream...), marked as ours. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == ' ')) m[--n] = 0;
    fprintf(stderr, "loom serve: http: %s\n", m);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) return;
    /* the request may have lifted the idle timeout while it was generated
     * (completion): a keep-alive connection idle from now on gets it back */
    if (conn) MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, s->opt->idle_timeout);
    if (cs->job) { /* closed while waiting (the daemon stopping): let it go */
        job *j = cs->job;
        pthread_mutex_lock(&j->mu);
        j->suspended = false, j->conn = NULL;
        pthread_mutex_unlock(&j->mu);
        pthread_mutex_lock(&s->mu);
        job_abort_locked(j);
        pthread_mutex_unlock(&s->mu);
        job_unlist(j);
        job_unref(j);
    }
    pthread_mutex_lock(&s->mu);
    if (--s->inflight == 0) pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
    free(cs->body.p);
    free(cs);
    *con_cls = NULL;
}

/* --------------------------------------------------------------- run */

/* The API's model id: --served-model-name, else the model file's name with
 * its spaces as dashes (clients put it in URLs and shell lines). */
static void served_model_name(loom_engine *eng, const serve_options *opt, char *model, size_t n) {
    snprintf(model, n, "%s", opt->model_name ? opt->model_name : loom_engine_model_name(eng));
    for (char *c = model; !opt->model_name && *c; c++)
        if (*c == ' ') *c = '-';
}

static void server_init(server *s, loom_engine *eng, const serve_options *opt, const char *model) {
    *s = (server){.eng = eng, .opt = opt, .model = model};
    atomic_init(&s->shutting, false);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->m.mu, NULL);
    s->m.ttft = HIST_OF(k_ttft_le), s->m.tpot = HIST_OF(k_tpot_le), s->m.e2e = HIST_OF(k_e2e_le);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_cond_init(&s->watch_cv, NULL);
    s->prompt_cap = opt->max_prompt_bytes ? opt->max_prompt_bytes
                                          : (size_t)loom_engine_max_context(eng) * SERVE_BYTES_PER_TOKEN;
    s->stats.struct_size = sizeof s->stats;
    loom_engine_get_stats(eng, &s->stats, sizeof s->stats);
}

static void server_destroy(server *s) {
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->m.mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->watch_cv);
}

/* Each connection is a descriptor: raise the soft limit (up to the hard
 * one) so that --max-connections of them fit, or say why they cannot. */
static void raise_fd_limit(unsigned connections) {
    struct rlimit rl;
    rlim_t want = (rlim_t)connections + 64; /* the engine's files, the listener, the ITC pipes */
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
        fprintf(stderr, "loom serve: the descriptor limit (ulimit -n %llu) holds fewer than --max-connections %u "
                "connections\n", (unsigned long long)rl.rlim_cur, connections);
}

/* Start the HTTP daemon on the resolved address ai (freed here); NULL
 * after a message. host (hostn bytes) gets the address as text for the
 * banner, *v6 whether it is IPv6. */
static struct MHD_Daemon *start_daemon(server *s, struct addrinfo *ai, char *host, size_t hostn, bool *v6) {
    const serve_options *opt = s->opt;
    /* A few polling threads (epoll on Linux) share every connection: an idle
     * or half-sent connection costs a socket, not a thread, and a request
     * waiting for the engine is suspended, holding none. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    raise_fd_limit(opt->max_connections);
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)opt->port, NULL, NULL, on_request, s,
                                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first: all messages */
                                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)SERVE_HTTP_THREADS,
                                            MHD_OPTION_CONNECTION_LIMIT, opt->max_connections,
                                            MHD_OPTION_CONNECTION_TIMEOUT, opt->idle_timeout,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    snprintf(host, hostn, "?");
    if (ai->ai_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, host, (socklen_t)hostn);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, host, (socklen_t)hostn);
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (!d)
        fprintf(stderr, "loom serve: cannot listen on %s port %d: %s (is the port taken? try --port 0 for any free "
                "one)\n", opt->host, opt->port, strerror(errno ? errno : EADDRINUSE));
    return d;
}

/* After SIGINT/SIGTERM: no new connections, every running request aborted,
 * their clients given 10 s at most to get their answer, then the daemon
 * and the engine thread stopped. */
static void stop_server(server *s, struct MHD_Daemon *d, pthread_t eng_thread, int sig) {
    fprintf(stderr, "loom serve: %s: stopping (running requests are aborted)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    MHD_socket listen_fd = MHD_quiesce_daemon(d); /* no new connections; ours to close after the stop */
    /* Refuse new connections now, not leave them in the backlog for the
     * length of the engine's step: shutdown() takes the socket out of the
     * LISTEN state (connects get RST) while the descriptor stays valid for
     * MHD's threads until the stop, when it is closed. */
    if (listen_fd != MHD_INVALID_SOCKET) shutdown(listen_fd, SHUT_RDWR);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    atomic_store(&s->shutting, true);
    conn_list wake = {.s = s};
    for (job *j = s->jobs; j; j = j->next) { /* listed jobs are alive: unlisted under s->mu */
        job_abort_locked(j);
        pthread_mutex_lock(&j->mu); /* wake its connection: it answers 503 now */
        conn_list_add(&wake, job_take_resume(j));
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->mu);
    conn_list_resume(&wake);
    pthread_mutex_lock(&s->mu);
    /* let the aborted requests' clients get their 503 (or their stream's
     * end) before the sockets close; 10 s at most */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (s->inflight > 0 && pthread_cond_timedwait(&s->idle_cv, &s->mu, &until) == 0) {}
    pthread_mutex_unlock(&s->mu);
    /* a connection taken for resuming (by the engine thread, finishing its
     * step) is resumed before the stop frees it; nothing suspends any more */
    while (atomic_load(&s->resuming) > 0) usleep(1000);
    MHD_stop_daemon(d); /* waits for its threads; every connection closed */
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd);
    pthread_mutex_lock(&s->mu);
    s->watch_exit = true;
    pthread_cond_signal(&s->watch_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watcher, NULL);
    pthread_mutex_lock(&s->mu);
    s->exit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(eng_thread, NULL);
}

/* SIGINT / SIGTERM while serving. Threads started before serve_run (the
 * plugins': backend pools, mask workers, connectors) do not have the
 * signals blocked, so the kernel may deliver one to any of them: a handler
 * (not sigwait in one thread, which would leave the others to the default
 * action, death by the signal) wakes serve_run through a semaphore. */
static sem_t stop_sem;          /* lives as long as the process */
static atomic_int stop_signal; /* the first signal; lock-free, so handler-safe */

static void on_stop_signal(int sig) {
    int first = 0;
    if (!atomic_compare_exchange_strong(&stop_signal, &first, sig)) {
        /* a second one while stopping (Ctrl-C again): end the process now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    const int saved = errno;
    sem_post(&stop_sem); /* async-signal-safe */
    errno = saved;
}

/* Install the handler for SIGINT and SIGTERM (NULL: restore the defaults). */
static void set_stop_handler(void (*fn)(int)) {
    struct sigaction sa = {.sa_handler = fn ? fn : SIG_DFL, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* [any] Another thread added or delivered a request: step. */
static void serve_wake(void *ctx) {
    server *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->pending = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int serve_run(loom_engine *eng, const serve_options *opt) {
    char model[128];
    served_model_name(eng, opt, model, sizeof model);
    server s;
    server_init(&s, eng, opt, model);
    if (opt->role != SERVE_ROLE_COLOCATED) {
        loom_error err = {0};
        loom_disagg_role role = opt->role == SERVE_ROLE_PREFILL ? LOOM_DISAGG_PREFILL : LOOM_DISAGG_DECODE;
        if (loom_disagg_create(eng, role, serve_wake, &s, &s.dg, &err) != LOOM_OK) {
            fprintf(stderr, "loom serve: %s\n", err.message);
            server_destroy(&s);
            return 1;
        }
    }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", opt->port);
    int gai = getaddrinfo(opt->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "loom serve: cannot resolve --host '%s': %s\n", opt->host, gai_strerror(gai));
        loom_disagg_destroy(s.dg);
        server_destroy(&s);
        return 1;
    }
    /* MHD's threads and the engine's start with the stop signals blocked
     * (inherited mask; their polls are not interrupted); this thread takes
     * them again once they run. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    sem_init(&stop_sem, 0, 0);
    atomic_store(&stop_signal, 0);
    set_stop_handler(on_stop_signal);

    char host[INET6_ADDRSTRLEN];
    bool v6;
    struct MHD_Daemon *d = start_daemon(&s, ai, host, sizeof host, &v6);
    if (!d) {
        set_stop_handler(NULL);
        pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
        loom_disagg_destroy(s.dg);
        server_destroy(&s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : opt->port;
    pthread_t eng_thread;
    bool watching = pthread_create(&s.watcher, NULL, watch_main, &s) == 0;
    if (!watching || pthread_create(&eng_thread, NULL, engine_main, &s) != 0) {
        fprintf(stderr, "loom serve: cannot start the engine and watcher threads\n");
        MHD_stop_daemon(d);
        pthread_mutex_lock(&s.mu);
        s.watch_exit = true;
        pthread_mutex_unlock(&s.mu);
        if (watching) pthread_join(s.watcher, NULL);
        set_stop_handler(NULL);
        pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
        loom_disagg_destroy(s.dg);
        server_destroy(&s);
        return 1;
    }
    fprintf(stderr, "loom serve: model '%s', context %d tokens%s; Ctrl-C stops\n", s.model,
            loom_engine_max_context(eng), opt->api_key ? ", API key required" : "");
    printf("loom serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", bound);
    fflush(stdout);

    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    while (sem_wait(&stop_sem) != 0 && errno == EINTR) {}
    loom_disagg_stop(s.dg); /* first: its handlers need the engine thread */
    stop_server(&s, d, eng_thread, atomic_load(&stop_signal));
    loom_disagg_destroy(s.dg);
    /* a signal while the engine is destroyed ends the process, as above */
    set_stop_handler(NULL);
    server_destroy(&s);
    return 0;
}
