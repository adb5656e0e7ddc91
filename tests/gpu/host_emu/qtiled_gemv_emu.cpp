// tests/gpu/host_emu/qtiled_gemv_emu.cpp — kernels/cuda/qtiled.cu's stream
// kernel (lc_qtiled_gemv_kernel) on the CPU (built and run by
// qtiled_gemv_emu.sh, which cuts the device code out of the .cu file into
// qtiled_part.inc). Random W8A16 / INT4 codes and scales are repacked by
// the file's own lc_qtiled_pack_kernel / lc_qtiled_scales_kernel, the
// kernel runs CTA by CTA with 256 threads (a warp's mma.sync m16n8k16 is
// its 32 threads meeting at a barrier and each computing its C fragment
// from all of their A / B fragments), and each output is held against the
// float64 sum over the untiled weights (int8: q s; INT4: (q - 8) s + b'
// with s, b' rounded to dt, as the layout stores them): error / sum |x w|
// below 2e-3 (the decoded INT4 weight is rounded to dt, as on the GPU; an
// index error is O(1)). Then the pair form (SwiGLU's pairs, P = N / 2, and
// RoPE's, P = head_dim / 2): the stand-in epilogue records each pair's two
// sums, which must be rows q's and q + P's of the plain kernel, bit for bit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <type_traits>
#include <vector>

#include "formats/half.h"
#include "tests/gpu/host_emu/host_cuda.h"

// ------------------------------------------------ CUDA, as the host sees it
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static /* one CTA runs at a time */
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <typename V> static inline V __ldg(const V *p) { return *p; }
static inline float __uint_as_float(uint32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t i; memcpy(&i, &f, 4); return i; }
struct __half { uint16_t v; };
struct __nv_bfloat16 { uint16_t v; };
template <typename T> static inline float lc_h2f(uint16_t h) {
    return std::is_same<T, __half>::value ? loom_fp16_to_fp32(h) : loom_bf16_to_fp32(h);
}
template <typename T> static inline uint16_t lc_f2h(float f) {
    return std::is_same<T, __half>::value ? loom_fp32_to_fp16(f) : loom_fp32_to_bf16(f);
}
template <typename T> static inline T lc_from_f(float f) { return T{lc_f2h<T>(f)}; }
template <typename T> static inline uint32_t lc_pack2(float a, float b) {
    return (uint32_t)lc_f2h<T>(a) | (uint32_t)lc_f2h<T>(b) << 16;
}
/* packed dt x2 arithmetic, each half rounded once from float (the decode's
 * subtractions are exact; its fma's double rounding is below the check) */
template <typename T> static inline uint32_t lc_qt_sub2(uint32_t a, uint32_t b) {
    return lc_pack2<T>(lc_h2f<T>(a & 0xFFFF) - lc_h2f<T>(b & 0xFFFF), lc_h2f<T>(a >> 16) - lc_h2f<T>(b >> 16));
}
template <typename T> static inline uint32_t lc_qt_fma2(uint32_t a, uint32_t b, uint32_t c) {
    return lc_pack2<T>(fmaf(lc_h2f<T>(a & 0xFFFF), lc_h2f<T>(b & 0xFFFF), lc_h2f<T>(c & 0xFFFF)),
                       fmaf(lc_h2f<T>(a >> 16), lc_h2f<T>(b >> 16), lc_h2f<T>(c >> 16)));
}
static inline uint32_t lc_qt_lop3_or_and(uint32_t a, uint32_t mask, uint32_t magic) { return (a & mask) | magic; }
static inline void lc_i8x4_h2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const auto q = [&](int i) { return (float)(int8_t)(w >> (8 * i)); };
    lo = lc_pack2<__half>(q(0), q(1)), hi = lc_pack2<__half>(q(2), q(3));
}

struct dim3h { int x, y, z; };
static thread_local dim3h threadIdx;
static dim3h blockIdx, blockDim, gridDim;
static pthread_barrier_t g_cta, g_warp[8];
static void __syncthreads() { pthread_barrier_wait(&g_cta); }
static void __syncwarp() { pthread_barrier_wait(&g_warp[threadIdx.x >> 5]); }
static void lc_pdl_wait() {}
static void lc_pdl_trigger() {}

/* mma.sync m16n8k16, f32 += dt x dt: fragments of the warp's 32 lanes */
static uint32_t g_fa[8][32][4], g_fb[8][32][2];
template <typename T> static void lc_mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    memcpy(g_fa[w][lane], a, 16), g_fb[w][lane][0] = b0, g_fb[w][lane][1] = b1;
    __syncwarp();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        for (int h = 0; h < 2; h++) {
            const int k = 2 * t + h;
            A[g][k] = lc_h2f<T>(g_fa[w][l][0] >> (16 * h));
            A[g + 8][k] = lc_h2f<T>(g_fa[w][l][1] >> (16 * h));
            A[g][k + 8] = lc_h2f<T>(g_fa[w][l][2] >> (16 * h));
            A[g + 8][k + 8] = lc_h2f<T>(g_fa[w][l][3] >> (16 * h));
            B[k][g] = lc_h2f<T>(g_fb[w][l][0] >> (16 * h));
            B[k + 8][g] = lc_h2f<T>(g_fb[w][l][1] >> (16 * h));
        }
    }
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >= 2 ? 8 : 0), n = 2 * t + (i & 1);
        double s = 0;
        for (int k = 0; k < 16; k++) s += (double)A[r][k] * B[k][n];
        c[i] += (float)s;
    }
    __syncwarp();
}

/* the pair epilogue's stand-in: what the kernel hands it */
struct loom_cuda_epi { int kind; };
static std::vector<float> g_pair_a, g_pair_b;
template <typename T> static void lc_epi_pair(const loom_cuda_epi &, T *, int q, int, float a, float b) {
    g_pair_a[q] = a, g_pair_b[q] = b;
}

enum { LOOM_CUDA_Q_INT8_W8A16 = 1, LOOM_CUDA_Q_INT4 = 4 };

#include "qtiled_part.inc"

// ------------------------------------------------------------- helpers
static uint64_t g_rs = 0x7113d;
static uint32_t rnd() {
    g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rs >> 33);
}
static float unif(float a, float b) { return a + (b - a) * (float)(rnd() & 0xFFFFFF) / 16777216.0f; }

/* run fn(thread) for every thread of a grid of `ctas` CTAs of 256, one CTA at a time */
template <typename Fn> struct cta_job { Fn *fn; int tid; };
template <typename Fn> static void *cta_thread(void *p) {
    auto *j = (cta_job<Fn> *)p;
    threadIdx = {j->tid, 0, 0};
    (*j->fn)();
    return nullptr;
}
template <typename Fn> static void launch(int ctas, Fn fn) {
    gridDim = {ctas, 1, 1}, blockDim = {256, 1, 1};
    for (int b = 0; b < ctas; b++) {
        blockIdx = {b, 0, 0};
        pthread_barrier_init(&g_cta, nullptr, 256);
        for (int w = 0; w < 8; w++) pthread_barrier_init(&g_warp[w], nullptr, 32);
        pthread_t th[256];
        cta_job<Fn> jb[256];
        for (int t = 0; t < 256; t++) {
            jb[t] = {&fn, t};
            pthread_create(&th[t], nullptr, cta_thread<Fn>, &jb[t]);
        }
        for (int t = 0; t < 256; t++) pthread_join(th[t], nullptr);
        pthread_barrier_destroy(&g_cta);
        for (int w = 0; w < 8; w++) pthread_barrier_destroy(&g_warp[w]);
    }
}

/* One weight (N, K) of FMT tiled for dt T, M tokens: plain kernel vs float64
 * (worst error / sum |x w|), then the pair kernel for pairs of P rows (P
 * > 0): its sums vs the plain kernel's, counted where they differ. */
template <typename T, int FMT> static double check(int N, int K, int M, int group, int U, int P, long *pair_bad) {
    const bool i4 = FMT == LOOM_CUDA_Q_INT4;
    const size_t rb = i4 ? (size_t)K / 2 : (size_t)K;
    const int groups = i4 ? K / group : 1;
    std::vector<uint8_t> codes((size_t)N * rb), tiled((size_t)N * rb);
    for (auto &b : codes) b = (uint8_t)rnd();
    std::vector<float> sc(i4 ? (size_t)N * groups * 2 : (size_t)N);
    for (auto &v : sc) v = unif(-0.02f, 0.02f);
    std::vector<uint32_t> pairs(i4 ? (size_t)N * groups : 0);
    launch(1, [&] { lc_qtiled_pack_kernel(codes.data(), tiled.data(), N, K, i4); });
    if (i4) launch(1, [&] { lc_qtiled_scales_kernel<T>(sc.data(), pairs.data(), N, groups); });
    const float *ksc = i4 ? reinterpret_cast<const float *>(pairs.data()) : sc.data();
    std::vector<uint16_t> x((size_t)M * K);
    for (auto &v : x) v = lc_f2h<T>(unif(-2.0f, 2.0f));
    std::vector<float> y((size_t)M * N, NAN);
    launch(N / 16, [&] {
        (U == 8 ? lc_qtiled_gemv_kernel<T, FMT, true, 8> : lc_qtiled_gemv_kernel<T, FMT, true, 4>)(
            x.data(), tiled.data(), ksc, y.data(), M, N, K, group, 0, loom_cuda_epi{});
    });
    double worst = 0;
    for (int n = 0; n < N; n++) {
        for (int m = 0; m < M; m++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double w;
                if (i4) {
                    const int q = (codes[(size_t)n * rb + k / 2] >> (4 * (k & 1))) & 15;
                    const uint32_t p = pairs[((size_t)(n / 16) * groups + k / group) * 16 + n % 16];
                    w = (q - 8) * (double)lc_h2f<T>(p & 0xFFFF) + lc_h2f<T>(p >> 16);
                } else {
                    w = (double)(int8_t)codes[(size_t)n * rb + k] * sc[n];
                }
                const double xv = lc_h2f<T>(x[(size_t)m * K + k]);
                ref += xv * w, mag += fabs(xv * w);
            }
            const double e = fabs(y[(size_t)m * N + n] - ref) / (mag > 1e-30 ? mag : 1e-30);
            if (!(e <= worst)) worst = e;
        }
    }
    if (P > 0 && M == 1) { /* the pair form: rows q and q + P of each pair, as the plain kernel summed them */
        std::vector<uint16_t> yd((size_t)N);
        g_pair_a.assign(N / 2, NAN), g_pair_b.assign(N / 2, NAN);
        launch(N / 32, [&] {
            lc_qtiled_gemv_kernel<T, FMT, false, 4, true>(x.data(), tiled.data(), ksc, yd.data(), 1, N, K, group, P,
                                                           loom_cuda_epi{});
        });
        std::vector<float> y4((size_t)N, NAN);
        launch(N / 16, [&] {
            lc_qtiled_gemv_kernel<T, FMT, true, 4>(x.data(), tiled.data(), ksc, y4.data(), 1, N, K, group, 0,
                                                    loom_cuda_epi{});
        });
        for (int q = 0; q < N / 2; q++) {
            const int na = (q / P) * 2 * P + q % P;
            if (memcmp(&g_pair_a[q], &y4[na], 4) || memcmp(&g_pair_b[q], &y4[na + P], 4)) ++*pair_bad;
        }
    }
    return worst;
}

int main() {
    double worst = 0;
    long pair_bad = 0;
    auto keep = [&](double e) { if (!(e <= worst)) worst = e; };
    for (int M : {1, 3, 8}) {
        keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT4>(64, 512, M, 128, 4, 0, &pair_bad));
        keep(check<__half, LOOM_CUDA_Q_INT4>(48, 1536, M, 192, 8, 0, &pair_bad));
        keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT8_W8A16>(48, 1024, M, 0, 4, 0, &pair_bad));
        keep(check<__half, LOOM_CUDA_Q_INT8_W8A16>(32, 384, M, 0, 8, 0, &pair_bad));
    }
    /* K over the warps unevenly, groups across warp boundaries */
    keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT4>(32, 1152, 2, 192, 4, 0, &pair_bad));
    keep(check<__half, LOOM_CUDA_Q_INT8_W8A16>(32, 1408, 1, 0, 8, 0, &pair_bad));
    /* K shorter than 8 warps' tiles (some warps sum nothing) */
    keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT4>(32, 256, 2, 64, 4, 0, &pair_bad));
    /* pairs: SwiGLU's (P = N / 2) and RoPE's (P = 32: head_dim 64) */
    keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT4>(128, 512, 1, 128, 4, 64, &pair_bad));
    keep(check<__half, LOOM_CUDA_Q_INT8_W8A16>(192, 256, 1, 0, 4, 32, &pair_bad));
    keep(check<__nv_bfloat16, LOOM_CUDA_Q_INT8_W8A16>(64, 640, 1, 0, 4, 32, &pair_bad));
    const bool ok = worst < 2e-3;
    printf("%s stream kernel: worst |y - ref| / sum |x w| %.3e\n", ok ? "PASS" : "FAIL", worst);
    printf("%s pair kernel: %ld pair sums differ from the plain kernel's rows\n", pair_bad ? "FAIL" : "PASS",
           pair_bad);
    return !ok || pair_bad;
}
