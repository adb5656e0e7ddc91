/*
 * conformance/cf_backend.c — backend and executor checks (loom/backend.h,
 * loom/executor.h) on the tiny dummy model (vocab 256, 2 layers, 4 heads
 * of 16, 2 KV heads; random weights from a fixed seed), with a KV pool of
 * 4-token blocks the kit hands out itself. An executor is driven through
 * the same model-runner calls after N inner backends (--inner-backend,
 * default cpu) are attached.
 *
 *   backend.load        load(); kv_block_bytes() > 0 and linear in the
 *                       block size; memory() sane; a second load() refused.
 *   backend.forward     logits finite and exactly (num_logits, vocab)
 *                       (a guard past them stays untouched); a prompt run
 *                       in one step and in two chunks, batched with
 *                       another sequence, gives the same last logits and
 *                       the same next decode; a repeated step repeats.
 *   backend.bad_batch   token ids, slots, block ids or positions out of
 *                       range are refused (host->check_batch), not run.
 *   backend.kv_nomem    a KV pool no memory holds: kv_alloc() answers
 *                       LOOM_ERR_NOMEM with a message.
 *   backend.forward_topk  (when present) each row's k best, ids and lse
 *                       equal host->logits_topk_row on forward()'s own
 *                       rows; rows marked want_full are copied whole, the
 *                       others left alone.
 *   backend.copy_blocks a sequence decoding from copied blocks decodes
 *                       exactly as from the originals.
 *   backend.swap_blocks (when present) the same after a swap out and in.
 *   executor.equivalence  the executor's logits equal one inner backend's
 *                       on the same steps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cf_kit.h"
#include "loom/executor.h"
#include "model/model.h"
#include "plugin/registry.h"

#define BK_BS 4
#define BK_NBLOCKS 96
#define BK_MAX_SEQ_BLOCKS 32
#define BK_MAX_SEQS 4
#define BK_GUARD 12345.0f

typedef struct bk {
    cf_run *r;
    bool executor;
    const loom_backend_ops *bops;   /* backend under test, or the inner one   */
    const loom_executor_ops *eops;  /* NULL for a backend                     */
    void *self;
    void **inner;                   /* executor: inner instances (ninner)     */
    int32_t ninner;
    loom_model *model;
    const loom_model_view *view;
    int32_t vocab;
    int32_t nblocks, ncpu, next_block;
} bk;

typedef struct bk_seq {
    int32_t toks[128];
    int32_t len;                    /* tokens whose K/V are in the cache      */
    int32_t blocks[BK_MAX_SEQ_BLOCKS];
    int32_t nb;
} bk_seq;

/* ------------------------------------------------------ the model runner */

static loom_status bk_load(bk *b, loom_error *err) {
    cf_where(b->r, "load()");
    return b->executor ? b->eops->load(b->self, b->view, NULL, err) : b->bops->load(b->self, b->view, NULL, err);
}
static size_t bk_kv_bytes(bk *b, int32_t bs) {
    cf_where(b->r, "kv_block_bytes(%d)", bs);
    return b->executor ? b->eops->kv_block_bytes(b->self, bs, LOOM_DTYPE_COUNT)
                       : b->bops->kv_block_bytes(b->self, bs, LOOM_DTYPE_COUNT);
}
static loom_status bk_memory(bk *b, loom_backend_memory *m, loom_error *err) {
    cf_where(b->r, "memory()");
    *m = (loom_backend_memory){.struct_size = sizeof *m};
    return b->executor ? b->eops->memory(b->self, m, err) : b->bops->memory(b->self, m, err);
}
static loom_status bk_kv_alloc(bk *b, int32_t nblocks, int32_t ncpu, loom_error *err) {
    loom_kv_layout L = {.struct_size = sizeof L, .block_size = BK_BS, .num_blocks = nblocks, .num_cpu_blocks = ncpu,
                        .dtype = LOOM_DTYPE_COUNT};
    cf_where(b->r, "kv_alloc(%d blocks of %d, %d host blocks)", nblocks, BK_BS, ncpu);
    loom_status st = b->executor ? b->eops->kv_alloc(b->self, &L, err) : b->bops->kv_alloc(b->self, &L, err);
    if (st == LOOM_OK) {
        b->nblocks = nblocks;
        b->ncpu = ncpu;
    }
    return st;
}
static loom_status bk_forward(bk *b, const loom_batch *batch, float *logits, loom_error *err) {
    cf_where(b->r, "forward() of %d tokens in %d sequences", batch->num_tokens, batch->num_seqs);
    return b->executor ? b->eops->forward(b->self, batch, logits, err) : b->bops->forward(b->self, batch, logits, err);
}
static bool bk_has_topk(const bk *b) { return b->executor ? b->eops->forward_topk != NULL : b->bops->forward_topk != NULL; }
static loom_status bk_topk(bk *b, const loom_batch *batch, const loom_logits_topk *out, loom_error *err) {
    cf_where(b->r, "forward_topk(k %d)", out->k);
    return b->executor ? b->eops->forward_topk(b->self, batch, out, err) : b->bops->forward_topk(b->self, batch, out, err);
}
static loom_status bk_copy(bk *b, const int32_t *pairs, int32_t n, loom_error *err) {
    cf_where(b->r, "copy_blocks(%d pairs)", n);
    return b->executor ? b->eops->copy_blocks(b->self, pairs, n, err) : b->bops->copy_blocks(b->self, pairs, n, err);
}
static bool bk_has_swap(const bk *b) { return b->executor ? b->eops->swap_blocks != NULL : b->bops->swap_blocks != NULL; }
static loom_status bk_swap(bk *b, loom_swap_dir dir, const int32_t *pairs, int32_t n, loom_error *err) {
    cf_where(b->r, "swap_blocks(%s, %d pairs)", dir == LOOM_SWAP_OUT ? "out" : "in", n);
    return b->executor ? b->eops->swap_blocks(b->self, dir, pairs, n, err)
                       : b->bops->swap_blocks(b->self, dir, pairs, n, err);
}

/* ------------------------------------------------------------- batches */

typedef struct bk_batch {
    loom_batch b;
    int32_t tok[256], pos[256], qs[BK_MAX_SEQS + 1], ctx[BK_MAX_SEQS], bt[BK_MAX_SEQS * BK_MAX_SEQ_BLOCKS];
    int32_t lidx[BK_MAX_SEQS];
    int64_t slot[256];
} bk_batch;

/* One step: seqs[i] runs its next n[i] tokens (blocks taken as needed);
 * a logits row for each sequence's last token. */
static bool bk_build(bk *b, bk_seq *const *seqs, const int32_t *n, int32_t ns, bk_batch *x) {
    memset(x, 0, sizeof *x);
    int32_t t = 0;
    for (int32_t s = 0; s < ns; s++) {
        bk_seq *q = seqs[s];
        x->qs[s] = t;
        int32_t end = q->len + n[s];
        while (q->nb * BK_BS < end) {
            CF_ENSURE(b->r, b->next_block < b->nblocks && q->nb < BK_MAX_SEQ_BLOCKS, "the kit ran out of blocks");
            q->blocks[q->nb++] = b->next_block++;
        }
        for (int32_t p = q->len; p < end; p++, t++) {
            x->tok[t] = q->toks[p];
            x->pos[t] = p;
            x->slot[t] = (int64_t)q->blocks[p / BK_BS] * BK_BS + p % BK_BS;
        }
        x->ctx[s] = end;
        memcpy(x->bt + s * BK_MAX_SEQ_BLOCKS, q->blocks, sizeof(int32_t) * (size_t)q->nb);
        x->lidx[s] = t - 1;
    }
    x->qs[ns] = t;
    x->b = (loom_batch){.struct_size = sizeof x->b, .num_seqs = ns, .num_tokens = t, .token_ids = x->tok,
                        .positions = x->pos, .query_start = x->qs, .context_len = x->ctx, .block_table = x->bt,
                        .block_table_stride = BK_MAX_SEQ_BLOCKS, .slot_mapping = x->slot, .num_logits = ns,
                        .logits_index = x->lidx};
    return true;
}

/* Run the step; logits (ns, vocab) into out; the sequences advance. */
static bool bk_step(bk *b, bk_seq *const *seqs, const int32_t *n, int32_t ns, float *out) {
    bk_batch x;
    if (!bk_build(b, seqs, n, ns, &x)) return false;
    size_t nl = (size_t)ns * (size_t)b->vocab;
    float *l = malloc(sizeof(float) * (nl + 8));
    CF_ENSURE(b->r, l, "out of memory");
    for (int i = 0; i < 8; i++) l[nl + i] = BK_GUARD;
    loom_error err = {0};
    loom_status st = bk_forward(b, &x.b, l, &err);
    bool ok = st == LOOM_OK || cf_fail(b->r, "forward() of a valid batch failed (%d): %s", (int)st, err.message);
    for (int i = 0; ok && i < 8; i++)
        if (l[nl + i] != BK_GUARD) ok = cf_fail(b->r, "forward() wrote past its %d logits rows", ns);
    for (size_t i = 0; ok && i < nl; i++)
        if (!isfinite(l[i])) ok = cf_fail(b->r, "logit %zu of row %zu is %g", i % (size_t)b->vocab, i / (size_t)b->vocab, l[i]);
    if (ok) memcpy(out, l, sizeof(float) * nl);
    free(l);
    for (int32_t s = 0; ok && s < ns; s++) seqs[s]->len += n[s];
    return ok;
}

static bool bk_close_rows(bk *b, const float *a, const float *c, const char *what) {
    double mx = 0;
    for (int32_t i = 0; i < b->vocab; i++) mx = fmax(mx, fabs(a[i]));
    for (int32_t i = 0; i < b->vocab; i++)
        CF_ENSURE(b->r, fabs(a[i] - c[i]) <= 2e-3 * (1.0 + mx), "%s: logit %d is %g vs %g", what, i, a[i], c[i]);
    return true;
}

/* ------------------------------------------------------------ open/close */

static bool bk_model(bk *b) {
    loom_model_load_opts mo = {.format = "dummy", .dummy_shape = "tiny", .seed = 7};
    loom_error err = {0};
    cf_where(b->r, "loading the tiny dummy model");
    CF_ENSURE(b->r, loom_model_load(&mo, &b->model, &err) == LOOM_OK, "the kit cannot load the tiny dummy model: %s",
              err.message);
    b->view = loom_model_view_get(b->model);
    b->vocab = b->view->config->vocab_size;
    return true;
}

/* The executor's inner backends, created and attached. */
static bool bk_attach(bk *b) {
    const char *name = b->r->opts->inner_backend ? b->r->opts->inner_backend : "cpu";
    const loom_component *ic = NULL;
    struct loom_plugin *ip = NULL;
    loom_error err = {0};
    if (!cf_registry() || loom_registry_find(cf_registry(), LOOM_KIND_BACKEND, name, &ic, &ip, &err) != LOOM_OK)
        return cf_fail(b->r, "the inner backend '%s' is not in the search path: %s", name, err.message);
    cf_where(b->r, "inner_count()");
    int32_t n = b->eops->inner_count(b->self);
    CF_ENSURE(b->r, n >= 1 && n <= 1024, "inner_count() returned %d (1..1024)", n);
    b->bops = ic->ops;
    b->inner = calloc((size_t)n, sizeof *b->inner);
    CF_ENSURE(b->r, b->inner, "out of memory");
    static const loom_conformance_opts inner_opts = {0};
    cf_run ir = *b->r;
    ir.opts = &inner_opts;
    ir.comp = ic;
    for (int32_t i = 0; i < n; i++) {
        if (!cf_create(&ir, "threads=1", &b->inner[i])) return cf_fail(b->r, "inner backend '%s': %s", name, ir.why);
        b->ninner++;
    }
    cf_where(b->r, "attach_inner(%d x %s)", n, name);
    loom_status st = b->eops->attach_inner(b->self, b->bops, b->inner, n, &err);
    CF_ENSURE(b->r, st == LOOM_OK, "attach_inner(%d x %s) failed: %s", n, name, err.message);
    return true;
}

static void bk_destroy(bk *b) {
    if (b->self) ((const loom_ops_head *)b->r->comp->ops)->destroy(b->self);
    b->self = NULL;
    for (int32_t i = 0; i < b->ninner; i++) b->bops->destroy(b->inner[i]);
    free(b->inner);
    b->inner = NULL;
    b->ninner = 0;
}

/* Destroy everything; fail when host allocations remain (`ok` so far). */
static bool bk_close(bk *b, bool ok) {
    bk_destroy(b);
    loom_model_free(b->model);
    b->model = NULL;
    if (ok && cf_host_live()) return cf_fail(b->r, "destroy() left %ld host allocations unfreed", cf_host_live());
    return ok;
}

/* Two ranks of the executor under test: tp's `size`, or pp's two stages
 * with two micro-batches (the tiny model has 2 layers). */
static const char *bk_exec_config(const cf_run *r) {
    for (const loom_param *p = r->comp->params; p && p->key; p++)
        if (!strcmp(p->key, "pp_size")) return "pp_size=2,micro_batches=2";
    return "size=2,comm=threads";
}

/* Create (+ attach inner backends), load, and kv_alloc (ncpu host blocks;
 * nblocks 0 = leave the pool unallocated). */
static bool bk_open(cf_run *r, bk *b, int32_t nblocks, int32_t ncpu) {
    memset(b, 0, sizeof *b);
    b->r = r;
    b->executor = r->comp->kind == LOOM_KIND_EXECUTOR;
    if (b->executor) b->eops = r->comp->ops;
    else b->bops = r->comp->ops;
    if (!bk_model(b)) return false;
    if (!cf_create(r, b->executor ? bk_exec_config(r) : "threads=1", &b->self)) return bk_close(b, false);
    if (b->executor && !bk_attach(b)) return bk_close(b, false);
    loom_error err = {0};
    loom_status st = bk_load(b, &err);
    if (st != LOOM_OK) {
        cf_fail(r, "load() of the tiny dummy model failed: %s", err.message);
        return bk_close(b, false);
    }
    if (nblocks && (st = bk_kv_alloc(b, nblocks, ncpu, &err)) != LOOM_OK) {
        cf_fail(r, "kv_alloc(%d blocks of %d tokens, %d host) failed: %s", nblocks, BK_BS, ncpu, err.message);
        return bk_close(b, false);
    }
    return true;
}

static void bk_fill(bk *b, bk_seq *s, uint64_t seed, int32_t n) {
    memset(s, 0, sizeof *s);
    cf_rng g = cf_rng_make(seed);
    for (int32_t i = 0; i < n && i < 128; i++) s->toks[i] = cf_rng_below(&g, b->vocab);
}

/* --------------------------------------------------------------- checks */

static bool check_load(cf_run *r, const void *arg) {
    bk b;
    if (!bk_open(r, &b, 0, 0)) return false;
    const loom_model_config *c = b.view->config;
    size_t b4 = bk_kv_bytes(&b, 4), b8 = bk_kv_bytes(&b, 8);
    /* At least a byte per K and V element (a backend's; an executor's device
     * may hold a share of the heads). */
    size_t least = b.executor ? 1 : (size_t)c->num_layers * 2 * (size_t)c->num_kv_heads * (size_t)c->head_dim * 4;
    bool ok = (b4 > 0 && b8 > 0) || cf_fail(r, "kv_block_bytes(4) = %zu, (8) = %zu for a model any backend runs", b4, b8);
    if (ok && !(b8 == 2 * b4 && b4 >= least))
        ok = cf_fail(r, "kv_block_bytes: %zu bytes for 4 tokens, %zu for 8 (want linear, >= %zu for 4)", b4, b8, least);
    /* kv_default_dtype (optional, ABI 2.8): a concrete type, the one a layout of LOOM_DTYPE_COUNT gets */
    if (ok && !b.executor && LOOM_HAS_FIELD(b.bops, loom_backend_ops, kv_default_dtype) && b.bops->kv_default_dtype) {
        cf_where(r, "kv_default_dtype()");
        const loom_dtype d = b.bops->kv_default_dtype(b.self);
        if (d != LOOM_DTYPE_F32 && d != LOOM_DTYPE_F16 && d != LOOM_DTYPE_BF16 && d != LOOM_DTYPE_FP8_E4M3)
            ok = cf_fail(r, "kv_default_dtype() = %d: not F32, F16, BF16 or FP8_E4M3", (int)d);
        else if (b.bops->kv_block_bytes(b.self, 4, d) != b4)
            ok = cf_fail(r, "kv_block_bytes(4, kv_default_dtype() = %d) = %zu, but %zu for the default", (int)d,
                         b.bops->kv_block_bytes(b.self, 4, d), b4);
    }
    loom_backend_memory m;
    loom_error err = {0};
    if (ok && bk_memory(&b, &m, &err) != LOOM_OK) ok = cf_fail(r, "memory() failed: %s", err.message);
    if (ok && !(m.free_bytes <= m.total_bytes && m.weight_bytes > 0))
        ok = cf_fail(r, "memory(): total %zu, free %zu, weights %zu (want free <= total, weights > 0)", m.total_bytes,
                     m.free_bytes, m.weight_bytes);
    if (ok) {
        loom_status st = bk_load(&b, &err);
        if (st == LOOM_OK) ok = cf_fail(r, "a second load() on a loaded instance was accepted");
        else cf_note(r, "KV block of 4 tokens: %zu bytes; weights %zu bytes", b4, m.weight_bytes);
    }
    return bk_close(&b, ok);
}

/* A: 13 tokens at once; B: the same in chunks of 5 and 8, the second with
 * C in the batch; then both decode the same token, twice over. */
static bool check_forward(cf_run *r, const void *arg) {
    bk b;
    if (!bk_open(r, &b, BK_NBLOCKS, 0)) return false;
    bk_seq A, B, C;
    bk_fill(&b, &A, r->seed, 14);
    bk_fill(&b, &B, r->seed, 14);
    bk_fill(&b, &C, r->seed + 1, 9);
    size_t V = (size_t)b.vocab;
    float *la = malloc(sizeof(float) * V * 2), *lb = malloc(sizeof(float) * V * 2);
    bool ok = la && lb;
    bk_seq *pa[1] = {&A}, *pb[2] = {&B, &C}, *pab[2] = {&A, &B};
    int32_t n13[1] = {13}, n5[1] = {5}, n8_9[2] = {8, 9}, n1[2] = {1, 1};
    ok = ok && bk_step(&b, pa, n13, 1, la) && bk_step(&b, pb, n5, 1, lb) && bk_step(&b, pb, n8_9, 2, lb);
    ok = ok && bk_close_rows(&b, la, lb, "the last prompt logits, one step vs two chunks batched with another sequence");
    if (ok) { /* decode token 13 for A and B together, then again on the same slots */
        ok = bk_step(&b, pab, n1, 2, la) && bk_close_rows(&b, la, la + V, "a decode step after one vs two prefill chunks");
        A.len--;
        B.len--;
        ok = ok && bk_step(&b, pab, n1, 2, lb) && bk_close_rows(&b, la, lb, "the same decode step run twice");
    }
    if (ok) cf_note(r, "prefill in one step and in chunks agree; decode repeats");
    free(la);
    free(lb);
    return bk_close(&b, ok);
}

/* A valid batch made invalid one field at a time. */
static bool check_bad_batch(cf_run *r, const void *arg) {
    bk b;
    if (!bk_open(r, &b, BK_NBLOCKS, 0)) return false;
    bk_seq A;
    bk_fill(&b, &A, r->seed, 8);
    bk_seq *pa[1] = {&A};
    int32_t n8[1] = {8};
    float *l = malloc(sizeof(float) * (size_t)b.vocab);
    bool ok = l != NULL;
    static const char *const what[] = {"a token id = vocab", "a slot past the pool", "a block id past the pool",
                                       "a logits index past the tokens"};
    for (int k = 0; ok && k < 4; k++) {
        bk_batch x;
        b.next_block = 0;
        A.nb = A.len = 0;
        if (!(ok = bk_build(&b, pa, n8, 1, &x))) break;
        if (k == 0) x.tok[3] = b.vocab;
        if (k == 1) x.slot[2] = (int64_t)b.nblocks * BK_BS;
        if (k == 2) x.bt[1] = b.nblocks;
        if (k == 3) x.lidx[0] = x.b.num_tokens;
        loom_error err = {0};
        loom_status st = bk_forward(&b, &x.b, l, &err);
        if (st == LOOM_OK) ok = cf_fail(r, "forward() ran a batch with %s", what[k]);
        else if (!err.message[0]) ok = cf_fail(r, "forward() refused a batch with %s without a message", what[k]);
    }
    free(l);
    return bk_close(&b, ok);
}

static bool check_kv_nomem(cf_run *r, const void *arg) {
    bk b;
    if (!bk_open(r, &b, 0, 0)) return false;
    loom_error err = {0};
    loom_status st = bk_kv_alloc(&b, 1 << 30, 0, &err);
    bool ok = st == LOOM_ERR_NOMEM || cf_fail(r, "kv_alloc of 2^30 blocks answered %d (%s), not LOOM_ERR_NOMEM",
                                              (int)st, err.message);
    if (ok && !err.message[0]) ok = cf_fail(r, "kv_alloc refused 2^30 blocks without a message");
    return bk_close(&b, ok);
}

/* forward_topk on one batch vs forward() on the same batch (the same K/V
 * is rewritten to the same slots, so the rows are the same rows). */
static bool bk_topk_case(bk *b, bk_seq *const *seqs, const int32_t *n, int32_t k, const float *rows) {
    bk_batch x;
    for (int32_t s = 0; s < 3; s++) seqs[s]->len -= n[s];
    if (!bk_build(b, seqs, n, 3, &x)) return false;
    size_t V = (size_t)b->vocab;
    int32_t ids[3 * LOOM_LOGITS_TOPK_MAX], rid[LOOM_LOGITS_TOPK_MAX];
    float vals[3 * LOOM_LOGITS_TOPK_MAX], lse[3], rval[LOOM_LOGITS_TOPK_MAX], rlse;
    uint8_t want[3] = {0, 1, 0};
    float *full = malloc(sizeof(float) * 3 * V);
    CF_ENSURE(b->r, full, "out of memory");
    for (size_t i = 0; i < 3 * V; i++) full[i] = BK_GUARD;
    loom_logits_topk out = {.struct_size = sizeof out, .k = k, .top_ids = ids, .top_vals = vals, .lse = lse,
                            .want_full = want, .full = full};
    loom_error err = {0};
    loom_status st = bk_topk(b, &x.b, &out, &err);
    bool ok = st == LOOM_OK || cf_fail(b->r, "forward_topk(k %d) failed: %s", k, err.message);
    for (int32_t s = 0; ok && s < 3; s++) {
        const float *row = rows + (size_t)s * V;
        cf_host()->logits_topk_row(row, b->vocab, k, rid, rval, &rlse);
        if (fabsf(lse[s] - rlse) > 1e-3f * (1.0f + fabsf(rlse)))
            ok = cf_fail(b->r, "forward_topk row %d: lse %g, host->logits_topk_row on forward()'s row says %g", s,
                         lse[s], rlse);
        for (int32_t j = 0; ok && j < k; j++) {
            float v = vals[s * k + j];
            int32_t id = ids[s * k + j];
            if (fabsf(v - rval[j]) > 1e-3f * (1.0f + fabsf(rval[j])) || id < 0 || id >= b->vocab ||
                fabsf(row[id] - v) > 1e-3f * (1.0f + fabsf(v)))
                ok = cf_fail(b->r, "forward_topk(k %d) row %d rank %d: (id %d, %g); the reference says (id %d, %g)", k,
                             s, j, id, v, rid[j], rval[j]);
        }
        for (size_t i = 0; ok && i < V; i++) {
            float f = full[(size_t)s * V + i];
            if (want[s] ? fabsf(f - row[i]) > 1e-3f * (1.0f + fabsf(row[i])) : f != BK_GUARD)
                ok = cf_fail(b->r, "forward_topk row %d (want_full %d): full[%zu] = %g, forward() gave %g", s, want[s],
                             i, f, row[i]);
        }
    }
    free(full);
    for (int32_t s = 0; s < 3; s++) seqs[s]->len += n[s];
    return ok;
}

static bool check_topk(cf_run *r, const void *arg) {
    bk b;
    if (!bk_open(r, &b, BK_NBLOCKS, 0)) return false;
    if (!bk_has_topk(&b)) {
        bk_close(&b, true);
        return r->failed ? false : cf_skip(r, "forward_topk() is NULL (optional): the engine samples whole rows");
    }
    bk_seq A, B, C;
    bk_fill(&b, &A, r->seed, 20);
    bk_fill(&b, &B, r->seed + 1, 20);
    bk_fill(&b, &C, r->seed + 2, 20);
    bk_seq *p[3] = {&A, &B, &C};
    int32_t n[3] = {7, 11, 3}, n1[3] = {1, 1, 1};
    float *rows = malloc(sizeof(float) * 3 * (size_t)b.vocab);
    bool ok = rows && bk_step(&b, p, n, 3, rows);
    static const int32_t ks[] = {1, 5, LOOM_LOGITS_TOPK_MAX};
    for (size_t i = 0; ok && i < 3; i++) ok = bk_topk_case(&b, p, n, ks[i], rows);
    ok = ok && bk_step(&b, p, n1, 3, rows) && bk_topk_case(&b, p, n1, 5, rows);
    if (ok) cf_note(r, "prefill and decode rows, k = 1, 5, %d", LOOM_LOGITS_TOPK_MAX);
    free(rows);
    return bk_close(&b, ok);
}

/* kv_read_blocks A's n blocks as block images and kv_write_blocks them into
 * B's; a bad block id and a buffer of the wrong length must be refused. */
static bool bk_images(cf_run *r, bk *b, const int32_t *from, const int32_t *to, int32_t n) {
    size_t per = bk_kv_bytes(b, BK_BS), len = per * (size_t)n;
    char *buf = malloc(len + per);
    loom_error err = {0};
    bool ok = buf != NULL;
    if (ok && b->bops->kv_read_blocks(b->self, from, n, buf, len, &err) != LOOM_OK)
        ok = cf_fail(r, "kv_read_blocks failed: %s", err.message);
    if (ok && b->bops->kv_write_blocks(b->self, to, n, buf, len, &err) != LOOM_OK)
        ok = cf_fail(r, "kv_write_blocks failed: %s", err.message);
    int32_t bad[1] = {BK_NBLOCKS};
    if (ok && b->bops->kv_read_blocks(b->self, bad, 1, buf, per, &err) == LOOM_OK)
        ok = cf_fail(r, "kv_read_blocks accepted block id %d of a pool of %d", BK_NBLOCKS, BK_NBLOCKS);
    if (ok && b->bops->kv_write_blocks(b->self, to, n, buf, len + 1, &err) == LOOM_OK)
        ok = cf_fail(r, "kv_write_blocks accepted a buffer one byte longer than %d block images", n);
    free(buf);
    return ok;
}

/* A prefills 10 tokens; its blocks are moved to fresh ones for B (same
 * tokens) by copy_blocks, by a swap out and in, or (images) as block
 * images read out and written in; both decode token 10: the same logits. */
static bool bk_moved(cf_run *r, bool swap, bool images) {
    bk b;
    if (!bk_open(r, &b, BK_NBLOCKS, swap ? 16 : 0)) return false;
    if (swap && !bk_has_swap(&b)) {
        bk_close(&b, true);
        return r->failed ? false : cf_skip(r, "swap_blocks() is NULL (optional): cache managers preempt by recompute");
    }
    if (images && (b.executor || !LOOM_HAS_FIELD(b.bops, loom_backend_ops, kv_write_blocks) || !b.bops->kv_read_blocks)) {
        bk_close(&b, true);
        return r->failed ? false : cf_skip(r, "kv_read_blocks() / kv_write_blocks() are NULL (optional): no disaggregation");
    }
    bk_seq A, B;
    bk_fill(&b, &A, r->seed, 12);
    bk_fill(&b, &B, r->seed, 12);
    size_t V = (size_t)b.vocab;
    float *l = malloc(sizeof(float) * 2 * V);
    bk_seq *pa[1] = {&A}, *pab[2] = {&A, &B};
    int32_t n10[1] = {10}, n1[2] = {1, 1};
    bool ok = l && bk_step(&b, pa, n10, 1, l);
    int32_t pairs[2 * BK_MAX_SEQ_BLOCKS];
    loom_error err = {0};
    for (int32_t i = 0; ok && i < A.nb; i++) {
        B.blocks[i] = b.next_block++;
        pairs[2 * i] = A.blocks[i];
        pairs[2 * i + 1] = swap ? i : B.blocks[i];
    }
    B.nb = A.nb;
    B.len = 10;
    if (ok && images) ok = bk_images(r, &b, A.blocks, B.blocks, A.nb);
    else if (ok && !swap && bk_copy(&b, pairs, A.nb, &err) != LOOM_OK)
        ok = cf_fail(r, "copy_blocks failed: %s", err.message);
    if (ok && swap) {
        if (bk_swap(&b, LOOM_SWAP_OUT, pairs, A.nb, &err) != LOOM_OK) ok = cf_fail(r, "swap out failed: %s", err.message);
        for (int32_t i = 0; ok && i < A.nb; i++) {
            pairs[2 * i] = i; /* host block i back to B's device block */
            pairs[2 * i + 1] = B.blocks[i];
        }
        if (ok && bk_swap(&b, LOOM_SWAP_IN, pairs, A.nb, &err) != LOOM_OK)
            ok = cf_fail(r, "swap in failed: %s", err.message);
    }
    ok = ok && bk_step(&b, pab, n1, 2, l) &&
         bk_close_rows(&b, l, l + V,
                       images ? "decoding from block images read out and written in"
                       : swap ? "decoding from blocks swapped out and in"
                              : "decoding from copied blocks");
    free(l);
    return bk_close(&b, ok);
}

static bool check_copy(cf_run *r, const void *arg) { return bk_moved(r, false, false); }
static bool check_swap(cf_run *r, const void *arg) { return bk_moved(r, true, false); }
static bool check_images(cf_run *r, const void *arg) { return bk_moved(r, false, true); }

/* The executor's logits vs one inner backend's, step for step. */
static bool check_equivalence(cf_run *r, const void *arg) {
    bk e, one;
    if (!bk_open(r, &e, BK_NBLOCKS, 0)) return false;
    cf_run ir = *r;
    static const loom_conformance_opts inner_opts = {0};
    ir.opts = &inner_opts;
    ir.comp = NULL;
    const loom_component *ic = NULL;
    struct loom_plugin *ip = NULL;
    loom_error err = {0};
    if (cf_registry())
        loom_registry_find(cf_registry(), LOOM_KIND_BACKEND, r->opts->inner_backend ? r->opts->inner_backend : "cpu",
                           &ic, &ip, &err);
    ir.comp = ic;
    if (!ic || !bk_open(&ir, &one, BK_NBLOCKS, 0)) {
        bk_close(&e, false);
        return cf_fail(r, "one inner backend alone: %s", ic ? ir.why : err.message);
    }
    bk_seq A1, B1, A2, B2;
    bk_fill(&e, &A1, r->seed, 30);
    bk_fill(&e, &B1, r->seed + 5, 30);
    A2 = A1;
    B2 = B1;
    size_t V = (size_t)e.vocab;
    float *le = malloc(sizeof(float) * 2 * V), *lo = malloc(sizeof(float) * 2 * V);
    bk_seq *pe[2] = {&A1, &B1}, *po[2] = {&A2, &B2};
    int32_t steps[4][2] = {{9, 13}, {1, 1}, {4, 1}, {1, 1}};
    bool ok = le && lo;
    for (int s = 0; ok && s < 4; s++) {
        ok = bk_step(&e, pe, steps[s], 2, le) && bk_step(&one, po, steps[s], 2, lo);
        ok = ok && bk_close_rows(&e, le, lo, "executor vs one inner backend, row 0") &&
             bk_close_rows(&e, le + V, lo + V, "executor vs one inner backend, row 1");
    }
    if (ok) cf_note(r, "%d inner backends agree with one over 4 steps", e.ninner);
    free(le);
    free(lo);
    bk_destroy(&one);
    loom_model_free(one.model);
    return bk_close(&e, ok);
}

static int bk_checks(cf_check *out, int cap, bool executor) {
    int n = 0;
    n = cf_add(out, n, cap, check_load, NULL, "backend.load");
    n = cf_add(out, n, cap, check_forward, NULL, "backend.forward");
    n = cf_add(out, n, cap, check_bad_batch, NULL, "backend.bad_batch");
    n = cf_add(out, n, cap, check_kv_nomem, NULL, "backend.kv_nomem");
    n = cf_add(out, n, cap, check_topk, NULL, "backend.forward_topk");
    n = cf_add(out, n, cap, check_copy, NULL, "backend.copy_blocks");
    n = cf_add(out, n, cap, check_swap, NULL, "backend.swap_blocks");
    n = cf_add(out, n, cap, check_images, NULL, "backend.kv_block_images");
    if (executor) n = cf_add(out, n, cap, check_equivalence, NULL, "executor.equivalence");
    return n;
}

int cf_checks_backend(const loom_component *c, cf_check *out, int cap) { return bk_checks(out, cap, false); }
int cf_checks_executor(const loom_component *c, cf_check *out, int cap) { return bk_checks(out, cap, true); }
