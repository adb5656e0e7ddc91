/*
 * core/tokenizer/json_load.c — Hugging Face tokenizer.json (+ optional
 * tokenizer_config.json) to a loom tokenizer.
 *
 * Supported shapes: model BPE (merges as "a b" strings or ["a","b"] pairs;
 * byte_fallback, ignore_merges, unk_token); pre_tokenizer ByteLevel, Split,
 * Digits, Metaspace and Sequences of them; normalizer Prepend/Replace "▁"
 * (SentencePiece style) — NFC is accepted and ignored (inputs are assumed to
 * be NFC already); added_tokens with special/lstrip/rstrip (single_word and
 * normalized are ignored). Anything else is refused by name, so a wrong
 * tokenization never passes silently.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* ▁ */

static loom_status read_json(const char *path, cJSON **out, loom_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_error_set(err, LOOM_ERR_NOT_FOUND, "%s: cannot open tokenizer file", path);
    char *buf = NULL;
    loom_status st = LOOM_OK;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: cannot determine the file size", path);
        goto done;
    }
    buf = malloc((size_t)sz + 1);
    if (!buf) { st = loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, sz); goto done; }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        st = loom_error_set(err, LOOM_ERR_IO, "%s: short read", path);
        goto done;
    }
    buf[sz] = '\0';
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, (size_t)sz, &end, false);
    if (!*out) {
        size_t off = end ? (size_t)(end - buf) : 0;
        st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, off);
    }
done:
    free(buf);
    fclose(f);
    return st;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v) ? 1 : 0;
    return dflt;
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *jtoken(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* Does a (possibly Sequence) component contain one of type `type`? */
static const cJSON *find_type(const cJSON *node, const char *type) {
    if (!cJSON_IsObject(node)) return NULL;
    const char *ty = jstr(node, "type");
    if (ty && strcmp(ty, type) == 0) return node;
    const char *lists[] = {"pretokenizers", "normalizers", "decoders", "processors"};
    for (size_t k = 0; k < 4; k++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(node, lists[k]);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            const cJSON *r = find_type(it, type);
            if (r) return r;
        }
    }
    return NULL;
}

/* SentencePiece-style normalizer: Replace(" " -> "▁") somewhere. */
static bool has_spm_replace(const cJSON *node) {
    if (!cJSON_IsObject(node)) return false;
    const char *ty = jstr(node, "type");
    if (ty && strcmp(ty, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(node, "pattern");
        const char *s = jstr(pat, "String");
        const char *c = jstr(node, "content");
        if (s && c && strcmp(s, " ") == 0 && strcmp(c, SPM_SPACE) == 0) return true;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(node, "normalizers");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (has_spm_replace(it)) return true;
    return false;
}

static bool has_spm_prepend(const cJSON *node) {
    if (!cJSON_IsObject(node)) return false;
    const char *ty = jstr(node, "type");
    if (ty && strcmp(ty, "Prepend") == 0) {
        const char *p = jstr(node, "prepend");
        return p && strcmp(p, SPM_SPACE) == 0;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(node, "normalizers");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (has_spm_prepend(it)) return true;
    return false;
}

static loom_status check_normalizer(const cJSON *node, const char *path, loom_error *err) {
    if (!node || cJSON_IsNull(node)) return LOOM_OK;
    const char *ty = jstr(node, "type");
    if (!ty) return loom_error_set(err, LOOM_ERR_FORMAT, "%s: normalizer without a type", path);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(node, "normalizers")) {
            loom_status st = check_normalizer(it, path, err);
            if (st) return st;
        }
        return LOOM_OK;
    }
    if (strcmp(ty, "Prepend") == 0 || strcmp(ty, "Replace") == 0) return LOOM_OK;
    if (strcmp(ty, "NFC") == 0) {
        loom_log(LOOM_LOG_INFO, "tokenizer", "%s: NFC normalizer not applied (input assumed NFC)", path);
        return LOOM_OK;
    }
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "%s: normalizer '%s' is not supported (loom handles Prepend/Replace "
                          "for SentencePiece and NFC)",
                          path, ty);
}

static const char RE_BYTELEVEL[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Install the pre_tokenizer's split steps (byte-level tokenizers). */
static loom_status add_pretok(loom_tokenizer *t, const cJSON *node, const char *path, loom_error *err) {
    if (!node || cJSON_IsNull(node)) return LOOM_OK;
    const char *ty = jstr(node, "type");
    if (!ty) return loom_error_set(err, LOOM_ERR_FORMAT, "%s: pre_tokenizer without a type", path);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(node, "pretokenizers")) {
            loom_status st = add_pretok(t, it, path, err);
            if (st) return st;
        }
        return LOOM_OK;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (jbool(node, "add_prefix_space", 0)) t->bl_prefix_space = true;
        if (!jbool(node, "use_regex", 1)) return LOOM_OK;
        return tok_add_split(t, RE_BYTELEVEL, sizeof RE_BYTELEVEL - 1, false, TOK_SPLIT_ISOLATED,
                             false, err);
    }
    if (strcmp(ty, "Digits") == 0) {
        bool each = jbool(node, "individual_digits", 0);
        const char *re = each ? "\\p{N}" : "\\p{N}+";
        return tok_add_split(t, re, strlen(re), false, TOK_SPLIT_ISOLATED, false, err);
    }
    if (strcmp(ty, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(node, "pattern");
        const char *re = jstr(pat, "Regex");
        const char *lit = jstr(pat, "String");
        const char *beh = jstr(node, "behavior");
        tok_split_behavior b;
        if (!beh || strcmp(beh, "Isolated") == 0) b = TOK_SPLIT_ISOLATED;
        else if (strcmp(beh, "Removed") == 0) b = TOK_SPLIT_REMOVED;
        else if (strcmp(beh, "MergedWithPrevious") == 0) b = TOK_SPLIT_MERGED_PREV;
        else if (strcmp(beh, "MergedWithNext") == 0) b = TOK_SPLIT_MERGED_NEXT;
        else if (strcmp(beh, "Contiguous") == 0) b = TOK_SPLIT_CONTIGUOUS;
        else return loom_error_set(err, LOOM_ERR_UNSUPPORTED, "%s: Split behavior '%s' is not supported", path, beh);
        if (!re && !lit) return loom_error_set(err, LOOM_ERR_FORMAT, "%s: Split without a Regex or String pattern", path);
        const char *p = re ? re : lit;
        return tok_add_split(t, p, strlen(p), !re, b, jbool(node, "invert", 0), err);
    }
    return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer '%s' is not supported for byte-level BPE (loom "
                          "handles ByteLevel, Split, Digits, Sequence)",
                          path, ty);
}

static int32_t find_tok(const char *const *toks, size_t nv, const char *text) {
    if (!text) return -1;
    for (size_t i = 0; i < nv; i++)
        if (toks[i] && strcmp(toks[i], text) == 0) return (int32_t)i;
    return -1;
}

static bool parse_byte_token(const char *s, int *b) {
    if (strlen(s) != 6 || strncmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned v;
    if (sscanf(s + 3, "%2x", &v) != 1) return false;
    *b = (int)v;
    return true;
}

loom_status loom_tokenizer_from_json(const char *path, const char *config_path,
                                     loom_tokenizer **out, loom_error *err) {
    loom_status st = LOOM_OK;
    cJSON *root = NULL, *cfg = NULL;
    const char **toks = NULL, **merges = NULL;
    int32_t *types = NULL;
    uint8_t *lstrip = NULL, *rstrip = NULL;
    char *merge_buf = NULL;
    loom_tokenizer *t = NULL;
    if (!out || !path) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: NULL argument");
    *out = NULL;
    st = read_json(path, &root, err);
    if (st) goto done;
    if (config_path) {
        st = read_json(config_path, &cfg, err);
        if (st) goto done;
    }

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mtype = jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *jmerges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(model) || (mtype && strcmp(mtype, "BPE") != 0) || !cJSON_IsObject(vocab) ||
        !cJSON_IsArray(jmerges)) {
        st = loom_error_set(err, mtype && strcmp(mtype, "BPE") != 0 ? LOOM_ERR_UNSUPPORTED : LOOM_ERR_FORMAT,
                            "%s: model '%s' is not supported; loom reads BPE models with a vocab "
                            "object and a merges array",
                            path, mtype ? mtype : "(no model)");
        goto done;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pretok = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    st = check_normalizer(normalizer, path, err);
    if (st) goto done;

    /* --- which family */
    bool byte_fallback = jbool(model, "byte_fallback", 0);
    const cJSON *meta = find_type(pretok, "Metaspace");
    if (!meta) meta = find_type(decoder, "Metaspace");
    tok_kind kind;
    bool space_prefix = false, prefix_first = false, spm_split = false;
    if (find_type(pretok, "ByteLevel") || find_type(decoder, "ByteLevel")) {
        kind = TOK_BYTELEVEL;
    } else if (has_spm_replace(normalizer) || meta) {
        kind = TOK_SPM;
        space_prefix = has_spm_prepend(normalizer);
        if (meta) {
            const char *scheme = jstr(meta, "prepend_scheme");
            space_prefix = scheme ? strcmp(scheme, "never") != 0 : jbool(meta, "add_prefix_space", 1);
            prefix_first = scheme && strcmp(scheme, "first") == 0;
            spm_split = find_type(pretok, "Metaspace") == meta && jbool(meta, "split", 1);
        }
    } else {
        st = loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                            "%s: neither byte-level (ByteLevel) nor SentencePiece-style (▁) BPE; "
                            "loom cannot tell how to map text to this vocabulary",
                            path);
        goto done;
    }

    /* --- vocabulary: ids may be sparse; holes become unused empty tokens */
    int64_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 24)) {
            st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: vocab entry '%s' has a bad id", path,
                                it->string ? it->string : "?");
            goto done;
        }
        if (it->valueint > max_id) max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !jstr(it, "content")) {
            st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: added_tokens entry without a valid id/content", path);
            goto done;
        }
        if (id->valueint > max_id) max_id = id->valueint;
    }
    if (max_id < 0) { st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: empty vocabulary", path); goto done; }
    size_t nv = (size_t)max_id + 1;
    toks = calloc(nv, sizeof *toks);
    types = malloc(nv * sizeof *types);
    lstrip = calloc(nv, 1);
    rstrip = calloc(nv, 1);
    if (!toks || !types || !lstrip || !rstrip) { st = loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    for (size_t i = 0; i < nv; i++) types[i] = LOOM_TOKEN_UNUSED;
    cJSON_ArrayForEach(it, vocab) {
        toks[it->valueint] = it->string;
        types[it->valueint] = LOOM_TOKEN_NORMAL;
        int b;
        if (kind == TOK_SPM && byte_fallback && parse_byte_token(it->string, &b)) types[it->valueint] = LOOM_TOKEN_BYTE;
    }
    const char *unk_text = jstr(model, "unk_token");
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        toks[id] = jstr(it, "content");
        types[id] = jbool(it, "special", 0) ? LOOM_TOKEN_CONTROL : LOOM_TOKEN_USER_DEFINED;
        if (unk_text && strcmp(toks[id], unk_text) == 0) types[id] = LOOM_TOKEN_UNKNOWN;
        lstrip[id] = (uint8_t)jbool(it, "lstrip", 0);
        rstrip[id] = (uint8_t)jbool(it, "rstrip", 0);
    }

    /* --- merges: normalise both forms to "a b" */
    int32_t nm = cJSON_GetArraySize(jmerges);
    size_t mbytes = 0;
    cJSON_ArrayForEach(it, jmerges) {
        if (cJSON_IsString(it)) mbytes += strlen(it->valuestring) + 1;
        else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                 cJSON_IsString(cJSON_GetArrayItem(it, 1)))
            mbytes += strlen(cJSON_GetArrayItem(it, 0)->valuestring) + strlen(cJSON_GetArrayItem(it, 1)->valuestring) + 2;
        else { st = loom_error_set(err, LOOM_ERR_FORMAT, "%s: a merges entry is neither \"a b\" nor [\"a\",\"b\"]", path); goto done; }
    }
    merges = malloc((size_t)(nm ? nm : 1) * sizeof *merges);
    merge_buf = malloc(mbytes ? mbytes : 1);
    if (!merges || !merge_buf) { st = loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    size_t mo = 0;
    int32_t mi = 0;
    cJSON_ArrayForEach(it, jmerges) {
        merges[mi++] = merge_buf + mo;
        if (cJSON_IsString(it)) {
            size_t n = strlen(it->valuestring);
            memcpy(merge_buf + mo, it->valuestring, n + 1);
            mo += n + 1;
        } else {
            mo += (size_t)sprintf(merge_buf + mo, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring,
                                  cJSON_GetArrayItem(it, 1)->valuestring) + 1;
        }
    }

    /* --- specials, flags, template */
    loom_tokenizer_spec spec;
    loom_tokenizer_spec_init(&spec);
    spec.model = kind == TOK_SPM ? "llama" : "gpt2";
    spec.pre = "json";
    spec.n_vocab = (int32_t)nv;
    spec.tokens = toks;
    spec.token_types = types;
    spec.n_merges = nm;
    spec.merges = merges;
    spec.add_space_prefix = space_prefix;

    /* BOS from a TemplateProcessing post-processor that starts with a special token. */
    const cJSON *tp = find_type(post, "TemplateProcessing");
    const char *post_bos = NULL;
    if (tp) {
        const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tp, "single"), 0);
        const cJSON *stok = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
        post_bos = jstr(stok, "id");
    }
    const char *bos_text = cfg ? jtoken(cfg, "bos_token") : NULL;
    const char *eos_text = cfg ? jtoken(cfg, "eos_token") : NULL;
    int add_bos = cfg ? jbool(cfg, "add_bos_token", -1) : -1;
    if (add_bos < 0 && post_bos) add_bos = 1;
    if (!bos_text) bos_text = post_bos;
    if (add_bos < 0) add_bos = kind == TOK_SPM;
    spec.add_bos = add_bos;

    spec.bos_id = find_tok(toks, nv, bos_text);
    if (spec.bos_id < 0 && !cfg) {
        spec.bos_id = find_tok(toks, nv, "<s>");
        if (spec.bos_id < 0) spec.bos_id = find_tok(toks, nv, "<|begin_of_text|>");
    }
    spec.eos_id = find_tok(toks, nv, eos_text);
    if (spec.eos_id < 0 && !cfg) {
        static const char *const guess[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", NULL};
        for (const char *const *g = guess; *g && spec.eos_id < 0; g++) spec.eos_id = find_tok(toks, nv, *g);
    }
    spec.unk_id = find_tok(toks, nv, unk_text);
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (cJSON_IsString(ct)) {
        spec.chat_template = ct->valuestring;
    } else if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
        cJSON_ArrayForEach(it, ct) {
            const char *name = jstr(it, "name");
            if (!spec.chat_template || (name && strcmp(name, "default") == 0)) spec.chat_template = jstr(it, "template");
        }
    }

    tok_build_opts opts = {.skip_pre = true, .force_kind = kind,
                           .ignore_merges = jbool(model, "ignore_merges", 0) == 1,
                           .spm_prefix_first = prefix_first, .spm_split = spm_split,
                           .spm_prefix_unless_space = meta != NULL,
                           .lstrip = lstrip, .rstrip = rstrip};
    st = tok_build(&spec, &opts, &t, err);
    if (st) {
        loom_error_prefix(err, "%s", path);
        goto done;
    }
    if (kind == TOK_BYTELEVEL) {
        st = add_pretok(t, pretok, path, err);
        if (st) goto done;
    }
    *out = t;
    t = NULL;
done:
    loom_tokenizer_free(t);
    free(toks);
    free(types);
    free(lstrip);
    free(rstrip);
    free(merges);
    free(merge_buf);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return st;
}
