/*
 * core/model/model_internal.h — the loom_model object shared by the three
 * loaders (model_gguf.c, model_safetensors.c, model_dummy.c) and the common
 * code in model.c: tensor table, owned memory, config validation and the
 * shape check every loader ends with. Not for use outside core/model.
 */
#ifndef LOOM_CORE_MODEL_INTERNAL_H
#define LOOM_CORE_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"
#include "formats/dtype.h"

typedef struct lm_map {
    void *addr;
    size_t size;
} lm_map;

typedef struct lm_unsupported {
    char *name;          /* tensor name                          */
    char *type;          /* type as named by the file, e.g. "iq2_xxs" */
} lm_unsupported;

struct loom_model {
    loom_model_config cfg;
    loom_model_packing packing;  /* method NULL unless an AWQ/GPTQ checkpoint    */
    char packing_src[64];        /* file the packing was read from (message text) */
    loom_model_view view;
    const char *format;          /* static string                                   */
    loom_tensor *tensors;        /* n_tensors, name -> names[i]                     */
    char **names;
    int32_t n_tensors, cap_tensors;
    int32_t *sorted;             /* tensor indices by name (built by lm_index)      */
    void **owned;                /* malloc'd blocks freed with the model            */
    int32_t n_owned, cap_owned;
    lm_map *maps;                /* mmaps (files, dummy arena) unmapped with the model */
    int32_t n_maps, cap_maps;
    lm_unsupported *unsup;       /* file tensors loom cannot read (GGUF)            */
    int32_t n_unsup, cap_unsup;
    loom_gguf *gguf;
    char *dir;
    char *tokenizer_json;
};

/* Where each config value came from, for messages such as
 * "expected (1536, 576) from llama.feed_forward_length=1536, ...". */
typedef struct lm_keys {
    const char *vocab, *hidden, *inter, *layers, *heads, *kv_heads, *head_dim;
    /* mixture of experts; NULL: a generic label */
    const char *experts, *experts_used, *expert_inter, *shared_inter;
} lm_keys;

loom_model *lm_new(const char *format);
/* Append a tensor (name copied; data borrowed from a map or owned block). */
loom_status lm_add_tensor(loom_model *m, const char *name, loom_dtype dt, int ndim, const int64_t *shape,
                          void *data, size_t nbytes, loom_error *err);
loom_status lm_add_unsupported(loom_model *m, const char *name, const char *type, loom_error *err);
void *lm_alloc(loom_model *m, size_t size);        /* owned by m; NULL on OOM  */
/* data itself when its address is a multiple of align, else a copy of its
 * nbytes in m's aligned storage (a file may place tensors anywhere: GGUF
 * general.alignment = 1, safetensors offsets); NULL on OOM. */
void *lm_aligned_data(loom_model *m, void *data, size_t nbytes, size_t align);
loom_status lm_add_map(loom_model *m, void *addr, size_t size, loom_error *err);
/* Map a whole file read-only (size 0 allowed: addr NULL). */
loom_status lm_map_file(loom_model *m, const char *path, const void **addr, size_t *size, loom_error *err);
/* Tensor lookup index; fails on duplicate names. */
loom_status lm_index(loom_model *m, const char *src, loom_error *err);
loom_tensor *lm_find(const loom_model *m, const char *name);
/* Range/consistency checks of the hyper-parameters. */
loom_status lm_check_config(const loom_model_config *c, const char *src, const lm_keys *k, loom_error *err);
/* Every required tensor present, readable, with the expected shape/dtype. */
loom_status lm_validate(loom_model *m, const char *src, const lm_keys *k, loom_error *err);
const char *lm_arch_name(loom_arch a);             /* "llama", "qwen2", "gemma3", "qwen3moe", ... */
void lm_progress(const loom_model_load_opts *o, const char *what, double fraction);

loom_status lm_load_gguf(loom_model *m, const loom_model_load_opts *o, loom_error *err);
loom_status lm_load_safetensors(loom_model *m, const loom_model_load_opts *o, loom_error *err);
loom_status lm_load_dummy(loom_model *m, const loom_model_load_opts *o, loom_error *err);

#endif
