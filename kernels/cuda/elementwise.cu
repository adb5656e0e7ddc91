/*
 * kernels/cuda/elementwise.cu — the memory-bound kernels of the forward
 * pass: embedding gather (times Gemma's embedding scale), residual add +
 * RMSNorm (optionally gathering the LM-head rows, or quantizing its rows
 * per token for a W8A8 / FP8 GEMM instead of storing them), Gemma's
 * post-norm residual add, SwiGLU and GeGLU, the RoPE cos/sin table, RoPE
 * fused with the QKV bias and the KV-cache write (dt, or FP8 E4M3 codes
 * through e4m3.h's encoder) — with QK-norm (Qwen3, Gemma 3) a per-head
 * RMSNorm first, in the same kernel — and whole-block KV copies.
 *
 * Every kernel moves 16-byte vectors (8 bf16/f16, or 4 floats twice) so a
 * warp reads 512 contiguous bytes per instruction; widths are multiples of
 * 8 elements (checked by the backend at load). One CTA per token row for
 * the row-wise kernels: a row of a Llama hidden state is 4-16 KB, enough
 * work for one CTA, and the grid has T CTAs — for a batch-1 decode step
 * these kernels are a few microseconds, so launch count matters more than
 * occupancy (they run inside a CUDA graph in decode).
 */
#include "common.cuh"
#include "qgemm.h"

#include <math.h>

/* ------------------------------------------------------------- embedding */

/* x (T, H) f32 <- table (V, H) dt rows ids (T) times `scale` (1: exact);
 * id -1: a zero row (a tensor-parallel rank's token outside its vocabulary
 * slice). grid T, block 128. */
template <typename T>
__global__ void lc_embedding_kernel(float *__restrict__ x, const T *__restrict__ table,
                                    const int32_t *__restrict__ ids, int H, float scale) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int t = blockIdx.x;
    const int32_t id = ids[t];
    float *dst = x + (size_t)t * H;
    if (id < 0) {
        for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
            float4 *d = reinterpret_cast<float4 *>(dst + c * 8);
            d[0] = d[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        return;
    }
    const T *src = table + (size_t)id * H;
    for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
        float f[8];
        lc_unpack8<T>(lc_ldg16(src + c * 8), f);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = __fmul_rn(f[e], scale);
        float4 *d = reinterpret_cast<float4 *>(dst + c * 8);
        d[0] = make_float4(f[0], f[1], f[2], f[3]);
        d[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

extern "C" cudaError_t loom_cuda_embedding_scaled(loom_cuda_dt dt, float *x, const void *table,
                                                  const int32_t *ids, int T, int H, float scale,
                                                  cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_embedding_kernel<E>, dim3(T), dim3(128), 0, s, x,
                                            static_cast<const E *>(table), ids, H, scale));
    return e;
}

extern "C" cudaError_t loom_cuda_embedding(loom_cuda_dt dt, float *x, const void *table,
                                           const int32_t *ids, int T, int H, cudaStream_t s) {
    return loom_cuda_embedding_scaled(dt, x, table, ids, T, H, 1.0f, s);
}

/* ------------------------------------------------------ add + RMSNorm */

/* Chunks of 8 elements a thread keeps in registers: with up to 1024
 * threads, rows up to 4 * 8 * 1024 = 32768 wide. */
#define LC_NORM_MAXC 4

/* A thread's first chunk of norm weights (8 floats at threadIdx.x * 8;
 * zeros past nc chunks), loaded before the launch wait as no kernel writes
 * them: after the row's sum it is otherwise a round trip on the critical
 * path of a one-CTA decode kernel. It covers a whole row up to H = 8192. */
__device__ __forceinline__ void lc_norm_w_first(const float *__restrict__ w, int nc, float4 &w0, float4 &w1) {
    w0 = w1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (threadIdx.x >= nc) return;
    w0 = __ldg(reinterpret_cast<const float4 *>(w + threadIdx.x * 8));
    w1 = __ldg(reinterpret_cast<const float4 *>(w + threadIdx.x * 8) + 1);
}

/* One CTA per output row i (input row j = rows ? rows[i] : i):
 * v = x[j] (+ r[j]); y[i] = v * rsqrt(mean(v^2) + eps) * w; x[j] = v when
 * writing back. v stays in registers between the two phases.
 * x (., H) f32; r (., H) dt or NULL; w (H) f32; y (T, H) dt.
 * Q (LC_NORM_*): LC_NORM_STORE stores y; LC_NORM_INT8 / LC_NORM_E4M3 keep
 * y's dt-rounded values (divided by smooth) and store their per-token
 * codes xq (T, H) and scales sx (T) instead (lc_quant_act's arithmetic).
 * Launch bounds: up to 1024 threads must fit 64 registers (no spills,
 * checked with -Xptxas -v). */
enum { LC_NORM_STORE = 0, LC_NORM_INT8 = 1, LC_NORM_E4M3 = 2 };
template <typename T, int Q = LC_NORM_STORE>
__global__ void __launch_bounds__(1024)
    lc_add_rmsnorm_kernel(T *__restrict__ y, float *__restrict__ x, const T *__restrict__ r,
                          const float *__restrict__ w, const int32_t *__restrict__ rows, int H,
                          float eps, const float *__restrict__ smooth = nullptr,
                          uint8_t *__restrict__ xq = nullptr, float *__restrict__ sx = nullptr) {
    __shared__ float red[32];
    const int nc = H / 8;
    float4 w0p, w1p;
    lc_norm_w_first(w, nc, w0p, w1p);
    lc_pdl_trigger();
    lc_pdl_wait();
    const int i = blockIdx.x;
    const int j = rows ? rows[i] : i;
    float *xr = x + (size_t)j * H;
    const T *rr = r ? r + (size_t)j * H : nullptr;
    const bool write_x = r && !rows;
    float v[LC_NORM_MAXC][8];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < LC_NORM_MAXC; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            const float4 a = reinterpret_cast<const float4 *>(xr + c * 8)[0];
            const float4 b = reinterpret_cast<const float4 *>(xr + c * 8)[1];
            v[k][0] = a.x, v[k][1] = a.y, v[k][2] = a.z, v[k][3] = a.w;
            v[k][4] = b.x, v[k][5] = b.y, v[k][6] = b.z, v[k][7] = b.w;
            if (rr) {
                float f[8];
                lc_unpack8<T>(lc_ldg16(rr + c * 8), f);
#pragma unroll
                for (int e = 0; e < 8; e++) v[k][e] += f[e];
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[k][e] * v[k][e];
        }
    }
    ss = lc_block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)H + eps);
    T *yr = Q == LC_NORM_STORE ? y + (size_t)i * H : nullptr;
    float amax = 0.0f; /* Q: of y / smooth */
#pragma unroll
    for (int k = 0; k < LC_NORM_MAXC; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            const float4 w0 = k == 0 ? w0p : __ldg(reinterpret_cast<const float4 *>(w + c * 8));
            const float4 w1 = k == 0 ? w1p : __ldg(reinterpret_cast<const float4 *>(w + c * 8) + 1);
            const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            if (write_x) {
                float4 *d = reinterpret_cast<float4 *>(xr + c * 8);
                d[0] = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
                d[1] = make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
            }
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = v[k][e] * inv * wf[e];
            if constexpr (Q == LC_NORM_STORE) {
                lc_stg16(yr + c * 8, lc_pack8<T>(o));
            } else { /* keep y as dt would store it (/ smooth) for its codes */
                lc_unpack8<T>(lc_pack8<T>(o), v[k]);
                if (smooth) {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[k][e] /= smooth[c * 8 + e];
                }
#pragma unroll
                for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[k][e]));
            }
        }
    }
    if constexpr (Q != LC_NORM_STORE) {
        /* per-token codes of y (lc_quant_act's arithmetic) */
        amax = lc_block_max(amax, red);
        const float sc = Q == LC_NORM_E4M3 ? amax / 448.0f : amax / 127.0f;
        const float qinv = amax > 0.0f ? 127.0f / amax : 0.0f;
        if (threadIdx.x == 0) sx[i] = sc;
#pragma unroll
        for (int k = 0; k < LC_NORM_MAXC; k++) {
            const int c = threadIdx.x + k * blockDim.x;
            if (c < nc) lc_qact_store8<Q == LC_NORM_E4M3>(v[k], sc, qinv, xq + (size_t)i * H + c * 8);
        }
    }
}

/* Threads of a row of width H: one 8-element chunk each where the row
 * allows (a decode step has a single row: spread it over as many threads as
 * possible), up to 1024; 0 when H % 8 or the row exceeds LC_NORM_MAXC
 * chunks a thread. */
static int lc_norm_threads(int H) {
    const int nc = H / 8;
    int threads = ((nc + 31) / 32) * 32;
    if (threads < 64) threads = 64;
    if (threads > 1024) threads = 1024;
    return H % 8 || nc > threads * LC_NORM_MAXC ? 0 : threads;
}

extern "C" cudaError_t loom_cuda_add_rmsnorm(loom_cuda_dt dt, void *y, float *x, const void *r,
                                             const float *w, const int32_t *rows, int T, int H,
                                             float eps, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    const int threads = lc_norm_threads(H);
    if (!threads) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_add_rmsnorm_kernel<E>, dim3(T), dim3(threads), 0, s,
                                            static_cast<E *>(y), x, static_cast<const E *>(r), w,
                                            rows, H, eps, nullptr, nullptr, nullptr));
    return e;
}

/* qgemm.h: loom_cuda_add_rmsnorm without gather whose y is not stored but
 * quantized per token (int8 or e4m3 codes + scales) for a W8A8 / FP8 GEMM. */
extern "C" cudaError_t lc_add_rmsnorm_quant(loom_cuda_dt dt, int fp8, float *x, const void *r,
                                            const float *w, int T, int H, float eps,
                                            const float *smooth, void *xq, float *sx, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    const int threads = lc_norm_threads(H);
    if (!threads || ((uintptr_t)xq & 7)) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, {
        auto *k = fp8 ? lc_add_rmsnorm_kernel<E, LC_NORM_E4M3> : lc_add_rmsnorm_kernel<E, LC_NORM_INT8>;
        e = lc_launch(k, dim3(T), dim3(threads), 0, s, static_cast<E *>(nullptr), x,
                      static_cast<const E *>(r), w, static_cast<const int32_t *>(nullptr), H, eps,
                      smooth, static_cast<uint8_t *>(xq), sx);
    });
    return e;
}

/* ------------------------------------------------- post-norm residual add */

/* One CTA per row t: x[t] += r[t] * rsqrt(mean(r[t]^2) + eps) * w, the
 * arithmetic in float32 on r's dt values (loom_cpu_add_normed's order).
 * x (T, H) f32; r (T, H) dt; w (H) f32. */
template <typename T>
__global__ void __launch_bounds__(1024)
    lc_add_normed_kernel(float *__restrict__ x, const T *__restrict__ r, const float *__restrict__ w, int H,
                         float eps) {
    __shared__ float red[32];
    const int t = blockIdx.x, nc = H / 8;
    float4 w0p, w1p;
    lc_norm_w_first(w, nc, w0p, w1p);
    lc_pdl_trigger();
    lc_pdl_wait();
    float *xr = x + (size_t)t * H;
    const T *rr = r + (size_t)t * H;
    float v[LC_NORM_MAXC][8];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < LC_NORM_MAXC; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            lc_unpack8<T>(lc_ldg16(rr + c * 8), v[k]);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[k][e] * v[k][e];
        }
    }
    ss = lc_block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)H + eps);
#pragma unroll
    for (int k = 0; k < LC_NORM_MAXC; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < nc) {
            float4 *d = reinterpret_cast<float4 *>(xr + c * 8);
            const float4 *w4 = reinterpret_cast<const float4 *>(w + c * 8);
            float4 a = d[0], b = d[1];
            const float4 w0 = k == 0 ? w0p : __ldg(w4), w1 = k == 0 ? w1p : __ldg(w4 + 1);
            a.x += v[k][0] * inv * w0.x, a.y += v[k][1] * inv * w0.y;
            a.z += v[k][2] * inv * w0.z, a.w += v[k][3] * inv * w0.w;
            b.x += v[k][4] * inv * w1.x, b.y += v[k][5] * inv * w1.y;
            b.z += v[k][6] * inv * w1.z, b.w += v[k][7] * inv * w1.w;
            d[0] = a, d[1] = b;
        }
    }
}

extern "C" cudaError_t loom_cuda_add_normed(loom_cuda_dt dt, float *x, const void *r, const float *w, int T,
                                            int H, float eps, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    const int threads = lc_norm_threads(H);
    if (!threads) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_add_normed_kernel<E>, dim3(T), dim3(threads), 0, s, x,
                                            static_cast<const E *>(r), w, H, eps));
    return e;
}

/* ----------------------------------------------------------------- SwiGLU */

/* out (T, I) = act(gu[:, :I]) * gu[:, I:], act silu or (GELU) tanh GELU;
 * grid-stride over 8-element chunks. */
template <typename T, bool GELU = false>
__global__ void lc_swiglu_kernel(T *__restrict__ out, const T *__restrict__ gu, int T_, int I) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int nc = I / 8;
    const size_t total = (size_t)T_ * nc;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / nc;
        const int c = (int)(idx - t * nc);
        const T *g = gu + t * 2 * (size_t)I + c * 8;
        float gf[8], uf[8], o[8];
        lc_unpack8<T>(lc_ldg16(g), gf);
        lc_unpack8<T>(lc_ldg16(g + I), uf);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = GELU ? lc_gelu_tanh_mul(gf[e], uf[e]) : lc_silu_mul(gf[e], uf[e]);
        lc_stg16(out + t * I + c * 8, lc_pack8<T>(o));
    }
}

/* Blocks of a grid-stride launch over T x I / 8 chunks. */
static unsigned lc_glu_blocks(int T, int I) {
    const size_t chunks = (size_t)T * (I / 8);
    size_t blocks = (chunks + 255) / 256;
    if (blocks > 132 * 16) blocks = 132 * 16; /* grid-stride beyond a few waves */
    return (unsigned)blocks;
}

extern "C" cudaError_t loom_cuda_geglu_tanh(loom_cuda_dt dt, void *out, const void *gu, int T, int I,
                                            cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (I % 8) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_swiglu_kernel<E, true>, dim3(lc_glu_blocks(T, I)), dim3(256), 0, s,
                                            static_cast<E *>(out), static_cast<const E *>(gu), T, I));
    return e;
}

extern "C" cudaError_t loom_cuda_swiglu(loom_cuda_dt dt, void *out, const void *gu, int T, int I,
                                        cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (I % 8) return cudaErrorInvalidValue;
    cudaError_t e;
    LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_swiglu_kernel<E>, dim3(lc_glu_blocks(T, I)), dim3(256),
                                            0, s, static_cast<E *>(out),
                                            static_cast<const E *>(gu), T, I));
    return e;
}

/* ------------------------------------------------------------ RoPE table */

/* cs (max_pos, half, 2) = cos/sin(p * inv_freq[i]) in float64. */
__global__ void lc_rope_table_kernel(float *__restrict__ cs, const double *__restrict__ inv_freq,
                                     int max_pos, int half) {
    const size_t total = (size_t)max_pos * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t p = idx / half;
        const int i = (int)(idx - p * half);
        double sn, cn;
        sincos((double)p * inv_freq[i], &sn, &cn);
        cs[2 * idx] = (float)cn;
        cs[2 * idx + 1] = (float)sn;
    }
}

extern "C" cudaError_t loom_cuda_rope_table(float *cs, const double *inv_freq, int max_pos,
                                            int half, cudaStream_t s) {
    if (max_pos <= 0 || half <= 0) return cudaSuccess;
    const size_t total = (size_t)max_pos * half;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    lc_rope_table_kernel<<<(unsigned)blocks, 256, 0, s>>>(cs, inv_freq, max_pos, half);
    return cudaGetLastError();
}

/* ------------------------------------------------------ RoPE + KV write */

/* 8 float32 K/V values -> the cache at element offset `at`: dt (one
 * 16-byte store) or E4M3 codes (one 8-byte store, the cpu's encoder). */
template <typename T, bool F8>
__device__ __forceinline__ void lc_kv_store8(void *cache, size_t at, const float *f) {
    if (F8) *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(cache) + at) = lc_e4m3_pack8(f);
    else *reinterpret_cast<uint4 *>(static_cast<T *>(cache) + at) = lc_pack8<T>(f);
}

/* One CTA per token. Work units: (H + KVH) * D/16 rotations of 8 pairs
 * (q heads, then k heads), then KVH * D/8 copies of 8 V elements.
 * qkv (T, ld) dt; bias (H*D + 2 KVH*D) f32 or NULL; cs (max_pos, D/2, 2);
 * caches dt, or E4M3 codes when F8. */
template <typename T, bool F8>
__global__ void lc_rope_kv_kernel(T *__restrict__ qkv, int ld, const float *__restrict__ bias,
                                  const float *__restrict__ cs, const int32_t *__restrict__ pos,
                                  const int64_t *__restrict__ slot, void *__restrict__ kc,
                                  void *__restrict__ vc, int H, int KVH, int D, int bs) {
    const int t = blockIdx.x;
    const int half = D / 2;
    /* metadata (loom_cuda_rope_kv: no kernel writes pos / slot): read while
     * the kernel before still runs */
    const int p = pos[t];
    const int64_t sl = slot[t];
    lc_pdl_trigger();
    lc_pdl_wait();
    const int64_t blk = sl >= 0 ? sl / bs : 0, off = sl >= 0 ? sl % bs : 0;
    T *row = qkv + (size_t)t * ld;
    const int cph = D / 16; /* rotation units per head */
    const int nrot = (H + KVH) * cph;
    const int nv = KVH * (D / 8);
    for (int u = threadIdx.x; u < nrot + nv; u += blockDim.x) {
        if (u < nrot) {
            const int hh = u / cph, i0 = (u - hh * cph) * 8;
            T *xa = row + hh * D + i0;
            float a[8], b[8];
            lc_unpack8<T>(*reinterpret_cast<const uint4 *>(xa), a);
            lc_unpack8<T>(*reinterpret_cast<const uint4 *>(xa + half), b);
            if (bias) {
                const float *ba = bias + hh * D + i0;
#pragma unroll
                for (int e = 0; e < 8; e++) a[e] += ba[e], b[e] += ba[half + e];
            }
            const float4 *c4 = reinterpret_cast<const float4 *>(cs + ((size_t)p * half + i0) * 2);
            float cn[8], sn[8];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float4 q = __ldg(c4 + e);
                cn[2 * e] = q.x, sn[2 * e] = q.y, cn[2 * e + 1] = q.z, sn[2 * e + 1] = q.w;
            }
            float ra[8], rb[8];
#pragma unroll
            for (int e = 0; e < 8; e++) lc_rope_rot(a[e], b[e], cn[e], sn[e], ra[e], rb[e]);
            if (hh < H) {
                *reinterpret_cast<uint4 *>(xa) = lc_pack8<T>(ra);
                *reinterpret_cast<uint4 *>(xa + half) = lc_pack8<T>(rb);
            } else if (sl >= 0) {
                const size_t at = (((size_t)blk * KVH + (hh - H)) * bs + off) * D + i0;
                lc_kv_store8<T, F8>(kc, at, ra);
                lc_kv_store8<T, F8>(kc, at + half, rb);
            }
        } else if (sl >= 0) {
            const int v = u - nrot;
            const int kh = v / (D / 8), i0 = (v - kh * (D / 8)) * 8;
            const int col = (H + KVH + kh) * D + i0;
            const size_t at = (((size_t)blk * KVH + kh) * bs + off) * D + i0;
            uint4 val = *reinterpret_cast<const uint4 *>(row + col);
            if (bias || F8) {
                float f[8];
                lc_unpack8<T>(val, f);
                if (bias) {
#pragma unroll
                    for (int e = 0; e < 8; e++) f[e] += bias[col + e];
                }
                lc_kv_store8<T, F8>(vc, at, f);
            } else {
                *reinterpret_cast<uint4 *>(static_cast<T *>(vc) + at) = val;
            }
        }
    }
}

extern "C" cudaError_t loom_cuda_rope_kv(loom_cuda_dt dt, loom_cuda_kv kv, void *qkv, int ld,
                                         const float *bias, const float *cs, const int32_t *pos,
                                         const int64_t *slot, void *k_cache, void *v_cache, int T,
                                         int H, int KVH, int D, int block_size, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (D % 16 || ld % 8 || (kv != LOOM_CUDA_KV_DT && kv != LOOM_CUDA_KV_E4M3))
        return cudaErrorInvalidValue;
    cudaError_t e;
    if (kv == LOOM_CUDA_KV_E4M3)
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_rope_kv_kernel<E, true>, dim3(T), dim3(128), 0, s,
                                                static_cast<E *>(qkv), ld, bias, cs, pos, slot,
                                                k_cache, v_cache, H, KVH, D, block_size));
    else
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_rope_kv_kernel<E, false>, dim3(T), dim3(128), 0, s,
                                                static_cast<E *>(qkv), ld, bias, cs, pos, slot,
                                                k_cache, v_cache, H, KVH, D, block_size));
    return e;
}

/* ------------------------------------------- QK-norm + RoPE + KV write */

/* Most RoPE pairs a lane of lc_rope_kv_norm_kernel holds: head_dim <= 256. */
#define LC_QKN_MAXP 4

/* loom_cuda_rope_kv_norm: CTAs (token, group of 8 heads), one warp per head
 * — query heads, then K heads, then V heads: a batch-1 step has one token,
 * and one CTA walking all its heads (40 on Qwen3-30B-A3B) is as long as
 * the layer's attention. A q or k head's lane holds the
 * pairs (j, j + D/2), j = lane + 32 i, in float32: bias added, the head's
 * RMSNorm (sum of squares over the warp) times its weight, the rotation,
 * then one rounding to dt (q in place) or to the cache's type (k). V heads
 * (+ bias) go to the cache. qkv (T, ld) dt; caches (blocks, KVH, bs, D). */
template <typename T, bool F8>
__global__ void lc_rope_kv_norm_kernel(T *__restrict__ qkv, int ld, const float *__restrict__ bias,
                                       const float *__restrict__ qw, const float *__restrict__ kw, float eps,
                                       const float *__restrict__ cs, const int32_t *__restrict__ pos,
                                       const int64_t *__restrict__ slot, void *__restrict__ kc,
                                       void *__restrict__ vc, int H, int KVH, int D, int bs) {
    const int t = blockIdx.x, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    /* Before the wait, what no kernel writes (loom_cuda_rope_kv_norm): the
     * position and slot, and the cos / sin and norm weights of this lane's
     * pairs, the same for every head. */
    const int half = D / 2, p = pos[t];
    const int64_t sl = slot[t];
    float2 rot[LC_QKN_MAXP];
    float wq[LC_QKN_MAXP][2], wk[LC_QKN_MAXP][2];
#pragma unroll
    for (int i = 0; i < LC_QKN_MAXP; i++) {
        const int j = lane + 32 * i;
        rot[i] = make_float2(1.0f, 0.0f);
        wq[i][0] = wq[i][1] = wk[i][0] = wk[i][1] = 1.0f;
        if (j >= half) continue;
        rot[i] = *reinterpret_cast<const float2 *>(cs + ((size_t)p * half + j) * 2);
        if (qw) wq[i][0] = qw[j], wq[i][1] = qw[j + half];
        if (kw) wk[i][0] = kw[j], wk[i][1] = kw[j + half];
    }
    lc_pdl_trigger();
    lc_pdl_wait();
    const int64_t blk = sl >= 0 ? sl / bs : 0, off = sl >= 0 ? sl % bs : 0;
    T *row = qkv + (size_t)t * ld;
    for (int hh = blockIdx.y * nw + (threadIdx.x >> 5); hh < H + 2 * KVH; hh += nw * gridDim.y) {
        const bool is_q = hh < H, is_v = hh >= H + KVH;
        if (!is_q && sl < 0) continue; /* no cache write for this token */
        const int kh = is_v ? hh - H - KVH : hh - H;
        const size_t at = (((size_t)blk * KVH + kh) * bs + off) * D;
        const T *x = row + (size_t)hh * D;
        const float *bb = bias ? bias + (size_t)hh * D : nullptr;
        if (is_v) {
            for (int i = lane; i < D; i += 32) {
                const float f = lc_to_f(x[i]) + (bb ? bb[i] : 0.0f);
                if (F8) static_cast<uint8_t *>(vc)[at + i] = (uint8_t)lc_e4m3_encode(__float_as_uint(f));
                else static_cast<T *>(vc)[at + i] = lc_from_f<T>(f);
            }
            continue;
        }
        float a[LC_QKN_MAXP], b[LC_QKN_MAXP], ss = 0.0f;
#pragma unroll
        for (int i = 0; i < LC_QKN_MAXP; i++) {
            const int j = lane + 32 * i;
            a[i] = b[i] = 0.0f;
            if (j < half) {
                a[i] = lc_to_f(x[j]) + (bb ? bb[j] : 0.0f);
                b[i] = lc_to_f(x[j + half]) + (bb ? bb[j + half] : 0.0f);
                ss += a[i] * a[i] + b[i] * b[i];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float *w = is_q ? qw : kw;
        const float inv = w ? rsqrtf(ss / (float)D + eps) : 1.0f;
#pragma unroll
        for (int i = 0; i < LC_QKN_MAXP; i++) {
            const int j = lane + 32 * i;
            if (j >= half) continue;
            if (w) { /* values, not a pointer into the arrays: they stay in registers */
                const float wa = is_q ? wq[i][0] : wk[i][0], wb = is_q ? wq[i][1] : wk[i][1];
                a[i] = a[i] * inv * wa, b[i] = b[i] * inv * wb;
            }
            float ra, rb;
            lc_rope_rot(a[i], b[i], rot[i].x, rot[i].y, ra, rb);
            if (is_q) {
                row[(size_t)hh * D + j] = lc_from_f<T>(ra);
                row[(size_t)hh * D + j + half] = lc_from_f<T>(rb);
            } else if (F8) {
                static_cast<uint8_t *>(kc)[at + j] = (uint8_t)lc_e4m3_encode(__float_as_uint(ra));
                static_cast<uint8_t *>(kc)[at + j + half] = (uint8_t)lc_e4m3_encode(__float_as_uint(rb));
            } else {
                static_cast<T *>(kc)[at + j] = lc_from_f<T>(ra);
                static_cast<T *>(kc)[at + j + half] = lc_from_f<T>(rb);
            }
        }
    }
}

extern "C" cudaError_t loom_cuda_rope_kv_norm(loom_cuda_dt dt, loom_cuda_kv kv, void *qkv, int ld, const float *bias,
                                              const float *q_norm, const float *k_norm, float eps, const float *cs,
                                              const int32_t *pos, const int64_t *slot, void *k_cache, void *v_cache,
                                              int T, int H, int KVH, int D, int block_size, cudaStream_t s) {
    if (T <= 0) return cudaSuccess;
    if (D % 2 || D > 64 * LC_QKN_MAXP || (kv != LOOM_CUDA_KV_DT && kv != LOOM_CUDA_KV_E4M3))
        return cudaErrorInvalidValue;
    cudaError_t e;
    const dim3 grid((unsigned)T, (unsigned)lc_ceil_div(H + 2 * KVH, 8));
    if (kv == LOOM_CUDA_KV_E4M3)
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_rope_kv_norm_kernel<E, true>, grid, dim3(256), 0, s,
                                                static_cast<E *>(qkv), ld, bias, q_norm, k_norm, eps, cs, pos, slot,
                                                k_cache, v_cache, H, KVH, D, block_size));
    else
        LOOM_CUDA_DISPATCH_DT(dt, e = lc_launch(lc_rope_kv_norm_kernel<E, false>, grid, dim3(256), 0, s,
                                                static_cast<E *>(qkv), ld, bias, q_norm, k_norm, eps, cs, pos, slot,
                                                k_cache, v_cache, H, KVH, D, block_size));
    return e;
}

/* ------------------------------------------------------------- KV blocks */

/* grid (npairs, npools): CTA copies one block of one pool in 16-B words. */
__global__ void lc_copy_blocks_kernel(void *const *__restrict__ src_pools,
                                      void *const *__restrict__ dst_pools,
                                      const int32_t *__restrict__ pairs, size_t block_bytes) {
    lc_pdl_trigger();
    lc_pdl_wait();
    const int i = blockIdx.x, p = blockIdx.y;
    const size_t n16 = block_bytes / 16;
    const uint4 *src = reinterpret_cast<const uint4 *>(
        static_cast<const char *>(src_pools[p]) + (size_t)pairs[2 * i] * block_bytes);
    uint4 *dst = reinterpret_cast<uint4 *>(static_cast<char *>(dst_pools[p]) +
                                           (size_t)pairs[2 * i + 1] * block_bytes);
    for (size_t k = threadIdx.x; k < n16; k += blockDim.x) dst[k] = src[k];
}

extern "C" cudaError_t loom_cuda_copy_blocks(void *const *src_pools, void *const *dst_pools,
                                             int npools, const int32_t *pairs, int npairs,
                                             size_t block_bytes, cudaStream_t s) {
    if (npairs <= 0 || npools <= 0) return cudaSuccess;
    if (block_bytes % 16 || npools > 65535) return cudaErrorInvalidValue;
    return lc_launch(lc_copy_blocks_kernel, dim3((unsigned)npairs, (unsigned)npools), dim3(256), 0,
                     s, src_pools, dst_pools, pairs, block_bytes);
}
