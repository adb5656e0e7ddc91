/*
 * core/engine/engine_create.c — building an engine from a pipeline file and
 * tearing it down: load the pipeline, the model and its tokenizer, create
 * every plugin instance, load weights through the (optional) quantizer,
 * size the KV cache with the cache manager and allocate it on the backend.
 * Also the small tokenizer/model accessors of loom/engine.h.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "plugin/host.h"
#include "util/util.h"

/* Model-load progress on stderr, only when a person is watching. */
static void load_progress(void *user, const char *what, double fraction) {
    int *last = user;
    int pct = (int)(fraction * 100);
    if (pct == *last) return;
    *last = pct;
    fprintf(stderr, "\rloading %s: %3d%%%s", what ? what : "model", pct, pct >= 100 ? "\n" : "");
    fflush(stderr);
}

static loom_status diag_to_err(const loom_diag *d, loom_status code, const char *file, loom_error *err) {
    if (!err) return code;
    char buf[LOOM_ERROR_MSG_MAX];
    size_t n = (size_t)snprintf(buf, sizeof buf, "%s: invalid pipeline", file);
    for (int i = 0; i < d->count && n < sizeof buf; i++) {
        const loom_diag_entry *e = &d->entries[i];
        char where[LOOM_ERROR_MSG_MAX];
        loom_cfg_mark_format(&e->mark, where, sizeof where);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "\n  %s%s%s", where, where[0] ? ": " : "", e->message);
    }
    return loom_error_set(err, code, "%s", buf);
}

static loom_status make_instance(loom_engine *e, loom_kind kind, bool required, const void **ops, void **self,
                                 loom_error *err) {
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, kind);
    *ops = NULL;
    *self = NULL;
    if (!slot) {
        if (!required) return LOOM_OK;
        return loom_error_set(err, LOOM_ERR_INVALID, "%s: the pipeline has no %s section",
                              loom_pipeline_file(e->pipe), loom_kind_name(kind));
    }
    loom_status st = loom_pipeline_create_instance(slot, e->host, self, err);
    if (st == LOOM_OK) *ops = slot->component->ops;
    return st;
}

static void destroy_instance(loom_engine *e, loom_kind kind, void *self) {
    if (!self) return;
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, kind);
    if (slot) loom_pipeline_destroy_instance(slot, self);
}

static size_t cache_block_bytes(void *ctx, int32_t block_size) {
    loom_engine *e = ctx;
    return e->be->kv_block_bytes(e->be_self, block_size, e->layout.dtype);
}

static loom_status load_tokenizer(loom_engine *e, loom_error *err) {
    const loom_gguf *g = loom_model_gguf(e->model);
    if (g) return loom_tokenizer_from_gguf(g, &e->tok, err);
    const char *tj = loom_model_tokenizer_json(e->model);
    if (tj) {
        char cfg[LOOM_PIPELINE_PATH_MAX + 32];
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", loom_model_dir(e->model));
        struct stat sb;
        return loom_tokenizer_from_json(tj, stat(cfg, &sb) == 0 ? cfg : NULL, &e->tok, err);
    }
    e->tok = NULL; /* dummy weights: token ids in, token ids out */
    return LOOM_OK;
}

/* Value of the quantizer slot's declared parameter `key` (NULL when the
 * component declares none): an ENUM's choice or an INT's number. */
static const loom_param *quant_param(const loom_pipeline_slot *slot, const char *key, loom_param_type type) {
    for (const loom_param *p = slot->component->params; p && p->key; p++)
        if (!strcmp(p->key, key) && p->type == type) return p;
    return NULL;
}

/* A packed AWQ/GPTQ checkpoint (loom_model_packing_get) keeps its linear
 * weights only as 4-bit words, so it runs only through a quantizer that
 * unpacks that very layout: one declaring an ENUM `source` set to the
 * checkpoint's method (int4: awq | gptq | gptq_v2) and, if it has one, an
 * INT `group_size` equal to the checkpoint's. Then every packed weight must
 * be planned to something other than NONE (a `skip` pattern naming it
 * would leave nothing to compute with). Checked before the backend loads,
 * so no backend ever meets a packed weight it cannot run; the message
 * names the pipeline line to write. */
static loom_status check_packed(loom_engine *e, const char *pipeline_path, loom_error *err) {
    const loom_model_packing *pk = loom_model_packing_get(e->model);
    if (!pk) return LOOM_OK;
    char want[160];
    snprintf(want, sizeof want, "quantizer: {plugin: int4, source: %s, group_size: %d}", pk->method,
             pk->group_size);
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, LOOM_KIND_QUANTIZER);
    if (!slot || !e->quant)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: model '%s' is a 4-bit %s checkpoint (%s, groups of %d); its linear weights "
                              "exist only packed, so the pipeline needs %s",
                              pipeline_path, e->mcfg->name, pk->method, pk->source, pk->group_size, want);
    const loom_param *src = quant_param(slot, "source", LOOM_PARAM_ENUM);
    const char *have = NULL;
    if (src && src->choices) {
        int64_t v, nc = 0;
        memcpy(&v, (const char *)slot->config + src->offset, sizeof v);
        while (src->choices[nc]) nc++;
        have = v >= 0 && v < nc ? src->choices[v] : NULL;
    }
    if (!have)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: quantizer '%s' quantizes float weights, but model '%s' is a packed 4-bit %s "
                              "checkpoint (%s); use %s",
                              pipeline_path, slot->name, e->mcfg->name, pk->method, pk->source, want);
    if (strcmp(have, pk->method) != 0) {
        bool gptq_pair = !strncmp(have, "gptq", 4) && !strncmp(pk->method, "gptq", 4);
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: quantizer.source is %s, but model '%s' is a packed 4-bit %s checkpoint (%s)%s; "
                              "use %s",
                              pipeline_path, have, e->mcfg->name, pk->method, pk->source,
                              gptq_pair ? " (gptq v1 stores each zero point minus 1, gptq_v2 the zero point itself)"
                                        : "",
                              want);
    }
    const loom_param *gs = quant_param(slot, "group_size", LOOM_PARAM_INT);
    if (gs) {
        int64_t v;
        memcpy(&v, (const char *)slot->config + gs->offset, sizeof v);
        if (v != pk->group_size)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "%s: quantizer.group_size is %lld, but model '%s' was packed in groups of %d "
                                  "(%s); use %s",
                                  pipeline_path, (long long)v, e->mcfg->name, pk->group_size, pk->source, want);
    }
    if (!e->quant->plan) return LOOM_OK;
    for (int32_t i = 0; i < e->view->count(e->view->ctx); i++) {
        const loom_tensor *t = e->view->at(e->view->ctx, i);
        if (!loom_model_is_packed_weight(e->model, t)) continue;
        loom_quant_plan plan = {.struct_size = sizeof plan};
        loom_status st = e->quant->plan(e->quant_self, e->view, t, &plan, err);
        if (st != LOOM_OK) {
            loom_error_prefix(err, "%s: quantizer '%s'", pipeline_path, slot->name);
            return st;
        }
        if (plan.format == LOOM_QFMT_NONE)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "%s: quantizer '%s' keeps tensor '%s' unquantized (a quantizer.skip pattern "
                                  "matches it), but model '%s' stores it only as packed 4-bit %s data; remove it "
                                  "from skip (for a packed LM head: skip: \"token_embd\")",
                                  pipeline_path, slot->name, t->name, e->mcfg->name, pk->method);
    }
    return LOOM_OK;
}

loom_status loom_engine_create(const char *pipeline_path, const char *const *overrides, int32_t num_overrides,
                               loom_engine **out, loom_error *err) {
    if (!out || !pipeline_path)
        return loom_error_set(err, LOOM_ERR_INVALID, "loom_engine_create: pipeline path and out are required");
    *out = NULL;
    loom_engine *e = calloc(1, sizeof *e);
    if (!e) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory creating the engine");
    pthread_mutex_init(&e->inbox_mu, NULL);
    e->host = loom_host_default();
    loom_status st;

    loom_diag diag;
    loom_diag_init(&diag);
    st = loom_pipeline_load(pipeline_path, overrides, num_overrides, &e->pipe, &diag);
    if (st != LOOM_OK) {
        diag_to_err(&diag, st, pipeline_path, err);
        loom_diag_free(&diag);
        goto fail;
    }
    loom_diag_free(&diag);

    const loom_engine_settings *es = loom_pipeline_engine(e->pipe);
    const loom_model_settings *ms = loom_pipeline_model(e->pipe);
    loom_host_set_threads(es->threads);
    e->seed = (uint64_t)es->seed;
    e->device_sampling = es->device_sampling;

    /* The model. */
    static const char *const fmt_names[] = {"auto", "gguf", "safetensors", "dummy"};
    int last_pct = -1;
    bool show = isatty(2) || getenv("LOOM_PROGRESS");
    loom_model_load_opts mo = {
        .path = ms->path[0] ? ms->path : NULL,
        .format = fmt_names[ms->format],
        .dummy_shape = ms->shape[0] ? ms->shape : NULL,
        .seed = (uint64_t)ms->seed,
        .dummy_dtype = ms->dtype,
        .progress = show ? load_progress : NULL,
        .user = &last_pct,
    };
    st = loom_model_load(&mo, &e->model, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: model", pipeline_path);
        goto fail;
    }
    e->view = loom_model_view_get(e->model);
    e->mcfg = loom_model_config_get(e->model);
    e->vocab = e->mcfg->vocab_size;
    e->max_model_len = es->max_model_len > 0 ? es->max_model_len : e->mcfg->max_context;
    if (e->max_model_len < 2) {
        st = loom_error_set(err, LOOM_ERR_INVALID, "%s: engine.max_model_len %d is too small", pipeline_path,
                            e->max_model_len);
        goto fail;
    }

    st = load_tokenizer(e, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: tokenizer", pipeline_path);
        goto fail;
    }
    if (e->tok) {
        static const loom_chat_format map[] = {LOOM_CHAT_AUTO, LOOM_CHAT_CHATML, LOOM_CHAT_LLAMA3,
                                               LOOM_CHAT_LLAMA2, LOOM_CHAT_AUTO};
        e->chat_format = ms->chat_template == LOOM_CHAT_TEMPLATE_AUTO ? loom_tokenizer_chat_format(e->tok)
                                                                      : map[ms->chat_template];
        e->chat_none = ms->chat_template == LOOM_CHAT_TEMPLATE_NONE;
    }

    /* Plugin instances: the backend (or executor) first, since the cache is
     * sized from what it has left after the weights. */
    const void *ops;
    loom_kind be_kind = loom_pipeline_slot_get(e->pipe, LOOM_KIND_EXECUTOR) ? LOOM_KIND_EXECUTOR : LOOM_KIND_BACKEND;
    e->be_kind = be_kind;
    if ((st = make_instance(e, be_kind, true, &ops, &e->be_self, err)) != LOOM_OK) goto fail;
    e->be = ops;
    /* forward_topk arrived in ABI 1.1: a plugin built earlier has a shorter table */
    if (e->be->struct_size < offsetof(loom_backend_ops, forward_topk) + sizeof e->be->forward_topk ||
        !e->be->forward_topk)
        e->device_sampling = false;
    if (be_kind == LOOM_KIND_EXECUTOR) {
        /* An executor drives N instances of the pipeline's backend. */
        const loom_pipeline_slot *bslot = loom_pipeline_slot_get(e->pipe, LOOM_KIND_BACKEND);
        if (!e->be->inner_count || !e->be->attach_inner) {
            st = loom_error_set(err, LOOM_ERR_INVALID, "%s: executor '%s' does not take inner backends",
                                pipeline_path, loom_pipeline_slot_get(e->pipe, be_kind)->name);
            goto fail;
        }
        if (!bslot) {
            st = loom_error_set(err, LOOM_ERR_INVALID,
                                "%s: an executor needs a backend: section saying what each rank runs "
                                "(e.g. backend: {plugin: cpu})", pipeline_path);
            goto fail;
        }
        int32_t n = e->be->inner_count(e->be_self);
        if (n < 1 || n > 1024) {
            st = loom_error_set(err, LOOM_ERR_INVALID, "executor asked for %d inner backends", n);
            goto fail;
        }
        e->inner = calloc((size_t)n, sizeof(void *));
        if (!e->inner) {
            st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (int32_t i = 0; i < n; i++) {
            if ((st = loom_pipeline_create_instance(bslot, e->host, &e->inner[i], err)) != LOOM_OK) goto fail;
            e->num_inner++;
        }
        st = e->be->attach_inner(e->be_self, bslot->component->ops, e->inner, n, err);
        if (st != LOOM_OK) goto fail;
    }
    if ((st = make_instance(e, LOOM_KIND_QUANTIZER, false, &ops, &e->quant_self, err)) != LOOM_OK) goto fail;
    e->quant = ops;
    if ((st = make_instance(e, LOOM_KIND_CACHE, true, &ops, &e->cache_self, err)) != LOOM_OK) goto fail;
    e->cache = ops;
    if ((st = make_instance(e, LOOM_KIND_SCHEDULER, true, &ops, &e->sch_self, err)) != LOOM_OK) goto fail;
    e->sch = ops;
    if ((st = make_instance(e, LOOM_KIND_SAMPLER, true, &ops, &e->smp_self, err)) != LOOM_OK) goto fail;
    e->smp = ops;
    if ((st = make_instance(e, LOOM_KIND_SPECULATOR, false, &ops, &e->spec_self, err)) != LOOM_OK) goto fail;
    e->spec = ops;
    /* propose_batch arrived in ABI 1.4: a plugin built earlier has a shorter
     * table, whose bytes past struct_size are not ours to read */
    e->spec_batch = e->spec &&
                    e->spec->struct_size >= offsetof(loom_spec_ops, propose_batch) + sizeof e->spec->propose_batch &&
                    e->spec->propose_batch;

    /* Weights to the backend, through the quantizer when there is one. */
    if ((st = check_packed(e, pipeline_path, err)) != LOOM_OK) goto fail;
    if (e->quant) {
        e->quant_binding = (loom_quant_binding){sizeof(loom_quant_binding), e->quant, e->quant_self,
                                                loom_pipeline_slot_get(e->pipe, LOOM_KIND_QUANTIZER)->name};
    }
    st = e->be->load(e->be_self, e->view, e->quant ? &e->quant_binding : NULL, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: backend '%s' loading weights", pipeline_path,
                          loom_pipeline_slot_get(e->pipe, be_kind)->name);
        goto fail;
    }

    /* Size the KV cache and allocate it. */
    e->layout.struct_size = sizeof e->layout;
    e->layout.dtype = e->quant && e->quant->kv_dtype ? e->quant->kv_dtype(e->quant_self) : LOOM_DTYPE_COUNT;
    loom_backend_memory mem = {.struct_size = sizeof mem};
    st = e->be->memory(e->be_self, &mem, err);
    if (st != LOOM_OK) goto fail;
    loom_cache_init ci = {
        .struct_size = sizeof ci,
        .block_bytes = cache_block_bytes,
        .ctx = e,
        .device_free_bytes = mem.free_bytes,
        .device_total_bytes = mem.total_bytes,
        .max_model_len = e->max_model_len,
        .max_num_seqs = 0,         /* not known to the core: schedulers keep their caps private */
        .backend_can_swap = e->be->swap_blocks != NULL,
    };
    st = e->cache->init(e->cache_self, &ci, &e->layout, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: cache '%s'", pipeline_path, loom_pipeline_slot_get(e->pipe, LOOM_KIND_CACHE)->name);
        goto fail;
    }
    if (e->layout.block_size < 1 || e->layout.num_blocks < 1) {
        st = loom_error_set(err, LOOM_ERR_INTERNAL, "cache manager returned an empty layout (%d blocks of %d)",
                            e->layout.num_blocks, e->layout.block_size);
        goto fail;
    }
    st = e->be->kv_alloc(e->be_self, &e->layout, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: KV cache of %d blocks x %d tokens", pipeline_path, e->layout.num_blocks,
                          e->layout.block_size);
        goto fail;
    }
    if (e->spec) {
        loom_spec_init si = {sizeof si, e->vocab, loom_pipeline_dir(e->pipe), e->max_model_len,
                             loom_engine_api_get()};
        st = e->spec->init(e->spec_self, &si, err);
        if (st != LOOM_OK) goto fail;
    }
    loom_log(LOOM_LOG_INFO, "engine", "%s: %d layers, KV cache %d blocks x %d tokens, context %d",
             e->mcfg->name, e->mcfg->num_layers, e->layout.num_blocks, e->layout.block_size, e->max_model_len);
    *out = e;
    return LOOM_OK;
fail:
    loom_engine_destroy(e);
    return st;
}

void loom_engine_destroy(loom_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->num_reqs; i++) {
        loom_req *rq = e->reqs[i];
        for (int32_t k = 0; k < rq->n; k++) loom_engine_seq_free(rq->seqs[k]);
        loom_engine_req_free(rq);
    }
    while (e->inbox_head) {
        loom_inbox_item *it = e->inbox_head;
        e->inbox_head = it->next;
        loom_engine_req_free(it->req);
        free(it);
    }
    free(e->reqs);
    free(e->seqs);
    if (e->pipe) {
        destroy_instance(e, LOOM_KIND_SPECULATOR, e->spec_self);
        destroy_instance(e, LOOM_KIND_SAMPLER, e->smp_self);
        destroy_instance(e, LOOM_KIND_SCHEDULER, e->sch_self);
        destroy_instance(e, LOOM_KIND_CACHE, e->cache_self);
        destroy_instance(e, e->be_kind ? e->be_kind : LOOM_KIND_BACKEND, e->be_self);
        for (int32_t i = 0; i < e->num_inner; i++) destroy_instance(e, LOOM_KIND_BACKEND, e->inner[i]);
        destroy_instance(e, LOOM_KIND_QUANTIZER, e->quant_self); /* after the backend released its tensors */
    }
    loom_tokenizer_free(e->tok);
    loom_model_free(e->model);
    loom_pipeline_destroy(e->pipe);
    free(e->sched_entries);
    free(e->preempted);
    free(e->preempt_modes);
    free(e->tok_ids);
    free(e->positions);
    free(e->query_start);
    free(e->context_len);
    free(e->block_table);
    free(e->logits_index);
    free(e->slots);
    free(e->logits);
    free(e->logit_seqs);
    free(e->scratch);
    free(e->top_ids);
    free(e->top_vals);
    free(e->top_lse);
    free(e->want_full);
    free(e->top_seqs);
    free(e->inner);
    free(e->ops);
    free(e->pairs);
    free(e->spec_buf);
    pthread_mutex_destroy(&e->inbox_mu);
    free(e);
}

/* ----------------------------------------------------------- accessors */

const loom_engine_api *loom_engine_api_get(void) {
    static const loom_engine_api api = {
        .struct_size = sizeof(loom_engine_api),
        .create = loom_engine_create,
        .destroy = loom_engine_destroy,
        .add_request = loom_engine_add_request,
        .abort = loom_engine_abort,
        .step = loom_engine_step,
        .vocab_size = loom_engine_vocab_size,
        .max_context = loom_engine_max_context,
    };
    return &api;
}

static loom_status need_tokenizer(const loom_engine *e, loom_error *err) {
    if (e->tok) return LOOM_OK;
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "this model has no tokenizer (dummy weights): give prompt token ids instead of text");
}

loom_status loom_engine_tokenize(loom_engine *e, const char *text, bool add_bos, int32_t **ids, int32_t *n,
                                 loom_error *err) {
    loom_status st = need_tokenizer(e, err);
    if (st != LOOM_OK) return st;
    return loom_tokenizer_encode(e->tok, text, strlen(text), add_bos, false, ids, n, err);
}

loom_status loom_engine_detokenize(loom_engine *e, const int32_t *ids, int32_t n, char **text, loom_error *err) {
    loom_status st = need_tokenizer(e, err);
    if (st != LOOM_OK) return st;
    return loom_tokenizer_decode(e->tok, ids, n, true, text, err);
}

const char *loom_engine_token_piece(const loom_engine *e, int32_t id, size_t *len) {
    if (!e->tok) {
        if (len) *len = 0;
        return NULL;
    }
    return loom_tokenizer_piece(e->tok, id, len);
}

int32_t loom_engine_vocab_size(const loom_engine *e) { return e->vocab; }
int32_t loom_engine_max_context(const loom_engine *e) { return e->max_model_len; }
const char *loom_engine_model_name(const loom_engine *e) {
    return e->mcfg && e->mcfg->name[0] ? e->mcfg->name : "model";
}

loom_status loom_engine_set_observer(loom_engine *e, const loom_act_observer *obs, loom_error *err) {
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, e->be_kind);
    const char *name = slot && slot->name ? slot->name : "?";
    /* set_observer arrived in ABI 1.2: a plugin built earlier has a shorter table */
    if (e->be_kind != LOOM_KIND_BACKEND ||
        e->be->struct_size < offsetof(loom_backend_ops, set_observer) + sizeof e->be->set_observer ||
        !e->be->set_observer)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s '%s' cannot record activations (no set_observer); calibrate with "
                              "backend: {plugin: cpu} and no executor",
                              loom_kind_name(e->be_kind), name);
    return e->be->set_observer(e->be_self, obs, err);
}
