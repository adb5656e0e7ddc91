/*
 * kernels/cuda/cuda_kernels.h — the CUDA kernels of a Llama-family forward
 * pass (bf16 or f16 storage, float32 accumulation), behind a plain C API so
 * the backend plugin, the GPU tests and the benchmark are ordinary C11.
 *
 * What this is: embedding gather, RMSNorm fused with the residual add (and
 * with a row gather for the LM head), NeoX RoPE fused with the Qwen2 QKV bias
 * and the KV-cache write through the slot mapping, paged attention over a
 * flattened variable-length batch (one tensor-core kernel in a prefill shape
 * and a decode shape, split-K over the keys merged by the last split —
 * flash-decoding — with an optional sliding window),
 * SwiGLU, and Gemma 3's and Qwen3's pieces (embedding scale, QK-norm fused
 * with RoPE, post-norm residual adds, GeGLU), KV block copies (copy-on-write and swap to mapped host memory),
 * and the linear layers: a streaming GEMV for batches of <= 8 rows, cuBLASLt
 * (with a plan cache) above.
 *
 * What this is not: a tensor library. Every function takes raw device
 * pointers with the shape in its comment — (T, H) means T rows of H
 * elements, last dimension contiguous — and trusts its caller (the cuda
 * backend plugin) to have validated indices. Functions enqueue work on the
 * given stream and return the launch status (cudaGetLastError) without
 * synchronising; they never exit and never allocate device memory, so each
 * may be captured into a CUDA graph. Kernels are launched with programmatic
 * dependent launch: each lets the next kernel launch, then waits for its
 * predecessor on the stream before touching what another kernel of the step
 * may write, so back-to-back launches overlap their set-up. Weights (GEMM /
 * GEMV matrices, norm weights, the RoPE table) and the step's metadata
 * (positions, slots, block tables, attention tiles) are read before that
 * wait: no kernel may write them during a step — weights are written at
 * load, metadata by host copies ordered before the step's first kernel
 * (common.cuh, "programmatic dependent launch").
 *
 * Element type: `loom_cuda_dt` picks bf16 or IEEE f16 for every tensor the
 * comment calls "dt"; residual stream, norm weights, biases and RoPE tables
 * are float32.
 *
 * KV cache layout (loom/backend.h): each of a layer's K and V pools is
 *   (num_blocks, num_kv_heads, block_size, head_dim), head_dim contiguous,
 * and token slot s lives in block s / block_size at offset s % block_size.
 * Its elements are dt, or FP8 E4M3 codes (`loom_cuda_kv`): one byte each,
 * e4m3(x) with a fixed scale of 1.0, coded as the cpu backend codes its FP8
 * KV cache (the same float32 value gets the same code; formats/e4m3.h).
 */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "gguf_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage element type of activations, weights and the KV cache. */
typedef enum loom_cuda_dt {
    LOOM_CUDA_BF16 = 0,
    LOOM_CUDA_F16 = 1,
} loom_cuda_dt;

/* Element type of the KV cache: dt (the compute type), or FP8 E4M3 codes
 * (OCP "fn", scale 1.0: |x| >= 448 saturates; written by
 * loom_cuda_rope_kv, decoded exactly to dt by the attention kernels). */
typedef enum loom_cuda_kv {
    LOOM_CUDA_KV_DT = 0,
    LOOM_CUDA_KV_E4M3 = 1,
} loom_cuda_kv;

/* Bytes of one KV-cache element. */
#define LOOM_CUDA_KV_ELT(kv) ((kv) == LOOM_CUDA_KV_E4M3 ? 1 : 2)

/* Head dims the attention kernels are built for (the tensor-core tiles need
 * a power of two, multiple of 16). */
#define LOOM_CUDA_HEAD_DIM_OK(d) ((d) == 16 || (d) == 32 || (d) == 64 || (d) == 128 || (d) == 256)
/* Query heads per KV head the attention kernels can pack into one tile. */
#define LOOM_CUDA_MAX_GQA 64

/* ------------------------------------------------------------ element-wise */

/* x[t,:] = float(table[ids[t],:]), or zeros where ids[t] < 0 (a
 * tensor-parallel rank's token outside its vocabulary slice).
 * x (T, H) float32; table (V, H) dt; ids (T) in [0, V) or -1. H % 8 == 0. */
cudaError_t loom_cuda_embedding(loom_cuda_dt dt, float *x, const void *table, const int32_t *ids,
                                int T, int H, cudaStream_t s);
/* loom_cuda_embedding, each element then times `scale` in float32 (Gemma's
 * embedding scale; the cpu backend's loom_cpu_scale after the lookup). */
cudaError_t loom_cuda_embedding_scaled(loom_cuda_dt dt, float *x, const void *table, const int32_t *ids,
                                       int T, int H, float scale, cudaStream_t s);

/* Residual add fused with RMSNorm. For output row i, input row j = rows ?
 * rows[i] : i:
 *   v = x[j,:] (+ r[j,:] when r != NULL)
 *   y[i,:] = dt(v / sqrt(mean(v^2) + eps) * w)
 * and, only when rows == NULL and r != NULL, x[j,:] = v (the residual
 * stream advances). With rows != NULL (the LM-head gather) x is not written.
 * x (., H) float32; r (., H) dt or NULL; w (H) float32, a weight (read
 * before the launch wait: no kernel of the step may write it); y (T, H) dt;
 * rows (T) or NULL. H % 8 == 0. */
cudaError_t loom_cuda_add_rmsnorm(loom_cuda_dt dt, void *y, float *x, const void *r,
                                  const float *w, const int32_t *rows, int T, int H, float eps,
                                  cudaStream_t s);

/* Post-norm residual add (Gemma 3's post-attention and post-FFN norms):
 *   x[t,:] += r[t,:] * rsqrt(mean(r[t,:]^2) + eps) * w
 * in float32 on r's dt values. x (T, H) float32; r (T, H) dt; w (H)
 * float32, a weight as loom_cuda_add_rmsnorm's. H % 8 == 0, H <= 32768. */
cudaError_t loom_cuda_add_normed(loom_cuda_dt dt, float *x, const void *r, const float *w, int T, int H,
                                 float eps, cudaStream_t s);

/* ------------------------------------------------------------ sampling */

/* Largest k loom_cuda_logits_topk serves (loom/backend.h's forward_topk). */
#define LOOM_CUDA_TOPK_MAX 64

/* For each of `rows` float32 logits rows (rows, V): its k largest values
 * (descending, equal values by ascending id, NaN as -inf) into vals/ids
 * (rows, k), and lse (rows) = log sum exp of the row. ws: device
 * workspace of loom_cuda_topk_ws_bytes(rows, V, k) bytes (8-byte aligned);
 * rows <= 65535 (a grid dimension).
 * masks (device, (rows, (V + 31) / 32) words; NULL: none) with has_mask
 * (device, (rows) flags): a row whose flag is set ranks every token
 * whose bit is clear as -inf (loom/backend.h's loom_logits_topk.allowed);
 * its lse stays the raw row's. cudaErrorInvalidValue when
 * !loom_cuda_topk_supported(V, k) (vocabularies above 256k logits, k
 * outside 1..min(V, 64)), masks without has_mask or rows > 65535. */
size_t loom_cuda_topk_ws_bytes(int rows, int V, int k);
int loom_cuda_topk_supported(int V, int k);
cudaError_t loom_cuda_logits_topk(const float *logits, int rows, int V, int k, const uint32_t *masks,
                                  const uint8_t *has_mask, int32_t *ids, float *vals, float *lse, void *ws,
                                  cudaStream_t s);

/* SwiGLU over the fused gate|up GEMM output:
 *   out[t,i] = dt(silu(gu[t,i]) * gu[t,I+i]),  silu(g) = g / (1 + e^-g).
 * gu (T, 2I) dt; out (T, I) dt. I % 8 == 0. */
cudaError_t loom_cuda_swiglu(loom_cuda_dt dt, void *out, const void *gu, int T, int I,
                             cudaStream_t s);

/* GeGLU with tanh GELU (Gemma), shapes as loom_cuda_swiglu:
 *   out[t,i] = dt(gelu(gu[t,i]) * gu[t,I+i]),
 *   gelu(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). */
cudaError_t loom_cuda_geglu_tanh(loom_cuda_dt dt, void *out, const void *gu, int T, int I,
                                 cudaStream_t s);

/* ------------------------------------------------------------------- RoPE */

/* cos/sin table for positions [0, max_pos): cs[p][i] = (cos(p f_i),
 * sin(p f_i)) computed in float64, stored float32. inv_freq (half) float64
 * device; cs (max_pos, half, 2) float32. Run once at load. */
cudaError_t loom_cuda_rope_table(float *cs, const double *inv_freq, int max_pos, int half,
                                 cudaStream_t s);

/* RoPE (NeoX: dims i and i + D/2 rotate together) fused with the QKV bias
 * and the KV-cache write. qkv row t = [q (H, D) | k (KVH, D) | v (KVH, D)],
 * ld elements apart. Per token t at position pos[t]:
 *   q += bias_q; q = rope(q)             (in place in qkv)
 *   k = rope(k + bias_k) -> k_cache[slot[t]],  v + bias_v -> v_cache[slot[t]]
 * skipping the cache write when slot[t] < 0. k and v are stored from their
 * float32 values: rounded to dt, or (kv E4M3) encoded as e4m3(x) exactly as
 * the cpu backend does (round to nearest even, +-448 saturation).
 * qkv (T, ld) dt; bias (H*D + 2*KVH*D) float32 or NULL; cs from
 * loom_cuda_rope_table (pos[t] < its max_pos); pos (T); slot (T) int64;
 * k_cache, v_cache (num_blocks, KVH, block_size, D) of kv. D % 16 == 0.
 * pos and slot are step metadata and cs a load-time table: no kernel of a
 * step writes them, as the kernel reads them before its programmatic-launch
 * wait (loom_cuda_rope_kv_norm also its q_norm / k_norm). */
cudaError_t loom_cuda_rope_kv(loom_cuda_dt dt, loom_cuda_kv kv, void *qkv, int ld,
                              const float *bias, const float *cs, const int32_t *pos,
                              const int64_t *slot, void *k_cache, void *v_cache, int T, int H,
                              int KVH, int D, int block_size, cudaStream_t s);

/* loom_cuda_rope_kv with QK-norm (Qwen3, Gemma 3) before the rotation:
 * each q head (+ bias) is normalised over its D values and times q_norm,
 * each k head times k_norm —
 *   h = h * rsqrt(mean(h^2) + eps) * w
 * — in float32, rounded once after RoPE (q in place, k into the cache as
 * loom_cuda_rope_kv stores it). q_norm or k_norm NULL: that kind is not
 * normalised (both NULL: loom_cuda_rope_kv's result). Weights as the
 * model loader presents them (Gemma's GGUF stores 1 + w already). Shapes as
 * loom_cuda_rope_kv; D even and <= 256. One warp a head. */
cudaError_t loom_cuda_rope_kv_norm(loom_cuda_dt dt, loom_cuda_kv kv, void *qkv, int ld, const float *bias,
                                   const float *q_norm, const float *k_norm, float eps, const float *cs,
                                   const int32_t *pos, const int64_t *slot, void *k_cache, void *v_cache,
                                   int T, int H, int KVH, int D, int block_size, cudaStream_t s);

/* -------------------------------------------------------------- attention */

/* One attention work tile: `ntok` consecutive query tokens of sequence
 * `seq`, starting at flattened token index `tok0`. All tokens of a tile
 * belong to one sequence. 16 bytes so the host can pack them as int32x4. */
typedef struct loom_cuda_attn_tile {
    int32_t seq;   /* row of the block table                                */
    int32_t tok0;  /* first query token (index into positions, q, out)      */
    int32_t ntok;  /* tokens; ntok * G <= rows of the kernel shape; 0 = idle */
    int32_t pad;
} loom_cuda_attn_tile;

/* The two shapes of the attention kernel. A tile's rows are (token, query
 * head of the KV group) pairs, token-major: row r is token tok0 + r / G,
 * head kvh * G + r % G, so one CTA reads each K/V row once for all G query
 * heads sharing it (GQA/MQA packing).
 *   DECODE : 16 rows, the 4 warps split the keys between them (a tile is one
 *            decode token, or a few verify tokens, times G heads);
 *   PREFILL: 64 rows, the 4 warps split the rows and share the keys. */
typedef enum loom_cuda_attn_shape {
    LOOM_CUDA_ATTN_DECODE = 0,
    LOOM_CUDA_ATTN_PREFILL = 1,
} loom_cuda_attn_shape;

/* Rows (token x head pairs) one tile of `shape` holds. */
int loom_cuda_attn_rows(loom_cuda_attn_shape shape);

/* Arguments of loom_cuda_attention. Device pointers unless stated.
 * block_table, bt_stride, positions and tiles are the step's metadata: no
 * kernel may write them (host copies ordered before the launch do), since
 * the kernel reads them before its programmatic-launch wait, while the
 * kernel before it still runs. */
typedef struct loom_cuda_attn_args {
    loom_cuda_dt dt;
    loom_cuda_attn_shape shape;
    void *out;                     /* (T, H*D) dt, row stride ldo elements      */
    int ldo;
    const void *q;                 /* (T, H*D) dt (RoPE applied), stride ldq    */
    int ldq;
    loom_cuda_kv kv;               /* element type of the caches (0: dt)        */
    const void *k_cache;           /* (num_blocks, KVH, block_size, D) kv       */
    const void *v_cache;
    const int32_t *block_table;    /* (S, *bt_stride) block ids                 */
    const int32_t *bt_stride;      /* device int: entries per block-table row   */
    const int32_t *positions;      /* (T) position of each token in its seq     */
    const loom_cuda_attn_tile *tiles; /* (num_tiles)                            */
    int num_tiles;
    int num_heads, num_kv_heads, head_dim, block_size;
    float scale;                   /* softmax scale, 1/sqrt(D)                  */
    int max_splits;                /* >= 1: key partitions per (tile, kv head)  */
    float *partial;                /* split-K workspace; >= loom_cuda_attn_workspace_floats */
    int *sem;                      /* split-K counters, >= num_tiles * KVH ints;
                                      zero before the first call, left zero */
    int window;                    /* > 0: a row at position p sees keys
                                      p - window + 1 .. p only (a sliding-
                                      window layer); 0: keys 0 .. p         */
    int bt_group;                  /* block-table group read: > 0 reads the
                                      table at block_table + bt_group *
                                      bt_stride[1] (bt_stride then points at
                                      2 ints: row length, group length);
                                      0: bt_stride[0] only                   */
} loom_cuda_attn_args;

/* Causal paged attention: every query row attends to keys 0..pos of its
 * sequence (pos - window + 1 .. pos with a window; keys before the tile's
 * first window start are never read, nor their block-table entries),
 * read through the block table. An E4M3 cache is read as codes
 * (half the bytes of dt) and decoded exactly: to dt in shared memory before
 * dt tensor-core products (the prefill shape), or to f16 in registers
 * before f16 products (the decode shape at head_dim 64 / 128; a bf16 query
 * converted to f16 exactly, under a power-of-two scale). A (tile, kv head) is split over
 * up to max_splits CTAs by key range (the split count is decided on the
 * device from the tile's context length, so one captured graph serves any
 * context); the last split of each (tile, kv head) to finish merges the
 * partial results (one kernel launch in all).
 * Head dim must satisfy LOOM_CUDA_HEAD_DIM_OK, num_heads / num_kv_heads <=
 * rows of the shape. */
cudaError_t loom_cuda_attention(const loom_cuda_attn_args *a, cudaStream_t s);

/* Floats of split-K workspace loom_cuda_attention needs for `num_tiles`
 * tiles of `shape` with `max_splits` (0 when max_splits <= 1). */
size_t loom_cuda_attn_workspace_floats(loom_cuda_attn_shape shape, int num_tiles,
                                       int num_kv_heads, int head_dim, int max_splits);

/* CTAs of `shape` one multiprocessor runs at once (occupancy with the
 * kernel's shared memory and registers) for a cache of `kv`; 0 on error.
 * Host-only; call it outside graph capture (it may set the kernel's
 * shared-memory limit). */
int loom_cuda_attn_ctas_per_sm(loom_cuda_dt dt, loom_cuda_kv kv, loom_cuda_attn_shape shape,
                               int head_dim);

/* Split-K bound for a launch of num_tiles tiles: as many key splits as fill
 * one wave of `resident` CTAs (num_SMs x ctas_per_sm), at most 64, at least
 * 1 — a partial second wave costs as much as a full one. */
int loom_cuda_attn_max_splits(int num_tiles, int num_kv_heads, int resident);

/* The split plan both kernels share: a tile whose longest row sees kv_len
 * keys is cut into *splits ranges of *chunk keys (the last shorter). */
void loom_cuda_attn_split_plan(loom_cuda_attn_shape shape, int kv_len, int max_splits,
                               int *splits, int *chunk);

/* Batch-invariant attention (the cuda backend's batch_invariant mode,
 * docs/gpu.md). The kernel's arithmetic for a query row is fixed by the
 * shape, the row's position and its tile's split plan; the plan follows
 * the tile's longest row and max_splits, which in the ordinary dispatch
 * come from the other tokens of the tile and the number of tiles. Here
 * every tile holds one token and max_splits is a constant, so a (token,
 * head) row's reduction order — key tiles, warp key slices, split chunks,
 * merge order — depends on its own kv length (position + 1) alone, not on
 * which tokens or sequences share the step, nor on graph padding. */
#define LOOM_CUDA_ATTN_INVARIANT_SPLITS 16

/* The one shape every batch-invariant launch uses for G query heads per KV
 * head: DECODE when a token's G rows fit its 16 rows, else PREFILL. */
loom_cuda_attn_shape loom_cuda_attn_invariant_shape(int group);

/* Workspace floats per tile of the batch-invariant launch. */
size_t loom_cuda_attn_invariant_ws_floats(int num_heads, int num_kv_heads, int head_dim);

/* loom_cuda_attention with the batch-invariant plan: a->tiles must hold
 * exactly one token each (ntok = 1); a->shape and a->max_splits are
 * ignored (loom_cuda_attn_invariant_shape, LOOM_CUDA_ATTN_INVARIANT_SPLITS).
 * The tiles run in as many launches as the workspace needs: at most
 * ws_floats / loom_cuda_attn_invariant_ws_floats tiles each (which tokens
 * share a launch does not change any token's result). a->sem must hold
 * min(num_tiles, that count) * KVH counters. cudaErrorInvalidValue when not
 * even one tile fits. */
cudaError_t loom_cuda_attention_invariant(const loom_cuda_attn_args *a, size_t ws_floats,
                                          cudaStream_t s);

/* For tests: decode n E4M3 codes (n % 8 == 0) to dt with the attention
 * kernels' own decoder. codes (n) u8; out (n) dt; 16-byte aligned. */
cudaError_t loom_cuda_e4m3_decode(loom_cuda_dt dt, void *out, const uint8_t *codes, size_t n,
                                  cudaStream_t s);

/* ------------------------------------------------------------- KV blocks */

/* Copy whole blocks between pools: for pair i = {src, dst} and pool p,
 *   dst_pools[p] + dst * block_bytes <- src_pools[p] + src * block_bytes.
 * Byte copies: any element type (dt or E4M3) alike.
 * src_pools, dst_pools: device arrays of npools pointers (device memory or
 * mapped pinned host memory); pairs (npairs, 2) device int32.
 * block_bytes % 16 == 0. One launch for every pair and pool. */
cudaError_t loom_cuda_copy_blocks(void *const *src_pools, void *const *dst_pools, int npools,
                                  const int32_t *pairs, int npairs, size_t block_bytes,
                                  cudaStream_t s);

/* ------------------------------------------------------------------ GEMM */

/* y (M, N) = x (M, K) @ w^T through cuBLASLt, bf16/f16 operands, float32
 * accumulation; w (N, K) row-major (PyTorch's (out, in)), a weight: no
 * kernel of the step may write it (the one-row GEMV loads its first chunks
 * before its launch wait). The output is dt,
 * or float32 when out_f32. M <= 8 runs a streaming GEMV kernel; larger M
 * cuBLASLt, whose plans (descriptors + heuristic algorithm) are cached per
 * (M, N, K, output type). One context per backend instance; not
 * thread-safe. */
typedef struct loom_cuda_gemm loom_cuda_gemm;

/* workspace_bytes of device memory is allocated for cuBLASLt (32 MiB is
 * what NVIDIA recommends on Hopper). On failure returns a cuBLAS/CUDA
 * status code in *code and a short reason in msg. */
loom_cuda_gemm *loom_cuda_gemm_create(size_t workspace_bytes, int *code, char *msg,
                                      size_t msg_size);
void loom_cuda_gemm_destroy(loom_cuda_gemm *g);
/* Plan-cache misses so far (each a cuBLASLt heuristic query on the host)
 * and the host seconds they took: a step that meets a new shape pays one. */
void loom_cuda_gemm_plan_stats(const loom_cuda_gemm *g, long long *made, double *seconds);
/* Returns 0 on success, else a cuBLAS status (or CUDA error + 10000) with a
 * reason in msg (may be NULL). Capturable into a CUDA graph. */
int loom_cuda_gemm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M, int N, int K,
                       const void *x, const void *w, void *y, cudaStream_t s, char *msg,
                       size_t msg_size);

/* The FFN's tail: y (M, N) dt = act @ w^T with act = silu(gu[:, :I]) *
 * gu[:, I:] (gu (M, 2I) dt): loom_cuda_swiglu into act (M, I) dt, then the
 * GEMM. Returns like loom_cuda_gemm_run. */
int loom_cuda_gemm_swiglu_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int I, const void *gu,
                              const void *w, void *act, void *y, cudaStream_t s, char *msg, size_t msg_size);

/* ------------------------------------------- one-row GEMV pair epilogues */

/* The kernel that follows a decode step's QKV or gate|up projection, done
 * by that projection's one-row GEMV instead: its warps take the output rows
 * in pairs (n, n + P) — RoPE's dims (i, i + D/2) of a head, SwiGLU's (gate
 * i, up i) — and finish each pair as the separate kernel would, bit for bit
 * (the same helpers, common.cuh). One launch, one (1, N) round trip and one
 * kernel boundary fewer a projection: a Llama-3-8B decode layer has two.
 *   ROPE_KV (P = head_dim / 2): y is the token's qkv row (ld N), then
 *            loom_cuda_rope_kv's work at T = M with these arguments: q
 *            rotated in y, k / v (+ bias) into the caches at slot[t].
 *   SWIGLU  (P = N / 2): y (M, N) is a gate|up output, stored as computed,
 *            and act (M, N / 2) dt = loom_cuda_swiglu of it.
 * A tiled weight's one row (qtiled.cu) does either kind in its K-split
 * reduce where K is split. Where none of these is what runs (M > 1,
 * cuBLASLt, the other tensor-core kernels, GGUF blocks, N not pairable,
 * a tiled weight whose K is not split) the separate kernel runs after
 * the GEMM: the result is the same either way. Fusing was measured
 * faster for both kinds (H200, one Llama-3-8B decode layer in a graph:
 * bf16 126.4 -> 122.0 us); the step fuses SwiGLU only where the down
 * projection after it gains too, and gives tiled weights their epilogues
 * with the qtiled_epilogues parameter (plugins/backend/cuda:
 * cb_swiglu_fuses, cb_epi_ok). */
typedef enum loom_cuda_epi_kind {
    LOOM_CUDA_EPI_NONE = 0,
    LOOM_CUDA_EPI_ROPE_KV = 1,
    LOOM_CUDA_EPI_SWIGLU = 2,
} loom_cuda_epi_kind;
typedef struct loom_cuda_epi {
    loom_cuda_epi_kind kind;
    /* ROPE_KV: as loom_cuda_rope_kv (qkv = y, ld = N, T = M) */
    loom_cuda_kv kv;
    const float *bias, *cs;
    const int32_t *pos;
    const int64_t *slot;
    void *k_cache, *v_cache;
    int num_heads, num_kv_heads, head_dim, block_size;
    /* SWIGLU: act (M, N / 2) dt */
    void *act;
} loom_cuda_epi;

/* y (M, N) dt = x @ w^T as loom_cuda_gemm_run, then epi (NULL or NONE:
 * nothing) — fused into the GEMV at M = 1. Returns like loom_cuda_gemm_run. */
int loom_cuda_gemm_epi_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, int N, int K, const void *x, const void *w,
                           void *y, const loom_cuda_epi *epi, cudaStream_t s, char *msg, size_t msg_size);

/* Launches of a fused epilogue so far (tests: the fused kernel ran). */
long loom_cuda_epi_fused_count(void);

/* Batches of at most max_m rows (0..8; default 8) run the streaming GEMV
 * kernel instead of cuBLASLt (benchmarks compare the two). */
void loom_cuda_gemm_set_gemv_max_m(loom_cuda_gemm *g, int max_m);
/* Batch-invariant mode: every M runs the streaming GEMV (in passes of 8
 * rows; K % 8 == 0 or the call fails), the quantized formats their fused
 * GEMV at every M, no SwiGLU fusion, never cuBLASLt — so each output row
 * has the same bits whatever M is (gemv.cu says why). Slower above M = 8
 * (the weights are read once per 8 rows). Set it before asking
 * loom_cuda_qgemm_scratch_bytes (the quantized GEMV bound changes). */
void loom_cuda_gemm_set_batch_invariant(loom_cuda_gemm *g, int on);

/* ------------------------------------------------------ quantized linear */

/* Weight formats of the quantized linear layers (the values of loom_qformat
 * in loom/quant.h, which this header does not include). */
typedef enum loom_cuda_qfmt {
    LOOM_CUDA_Q_NONE = 0,       /* not quantized: loom_cuda_gemm_run           */
    LOOM_CUDA_Q_INT8_W8A16 = 1, /* int8 weights, f32 scale per row; dt acts    */
    LOOM_CUDA_Q_INT8_W8A8 = 2,  /* the same weights; int8 acts per token       */
    LOOM_CUDA_Q_FP8 = 3,        /* e4m3 weights, f32 scale per row; e4m3 acts  */
    LOOM_CUDA_Q_INT4 = 4,       /* 4-bit group-wise asymmetric; dt acts        */
    LOOM_CUDA_Q_GGUF = 5,       /* GGUF blocks as stored (gguf_layout.h); dt acts */
} loom_cuda_qfmt;

/* GGUF weights: rows [r, r + rows) of the output, all of one block type,
 * stored as the file stores them (gguf_layout.h). */
typedef struct loom_cuda_qseg {
    loom_cuda_gguf type;    /* block type                                      */
    int rows;               /* consecutive output rows                         */
    const void *data;       /* (rows, row_bytes(type, K)) blocks, 16-aligned   */
} loom_cuda_qseg;

/* A quantized weight of logical shape (N out, K in) on the device, as the
 * backend uploads it (kernels/cuda/qgemm.cu and qgguf.cu have the arithmetic):
 *   INT8_*: data int8 (N, K); scales f32 (N): w[n,k] = q[n,k] * scales[n]
 *   FP8   : data e4m3 (N, K) (OCP "fn"); scales f32 (N) — a per-tensor scale
 *           is expanded to every row at upload
 *   INT4  : data u8 (N, K/2), low nibble = even column; scales f32
 *           (N, K/group, 2) = {s, b} per (row, group) with s = scale and
 *           b = -zero * scale, so w = q * s + b = (q - zero) * scale
 *   GGUF  : nseg segments (seg[0] first) whose rows add up to N, each rows
 *           of q4_0 / q4_1 / q4_k / q6_k / q8_0 blocks exactly as the GGUF
 *           file has them — a fused group whose parts have different block
 *           types (Q4_K_M files: q4_k Q/K, q6_k V) is several segments;
 *           data = seg[0].data, scales NULL (the scales are in the blocks)
 *   smooth: W8A8 only: f32 (K), activations are divided by it before they
 *           are quantized; NULL for none.
 * Kernel contract: K % 16 == 0 (INT8, FP8); group % 32 == 0 and K % group
 * == 0 (INT4); GGUF: K a multiple of every segment's block (32, or 256 for
 * q4_k / q6_k) and each segment readable up to the next 16-byte boundary
 * past its end; every pointer 16-byte aligned. No kernel writes a weight's
 * data or scales (they are uploaded and the stream synchronized before
 * use): the GEMVs read them before lc_pdl_wait(), while the kernel before
 * still runs. */
typedef struct loom_cuda_qweight {
    loom_cuda_qfmt fmt;
    int N, K;
    int group;              /* INT4: inputs per (scale, zero) group           */
    const void *data;
    const float *scales;
    const float *smooth;
    int nseg;               /* GGUF: segments used in seg[]                    */
    loom_cuda_qseg seg[LOOM_CUDA_QSEG_MAX];
    int layout;             /* W8A16 / INT4: LOOM_CUDA_QLAYOUT_* of data       */
    loom_cuda_dt tile_dt;   /* tiled INT4: the dt of its (s, b) scale pairs    */
} loom_cuda_qweight;

/* Layouts of a W8A16 / INT4 weight's codes: as uploaded (row-major, the
 * table above), or repacked once by loom_cuda_qweight_tile into the
 * tensor-core tiles of kernels/cuda/qtiled.cu (same bytes, permuted within
 * 16-row blocks; W8A16's scales unchanged, INT4's rewritten in place as
 * (s, b) pairs of tile_dt, 16 rows of a group together: half the bytes).
 * A tiled weight runs qtiled.cu's kernel up to the tiled bound
 * (loom_cuda_qgemm_set_tiled_max_m), one row included (with the pair
 * epilogues where loom_cuda_epi says), and dequantize + cuBLASLt above
 * it; the row-major kernels never see it. */
enum { LOOM_CUDA_QLAYOUT_ROWS = 0, LOOM_CUDA_QLAYOUT_TILED = 1 };

/* Repack w (W8A16 / INT4 with N % 16 == 0, K % 128 == 0, INT4 group % 64
 * == 0: loom_cuda_qweight_tileable) into the tiled layout in place for
 * activations of dt (INT4's scales are stored in it), through a temporary
 * device copy of its codes and scales freed before returning;
 * synchronizes s. Sets w->layout. cudaErrorInvalidValue where the shape
 * does not tile. */
int loom_cuda_qweight_tileable(const loom_cuda_qweight *w);
cudaError_t loom_cuda_qweight_tile(loom_cuda_qweight *w, loom_cuda_dt dt, cudaStream_t s);

/* Does the kernel contract above hold for fmt / K / group? (GGUF: only
 * K % 32; loom_cuda_qweight_valid checks its segments.) */
int loom_cuda_qweight_ok(loom_cuda_qfmt fmt, int K, int group);
/* The whole contract for w, GGUF segments included: 1, or 0 with the
 * reason in why[n]. */
int loom_cuda_qweight_valid(const loom_cuda_qweight *w, char *why, size_t n);

/* Device scratch bytes loom_cuda_qgemm_run needs for w at any M up to
 * max_m with g's current GEMV bounds (quantized activations for W8A8 /
 * FP8; above the GEMV bound the dequantized weight for W8A16 / INT4 / GGUF or a
 * GEMM output buffer for W8A8 / FP8; for W8A16 / INT4 at 9..128 rows the
 * tensor-core kernel's f16 tokens and partial sums). The backend allocates
 * the largest over its weights once; change the bounds before asking. */
size_t loom_cuda_qgemm_scratch_bytes(const loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32,
                                     const loom_cuda_qweight *w, int max_m);

/* Whether a one-row loom_cuda_qgemm_run of w splits K across the warps of
 * the GEMV's CTAs (kernels/cuda/qgemm.cu: where the unsplit grid leaves the
 * GPU short of a wave, e.g. Llama-3-8B's O and down projections; never for
 * a tiled weight, whose row runs qtiled.cu's kernel, nor in
 * batch-invariant mode). The step
 * fuses SwiGLU before a W8A16 / INT4 down projection only where it splits:
 * unsplit, that GEMV right after the gate|up one is the slower layer. */
int loom_cuda_qgemm_splits(const loom_cuda_gemm *g, loom_cuda_dt dt, const loom_cuda_qweight *w);

/* y (M, N) = x (M, K) @ dequant(w)^T, x dt, y dt or float32 (out_f32).
 *   W8A16 / INT4 at 9..128 rows where the shape fits (K % 128; INT4 K % 256
 *     and group % 128), outside the batch-invariant mode: a tensor-core
 *     kernel that decodes the weights in registers (qmma.cu).
 *   else M <= the format's GEMV bound: a fused dequantize-GEMV (8 rows of x per
 *     pass; W8A8 / FP8 quantize x per token first, as the CPU kernels do;
 *     GGUF launches once per segment).
 *   larger M: W8A16 / INT4 / GGUF dequantize w into scratch as dt and run
 *     the dt GEMM (cuBLASLt); FP8 / W8A8 quantize x per token and run cuBLASLt's
 *     FP8 GEMM (e4m3 x e4m3 -> fp32 accumulate) with the scales sx[m] and
 *     s[n] as its outer vectors, or — int8 (int32 accumulate), or a shape
 *     without such an FP8 algorithm — the GEMM with unit scales and a small
 *     epilogue kernel for the scales. When cuBLASLt has no algorithm for a
 *     shape at all the GEMV runs in passes of 8 rows instead.
 * scratch: >= loom_cuda_qgemm_scratch_bytes(dt, out_f32, w, M) bytes. W8A8 /
 * FP8 read x with 16-byte loads: x 16-byte aligned (K % 16 keeps every row so).
 * Returns 0 or an error code with a reason in msg (see loom_cuda_gemm_run).
 * Capturable into a CUDA graph once the shape has run eagerly. */
int loom_cuda_qgemm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int out_f32, int M,
                        const loom_cuda_qweight *w, const void *x, void *y, void *scratch,
                        size_t scratch_bytes, cudaStream_t s, char *msg, size_t msg_size);

/* y (M, N) = swiglu(gu) @ dequant(w)^T, the FFN down projection: gu the
 * fused gate|up output (M, 2K) dt, y dt. W8A8 / FP8 form silu(gate) * up
 * (rounded to dt) inside their per-token activation quantization — one
 * kernel and one (M, K) write + read fewer than loom_cuda_swiglu then
 * loom_cuda_qgemm_run, with the same codes and so the same bits; the other
 * formats run exactly those two into act (M, K) dt. scratch as for
 * loom_cuda_qgemm_run (w, M). */
int loom_cuda_qgemm_swiglu_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w,
                               const void *gu, void *act, void *y, void *scratch,
                               size_t scratch_bytes, cudaStream_t s, char *msg, size_t msg_size);

/* y (M, N) = rmsnorm(x (+)= r) @ dequant(w)^T, the QKV and gate|up
 * projections: x the float32 residual (M, K), advanced to x + r when r is
 * not NULL (r dt), norm_w (K) f32, y dt — loom_cuda_add_rmsnorm into xn then
 * loom_cuda_qgemm_run, and exactly that for W8A16 / INT4 / GGUF. W8A8 / FP8
 * quantize the normalised rows per token inside the norm kernel instead
 * (K <= 32768): one kernel and one (M, K) write + read fewer, the same codes
 * and so the same bits — but xn is then not written. */
int loom_cuda_qgemm_norm_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w,
                             float *x, const void *r, const float *norm_w, float eps, void *xn, void *y,
                             void *scratch, size_t scratch_bytes, cudaStream_t s, char *msg,
                             size_t msg_size);

/* loom_cuda_qgemm_norm_run, then epi (cuda_kernels.h: loom_cuda_epi; NULL
 * or NONE: nothing) — fused into the one-row CUDA-core GEMV at M = 1. For
 * SWIGLU the down projection then reads act (loom_cuda_qgemm_run), where
 * W8A8 / FP8 quantize it: the codes loom_cuda_qgemm_swiglu_run forms. */
int loom_cuda_qgemm_norm_epi_run(loom_cuda_gemm *g, loom_cuda_dt dt, int M, const loom_cuda_qweight *w, float *x,
                                 const void *r, const float *norm_w, float eps, void *xn, void *y,
                                 const loom_cuda_epi *epi, void *scratch, size_t scratch_bytes, cudaStream_t s,
                                 char *msg, size_t msg_size);

/* Largest M that runs the fused GEMV (in passes of 8 rows) for fmt; larger
 * M take the GEMM path (W8A16 / INT4 shapes the tensor-core kernel takes go
 * there from 9 rows whatever the bound). Defaults: INT4 / GGUF 32, W8A16 16, W8A8 / FP8 8 (the
 * GEMV re-reads the weights once per 8 rows; the dequantize-to-scratch path
 * writes and reads a dt copy). 0 forces the GEMM path for every M (tests);
 * capped at 256. */
void loom_cuda_qgemm_set_gemv_max_m(loom_cuda_gemm *g, loom_cuda_qfmt fmt, int max_m);

/* Fewest rows (M) from which the W8A8 / FP8 / INT4 GEMV runs on the tensor
 * cores (qgemv_tc.cu) instead of the CUDA-core kernel, up to 8 rows, where
 * the shape fits: 0 (the default) = as measured on the H200, 2 for W8A8 /
 * FP8 and 3 for INT4; 1..8 that many rows for every format; 9 never. The
 * crossover is the GPU's (at 2 rows W8A8 / FP8 were within 2%); never in
 * batch-invariant mode. The cuda backend's qgemv_tc_min_rows. */
void loom_cuda_qgemm_set_tc_min_m(loom_cuda_gemm *g, int min_m);
/* Tiled W8A16 / INT4 weights (LOOM_CUDA_QLAYOUT_TILED) run qtiled.cu's
 * kernel up to max_m rows (0..65536, default 512; above 256 in chunks of
 * 256 rows, each reading the weight again) and dequantize + cuBLASLt above;
 * batch-invariant mode runs the kernel at every M, in the same chunks. Set
 * it before asking loom_cuda_qgemm_scratch_bytes. */
void loom_cuda_qgemm_set_tiled_max_m(loom_cuda_gemm *g, int max_m);
/* Tiled weights from min_m rows run the kernel's Hopper wgmma path (sm_90a
 * warpgroup MMA), below it the mma.sync one; 0 = never (default 17; not in
 * batch-invariant mode). The cuda backend's qtiled_wgmma_rows. */
void loom_cuda_qgemm_set_tiled_wgmma_min_m(loom_cuda_gemm *g, int min_m);
/* The launch order of every kernel on the current device (common.cuh,
 * "programmatic dependent launch"): on (1) a kernel lets the next one
 * launch before its griddepcontrol.wait, off (0, each device's default)
 * after it. Device-wide: the copies are synchronous writes on the legacy stream,
 * so kernels in flight or launched just after may still see the old value
 * (either order is correct). Costs nothing when the device already has the
 * value (the last one written is remembered per device), so a backend calls
 * it before each step; instances sharing a device should agree, or each
 * step rewrites it. Thread-safe. Returns cudaSuccess or the copy's error
 * (cudaErrorNotSupported: on asked with more than 64 units registered).
 * The cuda backend's trigger_first. */
cudaError_t loom_cuda_set_trigger_first(int on);
/* What every unit's copy of the order holds on the current device: *units
 * registered, *on of them on (a test's read-back; the results are the same
 * either way). Returns cudaSuccess or the first copy's error. */
cudaError_t loom_cuda_trigger_first_units(int *units, int *on);
/* Each translation unit's setter and getter of its own copy of the order
 * (common.cuh registers them at load; at most 64). Not for callers. */
void lc_pdl_register(cudaError_t (*set)(int), cudaError_t (*get)(int *));
/* FP8 GEMMs with bf16 output (above the GEMV's rows) take cuBLASLt's
 * per-token / per-channel scale vectors, one rounding into y, from calls of
 * min_m rows; below, a unit-scale GEMM writing y and the scale epilogue
 * pass, which gpu_bench --quant timed faster there (H200, one Llama-3-8B
 * layer's four linears: 125.7 vs 178.3 us at 16 rows, 139.8 vs 166.5 at 64,
 * 151.7 vs 161.4 at 128; the vectors at 2048 rows: 799.2 vs 1053.2; an H100
 * alike: 138.4 vs 168.0 at 16 rows, 151.8 vs 178.0 at 64, 178.4 vs 182.7 at
 * 128, the vectors ahead at 256: 188.4 vs 206.0). f16 / f32 outputs keep the
 * vectors. 0..65536, default LOOM_CUDA_FP8_VEC_MIN_M; the cuda backend's
 * fp8_vec_rows. */
#define LOOM_CUDA_FP8_VEC_MIN_M 129
void loom_cuda_qgemm_set_fp8_vec_min_m(loom_cuda_gemm *g, int min_m);

/* ------------------------------------------------------ quantized experts */

/* The linear layers of a mixture of experts on quantized weights
 * (moe_quant.cu; the rest of the layer is moe.cu's, below). A stacked
 * quantized weight is E experts' (N, K) matrices in one format, each in
 * loom_cuda_qweight's layout: expert e's data at data + e *
 * loom_cuda_moe_qdata_bytes(w), its scales at scales + e *
 * loom_cuda_moe_qscale_floats(w); smooth unused (NULL). Formats: INT8_W8A16,
 * INT8_W8A8, FP8 and INT4 (not GGUF); N % 8 == 0, K % 16 == 0 (INT4: group
 * a multiple of 32 dividing K). W8A8 / FP8 read their activations as codes
 * xq (rows, K) and scales sx (rows) from loom_cuda_moe_quant_act (x unused),
 * the others x (rows, K) dt (xq, sx unused). */
int loom_cuda_moe_qweight_ok(loom_cuda_qfmt fmt, int N, int K, int group);
size_t loom_cuda_moe_qdata_bytes(const loom_cuda_qweight *w);
size_t loom_cuda_moe_qscale_floats(const loom_cuda_qweight *w);
/* Whether fmt quantizes its activations: 1 int8 (W8A8), 2 e4m3 (FP8), 0 no. */
int loom_cuda_moe_qacts(loom_cuda_qfmt fmt);
/* Per-row activation codes for fmt (W8A8: int8, FP8: e4m3; the dense
 * layers' arithmetic): of x (M, K) dt, or with swiglu of silu(gate) * up
 * read from a gate|up output x (M, 2K). xq (M, K) bytes, sx (M) f32. */
cudaError_t loom_cuda_moe_quant_act(loom_cuda_dt dt, loom_cuda_qfmt fmt, int swiglu, int M, int K,
                                    const void *x, void *xq, float *sx, cudaStream_t s);
/* loom_cuda_moe_gemv on a stacked quantized weight: y (P, w->N) dt, pair
 * p's row of x / xq / sx is p / div. Only the chosen experts are read. */
cudaError_t loom_cuda_moe_qgemv(loom_cuda_dt dt, const void *x, const void *xq, const float *sx, int div,
                                const int32_t *sel, const loom_cuda_qweight *w, int P, void *y, cudaStream_t s);
/* loom_cuda_moe_gemm on a stacked quantized weight (the tiles of
 * loom_cuda_moe_group): sorted row r reads input row perm ? perm[r] / div
 * : r of x / xq / sx; y (P, w->N) dt in sorted rows. */
cudaError_t loom_cuda_moe_qgemm(loom_cuda_dt dt, const void *x, const void *xq, const float *sx,
                                const int32_t *perm, int div, const loom_cuda_qweight *w, const int32_t *tiles,
                                int max_tiles, void *y, cudaStream_t s);

/* ---------------------------------------------------- mixture of experts */

/* The routed FFN of a mixture-of-experts layer (moe.cu), as the cuda
 * backend runs it for T tokens, E experts, K chosen per token and
 * P = T K (token, expert) pairs; pair p = t K + j is token t's j-th choice:
 *   logits (T, E) f32 = xn Wr^T (loom_cuda_gemm_run);
 *   loom_cuda_moe_route: sel / wt (T, K);
 *   many pairs: loom_cuda_moe_group, then the expert GEMMs over the rows
 *   sorted by expert (loom_cuda_moe_gemm) and SwiGLU over them;
 *   few pairs: loom_cuda_moe_gemv per pair, reading only chosen experts;
 *   loom_cuda_moe_combine: r (T, H) = the weighted sum (+ shared expert).
 * No host synchronisation and no grid sized from routed data: capturable
 * in a CUDA graph. */
#define LOOM_CUDA_MOE_MAX_EXPERTS 256
/* Rows of the tiles loom_cuda_moe_gemm and loom_cuda_moe_qgemm take (the
 * list's tile_rows, loom_cuda_moe_group). */
#define LOOM_CUDA_MOE_TILE_ROWS 64

/* Per token: p = softmax(logits[t, :E]) in float32; its K largest (equal
 * probabilities: the lower expert first) into sel (T, K) in descending
 * order and their p into wt (T, K), divided by their sum when norm != 0
 * (transformers' order: softmax over all experts, then top-k). E in
 * [1, LOOM_CUDA_MOE_MAX_EXPERTS], K in [1, min(E, 32)].
 * Expert parallelism: this rank holds experts [e0, e0 + el) (0 and E for
 * a whole model); sel names them 0 .. el - 1, and a choice of another
 * rank's expert is -1 — the kernels below read nothing for such a pair
 * and give it no weight (grouping leaves it out, the GEMVs write zeros,
 * the combines skip it), so each rank's r is its share of the sum. */
cudaError_t loom_cuda_moe_route(const float *logits, int T, int E, int K, int norm, int e0, int el,
                                int32_t *sel, float *wt, cudaStream_t s);

/* Tiles of tile_rows rows that any routing of P pairs over E experts may
 * need: the grid height of the grouped GEMMs and the room of the tile list
 * (1 + 3 max_tiles ints). */
int loom_cuda_moe_max_tiles(int P, int E, int tile_rows);

/* Group the P pairs of sel (P) by expert, on the device: off (E + 1) the
 * exclusive prefix of the per-expert counts; perm (P): sorted row i holds
 * pair perm[i], ascending experts; inv (P): pair p sits at sorted row
 * inv[p] (-1 for sel[p] < 0: no row, no tile); tiles (1 + 3 max_tiles):
 * tiles[0] = n, then n (expert, first sorted row, rows <= tile_rows)
 * triples covering every expert's rows — tile_rows 64 for
 * loom_cuda_moe_gemm, loom_cuda_moe_qgemm and loom_cuda_moe_gemm_wg's
 * 64-row form, 128 for its 128-row form. One CTA. */
cudaError_t loom_cuda_moe_group(const int32_t *sel, int P, int E, int tile_rows, int32_t *off, int32_t *perm,
                                int32_t *inv, int32_t *tiles, cudaStream_t s);

/* Expert parallelism's all-to-all form (the cuda backend's moe_dispatch:
 * all_to_all) moves pairs between ranks in grouped order:
 * loom_cuda_moe_ids: out[i] (n) = v if 0 <= v < lim, else -1, with v =
 * sel[perm[i]] + add (perm NULL: sel[i] + add) — the expert of each sorted
 * pair, or a received expert number made local (add = -e0, lim = el);
 * loom_cuda_moe_gather: row i of out (n, H) = row rows[i] / div of x (rows
 * NULL: i / div; rows[i] < 0: zeros), 2-byte elements, H % 8 == 0 — the
 * sorted pairs' input rows, or results put back in the order received;
 * loom_cuda_moe_owner_counts: cnt[d] (n) = off[(d + 1) el] - off[d el],
 * the grouped pairs of each rank's el experts (off from loom_cuda_moe_group). */
cudaError_t loom_cuda_moe_ids(const int32_t *sel, const int32_t *perm, int n, int add, int lim, int32_t *out,
                              cudaStream_t s);
cudaError_t loom_cuda_moe_gather(const void *x, const int32_t *rows, int div, int n, int H, void *out,
                                 cudaStream_t s);
cudaError_t loom_cuda_moe_owner_counts(const int32_t *off, int n, int el, int32_t *cnt, cudaStream_t s);

/* Grouped GEMM over the tile list: for each tile (e, r0, n) and sorted rows
 * r in [r0, r0 + n): y[r, :N] (dt) = x[row] @ W_e^T with row = perm[r] / div
 * (perm NULL: row = r), W (E, N, K) dt. Tensor cores (mma.sync), float32
 * accumulation. N % 8 == 0, K % 8 == 0, max_tiles <= 65535 (the grid
 * height; tiles past tiles[0] exit). */
cudaError_t loom_cuda_moe_gemm(loom_cuda_dt dt, const void *x, const int32_t *perm, int div,
                               const void *w, const int32_t *tiles, int max_tiles, int N, int K,
                               void *y, cudaStream_t s);

/* loom_cuda_moe_gemm's contract on Hopper's warpgroup MMA (wgmma, sm_90a)
 * over a list of tile_rows-row tiles (64 or 128: the list's, from
 * loom_cuda_moe_group), 256 output columns a CTA; the weights through a
 * cp.async ring of ~201-206 KB of shared memory, so one CTA an SM. 128-row
 * tiles read each weight stage once for twice the rows (steps whose
 * experts have that many). The same float32 sums in another order: not
 * the mma.sync kernel's bits. */
cudaError_t loom_cuda_moe_gemm_wg(loom_cuda_dt dt, const void *x, const int32_t *perm, int div,
                                  const void *w, const int32_t *tiles, int max_tiles, int tile_rows, int N, int K,
                                  void *y, cudaStream_t s);

/* Per pair p < P: y[p, :N] (dt) = x[p / div] @ W_{sel[p]}^T, W (E, N, K)
 * dt — only the chosen experts' weights are read (small batches), each
 * output row one lane-strided float32 dot (the same bits at any P). K % 8
 * == 0, div <= 32768. */
cudaError_t loom_cuda_moe_gemv(loom_cuda_dt dt, const void *x, int div, const int32_t *sel,
                               const void *w, int P, int N, int K, void *y, cudaStream_t s);

/* r[t, :] (dt) = sum_j wt[t K + j] y[row] (j ascending; row = inv[t K + j],
 * skipped when -1, or t K + j when inv is NULL), plus, when ysh != NULL,
 * sigmoid(xn[t] . sh_gate) ysh[t, :]. y (P, H), ysh / xn (T, H) dt,
 * sh_gate (H) f32. H % 8 == 0. K may be 0: the shared expert alone (y,
 * inv and wt unused). */
cudaError_t loom_cuda_moe_combine(loom_cuda_dt dt, void *r, const void *y, const int32_t *inv,
                                  const float *wt, int T, int K, int H, const void *ysh, const void *xn,
                                  const float *sh_gate, cudaStream_t s);

/* Few pairs without a shared expert (batch-1 decode), two launches instead
 * of gate|up GEMVs, SwiGLU, down GEMVs and the combine:
 * loom_cuda_moe_gemv_swiglu: act[p, :I] (dt) = silu(g) u per pair, g and u
 * the rows n and I + n of W_{sel[p]} (E, 2I, K) dotted with x[p / div]
 * (float32, not rounded between); K % 8 == 0, div <= 32768.
 * loom_cuda_moe_gemv_combine: r[t, :H] (dt) = sum_j wt[t K + j]
 * (act[t K + j] . rows of W_{sel[t K + j]} (E, H, I)) over the slots with
 * sel >= 0, float32 throughout, one rounding; I % 8 == 0, K <= 32. Each
 * token's result is the same at any T. */
cudaError_t loom_cuda_moe_gemv_swiglu(loom_cuda_dt dt, const void *x, int div, const int32_t *sel,
                                      const void *w, int P, int I, int K, void *act, cudaStream_t s);
cudaError_t loom_cuda_moe_gemv_combine(loom_cuda_dt dt, const void *act, const int32_t *sel, const float *wt,
                                       const void *w, int T, int K, int H, int I, void *r, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CUDA_KERNELS_H */
