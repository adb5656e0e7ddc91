/*
 * tests/tp/test_tp_shard.c — the tp executor plugin driving cpu backend
 * ranks, both dlopen'd on the fake host (no engine, no YAML), against one
 * plain cpu backend on the same random model.
 *
 * Shapes are chosen to hit every branch of the split: a vocabulary that
 * does not divide by the size (the last rank holds the remainder, and at
 * vocab 5 over 4 ranks one rank holds nothing), KV heads fewer than ranks
 * (replicated), MHA, MQA, Qwen2 QKV biases, f16-stored weights, tied and
 * untied LM heads. Each runs mixed batches — prefill chunks next to decodes
 * over shuffled block tables — and every logits row must match the plain
 * backend: bit-identical at size 1, within 1e-5 relative at larger sizes
 * (only the summation order of the row-parallel GEMMs differs).
 *
 * Also: copy_blocks / swap_blocks on every rank, kv_block_bytes and memory
 * as the executor reports them, a rank that fails alone (its peers must
 * return from their collectives, and the next step must work), and the
 * load / attach errors. Allocations go through a locked copy of the fake
 * host, so leaks are counted exactly even with ranks allocating at once.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fake_host.h"
#include "rng.h"
#include "loom/backend.h"
#include "loom/executor.h"
#include "tb_util.h"
#include "tiny_model.h"
#include "formats/dtype.h"

#define REL_TOL 1e-5

/* The fake host behind a lock (the ranks allocate from their threads),
 * wrapped once per test process. */
static const loom_host *host(void) { return fake_host_locked(); }

/* ------------------------------------------------------ random models */

typedef struct sm_shape {
    const char *name;
    int32_t heads, kv_heads, head_dim, hidden, inter, vocab, layers;
    bool tied, qwen2, f16;
} sm_shape;

static tiny_model *sm_make(const sm_shape *s, uint64_t seed) {
    test_rng r = {seed};
    tiny_model *m = calloc(1, sizeof *m);
    loom_model_config *c = &m->cfg;
    *c = (loom_model_config){.struct_size = sizeof *c,
                             .arch = s->qwen2 ? LOOM_ARCH_QWEN2 : LOOM_ARCH_LLAMA,
                             .vocab_size = s->vocab,
                             .hidden_size = s->hidden,
                             .intermediate_size = s->inter,
                             .num_layers = s->layers,
                             .num_heads = s->heads,
                             .num_kv_heads = s->kv_heads,
                             .head_dim = s->head_dim,
                             .max_context = 1024,
                             .rope_theta = 10000.f,
                             .rms_norm_eps = 1e-5f,
                             .tie_embeddings = s->tied,
                             .qkv_bias = s->qwen2,
                             .bos_token_id = -1,
                             .eos_token_id = -1};
    snprintf(c->name, sizeof c->name, "%s", s->name);
    loom_dtype wdt = s->f16 ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32;
    tiny_add_tensors(m, &r, wdt, wdt);
    return m;
}

/* ------------------------------------------------- plugins and engines */

/* Same layout as the executor's config (checked against its params). */
typedef struct tp_cfg {
    int64_t size;
    int64_t comm; /* 0 auto, 1 threads, 2 nccl */
    char rendezvous[LOOM_PARAM_STRING_MAX];
    int64_t nodes;
    int64_t node_rank;
    int64_t rendezvous_timeout;
    int64_t p2p_kib; /* peer-to-peer collectives (nccl only); 0 here */
} tp_cfg;

typedef struct rig {
    tb cpu;                          /* the cpu plugin (ops, lib) + block allocator */
    void *tp_lib;
    const loom_component *tp_comp;
    const loom_executor_ops *tp_ops;
    const loom_backend_ops *inner_ops; /* what the ranks are (cpu, or a wrapper) */
    loom_backend_ops exec_runner;    /* the executor's model-runner methods     */
    void *exec;                      /* executor instance, or NULL = plain     */
    void *inner[8];
    int32_t n;
    const loom_backend_ops *ops;     /* what the test drives                   */
    void *self;
} rig;

static void rig_plugins(rig *g) {
    char msg[512];
    memset(g, 0, sizeof *g);
    cr_assert(tb_load_plugin(&g->cpu, msg, sizeof msg), "%s", msg);
    const char *path = getenv("LOOM_TP_EXECUTOR_SO");
    cr_assert(path, "LOOM_TP_EXECUTOR_SO is not set (meson test sets it)");
    g->tp_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(g->tp_lib, "dlopen %s: %s", path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(g->tp_lib, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(entry);
    const loom_plugin_desc *d = entry();
    for (uint32_t i = 0; i < d->num_components; i++)
        if (d->components[i].kind == LOOM_KIND_EXECUTOR && !strcmp(d->components[i].name, "tp"))
            g->tp_comp = &d->components[i];
    cr_assert(g->tp_comp, "%s has no executor 'tp'", path);
    g->tp_ops = g->tp_comp->ops;
    cr_assert_eq(g->tp_comp->config_size, sizeof(tp_cfg));
    static const struct {
        const char *key;
        size_t off;
    } want[] = {{"size", offsetof(tp_cfg, size)},
                {"comm", offsetof(tp_cfg, comm)},
                {"rendezvous", offsetof(tp_cfg, rendezvous)},
                {"nodes", offsetof(tp_cfg, nodes)},
                {"node_rank", offsetof(tp_cfg, node_rank)},
                {"rendezvous_timeout", offsetof(tp_cfg, rendezvous_timeout)},
                {"p2p_kib", offsetof(tp_cfg, p2p_kib)}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const loom_param *p = g->tp_comp->params;
        while (p->key && strcmp(p->key, want[k].key)) p++;
        cr_assert(p->key, "executor tp has no param %s", want[k].key);
        cr_assert_eq(p->offset, want[k].off, "param %s at offset %zu, test expects %zu", p->key,
                     p->offset, want[k].off);
    }
    g->inner_ops = g->cpu.ops;
}

static loom_status rig_create_exec(rig *g, int32_t n, int64_t comm, loom_error *err) {
    tp_cfg cfg = {.size = n, .comm = comm, .nodes = 1, .node_rank = 0, .rendezvous_timeout = 5};
    return g->tp_ops->create(host(), &cfg, &g->exec, err);
}

/* Executor of n ranks (n = 0: one plain backend), loaded with m. */
static loom_status rig_open(rig *g, int32_t n, const tiny_model *m, loom_error *err) {
    tb_config bc = {.threads = 1, .kv_dtype = 0, .weight_dtype = 0};
    loom_status st;
    if (n == 0) {
        cr_assert_eq(g->cpu.ops->create(host(), &bc, &g->cpu.self, err), LOOM_OK, "%s",
                     err->message);
        g->ops = g->cpu.ops;
        g->self = g->cpu.self;
        return g->ops->load(g->self, &m->view, NULL, err);
    }
    cr_assert_eq(rig_create_exec(g, n, 1, err), LOOM_OK, "create: %s", err->message);
    cr_assert_eq(g->tp_ops->inner_count(g->exec), n);
    g->n = n;
    for (int32_t i = 0; i < n; i++)
        cr_assert_eq(g->inner_ops->create(host(), &bc, &g->inner[i], err), LOOM_OK, "%s",
                     err->message);
    if ((st = g->tp_ops->attach_inner(g->exec, g->inner_ops, g->inner, n, err)) != LOOM_OK)
        return st;
    /* the executor drives like a backend: its model-runner methods */
    g->exec_runner = tb_executor_runner(g->tp_ops);
    g->ops = &g->exec_runner;
    g->self = g->exec;
    return g->ops->load(g->self, &m->view, NULL, err);
}

static void rig_kv(rig *g, int32_t bs, int32_t nb, int32_t ncpu) {
    loom_kv_layout lay = {.struct_size = sizeof lay, .block_size = bs, .num_blocks = nb,
                          .num_cpu_blocks = ncpu, .dtype = LOOM_DTYPE_COUNT};
    loom_error err = {0};
    cr_assert_eq(g->ops->kv_alloc(g->self, &lay, &err), LOOM_OK, "kv_alloc: %s", err.message);
    g->cpu.free_list = NULL;
    cr_assert(tb_blocks_init(&g->cpu, bs, nb, 77));
}

/* Close everything; the engine's order: executor, then its ranks. */
static void rig_close(rig *g) {
    if (g->exec) g->tp_ops->destroy(g->exec);
    for (int32_t i = 0; i < g->n; i++) g->inner_ops->destroy(g->inner[i]);
    if (g->cpu.self) g->cpu.ops->destroy(g->cpu.self);
    g->cpu.self = NULL;
    tb_close(&g->cpu);
    if (g->tp_lib) dlclose(g->tp_lib);
    memset(g, 0, sizeof *g);
}

/* One step; appends the logits rows to *out (grown), returns rows added. */
static int32_t rig_step(rig *g, tb_seq **seqs, const int32_t *nnew, int32_t nseq, int V,
                        float **out, int32_t *nout) {
    tb_batch tbb;
    tb *b = &g->cpu;
    cr_assert(tb_build(b, seqs, nnew, nseq, true, &tbb), "test ran out of KV blocks");
    int32_t nl = tbb.batch.num_logits;
    *out = realloc(*out, sizeof(float) * (size_t)(*nout + nl) * (size_t)V);
    float *rows = *out + (size_t)*nout * V;
    for (size_t i = 0; i < (size_t)nl * V; i++) rows[i] = NAN; /* every row must be written */
    loom_error err = {0};
    loom_status st = g->ops->forward(g->self, &tbb.batch, rows, &err);
    cr_assert_eq(st, LOOM_OK, "forward: %s", err.message);
    for (int32_t i = 0; i < nseq; i++) seqs[i]->done += nnew[i];
    *nout += nl;
    tb_batch_free(&tbb);
    return nl;
}

/* The mixed scenario: three sequences, chunked prefill next to decodes. */
static float *run_mixed(rig *g, const tiny_model *m, int32_t *nrows) {
    const int V = m->cfg.vocab_size;
    test_rng r = {99};
    int32_t toks[3][48];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 48; i++) toks[s][i] = (int32_t)rng_int(&r, V);
    tb_seq s0 = {.tokens = toks[0], .len = 48}, s1 = {.tokens = toks[1], .len = 48},
           s2 = {.tokens = toks[2], .len = 48};
    float *out = NULL;
    *nrows = 0;
    rig_step(g, (tb_seq *[]){&s0, &s1}, (int32_t[]){11, 7}, 2, V, &out, nrows);
    rig_step(g, (tb_seq *[]){&s0, &s1, &s2}, (int32_t[]){8, 1, 30}, 3, V, &out, nrows);
    for (int k = 0; k < 3; k++)
        rig_step(g, (tb_seq *[]){&s0, &s1, &s2}, (int32_t[]){1, 1, 1}, 3, V, &out, nrows);
    return out;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        num = fmax(num, d != d ? INFINITY : d);
        den = fmax(den, fabs((double)b[i]));
    }
    return num / den;
}

/* ----------------------------------------------------------- shapes */

static const sm_shape k_shapes[] = {
    /* GQA, untied, vocab 251 = 4 x 63 - 1: the last rank holds 62 */
    {"gqa-v251", 8, 2, 8, 32, 96, 251, 2, false, false, false},
    /* Qwen2: MHA with QKV biases, tied, f16-stored weights */
    {"qwen2-mha-f16", 6, 6, 8, 48, 48, 97, 2, true, true, true},
    /* MQA: one KV head shared by every rank */
    {"mqa-v50", 4, 1, 16, 32, 64, 50, 2, false, false, false},
    /* vocab 5 over 4 ranks: 2, 2, 1 and 0 rows */
    {"vocab5", 4, 2, 8, 32, 32, 5, 1, true, false, false},
};

static void check_shape(const sm_shape *s, const int32_t *sizes, int nsizes) {
    host();
    long live0 = fake_host_live_allocs();
    tiny_model *m = sm_make(s, 1234);
    const int V = s->vocab;
    rig ref;
    rig_plugins(&ref);
    loom_error err = {0};
    cr_assert_eq(rig_open(&ref, 0, m, &err), LOOM_OK, "%s: plain load: %s", s->name, err.message);
    rig_kv(&ref, 8, 40, 0);
    int32_t nref = 0;
    float *want = run_mixed(&ref, m, &nref);
    rig_close(&ref);
    for (int k = 0; k < nsizes; k++) {
        rig g;
        rig_plugins(&g);
        cr_assert_eq(rig_open(&g, sizes[k], m, &err), LOOM_OK, "%s size %d: load: %s", s->name,
                     sizes[k], err.message);
        rig_kv(&g, 8, 40, 0);
        int32_t n = 0;
        float *got = run_mixed(&g, m, &n);
        cr_assert_eq(n, nref);
        double e = rel_err(got, want, (size_t)n * V);
        cr_log_info("%s size %d: %d logits rows, max relative error %.3g", s->name, sizes[k], n, e);
        if (sizes[k] == 1)
            cr_assert(!memcmp(got, want, sizeof(float) * (size_t)n * V),
                      "%s: size 1 must be bit-identical to one backend (rel err %g)", s->name, e);
        else
            cr_assert(e <= REL_TOL, "%s size %d: logits differ (rel err %g > %g)", s->name,
                      sizes[k], e, REL_TOL);
        free(got);
        rig_close(&g);
    }
    free(want);
    tiny_free(m);
    cr_assert_eq(fake_host_live_allocs(), live0, "%s: %ld allocations leaked", s->name,
                 fake_host_live_allocs() - live0);
}

Test(tp, logits_gqa_vocab_remainder) { check_shape(&k_shapes[0], (int32_t[]){1, 2, 4}, 3); }
Test(tp, logits_qwen2_mha_f16_weights) { check_shape(&k_shapes[1], (int32_t[]){1, 2, 3, 6}, 4); }
Test(tp, logits_mqa) { check_shape(&k_shapes[2], (int32_t[]){2, 4}, 2); }
Test(tp, logits_rank_without_vocabulary) { check_shape(&k_shapes[3], (int32_t[]){4}, 1); }

/* ------------------------------------------------- blocks and memory */

/* Prefill s0; copy its blocks (copy-on-write) and swap them out and back
 * in to other ids; decode one token from each copy: every rank must have
 * moved its own share of the KV, so all three decodes give one backend's
 * logits. */
Test(tp, copy_and_swap_blocks_on_every_rank) {
    tiny_model *m = sm_make(&k_shapes[0], 5);
    const int V = m->cfg.vocab_size;
    test_rng r = {3};
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)rng_int(&r, V);
    float *rows[2] = {NULL, NULL};
    int32_t nrows[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        rig g;
        rig_plugins(&g);
        loom_error err = {0};
        cr_assert_eq(rig_open(&g, run == 0 ? 0 : 4, m, &err), LOOM_OK, "%s", err.message);
        rig_kv(&g, 8, 32, 8);
        tb_seq s0 = {.tokens = toks, .len = 40};
        float *pre = NULL;
        int32_t npre = 0;
        rig_step(&g, (tb_seq *[]){&s0}, (int32_t[]){19}, 1, V, &pre, &npre);
        free(pre);
        cr_assert_eq(s0.nblocks, 3);
        /* copies into three fresh blocks */
        tb_seq s1 = s0, s2 = s0;
        int32_t pairs[6];
        for (int i = 0; i < 3; i++) {
            s1.blocks[i] = g.cpu.free_list[--g.cpu.n_free];
            pairs[2 * i] = s0.blocks[i];
            pairs[2 * i + 1] = s1.blocks[i];
        }
        cr_assert_eq(g.ops->copy_blocks(g.self, pairs, 3, &err), LOOM_OK, "%s", err.message);
        /* out to host blocks 5, 6, 7, then in to three more fresh blocks */
        for (int i = 0; i < 3; i++) pairs[2 * i] = s0.blocks[i], pairs[2 * i + 1] = 5 + i;
        cr_assert_eq(g.ops->swap_blocks(g.self, LOOM_SWAP_OUT, pairs, 3, &err), LOOM_OK, "%s",
                     err.message);
        for (int i = 0; i < 3; i++) {
            s2.blocks[i] = g.cpu.free_list[--g.cpu.n_free];
            pairs[2 * i] = 5 + i;
            pairs[2 * i + 1] = s2.blocks[i];
        }
        cr_assert_eq(g.ops->swap_blocks(g.self, LOOM_SWAP_IN, pairs, 3, &err), LOOM_OK, "%s",
                     err.message);
        /* decode the 20th token of all three in one step */
        rig_step(&g, (tb_seq *[]){&s0, &s1, &s2}, (int32_t[]){1, 1, 1}, 3, V, &rows[run],
                 &nrows[run]);
        rig_close(&g);
    }
    cr_assert_eq(nrows[0], 3);
    cr_assert_eq(nrows[1], 3);
    for (int k = 0; k < 3; k++) {
        double e = rel_err(rows[1] + k * V, rows[0], (size_t)V);
        cr_assert(e <= REL_TOL, "sequence %d (original, copied, swapped) at size 4: rel err %g", k,
                  e);
    }
    free(rows[0]);
    free(rows[1]);
    tiny_free(m);
}

/* Ranks hold their share of the KV heads: 2 KV heads over 4 ranks is one
 * (replicated) head each, half a plain backend's block. Free memory is per
 * rank: the ranks share the host's RAM. */
Test(tp, kv_block_bytes_and_memory) {
    tiny_model *m = sm_make(&k_shapes[0], 5);
    rig p, g;
    rig_plugins(&p);
    rig_plugins(&g);
    loom_error err = {0};
    cr_assert_eq(rig_open(&p, 0, m, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(rig_open(&g, 4, m, &err), LOOM_OK, "%s", err.message);
    size_t plain = p.ops->kv_block_bytes(p.self, 16, LOOM_DTYPE_COUNT);
    size_t tp = g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_COUNT);
    cr_assert_gt(plain, 0);
    cr_assert_eq(tp * 2, plain, "size 4, 2 KV heads: %zu bytes per block per rank vs %zu whole", tp,
                 plain);
    cr_assert_eq(g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_F16) * 2,
                 p.ops->kv_block_bytes(p.self, 16, LOOM_DTYPE_F16));
    /* E4M3 (a quantizer's kv_cache: fp8) is a quarter of f32 */
    cr_assert_eq(g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_FP8_E4M3) * 4,
                 g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_F32));
    cr_assert_eq(g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_BF16), 0,
                 "a KV type the ranks cannot hold must be 0");
    loom_backend_memory mp = {.struct_size = sizeof mp}, mg = {.struct_size = sizeof mg};
    cr_assert_eq(p.ops->memory(p.self, &mp, &err), LOOM_OK);
    cr_assert_eq(g.ops->memory(g.self, &mg, &err), LOOM_OK);
    cr_assert_lt(mg.total_bytes, mp.total_bytes / 3, "total %zu vs %zu: not split over 4 ranks",
                 mg.total_bytes, mp.total_bytes);
    cr_assert_lt(mg.weight_bytes, mp.weight_bytes, "a rank holds less than the whole model");
    rig_close(&p);
    rig_close(&g);
    tiny_free(m);
}

/* ----------------------------------------- a rank that fails alone */

/* A wrapper backend around cpu: rank `g_fail_rank` fails its next forward
 * before calling any collective, so its peers are left waiting in one. */
typedef struct wrap {
    void *inner;
    int32_t rank;
} wrap;

static const loom_backend_ops *g_cpu_ops;
static atomic_int g_fail_rank = -1;
static atomic_int g_host_memory_ranks; /* ranks handed a host-memory communicator */

static loom_status w_create(const loom_host *h, const void *cfg, void **self, loom_error *err) {
    wrap *w = calloc(1, sizeof *w);
    loom_status st = g_cpu_ops->create(h, cfg, &w->inner, err);
    if (st != LOOM_OK) {
        free(w);
        return st;
    }
    *self = w;
    return LOOM_OK;
}
static void w_destroy(void *self) {
    wrap *w = self;
    if (!w) return;
    g_cpu_ops->destroy(w->inner);
    free(w);
}
static loom_status w_load(void *self, const loom_model_view *m, const loom_quant_binding *q,
                          loom_error *err) {
    return g_cpu_ops->load(((wrap *)self)->inner, m, q, err);
}
static loom_status w_load_shard(void *self, const loom_model_view *m, const loom_quant_binding *q,
                                const loom_comm *c, loom_error *err) {
    ((wrap *)self)->rank = c->rank;
    if (LOOM_HAS_FIELD(c, loom_comm, host_memory) && c->host_memory == 1) atomic_fetch_add(&g_host_memory_ranks, 1);
    return g_cpu_ops->load_shard(((wrap *)self)->inner, m, q, c, err);
}
static size_t w_kv_bytes(void *self, int32_t bs, loom_dtype dt) {
    return g_cpu_ops->kv_block_bytes(((wrap *)self)->inner, bs, dt);
}
static loom_status w_memory(void *self, loom_backend_memory *out, loom_error *err) {
    return g_cpu_ops->memory(((wrap *)self)->inner, out, err);
}
static loom_status w_kv_alloc(void *self, const loom_kv_layout *l, loom_error *err) {
    return g_cpu_ops->kv_alloc(((wrap *)self)->inner, l, err);
}
static loom_status w_forward(void *self, const loom_batch *b, float *logits, loom_error *err) {
    wrap *w = self;
    if (atomic_load(&g_fail_rank) == w->rank) {
        usleep(20000); /* let the peers reach their first collective */
        return host()->error(NULL, err, LOOM_ERR_NOMEM, "injected failure on rank %d", w->rank);
    }
    return g_cpu_ops->forward(w->inner, b, logits, err);
}
static loom_status w_copy(void *self, const int32_t *p, int32_t n, loom_error *err) {
    return g_cpu_ops->copy_blocks(((wrap *)self)->inner, p, n, err);
}

static loom_backend_ops g_wrap_ops = {
    .struct_size = sizeof(loom_backend_ops),
    .create = w_create,
    .destroy = w_destroy,
    .load = w_load,
    .kv_block_bytes = w_kv_bytes,
    .memory = w_memory,
    .kv_alloc = w_kv_alloc,
    .forward = w_forward,
    .copy_blocks = w_copy,
    .swap_blocks = NULL,
    .load_shard = w_load_shard,
};

Test(tp, a_rank_failing_alone_releases_its_peers) {
    tiny_model *m = sm_make(&k_shapes[0], 8);
    const int V = m->cfg.vocab_size;
    rig ref, g;
    rig_plugins(&ref);
    rig_plugins(&g);
    g_cpu_ops = g.cpu.ops;
    g.inner_ops = &g_wrap_ops;
    atomic_store(&g_host_memory_ranks, 0);
    loom_error err = {0};
    cr_assert_eq(rig_open(&ref, 0, m, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(rig_open(&g, 2, m, &err), LOOM_OK, "%s", err.message);
    /* the threads communicator says it takes host memory (ABI 2.9), so a
     * GPU backend knows to stage its buffers */
    cr_assert_eq(atomic_load(&g_host_memory_ranks), 2);
    rig_kv(&ref, 8, 16, 0);
    rig_kv(&g, 8, 16, 0);
    int32_t toks[12] = {1, 5, 9, 33, 2, 7, 100, 250, 3, 3, 8, 60};
    tb_seq a = {.tokens = toks, .len = 12}, b = {.tokens = toks, .len = 12};
    tb_batch tbb;
    cr_assert(tb_build(&g.cpu, (tb_seq *[]){&b}, (int32_t[]){6}, 1, true, &tbb));
    float *rows = malloc(sizeof(float) * 6 * (size_t)V);
    for (int32_t bad = 1; bad >= 0; bad--) {
        atomic_store(&g_fail_rank, bad);
        loom_status st = g.ops->forward(g.self, &tbb.batch, rows, &err);
        cr_assert_neq(st, LOOM_OK, "rank %d failed but forward succeeded", bad);
        char want[64];
        snprintf(want, sizeof want, "rank %d of 2: injected failure on rank %d", bad, bad);
        cr_assert(strstr(err.message, want), "want \"%s\" (the cause, not a peer's abort): %s", want,
                  err.message);
    }
    /* the same step again, nobody failing: the communicator was reset */
    atomic_store(&g_fail_rank, -1);
    cr_assert_eq(g.ops->forward(g.self, &tbb.batch, rows, &err), LOOM_OK, "%s", err.message);
    tb_batch_free(&tbb);
    float *want = NULL;
    int32_t nw = 0;
    b.done = 6;
    rig_step(&ref, (tb_seq *[]){&a}, (int32_t[]){6}, 1, V, &want, &nw);
    cr_assert(rel_err(rows, want, 6 * (size_t)V) <= REL_TOL);
    /* and the rank that cannot swap makes swap_blocks a clear error */
    cr_assert_neq(g.ops->swap_blocks(g.self, LOOM_SWAP_OUT, (int32_t[]){0, 0}, 1, &err), LOOM_OK);
    cr_assert(strstr(err.message, "cannot swap"), "%s", err.message);
    free(rows);
    free(want);
    rig_close(&ref);
    rig_close(&g);
    tiny_free(m);
}

/* ------------------------------------------------------------ errors */

static void expect_load_error(const sm_shape *s, int32_t n, const char *const *needles) {
    tiny_model *m = sm_make(s, 1);
    rig g;
    rig_plugins(&g);
    loom_error err = {0};
    loom_status st = rig_open(&g, n, m, &err);
    cr_assert_neq(st, LOOM_OK, "%s over %d ranks loaded; an error was expected", s->name, n);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(err.message, needles[i]), "error lacks \"%s\": %s", needles[i],
                  err.message);
    rig_close(&g);
    tiny_free(m);
}

Test(tp, error_ffn_width_not_divisible) {
    sm_shape s = {"ffn30", 4, 2, 8, 32, 30, 64, 1, true, false, false};
    expect_load_error(&s, 4, (const char *const[]){"FFN width (intermediate_size) 30", "size 4",
                                                   "work for this model: 1, 2", NULL});
}

Test(tp, error_kv_heads_do_not_fit) {
    sm_shape s = {"kv4", 12, 4, 8, 32, 48, 64, 1, true, false, false};
    expect_load_error(&s, 3, (const char *const[]){"4 KV heads for 12 query heads", "size 3",
                                                   "1, 2, 4, 12", NULL});
}

Test(tp, error_heads_not_divisible) {
    sm_shape s = {"h6", 6, 6, 8, 48, 48, 64, 1, true, false, false};
    expect_load_error(&s, 4, (const char *const[]){"6 attention heads", "1, 2, 3, 6", NULL});
}

Test(tp, error_backend_without_load_shard) {
    rig g;
    rig_plugins(&g);
    loom_error err = {0};
    cr_assert_eq(rig_create_exec(&g, 2, 1, &err), LOOM_OK, "%s", err.message);
    loom_backend_ops no_shard = *g.cpu.ops;
    no_shard.load_shard = NULL;
    void *inst[2] = {(void *)1, (void *)2}; /* never called */
    cr_assert_neq(g.tp_ops->attach_inner(g.exec, &no_shard, inst, 2, &err), LOOM_OK);
    cr_assert(strstr(err.message, "cannot be sharded"), "%s", err.message);
    cr_assert_neq(g.tp_ops->attach_inner(g.exec, g.cpu.ops, inst, 3, &err), LOOM_OK,
                  "3 instances for size 2");
    /* ops before attach_inner are errors, not crashes */
    loom_backend_memory mem = {.struct_size = sizeof mem};
    cr_assert_neq(g.tp_ops->memory(g.exec, &mem, &err), LOOM_OK);
    cr_assert(strstr(err.message, "before attach_inner"), "%s", err.message);
    cr_assert_eq(g.tp_ops->kv_block_bytes(g.exec, 16, LOOM_DTYPE_F32), 0);
    rig_close(&g);
}

Test(tp, error_config) {
    rig g;
    rig_plugins(&g);
    loom_error err = {0};
    tp_cfg cfg = {.size = 0, .comm = 1, .nodes = 1, .rendezvous_timeout = 5};
    void *x = NULL;
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK);
    cr_assert(strstr(err.message, "size 0"), "%s", err.message);
    cfg = (tp_cfg){.size = 2, .comm = 1, .nodes = 2, .node_rank = 0, .rendezvous_timeout = 5};
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK);
    cr_assert(strstr(err.message, "needs executor.rendezvous"), "%s", err.message);
    cfg.node_rank = 2;
    snprintf(cfg.rendezvous, sizeof cfg.rendezvous, "node0:29500");
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK);
    cr_assert(strstr(err.message, "node_rank 2"), "%s", err.message);
    cfg.node_rank = 1;
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK, "threads across nodes");
    cr_assert(strstr(err.message, "needs comm: nccl"), "%s", err.message);
    /* peer-to-peer collectives are GPU kernels: threads ranks cannot use them */
    cfg = (tp_cfg){.size = 2, .comm = 1, .nodes = 1, .rendezvous_timeout = 5, .p2p_kib = 64};
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK, "p2p_kib with threads");
    cr_assert(strstr(err.message, "p2p_kib 64") && strstr(err.message, "comm: nccl"), "%s", err.message);
#ifndef TP_TEST_HAVE_NCCL
    cfg = (tp_cfg){.size = 2, .comm = 2, .nodes = 1, .rendezvous_timeout = 5};
    cr_assert_neq(g.tp_ops->create(host(), &cfg, &x, &err), LOOM_OK);
    cr_assert(strstr(err.message, "without CUDA and NCCL"), "%s", err.message);
#endif
    cr_assert_null(x);
    rig_close(&g);
}
