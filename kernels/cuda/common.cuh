/*
 * kernels/cuda/common.cuh — device helpers shared by the kernel files:
 * 16-byte vectors of 8 bf16/f16 and their float conversions, the
 * dispatch from loom_cuda_dt to a C++ element type, and block reductions.
 * Internal to kernels/cuda; not part of the C API.
 */
#ifndef LOOM_CUDA_COMMON_CUH
#define LOOM_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "formats/e4m3.h"

/* Run the statements with `E` bound to the element type of `dt`. */
#define LOOM_CUDA_DISPATCH_DT(dt, ...)                                                             \
    do {                                                                                           \
        if ((dt) == LOOM_CUDA_F16) {                                                               \
            typedef __half E;                                                                      \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            typedef __nv_bfloat16 E;                                                               \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)

template <typename T> struct lc_vec2;
template <> struct lc_vec2<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct lc_vec2<__half> { typedef __half2 type; };

__device__ __forceinline__ float lc_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float lc_to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T lc_from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 lc_from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half lc_from_f<__half>(float x) {
    return __float2half_rn(x);
}

/* The two element-wise maps a step fuses into several kernels, each in one
 * place so every kernel that applies one gets the same bits (explicit
 * roundings: no contraction into an FMA here and not there):
 *   SwiGLU's silu(g) * u = g / (1 + e^-g) * u (loom_cuda_swiglu, the
 *   W8A8 / FP8 activation quantizer, the GEMVs' SwiGLU loads and pair
 *   epilogue); NeoX RoPE's rotation of the pair (a, b) by (cos, sin)
 *   (loom_cuda_rope_kv and the QKV GEMV's pair epilogue). */
__device__ __forceinline__ float lc_silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, __expf(-g))), u);
}
/* GeGLU's gelu(g) * u with PyTorch's approximate="tanh" GELU, the cpu
 * backend's formula (loom_cpu_geglu_tanh): g/2 (1 + tanh(sqrt(2/pi)
 * (g + 0.044715 g^3))) u, tanhf the accurate one. */
__device__ __forceinline__ float lc_gelu_tanh_mul(float g, float u) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
}
__device__ __forceinline__ void lc_rope_rot(float a, float b, float c, float s, float &ra, float &rb) {
    ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

/* Two floats -> one 32-bit register of two dt (low half = a). */
template <typename T> __device__ __forceinline__ uint32_t lc_pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t lc_pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t lc_pack2<__half>(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 8 dt in a 16-byte vector <-> 8 floats. */
template <typename T> __device__ __forceinline__ void lc_unpack8(const uint4 &v, float *f) {
    const T *e = reinterpret_cast<const T *>(&v);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = lc_to_f(e[i]);
}

template <typename T> __device__ __forceinline__ uint4 lc_pack8(const float *f) {
    uint4 v;
    v.x = lc_pack2<T>(f[0], f[1]);
    v.y = lc_pack2<T>(f[2], f[3]);
    v.z = lc_pack2<T>(f[4], f[5]);
    v.w = lc_pack2<T>(f[6], f[7]);
    return v;
}

/* 16-byte global loads: read-only path for data that is not written by
 * the same kernel. */
__device__ __forceinline__ uint4 lc_ldg16(const void *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ void lc_stg16(void *p, uint4 v) { *reinterpret_cast<uint4 *>(p) = v; }

/* Sum over the block (blockDim.x a multiple of 32, <= 1024). Every thread
 * gets the result. `red` is __shared__ float[32]. */
__device__ __forceinline__ float lc_block_sum(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < nwarps ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Max over the block, as lc_block_sum (the per-token amax of the
 * activation quantizers: exact, so no order can change it). */
__device__ __forceinline__ float lc_block_max(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = lane < nwarps ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

static inline int lc_ceil_div(int a, int b) { return (a + b - 1) / b; }

/* ----------------------------------------------- integer codes to float
 * Shared by the quantized GEMVs (qgemm.cu, qgguf.cu). */

/* Byte I of u as a float, minus OFF: 2^23 + byte built by one PRMT, exact. */
template <int I, int OFF> __device__ __forceinline__ float lc_byte_f(uint32_t u) {
    return __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7440u | I)) -
           (8388608.0f + (float)OFF);
}

/* Four int8 weights of word w (byte 0 first) as floats. */
__device__ __forceinline__ void lc_i8x4(uint32_t w, float *f) {
    const uint32_t u = w ^ 0x80808080u; /* q + 128 as unsigned bytes */
    f[0] = lc_byte_f<0, 128>(u);
    f[1] = lc_byte_f<1, 128>(u);
    f[2] = lc_byte_f<2, 128>(u);
    f[3] = lc_byte_f<3, 128>(u);
}


/* ------------------------------------------ programmatic dependent launch
 * Every kernel here is launched with programmatic stream serialisation
 * (lc_launch), so its launch and CTA rasterisation overlap the tail of the
 * kernel before it — in a decode step of ~320 small kernels that is most of
 * the gap between them. Every kernel calls lc_pdl_trigger() and
 * lc_pdl_wait(), the wait before the first global
 * memory access that another kernel of the step may have written (it
 * returns once the previous grid has completed and its writes are visible;
 * a no-op when launched without the attribute); by default the wait then
 * lets the next kernel start launching, so at most one grid launches
 * ahead. Triggering first (the trigger_first setting) lets a chain of grids
 * launch ahead, which is safe too:
 * the next kernel still waits for this one's completion itself, and the
 * next grid launches only once every CTA of this one has started, so
 * nothing waits for a CTA that cannot be scheduled; the next kernel's
 * prologue (its early weights, its metadata) then overlaps this kernel's
 * wait as well as its work. What may come before the wait: weights (no
 * kernel writes them: GEMVs prefetch or load them there,
 * loom_cuda_qweight's contract), norm weights and the RoPE table, and the
 * step's metadata (positions, slots, block tables, attention tiles), which
 * only host copies ordered before the step's first kernel write. Every
 * grid has a CTA that waits before it exits, so no grid completes before
 * the one it follows (the next kernel's wait relies on that). Captured into
 * CUDA graphs as programmatic edges.
 * The order is a setting (loom_cuda_set_trigger_first; the cuda backend's
 * trigger_first): where it is on, lc_pdl_trigger() lets the next launch
 * and lc_pdl_wait() does not. Off is the default: grids launched early
 * hold SM slots while they wait, which made the tiled INT4 batch-1 path
 * take 26% more time (docs/performance.md, "Choices decided by a
 * measurement"). Either order is correct, so a setting changed mid-step
 * only mixes them. Its value lives in each translation unit's lc_pdl_first
 * (this header's static __constant__), which loom_cuda_set_trigger_first
 * writes through the setter every unit registers at load. */
static __constant__ int lc_pdl_first = 0;
__device__ __forceinline__ void lc_pdl_wait() {
    const int first = lc_pdl_first; /* no kernel writes it: read before the wait */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (!first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void lc_pdl_trigger() {
    if (lc_pdl_first) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
static cudaError_t lc_pdl_set_unit(int first) { return cudaMemcpyToSymbol(lc_pdl_first, &first, sizeof first); }
static cudaError_t lc_pdl_get_unit(int *first) { return cudaMemcpyFromSymbol(first, lc_pdl_first, sizeof *first); }
[[maybe_unused]] static const int lc_pdl_registered = (lc_pdl_register(lc_pdl_set_unit, lc_pdl_get_unit), 0);

/* Weight prefetch under PDL: a kernel's weights do not depend on the kernel
 * before it, so a GEMV asks L2 for its rows before lc_pdl_wait() — while the
 * previous kernel still runs — and after the wait reads them from L2 instead
 * of paying a DRAM round trip per launch. At batch 1 a small model's step is
 * a chain of ~300 such latency-bound launches. Only a hint: L2 is the point of
 * coherence, so a prefetch can never make a later load see stale data.
 * Bounded to each row's first LC_PREFETCH_ROW_BYTES (what a warp's first
 * loads cover): prefetching whole rows of every resident CTA (~1500 CTAs of
 * 4 rows x 8 KB on Llama-3-8B's layers, more than L2 holds) evicted them
 * before use and made its batch-1 decode 20% slower on the H200, while
 * SmolLM2's 1 KB rows gained 7% (docs/performance.md, "Tried and rejected").
 * Bounded to 2 KB a row, Llama-3-8B was still 3% slower (4.45 vs 4.32 ms a
 * token): its matrices (32 MiB and up) stream at full bandwidth anyway and
 * the prefetches only compete; so only matrices of at most
 * LC_PREFETCH_MAX_BYTES take it (SmolLM2's layers: 0.68 vs 0.73 ms).
 * lc_weight_prefetch(bytes) is the launchers' switch for a matrix of that
 * size: off above the bound. A kernel with the early register loads below
 * skips it (they take the same first bytes of every row). */
#define LC_PREFETCH_ROW_BYTES 2048
#define LC_PREFETCH_MAX_BYTES ((size_t)16 << 20)
extern "C" int lc_weight_prefetch(size_t matrix_bytes);

/* Early weights: a GEMV loads the first U chunks of each of its rows into
 * the registers its loop starts on before lc_pdl_wait() — so the first
 * wave of CTAs has its weights in flight while the kernel before (an
 * RMSNorm, the attention, SwiGLU) still runs, instead of starting a DRAM
 * round trip when it ends. Registers, not L2: nothing is loaded twice or
 * evicted before use (the prefetch above's failure on big matrices). Which
 * kernels do it was measured per kernel: the one-row bf16 / f16 GEMV
 * (gemv.cu) and, of the quantized ones, qgemm.cu's LC_QGEMV_EARLY (the
 * one-row FP8 GEMV: batch-1 decode 3.105 -> 3.004 ms a token on the H200);
 * the results are bit for bit the same. */
/* The first min(row_bytes, LC_PREFETCH_ROW_BYTES) of each of `rows` rows
 * that start at p, one 128-byte line per lane. */
__device__ __forceinline__ void lc_prefetch_rows(const void *p, int rows, size_t row_bytes, int lane) {
    const size_t n = row_bytes < LC_PREFETCH_ROW_BYTES ? row_bytes : LC_PREFETCH_ROW_BYTES;
    for (int r = 0; r < rows; r++) {
        const char *c = static_cast<const char *>(p) + (size_t)r * row_bytes;
        for (size_t o = (size_t)lane * 128; o < n; o += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
    }
}

/* Raise kern's dynamic shared-memory limit to smem (the default allows 48
 * KB of static + dynamic shared memory a block), once per device: bit d of
 * *done, one word per kernel instantiation. The attribute is per device
 * (tensor-parallel ranks are threads of one process on different GPUs), and
 * doing it once keeps a launch being captured into a graph free of
 * attribute calls. */
static inline cudaError_t lc_smem_limit(unsigned long long *done, const void *kern, size_t smem) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = 1ull << (dev & 63);
    if (!(__atomic_load_n(done, __ATOMIC_ACQUIRE) & bit)) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        __atomic_fetch_or(done, bit, __ATOMIC_RELEASE);
    }
    return cudaSuccess;
}

/* kern<<<grid, block, smem, s>>>(args...) with programmatic stream
 * serialisation; returns the launch status. */
template <typename... KArgs, typename... Args>
static cudaError_t lc_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t s, Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
}

/* --------------------------------------------------- FP8 E4M3 KV cache
 * The codec of e4m3.h (the cpu backend's bits) on 8 elements at a time:
 * the RoPE + KV-write kernel encodes, the attention kernels decode. */

/* 8 floats -> 8 E4M3 codes (element 0 in the low byte of .x). */
__device__ __forceinline__ uint2 lc_e4m3_pack8(const float *f) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        w[h] = lc_e4m3_encode(__float_as_uint(f[4 * h])) |
               lc_e4m3_encode(__float_as_uint(f[4 * h + 1])) << 8 |
               lc_e4m3_encode(__float_as_uint(f[4 * h + 2])) << 16 |
               lc_e4m3_encode(__float_as_uint(f[4 * h + 3])) << 24;
    return make_uint2(w[0], w[1]);
}

/* Four codes (code 0 in the low byte) -> two registers of two dt each,
 * exact for every finite code: one PRMT puts each code at the top of a
 * 16-bit lane, two logic ops and a shift move its bits into dt's fields
 * (value * 2^-120 for bf16, * 2^-8 for f16, subnormal codes on dt
 * subnormals), one packed multiply without flush-to-zero scales it back.
 * No conversion-unit instruction: the prefill-shape attention decodes its
 * code stages into dt tiles with it. The decode shape converts in registers
 * with lc_e4m3x4_cvt below (fewer instructions; f16 products). */
template <typename T> __device__ __forceinline__ void lc_e4m3x4(uint32_t c, uint32_t *lo, uint32_t *hi);
template <>
__device__ __forceinline__ void lc_e4m3x4<__nv_bfloat16>(uint32_t c, uint32_t *lo, uint32_t *hi) {
    const uint32_t s = 0x7b807b80u; /* bf16x2 (2^120, 2^120) */
    const uint32_t a = lc_e4m3_bf16_bits(__byte_perm(c, 0, 0x1404));
    const uint32_t b = lc_e4m3_bf16_bits(__byte_perm(c, 0, 0x3424));
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(*lo) : "r"(a), "r"(s));
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(*hi) : "r"(b), "r"(s));
}
template <>
__device__ __forceinline__ void lc_e4m3x4<__half>(uint32_t c, uint32_t *lo, uint32_t *hi) {
    const uint32_t s = 0x5c005c00u; /* f16x2 (256, 256) */
    const uint32_t a = lc_e4m3_f16_bits(__byte_perm(c, 0, 0x1404));
    const uint32_t b = lc_e4m3_f16_bits(__byte_perm(c, 0, 0x3424));
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(*lo) : "r"(a), "r"(s));
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(*hi) : "r"(b), "r"(s));
}

/* Four codes (code 0 in the low byte) -> two f16x2 registers (lo = codes 0,
 * 1; hi = codes 2, 3; the lower code in the lower half) by the conversion
 * unit: cvt.rn.f16x2.e4m3x2 (sm_89 and later), one instruction per two
 * codes, exact for every finite code (E4M3's 448 and its 2^-9 subnormals
 * are f16 values); the NaN codes give f16 NaN, as the cpu decoder gives
 * float NaN (lc_e4m3x4 reads them as +-480). The decode-shape attention
 * over an E4M3 cache takes this path with f16 products (attention.cu). */
__device__ __forceinline__ void lc_e4m3x4_cvt(uint32_t c, uint32_t *lo, uint32_t *hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(*lo), "=r"(*hi)
        : "r"(c));
}

/* 8 codes -> 8 dt in a 16-byte vector. */
template <typename T> __device__ __forceinline__ uint4 lc_e4m3x8(uint2 c) {
    uint4 v;
    lc_e4m3x4<T>(c.x, &v.x, &v.y);
    lc_e4m3x4<T>(c.y, &v.z, &v.w);
    return v;
}

/* ------------------------------------------- per-token activation codes
 * (qgemm.h: lc_quant_act; elementwise.cu: lc_add_rmsnorm_quant) */
/* Eight codes of v: e4m3 of v / sc (0 for an all-zero row), or int8
 * clamp(rint(v * inv), +-127); stored as 8 bytes. */
template <bool FP8>
__device__ __forceinline__ void lc_qact_store8(const float *v, float sc, float inv, uint8_t *dst) {
    uint32_t q[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; e++) {
        uint32_t b;
        if (FP8) {
            b = sc > 0.0f ? (uint32_t)__nv_cvt_float_to_fp8(v[e] / sc, __NV_SATFINITE, __NV_E4M3) : 0u;
        } else {
            float r = rintf(__fmul_rn(v[e], inv));
            r = fminf(fmaxf(r, -127.0f), 127.0f);
            b = (uint32_t)(uint8_t)(int8_t)(int)r;
        }
        q[e / 4] |= (b & 0xFFu) << (8 * (e % 4));
    }
    *reinterpret_cast<uint2 *>(dst) = make_uint2(q[0], q[1]);
}

#endif
