/*
 * plugins/executor/tp/tp_p2p.cu — one-shot all-reduce and all-gather over
 * peer-to-peer GPU memory, for the ranks of one process (the tp executor's
 * NCCL communicator routes small collectives here when executor.p2p_kib is
 * set; tp_nccl.c).
 *
 * Why: a batch-1 decode step of a Llama-3-8B layer all-reduces 8 KB twice;
 * NCCL's latency for that (tens of microseconds, host work per call) was
 * most of the gap between tp 2 and half of tp 1 on two H200s, and NCCL
 * calls captured into a CUDA graph hung there. These are plain kernels:
 * no host work per call, capturable in graphs.
 *
 * Each rank r owns, on its GPU: data[r] (two slots of `cap` bytes, used by
 * alternate calls), flags[r] (P2P_BLOCKS x P2P_MAX_RANKS words: the last
 * call number each peer announced to each block) and seq[r] (P2P_BLOCKS
 * words: the calls each block has made). A call launches P2P_BLOCKS blocks
 * (always the same grid, so block b of every rank handles the same chunk b
 * of the message); block b of rank r:
 *   1. copies its chunk of the input into data[r][slot], slot = call & 1;
 *   2. writes the call number into flags[j][b][r] of every peer j (release,
 *      system scope) and waits until flags[r][b][j] >= call for every j
 *      (acquire) — so every peer's chunk b is staged;
 *   3. reads chunk b from every rank's data[j][slot] and sums in rank order
 *      0..n-1 in float32 (so every rank gets the same bits), or, for an
 *      all-gather, copies every rank's chunk into its place.
 * Two slots make one barrier per call enough: before rank r reuses a slot
 * (call s + 2) it passed call s + 1's barrier, which its peers reach only
 * after their call-s kernel (which read that slot) has finished.
 * A peer that never arrives (a failed rank) is waited for until the abort
 * word (host-mapped) is set or P2P_TIMEOUT_NS passes; then the call writes
 * the status word and returns with garbage, which the executor reports.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tp_p2p.h"

#define P2P_BLOCKS 32
#define P2P_THREADS 512
#define P2P_TIMEOUT_NS 60000000000ull /* 60 s: a peer that never arrives */

struct p2p_ptrs {
    char *data[TP_P2P_MAX_RANKS];       /* each rank's two slots            */
    uint32_t *flags[TP_P2P_MAX_RANKS];  /* each rank's (blocks, max ranks)  */
};

struct tp_p2p {
    int n;
    size_t cap;
    p2p_ptrs ptrs;
    uint32_t *seq[TP_P2P_MAX_RANKS];    /* each rank's (blocks)             */
    volatile uint32_t *abort_h;         /* host-mapped: set by tp_p2p_abort */
    volatile uint32_t *status_h;        /* host-mapped: 1 + rank that timed out */
};

__device__ __forceinline__ void p2p_store_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t p2p_load_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint64_t p2p_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ float p2p_to_f(float v) { return v; }
__device__ __forceinline__ float p2p_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float p2p_to_f(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T p2p_from_f(float v);
template <> __device__ __forceinline__ float p2p_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 p2p_from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half p2p_from_f<__half>(float v) { return __float2half_rn(v); }

/* Block b's part [lo, hi) of `units` units. */
__device__ __forceinline__ void p2p_chunk(int64_t units, int64_t *lo, int64_t *hi) {
    const int64_t per = (units + P2P_BLOCKS - 1) / P2P_BLOCKS;
    int64_t a = per * blockIdx.x, e = a + per;
    if (a > units) a = units;
    if (e > units) e = units;
    *lo = a, *hi = e;
}

/* Copy bytes [lo, hi) of src to dst: 16-byte units when both are aligned
 * and the range is (the message's byte count is a multiple of 16 and the
 * chunks are cut in 16-byte units then), else bytes. */
__device__ __forceinline__ void p2p_copy(char *dst, const char *src, int64_t lo, int64_t hi, bool vec) {
    if (vec) {
        for (int64_t i = lo / 16 + threadIdx.x; i < hi / 16; i += blockDim.x)
            reinterpret_cast<uint4 *>(dst)[i] = __ldcg(reinterpret_cast<const uint4 *>(src) + i);
    } else {
        for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
    }
}

/* Steps 1 and 2 of the header for this block: stage bytes [lo, hi) of
 * `src` into this rank's slot, announce, wait for every peer. Returns the
 * call number (the slot is its low bit), or 0 when it gave up waiting. */
__device__ uint32_t p2p_stage_and_meet(const p2p_ptrs &P, int rank, int n, uint32_t *seq, size_t cap,
                                       const char *src, int64_t lo, int64_t hi, bool vec,
                                       const volatile uint32_t *abort_w, volatile uint32_t *status_w) {
    __shared__ uint32_t s_call;
    __shared__ int s_ok;
    if (threadIdx.x == 0) s_call = seq[blockIdx.x] + 1, s_ok = 1;
    __syncthreads();
    const uint32_t call = s_call;
    char *slot = P.data[rank] + (size_t)(call & 1) * cap;
    p2p_copy(slot, src, lo, hi, vec);
    __threadfence_system(); /* staged bytes visible to peers before the flag */
    __syncthreads();
    const int j = threadIdx.x;
    if (j < n && j != rank) p2p_store_release(P.flags[j] + blockIdx.x * TP_P2P_MAX_RANKS + rank, call);
    if (j < n && j != rank) {
        const uint32_t *f = P.flags[rank] + blockIdx.x * TP_P2P_MAX_RANKS + j;
        const uint64_t t0 = p2p_now_ns();
        for (uint32_t spins = 0; (int32_t)(p2p_load_acquire(f) - call) < 0; spins++) {
            if ((spins & 1023) == 1023 && (*abort_w || p2p_now_ns() - t0 > P2P_TIMEOUT_NS)) {
                if (!*abort_w) *status_w = 1u + (uint32_t)rank;
                s_ok = 0;
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) seq[blockIdx.x] = call; /* this block's call is spent either way */
    return s_ok ? call : 0u;
}

template <typename T>
__global__ void __launch_bounds__(P2P_THREADS)
p2p_all_reduce_kernel(p2p_ptrs P, int rank, int n, uint32_t *seq, size_t cap, T *buf, int64_t count,
                      const volatile uint32_t *abort_w, volatile uint32_t *status_w) {
    const int64_t bytes = count * (int64_t)sizeof(T);
    const bool vec = bytes % 16 == 0 && ((uintptr_t)buf & 15) == 0;
    constexpr int E = 16 / sizeof(T); /* elements per 16-byte unit */
    int64_t lo, hi; /* in bytes, cut at 16-byte units when vec, at elements otherwise */
    if (vec) {
        p2p_chunk(bytes / 16, &lo, &hi);
        lo *= 16, hi *= 16;
    } else {
        p2p_chunk(count, &lo, &hi);
        lo *= sizeof(T), hi *= sizeof(T);
    }
    const uint32_t call = p2p_stage_and_meet(P, rank, n, seq, cap, reinterpret_cast<const char *>(buf), lo,
                                             hi, vec, abort_w, status_w);
    if (!call) return;
    const size_t off = (size_t)(call & 1) * cap;
    if (vec) {
        for (int64_t u = lo / 16 + threadIdx.x; u < hi / 16; u += blockDim.x) {
            float acc[E];
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] = 0.f;
            for (int j = 0; j < n; j++) { /* rank order: the same bits on every rank */
                uint4 v = __ldcg(reinterpret_cast<const uint4 *>(P.data[j] + off) + u);
                const T *t = reinterpret_cast<const T *>(&v);
#pragma unroll
                for (int e = 0; e < E; e++) acc[e] += p2p_to_f(t[e]);
            }
            uint4 o;
            T *to = reinterpret_cast<T *>(&o);
#pragma unroll
            for (int e = 0; e < E; e++) to[e] = p2p_from_f<T>(acc[e]);
            reinterpret_cast<uint4 *>(buf)[u] = o;
        }
    } else {
        for (int64_t i = lo / (int64_t)sizeof(T) + threadIdx.x; i < hi / (int64_t)sizeof(T); i += blockDim.x) {
            float acc = 0.f;
            for (int j = 0; j < n; j++) acc += p2p_to_f(__ldcg(reinterpret_cast<const T *>(P.data[j] + off) + i));
            buf[i] = p2p_from_f<T>(acc);
        }
    }
}

__global__ void __launch_bounds__(P2P_THREADS)
p2p_all_gather_kernel(p2p_ptrs P, int rank, int n, uint32_t *seq, size_t cap, const char *send, char *recv,
                      int64_t bytes, const volatile uint32_t *abort_w, volatile uint32_t *status_w) {
    const bool vec = bytes % 16 == 0 && ((uintptr_t)send & 15) == 0 && ((uintptr_t)recv & 15) == 0;
    int64_t lo, hi;
    if (vec) {
        p2p_chunk(bytes / 16, &lo, &hi);
        lo *= 16, hi *= 16;
    } else {
        p2p_chunk(bytes, &lo, &hi);
    }
    const uint32_t call = p2p_stage_and_meet(P, rank, n, seq, cap, send, lo, hi, vec, abort_w, status_w);
    if (!call) return;
    const size_t off = (size_t)(call & 1) * cap;
    for (int j = 0; j < n; j++) p2p_copy(recv + (size_t)j * bytes, P.data[j] + off, lo, hi, vec);
}

/* ------------------------------------------------------------------ host */

static int p2p_fail(char *why, size_t why_n, const char *what, cudaError_t e) {
    if (why && why_n) snprintf(why, why_n, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

extern "C" tp_p2p *tp_p2p_create(int n, size_t cap, char *why, size_t why_n) {
    if (n < 2 || n > TP_P2P_MAX_RANKS) {
        if (why && why_n) snprintf(why, why_n, "%d ranks (peer-to-peer collectives serve 2..%d)", n, TP_P2P_MAX_RANKS);
        return NULL;
    }
    cap = (cap + 255) & ~(size_t)255;
    int cur = 0;
    cudaGetDevice(&cur);
    tp_p2p *p = new tp_p2p();
    p->n = n, p->cap = cap;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < n && e == cudaSuccess; i++)
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            int ok = 0;
            if ((e = cudaDeviceCanAccessPeer(&ok, i, j)) != cudaSuccess) break;
            if (!ok) {
                if (why && why_n) snprintf(why, why_n, "GPU %d cannot access GPU %d's memory directly", i, j);
                tp_p2p_destroy(p);
                cudaSetDevice(cur);
                return NULL;
            }
            if ((e = cudaSetDevice(i)) != cudaSuccess) break;
            e = cudaDeviceEnablePeerAccess(j, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError(), e = cudaSuccess;
            if (e != cudaSuccess) break;
        }
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if ((e = cudaSetDevice(i)) != cudaSuccess ||
            (e = cudaMalloc((void **)&p->ptrs.data[i], 2 * cap)) != cudaSuccess ||
            (e = cudaMalloc((void **)&p->ptrs.flags[i], P2P_BLOCKS * TP_P2P_MAX_RANKS * sizeof(uint32_t))) !=
                cudaSuccess ||
            (e = cudaMalloc((void **)&p->seq[i], P2P_BLOCKS * sizeof(uint32_t))) != cudaSuccess ||
            (e = cudaMemset(p->ptrs.flags[i], 0, P2P_BLOCKS * TP_P2P_MAX_RANKS * sizeof(uint32_t))) !=
                cudaSuccess ||
            (e = cudaMemset(p->seq[i], 0, P2P_BLOCKS * sizeof(uint32_t))) != cudaSuccess ||
            (e = cudaDeviceSynchronize()) != cudaSuccess)
            break;
    }
    void *words = NULL;
    if (e == cudaSuccess && (e = cudaHostAlloc(&words, 2 * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable)) ==
                                cudaSuccess) {
        memset(words, 0, 2 * sizeof(uint32_t));
        p->abort_h = (volatile uint32_t *)words;
        p->status_h = (volatile uint32_t *)words + 1;
    }
    cudaSetDevice(cur);
    if (e != cudaSuccess) {
        p2p_fail(why, why_n, "setting up peer-to-peer buffers", e);
        tp_p2p_destroy(p);
        return NULL;
    }
    return p;
}

extern "C" void tp_p2p_destroy(tp_p2p *p) {
    if (!p) return;
    int cur = 0;
    cudaGetDevice(&cur);
    for (int i = 0; i < p->n; i++) {
        cudaSetDevice(i);
        if (p->ptrs.data[i]) cudaFree(p->ptrs.data[i]);
        if (p->ptrs.flags[i]) cudaFree(p->ptrs.flags[i]);
        if (p->seq[i]) cudaFree(p->seq[i]);
    }
    if (p->abort_h) cudaFreeHost((void *)p->abort_h);
    cudaSetDevice(cur);
    delete p;
}

extern "C" size_t tp_p2p_cap(const tp_p2p *p) { return p ? p->cap : 0; }

extern "C" void tp_p2p_abort(tp_p2p *p) {
    if (p && p->abort_h) *p->abort_h = 1;
}

extern "C" unsigned tp_p2p_status(const tp_p2p *p) { return p && p->status_h ? *p->status_h : 0; }

extern "C" int tp_p2p_all_reduce(tp_p2p *p, int rank, void *buf, int64_t count, int dtype, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const volatile uint32_t *ab = p->abort_h;
    volatile uint32_t *stw = p->status_h;
    switch (dtype) {
    case TP_P2P_F32:
        p2p_all_reduce_kernel<float><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(p->ptrs, rank, p->n, p->seq[rank], p->cap,
                                                                         (float *)buf, count, ab, stw);
        break;
    case TP_P2P_BF16:
        p2p_all_reduce_kernel<__nv_bfloat16><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(
            p->ptrs, rank, p->n, p->seq[rank], p->cap, (__nv_bfloat16 *)buf, count, ab, stw);
        break;
    case TP_P2P_F16:
        p2p_all_reduce_kernel<__half><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(p->ptrs, rank, p->n, p->seq[rank], p->cap,
                                                                          (__half *)buf, count, ab, stw);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int tp_p2p_all_gather(tp_p2p *p, int rank, const void *send, void *recv, int64_t bytes, void *stream) {
    p2p_all_gather_kernel<<<P2P_BLOCKS, P2P_THREADS, 0, (cudaStream_t)stream>>>(
        p->ptrs, rank, p->n, p->seq[rank], p->cap, (const char *)send, (char *)recv, bytes, p->abort_h,
        p->status_h);
    return (int)cudaGetLastError();
}

extern "C" const char *tp_p2p_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }
