/*
 * loom/quant.h — quantizers: which format each weight takes, the quantized
 * data itself, and the KV-cache element type.
 *
 * At load time a backend walks the model's tensors and, for each linear
 * weight, asks the bound quantizer for a plan (keep, int8, fp8, int4, or the
 * GGUF block type as stored) and, if it changes the format, for the
 * quantized tensor in host memory. The backend then uploads it and runs its
 * own linear kernel for that format; a backend lacking a format fails
 * load() with an error naming the tensor, the format and the backends that
 * have it. Quantizers never touch devices.
 *
 * Threads (tags: loom/plugin.h): plan, quantize and release are [instance]
 * — called from inside a backend's load(), which runs on the engine's
 * thread or, under an executor, on each rank's own thread; ranks load one
 * after another, so these calls come from several threads but never
 * concurrently. Keep no thread-local state between them. create, destroy,
 * kv_dtype and accepts_packing are [engine].
 */
#ifndef LOOM_QUANT_H
#define LOOM_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Weight formats with a linear kernel in a backend. Stable values. */
typedef enum loom_qformat {
    LOOM_QFMT_NONE = 0,        /* backend's compute dtype (f32 / bf16)            */
    LOOM_QFMT_INT8_W8A16 = 1,  /* int8 weights, per-output-channel f32 scales     */
    LOOM_QFMT_INT8_W8A8 = 2,   /* int8 weights + per-token dynamic int8 activations */
    LOOM_QFMT_FP8_W8A8 = 3,    /* e4m3 weights, per-tensor/channel scales, e4m3 acts */
    LOOM_QFMT_INT4_W4A16 = 4,  /* group-wise asymmetric 4-bit, f32 scale + zero   */
    LOOM_QFMT_GGUF = 5,        /* GGUF block type as stored (q4_0, q4_1, q4_k ...) */
} loom_qformat;

/* The quantizer's decision for one tensor. Grows only at its end. */
typedef struct loom_quant_plan {
    uint32_t struct_size;
    loom_qformat format;       /* what the backend will hold                 */
    int32_t group_size;        /* INT4: input elements per group (e.g. 128)  */
    bool per_channel;          /* FP8: per-output-channel (true) or per-tensor scale */
} loom_quant_plan;

/*
 * A quantized weight of logical shape (rows = out, cols = in), in host
 * memory owned by the quantizer until release(). Grows only at its end.
 *   INT8_*   : data I8 (rows, cols); scales F32 (rows)
 *   FP8_W8A8 : data FP8_E4M3 (rows, cols); scales F32 (rows) or (1)
 *   INT4     : data U8 (rows, cols/2), low nibble = even column;
 *              scales F32 (rows, cols/group); zeros F32 (rows, cols/group);
 *              w = (q - zero) * scale
 *   GGUF     : data as stored (dtype q4_0/q4_1/q5_0/q8_0/q4_k/q5_k/q6_k), no scales
 *   smooth   : SmoothQuant, INT8_W8A8 and FP8_W8A8 only: F32 (cols),
 *              activations are divided by it before quantization (weights
 *              were multiplied); else empty.
 */
typedef struct loom_qtensor {
    uint32_t struct_size;
    loom_qformat format;
    int64_t rows, cols;
    int32_t group_size;
    loom_tensor data;
    loom_tensor scales;
    loom_tensor zeros;
    loom_tensor smooth;
    void *owner;               /* quantizer-private; release() frees it       */
} loom_qtensor;

typedef struct loom_quant_ops {
    uint32_t struct_size;
    loom_create_fn *create;       /* REQUIRED (loom/plugin.h)                 */
    /* REQUIRED; called after every backend released the tensors it got
     * from quantize(). */
    loom_destroy_fn *destroy;

    /* REQUIRED [instance] (see Threads above). Decide the format of tensor
     * `w` (a 2-D linear weight named by its canonical name). Embeddings,
     * norms and (by default) the LM head are usually kept (LOOM_QFMT_NONE).
     * The core sets out->struct_size and zeroes the rest. */
    loom_status (*plan)(void *self, const loom_model_view *model, const loom_tensor *w,
                        loom_quant_plan *out, loom_error *err);
    /* REQUIRED [instance]. Produce the quantized tensor for a plan whose
     * format is not NONE or GGUF, in host memory owned by the quantizer. A
     * plan this quantizer would never give is either honoured exactly or
     * refused (LOOM_ERR_UNSUPPORTED naming the tensor).
     * `w` may be any type host->convert reads, or a packed weight this
     * quantizer accepted (accepts_packing). */
    loom_status (*quantize)(void *self, const loom_model_view *model, const loom_tensor *w,
                            const loom_quant_plan *plan, loom_qtensor *out, loom_error *err);
    /* REQUIRED [instance]. Free what quantize() allocated; a no-op on an
     * empty (zeroed) tensor. */
    void (*release)(void *self, loom_qtensor *q);
    /* OPTIONAL [engine] (NULL = the backend's default KV type). The
     * KV-cache element type this quantizer asks for — one loom_kv_layout
     * allows: F32, F16, BF16 or FP8_E4M3 — or LOOM_DTYPE_COUNT for the
     * backend's default. */
    loom_dtype (*kv_dtype)(void *self);
    /* OPTIONAL [engine] (NULL = float weights only). Called before any
     * backend loads a model whose linear weights exist only packed
     * (model->packing, loom/model.h): LOOM_OK when this instance, as
     * configured, can quantize() those packed weights; otherwise
     * LOOM_ERR_INVALID with what to change in its configuration (e.g. "set
     * quantizer.source: awq"). After LOOM_OK the core also checks that
     * plan() gives every packed weight a format other than NONE. */
    loom_status (*accepts_packing)(void *self, const loom_model_view *model, loom_error *err);
    /* since ABI 2.0 — add new members below this line only */
} loom_quant_ops;

/* What a backend receives in load(): the quantizer instance. Grows only at
 * its end. */
typedef struct loom_quant_binding {
    uint32_t struct_size;
    const loom_quant_ops *ops;
    void *self;
    const char *name;          /* plugin component name, for messages        */
} loom_quant_binding;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_QUANT_H */
