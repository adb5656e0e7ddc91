/*
 * core/model/model.c — the loom_model object: format detection and dispatch
 * to the GGUF / safetensors / dummy loaders, the tensor table behind the
 * loom_model_view, the config and shape checks shared by all loaders, and
 * the Q/K row permutations of llama.cpp's converter.
 */
#include "model/model_internal.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

/* ------------------------------------------------------------ the object */

loom_model *lm_new(const char *format) {
    loom_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->format = format;
    m->cfg.struct_size = sizeof m->cfg;
    m->cfg.bos_token_id = -1;
    m->cfg.eos_token_id = -1;
    return m;
}

void loom_model_free(loom_model *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_tensors; i++) free(m->names[i]);
    free(m->names);
    free(m->tensors);
    free(m->sorted);
    for (int32_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    for (int32_t i = 0; i < m->n_maps; i++)
        if (m->maps[i].addr) munmap(m->maps[i].addr, m->maps[i].size);
    free(m->maps);
    for (int32_t i = 0; i < m->n_unsup; i++) {
        free(m->unsup[i].name);
        free(m->unsup[i].type);
    }
    free(m->unsup);
    if (m->gguf) loom_gguf_close(m->gguf);
    free(m->dir);
    free(m->tokenizer_json);
    free(m);
}

/* Grow an array to hold one more element. */
static bool grow(void **arr, int32_t *cap, int32_t n, size_t elem) {
    if (n < *cap) return true;
    int32_t nc = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

void *lm_alloc(loom_model *m, size_t size) {
    if (!grow((void **)&m->owned, &m->cap_owned, m->n_owned, sizeof *m->owned)) return NULL;
    /* 64-byte alignment so kernels may use aligned vector loads on owned copies */
    void *p = aligned_alloc(64, (size + 63) / 64 * 64 + (size == 0 ? 64 : 0));
    if (!p) return NULL;
    m->owned[m->n_owned++] = p;
    return p;
}

void *lm_aligned_data(loom_model *m, void *data, size_t nbytes, size_t align) {
    if (!data || align <= 1 || (uintptr_t)data % align == 0) return data;
    void *copy = lm_alloc(m, nbytes);
    if (copy) memcpy(copy, data, nbytes);
    return copy;
}

/* The alignment a dtype's scalar loads need (block types hold f16 fields). */
static size_t dtype_align(loom_dtype dt) {
    switch (dt) {
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_I8:
    case LOOM_DTYPE_U8:
    case LOOM_DTYPE_FP8_E4M3: return 1;
    default: return 2;
    }
}

loom_status lm_add_map(loom_model *m, void *addr, size_t size, loom_error *err) {
    if (!grow((void **)&m->maps, &m->cap_maps, m->n_maps, sizeof *m->maps)) {
        munmap(addr, size);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    }
    m->maps[m->n_maps++] = (lm_map){addr, size};
    return LOOM_OK;
}

loom_status lm_map_file(loom_model *m, const char *path, const void **addr, size_t *size, loom_error *err) {
    loom_status st = LOOM_OK;
    *addr = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return loom_error_set(err, e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO, "%s: cannot open: %s", path,
                              strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: not a readable regular file", path);
        goto out;
    }
    if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = loom_error_set(err, LOOM_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
            goto out;
        }
        if ((st = lm_add_map(m, p, (size_t)sb.st_size, err))) goto out;
        *addr = p;
        *size = (size_t)sb.st_size;
    }
out:
    close(fd);
    return st;
}

loom_status lm_add_tensor(loom_model *m, const char *name, loom_dtype dt, int ndim, const int64_t *shape,
                          void *data, size_t nbytes, loom_error *err) {
    if (!grow((void **)&m->tensors, &m->cap_tensors, m->n_tensors, sizeof *m->tensors)) goto nomem;
    void *orig = data;
    if (!(data = lm_aligned_data(m, data, nbytes, dtype_align(dt))) && orig) goto nomem;
    int32_t cap = m->cap_tensors;
    /* names grows in step with tensors */
    char **nn = realloc(m->names, (size_t)cap * sizeof *nn);
    if (!nn) goto nomem;
    m->names = nn;
    char *copy = loom_strdup(name);
    if (!copy) goto nomem;
    loom_tensor *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < LOOM_TENSOR_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    t->data = data;
    t->nbytes = nbytes;
    t->device = LOOM_DEVICE_HOST;
    t->name = copy;
    m->names[m->n_tensors++] = copy;
    return LOOM_OK;
nomem:
    return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory adding tensor %s", name);
}

loom_status lm_add_unsupported(loom_model *m, const char *name, const char *type, loom_error *err) {
    if (!grow((void **)&m->unsup, &m->cap_unsup, m->n_unsup, sizeof *m->unsup))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    lm_unsupported *u = &m->unsup[m->n_unsup];
    u->name = loom_strdup(name);
    u->type = loom_strdup(type);
    if (!u->name || !u->type) {
        free(u->name);
        free(u->type);
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    }
    m->n_unsup++;
    return LOOM_OK;
}

/* qsort without context: compare through the name pointers of a snapshot. */
typedef struct name_ref {
    const char *name;
    int32_t i;
} name_ref;

static int name_ref_cmp(const void *a, const void *b) {
    const name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

loom_status lm_index(loom_model *m, const char *src, loom_error *err) {
    free(m->sorted);
    m->sorted = malloc((size_t)(m->n_tensors + 1) * sizeof *m->sorted);
    name_ref *tmp = malloc((size_t)(m->n_tensors + 1) * sizeof *tmp);
    loom_status st = LOOM_OK;
    if (!m->sorted || !tmp) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory indexing tensors");
        goto out;
    }
    for (int32_t i = 0; i < m->n_tensors; i++) tmp[i] = (name_ref){m->names[i], i};
    qsort(tmp, (size_t)m->n_tensors, sizeof *tmp, name_ref_cmp);
    for (int32_t i = 0; i < m->n_tensors; i++) {
        m->sorted[i] = tmp[i].i;
        if (i > 0 && strcmp(tmp[i - 1].name, tmp[i].name) == 0) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: tensor %s appears twice (check for duplicate entries across shards)", src,
                                tmp[i].name);
            goto out;
        }
    }
out:
    free(tmp);
    return st;
}

loom_tensor *lm_find(const loom_model *m, const char *name) {
    if (!m->sorted || !name) return NULL;
    int32_t lo = 0, hi = m->n_tensors - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->names[m->sorted[mid]], name);
        if (c == 0) return &m->tensors[m->sorted[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

void lm_progress(const loom_model_load_opts *o, const char *what, double fraction) {
    if (o && o->progress) o->progress(o->user, what, fraction);
}

/* ------------------------------------------------------------ validation */

#define LM_MAX_DIM (1 << 24)     /* any hidden/vocab/ffn width beyond this is a corrupt header */
#define LM_MAX_LAYERS 4096
#define LM_MAX_EXPERTS 4096      /* routed experts per layer (DeepSeek-V3 has 256) */

loom_status lm_check_config(const loom_model_config *c, const char *src, const lm_keys *k, loom_error *err) {
    struct {
        const char *key;
        int64_t v;
        int64_t max;
    } checks[] = {
        {k->vocab, c->vocab_size, LM_MAX_DIM},   {k->hidden, c->hidden_size, LM_MAX_DIM},
        {k->inter, c->intermediate_size, LM_MAX_DIM}, {k->layers, c->num_layers, LM_MAX_LAYERS},
        {k->heads, c->num_heads, 65536},         {k->kv_heads, c->num_kv_heads, 65536},
        {k->head_dim, c->head_dim, 65536},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].v <= 0 || checks[i].v > checks[i].max)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%lld is out of range (1..%lld)", src,
                                  checks[i].key, (long long)checks[i].v, (long long)checks[i].max);
    if (c->num_heads % c->num_kv_heads != 0)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s=%d is not a multiple of %s=%d (grouped-query attention needs whole groups)",
                              src, k->heads, c->num_heads, k->kv_heads, c->num_kv_heads);
    if (c->head_dim % 2 != 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d is odd; RoPE needs an even head dimension", src,
                              k->head_dim, c->head_dim);
    if ((int64_t)c->num_heads * c->head_dim > LM_MAX_DIM)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s x %s is too large", src, k->heads, k->head_dim);
    if (!(c->rope_theta > 0) || !(c->rms_norm_eps > 0) || !(c->rms_norm_eps < 1))
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: rope theta %g and rms_norm_eps %g must be positive (eps < 1)", src,
                              (double)c->rope_theta, (double)c->rms_norm_eps);
    if (c->max_context <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: context length %d must be positive", src, c->max_context);
    if (c->rope_scaling != LOOM_ROPE_SCALING_NONE && !(c->rope_factor > 0))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: rope scaling factor %g must be positive", src,
                              (double)c->rope_factor);
    if (c->num_experts < 0 || c->num_experts > LM_MAX_EXPERTS)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d is out of range (0..%d)", src,
                              k->experts ? k->experts : "expert count", c->num_experts, LM_MAX_EXPERTS);
    if (c->num_experts > 0 && (c->num_experts_used < 1 || c->num_experts_used > c->num_experts))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d must be in 1..%d (the expert count)", src,
                              k->experts_used ? k->experts_used : "experts per token", c->num_experts_used,
                              c->num_experts);
    if (c->num_experts > 0 && (c->expert_intermediate_size <= 0 || c->expert_intermediate_size > LM_MAX_DIM ||
                               c->shared_expert_intermediate_size < 0 ||
                               c->shared_expert_intermediate_size > LM_MAX_DIM))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d / %s=%d out of range (1..%d / 0..%d)", src,
                              k->expert_inter ? k->expert_inter : "expert width", c->expert_intermediate_size,
                              k->shared_inter ? k->shared_inter : "shared expert width",
                              c->shared_expert_intermediate_size, LM_MAX_DIM, LM_MAX_DIM);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: bos/eos token id (%d/%d) outside the vocabulary (%d)", src,
                              c->bos_token_id, c->eos_token_id, c->vocab_size);
    return LOOM_OK;
}

const char *lm_arch_name(loom_arch a) {
    switch (a) {
    case LOOM_ARCH_LLAMA: return "llama";
    case LOOM_ARCH_QWEN2: return "qwen2";
    case LOOM_ARCH_GEMMA3: return "gemma3";
    case LOOM_ARCH_QWEN3: return "qwen3";
    case LOOM_ARCH_QWEN3_MOE: return "qwen3moe";
    case LOOM_ARCH_QWEN2_MOE: return "qwen2moe";
    case LOOM_ARCH_MIXTRAL: return "mixtral";
    }
    return "unknown";
}

enum { D_VOCAB, D_HIDDEN, D_INTER, D_Q, D_KV, D_HEAD, D_EXP, D_EINTER, D_SINTER };

static int64_t dim_value(const loom_model_config *c, int d) {
    switch (d) {
    case D_VOCAB: return c->vocab_size;
    case D_HIDDEN: return c->hidden_size;
    case D_INTER: return c->intermediate_size;
    case D_Q: return (int64_t)c->num_heads * c->head_dim;
    case D_HEAD: return c->head_dim;
    case D_EXP: return c->num_experts;
    case D_EINTER: return c->expert_intermediate_size;
    case D_SINTER: return c->shared_expert_intermediate_size;
    default: return (int64_t)c->num_kv_heads * c->head_dim;
    }
}

static int dim_label(char *buf, size_t cap, const loom_model_config *c, const lm_keys *k, int d) {
    switch (d) {
    case D_VOCAB: return snprintf(buf, cap, "%s=%d", k->vocab, c->vocab_size);
    case D_HIDDEN: return snprintf(buf, cap, "%s=%d", k->hidden, c->hidden_size);
    case D_INTER: return snprintf(buf, cap, "%s=%d", k->inter, c->intermediate_size);
    case D_Q: return snprintf(buf, cap, "%s=%d x %s=%d", k->heads, c->num_heads, k->head_dim, c->head_dim);
    case D_HEAD: return snprintf(buf, cap, "%s=%d", k->head_dim, c->head_dim);
    case D_EXP: return snprintf(buf, cap, "%s=%d", k->experts ? k->experts : "experts", c->num_experts);
    case D_EINTER:
        return snprintf(buf, cap, "%s=%d", k->expert_inter ? k->expert_inter : "expert width",
                        c->expert_intermediate_size);
    case D_SINTER:
        return snprintf(buf, cap, "%s=%d", k->shared_inter ? k->shared_inter : "shared expert width",
                        c->shared_expert_intermediate_size);
    default: return snprintf(buf, cap, "%s=%d x %s=%d", k->kv_heads, c->num_kv_heads, k->head_dim, c->head_dim);
    }
}

static bool is_float_type(loom_dtype t) {
    return t == LOOM_DTYPE_F32 || t == LOOM_DTYPE_F16 || t == LOOM_DTYPE_BF16;
}

static bool is_weight_type(loom_dtype t) {
    switch (t) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_F16: case LOOM_DTYPE_BF16: case LOOM_DTYPE_Q8_0:
    case LOOM_DTYPE_Q4_0: case LOOM_DTYPE_Q4_1: case LOOM_DTYPE_Q5_0: case LOOM_DTYPE_Q4_K:
    case LOOM_DTYPE_Q5_K: case LOOM_DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* Check one required tensor: present, readable type, expected shape. */
static loom_status check_tensor(loom_model *m, const char *src, const lm_keys *k, const char *name, int ndim,
                                int d0, int d1, int d2, loom_error *err) {
    const loom_model_config *c = &m->cfg;
    loom_tensor *t = lm_find(m, name);
    if (!t) {
        for (int32_t i = 0; i < m->n_unsup; i++)
            if (strcmp(m->unsup[i].name, name) == 0)
                return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                      "%s: tensor %s has type %s, which loom cannot read (supported: f32, f16, "
                                      "bf16, q8_0, q5_0, q4_0, q4_1, q4_k, q5_k, q6_k); re-quantize the model to one of those "
                                      "(e.g. llama-quantize ... Q4_K_M)",
                                      src, name, m->unsup[i].type);
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: required tensor %s is missing (a %s model with %d layers needs it); the file is "
                              "incomplete or is not a Llama/Qwen/Mixtral/Gemma3-style decoder",
                              src, name, lm_arch_name(c->arch), c->num_layers);
    }
    bool ok_type = ndim == 1 ? is_float_type(t->dtype) : is_weight_type(t->dtype);
    if (!ok_type)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: tensor %s has type %s, which loom does not accept for a %s; use %s", src, name,
                              loom_dtype_name(t->dtype), ndim == 1 ? "norm/bias vector" : "weight matrix",
                              ndim == 1 ? "f32, f16 or bf16" : "f32, f16, bf16, q8_0, q5_0, q4_0, q4_1, q4_k, q5_k or q6_k");
    int dims[3] = {d0, d1, d2};
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == dim_value(c, dims[i]);
    if (!ok) {
        char got[96], exp[96], from[320];
        int n = snprintf(got, sizeof got, "(");
        for (int i = 0; i < t->ndim; i++)
            n += snprintf(got + n, sizeof got - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        snprintf(got + n, sizeof got - (size_t)n, ")");
        int ne = snprintf(exp, sizeof exp, "("), nf = 0;
        for (int i = 0; i < ndim; i++) {
            ne += snprintf(exp + ne, sizeof exp - (size_t)ne, "%s%lld", i ? ", " : "",
                           (long long)dim_value(c, dims[i]));
            if (i && nf < (int)sizeof from - 2) nf += snprintf(from + nf, sizeof from - (size_t)nf, ", ");
            if (nf < (int)sizeof from) nf += dim_label(from + nf, sizeof from - (size_t)nf, c, k, dims[i]);
        }
        snprintf(exp + ne, sizeof exp - (size_t)ne, ")");
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s: shape %s expected %s from %s; the tensors do not match the model's "
                              "configuration (damaged file or mismatched config)",
                              src, name, got, exp, from);
    }
    /* a packed AWQ/GPTQ linear: its .qweight/.qzeros/.scales were checked
     * against this shape by the safetensors loader; no float data here */
    if (loom_model_is_packed_weight(m, t)) return LOOM_OK;
    size_t need = loom_dtype_row_bytes(t->dtype, t->shape[t->ndim - 1]);
    int64_t rows = 1;
    for (int i = 0; i < t->ndim - 1; i++) rows *= t->shape[i];
    if (need == 0 || need * (size_t)rows != t->nbytes)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s: %zu bytes of data but %lld rows of %lld %s elements need %zu; the file is "
                              "damaged",
                              src, name, t->nbytes, (long long)rows, (long long)t->shape[t->ndim - 1],
                              loom_dtype_name(t->dtype), need * (size_t)rows);
    return LOOM_OK;
}

loom_status lm_validate(loom_model *m, const char *src, const lm_keys *k, loom_error *err) {
    const loom_model_config *c = &m->cfg;
    loom_status st;
    char name[96];
    if ((st = check_tensor(m, src, k, "token_embd.weight", 2, D_VOCAB, D_HIDDEN, 0, err))) return st;
    if ((st = check_tensor(m, src, k, "output_norm.weight", 1, D_HIDDEN, 0, 0, err))) return st;
    if (!c->tie_embeddings && (st = check_tensor(m, src, k, "output.weight", 2, D_VOCAB, D_HIDDEN, 0, err)))
        return st;
    /* when: 0 always, else only with qkv_bias (1), qk_norm (2), post_norms
     * (3), a dense FFN (4), routed experts (5), a shared expert (6) */
    static const struct {
        const char *suffix;
        int ndim, d0, d1, d2;
        int when;
    } per_layer[] = {
        {"attn_norm.weight", 1, D_HIDDEN, 0, 0, 0}, {"attn_q.weight", 2, D_Q, D_HIDDEN, 0, 0},
        {"attn_k.weight", 2, D_KV, D_HIDDEN, 0, 0},  {"attn_v.weight", 2, D_KV, D_HIDDEN, 0, 0},
        {"attn_output.weight", 2, D_HIDDEN, D_Q, 0, 0}, {"ffn_norm.weight", 1, D_HIDDEN, 0, 0, 0},
        {"ffn_gate.weight", 2, D_INTER, D_HIDDEN, 0, 4}, {"ffn_up.weight", 2, D_INTER, D_HIDDEN, 0, 4},
        {"ffn_down.weight", 2, D_HIDDEN, D_INTER, 0, 4}, {"attn_q.bias", 1, D_Q, 0, 0, 1},
        {"attn_k.bias", 1, D_KV, 0, 0, 1},            {"attn_v.bias", 1, D_KV, 0, 0, 1},
        {"attn_q_norm.weight", 1, D_HEAD, 0, 0, 2},    {"attn_k_norm.weight", 1, D_HEAD, 0, 0, 2},
        {"post_attention_norm.weight", 1, D_HIDDEN, 0, 0, 3}, {"post_ffw_norm.weight", 1, D_HIDDEN, 0, 0, 3},
        {"ffn_gate_inp.weight", 2, D_EXP, D_HIDDEN, 0, 5},
        {"ffn_gate_exps.weight", 3, D_EXP, D_EINTER, D_HIDDEN, 5},
        {"ffn_up_exps.weight", 3, D_EXP, D_EINTER, D_HIDDEN, 5},
        {"ffn_down_exps.weight", 3, D_EXP, D_HIDDEN, D_EINTER, 5},
        {"ffn_gate_shexp.weight", 2, D_SINTER, D_HIDDEN, 0, 6}, {"ffn_up_shexp.weight", 2, D_SINTER, D_HIDDEN, 0, 6},
        {"ffn_down_shexp.weight", 2, D_HIDDEN, D_SINTER, 0, 6}, {"ffn_gate_inp_shexp.weight", 1, D_HIDDEN, 0, 0, 6},
    };
    const bool moe = c->num_experts > 0;
    const bool have[7] = {true, c->qkv_bias, c->qk_norm, c->post_norms, !moe, moe,
                          moe && c->shared_expert_intermediate_size > 0};
    for (int32_t l = 0; l < c->num_layers; l++) {
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++) {
            if (!have[per_layer[i].when]) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, per_layer[i].suffix);
            if ((st = check_tensor(m, src, k, name, per_layer[i].ndim, per_layer[i].d0, per_layer[i].d1,
                                   per_layer[i].d2, err)))
                return st;
        }
    }
    /* file tensors loom cannot read that no backend needs: say so once */
    for (int32_t i = 0; i < m->n_unsup; i++)
        loom_log(LOOM_LOG_WARN, "model", "%s: ignoring tensor %s of unsupported type %s (not needed)", src,
                 m->unsup[i].name, m->unsup[i].type);
    return LOOM_OK;
}

/* ------------------------------------------------------------ permutations */

/* llama.cpp (convert_hf_to_gguf.py, LlamaModel.permute):
 *     w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)
 * Index the HF rows of one head as r = i*(hd/2) + j with i in {0,1} (first or
 * second half of the head, the two halves NeoX RoPE rotates together) and
 * j in [0, hd/2). reshape(n_head, 2, hd/2) puts HF row h*hd + i*hd/2 + j at
 * [h][i][j]; swapaxes(1,2) moves it to [h][j][i], which the final reshape
 * flattens to GGUF row h*hd + 2*j + i. So the pair (j, j + hd/2) that NeoX
 * rotates becomes the adjacent pair (2j, 2j+1) that GPT-J-style ("normal")
 * RoPE in llama.cpp rotates, with the same frequency index j. The inverse
 * reads GGUF row h*hd + 2*j + i back into HF row h*hd + i*hd/2 + j. */
static loom_status permute_common(const void *src, void *dst, int64_t n_rows, size_t row_bytes, int32_t n_head,
                                  bool inverse) {
    if (n_head <= 0 || n_rows <= 0 || n_rows % (2 * (int64_t)n_head) != 0) return LOOM_ERR_INVALID;
    int64_t hd = n_rows / n_head, half = hd / 2;
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < 2; i++)
            for (int64_t j = 0; j < half; j++) {
                int64_t hf = h * hd + i * half + j, gg = h * hd + 2 * j + i;
                int64_t from = inverse ? gg : hf, to = inverse ? hf : gg;
                memcpy(d + (size_t)to * row_bytes, s + (size_t)from * row_bytes, row_bytes);
            }
    return LOOM_OK;
}

loom_status loom_model_permute_rows(const void *src, void *dst, int64_t n_rows, size_t row_bytes, int32_t n_head) {
    return permute_common(src, dst, n_rows, row_bytes, n_head, false);
}

loom_status loom_model_unpermute_rows(const void *src, void *dst, int64_t n_rows, size_t row_bytes,
                                      int32_t n_head) {
    return permute_common(src, dst, n_rows, row_bytes, n_head, true);
}

/* ------------------------------------------------------------ view */

static const loom_tensor *view_get(void *ctx, const char *name) { return lm_find(ctx, name); }
static int32_t view_count(void *ctx) { return ((loom_model *)ctx)->n_tensors; }
static const loom_tensor *view_at(void *ctx, int32_t i) {
    loom_model *m = ctx;
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

const loom_model_view *loom_model_view_get(const loom_model *m) { return m ? &m->view : NULL; }
const loom_model_config *loom_model_config_get(const loom_model *m) { return m ? &m->cfg : NULL; }
const loom_gguf *loom_model_gguf(const loom_model *m) { return m ? m->gguf : NULL; }
const char *loom_model_tokenizer_json(const loom_model *m) { return m ? m->tokenizer_json : NULL; }
const char *loom_model_dir(const loom_model *m) { return m ? m->dir : NULL; }
const char *loom_model_format_name(const loom_model *m) { return m ? m->format : NULL; }
const loom_tensor *loom_model_tensor(const loom_model *m, const char *name) { return m ? lm_find(m, name) : NULL; }
const loom_model_packing *loom_model_packing_get(const loom_model *m) {
    return m && m->packing.method ? &m->packing : NULL;
}

bool loom_model_is_packed_weight(const loom_model *m, const loom_tensor *w) {
    if (!m || !m->packing.method || !w || w->data || w->nbytes || !w->name) return false;
    size_t n = strlen(w->name);
    char nm[128];
    if (n <= 7 || n + 2 > sizeof nm || strcmp(w->name + n - 7, ".weight") != 0) return false;
    snprintf(nm, sizeof nm, "%.*s.qweight", (int)(n - 7), w->name);
    return lm_find(m, nm) != NULL;
}

/* ------------------------------------------------------------ dispatch */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* "gguf" / "safetensors" from the path, or NULL with err set. */
static const char *detect_format(const char *path, loom_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        loom_error_set(err, e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO,
                       "%s: %s (give a .gguf file or a safetensors model directory; scripts/fetch-model.sh "
                       "downloads the default model)",
                       path, strerror(e));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) return "safetensors";
    unsigned char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) return "gguf";
    if (ends_with(path, ".gguf")) return "gguf"; /* let the GGUF reader explain what is wrong */
    if (ends_with(path, ".safetensors") || ends_with(path, ".json")) return "safetensors";
    loom_error_set(err, LOOM_ERR_FORMAT,
                   "%s: cannot tell the model format (not a GGUF file, not a safetensors directory); set "
                   "format to gguf, safetensors or dummy",
                   path);
    return NULL;
}

loom_status loom_model_load(const loom_model_load_opts *o, loom_model **out, loom_error *err) {
    if (!o || !out) return loom_error_set(err, LOOM_ERR_INVALID, "loom_model_load: NULL argument");
    *out = NULL;
    const char *fmt = o->format && *o->format ? o->format : "auto";
    bool have_path = (o->path && *o->path) || o->data;
    if (o->data && strcmp(fmt, "gguf") != 0 && strcmp(fmt, "safetensors") != 0)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "a model in memory needs format gguf or safetensors (got '%s')", fmt);
    if (strcmp(fmt, "auto") == 0) {
        if (!have_path && o->dummy_shape && *o->dummy_shape) fmt = "dummy";
        else if (!have_path)
            return loom_error_set(err, LOOM_ERR_INVALID,
                                  "no model given: set a model path (a .gguf file or a safetensors directory) or a "
                                  "dummy shape");
        else if (!(fmt = detect_format(o->path, err)))
            return err ? err->code : LOOM_ERR_FORMAT;
    }
    loom_status (*loader)(loom_model *, const loom_model_load_opts *, loom_error *);
    const char *name;
    if (strcmp(fmt, "gguf") == 0) loader = lm_load_gguf, name = "gguf";
    else if (strcmp(fmt, "safetensors") == 0) loader = lm_load_safetensors, name = "safetensors";
    else if (strcmp(fmt, "dummy") == 0) loader = lm_load_dummy, name = "dummy";
    else
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "unknown model format '%s' (use auto, gguf, safetensors or dummy)", fmt);
    if (loader != lm_load_dummy && !have_path)
        return loom_error_set(err, LOOM_ERR_INVALID, "model format %s needs a path", name);
    if (loader != lm_load_dummy && o->num_layers_override > 0)
        return loom_error_set(err, LOOM_ERR_INVALID,
                              "num_layers_override=%d applies only to dummy models (format %s)",
                              o->num_layers_override, name);
    loom_model *m = lm_new(name);
    if (!m) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    lm_progress(o, name, 0.0);
    loom_status st = loader(m, o, err);
    if (st != LOOM_OK) {
        loom_model_free(m);
        return st;
    }
    m->view = (loom_model_view){.struct_size = sizeof m->view, .config = &m->cfg, .ctx = m,
                                .get = view_get, .count = view_count, .at = view_at,
                                .packing = loom_model_packing_get(m)};
    lm_progress(o, name, 1.0);
    *out = m;
    return LOOM_OK;
}
