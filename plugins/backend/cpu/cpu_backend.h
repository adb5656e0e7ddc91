/*
 * plugins/backend/cpu/cpu_backend.h — private state of the cpu backend
 * (loom-backend-cpu.so), shared by its two source files: cpu_backend.c
 * (descriptor, lifetime, weights, memory, KV pools) and cpu_forward.c (the
 * forward pass and the checks on each batch).
 *
 * Weights are dequantized to float32 at load into one 64-byte-aligned arena,
 * with Q, K, V fused into one (q_dim + 2 kv_dim, hidden) matrix and gate/up
 * into one (2 * intermediate, hidden) matrix, so a decode step streams each
 * layer in four GEMVs. Not an installed header.
 *
 * Tensor parallelism (load_shard, loom/backend.h): a rank keeps only its
 * shard — its query heads and the KV heads they read, its slice of the FFN
 * width, its slice of the vocabulary — and `mc` then describes the model as
 * this rank runs it (num_heads, num_kv_heads, intermediate_size are the
 * rank's share; vocab_size stays the whole vocabulary), so the KV pools,
 * scratch and kernels need no other change. See docs/tensor-parallel.md.
 *
 * Pipeline parallelism (load_stage): an instance holds decoder layers
 * layer0..layer0+nlayers-1 (indexed by their model-wide number in `layers`;
 * the others stay zero) and KV pools for those only; the first stage keeps
 * the embedding, the last the output norm and LM head (a tied head: the
 * embedding's rows), a middle stage none of them.
 */
#ifndef LOOM_PLUGIN_CPU_BACKEND_H
#define LOOM_PLUGIN_CPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "loom/backend.h"
#include "loom/plugin.h"
#include "loom/quant.h"
#include "qlinear.h"
#include "weight_walk.h"

#define CPU_WHO "backend.cpu"

/* The bound configuration the host fills from the `params` table. */
typedef struct cpu_backend_config {
    int64_t threads;      /* compute threads; 0 = host->num_threads()          */
    int64_t kv_dtype;     /* index into cpu_kv_dtype_choices: 0 f32, 1 f16     */
    int64_t weight_dtype; /* index into cpu_weight_dtype_choices: 0 f32, 1 gguf */
    int64_t cpu_isa;      /* index into cpu_isa_choices: 0 auto, else a q8 path */
    int64_t moe_dispatch; /* CPU_MOE_ALL_REDUCE or CPU_MOE_ALL_TO_ALL (sharded MoE) */
} cpu_backend_config;
enum { CPU_MOE_ALL_REDUCE = 0, CPU_MOE_ALL_TO_ALL = 1 };

/* One linear weight as this rank runs it: float32 rows in the arena, or a
 * quantized view (format != NONE in the quantizer's plan). */
typedef struct cpu_lin {
    bool quant;             /* true: `w` below; false: float rows `f`          */
    bool owned;             /* q came from quantize(): release() at destroy    */
    const float *f;         /* (rows, cols) float32 in the arena, when !quant  */
    loom_cpu_qweight w;     /* kernel view (this rank's slice) when quant      */
    loom_qtensor q;         /* quantizer-owned whole tensor (q.owner / data set:
                               released at destroy); empty for GGUF views     */
} cpu_lin;

/* Linear weights of a layer, in this order (fused groups: Q K V, gate up). */
enum { CPU_LQ, CPU_LK, CPU_LV, CPU_LO, CPU_LGATE, CPU_LUP, CPU_LDOWN, CPU_NLIN };

/* One SwiGLU expert (routed or shared): gate, up, down as cpu_lins; wgu
 * is the fused (2 width, hidden) float matrix gate-then-up when both are
 * float, wdown the float down matrix (NULL when quantized). */
enum { CPU_EGATE, CPU_EUP, CPU_EDOWN, CPU_NEXP };
typedef struct cpu_expert {
    cpu_lin lin[CPU_NEXP];
    const float *wgu;       /* (2 width, hidden) or NULL                     */
    const float *wdown;     /* (hidden, width) or NULL                       */
} cpu_expert;

/* A mixture-of-experts FFN (loom/model.h): the router, every routed expert
 * and the optional shared expert with its sigmoid gate. */
typedef struct cpu_moe {
    const float *router;    /* (experts, hidden) float32, every expert       */
    int32_t e0, n;          /* this rank's experts: e0 .. e0 + n - 1         */
    cpu_expert *ex;         /* (n) host->calloc'd                            */
    cpu_expert sh;          /* the shared expert (this rank's width), when sh_gate */
    const float *sh_gate;   /* (hidden) or NULL: no shared expert            */
    int64_t sh_width;       /* this rank's columns of the shared expert      */
} cpu_moe;

/* One decoder layer's weights. The float path keeps Q, K, V fused into one
 * matrix and gate/up into another; when the quantizer changes any part of
 * a group, each part is its own cpu_lin (float parts still carved in order,
 * so consecutive float parts stay contiguous). */
typedef struct cpu_layer {
    const float *attn_norm; /* (hidden)                                      */
    const float *wqkv;      /* (q_dim + 2 kv_dim, hidden): rows Q, then K, V;
                               NULL when a part is quantized                 */
    const float *bqkv;      /* (q_dim + 2 kv_dim) Qwen2 bias, or NULL        */
    const float *wo;        /* (hidden, q_dim), NULL when quantized          */
    const float *ffn_norm;  /* (hidden)                                      */
    const float *wgu;       /* (2 intermediate, hidden): rows gate, then up;
                               NULL when a part is quantized                 */
    const float *wdown;     /* (hidden, intermediate), NULL when quantized   */
    cpu_lin lin[CPU_NLIN];  /* per part (float pointer or quantized view)    */
    /* Gemma 3 (NULL for Llama / Qwen2) */
    const float *q_norm;    /* (head_dim) RMSNorm weight of every q head     */
    const float *k_norm;    /* (head_dim) ... and of every k head            */
    const float *post_attn_norm; /* (hidden) on the attention output         */
    const float *post_ffn_norm;  /* (hidden) on the FFN output               */
    /* mixture of experts instead of wgu / wdown (moe.ex NULL: dense) */
    cpu_moe moe;
} cpu_layer;

typedef struct cpu_backend {
    const loom_host *host;      /* borrowed until destroy                     */
    cpu_backend_config cfg;     /* copy of the bound config                   */
    int threads;                /* resolved thread count                      */
    loom_cpu_pool *pool;        /* attention / element-wise threads           */

    /* --- after load */
    bool loaded;
    loom_model_config mc;       /* the model's config as this rank runs it    */
    int32_t q_dim, kv_dim;      /* heads x head_dim                           */
    int32_t qkv_rows;           /* q_dim + 2 kv_dim                           */
    void *arena_raw;            /* host->alloc'd; arena is it, 64-B aligned   */
    float *arena;
    size_t weight_bytes;        /* bytes of the arena in use                  */
    const float *embed;         /* (vocab_rows, hidden); NULL: embed_blocks    */
    const loom_tensor *embed_blocks; /* (vocab, hidden) GGUF blocks a lookup
                                   decodes one row of (a whole model whose
                                   tied LM head keeps them); else NULL        */
    const float *out_norm;      /* (hidden)                                   */
    const float *lm_head;       /* (vocab_rows, hidden); == embed when tied   */
    cpu_layer *layers;          /* (num_layers)                               */
    double *inv_freq;           /* (head_dim / 2) RoPE frequencies            */
    double *inv_freq_local;     /* (head_dim / 2) of sliding-window layers     */

    /* --- quantized weights (loom/quant.h, kernels/cpu/qlinear.h) */
    loom_quant_binding quant;   /* copy of the binding; ops NULL: none        */
    cpu_lin lm_q;               /* output.weight when quantized (lm_q.quant)   */
    loom_cpu_qscratch *qscratch;/* quantized-kernel scratch; NULL: none needed */
    size_t qweight_bytes;       /* bytes of quantized weight data this rank reads */

    /* --- tensor parallelism: set by load_shard; whole model after load() */
    bool sharded;               /* forward() calls the collectives of `comm`  */
    loom_comm comm;             /* copy of the executor's communicator        */
    int32_t vocab_lo;           /* first vocabulary row this rank holds       */
    int32_t vocab_rows;         /* rows it holds, 0..vocab_pad                */
    int32_t vocab_pad;          /* ceil(vocab / size): every rank's share of
                                   a logits row, padding included            */
    int64_t lg_rows;            /* logits rows lg_local / lg_all can hold     */
    float *lg_local;            /* (lg_rows, vocab_pad) this rank's logits;
                                   host->alloc'd, lg_all carved after it      */
    float *lg_all;              /* (size, lg_rows, vocab_pad) gathered        */

    /* --- pipeline parallelism: set by load_stage; every layer after load() */
    int32_t layer0, nlayers;    /* the decoder layers held: layer0..+nlayers-1 */
    bool first_stage;           /* embeds the tokens (else recv_prev)         */
    bool last_stage;            /* final norm and LM head (else send_next)    */
    loom_stage stage;           /* copy of the executor's links; zero: whole  */

    /* --- after kv_alloc */
    bool kv_ready;
    loom_kv_layout kv_layout;   /* copy; dtype resolved to F32, F16 or FP8_E4M3 */
    size_t kv_block_bytes;      /* one block of one pool (K or V) of a layer  */
    int32_t kv_pools;           /* K/V pool pairs: the held layers, or with
                                   block-table groups layers_per_block       */
    int32_t *kv_slot;           /* (nlayers) each held layer's pool pair      */
    int32_t *kv_group;          /* (nlayers) its block-table group            */
    uint8_t *kv;                /* (kv_pools, 2, num_blocks) blocks           */
    uint8_t *swap;              /* (kv_pools, 2, num_cpu_blocks) blocks or NULL */

    /* --- forward scratch, grown on demand (float32) */
    int64_t scratch_rows;       /* token rows the scratch holds               */
    float *scratch;             /* host->alloc'd block carved below           */
    float *attn_part;           /* attention's key-chunk states (cpu_attn_part) */
    int64_t attn_part_floats;
    float *x;                   /* (rows, hidden) residual stream             */
    float *xn;                  /* (rows, hidden) normed                      */
    float *qkv;                 /* (rows, qkv_rows)                           */
    float *att;                 /* (rows, q_dim) attention output             */
    float *gu;                  /* (rows, 2 intermediate)                     */
    float *act;                 /* (rows, intermediate)                       */
    float *rope_cos, *rope_sin; /* (rows, head_dim / 2)                       */
    float *rope_cos_local, *rope_sin_local; /* (rows, head_dim / 2) local layers' */
    float *topk_logits;         /* (rows, vocab) forward_topk's whole rows    */
    /* --- mixture-of-experts scratch (cpu_moe.c), grown on demand */
    int64_t moe_rows;           /* token rows it holds                        */
    void *moe_scratch;          /* host->alloc'd block carved below           */
    float *moe_logits;          /* (rows, experts) router logits / weights    */
    float *moe_xg;              /* (rows, hidden) rows routed to one expert   */
    float *moe_gu;              /* (rows, 2 max width) gate|up                */
    float *moe_act;             /* (rows, max width)                          */
    float *moe_y;               /* (rows, hidden) one expert's output         */
    float *moe_out;             /* (rows, hidden) the layer's FFN output      */
    float *moe_wt;              /* (rows * top-k) routing weight of each pair */
    float *moe_slotw;           /* (rows, top-k) weight of each (token, slot) */
    int32_t *moe_tok;           /* (rows * top-k) token of each pair, by expert */
    int32_t *moe_sel;           /* (rows, top-k) expert of each (token, slot) */
    int32_t *moe_off;           /* (experts + 1) first pair of each expert    */
    int32_t *moe_fill;          /* (experts) cursors while grouping           */
    int64_t moe_ep_rows;        /* token rows the all-to-all scratch holds    */
    void *moe_ep;               /* host->alloc'd all-to-all scratch (cpu_moe.c) */
    size_t topk_cap;            /* floats it holds                            */

    /* --- calibration (set_observer); obs.record NULL: none installed */
    loom_act_observer obs;      /* copy of the installed observer             */
} cpu_backend;

/* cpu_moe.c */
/* Layer l's FFN for a mixture of experts: x (T, H) = beta_res * x + this
 * rank's experts' weighted outputs (+ its part of the shared expert's) of
 * rmsnorm(x); beta_res 1 on a whole model or rank 0, else 0. Sharded with
 * moe_dispatch all_to_all, the routed part travels by all-to-all instead;
 * *combined is then true when x already holds the whole result on every
 * rank (no shared expert), so the caller skips its all-reduce. */
loom_status cpu_moe_block(cpu_backend *b, int64_t T, int32_t l, float beta_res, bool *combined, loom_error *err);
/* load: an error when moe_dispatch all_to_all meets a communicator without
 * all_to_allv (a MoE model under an executor that lacks it). */
loom_status cpu_moe_check_comm(const cpu_backend *b, const loom_model_config *c, const loom_comm *comm,
                               loom_error *err);
/* Floats of layer wl's expert weights kept as float32 (cpu_moe_load carves them). */
size_t cpu_moe_floats(const cpu_backend *b, const loom_ww_layer *wl);
/* Load layer l's experts (walk layer wl) into ly->moe, carving float parts from *cur. */
loom_status cpu_moe_load(cpu_backend *b, const loom_model_view *m, const loom_ww_layer *wl, cpu_layer *ly,
                         float **cur, loom_error *err);
/* Release the quantizer-owned tensors and the expert arrays of every layer. */
void cpu_moe_release(cpu_backend *b);

/* cpu_backend.c, for cpu_moe.c */
loom_status cpu_dequant_win(cpu_backend *b, const loom_ww_part *p, float *dst, loom_error *err);
loom_status cpu_load_qlin(cpu_backend *b, const loom_model_view *m, const loom_ww_part *p,
                          const loom_quant_plan *plan, cpu_lin *out, loom_error *err);
float *cpu_carve(float **cursor, size_t n);

/* cpu_forward.c */
loom_status cpu_backend_forward(void *self, const loom_batch *batch, float *logits,
                                loom_error *err);
loom_status cpu_backend_forward_topk(void *self, const loom_batch *batch, const loom_logits_topk *out,
                                     loom_error *err);

loom_status cpu_backend_set_observer(void *self, const loom_act_observer *obs, loom_error *err);

/* K or V pool `kv` (0 = K, 1 = V) of pool pair `slot` (0..kv_pools-1) in
 * the device (swap = false) or host swap (swap = true) pool. */
static inline uint8_t *cpu_slot_base(const cpu_backend *b, int32_t slot, int kv, bool swap) {
    int64_t nb = swap ? b->kv_layout.num_cpu_blocks : b->kv_layout.num_blocks;
    uint8_t *base = swap ? b->swap : b->kv;
    return base + ((int64_t)slot * 2 + kv) * nb * (int64_t)b->kv_block_bytes;
}

/* The same of decoder layer `layer` (a held one: layer0..layer0+nlayers-1). */
static inline uint8_t *cpu_pool_base(const cpu_backend *b, int32_t layer, int kv, bool swap) {
    return cpu_slot_base(b, b->kv_slot[layer - b->layer0], kv, swap);
}

#endif
