/*
 * core/engine/kv_transfer.c — prefill/decode disaggregation inside the
 * engine: a finished prefill's KV read out (on_kv_export), and a kv_remote
 * request that waits, parked outside the scheduler, until another engine's
 * KV is delivered for it (loom_engine_kv_deliver) or its transfer fails
 * (loom_engine_kv_fail).
 *
 * The engine touches the cache contract in exactly two places here:
 * block_table() to name a sequence's blocks for export, and allocate() +
 * block_table() to give an imported sequence its blocks. Everything else
 * (moving bytes between processes) is the kv_connector's and core/disagg's.
 *
 * The hand-over covers all of the prompt but its last token: the decode
 * engine computes that token itself and samples every output token, so a
 * disaggregated request samples exactly as a colocated one (seeds,
 * penalties, logprobs, stop rules) and no sampler state crosses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/util.h"

/* ------------------------------------------------------------ requests */

/* Block images name one block table per sequence; a cache that keeps
 * several (sliding-window layers) cannot hand its KV over yet. */
static loom_status grouped_refusal(const loom_engine *e, loom_error *err) {
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "KV transfer with %d block-table groups (a model with sliding-window layers) is not "
                          "supported: set cache.sliding_window: off to keep one table", e->num_groups);
}

loom_status engine_kv_check_request(const loom_request *full, loom_error *err) {
    const bool exp = full->on_kv_export != NULL, rem = full->kv_remote;
    if (!exp && !rem) return LOOM_OK;
    const char *what = exp && rem ? "both on_kv_export and kv_remote"
                       : full->n > 1 ? "n > 1"
                       : full->prompt_logprobs ? "prompt_logprobs"
                       : full->prompt_only ? "prompt_only"
                       : full->constraint_lang ? "a constraint"
                       : NULL;
    if (!what) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_INVALID,
                          "a request handing its KV over (%s) cannot have %s: serve it colocated",
                          exp ? "on_kv_export" : "kv_remote", what);
}

/* Tell a handoff read in place that the engine is done with its blocks
 * (written, dropped, or no room now); a copy has no one to tell. */
static void handoff_release(engine_handoff *k, loom_status st) {
    void (*done)(void *, loom_status) = k->h.done;
    k->h.done = NULL;
    if (done) done(k->h.done_ctx, st);
}

void engine_handoff_free(engine_handoff *k) {
    if (!k) return;
    handoff_release(k, k->written ? LOOM_OK : LOOM_ERR_INVALID);
    free(k->tokens);
    free(k->blocks);
    free(k);
}

/* ------------------------------------------------------------ export */

typedef struct export_ctx {
    loom_engine *e;
    const int32_t *ids;
    int32_t num_blocks;
} export_ctx;

static loom_status export_read(void *ctx, int32_t first, int32_t n, void *dst, size_t len, loom_error *err) {
    export_ctx *x = ctx;
    if (first < 0 || n < 0 || first > x->num_blocks || n > x->num_blocks - first || (n > 0 && !dst))
        return loom_error_set(err, LOOM_ERR_INVALID, "kv export: blocks [%d, %d + %d) outside the sequence's %d",
                              first, first, n, x->num_blocks);
    loom_status st = x->e->run.kv_read_blocks(x->e->run.self, x->ids + first, n, dst, len, err);
    if (st == LOOM_OK) x->e->stats.kv_exported_blocks += n;
    return st;
}

/* Sample 0 of an on_kv_export request finished: hand its prompt's KV to
 * the callback while the blocks are still held. */
void engine_kv_export(loom_engine *e, loom_seq *s, loom_finish_reason why) {
    loom_req *rq = s->req;
    if (why == LOOM_FINISH_ABORT || why == LOOM_FINISH_ERROR || s->sample_index != 0) return;
    loom_error err = {0};
    int32_t n = s->info.num_computed < rq->prompt_len ? s->info.num_computed : rq->prompt_len;
    int32_t bs = e->layout.block_size, nb = (n + bs - 1) / bs;
    int32_t *ids = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *ids);
    loom_status st = LOOM_OK;
    if (!e->run.kv_read_blocks)
        st = loom_error_set(&err, LOOM_ERR_UNSUPPORTED, "%s '%s' cannot read its KV blocks out",
                            e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend", e->run.name);
    else if (e->num_groups > 1)
        st = grouped_refusal(e, &err);
    else if (!ids)
        st = loom_error_set(&err, LOOM_ERR_NOMEM, "out of memory exporting KV");
    else if (e->cache->block_table(e->cache_self, s->info.id, ids, nb) < nb)
        st = loom_error_set(&err, LOOM_ERR_INTERNAL, "the cache holds fewer than %d blocks for %d computed tokens",
                            nb, n);
    export_ctx x = {.e = e, .ids = ids, .num_blocks = nb};
    loom_kv_export ex = {.struct_size = sizeof ex, .request_id = rq->id, .num_tokens = n, .tokens = s->tokens,
                         .block_size = bs, .num_blocks = nb,
                         .block_bytes = e->run.kv_block_bytes(e->run.self, bs, e->layout.dtype),
                         .read = export_read, .ctx = &x};
    /* not called when the blocks cannot be read: the final event that
     * follows tells the caller no KV came */
    if (st == LOOM_OK) st = rq->r.on_kv_export(rq->r.user, &ex);
    if (st != LOOM_OK)
        loom_log(LOOM_LOG_WARN, "engine", "request %lld: KV export failed (%s)", (long long)rq->id,
                 err.message[0] ? err.message : "the callback refused it");
    free(ids);
}

/* ------------------------------------------------------------ import */

loom_status engine_kv_import(loom_engine *e, loom_seq *s, engine_handoff *kv, loom_error *err) {
    const int32_t n = kv->h.num_tokens, nb = kv->h.num_blocks;
    if (n == 0) return kv->written = true, LOOM_OK;
    if (e->num_groups > 1) return grouped_refusal(e, err);
    loom_status st = e->cache->allocate(e->cache_self, &s->info, n, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "allocating %d blocks for the prefill's KV", nb);
        return st;
    }
    int32_t *ids = malloc((size_t)nb * sizeof *ids);
    if (!ids) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory importing KV");
    if (e->cache->block_table(e->cache_self, s->info.id, ids, nb) < nb)
        st = loom_error_set(err, LOOM_ERR_INTERNAL, "the cache gave fewer than %d blocks for %d tokens", nb, n);
    if (st == LOOM_OK)
        st = e->run.kv_write_blocks(e->run.self, ids, nb, kv->h.blocks, (size_t)nb * kv->h.block_bytes, err);
    free(ids);
    if (st != LOOM_OK) return st;
    kv->written = true;
    s->info.num_computed = n;
    e->stats.kv_imported_blocks += nb;
    return LOOM_OK;
}

/* Why handoff k cannot serve request rq (into why), or false when it can. */
static bool handoff_mismatch(const loom_engine *e, const loom_req *rq, const engine_handoff *k, char *why,
                             size_t cap) {
    const loom_kv_handoff *h = &k->h;
    const int32_t bs = e->layout.block_size;
    const size_t bb = e->run.kv_block_bytes(e->run.self, bs, e->layout.dtype);
    if (!e->run.kv_write_blocks)
        snprintf(why, cap, "%s '%s' cannot write KV blocks in", e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend",
                 e->run.name);
    else if (h->num_tokens != rq->prompt_len - 1)
        snprintf(why, cap, "the prefill's KV covers %d tokens, the prompt has %d (want %d)", h->num_tokens,
                 rq->prompt_len, rq->prompt_len - 1);
    else if (memcmp(h->tokens, rq->prompt, (size_t)h->num_tokens * sizeof(int32_t)) != 0)
        snprintf(why, cap, "the prefill's tokens differ from the prompt's (another tokenizer or chat template?)");
    else if (h->block_size != bs || h->block_bytes != bb)
        snprintf(why, cap, "the prefill's blocks are %d tokens / %zu bytes, this engine's %d / %zu", h->block_size,
                 h->block_bytes, bs, bb);
    else if (h->num_blocks != (h->num_tokens + bs - 1) / bs)
        snprintf(why, cap, "%d blocks for %d tokens of %d per block", h->num_blocks, h->num_tokens, bs);
    else
        return false;
    return true;
}

/* ------------------------------------------------------------ parking */

void engine_kv_park(loom_engine *e, loom_req *rq) {
    int32_t cap = e->cap_parked;
    if (engine_grow((void **)&e->parked, &cap, e->num_parked + 1, sizeof(loom_req *)) != LOOM_OK ||
        engine_grow((void **)&e->parked_kv, &e->cap_parked, e->num_parked + 1, sizeof(engine_handoff *)) != LOOM_OK) {
        engine_fail_unadmitted(e, rq, "out of memory parking a kv_remote request");
        return;
    }
    e->parked[e->num_parked] = rq;
    e->parked_kv[e->num_parked++] = NULL;
}

static int32_t parked_index(const loom_engine *e, int64_t id) {
    for (int32_t i = 0; i < e->num_parked; i++)
        if (e->parked[i]->id == id) return i;
    return -1;
}

/* Take parked entry i off the list: its request (the caller ends or admits
 * it) and its handoff (the caller frees it). */
static loom_req *unpark(loom_engine *e, int32_t i, engine_handoff **kv) {
    loom_req *rq = e->parked[i];
    *kv = e->parked_kv[i];
    memmove(e->parked + i, e->parked + i + 1, (size_t)(e->num_parked - i - 1) * sizeof *e->parked);
    memmove(e->parked_kv + i, e->parked_kv + i + 1, (size_t)(e->num_parked - i - 1) * sizeof *e->parked_kv);
    e->num_parked--;
    return rq;
}

static void end_parked(loom_engine *e, int32_t i, loom_finish_reason why, const char *msg) {
    engine_handoff *kv;
    loom_req *rq = unpark(e, i, &kv);
    engine_handoff_free(kv);
    if (why == LOOM_FINISH_ERROR) {
        engine_fail_unadmitted(e, rq, msg);
        return;
    }
    engine_end_unstarted(rq, 0, why, msg);
    pthread_mutex_lock(&e->inbox_mu);
    e->active--;
    pthread_mutex_unlock(&e->inbox_mu);
    loom_engine_req_free(rq);
}

bool engine_kv_abort_parked(loom_engine *e, int64_t id) {
    int32_t i = parked_index(e, id);
    if (i < 0) return false;
    end_parked(e, i, LOOM_FINISH_ABORT, NULL);
    return true;
}

static bool any_live(const loom_engine *e) {
    for (int32_t i = 0; i < e->num_reqs; i++)
        if (e->reqs[i]->live > 0) return true;
    return false;
}

/* Parked entry i has its handoff: admit it when the cache has room now;
 * with no room, wait while others run (they free blocks), else fail. */
static bool try_import(loom_engine *e, int32_t i) {
    char why[LOOM_ERROR_MSG_MAX];
    engine_handoff *k = e->parked_kv[i];
    if (handoff_mismatch(e, e->parked[i], k, why, sizeof why)) {
        end_parked(e, i, LOOM_FINISH_ERROR, why);
        return true;
    }
    if (e->cache->num_free_blocks(e->cache_self) < k->h.num_blocks + 1) {
        if (any_live(e)) { /* wait for their blocks; one read in place is not kept: its owner holds it for us */
            if (k->h.done) {
                e->parked_kv[i] = NULL;
                handoff_release(k, LOOM_ERR_NO_SPACE);
                engine_handoff_free(k);
            }
            return false;
        }
        snprintf(why, sizeof why, "the KV cache (%d blocks) has no room for the prefill's %d blocks",
                 e->layout.num_blocks, k->h.num_blocks);
        end_parked(e, i, LOOM_FINISH_ERROR, why);
        return true;
    }
    engine_handoff *kv;
    loom_req *rq = unpark(e, i, &kv);
    loom_error err = {0};
    engine_admit(e, rq, kv, &err);
    engine_handoff_free(kv);
    return true;
}

int32_t engine_kv_undelivered(const loom_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->num_parked; i++) n += !e->parked_kv[i];
    return n;
}

void engine_kv_retry(loom_engine *e) {
    for (int32_t i = 0; i < e->num_parked;)
        if (!e->parked_kv[i] || !try_import(e, i)) i++;
}

void engine_kv_inbox_item(loom_engine *e, loom_inbox_item *it) {
    int32_t i = parked_index(e, it->abort_id);
    if (i >= 0 && it->kv_fail) {
        end_parked(e, i, LOOM_FINISH_ERROR, it->kv_fail);
    } else if (i >= 0 && !e->parked_kv[i]) {
        e->parked_kv[i] = it->kv;
        it->kv = NULL;
        try_import(e, i);
    }
    if (it->kv) handoff_release(it->kv, LOOM_ERR_NOT_FOUND); /* a request no longer waiting, or a second delivery */
    engine_handoff_free(it->kv);
    free(it->kv_fail);
}

void engine_kv_fini(loom_engine *e) {
    for (int32_t i = 0; i < e->num_parked; i++) {
        loom_engine_req_free(e->parked[i]);
        engine_handoff_free(e->parked_kv[i]);
    }
    free(e->parked);
    free(e->parked_kv);
}

/* ------------------------------------------------------------ the API */

/* The device whose memory this engine's block images may live in, or -1. */
static int32_t image_device(const loom_engine *e) {
    return e->run.kv_read_blocks && e->run.kv_image_device ? e->run.kv_image_device(e->run.self) : -1;
}

loom_status loom_engine_kv_info(const loom_engine *e, loom_kv_info *out, loom_error *err) {
    if (!e || !out) return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_kv_info: engine and output required");
    if (!e->run.kv_read_blocks || !e->run.kv_write_blocks)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s '%s' cannot move KV blocks in or out (no kv_read_blocks / kv_write_blocks): "
                              "disaggregated serving needs a backend that can, e.g. cpu",
                              e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend", e->run.name);
    if (e->num_groups > 1) return grouped_refusal(e, err);
    if (e->layout.dtype == LOOM_DTYPE_COUNT)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "backend '%s' does not name its KV element type (kv_default_dtype, ABI 2.8): a "
                              "peer could not tell its block images from another type of the same size; "
                              "rebuild the backend against this loom's SDK, or name the type through the "
                              "quantizer (kv_cache)",
                              e->run.name);
    if (out->struct_size < offsetof(loom_kv_info, image_device))
        return loom_error_set(err, LOOM_ERR_ABI, "loom_engine_kv_info: struct_size %u is below ABI 2.4's %zu",
                              out->struct_size, offsetof(loom_kv_info, image_device));
    const loom_kv_info k = {.block_size = e->layout.block_size,
                            .block_bytes = e->run.kv_block_bytes(e->run.self, e->layout.block_size, e->layout.dtype),
                            .kv_dtype = e->layout.dtype, .num_layers = e->mcfg->num_layers, .vocab = e->vocab,
                            .max_model_len = e->max_model_len, .image_device = image_device(e)};
    /* the fields the caller's struct has: an older one ends sooner */
    const uint32_t size = out->struct_size < sizeof k ? out->struct_size : (uint32_t)sizeof k;
    memcpy(out, &k, size);
    out->struct_size = size;
    return LOOM_OK;
}

/* A copy the engine owns of a handoff the caller borrows; with h->done set
 * the blocks stay the caller's (read in place, released by done). */
static engine_handoff *handoff_copy(const loom_kv_handoff *h, int32_t device,
                                    void (*done)(void *, loom_status), void *done_ctx) {
    engine_handoff *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    memcpy(&k->h, h, sizeof k->h < h->struct_size ? sizeof k->h : h->struct_size);
    k->h.struct_size = sizeof k->h;
    k->h.blocks_on_device = device >= 0;
    k->h.blocks_device = device;
    k->h.done = NULL; /* set last: a copy that fails tells no one */
    size_t tb = (size_t)h->num_tokens * sizeof(int32_t), bb = (size_t)h->num_blocks * h->block_bytes;
    k->tokens = malloc(tb ? tb : 1);
    k->blocks = done ? NULL : malloc(bb ? bb : 1);
    if (!k->tokens || (!done && !k->blocks)) {
        engine_handoff_free(k);
        return NULL;
    }
    memcpy(k->tokens, h->tokens, tb);
    if (!done) memcpy(k->blocks, h->blocks, bb);
    k->h.tokens = k->tokens;
    k->h.blocks = done ? h->blocks : k->blocks;
    k->h.done = done;
    k->h.done_ctx = done_ctx;
    return k;
}

loom_status loom_engine_kv_deliver(loom_engine *e, int64_t request_id, const loom_kv_handoff *h, loom_error *err) {
    if (!e || !h || h->struct_size < offsetof(loom_kv_handoff, blocks) + sizeof h->blocks || h->num_tokens < 0 ||
        h->num_blocks < 0 || (h->num_tokens > 0 && (!h->tokens || !h->blocks || h->block_bytes == 0)) ||
        (h->block_bytes > 0 && (size_t)h->num_blocks > SIZE_MAX / h->block_bytes))
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "loom_engine_kv_deliver: a handoff (struct_size, counts >= 0, tokens and blocks "
                              "for a non-empty one) is required");
    const bool on_dev = LOOM_HAS_FIELD(h, loom_kv_handoff, blocks_device) && h->blocks_on_device;
    const int32_t dev = on_dev ? h->blocks_device : -1;
    void (*done)(void *, loom_status) = LOOM_HAS_FIELD(h, loom_kv_handoff, done_ctx) ? h->done : NULL;
    if (on_dev && (dev < 0 || !done))
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "loom_engine_kv_deliver: blocks on CUDA device %d: device blocks are read in place "
                              "and need an ordinal >= 0 and a done callback", dev);
    const int32_t mine = image_device(e);
    if (dev >= 0 && dev != mine) {
        char where[48] = "host memory only";
        if (mine >= 0) snprintf(where, sizeof where, "host memory or CUDA device %d", mine);
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "loom_engine_kv_deliver: blocks on CUDA device %d, but %s '%s' reads block images from %s",
                              dev, e->run.kind == LOOM_KIND_EXECUTOR ? "executor" : "backend", e->run.name, where);
    }
    loom_inbox_item *it = calloc(1, sizeof *it);
    engine_handoff *k = it ? handoff_copy(h, dev, done, done ? h->done_ctx : NULL) : NULL;
    if (!k) {
        free(it);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %d KV blocks of %zu bytes", h->num_blocks,
                              h->block_bytes);
    }
    it->abort_id = request_id;
    it->kv = k;
    engine_inbox_post(e, it, NULL);
    return LOOM_OK;
}

loom_status loom_engine_kv_fail(loom_engine *e, int64_t request_id, const char *why) {
    loom_inbox_item *it = e ? calloc(1, sizeof *it) : NULL;
    if (!it) return LOOM_ERR_NOMEM;
    if (!(it->kv_fail = loom_strdup(why && why[0] ? why : "the KV transfer failed"))) {
        free(it);
        return LOOM_ERR_NOMEM;
    }
    it->abort_id = request_id;
    engine_inbox_post(e, it, NULL);
    return LOOM_OK;
}
