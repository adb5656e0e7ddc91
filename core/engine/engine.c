/*
 * core/engine/engine.c — the step loop and the requests it serves.
 *
 * The engine owns requests, sequences, the model and the tokenizer; every
 * decision is a plugin's. One step:
 *   drain the inbox (new requests, aborts) -> scheduler picks {seq: tokens}
 *   (allocating slots through the cache manager, preempting on NO_SPACE)
 *   -> run the cache's queued block copies/swaps on the backend -> build the
 *   flattened batch (block tables, slot mapping) -> backend forward ->
 *   sampler -> append tokens, detokenize, stop checks, stream events ->
 *   finished sequences leave the scheduler and release their blocks.
 *
 * It refuses to be clever: no policy lives here. A request with n > 1
 * samples runs its prompt once; when the prompt's last token has logits,
 * the other samples are forked from it (sharing its KV blocks through the
 * cache manager's fork, copy-on-write) and each draws its own first token
 * from the same row.
 */
#include "engine/engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec_verify.h"
#include "util/util.h"

#define ENGINE_WHO "engine"

/* ------------------------------------------------------------ sequences */

static loom_status grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return LOOM_OK;
    int32_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return LOOM_ERR_NOMEM;
    *p = q;
    *cap = n;
    return LOOM_OK;
}

static loom_status seq_reserve(loom_seq *s, int32_t need) {
    loom_status st = grow((void **)&s->tokens, &s->cap, need, sizeof(int32_t));
    s->info.tokens = s->tokens;
    return st;
}

static loom_status seq_push(loom_seq *s, int32_t tok) {
    loom_status st = seq_reserve(s, s->info.num_tokens + 1);
    if (st != LOOM_OK) return st;
    s->tokens[s->info.num_tokens++] = tok;
    return LOOM_OK;
}

void loom_engine_seq_free(loom_seq *s) {
    if (!s) return;
    free(s->tokens);
    free(s->text);
    free(s->spec_q);
    free(s);
}

static loom_seq *seq_new(loom_engine *e, loom_req *rq, int32_t sample_index) {
    loom_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->info.struct_size = sizeof s->info;
    s->info.id = e->next_seq_id++;
    s->info.request_id = rq->id;
    s->info.priority = rq->r.priority;
    s->info.arrival_time = rq->arrival;
    s->info.num_prompt_tokens = rq->prompt_len;
    s->info.max_total_tokens = rq->prompt_len + rq->max_new;
    s->req = rq;
    s->sample_index = sample_index;
    if (seq_reserve(s, rq->prompt_len + 16) != LOOM_OK) {
        loom_engine_seq_free(s);
        return NULL;
    }
    memcpy(s->tokens, rq->prompt, (size_t)rq->prompt_len * sizeof(int32_t));
    s->info.num_tokens = rq->prompt_len;
    uint64_t seed = rq->r.params.has_seed ? rq->r.params.seed + (uint64_t)sample_index * 0x9E3779B97F4A7C15ULL
                                          : e->seed ^ ((uint64_t)s->info.id * 0xD1B54A32D192ED03ULL);
    loom_rng_seed(s->rng, seed);
    if (e->tok) loom_detok_init(&s->detok, e->tok, true);
    return s;
}

static loom_status engine_track_seq(loom_engine *e, loom_seq *s) {
    if (grow((void **)&e->seqs, &e->cap_seqs, e->num_seqs + 1, sizeof(loom_seq *)) != LOOM_OK)
        return LOOM_ERR_NOMEM;
    e->seqs[e->num_seqs++] = s;
    return LOOM_OK;
}

loom_seq *loom_engine_find_seq(loom_engine *e, loom_seq_id id) {
    /* Sequences are appended in id order: binary search. */
    int32_t lo = 0, hi = e->num_seqs - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        loom_seq_id v = e->seqs[mid]->info.id;
        if (v == id) return e->seqs[mid];
        if (v < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

static const loom_seq_info *env_get_seq(void *ctx, loom_seq_id id) {
    loom_seq *s = loom_engine_find_seq(ctx, id);
    return s && !s->finished ? &s->info : NULL;
}

void loom_engine_req_free(loom_req *rq) {
    if (!rq) return;
    if (rq->stop) {
        for (char **p = rq->stop; *p; p++) free(*p);
        free(rq->stop);
    }
    free(rq->prompt);
    free(rq->seqs);
    free((char *)rq->r.system);
    free(rq);
}

/* ---------------------------------------------------------------- events */

static bool append_text(loom_seq *s, const char *piece, size_t n);

static void emit(loom_engine *e, loom_seq *s, int32_t token, const char *text, float logprob,
                 int32_t num_top, const int32_t *top_ids, const float *top_lp,
                 loom_finish_reason finish, const char *error) {
    if (!s->req->r.on_token) return;
    loom_token_event ev = {
        .request_id = s->req->id,
        .sample_index = s->sample_index,
        .token = token,
        .text = text ? text : "",
        .logprob = logprob,
        .num_top = num_top,
        .top_ids = top_ids,
        .top_logprobs = top_lp,
        .finish = finish,
        .error = error,
        .probs = token >= 0 ? s->cur_probs : NULL,
        .vocab = e->vocab,
        .prompt_tokens = s->req->prompt_len,
    };
    s->req->r.on_token(s->req->r.user, &ev);
}

/* Remove finished sequences of finished requests from the tables. */
static void engine_reap(loom_engine *e) {
    int32_t w = 0;
    for (int32_t i = 0; i < e->num_seqs; i++) {
        loom_seq *s = e->seqs[i];
        if (s->finished && s->req->live == 0) continue; /* freed with its request below */
        e->seqs[w++] = s;
    }
    int32_t nseq = w;
    w = 0;
    for (int32_t i = 0; i < e->num_reqs; i++) {
        loom_req *rq = e->reqs[i];
        if (rq->live == 0) {
            for (int32_t k = 0; k < rq->n; k++) loom_engine_seq_free(rq->seqs[k]);
            loom_engine_req_free(rq);
            continue;
        }
        e->reqs[w++] = rq;
    }
    e->num_reqs = w;
    e->num_seqs = nseq;
}

/* The final event of samples from..n-1 of rq, which never ran. */
static void end_unstarted_samples(const loom_req *rq, int32_t from, loom_finish_reason why, const char *error) {
    for (int32_t k = from; k < rq->n && rq->r.on_token; k++) {
        loom_token_event ev = {.request_id = rq->id, .sample_index = k, .token = -1, .text = "",
                               .finish = why, .error = error, .prompt_tokens = rq->prompt_len};
        rq->r.on_token(rq->r.user, &ev);
    }
}

static void seq_finish(loom_engine *e, loom_seq *s, loom_finish_reason why, const char *error) {
    if (s->finished) return;
    s->finished = true;
    e->sch->remove(e->sch_self, s->info.id); /* unknown ids are ignored */
    e->cache->free(e->cache_self, s->info.id);
    if (e->spec) e->spec->release(e->spec_self, s->info.id);
    /* The final event carries what the detokenizer and the stop-string
     * hold-back still had. */
    if (e->tok && why != LOOM_FINISH_STOP) {
        char tail[256];
        size_t n;
        while ((n = loom_detok_flush(&s->detok, tail, sizeof tail)) > 0) append_text(s, tail, n);
    }
    emit(e, s, -1, s->text ? s->text + s->text_emitted : "", 0.0f, 0, NULL, NULL, why, error);
    s->text_emitted = s->text_len;
    loom_req *rq = s->req;
    if (!rq->forked) {
        /* Samples 1..n-1 never started: each ends with the same reason and
         * its own final event (one final event per sample). */
        end_unstarted_samples(rq, 1, why, error);
        rq->live = 0;
    } else {
        rq->live--;
    }
    if (rq->live == 0) {
        pthread_mutex_lock(&e->inbox_mu);
        e->active--;
        pthread_mutex_unlock(&e->inbox_mu);
    }
}

/* ------------------------------------------------------------- requests */

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
    /* Read only the caller's struct_size bytes; later fields keep their defaults. */
    loom_request full = loom_request_default();
    memcpy(&full, req, req->struct_size);
    full.struct_size = sizeof full;
    req = &full;
    loom_req *rq = calloc(1, sizeof *rq);
    if (!rq) {
        loom_error_set(err, LOOM_ERR_NOMEM, "out of memory queueing a request");
        return -1;
    }
    memcpy(&rq->r, req, sizeof *req);
    rq->r.system = loom_strdup(req->system);
    rq->r.prompt = NULL;
    rq->r.tokens = NULL;
    rq->r.messages = NULL;
    rq->n = req->n > 1 ? req->n : 1;
    rq->arrival = loom_now();
    loom_status st = LOOM_OK;

    /* Tokenize here, on the caller's thread: the tokenizer is immutable. */
    if (req->num_messages > 0 && (req->prompt || req->tokens || req->chat || req->system || !req->messages)) {
        st = loom_error_set(err, LOOM_ERR_INVALID,
                            req->messages ? "a request with messages takes no prompt, tokens, chat or system"
                                          : "num_messages is %d but messages is NULL",
                            req->num_messages);
        goto fail;
    } else if (req->num_messages > 0 && (!e->tok || e->chat_none)) {
        st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                            !e->tok ? "this model has no tokenizer (dummy weights): a conversation needs one"
                                    : "this pipeline has no chat template (model.chat_template: none): send "
                                      "the prompt as text instead of messages");
        goto fail;
    } else if (req->num_messages > 0) {
        loom_chat_msg *msgs = calloc((size_t)req->num_messages, sizeof *msgs);
        if (!msgs) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %d messages", req->num_messages);
            goto fail;
        }
        for (int32_t i = 0; i < req->num_messages && st == LOOM_OK; i++) {
            const char *role = req->messages[i].role, *content = req->messages[i].content;
            if (!role || !content || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
                st = loom_error_set(err, LOOM_ERR_INVALID,
                                    "messages[%d]: role '%s' with %s content: roles are system, user and "
                                    "assistant, content is text",
                                    i, role ? role : "(none)", content ? "text" : "no");
            msgs[i] = (loom_chat_msg){role, content};
        }
        char *text = NULL;
        if (st == LOOM_OK) st = loom_chat_apply(e->tok, e->chat_format, msgs, req->num_messages, true, &text, err);
        free(msgs);
        if (st == LOOM_OK)
            st = loom_tokenizer_encode(e->tok, text, strlen(text), false, true, &rq->prompt, &rq->prompt_len, err);
        free(text);
        if (st != LOOM_OK) goto fail;
    } else if (req->prompt && !e->tok) {
        st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                            "this model has no tokenizer (dummy weights): give prompt token ids instead of text");
        goto fail;
    } else if (req->prompt) {
        char *text = NULL;
        const char *src = req->prompt;
        if (req->chat && !e->chat_none) {
            loom_chat_msg msgs[2];
            int32_t nm = 0;
            if (req->system) msgs[nm++] = (loom_chat_msg){"system", req->system};
            msgs[nm++] = (loom_chat_msg){"user", req->prompt};
            st = loom_chat_apply(e->tok, e->chat_format, msgs, nm, true, &text, err);
            if (st != LOOM_OK) goto fail;
            src = text;
        }
        st = loom_tokenizer_encode(e->tok, src, strlen(src), !(req->chat && !e->chat_none) && loom_tokenizer_adds_bos(e->tok),
                                   req->chat && !e->chat_none, &rq->prompt, &rq->prompt_len, err);
        free(text);
        if (st != LOOM_OK) goto fail;
    } else if (req->tokens && req->num_tokens > 0) {
        rq->prompt = malloc((size_t)req->num_tokens * sizeof(int32_t));
        if (!rq->prompt) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %d prompt tokens", req->num_tokens);
            goto fail;
        }
        for (int32_t i = 0; i < req->num_tokens; i++) {
            if (req->tokens[i] < 0 || req->tokens[i] >= e->vocab) {
                st = loom_error_set(err, LOOM_ERR_INVALID,
                                    "prompt token %d at index %d is outside the vocabulary [0, %d)",
                                    req->tokens[i], i, e->vocab);
                goto fail;
            }
            rq->prompt[i] = req->tokens[i];
        }
        rq->prompt_len = req->num_tokens;
    } else {
        st = loom_error_set(err, LOOM_ERR_INVALID, "request has neither a prompt nor prompt tokens");
        goto fail;
    }
    if (rq->prompt_len == 0) {
        st = loom_error_set(err, LOOM_ERR_INVALID, "the prompt encodes to zero tokens: give some text");
        goto fail;
    }
    if (rq->prompt_len >= e->max_model_len) {
        st = loom_error_set(err, LOOM_ERR_INVALID,
                            "prompt is %d tokens but the context holds %d (prompt + at least one new "
                            "token): shorten the prompt or raise engine.max_model_len (model trained to %d)",
                            rq->prompt_len, e->max_model_len, e->mcfg->max_context);
        goto fail;
    }
    int32_t room = e->max_model_len - rq->prompt_len;
    if (req->strict_max_tokens && req->max_tokens > room) {
        st = loom_error_set(err, LOOM_ERR_INVALID,
                            "the context holds %d tokens, but the prompt is %d and max_tokens %d asks for %d "
                            "more: lower max_tokens to at most %d or shorten the prompt",
                            e->max_model_len, rq->prompt_len, req->max_tokens, req->max_tokens, room);
        goto fail;
    }
    rq->max_new = req->max_tokens > 0 && req->max_tokens < room ? req->max_tokens : room;

    /* Sampling parameters are checked by the sampler on first use; the
     * obvious mistakes are caught here so the caller gets them at once. */
    const loom_sampling_params *p = &req->params;
    if (p->struct_size < sizeof(loom_sampling_params) || !(p->temperature >= 0 && isfinite(p->temperature)) ||
        !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0 || !(p->min_p >= 0 && p->min_p <= 1) ||
        !(isfinite(p->repetition_penalty) && p->repetition_penalty > 0) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || p->logprobs < 0 || p->logprobs > LOOM_MAX_LOGPROBS) {
        st = loom_error_set(err, LOOM_ERR_INVALID,
                            "sampling parameters out of range (params.struct_size %u, start from "
                            "loom_sampling_params_default(); temperature %g finite >= 0, top_p %g in (0,1], "
                            "top_k %d >= 0, min_p %g in [0,1], repetition_penalty %g finite > 0, presence/frequency "
                            "penalties %g/%g finite, logprobs %d in [0,%d])",
                            p->struct_size, p->temperature, p->top_p, p->top_k, p->min_p, p->repetition_penalty,
                            p->presence_penalty, p->frequency_penalty, p->logprobs, LOOM_MAX_LOGPROBS);
        goto fail;
    }

    if (req->stop) {
        int32_t ns = 0;
        while (req->stop[ns]) ns++;
        rq->stop = calloc((size_t)ns + 1, sizeof(char *));
        if (!rq->stop) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying stop strings");
            goto fail;
        }
        for (int32_t i = 0; i < ns; i++) {
            rq->stop[i] = loom_strdup(req->stop[i]);
            int32_t l = (int32_t)strlen(req->stop[i]);
            if (l > rq->max_stop_len) rq->max_stop_len = l;
        }
    }
    rq->r.stop = NULL;
    rq->seqs = calloc((size_t)rq->n, sizeof(loom_seq *));
    if (!rq->seqs) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto fail;
    }

    loom_inbox_item *it = calloc(1, sizeof *it);
    if (!it) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    it->req = rq;
    pthread_mutex_lock(&e->inbox_mu);
    rq->id = e->next_req_id++;
    e->active++;
    if (e->inbox_tail) e->inbox_tail->next = it;
    else e->inbox_head = it;
    e->inbox_tail = it;
    int64_t id = rq->id;
    pthread_mutex_unlock(&e->inbox_mu);
    return id;
fail:
    (void)st;
    loom_engine_req_free(rq);
    return -1;
}

loom_status loom_engine_abort(loom_engine *e, int64_t request_id) {
    loom_inbox_item *it = calloc(1, sizeof *it);
    if (!it) return LOOM_ERR_NOMEM;
    it->abort_id = request_id;
    pthread_mutex_lock(&e->inbox_mu);
    if (e->inbox_tail) e->inbox_tail->next = it;
    else e->inbox_head = it;
    e->inbox_tail = it;
    pthread_mutex_unlock(&e->inbox_mu);
    return LOOM_OK;
}

static loom_status sampler_check(loom_engine *e, loom_req *rq, const loom_seq *s, loom_error *err) {
    float *row = calloc((size_t)e->vocab, sizeof(float));
    if (!row) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory checking sampling parameters");
    uint64_t rng[4];
    loom_rng_seed(rng, 1);
    loom_sample_row sr = {&rq->r.params, s->tokens, rq->prompt_len, NULL, 0, rng};
    int32_t tok, top_ids[LOOM_MAX_LOGPROBS];
    float lp, top_lp[LOOM_MAX_LOGPROBS];
    loom_sample_out so = {&tok, &lp, top_ids, top_lp};
    loom_status st = e->smp->sample(e->smp_self, row, e->vocab, &sr, 1, &so, err);
    free(row);
    return st;
}

/* A request that never reached the tables ends here: one ERROR event per
 * sample (its caller may be waiting on them — e.g. an HTTP client), then
 * it no longer counts as active. */
static void fail_unadmitted(loom_engine *e, loom_req *rq, const char *why) {
    end_unstarted_samples(rq, 0, LOOM_FINISH_ERROR, why);
    pthread_mutex_lock(&e->inbox_mu);
    e->active--;
    pthread_mutex_unlock(&e->inbox_mu);
    loom_engine_req_free(rq);
}

/* Admit a queued request. Whatever refuses it (out of memory, the sampler,
 * the scheduler) ends that request alone with an error event: the engine
 * goes on with the others. */
static void admit(loom_engine *e, loom_req *rq, loom_error *err) {
    static const char *const oom = "out of memory admitting the request";
    if (grow((void **)&e->reqs, &e->cap_reqs, e->num_reqs + 1, sizeof(loom_req *)) != LOOM_OK) {
        fail_unadmitted(e, rq, oom);
        return;
    }
    loom_seq *s = seq_new(e, rq, 0);
    if (!s || engine_track_seq(e, s) != LOOM_OK) {
        loom_engine_seq_free(s);
        fail_unadmitted(e, rq, oom);
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
    loom_status st = sampler_check(e, rq, s, err);
    if (st != LOOM_OK) {
        seq_finish(e, s, LOOM_FINISH_ERROR, err ? err->message : "the sampler rejected the request's parameters");
        return;
    }
    st = e->sch->add(e->sch_self, &s->info, err);
    if (st != LOOM_OK) { /* the request ends with an error event; the engine goes on */
        loom_error_prefix(err, "scheduler refused request %lld", (long long)rq->id);
        seq_finish(e, s, LOOM_FINISH_ERROR, err ? err->message : "scheduler refused the request");
    }
}

static void drain_inbox(loom_engine *e, loom_error *err) {
    pthread_mutex_lock(&e->inbox_mu);
    loom_inbox_item *it = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    pthread_mutex_unlock(&e->inbox_mu);
    while (it) {
        loom_inbox_item *next = it->next;
        if (it->req) {
            admit(e, it->req, err);
        } else {
            for (int32_t i = 0; i < e->num_reqs; i++) {
                loom_req *rq = e->reqs[i];
                if (rq->id != it->abort_id || rq->live == 0) continue;
                rq->aborted = true;
                for (int32_t k = 0; k < rq->n; k++)
                    if (rq->seqs[k]) seq_finish(e, rq->seqs[k], LOOM_FINISH_ABORT, NULL);
            }
        }
        free(it);
        it = next;
    }
}

/* ----------------------------------------------------------- the step */

static loom_status ensure_step_buffers(loom_engine *e, int32_t nseq, int32_t ntok, int32_t bt_stride) {
    if (grow((void **)&e->sched_entries, &e->sched_cap, nseq, sizeof(loom_sched_entry)) != LOOM_OK)
        return LOOM_ERR_NOMEM;
    e->preempted = realloc(e->preempted, (size_t)e->sched_cap * sizeof(loom_seq_id));
    e->preempt_modes = realloc(e->preempt_modes, (size_t)e->sched_cap * sizeof(loom_preempt_mode));
    if (!e->preempted || !e->preempt_modes) return LOOM_ERR_NOMEM;
    if (ntok > e->tok_cap) {
        int32_t n = ntok * 2;
        e->tok_ids = realloc(e->tok_ids, (size_t)n * sizeof(int32_t));
        e->positions = realloc(e->positions, (size_t)n * sizeof(int32_t));
        e->slots = realloc(e->slots, (size_t)n * sizeof(int64_t));
        e->logits_index = realloc(e->logits_index, (size_t)n * sizeof(int32_t));
        e->logit_seqs = realloc(e->logit_seqs, (size_t)n * sizeof(loom_seq *));
        if (!e->tok_ids || !e->positions || !e->slots || !e->logits_index || !e->logit_seqs)
            return LOOM_ERR_NOMEM;
        e->tok_cap = n;
    }
    if (nseq + 1 > e->seq_cap) {
        int32_t n = (nseq + 1) * 2;
        e->query_start = realloc(e->query_start, (size_t)n * sizeof(int32_t));
        e->context_len = realloc(e->context_len, (size_t)n * sizeof(int32_t));
        if (!e->query_start || !e->context_len) return LOOM_ERR_NOMEM;
        e->seq_cap = n;
    }
    if ((int64_t)nseq * bt_stride > e->bt_cap) {
        int32_t n = nseq * bt_stride * 2;
        e->block_table = realloc(e->block_table, (size_t)n * sizeof(int32_t));
        if (!e->block_table) return LOOM_ERR_NOMEM;
        e->bt_cap = n;
    }
    return LOOM_OK;
}

/* Run the cache manager's queued copies and swaps, grouped into runs of
 * one kind so the backend sees as few calls as possible, order kept. */
static loom_status run_block_ops(loom_engine *e, loom_error *err) {
    enum { CAP = 256 };
    if (!e->ops) {
        e->ops = malloc(CAP * sizeof(loom_block_op));
        e->pairs = malloc(CAP * 2 * sizeof(int32_t));
        if (!e->ops || !e->pairs) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    }
    int32_t n;
    while ((n = e->cache->take_block_ops(e->cache_self, e->ops, CAP)) > 0) {
        int32_t i = 0;
        while (i < n) {
            int32_t j = i;
            loom_block_op_kind k = e->ops[i].kind;
            while (j < n && e->ops[j].kind == k) {
                e->pairs[2 * (j - i)] = e->ops[j].src;
                e->pairs[2 * (j - i) + 1] = e->ops[j].dst;
                j++;
            }
            loom_status st;
            if (k == LOOM_BLOCK_COPY) {
                st = e->be->copy_blocks(e->be_self, e->pairs, j - i, err);
            } else if (!e->be->swap_blocks) {
                st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                    "the cache manager asked for a swap but the backend cannot swap: "
                                    "set cache.cpu_swap_gib: 0");
            } else {
                st = e->be->swap_blocks(e->be_self, k == LOOM_BLOCK_SWAP_OUT ? LOOM_SWAP_OUT : LOOM_SWAP_IN,
                                        e->pairs, j - i, err);
            }
            if (st != LOOM_OK) return st;
            i = j;
        }
    }
    return LOOM_OK;
}

/* Append generated text and check stop strings; returns true when a stop
 * string matched (the text is cut before it). */
static bool append_text(loom_seq *s, const char *piece, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t c = s->text_cap ? s->text_cap : 256;
        while (c < s->text_len + n + 1) c *= 2;
        char *t = realloc(s->text, c);
        if (!t) return false;
        s->text = t;
        s->text_cap = c;
    }
    memcpy(s->text + s->text_len, piece, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    loom_req *rq = s->req;
    if (!rq->stop) return false;
    /* Only the tail that could contain a new match needs scanning. */
    size_t from = s->text_len > n + (size_t)rq->max_stop_len ? s->text_len - n - (size_t)rq->max_stop_len : 0;
    for (char **p = rq->stop; *p; p++) {
        if (!**p) continue;
        char *hit = strstr(s->text + from, *p);
        if (hit) {
            s->text_len = (size_t)(hit - s->text);
            s->text[s->text_len] = 0;
            return true;
        }
    }
    return false;
}

/* Text not yet streamed, holding back what could still become a stop
 * string, so a stop string is never shown in part. */
static void stream_text(loom_engine *e, loom_seq *s, int32_t token, float lp, int32_t num_top,
                        const int32_t *top_ids, const float *top_lp) {
    if (!s->text) {
        emit(e, s, token, "", lp, num_top, top_ids, top_lp, LOOM_FINISH_NONE, NULL);
        return;
    }
    size_t hold = (size_t)(s->req->max_stop_len > 0 ? s->req->max_stop_len - 1 : 0);
    size_t end = s->text_len > hold ? s->text_len - hold : 0;
    /* Never cut inside a UTF-8 character. */
    while (end > s->text_emitted && end < s->text_len && ((unsigned char)s->text[end] & 0xC0) == 0x80) end--;
    if (end < s->text_emitted) end = s->text_emitted;
    char save = s->text[end];
    s->text[end] = 0;
    emit(e, s, token, s->text + s->text_emitted, lp, num_top, top_ids, top_lp, LOOM_FINISH_NONE, NULL);
    s->text[end] = save;
    s->text_emitted = end;
}

/* One sampled token for s: append, detokenize, stream, check the end. */
static void accept_token(loom_engine *e, loom_seq *s, int32_t tok, float lp, int32_t num_top,
                         const int32_t *top_ids, const float *top_lp) {
    if (seq_push(s, tok) != LOOM_OK) {
        seq_finish(e, s, LOOM_FINISH_ERROR, "out of memory appending a token");
        return;
    }
    s->num_generated++;
    e->stats.generated_tokens++;
    bool eog = e->tok && !s->req->r.ignore_eos && loom_tokenizer_is_eog(e->tok, tok);
    /* Large enough for any piece of real vocabularies (SmolLM2's longest is
     * 81 bytes); a longer one is carried by the detokenizer to the next call. */
    char piece[1024];
    size_t n = eog || !e->tok ? 0 : loom_detok_push(&s->detok, tok, piece, sizeof piece);
    bool stopped = n && append_text(s, piece, n);
    stream_text(e, s, tok, lp, num_top, top_ids, top_lp);
    if (eog || stopped || s->num_generated >= s->req->max_new)
        seq_finish(e, s, eog ? LOOM_FINISH_EOS : stopped ? LOOM_FINISH_STOP : LOOM_FINISH_LENGTH, NULL);
}

/* After the first sample's prompt has logits: make samples 1..n-1 share its
 * blocks and give each its own first token from the same row. */
static loom_status fork_samples(loom_engine *e, loom_seq *parent, const float *row_logits, loom_error *err) {
    loom_req *rq = parent->req;
    rq->forked = true;
    for (int32_t k = 1; k < rq->n; k++) {
        loom_seq *c = seq_new(e, rq, k);
        if (!c || engine_track_seq(e, c) != LOOM_OK) {
            loom_engine_seq_free(c);
            return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory forking sample %d", k);
        }
        rq->seqs[k] = c;
        rq->live++;
        c->info.num_computed = parent->info.num_computed;
        loom_status st = e->cache->fork(e->cache_self, parent->info.id, c->info.id, err);
        if (st != LOOM_OK) return st;
        st = e->sch->add(e->sch_self, &c->info, err);
        if (st != LOOM_OK) return st;
        /* Its own draw from the prompt's distribution. */
        float *row = malloc((size_t)e->vocab * sizeof(float));
        if (!row) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        memcpy(row, row_logits, (size_t)e->vocab * sizeof(float));
        loom_sample_row sr = {&rq->r.params, c->tokens, c->info.num_prompt_tokens, NULL, 0, c->rng};
        int32_t tok;
        float lp;
        int32_t top_ids[LOOM_MAX_LOGPROBS];
        float top_lp[LOOM_MAX_LOGPROBS];
        loom_sample_out out = {&tok, &lp, top_ids, top_lp};
        st = e->smp->sample(e->smp_self, row, e->vocab, &sr, 1, &out, err);
        free(row);
        if (st != LOOM_OK) return st;
        accept_token(e, c, tok, lp, rq->r.params.logprobs, top_ids, top_lp);
    }
    return LOOM_OK;
}

/* Scratch rows for verification and want_probs, grown as needed. */
static float *scratch_rows(loom_engine *e, int32_t rows) {
    size_t need = (size_t)rows * (size_t)e->vocab;
    if (need > e->scratch_cap) {
        float *p = realloc(e->scratch, need * sizeof(float));
        if (!p) return NULL;
        e->scratch = p;
        e->scratch_cap = need;
    }
    return e->scratch;
}

/* The sampler's row for s, with the output history as of token `upto`. */
static loom_sample_row sample_row(loom_seq *s, int32_t upto) {
    return (loom_sample_row){&s->req->r.params, s->tokens, s->info.num_prompt_tokens,
                             s->tokens + s->info.num_prompt_tokens, upto - s->info.num_prompt_tokens, s->rng};
}

/* log-softmax of one raw logits row at `tok`. */
static float raw_logprob(const float *row, int32_t vocab, int32_t tok) {
    float mx = row[0];
    for (int32_t v = 1; v < vocab; v++)
        if (row[v] > mx) mx = row[v];
    double z = 0;
    for (int32_t v = 0; v < vocab; v++) z += exp((double)row[v] - mx);
    return (float)((double)row[tok] - mx - log(z));
}

/* The n (<= LOOM_MAX_LOGPROBS) most likely entries of one raw logits row
 * under its log-softmax, best first, ties to the lower id (as the sampler
 * reports them): top logprobs for tokens that come from verification. */
static int32_t raw_top(const float *row, int32_t vocab, int32_t n, int32_t *ids, float *lps) {
    if (n > LOOM_MAX_LOGPROBS) n = LOOM_MAX_LOGPROBS;
    if (n > vocab) n = vocab;
    float mx = row[0];
    for (int32_t v = 1; v < vocab; v++)
        if (row[v] > mx) mx = row[v];
    double z = 0;
    for (int32_t v = 0; v < vocab; v++) z += exp((double)row[v] - mx);
    double lz = log(z);
    int32_t k = 0;
    for (int32_t v = 0; v < vocab && n > 0; v++) {
        float x = row[v];
        if (k == n && !(x > row[ids[k - 1]])) continue;
        int32_t j = k < n ? k++ : n - 1;
        while (j > 0 && x > row[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
    for (int32_t i = 0; i < k; i++) lps[i] = (float)((double)row[ids[i]] - mx - lz);
    return k;
}

/* log(sum exp) of n floats, in double. */
static double row_lse(const float *x, int32_t n) {
    double mx = -INFINITY, z = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (!(mx > -INFINITY)) return mx;
    for (int32_t i = 0; i < n; i++) z += exp((double)x[i] - mx);
    return mx + log(z);
}

/* Sample rows [0, nlog) of `logits` (width floats each), one per sequence
 * in seqs. Whole rows: width == vocab, ids == NULL. Candidate rows from
 * forward_topk: width == k, ids (nlog, k) map a column to its token and
 * lse (nlog) is each whole row's log-sum-exp, which turns the sampler's
 * logprobs over the candidates into logprobs over the vocabulary. */
static loom_status sample_plain(loom_engine *e, float *logits, int32_t width, loom_seq **seqs, int32_t nlog,
                                const int32_t *ids, const float *lse, loom_error *err) {
    loom_status st = LOOM_OK;
    size_t need = (size_t)nlog * (size_t)width;
    {
        loom_sample_row *rows = calloc((size_t)nlog, sizeof *rows);
        int32_t *toks = malloc((size_t)nlog * sizeof(int32_t));
        float *lps = malloc((size_t)nlog * sizeof(float));
        int32_t *top_ids = malloc((size_t)nlog * LOOM_MAX_LOGPROBS * sizeof(int32_t));
        float *top_lp = malloc((size_t)nlog * LOOM_MAX_LOGPROBS * sizeof(float));
        float *first_rows = NULL;
        if (!rows || !toks || !lps || !top_ids || !top_lp) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory sampling %d rows", nlog);
            goto sample_done;
        }
        /* Rows of requests about to fork: keep the raw logits, since the
         * sampler may modify them in place. */
        for (int32_t r = 0; r < nlog && ids; r++)
            if (!seqs[r]->req->forked || seqs[r]->req->r.want_probs) {
                st = loom_error_set(err, LOOM_ERR_INTERNAL,
                                    "engine: a row that needs whole logits was reduced to candidates");
                goto sample_done;
            }
        for (int32_t r = 0; r < nlog; r++) {
            loom_seq *s = seqs[r];
            if (!s->req->forked && !first_rows) {
                first_rows = malloc(need * sizeof(float));
                if (!first_rows) {
                    st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
                    goto sample_done;
                }
                memcpy(first_rows, logits, need * sizeof(float));
            }
            rows[r] = (loom_sample_row){&s->req->r.params, s->tokens, s->info.num_prompt_tokens,
                                        s->tokens + s->info.num_prompt_tokens,
                                        s->info.num_tokens - s->info.num_prompt_tokens, s->rng};
        }
        /* Requests that want the distribution (draft engines) get the
         * sampler's probs() of the raw row, computed before sampling. */
        float *probs = NULL;
        int32_t nwant = 0;
        for (int32_t r = 0; r < nlog; r++) nwant += seqs[r]->req->r.want_probs;
        if (nwant) {
            probs = scratch_rows(e, nlog);
            if (!probs) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
                goto sample_done;
            }
            for (int32_t r = 0; r < nlog; r++) {
                if (!seqs[r]->req->r.want_probs) continue;
                float *pr = probs + (size_t)r * e->vocab;
                memcpy(pr, logits + (size_t)r * width, (size_t)e->vocab * sizeof(float));
                st = e->smp->probs(e->smp_self, pr, e->vocab, &rows[r], err);
                if (st != LOOM_OK) goto sample_done;
            }
        }
        /* The full-vocabulary log-softmax is only paid for when some
         * request asked for logprobs (at 128k vocab it costs more than a
         * decode step's GPU time at large batch). */
        bool want_lp = false;
        for (int32_t r = 0; r < nlog; r++) want_lp |= seqs[r]->req->r.params.logprobs > 0;

        for (int32_t r = 0; r < nlog; r++) lps[r] = 0.0f;
        loom_sample_out so = {toks, want_lp ? lps : NULL, want_lp ? top_ids : NULL, want_lp ? top_lp : NULL};
        /* Candidate rows: what turns the sampler's logprobs over the k
         * candidates into logprobs over the vocabulary (before sample(),
         * which may rewrite the rows). */
        float *corr = NULL;
        if (ids && want_lp) {
            corr = malloc((size_t)nlog * sizeof(float));
            if (!corr) {
                st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
                goto sample_done;
            }
            for (int32_t r = 0; r < nlog; r++)
                corr[r] = (float)(row_lse(logits + (size_t)r * width, width) - (double)lse[r]);
        }
        st = e->smp->sample(e->smp_self, logits, width, rows, nlog, &so, err);
        if (st != LOOM_OK) {
            free(corr);
            loom_error_prefix(err, "sampler");
            goto sample_done;
        }
        if (ids) {
            for (int32_t r = 0; r < nlog; r++) {
                const int32_t *map = ids + (size_t)r * width;
                toks[r] = map[toks[r]];
                if (!corr) continue;
                lps[r] += corr[r];
                int32_t ntop = seqs[r]->req->r.params.logprobs < width ? seqs[r]->req->r.params.logprobs : width;
                for (int32_t j = 0; j < ntop; j++) {
                    int32_t *tid = top_ids + (size_t)r * LOOM_MAX_LOGPROBS + j;
                    if (*tid >= 0 && *tid < width) *tid = map[*tid];
                    top_lp[(size_t)r * LOOM_MAX_LOGPROBS + j] += corr[r];
                }
            }
            free(corr);
        }
        for (int32_t r = 0; r < nlog && st == LOOM_OK; r++) {
            loom_seq *s = seqs[r];
            int32_t ntop = s->req->r.params.logprobs;
            /* Fork before sample 0 takes its token, so every sample starts
             * from the prompt alone. */
            if (!s->req->forked) st = fork_samples(e, s, first_rows + (size_t)r * width, err);
            if (st != LOOM_OK) break;
            s->cur_probs = probs && s->req->r.want_probs ? probs + (size_t)r * e->vocab : NULL;
            accept_token(e, s, toks[r], lps[r], ntop, top_ids + (size_t)r * LOOM_MAX_LOGPROBS,
                         top_lp + (size_t)r * LOOM_MAX_LOGPROBS);
            s->cur_probs = NULL;
        }
    sample_done:
        free(rows);
        free(toks);
        free(lps);
        free(top_ids);
        free(top_lp);
        free(first_rows);
        if (st != LOOM_OK) return st;
    }

    return st;
}

/* Whether s's next token needs its whole logits row rather than the top
 * k candidates: the first token of an n > 1 request (its forks start from
 * the raw row), draft engines (want_probs), penalties (they move any
 * token), and sampling not bounded by top_k <= k. */
static bool needs_whole_row(const loom_seq *s, int32_t k) {
    const loom_req *rq = s->req;
    const loom_sampling_params *p = &rq->r.params;
    if (!rq->forked || rq->r.want_probs) return true;
    if (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f)
        return true;
    /* drafts: greedy verification needs each row's argmax only; sampled
     * verification needs the whole distribution p (and the draft's q) */
    if (s->info.num_draft > 0) return p->temperature != 0.0f;
    return p->temperature != 0.0f && !(p->top_k > 0 && p->top_k <= k);
}

/* Room for `rows` forward_topk rows of k candidates. */
static loom_status topk_reserve(loom_engine *e, int32_t rows, int32_t k, loom_error *err) {
    if (rows <= e->top_cap) return LOOM_OK;
    int32_t cap = rows > 2 * e->top_cap ? rows : 2 * e->top_cap;
    int32_t *ids = realloc(e->top_ids, (size_t)cap * (size_t)k * sizeof *ids);
    if (ids) e->top_ids = ids;
    float *vals = realloc(e->top_vals, (size_t)cap * (size_t)k * sizeof *vals);
    if (vals) e->top_vals = vals;
    float *lse = realloc(e->top_lse, (size_t)cap * sizeof *lse);
    if (lse) e->top_lse = lse;
    uint8_t *wf = realloc(e->want_full, (size_t)cap);
    if (wf) e->want_full = wf;
    loom_seq **sq = realloc(e->top_seqs, (size_t)cap * sizeof *sq);
    if (sq) e->top_seqs = sq;
    if (!ids || !vals || !lse || !wf || !sq)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for %d candidate rows", rows);
    e->top_cap = cap;
    return LOOM_OK;
}

/* A sequence decoding this step: exactly one token not yet computed, no
 * drafts yet, past its first generated token. */
static bool spec_decoding(const loom_seq *s) {
    return !s->finished && s->info.num_draft == 0 && s->info.num_computed == s->info.num_tokens - 1 &&
           s->num_generated > 0;
}

/* Room for propose_batch's arguments for n sequences (one block). */
typedef struct spec_args {
    loom_seq **seqs;
    const loom_seq_info **infos;
    const loom_sampling_params **params;
    int32_t **draft;
    float **q;
    int32_t *max_k, *q_valid, *num;
} spec_args;

static loom_status spec_args_get(loom_engine *e, int32_t n, spec_args *a) {
    const size_t per = 5 * sizeof(void *) + 3 * sizeof(int32_t);
    if (n > e->spec_cap) {
        void *b = realloc(e->spec_buf, (size_t)n * per);
        if (!b) return LOOM_ERR_NOMEM;
        e->spec_buf = b;
        e->spec_cap = n;
    }
    char *p = e->spec_buf;
    const size_t c = (size_t)e->spec_cap;
    a->seqs = (loom_seq **)(void *)p, p += c * sizeof(void *);
    a->infos = (const loom_seq_info **)(void *)p, p += c * sizeof(void *);
    a->params = (const loom_sampling_params **)(void *)p, p += c * sizeof(void *);
    a->draft = (int32_t **)(void *)p, p += c * sizeof(void *);
    a->q = (float **)(void *)p, p += c * sizeof(void *);
    a->max_k = (int32_t *)(void *)p, p += c * sizeof(int32_t);
    a->q_valid = (int32_t *)(void *)p, p += c * sizeof(int32_t);
    a->num = (int32_t *)(void *)p;
    return LOOM_OK;
}

/* Append the n drafts the speculator wrote after s's tokens (at most max_k). */
static loom_status spec_take(loom_engine *e, loom_seq *s, int32_t n, int32_t max_k, int32_t q_valid,
                             loom_error *err) {
    if (n <= 0) return LOOM_OK;
    if (n > max_k) n = max_k;
    for (int32_t d = 0; d < n; d++)
        if (s->tokens[s->info.num_tokens + d] < 0 || s->tokens[s->info.num_tokens + d] >= e->vocab)
            return loom_error_set(err, LOOM_ERR_INVALID, "speculator proposed token %d outside the vocabulary",
                                  s->tokens[s->info.num_tokens + d]);
    s->info.num_tokens += n;
    s->info.num_draft = n;
    s->spec_q_valid = q_valid != 0;
    e->stats.spec_proposed += n;
    return LOOM_OK;
}

/* Before scheduling: ask the speculator for drafts for every sequence that
 * is decoding (exactly one token not yet computed) and append them — in one
 * propose_batch call when the speculator has it, else one propose() per
 * sequence. */
static loom_status spec_propose(loom_engine *e, loom_error *err) {
    int32_t decoding = 0;
    for (int32_t i = 0; i < e->num_seqs; i++) decoding += spec_decoding(e->seqs[i]);
    if (decoding == 0) return LOOM_OK;
    int32_t k = e->spec->plan(e->spec_self, decoding);
    if (k <= 0) return LOOM_OK;
    spec_args a = {0};
    if (e->spec_batch && spec_args_get(e, decoding, &a) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for drafts");
    /* Drafts use only KV blocks free now, after one block per decoding
     * sequence is set aside for its real token: speculation must never make
     * the scheduler preempt (or fail) a sequence that runs without it.
     *
     * One sequence at a time (propose), each sequence's cap comes out of
     * what the sequences before it really drafted. A batch (propose_batch)
     * is capped before anyone drafts, so each sequence is charged the blocks
     * its whole max_k would take: the drafts of all of them together then
     * fit the spare blocks whatever each returns (fewer drafts only leave
     * blocks unused this step). Charging the actual counts instead could
     * hand the same spare block to two sequences. */
    const int32_t bs = e->layout.block_size;
    int64_t spare = (int64_t)e->cache->num_free_blocks(e->cache_self) - decoding;
    int32_t nb = 0;
    for (int32_t i = 0; i < e->num_seqs; i++) {
        loom_seq *s = e->seqs[i];
        if (!spec_decoding(s)) continue;
        /* Drafts must leave room for the token verification adds. */
        int32_t room_new = s->req->max_new - s->num_generated - 1;
        int32_t room_ctx = e->max_model_len - s->info.num_tokens - 1;
        int32_t max_k = k < room_new ? k : room_new;
        if (room_ctx < max_k) max_k = room_ctx;
        /* Slots left in the sequence's last block, then whole spare blocks. */
        int32_t slack = (bs - s->info.num_tokens % bs) % bs;
        int64_t fit = slack + (spare > 0 ? spare * bs : 0);
        if (fit < max_k) max_k = (int32_t)fit;
        if (max_k <= 0) continue;
        if (seq_reserve(s, s->info.num_tokens + max_k) != LOOM_OK)
            return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for drafts");
        size_t qn = (size_t)max_k * (size_t)e->vocab;
        if (qn > s->spec_q_cap) {
            float *q = realloc(s->spec_q, qn * sizeof(float));
            if (!q) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for draft distributions");
            s->spec_q = q;
            s->spec_q_cap = qn;
        }
        if (e->spec_batch) {
            if (max_k > slack) spare -= (max_k - slack + bs - 1) / bs;
            a.seqs[nb] = s;
            a.infos[nb] = &s->info;
            a.params[nb] = &s->req->r.params;
            a.max_k[nb] = max_k;
            a.draft[nb] = s->tokens + s->info.num_tokens;
            a.q[nb] = s->spec_q;
            a.q_valid[nb] = 0;
            a.num[nb] = 0;
            nb++;
            continue;
        }
        int32_t q_valid = 0;
        int32_t n = e->spec->propose(e->spec_self, &s->info, &s->req->r.params, max_k,
                                     s->tokens + s->info.num_tokens, s->spec_q, &q_valid);
        if (n <= 0) continue;
        if (n > max_k) n = max_k;
        loom_status st = spec_take(e, s, n, max_k, q_valid, err);
        if (st != LOOM_OK) return st;
        if (n > slack) spare -= (n - slack + bs - 1) / bs;
    }
    if (nb == 0) return LOOM_OK;
    e->spec->propose_batch(e->spec_self, nb, a.infos, a.params, a.max_k, a.draft, a.q, a.q_valid, a.num);
    for (int32_t i = 0; i < nb; i++) {
        loom_status st = spec_take(e, a.seqs[i], a.num[i], a.max_k[i], a.q_valid[i], err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* Drop a sequence's drafts, keeping what was computed of its real tokens. */
static void spec_drop(loom_engine *e, loom_seq *s) {
    int32_t real = s->info.num_tokens - s->info.num_draft;
    s->info.num_tokens = real;
    s->info.num_draft = 0;
    /* The last real token is recomputed so it gets logits again. */
    if (s->info.num_computed > real - 1) s->info.num_computed = real - 1;
    e->cache->truncate(e->cache_self, &s->info, s->info.num_computed);
}

/* After verifying s's n drafts: tell the speculator, count, and roll the
 * sequence back to its real tokens plus the `accepted` drafts, whose K/V
 * stay (the rest of the drafts' slots are freed). The caller then appends
 * the accepted tokens and the target's own. */
static void spec_settle(loom_engine *e, loom_seq *s, int32_t n, int32_t accepted) {
    const int32_t real = s->info.num_tokens - n;
    e->spec->observe(e->spec_self, s->info.id, n, accepted);
    e->stats.spec_accepted += accepted;
    s->info.num_tokens = real;
    s->info.num_draft = 0;
    s->info.num_computed = real + accepted;
    e->cache->truncate(e->cache_self, &s->info, s->info.num_computed);
}

/* After the forward: verify s's drafts against rows (num_draft + 1, vocab)
 * of raw logits and append what was accepted plus one token. */
static loom_status spec_accept(loom_engine *e, loom_seq *s, const float *rows, loom_error *err) {
    int32_t n = s->info.num_draft;
    int32_t real = s->info.num_tokens - n;
    float *p = scratch_rows(e, n + 1);
    int32_t *out = malloc((size_t)(n + 1) * 2 * sizeof(int32_t));
    if (!p || !out) {
        free(out);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory verifying drafts");
    }
    int32_t *draft = out + n + 1;
    memcpy(draft, s->tokens + real, (size_t)n * sizeof(int32_t));
    /* p_i: what the sampler would draw from after real tokens + drafts[0..i). */
    memcpy(p, rows, (size_t)(n + 1) * e->vocab * sizeof(float));
    for (int32_t i = 0; i <= n; i++) {
        loom_sample_row sr = sample_row(s, real + i);
        loom_status st = e->smp->probs(e->smp_self, p + (size_t)i * e->vocab, e->vocab, &sr, err);
        if (st != LOOM_OK) {
            free(out);
            loom_error_prefix(err, "sampler probs");
            return st;
        }
    }
    int32_t accepted = 0;
    int32_t m = loom_spec_verify(p, s->spec_q_valid ? s->spec_q : NULL, draft, n, e->vocab, s->rng, out, &accepted);
    spec_settle(e, s, n, accepted);
    for (int32_t i = 0; i < m && !s->finished; i++) {
        const float *row = rows + (size_t)i * e->vocab;
        s->cur_probs = s->req->r.want_probs ? p + (size_t)i * e->vocab : NULL;
        int32_t top_ids[LOOM_MAX_LOGPROBS];
        float top_lp[LOOM_MAX_LOGPROBS];
        int32_t nt = s->req->r.params.logprobs > 0
                         ? raw_top(row, e->vocab, s->req->r.params.logprobs, top_ids, top_lp) : 0;
        accept_token(e, s, out[i], s->req->r.params.logprobs > 0 ? raw_logprob(row, e->vocab, out[i]) : 0.0f, nt,
                     top_ids, top_lp);
    }
    s->cur_probs = NULL;
    if (!s->finished) s->info.num_computed = s->info.num_tokens - 1;
    free(out);
    return LOOM_OK;
}

/* Greedy verification from forward_topk candidates (ids/vals: (n + 1, k)
 * rows, lse: (n + 1)): a draft is accepted while it is its row's argmax,
 * then the argmax of the first rejected (or the bonus) row is appended —
 * what spec_accept computes for greedy rows, without whole rows. */
static loom_status spec_accept_greedy(loom_engine *e, loom_seq *s, const int32_t *ids, const float *vals,
                                      const float *lse, int32_t k) {
    const int32_t n = s->info.num_draft, real = s->info.num_tokens - n;
    int32_t a = 0;
    while (a < n && s->tokens[real + a] == ids[(size_t)a * k]) a++;
    const int32_t m = a + 1;
    spec_settle(e, s, n, a);
    const int32_t ntop = s->req->r.params.logprobs < k ? s->req->r.params.logprobs : k;
    for (int32_t i = 0; i < m && !s->finished; i++) {
        const int32_t *ri = ids + (size_t)i * k;
        const float *rv = vals + (size_t)i * k;
        int32_t top_ids[LOOM_MAX_LOGPROBS];
        float top_lp[LOOM_MAX_LOGPROBS];
        for (int32_t j = 0; j < ntop; j++) top_ids[j] = ri[j], top_lp[j] = rv[j] - lse[i];
        accept_token(e, s, ri[0], s->req->r.params.logprobs > 0 ? rv[0] - lse[i] : 0.0f, ntop, top_ids,
                     top_lp);
    }
    if (!s->finished) s->info.num_computed = s->info.num_tokens - 1;
    return LOOM_OK;
}

loom_status loom_engine_step(loom_engine *e, int32_t *active, loom_error *err) {
    drain_inbox(e, err);
    loom_status st = LOOM_OK;

    int32_t live = 0;
    for (int32_t i = 0; i < e->num_seqs; i++) live += !e->seqs[i]->finished;
    if (live == 0) {
        engine_reap(e);
        goto done;
    }

    double t0 = loom_now();
    if (e->spec && (st = spec_propose(e, err)) != LOOM_OK) return st;
    int32_t bt_stride = (e->max_model_len + e->layout.block_size - 1) / e->layout.block_size;
    if (ensure_step_buffers(e, e->num_seqs, 1, bt_stride) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory growing step buffers");

    loom_sched_output out = {
        .struct_size = sizeof out,
        .capacity = e->sched_cap,
        .scheduled = e->sched_entries,
        .preempted = e->preempted,
        .preempt_mode = e->preempt_modes,
    };
    loom_sched_env env = {
        .struct_size = sizeof env,
        .ctx = e,
        .get_seq = env_get_seq,
        .cache = e->cache,
        .cache_self = e->cache_self,
        .now = t0,
    };
    st = e->sch->schedule(e->sch_self, &env, &out, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "scheduler");
        return st;
    }
    for (int32_t i = 0; i < out.num_preempted; i++) {
        loom_seq *s = loom_engine_find_seq(e, out.preempted[i]);
        if (!s) continue;
        e->stats.preemptions++;
        if (out.preempt_mode[i] == LOOM_PREEMPT_RECOMPUTE) {
            s->info.num_computed = 0;
            if (s->info.num_draft) spec_drop(e, s);
        }
    }
    if (out.num_scheduled == 0 && out.num_preempted > 0) {
        /* Nothing runs this step, but blocks were freed: the next schedule()
         * sees a different cache (the scheduler re-admits next step). */
        goto done;
    }
    if (out.num_scheduled == 0) {
        /* Work is waiting, nothing can run and nothing was freed: the cache
         * cannot hold even one sequence. Fail the oldest waiting request
         * rather than hang. */
        for (int32_t i = 0; i < e->num_seqs; i++) {
            loom_seq *s = e->seqs[i];
            if (s->finished) continue;
            char msg[LOOM_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg,
                     "no progress possible: the KV cache (%d blocks of %d tokens) cannot hold this "
                     "sequence of %d tokens; give the cache more memory or lower engine.max_model_len",
                     e->layout.num_blocks, e->layout.block_size, s->info.num_tokens);
            seq_finish(e, s, LOOM_FINISH_ERROR, msg);
            break;
        }
        engine_reap(e);
        goto done;
    }

    st = run_block_ops(e, err);
    if (st != LOOM_OK) return st;

    /* Flatten the batch. A sequence that catches up gets logits for its
     * last token, or for its last token and every draft after it. */
    int32_t ntok = 0;
    for (int32_t i = 0; i < out.num_scheduled; i++) ntok += out.scheduled[i].num_tokens;
    if (ensure_step_buffers(e, out.num_scheduled, ntok, bt_stride) != LOOM_OK)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory growing step buffers");
    int32_t t = 0, nlog = 0;
    bool any_decode = false;
    for (int32_t i = 0; i < out.num_scheduled; i++) {
        const loom_sched_entry *en = &out.scheduled[i];
        loom_seq *s = loom_engine_find_seq(e, en->seq);
        if (!s || s->finished || en->num_tokens <= 0 || en->num_computed < 0 ||
            en->num_computed + en->num_tokens > s->info.num_tokens)
            return loom_error_set(err, LOOM_ERR_INTERNAL,
                                  "scheduler entry %d (seq %lld, tokens [%d, %d)) does not fit the sequence",
                                  i, (long long)en->seq, en->num_computed, en->num_computed + en->num_tokens);
        int32_t *row = e->block_table + (size_t)i * bt_stride;
        int32_t nb = e->cache->block_table(e->cache_self, s->info.id, row, bt_stride);
        int32_t end = en->num_computed + en->num_tokens;
        if (nb * e->layout.block_size < end)
            return loom_error_set(err, LOOM_ERR_INTERNAL,
                                  "seq %lld has %d blocks for %d tokens: the scheduler did not allocate",
                                  (long long)s->info.id, nb, end);
        for (int32_t k = nb; k < bt_stride; k++) row[k] = -1;
        e->query_start[i] = t;
        e->context_len[i] = end;
        if (!s->prefix_counted && s->sample_index == 0) {
            /* First schedule of the prompt: what it starts with came from the prefix cache. */
            s->prefix_counted = true;
            e->stats.cached_prompt_tokens += en->num_computed < s->info.num_prompt_tokens ? en->num_computed
                                                                                         : s->info.num_prompt_tokens;
        }
        if (en->num_computed >= s->info.num_prompt_tokens) any_decode = true;
        if (en->num_computed < s->info.num_prompt_tokens)
            e->stats.prefill_tokens += (end < s->info.num_prompt_tokens ? end : s->info.num_prompt_tokens) -
                                       en->num_computed;
        for (int32_t p = en->num_computed; p < end; p++, t++) {
            e->tok_ids[t] = s->tokens[p];
            e->positions[t] = p;
            e->slots[t] = (int64_t)row[p / e->layout.block_size] * e->layout.block_size + p % e->layout.block_size;
        }
        if (end == s->info.num_tokens) {
            int32_t rows = 1 + s->info.num_draft; /* end == num_tokens: all drafts are in this step */
            for (int32_t r = 0; r < rows; r++) {
                e->logits_index[nlog] = t - rows + r;
                e->logit_seqs[nlog] = s;
                nlog++;
            }
        }
    }
    e->query_start[out.num_scheduled] = t;

    size_t need = (size_t)nlog * (size_t)e->vocab;
    if (need > e->logits_cap) {
        float *l = realloc(e->logits, need * sizeof(float));
        if (!l) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for %d logits rows", nlog);
        e->logits = l;
        e->logits_cap = need;
    }
    loom_batch batch = {
        .struct_size = sizeof batch,
        .num_seqs = out.num_scheduled,
        .num_tokens = ntok,
        .token_ids = e->tok_ids,
        .positions = e->positions,
        .query_start = e->query_start,
        .context_len = e->context_len,
        .block_table = e->block_table,
        .block_table_stride = bt_stride,
        .slot_mapping = e->slots,
        .num_logits = nlog,
        .logits_index = e->logits_index,
    };
    /* Rows the sampler can draw from exactly given the top k candidates
     * and the log-sum-exp are reduced on the backend's device; the rest
     * (and every row of a step that verifies drafts) come back whole. */
    const int32_t kmax = e->vocab < LOOM_LOGITS_TOPK_MAX ? e->vocab : LOOM_LOGITS_TOPK_MAX;
    bool use_topk = e->device_sampling && nlog > 0;
    int32_t topk = 0; /* candidates per row: what the most demanding row needs */
    if (use_topk) {
        if ((st = topk_reserve(e, nlog, kmax, err))) return st;
        for (int32_t r = 0; r < nlog; r++) {
            const loom_seq *s = e->logit_seqs[r];
            e->want_full[r] = needs_whole_row(s, kmax);
            if (e->want_full[r]) continue;
            const loom_sampling_params *sp = &s->req->r.params;
            int32_t need = sp->temperature != 0.0f ? sp->top_k : 1;
            if (sp->logprobs > need) need = sp->logprobs;
            if (need > topk) topk = need < kmax ? need : kmax;
        }
        use_topk = topk > 0;
    }
    const double tf = loom_now();
    if (use_topk) {
        loom_logits_topk o = {sizeof o, topk, e->top_ids, e->top_vals, e->top_lse, e->want_full, e->logits};
        st = e->be->forward_topk(e->be_self, &batch, &o, err);
    } else {
        st = e->be->forward(e->be_self, &batch, e->logits, err);
    }
    e->stats.backend_seconds += loom_now() - tf;
    if (st != LOOM_OK) {
        loom_error_prefix(err, "backend forward (%d sequences, %d tokens)", out.num_scheduled, ntok);
        return st;
    }
    for (int32_t i = 0; i < out.num_scheduled; i++) {
        loom_seq *s = loom_engine_find_seq(e, out.scheduled[i].seq);
        s->info.num_computed = out.scheduled[i].num_computed + out.scheduled[i].num_tokens;
        /* Drafts whose verification rows were not all computed are dropped. */
        if (s->info.num_draft && (s->info.num_computed < s->info.num_tokens ||
                                  out.scheduled[i].num_tokens < 1 + s->info.num_draft))
            spec_drop(e, s);
    }

    /* Verify sequences with drafts one by one; sample all other rows in
     * one call for whole rows and one for candidate rows. */
    int32_t nplain = 0, ncand = 0;
    for (int32_t r = 0; r < nlog;) {
        loom_seq *s = e->logit_seqs[r];
        int32_t rows = 1 + s->info.num_draft;
        if (s->info.num_draft && use_topk && !e->want_full[r]) {
            st = spec_accept_greedy(e, s, e->top_ids + (size_t)r * topk, e->top_vals + (size_t)r * topk,
                                    e->top_lse + r, topk);
            if (st != LOOM_OK) return st;
        } else if (s->info.num_draft) {
            st = spec_accept(e, s, e->logits + (size_t)r * e->vocab, err);
            if (st != LOOM_OK) return st;
        } else if (use_topk && !e->want_full[r]) {
            /* Compact candidate rows to the front, keeping their order. */
            if (ncand != r) {
                memmove(e->top_ids + (size_t)ncand * topk, e->top_ids + (size_t)r * topk,
                        (size_t)topk * sizeof(int32_t));
                memmove(e->top_vals + (size_t)ncand * topk, e->top_vals + (size_t)r * topk,
                        (size_t)topk * sizeof(float));
                e->top_lse[ncand] = e->top_lse[r];
            }
            e->top_seqs[ncand++] = s;
        } else {
            /* Compact plain rows to the front, keeping their order. */
            if (nplain != r) {
                memmove(e->logits + (size_t)nplain * e->vocab, e->logits + (size_t)r * e->vocab,
                        (size_t)e->vocab * sizeof(float));
                e->logit_seqs[nplain] = s;
            }
            nplain++;
        }
        r += rows;
    }
    if (nplain > 0) {
        st = sample_plain(e, e->logits, e->vocab, e->logit_seqs, nplain, NULL, NULL, err);
        if (st != LOOM_OK) return st;
    }
    if (ncand > 0) {
        e->stats.device_sampled_rows += ncand;
        st = sample_plain(e, e->top_vals, topk, e->top_seqs, ncand, e->top_ids, e->top_lse, err);
        if (st != LOOM_OK) return st;
    }

    double dt = loom_now() - t0;
    if (any_decode) e->stats.decode_seconds += dt;
    else e->stats.prefill_seconds += dt;
    e->stats.steps++;
    if (out.num_scheduled > e->stats.max_running) e->stats.max_running = out.num_scheduled;
    engine_reap(e);
done:
    if (active) {
        pthread_mutex_lock(&e->inbox_mu);
        *active = e->active;
        pthread_mutex_unlock(&e->inbox_mu);
    }
    return LOOM_OK;
}

loom_status loom_engine_score(loom_engine *e, const int32_t *tokens, int32_t n, float *logprobs,
                              loom_error *err) {
    pthread_mutex_lock(&e->inbox_mu);
    int32_t active = e->active;
    pthread_mutex_unlock(&e->inbox_mu);
    if (active > 0)
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: %d requests are still running", active);
    if (n < 1 || n > e->max_model_len)
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: %d tokens do not fit the context (1..%d)",
                              n, e->max_model_len);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->vocab)
            return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_score: token %d at %d outside [0, %d)",
                                  tokens[i], i, e->vocab);
    loom_seq_info info = {
        .struct_size = sizeof info,
        .id = e->next_seq_id++,
        .request_id = -1,
        .num_prompt_tokens = n,
        .num_tokens = n,
        .max_total_tokens = n,
        .tokens = tokens,
    };
    loom_status st = e->cache->allocate(e->cache_self, &info, n, err);
    if (st == LOOM_ERR_NO_SPACE)
        return loom_error_set(err, LOOM_ERR_NO_SPACE,
                              "loom_engine_score: the KV cache cannot hold %d tokens (%d blocks of %d): give the "
                              "cache more memory or score shorter windows", n, e->layout.num_blocks,
                              e->layout.block_size);
    if (st != LOOM_OK) return st;
    enum { CHUNK = 256 };
    int32_t bt_stride = (e->max_model_len + e->layout.block_size - 1) / e->layout.block_size;
    if ((st = run_block_ops(e, err)) != LOOM_OK) goto out;
    if (ensure_step_buffers(e, 1, CHUNK, bt_stride) != LOOM_OK) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto out;
    }
    size_t need = (size_t)CHUNK * (size_t)e->vocab;
    if (need > e->logits_cap) {
        float *l = realloc(e->logits, need * sizeof(float));
        if (!l) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory for logits");
            goto out;
        }
        e->logits = l;
        e->logits_cap = need;
    }
    int32_t nb = e->cache->block_table(e->cache_self, info.id, e->block_table, bt_stride);
    for (int32_t k = nb; k < bt_stride; k++) e->block_table[k] = -1;
    logprobs[0] = 0.0f;
    for (int32_t start = 0; start < n; start += CHUNK) {
        int32_t c = n - start < CHUNK ? n - start : CHUNK;
        for (int32_t i = 0; i < c; i++) {
            int32_t p = start + i;
            e->tok_ids[i] = tokens[p];
            e->positions[i] = p;
            e->slots[i] = (int64_t)e->block_table[p / e->layout.block_size] * e->layout.block_size +
                          p % e->layout.block_size;
            e->logits_index[i] = i;
        }
        e->query_start[0] = 0;
        e->query_start[1] = c;
        e->context_len[0] = start + c;
        loom_batch batch = {
            .struct_size = sizeof batch, .num_seqs = 1, .num_tokens = c, .token_ids = e->tok_ids,
            .positions = e->positions, .query_start = e->query_start, .context_len = e->context_len,
            .block_table = e->block_table, .block_table_stride = bt_stride, .slot_mapping = e->slots,
            .num_logits = c, .logits_index = e->logits_index,
        };
        st = e->be->forward(e->be_self, &batch, e->logits, err);
        if (st != LOOM_OK) goto out;
        for (int32_t i = 0; i < c && start + i + 1 < n; i++)
            logprobs[start + i + 1] = raw_logprob(e->logits + (size_t)i * e->vocab, e->vocab, tokens[start + i + 1]);
    }
out:
    e->cache->free(e->cache_self, info.id);
    return st;
}

loom_status loom_engine_run(loom_engine *e, loom_error *err) {
    int32_t active = 1;
    while (active > 0) {
        loom_status st = loom_engine_step(e, &active, err);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

void loom_engine_get_stats(loom_engine *e, loom_engine_stats *out) {
    *out = e->stats;
    out->struct_size = sizeof *out;
    loom_sched_stats ss = {.struct_size = sizeof ss};
    e->sch->stats(e->sch_self, &ss);
    out->running = ss.num_running;
    out->waiting = ss.num_waiting;
    out->swapped = ss.num_swapped;
    loom_cache_stats cs = {.struct_size = sizeof cs};
    e->cache->stats(e->cache_self, &cs);
    out->kv_blocks_total = cs.num_blocks;
    out->kv_blocks_used = cs.num_blocks - cs.free_blocks;
    out->kv_blocks_peak = cs.peak_used_blocks;
    out->block_size = cs.block_size;
    out->prefix_queries = cs.prefix_queries;
    out->prefix_hits = cs.prefix_hits;
    out->evictions = cs.evictions;
    out->swaps_out = cs.swaps_out;
    out->swaps_in = cs.swaps_in;
    if (e->spec && e->spec->stats) {
        loom_spec_stats sp = {.struct_size = sizeof sp};
        e->spec->stats(e->spec_self, &sp);
        out->spec_proposed = sp.proposed;
        out->spec_accepted = sp.accepted;
    }
}
