/*
 * kernels/cuda/topk.cu — logits rows reduced where they are computed
 * (loom_cuda_logits_topk, cuda_kernels.h): the k largest logits of each row
 * with their ids, and the row's log-sum-exp, so a decode step moves a few
 * hundred bytes per sequence to the host instead of vocab * 4 (512 KB at a
 * 128k vocabulary) and the host sampler scans k values instead of vocab.
 *
 * A (value, id) pair is one 64-bit key: the float's bits made monotone in
 * the high word and ~id in the low word, so one unsigned comparison ranks
 * by value, then by ascending id (the ranking the host sampler uses). NaN
 * ranks as -inf and -0 as +0, like host->logits_topk_row (core/plugin/host_rules.c).
 *
 *   pass 1 (every k): one block per 8192-logit chunk of a row folds it
 *           into the chunk's best key and log-sum-exp (running max and scaled
 *           sum, merged once per batch of 8 values a thread), then one warp
 *           per row merges the chunks' pairs in a fixed order.
 *   k > 1:  pass 2 — one block per 4096-logit chunk of a row sorts the
 *           chunk's keys in shared memory (bitonic) and keeps its k best;
 *           pass 3 — one block per row sorts the chunks' candidates
 *           (at most 64 chunks x 64) and keeps the k best.
 * Plain launches (no programmatic dependent launch): they run after the LM
 * head has finished, and the next step's first kernel waits for them.
 *
 * Constraint masks (optional): a row with one ranks every token outside it
 * as -inf (its id still breaking ties) in both passes, while the
 * log-sum-exp reads the raw value — the raw distribution's normaliser, as
 * the host sampler reports logprobs.
 */
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "cuda_kernels.h"

#define TK_CHUNK 4096   /* logits per pass-2 block                          */
#define TK_MAX_CHUNKS 64 /* so pass 3 sorts at most 64 * 64 = 4096 keys     */
#define TK_THREADS 512

/* A row's mask, or NULL (masks: (rows, words) bits; has: (rows) flags). */
struct tk_masks {
    const uint32_t *bits;
    const uint8_t *has;
    int words;
};

__device__ __forceinline__ const uint32_t *tk_row_mask(tk_masks m, int row) {
    return m.bits && m.has[row] ? m.bits + (size_t)row * m.words : nullptr;
}

/* x as ranked for token v: -inf when a mask forbids v. */
__device__ __forceinline__ float tk_ranked(float x, const uint32_t *mask, int v) {
    return mask && !((__ldg(mask + (v >> 5)) >> (v & 31)) & 1u) ? -INFINITY : x;
}

__device__ __forceinline__ uint64_t tk_key(float x, int32_t id) {
    if (x != x) x = -INFINITY;
    if (x == 0.0f) x = 0.0f; /* -0 ranks as +0 */
    uint32_t u = __float_as_uint(x);
    uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint32_t)(0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ float tk_val(uint64_t key) {
    uint32_t o = (uint32_t)(key >> 32);
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

__device__ __forceinline__ int32_t tk_id(uint64_t key) {
    return (int32_t)(0xffffffffu - (uint32_t)key);
}

/* Online log-sum-exp state: sum = sum exp(x - m). */
struct tk_lse {
    float m, s;
};

__device__ __forceinline__ tk_lse tk_lse_merge(tk_lse a, tk_lse b) {
    if (a.m < b.m) {
        tk_lse t = a;
        a = b;
        b = t;
    }
    if (b.m == -INFINITY) return a; /* also covers both -inf */
    if (a.m == INFINITY) return a;
    return {a.m, a.s + b.s * __expf(b.m - a.m)};
}

/* Pass 1: grid (chunks of TK1_CHUNK, rows), block TK1_THREADS, one batch of
 * TK1_VEC values a thread: all loads of a batch in flight together, the
 * log-sum-exp folding a batch in with one merge (its own max, then the
 * batch's independent exps). A row is split over blocks because one block a
 * row took 37 us on a 128k row (H100, ncu): 3-4% of the kernel time of a
 * batch-1 step of the quantized Llama-3-8B shape cut to 8 layers. The split
 * depends on V alone, so a row's result has the same bits at every row count. */
#define TK1_THREADS 1024
#define TK1_VEC 8
#define TK1_CHUNK (TK1_THREADS * TK1_VEC)

/* a chunk's best key and log-sum-exp state */
struct tk_part {
    uint64_t key;
    float m, s;
};

__device__ __forceinline__ void tk_fold(const float *f, int n, int v0, int stride, const uint32_t *mask,
                                        uint64_t &best, tk_lse &st) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < TK1_VEC; i++)
        if (i < n) {
            const int v = v0 + i * stride;
            const uint64_t key = tk_key(tk_ranked(f[i], mask, v), v);
            best = key > best ? key : best;
            if (f[i] == f[i]) m = fmaxf(m, f[i]);
        }
    if (m == -INFINITY) return; /* nothing but -inf / NaN: adds exp(-inf) = 0 */
    float sum = 0.0f;
    if (m == INFINITY) sum = 1.0f; /* the row's lse is +inf whatever else it holds */
    else {
#pragma unroll
        for (int i = 0; i < TK1_VEC; i++)
            if (i < n && f[i] == f[i]) sum += __expf(f[i] - m);
    }
    st = tk_lse_merge(st, {m, sum});
}

/* a warp's pairs merged by a butterfly: every lane ends with the warp's */
__device__ __forceinline__ void tk_warp_merge(uint64_t &best, tk_lse &st) {
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t ok = __shfl_xor_sync(0xffffffffu, best, o);
        best = ok > best ? ok : best;
        const tk_lse other = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
        st = tk_lse_merge(st, other);
    }
}

__global__ void __launch_bounds__(TK1_THREADS)
    tk_best_lse_kernel(const float *__restrict__ logits, int V, tk_masks masks, tk_part *part) {
    const int row = blockIdx.y, c = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    const uint32_t *mask = tk_row_mask(masks, row);
    uint64_t best = 0;
    tk_lse st = {-INFINITY, 0.0f};
    const int v = c * TK1_CHUNK + threadIdx.x; /* values v, v + TK1_THREADS, ... */
    float f[TK1_VEC];
    int n = 0;
#pragma unroll
    for (int i = 0; i < TK1_VEC; i++)
        if (v + i * TK1_THREADS < V) f[i] = __ldg(x + v + i * TK1_THREADS), n = i + 1;
    tk_fold(f, n, v, TK1_THREADS, mask, best, st);
    tk_warp_merge(best, st);
    __shared__ uint64_t sk[TK1_THREADS / 32];
    __shared__ float sm[TK1_THREADS / 32], ss[TK1_THREADS / 32];
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) sk[w] = best, sm[w] = st.m, ss[w] = st.s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) {
            best = sk[i] > best ? sk[i] : best;
            st = tk_lse_merge(st, {sm[i], ss[i]});
        }
        part[(size_t)row * gridDim.x + c] = {best, st.m, st.s};
    }
}

/* Pass 1b: grid (rows), one warp: lane i takes chunk i (chunks <= 32). */
__global__ void __launch_bounds__(32)
    tk_best_lse_merge_kernel(const tk_part *__restrict__ part, int chunks, int32_t *ids, float *vals, float *lse,
                             int k) {
    const int row = blockIdx.x, lane = threadIdx.x;
    uint64_t best = 0;
    tk_lse st = {-INFINITY, 0.0f};
    if (lane < chunks) {
        const tk_part p = part[(size_t)row * chunks + lane];
        best = p.key, st = {p.m, p.s};
    }
    tk_warp_merge(best, st);
    if (lane == 0) {
        float l = st.m;
        if (st.m > -INFINITY && st.m < INFINITY) l = st.m + logf(st.s);
        lse[row] = l;
        if (k == 1) {
            ids[row] = tk_id(best);
            vals[row] = tk_val(best);
        }
    }
}

/* Sort n (a power of two) keys in shared memory, descending. */
__device__ void tk_bitonic_desc(uint64_t *s, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                int pos = 2 * i - (i & (stride - 1));
                uint64_t a = s[pos], b = s[pos + stride];
                bool desc = (pos & size) == 0;
                if (desc ? a < b : a > b) {
                    s[pos] = b;
                    s[pos + stride] = a;
                }
            }
            __syncthreads();
        }
    }
}

/* Pass 2: grid (chunks, rows), block TK_THREADS; cand (rows, chunks, k). */
__global__ void tk_chunk_kernel(const float *__restrict__ logits, int V, tk_masks masks, int k, int chunks,
                                uint64_t *cand) {
    __shared__ uint64_t s[TK_CHUNK];
    const int row = blockIdx.y, c = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    const uint32_t *mask = tk_row_mask(masks, row);
    const int base = c * TK_CHUNK;
    for (int i = threadIdx.x; i < TK_CHUNK; i += blockDim.x) {
        int v = base + i;
        s[i] = v < V ? tk_key(tk_ranked(x[v], mask, v), v) : 0; /* 0 ranks below every real key */
    }
    __syncthreads();
    tk_bitonic_desc(s, TK_CHUNK);
    uint64_t *out = cand + ((size_t)row * chunks + c) * k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = s[i];
}

/* Pass 3: grid (rows), block TK_THREADS. */
__global__ void tk_merge_kernel(const uint64_t *__restrict__ cand, int k, int chunks, int n2, int32_t *ids,
                                float *vals) {
    __shared__ uint64_t s[TK_MAX_CHUNKS * LOOM_CUDA_TOPK_MAX];
    const int row = blockIdx.x, n = chunks * k;
    const uint64_t *in = cand + (size_t)row * n;
    for (int i = threadIdx.x; i < n2; i += blockDim.x) s[i] = i < n ? in[i] : 0;
    __syncthreads();
    tk_bitonic_desc(s, n2);
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        ids[(size_t)row * k + i] = tk_id(s[i]);
        vals[(size_t)row * k + i] = tk_val(s[i]);
    }
}

static int tk_chunks(int V) { return (V + TK_CHUNK - 1) / TK_CHUNK; }
static int tk1_chunks(int V) { return (V + TK1_CHUNK - 1) / TK1_CHUNK; }

/* pass 2's candidates (k > 1), then pass 1's chunk pairs */
static size_t tk_cand_bytes(int rows, int V, int k) {
    return k > 1 ? (size_t)rows * (size_t)tk_chunks(V) * (size_t)k * sizeof(uint64_t) : 0;
}

extern "C" size_t loom_cuda_topk_ws_bytes(int rows, int V, int k) {
    return tk_cand_bytes(rows, V, k) + (size_t)rows * (size_t)tk1_chunks(V) * sizeof(tk_part);
}

extern "C" int loom_cuda_topk_supported(int V, int k) {
    /* 256k logits: 64 pass-2 chunks, 32 pass-1 chunks (a lane each) */
    return V >= 1 && k >= 1 && k <= LOOM_CUDA_TOPK_MAX && k <= V && tk_chunks(V) <= TK_MAX_CHUNKS &&
           tk1_chunks(V) <= 32;
}

extern "C" cudaError_t loom_cuda_logits_topk(const float *logits, int rows, int V, int k, const uint32_t *masks,
                                             const uint8_t *has_mask, int32_t *ids, float *vals, float *lse,
                                             void *ws, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    if (!loom_cuda_topk_supported(V, k) || (masks && !has_mask) || rows > 65535) return cudaErrorInvalidValue;
    const tk_masks m = {masks, has_mask, (V + 31) / 32};
    tk_part *part = (tk_part *)((uint8_t *)ws + tk_cand_bytes(rows, V, k));
    tk_best_lse_kernel<<<dim3((unsigned)tk1_chunks(V), (unsigned)rows), TK1_THREADS, 0, s>>>(logits, V, m, part);
    tk_best_lse_merge_kernel<<<rows, 32, 0, s>>>(part, tk1_chunks(V), ids, vals, lse, k);
    if (k == 1) return cudaGetLastError();
    const int chunks = tk_chunks(V);
    int n2 = 1;
    while (n2 < chunks * k) n2 <<= 1;
    tk_chunk_kernel<<<dim3((unsigned)chunks, (unsigned)rows), TK_THREADS, 0, s>>>(logits, V, m, k, chunks,
                                                                                 (uint64_t *)ws);
    tk_merge_kernel<<<rows, TK_THREADS, 0, s>>>((const uint64_t *)ws, k, chunks, n2, ids, vals);
    return cudaGetLastError();
}
