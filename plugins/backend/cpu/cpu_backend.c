/*
 * plugins/backend/cpu/cpu_backend.c — the "cpu" backend component: a
 * Llama-family forward pass in float32 on the host, built from
 * kernels/cpu and OpenBLAS.
 *
 * This file holds the descriptor and parameter table, instance lifetime,
 * weight loading (every weight is dequantized to float32 through
 * host->convert; Q/K/V and gate/up are fused at load), memory reporting,
 * and the KV pools (device pool and the separate host swap pool — both
 * ordinary host memory here, so swapping is a memcpy). The forward pass is in
 * cpu_forward.c.
 *
 * load_shard() is load() keeping one tensor-parallel rank's part of every
 * weight (cpu_shard_plan says which); see docs/tensor-parallel.md.
 *
 * Quantizers (loom/quant.h): each linear weight (q, k, v, o, gate, up, down,
 * output) gets the bound quantizer's plan. NONE dequantizes to float32 as
 * above; GGUF keeps a zero-copy view of the mmap'd blocks; int8 / fp8 /
 * int4 take quantize()'s tensor (owned by the quantizer, released at
 * destroy). Those run on kernels/cpu/qlinear.h and take no arena space; a
 * tensor-parallel rank keeps a loom_cpu_qweight_slice window of the whole
 * quantized tensor. A format the kernels lack fails load() naming tensor
 * and format. The KV cache may be f32, f16 or FP8 E4M3 (scale 1.0: values
 * saturate at +-448, see docs/quantization.md).
 */
#include "cpu_backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPU_ALIGN 64 /* bytes: cache line, and AVX-512 loads never split */

static const char *const cpu_kv_dtype_choices[] = {"f32", "f16", NULL};
static const char *const cpu_weight_dtype_choices[] = {"f32", NULL};

static const loom_param cpu_params[] = {
    {.key = "threads", .type = LOOM_PARAM_INT, .offset = offsetof(cpu_backend_config, threads),
     .default_value = "0", .min = 0, .max = 1024,
     .doc = "compute threads (attention pool and OpenBLAS); 0 = the pipeline's `threads`"},
    {.key = "kv_dtype", .type = LOOM_PARAM_ENUM, .offset = offsetof(cpu_backend_config, kv_dtype),
     .default_value = "f32", .min = 1, .max = 0, .choices = cpu_kv_dtype_choices,
     .doc = "KV-cache element type when the cache manager leaves it to the backend"},
    {.key = "weight_dtype", .type = LOOM_PARAM_ENUM,
     .offset = offsetof(cpu_backend_config, weight_dtype), .default_value = "f32", .min = 1,
     .max = 0, .choices = cpu_weight_dtype_choices,
     .doc = "type every weight is dequantized to at load"},
    {.key = NULL},
};

/* ---------------------------------------------------------------- helpers */

static size_t cpu_round_floats(size_t n) { return (n + 15) & ~(size_t)15; }

static const char *cpu_qformat_name(loom_qformat f) {
    switch (f) {
    case LOOM_QFMT_NONE: return "none";
    case LOOM_QFMT_INT8_W8A16: return "int8_w8a16";
    case LOOM_QFMT_INT8_W8A8: return "int8_w8a8";
    case LOOM_QFMT_FP8_W8A8: return "fp8_w8a8";
    case LOOM_QFMT_INT4_W4A16: return "int4_w4a16";
    case LOOM_QFMT_GGUF: return "gguf";
    }
    return "unknown";
}

/* KV element type for `dtype` as asked by the cache manager:
 * LOOM_DTYPE_COUNT means "the backend's default" (the kv_dtype param).
 * Returns LOOM_DTYPE_COUNT for a type this backend cannot hold. */
static loom_dtype cpu_kv_resolve(const cpu_backend *b, loom_dtype dtype) {
    if (dtype == LOOM_DTYPE_COUNT) return b->cfg.kv_dtype == 1 ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32;
    /* FP8 E4M3 (a quantizer's kv_cache: fp8): stored with scale 1.0, so K/V
     * elements beyond +-448 saturate; Llama-family K/V stay far below */
    if (dtype == LOOM_DTYPE_F32 || dtype == LOOM_DTYPE_F16 || dtype == LOOM_DTYPE_FP8_E4M3)
        return dtype;
    return LOOM_DTYPE_COUNT;
}

/* Read "<key>: <n> kB" from /proc/meminfo into bytes; false when absent. */
static bool cpu_meminfo(const char *key, size_t *out) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return false;
    char line[256];
    size_t klen = strlen(key);
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (!strncmp(line, key, klen) && line[klen] == ':' &&
            sscanf(line + klen + 1, "%llu", &kb) == 1) {
            *out = (size_t)kb * 1024u;
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

/* --------------------------------------------------------------- lifetime */

static void cpu_destroy(void *self);
static void cpu_release_quant(cpu_backend *b);

static loom_status cpu_create(const loom_host *host, const void *config, void **self,
                              loom_error *err) {
    if (!host || !self || host->struct_size < offsetof(loom_host, num_threads) + sizeof(void *)) {
        if (err) {
            err->code = LOOM_ERR_ABI;
            snprintf(err->message, sizeof err->message,
                     "backend cpu: create() needs a host table of at least %zu bytes (got %u)",
                     offsetof(loom_host, num_threads) + sizeof(void *),
                     host ? host->struct_size : 0u);
        }
        return LOOM_ERR_ABI;
    }
    *self = NULL;
    cpu_backend_config cfg = {.threads = 0, .kv_dtype = 0, .weight_dtype = 0};
    if (config) memcpy(&cfg, config, sizeof cfg);
    if (cfg.threads < 0 || cfg.threads > 1024 || cfg.kv_dtype < 0 || cfg.kv_dtype > 1 ||
        cfg.weight_dtype != 0)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "backend cpu: bad config (threads %lld in [0, 1024], kv_dtype %lld in "
                           "{0 f32, 1 f16}, weight_dtype %lld in {0 f32})",
                           (long long)cfg.threads, (long long)cfg.kv_dtype,
                           (long long)cfg.weight_dtype);

    cpu_backend *b = host->calloc(host->ctx, 1, sizeof *b);
    if (!b)
        return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                           "backend cpu: out of memory for the instance (%zu bytes)", sizeof *b);
    b->host = host;
    b->cfg = cfg;
    int32_t n = cfg.threads > 0 ? (int32_t)cfg.threads : host->num_threads(host->ctx);
    b->threads = n > 0 ? n : 1;
    b->pool = loom_cpu_pool_create(b->threads);
    if (!b->pool) {
        host->free(host->ctx, b);
        return host->error(host->ctx, err, LOOM_ERR_NOMEM,
                           "backend cpu: could not start %d worker threads; lower `threads`",
                           b->threads - 1);
    }
    /* OpenBLAS's pool is process-wide: the last backend created sets it. */
    loom_cpu_blas_threads(b->threads);
    const char *core = loom_cpu_blas_core();
    host->log(host->ctx, LOOM_LOG_INFO, CPU_WHO, "%d threads, OpenBLAS core %s", b->threads,
              core ? core : "?");
#if defined(__x86_64__) && defined(__GNUC__)
    /* OpenBLAS releases older than the CPU (0.3.21 on Zen 5) fall back to
     * AVX2 kernels; its AVX-512 GEMM measured 1.75x faster on such a CPU. */
    if (core && __builtin_cpu_supports("avx512f") && !strstr(core, "Skylake") &&
        !strstr(core, "Cooper") && !strstr(core, "Sapphire") && !getenv("OPENBLAS_CORETYPE"))
        host->log(host->ctx, LOOM_LOG_INFO, CPU_WHO,
                  "OpenBLAS chose its %s kernels on a CPU with AVX-512; OPENBLAS_CORETYPE=SkylakeX "
                  "in the environment may run prefill much faster",
                  core);
#endif
    *self = b;
    return LOOM_OK;
}

static void cpu_destroy(void *self) {
    cpu_backend *b = self;
    if (!b) return;
    const loom_host *h = b->host;
    loom_cpu_pool_destroy(b->pool);
    cpu_release_quant(b);
    h->free(h->ctx, b->scratch);
    h->free(h->ctx, b->lg_local);
    h->free(h->ctx, b->topk_logits);
    h->free(h->ctx, b->kv);
    h->free(h->ctx, b->swap);
    h->free(h->ctx, b->layers);
    h->free(h->ctx, b->inv_freq);
    h->free(h->ctx, b->arena_raw);
    h->free(h->ctx, b);
}

/* ------------------------------------------------------------------- load */

/* Fetch tensor `name` and check it is a host tensor of shape (d0) or
 * (d0, d1) (d1 < 0: 1-D) in a type the host can dequantize. A missing
 * optional tensor gives *out = NULL and LOOM_OK. */
static loom_status cpu_tensor(cpu_backend *b, const loom_model_view *m, const char *name,
                              int64_t d0, int64_t d1, bool required, const loom_tensor **out,
                              loom_error *err) {
    char why[LOOM_ERROR_MSG_MAX - 16];
    loom_status st = b->host->model_tensor(m, name, d0, d1, required, out, why, sizeof why);
    if (st != LOOM_OK) return b->host->error(b->host->ctx, err, st, "backend cpu: %s", why);
    return LOOM_OK;
}

typedef struct cpu_deq_job {
    const loom_host *host;
    const loom_tensor *t;
    size_t row_bytes;   /* source bytes per row                          */
    int64_t cols;       /* floats per source row                         */
    int64_t r0;         /* first source row                              */
    int64_t c0, nc;     /* column slice kept of every row                */
    float *dst;         /* (rows, nc)                                    */
    float *rowbuf;      /* (pool threads, cols) whole rows of a slice, or
                           NULL when whole rows are kept                 */
    atomic_int failed;  /* a row the host could not convert              */
} cpu_deq_job;

static void cpu_deq_rows(void *arg, int64_t b, int64_t e, int worker) {
    cpu_deq_job *j = arg;
    const uint8_t *src = j->t->data;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *row = src + (size_t)(j->r0 + r) * j->row_bytes;
        /* a quantized row decodes only whole, so a column slice goes
         * through this worker's row buffer */
        float *out = j->rowbuf ? j->rowbuf + (int64_t)worker * j->cols : j->dst + r * j->nc;
        if (j->host->convert(LOOM_DTYPE_F32, out, j->t->dtype, row, j->cols) != LOOM_OK) {
            atomic_store(&j->failed, 1);
            continue;
        }
        if (j->rowbuf) memcpy(j->dst + r * j->nc, out + j->c0, (size_t)j->nc * sizeof(float));
    }
}

/* Dequantize rows [r0, r0 + nr) of `t` (checked by cpu_tensor), keeping
 * columns [c0, c0 + nc) of each, into float32 dst (nr, nc); a 1-D tensor is
 * one row. Rows are spread over the pool (host->convert is [any]). A
 * whole tensor is (0, rows, 0, cols); a tensor-parallel shard cuts rows
 * (column-parallel weights) or columns (row-parallel weights). */
static loom_status cpu_dequant_part(cpu_backend *b, const loom_tensor *t, int64_t r0, int64_t nr,
                                    int64_t c0, int64_t nc, float *dst, loom_error *err) {
    const loom_host *h = b->host;
    int64_t cols = t->shape[t->ndim - 1];
    if (nr <= 0 || nc <= 0) return LOOM_OK;
    cpu_deq_job j = {.host = h, .t = t, .row_bytes = h->dtype_row_bytes(t->dtype, cols),
                     .cols = cols, .r0 = r0, .c0 = c0, .nc = nc, .dst = dst};
    atomic_init(&j.failed, 0);
    if (c0 != 0 || nc != cols) {
        size_t n = (size_t)loom_cpu_pool_size(b->pool) * (size_t)cols;
        j.rowbuf = h->alloc(h->ctx, n * sizeof(float));
        if (!j.rowbuf)
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "backend cpu: out of memory for %zu floats of row buffers while "
                            "slicing tensor '%s'",
                            n, t->name ? t->name : "?");
    }
    loom_cpu_pool_for(b->pool, nr, 64, cpu_deq_rows, &j);
    h->free(h->ctx, j.rowbuf);
    if (atomic_load(&j.failed))
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: cannot dequantize tensor '%s' of type %s to f32; the "
                        "host's dequantizer does not handle it",
                        t->name ? t->name : "?", b->host->dtype_name(t->dtype));
    return LOOM_OK;
}

/* All of `t` into dst. */
static loom_status cpu_dequant(cpu_backend *b, const loom_tensor *t, float *dst, loom_error *err) {
    int64_t rows = t->ndim == 1 ? 1 : t->shape[0], cols = t->shape[t->ndim - 1];
    return cpu_dequant_part(b, t, 0, rows, 0, cols, dst, err);
}

/* Ask the quantizer (if any) for a linear weight's plan into *plan (NONE
 * without a quantizer) and check the qlinear kernels run that format. */
static loom_status cpu_plan(cpu_backend *b, const loom_model_view *m, const loom_quant_binding *q,
                            const loom_tensor *t, const char *name, loom_quant_plan *plan,
                            loom_error *err) {
    *plan = (loom_quant_plan){.struct_size = sizeof *plan, .format = LOOM_QFMT_NONE};
    loom_status st = LOOM_OK;
    if (q && q->ops && q->ops->plan && (st = q->ops->plan(q->self, m, t, plan, err)) != LOOM_OK) return st;
    /* a packed AWQ/GPTQ weight has no float data to fall back on */
    if (plan->format == LOOM_QFMT_NONE && b->host->packed_qweight(m, t))
        return b->host->error(
            b->host->ctx, err, LOOM_ERR_INVALID,
            "backend cpu: tensor '%s' is stored only as packed 4-bit AWQ/GPTQ data, but %s; "
            "use quantizer: {plugin: int4, source: awq | gptq | gptq_v2} and keep the tensor out "
            "of quantizer.skip",
            name, q && q->ops ? "the quantizer keeps it unquantized" : "the pipeline has no quantizer");
    if (!q || !q->ops || !q->ops->plan) return LOOM_OK;
    if (plan->format != LOOM_QFMT_NONE && !loom_cpu_qformat_supported(plan->format, t->dtype))
        return b->host->error(
            b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
            "backend cpu: quantizer '%s' planned format %s for tensor '%s' (stored as %s), but "
            "the cpu backend has no kernel for it; skip the tensor in the quantizer or pick "
            "another scheme",
            q->name ? q->name : "?", cpu_qformat_name(plan->format), name,
            b->host->dtype_name(t->dtype));
    if (plan->format != LOOM_QFMT_NONE && plan->format != LOOM_QFMT_GGUF &&
        (!q->ops->quantize || !q->ops->release))
        return b->host->error(b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
                              "backend cpu: quantizer '%s' planned format %s for tensor '%s' "
                              "but has no quantize()/release() to produce it",
                              q->name ? q->name : "?", cpu_qformat_name(plan->format), name);
    return LOOM_OK;
}

/* Build the quantized weight `out` for tensor t (plan format != NONE):
 * a zero-copy view of the GGUF blocks, or the quantizer's tensor (kept in
 * out->q, released at destroy), then this rank's window of it: rows
 * [r0, r0 + nr), columns [c0, c0 + nc). */
static loom_status cpu_load_qlin(cpu_backend *b, const loom_model_view *m, const loom_tensor *t,
                                 const char *name, const loom_quant_plan *plan, int64_t r0,
                                 int64_t nr, int64_t c0, int64_t nc, cpu_lin *out,
                                 loom_error *err) {
    const loom_host *h = b->host;
    const loom_quant_binding *q = &b->quant;
    char why[256];
    loom_cpu_qweight whole;
    if (plan->format == LOOM_QFMT_GGUF) {
        if (!loom_cpu_qweight_gguf(&whole, t, why, sizeof why))
            return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                            "backend cpu: cannot run GGUF tensor '%s' (%s) as stored: %s", name,
                            b->host->dtype_name(t->dtype), why);
    } else {
        out->q = (loom_qtensor){.struct_size = sizeof out->q};
        loom_status st = q->ops->quantize(q->self, m, t, plan, &out->q, err);
        if (st != LOOM_OK) return st;
        out->owned = true; /* released at destroy (or by the load's fail path) */
        if (!loom_cpu_qweight_init(&whole, &out->q, why, sizeof why))
            return h->error(h->ctx, err, LOOM_ERR_FORMAT,
                            "backend cpu: quantizer '%s' gave tensor '%s' (format %s) a layout "
                            "the kernels cannot read: %s",
                            q->name ? q->name : "?", name, cpu_qformat_name(plan->format), why);
    }
    if (r0 == 0 && nr == whole.n && c0 == 0 && nc == whole.k) {
        out->w = whole;
    } else if (!loom_cpu_qweight_slice(&out->w, &whole, r0, nr, c0, nc, why, sizeof why)) {
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: tensor-parallel shard of tensor '%s' (format %s): cannot "
                        "keep rows [%lld, %lld) x columns [%lld, %lld) of its (%lld, %lld): %s; "
                        "column windows of int4 / GGUF weights must start and end on whole "
                        "groups / blocks (pick a group_size dividing %lld, or fewer ranks)",
                        name, cpu_qformat_name(plan->format), (long long)r0, (long long)(r0 + nr),
                        (long long)c0, (long long)(c0 + nc), (long long)whole.n,
                        (long long)whole.k, why, (long long)nc);
    }
    out->quant = true;
    out->f = NULL;
    b->qweight_bytes += loom_cpu_qweight_bytes(&out->w);
    return LOOM_OK;
}

/* Release every quantizer-owned tensor and the kernel scratch (destroy and
 * load's fail path). */
static void cpu_release_quant(cpu_backend *b) {
    const loom_quant_binding *q = &b->quant;
    cpu_lin *lins[CPU_NLIN + 1];
    for (int32_t l = 0; b->layers && l <= b->mc.num_layers; l++) {
        int n = 0;
        if (l < b->mc.num_layers)
            for (int k = 0; k < CPU_NLIN; k++) lins[n++] = &b->layers[l].lin[k];
        else
            lins[n++] = &b->lm_q;
        for (int i = 0; i < n; i++) {
            if (lins[i]->owned && q->ops && q->ops->release) q->ops->release(q->self, &lins[i]->q);
            *lins[i] = (cpu_lin){0};
        }
    }
    loom_cpu_qscratch_destroy(b->qscratch);
    b->qscratch = NULL;
    b->qweight_bytes = 0;
}

/* Carve n floats (rounded to the alignment) from the arena cursor. */
static float *cpu_carve(float **cursor, size_t n) {
    float *p = *cursor;
    *cursor += cpu_round_floats(n);
    return p;
}

/* Which part of the model this rank keeps: the host's shard plan, shared
 * with every backend; without a communicator the whole model (rank 0 of 1). */
typedef loom_shard cpu_shard;

static loom_status cpu_shard_plan(cpu_backend *b, const loom_model_config *c, const loom_comm *comm,
                                  cpu_shard *s, loom_error *err) {
    const loom_host *h = b->host;
    char why[LOOM_ERROR_MSG_MAX - 64];
    loom_status st = h->shard_plan(c, comm ? comm->rank : 0, comm ? comm->size : 1, s, why, sizeof why);
    if (st != LOOM_OK) return h->error(h->ctx, err, st, "backend cpu: load_shard(): %s", why);
    return LOOM_OK;
}

/* load() and load_shard(): `comm` NULL keeps the whole model. */
static loom_status cpu_load_impl(cpu_backend *b, const loom_model_view *m,
                                 const loom_quant_binding *quant, const loom_comm *comm,
                                 loom_error *err) {
    const loom_host *h = b->host;
    loom_status st = LOOM_OK;
    char name[96];
    char why[384];
    if ((st = h->check_load(b->loaded, m, comm, why, sizeof why)) != LOOM_OK)
        return h->error(h->ctx, err, st, "backend cpu: %s", why);
    b->mc = *m->config;
    const loom_model_config *c = &b->mc;
    if (c->head_dim % 2 != 0 || c->head_dim > LOOM_CPU_MAX_HEAD_DIM)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: model '%s' has head_dim %d; this backend runs even head_dim up "
                        "to %d",
                        c->name, c->head_dim, LOOM_CPU_MAX_HEAD_DIM);
    cpu_shard sh = {0};
    if ((st = cpu_shard_plan(b, c, comm, &sh, err)) != LOOM_OK) return st;
    /* whole-model sizes (the tensors' shapes) ... */
    const int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
    const int64_t D = c->head_dim, QD = (int64_t)c->num_heads * D, KVD = (int64_t)c->num_kv_heads * D;
    const int32_t L = c->num_layers;
    /* ... and this rank's (all of it without a communicator) */
    const int64_t Il = sh.inter, Vl = sh.vocab_rows;
    b->q_dim = sh.heads * c->head_dim;
    b->kv_dim = sh.kv_heads * c->head_dim;
    b->qkv_rows = b->q_dim + 2 * b->kv_dim;
    const int64_t QKVl = b->qkv_rows, QDl = b->q_dim, KVDl = b->kv_dim;
    const int64_t q0 = (int64_t)sh.head0 * D, k0 = (int64_t)sh.kv0 * D, i0 = sh.inter0;

    /* --- check every tensor (and the quantizer's plan) before allocating.
     * plans: (L, 7) linear weights in lin[] order, then output.weight */
    const loom_tensor *t_embed, *t_onorm, *t_out, *t_probe;
    if ((st = cpu_tensor(b, m, "token_embd.weight", V, H, true, &t_embed, err)) ||
        (st = cpu_tensor(b, m, "output_norm.weight", H, -1, true, &t_onorm, err)) ||
        (st = cpu_tensor(b, m, "output.weight", V, H, false, &t_out, err)))
        return st;
    if (!t_out && !c->tie_embeddings && (!comm || comm->rank == 0))
        h->log(h->ctx, LOOM_LOG_WARN, CPU_WHO,
               "model '%s' has no output.weight and tie_embeddings is false; using the token "
               "embeddings as the LM head",
               c->name);
    if ((st = cpu_tensor(b, m, "blk.0.attn_q.bias", QD, -1, false, &t_probe, err))) return st;
    bool bias = c->qkv_bias || t_probe != NULL;
    loom_quant_plan *plans = h->calloc(h->ctx, (size_t)L * CPU_NLIN + 1, sizeof *plans);
    if (!plans)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: out of memory for %d layers' quantization plans", L);
    loom_quant_plan *plan_out = &plans[(size_t)L * CPU_NLIN];
    *plan_out = (loom_quant_plan){.struct_size = sizeof *plan_out, .format = LOOM_QFMT_NONE};
    if (quant && quant->ops) b->quant = *quant; /* release() needs it on every path */
    if (t_out && (st = cpu_plan(b, m, quant, t_out, "output.weight", plan_out, err))) goto fail;

    static const char *const lin[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                      "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t lin_shape[7][2] = {{QD, H}, {KVD, H}, {KVD, H}, {H, QD},
                                     {I, H},  {I, H},   {H, I}};
    /* this rank's part of each, in floats when kept float32 */
    const int64_t lin_floats[7] = {QDl * H, KVDl * H, KVDl * H, H * QDl, Il * H, Il * H, H * Il};
    bool any_quant = t_out && plan_out->format != LOOM_QFMT_NONE;
    size_t floats = cpu_round_floats((size_t)(Vl * H)) *
                        (t_out && plan_out->format == LOOM_QFMT_NONE ? 2 : 1) +
                    cpu_round_floats((size_t)H);
    for (int32_t l = 0; l < L; l++) {
        const loom_tensor *t;
        loom_quant_plan *pl = &plans[(size_t)l * CPU_NLIN];
        int64_t grp[4] = {0, 0, 0, 0}; /* float32 floats of qkv, o, gate/up, down */
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, lin[k]);
            if ((st = cpu_tensor(b, m, name, lin_shape[k][0], lin_shape[k][1], true, &t, err)) ||
                (st = cpu_plan(b, m, quant, t, name, &pl[k], err)))
                goto fail;
            if (pl[k].format != LOOM_QFMT_NONE) any_quant = true;
            else grp[k < 3 ? 0 : k == 3 ? 1 : k < 6 ? 2 : 3] += lin_floats[k];
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = cpu_tensor(b, m, name, H, -1, true, &t, err))) goto fail;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = cpu_tensor(b, m, name, H, -1, true, &t, err))) goto fail;
        for (int k = 0; bias && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, lin[k]);
            if ((st = cpu_tensor(b, m, name, k == 0 ? QD : KVD, -1, true, &t, err))) goto fail;
        }
        /* carved in this order below; quantized weights take no arena space */
        floats += 2 * cpu_round_floats((size_t)H) + (bias ? cpu_round_floats((size_t)QKVl) : 0);
        for (int g = 0; g < 4; g++) floats += cpu_round_floats((size_t)grp[g]);
    }

    /* --- one arena for all (this rank's) float32 weights, carved below */
    size_t arena_bytes = floats * sizeof(float);
    b->weight_bytes = arena_bytes;
    b->arena_raw = h->alloc(h->ctx, arena_bytes + CPU_ALIGN);
    b->layers = h->calloc(h->ctx, (size_t)L, sizeof *b->layers);
    b->inv_freq = h->calloc(h->ctx, (size_t)c->head_dim / 2, sizeof *b->inv_freq);
    b->qscratch = any_quant ? loom_cpu_qscratch_create() : NULL;
    if (!b->arena_raw || !b->layers || !b->inv_freq || (any_quant && !b->qscratch)) {
        st = h->error(h->ctx, err, LOOM_ERR_NOMEM,
                      "backend cpu: out of memory for %.1f MiB of float32 weights of '%s'; free "
                      "host RAM or use a smaller model",
                      (double)arena_bytes / (1 << 20), c->name);
        goto fail;
    }
    b->arena = (float *)(((uintptr_t)b->arena_raw + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1));

    /* vocabulary-parallel: this rank's rows of the embedding and LM head */
    float *cur = b->arena;
    float *embed = cpu_carve(&cur, (size_t)(Vl * H));
    float *onorm = cpu_carve(&cur, (size_t)H);
    if ((st = cpu_dequant_part(b, t_embed, sh.vocab_lo, Vl, 0, H, embed, err)) ||
        (st = cpu_dequant(b, t_onorm, onorm, err)))
        goto fail;
    b->embed = embed;
    b->out_norm = onorm;
    b->lm_head = embed;
    if (t_out && plan_out->format == LOOM_QFMT_NONE) {
        float *out = cpu_carve(&cur, (size_t)(Vl * H));
        if ((st = cpu_dequant_part(b, t_out, sh.vocab_lo, Vl, 0, H, out, err))) goto fail;
        b->lm_head = out;
    } else if (t_out) {
        /* a rank past the end of the vocabulary keeps no rows (Vl = 0) */
        if (Vl > 0 && (st = cpu_load_qlin(b, m, t_out, "output.weight", plan_out, sh.vocab_lo, Vl,
                                          0, H, &b->lm_q, err)))
            goto fail;
        b->lm_q.quant = true;
        b->lm_head = NULL;
    }
    for (int32_t l = 0; l < L; l++) {
        cpu_layer *ly = &b->layers[l];
        const loom_quant_plan *pl = &plans[(size_t)l * CPU_NLIN];
        /* float32 parts of each group, consecutive in lin[] order */
        int64_t grp[4] = {0, 0, 0, 0};
        for (int k = 0; k < 7; k++)
            if (pl[k].format == LOOM_QFMT_NONE) grp[k < 3 ? 0 : k == 3 ? 1 : k < 6 ? 2 : 3] += lin_floats[k];
        float *an = cpu_carve(&cur, (size_t)H), *qkv = cpu_carve(&cur, (size_t)grp[0]);
        float *bq = bias ? cpu_carve(&cur, (size_t)QKVl) : NULL;
        float *wo = cpu_carve(&cur, (size_t)grp[1]), *fn = cpu_carve(&cur, (size_t)H);
        float *gu = cpu_carve(&cur, (size_t)grp[2]), *wd = cpu_carve(&cur, (size_t)grp[3]);
        float *gbase[4] = {qkv, wo, gu, wd};
        /* in the order of lin[]: the part kept as {first row, rows, first
         * column, columns}. Q, K, V rows of the fused matrix, then gate and
         * up rows of the fused FFN input, are column-parallel (a slice of
         * rows); O and down are row-parallel (a slice of their input
         * columns, summed over ranks in forward) */
        const int64_t part[7][4] = {{q0, QDl, 0, H}, {k0, KVDl, 0, H}, {k0, KVDl, 0, H},
                                    {0, H, q0, QDl}, {i0, Il, 0, H},   {i0, Il, 0, H},
                                    {0, H, i0, Il}};
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, lin[k]);
            const loom_tensor *t = m->get(m->ctx, name);
            int g = k < 3 ? 0 : k == 3 ? 1 : k < 6 ? 2 : 3;
            if (pl[k].format != LOOM_QFMT_NONE) {
                if ((st = cpu_load_qlin(b, m, t, name, &pl[k], part[k][0], part[k][1],
                                        part[k][2], part[k][3], &ly->lin[k], err)))
                    goto fail;
                continue;
            }
            float *dst = gbase[g];
            gbase[g] += lin_floats[k];
            ly->lin[k].f = dst;
            if ((st = cpu_dequant_part(b, t, part[k][0], part[k][1], part[k][2], part[k][3], dst,
                                       err)))
                goto fail;
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = cpu_dequant(b, m->get(m->ctx, name), an, err))) goto fail;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = cpu_dequant(b, m->get(m->ctx, name), fn, err))) goto fail;
        for (int k = 0; bias && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, lin[k]);
            float *bd = bq + (k == 0 ? 0 : QDl + (k - 1) * KVDl);
            if ((st = cpu_dequant_part(b, m->get(m->ctx, name), 0, 1, k == 0 ? q0 : k0,
                                       k == 0 ? QDl : KVDl, bd, err)))
                goto fail;
        }
        /* the fused float matrices exist only when every part is float */
        bool fq = !ly->lin[0].quant && !ly->lin[1].quant && !ly->lin[2].quant;
        bool fg = !ly->lin[4].quant && !ly->lin[5].quant;
        ly->attn_norm = an;
        ly->wqkv = fq ? qkv : NULL;
        ly->bqkv = bq;
        ly->wo = ly->lin[3].quant ? NULL : wo;
        ly->ffn_norm = fn;
        ly->wgu = fg ? gu : NULL;
        ly->wdown = ly->lin[6].quant ? NULL : wd;
    }
    b->weight_bytes = arena_bytes + b->qweight_bytes;

    loom_cpu_rope_inv_freq(b->inv_freq, c->head_dim, c->rope_theta, c->rope_scaling,
                           c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                           c->rope_original_context);
    /* from here on mc is the model as this rank runs it */
    b->mc.num_heads = sh.heads;
    b->mc.num_kv_heads = sh.kv_heads;
    b->mc.intermediate_size = sh.inter;
    b->vocab_lo = sh.vocab_lo;
    b->vocab_rows = sh.vocab_rows;
    b->vocab_pad = sh.vocab_pad;
    b->sharded = comm != NULL;
    if (comm) b->comm = *comm;
    b->loaded = true;
    if (h->metric_set) h->metric_set(h->ctx, "backend.cpu.weight_bytes", (double)b->weight_bytes);
    if (comm)
        h->log(h->ctx, LOOM_LOG_INFO, CPU_WHO,
               "rank %d/%d of '%s': heads %d..%d, KV heads %d..%d, FFN %lld..%lld, vocab "
               "%d..%d, %.1f MiB weights (%.1f MiB quantized)",
               sh.rank, sh.size, c->name, sh.head0, sh.head0 + sh.heads - 1, sh.kv0,
               sh.kv0 + sh.kv_heads - 1, (long long)i0, (long long)(i0 + Il - 1), sh.vocab_lo,
               sh.vocab_lo + sh.vocab_rows - 1, (double)b->weight_bytes / (1 << 20),
               (double)b->qweight_bytes / (1 << 20));
    else
        h->log(h->ctx, LOOM_LOG_INFO, CPU_WHO, "loaded '%s': %d layers, %.1f MiB weights (%.1f MiB quantized%s%s)%s",
               c->name, L, (double)b->weight_bytes / (1 << 20),
               (double)b->qweight_bytes / (1 << 20), b->quant.ops ? " by " : "",
               b->quant.ops && b->quant.name ? b->quant.name : "", t_out ? "" : " (tied LM head)");
    h->free(h->ctx, plans);
    return LOOM_OK;

fail:
    cpu_release_quant(b);
    b->quant = (loom_quant_binding){0};
    h->free(h->ctx, plans);
    h->free(h->ctx, b->arena_raw);
    h->free(h->ctx, b->layers);
    h->free(h->ctx, b->inv_freq);
    b->arena_raw = NULL;
    b->arena = NULL;
    b->layers = NULL;
    b->inv_freq = NULL;
    b->weight_bytes = 0;
    return st;
}

static loom_status cpu_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                            loom_error *err) {
    return cpu_load_impl(self, m, quant, NULL, err);
}

/* Tensor parallelism: keep rank comm->rank's shard and sum partial results
 * through `comm` in forward() (cpu_forward.c). The communicator must work
 * on host memory (the executor's threads communicator). */
static loom_status cpu_load_shard(void *self, const loom_model_view *m,
                                  const loom_quant_binding *quant, const loom_comm *comm,
                                  loom_error *err) {
    cpu_backend *b = self;
    if (!comm)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cpu: load_shard() needs a communicator");
    return cpu_load_impl(b, m, quant, comm, err);
}

/* ----------------------------------------------------------- memory / KV */

static size_t cpu_kv_block_bytes(void *self, int32_t block_size, loom_dtype dtype) {
    cpu_backend *b = self;
    loom_dtype dt = cpu_kv_resolve(b, dtype);
    if (!b->loaded || block_size <= 0 || dt == LOOM_DTYPE_COUNT) return 0;
    size_t per_pool = (size_t)b->mc.num_kv_heads * (size_t)block_size * (size_t)b->mc.head_dim *
                      b->host->dtype_block_bytes(dt);
    return per_pool * 2 * (size_t)b->mc.num_layers;
}

static loom_status cpu_memory(void *self, loom_backend_memory *out, loom_error *err) {
    cpu_backend *b = self;
    if (!out)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cpu: memory() needs an output struct");
    size_t total = 0, avail = 0;
    if (!cpu_meminfo("MemTotal", &total)) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        total = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    }
    if (!cpu_meminfo("MemAvailable", &avail)) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
    }
    *out = (loom_backend_memory){.struct_size = sizeof *out, .total_bytes = total,
                                 .free_bytes = avail, .weight_bytes = b->weight_bytes};
    return LOOM_OK;
}

static loom_status cpu_kv_alloc(void *self, const loom_kv_layout *layout, loom_error *err) {
    cpu_backend *b = self;
    const loom_host *h = b->host;
    if (!b->loaded)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cpu: kv_alloc() before load()");
    if (b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: kv_alloc() called twice; KV pools are allocated once");
    if (!layout || layout->block_size <= 0 || layout->num_blocks <= 0 ||
        layout->num_cpu_blocks < 0)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: bad KV layout (block_size %d, num_blocks %d, "
                        "num_cpu_blocks %d): need block_size > 0, num_blocks > 0, cpu blocks >= 0",
                        layout ? layout->block_size : 0, layout ? layout->num_blocks : 0,
                        layout ? layout->num_cpu_blocks : 0);
    loom_dtype dt = cpu_kv_resolve(b, layout->dtype);
    if (dt == LOOM_DTYPE_COUNT)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: KV cache dtype %s is not supported; the cpu backend holds "
                        "f32, f16 or fp8_e4m3",
                        b->host->dtype_name(layout->dtype));
    size_t block = (size_t)b->mc.num_kv_heads * (size_t)layout->block_size *
                   (size_t)b->mc.head_dim * b->host->dtype_block_bytes(dt);
    size_t pools = 2 * (size_t)b->mc.num_layers;
    double want = (double)block * (double)pools * ((double)layout->num_blocks + layout->num_cpu_blocks);
    size_t avail = 0;
    bool have_avail = cpu_meminfo("MemAvailable", &avail);
    if (want > (double)SIZE_MAX / 2 || (have_avail && want > (double)avail))
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: KV pools of %d + %d blocks x %zu bytes = %.0f bytes "
                        "(%.1f MiB) exceed available host memory (%.1f MiB); lower num_blocks / "
                        "cpu swap blocks or the cache's memory fraction",
                        layout->num_blocks, layout->num_cpu_blocks, block * pools, want,
                        want / (1 << 20), (double)avail / (1 << 20));
    /* calloc: pages are committed lazily, as blocks are first written */
    size_t dev_bytes = block * pools * (size_t)layout->num_blocks;
    b->kv = h->calloc(h->ctx, 1, dev_bytes);
    if (!b->kv)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: could not allocate %zu bytes (%.1f MiB) for %d KV blocks "
                        "(%zu bytes each across %d layers); lower num_blocks",
                        dev_bytes, (double)dev_bytes / (1 << 20), layout->num_blocks,
                        block * pools, b->mc.num_layers);
    if (layout->num_cpu_blocks > 0) {
        size_t swap_bytes = block * pools * (size_t)layout->num_cpu_blocks;
        b->swap = h->calloc(h->ctx, 1, swap_bytes);
        if (!b->swap) {
            h->free(h->ctx, b->kv);
            b->kv = NULL;
            return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                            "backend cpu: could not allocate %.1f MiB for %d swap blocks; lower "
                            "the number of cpu (swap) blocks",
                            (double)swap_bytes / (1 << 20), layout->num_cpu_blocks);
        }
    }
    b->kv_layout = *layout;
    b->kv_layout.dtype = dt;
    b->kv_block_bytes = block;
    b->kv_ready = true;
    return LOOM_OK;
}

/* Copy block src of pool (src_swap) to block dst of pool (dst_swap), K and V
 * of every layer. */
static void cpu_copy_block(cpu_backend *b, int32_t src, bool src_swap, int32_t dst,
                           bool dst_swap) {
    for (int32_t l = 0; l < b->mc.num_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            memcpy(cpu_pool_base(b, l, kv, dst_swap) + (size_t)dst * b->kv_block_bytes,
                   cpu_pool_base(b, l, kv, src_swap) + (size_t)src * b->kv_block_bytes,
                   b->kv_block_bytes);
}

static loom_status cpu_check_pairs(cpu_backend *b, const char *op, const int32_t *pairs, int32_t n,
                                   int32_t src_n, const char *src_what, int32_t dst_n,
                                   const char *dst_what, loom_error *err) {
    const loom_host *h = b->host;
    if (!b->kv_ready)
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cpu: %s() before kv_alloc()", op);
    if (n < 0 || (n > 0 && !pairs))
        return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cpu: %s(): bad pair list (n %d)",
                        op, n);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = pairs[2 * i], d = pairs[2 * i + 1];
        if (s < 0 || s >= src_n || d < 0 || d >= dst_n)
            return h->error(h->ctx, err, LOOM_ERR_INVALID,
                            "backend cpu: %s() pair %d is {%d, %d}: source must be a %s block in "
                            "[0, %d), destination a %s block in [0, %d)",
                            op, i, s, d, src_what, src_n, dst_what, dst_n);
    }
    return LOOM_OK;
}

static loom_status cpu_copy_blocks(void *self, const int32_t *pairs, int32_t n, loom_error *err) {
    cpu_backend *b = self;
    int32_t nb = b->kv_layout.num_blocks;
    loom_status st = cpu_check_pairs(b, "copy_blocks", pairs, n, nb, "device", nb, "device", err);
    if (st) return st;
    for (int32_t i = 0; i < n; i++)
        if (pairs[2 * i] != pairs[2 * i + 1])
            cpu_copy_block(b, pairs[2 * i], false, pairs[2 * i + 1], false);
    return LOOM_OK;
}

static loom_status cpu_swap_blocks(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                                   loom_error *err) {
    cpu_backend *b = self;
    int32_t nd = b->kv_layout.num_blocks, nh = b->kv_layout.num_cpu_blocks;
    if (dir != LOOM_SWAP_OUT && dir != LOOM_SWAP_IN)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cpu: swap_blocks(): direction %d is neither OUT nor IN",
                              (int)dir);
    bool out = dir == LOOM_SWAP_OUT;
    loom_status st = cpu_check_pairs(b, "swap_blocks", pairs, n, out ? nd : nh,
                                     out ? "device" : "host", out ? nh : nd,
                                     out ? "host" : "device", err);
    if (st) return st;
    for (int32_t i = 0; i < n; i++) cpu_copy_block(b, pairs[2 * i], !out, pairs[2 * i + 1], out);
    return LOOM_OK;
}

/* ------------------------------------------------------------- descriptor */

static const loom_backend_ops cpu_ops = {
    .struct_size = sizeof(loom_backend_ops),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .load = cpu_load,
    .kv_block_bytes = cpu_kv_block_bytes,
    .memory = cpu_memory,
    .kv_alloc = cpu_kv_alloc,
    .forward = cpu_backend_forward,
    .forward_topk = cpu_backend_forward_topk,
    .copy_blocks = cpu_copy_blocks,
    .swap_blocks = cpu_swap_blocks,
    .load_shard = cpu_load_shard,
    .set_observer = cpu_backend_set_observer,
};

static const loom_component cpu_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_BACKEND,
    .name = "cpu",
    .summary = "Llama-family forward on the host: float32 weights, OpenBLAS GEMMs, paged KV",
    .ops = &cpu_ops,
    .params = cpu_params,
    .config_size = sizeof(cpu_backend_config),
}};

static const loom_plugin_desc cpu_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-backend-cpu",
    .version = "0.1.0",
    .num_components = 1,
    .components = cpu_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &cpu_desc; }
