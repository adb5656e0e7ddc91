/*
 * loom/backend.h — backends and executors: where one forward pass runs.
 *
 * A backend owns the weights (transformed by the quantizer, if any) and the
 * KV-cache tensors on its device. It knows nothing of sequences' lifetimes:
 * each step the core hands it a flattened batch with block tables and a
 * slot mapping decided by the cache manager, and gets logits back for the
 * positions the sampler needs. Executors (loom/executor.h, e.g. tensor
 * and pipeline parallel) present the same model-runner methods over several
 * backends.
 *
 * KV-cache layout (every backend, so cache managers and kernels agree):
 * per layer one K pool and one V pool, each
 *     (num_blocks, num_kv_heads, block_size, head_dim)    head_dim contiguous
 * and a token at position p of a sequence lives in physical slot
 *     slot = block_table[p / block_size] * block_size + p % block_size.
 *
 * Block-table groups (since ABI 2.4). A model whose layers attend
 * differently (Gemma 3: sliding-window layers beside global ones) may keep
 * one block table per group of layers, so a windowed group's blocks that
 * left its window go back to the pool while a global group keeps all of
 * them (vLLM's hybrid allocator). The backend proposes the groups
 * (kv_groups() below: each group's window, and how many layers one block
 * id holds); the cache manager takes the proposal or not (layout
 * num_groups). Taken with G > 1 groups: each group has layers_per_block
 * layers (the last may have fewer), one block id names one block of those
 * layers' K and V, so the backend keeps layers_per_block K pools and V
 * pools (slot i of every group shares pool i), and layer l reads its
 * group's table and slot mapping. Blocks of a windowed group that no query
 * of the sequence will read again are -1 in its table; a backend reads a
 * windowed layer's table only inside the window.
 */
#ifndef LOOM_BACKEND_H
#define LOOM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/quant.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One step's work, flattened (vLLM's "varlen" layout). Sequence s owns query
 * tokens [query_start[s], query_start[s+1]) — a prefill chunk, one decode
 * token, or k+1 tokens to verify drafts — at consecutive positions ending at
 * context_len[s] - 1. Every token's K/V is written to slot_mapping[t] before
 * attention, and token t attends causally to positions 0..positions[t] of its
 * sequence, read through that sequence's block table. All arrays are host
 * memory borrowed for the duration of forward(). Grows only at its end.
 */
typedef struct loom_batch {
    uint32_t struct_size;
    int32_t num_seqs;              /* sequences in this step                   */
    int32_t num_tokens;            /* query tokens, all sequences              */
    const int32_t *token_ids;      /* (num_tokens)                             */
    const int32_t *positions;      /* (num_tokens) position within its sequence */
    const int32_t *query_start;    /* (num_seqs + 1) offsets into the tokens   */
    const int32_t *context_len;    /* (num_seqs) tokens with K/V after this step */
    const int32_t *block_table;    /* (num_seqs, block_table_stride) block ids */
    int32_t block_table_stride;    /* entries per row (>= blocks any seq uses) */
    const int64_t *slot_mapping;   /* (num_tokens) KV slot per token; -1 = skip write */
    int32_t num_logits;            /* rows of logits wanted                    */
    const int32_t *logits_index;   /* (num_logits) token indices, ascending    */
    /* since ABI 2.4 — add new members below this line only */
    int32_t num_groups;            /* block-table groups G (layout.num_groups);
                                      0 or 1: one table and one slot mapping.
                                      G > 1: block_table is (G, num_seqs,
                                      block_table_stride) and slot_mapping
                                      (G, num_tokens), group g's at g * rows  */
    const int32_t *group_window;   /* (max(G, 1)) tokens each group's layers
                                      see, 0 = all; NULL = all 0. Entries of
                                      a windowed group's row for blocks wholly
                                      before every query's window may be -1  */
} loom_batch;

/* How the cache manager sized the KV pools. Grows only at its end. */
typedef struct loom_kv_layout {
    uint32_t struct_size;
    int32_t block_size;        /* tokens per block                           */
    int32_t num_blocks;        /* device blocks (all layers share block ids) */
    int32_t num_cpu_blocks;    /* host blocks for swap-out; 0 = no swapping  */
    loom_dtype dtype;          /* K/V element type (f32, f16, bf16, fp8_e4m3);
                                  LOOM_DTYPE_COUNT = the backend's own default
                                  (the engine resolves it through
                                  kv_default_dtype where the backend has it) */
    /* since ABI 2.4 — add new members below this line only */
    int32_t num_groups;        /* set by the cache manager: 0 = it ignored the
                                  backend's kv_groups() proposal (one table,
                                  no window); G >= 1 = it took the proposal
                                  (then G equals its num_groups). The pools
                                  are per layer unless G > 1 (see above)    */
} loom_kv_layout;

/* Most block-table groups a backend may propose. */
#define LOOM_KV_GROUPS_MAX 16

/* A backend's proposal of block-table groups for the loaded model (since
 * ABI 2.4; see "Block-table groups" above). Grows only at its end. */
typedef struct loom_kv_groups {
    uint32_t struct_size;
    int32_t num_groups;        /* 1..LOOM_KV_GROUPS_MAX                      */
    int32_t layers_per_block;  /* layers one block id holds when G > 1; with
                                  one group, every held layer              */
    int32_t num_layers;        /* layers kv_block_bytes() counts: one block
                                  of a grouped pool takes kv_block_bytes() *
                                  layers_per_block / num_layers bytes      */
    int32_t window[LOOM_KV_GROUPS_MAX]; /* tokens group g's layers see, the
                                  query's own position included; 0 = all  */
} loom_kv_groups;

typedef enum loom_swap_dir {
    LOOM_SWAP_OUT = 0,         /* device block -> host block                 */
    LOOM_SWAP_IN = 1,          /* host block -> device block                 */
} loom_swap_dir;

/* Device memory as the backend sees it, for sizing the KV pool. Grows only
 * at its end. */
typedef struct loom_backend_memory {
    uint32_t struct_size;
    size_t total_bytes;        /* device (or host RAM for cpu) capacity      */
    size_t free_bytes;         /* free now, after weights were loaded        */
    size_t weight_bytes;       /* bytes held by weights (an executor: all its
                                  ranks' together with pp, the largest rank's
                                  with tp alone); informational, nothing is
                                  sized by it                                */
} loom_backend_memory;

/*
 * A communicator among the ranks of one tensor-parallel group, handed by an
 * executor to each rank's backend in load_shard(). Collectives are called by
 * every rank of the group with the same count and dtype, each from its own
 * thread; `stream` is the backend's device stream (NULL on the host, and
 * for a communicator with host_memory set: a device backend passes host
 * copies then). Grows only at its end.
 */
typedef struct loom_comm {
    uint32_t struct_size;
    int32_t rank;              /* this backend's rank, 0..size-1              */
    int32_t size;              /* ranks in the group                          */
    void *ctx;                 /* the executor's state                        */
    /* [instance] REQUIRED. Sum `count` elements of `buf` across ranks, in place. */
    loom_status (*all_reduce_sum)(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dtype,
                                  void *stream, loom_error *err);
    /* [instance] REQUIRED. Concatenate every rank's `count` elements of
     * `send` into `recv` (size * count elements, rank-major). */
    loom_status (*all_gather)(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                              loom_dtype dtype, void *stream, loom_error *err);
    /* Collectives of at most this many bytes per rank are plain device
     * kernels on `stream` (no host work, no NCCL), so a backend may capture
     * steps that only make such calls into a CUDA graph; 0 = none are. */
    int64_t graph_safe_bytes;
    /* since ABI 2.0 — add new members below this line only */
    /* since ABI 2.5 (read it only when LOOM_HAS_FIELD(comm, loom_comm,
     * all_to_allv)); NULL = this communicator has none. [instance]
     * All-to-all with per-peer counts, for expert parallelism's token
     * dispatch and combine: rank r sends send_counts[d] elements to each
     * rank d (d = r included) from `send` at offset send_counts[0] + ... +
     * send_counts[d-1], and receives recv_counts[s] elements from each
     * rank s into `recv` at the prefix sum of recv_counts before s. Both
     * count arrays are host memory of `size` entries, >= 0 (zeros allowed;
     * every rank still makes the call, even with nothing to move), and
     * must agree pairwise:
     * recv_counts[s] on rank r == send_counts[r] on rank s — the caller
     * exchanges them first (all_gather). `send` / `recv` may be NULL when
     * their counts sum to 0; they must not overlap. Every rank calls it
     * with the same dtype. Errors: a bad argument, a count mismatch
     * (detected by the threads communicator; NCCL cannot detect it), a
     * dtype the communicator cannot move, or a peer that failed (the
     * threads communicator returns an error, never hangs; NCCL as for the
     * other collectives). Host (threads, stream NULL): returns once `recv`
     * holds the data and `send` may be reused; device (NCCL): enqueued on
     * `stream`, both hold in stream order. */
    loom_status (*all_to_allv)(void *ctx, int32_t rank, const void *send, const int64_t *send_counts,
                               void *recv, const int64_t *recv_counts, loom_dtype dtype, void *stream,
                               loom_error *err);
    /* since ABI 2.9 (read it only when LOOM_HAS_FIELD(comm, loom_comm,
     * host_memory); an older communicator reads as 0). 1: the collectives
     * take host memory and stream NULL (the tp executor's threads
     * communicator) — a device backend stages its buffers through host
     * memory for them, and its ranks may share one GPU; 0: device buffers
     * in `stream` order (NCCL). */
    int32_t host_memory;
} loom_comm;

/*
 * Pipeline-parallel stage (since ABI 2.3), handed by an executor to each
 * rank's backend in load_stage(): the contiguous decoder layers this
 * instance holds and the links to the neighbouring stages. Stage 0 holds
 * layer 0 and embeds the tokens; the last stage holds the last layer, the
 * final norm and the LM head; every stage holds the KV pools of its own
 * layers only (one block id names the same block on every stage).
 *
 * The residual stream — the hidden states between layers, (num_tokens,
 * hidden_size) in a type of the backend's choosing (the stages run the same
 * backend, so they agree; cpu: float32) — travels through the links inside
 * forward(): a stage other than the first receives it with recv_prev()
 * instead of embedding, and a stage other than the last sends it with
 * send_next() instead of computing logits. Each forward() (or
 * forward_topk()) with num_tokens > 0 makes exactly one recv_prev() (index
 * > 0) and then one send_next() (index < count - 1), in that order, so the
 * executor pairs messages in call order (as NCCL pairs send and recv) and
 * may run stage s on micro-batch m while stage s + 1 runs micro-batch m - 1.
 * With tensor parallelism inside the stage (load_stage's comm), each tensor
 * rank links to the same tensor rank of the next stage and sends its whole,
 * replicated, residual stream.
 *
 * Micro-batches and the prefix cache: a paged cache registers a block when
 * it allocates it, before its KV is computed, so a later sequence of the
 * same step may take it as a prefix hit and read it. A reader must then be
 * in the same micro-batch as the block's writer (each layer writes the
 * batch's KV before attending) or a later one (each stage runs the
 * micro-batches in order) — never an earlier one. This holds because
 * micro-batches are consecutive runs of the batch and the batch lists
 * sequences in the order the scheduler allocated them; an executor that
 * reorders sequences across micro-batches must keep it.
 *
 * The link functions are [instance]: called from the thread running this
 * rank's forward(), `buf` device memory of `count` elements of `dtype`
 * (`stream` the backend's device stream; NULL on the host). Host links
 * (the pp executor's threads): send_next() returns once `buf` may be
 * reused and recv_prev() once `buf` holds the message; both block until
 * the peer arrives, and return an error (never hang) when the executor
 * aborts the pipeline because some rank failed, or when the peer's count
 * or dtype differs. Device links (its nccl): both only enqueue the
 * transfer on `stream` and return, so "may be reused" and "holds the
 * message" hold in stream order, for work enqueued after the call; a
 * count or dtype mismatch is not detected, and an abort reaches them as
 * ncclCommAbort, which ends transfers still waiting for a peer (the
 * communicators are then unusable). Grows only at its end.
 */
typedef struct loom_stage {
    uint32_t struct_size;
    int32_t index;             /* this stage, 0..count-1                     */
    int32_t count;             /* stages in the pipeline                     */
    int32_t first_layer;       /* first decoder layer held                   */
    int32_t num_layers;        /* decoder layers held (>= 1)                 */
    void *ctx;                 /* the executor's link state for this rank    */
    /* REQUIRED when index > 0 (NULL on stage 0). */
    loom_status (*recv_prev)(void *ctx, void *buf, int64_t count, loom_dtype dtype, void *stream,
                             loom_error *err);
    /* REQUIRED when index < count - 1 (NULL on the last stage). */
    loom_status (*send_next)(void *ctx, const void *buf, int64_t count, loom_dtype dtype,
                             void *stream, loom_error *err);
    /* since ABI 2.5 (LOOM_HAS_FIELD): 1 when the links take device memory
     * on the backend's stream (the pp executor's nccl), 0 when they take
     * host memory (its threads) — a GPU backend stages the residual
     * stream through host memory for the latter. */
    int32_t device_links;
} loom_stage;

/* Largest k forward_topk() must serve. */
#define LOOM_LOGITS_TOPK_MAX 64

/*
 * Where forward_topk() writes, for the batch's num_logits rows (all arrays
 * caller-owned host memory). Grows only at its end. Row i's candidates are top_ids/top_vals
 * [i*k, i*k + k): values descending, equal values by ascending id, NaN
 * ranked as -inf; lse[i] = log(sum_v exp(logit_v)) over the whole row.
 * Rows with want_full[i] != 0 are also copied whole to full + i * vocab
 * (the other rows of `full` are left untouched).
 */
typedef struct loom_logits_topk {
    uint32_t struct_size;
    int32_t k;                 /* 1..min(vocab, LOOM_LOGITS_TOPK_MAX)        */
    int32_t *top_ids;          /* (num_logits, k)                            */
    float *top_vals;           /* (num_logits, k)                            */
    float *lse;                /* (num_logits)                               */
    const uint8_t *want_full;  /* (num_logits)                               */
    float *full;               /* (num_logits, vocab)                        */
    /* since ABI 2.4 (read only when LOOM_HAS_FIELD(out, loom_logits_topk,
     * fill_masks)); a runner whose plugin (and, under an executor, whose
     * backend) is built against ABI >= 2.4 honours them, and the engine
     * sends constrained rows as candidates only to such a runner.
     * Decoding-constraint masks (loom/constraint.h bitsets of
     * LOOM_MASK_WORDS(vocab) words, host memory, caller-owned), one pointer
     * per row or NULL for an unconstrained row; the array itself may be
     * NULL (no row constrained). A candidate row with a mask has its top k
     * taken as if every token outside the mask were -inf (ties by
     * ascending id, so when fewer than k are allowed the remaining slots
     * are forbidden tokens at -inf); lse stays the log-sum-exp of the whole
     * raw row (host->logits_topk_masked_row is the reference). A row with
     * want_full set has no mask. */
    const uint32_t *const *allowed; /* (num_logits) or NULL                  */
    /* Called before `allowed` is first read, after the step's forward work
     * is enqueued where the runner can (so the caller computes masks while
     * the device runs), from whichever thread the runner reduces on; a
     * runner that reduces in parts (micro-batches) may call it once per
     * part, and the caller's fill must make every call after the first a
     * no-op. NULL: the masks are ready. An error fails the step. */
    loom_status (*fill_masks)(void *ctx, loom_error *err);
    void *fill_ctx;
} loom_logits_topk;

/*
 * An activation observer (calibration, e.g. SmoothQuant's per-channel
 * statistics): a backend with one installed calls record() during every
 * forward() with the float32 input of each linear layer of each decoder
 * layer, just before the product, once per distinct input:
 *   Q, K, V   share one input (the attention-normed hidden state),
 *   O         the attention output,
 *   gate, up  share one input (the FFN-normed hidden state),
 *   down      the SwiGLU product.
 * `names` are the canonical names of the weights that read this input
 * (e.g. {"blk.3.attn_q.weight", "blk.3.attn_k.weight",
 * "blk.3.attn_v.weight"}); x is (rows, cols) with row stride ldx, host
 * memory, borrowed for the call; rows = the batch's tokens, cols = the
 * weights' input width. Called on the thread running forward(); record()
 * must not call back into the backend. Grows only at its end.
 */
typedef struct loom_act_observer {
    uint32_t struct_size;      /* sizeof(loom_act_observer)                  */
    void *ctx;                 /* the observer's state, passed back          */
    void (*record)(void *ctx, const char *const *names, int32_t num_names, const float *x,
                   int64_t ldx, int64_t rows, int64_t cols);
} loom_act_observer;

/*
 * Tensor-parallel part of a model for one rank, as host->shard_plan makes it
 * (Megatron-style): query heads split evenly; KV heads split evenly when
 * there are at least as many as ranks, else each rank keeps the one KV head
 * its (consecutive) query heads read, replicated over size / num_kv_heads
 * ranks; the FFN width splits evenly; the vocabulary is cut into
 * ceil(vocab / size) rows per rank, the last rank holding the remainder
 * (possibly none), so every rank's logits slice has the same padded width.
 * Grows only at its end.
 */
typedef struct loom_shard {
    uint32_t struct_size;
    int32_t rank, size;
    int32_t heads, head0;      /* query heads kept, first one                */
    int32_t kv_heads, kv0;     /* KV heads kept, first one                   */
    int32_t inter, inter0;     /* FFN columns kept, first one                */
    int32_t vocab_lo;          /* first vocabulary row kept                  */
    int32_t vocab_rows;        /* vocabulary rows kept (may be 0)            */
    int32_t vocab_pad;         /* ceil(vocab / size): every rank's slice width */
} loom_shard;

/*
 * The model-runner methods: what the engine calls on a backend, or on an
 * executor over several (loom/executor.h). Documented once here; each
 * table says whether it is REQUIRED or OPTIONAL.
 */
/* Take the model's weights to the device, once per instance (check with
 * host->check_load first). `quant` (NULL = no quantizer) is the quantizer
 * binding: ask it, per linear weight, which format to use, keep the result
 * and release() the host copy. `model` is borrowed until destroy. */
typedef loom_status loom_load_fn(void *self, const loom_model_view *model, const loom_quant_binding *quant,
                                 loom_error *err);
/* Bytes one KV block of `block_size` tokens takes across all layers (K and
 * V) in `dtype` (LOOM_DTYPE_COUNT = the backend's own default); 0 when that
 * size or type is unsupported. After load(). */
typedef size_t loom_kv_block_bytes_fn(void *self, int32_t block_size, loom_dtype dtype);
/* Memory after load(), for sizing the KV pool; the core sets
 * out->struct_size, the runner fills the fields it covers. */
typedef loom_status loom_memory_fn(void *self, loom_backend_memory *out, loom_error *err);
/* Allocate the KV pools (once, after load). Running out of memory is
 * LOOM_ERR_NOMEM with the bytes asked and what to change. */
typedef loom_status loom_kv_alloc_fn(void *self, const loom_kv_layout *layout, loom_error *err);
/* One forward pass: writes logits (num_logits, vocab_size) float32
 * row-major into `logits` (host memory, caller-owned). Check the batch
 * first with host->check_batch (the core does not). */
typedef loom_status loom_forward_fn(void *self, const loom_batch *batch, float *logits, loom_error *err);
/* Copy whole device blocks (copy-on-write): pairs (n, 2) of {src, dst}
 * block ids, done before the next forward starts. */
typedef loom_status loom_copy_blocks_fn(void *self, const int32_t *pairs, int32_t n, loom_error *err);
/* One forward pass that returns, instead of whole logits rows, each row's
 * summary computed where the logits are: its `k` largest logits with their
 * token ids and its log-sum-exp, exactly as host->logits_topk_row; whole
 * rows only for the rows `want_full` marks. */
typedef loom_status loom_forward_topk_fn(void *self, const loom_batch *batch, const loom_logits_topk *out,
                                         loom_error *err);
/* Move blocks between the device pool and the host pool: pairs (n, 2) of
 * {src, dst}; OUT: src device, dst host; IN: the reverse. */
typedef loom_status loom_swap_blocks_fn(void *self, loom_swap_dir dir, const int32_t *pairs, int32_t n,
                                        loom_error *err);

/*
 * A backend: one device. Every method is [instance]: the engine calls them
 * from its step-loop thread, and an executor (loom/executor.h) driving
 * several backend instances calls each inner instance from that rank's own
 * thread — never two calls at once on one instance.
 */
typedef struct loom_backend_ops {
    uint32_t struct_size;      /* sizeof(loom_backend_ops)                   */

    loom_create_fn *create;                 /* REQUIRED (loom/plugin.h)       */
    loom_destroy_fn *destroy;               /* REQUIRED; frees device memory too */
    loom_load_fn *load;                     /* REQUIRED                        */
    loom_kv_block_bytes_fn *kv_block_bytes; /* REQUIRED                        */
    loom_memory_fn *memory;                 /* REQUIRED                        */
    loom_kv_alloc_fn *kv_alloc;             /* REQUIRED                        */
    loom_forward_fn *forward;               /* REQUIRED                        */
    loom_copy_blocks_fn *copy_blocks;       /* REQUIRED                        */

    /* --- optional capabilities --------------------------------------- */

    /* OPTIONAL (NULL = the engine uses forward() and whole rows). */
    loom_forward_topk_fn *forward_topk;
    /* OPTIONAL (NULL = no host pool: cache managers preempt by recompute). */
    loom_swap_blocks_fn *swap_blocks;
    /* OPTIONAL (NULL = this backend cannot be sharded; executors refuse it).
     * Tensor parallelism: like load(), but keep only `comm->rank`'s part
     * (host->shard_plan: QKV and gate/up by columns, O and down by rows,
     * heads split, vocabulary-parallel embedding and LM head) and use
     * `comm` inside forward(); rank 0 returns the logits, the others may
     * get logits == NULL. */
    loom_status (*load_shard)(void *self, const loom_model_view *model, const loom_quant_binding *quant,
                              const loom_comm *comm, loom_error *err);
    /* OPTIONAL (NULL = this backend cannot record activations; `loom
     * calibrate` refuses it). Install `obs` (copied; obs->ctx borrowed
     * until replaced) so every later forward() reports its linear layers'
     * inputs, or remove it with obs == NULL. After load(); a backend may
     * refuse (LOOM_ERR_UNSUPPORTED with why, e.g. when sharded). */
    loom_status (*set_observer)(void *self, const loom_act_observer *obs, loom_error *err);
    /* since ABI 2.0 — add new members below this line only */

    /* OPTIONAL, since ABI 2.3 (NULL = this backend cannot be a pipeline
     * stage; the pp executor refuses it). Pipeline parallelism: like
     * load(), but keep only the layers `stage` names (stage 0: also the
     * embedding; the last stage: also the final norm and the LM head), and
     * with `comm` (NULL = none) only comm->rank's tensor-parallel shard of
     * them, as load_shard(). `stage` and `comm` are copied; their ctx are
     * borrowed until destroy. Afterwards kv_block_bytes(), kv_alloc(),
     * copy_blocks() and swap_blocks() cover the held layers only, and
     * forward() / forward_topk() move the residual stream through the
     * stage's links (loom_stage above): only the last stage writes logits
     * (its tensor rank 0, with comm), the others may get logits == NULL.
     * A stage that does not fit the model (layers outside
     * 0..num_layers-1, stage 0 not starting at layer 0, the last stage not
     * ending at the last layer, a missing link) is LOOM_ERR_INVALID naming
     * it. A backend may refuse set_observer() on a stage. */
    loom_status (*load_stage)(void *self, const loom_model_view *model, const loom_quant_binding *quant,
                              const loom_stage *stage, const loom_comm *comm, loom_error *err);
    /* since ABI 2.3 — add new members below this line only */
    /* OPTIONAL, both or neither, since ABI 2.4 (NULL = this backend's KV
     * cannot leave it; disaggregated serving refuses it, naming it; the
     * loader refuses a table with only one). Copy whole device blocks to
     * (read) or from (write) `buf`, host memory of `len` bytes that must be
     * exactly n * kv_block_bytes(block_size, dtype) of the allocated pools,
     * in the block-image layout every backend shares, so engines of
     * different backends can hand KV to each other: block after block, and
     * within one block every held layer in order, K then V, each
     * (num_kv_heads, block_size, head_dim) in the pool's element type.
     * `blocks` (n) are device block ids, each in [0, num_blocks); any bad
     * id or length is LOOM_ERR_INVALID and nothing is copied. After
     * kv_alloc(). Done before the call returns. Since ABI 2.6 `buf` may
     * also be device memory of the ordinal kv_image_device() returns,
     * 16-byte aligned (else LOOM_ERR_INVALID). */
    loom_status (*kv_read_blocks)(void *self, const int32_t *blocks, int32_t n, void *buf, size_t len,
                                  loom_error *err);
    loom_status (*kv_write_blocks)(void *self, const int32_t *blocks, int32_t n, const void *buf, size_t len,
                                   loom_error *err);

    /* OPTIONAL, since ABI 2.4 (NULL = one block table for every layer; the
     * engine then never passes a windowed or grouped layout). After load(),
     * before kv_alloc(): fill `out` (the core sets struct_size) with the
     * groups this backend can keep its KV in — one group without a window
     * for a model whose layers all attend to the whole context. When the
     * layout it then gets has num_groups > 1, kv_alloc() keeps
     * layers_per_block pools of each kind and forward() reads layer l's
     * group's table, slot mapping and window (loom_batch). */
    loom_status (*kv_groups)(void *self, loom_kv_groups *out, loom_error *err);
    /* since ABI 2.4 — add new members below this line only */

    /* OPTIONAL, since ABI 2.6 (NULL = block images in host memory only).
     * [any], after kv_alloc(): the CUDA ordinal whose device memory
     * kv_read_blocks / kv_write_blocks also take as `buf` — memory of this
     * process on that device, its own allocation or a mapping opened
     * through CUDA IPC — gathered or scattered by one kernel, without a
     * host copy; -1 when this instance has none. */
    int32_t (*kv_image_device)(void *self);
    /* since ABI 2.6 — add new members below this line only */

    /* OPTIONAL, since ABI 2.8 (NULL = the engine cannot name this
     * backend's KV element type; unless the quantizer names one,
     * loom_engine_kv_info() refuses the engine: a peer could not tell its
     * block images from another type of the same size, f16 from bf16).
     * [any], after load(): the element type kv_alloc() gives a layout whose
     * dtype is LOOM_DTYPE_COUNT (the backend's default) — F32, F16, BF16 or
     * FP8_E4M3, never LOOM_DTYPE_COUNT. The engine asks it before
     * kv_alloc() and passes the answer in the layout (an executor's inner
     * backends are not asked: they still get LOOM_DTYPE_COUNT). */
    loom_dtype (*kv_default_dtype)(void *self);
    /* since ABI 2.8 — add new members below this line only */
} loom_backend_ops;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_BACKEND_H */
