/*
 * plugins/quantizer/int4/awq_gptq.h — 4-bit AWQ and GPTQ checkpoints
 * (safetensors qweight / qzeros / scales / g_idx of a Linear with `n`
 * outputs and `k` inputs) to loom's INT4 layout (loom/quant.h).
 *
 * Layouts, as written by AutoGPTQ / GPTQModel and AutoAWQ (int32 words,
 * 8 nibbles each, bits 4j..4j+3 = nibble j):
 *   GPTQ  qweight (k/8, n): word [i, c] packs inputs 8i..8i+7 of output c,
 *                          nibble j = input 8i+j (sequential along k);
 *         qzeros  (k/g, n/8): word [grp, i] packs outputs 8i..8i+7, nibble j
 *                          = output 8i+j; stored zero = real zero - 1 in the
 *                          original ("v1") format, the real zero in "v2";
 *         scales  (k/g, n) f16; g_idx (k) int32: group of input row
 *                          (act-order / desc_act makes it non-monotonic).
 *   AWQ   qweight (k, n/8): word [r, i] packs outputs 8i..8i+7 of input r in
 *                          the interleaved order [0, 2, 4, 6, 1, 3, 5, 7]:
 *                          nibble j holds output 8i + order[j];
 *         qzeros  (k/g, n/8): same interleaving; the real zero;
 *         scales  (k/g, n) f16; no g_idx.
 * Both dequantize as w[c, r] = (q - zero[group(r), c]) * scale[group(r), c].
 *
 * loom INT4: data U8 (n, k/2), low nibble = even input; scales and zeros
 * F32 (n, k/g) with contiguous groups of g inputs. A GPTQ act-order tensor
 * (g_idx not r / g) has no exact loom INT4 form; i4_unpack_f32 gives its
 * exact float weights instead (the int4 plugin re-quantizes those to int8).
 */
#ifndef LOOM_QUANT_AWQ_GPTQ_H
#define LOOM_QUANT_AWQ_GPTQ_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/tensor.h"

typedef enum i4_packing {
    I4_PACK_AWQ = 0,     /* AutoAWQ GEMM layout                             */
    I4_PACK_GPTQ = 1,    /* GPTQ v1: stored zeros are zero - 1              */
    I4_PACK_GPTQ_V2 = 2, /* GPTQ v2 (GPTQModel format=gptq_v2): real zeros  */
} i4_packing;

/* The four tensors of one packed Linear (g_idx may be NULL). Borrowed. */
typedef struct i4_packed {
    i4_packing packing;
    int64_t n, k;                  /* outputs, inputs                        */
    int32_t group_size;            /* inputs per group (derived by check)    */
    const loom_tensor *qweight;    /* I32, see above                         */
    const loom_tensor *qzeros;     /* I32 (k/g, n/8)                         */
    const loom_tensor *scales;     /* F16 / BF16 / F32 (k/g, n)              */
    const loom_tensor *g_idx;      /* I32 (k) or NULL                        */
} i4_packed;

/* "awq", "gptq", "gptq_v2". */
const char *i4_packing_name(i4_packing p);

/* Check dtypes and shapes of p's tensors against (p->n, p->k) and the
 * packing, derive p->group_size from the scales' rows, and check g_idx
 * values lie in [0, k/g). `name` (the .weight name) and `who` go into the
 * message; a shape that fits the other packing says so. */
loom_status i4_packed_check(const loom_host *h, const char *who, const char *name, i4_packed *p,
                            loom_error *err);

/* g_idx absent, or g_idx[r] == r / group_size for every r. */
bool i4_gidx_trivial(const i4_packed *p);

/* Unpack a checked tensor with trivial g_idx into loom INT4: data (n, k/2),
 * scales and zeros (n, k/g). Uses host->dequantize for the scales. */
loom_status i4_unpack(const loom_host *h, const char *who, const char *name, const i4_packed *p,
                      uint8_t *data, float *scales, float *zeros, loom_error *err);

/* Exact float weights w (n, k) of a checked tensor, any g_idx. */
loom_status i4_unpack_f32(const loom_host *h, const char *who, const char *name,
                          const i4_packed *p, float *w, loom_error *err);

#endif
