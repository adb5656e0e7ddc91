/*
 * core/engine/requests.c — requests in: checking and tokenizing on the
 * caller's thread, the inbox the step loop drains, admission, aborts.
 *
 * loom_engine_add_request and loom_engine_abort are [any]: they only touch
 * the immutable tokenizer and post to the inbox under inbox_mu. The step
 * loop drains the inbox at the start of every step (drain_inbox), where a
 * request becomes its first sequence and meets the sampler and the
 * scheduler; whatever refuses it there ends that request alone with an
 * error event, never the engine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/util.h"

loom_sampling_params loom_sampling_params_default(void) {
    loom_sampling_params p = {0};
    p.struct_size = sizeof p;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

loom_request loom_request_default(void) {
    loom_request r = {0};
    r.struct_size = sizeof r;
    r.params = loom_sampling_params_default();
    r.n = 1;
    return r;
}

/* ------------------------------------------------------------- prompts */

/* Messages through the chat template. By default the template's markers are
 * special and the messages' text is not (no forged turns); parse_special
 * renders the conversation and reads every marker in it, content included. */
static loom_status chat_encode(loom_engine *e, const loom_request *req, const loom_chat_msg *msgs, int32_t n,
                               loom_req *rq, loom_error *err) {
    if (!req->parse_special)
        return loom_chat_encode(e->tok, e->chat_format, msgs, n, true, &rq->prompt, &rq->prompt_len, err);
    char *text = NULL;
    loom_status st = loom_chat_apply(e->tok, e->chat_format, msgs, n, true, &text, err);
    if (st == LOOM_OK)
        st = loom_tokenizer_encode(e->tok, text, strlen(text), false, true, &rq->prompt, &rq->prompt_len, err);
    free(text);
    return st;
}

/* A conversation through the model's chat template. */
static loom_status encode_messages(loom_engine *e, const loom_request *req, loom_req *rq, loom_error *err) {
    if (req->prompt || req->tokens || req->chat || req->system || !req->messages)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              req->messages ? "a request with messages takes no prompt, tokens, chat or system"
                                            : "num_messages is %d but messages is NULL",
                              req->num_messages);
    if (!e->tok || e->chat_none)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              !e->tok ? "this model has no tokenizer (dummy weights): a conversation needs one"
                                      : "this pipeline has no chat template (model.chat_template: none): send "
                                        "the prompt as text instead of messages");
    loom_chat_msg *msgs = calloc((size_t)req->num_messages, sizeof *msgs);
    if (!msgs) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %d messages", req->num_messages);
    loom_status st = LOOM_OK;
    const char *family = loom_engine_chat_template(e);
    const bool llama3 = family && !strcmp(family, "llama3"), mistral = family && !strcmp(family, "mistral");
    for (int32_t i = 0; i < req->num_messages && st == LOOM_OK; i++) {
        const char *role = req->messages[i].role, *content = req->messages[i].content;
        const bool tool_role = role && ((llama3 && !strcmp(role, "ipython")) || /* Llama 3.1's tool results */
                                        (mistral && (!strcmp(role, "available_tools") || !strcmp(role, "tool_calls") ||
                                                     !strcmp(role, "tool_results"))));
        if (!role || !content ||
            (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && !tool_role))
            st = loom_error_set(err, LOOM_ERR_INVALID,
                                "messages[%d]: role '%s' with %s content: roles are system, user and "
                                "assistant (and ipython with the llama3 template; available_tools, tool_calls "
                                "and tool_results with the mistral one), content is text",
                                i, role ? role : "(none)", content ? "text" : "no");
        msgs[i] = (loom_chat_msg){role, content};
    }
    if (st == LOOM_OK) st = chat_encode(e, req, msgs, req->num_messages, rq, err);
    free(msgs);
    return st;
}

/* Text, wrapped as one user turn when req->chat asks for it; add_special:
 * with the BOS the tokenizer puts before text, if it has one. */
static loom_status encode_text(loom_engine *e, const loom_request *req, bool add_special, loom_req *rq,
                               loom_error *err) {
    if (!e->tok)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "this model has no tokenizer (dummy weights): give prompt token ids instead of text");
    const bool chat = req->chat && !e->chat_none;
    if (chat) {
        loom_chat_msg msgs[2];
        int32_t nm = 0;
        if (req->system) msgs[nm++] = (loom_chat_msg){"system", req->system};
        msgs[nm++] = (loom_chat_msg){"user", req->prompt};
        return chat_encode(e, req, msgs, nm, rq, err);
    }
    return loom_tokenizer_encode(e->tok, req->prompt, strlen(req->prompt),
                                 add_special && loom_tokenizer_adds_bos(e->tok),
                                 req->parse_special, &rq->prompt, &rq->prompt_len, err);
}

static loom_status copy_tokens(loom_engine *e, const loom_request *req, loom_req *rq, loom_error *err) {
    rq->prompt = malloc((size_t)req->num_tokens * sizeof(int32_t));
    if (!rq->prompt)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %d prompt tokens", req->num_tokens);
    for (int32_t i = 0; i < req->num_tokens; i++) {
        if (req->tokens[i] < 0 || req->tokens[i] >= e->vocab)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "prompt token %d at index %d is outside the vocabulary [0, %d)", req->tokens[i], i,
                                  e->vocab);
        rq->prompt[i] = req->tokens[i];
    }
    rq->prompt_len = req->num_tokens;
    return LOOM_OK;
}

/* The prompt as token ids, from whichever form the request gave. */
static loom_status encode_prompt(loom_engine *e, const loom_request *req, bool add_special, loom_req *rq,
                                 loom_error *err) {
    if (req->num_messages > 0) return encode_messages(e, req, rq, err);
    if (req->prompt) return encode_text(e, req, add_special, rq, err);
    if (req->tokens && req->num_tokens > 0) return copy_tokens(e, req, rq, err);
    return loom_error_set(err, LOOM_ERR_INVALID, "request has neither a prompt nor prompt tokens");
}

loom_status loom_engine_prompt_tokens(loom_engine *e, const loom_request *req, bool add_special, int32_t **ids,
                                      int32_t *n, loom_error *err) {
    if (!e || !req || req->struct_size < sizeof(uint32_t) || req->struct_size > sizeof(loom_request))
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_prompt_tokens: an engine and a request (struct_size "
                              "%u) are required", req ? req->struct_size : 0);
    loom_request full = loom_request_default();
    memcpy(&full, req, req->struct_size);
    loom_req rq = {0};
    loom_status st = encode_prompt(e, &full, add_special, &rq, err);
    if (st != LOOM_OK) {
        free(rq.prompt);
        return st;
    }
    *ids = rq.prompt;
    *n = rq.prompt_len;
    return LOOM_OK;
}

/* The prompt as token ids and the new-token budget that fits the context
 * after it. */
static loom_status resolve_prompt(loom_engine *e, const loom_request *req, loom_req *rq, loom_error *err) {
    loom_status st = encode_prompt(e, req, true, rq, err);
    if (st != LOOM_OK) return st;
    if (rq->prompt_len == 0)
        return loom_error_set(err, LOOM_ERR_INVALID, "the prompt encodes to zero tokens: give some text");
    if (rq->prompt_len >= e->max_model_len)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "prompt is %d tokens but the context holds %d (prompt + at least one new "
                              "token): shorten the prompt or raise engine.max_model_len (model trained to %d)",
                              rq->prompt_len, e->max_model_len, e->mcfg->max_context);
    int32_t room = e->max_model_len - rq->prompt_len;
    if (req->strict_max_tokens && req->max_tokens > room)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "the context holds %d tokens, but the prompt is %d and max_tokens %d asks for %d "
                              "more: lower max_tokens to at most %d or shorten the prompt",
                              e->max_model_len, rq->prompt_len, req->max_tokens, req->max_tokens, room);
    rq->max_new = req->max_tokens > 0 && req->max_tokens < room ? req->max_tokens : room;
    return LOOM_OK;
}

/* The obvious mistakes in sampling parameters, caught at once on the
 * caller's thread; the sampler's own rules are checked at admission. */
static loom_status check_params(const loom_sampling_params *p, loom_error *err) {
    if (p->struct_size >= sizeof(loom_sampling_params) && p->temperature >= 0 && isfinite(p->temperature) &&
        p->top_p > 0 && p->top_p <= 1 && p->top_k >= 0 && p->min_p >= 0 && p->min_p <= 1 &&
        isfinite(p->repetition_penalty) && p->repetition_penalty > 0 && isfinite(p->presence_penalty) &&
        isfinite(p->frequency_penalty) && p->logprobs >= 0 && p->logprobs <= LOOM_MAX_LOGPROBS)
        return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_INVALID,
                          "sampling parameters out of range (params.struct_size %u, start from "
                          "loom_sampling_params_default(); temperature %g finite >= 0, top_p %g in (0,1], "
                          "top_k %d >= 0, min_p %g in [0,1], repetition_penalty %g finite > 0, presence/frequency "
                          "penalties %g/%g finite, logprobs %d in [0,%d])",
                          p->struct_size, p->temperature, p->top_p, p->top_k, p->min_p, p->repetition_penalty,
                          p->presence_penalty, p->frequency_penalty, p->logprobs, LOOM_MAX_LOGPROBS);
}

static int bias_by_token(const void *a, const void *b) {
    const int32_t x = ((const loom_logit_bias *)a)->token, y = ((const loom_logit_bias *)b)->token;
    return (x > y) - (x < y);
}

/* The request's logit bias, checked against the vocabulary and copied
 * (sorted by token: a duplicate sits next to its twin). */
static loom_status copy_logit_bias(const loom_engine *e, const loom_request *req, loom_req *rq, loom_error *err) {
    const int32_t n = req->num_logit_bias;
    if (n == 0) return LOOM_OK;
    if (n < 0 || n > LOOM_MAX_LOGIT_BIAS || !req->logit_bias)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "logit_bias: %d entries%s; at most %d, and a NULL array only with 0", n,
                              req->logit_bias ? "" : " with a NULL array", LOOM_MAX_LOGIT_BIAS);
    const int32_t vocab = e->vocab;
    for (int32_t i = 0; i < n; i++) {
        const loom_logit_bias *b = &req->logit_bias[i];
        if (b->token < 0 || b->token >= vocab)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "logit_bias entry %d: token %d is outside the vocabulary [0, %d)", i,
                                  b->token, vocab);
        if (!(isfinite(b->bias) && fabsf(b->bias) <= LOOM_LOGIT_BIAS_MAX))
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "logit_bias entry %d: bias %g for token %d is outside [-%g, %g]", i,
                                  (double)b->bias, b->token, (double)LOOM_LOGIT_BIAS_MAX,
                                  (double)LOOM_LOGIT_BIAS_MAX);
    }
    loom_logit_bias *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying logit_bias");
    memcpy(copy, req->logit_bias, (size_t)n * sizeof *copy);
    qsort(copy, (size_t)n, sizeof *copy, bias_by_token);
    rq->r.logit_bias = copy;
    rq->r.num_logit_bias = n;
    for (int32_t i = 1; i < n; i++)
        if (copy[i].token == copy[i - 1].token)
            return loom_error_set(err, LOOM_ERR_INVALID, "logit_bias: token %d appears twice", copy[i].token);
    return LOOM_OK;
}

static loom_status copy_stops(const char *const *stop, loom_req *rq, loom_error *err) {
    if (!stop) return LOOM_OK;
    int32_t ns = 0;
    while (stop[ns]) ns++;
    rq->stop = calloc((size_t)ns + 1, sizeof(char *));
    if (!rq->stop) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying stop strings");
    for (int32_t i = 0; i < ns; i++) {
        rq->stop[i] = loom_strdup(stop[i]);
        if (!rq->stop[i]) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying stop strings");
        int32_t l = (int32_t)strlen(stop[i]);
        if (l > rq->max_stop_len) rq->max_stop_len = l;
    }
    return LOOM_OK;
}

/* A request the engine owns: a copy of `req` read up to the caller's
 * struct_size (later fields keep their defaults), without the borrowed
 * pointers. */
static loom_req *req_copy(const loom_request *req, loom_request *full) {
    *full = loom_request_default();
    memcpy(full, req, req->struct_size);
    full->struct_size = sizeof *full;
    loom_req *rq = calloc(1, sizeof *rq);
    if (!rq) return NULL;
    rq->r = *full;
    rq->r.system = loom_strdup(full->system);
    rq->r.prompt = NULL;
    rq->r.tokens = NULL;
    rq->r.messages = NULL;
    rq->r.stop = NULL;
    rq->r.logit_bias = NULL;
    rq->r.num_logit_bias = 0;
    rq->n = full->n > 1 ? full->n : 1;
    rq->arrival = loom_now();
    return rq;
}

void engine_inbox_post(loom_engine *e, loom_inbox_item *it, loom_req *rq) {
    pthread_mutex_lock(&e->inbox_mu);
    if (rq) {
        rq->id = e->next_req_id++;
        e->active++;
    }
    if (e->inbox_tail) e->inbox_tail->next = it;
    else e->inbox_head = it;
    e->inbox_tail = it;
    pthread_mutex_unlock(&e->inbox_mu);
}

int64_t loom_engine_add_request(loom_engine *e, const loom_request *req, loom_error *err) {
    if (!e || !req) {
        loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_add_request: engine and request are required");
        return -1;
    }
    if (req->struct_size < sizeof(uint32_t) || req->struct_size > sizeof(loom_request)) {
        loom_error_set(err, LOOM_ERR_ABI, "loom_request.struct_size %u is not one this engine knows (%zu)",
                       req->struct_size, sizeof(loom_request));
        return -1;
    }
    loom_request full;
    loom_req *rq = req_copy(req, &full);
    if (!rq) {
        loom_error_set(err, LOOM_ERR_NOMEM, "out of memory queueing a request");
        return -1;
    }
    loom_inbox_item *it = NULL;
    loom_status st = resolve_prompt(e, &full, rq, err);
    if (st == LOOM_OK) st = check_params(&full.params, err);
    if (st == LOOM_OK) st = engine_kv_check_request(&full, err);
    if (st == LOOM_OK) st = copy_stops(full.stop, rq, err);
    if (st == LOOM_OK) st = copy_logit_bias(e, &full, rq, err);
    if (st == LOOM_OK) st = engine_constraint_compile(e, &full, rq, err);
    if (st == LOOM_OK && !(rq->seqs = calloc((size_t)rq->n, sizeof(loom_seq *))))
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK && !(it = calloc(1, sizeof *it))) st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if (st != LOOM_OK) {
        loom_engine_req_free(rq);
        return -1;
    }
    it->req = rq;
    engine_inbox_post(e, it, rq);
    return rq->id;
}

loom_status loom_engine_abort(loom_engine *e, int64_t request_id) {
    loom_inbox_item *it = calloc(1, sizeof *it);
    if (!it) return LOOM_ERR_NOMEM;
    it->abort_id = request_id;
    engine_inbox_post(e, it, NULL);
    return LOOM_OK;
}

/* ------------------------------------------------------------ admission */

/* A request that never reached the tables ends here: one ERROR event per
 * sample (its caller may be waiting on them — e.g. an HTTP client), then
 * it no longer counts as active. */
void engine_fail_unadmitted(loom_engine *e, loom_req *rq, const char *why) {
    engine_end_unstarted(rq, 0, LOOM_FINISH_ERROR, why);
    pthread_mutex_lock(&e->inbox_mu);
    e->active--;
    pthread_mutex_unlock(&e->inbox_mu);
    loom_engine_req_free(rq);
}

/* Admit a queued request — with kv (not NULL) a kv_remote one, whose
 * prompt's KV but the last token's is written in before the scheduler sees
 * it. Whatever refuses it (out of memory, the sampler, the cache, the
 * scheduler) ends that request alone with an error event: the engine goes
 * on with the others. */
void engine_admit(loom_engine *e, loom_req *rq, engine_handoff *kv, loom_error *err) {
    static const char *const oom = "out of memory admitting the request";
    if (engine_grow((void **)&e->reqs, &e->cap_reqs, e->num_reqs + 1, sizeof(loom_req *)) != LOOM_OK) {
        engine_fail_unadmitted(e, rq, oom);
        return;
    }
    loom_seq *s = engine_seq_new(e, rq, 0);
    if (!s || engine_track_seq(e, s) != LOOM_OK) {
        loom_engine_seq_free(s);
        engine_fail_unadmitted(e, rq, oom);
        return;
    }
    e->reqs[e->num_reqs++] = rq;
    rq->seqs[0] = s;
    rq->live = 1;
    rq->forked = rq->n == 1;
    e->stats.prompt_tokens += rq->prompt_len;
    /* The sampler's own rules (e.g. its max_logprobs): one dry draw from
     * flat logits, so a request it rejects ends alone with an error
     * instead of failing every row of a later step. */
    loom_status st = engine_sampler_check(e, s, err);
    if (st != LOOM_OK) {
        engine_seq_finish(e, s, LOOM_FINISH_ERROR,
                          err ? err->message : "the sampler rejected the request's parameters");
        return;
    }
    if (kv && (st = engine_kv_import(e, s, kv, err)) != LOOM_OK) {
        engine_seq_finish(e, s, LOOM_FINISH_ERROR, err ? err->message : "the prefill's KV could not be written in");
        return;
    }
    st = e->sch->add(e->sch_self, &s->info, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "scheduler refused request %lld", (long long)rq->id);
        engine_seq_finish(e, s, LOOM_FINISH_ERROR, err ? err->message : "scheduler refused the request");
    }
}

/* A request that reads its prompt and generates nothing (prompt_only):
 * every sample ends at once, LENGTH, after the prompt was scored when it
 * asked for its logprobs. */
static void finish_prompt_only(loom_engine *e, loom_req *rq) {
    e->stats.prompt_tokens += rq->prompt_len;
    engine_end_unstarted(rq, 0, LOOM_FINISH_LENGTH, NULL);
    pthread_mutex_lock(&e->inbox_mu);
    e->active--;
    pthread_mutex_unlock(&e->inbox_mu);
    loom_engine_req_free(rq);
}

static bool any_running(const loom_engine *e) {
    for (int32_t i = 0; i < e->num_reqs; i++)
        if (e->reqs[i]->live > 0) return true;
    return false;
}

/* Admit a request after what it needs before its first step: its prompt's
 * logprobs, scored now (between steps, the step buffers are free), and an
 * end at once for a request that generates nothing. A prompt the cache has
 * no room to score while other requests run waits for them (deferred, tried
 * again at the next drain); with none running, no room is an error (the
 * paged cache always holds one max_model_len sequence, so that is rare). */
static void admit_scored(loom_engine *e, loom_req *rq, loom_error *err) {
    if (rq->r.prompt_logprobs) {
        loom_error serr = {0};
        loom_status st = engine_score_prompt(e, rq, &serr);
        if (st == LOOM_ERR_NO_SPACE && any_running(e) &&
            engine_grow((void **)&e->deferred, &e->cap_deferred, e->num_deferred + 1, sizeof(loom_req *)) ==
                LOOM_OK) {
            e->deferred[e->num_deferred++] = rq;
            return;
        }
        if (st != LOOM_OK) {
            loom_error_prefix(&serr, "scoring the prompt's %d tokens", rq->prompt_len);
            engine_fail_unadmitted(e, rq, serr.message);
            return;
        }
    }
    if (rq->r.prompt_only) finish_prompt_only(e, rq);
    else if (rq->r.kv_remote) engine_kv_park(e, rq);
    else engine_admit(e, rq, NULL, err);
}

/* The deferred requests, tried again oldest first (each may wait again). */
static void retry_deferred(loom_engine *e, loom_error *err) {
    const int32_t n = e->num_deferred;
    if (n == 0) return;
    loom_req **batch = malloc((size_t)n * sizeof *batch);
    if (!batch) return; /* tried at the next drain */
    memcpy(batch, e->deferred, (size_t)n * sizeof *batch);
    e->num_deferred = 0;
    for (int32_t i = 0; i < n; i++) admit_scored(e, batch[i], err);
    free(batch);
}

/* An abort of a request still waiting to be scored: its samples end now. */
static bool abort_deferred(loom_engine *e, int64_t id) {
    for (int32_t i = 0; i < e->num_deferred; i++) {
        loom_req *rq = e->deferred[i];
        if (rq->id != id) continue;
        memmove(e->deferred + i, e->deferred + i + 1, (size_t)(e->num_deferred - i - 1) * sizeof *e->deferred);
        e->num_deferred--;
        engine_end_unstarted(rq, 0, LOOM_FINISH_ABORT, NULL);
        pthread_mutex_lock(&e->inbox_mu);
        e->active--;
        pthread_mutex_unlock(&e->inbox_mu);
        loom_engine_req_free(rq);
        return true;
    }
    return false;
}

static void abort_request(loom_engine *e, int64_t id) {
    if (abort_deferred(e, id) || engine_kv_abort_parked(e, id)) return;
    for (int32_t i = 0; i < e->num_reqs; i++) {
        loom_req *rq = e->reqs[i];
        if (rq->id != id || rq->live == 0) continue;
        rq->aborted = true;
        for (int32_t k = 0; k < rq->n; k++)
            if (rq->seqs[k]) engine_seq_finish(e, rq->seqs[k], LOOM_FINISH_ABORT, NULL);
    }
}

void engine_drain_inbox(loom_engine *e, loom_error *err) {
    pthread_mutex_lock(&e->inbox_mu);
    loom_inbox_item *it = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    pthread_mutex_unlock(&e->inbox_mu);
    retry_deferred(e, err);
    engine_kv_retry(e);
    while (it) {
        loom_inbox_item *next = it->next;
        if (it->req) admit_scored(e, it->req, err);
        else if (it->kv || it->kv_fail) engine_kv_inbox_item(e, it);
        else abort_request(e, it->abort_id);
        free(it);
        it = next;
    }
}
