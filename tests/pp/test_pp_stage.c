/*
 * tests/pp/test_pp_stage.c — the pp executor plugin driving cpu backend
 * stages, both dlopen'd on the fake host (no engine, no YAML), against one
 * plain cpu backend on the same random model; and the executor's links and
 * micro-batch split (pp_link.c, pp_split.c compiled in) on their own.
 *
 *   logits: a 6-head, 3-KV-head, 4-layer shape (vocab 97: a remainder over
 *   3 tensor ranks) through tp 3 x pp 2 and pp 4 with micro-batches, mixed
 *   batches (prefill chunks next to decodes over shuffled block tables):
 *   every logits row within 1e-5 relative of one backend (bit-identical for
 *   pp alone with one micro-batch);
 *   blocks: copy_blocks / swap_blocks reach every stage's own pools;
 *   overlap: with 2 stages and 2 micro-batches, stage 0 starts micro-batch
 *   1 while stage 1 is still in micro-batch 0;
 *   failure: a stage that fails in the middle of a step's micro-batches —
 *   its peers, blocked in send or receive, return; the call names the
 *   stage; the next step runs and is right;
 *   weights: the stages of an untied model hold one backend's weights
 *   between them, nothing twice;
 *   errors: a backend without load_stage, a stage the cpu backend refuses;
 *   links: a count mismatch fails both ends; an abort frees a waiting
 *   receiver; split: cuts of whole sequences with rebased offsets.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_host.h"
#include "formats/dtype.h"
#include "loom/backend.h"
#include "loom/executor.h"
#include "pp.h"
#include "rng.h"
#include "tb_util.h"
#include "tiny_model.h"

#define REL_TOL 1e-5

/* The fake host behind a lock (the ranks allocate from their threads),
 * wrapped once per test process. */
static const loom_host *host(void) { return fake_host_locked(); }

/* ------------------------------------------------------ random model */

static tiny_model *pp_model(uint64_t seed) {
    test_rng r = {seed};
    tiny_model *m = calloc(1, sizeof *m);
    loom_model_config *c = &m->cfg;
    *c = (loom_model_config){.struct_size = sizeof *c, .arch = LOOM_ARCH_LLAMA, .vocab_size = 97,
                             .hidden_size = 48, .intermediate_size = 96, .num_layers = 4,
                             .num_heads = 6, .num_kv_heads = 3, .head_dim = 8, .max_context = 1024,
                             .rope_theta = 10000.f, .rms_norm_eps = 1e-5f, .tie_embeddings = false,
                             .bos_token_id = -1, .eos_token_id = -1};
    snprintf(c->name, sizeof c->name, "pp-6h-4l");
    tiny_add_tensors(m, &r, LOOM_DTYPE_F32, LOOM_DTYPE_F32);
    return m;
}

/* ------------------------------------------------- plugins and rigs */

/* Same layout as the executor's config (checked against its params). */
typedef struct pp_cfg {
    int64_t pp_size, tp_size, micro_batches;
    char layers[LOOM_PARAM_STRING_MAX];
    int64_t comm; /* 0 threads, 1 nccl */
} pp_cfg;

typedef struct rig {
    tb cpu;                            /* the cpu plugin + block allocator    */
    void *pp_lib;
    const loom_executor_ops *pp_ops;
    const loom_backend_ops *inner_ops; /* what the ranks are (cpu or a wrapper) */
    loom_backend_ops runner;           /* the executor's model-runner methods  */
    void *exec;                        /* NULL = one plain backend             */
    void *inner[8];
    int32_t n;
    const loom_backend_ops *ops;
    void *self;
} rig;

static void rig_plugins(rig *g) {
    char msg[512];
    memset(g, 0, sizeof *g);
    cr_assert(tb_load_plugin(&g->cpu, msg, sizeof msg), "%s", msg);
    const char *path = getenv("LOOM_PP_EXECUTOR_SO");
    cr_assert(path, "LOOM_PP_EXECUTOR_SO is not set (meson test sets it)");
    g->pp_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(g->pp_lib, "dlopen %s: %s", path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(g->pp_lib, LOOM_PLUGIN_ENTRY_SYMBOL);
    cr_assert(entry);
    const loom_component *comp = &entry()->components[0];
    cr_assert_str_eq(comp->name, "pp");
    cr_assert_eq(comp->config_size, sizeof(pp_cfg));
    static const struct {
        const char *key;
        size_t off;
    } want[] = {{"pp_size", offsetof(pp_cfg, pp_size)},
                {"tp_size", offsetof(pp_cfg, tp_size)},
                {"micro_batches", offsetof(pp_cfg, micro_batches)},
                {"layers", offsetof(pp_cfg, layers)},
                {"comm", offsetof(pp_cfg, comm)}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const loom_param *p = comp->params;
        while (p->key && strcmp(p->key, want[k].key)) p++;
        cr_assert(p->key, "executor pp has no param %s", want[k].key);
        cr_assert_eq(p->offset, want[k].off, "param %s at offset %zu, test expects %zu", p->key, p->offset,
                     want[k].off);
    }
    g->pp_ops = comp->ops;
    g->inner_ops = g->cpu.ops;
}

/* One plain backend (pp == 0) or the executor over pp x tp ranks. */
static loom_status rig_open(rig *g, int pp, int tp, int mb, const tiny_model *m, loom_error *err) {
    tb_config bc = {.threads = 1, .kv_dtype = 0, .weight_dtype = 0};
    if (pp == 0) {
        cr_assert_eq(g->cpu.ops->create(host(), &bc, &g->cpu.self, err), LOOM_OK, "%s", err->message);
        g->ops = g->cpu.ops;
        g->self = g->cpu.self;
        return g->ops->load(g->self, &m->view, NULL, err);
    }
    pp_cfg cfg = {.pp_size = pp, .tp_size = tp, .micro_batches = mb};
    cr_assert_eq(g->pp_ops->create(host(), &cfg, &g->exec, err), LOOM_OK, "create: %s", err->message);
    g->n = g->pp_ops->inner_count(g->exec);
    cr_assert_eq(g->n, pp * tp);
    for (int32_t i = 0; i < g->n; i++)
        cr_assert_eq(g->inner_ops->create(host(), &bc, &g->inner[i], err), LOOM_OK, "%s", err->message);
    loom_status st = g->pp_ops->attach_inner(g->exec, g->inner_ops, g->inner, g->n, err);
    if (st != LOOM_OK) return st;
    g->runner = tb_executor_runner(g->pp_ops);
    g->ops = &g->runner;
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

static void rig_close(rig *g) {
    if (g->exec) g->pp_ops->destroy(g->exec);
    for (int32_t i = 0; i < g->n; i++) g->inner_ops->destroy(g->inner[i]);
    if (g->cpu.self) g->cpu.ops->destroy(g->cpu.self);
    g->cpu.self = NULL;
    tb_close(&g->cpu);
    if (g->pp_lib) dlclose(g->pp_lib);
    memset(g, 0, sizeof *g);
}

/* One step; appends its logits rows to *out. Returns forward's status. */
static loom_status rig_step(rig *g, tb_seq **seqs, const int32_t *nnew, int32_t nseq, int V, float **out,
                            int32_t *nout, loom_error *err) {
    tb_batch tbb;
    cr_assert(tb_build(&g->cpu, seqs, nnew, nseq, true, &tbb), "test ran out of KV blocks");
    int32_t nl = tbb.batch.num_logits;
    *out = realloc(*out, sizeof(float) * (size_t)(*nout + nl) * (size_t)V);
    float *rows = *out + (size_t)*nout * V;
    for (size_t i = 0; i < (size_t)nl * V; i++) rows[i] = NAN; /* every row must be written */
    loom_status st = g->ops->forward(g->self, &tbb.batch, rows, err);
    if (st == LOOM_OK) {
        for (int32_t i = 0; i < nseq; i++) seqs[i]->done += nnew[i];
        *nout += nl;
    }
    tb_batch_free(&tbb);
    return st;
}

static void rig_step_ok(rig *g, tb_seq **seqs, const int32_t *nnew, int32_t nseq, int V, float **out,
                        int32_t *nout) {
    loom_error err = {0};
    loom_status st = rig_step(g, seqs, nnew, nseq, V, out, nout, &err);
    cr_assert_eq(st, LOOM_OK, "forward: %s", err.message);
}

/* Four sequences: chunked prefills next to decodes. */
static float *run_mixed(rig *g, int V, int32_t *nrows) {
    test_rng r = {99};
    int32_t toks[4][48];
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 48; i++) toks[s][i] = (int32_t)rng_int(&r, V);
    tb_seq s0 = {.tokens = toks[0], .len = 48}, s1 = {.tokens = toks[1], .len = 48},
           s2 = {.tokens = toks[2], .len = 48}, s3 = {.tokens = toks[3], .len = 48};
    float *out = NULL;
    *nrows = 0;
    rig_step_ok(g, (tb_seq *[]){&s0, &s1}, (int32_t[]){11, 7}, 2, V, &out, nrows);
    rig_step_ok(g, (tb_seq *[]){&s0, &s1, &s2, &s3}, (int32_t[]){8, 1, 30, 5}, 4, V, &out, nrows);
    for (int k = 0; k < 3; k++)
        rig_step_ok(g, (tb_seq *[]){&s0, &s1, &s2, &s3}, (int32_t[]){1, 1, 1, 1}, 4, V, &out, nrows);
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

/* -------------------------------------------------------------- logits */

static void check_logits(int pp, int tp, int mb, bool exact) {
    host();
    long live0 = fake_host_live_allocs();
    tiny_model *m = pp_model(1234);
    const int V = m->cfg.vocab_size;
    loom_error err = {0};
    rig ref, g;
    rig_plugins(&ref);
    cr_assert_eq(rig_open(&ref, 0, 0, 0, m, &err), LOOM_OK, "plain load: %s", err.message);
    rig_kv(&ref, 8, 40, 0);
    int32_t nref = 0, n = 0;
    float *want = run_mixed(&ref, V, &nref);
    rig_close(&ref);
    rig_plugins(&g);
    cr_assert_eq(rig_open(&g, pp, tp, mb, m, &err), LOOM_OK, "pp %d x tp %d: load: %s", pp, tp, err.message);
    rig_kv(&g, 8, 40, 0);
    float *got = run_mixed(&g, V, &n);
    rig_close(&g);
    cr_assert_eq(n, nref);
    double e = rel_err(got, want, (size_t)n * V);
    cr_log_info("pp %d x tp %d, micro_batches %d: %d logits rows, max relative error %.3g", pp, tp, mb, n, e);
    if (exact)
        cr_assert(!memcmp(got, want, sizeof(float) * (size_t)n * V),
                  "pp %d, one micro-batch: must be bit-identical to one backend (rel err %g)", pp, e);
    else
        cr_assert(e <= REL_TOL, "pp %d x tp %d: logits differ (rel err %g > %g)", pp, tp, e, REL_TOL);
    free(got);
    free(want);
    tiny_free(m);
    cr_assert_eq(fake_host_live_allocs(), live0, "%ld allocations leaked", fake_host_live_allocs() - live0);
}

Test(pp, logits_pp4_bit_identical) { check_logits(4, 1, 1, true); }
Test(pp, logits_pp2_micro_batches) { check_logits(2, 1, 3, false); }
Test(pp, logits_tp3_x_pp2_micro_batches) { check_logits(2, 3, 2, false); }

/* ------------------------------------------------------------- blocks */

/* Prefill s0, copy its blocks and swap them out and back in to other ids,
 * decode one token from each: every stage moved its own layers' KV. */
Test(pp, copy_and_swap_blocks_on_every_stage) {
    tiny_model *m = pp_model(5);
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
        cr_assert_eq(rig_open(&g, run == 0 ? 0 : 4, 1, 1, m, &err), LOOM_OK, "%s", err.message);
        rig_kv(&g, 8, 32, 8);
        tb_seq s0 = {.tokens = toks, .len = 40};
        float *pre = NULL;
        int32_t npre = 0;
        rig_step_ok(&g, (tb_seq *[]){&s0}, (int32_t[]){19}, 1, V, &pre, &npre);
        free(pre);
        tb_seq s1 = s0, s2 = s0;
        int32_t pairs[6];
        for (int i = 0; i < 3; i++) {
            s1.blocks[i] = g.cpu.free_list[--g.cpu.n_free];
            pairs[2 * i] = s0.blocks[i], pairs[2 * i + 1] = s1.blocks[i];
        }
        cr_assert_eq(g.ops->copy_blocks(g.self, pairs, 3, &err), LOOM_OK, "%s", err.message);
        for (int i = 0; i < 3; i++) pairs[2 * i] = s0.blocks[i], pairs[2 * i + 1] = 5 + i;
        cr_assert_eq(g.ops->swap_blocks(g.self, LOOM_SWAP_OUT, pairs, 3, &err), LOOM_OK, "%s", err.message);
        for (int i = 0; i < 3; i++) {
            s2.blocks[i] = g.cpu.free_list[--g.cpu.n_free];
            pairs[2 * i] = 5 + i, pairs[2 * i + 1] = s2.blocks[i];
        }
        cr_assert_eq(g.ops->swap_blocks(g.self, LOOM_SWAP_IN, pairs, 3, &err), LOOM_OK, "%s", err.message);
        rig_step_ok(&g, (tb_seq *[]){&s0, &s1, &s2}, (int32_t[]){1, 1, 1}, 3, V, &rows[run], &nrows[run]);
        rig_close(&g);
    }
    cr_assert_eq(nrows[1], 3);
    for (int k = 0; k < 3; k++)
        cr_assert(!memcmp(rows[1] + k * V, rows[0], sizeof(float) * (size_t)V),
                  "sequence %d (original, copied, swapped) at pp 4: rel err %g", k,
                  rel_err(rows[1] + k * V, rows[0], (size_t)V));
    free(rows[0]);
    free(rows[1]);
    tiny_free(m);
}

/* A stage's KV block covers its own layers only. */
Test(pp, kv_block_bytes_per_stage) {
    tiny_model *m = pp_model(5);
    rig p, g;
    rig_plugins(&p);
    rig_plugins(&g);
    loom_error err = {0};
    cr_assert_eq(rig_open(&p, 0, 0, 0, m, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(rig_open(&g, 4, 1, 1, m, &err), LOOM_OK, "%s", err.message);
    size_t whole = p.ops->kv_block_bytes(p.self, 16, LOOM_DTYPE_COUNT);
    size_t stage = g.ops->kv_block_bytes(g.self, 16, LOOM_DTYPE_COUNT);
    cr_assert_eq(stage * 4, whole, "4 stages of 1 layer: %zu bytes per block vs %zu for 4 layers", stage, whole);
    rig_close(&p);
    rig_close(&g);
    tiny_free(m);
}

/* ------------------------------------------------------------ failure */

/* A backend wrapper whose forward fails on one instance at its k-th call. */
static void *g_fail_inst;   /* NULL: no failure                         */
static int g_fail_at, g_calls;
static loom_forward_fn *g_real_forward;

static loom_status failing_forward(void *self, const loom_batch *b, float *logits, loom_error *err) {
    if (self == g_fail_inst && __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST) == g_fail_at) {
        err->code = LOOM_ERR_DEVICE;
        snprintf(err->message, sizeof err->message, "injected failure");
        return LOOM_ERR_DEVICE;
    }
    return g_real_forward(self, b, logits, err);
}

/* Stage 1 of 3 fails on the second micro-batch of a step of three: stage 0
 * is then blocked sending to it or stage 2 receiving from it; both must
 * return, the step's error must name stage 1, and the next step must run
 * and match one backend. */
Test(pp, stage_failing_mid_step_does_not_hang, .timeout = 60) {
    tiny_model *m = pp_model(8);
    const int V = m->cfg.vocab_size;
    test_rng r = {4};
    int32_t toks[3][32];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 32; i++) toks[s][i] = (int32_t)rng_int(&r, V);
    float *rows[2] = {NULL, NULL};
    int32_t nrows[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        rig g;
        rig_plugins(&g);
        loom_error err = {0};
        static loom_backend_ops ops;
        ops = *g.cpu.ops;
        g_real_forward = g.cpu.ops->forward;
        g_fail_inst = NULL;
        ops.forward = failing_forward;
        if (run == 1) g.inner_ops = &ops;
        cr_assert_eq(rig_open(&g, run == 0 ? 0 : 3, 1, 3, m, &err), LOOM_OK, "%s", err.message);
        rig_kv(&g, 8, 32, 0);
        tb_seq s[3] = {{.tokens = toks[0], .len = 32}, {.tokens = toks[1], .len = 32},
                       {.tokens = toks[2], .len = 32}};
        tb_seq *all[3] = {&s[0], &s[1], &s[2]};
        if (run == 1) {
            /* every forward goes through the wrapper; instance 1 = stage 1 */
            g_fail_inst = g.inner[1];
            g_fail_at = 2;
            g_calls = 0;
            loom_status st = rig_step(&g, all, (int32_t[]){9, 7, 5}, 3, V, &rows[1], &nrows[1], &err);
            cr_assert_neq(st, LOOM_OK, "the injected failure was not reported");
            cr_assert(strstr(err.message, "stage 1 of 3") && strstr(err.message, "injected failure"),
                      "error does not name the failing stage: %s", err.message);
            /* the same step again, now working; the failed one wrote
             * nothing that matters (slots are rewritten) */
            g_fail_inst = NULL;
        }
        rig_step_ok(&g, all, (int32_t[]){9, 7, 5}, 3, V, &rows[run], &nrows[run]);
        rig_step_ok(&g, all, (int32_t[]){1, 1, 1}, 3, V, &rows[run], &nrows[run]);
        rig_close(&g);
    }
    cr_assert_eq(nrows[0], nrows[1]);
    double e = rel_err(rows[1], rows[0], (size_t)nrows[0] * V);
    cr_assert(e <= REL_TOL, "after the failed step: rel err %g", e);
    free(rows[0]);
    free(rows[1]);
    tiny_free(m);
}

/* ------------------------------------------------------------ overlap */

/* Event order of forward() calls: stage 0's entries, stage 1's exits. */
static int g_events;
static int g_s0_enter[4], g_s1_exit[4], g_s0_calls, g_s1_calls;
static void *g_s0, *g_s1;

static loom_status timed_forward(void *self, const loom_batch *b, float *logits, loom_error *err) {
    if (self == g_s0 && g_s0_calls < 4) g_s0_enter[g_s0_calls++] = __atomic_add_fetch(&g_events, 1, __ATOMIC_SEQ_CST);
    loom_status st = g_real_forward(self, b, logits, err);
    if (self == g_s1 && g_s1_calls < 4) {
        struct timespec ts = {0, 100 * 1000 * 1000}; /* a slow last stage */
        nanosleep(&ts, NULL);
        g_s1_exit[g_s1_calls++] = __atomic_add_fetch(&g_events, 1, __ATOMIC_SEQ_CST);
    }
    return st;
}

/* pp 2 with 2 micro-batches: stage 0 starts micro-batch 1 while stage 1
 * still works on micro-batch 0 (it sleeps 100 ms in it) — the stages run
 * concurrently, not one after the other. */
Test(pp, micro_batches_overlap_stages) {
    tiny_model *m = pp_model(2);
    const int V = m->cfg.vocab_size;
    rig g;
    rig_plugins(&g);
    static loom_backend_ops ops;
    ops = *g.cpu.ops;
    g_real_forward = g.cpu.ops->forward;
    ops.forward = timed_forward;
    g.inner_ops = &ops;
    loom_error err = {0};
    cr_assert_eq(rig_open(&g, 2, 1, 2, m, &err), LOOM_OK, "%s", err.message);
    rig_kv(&g, 8, 16, 0);
    g_s0 = g.inner[0], g_s1 = g.inner[1];
    g_events = g_s0_calls = g_s1_calls = 0;
    test_rng r = {6};
    int32_t toks[2][16];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 16; i++) toks[s][i] = (int32_t)rng_int(&r, V);
    tb_seq a = {.tokens = toks[0], .len = 16}, b = {.tokens = toks[1], .len = 16};
    float *rows = NULL;
    int32_t n = 0;
    rig_step_ok(&g, (tb_seq *[]){&a, &b}, (int32_t[]){8, 8}, 2, V, &rows, &n);
    cr_assert_eq(g_s0_calls, 2, "stage 0 ran %d micro-batches, want 2", g_s0_calls);
    cr_assert_eq(g_s1_calls, 2, "stage 1 ran %d micro-batches, want 2", g_s1_calls);
    cr_assert_lt(g_s0_enter[1], g_s1_exit[0],
                 "stage 0 began micro-batch 1 (event %d) only after stage 1 finished micro-batch 0 "
                 "(event %d): the stages did not overlap",
                 g_s0_enter[1], g_s1_exit[0]);
    free(rows);
    g_s0 = g_s1 = NULL;
    rig_close(&g);
    tiny_free(m);
}

/* ------------------------------------------------------------- errors */

Test(pp, error_backend_without_load_stage) {
    tiny_model *m = pp_model(1);
    rig g;
    rig_plugins(&g);
    static loom_backend_ops ops;
    ops = *g.cpu.ops;
    ops.load_stage = NULL;
    g.inner_ops = &ops;
    loom_error err = {0};
    loom_status st = rig_open(&g, 2, 1, 1, m, &err);
    cr_assert_eq(st, LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.message, "load_stage"), "%s", err.message);
    /* an ops table from before ABI 2.3 (struct_size ends before load_stage) */
    ops = *g.cpu.ops;
    ops.struct_size = (uint32_t)offsetof(loom_backend_ops, load_stage);
    rig_close(&g);
    rig_plugins(&g);
    g.inner_ops = &ops;
    st = rig_open(&g, 2, 1, 1, m, &err);
    cr_assert_eq(st, LOOM_ERR_UNSUPPORTED, "%s", err.message);
    rig_close(&g);
    tiny_free(m);
}

/* The stage communicators of tp inside pp say they take host memory (ABI
 * 2.9): a GPU stage then stages its collectives instead of refusing. */
static atomic_int g_host_comm_ranks;
static loom_status (*g_real_load_stage)(void *, const loom_model_view *, const loom_quant_binding *,
                                        const loom_stage *, const loom_comm *, loom_error *);
static loom_status counting_load_stage(void *self, const loom_model_view *m, const loom_quant_binding *q,
                                       const loom_stage *st, const loom_comm *comm, loom_error *err) {
    if (comm && LOOM_HAS_FIELD(comm, loom_comm, host_memory) && comm->host_memory == 1)
        atomic_fetch_add(&g_host_comm_ranks, 1);
    return g_real_load_stage(self, m, q, st, comm, err);
}

Test(pp, stage_communicators_take_host_memory) {
    tiny_model *m = pp_model(1);
    rig g;
    rig_plugins(&g);
    static loom_backend_ops ops;
    ops = *g.cpu.ops;
    g_real_load_stage = ops.load_stage;
    ops.load_stage = counting_load_stage;
    g.inner_ops = &ops;
    atomic_store(&g_host_comm_ranks, 0);
    loom_error err = {0};
    cr_assert_eq(rig_open(&g, 2, 3, 1, m, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(atomic_load(&g_host_comm_ranks), 6, "2 stages x 3 tensor ranks, each with host_memory 1");
    rig_close(&g);
    tiny_free(m);
}

static loom_status no_send(void *ctx, const void *buf, int64_t n, loom_dtype dt, void *s, loom_error *err) {
    (void)ctx, (void)buf, (void)n, (void)dt, (void)s, (void)err;
    return LOOM_OK;
}

/* The cpu backend checks the stage it is given. */
Test(pp, cpu_refuses_a_bad_stage) {
    tiny_model *m = pp_model(1);
    rig g;
    rig_plugins(&g);
    tb_config bc = {.threads = 1};
    loom_error err = {0};
    void *b = NULL;
    cr_assert_eq(g.cpu.ops->create(host(), &bc, &b, &err), LOOM_OK);
    static const struct {
        loom_stage st;
        const char *needle;
    } bad[] = {
        {{.index = 0, .count = 2, .first_layer = 0, .num_layers = 5}, "outside the model's 4 layers"},
        {{.index = 1, .count = 2, .first_layer = 0, .num_layers = 4}, "first stage must start at layer 0"},
        {{.index = 0, .count = 2, .first_layer = 0, .num_layers = 4}, "last end at layer 3"},
        {{.index = 1, .count = 2, .first_layer = 2, .num_layers = 2}, "no recv_prev link"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_stage st = bad[i].st;
        st.struct_size = sizeof st;
        if (st.index == 0) st.send_next = no_send;
        cr_assert_eq(g.cpu.ops->load_stage(b, &m->view, NULL, &st, NULL, &err), LOOM_ERR_INVALID, "case %zu", i);
        cr_assert(strstr(err.message, bad[i].needle), "case %zu: %s", i, err.message);
    }
    g.cpu.ops->destroy(b);
    rig_close(&g);
    tiny_free(m);
}

static loom_status no_recv(void *ctx, void *buf, int64_t n, loom_dtype dt, void *s, loom_error *err) {
    (void)ctx, (void)buf, (void)n, (void)dt, (void)s, (void)err;
    return LOOM_OK;
}

/* Weight bytes of a cpu backend loaded as `st` (NULL: load()). */
static size_t stage_weight_bytes(const tb *cpu, const tiny_model *m, const loom_stage *st) {
    tb_config bc = {.threads = 1};
    loom_error err = {0};
    void *b = NULL;
    cr_assert_eq(cpu->ops->create(host(), &bc, &b, &err), LOOM_OK, "%s", err.message);
    loom_status s = st ? cpu->ops->load_stage(b, &m->view, NULL, st, NULL, &err) : cpu->ops->load(b, &m->view, NULL, &err);
    cr_assert_eq(s, LOOM_OK, "%s", err.message);
    loom_backend_memory mem = {.struct_size = sizeof mem};
    cr_assert_eq(cpu->ops->memory(b, &mem, &err), LOOM_OK, "%s", err.message);
    cpu->ops->destroy(b);
    return mem.weight_bytes;
}

/* Four stages of one layer each hold, together, exactly one backend's
 * weights: the embedding only on the first, the output norm and the
 * (untied) LM head only on the last, nothing twice. */
Test(pp, stages_hold_only_their_weights) {
    tiny_model *m = pp_model(1);
    rig g;
    rig_plugins(&g);
    size_t whole = stage_weight_bytes(&g.cpu, m, NULL), sum = 0, part[4];
    for (int32_t i = 0; i < 4; i++) {
        loom_stage st = {.struct_size = sizeof st, .index = i, .count = 4, .first_layer = i, .num_layers = 1,
                         .recv_prev = i > 0 ? no_recv : NULL, .send_next = i < 3 ? no_send : NULL};
        sum += part[i] = stage_weight_bytes(&g.cpu, m, &st);
    }
    cr_assert_eq(sum, whole, "stages hold %zu weight bytes together, one backend %zu", sum, whole);
    cr_assert_eq(part[1], part[2], "middle stages differ: %zu vs %zu", part[1], part[2]);
    cr_assert_lt(part[1], part[0], "a middle stage holds as much as the first (embedding)");
    rig_close(&g);
    tiny_free(m);
}

/* The executor's memory(): weight_bytes is the pipeline's, the stages'
 * sum (one whole model), while free and total stay the tightest rank's. */
Test(pp, memory_reports_the_pipelines_weights) {
    tiny_model *m = pp_model(1);
    rig g;
    rig_plugins(&g);
    size_t whole = stage_weight_bytes(&g.cpu, m, NULL);
    loom_error err = {0};
    cr_assert_eq(rig_open(&g, 2, 1, 1, m, &err), LOOM_OK, "%s", err.message);
    loom_backend_memory mem = {.struct_size = sizeof mem};
    cr_assert_eq(g.ops->memory(g.self, &mem, &err), LOOM_OK, "%s", err.message);
    cr_assert_eq(mem.weight_bytes, whole, "pp 2 reports %zu weight bytes, the model holds %zu", mem.weight_bytes,
                 whole);
    rig_close(&g);
    tiny_free(m);
}

/* -------------------------------------------------------------- links */

typedef struct link_job {
    pp_end *end;
    float buf[8];
    int64_t count;
    loom_status st;
    loom_error err;
} link_job;

static void *link_sender(void *arg) {
    link_job *j = arg;
    j->st = pp_link_send(j->end, j->buf, j->count, LOOM_DTYPE_F32, NULL, &j->err);
    return NULL;
}

static void *link_receiver(void *arg) {
    link_job *j = arg;
    j->st = pp_link_recv(j->end, j->buf, j->count, LOOM_DTYPE_F32, NULL, &j->err);
    return NULL;
}

Test(pp, links_copy_refuse_and_abort) {
    pp_links *g = pp_links_create(host(), 1);
    cr_assert(g);
    pp_end tx = {.links = g, .recv_link = -1, .send_link = 0, .rank = 0};
    pp_end rx = {.links = g, .recv_link = 0, .send_link = -1, .rank = 1};
    link_job s = {.end = &tx, .buf = {1, 2, 3, 4}, .count = 4}, r = {.end = &rx, .count = 4};
    pthread_t ts, tr;
    /* a message arrives whole */
    pthread_create(&tr, NULL, link_receiver, &r);
    pthread_create(&ts, NULL, link_sender, &s);
    pthread_join(ts, NULL), pthread_join(tr, NULL);
    cr_assert_eq(s.st, LOOM_OK, "%s", s.err.message);
    cr_assert_eq(r.st, LOOM_OK, "%s", r.err.message);
    cr_assert(!memcmp(r.buf, s.buf, 4 * sizeof(float)));
    /* other counts: both ends fail, naming both */
    r.count = 3;
    pthread_create(&tr, NULL, link_receiver, &r);
    pthread_create(&ts, NULL, link_sender, &s);
    pthread_join(ts, NULL), pthread_join(tr, NULL);
    cr_assert_neq(s.st, LOOM_OK);
    cr_assert_neq(r.st, LOOM_OK);
    cr_assert(strstr(r.err.message, "expected 3 x f32") && strstr(r.err.message, "4 x f32"), "%s", r.err.message);
    /* a receiver waiting for a sender that never comes is freed by abort */
    r.count = 4;
    pthread_create(&tr, NULL, link_receiver, &r);
    pp_links_abort(g);
    pthread_join(tr, NULL);
    cr_assert_neq(r.st, LOOM_OK);
    cr_assert(strstr(r.err.message, "another rank failed"), "%s", r.err.message);
    /* and after a reset the link works again */
    pp_links_reset(g);
    pthread_create(&tr, NULL, link_receiver, &r);
    pthread_create(&ts, NULL, link_sender, &s);
    pthread_join(ts, NULL), pthread_join(tr, NULL);
    cr_assert_eq(r.st, LOOM_OK, "%s", r.err.message);
    pp_links_destroy(g);
}

/* -------------------------------------------------------------- split */

Test(pp, split_whole_sequences_rebased) {
    /* 5 sequences of 10, 1, 1, 6, 2 query tokens; logits for each last */
    static const int32_t qs[] = {0, 10, 11, 12, 18, 20};
    static const int32_t li[] = {9, 10, 11, 17, 19};
    static const int32_t ctx[] = {10, 30, 40, 6, 50};
    int32_t tok[20], pos[20], bt[5 * 4];
    int64_t slot[20];
    for (int i = 0; i < 20; i++) tok[i] = i, pos[i] = i, slot[i] = i;
    for (int i = 0; i < 20; i++) bt[i] = i;
    loom_batch b = {.struct_size = sizeof b, .num_seqs = 5, .num_tokens = 20, .token_ids = tok, .positions = pos,
                    .query_start = qs, .context_len = ctx, .block_table = bt, .block_table_stride = 4,
                    .slot_mapping = slot, .num_logits = 5, .logits_index = li};
    pp_split sp = {0};
    for (int want = 1; want <= 7; want++) {
        int32_t m = pp_split_batch(&sp, host(), &b, want);
        cr_assert_eq(m, want < 5 ? want : 5, "want %d: %d micro-batches", want, m);
        int32_t seqs = 0, toks = 0, rows = 0;
        for (int32_t i = 0; i < m; i++) {
            const loom_batch *x = &sp.mbs[i].batch;
            cr_assert_geq(x->num_seqs, 1);
            cr_assert_eq(x->query_start[0], 0);
            cr_assert_eq(x->query_start[x->num_seqs], x->num_tokens);
            cr_assert_eq(x->token_ids, tok + toks);
            cr_assert_eq(x->context_len, ctx + seqs);
            cr_assert_eq(x->block_table, bt + seqs * 4);
            cr_assert_eq(sp.mbs[i].row0, rows);
            for (int32_t k = 0; k < x->num_logits; k++)
                cr_assert_eq(x->logits_index[k] + toks, li[rows + k]);
            seqs += x->num_seqs, toks += x->num_tokens, rows += x->num_logits;
        }
        cr_assert_eq(seqs, 5);
        cr_assert_eq(toks, 20);
        cr_assert_eq(rows, 5);
    }
    /* two micro-batches split the tokens about evenly: {10} | {1, 1, 6, 2} */
    cr_assert_eq(pp_split_batch(&sp, host(), &b, 2), 2);
    cr_assert_eq(sp.mbs[0].batch.num_tokens, 10);
    pp_split_free(&sp, host());
}
