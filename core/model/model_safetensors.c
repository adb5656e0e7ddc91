/*
 * core/model/model_safetensors.c — model config and tensors from a Hugging
 * Face checkpoint directory: config.json + model.safetensors, or
 * model.safetensors.index.json + shards.
 *
 * A .safetensors file is: u64 LE header length N | N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {}}
 * | data (offsets relative to the end of the header). Each shard is mmap'd and
 * every header entry validated (offsets in bounds and consistent with dtype
 * and shape) before any tensor is exposed. HF names are mapped to canonical
 * GGUF names; HF already stores Q/K in NeoX order, so nothing is permuted.
 * Tensors loom does not use (e.g. rotary_emb.inv_freq) are ignored.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model_internal.h"
#include "util/util.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own limit on header size      */
#define ST_MAX_JSON (64u << 20)    /* config.json / index.json size we accept    */

/* ------------------------------------------------------------ files */

static loom_status read_text(const char *path, char **out, loom_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return loom_error_set(err, e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO, "%s: cannot open: %s", path,
                              strerror(e));
    }
    loom_status st = LOOM_OK;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto io;
    long n = ftell(f);
    if (n < 0) goto io;
    if ((unsigned long)n > ST_MAX_JSON) {
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: %ld bytes is too large for a JSON config", path, n);
        goto out;
    }
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (!buf) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) goto io;
    buf[n] = 0;
    *out = buf;
    buf = NULL;
    goto out;
io:
    st = loom_error_set(err, LOOM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
out:
    free(buf);
    fclose(f);
    return st;
}

/* `len` bytes of JSON (a config file's text) named `name` in messages,
 * at most ST_MAX_JSON like a file. */
static loom_status parse_json_text(const char *text, size_t len, const char *name, cJSON **out, loom_error *err) {
    *out = NULL;
    if (len > ST_MAX_JSON)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %zu bytes is too large for a JSON config", name, len);
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out) {
        long at = end ? (long)(end - text) : -1;
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: invalid JSON near byte %ld", name, at);
    }
    return LOOM_OK;
}

static loom_status parse_json_file(const char *path, cJSON **out, loom_error *err) {
    char *text;
    loom_status st = read_text(path, &text, err);
    if (st) return st;
    st = parse_json_text(text, strlen(text), path, out, err);
    free(text);
    return st;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ------------------------------------------------------------ config.json */

typedef struct js_ctx {
    const cJSON *root;
    const char *path;
} js_ctx;

static loom_status js_int_value(const cJSON *it, const char *path, const char *key, int32_t lo, int32_t *v,
                                loom_error *err);

/* Integer field; absent/null keeps *v (error when required). */
static loom_status js_int(const js_ctx *c, const char *key, bool required, int32_t *v, loom_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!it || cJSON_IsNull(it)) {
        if (!required) return LOOM_OK;
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" is missing; is this a causal-LM config.json?",
                              c->path, key);
    }
    if (cJSON_IsArray(it)) it = cJSON_GetArrayItem(it, 0); /* e.g. eos_token_id: [128001, 128009] */
    return js_int_value(it, c->path, key, INT32_MIN, v, err);
}

/* it as an int32 in [lo, INT32_MAX]: an error naming key and value (the
 * conversion of anything else would be undefined behavior). */
static loom_status js_int_value(const cJSON *it, const char *path, const char *key, int32_t lo, int32_t *v,
                                loom_error *err) {
    if (!cJSON_IsNumber(it))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" must be an integer", path, key);
    double x = it->valuedouble;
    if (x != floor(x) || x < lo || x > INT32_MAX) /* false for NaN */
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" = %.17g must be an integer in [%d, %d]", path,
                              key, x, (int)lo, INT32_MAX);
    *v = (int32_t)x;
    return LOOM_OK;
}

/* Float field; absent/null keeps *v. Finite and within float range. */
static loom_status js_num(const cJSON *obj, const char *path, const char *key, float *v, loom_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return LOOM_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    if (fabs(it->valuedouble) > FLT_MAX)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" = %g is out of range for a float", path, key,
                              it->valuedouble);
    *v = (float)it->valuedouble;
    return LOOM_OK;
}

/* The architecture by "architectures", else by "model_type". */
static loom_status read_arch(const cJSON *root, const char *path, loom_model_config *cfg, loom_error *err) {
    static const struct {
        const char *cls, *model_type;
        loom_arch arch;
    } known[] = {
        {"LlamaForCausalLM", "llama", LOOM_ARCH_LLAMA},       {"MistralForCausalLM", "mistral", LOOM_ARCH_LLAMA},
        {"Qwen2ForCausalLM", "qwen2", LOOM_ARCH_QWEN2},       {"Qwen3ForCausalLM", "qwen3", LOOM_ARCH_QWEN3},
        {"Qwen3MoeForCausalLM", "qwen3_moe", LOOM_ARCH_QWEN3_MOE},
        {"Qwen2MoeForCausalLM", "qwen2_moe", LOOM_ARCH_QWEN2_MOE},
        {"MixtralForCausalLM", "mixtral", LOOM_ARCH_MIXTRAL},
    };
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    const char *model_type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (arch ? !strcmp(arch, known[i].cls) : (model_type && !strcmp(model_type, known[i].model_type))) {
            cfg->arch = known[i].arch;
            return LOOM_OK;
        }
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "%s: architecture %s is not supported (loom loads LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                          "Qwen2MoeForCausalLM and MixtralForCausalLM)",
                          path, arch ? arch : model_type ? model_type : "(none given)");
}

/* Mixture-of-experts sizes and routing (loom/model.h). Mixtral:
 * num_local_experts experts of width intermediate_size, always
 * renormalised; Qwen2/3-MoE: num_experts (or num_local_experts) of width
 * moe_intermediate_size,
 * norm_topk_prob (default false, as transformers), Qwen2-MoE's shared
 * expert. Layers with a dense MLP between MoE ones are refused. */
static loom_status read_moe(const js_ctx *c, loom_model_config *cfg, loom_error *err) {
    loom_status st;
    const bool mixtral = cfg->arch == LOOM_ARCH_MIXTRAL;
    if (!mixtral && cfg->arch != LOOM_ARCH_QWEN3_MOE && cfg->arch != LOOM_ARCH_QWEN2_MOE) return LOOM_OK;
    /* the Hub's Qwen configs say num_experts; transformers 5 writes either
     * model's count as num_local_experts */
    const char *nkey = cJSON_GetObjectItemCaseSensitive(c->root, "num_local_experts") ? "num_local_experts"
                                                                                      : "num_experts";
    if ((st = js_int(c, nkey, true, &cfg->num_experts, err)) ||
        (st = js_int(c, "num_experts_per_tok", true, &cfg->num_experts_used, err)))
        return st;
    cfg->expert_intermediate_size = cfg->intermediate_size;
    if (!mixtral && (st = js_int(c, "moe_intermediate_size", true, &cfg->expert_intermediate_size, err)))
        return st;
    /* absent: transformers' Qwen2MoeConfig default, which it would build */
    if (cfg->arch == LOOM_ARCH_QWEN2_MOE) cfg->shared_expert_intermediate_size = 5632;
    if (cfg->arch == LOOM_ARCH_QWEN2_MOE &&
        (st = js_int(c, "shared_expert_intermediate_size", false, &cfg->shared_expert_intermediate_size, err)))
        return st;
    cfg->moe_norm_topk = mixtral || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c->root, "norm_topk_prob"));
    if (cfg->num_experts <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" = %d must be positive", c->path, nkey,
                              cfg->num_experts);
    int32_t step = 1;
    if ((st = js_int(c, "decoder_sparse_step", false, &step, err))) return st;
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(c->root, "mlp_only_layers");
    if (step != 1 || (cJSON_IsArray(only) && cJSON_GetArraySize(only) > 0))
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: decoder_sparse_step=%d with %d mlp_only_layers: loom runs models whose every "
                              "layer is a mixture of experts (decoder_sparse_step 1, mlp_only_layers [])",
                              c->path, step, cJSON_IsArray(only) ? cJSON_GetArraySize(only) : 0);
    return LOOM_OK;
}

/* The sizes; head_dim defaults to hidden_size / num_attention_heads. */
static loom_status read_sizes(const js_ctx *c, loom_model_config *cfg, loom_error *err) {
    loom_status st;
    if ((st = js_int(c, "vocab_size", true, &cfg->vocab_size, err))) return st;
    if ((st = js_int(c, "hidden_size", true, &cfg->hidden_size, err))) return st;
    if ((st = js_int(c, "intermediate_size", true, &cfg->intermediate_size, err))) return st;
    if ((st = js_int(c, "num_hidden_layers", true, &cfg->num_layers, err))) return st;
    if ((st = js_int(c, "num_attention_heads", true, &cfg->num_heads, err))) return st;
    cfg->num_kv_heads = cfg->num_heads;
    if ((st = js_int(c, "num_key_value_heads", false, &cfg->num_kv_heads, err))) return st;
    cfg->head_dim = 0;
    if ((st = js_int(c, "head_dim", false, &cfg->head_dim, err))) return st;
    if (cfg->head_dim == 0) {
        if (cfg->num_heads <= 0 || cfg->hidden_size % cfg->num_heads != 0)
            return loom_error_set(err, LOOM_ERR_FORMAT,
                                  "%s: hidden_size=%d is not a multiple of num_attention_heads=%d (and no head_dim)",
                                  c->path, cfg->hidden_size, cfg->num_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    cfg->max_context = 2048;
    if ((st = js_int(c, "max_position_embeddings", false, &cfg->max_context, err))) return st;
    if (cfg->max_context <= 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"max_position_embeddings\" = %d must be positive",
                              c->path, cfg->max_context);
    return LOOM_OK;
}

/* The rope scaling object rs: llama3 (with its frequency factors), linear,
 * or default; anything else is refused. */
static loom_status read_rope_scaling(const cJSON *rs, const char *path, loom_model_config *cfg, loom_error *err) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    loom_status st;
    cfg->rope_factor = 1.0f;
    if ((st = js_num(rs, path, "factor", &cfg->rope_factor, err))) return st;
    if (!strcmp(t, "llama3")) {
        cfg->rope_scaling = LOOM_ROPE_SCALING_LLAMA3;
        cfg->rope_low_freq_factor = 1.0f;
        cfg->rope_high_freq_factor = 4.0f;
        if ((st = js_num(rs, path, "low_freq_factor", &cfg->rope_low_freq_factor, err))) return st;
        if ((st = js_num(rs, path, "high_freq_factor", &cfg->rope_high_freq_factor, err))) return st;
        const char *k = "original_max_position_embeddings";
        const cJSON *orig = cJSON_GetObjectItemCaseSensitive(rs, k);
        cfg->rope_original_context = 8192;
        if (orig && !cJSON_IsNull(orig) && (st = js_int_value(orig, path, k, 1, &cfg->rope_original_context, err)))
            return st;
    } else if (!strcmp(t, "linear")) {
        cfg->rope_scaling = LOOM_ROPE_SCALING_LINEAR;
    } else if (strcmp(t, "default") != 0) {
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: rope_scaling type \"%s\" is not supported (loom supports llama3 and linear)",
                              path, t);
    }
    return LOOM_OK;
}

/* config.json's parsed `root` (named `path` in messages) into cfg. */
static loom_status read_config(const cJSON *root, const char *path, loom_model_config *cfg, loom_error *err) {
    loom_status st = LOOM_OK;
    js_ctx c = {root, path};
    if (!cJSON_IsObject(root)) return loom_error_set(err, LOOM_ERR_FORMAT, "%s: expected a JSON object", path);
    if ((st = read_arch(root, path, cfg, err))) return st;
    if ((st = read_sizes(&c, cfg, err))) return st;
    /* transformers >= 5 writes rope settings (theta included) into a
     * `rope_parameters` object; earlier versions use top-level rope_theta
     * and a `rope_scaling` object. Accept both. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    cfg->rope_theta = 10000.0f;
    if ((st = js_num(root, path, "rope_theta", &cfg->rope_theta, err))) return st;
    if (cJSON_IsObject(rp) && (st = js_num(rp, path, "rope_theta", &cfg->rope_theta, err))) return st;
    cfg->rms_norm_eps = 1e-6f;
    if ((st = js_num(root, path, "rms_norm_eps", &cfg->rms_norm_eps, err))) return st;
    if ((st = js_int(&c, "bos_token_id", false, &cfg->bos_token_id, err))) return st;
    if ((st = js_int(&c, "eos_token_id", false, &cfg->eos_token_id, err))) return st;
    cfg->tie_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
    cfg->qkv_bias = cfg->arch == LOOM_ARCH_QWEN2 || cfg->arch == LOOM_ARCH_QWEN2_MOE ||
                    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias"));
    cfg->qk_norm = cfg->qk_norm || cfg->arch == LOOM_ARCH_QWEN3 || cfg->arch == LOOM_ARCH_QWEN3_MOE;
    if ((st = read_moe(&c, cfg, err))) return st;

    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    const cJSON *use_sw = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (cJSON_IsNumber(sw) && sw->valuedouble < cfg->max_context && !cJSON_IsFalse(use_sw))
        loom_log(LOOM_LOG_WARN, "model", "%s: sliding_window=%g is ignored; attention is full-context", path,
                 sw->valuedouble);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(rs)) rs = rp;
    if (cJSON_IsObject(rs) && (st = read_rope_scaling(rs, path, cfg, err))) return st;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    if (cJSON_IsString(nm) && nm->valuestring[0]) snprintf(cfg->name, sizeof cfg->name, "%s", nm->valuestring);
    return LOOM_OK;
}

/* ------------------------------------------------------------ packed 4-bit */

/* Case-insensitive string field of `obj`, or `dflt` when absent/null; NULL
 * when present but not a string. */
static const char *js_str(const cJSON *obj, const char *key, const char *dflt) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return dflt;
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Integer field under the first of `keys` present (AutoAWQ's own files say
 * w_bit / q_group_size, transformers' config.json bits / group_size). */
static loom_status js_int_any(const cJSON *obj, const char *where, const char *const *keys, int32_t *v,
                              bool *found, loom_error *err) {
    *found = false;
    for (; *keys; keys++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, *keys);
        if (!it || cJSON_IsNull(it)) continue;
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || fabs(it->valuedouble) > 1e9)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" must be an integer", where, *keys);
        *v = (int32_t)it->valuedouble;
        *found = true;
        return LOOM_OK;
    }
    return LOOM_OK;
}

/* Fill m->packing from a quantization config object `q` read from `where`
 * (config.json's quantization_config, or AutoGPTQ's quantize_config.json /
 * AutoAWQ's quant_config.json, whose quant_method may be implicit:
 * `dflt_method`). Anything loom cannot run exactly is refused here, before
 * a tensor is mapped. */
static loom_status read_packing(loom_model *m, const cJSON *q, const char *where, const char *dflt_method,
                                loom_error *err) {
    if (!cJSON_IsObject(q))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: the quantization config must be a JSON object", where);
    const char *method = js_str(q, "quant_method", dflt_method);
    if (!method)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"quant_method\" is missing or not a string", where);
    bool awq = !strcasecmp(method, "awq"), gptq = !strcasecmp(method, "gptq");
    if (!awq && !gptq)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: quant_method \"%s\" is not supported; loom loads float (f32/f16/bf16) "
                              "safetensors and 4-bit AWQ (GEMM) or GPTQ checkpoints",
                              where, method);
    static const char *const bits_keys[] = {"bits", "w_bit", NULL};
    static const char *const group_keys[] = {"group_size", "q_group_size", NULL};
    int32_t bits = 0, group = 0;
    bool have_bits, have_group;
    loom_status st;
    if ((st = js_int_any(q, where, bits_keys, &bits, &have_bits, err)) ||
        (st = js_int_any(q, where, group_keys, &group, &have_group, err)))
        return st;
    if (!have_bits || !have_group)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s needs \"bits\" and \"group_size\"", where,
                              awq ? "AWQ" : "GPTQ");
    if (bits != 4)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: %d-bit %s is not supported; loom runs 4-bit AWQ/GPTQ checkpoints only", where,
                              bits, awq ? "AWQ" : "GPTQ");
    if (group == -1)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: group_size -1 (one group per output channel) is not supported; loom's int4 "
                              "layout takes one group size for every tensor (use a checkpoint with group_size "
                              "32, 64 or 128)",
                              where);
    if (group < 2 || group % 2 != 0 || group > (1 << 20))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: group_size %d must be a positive even number", where,
                              group);
    const char *name = awq ? "awq" : "gptq";
    bool desc_act = false;
    if (awq) {
        const char *version = js_str(q, "version", "gemm");
        if (!version || strcasecmp(version, "gemm") != 0)
            return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                  "%s: AWQ version \"%s\" is not supported; loom reads the GEMM packing "
                                  "(qweight (in, out/8)); GEMV / Marlin / ExLlama packings differ",
                                  where, version ? version : "(not a string)");
        const cJSON *zp = cJSON_GetObjectItemCaseSensitive(q, "zero_point");
        if (cJSON_IsFalse(zp))
            return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                  "%s: AWQ with zero_point false (symmetric, no qzeros) is not supported", where);
    } else {
        const char *fmt = js_str(q, "checkpoint_format", "gptq");
        if (fmt && !strcasecmp(fmt, "gptq_v2")) name = "gptq_v2";
        else if (!fmt || strcasecmp(fmt, "gptq") != 0)
            return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                  "%s: GPTQ checkpoint_format \"%s\" is not supported; loom reads \"gptq\" (v1: "
                                  "stored zeros are zero - 1) and \"gptq_v2\" (real zeros)",
                                  where, fmt ? fmt : "(not a string)");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "is_marlin_format")))
            return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                  "%s: Marlin-packed GPTQ (is_marlin_format) is not supported; use the plain GPTQ "
                                  "checkpoint",
                                  where);
        desc_act = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "desc_act"));
    }
    snprintf(m->packing_src, sizeof m->packing_src, "%s", where);
    m->packing = (loom_model_packing){.struct_size = sizeof m->packing, .method = name, .bits = bits, .group_size = group, .desc_act = desc_act,
                                      .source = m->packing_src};
    return LOOM_OK;
}

/* The checkpoint's quantization config: config.json's quantization_config
 * (transformers writes it there), else the quantizer's own file next to
 * it. No config anywhere: a float checkpoint, m->packing stays empty. */
static loom_status find_packing(loom_model *m, const cJSON *root, char *path, size_t cap, loom_error *err) {
    loom_status st = LOOM_OK;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q && !cJSON_IsNull(q)) return read_packing(m, q, "config.json quantization_config", NULL, err);
    if (!m->dir) return LOOM_OK; /* in memory: config.json is all there is */
    static const struct {
        const char *file, *method;
    } own[] = {
        {"quantize_config.json", "gptq"},     /* AutoGPTQ / GPTQModel          */
        {"quant_config.json", "awq"},         /* AutoAWQ                       */
        {"quantization_config.json", "awq"},  /* older AWQ exports             */
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        snprintf(path, cap, "%s/%s", m->dir, own[i].file);
        if (!file_exists(path)) continue;
        cJSON *qj = NULL;
        if ((st = parse_json_file(path, &qj, err))) return st;
        st = read_packing(m, qj, own[i].file, own[i].method, err);
        cJSON_Delete(qj);
        return st;
    }
    return st;
}

/* ------------------------------------------------------------ names */

/* One routed expert's matrix, `rest` of "model.layers.<layer>.<rest>":
 * mlp.experts.E.{gate,up,down}_proj.weight (Qwen MoE) or
 * block_sparse_moe.experts.E.w{1,3,2}.weight (Mixtral) -> the stacked
 * tensor's name with "#E" appended; stack_experts() assembles them. */
static bool map_expert(long layer, const char *rest, char *out, size_t cap) {
    static const struct {
        const char *prefix, *gate, *up, *down;
    } forms[] = {{"mlp.experts.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"},
                 {"block_sparse_moe.experts.", "w1.weight", "w3.weight", "w2.weight"}};
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        size_t np = strlen(forms[f].prefix);
        if (strncmp(rest, forms[f].prefix, np) != 0 || rest[np] < '0' || rest[np] > '9') continue;
        char *end;
        errno = 0;
        long e = strtol(rest + np, &end, 10);
        if (errno || e < 0 || e > 1000000 || *end != '.') return false;
        const char *kind = !strcmp(end + 1, forms[f].gate) ? "ffn_gate_exps"
                           : !strcmp(end + 1, forms[f].up) ? "ffn_up_exps"
                           : !strcmp(end + 1, forms[f].down) ? "ffn_down_exps"
                                                             : NULL;
        return kind && snprintf(out, cap, "blk.%ld.%s.weight#%ld", layer, kind, e) < (int)cap;
    }
    return false;
}

/* HF name -> canonical for plain tensors; false for tensors loom does not use. */
static bool map_plain(const char *hf, char *out, size_t cap) {
    static const struct {
        const char *hf, *gg;
    } top[] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(hf, top[i].hf)) return snprintf(out, cap, "%s", top[i].gg) < (int)cap;
    static const struct {
        const char *hf, *gg;
    } layer[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
        {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    };
    const char *p = hf;
    if (strncmp(p, "model.layers.", 13) != 0) return false;
    p += 13;
    if (*p < '0' || *p > '9') return false;
    char *end;
    errno = 0;
    long n = strtol(p, &end, 10);
    if (errno || n < 0 || n > 100000 || *end != '.') return false;
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        if (!strcmp(end + 1, layer[i].hf)) return snprintf(out, cap, "blk.%ld.%s", n, layer[i].gg) < (int)cap;
    return map_expert(n, end + 1, out, cap);
}

/* The parts of a packed 4-bit Linear, next to where its .weight would be. */
static const char *const k_packed_sfx[] = {".qweight", ".qzeros", ".scales", ".g_idx"};
#define ST_NPACKED ((int)(sizeof k_packed_sfx / sizeof k_packed_sfx[0]))

/* Index in k_packed_sfx of `name`'s suffix, or -1. */
static int packed_part(const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < ST_NPACKED; i++) {
        size_t k = strlen(k_packed_sfx[i]);
        if (n > k && !strcmp(name + n - k, k_packed_sfx[i])) return i;
    }
    return -1;
}

/* A canonical .weight that is a linear layer (may be packed). */
static bool linear_canon(const char *canon) {
    static const char *const lin[] = {".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                                      ".attn_output.weight", ".ffn_gate.weight", ".ffn_up.weight",
                                      ".ffn_down.weight"};
    if (!strcmp(canon, "output.weight")) return true;
    size_t n = strlen(canon);
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        size_t k = strlen(lin[i]);
        if (n > k && !strncmp(canon, "blk.", 4) && !strcmp(canon + n - k, lin[i])) return true;
    }
    return false;
}

/* HF name -> canonical: plain tensors, and the packed parts of a linear
 * layer (model.layers.3.self_attn.q_proj.qzeros -> blk.3.attn_q.qzeros).
 * false for tensors loom does not use. */
static bool map_name(const char *hf, char *out, size_t cap) {
    if (map_plain(hf, out, cap)) return true;
    int part = packed_part(hf);
    if (part < 0) return false;
    char stem[256], canon[128];
    size_t n = strlen(hf) - strlen(k_packed_sfx[part]);
    if (snprintf(stem, sizeof stem, "%.*s.weight", (int)n, hf) >= (int)sizeof stem) return false;
    if (!map_plain(stem, canon, sizeof canon) || !linear_canon(canon)) return false;
    return snprintf(out, cap, "%.*s%s", (int)(strlen(canon) - 7), canon, k_packed_sfx[part]) < (int)cap;
}

/* ------------------------------------------------------------ one shard */

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Parse the JSON header of the safetensors bytes at base (size bytes,
 * named `file`): *hdr (caller deletes) and the data section, which starts
 * right after the header. */
static loom_status parse_shard(const uint8_t *base, size_t size, const char *file, const uint8_t **data,
                               uint64_t *data_size, cJSON **hdr, loom_error *err) {
    if (size < 8)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: truncated at byte %zu while reading the header length (file has %zu bytes); "
                              "download the shard again",
                              file, size, size);
    uint64_t hlen = le64(base);
    if (hlen > ST_MAX_HEADER || hlen > size - 8)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: header length %llu at byte 0 exceeds the file (%zu bytes) or the 100 MB limit; "
                              "not a safetensors file or truncated",
                              file, (unsigned long long)hlen, size);
    const char *hjson = (const char *)base + 8;
    const char *end = NULL;
    *hdr = cJSON_ParseWithLengthOpts(hjson, (size_t)hlen, &end, 0);
    if (!*hdr || !cJSON_IsObject(*hdr)) {
        long at = end ? (long)(end - (const char *)base) : 8;
        cJSON_Delete(*hdr);
        *hdr = NULL;
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: header is not a valid JSON object (error near byte %ld)",
                              file, at);
    }
    *data = base + 8 + hlen;
    *data_size = size - 8 - hlen;
    return LOOM_OK;
}

/* One header entry, its geometry checked against the data section. */
typedef struct st_entry {
    const char *hf;                       /* the checkpoint's name for it        */
    const char *dts;                      /* its "dtype" string                  */
    int nd;
    int64_t shape[LOOM_TENSOR_MAX_DIMS];
    uint64_t numel;                       /* elements                            */
    uint64_t ob[2];                       /* data_offsets [begin, end), in bytes */
} st_entry;

/* A whole number in [0, 9e15), as shapes and offsets must be. */
static bool js_count(const cJSON *d) {
    return cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < 9.0e15 &&
           d->valuedouble == floor(d->valuedouble);
}

/* The entry has dtype, shape and data_offsets; the shape's element count does
 * not overflow and the offsets lie inside the data section. */
static loom_status read_entry(const cJSON *e, const char *file, uint64_t data_size, st_entry *t,
                              loom_error *err) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shp = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    t->hf = e->string;
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shp) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: header entry %s needs \"dtype\", \"shape\" and two \"data_offsets\"", file, t->hf);
    t->dts = dt->valuestring;
    t->nd = cJSON_GetArraySize(shp);
    t->numel = 1;
    memset(t->shape, 0, sizeof t->shape);
    bool shape_ok = t->nd <= LOOM_TENSOR_MAX_DIMS;
    for (int i = 0; shape_ok && i < t->nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(shp, i);
        shape_ok = js_count(d);
        if (shape_ok) {
            t->shape[i] = (int64_t)d->valuedouble;
            shape_ok = t->shape[i] == 0 || t->numel <= (uint64_t)INT64_MAX / (uint64_t)t->shape[i];
            t->numel *= (uint64_t)t->shape[i];
        }
    }
    bool offs_ok = true;
    for (int i = 0; i < 2; i++) {
        const cJSON *d = cJSON_GetArrayItem(offs, i);
        offs_ok = offs_ok && js_count(d);
        t->ob[i] = offs_ok ? (uint64_t)d->valuedouble : 0;
    }
    if (!shape_ok || !offs_ok || t->ob[0] > t->ob[1] || t->ob[1] > data_size)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: tensor %s: %s (data section is %llu bytes); the file is damaged or truncated",
                              file, t->hf,
                              !shape_ok ? "invalid shape"
                              : !offs_ok || t->ob[0] > t->ob[1] ? "invalid data_offsets"
                              : "data_offsets point past the end of the file",
                              (unsigned long long)data_size);
    return LOOM_OK;
}

/* The loom dtype of a safetensors dtype string and its element size in
 * bytes; esz 0 for a dtype loom does not read. I32 holds packed 4-bit words
 * and g_idx. */
static size_t st_dtype(const char *dts, loom_dtype *dtype) {
    *dtype = LOOM_DTYPE_COUNT;
    if (!strcmp(dts, "F32")) return *dtype = LOOM_DTYPE_F32, 4;
    if (!strcmp(dts, "F16")) return *dtype = LOOM_DTYPE_F16, 2;
    if (!strcmp(dts, "BF16")) return *dtype = LOOM_DTYPE_BF16, 2;
    if (!strcmp(dts, "I32")) return *dtype = LOOM_DTYPE_I32, 4;
    return 0;
}

/* Add entry t under its canonical name when loom uses it; refuse a size,
 * dtype or packing that does not fit, warn when the index (weight_map, may
 * be NULL) lists it for another shard. */
static loom_status add_entry(loom_model *m, const char *file, const st_entry *t, const uint8_t *data,
                             const cJSON *weight_map, const char *shard_name, loom_error *err) {
    char canon[96];
    loom_dtype dtype;
    size_t esz = st_dtype(t->dts, &dtype);
    bool used = map_name(t->hf, canon, sizeof canon);
    bool packed = used && packed_part(canon) >= 0;
    if (esz && (t->ob[1] - t->ob[0]) / esz != t->numel)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: tensor %s: %llu bytes of data but %s shape needs %llu elements; the file is "
                              "damaged",
                              file, t->hf, (unsigned long long)(t->ob[1] - t->ob[0]), t->dts,
                              (unsigned long long)t->numel);
    if (!used) {
        loom_log(LOOM_LOG_DEBUG, "model", "%s: ignoring tensor %s", file, t->hf);
        return LOOM_OK;
    }
    if (packed && strstr(t->hf, ".experts."))
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: tensor %s: packed 4-bit (AWQ/GPTQ) experts are not supported; use the float "
                              "checkpoint (a quantizer plugin can quantize it at load)",
                              file, t->hf);
    if (packed && !m->packing.method)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: tensor %s is part of a packed 4-bit AWQ/GPTQ layer, but config.json has no "
                              "quantization_config (and there is no quantize_config.json); the config does not "
                              "belong to these weights",
                              file, t->hf);
    if (esz && dtype == LOOM_DTYPE_I32 && !packed)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: tensor %s has dtype I32; only the qweight / qzeros / g_idx of AWQ/GPTQ layers "
                              "may be integers",
                              file, t->hf);
    if (!esz)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: tensor %s has dtype %s; loom reads F32, F16 and BF16 safetensors (convert the "
                              "checkpoint, e.g. save it with torch_dtype=bfloat16)",
                              file, t->hf, t->dts);
    if (t->nd == 0)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: tensor %s is a scalar; expected a vector or matrix", file,
                              t->hf);
    if (weight_map) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(weight_map, t->hf);
        if (!cJSON_IsString(w) || strcmp(w->valuestring, shard_name) != 0)
            loom_log(LOOM_LOG_WARN, "model", "%s: tensor %s is not listed for this shard in the index", file,
                     t->hf);
    }
    return lm_add_tensor(m, canon, dtype, t->nd, t->shape, (void *)(data + t->ob[0]), (size_t)(t->ob[1] - t->ob[0]),
                         err);
}

/* Validate the header of a shard's bytes (`file` names them) and add the
 * tensors loom uses. With an index (`weight_map`), tensors the index assigns
 * elsewhere are warned about; the caller checks afterwards that every
 * indexed tensor was found. */
static loom_status shard_entries(loom_model *m, const char *file, const uint8_t *base, size_t size,
                                 const cJSON *weight_map, const char *shard_name, loom_error *err) {
    const uint8_t *data;
    uint64_t data_size;
    cJSON *hdr = NULL;
    loom_status st = parse_shard(base, size, file, &data, &data_size, &hdr, err);
    if (st) return st;
    const cJSON *e;
    cJSON_ArrayForEach(e, hdr) {
        st_entry t;
        if (!strcmp(e->string, "__metadata__")) continue;
        if ((st = read_entry(e, file, data_size, &t, err))) goto free_hdr;
        if ((st = add_entry(m, file, &t, data, weight_map, shard_name, err))) goto free_hdr;
    }
free_hdr:
    cJSON_Delete(hdr);
    return st;
}

/* Map `file` and add its tensors (shard_entries). */
static loom_status load_shard(loom_model *m, const char *file, const cJSON *weight_map, const char *shard_name,
                              loom_error *err) {
    const void *addr;
    size_t size;
    loom_status st = lm_map_file(m, file, &addr, &size, err);
    if (st) return st;
    return shard_entries(m, file, addr, size, weight_map, shard_name, err);
}

/* ------------------------------------------------------------ packed layers */

/* What messages name the checkpoint by: its directory, or (in memory) none. */
static const char *st_where(const loom_model *m) { return m->dir ? m->dir : "<safetensors in memory>"; }

/* (out, in) of linear `canon` (a canonical .weight name) from the config. */
static void linear_dims(const loom_model_config *c, const char *canon, int64_t *n, int64_t *k) {
    const int64_t H = c->hidden_size, I = c->intermediate_size, QD = (int64_t)c->num_heads * c->head_dim,
                  KVD = (int64_t)c->num_kv_heads * c->head_dim;
    *n = H, *k = H;
    if (!strcmp(canon, "output.weight")) *n = c->vocab_size;
    else if (strstr(canon, ".attn_q.")) *n = QD;
    else if (strstr(canon, ".attn_k.") || strstr(canon, ".attn_v.")) *n = KVD;
    else if (strstr(canon, ".attn_output.")) *k = QD;
    else if (strstr(canon, ".ffn_gate.") || strstr(canon, ".ffn_up.")) *n = I;
    else if (strstr(canon, ".ffn_down.")) *k = I;
}

static bool is_2d(const loom_tensor *t, int64_t d0, int64_t d1) {
    return t && t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

static void shape_str(const loom_tensor *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "(");
    for (int i = 0; i < t->ndim && n < (int)cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, ")");
}

/* Check one packed layer `stem` (canonical, without suffix) against the
 * config and the packing; its shape-only `<stem>.weight` descriptor is
 * (*n out, *k in) of type *dt (that of the scales). Layouts (int32 words,
 * 8 nibbles each; g = group_size):
 *   AWQ   qweight (in, out/8)  qzeros (in/g, out/8)  scales (in/g, out)
 *   GPTQ  qweight (in/8, out)  qzeros (in/g, out/8)  scales (in/g, out)  g_idx (in)
 * The int4 quantizer reads the nibbles; here only shapes and types. */
static loom_status check_packed_layer(loom_model *m, const char *stem, int64_t *n_out, int64_t *k_out,
                                     loom_dtype *dt, loom_error *err) {
    const loom_model_packing *pk = &m->packing;
    const char *src = m->packing_src;
    bool awq = !strcmp(pk->method, "awq");
    char nm[ST_NPACKED][176], wname[176], a[64], b[64];
    const loom_tensor *t[ST_NPACKED];
    for (int i = 0; i < ST_NPACKED; i++) {
        snprintf(nm[i], sizeof nm[i], "%s%s", stem, k_packed_sfx[i]);
        t[i] = lm_find(m, nm[i]);
    }
    const loom_tensor *qw = t[0], *qz = t[1], *sc = t[2], *gi = t[3];
    snprintf(wname, sizeof wname, "%s.weight", stem);
    if (lm_find(m, wname))
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: layer %s is stored twice, as float %s and as packed %s; the checkpoint is "
                              "inconsistent",
                              st_where(m), stem, wname, nm[0]);
    if (!qw || !qz || !sc)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: packed layer %s has no %s; a %s checkpoint stores qweight, qzeros and scales for "
                              "every quantized linear (the download is incomplete or not %s)",
                              st_where(m), stem, !qw ? nm[0] : !qz ? nm[1] : nm[2], pk->method, pk->method);
    int64_t n, k;
    linear_dims(&m->cfg, wname, &n, &k);
    const int64_t g = pk->group_size;
    if (qw->dtype != LOOM_DTYPE_I32 || qz->dtype != LOOM_DTYPE_I32)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is %s; packed 4-bit words must be I32", st_where(m),
                              qw->dtype != LOOM_DTYPE_I32 ? nm[0] : nm[1],
                              loom_dtype_name(qw->dtype != LOOM_DTYPE_I32 ? qw->dtype : qz->dtype));
    if (n % 8 || k % 8)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s would be (%lld out, %lld in); 4-bit packing needs both to be multiples of 8",
                              st_where(m), wname, (long long)n, (long long)k);
    int64_t want0 = awq ? k : k / 8, want1 = awq ? n / 8 : n;
    if (!is_2d(qw, want0, want1)) {
        shape_str(qw, a, sizeof a);
        bool other = awq ? is_2d(qw, k / 8, n) : is_2d(qw, k, n / 8);
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s has shape %s, but a (%lld out, %lld in) layer packed as %s (%s) needs "
                              "(%lld, %lld)%s",
                              st_where(m), nm[0], a, (long long)n, (long long)k, pk->method, src, (long long)want0,
                              (long long)want1,
                              other ? (awq ? "; that is the GPTQ layout (in/8, out): the quantization config "
                                             "does not match the weights"
                                           : "; that is the AWQ layout (in, out/8): the quantization config "
                                             "does not match the weights")
                                    : "; the weights do not match config.json's sizes");
    }
    if (k % g)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: group_size %lld (%s) does not divide the %lld inputs of %s; the checkpoint "
                              "cannot have been made with that group size",
                              st_where(m), (long long)g, src, (long long)k, wname);
    if (sc->dtype != LOOM_DTYPE_F16 && sc->dtype != LOOM_DTYPE_BF16 && sc->dtype != LOOM_DTYPE_F32)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is %s; scales must be F16, BF16 or F32", st_where(m),
                              nm[2], loom_dtype_name(sc->dtype));
    if (!is_2d(sc, k / g, n) || !is_2d(qz, k / g, n / 8)) {
        const loom_tensor *bad = !is_2d(sc, k / g, n) ? sc : qz;
        shape_str(bad, a, sizeof a);
        snprintf(b, sizeof b, "(%lld, %lld)", (long long)(k / g), (long long)(bad == sc ? n : n / 8));
        char hint[128] = "";
        if (bad->ndim == 2 && bad->shape[0] > 0 && k % bad->shape[0] == 0 && bad->shape[0] != k / g)
            snprintf(hint, sizeof hint, "; its %lld rows mean groups of %lld inputs", (long long)bad->shape[0],
                     (long long)(k / bad->shape[0]));
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: %s has shape %s, expected %s for %lld inputs in groups of %lld (%s)%s", st_where(m),
                              bad == sc ? nm[2] : nm[1], a, b, (long long)k, (long long)g, src, hint);
    }
    if (gi && !awq && (gi->dtype != LOOM_DTYPE_I32 || gi->ndim != 1 || gi->shape[0] != k)) {
        shape_str(gi, a, sizeof a);
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is %s %s; expected I32 (%lld), one group per input",
                              st_where(m), nm[3], loom_dtype_name(gi->dtype), a, (long long)k);
    }
    *n_out = n, *k_out = k, *dt = sc->dtype;
    return LOOM_OK;
}

/* After every shard is mapped and indexed: each packed layer checked, then
 * given its .weight descriptor (data NULL, nbytes 0); stray parts and a
 * config that promises packing the weights lack are refused. Re-indexes. */
static loom_status finish_packed(loom_model *m, loom_error *err) {
    loom_status st = LOOM_OK;
    int32_t n0 = m->n_tensors, layers = 0;
    char stem[160];
    /* the stems of every packed layer, found before anything is added:
     * lm_find's index covers only the tensors present when it was built */
    struct packed_desc {
        int32_t qweight;   /* tensor index of <stem>.qweight */
        int64_t n, k;
        loom_dtype dt;
    } *pd = calloc((size_t)n0 + 1, sizeof *pd);
    if (!pd) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n0; i++) {
        const char *nm = m->names[i];
        int part = packed_part(nm);
        if (part < 0) continue;
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(nm) - strlen(k_packed_sfx[part])), nm);
        if (part != 0) {
            char q[176];
            snprintf(q, sizeof q, "%s.qweight", stem);
            if (!lm_find(m, q)) {
                st = loom_error_set(err, LOOM_ERR_FORMAT,
                                    "%s: %s has no %s next to it; the checkpoint is incomplete", st_where(m), nm, q);
                goto out;
            }
            continue;
        }
        pd[layers].qweight = i;
        if ((st = check_packed_layer(m, stem, &pd[layers].n, &pd[layers].k, &pd[layers].dt, err))) goto out;
        layers++;
    }
    if (m->packing.method && layers == 0) {
        st = loom_error_set(err, LOOM_ERR_FORMAT,
                            "%s: %s declares a 4-bit %s checkpoint, but no tensor is packed (no *.qweight); "
                            "remove the quantization config or download the quantized weights",
                            st_where(m), m->packing_src, m->packing.method);
        goto out;
    }
    for (int32_t j = 0; j < layers; j++) {
        char wname[176];
        const char *q = m->names[pd[j].qweight];
        snprintf(wname, sizeof wname, "%.*s.weight", (int)(strlen(q) - 8), q);
        int64_t shape[2] = {pd[j].n, pd[j].k};
        if ((st = lm_add_tensor(m, wname, pd[j].dt, 2, shape, NULL, 0, err))) goto out;
    }
    if (layers)
        loom_log(LOOM_LOG_INFO, "model", "%s: %d linear layers packed as 4-bit %s, groups of %d%s", st_where(m), layers,
                 m->packing.method, m->packing.group_size, m->packing.desc_act ? ", act-order" : "");
    st = lm_index(m, st_where(m), err);
out:
    free(pd);
    return st;
}

/* A shard file name from the index must be a plain name inside the directory. */
static bool safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* ------------------------------------------------------------ the loader */

static const lm_keys k_config_keys = {
    "config.json vocab_size", "config.json hidden_size", "config.json intermediate_size",
    "config.json num_hidden_layers", "config.json num_attention_heads",
    "config.json num_key_value_heads", "config.json head_dim", "config.json num_experts",
    "config.json num_experts_per_tok", "config.json moe_intermediate_size",
    "config.json shared_expert_intermediate_size"};

/* The model directory: o->path itself, or the directory of a file in it
 * (then *single names that file, a pointer into o->path). */
static loom_status find_dir(loom_model *m, const loom_model_load_opts *o, const char **single, loom_error *err) {
    struct stat sb;
    *single = NULL;
    if (stat(o->path, &sb) != 0)
        return loom_error_set(err, LOOM_ERR_NOT_FOUND, "%s: %s", o->path, strerror(errno));
    m->dir = loom_strdup(o->path);
    if (!m->dir) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if (!S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(m->dir, '/');
        *single = slash ? o->path + (slash - m->dir) + 1 : o->path;
        if (slash == m->dir) slash[1] = 0;
        else if (slash) *slash = 0;
        else strcpy(m->dir, ".");
    } else {
        size_t n = strlen(m->dir);
        while (n > 1 && m->dir[n - 1] == '/') m->dir[--n] = 0;
    }
    return LOOM_OK;
}

/* config.json's parsed root (named `src`): the hyper-parameters, the
 * packing, the model's name, all checked; probe is scratch of cap bytes. */
static loom_status apply_config(loom_model *m, const cJSON *root, const char *src, char *probe, size_t cap,
                                loom_error *err) {
    loom_status st;
    if ((st = read_config(root, src, &m->cfg, err))) return st;
    if ((st = find_packing(m, root, probe, cap, err))) return st;
    if (!m->cfg.name[0]) {
        const char *d = m->dir ? m->dir : src, *b = strrchr(d, '/');
        snprintf(m->cfg.name, sizeof m->cfg.name, "%s", b && b[1] ? b + 1 : d);
    }
    return lm_check_config(&m->cfg, src, &k_config_keys, err);
}

/* config.json (required), its packing, the model's name and tokenizer.json;
 * path is scratch of cap bytes. */
static loom_status read_dir_config(loom_model *m, char *path, size_t cap, loom_error *err) {
    char probe[PATH_MAX];
    loom_status st;
    snprintf(path, cap, "%s/config.json", m->dir);
    if (!file_exists(path))
        return loom_error_set(err, LOOM_ERR_NOT_FOUND,
                              "%s: no config.json; a safetensors model directory needs config.json next to the "
                              "weights (download the whole Hugging Face repository)",
                              m->dir);
    cJSON *root = NULL;
    if ((st = parse_json_file(path, &root, err))) return st;
    st = apply_config(m, root, path, probe, sizeof probe, err);
    cJSON_Delete(root);
    if (st) return st;
    snprintf(path, cap, "%s/tokenizer.json", m->dir);
    if (file_exists(path) && !(m->tokenizer_json = loom_strdup(path)))
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    return LOOM_OK;
}

/* Load every shard the index's weight_map names, each once in order of first
 * appearance, then check that every mapped entry was found in its shard. */
static loom_status load_indexed(loom_model *m, const loom_model_load_opts *o, const char *idx_path, char *path,
                                size_t cap, loom_error *err) {
    cJSON *index = NULL;
    loom_status st = parse_json_file(idx_path, &index, err);
    if (st) return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: no \"weight_map\" object", idx_path);
        goto free_index;
    }
    int n = cJSON_GetArraySize(wm), k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        k++;
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: weight_map entry %s must name a shard file in the same directory",
                                idx_path, e->string);
            goto free_index;
        }
        bool seen = false;
        for (const cJSON *p = wm->child; p != e && !seen; p = p->next)
            seen = cJSON_IsString(p) && !strcmp(p->valuestring, e->valuestring);
        if (seen) continue;
        snprintf(path, cap, "%s/%s", m->dir, e->valuestring);
        if ((st = load_shard(m, path, wm, e->valuestring, err))) goto free_index;
        lm_progress(o, "safetensors: map shards", (double)k / n);
    }
    if ((st = lm_index(m, idx_path, err))) goto free_index;
    char canon[96];
    cJSON_ArrayForEach(e, wm) {
        if (map_name(e->string, canon, sizeof canon) && !lm_find(m, canon)) {
            st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is listed in shard %s but not present in it",
                                idx_path, e->string, e->valuestring);
            goto free_index;
        }
    }
free_index:
    cJSON_Delete(index);
    return st;
}

/* One file: the one given (single) or the directory's model.safetensors. */
static loom_status load_single(loom_model *m, const loom_model_load_opts *o, const char *single, char *path,
                               size_t cap, loom_error *err) {
    loom_status st;
    if (single) snprintf(path, cap, "%s", o->path);
    else snprintf(path, cap, "%s/model.safetensors", m->dir);
    if (!file_exists(path))
        return loom_error_set(err, LOOM_ERR_NOT_FOUND,
                              "%s: no model.safetensors or model.safetensors.index.json; download the weights "
                              "into this directory",
                              m->dir);
    if ((st = load_shard(m, path, NULL, NULL, err))) return st;
    return lm_index(m, path, err);
}

/* Drop the tensors whose name contains `mark` from the table. */
static void drop_marked(loom_model *m, const char *mark) {
    int32_t k = 0;
    for (int32_t i = 0; i < m->n_tensors; i++) {
        if (strstr(m->names[i], mark)) {
            free(m->names[i]);
            continue;
        }
        m->tensors[k] = m->tensors[i];
        m->names[k++] = m->names[i];
    }
    m->n_tensors = k;
}

/* Layer l's experts of one kind ("ffn_gate_exps", ...), stored one matrix
 * each as name#E, copied into the stacked (experts, rows, cols) tensor. */
static loom_status stack_kind(loom_model *m, int32_t l, const char *kind, size_t *budget, loom_error *err) {
    const int32_t E = m->cfg.num_experts;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight#0", l, kind);
    const loom_tensor *t0 = lm_find(m, name);
    if (!t0)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: layer %d has no %s matrix for expert 0 (a model with %d experts needs one per "
                              "expert: mlp.experts.E.{gate,up,down}_proj.weight or block_sparse_moe.experts.E."
                              "w{1,3,2}.weight)",
                              st_where(m), l, kind, E);
    const loom_dtype dt = t0->dtype;
    const int64_t rows = t0->shape[0], cols = t0->ndim == 2 ? t0->shape[1] : -1;
    const size_t bytes = t0->nbytes;
    if (t0->ndim != 2 || bytes == 0 || bytes > SIZE_MAX / (size_t)E)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: layer %d expert 0's %s is not a matrix", st_where(m), l,
                              kind);
    /* every expert present and alike before anything is allocated: the
     * copy is then no larger than the file's own tensors */
    for (int32_t e = 1; e < E; e++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight#%d", l, kind, e);
        const loom_tensor *t = lm_find(m, name);
        if (!t)
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: layer %d has no %s matrix for expert %d of %d",
                                  st_where(m), l, kind, e, E);
        if (t->dtype != dt || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols || t->nbytes != bytes)
            return loom_error_set(err, LOOM_ERR_FORMAT,
                                  "%s: layer %d expert %d's %s is (%lld, %lld) %s but expert 0's is (%lld, %lld) %s; "
                                  "every expert must have the same shape and dtype",
                                  st_where(m), l, e, kind, (long long)t->shape[0],
                                  (long long)(t->ndim == 2 ? t->shape[1] : -1), loom_dtype_name(t->dtype),
                                  (long long)rows, (long long)cols, loom_dtype_name(dt));
    }
    /* entries may alias one region of the file; copies never exceed what
     * the files hold */
    if (bytes * (size_t)E > *budget)
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: layer %d's %d %s matrices would take %zu bytes, more than the weight files "
                              "hold; their entries overlap (damaged file)",
                              st_where(m), l, E, kind, bytes * (size_t)E);
    *budget -= bytes * (size_t)E;
    uint8_t *buf = lm_alloc(m, bytes * (size_t)E);
    if (!buf)
        return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory stacking %d experts' %s of layer %d (%zu bytes)",
                              E, kind, l, bytes * (size_t)E);
    for (int32_t e = 0; e < E; e++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight#%d", l, kind, e);
        memcpy(buf + (size_t)e * bytes, lm_find(m, name)->data, bytes);
    }
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, kind);
    const int64_t shape[3] = {E, rows, cols};
    loom_status st = lm_add_tensor(m, name, dt, 3, shape, buf, bytes * (size_t)E, err);
    return st ? st : lm_index(m, st_where(m), err); /* lm_find reads the index */
}

/* A mixture-of-experts checkpoint stores each expert's matrices apart; the
 * canonical form (loom/model.h) stacks them, so they are copied once at
 * load (the per-expert entries leave the table). Also: the shared expert's
 * gate (1, hidden) becomes the canonical (hidden) vector. */
static loom_status stack_experts(loom_model *m, size_t file_bytes, loom_error *err) {
    const int32_t E = m->cfg.num_experts;
    size_t budget = file_bytes;
    loom_status st;
    for (int32_t i = 0; i < m->n_tensors; i++) {
        const char *hash = strchr(m->names[i], '#'); /* "blk.L.KIND.weight#E" */
        int layer = -1, n = 0;
        if (hash && (E == 0 || atol(hash + 1) >= E)) {
            sscanf(m->names[i], "blk.%d.%n", &layer, &n);
            return loom_error_set(err, LOOM_ERR_FORMAT,
                                  "%s: layer %d has a %.*s matrix for expert %s, but config.json says %d experts",
                                  st_where(m), layer, (int)(strstr(m->names[i], ".weight#") - m->names[i] - n),
                                  m->names[i] + n, hash + 1, E);
        }
    }
    if (E == 0) return LOOM_OK;
    if (m->cfg.shared_expert_intermediate_size == 0 && lm_find(m, "blk.0.ffn_up_shexp.weight"))
        return loom_error_set(err, LOOM_ERR_FORMAT,
                              "%s: the weights hold a shared expert (mlp.shared_expert.*) but the config gives it "
                              "no width; set shared_expert_intermediate_size",
                              st_where(m));
    static const char *const kinds[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int32_t l = 0; l < m->cfg.num_layers; l++)
        for (int k = 0; k < 3; k++)
            if ((st = stack_kind(m, l, kinds[k], &budget, err))) return st;
    drop_marked(m, "#");
    for (int32_t i = 0; i < m->n_tensors; i++) {
        loom_tensor *t = &m->tensors[i];
        const char *suf = ".ffn_gate_inp_shexp.weight";
        size_t n = strlen(t->name), k = strlen(suf);
        if (n > k && !strcmp(t->name + n - k, suf) && t->ndim == 2 && t->shape[0] == 1) {
            t->ndim = 1;
            t->shape[0] = t->shape[1];
            t->shape[1] = 1;
        }
    }
    return lm_index(m, st_where(m), err);
}

/* Tied embeddings: HF sometimes stores lm_head anyway; the view omits it.
 * No lm_head at all means tied. */
static loom_status settle_output(loom_model *m, loom_error *err) {
    bool has_out = lm_find(m, "output.weight") != NULL;
    if (!has_out && !m->cfg.tie_embeddings) {
        loom_log(LOOM_LOG_INFO, "model", "%s: no lm_head.weight; using tied embeddings", st_where(m));
        m->cfg.tie_embeddings = true;
    }
    if (!m->cfg.tie_embeddings || !has_out) return LOOM_OK;
    /* output.weight and, when packed, its output.qweight / ... parts */
    for (int32_t i = m->n_tensors - 1; i >= 0; i--) {
        if (strncmp(m->names[i], "output.", 7) != 0) continue;
        free(m->names[i]);
        memmove(&m->tensors[i], &m->tensors[i + 1], (size_t)(m->n_tensors - i - 1) * sizeof *m->tensors);
        memmove(&m->names[i], &m->names[i + 1], (size_t)(m->n_tensors - i - 1) * sizeof *m->names);
        m->n_tensors--;
    }
    return lm_index(m, st_where(m), err);
}

/* One safetensors file and config.json's text in memory (o->data,
 * o->config_json): the checks of load_single and read_dir_config. */
static loom_status load_memory(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    const char *name = o->path && *o->path ? o->path : "<safetensors in memory>";
    char probe[64];
    cJSON *root = NULL;
    if (!o->config_json)
        return loom_error_set(err, LOOM_ERR_INVALID, "%s: a safetensors model in memory needs config.json's text",
                              name);
    loom_status st = parse_json_text(o->config_json, o->config_json_len, "config.json", &root, err);
    if (st) return st;
    st = apply_config(m, root, "config.json", probe, sizeof probe, err);
    cJSON_Delete(root);
    if (st) return st;
    if ((st = shard_entries(m, name, o->data, o->size, NULL, NULL, err))) return st;
    if ((st = lm_index(m, name, err))) return st;
    if ((st = stack_experts(m, o->size, err))) return st;
    if ((st = finish_packed(m, err))) return st;
    if ((st = settle_output(m, err))) return st;
    return lm_validate(m, name, &k_config_keys, err);
}

loom_status lm_load_safetensors(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    if (o->data) return load_memory(m, o, err);
    const char *single;
    size_t cap = strlen(o->path) + 512;
    char *path = NULL;
    loom_status st = find_dir(m, o, &single, err);
    if (st) return st;
    path = malloc(cap);
    if (!path) return loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
    if ((st = read_dir_config(m, path, cap, err))) goto free_path;

    /* weights: an explicit file, the index, or model.safetensors */
    char idx_path[PATH_MAX];
    snprintf(idx_path, sizeof idx_path, "%s/model.safetensors.index.json", m->dir);
    bool use_index = single ? (strstr(single, ".json") != NULL) : file_exists(idx_path);
    if (single && use_index) snprintf(idx_path, sizeof idx_path, "%s", o->path);
    st = use_index ? load_indexed(m, o, idx_path, path, cap, err) : load_single(m, o, single, path, cap, err);
    if (st) goto free_path;
    size_t mapped = 0;
    for (int32_t i = 0; i < m->n_maps; i++) mapped += m->maps[i].size;
    if ((st = stack_experts(m, mapped, err))) goto free_path;
    if ((st = finish_packed(m, err))) goto free_path;
    if ((st = settle_output(m, err))) goto free_path;
    st = lm_validate(m, m->dir, &k_config_keys, err);
free_path:
    free(path);
    return st;
}
