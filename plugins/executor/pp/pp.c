/*
 * plugins/executor/pp/pp.c — the "pp" executor (loom/executor.h): pipeline
 * parallelism over pp_size stages of tp_size tensor-parallel ranks each,
 * one backend instance per rank (rank = stage * tp_size + tensor rank).
 *
 * Each stage holds a contiguous range of decoder layers (an even split, or
 * `layers` per stage) and the KV pools of those layers; stage 0 embeds, the
 * last stage computes the logits. The engine drives the executor as one
 * backend, and it fans every call out to the ranks' own threads:
 *   load        each rank's load_stage() — its layer range, its links to the
 *               neighbouring stages, and with tp_size > 1 its stage's
 *               communicator; ranks load one after another (a quantizer's
 *               plan/quantize/release are [instance]);
 *   kv_block_bytes  the largest over ranks (a stage's block covers only its
 *               layers; one block id names the same block on every stage);
 *   memory      the smallest free memory over ranks, divided by the ranks
 *               (they share host RAM);
 *   kv_alloc, copy_blocks, swap_blocks  every rank, same args;
 *   forward, forward_topk  the step's batch cut into micro_batches
 *               sub-batches of whole sequences (pp_split.c); every rank runs
 *               them in order, receiving each micro-batch's residual stream
 *               from the previous stage and sending it to the next
 *               (pp_link.c), so stage s runs micro-batch m while stage s + 1
 *               runs m - 1; the last stage's tensor rank 0 writes each
 *               micro-batch's rows of the logits (or of forward_topk's
 *               summaries).
 *
 * Threads, failure: as the tp executor — a persistent worker per rank, a
 * job posted to all and awaited (plugins/executor/common/rank_pool.h); the first rank to fail aborts the links
 * and the stages' collectives so no peer waits forever, and the call
 * reports that rank's error. Links and collectives: `threads` (host
 * memory: cpu ranks, or cuda ranks sharing one GPU that stage the residual
 * stream through pinned memory; pp_link.c and tp_comm.c) or `nccl` (one GPU
 * per rank; pp_nccl.c, compiled in CUDA builds, not yet run: one GPU here).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pp.h"
#include "rank_pool.h"
#include "topk_rows.h"
#include "tp.h"

#define PP_MAX_STAGES 64
#define PP_MAX_TP 64

/* ---------------------------------------------------------------- config */

enum { PP_COMM_THREADS = 0, PP_COMM_NCCL = 1 };
static const char *const pp_comm_choices[] = {"threads", "nccl", NULL};

typedef struct pp_config {
    int64_t pp_size;                        /* stages                          */
    int64_t tp_size;                        /* tensor ranks per stage          */
    int64_t micro_batches;                  /* sub-batches per step            */
    char layers[LOOM_PARAM_STRING_MAX];     /* "a,b,..." per stage; "" = even  */
    int64_t comm;                           /* PP_COMM_*                       */
} pp_config;

static const loom_param pp_params[] = {
    {.key = "pp_size", .type = LOOM_PARAM_INT, .offset = offsetof(pp_config, pp_size),
     .default_value = "2", .min = 1, .max = PP_MAX_STAGES,
     .doc = "pipeline stages, each a contiguous range of layers (at most the model's layers)"},
    {.key = "tp_size", .type = LOOM_PARAM_INT, .offset = offsetof(pp_config, tp_size),
     .default_value = "1", .min = 1, .max = PP_MAX_TP,
     .doc = "tensor-parallel ranks inside each stage (pp_size x tp_size backend instances); "
            "heads and the FFN width must divide by it"},
    {.key = "micro_batches", .type = LOOM_PARAM_INT, .offset = offsetof(pp_config, micro_batches),
     .default_value = "1", .min = 1, .max = PP_MAX_MICRO_BATCHES,
     .doc = "sub-batches of whole sequences a step is cut into, so stages overlap (at most the "
            "step's sequences); 1 = none"},
    {.key = "layers", .type = LOOM_PARAM_STRING, .offset = offsetof(pp_config, layers),
     .default_value = "", .min = 1, .max = 0,
     .doc = "decoder layers per stage, comma-separated (e.g. \"10,12,8\"), summing to the "
            "model's; empty = an even split, earlier stages taking the remainder"},
    {.key = "comm", .type = LOOM_PARAM_ENUM, .offset = offsetof(pp_config, comm),
     .default_value = "threads", .min = 1, .max = 0, .choices = pp_comm_choices,
     .doc = "links and stage collectives: threads (host memory: cpu ranks, or cuda ranks sharing one GPU), "
            "nccl (rank i on GPU i of this node; compiled in CUDA builds, not yet run on several GPUs)"},
    {.key = NULL},
};

/* ----------------------------------------------------------------- state */

typedef enum pp_op {
    PP_OP_BIND = 1, /* make the rank's GPU current on its thread (nccl)       */
    PP_OP_LOAD,
    PP_OP_MEMORY,
    PP_OP_KV_ALLOC,
    PP_OP_FORWARD,
    PP_OP_COPY,
    PP_OP_SWAP,
} pp_op;

/* One call, the same for every rank (all pointers borrowed for the call). */
typedef struct pp_job {
    pp_op op;
    int32_t only;                      /* one rank's turn, or -1 = all ranks  */
    const loom_model_view *model;
    const loom_quant_binding *quant;
    const loom_kv_layout *layout;
    const pp_mb *mbs;                  /* PP_OP_FORWARD: the micro-batches    */
    int32_t num_mbs;
    float *logits;                     /* the step's (last stage, rank 0)     */
    const loom_logits_topk *topk;      /* the step's, instead of logits       */
    const int32_t *pairs;
    int32_t n;
    loom_swap_dir dir;
} pp_job;

struct pp_exec;

typedef struct pp_rank {
    const struct pp_exec *pp;
    int32_t index;                     /* stage * tp_size + tensor rank       */
    int32_t stage, trank;              /* its stage, its rank inside it       */
    void *inst;                        /* the backend instance (engine-owned) */
    loom_stage link;                   /* handed to load_stage                */
    pp_end end;                        /* link.ctx (threads)                  */
#ifdef LOOM_PP_HAVE_NCCL
    pp_nccl_end nend;                  /* link.ctx (nccl)                     */
#endif
    loom_comm comm;                    /* the stage's collectives (tp_size > 1) */
    loom_backend_memory mem;           /* PP_OP_MEMORY result                 */
} pp_rank;

typedef struct pp_exec {
    const loom_host *host;
    pp_config cfg;
    int32_t stages, tp, size;          /* size = stages * tp                  */
    const loom_backend_ops *inner;
    pp_rank *ranks;                    /* (size) after attach_inner           */
    tp_threads *tc[PP_MAX_STAGES];     /* each stage's collectives (tp > 1)   */
    pp_links *links;                   /* (stages - 1) * tp (threads)         */
#ifdef LOOM_PP_HAVE_NCCL
    pp_nccl *nc;                       /* links and collectives (nccl)        */
#endif
    int32_t first[PP_MAX_STAGES + 1];  /* stage s: layers first[s]..first[s+1]-1 */
    bool loaded;
    int64_t vocab;
    loom_kv_layout kv;                 /* after kv_alloc (for batch checks)   */
    bool kv_ready;
    pp_split split;                    /* the step's micro-batches            */
    topk_rows topk;                    /* forward_topk without the backend's  */
    rank_pool pool;                    /* the ranks' threads (rank_pool.h)    */
} pp_exec;

/* ---------------------------------------------------------------- workers */

static void pp_abort_all(pp_exec *pp) {
#ifdef LOOM_PP_HAVE_NCCL
    pp_nccl_abort(pp->nc);
#endif
    pp_links_abort(pp->links);
    for (int32_t s = 0; s < pp->stages; s++)
        if (pp->tc[s]) tp_threads_abort(pp->tc[s]);
}

/* The micro-batches in order on this rank; the last stage's tensor rank 0
 * writes each one's rows of the step's logits or summaries. */
static loom_status pp_rank_forward(const pp_rank *rk, const pp_job *j, loom_error *err) {
    const pp_exec *pp = rk->pp;
    const loom_backend_ops *o = pp->inner;
    const bool writes = rk->stage == pp->stages - 1 && rk->trank == 0;
    loom_status st = LOOM_OK;
    for (int32_t m = 0; m < j->num_mbs && st == LOOM_OK; m++) {
        const pp_mb *mb = &j->mbs[m];
        if (writes && j->topk) {
            const loom_logits_topk *t = j->topk;
            const int64_t r = mb->row0, k = t->k;
            loom_logits_topk sub = *t;
            sub.top_ids = t->top_ids + r * k;
            sub.top_vals = t->top_vals + r * k;
            sub.lse = t->lse + r;
            sub.want_full = t->want_full + r;
            sub.full = t->full ? t->full + r * pp->vocab : NULL;
            /* the engine's fill_masks runs once however many parts call it */
            if (LOOM_HAS_FIELD(t, loom_logits_topk, allowed) && t->allowed) sub.allowed = t->allowed + r;
            st = o->forward_topk(rk->inst, &mb->batch, &sub, err);
        } else {
            float *rows = writes && j->logits ? j->logits + (int64_t)mb->row0 * pp->vocab : NULL;
            st = o->forward(rk->inst, &mb->batch, rows, err);
        }
    }
    return st;
}

/* [rank thread] Run one job (rank_pool's run hook). */
static loom_status pp_rank_run(void *ctx, int32_t rank, const void *job, loom_error *err) {
    pp_exec *pp = ctx;
    pp_rank *rk = &pp->ranks[rank];
    const pp_job *j = job;
    const loom_backend_ops *o = pp->inner;
    const loom_comm *comm = pp->tp > 1 ? &rk->comm : NULL;
    switch (j->op) {
    case PP_OP_BIND:
#ifdef LOOM_PP_HAVE_NCCL
        return pp->nc ? pp_nccl_bind_thread(pp->nc, rk->index, err) : LOOM_OK;
#else
        return LOOM_OK;
#endif
    case PP_OP_LOAD: return o->load_stage(rk->inst, j->model, j->quant, &rk->link, comm, err);
    case PP_OP_MEMORY:
        rk->mem = (loom_backend_memory){.struct_size = sizeof rk->mem};
        return o->memory(rk->inst, &rk->mem, err);
    case PP_OP_KV_ALLOC: return o->kv_alloc(rk->inst, j->layout, err);
    case PP_OP_FORWARD: return pp_rank_forward(rk, j, err);
    case PP_OP_COPY: return o->copy_blocks(rk->inst, j->pairs, j->n, err);
    case PP_OP_SWAP: return o->swap_blocks(rk->inst, j->dir, j->pairs, j->n, err);
    }
    return LOOM_OK;
}

/* [rank thread, pool lock held] rank_pool's abort hook. */
static void pp_pool_abort(void *ctx) { pp_abort_all(ctx); }

/* [engine] Post `j` to every rank, wait for all, and report the first
 * failure (naming its stage and rank) into err. */
static loom_status pp_run(pp_exec *pp, pp_job j, loom_error *err) {
    const loom_host *h = pp->host;
#ifdef LOOM_PP_HAVE_NCCL
    if (pp_nccl_aborted(pp->nc))
        return h->error(h->ctx, err, LOOM_ERR_DEVICE,
                        "executor pp: the NCCL communicators were aborted after a rank failed; recreate the "
                        "engine");
#endif
    int32_t failed = rank_pool_run(&pp->pool, &j, j.only);
    if (failed < 0) return LOOM_OK;
    /* every rank has left its links and collectives: reusable again */
    pp_links_reset(pp->links);
    for (int32_t s = 0; s < pp->stages; s++)
        if (pp->tc[s]) tp_threads_reset(pp->tc[s]);
    const pp_rank *rk = &pp->ranks[failed];
    const loom_status st = rank_pool_status(&pp->pool, failed);
    const loom_error *fe = rank_pool_error(&pp->pool, failed);
    if (pp->size == 1) {
        if (err) *err = *fe;
        return st;
    }
    return h->error(h->ctx, err, st, "stage %d of %d, tensor rank %d of %d: %s", rk->stage,
                    pp->stages, rk->trank, pp->tp, fe->message);
}

/* ---------------------------------------------------------------- lifetime */

/* comm nccl needs a build with NCCL and a GPU per rank. */
static loom_status pp_check_comm(const loom_host *host, const pp_config *cfg, loom_error *err) {
    if (cfg->comm != PP_COMM_NCCL) return LOOM_OK;
#ifndef LOOM_PP_HAVE_NCCL
    return host->error(host->ctx, err, LOOM_ERR_UNSUPPORTED,
                       "executor pp: comm nccl, but this loom-executor-pp.so was built without CUDA and NCCL; "
                       "host backends such as cpu use comm: threads");
#else
    const char *why = NULL;
    int ndev = pp_nccl_device_count(&why);
    const long long need = (long long)(cfg->pp_size * cfg->tp_size);
    if (ndev < 0)
        return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                           "executor pp: comm nccl needs %lld GPUs, but CUDA found none usable (%s)", need,
                           why ? why : "?");
    if (ndev < need)
        return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                           "executor pp: pp_size x tp_size = %lld ranks need %lld GPUs, but %d %s visible", need,
                           need, ndev, ndev == 1 ? "is" : "are");
    return LOOM_OK;
#endif
}

static loom_status pp_create(const loom_host *host, const void *config, void **self,
                             loom_error *err) {
    if (!host || !self || host->struct_size < offsetof(loom_host, num_threads) + sizeof(void *)) {
        if (err) {
            err->code = LOOM_ERR_ABI;
            snprintf(err->message, sizeof err->message,
                     "executor pp: create() needs a host table of at least %zu bytes (got %u)",
                     offsetof(loom_host, num_threads) + sizeof(void *),
                     host ? host->struct_size : 0u);
        }
        return LOOM_ERR_ABI;
    }
    *self = NULL;
    pp_config cfg = {.pp_size = 2, .tp_size = 1, .micro_batches = 1};
    if (config) memcpy(&cfg, config, sizeof cfg);
    cfg.layers[sizeof cfg.layers - 1] = '\0';
    if (cfg.pp_size < 1 || cfg.pp_size > PP_MAX_STAGES || cfg.tp_size < 1 || cfg.tp_size > PP_MAX_TP ||
        cfg.micro_batches < 1 || cfg.micro_batches > PP_MAX_MICRO_BATCHES || cfg.comm < PP_COMM_THREADS ||
        cfg.comm > PP_COMM_NCCL)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor pp: bad config (pp_size %lld in [1, %d], tp_size %lld in [1, %d], "
                           "micro_batches %lld in [1, %d], comm %lld in {0 threads, 1 nccl})",
                           (long long)cfg.pp_size, PP_MAX_STAGES, (long long)cfg.tp_size, PP_MAX_TP,
                           (long long)cfg.micro_batches, PP_MAX_MICRO_BATCHES, (long long)cfg.comm);
    loom_status st = pp_check_comm(host, &cfg, err);
    if (st != LOOM_OK) return st;
    pp_exec *pp = host->calloc(host->ctx, 1, sizeof *pp);
    if (!pp) return host->error(host->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory");
    pp->host = host;
    pp->cfg = cfg;
    pp->stages = (int32_t)cfg.pp_size;
    pp->tp = (int32_t)cfg.tp_size;
    pp->size = pp->stages * pp->tp;
    if ((st = rank_pool_init(&pp->pool, host, "executor pp", pp_rank_run, pp_pool_abort, pp, err)) != LOOM_OK) {
        host->free(host->ctx, pp);
        return st;
    }
    *self = pp;
    return LOOM_OK;
}

static void pp_destroy(void *self) {
    pp_exec *pp = self;
    if (!pp) return;
    const loom_host *h = pp->host;
    rank_pool_fini(&pp->pool); /* stops the ranks' threads first */
    for (int32_t s = 0; s < pp->stages; s++) tp_threads_destroy(pp->tc[s]);
    pp_links_destroy(pp->links);
#ifdef LOOM_PP_HAVE_NCCL
    pp_nccl_destroy(pp->nc);
#endif
    pp_split_free(&pp->split, h);
    topk_rows_free(&pp->topk, h);
    h->free(h->ctx, pp->ranks);
    h->free(h->ctx, pp);
}

static int32_t pp_inner_count(void *self) { return ((pp_exec *)self)->size; }

/* The stages' collectives (tp > 1) and the links between stages. */
static loom_status pp_make_comms(pp_exec *pp, loom_error *err) {
    const loom_host *h = pp->host;
#ifdef LOOM_PP_HAVE_NCCL
    if (pp->cfg.comm == PP_COMM_NCCL) return pp_nccl_create(h, pp->size, pp->tp, &pp->nc, err);
#endif
    for (int32_t s = 0; pp->tp > 1 && s < pp->stages; s++)
        if (!(pp->tc[s] = tp_threads_create(h, pp->tp)))
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "executor pp: out of memory for stage %d's communicator", s);
    if (!(pp->links = pp_links_create(h, (pp->stages - 1) * pp->tp)))
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory for the links");
    return LOOM_OK;
}

/* Rank i: its stage, its links (ctx = its pp_end) and its collectives. */
static void pp_init_rank(pp_exec *pp, pp_rank *rk, int32_t i, void *inst) {
    const int32_t s = i / pp->tp, t = i % pp->tp;
    *rk = (pp_rank){.pp = pp, .index = i, .stage = s, .trank = t, .inst = inst};
    rk->end = (pp_end){.links = pp->links, .rank = i,
                       .recv_link = s > 0 ? (s - 1) * pp->tp + t : -1,
                       .send_link = s < pp->stages - 1 ? s * pp->tp + t : -1};
    rk->link = (loom_stage){.struct_size = sizeof rk->link, .index = s, .count = pp->stages,
                            .ctx = &rk->end,
                            .recv_prev = s > 0 ? pp_link_recv : NULL,
                            .send_next = s < pp->stages - 1 ? pp_link_send : NULL};
    if (pp->tp > 1)
        rk->comm = (loom_comm){.struct_size = sizeof rk->comm, .rank = t, .size = pp->tp,
                               .ctx = pp->tc[s], .all_reduce_sum = tp_threads_all_reduce,
                               .all_gather = tp_threads_all_gather, .all_to_allv = tp_threads_all_to_allv,
                               .host_memory = 1};
#ifdef LOOM_PP_HAVE_NCCL
    if (!pp->nc) return;
    rk->nend = (pp_nccl_end){.nc = pp->nc, .rank = i, .prev = s > 0 ? i - pp->tp : -1,
                             .next = s < pp->stages - 1 ? i + pp->tp : -1};
    rk->link.ctx = &rk->nend;
    rk->link.recv_prev = s > 0 ? pp_nccl_recv : NULL;
    rk->link.send_next = s < pp->stages - 1 ? pp_nccl_send : NULL;
    rk->link.device_links = 1;
    rk->comm.ctx = pp_nccl_stage_ctx(pp->nc, s);
    rk->comm.all_reduce_sum = pp_nccl_all_reduce;
    rk->comm.all_gather = pp_nccl_all_gather;
    rk->comm.all_to_allv = NULL; /* the stage communicators have no all-to-all over NCCL */
    rk->comm.host_memory = 0;
#endif
}

static loom_status pp_attach_inner(void *self, const loom_backend_ops *inner, void *const *instances,
                                   int32_t n, loom_error *err) {
    pp_exec *pp = self;
    const loom_host *h = pp->host;
    if (pp->ranks) return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor pp: attach_inner() called twice");
    if (!inner || !instances || n != pp->size)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: attach_inner() got %d backend instances, pp_size x tp_size is %d",
                        n, pp->size);
    if (!LOOM_HAS_FIELD(inner, loom_backend_ops, load_stage) || !inner->load_stage)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor pp: the pipeline's backend cannot be a pipeline stage: its ops "
                        "table has no load_stage (ABI 2.3; backends with pipeline support: cpu, cuda)");
    for (int32_t i = 0; i < n; i++)
        if (!instances[i])
            return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor pp: backend instance of rank %d is NULL", i);
    pp->inner = inner;
    loom_status st = pp_make_comms(pp, err);
    if (st != LOOM_OK) return st;
    pp_rank *ranks = h->calloc(h->ctx, (size_t)n, sizeof *ranks);
    if (!ranks) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory");
    for (int32_t i = 0; i < n; i++) pp_init_rank(pp, &ranks[i], i, instances[i]);
    /* the workers read pp->ranks: set before they start */
    pp->ranks = ranks;
    if ((st = rank_pool_start(&pp->pool, n, err)) != LOOM_OK) {
        pp->ranks = NULL;
        h->free(h->ctx, ranks);
        return st;
    }
    if (pp->cfg.comm == PP_COMM_NCCL && (st = pp_run(pp, (pp_job){.op = PP_OP_BIND, .only = -1}, err)) != LOOM_OK)
        return st;
    h->log(h->ctx, LOOM_LOG_INFO, PP_WHO, "%d stage(s) x %d tensor rank(s), %s links, %lld micro-batch(es)",
           pp->stages, pp->tp, pp->cfg.comm == PP_COMM_NCCL ? "NCCL" : "threads",
           (long long)pp->cfg.micro_batches);
    return LOOM_OK;
}

/* ------------------------------------------------------------ the split */

/* pp->first[] from the `layers` list: per-stage counts >= 1 summing to L. */
static loom_status pp_parse_layers(pp_exec *pp, int32_t L, loom_error *err) {
    const loom_host *h = pp->host;
    const char *p = pp->cfg.layers;
    int32_t s = 0;
    int64_t sum = 0;
    pp->first[0] = 0;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || (*end && *end != ',') || s >= pp->stages)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "executor pp: layers \"%s\" must be %d comma-separated counts >= 1, one "
                            "per stage, summing to the model's %d layers",
                            pp->cfg.layers, pp->stages, L);
        sum += v;
        pp->first[s + 1] = pp->first[s] + (int32_t)v;
        s++;
        p = *end ? end + 1 : end;
    }
    if (s != pp->stages || sum != L)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: layers \"%s\" gives %d stage(s) %lld layers; pp_size is %d and "
                        "the model has %d layers: give one count per stage, summing to %d",
                        pp->cfg.layers, s, (long long)sum, pp->stages, L, L);
    return LOOM_OK;
}

/* Stage s's layers: first[s]..first[s+1]-1, from `layers` or an even split
 * (the remainder to the earlier stages: the last one also runs the LM
 * head). */
static loom_status pp_plan_layers(pp_exec *pp, const loom_model_config *c, loom_error *err) {
    const loom_host *h = pp->host;
    const int32_t L = c->num_layers, P = pp->stages;
    if (P > L)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: pp_size %d exceeds the %d layers of model '%s': every stage "
                        "needs at least one layer; use pp_size <= %d",
                        P, L, c->name, L);
    if (pp->cfg.layers[0]) return pp_parse_layers(pp, L, err);
    pp->first[0] = 0;
    for (int32_t s = 0; s < P; s++) pp->first[s + 1] = pp->first[s] + L / P + (s < L % P ? 1 : 0);
    return LOOM_OK;
}

/* Tensor ranks inside a stage: the model must split over tp_size. */
static loom_status pp_check_tp(pp_exec *pp, const loom_model_config *c, loom_error *err) {
    const int32_t n = pp->tp;
    if (n == 1) return LOOM_OK;
    if (c->num_heads % n == 0 && c->intermediate_size % n == 0 &&
        (c->num_kv_heads % n == 0 || n % c->num_kv_heads == 0))
        return LOOM_OK;
    return pp->host->error(pp->host->ctx, err, LOOM_ERR_INVALID,
                           "executor pp: tp_size %d does not split model '%s' (%d heads, %d KV heads, "
                           "FFN width %d): heads and FFN width must divide by it, and KV heads "
                           "divide by it or it by them",
                           n, c->name, c->num_heads, c->num_kv_heads, c->intermediate_size);
}

/* ------------------------------------------------------------------- ops */

static loom_status pp_need(pp_exec *pp, bool loaded, const char *op, loom_error *err) {
    const loom_host *h = pp->host;
    if (!pp->ranks)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: %s() before attach_inner(): the engine gives the executor its "
                        "backends first",
                        op);
    if (loaded && !pp->loaded) return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor pp: %s() before load()", op);
    return LOOM_OK;
}

static void pp_log_plan(pp_exec *pp, const loom_model_config *c) {
    char plan[256];
    size_t len = 0;
    for (int32_t s = 0; s < pp->stages && len < sizeof plan; s++)
        len += (size_t)snprintf(plan + len, sizeof plan - len, "%s%d..%d", s ? " | " : "", pp->first[s],
                                pp->first[s + 1] - 1);
    pp->host->log(pp->host->ctx, LOOM_LOG_INFO, PP_WHO, "'%s' over %d stages x %d tensor ranks: layers %s",
                  c->name, pp->stages, pp->tp, plan);
}

static loom_status pp_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                           loom_error *err) {
    pp_exec *pp = self;
    const loom_host *h = pp->host;
    loom_status st = pp_need(pp, false, "load", err);
    if (st != LOOM_OK) return st;
    if (pp->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor pp: load() called twice; create a new engine per model");
    if (!m || !m->config) return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor pp: load() needs a model view");
    const loom_model_config *c = m->config;
    if ((st = pp_plan_layers(pp, c, err)) != LOOM_OK || (st = pp_check_tp(pp, c, err)) != LOOM_OK) return st;
    for (int32_t i = 0; i < pp->size; i++) {
        pp_rank *rk = &pp->ranks[i];
        rk->link.first_layer = pp->first[rk->stage];
        rk->link.num_layers = pp->first[rk->stage + 1] - pp->first[rk->stage];
    }
    /* one rank at a time: a quantizer's plan/quantize/release are
     * [instance], and peak host memory stays one rank's */
    for (int32_t i = 0; i < pp->size; i++)
        if ((st = pp_run(pp, (pp_job){.op = PP_OP_LOAD, .only = i, .model = m, .quant = quant}, err)) != LOOM_OK)
            return st;
    pp->loaded = true;
    pp->vocab = c->vocab_size;
    pp_log_plan(pp, c);
    return LOOM_OK;
}

static size_t pp_kv_block_bytes(void *self, int32_t block_size, loom_dtype dtype) {
    pp_exec *pp = self;
    if (!pp->ranks || !pp->loaded) return 0;
    size_t most = 0;
    for (int32_t i = 0; i < pp->size; i++) {
        size_t b = pp->inner->kv_block_bytes(pp->ranks[i].inst, block_size, dtype);
        if (b == 0) return 0; /* one rank cannot: none can */
        if (b > most) most = b;
    }
    return most;
}

static loom_status pp_memory(void *self, loom_backend_memory *out, loom_error *err) {
    pp_exec *pp = self;
    loom_status st = pp_need(pp, false, "memory", err);
    if (st != LOOM_OK) return st;
    if (!out) return pp->host->error(pp->host->ctx, err, LOOM_ERR_INVALID, "executor pp: memory() needs out");
    if ((st = pp_run(pp, (pp_job){.op = PP_OP_MEMORY, .only = -1}, err)) != LOOM_OK) return st;
    loom_backend_memory m = pp->ranks[0].mem;
    for (int32_t i = 1; i < pp->size; i++) {
        const loom_backend_memory *r = &pp->ranks[i].mem;
        if (r->free_bytes < m.free_bytes) m.free_bytes = r->free_bytes;
        if (r->total_bytes < m.total_bytes) m.total_bytes = r->total_bytes;
        m.weight_bytes += r->weight_bytes; /* disjoint layers (or tp shards): the pipeline holds the sum */
    }
    if (pp->cfg.comm == PP_COMM_THREADS) {
        /* host backends share one RAM: each rank's KV pool gets its part */
        m.free_bytes /= (size_t)pp->size;
        m.total_bytes /= (size_t)pp->size;
    }
    m.struct_size = sizeof m;
    *out = m;
    return LOOM_OK;
}

static loom_status pp_kv_alloc(void *self, const loom_kv_layout *layout, loom_error *err) {
    pp_exec *pp = self;
    loom_status st = pp_need(pp, true, "kv_alloc", err);
    if (st != LOOM_OK) return st;
    if ((st = pp_run(pp, (pp_job){.op = PP_OP_KV_ALLOC, .only = -1, .layout = layout}, err)) != LOOM_OK) return st;
    pp->kv = *layout;
    pp->kv_ready = true;
    return LOOM_OK;
}

/* Check the step's batch (the split reads its offsets) and cut it. */
static loom_status pp_split_step(pp_exec *pp, const loom_batch *b, int32_t *num_mbs, loom_error *err) {
    const loom_host *h = pp->host;
    if (!pp->kv_ready) return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor pp: forward() before kv_alloc()");
    char why[LOOM_ERROR_MSG_MAX - 32];
    loom_status st = h->check_batch(b, NULL, true, pp->kv.block_size, pp->kv.num_blocks,
                                    (int32_t)pp->vocab, 0, why, sizeof why);
    if (st != LOOM_OK) return h->error(h->ctx, err, st, "executor pp: %s", why);
    *num_mbs = pp_split_batch(&pp->split, h, b, (int32_t)pp->cfg.micro_batches);
    if (*num_mbs < 0) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor pp: out of memory for micro-batches");
    return LOOM_OK;
}

static loom_status pp_forward_job(pp_exec *pp, const loom_batch *b, float *logits,
                                  const loom_logits_topk *topk, loom_error *err) {
    int32_t n = 0;
    loom_status st = pp_need(pp, true, "forward", err);
    if (st != LOOM_OK || (st = pp_split_step(pp, b, &n, err)) != LOOM_OK) return st;
    pp_job j = {.op = PP_OP_FORWARD, .only = -1, .mbs = pp->split.mbs, .num_mbs = n, .logits = logits,
                .topk = topk};
    return pp_run(pp, j, err);
}

static loom_status pp_forward(void *self, const loom_batch *batch, float *logits, loom_error *err) {
    return pp_forward_job(self, batch, logits, NULL, err);
}

/* forward_topk over a backend without one: whole rows, reduced here. */
static loom_status pp_topk_on_host(pp_exec *pp, const loom_batch *b, const loom_logits_topk *out,
                                   loom_error *err) {
    const loom_host *h = pp->host;
    const int64_t V = pp->vocab, NL = b ? b->num_logits : 0;
    if (NL <= 0) return pp_forward_job(pp, b, NULL, NULL, err);
    loom_status st = topk_rows_reserve(&pp->topk, h, "executor pp", NL, V, err);
    if (st != LOOM_OK || (st = pp_forward_job(pp, b, pp->topk.rows, NULL, err)) != LOOM_OK) return st;
    return topk_rows_reduce(&pp->topk, h, NL, V, out, err);
}

static loom_status pp_forward_topk(void *self, const loom_batch *batch, const loom_logits_topk *out,
                                   loom_error *err) {
    pp_exec *pp = self;
    if (!out || out->struct_size < offsetof(loom_logits_topk, allowed) || out->k < 1 || out->k > LOOM_LOGITS_TOPK_MAX)
        return pp->host->error(pp->host->ctx, err, LOOM_ERR_INVALID,
                               "executor pp: forward_topk: k = %d is outside 1..%d", out ? out->k : 0,
                               LOOM_LOGITS_TOPK_MAX);
    if (pp->inner && pp->inner->forward_topk) return pp_forward_job(pp, batch, NULL, out, err);
    return pp_topk_on_host(pp, batch, out, err);
}

static loom_status pp_copy_blocks(void *self, const int32_t *pairs, int32_t n, loom_error *err) {
    pp_exec *pp = self;
    loom_status st = pp_need(pp, true, "copy_blocks", err);
    if (st != LOOM_OK) return st;
    return pp_run(pp, (pp_job){.op = PP_OP_COPY, .only = -1, .pairs = pairs, .n = n}, err);
}

static loom_status pp_swap_blocks(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                                  loom_error *err) {
    pp_exec *pp = self;
    loom_status st = pp_need(pp, true, "swap_blocks", err);
    if (st != LOOM_OK) return st;
    if (!pp->inner->swap_blocks)
        return pp->host->error(pp->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                               "executor pp: the pipeline's backend cannot swap blocks; give the cache "
                               "no swap space (cpu_swap_gib: 0)");
    return pp_run(pp, (pp_job){.op = PP_OP_SWAP, .only = -1, .dir = dir, .pairs = pairs, .n = n}, err);
}

/* ------------------------------------------------------------- descriptor */

static const loom_executor_ops pp_ops = {
    .struct_size = sizeof(loom_executor_ops),
    .create = pp_create,
    .destroy = pp_destroy,
    .inner_count = pp_inner_count,
    .attach_inner = pp_attach_inner,
    .load = pp_load,
    .kv_block_bytes = pp_kv_block_bytes,
    .memory = pp_memory,
    .kv_alloc = pp_kv_alloc,
    .forward = pp_forward,
    .forward_topk = pp_forward_topk,
    .copy_blocks = pp_copy_blocks,
    .swap_blocks = pp_swap_blocks,
};

static const loom_component pp_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_EXECUTOR,
    .name = "pp",
    .summary = "pipeline parallelism: contiguous layer ranges on pp_size stages (tp_size tensor "
               "ranks each), micro-batches, threads links between stages",
    .ops = &pp_ops,
    .params = pp_params,
    .config_size = sizeof(pp_config),
}};

static const loom_plugin_desc pp_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-executor-pp",
    .version = "0.1.0",
    .num_components = 1,
    .components = pp_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &pp_desc; }
