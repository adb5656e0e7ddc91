/*
 * core/engine/sequence.c — the life of one sample: its token buffer, the
 * events it streams, its text and stop strings, and its end.
 *
 * A sequence is created when its request is admitted (sample 0) or forked
 * (samples 1..n-1), takes tokens through engine_accept_token, and ends in
 * engine_seq_finish, which tells the scheduler, the cache manager and the
 * speculator and sends the final event. Finished sequences stay in the
 * tables until engine_reap, at the end of a step, frees whole requests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "plugin/host_rules.h"
#include "util/util.h"

/* ------------------------------------------------------------- buffers */

loom_status engine_grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return LOOM_OK;
    int32_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return LOOM_ERR_NOMEM;
    *p = q;
    *cap = n;
    return LOOM_OK;
}

loom_status engine_seq_reserve(loom_seq *s, int32_t need) {
    loom_status st = engine_grow((void **)&s->tokens, &s->cap, need, sizeof(int32_t));
    s->info.tokens = s->tokens;
    return st;
}

static loom_status seq_push(loom_seq *s, int32_t tok) {
    loom_status st = engine_seq_reserve(s, s->info.num_tokens + 1);
    if (st != LOOM_OK) return st;
    s->tokens[s->info.num_tokens++] = tok;
    return LOOM_OK;
}

void loom_engine_seq_free(loom_seq *s) {
    if (!s) return;
    free(s->tokens);
    free(s->text);
    free(s->spec_q);
    engine_constraint_seq_free(s);
    free(s);
}

loom_seq *engine_seq_new(loom_engine *e, loom_req *rq, int32_t sample_index) {
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
    if (engine_seq_reserve(s, rq->prompt_len + 16) != LOOM_OK) {
        loom_engine_seq_free(s);
        return NULL;
    }
    memcpy(s->tokens, rq->prompt, (size_t)rq->prompt_len * sizeof(int32_t));
    s->info.num_tokens = rq->prompt_len;
    /* A seeded request draws the same stream however it is batched; sample
     * k of it gets its own stream from the same seed. */
    uint64_t seed = rq->r.params.has_seed ? rq->r.params.seed + (uint64_t)sample_index * 0x9E3779B97F4A7C15ULL
                                          : e->seed ^ ((uint64_t)s->info.id * 0xD1B54A32D192ED03ULL);
    loom_rng_seed(s->rng, seed);
    if (e->tok) loom_detok_init(&s->detok, e->tok, true);
    if (engine_constraint_seq_init(s) != LOOM_OK) {
        loom_engine_seq_free(s);
        return NULL;
    }
    return s;
}

loom_status engine_track_seq(loom_engine *e, loom_seq *s) {
    if (engine_grow((void **)&e->seqs, &e->cap_seqs, e->num_seqs + 1, sizeof(loom_seq *)) != LOOM_OK)
        return LOOM_ERR_NOMEM;
    e->seqs[e->num_seqs++] = s;
    return LOOM_OK;
}

loom_seq *loom_engine_find_seq(loom_engine *e, loom_seq_id id) {
    /* A step looks its sequences up in the scheduler's order, mostly
     * ascending ids: the one after the last found first (the lookups of a
     * step of hundreds of sequences stay O(1) each, not a binary search of
     * every tracked sequence, waiting ones included). */
    const int32_t h = e->find_hint + 1;
    if (h < e->num_seqs && e->seqs[h]->info.id == id) {
        e->find_hint = h;
        return e->seqs[h];
    }
    /* Sequences are appended in id order: binary search. */
    int32_t lo = 0, hi = e->num_seqs - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        loom_seq_id v = e->seqs[mid]->info.id;
        if (v == id) {
            e->find_hint = mid;
            return e->seqs[mid];
        }
        if (v < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

void loom_engine_req_free(loom_req *rq) {
    if (!rq) return;
    if (rq->stop) {
        for (char **p = rq->stop; *p; p++) free(*p);
        free(rq->stop);
    }
    free(rq->prompt);
    free(rq->prompt_lp);
    free(rq->prompt_top_ids);
    free(rq->prompt_top_lps);
    free(rq->seqs);
    free((char *)rq->r.system);
    free((void *)rq->r.logit_bias);
    engine_constraint_req_free(rq);
    free(rq);
}

/* ---------------------------------------------------------------- events */

/* What every event of rq says about its prompt (since ABI 2.3). */
void engine_event_prompt(loom_token_event *ev, const loom_req *rq) {
    ev->cached_prompt_tokens = rq->cached_prompt_tokens;
    if (!rq->prompt_scored) return; /* not asked for, or not scored (yet): a failure or abort */
    ev->prompt_token_ids = rq->prompt;
    ev->prompt_logprobs = rq->prompt_lp;
    ev->prompt_num_top = rq->prompt_num_top;
    ev->prompt_top_ids = rq->prompt_top_ids;
    ev->prompt_top_logprobs = rq->prompt_top_lps;
}

/* text: len bytes (may hold NUL characters), NUL-terminated. */
static void emit(loom_engine *e, loom_seq *s, const engine_token *t, const char *text, size_t len,
                 loom_finish_reason finish, const char *error) {
    if (!s->req->r.on_token) return;
    loom_token_event ev = {
        .struct_size = sizeof ev,
        .request_id = s->req->id,
        .sample_index = s->sample_index,
        .token = t ? t->id : -1,
        .text = text ? text : "",
        .text_len = text ? len : 0,
        .logprob = t ? t->logprob : 0.0f,
        .num_top = t ? t->num_top : 0,
        .top_ids = t ? t->top_ids : NULL,
        .top_logprobs = t ? t->top_logprobs : NULL,
        .finish = finish,
        .error = error,
        .probs = t ? s->cur_probs : NULL,
        .vocab = e->vocab,
        .prompt_tokens = s->req->prompt_len,
    };
    engine_event_prompt(&ev, s->req);
    s->req->r.on_token(s->req->r.user, &ev);
}

/* The final event of samples from..n-1 of rq, which never ran. */
void engine_end_unstarted(const loom_req *rq, int32_t from, loom_finish_reason why, const char *error) {
    for (int32_t k = from; k < rq->n && rq->r.on_token; k++) {
        loom_token_event ev = {.struct_size = sizeof ev, .request_id = rq->id, .sample_index = k, .token = -1,
                               .text = "", .finish = why, .error = error, .prompt_tokens = rq->prompt_len};
        engine_event_prompt(&ev, rq);
        rq->r.on_token(rq->r.user, &ev);
    }
}

/* Remove finished sequences of finished requests from the tables: a walk
 * of every tracked sequence and request, so only after a step in which
 * some sequence finished (engine_seq_finish counts them). */
void engine_reap(loom_engine *e) {
    if (e->finished_unreaped == 0) return;
    e->finished_unreaped = 0;
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

/* ------------------------------------------------------- text and stops */

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
        char *hit = memmem(s->text + from, s->text_len - from, *p, strlen(*p)); /* text may hold NULs */
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
static void stream_text(loom_engine *e, loom_seq *s, const engine_token *t) {
    if (!s->text) {
        emit(e, s, t, "", 0, LOOM_FINISH_NONE, NULL);
        return;
    }
    size_t hold = (size_t)(s->req->max_stop_len > 0 ? s->req->max_stop_len - 1 : 0);
    size_t end = s->text_len > hold ? s->text_len - hold : 0;
    /* Never cut inside a UTF-8 character. */
    while (end > s->text_emitted && end < s->text_len && ((unsigned char)s->text[end] & 0xC0) == 0x80) end--;
    if (end < s->text_emitted) end = s->text_emitted;
    char save = s->text[end];
    s->text[end] = 0;
    emit(e, s, t, s->text + s->text_emitted, end - s->text_emitted, LOOM_FINISH_NONE, NULL);
    s->text[end] = save;
    s->text_emitted = end;
}

/* -------------------------------------------------------------- the end */

void engine_seq_finish(loom_engine *e, loom_seq *s, loom_finish_reason why, const char *error) {
    if (s->finished) return;
    s->finished = true;
    e->finished_unreaped++;
    e->sch->remove(e->sch_self, s->info.id); /* unknown ids are ignored */
    if (s->req->r.on_kv_export) engine_kv_export(e, s, why); /* before its blocks go */
    e->cache->free(e->cache_self, s->info.id);
    if (e->spec) e->spec->release(e->spec_self, s->info.id);
    /* The final event carries what the detokenizer and the stop-string
     * hold-back still had. */
    if (e->tok && why != LOOM_FINISH_STOP) {
        char tail[256];
        size_t n;
        while ((n = loom_detok_flush(&s->detok, tail, sizeof tail)) > 0) append_text(s, tail, n);
    }
    emit(e, s, NULL, s->text ? s->text + s->text_emitted : "", s->text ? s->text_len - s->text_emitted : 0, why,
         error);
    s->text_emitted = s->text_len;
    loom_req *rq = s->req;
    if (!rq->forked) {
        /* Samples 1..n-1 never started: each ends with the same reason and
         * its own final event (one final event per sample). */
        engine_end_unstarted(rq, 1, why, error);
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

/* One chosen token for s: append, detokenize, stream, check the end. */
void engine_accept_token(loom_engine *e, loom_seq *s, const engine_token *t) {
    const char *refused = NULL;
    if (s->matcher) {
        const double t0 = loom_now();
        refused = engine_constraint_accept(s, t->id);
        e->stats.constraint_accept_seconds += loom_now() - t0;
    }
    if (refused) {
        engine_seq_finish(e, s, LOOM_FINISH_ERROR, refused);
        return;
    }
    if (seq_push(s, t->id) != LOOM_OK) {
        engine_seq_finish(e, s, LOOM_FINISH_ERROR, "out of memory appending a token");
        return;
    }
    s->num_generated++;
    e->stats.generated_tokens++;
    bool eog = e->tok && !s->req->r.ignore_eos && loom_tokenizer_is_eog(e->tok, t->id);
    /* Large enough for any piece of real vocabularies (SmolLM2's longest is
     * 81 bytes); a longer one is carried by the detokenizer to the next call. */
    char piece[1024];
    size_t n = eog || !e->tok ? 0 : loom_detok_push(&s->detok, t->id, piece, sizeof piece);
    bool stopped = n && append_text(s, piece, n);
    stream_text(e, s, t);
    if (eog || stopped || s->num_generated >= s->req->max_new)
        engine_seq_finish(e, s, eog ? LOOM_FINISH_EOS : stopped ? LOOM_FINISH_STOP : LOOM_FINISH_LENGTH, NULL);
}

/* The scheduler's view of a live sequence (loom_sched_env.get_seq). */
const loom_seq_info *engine_env_get_seq(void *ctx, loom_seq_id id) {
    loom_seq *s = loom_engine_find_seq(ctx, id);
    return s && !s->finished ? &s->info : NULL;
}
