/*
 * core/model/model_gguf.c — model config and tensors from a GGUF file.
 *
 * Reads the llama.cpp metadata keys of architectures "llama" (Mixtral: with
 * expert_count), "qwen2", "qwen3", "qwen3moe", "qwen2moe" and "gemma3" into
 * loom_model_config, exposes every readable tensor under its GGUF name
 * with the GGML dims reversed into row-major order (ne[0] contiguous ->
 * last), then, for arch llama only, copies Q/K weights and biases into owned
 * memory with llama.cpp's interleaving permutation undone (whole rows, so
 * quantized rows are moved, never dequantized). qwen2 and gemma3 GGUFs are
 * converted without that permutation (llama.cpp uses NeoX RoPE for them;
 * so are the Qwen3 and Qwen MoE ones).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "util/util.h"

#define KEYLEN 160

typedef struct gg_ctx {
    const loom_gguf *g;
    const char *path;
    char arch[32];
} gg_ctx;

static const char *akey(char buf[KEYLEN], const gg_ctx *c, const char *suffix) {
    snprintf(buf, KEYLEN, "%s.%s", c->arch, suffix);
    return buf;
}

/* Integer key of the arch. required: missing is an error; otherwise *v keeps its default. */
static loom_status get_int(const gg_ctx *c, const char *suffix, bool required, int32_t *v, loom_error *err) {
    char k[KEYLEN];
    akey(k, c, suffix);
    int64_t x;
    if (loom_gguf_find(c->g, k) < 0) {
        if (!required) return LOOM_OK;
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: metadata key %s is missing; the file was not written by a llama.cpp converter "
                              "for this architecture or is damaged",
                              c->path, k);
    }
    if (!loom_gguf_get_i64(c->g, k, &x))
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: metadata key %s must be a single integer (per-layer values are not supported)",
                              c->path, k);
    if (x < INT32_MIN || x > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: metadata key %s=%lld is out of range", c->path, k,
                              (long long)x);
    *v = (int32_t)x;
    return LOOM_OK;
}

static loom_status get_float(const gg_ctx *c, const char *suffix, float *v, loom_error *err) {
    char k[KEYLEN];
    akey(k, c, suffix);
    double x;
    if (loom_gguf_find(c->g, k) < 0) return LOOM_OK;
    if (!loom_gguf_get_f64(c->g, k, &x) || !isfinite(x))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: metadata key %s must be a finite number", c->path, k);
    if (fabs(x) > FLT_MAX) /* a GGUF f64: converting it to float would be undefined */
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: metadata key %s=%g is out of range for a float", c->path,
                              k, x);
    *v = (float)x;
    return LOOM_OK;
}

static float f32_at(const unsigned char *p, uint64_t i) {
    float x;
    memcpy(&x, p + 4 * i, sizeof x);
    return x;
}

/* Llama 3.1 GGUFs carry RoPE scaling as a tensor of per-frequency divisors
 * (rope_freqs.weight, head_dim/2 floats) instead of keys. Recover the
 * Llama-3 parameters: factor = the largest divisor; low/high frequency
 * factors 1 and 4 and original context 8192 are what every Llama 3.x
 * release uses; check they reproduce the tensor and warn when not. */
static void infer_llama3_scaling(loom_model_config *c, const loom_gguf_tensor_info *ti, const char *path) {
    if (ti->dtype != LOOM_DTYPE_F32 || ti->n_dims != 1 || ti->ne[0] != (uint64_t)(c->head_dim / 2)) {
        loom_log(LOOM_LOG_WARN, "model", "%s: rope_freqs.weight has an unexpected shape/type; ignoring it", path);
        return;
    }
    const unsigned char *f = ti->data; /* may sit at any address: read with f32_at */
    float fmax = 0;
    for (uint64_t i = 0; i < ti->ne[0]; i++) fmax = f32_at(f, i) > fmax ? f32_at(f, i) : fmax;
    if (!(fmax > 1.0f)) return;
    c->rope_scaling = LOOM_ROPE_SCALING_LLAMA3;
    c->rope_factor = fmax;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    if (c->rope_original_context <= 0) c->rope_original_context = 8192;
    double low_wl = c->rope_original_context / c->rope_low_freq_factor;
    double high_wl = c->rope_original_context / c->rope_high_freq_factor;
    double worst = 0;
    for (uint64_t i = 0; i < ti->ne[0]; i++) {
        double freq = pow(c->rope_theta, -2.0 * (double)i / c->head_dim);
        double wl = 2 * M_PI / freq, want;
        if (wl < high_wl) want = 1;
        else if (wl > low_wl) want = c->rope_factor;
        else {
            double smooth = (c->rope_original_context / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
            want = 1.0 / ((1 - smooth) / c->rope_factor + smooth);
        }
        double d = fabs(want - f32_at(f, i)) / want;
        worst = d > worst ? d : worst;
    }
    if (worst > 1e-3)
        loom_log(LOOM_LOG_WARN, "model",
                 "%s: rope_freqs.weight does not match Llama-3 scaling with factor %g (rel. error %.3g); "
                 "backends that use the tensor itself are exact",
                 path, (double)c->rope_factor, worst);
}

/* general.architecture: llama, qwen2, qwen3, qwen3moe, qwen2moe or gemma3;
 * sets the prefix of the other keys (Mixtral is "llama" with experts). */
static loom_status read_arch(gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    loom_gguf_str s;
    if (!loom_gguf_get_str(c->g, "general.architecture", &s))
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: general.architecture is missing; not a model file from llama.cpp's converter",
                              c->path);
    static const struct {
        const char *name;
        loom_arch arch;
    } known[] = {{"llama", LOOM_ARCH_LLAMA},         {"qwen2", LOOM_ARCH_QWEN2},
                 {"gemma3", LOOM_ARCH_GEMMA3},       {"qwen3", LOOM_ARCH_QWEN3},
                 {"qwen3moe", LOOM_ARCH_QWEN3_MOE}, {"qwen2moe", LOOM_ARCH_QWEN2_MOE}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (loom_gguf_str_eq(s, known[i].name)) {
            cfg->arch = known[i].arch;
            snprintf(c->arch, sizeof c->arch, "%s", known[i].name);
            return LOOM_OK;
        }
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "%s: architecture '%.*s' is not supported (loom runs llama (Mixtral included), qwen2, "
                          "qwen3, qwen3moe, qwen2moe and gemma3 GGUFs)",
                          c->path, (int)(s.len > 40 ? 40 : s.len), s.ptr);
}

/* Layers, widths and heads; head_dim defaults to embedding_length /
 * head_count, and value and rotary sizes must equal it. */
static loom_status read_sizes(const gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    char k[KEYLEN], k2[KEYLEN];
    loom_status st;
    if ((st = get_int(c, "block_count", true, &cfg->num_layers, err))) return st;
    if ((st = get_int(c, "embedding_length", true, &cfg->hidden_size, err))) return st;
    if ((st = get_int(c, "feed_forward_length", true, &cfg->intermediate_size, err))) return st;
    if ((st = get_int(c, "attention.head_count", true, &cfg->num_heads, err))) return st;
    cfg->num_kv_heads = cfg->num_heads;
    if ((st = get_int(c, "attention.head_count_kv", false, &cfg->num_kv_heads, err))) return st;
    if (cfg->num_heads <= 0 || cfg->hidden_size <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s and %s must be positive", c->path,
                              akey(k, c, "embedding_length"), akey(k2, c, "attention.head_count"));
    cfg->head_dim = 0;
    if ((st = get_int(c, "attention.key_length", false, &cfg->head_dim, err))) return st;
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % cfg->num_heads != 0)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d is not a multiple of %s=%d", c->path,
                                  akey(k, c, "embedding_length"), cfg->hidden_size,
                                  akey(k2, c, "attention.head_count"), cfg->num_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    int32_t vdim = cfg->head_dim, rope_dim = cfg->head_dim;
    if ((st = get_int(c, "attention.value_length", false, &vdim, err))) return st;
    if ((st = get_int(c, "rope.dimension_count", false, &rope_dim, err))) return st;
    if (vdim != cfg->head_dim)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "%s: value head size %d differs from key head size %d",
                              c->path, vdim, cfg->head_dim);
    if (rope_dim != cfg->head_dim)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: %s=%d but the head size is %d; partial rotary embeddings are not supported",
                              c->path, akey(k, c, "rope.dimension_count"), rope_dim, cfg->head_dim);
    cfg->max_context = 0;
    if ((st = get_int(c, "context_length", false, &cfg->max_context, err))) return st;
    if (cfg->max_context == 0) {
        cfg->max_context = 2048;
        loom_log(LOOM_LOG_WARN, "model", "%s: %s missing; assuming 2048 tokens", c->path,
                 akey(k, c, "context_length"));
    }
    return LOOM_OK;
}

/* RoPE scaling from rope.scaling.* (or the older rope.scale_linear); with
 * neither, a rope_freqs.weight tensor may still say Llama-3 scaling. */
static loom_status read_rope_scaling(const gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    char k[KEYLEN];
    loom_gguf_str s;
    loom_status st;
    cfg->rope_scaling = LOOM_ROPE_SCALING_NONE;
    float factor = 0, scale_linear = 0;
    if ((st = get_float(c, "rope.scaling.factor", &factor, err))) return st;
    if ((st = get_float(c, "rope.scale_linear", &scale_linear, err))) return st; /* older converters */
    if ((st = get_int(c, "rope.scaling.original_context_length", false, &cfg->rope_original_context, err)))
        return st;
    if (loom_gguf_get_str(c->g, akey(k, c, "rope.scaling.type"), &s)) {
        if (loom_gguf_str_eq(s, "linear")) {
            cfg->rope_scaling = LOOM_ROPE_SCALING_LINEAR;
            cfg->rope_factor = factor;
        } else if (loom_gguf_str_eq(s, "llama3")) {
            cfg->rope_scaling = LOOM_ROPE_SCALING_LLAMA3;
            cfg->rope_factor = factor;
            cfg->rope_low_freq_factor = 1.0f;
            cfg->rope_high_freq_factor = 4.0f;
            if ((st = get_float(c, "rope.scaling.low_freq_factor", &cfg->rope_low_freq_factor, err))) return st;
            if ((st = get_float(c, "rope.scaling.high_freq_factor", &cfg->rope_high_freq_factor, err))) return st;
            if (cfg->rope_original_context <= 0) cfg->rope_original_context = 8192;
        } else if (!loom_gguf_str_eq(s, "none")) {
            return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                  "%s: %s='%.*s' is not supported (loom supports none, linear and llama3)", c->path,
                                  k, (int)(s.len > 40 ? 40 : s.len), s.ptr);
        }
    } else if (scale_linear > 0 && scale_linear != 1.0f) {
        cfg->rope_scaling = LOOM_ROPE_SCALING_LINEAR;
        cfg->rope_factor = scale_linear;
    }
    const loom_gguf_tensor_info *rf = loom_gguf_find_tensor(c->g, "rope_freqs.weight");
    if (rf && cfg->rope_scaling == LOOM_ROPE_SCALING_NONE) infer_llama3_scaling(cfg, rf, c->path);
    return LOOM_OK;
}

/* Vocabulary: <arch>.vocab_size, else the tokenizer's token list, which may
 * not be longer than the embedding. */
static loom_status read_vocab_size(const gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    char k[KEYLEN];
    loom_gguf_type et;
    uint64_t n_tokens = 0;
    bool have_tokens = loom_gguf_get_arr(c->g, "tokenizer.ggml.tokens", &et, &n_tokens);
    loom_status st;
    cfg->vocab_size = 0;
    if ((st = get_int(c, "vocab_size", false, &cfg->vocab_size, err))) return st;
    if (cfg->vocab_size == 0) {
        if (!have_tokens)
            return loom_error_set(err, LOOM_ERR_FORMAT,
                                  "%s: no vocabulary size (neither %s nor tokenizer.ggml.tokens is present)",
                                  c->path, akey(k, c, "vocab_size"));
        if (n_tokens > INT32_MAX)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: tokenizer.ggml.tokens is too long", c->path);
        cfg->vocab_size = (int32_t)n_tokens;
    } else if (have_tokens && n_tokens > (uint64_t)cfg->vocab_size) {
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: tokenizer.ggml.tokens has %llu tokens but %s=%d; the file is inconsistent",
                              c->path, (unsigned long long)n_tokens, akey(k, c, "vocab_size"), cfg->vocab_size);
    }
    return LOOM_OK;
}

/* BOS/EOS ids when valid, and the name: general.name, else the file name. */
static void read_ids_and_name(const gg_ctx *c, loom_model_config *cfg) {
    int64_t id;
    loom_gguf_str s;
    if (loom_gguf_get_i64(c->g, "tokenizer.ggml.bos_token_id", &id) && id >= 0 && id < INT32_MAX)
        cfg->bos_token_id = (int32_t)id;
    if (loom_gguf_get_i64(c->g, "tokenizer.ggml.eos_token_id", &id) && id >= 0 && id < INT32_MAX)
        cfg->eos_token_id = (int32_t)id;
    if (loom_gguf_get_str(c->g, "general.name", &s)) {
        size_t n = s.len < sizeof cfg->name - 1 ? (size_t)s.len : sizeof cfg->name - 1;
        memcpy(cfg->name, s.ptr, n);
        cfg->name[n] = 0;
    } else {
        const char *b = strrchr(c->path, '/');
        snprintf(cfg->name, sizeof cfg->name, "%s", b ? b + 1 : c->path);
    }
}

/* Gemma 3 (llama.cpp's conventions where the file has no key): every
 * global_every-th layer global (attention.sliding_window_pattern, else 6),
 * the others local over attention.sliding_window tokens (required) with
 * RoPE base rope.freq_base_swa (else 10000, unscaled); query_pre_attn_scalar
 * is not in the file: head_dim, but hidden / heads for the 62-layer 27B;
 * embeddings scaled by sqrt(hidden); GeGLU; QK-norm; post-norms. The
 * converter stored every norm weight as 1 + w, so they multiply as Llama's. */
static loom_status read_gemma3(const gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    char k[KEYLEN];
    loom_status st;
    if ((st = get_int(c, "attention.sliding_window", true, &cfg->sliding_window, err))) return st;
    cfg->global_every = 6;
    if ((st = get_int(c, "attention.sliding_window_pattern", false, &cfg->global_every, err))) return st;
    if (cfg->sliding_window <= 0 || cfg->global_every <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d and the sliding-window pattern %d must be positive",
                              c->path, akey(k, c, "attention.sliding_window"), cfg->sliding_window,
                              cfg->global_every);
    cfg->rope_theta_local = 10000.0f;
    if ((st = get_float(c, "rope.freq_base_swa", &cfg->rope_theta_local, err))) return st;
    if (!(cfg->rope_theta_local > 0))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%g must be positive", c->path,
                              akey(k, c, "rope.freq_base_swa"), (double)cfg->rope_theta_local);
    double pre_attn = cfg->num_layers == 62 ? (double)cfg->hidden_size / cfg->num_heads : cfg->head_dim;
    cfg->attn_scale = (float)(1.0 / sqrt(pre_attn));
    cfg->embed_scale = sqrtf((float)cfg->hidden_size);
    cfg->ffn_act = LOOM_FFN_GELU_TANH;
    cfg->qk_norm = true;
    cfg->post_norms = true;
    return LOOM_OK;
}

/* Mixture of experts: <arch>.expert_count (Mixtral: a "llama" file with
 * experts), expert_used_count, the experts' width (expert_feed_forward_length;
 * Mixtral's is feed_forward_length) and Qwen2-MoE's shared expert
 * (expert_shared_feed_forward_length). Renormalising the kept weights is
 * fixed per architecture, as llama.cpp runs them: Qwen3-MoE and Mixtral
 * do, Qwen2-MoE does not. */
static loom_status read_moe(const gg_ctx *c, loom_model_config *cfg, loom_error *err) {
    loom_status st;
    if ((st = get_int(c, "expert_count", false, &cfg->num_experts, err))) return st;
    const bool qmoe = cfg->arch == LOOM_ARCH_QWEN3_MOE || cfg->arch == LOOM_ARCH_QWEN2_MOE;
    if (cfg->num_experts == 0 && !qmoe) return LOOM_OK;
    char k[KEYLEN];
    if (cfg->num_experts <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s=%d; a %s model needs experts", c->path,
                              akey(k, c, "expert_count"), cfg->num_experts, c->arch);
    if (cfg->arch == LOOM_ARCH_LLAMA) cfg->arch = LOOM_ARCH_MIXTRAL;
    if ((st = get_int(c, "expert_used_count", true, &cfg->num_experts_used, err))) return st;
    cfg->expert_intermediate_size = cfg->intermediate_size;
    if ((st = get_int(c, "expert_feed_forward_length", qmoe, &cfg->expert_intermediate_size, err))) return st;
    if (cfg->arch == LOOM_ARCH_QWEN2_MOE &&
        (st = get_int(c, "expert_shared_feed_forward_length", false, &cfg->shared_expert_intermediate_size, err)))
        return st;
    /* a shared expert without the key: its width from the tensor, never ignored */
    const loom_gguf_tensor_info *sh = loom_gguf_find_tensor(c->g, "blk.0.ffn_up_shexp.weight");
    if (cfg->shared_expert_intermediate_size == 0 && sh && sh->n_dims == 2 && sh->ne[1] <= INT32_MAX)
        cfg->shared_expert_intermediate_size = (int32_t)sh->ne[1];
    cfg->moe_norm_topk = cfg->arch != LOOM_ARCH_QWEN2_MOE;
    if (cfg->arch == LOOM_ARCH_MIXTRAL && loom_gguf_find_tensor(c->g, "blk.0.ffn_gate.0.weight"))
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: experts stored one tensor each (blk.N.ffn_gate.E.weight, an early llama.cpp "
                              "Mixtral layout); convert the model again for stacked blk.N.ffn_gate_exps.weight",
                              c->path);
    return LOOM_OK;
}

static loom_status read_config(gg_ctx *c, loom_model *m, loom_error *err) {
    loom_model_config *cfg = &m->cfg;
    loom_status st;
    if ((st = read_arch(c, cfg, err))) return st;
    if ((st = read_sizes(c, cfg, err))) return st;
    cfg->rope_theta = 10000.0f;
    if ((st = get_float(c, "rope.freq_base", &cfg->rope_theta, err))) return st;
    if (cfg->arch == LOOM_ARCH_GEMMA3 && (st = read_gemma3(c, cfg, err))) return st;
    cfg->rms_norm_eps = !strcmp(c->arch, "llama") ? 1e-5f : 1e-6f;
    if ((st = get_float(c, "attention.layer_norm_rms_epsilon", &cfg->rms_norm_eps, err))) return st;
    if ((st = read_rope_scaling(c, cfg, err))) return st;
    if ((st = read_vocab_size(c, cfg, err))) return st;
    read_ids_and_name(c, cfg);
    cfg->tie_embeddings = loom_gguf_find_tensor(c->g, "output.weight") == NULL;
    cfg->qkv_bias = cfg->arch == LOOM_ARCH_QWEN2 || cfg->arch == LOOM_ARCH_QWEN2_MOE ||
                    loom_gguf_find_tensor(c->g, "blk.0.attn_q.bias") != NULL;
    cfg->qk_norm = cfg->qk_norm || cfg->arch == LOOM_ARCH_QWEN3 || cfg->arch == LOOM_ARCH_QWEN3_MOE;
    return read_moe(c, cfg, err);
}

/* Is name "blk.<N>.attn_q.weight" (or k, or .bias)? Sets *is_q. */
static bool is_qk(const char *name, bool *is_q) {
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    if (strcmp(p, ".attn_q.weight") == 0 || strcmp(p, ".attn_q.bias") == 0) return *is_q = true, true;
    if (strcmp(p, ".attn_k.weight") == 0 || strcmp(p, ".attn_k.bias") == 0) return *is_q = false, true;
    return false;
}

/* The model's directory (for tokenizer files next to it): that of path, or
 * none for an image in memory. */
static loom_status set_dir(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    if (o->data) return LOOM_OK;
    free(m->dir);
    m->dir = loom_strdup(o->path);
    if (!m->dir) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    char *slash = strrchr(m->dir, '/');
    if (slash == m->dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else strcpy(m->dir, ".");
    return LOOM_OK;
}

loom_status lm_load_gguf(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    loom_status st;
    const char *src = o->path && *o->path ? o->path : "<gguf in memory>";
    st = o->data ? loom_gguf_open_buffer(o->data, o->size, src, &m->gguf, err)
                 : loom_gguf_open(o->path, &m->gguf, err);
    if (st) return st;
    gg_ctx c = {.g = m->gguf, .path = src};
    if ((st = read_config(&c, m, err))) return st;
    char kk[11][KEYLEN];
    lm_keys keys = {akey(kk[0], &c, "vocab_size"), akey(kk[1], &c, "embedding_length"),
                    akey(kk[2], &c, "feed_forward_length"), akey(kk[3], &c, "block_count"),
                    akey(kk[4], &c, "attention.head_count"), akey(kk[5], &c, "attention.head_count_kv"),
                    "head_dim", akey(kk[6], &c, "expert_count"), akey(kk[7], &c, "expert_used_count"),
                    akey(kk[8], &c, m->cfg.arch == LOOM_ARCH_MIXTRAL ? "feed_forward_length"
                                                                      : "expert_feed_forward_length"),
                    akey(kk[9], &c, "expert_shared_feed_forward_length")};
    if ((st = lm_check_config(&m->cfg, src, &keys, err))) return st;

    /* tensors: mmap'd views with reversed dims */
    int64_t n = loom_gguf_num_tensors(m->gguf);
    char name[80];
    for (int64_t i = 0; i < n; i++) {
        const loom_gguf_tensor_info *ti = loom_gguf_tensor(m->gguf, i);
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        int64_t shape[4];
        for (uint32_t d = 0; d < ti->n_dims; d++) shape[d] = (int64_t)ti->ne[ti->n_dims - 1 - d];
        if (!ti->supported) {
            if ((st = lm_add_unsupported(m, name, loom_gguf_type_name(ti->ggml_type), err))) return st;
            continue;
        }
        /* GGUF's default alignment is 32; a file with a smaller general.alignment
         * gets its tensors copied to aligned storage, as the kernels expect. */
        void *data = lm_aligned_data(m, (void *)ti->data, ti->nbytes, 32);
        if (!data && ti->data) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %s", name);
        if ((st = lm_add_tensor(m, name, ti->dtype, (int)ti->n_dims, shape, data, ti->nbytes, err)))
            return st;
    }
    if ((st = lm_index(m, src, err))) return st;
    if ((st = lm_validate(m, src, &keys, err))) return st;

    /* undo llama.cpp's Q/K row interleaving (arch llama only, Mixtral included) */
    if (!strcmp(c.arch, "llama")) {
        int32_t done = 0, total = 0;
        bool q;
        for (int32_t i = 0; i < m->n_tensors; i++) total += is_qk(m->names[i], &q);
        for (int32_t i = 0; i < m->n_tensors; i++) {
            loom_tensor *t = &m->tensors[i];
            if (!is_qk(t->name, &q)) continue;
            int32_t heads = q ? m->cfg.num_heads : m->cfg.num_kv_heads;
            int64_t rows = t->shape[0];
            void *copy = lm_alloc(m, t->nbytes);
            if (!copy) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory copying %s", t->name);
            if (loom_model_unpermute_rows(t->data, copy, rows, t->nbytes / (size_t)rows, heads) != LOOM_OK)
                return loom_error_set(err, LOOM_ERR_INTERNAL, "%s: cannot un-permute %s (%lld rows, %d heads)",
                                      src, t->name, (long long)rows, heads);
            t->data = copy;
            lm_progress(o, "gguf: reorder q/k rows", (double)++done / (total ? total : 1));
        }
    }
    return set_dir(m, o, err);
}
