/*
 * plugins/executor/tp/tp.c — the "tp" executor (loom/executor.h): tensor
 * parallelism over N instances of the pipeline's backend, one per rank.
 *
 * The engine creates this executor, asks inner_count() (= size), creates
 * that many backends from the pipeline's `backend:` section and hands them
 * to attach_inner(); from then on the engine talks only to the executor,
 * through its model-runner methods, and the executor fans every call out:
 *   load        each rank's load_shard() with its communicator — ranks load
 *               one after another (a quantizer's plan/quantize/release are
 *               [instance]: never called concurrently);
 *   kv_block_bytes  the largest over ranks, so one block id means the same
 *               block on every rank ("ranks mirror the block tables");
 *   memory      the smallest free memory over ranks (divided by size when
 *               the ranks share host RAM);
 *   kv_alloc, copy_blocks, swap_blocks, forward  every rank, same args;
 *               only rank 0 is given the logits buffer;
 *   forward_topk  rank 0 reduces the gathered logits rows where they are
 *               (the backend's forward_topk), its peers run forward() with
 *               no buffer; with a backend that has no forward_topk, rank 0
 *               returns whole rows and they are reduced here on the host.
 * The split itself — which heads, FFN columns and vocabulary rows a rank
 * keeps — is the backend's (Megatron-style, docs/tensor-parallel.md); this
 * file checks that the model divides over the size first, with a message
 * that lists the sizes that would work.
 *
 * Threads: each rank has a persistent worker thread; a call posts one job
 * and waits for every rank (plugins/executor/common/rank_pool.h). Ranks
 * run concurrently because their forward passes block in the collectives
 * until all ranks arrive. When one rank fails, the
 * communicator is aborted so its peers return instead of waiting forever,
 * and the call reports the first failure, prefixed with the rank.
 *
 * Communicators: `threads` (tp_comm.c, host memory, any build) or `nccl`
 * (tp_nccl.c, one GPU per rank, only in builds with LOOM_TP_HAVE_NCCL).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rank_pool.h"
#include "topk_rows.h"
#include "tp.h"

#define TP_MAX_SIZE 1024

/* ---------------------------------------------------------------- config */

enum { TP_COMM_AUTO = 0, TP_COMM_THREADS = 1, TP_COMM_NCCL = 2 };
static const char *const tp_comm_choices[] = {"auto", "threads", "nccl", NULL};

typedef struct tp_config {
    int64_t size;                         /* ranks on this node                */
    int64_t comm;                         /* TP_COMM_*                         */
    char rendezvous[LOOM_PARAM_STRING_MAX]; /* node 0's host:port, multi-node  */
    int64_t nodes;                        /* processes (one per node)          */
    int64_t node_rank;                    /* this process, 0..nodes-1          */
    int64_t rendezvous_timeout;           /* seconds                           */
    int64_t p2p_kib;                      /* peer-to-peer collectives up to    */
} tp_config;

static const loom_param tp_params[] = {
    {.key = "size", .type = LOOM_PARAM_INT, .offset = offsetof(tp_config, size),
     .default_value = "1", .min = 1, .max = TP_MAX_SIZE,
     .doc = "tensor-parallel ranks on this node (one backend instance each; one GPU each with "
            "nccl); heads and the FFN width must divide by size x nodes"},
    {.key = "comm", .type = LOOM_PARAM_ENUM, .offset = offsetof(tp_config, comm),
     .default_value = "auto", .min = 1, .max = 0, .choices = tp_comm_choices,
     .doc = "collectives: threads (shared memory: cpu ranks, or GPU ranks staging through host memory, "
            "all on one GPU, for testing), nccl (one GPU per rank), auto = nccl when a rendezvous is set, "
            "else threads"},
    {.key = "rendezvous", .type = LOOM_PARAM_STRING, .offset = offsetof(tp_config, rendezvous),
     .default_value = "", .min = 1, .max = 0,
     .doc = "multi-node: host:port where node 0 serves the NCCL id (same on every node)"},
    {.key = "nodes", .type = LOOM_PARAM_INT, .offset = offsetof(tp_config, nodes),
     .default_value = "1", .min = 1, .max = 1024,
     .doc = "multi-node: processes in the group, one per node, each with `size` GPUs"},
    {.key = "node_rank", .type = LOOM_PARAM_INT, .offset = offsetof(tp_config, node_rank),
     .default_value = "0", .min = 0, .max = 1023,
     .doc = "multi-node: this process's node, 0..nodes-1 (node 0 serves the rendezvous)"},
    {.key = "rendezvous_timeout", .type = LOOM_PARAM_INT,
     .offset = offsetof(tp_config, rendezvous_timeout), .default_value = "300", .min = 1,
     .max = 86400, .doc = "multi-node: seconds to wait for every node to join"},
    {.key = "p2p_kib", .type = LOOM_PARAM_INT, .offset = offsetof(tp_config, p2p_kib),
     .default_value = "0", .min = 0, .max = 262144,
     .doc = "nccl, one node: collectives of at most this many KiB per rank run as loom's own "
            "peer-to-peer kernels instead of NCCL (lower latency for decode steps, and the cuda "
            "backend may then capture sharded steps into CUDA graphs); 0 = NCCL for all"},
    {.key = NULL},
};

/* ----------------------------------------------------------------- state */

typedef enum tp_op {
    TP_OP_BIND = 1, /* make the rank's GPU current on its thread (nccl)       */
    TP_OP_LOAD,
    TP_OP_MEMORY,
    TP_OP_KV_ALLOC,
    TP_OP_FORWARD,
    TP_OP_FORWARD_TOPK,
    TP_OP_COPY,
    TP_OP_SWAP,
} tp_op;

/* One call, the same for every rank (all pointers borrowed for the call). */
typedef struct tp_job {
    tp_op op;
    int32_t only;                      /* one rank's turn, or -1 = all ranks  */
    const loom_model_view *model;
    const loom_quant_binding *quant;
    const loom_kv_layout *layout;
    const loom_batch *batch;
    float *logits;                     /* rank 0's                            */
    const loom_logits_topk *topk;      /* rank 0's (TP_OP_FORWARD_TOPK)       */
    const int32_t *pairs;
    int32_t n;
    loom_swap_dir dir;
} tp_job;

typedef struct tp_rank {
    int32_t index;                     /* local rank, 0..size-1               */
    void *inst;                        /* the backend instance (engine-owned) */
    loom_comm comm;                    /* handed to load_shard                */
    loom_backend_memory mem;           /* TP_OP_MEMORY result                 */
} tp_rank;

typedef struct tp_exec {
    const loom_host *host;
    tp_config cfg;
    int32_t size, world, base;         /* local ranks, all ranks, first global */
    int comm_kind;                     /* TP_COMM_THREADS or TP_COMM_NCCL     */
    const loom_backend_ops *inner;
    tp_rank *ranks;                    /* (size) after attach_inner           */
    tp_threads *tc;                    /* threads communicator                */
#ifdef LOOM_TP_HAVE_NCCL
    tp_nccl *nc;                       /* NCCL communicator                   */
#endif
    bool loaded;
    int64_t vocab;                     /* the loaded model's                  */
    topk_rows topk;                    /* forward_topk without the backend's  */
    rank_pool pool;                    /* the ranks' threads (rank_pool.h)    */
} tp_exec;

/* ---------------------------------------------------------------- helpers */

static void tp_comm_abort(tp_exec *tp) {
    if (tp->tc) tp_threads_abort(tp->tc);
#ifdef LOOM_TP_HAVE_NCCL
    if (tp->nc) tp_nccl_abort(tp->nc);
#endif
}

/* [rank thread] Run one job (rank_pool's run hook). */
static loom_status tp_rank_run(void *ctx, int32_t rank, const void *job, loom_error *err) {
    tp_exec *tp = ctx;
    tp_rank *rk = &tp->ranks[rank];
    const tp_job *j = job;
    const loom_backend_ops *o = tp->inner;
    switch (j->op) {
    case TP_OP_BIND:
#ifdef LOOM_TP_HAVE_NCCL
        return tp->nc ? tp_nccl_bind_thread(tp->nc, rk->index, err) : LOOM_OK;
#else
        return LOOM_OK;
#endif
    case TP_OP_LOAD: return o->load_shard(rk->inst, j->model, j->quant, &rk->comm, err);
    case TP_OP_MEMORY:
        rk->mem = (loom_backend_memory){.struct_size = sizeof rk->mem};
        return o->memory(rk->inst, &rk->mem, err);
    case TP_OP_KV_ALLOC: return o->kv_alloc(rk->inst, j->layout, err);
    case TP_OP_FORWARD: return o->forward(rk->inst, j->batch, rk->index == 0 ? j->logits : NULL, err);
    case TP_OP_FORWARD_TOPK:
        return rk->index == 0 ? o->forward_topk(rk->inst, j->batch, j->topk, err)
                              : o->forward(rk->inst, j->batch, NULL, err);
    case TP_OP_COPY: return o->copy_blocks(rk->inst, j->pairs, j->n, err);
    case TP_OP_SWAP: return o->swap_blocks(rk->inst, j->dir, j->pairs, j->n, err);
    }
    return LOOM_OK;
}

/* [rank thread, pool lock held] rank_pool's abort hook. */
static void tp_pool_abort(void *ctx) { tp_comm_abort(ctx); }

/* [engine] Post `j` to every rank, wait for all, and report the first
 * failure (rank-prefixed) into err. */
static loom_status tp_run(tp_exec *tp, tp_job j, loom_error *err) {
    const loom_host *h = tp->host;
#ifdef LOOM_TP_HAVE_NCCL
    if (tp->nc && tp_nccl_aborted(tp->nc))
        return h->error(h->ctx, err, LOOM_ERR_DEVICE,
                        "executor tp: the NCCL communicator was aborted after a rank failed; "
                        "recreate the engine");
#endif
    int32_t failed = rank_pool_run(&tp->pool, &j, j.only);
#ifdef LOOM_TP_HAVE_NCCL
    /* every rank synced its stream: a peer-to-peer kernel that gave up
     * waiting for a peer has said so by now */
    if (failed < 0 && tp->nc) {
        loom_status cs = tp_nccl_check(tp->nc, err);
        if (cs != LOOM_OK) {
            tp_comm_abort(tp);
            return cs;
        }
    }
#endif
    if (failed < 0) return LOOM_OK;
    /* every rank has left its collectives: the threads group can be reused */
    if (tp->tc) tp_threads_reset(tp->tc);
    const loom_status st = rank_pool_status(&tp->pool, failed);
    const loom_error *fe = rank_pool_error(&tp->pool, failed);
    if (tp->size == 1) {
        if (err) *err = *fe;
        return st;
    }
    return h->error(h->ctx, err, st, "rank %d of %d: %s", tp->base + failed, tp->world,
                    fe->message);
}

/* Sizes n (up to 64, and at most heads) the model splits over: heads and
 * FFN width divide by n, KV heads divide by n or n by them. */
static bool tp_size_fits(const loom_model_config *c, int32_t n) {
    return c->num_heads % n == 0 && c->intermediate_size % n == 0 &&
           (c->num_kv_heads % n == 0 || n % c->num_kv_heads == 0);
}

static void tp_sizes_that_fit(const loom_model_config *c, char *buf, size_t cap) {
    size_t len = 0;
    int found = 0;
    buf[0] = '\0';
    for (int32_t n = 1; n <= 64 && n <= c->num_heads; n++) {
        if (!tp_size_fits(c, n)) continue;
        len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%d", found ? ", " : "", n);
        found++;
    }
}

/* The model must split over world ranks; the message says why not and
 * which total sizes would work. */
static loom_status tp_check_model(tp_exec *tp, const loom_model_config *c, loom_error *err) {
    const loom_host *h = tp->host;
    int32_t n = tp->world;
    char fit[256];
    tp_sizes_that_fit(c, fit, sizeof fit);
    const char *node_note = tp->cfg.nodes > 1 ? " (size x nodes)" : "";
    if (c->num_heads <= 0 || c->num_kv_heads <= 0 || c->intermediate_size <= 0 ||
        c->vocab_size <= 0)
        return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                        "executor tp: model '%s' has %d heads, %d KV heads, FFN width %d, vocab "
                        "%d; cannot shard it",
                        c->name, c->num_heads, c->num_kv_heads, c->intermediate_size,
                        c->vocab_size);
    if (c->num_heads % n != 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: model '%s' has %d attention heads, which do not divide by "
                        "tensor-parallel size %d%s (every rank must get the same number of "
                        "heads); use a size that divides the heads: %s",
                        c->name, c->num_heads, n, node_note, fit);
    if (c->intermediate_size % n != 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: model '%s' has FFN width (intermediate_size) %d, which does "
                        "not divide by tensor-parallel size %d%s; sizes that work for this model: "
                        "%s",
                        c->name, c->intermediate_size, n, node_note, fit);
    if (c->num_kv_heads % n != 0 && n % c->num_kv_heads != 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: model '%s' has %d KV heads for %d query heads; size %d%s "
                        "neither divides the KV heads nor is a multiple of them, so ranks would "
                        "need different KV heads; sizes that work for this model: %s",
                        c->name, c->num_kv_heads, c->num_heads, n, node_note, fit);
    return LOOM_OK;
}

/* ---------------------------------------------------------------- lifetime */

static void tp_destroy(void *self);

static loom_status tp_create(const loom_host *host, const void *config, void **self,
                             loom_error *err) {
    if (!host || !self || host->struct_size < offsetof(loom_host, num_threads) + sizeof(void *)) {
        if (err) {
            err->code = LOOM_ERR_ABI;
            snprintf(err->message, sizeof err->message,
                     "executor tp: create() needs a host table of at least %zu bytes (got %u)",
                     offsetof(loom_host, num_threads) + sizeof(void *),
                     host ? host->struct_size : 0u);
        }
        return LOOM_ERR_ABI;
    }
    *self = NULL;
    tp_config cfg = {.size = 1, .comm = TP_COMM_AUTO, .nodes = 1, .node_rank = 0,
                     .rendezvous_timeout = 300};
    if (config) memcpy(&cfg, config, sizeof cfg);
    cfg.rendezvous[sizeof cfg.rendezvous - 1] = '\0';
    bool rdv = cfg.rendezvous[0] != '\0';
    if (cfg.size < 1 || cfg.size > TP_MAX_SIZE)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: size %lld must be in [1, %d]: the number of ranks "
                           "(backend instances; GPUs with nccl) on this node",
                           (long long)cfg.size, TP_MAX_SIZE);
    if (cfg.comm < TP_COMM_AUTO || cfg.comm > TP_COMM_NCCL || cfg.nodes < 1 || cfg.nodes > 1024 ||
        cfg.rendezvous_timeout < 1)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: bad config (comm %lld in {0 auto, 1 threads, 2 nccl}, "
                           "nodes %lld in [1, 1024], rendezvous_timeout %lld >= 1)",
                           (long long)cfg.comm, (long long)cfg.nodes,
                           (long long)cfg.rendezvous_timeout);
    if (cfg.node_rank < 0 || cfg.node_rank >= cfg.nodes)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: node_rank %lld is outside 0..nodes-1 (nodes %lld)",
                           (long long)cfg.node_rank, (long long)cfg.nodes);
    if (cfg.nodes > 1 && !rdv)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: nodes %lld needs executor.rendezvous (host:port of node "
                           "0, the same on every node)",
                           (long long)cfg.nodes);
    if ((long long)cfg.size * cfg.nodes > TP_MAX_SIZE)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: size %lld x nodes %lld exceeds %d ranks",
                           (long long)cfg.size, (long long)cfg.nodes, TP_MAX_SIZE);
    int kind = (int)cfg.comm;
    if (kind == TP_COMM_AUTO) kind = rdv ? TP_COMM_NCCL : TP_COMM_THREADS;
    if (kind == TP_COMM_THREADS && (rdv || cfg.nodes > 1))
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: the threads communicator joins threads of one process; "
                           "multi-node (rendezvous '%s', nodes %lld) needs comm: nccl",
                           cfg.rendezvous, (long long)cfg.nodes);
    if (cfg.p2p_kib > 0 && kind != TP_COMM_NCCL)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "executor tp: p2p_kib %lld asks for peer-to-peer GPU collectives, which "
                           "serve comm: nccl (one GPU per rank); the threads communicator is host "
                           "memory: set p2p_kib: 0 or comm: nccl",
                           (long long)cfg.p2p_kib);
    if (kind == TP_COMM_NCCL) {
#ifndef LOOM_TP_HAVE_NCCL
        return host->error(host->ctx, err, LOOM_ERR_UNSUPPORTED,
                           "executor tp: comm nccl, but this loom-executor-tp.so was built without "
                           "CUDA and NCCL (configure with CUDA and libnccl present); host "
                           "backends such as cpu use comm: threads");
#else
        const char *why = NULL;
        int ndev = tp_nccl_device_count(&why);
        if (ndev < 0)
            return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                               "executor tp: comm nccl needs %lld GPUs on this node, but CUDA "
                               "found none usable (%s)",
                               (long long)cfg.size, why ? why : "?");
        if (ndev < cfg.size) {
            const char *vis = getenv("CUDA_VISIBLE_DEVICES");
            return host->error(host->ctx, err, LOOM_ERR_DEVICE,
                               "executor tp: size %lld asks for %lld GPUs on this node, but only "
                               "%d %s visible%s%s%s; lower executor.size",
                               (long long)cfg.size, (long long)cfg.size, ndev,
                               ndev == 1 ? "is" : "are", vis ? " (CUDA_VISIBLE_DEVICES=" : "",
                               vis ? vis : "", vis ? ")" : "");
        }
#endif
    }

    tp_exec *tp = host->calloc(host->ctx, 1, sizeof *tp);
    if (!tp)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM, "executor tp: out of memory");
    tp->host = host;
    tp->cfg = cfg;
    tp->size = (int32_t)cfg.size;
    tp->world = (int32_t)(cfg.size * cfg.nodes);
    tp->base = (int32_t)(cfg.node_rank * cfg.size);
    tp->comm_kind = kind;
    loom_status st = rank_pool_init(&tp->pool, host, "executor tp", tp_rank_run, tp_pool_abort, tp, err);
    if (st != LOOM_OK) {
        host->free(host->ctx, tp);
        return st;
    }
    *self = tp;
    return LOOM_OK;
}

static void tp_destroy(void *self) {
    tp_exec *tp = self;
    if (!tp) return;
    const loom_host *h = tp->host;
    rank_pool_fini(&tp->pool); /* stops the ranks' threads first */
    tp_threads_destroy(tp->tc);
#ifdef LOOM_TP_HAVE_NCCL
    tp_nccl_destroy(tp->nc);
#endif
    topk_rows_free(&tp->topk, h);
    h->free(h->ctx, tp->ranks);
    h->free(h->ctx, tp);
}

static int32_t tp_inner_count(void *self) { return ((tp_exec *)self)->size; }

static loom_status tp_attach_inner(void *self, const loom_backend_ops *inner,
                                   void *const *instances, int32_t n, loom_error *err) {
    tp_exec *tp = self;
    const loom_host *h = tp->host;
    loom_status st = LOOM_OK;
    if (tp->ranks)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: attach_inner() called twice");
    if (!inner || !instances || n != tp->size)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: attach_inner() got %d backend instances, size is %d", n,
                        tp->size);
    if (!inner->load_shard)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "executor tp: the pipeline's backend cannot be sharded: its ops table has "
                        "no load_shard (backends with tensor-parallel support: cpu, cuda)");
    for (int32_t i = 0; i < n; i++)
        if (!instances[i])
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "executor tp: backend instance of rank %d is NULL", i);
    tp->inner = inner;

    /* the communicator first: ranks get it in load_shard */
    loom_comm proto = {.struct_size = sizeof proto, .size = tp->world};
    if (tp->comm_kind == TP_COMM_THREADS) {
        tp->tc = tp_threads_create(h, tp->size);
        if (!tp->tc)
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "executor tp: out of memory for the threads communicator");
        proto.ctx = tp->tc;
        proto.all_reduce_sum = tp_threads_all_reduce;
        proto.all_gather = tp_threads_all_gather;
        proto.all_to_allv = tp_threads_all_to_allv;
        proto.host_memory = 1; /* a GPU backend stages through host memory; its ranks may share a GPU */
    } else {
#ifdef LOOM_TP_HAVE_NCCL
        if ((st = tp_nccl_create(h, tp->size, (int32_t)tp->cfg.nodes, (int32_t)tp->cfg.node_rank,
                                 tp->cfg.rendezvous, (int32_t)tp->cfg.rendezvous_timeout, &tp->nc,
                                 err)) != LOOM_OK)
            return st;
        proto.ctx = tp->nc;
        proto.all_reduce_sum = tp_nccl_all_reduce;
        proto.all_gather = tp_nccl_all_gather;
        proto.all_to_allv = tp_nccl_all_to_allv;
        if (tp->cfg.p2p_kib > 0)
            proto.graph_safe_bytes = (int64_t)tp_nccl_enable_p2p(tp->nc, (size_t)tp->cfg.p2p_kib << 10);
#else
        return h->error(h->ctx, err, LOOM_ERR_INTERNAL, "executor tp: nccl in a build without it");
#endif
    }

    tp_rank *ranks = h->calloc(h->ctx, (size_t)n, sizeof *ranks);
    if (!ranks) return h->error(h->ctx, err, LOOM_ERR_NOMEM, "executor tp: out of memory");
    for (int32_t i = 0; i < n; i++) {
        ranks[i] = (tp_rank){.index = i, .inst = instances[i], .comm = proto};
        ranks[i].comm.rank = tp->base + i;
    }
    /* the workers read tp->ranks: set before they start */
    tp->ranks = ranks;
    if ((st = rank_pool_start(&tp->pool, n, err)) != LOOM_OK) {
        tp->ranks = NULL;
        h->free(h->ctx, ranks);
        return st;
    }
    if (tp->comm_kind == TP_COMM_NCCL &&
        (st = tp_run(tp, (tp_job){.op = TP_OP_BIND, .only = -1}, err)) != LOOM_OK)
        return st;
    h->log(h->ctx, LOOM_LOG_INFO, TP_WHO, "%d rank(s) on this node%s, %s communicator", n,
           tp->cfg.nodes > 1 ? " of a multi-node group" : "",
           tp->comm_kind == TP_COMM_NCCL ? "NCCL" : "threads (shared memory)");
    return LOOM_OK;
}

/* ------------------------------------------------------------------- ops */

static loom_status tp_need(tp_exec *tp, bool loaded, const char *op, loom_error *err) {
    const loom_host *h = tp->host;
    if (!tp->ranks)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: %s() before attach_inner(): the engine gives the executor "
                        "its backends first",
                        op);
    if (loaded && !tp->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: %s() before load()", op);
    return LOOM_OK;
}

static loom_status tp_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                           loom_error *err) {
    tp_exec *tp = self;
    const loom_host *h = tp->host;
    loom_status st = tp_need(tp, false, "load", err);
    if (st != LOOM_OK) return st;
    if (tp->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "executor tp: load() called twice; create a new engine per model");
    if (!m || !m->config)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: load() needs a model view");
    const loom_model_config *c = m->config;
    if ((st = tp_check_model(tp, c, err)) != LOOM_OK) return st;
    /* one rank at a time: a quantizer's plan/quantize/release are
     * [instance] (loom/quant.h) and must never run concurrently, and peak
     * host memory stays one rank's */
    for (int32_t i = 0; i < tp->size; i++) {
        tp_job j = {.op = TP_OP_LOAD, .only = i, .model = m, .quant = quant};
        if ((st = tp_run(tp, j, err)) != LOOM_OK) return st;
    }
    tp->loaded = true;
    tp->vocab = c->vocab_size;
    int32_t n = tp->world;
    int64_t vpad = ((int64_t)c->vocab_size + n - 1) / n;
    char kv[96];
    if (c->num_kv_heads >= n)
        snprintf(kv, sizeof kv, "%d per rank", c->num_kv_heads / n);
    else
        snprintf(kv, sizeof kv, "1 per rank, each shared by %d ranks", n / c->num_kv_heads);
    h->log(h->ctx, LOOM_LOG_INFO, TP_WHO,
           "'%s' over %d ranks: %d heads per rank, KV heads %s, FFN %d per rank, vocabulary %lld "
           "per rank%s",
           c->name, n, c->num_heads / n, kv, c->intermediate_size / n, (long long)vpad,
           (int64_t)c->vocab_size == vpad * n ? "" : " (last rank holds the remainder)");
    return LOOM_OK;
}

static size_t tp_kv_block_bytes(void *self, int32_t block_size, loom_dtype dtype) {
    tp_exec *tp = self;
    if (!tp->ranks || !tp->loaded) return 0;
    size_t most = 0;
    for (int32_t i = 0; i < tp->size; i++) {
        size_t b = tp->inner->kv_block_bytes(tp->ranks[i].inst, block_size, dtype);
        if (b == 0) return 0; /* one rank cannot: none can */
        if (b > most) most = b;
    }
    return most;
}

static loom_status tp_memory(void *self, loom_backend_memory *out, loom_error *err) {
    tp_exec *tp = self;
    const loom_host *h = tp->host;
    loom_status st = tp_need(tp, false, "memory", err);
    if (st != LOOM_OK) return st;
    if (!out) return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: memory() needs out");
    if ((st = tp_run(tp, (tp_job){.op = TP_OP_MEMORY, .only = -1}, err)) != LOOM_OK) return st;
    loom_backend_memory m = tp->ranks[0].mem;
    for (int32_t i = 1; i < tp->size; i++) {
        const loom_backend_memory *r = &tp->ranks[i].mem;
        if (r->free_bytes < m.free_bytes) m.free_bytes = r->free_bytes;
        if (r->total_bytes < m.total_bytes) m.total_bytes = r->total_bytes;
        if (r->weight_bytes > m.weight_bytes) m.weight_bytes = r->weight_bytes;
    }
    if (tp->comm_kind == TP_COMM_THREADS) {
        /* host backends share one RAM: each rank's KV pool gets its part */
        m.free_bytes /= (size_t)tp->size;
        m.total_bytes /= (size_t)tp->size;
    }
    m.struct_size = sizeof m;
    *out = m;
    return LOOM_OK;
}

static loom_status tp_kv_alloc(void *self, const loom_kv_layout *layout, loom_error *err) {
    tp_exec *tp = self;
    loom_status st = tp_need(tp, true, "kv_alloc", err);
    if (st != LOOM_OK) return st;
    return tp_run(tp, (tp_job){.op = TP_OP_KV_ALLOC, .only = -1, .layout = layout}, err);
}

static loom_status tp_forward(void *self, const loom_batch *batch, float *logits,
                              loom_error *err) {
    tp_exec *tp = self;
    loom_status st = tp_need(tp, true, "forward", err);
    if (st != LOOM_OK) return st;
    return tp_run(tp, (tp_job){.op = TP_OP_FORWARD, .only = -1, .batch = batch, .logits = logits},
                  err);
}

/* Rows reduced where they are computed (loom/backend.h's forward_topk):
 * only k candidates per row cross to the host instead of the vocabulary. */
static loom_status tp_forward_topk(void *self, const loom_batch *batch, const loom_logits_topk *out,
                                   loom_error *err) {
    tp_exec *tp = self;
    const loom_host *h = tp->host;
    loom_status st = tp_need(tp, true, "forward_topk", err);
    if (st != LOOM_OK) return st;
    if (!out || out->struct_size < offsetof(loom_logits_topk, allowed) || out->k < 1 || out->k > LOOM_LOGITS_TOPK_MAX)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "executor tp: forward_topk: k = %d is outside 1..%d",
                        out ? out->k : 0, LOOM_LOGITS_TOPK_MAX);
    if (tp->inner->forward_topk)
        return tp_run(tp, (tp_job){.op = TP_OP_FORWARD_TOPK, .only = -1, .batch = batch, .topk = out},
                      err);
    /* the ranks' backend returns whole rows only: reduce them here */
    const int64_t V = tp->vocab, NL = batch ? batch->num_logits : 0;
    if (NL <= 0) return tp_forward(self, batch, NULL, err);
    if ((st = topk_rows_reserve(&tp->topk, h, "executor tp", NL, V, err)) != LOOM_OK) return st;
    if ((st = tp_forward(self, batch, tp->topk.rows, err)) != LOOM_OK) return st;
    return topk_rows_reduce(&tp->topk, h, NL, V, out, err);
}

static loom_status tp_copy_blocks(void *self, const int32_t *pairs, int32_t n, loom_error *err) {
    tp_exec *tp = self;
    loom_status st = tp_need(tp, true, "copy_blocks", err);
    if (st != LOOM_OK) return st;
    return tp_run(tp, (tp_job){.op = TP_OP_COPY, .only = -1, .pairs = pairs, .n = n}, err);
}

static loom_status tp_swap_blocks(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                                  loom_error *err) {
    tp_exec *tp = self;
    loom_status st = tp_need(tp, true, "swap_blocks", err);
    if (st != LOOM_OK) return st;
    if (!tp->inner->swap_blocks)
        return tp->host->error(tp->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                               "executor tp: the pipeline's backend cannot swap blocks; give the "
                               "cache no swap space (cpu_swap_gib: 0)");
    return tp_run(tp,
                  (tp_job){.op = TP_OP_SWAP, .only = -1, .dir = dir, .pairs = pairs, .n = n}, err);
}

/* ------------------------------------------------------------- descriptor */

static const loom_executor_ops tp_ops = {
    .struct_size = sizeof(loom_executor_ops),
    .create = tp_create,
    .destroy = tp_destroy,
    .inner_count = tp_inner_count,
    .attach_inner = tp_attach_inner,
    .load = tp_load,
    .kv_block_bytes = tp_kv_block_bytes,
    .memory = tp_memory,
    .kv_alloc = tp_kv_alloc,
    .forward = tp_forward,
    .forward_topk = tp_forward_topk,
    .copy_blocks = tp_copy_blocks,
    .swap_blocks = tp_swap_blocks,
};

static const loom_component tp_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_EXECUTOR,
    .name = "tp",
    .summary = "tensor parallelism: Megatron-style shards over N backend ranks, collectives "
               "through shared memory (threads) or NCCL",
    .ops = &tp_ops,
    .params = tp_params,
    .config_size = sizeof(tp_config),
}};

static const loom_plugin_desc tp_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-executor-tp",
    .version = "0.1.0",
    .num_components = 1,
    .components = tp_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &tp_desc; }
