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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static loom_status parse_json_file(const char *path, cJSON **out, loom_error *err) {
    char *text;
    loom_status st = read_text(path, &text, err);
    if (st) return st;
    const char *end = NULL;
    *out = cJSON_ParseWithOpts(text, &end, 0);
    if (!*out) {
        long at = end ? (long)(end - text) : -1;
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: invalid JSON near byte %ld", path, at);
    }
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

/* Integer field; absent/null keeps *v (error when required). */
static loom_status js_int(const js_ctx *c, const char *key, bool required, int32_t *v, loom_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!it || cJSON_IsNull(it)) {
        if (!required) return LOOM_OK;
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" is missing; is this a causal-LM config.json?",
                              c->path, key);
    }
    if (cJSON_IsArray(it)) it = cJSON_GetArrayItem(it, 0); /* e.g. eos_token_id: [128001, 128009] */
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < INT32_MIN ||
        it->valuedouble > INT32_MAX)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" must be an integer", c->path, key);
    *v = (int32_t)it->valuedouble;
    return LOOM_OK;
}

static loom_status js_num(const cJSON *obj, const char *path, const char *key, float *v, loom_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return LOOM_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *v = (float)it->valuedouble;
    return LOOM_OK;
}

static loom_status read_config(const char *path, loom_model_config *cfg, loom_error *err) {
    cJSON *root = NULL;
    loom_status st = parse_json_file(path, &root, err);
    if (st) return st;
    js_ctx c = {root, path};
    if (!cJSON_IsObject(root)) {
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: expected a JSON object", path);
        goto out;
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    const char *model_type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    if (arch ? (!strcmp(arch, "LlamaForCausalLM") || !strcmp(arch, "MistralForCausalLM"))
             : (model_type && (!strcmp(model_type, "llama") || !strcmp(model_type, "mistral")))) {
        cfg->arch = LOOM_ARCH_LLAMA;
    } else if (arch ? !strcmp(arch, "Qwen2ForCausalLM") : (model_type && !strcmp(model_type, "qwen2"))) {
        cfg->arch = LOOM_ARCH_QWEN2;
    } else {
        st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                            "%s: architecture %s is not supported (loom loads LlamaForCausalLM, "
                            "MistralForCausalLM and Qwen2ForCausalLM)",
                            path, arch ? arch : model_type ? model_type : "(none given)");
        goto out;
    }
    if ((st = js_int(&c, "vocab_size", true, &cfg->vocab_size, err))) goto out;
    if ((st = js_int(&c, "hidden_size", true, &cfg->hidden_size, err))) goto out;
    if ((st = js_int(&c, "intermediate_size", true, &cfg->intermediate_size, err))) goto out;
    if ((st = js_int(&c, "num_hidden_layers", true, &cfg->num_layers, err))) goto out;
    if ((st = js_int(&c, "num_attention_heads", true, &cfg->num_heads, err))) goto out;
    cfg->num_kv_heads = cfg->num_heads;
    if ((st = js_int(&c, "num_key_value_heads", false, &cfg->num_kv_heads, err))) goto out;
    cfg->head_dim = 0;
    if ((st = js_int(&c, "head_dim", false, &cfg->head_dim, err))) goto out;
    if (cfg->head_dim == 0) {
        if (cfg->num_heads <= 0 || cfg->hidden_size % cfg->num_heads != 0) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: hidden_size=%d is not a multiple of num_attention_heads=%d (and no head_dim)",
                                path, cfg->hidden_size, cfg->num_heads);
            goto out;
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    cfg->max_context = 2048;
    if ((st = js_int(&c, "max_position_embeddings", false, &cfg->max_context, err))) goto out;
    /* transformers >= 5 writes rope settings (theta included) into a
     * `rope_parameters` object; earlier versions use top-level rope_theta
     * and a `rope_scaling` object. Accept both. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    cfg->rope_theta = 10000.0f;
    if ((st = js_num(root, path, "rope_theta", &cfg->rope_theta, err))) goto out;
    if (cJSON_IsObject(rp) && (st = js_num(rp, path, "rope_theta", &cfg->rope_theta, err))) goto out;
    cfg->rms_norm_eps = 1e-6f;
    if ((st = js_num(root, path, "rms_norm_eps", &cfg->rms_norm_eps, err))) goto out;
    if ((st = js_int(&c, "bos_token_id", false, &cfg->bos_token_id, err))) goto out;
    if ((st = js_int(&c, "eos_token_id", false, &cfg->eos_token_id, err))) goto out;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    cfg->tie_embeddings = cJSON_IsTrue(tie);
    cfg->qkv_bias = cfg->arch == LOOM_ARCH_QWEN2 || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias"));

    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    const cJSON *use_sw = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (cJSON_IsNumber(sw) && sw->valuedouble < cfg->max_context && !cJSON_IsFalse(use_sw))
        loom_log(LOOM_LOG_WARN, "model", "%s: sliding_window=%g is ignored; attention is full-context", path,
                 sw->valuedouble);

    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(rs)) rs = rp;
    if (cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
        cfg->rope_factor = 1.0f;
        if ((st = js_num(rs, path, "factor", &cfg->rope_factor, err))) goto out;
        if (!strcmp(t, "llama3")) {
            cfg->rope_scaling = LOOM_ROPE_SCALING_LLAMA3;
            cfg->rope_low_freq_factor = 1.0f;
            cfg->rope_high_freq_factor = 4.0f;
            float orig = 8192;
            if ((st = js_num(rs, path, "low_freq_factor", &cfg->rope_low_freq_factor, err))) goto out;
            if ((st = js_num(rs, path, "high_freq_factor", &cfg->rope_high_freq_factor, err))) goto out;
            if ((st = js_num(rs, path, "original_max_position_embeddings", &orig, err))) goto out;
            cfg->rope_original_context = (int32_t)orig;
        } else if (!strcmp(t, "linear")) {
            cfg->rope_scaling = LOOM_ROPE_SCALING_LINEAR;
        } else if (strcmp(t, "default") != 0) {
            st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                "%s: rope_scaling type \"%s\" is not supported (loom supports llama3 and linear)",
                                path, t);
            goto out;
        }
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    if (cJSON_IsString(nm) && nm->valuestring[0]) snprintf(cfg->name, sizeof cfg->name, "%s", nm->valuestring);
out:
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------ names */

/* HF name -> canonical; false for tensors loom does not use. */
static bool map_name(const char *hf, char *out, size_t cap) {
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
    return false;
}

/* ------------------------------------------------------------ one shard */

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Map `file`, validate its header and add the tensors loom uses. With an
 * index (`weight_map`), tensors the index assigns elsewhere are warned about;
 * the caller checks afterwards that every indexed tensor was found. */
static loom_status load_shard(loom_model *m, const char *file, const cJSON *weight_map, const char *shard_name,
                              loom_error *err) {
    const void *addr;
    size_t size;
    loom_status st = lm_map_file(m, file, &addr, &size, err);
    if (st) return st;
    const uint8_t *base = addr;
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
    cJSON *hdr = cJSON_ParseWithLengthOpts(hjson, (size_t)hlen, &end, 0);
    if (!hdr || !cJSON_IsObject(hdr)) {
        long at = end ? (long)(end - (const char *)base) : 8;
        cJSON_Delete(hdr);
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: header is not a valid JSON object (error near byte %ld)",
                              file, at);
    }
    uint64_t data_start = 8 + hlen, data_size = size - data_start;
    const cJSON *e;
    char canon[96];
    cJSON_ArrayForEach(e, hdr) {
        const char *hf = e->string;
        if (!strcmp(hf, "__metadata__")) continue;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *shp = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shp) || !cJSON_IsArray(offs) ||
            cJSON_GetArraySize(offs) != 2) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: header entry %s needs \"dtype\", \"shape\" and two \"data_offsets\"", file, hf);
            goto out;
        }
        int nd = cJSON_GetArraySize(shp);
        int64_t shape[LOOM_TENSOR_MAX_DIMS] = {0};
        uint64_t numel = 1;
        bool shape_ok = nd <= LOOM_TENSOR_MAX_DIMS;
        for (int i = 0; shape_ok && i < nd; i++) {
            const cJSON *d = cJSON_GetArrayItem(shp, i);
            shape_ok = cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < 9.0e15 &&
                       d->valuedouble == floor(d->valuedouble);
            if (shape_ok) {
                shape[i] = (int64_t)d->valuedouble;
                shape_ok = shape[i] == 0 || numel <= (uint64_t)INT64_MAX / (uint64_t)shape[i];
                numel *= (uint64_t)shape[i];
            }
        }
        uint64_t ob[2];
        bool offs_ok = true;
        for (int i = 0; i < 2; i++) {
            const cJSON *d = cJSON_GetArrayItem(offs, i);
            offs_ok = offs_ok && cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < 9.0e15 &&
                      d->valuedouble == floor(d->valuedouble);
            ob[i] = offs_ok ? (uint64_t)d->valuedouble : 0;
        }
        if (!shape_ok || !offs_ok || ob[0] > ob[1] || ob[1] > data_size) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: tensor %s: %s (data section is %llu bytes); the file is damaged or truncated",
                                file, hf,
                                !shape_ok ? "invalid shape"
                                : !offs_ok || ob[0] > ob[1] ? "invalid data_offsets"
                                : "data_offsets point past the end of the file",
                                (unsigned long long)data_size);
            goto out;
        }
        const char *dts = dt->valuestring;
        loom_dtype dtype = LOOM_DTYPE_COUNT;
        size_t esz = 0;
        if (!strcmp(dts, "F32")) dtype = LOOM_DTYPE_F32, esz = 4;
        else if (!strcmp(dts, "F16")) dtype = LOOM_DTYPE_F16, esz = 2;
        else if (!strcmp(dts, "BF16")) dtype = LOOM_DTYPE_BF16, esz = 2;
        bool used = map_name(hf, canon, sizeof canon);
        if (esz && (ob[1] - ob[0]) / esz != numel) {
            st = loom_error_set(err, LOOM_ERR_FORMAT,
                                "%s: tensor %s: %llu bytes of data but %s shape needs %llu elements; the file is "
                                "damaged",
                                file, hf, (unsigned long long)(ob[1] - ob[0]), dts, (unsigned long long)numel);
            goto out;
        }
        if (!used) {
            loom_log(LOOM_LOG_DEBUG, "model", "%s: ignoring tensor %s", file, hf);
            continue;
        }
        if (!esz) {
            st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                                "%s: tensor %s has dtype %s; loom reads F32, F16 and BF16 safetensors (convert the "
                                "checkpoint, e.g. save it with torch_dtype=bfloat16)",
                                file, hf, dts);
            goto out;
        }
        if (nd == 0) {
            st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: tensor %s is a scalar; expected a vector or matrix", file,
                                hf);
            goto out;
        }
        if (weight_map) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(weight_map, hf);
            if (!cJSON_IsString(w) || strcmp(w->valuestring, shard_name) != 0)
                loom_log(LOOM_LOG_WARN, "model", "%s: tensor %s is not listed for this shard in the index", file,
                         hf);
        }
        if ((st = lm_add_tensor(m, canon, dtype, nd, shape, (void *)(base + data_start + ob[0]),
                                (size_t)(ob[1] - ob[0]), err)))
            goto out;
    }
    st = LOOM_OK;
out:
    cJSON_Delete(hdr);
    return st;
}

/* A shard file name from the index must be a plain name inside the directory. */
static bool safe_shard_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* ------------------------------------------------------------ the loader */

loom_status lm_load_safetensors(loom_model *m, const loom_model_load_opts *o, loom_error *err) {
    loom_status st = LOOM_OK;
    cJSON *index = NULL;
    char *path = NULL;
    size_t cap = strlen(o->path) + 512;
    struct stat sb;
    if (stat(o->path, &sb) != 0)
        return loom_error_set(err, LOOM_ERR_NOT_FOUND, "%s: %s", o->path, strerror(errno));
    /* the model directory: the path itself, or the directory of a file in it */
    m->dir = loom_strdup(o->path);
    path = malloc(cap);
    if (!m->dir || !path) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto out;
    }
    const char *single = NULL;
    if (!S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(m->dir, '/');
        single = slash ? o->path + (slash - m->dir) + 1 : o->path;
        if (slash == m->dir) slash[1] = 0;
        else if (slash) *slash = 0;
        else strcpy(m->dir, ".");
    } else {
        size_t n = strlen(m->dir);
        while (n > 1 && m->dir[n - 1] == '/') m->dir[--n] = 0;
    }
    snprintf(path, cap, "%s/config.json", m->dir);
    if (!file_exists(path)) {
        st = loom_error_set(err, LOOM_ERR_NOT_FOUND,
                            "%s: no config.json; a safetensors model directory needs config.json next to the "
                            "weights (download the whole Hugging Face repository)",
                            m->dir);
        goto out;
    }
    if ((st = read_config(path, &m->cfg, err))) goto out;
    if (!m->cfg.name[0]) {
        const char *b = strrchr(m->dir, '/');
        snprintf(m->cfg.name, sizeof m->cfg.name, "%s", b && b[1] ? b + 1 : m->dir);
    }
    lm_keys keys = {"config.json vocab_size", "config.json hidden_size", "config.json intermediate_size",
                    "config.json num_hidden_layers", "config.json num_attention_heads",
                    "config.json num_key_value_heads", "config.json head_dim"};
    if ((st = lm_check_config(&m->cfg, path, &keys, err))) goto out;

    snprintf(path, cap, "%s/tokenizer.json", m->dir);
    if (file_exists(path) && !(m->tokenizer_json = loom_strdup(path))) {
        st = loom_error_set(err, LOOM_ERR_NOMEM, "out of memory");
        goto out;
    }

    /* weights: an explicit file, the index, or model.safetensors */
    char idx_path[PATH_MAX];
    snprintf(idx_path, sizeof idx_path, "%s/model.safetensors.index.json", m->dir);
    bool use_index = single ? (strstr(single, ".json") != NULL) : file_exists(idx_path);
    if (single && use_index) snprintf(idx_path, sizeof idx_path, "%s", o->path);
    if (use_index) {
        if ((st = parse_json_file(idx_path, &index, err))) goto out;
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!cJSON_IsObject(wm) || !wm->child) {
            st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: no \"weight_map\" object", idx_path);
            goto out;
        }
        /* visit each distinct shard once, in order of first appearance */
        int n = cJSON_GetArraySize(wm), k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            k++;
            if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
                st = loom_error_set(err, LOOM_ERR_FORMAT,
                                    "%s: weight_map entry %s must name a shard file in the same directory",
                                    idx_path, e->string);
                goto out;
            }
            bool seen = false;
            for (const cJSON *p = wm->child; p != e && !seen; p = p->next)
                seen = cJSON_IsString(p) && !strcmp(p->valuestring, e->valuestring);
            if (seen) continue;
            snprintf(path, cap, "%s/%s", m->dir, e->valuestring);
            if ((st = load_shard(m, path, wm, e->valuestring, err))) goto out;
            lm_progress(o, "safetensors: map shards", (double)k / n);
        }
        if ((st = lm_index(m, idx_path, err))) goto out;
        /* every mapped entry of the index must have been found in its shard */
        char canon[96];
        cJSON_ArrayForEach(e, wm) {
            if (map_name(e->string, canon, sizeof canon) && !lm_find(m, canon)) {
                st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: %s is listed in shard %s but not present in it",
                                    idx_path, e->string, e->valuestring);
                goto out;
            }
        }
    } else {
        if (single) snprintf(path, cap, "%s", o->path);
        else snprintf(path, cap, "%s/model.safetensors", m->dir);
        if (!file_exists(path)) {
            st = loom_error_set(err, LOOM_ERR_NOT_FOUND,
                                "%s: no model.safetensors or model.safetensors.index.json; download the weights "
                                "into this directory",
                                m->dir);
            goto out;
        }
        if ((st = load_shard(m, path, NULL, NULL, err))) goto out;
        if ((st = lm_index(m, path, err))) goto out;
    }
    /* tied embeddings: HF sometimes stores lm_head anyway; the view omits it */
    bool has_out = lm_find(m, "output.weight") != NULL;
    if (!has_out && !m->cfg.tie_embeddings) {
        loom_log(LOOM_LOG_INFO, "model", "%s: no lm_head.weight; using tied embeddings", m->dir);
        m->cfg.tie_embeddings = true;
    }
    if (m->cfg.tie_embeddings && has_out) {
        loom_tensor *t = lm_find(m, "output.weight");
        int32_t i = (int32_t)(t - m->tensors);
        free(m->names[i]);
        memmove(&m->tensors[i], &m->tensors[i + 1], (size_t)(m->n_tensors - i - 1) * sizeof *m->tensors);
        memmove(&m->names[i], &m->names[i + 1], (size_t)(m->n_tensors - i - 1) * sizeof *m->names);
        m->n_tensors--;
        if ((st = lm_index(m, m->dir, err))) goto out;
    }
    st = lm_validate(m, m->dir, &keys, err);
out:
    cJSON_Delete(index);
    free(path);
    return st;
}
