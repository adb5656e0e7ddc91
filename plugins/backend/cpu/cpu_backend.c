/*
 * plugins/backend/cpu/cpu_backend.c — the "cpu" backend component: a
 * Llama-family (and Gemma 3) forward pass in float32 on the host, built
 * from kernels/cpu and OpenBLAS.
 *
 * This file holds the descriptor and parameter table, instance lifetime,
 * weight loading (weights are dequantized to float32 through host->convert,
 * except GGUF blocks kept as stored, below; Q/K/V and gate/up are fused at
 * load), memory reporting,
 * and the KV pools (device pool and the separate host swap pool — both
 * ordinary host memory here, so swapping is a memcpy). The forward pass is in
 * cpu_forward.c.
 *
 * Which tensors there are, which part of each a tensor-parallel rank keeps
 * (load_shard(); docs/tensor-parallel.md) and the quantizer's plan for
 * each is the weight walk's (plugins/backend/common/weight_walk.h), shared
 * with the cuda backend; this file dequantizes and carves what it lists.
 *
 * GGUF blocks (weight_dtype: gguf, the default): with no quantizer bound,
 * every linear weight stored as q4_0 / q4_1 / q5_0 / q8_0 / q4_k / q5_k / q6_k
 * blocks, and a tied LM head stored so, stays as stored (a zero-copy view of
 * the mmap) and runs on the kernels' integer q8 path, as llama.cpp runs a
 * GGUF file; f16 / bf16 linear weights (host tensors of any format) stay 16-bit
 * likewise and are converted to float as the kernels read them, which halves
 * their memory and the bytes a decode step streams against float32;
 * the backend plans them itself through a quantizer binding of its own
 * (cpu_keep_ops). weight_dtype: f32 dequantizes everything instead.
 * cpu_isa names the instruction set of those kernels (auto: the best the
 * CPU has); it is process-wide (q8dot.h), set at create.
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
#include "q8dot.h"
#include "kv_groups.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPU_ALIGN 64 /* bytes: cache line, and AVX-512 loads never split */

static const char *const cpu_kv_dtype_choices[] = {"f32", "f16", NULL};
static const char *const cpu_weight_dtype_choices[] = {"f32", "gguf", NULL};
enum { CPU_WEIGHTS_F32 = 0, CPU_WEIGHTS_GGUF = 1 };
/* the names loom_cpu_q8_force_isa takes, after "auto" */
static const char *const cpu_isa_choices[] = {"auto", "avx512vnni", "avx512", "avx2", "portable",
                                              NULL};
enum { CPU_ISA_AUTO = 0, CPU_ISA_LAST = 4 };
static const char *const cpu_moe_dispatch_choices[] = {"all_reduce", "all_to_all", NULL};

static const loom_param cpu_params[] = {
    {.key = "threads", .type = LOOM_PARAM_INT, .offset = offsetof(cpu_backend_config, threads),
     .default_value = "0", .min = 0, .max = 1024,
     .doc = "compute threads (attention pool and OpenBLAS); 0 = the pipeline's `threads`"},
    {.key = "kv_dtype", .type = LOOM_PARAM_ENUM, .offset = offsetof(cpu_backend_config, kv_dtype),
     .default_value = "f16", .min = 1, .max = 0, .choices = cpu_kv_dtype_choices,
     .doc = "KV-cache element type when the cache manager leaves it to the backend: f16 (as "
            "llama.cpp) halves the bytes a decode step reads from the cache and doubles the tokens a "
            "budget holds (|x| > 65504 saturates); f32 keeps keys and values exact (float32 comparisons with "
            "transformers)"},
    {.key = "weight_dtype", .type = LOOM_PARAM_ENUM,
     .offset = offsetof(cpu_backend_config, weight_dtype), .default_value = "gguf", .min = 1,
     .max = 0, .choices = cpu_weight_dtype_choices,
     .doc = "without a quantizer: gguf keeps the linear weights (and a tied LM head) as stored: "
            "GGUF q4_0/q4_1/q5_0/q8_0/q4_k/q5_k/q6_k blocks on 8-bit integer kernels, f16/bf16 "
            "converted to float as they are read; f32 dequantizes every weight at load"},
    {.key = "cpu_isa", .type = LOOM_PARAM_ENUM, .offset = offsetof(cpu_backend_config, cpu_isa),
     .default_value = "auto", .min = 1, .max = 0, .choices = cpu_isa_choices,
     .doc = "instruction set of the GGUF integer kernels and the f16/bf16 row kernels: auto = the best this CPU has "
            "(avx512vnni, avx512, avx2, portable); naming one forces it (a CPU without it fails "
            "create), e.g. portable to test or time the plain C path; process-wide"},
    {.key = "moe_dispatch", .type = LOOM_PARAM_ENUM, .offset = offsetof(cpu_backend_config, moe_dispatch),
     .default_value = "all_reduce", .min = 1, .max = 0, .choices = cpu_moe_dispatch_choices,
     .doc = "expert parallelism under the tp executor (MoE models): all_reduce = every rank routes every "
            "token through its own experts and the block's all-reduce combines; all_to_all = each rank "
            "routes its slice of the tokens, sends each (token, expert) row to the expert's owner and "
            "back (the communicator's all_to_allv), then the slices are all-gathered (with a shared "
            "expert: summed by the block's all-reduce); no effect on one backend or a dense model"},
    {.key = NULL},
};

/* ---------------------------------------------------------------- helpers */

static size_t cpu_round_floats(size_t n) { return (n + 15) & ~(size_t)15; }

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
    cpu_backend_config cfg = {.threads = 0, .kv_dtype = 1, .weight_dtype = CPU_WEIGHTS_GGUF,
                              .cpu_isa = CPU_ISA_AUTO};
    if (config) memcpy(&cfg, config, sizeof cfg);
    if (cfg.threads < 0 || cfg.threads > 1024 || cfg.kv_dtype < 0 || cfg.kv_dtype > 1 ||
        cfg.weight_dtype < CPU_WEIGHTS_F32 || cfg.weight_dtype > CPU_WEIGHTS_GGUF ||
        cfg.cpu_isa < CPU_ISA_AUTO || cfg.cpu_isa > CPU_ISA_LAST || cfg.moe_dispatch < CPU_MOE_ALL_REDUCE ||
        cfg.moe_dispatch > CPU_MOE_ALL_TO_ALL)
        return host->error(host->ctx, err, LOOM_ERR_INVALID,
                           "backend cpu: bad config (threads %lld in [0, 1024], kv_dtype %lld in "
                           "{0 f32, 1 f16}, weight_dtype %lld in {0 f32, 1 gguf}, cpu_isa %lld in "
                           "[0, %d], moe_dispatch %lld in {0 all_reduce, 1 all_to_all})",
                           (long long)cfg.threads, (long long)cfg.kv_dtype,
                           (long long)cfg.weight_dtype, (long long)cfg.cpu_isa, CPU_ISA_LAST,
                           (long long)cfg.moe_dispatch);
    /* process-wide, before any product runs (q8dot.h) */
    if (!loom_cpu_q8_force_isa(cfg.cpu_isa == CPU_ISA_AUTO ? NULL : cpu_isa_choices[cfg.cpu_isa]))
        return host->error(host->ctx, err, LOOM_ERR_UNSUPPORTED,
                           "backend cpu: cpu_isa %s: this CPU lacks it (the best it has is %s)",
                           cpu_isa_choices[cfg.cpu_isa], loom_cpu_q8_best_isa());

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
    h->free(h->ctx, b->attn_part);
    h->free(h->ctx, b->moe_scratch);
    h->free(h->ctx, b->moe_ep);
    h->free(h->ctx, b->lg_local);
    h->free(h->ctx, b->topk_logits);
    h->free(h->ctx, b->kv);
    h->free(h->ctx, b->swap);
    h->free(h->ctx, b->kv_slot);
    h->free(h->ctx, b->kv_group);
    h->free(h->ctx, b->layers);
    h->free(h->ctx, b->inv_freq);
    h->free(h->ctx, b->inv_freq_local);
    h->free(h->ctx, b->arena_raw);
    h->free(h->ctx, b);
}

/* ------------------------------------------------------------------- load */

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

/* Dequantize rows [r0, r0 + nr) of `t` (checked by the weight walk), keeping
 * columns [c0, c0 + nc) of each, into float32 dst (nr, nc); a 1-D tensor is
 * one row. Rows are spread over the pool (host->convert is [any]). A
 * whole tensor is (0, rows, 0, cols); a tensor-parallel shard cuts rows
 * (column-parallel weights) or columns (row-parallel weights). */
static loom_status cpu_dequant_part(cpu_backend *b, const loom_tensor *t, int64_t r0, int64_t nr,
                                    int64_t c0, int64_t nc, float *dst, loom_error *err) {
    const loom_host *h = b->host;
    if (nr <= 0 || nc <= 0) return LOOM_OK; /* also an absent part: a MoE layer's dense FFN */
    int64_t cols = t->shape[t->ndim - 1];
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

/* The window p of its tensor (plugins/backend/common/weight_walk.h) into
 * float32 dst (p->nr, p->nc). */
loom_status cpu_dequant_win(cpu_backend *b, const loom_ww_part *p, float *dst, loom_error *err) {
    return cpu_dequant_part(b, p->t, p->r0, p->nr, p->c0, p->nc, dst, err);
}

/* The weight walk's hook: a quantized plan needs a qlinear kernel for the
 * format and the tensor's type. */
static loom_status cpu_runnable(void *ctx, const loom_quant_binding *q, const loom_tensor *t,
                                const char *name, const loom_quant_plan *plan, loom_error *err) {
    cpu_backend *b = ctx;
    if (loom_cpu_qformat_supported(plan->format, t->dtype)) return LOOM_OK;
    return b->host->error(
        b->host->ctx, err, LOOM_ERR_UNSUPPORTED,
        "backend cpu: quantizer '%s' planned format %s for tensor '%s' (stored as %s), but "
        "the cpu backend has no kernel for it; skip the tensor in the quantizer or pick "
        "another scheme",
        q->name ? q->name : "?", loom_ww_qformat_name(plan->format), name,
        b->host->dtype_name(t->dtype));
}

/* weight_dtype gguf without a quantizer: the backend's own plan keeps the
 * linear weights its kernels read as stored. */
static loom_status cpu_keep_plan(void *self, const loom_model_view *m, const loom_tensor *w,
                                 loom_quant_plan *out, loom_error *err) {
    (void)self, (void)m, (void)err;
    if (w->device == LOOM_DEVICE_HOST && loom_cpu_qformat_supported(LOOM_QFMT_GGUF, w->dtype))
        out->format = LOOM_QFMT_GGUF;
    return LOOM_OK;
}

static const loom_quant_ops cpu_keep_ops = {.struct_size = sizeof(loom_quant_ops),
                                            .plan = cpu_keep_plan};

/* Build the quantized weight `out` for p's tensor (plan format != NONE):
 * a zero-copy view of the GGUF blocks, or the quantizer's tensor (kept in
 * out->q, released at destroy), then this rank's window of it: rows
 * [r0, r0 + nr), columns [c0, c0 + nc). */
loom_status cpu_load_qlin(cpu_backend *b, const loom_model_view *m, const loom_ww_part *p,
                          const loom_quant_plan *plan, cpu_lin *out, loom_error *err) {
    const loom_host *h = b->host;
    const loom_tensor *t = p->t;
    const char *name = p->name;
    const int64_t r0 = p->r0, nr = p->nr, c0 = p->c0, nc = p->nc;
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
                            q->name ? q->name : "?", name, loom_ww_qformat_name(plan->format), why);
    }
    if (r0 == 0 && nr == whole.n && c0 == 0 && nc == whole.k) {
        out->w = whole;
    } else if (!loom_cpu_qweight_slice(&out->w, &whole, r0, nr, c0, nc, why, sizeof why)) {
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: tensor-parallel shard of tensor '%s' (format %s): cannot "
                        "keep rows [%lld, %lld) x columns [%lld, %lld) of its (%lld, %lld): %s; "
                        "column windows of int4 / GGUF weights must start and end on whole "
                        "groups / blocks (pick a group_size dividing %lld, or fewer ranks)",
                        name, loom_ww_qformat_name(plan->format), (long long)r0, (long long)(r0 + nr),
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
    cpu_moe_release(b);
    loom_cpu_qscratch_destroy(b->qscratch);
    b->qscratch = NULL;
    b->qweight_bytes = 0;
}

/* Carve n floats (rounded to the alignment) from the arena cursor. */
float *cpu_carve(float **cursor, size_t n) {
    float *p = *cursor;
    *cursor += cpu_round_floats(n);
    return p;
}

/* Does the LM head of a tied model run on the embedding's GGUF blocks? */
static bool cpu_keeps_tied_head(const cpu_backend *b, const loom_ww *w) {
    const loom_tensor *t = w->embed.t;
    return !w->out.t && b->quant.ops == &cpu_keep_ops && t->device == LOOM_DEVICE_HOST &&
           loom_cpu_qformat_supported(LOOM_QFMT_GGUF, t->dtype);
}

/* Are the embedding's rows decoded from its GGUF blocks at each lookup
 * instead of kept as float32? On the first stage, when the tied LM head
 * runs on those blocks and the model is not tensor-sharded: the float copy
 * of a 262144-token vocabulary (Gemma 3) would be 640 MiB more, for one
 * row a token. */
static bool cpu_embeds_from_blocks(const cpu_backend *b, const loom_ww *w) {
    return b->first_stage && cpu_keeps_tied_head(b, w) && w->shard.size == 1;
}

/* Does this instance keep the float32 embedding? The first stage looks
 * tokens up in it (unless it decodes them from the blocks); the last stage
 * reads it as a tied LM head, unless that head runs on the embedding's GGUF
 * blocks. A middle stage keeps none. */
static bool cpu_keeps_embed(const cpu_backend *b, const loom_ww *w) {
    return (b->first_stage && !cpu_embeds_from_blocks(b, w)) ||
           (b->last_stage && !w->out.t && !cpu_keeps_tied_head(b, w));
}

/* Floats of the vocabulary tensors this instance keeps (cpu_load_vocab):
 * the embedding, and on the last stage the output norm and an untied float
 * LM head. */
static size_t cpu_vocab_floats(const cpu_backend *b, const loom_ww *w) {
    const size_t H = (size_t)w->hidden, VH = (size_t)w->shard.vocab_rows * H;
    size_t n = cpu_keeps_embed(b, w) ? cpu_round_floats(VH) : 0;
    if (b->last_stage)
        n += cpu_round_floats(H) + (w->out.t && w->out_plan.format == LOOM_QFMT_NONE ? cpu_round_floats(VH) : 0);
    return n;
}

/* Floats of layer ly's group g kept as float32 (its parts planned NONE). */
static int64_t cpu_group_floats(const loom_ww_layer *ly, int g) {
    int64_t n = 0;
    for (int k = 0; k < LOOM_WW_NLIN; k++)
        if (ly->lin[k].group == g && ly->lin[k].plan.format == LOOM_QFMT_NONE)
            n += ly->lin[k].w.nr * ly->lin[k].w.nc;
    return n;
}

/* The float32 arena (this rank's weights; quantized ones take none),
 * carved by cpu_load_vocab and cpu_load_layer in their order; the layer
 * array, the RoPE table and, for quantized weights, the kernels' scratch. */
static loom_status cpu_alloc_weights(cpu_backend *b, const loom_ww *w, loom_error *err) {
    const loom_host *h = b->host;
    const size_t H = (size_t)w->hidden;
    const bool any_quant = loom_ww_any_quant(w) || cpu_keeps_tied_head(b, w);
    size_t floats = cpu_vocab_floats(b, w);
    const loom_model_config *c = &b->mc;
    const size_t gemma = (c->qk_norm ? 2 * cpu_round_floats((size_t)c->head_dim) : 0) +
                         (c->post_norms ? 2 * cpu_round_floats(H) : 0);
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++) {
        floats += 2 * cpu_round_floats(H) + (w->bias ? cpu_round_floats((size_t)w->qkv_rows) : 0) + gemma;
        for (int g = 0; g < LOOM_WW_NGROUPS; g++)
            floats += cpu_round_floats((size_t)cpu_group_floats(&w->layer[l], g));
        floats += cpu_moe_floats(b, &w->layer[l]);
    }
    size_t arena_bytes = floats * sizeof(float);
    b->weight_bytes = arena_bytes;
    b->arena_raw = h->alloc(h->ctx, arena_bytes + CPU_ALIGN);
    b->layers = h->calloc(h->ctx, (size_t)w->layers, sizeof *b->layers);
    b->inv_freq = h->calloc(h->ctx, (size_t)b->mc.head_dim / 2, sizeof *b->inv_freq);
    b->inv_freq_local = h->calloc(h->ctx, (size_t)b->mc.head_dim / 2, sizeof *b->inv_freq_local);
    b->qscratch = any_quant ? loom_cpu_qscratch_create() : NULL;
    if (!b->arena_raw || !b->layers || !b->inv_freq || !b->inv_freq_local || (any_quant && !b->qscratch))
        return h->error(h->ctx, err, LOOM_ERR_NOMEM,
                        "backend cpu: out of memory for %.1f MiB of float32 weights of '%s'; free "
                        "host RAM or use a smaller model",
                        (double)arena_bytes / (1 << 20), b->mc.name);
    b->arena = (float *)(((uintptr_t)b->arena_raw + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1));
    return LOOM_OK;
}

/* This rank's vocabulary rows of the embedding and the LM head (float32,
 * or the quantizer's format; tied: the embedding), and the output norm —
 * of a pipeline stage, only what it runs (cpu_keeps_embed; the head and
 * norm on the last stage). */
static loom_status cpu_load_vocab(cpu_backend *b, const loom_model_view *m, const loom_ww *w,
                                  float **cur, loom_error *err) {
    const size_t VH = (size_t)w->shard.vocab_rows * (size_t)w->hidden;
    const bool from_blocks = cpu_embeds_from_blocks(b, w);
    loom_status st;
    float *embed = cpu_keeps_embed(b, w) ? cpu_carve(cur, VH) : NULL;
    if (embed && (st = cpu_dequant_win(b, &w->embed, embed, err))) return st;
    b->embed = embed;
    b->embed_blocks = from_blocks ? w->embed.t : NULL;
    if (!b->last_stage) return LOOM_OK;
    float *onorm = cpu_carve(cur, (size_t)w->hidden);
    if ((st = cpu_dequant_win(b, &w->out_norm, onorm, err))) return st;
    b->out_norm = onorm;
    b->lm_head = embed;
    if (w->out.t && w->out_plan.format == LOOM_QFMT_NONE) {
        float *out = cpu_carve(cur, VH);
        if ((st = cpu_dequant_win(b, &w->out, out, err))) return st;
        b->lm_head = out;
    } else if (w->out.t) {
        /* a rank past the end of the vocabulary keeps no rows */
        if (w->out.nr > 0 && (st = cpu_load_qlin(b, m, &w->out, &w->out_plan, &b->lm_q, err)))
            return st;
        b->lm_q.quant = true;
        b->lm_head = NULL;
    } else if (cpu_keeps_tied_head(b, w)) {
        /* tied: the LM head reads the embedding's blocks; the lookup keeps
         * its float rows (one row a token) */
        const loom_quant_plan plan = {.struct_size = sizeof plan, .format = LOOM_QFMT_GGUF};
        if (w->embed.nr > 0 && (st = cpu_load_qlin(b, m, &w->embed, &plan, &b->lm_q, err)))
            return st;
        b->lm_q.quant = true;
        b->lm_head = NULL;
    }
    return LOOM_OK;
}

/* Gemma 3's QK-norm and post-norm weights of a layer, when the walk has them. */
static loom_status cpu_load_layer_norms(cpu_layer *ly, const loom_ww_layer *wl, cpu_backend *b, float **cur,
                                        loom_error *err) {
    const loom_ww_part *src[4] = {&wl->q_norm, &wl->k_norm, &wl->post_attn_norm, &wl->post_ffn_norm};
    const float **dst[4] = {&ly->q_norm, &ly->k_norm, &ly->post_attn_norm, &ly->post_ffn_norm};
    loom_status st;
    for (int i = 0; i < 4; i++) {
        *dst[i] = NULL;
        if (!src[i]->t) continue;
        float *p = cpu_carve(cur, (size_t)src[i]->nc);
        if ((st = cpu_dequant_win(b, src[i], p, err))) return st;
        *dst[i] = p;
    }
    return LOOM_OK;
}

/* Layer l: the float parts of each group carved consecutively in the
 * walk's order (so an all-float Q|K|V or gate|up is one fused matrix), the
 * quantized parts as views, the norms and the biases. */
static loom_status cpu_load_layer(cpu_backend *b, const loom_model_view *m, const loom_ww *w,
                                  int32_t l, float **cur, loom_error *err) {
    cpu_layer *ly = &b->layers[l];
    const loom_ww_layer *wl = &w->layer[l];
    const size_t H = (size_t)w->hidden;
    loom_status st;
    int64_t grp[LOOM_WW_NGROUPS];
    for (int g = 0; g < LOOM_WW_NGROUPS; g++) grp[g] = cpu_group_floats(wl, g);
    float *an = cpu_carve(cur, H), *qkv = cpu_carve(cur, (size_t)grp[LOOM_WW_G_QKV]);
    float *bq = w->bias ? cpu_carve(cur, (size_t)w->qkv_rows) : NULL;
    float *wo = cpu_carve(cur, (size_t)grp[LOOM_WW_G_O]), *fn = cpu_carve(cur, H);
    float *gu = cpu_carve(cur, (size_t)grp[LOOM_WW_G_GU]), *wd = cpu_carve(cur, (size_t)grp[LOOM_WW_G_DOWN]);
    float *gbase[LOOM_WW_NGROUPS] = {qkv, wo, gu, wd};
    for (int k = 0; k < LOOM_WW_NLIN; k++) {
        const loom_ww_lin *li = &wl->lin[k];
        if (li->plan.format != LOOM_QFMT_NONE) {
            if ((st = cpu_load_qlin(b, m, &li->w, &li->plan, &ly->lin[k], err))) return st;
            continue;
        }
        float *dst = gbase[li->group];
        gbase[li->group] += li->w.nr * li->w.nc;
        ly->lin[k].f = dst;
        if ((st = cpu_dequant_win(b, &li->w, dst, err))) return st;
    }
    if ((st = cpu_dequant_win(b, &wl->attn_norm, an, err)) ||
        (st = cpu_dequant_win(b, &wl->ffn_norm, fn, err)))
        return st;
    for (int k = 0; w->bias && k < 3; k++) {
        float *bd = bq + (k == 0 ? 0 : w->q_rows + (k - 1) * w->kv_rows);
        if ((st = cpu_dequant_win(b, &wl->bias[k], bd, err))) return st;
    }
    if ((st = cpu_load_layer_norms(ly, wl, b, cur, err))) return st;
    if (wl->router.t && (st = cpu_moe_load(b, m, wl, ly, cur, err))) return st;
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
    return LOOM_OK;
}

/* After the weights: the RoPE table, the model as this rank runs it, the
 * log line. */
static void cpu_load_done(cpu_backend *b, const loom_ww *w, const loom_comm *comm) {
    const loom_host *h = b->host;
    const loom_model_config *c = &b->mc;
    const loom_shard *sh = &w->shard;
    loom_cpu_rope_inv_freq(b->inv_freq, c->head_dim, c->rope_theta, c->rope_scaling,
                           c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                           c->rope_original_context);
    /* sliding-window layers: their own base, unscaled (Gemma 3) */
    if (c->sliding_window > 0)
        loom_cpu_rope_inv_freq(b->inv_freq_local, c->head_dim, c->rope_theta_local,
                               LOOM_ROPE_SCALING_NONE, 1, 1, 1, 1);
    /* from here on mc is the model as this rank runs it */
    b->mc.num_heads = sh->heads;
    b->mc.num_kv_heads = sh->kv_heads;
    b->mc.intermediate_size = sh->inter;
    b->vocab_lo = sh->vocab_lo;
    b->vocab_rows = sh->vocab_rows;
    b->vocab_pad = sh->vocab_pad;
    b->sharded = comm != NULL;
    if (comm) b->comm = *comm;
    b->loaded = true;
    if (b->stage.struct_size)
        h->log(h->ctx, LOOM_LOG_INFO, CPU_WHO, "stage %d/%d of '%s': layers %d..%d%s%s", b->stage.index,
               b->stage.count, c->name, b->layer0, b->layer0 + b->nlayers - 1,
               b->first_stage ? ", embedding" : "", b->last_stage ? ", LM head" : "");
    if (h->metric_set) h->metric_set(h->ctx, "backend.cpu.weight_bytes", (double)b->weight_bytes);
    if (comm)
        h->log(h->ctx, LOOM_LOG_INFO, CPU_WHO,
               "rank %d/%d of '%s': heads %d..%d, KV heads %d..%d, %s %lld..%lld, vocab "
               "%d..%d, %.1f MiB weights (%.1f MiB as stored or quantized)",
               sh->rank, sh->size, c->name, sh->head0, sh->head0 + sh->heads - 1, sh->kv0,
               sh->kv0 + sh->kv_heads - 1, w->experts ? "experts" : "FFN",
               (long long)(w->experts ? w->expert0 : w->i0),
               (long long)(w->experts ? w->expert0 + w->experts - 1 : w->i0 + w->inter_rows - 1),
               sh->vocab_lo, sh->vocab_lo + sh->vocab_rows - 1, (double)b->weight_bytes / (1 << 20),
               (double)b->qweight_bytes / (1 << 20));
    else
        h->log(h->ctx, LOOM_LOG_INFO, CPU_WHO, "loaded '%s': %d layers, %.1f MiB weights (%.1f MiB as stored or quantized%s%s)%s",
               c->name, w->layers, (double)b->weight_bytes / (1 << 20),
               (double)b->qweight_bytes / (1 << 20), b->quant.ops ? " by " : "",
               b->quant.ops && b->quant.name ? b->quant.name : "", w->out.t ? "" : " (tied LM head)");
}

/* The layers this instance holds: `stage`'s (checked by cpu_load_stage),
 * or all of them. */
static void cpu_set_layers(cpu_backend *b, const loom_stage *stage) {
    loom_ww_copy_stage(&b->stage, stage);
    b->layer0 = stage ? stage->first_layer : 0;
    b->nlayers = stage ? stage->num_layers : b->mc.num_layers;
    b->first_stage = !stage || stage->index == 0;
    b->last_stage = !stage || stage->index == stage->count - 1;
}

/* load(), load_shard() and load_stage(): `comm` NULL keeps the whole width,
 * `stage` NULL every layer. What to load is the weight walk's
 * (plugins/backend/common/weight_walk.h). */
static loom_status cpu_load_impl(cpu_backend *b, const loom_model_view *m,
                                 const loom_quant_binding *quant, const loom_comm *comm,
                                 const loom_stage *stage, loom_error *err) {
    const loom_host *h = b->host;
    loom_status st = LOOM_OK;
    loom_ww w;
    if ((st = loom_ww_begin(&w, h, "backend cpu", CPU_WHO, b->loaded, m, comm, err)) != LOOM_OK)
        return st;
    b->mc = *m->config;
    const loom_model_config *c = &b->mc;
    if ((st = cpu_moe_check_comm(b, c, comm, err)) != LOOM_OK) return st;
    if (c->head_dim % 2 != 0 || c->head_dim > LOOM_CPU_MAX_HEAD_DIM)
        return h->error(h->ctx, err, LOOM_ERR_UNSUPPORTED,
                        "backend cpu: model '%s' has head_dim %d; this backend runs even head_dim up "
                        "to %d",
                        c->name, c->head_dim, LOOM_CPU_MAX_HEAD_DIM);
    b->q_dim = w.q_rows;
    b->kv_dim = w.kv_rows;
    b->qkv_rows = w.qkv_rows;
    const loom_quant_binding keep = {.struct_size = sizeof keep, .ops = &cpu_keep_ops,
                                     .name = "the cpu backend (weight_dtype: gguf)"};
    if ((!quant || !quant->ops) && b->cfg.weight_dtype == CPU_WEIGHTS_GGUF && !m->packing)
        quant = &keep;
    if (quant && quant->ops) b->quant = *quant; /* release() needs it on every path */
    const loom_ww_hooks hooks = {.ctx = b, .runnable = cpu_runnable};
    cpu_set_layers(b, stage);
    if ((st = loom_ww_collect(&w, m, quant, &hooks, err)) || (st = cpu_alloc_weights(b, &w, err)))
        goto fail;
    float *cur = b->arena;
    if ((st = cpu_load_vocab(b, m, &w, &cur, err))) goto fail;
    for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++)
        if ((st = cpu_load_layer(b, m, &w, l, &cur, err))) goto fail;
    b->weight_bytes += b->qweight_bytes;
    cpu_load_done(b, &w, comm);
    loom_ww_free(&w);
    return LOOM_OK;

fail:
    loom_ww_free(&w);
    cpu_release_quant(b);
    b->quant = (loom_quant_binding){0};
    h->free(h->ctx, b->arena_raw);
    h->free(h->ctx, b->layers);
    h->free(h->ctx, b->inv_freq);
    h->free(h->ctx, b->inv_freq_local);
    b->arena_raw = NULL;
    b->arena = NULL;
    b->layers = NULL;
    b->inv_freq = NULL;
    b->inv_freq_local = NULL;
    b->weight_bytes = 0;
    return st;
}

static loom_status cpu_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                            loom_error *err) {
    return cpu_load_impl(self, m, quant, NULL, NULL, err);
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
    return cpu_load_impl(b, m, quant, comm, NULL, err);
}

/* Pipeline parallelism: keep `stage`'s layers (and with `comm`, this
 * rank's shard of them); forward() then moves the residual stream through
 * the stage's links (cpu_forward.c). */
static loom_status cpu_load_stage(void *self, const loom_model_view *m,
                                  const loom_quant_binding *quant, const loom_stage *stage,
                                  const loom_comm *comm, loom_error *err) {
    cpu_backend *b = self;
    loom_status st = loom_ww_check_stage(b->host, "backend cpu", m, stage, err);
    if (st != LOOM_OK) return st;
    return cpu_load_impl(b, m, quant, comm, stage, err);
}

/* ----------------------------------------------------------- memory / KV */

static size_t cpu_kv_block_bytes(void *self, int32_t block_size, loom_dtype dtype) {
    cpu_backend *b = self;
    loom_dtype dt = cpu_kv_resolve(b, dtype);
    if (!b->loaded || block_size <= 0 || dt == LOOM_DTYPE_COUNT) return 0;
    size_t per_pool = (size_t)b->mc.num_kv_heads * (size_t)block_size * (size_t)b->mc.head_dim *
                      b->host->dtype_block_bytes(dt);
    return per_pool * 2 * (size_t)b->nlayers;
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

static loom_status cpu_kv_groups(void *self, loom_kv_groups *out, loom_error *err) {
    cpu_backend *b = self;
    if (!b->loaded || !out)
        return b->host->error(b->host->ctx, err, LOOM_ERR_INVALID,
                              "backend cpu: kv_groups() %s", !out ? "without an output" : "before load()");
    loom_kv_groups_plan(&b->mc, b->layer0, b->nlayers, out, NULL, NULL);
    return LOOM_OK;
}

/* Each held layer's pool pair and block-table group for `layout`: its own
 * pair and group 0, or with groups (layout num_groups > 1) the plan's. */
static loom_status cpu_kv_slots(cpu_backend *b, const loom_kv_layout *layout, loom_error *err) {
    const loom_host *h = b->host;
    h->free(h->ctx, b->kv_slot);
    h->free(h->ctx, b->kv_group);
    b->kv_slot = h->alloc(h->ctx, (size_t)b->nlayers * sizeof *b->kv_slot);
    b->kv_group = h->alloc(h->ctx, (size_t)b->nlayers * sizeof *b->kv_group);
    if (!b->kv_slot || !b->kv_group)
        return h->error(h->ctx, err, LOOM_ERR_NOMEM, "backend cpu: out of memory for the KV slot map");
    int32_t groups = LOOM_HAS_FIELD(layout, loom_kv_layout, num_groups) ? layout->num_groups : 0;
    b->kv_pools = b->nlayers;
    for (int32_t i = 0; i < b->nlayers; i++) b->kv_slot[i] = i, b->kv_group[i] = 0;
    if (groups <= 1) return LOOM_OK;
    loom_kv_groups plan = {.struct_size = sizeof plan};
    loom_kv_groups_plan(&b->mc, b->layer0, b->nlayers, &plan, b->kv_group, b->kv_slot);
    if (plan.num_groups != groups)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: the KV layout has %d block-table groups; this model's layers "
                        "make %d (kv_groups())",
                        groups, plan.num_groups);
    b->kv_pools = plan.layers_per_block;
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
    loom_status st = cpu_kv_slots(b, layout, err);
    if (st != LOOM_OK) return st;
    size_t pools = 2 * (size_t)b->kv_pools;
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
                        block * pools, b->kv_pools);
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
    b->kv_layout.num_groups = LOOM_HAS_FIELD(layout, loom_kv_layout, num_groups) ? layout->num_groups : 0;
    b->kv_block_bytes = block;
    b->kv_ready = true;
    return LOOM_OK;
}

/* Copy block src of pool (src_swap) to block dst of pool (dst_swap), K and V
 * of every pool pair (with groups: the layers of the block's group). */
static void cpu_copy_block(cpu_backend *b, int32_t src, bool src_swap, int32_t dst,
                           bool dst_swap) {
    for (int32_t slot = 0; slot < b->kv_pools; slot++)
        for (int kv = 0; kv < 2; kv++)
            memcpy(cpu_slot_base(b, slot, kv, dst_swap) + (size_t)dst * b->kv_block_bytes,
                   cpu_slot_base(b, slot, kv, src_swap) + (size_t)src * b->kv_block_bytes,
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

/* The block-image transfer of loom/backend.h: n device blocks to or from
 * one host buffer, each block every held layer's K then V. */
static loom_status cpu_kv_image(cpu_backend *b, const char *op, const int32_t *blocks, int32_t n, size_t len,
                                loom_error *err) {
    const loom_host *h = b->host;
    if (!b->kv_ready) return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cpu: %s() before kv_alloc()", op);
    size_t per = b->kv_block_bytes * 2 * (size_t)b->nlayers;
    if (n < 0 || (n > 0 && !blocks) || len != per * (size_t)n)
        return h->error(h->ctx, err, LOOM_ERR_INVALID,
                        "backend cpu: %s(): %d blocks need a buffer of exactly %zu bytes (%zu per block), got %zu",
                        op, n, per * (size_t)(n > 0 ? n : 0), per, len);
    for (int32_t i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= b->kv_layout.num_blocks)
            return h->error(h->ctx, err, LOOM_ERR_INVALID, "backend cpu: %s(): block %d is id %d, outside [0, %d)",
                            op, i, blocks[i], b->kv_layout.num_blocks);
    return LOOM_OK;
}

static loom_status cpu_kv_read_blocks(void *self, const int32_t *blocks, int32_t n, void *buf, size_t len,
                                      loom_error *err) {
    cpu_backend *b = self;
    loom_status st = cpu_kv_image(b, "kv_read_blocks", blocks, n, len, err);
    if (st) return st;
    char *dst = buf;
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++)
            for (int kv = 0; kv < 2; kv++, dst += b->kv_block_bytes)
                memcpy(dst, cpu_pool_base(b, l, kv, false) + (size_t)blocks[i] * b->kv_block_bytes,
                       b->kv_block_bytes);
    return LOOM_OK;
}

static loom_status cpu_kv_write_blocks(void *self, const int32_t *blocks, int32_t n, const void *buf, size_t len,
                                       loom_error *err) {
    cpu_backend *b = self;
    loom_status st = cpu_kv_image(b, "kv_write_blocks", blocks, n, len, err);
    if (st) return st;
    const char *src = buf;
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = b->layer0; l < b->layer0 + b->nlayers; l++)
            for (int kv = 0; kv < 2; kv++, src += b->kv_block_bytes)
                memcpy(cpu_pool_base(b, l, kv, false) + (size_t)blocks[i] * b->kv_block_bytes, src,
                       b->kv_block_bytes);
    return LOOM_OK;
}

/* the kv_dtype parameter's type: what a layout of LOOM_DTYPE_COUNT gets */
static loom_dtype cpu_kv_default_dtype(void *self) { return cpu_kv_resolve(self, LOOM_DTYPE_COUNT); }

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
    .kv_groups = cpu_kv_groups,
    .load_shard = cpu_load_shard,
    .set_observer = cpu_backend_set_observer,
    .load_stage = cpu_load_stage,
    .kv_read_blocks = cpu_kv_read_blocks,
    .kv_write_blocks = cpu_kv_write_blocks,
    .kv_default_dtype = cpu_kv_default_dtype,
};

static const loom_component cpu_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = LOOM_KIND_BACKEND,
    .name = "cpu",
    .summary = "Llama-family and Gemma 3 forward on the host: float32 or GGUF weights, paged KV",
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
