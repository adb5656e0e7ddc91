/*
 * plugins/backend/cuda/cuda_backend.h — private state of the cuda backend
 * (loom-backend-cuda.so), shared by its source files: cuda_backend.c
 * (descriptor, parameters, lifetime, memory, KV pools, block copies),
 * cuda_load.c (weights to the device), cuda_forward.c (batch checks,
 * the per-step metadata, the forward pass, CUDA graphs) and cuda_moe.c (a
 * mixture of experts' FFN: docs/moe.md).
 *
 * Weights live in one device arena in the compute type (bf16 or f16), with
 * Q, K, V fused into one (q_dim + 2 kv_dim, hidden) matrix and gate/up into
 * one (2 intermediate, hidden) matrix, so a layer is four GEMMs; norm
 * weights and QKV biases are float32. Work buffers are sized at load for
 * `max_batched_tokens` rows, so forward() never allocates device memory
 * (a precondition of CUDA-graph replay). Not an installed header.
 *
 * Tensor parallelism (load_shard, loom/backend.h, docs/tensor-parallel.md):
 * a rank keeps only its shard — its query heads and the KV heads they read,
 * its slice of the FFN width, its slice of the vocabulary padded with zero
 * rows to vocab_pad — and `mc` then describes the model as this rank runs
 * it (num_heads, num_kv_heads, intermediate_size are the rank's share;
 * vocab_size stays the whole vocabulary), so the KV pools, work buffers and
 * kernels need no other change. Every added path is guarded by `sharded`
 * (a communicator of more than one rank); without it nothing differs from
 * a plain single-GPU instance.
 */
#ifndef LOOM_PLUGIN_CUDA_BACKEND_H
#define LOOM_PLUGIN_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_kernels.h"
#include "loom/backend.h"
#include "loom/plugin.h"
#include "formats/dtype.h"

#define CB_WHO "backend.cuda"

/* Logits rows computed per LM-head GEMM, at least: the work buffers hold
 * max(CB_LOGITS_ROWS, max_graph_batch) rows (bounded by max_batched_tokens,
 * cb_logits_rows), since a graph computes every row of its bucket in one
 * LM-head GEMM. Bounds the device logits buffer and its pinned host mirror
 * (1024 rows of Llama-3's vocabulary: 525 MB each). */
#define CB_LOGITS_ROWS 256
#define CB_MAX_GRAPH_BATCH 1024
/* CUDA-graph batch buckets: a step of n sequences, each with at most
 * CB_GRAPH_MAX_Q query tokens (decode: 1; verifying drafts: k + 1), runs
 * the graph of (the smallest bucket >= n, q = the most tokens any of them
 * has), every sequence padded to q tokens and the batch to the bucket
 * with dummy ones (cuda_forward.c). */
#define CB_GRAPH_MAX_Q 8
/* A step pads to the next bucket: past 16 sequences each bucket is at most
 * 1.5x the one before (1.25x past 128), so padding adds at most a half (a
 * quarter) to a decode step's rows. */
#define CB_NUM_BUCKETS 23
static const int32_t cb_buckets[CB_NUM_BUCKETS] = {1,   2,   4,   8,   16,  24,  32,  48,  64,  96,  128, 160,
                                                   192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024};

/* Piecewise graphs for every other step (prefill, mixed prefill + decode):
 * the step's T token rows pad to a token bucket — 1, 2, 4, 8, then
 * multiples of 16 (at most 15 rows of padding: 1.5% of a 1024-token step)
 * — and everything but attention runs as captured graphs, one a layer
 * boundary (cuda_forward.c). */
#define CB_MAX_GRAPH_TOKENS 8192
#define CB_NUM_TOK_BUCKETS (4 + CB_MAX_GRAPH_TOKENS / 16)
static inline int32_t cb_tok_bucket_rows(int32_t k) { return k < 4 ? 1 << k : (k - 3) * 16; }
/* The bucket of a step of T >= 1 rows (may be past the last one). */
static inline int32_t cb_tok_bucket(int32_t T) {
    if (T <= 8) return T <= 1 ? 0 : T <= 2 ? 1 : T <= 4 ? 2 : 3;
    return (T + 15) / 16 + 3;
}

/* A step's path through cb_step, and the host phases its wall time is
 * split into (cuda_forward.c: cb_mark; logged at destroy). */
enum { CB_PATH_GRAPH = 0, CB_PATH_PIECE = 1, CB_PATH_EAGER = 2, CB_PATHS = 3 };
enum {
    CB_PH_PREP = 0,    /* batch checks, metadata packed into pinned staging */
    CB_PH_LAUNCH = 1,  /* the upload and every launch up to the logits' */
    CB_PH_MASK = 2,    /* the caller's constraint masks (fill_masks)    */
    CB_PH_EMIT = 3,    /* top-k / masks / logits copies enqueued        */
    CB_PH_WAIT = 4,    /* cudaStreamSynchronize                         */
    CB_PH_OUT = 5,     /* results copied to the caller after the wait   */
    CB_PH_CAPTURE = 6, /* a decode graph captured after its first step  */
    CB_PHASES = 7
};

/* The bound configuration the host fills from the `params` table. */
typedef struct cuda_backend_config {
    int64_t device;             /* CUDA ordinal                                  */
    int64_t dtype;              /* index into cb_dtype_choices: 0 bf16, 1 f16    */
    bool cuda_graphs;           /* capture/replay pure decode steps              */
    int64_t max_graph_batch;    /* largest decode batch run through a graph (1..CB_MAX_GRAPH_BATCH) */
    bool piecewise_graphs;      /* other steps: all but attention from graphs   */
    int64_t max_graph_tokens;   /* largest such step (1..CB_MAX_GRAPH_TOKENS)   */
    int64_t max_batched_tokens; /* token rows the work buffers hold              */
    int64_t max_positions;      /* RoPE table length; 0 = the model's context    */
    bool batch_invariant;       /* a token's result independent of the step's
                                   other tokens (docs/gpu.md)                   */
    int64_t qgemv_tc_min_rows;  /* rows from which W8A8 / FP8 / INT4 GEMVs take
                                   the tensor cores; 0 = as measured, 9 = never */
    int64_t quant_layout;       /* W8A16 / INT4 codes: 0 "rows" (as uploaded),
                                   1 "tiled" (repacked at load, qtiled.cu)     */
    int64_t qtiled_max_rows;    /* tiled: the kernel up to these rows (in
                                   256-row chunks), then dequantize + cuBLASLt */
    int64_t qtiled_wgmma_rows;  /* tiled: its wgmma path from these rows
                                   (0 = never)                                  */
    bool qtiled_epilogues;      /* tiled: one-token steps fuse RoPE + KV write
                                   and SwiGLU into the K-split reduce where
                                   K is split                                 */
    bool trigger_first;         /* kernels let the next launch before their
                                   wait (loom_cuda_set_trigger_first)          */
    int64_t fp8_vec_rows;       /* FP8 GEMMs: cuBLASLt's scale vectors from
                                   these rows, unit scales + a scale pass below */
    bool step_split;            /* per-phase step timing (cuda_forward.c)     */
    bool kv_groups;             /* propose block-table groups (kv_groups())    */
    int64_t sm_count;           /* > 0: run on a green context of that many SMs */
    int64_t sm_partition;       /* 0 "first": those sm_count SMs; 1 "rest": the
                                   SMs the split leaves over (the complement) */
    int64_t moe_dispatch;       /* expert parallelism: 0 "all_reduce", 1
                                   "all_to_all" (cuda_moe.c)                    */
    int64_t moe_expert_gemm_rows; /* eager steps averaging these rows an expert:
                                   one cuBLASLt GEMM an expert (0: never)        */
    int64_t moe_wgmma_rows;     /* steps averaging these rows an expert: the
                                   grouped GEMMs on wgmma (0: never)             */
    int64_t moe_wgmma_128_rows; /* wgmma steps averaging these rows an expert:
                                   128-row tiles (0: never)                      */
} cuda_backend_config;

/* Rows of the logits work buffers (and the largest graph bucket's rows). */
static inline int32_t cb_logits_rows(const cuda_backend_config *cfg) {
    int64_t r = cfg->max_graph_batch > CB_LOGITS_ROWS ? cfg->max_graph_batch : CB_LOGITS_ROWS;
    return (int32_t)(cfg->max_batched_tokens < r ? cfg->max_batched_tokens : r);
}

/* The four linear groups of a layer (one GEMM each). */
enum { CB_G_QKV = 0, CB_G_O = 1, CB_G_GU = 2, CB_G_DOWN = 3, CB_NGROUPS = 4 };

/* One decoder layer's weights: pointers into the device arena. A group a
 * quantizer changed (q[g].fmt != LOOM_CUDA_Q_NONE) has its dt pointer NULL
 * and runs loom_cuda_qgemm_run on q[g]: the parts of a fused group (Q, K,
 * V; gate, up) are quantized one by one by the quantizer and uploaded as
 * consecutive rows of one quantized matrix (their per-row scales simply
 * concatenate), so a layer stays four GEMMs. GGUF groups keep the file's
 * blocks, one segment per block type (q[g].seg). */
typedef struct cuda_layer {
    float *attn_norm;  /* (hidden) f32                                          */
    void *wqkv;        /* (q_dim + 2 kv_dim, hidden) dt: rows Q, then K, V       */
    float *bqkv;       /* (q_dim + 2 kv_dim) f32 Qwen2 bias, or NULL             */
    void *wo;          /* (hidden, q_dim) dt                                     */
    float *ffn_norm;   /* (hidden) f32                                          */
    void *wgu;         /* (2 intermediate, hidden) dt: rows gate, then up        */
    void *wdown;       /* (hidden, intermediate) dt                              */
    loom_cuda_qweight q[CB_NGROUPS]; /* quantized groups (same row order)    */
    /* Qwen3 / Gemma 3 (model config qk_norm, post_norms), else NULL: f32 */
    float *q_norm, *k_norm;               /* (head_dim) every q / k head      */
    float *post_attn_norm, *post_ffn_norm; /* (hidden) Gemma 3                */
    /* set by kv_alloc: the layer's K/V pool pair and block-table group
     * (loom/backend.h, "Block-table groups"): its own pair and group 0,
     * or with G > 1 groups the shared plan's (kv_groups.h) */
    int32_t kv_slot, kv_group;
    /* mixture of experts (mc.num_experts > 0; wgu, wdown NULL then), dt
     * unless noted; E experts of width I, a shared expert of width S */
    void *router;      /* (E, hidden)                                          */
    void *wgu_exps;    /* (E, 2 I, hidden): per expert rows gate, then up      */
    void *wdown_exps;  /* (E, hidden, I)                                       */
    void *wgu_sh;      /* (2 S, hidden) or NULL (no shared expert)             */
    void *wdown_sh;    /* (hidden, S)                                          */
    float *sh_gate;    /* (hidden) f32                                         */
    /* quantized experts (cuda_moe_quant.c): fmt != NONE replaces the dt
     * matrix above (NULL then) — the routed ones stacked (E, ...) as
     * loom_cuda_moe_qgemv reads them, the shared one a dense quantized
     * weight (loom_cuda_qgemm_run) */
    loom_cuda_qweight q_gu_exps, q_down_exps, q_gu_sh, q_down_sh;
} cuda_layer;

/* A captured decode graph for one bucket. */
typedef struct cuda_graph_slot {
    bool tried;             /* capture attempted (failed captures stay eager) */
    cudaGraphExec_t exec;   /* NULL until captured                            */
} cuda_graph_slot;

/* The piecewise graphs of one token bucket: exec[i], i in [0, layers], runs
 * everything between attention launches i - 1 and i (cuda_forward.c). */
typedef struct cuda_piece_set {
    bool tried;             /* capture attempted (a failure stays eager)     */
    cudaGraphExec_t *exec;  /* (layers + 1), NULL until captured             */
} cuda_piece_set;

/* One step's work as the kernels see it: counts and device pointers into
 * the uploaded metadata block (see cuda_forward.c). */
typedef struct cuda_plan {
    int32_t T;                 /* token rows processed, padding included    */
    int32_t NL;                /* logits rows                               */
    int32_t n_dec, n_pre;      /* attention tiles of each shape             */
    int32_t dec_splits, pre_splits; /* split-K bound of each launch        */
    const int32_t *ids;        /* (T)                                       */
    const int32_t *pos;        /* (T)                                       */
    const int64_t *slot;       /* (G, T): group g's slot mapping at g * T   */
    const int32_t *lidx;       /* (NL) rows of the LM head                  */
    const int32_t *stride;     /* device ints: block-table row length, then
                                  one group's table length (rows * stride) */
    const int32_t *bt;         /* (G, rows, *stride)                        */
    const loom_cuda_attn_tile *dec_tiles, *pre_tiles;
    size_t bytes;              /* metadata bytes to upload                  */
} cuda_plan;

typedef struct cuda_backend {
    const loom_host *host;      /* borrowed until destroy                     */
    cuda_backend_config cfg;    /* copy of the bound config                   */
    int device;                 /* CUDA ordinal                               */
    loom_cuda_dt dt;            /* compute / storage type                     */
    loom_dtype ldt;             /* the same as a loom dtype                   */
    size_t elt;                 /* bytes per element of dt (2)                */
    int num_sms;                /* multiprocessors, for split-K sizing        */
    char device_name[128];
    cudaStream_t stream;        /* every op of this instance runs here        */
    void *green;                /* CUgreenCtx the stream belongs to (sm_count > 0), or NULL */
    /* block images (kv_read_blocks / kv_write_blocks): a device staging
     * buffer, the (layer, K|V) pool pointers on both sides, the pairs */
    void *img_stage;
    size_t img_stage_bytes;
    void **img_ptrs_dev;        /* 4 * nlayers: sources then destinations     */
    int32_t *img_pairs_dev;
    int32_t img_pairs_cap;
    loom_cuda_gemm *gemm;       /* cuBLASLt context + plan cache              */

    /* --- after load */
    bool loaded;
    loom_model_config mc;       /* the model's config as this rank runs it    */
    int32_t q_dim, kv_dim, qkv_rows, group; /* group = heads per kv head     */
    void *weights;              /* device arena                               */
    size_t weight_bytes;
    void *embed;                /* (vocab_pad, hidden) dt                     */
    void *lm_head;              /* (vocab_pad, hidden) dt; == embed when tied  */
    float *out_norm;            /* (hidden) f32                               */
    loom_cuda_qweight lm_q;     /* quantized LM head (fmt NONE: lm_head)      */
    void *qscratch;             /* quantized-GEMM scratch (work allocation)   */
    size_t qscratch_bytes;      /* its size: the largest any weight needs     */
    size_t qweight_bytes;       /* bytes of quantized weights in the arena    */
    cuda_layer *layers;         /* host array (num_layers); a pipeline stage
                                   fills only its layers'                     */
    float *rope_cs;             /* (rope_max_pos, head_dim/2, 2) f32 device    */
    float *rope_cs_local;       /* the same for sliding-window layers (their
                                   own base, unscaled); NULL without a window */
    int32_t rope_max_pos;

    /* work buffers, rows = max_tokens (one device allocation) */
    int32_t max_tokens;
    int32_t logits_rows;        /* rows per LM-head chunk                     */
    void *work;
    float *x;                   /* (rows, hidden) f32 residual stream         */
    void *xn;                   /* (rows, hidden) dt normed                   */
    void *qkv;                  /* (rows, qkv_rows) dt                        */
    void *att;                  /* (rows, q_dim) dt attention output          */
    void *r;                    /* (rows, hidden) dt O / down projections     */
    void *gu;                   /* (rows, 2 intermediate) dt                  */
    void *act;                  /* (rows, intermediate) dt                    */
    void *xs;                   /* (logits_rows, hidden) dt LM-head input     */
    float *logits_dev;          /* (logits_rows, vocab) f32                   */
    float *attn_ws;             /* split-K workspace                          */
    int32_t attn_resident[2];   /* CTAs resident at once, per attention shape
                                   (for the KV type: set again by kv_alloc)   */
    int *attn_sem;              /* (rows, kv heads) split-K counters, kept zero */
    size_t attn_ws_floats;
    float *logits_host;         /* pinned (logits_rows, vocab) f32            */
    /* forward_topk: a step's summary, packed as ids (n, k) | values (n, k)
     * | log-sum-exp (n) for its n rows, on the device and its pinned
     * mirror; room for logits_rows x (2 x 64 + 1) 4-byte elements */
    int32_t *topk_dev, *topk_host;
    void *topk_ws;                           /* loom_cuda_topk_ws_bytes   */
    /* forward_topk's constraint masks for the rows of one LM-head chunk:
     * (logits_rows, mask_words) bits | (logits_rows) flags, on the device
     * and its pinned staging (allocated with the work buffers) */
    uint32_t *mask_dev, *mask_host;
    int32_t mask_words;
    /* the masks cross on a stream of their own (created at the first
     * upload), so the copy overlaps the forward instead of following it;
     * the top-k waits on mask_copied */
    cudaStream_t mask_stream;
    cudaEvent_t mask_copied;

    /* mixture-of-experts work (cuda_moe.c), one device allocation; rows =
     * max_tokens, pairs P = rows x experts per token. The shared expert
     * runs through gu / act (mc.intermediate_size is its width then). */
    void *moe_work;
    float *moe_logits;          /* (rows, E) f32 router logits                */
    int32_t *moe_sel;           /* (P) chosen experts                          */
    float *moe_wt;              /* (P) their weights                           */
    int32_t *moe_off, *moe_perm, *moe_inv, *moe_tiles; /* grouping (moe.cu)   */
    void *moe_gu, *moe_act, *moe_y; /* (P, 2 I), (P, I), (P, hidden) dt        */
    void *moe_ysh;              /* (rows, hidden) dt shared expert output     */
    /* quantized experts' activation codes (cuda_moe_quant.c; NULL unless a
     * W8A8 / FP8 expert weight): the normed rows' (rows, hidden) and the
     * SwiGLU rows' (P, I), with their per-row scales */
    void *moe_qwork;
    uint8_t *moe_xq, *moe_aq;
    float *moe_xsx, *moe_asx;
    /* expert parallelism (load_shard): this rank's experts [moe_e0, moe_e0 +
     * moe_el) and its columns of the shared expert, moe_sh wide (0, E and
     * the whole width for a whole model; docs/moe.md) */
    int32_t moe_e0, moe_el, moe_sh;
    /* the grouping's expert offsets read back on the host by an eager step
     * that runs a cuBLASLt GEMM an expert (cfg.moe_expert_gemm_rows), and
     * how many layers have run so */
    int32_t moe_off_h[LOOM_CUDA_MOE_MAX_EXPERTS + 1];
    int64_t moe_lt_layers;
    /* rows moe_gu / moe_act / moe_y hold: P, plus the padding of those
     * GEMMs (P / 8 + 64) where a step can take them (cb_moe_work_init) */
    int32_t moe_rows_cap;
    bool warming; /* cb_warm_pieces' eager runs: only what a capture records */
    /* expert parallelism's all-to-all form (cfg.moe_dispatch, cuda_moe.c),
     * for P pairs and n ranks; NULL / unused otherwise */
    struct {
        void *dev;                       /* one device allocation             */
        int32_t *sid, *rid, *rsel, *inv; /* (P) experts of the pairs sent and
                                            received (local numbers), the sent
                                            pairs' sorted rows                 */
        int32_t *cnt, *all;              /* (n), (n, n) pair counts           */
        void *sx, *rx;                   /* (P, hidden) dt rows sent / received */
        void *gs, *gr;                   /* (slice, hidden), (n, slice, hidden) dt */
        int32_t *all_h;                  /* host: (n, n) every rank's counts   */
        int64_t *sc, *rc;                /* host: (n) pairs sent / received    */
    } ep;

    /* per-step metadata: pinned staging and its device copy */
    uint8_t *meta_host, *meta_dev;
    size_t meta_cap;

    /* --- tensor parallelism: set by load_shard; whole model after load() */
    bool sharded;               /* comm.size > 1: forward() calls the
                                   collectives of `comm` on `stream`          */
    loom_comm comm;             /* copy of the executor's communicator        */
    int32_t vocab_lo;           /* first vocabulary row this rank holds       */
    int32_t vocab_rows;         /* rows it holds, 0..vocab_pad                */
    int32_t vocab_pad;          /* ceil(vocab / size): rows of embed and
                                   lm_head (zero rows past vocab_rows) and
                                   this rank's width of a logits row; vocab
                                   when not sharded                           */
    float *logits_local;        /* (logits_rows, vocab_pad) f32, sharded only */
    float *logits_gathered;     /* (size, logits_rows, vocab_pad) f32, ditto  */
    bool comm_host;             /* comm.host_memory: the collectives take host
                                   buffers (the tp executor's threads, every
                                   rank on one GPU), staged through comm_stage */
    void *comm_stage;           /* pinned, comm_stage_bytes; grown on demand  */
    size_t comm_stage_bytes;

    /* --- pipeline parallelism: set by load_stage; every layer after load() */
    loom_stage stage;           /* copy (struct_size 0: not a stage)          */
    int32_t layer0, nlayers;    /* the decoder layers held: [layer0, +nlayers) */
    bool first_stage;           /* embeds the tokens                          */
    bool last_stage;            /* final norm, LM head, logits                */
    int32_t step_tokens;        /* this step's rows as laid out, padding
                                   included (what the links move)             */
    void *link_buf;             /* x | r of max_tokens rows, the message: pinned
                                   host (threads links) or device (nccl)      */

    /* --- after kv_alloc */
    bool kv_ready;
    loom_kv_layout kv_layout;   /* copy; dtype resolved (dt or fp8_e4m3)      */
    loom_cuda_kv kv;            /* the pools' element type for the kernels    */
    size_t kv_block_bytes;      /* one block of one pool (K or V of a layer)  */
    int32_t kv_groups;          /* block-table groups G (1: one table)        */
    int32_t kv_npools;          /* pool pairs P: the layers, or with G > 1
                                   groups layers_per_block (layer l's pair is
                                   layers[l].kv_slot)                         */
    void **pools;               /* host array (2 P): K pools, then V (a pipeline
                                   stage's: its own layers')                 */
    void **pools_dev;           /* device copy of `pools`                     */
    void *swap;                 /* pinned mapped host pool (2 P, cpu blocks)  */
    void **swap_dev;            /* device array (2 P) of mapped pointers      */
    int32_t *pairs_dev;         /* block-copy pairs upload                    */
    int32_t pairs_cap;          /* pairs it holds                             */

    /* --- CUDA graphs */
    cuda_graph_slot graphs[CB_GRAPH_MAX_Q][CB_NUM_BUCKETS]; /* [q - 1][bucket] */
    cuda_piece_set pieces[CB_NUM_TOK_BUCKETS];              /* [token bucket]  */
    int64_t graph_replays, piecewise_replays, eager_steps;
    /* where a forward() call's wall time goes: waiting for the GPU at the
     * step's end, and everything else (metadata, launches, copies out) —
     * logged at destroy, to tell a host-bound step from a GPU-bound one */
    int64_t steps_timed;
    double step_seconds, wait_seconds;
    /* the same by path (CB_PATH_*) and host phase (CB_PH_*, cb_mark), and
     * the GPU's side from two CUDA events a step: its span from the first
     * upload to the last enqueued work (busy) and the idle time between the
     * previous step's end and this step's first upload (gap, the host work
     * no launch overlaps); starved: steps whose GPU had finished everything
     * enqueued before the host finished enqueuing */
    int32_t cur_path;
    bool in_step, ev_started, ev_ended, ev_have_prev;
    double mark_t;
    int64_t path_steps[CB_PATHS], starved[CB_PATHS];
    double ph[CB_PATHS][CB_PHASES], gpu_busy[CB_PATHS], gpu_gap[CB_PATHS];
    cudaEvent_t ev_start, ev_end, ev_prev_end;
    /* steps whose caller computed constraint masks (fill_masks) while the
     * GPU ran: their time, and how many found the GPU done before them */
    int64_t mask_steps, mask_late;
    double mask_seconds;
} cuda_backend;

/* Bytes of a pipeline link message of T rows: x (f32) then r (dt) — the
 * residual stream and the last layer's pending down projection, which the
 * next stage's first norm adds as this stage's next layer would have. */
static inline size_t cb_link_bytes(const cuda_backend *b, int64_t T) {
    return (size_t)T * (size_t)b->mc.hidden_size * (4 + b->elt);
}

/* cuda_backend.c */
/* LOOM_OK for cudaSuccess; otherwise fills err with the call, file:line and
 * CUDA's name for the error (NOMEM for allocation failures, else DEVICE). */
loom_status cb_cuda_check(cuda_backend *b, loom_error *err, cudaError_t e, const char *what,
                          const char *file, int line);
#define CB_CUDA(b, err, call) cb_cuda_check((b), (err), (call), #call, __FILE__, __LINE__)
void cb_graphs_reset(cuda_backend *b);
/* Tensor parallelism: move the instance (its stream and cuBLASLt context;
 * nothing else exists before load) to the device current on the calling
 * thread, if that is not b->device. Called by load_shard on the rank's
 * thread, where the executor has made the rank's GPU current. */
loom_status cb_bind_current_device(cuda_backend *b, loom_error *err);

/* cuda_load.c */
loom_status cb_load(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                    loom_error *err);
loom_status cb_load_shard(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                          const loom_comm *comm, loom_error *err);
loom_status cb_load_stage(void *self, const loom_model_view *m, const loom_quant_binding *quant,
                          const loom_stage *stage, const loom_comm *comm, loom_error *err);
/* Free the pipeline link buffer (pinned host or device memory), if any. */
void cb_link_buf_free(cuda_backend *b);

/* cuda_comm.c: collectives of a sharded instance, on its stream; a
 * host-memory communicator (comm_host) gets pinned copies */
/* a host-memory communicator: its staging sized for every step's
 * collectives (after the work buffers), a warning when GPUs sit idle */
loom_status cb_comm_init(cuda_backend *b, loom_error *err);
/* sum count elements of buf over the ranks, in place (no-op unsharded) */
loom_status cb_all_reduce(cuda_backend *b, void *buf, int64_t count, loom_dtype dt, loom_error *err);
/* every rank's count elements of send into recv (size x count, rank-major) */
loom_status cb_all_gather(cuda_backend *b, const void *send, void *recv, int64_t count, loom_dtype dt,
                          loom_error *err);
/* loom_comm.all_to_allv on device buffers (counts host memory, elements) */
loom_status cb_all_to_allv(cuda_backend *b, const void *send, const int64_t *send_counts, void *recv,
                           const int64_t *recv_counts, loom_dtype dt, loom_error *err);

/* cuda_moe.c: the mixture-of-experts FFN (docs/moe.md) */
/* What this backend runs of a mixture-of-experts config: LOOM_OK, or
 * UNSUPPORTED naming what (post-norms or GeGLU experts, shapes the kernels
 * do not take). */
loom_status cb_moe_check_config(cuda_backend *b, const loom_model_config *c, loom_error *err);
/* moe_dispatch: all_to_all needs a communicator with all_to_allv (ABI
 * 2.5); LOOM_OK for anything else. */
loom_status cb_moe_check_comm(cuda_backend *b, const loom_model_config *c, const loom_comm *comm, loom_error *err);
/* n buffers of sz[i] bytes (256-aligned) carved from one device
 * allocation *dev (*total bytes) into *dst[i] (NULL for size 0), after
 * checking the device has room: else NOMEM naming `what` with `advice`. */
loom_status cb_moe_alloc(cuda_backend *b, const size_t *sz, void **const *dst, int n, const char *what,
                         const char *advice, void **dev, size_t *total, loom_error *err);
/* The work buffers, after the dense ones (mc as this rank runs it). */
loom_status cb_moe_work_init(cuda_backend *b, loom_error *err);
/* r (T, H) dt = the FFN of layer l over xn (T, H), the normed rows —
 * sharded, this rank's share, unless *summed (the all-to-all form without
 * a shared expert: r holds every rank's rows already, no all-reduce). */
loom_status cb_moe_ffn(cuda_backend *b, int32_t T, int32_t l, bool *summed, loom_error *err);
/* Whether this instance runs the all-to-all form (sharded, a mixture of
 * experts, moe_dispatch all_to_all): its steps wait for the host. */
bool cb_moe_a2a(const cuda_backend *b);
/* Free b->ep (any part made); safe to call twice. */
void cb_moe_ep_free(cuda_backend *b);

/* The rows a layer's routed experts run over: pair p < P reads row p / div
 * of x (nx rows, dt) and this rank's expert sel[p] (-1: none of its). */
typedef struct cb_moe_rows {
    const void *x;
    int32_t nx, div, P;
    const int32_t *sel;
} cb_moe_rows;

/* cuda_moe_quant.c: quantized expert weights (docs/moe.md) */
/* Whether layer ly has a quantized routed (shared) expert matrix. */
bool cb_moe_q_routed(const cuda_layer *ly);
/* layer l's kernel launch / linear-layer status as the step's error (cuda_moe.c) */
loom_status cb_moe_launch(cuda_backend *b, cudaError_t e, const char *what, int32_t l, loom_error *err);
loom_status cb_moe_rc(cuda_backend *b, int rc, const char *msg, const char *what, int32_t l, loom_error *err);
bool cb_moe_q_shared(const cuda_layer *ly);
/* The activation-code buffers (after cb_moe_work_init) when some expert
 * weight is W8A8 / FP8. */
loom_status cb_moe_qwork_init(cuda_backend *b, loom_error *err);
/* cb_moe_experts for a layer with quantized routed experts (either
 * projection; the other may be dt): moe_y (P, H), *rows as there; gemv:
 * per-pair GEMVs (cuda_moe.c decides), else the grouped GEMM. */
loom_status cb_moe_qexperts(cuda_backend *b, int32_t l, const cb_moe_rows *in, bool gemv, const int32_t **rows,
                            loom_error *err);
/* moe_ysh (T, H) = the shared expert of layer l over xn, when quantized. */
loom_status cb_moe_qshared(cuda_backend *b, int32_t T, int32_t l, loom_error *err);

/* cuda_forward.c */
loom_status cb_forward(void *self, const loom_batch *batch, float *logits, loom_error *err);
loom_status cb_forward_topk(void *self, const loom_batch *batch, const loom_logits_topk *out, loom_error *err);
/* After kv_alloc: capture every piecewise-graph token bucket up front
 * (LOOM_ERR_DEVICE when the GPU fails the warm-up's eager runs). */
loom_status cb_warm_pieces(cuda_backend *b, loom_error *err);

#endif
