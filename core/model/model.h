/*
 * core/model/model.h — loading a model's configuration and weights from a
 * GGUF file, a Hugging Face safetensors directory, or a named dummy shape,
 * and presenting them through one loom_model_view (include/loom/model.h).
 *
 * Whatever the source, tensors carry canonical GGUF names and row-major
 * shapes, Q/K rows are in Hugging Face (NeoX RoPE) order, and every tensor
 * the architecture needs has been checked against the config before load
 * returns. Weights are host memory: mmap'd from the file where possible,
 * owned copies where the loader had to reorder rows (GGUF Q/K), generated
 * for dummy models. Internal to the core; not installed.
 */
#ifndef LOOM_CORE_MODEL_H
#define LOOM_CORE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/tensor.h"
#include "model/gguf.h"

typedef struct loom_model loom_model;

typedef struct loom_model_load_opts {
    const char *path;          /* .gguf file, safetensors directory (or a file in it); NULL for dummy */
    const char *format;        /* "auto" (or NULL) | "gguf" | "safetensors" | "dummy"              */
    const char *dummy_shape;   /* "llama3-8b" | "llama2-7b" | "smollm2-135m" | "qwen2-0.5b" | "tiny" */
    uint64_t seed;             /* dummy: weights are a pure function of (shape, dtype, seed)      */
    loom_dtype dummy_dtype;    /* dummy: F32 (0, the default), F16 or BF16                        */
    int32_t num_layers_override; /* > 0: dummy only, use this many layers                         */
    /* Optional: called on the loading thread with fraction in [0, 1]. */
    void (*progress)(void *user, const char *what, double fraction);
    void *user;                /* passed to progress                                               */
    /* In memory instead of files (format "gguf" or "safetensors", never
     * "auto"; path then only names the model in messages): a GGUF image, or
     * one safetensors file with config_json holding config.json's text.
     * Borrowed: tensors point into `data`, which must outlive the model.
     * Every check of the file path runs (tests/fuzz loads models this way). */
    const void *data;          /* GGUF image or safetensors file; NULL: read path              */
    size_t size;               /* bytes of data                                                   */
    const char *config_json;   /* safetensors in memory: config.json (not NUL-terminated)         */
    size_t config_json_len;    /* its bytes                                                       */
} loom_model_load_opts;

/* Load a model. On success *out owns everything (mappings, copies). On
 * failure *out is NULL, nothing is left behind and err names the file,
 * tensor or key at fault and what to do. [any] thread; not reentrant per
 * opts->progress. */
loom_status loom_model_load(const loom_model_load_opts *o, loom_model **out, loom_error *err);
void loom_model_free(loom_model *m);

/* Borrowed views, valid until loom_model_free(). */
const loom_model_view *loom_model_view_get(const loom_model *m);
const loom_model_config *loom_model_config_get(const loom_model *m);
const loom_gguf *loom_model_gguf(const loom_model *m);       /* NULL unless GGUF                    */
const char *loom_model_tokenizer_json(const loom_model *m);   /* safetensors: tokenizer.json or NULL */
const char *loom_model_dir(const loom_model *m);              /* directory of the model; NULL for dummy */

/* ---------------------------------------------------------------- additions */

/* "gguf", "safetensors" or "dummy". */
const char *loom_model_format_name(const loom_model *m);
/* Tensor by canonical name (same as the view's get), or NULL. */
const loom_tensor *loom_model_tensor(const loom_model *m, const char *name);
/* A 4-bit packed checkpoint (AutoAWQ / AutoGPTQ / GPTQModel safetensors,
 * read from config.json's `quantization_config`). Its linear weights are
 * shape-only `<name>.weight` descriptors (data NULL, nbytes 0, dtype the
 * scales' float type, shape (out, in)) next to `<name>.qweight`, `.qzeros`,
 * `.scales` and (GPTQ) `.g_idx`; only a quantizer that unpacks them (int4
 * with `source` = method) can run the model; loom_model_packing is in
 * loom/model.h. */

/* The checkpoint's packing, or NULL for float / GGUF / dummy models. */
const loom_model_packing *loom_model_packing_get(const loom_model *m);
/* The shape-only descriptor `w` (a `.weight`) stands for packed tensors. */
bool loom_model_is_packed_weight(const loom_model *m, const loom_tensor *w);

/* Names of the dummy shapes, NULL-terminated (for help texts). */
const char *const *loom_model_dummy_shapes(void);

/*
 * Row permutations of llama.cpp's GGUF converter for Q/K projections.
 * A matrix of n_rows = n_head * head_dim rows (row_bytes each; or a bias with
 * row_bytes = element size) is viewed as heads of head_dim rows.
 *   permute   (llama.cpp convert_hf_to_gguf.py `permute`, HF -> GGUF):
 *             dst[h*hd + 2*j + i] = src[h*hd + i*hd/2 + j]
 *   unpermute (GGUF -> HF, what the loader applies):
 *             dst[h*hd + i*hd/2 + j] = src[h*hd + 2*j + i]
 * for i in {0,1}, j in [0, hd/2). src and dst must not overlap. Returns
 * LOOM_ERR_INVALID when n_rows is not a multiple of 2*n_head.
 */
loom_status loom_model_permute_rows(const void *src, void *dst, int64_t n_rows, size_t row_bytes,
                                    int32_t n_head);
loom_status loom_model_unpermute_rows(const void *src, void *dst, int64_t n_rows, size_t row_bytes,
                                      int32_t n_head);

#endif
