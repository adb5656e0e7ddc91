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
 * tokenization never passes silently. Files over 64 MiB (TOK_JSON_MAX_BYTES)
 * are refused before they are read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "tokenizer/tok_internal.h"
#include "util/util.h"

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* ▁ */

/* tokenizer.json and tokenizer_config.json larger than this are refused
 * before reading (the largest real tokenizer.json files are ~20 MiB). */
#define TOK_JSON_MAX_BYTES ((size_t)64 << 20)

/* The whole of f (at most TOK_JSON_MAX_BYTES) into *buf, NUL-terminated. A
 * regular file is sized first; a pipe is read until EOF or the cap. */
static loom_status slurp_capped(FILE *f, const char *path, char **buf, size_t *len, loom_error *err) {
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0)
        return loom_error_set(err, LOOM_ERR_IO, "%s: cannot determine the file size", path);
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > TOK_JSON_MAX_BYTES)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %lld bytes is larger than the 64 MiB loom reads "
                              "as a tokenizer file", path, (long long)sb.st_size);
    size_t cap = S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 2 : 1 << 16, n = 0; /* +2: EOF in one read */
    char *b = malloc(cap);
    for (;;) {
        if (!b) return loom_error_set(err, LOOM_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, cap);
        n += fread(b + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || feof(f)) break;
        if (n >= TOK_JSON_MAX_BYTES) { /* grew, or a pipe: stop at the cap */
            free(b);
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: larger than the 64 MiB loom reads as a "
                                  "tokenizer file", path);
        }
        char *nb = realloc(b, cap * 2);
        if (!nb) free(b);
        b = nb;
        cap *= 2;
    }
    if (ferror(f)) {
        free(b);
        return loom_error_set(err, LOOM_ERR_IO, "%s: read error", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return LOOM_OK;
}

/* Parse `len` bytes of JSON named `name` in messages, under the same size
 * cap as a file. */
static loom_status parse_json(const char *buf, size_t len, const char *name, cJSON **out, loom_error *err) {
    *out = NULL;
    if (len > TOK_JSON_MAX_BYTES)
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: %zu bytes is larger than the 64 MiB loom reads as a "
                              "tokenizer file", name, len);
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, len, &end, false);
    if (!*out) {
        size_t off = end ? (size_t)(end - buf) : 0;
        return loom_error_set(err, LOOM_ERR_FORMAT, "%s: invalid JSON near byte %zu", name, off);
    }
    return LOOM_OK;
}

/* The file's bytes, malloc'd (caller frees), at most TOK_JSON_MAX_BYTES. */
static loom_status read_file(const char *path, char **buf, size_t *len, loom_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return loom_error_set(err, LOOM_ERR_NOT_FOUND, "%s: cannot open tokenizer file", path);
    loom_status st = slurp_capped(f, path, buf, len, err);
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

/* Which BPE family the pipeline describes, and the SentencePiece options. */
typedef struct json_family {
    tok_kind kind;
    const cJSON *meta;  /* the Metaspace step, or NULL */
    bool space_prefix, prefix_first, spm_split;
} json_family;

/* The vocabulary as arrays indexed by id; strings point into the JSON tree. */
typedef struct json_vocab {
    size_t nv;
    const char **toks;   /* [nv], NULL for holes */
    int32_t *types;      /* [nv] loom_token_type  */
    uint8_t *lstrip;     /* [nv] 0/1              */
    uint8_t *rstrip;     /* [nv] 0/1              */
} json_vocab;

/* The merges, each as "a b" in one buffer. */
typedef struct json_merges {
    int32_t n;
    const char **list;   /* [n] into buf */
    char *buf;
} json_merges;

static void json_vocab_free(json_vocab *v) {
    free(v->toks);
    free(v->types);
    free(v->lstrip);
    free(v->rstrip);
}

static void json_merges_free(json_merges *m) {
    free(m->list);
    free(m->buf);
}

/* A byte-level pipeline (ByteLevel anywhere) or a SentencePiece one (▁
 * replace or Metaspace); anything else cannot be mapped to the vocabulary. */
static loom_status detect_family(const cJSON *normalizer, const cJSON *pretok, const cJSON *decoder,
                                 const char *path, json_family *f, loom_error *err) {
    *f = (json_family){0};
    f->meta = find_type(pretok, "Metaspace");
    if (!f->meta) f->meta = find_type(decoder, "Metaspace");
    if (find_type(pretok, "ByteLevel") || find_type(decoder, "ByteLevel")) {
        f->kind = TOK_BYTELEVEL;
        return LOOM_OK;
    }
    if (!has_spm_replace(normalizer) && !f->meta)
        return loom_error_set(err, LOOM_ERR_UNSUPPORTED,
                              "%s: neither byte-level (ByteLevel) nor SentencePiece-style (▁) BPE; "
                              "loom cannot tell how to map text to this vocabulary",
                              path);
    f->kind = TOK_SPM;
    f->space_prefix = has_spm_prepend(normalizer);
    if (f->meta) {
        const char *scheme = jstr(f->meta, "prepend_scheme");
        f->space_prefix = scheme ? strcmp(scheme, "never") != 0 : jbool(f->meta, "add_prefix_space", 1);
        f->prefix_first = scheme && strcmp(scheme, "first") == 0;
        f->spm_split = find_type(pretok, "Metaspace") == f->meta && jbool(f->meta, "split", 1);
    }
    return LOOM_OK;
}

/* The largest id in vocab and added_tokens, each id checked. */
static loom_status vocab_max_id(const cJSON *vocab, const cJSON *added, const char *path, int64_t *max_id,
                                loom_error *err) {
    const cJSON *it;
    *max_id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 24))
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: vocab entry '%s' has a bad id", path,
                                  it->string ? it->string : "?");
        if (it->valueint > *max_id) *max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !jstr(it, "content"))
            return loom_error_set(err, LOOM_ERR_FORMAT, "%s: added_tokens entry without a valid id/content", path);
        if (id->valueint > *max_id) *max_id = id->valueint;
    }
    if (*max_id < 0) return loom_error_set(err, LOOM_ERR_FORMAT, "%s: empty vocabulary", path);
    return LOOM_OK;
}

/* Vocabulary: ids may be sparse; holes become unused empty tokens. Added
 * tokens override the model's vocab entry of the same id. */
static loom_status read_vocab(const cJSON *model, const cJSON *added, tok_kind kind, const char *path,
                              json_vocab *v, loom_error *err) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    bool byte_fallback = jbool(model, "byte_fallback", 0);
    int64_t max_id;
    loom_status st = vocab_max_id(vocab, added, path, &max_id, err);
    if (st) return st;
    v->nv = (size_t)max_id + 1;
    v->toks = calloc(v->nv, sizeof *v->toks);
    v->types = malloc(v->nv * sizeof *v->types);
    v->lstrip = calloc(v->nv, 1);
    v->rstrip = calloc(v->nv, 1);
    if (!v->toks || !v->types || !v->lstrip || !v->rstrip)
        return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < v->nv; i++) v->types[i] = LOOM_TOKEN_UNUSED;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        v->toks[it->valueint] = it->string;
        v->types[it->valueint] = LOOM_TOKEN_NORMAL;
        int b;
        if (kind == TOK_SPM && byte_fallback && parse_byte_token(it->string, &b))
            v->types[it->valueint] = LOOM_TOKEN_BYTE;
    }
    const char *unk_text = jstr(model, "unk_token");
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        v->toks[id] = jstr(it, "content");
        v->types[id] = jbool(it, "special", 0) ? LOOM_TOKEN_CONTROL : LOOM_TOKEN_USER_DEFINED;
        if (unk_text && strcmp(v->toks[id], unk_text) == 0) v->types[id] = LOOM_TOKEN_UNKNOWN;
        v->lstrip[id] = (uint8_t)jbool(it, "lstrip", 0);
        v->rstrip[id] = (uint8_t)jbool(it, "rstrip", 0);
    }
    return LOOM_OK;
}

/* Merges come as "a b" strings or ["a", "b"] pairs: normalise both to "a b". */
static loom_status read_merges(const cJSON *jmerges, const char *path, json_merges *m, loom_error *err) {
    const cJSON *it;
    size_t mbytes = 0;
    m->n = cJSON_GetArraySize(jmerges);
    cJSON_ArrayForEach(it, jmerges) {
        if (cJSON_IsString(it)) mbytes += strlen(it->valuestring) + 1;
        else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                 cJSON_IsString(cJSON_GetArrayItem(it, 1)))
            mbytes += strlen(cJSON_GetArrayItem(it, 0)->valuestring) + strlen(cJSON_GetArrayItem(it, 1)->valuestring) + 2;
        else return loom_error_set(err, LOOM_ERR_FORMAT, "%s: a merges entry is neither \"a b\" nor [\"a\",\"b\"]", path);
    }
    m->list = malloc((size_t)(m->n ? m->n : 1) * sizeof *m->list);
    m->buf = malloc(mbytes ? mbytes : 1);
    if (!m->list || !m->buf) return loom_error_set(err, LOOM_ERR_NOMEM, "tokenizer: out of memory");
    size_t mo = 0;
    int32_t mi = 0;
    cJSON_ArrayForEach(it, jmerges) {
        m->list[mi++] = m->buf + mo;
        if (cJSON_IsString(it)) {
            size_t n = strlen(it->valuestring);
            memcpy(m->buf + mo, it->valuestring, n + 1);
            mo += n + 1;
        } else {
            mo += (size_t)sprintf(m->buf + mo, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring,
                                  cJSON_GetArrayItem(it, 1)->valuestring) + 1;
        }
    }
    return LOOM_OK;
}

/* BOS, EOS and UNK ids and add_bos. tokenizer_config.json (cfg) decides when
 * present; otherwise a TemplateProcessing post-processor that starts with a
 * special token gives BOS, and the usual token texts are guessed. */
static void set_specials(loom_tokenizer_spec *spec, const json_vocab *v, const cJSON *model, const cJSON *post,
                         const cJSON *cfg, tok_kind kind) {
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
    spec->add_bos = add_bos;

    spec->bos_id = find_tok(v->toks, v->nv, bos_text);
    if (spec->bos_id < 0 && !cfg) {
        spec->bos_id = find_tok(v->toks, v->nv, "<s>");
        if (spec->bos_id < 0) spec->bos_id = find_tok(v->toks, v->nv, "<|begin_of_text|>");
    }
    spec->eos_id = find_tok(v->toks, v->nv, eos_text);
    if (spec->eos_id < 0 && !cfg) {
        static const char *const guess[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", NULL};
        for (const char *const *g = guess; *g && spec->eos_id < 0; g++)
            spec->eos_id = find_tok(v->toks, v->nv, *g);
    }
    spec->unk_id = find_tok(v->toks, v->nv, jstr(model, "unk_token"));
}

/* chat_template is a string, or a list of named templates of which
 * "default" wins (else the last). */
static const char *chat_template(const cJSON *cfg) {
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) return ct->valuestring;
    if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": ...}, ...] */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const char *name = jstr(it, "name");
            if (!tmpl || (name && strcmp(name, "default") == 0)) tmpl = jstr(it, "template");
        }
    }
    return tmpl;
}

/* The model must be BPE with a vocab object and a merges array. */
static loom_status check_model(const cJSON *model, const char *path, loom_error *err) {
    const char *mtype = jstr(model, "type");
    if (cJSON_IsObject(model) && (!mtype || strcmp(mtype, "BPE") == 0) &&
        cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(model, "vocab")) &&
        cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(model, "merges")))
        return LOOM_OK;
    return loom_error_set(err, mtype && strcmp(mtype, "BPE") != 0 ? LOOM_ERR_UNSUPPORTED : LOOM_ERR_FORMAT,
                          "%s: model '%s' is not supported; loom reads BPE models with a vocab "
                          "object and a merges array",
                          path, mtype ? mtype : "(no model)");
}

/* Build the tokenizer from the parsed files: family, vocabulary, merges,
 * specials and template, then (byte-level only) the pre-tokenizer splits. */
static loom_status build_from(const cJSON *root, const cJSON *cfg, const char *path, loom_tokenizer **out,
                              loom_error *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pretok = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    json_vocab v = {0};
    json_merges m = {0};
    json_family fam;
    loom_tokenizer *t = NULL;
    loom_status st;

    if ((st = check_model(model, path, err))) return st;
    if ((st = check_normalizer(normalizer, path, err))) return st;
    if ((st = detect_family(normalizer, pretok, cJSON_GetObjectItemCaseSensitive(root, "decoder"), path, &fam,
                            err)))
        return st;
    st = read_vocab(model, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), fam.kind, path, &v, err);
    if (st) goto free_tables;
    st = read_merges(cJSON_GetObjectItemCaseSensitive(model, "merges"), path, &m, err);
    if (st) goto free_tables;

    loom_tokenizer_spec spec;
    loom_tokenizer_spec_init(&spec);
    spec.model = fam.kind == TOK_SPM ? "llama" : "gpt2";
    spec.pre = "json";
    spec.n_vocab = (int32_t)v.nv;
    spec.tokens = v.toks;
    spec.token_types = v.types;
    spec.n_merges = m.n;
    spec.merges = m.list;
    spec.add_space_prefix = fam.space_prefix;
    set_specials(&spec, &v, model, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), cfg, fam.kind);
    spec.chat_template = chat_template(cfg);

    tok_build_opts opts = {.skip_pre = true, .force_kind = fam.kind,
                           .ignore_merges = jbool(model, "ignore_merges", 0) == 1,
                           .spm_prefix_first = fam.prefix_first, .spm_split = fam.spm_split,
                           .spm_prefix_unless_space = fam.meta != NULL,
                           .lstrip = v.lstrip, .rstrip = v.rstrip};
    st = tok_build(&spec, &opts, &t, err);
    if (st) {
        loom_error_prefix(err, "%s", path);
        goto free_tables;
    }
    if (fam.kind == TOK_BYTELEVEL && (st = add_pretok(t, pretok, path, err))) {
        loom_tokenizer_free(t);
        goto free_tables;
    }
    *out = t;
free_tables:
    json_vocab_free(&v);
    json_merges_free(&m);
    return st;
}

/* tokenizer.json's bytes (named `name`) and, when config_json is not NULL,
 * tokenizer_config.json's (named `config_name`) to a tokenizer: what the
 * file and the buffer entry points share. */
static loom_status from_bytes(const char *json, size_t len, const char *name, const char *config_json,
                              size_t config_len, const char *config_name, loom_tokenizer **out, loom_error *err) {
    cJSON *root = NULL, *cfg = NULL;
    loom_status st = parse_json(json, len, name, &root, err);
    if (st) goto free_json;
    if (config_json && (st = parse_json(config_json, config_len, config_name, &cfg, err))) goto free_json;
    st = build_from(root, cfg, name, out, err);
free_json:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return st;
}

loom_status loom_tokenizer_from_json_buffer(const char *json, size_t len, const char *config_json,
                                            size_t config_len, const char *name, loom_tokenizer **out,
                                            loom_error *err) {
    if (!out || (!json && len) || (!config_json && config_len))
        return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: NULL argument");
    *out = NULL;
    return from_bytes(json ? json : "", len, name ? name : "tokenizer.json", config_json, config_len,
                      "tokenizer_config.json", out, err);
}

loom_status loom_tokenizer_from_json(const char *path, const char *config_path,
                                     loom_tokenizer **out, loom_error *err) {
    if (!out || !path) return loom_error_set(err, LOOM_ERR_INVALID, "tokenizer: NULL argument");
    *out = NULL;
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    loom_status st = read_file(path, &json, &len, err);
    if (st) return st;
    if (!config_path || !(st = read_file(config_path, &cfg, &cfg_len, err)))
        st = from_bytes(json, len, path, cfg, cfg_len, config_path, out, err);
    free(json);
    free(cfg);
    return st;
}
