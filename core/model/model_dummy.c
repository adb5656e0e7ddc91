/*
 * core/model/model_dummy.c — random weights of a named model shape, for
 * tests and performance work without downloading anything.
 *
 * Values are a pure function of (shape, dtype, seed): every tensor is cut
 * into fixed chunks of CHUNK elements and chunk c of tensor t draws from a
 * splitmix64 stream seeded by (seed, t, c), so the result does not depend on
 * the number of threads. Matrices are uniform in [-1/sqrt(fan_in),
 * +1/sqrt(fan_in)) (activations keep their scale through a layer), norm
 * weights are 1 + U(-0.05, 0.05), biases U(-0.02, 0.02). All tensors live in
 * one anonymous mapping filled by a pool of pthreads; llama3-8b in bf16 is
 * 16 GB and takes seconds, not minutes.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "formats/half.h"
#include "model/model_internal.h"
#include "util/util.h"

#define CHUNK (1 << 20)     /* elements per work unit / RNG stream   */
#define ALIGN 256           /* bytes; start of every tensor           */
#define MAX_THREADS 64

typedef struct shape_def {
    const char *name;
    loom_arch arch;
    int32_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, ctx;
    float theta, eps;
    bool tie;
    int32_t bos, eos;
    const char *label;
    /* mixture of experts (loom/model.h); zero: dense */
    int32_t experts, experts_used, expert_inter, shared_inter;
    bool norm_topk;
} shape_def;

static const shape_def k_shapes[] = {
    {"llama3-8b", LOOM_ARCH_LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 8192, 500000.0f, 1e-5f, false, 128000,
     128001, "dummy Llama-3-8B", 0, 0, 0, 0, false},
    {"llama2-7b", LOOM_ARCH_LLAMA, 32000, 4096, 11008, 32, 32, 32, 128, 4096, 10000.0f, 1e-5f, false, 1, 2,
     "dummy Llama-2-7B", 0, 0, 0, 0, false},
    {"smollm2-135m", LOOM_ARCH_LLAMA, 49152, 576, 1536, 30, 9, 3, 64, 8192, 100000.0f, 1e-5f, true, 1, 2,
     "dummy SmolLM2-135M", 0, 0, 0, 0, false},
    {"qwen2-0.5b", LOOM_ARCH_QWEN2, 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0f, 1e-6f, true, 151643,
     151645, "dummy Qwen2-0.5B", 0, 0, 0, 0, false},
    {"tiny", LOOM_ARCH_LLAMA, 256, 64, 128, 2, 4, 2, 16, 256, 10000.0f, 1e-5f, false, 1, 2, "dummy tiny", 0, 0, 0, 0,
     false},
    {"mixtral-8x7b", LOOM_ARCH_MIXTRAL, 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0f, 1e-5f, false, 1, 2,
     "dummy Mixtral-8x7B", 8, 2, 14336, 0, true},
    {"qwen3-30b-a3b", LOOM_ARCH_QWEN3_MOE, 151936, 2048, 6144, 48, 32, 4, 128, 40960, 1000000.0f, 1e-6f, false,
     151643, 151645, "dummy Qwen3-30B-A3B", 128, 8, 768, 0, true},
    {"qwen3-moe-tiny", LOOM_ARCH_QWEN3_MOE, 256, 64, 128, 2, 4, 2, 16, 256, 10000.0f, 1e-6f, true, 1, 2,
     "dummy tiny Qwen3-MoE", 8, 2, 32, 0, true},
    {"qwen2-moe-tiny", LOOM_ARCH_QWEN2_MOE, 256, 64, 128, 2, 4, 2, 16, 256, 10000.0f, 1e-6f, false, 1, 2,
     "dummy tiny Qwen2-MoE (shared expert)", 8, 2, 32, 64, false},
    {"gemma3-270m", LOOM_ARCH_GEMMA3, 262144, 640, 2048, 18, 4, 1, 256, 32768, 1000000.0f, 1e-6f, true, 2, 1,
     "dummy Gemma-3-270M", 0, 0, 0, 0, false},
    {"qwen3-0.6b", LOOM_ARCH_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1000000.0f, 1e-6f, true, 151643,
     151645, "dummy Qwen3-0.6B", 0, 0, 0, 0, false},
};

const char *const *loom_model_dummy_shapes(void) {
    static const char *const names[] = {"llama3-8b",      "llama2-7b",      "smollm2-135m", "qwen2-0.5b",
                                        "tiny",           "mixtral-8x7b",   "qwen3-30b-a3b", "qwen3-moe-tiny",
                                        "qwen2-moe-tiny", "gemma3-270m",    "qwen3-0.6b",   NULL};
    return names;
}

typedef enum { INIT_MATRIX, INIT_NORM, INIT_BIAS } init_kind;

typedef struct dtensor {
    loom_tensor *t;          /* filled after all tensors are added        */
    int32_t index;           /* position among the model's tensors        */
    int64_t numel;
    size_t offset;           /* in the arena                              */
    init_kind kind;
    float scale;             /* half-width of the uniform distribution    */
} dtensor;

typedef struct fill_job {
    uint8_t *arena;
    dtensor *ts;
    int32_t n_ts;
    int64_t *unit_start;     /* prefix sums: first unit of each tensor (n_ts+1) */
    int64_t n_units;
    loom_dtype dtype;
    uint64_t seed;
    atomic_llong next;       /* next unit to take                         */
    atomic_llong done;       /* units finished                            */
} fill_job;

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_unit(fill_job *j, int64_t u) {
    /* find the tensor owning unit u (binary search over prefix sums) */
    int32_t lo = 0, hi = j->n_ts - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (j->unit_start[mid] <= u) lo = mid;
        else hi = mid - 1;
    }
    const dtensor *d = &j->ts[lo];
    int64_t c = u - j->unit_start[lo];
    int64_t begin = c * CHUNK, end = begin + CHUNK < d->numel ? begin + CHUNK : d->numel;
    uint64_t s = j->seed ^ 0x6c6f6f6d64756d6dull; /* "loomdumm" */
    splitmix64(&s);
    s ^= (uint64_t)d->index * 0xd1b54a32d192ed03ull;
    splitmix64(&s);
    s ^= (uint64_t)c * 0x8cb92ba72f3d8dd7ull;
    float center = d->kind == INIT_NORM ? 1.0f : 0.0f;
    float mul = d->scale * 0x1p-31f; /* int32 -> [-scale, scale) */
    uint8_t *base = j->arena + d->offset;
    /* one splitmix64 draw gives two values; the loop is specialised per dtype
     * so the compiler keeps it branch-free (this is the whole cost of a load) */
#define DRAW2(v0, v1)                                                                  \
    uint64_t r_ = splitmix64(&s);                                                      \
    float v0 = center + (float)(int32_t)(uint32_t)r_ * mul;                            \
    float v1 = center + (float)(int32_t)(uint32_t)(r_ >> 32) * mul
    int64_t i = begin, stop = begin + ((end - begin) & ~(int64_t)1);
    if (j->dtype == LOOM_DTYPE_F32) {
        float *o = (float *)base;
        for (; i < stop; i += 2) {
            DRAW2(a, b);
            o[i] = a;
            o[i + 1] = b;
        }
        if (i < end) { DRAW2(a, b); (void)b; o[i] = a; }
    } else if (j->dtype == LOOM_DTYPE_F16) {
        uint16_t *o = (uint16_t *)base;
        for (; i < stop; i += 2) {
            DRAW2(a, b);
            o[i] = loom_fp32_to_fp16(a);
            o[i + 1] = loom_fp32_to_fp16(b);
        }
        if (i < end) { DRAW2(a, b); (void)b; o[i] = loom_fp32_to_fp16(a); }
    } else {
        uint16_t *o = (uint16_t *)base;
        for (; i < stop; i += 2) {
            DRAW2(a, b);
            o[i] = loom_fp32_to_bf16(a);
            o[i + 1] = loom_fp32_to_bf16(b);
        }
        if (i < end) { DRAW2(a, b); (void)b; o[i] = loom_fp32_to_bf16(a); }
    }
#undef DRAW2
}

static void *fill_worker(void *arg) {
    fill_job *j = arg;
    for (;;) {
        int64_t u = atomic_fetch_add(&j->next, 1);
        if (u >= j->n_units) break;
        fill_unit(j, u);
        atomic_fetch_add(&j->done, 1);
    }
    return NULL;
}

static const shape_def *find_shape(const char *name) {
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if (!strcmp(k_shapes[i].name, name)) return &k_shapes[i];
    return NULL;
}

/* The options name a known shape, a dtype we generate, a sane layer count. */
static loom_status check_opts(const loom_model_load_opts *o, const shape_def **sd, loom_error *err) {
    if (!o->dummy_shape || !*o->dummy_shape)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "dummy model needs a shape (llama3-8b, llama2-7b, smollm2-135m, qwen2-0.5b, tiny, "
                              "mixtral-8x7b, qwen3-30b-a3b, qwen3-moe-tiny, qwen2-moe-tiny, gemma3-270m or "
                              "qwen3-0.6b)");
    *sd = find_shape(o->dummy_shape);
    if (!*sd)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "unknown dummy shape '%s' (use llama3-8b, llama2-7b, smollm2-135m, qwen2-0.5b, tiny, "
                              "mixtral-8x7b, qwen3-30b-a3b, qwen3-moe-tiny, qwen2-moe-tiny, gemma3-270m or "
                              "qwen3-0.6b)",
                              o->dummy_shape);
    loom_dtype dt = o->dummy_dtype;
    if (dt != LOOM_DTYPE_F32 && dt != LOOM_DTYPE_F16 && dt != LOOM_DTYPE_BF16)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "dummy weights can be f32, f16 or bf16, not %s",
                              loom_dtype_name(dt));
    if (o->num_layers_override > 4096)
        return loom_error_set(err, LOOM_ERR_INVALID, "num_layers_override=%d is too large (at most 4096)",
                              o->num_layers_override);
    return LOOM_OK;
}

static void set_config(loom_model_config *c, const shape_def *sd, const loom_model_load_opts *o) {
    c->arch = sd->arch;
    c->vocab_size = sd->vocab;
    c->hidden_size = sd->hidden;
    c->intermediate_size = sd->inter;
    c->num_layers = o->num_layers_override > 0 ? o->num_layers_override : sd->layers;
    c->num_heads = sd->heads;
    c->num_kv_heads = sd->kv_heads;
    c->head_dim = sd->head_dim;
    c->max_context = sd->ctx;
    c->rope_theta = sd->theta;
    c->rms_norm_eps = sd->eps;
    c->tie_embeddings = sd->tie;
    c->qkv_bias = sd->arch == LOOM_ARCH_QWEN2 || sd->arch == LOOM_ARCH_QWEN2_MOE;
    c->qk_norm = sd->arch == LOOM_ARCH_QWEN3 || sd->arch == LOOM_ARCH_QWEN3_MOE;
    c->num_experts = sd->experts;
    c->num_experts_used = sd->experts_used;
    c->expert_intermediate_size = sd->expert_inter;
    c->shared_expert_intermediate_size = sd->shared_inter;
    c->moe_norm_topk = sd->norm_topk;
    c->bos_token_id = sd->bos;
    c->eos_token_id = sd->eos;
    if (sd->arch == LOOM_ARCH_GEMMA3) { /* Gemma 3 270M's, as model_gguf.c reads its GGUF */
        c->sliding_window = 512;
        c->global_every = 6;
        c->rope_theta_local = 10000.0f;
        c->attn_scale = 1.0f / sqrtf((float)sd->head_dim);
        c->embed_scale = sqrtf((float)sd->hidden);
        c->ffn_act = LOOM_FFN_GELU_TANH;
        c->qk_norm = true;
        c->post_norms = true;
    }
    snprintf(c->name, sizeof c->name, "%s (%s, seed %llu)", sd->label, loom_dtype_name(o->dummy_dtype),
             (unsigned long long)o->seed);
}

/* The tensor list being laid out in the arena. */
typedef struct plan {
    loom_model *m;
    loom_dtype dt;
    size_t esz;              /* bytes per element                         */
    dtensor *ts;             /* [3 + 24 * layers]                         */
    int32_t n_ts;
    size_t total;            /* arena bytes so far, each tensor ALIGNed   */
} plan;

/* Add one tensor of shape (s0), (s0, s1) or (s0, s1, s2) to the model and
 * the arena plan. */
static loom_status plan_add3(plan *p, const char *name, int nd, int64_t s0, int64_t s1, int64_t s2,
                             init_kind kind, int64_t fan_in, loom_error *err) {
    int64_t shape[3] = {s0, s1, s2};
    int64_t numel = nd == 1 ? s0 : nd == 2 ? s0 * s1 : s0 * s1 * s2;
    loom_status st = lm_add_tensor(p->m, name, p->dt, nd, shape, NULL, (size_t)numel * p->esz, err);
    if (st) return st;
    p->ts[p->n_ts] = (dtensor){.index = p->n_ts, .numel = numel, .offset = p->total, .kind = kind,
                               .scale = kind == INIT_MATRIX ? 1.0f / sqrtf((float)fan_in)
                                        : kind == INIT_NORM ? 0.05f : 0.02f};
    p->total += ((size_t)numel * p->esz + ALIGN - 1) / ALIGN * ALIGN;
    p->n_ts++;
    return LOOM_OK;
}

static loom_status plan_add(plan *p, const char *name, int nd, int64_t s0, int64_t s1, init_kind kind,
                            int64_t fan_in, loom_error *err) {
    return plan_add3(p, name, nd, s0, s1, 1, kind, fan_in, err);
}

/* Layer l's routed (and shared) experts instead of a dense FFN. */
static loom_status plan_moe(plan *p, const loom_model_config *c, int32_t l, loom_error *err) {
    const int64_t H = c->hidden_size, E = c->num_experts, I = c->expert_intermediate_size,
                  S = c->shared_expert_intermediate_size;
    char name[96];
    loom_status st;
#define ADD3(s, nd, s0, s1, s2, kind, fan_in)                                                 \
    do {                                                                                      \
        snprintf(name, sizeof name, "blk.%d." s, l);                                          \
        if ((st = plan_add3(p, name, nd, s0, s1, s2, kind, fan_in, err))) return st;          \
    } while (0)
    ADD3("ffn_gate_inp.weight", 2, E, H, 1, INIT_MATRIX, H);
    ADD3("ffn_gate_exps.weight", 3, E, I, H, INIT_MATRIX, H);
    ADD3("ffn_up_exps.weight", 3, E, I, H, INIT_MATRIX, H);
    ADD3("ffn_down_exps.weight", 3, E, H, I, INIT_MATRIX, I);
    if (S > 0) {
        ADD3("ffn_gate_shexp.weight", 2, S, H, 1, INIT_MATRIX, H);
        ADD3("ffn_up_shexp.weight", 2, S, H, 1, INIT_MATRIX, H);
        ADD3("ffn_down_shexp.weight", 2, H, S, 1, INIT_MATRIX, S);
        ADD3("ffn_gate_inp_shexp.weight", 1, H, 1, 1, INIT_MATRIX, H);
    }
#undef ADD3
    return LOOM_OK;
}

/* One layer's tensors, named as in GGUF (blk.N.*). */
static loom_status plan_layer(plan *p, const loom_model_config *c, int32_t l, loom_error *err) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int64_t Q = (int64_t)c->num_heads * c->head_dim, KV = (int64_t)c->num_kv_heads * c->head_dim;
    char name[96];
    loom_status st;
#define ADD(s, nd, s0, s1, kind, fan_in)                                                      \
    do {                                                                                      \
        snprintf(name, sizeof name, "blk.%d." s, l);                                          \
        if ((st = plan_add(p, name, nd, s0, s1, kind, fan_in, err))) return st;               \
    } while (0)
    ADD("attn_norm.weight", 1, H, 0, INIT_NORM, 1);
    ADD("attn_q.weight", 2, Q, H, INIT_MATRIX, H);
    ADD("attn_k.weight", 2, KV, H, INIT_MATRIX, H);
    ADD("attn_v.weight", 2, KV, H, INIT_MATRIX, H);
    if (c->qkv_bias) {
        ADD("attn_q.bias", 1, Q, 0, INIT_BIAS, 1);
        ADD("attn_k.bias", 1, KV, 0, INIT_BIAS, 1);
        ADD("attn_v.bias", 1, KV, 0, INIT_BIAS, 1);
    }
    if (c->qk_norm) {
        ADD("attn_q_norm.weight", 1, c->head_dim, 0, INIT_NORM, 1);
        ADD("attn_k_norm.weight", 1, c->head_dim, 0, INIT_NORM, 1);
    }
    ADD("attn_output.weight", 2, H, Q, INIT_MATRIX, Q);
    if (c->post_norms) ADD("post_attention_norm.weight", 1, H, 0, INIT_NORM, 1);
    ADD("ffn_norm.weight", 1, H, 0, INIT_NORM, 1);
    if (c->num_experts > 0) return plan_moe(p, c, l, err);
    ADD("ffn_gate.weight", 2, I, H, INIT_MATRIX, H);
    ADD("ffn_up.weight", 2, I, H, INIT_MATRIX, H);
    ADD("ffn_down.weight", 2, H, I, INIT_MATRIX, I);
    if (c->post_norms) ADD("post_ffw_norm.weight", 1, H, 0, INIT_NORM, 1);
#undef ADD
    return LOOM_OK;
}

static loom_status plan_tensors(plan *p, const loom_model_config *c, loom_error *err) {
    int64_t H = c->hidden_size, V = c->vocab_size;
    loom_status st;
    if ((st = plan_add(p, "token_embd.weight", 2, V, H, INIT_MATRIX, H, err))) return st;
    if ((st = plan_add(p, "output_norm.weight", 1, H, 0, INIT_NORM, 1, err))) return st;
    if (!c->tie_embeddings && (st = plan_add(p, "output.weight", 2, V, H, INIT_MATRIX, H, err))) return st;
    for (int32_t l = 0; l < c->num_layers; l++)
        if ((st = plan_layer(p, c, l, err))) return st;
    return LOOM_OK;
}

/* One anonymous mapping for all tensors, owned by the model from here on. */
static loom_status map_arena(const plan *p, const shape_def *sd, void **arena, loom_error *err) {
    size_t size = p->total ? p->total : ALIGN;
    void *a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        return loom_error_set(err, LOOM_ERR_NOMEM,
                              "cannot allocate %.2f GB for dummy %s weights in %s; use a smaller shape, "
                              "num_layers_override or bf16",
                              (double)p->total / 1e9, sd->name, loom_dtype_name(p->dt));
#ifdef MADV_HUGEPAGE
    madvise(a, size, MADV_HUGEPAGE);
#endif
    loom_status st = lm_add_map(p->m, a, size, err);
    if (st) return st;
    for (int32_t i = 0; i < p->n_ts; i++) p->m->tensors[i].data = (uint8_t *)a + p->ts[i].offset;
    *arena = a;
    return LOOM_OK;
}

/* Fill every unit: workers plus this thread, which also reports progress. */
static void fill_all(fill_job *job, const loom_model_load_opts *o) {
    pthread_t threads[MAX_THREADS];
    int n_threads = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int want = ncpu > 0 ? (int)(ncpu < MAX_THREADS ? ncpu : MAX_THREADS) : 1;
    if (want > job->n_units) want = (int)job->n_units;
    for (int i = 1; i < want; i++) {
        if (pthread_create(&threads[n_threads], NULL, fill_worker, job) != 0) break; /* fewer threads is fine */
        n_threads++;
    }
    double last = -1;
    for (;;) {
        int64_t u = atomic_fetch_add(&job->next, 1);
        if (u >= job->n_units) break;
        fill_unit(job, u);
        int64_t d = atomic_fetch_add(&job->done, 1) + 1;
        double f = (double)d / (double)job->n_units;
        if (f - last >= 0.01) {
            lm_progress(o, "dummy: generate weights", f);
            last = f;
        }
    }
    for (int i = 0; i < n_threads; i++) pthread_join(threads[i], NULL);
    lm_progress(o, "dummy: generate weights", 1.0);
}

loom_status lm_load_dummy(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    const shape_def *sd = NULL;
    int64_t *unit_start = NULL;
    void *arena = NULL;
    loom_status st = check_opts(o, &sd, err);
    if (st) return st;
    loom_model_config *c = &m->cfg;
    set_config(c, sd, o);
    lm_keys keys = {"vocab",    "hidden",   "intermediate", "layers",        "heads",
                    "kv_heads", "head_dim", "experts",      "experts_used",  "expert_intermediate",
                    "shared_expert_intermediate"};
    if ((st = lm_check_config(c, o->dummy_shape, &keys, err))) return st;

    loom_dtype dt = o->dummy_dtype;
    int32_t max_ts = 3 + 24 * c->num_layers;
    plan p = {.m = m, .dt = dt, .esz = dt == LOOM_DTYPE_F32 ? 4 : 2};
    p.ts = calloc((size_t)max_ts, sizeof *p.ts);
    unit_start = calloc((size_t)max_ts + 1, sizeof *unit_start);
    if (!p.ts || !unit_start) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto free_plan;
    }
    if ((st = plan_tensors(&p, c, err))) goto free_plan;
    if ((st = map_arena(&p, sd, &arena, err))) goto free_plan;
    for (int32_t i = 0; i < p.n_ts; i++)
        unit_start[i + 1] = unit_start[i] + (p.ts[i].numel + CHUNK - 1) / CHUNK;

    fill_job job = {.arena = arena, .ts = p.ts, .n_ts = p.n_ts, .unit_start = unit_start,
                    .n_units = unit_start[p.n_ts], .dtype = dt, .seed = o->seed};
    atomic_init(&job.next, 0);
    atomic_init(&job.done, 0);
    fill_all(&job, o);
    if ((st = lm_index(m, sd->name, err))) goto free_plan;
    st = lm_validate(m, sd->name, &keys, err);
free_plan:
    free(p.ts);
    free(unit_start);
    return st;
}
