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
#include "util/workers.h"

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
    return e->run.kv_block_bytes(e->run.self, block_size, e->layout.dtype);
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

/* A packed AWQ/GPTQ checkpoint keeps its linear weights only as 4-bit
 * words: it runs only through a quantizer that accepts that packing, and
 * only when the quantizer plans every packed weight to something other
 * than NONE. Checked before the runner loads, so no backend ever meets a
 * packed weight it cannot run. */
static loom_status check_packing(loom_engine *e, const char *path, loom_error *err) {
    const loom_model_packing *pk = e->view->packing;
    if (!pk) return LOOM_OK;
    const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, LOOM_KIND_QUANTIZER);
    char fix[128];
    snprintf(fix, sizeof fix, "quantizer: {plugin: int4, source: %s, group_size: %d}", pk->method, pk->group_size);
    if (!e->quant)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: model '%s' is a packed 4-bit %s checkpoint (%s, groups of %d); its linear "
                              "weights exist only packed, so the pipeline needs a quantizer that accepts that "
                              "packing, e.g. %s",
                              path, e->mcfg->name, pk->method, pk->source, pk->group_size, fix);
    if (!e->quant->accepts_packing)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: quantizer '%s' quantizes float weights, but model '%s' is a packed 4-bit %s "
                              "checkpoint (%s); use a quantizer that accepts that packing, e.g. %s",
                              path, slot->name, e->mcfg->name, pk->method, pk->source, fix);
    loom_status st = e->quant->accepts_packing(e->quant_self, e->view, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: quantizer '%s'", path, slot->name);
        return st;
    }
    for (int32_t i = 0; i < e->view->count(e->view->ctx); i++) {
        const loom_tensor *t = e->view->at(e->view->ctx, i);
        if (!loom_model_is_packed_weight(e->model, t)) continue;
        loom_quant_plan plan = {.struct_size = sizeof plan};
        if ((st = e->quant->plan(e->quant_self, e->view, t, &plan, err)) != LOOM_OK) {
            loom_error_prefix(err, "%s: quantizer '%s'", path, slot->name);
            return st;
        }
        if (plan.format == LOOM_QFMT_NONE)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "%s: quantizer '%s' keeps tensor '%s' unquantized (a quantizer.skip pattern "
                                  "matches it), but model '%s' stores it only as packed 4-bit %s data; remove it "
                                  "from skip (for a packed LM head: skip: \"token_embd\")",
                                  path, slot->name, t->name, e->mcfg->name, pk->method);
    }
    return LOOM_OK;
}

/* The pipeline, with every diagnostic in one error. */
static loom_status load_pipeline(loom_engine *e, const char *path, const char *const *overrides, int32_t n,
                                 loom_error *err) {
    loom_diag diag;
    loom_diag_init(&diag);
    loom_status st = loom_pipeline_load(path, overrides, n, &e->pipe, &diag);
    if (st != LOOM_OK) diag_to_err(&diag, st, path, err);
    loom_diag_free(&diag);
    return st;
}

/* The model, its tokenizer and chat format. */
static loom_status load_model(loom_engine *e, const char *path, loom_error *err) {
    const loom_engine_settings *es = loom_pipeline_engine(e->pipe);
    const loom_model_settings *ms = loom_pipeline_model(e->pipe);
    static const char *const fmt_names[] = {"auto", "gguf", "safetensors", "dummy"};
    int last_pct = -1;
    loom_model_load_opts mo = {
        .path = ms->path[0] ? ms->path : NULL,
        .format = fmt_names[ms->format],
        .dummy_shape = ms->shape[0] ? ms->shape : NULL,
        .seed = (uint64_t)ms->seed,
        .dummy_dtype = ms->dtype,
        .num_layers_override = ms->layers,
        .progress = es->progress || isatty(2) ? load_progress : NULL,
        .user = &last_pct,
    };
    loom_status st = loom_model_load(&mo, &e->model, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: model", path);
        return st;
    }
    e->view = loom_model_view_get(e->model);
    e->mcfg = loom_model_config_get(e->model);
    e->vocab = e->mcfg->vocab_size;
    e->max_model_len = es->max_model_len > 0 ? es->max_model_len : e->mcfg->max_context;
    if (e->max_model_len < 2)
        return loom_error_set(err, LOOM_ERR_INVALID, "%s: engine.max_model_len %d is too small", path,
                              e->max_model_len);
    if ((st = load_tokenizer(e, err)) != LOOM_OK) {
        loom_error_prefix(err, "%s: tokenizer", path);
        return st;
    }
    if (e->tok) {
        static const loom_chat_format map[] = {LOOM_CHAT_AUTO, LOOM_CHAT_CHATML, LOOM_CHAT_LLAMA3, LOOM_CHAT_LLAMA2,
                                               LOOM_CHAT_AUTO, LOOM_CHAT_GEMMA};
        e->chat_format = ms->chat_template == LOOM_CHAT_TEMPLATE_AUTO ? loom_tokenizer_chat_format(e->tok)
                                                                      : map[ms->chat_template];
        e->chat_none = ms->chat_template == LOOM_CHAT_TEMPLATE_NONE;
    }
    return LOOM_OK;
}

/* The oldest ABI minor among the runner's plugins (the executor and its
 * backend, or the backend): what the engine may ask of forward_topk. */
static uint32_t runner_abi_minor(const loom_engine *e) {
    uint32_t minor = LOOM_ABI_MINOR;
    const loom_kind kinds[] = {LOOM_KIND_EXECUTOR, LOOM_KIND_BACKEND};
    for (int i = 0; i < 2; i++) {
        const loom_pipeline_slot *slot = loom_pipeline_slot_get(e->pipe, kinds[i]);
        const loom_plugin_desc *d = slot ? loom_plugin_desc_of(slot->plugin) : NULL;
        if (d && d->abi_minor < minor) minor = d->abi_minor;
    }
    return minor;
}

static void runner_from_backend(loom_runner *r, const loom_backend_ops *o) {
    r->load = o->load;
    r->kv_block_bytes = o->kv_block_bytes;
    r->memory = o->memory;
    r->kv_alloc = o->kv_alloc;
    r->forward = o->forward;
    r->copy_blocks = o->copy_blocks;
    r->forward_topk = o->forward_topk;
    r->swap_blocks = o->swap_blocks;
    r->set_observer = o->set_observer;
    if (LOOM_HAS_FIELD(o, loom_backend_ops, kv_write_blocks)) {
        r->kv_read_blocks = o->kv_read_blocks;
        r->kv_write_blocks = o->kv_write_blocks;
    }
    r->kv_groups = LOOM_HAS_FIELD(o, loom_backend_ops, kv_groups) ? o->kv_groups : NULL;
    r->kv_image_device = LOOM_HAS_FIELD(o, loom_backend_ops, kv_image_device) ? o->kv_image_device : NULL;
    r->kv_default_dtype = LOOM_HAS_FIELD(o, loom_backend_ops, kv_default_dtype) ? o->kv_default_dtype : NULL;
}

/* An executor and the N backend instances it drives (one per rank). */
static loom_status create_executor(loom_engine *e, const loom_executor_ops *x, const char *path, loom_error *err) {
    loom_runner *r = &e->run;
    r->load = x->load;
    r->kv_block_bytes = x->kv_block_bytes;
    r->memory = x->memory;
    r->kv_alloc = x->kv_alloc;
    r->forward = x->forward;
    r->copy_blocks = x->copy_blocks;
    r->forward_topk = x->forward_topk;
    r->swap_blocks = x->swap_blocks;
    const loom_pipeline_slot *bslot = loom_pipeline_slot_get(e->pipe, LOOM_KIND_BACKEND);
    if (!bslot)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "%s: an executor needs a backend: section saying what each rank runs "
                              "(e.g. backend: {plugin: cpu})",
                              path);
    int32_t n = x->inner_count(r->self);
    if (n < 1 || n > 1024)
        return loom_error_set(err, LOOM_ERR_INVALID, "%s: executor '%s' asked for %d inner backends (1..1024)", path,
                              r->name, n);
    if (!(e->inner = calloc((size_t)n, sizeof(void *)))) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n; i++) {
        loom_status st = loom_pipeline_create_instance(bslot, e->host, &e->inner[i], err);
        if (st != LOOM_OK) return st;
        e->num_inner++;
    }
    return x->attach_inner(r->self, bslot->component->ops, e->inner, n, err);
}

/* The model runner: the executor when the pipeline has one, else the
 * backend. Created first: the cache is sized from what it has left. */
static loom_status create_runner(loom_engine *e, const char *path, loom_error *err) {
    const bool exec = loom_pipeline_slot_get(e->pipe, LOOM_KIND_EXECUTOR) != NULL;
    loom_runner *r = &e->run;
    r->kind = exec ? LOOM_KIND_EXECUTOR : LOOM_KIND_BACKEND;
    r->name = loom_pipeline_slot_get(e->pipe, r->kind) ? loom_pipeline_slot_get(e->pipe, r->kind)->name : "?";
    const void *ops;
    loom_status st = make_instance(e, r->kind, true, &ops, &r->self, err);
    if (st != LOOM_OK) return st;
    if (!exec) {
        runner_from_backend(r, ops);
        return LOOM_OK;
    }
    return create_executor(e, ops, path, err);
}

/* Every other plugin instance, the order fixed by what needs what. */
static loom_status create_plugins(loom_engine *e, loom_error *err) {
    const void *ops;
    loom_status st;
    if ((st = make_instance(e, LOOM_KIND_QUANTIZER, false, &ops, &e->quant_self, err)) != LOOM_OK) return st;
    e->quant = ops;
    if ((st = make_instance(e, LOOM_KIND_CACHE, true, &ops, &e->cache_self, err)) != LOOM_OK) return st;
    e->cache = ops;
    if ((st = make_instance(e, LOOM_KIND_SCHEDULER, true, &ops, &e->sch_self, err)) != LOOM_OK) return st;
    e->sch = ops;
    if ((st = make_instance(e, LOOM_KIND_SAMPLER, true, &ops, &e->smp_self, err)) != LOOM_OK) return st;
    e->smp = ops;
    if ((st = make_instance(e, LOOM_KIND_SPECULATOR, false, &ops, &e->spec_self, err)) != LOOM_OK) return st;
    e->spec = ops;
    if ((st = make_instance(e, LOOM_KIND_CONSTRAINT, false, &ops, &e->con_self, err)) != LOOM_OK) return st;
    e->con = ops;
    /* Rows are reduced on the device only when the runner can and the
     * sampler said it can use candidates (loom/sampler.h). */
    e->device_sampling = loom_pipeline_engine(e->pipe)->device_sampling && e->run.forward_topk && e->smp->candidates;
    e->device_masks = e->device_sampling && runner_abi_minor(e) >= 4;
    return LOOM_OK;
}

/* Weights to the runner, through the quantizer when there is one. */
static loom_status load_weights(loom_engine *e, const char *path, loom_error *err) {
    loom_status st = check_packing(e, path, err);
    if (st != LOOM_OK) return st;
    if (e->quant)
        e->quant_binding = (loom_quant_binding){sizeof(loom_quant_binding), e->quant, e->quant_self,
                                                loom_pipeline_slot_get(e->pipe, LOOM_KIND_QUANTIZER)->name};
    st = e->run.load(e->run.self, e->view, e->quant ? &e->quant_binding : NULL, err);
    if (st != LOOM_OK) loom_error_prefix(err, "%s: %s '%s' loading weights", path, loom_kind_name(e->run.kind), e->run.name);
    return st;
}

/* A type a KV cache may hold (the answers loom/quant.h and loom/backend.h
 * allow, besides LOOM_DTYPE_COUNT). */
static bool kv_cache_type(loom_dtype d) {
    return d == LOOM_DTYPE_F32 || d == LOOM_DTYPE_F16 || d == LOOM_DTYPE_BF16 || d == LOOM_DTYPE_FP8_E4M3;
}

/* The KV element type: the quantizer's kv_dtype() when it has one, and
 * only a type loom/quant.h allows there (F32, F16, BF16, FP8_E4M3, or
 * LOOM_DTYPE_COUNT for the backend's default). */
static loom_status kv_dtype(loom_engine *e, const char *path, loom_dtype *out, loom_error *err) {
    *out = LOOM_DTYPE_COUNT;
    if (!e->quant || !e->quant->kv_dtype) return LOOM_OK;
    const loom_dtype d = e->quant->kv_dtype(e->quant_self);
    if (kv_cache_type(d) || d == LOOM_DTYPE_COUNT) {
        *out = d;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INTERNAL,
                          "%s: quantizer '%s' kv_dtype() returned %d, which is not a KV-cache type: loom/quant.h "
                          "allows F32 (%d), F16 (%d), BF16 (%d), FP8_E4M3 (%d) or LOOM_DTYPE_COUNT (%d, the "
                          "backend's default)",
                          path, loom_pipeline_slot_get(e->pipe, LOOM_KIND_QUANTIZER)->component->name, (int)d,
                          LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16, LOOM_DTYPE_FP8_E4M3, LOOM_DTYPE_COUNT);
}

/* The backend's own KV type in place of LOOM_DTYPE_COUNT, where it can
 * name it (loom/backend.h kv_default_dtype): the layout the engine hands
 * on, and loom_engine_kv_info's kv_dtype, then say what the pools hold —
 * f16 and bf16 have the same block size, so the size alone cannot tell
 * two engines' block images apart. */
static loom_status kv_default_dtype(loom_engine *e, const char *path, loom_dtype *dt, loom_error *err) {
    if (*dt != LOOM_DTYPE_COUNT || !e->run.kv_default_dtype) return LOOM_OK;
    const loom_dtype d = e->run.kv_default_dtype(e->run.self);
    if (kv_cache_type(d)) {
        *dt = d;
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_INTERNAL,
                          "%s: backend '%s' kv_default_dtype() returned %d, which is not a KV-cache type: "
                          "loom/backend.h allows F32 (%d), F16 (%d), BF16 (%d) or FP8_E4M3 (%d)",
                          path, e->run.name, (int)d, LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16,
                          LOOM_DTYPE_FP8_E4M3);
}

/* The runner's proposal of block-table groups (loom/backend.h), checked;
 * *out NULL when it makes none (executors, backends before ABI 2.4). */
static loom_status runner_groups(loom_engine *e, const char *path, const loom_kv_groups **out, loom_error *err) {
    *out = NULL;
    if (!e->run.kv_groups) return LOOM_OK;
    loom_kv_groups *g = &e->kv_groups;
    *g = (loom_kv_groups){.struct_size = sizeof *g};
    loom_status st = e->run.kv_groups(e->run.self, g, err);
    if (st != LOOM_OK) {
        loom_error_prefix(err, "%s: %s '%s' kv_groups()", path, loom_kind_name(e->run.kind), e->run.name);
        return st;
    }
    bool ok = g->num_groups >= 1 && g->num_groups <= LOOM_KV_GROUPS_MAX && g->num_layers >= 1 &&
              g->layers_per_block >= 1 && g->layers_per_block <= g->num_layers;
    for (int32_t i = 0; ok && i < g->num_groups; i++) ok = g->window[i] >= 0;
    if (!ok)
        return loom_error_set(err, LOOM_ERR_INTERNAL,
                              "%s: %s '%s' proposed %d block-table groups of %d layers per block (of %d): want "
                              "1..%d groups, 1..num_layers layers and windows >= 0",
                              path, loom_kind_name(e->run.kind), e->run.name, g->num_groups, g->layers_per_block,
                              g->num_layers, LOOM_KV_GROUPS_MAX);
    *out = g;
    return LOOM_OK;
}

/* What the cache manager made of the proposal: the engine's group count
 * and windows for every batch. */
static loom_status take_groups(loom_engine *e, const loom_kv_groups *proposal, loom_error *err) {
    const char *name = loom_pipeline_slot_get(e->pipe, LOOM_KIND_CACHE)->name;
    int32_t g = e->layout.num_groups;
    e->num_groups = 1;
    e->group_window = NULL;
    if (g == 0) return LOOM_OK;
    if (!proposal || g != proposal->num_groups)
        return loom_error_set(err, LOOM_ERR_INTERNAL, "cache '%s' set layout.num_groups %d; the runner proposed %d",
                              name, g, proposal ? proposal->num_groups : 0);
    if (g > 1 && !(LOOM_HAS_FIELD(e->cache, loom_cache_ops, group_table) && e->cache->group_table))
        return loom_error_set(err, LOOM_ERR_INTERNAL, "cache '%s' took %d block-table groups but has no group_table()",
                              name, g);
    e->num_groups = g;
    for (int32_t i = 0; i < g; i++)
        if (proposal->window[i] > 0) e->group_window = proposal->window;
    return LOOM_OK;
}

/* Size the KV cache with the cache manager and allocate it on the runner. */
static loom_status size_cache(loom_engine *e, const char *path, loom_error *err) {
    e->layout.struct_size = sizeof e->layout;
    loom_status st = kv_dtype(e, path, &e->layout.dtype, err);
    if (st == LOOM_OK) st = kv_default_dtype(e, path, &e->layout.dtype, err);
    if (st != LOOM_OK) return st;
    loom_backend_memory mem = {.struct_size = sizeof mem};
    st = e->run.memory(e->run.self, &mem, err);
    if (st != LOOM_OK) return st;
    const loom_kv_groups *groups = NULL;
    if ((st = runner_groups(e, path, &groups, err)) != LOOM_OK) return st;
    loom_cache_init ci = {
        .struct_size = sizeof ci,
        .block_bytes = cache_block_bytes,
        .ctx = e,
        .device_free_bytes = mem.free_bytes,
        .device_total_bytes = mem.total_bytes,
        .max_model_len = e->max_model_len,
        .backend_can_swap = e->run.swap_blocks != NULL,
        .groups = groups,
    };
    e->layout.num_groups = 0;
    if ((st = e->cache->init(e->cache_self, &ci, &e->layout, err)) != LOOM_OK) {
        loom_error_prefix(err, "%s: cache '%s'", path, loom_pipeline_slot_get(e->pipe, LOOM_KIND_CACHE)->name);
        return st;
    }
    if ((st = take_groups(e, groups, err)) != LOOM_OK) return st;
    if (e->layout.block_size < 1 || e->layout.num_blocks < 1)
        return loom_error_set(err, LOOM_ERR_INTERNAL, "cache manager returned an empty layout (%d blocks of %d)",
                              e->layout.num_blocks, e->layout.block_size);
    e->bt_stride = (e->max_model_len + e->layout.block_size - 1) / e->layout.block_size;
    if ((st = e->run.kv_alloc(e->run.self, &e->layout, err)) != LOOM_OK)
        loom_error_prefix(err, "%s: KV cache of %d blocks x %d tokens", path, e->layout.num_blocks,
                          e->layout.block_size);
    return st;
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
    const char *path = pipeline_path;
    loom_status st = load_pipeline(e, path, overrides, num_overrides, err);
    if (st == LOOM_OK) {
        const loom_engine_settings *es = loom_pipeline_engine(e->pipe);
        loom_host_set_threads(es->threads);
        e->log_level = es->log_level;
        loom_log_hold(e->log_level, +1);
        e->log_held = true;
        e->seed = (uint64_t)es->seed;
        st = load_model(e, path, err);
    }
    if (st == LOOM_OK) st = create_runner(e, path, err);
    if (st == LOOM_OK) st = create_plugins(e, err);
    if (st == LOOM_OK) st = engine_constraint_init(e, err);
    if (st == LOOM_OK) st = load_weights(e, path, err);
    if (st == LOOM_OK) st = size_cache(e, path, err);
    if (st == LOOM_OK && e->spec) {
        loom_spec_init si = {sizeof si, e->vocab, loom_pipeline_dir(e->pipe), e->max_model_len, loom_engine_api_get()};
        st = e->spec->init(e->spec_self, &si, err);
    }
    if (st != LOOM_OK) {
        loom_engine_destroy(e);
        return st;
    }
    loom_log(LOOM_LOG_INFO, "engine", "%s: %d layers, KV cache %d blocks x %d tokens, context %d", e->mcfg->name,
             e->mcfg->num_layers, e->layout.num_blocks, e->layout.block_size, e->max_model_len);
    *out = e;
    return LOOM_OK;
}

void loom_engine_destroy(loom_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->num_reqs; i++) {
        loom_req *rq = e->reqs[i];
        for (int32_t k = 0; k < rq->n; k++) loom_engine_seq_free(rq->seqs[k]);
        loom_engine_req_free(rq);
    }
    for (int32_t i = 0; i < e->num_deferred; i++) loom_engine_req_free(e->deferred[i]);
    free(e->deferred);
    engine_kv_fini(e);
    while (e->inbox_head) {
        loom_inbox_item *it = e->inbox_head;
        e->inbox_head = it->next;
        loom_engine_req_free(it->req);
        engine_handoff_free(it->kv);
        free(it->kv_fail);
        free(it);
    }
    free(e->reqs);
    free(e->seqs);
    if (e->pipe) {
        destroy_instance(e, LOOM_KIND_SPECULATOR, e->spec_self);
        destroy_instance(e, LOOM_KIND_CONSTRAINT, e->con_self); /* after every request's grammar */
        destroy_instance(e, LOOM_KIND_SAMPLER, e->smp_self);
        destroy_instance(e, LOOM_KIND_SCHEDULER, e->sch_self);
        destroy_instance(e, LOOM_KIND_CACHE, e->cache_self);
        destroy_instance(e, e->run.kind ? e->run.kind : LOOM_KIND_BACKEND, e->run.self);
        for (int32_t i = 0; i < e->num_inner; i++) destroy_instance(e, LOOM_KIND_BACKEND, e->inner[i]);
        destroy_instance(e, LOOM_KIND_QUANTIZER, e->quant_self); /* after the backend released its tensors */
    }
    if (e->phase_steps > 0) {
        const double f = 1e3 / (double)e->phase_steps, *ph = e->phase_seconds;
        loom_log(LOOM_LOG_INFO, "engine",
                 "%lld steps, ms a step: inbox %.3f, drafts %.3f, schedule %.3f, batch %.3f, row plan %.3f, "
                 "forward %.3f, sample + append + stream %.3f, reap %.3f",
                 (long long)e->phase_steps, f * ph[ENGINE_PH_INBOX], f * ph[ENGINE_PH_PROPOSE],
                 f * ph[ENGINE_PH_SCHEDULE], f * ph[ENGINE_PH_BATCH], f * ph[ENGINE_PH_ROWS],
                 f * ph[ENGINE_PH_FORWARD], f * ph[ENGINE_PH_SAMPLE], f * ph[ENGINE_PH_REAP]);
    }
    /* after the plugins: what they log as they go (a backend's step split)
     * is still at the engine's level */
    if (e->log_held) loom_log_hold(e->log_level, -1);
    engine_constraint_fini(e);
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
    free(e->row_allowed);
    free(e->mask_rows);
    free(e->mask_status);
    loom_workers_free(e->mask_workers);
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
        .request_default = loom_request_default,
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

loom_status loom_engine_detokenize_bytes(loom_engine *e, const int32_t *ids, int32_t n, char **text, size_t *len,
                                         loom_error *err) {
    loom_status st = need_tokenizer(e, err);
    if (st != LOOM_OK) return st;
    return loom_tokenizer_decode_bytes(e->tok, ids, n, true, text, len, err);
}

const char *loom_engine_token_piece(const loom_engine *e, int32_t id, size_t *len) {
    if (!e->tok) {
        if (len) *len = 0;
        return NULL;
    }
    return loom_tokenizer_piece(e->tok, id, len);
}

int32_t loom_engine_vocab_size(const loom_engine *e) { return e->vocab; }
const char *loom_engine_chat_template(const loom_engine *e) {
    if (!e->tok || e->chat_none) return NULL;
    loom_chat_format f = e->chat_format != LOOM_CHAT_AUTO ? e->chat_format : loom_tokenizer_chat_format(e->tok);
    if (f == LOOM_CHAT_LLAMA2 && tok_chat_mistral(e->tok)) return "mistral"; /* the variant chat.c writes */
    return loom_chat_format_name(f != LOOM_CHAT_AUTO ? f : LOOM_CHAT_CHATML); /* chat.c's fallback */
}
int32_t loom_engine_max_context(const loom_engine *e) { return e->max_model_len; }
const char *loom_engine_model_name(const loom_engine *e) {
    return e->mcfg && e->mcfg->name[0] ? e->mcfg->name : "model";
}

loom_status loom_engine_set_observer(loom_engine *e, const loom_act_observer *obs, loom_error *err) {
    if (!e->run.set_observer)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s '%s' cannot record activations (no set_observer); calibrate with "
                              "backend: {plugin: cpu} and no executor",
                              loom_kind_name(e->run.kind), e->run.name);
    return e->run.set_observer(e->run.self, obs, err);
}
