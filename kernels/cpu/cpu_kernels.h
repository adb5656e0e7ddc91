/*
 * kernels/cpu/cpu_kernels.h — the float32 CPU kernels of a Llama- or
 * Gemma-3-family forward pass: RMSNorm (per row, per head, as a post-norm),
 * RoPE (NeoX, Llama-3 / linear scaling), SwiGLU and tanh GeGLU, paged
 * attention with an online softmax and an optional sliding window, KV-cache writes, linear layers
 * through OpenBLAS, embedding lookup, and a small pthread pool to spread
 * work over cores.
 *
 * What this is not: a tensor library. Every function takes raw pointers with
 * the shape in its comment — (T, H, D) means T rows of H heads of D floats,
 * last dimension contiguous — and trusts its caller (the cpu backend plugin)
 * to have validated indices; kernels never allocate per call except where
 * stated and never fail. Activations are float32; the KV cache is float32 or
 * float16 (converted on write and on read).
 *
 * Threading: functions that take a `loom_cpu_pool *` spread their work over
 * it (NULL = run on the calling thread). A pool is driven by one thread at a
 * time. Linear layers at M = 1 and large M run on OpenBLAS's own threads
 * (see loom_cpu_blas_threads); small M runs on the pool.
 *
 * Symbols here are internal to whatever links the static library; the
 * library is built with hidden visibility so a plugin exports none of them.
 */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ thread pool */

typedef struct loom_cpu_pool loom_cpu_pool;

/* Work callback: process items [begin, end). `worker` is 0 for the calling
 * thread and 1..n-1 for pool threads (index into per-thread scratch). */
typedef void (*loom_cpu_task_fn)(void *ctx, int64_t begin, int64_t end, int worker);

/* A pool that runs work on `n_threads` threads in total: the caller plus
 * n_threads - 1 workers. Returns NULL when threads cannot be created
 * (n_threads <= 1 gives a valid pool with no workers). */
loom_cpu_pool *loom_cpu_pool_create(int n_threads);
/* Joins the workers; NULL-safe. */
void loom_cpu_pool_destroy(loom_cpu_pool *p);
/* Threads that run work, counting the caller (1 for a NULL pool). */
int loom_cpu_pool_size(const loom_cpu_pool *p);
/* Run fn over items [0, n) in chunks of at least `grain` items, on all the
 * pool's threads, and return when every item is done. Runs inline when the
 * pool is NULL, has one thread, or n <= grain. */
void loom_cpu_pool_for(loom_cpu_pool *p, int64_t n, int64_t grain, loom_cpu_task_fn fn, void *ctx);

/* ------------------------------------------------------------ top-k */

/* Most ids loom_cpu_logits_topk returns (loom/backend.h's
 * LOOM_LOGITS_TOPK_MAX: the cpu backend checks the two agree). */
#define LOOM_CPU_TOPK_MAX 64

/* host->logits_topk_row (allowed NULL) or _masked_row's result for one
 * logits row, over the pool: the k (1..LOOM_CPU_TOPK_MAX) largest of
 * row[0..vocab) in ids / vals, descending, equal values by ascending id,
 * NaN and ids outside `allowed` (bit v of allowed[v / 32], when given)
 * ranked as -inf, k > vocab padded with id -1 and -inf — the same ids and
 * values as the host's; *lse = log(sum exp(row)) over the raw row, NaN
 * terms 0, from float exps summed in float64 (within a few parts in 1e7 of
 * the host's float64 one); +-inf when the row's max is. The same bits at
 * any thread count. k <= 0 writes nothing. */
void loom_cpu_logits_topk(const float *row, int64_t vocab, const uint32_t *allowed, int32_t k, int32_t *ids,
                          float *vals, float *lse, loom_cpu_pool *pool);

/* ------------------------------------------------------------ element-wise */

/* RMSNorm, per row t: y[t,:] = x[t,:] / sqrt(mean(x[t,:]^2) + eps) * w.
 * x, y (T, N) with row strides ldx, ldy (floats); w (N). y may equal x. */
void loom_cpu_rmsnorm(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                      int64_t T, int64_t N, float eps, loom_cpu_pool *pool);

/* Residual add fused with RMSNorm: x[t,:] += r[t,:]; y[t,:] = rmsnorm(x[t,:]) * w.
 * x, r, y (T, N) contiguous; x is updated in place; y must not alias x or r. */
void loom_cpu_add_rmsnorm(float *y, float *x, const float *r, const float *w, int64_t T,
                          int64_t N, float eps, loom_cpu_pool *pool);

/* SwiGLU: out[t,i] = silu(gate[t,i]) * up[t,i], silu(g) = g / (1 + e^-g).
 * gate, up (T, I) with row strides ldg, ldu; out (T, I) contiguous. */
void loom_cpu_swiglu(float *out, const float *gate, int64_t ldg, const float *up, int64_t ldu,
                     int64_t T, int64_t I, loom_cpu_pool *pool);

/* y[i] = e^x[i] for i < n (y may equal x), with the vector exp the softmax
 * of attention and SwiGLU use (kernels/cpu/vexp.h: within 2 ulp of e^x,
 * e^0 = 1, e^-inf = 0, overflow to inf, NaN kept). */
void loom_cpu_exp(float *y, const float *x, int64_t n);

/* GeGLU with tanh GELU: out[t,i] = gelu(gate[t,i]) * up[t,i],
 * gelu(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (PyTorch's
 * approximate="tanh"). Shapes as loom_cpu_swiglu. */
void loom_cpu_geglu_tanh(float *out, const float *gate, int64_t ldg, const float *up, int64_t ldu,
                         int64_t T, int64_t I, loom_cpu_pool *pool);

/* Post-norm residual add: x[t,:] += rmsnorm(r[t,:]) * w. x, r (T, N)
 * contiguous, distinct. */
void loom_cpu_add_normed(float *x, const float *r, const float *w, int64_t T, int64_t N, float eps,
                         loom_cpu_pool *pool);

/* RMSNorm of every head in place (QK-norm): x (T, n_heads, D) with row
 * stride ldx; each head's D floats normalised and times w (D). */
void loom_cpu_head_rmsnorm(float *x, int64_t ldx, int64_t T, int32_t n_heads, int32_t D, const float *w,
                           float eps, loom_cpu_pool *pool);

/* x (n) *= s. */
void loom_cpu_scale(float *x, int64_t n, float s);

/* Embedding lookup: out[t,:] = table[ids[t],:]. table (V, N), out (T, N);
 * ids must be in [0, V) (checked by the caller). */
void loom_cpu_embedding(float *out, const float *table, const int32_t *ids, int64_t T, int64_t N);

/* ------------------------------------------------------------------- RoPE */

/* Rotary frequencies for `head_dim` (even) rotated dims, in float64:
 * inv_freq[i] = theta^(-2i / head_dim), i in [0, head_dim/2), then scaled:
 *   LINEAR: inv_freq / factor (positions divided by factor);
 *   LLAMA3: Hugging Face's `_compute_llama3_parameters` — wavelengths longer
 *           than original_context / low_freq_factor are divided by factor,
 *           shorter than original_context / high_freq_factor kept, and the
 *           band between interpolated smoothly.
 * inv_freq (head_dim/2). */
void loom_cpu_rope_inv_freq(double *inv_freq, int32_t head_dim, double theta,
                            loom_rope_scaling scaling, double factor, double low_freq_factor,
                            double high_freq_factor, double original_context);

/* cos/sin of position * inv_freq for each token: cos_t, sin_t (T, head_dim/2);
 * positions (T); inv_freq (head_dim/2). Computed in float64, stored float. */
void loom_cpu_rope_table(float *cos_t, float *sin_t, const int32_t *positions, int64_t T,
                         const double *inv_freq, int32_t half);

/* NeoX-style rotation in place: for each token t, head h, i < D/2,
 *   (a, b) = (x[i], x[i + D/2]) -> (a cos - b sin, b cos + a sin).
 * x (T, n_heads, D) with row stride ldx floats between tokens; cos_t, sin_t
 * (T, D/2) from loom_cpu_rope_table. */
void loom_cpu_rope_apply(float *x, int64_t ldx, int64_t T, int32_t n_heads, int32_t head_dim,
                         const float *cos_t, const float *sin_t);

/* ------------------------------------------------------------- KV cache */

/* One layer's K and V pools, each (num_blocks, num_kv_heads, block_size,
 * head_dim) in `dtype` (F32 or F16), the layout of loom/backend.h. */
typedef struct loom_cpu_kv {
    void *k;                  /* K pool base                                  */
    void *v;                  /* V pool base                                  */
    loom_dtype dtype;         /* LOOM_DTYPE_F32, F16 (|x| > 65504 saturates
                                 to +-65504) or FP8_E4M3 (E4M3 "fn", scale
                                 1.0: stored e4m3(x), |x| > 448 saturates to
                                 +-448)                                       */
    int32_t num_blocks;       /* blocks in each pool                          */
    int32_t num_kv_heads;     /* KV heads                                     */
    int32_t block_size;       /* tokens per block                             */
    int32_t head_dim;         /* floats per head                              */
} loom_cpu_kv;

/* Write each token's K and V into its cache slot: for t with
 * slot_mapping[t] >= 0, slot s = block * block_size + offset receives
 * k[t] and v[t]. k, v (T, num_kv_heads, head_dim) with row strides ldk, ldv.
 * Slots must be < num_blocks * block_size (checked by the caller). */
void loom_cpu_kv_write(const loom_cpu_kv *kv, const float *k, int64_t ldk, const float *v,
                       int64_t ldv, const int64_t *slot_mapping, int64_t T);

/* float32 <-> IEEE binary16 rows (round to nearest even; F16C when the CPU
 * has it). */
void loom_cpu_f32_to_f16(uint16_t *dst, const float *src, int64_t n);
void loom_cpu_f16_to_f32(float *dst, const uint16_t *src, int64_t n);

/* ------------------------------------------------------------- attention */

/* Arguments of loom_cpu_paged_attention (all borrowed for the call). */
typedef struct loom_cpu_attn_args {
    float *out;                   /* (T, num_heads, head_dim), row stride ldo  */
    int64_t ldo;
    const float *q;               /* (T, num_heads, head_dim), row stride ldq  */
    int64_t ldq;
    const loom_cpu_kv *kv;        /* this layer's cache                        */
    int32_t num_heads;            /* query heads; multiple of kv->num_kv_heads */
    int32_t num_tokens;           /* T                                         */
    int32_t num_seqs;             /* S                                         */
    const int32_t *query_start;   /* (S + 1): seq s owns tokens [qs[s], qs[s+1]) */
    const int32_t *positions;     /* (T) position of each token in its seq     */
    const int32_t *block_table;   /* (S, block_table_stride) block ids         */
    int32_t block_table_stride;
    float scale;                  /* softmax scale, usually 1/sqrt(head_dim)   */
    int32_t window;               /* > 0: a query at position p sees only keys
                                     p - window + 1 .. p (sliding window); 0: all */
    float *part;                  /* optional scratch of part_floats floats for
                                     the split over key chunks; NULL: never split */
    int64_t part_floats;
} loom_cpu_attn_args;

/* Causal paged attention over a flattened variable-length batch: token t of
 * sequence s at position p attends to positions 0..p of s, whose K/V are read
 * through s's block table (position j lives in block block_table[s][j / bs]
 * at offset j % bs). Query head h reads KV head h / (num_heads/num_kv_heads)
 * (GQA; MQA when num_kv_heads = 1); with a->window only the last `window`
 * positions (block table entries before them are not read). Softmax is computed online over key
 * tiles (FlashAttention's running max and sum), so no (T, context) score
 * matrix is formed. Work items are (tokens, KV head) groups spread over the
 * pool, or (token, KV head, key chunk) with a->part (loom_cpu_attention_part_floats).
 * head_dim <= LOOM_CPU_MAX_HEAD_DIM. Block ids and positions must be valid
 * (checked by the caller). */
#define LOOM_CPU_MAX_HEAD_DIM 256
void loom_cpu_paged_attention(const loom_cpu_attn_args *a, loom_cpu_pool *pool);
/* Floats of a->part with which a call may split its queries' keys over the
 * pool's threads (key chunks of 512 positions, states merged in order: a
 * decode step at long context has too few (query, KV head) items for the
 * threads otherwise); with less (or NULL) it does not split — the output
 * is the same bits either way. */
int64_t loom_cpu_attention_part_floats(const loom_cpu_attn_args *a);

/* ------------------------------------------------------------- linear */

/* y (M, N) = x (M, K) @ w^T + beta * y  [+ bias (N) broadcast over rows].
 * w (N, K) row-major: PyTorch's (out, in). x rows have stride ldx, y rows ldy.
 * beta = 0 never reads y. Dispatch by M:
 *   M = 1                      cblas_sgemv (memory-bound; OpenBLAS threads)
 *   2 <= M <= LOOM_CPU_SMALL_M loom_cpu_linear_small_m on `pool`
 *   M > LOOM_CPU_SMALL_M       cblas_sgemm (compute-bound; OpenBLAS threads) */
#define LOOM_CPU_SMALL_M 16
void loom_cpu_linear(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                     const float *bias, int64_t M, int64_t N, int64_t K, float beta,
                     loom_cpu_pool *pool);

/* The same product for small M without OpenBLAS: each weight row is read
 * once and dotted with all M rows of x (OpenBLAS 0.3.21's sgemm re-packs w
 * and runs 3-8x slower than a GEMV at M = 2..16). Any M works; it is the
 * fast choice only while M is small. */
void loom_cpu_linear_small_m(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                             const float *bias, int64_t M, int64_t N, int64_t K, float beta,
                             loom_cpu_pool *pool);

/* Set OpenBLAS's thread count (process-wide: OpenBLAS has one pool). */
void loom_cpu_blas_threads(int n);
/* OpenBLAS's name for the CPU kernel set in use, e.g. "Haswell". */
const char *loom_cpu_blas_core(void);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CPU_KERNELS_H */
