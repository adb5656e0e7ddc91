/*
 * core/pipeline/pipeline.h — a YAML pipeline file turned into what the
 * engine needs: the model and engine settings, and one bound plugin per
 * slot (backend, executor, scheduler, cache, quantizer, sampler, speculator).
 *
 * Loading parses the file (with `include:`), applies `--set a.b=value`
 * overrides, checks every top-level key, builds a plugin registry over the
 * file's `plugin_path` (+ LOOM_PLUGIN_PATH + the build/install dirs), finds
 * each slot's component and binds its section to the component's declared
 * parameter table. Like GStreamer's parse-launch, every problem (unknown
 * key, unknown plugin, bad value, missing section) is collected before it
 * fails, each with file:line:col.
 *
 * What it is not: it creates no instances by itself and loads no model; the
 * engine calls loom_pipeline_create_instance() per slot, in its own order.
 *
 * Ownership: the pipeline owns the tree, the registry, the bound configs and
 * every string reachable from the structs below; all are valid until
 * loom_pipeline_destroy. Instances must be destroyed (with
 * loom_pipeline_destroy_instance) before the pipeline; if one outlives it
 * anyway its shared object stays loaded (see registry.h), but its slot
 * pointer is gone. Threads: [engine].
 */
#ifndef LOOM_CORE_PIPELINE_H
#define LOOM_CORE_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "loom/plugin.h"
#include "plugin/registry.h"

typedef struct loom_pipeline loom_pipeline;

/* ---------------------------------------------------------- model/engine */

typedef enum loom_model_format {
    LOOM_MODEL_FORMAT_AUTO = 0,        /* from the path: .gguf, directory = safetensors */
    LOOM_MODEL_FORMAT_GGUF = 1,
    LOOM_MODEL_FORMAT_SAFETENSORS = 2, /* HF directory: config.json + *.safetensors */
    LOOM_MODEL_FORMAT_DUMMY = 3,       /* random weights of `shape`           */
} loom_model_format;

typedef enum loom_chat_template {
    LOOM_CHAT_TEMPLATE_AUTO = 0,       /* from the model's metadata           */
    LOOM_CHAT_TEMPLATE_CHATML = 1,
    LOOM_CHAT_TEMPLATE_LLAMA3 = 2,
    LOOM_CHAT_TEMPLATE_LLAMA2 = 3,
    LOOM_CHAT_TEMPLATE_NONE = 4,       /* prompts are used as written         */
    LOOM_CHAT_TEMPLATE_GEMMA = 5,
} loom_chat_template;

#define LOOM_PIPELINE_PATH_MAX 4096

/* The `model:` section, bound and expanded. */
typedef struct loom_model_settings {
    char path[LOOM_PIPELINE_PATH_MAX]; /* `~` and ${VAR}/${VAR:-default} expanded,
                                          made absolute against the directory of the
                                          file that wrote it; "" = none (dummy) */
    loom_model_format format;
    char shape[LOOM_PARAM_STRING_MAX]; /* dummy: named shape, e.g. "llama3-8b" */
    int64_t seed;                      /* dummy: weight seed                   */
    int32_t layers;                    /* dummy: decoder layers; 0 = the shape's */
    loom_dtype dtype;                  /* compute dtype: F32, F16 or BF16      */
    loom_chat_template chat_template;
    loom_cfg_mark mark;                /* where `model:` was written           */
} loom_model_settings;

/* The `engine:` section (all defaults when absent). */
typedef struct loom_engine_settings {
    int32_t threads;       /* worker threads; 0 = all online cores             */
    int32_t max_model_len; /* tokens per sequence; 0 = the model's context     */
    int64_t seed;          /* base seed for requests without one               */
    bool device_sampling;  /* use the backend's forward_topk when exact        */
    loom_log_level log_level; /* stderr messages at this level and above       */
    bool progress;         /* model-load progress even without a terminal      */
    int32_t mask_threads;  /* constraint-mask workers; 0 = cores - 1, <= 15    */
} loom_engine_settings;

/* ------------------------------------------------------------------ slots */

/* One configured slot. Everything is owned by the pipeline (the component
 * and its ops by the plugin's shared object). */
typedef struct loom_pipeline_slot {
    loom_kind kind;                  /* what the slot holds                    */
    const char *section;             /* its YAML key: "scheduler", ...        */
    const char *name;                /* `plugin:` value as written             */
    const loom_component *component; /* the component found                    */
    loom_plugin *plugin;             /* its shared object                      */
    const char *path;                /* that object's real path                */
    void *config;                    /* bound config, component->config_size bytes
                                        (at least 1 allocated); borrowed by create */
    loom_cfg_mark mark;              /* where the section starts               */
} loom_pipeline_slot;

/* ------------------------------------------------------------------- API */

/* Load `path` with `num_overrides` "a.b=value" assignments (applied in order
 * after includes; the i-th is reported as "<command line> (argument i+1)").
 * On success *out is a pipeline every slot of which resolved and bound. On
 * failure *out is NULL, every problem is in `diag` (caller-owned,
 * initialised with loom_diag_init) and the result is LOOM_ERR_INVALID (bad
 * configuration), LOOM_ERR_FORMAT (YAML syntax), LOOM_ERR_NOT_FOUND (no such
 * file) or LOOM_ERR_NOMEM. */
loom_status loom_pipeline_load(const char *path, const char *const *overrides, int num_overrides,
                               loom_pipeline **out, loom_diag *diag);
/* NULL-safe. See the ownership note above. */
void        loom_pipeline_destroy(loom_pipeline *p);

/* The slot of `kind`, or NULL when that slot is not configured. */
const loom_pipeline_slot *loom_pipeline_slot_get(const loom_pipeline *p, loom_kind kind);
/* Configured slots in canonical order (backend, executor, scheduler, cache,
 * quantizer, sampler, speculator), for printing and iteration. */
int                       loom_pipeline_num_slots(const loom_pipeline *p);
const loom_pipeline_slot *loom_pipeline_slot_at(const loom_pipeline *p, int i);

const loom_model_settings  *loom_pipeline_model(const loom_pipeline *p);
const loom_engine_settings *loom_pipeline_engine(const loom_pipeline *p);
/* The declared parameters of the core's own sections, "model" or "engine"
 * (NULL-key-terminated; NULL for any other name): what `loom plugins
 * --params` prints beside the plugins'. */
const loom_param           *loom_pipeline_section_params(const char *section);
/* The merged tree (after includes and overrides), as written. */
const loom_cfg_node        *loom_pipeline_tree(const loom_pipeline *p);
/* The registry the slots were found in (for `loom plugins`-style output). */
loom_registry              *loom_pipeline_registry(loom_pipeline *p);
/* The pipeline file as given, and its directory (for relative paths that
 * plugins receive, e.g. loom_spec_init.pipeline_dir). */
const char                 *loom_pipeline_file(const loom_pipeline *p);
const char                 *loom_pipeline_dir(const loom_pipeline *p);

/* Create an instance of the slot's component: ops->create(host, slot->config)
 * with host NULL meaning loom_host_default(). Keeps the shared object loaded
 * until loom_pipeline_destroy_instance. On failure nothing is left behind
 * and err says which slot and plugin failed and why. */
loom_status loom_pipeline_create_instance(const loom_pipeline_slot *slot, const loom_host *host,
                                          void **self, loom_error *err);
/* ops->destroy(self) and release the shared object. self may be NULL. */
void        loom_pipeline_destroy_instance(const loom_pipeline_slot *slot, void *self);

/* Print the resolved pipeline as YAML: model and engine with every value,
 * then each slot with `plugin:` (its file in a comment) and every declared
 * parameter, defaults included — what will actually run. */
void loom_pipeline_print(const loom_pipeline *p, FILE *f);

/* Print one value of a declared parameter read from a bound config struct,
 * as YAML would accept it back (strings quoted when needed). */
void loom_param_print_value(const loom_param *param, const void *config, FILE *f);

#endif
