/*
 * core/pipeline/pipeline.c — load a pipeline YAML into bound slots: parse
 * (includes), override, check top-level keys, resolve plugin_path, bind the
 * core sections (model, engine), find and bind every plugin section.
 *
 * Every check appends to the caller's loom_diag and carries on, so one run
 * of `loom check` shows every unknown key, every missing plugin and every
 * bad value at once (GStreamer's "collect all missing elements" habit).
 * Paths written in a file are relative to that file (includes keep their
 * own directory); paths given with --set are relative to the working
 * directory.
 */
#include "pipeline/pipeline.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"

/* --------------------------------------------------------- core tables */

/* The model section as bound, before expansion. */
typedef struct model_raw {
    char path[LOOM_PARAM_STRING_MAX];
    int64_t format;
    char shape[LOOM_PARAM_STRING_MAX];
    int64_t seed;
    int64_t dtype;
    int64_t chat_template;
    int64_t layers;
} model_raw;

static const char *const k_formats[] = {"auto", "gguf", "safetensors", "dummy", NULL};
static const char *const k_dtypes[] = {"f32", "f16", "bf16", NULL};
static const loom_dtype k_dtype_values[] = {LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
static const char *const k_templates[] = {"auto", "chatml", "llama3", "llama2", "none", "gemma", NULL};

/* min > max: no bounds. */
static const loom_param k_model_params[] = {
    {"path", LOOM_PARAM_STRING, offsetof(model_raw, path), "", 1, 0, NULL,
     "model file (.gguf) or Hugging Face directory; ~ and ${VAR:-default} expanded; relative to "
     "the YAML file"},
    {"format", LOOM_PARAM_ENUM, offsetof(model_raw, format), "auto", 1, 0, k_formats,
     "weights format; auto = from the path (.gguf file, or a directory of safetensors)"},
    {"shape", LOOM_PARAM_STRING, offsetof(model_raw, shape), "", 1, 0, NULL,
     "dummy format only: named architecture shape of the random weights"},
    {"seed", LOOM_PARAM_INT, offsetof(model_raw, seed), "0", 1, 0, NULL,
     "dummy format only: seed of the random weights"},
    {"dtype", LOOM_PARAM_ENUM, offsetof(model_raw, dtype), "f32", 1, 0, k_dtypes,
     "dummy format only: storage dtype of the random weights (the backend picks the compute "
     "dtype: cpu float32, cuda backend.dtype)"},
    {"chat_template", LOOM_PARAM_ENUM, offsetof(model_raw, chat_template), "auto", 1, 0,
     k_templates, "chat prompt format; auto = from the model's metadata"},
    {"layers", LOOM_PARAM_INT, offsetof(model_raw, layers), "0", 0, 4096, NULL,
     "dummy format only: decoder layers of the random weights; 0 = the shape's"},
    {0},
};

typedef struct engine_raw {
    int64_t threads;
    int64_t max_model_len;
    int64_t seed;
    bool device_sampling;
    int64_t log_level;
    bool progress;
    int64_t mask_threads;
} engine_raw;

static const char *const k_log_levels[] = {"debug", "info", "warn", "error", NULL};

static const loom_param k_engine_params[] = {
    {"threads", LOOM_PARAM_INT, offsetof(engine_raw, threads), "0", 0, 4096, NULL,
     "worker threads for CPU work; 0 = all online cores"},
    {"max_model_len", LOOM_PARAM_INT, offsetof(engine_raw, max_model_len), "0", 0, 16777216, NULL,
     "longest sequence in tokens (prompt + output); 0 = the model's trained context"},
    {"seed", LOOM_PARAM_INT, offsetof(engine_raw, seed), "0", 1, 0, NULL,
     "base seed for requests that do not set one"},
    {"device_sampling", LOOM_PARAM_BOOL, offsetof(engine_raw, device_sampling), "true", 0, 0, NULL,
     "let the backend reduce logits rows where they are computed (top-64 + log-sum-exp) when "
     "that samples exactly and the sampler declares candidates; false = always whole rows"},
    {"log_level", LOOM_PARAM_ENUM, offsetof(engine_raw, log_level), "warn", 1, 0, k_log_levels,
     "messages on stderr at this level and above (info adds per-run summaries)"},
    {"progress", LOOM_PARAM_BOOL, offsetof(engine_raw, progress), "false", 0, 0, NULL,
     "show model-load progress on stderr even when it is not a terminal"},
    {"mask_threads", LOOM_PARAM_INT, offsetof(engine_raw, mask_threads), "0", 0, 256, NULL,
     "threads computing decoding-constraint masks while the device runs a step (with the step's "
     "own thread); 0 = the online cores minus one, at most 15"},
    {0},
};

static const struct {
    const char *key;
    loom_kind kind;
    bool required;
} k_slots[] = {
    {"backend", LOOM_KIND_BACKEND, false}, /* backend or executor: checked apart */
    {"executor", LOOM_KIND_EXECUTOR, false},
    {"scheduler", LOOM_KIND_SCHEDULER, true},
    {"cache", LOOM_KIND_CACHE, true},
    {"quantizer", LOOM_KIND_QUANTIZER, false},
    {"sampler", LOOM_KIND_SAMPLER, true},
    {"speculator", LOOM_KIND_SPECULATOR, false},
    {"constraint", LOOM_KIND_CONSTRAINT, false},
    {"kv_connector", LOOM_KIND_KV_CONNECTOR, false},
};
#define NUM_SLOTS ((int)(sizeof k_slots / sizeof k_slots[0]))

static const char *const k_top_keys[] = {
    "include", "plugin_path", "model", "engine", "backend", "executor",
    "scheduler", "cache", "quantizer", "sampler", "speculator", "constraint", "kv_connector", NULL,
};

static const char *const k_ignore_plugin[] = {"plugin", NULL};

struct loom_pipeline {
    char *file;                            /* as given, owned                 */
    char *dir;                             /* its directory, owned            */
    loom_cfg_node *root;                   /* merged tree, owned              */
    loom_registry *reg;                    /* owned                           */
    model_raw model_raw;                   /* as bound (for printing)         */
    engine_raw engine_raw;
    loom_model_settings model;
    loom_engine_settings engine;
    loom_pipeline_slot slots[NUM_SLOTS];   /* configured ones, canonical order */
    int nslots;
};

/* -------------------------------------------------------------- paths */

static char *dir_of(const char *file) {
    const char *slash = file ? strrchr(file, '/') : NULL;
    if (!slash) return loom_strdup(".");
    if (slash == file) return loom_strdup("/");
    return loom_strndup(file, (size_t)(slash - file));
}

/* Directory that relative paths written at `m` are relative to, in buf.
 * Values from --set (and nodes without a file) use the working directory. */
static void base_dir_of_mark(const loom_cfg_mark *m, char *buf, size_t n) {
    const char *file = m ? m->file : NULL;
    if (!file || file[0] == '<') {
        if (!getcwd(buf, n)) snprintf(buf, n, ".");
        return;
    }
    char *d = dir_of(file);
    snprintf(buf, n, "%s", d ? d : ".");
    free(d);
}

/* `rel` made absolute against `base` (itself made absolute against the
 * working directory). false when it does not fit. */
static bool join_path(const char *base, const char *rel, char *out, size_t n) {
    if (rel[0] == '/') return (size_t)snprintf(out, n, "%s", rel) < n;
    char cwd[PATH_MAX] = "";
    if (base[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    int w;
    if (base[0] == '/') w = snprintf(out, n, "%s/%s", base, rel);
    else if (strcmp(base, ".") == 0) w = snprintf(out, n, "%s/%s", cwd, rel);
    else w = snprintf(out, n, "%s/%s/%s", cwd, base, rel);
    if (w < 0 || (size_t)w >= n) return false;
    /* Drop "./" components so messages stay readable. */
    char *p;
    while ((p = strstr(out, "/./"))) memmove(p, p + 2, strlen(p + 2) + 1);
    return true;
}

/* Expand ${VAR} and ${VAR:-default} in `in` into out (n bytes). false with
 * `why` filled on an unset variable, a bad reference or overflow. */
static bool expand_vars(const char *in, char *out, size_t n, char *why, size_t whyn) {
    size_t o = 0;
    for (const char *s = in; *s;) {
        if (s[0] != '$' || s[1] != '{') {
            if (o + 1 >= n) goto overflow;
            out[o++] = *s++;
            continue;
        }
        const char *end = strchr(s + 2, '}');
        if (!end) {
            snprintf(why, whyn, "unterminated '${' in \"%s\"", in);
            return false;
        }
        char name[256];
        const char *colon = strstr(s + 2, ":-");
        const char *name_end = (colon && colon < end) ? colon : end;
        size_t len = (size_t)(name_end - (s + 2));
        if (len == 0 || len >= sizeof name) {
            snprintf(why, whyn, "bad variable reference in \"%s\"", in);
            return false;
        }
        memcpy(name, s + 2, len);
        name[len] = '\0';
        const char *val = getenv(name);
        char def[LOOM_PIPELINE_PATH_MAX];
        if (!val || !val[0]) {
            if (name_end == end) {
                snprintf(why, whyn,
                         "environment variable %.100s is not set (write ${%.100s:-default} to "
                         "give "
                         "a default)",
                         name, name);
                return false;
            }
            size_t dl = (size_t)(end - (colon + 2));
            if (dl >= sizeof def) dl = sizeof def - 1;
            memcpy(def, colon + 2, dl);
            def[dl] = '\0';
            val = def;
        }
        size_t vl = strlen(val);
        if (o + vl >= n) goto overflow;
        memcpy(out + o, val, vl);
        o += vl;
        s = end + 1;
    }
    out[o] = '\0';
    return true;
overflow:
    snprintf(why, whyn, "path too long after expansion: \"%s\"", in);
    return false;
}

/* The home directory a leading ~ or ~user of `path` names; *rest is what
 * follows it. NULL with `why` filled when it cannot be found. */
static const char *tilde_home(const char *path, const char **rest, char *why, size_t whyn) {
    const char *home = NULL;
    *rest = path + 1 + strcspn(path + 1, "/");
    if (*rest == path + 1) {
        home = getenv("HOME");
        if (!home || !home[0]) {
            struct passwd *pw = getpwuid(getuid());
            home = pw ? pw->pw_dir : NULL;
        }
    } else {
        char user[256];
        size_t ul = (size_t)(*rest - (path + 1));
        if (ul >= sizeof user) ul = sizeof user - 1;
        memcpy(user, path + 1, ul);
        user[ul] = '\0';
        struct passwd *pw = getpwnam(user);
        home = pw ? pw->pw_dir : NULL;
        if (!home) {
            snprintf(why, whyn, "unknown user in \"~%s\"", user);
            return NULL;
        }
    }
    if (!home) snprintf(why, whyn, "cannot expand '~': HOME is not set");
    return home;
}

/* Expand ${VAR}, ${VAR:-default} and a leading ~ / ~user. false with `why`
 * filled on an unset variable, a bad reference or overflow. */
static bool expand_path(const char *in, char *out, size_t n, char *why, size_t whyn) {
    char tmp[LOOM_PIPELINE_PATH_MAX];
    if (!expand_vars(in, tmp, sizeof tmp, why, whyn)) return false;
    /* Tilde after variables, so ${LOOM_CACHE:-~/.cache/loom} works as in sh. */
    const char *home = "", *rest = tmp;
    if (tmp[0] == '~' && !(home = tilde_home(tmp, &rest, why, whyn))) return false;
    if ((size_t)snprintf(out, n, "%s%s", home, rest) >= n) {
        snprintf(why, whyn, "path too long after expansion: \"%s\"", in);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------- top level */

static void check_top_keys(const loom_cfg_node *root, loom_diag *diag) {
    for (int i = 0; i < loom_cfg_size(root); i++) {
        const char *key = NULL;
        loom_cfg_child(root, i, &key);
        if (!key) continue;
        bool known = false;
        for (int k = 0; k_top_keys[k]; k++)
            if (strcmp(k_top_keys[k], key) == 0) known = true;
        if (known) continue;
        const char *best = NULL;
        int best_d = 3;
        for (int k = 0; k_top_keys[k]; k++) {
            int d = loom_name_distance(key, k_top_keys[k]);
            if (d < best_d) {
                best_d = d;
                best = k_top_keys[k];
            }
        }
        char hint[96] = "";
        if (best) snprintf(hint, sizeof hint, " did you mean '%s'?", best);
        loom_diag_add(diag, loom_cfg_key_mark(root, i),
                      "unknown top-level key '%s';%s valid keys: include, plugin_path, model, "
                      "engine, backend, executor, scheduler, cache, quantizer, sampler, "
                      "speculator, constraint, kv_connector",
                      key, hint);
    }
}

/* plugin_path: a string or a list of strings, each relative to its file. */
static char **resolve_plugin_path(const loom_cfg_node *root, int *count, loom_diag *diag) {
    *count = 0;
    const loom_cfg_node *pp = loom_cfg_get(root, "plugin_path");
    if (!pp || loom_cfg_type_of(pp) == LOOM_CFG_NULL) return NULL;
    bool seq = loom_cfg_type_of(pp) == LOOM_CFG_SEQ;
    if (!seq && loom_cfg_type_of(pp) != LOOM_CFG_SCALAR) {
        loom_diag_add(diag, loom_cfg_mark_of(pp),
                      "plugin_path must be a directory or a list of directories, got a %s",
                      loom_cfg_type_name(loom_cfg_type_of(pp)));
        return NULL;
    }
    int n = seq ? loom_cfg_size(pp) : 1;
    char **dirs = calloc((size_t)n + 1, sizeof *dirs);
    if (!dirs) return NULL;
    for (int i = 0; i < n; i++) {
        const loom_cfg_node *item = seq ? loom_cfg_child(pp, i, NULL) : pp;
        const char *text = loom_cfg_scalar(item);
        if (!text) {
            loom_diag_add(diag, loom_cfg_mark_of(item),
                          "plugin_path[%d] must be a directory name, got a %s", i,
                          loom_cfg_type_name(loom_cfg_type_of(item)));
            continue;
        }
        char expanded[LOOM_PIPELINE_PATH_MAX], why[LOOM_ERROR_MSG_MAX - 64];
        char base[PATH_MAX], full[LOOM_PIPELINE_PATH_MAX];
        if (!expand_path(text, expanded, sizeof expanded, why, sizeof why)) {
            loom_diag_add(diag, loom_cfg_mark_of(item), "plugin_path: %s", why);
            continue;
        }
        base_dir_of_mark(loom_cfg_mark_of(item), base, sizeof base);
        if (!join_path(base, expanded, full, sizeof full)) {
            loom_diag_add(diag, loom_cfg_mark_of(item), "plugin_path: path too long");
            continue;
        }
        dirs[(*count)++] = loom_strdup(full);
    }
    return dirs;
}

/* ------------------------------------------------------- core sections */

static void bind_model(loom_pipeline *p, loom_diag *diag) {
    const loom_cfg_node *sec = loom_cfg_get(p->root, "model");
    if (!sec || loom_cfg_type_of(sec) == LOOM_CFG_NULL) {
        loom_diag_add(diag, &(loom_cfg_mark){.file = p->file},
                      "missing required section 'model' (e.g. `model: {path: "
                      "models/SmolLM2-135M-Instruct.Q4_1.gguf}`)");
        return;
    }
    p->model.mark = *loom_cfg_mark_of(sec);
    if (!loom_cfg_bind(sec, "model", k_model_params, NULL, &p->model_raw, sizeof p->model_raw,
                       diag))
        return;
    const model_raw *r = &p->model_raw;
    p->model.format = (loom_model_format)r->format;
    snprintf(p->model.shape, sizeof p->model.shape, "%s", r->shape);
    p->model.seed = r->seed;
    p->model.dtype = k_dtype_values[r->dtype];
    p->model.layers = (int32_t)r->layers;
    p->model.chat_template = (loom_chat_template)r->chat_template;

    const loom_cfg_node *pn = loom_cfg_get(sec, "path");
    const loom_cfg_mark *pm = pn ? loom_cfg_mark_of(pn) : &p->model.mark;
    if (!r->path[0]) {
        if (p->model.format != LOOM_MODEL_FORMAT_DUMMY)
            loom_diag_add(diag, pm,
                          "model.path is required (a .gguf file or a Hugging Face directory), "
                          "unless model.format is dummy");
        else if (!r->shape[0])
            loom_diag_add(diag, pm, "model.shape is required when model.format is dummy");
        return;
    }
    char expanded[LOOM_PIPELINE_PATH_MAX], why[LOOM_ERROR_MSG_MAX - 64], base[PATH_MAX];
    if (!expand_path(r->path, expanded, sizeof expanded, why, sizeof why)) {
        loom_diag_add(diag, pm, "model.path: %s", why);
        return;
    }
    base_dir_of_mark(pm, base, sizeof base);
    if (!join_path(base, expanded, p->model.path, sizeof p->model.path)) {
        loom_diag_add(diag, pm, "model.path: path too long");
        return;
    }
    struct stat sb;
    if (p->model.format != LOOM_MODEL_FORMAT_DUMMY && stat(p->model.path, &sb) != 0)
        loom_diag_add(diag, pm,
                      "model.path: cannot open '%s': %s (fetch the default model with "
                      "scripts/fetch-model.sh, or fix the path)",
                      p->model.path, strerror(errno));
}

static void bind_engine(loom_pipeline *p, loom_diag *diag) {
    const loom_cfg_node *sec = loom_cfg_get(p->root, "engine");
    if (!loom_cfg_bind(sec, "engine", k_engine_params, NULL, &p->engine_raw, sizeof p->engine_raw,
                       diag))
        return;
    p->engine.threads = (int32_t)p->engine_raw.threads;
    p->engine.max_model_len = (int32_t)p->engine_raw.max_model_len;
    p->engine.seed = p->engine_raw.seed;
    p->engine.device_sampling = p->engine_raw.device_sampling;
    p->engine.log_level = (loom_log_level)p->engine_raw.log_level;
    p->engine.progress = p->engine_raw.progress;
    p->engine.mask_threads = (int32_t)p->engine_raw.mask_threads;
}

/* ------------------------------------------------------- plugin slots */

static bool is_path(const char *name) {
    size_t n = strlen(name);
    return strchr(name, '/') || (n >= 3 && strcmp(name + n - 3, ".so") == 0);
}

/* Find and bind one slot; false on OOM only (problems go to diag). */
static bool bind_slot(loom_pipeline *p, int si, const loom_cfg_node *sec, loom_diag *diag) {
    const char *key = k_slots[si].key;
    loom_kind kind = k_slots[si].kind;
    const loom_cfg_mark *sm = loom_cfg_mark_of(sec);
    if (loom_cfg_type_of(sec) != LOOM_CFG_MAP) {
        const char *text = loom_cfg_scalar(sec);
        loom_diag_add(diag, sm,
                      "section '%s' must be a map with at least `plugin:`, e.g. `%s: {plugin: "
                      "%s}`; got %s%s%s",
                      key, key, text ? text : "NAME", text ? "'" : "a ",
                      text ? text : loom_cfg_type_name(loom_cfg_type_of(sec)), text ? "'" : "");
        return true;
    }
    const loom_cfg_node *pn = loom_cfg_get(sec, "plugin");
    if (!pn) {
        loom_diag_add(diag, sm,
                      "section '%s' has no `plugin:` key naming the %s to use (see `loom "
                      "plugins`)",
                      key, kind == LOOM_KIND_CACHE ? "cache manager" : loom_kind_name(kind));
        return true;
    }
    const char *name = loom_cfg_scalar(pn);
    if (!name || !name[0]) {
        loom_diag_add(diag, loom_cfg_mark_of(pn),
                      "%s.plugin must be a plugin name or a path to a .so, got %s%s", key,
                      name ? "an empty string" : "a ",
                      name ? "" : loom_cfg_type_name(loom_cfg_type_of(pn)));
        return true;
    }
    char target[LOOM_PIPELINE_PATH_MAX];
    snprintf(target, sizeof target, "%s", name);
    if (is_path(name)) {
        char expanded[LOOM_PIPELINE_PATH_MAX], why[LOOM_ERROR_MSG_MAX - 64], base[PATH_MAX];
        if (!expand_path(name, expanded, sizeof expanded, why, sizeof why)) {
            loom_diag_add(diag, loom_cfg_mark_of(pn), "%s.plugin: %s", key, why);
            return true;
        }
        base_dir_of_mark(loom_cfg_mark_of(pn), base, sizeof base);
        if (!join_path(base, expanded, target, sizeof target)) {
            loom_diag_add(diag, loom_cfg_mark_of(pn), "%s.plugin: path too long", key);
            return true;
        }
    }
    const loom_component *comp = NULL;
    loom_plugin *plugin = NULL;
    loom_error err = {0};
    if (loom_registry_find(p->reg, kind, target, &comp, &plugin, &err) != LOOM_OK) {
        if (err.code == LOOM_ERR_NOMEM) return false;
        loom_diag_add(diag, loom_cfg_mark_of(pn), "%s.plugin: %s", key, err.message);
        return true;
    }
    loom_pipeline_slot *s = &p->slots[p->nslots];
    *s = (loom_pipeline_slot){
        .kind = kind,
        .section = key,
        .name = name,
        .component = comp,
        .plugin = plugin,
        .path = loom_plugin_path(plugin),
        .mark = *sm,
    };
    /* At least one byte, so configs are never NULL (and memset never sees NULL). */
    s->config = calloc(1, comp->config_size ? comp->config_size : 1);
    if (!s->config) return false;
    p->nslots++;
    loom_cfg_bind(sec, key, comp->params, k_ignore_plugin, s->config, comp->config_size, diag);
    return true;
}

static bool bind_slots(loom_pipeline *p, loom_diag *diag) {
    bool have[NUM_SLOTS] = {0};
    for (int i = 0; i < NUM_SLOTS; i++) {
        const loom_cfg_node *sec = loom_cfg_get(p->root, k_slots[i].key);
        /* `speculator: null` (e.g. --set speculator=null) turns a slot off. */
        if (!sec || loom_cfg_type_of(sec) == LOOM_CFG_NULL) continue;
        have[i] = true;
        if (!bind_slot(p, i, sec, diag)) return false;
    }
    loom_cfg_mark top = {.file = p->file};
    if (!have[0] && !have[1])
        loom_diag_add(diag, &top,
                      "missing required section 'backend' (or 'executor'): where the forward "
                      "pass runs, e.g. `backend: {plugin: cpu}`");
    for (int i = 0; i < NUM_SLOTS; i++)
        if (k_slots[i].required && !have[i])
            loom_diag_add(diag, &top, "missing required section '%s', e.g. `%s: {plugin: %s}`",
                          k_slots[i].key, k_slots[i].key,
                          k_slots[i].kind == LOOM_KIND_SCHEDULER ? "continuous"
                          : k_slots[i].kind == LOOM_KIND_CACHE   ? "paged"
                                                                 : "standard");
    return true;
}

/* ---------------------------------------------------------------- load */

/* Entries in reading order: by file, line, column; entries without a line
 * (missing sections, --set values) after those with one. Stable, so
 * messages at one position keep the order they were found in. */
static int diag_cmp(const loom_diag_entry *a, const loom_diag_entry *b) {
    bool pa = a->mark.file && a->mark.line > 0, pb = b->mark.file && b->mark.line > 0;
    if (pa != pb) return pa ? -1 : 1;
    if (!pa) return 0;
    int c = strcmp(a->mark.file, b->mark.file);
    if (c) return c;
    if (a->mark.line != b->mark.line) return a->mark.line < b->mark.line ? -1 : 1;
    return a->mark.col < b->mark.col ? -1 : a->mark.col > b->mark.col;
}

static void diag_sort(loom_diag *d, int from) {
    for (int i = from + 1; i < d->count; i++) {
        loom_diag_entry e = d->entries[i];
        int j = i;
        for (; j > from && diag_cmp(&d->entries[j - 1], &e) > 0; j--)
            d->entries[j] = d->entries[j - 1];
        d->entries[j] = e;
    }
}

loom_status loom_pipeline_load(const char *path, const char *const *overrides, int num_overrides,
                               loom_pipeline **out, loom_diag *diag) {
    loom_status st = LOOM_ERR_INVALID;
    int before = diag ? diag->count : 0;
    char **dirs = NULL;
    int ndirs = 0;
    loom_pipeline *p = NULL;
    loom_diag local;
    loom_diag_init(&local);
    if (!diag) diag = &local; /* errors still have to be counted */
    if (out) *out = NULL;
    if (!path || !out) {
        loom_diag_add(diag, NULL, "loom_pipeline_load: no pipeline file given");
        goto fail;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) {
        loom_diag_add(diag, NULL, "cannot open pipeline '%s': %s", path, strerror(errno));
        st = LOOM_ERR_NOT_FOUND;
        goto fail;
    }
    p = calloc(1, sizeof *p);
    if (!p || !(p->file = loom_strdup(path)) || !(p->dir = dir_of(path))) goto oom;

    p->root = loom_cfg_load_file(path, diag);
    if (!p->root) {
        st = LOOM_ERR_FORMAT;
        goto fail;
    }
    for (int i = 0; i < num_overrides; i++)
        loom_cfg_set_override(p->root, overrides[i], i + 1, diag);

    check_top_keys(p->root, diag);
    dirs = resolve_plugin_path(p->root, &ndirs, diag);
    loom_error err = {0};
    if (loom_registry_create((const char *const *)dirs, ndirs, "plugin_path", LOOM_REGISTRY_DEFAULT,
                             &p->reg, &err) != LOOM_OK)
        goto oom;
    bind_model(p, diag);
    bind_engine(p, diag);
    if (!bind_slots(p, diag)) goto oom;
    if (diag->count != before) goto fail;

    for (int i = 0; i < ndirs; i++) free(dirs[i]);
    free(dirs);
    loom_diag_free(&local);
    *out = p;
    return LOOM_OK;

oom:
    loom_diag_add(diag, NULL, "out of memory loading pipeline '%s'", path ? path : "?");
    st = LOOM_ERR_NOMEM;
fail:
    if (diag) diag_sort(diag, before);
    for (int i = 0; i < ndirs; i++) free(dirs[i]);
    free(dirs);
    loom_pipeline_destroy(p);
    loom_diag_free(&local);
    return st;
}

void loom_pipeline_destroy(loom_pipeline *p) {
    if (!p) return;
    for (int i = 0; i < p->nslots; i++) free(p->slots[i].config);
    loom_registry_destroy(p->reg);
    loom_cfg_free(p->root);
    free(p->file);
    free(p->dir);
    free(p);
}

/* ----------------------------------------------------------- accessors */

const loom_pipeline_slot *loom_pipeline_slot_get(const loom_pipeline *p, loom_kind kind) {
    for (int i = 0; p && i < p->nslots; i++)
        if (p->slots[i].kind == kind) return &p->slots[i];
    return NULL;
}

int loom_pipeline_num_slots(const loom_pipeline *p) { return p ? p->nslots : 0; }

const loom_pipeline_slot *loom_pipeline_slot_at(const loom_pipeline *p, int i) {
    return p && i >= 0 && i < p->nslots ? &p->slots[i] : NULL;
}

const loom_model_settings *loom_pipeline_model(const loom_pipeline *p) { return p ? &p->model : NULL; }
const loom_engine_settings *loom_pipeline_engine(const loom_pipeline *p) {
    return p ? &p->engine : NULL;
}
const loom_cfg_node *loom_pipeline_tree(const loom_pipeline *p) { return p ? p->root : NULL; }
loom_registry *loom_pipeline_registry(loom_pipeline *p) { return p ? p->reg : NULL; }
const char *loom_pipeline_file(const loom_pipeline *p) { return p ? p->file : NULL; }
const char *loom_pipeline_dir(const loom_pipeline *p) { return p ? p->dir : NULL; }

const loom_param *loom_pipeline_section_params(const char *section) {
    if (section && !strcmp(section, "model")) return k_model_params;
    if (section && !strcmp(section, "engine")) return k_engine_params;
    return NULL;
}

loom_status loom_pipeline_create_instance(const loom_pipeline_slot *slot, const loom_host *host,
                                          void **self, loom_error *err) {
    if (!slot || !self)
        return loom_error_set(err, LOOM_ERR_INVALID, "pipeline_create_instance: no slot");
    /* the registry's message names the kind, the component and its file */
    return loom_plugin_create_instance(slot->plugin, slot->component, host, slot->config, self, err);
}

void loom_pipeline_destroy_instance(const loom_pipeline_slot *slot, void *self) {
    if (!slot) return;
    loom_plugin_destroy_instance(slot->plugin, slot->component, self);
}

/* ------------------------------------------------------------ printing */

/* Bare when YAML reads it back as the same string, else double-quoted. */
static void print_string(const char *s, FILE *f) {
    static const char *const reserved[] = {"true", "false", "yes", "no", "on", "off",
                                           "null", "y", "n", "~", NULL};
    bool bare = s[0] != '\0' && !strchr("-.+0123456789", s[0]);
    for (const char *c = s; bare && *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              strchr("_./-+", *c)))
            bare = false;
    for (int i = 0; bare && reserved[i]; i++)
        if (strcasecmp(s, reserved[i]) == 0) bare = false;
    if (bare) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c == '\n') fputs("\\n", f);
        else if (*c == '\t') fputs("\\t", f);
        else if (*c < 0x20) fprintf(f, "\\x%02x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

void loom_param_print_value(const loom_param *param, const void *config, FILE *f) {
    const char *at = (const char *)config + param->offset;
    switch (param->type) {
    case LOOM_PARAM_BOOL: {
        bool b;
        memcpy(&b, at, sizeof b);
        fputs(b ? "true" : "false", f);
        return;
    }
    case LOOM_PARAM_INT: {
        int64_t v;
        memcpy(&v, at, sizeof v);
        fprintf(f, "%lld", (long long)v);
        return;
    }
    case LOOM_PARAM_FLOAT: {
        double v;
        memcpy(&v, at, sizeof v);
        if (isnan(v)) fputs(".nan", f);
        else if (isinf(v)) fputs(v > 0 ? ".inf" : "-.inf", f);
        else {
            /* Shortest text that reads back as the same double. */
            char buf[64];
            snprintf(buf, sizeof buf, "%.15g", v);
            if (strtod(buf, NULL) != v) snprintf(buf, sizeof buf, "%.17g", v);
            if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
            fputs(buf, f);
        }
        return;
    }
    case LOOM_PARAM_STRING: {
        char s[LOOM_PARAM_STRING_MAX];
        memcpy(s, at, sizeof s);
        s[sizeof s - 1] = '\0';
        print_string(s, f);
        return;
    }
    case LOOM_PARAM_ENUM: {
        int64_t v;
        memcpy(&v, at, sizeof v);
        int64_t n = 0;
        while (param->choices && param->choices[n]) n++;
        if (v >= 0 && v < n) fputs(param->choices[v], f);
        else fprintf(f, "%lld", (long long)v);
        return;
    }
    }
    fputs("~", f);
}

static void print_params(const loom_param *params, const void *config, FILE *f) {
    for (const loom_param *q = params; q && q->key; q++) {
        fprintf(f, "  %s: ", q->key);
        loom_param_print_value(q, config, f);
        fputc('\n', f);
    }
}

void loom_pipeline_print(const loom_pipeline *p, FILE *f) {
    if (!p || !f) return;
    fprintf(f, "# %s, resolved: includes, overrides and defaults applied\n", p->file);
    int nd = loom_registry_num_dirs(p->reg);
    if (nd) fprintf(f, "# plugin search path:\n");
    for (int i = 0; i < nd; i++) {
        const char *origin = NULL;
        bool exists = false;
        const char *d = loom_registry_dir(p->reg, i, &origin, &exists);
        fprintf(f, "#   %s (%s%s)\n", d, origin, exists ? "" : ", missing");
    }
    /* The file's own plugin_path, absolute, so the printed YAML loads anywhere. */
    bool any = false;
    for (int i = 0; i < nd; i++) {
        const char *origin = NULL;
        const char *d = loom_registry_dir(p->reg, i, &origin, NULL);
        if (strcmp(origin, "plugin_path") != 0) continue;
        fputs(any ? "\n  - " : "plugin_path:\n  - ", f);
        print_string(d, f);
        any = true;
    }
    if (any) fputc('\n', f);
    fprintf(f, "model:\n  path: ");
    print_string(p->model.path, f);
    fputc('\n', f);
    for (const loom_param *q = k_model_params + 1; q->key; q++) {
        fprintf(f, "  %s: ", q->key);
        loom_param_print_value(q, &p->model_raw, f);
        fputc('\n', f);
    }
    fprintf(f, "engine:\n");
    print_params(k_engine_params, &p->engine_raw, f);
    for (int i = 0; i < p->nslots; i++) {
        const loom_pipeline_slot *s = &p->slots[i];
        const loom_plugin_desc *d = loom_plugin_desc_of(s->plugin);
        fprintf(f, "%s:\n  plugin: ", s->section);
        /* Loaded by path: print the absolute path, which still works elsewhere. */
        print_string(is_path(s->name) ? s->path : s->component->name, f);
        fprintf(f, "  # %s (plugin %s %s, ABI %u.%u)\n", s->path, d->name,
                d->version ? d->version : "?", d->abi_major, d->abi_minor);
        print_params(s->component->params, s->config, f);
    }
}
