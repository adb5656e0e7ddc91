/*
 * tests/gpu/test_gpu_tp.c — the parallel executors over cuda backend
 * ranks, against one plain cuda backend on the same model and the same
 * batches: first the pp executor's stages sharing one GPU (comm threads;
 * run_pp_model), then the tp executor (comm nccl), which needs at least two
 * Hopper GPUs and a tp plugin built with NCCL — with fewer GPUs that part
 * prints a SKIP line. Not a meson test(): CI has no GPU.
 *
 *   gpu_tp_test [cuda.so tp.so [pp.so]]
 *       (defaults: the paths meson compiled in, or $LOOM_CUDA_BACKEND_SO /
 *        $LOOM_TP_EXECUTOR_SO / $LOOM_PP_EXECUTOR_SO)
 *
 * Models are core/model's dummy weights (libloom's loader and default host,
 * as bench/gpu does): "tiny" (vocab 256, hidden 64, 4 heads / 2 KV heads of
 * 16, FFN 128, 2 layers, untied LM head) in bf16 (weights copied as they
 * are, O and down by strided 2-D copies) and in f32 (the dequantize-and-
 * round path, with column windows), tiny cut to vocab 251 (the last rank
 * holds 125 rows plus a zero padding row), and "qwen2-0.5b" cut to 2 layers
 * (QKV biases sliced, tied and padded LM head, 14 heads / 2 KV heads).
 *
 * Every run replays the same steps on fresh instances with the same block
 * tables: a ragged prefill (all logits), chunked prefill next to a decode
 * (all logits), a fork through copy_blocks on every rank, then pure decode
 * steps (graph-shaped for a plain backend). Checks, printed as
 * `PASS|FAIL name err` (err: largest row-wise ||a - b|| / ||b||):
 *   - executor size 1 == the plain backend (no collectives; expected bit
 *     for bit, which is printed);
 *   - size 2 (and 4 with four GPUs and a model that splits) within TOL_TP
 *     of the plain backend — bf16 partial sums all-reduced in bf16 differ
 *     by a rounding from one GEMM's sum; every row is written;
 *   - the forked sequence's logits equal the original's on every rank;
 *   - kv_block_bytes of the executor is the plain one over the size (KV
 *     heads split);
 *   - size 2 with graphs on and NCCL collectives captures no graph
 *     (capturing NCCL calls hung on 2 H200s); with the executor's
 *     peer-to-peer collectives (p2p_kib) it runs eagerly and captures its
 *     decode steps; every way equals the eager NCCL run bit for bit;
 *   - forward_topk through the executor (rank 0 reduces the gathered rows
 *     on its GPU): every row's top-k ids/values and log-sum-exp equal the
 *     host reference (loom/logits_topk.h) on the eager run's rows, and the
 *     rows marked want_full equal them whole.
 * Exit status = failures.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "loom/backend.h"
#include "loom/executor.h"
#include "loom/quant.h"
#include "formats/dtype.h"
#include "gpu_util.h"
#include "plugin/host_rules.h"
#include "loom/plugin.h"
#include "model/model.h"
#include "plugin/host.h"

#ifndef LOOM_CUDA_BACKEND_DEFAULT
#define LOOM_CUDA_BACKEND_DEFAULT "loom-backend-cuda.so"
#endif
#ifndef LOOM_TP_EXECUTOR_DEFAULT
#define LOOM_TP_EXECUTOR_DEFAULT "loom-executor-tp.so"
#endif
#ifndef LOOM_PP_EXECUTOR_DEFAULT
#define LOOM_PP_EXECUTOR_DEFAULT "loom-executor-pp.so"
#endif

#ifndef LOOM_QUANTIZER_DIR_DEFAULT /* DIR/NAME/loom-quantizer-NAME.so; $LOOM_QUANTIZER_DIR overrides */
#define LOOM_QUANTIZER_DIR_DEFAULT "plugins/quantizer"
#endif
#define TOL_TP 2e-2   /* sharded vs one backend: bf16 all-reduce of partial sums */
#define TOL_SAME 1e-6 /* fork vs original; graphs-on vs eager sharded runs */

static int g_fail, g_pass;

static void result(bool ok, const char *name, double err, const char *extra) {
    printf("%s %-64s %.3e%s\n", ok ? "PASS" : "FAIL", name, err, extra ? extra : "");
    fflush(stdout);
    if (ok) g_pass++;
    else g_fail++;
}

/* Row-wise relative error; NaN (an unwritten row) is infinite. */
static double rows_err(const float *a, const float *b, int rows, int V) {
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0, n = 0;
        for (int i = 0; i < V; i++) {
            double x = a[(size_t)r * V + i], y = b[(size_t)r * V + i];
            if (isnan(x) || isinf(x)) return INFINITY;
            d += (x - y) * (x - y);
            n += y * y;
        }
        double e = sqrt(d) / (n > 0 ? sqrt(n) : 1e-30);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* -------------------------------------------------------------- plugins */

typedef struct plugin {
    void *lib;
    const loom_component *comp;
    const void *ops;           /* loom_backend_ops or loom_executor_ops, by comp->kind */
} plugin;

static bool plugin_open(plugin *p, const char *path, loom_kind kind, const char *name) {
    memset(p, 0, sizeof *p);
    p->comp = gpu_plugin_find(&p->lib, path, kind, name);
    if (p->comp) p->ops = p->comp->ops;
    return p->comp != NULL;
}

/* --------------------------------------------- a vocabulary-cut model view */

/* The base model with its vocabulary cut to `vocab` rows (token_embd and
 * output keep their first rows), to get a vocabulary that does not divide
 * by the size from a dummy shape. */
typedef struct vocab_cut {
    loom_model_view view;
    loom_model_config cfg;
    const loom_model_view *base;
    loom_tensor emb, out;
    bool has_out;
} vocab_cut;

static const loom_tensor *vc_get(void *ctx, const char *name) {
    vocab_cut *v = ctx;
    if (!strcmp(name, "token_embd.weight")) return &v->emb;
    if (v->has_out && !strcmp(name, "output.weight")) return &v->out;
    return v->base->get(v->base->ctx, name);
}
static int32_t vc_count(void *ctx) {
    vocab_cut *v = ctx;
    return v->base->count(v->base->ctx);
}
static const loom_tensor *vc_at(void *ctx, int32_t i) {
    vocab_cut *v = ctx;
    const loom_tensor *t = v->base->at(v->base->ctx, i);
    return t && t->name ? vc_get(ctx, t->name) : t;
}

static void vocab_cut_init(vocab_cut *v, const loom_model_view *base, int32_t vocab) {
    memset(v, 0, sizeof *v);
    v->base = base;
    v->cfg = *base->config;
    v->cfg.vocab_size = vocab;
    const loom_tensor *e = base->get(base->ctx, "token_embd.weight");
    const loom_tensor *o = base->get(base->ctx, "output.weight");
    v->emb = *e;
    v->emb.shape[0] = vocab;
    v->emb.nbytes = (size_t)vocab * loom_dtype_row_bytes(e->dtype, e->shape[1]);
    if (o) {
        v->has_out = true;
        v->out = *o;
        v->out.shape[0] = vocab;
        v->out.nbytes = (size_t)vocab * loom_dtype_row_bytes(o->dtype, o->shape[1]);
    }
    v->view = (loom_model_view){.struct_size = sizeof v->view, .config = &v->cfg, .ctx = v,
                                .get = vc_get, .count = vc_count, .at = vc_at};
}

/* ------------------------------------------------------------- the steps */

#define BS 16
#define NB 64
#define NSEQ 4
#define SEQ_BLOCKS 8
#define MAX_T 128
#define MAX_ROWS 128 /* logits rows of one run (the scenario has 73) */

typedef struct seq {
    int32_t tokens[SEQ_BLOCKS * BS];
    int32_t done;
    int32_t blocks[SEQ_BLOCKS];
} seq;

typedef struct step_buf {
    loom_batch b;
    int32_t tok[MAX_T], pos[MAX_T], qs[NSEQ + 1], ctx[NSEQ], bt[NSEQ * SEQ_BLOCKS], lidx[MAX_T];
    int64_t slot[MAX_T];
} step_buf;

/* Step where seqs[i] gets nnew[i] tokens; logits for every token or the
 * last of each sequence. Block tables are full rows (SEQ_BLOCKS). */
static void build(seq **seqs, const int *nnew, int n, bool all_logits, step_buf *o) {
    int T = 0, nl = 0;
    o->qs[0] = 0;
    for (int i = 0; i < n; i++) {
        seq *s = seqs[i];
        memcpy(o->bt + i * SEQ_BLOCKS, s->blocks, sizeof s->blocks);
        for (int j = 0; j < nnew[i]; j++, T++) {
            int p = s->done + j;
            o->tok[T] = s->tokens[p];
            o->pos[T] = p;
            o->slot[T] = (int64_t)s->blocks[p / BS] * BS + p % BS;
            if (all_logits || j == nnew[i] - 1) o->lidx[nl++] = T;
        }
        o->qs[i + 1] = T;
        o->ctx[i] = s->done + nnew[i];
    }
    o->b = (loom_batch){.struct_size = sizeof(loom_batch), .num_seqs = n, .num_tokens = T,
                        .token_ids = o->tok, .positions = o->pos, .query_start = o->qs,
                        .context_len = o->ctx, .block_table = o->bt,
                        .block_table_stride = SEQ_BLOCKS, .slot_mapping = o->slot,
                        .num_logits = nl, .logits_index = o->lidx};
}

/* One engine's worth of instances: a plain backend (size 0) or the tp
 * executor over `size` cuda ranks. */
typedef struct rig {
    const plugin *cuda, *tp;
    void *exec, *inner[8], *plain;
    int size;
    const loom_backend_ops *ops;     /* what the test drives                   */
    loom_backend_ops exec_runner;    /* the executor's model-runner methods     */
    void *self;
    bool topk; /* steps through forward_topk (TOPK_K) instead of forward */
} rig;

static const loom_backend_ops *backend_of(const plugin *p) { return p->ops; }
static const loom_executor_ops *executor_of(const plugin *p) { return p->ops; }

#define TOPK_K 8

static void rig_close(rig *g) {
    if (g->exec) executor_of(g->tp)->destroy(g->exec); /* the engine's order: executor, then ranks */
    for (int i = 0; i < g->size; i++)
        if (g->inner[i]) backend_of(g->cuda)->destroy(g->inner[i]);
    if (g->plain) backend_of(g->cuda)->destroy(g->plain);
    memset(g, 0, sizeof *g);
}

/* Two more backend overrides, and a quantizer, for the rigs opened while
 * set (NULL: none): g_backend_ov the experts' dispatch form, g_lt_ov the
 * cuBLASLt expert GEMMs. */
static const char *g_backend_ov, *g_lt_ov;
static const loom_quant_binding *g_quant;

/* size 0: a plain backend; else the executor `tp` (tp or pp) with the
 * overrides xov over `size` cuda instances. */
static loom_status rig_open_exec(rig *g, const plugin *cuda, const plugin *tp, int size, const char *const *xov,
                                 bool graphs, const loom_model_view *view, loom_error *e) {
    memset(g, 0, sizeof *g);
    g->cuda = cuda, g->tp = tp;
    const char *ov[] = {graphs ? "cuda_graphs=true" : "cuda_graphs=false",
                        "max_batched_tokens=512", g_backend_ov ? g_backend_ov : g_lt_ov,
                        g_backend_ov ? g_lt_ov : NULL, NULL};
    void *bcfg = gpu_config_make(cuda->comp, ov);
    const loom_host *h = loom_host_default();
    loom_kv_layout kvl = {.struct_size = sizeof kvl, .block_size = BS, .num_blocks = NB,
                          .num_cpu_blocks = 0, .dtype = LOOM_DTYPE_COUNT};
    loom_status st;
    if (size == 0) {
        if ((st = backend_of(cuda)->create(h, bcfg, &g->plain, e))) goto out;
        g->ops = backend_of(cuda), g->self = g->plain;
    } else {
        void *tcfg = gpu_config_make(tp->comp, xov);
        const loom_executor_ops *x = executor_of(tp);
        st = x->create(h, tcfg, &g->exec, e);
        free(tcfg);
        if (st) goto out;
        g->size = size;
        for (int i = 0; i < size; i++) /* on this (the engine) thread, device 0 */
            if ((st = backend_of(cuda)->create(h, bcfg, &g->inner[i], e))) goto out;
        if ((st = x->attach_inner(g->exec, backend_of(cuda), g->inner, size, e))) goto out;
        g->exec_runner = (loom_backend_ops){
            .struct_size = sizeof(loom_backend_ops), .load = x->load, .kv_block_bytes = x->kv_block_bytes,
            .memory = x->memory, .kv_alloc = x->kv_alloc, .forward = x->forward, .copy_blocks = x->copy_blocks,
            .forward_topk = x->forward_topk, .swap_blocks = x->swap_blocks};
        g->ops = &g->exec_runner, g->self = g->exec;
    }
    if ((st = g->ops->load(g->self, view, g_quant, e)) || (st = g->ops->kv_alloc(g->self, &kvl, e)))
        goto out;
out:
    free(bcfg);
    return st;
}

static loom_status rig_open(rig *g, const plugin *cuda, const plugin *tp, int size, bool graphs,
                            bool p2p, const loom_model_view *view, loom_error *e) {
    char sz[32];
    snprintf(sz, sizeof sz, "size=%d", size);
    const char *tov[] = {sz, "comm=nccl", p2p ? "p2p_kib=8192" : NULL, NULL};
    return rig_open_exec(g, cuda, tp, size, tov, graphs, view, e);
}

typedef struct run_out {
    float *logits;        /* (rows, V) every step's rows, in order */
    int rows;
    int fork_row;         /* first of the two fork-decode rows     */
    size_t kv_block_bytes;
    bool ok;
    /* forward_topk runs: each row's summary; rows with an odd index are not
     * asked whole and stay NaN in `logits` */
    int32_t top_ids[MAX_ROWS * TOPK_K];
    float top_vals[MAX_ROWS * TOPK_K], lse[MAX_ROWS];
} run_out;

/* The scenario on one rig; seqs' tokens drawn from [0, V) with a fixed seed. */
static run_out run_steps(rig *g, int V, const char *label) {
    run_out r = {.logits = calloc((size_t)MAX_ROWS * V, sizeof(float)), .fork_row = -1};
    static seq S[NSEQ];
    memset(S, 0, sizeof S);
    uint64_t x = 0x1234567;
    for (int s = 0; s < NSEQ; s++) {
        for (int j = 0; j < SEQ_BLOCKS * BS; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            S[s].tokens[j] = (int32_t)((x >> 33) % (uint64_t)V);
        }
        for (int j = 0; j < SEQ_BLOCKS; j++) /* scattered, the same in every run */
            S[s].blocks[j] = (s * SEQ_BLOCKS + j) * 7 % NB;
    }
    r.kv_block_bytes = g->ops->kv_block_bytes(g->self, BS, LOOM_DTYPE_COUNT);
    static step_buf sb;
    loom_error e = {0};
    loom_status st = LOOM_OK;
#define STEP(seqs_, nnew_, n_, all_)                                                               \
    do {                                                                                           \
        build(seqs_, nnew_, n_, all_, &sb);                                                        \
        float *dst = r.logits + (size_t)r.rows * V;                                                \
        for (size_t i_ = 0; i_ < (size_t)sb.b.num_logits * V; i_++) dst[i_] = NAN;                 \
        if (!g->topk) {                                                                            \
            if ((st = g->ops->forward(g->self, &sb.b, dst, &e))) goto fail;                        \
        } else {                                                                                   \
            uint8_t want[MAX_ROWS];                                                                \
            for (int i_ = 0; i_ < sb.b.num_logits; i_++) want[i_] = (r.rows + i_) % 2 == 0;        \
            loom_logits_topk tk_ = {.struct_size = sizeof tk_, .k = TOPK_K,                        \
                                    .top_ids = r.top_ids + (size_t)r.rows * TOPK_K,                \
                                    .top_vals = r.top_vals + (size_t)r.rows * TOPK_K,              \
                                    .lse = r.lse + r.rows, .want_full = want, .full = dst};        \
            if ((st = g->ops->forward_topk(g->self, &sb.b, &tk_, &e))) goto fail;                  \
        }                                                                                          \
        r.rows += sb.b.num_logits;                                                                 \
        for (int i_ = 0; i_ < n_; i_++) seqs_[i_]->done += nnew_[i_];                              \
    } while (0)
    {
        seq *ss[2] = {&S[0], &S[1]};
        int nn[2] = {11, 7};
        STEP(ss, nn, 2, true); /* ragged prefill */
    }
    {
        seq *ss[3] = {&S[0], &S[1], &S[2]};
        int nn[3] = {8, 1, 30};
        STEP(ss, nn, 3, true); /* chunked prefill next to a decode */
    }
    {
        /* fork: seq 3 = seq 0 through copy_blocks (its first 2 blocks hold
         * 19 tokens), then both decode the same token */
        int32_t pairs[4];
        for (int j = 0; j < 2; j++) pairs[2 * j] = S[0].blocks[j], pairs[2 * j + 1] = S[3].blocks[j];
        if ((st = g->ops->copy_blocks(g->self, pairs, 2, &e))) goto fail;
        memcpy(S[3].tokens, S[0].tokens, sizeof S[0].tokens);
        S[3].done = S[0].done;
        seq *ss[2] = {&S[0], &S[3]};
        int nn[2] = {1, 1};
        r.fork_row = r.rows;
        STEP(ss, nn, 2, false);
    }
    for (int k = 0; k < 4; k++) { /* pure decode: graph-shaped (bucket 4) */
        seq *ss[3] = {&S[0], &S[1], &S[2]};
        int nn[3] = {1, 1, 1};
        STEP(ss, nn, 3, false);
    }
    {
        /* graph-shaped but ragged (1 and 3 tokens: padded to 3 a sequence,
         * so the second sequence's rows sit at 3..5, past the step's 4
         * tokens): what a pipeline link must move whole */
        seq *ss[2] = {&S[0], &S[1]};
        int nn[2] = {1, 3};
        STEP(ss, nn, 2, false);
    }
#undef STEP
    r.ok = true;
    return r;
fail:
    printf("FAIL %s: status %d: %s\n", label, (int)st, e.message);
    g_fail++;
    return r;
}

/* A forward_topk run against the whole rows of `ref` (the same steps run
 * with forward()): each row's top-k ids / values and log-sum-exp equal the
 * host reference on ref's row, and the rows asked whole equal ref's. */
static void check_topk(const char *label, const run_out *got, const run_out *ref, int V, const char *ref_name) {
    char what[400];
    double full_err = 0, lse_err = 0;
    int id_bad = 0;
    for (int r = 0; r < ref->rows && r < got->rows; r++) {
        const float *row = ref->logits + (size_t)r * V;
        int32_t ids[TOPK_K];
        float vals[TOPK_K], lse;
        loom_logits_topk_row(row, V, TOPK_K, ids, vals, &lse);
        for (int j = 0; j < TOPK_K; j++) /* a tie may order ids either way */
            if (ids[j] != got->top_ids[r * TOPK_K + j] &&
                fabsf(vals[j] - got->top_vals[r * TOPK_K + j]) > 1e-6f * fabsf(vals[j]))
                id_bad++;
        double d = fabs((double)lse - got->lse[r]);
        if (!(d <= lse_err)) lse_err = d;
        if (r % 2 == 0) {
            double fe = rows_err(got->logits + (size_t)r * V, row, 1, V);
            if (!(fe <= full_err)) full_err = fe;
        }
    }
    snprintf(what, sizeof what, "%s: top-%d ids/values == host reference (%d rows)", label, TOPK_K, ref->rows);
    result(got->rows == ref->rows && id_bad == 0, what, id_bad, NULL);
    snprintf(what, sizeof what, "%s: log-sum-exp == host reference", label);
    result(lse_err <= 1e-4, what, lse_err, NULL);
    snprintf(what, sizeof what, "%s: want_full rows == %s", label, ref_name);
    result(full_err <= TOL_SAME, what, full_err, NULL);
}

/* ------------------------------------------------------------- a model */

static void run_model(const plugin *cuda, const plugin *tp, int ndev, const char *name,
                      const loom_model_view *view) {
    const loom_model_config *c = view->config;
    const int V = c->vocab_size;
    printf("--- %s: vocab %d hidden %d ffn %d layers %d heads %d/%d head_dim %d%s\n", name, V,
           c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads, c->num_kv_heads,
           c->head_dim, c->tie_embeddings ? " tied" : "");
    char label[160];
    loom_error e = {0};
    rig g;
    loom_status st = rig_open(&g, cuda, tp, 0, false, false, view, &e);
    if (st) {
        printf("FAIL %s: plain backend setup: status %d: %s\n", name, (int)st, e.message);
        g_fail++;
        rig_close(&g);
        return;
    }
    snprintf(label, sizeof label, "%s plain", name);
    run_out ref = run_steps(&g, V, label);
    rig_close(&g);
    if (!ref.ok) goto out;

    const int sizes[3] = {1, 2, 4};
    run_out eager2 = {0};
    for (int k = 0; k < 3; k++) {
        const int n = sizes[k];
        if (n > ndev) continue;
        if (c->num_heads % n || c->intermediate_size % n ||
            (c->num_kv_heads % n && n % c->num_kv_heads) || (c->intermediate_size / n) % 8)
            continue;
        snprintf(label, sizeof label, "%s tp size %d", name, n);
        if ((st = rig_open(&g, cuda, tp, n, false, false, view, &e))) {
            printf("FAIL %s: setup: status %d: %s\n", label, (int)st, e.message);
            g_fail++;
            rig_close(&g);
            continue;
        }
        run_out got = run_steps(&g, V, label);
        rig_close(&g);
        if (!got.ok) {
            free(got.logits);
            continue;
        }
        char what[200];
        double err = rows_err(got.logits, ref.logits, ref.rows, V);
        if (n == 1) {
            /* one rank runs no collective and the whole model: the plain
             * backend's kernels and GEMM plans, so expected bit for bit */
            bool same = got.rows == ref.rows &&
                        !memcmp(got.logits, ref.logits, sizeof(float) * (size_t)ref.rows * V);
            snprintf(what, sizeof what, "%s == plain backend (%d rows)", label, ref.rows);
            result(got.rows == ref.rows && err <= TOL_SAME, what, err,
                   same ? " (bit-identical)" : " (not bit-identical)");
        } else {
            snprintf(what, sizeof what, "%s vs plain backend (%d rows)", label, ref.rows);
            result(got.rows == ref.rows && err <= TOL_TP, what, err, isinf(err) ? " (NaN)" : NULL);
        }
        double fe = rows_err(got.logits + (size_t)(got.fork_row + 1) * V,
                             got.logits + (size_t)got.fork_row * V, 1, V);
        snprintf(what, sizeof what, "%s fork via copy_blocks == original", label);
        result(fe <= TOL_SAME, what, fe, NULL);
        bool kv_ok = got.kv_block_bytes > 0 &&
                     (c->num_kv_heads >= n ? got.kv_block_bytes * (size_t)n == ref.kv_block_bytes
                                           : got.kv_block_bytes * (size_t)c->num_kv_heads ==
                                                 ref.kv_block_bytes);
        snprintf(what, sizeof what, "%s kv_block_bytes %zu (plain %zu)", label, got.kv_block_bytes,
                 ref.kv_block_bytes);
        result(kv_ok, what, 0, NULL);
        if (n == 2) eager2 = got;
        else free(got.logits);
    }

    /* size 2 again, each way a step can run: graphs requested with NCCL
     * collectives (none captured), then loom's peer-to-peer collectives
     * (p2p_kib) eager and in graphs (captured: no NCCL inside); each with
     * forward() and with forward_topk (rank 0 reduces the gathered rows).
     * Two ranks' sums round once either way, so all equal the eager NCCL
     * run (eager2) bit for bit. */
    static const struct { bool graphs, p2p, topk; } variants[] = {
        {true, false, false}, {true, false, true}, {false, true, false}, {true, true, false}, {true, true, true},
    };
    for (size_t vi = 0; eager2.ok && vi < sizeof variants / sizeof variants[0]; vi++) {
        const bool graphs = variants[vi].graphs, p2p = variants[vi].p2p, use_topk = variants[vi].topk;
        double cap0 = loom_metrics_get("backend.cuda.graph_captures");
        snprintf(label, sizeof label, "%s tp size 2 graphs=%s%s%s", name, graphs ? "on" : "off",
                 p2p ? " p2p" : " nccl", use_topk ? " forward_topk" : "");
        if ((st = rig_open(&g, cuda, tp, 2, graphs, p2p, view, &e))) {
            printf("FAIL %s: setup: status %d: %s\n", label, (int)st, e.message);
            g_fail++;
            rig_close(&g);
            continue;
        }
        g.topk = use_topk;
        run_out *got = malloc(sizeof *got);
        *got = run_steps(&g, V, label);
        rig_close(&g);
        char what[400];
        if (got->ok && !use_topk) {
            double caps = loom_metrics_get("backend.cuda.graph_captures") - cap0;
            if (graphs && p2p) {
                snprintf(what, sizeof what, "%s: graphs captured on both ranks (%g)", label, caps);
                result(caps >= 2, what, 0, NULL);
            } else if (graphs) {
                snprintf(what, sizeof what, "%s: no graph captured with NCCL (%g)", label, caps);
                result(caps == 0, what, 0, NULL);
            }
            double err = rows_err(got->logits, eager2.logits, eager2.rows, V);
            bool same = !memcmp(got->logits, eager2.logits, sizeof(float) * (size_t)eager2.rows * V);
            snprintf(what, sizeof what, "%s == eager NCCL run", label);
            result(got->rows == eager2.rows && err <= TOL_SAME, what, err,
                   same ? " (bit-identical)" : " (not bit-identical)");
        } else if (got->ok) {
            check_topk(label, got, &eager2, V, "eager NCCL run");
        }
        free(got->logits);
        free(got);
    }
    free(eager2.logits);
out:
    free(ref.logits);
}

/* ---------------------------------------------- pipeline stages, one GPU */

/* A run's rows against the plain backend's (within tol; bit-identical
 * said either way) and its forked sequence's rows against the original's
 * (within fork_tol). */
static void check_vs_plain(const char *label, const run_out *got, const run_out *ref, int V, double tol,
                           double fork_tol) {
    char what[400];
    const double err = rows_err(got->logits, ref->logits, ref->rows, V);
    const bool same = got->rows == ref->rows &&
                      !memcmp(got->logits, ref->logits, sizeof(float) * (size_t)ref->rows * V);
    snprintf(what, sizeof what, "%s vs plain backend (%d rows)", label, ref->rows);
    result(got->rows == ref->rows && err <= tol, what, err, same ? " (bit-identical)" : " (not bit-identical)");
    const double fe = rows_err(got->logits + (size_t)(got->fork_row + 1) * V,
                               got->logits + (size_t)got->fork_row * V, 1, V);
    snprintf(what, sizeof what, "%s fork via copy_blocks == original", label);
    result(fe <= fork_tol, what, fe, NULL);
}

/* The scenario on a fresh rig (size 0: a plain backend). */
static run_out run_rig(const plugin *cuda, const plugin *xp, int size, const char *const *xov, bool graphs,
                       bool topk, const loom_model_view *view, const char *label) {
    rig g;
    loom_error e = {0};
    run_out r = {0};
    loom_status st = rig_open_exec(&g, cuda, xp, size, xov, graphs, view, &e);
    if (st) {
        printf("FAIL %s: setup: status %d: %s\n", label, (int)st, e.message);
        g_fail++;
    } else {
        g.topk = topk;
        r = run_steps(&g, view->config->vocab_size, label);
    }
    rig_close(&g);
    return r;
}

/* The pp executor (comm threads: links staged through pinned host memory)
 * over `stages` cuda instances sharing GPU 0, against one plain backend:
 * with one micro-batch every stage runs the plain backend's kernels on the
 * same rows and the links move x and r whole, so bit for bit (graphs on
 * against the plain backend's graphs); two micro-batches change the GEMMs'
 * row counts (TOL_TP). Also forward_topk through the last stage, the fork,
 * the per-stage kv_block_bytes and graph captures on every stage. */
static void run_pp_model(const plugin *cuda, const plugin *pp, const char *name, const loom_model_view *view) {
    const int V = view->config->vocab_size, L = view->config->num_layers;
    char label[200], what[400];
    snprintf(label, sizeof label, "%s plain eager", name);
    run_out ref_e = run_rig(cuda, NULL, 0, NULL, false, false, view, label);
    snprintf(label, sizeof label, "%s plain graphs", name);
    run_out ref_g = run_rig(cuda, NULL, 0, NULL, true, false, view, label);
    static const struct { int stages, mb; bool graphs, topk; } variants[] = {
        {2, 1, false, false}, {2, 1, true, false}, {2, 2, true, false}, {2, 1, true, true},
        {3, 1, false, false}, {3, 2, true, false}, {-1, 1, true, false}, /* -1: a stage per layer */
    };
    for (size_t vi = 0; ref_e.ok && ref_g.ok && vi < sizeof variants / sizeof variants[0]; vi++) {
        const int n = variants[vi].stages < 0 ? L : variants[vi].stages, mb = variants[vi].mb;
        const bool graphs = variants[vi].graphs, topk = variants[vi].topk;
        if (n > L || (variants[vi].stages < 0 && L <= 3)) continue;
        char a[32], b[32];
        snprintf(a, sizeof a, "pp_size=%d", n);
        snprintf(b, sizeof b, "micro_batches=%d", mb);
        const char *xov[] = {a, b, "comm=threads", NULL};
        snprintf(label, sizeof label, "%s pp %d micro-batches %d graphs=%s%s", name, n, mb, graphs ? "on" : "off",
                 topk ? " forward_topk" : "");
        const double cap0 = loom_metrics_get("backend.cuda.graph_captures");
        run_out got = run_rig(cuda, pp, n, xov, graphs, topk, view, label);
        const run_out *ref = graphs ? &ref_g : &ref_e;
        if (got.ok && topk) {
            check_topk(label, &got, ref, V, graphs ? "plain graphs run" : "plain eager run");
        } else if (got.ok) {
            check_vs_plain(label, &got, ref, V, mb == 1 ? TOL_SAME : TOL_TP, TOL_SAME);
            const size_t most = (size_t)(L + n - 1) / (size_t)n; /* the largest stage's layers */
            snprintf(what, sizeof what, "%s kv_block_bytes %zu (plain %zu: %zu of %d layers)", label,
                     got.kv_block_bytes, ref->kv_block_bytes, most, L);
            result(got.kv_block_bytes * (size_t)L == ref->kv_block_bytes * most, what, 0, NULL);
            if (graphs) {
                const double caps = loom_metrics_get("backend.cuda.graph_captures") - cap0;
                snprintf(what, sizeof what, "%s: graphs captured on every stage (%g)", label, caps);
                result(caps >= n, what, 0, NULL);
            }
        }
        free(got.logits);
    }
    free(ref_e.logits);
    free(ref_g.logits);
}

/* ------------------------- tensor / expert parallelism on one GPU */

/* Whether n ranks split this model as the cuda backend takes it: heads and
 * KV heads, the dense FFN's width (a multiple of 8 a rank) or the experts
 * and the shared expert's width (likewise). */
static bool splits(const loom_model_config *c, int n) {
    if (c->num_heads % n || (c->num_kv_heads % n && n % c->num_kv_heads)) return false;
    if (c->num_experts > 0)
        return c->num_experts % n == 0 && c->shared_expert_intermediate_size % (8 * n) == 0;
    return c->intermediate_size % n == 0 && (c->intermediate_size / n) % 8 == 0;
}

/* " (all-to-all) int8": what the one-GPU runs' labels add for the
 * settings in force (g_backend_ov, g_quant). */
static const char *threads_variant(void) {
    static char v[64];
    snprintf(v, sizeof v, "%s%s%s", g_backend_ov ? " (all-to-all)" : "", g_quant ? " int8" : "",
             g_lt_ov ? " cuBLASLt experts" : "");
    return v;
}

/* tp 2 over threads again, each other way a step can run: graphs requested
 * (none may be captured: host collectives; the eager run's bits) and
 * forward_topk (rank 0 gathers the rows, staged, and reduces them on the
 * GPU; against the host reference on the eager rows `eager`). */
static void check_threads_tp2_variants(const plugin *cuda, const plugin *tp, const char *name,
                                       const loom_model_view *view, const run_out *eager) {
    const int V = view->config->vocab_size;
    const char *xov[] = {"size=2", "comm=threads", NULL};
    char label[200], what[400];
    const double cap0 = loom_metrics_get("backend.cuda.graph_captures");
    snprintf(label, sizeof label, "%s tp 2 threads, one GPU, graphs requested%s", name, threads_variant());
    run_out gg = run_rig(cuda, tp, 2, xov, true, false, view, label);
    if (gg.ok) {
        const double caps = loom_metrics_get("backend.cuda.graph_captures") - cap0;
        const bool same = gg.rows == eager->rows &&
                          !memcmp(gg.logits, eager->logits, sizeof(float) * (size_t)eager->rows * V);
        snprintf(what, sizeof what, "%s: no graph captured (%g), == the eager run", label, caps);
        result(caps == 0 && same, what, rows_err(gg.logits, eager->logits, eager->rows, V), NULL);
    }
    free(gg.logits);
    snprintf(label, sizeof label, "%s tp 2 threads, one GPU, forward_topk%s", name, threads_variant());
    run_out tk = run_rig(cuda, tp, 2, xov, false, true, view, label);
    if (tk.ok) check_topk(label, &tk, eager, V, "the eager threads run");
    free(tk.logits);
}

/* One tp run of n ranks over threads against the plain backend's rows
 * `ref` (size 1 bit for bit, else TOL_TP) and its fork check; returns the
 * run (its logits the caller's to free). The fork's rows equal the
 * original's bit for bit except in the all-to-all form with a shared
 * expert: there a token's routed sum joins the shared part of the rank
 * that owns its slice before the block's all-reduce, so two copies of a
 * token in different slices are rounded in a different order (docs/moe.md). */
static run_out check_threads_tp(const plugin *cuda, const plugin *tp, int n, const char *name,
                                const loom_model_view *view, const run_out *ref) {
    const int V = view->config->vocab_size;
    const bool a2a_shared = n > 1 && g_backend_ov && strstr(g_backend_ov, "all_to_all") &&
                            view->config->shared_expert_intermediate_size > 0;
    char sz[32], label[200];
    snprintf(sz, sizeof sz, "size=%d", n);
    const char *xov[] = {sz, "comm=threads", NULL};
    snprintf(label, sizeof label, "%s tp %d threads, one GPU%s", name, n, threads_variant());
    run_out got = run_rig(cuda, tp, n, xov, false, false, view, label);
    if (got.ok) check_vs_plain(label, &got, ref, V, n == 1 ? TOL_SAME : TOL_TP, a2a_shared ? TOL_TP : TOL_SAME);
    return got;
}

/* The tp executor with the threads communicator (loom_comm.host_memory:
 * each cuda rank stages its collectives through pinned host memory), its
 * 1, 2 and 4 ranks all on GPU 0, against one plain backend — what proves
 * the sharded code paths, expert parallelism included (docs/moe.md: a
 * rank runs its experts and its slice of the shared expert, the
 * all-reduce sums the ranks), without several GPUs. Size 1 runs no
 * collective: bit for bit; more ranks sum bf16 partials (TOL_TP). With
 * `pp`: also 2 pipeline stages of 2 tensor-parallel ranks each. */
static void run_tp_threads_model(const plugin *cuda, const plugin *tp, const plugin *pp, const char *name,
                                 const loom_model_view *view) {
    const loom_model_config *c = view->config;
    const int V = c->vocab_size;
    char label[200], what[400];
    snprintf(label, sizeof label, "%s plain eager", name);
    run_out ref = run_rig(cuda, NULL, 0, NULL, false, false, view, label);
    static const int sizes[3] = {1, 2, 4};
    for (int k = 0; ref.ok && k < 3; k++) {
        if (!splits(c, sizes[k])) continue;
        run_out got = check_threads_tp(cuda, tp, sizes[k], name, view, &ref);
        if (got.ok && sizes[k] == 2) check_threads_tp2_variants(cuda, tp, name, view, &got);
        free(got.logits);
    }
    if (ref.ok && pp && splits(c, 2) && c->num_layers >= 2) {
        const char *xov[] = {"pp_size=2", "tp_size=2", "comm=threads", NULL};
        snprintf(label, sizeof label, "%s pp 2 x tp 2 threads, one GPU", name);
        run_out got = run_rig(cuda, pp, 4, xov, false, false, view, label);
        if (got.ok) {
            const double err = rows_err(got.logits, ref.logits, ref.rows, V);
            snprintf(what, sizeof what, "%s vs plain backend (%d rows)", label, ref.rows);
            result(got.rows == ref.rows && err <= TOL_TP, what, err, NULL);
        }
        free(got.logits);
    }
    free(ref.logits);
}

/* The int8 quantizer (mode w8a16) as g_quant for fn's runs. */
static void with_int8(void (*fn)(const plugin *, const plugin *, const char *, const loom_model_view *),
                      const plugin *cuda, const plugin *tp, const char *name, const loom_model_view *view) {
    const char *dir = getenv("LOOM_QUANTIZER_DIR") ? getenv("LOOM_QUANTIZER_DIR") : LOOM_QUANTIZER_DIR_DEFAULT;
    void *lib = NULL, *self = NULL;
    const loom_component *qc = gpu_quantizer_find(&lib, dir, "int8");
    if (!qc) {
        printf("FAIL quantizer int8: cannot open it from %s (set LOOM_QUANTIZER_DIR)\n", dir);
        g_fail++;
        return;
    }
    const loom_quant_ops *ops = qc->ops;
    void *cfg = gpu_config_make(qc, NULL);
    loom_error e = {0};
    if (ops->create(loom_host_default(), cfg, &self, &e) != LOOM_OK) {
        printf("FAIL quantizer int8 create: %s\n", e.message);
        g_fail++;
        free(cfg);
        return;
    }
    const loom_quant_binding qb = {.struct_size = sizeof qb, .ops = ops, .self = self, .name = "int8"};
    g_quant = &qb;
    fn(cuda, tp, name, view);
    g_quant = NULL;
    ops->destroy(self);
    free(cfg);
}

/* Expert parallelism on int8 (W8A16) weights, every linear of the model
 * (routed experts, shared expert, attention): the quantized experts'
 * stacks carved and uploaded for a rank's experts, its shared expert's
 * column window quantized, both forms, against the plain backend on the
 * same quantizer. */
static void quantized_ep(const plugin *cuda, const plugin *tp, const char *name, const loom_model_view *view) {
    run_tp_threads_model(cuda, tp, NULL, name, view);
    g_backend_ov = "moe_dispatch=all_to_all";
    run_tp_threads_model(cuda, tp, NULL, name, view);
    g_backend_ov = NULL;
}

/* Tensor parallelism on int8 (W8A16) weights in the tiled layout (the
 * default quant_layout), against the plain backend on the same quantizer:
 * every rank's windows must tile (the caller's shape: N / n a multiple of
 * 16 rows, K / n of 128 columns), and each run's ranks must have loaded
 * every layer tiled, no more and no fewer (backend.cuda.qtiled_layers,
 * added once a layer at load: a rank whose window fell back to rows would
 * pass the logits check on the GEMVs instead). */
static void quantized_tiled_tp(const plugin *cuda, const plugin *tp, const char *name, const loom_model_view *view) {
    const loom_model_config *c = view->config;
    char label[200], what[400];
    snprintf(label, sizeof label, "%s plain eager", name);
    double t0 = loom_metrics_get("backend.cuda.qtiled_layers");
    run_out ref = run_rig(cuda, NULL, 0, NULL, false, false, view, label);
    double nt = loom_metrics_get("backend.cuda.qtiled_layers") - t0;
    snprintf(what, sizeof what, "%s: layers loaded tiled %g of %d", label, nt, (int)c->num_layers);
    if (ref.ok) result(nt == c->num_layers, what, 0.0, NULL);
    static const int sizes[3] = {1, 2, 4};
    for (int k = 0; ref.ok && k < 3; k++) {
        if (!splits(c, sizes[k])) continue;
        t0 = loom_metrics_get("backend.cuda.qtiled_layers");
        run_out got = check_threads_tp(cuda, tp, sizes[k], name, view, &ref);
        nt = loom_metrics_get("backend.cuda.qtiled_layers") - t0;
        snprintf(what, sizeof what, "%s tp %d threads: layers loaded tiled %g of %d ranks x %d", name, sizes[k], nt,
                 sizes[k], (int)c->num_layers);
        if (got.ok) result(nt == (double)sizes[k] * c->num_layers, what, 0.0, NULL);
        free(got.logits);
    }
    free(ref.logits);
}

static loom_model *load_dummy(const char *shape, loom_dtype dt, int32_t layers) {
    loom_model_load_opts o = {.format = "dummy", .dummy_shape = shape, .seed = 7,
                              .dummy_dtype = dt, .num_layers_override = layers};
    loom_model *m = NULL;
    loom_error e = {0};
    if (loom_model_load(&o, &m, &e) != LOOM_OK) {
        printf("FAIL dummy model %s: %s\n", shape, e.message);
        g_fail++;
        return NULL;
    }
    return m;
}

/* The cuBLASLt expert GEMMs (moe_expert_gemm_rows=1: every eager step with
 * a row an expert) under tp / EP in the form g_backend_ov names: each tp
 * size's run against the same size's run on the grouped GEMM kernels —
 * the same shards, so the same routing, and only the experts' GEMMs
 * differ (bf16 outputs of other accumulation orders). Against the plain
 * backend instead, Qwen3-30B-A3B's router (top-8 of 128) sees the sharded
 * attention's bf16 partial sums and takes other experts at near ties
 * whatever the GEMMs: that error is printed, not judged (the tiny MoE
 * shapes above judge the sharded experts against the plain backend). */
static void run_tp_lt_experts(const plugin *cuda, const plugin *tp, const char *name, const loom_model_view *view) {
    const int V = view->config->vocab_size;
    char label[200], what[400];
    snprintf(label, sizeof label, "%s plain eager", name);
    run_out plain = run_rig(cuda, NULL, 0, NULL, false, false, view, label);
    static const int sizes[3] = {1, 2, 4};
    for (int k = 0; plain.ok && k < 3; k++) {
        if (!splits(view->config, sizes[k])) continue;
        char sz[32];
        snprintf(sz, sizeof sz, "size=%d", sizes[k]);
        const char *xov[] = {sz, "comm=threads", NULL};
        snprintf(label, sizeof label, "%s tp %d threads, one GPU%s", name, sizes[k], threads_variant());
        run_out ref = run_rig(cuda, tp, sizes[k], xov, false, false, view, label);
        g_lt_ov = "moe_expert_gemm_rows=1";
        const double lt0 = loom_metrics_get("backend.cuda.moe_expert_gemm_layers");
        snprintf(label, sizeof label, "%s tp %d threads, one GPU%s", name, sizes[k], threads_variant());
        run_out got = run_rig(cuda, tp, sizes[k], xov, false, false, view, label);
        const double lt = loom_metrics_get("backend.cuda.moe_expert_gemm_layers") - lt0;
        g_lt_ov = NULL;
        if (ref.ok && got.ok) {
            const double err = rows_err(got.logits, ref.logits, ref.rows, V);
            snprintf(what, sizeof what, "%s vs the grouped GEMMs' run (%d rows; %g layers on cuBLASLt)", label,
                     ref.rows, lt);
            result(got.rows == ref.rows && lt > 0 && err <= TOL_TP, what, err, NULL);
            printf("INFO %s: the grouped GEMMs' tp run vs the plain backend %.3e\n", label,
                   rows_err(ref.logits, plain.logits, plain.rows, V));
        }
        free(ref.logits), free(got.logits);
    }
    free(plain.logits);
}

/* Tensor and expert parallelism on one GPU (the tp executor's threads
 * communicator, opened from tp_so): dense and MoE dummies, the MoE ones in
 * both moe_dispatch forms and on int8 weights too; pp 2 x tp 2 on tiny;
 * int8 on the tiled layout on a Llama-3-8B layer. */
static void run_one_gpu_tp(const plugin *cuda, const plugin *pp, const char *tp_so) {
    plugin tpt;
    if (!plugin_open(&tpt, tp_so, LOOM_KIND_EXECUTOR, "tp")) {
        printf("FAIL tp executor %s: cannot open it for the one-GPU runs\n", tp_so);
        g_fail++;
        return;
    }
    static const struct { const char *shape; int32_t layers; const char *name; } tm[] = {
        {"tiny", 0, "tiny bf16"},
        {"qwen2-0.5b", 2, "qwen2-0.5b 2 layers (bias, tied)"},
        {"qwen3-moe-tiny", 0, "qwen3-moe-tiny (experts, QK-norm)"},
        {"qwen2-moe-tiny", 0, "qwen2-moe-tiny (shared expert, bias)"},
    };
    for (size_t i = 0; i < sizeof tm / sizeof tm[0]; i++) {
        loom_model *m = load_dummy(tm[i].shape, LOOM_DTYPE_BF16, tm[i].layers);
        if (!m) continue;
        const loom_model_view *v = loom_model_view_get(m);
        run_tp_threads_model(cuda, &tpt, i == 0 ? pp : NULL, tm[i].name, v);
        if (v->config->num_experts > 0) { /* the experts' other form: tokens dispatched */
            g_backend_ov = "moe_dispatch=all_to_all";
            run_tp_threads_model(cuda, &tpt, NULL, tm[i].name, v);
            g_backend_ov = NULL;
            with_int8(quantized_ep, cuda, &tpt, tm[i].name, v);
        }
        loom_model_free(m);
    }
    /* W8A16 on the tiled layout under tp: one layer of the Llama-3-8B
     * shape (O's K 4096 / 4 and down's 14336 / 4 tile; the tiny shapes'
     * windows do not) */
    loom_model *ml = load_dummy("llama3-8b", LOOM_DTYPE_BF16, 1);
    if (ml) {
        with_int8(quantized_tiled_tp, cuda, &tpt, "llama3-8b 1 layer int8 tiled", loom_model_view_get(ml));
        loom_model_free(ml);
    }
    /* the cuBLASLt expert GEMMs under tp / EP: they need widths of whole
     * 256-byte units, which the tiny shapes lack, so one layer of the
     * Qwen3-30B-A3B shape */
    loom_model *m = load_dummy("qwen3-30b-a3b", LOOM_DTYPE_BF16, 1);
    if (m) {
        const loom_model_view *v = loom_model_view_get(m);
        run_tp_lt_experts(cuda, &tpt, "qwen3-30b-a3b 1 layer", v);
        g_backend_ov = "moe_dispatch=all_to_all";
        run_tp_lt_experts(cuda, &tpt, "qwen3-30b-a3b 1 layer", v);
        g_backend_ov = NULL;
        loom_model_free(m);
    }
}

int main(int argc, char **argv) {
    const char *cuda_so = argc > 2 ? argv[1] : getenv("LOOM_CUDA_BACKEND_SO");
    const char *tp_so = argc > 2 ? argv[2] : getenv("LOOM_TP_EXECUTOR_SO");
    const char *pp_so = argc > 3 ? argv[3] : getenv("LOOM_PP_EXECUTOR_SO");
    if (!cuda_so) cuda_so = LOOM_CUDA_BACKEND_DEFAULT;
    if (!tp_so) tp_so = LOOM_TP_EXECUTOR_DEFAULT;
    if (!pp_so) pp_so = LOOM_PP_EXECUTOR_DEFAULT;
    /* NVLink multicast off: docs/tensor-parallel.md (required on the
     * project's shared H200 machines) */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    printf("gpu_tp_test\n  cuda: %s\n  tp:   %s\n  pp:   %s\n", cuda_so, tp_so, pp_so);
    plugin cuda, tp, pp;
    if (!plugin_open(&cuda, cuda_so, LOOM_KIND_BACKEND, "cuda") || !plugin_open(&pp, pp_so, LOOM_KIND_EXECUTOR, "pp"))
        return 100;
    loom_model *m;
    /* pipeline stages on one GPU (threads links) */
    if ((m = load_dummy("tiny", LOOM_DTYPE_BF16, 0))) {
        run_pp_model(&cuda, &pp, "tiny bf16", loom_model_view_get(m));
        loom_model_free(m);
    }
    if ((m = load_dummy("qwen2-0.5b", LOOM_DTYPE_BF16, 5))) {
        run_pp_model(&cuda, &pp, "qwen2-0.5b 5 layers (bias, tied)", loom_model_view_get(m));
        loom_model_free(m);
    }
    /* stages of a post-norm, windowed model (no r pending between layers)
     * and of a mixture of experts with QK-norm */
    if ((m = load_dummy("gemma3-270m", LOOM_DTYPE_BF16, 4))) {
        run_pp_model(&cuda, &pp, "gemma3-270m 4 layers (post-norms, windows)", loom_model_view_get(m));
        loom_model_free(m);
    }
    if ((m = load_dummy("qwen3-moe-tiny", LOOM_DTYPE_BF16, 0))) {
        run_pp_model(&cuda, &pp, "qwen3-moe-tiny (experts, QK-norm)", loom_model_view_get(m));
        loom_model_free(m);
    }
    run_one_gpu_tp(&cuda, &pp, tp_so);
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
#ifndef GPU_TP_HAVE_NCCL
    printf("SKIP tp: loom-executor-tp.so was built without NCCL (libnccl not found at configure)\n");
    ndev = 0;
#endif
    if (ce != cudaSuccess || ndev < 2) {
        printf("SKIP tensor parallelism needs >= 2 GPUs; %d visible%s%s\n", ce == cudaSuccess ? ndev : 0,
               ce == cudaSuccess ? "" : ": ", ce == cudaSuccess ? "" : cudaGetErrorString(ce));
        printf("gpu_tp_test: %d passed, %d failed\n", g_pass, g_fail);
        return g_fail;
    }
    printf("  %d GPUs visible\n", ndev);
    if (!plugin_open(&tp, tp_so, LOOM_KIND_EXECUTOR, "tp")) return 100;
    if ((m = load_dummy("tiny", LOOM_DTYPE_BF16, 0))) {
        const loom_model_view *v = loom_model_view_get(m);
        run_model(&cuda, &tp, ndev, "tiny bf16", v);
        vocab_cut vc;
        vocab_cut_init(&vc, v, 251);
        run_model(&cuda, &tp, ndev, "tiny bf16 vocab 251", &vc.view);
        loom_model_free(m);
    }
    if ((m = load_dummy("tiny", LOOM_DTYPE_F32, 0))) {
        run_model(&cuda, &tp, ndev, "tiny f32 (converted, column windows)", loom_model_view_get(m));
        loom_model_free(m);
    }
    if ((m = load_dummy("qwen2-0.5b", LOOM_DTYPE_BF16, 2))) {
        run_model(&cuda, &tp, ndev, "qwen2-0.5b 2 layers (bias, tied)", loom_model_view_get(m));
        loom_model_free(m);
    }
    printf("gpu_tp_test: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail;
}
